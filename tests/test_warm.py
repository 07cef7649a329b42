"""pipecore.warm: compiling the kernels ahead of use."""

import io

import pytest

import pipecore.warm as warm_mod
from pipecore.cli import main
from pipecore.core import rules
from pipecore.schedules import generate, registry


def test_every_step_is_listed_once():
    assert sorted(warm_mod._steps()) == sorted(warm_mod.STEPS)
    assert len(set(warm_mod.STEPS)) == len(warm_mod.STEPS)


def test_a_step_runs_and_the_thresholds_come_back():
    before = (registry.SCATTER_MIN_OPS, rules.FAST_MIN_OPS, generate.ZBV_KERNEL_MIN_OPS)
    seconds = warm_mod.warm(steps=["simulate"])
    assert list(seconds) == ["simulate"] and seconds["simulate"] >= 0
    assert (registry.SCATTER_MIN_OPS, rules.FAST_MIN_OPS, generate.ZBV_KERNEL_MIN_OPS) == before


def test_thresholds_come_back_when_a_step_fails(monkeypatch):
    def boom():
        assert registry.SCATTER_MIN_OPS == 0  # inside a step every gate is open
        raise RuntimeError("step failed")

    monkeypatch.setattr(warm_mod, "_steps", lambda: {"simulate": boom})
    before = registry.SCATTER_MIN_OPS
    with pytest.raises(RuntimeError, match="step failed"):
        warm_mod.warm(steps=["simulate"])
    assert registry.SCATTER_MIN_OPS == before > 0


def test_unknown_step_is_named():
    with pytest.raises(ValueError, match=r"unknown warm-up step 'sweep'; steps are simulate_many"):
        warm_mod.warm(steps=["sweep"])


def test_cli_prints_a_line_per_step(monkeypatch):
    monkeypatch.setattr(warm_mod, "STEPS", ("simulate",))
    out = io.StringIO()
    assert main(["warm"], out=out) == 0
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].endswith("s  simulate")


_SPLIT = """
import json
import numba.core.event as ev
import pipecore as pc
from pipecore.warm import compile_simulate_in_two

compiled = []


class Seen(ev.Listener):
    def on_start(self, event):
        pass

    def on_end(self, event):
        compiled.append(event.data["dispatcher"].py_func.__name__)


ev.register("numba:compile", Seen())
first = compile_simulate_in_two()
second = compile_simulate_in_two()
res = pc.simulate(pc.build("1f1b", 4, 8), pc.Costs(f=1.0, b=2.0, w=0.0))
print(json.dumps({"first": first, "second": second, "compiled": compiled,
                  "makespan": res.makespan}))
"""


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="the split needs os.fork")
def test_first_compile_in_two_processes(tmp_path):
    # An empty cache of its own: the child compiles run_units, this process
    # the others (its list scheduler runs as plain Python meanwhile), and the
    # simulation afterwards loads run_units from the cache.
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", _SPLIT], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["first"] is True and got["second"] is False
    assert "run_units" not in got["compiled"] and "list_units" not in got["compiled"]
    assert "make_units" in got["compiled"] and "peak_memory" in got["compiled"]
    # 1F1B, p=4, m=8, f=1, b=2: (m + p - 1)(f + b) = 33 (the closed form).
    assert got["makespan"] == 33.0

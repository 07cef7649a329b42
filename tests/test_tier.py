"""Small calls on a cold cache run the list scheduler's kernels interpreted
(pipecore.core.tier): same answers as tests/reference.py, bit for bit,
and no compile for the README's main job on an empty Numba cache."""

import json
import os
import subprocess
import sys

import numba
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_kernel import assert_same, flat, run_both

import pipecore as pc
from pipecore.core import tier
from pipecore.kernels import listsched
from pipecore.schedules.recompute import recompute
from pipecore.testing import costs, family_schedules, networks, schedules

# Interpreted kernels are ~20x slower than compiled: fewer examples than test_kernel.
SETTINGS = settings(max_examples=100, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           # the fixture only patches module settings
                                           HealthCheck.function_scoped_fixture])


@pytest.fixture
def interpret_all(monkeypatch):
    """Every kernel call through tier.kernel interpreted, whatever is cached."""
    monkeypatch.setattr(tier, "INTERPRET_MAX_OPS", 1 << 40)
    monkeypatch.setattr(tier, "_budget", lambda dispatcher: float("inf"))
    calls = []
    real = tier._counting

    def counting(dispatcher):
        calls.append(dispatcher.py_func.__name__)
        return real(dispatcher)

    monkeypatch.setattr(tier, "_counting", counting)
    return calls


@SETTINGS
@given(data=st.data(), sched=schedules())
def test_interpreted_equals_reference_random_schedules(interpret_all, data, sched):
    interpret_all.clear()
    c = data.draw(costs(stages=sched.stages))
    net = data.draw(networks(devices=sched.devices))
    assert_same(sched, c, net)
    assert "run_units" in interpret_all  # the property ran the interpreted kernels


@SETTINGS
@given(data=st.data(), sched=family_schedules(recompute=True))
def test_interpreted_equals_reference_families(interpret_all, data, sched):
    interpret_all.clear()
    c = data.draw(costs(stages=sched.stages))
    net = data.draw(networks(devices=sched.devices, allow_none=False))
    assert_same(sched, c, net)
    assert "run_units" in interpret_all
    if sched._info().paired.any():  # overlapped pairs: the programs are cut into units
        assert "program_units" in interpret_all


# (devices, microbatches, stages recomputed: "none", "all" or a list)
_PAST_INT8 = [(8, 16, [0]), (8, 16, "all"), (24, 48, "none")]


@pytest.mark.parametrize("p, m, chosen", _PAST_INT8, ids=["p8-m16-r0", "p8-m16-rall", "p24-m48"])
def test_interpreted_dualpipev_past_int8_equals_reference(interpret_all, p, m, chosen):
    # Found by test_interpreted_equals_reference_families: DualPipeV p=8 m=16
    # (16 stages) with recompute. An overlapped pair's unit time is read from
    # the (cost class, stage) table at class * stages + stage; a recomputed F
    # is class F_DROP = 8, at 8 * 16 + stage >= 128. The interpreted kernel
    # multiplied the int8 class in int8, wrapped to -128 and read another
    # class's time (makespan 85.5 against the oracle's 78.0); the compiled
    # kernel widened it and agreed. Without recompute the same wrap hits from
    # 17 devices on (BW = 3, 34 stages: 3 * 34 + 26 = 128).
    sched = pc.build("dualpipev", p, m)
    if chosen != "none":
        sched = recompute(sched, stages=None if chosen == "all" else chosen)
    c = pc.Costs(f=1, b=2, w=1, comm=0.0, activation=1, weights=1.0)
    net = pc.Network(bytes=0.0, bandwidth=0.5)
    assert_same(sched, c, net)  # bit for bit against tests/reference.py
    assert {"run_units", "program_units"} <= set(interpret_all)


def test_interpreted_scaled_costs_past_int8_equal_reference(interpret_all):
    # The same wrap without pairs: op scales (stragglers) take the per-row
    # cost path, and 1F1B over 16 stages recomputed everywhere has every F in
    # class F_DROP = 8 (table index 8 * 16 + stage >= 128). A straggler factor
    # on device 0 multiplies every op time there, so the oracle gets stage 0's
    # f, b and w times 1.5 (1F1B: stage 0 alone on device 0); the products
    # are exact in binary, so the times must agree bit for bit.
    sched = recompute(pc.build("1f1b", 16, 16))
    base, slow = pc.Costs(f=1.0, b=2.0, w=1.0), 1.5
    scaled = pc.Costs(f=np.r_[slow, np.ones(15)], b=np.r_[2.0 * slow, np.full(15, 2.0)],
                      w=np.r_[slow, np.ones(15)])
    ref = run_both(sched, scaled, None)
    got = pc.simulate(sched, base, stragglers={0: slow})
    assert "run_units" in interpret_all
    np.testing.assert_array_equal(got.start, flat(ref["start"]))
    np.testing.assert_array_equal(got.finish, flat(ref["finish"]))
    assert got.makespan == ref["makespan"]


def test_interpreted_kernels_call_interpreted_kernels():
    run = tier.interpreted(listsched.run_units)
    assert not hasattr(run, "py_func")
    # run_units calls list_units: the copy reads the interpreted one.
    assert run.__globals__["list_units"] is tier.interpreted(listsched.list_units)
    assert listsched.run_units.py_func.__globals__["list_units"] is listsched.list_units


def test_interpreted_refuses_a_plain_function():
    with pytest.raises(ValueError, match="not a Numba dispatcher"):
        tier.interpreted(len)


@numba.njit(cache=False)
def _double(x):
    return 2 * x


def test_choice(monkeypatch):
    monkeypatch.setattr(tier, "INTERPRET_MAX_OPS", 100)
    monkeypatch.setattr(tier, "INTERPRET_BUDGET", 1.0)
    monkeypatch.setattr(tier, "INTERPRET_BUDGET_CACHED", 0.1)
    monkeypatch.setattr(tier, "_spent", 0.0)
    cold = tier.kernel(_double, 100)
    assert cold is not _double and cold(21) == 42  # small, nothing compiled: interpreted
    assert tier.kernel(_double, 101) is _double  # too large for the interpreter
    monkeypatch.setattr(tier, "_spent", 1.0)
    assert tier.kernel(_double, 10) is _double  # budget spent: compile from now on
    monkeypatch.setattr(tier, "_spent", 0.5)
    assert tier.kernel(_double, 10) is not _double
    monkeypatch.setattr(tier, "_cached", {_double})  # as if in Numba's cache
    assert tier.kernel(_double, 10) is _double  # past the smaller budget: load it
    monkeypatch.setattr(tier, "_spent", 0.0)
    assert tier.kernel(_double, 10) is not _double
    assert _double(1) == 2  # compiled in this process now: always called
    assert tier.kernel(_double, 10) is _double
    monkeypatch.setattr(tier, "INTERPRET_MAX_OPS", 0)  # the switch the test suite uses
    assert tier.kernel(listsched.program_units, 10) is listsched.program_units


def test_interpreted_seconds_count_against_the_budget(monkeypatch):
    monkeypatch.setattr(tier, "INTERPRET_MAX_OPS", 1 << 20)
    monkeypatch.setattr(tier, "_spent", 0.0)
    monkeypatch.setattr(tier, "_budget", lambda dispatcher: 1e-9)
    fn = tier.kernel(listsched.run_units, 10)
    assert fn is not listsched.run_units
    res = pc.simulate(pc.build("1f1b", 2, 2), pc.Costs(f=1.0, b=1.0))
    assert res.makespan == 6.0  # (m + p - 1)(f + b), closed form of 1F1B
    assert tier._spent > 0
    assert tier.kernel(listsched.run_units, 10) is listsched.run_units


_COLD = """
import json
import numba.core.event as ev
import pipecore as pc
from pipecore.analysis.compare import compare

compiled = []


class Seen(ev.Listener):
    def on_start(self, event):
        pass

    def on_end(self, event):
        compiled.append(event.data["dispatcher"].py_func.__name__)


ev.register("numba:compile", Seen())
rows = compare(8, 32)
peaks = [r["result"].peak_activation.tolist() for r in rows if r["result"] is not None]
res = pc.simulate(pc.build("1f1b", 4, 8), pc.Costs(f=1.0, b=2.0, w=0.0))
print(json.dumps({"compiled": compiled, "makespan": res.makespan, "rows": len(rows),
                  "makespans": {r["name"]: r["result"].makespan for r in rows
                                if r["result"] is not None}}))
"""

# program_units: compare's dualpipe and dualpipev hold overlapped F&B pairs.
_KERNELS = {"run_units", "list_units", "program_units", "peak_memory"}


def _cold_run(tmp_path, **env):
    env = dict(os.environ, NUMBA_CACHE_DIR=str(tmp_path), **env)
    env.pop("PYTEST_XDIST_WORKER", None)
    done = subprocess.run([sys.executable, "-c", _COLD], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.heavy  # the main job in a fresh process on an empty cache (about 25 s)
def test_main_job_compiles_nothing_on_an_empty_cache(tmp_path):
    got = _cold_run(tmp_path / "a")
    assert not _KERNELS & set(got["compiled"]), got["compiled"]
    # 1F1B, p=4, m=8, f=1, b=2: (m + p - 1)(f + b) = 33 (the closed form).
    assert got["makespan"] == 33.0
    # The same run with interpreting off compiles the kernels and agrees.
    compiled = _cold_run(tmp_path / "b", PIPECORE_INTERPRET_MAX_OPS="0")
    assert _KERNELS <= set(compiled["compiled"])
    assert compiled["makespans"] == got["makespans"]
    assert got["rows"] == compiled["rows"] == len(pc.schedules())
    assert np.isfinite(list(got["makespans"].values())).all()


def test_compiled_block_never_interprets(monkeypatch):
    monkeypatch.setattr(tier, "INTERPRET_MAX_OPS", 100)
    monkeypatch.setattr(tier, "_budget", lambda dispatcher: float("inf"))
    assert tier.kernel(_double, 10) is not _double
    with tier.compiled():
        with tier.compiled():
            assert tier.kernel(_double, 10) is _double
        assert tier.kernel(_double, 10) is _double
    assert tier.kernel(_double, 10) is not _double  # closed: back to the budget

    seen = []
    real = tier.kernel

    def spy(dispatcher, ops):
        got = real(dispatcher, ops)
        seen.append(got is dispatcher)
        return got

    monkeypatch.setattr(tier, "kernel", spy)
    pc.tune(2, 4, pc.Costs(f=1.0, b=1.0, w=1.0), memory_limit=4.0)
    assert seen and all(seen)  # tune simulates many schedules: always compiled


@pytest.mark.parametrize("raw", ["many", "-1", "1.5"])
def test_a_bad_environment_value_is_named(raw, monkeypatch):
    monkeypatch.setenv("PIPECORE_INTERPRET_MAX_OPS", raw)
    with pytest.raises(ValueError, match=f"PIPECORE_INTERPRET_MAX_OPS='{raw}'"):
        tier._max_ops_from_env()
    monkeypatch.setenv("PIPECORE_INTERPRET_MAX_OPS", "0")
    assert tier._max_ops_from_env() == 0


def test_interpreted_units_feed_the_compiled_scheduler(monkeypatch):
    # A kernel may pass its budget while another has not: program_units
    # (a schedule with overlapped pairs) interpreted, run_units compiled.
    # Its units must have the compiled types (no new specialisation of
    # run_units) and give the same times.
    net = pc.Network.uniform(bytes=1.0, bandwidth=2.0, latency=0.1)
    c = pc.Costs(f=1.0, b=2.0, w=1.0, comm=0.1, fb_factor=0.8)
    ref = pc.simulate(pc.build("dualpipe", 4, 8), c, network=net)  # all compiled (conftest)
    signatures = list(listsched.run_units.signatures)
    monkeypatch.setattr(tier, "INTERPRET_MAX_OPS", 1 << 20)
    monkeypatch.setattr(tier, "_budget",
                        lambda d: float("inf") if d is listsched.program_units else 0.0)
    plain = []
    real = tier._counting
    monkeypatch.setattr(tier, "_counting", lambda d: plain.append(d) or real(d))
    got = pc.simulate(pc.build("dualpipe", 4, 8), c, network=net)
    assert plain == [listsched.program_units]
    assert listsched.run_units.signatures == signatures
    np.testing.assert_array_equal(got.start, ref.start)
    np.testing.assert_array_equal(got.finish, ref.finish)
    assert got.makespan == ref.makespan


def test_ready_says_whether_a_call_would_compile(tmp_path, monkeypatch):
    # A kernel nobody has compiled, with a cache folder of its own: not ready;
    # compiled in this process: ready; a fresh dispatcher of the same source
    # finds Numba's cache index: ready too.
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))

    def plus_one(x):
        return x + 1

    plus_one.__module__ = "pipecore_test_ready"
    fresh = numba.njit(cache=True)(plus_one)
    assert not tier.ready(fresh)
    assert fresh(1) == 2
    assert tier.ready(fresh)
    again = numba.njit(cache=True)(plus_one)
    assert tier.ready(again)

"""pc.strategies(ray=True) and ``pipecore plan --ray`` (issue 53): the serial search's answer, from Ray tasks.

The reference is the serial search itself (``ray=False``), whose ranking
tests/test_plan_search.py checks against a brute force: the Ray search
must give the same table (ranks, order, ``why``), the same best plan and
the same estimates, value for value.
"""

from __future__ import annotations

import dataclasses
import os
import pickle
import re
import subprocess
import sys

import numpy as np
import pytest

import pipecore as pc
from pipecore.cli import main
from pipecore.plan import ray as plan_ray

ARCH = pc.Architecture(layers=8, hidden=1024, heads=16, seq=1024, vocab=51200, name="small")
NODE = pc.Cluster.preset("dgx-a100", nodes=1)
# Wide enough that some strategies do not fit an 80 GB A100 (about 20 of the 1,036).
WIDE = pc.Architecture(layers=8, hidden=8192, heads=64, seq=2048, vocab=51200, name="wide")


def _same_estimate(a, b):
    for f in dataclasses.fields(a):
        if f.name != "pipeline":
            assert getattr(a, f.name) == getattr(b, f.name), f.name
    assert a.pipeline.makespan == b.pipeline.makespan
    assert a.pipeline.ops.equals(b.pipeline.ops)
    assert np.array_equal(a.pipeline.peak_activation, b.pipeline.peak_activation)


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray", reason="the Ray search's tests need the pipecore[ray] extra")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.mark.heavy  # starts Ray (15-60 s on two cores)
def test_ray_search_is_the_serial_search(ray_local):
    serial = pc.strategies(WIDE, NODE, 32)
    # A bound that leaves some fitting strategies unranked, so "too slow" reasons are compared too.
    bound = float(np.median([t for t in serial.table.column("iteration_time").to_pylist() if t == t]))
    for arch, kwargs in ((ARCH, {}), (WIDE, {"objective": "cost", "max_iteration_time": bound})):
        ref = pc.strategies(arch, NODE, 32, **kwargs)
        calls = []
        res = pc.strategies(arch, NODE, 32, ray=True, progress=lambda *a, calls=calls: calls.append(a),
                            **kwargs)
        assert res.table.equals(ref.table)
        whys = ref.table.column("why").to_pylist()
        if arch is WIDE:  # unranked rows, each reason, are in the comparison
            assert any(w and w.startswith("needs ") for w in whys)
            assert any(w and "max_iteration_time" in w for w in whys)
        assert res.estimated == ref.estimated > 0 and res.objective == ref.objective
        assert list(res.estimates) == list(ref.estimates)  # same indices, same order
        for i in ref.estimates:
            _same_estimate(res.estimates[i], ref.estimates[i])
        _same_estimate(res.best, ref.best)
        assert res.best.strategy == ref.best.strategy
        # Progress per task: increasing, ending at the total, more than one task on two CPUs.
        total = ref.table.num_rows
        assert [t for _, t in calls] == [total] * len(calls)
        done = [d for d, _ in calls]
        assert done == sorted(done) and done[-1] == total and 1 < len(calls) < total
    assert ray_local.is_initialized()  # a Ray it did not start is left running


def _cli(*args):
    return [sys.executable, "-m", "pipecore.cli", *args]


def _untimed(text):
    return re.sub(r" in [0-9.]+ s:", " in _ s:", text)


@pytest.mark.heavy  # starts Ray (15-60 s on two cores)
def test_cli_plan_on_ray(ray_local):
    argv = ("plan", "--model", "megatron-1.7b", "--cluster", "dgx-a100", "--nodes", "1",
            "--global-batch", "32")
    ref = subprocess.run(_cli(*argv), capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr
    # --ray alone starts (and stops) a Ray instance of its own.
    own = subprocess.run(_cli(*argv, "--ray"), capture_output=True, text=True, timeout=300)
    assert own.returncode == 0, own.stderr
    assert _untimed(own.stdout) == _untimed(ref.stdout)
    # --address auto joins the running cluster (this module's, named by RAY_ADDRESS).
    env = dict(os.environ, RAY_ADDRESS=ray_local.get_runtime_context().gcs_address)
    joined = subprocess.run(_cli(*argv, "--ray", "--address", "auto"), env=env, capture_output=True,
                            text=True, timeout=300)
    assert joined.returncode == 0, joined.stderr
    assert _untimed(joined.stdout) == _untimed(ref.stdout)
    assert ray_local.cluster_resources().get("CPU") == 2  # still there, as it was


def test_missing_ray_is_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # "import ray" now raises ImportError
    with pytest.raises(pc.InputError, match=r'needs Ray: pip install "pipecore\[ray\]"'):
        pc.strategies(ARCH, NODE, 32, ray=True)


def test_cli_missing_ray_is_a_clear_error(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)
    code = main(["plan", "--model", "megatron-1.7b", "--cluster", "dgx-a100", "--nodes", "1",
                 "--global-batch", "32", "--ray"])
    err = capsys.readouterr().err
    assert code != 0
    assert 'pip install "pipecore[ray]"' in err and "--ray" in err, err


def test_address_without_ray_is_refused():
    with pytest.raises(pc.InputError, match=r"'address' 'auto'.*ray=True"):
        pc.strategies(ARCH, NODE, 32, address="auto")


@pytest.mark.parametrize(("n", "cpus"), [(3664, 2), (1036, 2), (100, 2), (5, 2), (3664, 64), (1, 1)])
def test_tasks_cover_the_space_in_order(n, cpus):
    runs = plan_ray._runs(n, cpus)
    # Consecutive, no gap, no overlap: run k starts where run k-1 stops, from 0 to n.
    assert runs[0][0] == 0 and runs[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(runs, runs[1:]))
    assert all(b > a for a, b in runs)
    sizes = [b - a for a, b in runs]
    assert all(s >= min(n, plan_ray.MIN_PER_TASK) for s in sizes[:-1])
    # A few tasks per CPU when there are strategies enough (so no CPU waits on one slow task).
    if n >= plan_ray.TASKS_PER_CPU * cpus * plan_ray.MIN_PER_TASK:
        assert cpus < len(runs) <= plan_ray.TASKS_PER_CPU * cpus


def test_estimate_pickles_without_cached_views():
    # What a Ray task sends back: the Estimate with its simulated pipeline.
    s = pc.Strategy(tp=2, pp=2, dp=2, microbatch_size=1, schedule="interleaved-1f1b", chunks=2)
    est = pc.estimate(ARCH, NODE, s, global_batch=32)
    est.pipeline.ops, est.pipeline.peak_activation  # the views estimate itself builds  # noqa: B018
    back = pickle.loads(pickle.dumps(est))
    # The cached views stay behind (rebuilt on first use) ...
    assert "ops" not in vars(back.pipeline) and "peak_activation" not in vars(back.pipeline)
    # ... and are rebuilt the same.
    _same_estimate(back, est)
    assert back.pipeline.memory.table.equals(est.pipeline.memory.table)
    assert back.pipeline.transfers.equals(est.pipeline.transfers)
    assert "ops" in vars(est.pipeline)  # pickling left the original's caches alone

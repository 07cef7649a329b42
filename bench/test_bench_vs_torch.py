"""pipecore's sweep against PyTorch's own schedule simulator, in one run.

Run: pytest bench/test_bench_vs_torch.py --benchmark-only
torch 2.13's ``_simulate_comms_compute`` dry-runs one lowered pipeline order
(sends and receives added by ``_add_send_recv``, as its runtime does) in
unit steps, with no times. ``simulate_many`` times the same 1F1B schedule
(p=8, m=32) for many cost settings; the summary prints its time per setting
and how many times faster than one torch dry run that is (issue 14's row:
at least 20,000x). The torch benchmark's name holds "reference" so
bench/conftest.py computes that ratio. bench/limit.py's kernel (the least
work a cost sweep can do) runs in the same group, so the summary also shows
the ratio the limit itself reaches: the ceiling of this row for any design
that computes every op's time.
"""

import numpy as np
import pytest
from limit import Limit
from sizes import pick

torch = pytest.importorskip("torch", reason="needs torch: pip install 'pipecore[torch]'")

import torch.distributed.pipelining.schedules as ts  # noqa: E402
from pipecore.bindings import torch as pt  # noqa: E402

import pipecore as pc  # noqa: E402

P, M = 8, 32
N = pick(200_000, 500)


def _lowered():
    sched = pc.build("1f1b", P, M)
    order = pt.to_actions(sched)
    mapping = ts._validate_schedule(order, P, sched.stages, M)
    lowered = ts._add_send_recv({r: list(a) for r, a in order.items()}, mapping.__getitem__,
                                sched.stages)
    return sched, lowered, mapping


def test_torch_dry_run(benchmark):
    sched, lowered, mapping = _lowered()
    benchmark.group = "1f1b p8-m32: simulate_many vs torch _simulate_comms_compute"
    benchmark.name = "reference: torch _simulate_comms_compute (one order, unit steps)"
    out = benchmark(ts._simulate_comms_compute, lowered, mapping.__getitem__, sched.stages)
    assert out is not None


def _table():
    rng = np.random.default_rng(0)
    return {"f": rng.uniform(0.5, 2, N), "b": rng.uniform(0.5, 2, N), "w": rng.uniform(0, 1, N),
            "comm": rng.uniform(0, 0.1, N)}


def test_simulate_many_per_setting(benchmark):
    sched = pc.build("1f1b", P, M)
    table = _table()
    pc.simulate_many(sched, {k: v[:64] for k, v in table.items()})  # compile outside the timing
    benchmark.group = "1f1b p8-m32: simulate_many vs torch _simulate_comms_compute"
    benchmark.name = f"pipecore simulate_many ({N:,} settings/call)"
    benchmark.extra_info["configs"] = N
    res = benchmark.pedantic(pc.simulate_many, (sched, table), rounds=5, iterations=1)
    assert res.num_rows == N


def test_limit_kernel_per_setting(benchmark):
    sched = pc.build("1f1b", P, M)
    table = _table()
    lim = Limit(sched)
    small = {k: v[:256] for k, v in table.items()}
    want = pc.simulate_many(sched, small).column("makespan").to_numpy()
    assert np.array_equal(lim.makespans(small["f"], small["b"], small["w"], small["comm"]), want)
    benchmark.group = "1f1b p8-m32: simulate_many vs torch _simulate_comms_compute"
    benchmark.name = f"limit kernel ({N:,} settings/call)"
    benchmark.extra_info["configs"] = N
    benchmark.pedantic(lim.makespans, (table["f"], table["b"], table["w"], table["comm"]),
                       rounds=5, iterations=1)

"""Issue 5's figures: configurations per second for batched evaluation and scans.

Run: pytest bench/test_bench_scan.py --benchmark-only
Each group holds pipecore and the pure-Python reference (tests/reference.py,
one configuration per call) in the same run; the summary prints per-config
medians, configs/s and the ratio to the reference.
"""

import numpy as np
import pytest
from reference import simulate_reference
from sizes import pick

import pipecore as pc
from pipecore.core.pack import Pack, structure_of
from pipecore.kernels import codes as _codes
from pipecore.scan.batch import param_matrix, threads

NET = pc.Network.uniform(bytes=1.0, bandwidth=4.0, latency=0.05)


def _table(n, seed=0):
    rng = np.random.default_rng(seed)
    return {"f": rng.uniform(0.5, 2, n), "b": rng.uniform(0.5, 2, n), "w": rng.uniform(0, 1, n),
            "comm": rng.uniform(0, 0.1, n), "bytes": rng.uniform(0.5, 2, n)}


def _reference(benchmark, sched):
    c = pc.Costs(f=1.0, b=1.5, w=0.5, comm=0.05)
    arrays = c.stage_arrays(sched.stages, sched.devices)

    def link(src, dst, s):
        return NET.bytes / NET.bandwidth, NET.latency + c.comm

    args = (sched.programs(), arrays["f"].tolist(), arrays["b"].tolist(), arrays["w"].tolist(),
            arrays["activation"].tolist(), arrays["activation_w"].tolist(), link)
    out = benchmark.pedantic(simulate_reference, args, rounds=3, iterations=1)
    assert out["makespan"] == pc.simulate(sched, c, NET).makespan


@pytest.mark.parametrize("method", ["replay", "list"])
@pytest.mark.parametrize("case", ["p8-m32", "p64-m256"])
def test_simulate_many(benchmark, case, method):
    p, m = (8, 32) if case == "p8-m32" else (64, 256)
    sched = pc.build("zb-h1", p, m)
    n = pick({("p8-m32", "replay"): 1_000_000, ("p8-m32", "list"): 100_000,
              ("p64-m256", "replay"): 20_000, ("p64-m256", "list"): 2_000}[(case, method)], 100)
    table = _table(n)
    pc.simulate_many(sched, {k: v[:64] for k, v in table.items()}, NET, method=method)
    benchmark.group = f"simulate_many zb-h1 {case}"
    benchmark.name = f"simulate_many method={method} ({n:,} configs/call)"
    benchmark.extra_info["configs"] = n
    benchmark.pedantic(pc.simulate_many, (sched, table, NET), {"method": method}, rounds=5,
                       iterations=1)


@pytest.mark.parametrize("case", ["p8-m32", "p64-m256"])
def test_simulate_many_reference(benchmark, case):
    p, m = (8, 32) if case == "p8-m32" else (64, 256)
    benchmark.group = f"simulate_many zb-h1 {case}"
    benchmark.name = "reference (pure Python, one config)"
    _reference(benchmark, pc.build("zb-h1", p, m))


MIXED = ["1f1b", "zb-h1", "zb-h2", "gpipe", "eager-1f1b", "interleaved-1f1b", "looped-bfs",
         "zb-v", "v-half", "v-min", "v-zb", "dualpipev"]


@pytest.mark.parametrize("which", ["zb-h1", "mixed"])
def test_list_scheduler_each_config_its_structure(benchmark, which):
    # Full list scheduling with link contention, no replay: consecutive
    # configurations use different p=8, m=32 structures (kernel level; the
    # structures are built beforehand, as a scan's cache holds them).
    names = ["zb-h1"] if which == "zb-h1" else MIXED
    pack = Pack([(structure_of(pc.build(name, 8, 32)), None) for name in names])
    n = pick(100_000, 200)
    c_struct = np.arange(n, dtype=np.int64) % len(names)
    params = param_matrix(_table(n), n, {"bytes": 1.0, "grad_bytes": 0.0, "bandwidth": 4.0,
                                         "latency": 0.05, "inter_bandwidth": 4.0,
                                         "inter_latency": 0.05})
    out = np.zeros((_codes.N_OUT, n))
    status = np.zeros(n, dtype=np.int64)
    ops = np.mean([pack.structures.unit_hi[i] - pack.structures.unit_lo[i] for i in range(len(names))])
    benchmark.group = "full list scheduling p=8 m=32"
    benchmark.name = f"list_groups {which} ({len(names)} structures, ~{ops:.0f} units)"
    benchmark.extra_info["configs"] = n
    benchmark.pedantic(pack.list_schedule, (c_struct, params, out, status, threads()),
                       rounds=5, iterations=1)
    assert (status == 0).all()


def test_list_scheduler_reference(benchmark):
    benchmark.group = "full list scheduling p=8 m=32"
    benchmark.name = "reference (pure Python, zb-h1, one config)"
    _reference(benchmark, pc.build("zb-h1", 8, 32))


SCAN_GRID = {
    # 1,000,000 points: 6 families x p in {2,4,8,16} x m in {8,16,32,64} x 2
    # networks (96 x 2 entries, a few unbuildable) x 5,208 cost points... trimmed
    # to exactly 1e6 by sampling.
    "schedules": ["1f1b", "zb-h1", "interleaved-1f1b", "zb-v", "gpipe", "dualpipev"],
    "devices": [2, 4, 8, 16], "microbatches": [8, 16, 32, 64], "chunks": [2],
    "f": {"min": 0.5, "max": 2.0, "num": 10}, "b": {"min": 0.5, "max": 3.0, "num": 10},
    "w": {"min": 0.0, "max": 1.5, "num": 10}, "comm": [0.0, 0.05, 0.2],
    "memory_limit": [8.0, 1e9], "network": ["free", "ib"],
    "networks": {"ib": {"bytes": 1.0, "bandwidth": 8.0, "latency": 0.01, "devices_per_node": 8,
                        "inter_bandwidth": 2.0, "inter_latency": 0.05}},
    "sample": pick(1_000_000, 2_000), "seed": 0, "part_size": pick(100_000, 1_000),
}


def test_scan_end_to_end(benchmark, tmp_path):
    # `pipecore scan` of 1,000,000 mixed configurations, Parquet output included
    # (a fresh folder and a cold structure cache per round).
    grid = pc.Grid.from_dict(SCAN_GRID)
    rounds = iter(range(100))

    def run():
        return pc.write_scan(grid, tmp_path / f"r{next(rounds)}", plot=False)

    benchmark.group = "scan 1M mixed (p 2..16, m 8..64)"
    benchmark.name = "write_scan, 1,000,000 points, Parquet"
    benchmark.extra_info["configs"] = grid.rows
    summary = benchmark.pedantic(run, rounds=3, iterations=1)
    assert summary["rows"] > 0.9 * SCAN_GRID["sample"]  # a few sampled shapes cannot be built


def test_scan_reference(benchmark):
    benchmark.group = "scan 1M mixed (p 2..16, m 8..64)"
    benchmark.name = "reference (pure Python, zb-h1 p=8 m=32, one config)"
    _reference(benchmark, pc.build("zb-h1", 8, 32))


def test_huge_single_config(benchmark):
    # One configuration of p=1024, m=8192 (1F1B, 16.8M ops): simulate() on a
    # built and validated schedule (building it in Python takes far longer).
    sched = pc.build("1f1b", *pick((1024, 8192), (16, 64)))
    pc.validate(sched)
    costs = pc.Costs(f=1.0, b=2.0, comm=0.05)
    benchmark.group = "p1024-m8192"
    benchmark.name = "pc.simulate 1f1b p=1024 m=8192 (16.8M ops)"
    res = benchmark.pedantic(pc.simulate, (sched, costs, NET), rounds=3, iterations=1)
    assert res.makespan > 0

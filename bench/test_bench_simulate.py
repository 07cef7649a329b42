"""Speed of one simulation: kernel, end-to-end simulate(), and the reference.

Run: pytest bench/ --benchmark-only
Each group holds pipecore and the pure-Python reference on the same input in
the same run, and the summary prints the ratio of medians.
"""

import pytest
from reference import simulate_reference
from sizes import pick

import pipecore as pc

CASES = {
    "p8-m32": ("1f1b", 8, 32, 1),
    "p8-m32-interleaved": ("interleaved-1f1b", 8, 32, 2),
    "p64-m256": ("1f1b", 64, 256, 1),
}
COSTS = pc.Costs(f=1.0, b=2.0, w=0.0, comm=0.0)
NETWORK = pc.Network.uniform(bytes=1.0, bandwidth=2.0, latency=0.1)


def _setup(case, network):
    name, p, m, v = CASES[case]
    sched = pc.build(name, p, m, chunks=v)
    return sched, pc.compile_schedule(sched, COSTS, network)


def _reference_inputs(sched, network):
    arrays = COSTS.stage_arrays(sched.stages, sched.devices)
    if network is None:
        def link(src, dst, s):
            return 0.0, 0.0
    else:
        def link(src, dst, s):
            return network.bytes / network.bandwidth, network.latency
    return (sched.programs(), arrays["f"].tolist(), arrays["b"].tolist(), arrays["w"].tolist(),
            arrays["activation"].tolist(), arrays["activation_w"].tolist(), link)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("net", ["nocomm", "contention"])
@pytest.mark.parametrize("keep", [True, False], ids=["full", "summary"])
def test_kernel(benchmark, case, net, keep):
    # keep=False: the summary pass simulate() runs from LAZY_MIN_OPS ops on.
    network = NETWORK if net == "contention" else None
    sched, compiled = _setup(case, network)
    benchmark.group = f"{case}-{net}"
    benchmark.name = ("kernel (list_schedule on compiled arrays)" if keep
                      else "kernel summary pass (keep=False)")
    full = compiled.run()  # compile / load from cache outside the timing
    status, *_, dev_free, _first = benchmark(compiled.run, keep=keep)
    assert status == 0 and dev_free.max() == full.finish.max()


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("net", ["nocomm", "contention"])
def test_simulate_end_to_end(benchmark, case, net):
    network = NETWORK if net == "contention" else None
    sched, _ = _setup(case, network)
    benchmark.group = f"{case}-{net}"
    benchmark.name = "pc.simulate (compile + kernel + result)"

    def run():
        return pc.simulate(sched, COSTS, network).makespan

    run()
    benchmark(run)


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("net", ["nocomm", "contention"])
def test_reference(benchmark, case, net):
    network = NETWORK if net == "contention" else None
    sched, compiled = _setup(case, network)
    benchmark.group = f"{case}-{net}"
    benchmark.name = "reference (pure Python)"
    args = _reference_inputs(sched, network)
    out = benchmark(simulate_reference, *args)
    # Same answer as the kernel, so the two timings are for the same work.
    status, start, finish, *_ = compiled.run()
    assert out["makespan"] == finish.max()


def test_build_p64_m256(benchmark):
    benchmark.group = "build"
    benchmark.name = "pc.build 1f1b p=64 m=256 (32768 ops)"
    benchmark(pc.build, "1f1b", 64, 256)


@pytest.mark.parametrize("name,p,m", [("v-zb", 16, 64), ("v-half", 16, 64), ("zb-v", 16, 64)])
def test_build_generated(benchmark, name, p, m):
    # Block-built schedules do their reordering in Python at build time.
    benchmark.group = "build"
    benchmark.name = f"pc.build {name} p={p} m={m}"
    benchmark(pc.build, name, p, m)


def test_study_default_grid(benchmark):
    # Issue 4's bar: the default `pipecore study` grid in under a minute.
    from pipecore.analysis.study import study

    benchmark.group = "study"
    benchmark.name = "study() default grid (15 families x p 4,8 x m 8..256 x 3x3)"
    # The smoke run: one shape, one grid cell.
    kwargs = pick({}, {"devices": (4,), "microbatches": (8,), "factors": (1.0,)})
    table = benchmark.pedantic(study, kwargs=kwargs, rounds=1, iterations=1)
    assert table.num_rows > 0


def test_simulate_many_p8_m32(benchmark):
    # Issue 5 figure (not yet its bar): configurations per second with the full
    # list scheduler run once per setting, in parallel inside one kernel call.
    import numpy as np

    sched = pc.build("zb-h1", 8, 32)
    n = pick(20000, 100)
    rng = np.random.default_rng(0)
    table = {"f": rng.uniform(0.5, 2, n), "b": rng.uniform(0.5, 2, n), "w": rng.uniform(0, 1, n)}
    pc.simulate_many(sched, table)
    benchmark.group = "simulate_many"
    benchmark.name = f"simulate_many zb-h1 p=8 m=32, {n} settings"
    benchmark(pc.simulate_many, sched, table)

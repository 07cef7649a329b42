"""Issue 8's Monte Carlo bar: 10,000 jitter draws at p=8, m=32 in under 1 s.

Run: pytest bench/test_bench_variation.py --benchmark-only
The reference here is pc.simulate called once per draw (the pure-Python
oracle in tests/ has per-stage times only, so it cannot take per-op
jitter); the summary prints per-draw medians and the ratio.
"""

import pytest
from sizes import pick

import pipecore as pc

DRAWS = pick(10_000, 128)

COSTS = pc.Costs(f=1.0, b=1.0, w=1.0, comm=0.05, activation_w=0.5)
JITTER = pc.Jitter.lognormal(0.05, seed=1)


@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "zb-v"])
def test_monte_carlo_10k(benchmark, name):
    sched = pc.build(name, 8, 32)
    pc.monte_carlo(sched, COSTS, JITTER, draws=64)  # compile outside the timing
    benchmark.group = f"monte carlo {name} p8-m32"
    benchmark.name = "pc.monte_carlo (10,000 draws/call)"
    benchmark.extra_info["configs"] = DRAWS
    mc = benchmark.pedantic(pc.monte_carlo, (sched, COSTS, JITTER), {"draws": DRAWS}, rounds=5,
                            iterations=1)
    assert mc.makespans.size == DRAWS


@pytest.mark.parametrize("name", ["1f1b", "zb-h1", "zb-v"])
def test_one_simulate_per_draw_reference(benchmark, name):
    sched = pc.build(name, 8, 32)

    def loop():
        return [pc.simulate(sched, COSTS, jitter=JITTER, draw=k).makespan for k in range(50)]

    loop()
    benchmark.group = f"monte carlo {name} p8-m32"
    benchmark.name = "reference: pc.simulate, one draw per call (50 draws/call)"
    benchmark.extra_info["configs"] = 50
    benchmark.pedantic(loop, rounds=3, iterations=1)

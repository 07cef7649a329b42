"""Speed of pc.swarm, the SWARM discrete-event simulation (pure Python).

Run: pytest bench/test_bench_swarm.py --benchmark-only
8 stages of 4 peers, 1,000 microbatches (16,000 requests): reliable, and under
churn with the fixed 1F1B pipelines beside it. The summary prints medians;
there is no reference to compare with (tests/test_swarm.py checks the runs).
"""

import pytest
from sizes import pick

import pipecore as pc

MICROBATCHES = pick(1000, 100)
SPEEDS = [[1.0, 1.0, 0.75, 0.5]] * 8
COSTS = pc.Costs(f=1.0, b=2.0, comm=0.1)


@pytest.mark.parametrize("churn", [None, (500.0, 50.0)], ids=["reliable", "churn"])
def test_swarm_s8_r4(benchmark, churn):
    benchmark.group = f"swarm s8 r4 m{MICROBATCHES}"
    benchmark.name = f"pc.swarm ({'churn' if churn else 'reliable'}, with the fixed pipeline)"
    res = benchmark.pedantic(pc.swarm, (SPEEDS, COSTS, MICROBATCHES), {"churn": churn}, rounds=5,
                             iterations=1)
    assert res.requests["lost"].size >= 16 * MICROBATCHES

"""Issue 6's time bars: tune at p=8 m=32 (< 5 s) and p=32 m=128 (< 60 s), and
the MILP at p=4 m=8 (< 60 s). Run: pytest bench/test_bench_tune.py --benchmark-only

Costs: the Zero Bubble paper's Table 9 row for 1.5B (T_F, T_B, T_W, T_comm in
ms), M_W = 0.366 M_B, limit p * M_B (1F1B's activation memory).
"""

import pytest
from sizes import pick

import pipecore as pc

COSTS = pc.Costs(f=18.522, b=18.086, w=9.337, comm=0.601, activation=1.0, activation_w=0.366,
                 weights=0.0)


@pytest.mark.parametrize("p,m,rounds", [(8, 32, 3), pick((32, 128, 1), (8, 16, 1))])
def test_tune(benchmark, p, m, rounds):
    benchmark.group = "tune"
    benchmark.name = f"pc.tune p={p} m={m}, limit p*M_B (all families, generated, polished)"
    best = benchmark.pedantic(pc.tune, (p, m, COSTS), {"memory_limit": float(p)}, rounds=rounds,
                              iterations=1)
    assert best.result.peak_activation.max() <= p * (1 + 1e-9)


@pytest.mark.parametrize("limit", [4.0, 8.0])
def test_milp_p4_m8(benchmark, limit):
    pytest.importorskip("highspy", reason='the MILP needs the pipecore[milp] extra')
    costs = pc.Costs(f=1.0, b=1.3, w=0.7, comm=0.1, weights=0.0)
    benchmark.group = "milp"
    benchmark.name = f"milp.optimal p=4 m=8 linear, limit {limit:g}"
    opt = benchmark.pedantic(pc.milp.optimal, (range(4), 8, costs, limit), rounds=2, iterations=1)
    assert opt.proven

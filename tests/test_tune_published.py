"""Issue 6's first bar: with the Zero Bubble paper's Table 5 settings, tune
does no worse than the paper's automatic schedules ZB-1p (memory limit
p * M_B) and ZB-2p (2p * M_B).

Published values: "Zero Bubble Pipeline Parallelism" (Qi, Wan, Huang, Lin;
ICLR 2024, arXiv 2401.10241v1), Table 5 columns ZB-1p and ZB-2p, checked
against the authors' efficiency.py (sail-sg/zero-bubble-pipeline-parallelism,
branch arxiv, commit f68d3879); see docs/research/tune.md section 1. Costs are
Table 9's (T_F, T_B, T_W, T_comm per stage, in ms, as in tests/test_published.py).
Memory: an F holds M_B, of which M_W stays from B to W; M_W / M_B is 0.366
for 1.5B and 0.432 for the others (M_B = 34h + 5as, M_W = 32h, same source).
The rate is the paper's: idle share of the longest per-device span, which is
what tune minimises with objective="span". tune may pick any placement
(interleaved, V): the bar is about the best schedule, not a linear one.
"""

import pytest
from test_published import ROUNDING, TABLE5

import pipecore as pc

PUBLISHED = {  # (model, m): (ZB-1p, ZB-2p)
    ("1.5B", 24): (0.1585, 0.0433), ("1.5B", 32): (0.1242, 0.0039), ("1.5B", 64): (0.0674, 0.0026),
    ("6.2B", 24): (0.1323, 0.0029), ("6.2B", 32): (0.1045, 0.0022), ("6.2B", 64): (0.0554, 0.0010),
    ("14.6B", 48): (0.1397, 0.0066), ("14.6B", 64): (0.1088, 0.0054),
    ("14.6B", 128): (0.0576, 0.0028),
    ("28.3B", 96): (0.1421, 0.0038), ("28.3B", 128): (0.1106, 0.0029),
    ("28.3B", 256): (0.0594, 0.0018),
}


# The rows of p >= 16 (tens of thousands of ops per candidate, minutes in all) run in
# CI's heavy run; the README's test command checks the p = 8 rows.
@pytest.mark.parametrize("row", [pytest.param(r, id=f"{r[0]}-p{r[1]}-m{r[2]}",
                                              marks=[pytest.mark.heavy] if r[1] >= 16 else [])
                                 for r in TABLE5])
@pytest.mark.parametrize("budget", ["1p", "2p"])
def test_tune_no_worse_than_zb_auto(row, budget):
    model, p, m, f, b, w, comm, _v, _ = row
    m_w = 0.366 if model == "1.5B" else 0.432
    costs = pc.Costs(f=f, b=b, w=w, comm=comm, activation=1.0, activation_w=m_w, weights=0.0)
    limit = float(p if budget == "1p" else 2 * p)
    # tune adds polished candidates to the constructive ones and keeps the
    # best, so passing without polish implies passing with it. At p >= 16
    # polish never won in these rows (2026-11-25: same label and rate in all
    # 12) and took 40-55% of the time, so those rows run without it; the
    # smaller rows keep tune's default.
    best = pc.tune(p, m, costs, memory_limit=limit, objective="span", polish=p < 16)
    published = PUBLISHED[(model, m)][0 if budget == "1p" else 1]
    res = pc.simulate(best.schedule, costs)
    assert res.peak_activation.max() <= limit * (1 + 1e-9)
    assert res.bubble_rate <= published + ROUNDING, (best.label, res.bubble_rate, published)

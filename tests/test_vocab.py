"""Vocabulary Parallelism (Yeung et al., arXiv:2411.05288): families vocab-1, vocab-2 and the layout study.

Golden values come from outside pipecore:

- the paper's figure 10 caption and the authors' README table
  (github.com/sail-sg/VocabularyParallelism, "Comparison of Schedules"):
  activation memory of p + 2 microbatches (Algorithm 1) and p + 1
  (Algorithm 2) against 1F1B's p, and the same bubble as 1F1B;
- the authors' artifact results (artifact/README.md and
  artifact/example-results/full-exp.txt of that repository; its README says
  they match the 8-GPU rows of the paper's Table 5, which we could not read
  ourselves): MFU and peak memory of the baseline and vocab-1/vocab-2 on
  8 A100s, a ~4B model (32 layers, hidden 3072, 24 heads), 128
  microbatches of 1, sequence 2048 and 4096, vocabularies 32k-256k;
- an independent op-by-op reference of the order (below).
"""

from __future__ import annotations

import numpy as np
import pytest

import pipecore as pc
from pipecore.analysis.compare import compare
from pipecore.analysis.model import HARDWARE_PRESETS
from pipecore.kernels.codes import F
from pipecore.plan.vocab import vocab_costs, vocab_study
from pipecore.schedules.vocab import EXTRA_WARMUP

NAMES = ("vocab-1", "vocab-2")


def _reference_order(p, m, extra):
    """Each device's ops, written op by op: min(p - d + extra, m) forwards,
    then one backward and one forward while forwards remain, then the rest
    of the backwards (the 1F1B loop of the authors' schedule with its
    extra warm-up)."""
    out = []
    for d in range(p):
        k = min(p - d + extra, m)
        ops = [("F", j) for j in range(k)]
        nf, nb = k, 0
        while nb < m:
            ops.append(("B", nb))
            nb += 1
            if nf < m:
                ops.append(("F", nf))
                nf += 1
        out.append(ops)
    return out


def _order(sched):
    dev, slot = sched._column("device"), sched._column("slot")
    kind, mb = sched.kind_codes, sched._column("microbatch")
    out = [[] for _ in range(sched.devices)]
    for i in np.lexsort((slot, dev)):
        out[int(dev[i])].append(("F" if kind[i] == F else "B", int(mb[i])))
    return out


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("p,m", [(1, 1), (1, 5), (2, 3), (4, 4), (4, 9), (5, 2), (8, 24)])
def test_order_matches_reference(name, p, m):
    sched = pc.build(name, p, m)
    assert _order(sched) == _reference_order(p, m, EXTRA_WARMUP[name])


@pytest.mark.parametrize("name,inflight", [("vocab-1", 2), ("vocab-2", 1)])
@pytest.mark.parametrize("p", [2, 4, 8])
def test_peak_activation_is_paper_p_plus(name, inflight, p):
    # Figure 10 caption / README table: p + 2 (Algorithm 1), p + 1 (Algorithm 2) microbatches.
    m = 4 * p
    res = pc.simulate(pc.build(name, p, m), pc.Costs(f=1, b=2, w=0, activation=1))
    assert res.peak_activation.max() == p + inflight
    one = pc.simulate(pc.build("1f1b", p, m), pc.Costs(f=1, b=2, w=0, activation=1))
    assert one.peak_activation.max() == p


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("costs", [pc.Costs(f=1, b=2, w=0), pc.Costs(f=1, b=1, w=1),
                                   pc.Costs(f=[1, 3, 2, 1], b=[2, 2, 5, 1], w=0)])
def test_same_makespan_as_1f1b(name, costs):
    # README table: the bubble rate of Vocab-1 and Vocab-2 is 1F1B's, with the
    # stages balanced (what vocabulary parallelism is for). Unequal stages can
    # make a warm-up forward delay a backward the next stage waits for: never faster.
    equal = np.ndim(costs.f) == 0
    for m in (1, 3, 4, 12):
        a = pc.simulate(pc.build(name, 4, m), costs).makespan
        b = pc.simulate(pc.build("1f1b", 4, m), costs).makespan
        assert a == pytest.approx(b) if equal else a >= b - 1e-9


@pytest.mark.parametrize("p,m", [(4, 8), (4, 3), (6, 20), (1, 3)])
def test_three_views_agree(p, m):
    for costs in (pc.Costs(), pc.Costs(f=1, b=1, w=1, activation=2)):
        for row in compare(p, m, costs=costs, names=NAMES):
            assert row["flags"] == [], row["flags"]
            assert row["formula_exact"]


# Authors' artifact (artifact/example-results/full-exp.txt): (seq, vocab) ->
# (MFU baseline, MFU vocab-1, MFU vocab-2, GB baseline, GB vocab-1, GB vocab-2).
ARTIFACT = {
    (2048, 32000): (47.52, 53.10, 52.56, 16.01, 16.64, 15.87),
    (2048, 64000): (40.82, 52.74, 52.36, 17.74, 17.48, 16.64),
    (2048, 128000): (33.70, 52.22, 51.95, 21.00, 18.40, 17.56),
    (2048, 256000): (17.29, 51.73, 51.20, 35.56, 19.44, 18.85),
    (4096, 32000): (52.82, 58.52, 58.23, 22.23, 24.97, 23.39),
    (4096, 64000): (45.78, 58.22, 57.94, 23.98, 24.58, 23.14),
    (4096, 128000): (37.13, 57.87, 57.40, 27.22, 26.10, 24.56),
    (4096, 256000): (27.63, 57.31, 56.61, 33.86, 27.38, 26.25),
}


@pytest.fixture(scope="module")
def study():
    hw = HARDWARE_PRESETS["a100-nvlink"]
    out = {}
    for seq, vocab in ARTIFACT:
        model = pc.Model.transformer(layers=32, hidden=3072, heads=24, seq=seq, vocab=vocab)
        out[seq, vocab] = {r["schedule"] + "/" + r["layout"]: r
                           for r in vocab_study(model, 8, 128, hw)}
    return out


@pytest.mark.parametrize("key", sorted(ARTIFACT))
def test_speedup_against_artifact(study, key):
    # Same model FLOPs per iteration, so the MFU ratio is the throughput ratio.
    mfu_base, mfu_v1, mfu_v2 = ARTIFACT[key][:3]
    rows = study[key]
    if key == (2048, 256000):
        # The reported baseline here (17.29% MFU, 35.56 GB, more than at 4096 tokens)
        # is slower than the layer imbalance alone explains; we only check the direction.
        assert rows["vocab-1/vocab"]["speedup"] > 1.8
        return
    assert rows["vocab-1/vocab"]["speedup"] == pytest.approx(mfu_v1 / mfu_base, rel=0.1)
    assert rows["vocab-2/vocab"]["speedup"] == pytest.approx(mfu_v2 / mfu_base, rel=0.1)


@pytest.mark.parametrize("key", sorted(ARTIFACT))
def test_peak_memory_against_artifact(study, key):
    rows = study[key]
    gb_base, gb_v1, gb_v2 = ARTIFACT[key][3:]
    assert rows["vocab-1/vocab"]["memory_max"] / 1e9 == pytest.approx(gb_v1, rel=0.1)
    assert rows["vocab-2/vocab"]["memory_max"] / 1e9 == pytest.approx(gb_v2, rel=0.1)
    if key != (2048, 256000):  # the outlier above
        assert rows["1f1b/baseline"]["memory_max"] / 1e9 == pytest.approx(gb_base, rel=0.1)
    # Algorithm 2 holds one microbatch fewer than Algorithm 1 (figure 10).
    assert rows["vocab-2/vocab"]["memory_max"] < rows["vocab-1/vocab"]["memory_max"]


def test_imbalance_removed_at_256k():
    hw = HARDWARE_PRESETS["a100-nvlink"]
    model = pc.Model.transformer(layers=32, hidden=3072, heads=24, seq=4096, vocab=256000)
    base = vocab_costs(model, 8, hw, "baseline")
    vp = vocab_costs(model, 8, hw, "vocab")
    t_base = base.f + base.b + base.w
    t_vp = vp.f + vp.b + vp.w
    # The head makes the last stage the slowest by far; vocabulary parallelism evens the stages.
    assert t_base[-1] > 2 * t_base[1:-1].max()
    assert np.allclose(t_vp, t_vp[0])
    # Work is moved, not created or lost.
    assert t_vp.sum() == pytest.approx(t_base.sum())
    # Parameters likewise (held=0: no vocabulary-pass activations counted).
    w0 = vocab_costs(model, 8, hw, "vocab", held=0).weights
    assert w0.sum() == pytest.approx(np.sum(base.weights))
    assert np.allclose(w0, w0[0])


def test_costs_errors():
    hw = HARDWARE_PRESETS["a100-nvlink"]
    model = pc.Model.transformer(layers=4, hidden=256, heads=4, seq=128, vocab=1000)
    with pytest.raises(ValueError, match="layout"):
        vocab_costs(model, 2, hw, "tensor")
    with pytest.raises(ValueError, match="fewer than devices=8"):
        vocab_costs(model, 8, hw)
    with pytest.raises(ValueError, match="held"):
        vocab_costs(model, 2, hw, held=-1)
    with pytest.raises(ValueError, match="schedule"):
        vocab_costs(model, 2, hw, schedule="1f1b")

"""HelixPipe (Zhang et al., arXiv:2507.00394): placement, FILO order, closed forms, study.

Golden values: the placement is read from the authors' code
(github.com/code-tunnel/Megatron-LM, branch dev,
megatron/core/pipeline_parallel/attn_pipe_schedule.py: a parameter part on
rank r sends the QKV of data offset d to rank (r + d + 1) % p, offset p - 1
computes locally); the claims from the paper's abstract (attention of
different microbatches on different stages; first-in-last-out; gains grow
with the sequence length); the bounds are worked by hand in each test.
"""

import numpy as np
import pytest

import pipecore as pc
from pipecore.analysis.longseq import helixpipe_study
from pipecore.kernels.codes import F
from pipecore.schedules.helixpipe import attention_device, formula_helixpipe


def _cols(s):
    return (s._column("device"), s._column("slot"), s.kind_codes, s._column("stage"),
            s._column("microbatch"))


@pytest.mark.parametrize("p,m,v,folds", [(4, 8, 1, 2), (4, 8, 2, 1), (3, 12, 2, 2)])
def test_placement_follows_the_authors_send_targets(p, m, v, folds):
    s = pc.build("helixpipe", p, m, chunks=v, folds=folds)
    dev, _, kind, stage, mb = _cols(s)
    assert s.stages == 2 * v * p + 1
    for r in range(len(dev)):
        j = stage[r] // 2
        if stage[r] % 2 == 0:
            assert dev[r] == j % p  # parameter part j on rank j mod p
        else:
            d = (mb[r] // folds) % p
            assert dev[r] == (j % p + d + 1) % p  # the code's (pp_rank + data_offset + 1) % p
    # Offset p - 1 computes its attention where its parameter part ran.
    assert attention_device(5, (p - 1) * folds, p, folds) == 5 % p


def test_one_layers_attention_spreads_over_every_device():
    p, m, folds = 4, 8, 2
    s = pc.build("helixpipe", p, m, chunks=2, folds=folds)
    dev, _, kind, stage, mb = _cols(s)
    for j in range(2 * p):
        rows = (stage == 2 * j + 1) & (kind == F) & (mb < p * folds)
        assert sorted(set(dev[rows].tolist())) == list(range(p))


def test_first_in_last_out_on_every_device():
    p, m = 4, 16
    s = pc.build("helixpipe", p, m, chunks=1)
    dev, slot, kind, stage, mb = _cols(s)
    for d in range(p):
        rows = np.flatnonzero(dev == d)
        rows = rows[np.argsort(slot[rows])]
        fw = [(stage[r], mb[r]) for r in rows if kind[r] == F]
        bw = [(stage[r], mb[r]) for r in rows if kind[r] != F]
        assert (kind[rows[:len(fw)]] == F).all()  # every forward before any backward
        assert bw == fw[::-1]


def test_makespan_and_memory_closed_forms_by_hand():
    # p=4, v=1, m=8: S = 9 stages, each p/S = 4/9 of a device share. Device 0
    # hosts P_0, P_4 and one attention stage per microbatch: 3 * 8 = 24 ops of
    # each direction, 24 * (1 + 2) * 4/9 = 32 time units. FILO holds every
    # forward at the turn: device 0 holds 24 stage activations (24 * 4/9),
    # the others 16 (16 * 4/9).
    c = pc.Costs(f=1.0, b=2.0, w=0.0, activation=1.0)
    s = pc.build("helixpipe", 4, 8, chunks=1)
    res = pc.simulate(s, c)
    assert res.makespan == pytest.approx(32.0)
    assert np.asarray(res.peak_activation) == pytest.approx([96 / 9, 64 / 9, 64 / 9, 64 / 9])
    form = formula_helixpipe(4, 8, 1, c)
    assert form["makespan"] == pytest.approx(32.0)
    assert form["peak_activation"] == pytest.approx([96 / 9, 64 / 9, 64 / 9, 64 / 9])


@pytest.mark.parametrize("p,m,v,folds", [(2, 4, 1, 2), (3, 6, 2, 1), (4, 16, 2, 2),
                                         (5, 10, 2, 2), (8, 16, 1, 2)])
def test_simulation_within_one_op_of_the_device_zero_bound(p, m, v, folds):
    c = pc.Costs(f=1.0, b=1.5, w=0.0, activation=1.0)
    S = 2 * v * p + 1
    bound = (2 * v + 1) * m * 2.5 * p / S  # device 0's work, worked as in the test above
    res = pc.simulate(pc.build("helixpipe", p, m, chunks=v, folds=folds), c)
    assert bound - 1e-9 <= res.makespan <= bound + 2.5 * p / S + 1e-9
    assert formula_helixpipe(p, m, v, c, folds=folds)["makespan"] == pytest.approx(bound)


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match="multiple of devices \\* folds"):
        pc.build("helixpipe", 4, 6)
    with pytest.raises(ValueError, match="'attention' must be a positive"):
        pc.build("helixpipe", 4, 8, attention=0)
    with pytest.raises(ValueError, match="'folds'"):
        pc.build("helixpipe", 4, 8, folds=0)
    with pytest.raises(ValueError, match="Python list schedule"):
        pc.build("helixpipe", 1024, 8192)


def test_study_gains_grow_with_the_sequence_length():
    # The abstract: "HelixPipe gains increasing advantages with longer sequence lengths".
    rows = helixpipe_study(seq_lengths=(8192, 32768, 131072))
    helix = [r for r in rows if r["schedule"] == "helixpipe"]
    speedups = [r["speedup"] for r in helix]
    bubbles = [r["bubble_ratio"] for r in helix]
    assert speedups == sorted(speedups) and bubbles == sorted(bubbles, reverse=True)
    at_128k = {r["schedule"]: r["step_s"] for r in rows if r["seq"] == 131072}
    assert at_128k["helixpipe"] < min(at_128k["1f1b"], at_128k["zb-v"])
    # Memory is balanced over the devices and below 1F1B's device 0 (FILO with
    # recomputation without attention).
    assert all(r["memory_ratio"] < 1 for r in helix)

"""HelixPipe (Zhang et al., arXiv:2507.00394): placement, FILO order, closed forms, study.

Golden values: the placement is read from the authors' code
(github.com/code-tunnel/Megatron-LM, branch dev,
megatron/core/pipeline_parallel/attn_pipe_schedule.py: a parameter part on
rank r sends the QKV of data offset d to rank (r + d + 1) % p, offset p - 1
computes locally); the per-device order from tests/reference_helixpipe.py, a
step-by-step replay of that file's attention_pipeline loops; the claims
from the paper's abstract (attention of different microbatches on
different stages; first-in-last-out; gains grow with the sequence length);
the bounds are worked by hand in each test.
"""

import numpy as np
import pytest
from reference_helixpipe import replay

import pipecore as pc
from pipecore.analysis.longseq import helixpipe_study
from pipecore.core.sizes import MAX_OPS
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


def _programs(s):
    dev, slot, kind, stage, mb = _cols(s)
    out = []
    for d in range(s.devices):
        rows = np.flatnonzero(dev == d)
        rows = rows[np.argsort(slot[rows])]
        out.append([("F" if kind[r] == F else "BW", int(stage[r]), int(mb[r])) for r in rows])
    return out


@pytest.mark.parametrize("p,m,v,folds", [(2, 4, 1, 2), (2, 8, 2, 1), (3, 6, 2, 1), (4, 16, 2, 2),
                                         (5, 10, 2, 2), (4, 24, 3, 2), (8, 16, 1, 2),
                                         (3, 18, 2, 3)])
def test_order_is_the_authors_loop_order(p, m, v, folds):
    # The reference replays attention_pipeline's forward and backward loops
    # rank by rank against each other (it raises if they deadlock).
    assert _programs(pc.build("helixpipe", p, m, chunks=v, folds=folds)) == replay(p, m, v, folds)


def test_first_in_last_out_on_every_device():
    p, m, folds = 4, 16, 2
    s = pc.build("helixpipe", p, m, chunks=1, folds=folds)
    for d, prog in enumerate(_programs(s)):
        fw = [op[1:] for op in prog if op[0] == "F"]
        bw = [op[1:] for op in prog if op[0] != "F"]
        assert [op[0] for op in prog[:len(fw)]] == ["F"] * len(fw)  # forwards first
        if d == 0:
            # The code's last backward loop runs the prelude's folds in forward order.
            assert bw[-folds:] == fw[:folds]
            bw, fw = bw[:-folds], fw[folds:]
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


def test_simulation_attains_the_device_zero_bound():
    # Device 0's work (worked as in the test above) is a lower bound; the
    # authors' order keeps device 0 busy throughout in every shape here, the
    # grid formula_helixpipe's docstring names.
    for c in (pc.Costs(f=1.0, b=1.5, w=0.0, activation=1.0), pc.Costs(f=1.0, b=2.0, w=1.0)):
        for p in (2, 3, 5, 8):
            for v in (1, 2, 3):
                for folds in (1, 2, 3):
                    for repeats in (1, 2):
                        m = repeats * p * folds
                        S = 2 * v * p + 1
                        bound = (2 * v + 1) * m * (c.f + c.b + c.w) * p / S
                        res = pc.simulate(pc.build("helixpipe", p, m, chunks=v, folds=folds), c)
                        assert res.makespan == pytest.approx(bound), (p, v, folds, repeats)
                        form = formula_helixpipe(p, m, v, c, folds=folds)
                        assert form["makespan"] == pytest.approx(bound)
                        assert not form["exact"]


def test_one_device_runs_each_microbatch_through():
    # With p = 1 the code's loops have no remote offset; pipecore runs each
    # microbatch through the 2 v + 1 stages, then the backwards in reverse.
    prog = _programs(pc.build("helixpipe", 1, 4, chunks=2))[0]
    assert prog[:6] == [("F", s, 0) for s in range(5)] + [("F", 0, 1)]
    assert [op[1:] for op in prog[20:]] == [op[1:] for op in prog[:20]][::-1]


def test_bad_shapes_are_named():
    with pytest.raises(ValueError, match="multiple of devices \\* folds"):
        pc.build("helixpipe", 4, 6)
    with pytest.raises(ValueError, match="'folds'"):
        pc.build("helixpipe", 4, 8, folds=0)
    # 2 (2 p + 1) m = 4.3e9 ops: refused before any allocation.
    with pytest.raises(ValueError, match=f"at most {MAX_OPS:,} ops"):
        pc.build("helixpipe", 1024, 1 << 20)


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

"""DualPipeV against the DualPipe repository's table (deepseek-ai/DualPipe
README, commit 3da1bbea; DeepSeek-V3 report, Table 2): bubble
(PP/2 - 1)(F&B + B - 3W) with PP = 2p stages, F, B (full backward), W and F&B
per chunk; activation PP + 1 chunks per device; parameters 2x a 1F1B device
on PP devices. The README's bubble is the worst device's idle time over the
step (makespan minus its busy time). The order itself is checked against
torch's ScheduleDualPipeV in test_torch_fixtures.py.
"""

import numpy as np
import pytest

import pipecore as pc


def readme_bubble(p, F, B_full, W, FB):
    return (2 * p // 2 - 1) * (FB + B_full - 3 * W)


@pytest.mark.parametrize("p", [4, 8, 16])
def test_bubble_matches_readme(p):
    m = 4 * p
    sched = pc.build("dualpipev", p, m)
    # Chunk F = input backward = W = 1 (Costs are per device share: two chunks).
    # (a) F&B costs F + B = 3 (no overlap gain); (b) the F&B cost of 2.
    for fb_factor, FB in ((1.0, 3.0), (2.0 / 3.0, 2.0)):
        c = pc.Costs(f=2.0, b=2.0, w=2.0, fb_factor=fb_factor, activation=1.0, activation_w=1.0)
        res = pc.simulate(sched, c)
        worst_idle = float((res.makespan - res.busy).max())
        assert worst_idle == pytest.approx(readme_bubble(p, 1.0, 2.0, 1.0, FB), abs=1e-9)
        # PP + 1 = 2p + 1 chunk activations (half a microbatch each) on every device.
        np.testing.assert_allclose(res.peak_activation, np.full(p, (2 * p + 1) / 2))
        fm = pc.formula(sched, c)
        assert res.makespan == pytest.approx(fm["makespan"], abs=1e-9)


def test_weights_twice_a_1f1b_device():
    # A model with 8 units of weights: DualPipeV on p=4 devices holds two of
    # its 2p = 8 stages per device; 1F1B on PP = 8 devices holds one.
    # Costs.weights is per device share (1/p of the model).
    model = 8.0
    dual = pc.simulate(pc.build("dualpipev", 4, 8), pc.Costs(weights=model / 4))
    flat = pc.simulate(pc.build("1f1b", 8, 8), pc.Costs(weights=model / 8))
    np.testing.assert_allclose(dual.static_memory, np.full(4, 2.0))
    np.testing.assert_allclose(flat.static_memory, np.full(8, 1.0))


def test_needs_enough_microbatches():
    with pytest.raises(ValueError, match=r"microbatches >= 2 \* devices = 8 \(got 7\)"):
        pc.build("dualpipev", 4, 7)


# DeepSeek's DualPipe (deepseek-ai/DualPipe, commit 3da1bbea, dualpipe/dualpipe.py)
# run unmodified with recording stubs, p = 4 ranks, m = 8: the per-rank order
# listed in docs/research/dualpipe.md 3.3. Blocks 0-3 are the stages;
# microbatches 0-3 go down, 4-7 up. All-reduces (AR) are pipecore's addition.
DEEPSEEK_DUALPIPE_P4_M8 = {
    0: "0F0 0F1 0F2 3F4 3B4 3W4 3F5 0F3&3BW5 3F6&0BW0 3BW6 3F7&0BW1 3BW7 0B2 0W2 0B3 0W3",
    1: "1F0 2F4 1F1 2F5 1F2 2BW4 2F6&1BW0 1F3&2BW5 2F7&1BW1 2BW6 1BW2 2B7 1B3 2W7 1W3",
    2: "1F4 2F0 1F5 2F1 1F6 2BW0 2F2&1BW4 1F7&2BW1 2F3&1BW5 2BW2 1BW6 2B3 1B7 2W3 1W7",
    3: "0F4 0F5 0F6 3F0 3B0 3W0 3F1 0F7&3BW1 3F2&0BW4 3BW2 3F3&0BW5 3BW3 0B6 0W6 0B7 0W7",
}


def test_dualpipe_order_matches_deepseek():
    got = pc.build("dualpipe", 4, 8).to_actions()
    for rank, text in DEEPSEEK_DUALPIPE_P4_M8.items():
        assert [a for a in got[rank] if not a.endswith("AR")] == text.split()


@pytest.mark.parametrize("p", [4, 8, 16])
def test_dualpipe_bubble_memory_weights_match_readme(p):
    sched = pc.build("dualpipe", p, 2 * p)
    assert sched.replicated and all(len(d) == 2 for d in sched.stage_devices)
    for fb_factor, FB in ((1.0, 3.0), (2.0 / 3.0, 2.0)):
        # Per stage F = input backward = W = 1, so B (full) = 2.
        res = pc.simulate(sched, pc.Costs(f=1.0, b=1.0, w=1.0, fb_factor=fb_factor,
                                          activation=1.0, activation_w=1.0))
        worst_idle = float((res.makespan - res.busy).max())
        assert worst_idle == pytest.approx((p // 2 - 1) * (FB + 2.0 - 3.0), abs=1e-9)
        assert res.peak_activation.max() == p + 1  # PP + 1
    # Two stages (replicas) per device: 2x the weights of a 1F1B device.
    flat = pc.simulate(pc.build("1f1b", p, 2 * p), pc.Costs())
    np.testing.assert_array_equal(res.static_memory, 2 * flat.static_memory)


@pytest.mark.parametrize("p,m,match", [(3, 8, "even devices"), (4, 9, "even devices"),
                                       (4, 6, r"microbatches >= 2 \* devices = 8")])
def test_dualpipe_constraints(p, m, match):
    with pytest.raises(ValueError, match=match):
        pc.build("dualpipe", p, m)

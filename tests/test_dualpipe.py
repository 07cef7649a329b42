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

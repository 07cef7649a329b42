"""Chimera (Li and Hoefler, SC'21) against its published bubble ratio.

The paper gives a bubble ratio of (D-2)/(2N+D-2) for D stages on D workers
and N microbatches. Its assumptions, as far as we could establish them (the
paper body was not readable here; see docs/research/bidirectional.md, 1.6):
bubbles are counted in unit slots in which a forward and a backward take the
same time, N is a multiple of D, D is even, communication is free, and
units are directly concatenated. The order itself follows the authors' code
(Shigangli/Chimera, branch ChimeraBk), whose p = 4, m = 4 listing is pinned
below. Activation peaks D/2+1 on the end workers to D in the middle, weights
twice a 1F1B worker's.
"""

import numpy as np
import pytest

import pipecore as pc


def test_basic_unit_order_p4():
    # docs/research/bidirectional.md 1.4: down microbatches 0, 1; up 2, 3. The
    # all-reduces (AR) follow the authors' eager sync (1.8): the other pipeline's
    # stage before the last backwards, except on the two middle devices.
    assert pc.build("chimera", 4, 4).to_actions() == {
        0: ["0F0", "0F1", "3F2", "3BW2", "3F3", "3BW3", "3AR", "0BW0", "0BW1", "0AR"],
        1: ["1F0", "2F2", "1F1", "2F3", "2BW2", "1BW0", "2BW3", "1BW1", "2AR", "1AR"],
        2: ["1F2", "2F0", "1F3", "2F1", "2BW0", "1BW2", "2BW1", "1BW3", "2AR", "1AR"],
        3: ["0F2", "0F3", "3F0", "3BW0", "3F1", "3BW1", "3AR", "0BW2", "0BW3", "0AR"],
    }


def test_allreduce_costs_time_on_the_network():
    sched = pc.build("chimera", 4, 4)
    c = pc.Costs(f=1.0, b=1.0)
    plain = pc.simulate(sched, c).makespan
    # Each replica sends its 2-unit gradient to the other over bandwidth 1.
    net = pc.Network(bytes=0.0, bandwidth=1.0, grad_bytes=2.0)
    res = pc.simulate(sched, c, net)
    assert res.makespan > plain
    # The last all-reduce (stage 0 on devices 0 and 3) cannot start before its
    # replicas' last backwards, which end no earlier than without the network
    # (10), and its gradient takes 2 to arrive.
    assert res.makespan >= plain + 2.0
    ops = res.ops.to_pydict()
    last = [ops["finish"][k] for k in range(len(ops["kind"])) if ops["kind"][k] == "AR"]
    assert max(last) == res.makespan


@pytest.mark.parametrize("p", [2, 4, 6, 8, 16])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_bubble_ratio_matches_paper(p, k):
    m = k * p
    res = pc.simulate(pc.build("chimera", p, m), pc.Costs(f=1.0, b=1.0, w=0.0))
    assert res.bubble_ratio == pytest.approx((p - 2) / (2 * m + p - 2), abs=1e-12)
    d = np.arange(p)
    np.testing.assert_array_equal(res.peak_activation, p // 2 + 1 + np.minimum(d, p - 1 - d))
    # Two stage replicas per worker: twice the weights of a 1F1B worker.
    flat = pc.simulate(pc.build("1f1b", p, m), pc.Costs(f=1.0, b=1.0, w=0.0))
    np.testing.assert_array_equal(res.static_memory, 2 * flat.static_memory)


def test_backward_twice_forward_leaves_more_bubble():
    # With B = 2F direct concatenation loses a slot per unit boundary (the
    # reason the paper adds forward doubling): D = 8, m = 16 gives 0.273.
    res = pc.simulate(pc.build("chimera", 8, 16), pc.Costs(f=1.0, b=2.0))
    assert res.bubble_ratio > (8 - 2) / (2 * 16 + 8 - 2)
    assert res.bubble_ratio == pytest.approx(0.2727, abs=1e-4)


@pytest.mark.parametrize("p,m,match", [(3, 6, "even number of devices"), (4, 6, "multiple of devices")])
def test_bad_shapes(p, m, match):
    with pytest.raises(ValueError, match=match):
        pc.build("chimera", p, m)


# BitPipe: the authors' code (wuhouming/BitPipe, bitpipe_schedule.py at
# 6fb0e22f) emulated op for op; this listing matches the paper's p = 4 figure
# (docs/research/bidirectional.md 4.4). All-reduces (AR) are pipecore's
# rendering of the code's two sync markers.
BITPIPE_P4_M4 = {
    0: "0F0 0F1 3F2 4F2 3F3 4F3 7F0 7BW0 7F1 7BW1 4BW2 3BW2 4BW3 3BW3 0BW0 0BW1",
    1: "1F0 2F2 1F1 2F3 5F2 6F0 5F3 6F1 6BW0 5BW2 6BW1 5BW3 2BW2 1BW0 2BW3 1BW1",
    2: "1F2 2F0 1F3 2F1 5F0 6F2 5F1 6F3 6BW2 5BW0 6BW3 5BW1 2BW0 1BW2 2BW1 1BW3",
    3: "0F2 0F3 3F0 4F0 3F1 4F1 7F2 7BW2 7F3 7BW3 4BW0 3BW0 4BW1 3BW1 0BW2 0BW3",
}


def test_bitpipe_order_matches_authors_code():
    got = pc.build("bitpipe", 4, 4).to_actions()
    for d, text in BITPIPE_P4_M4.items():
        assert [a for a in got[d] if not a.endswith("AR")] == text.split()
    # Eager sync: second-leg stages before the last backward on the end
    # devices, after it on the middle ones; first-leg stages last.
    # (4.4b step 7: own2 then oth2, and own1 then oth1.)
    assert got[0][-6:] == ["0BW0", "7AR", "4AR", "0BW1", "0AR", "3AR"]
    assert got[1][-6:] == ["2BW3", "1BW1", "6AR", "5AR", "1AR", "2AR"]


@pytest.mark.parametrize("p", [2, 4, 6, 8])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_bitpipe_bubble_and_memory(p, k):
    # Equal forward and fused-backward times, zero communication: the order's
    # p - 2 idle chunk slots beside 4m busy ones (derived, see bitpipe.py).
    m = k * p
    res = pc.simulate(pc.build("bitpipe", p, m), pc.Costs(f=1.0, b=1.0, w=0.0))
    assert res.bubble_ratio == pytest.approx((p - 2) / (4 * m + p - 2), abs=1e-12)
    d = np.arange(p)
    np.testing.assert_allclose(res.peak_activation, (3 * p + 2) / 4 + np.minimum(d, p - 1 - d) / 2)
    # Four stage replicas of 2p stages: twice a 1F1B device's weights.
    flat = pc.simulate(pc.build("1f1b", p, m), pc.Costs())
    np.testing.assert_allclose(res.static_memory, 2 * flat.static_memory)


@pytest.mark.parametrize("p,m,match", [(3, 6, "even number of devices"), (4, 6, "multiple of devices")])
def test_bitpipe_bad_shapes(p, m, match):
    with pytest.raises(ValueError, match=match):
        pc.build("bitpipe", p, m)


# Hanayo: the paper's order was not available, so pipecore's is a documented
# choice (pipecore.generate.greedy on the zig-zag placement). These listings
# come from an independent implementation of that same choice written during
# the research (docs/research/bidirectional.md 3.3), so they check the
# implementation, not the paper.
HANAYO_P4_W2_M4 = {
    0: "0F0 0F1 0F2 0F3 7F0 8F0 7F1 8F1 7F2 8F2 7F3 8F3 15F0 15BW0 15F1 15BW1 15F2 15BW2 15F3 15BW3 "
       "8BW0 7BW0 8BW1 7BW1 8BW2 7BW2 8BW3 7BW3 0BW0 0BW1 0BW2 0BW3",
    3: "3F0 4F0 3F1 4F1 3F2 4F2 3F3 4F3 11F0 12F0 11F1 12F1 11F2 12F2 11F3 12F3 12BW0 11BW0 "
       "12BW1 11BW1 12BW2 11BW2 12BW3 11BW3 4BW0 3BW0 4BW1 3BW1 4BW2 3BW2 4BW3 3BW3",
}


def test_hanayo_order_and_placement():
    sched = pc.build("hanayo", devices=4, microbatches=4, waves=2)
    got = sched.to_actions()
    for d, text in HANAYO_P4_W2_M4.items():
        assert got[d] == text.split()
    # Zig-zag: device 0 holds stages 0, 7, 8, 15; no stage is replicated.
    np.testing.assert_array_equal(sched.placement, [0, 1, 2, 3, 3, 2, 1, 0] * 2)
    assert not sched.replicated and sched.chunks == 4


@pytest.mark.parametrize("p", [2, 4, 8])
@pytest.mark.parametrize("waves", [1, 2, 3])
@pytest.mark.parametrize("k", [1, 2])
def test_hanayo_bubble_is_the_interleaved_one(p, waves, k):
    # With equal forward and fused-backward times this order has the
    # interleaved bubble with v = 2W chunks: (p-1)/(2Wm + p-1).
    m = k * p
    res = pc.simulate(pc.build("hanayo", p, m, waves=waves), pc.Costs(f=1.0, b=1.0, w=0.0))
    assert res.bubble_ratio == pytest.approx((p - 1) / (2 * waves * m + p - 1), abs=1e-12)


def test_hanayo_options():
    assert pc.build("hanayo", 4, 8, chunks=4) == pc.build("hanayo", 4, 8, waves=2)
    with pytest.raises(ValueError, match=r"waves=2 has chunks=2\*waves=4 \(got chunks=2\)"):
        pc.build("hanayo", 4, 8, chunks=2, waves=2)
    with pytest.raises(ValueError, match="'chunks' must be even"):
        pc.build("hanayo", 4, 8, chunks=3)
    with pytest.raises(ValueError, match=r"'1f1b' takes no option 'waves' \(its options: none\)"):
        pc.build("1f1b", 4, 8, waves=2)


def test_chimera_forward_doubling():
    # docs/research/bidirectional.md 1.5: the authors' forward-doubling runtime
    # (main_with_runtime_forward_doubling.py), p = 4, m = 8.
    got = pc.build("chimera", 4, 8, variant="forward-doubling").to_actions()
    assert [a for a in got[0] if not a.endswith("AR")] == (
        "0F0 0F1 0F4 0F5 3F2 3F3 3BW2 3F6 3F7 3BW3 0BW0 3BW6 0BW1 3BW7 0BW4 0BW5").split()
    assert [a for a in got[1] if not a.endswith("AR")] == (
        "1F0 1F1 2F2 2F3 1F4 1F5 2F6 2F7 2BW2 1BW0 2BW3 1BW1 2BW6 1BW4 2BW7 1BW5").split()
    with pytest.raises(ValueError, match="multiple of 2 \\* devices = 8"):
        pc.build("chimera", 4, 4, variant="forward-doubling")
    with pytest.raises(ValueError, match="variant must be 'direct' or 'forward-doubling'"):
        pc.build("chimera", 4, 8, variant="halving")


@pytest.mark.parametrize("p", [4, 8])
@pytest.mark.parametrize("k", [2, 4])
def test_forward_doubling_restores_the_bubble_when_backward_is_twice_forward(p, k):
    # The paper's reason for forward doubling: with B = 2F direct concatenation
    # loses slots at unit boundaries, doubling the forwards fills them, at
    # about twice the activation memory.
    m = k * p
    c = pc.Costs(f=1.0, b=2.0)
    doubled = pc.simulate(pc.build("chimera", p, m, variant="forward-doubling"), c)
    direct = pc.simulate(pc.build("chimera", p, m), c)
    assert doubled.bubble_ratio == pytest.approx((p - 2) / (2 * m + p - 2), abs=1e-12)
    assert direct.bubble_ratio > doubled.bubble_ratio
    assert doubled.peak_activation.max() == 2 * direct.peak_activation.max()
    fm = pc.formula(pc.build("chimera", p, m, variant="forward-doubling"), c)
    assert fm["exact"] and fm["makespan"] == doubled.makespan
    np.testing.assert_array_equal(fm["peak_activation"], doubled.peak_activation)

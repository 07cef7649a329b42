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

For N > D the paper offers forward doubling against the bubbles that direct
concatenation leaves when the backward takes about twice the forward, at
twice the activation memory (third-party notes quoting the paper, 1.5); the
authors' runtime main_with_runtime_forward_doubling.py is pinned below and
is the default from N = 2D on.
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
@pytest.mark.parametrize("k", [1, 2, 3, 4])
@pytest.mark.parametrize("variant", [None, "direct", "forward-doubling"])
def test_bubble_ratio_matches_paper(p, k, variant):
    # Forward and backward in equal slots: every join of units keeps the
    # paper's ratio, whichever join.
    m = k * p
    if variant == "forward-doubling" and k == 1:
        return  # forward doubling needs two units
    sched = pc.build("chimera", p, m, **({"variant": variant} if variant else {}))
    res = pc.simulate(sched, pc.Costs(f=1.0, b=1.0, w=0.0))
    assert res.bubble_ratio == pytest.approx((p - 2) / (2 * m + p - 2), abs=1e-12)
    d = np.arange(p)
    direct = p // 2 + 1 + np.minimum(d, p - 1 - d)
    if sched.params["variant"] == "direct":
        np.testing.assert_array_equal(res.peak_activation, direct)
    else:
        # Forward doubling: twice the activation memory (1.5), at the fullest device.
        assert res.peak_activation.max() == 2 * direct.max()
    # Two stage replicas per worker: twice the weights of a 1F1B worker.
    flat = pc.simulate(pc.build("1f1b", p, m), pc.Costs(f=1.0, b=1.0, w=0.0))
    np.testing.assert_array_equal(res.static_memory, 2 * flat.static_memory)


def test_backward_twice_forward_leaves_more_bubble():
    # With B = 2F direct concatenation loses a slot per unit boundary (the
    # reason the paper adds forward doubling): D = 8, m = 16 gives 0.273.
    res = pc.simulate(pc.build("chimera", 8, 16, variant="direct"), pc.Costs(f=1.0, b=2.0))
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
    with pytest.raises(ValueError, match="at least 2 \\* devices = 8"):
        pc.build("chimera", 4, 4, variant="forward-doubling")
    with pytest.raises(ValueError, match="variant must be None, 'direct' or 'forward-doubling'"):
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
    direct = pc.simulate(pc.build("chimera", p, m, variant="direct"), c)
    assert doubled.bubble_ratio == pytest.approx((p - 2) / (2 * m + p - 2), abs=1e-12)
    assert direct.bubble_ratio > doubled.bubble_ratio
    assert doubled.peak_activation.max() == 2 * direct.peak_activation.max()
    fm = pc.formula(pc.build("chimera", p, m, variant="forward-doubling"), c)
    assert fm["exact"] and fm["makespan"] == doubled.makespan
    np.testing.assert_array_equal(fm["peak_activation"], doubled.peak_activation)


def test_default_join_is_forward_doubling_from_two_units():
    # The paper's answer to a backward about twice the forward (1.5), and the
    # join the authors' GPT-2 and BERT-48 job scripts ran: from m = 2p on,
    # build's default is forward doubling; one unit (m = p) has no join.
    for p, m in [(4, 8), (4, 12), (8, 32), (6, 24)]:
        assert pc.build("chimera", p, m).programs() == (
            pc.build("chimera", p, m, variant="forward-doubling").programs())
        assert pc.build("chimera", p, m).params["variant"] == "forward-doubling"
    assert pc.build("chimera", 8, 8).programs() == pc.build("chimera", 8, 8,
                                                            variant="direct").programs()
    # The placement knobs keep direct concatenation (their list order joins no units).
    assert pc.build("chimera", 4, 8, order="list").params.get("variant") is None
    with pytest.raises(ValueError, match="order='list' needs variant='direct'"):
        pc.build("chimera", 4, 8, order="list", variant="forward-doubling")


def test_odd_number_of_units_runs_the_first_one_alone():
    # Written by hand from the rule in build_chimera's docstring (1.4, 1.5):
    # p = 4, m = 12 is three units; the first runs as the basic unit, the
    # other two as one doubling step. Down microbatches 0, 1, 4, 5, 8, 9.
    got = pc.build("chimera", 4, 12, variant="forward-doubling").to_actions()
    assert got[0] == ("0F0 0F1 3F2 3BW2 3F3 3BW3 "  # basic unit: a = 2, b = 0
                      "0BW0 0F4 0F5 0BW1 0F8 0F9 3F6 3F7 3BW6 3F10 3F11 3BW7 "
                      "0BW4 3BW10 0BW5 3BW11 3AR 0BW8 0BW9 0AR").split()
    assert got[1] == ("1F0 2F2 1F1 2F3 2BW2 1BW0 2BW3 "  # a = 1, b = 1
                      "1BW1 1F4 1F5 2F6 2F7 1F8 1F9 2F10 2F11 2BW6 "
                      "1BW4 2BW7 1BW5 2BW10 1BW8 2BW11 1BW9 2AR 1AR").split()


def test_main_job_chimera_is_not_slower_than_1f1b():
    # pipecore compare's main job: p = 8, m = 32, f = b = w = 1 (BW = 2F).
    # Forward doubling keeps the paper's ratio (p-2)/(2m+p-2) when a doubled
    # forward fills one backward slot, so the makespan is busy / (1 - ratio)
    # = 3m (2m + p - 2) / (2m) = 105; 1F1B takes (m + p - 1) * 3 = 117.
    p, m = 8, 32
    res = pc.simulate(pc.build("chimera", p, m), pc.Costs(f=1.0, b=1.0, w=1.0))
    ratio = (p - 2) / (2 * m + p - 2)
    assert res.makespan == pytest.approx(3 * m / (1 - ratio), abs=1e-12)
    assert res.makespan == 105.0 < (m + p - 1) * 3


# Cost triples across the regions of the closed forms: T_BW = T_B + T_W below,
# equal to, between, at and beyond one and two (three) forwards.
COSTS = [(1.0, 0.25, 0.0), (2.0, 1.0, 0.5), (1.0, 1.0, 0.0), (1.0, 1.0, 0.5), (1.0, 1.0, 1.0),
         (0.5, 1.0, 0.25), (1.0, 2.0, 0.5), (1.0, 2.5, 2.5), (0.25, 2.0, 1.0)]


@pytest.mark.parametrize("name,variant", [("chimera", "direct"), ("chimera", "forward-doubling"),
                                          ("bitpipe", None)])
@pytest.mark.parametrize("p", [2, 4, 6, 8])
@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_closed_forms_hold_at_any_costs(name, variant, p, k):
    # The closed forms of formula_chimera and formula_bitpipe (derived in their
    # docstrings: one unit's bubble plus a gap per join) against the pure-Python
    # reference simulator of tests/reference.py at unequal forward and backward
    # times, where the paper's unit-slot ratio no longer applies.
    from reference import simulate_reference

    if variant == "forward-doubling" and k == 1:
        return
    m = k * p
    kw = {"variant": variant} if variant else {}
    sched = pc.build(name, p, m, **kw)
    S = sched.stages
    share = p / S  # a stage's share of one device's work
    for f, b, w in COSTS:
        c = pc.Costs(f=f, b=b, w=w)
        ref = simulate_reference(sched.programs(), [f * share] * S, [b * share] * S,
                                 [w * share] * S, [share] * S, [0.0] * S,
                                 lambda src, dst, s: (0.0, 0.0))
        fm = pc.formula(sched, c)
        assert fm["exact"]
        assert fm["makespan"] == pytest.approx(ref["makespan"], rel=1e-12), (f, b, w)
        np.testing.assert_allclose(fm["peak_activation"], ref["peak"], rtol=1e-12)


def test_direct_concatenation_gap_per_join():
    # Direct concatenation at T_BW = 2 T_F: each of the K - 1 joins adds
    # (p - 2)(T_BW - T_F) for Chimera and half that for BitPipe (whose chunks
    # are half a stage), so the makespans grow by the busy time plus that gap
    # per unit: counted from the simulation, not from the formula.
    c = pc.Costs(f=1.0, b=2.0, w=0.0)
    for p in (4, 8):
        ms = [pc.simulate(pc.build("chimera", p, k * p, variant="direct"), c).makespan
              for k in (1, 2, 3)]
        assert ms[2] - ms[1] == ms[1] - ms[0] == p * 3 + (p - 2) * (2 - 1)
        ms = [pc.simulate(pc.build("bitpipe", p, k * p), c).makespan for k in (1, 2, 3)]
        assert ms[2] - ms[1] == ms[1] - ms[0] == p * 3 + (p - 2) * (2 - 1) / 2


@pytest.mark.parametrize("p", [2, 3, 4, 6, 8])
@pytest.mark.parametrize("waves", [1, 2, 3])
def test_hanayo_one_unit_at_any_costs(p, waves):
    # m = p: one unit; the bubble is (p-1) max(T_F, T_BW) / W at any costs
    # (at T_F = T_BW the interleaved one, checked above), reference simulator.
    from reference import simulate_reference

    sched = pc.build("hanayo", p, p, waves=waves)
    S = sched.stages
    for f, b, w in COSTS:
        fm = pc.formula(sched, pc.Costs(f=f, b=b, w=w))
        ref = simulate_reference(sched.programs(), [f * p / S] * S, [b * p / S] * S,
                                 [w * p / S] * S, [1.0] * S, [0.0] * S,
                                 lambda src, dst, s: (0.0, 0.0))
        assert fm["exact"] and "gap_cause" not in fm
        assert fm["makespan"] == pytest.approx(ref["makespan"], rel=1e-12)
        assert fm["makespan"] == pytest.approx(p * (f + b + w) + (p - 1) * max(f, b + w) / waves)


def test_hanayo_names_the_gaps_between_units():
    # More units at BW = 2F: the greedy order (fixed at equal times) makes
    # every device wait for each unit's first backward; the formula counts
    # one unit and says what it leaves out. The last device idles before the
    # first backward of every unit but the first (microbatches 8, 16, 24).
    p, m = 8, 32
    sched = pc.build("hanayo", p, m)
    c = pc.Costs(f=1.0, b=1.0, w=1.0)
    fm = pc.formula(sched, c)
    assert not fm["exact"] and fm["gap_cause"] == "idle gaps between units of p microbatches"
    res = pc.simulate(sched, c)
    assert res.makespan > fm["makespan"]
    ops = res.ops.to_pydict()
    last = [i for i in range(len(ops["device"])) if ops["device"][i] == p - 1]
    last.sort(key=lambda i: res.start[i])
    waits = {ops["microbatch"][j] for i, j in zip(last, last[1:])
             if res.start[j] - res.finish[i] > 1.0 and ops["kind"][j] == "BW"}
    assert {8, 16, 24} <= waits
    # A short last unit is named too.
    assert pc.formula(pc.build("hanayo", 8, 30), c)["gap_cause"] == (
        "gaps between units; a last unit of only 6 microbatches")

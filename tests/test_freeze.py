"""Parameter freezing (pipecore.freeze, build(..., frozen=...), what_if(freeze=...)).

Golden values: hand-worked critical paths (comments), 1F1B's (m + p - 1)(F + B + W)
(PipeDream-Flush) and the ZB paper's ZB-H1 bubble (p - 1)(T_F + T_B - T_W) (Qi et al.,
ICLR 2024, section 3.1) over the devices that still train.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipecore as pc
from pipecore.analysis.compare import three_views
from pipecore.schedules.freeze import formula_frozen_1f1b, formula_frozen_zb_h1, frozen_stages


def _kinds(sched):
    rows = sched.table.to_pylist()
    return {(r["stage"], r["kind"]) for r in rows}


def test_hand_worked_1f1b_top_two_stages_frozen():
    # p=4, m=8, f=b=w=1, fused backward BW = b + w = 2. Unfrozen 1F1B: (m + p - 1)(f + b + w)
    # = 11 * 3 = 33. Freeze stages 2 and 3: their BW becomes a B of time 1.
    # By hand, the critical path runs through device 1: F0 climbs stages 0..3 (4), B0 comes
    # down stages 3 and 2 (1 + 1), device 1 starts BW0 at 6 and then never waits: 8 BW (16)
    # and its 5 forwards after the 3 of its warm-up (5), ending at 27; BW7 on device 0 (2)
    # ends the run at 29. Saved: 33 - 29 = 4 time units (faster).
    c = pc.Costs(f=1, b=1, w=1, activation=1.0, activation_w=0.25)
    base = pc.build("1f1b", 4, 8)
    frozen = pc.freeze(base, [2, 3])
    assert pc.simulate(base, c).makespan == 33.0
    res = pc.simulate(frozen, c)
    assert res.makespan == 29.0
    # 1F1B's device d holds min(p - d, m) microbatches: 4, 3, 2, 1. A frozen stage keeps
    # activation - activation_w = 0.75 of each (no W will need the rest).
    np.testing.assert_allclose(res.peak_activation, [4.0, 3.0, 1.5, 0.75])
    assert ("2", "BW") not in _kinds(frozen)
    assert {k for s, k in _kinds(frozen) if s in (2, 3)} == {"F", "B"}
    assert frozen.frozen == (2, 3) and frozen.params["frozen"] == [2, 3]
    # The formula's path through device 1 gives the same 29 (a lower bound there).
    assert formula_frozen_1f1b(4, 8, c, [2, 3])["makespan"] == 29.0


def test_hand_worked_front_frozen_1f1b_and_zb_h1():
    # Freeze stages 0 and 1 (fraction 0.5 of p=4): devices 0 and 1 only run forwards, so
    # the rest is a 2-device pipeline whose first forward arrives at lo * f = 2.
    c = pc.Costs(f=1, b=2, w=1)
    # 1F1B over p'=2: (m + p' - 1)(f + b + w) = 9 * 4 = 36, plus 2: 38 (unfrozen 11 * 4 = 44).
    s = pc.build("1f1b", 4, 8, frozen=[0, 1])
    assert pc.simulate(s, c).makespan == 38.0
    assert pc.simulate(pc.build("1f1b", 4, 8), c).makespan == 44.0
    # ZB-H1 over p'=2: m(f+b+w) + (p'-1)(f+b-w) = 32 + 2 = 34, plus 2: 36 (unfrozen 32 + 3*2).
    z = pc.freeze(pc.build("zb-h1", 4, 8), fraction=0.5)
    assert z.frozen == (0, 1)
    res = pc.simulate(z, c)
    assert res.makespan == 36.0
    assert pc.simulate(pc.build("zb-h1", 4, 8), c).makespan == 38.0
    # Front stages keep no activation at all.
    assert res.peak_activation[0] == 0.0 and res.peak_activation[1] == 0.0
    assert {k for st_, k in _kinds(z) if st_ in (0, 1)} == {"F"}


def test_memory_returns_to_zero_and_front_devices_hold_nothing():
    c = pc.Costs(f=1, b=2, w=1, activation=1.0, activation_w=0.4)
    for name in ("1f1b", "zb-h1", "gpipe", "interleaved-1f1b"):
        sched = pc.build(name, 4, 8)
        s = pc.freeze(sched, [0, sched.stages - 1])
        res = pc.simulate(s, c)
        mem = res.memory.to_pylist()
        last = {}
        for r in mem:
            last[r["device"]] = r["activation"]
        assert all(abs(v) < 1e-12 for v in last.values()), (name, last)
        assert min(r["activation"] for r in mem) >= -1e-12


@settings(max_examples=40, deadline=None)
@given(p=st.integers(2, 6), m=st.integers(1, 12), lo=st.integers(0, 5),
       t=st.tuples(*[st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0])] * 3))
def test_front_frozen_1f1b_formula_equals_simulation(p, m, lo, t):
    lo = min(lo, p - 1)
    f, b, w = t
    c = pc.Costs(f=f, b=b, w=w, activation=1.0, activation_w=0.3)
    res = pc.simulate(pc.build("1f1b", p, m, frozen=list(range(lo))), c)
    fm = formula_frozen_1f1b(p, m, c, list(range(lo)))
    assert fm["exact"]
    assert res.makespan == pytest.approx(fm["makespan"])
    np.testing.assert_allclose(res.peak_activation, fm["peak_activation"])


@settings(max_examples=40, deadline=None)
@given(data=st.data(), p=st.integers(2, 6))
def test_frozen_1f1b_formula_is_a_lower_bound(data, p):
    m = data.draw(st.integers(1, 12))
    frozen = data.draw(st.sets(st.integers(0, p - 1), max_size=p - 1))
    f, b, w = (data.draw(st.sampled_from([0.5, 1.0, 2.0, 3.0])) for _ in range(3))
    c = pc.Costs(f=f, b=b, w=w)
    res = pc.simulate(pc.build("1f1b", p, m, frozen=frozen), c)
    assert res.makespan >= formula_frozen_1f1b(p, m, c, frozen)["makespan"] - 1e-9


@settings(max_examples=40, deadline=None)
@given(data=st.data(), p=st.integers(2, 6))
def test_frozen_zb_h1_formula_equals_simulation(data, p):
    m = data.draw(st.integers(p, 14))
    frozen = data.draw(st.sets(st.integers(0, p - 1), max_size=p - 1))
    w = data.draw(st.sampled_from([0.5, 1.0, 1.5]))
    f = data.draw(st.sampled_from([x for x in (0.5, 1.0, 1.5, 2.0) if x >= w]))
    b = data.draw(st.sampled_from([x for x in (1.0, 1.5, 2.0, 3.0) if x >= f]))
    c = pc.Costs(f=f, b=b, w=w, activation=1.0, activation_w=0.3)
    fm = formula_frozen_zb_h1(p, m, c, frozen)
    assert fm["exact"]
    res = pc.simulate(pc.build("zb-h1", p, m, frozen=frozen), c)
    assert res.makespan == pytest.approx(fm["makespan"])
    np.testing.assert_allclose(res.peak_activation, fm["peak_activation"])


@pytest.mark.parametrize("name,frozen", [("1f1b", [0, 1]), ("1f1b", [2, 3]), ("zb-h1", [0, 1]),
                                         ("zb-h1", [3])])
def test_three_views_agree(name, frozen):
    c = pc.Costs(f=1, b=2, w=1, activation_w=0.25)
    s = pc.build(name, 4, 8, frozen=frozen)
    row = three_views(s, pc.simulate(s, c), c, None, chunks=1)
    assert row["flags"] == []
    assert row["table_slots"] == row["formula_slots"]


def test_fused_backward_becomes_b_and_split_loses_w():
    z = pc.freeze(pc.build("zb-h1", 3, 6), [1, 2])
    kinds = _kinds(z)
    assert {k for s, k in kinds if s == 0} == {"F", "B", "W"}
    assert {k for s, k in kinds if s in (1, 2)} == {"F", "B"}
    g = pc.freeze(pc.build("gpipe", 3, 6), [0])
    assert {k for s, k in _kinds(g) if s == 0} == {"F"}
    assert {k for s, k in _kinds(g) if s == 1} == {"F", "BW"}
    # Programs stay compact: slots 0..n-1 on every device.
    for prog in g.programs():
        assert len(prog) > 0
    slots = g.table.to_pydict()
    for d in range(3):
        mine = sorted(s for s, dd in zip(slots["slot"], slots["device"]) if dd == d)
        assert mine == list(range(len(mine)))


def test_bad_frozen_choices_name_the_value_and_rule():
    s = pc.build("1f1b", 4, 8)
    with pytest.raises(ValueError, match=r"'frozen' entries must be stage ints in 0..3 \(got 4\)"):
        pc.freeze(s, [4])
    with pytest.raises(ValueError, match="every stage"):
        pc.freeze(s, [0, 1, 2, 3])
    with pytest.raises(ValueError, match=r"'fraction' must be in \[0, 1\).*1\.0"):
        pc.freeze(s, fraction=1.0)
    with pytest.raises(ValueError, match="one of 'frozen'"):
        pc.freeze(s)
    with pytest.raises(ValueError, match="'frozen' entries must be stage ints in 0..3"):
        pc.build("1f1b", 4, 8, frozen=[-1])
    assert frozen_stages(8, fraction=0.3) == (0, 1)  # floor(2.4): whole stages only
    assert frozen_stages(4, fraction=0.2) == ()


def test_schedule_rules_for_frozen_stages():
    # A frozen stage keeps its W: rule "frozen", naming the stage.
    progs = {0: ["0F0", "0B0", "0W0"], 1: ["1F0", "1B0", "1W0"]}
    with pytest.raises(pc.ScheduleError, match="frozen: .*stage 1 is frozen and takes no weight "
                                               "gradient, so it has no W") as e:
        pc.from_actions(progs, frozen=[1])
    assert e.value.rule == "frozen" and e.value.stage == 1
    # Below the lowest trainable stage no backward.
    with pytest.raises(pc.ScheduleError, match="stage 0 is frozen and lies below the lowest "
                                               "trainable stage 1"):
        pc.from_actions({0: ["0F0", "0B0"], 1: ["1F0", "1B0", "1W0"]}, frozen=[0])
    # A frozen stage above it still owes its B.
    with pytest.raises(pc.ScheduleError, match="missing-op: .*stage 1 microbatch 0 has no B"):
        pc.from_actions({0: ["0F0", "0B0", "0W0"], 1: ["1F0"]}, frozen=[1])
    with pytest.raises(pc.ScheduleError, match="stage 5 is frozen but the schedule has 2 stages"):
        pc.from_actions(progs, frozen=[5])
    with pytest.raises(pc.ScheduleError, match="every stage"):
        pc.from_actions({0: ["0F0"], 1: ["1F0"]}, frozen=[0, 1])
    ok = pc.from_actions({0: ["0F0"], 1: ["1F0", "1B0", "1W0"]}, frozen=[0])
    assert pc.simulate(ok, pc.Costs(f=1, b=1, w=1)).makespan == 4.0


def test_what_if_freeze_reports_the_gain():
    c = pc.Costs(f=1, b=1, w=1)
    res = pc.simulate(pc.build("1f1b", 4, 8), c)
    wi = pc.what_if(res, freeze=0.5)  # stages 0 and 1
    # 1F1B over the 2 trainable devices, shifted by 2: (8 + 1) * 3 + 2 = 29; saved 33 - 29.
    assert wi.counterfactual == 29.0 and wi.saved == 4.0
    assert "frozen stages [0, 1]" in wi.report() and "12.1% less" in wi.report()
    assert pc.what_if(res, freeze=[2, 3]).counterfactual == 29.0
    slow = pc.simulate(pc.build("1f1b", 4, 8), c, stragglers={0: 2.0})
    with pytest.raises(ValueError, match="without stragglers or jitter"):
        pc.what_if(slow, freeze=0.5)


def test_adapt_never_loses_and_keeps_memory():
    c = pc.Costs(f=1, b=2, w=1)
    for name, frozen in (("zb-h1", [0, 2]), ("1f1b", [1, 3]), ("interleaved-1f1b", [1, 5])):
        base = pc.build(name, 4, 8)
        plain = pc.simulate(pc.freeze(base, frozen), c)
        adapted = pc.simulate(pc.freeze(base, frozen, adapt=True, costs=c), c)
        assert adapted.makespan <= plain.makespan
        assert (adapted.peak_activation <= plain.peak_activation + 1e-9).all()


def test_batched_kernels_refuse_frozen_schedules():
    s = pc.build("1f1b", 4, 8, frozen=[0])
    with pytest.raises(ValueError, match="frozen stages \\[0\\].*use pipecore.simulate"):
        pc.simulate_many(s, {"f": [1.0]})


@pytest.mark.parametrize("name,frozen", [("1f1b", [0, 1]), ("zb-h1", [1, 3]), ("gpipe", [2]),
                                         ("interleaved-1f1b", [0, 5]), ("zb-h1", [0, 2, 3])])
def test_fast_structure_equals_numpy_rules(name, frozen):
    from pipecore.core.rules import structure

    s = pc.build(name, 4, 8, frozen=frozen)
    fast, slow = structure(s, fast=True), structure(s, fast=False)
    for field in ("placement", "dev_ptr", "op_kind", "op_stage", "dep", "xfer", "out_ptr",
                  "x_src", "x_dst", "x_dst_dev", "x_link"):
        np.testing.assert_array_equal(getattr(fast, field), getattr(slow, field), err_msg=field)
    assert fast.n_links == slow.n_links
    # A broken frozen schedule is refused by the kernel too; the numpy rules name it.
    progs = {0: ["0F0", "0B0", "0W0"], 1: ["1F0", "1B0", "1W0"]}
    with pytest.raises(pc.ScheduleError, match="stage 1 is frozen"):
        structure(pc.Schedule(pc.from_actions(progs).table, frozen=[1], validate=False),
                  fast=True)


def test_freeze_keeps_per_op_work_factors():
    # A Seq1F1B schedule with causal-attention chunk costs: freezing must not drop them
    # (freeze-then-weigh and weigh-then-freeze give the same simulation).
    from pipecore.schedules import seq1f1b

    plain = pc.build("seq1f1b", 4, 8, seq_chunks=2)
    weighed_then_frozen = pc.freeze(seq1f1b.with_chunk_costs(plain, 0.5, 0.5), frozen=[0])
    frozen_then_weighed = seq1f1b.with_chunk_costs(pc.freeze(plain, frozen=[0]), 0.5, 0.5)
    assert weighed_then_frozen.factors is not None
    assert (pc.simulate(weighed_then_frozen).makespan
            == pc.simulate(frozen_then_weighed).makespan)
    assert pc.simulate(weighed_then_frozen).makespan != pc.simulate(pc.freeze(plain, frozen=[0])).makespan
    with pytest.raises(pc.InputError, match="adapt=True"):
        pc.freeze(seq1f1b.with_chunk_costs(plain, 0.5, 0.5), frozen=[0], adapt=True, costs=pc.Costs())


def test_freeze_keeps_where_bpipe_offloads():
    # BPipe's partner copies stay on the partner: with w = 0 and activation_w = 0 a frozen last
    # stage (BW -> B of the same time, same memory) changes nothing in the simulation.
    plain = pc.build("bpipe", 8, 16)
    frozen = pc.freeze(plain, frozen=[7])
    assert frozen.offload_to == plain.offload_to
    costs = pc.Costs(evict=0.5)
    a, b = pc.simulate(plain, costs), pc.simulate(frozen, costs)
    assert a.makespan == b.makespan
    np.testing.assert_array_equal(a.peak_activation, b.peak_activation)


def test_recompute_and_offload_keep_the_frozen_stages():
    # A frozen stage has no W: a transform that forgot it would break the F, B, W rule.
    frozen = pc.freeze(pc.build("zb-h1", 4, 8), frozen=[3])
    recomputed = pc.recompute(frozen, stages=[2])
    offloaded = pc.offload(frozen, stages=[2])
    assert recomputed.frozen == offloaded.frozen == (3,)
    # Recomputing stage 2 reruns its forwards (f = 1 each) on the critical path: slower, not wrong.
    assert pc.simulate(recomputed).makespan > pc.simulate(frozen).makespan
    assert pc.simulate(offloaded, pc.Costs(offload=0.5)).makespan == pc.simulate(frozen).makespan

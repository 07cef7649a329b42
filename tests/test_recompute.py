"""Activation recompute: R ops, pc.recompute, and their time and memory.

Golden values are closed forms derived here from the semantics (an R needs
only its own F, a recomputed F keeps ``checkpoint``, its R allocates the
rest), not from the code under test. Kernel-versus-oracle equality for R
ops is covered by tests/test_kernel.py (random schedules draw R ops, and
tests/reference.py implements them independently).
"""

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import pipecore as pc
from pipecore.testing import family_schedules, networks
from pipecore.testing import schedules as random_schedules

# Run once more with Numba's bounds checking on in CI (.ci/run selects by this mark).
pytestmark = pytest.mark.kernels


@pytest.mark.parametrize("p,m", [(2, 2), (4, 8), (8, 16), (5, 3)])
@pytest.mark.parametrize("f,r,bw", [(1.0, 1.0, 2.0), (1.0, 0.5, 3.0), (2.0, 0.0, 1.0)])
def test_gpipe_full_recompute_makespan(p, m, f, r, bw):
    # GPipe, every stage recomputed, no communication. The last device
    # runs R_j BW_j back to back from T0 = (m + p - 1) f. Device d runs R_0
    # while it waits, then R_{j+1} right after BW_j; by induction BW_j on
    # device d finishes at T0 + (j + 1)(r + bw) + (p - 1 - d) bw, so the
    # makespan is (m + p - 1) f + m (r + bw) + (p - 1) bw: exactly m r
    # more than GPipe's (m + p - 1)(f + bw).
    sched = pc.recompute(pc.build("gpipe", p, m))
    res = pc.simulate(sched, pc.Costs(f=f, b=bw, w=0.0, r=r))
    assert res.makespan == pytest.approx((m + p - 1) * f + m * (r + bw) + (p - 1) * bw)


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (8, 16)])
@pytest.mark.parametrize("ckpt", [0.0, 0.25, 1.0])
def test_1f1b_full_recompute_peak(p, m, ckpt):
    # 1F1B keeps p - d microbatches in flight on device d. Recomputed, they
    # hold ckpt each, and the R of the oldest brings one back to the full
    # activation: peak act + (p - d - 1) ckpt (act = 1).
    res = pc.simulate(pc.recompute(pc.build("1f1b", p, m)), pc.Costs(checkpoint=ckpt))
    want = [1.0 + (p - d - 1) * ckpt for d in range(p)]
    np.testing.assert_allclose(res.peak_activation, want)
    plain = pc.simulate(pc.build("1f1b", p, m), pc.Costs())
    np.testing.assert_allclose(plain.peak_activation, [p - d for d in range(p)])


@pytest.mark.parametrize("m", [1, 4, 9])
def test_gpipe_recompute_peak(m):
    # GPipe holds all m microbatches before the first backward: m x ckpt,
    # plus act - ckpt for the one being recomputed.
    res = pc.simulate(pc.recompute(pc.build("gpipe", 3, m)), pc.Costs(checkpoint=0.1))
    np.testing.assert_allclose(res.peak_activation, [m * 0.1 + 0.9] * 3)


def test_per_stage_choice_only_touches_that_device():
    base = pc.build("1f1b", 4, 8)
    sched = pc.recompute(base, stages=[0])
    acts = sched.to_actions()
    assert sum(a.count("R") for a in acts[0]) == 8
    assert all("R" not in a for d in (1, 2, 3) for a in acts[d])
    assert acts[0][acts[0].index("0R0") + 1] == "0BW0"  # right before its backward
    res = pc.simulate(sched, pc.Costs())
    np.testing.assert_allclose(res.peak_activation, [1.0, 3.0, 2.0, 1.0])


def test_microbatch_choice_and_split_backward():
    sched = pc.recompute(pc.build("zb-h1", 4, 8), stages=[1, 2], microbatches=range(0, 8, 2))
    acts = sched.to_actions()
    assert [a for a in acts[1] if "R" in a] == ["1R0", "1R2", "1R4", "1R6"]
    assert acts[1][acts[1].index("1R2") + 1] == "1B2"
    assert sched.name == "zb-h1+r"


def test_r_cost_and_busy_time():
    sched = pc.recompute(pc.build("1f1b", 2, 4))
    res = pc.simulate(sched, pc.Costs(f=1.0, b=2.0, r=0.5))
    # Each device runs 4 F (1), 4 R (0.5), 4 BW (2).
    np.testing.assert_allclose(res.busy, [4 * 3.5, 4 * 3.5])
    kinds = np.asarray(res.ops.column("kind").to_pylist())
    dur = res.finish - res.start
    assert set(dur[kinds == "R"]) == {0.5}


def test_ideal_table_counts_r_slots():
    sched = pc.recompute(pc.build("gpipe", 3, 4))
    # Unit slots, R = f = 1: (m + p - 1) f + m (r + bw) + (p - 1) bw with bw = 2.
    assert pc.ideal_table(sched).length == 6 + 4 * 3 + 2 * 2
    assert pc.ideal_table(sched, r=0).length == 6 + 4 * 2 + 2 * 2


@pytest.mark.parametrize("change,rule", [
    # R on another device than its F.
    (lambda progs: (progs[0].remove(("R", 0, 1)), progs[1].insert(0, ("R", 0, 1))), "placement"),
    # R after its backward.
    (lambda progs: (progs[0].remove(("R", 0, 1)), progs[0].append(("R", 0, 1))), "order"),
    # Two R for one (stage, microbatch).
    (lambda progs: progs[0].insert(progs[0].index(("R", 0, 1)), ("R", 0, 1)), "duplicate-op"),
    # R before its own F.
    (lambda progs: (progs[0].remove(("R", 0, 1)), progs[0].insert(0, ("R", 0, 1))), "order"),
])
def test_bad_r_ops_are_named(change, rule):
    progs = pc.recompute(pc.build("1f1b", 2, 4)).programs()
    change(progs)
    with pytest.raises(pc.ScheduleError) as info:
        pc.Schedule.from_programs(progs, devices=2)
    assert info.value.rule == rule
    assert "0R1" in str(info.value).splitlines()[0]  # the first line names the R


def test_r_without_backward_is_missing_op():
    progs = [[("F", 0, 0), ("R", 0, 0)]]
    with pytest.raises(pc.ScheduleError, match="missing-op"):
        pc.Schedule.from_programs(progs)


def test_recompute_argument_errors():
    base = pc.build("1f1b", 2, 4)
    with pytest.raises(ValueError, match=r"'stages' entries must be ints in 0..1 \(got 2\)"):
        pc.recompute(base, stages=[2])
    with pytest.raises(ValueError, match="'microbatches' entries"):
        pc.recompute(base, microbatches=[-1])
    with pytest.raises(ValueError, match="already recomputed"):
        pc.recompute(pc.recompute(base, stages=[0]), stages=[0])
    with pytest.raises(ValueError, match="must be a pipecore.Schedule"):
        pc.recompute("1f1b")


def test_costs_checkpoint_bounds():
    with pytest.raises(ValueError, match="'checkpoint' must be <= 'activation'"):
        pc.Costs(activation=1.0, checkpoint=2.0)
    sched = pc.recompute(pc.build("1f1b", 2, 2))
    with pytest.raises(ValueError, match=r"'checkpoint' must be <= 'activation' at every stage"):
        pc.simulate(sched, pc.Costs(activation=[1.0, 0.5], checkpoint=0.75))
    with pytest.raises(ValueError, match="'r' must be >= 0"):
        pc.Costs(r=-1.0)


def test_action_parse_r():
    assert str(pc.Action.parse("3R7")) == "3R7"
    assert pc.Action.parse("3R7").kind == "R"


@settings(max_examples=40, deadline=None)
# Not bpipe: the batched kernels refuse offloading schedules (tests/test_batch.py says why).
@given(sched=family_schedules(max_devices=6, max_microbatches=12, recompute=True,
                              names=sorted(set(pc.schedules()) - {"bpipe"})), data=st.data())
def test_batch_matches_simulate_with_recompute(sched, data):
    # The batched kernels generate R times and checkpoint memory per row;
    # every row must equal simulate() exactly, by replay and by list.
    n = data.draw(st.integers(1, 5))
    vals = st.sampled_from([0.0, 0.5, 1.0, 2.0]) | st.floats(0.01, 3.0)
    table = {k: np.array([data.draw(vals) for _ in range(n)]) for k in ("f", "b", "w", "comm", "r")}
    table["activation"] = np.ones(n)
    table["activation_w"] = np.array([data.draw(st.floats(0.0, 1.0)) for _ in range(n)])
    table["checkpoint"] = np.array([data.draw(st.floats(0.0, 1.0)) for _ in range(n)])
    net = data.draw(networks(devices=sched.devices))
    replay = pc.simulate_many(sched, table, net).to_pylist()
    listed = pc.simulate_many(sched, table, net, method="list").to_pylist()
    for k in range(n):
        c = pc.Costs(**{name: float(table[name][k]) for name in table})
        res = pc.simulate(sched, c, net)
        for row in (replay[k], listed[k]):
            assert row["makespan"] == res.makespan
            assert row["peak_activation_max"] == res.peak_activation.max()
            assert row["memory_max"] == (res.peak_activation + res.static_memory).max()


def test_batch_r_defaults_to_f():
    sched = pc.recompute(pc.build("gpipe", 2, 2))
    out = pc.simulate_many(sched, {"f": [1.0, 2.0], "b": [1.0, 1.0]})
    assert out.column("r").to_pylist() == [1.0, 2.0]
    assert out.column("checkpoint").to_pylist() == [0.0, 0.0]
    # (m + p - 1) f + m (r + bw) + (p - 1) bw, r = f.
    assert out.column("makespan").to_pylist() == [3 + 4 + 1, 6 + 6 + 1]


def _memory(res):
    return float((res.peak_activation + res.static_memory).max())


@pytest.mark.parametrize("limit", [3.0, 2.0, 1.5])
def test_tune_recomputes_where_plain_schedules_do_not_fit(limit):
    costs = pc.Costs(f=1.0, b=1.0, w=1.0, activation_w=0.5, weights=0.0, checkpoint=0.05)
    plain = pc.tune(8, 32, costs, limit, recompute=False)
    best = pc.tune(8, 32, costs, limit)
    pc.validate(best.schedule)
    res = pc.simulate(best.schedule, costs)  # re-simulated here, not taken from tune
    assert res.makespan == best.result.makespan
    assert _memory(res) <= limit * (1 + 1e-9)
    assert "+recompute" in best.label and (best.schedule.kind_codes == 5).any()
    # Below every plain family's need, recompute is much faster than the
    # best plain schedule that fits (measured 117-124 against 147-295).
    assert best.result.makespan < 0.9 * plain.result.makespan


def test_tune_without_recompute_never_returns_r_ops():
    costs = pc.Costs(f=1.0, b=1.0, w=1.0, activation_w=0.5, weights=0.0)
    best = pc.tune(4, 8, costs, 2.0, recompute=False)
    assert not (best.schedule.kind_codes == 5).any()


def test_tune_error_reports_the_limit_recompute_reaches():
    costs = pc.Costs(f=1.0, b=1.0, w=1.0, activation_w=0.5, weights=0.0, checkpoint=0.05)
    with pytest.raises(pc.TuneError) as info:
        pc.tune(4, 8, costs, 0.3)
    again = pc.tune(4, 8, costs, info.value.smallest_limit)
    assert _memory(again.result) <= info.value.smallest_limit * (1 + 1e-9)
    with pytest.raises(pc.TuneError) as plain:
        pc.tune(4, 8, costs, 0.3, recompute=False)
    assert info.value.smallest_limit < plain.value.smallest_limit


@settings(max_examples=40, deadline=None)
@given(sched=family_schedules(max_devices=6, max_microbatches=10), data=st.data())
def test_device_peaks_without_building_equal_the_kernel(sched, data):
    # tune's binary search predicts each device's peak for a set of
    # recomputed stages from the plain schedule; it must equal simulate()'s.
    from pipecore.core.ops import KIND_CODE
    from pipecore.search.tune import _device_peaks

    # Not with offload (bpipe): recompute refuses an offloaded op, and the predictor counts
    # each device's own memory only, not activations held for a partner.
    assume(not np.isin(sched.kind_codes, [KIND_CODE["O"], KIND_CODE["L"]]).any())
    chosen = data.draw(st.lists(st.integers(0, sched.stages - 1), min_size=1, unique=True))
    costs = pc.Costs(activation=data.draw(st.floats(0.5, 2.0)), activation_w=0.2,
                     checkpoint=data.draw(st.floats(0.0, 0.5)))
    arrays = costs.stage_arrays(sched.stages, sched.devices)
    res = pc.simulate(pc.recompute(sched, stages=chosen), costs)
    np.testing.assert_allclose(_device_peaks(sched, arrays, chosen), res.peak_activation,
                               rtol=1e-12, atol=1e-12)


def _outcome(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except (ValueError, pc.ScheduleError) as exc:
        # pipecore raises InputError, the reference a plain ValueError: the same refusal.
        return (pc.ScheduleError if isinstance(exc, pc.ScheduleError) else ValueError), str(exc)


def _check_against_reference(sched, data):
    from naive import recompute_reference

    stages = data.draw(st.none() | st.sets(st.integers(0, sched.stages - 1), min_size=1))
    mbs = data.draw(st.none() | st.sets(st.integers(0, sched.microbatches - 1), min_size=1))
    name = data.draw(st.sampled_from([None, "named"]))
    got = _outcome(pc.recompute, sched, stages=stages, microbatches=mbs, name=name)
    want = _outcome(recompute_reference, sched, stages=stages, microbatches=mbs, name=name)
    if isinstance(want, tuple):
        assert got == want
        return
    assert isinstance(got, pc.Schedule)
    assert got.table.equals(want.table)  # same rows, same order, same metadata
    assert got == want and got.name == want.name and got.params == want.params
    assert got.devices == want.devices and got.replicated == want.replicated


@settings(max_examples=150, deadline=None)
@given(sched=family_schedules(max_devices=5, max_microbatches=10, recompute=True),
       data=st.data())
def test_recompute_equals_the_per_op_reference_on_families(sched, data):
    # Some draws are recomputed already: then the chosen overlap must raise
    # the reference's error for the same first (stage, microbatch).
    _check_against_reference(sched, data)


@settings(max_examples=150, deadline=None)
@given(sched=random_schedules(max_devices=4, max_stages=6, max_microbatches=5),
       data=st.data())
def test_recompute_equals_the_per_op_reference_on_random_schedules(sched, data):
    # Arbitrary placements and orders, F&B pairs, replicas with all-reduces,
    # R, O and L ops already present.
    _check_against_reference(sched, data)


@settings(max_examples=60, deadline=None)
@given(sched=family_schedules(max_devices=6, max_microbatches=10), data=st.data())
def test_device_peaks_one_device_at_a_time_are_bit_identical(sched, data):
    # tune's binary search asks one device at a time; each answer must be
    # the very float the whole-table computation gives (same summation).
    from naive import device_peaks_reference

    from pipecore.search.tune import _RecomputePeaks

    per_stage = st.lists(st.floats(0.0, 2.0), min_size=sched.stages, max_size=sched.stages)
    act = np.array(data.draw(per_stage)) + 0.1
    w_share = np.array(data.draw(per_stage)) / 2.0
    c_share = np.array(data.draw(per_stage)) / 2.0
    costs = pc.Costs(activation=act, activation_w=act * w_share, checkpoint=act * c_share)
    arrays = costs.stage_arrays(sched.stages, sched.devices)
    peaks = _RecomputePeaks(sched, arrays)
    for _ in range(3):  # the per-device parts are cached between questions
        chosen = data.draw(st.lists(st.integers(0, sched.stages - 1), unique=True))
        want = device_peaks_reference(sched, arrays, chosen)
        got = [peaks.device(d, chosen) for d in range(sched.devices)]
        assert np.array(got).tobytes() == want.tobytes()

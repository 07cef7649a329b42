"""Activation offload: O and L ops, host-link copies, memory that follows time.

Golden values are worked out by hand from the semantics in
docs/semantics.md (each device's host link serves copies to host in issue
order and copies back in issue order; a copy back waits for its copy to
host; memory moves at copy times), not taken from the code under test.
tests/test_kernel.py compares the kernel with the independent oracle in
tests/reference.py on random schedules with O and L ops.
"""

import numpy as np
import pytest

import pipecore as pc

# Run once more with Numba's bounds checking on in CI (.ci/run selects by this mark).
pytestmark = pytest.mark.kernels

M = 5  # microbatches of the one-device GPipe below


def one_device(prefetch):
    return pc.offload(pc.build("gpipe", 1, M), prefetch=prefetch)


@pytest.mark.parametrize("t", [0.25, 0.5, 1.0])
def test_no_prefetch_exposes_every_copy_back(t):
    # F_j at [j, j+1] (f = 1); copies to host end by (j + 1) + t <= j + 2
    # (t <= f), so the copy back of j starts at its L, which comes right
    # after BW_{j-1}: each backward waits t. Makespan m f + m (t + b).
    res = pc.simulate(one_device(0), pc.Costs(f=1.0, b=2.0, offload=t))
    assert res.makespan == pytest.approx(M * 1.0 + M * (t + 2.0))
    # Two activations at once: F_{j+1} starts while F_j's copy is in flight,
    # and L_0 reloads while F_{m-1}'s copy is in flight.
    assert res.peak_activation.tolist() == [2.0]


@pytest.mark.parametrize("t", [0.25, 1.0])
def test_prefetch_one_hides_copies_shorter_than_compute(t):
    # With L_j one unit ahead of BW_j, its copy back overlaps the unit
    # before (F_{m-1} for j = 0, BW_{j-1} after): with t <= f and t <= b
    # nothing waits, the makespan is GPipe's m (f + b), and the peak is 3
    # (L_0's reload, F_{m-1}, and F_{m-2} whose copy to host is in flight).
    res = pc.simulate(one_device(1), pc.Costs(f=1.0, b=2.0, offload=t))
    assert res.makespan == M * 3.0
    assert res.peak_activation.tolist() == [3.0]


def test_slow_host_link_queues_copies_in_issue_order():
    # t = 3 > f: copies to host queue, ending at 1 + 3 (j + 1) = 4, 7, ..., 16.
    # Without prefetch, copy back j starts at max(L_j, end of copy back j-1,
    # copy to host j): 5, 10, 15, 20, 25, and BW_j runs 2 after it ends.
    res = pc.simulate(one_device(0), pc.Costs(f=1.0, b=2.0, offload=3.0))
    tr = res.transfers.to_pydict()
    to_host = [e for k, e in zip(tr["kind"], tr["finish"]) if k == "O"]
    back = [s for k, s in zip(tr["kind"], tr["start"]) if k == "L"]
    assert to_host == [4.0, 7.0, 10.0, 13.0, 16.0]
    assert back == [5.0, 10.0, 15.0, 20.0, 25.0]
    assert res.makespan == 30.0
    # At 5 the copies of 1..4 are still in flight and 0 comes back: 5 held.
    assert res.peak_activation.tolist() == [5.0]


def test_offload_frees_memory_under_1f1b():
    # 1F1B p=4: device 0 holds 4 microbatches. Offloading stage 0 with a
    # free link (t = 0, prefetch 1) keeps at most the running F, the F it
    # replaced and one reload: 2, and costs no time.
    base = pc.build("1f1b", 4, 8)
    sched = pc.offload(base, stages=[0])
    plain = pc.simulate(base, pc.Costs(f=1.0, b=2.0))
    res = pc.simulate(sched, pc.Costs(f=1.0, b=2.0, offload=0.0))
    assert res.makespan == plain.makespan
    assert res.peak_activation[0] == 2.0
    np.testing.assert_array_equal(res.peak_activation[1:], plain.peak_activation[1:])


def test_memory_table_is_time_ordered_and_returns_to_zero():
    res = pc.simulate(pc.offload(pc.build("zb-h1", 4, 8), stages=[0, 1]),
                      pc.Costs(f=1.0, b=1.0, w=1.0, activation_w=0.5, offload=0.7))
    mem = res.memory.to_pydict()
    dev = np.asarray(mem["device"])
    for d in range(4):
        t = np.asarray(mem["time"])[dev == d]
        v = np.asarray(mem["activation"])[dev == d]
        assert np.all(np.diff(t) >= 0)
        assert v.min() >= -1e-12 and abs(v[-1]) < 1e-12
        assert res.peak_activation[d] == pytest.approx(max(0.0, v.max()))


def test_placement_of_o_and_l():
    acts = pc.offload(pc.build("1f1b", 2, 4), stages=[0], microbatches=[1, 2], prefetch=2).to_actions()
    prog = acts[0]
    for j in (1, 2):
        f, o, ld, b = (prog.index(f"0{k}{j}") for k in ("F", "O", "L", "BW"))
        assert f + 1 == o < ld < b
    assert all(a[1] not in "OL" for a in acts[1])
    assert "0O0" not in prog and "0O3" not in prog


@pytest.mark.parametrize("change,rule", [
    (lambda p: p[0].remove(("L", 0, 1)), "missing-op"),               # O without L
    (lambda p: p[0].remove(("O", 0, 1)), "missing-op"),               # L without O
    (lambda p: (p[0].remove(("L", 0, 1)), p[0].append(("L", 0, 1))), "order"),   # L after BW
    (lambda p: (p[0].remove(("O", 0, 1)), p[0].insert(0, ("O", 0, 1))), "order"),  # O before F
    (lambda p: p[0].insert(p[0].index(("BW", 0, 1)), ("R", 0, 1)), "offload"),   # and recomputed
    (lambda p: (p[0].remove(("L", 0, 1)), p[1].append(("L", 0, 1))), "placement"),
])
def test_bad_offload_ops_are_named(change, rule):
    progs = pc.offload(pc.build("1f1b", 2, 4), stages=[0], microbatches=[1]).programs()
    change(progs)
    with pytest.raises(pc.ScheduleError) as info:
        pc.Schedule.from_programs(progs, devices=2)
    assert info.value.rule == rule
    first = str(info.value).splitlines()[0]
    assert "0O1" in first or "0L1" in first or "microbatch 1" in first


def test_errors():
    sched = pc.offload(pc.build("1f1b", 2, 4))
    with pytest.raises(ValueError, match="set Costs.offload"):
        pc.simulate(sched, pc.Costs())
    with pytest.raises(ValueError, match="use pipecore.simulate"):
        pc.simulate_many(sched, {"f": [1.0]})
    with pytest.raises(ValueError, match="not supported"):
        pc.search.local_search(sched, pc.Costs(offload=1.0))
    with pytest.raises(ValueError, match="already offloaded"):
        pc.offload(sched, stages=[0])
    with pytest.raises(ValueError, match="already recomputed"):
        pc.offload(pc.recompute(pc.build("1f1b", 2, 4)))
    with pytest.raises(ValueError, match="'prefetch' must be >= 0"):
        pc.offload(pc.build("1f1b", 2, 4), prefetch=-1)
    with pytest.raises(ValueError, match="'offload' must be >= 0"):
        pc.Costs(offload=-1.0)


def test_ideal_table_treats_copies_as_free():
    sched = pc.offload(pc.build("1f1b", 4, 8))
    assert pc.ideal_table(sched).length == pc.ideal_table(pc.build("1f1b", 4, 8)).length


def test_outputs_draw_offload(tmp_path):
    pytest.importorskip("matplotlib", reason="Gantt charts need the plot extra: pip install pipecore[plot]")
    res = pc.simulate(pc.offload(pc.build("1f1b", 2, 4)), pc.Costs(offload=0.5))
    assert res.write_gantt(tmp_path / "g.png", show_transfers=True).exists()
    assert res.write_trace(tmp_path / "t.json").exists()


def test_tune_with_offload_returns_a_valid_fitting_schedule():
    costs = pc.Costs(f=1.0, b=1.0, w=1.0, activation_w=0.5, weights=0.0, offload=0.5)
    best = pc.tune(4, 8, costs, 1.5, recompute=False)
    pc.validate(best.schedule)
    res = pc.simulate(best.schedule, costs)
    assert res.makespan == best.result.makespan
    assert (res.peak_activation + res.static_memory).max() <= 1.5 * (1 + 1e-9)
    assert "+offload" in best.label


def test_cli_tune_offload(capsys):
    from pipecore.cli import main

    assert main(["tune", "-p", "4", "-m", "8", "--f", "1", "--b", "1", "--w", "1",
                 "--activation-w", "0.5", "--memory-limit", "1.5", "--offload", "0.5",
                 "--no-recompute", "--top", "2"]) == 0
    assert "+offload" in capsys.readouterr().out.splitlines()[0]


# -- host links shared by several devices ------------------------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pipecore.testing import costs as cost_strategy  # noqa: E402
from pipecore.testing import schedules  # noqa: E402


def check_shared_link_discipline(res, group):
    """From the output alone: on each group's link, per direction, copies are
    served one at a time in order of issue (ready, then device, then program
    order), each starting at max(issue, end of the previous one, and for a
    copy back the end of its own copy to host) and lasting its copy time."""
    tr = res.transfers.to_pydict()
    arrays = res.costs.stage_arrays(res.schedule.stages, res.schedule.devices)
    to_host_end = {}
    for i, kind in enumerate(tr["kind"]):
        if kind == "O":
            to_host_end[(tr["stage"][i], tr["microbatch"][i])] = tr["arrival"][i]
    lanes = {}
    for i, kind in enumerate(tr["kind"]):
        if kind in ("O", "L"):
            lanes.setdefault((tr["src_device"][i] // group, kind), []).append(i)
    for rows in lanes.values():
        rows.sort(key=lambda i: (tr["ready"][i], tr["src_device"][i], i))
        free = 0.0
        for i in rows:
            begin = max(tr["ready"][i], free)
            if tr["kind"][i] == "L":
                begin = max(begin, to_host_end[(tr["stage"][i], tr["microbatch"][i])])
            assert tr["start"][i] == begin
            assert tr["finish"][i] == begin + arrays["offload"][tr["stage"][i]]
            free = tr["finish"][i]


@settings(max_examples=60, deadline=None)
@given(sched=schedules(max_devices=6, overlap=False), group=st.integers(2, 4), data=st.data())
def test_shared_host_links_serve_copies_in_issue_order(sched, group, data):
    c = data.draw(cost_strategy(stages=sched.stages, comm=False))
    c = pc.Costs(**{k: getattr(c, k) for k in ("f", "b", "w", "activation", "activation_w", "r",
                                                "checkpoint", "offload")},
                 weights=0.0, host_link_devices=group)
    res = pc.simulate(sched, c)
    check_shared_link_discipline(res, group)
    # The backward of an offloaded (stage, microbatch) waits for its copy back.
    tr = res.transfers.to_pydict()
    back_end = {(tr["stage"][i], tr["microbatch"][i]): tr["arrival"][i]
                for i, k in enumerate(tr["kind"]) if k == "L"}
    ops = res.ops.to_pydict()
    for i, kind in enumerate(ops["kind"]):
        key = (ops["stage"][i], ops["microbatch"][i])
        if kind in ("B", "BW") and key in back_end:
            assert ops["start"][i] >= back_end[key]


def test_a_shared_link_with_one_sender_changes_nothing():
    # Only device 0 and device 2 offload; with pairs {0,1} and {2,3} each
    # shared link has one sender, so the times equal private links'.
    sched = pc.offload(pc.build("1f1b", 4, 8), stages=[0, 2])
    alone = pc.simulate(sched, pc.Costs(f=1.0, b=2.0, offload=1.5))
    shared = pc.simulate(sched, pc.Costs(f=1.0, b=2.0, offload=1.5, host_link_devices=2))
    np.testing.assert_array_equal(alone.start, shared.start)
    assert alone.transfers.equals(shared.transfers)


def test_two_devices_on_one_link_by_hand():
    # GPipe p=2, m=4, f=1, b=2, copies of 1.5, prefetch 1. Private links:
    # device 0's copies to host start at 1, 2.5, 4, 5.5 (its Fs end at 1..4).
    # Shared by devices 0 and 1 (device 1's Fs end at 2..5): in issue order
    # 0:O0@1, then 1:O0@2 (and 0:O1@2, device 0 first at equal issue) ...
    sched = pc.offload(pc.build("gpipe", 2, 4), prefetch=1)
    res = pc.simulate(sched, pc.Costs(f=1.0, b=2.0, offload=1.5, host_link_devices=2))
    check_shared_link_discipline(res, 2)
    tr = res.transfers.to_pydict()
    out = sorted((tr["start"][i], tr["src_device"][i], tr["microbatch"][i])
                 for i, k in enumerate(tr["kind"]) if k == "O")
    # Issue order: (1, d0, mb0), (2, d0, mb1), (2, d1, mb0), (3, d0, mb2), (3, d1, mb1), ...
    assert [(d, j) for _s, d, j in out[:4]] == [(0, 0), (0, 1), (1, 0), (0, 2)]
    assert [s for s, _d, _j in out[:4]] == [1.0, 2.5, 4.0, 5.5]
    private = pc.simulate(sched, pc.Costs(f=1.0, b=2.0, offload=1.5))
    assert res.makespan > private.makespan  # 20.0 against 15.5: the link is the bottleneck

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
        v = np.asarray(mem["bytes"])[dev == d]
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
    pytest.importorskip("matplotlib")
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

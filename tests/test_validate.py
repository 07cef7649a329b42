"""Validation: every broken rule gets a ScheduleError (a ValueError) that names
the device, slot, stage, microbatch and rule, with the bad op marked."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipecore as pc
from pipecore import Action, ScheduleError, from_actions
from pipecore.testing import family_schedules, schedules


def linear(p, m):
    """A valid GPipe-like program in action form, for mutation."""
    return {d: [f"{d}F{j}" for j in range(m)] + [f"{d}BW{j}" for j in range(m)] for d in range(p)}


def test_scheduleerror_is_valueerror():
    assert issubclass(ScheduleError, ValueError)


def test_missing_forward():
    progs = linear(2, 2)
    progs[1].remove("1F1")
    with pytest.raises(ScheduleError) as info:
        from_actions(progs)
    e = info.value
    assert e.rule == "missing-op" and (e.stage, e.microbatch) == (1, 1)
    assert "stage 1 microbatch 1 has no F" in str(e)
    assert ">>1BW1<<" in str(e)  # the op that is present is marked
    assert e.device == 1


def test_duplicate_op():
    progs = linear(2, 2)
    progs[0].insert(1, "0F0")
    with pytest.raises(ScheduleError, match="more than one F for stage 0 microbatch 0") as info:
        from_actions(progs)
    assert info.value.rule == "duplicate-op"
    assert (info.value.device, info.value.slot) == (0, 1)


def test_split_and_fused_backward_conflict():
    progs = linear(1, 1)
    progs[0] += ["0B0", "0W0"]
    with pytest.raises(ScheduleError, match="fused BW and a split") as info:
        from_actions(progs)
    assert info.value.rule == "duplicate-op"


def test_b_without_w():
    with pytest.raises(ScheduleError, match=r"has no W \(it has a B\)") as info:
        from_actions({0: ["0F0", "0B0"]})
    assert info.value.rule == "missing-op"


def test_backward_on_other_device():
    progs = {0: ["0F0", "1BW0"], 1: ["1F0", "0BW0"]}
    with pytest.raises(ScheduleError, match="must share a device") as info:
        from_actions(progs)
    e = info.value
    assert e.rule == "placement" and e.device == 1 and e.stage == 0


def test_stage_on_two_devices():
    progs = {0: ["0F0", "0BW0"], 1: ["0F1", "0BW1"]}
    with pytest.raises(ScheduleError, match="stage 0 runs on device 1 for microbatch 1") as info:
        from_actions(progs)
    assert info.value.rule == "placement"


def test_op_before_its_producer_on_same_device():
    progs = {0: ["0BW0", "0F0"]}
    with pytest.raises(ScheduleError) as info:
        from_actions(progs)
    e = info.value
    assert e.rule == "order"
    assert (e.device, e.slot, e.stage, e.microbatch, e.kind) == (0, 0, 0, 0, "BW")
    assert "needs 0F0, which runs later on the same device (slot 1)" in str(e)
    assert ">>0BW0<<" in str(e)


def test_deadlock_names_every_blocked_head():
    # Device 0 waits for 1BW0 before it sends 0F1; device 1 waits for 0F1 first.
    progs = {0: ["0F0", "0BW0", "0F1", "0BW1"], 1: ["1F1", "1F0", "1BW0", "1BW1"]}
    sched = from_actions(progs)  # structurally valid
    with pytest.raises(ScheduleError) as info:
        pc.simulate(sched)
    e = info.value
    assert e.rule == "deadlock"
    assert e.blocked == [(0, 1), (1, 0)]
    text = str(e)
    assert "device 0 slot 1 waits at 0BW0" in text and "device 1 slot 0 waits at 1F1" in text
    assert ">>0BW0<<" in text and ">>1F1<<" in text
    with pytest.raises(ScheduleError, match="deadlock"):
        pc.validate(sched)
    with pytest.raises(ScheduleError, match="deadlock"):
        pc.ideal_table(sched)


def test_duplicate_slot_from_table():
    with pytest.raises(ScheduleError, match="slot 0 is used twice on device 0") as info:
        pc.Schedule.from_arrays([0, 0, 0, 0], [0, 0, 1, 2], ["F", "F", "BW", "BW"],
                                [0, 0, 0, 0], [0, 1, 0, 1])
    assert info.value.rule == "slot-unique"
    # An F and a B/BW may share a slot (an overlapped pair), but not F with its own backward.
    with pytest.raises(ScheduleError, match="paired with its own forward") as info:
        pc.Schedule.from_arrays([0, 0], [0, 0], ["F", "BW"], [0, 0], [0, 0])
    assert info.value.rule == "overlap"
    with pytest.raises(ScheduleError, match="pairs BW with F") as info:
        pc.from_actions({0: ["0F0", "0BW0&0F1", "0BW1"]})
    assert info.value.rule == "overlap"


def test_unknown_kind_and_bad_codes():
    with pytest.raises(ScheduleError, match="kind 'X'"):
        pc.Schedule.from_arrays([0, 0], [0, 1], ["F", "X"], [0, 0], [0, 0])
    with pytest.raises(ScheduleError, match="kind code 8; codes are 0..7"):
        pc.Schedule.from_arrays([0, 0], [0, 1], [0, 8], [0, 0], [0, 0])


def test_from_arrays_does_not_alias_the_callers_arrays():
    # Found 2026-11-25: int32 columns (and int8 codes) went into the Arrow
    # table without a copy, so changing the caller's array afterwards
    # silently changed a validated schedule.
    ref = pc.build("1f1b", 4, 8)
    t = ref.table
    cols = {c: t.column(c).to_numpy().copy() for c in ("device", "slot", "stage", "microbatch")}
    codes = ref.kind_codes.copy()
    sched = pc.Schedule.from_arrays(cols["device"], cols["slot"], codes, cols["stage"],
                                    cols["microbatch"])
    cols["stage"][:] = 0
    cols["device"][:] = 0
    codes[:] = 0
    assert sched.table.equals(ref.table)
    assert pc.simulate(sched, pc.Costs()).makespan == pc.simulate(ref, pc.Costs()).makespan
    # copy=False is the caller's promise not to modify them: same schedule.
    t2 = pc.build("zb-h1", 4, 8).table
    taken = pc.Schedule.from_arrays(*(t2.column(c).to_numpy().copy() for c in ("device", "slot")),
                                    pc.build("zb-h1", 4, 8).kind_codes.copy(),
                                    *(t2.column(c).to_numpy().copy() for c in ("stage", "microbatch")),
                                    copy=False)
    assert taken.table.equals(pc.build("zb-h1", 4, 8).table)
    with pytest.raises(ValueError, match="column 'stage' must be one-dimensional"):
        pc.Schedule.from_arrays([0, 0], [0, 1], ["F", "BW"], [[0, 0]], [0, 0])


def test_large_schedule_reuses_its_columns_and_pickles_without_them():
    # At FAST_MIN_OPS ops and more the structure takes the schedule's own
    # stage and kind arrays instead of copies; a pickle carries one copy.
    import pickle
    big = pc.build("1f1b", 64, 2048)
    assert big.num_ops >= pc.core.rules.FAST_MIN_OPS
    st = big._info()
    assert np.shares_memory(st.op_stage, big._column("stage"))
    assert np.shares_memory(st.op_kind, big.kind_codes)
    blob = pickle.dumps(big)
    back = pickle.loads(blob)
    assert back.table.equals(big.table)
    assert pc.simulate(back, pc.Costs()).makespan == pc.simulate(big, pc.Costs()).makespan
    assert back._own == {}  # the pickle held no second copy of the columns


def test_negative_and_out_of_range_indices():
    with pytest.raises(ScheduleError, match="'microbatch' must be >= 0"):
        pc.Schedule.from_arrays([0, 0], [0, 1], ["F", "BW"], [0, 0], [-1, -1])
    with pytest.raises(ScheduleError, match="devices=1"):
        pc.Schedule.from_arrays([0, 1], [0, 0], ["F", "BW"], [0, 0], [0, 0], devices=1)
    with pytest.raises(ScheduleError, match="device -1"):
        pc.Schedule.from_arrays([-1, 0], [0, 0], ["F", "BW"], [0, 0], [0, 0])
    with pytest.raises(ScheduleError, match="no ops"):
        from_actions({0: []})


def test_bad_build_arguments():
    with pytest.raises(ValueError, match=r"'devices' must be >= 1 \(got 0\)"):
        pc.build("1f1b", devices=0, microbatches=4)
    with pytest.raises(ValueError, match=r"'microbatches' must be >= 1 \(got 0\)"):
        pc.build("1f1b", devices=2, microbatches=0)
    with pytest.raises(ValueError, match=r"'devices' must be an int \(got 2.5\)"):
        pc.build("1f1b", devices=2.5, microbatches=4)
    with pytest.raises(ValueError, match="multiple of devices"):
        pc.build("interleaved-1f1b", devices=4, microbatches=6)
    with pytest.raises(ValueError, match="'chunks' must be 1"):
        pc.build("gpipe", devices=4, microbatches=4, chunks=2)
    with pytest.raises(ValueError) as info:
        pc.build("zb-h9", devices=4, microbatches=8)
    assert "unknown schedule 'zb-h9'" in str(info.value)
    for name in pc.schedules():
        assert name in str(info.value)


def test_registry_is_case_insensitive():
    assert pc.build("1F1B", 2, 2) == pc.build("1f1b", 2, 2)
    assert pc.build(" Interleaved-1F1B ", 2, 2, chunks=2).name == "interleaved-1f1b"


@pytest.mark.parametrize("field,value,match", [
    ("f", -1.0, r"Costs 'f' must be >= 0 \(got -1.0\)"),
    ("b", math.nan, r"Costs 'b' must be finite \(got nan\)"),
    ("w", math.inf, r"Costs 'w' must be finite"),
    ("comm", "fast", "Costs 'comm' must be a number"),
    ("f", [1.0, -2.0], r"Costs 'f'\[1\] must be finite and >= 0"),
    ("activation_w", 2.0, "'activation_w' must be <= 'activation'"),
])
def test_bad_costs(field, value, match):
    with pytest.raises(ValueError, match=match):
        pc.Costs(**{field: value})


def test_cost_vector_length_must_match_stages():
    sched = pc.build("1f1b", 4, 4)
    with pytest.raises(ValueError, match="Costs 'f' has 3 entries but the schedule has 4 stages"):
        pc.simulate(sched, pc.Costs(f=[1.0, 1.0, 1.0]))


@pytest.mark.parametrize("kwargs,match", [
    (dict(bytes=1.0, bandwidth=0.0), r"'bandwidth' must be > 0"),
    (dict(bytes=-1.0, bandwidth=1.0), r"'bytes' must be >= 0"),
    (dict(bytes=1.0, bandwidth=1.0, inter_bandwidth=2.0), "need 'devices_per_node'"),
    (dict(bytes=1.0, bandwidth=1.0, devices_per_node=0, inter_bandwidth=1.0), "'devices_per_node' must be"),
    (dict(bytes=1.0, bandwidth=1.0, devices_per_node=2), "'inter_bandwidth' is required"),
])
def test_bad_network(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pc.Network(**kwargs)


def test_bad_simulate_arguments():
    sched = pc.build("1f1b", 2, 2)
    with pytest.raises(ValueError, match="'costs' must be a pipecore.Costs"):
        pc.simulate(sched, {"f": 1.0})
    with pytest.raises(ValueError, match="'schedule' must be a pipecore.Schedule"):
        pc.simulate("1f1b")


@pytest.mark.parametrize("text", ["", "F3", "0X3", "0F", "-1F0", "0f0", "0 F 0", None])
def test_action_parse_errors(text):
    with pytest.raises(ValueError, match="cannot parse action"):
        Action.parse(text)


def test_from_actions_error_names_device_and_entry():
    with pytest.raises(ValueError, match=r"device 1, entry 2: cannot parse action 'oops'"):
        from_actions({0: ["0F0", "0BW0"], 1: ["1F0", None, "oops"]})


@given(st.integers(0, 10**6), st.sampled_from(["F", "B", "W", "BW"]), st.integers(0, 10**6))
def test_action_string_roundtrip(stage, kind, mb):
    a = Action(stage, kind, mb)
    text = str(a)
    assert text == f"{stage}{kind}{mb}"
    assert Action.parse(text) == a
    assert str(Action.parse(text)) == text
    ar = Action(stage, "AR", None)
    assert str(ar) == f"{stage}AR" and Action.parse(str(ar)) == ar


@settings(max_examples=40, deadline=None)
@given(family_schedules())
def test_actions_roundtrip_families(sched):
    back = from_actions(sched.to_actions(), devices=sched.devices, replicated=sched.replicated,
                        offload_to=sched.offload_to)
    assert back == sched
    assert back.to_actions() == sched.to_actions()


@settings(max_examples=40, deadline=None)
@given(schedules())
def test_random_valid_schedules_validate(sched):
    assert pc.validate(sched) is sched


def test_none_entries_are_idle_steps():
    sched = from_actions({0: ["0F0", None, "0BW0"]})
    assert sched.to_actions() == {0: ["0F0", "0BW0"]}


def test_render_marks_and_windows_long_programs():
    sched = pc.build("gpipe", 2, 40)
    text = sched.render(mark=[50])
    assert ">>0BW10<<" in text and "..." in text


def test_overlapped_pairs_roundtrip_and_timing():
    # Device 1 runs F of microbatch 1 together with BW of microbatch 0.
    sched = from_actions({0: ["0F0", "0F1", "0BW0", "0BW1"], 1: ["1F0", "1F1&1BW0", "1BW1"]})
    assert sched.to_actions()[1] == ["1F0", "1F1&1BW0", "1BW1"]
    assert from_actions(sched.to_actions()) == sched
    assert "1F1&1BW0" in sched.render()
    # f=1, b=2: 1F0 [1, 2]; the pair starts at 2 and takes (1 + 2) * 0.75 = 2.25.
    res = pc.simulate(sched, pc.Costs(f=1.0, b=2.0, fb_factor=0.75))
    ops = res.ops.to_pydict()
    pair = [k for k in range(len(ops["slot"])) if ops["device"][k] == 1 and ops["slot"][k] == 1]
    assert [ops["start"][k] for k in pair] == [2.0, 2.0]
    assert [ops["finish"][k] for k in pair] == [4.25, 4.25]
    # Busy time counts the pair once: 1 + 2.25 + 2.
    assert res.busy[1] == 5.25
    with pytest.raises(ValueError, match="'fb_factor' must be > 0"):
        pc.Costs(fb_factor=0.0)


def test_replicated_stages_need_opting_in():
    # Stage 0 serves microbatch 0 on device 0 and microbatch 1 on device 1 (Chimera-like).
    progs = {0: ["0F0", "1F1", "1BW1", "0BW0"], 1: ["0F1", "1F0", "1BW0", "0BW1"]}
    with pytest.raises(ScheduleError, match="unless the schedule is built with replicated=True"):
        from_actions(progs)
    sched = from_actions(progs, replicated=True)
    assert sched.stage_devices == [(0, 1), (0, 1)]
    res = pc.simulate(sched, pc.Costs(f=1.0, b=2.0, weights=3.0))
    # Two stages on two devices: 3.0 of weights per stage, and every device holds
    # both stages, twice what a device of a plain 2-stage pipeline holds.
    np.testing.assert_array_equal(res.static_memory, [6.0, 6.0])
    # Device 0: 0F0 [0,1]; 1F1 waits for 0F1 (device 1, ends 1) [1,2]; 1BW1 [2,4];
    # 0BW0 waits for 1BW0 (device 1, ends 4) [4,6]. Device 1 mirrors it.
    assert res.makespan == 6.0


def test_allreduce_rules():
    base = {0: ["0F0", "1F1", "1BW1", "0BW0"], 1: ["0F1", "1F0", "1BW0", "0BW1"]}
    ok = {d: prog + ["1AR", "0AR"] for d, prog in base.items()}
    sched = from_actions(ok, replicated=True)
    assert sched.to_actions() == ok
    # f=1, b=2, no network: each AR waits for the other replica's last backward
    # of its stage, which ends at the same time (4 for stage 1, 6 for stage 0).
    res = pc.simulate(sched, pc.Costs(f=1.0, b=2.0))
    assert res.makespan == 6.0
    # Activations: 0 bytes, latency 0.5; gradients: 1 unit over bandwidth 1.
    # Device 0: 0F0 [0,1]; 1F1 waits for 0F1 + 0.5 -> [1.5,2.5]; 1BW1 [2.5,4.5];
    # 0BW0 waits for 1BW0 (device 1, ends 4.5) + 0.5 -> [5,7]. Device 1 mirrors.
    # 0AR on device 0 waits for device 1's 0BW1 (ends 7): 7 + 1 + 0.5 = 8.5.
    net = pc.Network(bytes=0.0, bandwidth=1.0, latency=0.5, grad_bytes=1.0)
    res = pc.simulate(sched, pc.Costs(f=1.0, b=2.0), net)
    assert res.makespan == 8.5
    ar = res.transfers.to_pydict()
    grads = [k for k in range(len(ar["ready"])) if ar["finish"][k] - ar["start"][k] == 1.0]
    assert len(grads) == 4  # two exchanges (stages 0 and 1), each both ways
    with pytest.raises(ScheduleError, match="none on its other replica") as info:
        from_actions({0: base[0] + ["0AR"], 1: base[1]}, replicated=True)
    assert info.value.rule == "all-reduce"
    with pytest.raises(ScheduleError, match="an all-reduce comes after every backward op") as info:
        from_actions({0: ["0F0", "1F1", "1BW1", "0AR", "0BW0"], 1: base[1] + ["0AR"]},
                     replicated=True)
    assert info.value.rule == "order"
    with pytest.raises(ScheduleError, match="runs on exactly two devices"):
        from_actions({0: ["0F0", "0BW0", "0AR"]})


@pytest.mark.parametrize("name", ["1f1b", "zb-v", "interleaved-1f1b", "dualpipev", "chimera"])
def test_fast_program_path_equals_entry_by_entry(name, monkeypatch):
    # from_programs has a columnar fast path for plain tuples; it must build
    # exactly the table the entry-by-entry path builds (pairs and all-reduces
    # always take the latter).
    from pipecore.core import schedule as _schedule

    sched = pc.build(name, 4, 8)
    programs = sched.programs()
    fast = pc.Schedule.from_programs(programs, replicated=sched.replicated)
    monkeypatch.setattr(_schedule, "_programs_fast", lambda programs: None)
    slow = pc.Schedule.from_programs(programs, replicated=sched.replicated)
    assert fast.table.equals(slow.table)
    assert fast.table.equals(sched.table)


def test_costs_keep_their_own_copy_of_per_stage_arrays():
    # Found 2026-11-25: a float64 array passed per stage was frozen in place
    # (the caller's own array became read-only).
    f = np.array([1.0, 2.0])
    net_bytes = np.array([1.0, 3.0])
    costs = pc.Costs(f=f)
    net = pc.Network.uniform(bytes=net_bytes, bandwidth=1.0)
    sched = pc.build("1f1b", 2, 4)
    before = pc.simulate(sched, costs, net).makespan
    f[:] = 100.0  # still writable, and the costs do not follow
    net_bytes[:] = 50.0
    assert list(costs.f) == [1.0, 2.0]
    assert pc.simulate(sched, costs, net).makespan == before


def test_build_refuses_a_table_too_large_before_allocating(monkeypatch):
    # Op tables use int32 rows: 3 ops per stage and microbatch at most
    # (F, B, W), so 4 devices x 2**29 microbatches may reach 6.4e9 ops.
    from pipecore.core import hostmem

    free = hostmem.available_bytes()  # this machine's: a positive count, or None off Linux
    assert free is None or (isinstance(free, int) and free > 0)
    with pytest.raises(ValueError, match=r"'1f1b' with devices=4, microbatches=536870912, "
                                         r"chunks=1 may have 6,442,450,952 ops"):
        pc.build("1f1b", 4, 2**29)
    # Memory is checked against what the OS has available (allocation is
    # lazy: too large a table would get the process killed while written).
    monkeypatch.setattr(hostmem, "available_bytes", lambda: 10 * 2**20)  # 10 MiB
    with pytest.raises(MemoryError, match=r"'zb-v' with devices=64, microbatches=4096, "
                                          r"chunks=2 needs about 96 MiB .*; 10 MiB is available"):
        pc.build("zb-v", 64, 4096)
    assert pc.build("1f1b", 4, 8).num_ops == 64  # about 6,144 bytes: builds
    # compare reports such families as not built; the CLI prints the error.
    rows = pc.compare(64, 4096, names=["zb-v", "1f1b"])
    assert all("needs about" in r["error"] and r["result"] is None for r in rows)
    import io

    from pipecore.cli import main

    err = io.StringIO()
    monkeypatch.setattr("sys.stderr", err)
    assert main(["tune", "-p", "64", "-m", "4096"], out=io.StringIO()) == 2
    assert err.getvalue().startswith("pipecore: error: ") and "needs about" in err.getvalue()
    monkeypatch.setattr(hostmem, "available_bytes", lambda: None)  # unknown (not Linux)
    assert pc.build("1f1b", 4, 8).num_ops == 64

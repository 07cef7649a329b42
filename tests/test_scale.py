"""Building and validating at scale: the closed-form (vectorised) builders
equal their per-op reference builders op for op, and the one-pass structure
kernel equals the numpy rules on valid schedules and defers to them (same
error) on broken ones.

The references are the per-op loops each family was first written as
(tests/reference_families.py); nothing here is computed by the code under
test.
"""

import dataclasses
from contextlib import contextmanager

import numpy as np
import pytest
import reference_families as ref
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipecore as pc
from pipecore.core.ops import ScheduleError
from pipecore.core.rules import structure
from pipecore.core.schedule import Schedule
from pipecore.schedules import construct
from pipecore.schedules.construct import programs_to_schedule
from pipecore.testing import schedules

# Run once more with Numba's bounds checking on in CI (.ci/run selects by this mark).
pytestmark = pytest.mark.kernels


def _reference(name, p, m, v):
    """The per-op reference builder of each vectorised family."""
    progs = programs_to_schedule
    if name == "1f1b":
        return progs(name, ref.one_f_one_b_reference(p, m, [min(p - d, m) for d in range(p)]), p)
    if name == "eager-1f1b":
        return progs(name, ref.one_f_one_b_reference(p, m, [min(2 * (p - d) - 1, m)
                                                            for d in range(p)]), p)
    if name == "zb-h1":
        return ref.split_1f1b_reference(p, m, [p - d for d in range(p)], list(range(p)), name)
    if name == "zb-h2":
        return ref.split_1f1b_reference(p, m, [2 * (p - d) - 1 for d in range(p)],
                                        [2 * d for d in range(p)], name)
    if name == "gpipe":
        return ref.gpipe_reference(p, m)
    if name == "interleaved-1f1b":
        return ref.interleaved_reference(p, m, v)
    if name == "looped-bfs":
        return ref.looped_bfs_reference(p, m, v)
    if name == "zb-v":
        return ref.zb_v_reference(p, m)
    if name == "interleaved-zb":
        return ref.interleaved_zb_reference(p, m, v)
    raise AssertionError(name)


def _same_structure(a, b):
    # Every field, and x_src_dev, which both gather from the device column
    # on first use.
    names = [f.name for f in dataclasses.fields(b) if f.name != "memo"] + ["x_src_dev"]
    for key in names:
        want, got = getattr(b, key), getattr(a, key)
        if isinstance(want, np.ndarray):
            assert got.dtype == want.dtype, key
            assert got.shape == want.shape, key
            assert np.array_equal(got, want), key
        else:
            assert got == want, key


VECTORISED = ["1f1b", "eager-1f1b", "zb-h1", "zb-h2", "gpipe", "interleaved-1f1b", "looped-bfs",
              "zb-v", "interleaved-zb"]


@pytest.mark.parametrize("name", VECTORISED)
@settings(max_examples=25, deadline=None)
@given(p=st.integers(1, 9), m=st.integers(1, 24), v=st.integers(1, 3))
def test_vectorised_builders_equal_their_references(name, p, m, v):
    if name == "interleaved-1f1b":
        m = p * max(1, m // p)  # the family needs m to be a multiple of p
        sched = pc.build(name, p, m, chunks=v)
    elif name == "looped-bfs":
        sched = pc.build(name, p, m, chunks=v)
    elif name == "interleaved-zb":
        rounds = max(1, m // p)
        m -= m % rounds  # the family needs m to be a multiple of max(1, m // p)
        if m % max(1, m // p):
            return
        sched = pc.build(name, p, m, chunks=v)
    else:
        v = 1
        sched = pc.build(name, p, m)
    ref = _reference(name, p, m, v)
    assert sched.table.equals(ref.table)
    _same_structure(structure(sched, fast=True), structure(ref, fast=False))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sched=schedules(recompute=False, offload=False))
def test_structure_kernel_equals_numpy_rules(sched):
    # Replicated layouts (with their all-reduces) and fused F&B pairs included.
    _same_structure(structure(sched, fast=True), structure(sched, fast=False))


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sched=schedules(recompute=True, offload=False))
def test_structure_kernel_equals_numpy_rules_with_recompute(sched):
    # R ops: the backward waits for the R, the recomputed F is class F_DROP.
    _same_structure(structure(sched, fast=True), structure(sched, fast=False))


@contextmanager
def _count_in_two_threads():
    """The structure's transfer counting and filling split over two threads, at any size."""
    import pipecore.core.rules as rules

    saved = rules.COUNT_THREADS_MIN_OPS, rules.local_cpus, rules.FAST_MIN_OPS
    rules.COUNT_THREADS_MIN_OPS, rules.local_cpus, rules.FAST_MIN_OPS = 0, (lambda: 2), 0
    try:
        yield
    finally:
        rules.COUNT_THREADS_MIN_OPS, rules.local_cpus, rules.FAST_MIN_OPS = saved


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sched=schedules(recompute=True, offload=False))
def test_structure_kernel_in_two_threads_equals_numpy_rules(sched):
    # Halves of the rows counted and filled at once (replicated layouts: one thread).
    with _count_in_two_threads():
        fast = structure(sched, fast=True)
    _same_structure(fast, structure(sched, fast=False))


def _partners(data, p):
    """A random Schedule.offload_to: each device -1 (host) or another device."""
    return [data.draw(st.sampled_from([-1] + [q for q in range(p) if q != d])) for d in range(p)]


def _kernel_equals_numpy(sched):
    # The kernel must take the schedule (a None would hide behind the
    # numpy fallback and make the comparison vacuous).
    import pipecore.core.rules as rules

    fast = rules._structure_fast(sched)
    assert fast is not None
    _same_structure(fast, structure(sched, fast=False))
    return fast


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sched=schedules(recompute=True, offload=True), peers=st.booleans(), threads=st.booleans(),
       data=st.data())
def test_structure_kernel_equals_numpy_rules_with_offload(sched, peers, threads, data):
    # O and L ops (some (stage, microbatch)s recomputed, others offloaded,
    # replicated layouts with all-reduces, fused pairs), to host or to
    # random partner devices: the copies, their links, x_after and x_peer.
    if peers:
        sched = Schedule(sched.table, validate=False, devices=sched.devices,
                         replicated=sched.replicated, offload_to=_partners(data, sched.devices))
    if threads:
        with _count_in_two_threads():
            _kernel_equals_numpy(sched)
    else:
        _kernel_equals_numpy(sched)


@settings(max_examples=30, deadline=None)
@given(p=st.integers(1, 12), m=st.integers(1, 30), threads=st.booleans())
def test_structure_kernel_equals_numpy_rules_on_bpipe(p, m, threads):
    # BPipe: device d evicts to device p - 1 - d over the links between the
    # two, shared with the pipeline's sends.
    sched = pc.build("bpipe", p, m)
    if threads:
        with _count_in_two_threads():
            fast = _kernel_equals_numpy(sched)
    else:
        fast = _kernel_equals_numpy(sched)
    if (fast.x_host == 1).any() and p > 1 and any(q >= 0 for q in sched.offload_to):
        assert fast.x_peer.size


@pytest.mark.parametrize("name", VECTORISED)
@settings(max_examples=8, deadline=None)
@given(p=st.integers(1, 6), m=st.integers(1, 12), prefetch=st.integers(0, 2), peers=st.booleans(),
       data=st.data())
def test_structure_kernel_equals_numpy_rules_on_offloaded_families(name, p, m, prefetch, peers,
                                                                   data):
    if name == "interleaved-1f1b":
        m = p * max(1, m // p)
    if name == "interleaved-zb" and m % max(1, m // p):
        return  # the family needs m to be a multiple of max(1, m // p)
    base = pc.build(name, p, m)
    stages = data.draw(st.lists(st.integers(0, base.stages - 1), min_size=1, unique=True))
    to = _partners(data, p) if peers else None
    _kernel_equals_numpy(pc.offload(base, stages=stages, prefetch=prefetch, to=to))


def test_structure_kernel_takes_offload_in_a_frozen_stage():
    # A frozen stage above the lowest trainable one runs F and B: it may
    # offload. One below it keeps no activation: an O there breaks "frozen".
    import pipecore.core.rules as rules

    sched = pc.offload(pc.build("zb-h1", 3, 6, frozen=[1]))
    assert (sched.kind_codes == 6).any()
    _kernel_equals_numpy(sched)
    progs = pc.build("1f1b", 2, 4, frozen=[0]).programs()
    i = progs[0].index(("F", 0, 1))
    progs[0][i + 1:i + 1] = [("O", 0, 1), ("L", 0, 1)]
    bad = Schedule.from_programs(progs, validate=False, frozen=[0]).table
    assert rules._structure_fast(Schedule(bad, validate=False, frozen=[0])) is None
    assert _error(bad, True, frozen=[0]) == _error(bad, False, frozen=[0])
    assert _error(bad, True, frozen=[0])[1] == "frozen"


@pytest.mark.parametrize("change, rule", [
    (lambda p: p[0].remove(("L", 0, 1)), "missing-op"),                            # O without L
    (lambda p: p[0].remove(("O", 0, 1)), "missing-op"),                            # L without O
    (lambda p: (p[0].remove(("L", 0, 1)), p[0].append(("L", 0, 1))), "order"),    # L after BW
    (lambda p: (p[0].remove(("O", 0, 1)), p[0].insert(0, ("O", 0, 1))), "order"),  # O before F
    (lambda p: p[0].insert(p[0].index(("L", 0, 1)), ("O", 0, 1)), "duplicate-op"),  # two O
    (lambda p: p[0].insert(p[0].index(("BW", 0, 1)), ("R", 0, 1)), "offload"),     # and an R
    (lambda p: (p[0].remove(("L", 0, 1)), p[1].append(("L", 0, 1))), "placement"),
    (lambda p: (p[0].remove(("O", 0, 1)), p[1].insert(0, ("O", 0, 1))), "placement"),
])
def test_broken_offload_rules_give_the_numpy_error_on_the_kernel_path(change, rule, counting):
    import pipecore.core.rules as rules

    progs = pc.offload(pc.build("1f1b", 2, 4), stages=[0], microbatches=[1], to=[1, -1]).programs()
    change(progs)
    bad = Schedule.from_programs(progs, validate=False, devices=2).table
    assert rules._structure_fast(Schedule(bad, validate=False, offload_to=[1, -1])) is None
    assert _error(bad, True, offload_to=[1, -1]) == _error(bad, False, offload_to=[1, -1])
    assert _error(bad, True, offload_to=[1, -1])[1] == rule


@pytest.fixture(params=[False, True], ids=["one thread", "two threads"])
def counting(request):
    if request.param:
        with _count_in_two_threads():
            yield
    else:
        yield


def test_structure_kernel_takes_recompute_and_explains_its_errors_like_numpy():
    import pipecore.core.rules as rules

    sched = pc.recompute(pc.build("zb-h1", 4, 8), stages=[1, 2])
    assert rules._structure_fast(sched) is not None
    _same_structure(structure(sched, fast=True), structure(sched, fast=False))
    progs = sched.programs()
    # An R after its backward, an R on another device, a second R.
    late = [list(p) for p in progs]
    i = late[1].index(("R", 1, 0))
    late[1].insert(late[1].index(("BW", 1, 0)) + 1 if ("BW", 1, 0) in late[1]
                   else late[1].index(("B", 1, 0)) + 1, late[1].pop(i))
    moved = [list(p) for p in progs]
    moved[0].append(moved[1].pop(moved[1].index(("R", 1, 0))))
    twice = [list(p) for p in progs]
    twice[1].insert(0, ("R", 1, 5))
    for bad_progs, rule in ((late, "order"), (moved, "placement"), (twice, "duplicate-op")):
        bad = Schedule.from_programs(bad_progs, validate=False).table
        assert rules._structure_fast(Schedule(bad, validate=False)) is None
        assert _error(bad, True) == _error(bad, False)
        assert _error(bad, True)[1] == rule


def test_structure_kernel_widens_its_index_when_a_kind_has_no_column(monkeypatch):
    # The per-key index holds only F and BW when a sample of the rows shows
    # no B or W. A schedule with B and W under that guess: the index kernel
    # says a kind has no column (status 2) and the structure is redone with
    # one for every kind, equal to the numpy rules'.
    import pipecore.core.rules as rules

    real = rules._index_columns
    asked = []

    def f_bw_guess(kind, top, guess=True):
        asked.append(guess)
        if not guess:
            return real(kind, top, guess)
        col = np.full(8, -1, np.int64)  # kinds F .. L
        col[0], col[3] = 0, 1
        return col

    monkeypatch.setattr(rules, "_index_columns", f_bw_guess)
    sched = pc.build("zb-h1", 4, 8)  # F, B and W only
    fast = rules._structure_fast(sched)
    assert asked == [True, False]
    assert fast is not None
    _same_structure(fast, structure(sched, fast=False))


def test_structure_kernel_on_f_bw_rows_with_one_b_w_pair_the_sample_skips(monkeypatch):
    # 1f1b (F and BW) with one BW split into B and W: 16,385 rows, every
    # fourth sampled, so the F/BW guess is wrong and the kernel widens.
    import pipecore.core.rules as rules

    base = pc.build("1f1b", 2, 4096).programs()
    for j in range(8, 16):  # a microbatch whose B and W rows the sample skips
        progs = [list(prog) for prog in base]
        i = progs[1].index(("BW", 1, j))
        progs[1][i:i + 1] = [("B", 1, j), ("W", 1, j)]
        sched = Schedule.from_programs(progs, validate=False)
        if rules._index_columns(sched.kind_codes, 3)[1] == -1:
            break
    else:
        pytest.fail("every split pair was sampled")
    real, statuses = rules.structure_fbw_index, []
    monkeypatch.setattr(rules, "structure_fbw_index",
                        lambda *a: statuses.append(real(*a)) or statuses[-1])
    fast = rules._structure_fast(sched)
    assert statuses == [2, 0]
    assert fast is not None
    _same_structure(fast, structure(sched, fast=False))


def test_stage_devices_of_one_two_and_three_devices():
    # Each row is a stage's device per microbatch; the answers are written
    # out by hand.
    from pipecore.core.rules import _stage_devices

    rows = np.array([[3, 3, 3, 3],    # one device
                     [5, 1, 1, 5],    # two, the greater first
                     [0, 2, 1, 2],    # three: the per-row sort
                     [7, 7, 4, 4]])
    assert _stage_devices(rows) == [(3,), (1, 5), (0, 1, 2), (4, 7)]


def _error(table, fast, **kwargs):
    sched = Schedule(table, validate=False, **kwargs)
    with pytest.raises(ScheduleError) as info:
        structure(sched, fast=fast)
    return str(info.value), info.value.rule


def _mutate(table, row, **cols):
    data = {c: table.column(c).to_pylist() for c in ("device", "slot", "stage", "microbatch")}
    kinds = [str(k) for k in table.column("kind").to_pylist()]
    for name, value in cols.items():
        if name == "kind":
            kinds[row] = value
        else:
            data[name][row] = value
    return Schedule.from_arrays(data["device"], data["slot"], kinds, data["stage"],
                                data["microbatch"], validate=False).table


@pytest.mark.parametrize("row, change, rule", [
    (5, {"microbatch": 0}, "duplicate-op"),        # a second F of (stage 0, mb 0)
    (3, {"stage": 1}, "duplicate-op"),             # a second op of another stage's key
    (17, {"device": 1}, "slot-unique"),            # two ops in one slot
    (0, {"kind": "B"}, "duplicate-op"),            # an F turned into a second B
])
def test_broken_rules_give_the_numpy_error_on_the_kernel_path(row, change, rule, counting):
    table = pc.build("zb-h1", 3, 6).table
    bad = _mutate(table, row, **change)
    fast_msg, fast_rule = _error(bad, True)
    slow_msg, slow_rule = _error(bad, False)
    assert (fast_msg, fast_rule) == (slow_msg, slow_rule)
    assert fast_rule in (rule, "missing-op", "order", "placement", "slot-unique")


def test_order_and_placement_errors_are_the_same_on_both_paths(counting):
    # Swap F and B of one microbatch on device 0: the B then runs before
    # the F it needs (rule "order").
    progs = pc.build("1f1b", 2, 4).programs()
    i_f = progs[0].index(("F", 0, 0))
    i_b = progs[0].index(("BW", 0, 0))
    progs[0][i_f], progs[0][i_b] = progs[0][i_b], progs[0][i_f]
    bad = Schedule.from_programs(progs, validate=False).table
    assert _error(bad, True) == _error(bad, False)
    assert _error(bad, True)[1] == "order"
    # Move one BW to the other device (rule "placement").
    progs = pc.build("1f1b", 2, 4).programs()
    op = progs[0].pop(progs[0].index(("BW", 0, 3)))
    progs[1].append(op)
    bad = Schedule.from_programs(progs, validate=False).table
    assert _error(bad, True) == _error(bad, False)
    assert _error(bad, True)[1] == "placement"


def test_large_schedules_take_the_kernel_path_by_default(monkeypatch):
    # Above FAST_MIN_OPS the kernel runs; its result is the numpy path's.
    import pipecore.core.rules as rules
    monkeypatch.setattr(rules, "FAST_MIN_OPS", 100)
    calls = []
    real = rules._structure_fast
    monkeypatch.setattr(rules, "_structure_fast", lambda s: calls.append(1) or real(s))
    sched = pc.build("zb-h1", 8, 32)
    assert calls and sched.num_ops == 8 * 32 * 3
    _same_structure(structure(sched), structure(sched, fast=False))


@contextmanager
def _kernel_scatter(blocked, threads):
    """Builders take their kernel paths at any size (undone on exit):
    ``blocked`` makes every device its own block, ``threads`` has two
    threads write half of the blocks each."""
    saved = (construct.SCATTER_MIN_OPS, construct.SCATTER_BLOCK_BYTES,
             construct.SCATTER_THREADS_MIN_OPS, construct._local_cpus)
    construct.SCATTER_MIN_OPS = 0
    if blocked:
        construct.SCATTER_BLOCK_BYTES = 1
    if threads:
        construct.SCATTER_THREADS_MIN_OPS, construct._local_cpus = 0, lambda: 2
    try:
        yield
    finally:
        (construct.SCATTER_MIN_OPS, construct.SCATTER_BLOCK_BYTES,
         construct.SCATTER_THREADS_MIN_OPS, construct._local_cpus) = saved


@pytest.mark.parametrize("name", VECTORISED)
@settings(max_examples=10, deadline=None)
@given(p=st.integers(1, 7), m=st.integers(1, 16), v=st.integers(1, 3), blocked=st.booleans(),
       threads=st.booleans())
def test_scatter_kernel_equals_numpy_scatter(name, p, m, v, blocked, threads):
    # Large shapes write the columns with kernels.slots.scatter_slots; the
    # numpy scatter (small shapes) is the reference here. ``blocked`` makes
    # every device its own block (at scale a block is a few devices);
    # ``threads`` has two threads scatter half of the blocks each (at scale).
    if name in ("interleaved-1f1b", "interleaved-zb"):
        m = p * max(1, m // p)
    kwargs = {"chunks": v} if name in ("interleaved-1f1b", "looped-bfs", "interleaved-zb") else {}
    try:
        ref = pc.build(name, p, m, **kwargs)
    except ValueError:
        return  # a shape the family refuses (same on both paths)
    with _kernel_scatter(blocked, threads):
        got = pc.build(name, p, m, **kwargs)
    assert got.table.equals(ref.table)


@pytest.mark.parametrize("threads", [False, True])
def test_scatter_kernel_reports_a_builder_bug(threads, monkeypatch):
    if threads:  # one block per device, half of them on a second thread
        monkeypatch.setattr(construct, "SCATTER_BLOCK_BYTES", 1)
        monkeypatch.setattr(construct, "SCATTER_THREADS_MIN_OPS", 0)
        monkeypatch.setattr(construct, "_local_cpus", lambda: 2)
    parts = [(0, np.zeros((2, 1)), np.arange(3)[None, :], np.array([[0, 1, 1], [0, 1, 2]]))]
    with pytest.raises(RuntimeError, match="two ops in one slot"):
        construct._slots_kernel("broken", 2, 3, parts)
    # The bug on device 1 only: the second thread's half when threaded.
    parts = [(0, np.zeros((2, 1)), np.arange(3)[None, :], np.array([[0, 1, 2], [0, 1, 1]]))]
    with pytest.raises(RuntimeError, match="two ops in one slot"):
        construct._slots_kernel("broken", 2, 3, parts)
    parts = [(0, np.zeros((2, 1)), np.arange(2)[None, :], np.array([[0, 1], [0, 2]]))]
    with pytest.raises(RuntimeError, match="left a slot empty"):
        construct._slots_kernel("broken", 2, 3, parts)


def _shape(name, p, m, v):
    """(m, v, build kwargs) of a shape the family accepts, near (p, m, v)."""
    if name == "interleaved-1f1b":
        m = p * max(1, m // p)  # m must be a multiple of p
    elif name == "interleaved-zb":
        m = max(1, m // p) * max(1, m // max(1, m // p))  # a multiple of its rounds
    elif name not in ("looped-bfs",):
        v = 1
    return m, v, ({"chunks": v} if name in ("interleaved-1f1b", "looped-bfs", "interleaved-zb")
                  else {})


@pytest.mark.parametrize("name", VECTORISED)
@settings(max_examples=15, deadline=None)
@given(p=st.integers(1, 12), m=st.integers(1, 40), v=st.integers(1, 4), threads=st.booleans())
def test_fused_column_kernels_equal_the_reference(name, p, m, v, threads):
    # At scale every vectorised family writes its columns with one kernel
    # (kernels/slots.py; zb-v when m >= 2p - 1); here at every size, one
    # device per block, in two threads or one, against the per-op builders.
    m, v, kwargs = _shape(name, p, m, v)
    if name == "zb-v":
        m = max(m, 2 * p - 1)
    try:
        ref = _reference(name, p, m, v)
    except ValueError:
        return  # a shape the family refuses
    with _kernel_scatter(True, threads):
        got = pc.build(name, p, m, **kwargs)
    assert got.table.equals(ref.table)


def _fused_kernels(p, m, v):
    """name -> (slots per device, fill(columns, d0, d1)) of each fused kernel."""
    from pipecore.kernels import slots

    warm = np.array([min(p - d, m) for d in range(p)], dtype=np.int64)
    lag = np.arange(p, dtype=np.int64)
    return {
        "zb-v": (6 * m, lambda c, d0, d1: slots.zb_v_columns(c, p, m, d0, d1)),
        "interleaved-1f1b": (2 * m * v, lambda c, d0, d1: slots.interleaved_columns(
            c, p, m, v, d0, d1)),
        "1f1b": (2 * m, lambda c, d0, d1: slots.one_f_one_b_columns(c, p, m, warm, d0, d1)),
        "zb-h1": (3 * m, lambda c, d0, d1: slots.split_1f1b_columns(c, p, m, warm, lag, d0, d1)),
        "gpipe": (2 * m, lambda c, d0, d1: slots.gpipe_columns(c, p, m, d0, d1)),
        "looped-bfs": (2 * v * m, lambda c, d0, d1: slots.looped_bfs_columns(c, p, m, v, d0, d1)),
        "interleaved-zb": (3 * m * v, lambda c, d0, d1: slots.interleaved_zb_columns(
            c, p, m, v, 2, d0, d1)),
    }


@pytest.mark.parametrize("name", list(_fused_kernels(3, 6, 2)))
def test_fused_column_kernels_report_a_taken_slot(name):
    # The per-family kernels write ops straight into the columns; a slot
    # written twice (here: taken beforehand) is reported, on any device.
    p, m, v = 3, 6, 2
    length, fill = _fused_kernels(p, m, v)[name]
    for taken in (0, length + 5, p * length - 1):
        columns = construct.column_buffers(p * length)
        columns[2][:] = -1
        columns[2][taken] = 0
        assert fill(columns, 0, p) == 1
    columns = construct.column_buffers(p * length)
    columns[2][:] = -1
    assert fill(columns, 0, p) == 0 and columns[2].min() >= 0  # every slot, once

    def broken(columns, d0, d1):
        columns[2][d0 * length] = 0  # an op already in the device's slot 0
        return fill(columns, d0, d1)

    with pytest.raises(RuntimeError, match=f"the {name} builder put two ops in one slot"):
        construct.kernel_to_schedule(name, p, length, broken)


def test_kernel_from_lowers_the_threshold_inside_its_block_only(monkeypatch):
    import pipecore.core.rules as rules
    calls = []
    real = rules._structure_fast
    monkeypatch.setattr(rules, "_structure_fast", lambda s: calls.append(s.num_ops) or real(s))
    sched = pc.build("zb-h1", 8, 512)  # 12,288 ops: below FAST_MIN_OPS
    assert sched.num_ops < rules.FAST_MIN_OPS
    structure(sched)
    assert calls == []
    with pytest.raises(RuntimeError, match="inside"):
        with rules.kernel_from(8192):
            fast = structure(sched)
            assert calls == [sched.num_ops]
            raise RuntimeError("inside")
    _same_structure(fast, structure(sched, fast=False))
    structure(sched)  # the threshold is back after the error
    assert calls == [sched.num_ops]


@pytest.mark.parametrize("name", ["zb-h1", "interleaved-1f1b", "1f1b"])
def test_kernel_paths_at_small_shapes_equal_the_reference(name):
    # Every size gate at zero: the builders' and the structure's kernel
    # paths, against the per-op reference and the numpy rules.
    from pipecore.warm import _thresholds_at_zero

    p, m, v = 4, 8, 2 if name == "interleaved-1f1b" else 1
    with _thresholds_at_zero():
        sched = pc.build(name, p, m, **({"chunks": v} if v > 1 else {}))
        fast = structure(sched, fast=True)
    ref = _reference(name, p, m, v)
    assert sched.table.equals(ref.table)
    _same_structure(fast, structure(ref, fast=False))

"""The building blocks' squeeze kernels (``pipecore/kernels/vreorder.py``,
``vcooldown.py``, driven by ``schedules/block_kernels.py``) equal the Python
reference they replace at scale: ``block_squeeze._squeeze_programs``, which
runs ``_reorder`` and ``_greedy_cooldown`` in pure Python. Every
expected program below comes from that reference, op for op (same order on
every device), on the paper's V blocks, on V blocks with other offsets and
on random blocks (fused BW, longer ops, any placement)."""

from unittest import mock

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import pipecore as pc
from pipecore.core.schedule import Schedule
from pipecore.kernels import blockops, vcooldown, vreorder
from pipecore.schedules import block_kernels, block_squeeze, blocks

# Run once more with Numba's bounds checking on in CI (.ci/run selects by this mark).
pytestmark = pytest.mark.kernels

MAKE = {"v-min": blocks.v_min, "v-half": blocks.v_half, "v-zb": blocks.v_zb}


def kernel_programs(block, m):
    tables = block_kernels._block_tables(block, m)
    assert tables is not None
    dev, slot, kind, stage, mb = block_kernels._squeeze_kernels(tables)
    assert np.all(np.diff(dev) >= 0)
    out = []
    for d in range(block.devices):
        rows = dev == d
        assert np.array_equal(slot[rows], np.arange(rows.sum()))
        out.append(list(zip(kind[rows].tolist(), stage[rows].tolist(), mb[rows].tolist())))
    return out


def reference_programs(block, m):
    """The Python reference, kinds as codes like the kernel's columns."""
    code = block_squeeze._KIND_ORDER
    return [[(code[k], s, j) for k, s, j in prog] for prog in block_squeeze._squeeze_programs(block, m)]


@pytest.mark.parametrize("name", sorted(MAKE))
@pytest.mark.parametrize("p", [1, 2, 3, 4, 5, 6, 7, 9, 12])
def test_kernels_equal_the_python_reference_on_the_v_blocks(name, p):
    block = MAKE[name](p)
    for m in sorted({1, 2, 3, max(1, p - 1), p, 2 * p + 1, 4 * p, 5 * p + 3}):
        assert kernel_programs(block, m) == reference_programs(block, m), (name, p, m)


@pytest.mark.parametrize("name", sorted(MAKE))
def test_build_takes_the_kernels_from_the_threshold_and_gives_the_same_schedule(name, monkeypatch):
    p, m = 8, 96  # 4,608 ops, above the threshold
    assert 6 * p * m >= block_kernels._KERNEL_MIN_OPS
    monkeypatch.setattr(block_kernels, "_PYTHON_MAX_OPS", 0)  # kernels even if they must compile
    calls = []
    squeeze = block_kernels._squeeze_kernels
    monkeypatch.setattr(block_kernels, "_squeeze_kernels", lambda t: calls.append(1) or squeeze(t))
    got = pc.build(name, devices=p, microbatches=m)
    assert calls == [1]
    want = Schedule.from_programs(block_squeeze._squeeze_programs(MAKE[name](p), m), name=name,
                                  devices=p)
    assert got.table.equals(want.table)
    # Below the threshold the reference itself runs.
    small = pc.build(name, devices=4, microbatches=8)
    assert calls == [1]
    assert small.table.equals(Schedule.from_programs(
        block_squeeze._squeeze_programs(MAKE[name](4), 8), name=name, devices=4).table)


def test_build_runs_the_python_reorder_while_the_kernels_would_compile(monkeypatch):
    # From an empty Numba cache the kernels compile for seconds; up to
    # _PYTHON_MAX_OPS ops the Python version (the same programs) runs instead,
    # until the process has spent _PYTHON_BUDGET seconds in it.
    p, m = 8, 256  # 12,288 ops: the study's largest V schedules
    assert block_kernels._KERNEL_MIN_OPS <= 6 * p * m <= block_kernels._PYTHON_MAX_OPS
    calls = []
    squeeze = block_kernels._squeeze_kernels
    monkeypatch.setattr(block_kernels, "_squeeze_kernels", lambda t: calls.append(1) or squeeze(t))
    monkeypatch.setattr(block_kernels.tier, "ready", lambda dispatcher: False)
    monkeypatch.setattr(block_kernels, "_python_spent", 0.0)
    want = Schedule.from_programs(block_squeeze._squeeze_programs(MAKE["v-min"](p), m), name="v-min",
                                  devices=p)
    got = pc.build("v-min", devices=p, microbatches=m)
    assert calls == [] and got.table.equals(want.table)
    assert block_kernels._python_spent > 0
    # The budget spent:
    monkeypatch.setattr(block_kernels, "_python_spent", block_kernels._PYTHON_BUDGET)
    assert pc.build("v-min", devices=p, microbatches=m).table.equals(want.table)
    assert calls == [1]
    # Compiled (or in Numba's cache) kernels run at once.
    monkeypatch.setattr(block_kernels, "_python_spent", 0.0)
    monkeypatch.setattr(block_kernels.tier, "ready", lambda dispatcher: True)
    assert pc.build("v-min", devices=p, microbatches=m).table.equals(want.table)
    assert calls == [1, 1]


@pytest.mark.parametrize("name", sorted(MAKE))
def test_columns_in_two_threads_equal_the_reference(name, monkeypatch):
    # At scale (4M ops) the columns of each device's rows before its last F
    # are written beside the cool-down scheduler, then two threads write
    # the rest, half of the devices each: here at small shapes.
    monkeypatch.setattr(block_kernels, "_COLUMNS_THREADS_MIN_OPS", 0)
    monkeypatch.setattr(block_kernels, "local_cpus", lambda: 2)
    for p, m in ((2, 3), (5, 11), (8, 40)):
        assert kernel_programs(MAKE[name](p), m) == reference_programs(MAKE[name](p), m)


V_ARGS = st.tuples(st.integers(1, 7), st.integers(1, 4), st.integers(1, 4), st.integers(1, 4),
                   st.integers(1, 3), st.integers(0, 5), st.sampled_from([None, 1, 2, 3]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(args=V_ARGS, m=st.integers(1, 24))
def test_kernels_equal_the_python_reference_on_other_v_blocks(args, m):
    p, down, up, tb, tt, shift, tbb = args
    try:
        block = blocks.v_block(p, down, up, tb, tt, shift, "v", tbb)
    except ValueError:  # copies collide or a dependency breaks: not a block
        assume(False)
    assert kernel_programs(block, m) == reference_programs(block, m)


@st.composite
def random_blocks(draw):
    """Chained offsets with gaps; fused BW on some stages; ops of 1 or 2 units."""
    S = draw(st.integers(1, 6))
    drawn = draw(st.lists(st.integers(0, 3), min_size=S, max_size=S))
    # Every device 0..D-1 holds a stage (BuildingBlock fails on an empty device).
    placement = [sorted(set(drawn)).index(d) for d in drawn]
    dur = {"F": draw(st.integers(1, 2)), "B": draw(st.integers(1, 2)),
           "W": draw(st.integers(1, 2)), "BW": draw(st.integers(2, 3))}
    fused = draw(st.lists(st.booleans(), min_size=S, max_size=S))
    gap = st.integers(0, 3)
    o = {("F", 0): draw(gap)}
    for s in range(1, S):
        o[("F", s)] = o[("F", s - 1)] + dur["F"] + draw(gap)
    after = o[("F", S - 1)] + dur["F"]
    for s in range(S - 1, -1, -1):
        back = "BW" if fused[s] else "B"
        o[(back, s)] = after + draw(gap)
        after = o[(back, s)] + dur[back]
        if not fused[s]:
            o[("W", s)] = after + draw(st.integers(0, 6))
    busy = max(sum(dur[k] for (k, s) in o if placement[s] == d) for d in set(placement))
    interval = busy + draw(st.integers(0, 3))
    return placement, o, interval, dur


def _spec_block(spec):
    """The block of a random_blocks spec (an example is dropped if it is none)."""
    placement, offsets, interval, dur = spec
    try:
        return blocks.BuildingBlock(placement, offsets, interval, durations=dur)
    except ValueError:  # copies collide: not a block
        assume(False)


@settings(max_examples=150, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(spec=random_blocks(), m=st.integers(1, 16))
def test_kernels_equal_the_python_reference_on_random_blocks(spec, m):
    block = _spec_block(spec)
    if block_kernels._block_tables(block, m) is None:
        # devices / stages is not a multiple of 2**-20: the kernels decline.
        assert not (block.devices / block.stages * 2 ** 20).is_integer()
        return
    want = reference_programs(block, m)
    assert kernel_programs(block, m) == want
    # As at scale: the rows before each device's last F written beside the
    # cool-down scheduler, the tails by halves of the devices after it.
    with mock.patch.object(block_kernels, "_COLUMNS_THREADS_MIN_OPS", 0), \
            mock.patch.object(block_kernels, "local_cpus", lambda: 2):
        assert kernel_programs(block, m) == want


def test_off_grid_blocks_keep_the_python_path():
    # Offsets off the integer grid: _reorder leaves the order as laid out.
    half = blocks.BuildingBlock((0, 1), {("F", 0): 0.5, ("F", 1): 1.5, ("BW", 1): 2.5,
                                         ("BW", 0): 4.5}, 6.0)
    # An integer grid but an interval of 6.5.
    odd = blocks.BuildingBlock((0, 1), {("F", 0): 0, ("F", 1): 1, ("BW", 1): 2, ("BW", 0): 4}, 6.5)
    # Three stages on two devices: alive counts of 2/3 are not exact floats.
    thirds = blocks.BuildingBlock((0, 1, 0), {("F", 0): 0, ("F", 1): 1, ("F", 2): 2,
                                              ("BW", 2): 3, ("BW", 1): 5, ("BW", 0): 7}, 9)
    for block in (half, odd, thirds):
        assert block_kernels._block_tables(block, 5000) is None
        got = blocks.repeat(block, 5000).squeeze()
        want = Schedule.from_programs(block_squeeze._squeeze_programs(block, 5000), name="block",
                                      devices=block.devices)
        assert got.table.equals(want.table)


def test_the_grids_are_checked_before_they_are_allocated(monkeypatch):
    monkeypatch.setattr(block_kernels, "_GRID_BYTES_MAX", 1 << 20)
    with pytest.raises(MemoryError, match="time grids"):
        block_kernels._block_tables(blocks.v_min(64), 1024)


def _times_reference(rep):
    """``Repeated.times`` as it was before numpy: one tuple per op, one sort."""
    b = rep.block
    out = []
    for j in range(rep.microbatches):
        for (k, s), t in b.offsets.items():
            out.append((t + j * b.interval, b.placement[s], k, s, j))
    out.sort(key=lambda x: (x[1], x[0], block_squeeze._KIND_ORDER[x[2]], x[3], x[4]))
    return out


@pytest.mark.parametrize("block", [
    blocks.v_min(5), blocks.v_zb(4),
    blocks.BuildingBlock((0, 1), {("F", 0): 0.3, ("F", 1): 1.3, ("BW", 1): 2.3, ("BW", 0): 4.3}, 7.5),
    blocks.BuildingBlock((0, 1), {("F", 0): 0, ("F", 1): 1, ("BW", 1): 2, ("BW", 0): 4}, 6),
])
def test_times_equal_the_per_op_sort(block):
    for m in (1, 3, 17):
        rep = blocks.repeat(block, m)
        got, want = rep.times(), _times_reference(rep)
        assert got == want
        assert [tuple(map(type, x)) for x in got] == [tuple(map(type, x)) for x in want]


def _place_w_reference(offsets, placement, stage_order, interval):
    """``blocks._place_w`` as it was: the device's taken slots rescanned per stage."""
    T = int(interval)
    for s in stage_order:
        d = placement[s]
        taken = {int(t) % T for (k, st), t in offsets.items() if placement[st] == d}
        t = int(offsets[("B", s)]) + 1
        while t % T in taken:
            t += 1
        offsets[("W", s)] = float(t)


@pytest.mark.parametrize("p", [1, 2, 3, 5, 8, 13, 40])
def test_w_placement_equals_the_rescanning_version(p, monkeypatch):
    want = {}
    for name, make in MAKE.items():
        with monkeypatch.context() as mp:
            mp.setattr(blocks, "_place_w", _place_w_reference)
            want[name] = make(p).offsets
    for name, make in MAKE.items():
        got = make(p).offsets
        assert got == want[name] and list(got) == list(want[name])


# -- the cool-down scheduler's cut --------------------------------------------
# ``block_kernels._cooldown_kernels`` times the ops before the last microbatches
# by a sweep in layout order and starts its event loop at a cut (``vcooldown._choose_cut``).
# The event loop from the start (cut=False) is the reference here; the tests
# above compare the cut path (the default) with the Python reference.

def _grid(block, m):
    t = block_kernels._block_tables(block, m)
    ostart, order, dptr = block_kernels._reorder_kernels(t)
    return t, ostart, order, dptr


def _cooldown(block, m, cut):
    t, ostart, order, dptr = _grid(block, m)
    return block_kernels._cooldown_kernels(t, order, ostart, dptr, cut)


def _cut_state(block, m):
    """The sweep's and the cut's outputs, as block_kernels._cooldown_kernels computes them."""
    t, ostart, order, dptr = _grid(block, m)
    p = t.devices
    split = np.array([dptr[d] + 1 + np.flatnonzero(t.kind[order[dptr[d]:dptr[d + 1]] // m]
                                                   == 0).max() for d in range(p)])
    ok, ptr, ring, skipped = vcooldown._sweep(t, order, ostart, dptr, split)
    base, free_at, queued = dptr[:-1].copy(), np.zeros(p, np.int64), np.ones(p, np.bool_)
    cut = ok and vcooldown._choose_cut(t, order, dptr, ptr, ring,
                                       vcooldown.LoopState(base, free_at, queued))
    return dict(sweep=ok, cut=cut, base=base, dptr=dptr, queued=queued, skipped=skipped)


def _kernel_block(spec, m):
    """The block of a random_blocks spec, if it is one the kernels take."""
    block = _spec_block(spec)
    assume(block_kernels._block_tables(block, m) is not None)
    return block


def _same_cooldown(block, m):
    got, want = _cooldown(block, m, True), _cooldown(block, m, False)
    assert np.array_equal(got[0], want[0]) and got[1] == want[1] == len(got[0])
    return got[2]


@pytest.mark.parametrize("name", sorted(MAKE))
@pytest.mark.parametrize("p, m", [(4, 16), (16, 64), (32, 200)])
def test_the_cut_is_taken_on_the_v_blocks_and_changes_nothing(name, p, m):
    block = MAKE[name](p)
    swept = _same_cooldown(block, m)
    # The event loop is left with the last microbatches only.
    assert swept > 0.8 * 6 * p * m
    if p == 32:  # a steady phase of many intervals: the sweep skips most of it
        assert _cut_state(block, m)["skipped"] > 0.5 * 6 * p * m
    if p == 16:
        assert kernel_programs(block, m) == reference_programs(block, m)


def test_devices_idle_at_the_cut_run_their_next_op_when_it_was_ready():
    # V-Min and V-Half idle one slot per interval in the steady phase: at the
    # cut some devices are idle and their next op already ran in the loop.
    state = _cut_state(blocks.v_half(16), 64)
    assert state["cut"]
    assert _same_cooldown(blocks.v_half(16), 64) == (state["base"] - state["dptr"][:-1]).sum()
    assert kernel_programs(blocks.v_half(16), 64) == reference_programs(blocks.v_half(16), 64)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(spec=random_blocks(), m=st.integers(1, 60))
def test_the_cut_equals_the_event_loop_on_random_blocks(spec, m):
    _same_cooldown(_kernel_block(spec, m), m)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much])
@given(args=V_ARGS, m=st.integers(1, 80))
def test_the_cut_equals_the_event_loop_on_other_v_blocks(args, m):
    p, down, up, tb, tt, shift, tbb = args
    try:
        block = blocks.v_block(p, down, up, tb, tt, shift, "v", tbb)
    except ValueError:
        assume(False)
    _same_cooldown(block, m)


def test_a_device_waiting_at_the_cut_stays_unqueued():
    # Found by a random search over blocks like random_blocks' (seed 7, one
    # of 47 such cases in 4,294 blocks): at the cut device 0 is idle and
    # its next op's producer has not run, so it waits unqueued.
    block = blocks.BuildingBlock((0, 1), {("F", 0): 0, ("F", 1): 1, ("B", 1): 2, ("W", 1): 5,
                                          ("B", 0): 4, ("W", 0): 9}, 8,
                                 durations={"F": 1, "B": 2, "W": 2, "BW": 2})
    state = _cut_state(block, 23)
    assert state["cut"] and not state["queued"].all()
    assert _same_cooldown(block, 23) > 0
    assert kernel_programs(block, 23) == reference_programs(block, 23)


def test_a_producer_that_left_the_sweeps_ring_turns_the_cut_off():
    # F of stage 1 starts 50 units (16.7 intervals) after F of stage 0 on
    # the other device: more microbatches apart than the ring keeps.
    lag = 50
    block = blocks.BuildingBlock((0, 1), {("F", 0): 0, ("F", 1): lag, ("B", 1): lag + 1,
                                          ("B", 0): lag + 2, ("W", 1): lag + 2,
                                          ("W", 0): lag + 3}, 3)
    assert not _cut_state(block, 40)["sweep"]
    assert _same_cooldown(block, 40) == 0
    assert kernel_programs(block, 40) == reference_programs(block, 40)


def test_the_restart_refuses_a_cross_device_producer_missing_from_the_ring():
    # op 1 (block op 1, microbatch 0; m = 1) waits for op 0 on another device;
    # the ring's entry for op 0 holds another microbatch: no cut (jb = -1).
    order = np.array([0, 1], np.int32)
    dptr = np.array([0, 1, 2], np.int64)
    base = np.array([1, 1], np.int64)  # op 0 ran before the cut, op 1 after
    l_prod = np.array([[-1], [0]], np.int64)
    l_dev = np.array([0, 1], np.int64)
    R = 1 << vcooldown._RING_BITS
    ring = np.full(2 * R, -1, np.int64)
    ring[0] = (R << 32) | 5  # microbatch R's finish, in op 0's slot
    _done, jb = vcooldown._done_after(order, dptr, base, l_prod, l_dev, 1, ring, True)
    assert jb == -1
    ring[0] = 7  # microbatch 0 finished at 7
    done, jb = vcooldown._done_after(order, dptr, base, l_prod, l_dev, 1, ring, True)
    assert jb == 0 and done[blockops._tile(0, 0, 2)] == 7 and done[blockops._tile(1, 0, 2)] == -1


# -- the reorder's windows ---------------------------------------------------
# ``block_kernels._reorder_kernels`` stores only the grid's warm-up and cool-down
# windows when the steady phase between them spans more than an interval,
# and then moves the warm-up and the cool-down ops separately (in two
# threads at scale); the whole grid (window=False), one call of the moves
# over all ops, is the reference.

def _same_reorder(block, m):
    t = block_kernels._block_tables(block, m)
    want = block_kernels._reorder_kernels(t, window=False)
    for threads in (False, True):
        got = block_kernels._reorder_kernels(t, threads=threads)
        for a, b in zip(got, want):
            assert np.array_equal(a, b)


@pytest.mark.parametrize("name", sorted(MAKE))
@pytest.mark.parametrize("p, m", [(3, 150), (8, 200), (16, 300)])
def test_the_windowed_reorder_equals_the_whole_grid_on_the_v_blocks(name, p, m):
    block = MAKE[name](p)
    t = block_kernels._block_tables(block, m)
    # The windows leave out slots and whole microbatches here.
    A, B, j0, j1 = block_kernels._reorder_windows(t)
    assert B > A and j1 > j0
    _same_reorder(block, m)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(spec=random_blocks(), m=st.one_of(st.integers(1, 60), st.integers(200, 500)))
def test_the_windowed_reorder_equals_the_whole_grid_on_random_blocks(spec, m):
    # Windows need [A, B) to span an interval and a superblock (256 slots):
    # most blocks have them from m = 200 on.
    _same_reorder(_kernel_block(spec, m), m)


# -- the reorder's rounds ----------------------------------------------------
# ``reorder_moves`` stops after a round once no op can move in the next one
# (only an F whose alive-count check stopped it, after a later last
# backward op lowered the count that stopped it). The Python reference
# always runs the next round. These blocks were found by an exhaustive
# search over two-stage blocks (gaps 0 to 5) with the Python reference
# counting its moves per round: at m=5 its second round moves 10 to 12 ops.
SECOND_ROUND_BLOCKS = [
    ({("F", 0): 0, ("F", 1): 4, ("B", 1): 6, ("W", 1): 11, ("B", 0): 10, ("W", 0): 11}, 3),
    ({("F", 0): 0, ("F", 1): 4, ("B", 1): 8, ("W", 1): 9, ("B", 0): 11, ("W", 0): 16}, 3),
    ({("F", 0): 0, ("F", 1): 5, ("B", 1): 8, ("W", 1): 14, ("B", 0): 13, ("W", 0): 14}, 4),
]


def _rounds_run(t, **kw):
    """``_reorder_kernels(t)`` and the rounds each ``reorder_moves`` call ran."""
    ran = []
    real = block_kernels.reorder_moves

    def counted(*a):
        n_moves, n_rounds = real(*a)
        ran.append(n_rounds)
        return n_moves, n_rounds

    with mock.patch.object(block_kernels, "reorder_moves", counted):
        out = block_kernels._reorder_kernels(t, **kw)
    return out, ran


@pytest.mark.parametrize("offsets, interval", SECOND_ROUND_BLOCKS)
def test_a_second_round_runs_when_a_last_backward_move_frees_a_stopped_f(offsets, interval):
    block = blocks.BuildingBlock([0, 1], offsets, interval,
                                 durations={"F": 1, "B": 1, "W": 1, "BW": 2})
    m = 5
    t = block_kernels._block_tables(block, m)
    one = block_kernels._reorder_kernels(t, rounds=1)
    out, ran = _rounds_run(t)
    # The second round changes the result here...
    assert not all(np.array_equal(a, b) for a, b in zip(one, out))
    assert max(ran) >= 2
    # ... and the kernels still equal the reference, which always runs it.
    assert kernel_programs(block, m) == reference_programs(block, m)


@pytest.mark.parametrize("name", sorted(MAKE))
@pytest.mark.parametrize("p, m", [(4, 40), (16, 300)])
def test_the_v_blocks_reorder_in_one_round(name, p, m):
    # The second round moved nothing on any block searched (the paper's,
    # random ones, v-zb, v-min and v-half up to p=1024): it is skipped.
    t = block_kernels._block_tables(MAKE[name](p), m)
    _out, ran = _rounds_run(t)
    assert ran and all(r == 1 for r in ran)


# -- the reorder's alive counts ----------------------------------------------
# ``_add`` and ``_last_at_least`` keep each device's alive counts in blocks
# and superblocks, each with a maximum and a pending add; a plain array is
# the reference. Ranges up to 3,000 slots cover many superblocks (256 slots).

@settings(max_examples=60, deadline=None)
@given(width=st.integers(1, 3000), seed=st.integers(0, 2 ** 32 - 1))
def test_the_alive_count_blocks_equal_a_plain_array(width, seed):
    rng = np.random.default_rng(seed)
    devices = 2
    nsup = (width + vreorder._SPAN) // vreorder._SPAN  # as reorder_setup sizes them
    nblk = nsup << vreorder._SUPER
    plain = rng.integers(0, 4, size=(devices, width))
    alive = np.zeros((devices, nblk << vreorder._SHIFT), np.int32)
    alive[:, :width] = plain
    bmax = np.empty((devices, nblk), np.int32)
    lazy = np.zeros((devices, nblk), np.int32)
    smax = np.empty((devices, nsup), np.int32)
    slazy = np.zeros((devices, nsup), np.int32)
    for d in range(devices):
        for blk in range(nblk):
            vreorder._block_max(alive, bmax, d, blk)
        for s in range(nsup):
            vreorder._super_max(bmax, lazy, smax, d, s)
    for _ in range(60):
        d = int(rng.integers(devices))
        a, b = sorted(int(x) for x in rng.integers(0, width + 1, 2))
        if rng.random() < 0.5:
            v = int(rng.choice([-1, 1]))
            vreorder._add(alive, bmax, lazy, smax, slazy, d, a, b, v)
            plain[d, a:b] += v
        else:
            level = int(rng.integers(0, 7))
            hits = np.flatnonzero(plain[d, a:b] >= level)
            want = a + int(hits[-1]) if hits.size else -1
            got = vreorder._last_at_least(alive, bmax, lazy, smax, slazy, d, a, b, level)
            assert got == want, (d, a, b, level)


# -- the cool-down's sets of ops ready now -----------------------------------
# ``_now_add`` and ``_now_take`` keep each device's ready codes as bits with a
# bit per non-empty word above them; Python's min over a set is the
# reference. Tails up to 9,000 ops (18,000 codes, five summary words) reach
# past the first summary word, which the kernel tests' small shapes do not.

@settings(max_examples=40, deadline=None)
@given(lengths=st.lists(st.integers(1, 9000), min_size=1, max_size=4),
       seed=st.integers(0, 2 ** 32 - 1))
def test_the_ready_now_sets_equal_python_sets(lengths, seed):
    rng = np.random.default_rng(seed)
    p = len(lengths)
    woff = np.zeros(p + 1, np.int64)  # sized as _event_loop sizes them
    soff = np.zeros(p + 1, np.int64)
    for d, n in enumerate(lengths):
        nw = (2 * n + 63) >> 6
        woff[d + 1] = woff[d] + nw
        soff[d + 1] = soff[d] + ((nw + 63) >> 6)
    bits = np.zeros(woff[p], np.uint64)
    summ = np.zeros(soff[p], np.uint64)
    want = [set() for _ in range(p)]
    for _ in range(400):
        d = int(rng.integers(p))
        if want[d] and rng.random() < 0.45:
            got = vcooldown._now_take(bits, summ, woff, soff, d)
            assert got == min(want[d]), (d, sorted(want[d])[:5])
            want[d].remove(got)
        else:
            free = 2 * lengths[d] - len(want[d])
            if free == 0:
                continue
            b = int(rng.integers(2 * lengths[d]))
            while b in want[d]:
                b = (b + 1) % (2 * lengths[d])
            vcooldown._now_add(bits, summ, woff, soff, d, b)
            want[d].add(b)
    for d in range(p):  # emptied in order, the bits are all clear again
        while want[d]:
            got = vcooldown._now_take(bits, summ, woff, soff, d)
            assert got == min(want[d])
            want[d].remove(got)
    assert not bits.any() and not summ.any()

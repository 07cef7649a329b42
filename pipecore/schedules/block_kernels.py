"""Squeezing a repeated building block with the Numba kernels.

:meth:`Repeated.squeeze <pipecore.schedules.blocks.Repeated.squeeze>`
calls :func:`_squeeze`, which chooses between the pure-Python version
(``block_squeeze``) and the kernels: ``kernels/vreorder.py`` for the
warm-up and cool-down reorder, ``kernels/vcooldown.py`` for the cool-down
scheduler, ``kernels/blockops.py`` for the block's tables and the column
writer. The drivers here pack the block into :class:`BlockTables`,
allocate the kernels' grids, split the work over two threads where it
pays, and give the same programs as the Python version, op for op.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..core import tier
from ..core.cpus import local_cpus
from ..core.ops import CapacityError, InputError
from ..core.rules import _in_halves
from ..core.schedule import Schedule
from ..kernels.blockops import BlockTables, columns
from ..kernels.vcooldown import LoopState, _choose_cut, _done_after, _event_loop, _sweep, _tails
from ..kernels.vreorder import (
    _BLOCK,
    _SPAN,
    _SUPER,
    ReorderGrid,
    Windows,
    reorder_emit,
    reorder_moves,
    reorder_setup,
)
from .block_squeeze import _KIND_ORDER, _producers, _squeeze_programs
from .construct import column_buffers

# From this many ops squeeze(reorder=True) runs the kernels; below it the
# Python version takes less time than loading them from Numba's cache
# (once per process).
_KERNEL_MIN_OPS = 4096
# While the kernels would have to compile first (neither compiled in this
# process nor in Numba's cache), the Python version, far cheaper than that
# compile at this size, runs up to this many ops, until the process has spent
# _PYTHON_BUDGET seconds in such calls; past that they compile, as for any
# larger call.
_PYTHON_MAX_OPS = 1 << 16
_PYTHON_BUDGET = 3.0
_python_spent = 0.0
_KERNELS = (reorder_setup, reorder_moves, reorder_emit, _tails, _sweep, _choose_cut,
            _done_after, _event_loop, columns)
# From this many ops two threads write the columns, half of the devices each.
_COLUMNS_THREADS_MIN_OPS = 1 << 22
# From this many ops two threads set up, move and emit the reorder.
_REORDER_THREADS_MIN_OPS = 1 << 20
# The kernels' two time grids (devices x horizon int32 each) may take this much.
_GRID_BYTES_MAX = 8 << 30
# reorder_moves's sets: the warm-up ops, the cool-down ops.
_WARM, _COOL = 1, 2


def _squeeze(block, microbatches, name, reorder):
    """The schedule of :meth:`Repeated.squeeze`: by the kernels from
    ``_KERNEL_MIN_OPS`` ops when the block fits them (``_block_tables``),
    else by the Python version."""
    global _python_spent
    ops = len(block.offsets) * microbatches
    if reorder and _use_kernels(ops):
        tab = _block_tables(block, microbatches)
        if tab is not None:
            return Schedule.from_arrays(*_squeeze_kernels(tab), name=name,
                                        devices=block.devices, copy=False)
    t0 = time.perf_counter()
    programs = _squeeze_programs(block, microbatches, reorder)
    if reorder and ops >= _KERNEL_MIN_OPS:
        _python_spent += time.perf_counter() - t0
    return Schedule.from_programs(programs, name=name, devices=block.devices)


def _use_kernels(ops):
    """Whether squeeze(reorder=True) of ``ops`` ops runs the kernels (the
    Python version gives the same programs; see _KERNEL_MIN_OPS and
    _PYTHON_MAX_OPS)."""
    if ops < _KERNEL_MIN_OPS:
        return False
    if ops > _PYTHON_MAX_OPS or _python_spent >= _PYTHON_BUDGET:
        return True
    return all(tier.ready(k) for k in _KERNELS)


def _block_tables(block, microbatches):
    """The block's K ops as :class:`BlockTables`, or None when the kernels
    would not take the Python version's decisions.

    They need what ``_reorder`` needs (integer offsets and durations) and
    an integer interval and offsets >= 0 (there ``_reorder`` truncates and
    indexes from the end). They count alive activations in integers, which
    equals ``_reorder``'s float sums of ``devices / stages`` when that is a
    multiple of 2**-20 (the sums are then exact).
    """
    offsets, dur = block.offsets, block.durations
    S, p, m = block.stages, block.devices, microbatches
    T = block.interval
    if not (float(T).is_integer() and all(float(t).is_integer() and t >= 0 for t in offsets.values())
            and all(float(v).is_integer() for v in dur.values())
            and (p / S * 2 ** 20).is_integer()):
        return None
    keys = list(offsets)
    K = len(keys)
    index = {key: i for i, key in enumerate(keys)}
    last = {s: ("BW" if ("BW", s) in offsets else "W") for s in range(S)}
    l_kind = np.array([_KIND_ORDER[k] for k, _s in keys], dtype=np.int8)
    l_off = np.array([int(offsets[key]) for key in keys], dtype=np.int64)
    l_dur = np.array([int(dur[k]) for k, _s in keys], dtype=np.int64)
    prods = [[index[(q[0], q[1])] for q in _producers(k, s, 0, S, offsets)] for k, s in keys]
    cons = [[] for _ in keys]
    for i, ps in enumerate(prods):
        for q in ps:
            cons[q].append(i)
    l_prod = np.full((K, max(1, max(map(len, prods)))), -1, dtype=np.int64)
    l_cons = np.full((K, max(1, max(map(len, cons)))), -1, dtype=np.int64)
    for i in range(K):
        l_prod[i, :len(prods[i])] = prods[i]
        l_cons[i, :len(cons[i])] = cons[i]
    T = int(T)
    horizon = int((l_off + l_dur).max()) + (m - 1) * T + 1
    back0 = "BW" if ("BW", 0) in offsets else "B"
    # Numba does not check bounds: every index the kernels form stays inside these.
    # (Finish times in the cool-down kernel are at most the sum of all durations.)
    if K * m * int(l_dur.max()) >= 2 ** 31 - 1 or horizon >= 2 ** 31 - 1:
        raise InputError(f"{K * m} ops over {horizon} time units exceed the kernels' int32 range")
    grid = 8 * p * (horizon + 1)
    if grid > _GRID_BYTES_MAX:
        raise CapacityError(f"squeezing {K * m} ops needs two {p} x {horizon} time grids "
                            f"({grid / 2 ** 30:.1f} GiB, more than {_GRID_BYTES_MAX / 2 ** 30:.0f})")
    return BlockTables(
        kind=l_kind,
        stage=np.array([s for _k, s in keys], dtype=np.int32),
        dev=np.array([block.placement[s] for _k, s in keys], dtype=np.int64),
        off=l_off, dur=l_dur, prod=l_prod, cons=l_cons,
        is_f=l_kind == _KIND_ORDER["F"],
        is_last=np.array([k == last[s] for k, s in keys]),
        last=np.array([index[(last[s], s)] for _k, s in keys], dtype=np.int64),
        m=m, interval=T, devices=p, horizon=horizon,
        warm_end=int(offsets[(back0, 0)]),
        cool_start=int(offsets[("F", 0)]) + (m - 1) * T)


def _squeeze_kernels(tab):
    """Columns (device, slot, kind, stage, microbatch) of the squeezed schedule
    of the block ``tab`` (:class:`BlockTables`); equal to ``_squeeze_programs``."""
    p = tab.devices
    n = len(tab.dev) * tab.m
    cols = column_buffers(n)
    two = n >= _COLUMNS_THREADS_MIN_OPS and p > 1 and local_cpus() >= 2
    ostart, order, dptr = _reorder_kernels(tab)
    tails = _tails(tab, order, dptr)
    lo, hi = dptr[:-1], dptr[1:]
    kinds = tab.kind, tab.stage
    if two:
        # The cool-down scheduler (one thread) writes over ``order`` only each
        # device's ops after its last F: the rows before are final, so the
        # other CPU writes their columns meanwhile.
        with ThreadPoolExecutor(1) as pool:
            head = pool.submit(columns, order, dptr, lo, tails.split, *kinds, cols, 0, p)
            try:
                out, ran, _swept = _cooldown_kernels(tab, order, ostart, dptr, tails=tails)
            finally:
                head.result()
        lo = tails.split
    else:
        out, ran, _swept = _cooldown_kernels(tab, order, ostart, dptr, tails=tails)
    if ran < len(out):  # pragma: no cover - the layout order is always feasible
        raise RuntimeError("cool-down reordering stalled")
    # Devices own disjoint rows: two threads (the kernel releases the GIL).
    _in_halves(columns, two, p, out, dptr, lo, hi, *kinds, cols)
    return cols


def _reorder_windows(tab, window=True):
    """The :class:`Windows` of the reorder's time grid: slots [0, A) and
    [B, horizon) are stored, and microbatches j0 to j1 lie wholly in [A, B)
    (all 0: the whole grid, when ``window`` is False or [A, B) would be too
    short)."""
    l_off, l_dur, m, T = tab.off, tab.dur, tab.m, tab.interval
    # Only two windows of the time grid are stored: [0, A) holds every slot
    # a warm-up op reads or moves to, [B, horizon) every slot a cool-down op
    # does (its producers start after microbatch j's first F, at least
    # cool_start - max offset); nothing moves in [A, B), where the layout
    # and the alive counts repeat every interval. Whole superblocks in each
    # window, so the two threads of the moves never share one.
    minoff = int(l_off.min())
    maxoff = max(0, int(l_off.max()))
    maxend = max(0, int((l_off + l_dur).max()))
    maxdur = max(0, int(l_dur.max()))
    A = -(-max(tab.warm_end + maxdur, maxend) // _SPAN) * _SPAN
    B = min(tab.cool_start - maxoff, minoff + T * m) // _SPAN * _SPAN
    if B - A < T + _SPAN or not window:
        A = B = 0  # no window: the whole grid
    # Microbatches j0 to j1 start at A or later and end before B.
    j0 = j1 = 0
    if B > A:
        j0 = min(m, max(0, -((minoff - A) // T)))
        j1 = min(m, max(j0, -((maxend - B) // T)))
    return Windows(A, B, j0, j1)


def _reorder_grid(tab, win):
    """The reorder's :class:`ReorderGrid` for the block ``tab`` in the
    windows ``win``, allocated (contents undefined: ``reorder_setup``
    fills them)."""
    p, m, K = tab.devices, tab.m, len(tab.dev)
    H = tab.horizon - (win.B - win.A)
    nsup = (H + _SPAN) // _SPAN  # at least one padding slot after H
    nblk = nsup << _SUPER
    # Starts of the microbatches outside [j0, j1) only, in whole tiles of
    # 64 microbatches by K block ops (``kernels.blockops._tile``).
    start = np.empty(((m - (win.j1 - win.j0) + 63) >> 6) * K * 64, np.int32)
    occ = np.empty((p, H), np.int32)
    alive = np.empty((p, nblk * _BLOCK), np.int32)
    bmax, lazy = np.empty((p, nblk), np.int32), np.empty((p, nblk), np.int32)
    smax, slazy = np.empty((p, nsup), np.int32), np.empty((p, nsup), np.int32)
    return ReorderGrid(start, occ, alive, bmax, lazy, smax, slazy, np.empty(p, np.int32))


def _reorder_kernels(tab, rounds=3, window=True, threads=None):
    """``_reorder`` on the block ``tab`` by ``kernels/vreorder.py``.

    Parameters
    ----------
    tab : BlockTables
        ``_block_tables``'s output.
    rounds : int
        At most this many rounds of moves.
    window : bool
        Store only the grid's warm-up and cool-down windows (the same
        result; False stores the whole grid, the tests' reference).
    threads : bool or None
        Two threads: each sets up and emits half of the devices, and they
        move the warm-up and the cool-down ops at once (with windows, where
        the two are independent). None: when the block has at least
        ``_REORDER_THREADS_MIN_OPS`` ops and two CPUs are free.

    Returns
    -------
    ostart : numpy.ndarray of int32
        The start of ``order[i]``.
    order : numpy.ndarray of int32
        Op ids (``bi * m + j``), device by device, by start.
    dptr : numpy.ndarray of int64
        Device d's ops are ``order[dptr[d]:dptr[d + 1]]``.
    """
    p = tab.devices
    n = len(tab.dev) * tab.m
    if threads is None:
        threads = n >= _REORDER_THREADS_MIN_OPS and local_cpus() >= 2 and p > 1
    win = _reorder_windows(tab, window)
    grid = _reorder_grid(tab, win)
    ostart = np.empty(n, np.int32)
    order = np.empty(n, np.int32)
    dptr = np.zeros(p + 1, np.int64)
    dptr[1:] = np.cumsum(np.bincount(tab.dev, minlength=p) * tab.m)
    half = p // 2
    pool = ThreadPoolExecutor(1) if threads else None
    try:
        if pool is not None:
            other = pool.submit(reorder_setup, tab, win, grid, half, p)
            reorder_setup(tab, win, grid, 0, half)
            other.result()
        else:
            reorder_setup(tab, win, grid, 0, p)
        if win.B <= win.A:
            # No windows: a cool-down op may read a warm-up op's start.
            reorder_moves(_WARM | _COOL, tab, win, grid, rounds)
        elif pool is not None:
            other = pool.submit(reorder_moves, _COOL, tab, win, grid, rounds)
            reorder_moves(_WARM, tab, win, grid, rounds)
            other.result()
        else:
            reorder_moves(_WARM, tab, win, grid, rounds)
            reorder_moves(_COOL, tab, win, grid, rounds)
        if pool is not None:
            other = pool.submit(reorder_emit, tab, win, grid, dptr, order, ostart, half, p)
            reorder_emit(tab, win, grid, dptr, order, ostart, 0, half)
            other.result()
        else:
            reorder_emit(tab, win, grid, dptr, order, ostart, 0, p)
    finally:
        if pool is not None:
            pool.shutdown()
    return ostart, order, dptr


def _cooldown_kernels(tab, order, ostart, dptr, cut=True, tails=None):
    """Each device's program with its ops after the last F re-ordered.

    Event-driven like the Python version: devices take turns by least
    (free time, device) (Python's heap; a tournament tree here); before
    its last F a device runs its ops in order, after it the ready backward
    (B or BW) of lowest rank, else the W of lowest rank, else the op ready
    first. An op becomes ready (and joins its device's "later" heap keyed
    by (ready time, is W, rank)) when its last producer finishes; an
    attempt moves every op ready by then into the "now" set ordered by
    (is W, rank). Finishing an op wakes the devices of its consumers.
    Python keeps a set of waiting devices per op and may queue a device
    twice; waking every consumer device once (a device whose turn is
    pending is not queued again) takes the same decisions, since an
    attempt can only succeed after a wake-up that Python also makes.

    With ``cut``, the ops before the last microbatches get their times from
    ``kernels.vcooldown._sweep`` (in layout order, no event queue) and the
    event loop starts at a time tau in the state it would have reached
    there by itself (``kernels.vcooldown._choose_cut`` says why); the loop
    then covers only the last microbatches. Where the sweep cannot tell,
    the loop runs from the start. Separate kernels called from here, not
    one kernel: a kernel that calls another compiles the callee again
    inside itself, which lengthens the first compile.

    Parameters
    ----------
    tab : BlockTables
        The block's tables (``_block_tables``).
    order : int32 array
        Op ids device by device in layout order (``_reorder_kernels``).
    ostart : int32 array
        Layout start of ``order[i]``.
    dptr : int64 array
        Device d's ops are ``order[dptr[d]:dptr[d + 1]]``.
    cut : bool
        Try the sweep and cut (False: the event loop over every op, the
        tests' reference).
    tails : Tails, optional
        ``kernels.vcooldown._tails`` of ``order`` when the caller has it.

    Returns
    -------
    out : int32 array
        Op ids, device by device in run order (``dptr`` as for ``order``):
        ``order`` itself, overwritten.
    ran : int
        Ops run (all of them unless the programs deadlock).
    swept : int
        Ops timed by the sweep before the cut (0 without a cut).
    """
    m, p = tab.m, tab.devices
    if tails is None:
        tails = _tails(tab, order, dptr)
    swept = 0
    # The event loop starts at these positions.
    state = LoopState(dptr[:-1].copy(), np.zeros(p, np.int64), np.ones(p, np.bool_))
    ring = np.zeros(1, np.int64)
    if cut:
        ok, ptr, ring, _skipped = _sweep(tab, order, ostart, dptr, tails.split)
        if ok and _choose_cut(tab, order, dptr, ptr, ring, state):
            swept = int((state.base - dptr[:-1]).sum())
    if swept > 0:
        done, jb = _done_after(order, dptr, state.base, tab.prod, tab.dev, m, ring, True)
        if jb < 0:  # a producer on another device had left the ring
            swept = 0
    if swept == 0:  # the event loop from the start
        state.base[:] = dptr[:-1]
        state.free_at[:] = 0
        state.queued[:] = True
        done, jb = _done_after(order, dptr, state.base, tab.prod, tab.dev, m, ring, False)
    out, ran = _event_loop(tab, order, dptr, tails, state, done, jb, swept)
    return out, ran, swept

"""The warm-up and cool-down reorder of a repeated building block on its
integer time grid (``schedules.block_kernels._reorder_kernels`` drives it).

``reorder_setup`` lays out every op and counts the activations alive on
each device's slots, ``reorder_moves`` moves warm-up and cool-down ops into
earlier free slots where their inputs are ready and the device's peak does
not rise, and ``reorder_emit`` lists each device's ops by their new start,
as ``schedules.block_squeeze._reorder`` does op for op. The alive counts
live in blocks and superblocks, each with a maximum and a pending add
(``_add``, ``_last_at_least``), so a move or a check over a long range
costs about its length / 256.

error_model="numpy" throughout: no zero-division checks (every divisor is
a count >= 1), which makes the first compile shorter.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from .blockops import _block_of, _tile

# Alive counts are kept in blocks of 2**_SHIFT slots with a per-block
# maximum and pending add, and those in superblocks of 2**_SUPER blocks with
# the same, so a move or a check over a long range costs about its length /
# 256 plus partial blocks and superblocks at its ends (warm-up moves span
# thousands of slots at large p).
_SHIFT = 5
_BLOCK = 1 << _SHIFT
_SUPER = 3
_SPAN = _BLOCK << _SUPER  # slots per superblock


class Windows(NamedTuple):
    """Which part of the time grid the reorder stores (inputs; ``_reorder_windows``).

    Only the windows [0, A) and [B, horizon) of the time grid are stored,
    slot u >= B at u - (B - A) (A = B = 0: the whole grid); microbatches
    j0 to j1 - 1 start at A or later and end before B: none of their ops is
    stored, moves or is read, and their starts are not stored.
    """

    A: int  #: end of the warm-up window (a multiple of ``_SPAN``).
    B: int  #: start of the cool-down window (a multiple of ``_SPAN``), >= A.
    j0: int  #: first microbatch wholly inside [A, B).
    j1: int  #: one past the last such microbatch (j0 = j1: none).


class ReorderGrid(NamedTuple):
    """The reorder's state, allocated by the caller (any content) with the
    shapes ``schedules.block_kernels._reorder_kernels`` gives them; filled by
    ``reorder_setup``, updated by ``reorder_moves``, read by ``reorder_emit``.
    H is the stored width of the grid (horizon - (B - A)).
    """

    start: np.ndarray  #: int32, tiles of 64 microbatches x K (``_tile``): start of each stored op.
    occ: np.ndarray  #: (p, H) int32: the op on device d's stored slot u, -1 free.
    alive: np.ndarray  #: (p, nblk * _BLOCK) int32: activations alive on the slot (less lazy adds).
    bmax: np.ndarray  #: (p, nblk) int32: maximum of ``alive`` over each block.
    lazy: np.ndarray  #: (p, nblk) int32: add pending on each whole block.
    smax: np.ndarray  #: (p, nsup) int32: maximum over each superblock, its blocks' lazy adds in.
    slazy: np.ndarray  #: (p, nsup) int32: add pending on each whole superblock.
    limit: np.ndarray  #: (p,) int32: device d's peak alive count before any move.


class Candidates(NamedTuple):
    """The ops that may move, one entry per candidate (outputs of
    ``_candidates``; ``reorder_moves`` then updates ``st``)."""

    op: np.ndarray  #: (n,) int32: op id ``bi * m + j``.
    dev: np.ndarray  #: (n,) int32: its device.
    bi: np.ndarray  #: (n,) int32: its block op.
    jj: np.ndarray  #: (n,) int32: its stored microbatch (``_inside``).
    st: np.ndarray  #: (n,) int32: its start.


@njit(cache=True, error_model="numpy")
def _block_max(alive, bmax, d, blk):
    x = alive[d, blk << _SHIFT]
    for u in range((blk << _SHIFT) + 1, (blk + 1) << _SHIFT):
        if alive[d, u] > x:
            x = alive[d, u]
    bmax[d, blk] = x


@njit(cache=True, error_model="numpy")
def _super_max(bmax, lazy, smax, d, s):
    x = bmax[d, s << _SUPER] + lazy[d, s << _SUPER]
    for blk in range((s << _SUPER) + 1, (s + 1) << _SUPER):
        x = max(x, bmax[d, blk] + lazy[d, blk])
    smax[d, s] = x


@njit(cache=True, error_model="numpy")
def _add(alive, bmax, lazy, smax, slazy, d, a, b, v):
    """Add v to device d's alive counts on [a, b)."""
    if a >= b:
        return
    ba = a >> _SHIFT
    bb = (b - 1) >> _SHIFT
    if ba == bb:
        for u in range(a, b):
            alive[d, u] += v
        _block_max(alive, bmax, d, ba)
        _super_max(bmax, lazy, smax, d, ba >> _SUPER)
        return
    for u in range(a, (ba + 1) << _SHIFT):
        alive[d, u] += v
    _block_max(alive, bmax, d, ba)
    for u in range(bb << _SHIFT, b):
        alive[d, u] += v
    _block_max(alive, bmax, d, bb)
    # Blocks ba + 1 to bb - 1 are whole: those in a whole superblock get
    # the add there, the others their own.
    sa = ba >> _SUPER
    sb = bb >> _SUPER
    if sa == sb:
        for blk in range(ba + 1, bb):
            lazy[d, blk] += v
    else:
        for blk in range(ba + 1, (sa + 1) << _SUPER):
            lazy[d, blk] += v
        for s in range(sa + 1, sb):
            slazy[d, s] += v
        for blk in range(sb << _SUPER, bb):
            lazy[d, blk] += v
        _super_max(bmax, lazy, smax, d, sb)
    _super_max(bmax, lazy, smax, d, sa)


@njit(cache=True, error_model="numpy")
def _last_at_least(alive, bmax, lazy, smax, slazy, d, a, b, level):
    """The last slot u in [a, b) where device d's alive count is >= level, or -1."""
    u = b - 1
    while u >= a:
        blk = u >> _SHIFT
        s = blk >> _SUPER
        first = blk << _SHIFT
        sz = slazy[d, s]
        if first >= a and u == first + _BLOCK - 1:
            if (u & (_SPAN - 1)) == _SPAN - 1 and u + 1 - _SPAN >= a and smax[d, s] + sz < level:
                u -= _SPAN
                continue
            if bmax[d, blk] + lazy[d, blk] + sz < level:
                u = first - 1
                continue
        lz = lazy[d, blk] + sz
        stop = max(a, first)
        while u >= stop:
            if alive[d, u] + lz >= level:
                return u
            u -= 1
    return -1


@njit(cache=True, error_model="numpy", inline="always")
def _outside(jj, j0, j1):
    """The jj-th microbatch outside [j0, j1)."""
    return jj if jj < j0 else jj + (j1 - j0)


@njit(cache=True, error_model="numpy", inline="always")
def _alive_change(alive, mid, d, u, A, B, v, d0):
    """Add v to device d's alive-count change at slot u: stored at u below A,
    at u - (B - A) from B, summed in ``mid[d - d0]`` in between."""
    if u < A:
        alive[d, u] += v
    elif u >= B:
        alive[d, u - (B - A)] += v
    else:
        mid[d - d0] += v



@njit(cache=True, error_model="numpy", inline="always")
def _inside(j, j0, j1):
    """The outside index jj of microbatch j (not in [j0, j1))."""
    return j if j < j0 else j - (j1 - j0)


@njit(cache=True, error_model="numpy", inline="always")
def _start_of(start, op, m, inv, K, j0, j1):
    """The start of op id ``op`` (``bi * m + j``); inv = 1 / m."""
    bi = _block_of(op, m, inv)
    return start[_tile(bi, _inside(op - bi * m, j0, j1), K)]


@njit(cache=True, error_model="numpy", nogil=True)  # two threads, halves of the devices
def reorder_setup(tab, win, grid, d0, d1):
    """Fill the reorder's grid ``grid`` (:class:`ReorderGrid`) before any
    move, for devices ``d0`` to ``d1`` of the block ``tab``
    (:class:`~.blockops.BlockTables`) laid out in the windows ``win``
    (:class:`Windows`): step 1 of 3. Rows of
    other devices are not touched, so two calls on disjoint ranges may run
    at once.

    An F's activation is alive from its start to the end of the stage's
    last backward (``tab.last``), on the same device. The two alive-count
    changes of a microbatch inside [A, B) cancel there, so it needs no
    stored slot; the ops that may move are listed by ``reorder_moves``
    itself.
    """
    l_dev, l_off, l_dur, l_is_f, l_last = tab.dev, tab.off, tab.dur, tab.is_f, tab.last
    m, T = tab.m, tab.interval
    A, B, j0, j1 = win
    start, occ, alive, bmax, lazy, smax, slazy, limit = grid
    K = l_dev.shape[0]
    D = B - A
    H = occ.shape[1]
    nblk = bmax.shape[1]
    nsup = smax.shape[1]
    n_out = m - (j1 - j0)  # microbatches outside, numbered jj: j = _outside(jj, j0, j1)
    for d in range(d0, d1):
        occ[d, :] = -1
        alive[d, :] = 0
        lazy[d, :] = 0
        slazy[d, :] = 0
    # Starts tile by tile (see ``_tile``), so the writes run in sequence.
    for tile in range((n_out + 63) >> 6):
        for bi in range(K):
            if d0 <= l_dev[bi] < d1:
                for jj in range(tile << 6, min(n_out, (tile + 1) << 6)):
                    start[_tile(bi, jj, K)] = l_off[bi] + _outside(jj, j0, j1) * T
    for bi in range(K):
        d = l_dev[bi]
        if d < d0 or d >= d1:
            continue
        for jj in range(n_out):
            j = _outside(jj, j0, j1)
            op = bi * m + j
            t = l_off[bi] + j * T
            for u in range(t, t + l_dur[bi]):
                if u < A:
                    occ[d, u] = op
                elif u >= B:
                    occ[d, u - D] = op
    mid = np.zeros(d1 - d0, np.int32)  # alive-count changes in [A, B), by d - d0
    for bi in range(K):
        d = l_dev[bi]
        if l_is_f[bi] and d0 <= d < d1:
            z = l_last[bi]
            for jj in range(n_out):
                j = _outside(jj, j0, j1)
                _alive_change(alive, mid, d, l_off[bi] + j * T, A, B, 1, d0)
                _alive_change(alive, mid, d, l_off[z] + j * T + l_dur[z], A, B, -1, d0)
    # The counts in [A, B) repeat every T (no microbatch is cut off there:
    # A >= every op's end, B <= every op's start + T * (m - 1)), and so do
    # those of [B, B + T): the peak of the stored slots is the device's.
    for d in range(d0, d1):
        limit[d] = 0
        c = 0
        for u in range(H):
            if u == A:
                c += mid[d - d0]
            c += alive[d, u]
            alive[d, u] = c
            if c > limit[d]:
                limit[d] = c
        for blk in range(nblk):
            _block_max(alive, bmax, d, blk)
        for sup in range(nsup):
            _super_max(bmax, lazy, smax, d, sup)


@njit(cache=True, error_model="numpy")
def _stable_by_key(key, n_keys, src, dst, count):
    """``dst``: the items ``src`` ordered by ``key[item]`` (0 to n_keys - 1),
    ties in their order in ``src`` (a counting sort; ``count`` is scratch of
    n_keys + 1 or more)."""
    count[:n_keys + 1] = 0
    for k in range(src.shape[0]):
        count[key[src[k]] + 1] += 1
    for c in range(n_keys):
        count[c + 1] += count[c]
    for k in range(src.shape[0]):
        c = key[src[k]]
        dst[count[c]] = src[k]
        count[c] += 1


@njit(cache=True, error_model="numpy")
def _by_start(cdev, cst, devices, horizon, count, by_dev, visit):
    """``visit``: the candidates by start, ties (on different devices) by
    device, as the Python version's stable sort of a list ordered by
    (device, start) gives them: by device, then stably by start."""
    for k in range(cdev.shape[0]):
        visit[k] = k
    _stable_by_key(cdev, devices, visit, by_dev, count)
    _stable_by_key(cst, horizon, by_dev, visit, count)


@njit(cache=True, error_model="numpy")
def _candidates(tab, win, which, order, qq, rr, cand):
    """The ops that may move by layout start, ties by device: written to
    ``cand`` (:class:`Candidates`) when its arrays have room; returns how
    many. ``which``: 1 the warm-up ops (start < warm_end), 2 the cool-down
    ops (start > cool_start, the others), 3 both. Block op bi starts at
    (qq[bi] + j) * T + rr[bi] in microbatch j, so the starts in [w * T,
    (w + 1) * T) are those of the block ops by (rr, device) (``order``),
    each of microbatch j = w - qq[bi], where that is a stored microbatch."""
    l_dev, m, T, warm_end, cool_start = tab.dev, tab.m, tab.interval, tab.warm_end, tab.cool_start
    j0, j1 = win.j0, win.j1
    cop, cdev, cbi, cjj, cst = cand
    K = l_dev.shape[0]
    w_top = 0
    for bi in range(K):
        w_top = max(w_top, qq[bi] + m - 1)
    w_lo = 0 if which & 1 else max(0, (cool_start + 1) // T)
    w_hi = w_top if which & 2 else min(w_top, (warm_end - 1) // T)
    fill = cop.shape[0]
    n = 0
    for w in range(w_lo, w_hi + 1):
        for x in range(K):
            bi = order[x]
            j = w - qq[bi]
            # (Microbatches j0 to j1 start after warm_end and end before
            # cool_start; skipped anyway: their starts are not stored.)
            if j < 0 or j >= m or (j0 <= j < j1):
                continue
            t = w * T + rr[bi]
            if t < warm_end:
                if not which & 1:
                    continue
            elif t <= cool_start or not which & 2:
                continue
            if n < fill:
                cop[n] = bi * m + j
                cdev[n] = l_dev[bi]
                cbi[n] = bi
                cjj[n] = _inside(j, j0, j1)
                cst[n] = t
            n += 1
    return n


@njit(cache=True, error_model="numpy", nogil=True)  # warm-up and cool-down in two threads
def reorder_moves(which, tab, win, grid, rounds):
    """Move the warm-up ops (``which`` 1), the cool-down ops (2) or both (3)
    of the block ``tab`` (:class:`~.blockops.BlockTables`) into earlier free
    slots of ``grid`` (:class:`ReorderGrid`, windows ``win``), in place
    (step 2 of 3; the warm-up ops start before ``tab.warm_end``, the
    cool-down ops after ``tab.cool_start``).

    Each round visits the ops by start (ties by device) and moves each to
    the first free slot after its producers end; an F only as far as keeps
    every alive count it passes at or below the device's peak. Stops after
    ``rounds`` rounds, or a round after which no op can move (see the
    round's comment; the Python version runs that round and moves
    nothing). With windows (``B > A``) the
    warm-up ops and the cool-down ops touch disjoint slots and starts, so
    two calls, one per set, may run at once and equal one call on both.
    ``grid.start`` holds the layout's starts when called.

    Returns
    -------
    n_moves : int
        The number of moves.
    n_rounds : int
        Rounds run.
    """
    l_dev, l_off, l_dur, l_prod, l_is_f, l_is_last = (tab.dev, tab.off, tab.dur, tab.prod,
                                                      tab.is_f, tab.is_last)
    T, devices, horizon = tab.interval, tab.devices, tab.horizon
    A, B = win.A, win.B
    start, occ, alive, bmax, lazy, smax, slazy, limit = grid
    K = l_dev.shape[0]
    D = B - A
    n_moves = 0
    # The first round's order comes from the layout itself (no sort): the
    # candidates' block ops by start within an interval, interval by
    # interval; per candidate its id, device, block op, stored microbatch
    # and start, read in this order.
    qq = np.empty(K, np.int64)
    rr = np.empty(K, np.int64)
    key = np.empty(K, np.int64)
    for bi in range(K):
        qq[bi] = l_off[bi] // T
        rr[bi] = l_off[bi] - qq[bi] * T
        key[bi] = rr[bi] * devices + l_dev[bi]
    order = np.argsort(key, kind="mergesort")
    none = np.empty(0, np.int32)
    n_cand = _candidates(tab, win, which, order, qq, rr, Candidates(none, none, none, none, none))
    cop = np.empty(n_cand, np.int32)
    cdev = np.empty(n_cand, np.int32)
    cbi = np.empty(n_cand, np.int32)
    cjj = np.empty(n_cand, np.int32)
    cst = np.empty(n_cand, np.int32)
    _candidates(tab, win, which, order, qq, rr, Candidates(cop, cdev, cbi, cjj, cst))
    by_dev = np.empty(n_cand, np.int32)  # candidate numbers
    visit = np.empty(n_cand, np.int32)
    count = np.empty(max(devices, horizon) + 1, np.int64)
    x_lo = np.empty(devices, np.int64)
    x_hi = np.empty(devices, np.int64)
    for k in range(n_cand):
        visit[k] = k
    for _round in range(rounds):
        if _round > 0:
            _by_start(cdev, cst, devices, horizon, count, by_dev, visit)
        moved = False
        # A later round can move only an F whose check stopped it in this
        # one (the ops visited after an op start later, so their moves free
        # slots only after it, and its producers, which start earlier, were
        # visited before it), and only once the count at x, the last slot
        # that stopped it, drops: by the move of a last backward op visited
        # after it on its device. The slots x of the round's stopped Fs lie
        # in [x_lo[d], x_hi[d]] per device.
        again = False
        x_lo[:] = horizon
        x_hi[:] = -1
        for k in range(n_cand):
            i = visit[k]
            op = cop[i]
            bi = cbi[i]
            jj = cjj[i]
            d = cdev[i]
            t = cst[i]
            ln = l_dur[bi]
            ready = 0
            for r in range(l_prod.shape[1]):
                q = l_prod[bi, r]
                if q >= 0:
                    e = start[_tile(q, jj, K)] + l_dur[q]
                    if e > ready:
                        ready = e
            if ready >= t:
                continue
            # Both ends lie in one window: slots from ready on at u - sh.
            sh = 0 if ready < A else D
            lo = ready
            if l_is_f[bi]:
                # An earlier F is alive over [slot, t): those counts must stay <= the peak.
                x = _last_at_least(alive, bmax, lazy, smax, slazy, d, ready - sh, t - sh, limit[d])
                if x >= 0:
                    lo = max(ready, x + sh + 1)
                    x_lo[d] = min(x_lo[d], x)
                    x_hi[d] = max(x_hi[d], x)
            for slot in range(lo - sh, t - sh):
                free = True
                for u in range(slot, slot + ln):
                    x = occ[d, u]
                    if x != -1 and x != op:
                        free = False
                        break
                if not free:
                    continue
                for u in range(t - sh, t - sh + ln):
                    occ[d, u] = -1
                for u in range(slot, slot + ln):
                    occ[d, u] = op
                start[_tile(bi, jj, K)] = slot + sh
                cst[i] = slot + sh
                if l_is_f[bi]:
                    _add(alive, bmax, lazy, smax, slazy, d, slot, t - sh, 1)
                elif l_is_last[bi]:
                    _add(alive, bmax, lazy, smax, slazy, d, slot + ln, t - sh + ln, -1)
                    if slot + ln <= x_hi[d] and x_lo[d] < t - sh + ln:
                        again = True
                moved = True
                n_moves += 1
                break
        if not moved or not again:
            return n_moves, _round + 1
    return n_moves, rounds


@njit(cache=True, error_model="numpy", nogil=True)  # two threads, halves of the devices
def reorder_emit(tab, win, grid, dptr, order, ostart, d0, d1):
    """Devices ``d0`` to ``d1``'s ops by start after the moves (step 3 of
    3), read from ``grid`` (:class:`ReorderGrid`, windows ``win``) and
    written to ``order`` (op ids, device by device, by start) and
    ``ostart`` (the start of ``order[i]``), both (K * m,) int32 allocated by
    the caller; device d's ops go to ``order[dptr[d]:dptr[d + 1]]`` (int64,
    p + 1 entries)."""
    l_dev, l_off, m, T, horizon = tab.dev, tab.off, tab.m, tab.interval, tab.horizon
    A, B, j0, j1 = win
    start, occ = grid.start, grid.occ
    K = l_dev.shape[0]
    D = B - A
    # Each block op's start slot within the interval, by device (the block's
    # ops do not collide, so at most one per slot): the ops starting in [A, B).
    at = np.full((d1 - d0, T), -1, np.int64)
    for bi in range(K):
        if d0 <= l_dev[bi] < d1:
            at[l_dev[bi] - d0, l_off[bi] % T] = bi
    inv = 1.0 / m  # for _block_of
    for d in range(d0, d1):
        w = dptr[d]
        # An op's slots are consecutive: it starts at u unless it holds u - 1.
        for u in range(A):
            op = occ[d, u]
            if op >= 0 and (u == 0 or occ[d, u - 1] != op):
                order[w] = op
                ostart[w] = u
                w += 1
        r = A % T
        invT = 1.0 / T  # for _block_of: u - offset is a multiple of T here
        for u in range(A, B):
            bi = at[d - d0, r]
            if bi >= 0 and u >= l_off[bi]:
                j = _block_of(u - l_off[bi], T, invT)
                if j < m:
                    order[w] = bi * m + j
                    ostart[w] = u
                    w += 1
            r += 1
            if r == T:
                r = 0
        for u in range(max(A, B), horizon):
            op = occ[d, u - D]
            # Slot B - 1 is not stored (unless there are no windows): an op
            # held at B may have started before it (then it went out above).
            if op >= 0 and (occ[d, u - D - 1] != op if u > B else
                            _start_of(start, op, m, inv, K, j0, j1) == u):
                order[w] = op
                ostart[w] = u
                w += 1


"""The building blocks' squeeze (``schedules.blocks``) on flat arrays.

The reorder (``reorder_setup``, ``reorder_moves``, ``reorder_emit``,
driven by ``blocks._reorder_kernels``) moves warm-up and cool-down ops into
earlier free slots of the integer time grid, as ``blocks._reorder`` does;
the cool-down
scheduler (``_event_loop``, driven by ``blocks._cooldown_kernels``)
re-orders each device's ops after its last forward, as
``blocks._greedy_cooldown`` does. Both equal the Python versions (kept as
the tested references) op for op. The cool-down scheduler gets the times of
the ops before its last microbatches from ``_sweep`` (in layout order, no
event queue, skipping intervals that repeat the one before) and starts its
event loop at a cut (``_choose_cut``) in the state the loop itself would
have reached there.

Ops are numbered ``bi * m + j``: op bi of the block's K ops (``(kind,
stage)`` pairs), microbatch j. A producer or consumer of an op is an op of
the same microbatch, so the block's K-row tables describe every op; a
device's ops run through consecutive ids, which keeps the memory accesses
close together.
"""

from __future__ import annotations

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import trailing_zeros

# Kind codes (core.ops): F=0, B=1, W=2, BW=3.
# error_model="numpy": no zero-division checks (every divisor is a count
# >= 1), which cuts the first compile from about 14 s to 11 s.


# Alive counts are kept in blocks of 2**_SHIFT slots with a per-block
# maximum and pending add, and those in superblocks of 2**_SUPER blocks with
# the same, so a move or a check over a long range costs about its length /
# 256 plus partial blocks and superblocks at its ends (v-zb's warm-up
# moves span about 6,000 slots at p=1024).
_SHIFT = 5
_BLOCK = 1 << _SHIFT
_SUPER = 3
_SPAN = _BLOCK << _SUPER  # slots per superblock


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
def _block_of(op, m, inv):
    """op // m by a float product (inv = 1 / m), corrected to the exact
    quotient: an integer division per op took most of the time of the
    kernels that go over every op."""
    bi = np.int64(op * inv)
    if bi * m > op:
        bi -= 1
    elif (bi + 1) * m <= op:
        bi += 1
    return bi


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
def _kept(bi, jj, K):
    """Where op bi of outside microbatch jj (``_outside``) keeps its start:
    in tiles of 64 microbatches that hold all K block ops' 64 starts each,
    so ops close in time are close in memory (a move reads its producers'
    starts, K rows apart in a by-op array, 32 KB at m=8192)."""
    return (((jj >> 6) * K + bi) << 6) + (jj & 63)


@njit(cache=True, error_model="numpy", inline="always")
def _inside(j, j0, j1):
    """The outside index jj of microbatch j (not in [j0, j1))."""
    return j if j < j0 else j - (j1 - j0)


@njit(cache=True, error_model="numpy", inline="always")
def _start_of(start, op, m, inv, K, j0, j1):
    """The start of op id ``op`` (``bi * m + j``); inv = 1 / m."""
    bi = _block_of(op, m, inv)
    return start[_kept(bi, _inside(op - bi * m, j0, j1), K)]


@njit(cache=True, error_model="numpy", nogil=True)  # two threads, halves of the devices
def reorder_setup(l_dev, l_off, l_dur, l_is_f, l_last, m, interval, warm_end, cool_start, A, B,
                  j0, j1, start, occ, alive, bmax, lazy, smax, slazy, limit, d0, d1):
    """The reorder's grids before any move, for devices ``d0`` to ``d1``
    (step 1 of 3; rows of other devices are not touched, so two calls on
    disjoint ranges may run at once).

    ``occ[d, u]`` is the op on device d's unit slot u (-1 free) and
    ``alive[d, u]`` the number of activations alive there (an F's lives from
    its start to the end of the stage's last backward, ``l_last``, on the
    same device), with per-block maxima ``bmax`` and pending adds ``lazy``
    (per superblock: ``smax``, ``slazy``); ``limit[d]`` is device d's
    initial peak. All are allocated by the caller (any content) with the
    shapes ``blocks._reorder_kernels`` gives them. Only the windows [0, A)
    and [B, horizon) of the time grid are stored, slot u >= B at
    u - (B - A) (A = B = 0: the whole grid); microbatches ``j0`` to ``j1``
    start at A or later and end before B: none of their ops is stored,
    moves or is read, each F's two alive-count changes cancel in [A, B),
    and their starts are not stored (``start`` holds the others', see
    ``_kept``).

    The ops that may move are listed by ``reorder_moves`` itself.
    """
    K = l_dev.shape[0]
    T = interval
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
    # Starts tile by tile (see _kept), so the writes run in sequence.
    for tile in range((n_out + 63) >> 6):
        for bi in range(K):
            if d0 <= l_dev[bi] < d1:
                for jj in range(tile << 6, min(n_out, (tile + 1) << 6)):
                    start[_kept(bi, jj, K)] = l_off[bi] + _outside(jj, j0, j1) * T
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
def _candidates(order, qq, rr, l_dev, m, T, j0, j1, warm_end, cool_start, which, cop, cdev, cbi,
                cjj, cst):
    """The ops that may move by layout start, ties by device: written to the
    c* arrays when they have room; returns how many. ``which``: 1 the
    warm-up ops (start < warm_end), 2 the cool-down ops (start >
    cool_start, the others), 3 both. Block op bi starts at (qq[bi] + j) * T
    + rr[bi] in microbatch j, so the starts in [w * T, (w + 1) * T) are
    those of the block ops by (rr, device) (``order``), each of microbatch
    j = w - qq[bi], where that is a stored microbatch."""
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
def reorder_moves(which, start, occ, alive, bmax, lazy, smax, slazy, limit, l_dev, l_off, l_dur,
                  l_prod, l_is_f, l_is_last, m, interval, warm_end, cool_start, devices, horizon,
                  A, B, j0, j1, rounds):
    """Move the warm-up ops (``which`` 1), the cool-down ops (2) or both (3)
    into earlier free slots, in place (step 2 of 3; the warm-up ops start
    before ``warm_end``, the cool-down ops after ``cool_start``).

    Each round visits the ops by start (ties by device) and moves each to
    the first free slot after its producers end; an F only as far as keeps
    every alive count it passes at or below the device's peak. Stops after
    ``rounds`` rounds, or a round after which no op can move (see the
    round's comment; the Python version runs that round and moves
    nothing). With windows (``B > A``) the
    warm-up ops and the cool-down ops touch disjoint slots and starts, so
    two calls, one per set, may run at once and equal one call on both.
    ``start`` is indexed by ``_kept`` (microbatches ``j0`` to ``j1`` are not
    stored) and holds the layout's starts when called.

    Returns
    -------
    n_moves : int
        The number of moves.
    n_rounds : int
        Rounds run.
    """
    K = l_dev.shape[0]
    D = B - A
    T = interval
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
    n_cand = _candidates(order, qq, rr, l_dev, m, T, j0, j1, warm_end, cool_start, which, none,
                         none, none, none, none)
    cop = np.empty(n_cand, np.int32)
    cdev = np.empty(n_cand, np.int32)
    cbi = np.empty(n_cand, np.int32)
    cjj = np.empty(n_cand, np.int32)
    cst = np.empty(n_cand, np.int32)
    _candidates(order, qq, rr, l_dev, m, T, j0, j1, warm_end, cool_start, which, cop, cdev, cbi,
                cjj, cst)
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
                    e = start[_kept(q, jj, K)] + l_dur[q]
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
                start[_kept(bi, jj, K)] = slot + sh
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
def reorder_emit(start, occ, l_dev, l_off, m, interval, horizon, A, B, j0, j1, dptr, ostart,
                 order, d0, d1):
    """Devices ``d0`` to ``d1``'s ops by start after the moves (step 3 of
    3), written to ``order`` (op ids, device by device, by start) and
    ``ostart`` (the start of ``order[i]``), both (K * m,) int32 allocated by
    the caller; device d's ops go to ``order[dptr[d]:dptr[d + 1]]``."""
    K = l_dev.shape[0]
    T = interval
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


@njit(cache=True, error_model="numpy")
def _tile(bi, j, K):
    """Index of op (bi, j) in arrays tiled by 64 microbatches: the ops of
    all block ops for microbatches 64k..64k+63 share pages, so one step of
    the list scheduler touches far fewer pages than with a row per block
    op (TLB misses took most of its time)."""
    return (((j >> 6) * K + bi) << 6) | (j & 63)


_IDLE = np.int64(1) << 62  # key of a device that waits for a wake-up


@njit(cache=True, error_model="numpy")
def _ready_at(l_prod, done, bi, j, K):
    """When op (bi, j)'s producers have all finished, or -1 while one has not
    (``j`` counted from the first microbatch ``done`` holds)."""
    t = 0
    for r in range(l_prod.shape[1]):
        q = l_prod[bi, r]
        if q >= 0:
            x = done[_tile(q, j, K)]
            if x < 0:
                return -1
            t = max(t, x)
    return t


@njit(cache=True, error_model="numpy")
def _set_turn(tk, td, leaves, d, t):
    """Set device d's key to t (``_IDLE``: not queued) and replay its
    matches up the tree; node i holds its match's winner, key ``tk[i]``
    and device ``td[i]`` (leaf ``leaves + d`` is device d), so ``td[1]`` is
    the device of least (key, device), as the top of Python's heap of
    (time, device). The winner climbs in registers: a level reads only its
    sibling, no load waits on another."""
    i = leaves + d
    tk[i] = t
    wk = t
    wd = np.int64(d)
    while i > 1:
        sk = tk[i ^ 1]
        sd = td[i ^ 1]
        take = (sk < wk) | ((sk == wk) & (sd < wd))
        wk = sk if take else wk
        wd = sd if take else wd
        i >>= 1
        tk[i] = wk
        td[i] = wd


@njit(cache=True, error_model="numpy")
def _key_push(kt, kc, ki, lo, size, t, c, op):
    """Push op with key (t, c) on the heap in kt/kc/ki[lo:lo + size]."""
    i = size
    kt[lo + i] = t
    kc[lo + i] = c
    ki[lo + i] = op
    while i > 0:
        parent = (i - 1) >> 1
        x = lo + i
        y = lo + parent
        if kt[x] < kt[y] or (kt[x] == kt[y] and kc[x] < kc[y]):
            kt[x], kt[y] = kt[y], kt[x]
            kc[x], kc[y] = kc[y], kc[x]
            ki[x], ki[y] = ki[y], ki[x]
            i = parent
        else:
            break
    return size + 1


@njit(cache=True, error_model="numpy")
def _key_pop(kt, kc, ki, lo, size):
    """Remove the smallest key (moved to index lo + size - 1); returns the new size."""
    size -= 1
    x = lo
    y = lo + size
    kt[x], kt[y] = kt[y], kt[x]
    kc[x], kc[y] = kc[y], kc[x]
    ki[x], ki[y] = ki[y], ki[x]
    i = 0
    while True:
        a = 2 * i + 1
        if a >= size:
            break
        c = a
        if a + 1 < size:
            xa = lo + a
            xb = lo + a + 1
            if kt[xb] < kt[xa] or (kt[xb] == kt[xa] and kc[xb] < kc[xa]):
                c = a + 1
        x = lo + i
        y = lo + c
        if kt[y] < kt[x] or (kt[y] == kt[x] and kc[y] < kc[x]):
            kt[x], kt[y] = kt[y], kt[x]
            kc[x], kc[y] = kc[y], kc[x]
            ki[x], ki[y] = ki[y], ki[x]
            i = c
        else:
            break
    return size


@njit(cache=True, error_model="numpy", inline="always")
def _now_add(bits, summ, woff, soff, d, b):
    """Put code b in device d's set of ops ready now (a bit per code, and a
    bit per non-empty word of those)."""
    w = b >> 6
    bits[woff[d] + w] |= np.uint64(1) << np.uint64(b & 63)
    summ[soff[d] + (w >> 6)] |= np.uint64(1) << np.uint64(w & 63)


@njit(cache=True, error_model="numpy", inline="always")
def _now_take(bits, summ, woff, soff, d):
    """Remove and return the least code in device d's (non-empty) set of
    ops ready now."""
    s = soff[d]
    while summ[s] == 0:
        s += 1
    x = summ[s]
    w = ((s - soff[d]) << 6) + trailing_zeros(x)
    y = bits[woff[d] + w]
    b = (w << 6) + trailing_zeros(y)
    y &= y - np.uint64(1)
    bits[woff[d] + w] = y
    if y == 0:
        summ[s] = x & (x - np.uint64(1))
    return b


# The sweep keeps the finish of each block op's last 2**_RING_BITS
# microbatches (a cross-device producer is read a few time units after it
# ran), tries to skip ahead every _JUMP_EVERY intervals, and looks at most
# _WALK ops back on a device when it chooses the cut.
_RING_BITS = 4
_JUMP_EVERY = 8
_WALK = 64


@njit(cache=True, error_model="numpy")
def _ring_finish(ring, bi, j):
    """Finish of op (bi, j) from the sweep's ring, or -1 if it has left it."""
    x = ring[(bi << _RING_BITS) | (j & ((1 << _RING_BITS) - 1))]
    return x & 0xFFFFFFFF if (x >> 32) == j else -1


@njit(cache=True, error_model="numpy")
def _periods(order, ostart, dptr, split, ptr, ptr_snap, m, T, u, stop):
    """How many intervals the sweep may skip at layout time u: every
    device's ops from ``ptr_snap`` (its first op at u - T or later) on
    repeat the interval before (same block op, next microbatch, T later)
    that many times over, before ``stop``; 0 if one does not."""
    p = ptr.shape[0]
    k = np.int64(-1)
    for d in range(p):
        n_d = ptr[d] - ptr_snap[d]
        if n_d <= 0:
            return 0
        # Each op of the interval can move up as many microbatches as it has left.
        cap = m
        for i in range(ptr_snap[d], ptr[d]):
            cap = min(cap, m - 1 - order[i] % m)
        # The first op at or after stop (ostart is sorted on a device), by bisection.
        lo = ptr[d]
        hi = split[d]
        while lo < hi:
            mid = (lo + hi) >> 1
            if ostart[mid] < stop:
                lo = mid + 1
            else:
                hi = mid
        end = min(ptr_snap[d] + n_d * cap, lo - n_d)
        # Compared in blocks without an early exit (vectorised), then op by op.
        i = ptr_snap[d]
        while i + 256 <= end:
            bad = 0
            for x in range(i, i + 256):
                bad += (order[x + n_d] != order[x] + 1) | (ostart[x + n_d] != ostart[x] + T)
            if bad:
                break
            i += 256
        while i < end and order[i + n_d] == order[i] + 1 and ostart[i + n_d] == ostart[i] + T:
            i += 1
        k_d = (i - ptr_snap[d]) // n_d
        if k < 0 or k_d < k:
            k = k_d
    # The op after the skipped ones must start after them (at u + k * T or later).
    for d in range(p):
        i = ptr[d] + k * (ptr[d] - ptr_snap[d])
        while k > 0 and i < dptr[d + 1] and ostart[i] < u + k * T:
            k -= 1
            i = ptr[d] + k * (ptr[d] - ptr_snap[d])
    return max(k, 0)


@njit(cache=True, error_model="numpy", nogil=True)  # columns are written meanwhile
def _sweep(order, ostart, dptr, split, l_prod, l_dev, l_dur, m, T):
    """Finish times of the fixed ops (up to each device's last F) that start
    in the layout before the first op after any device's last F.

    Such an op runs as soon as its device is free and its producers have
    finished, in its device's order (what the cool-down scheduler does before a
    device's last F). Going through the layout's time slots visits every
    producer before its consumers. Producers on the op's own device come
    earlier in its order, so only those on other devices are read, from a
    ring of each block op's last ``2**_RING_BITS`` microbatches.

    In the steady phase the layout repeats every interval T. When the
    state (each device's free time and the ring) equals that of one
    interval before shifted by T and one microbatch, and the layout ahead
    repeats k more times, the next k intervals would repeat that shift
    too: the sweep adds k * T and k microbatches instead of going through
    them.

    Returns
    -------
    ok : bool
        False when a producer had left the ring (the caller then runs the
        event-driven scheduler from the start).
    ptr : int64 array
        Each device's first op not swept.
    ring : int64 array
        ``j << 32 | finish`` of op (bi, j) at ``bi * R + j % R`` (see
        ``_ring_finish``).
    skipped : int
        Ops skipped by the shifts.
    """
    p = dptr.shape[0] - 1
    K = l_dev.shape[0]
    R = 1 << _RING_BITS
    mask = R - 1
    xprod = np.full((K, l_prod.shape[1]), -1, np.int64)
    for bi in range(K):
        w = 0
        for r in range(l_prod.shape[1]):
            q = l_prod[bi, r]
            if q >= 0 and l_dev[q] != l_dev[bi]:
                xprod[bi, w] = q
                w += 1
    stop = np.int64(-1)
    for d in range(p):
        if split[d] < dptr[d + 1]:
            u = np.int64(ostart[split[d]])
            if stop < 0 or u < stop:
                stop = u
    ring = np.full(R * K, -1, np.int64)
    snap = np.full(R * K, -1, np.int64)
    free = np.zeros(p, np.int64)
    free_snap = np.zeros(p, np.int64)
    ptr = dptr[:-1].copy()
    ptr_snap = ptr.copy()
    inv = 1.0 / m  # for _block_of
    skipped = 0
    check = _JUMP_EVERY * T  # compare the state here with a snapshot at check - T
    u = np.int64(0)
    while u < stop:
        if u == check - T:
            # Loops, not slice copies: those cost seconds of compile time.
            for x in range(R * K):
                snap[x] = ring[x]
            for d in range(p):
                free_snap[d] = free[d]
                ptr_snap[d] = ptr[d]
        elif u == check:
            check += _JUMP_EVERY * T
            same = True
            for d in range(p):
                if free[d] - free_snap[d] != T:
                    same = False
                    break
            for x in range(R * K):
                if not same:
                    break
                bi = x >> _RING_BITS
                a = snap[x]
                if a >= 0:
                    j = (a >> 32) + 1
                    if ring[(bi << _RING_BITS) | (j & mask)] != (j << 32) | ((a & 0xFFFFFFFF) + T):
                        same = False
                a = ring[x]
                if a >= 0:
                    j = (a >> 32) - 1
                    if j < 0 or snap[(bi << _RING_BITS) | (j & mask)] != (
                            (j << 32) | ((a & 0xFFFFFFFF) - T)):
                        same = False
            k = 0
            if same:
                k = _periods(order, ostart, dptr, split, ptr, ptr_snap, m, T, u, stop)
            if k > 0:
                for d in range(p):
                    n_d = ptr[d] - ptr_snap[d]
                    ptr[d] += k * n_d
                    skipped += k * n_d
                    free[d] += k * T
                for x in range(R * K):
                    a = ring[x]
                    if a >= 0:
                        j = (a >> 32) + k
                        snap[((x >> _RING_BITS) << _RING_BITS) | (j & mask)] = (
                            (j << 32) | ((a & 0xFFFFFFFF) + k * T))
                for x in range(R * K):
                    ring[x] = snap[x]
                u += k * T
                check = u + _JUMP_EVERY * T
                continue
        for d in range(p):
            i = ptr[d]
            if i >= split[d]:
                continue
            if ostart[i] != u:
                continue
            op = order[i]
            bi = _block_of(op, m, inv)
            j = op - bi * m
            t = free[d]
            for r in range(xprod.shape[1]):
                q = xprod[bi, r]
                if q < 0:
                    break
                x = _ring_finish(ring, q, j)
                if x < 0:
                    return False, ptr, ring, skipped
                if x > t:
                    t = x
            f = t + l_dur[bi]
            ring[(bi << _RING_BITS) | (j & mask)] = (j << 32) | f
            free[d] = f
            ptr[d] = i + 1
        u += 1
    return stop >= 0, ptr, ring, skipped


@njit(cache=True, error_model="numpy")
def _began(order, ring, l_dur, m, i):
    """Start of the swept op ``order[i]`` (from the ring), or -1."""
    op = order[i]
    bi = op // m
    f = _ring_finish(ring, bi, op - bi * m)
    return f - l_dur[bi] if f >= 0 else -1


@njit(cache=True, error_model="numpy", nogil=True)  # columns are written meanwhile
def _choose_cut(order, dptr, l_prod, l_dev, l_dur, m, ptr, ring, base, free_at, queued):
    """Where the cool-down scheduler's event loop stands when it first takes a
    turn at a time >= tau, tau the earliest start of a device's last swept op.

    Devices take turns at the time they become free (a woken device at the
    time it became free). So by then the loop has run every op starting
    before tau, no op of a device busy at tau that starts after it, and, on
    a device idle just before tau, the next op x if it was ready before
    tau's turn: if every producer of x ran by then (those starting before
    tau, or such an x of another device; found as a fixed point). Such a
    device is queued at x's finish; one whose x was not ready waits,
    unqueued, for the producer it lacks. Every other device is queued at
    the end of its last op.

    Fills ``base`` (each device's first op the loop has not run),
    ``free_at`` and ``queued``; returns False when the sweep's ring cannot
    tell (the caller then runs the loop from the start).
    """
    p = dptr.shape[0] - 1
    tau = np.int64(-1)
    for d in range(p):
        if ptr[d] <= dptr[d]:
            return False
        x = _began(order, ring, l_dur, m, ptr[d] - 1)
        if x < 0:
            return False
        if tau < 0 or x < tau:
            tau = x
    for d in range(p):
        i = ptr[d] - 1
        b = tau
        while i >= dptr[d] and ptr[d] - i <= _WALK:
            b = _began(order, ring, l_dur, m, i)
            if b < 0:
                return False
            if b < tau:
                break
            i -= 1
        if i >= dptr[d] and b >= tau:
            return False  # walked too far back
        # i: the last op starting before tau (dptr[d] - 1: none); i + 1 was swept.
        fin = 0
        if i >= dptr[d]:
            fin = b + l_dur[order[i] // m]
        base[d] = i + 1
        free_at[d] = fin
        queued[d] = fin >= tau
    changed = True
    while changed:
        changed = False
        for d in range(p):
            if queued[d]:
                continue
            op = order[base[d]]
            c = op // m
            j = op - c * m
            ready = True
            for r in range(l_prod.shape[1]):
                q = l_prod[c, r]
                if q < 0 or l_dev[q] == d:  # the device's own ran before x
                    continue
                x = _ring_finish(ring, q, j)
                if x < 0:
                    return False
                if x - l_dur[q] < tau:
                    continue
                e = l_dev[q]
                # Started at or after tau: ran only as the x of an idle device.
                if not (base[e] > dptr[e] and order[base[e] - 1] == q * m + j
                        and _began(order, ring, l_dur, m, base[e] - 1) >= tau):
                    ready = False
                    break
            if ready:
                free_at[d] = _ring_finish(ring, c, j)
                if free_at[d] < 0:
                    return False
                base[d] += 1
                queued[d] = True
                changed = True
    return True


@njit(cache=True, error_model="numpy", nogil=True)  # columns are written meanwhile
def _done_after(order, dptr, base, l_prod, l_dev, m, ring, cut):
    """Finish times for the event loop, which runs each device's ops from
    ``base[d]``: -1 for those, and (with ``cut``) the ring's finish for
    their producers before the cut.

    Finish times are whole numbers (integer durations from 0): int32, half
    the memory traffic of floats. Only microbatches from the first one with
    an op left to run are kept (``jb``; -1 if a producer on another device
    than its consumer's had left the ring). A producer on the consumer's own
    device may have left it: it finished before the device's free time at
    the cut, which every later decision of that device is at or after, so 0
    decides the same.
    """
    p = dptr.shape[0] - 1
    K = l_dev.shape[0]
    jb = m
    for d in range(p):
        for i in range(base[d], dptr[d + 1]):
            jb = min(jb, order[i] % m)
    mt = max(m - jb, 1)
    done = np.full(K * (((mt + 63) >> 6) << 6), -1, np.int32)
    if not cut:
        return done, jb
    for d in range(p):
        for i in range(base[d], dptr[d + 1]):
            op = order[i]
            done[_tile(op // m, op % m - jb, K)] = -2  # runs after the cut
    for d in range(p):
        for i in range(base[d], dptr[d + 1]):
            op = order[i]
            c = op // m
            j = op - c * m
            for r in range(l_prod.shape[1]):
                q = l_prod[c, r]
                if q < 0:
                    continue
                s = _tile(q, j - jb, K)
                if done[s] == -2:
                    continue
                x = _ring_finish(ring, q, j)
                if x >= 0:
                    done[s] = x
                elif l_dev[q] != l_dev[c]:
                    return done, -1
                else:
                    done[s] = max(done[s], 0)
    for d in range(p):
        for i in range(base[d], dptr[d + 1]):
            op = order[i]
            done[_tile(op // m, op % m - jb, K)] = -1
    return done, jb


@njit(cache=True, error_model="numpy")
def _tails(order, dptr, l_kind, m, p):
    """Each device's first op after its last F (``split``), its slice of the
    tail heaps (``tail``) and the rank of every tail op in its device's tail
    (``rank[roff[bi] + j - tail_from[bi]]``, -1 for ops not in a tail)."""
    K = l_kind.shape[0]
    split = np.empty(p, np.int64)  # first op after device d's last F
    tail = np.zeros(p + 1, np.int64)  # device d's tail heaps: [tail[d], tail[d + 1])
    # Ranks in the tail, looked up only for microbatches from the first one
    # with an op of that block op in a tail: a per-op array read for every
    # finished op cost a sixth of the time in cache misses.
    tail_from = np.full(K, m, np.int64)
    for d in range(p):
        split[d] = dptr[d]
        for i in range(dptr[d + 1] - 1, dptr[d] - 1, -1):
            if l_kind[order[i] // m] == 0:
                split[d] = i + 1
                break
        for i in range(split[d], dptr[d + 1]):
            bi = order[i] // m
            tail_from[bi] = min(tail_from[bi], order[i] - bi * m)
        tail[d + 1] = tail[d] + dptr[d + 1] - split[d]
    roff = np.zeros(K + 1, np.int64)
    for bi in range(K):
        roff[bi + 1] = roff[bi] + m - tail_from[bi]
    rank = np.full(roff[K], -1, np.int32)
    for d in range(p):
        for i in range(split[d], dptr[d + 1]):
            bi = order[i] // m
            rank[roff[bi] + order[i] - bi * m - tail_from[bi]] = i - split[d]
    return split, tail, tail_from, roff, rank


@njit(cache=True, error_model="numpy", nogil=True)  # columns are written meanwhile
def _event_loop(order, dptr, split, tail, tail_from, roff, rank, base, free_at, queued, done, jb,
                swept, l_kind, l_dev, l_dur, l_prod, l_cons, p):
    """The cool-down scheduler's event loop (see ``blocks._cooldown_kernels``)
    from positions ``base`` (times ``free_at``, ``queued`` devices in the
    queue), ``done`` holding finish times from microbatch ``jb`` on;
    returns the new order and the ops run."""
    n = order.shape[0]
    m = n // l_dev.shape[0]
    K = l_dev.shape[0]
    pos = base.copy()
    # The fixed parts after the cut, tiled by 64 positions across devices
    # (as ``_tile``): the devices' next ops share pages.
    longest = 0
    for d in range(p):
        longest = max(longest, split[d] - base[d])
    prog = np.empty(p * (((longest + 63) >> 6) << 6), np.int32)
    for d in range(p):
        for i in range(split[d] - base[d]):
            prog[(((i >> 6) * p + d) << 6) | (i & 63)] = order[base[d] + i]
    left = np.empty(p, np.int64)  # tail ops not run yet
    for d in range(p):
        left[d] = dptr[d + 1] - split[d]
    # A tail op's code on its device: its rank, plus the tail's length for
    # a W, so the least code is the op Python's key (is W, rank) picks.
    # Tail ops ready later than their device's turn wait in per-device heaps
    # keyed by (ready time, code), in the device's slice of the tail; those
    # ready by then are bits in a per-device set of codes (most ops: about
    # 700 of them were ready at once on a device of v-zb at p=1024, and a
    # heap of that size costs about ten levels per push and per pop).
    kt = np.empty(tail[p], np.int64)
    kc = np.empty(tail[p], np.int64)
    ki = np.empty(tail[p], np.int32)
    later = np.zeros(p, np.int64)
    now_n = np.zeros(p, np.int64)
    woff = np.zeros(p + 1, np.int64)  # device d's words of bits: [woff[d], woff[d + 1])
    soff = np.zeros(p + 1, np.int64)  # and of their summary bits
    for d in range(p):
        nw = (2 * (tail[d + 1] - tail[d]) + 63) >> 6
        woff[d + 1] = woff[d] + nw
        soff[d + 1] = soff[d] + ((nw + 63) >> 6)
    bits = np.zeros(woff[p], np.uint64)
    summ = np.zeros(soff[p], np.uint64)
    tail_op = np.empty(tail[p], np.int32)  # the op of each rank (``order`` is overwritten)
    for d in range(p):
        for r in range(tail[d + 1] - tail[d]):
            tail_op[tail[d] + r] = order[split[d] + r]
    if swept > 0:
        # Tail ops whose producers all ran before the cut joined their
        # device's "later" heap when the last of them finished.
        for e in range(p):
            for i in range(split[e], dptr[e + 1]):
                cop = order[i]
                c = cop // m
                j = cop - c * m
                if l_prod[c, 0] < 0:
                    continue
                t = _ready_at(l_prod, done, c, j - jb, K)
                if t >= 0:
                    code = np.int64(rank[roff[c] + j - tail_from[c]])
                    if l_kind[c] == 2:
                        code += tail[e + 1] - tail[e]
                    later[e] = _key_push(kt, kc, ki, tail[e], later[e], t, code, cop)
    # A tournament tree over the devices instead of a heap: each change
    # replays a fixed path of matches without data-dependent branches, where
    # a heap's sift mispredicts about once a level.
    leaves = 1
    while leaves < p:
        leaves *= 2
    tk = np.full(2 * leaves, _IDLE, np.int64)  # key of each match's winner
    td = np.zeros(2 * leaves, np.int64)  # its device
    for d in range(leaves):
        td[leaves + d] = d
        if d < p and queued[d]:
            tk[leaves + d] = free_at[d]
    for i in range(leaves - 1, 0, -1):
        a = 2 * i
        b = a + 1
        w = a if tk[a] < tk[b] or (tk[a] == tk[b] and td[a] < td[b]) else b
        tk[i] = tk[w]
        td[i] = td[w]
    # The new order overwrites ``order``: up to a device's last F it is the
    # same, and the tail is read only before the loop.
    out = order
    written = base.copy()
    ran = swept
    while tk[1] != _IDLE:
        d = td[1]
        now = tk[1]
        if pos[d] < split[d]:
            i = pos[d] - base[d]
            op = prog[(((i >> 6) * p + d) << 6) | (i & 63)]
            bi = op // m
            j = op - bi * m
            t = _ready_at(l_prod, done, bi, j - jb, K)
            if t < 0:
                _set_turn(tk, td, leaves, d, _IDLE)
                continue
            pos[d] += 1
        else:
            lo = tail[d]
            while later[d] > 0 and kt[lo] <= now:
                later[d] = _key_pop(kt, kc, ki, lo, later[d])
                _now_add(bits, summ, woff, soff, d, kc[lo + later[d]])
                now_n[d] += 1
            if now_n[d] > 0:
                b = _now_take(bits, summ, woff, soff, d)
                now_n[d] -= 1
                ln = tail[d + 1] - lo
                op = tail_op[lo + (b - ln if b >= ln else b)]
                t = now
            elif later[d] > 0:
                later[d] = _key_pop(kt, kc, ki, lo, later[d])
                op = ki[lo + later[d]]
                t = kt[lo + later[d]]
            else:
                _set_turn(tk, td, leaves, d, _IDLE)
                continue
            left[d] -= 1
        bi = op // m
        j = op - bi * m
        begin = max(now, t)
        free_at[d] = begin + l_dur[bi]
        done[_tile(bi, j - jb, K)] = free_at[d]
        # Only the id here: five columns written at p places at once cost
        # more than the whole list scheduling; ``columns`` writes them after.
        if written[d] >= split[d]:
            out[written[d]] = op
        written[d] += 1
        ran += 1
        _set_turn(tk, td, leaves, d, free_at[d] if pos[d] < split[d] or left[d] > 0 else _IDLE)
        for r in range(l_cons.shape[1]):
            c = l_cons[bi, r]
            if c < 0:
                continue
            cop = c * m + j
            e = l_dev[c]
            rk = -1
            if j >= tail_from[c]:
                rk = rank[roff[c] + j - tail_from[c]]
            if rk >= 0:
                t = _ready_at(l_prod, done, c, j - jb, K)
                if t >= 0:
                    code = np.int64(rk)
                    if l_kind[c] == 2:
                        code += tail[e + 1] - tail[e]
                    if t <= free_at[e]:
                        # Ready by e's next turn, which comes at free_at[e]
                        # (it changes only when e runs an op): the turn
                        # would move it out of the heap first thing.
                        _now_add(bits, summ, woff, soff, e, code)
                        now_n[e] += 1
                    else:
                        later[e] = _key_push(kt, kc, ki, tail[e], later[e], t, code, cop)
            if e != d and tk[leaves + e] == _IDLE:
                _set_turn(tk, td, leaves, e, free_at[e])
    return out, ran


@njit(cache=True, error_model="numpy", nogil=True)  # two threads, or beside the cool-down
def columns(order, dptr, lo, hi, l_kind, l_stage, out, d0, d1):
    """Fill rows ``lo[d]`` to ``hi[d] - 1`` of devices ``d0`` to ``d1 - 1``
    in ``out``, the op table's columns (device, slot, kind, stage,
    microbatch) of the programs ``order[dptr[d]:dptr[d + 1]]``, allocated
    by the caller."""
    n = order.shape[0]
    m = n // l_kind.shape[0]
    inv = 1.0 / m  # for _block_of
    dev, slot, kind, stage, mb = out
    for d in range(d0, d1):
        for i in range(lo[d], hi[d]):
            op = order[i]
            bi = _block_of(op, m, inv)
            dev[i] = d
            slot[i] = i - dptr[d]
            kind[i] = l_kind[bi]
            stage[i] = l_stage[bi]
            mb[i] = op - bi * m

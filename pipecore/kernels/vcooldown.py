"""The cool-down scheduler of a repeated building block
(``schedules.block_kernels._cooldown_kernels`` drives it).

After its last forward a device only frees memory, so its remaining
backward ops may run in any order: the scheduler runs the ready backward
(B or BW) of lowest rank, else the W of lowest rank, else the op ready
first, as ``schedules.block_squeeze._greedy_cooldown`` does op for op.
Its event loop (``_event_loop``) lets devices take turns by least (free
time, device) in a tournament tree; ops ready at a device's turn are bits
in a per-device set, later ones wait in per-device heaps. Before the loop,
``_sweep`` times the ops before the last microbatches in layout order (no
event queue, skipping intervals that repeat the one before, with the
finish times of each block op's last microbatches in a ring), and
``_choose_cut`` finds the state the loop itself would have reached at a
cut, from which it then runs.

error_model="numpy" throughout: no zero-division checks (every divisor is
a count >= 1), which makes the first compile shorter.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit
from numba.cpython.unsafe.numbers import trailing_zeros

from .blockops import _block_of, _tile
from .codes import F, W


class Tails(NamedTuple):
    """Each device's tail, its ops after its last F, in layout order
    (``_tails``'s output; read by the sweep and the event loop)."""

    split: np.ndarray  #: (p,) int64: position in ``order`` of device d's first op after its last F.
    tail: np.ndarray  #: (p + 1,) int64: device d's slice [tail[d], tail[d + 1]) of the tail heaps.
    tail_from: np.ndarray  #: (K,) int64: first microbatch of block op bi in a tail (m: none).
    roff: np.ndarray  #: (K + 1,) int64: block op bi's ranks start at ``rank[roff[bi]]``.
    rank: np.ndarray  #: int32: ``rank[roff[bi] + j - tail_from[bi]]``: op's rank in its tail, -1.


class LoopState(NamedTuple):
    """Where the event loop starts: filled by ``_choose_cut`` (or the state
    at time 0), read and updated by ``_event_loop``."""

    base: np.ndarray  #: (p,) int64: each device's first op in ``order`` the loop has not run.
    free_at: np.ndarray  #: (p,) int64: when the device is free (in/out).
    queued: np.ndarray  #: (p,) bool: the device has a turn pending at ``free_at``.


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
def _key_less(kt, kc, x, y):
    """Whether entry x's key (kt, kc) is less than entry y's."""
    return kt[x] < kt[y] or (kt[x] == kt[y] and kc[x] < kc[y])


@njit(cache=True, error_model="numpy")
def _key_swap(kt, kc, ki, x, y):
    """Swap heap entries x and y (key and op)."""
    kt[x], kt[y] = kt[y], kt[x]
    kc[x], kc[y] = kc[y], kc[x]
    ki[x], ki[y] = ki[y], ki[x]


@njit(cache=True, error_model="numpy")
def _key_push(kt, kc, ki, lo, size, t, c, op):
    """Push op with key (t, c) on the heap in kt/kc/ki[lo:lo + size]."""
    i = size
    kt[lo + i] = t
    kc[lo + i] = c
    ki[lo + i] = op
    while i > 0:
        parent = (i - 1) >> 1
        if _key_less(kt, kc, lo + i, lo + parent):
            _key_swap(kt, kc, ki, lo + i, lo + parent)
            i = parent
        else:
            break
    return size + 1


@njit(cache=True, error_model="numpy")
def _key_pop(kt, kc, ki, lo, size):
    """Remove the smallest key (moved to index lo + size - 1); returns the new size."""
    size -= 1
    _key_swap(kt, kc, ki, lo, lo + size)
    i = 0
    while True:
        a = 2 * i + 1
        if a >= size:
            break
        c = a
        if a + 1 < size and _key_less(kt, kc, lo + a + 1, lo + a):
            c = a + 1
        if _key_less(kt, kc, lo + c, lo + i):
            _key_swap(kt, kc, ki, lo + i, lo + c)
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
def _sweep(tab, order, ostart, dptr, split):
    """Finish times of the fixed ops (up to each device's last F) that start
    in the layout before the first op after any device's last F, for the
    block ``tab`` (:class:`~.blockops.BlockTables`) and the programs
    ``order`` (op ids, device d's at ``dptr[d]:dptr[d + 1]``, by layout
    start ``ostart``); ``split`` as ``Tails.split``.

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
    l_prod, l_dev, l_dur, m, T = tab.prod, tab.dev, tab.dur, tab.m, tab.interval
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
def _choose_cut(tab, order, dptr, ptr, ring, state):
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

    Fills ``state`` (:class:`LoopState`) from the sweep's ``ptr`` and
    ``ring`` (``_sweep``'s outputs); returns False when the sweep's ring
    cannot tell (the caller then runs the loop from the start).
    """
    l_prod, l_dev, l_dur, m = tab.prod, tab.dev, tab.dur, tab.m
    base, free_at, queued = state
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
def _tails(tab, order, dptr):
    """The devices' tails (:class:`Tails`) in the programs ``order`` (op
    ids, device d's at ``dptr[d]:dptr[d + 1]``) of the block ``tab``."""
    l_kind, m, p = tab.kind, tab.m, tab.devices
    K = l_kind.shape[0]
    split = np.empty(p, np.int64)  # first op after device d's last F
    tail = np.zeros(p + 1, np.int64)  # device d's tail heaps: [tail[d], tail[d + 1])
    # Ranks in the tail, looked up only for microbatches from the first one
    # with an op of that block op in a tail: a per-op array, read for every
    # finished op, would miss the cache most of the time.
    tail_from = np.full(K, m, np.int64)
    for d in range(p):
        split[d] = dptr[d]
        for i in range(dptr[d + 1] - 1, dptr[d] - 1, -1):
            if l_kind[order[i] // m] == F:
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
    return Tails(split, tail, tail_from, roff, rank)


@njit(cache=True, error_model="numpy", nogil=True)  # columns are written meanwhile
def _event_loop(tab, order, dptr, tails, state, done, jb, swept):
    """The cool-down scheduler's event loop (see
    ``schedules.block_kernels._cooldown_kernels``) over the programs
    ``order`` (device d's at ``dptr[d]:dptr[d + 1]``, tails ``tails``) of
    the block ``tab``, from ``state`` (:class:`LoopState`), ``done``
    holding finish times from microbatch ``jb`` on (``_done_after``) and
    ``swept`` ops run before the cut; returns the new order and the ops
    run."""
    l_kind, l_dev, l_dur, l_prod, l_cons, p = (tab.kind, tab.dev, tab.dur, tab.prod, tab.cons,
                                               tab.devices)
    split, tail, tail_from, roff, rank = tails
    base, free_at, queued = state
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
                    if l_kind[c] == W:
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
                    if l_kind[c] == W:
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


"""The list schedulers of ``schedules.generate``: ``memory_greedy`` and
``greedy``.

``memory_greedy_kernel`` follows ``memory_greedy``'s rule step for step (B
first, F by memory headroom and warm-up cap, W into gaps at least
``w_fill`` W-times long, the earliest-starting op committed next, ties to
the lower device), on flat arrays: ``tune`` runs it for many warm-up
depths, which made a pure-Python loop the larger part of tune's time.
``earliest_first`` is ``greedy``'s unit-time rule (hanayo's order).
tests/reference_generate.py holds the Python loops both must equal.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from .codes import BW as _BW
from .codes import B as _B
from .codes import F as _F
from .codes import W as _W

_NONE = -1  # no op proposed


class Layout(NamedTuple):
    """Where :func:`memory_greedy_kernel`'s S stages run, on p devices. Inputs."""

    #: int64 (S,): the device of stage s.
    placement: np.ndarray
    #: int64 (p + 1,): device d's stages are ``st_list[st_ptr[d]:st_ptr[d + 1]]``.
    st_ptr: np.ndarray
    #: int64 (S,): the stages of each device in turn, increasing within a device.
    st_list: np.ndarray
    #: int: the microbatches.
    m: int


class Rules(NamedTuple):
    """Costs and bounds :func:`memory_greedy_kernel` decides by. Inputs."""

    #: float64 (S,): the F, B and W times of stage s.
    tf: np.ndarray
    tb: np.ndarray
    tw: np.ndarray
    #: float64 (S,): the time stage s's output takes to another device.
    comm: np.ndarray
    #: float64 (S,): the activation an F holds until its B.
    act: np.ndarray
    #: float64 (S,): the part of it a B leaves held until its W.
    act_w: np.ndarray
    #: float64 (p,): device d's weights, held throughout.
    static: np.ndarray
    #: float64 (S,): memory an F of stage s keeps free for one microbatch of
    #: a later stage on its device (so an early stage cannot starve the way back).
    reserve: np.ndarray
    #: float: the memory limit, tolerance included.
    limit_tol: float
    #: int64 (p,): the most forwards device d runs ahead of its backwards.
    cap: np.ndarray
    #: float: a pending W fills a gap at least ``w_fill`` times its own time.
    w_fill: float


class Programs(NamedTuple):
    """Each device's program as :func:`memory_greedy_kernel` commits it. Outputs."""

    #: int64 (p, width): op i of device d's kind (``kernels.codes`` F, B, W),
    #: stage and microbatch; rows past ``count[d]`` are not written.
    kind: np.ndarray
    stage: np.ndarray
    mb: np.ndarray
    #: int64 (p,): the ops committed on device d.
    count: np.ndarray


class _State(NamedTuple):
    """The partial schedule :func:`memory_greedy_kernel` grows. Scratch."""

    #: float64 (S, m): finish time of (stage, microbatch)'s F, and of its B; NaN before.
    f_done: np.ndarray
    b_done: np.ndarray
    #: int64 (S,): the next microbatch whose F, and whose B, stage s runs.
    next_f: np.ndarray
    next_b: np.ndarray
    #: float64 (p,): when device d is next free.
    free: np.ndarray
    #: float64 (p,): device d's memory now.
    mem: np.ndarray
    #: int64 (p,): device d's forwards still waiting for their backward.
    ahead: np.ndarray
    #: int64 (p, S m): device d's pending W, a FIFO of (stage, microbatch)
    #: at ``w_head[d]:w_tail[d]``.
    w_stage: np.ndarray
    w_mb: np.ndarray
    w_head: np.ndarray
    w_tail: np.ndarray
    #: float64 (p,), int64 (p,), int64 (p,): device d's proposed next op,
    #: its start, kind (_NONE for none) and stage.
    prop_t: np.ndarray
    prop_kind: np.ndarray
    prop_stage: np.ndarray


@njit(cache=True, inline="always")
def _arrival(done, s_from, j, s_to, placement, comm):
    t = done[s_from, j]
    if t != t:  # NaN: not finished yet
        return np.nan
    if placement[s_from] == placement[s_to]:
        return t
    return t + comm[s_from]


@njit(cache=True, inline="always")
def _earliest(d, kind, t0, layout, rules, state):
    """Among device d's stages, the one whose next op of ``kind`` (B or F)
    may start first, not before t0: (start, stage), stage -1 for none. Ties
    go to the deeper stage (the Python loop compared (start, -stage))."""
    placement, m, comm = layout.placement, layout.m, rules.comm
    f_done, b_done, next_f, next_b = state.f_done, state.b_done, state.next_f, state.next_b
    S = placement.shape[0]
    best_t = np.inf
    best_s = -1
    for i in range(layout.st_ptr[d], layout.st_ptr[d + 1]):
        s = layout.st_list[i]
        if kind == _B:
            # The B after its F, and after the next stage's B.
            j = next_b[s]
            if j >= m or next_f[s] <= j:
                continue
            if s == S - 1:
                r = _arrival(f_done, s, j, s, placement, comm)
            else:
                r = _arrival(b_done, s + 1, j, s, placement, comm)
        else:
            # The F after the previous stage's F, if its activation fits
            # with room kept for a later stage on this device.
            j = next_f[s]
            if j >= m or state.mem[d] + rules.act[s] + rules.reserve[s] > rules.limit_tol:
                continue
            r = 0.0 if s == 0 else _arrival(f_done, s - 1, j, s, placement, comm)
        if r == r:
            t = max(r, t0)
            if best_s < 0 or t < best_t or (t == best_t and s > best_s):
                best_t = t
                best_s = s
    return best_t, best_s


@njit(cache=True)
def _propose(d, layout, rules, state):
    """Device d's next op into ``state.prop_*[d]``: the start, kind (_NONE
    for none) and stage."""
    t0 = state.free[d]
    bb_t, bb_s = _earliest(d, _B, t0, layout, rules, state)
    bf_t = np.inf
    bf_s = -1
    if state.ahead[d] < rules.cap[d]:
        bf_t, bf_s = _earliest(d, _F, t0, layout, rules, state)
    # A B, else an F, that can start now; else the earlier of the two (the
    # F at a tie: the Python loop compared (time, kind) and F < B), unless
    # a pending W fits in the wait.
    n_t = np.inf
    n_k = _NONE
    n_s = -1
    if bb_s >= 0 and bb_t <= t0:
        n_t, n_k, n_s = t0, _B, bb_s
    elif bf_s >= 0 and bf_t <= t0:
        n_t, n_k, n_s = t0, _F, bf_s
    else:
        if bb_s >= 0 and (bf_s < 0 or bb_t < bf_t):
            n_t, n_k, n_s = bb_t, _B, bb_s
        elif bf_s >= 0:
            n_t, n_k, n_s = bf_t, _F, bf_s
        if state.w_head[d] < state.w_tail[d]:
            s_w = state.w_stage[d, state.w_head[d]]
            if n_k == _NONE or n_t - t0 >= rules.w_fill * rules.tw[s_w]:
                n_t, n_k, n_s = t0, _W, s_w
    state.prop_t[d] = n_t
    state.prop_kind[d] = n_k
    state.prop_stage[d] = n_s


@njit(cache=True)
def memory_greedy_kernel(layout, rules, out):
    """Fill each device's program (``out``); return 0, or 1 when every
    device waits, with ``out`` then holding the ops committed so far (the
    caller names the waiting devices from them)."""
    S = layout.placement.shape[0]
    m = layout.m
    st_ptr = layout.st_ptr
    p = st_ptr.shape[0] - 1
    # Pending W per device, a FIFO: stage and microbatch of each B done.
    cap_w = 1
    for d in range(p):
        cap_w = max(cap_w, (st_ptr[d + 1] - st_ptr[d]) * m)
    state = _State(f_done=np.full((S, m), np.nan), b_done=np.full((S, m), np.nan),
                   next_f=np.zeros(S, np.int64), next_b=np.zeros(S, np.int64),
                   free=np.zeros(p), mem=rules.static.copy(), ahead=np.zeros(p, np.int64),
                   w_stage=np.empty((p, cap_w), np.int64), w_mb=np.empty((p, cap_w), np.int64),
                   w_head=np.zeros(p, np.int64), w_tail=np.zeros(p, np.int64),
                   prop_t=np.empty(p), prop_kind=np.empty(p, np.int64),
                   prop_stage=np.empty(p, np.int64))
    for d in range(p):
        out.count[d] = 0
        _propose(d, layout, rules, state)
    touched = np.empty(3, np.int64)
    for _ in range(3 * S * m):
        best_d = -1
        best_t = np.inf
        for d in range(p):
            if state.prop_kind[d] != _NONE and (best_d < 0 or state.prop_t[d] < best_t):
                best_t = state.prop_t[d]
                best_d = d
        if best_d < 0:
            return 1
        d = best_d
        t = state.prop_t[d]
        kind = state.prop_kind[d]
        s = state.prop_stage[d]
        if kind == _F:
            j = state.next_f[s]
            state.next_f[s] += 1
            fin = t + rules.tf[s]
            state.f_done[s, j] = fin
            state.mem[d] += rules.act[s]
            state.ahead[d] += 1
        elif kind == _B:
            j = state.next_b[s]
            state.next_b[s] += 1
            fin = t + rules.tb[s]
            state.b_done[s, j] = fin
            state.mem[d] -= rules.act[s] - rules.act_w[s]
            state.ahead[d] -= 1
            state.w_stage[d, state.w_tail[d]] = s
            state.w_mb[d, state.w_tail[d]] = j
            state.w_tail[d] += 1
        else:
            s = state.w_stage[d, state.w_head[d]]
            j = state.w_mb[d, state.w_head[d]]
            state.w_head[d] += 1
            fin = t + rules.tw[s]
            state.mem[d] -= rules.act_w[s]
        state.free[d] = fin
        i = out.count[d]
        out.kind[d, i] = kind
        out.stage[d, i] = s
        out.mb[d, i] = j
        out.count[d] = i + 1
        # Only this device and the consumer's can propose differently now.
        n_t = 1
        touched[0] = d
        if kind == _F and s + 1 < S:
            touched[n_t] = layout.placement[s + 1]
            n_t += 1
        if kind == _B and s > 0:
            touched[n_t] = layout.placement[s - 1]
            n_t += 1
        for k in range(n_t):
            _propose(touched[k], layout, rules, state)
    return 0


_BITS = 21
_MASK = (1 << _BITS) - 1
_IDLE = np.int64(1) << 62  # above every key


@njit(cache=True, inline="always")
def _heap_push(heap, base, size, key):
    """Push ``key`` on the min-heap ``heap[base:base + size]``; returns the new size."""
    i = size
    while i > 0:
        up = (i - 1) >> 1
        if heap[base + up] <= key:
            break
        heap[base + i] = heap[base + up]
        i = up
    heap[base + i] = key
    return size + 1


@njit(cache=True, inline="always")
def _heap_pop(heap, base, size):
    """Remove the root of ``heap[base:base + size]`` (the caller read it);
    returns the new size."""
    size -= 1
    key = heap[base + size]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and heap[base + c + 1] < heap[base + c]:
            c += 1
        if heap[base + c] >= key:
            break
        heap[base + i] = heap[base + c]
        i = c
    if size > 0:
        heap[base + i] = key
    return size


@njit(cache=True, inline="always")
def _head_ready(nxt, q, m, S):
    """True when queue q's next op (stage q >> 1, F for even q, BW for odd)
    exists and its producers have run: an F after the previous stage's F,
    a BW after its F and the next stage's BW."""
    s = q >> 1
    j = nxt[q]
    if j >= m:
        return False
    if q & 1 == 0:
        return s == 0 or nxt[q - 2] > j
    return nxt[q - 1] > j and (s == S - 1 or nxt[q + 2] > j)


@njit(cache=True, nogil=True)
def earliest_first(placement, m, p, out, scan_max):
    """The unit-time list scheduler of ``schedules.generate.greedy``.

    Fused F/BW ops of one time unit, free communication; the op that can
    start earliest is committed next, ties to a backward, then the lower
    microbatch, then the deeper stage. ``out`` (a
    :class:`~pipecore.kernels.columns.Columns` of 2 S m rows, allocated by
    the caller): this kernel writes each op's queue
    (2 * stage, + 1 for a BW) into the stage column only, and
    :func:`greedy_columns` then writes the columns from it.
    Returns ``(status, dev_ptr)``: device d's rows are
    ``dev_ptr[d]:dev_ptr[d + 1]``; status 0, or 1 if some op never ran
    (the rule cannot stall, so 1 means a broken kernel: the stage column
    then holds unwritten rows, which :func:`greedy_columns` must not read).
    Needs m and the stage count below 2**21 (the tie-break key packs both
    into one int64). ``scan_max``: the most queues (two per stage) a device
    may have for a pop to scan them rather than keep a heap.

    Time advances one unit per step, and in a step every device with a
    ready op runs the least by (BW first, microbatch, deeper stage); an op
    that becomes ready in step t can run from step t + 1 on, which is when
    the earliest-start rule would start it. Each stage runs its F, and its
    BW, in microbatch order (their inputs arrive in that order), so a
    device only weighs the next F and the next BW of each of its stages,
    those of them that are ready (scanned, or in a heap per device).
    """
    S = placement.size
    n_q = 2 * S  # queue 2s: stage s's F; 2s + 1: its BW
    nxt = np.zeros(n_q, np.int64)  # next microbatch of each queue
    in_heap = np.zeros(n_q, np.bool_)
    # Device d's heap lives at heap[hbase[d]:hbase[d] + hsize[d]]: one
    # entry per queue at most.
    hbase = np.zeros(p + 1, np.int64)
    dev_ptr = np.zeros(p + 1, np.int64)
    for s in range(S):
        hbase[placement[s] + 1] += 2
        dev_ptr[placement[s] + 1] += 2 * m
    for d in range(p):
        hbase[d + 1] += hbase[d]
        dev_ptr[d + 1] += dev_ptr[d]
    heap = np.empty(n_q, np.int64)
    hsize = np.zeros(p, np.int64)
    # Up to scan_max queues per device: each queue keeps its own entry in
    # the device's range (its key, or _IDLE when not ready) and a pop scans
    # them, cheaper than a heap's branches; more: the range is a heap.
    width = 0
    for d in range(p):
        width = max(width, hbase[d + 1] - hbase[d])
    scan = width <= scan_max
    lq = np.empty(n_q, np.int64)  # slot of queue q in its device's range
    seen = np.zeros(p, np.int64)
    for q in range(n_q):
        e = placement[q >> 1]
        lq[q] = seen[e]
        seen[e] += 1
    if scan:
        heap[:] = _IDLE
    filled = np.zeros(p, np.int64)
    stage = out.stage
    # Devices with a ready op in this step and the next, and the queues
    # whose op ran this step.
    active = np.empty(p, np.int64)
    n_active = 0
    listed = np.zeros(p, np.bool_)
    ran = np.empty(p, np.int64)
    top = np.int64(1) << (2 * _BITS)
    # Step 0: stage 0's first F.
    d0 = placement[0]
    if scan:
        heap[hbase[d0] + lq[0]] = top | (S - 1)
        hsize[d0] = 1
    else:
        hsize[d0] = _heap_push(heap, hbase[d0], 0, top | (S - 1))
    in_heap[0] = True
    active[0] = d0
    n_active = 1
    listed[d0] = True
    while n_active > 0:
        # Every listed device runs its least ready op.
        for a in range(n_active):
            d = active[a]
            if scan:
                b = hbase[d]
                at = b
                key = heap[b]
                for u in range(b + 1, hbase[d + 1]):
                    if heap[u] < key:
                        key = heap[u]
                        at = u
                heap[at] = _IDLE
                hsize[d] -= 1
            else:
                key = heap[hbase[d]]
                hsize[d] = _heap_pop(heap, hbase[d], hsize[d])
            s = S - 1 - (key & _MASK)
            j = (key >> _BITS) & _MASK
            is_bw = (key >> (2 * _BITS)) == 0
            q = 2 * s + (1 if is_bw else 0)
            in_heap[q] = False
            nxt[q] = j + 1
            # Only the queue goes in (in the stage column): one scattered
            # write stream per device instead of three (greedy_columns
            # writes the columns from it).
            stage[dev_ptr[d] + filled[d]] = q
            filled[d] += 1
            ran[a] = q
        # Then what those ops made ready joins the heaps for the next step:
        # each queue's next op, and the next op of its consumer's queue.
        n_ran = n_active
        n_next = 0
        for a in range(n_ran):
            d = active[a]
            listed[d] = False
            if hsize[d] > 0:
                active[n_next] = d
                listed[d] = True
                n_next += 1
        for a in range(n_ran):
            q = ran[a]
            s = q >> 1
            if q & 1 == 0:
                c = q + 2 if s < S - 1 else q + 1
            else:
                c = q - 2 if s > 0 else -1
            for x in (q, c):
                if x < 0 or in_heap[x] or not _head_ready(nxt, x, m, S):
                    continue
                sx = x >> 1
                e = placement[sx]
                flag = top if x & 1 == 0 else 0
                key = flag | (nxt[x] << _BITS) | (S - 1 - sx)
                if scan:
                    heap[hbase[e] + lq[x]] = key
                    hsize[e] += 1
                else:
                    hsize[e] = _heap_push(heap, hbase[e], hsize[e], key)
                in_heap[x] = True
                if not listed[e]:
                    listed[e] = True
                    active[n_next] = e
                    n_next += 1
        n_active = n_next
    for d in range(p):
        if filled[d] != dev_ptr[d + 1] - dev_ptr[d]:
            return 1, dev_ptr
    return 0, dev_ptr


@njit(cache=True, nogil=True)  # two threads may write halves of the devices
def greedy_columns(dev_ptr, n_q, out, d0, d1):
    """After :func:`earliest_first`: devices ``d0`` to ``d1``'s rows of the
    columns ``out`` from the queue each op came from (in the stage column).
    A queue runs its microbatches in order, so counting its ops gives each
    op's microbatch. Devices own their rows and queues, so two calls on
    disjoint device ranges may run at once."""
    device, slot, kind, stage, mb = out.device, out.slot, out.kind, out.stage, out.microbatch
    count = np.zeros(n_q, np.int64)
    for d in range(d0, d1):
        for r in range(dev_ptr[d], dev_ptr[d + 1]):
            q = stage[r]
            device[r] = d
            slot[r] = r - dev_ptr[d]
            kind[r] = _BW if q & 1 else _F
            stage[r] = q >> 1
            mb[r] = count[q]
            count[q] += 1

"""The memory-aware list scheduler of ``schedules.generate.memory_greedy``.

The same rule, step for step (B first, F by memory headroom and warm-up cap,
W into gaps at least ``w_fill`` W-times long, the earliest-starting op
committed next, ties to the lower device), on flat arrays. ``tune`` runs it
for many warm-up depths, which made the pure-Python loop the larger part of
tune's time. The Python version stays as the tested reference.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_F, _B, _W = 0, 1, 2
_NONE = -1


@njit(cache=True, inline="always")
def _arrival(done, s_from, j, s_to, placement, comm):
    t = done[s_from, j]
    if t != t:  # NaN: not finished yet
        return np.nan
    if placement[s_from] == placement[s_to]:
        return t
    return t + comm[s_from]


@njit(cache=True)
def _propose(d, st_ptr, st_list, S, m, placement, comm, tw, act, reserve, limit_tol, cap,
             f_done, b_done, next_f, next_b, free, mem, ahead, w_head, w_tail, w_stage,
             w_fill, out):
    """Device d's next op as out[d] = (start, kind, stage), kind -1 for none."""
    t0 = free[d]
    bb_t = np.inf
    bb_s = -1
    for i in range(st_ptr[d], st_ptr[d + 1]):
        s = st_list[i]
        j = next_b[s]
        if j >= m or next_f[s] <= j:
            continue
        if s == S - 1:
            r = _arrival(f_done, s, j, s, placement, comm)
        else:
            r = _arrival(b_done, s + 1, j, s, placement, comm)
        if r == r:
            t = max(r, t0)
            # Python compares (t, -s): the larger stage wins a tie.
            if bb_s < 0 or t < bb_t or (t == bb_t and -s < -bb_s):
                bb_t = t
                bb_s = s
    bf_t = np.inf
    bf_s = -1
    if ahead[d] < cap[d]:
        for i in range(st_ptr[d], st_ptr[d + 1]):
            s = st_list[i]
            j = next_f[s]
            if j >= m or mem[d] + act[s] + reserve[s] > limit_tol:
                continue
            if s == 0:
                r = 0.0
            else:
                r = _arrival(f_done, s - 1, j, s, placement, comm)
            if r == r:
                t = max(r, t0)
                if bf_s < 0 or t < bf_t or (t == bf_t and -s < -bf_s):
                    bf_t = t
                    bf_s = s
    if bb_s >= 0 and bb_t <= t0:
        out[d, 0] = t0
        out[d, 1] = _B
        out[d, 2] = bb_s
        return
    if bf_s >= 0 and bf_t <= t0:
        out[d, 0] = t0
        out[d, 1] = _F
        out[d, 2] = bf_s
        return
    # The earlier of the two, compared as Python's (time, kind, stage) tuples.
    n_t = np.inf
    n_k = _NONE
    n_s = -1
    if bb_s >= 0:
        n_t, n_k, n_s = bb_t, _B, bb_s
    if bf_s >= 0:
        if n_k == _NONE or bf_t < n_t or (bf_t == n_t and (_F < n_k or (_F == n_k and bf_s < n_s))):
            n_t, n_k, n_s = bf_t, _F, bf_s
    if w_head[d] < w_tail[d]:
        s_w = w_stage[d, w_head[d]]
        if n_k == _NONE or n_t - t0 >= w_fill * tw[s_w]:
            out[d, 0] = t0
            out[d, 1] = _W
            out[d, 2] = s_w
            return
    out[d, 0] = n_t
    out[d, 1] = n_k
    out[d, 2] = n_s


@njit(cache=True)
def memory_greedy_kernel(placement, st_ptr, st_list, m, tf, tb, tw, comm, act, act_w, static,
                         reserve, limit_tol, cap, w_fill, prog_kind, prog_stage, prog_mb, prog_len):
    """Fill each device's program; return 0, or 1 when every device waits.

    ``st_list[st_ptr[d]:st_ptr[d+1]]`` are device d's stages in increasing
    order. ``prog_*[d, i]`` receive op i of device d (kind 0=F, 1=B, 2=W)
    and ``prog_len[d]`` their count. On 1 the arrays hold the ops committed
    so far; ``prog_len`` and the returned state let the caller explain.
    """
    S = placement.shape[0]
    p = st_ptr.shape[0] - 1
    f_done = np.full((S, m), np.nan)
    b_done = np.full((S, m), np.nan)
    next_f = np.zeros(S, np.int64)
    next_b = np.zeros(S, np.int64)
    free = np.zeros(p)
    mem = static.copy()
    ahead = np.zeros(p, np.int64)
    # Pending W per device, a FIFO: stage and microbatch of each B done.
    cap_w = 1
    for d in range(p):
        cap_w = max(cap_w, (st_ptr[d + 1] - st_ptr[d]) * m)
    w_stage = np.empty((p, cap_w), np.int64)
    w_mb = np.empty((p, cap_w), np.int64)
    w_head = np.zeros(p, np.int64)
    w_tail = np.zeros(p, np.int64)
    prop = np.empty((p, 3))
    for d in range(p):
        prog_len[d] = 0
        _propose(d, st_ptr, st_list, S, m, placement, comm, tw, act, reserve, limit_tol, cap,
                 f_done, b_done, next_f, next_b, free, mem, ahead, w_head, w_tail, w_stage,
                 w_fill, prop)
    touched = np.empty(3, np.int64)
    for _ in range(3 * S * m):
        best_d = -1
        best_t = np.inf
        for d in range(p):
            if prop[d, 1] != _NONE and (best_d < 0 or prop[d, 0] < best_t):
                best_t = prop[d, 0]
                best_d = d
        if best_d < 0:
            return 1
        d = best_d
        t = prop[d, 0]
        kind = int(prop[d, 1])
        s = int(prop[d, 2])
        if kind == _F:
            j = next_f[s]
            next_f[s] += 1
            fin = t + tf[s]
            f_done[s, j] = fin
            mem[d] += act[s]
            ahead[d] += 1
        elif kind == _B:
            j = next_b[s]
            next_b[s] += 1
            fin = t + tb[s]
            b_done[s, j] = fin
            mem[d] -= act[s] - act_w[s]
            ahead[d] -= 1
            w_stage[d, w_tail[d]] = s
            w_mb[d, w_tail[d]] = j
            w_tail[d] += 1
        else:
            s = w_stage[d, w_head[d]]
            j = w_mb[d, w_head[d]]
            w_head[d] += 1
            fin = t + tw[s]
            mem[d] -= act_w[s]
        free[d] = fin
        i = prog_len[d]
        prog_kind[d, i] = kind
        prog_stage[d, i] = s
        prog_mb[d, i] = j
        prog_len[d] = i + 1
        n_t = 1
        touched[0] = d
        if kind == _F and s + 1 < S:
            touched[n_t] = placement[s + 1]
            n_t += 1
        if kind == _B and s > 0:
            touched[n_t] = placement[s - 1]
            n_t += 1
        for k in range(n_t):
            e = touched[k]
            _propose(e, st_ptr, st_list, S, m, placement, comm, tw, act, reserve, limit_tol,
                     cap, f_done, b_done, next_f, next_b, free, mem, ahead, w_head, w_tail,
                     w_stage, w_fill, prop)
    return 0


_BITS = 21
_MASK = (1 << _BITS) - 1


@njit(cache=True, inline="always")
def _less(a1, a2, b1, b2):
    return a1 < b1 or (a1 == b1 and a2 < b2)


@njit(cache=True)
def _push(h1, h2, size, k1, k2):
    i = size
    while i > 0:
        up = (i - 1) >> 1
        if not _less(k1, k2, h1[up], h2[up]):
            break
        h1[i] = h1[up]
        h2[i] = h2[up]
        i = up
    h1[i] = k1
    h2[i] = k2
    return size + 1


@njit(cache=True)
def _pop(h1, h2, size):
    # Moves the last entry down from the root; the caller read the root first.
    size -= 1
    k1 = h1[size]
    k2 = h2[size]
    i = 0
    while True:
        c = 2 * i + 1
        if c >= size:
            break
        if c + 1 < size and _less(h1[c + 1], h2[c + 1], h1[c], h2[c]):
            c += 1
        if not _less(h1[c], h2[c], k1, k2):
            break
        h1[i] = h1[c]
        h2[i] = h2[c]
        i = c
    if size > 0:
        h1[i] = k1
        h2[i] = k2
    return size


@njit(cache=True)
def earliest_first(placement, m, p, out):
    """The unit-time list scheduler of ``schedules.generate.greedy``.

    Fused F/BW ops of one time unit, free communication; the op that can
    start earliest is committed next, ties to a backward, then the lower
    microbatch, then the deeper stage. Fills and returns ``out``, the op
    table's columns in (device, program position) order: ``(device, slot,
    kind (0=F, 3=BW), stage, microbatch)``, 2 S m rows each, allocated by
    the caller. Needs m and the stage count below 2**21 (the
    tie-break key packs both into one int64).
    """
    S = placement.size
    done = np.full((2, S, m), -1, np.int64)  # finish time of F (0) and BW (1)
    free = np.zeros(p, np.int64)
    dev_ptr = np.zeros(p + 1, np.int64)
    for s in range(S):
        dev_ptr[placement[s] + 1] += 2 * m
    for d in range(p):
        dev_ptr[d + 1] += dev_ptr[d]
    filled = np.zeros(p, np.int64)
    device, slot, kind, stage, mb = out
    # Heap of (start, tie) with tie = (0 for BW, 1 for F) | microbatch |
    # deepest stage first. Each pop pushes at most one entry back, so it
    # never holds more than the m first forwards it starts with.
    h1 = np.empty(m, np.int64)
    h2 = np.empty(m, np.int64)
    size = 0
    for j in range(m):
        size = _push(h1, h2, size, 0, (1 << (2 * _BITS)) | (j << _BITS) | (S - 1))
    while size > 0:
        t0 = h1[0]
        tie = h2[0]
        size = _pop(h1, h2, size)
        k = 1 if (tie >> (2 * _BITS)) == 0 else 0
        j = (tie >> _BITS) & _MASK
        s = S - 1 - (tie & _MASK)
        d = placement[s]
        t = free[d]
        if k == 0:
            if s > 0:
                t = max(t, done[0, s - 1, j])
        else:
            t = max(t, done[0, s, j])
            if s < S - 1:
                t = max(t, done[1, s + 1, j])
        if t > t0:
            size = _push(h1, h2, size, t, tie)  # the device got busy meanwhile
            continue
        done[k, s, j] = t + 1
        free[d] = t + 1
        r = dev_ptr[d] + filled[d]
        device[r] = d
        slot[r] = filled[d]
        kind[r] = 0 if k == 0 else 3
        stage[r] = s
        mb[r] = j
        filled[d] += 1
        # The consumer, pushed once all its producers have finished.
        if k == 0:
            ck, cs = (0, s + 1) if s < S - 1 else (1, s)
        elif s > 0:
            ck, cs = 1, s - 1
        else:
            continue
        if ck == 0:
            ready = done[0, cs - 1, j]
        else:
            ready = done[0, cs, j]
            if cs < S - 1:
                if done[1, cs + 1, j] < 0:
                    continue
                ready = max(ready, done[1, cs + 1, j])
        if ready < 0:
            continue
        start = max(ready, free[placement[cs]])
        flag = 0 if ck == 1 else 1
        size = _push(h1, h2, size, start, (flag << (2 * _BITS)) | (j << _BITS) | (S - 1 - cs))
    return device, slot, kind, stage, mb

"""The building blocks' squeeze (``schedules.blocks``) on flat arrays.

``reorder_grid`` moves warm-up and cool-down ops into earlier free slots of
the integer time grid, as ``blocks._reorder`` does; ``greedy_cooldown``
re-orders each device's ops after its last forward, as
``blocks._greedy_cooldown`` does. Both equal the Python versions (kept as
the tested references) op for op.

Ops are numbered ``j * K + bi``: microbatch j, op bi of the block's K ops
(``(kind, stage)`` pairs). A producer or consumer of an op is an op of the
same microbatch, so the block's K-row tables describe every op.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# Kind codes (core.ops): F=0, B=1, W=2, BW=3.


@njit(cache=True)
def reorder_grid(l_dev, l_off, l_dur, l_prod, l_is_f, l_is_last, l_last, m, interval, devices,
                 horizon, warm_end, cool_start, rounds):
    """Start of every op after the reorder, and each device's ops by start.

    ``occ[d, u]`` is the op on device d's unit slot u (-1 free) and
    ``alive[d, u]`` the number of activations alive there (an F's lives from
    its start to the end of the stage's last backward, ``l_last``). A move
    costs its length; an F may only move to slots that keep every alive
    count it passes at or below the device's initial peak.

    Returns
    -------
    start : int32 array of op starts
    order : int32 array of op ids, device by device, by start
    dptr : int64 array, device d's ops are ``order[dptr[d]:dptr[d + 1]]``
    """
    K = l_dev.shape[0]
    n = K * m
    start = np.empty(n, np.int32)
    occ = np.full((devices, horizon), -1, np.int32)
    alive = np.zeros((devices, horizon + 1), np.int32)
    for j in range(m):
        for bi in range(K):
            op = j * K + bi
            t = l_off[bi] + j * interval
            start[op] = t
            d = l_dev[bi]
            for u in range(t, t + l_dur[bi]):
                occ[d, u] = op
    for j in range(m):
        for bi in range(K):
            if l_is_f[bi]:
                d = l_dev[bi]
                alive[d, start[j * K + bi]] += 1
                z = l_last[bi]
                alive[d, start[j * K + z] + l_dur[z]] -= 1
    limit = np.zeros(devices, np.int32)
    for d in range(devices):
        c = 0
        for u in range(horizon):
            c += alive[d, u]
            alive[d, u] = c
            if c > limit[d]:
                limit[d] = c
    # Warm-up and cool-down ops; the steady phase between them stays.
    n_cand = 0
    for op in range(n):
        if not (warm_end <= start[op] <= cool_start):
            n_cand += 1
    cand = np.empty(n_cand, np.int64)
    i = 0
    for op in range(n):
        if not (warm_end <= start[op] <= cool_start):
            cand[i] = op
            i += 1
    key = np.empty(n_cand, np.int64)
    for _round in range(rounds):
        # By start, ties (on different devices) by device: the Python
        # version's stable sort of a list ordered by (device, start).
        for i in range(n_cand):
            op = cand[i]
            key[i] = np.int64(start[op]) * devices + l_dev[op % K]
        visit = np.argsort(key)
        moved = False
        for i in range(n_cand):
            op = cand[visit[i]]
            bi = op % K
            base = op - bi
            d = l_dev[bi]
            t = start[op]
            ln = l_dur[bi]
            ready = 0
            for r in range(l_prod.shape[1]):
                q = l_prod[bi, r]
                if q >= 0:
                    e = start[base + q] + l_dur[q]
                    if e > ready:
                        ready = e
            lo = ready
            if l_is_f[bi]:
                # An earlier F is alive over [slot, t): those counts must stay <= the peak.
                for u in range(t - 1, ready - 1, -1):
                    if alive[d, u] + 1 > limit[d]:
                        lo = u + 1
                        break
            for slot in range(lo, t):
                free = True
                for u in range(slot, slot + ln):
                    x = occ[d, u]
                    if x != -1 and x != op:
                        free = False
                        break
                if not free:
                    continue
                for u in range(t, t + ln):
                    occ[d, u] = -1
                for u in range(slot, slot + ln):
                    occ[d, u] = op
                start[op] = slot
                if l_is_f[bi]:
                    for u in range(slot, t):
                        alive[d, u] += 1
                elif l_is_last[bi]:
                    for u in range(slot + ln, t + ln):
                        alive[d, u] -= 1
                moved = True
                break
        if not moved:
            break
    dptr = np.zeros(devices + 1, np.int64)
    for bi in range(K):
        dptr[l_dev[bi] + 1] += m
    for d in range(devices):
        dptr[d + 1] += dptr[d]
    order = np.empty(n, np.int32)
    for d in range(devices):
        w = dptr[d]
        for u in range(horizon):
            op = occ[d, u]
            if op >= 0 and start[op] == u:
                order[w] = op
                w += 1
    return start, order, dptr


@njit(cache=True, inline="always")
def _heap_less(ta, da, tb, db):
    return ta < tb or (ta == tb and da < db)


@njit(cache=True)
def _dev_push(ht, hd, size, t, d):
    """Push (t, d) on the device heap; returns the new size."""
    i = size
    ht[i] = t
    hd[i] = d
    while i > 0:
        parent = (i - 1) >> 1
        if _heap_less(ht[i], hd[i], ht[parent], hd[parent]):
            ht[i], ht[parent] = ht[parent], ht[i]
            hd[i], hd[parent] = hd[parent], hd[i]
            i = parent
        else:
            break
    return size + 1


@njit(cache=True)
def _dev_pop(ht, hd, size):
    """Remove the smallest (t, d) (moved to index size - 1); returns the new size."""
    size -= 1
    ht[0], ht[size] = ht[size], ht[0]
    hd[0], hd[size] = hd[size], hd[0]
    i = 0
    while True:
        a = 2 * i + 1
        if a >= size:
            break
        b = a + 1
        c = a
        if b < size and _heap_less(ht[b], hd[b], ht[a], hd[a]):
            c = b
        if _heap_less(ht[c], hd[c], ht[i], hd[i]):
            ht[i], ht[c] = ht[c], ht[i]
            hd[i], hd[c] = hd[c], hd[i]
            i = c
        else:
            break
    return size


@njit(cache=True)
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


@njit(cache=True)
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


@njit(cache=True)
def greedy_cooldown(order, dptr, l_kind, l_stage, l_dev, l_dur, l_prod, l_cons, devices):
    """Each device's program with its ops after the last F re-ordered.

    Event-driven like the Python version: devices are taken from a heap
    by (free time, device); before its last F a device runs its ops in
    order, after it the ready backward (B or BW) of lowest rank, else the
    W of lowest rank, else the op ready first. An op becomes ready (and
    joins its device's "later" heap keyed by (ready time, is W, rank)) when
    its last producer finishes; an attempt moves every op ready by then
    into the "now" heap keyed by (is W, rank). Finishing an op wakes the
    devices of its consumers. Python keeps a set of waiting devices per op
    and may queue a device twice; waking every consumer device once (a
    device whose turn is pending is not queued again) takes the same
    decisions, since an attempt can only succeed after a wake-up that
    Python also makes.

    Returns
    -------
    kind : int8, stage, microbatch, device, slot : int32 arrays
        The op table's columns, device by device in run order.
    """
    K = l_dev.shape[0]
    n = order.shape[0]
    p = devices
    split = np.empty(p, np.int64)  # first op after device d's last F
    rank = np.full(n, -1, np.int32)
    for d in range(p):
        split[d] = dptr[d]
        for i in range(dptr[d], dptr[d + 1]):
            if l_kind[order[i] % K] == 0:
                split[d] = i + 1
        for i in range(split[d], dptr[d + 1]):
            rank[order[i]] = i - split[d]
    done = np.full(n, np.nan)
    pos = dptr[:-1].copy()
    left = np.empty(p, np.int64)  # tail ops not run yet
    for d in range(p):
        left[d] = dptr[d + 1] - split[d]
    # Per-device heaps of ready tail ops, in the device's slice of the tail.
    kt = np.empty(n, np.float64)
    kc = np.empty(n, np.int64)
    ki = np.empty(n, np.int32)
    nt = np.zeros(n, np.float64)
    nc = np.empty(n, np.int64)
    ni = np.empty(n, np.int32)
    later = np.zeros(p, np.int64)
    now_n = np.zeros(p, np.int64)
    ht = np.empty(p, np.float64)
    hd = np.empty(p, np.int64)
    queued = np.zeros(p, np.bool_)
    free_at = np.zeros(p, np.float64)
    size = 0
    for d in range(p):
        size = _dev_push(ht, hd, size, 0.0, d)
        queued[d] = True
    kind = np.empty(n, np.int8)
    stage = np.empty(n, np.int32)
    mb = np.empty(n, np.int32)
    dev = np.empty(n, np.int32)
    slot = np.empty(n, np.int32)
    written = dptr[:-1].copy()
    ran = 0
    while size > 0:
        size = _dev_pop(ht, hd, size)
        now = ht[size]
        d = hd[size]
        queued[d] = False
        if now != free_at[d]:
            continue
        if pos[d] < split[d]:
            op = order[pos[d]]
            bi = op % K
            base = op - bi
            t = 0.0
            ok = True
            for r in range(l_prod.shape[1]):
                q = l_prod[bi, r]
                if q >= 0:
                    x = done[base + q]
                    if x != x:
                        ok = False
                        break
                    t = max(t, x)
            if not ok:
                continue
            pos[d] += 1
        else:
            lo = split[d]
            while later[d] > 0 and kt[lo] <= now:
                later[d] = _key_pop(kt, kc, ki, lo, later[d])
                y = lo + later[d]
                now_n[d] = _key_push(nt, nc, ni, lo, now_n[d], 0.0, kc[y], ki[y])
            if now_n[d] > 0:
                now_n[d] = _key_pop(nt, nc, ni, lo, now_n[d])
                op = ni[lo + now_n[d]]
                t = now
            elif later[d] > 0:
                later[d] = _key_pop(kt, kc, ki, lo, later[d])
                op = ki[lo + later[d]]
                t = kt[lo + later[d]]
            else:
                continue
            left[d] -= 1
        bi = op % K
        base = op - bi
        begin = max(now, t)
        free_at[d] = begin + l_dur[bi]
        done[op] = free_at[d]
        w = written[d]
        kind[w] = l_kind[bi]
        stage[w] = l_stage[bi]
        mb[w] = op // K
        dev[w] = d
        slot[w] = w - dptr[d]
        written[d] = w + 1
        ran += 1
        if (pos[d] < split[d] or left[d] > 0) and not queued[d]:
            size = _dev_push(ht, hd, size, free_at[d], d)
            queued[d] = True
        for r in range(l_cons.shape[1]):
            c = l_cons[bi, r]
            if c < 0:
                continue
            cop = base + c
            e = l_dev[c]
            if rank[cop] >= 0:
                t = 0.0
                ok = True
                for r2 in range(l_prod.shape[1]):
                    q = l_prod[c, r2]
                    if q >= 0:
                        x = done[base + q]
                        if x != x:
                            ok = False
                            break
                        t = max(t, x)
                if ok:
                    code = np.int64(rank[cop])
                    if l_kind[c] == 2:
                        code += n
                    later[e] = _key_push(kt, kc, ki, split[e], later[e], t, code, cop)
            if e != d and not queued[e]:
                size = _dev_push(ht, hd, size, free_at[e], e)
                queued[e] = True
    return kind, stage, mb, dev, slot, ran

"""Batched kernels for many configurations of a few schedule structures.

Two ways to evaluate a configuration, with the same semantics as
``listsched.list_schedule`` (docs/semantics.md):

* ``replay_groups`` replays a precomputed execution order with LANES
  configurations side by side. It is exact because an op's start is a max
  over its device's free time and its inputs' arrivals (order-free), and a
  link's transfers are queued in its one sender's program order, which any
  dependency-respecting order keeps. A link with more than one sender would
  break this; the network model has none (each directed link is sent on by
  its source device only). Arrivals live in rows reused once read
  (``transfer_slots``), so its buffer is small at any schedule size.
* ``list_groups`` runs the full list scheduler per configuration, each on
  its own structure; it is the fallback and the cross-check.

Both take a *pack*: several structures' arrays concatenated, indexed by
per-structure offsets, so a batch may mix structures (a ragged batch) in
one kernel call. Neither raises; a status per configuration says whether
it ran.
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .codes import N_CLASSES as N_CLS
from .codes import (
    O_BUSY_MAX,
    O_BUSY_SUM,
    O_MAKESPAN,
    O_PEAK_ACT,
    O_PEAK_TOTAL,
    O_SPAN_MAX,
    P_ACT,
    P_ACTW,
    P_B,
    P_BW,
    P_BYTES,
    P_CKPT,
    P_COMM,
    P_F,
    P_FB,
    P_GRAD,
    P_IBW,
    P_ILAT,
    P_LAT,
    P_R,
    P_W,
    P_WEIGHTS,
    STATUS_DEADLOCK,
    STATUS_OK,
)
from .listsched import list_units, program_units

LANES = 64  # one AVX-512 register of float64; also fine on AVX2 (two)

# Rows of the kernels' op arrays are cost classes (kernels/codes.py). An
# overlapped pair's duration code is N_CLS + N_CLS * class of F + class of
# B. Schedules with offload (O, L) never reach these kernels (their memory
# moves at copy times).


@njit(cache=True)
def execution_order(dev_ptr, dep, xfer, paired, out_ptr, x_dst_dev, order):
    """Write the head rows of execution units (an op, or an overlapped pair)
    into ``order`` in one dependency-respecting order; return how many.

    Fewer than the number of units means the schedule deadlocks. It visits
    devices exactly as ``list_schedule`` does, without times.
    """
    p = dev_ptr.shape[0] - 1
    n = dep.shape[0]
    nx = x_dst_dev.shape[0]
    done = np.zeros(n, dtype=np.bool_)
    x_done = np.zeros(nx, dtype=np.bool_)
    head = np.empty(p, dtype=np.int64)
    stack = np.empty(p, dtype=np.int64)
    queued = np.ones(p, dtype=np.bool_)
    top = 0
    for d in range(p - 1, -1, -1):
        head[d] = dev_ptr[d]
        stack[top] = d
        top += 1
    count = 0
    while top > 0:
        top -= 1
        d = stack[top]
        queued[d] = False
        h = head[d]
        end = dev_ptr[d + 1]
        while h < end:
            last = h + 1 if h + 1 < end and paired[h + 1] else h
            ready = True
            for r in range(h, last + 1):
                for j in range(2):
                    q = dep[r, j]
                    if q < 0:
                        continue
                    x = xfer[r, j]
                    if (x >= 0 and not x_done[x]) or (x < 0 and not done[q]):
                        ready = False
                        break
                if not ready:
                    break
            if not ready:
                break
            order[count] = h
            count += 1
            for r in range(h, last + 1):
                done[r] = True
                for x in range(out_ptr[r], out_ptr[r + 1]):
                    x_done[x] = True
                    c = x_dst_dev[x]
                    if not queued[c]:
                        queued[c] = True
                        stack[top] = c
                        top += 1
            h = last + 1
        head[d] = h
    return count


@njit(cache=True, inline="always")
def _share(value, cdiv, p, n_stages):
    # Costs.stage_arrays' rule for a scalar per-device-share value.
    if cdiv > 0:
        return value / cdiv
    return value * p / n_stages


@njit(cache=True, parallel=True)
def fill_row(dst, row, src, value, lo, hi, n_chunks):
    """``dst[row] = src`` (or ``value`` where ``src`` is empty), over all
    threads; chunk c's smallest and largest value go to ``lo[c]``,
    ``hi[c]`` (NaN when the chunk holds a NaN), so the caller checks a
    million-row column with two tiny reductions."""
    n = dst.shape[1]
    const = src.shape[0] == 0
    for c in prange(n_chunks):
        a = c * n // n_chunks
        b = (c + 1) * n // n_chunks
        mn = np.inf
        mx = -np.inf
        nan = False
        for k in range(a, b):
            v = value if const else src[k]
            dst[row, k] = v
            if v != v:
                nan = True
            if v < mn:
                mn = v
            if v > mx:
                mx = v
        lo[c] = np.nan if nan else mn
        hi[c] = np.nan if nan else mx


@njit(cache=True, parallel=True)
def sweep_metrics(out, devices, microbatches, ratio, rate, throughput):
    """Bubble ratio, bubble rate and throughput per configuration from the
    output rows, in one pass (the formulas of ``scan.batch.metrics_from``)."""
    for k in prange(out.shape[1]):
        makespan = out[O_MAKESPAN, k]
        if makespan > 0:
            ratio[k] = 1.0 - out[O_BUSY_SUM, k] / (devices * makespan)
            throughput[k] = microbatches / makespan
        else:
            ratio[k] = 0.0
            throughput[k] = np.inf
        span = out[O_SPAN_MAX, k]
        rate[k] = (span - out[O_BUSY_MAX, k]) / span if span > 0 else 0.0


@njit(cache=True, inline="always")
def _shares(params, row, col, cdiv, p, n_stages, dst):
    # _share for every lane of a group, the cdiv branch outside the lane loop.
    if cdiv > 0:
        for lane in range(dst.shape[0]):
            dst[lane] = params[row, col[lane]] / cdiv
    else:
        for lane in range(dst.shape[0]):
            dst[lane] = params[row, col[lane]] * p / n_stages


# Monte Carlo's per-op-scaled replay is replay_scaled below, not a flag here:
# see the comment there.
@njit(cache=True)
def transfer_slots(u_in_ptr, in_x, u_out0, u_out1, x_slot, in_slot):
    """Rows of the replay's arrival buffer for each transfer, reused once
    the transfer's consumer has run; returns how many rows, or -1 when a
    unit waits for a transfer no earlier unit produced.

    Units run in order; each reads its incoming transfers (``in_x``, CSR
    by ``u_in_ptr``) before it writes its outgoing ones (``u_out0[u]`` to
    ``u_out1[u] - 1``), and every transfer has one consumer, so a row is
    free again from its consumer on. ``x_slot`` (n transfers, filled here)
    and ``in_slot`` (``in_x``'s rows) are the caller's.
    """
    for x in range(x_slot.shape[0]):
        x_slot[x] = -1
    free = np.empty(x_slot.shape[0] + 1, np.int32)
    top = 0
    n_slots = 0
    for u in range(u_out0.shape[0]):
        for j in range(u_in_ptr[u], u_in_ptr[u + 1]):
            s = x_slot[in_x[j]]
            if s < 0:
                return -1
            in_slot[j] = s
            free[top] = s
            top += 1
        for x in range(u_out0[u], u_out1[u]):
            if top > 0:
                top -= 1
                x_slot[x] = free[top]
            else:
                x_slot[x] = n_slots
                n_slots += 1
    return n_slots


@njit(cache=True, parallel=True)
def replay_groups(s_u0, s_u1, s_x0, s_d0, s_p, s_nl, s_S, s_cdiv,
                  u_dev, u_k1, u_k2, u_first, u_in_ptr, in_slot, u_out0, u_out1,
                  x_link, x_code, x_slot, d_copies, d_has, s_b0, s_b1, b_dev, b_code, b_cnt,
                  g_struct, g_lo, g_hi, n_chunks, max_p, max_nl, max_slots,
                  params, out, track_mem):
    """Replay each structure's execution order for groups of up to LANES
    configurations that share it.

    Group g holds configurations ``g_lo[g]..g_hi[g]-1`` (columns of
    ``params`` and ``out``) of structure ``g_struct[g]``; unused lanes
    repeat the group's last configuration and are not written.
    ``x_code`` is 2 * (all-reduce) + (crosses nodes) per transfer: it picks
    the bytes (activation or gradient) and the link level. Arrivals live in
    rows of a small buffer (``x_slot`` per transfer, ``in_slot`` per
    incoming edge: :func:`transfer_slots`), reused once consumed, so the
    buffer stays in cache at any schedule size. With
    ``track_mem`` False the memory rows of ``out`` are not written (the
    caller fills them when every configuration has the same memory costs).
    Busy time per device is ``sum(b_cnt * cost of b_code)`` over the
    structure's entries ``s_b0[s]..s_b1[s]-1`` (units counted by device and
    cost code), not summed unit by unit.
    """
    G = g_struct.shape[0]
    L = LANES
    for c in prange(n_chunks):
        g_begin = c * G // n_chunks
        g_end = (c + 1) * G // n_chunks
        dev_free = np.empty((max_p, L))
        busy = np.empty((max_p, L))
        first = np.empty((max_p, L))
        mem = np.empty((max_p, L))
        peak = np.empty((max_p, L))
        link_free = np.empty((max_nl, L))
        arr = np.empty((max_slots, L))
        cost = np.empty((N_CLS, L))
        fb = np.empty(L)
        act = np.empty(L)
        actw = np.empty(L)
        ckpt = np.empty(L)
        ser = np.empty((4, L))
        lat = np.empty((2, L))
        t = np.empty(L)
        ff = np.empty(L)
        col = np.empty(L, dtype=np.int64)
        ser_any = np.empty(4, dtype=np.bool_)
        fs_ = np.empty(L)
        bs_ = np.empty(L)
        ws_ = np.empty(L)
        rs_ = np.empty(L)
        wsh = np.empty(L)
        e_top = np.empty(L)
        e_total = np.empty(L)
        e_most = np.empty(L)
        e_widest = np.empty(L)
        e_best = np.empty(L)
        e_whole = np.empty(L)
        for g in range(g_begin, g_end):
            s = g_struct[g]
            p = s_p[s]
            n_stages = s_S[s]
            cdiv = s_cdiv[s]
            for lane in range(L):
                k = g_lo[g] + lane
                if k >= g_hi[g]:
                    k = g_hi[g] - 1
                col[lane] = k
            # Parameters row by row with the lane loop inside (packed loads
            # and divisions; the cdiv branch is per group, not per lane).
            _shares(params, P_F, col, cdiv, p, n_stages, fs_)
            _shares(params, P_B, col, cdiv, p, n_stages, bs_)
            _shares(params, P_W, col, cdiv, p, n_stages, ws_)
            _shares(params, P_R, col, cdiv, p, n_stages, rs_)
            _shares(params, P_ACT, col, cdiv, p, n_stages, act)
            _shares(params, P_ACTW, col, cdiv, p, n_stages, actw)
            _shares(params, P_CKPT, col, cdiv, p, n_stages, ckpt)
            _shares(params, P_WEIGHTS, col, cdiv, p, n_stages, wsh)
            for lane in range(L):
                k = col[lane]
                cost[0, lane] = fs_[lane]
                cost[1, lane] = bs_[lane]
                cost[2, lane] = ws_[lane]
                cost[3, lane] = bs_[lane] + ws_[lane]
                cost[4, lane] = 0.0
                cost[5, lane] = rs_[lane]
                cost[6, lane] = 0.0
                cost[7, lane] = 0.0
                cost[8, lane] = fs_[lane]
                fb[lane] = params[P_FB, k]
                ser[0, lane] = params[P_BYTES, k] / params[P_BW, k]
                ser[1, lane] = params[P_BYTES, k] / params[P_IBW, k]
                ser[2, lane] = params[P_GRAD, k] / params[P_BW, k]
                ser[3, lane] = params[P_GRAD, k] / params[P_IBW, k]
                lat[0, lane] = params[P_COMM, k] + params[P_LAT, k]
                lat[1, lane] = params[P_COMM, k] + params[P_ILAT, k]
            # Links that never serialise in this group skip the contention
            # branch: the lane loops stay branch-free (and vectorise).
            for code in range(4):
                ser_any[code] = False
                for lane in range(L):
                    if ser[code, lane] != 0.0:
                        ser_any[code] = True
            for d in range(p):
                for lane in range(L):
                    dev_free[d, lane] = 0.0
                    busy[d, lane] = 0.0
                    first[d, lane] = 0.0
                    mem[d, lane] = 0.0
                    peak[d, lane] = 0.0
            for i in range(s_nl[s]):
                for lane in range(L):
                    link_free[i, lane] = 0.0
            x0 = s_x0[s]
            for u in range(s_u0[s], s_u1[s]):
                d = u_dev[u]
                for lane in range(L):
                    t[lane] = dev_free[d, lane]
                for j in range(u_in_ptr[u], u_in_ptr[u + 1]):
                    x = in_slot[j]
                    for lane in range(L):
                        t[lane] = max(t[lane], arr[x, lane])
                k1 = u_k1[u]
                k2 = u_k2[u]
                # Both stores in one loop: a separate copy loop into
                # dev_free cost about a fifth of the kernel at p=8, m=32.
                if k2 < 0:
                    for lane in range(L):
                        v = t[lane] + cost[k1, lane]
                        ff[lane] = v
                        dev_free[d, lane] = v
                else:
                    for lane in range(L):
                        v = t[lane] + (cost[k1, lane] + cost[k2, lane]) * fb[lane]
                        ff[lane] = v
                        dev_free[d, lane] = v
                if u_first[u]:
                    for lane in range(L):
                        first[d, lane] = t[lane]
                for x in range(u_out0[u], u_out1[u]):
                    code = x_code[x0 + x]
                    link = x_link[x0 + x]
                    row = x_slot[x0 + x]
                    level = code & 1
                    if not ser_any[code]:
                        for lane in range(L):
                            arr[row, lane] = ff[lane] + lat[level, lane]
                        continue
                    for lane in range(L):
                        sr = ser[code, lane]
                        if sr == 0.0:
                            arr[row, lane] = ff[lane] + lat[level, lane]
                        else:
                            st = max(ff[lane], link_free[link, lane])
                            e = st + sr
                            link_free[link, lane] = e
                            arr[row, lane] = e + lat[level, lane]
                if not track_mem:
                    continue
                # Activation total in program order (same arithmetic as peak_memory).
                for r in range(2):
                    k = k1 if r == 0 else k2
                    if k == 0:
                        for lane in range(L):
                            tot = mem[d, lane] + act[lane]
                            mem[d, lane] = tot
                            peak[d, lane] = max(peak[d, lane], tot)
                    elif k == 1:
                        for lane in range(L):
                            mem[d, lane] = mem[d, lane] - (act[lane] - actw[lane])
                    elif k == 2:
                        for lane in range(L):
                            mem[d, lane] = mem[d, lane] - actw[lane]
                    elif k == 3:
                        for lane in range(L):
                            mem[d, lane] = mem[d, lane] - act[lane]
                    elif k == 5:
                        for lane in range(L):
                            tot = mem[d, lane] + (act[lane] - ckpt[lane])
                            mem[d, lane] = tot
                            peak[d, lane] = max(peak[d, lane], tot)
                    elif k == 8:
                        for lane in range(L):
                            tot = mem[d, lane] + ckpt[lane]
                            mem[d, lane] = tot
                            peak[d, lane] = max(peak[d, lane], tot)
            for e in range(s_b0[s], s_b1[s]):
                d = b_dev[e]
                c = b_code[e]
                n_e = b_cnt[e]
                if c < N_CLS:
                    for lane in range(L):
                        busy[d, lane] += n_e * cost[c, lane]
                else:
                    c1 = (c - N_CLS) // N_CLS
                    c2 = (c - N_CLS) % N_CLS
                    for lane in range(L):
                        busy[d, lane] += n_e * ((cost[c1, lane] + cost[c2, lane]) * fb[lane])
            # Per-configuration metrics, devices outer and lanes inner (the
            # same comparisons and sums, in the same order, per lane).
            d0 = s_d0[s]
            for lane in range(L):
                e_top[lane] = 0.0
                e_total[lane] = 0.0
                e_most[lane] = 0.0
                e_widest[lane] = 0.0
                e_best[lane] = 0.0
                e_whole[lane] = 0.0
            for d in range(p):
                has = d_has[d0 + d]
                copies = d_copies[d0 + d]
                for lane in range(L):
                    fin = dev_free[d, lane]
                    if fin > e_top[lane]:
                        e_top[lane] = fin
                    bz = busy[d, lane]
                    e_total[lane] += bz
                    if bz > e_most[lane]:
                        e_most[lane] = bz
                    static = 0.0
                    for _ in range(copies):
                        static += wsh[lane]
                    if has and fin - first[d, lane] > e_widest[lane]:
                        e_widest[lane] = fin - first[d, lane]
                    if peak[d, lane] > e_best[lane]:
                        e_best[lane] = peak[d, lane]
                    if peak[d, lane] + static > e_whole[lane]:
                        e_whole[lane] = peak[d, lane] + static
            for lane in range(L):
                k = col[lane]
                if lane > 0 and k == col[lane - 1]:
                    continue  # padding lane
                out[O_MAKESPAN, k] = e_top[lane]
                out[O_BUSY_SUM, k] = e_total[lane]
                out[O_BUSY_MAX, k] = e_most[lane]
                out[O_SPAN_MAX, k] = e_widest[lane]
                if track_mem:
                    out[O_PEAK_ACT, k] = e_best[lane]
                    out[O_PEAK_TOTAL, k] = e_whole[lane]


@njit(cache=True, parallel=True)
def list_groups(s_r0, s_o0, s_x0, s_d0, s_dp0, s_p, s_nl, s_S, s_cdiv,
                dev_ptr, op_kind, dep, xfer, out_ptr, x_dst_dev, x_link, x_code,
                paired, d_copies, s_b0, s_b1, b_dev, b_code, b_cnt, c_struct, n_chunks,
                max_n, max_nx, max_nl, max_p, params, out, status):
    """Full list scheduling of configuration k on structure ``c_struct[k]``.

    Structures are concatenated: rows ``s_r0[s]..``, transfers ``s_x0[s]..``,
    transfer pointers ``s_o0[s]..s_o0[s]+n`` (local transfer ids),
    device pointers ``s_dp0[s]..s_dp0[s]+p`` (local row offsets). Each
    configuration's durations and transfer times are generated here from
    its parameter column, exactly as ``replay_groups`` does.
    """
    N = c_struct.shape[0]
    n_struct = s_p.shape[0]
    # Each structure's units (listsched.program_units), laid out like its
    # rows: per-unit arrays at s_o0[s] (nu + 1 <= n + 1 entries), unit
    # pointers at s_dp0[s], remote inputs (one per transfer) at s_x0[s].
    u_ptr = np.empty(dev_ptr.shape[0], dtype=np.uint32)
    u_row = np.empty(out_ptr.shape[0], dtype=np.int64)
    u_out = np.empty(out_ptr.shape[0], dtype=np.uint32)
    in_ptr = np.empty(out_ptr.shape[0], dtype=np.uint32)
    in_x = np.empty(max(x_link.shape[0], 1), dtype=np.uint32)
    u_code = np.empty(out_ptr.shape[0], dtype=np.uint8)
    s_nu = np.empty(n_struct, dtype=np.int64)
    for s in range(n_struct):
        p = s_p[s]
        dp0 = s_dp0[s]
        r0 = s_r0[s]
        o0 = s_o0[s]
        x0 = s_x0[s]
        n = dev_ptr[dp0 + p]
        nx = out_ptr[o0 + n]
        nu = program_units(dev_ptr[dp0:dp0 + p + 1], xfer[r0:r0 + n], out_ptr[o0:o0 + n + 1],
                           paired[r0:r0 + n], u_ptr[dp0:dp0 + p + 1], u_row[o0:o0 + n + 1],
                           u_out[o0:o0 + n + 1], in_ptr[o0:o0 + n + 1], in_x[x0:x0 + nx])
        s_nu[s] = nu
        # Index into _list_one's duration table: the class, or the pair code.
        for u in range(nu):
            h = u_row[o0 + u]
            if u_row[o0 + u + 1] - h == 1:
                u_code[o0 + u] = op_kind[r0 + h]
            else:
                u_code[o0 + u] = N_CLS + N_CLS * op_kind[r0 + h] + op_kind[r0 + h + 1]
    # Unsigned views: Numba leaves out its negative-index fix-up.
    dev_ptr_u = dev_ptr.view(np.uint64)
    kinds_u = op_kind.view(np.uint8)
    x_cls = x_code.view(np.uint8)
    x_link_u = x_link.view(np.uint32)
    x_dst_u = x_dst_dev.view(np.uint32)
    no_after = np.full(max_nx, -1, dtype=np.int32)  # packs hold no offload copies
    no_shared = np.zeros(max(max_nl, 1), dtype=np.uint8)  # nor shared host links
    no_xfer = np.empty((0, 2), dtype=np.int32)  # list_units reads the unit arrays
    no_out = np.empty(0, dtype=np.int64)
    for c in prange(n_chunks):
        # Work arrays sized for the largest structure, reused across configurations.
        w_us = np.empty(max_n)
        w_uf = np.empty(max_n)
        w_xs = np.empty(max_nx)
        w_xa = np.empty(max_nx)
        w_link = np.empty(max_nl)
        w_head = np.empty(max_p, dtype=np.uint32)
        w_busy = np.empty(max_p)
        w_free = np.empty(max_p)
        w_first = np.empty(max_p)
        w_stack = np.empty(max_p, dtype=np.uint32)
        w_wait = np.empty(max_p, dtype=np.uint32)
        w_pend = np.empty(max_nx, dtype=np.uint32)
        dur = np.empty(N_CLS + N_CLS * N_CLS)
        ser = np.empty(4)
        lat = np.empty(4)
        delta = np.empty(N_CLS)
        memo_s = np.full(1, -1, dtype=np.int64)  # structure whose peaks memo holds
        memo = np.empty(6)  # act, act_w, weights, ckpt shares; peak activation, peak total
        for k in range(c * N // n_chunks, (c + 1) * N // n_chunks):
            _list_one(k, s_r0, s_o0, s_x0, s_d0, s_dp0, s_p, s_nl, s_S, s_cdiv, s_nu, dev_ptr_u,
                      kinds_u, u_ptr, u_out, in_ptr, in_x, u_code, x_dst_u, x_link_u, x_cls,
                      d_copies, c_struct, params, out, status, w_us, w_uf, w_xs, w_xa, w_link,
                      w_head, w_busy, w_free, w_stack, w_wait, dur, ser, lat, delta, memo_s,
                      memo, no_after, no_shared, no_xfer, no_out, w_pend, s_b0, s_b1, b_dev,
                      b_code, b_cnt, w_first)


@njit(cache=True)
def _list_one(k, s_r0, s_o0, s_x0, s_d0, s_dp0, s_p, s_nl, s_S, s_cdiv, s_nu, dev_ptr,
              op_kind, u_ptr, u_out, in_ptr, in_x, u_code, x_dst_dev, x_link, x_code,
              d_copies, c_struct, params, out, status, w_us, w_uf, w_xs, w_xa, w_link,
              w_head, w_busy, w_free, w_stack, w_wait, dur, ser, lat, delta, memo_s, memo,
              no_after, no_shared, no_xfer, no_out, w_pend, s_b0, s_b1, b_dev, b_code, b_cnt,
              w_first):
    s = c_struct[k]
    p = s_p[s]
    S = s_S[s]
    cdiv = s_cdiv[s]
    x0 = s_x0[s]
    o0 = s_o0[s]
    dp0 = s_dp0[s]
    dp = dev_ptr[dp0:dp0 + p + 1]
    up = u_ptr[dp0:dp0 + p + 1]
    nu = s_nu[s]
    nx = u_out[o0 + nu]
    fs = _share(params[P_F, k], cdiv, p, S)
    bs = _share(params[P_B, k], cdiv, p, S)
    ws = _share(params[P_W, k], cdiv, p, S)
    dur[0] = fs
    dur[1] = bs
    dur[2] = ws
    dur[3] = bs + ws
    dur[4] = 0.0
    dur[5] = _share(params[P_R, k], cdiv, p, S)
    dur[6] = 0.0
    dur[7] = 0.0
    dur[8] = fs
    fb = params[P_FB, k]
    for k1 in range(N_CLS):
        for k2 in range(N_CLS):
            dur[N_CLS + N_CLS * k1 + k2] = (dur[k1] + dur[k2]) * fb
    # Per x_code (2 * all-reduce + crosses nodes): the same divisions and
    # sums as per transfer, done once.
    for code in range(4):
        nbytes = params[P_GRAD, k] if code >= 2 else params[P_BYTES, k]
        if code & 1:
            ser[code] = nbytes / params[P_IBW, k]
            lat[code] = params[P_COMM, k] + params[P_ILAT, k]
        else:
            ser[code] = nbytes / params[P_BW, k]
            lat[code] = params[P_COMM, k] + params[P_LAT, k]
    busy = w_busy[:p]
    free = w_free[:p]
    u_start = w_us[:nu]
    st = list_units(up, u_out[o0:o0 + nu + 1], in_ptr[o0:o0 + nu + 1], in_x[x0:x0 + nx],
                    no_xfer, no_out, u_code[o0:o0 + nu], dur, x_code[x0:x0 + nx], ser, lat,
                    x_link[x0:x0 + nx], x_dst_dev[x0:x0 + nx], no_after[:nx], no_shared, s_nl[s],
                    u_start, w_uf[:nu], w_xs[:nx],
                    w_xa[:nx], w_head[:p], busy, free, w_link, w_stack, w_wait, w_pend,
                    True, True, w_first[:p], True)
    status[k] = st
    if st != STATUS_OK:
        return
    # Busy time from unit counts, as replay_groups computes it (bit for bit).
    for d in range(p):
        busy[d] = 0.0
    for e in range(s_b0[s], s_b1[s]):
        busy[b_dev[e]] += b_cnt[e] * dur[b_code[e]]
    # The last finish per device is its largest (finishes never decrease).
    top = 0.0
    total = 0.0
    most = 0.0
    widest = 0.0
    for d in range(p):
        fin = free[d]
        if fin > top:
            top = fin
        total += busy[d]
        if busy[d] > most:
            most = busy[d]
        if up[d + 1] > up[d] and fin - u_start[up[d]] > widest:
            widest = fin - u_start[up[d]]
    out[O_MAKESPAN, k] = top
    out[O_BUSY_SUM, k] = total
    out[O_BUSY_MAX, k] = most
    out[O_SPAN_MAX, k] = widest
    act = _share(params[P_ACT, k], cdiv, p, S)
    actw = _share(params[P_ACTW, k], cdiv, p, S)
    wsh = _share(params[P_WEIGHTS, k], cdiv, p, S)
    ck = _share(params[P_CKPT, k], cdiv, p, S)
    # The peaks depend on the structure and these four shares only: reuse
    # the previous configuration's when they are equal (sweeps often keep them).
    if not (memo_s[0] == s and memo[0] == act and memo[1] == actw and memo[2] == wsh
            and memo[5] == ck):
        # peak_memory's arithmetic: x - y is exactly x + (-y), and adding 0.0
        # (kind 4) keeps the total, which starts at +0.0 and is never -0.0.
        delta[0] = act
        delta[1] = -(act - actw)
        delta[2] = -actw
        delta[3] = -act
        delta[4] = 0.0
        delta[5] = act - ck
        delta[6] = 0.0
        delta[7] = 0.0
        delta[8] = ck
        kinds = op_kind[s_r0[s]:s_r0[s] + int(dp[p])]
        best = 0.0
        whole = 0.0
        for d in range(p):
            mem = 0.0
            pk = 0.0
            for i in range(dp[d], dp[d + 1]):
                kk = kinds[i]
                mem = mem + delta[kk]
                pk = mem if (kk == 0 or kk == 5 or kk == 8) and mem > pk else pk
            static = 0.0
            for _ in range(d_copies[s_d0[s] + d]):
                static += wsh
            if pk > best:
                best = pk
            if pk + static > whole:
                whole = pk + static
        memo_s[0] = s
        memo[0] = act
        memo[1] = actw
        memo[2] = wsh
        memo[5] = ck
        memo[3] = best
        memo[4] = whole
    out[O_PEAK_ACT, k] = memo[3]
    out[O_PEAK_TOTAL, k] = memo[4]


__all__ = ["LANES", "execution_order", "transfer_slots", "replay_groups", "list_groups", "STATUS_OK",
           "STATUS_DEADLOCK"]

# Kept apart from replay_groups on purpose: Monte Carlo gives every op row its
# own cost and factor (per-stage costs, per-op draws), the sweep one cost per
# class. One kernel would read a per-op, per-lane factor in the sweep's inner
# loop; measured in the issue 13 note.
@njit(cache=True, parallel=True)
def replay_scaled(u_dev, u_r1, u_r2, u_in_ptr, in_x, u_out0, u_out1, x_link, x_ser, x_lat,
                   cost, scale, fb, p, n_links, out):
    """Replay the execution order for draws in groups of LANES; op r of
    draw k takes ``cost[r] * scale[r, k]``. Same arithmetic as run_units."""
    k_all = scale.shape[1]
    nx = x_link.shape[0]
    groups = (k_all + LANES - 1) // LANES
    for g in prange(groups):
        lo = g * LANES
        hi = min(k_all, lo + LANES)
        L = hi - lo
        free = np.zeros((p, L))
        link_free = np.zeros((n_links, L))
        arr = np.empty((max(nx, 1), L))
        t = np.empty(L)
        for u in range(u_dev.shape[0]):
            d = u_dev[u]
            for i in range(L):
                t[i] = free[d, i]
            for j in range(u_in_ptr[u], u_in_ptr[u + 1]):
                x = in_x[j]
                for i in range(L):
                    t[i] = max(t[i], arr[x, i])
            r1 = u_r1[u]
            r2 = u_r2[u]
            for i in range(L):
                c = cost[r1] * scale[r1, lo + i]
                if r2 >= 0:
                    c = (c + cost[r2] * scale[r2, lo + i]) * fb
                t[i] = t[i] + c
                free[d, i] = t[i]
            for x in range(u_out0[u], u_out1[u]):
                sr = x_ser[x]
                lk = x_link[x]
                for i in range(L):
                    if sr == 0.0:
                        arr[x, i] = t[i] + x_lat[x]
                    else:
                        s = max(t[i], link_free[lk, i])
                        e = s + sr
                        link_free[lk, i] = e
                        arr[x, i] = e + x_lat[x]
        for i in range(L):
            top = 0.0
            for d in range(p):
                if free[d, i] > top:
                    top = free[d, i]
            out[lo + i] = top

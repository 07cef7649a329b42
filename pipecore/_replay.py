"""Batched kernels for many configurations of a few schedule structures.

Two ways to evaluate a configuration, with the same semantics as
``_kernels.list_schedule`` (docs/semantics.md):

* ``replay_groups`` replays a precomputed execution order with LANES
  configurations side by side. It is exact because an op's start is a max
  over its device's free time and its inputs' arrivals (order-free), and a
  link's transfers are queued in its one sender's program order, which any
  dependency-respecting order keeps. A link with more than one sender would
  break this; the network model has none (each directed link is sent on by
  its source device only).
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

from ._kernels import STATUS_DEADLOCK, STATUS_OK, list_schedule_ws

LANES = 64  # one AVX-512 register of float64; also fine on AVX2 (two)

# Per-configuration parameter rows (a float64 matrix, one column per config).
P_F, P_B, P_W, P_COMM, P_FB, P_ACT, P_ACTW, P_WEIGHTS = range(8)
P_BYTES, P_GRAD, P_BW, P_LAT, P_IBW, P_ILAT = range(8, 14)
N_PARAMS = 14

# Output rows (float64 matrix, one column per config).
O_MAKESPAN, O_BUSY_SUM, O_BUSY_MAX, O_SPAN_MAX, O_PEAK_ACT, O_PEAK_TOTAL = range(6)
N_OUT = 6


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
def replay_groups(s_u0, s_u1, s_x0, s_d0, s_p, s_nl, s_S, s_cdiv,
                  u_dev, u_k1, u_k2, u_first, u_in_ptr, in_x, u_out0, u_out1,
                  x_link, x_code, d_copies, d_has,
                  g_struct, g_lo, g_hi, n_chunks, max_p, max_nl, max_nx,
                  params, out):
    """Replay each structure's execution order for groups of up to LANES
    configurations that share it.

    Group g holds configurations ``g_lo[g]..g_hi[g]-1`` (columns of
    ``params`` and ``out``) of structure ``g_struct[g]``; unused lanes
    repeat the group's last configuration and are not written.
    ``x_code`` is 2 * (all-reduce) + (crosses nodes) per transfer: it picks
    the bytes (activation or gradient) and the link level.
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
        arr = np.empty((max_nx, L))
        cost = np.empty((5, L))
        fb = np.empty(L)
        act = np.empty(L)
        actw = np.empty(L)
        ser = np.empty((4, L))
        lat = np.empty((2, L))
        t = np.empty(L)
        ff = np.empty(L)
        col = np.empty(L, dtype=np.int64)
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
                fs = _share(params[P_F, k], cdiv, p, n_stages)
                bs = _share(params[P_B, k], cdiv, p, n_stages)
                ws = _share(params[P_W, k], cdiv, p, n_stages)
                cost[0, lane] = fs
                cost[1, lane] = bs
                cost[2, lane] = ws
                cost[3, lane] = bs + ws
                cost[4, lane] = 0.0
                fb[lane] = params[P_FB, k]
                act[lane] = _share(params[P_ACT, k], cdiv, p, n_stages)
                actw[lane] = _share(params[P_ACTW, k], cdiv, p, n_stages)
                ser[0, lane] = params[P_BYTES, k] / params[P_BW, k]
                ser[1, lane] = params[P_BYTES, k] / params[P_IBW, k]
                ser[2, lane] = params[P_GRAD, k] / params[P_BW, k]
                ser[3, lane] = params[P_GRAD, k] / params[P_IBW, k]
                lat[0, lane] = params[P_COMM, k] + params[P_LAT, k]
                lat[1, lane] = params[P_COMM, k] + params[P_ILAT, k]
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
                    x = in_x[j]
                    for lane in range(L):
                        t[lane] = max(t[lane], arr[x, lane])
                k1 = u_k1[u]
                k2 = u_k2[u]
                if k2 < 0:
                    for lane in range(L):
                        ff[lane] = t[lane] + cost[k1, lane]
                else:
                    for lane in range(L):
                        ff[lane] = t[lane] + (cost[k1, lane] + cost[k2, lane]) * fb[lane]
                for lane in range(L):
                    busy[d, lane] += ff[lane] - t[lane]
                    dev_free[d, lane] = ff[lane]
                if u_first[u]:
                    for lane in range(L):
                        first[d, lane] = t[lane]
                for x in range(u_out0[u], u_out1[u]):
                    code = x_code[x0 + x]
                    link = x_link[x0 + x]
                    level = code & 1
                    for lane in range(L):
                        sr = ser[code, lane]
                        if sr == 0.0:
                            arr[x, lane] = ff[lane] + lat[level, lane]
                        else:
                            st = max(ff[lane], link_free[link, lane])
                            e = st + sr
                            link_free[link, lane] = e
                            arr[x, lane] = e + lat[level, lane]
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
            d0 = s_d0[s]
            for lane in range(L):
                k = col[lane]
                if lane > 0 and k == col[lane - 1]:
                    continue  # padding lane
                wsh = _share(params[P_WEIGHTS, k], cdiv, p, n_stages)
                top = 0.0
                total = 0.0
                most = 0.0
                widest = 0.0
                best = 0.0
                whole = 0.0
                for d in range(p):
                    fin = dev_free[d, lane]
                    if fin > top:
                        top = fin
                    bz = busy[d, lane]
                    total += bz
                    if bz > most:
                        most = bz
                    static = 0.0
                    for _ in range(d_copies[d0 + d]):
                        static += wsh
                    if d_has[d0 + d] and fin - first[d, lane] > widest:
                        widest = fin - first[d, lane]
                    if peak[d, lane] > best:
                        best = peak[d, lane]
                    if peak[d, lane] + static > whole:
                        whole = peak[d, lane] + static
                out[O_MAKESPAN, k] = top
                out[O_BUSY_SUM, k] = total
                out[O_BUSY_MAX, k] = most
                out[O_SPAN_MAX, k] = widest
                out[O_PEAK_ACT, k] = best
                out[O_PEAK_TOTAL, k] = whole


@njit(cache=True, parallel=True)
def list_groups(s_r0, s_o0, s_x0, s_d0, s_dp0, s_p, s_nl, s_S, s_cdiv,
                dev_ptr, op_kind, dep, xfer, out_ptr, x_dst_dev, x_link, x_code,
                paired, d_copies, c_struct, n_chunks, max_n, max_nx, max_nl, max_p,
                params, out, status):
    """Full list scheduling of configuration k on structure ``c_struct[k]``.

    Structures are concatenated: rows ``s_r0[s]..``, transfers ``s_x0[s]..``,
    transfer pointers ``s_o0[s]..s_o0[s]+n`` (local transfer ids),
    device pointers ``s_dp0[s]..s_dp0[s]+p`` (local row offsets). Each
    configuration's durations and transfer times are generated here from
    its parameter column, exactly as ``replay_groups`` does.
    """
    N = c_struct.shape[0]
    for c in prange(n_chunks):
        # Work arrays sized for the largest structure, reused across configurations.
        w_start = np.empty(max_n)
        w_finish = np.empty(max_n)
        w_stage0 = np.zeros(max_n, dtype=np.int32)  # one cost column serves every stage
        w_done = np.empty(max_n, dtype=np.bool_)
        w_ser = np.empty(max_nx)
        w_lat = np.empty(max_nx)
        w_xs = np.empty(max_nx)
        w_xa = np.empty(max_nx)
        w_xdone = np.empty(max_nx, dtype=np.bool_)
        w_link = np.empty(max_nl)
        w_head = np.empty(max_p, dtype=np.int64)
        w_stack = np.empty(max_p, dtype=np.int64)
        w_queued = np.empty(max_p, dtype=np.bool_)
        w_free = np.empty(max_p)
        cost = np.empty((5, 1))
        for k in range(c * N // n_chunks, (c + 1) * N // n_chunks):
            _list_one(k, s_r0, s_o0, s_x0, s_d0, s_dp0, s_p, s_nl, s_S, s_cdiv, dev_ptr, op_kind,
                      dep, xfer, out_ptr, x_dst_dev, x_link, x_code, paired, d_copies, c_struct,
                      params, out, status, w_start, w_finish, w_stage0, w_done, w_ser, w_lat,
                      w_xs, w_xa, w_xdone, w_link, w_head, w_stack, w_queued, w_free, cost)


@njit(cache=True)
def _list_one(k, s_r0, s_o0, s_x0, s_d0, s_dp0, s_p, s_nl, s_S, s_cdiv, dev_ptr, op_kind,
              dep, xfer, out_ptr, x_dst_dev, x_link, x_code, paired, d_copies, c_struct,
              params, out, status, w_start, w_finish, w_stage0, w_done, w_ser, w_lat,
              w_xs, w_xa, w_xdone, w_link, w_head, w_stack, w_queued, w_free, cost):
    s = c_struct[k]
    p = s_p[s]
    S = s_S[s]
    cdiv = s_cdiv[s]
    r0 = s_r0[s]
    x0 = s_x0[s]
    dp = dev_ptr[s_dp0[s]:s_dp0[s] + p + 1]
    n = dp[p]
    o0 = s_o0[s]
    nx = out_ptr[o0 + n]
    kinds = op_kind[r0:r0 + n]
    fs = _share(params[P_F, k], cdiv, p, S)
    bs = _share(params[P_B, k], cdiv, p, S)
    ws = _share(params[P_W, k], cdiv, p, S)
    cost[0, 0] = fs
    cost[1, 0] = bs
    cost[2, 0] = ws
    cost[3, 0] = bs + ws
    cost[4, 0] = 0.0
    ser = w_ser[:nx]
    lat = w_lat[:nx]
    for x in range(nx):
        code = x_code[x0 + x]
        nbytes = params[P_GRAD, k] if code >= 2 else params[P_BYTES, k]
        if code & 1:
            ser[x] = nbytes / params[P_IBW, k]
            lat[x] = params[P_COMM, k] + params[P_ILAT, k]
        else:
            ser[x] = nbytes / params[P_BW, k]
            lat[x] = params[P_COMM, k] + params[P_LAT, k]
    start = w_start[:n]
    finish = w_finish[:n]
    head = w_head[:p]
    st = list_schedule_ws(dp, kinds, w_stage0[:n], dep[r0:r0 + n], xfer[r0:r0 + n],
                          out_ptr[o0:o0 + n + 1], x_dst_dev[x0:x0 + nx], x_link[x0:x0 + nx],
                          ser, lat, cost, s_nl[s], paired[r0:r0 + n], params[P_FB, k],
                          start, finish, w_xs[:nx], w_xa[:nx], head,
                          w_done, w_xdone, w_link, w_stack, w_queued, w_free)
    status[k] = st
    if st != STATUS_OK:
        return
    act = _share(params[P_ACT, k], cdiv, p, S)
    actw = _share(params[P_ACTW, k], cdiv, p, S)
    wsh = _share(params[P_WEIGHTS, k], cdiv, p, S)
    top = 0.0
    total = 0.0
    most = 0.0
    widest = 0.0
    best = 0.0
    whole = 0.0
    for d in range(p):
        lo = dp[d]
        hi = dp[d + 1]
        busy = 0.0
        mem = 0.0
        pk = 0.0
        for i in range(lo, hi):
            if not paired[r0 + i]:
                busy += finish[i] - start[i]
            if finish[i] > top:
                top = finish[i]
            kk = kinds[i]
            if kk == 0:
                mem = mem + act
                if mem > pk:
                    pk = mem
            elif kk == 1:
                mem = mem - (act - actw)
            elif kk == 2:
                mem = mem - actw
            elif kk == 3:
                mem = mem - act
        total += busy
        if busy > most:
            most = busy
        if hi > lo and finish[hi - 1] - start[lo] > widest:
            widest = finish[hi - 1] - start[lo]
        static = 0.0
        for _ in range(d_copies[s_d0[s] + d]):
            static += wsh
        if pk > best:
            best = pk
        if pk + static > whole:
            whole = pk + static
    out[O_MAKESPAN, k] = top
    out[O_BUSY_SUM, k] = total
    out[O_BUSY_MAX, k] = most
    out[O_SPAN_MAX, k] = widest
    out[O_PEAK_ACT, k] = best
    out[O_PEAK_TOTAL, k] = whole


__all__ = ["LANES", "execution_order", "replay_groups", "list_groups", "STATUS_OK",
           "STATUS_DEADLOCK"]

"""Batched kernels for many configurations of a few schedule structures.

Two ways to evaluate a configuration, with the same semantics as
the list scheduler, ``listsched.run_units`` (docs/semantics.md):

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

from .carriers import (
    ConfigTables,
    ListScratch,
    PackPrograms,
    PackRows,
    PackTransfers,
    Times,
    TransferCosts,
    Units,
)
from .codes import (
    AR,
    BW,
    F_DROP,
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
    B,
    F,
    O,
    R,
    W,
)
from .codes import N_CLASSES as N_CLS
from .codes import L as L_KIND
from .links import on_link
from .listsched import list_units, program_units
from .visits import pop, push_all, push_once

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
    devices exactly as ``listsched.list_units`` does, without times.
    """
    p = dev_ptr.shape[0] - 1
    n = dep.shape[0]
    nx = x_dst_dev.shape[0]
    done = np.zeros(n, dtype=np.bool_)
    x_done = np.zeros(nx, dtype=np.bool_)
    head = np.empty(p, dtype=np.int64)
    for d in range(p):
        head[d] = dev_ptr[d]
    queued = np.empty(p, dtype=np.bool_)
    stack = np.empty(p, dtype=np.int64)
    top = push_all(queued, stack)
    count = 0
    while top > 0:
        top, d = pop(queued, stack, top)
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
                    top = push_once(x_dst_dev[x], queued, stack, top)
            h = last + 1
        head[d] = h
    return count


@njit(cache=True, inline="always")
def _share(value, cdiv, p, n_stages):
    # Costs.stage_arrays' rule for a scalar per-device-share value.
    if cdiv > 0:
        return value / cdiv
    return value * p / n_stages


@njit(cache=True, inline="always")
def _shares(params, row, col, cdiv, p, n_stages, dst):
    # _share for every lane of a group, the cdiv branch outside the lane loop.
    if cdiv > 0:
        for lane in range(dst.shape[0]):
            dst[lane] = params[row, col[lane]] / cdiv
    else:
        for lane in range(dst.shape[0]):
            dst[lane] = params[row, col[lane]] * p / n_stages


@njit(cache=True, inline="always")
def _unit_ready(t, free, d, arr, rows, lo, hi, L):
    # Each lane's start of a unit of device d: when the device is free and the
    # inputs in arrival rows rows[lo:hi] have arrived (a lane loop per row).
    for lane in range(L):
        t[lane] = free[d, lane]
    for j in range(lo, hi):
        x = rows[j]
        for lane in range(L):
            t[lane] = max(t[lane], arr[x, lane])


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
def replay_groups(structs, units, transfers, groups, n_chunks, params, out, track_mem):
    """Replay each structure's execution order for groups of up to LANES
    configurations that share it.

    ``structs`` (``Structures``), ``units`` (``ReplayUnits``) and
    ``transfers`` (``PackTransfers``) are the pack; group g of ``groups``
    holds configurations ``groups.lo[g]..groups.hi[g]-1`` (columns of
    ``params`` and ``out``) of structure ``groups.structure[g]``; unused
    lanes repeat the group's last configuration and are not written.
    ``transfers.code`` is 2 * (all-reduce) + (crosses nodes) per transfer:
    it picks the bytes (activation or gradient) and the link level.
    Arrivals live in rows of a small buffer (``transfers.slot`` per
    transfer, ``units.in_slot`` per incoming edge: :func:`transfer_slots`),
    reused once consumed, so the buffer stays in cache at any schedule
    size. With ``track_mem`` False the memory rows of ``out`` are not
    written (the caller fills them when every configuration has the same
    memory costs). Busy time per device is the sum of count * cost of code
    over the structure's busy counts (units counted by device and cost
    code), not summed unit by unit.
    """
    # Locals for the carriers' fields: the loops below read them by name.
    unit_lo = structs.unit_lo
    unit_hi = structs.unit_hi
    xfer_lo = structs.xfer_lo
    dev_lo = structs.dev_lo
    n_devices = structs.devices
    n_links = structs.links
    n_stages_of = structs.stages
    chunks_div = structs.chunks_div
    count_lo = structs.count_lo
    count_hi = structs.count_hi
    copies_of = structs.copies
    has_ops = structs.has_ops
    count_dev = structs.count_dev
    count_code = structs.count_code
    count_n = structs.count_n
    max_p = structs.max_devices
    max_nl = structs.max_links
    max_slots = structs.max_slots
    unit_dev = units.device
    unit_cls1 = units.cls1
    unit_cls2 = units.cls2
    unit_first = units.first
    in_ptr = units.in_ptr
    in_slot = units.in_slot
    send_lo = units.send_lo
    send_hi = units.send_hi
    x_link = transfers.link
    x_code = transfers.code
    x_slot = transfers.slot
    g_struct = groups.structure
    g_lo = groups.lo
    g_hi = groups.hi
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
        f_share = np.empty(L)
        b_share = np.empty(L)
        w_share = np.empty(L)
        r_share = np.empty(L)
        weights = np.empty(L)
        makespan = np.empty(L)
        busy_sum = np.empty(L)
        busy_max = np.empty(L)
        span_max = np.empty(L)
        peak_act = np.empty(L)
        peak_total = np.empty(L)
        for g in range(g_begin, g_end):
            s = g_struct[g]
            p = n_devices[s]
            n_stages = n_stages_of[s]
            cdiv = chunks_div[s]
            for lane in range(L):
                k = g_lo[g] + lane
                if k >= g_hi[g]:
                    k = g_hi[g] - 1
                col[lane] = k
            # Parameters row by row with the lane loop inside (packed loads
            # and divisions; the cdiv branch is per group, not per lane).
            _shares(params, P_F, col, cdiv, p, n_stages, f_share)
            _shares(params, P_B, col, cdiv, p, n_stages, b_share)
            _shares(params, P_W, col, cdiv, p, n_stages, w_share)
            _shares(params, P_R, col, cdiv, p, n_stages, r_share)
            _shares(params, P_ACT, col, cdiv, p, n_stages, act)
            _shares(params, P_ACTW, col, cdiv, p, n_stages, actw)
            _shares(params, P_CKPT, col, cdiv, p, n_stages, ckpt)
            _shares(params, P_WEIGHTS, col, cdiv, p, n_stages, weights)
            for lane in range(L):
                k = col[lane]
                cost[F, lane] = f_share[lane]
                cost[B, lane] = b_share[lane]
                cost[W, lane] = w_share[lane]
                cost[BW, lane] = b_share[lane] + w_share[lane]
                cost[AR, lane] = 0.0
                cost[R, lane] = r_share[lane]
                cost[O, lane] = 0.0
                cost[L_KIND, lane] = 0.0
                cost[F_DROP, lane] = f_share[lane]
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
            for i in range(n_links[s]):
                for lane in range(L):
                    link_free[i, lane] = 0.0
            x0 = xfer_lo[s]
            for u in range(unit_lo[s], unit_hi[s]):
                d = unit_dev[u]
                _unit_ready(t, dev_free, d, arr, in_slot, in_ptr[u], in_ptr[u + 1], L)
                cls1 = unit_cls1[u]
                cls2 = unit_cls2[u]
                # Both stores in one loop: a separate copy loop into
                # dev_free costs a large share of the kernel at small p.
                if cls2 < 0:
                    for lane in range(L):
                        v = t[lane] + cost[cls1, lane]
                        ff[lane] = v
                        dev_free[d, lane] = v
                else:
                    for lane in range(L):
                        v = t[lane] + (cost[cls1, lane] + cost[cls2, lane]) * fb[lane]
                        ff[lane] = v
                        dev_free[d, lane] = v
                if unit_first[u]:
                    for lane in range(L):
                        first[d, lane] = t[lane]
                for x in range(send_lo[u], send_hi[u]):
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
                            _, e = on_link(ff[lane], sr, link_free, (link, lane))
                            arr[row, lane] = e + lat[level, lane]
                if not track_mem:
                    continue
                # Activation total in program order (same arithmetic as peak_memory).
                for r in range(2):
                    cls = cls1 if r == 0 else cls2
                    if cls == F:
                        for lane in range(L):
                            tot = mem[d, lane] + act[lane]
                            mem[d, lane] = tot
                            peak[d, lane] = max(peak[d, lane], tot)
                    elif cls == B:
                        for lane in range(L):
                            mem[d, lane] = mem[d, lane] - (act[lane] - actw[lane])
                    elif cls == W:
                        for lane in range(L):
                            mem[d, lane] = mem[d, lane] - actw[lane]
                    elif cls == BW:
                        for lane in range(L):
                            mem[d, lane] = mem[d, lane] - act[lane]
                    elif cls == R:
                        for lane in range(L):
                            tot = mem[d, lane] + (act[lane] - ckpt[lane])
                            mem[d, lane] = tot
                            peak[d, lane] = max(peak[d, lane], tot)
                    elif cls == F_DROP:
                        for lane in range(L):
                            tot = mem[d, lane] + ckpt[lane]
                            mem[d, lane] = tot
                            peak[d, lane] = max(peak[d, lane], tot)
            for e in range(count_lo[s], count_hi[s]):
                d = count_dev[e]
                c = count_code[e]
                n_e = count_n[e]
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
            d0 = dev_lo[s]
            for lane in range(L):
                makespan[lane] = 0.0
                busy_sum[lane] = 0.0
                busy_max[lane] = 0.0
                span_max[lane] = 0.0
                peak_act[lane] = 0.0
                peak_total[lane] = 0.0
            for d in range(p):
                has = has_ops[d0 + d]
                copies = copies_of[d0 + d]
                for lane in range(L):
                    fin = dev_free[d, lane]
                    if fin > makespan[lane]:
                        makespan[lane] = fin
                    bz = busy[d, lane]
                    busy_sum[lane] += bz
                    if bz > busy_max[lane]:
                        busy_max[lane] = bz
                    static = 0.0
                    for _ in range(copies):
                        static += weights[lane]
                    if has and fin - first[d, lane] > span_max[lane]:
                        span_max[lane] = fin - first[d, lane]
                    if peak[d, lane] > peak_act[lane]:
                        peak_act[lane] = peak[d, lane]
                    if peak[d, lane] + static > peak_total[lane]:
                        peak_total[lane] = peak[d, lane] + static
            for lane in range(L):
                k = col[lane]
                if lane > 0 and k == col[lane - 1]:
                    continue  # padding lane
                out[O_MAKESPAN, k] = makespan[lane]
                out[O_BUSY_SUM, k] = busy_sum[lane]
                out[O_BUSY_MAX, k] = busy_max[lane]
                out[O_SPAN_MAX, k] = span_max[lane]
                if track_mem:
                    out[O_PEAK_ACT, k] = peak_act[lane]
                    out[O_PEAK_TOTAL, k] = peak_total[lane]


@njit(cache=True, parallel=True)
def list_groups(structs, rows, transfers, c_struct, n_chunks, params, out, status):
    """Full list scheduling of configuration k on structure ``c_struct[k]``.

    ``structs`` (``Structures``) indexes the concatenated ``rows``
    (``PackRows``) and ``transfers`` (``PackTransfers``): rows from
    ``row_lo[s]``, transfers from ``xfer_lo[s]``, transfer pointers
    ``ptr_lo[s]..ptr_lo[s]+n`` (local transfer ids), device pointers
    ``devptr_lo[s]..devptr_lo[s]+p`` (local row offsets). Each
    configuration's durations and transfer times are generated here from
    its parameter column, exactly as ``replay_groups`` does; ``status[k]``
    receives its list scheduler's status.
    """
    N = c_struct.shape[0]
    n_struct = structs.devices.shape[0]
    dev_ptr = rows.dev_ptr
    op_class = rows.op_class
    xfer = rows.xfer
    out_ptr = rows.out_ptr
    paired = rows.paired
    max_p = structs.max_devices
    max_nl = structs.max_links
    max_n = structs.max_rows
    max_nx = structs.max_transfers
    # Each structure's units (listsched.program_units), laid out like its
    # rows: per-unit arrays at ptr_lo[s] (nu + 1 <= n + 1 entries), unit
    # pointers at devptr_lo[s], remote inputs (one per transfer) at xfer_lo[s].
    dev_units = np.empty(dev_ptr.shape[0], dtype=np.uint32)
    unit_rows = np.empty(out_ptr.shape[0], dtype=np.int64)
    unit_sends = np.empty(out_ptr.shape[0], dtype=np.uint32)
    wait_ptr = np.empty(out_ptr.shape[0], dtype=np.uint32)
    waits = np.empty(max(transfers.link.shape[0], 1), dtype=np.uint32)
    # uint32 codes, as the single-schedule list scheduler's: one compiled
    # list_units serves both (its codes fit in a byte here).
    unit_code = np.empty(out_ptr.shape[0], dtype=np.uint32)
    n_units = np.empty(n_struct, dtype=np.int64)
    for s in range(n_struct):
        p = structs.devices[s]
        dp0 = structs.devptr_lo[s]
        r0 = structs.row_lo[s]
        o0 = structs.ptr_lo[s]
        x0 = structs.xfer_lo[s]
        n = dev_ptr[dp0 + p]
        nx = out_ptr[o0 + n]
        nu = program_units(dev_ptr[dp0:dp0 + p + 1], xfer[r0:r0 + n], out_ptr[o0:o0 + n + 1],
                           paired[r0:r0 + n], dev_units[dp0:dp0 + p + 1],
                           unit_rows[o0:o0 + n + 1], unit_sends[o0:o0 + n + 1],
                           wait_ptr[o0:o0 + n + 1], waits[x0:x0 + nx])
        n_units[s] = nu
        # Index into _list_one's duration table: the class, or the pair code.
        for u in range(nu):
            h = unit_rows[o0 + u]
            if unit_rows[o0 + u + 1] - h == 1:
                unit_code[o0 + u] = op_class[r0 + h]
            else:
                unit_code[o0 + u] = N_CLS + N_CLS * op_class[r0 + h] + op_class[r0 + h + 1]
    programs = PackPrograms(
        dev_units, unit_sends, wait_ptr, waits, unit_code, n_units,
        np.full(max_nx, -1, dtype=np.int32),  # packs hold no offload copies
        np.zeros(max(max_nl, 1), dtype=np.uint8),  # nor shared host links
        np.empty((0, 2), dtype=np.int32),  # list_units reads the unit arrays
        np.empty(0, dtype=np.int64))
    # Unsigned views: Numba leaves out its negative-index fix-up.
    rows_u = PackRows(dev_ptr.view(np.uint64), op_class.view(np.uint8), xfer, out_ptr, paired)
    transfers_u = PackTransfers(transfers.link.view(np.uint32), transfers.code.astype(np.uint32),
                                transfers.slot)
    for c in prange(n_chunks):
        # Work arrays sized for the largest structure, reused across configurations.
        times = Times(np.empty(max_n), np.empty(max_n), np.empty(max_nx), np.empty(max_nx),
                      np.empty(max_p, dtype=np.uint32), np.empty(max_p), np.empty(max_p),
                      np.empty(max_p))
        work = ListScratch(np.empty(max_nl), np.empty(max_p, dtype=np.uint32),
                           np.empty(max_nx, dtype=np.uint32))
        tables = ConfigTables(np.empty(N_CLS + N_CLS * N_CLS), np.empty(4), np.empty(4),
                              np.empty(N_CLS), np.full(1, -1, dtype=np.int64), np.empty(6))
        for k in range(c * N // n_chunks, (c + 1) * N // n_chunks):
            _list_one(k, c_struct[k], structs, programs, rows_u, transfers_u, params, out,
                      status, times, work, tables)


@njit(cache=True)
def _list_one(k, s, structs, programs, rows, transfers, params, out, status, times, work,
              tables):
    # list_groups' configuration k on structure s: costs from its parameter
    # column, the list scheduler on the structure's units, then the metrics
    # and (memoised) memory peaks into column k of out.
    p = structs.devices[s]
    n_stages = structs.stages[s]
    cdiv = structs.chunks_div[s]
    x0 = structs.xfer_lo[s]
    o0 = structs.ptr_lo[s]
    dp0 = structs.devptr_lo[s]
    dev_ptr = rows.dev_ptr[dp0:dp0 + p + 1]
    dev_units = programs.dev_units[dp0:dp0 + p + 1]
    nu = programs.n_units[s]
    nx = programs.unit_sends[o0 + nu]
    dur = tables.dur
    ser = tables.ser
    lat = tables.lat
    f_share = _share(params[P_F, k], cdiv, p, n_stages)
    b_share = _share(params[P_B, k], cdiv, p, n_stages)
    w_share = _share(params[P_W, k], cdiv, p, n_stages)
    dur[F] = f_share
    dur[B] = b_share
    dur[W] = w_share
    dur[BW] = b_share + w_share
    dur[AR] = 0.0
    dur[R] = _share(params[P_R, k], cdiv, p, n_stages)
    dur[O] = 0.0
    dur[L_KIND] = 0.0
    dur[F_DROP] = f_share
    fb = params[P_FB, k]
    for c1 in range(N_CLS):
        for c2 in range(N_CLS):
            dur[N_CLS + N_CLS * c1 + c2] = (dur[c1] + dur[c2]) * fb
    # Per transfer code (2 * all-reduce + crosses nodes): the same divisions
    # and sums as per transfer, done once.
    for code in range(4):
        nbytes = params[P_GRAD, k] if code >= 2 else params[P_BYTES, k]
        if code & 1:
            ser[code] = nbytes / params[P_IBW, k]
            lat[code] = params[P_COMM, k] + params[P_ILAT, k]
        else:
            ser[code] = nbytes / params[P_BW, k]
            lat[code] = params[P_COMM, k] + params[P_LAT, k]
    busy = times.busy[:p]
    free = times.dev_free[:p]
    u_start = times.start[:nu]
    # list_units never reads unit_rows: an empty int64 array (row_sends) stands in.
    units = Units(nu, dev_units, programs.row_sends, programs.unit_sends[o0:o0 + nu + 1],
                  programs.wait_ptr[o0:o0 + nu + 1], programs.waits[x0:x0 + nx],
                  transfers.link[x0:x0 + nx], programs.x_after[:nx], programs.link_shared,
                  structs.links[s], programs.row_xfer, programs.row_sends)
    st = list_units(units, programs.unit_code[o0:o0 + nu], dur,
                    TransferCosts(transfers.code[x0:x0 + nx], ser, lat),
                    Times(u_start, times.finish[:nu], times.x_start[:nx], times.x_arrival[:nx],
                          times.head[:p], busy, free, times.dev_first[:p]),
                    # Flags as booleans, not literals: the signature of
                    # listsched.run_units' call, so list_units compiles once.
                    work, np.bool_(True), np.bool_(True), np.bool_(True))
    status[k] = st
    if st != STATUS_OK:
        return
    # Busy time from unit counts, as replay_groups computes it (bit for bit).
    for d in range(p):
        busy[d] = 0.0
    # Fields read in loops go to locals first: each read of a carrier's array
    # field inside a loop costs a reference count update.
    count_dev = structs.count_dev
    count_code = structs.count_code
    count_n = structs.count_n
    for e in range(structs.count_lo[s], structs.count_hi[s]):
        busy[count_dev[e]] += count_n[e] * dur[count_code[e]]
    # The last finish per device is its largest (finishes never decrease).
    makespan = 0.0
    busy_sum = 0.0
    busy_max = 0.0
    span_max = 0.0
    for d in range(p):
        fin = free[d]
        if fin > makespan:
            makespan = fin
        busy_sum += busy[d]
        if busy[d] > busy_max:
            busy_max = busy[d]
        if dev_units[d + 1] > dev_units[d] and fin - u_start[dev_units[d]] > span_max:
            span_max = fin - u_start[dev_units[d]]
    out[O_MAKESPAN, k] = makespan
    out[O_BUSY_SUM, k] = busy_sum
    out[O_BUSY_MAX, k] = busy_max
    out[O_SPAN_MAX, k] = span_max
    act = _share(params[P_ACT, k], cdiv, p, n_stages)
    actw = _share(params[P_ACTW, k], cdiv, p, n_stages)
    weights = _share(params[P_WEIGHTS, k], cdiv, p, n_stages)
    ckpt = _share(params[P_CKPT, k], cdiv, p, n_stages)
    # The peaks depend on the structure and these four shares only: reuse
    # the previous configuration's when they are equal (sweeps often keep them).
    memo = tables.memo
    if not (tables.memo_struct[0] == s and memo[0] == act and memo[1] == actw
            and memo[2] == weights and memo[5] == ckpt):
        delta = tables.delta
        # peak_memory's arithmetic: x - y is exactly x + (-y), and adding 0.0
        # (AR, O, L) keeps the total, which starts at +0.0 and is never -0.0.
        delta[F] = act
        delta[B] = -(act - actw)
        delta[W] = -actw
        delta[BW] = -act
        delta[AR] = 0.0
        delta[R] = act - ckpt
        delta[O] = 0.0
        delta[L_KIND] = 0.0
        delta[F_DROP] = ckpt
        kinds = rows.op_class[structs.row_lo[s]:structs.row_lo[s] + int(dev_ptr[p])]
        peak_act = 0.0
        peak_total = 0.0
        d0 = structs.dev_lo[s]
        copies = structs.copies
        for d in range(p):
            mem = 0.0
            pk = 0.0
            for i in range(dev_ptr[d], dev_ptr[d + 1]):
                cls = kinds[i]
                mem = mem + delta[cls]
                pk = mem if (cls == F or cls == R or cls == F_DROP) and mem > pk else pk
            static = 0.0
            for _ in range(copies[d0 + d]):
                static += weights
            if pk > peak_act:
                peak_act = pk
            if pk + static > peak_total:
                peak_total = pk + static
        tables.memo_struct[0] = s
        memo[0] = act
        memo[1] = actw
        memo[2] = weights
        memo[5] = ckpt
        memo[3] = peak_act
        memo[4] = peak_total
    out[O_PEAK_ACT, k] = memo[3]
    out[O_PEAK_TOTAL, k] = memo[4]


# Kept apart from replay_groups on purpose: Monte Carlo gives every op row its
# own cost and factor (per-stage costs, per-op draws), the sweep one cost per
# class. One kernel would read a per-op, per-lane factor in the sweep's inner
# loop (see the issue 13 note).
@njit(cache=True, parallel=True)
def replay_scaled(order, x_ser, x_lat, cost, scale, fb, p, n_links, out):
    """Replay ``order`` (a ``ReplayOrder``) for draws in groups of LANES;
    op r of draw k takes ``cost[r] * scale[r, k]``, transfer x
    ``x_ser[x]`` on its link and ``x_lat[x]`` after; ``out[k]`` receives
    draw k's makespan. Same arithmetic as run_units."""
    unit_dev = order.device
    row1 = order.row1
    row2 = order.row2
    in_ptr = order.in_ptr
    inputs = order.inputs
    send_lo = order.send_lo
    send_hi = order.send_hi
    x_link = order.link
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
        for u in range(unit_dev.shape[0]):
            d = unit_dev[u]
            _unit_ready(t, free, d, arr, inputs, in_ptr[u], in_ptr[u + 1], L)
            r1 = row1[u]
            r2 = row2[u]
            for i in range(L):
                c = cost[r1] * scale[r1, lo + i]
                if r2 >= 0:
                    c = (c + cost[r2] * scale[r2, lo + i]) * fb
                t[i] = t[i] + c
                free[d, i] = t[i]
            for x in range(send_lo[u], send_hi[u]):
                sr = x_ser[x]
                lk = x_link[x]
                for i in range(L):
                    if sr == 0.0:
                        arr[x, i] = t[i] + x_lat[x]
                    else:
                        _, e = on_link(t[i], sr, link_free, (lk, i))
                        arr[x, i] = e + x_lat[x]
        for i in range(L):
            top = 0.0
            for d in range(p):
                if free[d, i] > top:
                    top = free[d, i]
            out[lo + i] = top


__all__ = ["LANES", "execution_order", "transfer_slots", "replay_groups", "list_groups", "STATUS_OK",
           "STATUS_DEADLOCK"]

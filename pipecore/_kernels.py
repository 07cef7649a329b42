"""Numba kernels. They see flat arrays only and never raise: they return a
status code; the Python layer turns it into an error. The semantics they
implement are written down in docs/semantics.md."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

STATUS_OK = 0
STATUS_DEADLOCK = 1


@njit(cache=True)
def list_schedule(dev_ptr, op_kind, op_stage, dep, xfer, out_ptr, x_dst_dev, x_link,
                  x_ser, x_lat, stage_cost, n_links, paired, fb_factor,
                  start, finish, x_start, x_arrival, head):
    """Fill op and transfer times; return a status code.

    Each device runs its program in order; an op starts when the device is
    free and every producer is available (finished locally, or its transfer
    arrived). A transfer is placed on its link as soon as its producer
    finishes: every transfer on link (a, b) is sent by device a, whose ops
    finish in program order at non-decreasing times, so creation order is
    already the link's (ready time, producer row) order. Zero-serialisation
    transfers never occupy a link. A row with ``paired`` set is the B of an
    overlapped F&B unit whose F is the previous row: the two start together
    when both are ready and take ``(F + B) * fb_factor``.

    On return ``head[d]`` is the row of device d's first op that did not
    run (``dev_ptr[d+1]`` when the device finished).
    """
    p = dev_ptr.shape[0] - 1
    n = op_kind.shape[0]
    nx = x_dst_dev.shape[0]
    return list_schedule_ws(dev_ptr, op_kind, op_stage, dep, xfer, out_ptr, x_dst_dev, x_link,
                            x_ser, x_lat, stage_cost, n_links, paired, fb_factor,
                            start, finish, x_start, x_arrival, head,
                            np.empty(n, dtype=np.bool_), np.empty(nx, dtype=np.bool_),
                            np.empty(n_links), np.empty(p, dtype=np.int64),
                            np.empty(p, dtype=np.bool_), np.empty(p))


@njit(cache=True)
def list_schedule_ws(dev_ptr, op_kind, op_stage, dep, xfer, out_ptr, x_dst_dev, x_link,
                     x_ser, x_lat, stage_cost, n_links, paired, fb_factor,
                     start, finish, x_start, x_arrival, head,
                     done, x_done, link_free, stack, queued, dev_free):
    """``list_schedule`` with caller-provided work arrays (at least n, nx,
    n_links, p, p and p long), so a batch reuses them across configurations."""
    p = dev_ptr.shape[0] - 1
    n = op_kind.shape[0]
    nx = x_dst_dev.shape[0]
    done[:n] = False
    x_done[:nx] = False
    link_free[:n_links] = 0.0
    queued[:p] = True
    top = 0
    for d in range(p - 1, -1, -1):
        head[d] = dev_ptr[d]
        stack[top] = d
        top += 1
    dev_free[:p] = 0.0

    while top > 0:
        top -= 1
        d = stack[top]
        queued[d] = False
        h = head[d]
        end = dev_ptr[d + 1]
        t_free = dev_free[d]
        while h < end:
            last = h + 1 if h + 1 < end and paired[h + 1] else h
            t = t_free
            ready = True
            for r in range(h, last + 1):
                for j in range(2):
                    q = dep[r, j]
                    if q < 0:
                        continue
                    x = xfer[r, j]
                    if x >= 0:
                        if not x_done[x]:
                            ready = False
                            break
                        a = x_arrival[x]
                    else:
                        if not done[q]:
                            ready = False
                            break
                        a = finish[q]
                    if a > t:
                        t = a
                if not ready:
                    break
            if not ready:
                break
            if last == h:
                f = t + stage_cost[op_kind[h], op_stage[h]]
            else:
                f = t + (stage_cost[op_kind[h], op_stage[h]]
                         + stage_cost[op_kind[last], op_stage[last]]) * fb_factor
            for r in range(h, last + 1):
                start[r] = t
                finish[r] = f
                done[r] = True
                for x in range(out_ptr[r], out_ptr[r + 1]):
                    ser = x_ser[x]
                    if ser == 0.0:
                        x_start[x] = f
                        x_arrival[x] = f + x_lat[x]
                    else:
                        link = x_link[x]
                        s = f
                        if link_free[link] > s:
                            s = link_free[link]
                        e = s + ser
                        link_free[link] = e
                        x_start[x] = s
                        x_arrival[x] = e + x_lat[x]
                    x_done[x] = True
                    c = x_dst_dev[x]
                    if not queued[c]:
                        queued[c] = True
                        stack[top] = c
                        top += 1
            t_free = f
            h = last + 1
        head[d] = h
        dev_free[d] = t_free

    for d in range(p):
        if head[d] < dev_ptr[d + 1]:
            return STATUS_DEADLOCK
    return STATUS_OK


@njit(cache=True)
def peak_memory(dev_ptr, op_kind, op_stage, act, act_w, peak):
    """Per-device peak of the activation total, in program order."""
    p = dev_ptr.shape[0] - 1
    for d in range(p):
        total = 0.0
        best = 0.0
        for i in range(dev_ptr[d], dev_ptr[d + 1]):
            k = op_kind[i]
            s = op_stage[i]
            if k == 0:
                total = total + act[s]
                if total > best:
                    best = total
            elif k == 1:
                total = total - (act[s] - act_w[s])
            elif k == 2:
                total = total - act_w[s]
            elif k == 3:
                total = total - act[s]
            # k == 4 (all-reduce) holds no activation
        peak[d] = best


@njit(cache=True, parallel=True)
def simulate_batch(dev_ptr, op_kind, op_stage, dep, xfer, out_ptr, x_dst_dev, x_link, n_links,
                   paired, x_send_stage, x_ser, x_net_lat, n_stages, chunks_div, devices,
                   f, b, w, comm, fb_factor, act, act_w,
                   makespan, busy_sum, busy_max, span_max, peak_max, status):
    """Run the list scheduler for N cost settings of one schedule, in parallel.

    Setting k uses the scalar per-device-share costs ``f[k]`` and so on,
    resolved per stage exactly as :class:`pipecore.Costs` does (divided by
    ``chunks_div`` when it is > 0, else scaled by devices / n_stages). The
    network part of each transfer (``x_ser``, ``x_net_lat``) is shared; the
    latency is ``comm[k] + x_net_lat``. Writes one row of metrics per
    setting and its status.
    """
    N = f.shape[0]
    n = op_kind.shape[0]
    nx = x_link.shape[0]
    p = dev_ptr.shape[0] - 1
    for k in prange(N):
        cost = np.empty((5, n_stages))
        a = np.empty(n_stages)
        aw = np.empty(n_stages)
        if chunks_div > 0:
            fs = f[k] / chunks_div
            bs = b[k] / chunks_div
            ws = w[k] / chunks_div
            acts = act[k] / chunks_div
            actws = act_w[k] / chunks_div
        else:
            fs = f[k] * devices / n_stages
            bs = b[k] * devices / n_stages
            ws = w[k] * devices / n_stages
            acts = act[k] * devices / n_stages
            actws = act_w[k] * devices / n_stages
        for s in range(n_stages):
            cost[0, s] = fs
            cost[1, s] = bs
            cost[2, s] = ws
            cost[3, s] = bs + ws
            cost[4, s] = 0.0
            a[s] = acts
            aw[s] = actws
        lat = np.empty(nx)
        for x in range(nx):
            lat[x] = comm[k] + x_net_lat[x]
        start = np.empty(n)
        finish = np.empty(n)
        x_start = np.empty(nx)
        x_arrival = np.empty(nx)
        head = np.empty(p, dtype=np.int64)
        st = list_schedule(dev_ptr, op_kind, op_stage, dep, xfer, out_ptr, x_dst_dev, x_link,
                           x_ser, lat, cost, n_links, paired, fb_factor[k],
                           start, finish, x_start, x_arrival, head)
        status[k] = st
        if st != STATUS_OK:
            continue
        top = 0.0
        total = 0.0
        most = 0.0
        widest = 0.0
        for d in range(p):
            lo = dev_ptr[d]
            hi = dev_ptr[d + 1]
            busy = 0.0
            for i in range(lo, hi):
                if not paired[i]:
                    busy += finish[i] - start[i]
                if finish[i] > top:
                    top = finish[i]
            total += busy
            if busy > most:
                most = busy
            if hi > lo:
                width = finish[hi - 1] - start[lo]
                if width > widest:
                    widest = width
        makespan[k] = top
        busy_sum[k] = total
        busy_max[k] = most
        span_max[k] = widest
        peak = np.zeros(p)
        peak_memory(dev_ptr, op_kind, op_stage, a, aw, peak)
        best = 0.0
        for d in range(p):
            if peak[d] > best:
                best = peak[d]
        peak_max[k] = best

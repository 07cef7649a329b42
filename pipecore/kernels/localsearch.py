"""Local search over per-device op orders: evaluate one order (times and
peak memory) and climb by adjacent swaps. Plain arrays only."""

from __future__ import annotations

import numpy as np
from numba import njit

from .memory import device_peak

_INF = np.inf


@njit(cache=True)
def evaluate(order, dev_ptr, op_kind, op_stage, dep, xfer, out_ptr, x_dst, x_link, x_ser, x_lat,
              stage_cost, n_links, act, act_w, ckpt, static, span_objective,
              done, finish, x_arr, link_free, head, dev_free, first, queued, stack, row_dev):
    """Simulate the programs ``order[dev_ptr[d]:dev_ptr[d+1]]`` (rows).

    Returns (objective, peak memory of the worst device, sum of device
    finish times); objective is inf when the order deadlocks or runs an op
    before a producer on its own device. The sum breaks ties so the search
    can cross plateaus of equal makespan. Work arrays are the caller's.
    """
    p = dev_ptr.shape[0] - 1
    n = op_kind.shape[0]
    for r in range(n):
        done[r] = False
    for x in range(x_arr.shape[0]):
        x_arr[x] = -1.0
    for i in range(n_links):
        link_free[i] = 0.0
    top = 0
    for d in range(p):
        head[d] = dev_ptr[d]
        dev_free[d] = 0.0
        first[d] = -1.0
        queued[d] = True
        stack[top] = p - 1 - d
        top += 1
    while top > 0:
        top -= 1
        d = stack[top]
        queued[d] = False
        h = head[d]
        end = dev_ptr[d + 1]
        t_free = dev_free[d]
        while h < end:
            r = order[h]
            t = t_free
            ready = True
            for j in range(2):
                q = dep[r, j]
                if q < 0:
                    continue
                x = xfer[r, j]
                if x >= 0:
                    a = x_arr[x]
                    if a < 0.0:
                        ready = False
                        break
                else:
                    if not done[q]:
                        # A local producer later in the program: never runs first.
                        if row_dev[q] == d:
                            return _INF, _INF, _INF
                        ready = False
                        break
                    a = finish[q]
                if a > t:
                    t = a
            if not ready:
                break
            f = t + stage_cost[op_kind[r], op_stage[r]]
            if first[d] < 0.0:
                first[d] = t
            finish[r] = f
            done[r] = True
            for x in range(out_ptr[r], out_ptr[r + 1]):
                ser = x_ser[x]
                if ser == 0.0:
                    x_arr[x] = f + x_lat[x]
                else:
                    link = x_link[x]
                    s = f if link_free[link] <= f else link_free[link]
                    e = s + ser
                    link_free[link] = e
                    x_arr[x] = e + x_lat[x]
                c = row_dev[x_dst[x]]
                if not queued[c]:
                    queued[c] = True
                    stack[top] = c
                    top += 1
            t_free = f
            h += 1
        head[d] = h
        dev_free[d] = t_free
    objective = 0.0
    total_finish = 0.0
    for d in range(p):
        if head[d] < dev_ptr[d + 1]:
            return _INF, _INF, _INF
        total_finish += dev_free[d]
        if span_objective:
            if dev_ptr[d + 1] > dev_ptr[d] and dev_free[d] - first[d] > objective:
                objective = dev_free[d] - first[d]
        elif dev_free[d] > objective:
            objective = dev_free[d]
    worst = 0.0
    for d in range(p):
        peak = device_peak(order, dev_ptr[d], dev_ptr[d + 1], op_kind, op_stage, act, act_w, ckpt)
        if peak + static[d] > worst:
            worst = peak + static[d]
    return objective, worst, total_finish


@njit(cache=True)
def climb(order, dev_ptr, op_kind, op_stage, dep, xfer, out_ptr, x_dst, x_link, x_ser, x_lat,
           stage_cost, n_links, act, act_w, ckpt, static, span_objective, limit, window, max_evals,
           row_dev):
    """First-improvement hill climbing over swaps and single-op moves; returns
    (best objective, evaluations used). ``order`` is updated in place."""
    n = op_kind.shape[0]
    p = dev_ptr.shape[0] - 1
    nx = x_dst.shape[0]
    done = np.empty(n, dtype=np.bool_)
    finish = np.empty(n)
    x_arr = np.empty(nx)
    link_free = np.empty(max(n_links, 1))
    head = np.empty(p, dtype=np.int64)
    dev_free = np.empty(p)
    first = np.empty(p)
    queued = np.empty(p, dtype=np.bool_)
    stack = np.empty(p, dtype=np.int64)
    best, mem0, best2 = evaluate(order, dev_ptr, op_kind, op_stage, dep, xfer, out_ptr, x_dst,
                                  x_link, x_ser, x_lat, stage_cost, n_links, act, act_w, ckpt, static,
                                  span_objective, done, finish, x_arr, link_free, head, dev_free,
                                  first, queued, stack, row_dev)
    if mem0 > limit:  # a start over the limit (a kicked order) counts as no solution yet
        best = _INF
        best2 = _INF
    evals = 1
    improved = True
    while improved and evals < max_evals:
        improved = False
        for d in range(p):
            lo = dev_ptr[d]
            hi = dev_ptr[d + 1]
            for i in range(lo, hi):
                # Swaps of two ops up to ``window`` apart (an F later and a W
                # earlier at once keeps memory under a tight limit).
                for j in range(i + 1, min(i + window + 1, hi)):
                    if evals >= max_evals:
                        break
                    a = order[i]
                    order[i] = order[j]
                    order[j] = a
                    obj, mem, obj2 = evaluate(order, dev_ptr, op_kind, op_stage, dep, xfer,
                                               out_ptr, x_dst, x_link, x_ser, x_lat, stage_cost,
                                               n_links, act, act_w, ckpt, static, span_objective, done,
                                               finish, x_arr, link_free, head, dev_free, first,
                                               queued, stack, row_dev)
                    evals += 1
                    if mem <= limit and (obj < best * (1.0 - 1e-12) or (
                            obj <= best * (1.0 + 1e-12) and obj2 < best2 * (1.0 - 1e-12))):
                        best = min(best, obj)
                        best2 = obj2
                        improved = True
                    else:
                        order[j] = order[i]
                        order[i] = a
                for shift in range(-window, window + 1):
                    j = i + shift
                    if shift == 0 or j < lo or j >= hi or evals >= max_evals:
                        continue
                    # Move the op at i to position j (the ops between slide by one).
                    moved = order[i]
                    if j > i:
                        for k in range(i, j):
                            order[k] = order[k + 1]
                    else:
                        for k in range(i, j, -1):
                            order[k] = order[k - 1]
                    order[j] = moved
                    obj, mem, obj2 = evaluate(order, dev_ptr, op_kind, op_stage, dep, xfer, out_ptr,
                                         x_dst, x_link, x_ser, x_lat, stage_cost, n_links, act,
                                         act_w, ckpt, static, span_objective, done, finish, x_arr,
                                         link_free, head, dev_free, first, queued, stack,
                                         row_dev)
                    evals += 1
                    better = obj < best * (1.0 - 1e-12) or (
                        obj <= best * (1.0 + 1e-12) and obj2 < best2 * (1.0 - 1e-12))
                    if better and mem <= limit:
                        best = min(best, obj)
                        best2 = obj2
                        improved = True
                        break  # keep the move; look at position i afresh
                    # Undo.
                    if j > i:
                        for k in range(j, i, -1):
                            order[k] = order[k - 1]
                    else:
                        for k in range(j, i):
                            order[k] = order[k + 1]
                    order[i] = moved
    return best, evals

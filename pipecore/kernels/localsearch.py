"""Local search over per-device op orders: evaluate one order (times and
peak memory) and climb by swaps and moves. Plain arrays only."""

from __future__ import annotations

import numpy as np
from numba import njit

from .memory import device_peak

_INF = np.inf


@njit(cache=True)
def times(order, dev_ptr, op_kind, op_stage, dep, xfer, out_ptr, x_dst, x_link, x_ser, x_lat,
          stage_cost, n_links, span_objective, done, finish, x_arr, link_free, head, dev_free,
          first, queued, stack, row_dev, dev_work, left, cut):
    """Simulate the programs ``order[dev_ptr[d]:dev_ptr[d+1]]`` (rows).

    Returns (objective, sum of device finish times, True), or (inf, inf,
    False) when the order deadlocks, runs an op before a producer on its
    own device, or is sure to end with an objective above ``cut``: a
    device that finishes an op at f with work w of its ops still to run
    ends at f + w or later (``dev_work``: each device's total op time).
    The sum breaks ties so the search can cross plateaus of equal makespan.
    Work arrays are the caller's (``left``: p floats).
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
        left[d] = dev_work[d]
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
        work = left[d]
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
                            return _INF, _INF, False
                        ready = False
                        break
                    a = finish[q]
                if a > t:
                    t = a
            if not ready:
                break
            cost = stage_cost[op_kind[r], op_stage[r]]
            f = t + cost
            if first[d] < 0.0:
                first[d] = t
            work -= cost
            # (The rounding of f + work is some 1e-14 relative; cut leaves 1e-9.)
            if (f + work - first[d] if span_objective else f + work) > cut:
                return _INF, _INF, False
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
        left[d] = work
    objective = 0.0
    total_finish = 0.0
    for d in range(p):
        if head[d] < dev_ptr[d + 1]:
            return _INF, _INF, False
        total_finish += dev_free[d]
        if span_objective:
            if dev_ptr[d + 1] > dev_ptr[d] and dev_free[d] - first[d] > objective:
                objective = dev_free[d] - first[d]
        elif dev_free[d] > objective:
            objective = dev_free[d]
    return objective, total_finish, True


@njit(cache=True)
def evaluate(order, dev_ptr, op_kind, op_stage, dep, xfer, out_ptr, x_dst, x_link, x_ser, x_lat,
             stage_cost, n_links, act, act_w, ckpt, static, span_objective,
             done, finish, x_arr, link_free, head, dev_free, first, queued, stack, row_dev,
             dev_work, left):
    """:func:`times` and the worst device's peak memory: (objective, peak,
    sum of device finish times), all inf when the order deadlocks."""
    objective, total_finish, ok = times(
        order, dev_ptr, op_kind, op_stage, dep, xfer, out_ptr, x_dst, x_link, x_ser, x_lat,
        stage_cost, n_links, span_objective, done, finish, x_arr, link_free, head, dev_free, first,
        queued, stack, row_dev, dev_work, left, _INF)
    if not ok:
        return _INF, _INF, _INF
    worst = 0.0
    for d in range(dev_ptr.shape[0] - 1):
        peak = device_peak(order, dev_ptr[d], dev_ptr[d + 1], op_kind, op_stage, act, act_w, ckpt)
        if peak + static[d] > worst:
            worst = peak + static[d]
    return objective, worst, total_finish


@njit(cache=True)
def _worst(peaks, static, d, peak_d):
    """The worst device's memory with device d's peak replaced by peak_d
    (the same maximum :func:`evaluate` takes)."""
    worst = 0.0
    for e in range(peaks.shape[0]):
        v = (peak_d if e == d else peaks[e]) + static[e]
        if v > worst:
            worst = v
    return worst


@njit(cache=True)
def _score_move(order, d, peaks, dev_ptr, op_kind, op_stage, dep, xfer, out_ptr, x_dst, x_link,
                x_ser, x_lat, stage_cost, n_links, act, act_w, ckpt, static, span_objective,
                limit, done, finish, x_arr, link_free, head, dev_free, first, queued, stack,
                row_dev, dev_work, left, cut):
    """What :func:`evaluate` would decide a move on device d by, cheaper:
    (objective, worst memory, finish sum, device d's new peak). Only device
    d's peak is recomputed (the others are in ``peaks``), an order over the
    limit, which the climb refuses whatever its times, is not simulated
    (objective and sum inf), and the simulation stops once the objective
    is sure to exceed ``cut`` (all inf)."""
    peak_d = device_peak(order, dev_ptr[d], dev_ptr[d + 1], op_kind, op_stage, act, act_w, ckpt)
    worst = _worst(peaks, static, d, peak_d)
    if worst > limit:
        return _INF, worst, _INF, peak_d
    obj, obj2, ok = times(order, dev_ptr, op_kind, op_stage, dep, xfer, out_ptr, x_dst, x_link,
                          x_ser, x_lat, stage_cost, n_links, span_objective, done, finish, x_arr,
                          link_free, head, dev_free, first, queued, stack, row_dev, dev_work, left,
                          cut)
    if not ok:
        return _INF, _INF, _INF, peak_d
    return obj, worst, obj2, peak_d


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
    # Each device's total op time: the simulation of a move stops once a
    # device's finish plus its work still to run passes the best objective
    # (such a move is refused whatever the rest of the simulation gives).
    dev_work = np.zeros(p)
    for r in range(n):
        dev_work[row_dev[r]] += stage_cost[op_kind[r], op_stage[r]]
    left = np.empty(p)
    best, mem0, best2 = evaluate(order, dev_ptr, op_kind, op_stage, dep, xfer, out_ptr, x_dst,
                                  x_link, x_ser, x_lat, stage_cost, n_links, act, act_w, ckpt, static,
                                  span_objective, done, finish, x_arr, link_free, head, dev_free,
                                  first, queued, stack, row_dev, dev_work, left)
    if mem0 > limit:  # a start over the limit (a kicked order) counts as no solution yet
        best = _INF
        best2 = _INF
    # Each device's peak: a move changes only its own device's.
    peaks = np.empty(p)
    for d in range(p):
        peaks[d] = device_peak(order, dev_ptr[d], dev_ptr[d + 1], op_kind, op_stage, act, act_w,
                               ckpt)
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
                    obj, mem, obj2, peak_d = _score_move(
                        order, d, peaks, dev_ptr, op_kind, op_stage, dep, xfer, out_ptr, x_dst,
                        x_link, x_ser, x_lat, stage_cost, n_links, act, act_w, ckpt, static,
                        span_objective, limit, done, finish, x_arr, link_free, head, dev_free,
                        first, queued, stack, row_dev, dev_work, left,
                        best * (1.0 + 1e-12) * (1.0 + 1e-9))
                    evals += 1
                    if mem <= limit and (obj < best * (1.0 - 1e-12) or (
                            obj <= best * (1.0 + 1e-12) and obj2 < best2 * (1.0 - 1e-12))):
                        best = min(best, obj)
                        best2 = obj2
                        peaks[d] = peak_d
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
                    obj, mem, obj2, peak_d = _score_move(
                        order, d, peaks, dev_ptr, op_kind, op_stage, dep, xfer, out_ptr, x_dst,
                        x_link, x_ser, x_lat, stage_cost, n_links, act, act_w, ckpt, static,
                        span_objective, limit, done, finish, x_arr, link_free, head, dev_free,
                        first, queued, stack, row_dev, dev_work, left,
                        best * (1.0 + 1e-12) * (1.0 + 1e-9))
                    evals += 1
                    better = obj < best * (1.0 - 1e-12) or (
                        obj <= best * (1.0 + 1e-12) and obj2 < best2 * (1.0 - 1e-12))
                    if better and mem <= limit:
                        best = min(best, obj)
                        best2 = obj2
                        peaks[d] = peak_d
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

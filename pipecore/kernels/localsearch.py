"""Local search over per-device op orders: evaluate one order (times and
peak memory) and climb by swaps and moves.

The kernels read a candidate order through a permutation of the compiled
schedule's rows (``order``: int64, n): device d runs rows
``order[ops.dev_ptr[d]:ops.dev_ptr[d + 1]]`` in that order. What stays
fixed while the order changes travels in three carriers (:class:`Ops`,
:class:`Transfers`, :class:`Objective`); :class:`Scratch` holds the
simulation's work arrays, allocated once per climb.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from .memory import device_peak
from .visits import pop, push_all, push_once

_INF = np.inf


class Ops(NamedTuple):
    """The ops of the compiled schedule (``core.simulate.compile_schedule``), n rows. Inputs."""

    #: int64 (p + 1,): device d's rows are ``order[dev_ptr[d]:dev_ptr[d + 1]]``.
    dev_ptr: np.ndarray
    #: int64 (n,): the device of row r.
    row_dev: np.ndarray
    #: int64 (n,): row r's cost class (``kernels.codes``: its kind, or F_DROP).
    op_class: np.ndarray
    #: int64 (n,): row r's stage.
    op_stage: np.ndarray
    #: int64 (n, 2): the rows whose output row r needs, -1 for none.
    dep: np.ndarray
    #: int64 (n, 2): the transfer that brings ``dep[r, j]``'s output, -1 when on the device.
    xfer: np.ndarray
    #: int64 (n + 1,): row r sends transfers ``out_ptr[r]:out_ptr[r + 1]``.
    out_ptr: np.ndarray


class Transfers(NamedTuple):
    """The transfers between devices, x of them, and the links they share. Inputs."""

    #: int64 (x,): the row that receives transfer x.
    x_dst: np.ndarray
    #: int64 (x,): the link transfer x is serialised on.
    x_link: np.ndarray
    #: float64 (x,): the time transfer x holds its link (0: a free link).
    x_ser: np.ndarray
    #: float64 (x,): the latency added after the link.
    x_lat: np.ndarray
    #: int: the number of links.
    n_links: int


class Objective(NamedTuple):
    """What an order costs and what it may hold. Inputs."""

    #: float64 (N_CLASSES, stages): the time of an op by cost class and stage.
    stage_cost: np.ndarray
    #: float64 (stages,): activation an F holds until its B (or BW).
    act: np.ndarray
    #: float64 (stages,): activation a B leaves held until its W.
    act_w: np.ndarray
    #: float64 (stages,): what a dropped F keeps (its checkpoint).
    ckpt: np.ndarray
    #: float64 (p,): each device's memory that no order changes (weights).
    static: np.ndarray
    #: bool: the objective is the longest device span (first start to last
    #: finish), not the makespan.
    span_objective: bool
    #: float: the most memory a device may hold, tolerance included.
    limit: float


class Scratch(NamedTuple):
    """Work arrays of :func:`times`, written by every call. Scratch."""

    #: bool (n,): row r has run.
    done: np.ndarray
    #: float64 (n,): row r's finish time, once done.
    finish: np.ndarray
    #: float64 (x,): transfer x's arrival time, -1 until sent.
    x_arr: np.ndarray
    #: float64 (max(n_links, 1),): when each link is next free.
    link_free: np.ndarray
    #: int64 (p,): the position in ``order`` of device d's next op.
    head: np.ndarray
    #: float64 (p,): when device d is next free.
    dev_free: np.ndarray
    #: float64 (p,): when device d started its first op, -1 before.
    first: np.ndarray
    #: bool (p,): device d is on the stack of devices to advance.
    queued: np.ndarray
    #: int64 (p,): the stack of devices to advance.
    stack: np.ndarray
    #: float64 (p,): each device's total op time (filled by :func:`climb`,
    #: read only afterwards).
    dev_work: np.ndarray
    #: float64 (p,): each device's op time still to run.
    left: np.ndarray


@njit(cache=True)
def times(order, ops, transfers, objective, scratch, cut):
    """Simulate the programs ``order[dev_ptr[d]:dev_ptr[d+1]]`` (rows).

    Returns (objective, sum of device finish times, True), or (inf, inf,
    False) when the order deadlocks, runs an op before a producer on its
    own device, or is sure to end with an objective above ``cut``: a
    device that finishes an op at f with work w of its ops still to run
    ends at f + w or later (``scratch.dev_work``: each device's total op
    time). The sum breaks ties so the search can cross plateaus of equal
    makespan.
    """
    dev_ptr, row_dev, out_ptr = ops.dev_ptr, ops.row_dev, ops.out_ptr
    op_class, op_stage, dep, xfer = ops.op_class, ops.op_stage, ops.dep, ops.xfer
    x_dst, x_link, x_ser, x_lat = transfers.x_dst, transfers.x_link, transfers.x_ser, transfers.x_lat
    stage_cost, span_objective = objective.stage_cost, objective.span_objective
    done, finish, x_arr, link_free = scratch.done, scratch.finish, scratch.x_arr, scratch.link_free
    head, dev_free, first, left = scratch.head, scratch.dev_free, scratch.first, scratch.left
    queued, stack = scratch.queued, scratch.stack
    p = dev_ptr.shape[0] - 1
    n = op_class.shape[0]
    for r in range(n):
        done[r] = False
    for x in range(x_arr.shape[0]):
        x_arr[x] = -1.0
    for i in range(transfers.n_links):
        link_free[i] = 0.0
    for d in range(p):
        head[d] = dev_ptr[d]
        dev_free[d] = 0.0
        first[d] = -1.0
        left[d] = scratch.dev_work[d]
    top = push_all(queued, stack)
    while top > 0:
        top, d = pop(queued, stack, top)
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
            cost = stage_cost[op_class[r], op_stage[r]]
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
                top = push_once(row_dev[x_dst[x]], queued, stack, top)
            t_free = f
            h += 1
        head[d] = h
        dev_free[d] = t_free
        left[d] = work
    value = 0.0
    total_finish = 0.0
    for d in range(p):
        if head[d] < dev_ptr[d + 1]:
            return _INF, _INF, False
        total_finish += dev_free[d]
        if span_objective:
            if dev_ptr[d + 1] > dev_ptr[d] and dev_free[d] - first[d] > value:
                value = dev_free[d] - first[d]
        elif dev_free[d] > value:
            value = dev_free[d]
    return value, total_finish, True


@njit(cache=True)
def _device_peak(order, ops, objective, d):
    """Device d's peak activation under ``order``."""
    return device_peak(order, ops.dev_ptr[d], ops.dev_ptr[d + 1], ops.op_class, ops.op_stage,
                       objective.act, objective.act_w, objective.ckpt)


@njit(cache=True)
def evaluate(order, ops, transfers, objective, scratch):
    """:func:`times` and the worst device's peak memory: (objective, peak,
    sum of device finish times), all inf when the order deadlocks."""
    value, total_finish, ok = times(order, ops, transfers, objective, scratch, _INF)
    if not ok:
        return _INF, _INF, _INF
    worst = 0.0
    static = objective.static
    for d in range(ops.dev_ptr.shape[0] - 1):
        peak = _device_peak(order, ops, objective, d)
        if peak + static[d] > worst:
            worst = peak + static[d]
    return value, worst, total_finish


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
def _keep_move(order, d, peaks, ops, transfers, objective, scratch, best, best2):
    """Whether the climb keeps ``order`` after a move on device d: it fits
    the limit and has a lower objective than ``best``, or an equal one with
    a lower finish sum than ``best2``. Returns (kept, best, best2), updated
    when kept, with device d's new peak then in ``peaks[d]``.

    It decides as :func:`evaluate` would, cheaper: only device d's peak is
    recomputed (the others are in ``peaks``), an order over the limit,
    refused whatever its times, is not simulated, and the simulation stops
    once the objective is sure to exceed ``best`` (with the tolerance of
    the comparison and some more)."""
    peak_d = _device_peak(order, ops, objective, d)
    if _worst(peaks, objective.static, d, peak_d) > objective.limit:
        return False, best, best2
    value, total_finish, ok = times(order, ops, transfers, objective, scratch,
                                    best * (1.0 + 1e-12) * (1.0 + 1e-9))
    if ok and (value < best * (1.0 - 1e-12) or (
            value <= best * (1.0 + 1e-12) and total_finish < best2 * (1.0 - 1e-12))):
        peaks[d] = peak_d
        return True, min(best, value), total_finish
    return False, best, best2


@njit(cache=True)
def _scratch(ops, transfers, objective):
    """Work arrays for :func:`times` on these ops, with ``dev_work`` filled."""
    n = ops.op_class.shape[0]
    p = ops.dev_ptr.shape[0] - 1
    # Each device's total op time: the simulation of a move stops once a
    # device's finish plus its work still to run passes the best objective
    # (such a move is refused whatever the rest of the simulation gives).
    dev_work = np.zeros(p)
    for r in range(n):
        dev_work[ops.row_dev[r]] += objective.stage_cost[ops.op_class[r], ops.op_stage[r]]
    return Scratch(done=np.empty(n, dtype=np.bool_), finish=np.empty(n),
                   x_arr=np.empty(transfers.x_dst.shape[0]),
                   link_free=np.empty(max(transfers.n_links, 1)),
                   head=np.empty(p, dtype=np.int64), dev_free=np.empty(p), first=np.empty(p),
                   queued=np.empty(p, dtype=np.bool_), stack=np.empty(p, dtype=np.int64),
                   dev_work=dev_work, left=np.empty(p))


@njit(cache=True, inline="always")
def _move(order, i, j):
    """Move the op at position i to position j; the ops between slide by one."""
    moved = order[i]
    if j > i:
        for k in range(i, j):
            order[k] = order[k + 1]
    else:
        for k in range(i, j, -1):
            order[k] = order[k - 1]
    order[j] = moved


@njit(cache=True)
def climb(order, ops, transfers, objective, window, max_evals):
    """First-improvement hill climbing over swaps and single-op moves; returns
    (best objective, evaluations used). ``order`` is updated in place."""
    p = ops.dev_ptr.shape[0] - 1
    scratch = _scratch(ops, transfers, objective)
    best, mem0, best2 = evaluate(order, ops, transfers, objective, scratch)
    if mem0 > objective.limit:  # a start over the limit (a kicked order) counts as no solution yet
        best = _INF
        best2 = _INF
    # Each device's peak: a move changes only its own device's.
    peaks = np.empty(p)
    for d in range(p):
        peaks[d] = _device_peak(order, ops, objective, d)
    evals = 1
    improved = True
    while improved and evals < max_evals:
        improved = False
        for d in range(p):
            lo = ops.dev_ptr[d]
            hi = ops.dev_ptr[d + 1]
            for i in range(lo, hi):
                # Swaps of two ops up to ``window`` apart (an F later and a W
                # earlier at once keeps memory under a tight limit).
                for j in range(i + 1, min(i + window + 1, hi)):
                    if evals >= max_evals:
                        break
                    a = order[i]
                    order[i] = order[j]
                    order[j] = a
                    kept, best, best2 = _keep_move(order, d, peaks, ops, transfers, objective,
                                                   scratch, best, best2)
                    evals += 1
                    if kept:
                        improved = True
                    else:
                        order[j] = order[i]
                        order[i] = a
                for shift in range(-window, window + 1):
                    j = i + shift
                    if shift == 0 or j < lo or j >= hi or evals >= max_evals:
                        continue
                    _move(order, i, j)
                    kept, best, best2 = _keep_move(order, d, peaks, ops, transfers, objective,
                                                   scratch, best, best2)
                    evals += 1
                    if kept:
                        improved = True
                        break  # keep the move; look at position i afresh
                    _move(order, j, i)  # undo
    return best, evals

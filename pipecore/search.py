"""Local search over per-device program orders.

Starting from a valid schedule, ops are moved within one device's program
(two ops up to ``window`` places apart swap, or one op moves up to
``window`` places earlier or later), and a move is kept when the schedule stays valid, its
worst device fits the memory limit, and the objective improves. Every
candidate order is simulated by a Numba list scheduler that reads the
programs through a permutation, with the same semantics as
``pipecore.simulate`` (docs/semantics.md); the kept schedule is checked by
``pipecore.simulate`` itself before it is returned.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from ._schedule import KINDS, Schedule
from .costs import Costs, Network, fits
from .simulate import compile_schedule, simulate, validate

__all__ = ["local_search"]

_INF = np.inf


@njit(cache=True)
def _evaluate(order, dev_ptr, op_kind, op_stage, dep, xfer, out_ptr, x_dst, x_link, x_ser, x_lat,
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
        total = 0.0
        peak = 0.0
        for i in range(dev_ptr[d], dev_ptr[d + 1]):
            r = order[i]
            k = op_kind[r]
            s = op_stage[r]
            if k == 0 or k == 5 or k == 8:  # F, R (+act - ckpt), recomputed F (+ckpt)
                if k == 0:
                    total = total + act[s]
                elif k == 5:
                    total = total + (act[s] - ckpt[s])
                else:
                    total = total + ckpt[s]
                if total > peak:
                    peak = total
            elif k == 1:
                total = total - (act[s] - act_w[s])
            elif k == 2:
                total = total - act_w[s]
            elif k == 3:
                total = total - act[s]
        if peak + static[d] > worst:
            worst = peak + static[d]
    return objective, worst, total_finish


@njit(cache=True)
def _climb(order, dev_ptr, op_kind, op_stage, dep, xfer, out_ptr, x_dst, x_link, x_ser, x_lat,
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
    best, mem0, best2 = _evaluate(order, dev_ptr, op_kind, op_stage, dep, xfer, out_ptr, x_dst,
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
                    obj, mem, obj2 = _evaluate(order, dev_ptr, op_kind, op_stage, dep, xfer,
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
                    obj, mem, obj2 = _evaluate(order, dev_ptr, op_kind, op_stage, dep, xfer, out_ptr,
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


def local_search(schedule: Schedule, costs: Costs | None = None, memory_limit: float | None = None,
                 network: Network | None = None, objective: str = "makespan", window: int = 4,
                 max_evals: int = 200_000, restarts: int = 0, kick: int = 3, seed: int = 0,
                 name: str | None = None) -> Schedule:
    """Improve a schedule by moving ops within their device's program.

    Parameters
    ----------
    schedule : Schedule
        A valid schedule without overlapped F&B pairs or all-reduces.
    costs : Costs, optional
        Default ``Costs()``.
    memory_limit : float, optional
        Per-device limit on peak activation plus weights; a move that breaks
        it is refused. None means no limit.
    network : Network, optional
        Links with contention, as in :func:`pipecore.simulate`.
    objective : {"makespan", "span"}
        As in :func:`pipecore.tune`.
    window : int
        How far (in program positions) one move takes an op.
    max_evals : int
        Simulations allowed in all (climbs and restarts together).
    restarts : int
        Iterated local search: after the first climb, this many times swap
        ``kick`` random pairs of nearby ops on random devices of the best
        order found, climb again, and keep the result if it is better.
    kick : int
        Random swaps per restart.
    seed : int
        Seed of the restarts' random swaps.
    name : str, optional
        Label of the result (default: the input's name plus ``"+ls"``).

    Returns
    -------
    Schedule
        A valid schedule no worse than the input under the objective, whose
        worst device fits the limit if the input did.

    Raises
    ------
    ValueError
        For overlapped pairs or all-reduces (not moved by this search), bad
        arguments, or a starting schedule that breaks the memory limit.
    ScheduleError
        If the input is not a valid schedule.
    """
    if not isinstance(schedule, Schedule):
        raise ValueError(f"'schedule' must be a pipecore.Schedule (got {type(schedule).__name__})")
    if objective not in ("makespan", "span"):
        raise ValueError(f"'objective' must be 'makespan' or 'span' (got {objective!r})")
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"'window' must be an int >= 1 (got {window!r})")
    if isinstance(max_evals, bool) or not isinstance(max_evals, int) or max_evals < 1:
        raise ValueError(f"'max_evals' must be an int >= 1 (got {max_evals!r})")
    costs = Costs() if costs is None else costs
    validate(schedule)
    st = schedule._info()
    if (schedule.kind_codes >= 6).any():
        raise ValueError("local_search keeps memory in program order: schedules that offload "
                         "activations (O and L ops) are not supported")
    if st["paired"].any() or (schedule.kind_codes == 4).any():
        raise ValueError("local_search moves single ops: schedules with overlapped F&B pairs or "
                         "all-reduces are not supported")
    limit = math.inf if memory_limit is None else float(memory_limit)
    start = simulate(schedule, costs, network)
    start_mem = float((start.peak_activation + start.static_memory).max())
    if not fits(start_mem, limit):
        raise ValueError(f"the starting schedule needs {start_mem:g}, above memory_limit "
                         f"{limit:g}")
    c = compile_schedule(schedule, costs, network)
    p = schedule.devices
    static = np.asarray(start.static_memory, dtype=np.float64)
    row_dev = np.repeat(np.arange(p), np.diff(c.dev_ptr)).astype(np.int64)
    for name_, value in (("restarts", restarts), ("kick", kick), ("seed", seed)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"'{name_}' must be an int >= 0 (got {value!r})")
    args = (c.dev_ptr, c.op_class, c.op_stage, c.dep, c.xfer, c.out_ptr, c.x_dst, c.x_link,
            c.x_ser, c.x_lat, c.stage_cost, c.n_links, c.act, c.act_w, c.ckpt, static,
            objective == "span", limit * (1 + 1e-9), window)
    order = np.arange(c.op_kind.shape[0], dtype=np.int64)
    best, used = _climb(order, *args, max_evals, row_dev)
    rng = np.random.default_rng(seed)
    ptr = c.dev_ptr
    busy_devices = np.flatnonzero(np.diff(ptr) >= 2)
    for _ in range(restarts):
        if used >= max_evals or busy_devices.size == 0:
            break
        trial = order.copy()
        for _ in range(kick):
            d = busy_devices[rng.integers(busy_devices.size)]
            i = int(rng.integers(ptr[d], ptr[d + 1] - 1))
            j = min(int(ptr[d + 1]) - 1, i + int(rng.integers(1, 4)))
            trial[i], trial[j] = trial[j], trial[i]
        value, spent = _climb(trial, *args, max_evals - used, row_dev)
        used += spent
        if value < best * (1 - 1e-12):
            best = value
            order = trial
    kind = schedule.kind_codes
    stage = schedule._column("stage")
    mb = schedule._column("microbatch")
    programs = [[(KINDS[kind[r]], int(stage[r]), int(mb[r]))
                 for r in order[c.dev_ptr[d]:c.dev_ptr[d + 1]]] for d in range(p)]
    label = name or f"{schedule.name}+ls"
    out = Schedule.from_programs(programs, name=label, devices=p, replicated=schedule.replicated)
    validate(out)
    res = simulate(out, costs, network)
    if not fits((res.peak_activation + res.static_memory).max(), limit):  # the kernel's promise
        raise RuntimeError("internal: local search returned an order over the memory limit")
    return out

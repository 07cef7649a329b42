"""Exact minimum-makespan schedules for small cases, as a MILP solved by HiGHS.

:func:`optimal` finds the shortest split-backward schedule (F, B and W ops for
every stage and microbatch) of a placement under a per-device memory limit,
with the semantics of :func:`pipecore.simulate` (no :class:`~pipecore.Network`:
a transfer between devices takes ``costs.comm``). It is meant for small cases
(a few devices, up to about ten microbatches), where it gives the optimum that
the heuristics (:func:`pipecore.tune`, :func:`pipecore.generate.memory_greedy`)
can be measured against. A linear pipeline of 4 devices and 8 microbatches
solves in seconds; a V of the same size with a binding memory limit may not
close its gap within a minute (the big-M bound is weak there), and then the
best schedule found comes back with its gap.

The model
---------
Variables: the start time of every op (continuous), the makespan ``C``, and
one binary per pair of ops on the same device whose order is not already
known (1: the first op of the pair runs before the second).

* Precedence: ``start(v) >= start(u) + dur(u) + lag`` for every dependency
  ``u -> v``; ``lag`` is ``comm`` of u's stage across devices, 0 on one device.
* One op at a time per device: for an ordered pair,
  ``start(v) >= start(u) + dur(u)``; for a free pair, the same relaxed by a
  big M that the time windows below make valid.
* Memory, checked when each F starts (the program-order running total peaks
  right after an F, since B and W only free): weights of the device, plus the
  F's activation, plus what every op before it allocated or freed, where
  "before" is read from the ordering binaries, must fit the limit.
* Transitivity: if u runs before v, so does every op known to precede u,
  and u runs before every op known to follow v (rows on the binaries, which
  the big-M rows imply only weakly); among ops of zero time (W with w = 0),
  which may share a start time, 3-cycles are forbidden so that the binaries
  stay a total order.
* ``C >= start(v) + tail(v)`` for every op and a one-machine bound (heads,
  work, tails) for every device; minimise ``C``.

Known orders come from the dependencies (also through other devices), the
microbatch order below, and the memory limit: when F(s, k) starts, stage s
holds the activations of microbatches 0..k except those whose B (and W) ran
before, so a tight limit forces the first few B (or W) of the stage before
it; these are added until nothing new follows.

A heuristic schedule that fits the limit bounds the optimum from above: the
best of several :func:`~pipecore.generate.memory_greedy` runs, the
split-backward families and :func:`~pipecore.generate.zbv_greedy` where their
placement is this one, and a one-microbatch-at-a-time schedule, which fits
whenever anything does.
It gives the time windows ``head(v) <= start(v) <= H - tail(v)`` (``head`` and
``tail`` are longest paths through dependencies and known orders), hence the
big Ms, fixes the pairs whose other order cannot fit in the window, and is the
warm start, so a time limit still returns a feasible schedule.

Symmetry breaking: ops of one kind and stage run in microbatch order
(``X(s, 0)`` before ``X(s, 1)`` ...). This cuts off no optimum. Take any
feasible schedule and, for each kind and stage, hand that kind-stage's time
slots out to microbatches in order: the j-th slot (in program order) goes to
microbatch j. Every device keeps the same busy intervals, and every slot keeps
its kind and stage, so durations and the memory running total are unchanged.
Each dependency links the same microbatch of two kind-stages with one lag
(``finish_u(j) + lag <= start_v(j)`` for all j; durations depend on kind and
stage only, ``comm`` on the sending stage only). If that holds for all j, it
holds for the sorted sequences too: with t the k-th smallest start of v
(from 0), the k+1 microbatches whose v starts by t have their u finished by
``t - lag``, so the k-th smallest finish of u is at most ``t - lag``. So the
sorted schedule is feasible with the same makespan. (Producers are F or B,
which take positive time, so a producer on the consumer's device also stays
ahead of it in program order.) :func:`_sort_microbatches` is this argument
as code; the warm start goes through it.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from ..core.costs import Costs, fits
from ..core.ops import InputError
from ..core.schedule import Action, Schedule, _check_int
from ..core.simulate import Result, simulate
from ..kernels.codes import B as _B
from ..kernels.codes import F as _F
from ..kernels.codes import W as _W

__all__ = ["optimal", "Optimum"]

_KIND_NAMES = ("F", "B", "W")
_INSTALL_HINT = 'pipecore.milp needs HiGHS: pip install "pipecore[milp]"'


@dataclass(frozen=True)
class Optimum:
    """What :func:`optimal` returns.

    Attributes
    ----------
    schedule : Schedule
        The best schedule found, each device running its ops in the order of
        the MILP solution.
    makespan : float
        Its makespan as simulated. When ``proven``, it equals the MILP
        objective to 1e-6 relative (checked); without proof it may be below
        it, when the solver's incumbent left idle time that the simulation
        of its order removes.
    bound : float
        Best lower bound on the optimal makespan (HiGHS's dual bound, or the
        model's static bound if higher).
    gap : float
        ``(makespan - bound) / makespan``; below 1e-6 when proven.
    proven : bool
        Whether HiGHS proved the schedule optimal (to a relative gap of
        1e-7) within the time limit.
    seconds : float
        Wall time of the whole call (model building, warm start, solve).
    result : Result
        ``pipecore.simulate(schedule, costs)``.
    objective : float
        The MILP objective of the solver's final incumbent.
    heuristic : float
        Makespan of the warm start (the best heuristic schedule tried).
    binaries : int
        Ordering binaries in the model (pairs of ops whose order was free).
    status : str
        HiGHS's model status, e.g. ``"Optimal"`` or ``"Time limit reached"``.
    """

    schedule: Schedule
    makespan: float
    bound: float
    gap: float
    proven: bool
    seconds: float
    result: Result
    objective: float
    heuristic: float
    binaries: int
    status: str


def _import_highspy():
    try:
        import highspy
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(_INSTALL_HINT) from exc
    return highspy


def _check_placement(placement):
    try:
        values = list(placement)
    except TypeError:
        raise InputError(f"'placement' must be a sequence of device indices (got {placement!r})") \
            from None
    if not values:
        raise InputError("'placement' must give a device for at least one stage (got an empty "
                         "sequence)")
    out = []
    for s, d in enumerate(values):
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0:
            raise InputError(f"'placement'[{s}] must be a device index >= 0 (got {d!r})")
        out.append(int(d))
    p = max(out) + 1
    idle = sorted(set(range(p)) - set(out))
    if idle:
        raise InputError(f"'placement' {out} leaves device {idle[0]} without a stage; devices "
                         f"must be 0..{p - 1}, each holding at least one stage")
    return out, p


def _check_number(name, value, allow_none=False, allow_inf=False):
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InputError(f"'{name}' must be a number > 0 (got {value!r})")
    x = float(value)
    if math.isnan(x) or x <= 0 or (math.isinf(x) and not allow_inf):
        raise InputError(f"'{name}' must be a {'' if allow_inf else 'finite '}number > 0 "
                         f"(got {value!r})")
    return x


class _Problem:
    """Ops, durations, dependencies and memory of one instance, as flat arrays.

    Op ``(kind, s, j)`` has index ``(kind * S + s) * m + j``.
    """

    def __init__(self, placement, p, m, costs, limit):
        S = len(placement)
        self.placement, self.p, self.m, self.S = placement, p, m, S
        arr = costs.stage_arrays(S, p)
        for name in ("f", "b"):
            zero = np.flatnonzero(arr[name] <= 0)
            if zero.size:
                # Zero-time F or B ops could tie with their consumers on other
                # devices, so a solution's order could deadlock; W may be 0.
                raise InputError(f"optimal needs Costs '{name}' > 0 at every stage (stage "
                                 f"{int(zero[0])} has {name}={arr[name][zero[0]]:g})")
        n = 3 * S * m
        self.n = n
        self.kind = np.repeat(np.arange(3), S * m)
        self.stage = np.tile(np.repeat(np.arange(S), m), 3)
        self.mb = np.tile(np.arange(m), 3 * S)
        self.device = np.asarray(placement)[self.stage]
        per_kind = np.stack([arr["f"], arr["b"], arr["w"]])
        self.dur = per_kind[self.kind, self.stage]
        act, act_w = arr["activation"], arr["activation_w"]
        # Memory change of each op in program order: F allocates, B and W free.
        delta = np.stack([act, -(act - act_w), -act_w])
        self.delta = delta[self.kind, self.stage]
        self.arrays = arr
        self.static = np.array([arr["weights"][[s for s in range(S) if placement[s] == d]].sum()
                                for d in range(p)])
        self.need = self.static + np.array([act[[s for s in range(S) if placement[s] == d]].sum()
                                            for d in range(p)])
        self.limit = limit
        if limit is not None:
            over = np.flatnonzero(~fits(self.need, limit))
            if over.size:
                d = int(over[0])
                raise InputError(
                    f"memory_limit {limit:g} is below what device {d} needs for one microbatch "
                    f"({self.need[d]:g}: weights {self.static[d]:g} plus one activation of each "
                    f"of its stages)")

        # Dependencies u -> v with the lag added to u's finish.
        comm = arr["comm"]
        deps = []
        for s in range(S):
            for j in range(m):
                f, b, w = self.op(_F, s, j), self.op(_B, s, j), self.op(_W, s, j)
                if s > 0:
                    deps.append((self.op(_F, s - 1, j), f))
                deps.append((f, b))
                if s < S - 1:
                    deps.append((self.op(_B, s + 1, j), b))
                deps.append((b, w))
        self.deps = [(u, v, 0.0 if self.device[u] == self.device[v] else float(comm[self.stage[u]]))
                     for u, v in deps]
        # Symmetry breaking (see the module docstring): microbatch order per kind-stage.
        self.chains = [(self.op(k, s, j), self.op(k, s, j + 1))
                       for k in range(3) for s in range(S) for j in range(m - 1)]

    def op(self, kind, s, j):
        return (kind * self.S + s) * self.m + j

    def key(self, i):
        return _KIND_NAMES[self.kind[i]], int(self.stage[i]), int(self.mb[i])


def _reach(n, edges):
    """Topological order and reachability bitsets of a DAG given as edges."""
    succ = [[] for _ in range(n)]
    indeg = [0] * n
    for u, v in edges:
        succ[u].append(v)
        indeg[v] += 1
    order = [i for i in range(n) if indeg[i] == 0]
    for u in order:  # grows while it is read: Kahn's algorithm
        for v in succ[u]:
            indeg[v] -= 1
            if indeg[v] == 0:
                order.append(v)
    if len(order) != n:
        raise RuntimeError("internal error: the dependency graph has a cycle")
    below = [0] * n  # bit v set in below[u]: u must precede v
    for u in reversed(order):
        bits = 0
        for v in succ[u]:
            bits |= below[v] | (1 << v)
        below[u] = bits
    return order, below


def _serial(prob):
    """One microbatch at a time: fits whenever any schedule does."""
    programs = [[] for _ in range(prob.p)]
    for j in range(prob.m):
        for s in range(prob.S):
            programs[prob.placement[s]].append(("F", s, j))
        for s in reversed(range(prob.S)):
            programs[prob.placement[s]].append(("B", s, j))
            programs[prob.placement[s]].append(("W", s, j))
    return programs


def _programs(schedule):
    """Per-device lists of (kind, stage, microbatch) of a schedule."""
    out = [[] for _ in range(schedule.devices)]
    for d, kinds in schedule.to_actions().items():
        out[d] = [(a.kind, a.stage, a.microbatch) for a in map(Action.parse, kinds)]
    return out


def _sort_microbatches(programs):
    """Relabel so each kind-stage runs its microbatches in order (same makespan).

    The module docstring proves that this keeps a feasible schedule feasible
    with the same busy intervals and memory curve.
    """
    count = {}
    out = []
    for prog in programs:
        new = []
        for kind, s, _j in prog:
            j = count.get((kind, s), 0)
            count[(kind, s)] = j + 1
            new.append((kind, s, j))
        out.append(new)
    return out


def _warm_start(prob, costs):
    """The fastest fitting heuristic schedule: (makespan, programs, result)."""
    from ..schedules import generate

    limit = prob.limit
    makers = [lambda: Schedule.from_programs(_serial(prob), devices=prob.p, name="serial")]
    warmups = [None] + [[prob.p - d + k for d in range(prob.p)] for k in range(prob.p + 1)]
    for w_fill in (0.0, 0.5, 1.0):
        for warm in warmups:
            makers.append(lambda warm=warm, w_fill=w_fill: generate.memory_greedy(
                prob.placement, prob.m, costs, limit, warm, w_fill))
    # Split-backward families whose placement is this one: a tighter start.
    from ..schedules.registry import build

    for name in ("zb-h1", "zb-h2", "v-min", "v-half", "v-zb", "zb-v"):
        makers.append(lambda name=name: build(name, prob.p, prob.m))
    # zbv_greedy (the V only) limits activation alone: take the weights off.
    act_limit = None if limit is None else limit - float(prob.static.max())
    makers.append(lambda: generate.zbv_greedy(prob.p, prob.m, costs, act_limit))
    best = None
    for make in makers:
        try:
            sched = make()
        except ValueError:  # a heuristic that gets stuck, or a family that does not fit
            continue
        if list(sched.placement) != prob.placement or sched.replicated \
                or set(sched.kind_codes.tolist()) - {_F, _B, _W}:
            continue
        programs = _sort_microbatches(_programs(sched))
        res = simulate(Schedule.from_programs(programs, devices=prob.p), costs)
        if limit is not None and not fits((res.peak_activation + res.static_memory).max(), limit):
            continue
        if best is None or res.makespan < best[0]:
            best = (res.makespan, programs, res)
    return best


def _flatten(prob, programs, result):
    """Slot and simulated start of every op, by op index."""
    position = np.zeros(prob.n, dtype=np.int64)
    start = np.zeros(prob.n)
    r = 0  # the result's rows follow the programs, device by device
    for prog in programs:
        for slot, (kind, s, j) in enumerate(prog):
            i = prob.op(_KIND_NAMES.index(kind), s, j)
            position[i] = slot
            start[i] = result.start[r]
            r += 1
    return position, start


def _one_machine(head, dur, tail_after):
    """Least span of ops run one at a time, given heads and times after them.

    The best of ``h + sum(dur) + t`` over the ops with ``head >= h`` and
    ``tail_after >= t``, for every threshold pair: a bound for any order.
    """
    best = 0.0
    for h in np.unique(head):
        sel = head >= h
        for t in np.unique(tail_after[sel]):
            both = sel & (tail_after >= t)
            best = max(best, h + dur[both].sum() + t)
    return best


def _bounds(prob, below, order):
    """Heads, tails and the known same-device orders.

    ``head[v]``: earliest start; ``tail[v]``: least time from v's start to
    the end (v's own duration included), both over every schedule that
    respects the dependencies, the microbatch order and the memory-derived
    orders.
    """
    n, dur, dev = prob.n, prob.dur, prob.device
    before = [[] for _ in range(n)]  # same-device ops known to precede
    after = [[] for _ in range(n)]
    for u in range(n):
        for v in _bits(below[u]):
            if dev[v] == dev[u]:
                after[u].append(v)
                before[v].append(u)
    lag_in = [[] for _ in range(n)]
    lag_out = [[] for _ in range(n)]
    for u, v, lag in prob.deps:
        lag_in[v].append((u, lag))
        lag_out[u].append((v, lag))
    head = np.zeros(n)
    for v in order:
        h = max((head[u] + dur[u] + lag for u, lag in lag_in[v]), default=0.0)
        if before[v]:
            # The known predecessors on the device run one at a time before v.
            pre = np.array(before[v])
            h = max(h, _one_machine(head[pre], dur[pre], np.zeros(len(pre))))
        head[v] = h
    tail = np.zeros(n)
    for u in reversed(order):
        t = max((lag + tail[v] for v, lag in lag_out[u]), default=0.0)
        if after[u]:
            post = np.array(after[u])
            t = max(t, _one_machine(np.zeros(len(post)), dur[post], tail[post] - dur[post]))
        tail[u] = dur[u] + t
    return head, tail, before, after


def _bits(x):
    """Indices of the set bits of an int."""
    out = []
    while x:
        low = x & -x
        out.append(low.bit_length() - 1)
        x ^= low
    return out


def _memory_orders(prob, below):
    """Orders that the memory limit forces, given the orders known so far.

    When F(s, k) starts, microbatches 0..k of stage s hold their
    activations except those whose B (and W) ran before; other stages'
    microbatches known to be in flight then hold theirs. If even the most
    frees that can precede F(s, k) leave too little room, the first few B
    (or W) of stage s must run before it; B and W of a stage run in
    microbatch order, so that is one new order each. Valid for every
    feasible schedule in microbatch order.
    """
    S, m, lim = prob.S, prob.m, prob.limit * (1.0 + 1e-9)
    arr = prob.arrays
    act, act_w = arr["activation"], arr["activation_w"]
    op = prob.op
    new = []

    def known(u, v):
        return (below[u] >> v) & 1

    for s in range(S):
        d = prob.placement[s]
        a, aw = act[s], act_w[s]
        if a <= 0:
            continue
        others = [t for t in range(S) if prob.placement[t] == d and t != s]
        for k in range(m):
            v = op(_F, s, k)
            held = prob.static[d]
            for t in others:
                for j in range(m):
                    if known(op(_F, t, j), v) and known(v, op(_B, t, j)):
                        held += act[t]
                    elif known(op(_B, t, j), v) and known(v, op(_W, t, j)):
                        held += act_w[t]
            room = lim - held
            # B and W of stage s that can still run before F(s, k): B(s, k) cannot.
            b_max = next((j for j in range(k) if known(v, op(_B, s, j))), k)
            w_max = next((j for j in range(b_max) if known(v, op(_W, s, j))), b_max)

            # Memory of stage s at F(s, k) after b B's and w W's of it: at most room.
            slack = room + 1e-12 * max(1.0, abs(room))
            b_min = next((b for b in range(b_max + 1)
                          if a * (k + 1) - (a - aw) * b - aw * min(b, w_max) <= slack), None)
            w_min = next((w for w in range(w_max + 1)
                          if a * (k + 1) - (a - aw) * b_max - aw * w <= slack), None)
            if b_min is None or w_min is None:
                raise RuntimeError(f"internal error: no room for F of stage {s}, microbatch {k} "
                                   f"under the memory limit")
            if b_min > 0 and not known(op(_B, s, b_min - 1), v):
                new.append((op(_B, s, b_min - 1), v))
            if w_min > 0 and not known(op(_W, s, w_min - 1), v):
                new.append((op(_W, s, w_min - 1), v))
    return new


def optimal(placement, microbatches: int, costs: Costs | None = None,
            memory_limit: float | None = None, time_limit: float = 60.0,
            threads: int | None = None) -> Optimum:
    """The minimum-makespan split-backward schedule under a memory limit (MILP).

    Solves a mixed-integer program with HiGHS (see the module docstring for
    the model). Exact, but exponential in the worst case: meant for small
    cases such as 4 devices and 8 microbatches, to measure heuristics
    against. Every device runs the F, B and W ops of its stages for every
    microbatch; transfers between devices take ``costs.comm`` (no network
    contention).

    Parameters
    ----------
    placement : sequence of int
        Device of each stage in model order: ``range(p)`` for a linear
        pipeline, ``[0, ..., p-1, p-1, ..., 0]`` for a V. Devices must be
        ``0..p-1``, each holding at least one stage.
    microbatches : int
        m >= 1.
    costs : Costs, optional
        As for :func:`pipecore.simulate` (default ``Costs(f=1, b=1, w=1)``).
        F and B must take positive time at every stage; W may take 0.
    memory_limit : float, optional
        Per-device limit on peak activation plus weights, as
        :attr:`Result.peak_activation` + :attr:`Result.static_memory`
        measure it. None: no limit.
    time_limit : float, default 60.0
        Seconds HiGHS may search; when it runs out, the best schedule found
        so far is returned with ``proven=False`` and its gap.
    threads : int, optional
        Threads for HiGHS (default: HiGHS's choice).

    Returns
    -------
    Optimum
        The schedule, its makespan, the best lower bound, the gap, whether
        optimality was proven, the time taken and the simulation result.

    Raises
    ------
    ValueError
        For a bad placement, microbatch count, costs, limit, time limit or
        thread count (naming the value), F or B costs of 0, or a memory limit
        below what one microbatch needs on some device.
    ImportError
        If highspy is not installed (``pip install "pipecore[milp]"``).
    RuntimeError
        If the simulation of the solution disagrees with the MILP (a bug).
    """
    t_start = time.perf_counter()
    placement, p = _check_placement(placement)
    m = _check_int("microbatches", microbatches, minimum=1)
    costs = Costs(f=1.0, b=1.0, w=1.0) if costs is None else costs
    if not isinstance(costs, Costs):
        raise InputError(f"'costs' must be a pipecore.Costs (got {type(costs).__name__})")
    limit = _check_number("memory_limit", memory_limit, allow_none=True, allow_inf=True)
    if limit is not None and math.isinf(limit):
        limit = None
    time_limit = _check_number("time_limit", time_limit, allow_inf=True)
    if threads is not None:
        threads = _check_int("threads", threads, minimum=1)
    highspy = _import_highspy()

    prob = _Problem(placement, p, m, costs, limit)
    n, dur, dev, delta = prob.n, prob.dur, prob.device, prob.delta
    H, warm_programs, warm_result = _warm_start(prob, costs)
    # Known orders: dependencies, microbatch order, and what memory forces
    # given those (repeated, since each new order can force more).
    edges = [(u, v) for u, v, _lag in prob.deps] + prob.chains
    while True:
        order, below = _reach(n, edges)
        if limit is None:
            break
        more = _memory_orders(prob, below)
        if not more:
            break
        edges += more
    head, tail, before, after = _bounds(prob, below, order)
    lb = float(np.max(head + tail))
    for d in range(p):
        on = np.flatnonzero(dev == d)
        lb = max(lb, _one_machine(head[on], dur[on], tail[on] - dur[on]))
    # The warm start obeys every bound (it is a feasible schedule in microbatch
    # order): a check on the bounds, which the model relies on.
    warm = _flatten(prob, warm_programs, warm_result)[1]
    eps = 1e-9 * max(H, 1.0)
    if np.any(head > warm + eps) or np.any(warm + tail > H + eps) or lb > H + eps:
        raise RuntimeError("internal error: the time bounds exclude the warm-start schedule")
    # Latest start of each op in a schedule no longer than the warm start; eps
    # keeps the warm start inside the windows despite rounding.
    latest = np.maximum(H - tail, head) + eps

    # Pairs on one device: known order (from dependencies, microbatch order or
    # the windows) or a binary.
    known = {}  # (u, v) -> True: u runs before v
    for u in range(n):
        for v in after[u]:
            known[(u, v)] = True
    pairs = []
    for d in range(p):
        on = [int(i) for i in np.flatnonzero(dev == d)]
        for a_i, u in enumerate(on):
            for v in on[a_i + 1:]:
                if (u, v) in known or (v, u) in known:
                    continue
                u_first = head[u] + dur[u] <= latest[v]
                v_first = head[v] + dur[v] <= latest[u]
                if u_first and v_first:
                    pairs.append((u, v))
                elif u_first:
                    known[(u, v)] = True
                else:
                    known[(v, u)] = True

    # Every known order holds in the warm start, a feasible schedule in
    # microbatch order; otherwise a derived order would be wrong.
    position, warm_start = _flatten(prob, warm_programs, warm_result)
    wrong = next(((u, v) for (u, v) in known if position[u] > position[v]), None)
    if wrong is not None:
        raise RuntimeError(f"internal error: derived order {prob.key(wrong[0])} before "
                           f"{prob.key(wrong[1])} is broken by a feasible schedule")

    # Columns: starts 0..n-1, makespan n, binaries n+1...
    n_cols = n + 1 + len(pairs)
    col_lo = np.concatenate([head, [lb], np.zeros(len(pairs))])
    col_hi = np.concatenate([latest, [H + eps], np.ones(len(pairs))])
    cost = np.zeros(n_cols)
    cost[n] = 1.0
    rows = []  # (lower, {col: coef}); every row is ">= lower"

    def at_least(lower, coefs):
        rows.append((lower, coefs))

    for u, v, lag in prob.deps:
        if dev[u] != dev[v]:
            at_least(dur[u] + lag, {v: 1.0, u: -1.0})
    for (u, v) in known:
        at_least(dur[u], {v: 1.0, u: -1.0})
    for i, (u, v) in enumerate(pairs):
        y = n + 1 + i
        # y = 1: u first, so start(v) >= start(u) + dur(u) - big_uv * (1 - y).
        big_uv = latest[u] + dur[u] - head[v]
        at_least(dur[u] - big_uv, {v: 1.0, u: -1.0, y: -big_uv})
        big_vu = latest[v] + dur[v] - head[u]
        at_least(dur[v], {u: 1.0, v: -1.0, y: big_vu})
    for v in range(n):
        at_least(tail[v], {n: 1.0, v: -1.0})

    pair_col = {}
    for i, (u, v) in enumerate(pairs):
        pair_col[(u, v)] = (n + 1 + i, False)  # "u before v" is y
        pair_col[(v, u)] = (n + 1 + i, True)   # "v before u" is 1 - y

    def before_expr(u, v):
        """[u runs before v] as (constant, {col: coef})."""
        if (u, v) in known:
            return 1.0, {}
        if (v, u) in known:
            return 0.0, {}
        col, flipped = pair_col[(u, v)]
        return (1.0, {col: -1.0}) if flipped else (0.0, {col: 1.0})

    if limit is not None:
        cap = limit * (1.0 + 1e-9)
        for v in np.flatnonzero(prob.kind == _F):
            d = dev[v]
            const = prob.static[d] + delta[v]
            coefs = {}
            for u in np.flatnonzero(dev == d):
                if u == v:
                    continue
                c0, lin = before_expr(int(u), int(v))
                const += c0 * delta[u]
                for col, a in lin.items():
                    coefs[col] = coefs.get(col, 0.0) + a * delta[u]
            worst = const + sum(max(c, 0.0) for c in coefs.values())
            if worst <= cap:
                continue  # cannot exceed the limit whatever the order
            # const + sum(coef * col) <= cap, written as >=.
            at_least(const - cap, {col: -c for col, c in coefs.items()})

    # Transitivity through known orders, which the big-M rows only imply
    # weakly: if u runs before v, so does everything known to precede u, and
    # u runs before everything known to follow v. Immediate neighbours in
    # the known order suffice (the rest follows by chaining).
    def immediate(lists):
        sets = [set(x) for x in lists]
        return [[x for x in lst if not any(x in sets[w] for w in lst)] for lst in lists]

    pred, succ = immediate(before), immediate(after)

    def implies(first, second):
        """Row for [first] <= [second], each a before_expr."""
        (c1, l1), (c2, l2) = first, second
        if not l1 and not l2:
            return
        coefs = dict(l2)
        for col, a in l1.items():
            coefs[col] = coefs.get(col, 0.0) - a
        at_least(c1 - c2, coefs)

    for u, v in pairs:
        for x, y in ((u, v), (v, u)):
            for w in pred[x]:
                implies(before_expr(x, y), before_expr(w, y))
            for w in succ[y]:
                implies(before_expr(x, y), before_expr(x, w))

    # Zero-time ops (W with w = 0) can share a start time, so the time rows
    # alone do not make the binaries a total order; forbid 3-cycles among them.
    zero = [int(i) for i in np.flatnonzero(dur == 0.0)]
    for d in range(p):
        zs = [i for i in zero if dev[i] == d]
        for a_i in range(len(zs)):
            for b_i in range(a_i + 1, len(zs)):
                for c_i in range(b_i + 1, len(zs)):
                    a, b, c = zs[a_i], zs[b_i], zs[c_i]
                    for x, y, z in ((a, b, c), (a, c, b)):
                        exprs = [before_expr(x, y), before_expr(y, z), before_expr(z, x)]
                        if not any(lin for _c0, lin in exprs):
                            continue
                        const = sum(c0 for c0, _lin in exprs)
                        coefs = {}
                        for _c0, lin in exprs:
                            for col, coef in lin.items():
                                coefs[col] = coefs.get(col, 0.0) + coef
                        at_least(const - 2.0, {col: -coef for col, coef in coefs.items()})

    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    h.setOptionValue("time_limit", float(time_limit))
    # Close the gap far below the 1e-6 agreement with the simulation checked below.
    h.setOptionValue("mip_rel_gap", 1e-7)
    h.setOptionValue("mip_abs_gap", 1e-9)
    h.setOptionValue("random_seed", 0)
    if threads is not None:
        # HiGHS keeps one thread pool per process, sized by its first solve;
        # another size is refused unless the pool is rebuilt.
        highspy.Highs.resetGlobalScheduler(True)
        h.setOptionValue("threads", threads)
    inf = highspy.kHighsInf
    lp = highspy.HighsLp()
    lp.num_col_ = n_cols
    lp.num_row_ = len(rows)
    lp.col_cost_ = cost
    lp.col_lower_ = col_lo
    lp.col_upper_ = col_hi
    lp.row_lower_ = np.array([lo for lo, _c in rows])
    lp.row_upper_ = np.full(len(rows), inf)
    starts, index, value = [0], [], []
    for _lo, coefs in rows:
        for col, a in coefs.items():
            if a != 0.0:
                index.append(col)
                value.append(a)
        starts.append(len(index))
    lp.a_matrix_.format_ = highspy.MatrixFormat.kRowwise
    lp.a_matrix_.start_ = np.array(starts, dtype=np.int32)
    lp.a_matrix_.index_ = np.array(index, dtype=np.int32)
    lp.a_matrix_.value_ = np.array(value)
    lp.integrality_ = [highspy.HighsVarType.kContinuous] * (n + 1) \
        + [highspy.HighsVarType.kInteger] * len(pairs)
    h.passModel(lp)

    # Warm start: the heuristic's program order and its simulated starts.
    guess = np.concatenate([np.clip(warm_start, col_lo[:n], col_hi[:n]), [H],
                            [1.0 if position[u] < position[v] else 0.0 for u, v in pairs]])
    sol = highspy.HighsSolution()
    sol.col_value = list(guess)
    sol.value_valid = True
    h.setSolution(sol)

    run_status = h.run()
    if run_status == highspy.HighsStatus.kError:
        raise RuntimeError(f"HiGHS failed to solve the model: "
                           f"{h.modelStatusToString(h.getModelStatus())}")
    status = h.getModelStatus()
    info = h.getInfo()
    status_text = h.modelStatusToString(status)
    has_solution = info.primal_solution_status == 2  # kSolutionStatusFeasible
    bound = max(float(info.mip_dual_bound), lb) if math.isfinite(info.mip_dual_bound) else lb
    proven = status == highspy.HighsModelStatus.kOptimal
    if has_solution:
        x = np.asarray(h.getSolution().col_value)
        objective = float(info.objective_function_value)
        ybin = np.round(x[n + 1:]).astype(bool)
        starts_mip = x[:n]
    else:  # no incumbent at all (should not happen with a warm start)
        objective = H
        ybin = np.array([position[u] < position[v] for u, v in pairs], dtype=bool)
        starts_mip = warm_start

    # The program order: each op's rank on its device is how many ops the
    # binaries (and the known orders) put before it; start time and kind
    # only break ties, which a total order does not have.
    rank = np.zeros(n, dtype=np.int64)
    for (_u, v) in known:
        rank[v] += 1
    for (u, v), y in zip(pairs, ybin):
        rank[v if y else u] += 1
    programs = []
    for d in range(p):
        on = [int(i) for i in np.flatnonzero(dev == d)]
        if sorted(rank[on].tolist()) != list(range(len(on))):
            raise RuntimeError(f"internal error: the ordering binaries of device {d} are not a "
                               f"total order")
        on.sort(key=lambda i: (rank[i], starts_mip[i], prob.kind[i]))
        programs.append([prob.key(i) for i in on])
    schedule = Schedule.from_programs(programs, devices=p, name="milp",
                                      params={"placement": placement})
    result = simulate(schedule, costs)
    span = result.makespan
    tol = 1e-6 * max(abs(objective), 1.0)
    if span > objective + tol:
        raise RuntimeError(f"internal error: the MILP schedule simulates to {span:.9g}, longer "
                           f"than its objective {objective:.9g}")
    if proven and span < objective - tol:
        raise RuntimeError(f"internal error: the proven MILP optimum {objective:.9g} is beaten "
                           f"by the simulation of its own order ({span:.9g})")
    if bound > span + tol:
        # The simulated order is a feasible point of the model: no valid bound exceeds it.
        raise RuntimeError(f"internal error: the MILP bound {bound:.9g} exceeds the makespan "
                           f"{span:.9g} of a schedule it admits")
    memory = (result.peak_activation + result.static_memory).max()
    if limit is not None and not fits(memory, limit):
        raise RuntimeError(f"internal error: the MILP schedule needs memory {memory:g} above "
                           f"the limit {limit:g}")
    # The simulated makespan is exact (the objective carries the solver's
    # 1e-6 tolerances) and, without proof, may be below the incumbent's own
    # times when those left idle slack: it is the one reported.
    bound = min(bound, span)
    gap = (span - bound) / span if span > 0 else 0.0
    return Optimum(schedule=schedule, makespan=float(span), bound=float(bound), gap=float(gap),
                   proven=bool(proven), seconds=time.perf_counter() - t_start, result=result,
                   objective=float(objective), heuristic=float(H), binaries=len(pairs),
                   status=status_text)

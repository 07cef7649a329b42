"""One instance of :func:`pipecore.search.milp.optimal` and what it implies before solving.

:class:`_Problem` holds the ops, durations, dependencies and memory of the
instance as flat arrays; the functions below derive what every feasible
schedule in microbatch order must satisfy (see the model in the docstring of
:mod:`pipecore.search.milp`): orders known from the dependencies, the
microbatch order and the memory limit (:func:`_known_orders`), and the time
windows, heads and tails that bound each op's start (:func:`_time_windows`).
The model's big Ms and its fixed pairs come from these, so they must hold
for every optimum; :func:`_time_windows` checks them against a feasible
schedule.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.costs import fits
from ..core.ops import InputError
from ..kernels.codes import B as _B
from ..kernels.codes import F as _F
from ..kernels.codes import W as _W

# Names of the op kinds 0, 1, 2 (the codes F, B, W) in programs and messages.
_KIND_NAMES = ("F", "B", "W")


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
        """Index of the op of kind code ``kind`` (F, B or W), stage s, microbatch j."""
        return (kind * self.S + s) * self.m + j

    def key(self, i):
        """Op i as (kind name, stage, microbatch), as programs and messages write it."""
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


def _known_orders(prob):
    """Orders every feasible schedule in microbatch order keeps.

    The dependencies, the microbatch order of each kind-stage, and what the
    memory limit forces given those: repeated until nothing new follows,
    since each new order can force more. Returns the topological order of
    the ops and the reachability bitsets of :func:`_reach` (bit v of
    ``below[u]``: u runs before v).
    """
    edges = [(u, v) for u, v, _lag in prob.deps] + prob.chains
    while True:
        order, below = _reach(prob.n, edges)
        if prob.limit is None:
            return order, below
        more = _memory_orders(prob, below)
        if not more:
            return order, below
        edges += more


@dataclass(frozen=True)
class _Windows:
    """The time bounds of the model, from the known orders and the warm start.

    Attributes
    ----------
    head, tail : ndarray of float, shape (n,)
        Earliest start of each op, and least time from its start to the end
        of any schedule (its own duration included): see :func:`_bounds`.
    before, after : list of list of int
        Same-device ops known to run before / after each op.
    lb : float
        Static lower bound on the makespan: the longest head plus tail, and
        the one-machine bound of every device.
    latest : ndarray of float, shape (n,)
        Latest start of each op in a schedule no longer than the warm start
        (``H - tail``, at least ``head``), plus ``eps``.
    H : float
        Makespan of the warm start: the upper bound.
    eps : float
        Rounding slack, ``1e-9 * max(H, 1)``: keeps the warm start inside the
        windows.
    """

    head: np.ndarray
    tail: np.ndarray
    before: list
    after: list
    lb: float
    latest: np.ndarray
    H: float
    eps: float


def _time_windows(prob, order, below, H, warm_start):
    """Heads, tails, the static lower bound and each op's latest start.

    ``H`` is the warm start's makespan and ``warm_start`` its simulated
    starts by op index. The warm start is a feasible schedule in microbatch
    order, so it obeys every bound: checked here, since the model relies on
    the bounds (a start outside its window would cut off a feasible point).
    """
    dur, dev = prob.dur, prob.device
    head, tail, before, after = _bounds(prob, below, order)
    lb = float(np.max(head + tail))
    for d in range(prob.p):
        on = np.flatnonzero(dev == d)
        lb = max(lb, _one_machine(head[on], dur[on], tail[on] - dur[on]))
    eps = 1e-9 * max(H, 1.0)
    if np.any(head > warm_start + eps) or np.any(warm_start + tail > H + eps) or lb > H + eps:
        raise RuntimeError("internal error: the time bounds exclude the warm-start schedule")
    latest = np.maximum(H - tail, head) + eps
    return _Windows(head=head, tail=tail, before=before, after=after, lb=lb, latest=latest, H=H,
                    eps=eps)

"""Exact minimum-makespan schedules for small cases, as a MILP solved by HiGHS.

:func:`optimal` finds the shortest split-backward schedule (F, B and W ops for
every stage and microbatch) of a placement under a per-device memory limit,
with the semantics of :func:`pipecore.simulate` (no :class:`~pipecore.Network`:
a transfer between devices takes ``costs.comm``). It is meant for small cases
(a few devices, up to about ten microbatches), where it gives the optimum that
the heuristics (:func:`pipecore.tune`, :func:`pipecore.generate.memory_greedy`)
can be measured against. A linear pipeline of 4 devices and 8 microbatches
closes its gap quickly; a V of the same size with a binding memory limit may
not close it within the time limit (the big-M bound is weak there), and then
the best schedule found comes back with its gap.

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
ahead of it in program order.) ``_sort_microbatches`` is this argument
as code; the warm start goes through it.

The code follows these steps: ``milp_problem`` holds the
instance, the known orders and the time windows, ``milp_warm``
the warm start, ``milp_model`` the rows and the call to
HiGHS; :func:`optimal` runs them in turn and reads the solution back into a
schedule, which it checks by simulation.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from ..core.costs import Costs, fits
from ..core.ops import InputError
from ..core.schedule import Schedule, check_int
from ..core.simulate import Result, simulate
from .milp_model import _check_known, _model, _Order, _order_pairs, _solve, _warm_guess
from .milp_problem import _known_orders, _Problem, _time_windows
from .milp_warm import _flatten, _warm_start

__all__ = ["optimal", "Optimum"]

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
    """The highspy module, or an ImportError that says how to install it."""
    try:
        import highspy
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(_INSTALL_HINT) from exc
    return highspy


def _check_placement(placement):
    """The placement as a list of ints and its device count p; devices must
    be 0..p-1, each holding a stage."""
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
    """``value`` as a float > 0 (None or inf only where allowed)."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise InputError(f"'{name}' must be a number > 0 (got {value!r})")
    x = float(value)
    if math.isnan(x) or x <= 0 or (math.isinf(x) and not allow_inf):
        raise InputError(f"'{name}' must be a {'' if allow_inf else 'finite '}number > 0 "
                         f"(got {value!r})")
    return x


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
        :attr:`~pipecore.Result.peak_activation` + :attr:`~pipecore.Result.static_memory`
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
    placement, p, m, costs, limit, time_limit, threads = _check_arguments(
        placement, microbatches, costs, memory_limit, time_limit, threads)
    highspy = _import_highspy()
    # The instance, and the best heuristic schedule: the upper bound H.
    prob = _Problem(placement, p, m, costs, limit)
    H, warm_programs, warm_result = _warm_start(prob, costs)
    position, warm_start = _flatten(prob, warm_programs, warm_result)
    # What every schedule in microbatch order keeps: known orders, time windows.
    order_of_ops, below = _known_orders(prob)
    win = _time_windows(prob, order_of_ops, below, H, warm_start)
    # Each pair of ops on a device: a known order or a binary; then the model.
    known, pairs = _order_pairs(prob, win)
    _check_known(prob, known, position)
    order = _Order(prob.n, known, pairs)
    model = _model(prob, win, order)
    solved = _solve(highspy, model, _warm_guess(model, order, H, warm_start, position),
                    time_limit, threads)
    # The solution's order as a schedule, checked against the MILP by simulation.
    objective, ybin, starts = _incumbent(prob, solved, order, H, warm_start, position)
    schedule = _schedule(prob, order, ybin, starts)
    result = simulate(schedule, costs)
    bound = win.lb if math.isnan(solved.dual_bound) else max(solved.dual_bound, win.lb)
    span, bound = _check_solution(result, objective, bound, solved.proven, limit)
    gap = (span - bound) / span if span > 0 else 0.0
    return Optimum(schedule=schedule, makespan=float(span), bound=float(bound), gap=float(gap),
                   proven=bool(solved.proven), seconds=time.perf_counter() - t_start,
                   result=result, objective=float(objective), heuristic=float(H),
                   binaries=len(pairs), status=solved.status_text)


def _check_arguments(placement, microbatches, costs, memory_limit, time_limit, threads):
    """:func:`optimal`'s arguments checked and normalised: the placement as a
    list and its device count, costs defaulting to unit F, B and W, an
    infinite memory limit as None."""
    placement, p = _check_placement(placement)
    m = check_int("microbatches", microbatches, minimum=1)
    costs = Costs(f=1.0, b=1.0, w=1.0) if costs is None else costs
    if not isinstance(costs, Costs):
        raise InputError(f"'costs' must be a pipecore.Costs (got {type(costs).__name__})")
    limit = _check_number("memory_limit", memory_limit, allow_none=True, allow_inf=True)
    if limit is not None and math.isinf(limit):
        limit = None
    time_limit = _check_number("time_limit", time_limit, allow_inf=True)
    if threads is not None:
        threads = check_int("threads", threads, minimum=1)
    return placement, p, m, costs, limit, time_limit, threads


def _incumbent(prob, solved, order, H, warm_start, position):
    """The solver's incumbent as (objective, binaries, starts): rounded
    binaries and the starts of its solution, or the warm start's order and
    starts when HiGHS has no solution at all (which a warm start should
    prevent)."""
    if solved.x is None:
        ybin = np.array([position[u] < position[v] for u, v in order.pairs], dtype=bool)
        return H, ybin, warm_start
    return solved.objective, np.round(solved.x[prob.n + 1:]).astype(bool), solved.x[:prob.n]


def _schedule(prob, order, ybin, starts):
    """The schedule of a solution: each device's ops in the order the
    binaries ``ybin`` (one per free pair, True: its first op first) and the
    known orders give.

    An op's rank on its device is how many ops the orders put before it;
    start time and kind only break ties, which a total order does not have.
    """
    rank = np.zeros(prob.n, dtype=np.int64)
    for (_u, v) in order.known:
        rank[v] += 1
    for (u, v), y in zip(order.pairs, ybin):
        rank[v if y else u] += 1
    programs = []
    for d in range(prob.p):
        on = [int(i) for i in np.flatnonzero(prob.device == d)]
        if sorted(rank[on].tolist()) != list(range(len(on))):
            raise RuntimeError(f"internal error: the ordering binaries of device {d} are not a "
                               f"total order")
        on.sort(key=lambda i: (rank[i], starts[i], prob.kind[i]))
        programs.append([prob.key(i) for i in on])
    return Schedule.from_programs(programs, devices=prob.p, name="milp",
                                  params={"placement": prob.placement})


def _check_solution(result, objective, bound, proven, limit):
    """The simulation of the solution's order agrees with the MILP.

    It is no longer than the objective (equal when proven), no bound
    exceeds it, and it fits the memory limit; anything else is a bug in the
    model. Returns the simulated makespan, which is exact (the objective
    carries the solver's 1e-6 tolerances) and, without proof, may be below
    the incumbent's own times when those left idle slack: it is the one
    reported. The bound is capped by it.
    """
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
    return span, min(bound, span)

"""The warm start of :func:`pipecore.search.milp.optimal`: the fastest fitting heuristic.

A heuristic schedule that fits the memory limit bounds the optimum from
above: its makespan gives the time windows (hence the big Ms), and its order
is the solver's first incumbent, so a time limit still returns a feasible
schedule. Every candidate goes through :func:`_sort_microbatches`, which puts
it in microbatch order without changing its makespan (the symmetry-breaking
argument in the docstring of :mod:`pipecore.search.milp`), so it is a
feasible point of the model.
"""

from __future__ import annotations

import numpy as np

from ..core.costs import fits
from ..core.schedule import Action, Schedule
from ..core.simulate import simulate
from ..kernels.codes import B as _B
from ..kernels.codes import F as _F
from ..kernels.codes import W as _W
from .milp_problem import _KIND_NAMES


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

    The docstring of :mod:`pipecore.search.milp` proves that this keeps a
    feasible schedule feasible with the same busy intervals and memory curve.
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

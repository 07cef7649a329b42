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

from ..core import tier
from ..core.costs import Costs, Network, fits
from ..core.ops import AR, InputError, check_choice, check_type
from ..core.schedule import KINDS, Schedule
from ..core.simulate import compile_schedule, simulate, validate
from ..kernels import localsearch as _ls
from ..kernels.codes import O

__all__ = ["local_search"]


@tier.compiled()  # many simulations: compile at once, no interpreted budget
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
    check_type("schedule", schedule, Schedule, "a pipecore.Schedule")
    check_choice("objective", objective, ("makespan", "span"))
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise InputError(f"'window' must be an int >= 1 (got {window!r})")
    if isinstance(max_evals, bool) or not isinstance(max_evals, int) or max_evals < 1:
        raise InputError(f"'max_evals' must be an int >= 1 (got {max_evals!r})")
    costs = Costs() if costs is None else costs
    validate(schedule)
    st = schedule._info()
    if (schedule.kind_codes >= O).any():
        raise InputError("local_search keeps memory in program order: schedules that offload "
                         "activations (O and L ops) are not supported")
    if st.paired.any() or (schedule.kind_codes == AR).any():
        raise InputError("local_search moves single ops: schedules with overlapped F&B pairs or "
                         "all-reduces are not supported")
    limit = math.inf if memory_limit is None else float(memory_limit)
    start = simulate(schedule, costs, network)
    start_mem = float((start.peak_activation + start.static_memory).max())
    if not fits(start_mem, limit):
        raise InputError(f"the starting schedule needs {start_mem:g}, above memory_limit "
                         f"{limit:g}")
    c = compile_schedule(schedule, costs, network)
    p = schedule.devices
    static = np.asarray(start.static_memory, dtype=np.float64)
    row_dev = np.repeat(np.arange(p), np.diff(c.dev_ptr)).astype(np.int64)
    for name_, value in (("restarts", restarts), ("kick", kick), ("seed", seed)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InputError(f"'{name_}' must be an int >= 0 (got {value!r})")
    fixed = (_ls.Ops(dev_ptr=c.dev_ptr, row_dev=row_dev, op_class=c.op_class, op_stage=c.op_stage,
                     dep=c.dep, xfer=c.xfer, out_ptr=c.out_ptr),
             _ls.Transfers(x_dst=c.x_dst, x_link=c.x_link, x_ser=c.x_ser, x_lat=c.x_lat,
                           n_links=c.n_links),
             _ls.Objective(stage_cost=c.stage_cost, act=c.act, act_w=c.act_w, ckpt=c.ckpt,
                           static=static, span_objective=objective == "span",
                           limit=limit * (1 + 1e-9)))
    order = np.arange(c.op_kind.shape[0], dtype=np.int64)
    best, used = _ls.climb(order, *fixed, window, max_evals)
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
        value, spent = _ls.climb(trial, *fixed, window, max_evals - used)
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

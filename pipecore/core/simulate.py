"""Simulate a schedule: compile it with costs (core/compile.py), run the list
scheduler, and wrap the answer in a :class:`Result` (core/result.py); and
validate, which is the same run under unit costs."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ..kernels import listsched as _kernels
from .compile import Compiled, Run, _check_costs, compile_schedule  # noqa: F401 (re-exported)
from .costs import SMALLEST_NORMAL, Costs, Network
from .ops import InputError
from .result import Result, plug  # noqa: F401 (re-exported: the public path of Result)
from .schedule import KINDS, Schedule, ScheduleError, op_label

__all__ = ["simulate", "validate", "compile_schedule", "Result", "Compiled"]

# From this many ops on, simulate() runs the list scheduler's summary pass
# and leaves each op's start and finish for the first use (Result.start).
LAZY_MIN_OPS = 1 << 20


def _deadlock_error(schedule, head):
    dev_ptr = schedule._info().dev_ptr
    blocked = [int(head[d]) for d in range(schedule.devices) if head[d] < dev_ptr[d + 1]]
    kinds = schedule.kind_codes
    stage = schedule._column("stage")
    mb = schedule._column("microbatch")
    dev = schedule._column("device")
    slot = schedule._column("slot")
    parts = [f"device {int(dev[r])} slot {int(slot[r])} waits at "
             f"{op_label(kinds[r], int(stage[r]), int(mb[r]))}" for r in blocked]
    r0 = blocked[0]
    msg = ("deadlock: every blocked device waits on an op that can never run; "
           + "; ".join(parts)
           + "\nper-device programs (stuck ops marked >>..<<):\n" + schedule.render(blocked))
    err = ScheduleError(msg, rule="deadlock", device=int(dev[r0]), slot=int(slot[r0]),
                        stage=int(stage[r0]), microbatch=int(mb[r0]), kind=KINDS[kinds[r0]])
    err.blocked = [(int(dev[r]), int(slot[r])) for r in blocked]
    return err


def validate(schedule: Schedule) -> Schedule:  # work factors change no rule: allowed
    """Check every rule of a schedule, including freedom from deadlock.

    Parameters
    ----------
    schedule : Schedule
        Built, composed or read from a file.

    Returns
    -------
    Schedule
        The same schedule, for chaining.

    Raises
    ------
    ScheduleError
        For a missing or duplicate op, an op before its producer on the
        same device, stages split across devices, or a deadlock (naming the
        stuck op at the head of every blocked device).
    """
    compiled = compile_schedule(schedule, Costs(f=1.0, b=1.0, w=1.0, comm=0.0, offload=1.0),
                                factors=True)
    # Only the status and the heads matter here: the summary pass will do.
    run = compiled.run(keep=compiled.shared_links)
    if run.status == _kernels.STATUS_DEADLOCK:
        raise _deadlock_error(schedule, run.head)
    return schedule


def straggler_scale(schedule: Schedule, stragglers) -> np.ndarray:
    """Per-op time factors from a straggler description.

    Parameters
    ----------
    schedule : Schedule
    stragglers : mapping of int to float, or array_like, or None
        ``{device: factor}`` slows every op of a device (factor > 0, e.g.
        1.3 for 30% slower); an array gives one factor per op row.

    Returns
    -------
    numpy.ndarray
        One factor per op row (ones for None).

    Raises
    ------
    ValueError
        Naming a device out of range or a factor that is not a finite
        number > 0, or an array of the wrong length.
    """
    n = schedule.num_ops
    if stragglers is None:
        return np.ones(n)
    if isinstance(stragglers, Mapping):
        per_dev = np.ones(schedule.devices)
        for d, factor in stragglers.items():
            if isinstance(d, bool) or not isinstance(d, (int, np.integer)) \
                    or not 0 <= d < schedule.devices:
                raise InputError(f"straggler device {d!r} is not one of 0..{schedule.devices - 1}")
            if isinstance(factor, (bool, np.bool_)) or not isinstance(
                    factor, (int, float, np.integer, np.floating)):
                raise InputError(f"straggler factor of device {d} must be a finite number > 0 "
                                 f"(got {factor!r})")
            f = float(factor)
            if not math.isfinite(f) or f <= 0:
                raise InputError(f"straggler factor of device {d} must be a finite number > 0 "
                                 f"(got {factor!r})")
            per_dev[d] = f
        return per_dev[schedule._column("device")]
    arr = np.asarray(stragglers, dtype=np.float64)
    if arr.shape != (n,):
        raise InputError(f"per-op straggler factors need one entry per op ({n}); got shape "
                         f"{arr.shape}")
    bad = np.flatnonzero(~np.isfinite(arr) | (arr <= 0))
    if bad.size:
        raise InputError(f"straggler factor of op {int(bad[0])} must be a finite number > 0 "
                         f"(got {arr[bad[0]]})")
    return arr


def simulate(schedule: Schedule, costs: Costs | None = None,
             network: Network | None = None, stragglers=None, jitter=None,
             draw: int = 0) -> Result:
    """Simulate a schedule: every op's start and finish, transfers, memory.

    Parameters
    ----------
    schedule : Schedule
        From :func:`pipecore.build` or :func:`pipecore.from_actions`.
    costs : Costs, optional
        Op times and memory; defaults to ``Costs()``.
    network : Network, optional
        Bandwidth-limited links with contention. Without one, each
        transfer takes ``costs.comm`` and links never contend.
    stragglers : mapping of int to float, or array_like, optional
        Slow devices, ``{device: factor}`` (1.3: every op 30% slower), or
        one factor per op row (``straggler_scale``).
    jitter : Jitter, optional
        Random factors on op times (:class:`pipecore.Jitter`); this
        simulation uses draw number ``draw``.
    draw : int, default 0
        Which draw of ``jitter`` (the same as :func:`pipecore.monte_carlo`'s
        draw of that index).

    Returns
    -------
    Result

    Raises
    ------
    ScheduleError
        If the schedule deadlocks (naming the stuck op on every blocked
        device).
    ValueError
        If costs, network, stragglers or jitter are invalid or do not fit
        the schedule, or the times overflow float64 (no infinite makespan
        is returned as an answer) or underflow it (a positive makespan below
        2.2e-308, whose subnormal digits give no accurate ratios).
    """
    if isinstance(draw, bool) or not isinstance(draw, (int, np.integer)) or draw < 0:
        raise InputError(f"'draw' must be an int >= 0, the index of a jitter draw (got {draw!r})")
    compiled = compile_schedule(schedule, costs, network, factors=True)
    factors = getattr(schedule, "factors", None)
    scale = None if factors is None or factors.time is None else factors.time
    if stragglers is not None or jitter is not None:
        scale = straggler_scale(schedule, stragglers) * (1.0 if scale is None else scale)
        if jitter is not None:
            # Duck-typed: pipecore.Jitter lives in analysis/, above this layer.
            if not callable(getattr(jitter, "draw", None)):
                raise InputError(f"'jitter' must be a pipecore.Jitter (got {type(jitter).__name__})")
            scale = scale * jitter.draw(schedule, 1, draw)[:, 0]
    # Large schedules run the summary pass now and the per-op times when
    # something asks for them (the summary pass writes no per-op array: less
    # memory to fill when only the makespan, busy times, spans and peaks are wanted).
    keep = compiled.op_kind.shape[0] < LAZY_MIN_OPS or compiled.shared_links
    with np.errstate(over="ignore", invalid="ignore"):  # checked below, with a message
        run = compiled.run(scale, keep=keep)
    busy, dev_free = run.busy, run.dev_free
    if run.status == _kernels.STATUS_DEADLOCK:
        raise _deadlock_error(schedule, run.head)
    if not (np.isfinite(dev_free).all() and np.isfinite(busy).all()):
        c = _check_costs(costs)
        raise InputError(
            f"the simulated times of {schedule.name!r} overflow float64 (makespan "
            f"{float(np.max(dev_free)):g}): an op time, a transfer time or their sum along the "
            f"schedule exceeds 1.8e308 (costs f={np.max(c.f):g}, b={np.max(c.b):g}, "
            f"w={np.max(c.w):g}, comm={np.max(c.comm):g}"
            + ("" if scale is None else f"; work/straggler/jitter factors up to {np.max(scale):g}")
            + "); express the costs in a larger unit")
    makespan = float(np.max(dev_free)) if dev_free.size else 0.0
    if 0 < makespan < SMALLEST_NORMAL:
        c = _check_costs(costs)
        raise InputError(
            f"the simulated times of {schedule.name!r} underflow float64 (makespan "
            f"{makespan:g}, below 2.2e-308, float64's smallest normal number, where too few "
            f"digits remain for accurate times and ratios; costs f={np.max(c.f):g}, "
            f"b={np.max(c.b):g}, w={np.max(c.w):g}, comm={np.max(c.comm):g}); express the "
            f"costs in a smaller unit")
    res = Result(schedule, _check_costs(costs), network, compiled, run if keep else None, busy,
                 dev_free, run.dev_first, scale=None if keep else scale)
    # A copy: what_if replays these, and the caller may reuse their own.
    if isinstance(stragglers, Mapping):
        stragglers = dict(stragglers)
    elif stragglers is not None:
        stragglers = np.array(stragglers, dtype=np.float64)
    res.stragglers, res.jitter, res.draw = stragglers, jitter, draw
    return res

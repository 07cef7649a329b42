"""Parameter freezing: stages whose weights take no gradient skip backward work.

A frozen stage computes no weight gradient, so it has no W, and a fused BW
becomes a B (input gradient only), which it still owes the stages below.
A frozen stage below the lowest trainable one owes nobody a gradient: it
runs its forwards alone (no B, W or BW) and keeps no activation for them.
Egeria (Wang et al., arXiv:2201.06227) and AutoFreeze (Liu et al.,
arXiv:2102.01386) freeze
the front layers first, as those converge first; TimelyFreeze (Cho et al.,
arXiv:2602.05754) picks what to freeze where the pipeline's critical path
gains.

:func:`freeze` turns any schedule into its frozen form; ``pc.build(name,
p, m, frozen=...)`` builds a family then freezes it. The memory rule is
:func:`pipecore.core.compile.frozen_memory`.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable

import numpy as np

from ..core.ops import InputError, check_type
from ..core.schedule import AR, BW, B, F, L, O, R, Schedule, W, refuse_factors
from . import registry
from .zerobubble import _split_peak

__all__ = ["freeze", "frozen_stages", "frozen_formula", "formula_frozen_1f1b",
           "formula_frozen_zb_h1"]

#: Above this many ops ``adapt=True`` is refused: its list-scheduling pass is
#: a Python event loop (about a second per 10^5 ops).
ADAPT_MAX_OPS = 1_000_000


def frozen_stages(stages: int, frozen=None, fraction=None) -> tuple:
    """The frozen stages a ``frozen`` or ``fraction`` choice names.

    Parameters
    ----------
    stages : int
        The schedule's stage count S.
    frozen : int or iterable of int, optional
        Stage indices in 0..S-1.
    fraction : float, optional
        Share of the model to freeze from its input side (Egeria and
        AutoFreeze freeze front layers first): stages ``0..k-1`` with
        ``k = floor(fraction * S)``, whole stages only. In [0, 1).

    Returns
    -------
    tuple of int
        Sorted distinct stages (may be empty: a fraction below 1/S freezes
        no whole stage).

    Raises
    ------
    ValueError
        If both or neither are given, a stage is out of range or not an int,
        the fraction is not in [0, 1), or every stage would be frozen.
    """
    if (frozen is None) == (fraction is None):
        raise InputError("give one of 'frozen' (stage indices) or 'fraction' (share of the "
                         "model frozen from its input side)")
    if fraction is not None:
        if isinstance(fraction, bool) or not isinstance(fraction, (int, float, np.integer,
                                                                   np.floating)):
            raise InputError(f"'fraction' must be a number in [0, 1) (got {fraction!r})")
        if not 0 <= float(fraction) < 1:
            raise InputError(f"'fraction' must be in [0, 1): freezing the whole model leaves "
                             f"nothing to train (got {fraction!r})")
        k = int(np.floor(float(fraction) * stages + 1e-9))
        return tuple(range(k))
    if isinstance(frozen, (int, np.integer)) and not isinstance(frozen, bool):
        frozen = [frozen]
    if isinstance(frozen, (str, bytes)) or not isinstance(frozen, Iterable):
        raise InputError(f"'frozen' must be a stage int or an iterable of them (got {frozen!r:.60})")
    out = set()
    for s in frozen:
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer)) \
                or not 0 <= s < stages:
            raise InputError(f"'frozen' entries must be stage ints in 0..{stages - 1} (got {s!r})")
        out.add(int(s))
    if len(out) == stages:
        raise InputError(f"'frozen' names every stage (0..{stages - 1}): nothing would train; "
                         f"leave at least one stage trainable")
    return tuple(sorted(out))


def freeze(schedule: Schedule, frozen=None, fraction=None, adapt: bool = False, costs=None,
           name: str | None = None) -> Schedule:
    """Freeze some stages of a schedule: drop the backward work they skip.

    A frozen stage loses its W ops and its fused BW ops become B ops (the
    input gradient the stages below still need). Frozen stages below the
    lowest trainable stage lose every backward op (and any R, O or L):
    they run forwards only. All-reduces of frozen replicated stages go
    too (no gradient). Each device's program keeps its order, compacted;
    the simulator then runs every op as soon as its inputs and its device
    allow, so the time freed is used by the ops behind it.

    Parameters
    ----------
    schedule : Schedule
        A valid schedule (any family; one that is already frozen gets the
        union of both frozen sets).
    frozen : int or iterable of int, optional
        Stages to freeze (see ``pipecore.schedules.freeze.frozen_stages``).
    fraction : float, optional
        Freeze stages ``0..floor(fraction * S) - 1`` instead.
    adapt : bool, default False
        Also reorder each device's program by a list-scheduling pass with
        ``costs``: a device whose next op waits may run a later op of its
        program that is ready, if its activation stays within the peak the
        plain frozen order reaches on that device. The pass keeps the new
        order only if the simulated makespan does not grow.
    costs : Costs, optional
        The costs ``adapt`` schedules with (default ``Costs()``).
    name : str, optional
        Name of the new schedule (default ``"<name>+frozen"``).

    Returns
    -------
    Schedule
        Validated, with ``frozen`` set and ``params["frozen"]`` recording it.

    Raises
    ------
    ValueError
        For a bad ``frozen`` or ``fraction`` (naming the stage or value and
        the rule), or ``adapt`` on a schedule with overlapped F&B pairs or
        more than ``pipecore.schedules.freeze.ADAPT_MAX_OPS`` ops.
    ScheduleError
        If the input schedule is not valid.
    """
    check_type("schedule", schedule, Schedule, "a pipecore.Schedule")
    st = schedule._info()  # validates
    S = st.stages
    chosen = frozen_stages(S, frozen, fraction)
    every = tuple(sorted(set(chosen) | set(getattr(schedule, "frozen", ()))))
    if len(every) == S:
        raise InputError(f"stages {list(chosen)} with the schedule's frozen stages "
                         f"{list(schedule.frozen)} freeze every stage (0..{S - 1}): leave at "
                         f"least one stage trainable")
    is_frozen = np.zeros(S, dtype=bool)
    is_frozen[list(every)] = True
    lowest = int(np.argmin(is_frozen))
    dev = schedule._column("device")
    slot = schedule._column("slot")
    stage = schedule._column("stage").astype(np.int64)
    mb = schedule._column("microbatch")
    kind = schedule.kind_codes.copy()
    fz = is_frozen[stage]
    dead = stage < lowest
    drop = (fz & ((kind == W) | (kind == AR))) | (dead & (kind != F))
    kind[fz & (kind == BW)] = B
    keep = ~drop
    dev, slot, kind, stage, mb = dev[keep], slot[keep], kind[keep], stage[keep], mb[keep]
    # Slots renumbered 0.. per device (an overlapped pair keeps one slot).
    head = np.ones(dev.size, dtype=bool)
    head[1:] = (dev[1:] != dev[:-1]) | (slot[1:] != slot[:-1])
    unit = np.cumsum(head) - 1
    counts = np.bincount(dev, minlength=schedule.devices)
    starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
    # Rows are sorted by device: each row's device's first unit, repeated.
    first_unit = np.repeat(unit[np.minimum(starts, max(unit.size - 1, 0))], counts)
    new_slot = (unit - first_unit).astype(np.int32)
    params = dict(getattr(schedule, "params", {}) or {})
    params["frozen"] = list(every)
    out = Schedule.from_arrays(dev, new_slot, kind, stage.astype(np.int32), mb,
                               name=name or f"{schedule.name}+frozen", devices=schedule.devices,
                               replicated=schedule.replicated, frozen=every, params=params,
                               offload_to=getattr(schedule, "offload_to", None))
    out = _carry_factors(schedule, out, keep)
    if adapt:
        refuse_factors(schedule, "freeze(adapt=True)'s list-scheduling pass")
        out = _adapt(out, costs)
    return out


def _carry_factors(source, out, rows):
    """``out`` with the per-op work factors of ``source``'s ``rows`` (a mask or indices, in
    ``out``'s row order): a kept op keeps its work, a fused BW turned B its time factor."""
    factors = getattr(source, "factors", None)
    if factors is None:
        return out
    return out.with_factors(*(None if f is None else f[rows] for f in factors))


def _adapt(schedule, costs):
    """The list-scheduling pass of :func:`freeze` (``adapt=True``)."""
    from ..core.simulate import compile_schedule, simulate

    n = schedule.num_ops
    if n > ADAPT_MAX_OPS:
        raise InputError(f"adapt=True reorders at most {ADAPT_MAX_OPS:,} ops in Python (the "
                         f"schedule has {n:,}); use adapt=False")
    st = schedule._info()
    if st.paired.any():
        raise InputError("adapt=True does not reorder overlapped F&B pairs; use adapt=False")
    comp = compile_schedule(schedule, costs)
    before = simulate(schedule, costs)
    cost = comp.stage_cost[comp.op_class, comp.op_stage]
    lat = comp.x_lat if comp.x_dst.size else np.zeros(0)
    # Activation change of each op, with the frozen memory rule.
    act, act_w, ckpt = comp.act, comp.act_w, comp.ckpt
    s_ = comp.op_stage
    k_ = comp.op_kind
    delta = np.zeros(n)
    delta[k_ == F] = act[s_[k_ == F]]
    delta[comp.op_class == 8] = ckpt[s_[comp.op_class == 8]]  # a recomputed F (F_DROP)
    delta[k_ == R] = (act - ckpt)[s_[k_ == R]]
    delta[k_ == B] = -(act - act_w)[s_[k_ == B]]
    delta[k_ == W] = -act_w[s_[k_ == W]]
    delta[k_ == BW] = -act[s_[k_ == BW]]
    if (k_ == O).any() or (k_ == L).any():
        raise InputError("adapt=True does not reorder offloaded schedules (O and L ops); use "
                         "adapt=False")
    limit = np.asarray(before.peak_activation, dtype=np.float64) * (1 + 1e-9) + 1e-12
    p = schedule.devices
    dep, xfer, dev_ptr = st.dep, st.xfer, st.dev_ptr
    # Consumers of each op (to count down their unmet producers).
    n_dep = (dep >= 0).sum(axis=1)
    cons = [[] for _ in range(n)]
    for r, j in zip(*np.nonzero(dep >= 0)):
        cons[int(dep[r, j])].append((int(r), int(j)))
    ready_at = np.zeros(n)  # earliest start from producers met so far
    waiting = n_dep.copy()
    pending = [list(range(int(dev_ptr[d]), int(dev_ptr[d + 1]))) for d in range(p)]
    free_at = np.zeros(p)
    mem = np.zeros(p)
    order = [[] for _ in range(p)]
    events = [(0.0, d) for d in range(p)]  # (time a device looks for work, device)
    heapq.heapify(events)
    finished = 0
    while events and finished < n:
        now, d = heapq.heappop(events)
        if now < free_at[d]:
            continue
        pick = -1
        soonest = np.inf
        for i, r in enumerate(pending[d]):
            if waiting[r] == 0 and mem[d] + delta[r] <= limit[d]:
                if ready_at[r] <= now:
                    pick = i
                    break
                soonest = min(soonest, ready_at[r])
        if pick < 0:
            if soonest < np.inf:
                heapq.heappush(events, (soonest, d))
            continue  # woken again when a producer finishes
        r = pending[d].pop(pick)
        end = now + cost[r]
        free_at[d] = end
        mem[d] += delta[r]
        finished += 1
        order[d].append(r)
        for c, j in cons[r]:
            x = xfer[c, j]
            arrive = end + (lat[x] + comp.x_ser[x] if x >= 0 else 0.0)
            ready_at[c] = max(ready_at[c], arrive)
            waiting[c] -= 1
            if waiting[c] == 0:
                heapq.heappush(events, (max(ready_at[c], free_at[_dev_of(st, c)]), _dev_of(st, c)))
        heapq.heappush(events, (end, d))
    if finished < n:  # the memory cap left a device with nothing it may run
        return schedule
    rows = np.concatenate([np.asarray(o, dtype=np.int64) for o in order])
    dev = schedule._column("device")[rows]
    new_slot = np.concatenate([np.arange(len(o), dtype=np.int32) for o in order])
    adapted = Schedule.from_arrays(dev, new_slot, schedule.kind_codes[rows],
                                   schedule._column("stage")[rows],
                                   schedule._column("microbatch")[rows], name=schedule.name,
                                   devices=p, replicated=schedule.replicated,
                                   frozen=schedule.frozen, offload_to=schedule.offload_to,
                                   params={**schedule.params, "adapt": True})
    adapted = _carry_factors(schedule, adapted, rows)
    after = simulate(adapted, costs)
    return adapted if after.makespan <= before.makespan else schedule


def _dev_of(st, row):
    """The device of op ``row`` (rows are sorted by device)."""
    return int(np.searchsorted(st.dev_ptr, row, side="right") - 1)


def _frozen_split(p, frozen):
    """Per stage whether it is frozen, and the lowest trainable stage."""
    is_frozen = np.zeros(p, dtype=bool)
    is_frozen[list(frozen)] = True
    lowest = int(np.argmin(is_frozen))
    return is_frozen, lowest


def formula_frozen_1f1b(p, m, c, frozen):
    """Makespan and peak activation of 1F1B (one stage per device) with
    ``frozen`` stages, equal stages and no communication.

    Device s runs m forwards of time f and m backwards of time ``bw_s``
    (b + w when it trains, b when frozen, none below the lowest trainable
    stage ``lo``); 1F1B runs ``k_s = min(p - s, m)`` forwards before its
    first backward. Each of these is a path through the schedule's
    dependencies and program order, so the makespan is at least each:

    - through device s >= lo: the first forward up to the last stage
      (p f), the first microbatch's backward down to s (sum over u > s of
      ``bw_u``), device s's program from its first backward on
      (m ``bw_s`` + (m - k_s) f) and the last backward's way down to
      ``lo`` (sum over lo <= u < s of ``bw_u``);
    - the last forward from device 0 up and its backward down to ``lo``:
      (m + p - 1) f + (sum over u >= lo of ``bw_u``).

    With frozen stages only below ``lo`` (the front of the model, as
    Egeria and AutoFreeze freeze) the makespan is their maximum (``exact``;
    checked against the simulation over random p, m and times). A frozen
    stage above ``lo`` can shift the binding path elsewhere (a device
    waits mid-program), so there the maximum is a lower bound and
    ``exact`` is False. With nothing frozen the path through the last
    device gives 1F1B's (m + p - 1)(f + b + w).
    Device s holds min(p - s, m) activations of ``activation`` (trainable),
    ``activation - activation_w`` (frozen) or none (below ``lo``).

    Parameters
    ----------
    p, m : int
        Devices (= stages) and microbatches.
    c : Costs
        Scalar costs.
    frozen : iterable of int
        Frozen stages.

    Returns
    -------
    dict
        ``makespan`` (a lower bound where ``exact`` is False),
        ``peak_activation`` (per device, in the unit of ``c.activation``),
        ``exact``.
    """
    is_frozen, lo = _frozen_split(p, frozen)
    f, b, w = float(c.f), float(c.b), float(c.w)
    bw = float(c.bw) if c.bw is not None else b + w
    back = np.where(is_frozen, b, bw)
    back[:lo] = 0.0
    s = np.arange(p)
    warm = np.minimum(p - s, m)
    above = np.array([np.sum(back[u + 1:]) for u in range(p)])
    below = np.array([np.sum(back[lo:u]) for u in range(p)])
    paths = p * f + above + m * back + (m - warm) * f + below
    makespan = max(float(paths[lo:].max()), (m + p - 1) * f + float(back.sum()))
    act = np.where(is_frozen, float(c.activation) - float(c.activation_w), float(c.activation))
    act[:lo] = 0.0
    return _with_busy({"makespan": makespan, "peak_activation": warm * act,
                       "exact": not bool(np.any(is_frozen[lo:]))}, m * (f + back), lo * f)


def formula_frozen_zb_h1(p, m, c, frozen):
    """Makespan and peak activation of ZB-H1 with ``frozen`` stages, equal
    stages and no communication; exact when ``m >= p`` and ``w <= f <= b``
    (checked against the simulation over random frozen sets; with f > b
    freezing top stages can gain time this formula does not count).

    Freezing removes W ops, which ZB-H1 already keeps off its critical
    path; what changes the makespan is the pipeline that still trains.
    Below the lowest trainable stage ``lo`` the devices run forwards alone,
    so the trainable part is a ZB-H1 over ``p - lo`` devices whose first
    forward starts at ``lo f``; a frozen stage at or above ``lo`` keeps its
    B, so the first microbatch's round trip is unchanged, and device ``lo``
    (trainable) keeps its m (f + b + w) of work::

        makespan = lo f + m (f + b + w) + (p - lo - 1) max(f, f + b - w)

    ZB-H1's makespan (:func:`pipecore.schedules.zerobubble.formula_zb_h1`,
    bubble (p' - 1)(T_F + T_B - T_W) of the ZB paper, section 3.1, where
    it is above (p' - 1) T_F) over p' = p - lo devices, shifted by lo f.

    Peak activation: a trainable device keeps ZB-H1's (its warm-up and W
    lag do not change); a frozen one holds ``min(p - s, m)(M - M_W)`` (its
    F keeps what B needs and no W waits); below ``lo`` none.

    Parameters
    ----------
    p, m : int
        Devices (= stages) and microbatches.
    c : Costs
        Scalar costs.
    frozen : iterable of int
        Frozen stages.

    Returns
    -------
    dict
        ``makespan``, ``peak_activation``, ``exact``.
    """
    is_frozen, lo = _frozen_split(p, frozen)
    f, b, w = float(c.f), float(c.b), float(c.w)
    q = p - lo
    makespan = lo * f + m * (f + b + w) + (q - 1) * max(f, f + b - w)
    s = np.arange(p)
    peak = _split_peak(p, m, p - s, s, c)
    peak = np.where(is_frozen, np.minimum(p - s, m) * (float(c.activation) - float(c.activation_w)),
                    peak)
    peak[:lo] = 0.0
    work = np.where(is_frozen, m * (f + b), m * (f + b + w))
    work[:lo] = m * f
    return _with_busy({"makespan": float(makespan), "peak_activation": peak,
                       "exact": bool(m >= p and w <= f <= b)}, work, lo * f)


def _with_busy(out, work, start):
    """Add the busy-time keys :func:`pipecore.formula` reads: ``busy_mean``
    and ``busy_max`` (per-device work) and ``bubble_time``: the longest
    per-device span, the lowest trainable device's (it starts when the
    first forward reaches it, at ``start``, and ends the run), less the
    busiest device's work."""
    out["busy_mean"] = float(np.mean(work))
    out["busy_max"] = float(np.max(work))
    out["bubble_time"] = out["makespan"] - start - out["busy_max"]
    return out


#: The families with a frozen closed form, by registry name.
FROZEN_FORMULAS = {"1f1b": formula_frozen_1f1b, "zb-h1": formula_frozen_zb_h1}


def frozen_formula(name, p, m, v, c, frozen):
    """The closed form of family ``name`` with ``frozen`` stages.

    Parameters
    ----------
    name : str
        Registry name of the family the schedule was built from.
    p, m, v : int
        Devices, microbatches, chunks.
    c : Costs
        Scalar costs.
    frozen : iterable of int
        Frozen stages.

    Returns
    -------
    dict
        As the formula's, plus ``busy_mean`` and ``busy_max``.

    Raises
    ------
    ValueError
        If the family has no frozen closed form (naming those that have).
    """
    if name not in FROZEN_FORMULAS or v != 1:
        raise InputError(f"no closed form for '{name}' with frozen stages (frozen closed forms: "
                         f"{', '.join(sorted(FROZEN_FORMULAS))}, one stage per device)")
    return FROZEN_FORMULAS[name](p, m, c, frozen)


registry._FREEZE[0] = freeze  # build(..., frozen=...)

"""Joint search over compositions: placements x order policies x caps x W rules.

:func:`explore` times every composition of its space with the construction
kernel of :func:`pipecore.compose` switched to timing mode (the same start,
finish, link and memory rules as :func:`pipecore.simulate`, tested equal),
simulates the best few that fit in full, polishes them with local search,
and compares them with :func:`pipecore.tune`'s winner, so it never returns
a slower schedule than tune.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..analysis.model import Hardware, Model
from ..core.costs import SMALLEST_NORMAL, Costs, Network, fits
from ..core.ops import InputError, check_int
from ..core.progress import Progress, enabled
from ..core.result import bubble_rate, bubble_ratio
from ..core.schedule import ScheduleError
from ..core.simulate import simulate, validate
from ..schedules import compose as _compose
from ..schedules.recompute import recompute as _recompute
from .partition import _bottleneck_dp, _Search, uniform_split
from .space import Composition, default_space, space_size  # noqa: F401 (explore's names)
from .tune import Tuned, TuneError, _Candidate, _polish, _recompute_candidates, _score, tune

__all__ = ["explore", "default_space", "space_size", "Composition"]


def explore(devices: int, microbatches: int, costs: Costs | Model | None = None,
            memory_limit: float | None = None, network: Network | None = None, *,
            hardware: Hardware | None = None, space=None, top: int = 3,
            include_tune: bool = True, polish: bool = True, recompute: bool = True,
            split_evals: int = 300, progress=None) -> Tuned:
    """The fastest composed schedule under a memory limit, searched jointly.

    Every composition of ``space`` (``pipecore.search.explore.default_space`` by default: about
    10,000 at p = 8) is built and timed in one pass of the construction
    kernel with these costs and network (the same numbers as
    :func:`pipecore.simulate`; a placement of two pipelines, whose replicas
    all-reduce, is built and simulated); the ``top`` fastest that fit are simulated
    in full and polished with local search like :func:`pipecore.tune`'s
    best; tune's own winner competes too (``include_tune``), so the result
    is never slower than tune's.

    Given a :class:`pipecore.Model`, the partition is searched too: every
    composition is timed with two splits of the layers over its stages (the
    uniform split and the split that balances the stages' F+B+W times, as
    :func:`pipecore.partition` starts from), each with its own costs and
    network from ``hardware``; then the split of each of the ``top``
    fastest compositions that fit, and of those over the limit picked for
    recompute (see ``recompute``), is improved by
    :func:`pipecore.partition`'s local search (layers moved between stages,
    fitting the limit first, then time). Tune runs with the balanced split
    over ``devices`` stages.

    Parameters
    ----------
    devices, microbatches : int
        p and m.
    costs : Costs or Model, optional
        Times and memory, scalars per device share or per-stage vectors
        (compositions whose stage count the vectors do not fit are left out,
        each with a note); or a model whose layers are split over the
        stages. Default ``Costs()``.
    memory_limit : float, optional
        Per-device limit on peak activation plus weights (as tune), in the
        units of the costs: bytes for a Model, whose default is
        ``hardware.hbm_bytes``.
    network : Network, optional
        Links (default: transfers take ``costs.comm``). Not with a Model:
        its network comes from ``hardware`` and each split's transfer bytes.
    hardware : Hardware, optional
        With a Model: the hardware its times and network come from
        (default ``Hardware.preset("h100-nvlink")``).
    space : sequence of Composition, optional
        The compositions to try (default ``default_space(devices, microbatches)``, with the
        overlapped F&B units when ``costs.fb_factor`` < 1).
    top : int, default 3
        Compositions simulated in full and polished.
    include_tune : bool, default True
        Run :func:`pipecore.tune` too and keep its winner if faster.
    polish : bool, default True
        Local search on the best compositions (and tune's own polish).
    recompute : bool, default True
        Under a limit, every composition that does not fit is timed again
        with every stage's activations recomputed (an R op of ``costs.r``
        before each backward, the F keeping ``costs.checkpoint``, as
        :func:`pipecore.recompute` does; rows of source
        ``"screened+recompute"``). Then the fewest stages on each device
        over the limit are recomputed, as tune does with its families, in
        the ``top`` fastest compositions that fit with every stage
        recomputed, the ``top`` fastest of those without recompute, the
        ``top`` fastest that do not fit and the fastest needing at most 1.1,
        1.25, 1.5, 2 and 3 times the limit.
    split_evals : int, default 300
        With a Model: the most splits the local search simulates for each
        composition it improves.
    progress : bool, optional
        Progress bar over the compositions (default: when stderr is a terminal).

    Returns
    -------
    Tuned
        As :func:`pipecore.tune`: ``.schedule``, ``.result``, ``.label``,
        ``.candidates`` (every composition tried, with its makespan, memory,
        whether it fits and a note for those that deadlocked or were left
        out, then tune's candidates) and ``.report()``. With a Model,
        ``.costs`` and ``.network`` are the winner's split's, the
        candidates' ``layers`` column holds each one's layers per stage,
        and the winner's ``schedule.params["layers"]`` too.

    Raises
    ------
    TuneError
        When nothing fits the limit (``smallest_limit`` says what would),
        or no composition could be timed (the message gives the rows'
        reasons; ``smallest_limit`` is then NaN).
    ValueError
        For bad arguments: an empty ``space``, per-stage cost vectors whose
        length is no composition's stage count, a model with fewer layers
        than the fewest stages, or more ops than an op table holds in even
        the smallest composition.
    MemoryError
        (:class:`~pipecore.CapacityError`) if the default space or the
        smallest composition's timing would not fit in the memory
        available (checked before anything is enumerated).
    """
    t0 = time.perf_counter()
    p = check_int("devices", devices, minimum=1)
    m = check_int("microbatches", microbatches, minimum=1)
    top = check_int("top", top, minimum=1)
    split_evals = check_int("split_evals", split_evals, minimum=1)
    model = None
    if isinstance(costs, Model):
        model = costs
        hardware = Hardware.preset("h100-nvlink") if hardware is None else hardware
        if not isinstance(hardware, Hardware):
            raise InputError(f"'hardware' must be a pipecore.Hardware (got "
                             f"{type(hardware).__name__})")
        if network is not None:
            raise InputError("with a Model, leave 'network' unset: each split's network comes "
                             "from 'hardware' and the bytes its stages send")
        if memory_limit is None:
            memory_limit = hardware.hbm_bytes
        costs = None
    else:
        if hardware is not None:
            raise InputError("'hardware' is for a Model; with Costs, pass times in the costs "
                             "and links as 'network'")
        costs = Costs() if costs is None else costs
        if not isinstance(costs, Costs):
            raise InputError(f"'costs' must be a pipecore.Costs or pipecore.Model (got "
                             f"{type(costs).__name__})")
        if costs.offload is not None:
            raise InputError("explore does not offload activations: leave Costs.offload unset "
                             "(pipecore.tune tries offload)")
    limit = math.inf if memory_limit is None else memory_limit
    if isinstance(limit, bool) or not isinstance(limit, (int, float, np.integer, np.floating)) \
            or math.isnan(limit) or limit <= 0:
        raise InputError(f"'memory_limit' must be a number > 0 (got {memory_limit!r})")
    limit = float(limit)
    # Every composition on p devices has p stages or more: refuse a shape none
    # could be built in before the space is enumerated.
    _compose._check_ops(f"explore(devices={p}, microbatches={m}), whose every composition has "
                        f"at least {p} stage{'s' if p > 1 else ''},", p, p, m, False, timed=True)
    if space is None:
        # Overlapped units gain only when a unit takes less than its two ops.
        space = default_space(p, m, overlap=costs is not None and costs.fb_factor < 1)
    else:
        space = list(space)
        if not space:
            raise InputError("'space' is empty: explore has no composition to try (leave it "
                             "unset for default_space(devices, microbatches))")
    for c in space:
        if not isinstance(c, Composition):
            raise InputError(f"'space' holds {type(c).__name__}; give pipecore.search."
                             f"explore.Composition values")
        if c.placement.devices != p:
            raise InputError(f"a composition of 'space' places on {c.placement.devices} "
                             f"devices, not devices={p}: {c.label}")
    _check_fits_some(space, model, costs, network, p)
    splits = _Splits(model, hardware, costs, network)
    screen_rec = recompute and not math.isinf(limit)
    rows = _screen(space, m, splits, limit, progress, screen_rec)
    timed = [r for r in rows if r["makespan"] is not None]
    ranked = sorted((r for r in timed if r["fits"]), key=lambda r: (r["makespan"], r["memory"]))
    # The fastest that do not fit, for recompute (as tune does with its families).
    over = sorted((r for r in timed if not r["fits"] and not r["recompute"]),
                  key=lambda r: (r["makespan"], r["memory"]))
    cands = [_simulated(r, m) for r in _distinct(ranked, top)]
    picks = _over_picks(over, limit, top) if not math.isinf(limit) else []
    if screen_rec:
        # Recompute of the fewest stages (below) fits where every stage's does,
        # and mostly takes between the two timings: so the fastest that fit with
        # every stage recomputed, and of those the fastest without recompute.
        saved = [r for r in ranked if r["recompute"]]
        seen = {id(r) for r in picks}
        for r in _distinct(saved, top) + _distinct(
                sorted((r["base"] for r in saved), key=lambda r: (r["makespan"], r["memory"])),
                top):
            base = r["base"] if r["recompute"] else r
            if id(base) not in seen:
                seen.add(id(base))
                picks.append(base)
    tried = [_simulated(r, m) for r in picks]
    if model is not None:
        cands += _resplit(cands + tried, splits, limit, split_evals)
    if recompute and tried:
        seen = {id(c) for c in tried}
        tried += [c for c in cands if not fits(c.memory, limit) and id(c) not in seen]
        seen = {id(c) for c in cands}
        cands += [c for c in tried if id(c) not in seen]
        for setting, group in _by_setting(tried):
            cands += [_Placed(**vars(c), setting=setting) for c in _recompute_candidates(
                group, setting.costs, limit, setting.network, "makespan", len(group))]
    fitting = [c for c in cands if fits(c.memory, limit)]
    if polish and fitting:
        best = _to_polish(fitting, top)
        for setting, group in _by_setting(best):
            found = _polish(group, [], setting.costs, limit, setting.network, "makespan")
            new = [_Placed(**vars(c), setting=setting) for c in found]
            cands += new
            fitting += new
    tuned, tune_floor, tune_setting = None, None, splits.linear(p)
    if isinstance(tune_setting, str):  # a model with fewer layers than devices
        tune_setting = None
    if include_tune and tune_setting is not None:
        try:
            tuned = tune(p, m, tune_setting.costs, None if math.isinf(limit) else limit,
                         tune_setting.network, polish=polish, recompute=recompute,
                         progress=False)
        except TuneError as exc:
            tuned, tune_floor = None, exc.smallest_limit
    table = _candidates_table(rows, cands, tuned, limit, tune_setting)
    options = [(c.result.makespan, c.memory, 1, c.label, c.schedule, c.result, c.setting)
               for c in fitting]
    if tuned is not None:
        mem = float((tuned.result.peak_activation + tuned.result.static_memory).max())
        options.append((tuned.result.makespan, mem, 0, f"tune: {tuned.label}", tuned.schedule,
                        tuned.result, tune_setting))
    if not options:
        timed = [r for r in table.to_pylist() if r["memory"] is not None]
        least = min(timed, key=lambda r: (r["memory"], r["makespan"]), default=None)
        need, label = (math.nan, None) if least is None else (least["memory"], least["candidate"])
        if tune_floor is not None and not tune_floor >= need:  # tune's floor, generated for it
            need, label = tune_floor, "tune's least"
        if label is None:  # nothing was timed: say why, not "least memory nan"
            raise TuneError(_why_none_timed(rows, include_tune and tune_setting is not None),
                            need, table)
        raise TuneError(f"nothing fits memory_limit={limit:g}: the least memory a candidate "
                        f"needs is {need:g} ({label}); a limit of at least {need:g} gives a "
                        "schedule", need, table)
    # Ties go to tune's winner (a named family), then to less memory.
    makespan, _mem, _src, label, sched, res, setting = min(
        options, key=lambda o: (_score(o[5], "makespan"), o[2], o[1], o[3]))
    if setting.layers is not None:
        sched.params["layers"] = list(setting.layers)
    validate(sched)
    units = ("s", "bytes") if model is not None else ("cost units", "M")
    return Tuned(sched, res, label, table, limit, setting.costs, setting.network,
                 time.perf_counter() - t0, "makespan", *units)


def _check_fits_some(space, model, costs, network, p):
    """Refuse, before anything is timed, a model with fewer layers than the
    fewest stages of the space, or per-stage vectors whose length is no
    composition's stage count (each composition they do not fit would be
    left out, and then all of them would be)."""
    counts = sorted({c.placement.stages for c in space})
    shown = ", ".join(map(str, counts[:12])) + (" ..." if len(counts) > 12 else "")
    if model is not None:
        if len(model) < counts[0]:
            raise InputError(
                f"the model has {len(model)} layers, but every composition on devices={p} has at "
                f"least {counts[0]} stages, and every stage needs at least one layer: use at most "
                f"{len(model)} devices or a model with more layers")
        return
    vectors = [(type(obj).__name__, f.name, getattr(obj, f.name))
               for obj in (costs, network) if obj is not None
               for f in dataclasses.fields(obj) if np.ndim(getattr(obj, f.name)) == 1]
    lengths = sorted({len(v) for _, _, v in vectors})
    for owner, name, value in vectors:
        if len(value) not in counts:
            raise InputError(
                f"{owner} '{name}' has {len(value)} entries (one per stage), but the "
                f"compositions on devices={p} have {shown} stages: give it one of those "
                f"lengths, or a scalar (a value per device share)")
    if len(lengths) > 1:
        raise InputError(
            "per-stage vectors of different lengths ("
            + ", ".join(f"{o} '{n}' has {len(v)}" for o, n, v in vectors)
            + "): no composition has two stage counts; give them one length")


def _why_none_timed(rows, tuned):
    """Why no composition of the space could be timed: its rows' notes."""
    notes = {}
    for r in rows:
        notes.setdefault(r["note"] or "not timed", []).append(r["candidate"])
    parts = [f"{len(c)} of {len(rows)} compositions ({c[0]}{', ...' if len(c) > 1 else ''}): "
             f"{why}" for why, c in sorted(notes.items(), key=lambda kv: -len(kv[1]))[:3]]
    tail = "; tune found nothing either" if tuned else ""
    return f"no composition of the space could be timed: {'; '.join(parts)}{tail}"


@dataclass(frozen=True, eq=False)
class _Setting:
    """Costs and network a composition is timed with; with a Model, from a split."""

    tag: str
    layers: tuple | None
    costs: Costs
    network: Network | None


@dataclass
class _Placed(_Candidate):
    """A candidate with the setting (split, costs, network) it was simulated with."""

    setting: _Setting | None = None


class _Splits:
    """The settings a placement is timed with: the given costs, or two splits of
    a Model's layers over its stages (cached per stage count)."""

    def __init__(self, model, hardware, costs, network):
        self.model, self.hw = model, hardware
        self.given = _Setting("", None, costs, network)
        self.times = None if model is None else model.layer_times(hardware)
        self.cache = {}

    def for_stages(self, S):
        """Settings for S stages, or the reason there is none."""
        if self.model is None:
            return [self.given]
        if S not in self.cache:
            if len(self.model) < S:
                self.cache[S] = (f"the model has {len(self.model)} layers, fewer than the "
                                 f"{S} stages of this placement")
            else:
                balanced = _bottleneck_dp(self.times.sum(axis=1), S)
                uniform = uniform_split(self.model, S)
                found = {balanced: "balanced split", uniform: "uniform split"}
                self.cache[S] = [self.setting(layers, tag) for layers, tag in found.items()]
        return self.cache[S]

    def setting(self, layers, tag):
        layers = tuple(int(c) for c in layers)
        return _Setting(tag, layers, self.model.costs(layers, self.hw, times=self.times),
                        self.model.network(layers, self.hw))

    def linear(self, p):
        """The setting tune runs with: the given costs, or the balanced split over p."""
        found = self.for_stages(p)
        return found if isinstance(found, str) else found[0]


def _by_setting(cands):
    """Candidates grouped by the setting they were simulated with."""
    groups = {}
    for c in cands:
        groups.setdefault(id(c.setting), (c.setting, []))[1].append(c)
    return list(groups.values())


def _resplit(cands, splits, limit, evals):
    """The partition's local search on each candidate's split (memory excess
    first, then makespan); a candidate for each split that improves."""
    out = []
    for c in cands:
        setting = c.setting
        search = _Search(splits.model, splits.hw, c.schedule, limit)
        start = setting.layers
        best = search.local(start, max_evals=evals)
        if best == start or search.key(best) >= search.key(start):
            continue
        new = splits.setting(best, "refined split")
        res = simulate(c.schedule, new.costs, new.network)
        label = c.label.rsplit(" [", 1)[0] + " [refined split]"
        out.append(_Placed(label=label, source="resplit", family=c.family, chunks=c.chunks,
                           options={}, schedule=c.schedule, result=res, setting=new))
    return out


def _simulated(row, m):
    """A screened composition built and simulated in full, as a tune candidate."""
    comp, setting = row["composition"], row["setting"]
    sched = _compose.compose(placement=comp.placement, microbatches=m, order=comp.order,
                             split_backward=comp.split_backward, w=comp.w, name=comp.label)
    if row["recompute"]:
        sched = _recompute(sched, name=f"{comp.label} +recompute")
    return _Placed(label=row["candidate"], source="composed", family="composed",
                   chunks=comp.placement.stages // comp.placement.devices, options={},
                   schedule=sched, result=simulate(sched, setting.costs, setting.network),
                   setting=setting)


# Over-limit compositions given recompute (and a split search) are picked
# below each of these multiples of the limit too, not only the fastest
# overall: the fastest need the most memory, often more than recompute saves.
_OVER_LADDER = (1.1, 1.25, 1.5, 2.0, 3.0)


def _over_picks(over, limit, n):
    """The n fastest over-limit rows (distinct), then the fastest below each
    multiple of the limit in _OVER_LADDER not picked yet."""
    picks = _distinct(over, n)
    seen = {_same(r["makespan"], r["memory"]) for r in picks}
    for factor in _OVER_LADDER:
        for r in over:
            if r["memory"] <= factor * limit:
                if _same(r["makespan"], r["memory"]) not in seen:
                    seen.add(_same(r["makespan"], r["memory"]))
                    picks.append(r)
                break
    return picks


def _to_polish(fitting, n):
    """The n fastest candidates that are neither the same schedule as a
    faster one (equal makespan and memory) nor a slower variant (another
    recompute, split) of a faster one's composition: many compositions give
    the same schedule, and a slower variant rarely polishes further."""
    out, keys, comps = [], set(), set()
    for c in sorted(fitting, key=lambda c: (_score(c.result, "makespan"), c.memory)):
        key, comp = _same(c.result.makespan, c.memory), c.label.split(" +")[0].split(" [")[0]
        if key not in keys and comp not in comps:
            out.append(c)
        keys.add(key)
        comps.add(comp)
        if len(out) == n:
            break
    return out


def _same(makespan, memory):
    """A key equal for equal (makespan, memory) up to rounding: the same
    schedule's times can differ in the last bit between orders of summing."""
    return float(f"{makespan:.12g}"), float(f"{memory:.12g}")


def _distinct(rows, n):
    """The first n rows with distinct (makespan, memory): many compositions
    give the same schedule (a W rule without W to place, a cap never reached)."""
    out, seen = [], set()
    for r in rows:
        key = _same(r["makespan"], r["memory"])
        if key not in seen:
            seen.add(key)
            out.append(r)
        if len(out) == n:
            break
    return out


def _screen(space, m, splits, limit, progress, recompute):
    """Time every composition in each of its settings; one row each (makespan
    None when it could not be timed), and with ``recompute`` a second row for
    each that does not fit, timed with every stage recomputed."""
    bar = Progress(len(space), enabled(progress), unit="compositions")
    rows = []
    # placement -> [(setting, Timing, weights per device)], or the reason it was left out
    timings = {}
    for i, comp in enumerate(space):
        pl = comp.placement
        if pl not in timings:
            timings[pl] = _timings(pl, m, splits, recompute)
        found = timings[pl]
        if isinstance(found, str):
            rows.append(_row(comp, None, note=f"left out: {found}"))
        else:
            for setting, base, static, base_rec in found:
                row = _timed(comp, setting, base, static, m, limit)
                rows.append(row)
                if base_rec is not None and row["fits"] is False:
                    rec = _timed(comp, setting, base_rec, static, m, limit, base_row=row)
                    rows.append(rec)
        bar.update(1, final=i == len(space) - 1)
    return rows


# In place of a Timing: a placement of two pipelines is built and simulated
# in full (the construction's timing has no all-reduce for its replicas).
_SIMULATE = "simulate"


def _timings(pl, m, splits, recompute):
    """Per setting of the placement: the setting, its Timing, the weights on
    each device, and the Timing with every stage recomputed (or None); for
    two pipelines, _SIMULATE in place of both Timings."""
    settings = splits.for_stages(pl.stages)
    if isinstance(settings, str):
        return settings
    out = []
    every = np.ones(pl.stages, dtype=bool)
    try:
        for setting in settings:
            if pl.chains > 1:
                setting.costs.stage_arrays(pl.stages, pl.devices)  # do the costs fit?
                out.append((setting, _SIMULATE, None, _SIMULATE if recompute else None))
                continue
            static = np.zeros(pl.devices)
            np.add.at(static, pl.as_array(),
                      setting.costs.stage_arrays(pl.stages, pl.devices)["weights"])
            rec = _compose.timing(pl, m, setting.costs, setting.network, recompute=every) \
                if recompute else None
            out.append((setting, _compose.timing(pl, m, setting.costs, setting.network), static,
                        rec))
    except ValueError as exc:
        return str(exc).splitlines()[0]
    return out


def _row(comp, setting, base=None, **kw):
    label = comp.label if base is None else f"{comp.label} +recompute"
    if setting is not None and setting.tag:
        label = f"{label} [{setting.tag}]"
    row = {"candidate": label, "composition": comp, "setting": setting, "makespan": None,
           "memory": None, "span": None, "bubble_ratio": None, "bubble_rate": None,
           "peak_activation": None, "fits": None, "note": "", "recompute": base is not None,
           "base": base}
    row.update(kw)
    return row


def _timed(comp, setting, base, static, m, limit, base_row=None):
    """One composition timed in one setting by the construction kernel (with
    ``base_row``, the row of the same composition without recompute: this
    timing recomputes every stage)."""
    row = _row(comp, setting, base_row,
               note="" if base_row is None else "every stage recomputed")
    pl = comp.placement
    if isinstance(base, str):
        return _simulated_row(row, comp, setting, m, limit)
    tm = _compose.fresh(base)
    if comp.order.policy == "rotate":
        split, w_rule = comp.split_backward, None
    else:
        split, w_rule = _compose._split_and_w(comp.split_backward, comp.w)
    try:
        _compose._run(pl, m, comp.order, split, w_rule, tm)
    except ScheduleError as exc:
        row["note"] = "deadlock: " + str(exc).splitlines()[0].split(": ", 1)[-1][:120]
        return row
    memory = float((tm.peak + static).max())
    makespan = float(tm.end[0])
    with np.errstate(invalid="ignore"):  # inf - inf where times overflowed
        span = float((tm.free - tm.begin).max())
    if not (math.isfinite(makespan) and math.isfinite(span)):
        row["note"] = (f"times overflow float64 (makespan {makespan:g}): an op or transfer "
                       f"time or their sum exceeds 1.8e308; express the costs in a larger unit")
        return row
    if 0 < makespan < SMALLEST_NORMAL:  # as simulate refuses it
        row["note"] = (f"times underflow float64 (makespan {makespan:g}, below 2.2e-308: too "
                       f"few digits for accurate times); express the costs in a smaller unit")
        return row
    # As Result.bubble_ratio and Result.bubble_rate (every device runs ops here).
    row.update(makespan=makespan, memory=memory, span=span,
               bubble_ratio=float(bubble_ratio(float(tm.busy.sum()), pl.devices, makespan)),
               bubble_rate=float(bubble_rate(span, float(tm.busy.max()))),
               peak_activation=float(tm.peak.max()), fits=bool(fits(memory, limit)))
    return row


def _simulated_row(row, comp, setting, m, limit):
    """``row`` filled by building the composition and simulating it in full
    (with every stage recomputed when the row is a recompute row)."""
    try:
        sched = _compose.compose(placement=comp.placement, microbatches=m, order=comp.order,
                                 split_backward=comp.split_backward, w=comp.w)
    except ScheduleError as exc:
        row["note"] = "deadlock: " + str(exc).splitlines()[0].split(": ", 1)[-1][:120]
        return row
    if row["recompute"]:
        sched = _recompute(sched)
    res = simulate(sched, setting.costs, setting.network)
    span = float(res.span.max())
    row.update(makespan=float(res.makespan),
               memory=float((res.peak_activation + res.static_memory).max()), span=span,
               bubble_ratio=float(res.bubble_ratio), bubble_rate=float(res.bubble_rate),
               peak_activation=float(res.peak_activation.max()))
    row["fits"] = bool(fits(row["memory"], limit))
    return row


_SCHEMA = pa.schema([("candidate", pa.string()), ("source", pa.string()),
                     ("family", pa.string()), ("chunks", pa.int64()),
                     ("makespan", pa.float64()), ("span", pa.float64()),
                     ("bubble_rate", pa.float64()), ("bubble_ratio", pa.float64()),
                     ("peak_activation", pa.float64()), ("memory", pa.float64()),
                     ("fits", pa.bool_()), ("note", pa.string()),
                     ("layers", pa.list_(pa.int64()))])


def _candidates_table(rows, cands, tuned, limit, tune_setting):
    """Every composition screened, the ones simulated in full, then tune's candidates."""
    cols = {k: [] for k in ("candidate", "source", "family", "chunks", "makespan", "span",
                            "bubble_rate", "bubble_ratio", "peak_activation", "memory", "fits",
                            "note", "layers")}

    def layers(setting):
        return None if setting is None or setting.layers is None else list(setting.layers)

    def add(**kw):
        for k in cols:
            cols[k].append(kw.get(k))

    for r in rows:
        comp = r["composition"]
        add(candidate=r["candidate"], source="screened+recompute" if r["recompute"] else "screened",
            family="composed",
            chunks=comp.placement.stages // comp.placement.devices, makespan=r["makespan"],
            span=r["span"], bubble_rate=r["bubble_rate"], bubble_ratio=r["bubble_ratio"],
            peak_activation=r["peak_activation"], memory=r["memory"], fits=r["fits"],
            note=r["note"], layers=layers(r["setting"]))
    for c in cands:
        if c.source == "composed":  # already a screened row, with the same numbers
            continue
        res = c.result
        add(candidate=c.label, source=c.source, family=c.family, chunks=c.chunks,
            makespan=float(res.makespan), span=_score(res, "span"),
            bubble_rate=float(res.bubble_rate), bubble_ratio=float(res.bubble_ratio),
            peak_activation=float(res.peak_activation.max()), memory=c.memory,
            fits=bool(fits(c.memory, limit)), note="", layers=layers(getattr(c, "setting", None)))
    table = pa.table(cols, schema=_SCHEMA)
    if tuned is not None:
        tune_rows = tuned.candidates.to_pylist()
        for r in tune_rows:
            r["source"] = f"tune/{r['source']}"
            r["layers"] = layers(tune_setting)
        table = pa.concat_tables([table, pa.Table.from_pylist(tune_rows, schema=table.schema)])
    return table

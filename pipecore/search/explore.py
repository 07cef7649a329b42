"""Joint search over compositions: placements x order policies x caps x W rules.

:func:`explore` times every composition of its space with the construction
kernel of :func:`pipecore.compose` switched to timing mode (the same start,
finish, link and memory rules as :func:`pipecore.simulate`, tested equal),
simulates the best few that fit in full, polishes them with local search,
and compares them with :func:`pipecore.tune`'s winner, so it never returns
a slower schedule than tune.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..core.costs import Costs, Network, fits
from ..core.ops import InputError, check_int
from ..core.progress import Progress, enabled
from ..core.schedule import ScheduleError
from ..core.simulate import simulate, validate
from ..schedules import compose as _compose
from ..schedules import orders as _orders
from ..schedules import placements as _placements
from .tune import Tuned, TuneError, _Candidate, _polish, _recompute_candidates, _score, tune

__all__ = ["explore", "default_space", "Composition"]


@dataclass(frozen=True)
class Composition:
    """One point of the space: what :func:`pipecore.compose` takes.

    Attributes
    ----------
    placement : Placement
    order : Order
    split_backward : bool
    w : str, int, tuple or None
        The W rule (None without split backward, or with the rotate order).
    """

    placement: _placements.Placement
    order: _orders.Order
    split_backward: bool
    w: object

    @property
    def label(self) -> str:
        """str: a short description, e.g. ``v/one_f_one_b(short, inflight=3)/w=bubbles``."""
        pl = self.placement
        where = pl.name if pl.name != "looped" else f"looped{pl.stages // pl.devices}"
        if pl.name == "wave":
            where = f"wave{pl.stages // (2 * pl.devices)}"
        od = self.order
        parts = [od.policy]
        if od.policy == "alternate":
            parts.append(_label_group(od.group) if od.group != "ready" else "ready")
            parts.append(f"warmup={od.warmup}")
            if od.strict:
                parts.append("strict")
        elif od.policy == "greedy":
            parts.append(f"{od.first} first")
        if od.inflight is not None:
            parts.append(f"inflight={od.inflight}")
        w = "fused" if not self.split_backward else ("visit" if self.w is None else
                                                      f"w={_w_text(self.w)}")
        return f"{where}/{' '.join(parts)}/{w}"


def _label_group(group):
    return "group=p" if group is None else f"group={group}"


def _w_text(w):
    return "lag " + ",".join(map(str, w)) if isinstance(w, tuple) else str(w)


def default_space(devices: int, microbatches: int) -> list[Composition]:
    """The compositions :func:`explore` tries by default.

    Placements: linear, looped with 2, 3, 4, 5, 6 and 8 chunks, the V, and
    waves of 2 and 3. Orders: 1F1B (ready streams, warm-up "short" or
    "fill") and greedy (backward or forward first) with no cap or a cap of
    1 to 2p microbatches in flight; the families' strict 1F1B over fixed
    streams (warm-up "fill" is Megatron's depth-first) and breadth-first;
    the rotation with no cap or a cap of 1 to 2p. W: fused, or split with
    W "with" its B, "staggered", "late", in the "bubbles", a uniform lag of
    1 to p, or ZB-H2's lag 2d (the rotation: fused or in its visit).

    Parameters
    ----------
    devices, microbatches : int
        p and m.

    Returns
    -------
    list of Composition

    Raises
    ------
    ValueError
        If devices or microbatches < 1.
    """
    p = check_int("devices", devices, minimum=1)
    check_int("microbatches", microbatches, minimum=1)
    places = [_placements.linear(p)]
    places += [_placements.looped(p, v) for v in (2, 3, 4, 5, 6, 8)]
    places += [_placements.v(p), _placements.wave(p, 2), _placements.wave(p, 3)]
    caps = [None] + list(range(1, 2 * p + 1))
    alternate = [_orders.one_f_one_b(warmup=w, inflight=k) for w in ("short", "fill")
                 for k in caps]
    alternate += [_orders.one_f_one_b(warmup=w, group=None, strict=True)
                  for w in ("short", "fill")]
    alternate += [_orders.breadth_first(), _orders.breadth_first("fifo")]
    alternate += [_orders.greedy(first=f, inflight=k) for f in ("backward", "forward")
                  for k in caps]
    rotations = [_orders.rotate(inflight=k) for k in caps]
    w_rules = ["with", "staggered", "late", "bubbles"] + list(range(1, p + 1))
    w_rules.append(tuple(2 * d for d in range(p)))
    out = []
    for pl in places:
        for od in alternate:
            out.append(Composition(pl, od, False, None))
            out += [Composition(pl, od, True, w) for w in w_rules]
        for od in rotations:
            out += [Composition(pl, od, False, None), Composition(pl, od, True, None)]
    return out


def explore(devices: int, microbatches: int, costs: Costs | None = None,
            memory_limit: float | None = None, network: Network | None = None, *,
            space=None, top: int = 3, include_tune: bool = True, polish: bool = True,
            recompute: bool = True, progress=None) -> Tuned:
    """The fastest composed schedule under a memory limit, searched jointly.

    Every composition of ``space`` (:func:`default_space` by default: about
    10,000 at p = 8) is built and timed in one pass of the construction
    kernel with these costs and network (the same numbers as
    :func:`pipecore.simulate`); the ``top`` fastest that fit are simulated
    in full and polished with local search like :func:`pipecore.tune`'s
    best; tune's own winner competes too (``include_tune``), so the result
    is never slower than tune's.

    Parameters
    ----------
    devices, microbatches : int
        p and m.
    costs : Costs, optional
        Times and memory, scalars per device share or per-stage vectors
        (compositions whose stage count the vectors do not fit are left out,
        each with a note). Default ``Costs()``.
    memory_limit : float, optional
        Per-device limit on peak activation plus weights (as tune).
    network : Network, optional
        Links (default: transfers take ``costs.comm``).
    space : sequence of Composition, optional
        The compositions to try.
    top : int, default 3
        Compositions simulated in full and polished.
    include_tune : bool, default True
        Run :func:`pipecore.tune` too and keep its winner if faster.
    polish : bool, default True
        Local search on the best compositions (and tune's own polish).
    recompute : bool, default True
        Under a limit, also recompute activations (:func:`pipecore.recompute`)
        in the ``top`` fastest compositions that do not fit, stage by stage on
        each device over the limit, as tune does with its families.
    progress : bool, optional
        Progress bar over the compositions (default: when stderr is a terminal).

    Returns
    -------
    Tuned
        As :func:`pipecore.tune`: ``.schedule``, ``.result``, ``.label``,
        ``.candidates`` (every composition tried, with its makespan, memory,
        whether it fits and a note for those that deadlocked or were left
        out, then tune's candidates) and ``.report()``.

    Raises
    ------
    TuneError
        When nothing fits the limit (``smallest_limit`` says what would).
    ValueError
        For bad arguments.
    """
    t0 = time.perf_counter()
    p = check_int("devices", devices, minimum=1)
    m = check_int("microbatches", microbatches, minimum=1)
    top = check_int("top", top, minimum=1)
    costs = Costs() if costs is None else costs
    if not isinstance(costs, Costs):
        raise InputError(f"'costs' must be a pipecore.Costs (got {type(costs).__name__})")
    if costs.offload is not None:
        raise InputError("explore does not offload activations: leave Costs.offload unset "
                         "(pipecore.tune tries offload)")
    limit = math.inf if memory_limit is None else memory_limit
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or math.isnan(limit) \
            or limit <= 0:
        raise InputError(f"'memory_limit' must be a number > 0 (got {memory_limit!r})")
    limit = float(limit)
    space = default_space(p, m) if space is None else list(space)
    for c in space:
        if not isinstance(c, Composition):
            raise InputError(f"'space' holds {type(c).__name__}; give pipecore.search."
                             f"explore.Composition values")
        if c.placement.devices != p:
            raise InputError(f"a composition of 'space' places on {c.placement.devices} "
                             f"devices, not devices={p}: {c.label}")
    rows = _screen(space, m, costs, network, limit, progress)
    timed = [r for r in rows if r["makespan"] is not None]
    ranked = sorted((r for r in timed if r["fits"]), key=lambda r: (r["makespan"], r["memory"]))
    # The fastest that do not fit, for recompute (as tune does with its families).
    over = sorted((r for r in timed if not r["fits"]), key=lambda r: (r["makespan"], r["memory"]))
    cands = [_simulated(r, m, costs, network) for r in _distinct(ranked, top)]
    if recompute and not math.isinf(limit):
        tried = [_simulated(r, m, costs, network) for r in _distinct(over, top)]
        cands += tried + _recompute_candidates(tried, costs, limit, network, "makespan", top)
    fitting = [c for c in cands if fits(c.memory, limit)]
    if polish and fitting:
        fitting += _polish(fitting, cands, costs, limit, network, "makespan")
    tuned = None
    if include_tune:
        try:
            tuned = tune(p, m, costs, None if math.isinf(limit) else limit, network,
                         polish=polish, progress=False)
        except TuneError:
            tuned = None
    table = _candidates_table(rows, cands, tuned, limit)
    options = [(c.result.makespan, c.memory, 1, c.label, c.schedule, c.result) for c in fitting]
    if tuned is not None:
        mem = float((tuned.result.peak_activation + tuned.result.static_memory).max())
        options.append((tuned.result.makespan, mem, 0, f"tune: {tuned.label}", tuned.schedule,
                        tuned.result))
    if not options:
        least = min((r["memory"] for r in rows if r["memory"] is not None), default=math.nan)
        raise TuneError(f"nothing fits memory_limit={limit:g}: the least memory a composition "
                        f"needs is {least:g}", least, table)
    # Ties go to tune's winner (a named family), then to less memory.
    makespan, _mem, _src, label, sched, res = min(
        options, key=lambda o: (_score(o[5], "makespan"), o[2], o[1], o[3]))
    validate(sched)
    return Tuned(sched, res, label, table, limit, costs, network, time.perf_counter() - t0,
                 "makespan")


def _simulated(row, m, costs, network):
    """A screened composition built and simulated in full, as a tune candidate."""
    comp = row["composition"]
    sched = _compose.compose(placement=comp.placement, microbatches=m, order=comp.order,
                             split_backward=comp.split_backward, w=comp.w, name=row["candidate"])
    return _Candidate(label=row["candidate"], source="composed", family="composed",
                      chunks=comp.placement.stages // comp.placement.devices, options={},
                      schedule=sched, result=simulate(sched, costs, network))


def _distinct(rows, n):
    """The first n rows with distinct (makespan, memory): many compositions
    give the same schedule (a W rule without W to place, a cap never reached)."""
    out, seen = [], set()
    for r in rows:
        key = (r["makespan"], r["memory"])
        if key not in seen:
            seen.add(key)
            out.append(r)
        if len(out) == n:
            break
    return out


def _screen(space, m, costs, network, limit, progress):
    """Time every composition; one row each (makespan None when it could not be timed)."""
    bar = Progress(len(space), enabled(progress), unit="compositions")
    rows = []
    timings = {}  # placement -> (Timing, weights per device); or the reason it was left out
    for i, comp in enumerate(space):
        pl = comp.placement
        row = {"candidate": comp.label, "composition": comp, "makespan": None, "memory": None,
               "span": None, "bubble_ratio": None, "bubble_rate": None,
               "peak_activation": None, "fits": None, "note": ""}
        try:
            if pl not in timings:
                try:
                    static = np.zeros(pl.devices)
                    np.add.at(static, pl.as_array(),
                              costs.stage_arrays(pl.stages, pl.devices)["weights"])
                    timings[pl] = (_compose.timing(pl, m, costs, network), static)
                except ValueError as exc:
                    timings[pl] = str(exc).splitlines()[0]
            if isinstance(timings[pl], str):
                row["note"] = f"left out: {timings[pl]}"
                rows.append(row)
                bar.update(1, final=i == len(space) - 1)
                continue
            base, static = timings[pl]
            tm = _compose.fresh(base)
            if comp.order.policy == "rotate":
                split, w_rule = comp.split_backward, None
            else:
                split, w_rule = _compose._split_and_w(comp.split_backward, comp.w)
            _compose._run(pl, m, comp.order, split, w_rule, tm)
            memory = float((tm.peak + static).max())
            makespan = float(tm.end[0])
            span = float((tm.free - tm.begin).max())
            # As Result.bubble_ratio and Result.bubble_rate (every device runs ops here).
            row.update(makespan=makespan, memory=memory, span=span,
                       bubble_ratio=1.0 - float(tm.busy.sum()) / (pl.devices * makespan)
                       if makespan > 0 else 0.0,
                       bubble_rate=(span - float(tm.busy.max())) / span if span > 0 else 0.0,
                       peak_activation=float(tm.peak.max()), fits=bool(fits(memory, limit)))
        except ScheduleError as exc:
            row["note"] = "deadlock: " + str(exc).splitlines()[0].split(": ", 1)[-1][:120]
        rows.append(row)
        bar.update(1, final=i == len(space) - 1)
    return rows


def _candidates_table(rows, cands, tuned, limit):
    """Every composition screened, the ones simulated in full, then tune's candidates."""
    cols = {k: [] for k in ("candidate", "source", "family", "chunks", "makespan", "span",
                            "bubble_rate", "bubble_ratio", "peak_activation", "memory", "fits",
                            "note")}

    def add(**kw):
        for k in cols:
            cols[k].append(kw.get(k))

    for r in rows:
        comp = r["composition"]
        add(candidate=r["candidate"], source="screened", family="composed",
            chunks=comp.placement.stages // comp.placement.devices, makespan=r["makespan"],
            span=r["span"], bubble_rate=r["bubble_rate"], bubble_ratio=r["bubble_ratio"],
            peak_activation=r["peak_activation"], memory=r["memory"], fits=r["fits"],
            note=r["note"])
    for c in cands:
        if c.source == "composed":  # already a screened row, with the same numbers
            continue
        res = c.result
        add(candidate=c.label, source=c.source, family=c.family, chunks=c.chunks,
            makespan=float(res.makespan), span=_score(res, "span"),
            bubble_rate=float(res.bubble_rate), bubble_ratio=float(res.bubble_ratio),
            peak_activation=float(res.peak_activation.max()), memory=c.memory,
            fits=bool(fits(c.memory, limit)), note="")
    table = pa.table(cols)
    if tuned is not None:
        tune_rows = tuned.candidates.to_pylist()
        for r in tune_rows:
            r["source"] = f"tune/{r['source']}"
        table = pa.concat_tables([table, pa.Table.from_pylist(tune_rows, schema=table.schema)])
    return table

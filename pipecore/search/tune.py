"""The best schedule for a shape and costs under a per-device memory limit.

``tune`` builds every candidate it knows (each family at each chunks value and
option it takes, plus schedules generated for the costs and the limit),
simulates each with the given costs and network, and keeps the fastest whose
worst device fits. Memory is what :class:`~pipecore.Result` reports: peak
activation plus the weights of the stages a device holds.
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..core import tier
from ..core.costs import Costs, Network, fits
from ..core.ops import AR, BW, B, F, InputError, W, check_choice
from ..core.progress import Progress, enabled
from ..core.rules import kernel_from
from ..core.schedule import Schedule, ScheduleError, check_int
from ..core.simulate import Result, simulate, validate
from ..schedules.registry import build, family, schedules
from .tuned import Tuned

__all__ = ["tune", "Tuned", "TuneError", "CHUNK_VALUES"]

#: Chunks (stages per device) tried for families that take a choice.
CHUNK_VALUES = (2, 3, 4, 6, 8)
# Candidates of this many ops and more are validated by the structure
# kernel inside tune (core.rules.kernel_from): once loaded it beats numpy
# from mid-sized candidates (p=32, m=256); small ones (p=8, m=32) stay on numpy.
TUNE_KERNEL_FROM = 8192


class TuneError(InputError):
    """Nothing fits the memory limit.

    Attributes
    ----------
    smallest_limit : float
        The least memory a candidate needs: those tried, and memory-greedy
        schedules (linear and V) generated for the least limit their
        placement allows, which the generators refuse to go below.
        :func:`tune` with this limit returns a schedule; at a higher limit
        the generated and polished candidates change, and may then need
        less, so this is a limit that works rather than a proven minimum.
    candidates : pyarrow.Table
        Every candidate with its metrics.
    """

    def __init__(self, message, smallest_limit, candidates):
        super().__init__(message)
        self.smallest_limit = smallest_limit
        self.candidates = candidates


@dataclass
class _Candidate:
    label: str
    source: str
    family: str
    chunks: int | None
    options: dict
    schedule: Schedule | None = None
    result: Result | None = None
    error: str | None = None

    @property
    def memory(self):
        r = self.result
        return float((r.peak_activation + r.static_memory).max())


def _family_candidates(p, m, names, chunk_values):
    for name in names:
        fam = family(name)
        if fam.fixed_chunks is not None or not fam.chunks:
            chunk_list = [None]
        else:
            chunk_list = list(chunk_values)
        opt_names = sorted(fam.tune_options)
        opt_values = [fam.tune_options[k] for k in opt_names]
        for c in chunk_list:
            for combo in itertools.product(*opt_values):
                options = dict(zip(opt_names, combo))
                parts = [name] + ([f"v={c}"] if c is not None else []) + [
                    f"{k}={v}" for k, v in options.items()]
                yield _Candidate(label=" ".join(parts), source="family", family=name,
                                 chunks=c, options=options)


def _spread(values, most):
    """At most ``most`` of the values, evenly spread, ends included."""
    values = list(values)
    if len(values) <= most:
        return values
    idx = np.unique(np.round(np.linspace(0, len(values) - 1, most)).astype(int))
    return [values[i] for i in idx]


def _generated(p, m, costs, limit):
    """Schedules generated for these costs and this limit (name, builder)."""
    from ..schedules import generate

    lim = None if math.isinf(limit) else limit
    linear = list(range(p))
    vee = linear + linear[::-1]
    for w_fill in (0.0, 0.5, 1.0):
        # Warm-up depth: 1F1B's p - d plus k extra forwards in flight.
        for k in _spread(range(p + 1), 9):
            warm = [p - d + k for d in range(p)]
            yield (f"memory-greedy linear warmup=p-d+{k} w_fill={w_fill:g}",
                   lambda warm=warm, w_fill=w_fill: generate.memory_greedy(
                       linear, m, costs, lim, warm, w_fill, name="memory-greedy"))
        yield (f"memory-greedy V w_fill={w_fill:g}",
               lambda w_fill=w_fill: generate.memory_greedy(vee, m, costs, lim, None, w_fill,
                                                            name="memory-greedy-v"))
    # Per-device warm-up depths by coordinate descent, below 1F1B's too (tight
    # limits need them); cheap at small p, bounded at large p.
    yield ("memory-greedy linear warm-up search",
           lambda: generate.warmup_search(linear, m, costs, lim, max_evals=200 if p <= 8 else 40))

    scalar = all(np.ndim(getattr(costs, k)) == 0 for k in ("f", "b", "w", "comm", "activation",
                                                           "activation_w"))
    if scalar and m >= 2 * p:
        act_limit = None
        if limit is not None and math.isfinite(limit):
            # zbv_greedy's limit is on activation; weights are 2 chunks' worth here.
            act_limit = limit - float(np.max(costs.weights))
        if act_limit is None or act_limit >= p * costs.activation:
            yield "zb-v-greedy", lambda: generate.zbv_greedy(p, m, costs, act_limit)
    if scalar and p >= 2:
        # Adaptive V building blocks (Controllable Memory paper); any m, as the
        # search pads to 2p microbatches internally and drops the extras.
        from ..schedules.adaptive import adaptive_v

        yield "adaptive-v", lambda: adaptive_v(p, m, costs, lim)


@tier.compiled()  # many simulations: compile at once, no interpreted budget
def tune(devices: int, microbatches: int, costs: Costs | None = None,
         memory_limit: float | None = None, network: Network | None = None,
         families=None, chunks=None, generated: bool = True,
         objective: str = "makespan", polish: bool = True, recompute: bool = True,
         offload: bool = True, progress=None) -> Tuned:
    """The fastest schedule whose worst device fits the memory limit.

    Parameters
    ----------
    devices, microbatches : int
        Shape of the pipeline.
    costs : Costs, optional
        Times and memory (default ``Costs()``). ``memory_limit`` is compared
        with peak activation plus weights, both in these units: with
        ``weights=0`` it is an activation budget (e.g. 8.0 = eight
        microbatches' activations of one device share).
    memory_limit : float, optional
        Per-device memory budget; None means no limit.
    network : Network, optional
        Links for the simulation (default: transfers take ``costs.comm``).
    families : list of str, optional
        Families to try (default: all registered).
    chunks : sequence of int, optional
        Chunks values tried for families that take a choice (default
        ``pipecore.search.tune.CHUNK_VALUES``).
    generated : bool
        Also try schedules generated for these costs and the limit.
    objective : {"makespan", "span"}
        What to minimise: the iteration's makespan (first op to last, the
        time of an iteration that ends in a global step), or the longest
        per-device span (last op end minus first op start on one device: the
        zero-bubble papers' cost, whose ``bubble_rate`` they report; right
        when consecutive iterations may overlap on the pipeline).
    polish : bool
        Run an iterated local search (:func:`pipecore.search.local_search`:
        ops swapped or moved within a device's program, kept when the
        objective improves and the limit holds, with random restarts) on the
        three best candidates that fit.
    recompute : bool
        For the fastest candidates that do not fit, also try recomputing
        activations (:func:`pipecore.recompute`), stage by stage on the
        device most over the limit, until they fit. Recompute costs
        ``costs.r`` per op and keeps ``costs.checkpoint``; it never makes a
        schedule faster, so it wins only where the plain ones do not fit.
    offload : bool
        When ``costs.offload`` is set, likewise try offloading activations
        to host memory (:func:`pipecore.offload`, copies back issued one or
        two units ahead of the backward), stage by stage on each device
        over the limit.
    progress : bool, optional
        Show a progress bar over the candidate builds (default: when stderr
        is a terminal).

    Returns
    -------
    Tuned
        ``.schedule``, ``.result``, ``.candidates`` (an Arrow table of every
        candidate) and ``.report()``.

    Raises
    ------
    TuneError
        When no candidate fits; it carries ``smallest_limit``, the least
        memory any candidate tried needs (a limit at which tune succeeds).
    ValueError
        For bad arguments (naming them).
    """
    t0 = time.perf_counter()
    check_choice("objective", objective, ("makespan", "span"))
    p = check_int("devices", devices, minimum=1)
    m = check_int("microbatches", microbatches, minimum=1)
    costs = Costs() if costs is None else costs
    if not isinstance(costs, Costs):
        raise InputError(f"'costs' must be a pipecore.Costs (got {type(costs).__name__})")
    if network is not None and not isinstance(network, Network):
        raise InputError(f"'network' must be a pipecore.Network (got {type(network).__name__})")
    limit = math.inf if memory_limit is None else memory_limit
    if isinstance(limit, bool) or not isinstance(limit, (int, float)) or math.isnan(limit) \
            or limit <= 0:
        raise InputError(f"'memory_limit' must be a number > 0 (got {memory_limit!r})")
    limit = float(limit)
    names = schedules() if families is None else [family(n).name for n in families]
    chunk_values = CHUNK_VALUES if chunks is None else tuple(
        check_int("chunks", c, minimum=1) for c in chunks)

    # Candidates from about p=16 up are tens of thousands of ops, validated
    # by the dozen: the structure kernel is worth its load there.
    with kernel_from(TUNE_KERNEL_FROM):
        cands = list(_family_candidates(p, m, names, chunk_values))
        bar = Progress(len(cands), enabled(progress), unit="builds")
        for cand in cands:
            try:
                cand.schedule = build(cand.family, p, m, chunks=cand.chunks, **cand.options)
            except (ValueError, ScheduleError) as exc:
                cand.error = str(exc).splitlines()[0]
            bar.update(1, final=cand is cands[-1])
        if generated:
            for label, make in _generated(p, m, costs, limit):
                cand = _Candidate(label=label, source="generated", family=label, chunks=None,
                                  options={})
                try:
                    cand.schedule = make()
                except (ValueError, ScheduleError) as exc:
                    cand.error = str(exc).splitlines()[0]
                cands.append(cand)
        # One structure per distinct op table: drop duplicates (v=1 interleaved is 1F1B, ...).
        seen = {}
        for cand in cands:
            if cand.schedule is None:
                continue
            key = _fingerprint(cand.schedule)
            if key in seen:
                cand.error = f"same schedule as {seen[key]}"
                cand.schedule = None
                continue
            seen[key] = cand.label
            try:
                cand.result = simulate(cand.schedule, costs, network)
            except ValueError as exc:  # costs that do not fit this candidate's stages
                cand.error = str(exc).splitlines()[0]
                cand.schedule = None
        ran = [c for c in cands if c.result is not None]
        if recompute and not math.isinf(limit):
            cands += _recompute_candidates(ran, costs, limit, network, objective)
        if offload and costs.offload is not None and not math.isinf(limit):
            cands += _offload_candidates(ran, costs, limit, network, objective)
        ran = [c for c in cands if c.result is not None]
        table = _table(cands, limit)
        fitting = [c for c in ran if fits(c.memory, limit)]
        if not fitting:
            if not ran:
                raise TuneError("no candidate could be built for these shapes: "
                                + "; ".join(f"{c.label}: {c.error}" for c in cands[:5]),
                                math.nan, table)
            least = min(ran, key=lambda c: (c.memory, c.result.makespan))
            need, label, span = least.memory, least.label, least.result.makespan
            floor = _floor(p, m, costs, network) if generated else None
            if floor is not None and floor[0] < need:
                # The generators refuse a limit below one microbatch per stage; made for
                # that floor they may fit where every candidate tried here needs more.
                need, label, span = floor
                label += " (generated for that limit)"
            raise TuneError(
                f"nothing fits memory_limit={limit:g}: the least memory a candidate needs is "
                f"{need:g} ({label}, makespan {span:g}); a limit of at least {need:g} gives a "
                f"schedule", need, table)
        if polish:
            fitting += _polish(fitting, cands, costs, limit, network, objective)
            table = _table(cands, limit)
        # Ties go to a named family, then to what was generated for the limit, then
        # to the variants (recompute, offload, polish): the simplest schedule.
        order = {id(c): i for i, c in enumerate(cands)}
        best = min(fitting, key=lambda c: (_score(c.result, objective), c.memory,
                                           _SOURCES.index(c.source), order.get(id(c), 0)))
        validate(best.schedule)
        return Tuned(best.schedule, best.result, best.label, table, limit, costs, network,
                     time.perf_counter() - t0, objective)


#: Candidate sources, simplest first: the order in which ties are broken.
_SOURCES = ("family", "generated", "recompute", "offload", "polished")


def _floor(p, m, costs, network):
    """Memory-greedy schedules generated for the least limit their placement
    allows (weights plus one microbatch on each of a device's stages):
    ``(memory, label, makespan)`` of the one needing least, when it fits
    that limit, else None."""
    from ..schedules import generate

    linear = list(range(p))
    best = None
    for label, pl in (("memory-greedy", linear), ("memory-greedy-v", linear + linear[::-1])):
        try:  # per-stage costs of p entries do not fit the V's 2p stages
            arr = costs.stage_arrays(len(pl), p)
            need = max(sum(arr["weights"][s] + arr["activation"][s] for s in range(len(pl))
                           if pl[s] == d) for d in range(p))
            res = simulate(generate.memory_greedy(pl, m, costs, need, None, 1.0, name=label),
                           costs, network)
        except (ValueError, ScheduleError):
            continue
        mem = float((res.peak_activation + res.static_memory).max())
        if fits(mem, need) and (best is None or (mem, res.makespan) < (best[0], best[2])):
            best = (mem, label, res.makespan)
    return best


def _lifetimes(result):
    """Per stage: summed F-start to backward-finish time of its microbatches,
    how long its activations are held (longest first is recomputed first)."""
    sched = result.schedule
    kind = sched.kind_codes
    stage = sched._column("stage")
    life = np.zeros(sched.stages)
    np.add.at(life, stage[kind == F], -result.start[kind == F])
    back = (kind == B) | (kind == BW)
    np.add.at(life, stage[back], result.finish[back])
    return life


def _ranges(values):
    """Compact sorted ranges: [0, 1, 2, 5] -> "0-2,5"."""
    values = sorted(set(values))  # a replicated stage is chosen on each of its devices
    parts = []
    lo = prev = values[0]
    for v in values[1:] + [None]:
        if v is not None and v == prev + 1:
            prev = v
            continue
        parts.append(f"{lo}" if lo == prev else f"{lo}-{prev}")
        if v is not None:
            lo = prev = v
    return ",".join(parts)


class _RecomputePeaks:
    """Per-device peak activation (program order) if some stages were
    recomputed with an R right before each backward unit; no schedule built.

    The same running total as the kernels: a recomputed F adds the
    checkpoint, its R the rest of the activation just before the backward.
    What does not depend on the stages chosen is computed once per device,
    on first use: tune's binary search asks one device at a time.
    """

    def __init__(self, sched, arrays):
        st = sched._info()
        self._kind = sched.kind_codes
        self._stage = sched._column("stage")
        self._paired = st.paired
        self._ptr = st.dev_ptr
        self._arrays = arrays
        self._stages = sched.stages
        self._devices = {}

    def _device(self, d):
        if d in self._devices:
            return self._devices[d]
        a, b = int(self._ptr[d]), int(self._ptr[d + 1])
        kind, stage = self._kind[a:b], self._stage[a:b]
        ar = self._arrays
        act, act_w, ckpt = ar["activation"][stage], ar["activation_w"][stage], ar["checkpoint"][stage]
        # Two positions per row: an R event (before the row's unit) then the row.
        ev = np.zeros(2 * (b - a))
        ev[1::2] = np.select([kind == F, kind == B, kind == W, kind == BW],
                             [act, -(act - act_w), -act_w, -act], 0.0)
        is_f = np.flatnonzero(kind == F)
        back = np.flatnonzero((kind == B) | (kind == BW))
        unit_head = back - self._paired[a:b][back]  # a paired B's unit starts at its F row
        out = (ev, 2 * is_f + 1, stage[is_f], ckpt[is_f],
               2 * unit_head, stage[back], act[back] - ckpt[back])
        self._devices[d] = out
        return out

    def device(self, d, chosen):
        """Device ``d``'s peak activation with the stages in ``chosen`` recomputed.

        Parameters
        ----------
        d : int
            Device.
        chosen : iterable of int
            Recomputed stages.

        Returns
        -------
        float
            The peak, at least 0.

        Raises
        ------
        IndexError
            If a stage or the device is out of range.
        """
        ev, f_pos, f_stage, f_ckpt, r_pos, r_stage, r_alloc = self._device(d)
        if not len(ev):
            return 0.0
        rec = np.zeros(self._stages, dtype=bool)
        rec[list(chosen)] = True
        ev = ev.copy()
        take = rec[f_stage]
        ev[f_pos[take]] = f_ckpt[take]
        take = rec[r_stage]
        ev[r_pos[take]] += r_alloc[take]
        return max(0.0, float(np.cumsum(ev).max()))


def _device_peaks(sched, arrays, chosen):
    """Per-device peak activation (program order) if ``chosen`` stages were
    recomputed, every device at once (see :class:`_RecomputePeaks`)."""
    peaks = _RecomputePeaks(sched, arrays)
    return np.array([peaks.device(d, chosen) for d in range(sched.devices)])


def _recompute_candidates(ran, costs, limit, network, objective, top=6):
    """Recompute variants of the fastest candidates that do not fit.

    On each device over the limit, the fewest of its stages (longest-held
    first) whose recompute brings it under the limit; peak memory in
    program order depends on a device's own stages only, and falls as more
    are recomputed, so a binary search per device needs no simulation. A
    device that stays over the limit with all its stages recomputed gets
    them all: that variant does not fit, but its memory tells TuneError
    the smallest limit recompute reaches.
    """
    from ..core.schedule import R
    from ..schedules.recompute import recompute

    over = sorted((c for c in ran if not fits(c.memory, limit)
                   and not (c.schedule.kind_codes == R).any()),
                  key=lambda c: _score(c.result, objective))
    out = []
    for c in over[:top]:
        base = c.schedule
        try:
            arrays = costs.stage_arrays(base.stages, base.devices)
        except ValueError:
            continue
        static = c.result.static_memory
        life = _lifetimes(c.result)
        peaks = _RecomputePeaks(base, arrays)
        chosen = []
        for d in range(base.devices):
            if fits(float(c.result.peak_activation[d] + static[d]), limit):
                continue
            mine = sorted((s for s in range(base.stages) if d in base.stage_devices[s]),
                          key=lambda s: (-life[s], s))
            lo, hi = 1, len(mine)
            if not fits(float(peaks.device(d, mine) + static[d]), limit):
                chosen += mine
                continue
            while lo < hi:
                mid = (lo + hi) // 2
                if fits(float(peaks.device(d, mine[:mid]) + static[d]), limit):
                    hi = mid
                else:
                    lo = mid + 1
            chosen += mine[:lo]
        if not chosen:
            continue
        try:
            sched = recompute(base, stages=chosen, name=f"{base.name}+r")
            res = simulate(sched, costs, network)
        except (ValueError, ScheduleError):
            continue
        cand = _Candidate(label=f"{c.label} +recompute stages={_ranges(chosen)}",
                          source="recompute", family=c.family, chunks=c.chunks,
                          options=c.options, schedule=sched, result=res)
        out.append(cand)
    return out


def _offload_candidates(ran, costs, limit, network, objective, top=4):
    """Offload variants of the fastest candidates that do not fit.

    Memory now follows copy times, so each device's count of offloaded
    stages (longest-held first) is found by a binary search that simulates;
    a device's peak depends mostly on its own stages, and a final round
    adds one more stage where the combination still does not fit.
    """
    from ..core.schedule import L, R
    from ..schedules.offload import offload as offload_stages

    plain = [c for c in ran if not (c.schedule.kind_codes == R).any()
             and not (c.schedule.kind_codes == L).any()]
    over = sorted((c for c in plain if not fits(c.memory, limit)),
                  key=lambda c: _score(c.result, objective))
    out = []
    for c in over[:top]:
        base = c.schedule
        life = _lifetimes(c.result)
        for prefetch in (1, 2):
            def run(stages, prefetch=prefetch, base=base):
                sched = offload_stages(base, stages=stages, prefetch=prefetch,
                                       name=f"{base.name}+o")
                res = simulate(sched, costs, network)
                return res, res.peak_activation + res.static_memory

            order = {}
            count = {}
            try:
                for d in range(base.devices):
                    if fits(float(c.result.peak_activation[d] + c.result.static_memory[d]), limit):
                        continue
                    mine = sorted((s for s in range(base.stages) if d in base.stage_devices[s]),
                                  key=lambda s: (-life[s], s))
                    order[d] = mine
                    lo, hi = 1, len(mine)
                    while lo < hi:
                        mid = (lo + hi) // 2
                        if fits(float(run(mine[:mid])[1][d]), limit):
                            hi = mid
                        else:
                            lo = mid + 1
                    count[d] = lo
                if not order:
                    break
                for _round in range(3):
                    chosen = [s for d, mine in order.items() for s in mine[:count[d]]]
                    res, mem = run(chosen)
                    grow = [d for d in order if not fits(float(mem[d]), limit)
                            and count[d] < len(order[d])]
                    if fits(float(mem.max()), limit) or not grow:
                        break
                    for d in grow:
                        count[d] += 1
            except (ValueError, ScheduleError):
                continue
            if not fits(float(mem.max()), limit):
                continue  # copies too slow to free enough memory in time
            out.append(_Candidate(
                label=f"{c.label} +offload stages={_ranges(chosen)} prefetch={prefetch}",
                source="offload", family=c.family, chunks=c.chunks, options=c.options,
                schedule=res.schedule, result=res))
    return out


def _polish(fitting, cands, costs, limit, network, objective, top=3):
    """Local search (pipecore.search) on the best few fitting candidates."""
    from .local import local_search

    out = []
    for c in sorted(fitting, key=lambda c: _score(c.result, objective))[:top]:
        sched = c.schedule
        if sched._info().paired.any() or (sched.kind_codes == AR).any() \
                or (sched.kind_codes >= 6).any():
            continue  # the search moves single ops, with memory in program order
        # About 1e7 op-simulations per candidate (at least 200 evaluations): well
        # under a second. At 10k+ ops (ZB Table 5, p=16 and 32) polish never won
        # with 1,000 evaluations either.
        budget = max(200, min(40_000, int(1e7 // max(sched.num_ops, 1))))
        try:
            better = local_search(sched, costs, None if math.isinf(limit) else limit, network,
                                  objective, window=4, max_evals=budget, restarts=50,
                                  name=f"{sched.name}+ls")
        except ValueError:
            continue
        res = simulate(better, costs, network)
        if _score(res, objective) < _score(c.result, objective) * (1 - 1e-12):
            cand = _Candidate(label=f"{c.label} +local-search", source="polished",
                              family=c.family, chunks=c.chunks, options=c.options,
                              schedule=better, result=res)
            cands.append(cand)
            out.append(cand)
    return out


def _score(result, objective):
    if objective == "span":
        return float(result.span.max()) if result.span.size else 0.0
    return result.makespan


def _fingerprint(schedule):
    import hashlib

    h = hashlib.sha1()
    for name in ("device", "slot", "stage", "microbatch"):
        h.update(np.ascontiguousarray(schedule._column(name)).tobytes())
    h.update(np.ascontiguousarray(schedule.kind_codes).tobytes())
    return h.hexdigest()


def _table(cands, limit):
    rows = {"candidate": [], "source": [], "family": [], "chunks": [], "makespan": [], "span": [],
            "bubble_rate": [], "bubble_ratio": [], "peak_activation": [], "memory": [],
            "fits": [], "note": []}
    for c in cands:
        r = c.result
        rows["candidate"].append(c.label)
        rows["source"].append(c.source)
        rows["family"].append(c.family)
        rows["chunks"].append(None if c.schedule is None else
                              c.schedule.stages // c.schedule.devices)
        rows["makespan"].append(None if r is None else float(r.makespan))
        rows["span"].append(None if r is None else _score(r, "span"))
        rows["bubble_rate"].append(None if r is None else float(r.bubble_rate))
        rows["bubble_ratio"].append(None if r is None else float(r.bubble_ratio))
        rows["peak_activation"].append(None if r is None else float(r.peak_activation.max()))
        rows["memory"].append(None if r is None else c.memory)
        rows["fits"].append(None if r is None else bool(fits(c.memory, limit)))
        rows["note"].append(c.error or "")
    return pa.table(rows)

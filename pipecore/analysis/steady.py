"""Steady state of a pipeline that streams microbatches without a flush:
time per optimizer step, samples per unit time, weight versions and their
staleness, read from the op order and the simulated times."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ..core.ops import InputError, check_type
from ..core.result import Result
from ..core.schedule import BW, F, Schedule, W

__all__ = ["SteadyState", "steady_state", "weight_versions"]

#: Steady iterations measured at the least (the issue's bar: at least 10).
MIN_ITERATIONS = 10


@dataclass(frozen=True)
class WeightVersions:
    """Which weight version each (stage, microbatch) uses, read from the order.

    Attributes
    ----------
    accumulation : int
        Microbatches per optimizer step k.
    version : numpy.ndarray
        int64 (S, m): updates applied to the stage's weights before the
        version that microbatch's forward and backward use.
    staleness : numpy.ndarray
        int64 (S, m): the microbatch's step minus its version, in steps.
    held : numpy.ndarray
        int64 (S,): most versions a stage needs at once (in use by a
        microbatch in flight, or the newest).
    """

    accumulation: int
    version: np.ndarray
    staleness: np.ndarray
    held: np.ndarray


def weight_versions(schedule: Schedule, accumulation: int | None = None,
                    sync: str | None = None) -> WeightVersions:
    """Read from a schedule's op order which weight version every op uses.

    A stage applies optimizer step t's update right after the last weight
    gradient (W, else BW) of step t's microbatches in its device's program.
    A step takes, when its first forward reaches a stage, the number of
    updates applied so far on that stage (``sync="stage"``, weight
    stashing) or on the input stage 0 (``"input"``, one version for the
    whole pipeline); its microbatches keep that version until their
    backward.

    Parameters
    ----------
    schedule : Schedule
        One device per stage, every (stage, microbatch) with an F and a BW
        or W.
    accumulation : int, optional
        Microbatches per step k (default ``params['accumulation']``, else
        every microbatch of the schedule: one step, as with a flush).
    sync : {"stage", "input"}, optional
        Default ``params['weight_sync']``, else ``"stage"``.

    Returns
    -------
    WeightVersions

    Raises
    ------
    ValueError
        If a stage runs on two devices, an op lacks its forward or weight
        gradient, ``sync`` is neither rule, or a step would use a version
        its stage has not produced yet when its forward runs (the order
        cannot follow the rule).
    """
    check_type("schedule", schedule, Schedule, "a pipecore.Schedule")
    st = schedule._info()
    S, m = st.stages, st.microbatches
    if any(len(d) != 1 for d in st.stage_devices):
        raise InputError(f"schedule {schedule.name!r} replicates a stage on two devices; weight "
                         f"versions are read for one device per stage")
    params = schedule.params
    k = int(params.get("accumulation", m) if accumulation is None else accumulation)
    if k < 1:
        raise InputError(f"'accumulation' must be >= 1 (got {k})")
    sync = params.get("weight_sync", "stage") if sync is None else sync
    if sync not in ("stage", "input"):
        raise InputError(f"'sync' must be 'stage' or 'input' (got {sync!r})")
    kind = schedule.kind_codes
    stage = schedule._column("stage").astype(np.int64)
    mb = schedule._column("microbatch").astype(np.int64)
    slot = schedule._column("slot").astype(np.int64)
    pos_f = np.full((S, m), -1, dtype=np.int64)
    pos_g = np.full((S, m), -1, dtype=np.int64)
    is_f = kind == F
    pos_f[stage[is_f], mb[is_f]] = slot[is_f]
    for code in (BW, W):  # a W (split backward) ends the weight gradient, else the BW
        sel = kind == code
        pos_g[stage[sel], mb[sel]] = slot[sel]
    for name, pos in (("forward (F)", pos_f), ("weight gradient (BW or W)", pos_g)):
        miss = np.argwhere(pos < 0)
        if miss.size:
            s, j = (int(x) for x in miss[0])
            raise InputError(f"stage {s} microbatch {j} has no {name}: weight versions need both")
    step = np.arange(m) // k
    steps = int(step[-1]) + 1
    # Update t lands after the last weight gradient of step t on the stage.
    last_g = np.full((S, steps), -1, dtype=np.int64)
    np.maximum.at(last_g, (np.repeat(np.arange(S), m), np.tile(step, S)), pos_g.ravel())
    first_f = np.full((S, steps), np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_f, (np.repeat(np.arange(S), m), np.tile(step, S)), pos_f.ravel())
    updates = np.sort(last_g, axis=1)
    applied = np.empty((S, steps), dtype=np.int64)  # updates before each step's first forward
    for s in range(S):
        applied[s] = np.searchsorted(updates[s], first_f[s], side="left")
    step_version = applied if sync == "stage" else np.broadcast_to(applied[0], (S, steps))
    bad = np.argwhere(step_version > applied)
    if bad.size:
        s, t = (int(x) for x in bad[0])
        raise InputError(f"stage {s}: step {t} should use version {int(step_version[s, t])} of "
                         f"the input stage, but only {int(applied[s, t])} updates are applied on "
                         f"stage {s} when its first forward runs")
    version = step_version[:, step]
    held = np.array([_most_alive(updates[s], version[s], pos_f[s], pos_g[s]) for s in range(S)],
                    dtype=np.int64)
    return WeightVersions(k, version, step[None, :] - version, held)


def _most_alive(updates, version, pos_f, pos_g):
    """Most versions a stage holds at once: a version lives from its update
    (after the op at slot ``updates[v - 1]``) until it is no longer the
    newest and its last user's weight gradient is done."""
    n = len(updates) + 1
    born = np.concatenate([[-1], updates]) + 1  # version 0 from the start
    newest_until = np.concatenate([updates + 1, [np.iinfo(np.int64).max]])
    last_use = np.full(n, -1, dtype=np.int64)
    np.maximum.at(last_use, version, pos_g + 1)
    first_use = np.full(n, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_use, version, pos_f)
    start = np.minimum(born, first_use)
    end = np.maximum(newest_until, last_use)
    # Half-open [start, end): at equal positions ends come first.
    pos = np.concatenate([end, start])
    delta = np.concatenate([-np.ones(n, np.int64), np.ones(n, np.int64)])
    order = np.lexsort((delta, pos))
    return int(np.cumsum(delta[order]).max())


@dataclass(frozen=True)
class SteadyState:
    """A pipeline's steady state: throughput, weight versions and memory.

    Attributes
    ----------
    name : str
        The schedule's name.
    accumulation : int
        Microbatches per optimizer step (iteration) k.
    iterations : int
        Steady iterations measured (1 for a schedule with a flush, whose
        iterations are all alike).
    iteration_time : float
        Time per iteration in steady state, in the costs' time unit (lower
        is better).
    samples_per_time : float
        Samples per unit of time, ``k * microbatch_size / iteration_time``
        (higher is better; samples per second when costs are seconds).
    staleness : numpy.ndarray
        int64 per stage: optimizer steps between the version a step's
        gradient is computed on and the version it updates, in steady state.
    versions : numpy.ndarray
        int64 per stage: weight versions needed at once, from the op order.
    weight_copies : numpy.ndarray
        int64 per stage: copies of the weights held in memory (the versions,
        or fewer where a moving average reconstructs them).
    weight_memory : numpy.ndarray
        float per device: ``Costs.weights`` times the copies of the stages
        it holds (the schedule's ``Result.static_memory``), in M.
    peak_memory : numpy.ndarray
        float per device: peak activation plus weight memory, in M.
    formula : dict
        The family's closed forms (``pipecore.schedules.asynchronous.steady_forms``),
        empty for a schedule that is not an asynchronous family or has
        per-stage costs.
    flags : list of str
        Where the measured figures differ from the closed forms.
    """

    name: str
    accumulation: int
    iterations: int
    iteration_time: float
    samples_per_time: float
    staleness: np.ndarray
    versions: np.ndarray
    weight_copies: np.ndarray
    weight_memory: np.ndarray
    peak_memory: np.ndarray
    formula: dict = field(default_factory=dict)
    flags: list = field(default_factory=list)

    def summary(self) -> str:
        """A few lines, each under 120 columns, with units and directions.

        Returns
        -------
        str
        """
        lines = [f"{self.name}: {self.accumulation} microbatch(es) per optimizer step, "
                 f"{self.iterations} steady iteration(s) measured",
                 f"  time per iteration {self.iteration_time:.6g} (lower is better); "
                 f"{self.samples_per_time:.6g} samples per time unit (higher is better)",
                 f"  staleness per stage (steps): {_short(self.staleness)}",
                 f"  weight versions needed per stage: {_short(self.versions)}",
                 f"  weight copies held per stage: {_short(self.weight_copies)}",
                 f"  peak memory per device (activation + weights, M): {_short(self.peak_memory)}"]
        if self.formula.get("speedup") is not None:
            lines.append(f"  closed form: {self.formula['speedup']:.4g}x the samples per time of "
                         f"1F1B with a flush every step (higher is better)")
        lines += [f"  differs from the closed form: {flag}" for flag in self.flags]
        return "\n".join(lines)


def _short(values) -> str:
    arr = np.asarray(values)
    shown = [f"{x:g}" for x in arr[:8].tolist()]
    return "[" + ", ".join(shown) + (f", ... ({arr.size} in all)]" if arr.size > 8 else "]")


def steady_state(result: Result, microbatch_size: float = 1.0) -> SteadyState:
    """Throughput and weight versions of a simulated pipeline in steady state.

    For a schedule streamed without a flush (``params['accumulation']``,
    the asynchronous families) an iteration is one optimizer step of k
    microbatches; it ends when the last stage to apply the step's update
    does. Iterations whose microbatches fall among the first or the last
    p of the stream (fill and drain) are left out, and the time per
    iteration is the mean over the rest, at least 10. A schedule with a
    flush is one iteration of all its microbatches, so its time per
    iteration is its makespan.

    Parameters
    ----------
    result : Result
        From :func:`pipecore.simulate`.
    microbatch_size : float, default 1.0
        Samples per microbatch.

    Returns
    -------
    SteadyState

    Raises
    ------
    ValueError
        If ``microbatch_size`` is not a finite number > 0, the stream is too
        short for 10 steady iterations (the message gives the microbatches
        needed), or the schedule's weight versions cannot be read (see
        ``pipecore.analysis.steady.weight_versions``).
    """
    check_type("result", result, Result, "a pipecore.Result")
    size = float(microbatch_size) if not isinstance(microbatch_size, bool) else math.nan
    if not math.isfinite(size) or size <= 0:
        raise InputError(f"'microbatch_size' must be a finite number > 0 (got {microbatch_size!r})")
    sched = result.schedule
    p, m = sched.devices, sched.microbatches
    streamed = "accumulation" in sched.params
    if streamed:
        wv = weight_versions(sched)
        k = wv.accumulation
        lo = -(-p // k)  # first step clear of the fill
        hi = (m - p) // k - 1  # last step clear of the drain
        if hi - lo < MIN_ITERATIONS:
            need = (lo + MIN_ITERATIONS + 1) * k + p
            raise InputError(f"{sched.name!r} streams {m} microbatches: steady state needs "
                             f"{MIN_ITERATIONS} iterations clear of the fill and drain, "
                             f"microbatches >= {need} with {k} per step on {p} devices")
        # Communication makes the cycle of 1F1B's steady state span p
        # microbatches (device 0's round trip): whole cycles only, if enough.
        cycle = p // math.gcd(p, k)
        whole = (hi - lo) // cycle * cycle
        iterations = whole if whole >= MIN_ITERATIONS else hi - lo
        ends = _step_ends(result, k)
        iteration_time = float(ends[lo + iterations] - ends[lo]) / iterations
        staleness = wv.staleness[:, lo * k:(hi + 1) * k].max(axis=1)
        versions = wv.held
    else:
        k, iterations = m, 1
        iteration_time = result.makespan
        staleness = np.zeros(sched.stages, dtype=np.int64)
        versions = np.ones(sched.stages, dtype=np.int64)
    weight_memory = np.asarray(result.static_memory, dtype=np.float64)
    state = dict(name=sched.name, accumulation=k, iterations=iterations,
                 iteration_time=iteration_time,
                 samples_per_time=k * size / iteration_time if iteration_time else math.inf,
                 staleness=staleness, versions=versions, weight_copies=sched.weight_versions,
                 weight_memory=weight_memory,
                 peak_memory=np.asarray(result.peak_activation, dtype=np.float64) + weight_memory)
    forms = _forms(result, k, size) if streamed else {}
    return SteadyState(**state, formula=forms, flags=_flags(state, forms))


def _step_ends(result, k):
    """When each optimizer step's last weight gradient finishes, on any stage."""
    sched = result.schedule
    kind = sched.kind_codes
    grad = (kind == BW) | (kind == W)
    step = sched._column("microbatch")[grad].astype(np.int64) // k
    ends = np.zeros(int(step.max()) + 1)
    np.maximum.at(ends, step, np.asarray(result.finish)[grad])
    return ends


def _forms(result, k, size):
    """The family's closed forms, or none where they do not apply."""
    from ..schedules.asynchronous import ASYNCHRONOUS, steady_forms

    params = result.schedule.params
    name = params.get("family")
    if name not in ASYNCHRONOUS:
        return {}
    try:
        return steady_forms(name, params["devices"],
                            accumulation=k if ASYNCHRONOUS[name][1] is None else None,
                            costs=result.costs, history=params.get("history", "stash"),
                            microbatch_size=size)
    except InputError:  # per-stage costs: no closed form
        return {}


def _flags(state, forms):
    flags = []
    if not forms:
        return flags
    time, want = state["iteration_time"], forms["iteration_time"]
    if abs(time - want) > 1e-9 * max(1.0, abs(want)):
        flags.append(f"iteration_time {time:.6g} vs closed form {want:.6g} (a network, jitter "
                     f"or stragglers change the cycle)")
    for key in ("staleness", "versions", "weight_copies"):
        if not np.array_equal(state[key], forms[key]):
            flags.append(f"{key} {_short(state[key])} vs closed form {_short(forms[key])}")
    return flags

"""Assign a model's layers to pipeline stages for a given schedule.

:func:`partition` gives each stage a contiguous range of layers so that the
simulated iteration time (makespan) of the schedule is as small as it can
find, with every device's memory (peak activation plus the training state
of the stages it holds, both from the simulation, so from the schedule's
own per-device memory profile) within a limit.

Search: candidate splits from dynamic programs over contiguous layer
ranges (minimise the largest stage time, with and without a conservative
memory bound built from each stage's in-flight microbatches), then a local
search that moves stage boundaries and re-simulates, keeping the best
split by (memory excess over the limit, makespan, spread of stage times).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..analysis.model import Hardware, Model
from ..core import tier
from ..core.costs import FIT_RTOL, Costs, Network
from ..core.ops import InputError
from ..core.schedule import Schedule, check_int
from ..core.simulate import Result, simulate
from ..schedules.registry import build, family

__all__ = ["partition", "Plan", "PartitionError", "uniform_split"]


class PartitionError(InputError):
    """No split fits the memory limit.

    Attributes
    ----------
    smallest_memory : float
        The least per-device memory (bytes, worst device) among the splits
        the search tried, after a search that minimises it: a limit that
        works, not a proven minimum.
    limit : float
        The limit that was asked for.
    """

    def __init__(self, message, smallest_memory, limit):
        super().__init__(message)
        self.smallest_memory = smallest_memory
        self.limit = limit


@dataclass
class Plan:
    """A layer-to-stage assignment and its simulation.

    Attributes
    ----------
    model : Model
    hardware : Hardware
    schedule : Schedule
    layers : tuple of int
        Layers per stage, in model order (stage s holds a contiguous range).
    costs : Costs
        Per-stage costs of this split (seconds, bytes).
    network : Network
        Links with per-stage transfer bytes.
    result : Result
        The simulation of ``schedule`` with ``costs`` and ``network``.
    uniform_layers : tuple of int
        The uniform split (see ``pipecore.search.partition.uniform_split``).
    uniform : Result
        Its simulation.
    memory_limit : float
        Per-device limit in bytes (inf for none).
    evaluations : int
        Splits simulated by the search.
    """

    model: Model
    hardware: Hardware
    schedule: Schedule
    layers: tuple
    costs: Costs
    network: Network
    result: Result
    uniform_layers: tuple
    uniform: Result
    memory_limit: float
    evaluations: int

    @property
    def makespan(self) -> float:
        """float: seconds per iteration of the plan."""
        return self.result.makespan

    @property
    def gain(self) -> float:
        """float: ``1 - makespan / uniform makespan``: 0.1 when the plan takes
        10% less time per iteration than the uniform split, negative when
        it takes more (a uniform split over the memory limit can be faster)."""
        return 1.0 - self.result.makespan / self.uniform.makespan

    @property
    def gain_seconds(self) -> float:
        """float: uniform makespan minus the plan's, in seconds."""
        return self.uniform.makespan - self.result.makespan

    @property
    def memory(self) -> np.ndarray:
        """numpy.ndarray: per-device peak activation plus weights of the plan (bytes)."""
        return self.result.peak_activation + self.result.static_memory

    @property
    def uniform_memory(self) -> np.ndarray:
        """numpy.ndarray: the same for the uniform split."""
        return self.uniform.peak_activation + self.uniform.static_memory

    @property
    def uniform_fits(self) -> bool:
        """bool: whether the uniform split fits the memory limit."""
        return bool(_fits(self.uniform_memory.max(), self.memory_limit))

    def stage_ranges(self) -> list[tuple[int, int]]:
        """``(start, stop)`` layer indices of each stage.

        Returns
        -------
        list of tuple of int
        """
        return self.model.stage_ranges(self.layers)

    def report(self) -> str:
        """A text report: gain over the uniform split, per-stage times and memory.

        Returns
        -------
        str
        """
        sched, res, uni = self.schedule, self.result, self.uniform
        lim = "none" if math.isinf(self.memory_limit) else f"{self.memory_limit / 1e9:.2f} GB"
        lines = [
            f"partition of {self.model.name} ({len(self.model)} layers) on {self.hardware.name}",
            f"schedule {sched.name}: {sched.devices} devices, {sched.stages} stages, "
            f"{sched.microbatches} microbatches; memory limit per device {lim}",
            f"layers per stage  plan:    {list(self.layers)}",
            f"                  uniform: {list(self.uniform_layers)}",
            f"iteration time    plan {res.makespan * 1e3:.3f} ms, uniform {uni.makespan * 1e3:.3f} ms: "
            f"{self._versus_uniform()}",
            f"worst device memory  plan {self.memory.max() / 1e9:.2f} GB, uniform "
            f"{self.uniform_memory.max() / 1e9:.2f} GB"
            + ("" if self.uniform_fits else " (the uniform split does NOT fit the limit)"),
            f"evaluations {self.evaluations}",
            "",
            "stage device layers               F ms    B ms    W ms  act GB/mb  weights GB",
        ]
        arr = self.costs.stage_arrays(sched.stages, sched.devices)
        names = [x.name for x in self.model.layers]
        for s, (a, b) in enumerate(self.stage_ranges()):
            span = names[a] if b - a == 1 else f"{names[a]}..{names[b - 1]}"
            devs = ",".join(str(d) for d in sched.stage_devices[s])
            lines.append(f"{s:5d} {devs:>6} {span[:20]:20s} {arr['f'][s] * 1e3:7.3f} "
                         f"{arr['b'][s] * 1e3:7.3f} "
                         f"{arr['w'][s] * 1e3:7.3f} {arr['activation'][s] / 1e9:10.3f} "
                         f"{arr['weights'][s] / 1e9:11.3f}")
        lines += ["", "device  busy ms  peak act GB  weights GB  total GB"]
        for d in range(sched.devices):
            lines.append(f"{d:6d} {res.busy[d] * 1e3:8.3f} {res.peak_activation[d] / 1e9:12.3f} "
                         f"{res.static_memory[d] / 1e9:11.3f} {self.memory[d] / 1e9:9.3f}")
        return "\n".join(lines)

    def _versus_uniform(self, short: bool = False) -> str:
        """The plan's time against the uniform split's, the direction in words."""
        diff = abs(self.gain_seconds) * 1e3
        pct = abs(self.gain) * 100
        if self.gain_seconds == 0:
            return "the same time as uniform"
        if short:
            return f"{pct:.2f}% {'less' if self.gain > 0 else 'more'} time than uniform"
        if self.gain > 0:
            return f"faster than uniform by {diff:.3f} ms per iteration ({pct:.2f}% less time)"
        return f"slower than uniform by {diff:.3f} ms per iteration ({pct:.2f}% more time)"

    def __repr__(self) -> str:
        return (f"Plan({self.schedule.name!r}, layers={list(self.layers)}, "
                f"makespan={self.makespan:.6g} s, {self._versus_uniform(short=True)})")

    def _repr_html_(self) -> str:
        """Jupyter: the headline numbers with units and the per-stage and per-device tables."""
        import html

        sched, res, uni = self.schedule, self.result, self.uniform
        esc = html.escape
        lim = "none" if math.isinf(self.memory_limit) else f"{self.memory_limit / 1e9:.2f} GB"
        fits = "" if self.uniform_fits else " (the uniform split does not fit the limit)"
        head = (
            f"<div style='font-family:sans-serif;font-size:13px'><b>partition</b> of "
            f"{esc(self.model.name)} ({len(self.model)} layers) on {esc(self.hardware.name)}: "
            f"{esc(sched.name)}, {sched.devices} devices, {sched.stages} stages, "
            f"{sched.microbatches} microbatches<br>"
            f"iteration time <b>{res.makespan * 1e3:.3f} ms</b> (uniform split "
            f"{uni.makespan * 1e3:.3f} ms): {esc(self._versus_uniform())}<br>"
            f"worst device memory {self.memory.max() / 1e9:.2f} GB (uniform "
            f"{self.uniform_memory.max() / 1e9:.2f} GB{fits}); limit {lim} per device; "
            f"{self.evaluations} splits simulated</div>")
        cell = "<td style='text-align:right;padding:0 6px'>"
        th = "<th style='padding:0 6px;text-align:right'>"
        table = ("<table style='font-family:sans-serif;font-size:12px;border-collapse:collapse;"
                 "margin-top:6px'><thead><tr>")
        arr = self.costs.stage_arrays(sched.stages, sched.devices)
        names = [x.name for x in self.model.layers]
        rows = []
        for s, ((a, b), n, u) in enumerate(zip(self.stage_ranges(), self.layers,
                                               self.uniform_layers)):
            span = names[a] if b - a == 1 else f"{names[a]} .. {names[b - 1]}"
            devs = ",".join(str(d) for d in sched.stage_devices[s])
            moved = " style='font-weight:bold'" if n != u else ""  # the stages the plan changed
            rows.append(
                f"<tr{moved}>{cell}{s}</td>{cell}{devs}</td><td style='padding:0 6px'>"
                f"{esc(span)}</td>{cell}{n}</td>{cell}{u}</td>{cell}{arr['f'][s] * 1e3:.3f}</td>"
                f"{cell}{arr['b'][s] * 1e3:.3f}</td>{cell}{arr['w'][s] * 1e3:.3f}</td>"
                f"{cell}{arr['activation'][s] / 1e9:.3f}</td>{cell}{arr['weights'][s] / 1e9:.3f}</td></tr>")
        heads = ("stage", "devices", "layer range", "layers", "uniform", "F ms", "B ms", "W ms",
                 "activation GB per microbatch", "weights GB")
        stages = (table + "".join((th.replace("right", "left") if h == "layer range" else th)
                                  + f"{h}</th>" for h in heads)
                  + f"</tr></thead><tbody>{''.join(rows)}</tbody></table>"
                  "<div style='font-family:sans-serif;font-size:11px;color:#555'>layers: the "
                  "plan's; uniform: the uniform split's (bold: stages the plan changed); times "
                  "per microbatch</div>")
        rows = [f"<tr>{cell}{d}</td>{cell}{res.busy[d] * 1e3:.3f}</td>"
                f"{cell}{res.peak_activation[d] / 1e9:.3f}</td>{cell}{res.static_memory[d] / 1e9:.3f}</td>"
                f"{cell}{self.memory[d] / 1e9:.3f}</td></tr>" for d in range(sched.devices)]
        heads = ("device", "busy ms", "peak activation GB", "weights GB", "total GB")
        devices = (table + "".join(f"{th}{h}</th>" for h in heads)
                   + f"</tr></thead><tbody>{''.join(rows)}</tbody></table>")
        return head + stages + devices


def _fits(memory, limit):
    return memory <= limit * (1.0 + FIT_RTOL)


def uniform_split(model: Model, stages: int) -> tuple:
    """Layers per stage of the uniform split.

    The model's blocks are divided as evenly as possible (the first
    ``blocks % stages`` stages get one more); layers before the first block
    (the embedding) join stage 0 and layers after the last block (the
    head) join the last stage. A model with fewer blocks than stages is
    divided the same way over all its layers.

    Parameters
    ----------
    model : Model
    stages : int

    Returns
    -------
    tuple of int

    Raises
    ------
    ValueError
        If the model has fewer layers than stages.
    """
    stages = check_int("stages", stages, minimum=1)
    kinds = [x.kind for x in model.layers]
    blocks = [i for i, k in enumerate(kinds) if k == "block"]
    if len(blocks) >= stages:
        first, last = blocks[0], blocks[-1]
        n = last - first + 1
    else:  # too few blocks to give each stage one: divide all the layers
        first, last, n = 0, len(kinds) - 1, len(kinds)
    if n < stages:
        raise InputError(f"the model has {n} layers but the schedule has {stages} stages: "
                         "each stage needs at least one layer")
    counts = [n // stages + (1 if s < n % stages else 0) for s in range(stages)]
    counts[0] += first
    counts[-1] += len(kinds) - 1 - last
    return tuple(counts)


def _bottleneck_dp(cost, stages, stage_ok=None):
    """Contiguous split of ``cost`` into ``stages`` ranges minimising the largest
    range sum; ``stage_ok(s, i, j)`` may forbid layers [i, j) on stage s.
    Ties go to the smallest sum of squares. Returns counts or None."""
    n = len(cost)
    pre = np.concatenate(([0.0], np.cumsum(cost)))
    INF = math.inf
    # best[k][j]: (bottleneck, sum of squares) of layers [0, j) over stages 0..k-1
    best = [[(INF, INF)] * (n + 1) for _ in range(stages + 1)]
    arg = [[-1] * (n + 1) for _ in range(stages + 1)]
    best[0][0] = (0.0, 0.0)
    for k in range(1, stages + 1):
        # stage k-1 takes [i, j); stages after it need n - j >= stages - k layers
        for j in range(k, n - (stages - k) + 1):
            cur, at = (INF, INF), -1
            for i in range(k - 1, j):
                prev = best[k - 1][i]
                if prev[0] == INF:
                    continue
                if stage_ok is not None and not stage_ok(k - 1, i, j):
                    continue
                c = pre[j] - pre[i]
                cand = (max(prev[0], c), prev[1] + c * c)
                if cand < cur:
                    cur, at = cand, i
            best[k][j], arg[k][j] = cur, at
    if best[stages][n][0] == INF:
        return None
    counts, j = [], n
    for k in range(stages, 0, -1):
        i = arg[k][j]
        counts.append(j - i)
        j = i
    return tuple(reversed(counts))


class _Search:
    """Simulations of splits, cached, scored by (excess memory, makespan, spread)."""

    def __init__(self, model, hardware, schedule, limit):
        self.model, self.hw, self.schedule, self.limit = model, hardware, schedule, limit
        self.times = model.layer_times(hardware)
        self.total = self.times.sum(axis=1)
        self.cache = {}

    def evaluate(self, split):
        split = tuple(int(c) for c in split)
        if split not in self.cache:
            costs = self.model.costs(split, self.hw, times=self.times)
            net = self.model.network(split, self.hw)
            res = simulate(self.schedule, costs, net)
            mem = float((res.peak_activation + res.static_memory).max())
            excess = 0.0 if _fits(mem, self.limit) else mem - self.limit
            stage_t = self.model._stage_sums(self.total, split)
            # Round the makespan so float noise does not count as a gain.
            key = (excess, float(f"{res.makespan:.12g}"), float(np.sum(stage_t ** 2)))
            self.cache[split] = (key, costs, net, res, mem)
        return self.cache[split]

    def key(self, split):
        return self.evaluate(split)[0]

    def local(self, split, key=None, max_evals=3000):
        """Best-improvement moves of layers between stages: one layer between
        neighbours, then one layer between any two stages (which shifts every
        boundary in between), then two layers between any two stages."""
        key = key or self.key
        best, best_key = tuple(split), key(split)
        S = len(best)
        while len(self.cache) < max_evals:
            improved = False
            for far, n in ((False, 1), (True, 1), (None, 2)):
                moves = []
                for i in range(S):
                    for j in range(S):
                        if i == j or best[i] <= n or (far is not None and (abs(i - j) == 1) == far):
                            continue
                        cand = list(best)
                        cand[i] -= n
                        cand[j] += n
                        moves.append(tuple(cand))
                top = min(moves, key=key, default=None)
                if top is not None and key(top) < best_key:
                    best, best_key, improved = top, key(top), True
                    break
            if not improved:
                break
        return best


def _stage_inflight(schedule):
    """Per stage, the most microbatches whose activation it holds at once (its
    device's peak with a unit activation on that stage alone)."""
    S = schedule.stages
    out = np.zeros(S)
    for s in range(S):
        act = np.zeros(S)
        act[s] = 1.0
        res = simulate(schedule, Costs(f=np.ones(S), b=np.ones(S), w=np.ones(S),
                                       activation=act, activation_w=0.0, weights=0.0))
        out[s] = res.peak_activation.max()
    return out


@tier.compiled()  # many simulations: compile at once, no interpreted budget
def partition(model: Model, devices: int, chunks: int | None = None, schedule: str = "1f1b",
              hardware: Hardware | None = None, microbatches: int | None = None,
              memory_limit: float | None = None, max_evals: int = 3000, **options) -> Plan:
    """Layers per stage that minimise a schedule's simulated iteration time.

    Every stage gets a contiguous range of at least one layer. The
    objective is the makespan of ``pc.simulate(schedule, costs, network)``
    with the costs and network of the split (:meth:`Model.costs`,
    :meth:`Model.network`), subject to every device's peak activation plus
    weights (from the same simulation) within ``memory_limit``.

    Search: a bottleneck dynamic program over contiguous ranges (minimise
    the largest stage time F+B+W), once free and once with a conservative
    memory bound (each stage's in-flight microbatches from the schedule,
    times its activation, plus its weights, within the device's limit shared
    equally among the stages it holds); the uniform split; then a local
    search moving one or two layers between two stages at a
    time and re-simulating (from each of these starts; the best end wins).
    Only strict improvements are taken, so a split already optimal (the
    equal split of equal layers) is returned as is. The result is a local
    optimum, not a proven one.

    Parameters
    ----------
    model : Model
    devices : int
        Pipeline devices p.
    chunks : int, optional
        Stages per device for the interleaved families (family default
        when None; the V families take 2).
    schedule : str, default "1f1b"
        A family name of :func:`pipecore.build`.
    hardware : Hardware, optional
        Defaults to ``Hardware.preset("h100-nvlink")``.
    microbatches : int, optional
        Defaults to ``4 * devices``.
    memory_limit : float, optional
        Bytes per device; defaults to ``hardware.hbm_bytes``; ``math.inf``
        for none.
    max_evals : int, default 3000
        Most splits the local search simulates.
    **options
        Family options passed to :func:`pipecore.build`.

    Returns
    -------
    Plan

    Raises
    ------
    PartitionError
        If no split the search finds fits the limit; ``smallest_memory``
        says the least per-device memory it found.
    ValueError
        For a bad model, hardware, shape or limit, or a model with fewer
        layers (or blocks) than the schedule has stages.
    """
    if not isinstance(model, Model):
        raise InputError(f"'model' must be a pipecore Model (got {type(model).__name__})")
    if hardware is None:
        hardware = Hardware.preset("h100-nvlink")
    if not isinstance(hardware, Hardware):
        raise InputError(f"'hardware' must be a pipecore.model.Hardware (got {type(hardware).__name__})")
    devices = check_int("devices", devices, minimum=1)
    if microbatches is None:
        microbatches = 4 * devices
    microbatches = check_int("microbatches", microbatches, minimum=1)
    max_evals = check_int("max_evals", max_evals, minimum=1)
    limit = hardware.hbm_bytes if memory_limit is None else memory_limit
    if isinstance(limit, bool) or not isinstance(limit, (int, float, np.integer, np.floating)) \
            or math.isnan(limit) or limit <= 0:
        raise InputError(f"'memory_limit' must be a number of bytes > 0 (got {memory_limit!r})")
    limit = float(limit)
    family(schedule)  # a clear error for an unknown name before anything else
    sched = build(schedule, devices, microbatches, chunks=chunks, **options)
    S = sched.stages
    if len(model) < S:
        raise InputError(f"the model has {len(model)} layers but {sched.name!r} on {devices} devices "
                         f"has {S} stages; every stage needs at least one layer")

    search = _Search(model, hardware, sched, limit)
    uniform = uniform_split(model, S)
    starts = [uniform]
    free = _bottleneck_dp(search.total, S)
    starts.append(free)
    if math.isfinite(limit):
        inflight = _stage_inflight(sched)
        per_device = np.bincount(sched.placement, minlength=devices)
        share = np.array([limit / per_device[d] for d in sched.placement])
        pa = np.concatenate(([0.0], np.cumsum(model._arrays["activation"])))
        pw = np.concatenate(([0.0], np.cumsum(model._arrays["param_bytes"])))
        # The bound is >= the true peak: each stage at its own worst moment.
        bounded = _bottleneck_dp(search.total, S, lambda s, i, j: _fits(
            inflight[s] * (pa[j] - pa[i]) + (pw[j] - pw[i]), share[s]))
        if bounded is not None:
            starts.append(bounded)
    # A local search from each distinct start: on V placements the start
    # matters (one move at a time cannot cross some plateaus).
    ends = [search.local(s, max_evals=max_evals) for s in dict.fromkeys(starts)]
    best = min(ends, key=search.key)
    key, costs, net, res, mem = search.evaluate(best)
    if key[0] > 0:
        # Nothing fits: find how little memory a split can need, to say so.
        least = search.local(best, key=lambda c: (search.evaluate(c)[4], search.key(c)[1]),
                             max_evals=max_evals + len(search.cache))
        smallest = min(search.evaluate(least)[4], min(v[4] for v in search.cache.values()))
        raise PartitionError(
            f"no split of {model.name!r} fits {limit / 1e9:.3f} GB per device with "
            f"{sched.name!r} on {devices} devices and {microbatches} microbatches; the least "
            f"memory found is {smallest / 1e9:.3f} GB per device ({smallest:.6g} bytes): raise "
            f"memory_limit, use more devices or fewer in-flight microbatches", smallest, limit)
    uni = search.evaluate(uniform)[3]
    return Plan(model=model, hardware=hardware, schedule=sched, layers=best, costs=costs, network=net,
                result=res, uniform_layers=uniform, uniform=uni, memory_limit=limit,
                evaluations=len(search.cache))


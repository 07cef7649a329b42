"""Fit pipecore costs to torch.profiler traces of a pipelined run.

:func:`from_profile` reads the per-rank traces with :mod:`pipecore.bindings._trace`
and fits per-stage compute times, the runtime's per-op overhead and the network
to them; :class:`Profile` holds the fit and predicts other schedules with it.
Part of :mod:`pipecore.bindings.torch`, which re-exports both. Needs no torch.
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field

import numpy as np

from pipecore.core.costs import Costs, Network
from pipecore.core.ops import InputError
from pipecore.core.schedule import Schedule

from ._trace import RUN_FILE, _load, _parse_rank, _paths, _rank_of, _subs

__all__ = ["Profile", "from_profile", "RUN_FILE"]


@dataclass
class Profile:
    """What a profiled pipelined run tells pipecore.

    Attributes
    ----------
    costs : pipecore.Costs
        Per-stage ``f``, ``b`` (backward input, I), ``w`` (backward weight)
        and ``bw`` (fused backward, torch's B) in seconds, and the per-op
        ``overhead``. A kind the run did not execute is estimated (see
        :func:`from_profile`).
    network : pipecore.Network
        ``bytes`` per transfer (median activation size), ``latency`` and
        ``bandwidth`` fitted to the send operators' durations and sizes.
    schedule : pipecore.Schedule
        The action order each rank ran, as a pipecore schedule.
    ranks, stages, microbatches : int
    step_times : list of float
        Each profiled step's time in seconds (earliest start to latest end
        over ranks).
    measured : float
        Median of ``step_times``.
    labels : dict
        Count of each pipelining action kind found.
    cpus : int or None
        CPUs of the machine that ran the profiled run, from the
        ``pipecore-run.json`` that ``run-torch --profile`` writes beside
        the traces (None without it).
    dilation : dict
        ``{(stage, kind): factor}``: how much longer each compute kind took
        in the profiled steps than in the same run's unprofiled reference
        steps (``pipecore-run.json``'s ``op_seconds``); the costs were
        divided by it. Empty when no reference steps were recorded or
        ``from_profile(reference=False)``.
    reference_times : list of float
        The unprofiled reference steps' times in seconds (from
        ``pipecore-run.json``), when the costs were corrected with them:
        what a prediction from these costs should match.
    """

    costs: Costs
    network: Network
    schedule: Schedule
    ranks: int
    stages: int
    microbatches: int
    step_times: list
    measured: float
    labels: dict = field(default_factory=dict)
    cpus: int | None = None
    dilation: dict = field(default_factory=dict)
    reference_times: list = field(default_factory=list)

    def costs_for(self, stages: int) -> Costs:
        """The profile's costs resampled to another number of stages.

        The model's per-stage work is spread evenly over each profiled
        stage's share of the model and integrated over the new stages'
        shares (an embedding on stage 0 stays near the front).

        Parameters
        ----------
        stages : int
            Stages of the schedule to predict.

        Returns
        -------
        pipecore.Costs
            Per-stage vectors of length ``stages``; the same overhead.

        Raises
        ------
        ValueError
            If ``stages`` is below 1.
        """
        if isinstance(stages, bool) or not isinstance(stages, (int, np.integer)) or stages < 1:
            raise InputError(f"'stages' must be an int >= 1 (got {stages!r})")
        if stages == self.stages:
            return self.costs
        c = self.costs
        out = {}
        for name in ("f", "b", "w", "bw"):
            v = np.asarray(getattr(c, name), dtype=float)
            cum = np.concatenate([[0.0], np.cumsum(v)])
            x = np.linspace(0.0, 1.0, self.stages + 1)
            edges = np.interp(np.linspace(0.0, 1.0, stages + 1), x, cum)
            out[name] = np.diff(edges)
        return Costs(**out, comm=c.comm, overhead=c.overhead, fb_factor=c.fb_factor,
                     activation=c.activation, activation_w=c.activation_w, weights=c.weights)

    def predict(self, schedule, microbatches: int | None = None, chunks: int | None = None):
        """Predicted step time (seconds) of a schedule on the profiled setup.

        Parameters
        ----------
        schedule : str or pipecore.Schedule
            A family name (built for the profile's ranks and microbatches)
            or a schedule with the profile's number of ranks.
        microbatches : int, optional
            Default: the profiled run's.
        chunks : int, optional
            Chunks per rank for families that take them.

        Returns
        -------
        pipecore.Result
            Its ``makespan`` is the predicted step time.

        Raises
        ------
        ValueError
            If the family cannot build this shape, or the schedule's ranks
            differ from the profile's.
        """
        from pipecore.core.simulate import simulate
        from pipecore.schedules.registry import build

        m = self.microbatches if microbatches is None else microbatches
        if isinstance(schedule, str):
            sched = build(schedule, self.ranks, m, chunks=chunks)
        elif isinstance(schedule, Schedule):
            sched = schedule
        else:
            raise InputError(f"'schedule' must be a family name or a pipecore.Schedule "
                             f"(got {type(schedule).__name__})")
        if sched.devices != self.ranks:
            raise InputError(f"the schedule has {sched.devices} devices but the profile "
                             f"{self.ranks} ranks")
        return simulate(sched, self.costs_for(sched.stages), self.network)


def _quantile(values, q):
    return float(np.quantile(values, q)) if values else 0.0


def _median(values, default=0.0):
    return statistics.median(values) if values else default


def from_profile(path_or_paths, sends: str = "occupy", reference: bool = True) -> Profile:
    """Fit pipecore costs to torch.profiler traces of a pipelined run.

    Parameters
    ----------
    path_or_paths : str, os.PathLike or sequence of them
        A folder of per-rank Chrome (Kineto JSON) traces, or the files. A
        file's rank is its ``distributedInfo.rank`` (torch writes it), else
        the ``rankN`` in its name, else its position.
    sends : {"occupy", "wait"}
        How a send's time counts. ``"occupy"`` (default): all of it is the
        sending rank's own time and goes into ``overhead`` (in gloo traces
        a send is often held for milliseconds, on the peer or on the
        machine's cores; pipecore's transfers never hold the sender, and
        this is the closest its model gets). ``"wait"``: only the rank's
        25th percentile of its send postings counts, the rest is taken as
        waiting on the peer.
    reference : bool
        When the ``pipecore-run.json`` beside the traces holds compute
        times of unprofiled reference steps of the same run (``pt.run``
        with 5 or more steps and ``profile``), divide each stage's compute
        kind by how much longer the profiled steps took (the profiler's
        cost per recorded operator; ``Profile.dilation``). False: keep the
        traces' times.

    Returns
    -------
    Profile
        Per stage, ``f``, ``b`` (I), ``w`` (W) and ``bw`` (fused B) are the
        means over microbatches and steps of each action's compute time
        (its first operator's start to its end; the receive's wait comes
        before). A run with only fused backwards gets ``b`` and ``w`` as
        half of ``bw`` each; a run with only split ones gets ``bw = b + w``.
        ``overhead`` is each rank's time in a step outside compute and
        waits on peers, divided by its compute actions, median over steps
        and ranks: the gaps between actions, the per-stage actions
        (UNSHARD, RESHARD, REDUCE_GRAD), and for every posting of a send
        or receive and every compute action's lead-in, the rank's 25th
        percentile of those (gloo's posting blocks while the peer is not
        ready, which is waiting, not overhead). The network's ``latency`` and ``bandwidth`` are a
        least-squares line through the send operators' (bytes, duration);
        with one size, latency is their median and bandwidth infinite.

    Raises
    ------
    ValueError
        Naming the file and rank: a file that is not complete JSON
        (truncated), a trace without pipelining labels, a rank missing
        from the set (by ``world_size`` or a gap in the numbers), two
        files of one rank, or a stage without a forward or a backward.
    """
    from pipecore.core.schedule import from_actions

    if sends not in ("occupy", "wait"):
        raise InputError(f"from_profile: 'sends' must be 'occupy' or 'wait' (got {sends!r})")
    if not isinstance(reference, (bool, np.bool_)):
        raise InputError(f"from_profile: 'reference' must be True or False (got {reference!r})")
    occupy = sends == "occupy"
    files = _paths(path_or_paths)
    traces = {}
    world = None
    for i, path in enumerate(files):
        data = _load(path)
        rank, size = _rank_of(path, data, i)
        if size is not None:
            world = size
        if rank in traces:
            raise InputError(f"from_profile: {path} and {traces[rank].path} are both rank {rank}")
        traces[rank] = _parse_rank(path, data, rank)
    expected = world if world is not None else max(traces) + 1
    missing = sorted(set(range(expected)) - set(traces))
    if missing:
        raise InputError(f"from_profile: no trace for rank(s) {missing} (the run has {expected} "
                         f"ranks; found {sorted(traces)} in {', '.join(str(f) for f in files)})")
    ranks = expected
    n_steps = min(len(t.steps) for t in traces.values())
    samples: dict = {}
    overhead = []
    stage_rank: dict = {}
    microbatches = 0
    counts: dict = {}
    pairs: list = []
    for t in traces.values():
        # Posting a send or receive, and the start of a compute action, can block on the
        # peer (gloo); their unblocked cost is a low quantile over the rank's actions.
        post = [b - a for k in range(n_steps) for _n, _s, kind, _m, a, b, _c in t.steps[k]
                if kind in ("SEND_F", "RECV_F", "SEND_B", "RECV_B")]
        pre = [c0 - a for k in range(n_steps) for _n, _s, kind, _m, a, _b, c0 in t.steps[k]
               if kind in ("F", "B", "W", "BW", "FB")]
        post_q = _quantile(post, 0.25)
        pre_q = _quantile(pre, 0.25)
        for k in range(n_steps):
            acts = t.steps[k]
            lo, hi = t.step_spans[k]
            inside = own = 0.0
            n_compute = 0
            for _name, stage, kind, mb, a, b, c0 in acts:
                counts[kind] = counts.get(kind, 0) + (1 if k == 0 else 0)
                inside += b - a
                if kind == "FB":
                    pairs.append((_subs(_name, t.path, t.rank), (b - c0) * 1e-6))
                    for st, _kd, j in pairs[-1][0]:
                        stage_rank[st] = t.rank
                        microbatches = max(microbatches, j + 1)
                    own += pre_q
                    n_compute += 1
                elif kind in ("F", "B", "W", "BW"):
                    samples.setdefault((stage, kind), []).append((b - c0) * 1e-6)
                    own += pre_q
                    n_compute += 1
                    stage_rank[stage] = t.rank
                    microbatches = max(microbatches, mb + 1)
                elif kind == "other" or (kind in ("SEND_F", "SEND_B") and occupy):
                    own += b - a
                else:
                    own += post_q
            if n_compute:
                # Time between actions is the runtime's too (its Python loop, the loss).
                own += max((hi - lo) - inside, 0.0)
                overhead.append(own * 1e-6 / n_compute)
    stages = max(stage_rank) + 1 if stage_rank else 0
    info = _run_file(files)
    times = _op_seconds(info) if reference else {}
    dilation = {key: prof / ref for key, (prof, ref) in times.items() if key in samples}
    # Means, not medians: a device's busy time is the sum of its ops, and op times
    # skew long (the medians ran low against the same run's unprofiled steps).
    med = {key: statistics.fmean(v) / dilation.get(key, 1.0) for key, v in samples.items()}
    # A kind that also ran inside overlapped pairs has few calls of its own in the
    # traces; the run file's unprofiled mean covers every call, pairs included.
    for key in {(st, kd) for subs, _dur in pairs for st, kd, _j in subs}:
        if key in times:
            med[key] = times[key][1]
    if times:
        # A pair's two calls ran back to back; its time shrinks by their combined factor.
        def undilated(subs, dur):
            known = [times[(st, kd)] for st, kd, _j in subs if (st, kd) in times]
            if len(known) != len(subs):
                return dur
            return dur * sum(r for _p, r in known) / sum(p for p, _r in known)
        pairs = [(subs, undilated(subs, dur)) for subs, dur in pairs]
    f, b, w, bw = [], [], [], []
    for s in range(stages):
        has_split = (s, "B") in med or (s, "W") in med
        if (s, "F") not in med or not ((s, "BW") in med or has_split):
            raise InputError(f"from_profile: stage {s} (rank {stage_rank.get(s, '?')}) has no "
                             f"{'forward' if (s, 'F') not in med else 'backward'} action in the "
                             f"traces")
        f.append(med[(s, "F")])
        if has_split:
            b.append(med.get((s, "B"), 0.0))
            w.append(med.get((s, "W"), 0.0))
        if (s, "BW") in med:
            bw.append(med[(s, "BW")])
            if not has_split:
                b.append(bw[-1] / 2)
                w.append(bw[-1] / 2)
        else:
            bw.append(b[-1] + w[-1])
    o = _median(overhead)
    fb_factor = 1.0
    if pairs:
        # A pair runs as one unit of (F + o + backward + o) * fb_factor (core.simulate):
        # pairs whose backward also ran alone give fb_factor; then a fused backward
        # that only ran in pairs is solved from its pairs.
        solo = {(st, kd) for st, kd in med}
        ratios = [(dur + o) / (f[sf] + (bw[sb] if kb == "BW" else b[sb]) + 2 * o)
                  for ((sf, _kf, _mf), (sb, kb, _mb)), dur in pairs if (sb, kb) in solo]
        if not ratios:
            raise InputError("from_profile: every overlapped F&B action's backward ran only "
                             "in pairs; its time and the overlap cannot be told apart")
        fb_factor = statistics.median(ratios)
        only: dict = {}
        for ((sf, _kf, _mf), (sb, kb, _mb)), dur in pairs:
            if kb == "BW" and (sb, "BW") not in solo:
                only.setdefault(sb, []).append((dur + o) / fb_factor - f[sf] - 2 * o)
        for st, vals in only.items():
            bw[st] = max(statistics.median(vals), 0.0)
    sends = [x for t in traces.values() for x in t.sends]
    nbytes = _median([x[0] for x in sends], 0.0)
    latency, bandwidth = _fit_link(sends)
    costs = Costs(f=np.array(f), b=np.array(b), w=np.array(w), bw=np.array(bw),
                  overhead=o, fb_factor=fb_factor)
    network = Network(bytes=nbytes, bandwidth=bandwidth, latency=latency)
    programs = {t.rank: [_action(entry, t) for entry in t.steps[0]
                         if entry[2] in ("F", "B", "W", "BW", "FB")] for t in traces.values()}
    sched = from_actions({r: programs[r] for r in range(ranks)}, name="profiled")
    step_times = []
    for k in range(n_steps):
        lo = min(t.step_spans[k][0] for t in traces.values())
        hi = max(t.step_spans[k][1] for t in traces.values())
        step_times.append((hi - lo) * 1e-6)
    ref_times = []
    if dilation:  # only with a run file
        all_times, idx = info.get("step_times"), info.get("reference_steps")
        if isinstance(all_times, list) and isinstance(idx, list):
            ref_times = [float(all_times[i]) for i in idx
                         if isinstance(i, int) and 0 <= i < len(all_times)
                         and isinstance(all_times[i], (int, float))]
    return Profile(costs, network, sched, ranks, stages, microbatches, step_times,
                   statistics.median(step_times), counts, _run_cpus(info), dilation, ref_times)


def _run_file(files):
    """The run file beside the traces as a dict, or None (missing or damaged)."""
    folders = {f.parent for f in files}
    run_file = folders.pop() / RUN_FILE if len(folders) == 1 else None
    if run_file is None or not run_file.is_file():
        return None
    try:
        info = json.loads(run_file.read_text())
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def _op_seconds(info):
    """``{(stage, kind): (profiled s, reference s)}`` from a run file's op_seconds."""
    out = {}
    table = info.get("op_seconds") if info else None
    if not isinstance(table, dict):
        return out
    for key, sides in table.items():
        try:
            stage, kind = key.split(",")
            prof, ref = float(sides["profiled"]), float(sides["reference"])
            stage = int(stage)
        except (AttributeError, KeyError, TypeError, ValueError):
            continue  # a hand-edited entry only loses its correction
        if prof > 0 and ref > 0 and math.isfinite(prof) and math.isfinite(ref):
            out[(stage, kind)] = (prof, ref)
    return out


def _run_cpus(info):
    """The CPUs a run file (as :func:`_run_file` read it) records, or None."""
    cpus = info.get("cpus") if info else None  # a damaged file costs the CPU check only
    return cpus if isinstance(cpus, int) and not isinstance(cpus, bool) and cpus > 0 else None


def _action(entry, trace):
    """pipecore's action form of a profiled compute action ("0F3", "1BW2", "0F7&7B3")."""
    name, stage, kind, mb = entry[:4]
    if kind == "FB":
        return "&".join(f"{s}{k}{j}" for s, k, j in _subs(name, trace.path, trace.rank))
    return f"{stage}{kind}{mb}"


def _fit_link(sends):
    """Latency and bandwidth (bytes/s) of a line through (bytes, seconds) of the sends."""
    if not sends:
        return 0.0, float("inf")
    x = np.array([s[0] for s in sends])
    y = np.array([s[1] for s in sends]) * 1e-6
    if np.unique(x).size < 2:
        return float(np.median(y)), float("inf")
    slope, icpt = np.polyfit(x, y, 1)
    if slope <= 0:
        return float(np.median(y)), float("inf")
    return max(float(icpt), 0.0), float(1.0 / slope)

"""Read torch.profiler traces of a pipelined run and fit pipecore costs to them.

torch's ``_PipelineScheduleRuntime`` (2.13) wraps every action of a rank in
``record_function("PP:" + str(action))``: ``PP:1F3`` (forward of stage 1,
microbatch 3), ``PP:1I3`` (backward input), ``PP:1W3`` (backward weight),
``PP:1B3`` (fused full backward), ``PP:1SEND_F3`` / ``PP:1RECV_F3`` /
``PP:1SEND_B3`` / ``PP:1RECV_B3`` (posting a send or receive), and
``PP:1UNSHARD``, ``PP:1RESHARD``, ``PP:1REDUCE_GRAD`` once per stage. A
compute action first waits on its posted receive (no profiler event) and
then runs its operators, so its compute time is taken from its first child
operator's start to its end. Steps are ``ProfilerStep#N`` labels (what
``torch.profiler.profile.step()`` writes); a trace without them is one step.
Needs no torch: the traces are JSON.
"""

from __future__ import annotations

import json
import math
import re
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipecore.core.costs import Costs, Network
from pipecore.core.ops import InputError
from pipecore.core.schedule import Schedule

__all__ = ["Profile", "WhatIfRanking", "from_profile", "what_if", "format_what_if", "RUN_FILE",
           "oversubscribed"]

#: Written beside the traces by ``pt.run(profile=...)``: the run's model and shape.
RUN_FILE = "pipecore-run.json"

_LABEL = re.compile(r"^PP:(\d+)(F|I|W|B|SEND_F|RECV_F|SEND_B|RECV_B)(\d+)$")
_OTHER = re.compile(r"^PP:(\d+)?(UNSHARD|RESHARD|REDUCE_GRAD)$")
_OVERLAP = re.compile(r"^PP:\((.*)\)OVERLAP_F_B$")
_SUB = re.compile(r"^(\d+)(F|I|B)(\d+)$")
_STEP = re.compile(r"^ProfilerStep#(\d+)$")
_RANK_FILE = re.compile(r"rank[_-]?(\d+)", re.IGNORECASE)
_DTYPE_BYTES = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8,
                "int": 4}
# torch action letter -> pipecore kind (torch's B is the fused full backward).
_KIND = {"F": "F", "I": "B", "W": "W", "B": "BW"}


def _paths(path_or_paths):
    if isinstance(path_or_paths, (str, Path)) or hasattr(path_or_paths, "__fspath__"):
        p = Path(path_or_paths)
        if p.is_dir():
            files = sorted(q for q in p.iterdir() if q.name != RUN_FILE
                       and (q.suffix == ".json" or q.name.endswith(".json.gz")))
            if not files:
                raise InputError(f"from_profile: no trace files (*.json) in {p}")
            return files
        if not p.exists():
            raise InputError(f"from_profile: {p} does not exist")
        return [p]
    files = [Path(q) for q in path_or_paths]
    if not files:
        raise InputError("from_profile: no trace files given")
    for q in files:
        if not q.exists():
            raise InputError(f"from_profile: {q} does not exist")
    return files


def _load(path):
    try:
        if path.name.endswith(".gz"):
            import gzip

            text = gzip.open(path, "rt").read()
        else:
            text = path.read_text()
        data = json.loads(text)
    except (json.JSONDecodeError, EOFError, OSError, UnicodeDecodeError) as exc:
        raise InputError(f"from_profile: {path} is not a complete JSON trace (truncated or "
                         f"damaged?): {exc}") from None
    if isinstance(data, list):
        data = {"traceEvents": data}
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise InputError(f"from_profile: {path} has no 'traceEvents' list (not a Chrome/Kineto "
                         f"trace)")
    return data


def _rank_of(path, data, index):
    info = data.get("distributedInfo") or {}
    if not isinstance(info, dict):
        raise InputError(f"from_profile: {path} has a 'distributedInfo' that is not an object "
                         f"(got {info!r:.40})")
    rank, world = info.get("rank"), info.get("world_size")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
        raise InputError(f"from_profile: {path} has distributedInfo.rank={rank!r}; it must be an "
                         f"int >= 0")
    if world is not None and (isinstance(world, bool) or not isinstance(world, int) or world < 1):
        raise InputError(f"from_profile: {path} has distributedInfo.world_size={world!r}; it "
                         f"must be an int >= 1")
    if rank is not None:
        return rank, world
    m = _RANK_FILE.search(path.name)
    if m:
        return int(m.group(1)), None
    return index, None


def _subs(label, path, rank):
    """The (stage, pipecore kind, microbatch) of an OVERLAP_F_B label's F and backward."""
    parts = _OVERLAP.match(label).group(1).split(";")
    subs = [_SUB.match(x) for x in parts]
    if len(subs) != 2 or None in subs or subs[0].group(2) != "F" or subs[1].group(2) == "F":
        raise InputError(f"from_profile: {path} (rank {rank}) has an overlapped action {label!r} "
                         f"that is not one forward then one backward")
    return [(int(m.group(1)), _KIND[m.group(2)], int(m.group(3))) for m in subs]


def _nbytes(event):
    """Bytes of a send operator's tensor from its recorded shape, or None when the
    trace does not say (a hand-made or damaged event is skipped, not guessed)."""
    args = event.get("args")
    if not isinstance(args, dict):
        return None
    dims, types = args.get("Input Dims"), args.get("Input type")
    if not isinstance(dims, list) or not dims or not isinstance(dims[0], list) or not dims[0]:
        return None
    shape = dims[0][0] if isinstance(dims[0][0], list) else dims[0]
    if not all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in shape):
        return None
    kind = types[0] if isinstance(types, list) and types and isinstance(types[0], str) else "float"
    return float(np.prod(shape)) * _DTYPE_BYTES.get(kind, 4)


@dataclass
class _RankTrace:
    rank: int
    path: Path
    steps: list  # per step: list of (label, stage, kind, mb, start, end, compute_start)
    step_spans: list  # per step: (start, end) in microseconds
    sends: list  # (bytes, duration_us) of c10d send ops


def _timed_events(path, data, rank):
    """Complete events ("ph": "X") with a finite start and a finite duration >= 0."""
    out = []
    for i, e in enumerate(data["traceEvents"]):
        if not (isinstance(e, dict) and e.get("ph") == "X" and "ts" in e and "dur" in e):
            continue
        for key in ("ts", "dur"):
            value = e[key]
            ok = (not isinstance(value, bool) and isinstance(value, (int, float))
                  and math.isfinite(value) and (key == "ts" or value >= 0))
            if not ok:
                rule = "a finite number" if key == "ts" else "a finite number >= 0"
                raise InputError(f"from_profile: {path} (rank {rank}) traceEvents[{i}] "
                                 f"({e.get('name')!r}) has {key}={value!r}; it must be {rule} "
                                 f"(microseconds)")
        out.append(e)
    return out


def _parse_rank(path, data, rank):
    events = _timed_events(path, data, rank)
    labels = [e for e in events if str(e.get("name", "")).startswith("PP:")]
    if not labels:
        raise InputError(f"from_profile: {path} (rank {rank}) has no pipelining labels ('PP:1F0' "
                         f"and the like, which torch's _PipelineScheduleRuntime records); profile "
                         f"the run with torch.profiler around schedule.step()")
    steps = sorted((e for e in events if _STEP.match(str(e.get("name", "")))), key=lambda e: e["ts"])
    spans = ([(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in steps] if steps else
             [(min(float(e["ts"]) for e in labels),
               max(float(e["ts"]) + float(e["dur"]) for e in labels))])
    ops = sorted((e for e in events
                  if not str(e.get("name", "")).startswith(("PP:", "ProfilerStep"))
                  and e.get("cat") != "user_annotation"), key=lambda e: float(e["ts"]))
    op_ts = np.array([float(e["ts"]) for e in ops])
    per_step = [[] for _ in spans]
    for e in sorted(labels, key=lambda e: float(e["ts"])):
        name = e["name"]
        t0, t1 = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        k = next((i for i, (a, b) in enumerate(spans) if a <= t0 <= b), None)
        if k is None:
            continue
        m = _LABEL.match(name)
        if m is None:
            if _OTHER.match(name):
                per_step[k].append((name, -1, "other", -1, t0, t1, t1))
                continue
            if _OVERLAP.match(name):
                _subs(name, path, rank)  # checks the sub-actions now, with the file named
                i = int(np.searchsorted(op_ts, t0))
                first = float(op_ts[i]) if i < op_ts.size and op_ts[i] < t1 else t1
                per_step[k].append((name, -1, "FB", -1, t0, t1, first))
                continue
            raise InputError(f"from_profile: {path} (rank {rank}) has an unknown pipelining label "
                             f"{name!r}")
        stage, act, mb = int(m.group(1)), m.group(2), int(m.group(3))
        kind = _KIND.get(act, act)
        # Compute starts at the first operator inside the label (before it: the receive's wait).
        i = int(np.searchsorted(op_ts, t0))
        first = float(op_ts[i]) if i < op_ts.size and op_ts[i] < t1 else t1
        per_step[k].append((name, stage, kind, mb, t0, t1, first if kind in _KIND.values() else t0))
    sends = []
    for e in ops:
        if e.get("name") in ("c10d::send", "c10d::send_"):
            nb = _nbytes(e)
            if nb is not None:
                sends.append((nb, float(e["dur"])))
    return _RankTrace(rank, path, per_step, spans, sends)


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


def oversubscribed(ranks: int, cpus: int, whose: str = "the run's machine") -> str | None:
    """A warning when a run has more ranks than CPUs, else None.

    Parameters
    ----------
    ranks : int
        Processes of the run (one per rank).
    cpus : int
        CPUs they shared.
    whose : str
        Whose CPUs these are, for the text (e.g. ``"this machine"``).

    Returns
    -------
    str or None
    """
    if ranks <= cpus:
        return None
    def plural(n, word):
        return f"{n} {word}{'' if n == 1 else 's'}"

    return (f"{plural(ranks, 'rank')} on {plural(cpus, 'CPU')} ({whose}): the ranks took turns "
            f"on the cores, so the measured times are dominated by the operating system's "
            f"scheduler, which pipecore does not model (its devices all run at once); run at "
            f"most {plural(cpus, 'rank')} here, or on a machine with at least {plural(ranks, 'CPU')}")


class WhatIfRanking(list):
    """:func:`what_if`'s rows (a list, fastest first) and what the ranking rests on.

    Attributes
    ----------
    left_out : list of dict
        Families asked for but not ranked: ``schedule`` and ``reason``.
    profiled : dict
        The profiled schedule's own prediction: ``schedule`` (the family
        whose order it is, or ``"profiled"``), ``microbatches``,
        ``predicted`` and ``measured`` (median step), both in seconds,
        ``error`` (``predicted / measured - 1``: negative when the
        prediction is low), ``steps`` (how many steps the median is of)
        and ``measured_steps``: ``"reference"`` when the costs were
        corrected with the run's unprofiled steps (then those are
        measured), else ``"profiled"``.
    warnings : list of str
        What makes the measured times untrustworthy (ranks beyond CPUs).
    """

    def __init__(self, rows=(), left_out=(), profiled=None, warnings=()):
        super().__init__(rows)
        self.left_out = list(left_out)
        self.profiled = profiled
        self.warnings = list(warnings)


def _first_line(exc):
    return str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__


def what_if(profile, schedules="all", microbatches: int | None = None) -> WhatIfRanking:
    """Every family that builds on the profiled setup, ranked by predicted step time.

    Parameters
    ----------
    profile : Profile or str or os.PathLike
        A :class:`Profile`, or what :func:`from_profile` reads.
    schedules : "all" or sequence of str
        Family names; ``"all"`` is every registered family.
    microbatches : int, optional
        Default: the profiled run's.

    Returns
    -------
    WhatIfRanking
        A list of rows, fastest first: ``schedule``, ``stages``,
        ``predicted`` (s), ``peak_activation`` (worst device, in units of
        one device share's activation for one microbatch; the profile has
        no memory sizes) and ``profiled`` (True for the schedule family
        that ran). Its ``left_out`` names every family asked for that is
        not ranked and why: it cannot build the shape, or it replicates a
        stage on two ranks (``chimera``, ``dualpipe``, ``bitpipe``:
        torch's runtime runs every stage on exactly one rank). Its
        ``profiled`` holds the profiled schedule's own prediction beside
        its measured step, and ``warnings`` a warning when the run had more
        ranks than CPUs (the run file's count; without one, this
        machine's).

    Raises
    ------
    ValueError
        As :func:`from_profile`, for an unknown family name, or if no
        family builds the shape.
    """
    from pipecore.core.cpus import local_cpus
    from pipecore.schedules.registry import family
    from pipecore.schedules.registry import schedules as all_names

    prof = profile if isinstance(profile, Profile) else from_profile(profile)
    names = list(all_names()) if schedules == "all" else list(schedules)
    for n in names:
        family(n)  # unknown names fail here, with the list of families
    m = prof.microbatches if microbatches is None else microbatches
    rows, left_out = [], []
    ran = prof.schedule.to_actions()
    ran_family = None
    for n in names:
        try:
            res = prof.predict(n, microbatches=m)
        except ValueError as exc:
            left_out.append({"schedule": n, "reason": f"does not build {prof.ranks} ranks x {m} "
                                                      f"microbatches: {_first_line(exc)}"})
            continue
        shared = [(s, devs) for s, devs in enumerate(res.schedule.stage_devices) if len(devs) > 1]
        if shared:
            s, devs = shared[0]
            left_out.append({"schedule": n, "reason": (
                f"runs stage {s} on ranks {', '.join(str(int(d)) for d in devs)} (a replicated "
                f"stage); torch's runtime runs every stage on exactly one rank")})
            continue
        same = res.schedule.to_actions() == ran
        if same and m == prof.microbatches and ran_family is None:
            ran_family = n
        rows.append({"schedule": n, "stages": res.schedule.stages, "predicted": res.makespan,
                     "peak_activation": float(np.max(res.peak_activation)), "profiled": same})
    if not rows:
        why = "; ".join(f"{r['schedule']}: {r['reason']}" for r in left_out)
        raise InputError(f"no family builds {prof.ranks} ranks and {m} microbatches ({why})")
    rows.sort(key=lambda r: r["predicted"])
    own = prof.predict(prof.schedule).makespan
    # Costs without the profiler's share are compared with the steps run without it.
    ref = prof.reference_times
    measured = statistics.median(ref) if ref else prof.measured
    profiled = {"schedule": ran_family or "profiled", "microbatches": prof.microbatches,
                "predicted": own, "measured": measured, "error": own / measured - 1,
                "steps": len(ref or prof.step_times),
                "measured_steps": "reference" if prof.reference_times else "profiled"}
    if prof.cpus is not None:
        warning = oversubscribed(prof.ranks, prof.cpus)
    else:
        warning = oversubscribed(prof.ranks, local_cpus(),
                                 "this machine's; the traces do not record the run's")
    return WhatIfRanking(rows, left_out, profiled, [warning] if warning else [])


def format_what_if(rows, measured=None) -> str:
    """The what-if table (milliseconds), with measured times when given.

    Parameters
    ----------
    rows : list of dict
        From :func:`what_if`. When it is a :class:`WhatIfRanking`, the text goes
        on with the profiled schedule's own prediction against its measured
        step, the families left out and why, and the warnings.
    measured : dict of str to float, optional
        Measured step times (s) by schedule, e.g. from ``--check``.

    Returns
    -------
    str

    Raises
    ------
    KeyError
        If a row lacks a field.
    """
    measured = measured or {}
    head = f"{'#':>4} {'schedule':<17} {'stages':>6} {'predicted ms':>12} {'peak act':>8}"
    if measured:
        head += f" {'measured ms':>11} {'error':>7}"
    lines = [head]
    for i, r in enumerate(rows, 1):
        line = (f"{i:>4} {r['schedule'] + (' *' if r['profiled'] else ''):<17} {r['stages']:>6} "
                f"{r['predicted'] * 1e3:>12.2f} {r['peak_activation']:>8.2f}")
        if r["schedule"] in measured:
            got = measured[r["schedule"]]
            line += f" {got * 1e3:>11.2f} {r['predicted'] / got - 1:>+7.1%}"
        lines.append(line)
    lines.append("* the profiled schedule; peak act: activations held at once on the worst "
                 "device, in microbatch shares" + ("; error: predicted / measured - 1"
                                                   if measured else ""))
    own = getattr(rows, "profiled", None)
    if own:
        lines.append(f"profiled schedule ({own['schedule']}, {own['microbatches']} microbatches): "
                     f"predicted {own['predicted'] * 1e3:.2f} ms, measured "
                     f"{own['measured'] * 1e3:.2f} ms (median of {own['steps']} "
                     f"{'unprofiled reference' if own.get('measured_steps') == 'reference' else 'profiled'}"
                     f" steps): "
                     f"{_error_text(own['error'])}")
    left = getattr(rows, "left_out", None)
    if left:
        lines.append(f"left out ({len(left)}):")
        width = max(len(r["schedule"]) for r in left)
        lines += [f"  {r['schedule']:<{width}}  {r['reason']}" for r in left]
    for w in getattr(rows, "warnings", ()):
        lines.append(f"warning: {w}")
    return "\n".join(lines)


def _error_text(error):
    """A signed relative error in words: "prediction -55.3% (55.3% low)"."""
    if abs(error) < 5e-4:
        return "prediction within 0.1% of the measurement"
    return f"prediction {error:+.1%} ({abs(error):.1%} {'low' if error < 0 else 'high'})"

"""Read torch.profiler traces of a pipelined run: files, ranks, steps and actions.

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
:mod:`pipecore.bindings._profile` fits costs to what this module reads. Needs
no torch: the traces are JSON.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipecore.core.ops import InputError

__all__ = ["RUN_FILE"]

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

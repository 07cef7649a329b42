"""Chrome Trace Event Format JSON of a result, viewable in Perfetto
(https://ui.perfetto.dev) or ``chrome://tracing``.

Compute, links and the critical path are three processes of the trace, so
the viewer groups their tracks into collapsible sections.
"""

from __future__ import annotations

import json
import math
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..core.ops import InputError
from ..core.result import plug
from .columns import (
    MEMORY_COLUMNS,
    TRANSFER_COLUMNS,
    PathLike,
    critical_rows,
    critical_table,
    floats,
    ints,
    op_arrays,
    require_columns,
    strings,
)

__all__ = ["write_chrome_trace"]

# Chrome trace process ids: compute tracks and link tracks live in separate
# processes so Perfetto groups them into two collapsible sections.
_PID_COMPUTE = 0
_PID_LINKS = 1
_PID_CRITICAL = 2  # the critical path's segments, one track (write_chrome_trace(critical=True))


def write_chrome_trace(result: Any, path: PathLike, time_scale: float = 1.0,
                       critical: bool = False) -> Path:
    """Write a result as Chrome Trace Event Format JSON.

    The file opens in Perfetto (https://ui.perfetto.dev) and
    ``chrome://tracing``. Process 0 ("compute") has one thread per device
    holding a complete ("X") event per op, plus one activation-memory counter
    track per device ("activation d3"). Process 1 ("links") has one thread per
    directed link ("d0->d1") with one event per transfer spanning ``start`` to
    ``arrival``; transfers that overlap on the same link (possible because the
    link is released before the data lands) get extra threads named
    ``"d0->d1 (2)"``, ``"d0->d1 (3)"``, ... so events nest properly.

    Parameters
    ----------
    result : object
        Simulation result with ``ops``, ``transfers`` and ``memory`` tables
        and a ``devices`` count (see :mod:`pipecore.output.columns`).
    path : str or os.PathLike
        Destination file. Its parent directory must exist.
    time_scale : float, default 1.0
        Factor converting the result's time units to trace microseconds
        (the trace format's unit). For times in milliseconds use 1000.
    critical : bool, default False
        Mark the critical path (:func:`pipecore.critical_path`):
        its ops and transfers get ``"critical": true`` in their args, and a
        third process, "critical path", holds one track with the path's
        segments back to back (op, transfer on its link, latency).

    Returns
    -------
    pathlib.Path
        The JSON trace written (open it in Perfetto or chrome://tracing).

    Raises
    ------
    ValueError
        If ``time_scale`` is not a positive finite number, a table lacks a
        required column, a time or byte value is NaN/infinite, an event
        ends before it starts, or ``critical`` is set for something other
        than a simulation Result.
    OSError
        If the file cannot be written.
    """
    scale = float(time_scale)
    if not (math.isfinite(scale) and scale > 0):
        raise InputError(f"time_scale must be a positive finite number, got {time_scale!r}")

    out = Path(path)
    path_table = critical_table(result) if critical else None
    op_rows, x_rows = critical_rows(path_table)
    events: list[dict[str, Any]] = []
    events.extend(_compute_events(result, scale, op_rows))
    events.extend(_memory_events(result.memory, scale))
    events.extend(_link_events(result.transfers, scale, x_rows))
    if path_table is not None:
        events.extend(_critical_events(path_table, scale))

    doc = {"traceEvents": events, "displayTimeUnit": "ms"}
    with out.open("w", encoding="utf-8") as fh:
        # allow_nan=False is a last line of defence: NaN is not valid JSON.
        json.dump(doc, fh, allow_nan=False, separators=(",", ":"))
    return out


def _check_finite(values: np.ndarray, what: str) -> None:
    """Reject NaN/inf: JSON has no representation for them."""
    if values.size and not np.all(np.isfinite(values)):
        bad = int(np.count_nonzero(~np.isfinite(values)))
        raise InputError(f"{what} contains {bad} non-finite value(s)")


def _check_ordered(lo: np.ndarray, hi: np.ndarray, what: str) -> None:
    """Reject negative durations, which trace viewers refuse or misdraw."""
    if lo.size and np.any(hi < lo):
        bad = int(np.count_nonzero(hi < lo))
        raise InputError(f"{what}: {bad} event(s) end before they start")


def _assign_lanes(
    keys: np.ndarray, start: np.ndarray, end: np.ndarray
) -> np.ndarray:
    """Greedy interval partitioning of events into non-overlapping lanes.

    A link is released at ``finish`` but the data lands at ``arrival``, so two
    transfers on the same link can overlap in ``[start, arrival]``. Complete
    ("X") events on one thread must nest properly, so overlapping transfers
    are spread over extra lanes (extra tids) of the same link.

    Parameters
    ----------
    keys : numpy.ndarray
        Integer link id per event.
    start, end : numpy.ndarray
        Event interval bounds.

    Returns
    -------
    numpy.ndarray
        Lane number (0-based) per event, in the input order.
    """
    lanes = np.zeros(keys.shape[0], dtype=np.int64)
    order = np.lexsort((end, start, keys))
    lane_ends: dict[int, list[float]] = {}
    for i in order.tolist():
        ends = lane_ends.setdefault(int(keys[i]), [])
        s = start[i]
        for lane, last in enumerate(ends):
            if last <= s:
                ends[lane] = end[i]
                lanes[i] = lane
                break
        else:
            ends.append(end[i])
            lanes[i] = len(ends) - 1
    return lanes


def _metadata(pid: int, tid: int, name: str, value: Any) -> dict[str, Any]:
    """A Chrome trace metadata ("M") event."""
    arg = "sort_index" if name.endswith("sort_index") else "name"
    return {"name": name, "ph": "M", "pid": pid, "tid": tid, "args": {arg: value}}


def _process(pid: int, name: str) -> list[dict[str, Any]]:
    """The metadata events that name process *pid* and place it in the track list."""
    return [_metadata(pid, 0, "process_name", name), _metadata(pid, 0, "process_sort_index", pid)]


def _complete(name: str, cat: str, pid: int, tid: int, ts: float, dur: float,
              args: dict[str, Any]) -> dict[str, Any]:
    """A complete ("X") event: *name* on thread *tid* of *pid* from *ts* for *dur*."""
    return {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": args}


def _critical_events(path_table: pa.Table, scale: float) -> list[dict[str, Any]]:
    """Metadata plus one "X" event per critical-path segment, in pid 2."""
    events = _process(_PID_CRITICAL, "critical path")
    events.append(_metadata(_PID_CRITICAL, 0, "thread_name", "critical path"))
    d = path_table.to_pydict()
    for i in range(path_table.num_rows):
        e, kind, stage, mb = d["element"][i], d["kind"][i], d["stage"][i], d["microbatch"][i]
        src, dst = d["device"][i], d["dst_device"][i]
        where = f"d{src}" if e == "op" else f"d{src}->d{dst}"
        name = f"{kind} s{stage} mb{mb}" if e == "op" else f"{e} {kind} s{stage} mb{mb}"
        s, f = d["start"][i], d["finish"][i]
        events.append(_complete(
            f"{name} ({where})", f"critical,{e}", _PID_CRITICAL, 0, s * scale,
            max(f * scale - s * scale, 0.0),
            {"element": e, "device": src, "dst_device": dst, "kind": kind, "stage": stage,
             "microbatch": mb, "row": d["row"][i], "start": s, "finish": f}))
    return events


def _compute_events(result: Any, scale: float,
                    flagged: set[int] = frozenset()) -> list[dict[str, Any]]:
    """Metadata plus one "X" event per op, in pid 0 (the rows in ``flagged`` marked critical)."""
    cols, n_dev = op_arrays(result)
    start, finish = cols.start, cols.finish
    _check_finite(start, "ops.start")
    _check_finite(finish, "ops.finish")
    _check_ordered(start, finish, "ops")

    events = _process(_PID_COMPUTE, "compute")
    for d in range(n_dev):
        events.append(_metadata(_PID_COMPUTE, d, "thread_name", f"device {d}"))
        events.append(_metadata(_PID_COMPUTE, d, "thread_sort_index", d))

    # Scale endpoints separately (rather than the difference) so that an op
    # ending exactly where the next begins does not overlap it by rounding.
    ts = (start * scale).tolist()
    dur = np.maximum(finish * scale - start * scale, 0.0).tolist()
    rows = zip(
        cols.device.tolist(),
        cols.slot.tolist(),
        cols.kind.tolist(),
        cols.stage.tolist(),
        cols.microbatch.tolist(),
        start.tolist(),
        finish.tolist(),
        ts,
        dur,
    )
    for row, (d, slot, kind, stage, mb, s, f, t, du) in enumerate(rows):
        events.append(_complete(
            f"{kind} s{stage} mb{mb}", str(kind), _PID_COMPUTE, d, t, du,
            {"stage": stage, "microbatch": mb, "kind": kind, "slot": slot, "start": s,
             "finish": f}))
        if row in flagged:
            events[-1]["args"]["critical"] = True
    return events


def _memory_events(memory: pa.Table, scale: float) -> list[dict[str, Any]]:
    """One "C" counter event per memory sample, in pid 0."""
    if memory is None or memory.num_rows == 0:
        return []
    name = "activation"
    if name not in memory.column_names and "bytes" in memory.column_names:
        # A table made for the old name (Result.memory's column before the rename).
        warnings.warn("the memory table's column 'bytes' is now called 'activation' (it holds "
                      "activation in the unit of Costs.activation, not bytes); 'bytes' is read "
                      "in this release only", DeprecationWarning, stacklevel=4)
        name = "bytes"
    else:
        require_columns(memory, MEMORY_COLUMNS, "memory")
    time = floats(memory, "time")
    value = floats(memory, name)
    _check_finite(time, "memory.time")
    _check_finite(value, f"memory.{name}")
    return [
        {
            "name": f"activation d{d}",
            "ph": "C",
            "pid": _PID_COMPUTE,
            "tid": d,
            "ts": t,
            "args": {"activation": b},
        }
        for d, t, b in zip(
            ints(memory, "device").tolist(), (time * scale).tolist(), value.tolist()
        )
    ]


def _link_events(transfers: pa.Table, scale: float,
                 flagged: set[int] = frozenset()) -> list[dict[str, Any]]:
    """Metadata plus one "X" event per transfer, in pid 1 (those in ``flagged`` marked critical)."""
    if transfers is None or transfers.num_rows == 0:
        return []
    require_columns(transfers, TRANSFER_COLUMNS, "transfers")
    ready = floats(transfers, "ready")
    start = floats(transfers, "start")
    finish = floats(transfers, "finish")
    arrival = floats(transfers, "arrival")
    for name, arr in (("ready", ready), ("start", start), ("finish", finish), ("arrival", arrival)):
        _check_finite(arr, f"transfers.{name}")
    _check_ordered(start, arrival, "transfers")

    src = ints(transfers, "src_device")
    dst = ints(transfers, "dst_device")
    # Dense id per directed link, ordered by (src, dst) for a tidy track list.
    pairs, link_id = np.unique(np.stack([src, dst], axis=1), axis=0, return_inverse=True)
    link_id = np.asarray(link_id).reshape(-1)
    lanes = _assign_lanes(link_id, start, arrival)

    # tid = position of (link, lane) in sorted order, so tracks appear grouped
    # by link with its overflow lanes right after it.
    tracks, tid = np.unique(np.stack([link_id, lanes], axis=1), axis=0, return_inverse=True)
    tid = np.asarray(tid).reshape(-1)

    events = _process(_PID_LINKS, "links")
    for t, (lid, lane) in enumerate(tracks.tolist()):
        s, d = pairs[lid].tolist()
        label = f"d{s}->d{d}" if lane == 0 else f"d{s}->d{d} ({lane + 1})"
        events.append(_metadata(_PID_LINKS, t, "thread_name", label))
        events.append(_metadata(_PID_LINKS, t, "thread_sort_index", t))

    ts = (start * scale).tolist()
    dur = np.maximum(arrival * scale - start * scale, 0.0).tolist()
    rows = zip(
        tid.tolist(),
        src.tolist(),
        dst.tolist(),
        ints(transfers, "stage").tolist(),
        ints(transfers, "microbatch").tolist(),
        strings(transfers, "kind").tolist(),
        ready.tolist(),
        start.tolist(),
        finish.tolist(),
        arrival.tolist(),
        ts,
        dur,
    )
    for x, (t, s, d, stage, mb, kind, r, st, f, a, tsv, du) in enumerate(rows):
        events.append(_complete(
            f"{kind} s{stage} mb{mb}", "transfer", _PID_LINKS, t, tsv, du,
            {"src_device": s, "dst_device": d, "stage": stage, "microbatch": mb, "kind": kind,
             "ready": r, "start": st, "finish": f, "arrival": a}))
        if x in flagged:
            events[-1]["args"]["critical"] = True
    return events


# Result.write_trace calls this (core cannot import up).
plug("write_trace", write_chrome_trace)

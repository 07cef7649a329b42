"""Output writers for simulation results.

Three formats are supported:

* :func:`write_chrome_trace` -- Chrome Trace Event Format JSON, viewable in
  Perfetto (https://ui.perfetto.dev) or ``chrome://tracing``.
* :func:`write_gantt` -- a static Gantt chart PNG (needs matplotlib, the
  ``pipecore[plot]`` extra).
* :func:`write_parquet` -- the per-op table as Parquet for further analysis.

Every writer takes a result object exposing ``ops``, ``transfers`` and
``memory`` (:class:`pyarrow.Table`; memory's columns are ``device``,
``time`` and ``activation``), ``makespan``, ``devices`` and ``name``,
and returns the :class:`pathlib.Path` it wrote.
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..core.ops import InputError, PipecoreError
from ..core.simulate import plug

__all__ = [
    "MissingDependencyError",
    "write_chrome_trace",
    "write_gantt",
    "write_parquet",
]

PathLike = Union[str, "os.PathLike[str]"]

_OPS_COLUMNS = ("device", "slot", "kind", "stage", "microbatch", "start", "finish")
_TRANSFER_COLUMNS = (
    "src_device",
    "dst_device",
    "stage",
    "microbatch",
    "kind",
    "ready",
    "start",
    "finish",
    "arrival",
)
_MEMORY_COLUMNS = ("device", "time", "activation")

# Fixed kind order so legends and colours are stable from run to run.
_KIND_ORDER = ("F", "B", "W", "BW", "AR", "R", "O", "L")
_KIND_COLOURS = {
    "F": "#4C72B0",  # blue
    "B": "#DD8452",  # orange
    "W": "#55A868",  # green
    "BW": "#8172B3",  # purple
    "AR": "#C44E52",  # red: gradient all-reduce of a replicated stage
    "R": "#937860",  # brown: recompute of a dropped forward
    "O": "#8C8C8C",  # grey: offload issued (no compute time)
    "L": "#8C8C8C",  # grey: load back issued (no compute time)
}
_UNKNOWN_COLOUR = "#8C8C8C"

# Chrome trace process ids: compute tracks and link tracks live in separate
# processes so Perfetto groups them into two collapsible sections.
_PID_COMPUTE = 0
_PID_LINKS = 1
_PID_CRITICAL = 2  # the critical path's segments, one track (write_chrome_trace(critical=True))


class MissingDependencyError(PipecoreError, ImportError):
    """An optional third-party dependency needed by a writer is not installed.

    Subclasses :class:`ImportError` so callers that already guard optional
    imports with ``except ImportError`` keep working.
    """


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


def _require_columns(table: pa.Table, columns: Sequence[str], what: str) -> None:
    """Raise ``ValueError`` naming any of *columns* missing from *table*."""
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise InputError(f"{what} table is missing column(s): {', '.join(missing)}")


def _floats(table: pa.Table, name: str) -> np.ndarray:
    """Column *name* as a float64 numpy array (copying if chunked)."""
    return np.asarray(table.column(name).to_numpy(), dtype=np.float64)


def _ints(table: pa.Table, name: str) -> np.ndarray:
    """Column *name* as an int64 numpy array."""
    return np.asarray(table.column(name).to_numpy(), dtype=np.int64)


def _strings(table: pa.Table, name: str) -> np.ndarray:
    """Column *name* (plain or dictionary-encoded string) as an object array."""
    col = table.column(name)
    # Casting decodes dictionaries chunk by chunk without a Python loop.
    if not pa.types.is_string(col.type):
        col = col.cast(pa.string())
    return np.asarray(col.to_numpy(zero_copy_only=False), dtype=object)


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


# ---------------------------------------------------------------------------
# Chrome trace
# ---------------------------------------------------------------------------


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
        and a ``devices`` count (see module docstring).
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
        The path written.

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
    path_table = _critical_table(result) if critical else None
    op_rows, x_rows = _critical_rows(path_table)
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


def _critical_table(result: Any) -> pa.Table:
    """The critical path of *result*, with a clear error for a non-Result."""
    from ..analysis.critical import critical_path

    return critical_path(result)


def _critical_rows(path_table: pa.Table | None) -> tuple[set[int], set[int]]:
    """Op rows (both rows of an F&B unit) and transfer ids on a critical path."""
    if path_table is None:
        return set(), set()
    d = path_table.select(["element", "row", "partner"]).to_pydict()
    ops = {r for e, r in zip(d["element"], d["row"]) if e == "op"}
    ops |= {q for e, q in zip(d["element"], d["partner"]) if e == "op" and q >= 0}
    transfers = {r for e, r in zip(d["element"], d["row"]) if e != "op"}
    return ops, transfers


def _critical_events(path_table: pa.Table, scale: float) -> list[dict[str, Any]]:
    """Metadata plus one "X" event per critical-path segment, in pid 2."""
    events: list[dict[str, Any]] = [
        _metadata(_PID_CRITICAL, 0, "process_name", "critical path"),
        _metadata(_PID_CRITICAL, 0, "process_sort_index", _PID_CRITICAL),
        _metadata(_PID_CRITICAL, 0, "thread_name", "critical path"),
    ]
    d = path_table.to_pydict()
    for i in range(path_table.num_rows):
        e, kind, stage, mb = d["element"][i], d["kind"][i], d["stage"][i], d["microbatch"][i]
        src, dst = d["device"][i], d["dst_device"][i]
        where = f"d{src}" if e == "op" else f"d{src}->d{dst}"
        name = f"{kind} s{stage} mb{mb}" if e == "op" else f"{e} {kind} s{stage} mb{mb}"
        s, f = d["start"][i], d["finish"][i]
        events.append({
            "name": f"{name} ({where})",
            "cat": f"critical,{e}",
            "ph": "X",
            "pid": _PID_CRITICAL,
            "tid": 0,
            "ts": s * scale,
            "dur": max(f * scale - s * scale, 0.0),
            "args": {"element": e, "device": src, "dst_device": dst, "kind": kind,
                     "stage": stage, "microbatch": mb, "row": d["row"][i], "start": s,
                     "finish": f},
        })
    return events


def _compute_events(result: Any, scale: float,
                    critical_rows: set[int] = frozenset()) -> list[dict[str, Any]]:
    """Metadata plus one "X" event per op, in pid 0 (``critical_rows`` flagged)."""
    ops = result.ops
    _require_columns(ops, _OPS_COLUMNS, "ops")
    start = _floats(ops, "start")
    finish = _floats(ops, "finish")
    _check_finite(start, "ops.start")
    _check_finite(finish, "ops.finish")
    _check_ordered(start, finish, "ops")

    device = _ints(ops, "device")
    # Name every device's track even if it ran nothing, so rows are not
    # silently missing from the viewer.
    n_dev = int(getattr(result, "devices", 0) or 0)
    if device.size:
        n_dev = max(n_dev, int(device.max()) + 1)

    events: list[dict[str, Any]] = [
        _metadata(_PID_COMPUTE, 0, "process_name", "compute"),
        _metadata(_PID_COMPUTE, 0, "process_sort_index", _PID_COMPUTE),
    ]
    for d in range(n_dev):
        events.append(_metadata(_PID_COMPUTE, d, "thread_name", f"device {d}"))
        events.append(_metadata(_PID_COMPUTE, d, "thread_sort_index", d))

    # Scale endpoints separately (rather than the difference) so that an op
    # ending exactly where the next begins does not overlap it by rounding.
    ts = (start * scale).tolist()
    dur = np.maximum(finish * scale - start * scale, 0.0).tolist()
    rows = zip(
        device.tolist(),
        _ints(ops, "slot").tolist(),
        _strings(ops, "kind").tolist(),
        _ints(ops, "stage").tolist(),
        _ints(ops, "microbatch").tolist(),
        start.tolist(),
        finish.tolist(),
        ts,
        dur,
    )
    for row, (d, slot, kind, stage, mb, s, f, t, du) in enumerate(rows):
        events.append(
            {
                "name": f"{kind} s{stage} mb{mb}",
                "cat": str(kind),
                "ph": "X",
                "pid": _PID_COMPUTE,
                "tid": d,
                "ts": t,
                "dur": du,
                "args": {
                    "stage": stage,
                    "microbatch": mb,
                    "kind": kind,
                    "slot": slot,
                    "start": s,
                    "finish": f,
                },
            }
        )
        if row in critical_rows:
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
        _require_columns(memory, _MEMORY_COLUMNS, "memory")
    time = _floats(memory, "time")
    value = _floats(memory, name)
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
            _ints(memory, "device").tolist(), (time * scale).tolist(), value.tolist()
        )
    ]


def _link_events(transfers: pa.Table, scale: float,
                 critical_rows: set[int] = frozenset()) -> list[dict[str, Any]]:
    """Metadata plus one "X" event per transfer, in pid 1 (``critical_rows`` flagged)."""
    if transfers is None or transfers.num_rows == 0:
        return []
    _require_columns(transfers, _TRANSFER_COLUMNS, "transfers")
    ready = _floats(transfers, "ready")
    start = _floats(transfers, "start")
    finish = _floats(transfers, "finish")
    arrival = _floats(transfers, "arrival")
    for name, arr in (("ready", ready), ("start", start), ("finish", finish), ("arrival", arrival)):
        _check_finite(arr, f"transfers.{name}")
    _check_ordered(start, arrival, "transfers")

    src = _ints(transfers, "src_device")
    dst = _ints(transfers, "dst_device")
    # Dense id per directed link, ordered by (src, dst) for a tidy track list.
    pairs, link_id = np.unique(np.stack([src, dst], axis=1), axis=0, return_inverse=True)
    link_id = np.asarray(link_id).reshape(-1)
    lanes = _assign_lanes(link_id, start, arrival)

    # tid = position of (link, lane) in sorted order, so tracks appear grouped
    # by link with its overflow lanes right after it.
    tracks, tid = np.unique(np.stack([link_id, lanes], axis=1), axis=0, return_inverse=True)
    tid = np.asarray(tid).reshape(-1)

    events: list[dict[str, Any]] = [
        _metadata(_PID_LINKS, 0, "process_name", "links"),
        _metadata(_PID_LINKS, 0, "process_sort_index", _PID_LINKS),
    ]
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
        _ints(transfers, "stage").tolist(),
        _ints(transfers, "microbatch").tolist(),
        _strings(transfers, "kind").tolist(),
        ready.tolist(),
        start.tolist(),
        finish.tolist(),
        arrival.tolist(),
        ts,
        dur,
    )
    for x, (t, s, d, stage, mb, kind, r, st, f, a, tsv, du) in enumerate(rows):
        events.append(
            {
                "name": f"{kind} s{stage} mb{mb}",
                "cat": "transfer",
                "ph": "X",
                "pid": _PID_LINKS,
                "tid": t,
                "ts": tsv,
                "dur": du,
                "args": {
                    "src_device": s,
                    "dst_device": d,
                    "stage": stage,
                    "microbatch": mb,
                    "kind": kind,
                    "ready": r,
                    "start": st,
                    "finish": f,
                    "arrival": a,
                },
            }
        )
        if x in critical_rows:
            events[-1]["args"]["critical"] = True
    return events


# ---------------------------------------------------------------------------
# Gantt chart
# ---------------------------------------------------------------------------


def _shade(rgb: np.ndarray, amount: np.ndarray) -> np.ndarray:
    """Blend colours towards white by *amount* (0 = unchanged, 1 = white)."""
    amount = amount[:, None]
    return rgb * (1.0 - amount) + amount


_GANTT_DPI = 100
_AXES_LEFT, _AXES_WIDTH = 0.06, 0.84  # of the figure; the legend goes right of the axes
_AXES_PX = (800.0, 1800.0)  # axes width bounds: the whole chart fits a screen at 100 %
_ROW_IN = 0.4  # inches per device row
_LABEL_PT = (6.0, 8.0)  # microbatch numbers: no smaller (unreadable), no larger
# DejaVu Sans (matplotlib's default font) in ems: every digit advances
# 0.636, and the widest digit's ink is 0.54 wide.
_DIGIT_EM, _INK_EM = 0.64, 0.54


@dataclass
class _GanttLayout:
    """Figure size and which ops get their microbatch number."""

    fig_w: float
    fig_h: float
    label_pt: float
    fits: np.ndarray
    labelable: int

    @property
    def labelled(self) -> int:
        return int(np.count_nonzero(self.fits))

    def note(self) -> str | None:
        """What the title says about labels left out (None: every op has its number)."""
        if self.labelled == self.labelable:
            return None
        if self.labelled == 0:
            return (f"microbatch numbers left out: at this size none fits its box "
                    f"({self.labelable:,} ops)")
        return (f"microbatch numbers shown where they fit: {self.labelled:,} of "
                f"{self.labelable:,} ops")


def _gantt_layout(width: np.ndarray, height: np.ndarray, mb: np.ndarray, labelable: np.ndarray,
                  n_dev: int, x_max: float) -> _GanttLayout:
    """Size the chart and decide, per op, whether its number fits its box.

    ``width`` is each op's length in time units and ``height`` its box's
    height in rows (0.8, or 0.4 for half of an F&B unit). The numbers get
    the largest size in ``_LABEL_PT`` (at most half a bar's height) at
    which nine in ten of them fit axes no wider than ``_AXES_PX``, the
    smallest size when none does; a number is drawn only where its whole
    width (digits at the font's advance, plus a margin) and height fit.
    """
    fig_h = min(max(2.5, _ROW_IN * n_dev + 1.5), 40.0)
    # Rows take the figure's height between matplotlib's default margins.
    row_px = fig_h * _GANTT_DPI * 0.77 / n_dev
    digits = np.floor(np.log10(np.maximum(mb, 1))).astype(np.int64) + 1
    cand = labelable & (width > 0)
    lo, hi = _LABEL_PT
    top = min(hi, 0.5 * 0.8 * row_px * 72.0 / _GANTT_DPI)
    sizes = [top - k * 0.5 for k in range(int((top - lo) / 0.5) + 1)] if top >= lo else [lo]
    for label_pt in sizes:
        # Pixels: the number's ink and a pixel of room on each side.
        need = ((digits - 1) * _DIGIT_EM + _INK_EM) * label_pt * _GANTT_DPI / 72.0 + 2.0
        wanted = float(np.quantile(need[cand] / width[cand], 0.9)) * x_max if cand.any() else 0.0
        if wanted <= _AXES_PX[1]:
            break
    axes_px = float(np.clip(wanted, *_AXES_PX))
    px_per_unit = axes_px / x_max
    label_px = label_pt * _GANTT_DPI / 72.0
    # Digits stand about 0.73 em tall: a box needs that and a little room.
    tall = height * row_px >= 0.9 * label_px
    fits = cand & tall & (width * px_per_unit >= need)
    fig_w = axes_px / (_GANTT_DPI * _AXES_WIDTH)
    return _GanttLayout(fig_w, fig_h, label_pt, fits, int(np.count_nonzero(labelable)))


def write_gantt(
    result: Any,
    path: PathLike,
    title: str | None = None,
    show_transfers: bool = False,
    critical: bool = False,
) -> Path:
    """Draw a Gantt chart of a result and save it as PNG.

    One row per device (device 0 at the top), one bar per op coloured by kind
    (F, B, W, BW, AR, R). For interleaved schedules, later stage chunks on a device
    (``stage // devices``) are drawn in lighter shades of the kind colour.

    Each op's box holds its microbatch number where the whole number fits
    at the chart's one label size (6 to 8 pt, the largest at which nine in
    ten fit); the chart is as wide as that needs, within about 1,000 to
    2,000 pixels, so it reads at the size it is written. When numbers are
    left out, the title's second line says how many were shown (e.g.
    "microbatch numbers shown where they fit: 480 of 1,536 ops"). The
    PNG's text chunks hold the title (``Title``) and the counts
    (``pipecore:labels``, numbers drawn; ``pipecore:ops``, ops that have a
    microbatch).

    The figure is built with matplotlib's object-oriented API on an Agg
    canvas rather than through ``pyplot``: this renders headless without
    calling ``matplotlib.use``, so an interactive backend the caller already
    selected (e.g. in a notebook) is left untouched, and nothing is registered
    with pyplot's figure manager that would need closing.

    Parameters
    ----------
    result : object
        Simulation result with ``ops`` (and ``transfers`` when
        ``show_transfers``) tables, ``makespan``, ``devices`` and ``name``.
    path : str or os.PathLike
        Destination PNG file. Its parent directory must exist.
    title : str, optional
        Plot title. Defaults to the name, shape, costs and makespan. The
        note on labels left out is added below it either way.
    show_transfers : bool, default False
        Also draw each transfer as a thin line from the sender's row at
        ``start`` to the receiver's row at ``arrival``.
    critical : bool, default False
        Highlight the critical path (:func:`pipecore.critical_path`):
        its ops get a thick black outline and its transfers (with or
        without ``show_transfers``) a red arrow from the sender's row at
        ``start`` to the receiver's row where the path leaves them (the
        arrival, or the link's release for a transfer the next one
        queued behind); a host copy is an arrow along its device's row.

    Returns
    -------
    pathlib.Path
        The path written.

    Raises
    ------
    MissingDependencyError
        If matplotlib is not installed.
    ValueError
        If a table lacks a required column, or ``critical`` is set for
        something other than a simulation Result.
    OSError
        If the file cannot be written.
    """
    path_table = _critical_table(result) if critical else None
    # Imported lazily: matplotlib is an optional extra (pipecore[plot]).
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.collections import LineCollection, PolyCollection
        from matplotlib.colors import to_rgb
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
    except ImportError as exc:
        raise MissingDependencyError(
            "write_gantt needs matplotlib: pip install 'pipecore[plot]'"
        ) from exc
    rcParams = matplotlib.rcParams

    ops = result.ops
    _require_columns(ops, _OPS_COLUMNS, "ops")
    out = Path(path)

    device = _ints(ops, "device")
    stage = _ints(ops, "stage")
    mb = _ints(ops, "microbatch")
    kind = _strings(ops, "kind")
    start = _floats(ops, "start")
    finish = _floats(ops, "finish")

    n_dev = int(getattr(result, "devices", 0) or 0)
    if device.size:
        n_dev = max(n_dev, int(device.max()) + 1)
    n_dev = max(n_dev, 1)
    makespan = float(getattr(result, "makespan", 0.0) or 0.0)
    x_max = makespan
    if finish.size:
        x_max = max(x_max, float(np.nanmax(finish)))
    if not (math.isfinite(x_max) and x_max > 0):
        x_max = 1.0

    if title is None:
        title = _default_title(result)

    # Zero-length ops (W with w = 0, say) would be white gaps and legend
    # entries for nothing: they are not drawn.
    visible = finish > start

    # --- bars: one PolyCollection of rectangles renders 30k ops quickly,
    # unlike one Rectangle artist per bar.
    bar_h = 0.8
    y0 = device - bar_h / 2
    y1 = device + bar_h / 2
    # An overlapped F&B unit is two rows with the same device and slot: draw
    # its F in the top half of the bar and its backward in the bottom half.
    if "slot" in ops.column_names and device.size > 1:
        slot = _ints(ops, "slot")
        second = np.zeros(device.size, dtype=bool)
        second[1:] = (device[1:] == device[:-1]) & (slot[1:] == slot[:-1])
        first = np.zeros(device.size, dtype=bool)
        first[:-1] = second[1:]
        y1 = np.where(first, device, y1)
        y0 = np.where(second, device, y0)
    width = np.maximum(finish - start, 0.0)

    # --- size: rows of fixed height (bounded, so huge p still saves); the
    # axes as wide as most microbatch numbers need at one readable size, up
    # to what a screen shows whole. Numbers that do not fit are left out
    # and the title says how many.
    layout = _gantt_layout(width, y1 - y0, mb, visible & (kind != "AR") & (mb >= 0),
                           n_dev, x_max)
    fig = Figure(figsize=(layout.fig_w, layout.fig_h), dpi=_GANTT_DPI)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot(1, 1, 1)
    fig.subplots_adjust(left=_AXES_LEFT, right=_AXES_LEFT + _AXES_WIDTH)
    verts = np.empty((device.size, 4, 2), dtype=np.float64)
    verts[:, 0, 0] = start
    verts[:, 0, 1] = y0
    verts[:, 1, 0] = start
    verts[:, 1, 1] = y1
    verts[:, 2, 0] = finish
    verts[:, 2, 1] = y1
    verts[:, 3, 0] = finish
    verts[:, 3, 1] = y0

    kinds_present = [k for k in _KIND_ORDER if np.any((kind == k) & visible)]
    extra = (sorted({str(k) for k in np.unique(kind[visible])} - set(_KIND_ORDER))
             if visible.any() else [])
    base = np.array(
        [to_rgb(_KIND_COLOURS.get(k, _UNKNOWN_COLOUR)) for k in kind.tolist()],
        dtype=np.float64,
    ).reshape(-1, 3)
    # Stage chunk (virtual pipeline stage index on the device): lighter shade
    # for later chunks so interleaved schedules remain readable.
    chunk = _chunk_of(device, stage)
    n_chunks = int(chunk.max()) + 1 if chunk.size else 1
    lighten = chunk / max(n_chunks - 1, 1) * 0.45 if n_chunks > 1 else np.zeros(chunk.size)
    colours = _shade(base, np.asarray(lighten, dtype=np.float64))

    if device.size:
        # Thin white edges separate adjacent bars; dropped when bars are too
        # dense to see them anyway (the edges would then paint everything).
        dense = device.size > 4 * n_dev * 100
        coll = PolyCollection(
            verts[visible],
            facecolors=colours[visible],
            edgecolors="none" if dense else "white",
            linewidths=0.0 if dense else 0.3,
        )
        ax.add_collection(coll)

    # --- transfers as thin diagonal lines sender -> receiver.
    legend_handles: list[Any] = [
        Patch(facecolor=_KIND_COLOURS[k], label=k) for k in kinds_present
    ] + [Patch(facecolor=_UNKNOWN_COLOUR, label=k) for k in extra]
    if n_chunks > 1:  # what the shades mean
        grey = np.array([0.35, 0.35, 0.35])
        for c in range(n_chunks):
            shade = _shade(grey[None, :], np.array([c / (n_chunks - 1) * 0.45]))[0]
            legend_handles.append(Patch(facecolor=shade, label=f"chunk {c}"))
    transfers = getattr(result, "transfers", None)
    if show_transfers and transfers is not None and transfers.num_rows:
        _require_columns(transfers, _TRANSFER_COLUMNS, "transfers")
        t_src = _ints(transfers, "src_device")
        t_dst = _ints(transfers, "dst_device")
        t_start = _floats(transfers, "start")
        t_arr = _floats(transfers, "arrival")
        segs = np.stack(
            [np.stack([t_start, t_src], axis=1), np.stack([t_arr, t_dst], axis=1)],
            axis=1,
        )
        # Fade lines as they get denser so thousands of them do not hide
        # the bars underneath.
        alpha = float(np.clip(0.35 * 300.0 / max(segs.shape[0], 1), 0.03, 0.35))
        ax.add_collection(
            LineCollection(segs, colors="black", linewidths=0.5, alpha=alpha, zorder=3)
        )
        legend_handles.append(Line2D([], [], color="black", lw=0.8, alpha=0.6, label="transfer"))

    if path_table is not None:
        legend_handles += _draw_critical(ax, path_table, verts, PolyCollection, Line2D)

    ax.set_xlim(0.0, x_max)
    ax.set_ylim(n_dev - 0.5, -0.5)  # inverted: device 0 at top
    ax.set_yticks(range(n_dev))
    ax.set_yticklabels([f"d{d}" for d in range(n_dev)])
    ax.set_xlabel("time (cost units)")
    ax.set_ylabel("device")
    note = layout.note()
    ax.set_title(title if note is None else f"{title}\n{note}")
    ax.grid(axis="x", linewidth=0.3, alpha=0.5)
    ax.set_axisbelow(True)

    # --- microbatch numbers, one size, in the boxes they fit (at most as
    # many as the axes are wide, so this stays cheap for 30k ops).
    idx = np.flatnonzero(layout.fits)
    if idx.size:
        # Dark text on light bars, white on dark ones.
        lum = colours @ np.array([0.299, 0.587, 0.114])
        centres = (start + finish) / 2
        _draw_labels(ax, centres[idx], ((y0 + y1) / 2)[idx], mb[idx],
                     np.full(idx.size, layout.label_pt), lum[idx] > 0.6, _GANTT_DPI)

    if legend_handles:
        ax.legend(
            handles=legend_handles,
            loc="upper left",
            bbox_to_anchor=(1.005, 1.0),
            frameon=False,
            fontsize=8,
        )

    # The collections (bars, labels, critical path) are clipped to the axes,
    # whose box the tight bounding box holds anyway: leaving them out of its
    # computation skips the extents of thousands of paths, same pixels.
    for coll in ax.collections:
        if coll.get_clip_on():
            coll.set_in_layout(False)
    try:
        # The tight box, taken here: savefig's bbox_inches="tight" first runs a
        # whole draw pass without output to find it (same box, same bytes).
        tight = fig.get_tightbbox(fig.canvas.get_renderer()).padded(
            rcParams["savefig.pad_inches"])
        # Faster zlib level: most of savefig was PNG encoding; files grow ~10%.
        # The title and the label count go into the PNG's text chunks too,
        # so a reader (or a test) gets them without looking at the pixels.
        meta = {"Title": ax.get_title(), "Software": "pipecore",
                "pipecore:labels": str(layout.labelled), "pipecore:ops": str(layout.labelable)}
        fig.savefig(out, format="png", bbox_inches=tight, metadata=meta,
                    pil_kwargs={"compress_level": 2})
    finally:
        # Release the figure's artists promptly; large charts hold a lot.
        fig.clear()
    return out


# Centred unit-size outlines of label numbers, by (number, font properties).
_GLYPHS: dict = {}


def _draw_labels(ax: Any, x: np.ndarray, y: np.ndarray, numbers: np.ndarray,
                 sizes: np.ndarray, dark: np.ndarray, dpi: float) -> None:
    """Centred numbers as one PathCollection of glyph outlines.

    One Text artist per bar costs about a millisecond to lay out and draw;
    a 17-chart compare drew thousands. Glyph paths are made once per
    distinct number, centred, scaled to each label's size in points and
    placed at the bar centres in data coordinates: one artist per chart.
    """
    from matplotlib.collections import PathCollection
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextPath
    from matplotlib.transforms import Affine2D

    font = FontProperties(size=1.0)  # unit size: scaled per label below
    paths = []
    for j, n in enumerate(numbers.tolist()):
        # Kept across charts: the exact extents of a glyph outline (its
        # curves' extrema) took about 0.13 s per chart of a compare.
        base = _GLYPHS.get((n, font))
        if base is None:
            tp = TextPath((0.0, 0.0), str(n), prop=font)
            ext = tp.get_extents()
            # Centre on the origin; y flipped because the device axis is inverted.
            base = tp.transformed(Affine2D().translate(-(ext.x0 + ext.x1) / 2,
                                                       -(ext.y0 + ext.y1) / 2).scale(1.0, -1.0))
            _GLYPHS[(n, font)] = base
        scale = float(sizes[j]) * dpi / 72.0  # points to pixels
        paths.append(base.transformed(Affine2D().scale(scale, -scale)))
    coll = PathCollection(paths, offsets=np.column_stack([x, y]),
                          offset_transform=ax.transData, transform=Affine2D(),
                          facecolors=np.where(dark[:, None], [[0, 0, 0, 1]], [[1, 1, 1, 1]]),
                          edgecolors="none", zorder=3, clip_on=True)
    ax.add_collection(coll, autolim=False)


def _chunk_of(device: np.ndarray, stage: np.ndarray) -> np.ndarray:
    """Chunk of every op: the rank of its stage among its device's stages
    (right for interleaved, V-shaped and replicated placements alike)."""
    if device.size == 0:
        return np.zeros(0, dtype=np.int64)
    width = int(stage.max()) + 1
    key = device.astype(np.int64) * width + stage
    uniq = np.unique(key)  # sorted by device, then stage
    dev_of = uniq // width
    rank = np.arange(uniq.size) - np.searchsorted(dev_of, dev_of, side="left")
    return rank[np.searchsorted(uniq, key)]


def _default_title(result: Any) -> str:
    """Family, shape and costs: what a reader needs to tell two charts apart."""
    parts = [str(result.name)]
    sched = getattr(result, "schedule", None)
    if sched is not None:
        parts.append(f"p={sched.devices} m={sched.microbatches}")
    costs = getattr(result, "costs", None)
    if costs is not None:
        def num(v):
            a = np.asarray(v, dtype=np.float64)
            return f"{float(a):g}" if a.ndim == 0 else "per-stage"
        parts.append(f"f={num(costs.f)} b={num(costs.b)} w={num(costs.w)} comm={num(costs.comm)}")
    if getattr(result, "network", None) is not None:
        parts.append("network")
    return ", ".join(parts) + f": makespan {result.makespan:g} cost units"


def _draw_critical(ax: Any, path_table: pa.Table, verts: np.ndarray, poly: Any, line: Any) -> list:
    """Outline the critical path's ops and draw its transfers as arrows;
    return the legend handles."""
    op_rows, _ = _critical_rows(path_table)
    rows = np.array(sorted(op_rows), dtype=np.int64)
    if rows.size:
        ax.add_collection(poly(verts[rows], facecolors="none", edgecolors="black",
                               linewidths=1.8, zorder=4))
    d = path_table.select(["element", "device", "dst_device", "row", "start", "finish"]).to_pydict()
    # One arrow per transfer: from its link start to where the path leaves it.
    spans: dict[int, list] = {}
    for e, src, dst, row, s, f in zip(*d.values()):
        if e == "op":
            continue
        if row in spans:
            spans[row][3] = f
        else:
            spans[row] = [src, dst, s, f]
    for src, dst, s, f in spans.values():
        ax.annotate("", xy=(f, dst), xytext=(s, src), zorder=5, annotation_clip=False,
                    arrowprops={"arrowstyle": "-|>", "color": "#D62728", "lw": 1.4,
                                "shrinkA": 0, "shrinkB": 0, "mutation_scale": 9})
    handles = [line([], [], color="black", lw=1.8, label="critical path")]
    if spans:
        handles.append(line([], [], color="#D62728", lw=1.4, label="critical transfer"))
    return handles


# ---------------------------------------------------------------------------
# Parquet
# ---------------------------------------------------------------------------


def write_parquet(result: Any, path: PathLike) -> Path:
    """Write the per-op table of a result to a Parquet file.

    The Arrow schema (including the dictionary-encoded ``kind`` column) is
    stored in the file, so :func:`pyarrow.parquet.read_table` returns a table
    equal to ``result.ops``.

    Parameters
    ----------
    result : object
        Simulation result with an ``ops`` :class:`pyarrow.Table`.
    path : str or os.PathLike
        Destination file. Its parent directory must exist.

    Returns
    -------
    pathlib.Path
        The path written.

    Raises
    ------
    TypeError
        If ``result.ops`` is not a :class:`pyarrow.Table`.
    OSError
        If the file cannot be written.
    """
    ops = result.ops
    if not isinstance(ops, pa.Table):
        raise TypeError(f"result.ops must be a pyarrow.Table, got {type(ops).__name__}")
    out = Path(path)
    pq.write_table(ops, out)
    return out


# Result.write_parquet, write_trace and write_gantt call these (core cannot import up).
plug("write_parquet", write_parquet)
plug("write_trace", write_chrome_trace)
plug("write_gantt", write_gantt)

"""Self-contained HTML reports: Gantt, memory and the three views, drawn with plotly.js.

plotly was chosen over bokeh and vega-lite because one minified file
(plotly.js, embedded once per page) gives zoom, pan, hover and legend
toggles with no server, and its figures are plain JSON that pipecore
writes directly from its arrays (no per-op Python objects). Pages make no
request at view time: the library is inlined.
"""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..core.ops import InputError
from ..core.result import plug
from ..core.schedule import Schedule
from .colours import KIND_COLOURS, UNKNOWN_COLOUR, chunk_of, shade_hex
from .page import CSS as _CSS
from .page import plotly_js as _plotly_js
from .views import kinds_in_order, svg_kind_legend, svg_time_axis

__all__ = ["report", "result_views", "views_table", "schedule_grid_html", "result_svg_html"]

# Above this many ops a schedule's Gantt is drawn as busy fractions per
# device and time bucket (a browser stays responsive; the page says so).
MAX_OPS = 20_000
BUCKETS = 240


def _round(values: np.ndarray, digits: int = 6) -> list:
    # Short numbers keep pages small; 6 significant digits are below what a
    # person can read off a chart and hover shows the same rounding.
    return [float(f"{v:.{digits}g}") for v in np.asarray(values, dtype=np.float64).tolist()]


def _kind_codes(column) -> tuple[np.ndarray, list]:
    """Per-row codes into a list of kind names (no Python string per op)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()
    names = arr.dictionary.to_pylist()
    return arr.indices.to_numpy(zero_copy_only=False).astype(np.int64), names


def _chunks(result: Any, ops: pa.Table | None = None) -> np.ndarray:
    """Chunk of every op: the rank of its stage among its device's stages."""
    ops = result.ops if ops is None else ops
    return chunk_of(ops.column("device").to_numpy(), ops.column("stage").to_numpy())


def result_views(result: Any) -> dict:
    """The three views of a simulated schedule: formula, ideal table, simulation.

    Parameters
    ----------
    result : pipecore.Result
        A result of :func:`pipecore.simulate`.

    Returns
    -------
    dict
        The keys of a :func:`pipecore.compare` row (``makespan``,
        ``formula_makespan``, ``table_slots``, ``formula_slots``, bubble and
        peak figures, ``peak_memory_max``, ``flags``; each flag names its
        column and the cause of the gap).

    Raises
    ------
    ValueError
        If ``result`` is not a Result.
    """
    from ..analysis.compare import peak_memory, three_views

    _check_result(result)
    try:
        return three_views(result.schedule, result, result.costs, result.network)
    except ValueError as exc:  # a custom schedule: no closed form, no family
        peak = np.asarray(result.peak_activation, dtype=np.float64)
        nan = float("nan")
        return {"result": result, "makespan": result.makespan, "formula_makespan": nan,
                "table_slots": "-", "formula_slots": nan, "bubble_ratio": result.bubble_ratio,
                "formula_bubble_ratio": nan, "bubble_rate": result.bubble_rate,
                "formula_bubble_rate": nan, "formula_exact": False,
                "peak_max": float(peak.max()), "peak_min": float(peak.min()),
                "formula_peak_max": nan, "formula_peak_min": nan,
                "peak_memory_max": peak_memory(result),
                "flags": [f"simulation only: {_no_views(result.schedule, exc)}"]}


def _no_views(schedule, exc):
    """Why a schedule has no formula or ideal-table column."""
    comp = schedule.params.get("composition")
    if comp is not None and schedule.params.get("family") is None:
        return (f"a composed schedule (placement {comp['placement']}, order "
                f"{comp['order']['policy']}, W {comp['w'] or 'fused'}) has no closed formula")
    if str(exc).startswith("unknown schedule"):
        # A tuned, recomputed, searched or hand-made schedule: its name is no family's.
        return (f"{schedule.name!r} is not a family's schedule as built (hand-made, generated, "
                f"recomputed or searched): it has no closed formula")
    return str(exc)


def _check_result(result: Any) -> None:
    from ..core.simulate import Result

    if not isinstance(result, Result):
        raise InputError(f"expected a pipecore Result (got {type(result).__name__})")


def _gantt_figure(result: Any, critical: bool, max_ops: int) -> tuple[dict, str | None]:
    """Plotly figure dict of the Gantt (or its aggregate) and a note when aggregated."""
    ops = result.ops
    p = int(result.devices)
    start = ops.column("start").to_numpy()
    finish = ops.column("finish").to_numpy()
    device = ops.column("device").to_numpy()
    code, names = _kind_codes(ops.column("kind"))
    stage = ops.column("stage").to_numpy()
    mb = ops.column("microbatch").to_numpy()
    keep = finish > start  # zero-length ops (W with w = 0) would be invisible gaps
    makespan = float(result.makespan)
    layout = {
        "barmode": "overlay", "height": max(220, 34 * p + 110) if p <= 32 else 900,
        "margin": {"l": 70, "r": 20, "t": 30, "b": 45},
        "xaxis": {"title": {"text": "time (cost units)"}, "range": [0, makespan * 1.01],
                  "zeroline": False},
        "yaxis": {"title": {"text": "device"}, "autorange": "reversed", "dtick": 1 if p <= 32 else None,
                  "zeroline": False},
        "legend": {"orientation": "h", "y": 1.02, "yanchor": "bottom", "x": 0},
        "hovermode": "closest", "plot_bgcolor": "#ffffff",
        # Microbatch numbers only where they fit at a readable size.
        "uniformtext": {"minsize": 9, "mode": "hide"},
    }
    traces = []
    n_visible = int(keep.sum())
    if n_visible > max_ops:
        return _aggregate_figure(start[keep], finish[keep], device[keep], p,
                                 makespan, layout), (
            f"{n_visible:,} ops: drawn as the busy fraction of each device per time bucket "
            f"({BUCKETS} buckets of {makespan / BUCKETS:.4g}) instead of one bar per op "
            f"(above {max_ops:,} ops a browser slows down).")
    chunk = _chunks(result)
    n_chunks = int(chunk.max()) + 1 if chunk.size else 1
    label = n_visible <= 3000
    present = {names[i] for i in np.unique(code[keep]).tolist()}
    order = ("F", "B", "W", "BW", "R", "AR", "O", "L")
    for k in [k for k in order if k in present] + sorted(present - set(order)):
        is_k = code == names.index(k)
        for c in range(n_chunks):
            sel = keep & is_k & (chunk == c)
            if not sel.any():
                continue
            base = KIND_COLOURS.get(k, UNKNOWN_COLOUR)
            name = k if n_chunks == 1 else f"{k} chunk {c}"
            trace = {
                "type": "bar", "orientation": "h", "name": name,
                "y": device[sel].tolist(), "base": _round(start[sel]),
                "x": _round(finish[sel] - start[sel]),
                "customdata": np.stack([stage[sel], mb[sel]], axis=1).tolist(),
                "marker": {"color": shade_hex(base, 0.45 * c / max(n_chunks - 1, 1)),
                           "line": {"width": 0.5, "color": "#ffffff"}},
                "width": 0.8,
                "hovertemplate": (f"{k} stage %{{customdata[0]}} mb %{{customdata[1]}}"
                                  + (f" chunk {c}" if n_chunks > 1 else "")
                                  + "<br>device %{y}<br>start %{base}<br>duration %{x}"
                                  "<extra></extra>"),
            }
            if label:
                trace.update(text=mb[sel].tolist(), textposition="inside",
                             insidetextanchor="middle", textfont={"size": 10},
                             constraintext="inside")
            traces.append(trace)
    if critical:
        traces.append(_critical_trace(result))
    return {"data": traces, "layout": layout}, None


def _critical_trace(result: Any) -> dict:
    path = result.critical_path()
    d = path.to_pydict()
    xs: list = []
    ys: list = []
    for e, dev, dst, s, f in zip(d["element"], d["device"], d["dst_device"], d["start"],
                                 d["finish"]):
        if e == "op":
            xs += [s, f, None]
            ys += [dev, dev, None]
        else:  # a transfer on the path: from its sender to its receiver
            xs += [s, f, None]
            ys += [dev, dst if dst >= 0 else dev, None]
    return {"type": "scatter", "mode": "lines", "name": "critical path",
            "x": [None if v is None else float(f"{v:.6g}") for v in xs], "y": ys,
            "line": {"color": "#d62728", "width": 4}, "visible": "legendonly",
            "hoverinfo": "skip"}


def _aggregate_figure(start, finish, device, p, makespan, layout) -> dict:
    """Busy fraction per device and time bucket, as one heatmap."""
    width = makespan / BUCKETS if makespan > 0 else 1.0
    busy = np.zeros((p, BUCKETS))
    # Each op adds its overlap with every bucket it touches; ops are short
    # next to the makespan, so this loops over buckets per op only at the edges.
    b0 = np.minimum((start / width).astype(np.int64), BUCKETS - 1)
    b1 = np.minimum((finish / width).astype(np.int64), BUCKETS - 1)
    same = b0 == b1
    np.add.at(busy, (device[same], b0[same]), finish[same] - start[same])
    for i in np.flatnonzero(~same):
        for b in range(b0[i], b1[i] + 1):
            lo = max(start[i], b * width)
            hi = min(finish[i], (b + 1) * width)
            if hi > lo:
                busy[device[i], b] += hi - lo
    frac = np.clip(busy / width, 0.0, 1.0)
    centres = (np.arange(BUCKETS) + 0.5) * width
    trace = {"type": "heatmap", "z": [[round(v, 3) for v in row] for row in frac.tolist()],
             "x": _round(centres, 5), "y": list(range(p)), "zmin": 0, "zmax": 1,
             "colorscale": [[0, "#ffffff"], [1, "#1f3b73"]], "colorbar": {"title": {"text": "busy"}},
             "hovertemplate": "device %{y}<br>time %{x}<br>busy %{z:.0%}<extra></extra>"}
    lay = dict(layout)
    lay["yaxis"] = dict(layout["yaxis"], dtick=None)
    lay["height"] = 520
    return {"data": [trace], "layout": lay}


def _memory_figure(result: Any, memory_limit: float | None, max_points: int) -> dict:
    mem = result.memory
    dev = mem.column("device").to_numpy()
    time = mem.column("time").to_numpy()
    act = mem.column("activation").to_numpy()
    static = np.asarray(result.static_memory, dtype=np.float64)
    p = int(result.devices)
    traces = []
    envelope = len(dev) > max_points
    ms = float(result.makespan)
    width = ms / BUCKETS if ms > 0 else 1.0
    shown = set(range(p)) if p <= 16 else {0, p // 4, p // 2, 3 * p // 4, p - 1}
    for d in range(p):
        sel = np.flatnonzero(dev == d)
        if envelope:  # the maximum per time bucket: every peak survives, the page stays small
            sel = sel[np.argsort(time[sel], kind="stable")]
            b = np.minimum((time[sel] / width).astype(np.int64), BUCKETS - 1)
            top = np.zeros(BUCKETS)
            np.maximum.at(top, b, act[sel])
            # A bucket also holds the level left by the last change before it.
            before = np.searchsorted(b, np.arange(BUCKETS), side="left") - 1
            level = np.where(before >= 0, act[sel][np.maximum(before, 0)], 0.0)
            t = np.arange(BUCKETS + 1) * width
            a = np.concatenate([np.maximum(top, level), [0.0]])
        else:
            t = np.concatenate([[0.0], time[sel], [ms]])
            a = np.concatenate([[0.0], act[sel], [act[sel][-1] if sel.size else 0.0]])
        traces.append({
            "type": "scatter", "mode": "lines", "name": f"device {d}",
            "x": _round(t), "y": _round(a + static[d]), "line": {"shape": "hv", "width": 1.5},
            "hovertemplate": (f"device {d}<br>time %{{x}}<br>memory %{{y}} "
                              f"(weights {static[d]:.4g})<extra></extra>"),
            "visible": True if d in shown else "legendonly",
        })
    lo, hi = (float(static.min()), float(static.max())) if static.size else (0.0, 0.0)
    weights = (f"weights {lo:.4g} M on every device" if math.isclose(lo, hi)
               else f"weights {lo:.4g} to {hi:.4g} M by device")
    title = f"memory per device: activation + weights ({weights})"
    if envelope:
        title += f"; maximum per time bucket ({BUCKETS} buckets)"
    layout = {
        "height": 340, "margin": {"l": 70, "r": 20, "t": 40, "b": 45},
        "title": {"text": title, "font": {"size": 13}, "x": 0.01, "xanchor": "left"},
        "xaxis": {"title": {"text": "time (cost units)"}, "zeroline": False},
        "yaxis": {"title": {"text": "memory (M)"}, "rangemode": "tozero"},
        "hovermode": "closest", "plot_bgcolor": "#ffffff",
        "legend": {"font": {"size": 10}},
    }
    if p > 16:
        layout["legend"]["title"] = {"text": "5 devices shown; click to add"}
    if memory_limit is not None:
        layout["shapes"] = [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y",
                             "y0": memory_limit, "y1": memory_limit,
                             "line": {"color": "#d62728", "dash": "dash", "width": 2}}]
        layout["annotations"] = [{"xref": "paper", "x": 1, "y": memory_limit, "yref": "y",
                                  "text": f"limit {memory_limit:g}", "showarrow": False,
                                  "xanchor": "right", "yanchor": "bottom",
                                  "font": {"color": "#d62728"}}]
    return {"data": traces, "layout": layout}


def _transfer_figure(result: Any, max_ops: int) -> dict | None:
    tr = result.transfers
    if tr.num_rows == 0 or tr.num_rows > max_ops:
        return None
    src = tr.column("src_device").to_numpy()
    dst = tr.column("dst_device").to_numpy()
    start = tr.column("start").to_numpy()
    finish = tr.column("finish").to_numpy()
    arrival = tr.column("arrival").to_numpy()
    if not (finish > start).any() and not (arrival > start).any():
        return None
    links = sorted(set(zip(src.tolist(), dst.tolist())))
    names = [f"{a}\u2192{b}" for a, b in links]
    index = {lk: i for i, lk in enumerate(links)}
    y = [names[index[(a, b)]] for a, b in zip(src.tolist(), dst.tolist())]
    span = np.maximum(arrival - start, 1e-12)
    trace = {"type": "bar", "orientation": "h", "y": y, "base": _round(start),
             "x": _round(span), "name": "transfer (start to arrival)",
             "marker": {"color": "#7f7f7f"}, "width": 0.6,
             "customdata": np.stack([tr.column("stage").to_numpy(),
                                     tr.column("microbatch").to_numpy()], axis=1).tolist(),
             "text": [str(k) for k in tr.column("kind").to_pylist()],
             "textposition": "none",
             "hovertemplate": ("%{text} stage %{customdata[0]} mb %{customdata[1]}<br>link %{y}"
                               "<br>start %{base}<br>start to arrival %{x}<extra></extra>")}
    return {"data": [trace], "layout": {
        "height": max(200, 16 * len(links) + 90), "margin": {"l": 70, "r": 20, "t": 30, "b": 45},
        "xaxis": {"title": {"text": "time (cost units)"}},
        "yaxis": {"title": {"text": "link"}, "autorange": "reversed", "type": "category"},
        "plot_bgcolor": "#ffffff", "showlegend": False}}


def _fmt(v: Any, digits: int = 6) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, (float, np.floating)):
        return f"{v:.{digits}g}"
    return html.escape(str(v))


# The names of the measures, the same in the summary, the per-schedule
# tables and the notes (a note names its column by the part before ":").
_MAKESPAN = "makespan"
_RATIO = "bubble ratio"
_RATE = "bubble rate (zero-bubble papers)"
_PEAK = "peak activation"
_MEMORY = "peak memory"


def views_table(row: dict) -> str:
    """The three views of one schedule as an HTML table, as ``report.html`` shows them.

    Parameters
    ----------
    row : dict
        A :func:`pipecore.compare` row (or :func:`result_views`' keys with
        ``chunks``): the closed formula's, the ideal table's and the
        simulation's makespan, bubble and peak figures.

    Returns
    -------
    str
        A ``<table class='views'>`` (cost units and M, as the row's
        costs), followed by a note on slots when the schedule has chunks.
    """
    r = row
    v = int(r.get("chunks") or 1)
    slots = r["table_slots"]
    lines = [(f"{_MAKESPAN} (cost units)", r["formula_makespan"],
              f"{_fmt(slots)} slots (formula {_fmt(r['formula_slots'])})", r["makespan"]),
             (f"{_RATIO}: idle share of p \u00d7 makespan", r["formula_bubble_ratio"], "-",
              r["bubble_ratio"]),
             (f"{_RATE}: idle share of the longest device span", r["formula_bubble_rate"], "-",
              r["bubble_rate"]),
             (f"{_PEAK}, fullest device (M)", r["formula_peak_max"], "-", r["peak_max"]),
             (f"{_PEAK}, emptiest device (M)", r["formula_peak_min"], "-", r["peak_min"]),
             (f"{_MEMORY}, fullest device (M): activation + weights", None, "-",
              r.get("peak_memory_max"))]
    body = "".join(f"<tr><th>{html.escape(a)}</th><td>{_fmt(b)}</td><td>{c}</td><td>{_fmt(d)}</td></tr>"
                   for a, b, c, d in lines)
    note = ""
    if v > 1 and slots != "-":
        note = (f"<p class='foot'>ideal table: one slot per op; with v={v} chunks a slot is one "
                f"chunk's op (1/{v} of a device share's op time), so its {_fmt(slots)} slots are "
                f"not cost units (at f=b=w=1 a slot is 1/{v} cost unit).</p>")
    return ("<table class='views'><thead><tr><th></th><th>closed formula</th>"
            "<th>ideal table (slots, one per op)</th><th>simulation</th></tr></thead>"
            f"<tbody>{body}</tbody></table>" + note)


def _slug(name: str, i: int) -> str:
    return "s{}-{}".format(i, "".join(ch if ch.isalnum() else "-" for ch in name))


_SORT_JS = """
document.querySelectorAll('table.summary').forEach(function(t){
 t.querySelectorAll('th').forEach(function(th,i){th.addEventListener('click',function(){
  var body=t.tBodies[0],rows=Array.from(body.rows),asc=th.dataset.asc!=='1';
  rows.sort(function(a,b){var x=a.cells[i].dataset.v||a.cells[i].textContent,
   y=b.cells[i].dataset.v||b.cells[i].textContent,nx=parseFloat(x),ny=parseFloat(y);
   var c=(isNaN(nx)||isNaN(ny))?x.localeCompare(y):nx-ny;return asc?c:-c;});
  rows.forEach(function(r){body.appendChild(r);});
  t.querySelectorAll('th').forEach(function(h){h.dataset.asc='';});th.dataset.asc=asc?'1':'0';
 });});});
"""


def _rows_for(obj: Any) -> list[dict]:
    """Normalise what report() accepts into compare-like rows."""
    from ..core.simulate import Result

    if isinstance(obj, Result):
        obj = [obj]
    if isinstance(obj, dict):
        obj = [obj]
    if not isinstance(obj, (list, tuple)):
        raise InputError(
            "report() takes a Result, a list of Results, the rows of pipecore.compare, a scan "
            f"directory or a pyarrow Table of scan rows (got {type(obj).__name__})")
    if not obj:
        raise InputError("report() was given an empty list: nothing to draw")
    rows = []
    for i, item in enumerate(obj):
        if isinstance(item, Result):
            row = result_views(item)
            row.update(name=item.name, result=item, error=None,
                       chunks=int(item.schedule.chunks))
            rows.append(row)
        elif isinstance(item, dict) and "name" in item and "result" in item:
            if "peak_memory_max" not in item and item["result"] is not None:
                from ..analysis.compare import peak_memory

                item = dict(item, peak_memory_max=peak_memory(item["result"]))
            rows.append(item)
        else:
            raise InputError(f"report() item {i} is a {type(item).__name__}: expected a pipecore "
                             "Result or a row of pipecore.compare")
    return rows


def report(obj: Any, path: str | Path, *, title: str | None = None,
           memory_limit: float | None = None, critical: bool = True,
           max_ops: int = MAX_OPS) -> Path:
    """Write one self-contained HTML page (opens offline) for results or a scan.

    Per schedule: a Gantt per device (zoom, pan, hover; colours by kind,
    shades by chunk; the critical path as a legend toggle), transfers per
    link when any takes time, memory per device over time (activation plus
    weights), and the three views (closed formula, ideal table,
    simulation) with their disagreements as footnotes. Several schedules
    get a sortable summary table linking to each one.

    Parameters
    ----------
    obj : Result, list of Result, list of dict, str, pathlib.Path or pyarrow.Table
        A result of :func:`pipecore.simulate`, several, the rows of
        :func:`pipecore.compare`, or a scan (its Parquet directory or its
        rows as a table) for a Pareto page.
    path : str or pathlib.Path
        The HTML file to write (its folder is created).
    title : str, optional
        Page title.
    memory_limit : float, optional
        Drawn as a line on the memory charts.
    critical : bool, default True
        Offer the critical path as a toggle (costs one critical-path pass
        per schedule).
    max_ops : int, default 20000
        Above this many ops a schedule's Gantt is aggregated per device and
        time bucket, and the page says so.

    Returns
    -------
    pathlib.Path
        The file written.

    Raises
    ------
    ValueError
        If ``obj`` is none of the above, or a list item is not a Result.
    MissingDependencyError
        If plotly is not installed.
    OSError
        If the file cannot be written.
    """
    if isinstance(obj, (str, Path)) or isinstance(obj, pa.Table):
        if isinstance(obj, (str, Path)) and not Path(obj).is_dir():
            raise InputError(f"report(): {str(obj)!r} is not a scan directory")
        from .scanreport import scan_report

        return scan_report(obj, path)
    from ..analysis.compare import (
        describe_setting,
        headline,
        headline_lines,
        setting_differences,
        setting_text,
        sort_rows,
    )

    rows = _rows_for(obj)
    if len(rows) > 1:
        rows = _labelled(sort_rows(rows))
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    js = _plotly_js()
    page_title = title or ("pipecore: " + (rows[0]["name"] if len(rows) == 1 else
                                           f"{len(rows)} schedules"))
    settings = {i: describe_setting(r["result"]) for i, r in enumerate(rows)
                if r.get("result") is not None}
    differ = setting_differences(list(settings.values()))
    sub = ("Times in cost units (f=1: one microbatch's forward through one device's share of "
           "the model); memory in M (activation per microbatch, weights per device share).")
    common = ""
    if len(settings) > 1 and not differ:  # one result: its section states it
        common = "All schedules: " + setting_text(next(iter(settings.values())))
    elif differ:
        sub += (" The results differ in " + _and(list(differ)) + ": each section states its "
                "own setting, and the table's setting column shows what differs.")
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(page_title)}"
             f"</title><style>{_CSS}</style><script>{js}</script></head><body>",
             f"<h1>{html.escape(page_title)}</h1><p class='sub'>{html.escape(sub)}</p>"
             + (f"<p class='sub'>{html.escape(common)}</p>" if common else "")]
    notes: dict[str, int] = {}
    for r in rows:
        for f in r.get("flags") or []:
            notes.setdefault(f, len(notes) + 1)
    if len(rows) > 1:
        lines = headline_lines(headline([dict(r, name=r["label"]) for r in rows], memory_limit))
        if differ:
            lines.append(f"(the results differ in {_and(list(differ))}: not one setting)")
        parts.append("<div class='headline'>" + "".join(
            f"<p>{html.escape(t)}</p>" for t in lines) + "</div>")
        parts.append(_summary(rows, notes, memory_limit,
                              {i: setting_text(st, differ) for i, st in settings.items()}
                              if differ else None))
    scripts = []
    for i, r in enumerate(rows):
        slug = _slug(r["name"], i)
        parts.append(f"<h2 id='{slug}'>{html.escape(r.get('label', r['name']))}"
                     + (f" (v={r['chunks']})" if r.get("chunks", 1) != 1 else "") + "</h2>")
        if r.get("error") or r.get("result") is None:
            parts.append(f"<p class='note'>not built: {html.escape(str(r.get('error')))}</p>")
            continue
        res = r["result"]
        parts.append("<p class='setting'>" + html.escape(setting_text(settings[i])) + "</p>")
        parts.append(views_table(r))
        if r.get("flags"):
            parts.append("".join(f"<p class='foot'>[{notes[f]}] {html.escape(f)}</p>"
                                 for f in r["flags"]))
        else:
            parts.append("<p class='foot'>The three views agree.</p>")
        gantt, note = _gantt_figure(res, critical, max_ops)
        if note:
            parts.append(f"<p class='note aggregated'>{html.escape(note)}</p>")
        figs = [("gantt", gantt), ("transfers", _transfer_figure(res, max_ops)),
                ("memory", _memory_figure(res, memory_limit, max_points=100_000))]
        for kind, fig in figs:
            if fig is None:
                continue
            div = f"{slug}-{kind}"
            parts.append(f"<div id='{div}' class='plot {kind}'></div>")
            scripts.append(_new_plot(div, fig))
    parts.append(f"<script>{_SORT_JS}\n{''.join(scripts)}</script></body></html>")
    out.write_text("".join(parts), encoding="utf-8")
    return out


def _new_plot(div: str, fig: dict) -> str:
    data = json.dumps(fig["data"], separators=(",", ":"))
    layout = json.dumps(fig["layout"], separators=(",", ":"))
    config = '{"responsive":true,"displaylogo":false}'
    return f"Plotly.newPlot('{div}',{data},{layout},{config});\n"


def _labelled(rows: list[dict]) -> list[dict]:
    """Copies of the rows with a ``label`` each: the name, numbered where
    several rows share one ("1f1b #1", "1f1b #2")."""
    count: dict[str, int] = {}
    for r in rows:
        count[r["name"]] = count.get(r["name"], 0) + 1
    seen: dict[str, int] = {}
    out = []
    for r in rows:
        label = r["name"]
        if count[label] > 1:
            seen[label] = seen.get(label, 0) + 1
            label = f"{label} #{seen[label]}"
        out.append(dict(r, label=label))
    return out


def _and(words: list[str]) -> str:
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " and " + words[-1]


def _summary(rows: list[dict], notes: dict[str, int], memory_limit: float | None = None,
             setting: dict | None = None) -> str:
    show_setting = bool(setting)
    head = [("schedule", ""), ("v", "chunks per device"),
            (f"{_MAKESPAN} (cost units)", "one training step"),
            (_RATIO, "idle share of p \u00d7 makespan"),
            (f"{_PEAK}, fullest device (M)", "activation memory at its peak"),
            (f"{_MEMORY}, fullest device (M)", "activation + weights: the memory chart's peak")]
    if memory_limit is not None:
        head.append((f"within {memory_limit:g} M", "peak memory at most the limit"))
    head.append(("agree", "formula, ideal table and simulation"))
    if show_setting:
        head.append(("setting", "where the results differ"))
    out = ["<table class='summary'><thead><tr>"
           + "".join(f"<th title='{html.escape(t)}'"
                     + (" class='setting'" if h == "setting" else "") + f">{html.escape(h)}"
                     + (f"<br><span class='unit'>{html.escape(t)}</span>" if t else "") + "</th>"
                     for h, t in head) + "</tr></thead><tbody>"]
    for i, r in enumerate(rows):
        slug = _slug(r["name"], i)
        name = f"<a href='#{slug}'>{html.escape(r.get('label', r['name']))}</a>"
        if r.get("error") or r.get("result") is None:
            blank = len(head) - 3 - show_setting  # the figures' columns
            out.append(f"<tr><td>{name}</td><td>{r.get('chunks', '')}</td>"
                       + "<td>-</td>" * blank + "<td>not built</td>"
                       + ("<td class='setting'></td>" if show_setting else "") + "</tr>")
            continue
        flags = r.get("flags") or []
        agree = ("<span class='yes'>yes</span>" if not flags else
                 "<span class='no'>no</span> " + ",".join(f"[{notes[f]}]" for f in flags))
        cells = [f"<td>{name}</td><td>{r['chunks']}</td>",
                 f"<td class='makespan' data-v='{r['makespan']!r}'>{_fmt(r['makespan'])}</td>",
                 f"<td data-v='{r['bubble_ratio']!r}'>{r['bubble_ratio']:.4f}</td>",
                 f"<td data-v='{r['peak_max']!r}'>{_fmt(r['peak_max'], 4)}</td>",
                 f"<td class='memory' data-v='{r['peak_memory_max']!r}'>"
                 f"{_fmt(r['peak_memory_max'], 4)}</td>"]
        if memory_limit is not None:
            fits = r["peak_memory_max"] <= memory_limit * (1 + 1e-9)
            cells.append(f"<td data-v='{int(fits)}'>"
                         + ("yes" if fits else "<span class='no'>no</span>") + "</td>")
        cells.append(f"<td data-v='{len(flags)}'>{agree}</td>")
        if show_setting:
            cells.append("<td class='setting'>" + html.escape(setting.get(i, "")) + "</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    if notes:
        out.append("<p class='foot'>agree: the closed formula, the ideal table and the "
                   "simulation give the same makespan, bubble and peak. Where they do not, the "
                   "note names the column and the cause:</p>")
        out.extend(f"<p class='foot'>[{n}] {html.escape(f)}</p>" for f, n in notes.items())
    out.append("<p class='foot'>Sorted by makespan (ties by name). Click a column header to "
               "sort; click a name to jump to its charts.</p>")
    return "".join(out)


# --- Jupyter views: small static HTML, no JavaScript -------------------------

def result_svg_html(result: Any, max_ops: int = 5000, width: int = 720) -> str:
    """An inline SVG Gantt and the headline numbers of a result (Jupyter).

    One row per device, one box per op coloured by kind (later chunks
    lighter), a time axis in cost units with round ticks, and a legend of
    the kinds drawn (and of the chunk shades when a device holds several).

    Parameters
    ----------
    result : pipecore.Result
    max_ops : int, default 5000
        Above this many ops only the headline numbers are shown, with a
        pointer to :func:`pipecore.report`.
    width : int, default 720
        Width of the drawing in pixels.

    Returns
    -------
    str
        HTML.
    """
    peak = np.asarray(result.peak_activation, dtype=np.float64)
    head = (f"<div style='font-family:sans-serif;font-size:13px'><b>{html.escape(result.name)}"
            f"</b>: p={result.devices}, makespan {result.makespan:.6g} cost units, bubble ratio "
            f"{result.bubble_ratio:.4f}, peak activation {peak.max() if peak.size else 0:.4g} M "
            f"(max device)</div>")
    ops = result.ops
    if ops.num_rows > max_ops:
        return head + (f"<div style='font-size:12px;color:#555'>{ops.num_rows:,} ops: too many "
                       "to draw inline; pc.report(result, 'page.html') draws them.</div>")
    p = int(result.devices)
    start = ops.column("start").to_numpy()
    finish = ops.column("finish").to_numpy()
    device = ops.column("device").to_numpy()
    code, names = _kind_codes(ops.column("kind"))
    chunk = _chunks(result)
    n_chunks = int(chunk.max()) + 1 if chunk.size else 1
    ms = float(result.makespan) or 1.0
    row_h, left, right = 14, 40, 10
    sx = (width - left - right) / ms
    h = p * row_h + 4
    rects = []
    drawn = np.flatnonzero(finish > start)
    for i in drawn.tolist():
        colour = shade_hex(KIND_COLOURS.get(names[code[i]], UNKNOWN_COLOUR),
                        0.45 * chunk[i] / max(n_chunks - 1, 1))
        rects.append(f"<rect x='{left + start[i] * sx:.1f}' y='{device[i] * row_h + 2}' "
                     f"width='{max((finish[i] - start[i]) * sx - 0.4, 0.4):.1f}' "
                     f"height='{row_h - 3}' fill='{colour}'/>")
    labels = "".join(f"<text x='{left - 4}' y='{d * row_h + row_h - 2}' text-anchor='end'>{d}"
                     "</text>" for d in range(p))
    device_title = (f"<text transform='translate(10,{h / 2:.1f}) rotate(-90)' "
                    "text-anchor='middle' fill='#333'>device</text>")
    axis, axis_h = svg_time_axis(left, h, width - left - right, 0.0, ms, "time (cost units)")
    present = kinds_in_order([names[c] for c in np.unique(code[drawn]).tolist()])
    legend, legend_h = svg_kind_legend(present, n_chunks, left, h + axis_h + 2,
                                       width - left - right)
    total = h + axis_h + 2 + legend_h + 2
    svg = (f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{total:.0f}' "
           f"font-size='10' font-family='sans-serif'>{labels}{device_title}"
           f"<g class='ops'>{''.join(rects)}</g>{axis}{legend}</svg>")
    return head + svg


def schedule_grid_html(schedule: Any, max_ops: int = 4000) -> str:
    """The per-device programs as a compact grid of op labels (Jupyter).

    Parameters
    ----------
    schedule : pipecore.Schedule
    max_ops : int, default 4000
        Above this many ops only the first slots of each device are shown.

    Returns
    -------
    str
        HTML.
    """
    t = schedule.table
    device = t.column("device").to_numpy()
    p = int(schedule.devices)
    chunk = _chunks(None, t)
    n_chunks = int(chunk.max()) + 1 if chunk.size else 1
    limit = max(1, max_ops // max(p, 1))
    # Only the shown ops become Python objects (a huge schedule stays quick).
    counts = np.bincount(device, minlength=p)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    order = np.argsort(device, kind="stable")
    rank = np.empty(device.size, dtype=np.int64)
    rank[order] = np.arange(device.size) - first[device[order]]
    shown = np.flatnonzero(rank < limit)
    code, names = _kind_codes(t.column("kind"))
    kind = [names[i] for i in code[shown].tolist()]
    mb = t.column("microbatch").to_numpy()[shown]
    stage = t.column("stage").to_numpy()[shown]
    progs: list[list[str]] = [[] for _ in range(p)]
    for d, k, j, s, c in zip(device[shown].tolist(), kind, mb.tolist(), stage.tolist(),
                             chunk[shown].tolist()):
        # Light enough for black text; later chunks lighter still.
        colour = shade_hex(KIND_COLOURS.get(k, UNKNOWN_COLOUR),
                        0.45 + 0.35 * c / max(n_chunks - 1, 1))
        progs[d].append(f"<td style='background:{colour};padding:0 2px;border:1px solid #fff'"
                        f" title='{k} stage {s} mb {j}'>{k}{j}</td>")
    cut = bool((counts > limit).any())
    rows = "".join(f"<tr><th>{d}</th>{''.join(cells)}</tr>" for d, cells in enumerate(progs))
    head = (f"<div style='font-family:sans-serif;font-size:13px'><b>{html.escape(schedule.name)}"
            f"</b>: {p} devices, {schedule.microbatches} microbatches, {schedule.num_ops} ops "
            "(device programs in order; F3 = forward of microbatch 3; lighter = later chunk)"
            + (f"; first {limit} ops per device shown" if cut else "") + "</div>")
    return (head + "<table style='border-collapse:collapse;font-size:10px;font-family:monospace'>"
            + rows + "</table>")



plug("result_html", result_svg_html)
Schedule._html_view = staticmethod(schedule_grid_html)

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
from .page import CSS as _CSS
from .page import plotly_js as _plotly_js
from .views import result_svg_html, schedule_grid_html, table_styles

__all__ = ["report", "result_views", "views_table", "schedule_grid_html", "result_svg_html"]

# Above this many ops a schedule's Gantt is drawn as busy fractions per
# device and time bucket (a browser stays responsive; the page says so).
MAX_OPS = 20_000
BUCKETS = 240
# Every chart of a page has the same plot area's left and right edges in
# pixels, so a Gantt's time axis lines up with the memory chart below it.
# Legends stand in the right margin, wide enough for the longest entry
# ("BW down chunk 0"), so plotly never widens it for one; a legend taller
# than its chart scrolls.
_MARGIN = {"l": 70, "r": 170}
_LEGEND = {"x": 1.01, "xanchor": "left", "y": 1.0, "yanchor": "top", "font": {"size": 11}}


def _round(values: np.ndarray, digits: int = 6) -> list:
    # Short numbers keep pages small; 6 significant digits are below what a
    # person can read off a chart and hover shows the same rounding.
    return [float(f"{v:.{digits}g}") for v in np.asarray(values, dtype=np.float64).tolist()]


def result_views(result: Any) -> dict:
    """The three views of a simulated schedule: formula, ideal table, simulation.

    Parameters
    ----------
    result : pipecore.Result
        A simulation whose schedule may come from any builder (its views
        name what they cannot give).

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
                "table_slots": None, "formula_slots": nan, "bubble_ratio": result.bubble_ratio,
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


def _gantt_figure(result: Any, critical: bool, max_ops: int,
                  x_max: float | None = None) -> tuple[dict, str | None]:
    """Plotly figure dict of the Gantt (or its aggregate) and a note when
    aggregated; its time axis runs to ``x_max`` (default: the makespan)."""
    ops = result.ops
    p = int(result.devices)
    start = ops.column("start").to_numpy()
    finish = ops.column("finish").to_numpy()
    device = ops.column("device").to_numpy()
    stage = ops.column("stage").to_numpy()
    mb = ops.column("microbatch").to_numpy()
    keep = finish > start  # zero-length ops (W with w = 0) would be invisible gaps
    makespan = float(result.makespan)
    layout = {
        "barmode": "overlay", "height": max(220, 34 * p + 110) if p <= 32 else 900,
        "margin": dict(_MARGIN, t=30, b=45),
        "xaxis": {"title": {"text": "time (cost units)"}, "range": _x_range(x_max or makespan),
                  "zeroline": False},
        "yaxis": {"title": {"text": "device"}, "autorange": "reversed", "dtick": 1 if p <= 32 else None,
                  "zeroline": False},
        "legend": dict(_LEGEND),
        "hovermode": "closest", "plot_bgcolor": "#ffffff",
        # Microbatch numbers only where they fit at a readable size.
        "uniformtext": {"minsize": 9, "mode": "hide"},
    }
    if x_max and makespan < x_max * (1 - 1e-9):
        # The axis runs on to the page's slowest schedule: mark this one's end.
        layout["shapes"] = [{"type": "line", "xref": "x", "yref": "paper", "x0": makespan,
                             "x1": makespan, "y0": 0, "y1": 1,
                             "line": {"color": "#333333", "width": 1, "dash": "dash"}}]
        layout["annotations"] = [{"xref": "x", "yref": "paper", "x": makespan, "y": 0,
                                  "text": f"makespan {makespan:g}", "showarrow": False,
                                  "xanchor": "left", "yanchor": "bottom", "xshift": 3,
                                  "font": {"size": 10, "color": "#333333"}}]
    n_visible = int(keep.sum())
    if n_visible > max_ops:
        return _aggregate_figure(start[keep], finish[keep], device[keep], p,
                                 makespan, layout), (
            f"{n_visible:,} ops: drawn as the busy fraction of each device per time bucket "
            f"({BUCKETS} buckets of {makespan / BUCKETS:.4g}; white idle, dark blue busy "
            f"all the bucket) instead of one bar per op (above {max_ops:,} ops a browser "
            "slows down).")
    styles = table_styles(ops, p, drawn=keep)
    label = n_visible <= 3000
    traces = []
    for s in range(len(styles.names)):
        sel = keep & (styles.style == s)
        if not sel.any():
            continue
        trace = {
            "type": "bar", "orientation": "h", "name": styles.names[s],
            "y": device[sel].tolist(), "base": _round(start[sel]),
            "x": _round(finish[sel] - start[sel]),
            "customdata": np.stack([stage[sel], mb[sel]], axis=1).tolist(),
            "marker": {"color": styles.colours[s], "line": {"width": 0.5, "color": "#ffffff"}},
            "width": 0.8,
            "hovertemplate": (f"{html.escape(styles.hovers[s])} stage %{{customdata[0]}} mb "
                              "%{customdata[1]}<br>device %{y}<br>start %{base}<br>duration %{x}"
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


def _x_range(x_max: float) -> list:
    """The time axis of every chart of a page: 0 to the end, a hair beyond."""
    return [0, float(f"{(x_max if x_max > 0 else 1.0) * 1.005:.6g}")]


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
             "colorscale": [[0, "#ffffff"], [1, "#1f3b73"]],
             # No colour bar: it would take the right margin the charts below
             # share (the note above says what the shades mean).
             "showscale": False,
             "hovertemplate": "device %{y}<br>time %{x}<br>busy %{z:.0%}<extra></extra>"}
    lay = dict(layout)
    lay["yaxis"] = dict(layout["yaxis"], dtick=None)
    lay["height"] = 520
    return {"data": [trace], "layout": lay}


def _memory_figure(result: Any, memory_limit: float | None, max_points: int,
                   x_max: float | None = None) -> dict:
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
        "height": 340, "margin": dict(_MARGIN, t=40, b=45),
        "title": {"text": title, "font": {"size": 13}, "x": 0.01, "xanchor": "left"},
        "xaxis": {"title": {"text": "time (cost units)"}, "zeroline": False,
                  "range": _x_range(x_max or ms)},
        "yaxis": {"title": {"text": "memory (M)"}, "rangemode": "tozero"},
        "hovermode": "closest", "plot_bgcolor": "#ffffff",
        "legend": dict(_LEGEND),
    }
    if p > 16:
        layout["legend"]["title"] = {"text": "5 devices shown;<br>click to add"}
    if memory_limit is not None:
        layout["shapes"] = [{"type": "line", "xref": "paper", "x0": 0, "x1": 1, "yref": "y",
                             "y0": memory_limit, "y1": memory_limit,
                             "line": {"color": "#d62728", "dash": "dash", "width": 2}}]
        layout["annotations"] = [{"xref": "paper", "x": 1, "y": memory_limit, "yref": "y",
                                  "text": f"limit {memory_limit:g}", "showarrow": False,
                                  "xanchor": "right", "yanchor": "bottom",
                                  "font": {"color": "#d62728"}}]
    return {"data": traces, "layout": layout}


def _transfer_figure(result: Any, max_ops: int, x_max: float | None = None) -> dict | None:
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
        "height": max(200, 16 * len(links) + 90), "margin": dict(_MARGIN, t=30, b=45),
        "xaxis": {"title": {"text": "time (cost units)"},
                  "range": _x_range(x_max or float(result.makespan))},
        "yaxis": {"title": {"text": "link"}, "autorange": "reversed", "type": "category"},
        "plot_bgcolor": "#ffffff", "showlegend": False}}


def _fmt(v: Any, digits: int = 6) -> str:
    if isinstance(v, (float, np.floating)):
        return f"{v:.{digits}g}"
    return html.escape(str(v))


def _four(v: float) -> str:
    return _fmt(v, 4)


def _ratio(v: float) -> str:
    return f"{v:.4f}"


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, (float, np.floating)) and math.isnan(v))


def _agrees(a: float, b: float) -> bool:
    # The tolerance of the compare table's flags (pipecore.analysis.compare).
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


_NO_FORMULA = "no closed form"


def _with_formula(sim: float, fm: Any, fmt) -> str:
    """The simulation's figure and, in parentheses, the closed formula's
    where it differs (as the terminal table writes them)."""
    if _missing(fm):
        return f"{fmt(sim)} <span class='fm'>({_NO_FORMULA})</span>"
    if _agrees(float(sim), float(fm)):
        return fmt(sim)
    return f"{fmt(sim)} <span class='fm' title='closed formula'>({fmt(fm)})</span>"


# The names of the measures, the same in the summary, the per-schedule
# tables and the notes (a note names its column by the part before ":").
_MAKESPAN = "makespan"
_RATIO = "bubble ratio"
_RATE = "bubble rate (zero-bubble papers)"
_PEAK = "peak activation"
_MEMORY = "peak memory"
_IDEAL = "ideal table"


def _slots_text(row: dict) -> str:
    """The ideal table's length and the closed formula's at unit op times."""
    slots, fm = row.get("table_slots"), row.get("formula_slots")
    if not isinstance(slots, (int, np.integer)):
        return "no ideal table (not a family's schedule as built)"
    if _missing(fm):
        return f"{slots:,} slots ({_NO_FORMULA})"
    return f"{slots:,} slots (formula {fm:.6g})"


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
    slots = r.get("table_slots")

    def cell(x):
        return (f"<td class='none'>{_NO_FORMULA}</td>" if _missing(x)
                else f"<td>{_fmt(x)}</td>")

    lines = [(f"{_MAKESPAN} (cost units)", r["formula_makespan"], r["makespan"]),
             (f"{_RATIO}: idle share of p \u00d7 makespan", r["formula_bubble_ratio"],
              r["bubble_ratio"]),
             (f"{_RATE}: idle share of the longest device span", r["formula_bubble_rate"],
              r["bubble_rate"]),
             (f"{_PEAK}, fullest device (M)", r["formula_peak_max"], r["peak_max"]),
             (f"{_PEAK}, emptiest device (M)", r["formula_peak_min"], r["peak_min"]),
             (f"{_MEMORY}, fullest device (M): activation + weights", None,
              r.get("peak_memory_max"))]
    body = []
    for i, (name, fm, sim) in enumerate(lines):
        ideal = ""
        if i == 0:
            cls = "" if isinstance(slots, (int, np.integer)) else " class='none'"
            ideal = f"<td{cls}>{html.escape(_slots_text(r))}</td>"
        elif i == 1:  # one cell for the rows a table of slots has no figure for
            ideal = (f"<td rowspan='{len(lines) - 1}' class='none'>the ideal table counts "
                     "slots only: it has no bubble or memory figure</td>")
        body.append(f"<tr><th>{html.escape(name)}</th>{cell(fm)}{ideal}<td>{_fmt(sim)}</td></tr>")
    note = ""
    if v > 1 and isinstance(slots, (int, np.integer)):
        note = (f"<p class='foot'>ideal table: one slot per op; with v={v} chunks a slot is one "
                f"chunk's op (1/{v} of a device share's op time), so its {slots:,} slots are "
                f"not cost units (at f=b=w=1 a slot is 1/{v} cost unit).</p>")
    return ("<table class='views'><thead><tr><th></th><th>closed formula</th>"
            "<th>ideal table (slots, one per op)</th><th>simulation</th></tr></thead>"
            f"<tbody>{''.join(body)}</tbody></table>" + note)


def _slug(name: str, i: int) -> str:
    return "s{}-{}".format(i, "".join(ch if ch.isalnum() else "-" for ch in name))


# Zooming or panning one chart of a section moves the others' time axes
# with it (a double click, which resets, resets them all).
_LINK_JS = """
function linkTime(ids,end){
 function same(a,b){return a&&b&&Math.abs(a[0]-b[0])<1e-9&&Math.abs(a[1]-b[1])<1e-9;}
 ids.forEach(function(id){document.getElementById(id).on('plotly_relayout',function(e){
  var r=null;
  if(e['xaxis.range[0]']!==undefined)r=[e['xaxis.range[0]'],e['xaxis.range[1]']];
  else if(e['xaxis.range'])r=e['xaxis.range'];
  else if(e['xaxis.autorange'])r=[0,end];
  if(!r)return;
  ids.forEach(function(o){var d=document.getElementById(o);
   if(o!==id&&!same(d.layout.xaxis.range,r))Plotly.relayout(d,{'xaxis.range':r});});
 });});
}
"""

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
    a second hue for a second pipeline, shades by chunk; the critical path
    as a legend toggle), transfers per link when any takes time, memory
    per device over time (activation plus weights), all on one time axis
    (zooming one zooms the others; with several schedules, to the slowest
    one's end), and the three views (closed formula, ideal table,
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
        if r.get("error") or r.get("result") is None:
            notes.setdefault(f"not built: {r.get('error')}", len(notes) + 1)
        for f in r.get("flags") or []:
            notes.setdefault(f, len(notes) + 1)
    # One time axis for the page: to the slowest schedule's end.
    built = [float(r["result"].makespan) for r in rows if r.get("result") is not None]
    x_max = max(built) if len(built) > 1 else None
    if len(rows) > 1:
        lines = headline_lines(headline([dict(r, name=r["label"]) for r in rows], memory_limit))
        if differ:
            lines.append(f"(the results differ in {_and(list(differ))}: not one setting)")
        parts.append("<div class='headline'>" + "".join(
            f"<p>{html.escape(t)}</p>" for t in lines) + "</div>")
        parts.append(_summary(rows, notes, memory_limit,
                              {i: setting_text(st, differ) for i, st in settings.items()}
                              if differ else None))
    scripts = [_LINK_JS]
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
        gantt, note = _gantt_figure(res, critical, max_ops, x_max)
        if note:
            parts.append(f"<p class='note aggregated'>{html.escape(note)}</p>")
        figs = [("gantt", gantt), ("transfers", _transfer_figure(res, max_ops, x_max)),
                ("memory", _memory_figure(res, memory_limit, max_points=100_000, x_max=x_max))]
        divs = []
        for kind, fig in figs:
            if fig is None:
                continue
            div = f"{slug}-{kind}"
            divs.append(div)
            parts.append(f"<div id='{div}' class='plot {kind}'></div>")
            scripts.append(_new_plot(div, fig))
        end = gantt["layout"]["xaxis"]["range"][1]
        scripts.append(f"linkTime({json.dumps(divs)},{end!r});\n")
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
    """The sortable table of every schedule, with the terminal table's columns."""
    show_setting = bool(setting)
    head = [("schedule", ""), ("v", "chunks per device"),
            (f"{_MAKESPAN} (cost units)", "one training step"),
            (_RATIO, "idle share of p \u00d7 makespan"),
            (f"{_PEAK}, fullest device (M)", "activation memory at its peak"),
            (f"{_PEAK}, emptiest device (M)", "the least loaded device's peak"),
            (f"{_MEMORY}, fullest device (M)", "activation + weights: the memory chart's peak")]
    if memory_limit is not None:
        head.append((f"within {memory_limit:g} M", "peak memory at most the limit"))
    head.append((f"{_IDEAL} (slots)", "devices \u00d7 time slots, every op one slot"))
    head.append(("agree", "formula, ideal table and simulation"))
    if show_setting:
        head.append(("setting", "where the results differ"))
    out = ["<table class='summary'><thead><tr>"
           + "".join(f"<th title='{html.escape(t)}'"
                     + (" class='setting'" if h == "setting" else "") + f">{html.escape(h)}"
                     + (f"<br><span class='unit'>{html.escape(t)}</span>" if t else "") + "</th>"
                     for h, t in head) + "</tr></thead><tbody>"]
    v_rows = set()
    for i, r in enumerate(rows):
        slug = _slug(r["name"], i)
        name = f"<a href='#{slug}'>{html.escape(r.get('label', r['name']))}</a>"
        if r.get("error") or r.get("result") is None:
            # One cell across the figures' columns: this row has none.
            n = notes[f"not built: {r.get('error')}"]
            out.append(f"<tr><td>{name}</td><td>{r.get('chunks', '')}</td>"
                       f"<td colspan='{len(head) - 2 - show_setting}' class='none'>not built "
                       f"[{n}]</td>" + ("<td class='setting'></td>" if show_setting else "")
                       + "</tr>")
            continue
        flags = r.get("flags") or []
        agree = ("<span class='yes'>yes</span>" if not flags else
                 "<span class='no'>no</span> " + ",".join(f"[{notes[f]}]" for f in flags))
        slots = r.get("table_slots")
        if int(r.get("chunks") or 1) > 1 and isinstance(slots, (int, np.integer)):
            v_rows.add(int(r["chunks"]))
        cells = [f"<td>{name}</td><td>{r['chunks']}</td>"]
        for key, fmt, cls in (("makespan", _fmt, " class='makespan'"),
                              ("bubble_ratio", _ratio, ""), ("peak_max", _four, ""),
                              ("peak_min", _four, "")):
            text = _with_formula(r[key], r.get("formula_" + key), fmt)
            cells.append(f"<td{cls} data-v='{r[key]!r}'>{text}</td>")
        cells.append(f"<td class='memory' data-v='{r['peak_memory_max']!r}'>"
                     f"{_fmt(r['peak_memory_max'], 4)}</td>")
        if memory_limit is not None:
            fits = r["peak_memory_max"] <= memory_limit * (1 + 1e-9)
            cells.append(f"<td data-v='{int(fits)}'>"
                         + ("yes" if fits else "<span class='no'>no</span>") + "</td>")
        if isinstance(slots, (int, np.integer)):
            cells.append(f"<td class='slots' data-v='{int(slots)}'>"
                         f"{_with_formula(int(slots), r.get('formula_slots'), _fmt)}</td>")
        else:
            cells.append("<td class='slots none'>no ideal table</td>")
        cells.append(f"<td data-v='{len(flags)}'>{agree}</td>")
        if show_setting:
            cells.append("<td class='setting'>" + html.escape(setting.get(i, "")) + "</td>")
        out.append("<tr>" + "".join(cells) + "</tr>")
    out.append("</tbody></table>")
    out.append("<p class='foot'>A cell holds the simulation's figure and, in parentheses, the "
               f"closed formula's where they differ ({_NO_FORMULA}: the family has no formula "
               "for it). ideal table: length of the devices \u00d7 time-slots table, every op "
               "one slot"
               + (f"; where v={'/'.join(map(str, sorted(v_rows)))} a slot is one chunk's op "
                  "(1/v of a device share's), so those slots are not cost units: at f=b=w=1 a "
                  "slot is 1/v cost unit there and 1 where v=1" if v_rows else
                  " (at f=b=w=1 a slot is 1 cost unit)") + ".</p>")
    if notes:
        out.append("<p class='foot'>agree: the closed formula, the ideal table and the "
                   "simulation give the same makespan, bubble and peak. Where they do not, the "
                   "note names the column and the cause:</p>")
        out.extend(f"<p class='foot'>[{n}] {html.escape(f)}</p>" for f, n in notes.items())
    from ..analysis.compare import _counted_otherwise

    counted = _counted_otherwise(rows)
    if counted:  # the terminal table's "m counts" legend line
        out.append(f"<p class='foot'>m counts: {html.escape(counted)}.</p>")
    out.append("<p class='foot'>Sorted by makespan (ties by name). Click a column header to "
               "sort; click a name to jump to its charts.</p>")
    return "".join(out)

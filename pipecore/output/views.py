"""Small static views for Jupyter: a result's SVG Gantt, a schedule's
program grid, the Monte Carlo histogram, and the time axes and kind
legends they share (plain HTML and SVG, no JavaScript)."""

from __future__ import annotations

import html
import math
from typing import Any

import numpy as np
import pyarrow as pa

from ..core.ops import InputError
from ..core.result import plug
from ..core.schedule import Schedule
from .colours import op_styles, shade_hex

__all__ = ["nice_ticks", "svg_time_axis", "svg_kind_legend", "monte_carlo_html", "KIND_NAMES",
           "result_svg_html", "schedule_grid_html", "kind_codes", "table_styles"]

#: What each op kind does, for legends.
KIND_NAMES = {
    "F": "forward",
    "B": "backward (input)",
    "W": "backward (weights)",
    "BW": "backward (input and weights)",
    "R": "recompute",
    "AR": "gradient all-reduce",
    "O": "offload to host",
    "L": "load from host",
}

_FONT = "font-family='sans-serif'"


def nice_ticks(lo: float, hi: float, target: int = 6) -> list[float]:
    """Round tick values (1, 2, 2.5 or 5 times a power of ten apart) in [lo, hi].

    Parameters
    ----------
    lo, hi : float
        The axis range; ``hi > lo``.
    target : int, default 6
        About how many ticks.

    Returns
    -------
    list of float
        At least two ticks when the range allows, ascending.

    Raises
    ------
    ValueError
        If the range is empty or not finite.
    """
    if not (math.isfinite(lo) and math.isfinite(hi) and hi > lo):
        raise InputError(f"nice_ticks needs finite lo < hi (got {lo!r}, {hi!r})")
    raw = (hi - lo) / max(target, 1)
    mag = 10.0 ** math.floor(math.log10(raw))
    step = next(k * mag for k in (1.0, 2.0, 2.5, 5.0, 10.0) if k * mag >= raw * (1 - 1e-9))
    first = math.ceil(lo / step - 1e-9)
    last = math.floor(hi / step + 1e-9)
    # Rounded to the step's digits, so 0.1 * 3 prints as 0.3.
    digits = max(0, -math.floor(math.log10(step)) + 1)
    return [round(k * step, digits) for k in range(first, last + 1)]


def _num(v: float) -> str:
    return f"{v:g}"


def svg_time_axis(left: float, top: float, width: float, lo: float, hi: float,
                  title: str) -> tuple[str, float]:
    """A horizontal axis: line, ticks with their values, and a title.

    Parameters
    ----------
    left, top : float
        Pixel position of the axis line's left end.
    width : float
        Pixel length of the line, which spans ``lo`` to ``hi``.
    lo, hi : float
        Values at the two ends.
    title : str
        The axis title with its unit, e.g. "time (cost units)".

    Returns
    -------
    str
        SVG elements.
    float
        Pixels the axis takes below ``top``.

    Raises
    ------
    ValueError
        If ``lo >= hi``.
    """
    scale = width / (hi - lo)
    parts = [f"<line x1='{left:.1f}' y1='{top:.1f}' x2='{left + width:.1f}' y2='{top:.1f}' "
             "stroke='#333' stroke-width='1'/>"]
    for t in nice_ticks(lo, hi):
        x = left + (t - lo) * scale
        parts.append(f"<line x1='{x:.1f}' y1='{top:.1f}' x2='{x:.1f}' y2='{top + 4:.1f}' "
                     "stroke='#333' stroke-width='1'/>"
                     f"<text x='{x:.1f}' y='{top + 15:.1f}' text-anchor='middle'>{_num(t)}</text>")
    parts.append(f"<text x='{left + width / 2:.1f}' y='{top + 29:.1f}' text-anchor='middle' "
                 f"fill='#333'>{html.escape(title)}</text>")
    return "".join(parts), 34.0


def svg_kind_legend(entries: list, left: float, top: float, width: float) -> tuple[str, float]:
    """Colour swatches of the op kinds drawn (per pipeline, and the chunk
    shades), in rows.

    Parameters
    ----------
    entries : list of (str, str)
        (colour, label) pairs: :attr:`pipecore.output.colours.OpStyles.legend`.
        A label that starts with a kind gets the kind's name after it.
    left, top, width : float
        Pixel box the legend flows in.

    Returns
    -------
    str
        SVG elements.
    float
        Pixels the legend takes below ``top``.
    """
    parts, x, y = [], left, top
    for colour, label in entries:
        kind, _, rest = label.partition(",")
        if kind in KIND_NAMES:
            label = f"{kind} {KIND_NAMES[kind]}" + (f",{rest}" if rest else "")
        w = 16 + 6.2 * len(label) + 14  # swatch, text at about 6.2 px a character, gap
        if x > left and x + w > left + width:
            x, y = left, y + 16
        parts.append(f"<rect class='legend' x='{x:.1f}' y='{y:.1f}' width='10' height='10' "
                     f"fill='{colour}'/><text x='{x + 14:.1f}' y='{y + 9:.1f}'>"
                     f"{html.escape(label)}</text>")
        x += w
    return "".join(parts), (y - top + 16 if entries else 0.0)


def kind_codes(column) -> tuple[np.ndarray, list]:
    """Per-row codes into a list of kind names (no Python string per op)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not pa.types.is_dictionary(arr.type):
        arr = arr.dictionary_encode()
    names = arr.dictionary.to_pylist()
    return arr.indices.to_numpy(zero_copy_only=False).astype(np.int64), names


def table_styles(ops: pa.Table, devices: int, drawn: np.ndarray | None = None):
    """:func:`pipecore.output.colours.op_styles` of an op table."""
    code, names = kind_codes(ops.column("kind"))
    kind = np.asarray(names, dtype=object)[code] if code.size else np.zeros(0, dtype=str)
    return op_styles(kind, ops.column("device").to_numpy(), ops.column("stage").to_numpy(),
                     ops.column("microbatch").to_numpy(), devices, drawn=drawn)


def _jitter_words(j: Any) -> str:
    if j is None:
        return "no jitter"
    if j.dist == "empirical":
        what = f"empirical jitter ({len(j.factors):,} factors)"
    else:
        what = f"{j.dist} jitter, sigma {j.sigma:g}"
    return f"{what}, one factor per {j.per}, seed {j.seed}"


def monte_carlo_html(mc: Any, width: int = 520) -> str:
    """Headline, quantile table and histogram of a Monte Carlo result (Jupyter).

    Parameters
    ----------
    mc : pipecore.MonteCarlo
    width : int, default 520
        Width of the histogram in pixels.

    Returns
    -------
    str
        HTML.
    """
    x = np.asarray(mc.makespans, dtype=np.float64)
    unit = "cost units"
    s = mc.summary()
    head = (f"<div style='font-family:sans-serif;font-size:13px'><b>Monte Carlo</b>: "
            f"{x.size:,} draws ({html.escape(_jitter_words(mc.jitter))}) in {mc.seconds:.2f} s"
            f"<br>iteration time p50 <b>{s['p50']:.6g}</b>, p90 <b>{s['p90']:.6g}</b>, p99 "
            f"<b>{s['p99']:.6g}</b> {unit}</div>")
    cell = "<td style='text-align:right;padding:0 8px'>"
    p50 = s["p50"]
    rows = []
    for key, label in (("p50", "p50 (median)"), ("p90", "p90"), ("p99", "p99"), ("mean", "mean"),
                       ("std", "standard deviation"), ("min", "min"), ("max", "max")):
        v = s[key]
        rel = "" if key == "std" or p50 == 0 else f"{(v / p50 - 1) * 100:+.2f}%"
        rows.append(f"<tr><td style='padding:0 8px'>{label}</td>{cell}{v:.6g}</td>{cell}{rel}</td>"
                    "</tr>")
    th = "<th style='padding:0 8px;text-align:right'>"
    table = ("<table style='font-family:sans-serif;font-size:12px;border-collapse:collapse'>"
             f"<thead><tr><th></th>{th}iteration time ({unit})</th>{th}against p50</th></tr>"
             "</thead>"
             f"<tbody>{''.join(rows)}</tbody></table>")
    return head + table + _histogram_svg(x, s, width, unit)


def _histogram_svg(x: np.ndarray, s: dict, width: int, unit: str) -> str:
    lo, hi = float(x.min()), float(x.max())
    if hi <= lo:  # every draw the same: a range around it to draw in
        pad = abs(lo) * 0.01 or 1.0
        lo, hi = lo - pad, hi + pad
    bins = int(min(40, max(1, x.size)))
    counts, edges = np.histogram(x, bins=bins, range=(lo, hi))
    left, right, top, plot_h = 44.0, 12.0, 22.0, 110.0
    plot_w = width - left - right
    sx = plot_w / (hi - lo)
    peak = int(counts.max()) or 1
    bars = []
    for c, a, b in zip(counts.tolist(), edges[:-1].tolist(), edges[1:].tolist()):
        if c:
            h = plot_h * c / peak
            bars.append(f"<rect x='{left + (a - lo) * sx:.1f}' y='{top + plot_h - h:.1f}' "
                        f"width='{max((b - a) * sx - 1, 0.5):.1f}' height='{h:.1f}' "
                        "fill='#9db4d8'/>")
    # Quantile labels in order, 24 px apart at least, inside the drawing.
    xs = [left + (s[k] - lo) * sx for k in ("p50", "p90", "p99")]
    tx = list(xs)
    for i in range(1, 3):
        tx[i] = max(tx[i], tx[i - 1] + 24)
    tx[2] = min(tx[2], width - 12.0)
    for i in (1, 0):
        tx[i] = min(tx[i], tx[i + 1] - 24)
    marks = [f"<line x1='{xv:.1f}' y1='{top - 2:.1f}' x2='{xv:.1f}' y2='{top + plot_h:.1f}' "
             f"stroke='#c44e52' stroke-dasharray='3,2'/><text x='{t:.1f}' y='{top - 6:.1f}' "
             f"text-anchor='middle' fill='#c44e52'>{key}</text>"
             for key, xv, t in zip(("p50", "p90", "p99"), xs, tx)]
    yaxis = (f"<line x1='{left:.1f}' y1='{top:.1f}' x2='{left:.1f}' y2='{top + plot_h:.1f}' "
             "stroke='#333'/>"
             f"<text x='{left - 4:.1f}' y='{top + 4:.1f}' text-anchor='end'>{peak:,}</text>"
             f"<text x='{left - 4:.1f}' y='{top + plot_h:.1f}' text-anchor='end'>0</text>"
             f"<text transform='translate(12,{top + plot_h / 2:.1f}) rotate(-90)' "
             "text-anchor='middle' fill='#333'>draws</text>")
    axis, axis_h = svg_time_axis(left, top + plot_h, plot_w, lo, hi, f"iteration time ({unit})")
    h = top + plot_h + axis_h + 4
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{width}' height='{h:.0f}' "
            f"font-size='10' {_FONT}>{''.join(bars)}{yaxis}{''.join(marks)}{axis}</svg>")




def result_svg_html(result: Any, max_ops: int = 5000, width: int = 720) -> str:
    """An inline SVG Gantt and the headline numbers of a result (Jupyter).

    One row per device, one box per op coloured as in the Gantt charts
    (kind, second pipeline, chunk shades), a time axis in cost units with
    round ticks, and a legend of the colours drawn.

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
    styles = table_styles(ops, p, drawn=finish > start)
    ms = float(result.makespan) or 1.0
    row_h, left, right = 14, 40, 10
    sx = (width - left - right) / ms
    h = p * row_h + 4
    rects = []
    for i in np.flatnonzero(finish > start).tolist():
        rects.append(f"<rect x='{left + start[i] * sx:.1f}' y='{device[i] * row_h + 2}' "
                     f"width='{max((finish[i] - start[i]) * sx - 0.4, 0.4):.1f}' "
                     f"height='{row_h - 3}' fill='{styles.colours[styles.style[i]]}'/>")
    labels = "".join(f"<text x='{left - 4}' y='{d * row_h + row_h - 2}' text-anchor='end'>{d}"
                     "</text>" for d in range(p))
    device_title = (f"<text transform='translate(10,{h / 2:.1f}) rotate(-90)' "
                    "text-anchor='middle' fill='#333'>device</text>")
    axis, axis_h = svg_time_axis(left, h, width - left - right, 0.0, ms, "time (cost units)")
    legend, legend_h = svg_kind_legend(styles.legend, left, h + axis_h + 2, width - left - right)
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
    styles = table_styles(t, p)
    limit = max(1, max_ops // max(p, 1))
    # Only the shown ops become Python objects (a huge schedule stays quick).
    counts = np.bincount(device, minlength=p)
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    order = np.argsort(device, kind="stable")
    rank = np.empty(device.size, dtype=np.int64)
    rank[order] = np.arange(device.size) - first[device[order]]
    shown = np.flatnonzero(rank < limit)
    mb = t.column("microbatch").to_numpy()[shown]
    stage = t.column("stage").to_numpy()[shown]
    progs: list[list[str]] = [[] for _ in range(p)]
    for d, s, j, st in zip(device[shown].tolist(), styles.style[shown].tolist(), mb.tolist(),
                           stage.tolist()):
        # Light enough for black text: the style's colour, half way to white.
        colour = shade_hex(styles.colours[s], 0.5)
        k = styles.kinds[s]
        progs[d].append(f"<td style='background:{colour};padding:0 2px;border:1px solid #fff'"
                        f" title='{html.escape(styles.hovers[s])} stage {st} mb {j}'>{k}{j}</td>")
    cut = bool((counts > limit).any())
    rows = "".join(f"<tr><th>{d}</th>{''.join(cells)}</tr>" for d, cells in enumerate(progs))
    shades = ("; lighter = later chunk" if styles.n_chunks > 1 else "")
    pipes = ("; second hue = second pipeline" if len(styles.entries) == 2 else "")
    head = (f"<div style='font-family:sans-serif;font-size:13px'><b>{html.escape(schedule.name)}"
            f"</b>: {p} devices, {schedule.microbatches} microbatches, {schedule.num_ops} ops "
            f"(device programs in order; F3 = forward of microbatch 3{pipes}{shades})"
            + (f"; first {limit} ops per device shown" if cut else "") + "</div>")
    return (head + "<table style='border-collapse:collapse;font-size:10px;font-family:monospace'>"
            + rows + "</table>")


plug("monte_carlo_html", monte_carlo_html)
plug("result_html", result_svg_html)
Schedule._html_view = staticmethod(schedule_grid_html)

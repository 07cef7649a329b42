"""Small static views for Jupyter: SVG time axes, kind legends and the
Monte Carlo histogram (plain HTML and SVG, no JavaScript)."""

from __future__ import annotations

import html
import math
from typing import Any

import numpy as np

from ..core.ops import InputError
from ..core.result import plug
from .colours import KIND_COLOURS, KIND_ORDER, UNKNOWN_COLOUR, shade_hex

__all__ = ["nice_ticks", "svg_time_axis", "svg_kind_legend", "monte_carlo_html", "KIND_NAMES"]

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


def svg_kind_legend(kinds: list, chunks: int, left: float, top: float,
                    width: float) -> tuple[str, float]:
    """Colour swatches of the op kinds drawn (and the chunk shades), in rows.

    Parameters
    ----------
    kinds : list of str
        Kinds present, in drawing order.
    chunks : int
        Chunks per device; above 1 a swatch per chunk's shade follows.
    left, top, width : float
        Pixel box the legend flows in.

    Returns
    -------
    str
        SVG elements.
    float
        Pixels the legend takes below ``top``.
    """
    entries = [(shade_hex(KIND_COLOURS.get(k, UNKNOWN_COLOUR), 0.0),  # as the boxes write it
               f"{k} {KIND_NAMES[k]}" if k in KIND_NAMES else str(k)) for k in kinds]
    if chunks > 1:
        entries += [(shade_hex("#595959", 0.45 * c / (chunks - 1)),
                     f"chunk {c}" + (" (lighter: later chunk)" if c == chunks - 1 else ""))
                    for c in range(chunks)]
    parts, x, y = [], left, top
    for colour, label in entries:
        w = 16 + 6.2 * len(label) + 14  # swatch, text at about 6.2 px a character, gap
        if x > left and x + w > left + width:
            x, y = left, y + 16
        parts.append(f"<rect class='legend' x='{x:.1f}' y='{y:.1f}' width='10' height='10' "
                     f"fill='{colour}'/><text x='{x + 14:.1f}' y='{y + 9:.1f}'>"
                     f"{html.escape(label)}</text>")
        x += w
    return "".join(parts), (y - top + 16 if entries else 0.0)


def kinds_in_order(names: list) -> list:
    """The kinds in ``names`` in the fixed legend order, unknown ones last."""
    return [k for k in KIND_ORDER if k in names] + sorted(set(names) - set(KIND_ORDER))


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


plug("monte_carlo_html", monte_carlo_html)

"""Gantt charts of results as PNG (matplotlib, the ``pipecore[plot]`` extra):
one row per device, one bar per op coloured by kind (a second hue for a
second pipeline, shades for chunks), microbatch numbers in the boxes they
fit, and several charts on one time scale for ``pipecore compare``.

The charts of one call share a frame: one time axis (to the slowest
result's end), one size in pixels and one label size, so that they can be
laid side by side. They are drawn straight on matplotlib's Agg renderer,
without a Figure or Axes: the frame (axes, ticks, labels) is drawn once
and copied under each chart, whose bars, numbers and text are a few
paths in pixels. A figure's artists, their layout and the import of
matplotlib's plotting modules were most of a chart's time before.
"""

from __future__ import annotations

import math
import os
import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..core.cpus import local_cpus
from ..core.result import plug
from .colours import op_styles
from .columns import (
    TRANSFER_COLUMNS,
    PathLike,
    critical_rows,
    critical_table,
    floats,
    ints,
    op_arrays,
    require_columns,
)
from .errors import MissingDependencyError
from .outlines import (
    DIGIT_EM,
    DIGIT_TALL_EM,
    INK_EM,
    STACK_GAP_EM,
    key_layout,
    key_marks,
    make_numbers,
    number_paths,
    text_lines,
)
from .views import nice_ticks

__all__ = ["write_gantt", "write_gantts"]

_DPI = 100
_AXES_PX = (800, 1800)  # axes width bounds: the whole chart fits a screen at 100 %
_ROW_PX = 36.0  # a device row's height in pixels ...
_TALL_PX = 2400.0  # ... until the rows together pass this; then thinner rows
_MIN_AXES_PX = 96.0  # one or two devices still get bars of a readable height
_BAR = 0.8  # a bar's height in rows
_LABEL_PT = (6.0, 8.0)  # microbatch numbers: no smaller (unreadable), no larger
# Pixels around the axes: device labels and their title on the left, half
# the last time label on the right, time labels and their title below.
_LEFT_PX, _RIGHT_PX, _BOTTOM_PX = 64, 24, 46
_TITLE_PT, _TITLE_LINE_PX, _LEGEND_ROW_PX = 12, 20, 17
_KEY_EM_PX = 8 * _DPI / 72.0  # the key's labels: 8 pt
# Key entries besides the colours: (what, style, label), see outlines.key_layout.
_STACKED_KEY = ("note", None, "narrow boxes: numbers stacked, read top down")
_MAKESPAN_LINE = {"color": "#333333", "lw": 1.0, "dashes": [4, 3]}
_TRANSFER_KEY = ("line", {"color": "#000000", "lw": 0.8, "alpha": 0.6}, "transfer")
_CRITICAL_PATH = {"color": "#000000", "lw": 1.8}
_CRITICAL_TRANSFER = {"color": "#D62728", "lw": 1.4}
_CRITICAL_KEYS = [("line", _CRITICAL_PATH, "critical path"),
                  ("line", _CRITICAL_TRANSFER, "critical transfer")]
# The frame as matplotlib draws axes by default: 10 pt text, 0.8 pt black
# spines and ticks 3.5 pt long, labels 3.5 pt from them; a faint grid.
_TEXT_PX = 10 * _DPI / 72.0
_TICK_PX = 3.5 * _DPI / 72.0
_SPINE = {"color": "#000000", "lw": 0.8}
_GRID = {"color": "#b0b0b0", "lw": 0.3, "alpha": 0.5}


@dataclass
class _Chart:
    """One result's arrays, ready to draw."""

    result: Any
    n_dev: int
    makespan: float
    end: float  # where its last op finishes (the makespan, or later)
    start: np.ndarray
    finish: np.ndarray
    y0: np.ndarray
    y1: np.ndarray
    mb: np.ndarray
    visible: np.ndarray
    labelable: np.ndarray
    rgb: np.ndarray  # each op's colour, 0-1
    style: np.ndarray  # each op's style (kind, pipeline, chunk): ops of one share a colour
    legend: list
    title: str
    flat: np.ndarray = field(default=None)  # numbers drawn on one line
    stacked: np.ndarray = field(default=None)  # numbers drawn digit above digit

    @property
    def labelled(self) -> int:
        return int(np.count_nonzero(self.flat) + np.count_nonzero(self.stacked))

    @property
    def labelable_count(self) -> int:
        return int(np.count_nonzero(self.labelable))

    def note(self) -> str | None:
        """What the title says about numbers left out (None: every op has its number)."""
        shown, total = self.labelled, self.labelable_count
        if shown == total:
            return None
        if shown == 0:
            return f"microbatch numbers left out: at this size none fits its box ({total:,} ops)"
        return f"microbatch numbers shown where they fit: {shown:,} of {total:,} ops"


@dataclass
class _Scale:
    """What the charts of one call share."""

    x_max: float
    axes_px: int
    label_pt: float


def _prepare(result: Any, title: str | None) -> _Chart:
    cols, n_dev = op_arrays(result)
    device, stage, mb, kind = cols.device, cols.stage, cols.microbatch, cols.kind
    start, finish = cols.start, cols.finish
    n_dev = max(n_dev, 1)
    makespan = float(getattr(result, "makespan", 0.0) or 0.0)
    end = makespan
    if finish.size:
        end = max(end, float(np.nanmax(finish)))
    if not (math.isfinite(end) and end > 0):
        end = 1.0
    # Zero-length ops (W with w = 0, say) would be white gaps and legend
    # entries for nothing: they are not drawn.
    visible = finish > start
    y0 = device - _BAR / 2
    y1 = device + _BAR / 2
    # An overlapped F&B unit is two rows with the same device and slot: draw
    # its F in the top half of the bar and its backward in the bottom half.
    if device.size > 1:
        slot = cols.slot
        second = np.zeros(device.size, dtype=bool)
        second[1:] = (device[1:] == device[:-1]) & (slot[1:] == slot[:-1])
        first = np.zeros(device.size, dtype=bool)
        first[:-1] = second[1:]
        y1 = np.where(first, device, y1)
        y0 = np.where(second, device, y0)
    styles = op_styles(kind, device, stage, mb, n_dev, drawn=visible)
    palette = np.array([[int(c[i:i + 2], 16) / 255.0 for i in (1, 3, 5)] for c in styles.colours],
                       dtype=np.float64).reshape(-1, 3)
    rgb = palette[styles.style] if device.size else np.zeros((0, 3))
    return _Chart(result=result, n_dev=n_dev, makespan=makespan, end=end, start=start,
                  finish=finish, y0=np.asarray(y0, dtype=np.float64),
                  y1=np.asarray(y1, dtype=np.float64), mb=mb, visible=visible,
                  labelable=visible & (kind != "AR") & (mb >= 0), rgb=rgb, style=styles.style,
                  legend=styles.legend,
                  title=_default_title(result) if title is None else str(title))


def _row_px(n_dev: int) -> float:
    """A device row's height in pixels."""
    return max(min(_ROW_PX, _TALL_PX / n_dev), _MIN_AXES_PX / n_dev, 1.0)


def _needs(mb: np.ndarray, label_pt: float) -> tuple:
    """Pixels a number needs, written flat and stacked: (width, height) each.

    The ink and a pixel of room on each side; a one-digit number is the
    same either way, so it is never stacked.
    """
    em = label_pt * _DPI / 72.0
    digits = np.floor(np.log10(np.maximum(mb, 1))).astype(np.int64) + 1
    flat_w = ((digits - 1) * DIGIT_EM + INK_EM) * em + 2.0
    flat_h = np.full(mb.size, DIGIT_TALL_EM * em + 2.0)
    stack_w = np.where(digits > 1, INK_EM * em + 2.0, np.inf)
    stack_h = (digits * DIGIT_TALL_EM + (digits - 1) * STACK_GAP_EM) * em + 2.0
    return flat_w, flat_h, stack_w, stack_h


def _choose_scale(charts: list[_Chart]) -> _Scale:
    """One time axis, width and label size for every chart.

    The axis runs to the latest end of any chart. The numbers get the
    largest size in ``_LABEL_PT`` (at most half a bar's height) at which
    nine in ten of all the charts' numbers fit axes no wider than
    ``_AXES_PX``, flat or, in a box too narrow, stacked digit above digit;
    the smallest size when none does.
    """
    x_max = max(c.end for c in charts)
    lo, hi = _LABEL_PT
    row = min(_row_px(c.n_dev) for c in charts)
    top = min(hi, 0.5 * _BAR * row * 72.0 / _DPI)
    sizes = [top - k * 0.5 for k in range(int((top - lo) / 0.5) + 1)] if top >= lo else [lo]
    width = np.concatenate([c.finish - c.start for c in charts])
    height = np.concatenate([(c.y1 - c.y0) * _row_px(c.n_dev) for c in charts])
    mb = np.concatenate([c.mb for c in charts])
    cand = np.concatenate([c.labelable for c in charts]) & (width > 0)
    wanted = 0.0
    label_pt = sizes[-1]
    for label_pt in sizes:
        flat_w, flat_h, stack_w, stack_h = _needs(mb[cand], label_pt)
        h = height[cand]
        # Axis units per pixel each number needs, the cheaper way it fits.
        need = np.minimum(np.where(h >= flat_h, flat_w, np.inf),
                          np.where(h >= stack_h, stack_w, np.inf)) / width[cand]
        wanted = float(np.quantile(need, 0.9)) * x_max if cand.any() else 0.0
        if wanted <= _AXES_PX[1]:
            break
    axes_px = int(math.ceil(float(np.clip(wanted, *_AXES_PX)) - 1e-6))
    return _Scale(x_max=x_max, axes_px=axes_px, label_pt=label_pt)


def _fit_labels(chart: _Chart, scale: _Scale) -> None:
    """Which numbers are drawn, and which of them stacked."""
    px = scale.axes_px / scale.x_max
    # A hair of slack: a box exactly as wide as its number (the width was
    # chosen so) must not be lost to rounding.
    w = (chart.finish - chart.start) * px + 1e-6
    h = (chart.y1 - chart.y0) * _row_px(chart.n_dev)
    flat_w, flat_h, stack_w, stack_h = _needs(chart.mb, scale.label_pt)
    chart.flat = chart.labelable & (w >= flat_w) & (h >= flat_h)
    chart.stacked = chart.labelable & ~chart.flat & (w >= stack_w) & (h >= stack_h)


class _Frame:
    """An Agg canvas with the axes, ticks and axis titles drawn once, copied
    under each chart's bars, numbers, title and key."""

    def __init__(self, n_dev: int, scale: _Scale, top_px: int, key_top: int, xlabel: str,
                 agg: Any):
        self.n_dev = n_dev
        self.scale = scale
        self.top_px = top_px
        self.key_top = key_top  # pixels from the picture's top to the key's first row
        self.agg = agg
        self.row = _row_px(n_dev)
        self.axes_h = int(round(self.row * n_dev))
        self.row = self.axes_h / n_dev
        self.width = _LEFT_PX + scale.axes_px + _RIGHT_PX
        self.height = top_px + self.axes_h + _BOTTOM_PX
        self.renderer = agg.RendererAgg(self.width, self.height, _DPI)
        self.axes = agg.Bbox.from_bounds(_LEFT_PX, _BOTTOM_PX, scale.axes_px, self.axes_h)
        # Time to x and device (0 at the top) to y, in pixels with y up.
        self.to_px = agg.Affine2D().scale(scale.axes_px / scale.x_max, -self.row).translate(
            _LEFT_PX, _BOTTOM_PX + self.axes_h - 0.5 * self.row)
        self._draw_axes(xlabel)
        self.background = self.renderer.copy_from_bbox(
            agg.Bbox.from_bounds(0, 0, self.width, self.height))

    def fill(self, path: Any, colour: Any, clip: bool = False) -> None:
        """Fill a path given in pixels."""
        gc = self.renderer.new_gc()
        gc.set_linewidth(0)
        if clip:
            gc.set_clip_rectangle(self.axes)
        self.renderer.draw_path(gc, path, self.agg.IdentityTransform(),
                                self.agg.to_rgb(colour))
        gc.restore()

    def stroke(self, path: Any, style: dict, clip: bool = False) -> None:
        """Stroke a path given in pixels: ``style`` has ``color``, ``lw`` in
        points, and optionally ``alpha`` and ``dashes`` (points)."""
        gc = self.renderer.new_gc()
        gc.set_linewidth(style["lw"])
        gc.set_foreground(style["color"])
        gc.set_capstyle("butt")
        if "alpha" in style:
            gc.set_alpha(style["alpha"])
        if "dashes" in style:
            gc.set_dashes(0, style["dashes"])
        if clip:
            gc.set_clip_rectangle(self.axes)
        self.renderer.draw_path(gc, path, self.agg.IdentityTransform())
        gc.restore()

    def _draw_axes(self, xlabel: str) -> None:
        Path = self.agg.Path
        x0, y0, x1, y1 = _LEFT_PX, _BOTTOM_PX, _LEFT_PX + self.scale.axes_px, self.axes.y1
        self.fill(Path([(0, 0), (0, self.height), (self.width, self.height), (self.width, 0),
                        (0, 0)], closed=True), "white")
        # Round times, about one per 150 pixels, as lines across the axes.
        ticks = [t for t in nice_ticks(0.0, self.scale.x_max, max(2, self.scale.axes_px // 150))
                 if 0 <= t <= self.scale.x_max]
        xs = [x0 + t / self.scale.x_max * self.scale.axes_px for t in ticks]
        self.stroke(_segments([((x, y0), (x, y1)) for x in xs]), _GRID)
        # Every device named where rows are tall enough for its label.
        stride = max(1, math.ceil(14.0 / self.row))
        devices = range(0, self.n_dev, stride)
        ys = [y1 - (d + 0.5) * self.row for d in devices]
        self.stroke(_segments([((x, y0), (x, y0 - _TICK_PX)) for x in xs]
                              + [((x0, y), (x0 - _TICK_PX, y)) for y in ys]), _SPINE)
        labels = [text_lines(f"{t:g}", x, y0 - 2 * _TICK_PX, _TEXT_PX, 0) for t, x in
                  zip(ticks, xs)]
        labels += [text_lines(f"d{d}", x0 - 2 * _TICK_PX, y + 0.365 * _TEXT_PX, _TEXT_PX, 0,
                              align="right") for d, y in zip(devices, ys)]
        labels.append(text_lines(xlabel, (x0 + x1) / 2, y0 - 2 * _TICK_PX - 1.45 * _TEXT_PX,
                                 _TEXT_PX, 0))
        # "device" up the left side, read bottom to top.
        labels.append(text_lines("device", 0, 0, _TEXT_PX, 0).transformed(
            self.agg.Affine2D().rotate_deg(90).translate(12 + 0.73 * _TEXT_PX / 2,
                                                         (y0 + y1) / 2)))
        self.fill(Path.make_compound_path(*labels), "black")
        self._draw_spines()

    def _draw_spines(self) -> None:
        b = self.axes
        self.stroke(self.agg.Path([(b.x0, b.y0), (b.x0, b.y1), (b.x1, b.y1), (b.x1, b.y0),
                                   (b.x0, b.y0)], closed=True), _SPINE)

    def render(self, chart: _Chart, out: Path, show_transfers: bool = False,
               path_table: pa.Table | None = None) -> None:
        """Draw one chart over a copy of the frame and write it as PNG."""
        self.renderer.restore_region(self.background)
        corners = self._bars(chart)
        extra = self._transfers(chart) if show_transfers else []
        idx = np.flatnonzero(chart.flat | chart.stacked)
        if idx.size:
            # Dark text on light bars, white on dark ones.
            lum = chart.rgb[idx] @ np.array([0.299, 0.587, 0.114])
            at = self.to_px.transform(np.column_stack([(chart.start[idx] + chart.finish[idx]) / 2,
                                                       (chart.y0[idx] + chart.y1[idx]) / 2]))
            for path, colour in number_paths(at, chart.mb[idx], chart.stacked[idx], lum > 0.6,
                                             self.scale.label_pt * _DPI / 72.0):
                self.fill(path, colour, clip=True)
        if path_table is not None:
            extra += self._critical(path_table, corners)
        self._draw_spines()  # bars at the edges would hide them
        note = chart.note()
        title = chart.title if note is None else f"{chart.title}\n{note}"
        self.fill(text_lines(title, _LEFT_PX + self.scale.axes_px / 2, self.height - 6,
                             _TITLE_PT * _DPI / 72.0, _TITLE_LINE_PX), "black")
        entries = _key_entries(chart, self.scale.x_max, extra)
        for what, path, style in key_marks(entries, _LEFT_PX, self.height - self.key_top,
                                           self.scale.axes_px, _LEGEND_ROW_PX, _KEY_EM_PX):
            if what == "fill":
                self.fill(path, style)
            else:
                self.stroke(path, style)
        _write_png(self.renderer, out, {
            "Title": title, "Software": "pipecore",
            "pipecore:labels": str(chart.labelled),
            "pipecore:ops": str(chart.labelable_count),
            "pipecore:legend": " | ".join(e[2] for e in entries),
            "pipecore:time_axis": (f"0 to {self.scale.x_max:g} cost units over pixels "
                                   f"{_LEFT_PX} to {_LEFT_PX + self.scale.axes_px}")})

    def _bars(self, chart: _Chart) -> np.ndarray:
        """Draw the bars and the makespan's line; return every op's corners in pixels."""
        corners = np.empty((chart.start.size, 4, 2), dtype=np.float64)
        corners[:, 0, 0] = corners[:, 1, 0] = chart.start
        corners[:, 2, 0] = corners[:, 3, 0] = chart.finish
        corners[:, 0, 1] = corners[:, 3, 1] = chart.y0
        corners[:, 1, 1] = corners[:, 2, 1] = chart.y1
        corners = self.to_px.transform(corners.reshape(-1, 2)).reshape(-1, 4, 2)
        vis = chart.visible
        if vis.any():
            bars = corners[vis]
            # A hair of white between adjacent bars: each is inset by a fifth of
            # a pixel. Not where most bars are under 3 pixels wide: the gaps
            # would then pale everything.
            if float(np.median(bars[:, 2, 0] - bars[:, 0, 0])) >= 3.0:
                bars = bars + np.array([[0.2, -0.2], [0.2, 0.2], [-0.2, 0.2], [-0.2, -0.2]])
            # One path per colour: the renderer fills a few paths, not one per bar.
            styles = chart.style[vis]
            order = np.argsort(styles, kind="stable")
            for group in np.split(order, np.flatnonzero(np.diff(styles[order])) + 1):
                self.fill(_rectangles(bars[group]), tuple(chart.rgb[vis][group[0]]), clip=True)
        if 0 < chart.makespan < self.scale.x_max * (1 - 1e-9):
            # The axis runs on to the slowest chart's end: mark this one's.
            x = self.to_px.transform([(chart.makespan, 0)])[0, 0]
            self.stroke(_segments([((x, self.axes.y0), (x, self.axes.y1))]), _MAKESPAN_LINE)
        return corners

    def _transfers(self, chart: _Chart) -> list:
        """Draw each transfer as a thin line sender to receiver; return its key entry."""
        transfers = getattr(chart.result, "transfers", None)
        if transfers is None or not transfers.num_rows:
            return []
        require_columns(transfers, TRANSFER_COLUMNS, "transfers")
        a = self.to_px.transform(np.column_stack([floats(transfers, "start"),
                                                  ints(transfers, "src_device")]))
        b = self.to_px.transform(np.column_stack([floats(transfers, "arrival"),
                                                  ints(transfers, "dst_device")]))
        # Fainter as they get denser, so thousands do not hide the bars.
        alpha = float(np.clip(0.35 * 300.0 / max(len(a), 1), 0.03, 0.35))
        self.stroke(_segments(list(zip(map(tuple, a), map(tuple, b)))),
                    {"color": "#000000", "lw": 0.5, "alpha": alpha}, clip=True)
        return [_TRANSFER_KEY]

    def _critical(self, path_table: pa.Table, corners: np.ndarray) -> list:
        """Outline the critical path's ops, draw its transfers as arrows;
        return the key entries."""
        op_rows, _ = critical_rows(path_table)
        rows = np.array(sorted(op_rows), dtype=np.int64)
        if rows.size:
            self.stroke(_rectangles(corners[rows]), _CRITICAL_PATH)
        d = path_table.select(["element", "device", "dst_device", "row", "start",
                               "finish"]).to_pydict()
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
            (xa, ya), (xb, yb) = self.to_px.transform([(s, src), (f, dst)])
            self._arrow(xa, ya, xb, yb)
        return _CRITICAL_KEYS[:1 + bool(spans)]

    def _arrow(self, xa: float, ya: float, xb: float, yb: float) -> None:
        length = math.hypot(xb - xa, yb - ya)
        if length < 1e-9:
            return
        ux, uy = (xb - xa) / length, (yb - ya) / length
        head = min(9.0, length)
        bx, by = xb - ux * head, yb - uy * head
        self.stroke(_segments([((xa, ya), (bx, by))]), _CRITICAL_TRANSFER)
        self.fill(self.agg.Path([(xb, yb), (bx - uy * 3.5, by + ux * 3.5),
                                 (bx + uy * 3.5, by - ux * 3.5), (xb, yb)], closed=True),
                  _CRITICAL_TRANSFER["color"])


def _segments(pairs: list) -> Any:
    """One path of separate straight lines, from ((x, y), (x, y)) pairs."""
    from matplotlib.path import Path as MplPath

    n = len(pairs)
    verts = np.asarray(pairs, dtype=np.float64).reshape(-1, 2) if n else np.zeros((0, 2))
    codes = np.tile(np.array([MplPath.MOVETO, MplPath.LINETO], dtype=MplPath.code_type), n)
    return MplPath(verts, codes)


def _rectangles(corners: np.ndarray) -> Any:
    """One path of many rectangles, from their (n, 4, 2) corners."""
    from matplotlib.path import Path as MplPath

    n = corners.shape[0]
    verts = np.concatenate([corners, corners[:, :1]], axis=1).reshape(-1, 2)
    codes = np.tile(np.array([MplPath.MOVETO, MplPath.LINETO, MplPath.LINETO, MplPath.LINETO,
                              MplPath.CLOSEPOLY], dtype=MplPath.code_type), n)
    return MplPath(verts, codes)


def _write_png(renderer: Any, out: Path, meta: dict) -> None:
    from PIL import Image, PngImagePlugin

    w, h = int(renderer.width), int(renderer.height)
    image = Image.frombuffer("RGBA", (w, h), renderer.buffer_rgba(), "raw", "RGBA", 0, 1)
    info = PngImagePlugin.PngInfo()
    # The title, the label counts and the legend go into the PNG's text
    # chunks, so a reader (or a test) gets them without looking at the pixels.
    for k, v in meta.items():
        info.add_text(k, v)
    # A chart holds a few flat colours and their anti-aliased edges: 256
    # palette colours keep it as it looks, and a palette PNG is a third the
    # size of an RGB one and quicker to encode.
    # Method 2 is the fast octree (Image.Quantize.FASTOCTREE), dither 0 none:
    # numbers, as older Pillows have no names for them.
    image.convert("RGB").quantize(256, method=2, dither=0).save(
        out, format="PNG", pnginfo=info, compress_level=2, dpi=(_DPI, _DPI))


class _Agg:
    """The matplotlib names the charts use, imported once (an optional
    extra): the Agg renderer and paths, not its figures and axes."""

    def __init__(self, who: str):
        try:
            from matplotlib.backends.backend_agg import RendererAgg
            from matplotlib.colors import to_rgb
            from matplotlib.path import Path
            from matplotlib.transforms import Affine2D, Bbox, IdentityTransform
            from PIL import Image  # noqa: F401  (matplotlib's own dependency)
        except ImportError as exc:
            raise MissingDependencyError(
                f"{who} needs matplotlib: pip install 'pipecore[plot]'") from exc
        vars(self).update(RendererAgg=RendererAgg, to_rgb=to_rgb, Path=Path, Affine2D=Affine2D,
                          Bbox=Bbox, IdentityTransform=IdentityTransform)


def _key_entries(chart: _Chart, x_max: float, extra: list) -> list:
    """What a chart's key lists: its colours, its makespan's line when the
    axis runs on past it, ``extra`` (transfers, the critical path) and a
    word on stacked numbers when it has some."""
    entries = [("patch", c, t) for c, t in chart.legend]
    if 0 < chart.makespan < x_max * (1 - 1e-9):
        entries.append(("line", _MAKESPAN_LINE, f"makespan {chart.makespan:g}"))
    entries += extra
    if chart.stacked.any():
        entries.append(_STACKED_KEY)
    return entries


def _frames(charts: list[_Chart], scale: _Scale, xlabel: str, agg: Any,
            extra: list = ()) -> dict:
    """A frame per device count, all as wide, with room above for the
    tallest title and key among the charts."""
    lines = 1 + any(c.note() is not None for c in charts)
    rows = 0
    for c in charts:
        entries = _key_entries(c, scale.x_max, list(extra))
        rows = max(rows, key_layout(entries, scale.axes_px, _KEY_EM_PX)[1])
    key_top = 6 + lines * _TITLE_LINE_PX + 6
    top = key_top + rows * _LEGEND_ROW_PX + 6
    return {n: _Frame(n, scale, top, key_top, xlabel, agg)
            for n in sorted({c.n_dev for c in charts})}


def write_gantt(
    result: Any,
    path: PathLike,
    title: str | None = None,
    show_transfers: bool = False,
    critical: bool = False,
) -> Path:
    """Draw a Gantt chart of a result and save it as PNG.

    One row per device (device 0 at the top), one bar per op coloured by
    kind (F, B, W, BW, AR, R). Where a schedule runs two pipelines
    (Chimera, BitPipe, DualPipe: a microbatch's pipeline is the one whose
    first stage it starts on) the second pipeline's ops take a neighbouring
    hue (F teal beside blue, BW magenta beside purple); where a device
    holds several stages of a pipeline, its first chunk is darker and its
    last lighter. The legend above the chart names what each colour and
    shade means.

    Each op's box holds its microbatch number where it fits at the chart's
    one label size (6 to 8 pt, the largest at which nine in ten fit),
    written flat or, in a box too narrow for that, digit above digit; the
    chart is as wide as that needs, within about 900 to 1,900 pixels, so it
    reads at the size it is written. When numbers are left out, the title's
    second line says how many were shown (e.g. "microbatch numbers shown
    where they fit: 480 of 1,536 ops"). The PNG's text chunks hold the
    title (``Title``), the counts (``pipecore:labels``, numbers drawn;
    ``pipecore:ops``, ops that have a microbatch), the legend's entries
    (``pipecore:legend``, separated by " | ") and where the time axis lies
    (``pipecore:time_axis``, e.g. "0 to 117 cost units over pixels 64 to
    1864"), for a reader that measures the picture.

    The chart is drawn on matplotlib's Agg renderer directly, not through
    ``pyplot`` or a Figure: it renders headless without calling
    ``matplotlib.use``, so an interactive backend the caller already
    selected (e.g. in a notebook) is left untouched. :func:`write_gantts`
    draws several charts on one time scale.

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
        The PNG written (PNG whatever the suffix).

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
    path_table = critical_table(result) if critical else None
    agg = _Agg("write_gantt")
    chart = _prepare(result, title)
    scale = _choose_scale([chart])
    _fit_labels(chart, scale)
    transfers = getattr(result, "transfers", None)
    extra = (([_TRANSFER_KEY] if show_transfers and transfers is not None and transfers.num_rows
              else []) + (_CRITICAL_KEYS if critical else []))
    frame = _frames([chart], scale, "time (cost units)", agg, extra)[chart.n_dev]
    out = Path(path)
    frame.render(chart, out, show_transfers=show_transfers, path_table=path_table)
    return out


def write_gantts(jobs: list, bar: Any = None) -> list[str]:
    """Draw several Gantt charts on one time scale, one PNG each.

    Every chart has the same time axis (from 0 to the latest end among the
    results: a faster schedule's chart ends in a dashed line at its
    makespan, then white), the same width in pixels and the same label
    size, so two charts laid side by side compare at a glance. Each is
    drawn as :func:`write_gantt` draws one, with its default title. From
    four charts on, where ``os.fork`` exists and two CPUs are free to us, a
    forked child draws every other one (the files are the same bytes).

    Parameters
    ----------
    jobs : list of (result, path)
        The charts: :func:`write_gantt`'s first two arguments, each.
    bar : object, optional
        Progress: ``bar.update(1, final=...)`` is called once per chart,
        ``final`` true for the last one.

    Returns
    -------
    list of str
        The paths written, in the order of ``jobs``.

    Raises
    ------
    MissingDependencyError
        If matplotlib is not installed.
    ValueError
        If a result's ops table lacks a required column.
    OSError
        If a file cannot be written.
    """
    if not jobs:
        return []
    agg = _Agg("write_gantts")
    charts = [_prepare(result, None) for result, _path in jobs]
    scale = _choose_scale(charts)
    for chart in charts:
        _fit_labels(chart, scale)
    xlabel = (f"time (cost units; one scale for all {len(charts)} charts of this run)"
              if len(charts) > 1 else "time (cost units)")
    frames = _frames(charts, scale, xlabel, agg)
    # The numbers' outlines are made once, here, not in each process.
    shown = [np.flatnonzero(c.flat | c.stacked) for c in charts]
    make_numbers(np.concatenate([c.mb[i] for c, i in zip(charts, shown)]),
                 np.concatenate([c.stacked[i] for c, i in zip(charts, shown)]),
                 scale.label_pt * _DPI / 72.0)

    def one(i):
        frames[charts[i].n_dev].render(charts[i], Path(jobs[i][1]))
        return str(Path(jobs[i][1]))

    return _in_two_processes(one, [str(Path(p)) for _r, p in jobs], bar)


def _in_two_processes(one: Any, paths: list, bar: Any) -> list:
    """``one(i)`` for every chart i (writing ``paths[i]``); from four charts on, where ``os.fork``
    exists and two CPUs are free to us, a forked child draws every other one.

    The fork comes after the frames are drawn, so the child starts with
    matplotlib imported, its fonts loaded and the frames to copy. The child
    reports each chart it finished on a pipe; whatever it did not finish
    (it failed or was killed) the parent draws itself, so an error surfaces
    here as in one process.
    """
    n = len(paths)
    out: list = [None] * n
    done = 0

    def tick(i, path):
        nonlocal done
        out[i] = path
        done += 1
        if bar is not None:
            bar.update(1, final=done == n)

    if n < 4 or not hasattr(os, "fork") or local_cpus() < 2:
        for i in range(n):
            tick(i, one(i))
        return out
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # child: the odd charts, then leave without Python's exit handlers
        code = 0
        try:
            os.close(read_end)
            for i in range(1, n, 2):
                one(i)
                os.write(write_end, i.to_bytes(4, "little"))
        except BaseException:  # noqa: BLE001 - the parent redraws it and reports
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        for i in range(0, n, 2):
            tick(i, one(i))
        pending = b""
        while True:  # the child's charts, as it finishes them
            chunk = os.read(read_end, 4096)
            if not chunk:
                break
            pending += chunk
            whole = len(pending) // 4 * 4
            for k in range(0, whole, 4):
                i = int.from_bytes(pending[k:k + 4], "little")
                tick(i, paths[i])
            pending = pending[whole:]
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        raise
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    for i in range(n):
        if out[i] is None:
            tick(i, one(i))
    return out


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


# Result.write_gantt calls this (core cannot import up).
plug("write_gantt", write_gantt)

"""Gantt charts of results as PNG (matplotlib, the ``pipecore[plot]`` extra):
one row per device, one bar per op coloured by kind, microbatch numbers
where they fit, and several charts drawn at once for ``pipecore compare``."""

from __future__ import annotations

import math
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from ..core.cpus import local_cpus
from ..core.result import plug
from .colours import KIND_COLOURS, KIND_ORDER, UNKNOWN_COLOUR, chunk_of
from .columns import (
    OPS_COLUMNS,
    TRANSFER_COLUMNS,
    PathLike,
    critical_rows,
    critical_table,
    device_count,
    floats,
    ints,
    require_columns,
    strings,
)
from .errors import MissingDependencyError

__all__ = ["write_gantt", "write_gantts"]


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
    require_columns(ops, OPS_COLUMNS, "ops")
    out = Path(path)

    device = ints(ops, "device")
    stage = ints(ops, "stage")
    mb = ints(ops, "microbatch")
    kind = strings(ops, "kind")
    start = floats(ops, "start")
    finish = floats(ops, "finish")

    n_dev = max(device_count(result, device), 1)
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
        slot = ints(ops, "slot")
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

    kinds_present = [k for k in KIND_ORDER if np.any((kind == k) & visible)]
    extra = (sorted({str(k) for k in np.unique(kind[visible])} - set(KIND_ORDER))
             if visible.any() else [])
    base = np.array(
        [to_rgb(KIND_COLOURS.get(k, UNKNOWN_COLOUR)) for k in kind.tolist()],
        dtype=np.float64,
    ).reshape(-1, 3)
    # Stage chunk (virtual pipeline stage index on the device): lighter shade
    # for later chunks so interleaved schedules remain readable.
    chunk = chunk_of(device, stage)
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
        Patch(facecolor=KIND_COLOURS[k], label=k) for k in kinds_present
    ] + [Patch(facecolor=UNKNOWN_COLOUR, label=k) for k in extra]
    if n_chunks > 1:  # what the shades mean
        grey = np.array([0.35, 0.35, 0.35])
        for c in range(n_chunks):
            shade = _shade(grey[None, :], np.array([c / (n_chunks - 1) * 0.45]))[0]
            legend_handles.append(Patch(facecolor=shade, label=f"chunk {c}"))
    transfers = getattr(result, "transfers", None)
    if show_transfers and transfers is not None and transfers.num_rows:
        require_columns(transfers, TRANSFER_COLUMNS, "transfers")
        t_src = ints(transfers, "src_device")
        t_dst = ints(transfers, "dst_device")
        t_start = floats(transfers, "start")
        t_arr = floats(transfers, "arrival")
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
        # A faster zlib level than the default: encoding the PNG is most of
        # savefig's work, and the files grow only a little.
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

    A Text artist per bar would be laid out and drawn one at a time, and a
    compare labels thousands of bars over its charts. Instead glyph paths
    are made once per distinct number, centred, scaled to each label's size
    in points and placed at the bar centres in data coordinates: one artist
    per chart.
    """
    from matplotlib.collections import PathCollection
    from matplotlib.font_manager import FontProperties
    from matplotlib.textpath import TextPath
    from matplotlib.transforms import Affine2D

    font = FontProperties(size=1.0)  # unit size: scaled per label below
    paths = []
    for j, n in enumerate(numbers.tolist()):
        # Kept across charts: the exact extents of a glyph outline (its
        # curves' extrema) are slow to compute, and the numbers repeat.
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
    op_rows, _ = critical_rows(path_table)
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


def write_gantts(jobs: list, bar: Any) -> list[str]:
    """Draw several Gantt charts; from four charts on, where ``os.fork``
    exists and two CPUs are free to us, a forked child draws every other one.

    The parent draws the first chart before the fork, so the child starts
    with matplotlib imported and its fonts loaded (workers that import
    matplotlib again lose more than the second CPU gains). The child
    reports each chart it finished on a pipe; whatever it did not finish
    (it failed or was killed) the parent draws itself, so an error surfaces
    here as in one process.

    Parameters
    ----------
    jobs : list of (result, path)
        The charts: :func:`write_gantt`'s first two arguments, each.
    bar : object
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
    OSError
        If a file cannot be written.
    """
    def one(i):
        result, path = jobs[i]
        return str(write_gantt(result, path))

    n = len(jobs)
    out = [None] * n
    done = 0

    def tick(i, path):
        nonlocal done
        out[i] = path
        done += 1
        bar.update(1, final=done == n)

    if n < 4 or not hasattr(os, "fork") or local_cpus() < 2:
        for i in range(n):
            tick(i, one(i))
        return out
    tick(0, one(0))
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
        for i in range(2, n, 2):
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
                tick(i, str(Path(jobs[i][1])))
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


# Result.write_gantt calls this (core cannot import up).
plug("write_gantt", write_gantt)

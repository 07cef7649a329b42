"""Static plots of a scan and of the study (matplotlib, the ``plot`` extra)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..analysis.frontier import pareto_front
from .errors import MissingDependencyError


def _readable_axes(ax, xs):
    """Tick labels a reader can use on both axes: the x axis logarithmic
    (1-2-5 ticks) when ``xs`` spans a decade or more, else linear (a log
    axis over less than a decade may show a single labelled tick); plain
    numbers, not 5.1x10^0."""
    from matplotlib.ticker import FormatStrFormatter, LogLocator, MaxNLocator, NullFormatter, NullLocator

    xs = [x for x in xs if x > 0 and np.isfinite(x)]
    if xs and max(xs) >= 10 * min(xs):
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    else:
        ax.xaxis.set_major_locator(MaxNLocator(nbins=5, steps=[1, 2, 2.5, 5, 10]))
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_formatter(FormatStrFormatter("%g"))
        axis.set_minor_locator(NullLocator())
        axis.set_minor_formatter(NullFormatter())
    ax.yaxis.set_major_locator(MaxNLocator(nbins=6, steps=[1, 2, 2.5, 5, 10]))


def plot_pareto(folder):
    """Pareto frontier of normalised time vs memory, per family; path or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    files = sorted(folder.glob("part-*.parquet"))
    if not files:
        return None
    fronts = {}
    # One part at a time, keeping only each (shape, family)'s running
    # frontier: memory stays flat.
    for path in files:
        t = pq.read_table(path, columns=["schedule", "makespan", "devices", "microbatches",
                                         "memory_max", "f", "b", "w"])
        sched = t.column("schedule").combine_chunks()
        names = sched.dictionary.to_pylist()
        codes = sched.indices.to_numpy()
        dev = t.column("devices").to_numpy()
        mbs = t.column("microbatches").to_numpy()
        x = t.column("memory_max").to_numpy()
        # Time relative to the bubble-free ideal m (f + b + w), so rows with
        # different costs compare: 1.0 means no bubble.
        ideal = mbs * (t.column("f").to_numpy() + t.column("b").to_numpy()
                       + t.column("w").to_numpy())
        with np.errstate(divide="ignore", invalid="ignore"):
            y = np.where(ideal > 0, t.column("makespan").to_numpy() / ideal, np.inf)
        keys = np.stack([dev, mbs, codes], axis=1)
        for d_, m_, c in np.unique(keys, axis=0).tolist():
            sel = (dev == d_) & (mbs == m_) & (codes == c)
            px, py = x[sel], y[sel]
            key = (int(d_), int(m_), names[c])
            old = fronts.get(key)
            if old is not None:
                px = np.concatenate([old[0], px])
                py = np.concatenate([old[1], py])
            keep = pareto_front(px, py)
            fronts[key] = (px[keep], py[keep])
    from .page import PALETTE

    devs = sorted({k[0] for k in fronts})
    mbs_all = sorted({k[1] for k in fronts})
    families = sorted({k[2] for k in fronts})
    colour = {f: PALETTE[i % len(PALETTE)] for i, f in enumerate(families)}
    # One panel per shape: frontiers of different shapes do not compare.
    fig, axes = plt.subplots(len(devs), len(mbs_all), squeeze=False,
                             figsize=(3.6 * len(mbs_all) + 2.2, 2.8 * len(devs) + 0.8))
    for i, d_ in enumerate(devs):
        for j, m_ in enumerate(mbs_all):
            ax = axes[i][j]
            for fam in families:
                pts = fronts.get((d_, m_, fam))
                if pts is not None and pts[0].size:
                    ax.step(pts[0], pts[1], where="post", marker=".", color=colour[fam],
                            label=fam)
            xs = [x for fam in families for x in fronts.get((d_, m_, fam), ((),))[0]]
            _readable_axes(ax, xs)
            ax.set_title(f"p={d_}, m={m_}", fontsize=9)
            ax.grid(alpha=0.3)
            if i == len(devs) - 1:
                ax.set_xlabel("worst device's memory (M)", fontsize=8)
            if j == 0:
                ax.set_ylabel("makespan / m(f+b+w)", fontsize=8)
    handles = [plt.Line2D([], [], color=colour[f], marker=".", label=f) for f in families]
    fig.legend(handles=handles, loc="center right", fontsize=7, frameon=False)
    fig.suptitle("Pareto frontier per family and shape (1 = no bubble; lower left is better)",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0, 1 - 1.9 / fig.get_figwidth(), 0.96))
    path = folder / "_pareto.png"  # "_" keeps it out of Parquet dataset discovery
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return str(path)


#: The study's families by kind: each kind draws with its own line style and
#: marker, its members in distinct colours (the legend groups them).
FAMILY_KINDS = (
    ("one stage per device", ("gpipe", "1f1b", "eager-1f1b", "zb-h1", "zb-h2")),
    ("several stages per device", ("interleaved-1f1b", "interleaved-zb", "looped-bfs", "hanayo")),
    ("V-shaped", ("zb-v", "v-zb", "v-min", "v-half", "dualpipev")),
    ("bidirectional (replicated)", ("chimera", "bitpipe", "dualpipe")),
)
_KIND_STYLE = (("-", "o"), ("--", "s"), (":", "^"), ("-.", "D"), ((0, (5, 1, 1, 1)), "v"))
# Colours within a kind (Kelly's first, strongly apart).
_KIND_COLOURS = ("#0067a5", "#f38400", "#008856", "#be0032", "#875692", "#882d17", "#848482")


def family_styles(families):
    """Colour, line style and marker of each family, grouped by kind.

    Parameters
    ----------
    families : iterable of str

    Returns
    -------
    list of (str, list of (str, dict))
        Per kind (in :data:`FAMILY_KINDS` order, then "other" for families
        it does not list), its families with ``color``, ``linestyle`` and
        ``marker`` keyword arguments for matplotlib. No two families share
        a (colour, line style) pair.
    """
    families = set(families)
    listed = {f for _kind, names in FAMILY_KINDS for f in names}
    kinds = [(kind, [f for f in names if f in families]) for kind, names in FAMILY_KINDS]
    kinds.append(("other", sorted(families - listed)))
    out = []
    for k, (kind, names) in enumerate(kinds):
        if not names:
            continue
        linestyle, marker = _KIND_STYLE[min(k, len(_KIND_STYLE) - 1)]
        styled = []
        for i, name in enumerate(names):
            # Beyond the colours of a kind, a second line style keeps pairs distinct.
            dash = linestyle if i < len(_KIND_COLOURS) else (0, (1, 1 + i // len(_KIND_COLOURS)))
            styled.append((name, {"color": _KIND_COLOURS[i % len(_KIND_COLOURS)],
                                  "linestyle": dash, "marker": marker}))
        out.append((kind, styled))
    return out


def study_panels(table: pa.Table, devices: int) -> list[dict]:
    """The panels of :func:`plot_study` for one device count: one per
    distinct ratio of compute speed to network speed.

    Scaling compute and network speed alike scales every time alike, so the
    cells of one ratio show the same relative times; a panel draws the cell
    of its ratio nearest the hardware's own speed and names every cell it
    stands for.

    Parameters
    ----------
    table : pyarrow.Table
        From :func:`pipecore.study`.
    devices : int

    Returns
    -------
    list of dict
        Sorted by ratio: ``ratio`` (compute speed / network speed),
        ``cells`` (the (compute_speed, network_speed) pairs of that ratio),
        ``drawn`` (the pair whose numbers are drawn) and ``lines``
        (family -> list of (microbatches, time / the shape's best)).
    """
    rows = [r for r in table.to_pylist() if r["error"] is None and r["devices"] == devices]
    by_ratio: dict = {}
    for cf, nf in sorted({(r["compute_speed"], r["network_speed"]) for r in rows}):
        by_ratio.setdefault(round(cf / nf, 9), []).append((cf, nf))
    panels = []
    for ratio in sorted(by_ratio):
        cells = by_ratio[ratio]
        drawn = min(cells, key=lambda c: (abs(np.log(c[0])), c))
        cell = [r for r in rows if (r["compute_speed"], r["network_speed"]) == drawn]
        best: dict = {}
        for r in cell:
            best[r["microbatches"]] = min(best.get(r["microbatches"], np.inf), r["sim_time"])
        lines: dict = {}
        for r in sorted(cell, key=lambda r: r["microbatches"]):
            lines.setdefault(r["family"], []).append(
                (r["microbatches"], r["sim_time"] / best[r["microbatches"]]))
        panels.append({"ratio": ratio, "cells": cells, "drawn": drawn, "lines": lines})
    return panels


def _ratio_title(panel):
    r = panel["ratio"]
    cells = ", ".join(f"x{cf:g}/x{nf:g}" for cf, nf in panel["cells"])
    if r == 1:
        head = "compute and network speed alike"
    elif r > 1:
        head = f"compute {r:g}x faster than network (relative to the preset)"
    else:
        head = f"network {1 / r:g}x faster than compute (relative to the preset)"
    return f"{head}\ncells compute/network: {cells}"


def _inside(fig, leg, margin=0.005):
    """Shift a figure legend until its box lies inside the figure."""
    to_fig = fig.transFigure.inverted()
    box = leg.get_window_extent(fig.canvas.get_renderer()).transformed(to_fig)
    dx = min(0.0, 1 - margin - box.x1) or max(0.0, margin - box.x0)
    dy = min(0.0, 1 - margin - box.y1) or max(0.0, margin - box.y0)
    if dx or dy:
        x, y = leg.get_bbox_to_anchor().transformed(to_fig).p0
        leg.set_bbox_to_anchor((x + dx, y + dy), transform=fig.transFigure)


def study_figures(table: pa.Table) -> list:
    """The study's figures as matplotlib objects, one per device count.

    Parameters
    ----------
    table : pyarrow.Table
        From :func:`pipecore.study`.

    Returns
    -------
    list of (int, matplotlib.figure.Figure)
        Device count and its figure (a canvas attached, ready to save).

    Raises
    ------
    pipecore.output.MissingDependencyError
        If matplotlib is not installed.
    """
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
        from matplotlib.ticker import FixedLocator, NullFormatter, NullLocator, StrMethodFormatter
    except ImportError as exc:
        raise MissingDependencyError("plot_study needs matplotlib: pip install 'pipecore[plot]'") from exc
    rows = [r for r in table.to_pylist() if r["error"] is None]
    styles = family_styles({r["family"] for r in rows})
    style = {name: kw for _kind, named in styles for name, kw in named}
    meta = table.schema.metadata or {}
    hw = ""
    if b"pipecore.hardware" in meta:
        import json

        hw = f" on \"{json.loads(meta[b'pipecore.hardware'])['name']}\""
    figures = []
    for p in sorted({r["devices"] for r in rows}):
        panels = study_panels(table, p)
        n = len(panels)
        ncols = min(n, 3)
        nrows = -(-n // ncols)
        spare = nrows * ncols - n  # slots the legend may use
        legend_w = 0.0 if spare else 3.2
        fig = Figure(figsize=(4.2 * ncols + legend_w, 3.4 * nrows + 0.9))
        FigureCanvasAgg(fig)
        axes = fig.subplots(nrows, ncols, squeeze=False)
        flat = [ax for row in axes for ax in row]
        for ax in flat[n:]:
            fig.delaxes(ax)
        ms = sorted({r["microbatches"] for r in rows if r["devices"] == p})
        for ax, panel in zip(flat, panels):
            for name, pts in sorted(panel["lines"].items()):
                ax.plot([x for x, _ in pts], [y for _, y in pts], label=name, markersize=4,
                        linewidth=1.3, **style[name])
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(FixedLocator(ms))
            ax.xaxis.set_major_formatter(StrMethodFormatter("{x:g}"))
            ax.xaxis.set_minor_locator(NullLocator())
            ax.xaxis.set_minor_formatter(NullFormatter())
            if len(ms) > 1:
                ax.set_xlim(ms[0] / 1.25, ms[-1] * 1.25)
            ax.tick_params(labelsize=8)
            ax.set_title(_ratio_title(panel), fontsize=8.5)
            ax.set_xlabel("microbatches m", fontsize=8)
            ax.set_ylabel("simulated time / fastest", fontsize=8)
            ax.grid(alpha=0.3)
        handles, labels, heads = [], [], []
        for kind, named in styles:
            heads.append(len(labels))
            handles.append(Line2D([], [], linestyle="none"))
            labels.append(kind)
            for name, kw in named:
                handles.append(Line2D([], [], markersize=4, **kw))
                labels.append(name)
        fig.suptitle(f"p={p} devices{hw}: each family's simulated iteration time relative to "
                     f"the fastest family at each m (1 = fastest); one panel per ratio of "
                     f"compute to network speed", fontsize=10)
        right = 1 - legend_w / fig.get_figwidth()
        fig.tight_layout(rect=(0, 0, right, 0.95))
        if spare:
            # The legend takes the empty slots at the end of the last row.
            first = flat[n - 1].get_position()
            x0 = first.x1 + 0.02
            anchor, loc = (x0 + (1 - x0) / 2, first.y0 + first.height / 2), "center"
        else:
            anchor, loc = (right + 0.005, 0.5), "center left"
        leg = fig.legend(handles, labels, loc=loc, bbox_to_anchor=anchor, fontsize=7.5,
                         ncol=2 if spare else 1, frameon=False, handlelength=3.0,
                         title="family (line style and marker: kind)", title_fontsize=8)
        for i in heads:
            leg.get_texts()[i].set_fontweight("bold")
        _inside(fig, leg)
        figures.append((p, fig))
    return figures


def plot_study(table: pa.Table, path) -> list:
    """One figure per device count: one panel per distinct ratio of compute
    speed to network speed, each showing every family's simulated time
    relative to the fastest, against the number of microbatches.

    Parameters
    ----------
    table : pyarrow.Table
        From :func:`study`.
    path : str or os.PathLike
        PNG file to write (the device count is added before the suffix when
        the study has several).

    Returns
    -------
    list of str
        Files written.

    Raises
    ------
    pipecore.output.MissingDependencyError
        If matplotlib is not installed.
    """
    figures = study_figures(table)
    written = []
    for p, fig in figures:
        out = Path(path)
        if len(figures) > 1:
            out = out.with_name(f"{out.stem}-p{p}{out.suffix}")
        fig.savefig(out, dpi=100)
        written.append(str(out))
    return written

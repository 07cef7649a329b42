"""Static plots of a scan and of the study (matplotlib, the ``plot`` extra)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..analysis.frontier import pareto_front
from .writers import MissingDependencyError


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
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

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
            ax.set_xscale("log")
            ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
            for axis in (ax.xaxis, ax.yaxis):  # plain numbers, not 5.1x10^0
                axis.set_major_formatter(FormatStrFormatter("%g"))
                axis.set_minor_formatter(NullFormatter())
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


def plot_study(table: pa.Table, path) -> str:
    """One figure per device count: a compute x network grid of panels, each
    showing every family's simulated time relative to the best, against the
    number of microbatches.

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
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingDependencyError("plot_study needs matplotlib: pip install 'pipecore[plot]'") from exc
    rows = [r for r in table.to_pylist() if r["error"] is None]
    written = []
    devices = sorted({r["devices"] for r in rows})
    computes = sorted({r["compute"] for r in rows})
    networks = sorted({r["network"] for r in rows})
    from .page import PALETTE

    families = sorted({r["family"] for r in rows})
    colour = {f: PALETTE[i % len(PALETTE)] for i, f in enumerate(families)}
    for p in devices:
        drawn: dict = {}
        fig = Figure(figsize=(4 * len(networks), 3 * len(computes)))
        FigureCanvasAgg(fig)
        axes = fig.subplots(len(computes), len(networks), squeeze=False, sharex=True)
        for i, cf in enumerate(computes):
            for j, nf in enumerate(networks):
                ax = axes[i][j]
                cell = [r for r in rows if r["devices"] == p and r["compute"] == cf
                        and r["network"] == nf]
                best = {}
                for r in cell:
                    best[r["microbatches"]] = min(best.get(r["microbatches"], np.inf), r["sim_time"])
                ratio = round(cf / nf, 12) if nf else None
                ax.set_xscale("log", base=2)
                ax.set_title(f"compute x{cf:g}, network x{nf:g}", fontsize=9)
                if ratio in drawn:
                    # Scaling compute and network alike scales every time: the
                    # relative picture is that of the earlier panel.
                    ax.text(0.5, 0.5, f"same as compute x{drawn[ratio][0]:g}, network "
                            f"x{drawn[ratio][1]:g}:\nonly the ratio of compute to network\n"
                            "changes relative times", ha="center", va="center",
                            transform=ax.transAxes, fontsize=8, color="#555555")
                    ax.set_xticks([])
                    ax.set_yticks([])
                    continue
                drawn[ratio] = (cf, nf)
                for name in families:
                    pts = sorted((r["microbatches"], r["sim_time"] / best[r["microbatches"]])
                                 for r in cell if r["family"] == name)
                    ax.plot([x for x, _ in pts], [y for _, y in pts], marker=".", label=name,
                            color=colour[name])
                if j == 0:
                    ax.set_ylabel("time / best")
                if i == len(computes) - 1:
                    ax.set_xlabel("microbatches")
        handles, labels = [], []
        for row_axes in axes:  # the first drawn panel holds every family
            handles, labels = row_axes[0].get_legend_handles_labels()
            if handles:
                break
        fig.legend(handles, labels, loc="upper right", fontsize=7)
        fig.suptitle(f"simulated iteration time relative to the best schedule, p={p}")
        out = Path(path)
        if len(devices) > 1:
            out = out.with_name(f"{out.stem}-p{p}{out.suffix}")
        fig.savefig(out, dpi=100)
        written.append(str(out))
    return written

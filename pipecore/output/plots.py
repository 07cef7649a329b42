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
    # One part at a time, keeping only each family's running frontier: memory stays flat.
    for path in files:
        t = pq.read_table(path, columns=["schedule", "makespan", "microbatches", "memory_max",
                                         "f", "b", "w"])
        sched = t.column("schedule").combine_chunks()
        names = sched.dictionary.to_pylist()
        codes = sched.indices.to_numpy()
        x = t.column("memory_max").to_numpy()
        # Time relative to the bubble-free ideal m (f + b + w), so rows with
        # different costs compare: 1.0 means no bubble.
        ideal = t.column("microbatches").to_numpy() * (
            t.column("f").to_numpy() + t.column("b").to_numpy() + t.column("w").to_numpy())
        with np.errstate(divide="ignore", invalid="ignore"):
            y = np.where(ideal > 0, t.column("makespan").to_numpy() / ideal, np.inf)
        for c in np.unique(codes):
            sel = codes == c
            px, py = x[sel], y[sel]
            old = fronts.get(names[c])
            if old is not None:
                px = np.concatenate([old[0], px])
                py = np.concatenate([old[1], py])
            keep = pareto_front(px, py)
            fronts[names[c]] = (px[keep], py[keep])
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, (px, py) in sorted(fronts.items()):
        ax.step(px, py, where="post", marker=".", label=name)
    ax.set_xlabel("memory of the worst device (activation + weights)")
    ax.set_ylabel("makespan / (m (f + b + w))   [1 = no bubble]")
    ax.set_xscale("log")
    ax.set_title("Pareto frontier per schedule family")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    path = folder / "_pareto.png"  # "_" keeps it out of Parquet dataset discovery
    fig.savefig(path, dpi=110, bbox_inches="tight")
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
    for p in devices:
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
                for k, name in enumerate(sorted({r["family"] for r in cell})):
                    pts = sorted((r["microbatches"], r["sim_time"] / best[r["microbatches"]])
                                 for r in cell if r["family"] == name)
                    # Ten colours repeat: vary the line style so every family stays apart.
                    ax.plot([x for x, _ in pts], [y for _, y in pts], marker=".", label=name,
                            linestyle=("-", "--", ":")[(k // 10) % 3])
                ax.set_xscale("log", base=2)
                ax.set_title(f"compute x{cf:g}, network x{nf:g}", fontsize=9)
                if j == 0:
                    ax.set_ylabel("time / best")
                if i == len(computes) - 1:
                    ax.set_xlabel("microbatches")
        handles, labels = axes[0][0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="upper right", fontsize=7)
        fig.suptitle(f"simulated iteration time relative to the best schedule, p={p}")
        out = Path(path)
        if len(devices) > 1:
            out = out.with_name(f"{out.stem}-p{p}{out.suffix}")
        fig.savefig(out, dpi=100)
        written.append(str(out))
    return written

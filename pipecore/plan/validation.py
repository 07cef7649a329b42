"""pipecore's predictions beside published measured runs.

Each published run (:func:`pipecore.plan.published.published_runs`) is
estimated with its own configuration on the cluster it ran on, and its
throughput compared in the run's own FLOP counting (Megatron SC21's eq. 3
counts recomputation; an MFU figure does not). Nothing here is fitted:
the hardware constants come from hardware measurements
(:mod:`pipecore.plan.hardware`), and these rows only check them.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from ..analysis.architecture import Architecture
from ..core.ops import InputError
from .estimate import estimate
from .hardware import Cluster
from .published import published_runs
from .strategy import Strategy

#: Shares of the predicted iteration time :func:`check_published` reports, in
#: ``share_<cause>`` columns: the causes of :attr:`pipecore.Estimate.breakdown`,
#: with ``other`` for the rest of the iteration (embedding sync, optimizer step).
SHARES = ("compute", "tp_comm", "bubble", "pp_comm", "dp_comm", "other")
#: Issue 53's bar for the validation rows: median and worst absolute error of
#: the predicted throughput (fractions: 0.08 is 8%).
BAR_MEDIAN, BAR_WORST = 0.08, 0.15

# The cluster each published GPU ran on (8 GPUs a node, NVLink inside, one InfiniBand
# NIC per GPU: Selene's DGX A100 nodes for SC21, BLOOM's Jean Zay A100 nodes). A GPU
# named without its variant ("h100") has no preset: the run is left out, saying so.
CLUSTERS = {"a100-sxm4-80gb": "dgx-a100", "h100-sxm5-80gb": "dgx-h100"}
# Runs that predate FlashAttention in their framework ran unfused attention kernels:
# Megatron-LM in 2021 (SC21) and Megatron-DeepSpeed for BLOOM (2022).
UNFUSED_RUNS = ("megatron-sc21-", "bloom-")
# Megatron-LM as the SC21 runs used it (the code of commit 50a4b5fa02, 2021-04-08, which
# published Table 1): pipeline exchanges that block both GPUs (req.wait() then
# torch.cuda.synchronize() in p2p_communication.py) and gradient accumulation by
# PyTorch's AccumulateGrad (gradient-accumulation fusion arrived in Feb 2022).
MEGATRON_2021_RUNS = ("megatron-sc21-",)


def check_published(role: str | None = "validation") -> pa.Table:
    """Predict every published run of ``role`` and set it beside its measurement.

    Parameters
    ----------
    role : {"validation", "held-back"} or None, default "validation"
        Which runs; None for all.

    Returns
    -------
    pyarrow.Table
        One row per run: ``id``, ``gpus``, ``strategy`` (its label),
        ``measured_tflops`` and ``predicted_tflops`` (TFLOP/s per GPU, in
        the run's own FLOP counting, higher is faster),
        ``measured_iteration_time`` and ``predicted_iteration_time``
        (seconds; the measured one derived from its TFLOP/s when the
        source gives none), ``error`` (predicted / measured throughput - 1:
        positive means pipecore predicts the run faster than it was),
        ``memory_gb`` (predicted bytes per GPU / 1e9), ``note``
        (placeholders the source leaves unpublished, or why a run was
        left out), ``params_billion`` (as published) and one
        ``share_<cause>`` column per cause of :data:`SHARES`: that cause's
        fraction (0-1) of the predicted iteration time, the six summing
        to 1 (nan for a run left out).
    """
    rows = []
    for run in published_runs(role):
        row = {"id": run.id, "gpus": run.gpus, "strategy": "", "measured_tflops": run.measured_tflops_per_gpu,
               "predicted_tflops": math.nan, "measured_iteration_time": math.nan,
               "predicted_iteration_time": math.nan, "error": math.nan, "memory_gb": math.nan,
               "note": ("unpublished: " + ", ".join(run.unpublished)) if run.unpublished else "",
               "params_billion": run.params_billion}
        row.update({f"share_{cause}": math.nan for cause in SHARES})
        cluster_name = CLUSTERS.get(run.gpu.strip().lower())
        why = []
        if cluster_name is None:
            why.append(f"no cluster preset for GPU {run.gpu!r}")
        if run.precision not in ("bf16", "fp16"):
            why.append(f"precision {run.precision!r} is not modelled")
        if run.unpublished:
            why.append("unpublished: " + ", ".join(run.unpublished))
        if cluster_name is None or run.precision not in ("bf16", "fp16"):
            row["note"] = "left out: " + "; ".join(why)
            rows.append(row)
            continue
        arch, strategy = run_architecture(run), run_strategy(run)
        nodes = -(-run.gpus // run.gpus_per_node)
        try:
            est = estimate(arch, Cluster.preset(cluster_name, nodes=nodes), strategy, run.global_batch)
        except InputError as exc:  # e.g. uneven layer splits, which pipecore's stages do not model yet
            row["note"] = f"left out: {exc}"
            rows.append(row)
            continue
        predicted = (est.hardware_tflops_per_gpu if run.flops_formula == "megatron-eq3"
                     else est.tflops_per_gpu)
        flops = arch.flops_per_iteration(run.global_batch, recompute=run.recompute
                                         if run.flops_formula == "megatron-eq3" else "none")
        measured_time = run.measured_iteration_time
        if not np.isfinite(measured_time):
            measured_time = flops / (run.measured_tflops_per_gpu * 1e12 * run.gpus)
        row.update(strategy=strategy.label(), predicted_tflops=predicted,
                   measured_iteration_time=measured_time, predicted_iteration_time=est.iteration_time,
                   error=predicted / run.measured_tflops_per_gpu - 1.0, memory_gb=est.memory_per_gpu / 1e9)
        named = {cause: est.breakdown.get(cause, 0.0) for cause in SHARES[:-1]}
        named["other"] = est.iteration_time - sum(named.values())
        row.update({f"share_{cause}": seconds / est.iteration_time for cause, seconds in named.items()})
        rows.append(row)
    return pa.Table.from_pylist(rows)


def validation_summary(table: pa.Table, median_bar: float = BAR_MEDIAN, worst_bar: float = BAR_WORST) -> dict:
    """How far a :func:`check_published` table's predictions are from their measurements.

    Parameters
    ----------
    table : pyarrow.Table
        From :func:`check_published`; rows without a prediction (left out,
        ``error`` nan) are not counted.
    median_bar, worst_bar : float, default 0.08 and 0.15
        The bar: largest median and largest worst absolute error (fractions).

    Returns
    -------
    dict
        ``rows`` (runs counted), ``median_abs_error`` (median of
        ``|predicted / measured - 1|``), ``worst_error`` (the signed error of
        largest magnitude: positive means predicted faster than measured),
        ``worst_id`` (its run), ``optimistic`` and ``pessimistic`` (runs
        predicted faster, and slower, than measured), ``median_bar``,
        ``worst_bar`` and ``meets_bar`` (both within their bar).

    Raises
    ------
    InputError
        If ``table`` lacks the ``id`` or ``error`` column, has no row with a
        finite error, or a bar is not a positive finite number.
    """
    for name, bar in (("median_bar", median_bar), ("worst_bar", worst_bar)):
        if isinstance(bar, bool) or not isinstance(bar, (int, float)) or not (math.isfinite(bar) and bar > 0):
            raise InputError(f"validation_summary: {name} must be a positive finite fraction, got {bar!r}")
    missing = [c for c in ("id", "error") if c not in table.column_names]
    if missing:
        raise InputError(f"validation_summary: the table has no {', '.join(missing)} column "
                         "(pass the table check_published returns)")
    ids = table.column("id").to_pylist()
    errors = np.array([np.nan if e is None else e for e in table.column("error").to_pylist()], dtype=float)
    keep = np.isfinite(errors)
    if not keep.any():
        raise InputError("validation_summary: no row has a finite error (every run was left out)")
    errors, ids = errors[keep], [i for i, k in zip(ids, keep) if k]
    worst = int(np.argmax(np.abs(errors)))
    median = float(np.median(np.abs(errors)))
    return {"rows": int(errors.size), "median_abs_error": median, "worst_error": float(errors[worst]),
            "worst_id": ids[worst], "optimistic": int((errors > 0).sum()),
            "pessimistic": int((errors < 0).sum()), "median_bar": float(median_bar),
            "worst_bar": float(worst_bar),
            "meets_bar": bool(median <= median_bar and abs(errors[worst]) <= worst_bar)}


def _size_label(billion: float) -> str:
    # As the sources print it (SC21 Table 1: 145.6, 1008.0), in billions.
    return f"{billion:g}B"


def _point_label(row: dict) -> str:
    """A point's label: model size and signed error, e.g. ``76.1B +18.5%``."""
    error = row["predicted_tflops"] / row["measured_tflops"] - 1.0
    return f"{_size_label(row['params_billion'])} {error * 100:+.1f}%"


def _crosses(p1, p2, q1, q2) -> bool:
    """Whether segments p1-p2 and q1-q2 cross (touching ends do not count)."""
    def side(a, b, c):
        return (b[0] - a[0]) * (c[1] - a[1]) - (b[1] - a[1]) * (c[0] - a[0])

    d1, d2 = side(q1, q2, p1), side(q1, q2, p2)
    d3, d4 = side(p1, p2, q1), side(p1, p2, q2)
    return d1 * d2 < 0 and d3 * d4 < 0


def _place_labels(ax, points, labels, fontsize, avoid=()):
    """Annotate each point where its label overlaps no other label, no marker and no
    artist of ``avoid`` (the legend).

    Greedy: each label tries offsets at growing distance around its point (in
    points), in display space, and takes the first free one; a label set
    away from its point gets a thin leader line.
    """
    from matplotlib.transforms import Bbox

    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    to_px = ax.transData.transform
    markers = [Bbox.from_bounds(x - 5, y - 5, 10, 10) for x, y in (to_px(p) for p in points)]
    frame = ax.get_window_extent(renderer)
    taken = [artist.get_window_extent(renderer) for artist in avoid]
    leaders: list = []
    directions = [(1, 0), (-1, 0), (0, 1), (0, -1), (1, 1), (-1, 1), (1, -1), (-1, -1)]
    pixels = np.array([to_px(p) for p in points], dtype=float).reshape(-1, 2)
    order = sorted(range(len(points)), key=lambda i: (points[i][0], points[i][1]))
    for i in order:
        # In a crowd, a label goes away from its neighbours' centre first, so it
        # sits beside its own point rather than across another one.
        near = np.linalg.norm(pixels - pixels[i], axis=1)
        crowd = (near > 0) & (near < 60)
        ranked = directions
        if crowd.any():
            away = pixels[i] - pixels[crowd].mean(axis=0)
            if np.hypot(*away) > 0:
                ranked = sorted(directions, key=lambda d: -(d[0] * away[0] + d[1] * away[1]) / math.hypot(*d))
        best = None
        # A crowded point's label stands off, on a leader line, so it is plain whose it is.
        # Candidates by cost: nearer first, and the preferred directions before the others.
        radii = (20, 28, 38, 50) if crowd.any() else (7, 12, 18, 26, 36, 48)
        candidates = sorted(((radius + 12 * rank, radius, d) for radius in radii
                             for rank, d in enumerate(ranked)), key=lambda c: c[0])
        for _cost, radius, (dx, dy) in candidates:
            norm = math.hypot(dx, dy)
            off = (radius * dx / norm, radius * dy / norm)
            ha = "left" if dx > 0 else "right" if dx < 0 else "center"
            va = "bottom" if dy > 0 else "top" if dy < 0 else "center"
            text = ax.annotate(labels[i], points[i], xytext=off, textcoords="offset points",
                               ha=ha, va=va, fontsize=fontsize)
            box = text.get_window_extent(renderer).expanded(1.06, 1.15)
            text.remove()
            end = pixels[i] + np.array(off) * fig.dpi / 72.0
            inside = frame.containsx(box.x0) and frame.containsx(box.x1) and \
                frame.containsy(box.y0) and frame.containsy(box.y1)
            clash = any(box.overlaps(b) for b in taken) or any(box.overlaps(m) for m in markers) or \
                any(_crosses(pixels[i], end, a, b) for a, b in leaders)
            if inside and not clash:
                best = (off, ha, va, box, radius)
                leaders.append((pixels[i], end))
                break
        if best is None:  # nowhere free: right of the point, overlapping
            best = ((7, 0), "left", "center", None, 7)
        off, ha, va, box, radius = best
        arrow = {"arrowstyle": "-", "color": "0.55", "linewidth": 0.6, "shrinkA": 0,
                 "shrinkB": 3} if radius > 12 or crowd.any() else None
        ax.annotate(labels[i], points[i], xytext=off, textcoords="offset points", ha=ha, va=va,
                    fontsize=fontsize, arrowprops=arrow)
        if box is not None:
            taken.append(box)


def _draw(val: list, held: list, median_bar: float, worst_bar: float):
    """The figure of :func:`validation_figure` from its rows (dicts with a prediction)."""
    from ..output.errors import MissingDependencyError

    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
        from matplotlib.lines import Line2D
        from matplotlib.patches import Patch
    except ImportError as exc:
        raise MissingDependencyError("validation_figure needs matplotlib: "
                                     "pip install 'pipecore[plot]'") from exc

    every = val + held
    values = [v for r in every for v in (r["measured_tflops"], r["predicted_tflops"])]
    lo, hi = min(values), max(values)
    pad = 0.08 * (hi - lo) + 4.0
    lo, hi = max(0.0, lo - pad), hi + pad
    fig = Figure(figsize=(7.2, 6.4), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    xs = np.linspace(lo, hi, 50)
    inner, outer = "#008856", "#f38400"
    ax.fill_between(xs, xs * (1 - median_bar), xs * (1 + median_bar), color=inner, alpha=0.16, linewidth=0)
    for sign in (1, -1):  # the outer band's two strips, not under the inner one
        ax.fill_between(xs, xs * (1 + sign * median_bar), xs * (1 + sign * worst_bar), color=outer,
                        alpha=0.12, linewidth=0)
    ax.plot(xs, xs, color="0.25", linewidth=1.0)
    for sign in (1, -1):
        ax.plot(xs, xs * (1 + sign * worst_bar), color=outer, linewidth=0.7, linestyle="--")
        ax.plot(xs, xs * (1 + sign * median_bar), color=inner, linewidth=0.7, linestyle="--")
    ax.scatter([r["measured_tflops"] for r in val], [r["predicted_tflops"] for r in val], s=34,
               color="#0067a5", edgecolor="white", linewidth=0.6, zorder=3)
    if held:
        ax.scatter([r["measured_tflops"] for r in held], [r["predicted_tflops"] for r in held], s=40,
                   marker="s", facecolor="white", edgecolor="#be0032", linewidth=1.4, zorder=3)
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_aspect("equal")
    ax.grid(alpha=0.25)
    ax.set_xlabel("measured TFLOP/s per GPU (the source's own FLOP count)")
    ax.set_ylabel("predicted TFLOP/s per GPU (same FLOP count)")
    ax.set_title("pipecore's predictions against published measured runs\n"
                 "above the diagonal: predicted faster than measured", loc="left", fontsize=10)
    handles = [Line2D([], [], marker="o", linestyle="", color="#0067a5",
                      label=f"validation: Megatron-LM SC21 Table 1 ({len(val)} runs)")]
    if held:
        handles.append(Line2D([], [], marker="s", linestyle="", markerfacecolor="white",
                              markeredgecolor="#be0032", markeredgewidth=1.4,
                              label=f"held back ({len(held)} run{'s' if len(held) != 1 else ''})"))
    handles += [Line2D([], [], color="0.25", linewidth=1.0, label="predicted = measured"),
                Patch(facecolor=inner, alpha=.3, label=f"within \u00b1{median_bar:.0%} (bar for the median)"),
                Patch(facecolor=outer, alpha=0.25, label=f"within \u00b1{worst_bar:.0%} (bar for the worst)")]
    legend = ax.legend(handles=handles, loc="lower right", fontsize=8, framealpha=0.9)
    _place_labels(ax, [(r["measured_tflops"], r["predicted_tflops"]) for r in every],
                  [_point_label(r) for r in every], fontsize=8, avoid=[legend])
    return fig


def validation_figure(table: pa.Table, path, held_back: pa.Table | None = None,
                      median_bar: float = BAR_MEDIAN, worst_bar: float = BAR_WORST) -> str:
    """Draw predicted against measured TFLOP/s per GPU, one labelled point per run.

    The diagonal is a perfect prediction; shaded bands mark ``median_bar``
    and ``worst_bar`` (by default +-8% and +-15%, issue 53's bar). Points
    above the diagonal are runs pipecore predicts faster than they ran.
    Each point is labelled by its model size and its error (predicted /
    measured - 1, in percent); held-back runs are drawn
    with a different marker and colour from the validation runs.

    Parameters
    ----------
    table : pyarrow.Table
        The validation runs, from :func:`check_published` (columns ``id``,
        ``params_billion``, ``measured_tflops``, ``predicted_tflops``).
    path : str or os.PathLike
        The PNG to write.
    held_back : pyarrow.Table, optional
        Further runs to draw apart (``check_published("held-back")``); rows
        without a prediction are skipped.
    median_bar, worst_bar : float, default 0.08 and 0.15
        Half-widths of the inner and outer band (fractions of the measured value).

    Returns
    -------
    str
        ``path``, written.

    Raises
    ------
    InputError
        If a table lacks one of the columns above, ``table`` has no row
        with a prediction, or a bar is not a positive finite fraction with
        ``median_bar < worst_bar``.
    pipecore.output.MissingDependencyError
        If matplotlib is not installed (``pip install 'pipecore[plot]'``).
    """
    for name, bar in (("median_bar", median_bar), ("worst_bar", worst_bar)):
        if isinstance(bar, bool) or not isinstance(bar, (int, float)) or not (math.isfinite(bar) and bar > 0):
            raise InputError(f"validation_figure: {name} must be a positive finite fraction, got {bar!r}")
    if median_bar >= worst_bar:
        raise InputError(f"validation_figure: median_bar {median_bar!r} must be below "
                         f"worst_bar {worst_bar!r}")

    def points(t, which):
        need = ("id", "params_billion", "measured_tflops", "predicted_tflops")
        missing = [c for c in need if c not in t.column_names]
        if missing:
            raise InputError(f"validation_figure: the {which} table has no {', '.join(missing)} column "
                             "(pass a table check_published returns)")
        rows = [r for r in t.select(list(need)).to_pylist()
                if r["predicted_tflops"] is not None and math.isfinite(r["predicted_tflops"])]
        return rows

    val = points(table, "validation")
    if not val:
        raise InputError("validation_figure: no validation row has a prediction")
    held = points(held_back, "held-back") if held_back is not None else []
    fig = _draw(val, held, median_bar, worst_bar)
    fig.savefig(path)
    return str(path)


def run_architecture(run) -> Architecture:
    """A published run's model as a pipecore Architecture (Megatron's GPT defaults).

    Parameters
    ----------
    run : PublishedRun
        From :func:`pipecore.plan.published.published_runs`.

    Returns
    -------
    Architecture
        Its dimensions as published, named by the run's id.
    """
    m = run.model
    return Architecture(layers=m.layers, hidden=m.hidden, heads=m.heads, seq=m.seq, vocab=m.vocab,
                        ffn_hidden=m.ffn_hidden, kv_heads=m.kv_heads, gated_mlp=m.gated_mlp, name=run.id)


def run_strategy(run) -> Strategy:
    """The strategy a published run ran with, as pipecore estimates it.

    Parameters
    ----------
    run : PublishedRun
        From :func:`pipecore.plan.published.published_runs`.

    Returns
    -------
    Strategy
        Its degrees, microbatch size, schedule, recomputation, ZeRO stage,
        overlap and precision; unfused attention for runs whose framework
        predates FlashAttention (``UNFUSED_RUNS``).

    Raises
    ------
    ValueError
        (:class:`~pipecore.InputError`) if its precision is not one pipecore
        models (bf16 or fp16).
    """
    return Strategy(tp=run.tp, pp=run.pp, dp=run.dp, microbatch_size=run.microbatch_size,
                    schedule=run.schedule, chunks=run.chunks, recompute=run.recompute,
                    sequence_parallel=run.sequence_parallel, zero=run.zero, dp_overlap=run.dp_overlap,
                    precision=run.precision,
                    attention="unfused" if run.id.startswith(UNFUSED_RUNS) else "flash",
                    p2p_overlap=not run.id.startswith(MEGATRON_2021_RUNS),
                    grad_accumulation_fusion=not run.id.startswith(MEGATRON_2021_RUNS),
                    layers=run.stage_layers)

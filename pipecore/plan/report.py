"""The HTML page of a planning search: the trade-off, the best plan, the top plans.

One self-contained page (plotly.js inlined, as :func:`pipecore.report`'s):
every estimated strategy's iteration time against its memory per GPU with
the Pareto frontier, the best marked (and iteration time against cost when
the search ranked by cost); the best plan's pipeline timeline (the Gantt of
:func:`pipecore.report`, in seconds) and its memory per GPU by part against
the GPU's memory; where each top plan's iteration goes and its memory by
part; and a sortable table of the top plans.
"""

from __future__ import annotations

import html
import math
from pathlib import Path

import numpy as np

from ..analysis.frontier import pareto_front
from ..core.ops import InputError
from ..output.page import CSS, PALETTE, plotly_js
from ..output.report import _SORT_JS, MAX_OPS, _gantt_figure, _new_plot

__all__ = ["plan_report"]

GIB = 2.0**30
# Points drawn per chart beyond the frontier and the marked plans: a search of
# tens of thousands of strategies would make a page a browser opens slowly.
MAX_POINTS = 4000
# The parts of Estimate.breakdown and Estimate.memory, in drawing order, with
# what the legend calls them.
TIME_PARTS = {"compute": "compute", "tp_comm": "tensor-parallel comm.", "bubble": "pipeline bubble",
              "pp_comm": "pipeline transfers", "dp_comm": "data-parallel comm. (exposed)",
              "embedding_sync": "embedding sync", "optimizer": "optimizer step"}
MEMORY_PARTS = {"params": "parameters", "grads": "gradients", "optimizer": "optimizer state",
                "activations": "activations (schedule's peak)", "transient": "transient (recompute, logits)",
                "reserve": "framework reserve"}
_PART_COLOURS = ["#0067a5", "#f38400", "#c2b280", "#875692", "#be0032", "#882d17", "#008856"]
_MARGIN = {"l": 70, "r": 230}
_LEGEND = {"x": 1.01, "xanchor": "left", "y": 1.0, "yanchor": "top", "font": {"size": 11}}
_EXTRA_CSS = """
table.facts{margin:6px 0 10px}table.facts th{text-align:left;font-weight:normal;color:#444;
padding-right:24px}table.facts td{text-align:left}
table.summary th:nth-child(2),table.summary td:nth-child(2){text-align:left;white-space:nowrap}
.best-row td{background:#fff6d5}
"""


def _g(v, digits=3):
    return float(f"{v:.{digits + 3}g}")


def _arch_and_pool(plans, model, cluster, pool, global_batch):
    from .estimate import _architecture
    from .ranking import _check_setting

    arch = _architecture(model)
    if not 0 <= pool < len(cluster.pools):
        raise InputError(f"plan_report 'pool' must be 0..{len(cluster.pools) - 1} (got {pool})")
    pl = cluster.pools[pool]
    _check_setting(plans, arch, cluster, pool, global_batch)
    return arch, pl


def _estimates_by_label(plans):
    return {e.strategy.label(): e for e in plans.estimates.values()}


def _hover(r):
    lines = [html.escape(r["strategy"]),
             f"{r['iteration_time']:.3g} s per iteration",
             f"{r['memory_per_gpu'] / GIB:.1f} GiB per GPU",
             f"{r['tflops_per_gpu']:.0f} TFLOP/s per GPU ({r['mfu']:.0%} MFU)",
             f"${r['cost_per_million_tokens']:.3g} per million tokens"]
    why = "not ranked: " + html.escape(r["why"] or "")
    lines.append(f"rank {r['rank']}" if r["rank"] is not None else why)
    return "<br>".join(lines)


def _sample(idx, keep, limit, seed=0):
    """``idx`` thinned to ``limit`` evenly chosen points, those in ``keep`` always kept."""
    if idx.size <= limit:
        return idx, False
    kept = idx[np.isin(idx, keep)]
    rest = idx[~np.isin(idx, keep)]
    pick = np.random.default_rng(seed).choice(rest, max(limit - kept.size, 0), replace=False)
    return np.sort(np.concatenate([kept, pick])), True


def _tradeoff_figure(rows, x_key, x_scale, x_title, marks, hbm=None, bound=None):
    """Iteration time against ``x_key`` for every estimated row: ranked ones by
    schedule, unranked ones grey, the frontier of the ranked ones, the marks."""
    est = [r for r in rows if math.isfinite(r["iteration_time"])]
    x = np.array([r[x_key] / x_scale for r in est])
    y = np.array([r["iteration_time"] for r in est])
    ranked = np.array([r["rank"] is not None for r in est], dtype=bool)
    idx_ranked = np.flatnonzero(ranked)
    front = idx_ranked[pareto_front(x[idx_ranked], y[idx_ranked])] if idx_ranked.size else idx_ranked
    traces, thinned = [], False
    shown, thin = _sample(np.flatnonzero(~ranked), front, MAX_POINTS // 4)
    thinned |= thin
    if shown.size:
        traces.append({"type": "scatter", "mode": "markers", "name": "not ranked (too big or too slow)",
                       "x": [_g(v) for v in x[shown]], "y": [_g(v) for v in y[shown]],
                       "marker": {"color": "#bbbbbb", "size": 6, "symbol": "circle-open"},
                       "text": [_hover(est[i]) for i in shown], "hovertemplate": "%{text}<extra></extra>"})
    schedules = sorted({r["schedule"] for r in est})
    for k, name in enumerate(schedules):
        sel = np.flatnonzero(ranked & np.array([r["schedule"] == name for r in est]))
        sel, thin = _sample(sel, front, MAX_POINTS // max(len(schedules), 1))
        thinned |= thin
        if not sel.size:
            continue
        traces.append({"type": "scatter", "mode": "markers", "name": name,
                       "x": [_g(v) for v in x[sel]], "y": [_g(v) for v in y[sel]],
                       "marker": {"color": PALETTE[k % len(PALETTE)], "size": 7, "opacity": 0.7},
                       "text": [_hover(est[i]) for i in sel], "hovertemplate": "%{text}<extra></extra>"})
    if front.size:
        order = front[np.argsort(x[front], kind="stable")]
        traces.append({"type": "scatter", "mode": "lines", "name": "Pareto frontier",
                       "x": [_g(v) for v in x[order]], "y": [_g(v) for v in y[order]],
                       "line": {"color": "#111111", "width": 2, "shape": "hv"}, "hoverinfo": "skip"})
    log = bool(y.size) and y.min() > 0 and y.max() / y.min() > 8

    def ya(v):  # plotly places annotations on a log axis by the value's logarithm
        return _g(math.log10(v)) if log else _g(v)

    symbols = ["star", "diamond", "square", "triangle-up", "cross"]
    annotations = []
    for k, (name, est_mark) in enumerate(marks):
        mx, my = getattr(est_mark, x_key) / x_scale, est_mark.iteration_time
        traces.append({"type": "scatter", "mode": "markers", "name": html.escape(name),
                       "x": [_g(mx)], "y": [_g(my)],
                       "marker": {"symbol": symbols[k % len(symbols)], "size": 17 if k == 0 else 13,
                                  "color": "#ffd400" if k == 0 else "#ffffff",
                                  "line": {"color": "#111111", "width": 1.5}},
                       "hovertemplate": f"{html.escape(name)}<br>%{{y}} s, %{{x}}<extra></extra>"})
        annotations.append({"x": _g(mx), "y": ya(my), "text": html.escape(name.split(":")[0]),
                            "showarrow": True, "arrowhead": 0, "ax": 30, "ay": -24 - 16 * k,
                            "font": {"size": 11}, "bgcolor": "rgba(255,255,255,0.85)"})
    shapes = []
    if hbm is not None:
        shapes.append({"type": "line", "xref": "x", "yref": "paper", "x0": hbm, "x1": hbm, "y0": 0, "y1": 1,
                       "line": {"color": "#d62728", "dash": "dash", "width": 2}})
        annotations.append({"xref": "x", "yref": "paper", "x": hbm, "y": 1, "showarrow": False,
                            "text": f"GPU memory {hbm:.0f} GiB", "xanchor": "right", "yanchor": "top",
                            "xshift": -4, "font": {"color": "#d62728", "size": 11},
                            "bgcolor": "rgba(255,255,255,0.85)"})
    if bound is not None:
        shapes.append({"type": "line", "xref": "paper", "yref": "y", "x0": 0, "x1": 1, "y0": bound,
                       "y1": bound, "line": {"color": "#d62728", "dash": "dot", "width": 1.5}})
        annotations.append({"xref": "paper", "yref": "y", "x": 0, "y": ya(bound), "showarrow": False,
                            "text": f"max iteration time {bound:g} s", "xanchor": "left",
                            "yanchor": "bottom", "font": {"color": "#d62728", "size": 11}})
    # The x axis stops a quarter past the GPU's memory or the widest ranked strategy: far
    # heavier strategies that cannot fit would squeeze the ones that do (autoscale shows all).
    ranked_x = x[ranked] if ranked.any() else x
    right = max(hbm or 0.0, float(ranked_x.max()) if ranked_x.size else 0.0) or 1.0
    clipped = int((x > right * 1.25).sum())
    layout = {"height": 560, "margin": dict(_MARGIN, t=30, b=55), "hovermode": "closest",
              "plot_bgcolor": "#ffffff", "legend": dict(_LEGEND),
              "xaxis": {"title": {"text": x_title}, "range": [0, _g(right * 1.25)], "gridcolor": "#eeeeee",
                        "zeroline": False},
              "yaxis": {"title": {"text": "iteration time (s, lower is faster"
                                  + ("; log scale)" if log else ")")},
                        "type": "log" if log else "linear", "gridcolor": "#eeeeee"},
              "shapes": shapes, "annotations": annotations}
    return {"data": traces, "layout": layout}, thinned, int(front.size), clipped


def _parts_figure(ests, names, parts, scale, x_title, limit=None, limit_text=None):
    """One horizontal stacked bar per estimate, its parts in ``scale`` units."""
    key = "breakdown" if parts is TIME_PARTS else "memory"
    traces = []
    for k, (part, legend) in enumerate(parts.items()):
        values = [getattr(e, key).get(part, 0.0) / scale for e in ests]
        traces.append({"type": "bar", "orientation": "h", "name": legend, "y": names,
                       "x": [_g(v) for v in values], "marker": {"color": _PART_COLOURS[k]},
                       "hovertemplate": f"{legend}: %{{x:.3g}}<extra>%{{y}}</extra>"})
    layout = {"barmode": "stack", "height": max(210, 30 * len(ests) + 110),
              "margin": dict(_MARGIN, t=20, b=50), "plot_bgcolor": "#ffffff",
              "legend": dict(_LEGEND, traceorder="normal"),
              "xaxis": {"title": {"text": x_title}, "gridcolor": "#eeeeee", "rangemode": "tozero"},
              "yaxis": {"autorange": "reversed", "automargin": True, "type": "category"},
              "bargap": 0.35}
    if limit is not None:
        layout["shapes"] = [{"type": "line", "xref": "x", "yref": "paper", "x0": limit, "x1": limit,
                             "y0": 0, "y1": 1, "line": {"color": "#d62728", "dash": "dash", "width": 2}}]
        layout["annotations"] = [{"xref": "x", "yref": "paper", "x": limit, "y": 0, "showarrow": False,
                                  "text": limit_text, "xanchor": "right", "yanchor": "bottom",
                                  "xshift": -4, "font": {"color": "#d62728", "size": 11},
                                  "bgcolor": "rgba(255,255,255,0.85)"}]
    return {"data": traces, "layout": layout}


def _gantt(result):
    fig, note = _gantt_figure(result, critical=True, max_ops=MAX_OPS)
    fig["layout"]["xaxis"]["title"]["text"] = "time (s)"
    fig["layout"]["margin"] = dict(fig["layout"]["margin"], r=_MARGIN["r"])
    fig["layout"]["yaxis"]["title"]["text"] = "pipeline device"
    for t in fig["data"]:
        if "hovertemplate" in t:
            t["hovertemplate"] = (t["hovertemplate"].replace("start %{base}", "start %{base} s")
                                  .replace("duration %{x}", "duration %{x} s"))
    if note:
        note += " Times are in seconds."
    return fig, note


def _prices(cluster, strategy, pool):
    """``$4.1 per GPU-hour x 16 GPUs`` for each pool a strategy uses."""
    ranks = strategy.pools if strategy.pools is not None else (pool,) * strategy.pp
    counts = {}
    for k in ranks:
        counts[k] = counts.get(k, 0) + strategy.tp * strategy.dp
    return " + ".join(f"${cluster.pools[k].price_per_gpu_hour:g} per GPU-hour x {n} GPUs"
                      for k, n in counts.items())


def _facts(est, pl, arch, cluster, pool):
    from .search import _pools_text

    b = est.breakdown
    gpus = _pools_text(cluster, est.strategy, pool)
    rows = [("iteration time", f"{est.iteration_time:.3g} s (lower is faster)"),
            ("throughput", f"{est.tokens_per_second:,.0f} tokens/s over the run"),
            ("model FLOP/s per GPU", f"{est.tflops_per_gpu:.0f} TFLOP/s ({est.mfu:.1%} MFU)"),
            ("hardware FLOP/s per GPU", f"{est.hardware_tflops_per_gpu:.0f} TFLOP/s ({est.hfu:.1%} HFU, "
                                        "recomputation counted)"),
            ("memory, fullest GPU",
             f"{est.memory_per_gpu / GIB:.1f} GiB of "
             f"{(est.memory_capacity or pl.gpu.hbm_bytes) / GIB:.0f} GiB"
             + (f" ({est.memory_gpu})" if len(cluster.pools) > 1 else "")),
            ("GPUs", gpus),
            ("cost", f"${est.cost_per_million_tokens:.3g} per million tokens "
                     f"({_prices(cluster, est.strategy, pool)})"),
            ("pipeline", f"{est.strategy.pp} device{'s' if est.strategy.pp > 1 else ''} x "
                         f"{est.strategy.chunks} chunk{'s' if est.strategy.chunks > 1 else ''}, "
                         f"{est.microbatches} microbatches of {est.strategy.microbatch_size} x {arch.seq} "
                         f"tokens; bubble {b['bubble'] / est.iteration_time:.1%} of the iteration")]
    return ("<table class='facts'>" + "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>"
                                             for k, v in rows) + "</table>")


def _table(ranked, by_label, top):
    head = [("rank", "1 = best"), ("strategy", ""), ("s/iter", "lower is faster"),
            ("tokens/s", "whole run"), ("TFLOP/s", "model FLOPs per GPU"), ("MFU", "share of peak"),
            ("GiB/GPU", "fullest GPU"), ("$/Mtok", "USD per million tokens"),
            ("bubble", "share of the iteration"), ("comm.", "exposed tp + pp + dp + sync share")]
    out = ["<table class='summary plans'><thead><tr>"
           + "".join(f"<th title='{html.escape(t)}'>{html.escape(h)}"
                     + (f"<span class='unit'>{html.escape(t)}</span>" if t else "") + "</th>"
                     for h, t in head) + "</tr></thead><tbody>"]
    for r in ranked[:top]:
        e = by_label[r["strategy"]]
        b = e.breakdown
        comm = (b["tp_comm"] + b["pp_comm"] + b["dp_comm"] + b["embedding_sync"]) / e.iteration_time
        bubble = b["bubble"] / e.iteration_time
        cells = [(r["rank"], str(r["rank"])), (r["strategy"], html.escape(r["strategy"])),
                 (r["iteration_time"], f"{r['iteration_time']:.3g}"),
                 (r["tokens_per_second"], f"{r['tokens_per_second']:,.0f}"),
                 (r["tflops_per_gpu"], f"{r['tflops_per_gpu']:.0f}"), (r["mfu"], f"{r['mfu']:.1%}"),
                 (r["memory_per_gpu"], f"{r['memory_per_gpu'] / GIB:.1f}"),
                 (r["cost_per_million_tokens"], f"{r['cost_per_million_tokens']:.3g}"),
                 (bubble, f"{bubble:.1%}"), (comm, f"{comm:.1%}")]
        cls = " class='best-row'" if r["rank"] == 1 else ""
        out.append(f"<tr{cls}>" + "".join(
            f"<td data-v='{html.escape(str(v))}'>{t}</td>" if not isinstance(v, str) else f"<td>{t}</td>"
            for v, t in cells) + "</tr>")
    out.append("</tbody></table><p class='foot'>Click a column header to sort. comm.: the tensor-parallel, "
               "pipeline-transfer, data-parallel and embedding-sync time the iteration waits for "
               "(overlapped communication is not counted).</p>")
    return "".join(out)


def plan_report(plans, path, model, cluster, global_batch: int, *, pool: int = 0, top: int = 10,
                marks: dict | None = None, max_iteration_time: float | None = None,
                title: str | None = None) -> Path:
    """Write the HTML page of a planning search.

    The page: a headline (the best plan, each marked strategy's rank, how
    many strategies ranked and why the others did not); iteration time
    against memory per GPU for every estimated strategy with the Pareto
    frontier of the ranked ones, the GPU's memory and the best plan marked
    (and iteration time against cost per million tokens when the search
    ranked by cost); the best plan's facts, its pipeline timeline (one
    iteration's Gantt, seconds) and its memory by part against the GPU's;
    the top plans' iteration time by cause and memory by part; a sortable
    table of the top plans. It opens offline (plotly.js is inlined).

    Parameters
    ----------
    plans : Strategies
        The result of :func:`pipecore.strategies`.
    path : str or pathlib.Path
        The HTML file to write (its folder is created).
    model, cluster, global_batch, pool, max_iteration_time
        As given to :func:`pipecore.strategies` for ``plans``.
    top : int, default 10
        Plans in the breakdown charts and the table (at least 1).
    marks : dict, optional
        Name -> :class:`pipecore.plan.ranking.Ranking` (from
        :meth:`Strategies.rank_of` or
        :func:`pipecore.plan.ranking.published_rankings`): each is marked
        on the charts and stated in the headline.
    title : str, optional
        The page's title.

    Returns
    -------
    pathlib.Path
        The file written.

    Raises
    ------
    ValueError
        (:class:`~pipecore.InputError`) if ``top`` is below 1, a mark is
        not a Ranking, or the model, cluster or batch are not the search's.
    MissingDependencyError
        If plotly is not installed.
    OSError
        If the file cannot be written.
    """
    from .ranking import Ranking, full_label, mark_line

    if isinstance(top, bool) or not isinstance(top, int) or top < 1:
        raise InputError(f"plan_report 'top' must be an int >= 1 (got {top!r})")
    marks = dict(marks or {})
    for name, mark in marks.items():
        if not isinstance(mark, Ranking):
            raise InputError(f"plan_report mark {name!r} must be a Ranking (got {type(mark).__name__}): "
                             "use plans.rank_of(...)")
    arch, pl = _arch_and_pool(plans, model, cluster, pool, global_batch)
    js = plotly_js()
    rows = plans.table.to_pylist()
    ranked = [r for r in rows if r["rank"] is not None]
    by_label = _estimates_by_label(plans)
    gpus = " + ".join(f"{p.count} x {p.gpu.name}" for p in cluster.pools)
    setting = f"{arch.name} on {gpus} ({cluster.name}), global batch {global_batch} x {arch.seq} tokens"
    page_title = title or f"pipecore plan: {setting}"
    objective = ("iteration time (lower is faster)" if plans.objective == "time"
                 else "cost per million tokens (lower is cheaper)")
    sub = (f"Ranked by {objective}; ties by memory per GPU. Times in seconds, memory in GiB (2^30 bytes) "
           f"on the fullest GPU, cost in US dollars at "
           + " and ".join(f"${p.price_per_gpu_hour:g} per {p.gpu.name} GPU-hour"
                          for p in cluster.pools) + ".")
    best = plans.best
    head = []
    if best is not None:
        head.append(f"best: {full_label(best.strategy)}: {best.iteration_time:.3g} s per iteration, "
                    f"{best.tflops_per_gpu:.0f} TFLOP/s per GPU ({best.mfu:.0%} MFU), "
                    f"{best.memory_per_gpu / GIB:.1f} GiB per GPU, ${best.cost_per_million_tokens:.3g} per "
                    "million tokens")
    else:
        head.append("no strategy ranks: every one cannot run, does not fit or breaks the time bound "
                    "(the table's 'why' column says which)")
    head += [mark_line(name, mark) for name, mark in marks.items()]
    unfit = sum(1 for r in rows if r["why"] and r["why"].startswith("needs "))
    slow = sum(1 for r in rows if r["why"] and "max_iteration_time" in r["why"])
    head.append(f"{len(rows)} strategies: {len(ranked)} ranked, {unfit} do not fit "
                f"{pl.gpu.hbm_bytes / GIB:.0f} GiB, {slow} too slow, "
                f"{len(rows) - len(ranked) - unfit - slow} cannot run")
    parts = [f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(page_title)}</title>"
             f"<style>{CSS}{_EXTRA_CSS}</style><script>{js}</script></head><body>",
             f"<h1>{html.escape(page_title)}</h1><p class='sub'>{html.escape(sub)}</p>",
             "<div class='headline'>" + "".join(f"<p>{html.escape(t)}</p>" for t in head) + "</div>"]
    scripts = []

    def plot(div, fig, cls=""):
        parts.append(f"<div id='{div}' class='plot {cls}'></div>")
        scripts.append(_new_plot(div, fig))

    chart_marks = ([(f"best: {best.strategy.label()}", best)] if best is not None else []) + \
        [(f"{name}: {m.strategy.label()}", m.estimate) for name, m in marks.items() if m.estimate is not None]
    hbm = pl.gpu.hbm_bytes / GIB
    fig, thinned, n_front, clipped = _tradeoff_figure(rows, "memory_per_gpu", GIB,
                                             "memory per GPU (GiB, fullest GPU; lower is lighter)",
                                             chart_marks, hbm=hbm, bound=max_iteration_time)
    parts.append("<h2 id='tradeoff'>Every strategy: iteration time against memory per GPU</h2>")
    plot("tradeoff-memory", fig)
    parts.append(f"<p class='foot'>Each dot is one estimated strategy, coloured by schedule; grey rings "
                 f"are estimated but not ranked (they do not fit the GPU's {hbm:.0f} GiB, dashed line, or "
                 f"break the time bound). The black line is the Pareto frontier of the ranked ones "
                 f"({n_front} strategies: nothing ranked is both faster and lighter). Hover a dot for "
                 "its strategy."
                 + (f" {clipped} strategies need far more memory than the GPU has and lie right of the "
                    "chart (the autoscale button shows them)." if clipped else "")
                 + (f" Above {MAX_POINTS:,} dots an even sample is drawn (the frontier "
                                    "and the marked plans always)." if thinned else "") + "</p>")
    if plans.objective == "cost":
        fig, _thin, n_front, _clipped = _tradeoff_figure(
            rows, "cost_per_million_tokens", 1.0, "cost (US dollars per million tokens; lower is cheaper)",
            chart_marks, bound=max_iteration_time)
        parts.append("<h2 id='tradeoff-cost'>Every strategy: iteration time against cost</h2>")
        plot("tradeoff-cost", fig)
        ratios = [r["cost_per_million_tokens"] / r["iteration_time"] for r in ranked]
        same = bool(ratios) and max(ratios) - min(ratios) <= 1e-9 * max(ratios)
        parts.append(f"<p class='foot'>The black line: the ranked strateg{'y' if n_front == 1 else 'ies'} "
                     "nothing ranked beats in both time and cost."
                     + (f" Every strategy here runs on all {pl.count} GPUs at one price, so cost is "
                        "proportional to iteration time: the dots lie on one line and the fastest is the "
                        "cheapest." if same else "") + "</p>")
    if best is not None:
        parts.append(f"<h2 id='best'>The best plan: {html.escape(full_label(best.strategy))}</h2>")
        parts.append(_facts(best, pl, arch, cluster, pool))
        gantt, note = _gantt(best.pipeline)
        parts.append("<p class='foot'>One iteration's pipeline on one data-parallel replica, as pipecore "
                     "simulated it (bars: forward F, backward B and W per microbatch, numbered; the "
                     "critical path is a legend toggle). The data-parallel reduction, the embedding "
                     "sync and the optimizer step follow it: see the breakdown below.</p>")
        if note:
            parts.append(f"<p class='note'>{html.escape(note)}</p>")
        plot("best-gantt", gantt, "gantt")
        plot("best-memory", _parts_figure([best], ["best plan"], MEMORY_PARTS, GIB,
                                          "memory on the fullest GPU (GiB)", hbm,
                                          f"GPU memory {hbm:.0f} GiB"), "memory")
    shown = ranked[:top]
    if shown:
        ests = [by_label[r["strategy"]] for r in shown]
        names = [f"{r['rank']}. {r['strategy']}" for r in shown]
        parts.append(f"<h2 id='breakdown'>Where the time goes: the top {len(shown)} plans</h2>")
        plot("breakdown-time", _parts_figure(ests, names, TIME_PARTS, 1.0,
                                             "time per iteration (s), by cause; lower is faster"))
        parts.append("<p class='foot'>compute: the busiest pipeline device's own work; tensor-parallel "
                     "comm.: its collectives on the critical path; pipeline bubble: idle time with free "
                     "transfers; pipeline transfers: what the point-to-point sends add; data-parallel "
                     "comm.: the gradient reduction and parameter gathers not hidden by the backward; "
                     "then the tied embedding's sync and the optimizer step.</p>")
        parts.append(f"<h2 id='memory'>Where the memory goes: the top {len(shown)} plans</h2>")
        plot("breakdown-memory", _parts_figure(ests, names, MEMORY_PARTS, GIB,
                                               "memory on the fullest GPU (GiB), by part", hbm,
                                               f"GPU memory {hbm:.0f} GiB"))
        parts.append("<p class='foot'>The fullest GPU of each plan: 16-bit parameters, fp32 gradients "
                     "and the optimizer's fp32 master weights and moments (ZeRO shards them over the "
                     "data-parallel ranks), the activations at the schedule's peak, what recomputation and "
                     "the logits hold for a moment, and a fixed reserve for the framework (an "
                     "assumption: CUDA context, communication buffers, fragmentation).</p>")
        parts.append(f"<h2 id='table'>The top {len(shown)} plans</h2>")
        parts.append(_table(ranked, by_label, top))
    parts.append(f"<script>{_SORT_JS}\n{''.join(scripts)}</script></body></html>")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(parts), encoding="utf-8")
    return out

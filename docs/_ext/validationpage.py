"""The validation page's numbers and plot, computed when the docs build.

docs/validation.md is prose; every number it shows comes from the files this
extension writes into docs/generated/validation/ each build, from
:func:`pipecore.plan.validation.check_published` (predicted beside measured)
and the published runs' own data (:func:`pipecore.plan.published.published_runs`):

- ``summary.inc``: the median and worst error against issue 53's bar;
- ``table1.inc``: the ten rows of Megatron-LM SC21 Table 1;
- ``groups.inc``: the rows grouped by pipeline layout, with where the time goes;
- ``heldback.inc``: the held-back runs that can be predicted, and the ones left out and why;
- ``validation.png``: predicted against measured (:func:`pipecore.plan.validation.validation_figure`).

The fragments end in ``.inc`` so Sphinx does not read them as pages of their
own; the page pulls them in with MyST's ``include`` directive.
"""

from __future__ import annotations

import math
import os
import re

from generated import OUT, write_pages

FOLDER = OUT / "validation"
#: Share columns of check_published and their headings.
SHARE_HEADINGS = (("compute", "compute"), ("tp_comm", "TP comm"), ("bubble", "bubble"),
                  ("pp_comm", "PP comm"), ("dp_comm", "DP comm"), ("other", "other"))


def tables():
    """``(validation, held_back)``: :func:`check_published` of each role."""
    from pipecore.plan.validation import check_published

    return check_published("validation"), check_published("held-back")


def _runs():
    from pipecore.plan.published import published_runs

    return {r.id: r for r in published_runs()}


def _size(billion: float) -> str:
    # Parameters as the source prints them, in billions, as the plot labels its points.
    return f"{billion:g}B"


def _pct(fraction: float, signed: bool = False) -> str:
    if fraction is None or not math.isfinite(fraction):
        return "–"
    return f"{fraction * 100:+.1f}%" if signed else f"{fraction * 100:.1f}"


def _num(value: float) -> str:
    return f"{value:.1f}" if value is not None and math.isfinite(value) else "–"


def _layout(run) -> tuple[str, str]:
    tpd = f"{run.tp}/{run.pp}/{run.dp}"
    inter = f"{run.chunks} chunks" if run.chunks > 1 else "no"
    return tpd, inter


def _table(rows: list[dict], runs: dict, shares: bool) -> str:
    head = ["model (parameters)", "GPUs", "t/p/d", "microbatch (sequences)", "interleaving",
            "measured TFLOP/s per GPU", "predicted TFLOP/s per GPU", "error"]
    align = ["---", "---:", ":---:", "---:", ":---:", "---:", "---:", "---:"]
    if shares:
        head += [f"{name} %" for _, name in SHARE_HEADINGS]
        align += ["---:"] * len(SHARE_HEADINGS)
    out = ["| " + " | ".join(head) + " |", "|" + "|".join(align) + "|"]
    for r in rows:
        run = runs[r["id"]]
        tpd, inter = _layout(run)
        cells = [_size(run.params_billion), f"{run.gpus:,}", tpd, str(run.microbatch_size), inter,
                 f"{r['measured_tflops']:g}", _num(r["predicted_tflops"]), _pct(r["error"], signed=True)]
        if shares:
            cells += [_pct(r[f"share_{key}"]) for key, _ in SHARE_HEADINGS]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def summary_text(validation) -> str:
    """The median and worst error of the validation rows against the bar, in words."""
    from pipecore.plan.validation import validation_summary

    s = validation_summary(validation)
    runs = _runs()
    worst = _size(runs[s["worst_id"]].params_billion)
    verdict = ("**The bar is met.**" if s["meets_bar"] else
               "**The bar is not met.**")
    sides = []
    if s["optimistic"]:
        sides.append(f"{s['optimistic']} of {s['rows']} runs are predicted faster than they ran")
    if s["pessimistic"]:
        sides.append(f"{s['pessimistic']} of {s['rows']} slower")
    median_ok = "within" if s["median_abs_error"] <= s["median_bar"] else "over"
    worst_ok = "within" if abs(s["worst_error"]) <= s["worst_bar"] else "over"
    return (f"Over the {s['rows']} runs of Table 1 the median absolute error is "
            f"**{s['median_abs_error'] * 100:.1f}%** ({median_ok} the bar of "
            f"{s['median_bar'] * 100:.0f}%) and the worst is **{s['worst_error'] * 100:+.1f}%**, "
            f"the {worst} run ({worst_ok} the bar of {s['worst_bar'] * 100:.0f}%). {verdict} "
            f"{'; '.join(sides).capitalize()}.\n")


def groups_text(validation) -> str:
    """The validation rows grouped by pipeline layout: error range and mean shares of time."""
    runs = _runs()
    rows = [r for r in validation.to_pylist() if r["error"] is not None and math.isfinite(r["error"])]
    groups = (("no pipeline (p = 1)", lambda run: run.pp == 1),
              ("pipeline, 1F1B", lambda run: run.pp > 1 and run.chunks == 1),
              ("pipeline, interleaved 1F1B", lambda run: run.chunks > 1))
    out = ["| rows | models | error, lowest to highest | compute % | TP comm % | bubble % | PP comm % "
           "| DP comm % |", "|---|---|---:|---:|---:|---:|---:|---:|"]
    for name, member in groups:
        sel = [r for r in rows if member(runs[r["id"]])]
        if not sel:
            continue
        errs = sorted(r["error"] for r in sel)
        mean = {k: sum(r[f"share_{k}"] for r in sel) / len(sel)
                for k in ("compute", "tp_comm", "bubble", "pp_comm", "dp_comm")}
        models = ", ".join(_size(runs[r["id"]].params_billion) for r in sel)
        out.append(f"| {name} | {models} | {_pct(errs[0], True)} to {_pct(errs[-1], True)} | "
                   + " | ".join(_pct(mean[k]) for k in ("compute", "tp_comm", "bubble", "pp_comm",
                                                          "dp_comm")) + " |")
    return "\n".join(out) + "\n"


def heldback_text(held) -> str:
    """The held-back runs predicted (complete published data), then the ones left out and why."""
    runs = _runs()
    shown, left = [], []
    for r in held.to_pylist():
        run = runs[r["id"]]
        predicted = r["predicted_tflops"] is not None and math.isfinite(r["predicted_tflops"])
        if predicted and run.complete:
            shown.append(r)
        else:
            why = r["note"].removeprefix("left out: ") if r["note"] else "no prediction"
            if predicted:  # predicted, but on placeholders for what the source does not publish
                why = (f"{why}; on those placeholders pipecore predicts {r['predicted_tflops']:.1f} "
                       f"TFLOP/s per GPU against {r['measured_tflops']:g} measured "
                       f"({_pct(r['error'], True)}), not counted as a check")
            left.append((run, why))
    out = []
    if shown:
        out += [_table(shown, runs, shares=True), "", "Sources:", ""]
        out += [f"- {_size(runs[r['id']].params_billion)} (`{r['id']}`): {runs[r['id']].source}; "
                f"configuration: {runs[r['id']].config_source}." for r in shown]
        errs = [abs(r["error"]) for r in shown]
        out += ["", f"Held-back error: {len(shown)} run{'s' if len(shown) != 1 else ''}, worst "
                f"{max(errs) * 100:.1f}% in absolute value.", ""]
    else:
        out += ["No held-back run has both complete published data and a layout pipecore can "
                "estimate yet: there is no held-back error to report.", ""]
    if left:
        out += ["Left out:", ""]
        # Runs left out for one reason are one line: the ids' common stem, sizes and GPU counts.
        by_reason: dict[str, list] = {}
        for run, why in left:
            by_reason.setdefault(why, []).append(run)
        for why, group in by_reason.items():
            if len(group) == 1:
                run = group[0]
                out.append(f"- `{run.id}` ({_size(run.params_billion)}, {run.gpus:,} GPUs): {why}.")
                continue
            stem = os.path.commonprefix([r.id for r in group]).rstrip("-")
            # The sources' common part, without the row number or a parenthesis.
            source = os.path.commonprefix([r.source for r in group]).split(" (")[0]
            source = re.sub(r"[\s,;]*(rows?\s*\d*)?$", "", source)
            sizes = ", ".join(_size(r.params_billion) for r in group)
            gpus = sorted(r.gpus for r in group)
            out.append(f"- `{stem}-*`, {len(group)} runs ({sizes}; {gpus[0]:,} to {gpus[-1]:,} GPUs; "
                       f"{source}): {why}.")
    return "\n".join(out) + "\n"


def pages(validation, held) -> dict[str, str]:
    """The page's fragments, ``{file name: Markdown}``."""
    runs = _runs()
    return {"validation/summary.inc": summary_text(validation),
            "validation/table1.inc": _table(validation.to_pylist(), runs, shares=True),
            "validation/groups.inc": groups_text(validation),
            "validation/heldback.inc": heldback_text(held)}


def _generate(app):
    from pipecore.plan.validation import validation_figure

    validation, held = tables()
    FOLDER.mkdir(parents=True, exist_ok=True)
    validation_figure(validation, FOLDER / "validation.png", held_back=held)
    write_pages(pages(validation, held), OUT)


def setup(app):
    app.connect("builder-inited", _generate)
    return {"parallel_read_safe": True, "parallel_write_safe": True}

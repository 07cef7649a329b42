"""Three views of every family side by side: formula, ideal table, simulation."""

from __future__ import annotations

import numpy as np

from ..core.costs import Costs, Network
from ..core.schedule import _check_int
from ..core.simulate import simulate
from ..schedules.registry import build, family, schedules
from .formulas import formula
from .table import ideal_table

__all__ = ["compare", "format_compare", "three_views"]

_TOL = 1e-9


def _close(a, b):
    return abs(a - b) <= _TOL * max(1.0, abs(a), abs(b))


def compare(devices: int, microbatches: int, chunks: int = 2, costs: Costs | None = None,
            network: Network | None = None, names=None) -> list[dict]:
    """Evaluate each family three ways and flag where the views disagree.

    Parameters
    ----------
    devices, microbatches : int
        Pipeline shape.
    chunks : int, default 2
        Stages per device for the families that interleave.
    costs : Costs, optional
        Scalar costs for the simulation and the formula; defaults to
        ``Costs()``.
    network : Network, optional
        Passed to the simulation (the formulas ignore communication).
    names : iterable of str, optional
        Families to include; all by default.

    Returns
    -------
    list of dict
        One row per family: ``name``, ``chunks``, ``makespan``,
        ``formula_makespan``, ``table_slots``, ``formula_slots``,
        ``bubble_ratio``, ``formula_bubble_ratio``, ``bubble_rate``,
        ``formula_bubble_rate``, ``formula_exact``,
        ``peak_max``/``peak_min`` and their ``formula_`` twins,
        ``flags`` (list of disagreements), ``error`` (why the family could
        not be built, else None), and ``result`` (the simulation).

    Raises
    ------
    ValueError
        For bad devices, microbatches, chunks or costs, or an unknown name.
    """
    costs = Costs() if costs is None else costs
    # Shape errors are the caller's; a family that cannot take a valid shape
    # is reported in its row instead.
    devices = _check_int("devices", devices, minimum=1)
    microbatches = _check_int("microbatches", microbatches, minimum=1)
    chunks = _check_int("chunks", chunks, minimum=1)
    if names is None:
        names = schedules()
    rows = []
    for name in names:
        fam = family(name)
        v = fam.chunks_for(chunks)
        row = {"name": fam.name, "chunks": v, "error": None, "flags": [], "result": None}
        try:
            sched = build(fam.name, devices, microbatches, chunks=v)
        except (ValueError, MemoryError) as exc:  # a shape the family refuses, or too large
            row["error"] = str(exc)
            rows.append(row)
            continue
        res = simulate(sched, costs, network)
        row.update(three_views(sched, res, costs, network, chunks=v))
        rows.append(row)
    return rows


def three_views(sched, res, costs: Costs, network: Network | None,
                chunks: int | None = None) -> dict:
    """The formula, ideal-table and simulation figures of one schedule and
    where they disagree (the columns of a :func:`compare` row).

    Parameters
    ----------
    sched : Schedule
        The schedule.
    res : Result
        Its simulation with ``costs`` and ``network``.
    costs : Costs
    network : Network or None
    chunks : int, optional
        The family's chunks (the unit of the ideal table's slots); by
        default the family's for the schedule's own.

    Returns
    -------
    dict
        ``result``, ``makespan``, ``formula_makespan``, ``table_slots``,
        ``formula_slots``, bubble and peak figures, ``flags``.

    Raises
    ------
    ValueError
        If the family has no closed form for this schedule.
    """
    v = chunks if chunks is not None else family(sched.name).chunks_for(int(sched.chunks))
    fm = formula(sched, costs)
    table = ideal_table(sched)
    unit = formula(sched, Costs(f=float(v), b=float(v), w=float(v)))
    peak = res.peak_activation
    row = {"flags": []}
    row.update(
        result=res,
        makespan=res.makespan,
        formula_makespan=fm["makespan"],
        table_slots=table.length,
        formula_slots=unit["makespan"],
        bubble_ratio=res.bubble_ratio,
        formula_bubble_ratio=fm["bubble_ratio"],
        bubble_rate=res.bubble_rate,
        formula_bubble_rate=fm["bubble_rate"],
        formula_exact=bool(fm["exact"]),
        peak_max=float(peak.max()),
        peak_min=float(peak.min()),
        formula_peak_max=float(fm["peak_activation"].max()),
        formula_peak_min=float(fm["peak_activation"].min()),
    )
    comm = network is not None or np.any(np.asarray(costs.comm) > 0)
    why = []
    if comm:
        why.append("communication")
    if not fm["exact"]:
        why.append("formula approximate for these costs")
    note = f" ({', '.join(why)})" if why else ""
    if not _close(res.makespan, fm["makespan"]):
        row["flags"].append("sim vs formula: makespan" + note)
    if not _close(res.bubble_rate, fm["bubble_rate"]):
        row["flags"].append("sim vs formula: bubble rate" + note)
    if not _close(table.length, unit["makespan"]):
        row["flags"].append("table vs formula: slots" + ("" if fm["exact"] else " (formula approximate)"))
    # NaN: the family has no closed form for its peak.
    if (not np.isnan(fm["peak_activation"]).any()
            and not np.allclose(peak, fm["peak_activation"], rtol=_TOL, atol=_TOL)):
        row["flags"].append("sim vs formula: peak activation" + note)
    return row


def _num(v: float) -> str:
    return "-" if np.isnan(v) else f"{v:.4g}"  # NaN: no closed form for it


def format_compare(rows: list[dict]) -> str:
    """Render :func:`compare` rows as a text table that fits 120 columns.

    ``agree`` is yes when the simulation, the closed formula and the ideal
    table give the same makespan, bubble and peak; otherwise "no" with
    footnote numbers, and the footnotes follow the table. The zero-bubble
    papers' bubble rate is in the JSON output and the HTML report.

    Parameters
    ----------
    rows : list of dict

    Returns
    -------
    str

    Raises
    ------
    None
        Nothing beyond errors of the objects it is given.
    """
    head = ["schedule", "v", "makespan", "formula", "slots", "f.slots", "bubble", "f.bubble",
            "peak max", "f.max", "peak min", "f.min", "agree"]
    notes: dict[str, int] = {}
    out = []
    for r in rows:
        if r["error"]:
            n = notes.setdefault("not built: " + r["error"], len(notes) + 1)
            out.append([r["name"], str(r["chunks"])] + ["-"] * 10 + [f"n/a [{n}]"])
            continue
        marks = [notes.setdefault(f, len(notes) + 1) for f in r["flags"]]
        out.append([
            r["name"], str(r["chunks"]), f"{r['makespan']:.6g}", f"{r['formula_makespan']:.6g}",
            str(r["table_slots"]), f"{r['formula_slots']:.6g}", f"{r['bubble_ratio']:.4f}",
            f"{r['formula_bubble_ratio']:.4f}",
            f"{r['peak_max']:.4g}", _num(r["formula_peak_max"]),
            f"{r['peak_min']:.4g}", _num(r["formula_peak_min"]),
            "yes" if not marks else "no " + ",".join(f"[{m}]" for m in marks),
        ])
    widths = [max(len(h), *(len(row[i]) for row in out)) if out else len(h)
              for i, h in enumerate(head)]
    lines = [" ".join(h.ljust(w) for h, w in zip(head, widths)).rstrip()]
    for row in out:
        lines.append(" ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
    lines.append("times in cost units (f=1: one microbatch's forward on one stage); bubble = "
                 "idle share of p x makespan;")
    lines.append("peaks in M (one microbatch's activation); f. = closed formula; slots = ideal "
                 "table length at unit op times.")
    lines.append("agree: simulation, formula and ideal table give the same makespan, bubble "
                 "and peak" + ("; where not:" if notes else "."))
    for text, n in notes.items():
        lines.append(f"  [{n}] {text}")
    return "\n".join(lines)

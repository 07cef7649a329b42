"""Three views of every family side by side: formula, ideal table, simulation."""

from __future__ import annotations

import math
import textwrap
from dataclasses import replace

import numpy as np

from ..core.costs import Costs, Network
from ..core.ops import InputError
from ..core.schedule import check_int
from ..core.simulate import simulate
from ..schedules.registry import build, family, schedules
from .formulas import formula
from .setting import (  # noqa: F401  (re-exported: compare's names before the split)
    _cause,
    describe_costs,
    describe_jitter,
    describe_network,
    describe_setting,
    describe_stragglers,
    setting_differences,
    setting_text,
)
from .table import ideal_table

__all__ = ["compare", "describe_costs", "describe_jitter", "describe_network", "describe_setting",
           "describe_stragglers", "format_compare", "headline", "headline_lines", "peak_memory",
           "setting_differences", "setting_text", "sort_rows", "three_views"]

_TOL = 1e-9
#: Columns of a terminal: every line the command line prints fits in it.
WIDTH = 120


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
        ``peak_memory_max`` (activation plus weights on the fullest
        device, in M), ``flags`` (list of disagreements, each naming its
        column and the cause), ``error`` (why the family could not be
        built, else None), and ``result`` (the simulation). In the order
        of ``names``; ``pipecore.analysis.compare.sort_rows`` orders them by makespan.

    Raises
    ------
    ValueError
        For bad devices, microbatches, chunks or costs, or an unknown name.
    """
    costs = Costs() if costs is None else costs
    # Shape errors are the caller's; a family that cannot take a valid shape
    # is reported in its row instead.
    devices = check_int("devices", devices, minimum=1)
    microbatches = check_int("microbatches", microbatches, minimum=1)
    chunks = check_int("chunks", chunks, minimum=1)
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

    Each flag names the column it qualifies and the cause of the gap:
    jitter, a straggler or communication when removing it from the
    simulation moves the figure, and an approximate formula when the
    simulation without them still differs.

    Parameters
    ----------
    sched : Schedule
        The schedule.
    res : Result
        Its simulation with ``costs`` and ``network`` (and the stragglers
        and jitter it records, if any).
    costs : Costs
    network : Network or None
    chunks : int, optional
        The family's chunks (the unit of the ideal table's slots); by
        default the family's for the schedule's own.

    Returns
    -------
    dict
        ``result``, ``makespan``, ``formula_makespan``, ``table_slots``,
        ``formula_slots``, bubble and peak figures, ``peak_memory_max``
        (activation plus weights on the fullest device), ``flags``.

    Raises
    ------
    ValueError
        If the family has no closed form for this schedule.
    """
    v = chunks if chunks is not None else family(sched.name).chunks_for(int(sched.chunks))
    fm = formula(sched, costs)
    table = ideal_table(sched)
    # One slot per op: a stage's op takes 1 when a device share takes S/p (v where every
    # device holds v stages; HelixPipe's 2vp + 1 stages do not divide into devices).
    per_share = sched.stages / sched.devices if sched.stages % sched.devices else float(v)
    unit = formula(sched, Costs(f=per_share, b=per_share, w=per_share))
    peak = np.asarray(res.peak_activation, dtype=np.float64)
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
        peak_memory_max=peak_memory(res),
    )
    # Each flag names its column. The bubble flag names the ratio (the
    # tables' column) and, where only the zero-bubble papers' rate differs,
    # the rate.
    gaps = []
    if not _close(res.makespan, fm["makespan"]):
        gaps.append(("makespan", _MAKESPAN))
    if not _close(res.bubble_ratio, fm["bubble_ratio"]):
        gaps.append(("bubble ratio", _RATIO))
    elif not _close(res.bubble_rate, fm["bubble_rate"]):
        gaps.append(("bubble rate (zero-bubble papers)", _RATE))
    if not _close(table.length, unit["makespan"]):
        gaps.append(("ideal table slots", None))
    # NaN: the family has no closed form for its peak.
    if (not np.isnan(fm["peak_activation"]).any()
            and not np.allclose(peak, fm["peak_activation"], rtol=_TOL, atol=_TOL)):
        gaps.append(("peak activation", _PEAK))
    steps = (_without_departures(sched, res, costs, network)
             if any(m is not None for _c, m in gaps) else [])
    for column, measure in gaps:
        if measure is None:  # the ideal table and the formula, both at unit op times
            row["flags"].append("ideal table slots: table differs from formula"
                                + ("" if unit["exact"] else "; cause: "
                                   + unit.get("gap_cause", "formula approximate at unit op "
                                              "times")))
            continue
        causes = _causes(res, steps, fm, measure)
        note = (f"; cause{'s' if len(causes) > 1 else ''}: {', '.join(causes)}" if causes
                else "")
        row["flags"].append(f"{column}: simulation differs from formula{note}")
    return row


# The measures a flag can name: how to read each from a Result, and the
# formula's key.
_MAKESPAN = (lambda r: r.makespan, "makespan")
_RATIO = (lambda r: r.bubble_ratio, "bubble_ratio")
_RATE = (lambda r: r.bubble_rate, "bubble_rate")
_PEAK = (lambda r: np.asarray(r.peak_activation, dtype=np.float64), "peak_activation")


def _differ(a, b) -> bool:
    if np.ndim(a) or np.ndim(b):
        return not np.allclose(a, b, rtol=_TOL, atol=_TOL)
    return not _close(float(a), float(b))


def _has_comm(costs: Costs, network: Network | None) -> bool:
    return network is not None or bool(np.any(np.asarray(costs.comm) > 0))


def _without_departures(sched, res, costs: Costs, network: Network | None) -> list:
    """The simulation with jitter, stragglers and communication taken away
    one after the other: ``[(cause, result), ...]`` in that order."""
    steps = []
    jitter = getattr(res, "jitter", None)
    stragglers = getattr(res, "stragglers", None)
    if jitter is not None:
        steps.append((_cause("jitter", jitter=jitter, draw=getattr(res, "draw", 0)),
                      simulate(sched, costs, network, stragglers=stragglers)))
    if stragglers is not None:
        steps.append((_cause("stragglers", stragglers=stragglers),
                      simulate(sched, costs, network)))
    if _has_comm(costs, network):
        steps.append(("communication", simulate(sched, replace(costs, comm=0.0), None)))
    return steps


def _causes(res, steps, fm, measure) -> list[str]:
    """What moves a measure away from the formula: each departure whose
    removal changes it, then, when the bare simulation still differs and
    the formula is not exact for these costs, what the formula leaves out:
    its ``gap_cause`` (what the schedule shows, e.g. idle gaps between
    units), else that it is approximate."""
    read, key = measure
    causes = []
    before = read(res)
    for cause, alt in steps:
        after = read(alt)
        if _differ(before, after):
            causes.append(cause)
        before = after
    if _differ(before, fm[key]) and not fm["exact"]:
        causes.append(fm.get("gap_cause", "formula approximate for these costs"))
    return causes


def peak_memory(res) -> float:
    """Activation plus weights on the fullest device, in M: the peak of the
    memory chart of :func:`pipecore.report`.

    Parameters
    ----------
    res : Result

    Returns
    -------
    float
    """
    held = (np.asarray(res.peak_activation, dtype=np.float64)
            + np.asarray(res.static_memory, dtype=np.float64))
    return float(held.max()) if held.size else 0.0


def sort_rows(rows: list[dict]) -> list[dict]:
    """Rows by makespan, ties by name; rows that could not be built last.

    Parameters
    ----------
    rows : list of dict
        Rows of :func:`compare` (or of :func:`pipecore.report`).

    Returns
    -------
    list of dict
        A new list; the rows themselves are not copied.
    """
    def key(r):
        if r.get("error") or r.get("result") is None and r.get("makespan") is None:
            return (1, 0.0, r["name"])
        return (0, float(r["makespan"]), r["name"])

    return sorted(rows, key=key)


def _check_limit(memory_limit):
    if memory_limit is None:
        return None
    try:
        x = float(memory_limit)
    except (TypeError, ValueError):
        raise InputError(f"memory limit must be a number in M (got {memory_limit!r})") from None
    if not math.isfinite(x) or x <= 0:
        raise InputError(f"memory limit must be a finite number > 0 in M (got {memory_limit!r})")
    return x


def headline(rows: list[dict], memory_limit: float | None = None, tuned=None) -> dict:
    """What to read first: the fastest schedules, those with the lowest peak
    memory and, with a limit, the fastest that fit.

    Ties (equal within a relative 1e-9) are all named, in name order.

    Parameters
    ----------
    rows : list of dict
        Rows of :func:`compare`.
    memory_limit : float, optional
        Per-device limit in M on activation plus weights (the rows'
        ``peak_memory_max``).
    tuned : Tuned or TuneError, optional
        :func:`pipecore.tune` at the same shape, costs and limit: its wider
        search (chunk counts, options, generated, recomputed and offloaded
        schedules) names the fastest schedule that fits.

    Returns
    -------
    dict
        ``fastest`` (names), ``makespan``, ``next_fastest`` (names) and
        ``next_makespan`` (the next distinct makespan), ``baseline`` and
        ``baseline_makespan`` (1F1B's, when it is a row and not among the
        fastest), ``lowest_peak_memory`` (names), ``peak_memory``,
        ``built`` (how many rows were built); with a limit also
        ``memory_limit``, ``fits`` (names of every row within it),
        ``fastest_within_limit`` (names) and ``makespan_within_limit``
        (None when nothing fits); with ``tuned`` also ``tune``:
        ``{"winner", "makespan", "memory"}``, or ``{"smallest_limit"}``
        when nothing fits. Empty names and None figures when no row was
        built.

    Raises
    ------
    ValueError
        If ``memory_limit`` is not a finite number > 0.
    """
    limit = _check_limit(memory_limit)
    built = [r for r in rows if not r.get("error") and r.get("makespan") is not None]

    def best(items, key):
        if not items:
            return [], None
        low = min(key(r) for r in items)
        return sorted(r["name"] for r in items if _close(key(r), low)), low

    def time(r):
        return float(r["makespan"])

    fastest, makespan = best(built, time)
    lowest, memory = best(built, lambda r: float(r["peak_memory_max"]))
    slower = [r for r in built if r["name"] not in fastest]
    following, next_makespan = best(slower, time)
    out = {"fastest": fastest, "makespan": makespan, "next_fastest": following,
           "next_makespan": next_makespan, "lowest_peak_memory": lowest,
           "peak_memory": memory, "built": len(built)}
    # 1F1B is the schedule every reader knows: the winner's gain is also said against it.
    base = [r for r in slower if r["name"] == "1f1b"]
    out["baseline"], out["baseline_makespan"] = ("1f1b", time(base[0])) if base else (None, None)
    if limit is not None:
        fit = [r for r in built if r["peak_memory_max"] <= limit * (1 + _TOL)]
        names, ms = best(fit, time)
        out.update(memory_limit=limit, fits=sorted(r["name"] for r in fit),
                   fastest_within_limit=names, makespan_within_limit=ms)
    if tuned is not None:
        res = getattr(tuned, "result", None)
        out["tune"] = ({"smallest_limit": float(tuned.smallest_limit)} if res is None else
                       {"winner": tuned.label, "makespan": float(res.makespan),
                        "memory": float((res.peak_activation + res.static_memory).max())})
    return out


def headline_lines(head: dict) -> list[str]:
    """:func:`headline` in words, one finding a line.

    Parameters
    ----------
    head : dict
        From :func:`headline`.

    Returns
    -------
    list of str
    """
    if not head["built"]:
        return ["no schedule could be built for this shape (see the notes)"]
    best = head["makespan"]
    gains = []
    following, later = head.get("next_fastest"), head.get("next_makespan")
    if following:
        gains.append(f"{(1 - best / later) * 100:.1f}% less time than the next, "
                     f"{', '.join(following)} ({later:.6g})")
    base, base_time = head.get("baseline"), head.get("baseline_makespan")
    if base and base not in (following or []):
        gains.append(f"{(1 - best / base_time) * 100:.1f}% less than {base} ({base_time:.6g})")
    tie = " (tied)" if len(head["fastest"]) > 1 else ""
    first = (f"fastest: {', '.join(head['fastest'])}{tie}, one step in {best:.6g} cost units"
             + (": " + "; ".join(gains) if gains else ""))
    lines = [first,
             f"lowest peak memory: {', '.join(head['lowest_peak_memory'])} "
             f"({head['peak_memory']:.4g} M, activation + weights on the fullest device)"]
    if "memory_limit" in head:
        lim = head["memory_limit"]
        n, total = len(head["fits"]), head["built"]
        if head["fastest_within_limit"]:
            lines.append(f"fastest within the memory limit of {lim:g} M per device: "
                         f"{', '.join(head['fastest_within_limit'])} (makespan "
                         f"{head['makespan_within_limit']:.6g} cost units; {n} of {total} "
                         "schedules fit)")
        else:
            lines.append(f"no schedule fits the memory limit of {lim:g} M per device (the "
                         f"lowest peak is {head['peak_memory']:.4g} M)")
    tuned = head.get("tune")
    if tuned and "winner" in tuned:
        mine = head.get("makespan_within_limit")
        same = mine is not None and _close(tuned["makespan"], mine)
        verdict = ("no faster schedule: " if same else
                   "" if mine is None else f"{(1 - tuned['makespan'] / mine) * 100:.1f}% less "
                   "time: ")
        lines.append(f"pipecore tune, searching further (chunk counts, generated and recomputed "
                     f"schedules), finds {verdict}{tuned['winner']} (makespan "
                     f"{tuned['makespan']:.6g} cost units, memory {tuned['memory']:.4g} M)")
    elif tuned:
        lines.append(f"pipecore tune, searching further, finds nothing that fits either; the "
                     f"least memory it reaches is {tuned['smallest_limit']:.4g} M")
    return lines


def _wrap(text: str, width: int = WIDTH) -> list[str]:
    """One logical line as terminal lines of at most ``width`` columns, the
    continuations indented by two."""
    return textwrap.wrap(text, width, subsequent_indent="  ", break_on_hyphens=False) or [""]


# --- the text table -----------------------------------------------------------

def _pair(sim, fm, fmt=lambda x: f"{x:.4g}") -> str:
    """The simulation's figure, and the formula's in parentheses where it differs."""
    if fm is None or math.isnan(float(fm)):
        return f"{fmt(sim)} (none)"
    if _close(float(sim), float(fm)):
        return fmt(sim)
    return f"{fmt(sim)} ({fmt(fm)})"


def _weights_note(rows: list[dict]) -> str:
    """Where the weights on a device differ between schedules, say which hold
    how much and why (replicated stages hold their weights twice; an
    asynchronous schedule keeps stashed weight versions)."""
    held: dict[tuple, list[str]] = {}
    for r in rows:
        res = r.get("result")
        if res is not None and not r.get("error"):
            top = float(np.max(res.static_memory)) if res.devices else 0.0
            sched = res.schedule
            why = [w for w, on in (("replicated stages", sched.replicated),
                                   ("weight versions", int(np.max(sched.weight_versions)) > 1)) if on]
            held.setdefault((top, " and ".join(why)), []).append(r["name"])
    if len({top for top, _ in held}) < 2:
        return ""
    most = max(held, key=lambda k: len(held[k]))
    others = "; ".join(f"{top:.4g} M on {', '.join(sorted(held[(top, why)]))}"
                       + (f" ({why})" if why else "")
                       for top, why in sorted(held) if (top, why) != most)
    return (f"; a device holds the weights of each stage placed on it: {most[0]:.4g} M on most "
            f"rows; {others}")


def _counted_otherwise(rows: list[dict]) -> str:
    """Rows whose m or makespan means something else than a flushed step of m
    microbatches at these costs: say so, so a row is not read as a plain loss."""
    chunked, streamed = {}, []
    for r in rows:
        res = r.get("result")
        if res is None or r.get("error"):
            continue
        params = res.schedule.params
        if int(params.get("seq_chunks", 1)) > 1:
            chunked.setdefault(int(params["seq_chunks"]), []).append(r["name"])
        if params.get("weight_sync"):
            streamed.append(r["name"])
    parts = [f"{', '.join(sorted(names))}: m counts sequence chunks ({k} per sequence), each at these "
             f"costs; a chunk of a sequence costs about 1/{k} of it (later chunks more under causal "
             f"attention: seq1f1b.with_chunk_costs)" for k, names in sorted(chunked.items())]
    if streamed:
        parts.append(f"{', '.join(sorted(streamed))}: one stream of m microbatches without a flush; their "
                     f"gain is in steady state over many steps (pipecore.steady_state), not in one step")
    return "; ".join(parts)


def format_compare(rows: list[dict], memory_limit: float | None = None,
                   setting: str | None = None, tuned=None) -> str:
    """Render :func:`compare` rows as a headline, a text table that fits 120
    columns, a legend of its columns and notes.

    Rows are sorted by makespan (ties by name). A cell holds the
    simulation's figure, and in parentheses the closed formula's where the
    two differ. ``agree`` is yes when the simulation, the closed formula
    and the ideal table give the same makespan, bubble and peak; otherwise
    "no" with note numbers, and each note names the column it qualifies
    and the cause of the gap.

    Parameters
    ----------
    rows : list of dict
    memory_limit : float, optional
        Per-device limit in M on activation plus weights: the headline
        names the fastest schedule within it and the table marks peaks
        above it.
    setting : str, optional
        What the rows were computed on (shape, costs), printed right after
        the headline, wrapped to 120 columns.
    tuned : Tuned or TuneError, optional
        :func:`pipecore.tune` with the same limit, named in the headline
        (see :func:`headline`).

    Returns
    -------
    str
        Lines of at most 120 columns.

    Raises
    ------
    ValueError
        If ``memory_limit`` is not a finite number > 0.
    """
    limit = _check_limit(memory_limit)
    rows = sort_rows(rows)
    notes: dict[str, int] = {}
    groups = [  # (title, units or qualifier): the two header lines of each column
        ("", "schedule"), ("", "v"), ("makespan", "(cost units)"), ("bubble ratio", "(idle share)"),
        ("peak activation (M)", "fullest"), ("", "emptiest"),
        ("peak memory (M)", "act. + weights"), ("ideal table", "(slots)"), ("", "agree")]
    out = []
    over = False
    for r in rows:
        if r.get("error") or r.get("result") is None and r.get("makespan") is None:
            n = notes.setdefault("not built: " + str(r.get("error")), len(notes) + 1)
            out.append([r["name"], str(r["chunks"])] + ["-"] * 6 + [f"n/a [{n}]"])
            continue
        marks = [notes.setdefault(f, len(notes) + 1) for f in r["flags"]]
        mem = f"{r['peak_memory_max']:.4g}"
        if limit is not None and r["peak_memory_max"] > limit * (1 + _TOL):
            mem += " over limit"
            over = True
        slots = r["table_slots"]
        out.append([
            r["name"], str(r["chunks"]),
            _pair(r["makespan"], r["formula_makespan"], lambda x: f"{x:.6g}"),
            _pair(r["bubble_ratio"], r["formula_bubble_ratio"], lambda x: f"{x:.4f}"),
            _pair(r["peak_max"], r["formula_peak_max"]),
            _pair(r["peak_min"], r["formula_peak_min"]),
            mem,
            _pair(slots, r["formula_slots"], lambda x: f"{x:.6g}")
            if isinstance(slots, (int, np.integer)) else str(slots),
            "yes" if not marks else "no " + ",".join(f"[{m}]" for m in marks),
        ])
    widths = [max(len(h), *(len(row[i]) for row in out)) if out else len(h)
              for i, (_t, h) in enumerate(groups)]
    # A title may run on over the next column when that one has none.
    for i, (t, _h) in enumerate(groups):
        room = widths[i] + (widths[i + 1] + 2 if i + 1 < len(groups) and not groups[i + 1][0]
                            else 0)
        if len(t) > room:
            widths[i] += len(t) - room
    sep = "  "

    def line(cells):
        return sep.join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()

    title = ""
    for i, (t, _h) in enumerate(groups):
        at = sum(widths[:i]) + len(sep) * i
        title = title.ljust(at) + t if t else title
    lines = [part for line in headline_lines(headline(rows, limit, tuned)) for part in _wrap(line)]
    if setting:
        lines += _wrap(setting)
    lines += ["", title.rstrip(), line([h for _t, h in groups])]
    lines += [line(row) for row in out]
    v_rows = sorted({int(r["chunks"]) for r in rows if int(r["chunks"]) > 1})
    legend = [
        ("v", "chunks per device (the model is cut into v x p stages)"),
        ("makespan", "one training step in cost units (f=1: one microbatch's forward through "
                     "one device's share of the model)"),
        ("bubble ratio", "idle share of p x makespan"),
        ("peak activation", "its peak on the fullest and on the emptiest device, in M"),
        ("peak memory", "activation + weights on the fullest device, in M: the peak of "
                        "report.html's memory chart" + _weights_note(rows)
                        + ("; over limit: above the memory limit" if over else "")),
        ("ideal table", "length of the devices x time-slots table, every op one slot"
         + (f"; where v={'/'.join(map(str, v_rows))} a slot is one chunk's op (1/v of a device "
            "share's), so those slots are not cost units: at f=b=w=1 a slot is 1/v cost unit "
            "there and 1 where v=1" if v_rows else " (at f=b=w=1 a slot is 1 cost unit)")),
        ("agree", "yes when the simulation, the formula and the ideal table give the same "
                  "makespan, bubble and peak"
                  + ("; where not, the note names the column and the cause" if notes else "")),
    ]
    counted = _counted_otherwise(rows)
    if counted:
        legend.append(("m counts", counted))
    lines.append("A cell holds the simulation's figure and, in parentheses, the closed "
                 "formula's where they differ ((none): no formula).")
    for name, text in legend:
        lines += textwrap.wrap(text, 118, initial_indent=f"  {name:<17}",
                               subsequent_indent=" " * 19)
    for text, n in notes.items():
        lines.append(f"  [{n}] {text}")
    return "\n".join(lines)

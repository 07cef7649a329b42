"""The tabular-abstraction paper's five claims, checked against the study's own data.

Each claim gets a verdict, "holds", "does not hold" or "holds only in some
cells", computed from :func:`pipecore.study`'s table (and, for the fifth,
from :func:`pipecore.search.asymmetric.asymmetric_study`'s), with the cells
behind it. A cell is (p devices, m microbatches, compute speed, network
speed), written ``p=4 m=16 (c1/n0.1)``: compute at x1 and network at x0.1 of
the hardware's speed (x10 = ten times faster, see :mod:`pipecore.analysis.study`).
The thresholds are stated in each claim's ``rule``.
"""

from __future__ import annotations

import textwrap

import pyarrow as pa

from ..core.ops import InputError

__all__ = ["findings", "format_findings", "CLAIMS"]

CLAIMS = (
    "rankings differ between the formula, table and simulation views",
    "GPipe and 1F1B have equal runtime, 1F1B the lower activation peak",
    "Chimera is ahead mainly at low microbatch counts and where communication is cheap",
    "Hanayo is effective at its intended operating point but sensitive to network bottlenecks",
    "asymmetric Chimera-style placement does not lower the global peak memory and gains a "
    "little runtime only in shallow pipelines",
)

#: GPipe and 1F1B count as equal when their simulated times differ by at most this share.
EQUAL_RUNTIME = 0.01
#: An asymmetric gain above this share counts as a gain; "a little" is at most LITTLE.
GAIN_FLOOR = 0.005
LITTLE = 0.10
PAPER_FAMILIES = ("gpipe", "1f1b", "chimera", "hanayo")
_TIE = 1e-9


def _verdict(good, total):
    if total == 0:
        return "not evaluated"
    if good == total:
        return "holds"
    return "does not hold" if good == 0 else "holds only in some cells"


def _cells_text(cells, grid):
    """Compact cell list: per (S, m), 'all' or the (compute speed, network speed) pairs."""
    if not cells:
        return "none"
    by = {}
    for p, m, cf, nf in sorted(cells):
        by.setdefault((p, m), []).append((cf, nf))
    parts = []
    for (p, m), cn in sorted(by.items()):
        if len(cn) == len(grid.get((p, m), ())):
            parts.append(f"p={p} m={m} (all)")
        else:
            parts.append(f"p={p} m={m} (" + ", ".join(f"c{cf:g}/n{nf:g}" for cf, nf in cn) + ")")
    return "; ".join(parts)


def _groups(table):
    rows = [r for r in table.to_pylist() if r["error"] is None]
    groups = {}
    for r in rows:
        groups.setdefault((r["devices"], r["microbatches"], r["compute_speed"],
                           r["network_speed"]), {})[r["family"]] = r
    grid = {}
    for p, m, cf, nf in groups:
        grid.setdefault((p, m), []).append((cf, nf))
    return groups, grid


def _order(a, b):
    if abs(a - b) <= _TIE * max(abs(a), abs(b)):
        return 0
    return -1 if a < b else 1


def _claim_rankings(groups, grid):
    flips, total = [], 0
    examples = {}
    for cell, fams in groups.items():
        present = [f for f in PAPER_FAMILIES if f in fams]
        if len(present) < 2:
            continue
        total += 1
        for i, a in enumerate(present):
            for b in present[i + 1:]:
                seen = {}
                for view in ("formula_time", "table_time", "sim_time"):
                    seen[view] = _order(fams[a][view], fams[b][view])
                signs = {s for s in seen.values() if s != 0}
                if len(signs) == 2:
                    flips.append(cell)
                    examples.setdefault(cell, (a, b, seen))
                    break
            if flips and flips[-1] == cell:
                break
    detail = ""
    if examples:
        cell, (a, b, seen) = sorted(examples.items())[0]
        detail = (f"e.g. p={cell[0]} m={cell[1]} c{cell[2]:g}/n{cell[3]:g}: {a} vs {b} is "
                  + ", ".join(f"{v.split('_')[0]} {'<' if s < 0 else '>' if s > 0 else '='}"
                              for v, s in seen.items()))
    return {"verdict": _verdict(len(flips), total), "cells": _cells_text(flips, grid),
            "rule": "a pair of GPipe, 1F1B, Chimera, Hanayo is strictly ordered one way in one "
                    "view and the other way in another",
            "detail": f"flips in {len(flips)} of {total} cells; {detail}"}


def _claim_gpipe_1f1b(groups, grid):
    good, fail_time, fail_mem, total = [], [], [], 0
    worst = (0.0, None)
    for cell, fams in groups.items():
        if "gpipe" not in fams or "1f1b" not in fams:
            continue
        total += 1
        g, o = fams["gpipe"], fams["1f1b"]
        diff = (g["sim_time"] - o["sim_time"]) / o["sim_time"]
        if abs(diff) > abs(worst[0]):
            worst = (diff, cell)
        same = abs(g["sim_time"] - o["sim_time"]) <= EQUAL_RUNTIME * o["sim_time"]
        lower = o["peak_activation"] < g["peak_activation"] * (1 - _TIE)
        if same and lower:
            good.append(cell)
        if not same:
            fail_time.append(cell)
        if not lower:
            fail_mem.append(cell)
    why = []
    if fail_mem:
        why.append(f"1F1B's peak is not lower in {_cells_text(fail_mem, grid)}: with m <= S its "
                   f"warm-up already holds every microbatch, as GPipe does")
    if fail_time:
        d, c = worst
        why.append(f"runtimes differ by more than {EQUAL_RUNTIME:.0%} in "
                   f"{_cells_text(fail_time, grid)} (most at p={c[0]} m={c[1]} "
                   f"c{c[2]:g}/n{c[3]:g}: GPipe {100 * d:+.1f}% vs 1F1B); there transfers cost "
                   f"time that the two orders overlap differently with compute, which the "
                   f"paper's simulator may not model (it has no link contention)")
    return {"verdict": _verdict(len(good), total), "cells": _cells_text(good, grid),
            "rule": f"simulated times within {EQUAL_RUNTIME:.0%} and 1F1B's activation peak "
                    f"strictly lower (cells listed: where it holds)",
            "detail": "; ".join(why) if why else f"holds in all {total} cells"}


def _claim_chimera(groups, grid):
    ahead, total = [], 0
    for cell, fams in groups.items():
        if not {"chimera", "gpipe", "1f1b"} <= set(fams):
            continue
        total += 1
        best = min(fams["gpipe"]["sim_time"], fams["1f1b"]["sim_time"])
        if fams["chimera"]["sim_time"] < best * (1 - _TIE):
            ahead.append(cell)
    if total == 0:
        return {"verdict": "not evaluated", "cells": "none", "rule": "", "detail": ""}
    cells = [c for c in groups if {"chimera", "gpipe", "1f1b"} <= set(groups[c])]
    verdicts, notes = [], []
    for p in sorted({c[0] for c in cells}):
        mine = [c for c in cells if c[0] == p]
        ms = sorted({c[1] for c in mine})
        nets = sorted({c[3] for c in mine})

        def share(index, value, mine=mine):
            sel = [c for c in mine if index is None or c[index] == value]
            return sum(c in ahead for c in sel) / len(sel) if sel else 0.0

        low_m, high_m = share(1, ms[0]), share(1, ms[-1])
        fast, slow = share(3, nets[-1]), share(3, nets[0])
        ok = low_m > high_m and fast > slow
        verdicts.append(ok)
        notes.append(f"p={p}: ahead in {share(None, None):.0%} of cells, {low_m:.0%} at m={ms[0]} "
                     f"vs {high_m:.0%} at m={ms[-1]}, {fast:.0%} on the fastest network vs "
                     f"{slow:.0%} on the slowest{'' if ok else ' (trend not met)'}")
    return {"verdict": _verdict(sum(verdicts), len(verdicts)),
            "cells": "Chimera faster than GPipe and 1F1B in " + _cells_text(ahead, grid),
            "rule": "per S, the share of cells where Chimera beats GPipe and 1F1B is higher at the "
                    "lowest m than at the highest, and on the fastest network than on the slowest",
            "detail": "; ".join(notes)}


def _claim_hanayo(groups, grid):
    points = [c for c in groups if c[0] == c[1] and {"hanayo", "chimera"} <= set(groups[c])]
    if not points:
        return {"verdict": "not evaluated", "cells": "none",
                "rule": "needs cells with m = S (Hanayo's operating point)",
                "detail": "the study has no cell with microbatches = devices"}
    adv = {c: (groups[c]["chimera"]["sim_time"] - groups[c]["hanayo"]["sim_time"])
           / groups[c]["chimera"]["sim_time"] for c in points}
    good, notes, total = [], [], 0
    for p in sorted({c[0] for c in points}):
        for cf in sorted({c[2] for c in points if c[0] == p}):
            row = {c[3]: adv[c] for c in points if c[0] == p and c[2] == cf}
            nets = sorted(row)
            if len(nets) < 2:
                continue
            total += 1
            fast = [n for n in nets if n >= 1.0] or nets[-1:]
            effective = all(row[n] > 0 for n in fast)
            sensitive = row[nets[0]] < row[nets[-1]]
            if effective and sensitive:
                good += [c for c in points if c[0] == p and c[2] == cf]
            notes.append(f"p=m={p} compute speed x{cf:g}: Hanayo vs Chimera "
                         + ", ".join(f"{100 * row[n]:+.1f}% at network speed x{n:g}"
                                     for n in nets)
                         + ("" if effective else " (not ahead on the mid/fast networks)")
                         + ("" if sensitive else " (no loss of advantage on the slow network)"))
    good_rows = len({(c[0], c[2]) for c in good})
    eff = sum(1 for n in notes if "not ahead" not in n)
    sens = sum(1 for n in notes if "no loss" not in n)
    notes.insert(0, f"effective (ahead of Chimera at network speed x1 and faster) in {eff} of "
                    f"{total} (S, compute speed) rows, sensitive (advantage smaller on the "
                    f"slowest network) in {sens} of {total}")
    return {"verdict": _verdict(good_rows, total), "cells": _cells_text(good, grid),
            "rule": "at m = S, Hanayo faster than Chimera at every network speed of x1 or "
                    "faster, and its advantage smaller on the slowest network than on the fastest "
                    "(per S and compute speed; cells listed: where it holds)",
            "detail": "; ".join(notes)}


def _claim_asymmetric(asym):
    if asym is None:
        return {"verdict": "not evaluated", "cells": "none",
                "rule": "needs `pipecore study --asymmetric`", "detail": ""}
    rows = [r for r in asym.to_pylist() if r["error"] is None]
    if not rows:
        return {"verdict": "not evaluated", "cells": "none",
                "rule": "needs a shape Chimera can build", "detail": ""}
    grid = {}
    for r in rows:
        grid.setdefault((r["devices"], r["microbatches"]), []).append(
            (r["compute_speed"], r["network_speed"]))
    shallow = min(r["devices"] for r in rows)
    good, lowered, deep_gain, big = [], [], [], []
    for r in rows:
        cell = (r["devices"], r["microbatches"], r["compute_speed"], r["network_speed"])
        mem_ok = r["best_peak"] >= r["chimera_peak"] * (1 - _TIE)
        # The asymmetry's own gain: against the faster symmetric order, so that
        # what a different op order gains is not counted as asymmetry's.
        g = r["gain_vs_symmetric"]
        if r["devices"] == shallow:
            time_ok = GAIN_FLOOR < g <= LITTLE
            if g > LITTLE:
                big.append(cell)
        else:
            time_ok = g <= GAIN_FLOOR
            if not time_ok:
                deep_gain.append(cell)
        if not mem_ok:
            lowered.append(cell)
        if mem_ok and time_ok:
            good.append(cell)
    any_lower = [(r["devices"], r["microbatches"], r["compute_speed"], r["network_speed"])
                 for r in rows
                 if r["min_peak"] < r["chimera_peak"] * (1 - _TIE)]
    why = []
    if deep_gain:
        deep = [r for r in rows if r["devices"] != shallow]
        top = max(r["gain"] for r in deep)
        top_sym = max(r["gain_vs_symmetric"] for r in deep)
        why.append(f"deep pipelines gain too (S>{shallow}: up to {100 * top_sym:.1f}% vs the "
                   f"faster symmetric order, {100 * top:.1f}% vs Chimera's own order) in "
                   f"{_cells_text(deep_gain, grid)}")
    if big:
        why.append(f"the shallow gain is not little (> {LITTLE:.0%}) in {_cells_text(big, grid)}")
    none = [(r["devices"], r["microbatches"], r["compute_speed"], r["network_speed"])
            for r in rows
            if r["devices"] == shallow and r["gain_vs_symmetric"] <= GAIN_FLOOR]
    if none:
        why.append(f"no asymmetric gain (<= {GAIN_FLOOR:.1%}) at p={shallow} in "
                   f"{_cells_text(none, grid)}")
    if all("chimera_time" in r and "list_time" in r for r in rows):
        order = max((r["chimera_time"] - r["list_time"]) / r["chimera_time"] for r in rows)
        why.append(f"against Chimera's own order the best variant is "
                   f"{100 * min(r['gain'] for r in rows):.1f}% to "
                   f"{100 * max(r['gain'] for r in rows):.1f}% faster, but the symmetric "
                   f"placement in the list order alone is already up to {100 * order:.1f}% faster")
    if lowered:
        why.append(f"the fastest variant lowers the global peak in {_cells_text(lowered, grid)}")
    else:
        why.append("the fastest variant never lowers the global peak")
    why.append("no variant evaluated lowers it" if not any_lower else
               f"some variant lowers it in {_cells_text(any_lower, grid)}")
    return {"verdict": _verdict(len(good), len(rows)), "cells": _cells_text(good, grid),
            "rule": f"the fastest asymmetric variant's global peak (activation + weights, worst "
                    f"device) is not below symmetric Chimera's, and its gain over the faster "
                    f"symmetric order (Chimera's or the list order) is in "
                    f"({GAIN_FLOOR:.1%}, {LITTLE:.0%}] at p={shallow} and <= {GAIN_FLOOR:.1%} "
                    f"deeper (cells listed: where it holds)",
            "detail": "; ".join(why)}


def findings(study_table: pa.Table, asymmetric_table: pa.Table | None = None) -> list[dict]:
    """Check the paper's five claims against a study's own numbers.

    Parameters
    ----------
    study_table : pyarrow.Table
        From :func:`pipecore.study` (needs gpipe, 1f1b, chimera, hanayo rows
        for all claims to be evaluated).
    asymmetric_table : pyarrow.Table, optional
        From :func:`pipecore.search.asymmetric.asymmetric_study`; without
        it the fifth claim is "not evaluated".

    Returns
    -------
    list of dict
        One per claim, in :data:`CLAIMS` order: ``claim``, ``verdict``
        ("holds", "does not hold", "holds only in some cells" or "not
        evaluated"), ``cells`` (where it holds, or as the rule says),
        ``rule`` (the test applied) and ``detail`` (the numbers, and why
        where it does not hold).

    Raises
    ------
    ValueError
        If ``study_table`` lacks the study's columns.
    """
    need = {"family", "devices", "microbatches", "compute_speed", "network_speed", "formula_time",
            "table_time", "sim_time", "peak_activation", "error"}
    missing = need - set(study_table.column_names)
    if missing:
        raise InputError(f"'study_table' lacks column(s) {sorted(missing)}: pass pipecore.study's table")
    groups, grid = _groups(study_table)
    out = [_claim_rankings(groups, grid), _claim_gpipe_1f1b(groups, grid),
           _claim_chimera(groups, grid), _claim_hanayo(groups, grid),
           _claim_asymmetric(asymmetric_table)]
    for claim, f in zip(CLAIMS, out):
        f["claim"] = claim
    return out


def format_findings(items: list[dict]) -> str:
    """The findings as text, one block per claim.

    Parameters
    ----------
    items : list of dict
        From :func:`findings`.

    Returns
    -------
    str
        Lines of at most 120 columns.
    """
    def para(text, indent="   ", first=None):
        return textwrap.wrap(text, 120, initial_indent=indent if first is None else first,
                             subsequent_indent=indent + "  ", break_on_hyphens=False)

    lines = ["findings: the paper's claims under pipecore's model"]
    lines += para("cells: p=4 m=16 (c1/n0.1) is p devices, m microbatches, compute speed x1, "
                  "network speed x0.1 (x10 = ten times the hardware's speed); 'all': every cell "
                  "of the grid", indent="", first="")
    for i, f in enumerate(items, 1):
        lines += para(f"{i}. {f['claim']}: {f['verdict'].upper()}", first="")
        lines += para(f"test: {f['rule']}")
        lines += para(f"cells: {f['cells']}")
        if f["detail"]:
            lines += para(f["detail"])
    return "\n".join(lines)

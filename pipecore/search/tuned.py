"""What :func:`pipecore.tune` and :func:`pipecore.explore` return: the winner,
every candidate, and the ranking and report that explain the choice."""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..core.costs import Costs, Network
from ..core.schedule import Schedule
from ..core.simulate import Result

__all__ = ["Tuned"]


@dataclass
class Tuned:
    """What :func:`tune` returns.

    Attributes
    ----------
    schedule : Schedule
        The winner (validated).
    result : Result
        Its simulation with the tuned costs and network.
    label : str
        Which candidate it is (family and parameters).
    candidates : pyarrow.Table
        Every candidate: metrics, ``fits``, and a note for those skipped.
    memory_limit : float
    costs : Costs
    network : Network or None
    seconds : float
        Time tune took.
    objective : str
        What was minimised ("makespan" or "span").
    time_unit, memory_unit : str
        Units of the times and memory (cost units and M, or seconds and
        bytes when a :class:`~pipecore.Model` gave the costs).
    """

    schedule: Schedule
    result: Result
    label: str
    candidates: pa.Table
    memory_limit: float
    costs: Costs
    network: Network | None
    seconds: float
    objective: str = "makespan"
    time_unit: str = "cost units"
    memory_unit: str = "M"

    def __repr__(self) -> str:
        # Short: the candidates table is in .candidates and .report().
        lim = "none" if math.isinf(self.memory_limit) else f"{self.memory_limit:g}"
        value = float(np.max(getattr(self.result, self.objective)))  # span is per device
        return (f"Tuned({self.label!r}, {self.objective}={value:.6g}, memory_limit={lim}, "
                f"candidates={self.candidates.num_rows})")

    def ranking(self) -> tuple[list[dict], list[dict]]:
        """The candidates that fit, winner first, and those over the limit, each
        fastest first (ties: less memory first).

        Returns
        -------
        fit, over : list of dict
            Rows of ``candidates`` that were simulated; a row tied with
            the winner (same objective and memory) has ``tied`` True.
        """
        rows = [r for r in self.candidates.to_pylist() if r["makespan"] is not None]
        key = self.objective
        fit = sorted((r for r in rows if r["fits"]), key=lambda r: (r[key], r["memory"]))
        over = sorted((r for r in rows if not r["fits"]), key=lambda r: r[key])
        win = _winner_row(fit, self.label)
        if win is not None:
            fit.remove(win)
            fit.insert(0, win)
        for r in fit:
            r["tied"] = r is not fit[0] and _same(r[key], fit[0][key]) and _same(
                r["memory"], fit[0]["memory"])
        return fit, over

    def _repr_html_(self) -> str:
        """Jupyter: the winner's line and the ranking of :meth:`report` as a table."""
        import html

        fit, over = self.ranking()
        cells = "".join(
            f"<tr><td style='text-align:left'>{html.escape(r['candidate'])}</td>"
            f"<td>{r['makespan']:.6g}</td><td>{r['bubble_rate']:.4f}</td>"
            f"<td>{r['memory']:.5g}</td><td>{'yes' if r['fits'] else 'no'}</td></tr>"
            for r in fit[:10] + over[:5])
        return (f"<div style='font-family:sans-serif;font-size:13px'><b>tune</b>: "
                f"{html.escape(self.report(0).splitlines()[0])}</div>"
                "<table style='font-size:12px;border-collapse:collapse'><thead><tr>"
                f"<th>candidate</th><th>makespan ({self.time_unit}, lower is faster)</th>"
                f"<th>bubble rate (idle share)</th><th>memory ({self.memory_unit})</th>"
                f"<th>fits</th></tr></thead><tbody>{cells}</tbody></table>")

    def report(self, top: int = 10) -> str:
        """Why the winner won: the ranking of candidates that fit, and the
        fastest ones that did not, in lines of at most 120 columns.

        The winner heads the ranking; candidates tied with it (same
        objective and memory) are named as ties, and the runner-up is the
        fastest candidate slower than it.

        Parameters
        ----------
        top : int
            Rows of each list.

        Returns
        -------
        str
        """
        fit, over = self.ranking()
        skipped = [r for r in self.candidates.to_pylist() if r["makespan"] is None]
        key, tu, mu = self.objective, self.time_unit, self.memory_unit
        what = "makespan" if key == "makespan" else "longest device span"
        lim = ("no memory limit" if math.isinf(self.memory_limit)
               else f"the memory limit of {self.memory_limit:g} {mu} per device")
        best = fit[0]
        lines = _wrap(f"fastest within {lim}: {self.label}: {what} {best[key]:.6g} {tu}, bubble "
                      f"rate {best['bubble_rate']:.4f} (idle share), memory {best['memory']:.6g} "
                      f"{mu} (peak activation + weights, worst device)")
        ties = [r["candidate"] for r in fit if r["tied"]]
        if ties:
            lines += _wrap(f"tied with it (same {what} and memory): {', '.join(ties)}")
        slower = [r for r in fit[1:] if not _same(r[key], best[key])]
        if slower:
            nxt = slower[0]
            lines += _wrap(f"runner-up: {nxt['candidate']}, {(nxt[key] / best[key] - 1) * 100:.2f}%"
                           f" slower ({what} {nxt[key]:.6g} {tu})")
        if over:
            o = over[0]
            lines += _wrap(f"{len(over)} candidate(s) exceed the limit; the fastest of them, "
                           f"{o['candidate']}, would take {o[key]:.6g} {tu} "
                           f"({(1 - o[key] / best[key]) * 100:.2f}% less time) with memory "
                           f"{o['memory']:.6g} {mu}")
        dup = sum(1 for r in skipped if r["note"].startswith("same schedule as"))
        lines.append(f"{len(fit) + len(over)} candidates simulated, {dup} duplicates dropped, "
                     f"{len(skipped) - dup} not buildable for this shape, in {self.seconds:.2f} s")
        shown = fit[:top] + over[:top]
        if not top or not shown:
            return "\n".join(lines)
        heads = [(what, f"({tu})"), ("bubble rate", "(idle share)"), (f"memory ({mu})",
                 "act. + weights"), ("", "fits"), ("", "candidate")]
        widths = [max(len(a), len(b), 11) for a, b in heads[:3]] + [4]
        lines += ["", "  ".join(a.ljust(w) for (a, _b), w in zip(heads, widths)).rstrip(),
                  "  ".join(b.ljust(w) for (_a, b), w in zip(heads, widths)) + "  candidate"]
        room = WIDTH - sum(widths) - 2 * len(widths)
        for r in shown:
            if r is (over[0] if over else None):
                lines.append(f"over the limit ({len(over)}, fastest first):")
            cells = [f"{r[key]:.6g}", f"{r['bubble_rate']:.4f}", f"{r['memory']:.6g}",
                     "yes" if r["fits"] else "no"]
            head = "  ".join(c.ljust(w) for c, w in zip(cells, widths)) + "  "
            label = r["candidate"] + (" (tied)" if r.get("tied") else "")
            parts = textwrap.wrap(label, room, break_on_hyphens=False) or [""]
            lines.append(head + parts[0])
            lines += [" " * len(head) + part for part in parts[1:]]
        lines += _wrap(f"Rows: those that fit, fastest first (the winner on top), then up to "
                       f"{top} over the limit; {what} of one iteration, lower is faster.")
        return "\n".join(lines)


#: Columns of a terminal: every line a report prints fits in it.
WIDTH = 120


def _wrap(text):
    return textwrap.wrap(text, WIDTH, subsequent_indent="  ", break_on_hyphens=False)


def _same(a, b):
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


def _winner_row(fit, label):
    """The row of ``fit`` that is the winner named ``label`` (explore names
    tune's winner ``"tune: <label>"``)."""
    for name in (label, label.removeprefix("tune: ")):
        for r in fit:
            if r["candidate"] == name:
                return r
    return None

"""The main job, `pipecore compare -p 8 -m 32`, as a reader sees it (issue 37, item 3):
a headline, rows by makespan, headers that say what they are, notes that
name their column, and memory counted the same in the table and the chart.

Golden values: 1F1B's makespan (m + p - 1)(f + b + w) = 39 x 3 = 117 and
its first device's peak of p = 8 activations are the 1F1B paper's closed
forms; a device's weights are one device share (weights=1 M) per share it
holds, so 1F1B's peak memory is 8 + 1 = 9. Everything else is checked
against the Result's own arrays (peak_activation, static_memory), which
the table and headline code does not compute.
"""

from __future__ import annotations

import io
import json
import re

import numpy as np
import pytest

import pipecore as pc
from pipecore.analysis.compare import compare, format_compare
from pipecore.cli import main

UNIT = pc.Costs(f=1.0, b=1.0, w=1.0)  # the command line's default costs


@pytest.fixture(scope="module")
def rows():
    return compare(8, 32, costs=UNIT)


def _held(res) -> float:
    """Activation + weights on the fullest device, from the Result's arrays."""
    return float((np.asarray(res.peak_activation) + np.asarray(res.static_memory)).max())


def _table(text: str) -> tuple[list[str], list[list[str]]]:
    """The two header lines and the body rows (split on runs of 2+ spaces)."""
    lines = text.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("schedule "))
    body = []
    for line in lines[at + 1:]:
        if not re.match(r"^[a-z0-9][\w-]* +\d+ ", line):
            break
        body.append(re.split(r" {2,}", line.strip()))
    return lines[at - 1:at + 1], body


def test_rows_are_sorted_by_makespan_with_ties_by_name(rows):
    _head, body = _table(format_compare(rows))
    by = {r["name"]: r for r in rows}
    names = [cells[0] for cells in body]
    assert sorted(names) == sorted(pc.schedules())
    keys = [(by[n]["makespan"], n) for n in names]
    assert keys == sorted(keys)
    # Three schedules tie at the front; the rule puts them in name order.
    assert names[:3] == ["interleaved-zb", "v-zb", "zb-v"]
    assert by["1f1b"]["makespan"] == 117.0  # (m + p - 1)(f + b + w)


def test_headline_names_fastest_and_lowest_memory(rows):
    text = format_compare(rows)
    best = min(r["makespan"] for r in rows)
    fastest = sorted(r["name"] for r in rows if r["makespan"] == best)
    low = min(_held(r["result"]) for r in rows)
    lowest = sorted(r["name"] for r in rows if _held(r["result"]) == low)
    first = text.replace("\n  ", " ").splitlines()[:2]
    # By how much: against the next-fastest row and 1F1B's closed form (m + p - 1)(f + b + w).
    after = min(r["makespan"] for r in rows if r["makespan"] > best)
    following = sorted(r["name"] for r in rows if r["makespan"] == after)
    assert first[0] == (f"fastest: {', '.join(fastest)} (tied), one step in {best:g} cost units: "
                        f"{(1 - best / after) * 100:.1f}% less time than the next, "
                        f"{', '.join(following)} ({after:g}); "
                        f"{(1 - best / 117) * 100:.1f}% less than 1f1b (117)")
    assert first[1].startswith(f"lowest peak memory: {', '.join(lowest)} ({low:g} M, "
                               "activation + weights")
    assert max(len(line) for line in text.splitlines()) <= 120


def test_headers_spell_out_every_column(rows):
    head, _body = _table(format_compare(rows))
    both = " ".join(head)
    for words in ("makespan", "(cost units)", "bubble ratio", "(idle share)",
                  "peak activation (M)", "fullest", "emptiest", "peak memory (M)",
                  "act. + weights", "ideal table", "(slots)", "agree"):
        assert words in both, words
    # The old abbreviations said nothing without the README.
    assert not re.search(r"\bf\.(max|min|slots|bubble)\b|\bformula\b", both)


def test_formula_shown_beside_the_simulation_where_it_differs(rows):
    _head, body = _table(format_compare(rows))
    by = {cells[0]: cells for cells in body}
    r = {x["name"]: x for x in rows}
    # hanayo: its formula counts one unit; the gaps between units are its note.
    assert by["hanayo"][2] == f"{r['hanayo']['makespan']:g} ({r['hanayo']['formula_makespan']:g})"
    assert by["chimera"][2] == "105"  # forward doubling: the views agree (issue 52)
    assert by["1f1b"][2] == "117"  # one number: simulation and formula agree
    assert by["hanayo"][4] == "8 (none)"  # no closed form for hanayo's peak


def test_slots_of_interleaved_rows_are_explained(rows):
    text = format_compare(rows)
    _head, body = _table(text)
    slots = {cells[0]: cells[7].split()[0] for cells in body}
    r = {x["name"]: x for x in rows}
    # The ideal table's slot is one chunk's op: twice the makespan at v=2, f=b=w=1.
    assert int(slots["zb-v"]) == 2 * r["zb-v"]["makespan"]
    assert "a slot is one chunk's op" in text and "1/v cost unit" in text


def test_notes_name_the_column_they_qualify(rows):
    text = format_compare(rows)
    head, _body = _table(text)
    notes = re.findall(r"^  \[(\d+)\] (.*)$", text, re.M)
    assert notes
    columns = {"makespan", "bubble ratio", "peak activation", "ideal table slots"}
    for _n, note in notes:
        column = note.split(":")[0]
        assert column in columns, note
        assert column.split(" slots")[0] in " ".join(head)
    # The table shows the bubble ratio, and its note speaks of the ratio.
    assert any(n.startswith("bubble ratio: simulation differs from formula") for _i, n in notes)
    assert not any("bubble rate" in n for _i, n in notes)


def test_peak_memory_counts_weights_like_the_chart(rows):
    _head, body = _table(format_compare(rows))
    by = {cells[0]: cells for cells in body}
    assert by["1f1b"][6] == "9"  # 8 activations + 1 M of weights
    for r in rows:
        # The table prints 4 significant digits: equal to within half a unit of the last one.
        assert float(by[r["name"]][6].split()[0]) == pytest.approx(_held(r["result"]), rel=5e-4)
        assert r["peak_memory_max"] == pytest.approx(_held(r["result"]))
    # DualPipe keeps two device shares of weights on every device, and the
    # legend says which rows hold more weights than the rest.
    dual = {r["name"]: r for r in rows}["dualpipe"]["result"]
    assert set(np.asarray(dual.static_memory).tolist()) == {2.0}
    double = sorted(r["name"] for r in rows if np.max(r["result"].static_memory) == 2.0
                    and r["result"].schedule.replicated)
    text = " ".join(format_compare(rows).split())
    assert f"1 M on most rows; 2 M on {', '.join(double)} (replicated stages)" in text
    # PipeDream-2BW holds two versions of its weights, PipeDream p = 8 on device 0 (its closed form).
    assert "2 M on pipedream-2bw (weight versions)" in text
    assert "8 M on layerpipe2, pipedream (weight versions)" in text


def _run(args):
    out = io.StringIO()
    code = main(args, out=out)
    return code, out.getvalue()


def test_cli_header_lists_the_memory_costs(tmp_path):
    code, text = _run(["compare", "-p", "4", "-m", "8", "--no-gantt", "--no-report"])
    assert code == 0
    assert "f=1 b=1 w=1 comm=0" in text
    assert "activation=1 activation_w=0 weights=1" in text


def test_cli_memory_limit_names_the_fastest_that_fits(tmp_path):
    code, text = _run(["compare", "-p", "8", "-m", "32", "--no-gantt", "--no-report",
                       "--memory-limit", "6", "--no-tune"])
    assert code == 0
    fit = [r for r in compare(8, 32, costs=UNIT) if _held(r["result"]) <= 6]
    best = min(r["makespan"] for r in fit)
    names = sorted(r["name"] for r in fit if r["makespan"] == best)
    assert (f"fastest within the memory limit of 6 M per device: {', '.join(names)} "
            f"(makespan {best:g} cost units; {len(fit)} of {len(pc.schedules())} schedules fit)") in text
    assert re.search(r"^gpipe .* 33 over limit ", text, re.M)
    assert "pipecore tune" not in text


def _first(text):
    """The first logical line of a command's output (continuations joined)."""
    return text.replace("\n  ", " ").splitlines()[0]


@pytest.mark.parametrize(("limit", "weights"), [("6", None), ("4", None), ("9", None),
                                                ("6", "0"), ("3", "0.5")])
def test_tune_and_compare_agree_on_the_fastest_that_fits(limit, weights):
    # Issue 52: one meaning of a limit (activation + weights, weights 1 M unless given)
    # and one answer to "the fastest that fits" in compare's headline and tune's.
    extra = [] if weights is None else ["--weights", weights]
    code, text = _run(["compare", "-p", "8", "-m", "32", "--no-gantt", "--no-report",
                       "--memory-limit", limit, *extra])
    assert code == 0
    said = re.search(r"^pipecore tune, searching further .*? finds (?:no faster schedule: |"
                     r"[\d.]+% less time: )?(.*) \(makespan ([\d.]+) cost units, memory ([\d.]+) M\)",
                     text.replace("\n  ", " "), re.M)
    assert said, text
    code, tuned = _run(["tune", "-p", "8", "-m", "32", "--memory-limit", limit, *extra])
    assert code == 0
    assert _first(tuned).startswith(f"fastest within the memory limit of {limit} M per device: "
                                    f"{said.group(1)}: makespan {said.group(2)} cost units")
    # tune's space holds every family of compare's table: never slower than its best fit.
    costs = pc.Costs(f=1.0, b=1.0, w=1.0, weights=float(weights or 1.0))
    fit = [r["makespan"] for r in compare(8, 32, costs=costs)
           if _held(r["result"]) <= float(limit) * (1 + 1e-9)]
    assert not fit or float(said.group(2)) <= min(fit) + 1e-9


def test_cli_memory_limit_that_nothing_meets():
    code, text = _run(["compare", "-p", "4", "-m", "8", "--no-gantt", "--no-report",
                       "--memory-limit", "0.5"])
    assert code == 0 and "no schedule fits the memory limit of 0.5 M per device" in text


@pytest.mark.parametrize("bad", ["0", "-1", "nan", "inf"])
def test_cli_memory_limit_must_be_positive(bad, capsys):
    code, _text = _run(["compare", "-p", "2", "-m", "2", "--no-gantt", "--no-report",
                        "--memory-limit", bad])
    assert code == 2
    err = capsys.readouterr().err
    assert "--memory-limit must be a finite number > 0" in err and "Traceback" not in err


def test_cli_json_adds_headline_and_keeps_its_keys():
    code, text = _run(["compare", "-p", "8", "-m", "32", "--no-gantt", "--no-report", "--json",
                       "--memory-limit", "9"])
    data = json.loads(text)
    assert code == 0
    got = data["rows"]
    assert [(r["makespan"], r["name"]) for r in got] == sorted((r["makespan"], r["name"])
                                                               for r in got)
    for key in ("makespan", "formula_makespan", "table_slots", "formula_slots", "bubble_ratio",
                "formula_bubble_ratio", "bubble_rate", "formula_bubble_rate", "peak_max",
                "peak_min", "formula_peak_max", "formula_peak_min", "flags", "error", "chunks"):
        assert key in got[0], key
    by = {r["name"]: r for r in got}
    assert by["1f1b"]["peak_memory_max"] == 9.0 and by["1f1b"]["fits_memory_limit"] is True
    assert by["gpipe"]["fits_memory_limit"] is False
    head = data["headline"]
    assert head["fastest"] == ["interleaved-zb", "v-zb", "zb-v"] and head["makespan"] == 99.5
    assert head["memory_limit"] == 9.0 and "1f1b" in head["fits"]
    assert data["setting"]["costs"]["weights"] == 1.0

"""The main job's report.html as a reader sees it (issue 37, item 3): a
headline, a summary sorted by makespan whose columns say what they hold,
notes that name the column they qualify, and a memory chart that counts
what the table counts (activation + weights).

Golden value: 1F1B's first device holds p = 8 activations (the 1F1B
paper's closed form) and one device share of weights (weights=1 M), so
its peak memory is 9 M. The rest is checked against the page's own chart
data and the Result's arrays.
"""

from __future__ import annotations

import io
import re

import pytest
from pagetext import parse as _parse
from pagetext import plots as _plots

import pipecore as pc
from pipecore.cli import main

pytest.importorskip("plotly", reason="reports need plotly: pip install pipecore[plot]")


def _run(args):
    out = io.StringIO()
    code = main(args, out=out)
    return code, out.getvalue()


def _page(folder, *extra):
    code, _text = _run(["compare", "-p", "8", "-m", "32", "--no-gantt", "--out", str(folder),
                        *extra])
    assert code == 0
    return (folder / "report.html").read_text()


@pytest.fixture(scope="module")
def main_page(tmp_path_factory):
    return _page(tmp_path_factory.mktemp("mainjob"))


def test_report_headline_and_columns(main_page):
    page = _parse(main_page)
    # 1F1B's (m + p - 1)(f + b + w) = 117 is its closed form; 99.5 and 102 are the
    # rows' own makespans (tests/test_main_job.py checks the sentence's arithmetic).
    assert page.headline == ["fastest: interleaved-zb, v-zb, zb-v (tied), one step in 99.5 cost "
                             "units: 2.5% less time than the next, dualpipe (102); 15.0% less "
                             "than 1f1b (117)",
                             "lowest peak memory: v-min (4.5 M, activation + weights on the "
                             "fullest device)"]
    head = " | ".join(page.summary_head)
    for words in ("makespan (cost units)", "bubble ratio", "idle share of p \u00d7 makespan",
                  "peak activation, fullest device (M)", "peak memory, fullest device (M)",
                  "activation + weights", "agree"):
        assert words in head, words


def test_report_with_a_memory_limit(tmp_path):
    page = _parse(_page(tmp_path, "--memory-limit", "9"))
    assert page.headline[2].startswith("fastest within the memory limit of 9 M per device: "
                                       "interleaved-zb, v-zb, zb-v")
    fits = {cells[0]: cells[7] for cells in page.summary_rows}
    assert "within 9 M" in " ".join(page.summary_head)
    assert fits["1f1b"] == "yes" and fits["gpipe"] == "no"  # 9 M and 33 M


def test_report_rows_by_makespan(main_page):
    page = _parse(main_page)
    names = [cells[0] for cells in page.summary_rows]
    # A cell is the simulation's figure, then the formula's in parentheses.
    makespans = [float(cells[2].split()[0]) for cells in page.summary_rows]
    assert sorted(names) == sorted(pc.schedules())
    assert list(zip(makespans, names)) == sorted(zip(makespans, names))


def test_report_footnotes_name_the_column(main_page):
    page = _parse(main_page)
    heads = page.summary_head + page.views_rows + page.views_head
    notes = [f for f in page.feet if re.match(r"\[\d+\] ", f)]
    assert notes
    for note in notes:
        column = note.split("] ", 1)[1].split(":")[0]
        assert any(h.startswith(column) or h.startswith(column.replace(" slots", ""))
                   for h in heads), note
    # The summary's bubble column is the ratio; so is its note.
    assert any("bubble ratio: simulation differs from formula" in n for n in notes)
    assert not any("bubble rate" in n for n in notes)


def test_report_chart_and_table_count_the_same_memory(main_page):
    page = _parse(main_page)
    plots = _plots(main_page)
    memory = {k: v for k, v in plots.items() if k.endswith("-memory")}
    assert len(memory) == len(pc.schedules())
    table = {cells[0]: float(cells[6]) for cells in page.summary_rows}
    for div, (data, layout) in memory.items():
        name = re.match(r"s\d+-(.*)-memory$", div).group(1)
        top = max(max(t["y"]) for t in data)
        assert top == pytest.approx(table[name], rel=5e-4), name  # the table's 4 significant digits
        assert "activation + weights" in layout["title"]["text"]
        assert "weights" in layout["title"]["text"].split("(", 1)[1]
    assert table["1f1b"] == 9.0  # 8 activations + 1 M of weights


def test_report_summary_has_the_terminal_tables_figures(main_page):
    """Issue 52: the summary dropped the formula values and the ideal-table
    column that the terminal table shows."""
    page = _parse(main_page)
    head = page.summary_head
    assert head[5].startswith("peak activation, emptiest device (M)")
    assert head[7].startswith("ideal table (slots)")
    rows = {cells[0]: cells for cells in page.summary_rows}
    # 1F1B's closed form (m + p - 1)(f + b + w) = 39 * 3 = 117 agrees with the
    # simulation: the cell holds one figure. Its emptiest device holds one
    # activation (min(p - d, m) at d = p - 1).
    assert rows["1f1b"][2] == "117" and rows["1f1b"][5] == "1"
    # Where the formula is approximate the cell adds it in parentheses, as
    # the terminal does; a figure without a closed form says so.
    def cell(sim, fm):
        same = abs(sim - fm) <= 1e-9 * max(1.0, abs(sim), abs(fm))
        return f"{sim:.6g}" if same else f"{sim:.6g} ({fm:.6g})"

    for r in _compare_rows():
        assert rows[r["name"]][2] == cell(r["makespan"], r["formula_makespan"]), r["name"]
        assert rows[r["name"]][7] == cell(r["table_slots"], r["formula_slots"]), r["name"]
    # Some formulas are approximate here (chimera's, hanayo's): the check above saw both forms.
    assert sum("(" in cells[2] for cells in page.summary_rows) >= 2
    assert rows["hanayo"][4] == "8 (no closed form)"


def test_report_has_no_dash_placeholders(main_page):
    """Issue 52: no '-' stands in for a missing figure, in the summary or
    in a schedule's three views."""
    page = _parse(main_page)
    cells = [c for row in page.summary_rows for c in row]
    assert "-" not in cells
    views = re.findall(r"<table class='views'>.*?</table>", main_page, flags=re.S)
    assert len(views) == len(pc.schedules())
    for table in views:
        assert "<td>-</td>" not in table and "formula -" not in table
        assert "no closed form" in table  # peak memory: the formulas count activation only


def _compare_rows():
    from pipecore.analysis.compare import compare

    return compare(8, 32, costs=pc.Costs(f=1.0, b=1.0, w=1.0))


def test_report_says_where_m_counts_chunks_or_a_stream(main_page):
    # As the terminal legend: seq1f1b's m counts sequence chunks, the asynchronous rows are one
    # unflushed stream, so a reader of the page does not take them for plain 1F1B.
    assert "m counts: seq1f1b: m counts sequence chunks (2 per sequence)" in main_page
    assert "layerpipe2, pipedream, pipedream-2bw: one stream of m microbatches without a flush" in main_page

"""HTML reports (pc.report, pipecore report, compare's report.html) and the Jupyter views.

Golden values: 1F1B's makespan (m + p - 1)(f + b) and per-device peak
min(p - d, m) activations are the closed forms of the 1F1B paper (see
docs/FIELD notes); the Pareto frontier is checked against a brute-force
dominance test written here.
"""

from __future__ import annotations

import io
import json
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pipecore as pc
from pipecore.analysis.compare import compare, format_compare
from pipecore.cli import main
from pipecore.output import report as R
from pipecore.output.scanreport import scan_report

pytest.importorskip("plotly", reason="reports need plotly: pip install pipecore[plot]")

UNIT = pc.Costs(f=1.0, b=1.0, w=1.0)


def _plots(page: str) -> list[tuple[str, list, dict]]:
    """(div id, data, layout) of every Plotly.newPlot call in a page."""
    out = []
    for m in re.finditer(r"Plotly\.newPlot\('([^']+)',(\[.*?\]),(\{.*?\}),\{\"responsive\"", page):
        out.append((m.group(1), json.loads(m.group(2)), json.loads(m.group(3))))
    return out


def _self_contained(page: str) -> None:
    # Nothing is fetched at view time: no external script, stylesheet, image or frame.
    assert not re.search(r"<script[^>]+src=", page)
    assert not re.search(r"<link[^>]+href=", page)
    assert not re.search(r"<(img|iframe)[^>]+src=['\"]?https?:", page)


def test_single_result_page(tmp_path):
    p, m = 4, 8
    res = pc.simulate(pc.build("1f1b", p, m), pc.Costs(f=1.0, b=2.0, w=0.0))
    path = pc.report(res, tmp_path / "one.html", memory_limit=5.0)
    page = path.read_text()
    _self_contained(page)
    # 1F1B closed form: (m + p - 1)(f + b) = 11 * 3 = 33.
    assert res.makespan == 33.0
    assert "<td>33</td>" in page
    plots = _plots(page)
    ids = [i for i, _, _ in plots]
    assert any(i.endswith("-gantt") for i in ids) and any(i.endswith("-memory") for i in ids)
    gantt = next(d for i, d, _ in plots if i.endswith("-gantt"))
    bars = sum(len(t["x"]) for t in gantt if t["type"] == "bar")
    assert bars == 2 * p * m  # one bar per F and per BW (W is zero with w = 0: none drawn)
    memory = next((d, lay) for i, d, lay in plots if i.endswith("-memory"))
    peaks = [max(t["y"]) for t in memory[0]]
    weights = np.asarray(res.static_memory)
    # 1F1B's peak on device d is min(p - d, m) activations, plus its weights.
    assert peaks == pytest.approx([min(p - d, m) + weights[d] for d in range(p)])
    assert memory[1]["shapes"][0]["y0"] == 5.0  # the memory limit line


def test_zero_length_ops_are_not_drawn(tmp_path):
    res = pc.simulate(pc.build("zb-v", 4, 8), pc.Costs(f=1.0, b=1.0, w=0.0))
    fig, note = R._gantt_figure(res, critical=False, max_ops=R.MAX_OPS)
    assert note is None
    names = {t["name"].split()[0] for t in fig["data"]}
    assert "W" not in names  # every W takes 0: no bar, no legend entry
    ops = res.ops
    nonzero = int((ops.column("finish").to_numpy() > ops.column("start").to_numpy()).sum())
    assert sum(len(t["x"]) for t in fig["data"]) == nonzero
    assert nonzero < ops.num_rows


def test_chunks_get_their_own_shade_and_legend():
    res = pc.simulate(pc.build("interleaved-1f1b", 4, 8, chunks=2), UNIT)
    fig, _ = R._gantt_figure(res, critical=True, max_ops=R.MAX_OPS)
    names = [t["name"] for t in fig["data"]]
    assert "F chunk 0" in names and "F chunk 1" in names and "critical path" in names
    colours = {t["name"]: t["marker"]["color"] for t in fig["data"] if t["type"] == "bar"}
    assert colours["F chunk 0"] != colours["F chunk 1"]
    # Interleaved 1F1B puts stage s on device s mod p: chunk = s // p.
    for t in fig["data"]:
        if t["type"] == "bar":
            c = int(t["name"].split()[-1])
            assert all(stage // 4 == c for stage, _ in t["customdata"])


def test_large_schedules_are_aggregated(tmp_path):
    res = pc.simulate(pc.build("1f1b", 8, 64), UNIT)
    path = pc.report(res, tmp_path / "agg.html", max_ops=500)
    page = path.read_text()
    assert "drawn as the busy fraction" in page
    gantt = next(d for i, d, _ in _plots(page) if i.endswith("-gantt"))
    assert [t["type"] for t in gantt] == ["heatmap"]
    z = np.asarray(gantt[0]["z"])
    width = res.makespan / R.BUCKETS
    # Busy time is conserved: summed fractions times the bucket width equal
    # each device's busy time (rounding of z to 3 decimals aside).
    assert z.sum(axis=1) * width == pytest.approx(np.asarray(res.busy), rel=2e-3)


def test_compare_page_and_summary(tmp_path):
    rows = compare(4, 8, costs=UNIT)
    page = pc.report(rows, tmp_path / "cmp.html").read_text()
    _self_contained(page)
    built = [r for r in rows if r["result"] is not None]
    assert page.count("<a href='#s") == len(rows)
    assert len([i for i, _, _ in _plots(page) if i.endswith("-gantt")]) == len(built)
    assert "class='summary'" in page


def test_report_errors(tmp_path):
    with pytest.raises(ValueError, match="got int"):
        pc.report(42, tmp_path / "x.html")
    with pytest.raises(ValueError, match="empty list"):
        pc.report([], tmp_path / "x.html")
    with pytest.raises(ValueError, match="item 1 is a str"):
        res = pc.simulate(pc.build("1f1b", 2, 2))
        pc.report([res, "nope"], tmp_path / "x.html")
    with pytest.raises(ValueError, match="not a scan directory"):
        pc.report(str(tmp_path / "missing"), tmp_path / "x.html")


def test_custom_schedule_reports_simulation_only(tmp_path):
    sched = pc.Schedule.from_programs([[("F", 0, 0), ("B", 0, 0), ("W", 0, 0)]], name="mine")
    res = pc.simulate(sched, UNIT)
    page = pc.report(res, tmp_path / "c.html").read_text()
    assert "simulation only" in page
    # Why, in words, not a failed name lookup ("unknown schedule 'mine'; valid names: ...").
    assert "&#x27;mine&#x27; is not a family&#x27;s schedule as built" in page \
        or "'mine' is not a family's schedule as built" in page
    assert "valid names" not in page


def _texts(svg):
    return re.findall(r"<text[^>]*>([^<]*)</text>", svg)


def test_result_svg_has_a_time_axis_and_a_kind_legend():
    """Issue 37 item 6: the inline Gantt says what its x axis and colours mean."""
    res = pc.simulate(pc.build("1f1b", 8, 32), UNIT)  # makespan 39 * 3 = 117
    svg = res._repr_html_()
    texts = _texts(svg)
    # Round ticks over 0..117, 20 apart, and the axis title with its unit.
    assert [t for t in texts if t in {"0", "20", "40", "60", "80", "100", "120"}][-6:] == \
        ["0", "20", "40", "60", "80", "100"]
    assert "time (cost units)" in texts and "device" in texts
    # One legend entry per kind drawn, each swatch the colour of that kind's boxes.
    assert [t for t in texts if "forward" in t or "backward" in t] == \
        ["F forward", "BW backward (input and weights)"]
    swatches = re.findall(r"<rect class='legend'[^>]*fill='(#[0-9A-Fa-f]{6})'/><text[^>]*>([^<]*)<",
                          svg)
    ops = svg[svg.index("<g class='ops'>"):svg.index("</g>")]
    fills = re.findall(r"fill='(#[0-9A-Fa-f]{6})'", ops)
    # Device 0's first op is F 0 and its last BW 31 (boxes in op-table order).
    assert dict((label, colour) for colour, label in swatches) == {
        "F forward": fills[0], "BW backward (input and weights)": fills[63]}
    assert "makespan 117 cost units" in svg


def test_result_svg_legend_explains_chunk_shades():
    res = pc.simulate(pc.build("zb-v", 4, 8), UNIT)
    texts = _texts(res._repr_html_())
    assert {"F forward", "B backward (input)", "W backward (weights)", "chunk 0 (darker)",
            "chunk 1 (lighter)"} <= set(texts)


def test_nice_ticks_are_round():
    from pipecore.output.views import nice_ticks

    assert nice_ticks(0.0, 117.0) == [0, 20, 40, 60, 80, 100]
    assert nice_ticks(0.0, 25.5) == [0, 5, 10, 15, 20, 25]
    assert nice_ticks(0.0, 0.3) == [0, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3]
    assert nice_ticks(118.89, 122.6) == [119, 120, 121, 122]
    with pytest.raises(ValueError, match="finite lo < hi"):
        nice_ticks(1.0, 1.0)


def test_jupyter_views_are_small():
    sched = pc.build("1f1b", 8, 32)
    res = pc.simulate(sched, UNIT)
    svg = res._repr_html_()
    ops = svg[svg.index("<g class='ops'>"):svg.index("</g>")]
    assert ops.count("<rect") == sched.num_ops  # no zero-length op in 1F1B with w=1
    assert "makespan 117" in svg  # (m + p - 1)(f + b + w) = 39 * 3
    grid = sched._repr_html_()
    assert grid.count("<td") == sched.num_ops
    assert len(repr(res)) < 120 and len(repr(sched)) < 120
    big = pc.simulate(pc.build("1f1b", 32, 256), UNIT)
    assert "<rect" not in big._repr_html_() and "pc.report" in big._repr_html_()


def test_compare_table_fits_120_columns_and_zero_bubble_wins():
    rows = compare(8, 32, costs=UNIT)
    text = format_compare(rows)
    assert max(len(line) for line in text.splitlines()) <= 120
    by = {r["name"]: r for r in rows}
    assert by["zb-h1"]["makespan"] < by["1f1b"]["makespan"]


def test_cli_compare_writes_report(tmp_path):
    buf = io.StringIO()
    assert main(["compare", "-p", "4", "-m", "8", "--no-gantt", "--out", str(tmp_path)],
                out=buf) == 0
    text = buf.getvalue()
    assert (tmp_path / "report.html").exists()
    assert text.rstrip().splitlines()[-1].endswith("report.html")
    assert "f=1 b=1 w=1" in text  # the zero-bubble papers' unit setting by default


def test_cli_report_schedule_and_errors(tmp_path, capsys):
    out = tmp_path / "zbv.html"
    buf = io.StringIO()
    assert main(["report", "zb-v", "-p", "4", "-m", "8", "--comm", "0.05", "--out", str(out)],
                out=buf) == 0
    assert out.exists() and str(out) in buf.getvalue()
    assert main(["report", "zb-v", "--out", str(out)], out=io.StringIO()) == 2
    assert "needs --devices" in capsys.readouterr().err
    assert main(["report", "no-such", "-p", "2", "-m", "2"], out=io.StringIO()) == 2
    assert "neither a schedule name" in capsys.readouterr().err


def _scan_rows() -> pa.Table:
    grid = pc.Grid(schedules=["1f1b", "zb-h1", "zb-v", "gpipe"], devices=[4],
                   microbatches=[8, 16], costs={"f": [1.0], "b": [1.0, 2.0], "w": [0.0, 1.0]})
    return pa.concat_tables([pa.Table.from_batches([b]) for b in pc.scan(grid)])


def test_scan_report_frontier_is_the_non_dominated_set(tmp_path):
    table = _scan_rows()
    page = scan_report(table, tmp_path / "scan.html")
    _self_contained(page.read_text())
    front = pq.read_table(tmp_path / "scan_frontier.parquet")
    assert (tmp_path / "scan_frontier.csv").exists()
    d = table.to_pydict()
    rows = list(zip(d["microbatches"], d["memory_max"], d["throughput"]))
    for mb in (8, 16):
        pts = {(x, y) for m_, x, y in rows if m_ == mb}
        # Brute force: a point is on the frontier when no other uses no more
        # memory and gives at least as much throughput, one of them strictly.
        best = {(x, y) for x, y in pts
                if not any(x2 <= x and y2 >= y and (x2, y2) != (x, y) for x2, y2 in pts)}
        f = front.to_pydict()
        got = {(x, y) for m_, x, y in zip(f["microbatches"], f["memory_max"], f["throughput"])
               if m_ == mb}
        assert got == best


def test_scan_report_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        scan_report(tmp_path / "nope", tmp_path / "x.html")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no scan parts"):
        scan_report(tmp_path / "empty", tmp_path / "x.html")
    with pytest.raises(ValueError, match="lack the column"):
        scan_report(pa.table({"schedule": ["1f1b"]}), tmp_path / "x.html")
    with pytest.raises(ValueError, match="metric"):
        scan_report(_scan_rows(), tmp_path / "x.html", metric="speed")


def _gantt_legend_and_title(tmp_path, res):
    """The title and legend a Gantt PNG says it drew (its text chunks)."""
    from PIL import Image

    with Image.open(res.write_gantt(tmp_path / "g.png")) as im:
        return {"legend": im.text["pipecore:legend"].split(" | "), "title": im.text["Title"]}


def test_gantt_png_title_legend_and_chunks(tmp_path):
    from pipecore.output.colours import chunk_of

    res = pc.simulate(pc.build("zb-v", 4, 8), pc.Costs(f=1.0, b=1.0, w=0.0))
    seen = _gantt_legend_and_title(tmp_path, res)
    assert seen["title"].startswith("zb-v, p=4 m=8, f=1 b=1 w=0 comm=0")
    assert "W" not in seen["legend"]  # every W takes no time: nothing drawn, no entry
    assert {"F", "B", "chunk 0 (darker)", "chunk 1 (lighter)"} <= set(seen["legend"])
    # zb-v's V placement: stage s < p is a device's chunk 0, s >= p its chunk 1.
    ops = res.ops
    dev, stage = ops.column("device").to_numpy(), ops.column("stage").to_numpy()
    assert (chunk_of(dev, stage) == (stage >= 4)).all()
    one = pc.simulate(pc.build("1f1b", 4, 8), UNIT)
    assert not any(t.startswith("chunk") for t in _gantt_legend_and_title(tmp_path, one)["legend"])


def test_gantt_png_two_pipelines_are_not_chunks(tmp_path):
    """Issue 52: Chimera (v=1) drew a 'chunk 0/1' legend for its two
    pipelines. Its down pipeline enters at device 0, its up pipeline at
    device p-1 (Chimera paper, Fig. 2); BitPipe has both and two chunks."""
    legend = _gantt_legend_and_title(tmp_path, pc.simulate(pc.build("chimera", 4, 8), UNIT))
    assert not any(t.startswith("chunk") for t in legend["legend"])
    assert {"F, down (d0\u2192d3)", "F, up (d3\u2192d0)", "BW, down (d0\u2192d3)",
            "BW, up (d3\u2192d0)"} <= set(legend["legend"])
    bit = _gantt_legend_and_title(tmp_path, pc.simulate(pc.build("bitpipe", 4, 8, chunks=2), UNIT))
    assert "F, up (d3\u2192d0)" in bit["legend"] and "chunk 0 (darker)" in bit["legend"]


def test_product_makes_every_combination():
    import itertools

    cols = pc.product(f=[1.0, 2.0], b=[1.0, 2.0, 3.0], w=0.5)
    expected = list(itertools.product([1.0, 2.0], [1.0, 2.0, 3.0], [0.5]))  # the standard library's
    assert list(zip(cols["f"], cols["b"], cols["w"])) == expected
    sched = pc.build("1f1b", 4, 8)
    out = pc.simulate_many(sched, cols)
    # 1F1B's closed form: (m + p - 1)(f + b + w), row by row.
    assert out.column("makespan").to_pylist() == [11 * (f + b + w) for f, b, w in expected]
    with pytest.raises(ValueError, match="column 'b'"):
        pc.product(f=[1.0], b=[])
    with pytest.raises(ValueError, match="at least one column"):
        pc.product()


def test_tuned_repr_is_short_and_html_lists_candidates():
    t = pc.tune(4, 8, UNIT, memory_limit=4.0)
    assert len(repr(t)) < 160 and "pyarrow" not in repr(t)
    page = t._repr_html_()
    assert html_rows(page) >= 2 and t.label in page


def html_rows(page: str) -> int:
    return page.count("<tr>") - 1  # minus the header row


def test_report_axes_line_up(tmp_path):
    """Issue 52: a Gantt's time axis did not line up with its memory chart.
    Every chart of a page spans the same time range (to the slowest
    schedule's end) inside the same left and right margins (the browser
    test checks the plot areas as laid out)."""
    rows = compare(4, 8, costs=UNIT, names=["1f1b", "zb-h1", "interleaved-1f1b"])
    page = pc.report(rows, tmp_path / "r.html", memory_limit=5.0).read_text()
    plots = _plots(page)
    slowest = max(r["makespan"] for r in rows)  # 1F1B: (m + p - 1)(f + b + w) = 33
    assert slowest == 33.0
    ranges = {json.dumps(lay["xaxis"]["range"]) for _i, _d, lay in plots}
    assert len(ranges) == 1 and json.loads(ranges.pop())[1] >= 33.0
    assert len({(lay["margin"]["l"], lay["margin"]["r"]) for _i, _d, lay in plots}) == 1
    for div, data, lay in plots:
        # A legend stands in the right margin, whose width is fixed; a
        # colour bar would widen it.
        legend = lay.get("legend", {"x": 1.01})
        assert legend["x"] > 1 and legend.get("orientation", "v") == "v", div
        assert not any(t.get("showscale") for t in data), div
    # Zooming one chart of a section moves the others: each section links its charts.
    assert page.count("linkTime([") == len(rows)


def test_report_of_a_schedule_without_formula_says_so(tmp_path):
    """Issue 52: the explore report printed '- slots (formula -)'."""
    res = pc.simulate(pc.compose(devices=4, microbatches=8, placement="bidirectional"), UNIT)
    views = R.result_views(res)
    assert views["table_slots"] is None
    page = pc.report(res, tmp_path / "e.html").read_text()
    table = re.search(r"<table class='views'>.*?</table>", page, flags=re.S).group(0)
    assert "formula -" not in table and "<td>-</td>" not in table
    assert "no ideal table" in table and table.count("no closed form") == 6

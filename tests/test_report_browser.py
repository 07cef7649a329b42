"""The HTML reports in a real browser: headless Chromium renders them with no
console errors, the DOM holds what the data says, and a screenshot is not blank.

Chromium is a Debian package (`apt-get install chromium`); .ci/run installs
it, so in CI these tests run. Elsewhere they skip and say why.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pyarrow as pa
import pytest

import pipecore as pc
from pipecore.analysis.compare import compare
from pipecore.output.scanreport import scan_report

pytest.importorskip("plotly", reason="reports need plotly: pip install pipecore[plot]")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None,
                                reason="chromium not installed (Debian: apt-get install chromium)")
UNIT = pc.Costs(f=1.0, b=1.0, w=1.0)


def _chromium(page, tmp_path, *extra):
    profile = tmp_path / "profile"
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
            "--virtual-time-budget=8000", *extra, page.resolve().as_uri()]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    console = [line for line in done.stderr.splitlines() if ":CONSOLE" in line]
    return done.stdout, console


def _render(page, tmp_path):
    """The page's DOM after its scripts ran, from the same Chromium run that
    takes a screenshot (one launch instead of two); the screenshot must not
    be blank and the console must stay silent."""
    import matplotlib.image as mpimg

    shot = tmp_path / "shot.png"
    dom, console = _chromium(page, tmp_path, "--dump-dom", f"--screenshot={shot}",
                             "--window-size=1200,900")
    assert console == [], console  # any console message from the page is a fault here
    pixels = mpimg.imread(shot)[..., :3]
    # A blank page is one colour; a chart has bars, axes and text.
    assert pixels.std() > 0.05
    assert (pixels.mean(axis=2) < 0.5).mean() > 0.005  # some dark ink
    return dom


@pytest.fixture(scope="module")
def compare_page(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cmp")
    rows = compare(4, 8, costs=UNIT)
    return rows, pc.report(rows, folder / "report.html")


def test_compare_page_renders(compare_page, tmp_path):
    rows, page = compare_page
    dom = _render(page, tmp_path)
    built = [r for r in rows if r["result"] is not None]
    rendered = set(re.findall(r'id="([^"]+-gantt)" class="plot gantt js-plotly-plot"', dom))
    assert len(rendered) == len(built)
    # Every op that takes time is one bar (plotly draws a path.point per bar).
    nonzero = sum(int((r["result"].ops.column("finish").to_numpy()
                       > r["result"].ops.column("start").to_numpy()).sum()) for r in built)
    assert dom.count('class="point"') == nonzero
    for r in built:  # the summary shows each makespan
        assert f"data-v='{r['makespan']!r}'" in dom.replace('"', "'")
    # Issue 52: a Gantt's time axis lined up with no other chart. Every plot
    # area of the page, as the browser laid it out, has the same left edge
    # and width (and the same time range, tests/test_report.py checks).
    areas = set(re.findall(r'<rect class="nsewdrag drag"[^>]* x="([\d.]+)"[^>]* width="([\d.]+)"',
                           dom))
    assert len(areas) == 1, areas


def test_aggregated_page_renders(tmp_path):
    res = pc.simulate(pc.build("1f1b", 64, 256), UNIT)
    page = pc.report(res, tmp_path / "big.html")
    dom = _render(page, tmp_path)
    assert "drawn as the busy fraction" in dom
    assert 'class="hm"' in dom or "heatmaplayer" in dom  # plotly's heatmap layer
    assert "957" in dom  # 1F1B: (m + p - 1)(f + b + w) = 319 * 3


def test_scan_page_renders(tmp_path):
    grid = pc.Grid(schedules=["1f1b", "zb-h1", "zb-v"], devices=[4], microbatches=[8, 16],
                   costs={"f": [1.0], "b": [1.0, 2.0], "w": [0.0, 1.0]})
    table = pa.concat_tables([pa.Table.from_batches([b]) for b in pc.scan(grid)])
    page = scan_report(table, tmp_path / "scan.html")
    dom = _render(page, tmp_path)
    assert "js-plotly-plot" in dom
    assert "sel-p" in dom and "sel-m" in dom and "sel-n" in dom
    # The first shape (p=4, m=8) is shown: one marker per row of it.
    n_first = int(np.sum(table.column("microbatches").to_numpy() == 8))
    assert dom.count('class="point"') == n_first


def test_the_console_check_catches_a_script_error(tmp_path):
    # The checker itself: a page whose script throws must be reported.
    page = tmp_path / "bad.html"
    page.write_text("<html><body><script>noSuchFunction();</script></body></html>")
    _dom, console = _chromium(page, tmp_path, "--dump-dom")
    assert any("noSuchFunction" in line for line in console)


def test_page_of_several_results_renders_each_setting(tmp_path):
    # Issue 37: results with different costs, stragglers and jitter; each
    # section states its own in the rendered page, and the headline is there.
    sched = pc.build("1f1b", 4, 8)
    plain = pc.simulate(sched, pc.Costs(f=1.0, b=2.0, w=0.0))
    slow = pc.simulate(sched, pc.Costs(f=1.0, b=1.0, w=1.0, comm=0.1), stragglers={3: 1.3},
                       jitter=pc.Jitter(sigma=0.1, seed=1))
    dom = _render(pc.report([plain, slow], tmp_path / "two.html"), tmp_path)
    settings = re.findall(r'<p class="setting">([^<]*)</p>', dom)
    assert len(settings) == 2
    assert "costs: f=1 b=2 w=0 comm=0" in settings[0] and "stragglers: none" in settings[0]
    assert "costs: f=1 b=1 w=1 comm=0.1" in settings[1]
    assert "stragglers: device 3 at 1.3x op time" in settings[1]
    assert "jitter: lognormal sigma=0.1 per op, seed 1, draw 0" in settings[1]
    assert 'class="headline"' in dom and "fastest: 1f1b #1, one step in 33 cost units" in dom


def test_zooming_a_gantt_moves_its_memory_chart(tmp_path):
    # Issue 52: a Gantt's time axis and its memory chart's stay one axis
    # when a reader zooms. The page gets a script that zooms the Gantt and
    # writes down the memory chart's range afterwards.
    res = pc.simulate(pc.build("1f1b", 4, 8), UNIT)
    page = pc.report(res, tmp_path / "zoom.html")
    text = page.read_text()
    gantt = re.search(r"Plotly\.newPlot\('([^']+-gantt)'", text).group(1)
    memory = gantt[:-len("gantt")] + "memory"
    probe = (f"<script>Plotly.relayout('{gantt}',{{'xaxis.range':[5,12]}}).then(function(){{"
             f"setTimeout(function(){{var r=document.getElementById('{memory}').layout.xaxis.range;"
             "var p=document.createElement('p');p.id='probe';p.textContent=r.join(',');"
             "document.body.appendChild(p);},50);});</script></body>")
    page.write_text(text.replace("</body>", probe))
    dom = _render(page, tmp_path)
    assert re.search(r'<p id="probe">5,12</p>', dom), re.findall(r'<p id="probe">[^<]*', dom)

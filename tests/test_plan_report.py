"""The report page of a planning search (issue 53, part 7): ``plan_report`` and
``pipecore plan --report``. The page is read as data (its plotly figures and
its table) and checked against the search it draws: every estimated strategy
a dot, the frontier the ranked strategies no other ranked one beats in both
time and memory (found here by brute force over all pairs), each breakdown
bar summing to its plan's iteration time and memory. A headless Chromium
renders the page with no console message (skipped where it is not installed).
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess

import pytest
from pagetext import parse, plots

import pipecore as pc
from pipecore.cli import main
from pipecore.plan.ranking import parse_strategy
from pipecore.plan.report import GIB, plan_report
from pipecore.plan.search import strategies

pytest.importorskip("plotly", reason="reports need plotly: pip install pipecore[plot]")

ARCH = pc.Architecture(layers=8, hidden=1024, heads=16, seq=1024, vocab=51200, name="small")
NODE = pc.Cluster.preset("dgx-a100", nodes=1)
SPACE = dict(schedules=("1f1b", "interleaved-1f1b"), zero=(0, 1), recompute=("none", "full"),
             microbatch_sizes=(1, 2, 4))


@pytest.fixture(scope="module")
def search():
    fast = strategies(ARCH, NODE, 32, **SPACE)
    # A bound that leaves some strategies unranked, so the page draws them apart.
    bound = sorted(r["iteration_time"] for r in fast.table.to_pylist())[len(fast.table) // 2]
    res = strategies(ARCH, NODE, 32, max_iteration_time=bound, **SPACE)
    yours = res.rank_of(parse_strategy("tp=2,pp=2,mb=2,schedule=zb-h1", gpus=8), ARCH, NODE, 32,
                        max_iteration_time=bound)
    return res, bound, yours


@pytest.fixture(scope="module")
def page(search, tmp_path_factory):
    res, bound, yours = search
    path = tmp_path_factory.mktemp("plan") / "plan.html"
    plan_report(res, path, ARCH, NODE, 32, top=5, marks={"yours": yours}, max_iteration_time=bound)
    return path.read_text()


def _brute_frontier(points):
    """Points no other point beats in both coordinates (lower is better), by all pairs."""
    return {p for p in points
            if not any(q[0] <= p[0] and q[1] <= p[1] and (q[0] < p[0] or q[1] < p[1]) for q in points)}


def test_headline_states_the_best_the_given_strategy_and_the_counts(search, page):
    res, _bound, yours = search
    head = parse(page).headline
    assert head[0].startswith(f"best: {res.best.strategy.label()}: ")
    assert "s per iteration" in head[0] and "GiB per GPU" in head[0] and "MFU" in head[0]
    assert head[1] == f"yours: tp2 pp2 dp2 mb2 zb-h1: {yours.describe()}"
    assert "outside the searched space (not searched: schedule zb-h1)" in head[1]
    rows = res.table.to_pylist()
    slow = sum(1 for r in rows if r["why"] and "max_iteration_time" in r["why"])
    assert slow > 0 and f"{slow} too slow" in head[2]


def test_every_estimated_strategy_is_a_dot_and_the_frontier_is_the_non_dominated_ranked_ones(search, page):
    res, bound, _yours = search
    data, layout = plots(page)["tradeoff-memory"]
    dots = [t for t in data if t["name"] in ("1f1b", "interleaved-1f1b", "not ranked (too big or too slow)")]
    rows = [r for r in res.table.to_pylist() if math.isfinite(r["iteration_time"])]
    assert sum(len(t["x"]) for t in dots) == len(rows)
    grey = next(t for t in data if t["name"].startswith("not ranked"))
    assert len(grey["x"]) == sum(1 for r in rows if r["rank"] is None)
    frontier = next(t for t in data if t["name"] == "Pareto frontier")
    ranked = {(float(f"{r['memory_per_gpu'] / GIB:.6g}"), float(f"{r['iteration_time']:.6g}"))
              for r in rows if r["rank"] is not None}
    assert set(zip(frontier["x"], frontier["y"])) == _brute_frontier(ranked)
    best = next(t for t in data if t["name"].startswith("best: "))
    assert best["y"] == [pytest.approx(res.best.iteration_time, rel=1e-5)]
    # Units on both axes; the GPU's memory and the time bound drawn as lines.
    assert "(GiB" in layout["xaxis"]["title"]["text"] and "(s" in layout["yaxis"]["title"]["text"]
    hbm = NODE.pools[0].gpu.hbm_bytes / GIB
    assert any(s["x0"] == hbm for s in layout["shapes"])
    assert any(s.get("y0") == bound for s in layout["shapes"])
    assert "tradeoff-cost" not in plots(page)  # ranked by time: no cost chart


def test_each_top_plan_bar_sums_to_its_iteration_time_and_its_memory(search, page):
    res, _bound, _yours = search
    ranked = [r for r in res.table.to_pylist() if r["rank"] is not None][:5]
    by_label = {e.strategy.label(): e for e in res.estimates.values()}
    for div, total in (("breakdown-time", lambda e: e.iteration_time),
                       ("breakdown-memory", lambda e: e.memory_per_gpu / GIB)):
        data, layout = plots(page)[div]
        assert data[0]["y"] == [f"{r['rank']}. {r['strategy']}" for r in ranked]
        for i, r in enumerate(ranked):
            assert sum(t["x"][i] for t in data) == pytest.approx(total(by_label[r["strategy"]]), rel=1e-5)
        assert re.search(r"\((s|GiB)\)", layout["xaxis"]["title"]["text"])
    data, _layout = plots(page)["best-memory"]
    assert sum(t["x"][0] for t in data) == pytest.approx(res.best.memory_per_gpu / GIB, rel=1e-5)


def test_the_best_plans_timeline_is_its_simulated_pipeline_in_seconds(search, page):
    res, _bound, _yours = search
    data, layout = plots(page)["best-gantt"]
    ops = res.best.pipeline.ops
    busy = (ops.column("finish").to_numpy() > ops.column("start").to_numpy()).sum()
    assert sum(len(t["x"]) for t in data if t["type"] == "bar") == busy
    assert layout["xaxis"]["title"]["text"] == "time (s)"
    assert layout["xaxis"]["range"][1] == pytest.approx(res.best.pipeline.makespan, rel=0.01)


def test_the_table_lists_the_top_plans_best_first(search, page):
    res, _bound, _yours = search
    text = parse(page)
    ranked = [r for r in res.table.to_pylist() if r["rank"] is not None][:5]
    assert [row[:2] for row in text.summary_rows] == [[str(r["rank"]), r["strategy"]] for r in ranked]
    assert text.summary_head[2].startswith("s/iter")


def test_cost_objective_adds_time_against_cost(tmp_path):
    res = strategies(ARCH, NODE, 32, objective="cost", schedules=("1f1b",), zero=(1,), recompute=("none",),
                     microbatch_sizes=(2,))
    text = plan_report(res, tmp_path / "cost.html", ARCH, NODE, 32).read_text()
    _data, layout = plots(text)["tradeoff-cost"]
    assert "dollars per million tokens" in layout["xaxis"]["title"]["text"]
    # One pool at one price: cost is proportional to time, and the page says so.
    assert "cost is proportional to iteration time" in text
    assert "Ranked by cost per million tokens" in text


def test_a_search_where_nothing_ranks_still_gets_a_page_that_says_so(tmp_path):
    huge = pc.Architecture.preset("megatron-1t")
    res = strategies(huge, NODE, 8, schedules=("1f1b",), zero=(0,), recompute=("none",),
                     microbatch_sizes=(1,))
    assert res.best is None
    text = plan_report(res, tmp_path / "none.html", huge, NODE, 8).read_text()
    assert parse(text).headline[0].startswith("no strategy ranks")
    assert set(plots(text)) == {"tradeoff-memory"}


@pytest.mark.parametrize(("kwargs", "words"), [
    (dict(top=0), ["'top' must be an int >= 1", "0"]),
    (dict(marks={"mine": "tp=2"}), ["mark 'mine' must be a Ranking"]),
    (dict(global_batch=64), ["global_batch 64 is not the search's"]),
])
def test_bad_report_arguments_are_named(search, tmp_path, kwargs, words):
    res = search[0]
    args = dict(global_batch=32) | kwargs
    with pytest.raises(pc.InputError) as info:
        plan_report(res, tmp_path / "x.html", ARCH, NODE, **args)
    for word in words:
        assert word in str(info.value)


def test_plan_report_option_writes_the_page(tmp_path, capsys):
    out = tmp_path / "plan.html"
    code = main(["plan", "--model", "megatron-1.7b", "--cluster", "dgx-a100", "--nodes", "1",
                 "--global-batch", "32", "--top", "3", "--report", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    assert f"wrote {out} (the report page" in text
    assert {"tradeoff-memory", "best-gantt", "breakdown-time"} <= set(plots(out.read_text()))
    assert len(parse(out.read_text()).summary_rows) == 3


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (Debian: apt-get install chromium)")
def test_the_page_renders_in_a_browser_with_no_console_message(page, tmp_path):
    import matplotlib.image as mpimg

    path = tmp_path / "plan.html"
    path.write_text(page)
    shot = tmp_path / "shot.png"
    args = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp_path / 'profile'}", "--enable-logging=stderr", "--v=0",
            "--virtual-time-budget=8000", "--dump-dom", f"--screenshot={shot}", "--window-size=1200,900",
            path.resolve().as_uri()]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert [line for line in done.stderr.splitlines() if ":CONSOLE" in line] == []
    rendered = set(re.findall(r'id="([^"]+)" class="plot[^"]*js-plotly-plot"', done.stdout))
    assert rendered == set(plots(page))
    pixels = mpimg.imread(shot)[..., :3]
    assert pixels.std() > 0.05 and (pixels.mean(axis=2) < 0.5).mean() > 0.005  # not blank

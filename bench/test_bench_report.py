"""Issue 15's time bars: the Jupyter views (< 100 ms at p=8, m=32) and the
HTML report of the main job's 17 families, measured here rather than in
timed unit tests. Run: pytest bench/test_bench_report.py --benchmark-only
"""

import pytest
from sizes import pick

import pipecore as pc
from pipecore.analysis.compare import compare

pytest.importorskip("plotly", reason="reports need the pipecore[plot] extra")
UNIT = pc.Costs(f=1.0, b=1.0, w=1.0)
P, M = pick((8, 32), (4, 8))


@pytest.fixture(scope="module")
def result():
    return pc.simulate(pc.build("zb-v", P, M), UNIT)


def test_result_repr_html(benchmark, result):
    benchmark.group = "jupyter views"
    benchmark.name = f"Result._repr_html_ zb-v p={P} m={M}"
    html = benchmark(result._repr_html_)
    assert "<svg" in html


def test_schedule_repr_html(benchmark, result):
    benchmark.group = "jupyter views"
    benchmark.name = f"Schedule._repr_html_ zb-v p={P} m={M}"
    html = benchmark(result.schedule._repr_html_)
    assert "<table" in html


def test_compare_report(benchmark, tmp_path):
    rows = compare(P, M, costs=UNIT)
    benchmark.group = "html report"
    benchmark.name = f"pc.report of compare's 17 families p={P} m={M}"
    path = benchmark.pedantic(pc.report, (rows, tmp_path / "r.html"), rounds=3, iterations=1)
    assert path.stat().st_size < 6e6


def test_compare_gantts(benchmark, tmp_path, monkeypatch):
    """The main job's 17 Gantt charts on one time scale (one process: the
    work, not the second process that ``pipecore compare`` adds)."""
    pytest.importorskip("matplotlib", reason="Gantt charts need the pipecore[plot] extra")
    from pipecore.output import gantt

    rows = [r for r in compare(P, M, costs=UNIT) if r["result"] is not None]
    jobs = [(r["result"], tmp_path / f"{r['name']}.png") for r in rows]
    gantt.write_gantts(jobs[:1])  # matplotlib imported and its fonts loaded
    benchmark.group = "gantt charts"
    benchmark.name = f"write_gantts of compare's {len(jobs)} families p={P} m={M}, one process"
    monkeypatch.setattr(gantt, "local_cpus", lambda: 1)
    out = benchmark.pedantic(gantt.write_gantts, (jobs,), rounds=3, iterations=1)
    assert len(out) == len(jobs)

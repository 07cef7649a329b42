"""``pipecore compare`` draws its Gantt charts on one time scale, in two
processes (a forked child takes every other chart): the charts of a run
must share their size and axis, the files must be the ones one process
writes, and a child that fails must cost nothing but time."""

from __future__ import annotations

import os

import pytest

import pipecore as pc
from pipecore.output import gantt

pytest.importorskip("matplotlib", reason="the Gantt charts need pipecore[plot]")

NAMES = ["gpipe", "1f1b", "zb-h1", "zb-h2", "eager-1f1b"]


class _Bar:
    def __init__(self):
        self.count = 0
        self.final = 0

    def update(self, n, final=False):
        self.count += n
        self.final += bool(final)


def _jobs(folder):
    costs = pc.Costs(f=1, b=1, w=1)
    return [(pc.simulate(pc.build(name, 4, 8), costs), folder / f"{name}.png") for name in NAMES]


def _draw(jobs, monkeypatch, cpus):
    monkeypatch.setattr(gantt, "local_cpus", lambda: cpus)
    bar = _Bar()
    written = gantt.write_gantts(jobs, bar)
    # Every chart counted once, and the bar told once that it is done.
    assert (bar.count, bar.final) == (len(jobs), 1)
    return written


def _png(path):
    from PIL import Image

    with Image.open(path) as im:
        return dict(im.text), im.size


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the two-process path needs os.fork")
def test_two_processes_write_the_files_one_process_writes(tmp_path, monkeypatch):
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = _draw(_jobs(tmp_path / "one"), monkeypatch, cpus=1)
    two = _draw(_jobs(tmp_path / "two"), monkeypatch, cpus=2)
    assert one == [str(tmp_path / "one" / f"{n}.png") for n in NAMES]
    assert two == [str(tmp_path / "two" / f"{n}.png") for n in NAMES]
    for name in NAMES:
        assert (tmp_path / "one" / f"{name}.png").read_bytes() == \
            (tmp_path / "two" / f"{name}.png").read_bytes(), name


@pytest.mark.skipif(not hasattr(os, "fork"), reason="the two-process path needs os.fork")
def test_charts_the_child_did_not_finish_are_drawn_by_the_parent(tmp_path, monkeypatch):
    parent = os.getpid()
    real = gantt._Frame.render
    drawn_here = []

    def flaky(frame, chart, out, *args, **kwargs):
        if os.getpid() != parent:
            if out.name == "zb-h2.png":
                raise RuntimeError("child fails on its second chart")
        else:
            drawn_here.append(out.name)
        return real(frame, chart, out, *args, **kwargs)

    monkeypatch.setattr(gantt._Frame, "render", flaky)
    written = _draw(_jobs(tmp_path), monkeypatch, cpus=2)
    assert written == [str(tmp_path / f"{n}.png") for n in NAMES]
    # The child drew 1f1b (index 1) and failed on zb-h2 (index 3): the
    # parent drew its own (0, 2, 4) and then zb-h2.
    assert drawn_here == ["gpipe.png", "zb-h1.png", "eager-1f1b.png", "zb-h2.png"]
    for name in NAMES:
        assert (tmp_path / f"{name}.png").stat().st_size > 1000, name


def test_an_error_in_the_parent_is_raised(tmp_path, monkeypatch):
    def broken(frame, chart, out, *args, **kwargs):
        raise OSError(f"cannot write {out}")

    monkeypatch.setattr(gantt._Frame, "render", broken)
    with pytest.raises(OSError, match="gpipe.png"):
        _draw(_jobs(tmp_path), monkeypatch, cpus=2)


def test_the_charts_of_a_run_share_size_and_time_axis(tmp_path, monkeypatch):
    """Issue 52: charts of different widths and time scales cannot be compared."""
    written = _draw(_jobs(tmp_path), monkeypatch, cpus=1)
    sizes = {_png(p)[1] for p in written}
    assert len(sizes) == 1, sizes
    # 1F1B at p=4, m=8, f=b=w=1 takes (m + p - 1)(f + b + w) = 33 (its closed
    # form), the slowest here; ZB-H1 takes m (f + b + w) + (p - 1)(f + b - w)
    # = 27 (the zero-bubble paper's H1 bubble). Every chart's axis runs to 33.
    ends = {n: pc.simulate(pc.build(n, 4, 8), pc.Costs(f=1, b=1, w=1)).makespan for n in NAMES}
    assert ends["1f1b"] == max(ends.values()) == 33.0 and ends["zb-h1"] == 27.0
    axes = {_png(p)[0]["pipecore:time_axis"] for p in written}
    assert len(axes) == 1 and axes.pop().startswith("0 to 33 cost units over pixels ")
    for name, path in zip(NAMES, written):
        legend = _png(path)[0]["pipecore:legend"].split(" | ")
        # A faster schedule's chart marks its own end on the shared axis.
        assert (f"makespan {ends[name]:g}" in legend) == (ends[name] < 33.0), name


def test_one_chart_alone_ends_at_its_makespan(tmp_path):
    res = pc.simulate(pc.build("zb-h1", 4, 8), pc.Costs(f=1, b=1, w=1))
    text, _ = _png(gantt.write_gantt(res, tmp_path / "one.png"))
    assert not any(e.startswith("makespan") for e in text["pipecore:legend"].split(" | "))

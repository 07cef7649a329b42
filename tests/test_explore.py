"""pc.explore and the construction kernel's timing mode.

Golden values: pipecore.simulate (core/compile.py and the list scheduler of
kernels/listsched.py, which tests/reference.py checks) times every
composed schedule independently of the construction's timing mode; tune's
winner is the bar explore must meet.
"""

from __future__ import annotations

import math
import random

import numpy as np
import pytest

import pipecore as pc
from pipecore.schedules import compose as C
from pipecore.search.explore import Composition, default_space

pytestmark = pytest.mark.kernels


def _random_case(rng):
    p = rng.randint(1, 4)
    S = rng.randint(p, 3 * p)
    placement = list(range(p)) + [rng.randrange(p) for _ in range(S - p)]
    rng.shuffle(placement)
    m = rng.randint(1, 6)
    order = rng.choice([pc.orders.one_f_one_b(), pc.orders.greedy(inflight=2),
                        pc.orders.breadth_first(), pc.orders.one_f_one_b("fill", inflight=3),
                        pc.orders.rotate(), pc.orders.depth_first(group=2)])
    split = rng.random() < 0.6
    w = None
    if split and order.policy != "rotate":
        w = rng.choice(["with", "late", "bubbles", "staggered", 1])
    costs = pc.Costs(f=rng.uniform(0.5, 2), b=rng.uniform(0.5, 2), w=rng.uniform(0, 1),
                     comm=rng.uniform(0, 0.5), activation=1.0,
                     activation_w=rng.uniform(0, 1), weights=rng.uniform(0, 2),
                     overhead=rng.choice([0.0, 0.05]))
    network = rng.choice([
        None,
        pc.Network(bytes=rng.uniform(0.1, 1), bandwidth=rng.uniform(0.5, 4), latency=0.1),
        pc.Network(bytes=1.0, bandwidth=2.0, devices_per_node=2, inter_bandwidth=0.5,
                   inter_latency=0.3)])
    return placement, m, order, split, w, costs, network


def test_timing_mode_equals_simulate():
    rng = random.Random(41)
    checked = 0
    for _ in range(300):
        placement, m, order, split, w, costs, network = _random_case(rng)
        try:
            sched = pc.compose(placement=placement, microbatches=m, order=order,
                               split_backward=split, w=w)
        except pc.ScheduleError:
            continue
        pl = pc.placements.resolve(placement)
        rule = None if order.policy == "rotate" else (w if not split or w else "staggered")
        _cols, tm = C._run(pl, m, order, split, rule if split else None,
                           C.timing(pl, m, costs, network))
        res = pc.simulate(sched, costs, network)
        assert tm.end[0] == pytest.approx(res.makespan, rel=1e-12, abs=1e-12)
        np.testing.assert_allclose(tm.peak, res.peak_activation, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(tm.free - tm.begin, res.span, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(tm.busy, res.busy, rtol=1e-12, atol=1e-12)
        checked += 1
    assert checked >= 250


def test_explore_never_slower_than_tune_and_says_what_it_tried():
    costs = pc.Costs(f=1.0, b=1.3, w=0.7, comm=0.05)
    got = pc.explore(4, 16, costs, memory_limit=4.5, progress=False)
    tuned = pc.tune(4, 16, costs, memory_limit=4.5, progress=False)
    assert got.result.makespan <= tuned.result.makespan * (1 + 1e-12)
    assert float((got.result.peak_activation + got.result.static_memory).max()) <= 4.5 + 1e-9
    table = got.candidates
    sources = table.column("source").to_pylist()
    assert sources.count("screened") == len(default_space(4, 16))
    notes = [n for n, s in zip(table.column("note").to_pylist(), sources) if s == "screened"]
    assert any(n.startswith("deadlock: ") for n in notes)
    assert "winner (makespan)" in got.report(3)


def test_explore_beats_tune_on_a_study_case():
    # Case 11 of the issue 41 study (the closing note: random scalar costs, p=4,
    # m=16, a limit below 1F1B's peak): Megatron's fixed streams on 8 chunks
    # with ZB-H2's W lag 2d, which no family has, plus recompute, beats every
    # family, generator, recompute and polish of tune (63.77).
    costs = pc.Costs(f=0.9659894591599337, b=1.916363366814285, w=0.5410693040167089,
                     comm=0.010218761674816846, activation=1.0,
                     activation_w=0.4055815029458011, weights=0.5)
    got = pc.explore(4, 16, costs, memory_limit=2.776562405090924, progress=False)
    tuned = pc.tune(4, 16, costs, memory_limit=2.776562405090924, progress=False)
    assert got.result.makespan < tuned.result.makespan * (1 - 1e-6)
    assert got.label.startswith("looped8/") and "recompute" in got.label


def test_explore_with_a_given_space():
    space = [Composition(pc.placements.v(2), pc.orders.one_f_one_b(inflight=k), True, "bubbles")
             for k in (1, 2, 3)]
    got = pc.explore(2, 6, pc.Costs(), space=space, include_tune=False, polish=False,
                     progress=False)
    assert got.candidates.num_rows == 3  # the winner is one of the screened rows
    assert got.schedule.params["composition"]["placement"] == "v"


@pytest.mark.parametrize("kwargs, message", [
    (dict(memory_limit=0), "'memory_limit' must be a number > 0"),
    (dict(costs="fast"), "'costs' must be a pipecore.Costs"),
    (dict(space=["1f1b"]), "'space' holds str"),
    (dict(space=[Composition(pc.placements.linear(3), pc.orders.greedy(), False, None)]),
     "places on 3 devices, not devices=2"),
    (dict(costs=pc.Costs(offload=1.0)), "does not offload"),
])
def test_explore_bad_input(kwargs, message):
    with pytest.raises(ValueError, match=message):
        pc.explore(2, 4, **kwargs)


def test_explore_nothing_fits():
    with pytest.raises(pc.TuneError, match="nothing fits") as err:
        pc.explore(2, 4, pc.Costs(weights=5.0), memory_limit=1.0, include_tune=False,
                   progress=False)
    assert math.isfinite(err.value.smallest_limit)


def test_cli_explore(capsys, tmp_path):
    import json

    from pipecore.cli import main

    page = tmp_path / "explore.html"
    assert main(["explore", "-p", "2", "-m", "4", "--b", "2", "--memory-limit", "3",
                 "--top", "3", "--out", str(page), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("winner (makespan): ") and f"wrote {page}" in out
    assert page.stat().st_size > 10_000
    assert main(["explore", "-p", "2", "-m", "4", "--json", "--no-tune", "--no-progress"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["composition"]["device_of"] and len(got["candidates"]) == len(default_space(2, 4))
    assert main(["explore", "-p", "2", "-m", "4", "--weights", "5", "--memory-limit", "1",
                 "--no-tune", "--no-progress"]) == 1
    assert "nothing fits memory_limit=1" in capsys.readouterr().err

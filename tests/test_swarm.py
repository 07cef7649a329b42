"""pc.swarm: SWARM-style pipelines of unequal, unreliable replicas.

Golden values are hand-worked below (each test says how) or closed forms:
the capacity of a stage is the sum of its replicas' speeds over its work
per microbatch; a random split of the load that ignores speed is limited by
the slowest replica's share; 1F1B over m microbatches on p equal stages
takes (m + p - 1)(f + b) (Narayanan et al., SC'21, the bubble (p-1)(f+b)).
The property tests check every run's request log against the model's rules
with code of their own (``_check_log``), not the simulator's.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipecore as pc
from pipecore.analysis.swarm import ROUTINGS


def _check_log(res, speeds, f, b, comm, microbatches, failures=()):
    """The request log obeys the model: each request done once, no replica
    runs two at once or while away, dependencies and transfer times kept,
    each done request takes its work over its replica's speed."""
    t = res.requests
    S = len(speeds)
    done = ~t["lost"]
    keys = list(zip(t["microbatch"][done], t["stage"][done], t["kind"][done]))
    assert len(keys) == len(set(keys)) == 2 * S * microbatches
    finish = {k: x for k, x in zip(keys, t["finish"][done])}
    start = {k: x for k, x in zip(keys, t["start"][done])}
    eps = 1e-9
    for (mb, s, kind), st0 in start.items():
        if kind == 0 and s > 0:
            assert st0 >= finish[(mb, s - 1, 0)] + comm[s - 1] - eps
        if kind == 1 and s == S - 1:
            assert st0 >= finish[(mb, s, 0)] - eps
        if kind == 1 and s < S - 1:
            assert st0 >= finish[(mb, s + 1, 1)] + comm[s + 1] - eps
    work = np.where(t["kind"] == 0, np.asarray(f)[t["stage"]], np.asarray(b)[t["stage"]])
    speed = np.array([speeds[s][r] for s, r in zip(t["stage"], t["replica"])])
    assert np.allclose((t["finish"] - t["start"])[done], (work / speed)[done])
    assert np.all((t["finish"] - t["start"])[~t["lost"]] > 0)
    assert math.isclose(res.lost_work, float((t["finish"] - t["start"])[t["lost"]].sum()), abs_tol=1e-9)
    assert res.lost_requests == int(t["lost"].sum())
    for s in range(S):
        for r in range(len(speeds[s])):
            mine = (t["stage"] == s) & (t["replica"] == r)
            order = np.argsort(t["start"][mine], kind="stable")
            st_, fi = t["start"][mine][order], t["finish"][mine][order]
            assert np.all(st_[1:] >= fi[:-1] - eps), f"replica ({s}, {r}) runs two requests at once"
            for fs, fr, leave, rejoin in failures:
                if (fs, fr) == (s, r):
                    inside = (st_ < rejoin - eps) & (fi > leave + eps)
                    assert not inside.any(), f"replica ({s}, {r}) runs while away"
    for row in res.utilisation:
        assert np.all(row >= 0) and np.all(row <= 1 + 1e-9)


# -- hand-worked cases -------------------------------------------------------

def test_one_stage_equal_replicas_split_the_work_evenly():
    # 2 replicas, f = b = 1: 100 microbatches are 200 units of work, 100 each.
    res = pc.swarm(stages=1, replicas=2, costs=pc.Costs(f=1, b=1), microbatches=100, fixed=None)
    assert res.makespan == 100.0
    assert res.capacity == 1.0
    assert res.throughput == 1.0


def test_a_chain_of_single_replicas_with_one_trainer_adds_every_time_up():
    # in_flight=1: one microbatch at a time through 3 stages; per microbatch the
    # forward 1+2+3, backward 2+1+1, hops 0.5+0.25 forward (sent by stages 0, 1)
    # and 0.25+0.125 backward (sent by stages 1, 2): 11.125 each, 5 of them.
    costs = pc.Costs(f=[1, 2, 3], b=[2, 1, 1], comm=[0.5, 0.25, 0.125])
    res = pc.swarm([[1], [1], [1]], costs=costs, microbatches=5, in_flight=1, fixed=None)
    assert res.makespan == pytest.approx(5 * 11.125)
    _check_log(res, [[1], [1], [1]], [1, 2, 3], [2, 1, 1], [0.5, 0.25, 0.125], 5)


def test_equal_replicas_reach_the_bottleneck_capacity():
    # 3 stages of 2 replicas, f + b = 3: capacity 2/3 microbatch per unit time.
    res = pc.swarm(stages=3, replicas=2, costs=pc.Costs(f=1, b=2), microbatches=600, fixed=None)
    assert res.capacity == pytest.approx(2 / 3)
    assert res.throughput <= res.capacity
    assert res.steady_throughput == pytest.approx(2 / 3, rel=0.02)


@pytest.mark.parametrize("routing, expected, rel", [
    ("throughput", 0.5, 0.01),     # the 2:1 split the speeds allow: 1/3 + 1/6
    ("proportional", 0.5, 0.01),
    ("queue", 0.5, 0.01),
    ("uniform", 1 / 3, 0.03),      # half the load to the slow one: 6 x/2 <= 1
])
def test_a_twice_slower_replica_under_each_routing(routing, expected, rel):
    # One stage, speeds 1 and 0.5, f + b = 3: the replicas take 3 and 6 per microbatch.
    res = pc.swarm([[1.0, 0.5]], costs=pc.Costs(f=1, b=2), microbatches=3000, routing=routing,
                   in_flight=64, fixed=None)
    assert res.steady_throughput == pytest.approx(expected, rel=rel)
    assert res.throughput <= res.capacity == 0.5


def test_a_departure_loses_the_running_request_and_it_runs_again_elsewhere():
    # One stage, two equal replicas, one trainer (in_flight=1), f = b = 1: 20
    # requests of 1 run back to back. Routing 'queue' keeps replica 0 (ties go
    # to the lower index); it leaves at 5.5, 0.5 into the 6th request, which
    # runs again on replica 1 after the 0.25 retry: 20 + 0.5 + 0.25.
    res = pc.swarm([[1, 1]], costs=pc.Costs(f=1, b=1), microbatches=10, in_flight=1, routing="queue",
                   failures=[(0, 0, 5.5, 100.0)], retry=0.25, fixed=None)
    assert res.makespan == pytest.approx(20.75)
    assert res.lost_work == pytest.approx(0.5)
    assert res.lost_requests == 1
    assert res.downtime[0][0] == [(5.5, 100.0)]
    # Up 5.5 of 20.75 on replica 0 and busy 5 of them; replica 1 busy 15 of 20.75.
    assert res.utilisation[0] == pytest.approx([5 / 5.5, 15 / 20.75])
    _check_log(res, [[1, 1]], [1], [1], [0], 10, [(0, 0, 5.5, 100.0)])


def test_a_request_finishing_as_its_replica_leaves_counts_as_done():
    # As above but replica 0 leaves at 5.0, the instant its 5th request ends:
    # nothing is lost, the 6th request starts on replica 1 at 5.0.
    res = pc.swarm([[1, 1]], costs=pc.Costs(f=1, b=1), microbatches=10, in_flight=1, routing="queue",
                   failures=[(0, 0, 5.0, 100.0)], fixed=None)
    assert res.makespan == 20.0
    assert res.lost_requests == 0 and res.lost_work == 0.0
    t = res.requests
    assert list(t["replica"]) == [0] * 5 + [1] * 15


def test_a_rejoining_replica_takes_requests_again():
    # Replica 1 is away over [0.5, 50); with SWARM's balancer it gets requests
    # after it rejoins (it starts at the least load).
    res = pc.swarm([[1, 1]], costs=pc.Costs(f=1, b=1), microbatches=200, failures=[(0, 1, 0.5, 50.0)],
                   fixed=None)
    t = res.requests
    later = (t["replica"] == 1) & (t["start"] >= 50.0) & ~t["lost"]
    assert later.sum() > 50
    assert not ((t["replica"] == 1) & (t["start"] > 0.5) & (t["start"] < 50.0)).any()


# -- the fixed pipeline -------------------------------------------------------

def test_fixed_pipelines_follow_the_1f1b_closed_form():
    # 2 pipelines of 4 stages, 10 iterations of 10 microbatches each:
    # (10 + 4 - 1) x 3 = 39 per iteration, 200 microbatches in 390.
    res = pc.swarm(stages=4, replicas=2, costs=pc.Costs(f=1, b=2), microbatches=200, fixed_mode="pipelines")
    fx = res.fixed
    assert fx["mode"] == "pipelines" and fx["schedule"] == "1f1b" and fx["shares"] == [10, 10]
    assert fx["iteration"] == 39.0
    assert fx["makespan"] == 390.0
    assert fx["throughput"] == pytest.approx(200 / 390)
    assert res.speedup == pytest.approx(res.throughput / fx["throughput"])


def test_weighted_pipelines_share_the_microbatches_by_speed():
    # One stage, replicas at speeds 1 and 0.5, f + b = 3: they take 3 and 6 per
    # microbatch. 300 microbatches in 10 iterations of 30: equal shares (15, 15)
    # wait for the slow one, 90 per iteration (throughput 1/3); shares by rate
    # (20, 10) take 60 on both (throughput 1/2, the capacity).
    kw = dict(costs=pc.Costs(f=1, b=2), microbatches=300)
    equal = pc.swarm([[1.0, 0.5]], fixed_mode="pipelines", **kw).fixed
    weighted = pc.swarm([[1.0, 0.5]], **kw).fixed
    assert equal["shares"] == [15, 15] and equal["iteration"] == 90.0
    assert equal["throughput"] == pytest.approx(1 / 3)
    assert weighted["mode"] == "weighted" and weighted["shares"] == [20, 10]
    assert weighted["iteration"] == 60.0 and weighted["throughput"] == pytest.approx(0.5)


def test_a_fixed_pipeline_restarts_the_iteration_a_departure_cuts():
    # One pipeline of 2 stages, 2 iterations of 10 microbatches, f = b = 1:
    # (10 + 1) x 2 = 22 each. Stage 1 leaves over [30, 40): the second
    # iteration (from 22) loses 8 and runs again from 40, ending at 62.
    res = pc.swarm([[1], [1]], costs=pc.Costs(f=1, b=1), microbatches=20, fixed_iterations=2,
                   failures=[(1, 0, 30, 40)])
    assert res.fixed["makespan"] == 62.0
    assert res.fixed["lost_work"] == 8.0
    assert res.fixed["throughput"] == pytest.approx(20 / 62)


def test_a_fixed_pipeline_without_a_device_that_never_returns_never_finishes():
    res = pc.swarm([[1, 1]], costs=pc.Costs(f=1, b=1), microbatches=20, failures=[(0, 1, 3.0, None)])
    assert math.isinf(res.fixed["makespan"]) and res.fixed["throughput"] == 0.0
    assert res.speedup == math.inf
    assert "never finishes" in res.report()
    assert math.isfinite(res.makespan)


def test_split_mode_runs_each_stage_at_its_slowest_replicas_share():
    # Stage 0: two replicas, the slower at 0.5, each half a microbatch: time
    # f / (2 x 0.5) = f; stage 1: one replica at speed 1. Hand-scaled costs
    # on one pipeline give the same iteration.
    res = pc.swarm([[1.0, 0.5], [1.0]], costs=pc.Costs(f=1, b=2), microbatches=40, fixed_iterations=4)
    assert res.fixed["mode"] == "split"
    ref = pc.simulate(pc.build("1f1b", 2, 10), pc.Costs(f=[1.0, 1.0], b=[2.0, 2.0], w=0.0))
    assert res.fixed["iteration"] == ref.makespan
    with pytest.raises(ValueError, match="same replica count"):
        pc.swarm([[1.0, 0.5], [1.0]], microbatches=40, fixed_mode="pipelines")


# -- reproducibility, properties ----------------------------------------------

def test_the_same_seed_gives_the_same_run():
    kw = dict(costs=pc.Costs(f=1, b=2, comm=0.1), microbatches=100, routing="uniform", churn=(40.0, 10.0))
    a = pc.swarm([[1, 0.7], [1, 1, 0.5]], seed=3, **kw)
    b = pc.swarm([[1, 0.7], [1, 1, 0.5]], seed=3, **kw)
    c = pc.swarm([[1, 0.7], [1, 1, 0.5]], seed=4, **kw)
    for k in a.requests:
        assert np.array_equal(a.requests[k], b.requests[k])
    assert a.fixed == b.fixed
    assert a.makespan != c.makespan


@st.composite
def _configs(draw):
    S = draw(st.integers(1, 3))
    speeds = [draw(st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=1, max_size=3)) for _ in range(S)]
    f = draw(st.lists(st.sampled_from([0.5, 1.0, 1.5]), min_size=S, max_size=S))
    b = draw(st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=S, max_size=S))
    comm = draw(st.lists(st.sampled_from([0.0, 0.25]), min_size=S, max_size=S))
    failures = []
    for s in range(S):
        for r in range(len(speeds[s])):
            if draw(st.booleans()):
                leave = draw(st.sampled_from([0.0, 1.25, 3.0, 7.5]))
                gone = r > 0 and draw(st.booleans())  # replica 0 always comes back
                failures.append((s, r, leave, None if gone else leave + draw(st.sampled_from([0.5, 4.0]))))
    return dict(speeds=speeds, f=f, b=b, comm=comm, failures=failures,
                microbatches=draw(st.integers(1, 12)), in_flight=draw(st.integers(1, 8)),
                routing=draw(st.sampled_from(ROUTINGS)), retry=draw(st.sampled_from([0.0, 0.3])),
                seed=draw(st.integers(0, 3)))


@settings(max_examples=80, deadline=None)
@given(_configs())
def test_every_run_keeps_the_models_rules(cfg):
    res = pc.swarm(cfg["speeds"], costs=pc.Costs(f=cfg["f"], b=cfg["b"], comm=cfg["comm"]),
                   microbatches=cfg["microbatches"], in_flight=cfg["in_flight"], routing=cfg["routing"],
                   failures=cfg["failures"], retry=cfg["retry"], seed=cfg["seed"], fixed=None)
    down = [(s, r, leave, math.inf if rejoin is None else rejoin) for s, r, leave, rejoin in cfg["failures"]]
    _check_log(res, cfg["speeds"], cfg["f"], cfg["b"], cfg["comm"], cfg["microbatches"], down)
    # No routing beats the capacity bound (every replica up), whatever fails.
    assert res.throughput <= res.capacity * (1 + 1e-12)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from([0.5, 1.0, 2.0]), min_size=1, max_size=3),
       st.sampled_from(ROUTINGS), st.integers(1, 6), st.integers(0, 3))
def test_replicas_serve_their_queue_first_in_first_out_without_idling(speeds, routing, in_flight, seed):
    # Without failures a replica starts each request at its arrival or when the
    # one before it finished, in arrival order.
    res = pc.swarm([speeds, [1.0]], costs=pc.Costs(f=1, b=1), microbatches=10, in_flight=in_flight,
                   routing=routing, seed=seed, fixed=None)
    t = res.requests
    for r in range(len(speeds)):
        mine = (t["stage"] == 0) & (t["replica"] == r)
        order = np.argsort(t["start"][mine], kind="stable")
        arrive, start, finish = (t[k][mine][order] for k in ("arrive", "start", "finish"))
        assert np.all(np.diff(arrive) >= 0)
        prev = np.concatenate([[0.0], finish[:-1]])
        assert np.allclose(start, np.maximum(arrive, prev))


# -- bad input ---------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    (dict(), "give 'speeds'"),
    (dict(speeds=[[1.0, 0.0]]), r"speed of stage 0 replica 1 must be a finite number > 0"),
    (dict(speeds=[[1.0], 2.0]), r"'speeds'\[1\] must be a list"),
    (dict(speeds=[[1.0], []]), r"'speeds'\[1\] must be a non-empty list"),
    (dict(stages=2, replicas=[1, 2, 3]), "3 entries but there are 2 stages"),
    (dict(stages=0, replicas=1), "'stages' must be >= 1"),
    (dict(speeds=[[1.0]], routing="random"), "'routing' must be one of throughput"),
    (dict(speeds=[[1.0]], microbatches=0), "'microbatches' must be >= 1"),
    (dict(speeds=[[1.0]], failures=[(1, 0, 1.0, 2.0)]), r"stage 1 is not one of 0..0"),
    (dict(speeds=[[1.0]], failures=[(0, 2, 1.0, 2.0)]), r"replica 2 is not one of stage 0's 0..0"),
    (dict(speeds=[[1.0]], failures=[(0, 0, 3.0, 2.0)]), "rejoin 2.0 must come after leave 3.0"),
    (dict(speeds=[[1.0, 1.0]], failures=[(0, 0, 1.0, 5.0), (0, 0, 2.0, 3.0)]),
     "stage 0 replica 0 leaves at 2.0 while it is still away"),
    (dict(speeds=[[1.0, 1.0]], failures=[(0, 0, 1.0, None), (0, 1, 2.0, None)]),
     "stage 0: every replica leaves for good"),
    (dict(speeds=[[1.0]], failures=[(0, 0, 1.0)]),
     r"failures\[0\] must be \(stage, replica, leave, rejoin\)"),
    (dict(speeds=[[1.0]], churn=(1.0,)), "'churn' must be"),
    (dict(speeds=[[1.0]], churn=(0.0, 1.0)), "churn mean_uptime must be > 0"),
    (dict(speeds=[[1.0]], churn=(5.0, 1.0), failures=[(0, 0, 1.0, 2.0)]), "not both"),
    (dict(speeds=[[1.0]], retry=-1.0), "'retry' must be >= 0"),
    (dict(speeds=[[1.0]], fixed_mode="ring"), "'fixed_mode' must be 'auto', 'pipelines', 'weighted'"),
    (dict(speeds=[[1.0, 1.0]], microbatches=15), "at least iterations x pipelines = 20"),
    (dict(speeds=[[1.0], [1.0]], fixed="interleaved-1f1b", microbatches=40), "one stage per device"),
    (dict(speeds=[[1.0]], fixed="pipedream"), "unknown schedule .pipedream."),
    (dict(speeds=[[1.0]], costs=pc.Costs(f=[1.0, 2.0])), "2 entries but the schedule has 1 stages"),
    (dict(speeds=[[1.0]], costs="fast"), "'costs' must be a pipecore.Costs"),
])
def test_bad_input_names_the_value_and_the_rule(kwargs, match):
    with pytest.raises(ValueError, match=match):
        pc.swarm(**kwargs)


def test_churn_faster_than_any_request_is_refused_not_a_hang():
    with pytest.raises(ValueError, match="makes no progress"):
        pc.swarm([[1.0]], costs=pc.Costs(f=10, b=10), microbatches=2, churn=(0.01, 0.01), fixed=None)


def test_report_says_units_and_direction():
    res = pc.swarm([[1.0, 0.5], [1.0, 1.0]], microbatches=40, churn=(60.0, 10.0))
    text = res.report()
    assert "microbatches per unit time (higher is better)" in text
    assert "(> 1: SWARM faster)" in text
    assert max(len(line) for line in text.splitlines()) <= 120

"""Properties of the public API on random schedules, costs and networks (issue 38,
item 6). Every invariant here is stated from the semantics (docs/semantics.md),
not from the code under test: a lower bound, a dependency order, two public
paths that must agree, memory that never goes below zero, and calls that repeat
bit for bit.

The README's test command draws 300 examples; CI's heavy run (``pytest -m heavy``)
draws 2,000 more with the ``ci`` profile, or ``PIPECORE_FUZZ=dev`` asks for the quick
one (200) and ``PIPECORE_FUZZ=huge`` for a long hunt (20,000).
"""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipecore as pc
from pipecore.testing import networks, schedules, times

settings.register_profile("quick", max_examples=300, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("ci", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("huge", max_examples=20000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
PROFILE = {"dev": "dev", "huge": "huge"}.get(os.environ.get("PIPECORE_FUZZ"), "ci")


@st.composite
def scalar_costs(draw):
    act = draw(times(allow_zero=False, max_value=4.0))
    return pc.Costs(f=draw(times()), b=draw(times()), w=draw(times()), comm=draw(times()),
                    activation=act, activation_w=draw(st.floats(0.0, 1.0)) * act,
                    weights=draw(times()), offload=draw(times()))


# No offload (simulate_many has no host links); F&B pairs and replicas included.
shapes = schedules(max_devices=5, max_stages=6, max_microbatches=5, offload=False)


def _producers(kind, stage, top):
    """(kind, stage offset) pairs an op of this kind waits for (docs/semantics.md)."""
    if kind == "F":
        return [("F", -1)] if stage > 0 else []
    if kind in ("B", "BW"):
        return [("F", 0)] + ([("B", 1), ("BW", 1)] if stage < top else [])
    if kind == "W":
        return [("B", 0)]
    return []


# One property test: a drawn schedule is the slow part of an example, so every check
# shares it (a third of the time of separate tests at the same number of examples).
@settings(settings.get_profile("quick"))
@given(shapes, scalar_costs(), networks(devices=5))
def test_public_api_invariants(sched, costs, network):
    _invariants(sched, costs, network)


@pytest.mark.heavy
@settings(settings.get_profile(PROFILE))
@given(shapes, scalar_costs(), networks(devices=5))
def test_public_api_invariants_long(sched, costs, network):
    _invariants(sched, costs, network)


def _invariants(sched, costs, network):
    res = pc.simulate(sched, costs, network)
    ops = res.ops
    start = ops.column("start").to_numpy()
    finish = ops.column("finish").to_numpy()
    device = ops.column("device").to_numpy()
    # Every op lies within the makespan, which is at least the busiest device's work.
    assert (start >= 0).all() and (finish >= start).all()
    assert (finish <= res.makespan + 1e-9).all()
    # The two ops of an overlapped F&B pair share a slot and run together: count it once.
    slot = ops.column("slot").to_numpy()
    first = np.ones(len(slot), dtype=bool)
    first[1:] = (device[1:] != device[:-1]) | (slot[1:] != slot[:-1])
    busy = np.bincount(device[first], weights=(finish - start)[first], minlength=sched.devices)
    assert res.makespan >= busy.max() * (1 - 1e-12) - 1e-12
    # Dependencies: an op never starts before its producers finish (on any replica of a
    # replicated stage the producer of the same microbatch runs on one device).
    done = {}
    rows = ops.select(["kind", "stage", "microbatch"]).to_pylist()
    for i, r in enumerate(rows):
        key = (r["kind"], r["stage"], r["microbatch"])
        done[key] = max(done.get(key, 0.0), finish[i])
    top = sched.stages - 1
    for i, r in enumerate(rows):
        for kind, offset in _producers(r["kind"], r["stage"], top):
            t = done.get((kind, r["stage"] + offset, r["microbatch"]))
            if t is not None:
                assert t <= start[i] + 1e-9, (r, kind, offset)
    # Activation never below zero, and never above the device's reported peak.
    mem = res.memory.table
    act = mem.column("activation").to_numpy()
    dev = mem.column("device").to_numpy()
    assert (act >= -1e-9).all()
    if act.size:
        top_act = np.full(sched.devices, -np.inf)
        np.maximum.at(top_act, dev, act)
        assert (top_act <= res.peak_activation + 1e-9).all()
    # The same call gives the same bits.
    again = pc.simulate(sched, costs, network)
    assert again.makespan == res.makespan and again.ops.equals(ops)
    # simulate_many, one row of the same costs, agrees with simulate.
    cols = {name: [float(getattr(costs, name))]
            for name in ("f", "b", "w", "comm", "activation", "activation_w", "weights")}
    if (sched.kind_codes == 5).any():  # R ops: their time defaults to f
        cols["r"] = [float(costs.f if costs.r is None else costs.r)]
    row = pc.simulate_many(sched, cols, network).to_pylist()[0]
    assert row["makespan"] == res.makespan
    # Ratios stay in their range (issue 52: rounding gave a bubble ratio of -2.2e-16).
    for ratio in (res.bubble_ratio, res.bubble_rate, row["bubble_ratio"], row["bubble_rate"]):
        assert 0.0 <= ratio <= 1.0, ratio
    assert row["peak_activation_max"] == pytest.approx(res.peak_activation.max(), abs=1e-9)
    assert row["error"] is None

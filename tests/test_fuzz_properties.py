"""Properties of the public API on random schedules, costs and networks (issue 38,
item 6). Every invariant here is stated from the semantics (docs/semantics.md),
not from the code under test: a lower bound, a dependency order, two public
paths that must agree, memory that never goes below zero, and calls that repeat
bit for bit.

The run takes the ``ci`` profile (2,000 examples per property) when
``PIPECORE_FUZZ=ci``, which .ci/run sets, and the default profile otherwise.
"""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipecore as pc
from pipecore.testing import networks, schedules, times

settings.register_profile("ci", max_examples=2000, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("dev", max_examples=200, deadline=None,
                          suppress_health_check=[HealthCheck.too_slow])
PROFILE = "ci" if os.environ.get("PIPECORE_FUZZ") == "ci" else "dev"


@st.composite
def scalar_costs(draw):
    act = draw(times(allow_zero=False, max_value=4.0))
    return pc.Costs(f=draw(times()), b=draw(times()), w=draw(times()), comm=draw(times()),
                    activation=act, activation_w=draw(st.floats(0.0, 1.0)) * act,
                    weights=draw(times()), offload=draw(times()))


# Plain schedules: one device per stage, so (kind, stage, microbatch) names one op.
plain = schedules(max_devices=5, max_stages=6, max_microbatches=5, overlap=False)


def _finish_of(ops):
    return {(r["kind"], r["stage"], r["microbatch"]): r["finish"] for r in ops}


@settings(settings.get_profile(PROFILE))
@given(plain, scalar_costs(), networks(devices=5))
def test_simulation_invariants(sched, costs, network):
    res = pc.simulate(sched, costs, network)
    ops = res.ops.to_pylist()
    # The makespan is at least the busiest device's work, and every op ends by it.
    busy = np.zeros(sched.devices)
    for r in ops:
        busy[r["device"]] += r["finish"] - r["start"]
        assert 0 <= r["start"] <= r["finish"] <= res.makespan + 1e-9
    assert res.makespan >= busy.max() - 1e-9 * max(1.0, busy.max())
    # Dependencies (docs/semantics.md): an op never starts before its producers finish.
    if not sched.replicated:
        done = _finish_of(ops)
        top = sched.stages - 1
        for r in ops:
            k, s, j, t = r["kind"], r["stage"], r["microbatch"], r["start"] + 1e-9
            needs = []
            if k == "F" and s > 0:
                needs.append(("F", s - 1, j))
            if k in ("B", "BW"):
                needs.append(("F", s, j))
                if s < top:
                    needs += [("B", s + 1, j), ("BW", s + 1, j)]
            if k == "W":
                needs.append(("B", s, j))
            for key in needs:
                if key in done:
                    assert done[key] <= t, (r, key)
    # Activation memory never below zero, and no device above its reported peak.
    mem = res.memory.table
    assert (mem.column("activation").to_numpy() >= -1e-9).all()
    dev = mem.column("device").to_numpy()
    act = mem.column("activation").to_numpy()
    for d in range(sched.devices):
        if (dev == d).any():
            assert act[dev == d].max() <= res.peak_activation[d] + 1e-9
    # The same call again gives the same bits.
    again = pc.simulate(sched, costs, network)
    assert again.makespan == res.makespan
    assert again.ops.equals(res.ops)


@settings(settings.get_profile(PROFILE))
@given(schedules(max_devices=5, max_stages=6, max_microbatches=5, overlap=False, offload=False),
       scalar_costs(), networks(devices=5))
def test_simulate_many_equals_simulate(sched, costs, network):
    res = pc.simulate(sched, costs, network)
    cols = {name: [float(getattr(costs, name))]
            for name in ("f", "b", "w", "comm", "activation", "activation_w", "weights")}
    if (sched.kind_codes == 5).any():  # R ops: their time defaults to f
        cols["r"] = [float(costs.f if costs.r is None else costs.r)]
    row = pc.simulate_many(sched, cols, network).to_pylist()[0]
    assert row["makespan"] == res.makespan
    assert row["peak_activation_max"] == pytest.approx(res.peak_activation.max(), abs=1e-9)
    assert row["error"] is None

"""Lazy per-op times: from LAZY_MIN_OPS ops on, simulate() runs the list
scheduler's summary pass (no op or transfer times written) and computes
start and finish on first use. Every number a Result gives must be the same,
bit for bit, as with the full pass; here the threshold is lowered to 0 so
that small random schedules take the lazy path, and the eager result of the
same call is the reference."""

from contextlib import contextmanager
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipecore as pc
from pipecore.core import simulate as sim
from pipecore.testing import costs, networks, schedules

# Run once more with Numba's bounds checking on in CI (.ci/run selects by this mark).
pytestmark = pytest.mark.kernels


@contextmanager
def _lazy():
    with mock.patch.object(sim, "LAZY_MIN_OPS", 0):
        yield


def _same(lazy, eager):
    assert lazy._times is None  # nothing computed per op yet
    assert lazy.makespan == eager.makespan
    np.testing.assert_array_equal(lazy.busy, eager.busy)
    np.testing.assert_array_equal(lazy.span, eager.span)
    assert lazy.bubble_ratio == eager.bubble_ratio
    assert lazy.bubble_rate == eager.bubble_rate
    np.testing.assert_array_equal(lazy.peak_activation, eager.peak_activation)
    assert lazy._times is None  # none of the above needed the per-op times
    np.testing.assert_array_equal(lazy.start, eager.start)
    np.testing.assert_array_equal(lazy.finish, eager.finish)
    assert lazy.transfers.equals(eager.transfers)
    assert lazy.ops.equals(eager.ops)
    assert lazy.memory.equals(eager.memory)
    assert pc.critical_path(lazy).equals(pc.critical_path(eager))


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_lazy_equals_eager_on_random_schedules(data):
    sched = data.draw(schedules(offload=False))
    c = data.draw(costs(stages=sched.stages))
    net = data.draw(networks(devices=sched.devices))
    eager = pc.simulate(sched, c, net)
    with _lazy():
        lazy = pc.simulate(sched, c, net)
    _same(lazy, eager)


@settings(max_examples=25, deadline=None)
@given(data=st.data())
def test_lazy_equals_eager_with_stragglers_and_jitter(data):
    sched = data.draw(schedules(offload=False, max_devices=4))
    c = data.draw(costs(stages=sched.stages))
    slow = {data.draw(st.integers(0, sched.devices - 1)): data.draw(st.floats(1.0, 3.0))}
    jitter = pc.Jitter.lognormal(0.2, seed=data.draw(st.integers(0, 99)))
    draw = data.draw(st.integers(0, 5))
    eager = pc.simulate(sched, c, stragglers=slow, jitter=jitter, draw=draw)
    with _lazy():
        lazy = pc.simulate(sched, c, stragglers=slow, jitter=jitter, draw=draw)
    _same(lazy, eager)


def test_busy_is_the_program_order_sum_of_op_times():
    # Independent of the kernel's sum: each device's ops' finish - start,
    # added one by one in program order (an overlapped pair counts once).
    sched = pc.build("zb-v", 4, 8)
    res = pc.simulate(sched, pc.Costs(f=1.3, b=2.1, w=0.7, comm=0.1))
    dev = sched.table.column("device").to_numpy()
    paired = res._c.paired
    for d in range(sched.devices):
        total = 0.0
        for r in np.flatnonzero(dev == d):
            if not paired[r]:
                total += res.finish[r] - res.start[r]
        assert res.busy[d] == total


def test_shared_host_links_keep_the_full_pass():
    # Copies on a shared host link are placed by issue time, which the
    # summary pass does not record: such schedules run the full pass.
    sched = pc.offload(pc.build("1f1b", 4, 8), stages=[0, 1])
    c = pc.Costs(f=1.0, b=2.0, offload=1.5, host_link_devices=2)
    eager = pc.simulate(sched, c)
    with _lazy():
        lazy = pc.simulate(sched, c)
    assert lazy._times is not None
    np.testing.assert_array_equal(lazy.finish, eager.finish)
    compiled = sim.compile_schedule(sched, c)
    with pytest.raises(ValueError, match="shared host links"):
        compiled.run(keep=False)


def test_lazy_deadlock_is_the_same_error():
    progs = [[("F", 0, 0), ("B", 0, 0)], [("B", 1, 0), ("F", 1, 0)]]
    sched = pc.Schedule.from_programs(progs, devices=2, validate=False)
    with pytest.raises(pc.ScheduleError) as eager:
        pc.simulate(sched, pc.Costs())
    with _lazy(), pytest.raises(pc.ScheduleError) as lazy:
        pc.simulate(sched, pc.Costs())
    assert str(lazy.value) == str(eager.value)

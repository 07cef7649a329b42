"""pipecore.generate.zbv_greedy: valid, within its memory limit, or a clear error."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipecore as pc
from pipecore.schedules.generate import zbv_greedy

TIMES = st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0]) | st.floats(0.1, 3.0)


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 6), k=st.integers(2, 4), f=TIMES.filter(lambda x: x > 0),
       b=TIMES.filter(lambda x: x > 0), w=TIMES, comm=st.sampled_from([0.0, 0.1, 0.7]),
       aw=st.sampled_from([0.0, 0.43, 1.0]))
def test_valid_and_within_limit(p, k, f, b, w, comm, aw):
    c = pc.Costs(f=f, b=b, w=w, comm=comm, activation=1.0, activation_w=aw)
    sched = zbv_greedy(p, k * p, c)
    assert pc.validate(sched) is sched
    np.testing.assert_array_equal(sched.placement, list(range(p)) + list(range(p))[::-1])
    res = pc.simulate(sched, c)
    assert res.peak_activation.max() <= p * 1.0 + 1e-9


def test_zero_bubble_at_equal_times():
    # The ZB paper's section 6: with T_F = T_B = T_W the V has no bubble.
    for p in (2, 4, 8):
        res = pc.simulate(zbv_greedy(p, 4 * p), pc.Costs(f=1.0, b=1.0, w=1.0))
        assert res.bubble_rate == 0.0


@pytest.mark.parametrize("kwargs,match", [
    (dict(devices=4, microbatches=7), r"microbatches >= 2 \* devices = 8 \(got 7\)"),
    (dict(devices=4, microbatches=8, memory_limit=3.0), "'memory_limit' must be >= devices"),
    (dict(devices=4, microbatches=8, costs=pc.Costs(f=[1.0] * 8)), "needs scalar costs"),
    (dict(devices=0, microbatches=8), r"'devices' must be >= 1 \(got 0\)"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        zbv_greedy(**kwargs)


@settings(max_examples=40, deadline=None)
@given(placement=st.lists(st.integers(0, 5), min_size=1, max_size=10), m=st.integers(1, 12))
def test_greedy_kernel_equals_the_python_reference(placement, m):
    # generate.greedy runs as a Numba kernel from GREEDY_KERNEL_MIN_OPS ops;
    # the pure-Python loop it replaced is the reference.
    from pipecore.schedules import generate

    used = sorted(set(placement))
    placement = [used.index(d) for d in placement]  # every device holds a stage
    want = generate._greedy_reference(placement, m, "greedy")
    saved = generate.GREEDY_KERNEL_MIN_OPS
    generate.GREEDY_KERNEL_MIN_OPS = 0
    try:
        got = generate.greedy(placement, m)
    finally:
        generate.GREEDY_KERNEL_MIN_OPS = saved
    assert got.table.equals(want.table)

"""pipecore.generate: zbv_greedy valid, within its memory limit, or a clear
error; greedy's kernel equal to its Python reference."""

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipecore as pc
from pipecore.schedules.generate import zbv_greedy

# Run once more with Numba's bounds checking on in CI (.ci/run selects by this mark).
pytestmark = pytest.mark.kernels

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


@settings(max_examples=60, deadline=None)
@given(placement=st.lists(st.integers(0, 5), min_size=1, max_size=14), m=st.integers(1, 12),
       scan_max=st.sampled_from([0, 2, 8, 1000]))
def test_greedy_kernel_equals_the_python_reference(placement, m, scan_max):
    # generate.greedy runs as a Numba kernel from GREEDY_KERNEL_MIN_OPS ops;
    # the pure-Python heap loop it replaced is the reference. The kernel's
    # devices pick their next op by a scan up to scan_max queues, else by a
    # heap: 0 forces the heap, 1000 the scan.
    from pipecore.schedules import generate

    used = sorted(set(placement))
    placement = [used.index(d) for d in placement]  # every device holds a stage
    want = generate._greedy_python(placement, m, "greedy")
    with mock.patch.object(generate, "GREEDY_KERNEL_MIN_OPS", 0), \
            mock.patch.object(generate, "GREEDY_SCAN_MAX", scan_max):
        got = generate.greedy(placement, m)
    assert got.table.equals(want.table)


@pytest.mark.parametrize("placement", [
    [0] * 12,  # one device: 24 queues, the heap
    [0, 1, 2, 2, 1, 0],  # a V
    [0, 1, 0, 1, 2, 2, 2, 2, 2, 1, 0],
])
@pytest.mark.parametrize("scan_max", [0, 1000])
def test_greedy_kernel_equals_the_reference_on_longer_runs(placement, scan_max):
    # More microbatches than the property test: the steady state's choices.
    from pipecore.schedules import generate

    want = generate._greedy_python(placement, 40, "greedy")
    with mock.patch.object(generate, "GREEDY_KERNEL_MIN_OPS", 0), \
            mock.patch.object(generate, "GREEDY_SCAN_MAX", scan_max):
        got = generate.greedy(placement, 40)
        # The columns written by two threads, half of the devices each.
        with mock.patch.object(generate, "GREEDY_THREADS_MIN_OPS", 0), \
                mock.patch.object(generate, "local_cpus", lambda: 2):
            two = generate.greedy(placement, 40)
    assert got.table.equals(want.table)
    assert two.table.equals(want.table)


# zbv_greedy's passes run in kernels/zbv.py when the scaled amounts fit its
# width; generate._one_pass_python is the Python pass it must equal.
ZBV_TIMES = (st.sampled_from([0.0, 0.5, 1.0, 1.5, 2.0, 3.0]) | st.floats(0.05, 4.0)
             | st.sampled_from([1e-7, 3e-9, 1234.5678]))  # the last: too wide for the kernel


def _zbv_outcome(p, m, costs, limit, kernel):
    from pipecore.schedules import generate

    saved = generate.ZBV_KERNEL_MAX_BITS, generate.ZBV_KERNEL_MIN_OPS
    generate.ZBV_KERNEL_MAX_BITS = saved[0] if kernel else 0  # 0: nothing fits, always Python
    generate.ZBV_KERNEL_MIN_OPS = 0  # the kernel at any size
    try:
        sched = generate.zbv_greedy(p, m, costs, limit)
    except ValueError as exc:
        return str(exc)
    finally:
        generate.ZBV_KERNEL_MAX_BITS, generate.ZBV_KERNEL_MIN_OPS = saved
    return sched


@settings(max_examples=150, deadline=None)
@given(p=st.integers(1, 8), m=st.integers(1, 24), f=ZBV_TIMES, b=ZBV_TIMES, w=ZBV_TIMES,
       comm=st.sampled_from([0.0, 0.1, 0.7, 2.5]) | st.floats(0.0, 3.0),
       act=st.sampled_from([1.0, 2.0]) | st.floats(0.1, 4.0), aw=st.floats(0.0, 1.0),
       room=st.sampled_from([None, 0.0, -0.5, np.inf, 1e6]) | st.floats(0.0, 30.0))
def test_zbv_kernel_equals_the_python_reference(p, m, f, b, w, comm, act, aw, room):
    # room: memory above the least allowed limit p * activation (None: the
    # default; 0: exactly that; -0.5: below it; inf: rejected as infinite).
    costs = pc.Costs(f=f, b=b, w=w, comm=comm, activation=act, activation_w=aw * act)
    limit = None if room is None else p * act + room
    got = _zbv_outcome(p, m, costs, limit, kernel=True)
    want = _zbv_outcome(p, m, costs, limit, kernel=False)
    if isinstance(want, str):
        assert got == want
        return
    assert not isinstance(got, str), got
    assert got.table.equals(want.table)
    assert (got.name, got.params, got.devices) == (want.name, want.params, want.devices)


@pytest.mark.parametrize("p,m,limit", [(8, 24, 8.0), (16, 48, 32.0), (4, 9, None)])
def test_zbv_kernel_runs_at_published_costs(p, m, limit, monkeypatch):
    # The ZB paper's Table 5 costs (28.3B row) fit the kernel: the Python
    # pass must not run, and the result equals it (the kernel forced at
    # these sizes, below ZBV_KERNEL_MIN_OPS).
    from pipecore.schedules import generate

    costs = pc.Costs(f=10.402, b=10.248, w=7.698, comm=0.46, activation=1.0, activation_w=0.432)
    want = _zbv_outcome(p, m, costs, limit, kernel=False)

    def refuse(*args):
        raise AssertionError("the Python pass ran")

    monkeypatch.setattr(generate, "_one_pass_python", refuse)
    monkeypatch.setattr(generate, "ZBV_KERNEL_MIN_OPS", 0)
    got = generate.zbv_greedy(p, m, costs, limit)
    assert got.table.equals(want.table)


def _pass_outcome(one_pass, args, stall=(KeyError, IndexError)):
    """A pass's idle times and per-device order, or 'stall'."""
    try:
        st = one_pass(*args)
    except stall:
        return "stall"
    if hasattr(st, "order"):
        return st.idle, [list(o) for o in st.order]
    return st.idle, [list(zip(st.kind[d, :n].tolist(), st.chunk[d, :n].tolist(),
                              st.j[d, :n].tolist())) for d, n in enumerate(st.count)]


@settings(max_examples=150, deadline=None)
@given(p=st.integers(1, 6), m=st.integers(1, 12), cost=st.tuples(*[st.integers(0, 9)] * 3),
       comm=st.integers(0, 9), act=st.integers(1, 6), act_w=st.integers(0, 6),
       limit=st.integers(0, 60), fill_f=st.booleans(), fill_b=st.booleans(),
       allow=st.lists(st.integers(-1, 80), min_size=6, max_size=6), wide=st.booleans())
def test_zbv_pass_kernel_equals_the_python_pass(p, m, cost, comm, act, act_w, limit, fill_f,
                                                fill_b, allow, wide):
    # Below zbv_greedy's checks: any m, limits below the V's peak (the rules
    # then stall), any allowances; ``wide`` scales everything past int64.
    from pipecore.schedules import generate

    act_w = min(act_w, act)
    k = 1 << 70 if wide else 1
    args = (p, m, tuple(c * k for c in cost), (act * k, -(act - act_w) * k, -act_w * k),
            comm * k, limit * k, fill_f, fill_b, [a * k if a >= 0 else -1 for a in allow[:p]])
    want = _pass_outcome(generate._one_pass_python, args)
    # The kernel reports a stall as KeyError: an IndexError from it would be
    # an out-of-bounds access under NUMBA_BOUNDSCHECK=1, not a stall.
    saved = generate.ZBV_KERNEL_MIN_OPS
    generate.ZBV_KERNEL_MIN_OPS = 0
    try:
        got = _pass_outcome(generate._one_pass, args, stall=KeyError)
    finally:
        generate.ZBV_KERNEL_MIN_OPS = saved
    assert got == want


def test_zbv_small_shapes_take_the_python_pass_and_large_ones_the_kernel(monkeypatch):
    # Fresh installs tuning small shapes compile nothing for zbv_greedy.
    from pipecore.schedules import generate

    ran = []
    real = generate._one_pass_python
    monkeypatch.setattr(generate, "_one_pass_python", lambda *a: ran.append(1) or real(*a))
    costs = pc.Costs(f=1, b=1, w=1, comm=0.05)
    generate.zbv_greedy(8, 32, costs)
    assert ran
    ran.clear()
    generate.zbv_greedy(32, 128, costs)  # 6 p m = 24,576 ops
    assert not ran

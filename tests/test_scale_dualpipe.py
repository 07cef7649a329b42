"""DualPipe and DualPipeV at scale: the kernel builders (``kernels.dualpipe``)
equal their per-op references op for op.

The references are ``schedules.dualpipe._dualpipev_per_op`` and
``_dualpipe_per_op``: the Python loops the families were first written
as (``_eight_steps``, checked against torch's ScheduleDualPipeV and
DeepSeek's DualPipe in test_torch_fixtures.py and test_dualpipe.py); nothing
here is computed by the code under test.
"""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_scale import _same_structure

import pipecore as pc
from pipecore.core import rules
from pipecore.core.ops import ScheduleError
from pipecore.core.rules import structure
from pipecore.core.schedule import Schedule
from pipecore.schedules import dualpipe

DEFAULT_MIN_OPS = dualpipe.DUALPIPE_KERNEL_MIN_OPS

# Run once more with Numba's bounds checking on in CI (.ci/run selects by this mark).
pytestmark = pytest.mark.kernels


@pytest.fixture(autouse=True, scope="module")
def _kernel_path():
    # Small shapes take the per-op reference by default: here they must take
    # the kernel, or the comparisons below would compare the reference with
    # itself.
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(dualpipe, "DUALPIPE_KERNEL_MIN_OPS", 0)
        yield


def test_small_shapes_skip_the_kernel_and_large_ones_take_it(monkeypatch):
    monkeypatch.setattr(dualpipe, "DUALPIPE_KERNEL_MIN_OPS", DEFAULT_MIN_OPS)
    calls = []
    real = dualpipe.eight_steps

    def spy(*args):
        calls.append(args[:2])
        return real(*args)

    monkeypatch.setattr(dualpipe, "eight_steps", spy)
    pc.build("dualpipev", 8, 32)  # 1,536 ops: compare's shape
    pc.build("dualpipe", 8, 32)
    assert calls == []
    pc.build("dualpipev", 16, 176)  # 6pm = 16,896
    assert len(calls) == 1


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 10), extra=st.integers(0, 40))
def test_dualpipev_equals_reference(p, extra):
    m = 2 * p + extra  # the family needs m >= 2p
    sched = pc.build("dualpipev", p, m)
    ref = dualpipe._dualpipev_per_op(p, m)
    assert sched.table.equals(ref.table)
    assert sched == ref


@settings(max_examples=60, deadline=None)
@given(half=st.integers(1, 6), extra=st.integers(0, 20))
def test_dualpipe_equals_reference(half, extra):
    p = 2 * half
    m = 2 * p + 2 * extra  # even, and m >= 2p
    sched = pc.build("dualpipe", p, m)
    ref = dualpipe._dualpipe_per_op(p, m)
    assert sched.table.equals(ref.table)
    assert sched == ref and sched.replicated


@pytest.mark.parametrize("name,p,m", [("dualpipev", 16, 40), ("dualpipe", 16, 40)])
def test_structure_equals_reference(name, p, m):
    sched = pc.build(name, p, m)
    ref = getattr(dualpipe, f"_{name}_per_op")(p, m)
    _same_structure(structure(sched, fast=True), structure(ref, fast=False))


@pytest.mark.parametrize("name,p,m,match", [
    ("dualpipev", 4, 7, r"'dualpipev' needs microbatches >= 2 \* devices = 8 \(got 7\)"),
    ("dualpipe", 3, 8, r"'dualpipe' needs even devices and microbatches \(got devices=3, "
                       r"microbatches=8\)"),
    ("dualpipe", 4, 9, r"needs even devices and microbatches"),
    ("dualpipe", 4, 6, r"'dualpipe' needs microbatches >= 2 \* devices = 8 \(got 6\)"),
])
def test_bad_shapes_keep_their_errors(name, p, m, match):
    with pytest.raises(ValueError, match=match):
        pc.build(name, p, m)


def test_all_reduces_take_the_kernel_path():
    # The one-pass kernel takes replicated schedules with all-reduces too.
    for p, m in ((2, 4), (4, 8), (16, 40)):
        assert rules._structure_fast(pc.build("dualpipe", p, m)) is not None


def _broken(edit):
    progs = pc.build("dualpipe", 4, 8).programs()
    edit(progs)
    return Schedule.from_programs(progs, validate=False, replicated=True)


@pytest.mark.parametrize("edit, rule", [
    (lambda g: g[0].pop(), "all-reduce"),                       # one replica's AR missing
    (lambda g: g[0].append(g[0][-1]), "all-reduce"),            # a second AR on a device
    (lambda g: g[1].insert(3, g[1].pop()), "order"),            # AR before the stage's backwards
    (lambda g: g[1].append(("AR", 0, None)), "all-reduce"),     # AR on a device without the stage
])
def test_broken_all_reduces_give_the_numpy_error_on_the_kernel_path(edit, rule):
    sched = _broken(edit)
    assert rules._structure_fast(sched) is None
    errors = []
    for fast in (True, False):
        with pytest.raises(ScheduleError) as info:
            structure(sched, fast=fast)
        errors.append((str(info.value), info.value.rule))
    assert errors[0] == errors[1]
    assert errors[0][1] == rule



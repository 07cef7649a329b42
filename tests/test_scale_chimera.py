"""Symmetric Chimera and BitPipe from their Numba kernels (kernels/bidirectional.py) equal the
per-op builders they replaced at scale (``schedules.chimera._chimera_programs``,
``schedules.bitpipe._bitpipe_per_op``, kept as references), op for op."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipecore as pc
from pipecore.schedules import chimera

# Run once more with Numba's bounds checking on in CI (.ci/run selects by this mark).
pytestmark = pytest.mark.kernels


def _both(p, m, variant):
    kw = {} if variant is None else {"variant": variant}
    saved = chimera.CHIMERA_KERNEL_MIN_OPS
    try:
        chimera.CHIMERA_KERNEL_MIN_OPS = 10**12
        want = pc.build("chimera", p, m, **kw)
        chimera.CHIMERA_KERNEL_MIN_OPS = 0
        got = pc.build("chimera", p, m, **kw)
    finally:
        chimera.CHIMERA_KERNEL_MIN_OPS = saved
    return got, want


@settings(max_examples=40, deadline=None)
@given(h=st.integers(1, 6), units=st.integers(1, 6),
       variant=st.sampled_from([None, "direct", "forward-doubling"]))
def test_kernel_equals_the_per_op_builder(h, units, variant):
    # Forward doubling takes two units or more; with an odd count the first
    # runs alone.
    p = 2 * h
    m = p * (units + (variant == "forward-doubling" and units == 1))
    got, want = _both(p, m, variant)
    assert got.table.equals(want.table)
    assert got.replicated and want.replicated
    assert got.params == want.params


def test_large_shapes_take_the_kernel():
    # 2m + 2 ops per device: p=8, m=1024 is 16,400 ops, over the threshold.
    assert 8 * (2 * 1024 + 2) >= chimera.CHIMERA_KERNEL_MIN_OPS
    got, want = _both(8, 1024, "direct")
    assert got.table.equals(want.table)
    got, want = _both(8, 1016, None)  # 127 units: forward doubling, the first unit alone
    assert got.table.equals(want.table) and got.params["variant"] == "forward-doubling"


@settings(max_examples=40, deadline=None)
@given(h=st.integers(1, 6), units=st.integers(1, 5))
def test_bitpipe_kernel_equals_the_per_op_builder(h, units):
    # schedules.bitpipe._bitpipe_per_op is the per-op builder the kernel replaced.
    from pipecore.schedules import bitpipe

    p, m = 2 * h, 2 * h * units
    want = bitpipe._bitpipe_per_op(p, m)
    saved = bitpipe.BITPIPE_KERNEL_MIN_OPS
    bitpipe.BITPIPE_KERNEL_MIN_OPS = 0
    try:
        got = pc.build("bitpipe", p, m)
    finally:
        bitpipe.BITPIPE_KERNEL_MIN_OPS = saved
    assert got.table.equals(want.table)
    assert got.replicated

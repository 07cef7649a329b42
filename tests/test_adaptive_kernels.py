"""The adaptive V scheduler's Numba list schedulers equal the pure-Python
versions they replaced (kept in pipecore.schedules.adaptive as
``_squeeze_reference``, ``_span_reference`` and ``_fill_gaps_reference``): on random slot grids, some of
which wait on each other in a cycle, and on every grid ``_build`` squeezes
for a few shapes."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from pipecore.schedules import adaptive

LETTER = st.sampled_from([None, None, "F", "f", "B", "b", "W", "w"])


@settings(max_examples=200, deadline=None)
@given(rows=st.integers(1, 6).flatmap(
    lambda p: st.lists(st.lists(LETTER, min_size=0, max_size=30), min_size=p, max_size=p)),
    f=st.floats(0.1, 3), b=st.floats(0.1, 3), w=st.floats(0, 2), c=st.floats(0, 1))
def test_kernels_equal_the_python_references_on_random_grids(rows, f, b, w, c):
    assert adaptive._squeeze([list(r) for r in rows]) == adaptive._squeeze_reference(
        [list(r) for r in rows])
    # The reference needs an op on every device (its span starts at one).
    if all(any(x is not None for x in r) for r in rows):
        want = adaptive._span_reference(rows, f, b, w, c)
        got = adaptive._span(rows, f, b, w, c)
        assert got == want or (math.isinf(got) and math.isinf(want))


def test_kernels_equal_the_python_references_inside_build(monkeypatch):
    seen = []
    squeeze = adaptive._squeeze

    def both(rows):
        want = adaptive._squeeze_reference([list(r) for r in rows])
        got = squeeze(rows)
        assert got == want
        seen.append(1)
        return got

    fill = adaptive._fill_gaps

    def both_fill(rows):
        want = adaptive._fill_gaps_reference([list(r) for r in rows])
        got = fill(rows)
        assert got == want
        seen.append(2)
        return got

    monkeypatch.setattr(adaptive, "_squeeze", both)
    monkeypatch.setattr(adaptive, "_fill_gaps", both_fill)
    for p, m in [(2, 3), (4, 8), (4, 16), (6, 7), (8, 24)]:
        for groups in adaptive._ranked_blocks(p).values():
            for _trip, _turn, blk, chain in groups[:3]:
                got = adaptive._build(blk, chain, m, 2 * p)
                if got is not None:
                    rows = got[0]
                    assert adaptive._span(rows, 1.0, 1.2, 0.7, 0.05) == adaptive._span_reference(
                        rows, 1.0, 1.2, 0.7, 0.05)
    assert seen.count(1) > 20 and seen.count(2) > 5


@settings(max_examples=200, deadline=None)
@given(rows=st.tuples(st.integers(1, 6), st.integers(0, 30)).flatmap(
    lambda pn: st.lists(st.lists(LETTER, min_size=pn[1], max_size=pn[1]),
                        min_size=pn[0], max_size=pn[0])))
def test_fill_gaps_kernel_equals_the_python_reference(rows):
    assert adaptive._fill_gaps([list(r) for r in rows]) == adaptive._fill_gaps_reference(
        [list(r) for r in rows])

"""The adaptive V scheduler's Numba list schedulers equal the pure-Python
versions they replaced (tests/reference_adaptive.py, and the cool-down's
Python path in pipecore.schedules.adaptive_grid): on random slot grids, some
of which wait on each other in a cycle, and on every grid ``_build`` squeezes
for a few shapes."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_adaptive import (
    fill_gaps_reference,
    peaks_reference,
    relabel_w_reference,
    span_reference,
    squeeze_reference,
    valid_reference,
)

from pipecore.schedules import adaptive, adaptive_grid, adaptive_space

# Run once more with Numba's bounds checking on in CI (.ci/run selects by this mark).
pytestmark = pytest.mark.kernels

LETTER = st.sampled_from([None, None, "F", "f", "B", "b", "W", "w"])


@settings(max_examples=200, deadline=None)
@given(rows=st.integers(1, 6).flatmap(
    lambda p: st.lists(st.lists(LETTER, min_size=0, max_size=30), min_size=p, max_size=p)),
    f=st.floats(0.1, 3), b=st.floats(0.1, 3), w=st.floats(0, 2), c=st.floats(0, 1))
def test_kernels_equal_the_python_references_on_random_grids(rows, f, b, w, c):
    assert adaptive_grid._squeeze([list(r) for r in rows]) == squeeze_reference(
        [list(r) for r in rows])
    # The reference needs an op on every device (its span starts at one).
    if all(any(x is not None for x in r) for r in rows):
        want = span_reference(rows, f, b, w, c)
        got = adaptive_grid._span(rows, f, b, w, c)
        assert got == want or (math.isinf(got) and math.isinf(want))


def test_kernels_equal_the_python_references_inside_build(monkeypatch):
    seen = []
    squeeze = adaptive_grid._squeeze

    def both(rows):
        want = squeeze_reference([list(r) for r in rows])
        got = squeeze(rows)
        assert got == want
        seen.append(1)
        return got

    fill = adaptive_grid._fill_gaps

    def both_fill(rows):
        want = fill_gaps_reference([list(r) for r in rows])
        got = fill(rows)
        assert got == want
        seen.append(2)
        return got

    monkeypatch.setattr(adaptive_grid, "_squeeze", both)
    monkeypatch.setattr(adaptive_grid, "_fill_gaps", both_fill)
    for p, m in [(2, 3), (4, 8), (4, 16), (6, 7), (8, 24)]:
        for groups in adaptive._ranked_blocks(p).values():
            for _trip, _turn, blk, chain in groups[:3]:
                got = adaptive_grid._build(blk, chain, m, 2 * p)
                if got is not None:
                    rows = got[0]
                    assert adaptive_grid._span(rows, 1.0, 1.2, 0.7, 0.05) == span_reference(
                        rows, 1.0, 1.2, 0.7, 0.05)
    assert seen.count(1) > 20 and seen.count(2) > 5


@settings(max_examples=200, deadline=None)
@given(rows=st.tuples(st.integers(1, 6), st.integers(0, 30)).flatmap(
    lambda pn: st.lists(st.lists(LETTER, min_size=pn[1], max_size=pn[1]),
                        min_size=pn[0], max_size=pn[0])))
def test_fill_gaps_kernel_equals_the_python_reference(rows):
    assert adaptive_grid._fill_gaps([list(r) for r in rows]) == fill_gaps_reference(
        [list(r) for r in rows])


def _copy(rows):
    return [list(r) for r in rows]


@settings(max_examples=300, deadline=None)
@given(rows=st.integers(1, 6).flatmap(
    lambda p: st.lists(st.lists(LETTER, min_size=0, max_size=30), min_size=p, max_size=p)),
    m=st.integers(1, 8))
def test_grid_steps_equal_the_python_references_on_random_grids(rows, m):
    # Ragged rows, any letters: peaks, the cool-down rebuild (the kernel
    # reports a negative slot and the reference runs, so its IndexError on
    # a far negative slot is kept too), W relabelling and the validity check.
    assert adaptive_grid._peaks(_copy(rows)) == peaks_reference(_copy(rows))
    try:
        want = adaptive_grid._cooldown_rows_python(_copy(rows), m)
    except IndexError:
        want = IndexError
    try:
        got = adaptive_grid._cooldown_rows(_copy(rows), m)
    except IndexError:
        got = IndexError
    assert got == want
    assert adaptive_grid._relabel_w(_copy(rows)) == relabel_w_reference(_copy(rows))
    assert adaptive_grid._valid(_copy(rows), m) == valid_reference(_copy(rows), m)


def test_grid_steps_equal_the_python_references_inside_build(monkeypatch):
    # On the grids _build really passes (where _valid is mostly True and the
    # cool-down mostly succeeds); each step's output also feeds the next.
    seen = []

    def pair(name, reference):
        fast = getattr(adaptive_grid, name)

        def both(*args):
            want = reference(*[_copy(a) if isinstance(a, list) else a for a in args])
            got = fast(*args)
            assert got == want, name
            seen.append(name)
            return got

        monkeypatch.setattr(adaptive_grid, name, both)

    pair("_peaks", peaks_reference)
    pair("_cooldown_rows", adaptive_grid._cooldown_rows_python)
    pair("_relabel_w", relabel_w_reference)
    pair("_valid", valid_reference)
    layout = adaptive_grid._layout

    def layout_both(blk, chain, mb):
        got = layout(blk, chain, mb)
        length = max(max(pos.values()) for pos in chain) + 6 * mb + 1
        want = [[None] * length for _ in blk]
        for i in range(len(blk)):
            for letter, t0 in chain[i].items():
                for j in range(mb):
                    want[i][t0 + 6 * j] = letter
        assert got == want
        seen.append("_layout")
        return got

    monkeypatch.setattr(adaptive_grid, "_layout", layout_both)
    valid = 0
    for p, m in [(2, 3), (3, 1), (4, 8), (4, 16), (6, 7), (8, 24)]:
        for groups in adaptive._ranked_blocks(p).values():
            for _trip, _turn, blk, chain in groups[:4]:
                valid += adaptive_grid._build(blk, chain, m, 2 * p) is not None
    assert valid > 20
    assert all(seen.count(n) > 20 for n in ("_peaks", "_cooldown_rows", "_relabel_w",
                                            "_valid", "_layout")), set(seen)


def test_cooldown_negative_slot_takes_the_python_path():
    # No f on device 0 puts the anchor at -1, so device 1's second tail B
    # lands on slot -1: Python writes the row's last slot, which the kernel
    # reports (status 2) instead of guessing.
    import numpy as np

    from pipecore.kernels import adaptive as kernels

    rows = [["F"] * 4, ["F"] * 4 + ["B", "B"]]
    codes, ptr = adaptive_grid._flat(rows)
    length = np.diff(ptr)
    grid = np.full((2, 20), -1, dtype=np.int8)
    for i in range(2):
        grid[i, :length[i]] = codes[ptr[i]:ptr[i + 1]]
    assert kernels.cooldown_rows(grid, length, 2) == 2
    want = [["F"] * 4, ["F", "B", "F", "F", "W", "B", "W"]]
    assert adaptive_grid._cooldown_rows_python(_copy(rows), 2) == want
    assert adaptive_grid._cooldown_rows(_copy(rows), 2) == want


def test_blocks_equal_the_dict_enumeration():
    # Same blocks in the same order, each row's dict with the same key order
    # (adaptive_blocks returns them), and the same steady peaks.
    from naive import adaptive_blocks_reference, steady_peak_reference

    for p in (2, 3, 5, 8, 13):
        got = list(adaptive_space._blocks(p))
        want = adaptive_blocks_reference(p)
        assert [[list(r.items()) for r in b] for b in got] == [
            [list(r.items()) for r in b] for b in want]
        for blk in got:
            chain = adaptive_space._chain(blk)
            assert adaptive_space._steady_peak(chain) == steady_peak_reference(chain)

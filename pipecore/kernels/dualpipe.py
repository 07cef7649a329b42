"""DualPipe's eight steps per device, written straight into op columns.

``schedules.dualpipe`` states the order; this kernel runs it for every
device of a large shape without a Python tuple per op. Rows come out in
(device, slot) order, an overlapped F&B unit as two rows sharing a slot
(F first), as ``Schedule.from_programs`` lays them out.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .codes import AR, BW, B, F, W

# Per-device counters in one int64 array: next row, next slot, W queue
# head and tail, forwards taken per phase, backwards taken per phase.
_ROW, _SLOT, _HEAD, _TAIL, _NF, _NB = 0, 1, 2, 3, 4, 6


@njit(cache=True, inline="always")
def _put(c, d, kind, stage, mb, out):
    """Op (kind, stage, mb) of device d into the next row of ``out`` (a
    Columns), in the current slot."""
    r = c[_ROW]
    out.device[r] = d
    out.slot[r] = c[_SLOT]
    out.kind[r] = kind
    out.stage[r] = stage
    out.microbatch[r] = mb
    c[_ROW] = r + 1


@njit(cache=True, inline="always")
def _fwd(c, d, a, st, first, out):
    """The next forward of phase a, in the current slot (not advanced)."""
    _put(c, d, F, st[d, a], first[d, a] + c[_NF + a], out)
    c[_NF + a] += 1


@njit(cache=True, inline="always")
def _back(c, d, a, kind, st, first, wq, out):
    """The next backward (B or BW) of phase a; a B queues its W."""
    j = first[d, a] + c[_NB + a]
    c[_NB + a] += 1
    _put(c, d, kind, st[d, a], j, out)
    if kind == B:
        wq[c[_TAIL], 0] = st[d, a]
        wq[c[_TAIL], 1] = j
        c[_TAIL] += 1


@njit(cache=True, inline="always")
def _weight(c, d, wq, out):
    """The oldest pending W, if any, in its own slot."""
    if c[_HEAD] < c[_TAIL]:
        _put(c, d, W, wq[c[_HEAD], 0], wq[c[_HEAD], 1], out)
        c[_HEAD] += 1
        c[_SLOT] += 1


@njit(cache=True, nogil=True)
def eight_steps(P, M, h, st, first, split_first, with_ar, offset, out):
    """Write every device's eight-step program into the output columns.

    Parameters
    ----------
    P, M : int
        Devices per direction and microbatches per phase.
    h : numpy.ndarray of int64, shape (p,)
        Each device's position (0..P-1) in its direction.
    st, first : numpy.ndarray of int64, shape (p, 2)
        Stage and first microbatch of each device's phase 0 and phase 1.
    split_first : numpy.ndarray of bool, shape (p,)
        Whether the device runs its first main-step unit as F then BW.
    with_ar : bool
        Whether each device ends with all-reduces of phase 1's stage then
        phase 0's (microbatch -1).
    offset : numpy.ndarray of int64, shape (p + 1,)
        First row of each device; ``offset[p]`` is the row count.
    out : Columns
        The op table's columns, ``offset[p]`` rows, filled in place.

    Returns
    -------
    bool
        True when every device filled exactly its rows.
    """
    # Pending W (stage, microbatch), oldest first: fewer than 2P per device.
    wq = np.empty((2 * P + 2, 2), np.int64)
    c = np.zeros(8, np.int64)
    for d in range(h.size):
        hd = h[d]
        c[:] = 0
        c[_ROW] = offset[d]
        # The steps of schedules.dualpipe._eight_steps, in order.
        for _ in range(2 * (P - hd - 1)):
            _fwd(c, d, 0, st, first, out)
            c[_SLOT] += 1
        for _ in range(hd + 1):
            for a in (0, 1):
                _fwd(c, d, a, st, first, out)
                c[_SLOT] += 1
        for _ in range(P - hd - 1):
            _back(c, d, 1, B, st, first, wq, out)
            c[_SLOT] += 1
            _weight(c, d, wq, out)
            _fwd(c, d, 1, st, first, out)
            c[_SLOT] += 1
        for i in range(M - 2 * P + hd + 1):
            # F&B units: F of one phase and BW of the other share a slot.
            _fwd(c, d, 0, st, first, out)
            if i == 0 and split_first[d]:
                c[_SLOT] += 1
            _back(c, d, 1, BW, st, first, wq, out)
            c[_SLOT] += 1
            _fwd(c, d, 1, st, first, out)
            _back(c, d, 0, BW, st, first, wq, out)
            c[_SLOT] += 1
        for _ in range(P - hd - 1):
            _back(c, d, 1, BW, st, first, wq, out)
            c[_SLOT] += 1
            _fwd(c, d, 1, st, first, out)
            _back(c, d, 0, BW, st, first, wq, out)
            c[_SLOT] += 1
        half = (hd + 1) // 2
        for i in range(hd + 1):
            # Fused BW before the middle, split B from it on: for odd h
            # the switch comes before phase 1's op, for even h after it.
            split1 = i > half or (i == half and hd % 2 == 1)
            _back(c, d, 1, B if split1 else BW, st, first, wq, out)
            c[_SLOT] += 1
            _back(c, d, 0, B if i >= half else BW, st, first, wq, out)
            c[_SLOT] += 1
        for _ in range(P - hd - 1):
            _weight(c, d, wq, out)
            _back(c, d, 0, B, st, first, wq, out)
            c[_SLOT] += 1
        for _ in range(hd + 1):
            _weight(c, d, wq, out)
        if with_ar:
            for a in (1, 0):
                _put(c, d, AR, st[d, a], -1, out)
                c[_SLOT] += 1
        if c[_ROW] != offset[d + 1]:
            return False
    return True

"""Seq1F1B's op table written straight into the columns (at scale)."""

from __future__ import annotations

from numba import njit

from .codes import BW, F
from .slots import _put


@njit(cache=True, nogil=True)
def seq1f1b_columns(out, p, m, k, warm, d0, d1):
    """Seq1F1B (``schedules.seq1f1b``) for devices d0 to d1 - 1: 1F1B over m
    units with ``warm[d]`` warm-up forwards, F(j) in slot j during the
    warm-up, else 2j - w + 1; the j-th backward in slot w + 2j while forwards
    remain, else m + j, and it runs unit (j // k) k + k - 1 - j % k (the
    chunks of a sequence in reverse)."""
    length = 2 * m
    for d in range(d0, d1):
        w = warm[d]
        for j in range(m):
            s = j if j < w else 2 * j - w + 1
            if _put(out, length, d, s, F, d, j):
                return 1
            s = w + 2 * j if j < m - w else m + j
            if _put(out, length, d, s, BW, d, (j // k) * k + k - 1 - j % k):
                return 1
    return 0

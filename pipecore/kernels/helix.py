"""HelixPipe's per-device order, the authors' forward loop written straight into the columns.

A closed rule (no simulation): each device's program follows from the loop
nest of ``attention_pipeline`` in the authors' attn_pipe_schedule.py (small
tables run it interpreted: core/tier.py). Stage 2j is the parameter part
P_j, 2j + 1 the attention A_j; microbatch (k, d, f) of repeat k, data offset d and fold f is
``(k p + d) folds + f``.
"""

from __future__ import annotations

from numba import njit, prange

from .codes import BW, F


@njit(cache=True, nogil=True, inline="always")
def _put(kind, stage, mb, base, n, t, s, i):
    # Forward t of a device at row base + t, its backward mirrored at
    # base + 2n - 1 - t (first in, last out).
    kind[base + t] = F
    stage[base + t] = s
    mb[base + t] = i
    r = base + 2 * n - 1 - t
    kind[r] = BW
    stage[r] = s
    mb[r] = i
    return t + 1


@njit(cache=True, nogil=True, inline="always")
def _device(kind, stage, mb, base, n, r, p, v, folds, repeats):
    """Rank r's forwards in the order of attn_pipe_schedule.attention_pipeline."""
    L = v * p
    pl = 2 * L  # stage of P_L, the loss part (rank 0)
    t = 0
    if r == 0:  # prelude: P_0 of offset 0, every fold
        for f in range(folds):
            t = _put(kind, stage, mb, base, n, t, 0, f)
    for k in range(repeats):
        first = k * p * folds
        # warm-up, attention: offsets r - 1 .. 0 of loop 0 (source rank r - 1 - d)
        for d in range(r - 1, -1, -1):
            for f in range(folds):
                i = first + d * folds + f
                t = _put(kind, stage, mb, base, n, t, 2 * (r - 1 - d) + 1, i)
                if d == 0:
                    t = _put(kind, stage, mb, base, n, t, 2 * r, i)
        # warm-up, parameters: P_r of offsets 1 .. p - 1 (rank 0 first closes
        # the previous repeat's microbatch of that offset with P_L)
        for d in range(1, p):
            for f in range(folds):
                i = first + d * folds + f
                if r == 0 and k > 0:
                    t = _put(kind, stage, mb, base, n, t, pl, i - p * folds)
                t = _put(kind, stage, mb, base, n, t, 2 * r, i)
                if d == p - 1:
                    t = _put(kind, stage, mb, base, n, t, 2 * r + 1, i)
        # steady loops 1 .. v - 1
        for loop in range(1, v):
            for d in range(p - 2, -1, -1):
                src = r - d - 1
                layer = loop * p + src if src >= 0 else (loop - 1) * p + src + p
                for f in range(folds):
                    i = first + d * folds + f
                    t = _put(kind, stage, mb, base, n, t, 2 * layer + 1, i)
                    if d == 0:
                        t = _put(kind, stage, mb, base, n, t, 2 * (loop * p + r), i)
            for d in range(1, p):
                for f in range(folds):
                    i = first + d * folds + f
                    t = _put(kind, stage, mb, base, n, t, 2 * (loop * p + r), i)
                    if d == p - 1:
                        t = _put(kind, stage, mb, base, n, t, 2 * (loop * p + r) + 1, i)
        # cool-down: the last loop's attention of offsets p - 2 .. r (wrapped
        # sources); on rank 0 offset 0 ends with P_L and the next repeat's P_0
        for d in range(p - 2, r - 1, -1):
            layer = (v - 1) * p + r - d - 1 + p
            for f in range(folds):
                i = first + d * folds + f
                t = _put(kind, stage, mb, base, n, t, 2 * layer + 1, i)
                if d == 0:
                    t = _put(kind, stage, mb, base, n, t, pl, i)
                    if k < repeats - 1:
                        t = _put(kind, stage, mb, base, n, t, 0, i + p * folds)
    if r == 0:  # tail: P_L of the last repeat's offsets 1 .. p - 1
        last = (repeats - 1) * p * folds
        for d in range(1, p):
            for f in range(folds):
                t = _put(kind, stage, mb, base, n, t, pl, last + d * folds + f)
    return t


@njit(cache=True, nogil=True, parallel=True)
def helix_columns(kind, stage, mb, out_ptr, p, v, folds, repeats):
    """Write every device's forwards (authors' loop order) and backwards (the
    reverse). Device r owns rows ``out_ptr[r]:out_ptr[r + 1]``; returns the
    number of devices whose forward count differs from half their rows (a
    builder bug)."""
    bad = 0
    for r in prange(p):
        n = (out_ptr[r + 1] - out_ptr[r]) // 2
        if _device(kind, stage, mb, out_ptr[r], n, r, p, v, folds, repeats) != n:
            bad += 1
    return bad

"""Closed-form op slots written into the sorted op table's columns.

Every kernel here writes into a :class:`~.columns.Columns` carrier (the
output) the ops of devices ``d0`` to ``d1 - 1``: the caller
(``schedules.construct.kernel_to_schedule``) visits the table device block
by device block, so that the rows being written stay in cache (the parts of
a schedule interleave in each device's slots; part after part over the
whole table would bring every cache line in once per part). ``kind`` must
start as -1 on those devices' rows; each kernel returns 0, or 1 when a slot
is out of range or taken (a builder bug).

``scatter_slots`` writes slots a numpy builder computed, in one pass
instead of numpy's fancy indexing plus repeat/tile for device and slot.
The ``*_columns`` kernels go further for one family each: they compute
each op's slot from the family's closed form and write it at once, so no
(p, m) position arrays and temporaries are made (fresh memory is slow on
its first touch). Their numpy builders stay the path for small shapes.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .codes import BW, B, F, W


@njit(cache=True, nogil=True, inline="always")  # IR-inlined: no call, no reference counting per op
def _put(out, length, d, s, code, st, j):
    """Op (code, st, j) of device d into slot s of ``out`` (a Columns of
    ``length`` slots per device); True when s is out of range or taken."""
    if s < 0 or s >= length:
        return True
    r = d * length + s
    if out.kind[r] >= 0:
        return True
    out.kind[r] = code
    out.stage[r] = st
    out.microbatch[r] = j
    out.device[r] = d
    out.slot[r] = s
    return False


@njit(cache=True, nogil=True)  # two threads may write halves of the devices
def scatter_slots(out, length, code, st, j, sl, d0, d1):
    """Write one part (ops of kind ``code``) of the ops of devices ``d0`` to
    ``d1 - 1`` into ``out``.

    ``st``, ``j`` and ``sl`` are 2-D int32 arrays that broadcast to
    ``(p, k)`` (a dimension of 1 repeats): op i of device d has stage
    ``st[d, i]``, microbatch ``j[d, i]`` and slot ``sl[d, i]``, and goes to
    row ``d * length + sl[d, i]``.
    """
    k = max(st.shape[1], max(j.shape[1], sl.shape[1]))
    # A stride of 0 repeats a broadcast dimension without a branch per op.
    s0 = 1 if st.shape[0] > 1 else 0
    s1 = 1 if st.shape[1] > 1 else 0
    j0 = 1 if j.shape[0] > 1 else 0
    j1 = 1 if j.shape[1] > 1 else 0
    l0 = 1 if sl.shape[0] > 1 else 0
    l1 = 1 if sl.shape[1] > 1 else 0
    for d in range(d0, d1):
        for i in range(k):
            if _put(out, length, d, sl[d * l0, i * l1], code, st[d * s0, i * s1],
                    j[d * j0, i * j1]):
                return 1
    return 0



@njit(cache=True, nogil=True, inline="always")
def zb_v_phases(p, n, d):
    """Where device d's phases start in ZB-V's program of n >= 2p - 1
    microbatches (``schedules.vshape.build_zb_v`` lists the phases).

    Returns (a, K, T, P3, P4, P5, P5b, P5c, P5d): a warm-up forwards, K
    steady iterations with a chunk-0 forward, T steady iterations in all;
    phase 3 starts at P3, the steady iterations at P4, the cool-down at P5
    (its pairs B, B), P5b (its pairs B, W), P5c (chunk 1's pending W) and
    P5d (chunk 0's). Plain arithmetic: ``schedules.vshape`` calls the
    Python form (``zb_v_phases.py_func``) with an array of devices."""
    a = 2 * (p - d) - 1
    K = n - 2 * p + d + 1
    T = n - p
    P3 = a + 2 * d
    P4 = P3 + 3 * (p - d)
    P5 = P4 + 6 * K + 5 * (T - K)
    P5b = P5 + 2 * d
    P5c = P5b + 2 * (p - d)
    P5d = P5c + d
    return a, K, T, P3, P4, P5, P5b, P5c, P5d


@njit(cache=True, nogil=True, inline="always")
def _zb_v_steady(t, K, P4, early, late):
    """Slot of an op at offset early (late) of ZB-V's steady iteration t,
    which starts at P4 + 6 min(t, K) + 5 max(0, t - K). Inlined: called
    with five pairs of literal offsets, a kernel would compile five times."""
    if t < K:
        return P4 + 6 * t + early
    return P4 + 6 * K + 5 * (t - K) + late


@njit(cache=True, nogil=True)
def zb_v_columns(out, p, m, d0, d1):
    """ZB-V, for m >= 2p - 1 (every slot holds an op).

    Each op's slot is the closed form of ``schedules.vshape._zb_v_slots``
    (the same phases, per op instead of per array).
    """
    n = m
    length = 6 * m
    # Slots of microbatch j's F, F, B, B, W, W (chunk 0, chunk 1 in turn).
    pos = np.empty(6, np.int64)
    for d in range(d0, d1):
        a, K, T, P3, P4, P5, P5b, P5c, P5d = zb_v_phases(p, n, d)
        c1 = 2 * p - 1 - d
        for j in range(n):
            if j < a:
                pos[0] = j
            elif j < a + d:
                pos[0] = a + 2 * (j - a) + 1
            else:
                pos[0] = P4 + 6 * (j - (a + d))
            if j < d:
                pos[1] = a + 2 * j
            elif j < p:
                pos[1] = P3 + 3 * (j - d)
            else:
                pos[1] = _zb_v_steady(j - p, K, P4, 3, 2)
            if j < T:
                pos[2] = _zb_v_steady(j, K, P4, 1, 0)
            elif j < T + d:
                pos[2] = P5 + 2 * (j - T)
            else:
                pos[2] = P5b + 2 * (j - T - d)
            if j < p - d:
                pos[3] = P3 + 3 * j + 1
            elif j < n - d:
                pos[3] = _zb_v_steady(j - (p - d), K, P4, 4, 3)
            else:
                pos[3] = P5 + 2 * (j - (n - d)) + 1
            if j < T:
                pos[4] = _zb_v_steady(j, K, P4, 2, 1)
            elif j < n - d:
                pos[4] = P5b + 2 * (j - T) + 1
            else:
                pos[4] = P5d + (j - (n - d))
            if j < p - d:
                pos[5] = P3 + 3 * j + 2
            elif j < n - d:
                pos[5] = _zb_v_steady(j - (p - d), K, P4, 5, 4)
            else:
                pos[5] = P5c + (j - (n - d))
            for q in range(6):
                code = F if q < 2 else (B if q < 4 else W)
                if _put(out, length, d, pos[q], code, d if (q & 1) == 0 else c1, j):
                    return 1
    return 0


@njit(cache=True, nogil=True)
def interleaved_columns(out, p, m, v, d0, d1):
    """Interleaved 1F1B: the closed form of
    ``schedules.interleaved.build_interleaved`` per op (the k-th forward
    and the k-th backward of each device).
    """
    total = m * v
    length = 2 * total
    for d in range(d0, d1):
        warm = total if m == p else min(2 * (p - d - 1) + (v - 1) * p, total)
        for k in range(total):
            chunk = (k // p) % v
            j = (k // (p * v)) * p + k % p
            s = k if k < warm else 2 * k - warm
            if _put(out, length, d, s, F, chunk * p + d, j):
                return 1
            s = warm + 2 * k + 1 if k < total - warm else total + k
            if _put(out, length, d, s, BW, (v - 1 - chunk) * p + d, j):
                return 1
    return 0


@njit(cache=True, nogil=True)
def one_f_one_b_columns(out, p, m, warm, d0, d1):
    """1F1B with ``warm[d]`` warm-up forwards on device d
    (``schedules.onef1b._one_f_one_b_slots``): F(j) in slot j during the
    warm-up, else 2j - k + 1; BW(j) in slot k + 2j while forwards remain,
    else m + j."""
    length = 2 * m
    for d in range(d0, d1):
        k = warm[d]
        for j in range(m):
            s = j if j < k else 2 * j - k + 1
            if _put(out, length, d, s, F, d, j):
                return 1
            s = k + 2 * j if j < m - k else m + j
            if _put(out, length, d, s, BW, d, j):
                return 1
    return 0


@njit(cache=True, nogil=True)
def split_1f1b_columns(out, p, m, warm, lag, d0, d1):
    """1F1B with split backwards (``schedules.zerobubble.split_1f1b_slots``):
    k = min(warm[d], m), L = lag[d], B(j) in slot g(j) = k + j + max(0, j -
    L) + min(j, m - k); W(j) after B(j + L), or at 2m + j in the tail;
    F(j) in slot j during the warm-up, else after B(j - k) and its W."""
    length = 3 * m
    for d in range(d0, d1):
        k = min(warm[d], m)
        L = lag[d]
        for j in range(m):
            g = k + j + max(0, j - L) + min(j, m - k)
            if _put(out, length, d, g, B, d, j):
                return 1
            if j + L < m:
                i = j + L
                s = k + i + max(0, i - L) + min(i, m - k) + 1
            else:
                s = 2 * m + j
            if _put(out, length, d, s, W, d, j):
                return 1
            if j < k:
                s = j
            else:
                i = j - k
                s = k + i + max(0, i - L) + min(i, m - k) + 1 + (1 if i >= L else 0)
            if _put(out, length, d, s, F, d, j):
                return 1
    return 0


@njit(cache=True, nogil=True)
def gpipe_columns(out, p, m, d0, d1):
    """GPipe: F(j) in slot j, BW(j) in slot m + j, on every device."""
    length = 2 * m
    for d in range(d0, d1):
        for j in range(m):
            if _put(out, length, d, j, F, d, j):
                return 1
            if _put(out, length, d, m + j, BW, d, j):
                return 1
    return 0


@njit(cache=True, nogil=True)
def looped_bfs_columns(out, p, m, v, d0, d1):
    """Looped BFS (``schedules.bfs``): forward i of device d is chunk i // m,
    microbatch i % m, in slot i; its backward is in slot 2vm - 1 - i."""
    length = 2 * v * m
    for d in range(d0, d1):
        for i in range(v * m):
            st = (i // m) * p + d
            j = i % m
            if _put(out, length, d, i, F, st, j):
                return 1
            if _put(out, length, d, length - 1 - i, BW, st, j):
                return 1
    return 0


@njit(cache=True, nogil=True)
def interleaved_zb_columns(out, p, m, v, r, d0, d1):
    """Interleaved zero bubble with rounds of r microbatches
    (``schedules.interleaved.build_interleaved_zb``): the k-th forward,
    B and W of each device at their closed-form slots."""
    total = m * v
    length = 3 * total
    for d in range(d0, d1):
        warm = min((v - 1) * r + p - 1 - d, total)
        for k in range(total):
            chunk = (k // r) % v
            j = (k // (r * v)) * r + k % r
            b_stage = (v - 1 - chunk) * p + d
            if k < warm:
                s = k
            else:
                s = warm + 2 * (k - warm) + max(0, k - warm - d)
            if _put(out, length, d, s, F, chunk * p + d, j):
                return 1
            s = warm + min(k, total - warm) + k + max(0, k - d) + (1 if warm + k < total else 0)
            if _put(out, length, d, s, B, b_stage, j):
                return 1
            if k + d < total:
                i = k + d
                s = (warm + min(i, total - warm) + i + max(0, i - d)
                     + (1 if warm + i < total else 0) + 1)
            else:
                s = 2 * total + k
            if _put(out, length, d, s, W, b_stage, j):
                return 1
    return 0

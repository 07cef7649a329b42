"""Chimera's per-device programs (schedules.chimera, symmetric placement)
written straight into the op table's columns.

The per-op builder (``schedules.chimera._chimera_programs``) stays as the
tested reference; at p=1024, m=8192 it took tens of seconds in Python.
"""

from __future__ import annotations

import numpy as np
from numba import njit

_F, _BW, _AR = 0, 3, 4


@njit(cache=True, inline="always")
def _emit(r, d, kind, stage, mb, o_dev, o_slot, o_kind, o_stage, o_mb, base):
    o_dev[r] = d
    o_slot[r] = r - base
    o_kind[r] = kind
    o_stage[r] = stage
    o_mb[r] = mb
    return r + 1


@njit(cache=True, inline="always")
def _mb(pipe_up, k, p, h):
    # The k-th microbatch of a pipeline: the down one takes the first h of
    # every p microbatches, the up one the other h.
    return (k // h) * p + (h if pipe_up else 0) + k % h


@njit(cache=True)
def chimera_columns(p, m, doubling):
    """Columns ``(device, slot, kind, stage, microbatch)`` of symmetric
    Chimera with even p and m a multiple of p (forward doubling: m a
    multiple of 2p); kinds F, BW and AR (microbatch -1), rows in (device,
    slot) order. Returns ``(ok, ...)``; ok is False if a device's program
    does not come out at 2m + 2 ops (a caller bug)."""
    h = p // 2
    units = m // p
    per = 2 * m + 2
    n = p * per
    o_dev = np.empty(n, np.int32)
    o_slot = np.empty(n, np.int32)
    o_kind = np.empty(n, np.int8)
    o_stage = np.empty(n, np.int32)
    o_mb = np.empty(n, np.int32)
    ok = True
    for d in range(p):
        if d < h:
            own_up, own_st, oth_up, oth_st = False, d, True, p - 1 - d
            a, b = h - d, d
        else:
            own_up, own_st, oth_up, oth_st = True, p - 1 - d, False, d
            a, b = d - h + 1, h - (d - h + 1)
        base = d * per
        r = base
        f_own = 0
        b_own = 0
        f_oth = 0
        b_oth = 0
        if not doubling:
            for unit in range(units):
                for _ in range(a):
                    if unit > 0:
                        r = _emit(r, d, _BW, own_st, _mb(own_up, b_own, p, h),
                                  o_dev, o_slot, o_kind, o_stage, o_mb, base)
                        b_own += 1
                    r = _emit(r, d, _F, own_st, _mb(own_up, f_own, p, h),
                              o_dev, o_slot, o_kind, o_stage, o_mb, base)
                    f_own += 1
                for _ in range(b):
                    r = _emit(r, d, _F, oth_st, _mb(oth_up, f_oth, p, h),
                              o_dev, o_slot, o_kind, o_stage, o_mb, base)
                    f_oth += 1
                    r = _emit(r, d, _F, own_st, _mb(own_up, f_own, p, h),
                              o_dev, o_slot, o_kind, o_stage, o_mb, base)
                    f_own += 1
                for _ in range(a):
                    r = _emit(r, d, _F, oth_st, _mb(oth_up, f_oth, p, h),
                              o_dev, o_slot, o_kind, o_stage, o_mb, base)
                    f_oth += 1
                    r = _emit(r, d, _BW, oth_st, _mb(oth_up, b_oth, p, h),
                              o_dev, o_slot, o_kind, o_stage, o_mb, base)
                    b_oth += 1
                for _ in range(b):
                    r = _emit(r, d, _BW, own_st, _mb(own_up, b_own, p, h),
                              o_dev, o_slot, o_kind, o_stage, o_mb, base)
                    b_own += 1
                    r = _emit(r, d, _BW, oth_st, _mb(oth_up, b_oth, p, h),
                              o_dev, o_slot, o_kind, o_stage, o_mb, base)
                    b_oth += 1
        else:
            for step in range(units // 2):
                for _ in range(a):
                    if step > 0:
                        r = _emit(r, d, _BW, own_st, _mb(own_up, b_own, p, h),
                                  o_dev, o_slot, o_kind, o_stage, o_mb, base)
                        b_own += 1
                    for _ in range(2):
                        r = _emit(r, d, _F, own_st, _mb(own_up, f_own, p, h),
                                  o_dev, o_slot, o_kind, o_stage, o_mb, base)
                        f_own += 1
                for _ in range(b):
                    for _ in range(2):
                        r = _emit(r, d, _F, oth_st, _mb(oth_up, f_oth, p, h),
                                  o_dev, o_slot, o_kind, o_stage, o_mb, base)
                        f_oth += 1
                    for _ in range(2):
                        r = _emit(r, d, _F, own_st, _mb(own_up, f_own, p, h),
                                  o_dev, o_slot, o_kind, o_stage, o_mb, base)
                        f_own += 1
                for _ in range(a):
                    for _ in range(2):
                        r = _emit(r, d, _F, oth_st, _mb(oth_up, f_oth, p, h),
                                  o_dev, o_slot, o_kind, o_stage, o_mb, base)
                        f_oth += 1
                    r = _emit(r, d, _BW, oth_st, _mb(oth_up, b_oth, p, h),
                              o_dev, o_slot, o_kind, o_stage, o_mb, base)
                    b_oth += 1
                for _ in range(b + h):
                    r = _emit(r, d, _BW, own_st, _mb(own_up, b_own, p, h),
                              o_dev, o_slot, o_kind, o_stage, o_mb, base)
                    b_own += 1
                    r = _emit(r, d, _BW, oth_st, _mb(oth_up, b_oth, p, h),
                              o_dev, o_slot, o_kind, o_stage, o_mb, base)
                    b_oth += 1
        # The gradient all-reduces, as in the reference (middle devices
        # sync the other pipeline's stage after their tail).
        middle = d == h - 1 or d == h
        if r + a + 2 - base != per:
            ok = False
            break
        if not middle:
            r = _emit(r, d, _AR, oth_st, -1, o_dev, o_slot, o_kind, o_stage, o_mb, base)
        for _ in range(a):
            r = _emit(r, d, _BW, own_st, _mb(own_up, b_own, p, h),
                      o_dev, o_slot, o_kind, o_stage, o_mb, base)
            b_own += 1
        if middle:
            r = _emit(r, d, _AR, oth_st, -1, o_dev, o_slot, o_kind, o_stage, o_mb, base)
        r = _emit(r, d, _AR, own_st, -1, o_dev, o_slot, o_kind, o_stage, o_mb, base)
    return ok, o_dev, o_slot, o_kind, o_stage, o_mb

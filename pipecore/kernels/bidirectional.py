"""Two-pipeline schedules' per-device programs written straight into the
op table's columns: symmetric Chimera (schedules.chimera) and BitPipe
(schedules.bitpipe).

The per-op builders (``schedules.chimera._chimera_programs``,
``schedules.bitpipe._bitpipe_reference``) stay as the tested references; at
p=1024, m=8192 they took tens of seconds in Python.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .codes import AR as _AR
from .codes import BW as _BW
from .codes import F as _F


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
def chimera_columns(p, m, doubling, out):
    """Columns ``(device, slot, kind, stage, microbatch)`` of symmetric
    Chimera with even p and m a multiple of p (forward doubling: m a
    multiple of 2p); kinds F, BW and AR (microbatch -1), rows in (device,
    slot) order, written into ``out`` (five arrays of p(2m + 2) int32, int8
    for the kind, allocated by the caller). Returns ``(ok, ...)``; ok is
    False if a device's program does not come out at 2m + 2 ops (a caller
    bug)."""
    h = p // 2
    units = m // p
    per = 2 * m + 2
    o_dev, o_slot, o_kind, o_stage, o_mb = out
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


@njit(cache=True)
def bitpipe_columns(p, m, out):
    """Columns of BitPipe (schedules.bitpipe, the authors' order) for even p
    and m a multiple of p, rows in (device, slot) order, written into
    ``out`` (five arrays of p(4m + 4)); 4m + 4 ops per device (F and BW on
    four stage replicas, four all-reduces)."""
    h = p // 2
    units = m // p
    per = 4 * m + 4
    o_dev, o_slot, o_kind, o_stage, o_mb = out
    role_stage = np.empty(4, np.int64)  # own1, oth1, own2, oth2
    role_up = np.empty(4, np.int64)
    fr = np.empty(2 * p, np.int64)
    f_stage = np.empty(2 * p, np.int64)
    f_ofs = np.empty(2 * p, np.int64)
    b_stage = np.empty(2 * p, np.int64)
    b_ofs = np.empty(2 * p, np.int64)
    taken = np.empty(4, np.int64)
    for d in range(p):
        if d < h:
            a, b = h - d, d
            role_stage[0], role_stage[1] = d, p - 1 - d
            role_stage[2], role_stage[3] = 2 * p - 1 - d, p + d
            own_up = 0
        else:
            a = d - h + 1
            b = h - a
            role_stage[0], role_stage[1] = p - 1 - d, d
            role_stage[2], role_stage[3] = p + d, 2 * p - 1 - d
            own_up = 1
        role_up[0] = own_up
        role_up[2] = own_up
        role_up[1] = 1 - own_up
        role_up[3] = 1 - own_up
        # The forward role list of one unit (see schedules.bitpipe).
        i = 0
        for _ in range(a):
            fr[i] = 0
            i += 1
        for _ in range(b):
            fr[i] = 1
            fr[i + 1] = 0
            i += 2
        for _ in range(a):
            fr[i] = 1
            fr[i + 1] = 3
            i += 2
        for _ in range(b):
            fr[i] = 2
            fr[i + 1] = 3
            i += 2
        for _ in range(a):
            fr[i] = 2
            i += 1
        for swap in range(2):
            taken[:] = 0
            for i in range(2 * p):
                role = fr[i] if swap == 0 else (fr[i] + 2) % 4  # own1<->own2, oth1<->oth2
                ofs = (h if role_up[role] else 0) + taken[role]
                taken[role] += 1
                if swap == 0:
                    f_stage[i] = role_stage[role]
                    f_ofs[i] = ofs
                else:
                    b_stage[i] = role_stage[role]
                    b_ofs[i] = ofs
        base = d * per
        r = base
        W = 2 * p - a
        for i in range(W):
            r = _emit(r, d, _F, f_stage[i], f_ofs[i], o_dev, o_slot, o_kind, o_stage, o_mb, base)
        for j in range(units):
            for i in range(a):
                r = _emit(r, d, _F, f_stage[W + i], j * p + f_ofs[W + i],
                          o_dev, o_slot, o_kind, o_stage, o_mb, base)
                r = _emit(r, d, _BW, b_stage[i], j * p + b_ofs[i],
                          o_dev, o_slot, o_kind, o_stage, o_mb, base)
            if j < units - 1:
                for i in range(a, W + 1):
                    r = _emit(r, d, _BW, b_stage[i], j * p + b_ofs[i],
                              o_dev, o_slot, o_kind, o_stage, o_mb, base)
                for i in range(a - 1):
                    r = _emit(r, d, _F, f_stage[i], (j + 1) * p + f_ofs[i],
                              o_dev, o_slot, o_kind, o_stage, o_mb, base)
                    r = _emit(r, d, _BW, b_stage[W + 1 + i], j * p + b_ofs[W + 1 + i],
                              o_dev, o_slot, o_kind, o_stage, o_mb, base)
                for i in range(a - 1, W):
                    r = _emit(r, d, _F, f_stage[i], (j + 1) * p + f_ofs[i],
                              o_dev, o_slot, o_kind, o_stage, o_mb, base)
            else:
                for i in range(a, 2 * p):
                    r = _emit(r, d, _BW, b_stage[i], j * p + b_ofs[i],
                              o_dev, o_slot, o_kind, o_stage, o_mb, base)
        # Second-leg all-reduces before the last backward (after it on the
        # two middle devices), first-leg ones at the very end.
        if d == h - 1 or d == h:
            r = _emit(r, d, _AR, role_stage[2], -1, o_dev, o_slot, o_kind, o_stage, o_mb, base)
            r = _emit(r, d, _AR, role_stage[3], -1, o_dev, o_slot, o_kind, o_stage, o_mb, base)
        else:
            last_stage = o_stage[r - 1]
            last_mb = o_mb[r - 1]
            last_kind = o_kind[r - 1]
            r -= 1
            r = _emit(r, d, _AR, role_stage[2], -1, o_dev, o_slot, o_kind, o_stage, o_mb, base)
            r = _emit(r, d, _AR, role_stage[3], -1, o_dev, o_slot, o_kind, o_stage, o_mb, base)
            r = _emit(r, d, last_kind, last_stage, last_mb,
                      o_dev, o_slot, o_kind, o_stage, o_mb, base)
        r = _emit(r, d, _AR, role_stage[0], -1, o_dev, o_slot, o_kind, o_stage, o_mb, base)
        r = _emit(r, d, _AR, role_stage[1], -1, o_dev, o_slot, o_kind, o_stage, o_mb, base)
    return o_dev, o_slot, o_kind, o_stage, o_mb

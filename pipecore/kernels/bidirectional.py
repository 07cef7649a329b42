"""Two-pipeline schedules' per-device programs written straight into the
op table's columns: symmetric Chimera (schedules.chimera) and BitPipe
(schedules.bitpipe).

The per-op builders (``schedules.chimera._chimera_programs``,
``schedules.bitpipe._bitpipe_per_op``) build small shapes and are what the
tests compare these kernels with; at large shapes a Python tuple per op is
too slow.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from .codes import AR as _AR
from .codes import BW as _BW
from .codes import F as _F


class Pipe(NamedTuple):
    """One of the two pipelines as a Chimera device serves it (scalars).

    Attributes
    ----------
    stage : int
        The device's stage in this pipeline.
    first : int
        Offset of the pipeline's microbatches within each group of p: 0 for
        the down pipeline (the first h), h for the up one.
    """

    stage: int
    first: int


class Unit(NamedTuple):
    """One BitPipe unit's forward and backward lists (scratch, per device).

    Attributes
    ----------
    f_stage, f_first : numpy.ndarray of int64, shape (2p,)
        Stage and microbatch (within the unit) of the unit's i-th forward.
    b_stage, b_first : numpy.ndarray of int64, shape (2p,)
        The same of its i-th fused backward.
    """

    f_stage: np.ndarray
    f_first: np.ndarray
    b_stage: np.ndarray
    b_first: np.ndarray


@njit(cache=True, inline="always")
def _emit(r, d, kind, stage, mb, out, base):
    """Op (kind, stage, mb) of device d into row r of ``out`` (a Columns;
    device d's rows start at ``base``); returns the next row."""
    out.device[r] = d
    out.slot[r] = r - base
    out.kind[r] = kind
    out.stage[r] = stage
    out.microbatch[r] = mb
    return r + 1


@njit(cache=True, inline="always")
def _next(r, d, kind, pipe, k, times, p, h, out, base):
    """``times`` ops of ``kind`` (F or BW) of pipeline ``pipe`` on its next
    microbatches, its k-th onwards: the k-th op of a kind of a pipeline is
    on microbatch (k // h) p + first + k % h. Returns (next row, next k)."""
    for _ in range(times):
        r = _emit(r, d, kind, pipe.stage, (k // h) * p + pipe.first + k % h, out, base)
        k += 1
    return r, k


@njit(cache=True)
def chimera_columns(p, m, doubling, out):
    """Columns ``(device, slot, kind, stage, microbatch)`` of symmetric
    Chimera with even p and m a multiple of p (forward doubling: m >= 2p);
    kinds F, BW and AR (microbatch -1), rows in (device, slot) order,
    written into ``out`` (a Columns of p(2m + 2) rows, allocated by the
    caller). Returns ``(ok, out)``; ok is False if a device's program does
    not come out at 2m + 2 ops (a caller bug)."""
    h = p // 2
    per = 2 * m + 2
    units = m // p
    # Forward doubling runs two forwards where direct concatenation runs
    # one, over steps of two units, and drains h more backward pairs per
    # step; an odd unit out runs first, alone (schedules.chimera._plan).
    single = units if not doubling else units % 2
    steps = single + (units // 2 if doubling else 0)
    ok = True
    for d in range(p):
        if d < h:
            own, other = Pipe(d, 0), Pipe(p - 1 - d, h)
            a, b = h - d, d
        else:
            own, other = Pipe(p - 1 - d, h), Pipe(d, 0)
            a, b = d - h + 1, h - (d - h + 1)
        base = d * per
        r = base
        # Forwards and backwards taken so far, per pipeline.
        f_own = b_own = f_oth = b_oth = 0
        for step in range(steps):
            fwd = 1 if step < single else 2
            drain = b if step < single else b + h
            for _ in range(a):
                if step > 0:
                    r, b_own = _next(r, d, _BW, own, b_own, 1, p, h, out, base)
                r, f_own = _next(r, d, _F, own, f_own, fwd, p, h, out, base)
            for _ in range(b):
                r, f_oth = _next(r, d, _F, other, f_oth, fwd, p, h, out, base)
                r, f_own = _next(r, d, _F, own, f_own, fwd, p, h, out, base)
            for _ in range(a):
                r, f_oth = _next(r, d, _F, other, f_oth, fwd, p, h, out, base)
                r, b_oth = _next(r, d, _BW, other, b_oth, 1, p, h, out, base)
            for _ in range(drain):
                r, b_own = _next(r, d, _BW, own, b_own, 1, p, h, out, base)
                r, b_oth = _next(r, d, _BW, other, b_oth, 1, p, h, out, base)
        # The gradient all-reduces, as in the reference (middle devices
        # sync the other pipeline's stage after their tail).
        middle = d == h - 1 or d == h
        if r + a + 2 - base != per:
            ok = False
            break
        if not middle:
            r = _emit(r, d, _AR, other.stage, -1, out, base)
        r, b_own = _next(r, d, _BW, own, b_own, a, p, h, out, base)
        if middle:
            r = _emit(r, d, _AR, other.stage, -1, out, base)
        r = _emit(r, d, _AR, own.stage, -1, out, base)
    return ok, out


@njit(cache=True, inline="always")
def _forwards(r, d, unit, lo, hi, shift, out, base):
    """The unit's forwards lo to hi - 1, microbatches shifted by ``shift``."""
    for i in range(lo, hi):
        r = _emit(r, d, _F, unit.f_stage[i], shift + unit.f_first[i], out, base)
    return r


@njit(cache=True, inline="always")
def _backwards(r, d, unit, lo, hi, shift, out, base):
    """The unit's fused backwards lo to hi - 1, microbatches shifted by ``shift``."""
    for i in range(lo, hi):
        r = _emit(r, d, _BW, unit.b_stage[i], shift + unit.b_first[i], out, base)
    return r


@njit(cache=True, inline="always")
def _pairs(r, d, unit, f_lo, f_shift, b_lo, b_shift, n, out, base):
    """n pairs: forward f_lo + i, then backward b_lo + i."""
    for i in range(n):
        r = _forwards(r, d, unit, f_lo + i, f_lo + i + 1, f_shift, out, base)
        r = _backwards(r, d, unit, b_lo + i, b_lo + i + 1, b_shift, out, base)
    return r


@njit(cache=True, inline="always")
def _roles(fr, i, n, first, second):
    """n times the roles ``first, second`` (``second`` -1: ``first`` alone)
    from position i of the role list ``fr``; returns the next position."""
    for _ in range(n):
        fr[i] = first
        i += 1
        if second >= 0:
            fr[i] = second
            i += 1
    return i


# A BitPipe device's four roles: its own pipeline's and the other one's
# stage on the first and on the second leg of the V.
_OWN1, _OTH1, _OWN2, _OTH2 = 0, 1, 2, 3


@njit(cache=True)
def bitpipe_columns(p, m, out):
    """Columns of BitPipe (schedules.bitpipe, the authors' order) for even p
    and m a multiple of p, rows in (device, slot) order, written into
    ``out`` (a Columns of p(4m + 4) rows); 4m + 4 ops per device (F and BW
    on four stage replicas, four all-reduces). Returns ``out``."""
    h = p // 2
    units = m // p
    per = 4 * m + 4
    role_stage = np.empty(4, np.int64)  # indexed by _OWN1 ... _OTH2
    role_up = np.empty(4, np.int64)
    fr = np.empty(2 * p, np.int64)
    unit = Unit(np.empty(2 * p, np.int64), np.empty(2 * p, np.int64),
                np.empty(2 * p, np.int64), np.empty(2 * p, np.int64))
    taken = np.empty(4, np.int64)
    for d in range(p):
        if d < h:
            a, b = h - d, d
            role_stage[_OWN1], role_stage[_OTH1] = d, p - 1 - d
            role_stage[_OWN2], role_stage[_OTH2] = 2 * p - 1 - d, p + d
            own_up = 0
        else:
            a = d - h + 1
            b = h - a
            role_stage[_OWN1], role_stage[_OTH1] = p - 1 - d, d
            role_stage[_OWN2], role_stage[_OTH2] = p + d, 2 * p - 1 - d
            own_up = 1
        role_up[_OWN1] = own_up
        role_up[_OWN2] = own_up
        role_up[_OTH1] = 1 - own_up
        role_up[_OTH2] = 1 - own_up
        # The forward role list of one unit (see schedules.bitpipe).
        i = _roles(fr, 0, a, _OWN1, -1)
        i = _roles(fr, i, b, _OTH1, _OWN1)
        i = _roles(fr, i, a, _OTH1, _OTH2)
        i = _roles(fr, i, b, _OWN2, _OTH2)
        _roles(fr, i, a, _OWN2, -1)
        # Each role takes its pipeline's microbatches in order; the backward
        # list swaps the legs (own1<->own2, oth1<->oth2).
        for swap in range(2):
            taken[:] = 0
            for i in range(2 * p):
                role = fr[i] if swap == 0 else (fr[i] + 2) % 4
                ofs = (h if role_up[role] else 0) + taken[role]
                taken[role] += 1
                if swap == 0:
                    unit.f_stage[i] = role_stage[role]
                    unit.f_first[i] = ofs
                else:
                    unit.b_stage[i] = role_stage[role]
                    unit.b_first[i] = ofs
        base = d * per
        W = 2 * p - a  # warm-up forwards
        r = _forwards(base, d, unit, 0, W, 0, out, base)
        for j in range(units):
            r = _pairs(r, d, unit, W, j * p, 0, j * p, a, out, base)
            if j < units - 1:
                # The unit's remaining backwards interleave with the next
                # unit's warm-up.
                r = _backwards(r, d, unit, a, W + 1, j * p, out, base)
                r = _pairs(r, d, unit, 0, (j + 1) * p, W + 1, j * p, a - 1, out, base)
                r = _forwards(r, d, unit, a - 1, W, (j + 1) * p, out, base)
            else:
                r = _backwards(r, d, unit, a, 2 * p, j * p, out, base)
        # Second-leg all-reduces before the last backward (after it on the
        # two middle devices), first-leg ones at the very end.
        middle = d == h - 1 or d == h
        last = r - 1
        last_kind, last_stage, last_mb = out.kind[last], out.stage[last], out.microbatch[last]
        if not middle:
            r = last  # the last backward moves after the second-leg all-reduces
        r = _emit(r, d, _AR, role_stage[_OWN2], -1, out, base)
        r = _emit(r, d, _AR, role_stage[_OTH2], -1, out, base)
        if not middle:
            r = _emit(r, d, last_kind, last_stage, last_mb, out, base)
        r = _emit(r, d, _AR, role_stage[_OWN1], -1, out, base)
        r = _emit(r, d, _AR, role_stage[_OTH1], -1, out, base)
    return out

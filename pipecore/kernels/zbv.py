"""One pass of the greedy ZB-V layout of ``schedules.generate.zbv_greedy``.

The same rules, step for step, on flat arrays; the Python pass
(``generate._one_pass_python``) stays for small shapes and for values too
wide for this kernel, and the tests compare the two.

The rules compare sums of times for equality, so the caller scales every
time and memory amount to an exact integer. At the paper's costs those
integers need ~75 bits (a 52-bit mantissa times thousands of ops), more
than int64: each amount here is a pair ``(hi, lo)`` meaning
``hi * 2**32 + lo`` with ``0 <= lo < 2**32``, exact to about 2**94. Only
addition, subtraction and comparison are needed.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from .codes import B as _B
from .codes import F as _F
from .codes import W as _W

_MASK = (1 << 32) - 1

class ZbvCosts(NamedTuple):
    """The scaled amounts of one pass (inputs), each an int64 (hi, lo) pair.

    Attributes
    ----------
    times : numpy.ndarray of int64, shape (4, 2)
        Durations of F, B and W (rows ``codes.F``, ``B``, ``W``), then the
        communication time (row 3).
    mems : numpy.ndarray of int64, shape (5, 2)
        Memory deltas of F, B and W, then limit - delta B (row 3) and
        limit - delta F (row 4).
    allow : numpy.ndarray of int64, shape (p, 2)
        Each device's allowance of idle time.
    """

    times: np.ndarray
    mems: np.ndarray
    allow: np.ndarray


class ZbvState(NamedTuple):
    """The pass's running state (scratch) and the layout it writes (output).

    Attributes
    ----------
    acc : numpy.ndarray of int64, shape (4, max(p, 2), 2)
        Amounts: rows 0 clock, 1 memory, 2 idle per device; ``acc[3, 0]``
        the most idle time of any device (idle only grows, from 0),
        ``acc[3, 1]`` the largest allowance.
    count : numpy.ndarray of int64, shape (p, 3, 2)
        Ops placed per device, kind (F, B, W) and chunk.
    end : numpy.ndarray of int64, shape (2, 2, p, m, 2)
        Finish time of each placed F and B: kind, chunk, device, microbatch.
    pw : numpy.ndarray of int64, shape (p, 2m)
        Each device's queue of pending W (their chunks), oldest first.
    ptr : numpy.ndarray of int64, shape (3, p)
        Rows 0 head and 1 tail of the ``pw`` queue, 2 ops placed so far.
    order : numpy.ndarray of int64, shape (3, p, 6m)
        Output: each device's ops in order, ``order[0]`` kind,
        ``order[1]`` chunk, ``order[2]`` microbatch.
    """

    acc: np.ndarray
    count: np.ndarray
    end: np.ndarray
    pw: np.ndarray
    ptr: np.ndarray
    order: np.ndarray


# Return codes of zbv_pass.
OK = 0
STALL = 1  # the rules ask for an op whose input is not placed, or a W when none is pending
OVERFLOW = 2  # more ops than the arrays hold (never, by the rules' counts): use the reference


@njit(cache=True)
def _add(ah, al, bh, bl):
    lo = al + bl
    return ah + bh + (lo >> 32), lo & _MASK


@njit(cache=True)
def _sub(ah, al, bh, bl):
    lo = al - bl  # in (-2**32, 2**32): the arithmetic shift gives the borrow
    return ah - bh + (lo >> 32), lo & _MASK


@njit(cache=True)
def _lt(ah, al, bh, bl):
    return ah < bh or (ah == bh and al < bl)


@njit(cache=True)
def _put(kind, chunk, d, p, m, cost, state):
    """Place device d's next op of this kind and chunk; OK, STALL or OVERFLOW."""
    times, mems = cost.times, cost.mems
    acc, count, end, pw, ptr, order = (state.acc, state.count, state.end, state.pw, state.ptr,
                                       state.order)
    j = count[d, kind, chunk]
    o = ptr[2, d]
    if j >= m or o >= order.shape[2]:
        return OVERFLOW
    rh = acc[0, d, 0]
    rl = acc[0, d, 1]
    if kind != _W:
        # Index 0 runs down the devices, index 1 up; the ends have no source.
        prev = d - 1 if chunk == 0 else d + 1
        if 0 <= prev < p:
            if count[prev, kind, chunk] <= j:
                return STALL
            eh, el = _add(end[kind, chunk, prev, j, 0], end[kind, chunk, prev, j, 1],
                          times[3, 0], times[3, 1])
            if _lt(rh, rl, eh, el):
                rh = eh
                rl = el
    if count[d, _F, 0] > 0:
        gh, gl = _sub(rh, rl, acc[0, d, 0], acc[0, d, 1])
        ih, il = _add(acc[2, d, 0], acc[2, d, 1], gh, gl)
        acc[2, d, 0] = ih
        acc[2, d, 1] = il
        if _lt(acc[3, 0, 0], acc[3, 0, 1], ih, il):
            acc[3, 0, 0] = ih
            acc[3, 0, 1] = il
    fh, fl = _add(rh, rl, times[kind, 0], times[kind, 1])
    if kind != _W:
        end[kind, chunk, d, j, 0] = fh
        end[kind, chunk, d, j, 1] = fl
    acc[0, d, 0] = fh
    acc[0, d, 1] = fl
    mh, ml = _add(acc[1, d, 0], acc[1, d, 1], mems[kind, 0], mems[kind, 1])
    acc[1, d, 0] = mh
    acc[1, d, 1] = ml
    order[0, d, o] = kind
    order[1, d, o] = chunk
    order[2, d, o] = j
    ptr[2, d] = o + 1
    count[d, kind, chunk] = j + 1
    if kind == _B:
        pw[d, ptr[1, d]] = chunk
        ptr[1, d] += 1
    return OK


@njit(cache=True)
def _put_w(d, p, m, cost, state):
    """Device d's oldest pending W; STALL when none is pending."""
    h = state.ptr[0, d]
    if h == state.ptr[1, d]:
        return STALL
    state.ptr[0, d] = h + 1
    return _put(np.int64(_W), state.pw[d, h], d, p, m, cost, state)


@njit(cache=True)
def _w_while_over(d, limit, p, m, cost, state):
    """Device d's pending Ws while its memory is above ``cost.mems[limit]``.

    Callers pass ``limit`` as an int64, not a literal: Numba compiles a
    kernel once per literal value it is called with."""
    while _lt(cost.mems[limit, 0], cost.mems[limit, 1], state.acc[1, d, 0], state.acc[1, d, 1]):
        s = _put_w(d, p, m, cost, state)
        if s:
            return s
    return OK


@njit(cache=True, inline="always")
def _chunk1_due(count, kind, d, p):
    """Whether device d runs its chunk 1 next among ops of this kind: that
    chunk trails its chunk 0 and its input is there (d is the last device,
    where the V turns, or device d + 1 ran that op of its chunk 1)."""
    n1 = count[d, kind, 1]
    return n1 < count[d, kind, 0] and (d == p - 1 or count[d + 1, kind, 1] > n1)


@njit(cache=True)
def _gap(kind, chunk, d, p, cost, state):
    """(known, hi, lo): how long device d would wait for its next op's input."""
    times, acc, count, end = cost.times, state.acc, state.count, state.end
    j = count[d, kind, chunk]
    prev = d - 1 if chunk == 0 else d + 1
    if not 0 <= prev < p or count[prev, kind, chunk] <= j:
        return False, 0, 0
    eh, el = _add(end[kind, chunk, prev, j, 0], end[kind, chunk, prev, j, 1],
                  times[3, 0], times[3, 1])
    gh, gl = _sub(eh, el, acc[0, d, 0], acc[0, d, 1])
    return True, gh, gl


@njit(cache=True)
def _fill_and_put(kind, chunk, d, force_w, p, m, cost, state):
    """Pending Ws into the wait for this op's input, then the op."""
    times, allow, acc, ptr = cost.times, cost.allow, state.acc, state.ptr
    known, gh, gl = _gap(kind, chunk, d, p, cost, state)
    # Run W while the input would not arrive before the W finishes.
    while ptr[0, d] < ptr[1, d] and known and not _lt(gh, gl, times[_W, 0], times[_W, 1]):
        s = _put_w(d, p, m, cost, state)
        if s:
            return s
        known, gh, gl = _gap(kind, chunk, d, p, cost, state)
    if ptr[0, d] < ptr[1, d] and known and force_w:
        # Budget: idle time d may still absorb without raising the worst
        # device's (acc[3, 1] is the largest allowance).
        xh, xl = _sub(acc[3, 1, 0], acc[3, 1, 1], allow[d, 0], allow[d, 1])
        if _lt(xh, xl, acc[3, 0, 0], acc[3, 0, 1]):
            xh = acc[3, 0, 0]
            xl = acc[3, 0, 1]
        bh, bl = _sub(xh, xl, acc[2, d, 0], acc[2, d, 1])
        if _lt(bh, bl, gh, gl):
            s = _put_w(d, p, m, cost, state)
            if s:
                return s
    return _put(kind, chunk, d, p, m, cost, state)


@njit(cache=True)
def zbv_pass(p, m, times, mems, warm_thr, fill_f, fill_b, allow, idle, order, ocount):
    """One greedy ZB-V layout (``generate._one_pass_python``'s rules).

    Amounts are (hi, lo) pairs (module docstring). ``times`` rows: F, B, W
    durations and comm; ``mems`` rows: F, B, W memory deltas, then
    limit - delta B and limit - delta F; ``warm_thr[d]`` is
    limit - delta F * (2 + 2d); ``allow`` (p, 2) the allowances. Fills
    ``idle`` (p, 2) and each device's order ``order[0]`` kind, ``order[1]``
    chunk, ``order[2]`` index (each (p, 6m)), ``ocount[d]`` entries long.
    Returns OK, STALL or OVERFLOW.
    """
    acc = np.zeros((4, max(p, 2), 2), np.int64)  # row 3 holds two amounts even at p=1
    count = np.zeros((p, 3, 2), np.int64)
    end = np.zeros((2, 2, p, m, 2), np.int64)
    pw = np.zeros((p, 2 * m), np.int64)
    ptr = np.zeros((3, p), np.int64)
    first = np.zeros(p, np.int64)
    cost = ZbvCosts(times, mems, allow)
    state = ZbvState(acc, count, end, pw, ptr, order)
    acc[3, 1, 0] = allow[0, 0]
    acc[3, 1, 1] = allow[0, 1]
    for d in range(1, p):
        if _lt(acc[3, 1, 0], acc[3, 1, 1], allow[d, 0], allow[d, 1]):
            acc[3, 1, 0] = allow[d, 0]
            acc[3, 1, 1] = allow[d, 1]
    # np.int64(...) rather than the constants: a literal argument would make
    # Numba compile _put once per kind.
    kf = np.int64(_F)
    kb = np.int64(_B)
    zero = np.int64(0)
    one = np.int64(1)
    s = OK

    for d in range(p):
        s = _put(kf, zero, d, p, m, cost, state)
        if s:
            return s
    for d in range(p - 1, -1, -1):
        if d < p - 1:
            ah, al = _add(end[_F, 1, d + 1, 0, 0], end[_F, 1, d + 1, 0, 1],
                          times[3, 0], times[3, 1])
            while True:
                if _lt(warm_thr[d, 0], warm_thr[d, 1], acc[1, d, 0], acc[1, d, 1]):
                    break
                nh, nl = _add(acc[0, d, 0], acc[0, d, 1], times[_F, 0], times[_F, 1])
                if _lt(ah, al, nh, nl) or count[d, _F, 0] >= m:
                    break
                for e in range(d + 1):
                    s = _put(kf, zero, e, p, m, cost, state)
                    if s:
                        return s
        s = _put(kf, one, d, p, m, cost, state)
        if s:
            return s
    chunk = zero
    for d in range(1, p):
        while (count[d, _F, 0] + count[d, _F, 1]
               < count[d - 1, _F, 0] + count[d - 1, _F, 1]):
            for e in range(p - 1, d - 1, -1):
                if count[e, _F, chunk] < m:
                    s = _put(kf, chunk, e, p, m, cost, state)
                    if s:
                        return s
            chunk = 1 - chunk

    for _ in range(2 * m):
        for d in range(p):
            s = _w_while_over(d, np.int64(3), p, m, cost, state)  # room for a B
            if s:
                return s
        # Each device's backward chunk, all chosen before any is placed.
        for d in range(p):
            # Chunk 1 when it is due, or when chunk 0 has no backward left.
            nb0 = count[d, _B, 0]
            due = _chunk1_due(count, kb, d, p) or (nb0 >= m and count[d, _B, 1] < nb0)
            first[d] = 1 if due else 0
        # Chunk-1 devices from the last down, then chunk-0 devices upwards.
        for step in range(2 * p):
            d = p - 1 - step if step < p else step - p
            c = one if step < p else zero
            if first[d] != c:
                continue
            s = _fill_and_put(kb, c, d, c == 1 or fill_b, p, m, cost, state)
            if s:
                return s
        for d in range(p):
            nf0 = count[d, _F, 0]
            nf1 = count[d, _F, 1]
            if nf1 >= m:
                continue
            if _chunk1_due(count, kf, d, p):
                c = one
            elif nf1 >= nf0 or (nf0 < m and (d == 0 or count[d - 1, _F, 0] > nf0)):
                c = zero
            else:
                continue
            s = _w_while_over(d, np.int64(4), p, m, cost, state)  # room for an F
            if s:
                return s
            s = _fill_and_put(kf, c, d, fill_f, p, m, cost, state)
            if s:
                return s
    for d in range(p):
        while ptr[0, d] < ptr[1, d]:
            s = _put_w(d, p, m, cost, state)
            if s:
                return s
    # Element loops: a slice assignment from an array compiles a large
    # shape-mismatch path (seconds of cold compile time).
    for d in range(p):
        idle[d, 0] = acc[2, d, 0]
        idle[d, 1] = acc[2, d, 1]
        ocount[d] = ptr[2, d]
    return OK

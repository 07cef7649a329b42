"""Strict fixed-stream orders written without time steps.

Under a strict order over fixed streams (a device waits for the op it
wants next), each device's next op follows from its own ops so far;
readiness only says when it can run. :func:`strict_kernel` checks that the
programs run to the end (no deadlock) by letting each device go until it
waits on another's stage and waking it when that stage moves, with counts
only; :func:`strict_write_serial` writes every device's program in
contiguous rows, after the check for small tables and beside it, on the
other core, for large ones (:func:`check_beside_write`). The programs equal
``compose.compose_kernel``'s (tests/test_compose.py compares them); where
the check fails, the caller steps through ``compose_kernel`` to say where.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit, prange

from .codes import BW, B, F, W
from .compose import DEADLOCK, OK, WANT_B, WANT_F, WARM


class Streams(NamedTuple):
    """Each device's forward stream as a table, so the kernels look up an op
    instead of dividing (``schedules.compose._streams`` makes it).

    Attributes
    ----------
    chunk, mb : int32 (tables, most ops per stream)
        Row ``of[d]``, column k: the chunk (index among the device's stages)
        and microbatch of the k-th forward of device d's stream (the
        ``kernels.compose._stream`` of its stage count).
    of : int64 (p,)
        Each device's row (devices with as many stages share one).
    """

    chunk: np.ndarray
    mb: np.ndarray
    of: np.ndarray

# What _strict_next says a device does.
RUN = 0
AGAIN = 1  # its warm-up ended: decide again
STUCK = 2  # its next forward is held by its cap for good (or nothing is left)


@njit(cache=True, inline="always")
def _strict_next(stages, tab_c, tab_j, shape, counts, split, lifo):
    """A device's next op under strict fixed streams, from its own counts.

    ``tab_c``, ``tab_j``: the :class:`Streams` tables; ``shape``: (first row
    of its stages in ``stages``, its stage count, microbatches, its row of
    the tables, warm-up forwards, W lag); ``counts``: (its forwards,
    backwards and W's so far, ``want_f``, 1 when microbatches in flight on
    its first stage reach its cap). Plain tuples and arrays, not the
    carriers: this runs once per op. Returns (what, kind, stage,
    microbatch, want): the stage and microbatch of a W are its B's, found by
    the caller."""
    lo, n, m, row, warm, lag = shape
    kf, kb, kw, want, held = counts
    total = n * m
    c0 = stages[lo]
    if want == WARM and kf >= warm:
        want = WANT_B
    pending = kb - kw
    if split and pending > lag:
        return RUN, W, -1, -1, want
    if want == WARM:
        if kf < total:
            s = stages[lo + tab_c[row, kf]]
            j = tab_j[row, kf]
            if s == c0 and held:
                return AGAIN, -1, -1, -1, WANT_B  # the cap ends the warm-up
            return RUN, F, s, j, want
        return AGAIN, -1, -1, -1, WANT_B
    if want == WANT_F and kf < total:
        s = stages[lo + tab_c[row, kf]]
        j = tab_j[row, kf]
        if s == c0 and held:
            return STUCK, -1, -1, -1, want  # only its own backward could free it
        return RUN, F, s, j, WANT_B
    if kb < total:
        # The backward stream: the forward stream reversed ("lifo"), or its
        # rounds with the chunks in decreasing order.
        if lifo:
            c = tab_c[row, total - 1 - kb]
            j = tab_j[row, total - 1 - kb]
        else:
            c = n - 1 - tab_c[row, kb]
            j = tab_j[row, kb]
        return RUN, B if split else BW, stages[lo + c], j, WANT_F
    if split and pending > 0:
        return RUN, W, -1, -1, want
    return STUCK, -1, -1, -1, want


@njit(cache=True)
def strict_kernel(layout, rules, streams, st):
    """Check that a strict fixed-stream order runs to the end, without time steps.

    Under the rules ``schedules.compose._stepless`` accepts, a device's next op is a
    function of its own ops so far (:func:`_strict_next`); readiness only
    says when it can run. So each device goes through its program on its
    own until its next op waits for another device's stage (F on the stage
    before, B on the stage after), and is woken when that stage runs its
    next op of that kind. A device left waiting when none can move is a
    deadlock (or its forward is held by its inflight cap, which under
    strict rules only its own backward could release): the caller reruns
    :func:`compose_kernel` to say where. Nothing is written (the programs
    are written by :func:`strict_write_serial`).
    Continues from the state ``compose_kernel`` left (or a fresh one), and
    changes it.

    Parameters
    ----------
    layout : Layout
    rules : Rules
    streams : Streams
    st : State

    Returns
    -------
    int
        OK or DEADLOCK.
    """
    dev_ptr = layout.dev_ptr
    stages = layout.dev_stages
    out_ptr = layout.out_ptr
    m = layout.m
    split = layout.split
    p = dev_ptr.shape[0] - 1
    S = stages.shape[0]
    tab_c = streams.chunk
    tab_j = streams.mb
    tab_of = streams.of
    lifo = rules.lifo
    warmup = rules.warmup
    lag = rules.lag
    nf = st.nf
    nb = st.nb
    kf_of = st.kf
    kb_of = st.kb
    kw_of = st.kw
    want = st.want_f
    limit = st.limit
    # The device waiting for stage s's next forward (its F on stage s + 1)
    # and for its next backward (its B on stage s - 1); -1: none.
    wait_f = np.full(S, -1, np.int64)
    wait_b = np.full(S, -1, np.int64)
    stack = np.empty(p, np.int64)
    top = 0
    for d in range(p - 1, -1, -1):
        stack[top] = d
        top += 1
    while top > 0:
        top -= 1
        d = stack[top]
        lo = dev_ptr[d]
        n = dev_ptr[d + 1] - lo
        c0 = stages[lo]
        ops = out_ptr[d + 1] - out_ptr[d]
        while kf_of[d] + kb_of[d] + kw_of[d] < ops:
            what, kind, s, j, w = _strict_next(
                stages, tab_c, tab_j, (lo, n, m, tab_of[d], warmup[d], lag[d]),
                (kf_of[d], kb_of[d], kw_of[d], want[d], int(nf[c0] - nb[c0] >= limit[d])),
                split, lifo)
            if what == STUCK:
                break
            if what == AGAIN:
                want[d] = w
                continue
            # Ready? Else wait to be woken by the stage it waits for.
            if kind == F:
                if s > 0 and nf[s - 1] <= j:
                    wait_f[s - 1] = d
                    break
            elif kind != W:
                if nf[s] <= j:
                    break  # its own forward comes later in its program: a deadlock
                if s < S - 1 and nb[s + 1] <= (m - 1 - j if lifo else j):
                    wait_b[s + 1] = d
                    break
            want[d] = w
            if kind == W:
                kw_of[d] += 1
                continue
            # A forward (backward) of stage s: count it, and wake the device
            # waiting for the stage's next forward (backward).
            fwd = kind == F
            (nf if fwd else nb)[s] += 1
            (kf_of if fwd else kb_of)[d] += 1
            waiting = wait_f if fwd else wait_b
            if waiting[s] >= 0:
                stack[top] = waiting[s]
                top += 1
                waiting[s] = -1
    for d in range(p):
        if kf_of[d] + kb_of[d] + kw_of[d] < out_ptr[d + 1] - out_ptr[d]:
            return DEADLOCK
    return OK


@njit(cache=True)
def _write_device(layout, rules, streams, start, out, d):
    """Device d's program, into its rows (see :func:`strict_write_serial`)."""
    dev_ptr = layout.dev_ptr
    stages = layout.dev_stages
    out_ptr = layout.out_ptr
    m = layout.m
    split = layout.split
    tab_c = streams.chunk
    tab_j = streams.mb
    lifo = rules.lifo
    o_dev = out.device
    o_slot = out.slot
    o_kind = out.kind
    o_stage = out.stage
    o_mb = out.microbatch
    lo = dev_ptr[d]
    n = dev_ptr[d + 1] - lo
    c0 = stages[lo]
    shape = (lo, n, m, streams.of[d], rules.warmup[d], rules.lag[d])
    limit = start.limit[d]
    kf = start.kf[d]
    kb = start.kb[d]
    kw = start.kw[d]
    want = start.want_f[d]
    inflight = start.nf[c0] - start.nb[c0]  # microbatches in flight on its first stage
    src = start.w_src[d]
    row = out_ptr[d] + kf + kb + kw
    end = out_ptr[d + 1]
    for r in range(out_ptr[d], row):  # the rows the warm-up's stepping wrote
        o_dev[r] = d
        o_slot[r] = r - out_ptr[d]
    while row < end:
        what, kind, s, j, want = _strict_next(stages, tab_c, tab_j, shape,
                                              (kf, kb, kw, want, int(inflight >= limit)),
                                              split, lifo)
        if what == AGAIN:
            continue
        if what == STUCK:
            break  # not after strict_kernel said OK
        if kind == W:
            while o_kind[src] != B:
                src += 1
            s = o_stage[src]
            j = o_mb[src]
            src += 1
            kw += 1
        elif kind == F:
            kf += 1
            if s == c0:
                inflight += 1
        else:
            kb += 1
            if s == c0:
                inflight -= 1
        o_dev[row] = d
        o_slot[row] = row - out_ptr[d]
        o_kind[row] = kind
        o_stage[row] = s
        o_mb[row] = j
        row += 1


@njit(cache=True)
def strict_write_serial(layout, rules, streams, start, out):
    """Write every device's program under strict fixed streams, device by
    device in contiguous rows. On its own for small tables, once
    :func:`strict_kernel` said OK; beside it for large ones
    (:func:`check_beside_write`).

    Parameters
    ----------
    layout : Layout
    rules : Rules
    streams : Streams
    start : State
        A copy of the State as :func:`strict_kernel` found it (that check
        changes the State): each device writes on from its counts there.
    out : Columns
        Output: every column of every row (``compose_kernel`` leaves device
        and slot to the caller).
    """
    for d in range(layout.dev_ptr.shape[0] - 1):
        _write_device(layout, rules, streams, start, out, d)


@njit(cache=True, parallel=True)
def check_beside_write(layout, rules, streams, st, start, out):
    """:func:`strict_kernel` on one thread while :func:`strict_write_serial`
    writes on the other: the programs do not depend on the check, which
    only says whether to keep them (a deadlock: the caller discards the
    rows and steps through it all to say where).

    Parameters
    ----------
    layout, rules, streams, st
        As :func:`strict_kernel`.
    start, out
        As :func:`strict_write_serial`.

    Returns
    -------
    int
        OK or DEADLOCK.
    """
    status = np.zeros(2, np.int64)
    for t in prange(2):
        if t == 0:
            status[0] = strict_kernel(layout, rules, streams, st)
        else:
            strict_write_serial(layout, rules, streams, start, out)
    return status[0]

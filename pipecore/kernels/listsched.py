"""The list scheduler: one configuration's op and transfer times, in units
(one op, or an overlapped F&B pair). Kernels take the named carriers of
``kernels.carriers`` and never raise: they return a status code; the
Python layer turns it into an error. The semantics are written down in
docs/semantics.md.

Each device runs its program in order; an op starts when the device is
free and every producer is available (finished locally, or its transfer
arrived). A transfer is placed on its link as soon as its producer
finishes: every transfer on link (a, b) is sent by device a, whose ops
finish in program order at non-decreasing times, so creation order is
already the link's (ready time, producer row) order. Zero-serialisation
transfers never occupy a link. The B of an overlapped F&B pair (a row
with ``paired`` set, its F the row before) starts with its F when both are
ready, and the pair takes ``(F + B) * fb_factor``.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .carriers import ListScratch, OpCosts, Times, TransferCosts, Units
from .codes import STATUS_DEADLOCK, STATUS_OK
from .prefetch import prefetch

# x_arrival of a transfer not yet sent: NOT_SENT, or WAITED - d while device
# d waits for it (so no separate table says who waits for what, and the
# sender finds the device to wake where it writes the arrival). Real
# arrivals are >= 0.
NOT_SENT = -1.0
WAITED = -2.0
# At each visit list_units asks for the cache lines this many units (and
# transfers) ahead of the device's first unit to run: a device's next
# visit starts there or near, after hundreds of other devices' visits.
PREFETCH_AHEAD = 8


@njit(cache=True, nogil=True)
def run_units(units, ops, transfers, out, keep):
    """The list scheduler on a schedule's units, for a caller in Python;
    return a status code.

    ``units`` is :func:`~pipecore.core.compile.make_units`' carrier, ``ops``
    an ``OpCosts``, ``transfers`` a ``TransferCosts`` (``cls`` per transfer
    or empty), ``out`` the ``Times`` to write, per op row; each may come as
    its NamedTuple or as the plain tuple of its fields in order
    (``tuple(carrier)``), and is named again here. Numba's dispatcher types
    a plain tuple argument in native code but a NamedTuple through Python,
    at a cost per carrier per call that is a visible share of a small
    schedule's simulation; inside compiled code the carriers cost nothing.
    (One function, not a wrapper around a second one: each level of
    compiled calls optimises the code of the levels below it again when
    Numba compiles it.)

    ``ops.kind`` indexes ``ops.table``'s rows: the kind codes, or the cost
    classes of ``core.rules`` with a matching table. Each op's time is
    multiplied by ``ops.scale`` (empty for none, which skips a
    multiplication by one that would not change a bit); an overlapped pair
    takes ``(F * its scale + B * its scale) * fb_factor``.

    ``ops.code`` (or empty) is ``kind * stages + stage`` per row: then a
    schedule without pairs or scale reads its times from the table itself
    instead of a per-op array, which at a million ops costs more in fresh
    memory and cache than the indirection (see bench/test_bench_simulate.py).

    The arrays must describe a validated schedule with costs >= 0 (see
    ``list_units``). On return ``out.head[d]`` is the row of device d's
    first op that did not run (the end of its rows when it finished). With
    ``keep`` false, ``out.start``, ``out.finish`` and ``out.x_start`` are
    not written and may be empty (a schedule without shared links only)."""
    units = Units(*units)
    ops = OpCosts(*ops)
    transfers = TransferCosts(*transfers)
    out = Times(*out)
    p = units.dev_units.shape[0] - 1
    n = ops.kind.shape[0]
    nu = units.n_units
    unit_rows = units.unit_rows
    nx = units.x_link.shape[0]
    scaled = ops.scale.shape[0] > 0
    # Without overlapped pairs unit u is row u: write the outputs directly
    # (at millions of ops two fewer arrays to allocate and copy).
    direct = nu == n
    rows = unit_rows.shape[0] > 0  # else unit u is row u (make_units' no-pairs form)
    u_start = out.start if direct or not keep else np.empty(n)
    u_finish = out.finish if direct or not keep else np.empty(n)
    u_head = np.empty(p, dtype=np.uint32)
    x_coded = transfers.cls.shape[0] == nx and nx > 0
    # One call site, so Numba compiles list_units once for both cases.
    by_code = direct and not scaled and ops.code.shape[0] == n
    # Fields read in loops go to locals first: each read of a carrier's array
    # field inside a loop costs a reference count update.
    cost_table = ops.table
    kind = ops.kind
    stage = ops.stage
    scale = ops.scale
    start = out.start
    finish = out.finish
    head = out.head
    if by_code:
        table = cost_table
    else:
        table = np.empty(nu)
        for u in range(nu):
            h = unit_rows[u] if rows else u
            cost = _op_cost(cost_table, kind, stage, ops.stages, scale, h, scaled)
            if not rows or unit_rows[u + 1] - h == 1:
                table[u] = cost
            else:
                cost2 = _op_cost(cost_table, kind, stage, ops.stages, scale, h + 1, scaled)
                table[u] = (cost + cost2) * ops.fb_factor
    work = ListScratch(np.empty(units.n_links), np.empty(p, dtype=np.uint32),
                       np.empty(nx, dtype=np.uint32))
    status = list_units(units, ops.code, table, transfers,
                        Times(u_start, u_finish, out.x_start, out.x_arrival, u_head, out.busy,
                              out.dev_free, out.dev_first),
                        work, by_code, x_coded, keep)
    if keep and not direct:
        for u in range(nu):
            h = unit_rows[u]
            start[h] = u_start[u]
            finish[h] = u_finish[u]
            if unit_rows[u + 1] - h == 2:
                start[h + 1] = u_start[u]
                finish[h + 1] = u_finish[u]
    for d in range(p):
        head[d] = unit_rows[u_head[d]] if rows else u_head[d]
    return status


@njit(cache=True, inline="always")
def _op_cost(table, kind, stage, stages, scale, r, scaled):
    # Row r's time: its class and stage's entry of the table, times its scale.
    # The int8 class is widened first: interpreted (core.tier), NumPy keeps
    # int8 * int in int8 and wraps past 127 (class 8 at stage 0 of 16
    # stages read table[-128]); compiled, Numba widens it anyway.
    cost = table[np.int64(kind[r]) * stages + stage[r]]
    if scaled:
        cost = cost * scale[r]
    return cost


@njit(cache=True)
def program_units(dev_ptr, xfer, out_ptr, paired, dev_units, unit_rows, unit_sends, wait_ptr, waits):
    """Split the device programs into units (an op, or an overlapped F&B
    pair) for ``list_units``; return the number of units, nu.

    Writes device d's units ``dev_units[d]..dev_units[d+1]-1`` (p + 1 entries);
    unit u's rows ``unit_rows[u]..unit_rows[u+1]-1`` and the transfers it sends,
    ``unit_sends[u]..unit_sends[u+1]-1`` (F row's first; nu + 1 entries each); the
    transfers it waits for, ``waits[wait_ptr[u]..wait_ptr[u+1]-1]`` (row, then
    slot order; at most nx). Local producers are not listed.
    """
    p = dev_ptr.shape[0] - 1
    u = 0
    k = 0
    for d in range(p):
        dev_units[d] = u
        lo = dev_ptr[d]
        for r in range(lo, dev_ptr[d + 1]):
            # A paired row joins the previous row's unit (pairs never chain:
            # rule "slot-unique").
            if r == lo or not paired[r]:
                unit_rows[u] = r
                unit_sends[u] = out_ptr[r]
                wait_ptr[u] = k
                u += 1
            x = xfer[r, 0]
            if x >= 0:
                waits[k] = x
                k += 1
            x = xfer[r, 1]
            if x >= 0:
                waits[k] = x
                k += 1
    dev_units[p] = u
    unit_rows[u] = dev_ptr[p]
    unit_sends[u] = out_ptr[dev_ptr[p]]
    wait_ptr[u] = k
    return u


@njit(cache=True)
def list_units(units, unit_code, dur, transfers, out, work, u_coded, x_coded, keep):
    """The list scheduler on ``units`` (a :class:`~pipecore.kernels.carriers.Units`);
    return a status code.

    Unit u takes ``dur[unit_code[u]]``; transfer x has serialisation
    ``transfers.ser[transfers.cls[x]]`` and latency ``transfers.lat[...]``
    (so a batch passes small per-configuration tables). With ``u_coded``
    (``x_coded``) false the code of unit u (transfer x) is u (x) itself and
    ``unit_code`` (``transfers.cls``) is not read: one array fewer to
    stream at scale. With ``units.wait_ptr`` empty, unit u is row u of a
    schedule without pairs: its remote inputs are ``units.row_xfer[u]``
    (-1 for none) and its transfers ``row_sends[u]..row_sends[u+1]-1``.
    Writes ``out`` (a ``Times``, per unit): each unit's start and finish,
    each transfer's start and arrival, and per device the first unit not
    run, the busy time summed in program order, the last finish and the
    first unit's start (untouched for a device without units). With
    ``keep`` false the unit starts and finishes and the transfer starts are
    not written (nor read): a summary pass, for results whose per-op times
    are asked later or never. ``work`` is a ``ListScratch``.

    Only remote inputs are checked: in a validated schedule a local
    producer comes earlier in its device's program (rule "order") and,
    durations being >= 0, finishes no later than the device is free, so it
    can neither block a unit nor delay it; deadlocks come from remote waits
    only. A transfer not yet sent has a negative arrival: ``NOT_SENT``, or
    ``WAITED - d`` once device d is blocked on it; its sender reads that
    where it writes the real arrival (>= 0) and revisits device d. Times do
    not depend on the order of visits. On a deadlock the arrivals of the
    transfers never sent are left negative.
    Transfer x starts no earlier than the arrival of ``units.x_after[x]``
    when that is >= 0 (an empty ``x_after``: never); such a transfer is
    always sent earlier by the same device (an offload's copy to host,
    before the copy back).

    A link with ``units.link_shared`` set has several senders (a host link
    shared by devices) and serves its transfers in order of issue time
    (their producer's finish; ties by transfer id, that is by device, then
    program order). Those are held in ``work.pend`` and placed one at a
    time when no device can go on: the one issued first is then safe to
    place, since every device is blocked or done and any transfer issued
    later starts after something placed now arrives.
    """
    # Locals named as in the semantics; unpacking a carrier costs nothing.
    u_ptr = units.dev_units
    u_out = units.unit_sends
    in_ptr = units.wait_ptr
    in_x = units.waits
    xfer = units.row_xfer
    out_ptr = units.row_sends
    x_link = units.x_link
    x_after = units.x_after
    link_shared = units.link_shared
    n_links = units.n_links
    x_cls = transfers.cls
    x_ser = transfers.ser
    x_lat = transfers.lat
    u_start = out.start
    u_finish = out.finish
    x_start = out.x_start
    x_arrival = out.x_arrival
    head = out.head
    busy = out.busy
    dev_free = out.dev_free
    dev_first = out.dev_first
    link_free = work.link_free
    stack = work.stack
    pend = work.pend
    p = u_ptr.shape[0] - 1
    nx = x_link.shape[0]
    by_row = in_ptr.shape[0] == 0
    after = x_after.shape[0] > 0
    # Without a shared link no transfer is held: the per-transfer test of
    # link_shared is skipped (one load fewer per transfer).
    any_shared = False
    for link in range(n_links):
        if link_shared[link]:
            any_shared = True
            break
    x_arrival[:nx] = NOT_SENT
    link_free[:n_links] = 0.0
    top = 0
    for d in range(p - 1, -1, -1):
        head[d] = u_ptr[d]
        busy[d] = 0.0
        dev_free[d] = 0.0
        stack[top] = d
        top += 1

    n_pend = 0
    while True:
        while top > 0:
            top -= 1
            d = stack[top]
            u = head[d]
            end = u_ptr[d + 1]
            t_free = dev_free[d]
            total = busy[d]
            first = u == u_ptr[d]
            if u < end:
                # Hundreds of devices' streams interleave, more than hardware
                # prefetchers follow: ask for this device's next lines now.
                v = u + PREFETCH_AHEAD
                if by_row:
                    prefetch(xfer, 2 * v)  # (n, 2): element 2v starts row v
                    prefetch(out_ptr, v)
                    w = out_ptr[u] + PREFETCH_AHEAD
                else:
                    prefetch(in_ptr, v)
                    prefetch(in_x, in_ptr[u] + PREFETCH_AHEAD)
                    prefetch(u_out, v)
                    w = u_out[u] + PREFETCH_AHEAD
                if u_coded:
                    prefetch(unit_code, v)
                if x_coded:
                    prefetch(x_cls, w)
                prefetch(x_link, w)
                prefetch(x_arrival, w)
                if keep:
                    prefetch(u_start, v)
                    prefetch(u_finish, v)
                    prefetch(x_start, w)
            # The two ways of reading a unit's remote inputs are written out
            # apart: one loop over a (0, 2) or a CSR range was markedly slower
            # (bench/test_bench_interleaved.py).
            while u < end:
                t = t_free
                if by_row:
                    x = xfer[u, 0]
                    if x >= 0:
                        a = x_arrival[x]
                        if a < 0.0:
                            x_arrival[x] = WAITED - d
                            break
                        t = max(t, a)  # select(a > t, a, t), as the semantics' max
                    x = xfer[u, 1]
                    if x >= 0:
                        a = x_arrival[x]
                        if a < 0.0:
                            x_arrival[x] = WAITED - d
                            break
                        t = max(t, a)
                    o0 = out_ptr[u]
                    o1 = out_ptr[u + 1]
                else:
                    blocked = False
                    for j in range(in_ptr[u], in_ptr[u + 1]):
                        x = in_x[j]
                        a = x_arrival[x]
                        if a < 0.0:
                            x_arrival[x] = WAITED - d
                            blocked = True
                            break
                        t = max(t, a)
                    if blocked:
                        break
                    o0 = u_out[u]
                    o1 = u_out[u + 1]
                f = t + dur[unit_code[u] if u_coded else u]
                if keep:
                    u_start[u] = t
                    u_finish[u] = f
                if first:
                    dev_first[d] = t
                    first = False
                total += f - t
                for x in range(o0, o1):
                    cls = x_cls[x] if x_coded else x
                    ser = x_ser[cls]
                    if any_shared and ser != 0.0 and link_shared[x_link[x]]:
                        x_start[x] = f  # its issue time, until it is placed below
                        pend[n_pend] = x
                        n_pend += 1
                        continue
                    s = f
                    if after:
                        y = x_after[x]
                        if y >= 0:
                            s = max(s, x_arrival[y])
                    if ser == 0.0:
                        e = s
                    else:
                        link = x_link[x]
                        s = max(s, link_free[link])
                        e = s + ser
                        link_free[link] = e
                    if keep:
                        x_start[x] = s
                    waiting = x_arrival[x]
                    x_arrival[x] = e + x_lat[cls]
                    # Wake the receiver if it waits for this transfer. Written
                    # out here and below: an inlined helper returning the
                    # stack height made this loop markedly slower.
                    if waiting < NOT_SENT:
                        stack[top] = np.uint32(WAITED - waiting)
                        top += 1
                t_free = f
                u += 1
            head[d] = u
            dev_free[d] = t_free
            busy[d] = total
        if n_pend == 0:
            break
        # Every device is blocked or done: place the held transfer issued first.
        best = 0
        for i in range(1, n_pend):
            a_ = pend[i]
            b_ = pend[best]
            if x_start[a_] < x_start[b_] or (x_start[a_] == x_start[b_] and a_ < b_):
                best = i
        x = pend[best]
        n_pend -= 1
        pend[best] = pend[n_pend]
        cls = x_cls[x] if x_coded else x
        s = x_start[x]
        y = x_after[x] if after else -1
        if y >= 0:  # issued earlier by the same device, so already placed
            s = max(s, x_arrival[y])
        link = x_link[x]
        s = max(s, link_free[link])
        e = s + x_ser[cls]
        link_free[link] = e
        x_start[x] = s
        waiting = x_arrival[x]
        x_arrival[x] = e + x_lat[cls]
        if waiting < NOT_SENT:
            stack[top] = np.uint32(WAITED - waiting)
            top += 1

    for d in range(p):
        if head[d] < u_ptr[d + 1]:
            return STATUS_DEADLOCK
    return STATUS_OK


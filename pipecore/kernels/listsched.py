"""The list scheduler: one configuration's op and transfer times, in units
(one op, or an overlapped F&B pair). Kernels see flat arrays only and never
raise: they return a status code; the Python layer turns it into an error.
The semantics are written down in docs/semantics.md."""

from __future__ import annotations

import numpy as np
from numba import njit

from .codes import STATUS_DEADLOCK, STATUS_OK

NOT_WAITING = 0xFFFFFFFF  # list_units' wait entry of a device not blocked


@njit(cache=True)
def list_schedule(dev_ptr, op_kind, op_stage, dep, xfer, out_ptr, x_dst_dev, x_link,
                  x_ser, x_lat, stage_cost, n_links, paired, fb_factor,
                  start, finish, x_start, x_arrival, head, x_after):
    """Fill op and transfer times; return a status code.

    Each device runs its program in order; an op starts when the device is
    free and every producer is available (finished locally, or its transfer
    arrived). A transfer is placed on its link as soon as its producer
    finishes: every transfer on link (a, b) is sent by device a, whose ops
    finish in program order at non-decreasing times, so creation order is
    already the link's (ready time, producer row) order. Zero-serialisation
    transfers never occupy a link. A row with ``paired`` set is the B of an
    overlapped F&B unit whose F is the previous row: the two start together
    when both are ready and take ``(F + B) * fb_factor``.

    The arrays must describe a validated schedule with costs >= 0: ``dep``
    is not read, since only remote producers (``xfer``) can block or delay
    an op (see ``list_units``). On return ``head[d]`` is the row of device
    d's first op that did not run (``dev_ptr[d+1]`` when the device
    finished). ``x_after[x]`` (or -1) is a transfer that transfer x cannot
    start before the arrival of (an offload's copy back waits for its copy
    to host); an empty ``x_after`` means -1 for every transfer.
    """
    units = make_units(dev_ptr, xfer, out_ptr, paired, x_link, x_dst_dev, x_after,
                       np.zeros(n_links, dtype=np.uint8))
    none = np.empty(0, dtype=np.uint32)
    p = dev_ptr.shape[0] - 1
    return run_units(units, op_kind, op_stage, none, none, x_ser, x_lat, stage_cost, n_links,
                     fb_factor, start, finish, x_start, x_arrival, head, np.empty(0),
                     np.empty(p), np.empty(p), np.empty(p), True)


@njit(cache=True)
def make_units(dev_ptr, xfer, out_ptr, paired, x_link, x_dst_dev, x_after, link_shared):
    """The cost-independent unit arrays ``run_units`` takes (a tuple); a
    schedule's are computed once and reused across simulations.
    ``link_shared[l]`` marks a link with several senders (a host link
    shared by devices), served in issue order (see ``list_units``).

    Without overlapped pairs unit u is row u: the tuple then carries
    ``xfer`` and ``out_ptr`` themselves and empty unit arrays, so nothing
    of the schedule's size is allocated or copied (at 25M ops that was
    about 0.6 GB of fresh memory).
    """
    p = dev_ptr.shape[0] - 1
    n = xfer.shape[0]
    nx = x_dst_dev.shape[0]
    # Indices are never negative: the unsigned views let Numba drop its
    # negative-index fix-up without a copy.
    x_link32 = x_link.view(np.uint32)
    x_dst32 = x_dst_dev.view(np.uint32)
    u_ptr = np.empty(p + 1, dtype=np.uint32)
    has_pairs = False
    for r in range(n):
        if paired[r]:
            has_pairs = True
            break
    if not has_pairs:
        for d in range(p + 1):
            u_ptr[d] = dev_ptr[d]
        none = np.empty(0, dtype=np.uint32)
        return (n, u_ptr, np.empty(0, dtype=np.int64), none, none, none, x_link32, x_dst32,
                x_after, link_shared, xfer, out_ptr)
    u_row = np.empty(n + 1, dtype=np.int64)
    u_out = np.empty(n + 1, dtype=np.uint32)
    in_ptr = np.empty(n + 1, dtype=np.uint32)
    in_x = np.empty(nx, dtype=np.uint32)
    nu = program_units(dev_ptr, xfer, out_ptr, paired, u_ptr, u_row, u_out, in_ptr, in_x)
    return (nu, u_ptr, u_row, u_out, in_ptr, in_x, x_link32, x_dst32, x_after, link_shared,
            xfer[:0], out_ptr[:0])


@njit(cache=True, nogil=True)  # buffers.populate runs beside it
def run_units(units, op_kind, op_stage, op_code, x_cls, x_ser, x_lat, stage_cost, n_links,
              fb_factor, start, finish, x_start, x_arrival, head, op_scale, busy, dev_free,
              dev_first, keep):
    """``list_schedule`` on precomputed units (see ``make_units``).

    ``op_kind`` indexes ``stage_cost``'s rows: the kind codes, or the
    cost classes of ``core.rules`` with a matching table. Each op's time is
    multiplied by ``op_scale`` (stragglers, jitter; an empty array for none,
    which skips a multiplication by one that would not change a bit); an
    overlapped pair takes ``(F * its scale + B * its scale) * fb_factor``.

    ``op_code`` (or empty) is ``op_kind * stages + op_stage`` per row: then
    a schedule without pairs or scale reads its times from ``stage_cost``
    itself instead of a per-op array. ``x_cls`` (or empty) is a class per
    transfer, indexing ``x_ser`` and ``x_lat``; empty: they are per transfer.
    At a million ops a per-op array costs more in fresh memory and cache
    than the indirection (see bench/test_bench_simulate.py).

    ``busy``, ``dev_free`` and ``dev_first`` (p each) receive
    ``list_units``' per-device sums, last finishes and first starts. With
    ``keep`` false, ``start``, ``finish`` and ``x_start`` are not written
    and may be empty (a schedule without shared links only)."""
    nu, u_ptr, u_row, u_out, in_ptr, in_x, x_link32, x_dst32, x_after, shared, xfer, out_ptr = units
    p = u_ptr.shape[0] - 1
    n = op_kind.shape[0]
    nx = x_dst32.shape[0]
    scaled = op_scale.shape[0] > 0
    # Without overlapped pairs unit u is row u: write the outputs directly
    # (at millions of ops two fewer arrays to allocate and copy).
    direct = nu == n
    rows = u_row.shape[0] > 0  # else unit u is row u (make_units' no-pairs form)
    u_start = start if direct or not keep else np.empty(n)
    u_finish = finish if direct or not keep else np.empty(n)
    u_head = np.empty(p, dtype=np.uint32)
    x_coded = x_cls.shape[0] == nx and nx > 0
    # One call site, so Numba compiles list_units once for both cases.
    by_code = direct and not scaled and op_code.shape[0] == n
    if by_code:
        table = stage_cost.ravel()
    else:
        table = np.empty(nu)
        for u in range(nu):
            h = u_row[u] if rows else u
            cost = stage_cost[op_kind[h], op_stage[h]]
            if scaled:
                cost = cost * op_scale[h]
            if not rows or u_row[u + 1] - h == 1:
                table[u] = cost
            else:
                cost2 = stage_cost[op_kind[h + 1], op_stage[h + 1]]
                if scaled:
                    cost2 = cost2 * op_scale[h + 1]
                table[u] = (cost + cost2) * fb_factor
    status = list_units(u_ptr, u_out, in_ptr, in_x, xfer, out_ptr, op_code, table, x_cls,
                        x_ser, x_lat, x_link32, x_dst32, x_after, shared, n_links,
                        u_start, u_finish, x_start, x_arrival, u_head, busy, dev_free,
                        np.empty(n_links), np.empty(p, dtype=np.uint32),
                        np.empty(p, dtype=np.uint32), np.empty(nx, dtype=np.uint32),
                        by_code, x_coded, dev_first, keep)
    if keep and not direct:
        for u in range(nu):
            h = u_row[u]
            start[h] = u_start[u]
            finish[h] = u_finish[u]
            if u_row[u + 1] - h == 2:
                start[h + 1] = u_start[u]
                finish[h + 1] = u_finish[u]
    for d in range(p):
        head[d] = u_row[u_head[d]] if rows else u_head[d]
    return status


@njit(cache=True)
def program_units(dev_ptr, xfer, out_ptr, paired, u_ptr, u_row, u_out, in_ptr, in_x):
    """Split the device programs into units (an op, or an overlapped F&B
    pair) for ``list_units``; return the number of units, nu.

    Writes device d's units ``u_ptr[d]..u_ptr[d+1]-1`` (p + 1 entries);
    unit u's rows ``u_row[u]..u_row[u+1]-1`` and the transfers it sends,
    ``u_out[u]..u_out[u+1]-1`` (F row's first; nu + 1 entries each); the
    transfers it waits for, ``in_x[in_ptr[u]..in_ptr[u+1]-1]`` (row, then
    slot order; at most nx). Local producers are not listed.
    """
    p = dev_ptr.shape[0] - 1
    u = 0
    k = 0
    for d in range(p):
        u_ptr[d] = u
        lo = dev_ptr[d]
        for r in range(lo, dev_ptr[d + 1]):
            # A paired row joins the previous row's unit (pairs never chain:
            # rule "slot-unique").
            if r == lo or not paired[r]:
                u_row[u] = r
                u_out[u] = out_ptr[r]
                in_ptr[u] = k
                u += 1
            x = xfer[r, 0]
            if x >= 0:
                in_x[k] = x
                k += 1
            x = xfer[r, 1]
            if x >= 0:
                in_x[k] = x
                k += 1
    u_ptr[p] = u
    u_row[u] = dev_ptr[p]
    u_out[u] = out_ptr[dev_ptr[p]]
    in_ptr[u] = k
    return u


@njit(cache=True)
def list_units(u_ptr, u_out, in_ptr, in_x, xfer, out_ptr, u_code, dur, x_cls, x_ser, x_lat, x_link,
               x_dst_dev, x_after, link_shared, n_links, u_start, u_finish, x_start, x_arrival,
               head, busy, dev_free, link_free, stack, wait, pend, u_coded, x_coded,
               dev_first, keep):
    """The list scheduler on ``program_units``' units; return a status code.

    Unit u takes ``dur[u_code[u]]``; transfer x has serialisation
    ``x_ser[x_cls[x]]`` and latency ``x_lat[x_cls[x]]`` (so a batch passes
    small per-configuration tables). With ``u_coded`` (``x_coded``) false
    the code of unit u (transfer x) is u (x) itself and ``u_code``
    (``x_cls``) is not read: one array fewer to stream at scale. With
    ``in_ptr`` empty, unit u is row u of a schedule without pairs: its
    remote inputs are ``xfer[u]`` (-1 for none) and its transfers
    ``out_ptr[u]..out_ptr[u+1]-1``. Writes each unit's start and finish,
    each transfer's start and arrival, and per device the first unit not
    run (``head``), the busy time summed in program order (``busy``), the
    last finish (``dev_free``) and the first unit's start (``dev_first``;
    untouched for a device without units). With ``keep`` false the unit
    starts and finishes and the transfer starts are not written (nor
    read): a summary pass, about a third faster at 33M ops, for results
    whose per-op times are asked later or never. ``link_free``, ``stack``
    and ``wait`` (n_links, p and p long) are work arrays. Index arrays are unsigned so
    that Numba leaves out its negative-index fix-up.

    Only remote inputs are checked: in a validated schedule a local
    producer comes earlier in its device's program (rule "order") and,
    durations being >= 0, finishes no later than the device is free, so it
    can neither block a unit nor delay it; deadlocks come from remote waits
    only. A transfer not yet sent has arrival -1 (real ones are >= 0). A
    blocked device records the transfer it waits for and is revisited once
    that one is sent; times do not depend on the order of visits.
    Transfer x starts no earlier than the arrival of ``x_after[x]`` when
    that is >= 0 (an empty ``x_after``: never); such a transfer is always
    sent earlier by the same device (an offload's copy to host, before the
    copy back).

    A link with ``link_shared`` set has several senders (a host link
    shared by devices) and serves its transfers in order of issue time
    (their producer's finish; ties by transfer id, that is by device, then
    program order). Those are held in ``pend`` (nx long) and placed one at
    a time when no device can go on: the one issued first is then safe to
    place, since every device is blocked or done and any transfer issued
    later starts after something placed now arrives.
    """
    p = u_ptr.shape[0] - 1
    nx = x_link.shape[0]
    by_row = in_ptr.shape[0] == 0
    after = x_after.shape[0] > 0
    x_arrival[:nx] = -1.0
    link_free[:n_links] = 0.0
    top = 0
    for d in range(p - 1, -1, -1):
        head[d] = u_ptr[d]
        busy[d] = 0.0
        dev_free[d] = 0.0
        wait[d] = NOT_WAITING
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
            while u < end:
                t = t_free
                blocked = False
                j0, j1 = (0, 2) if by_row else (in_ptr[u], in_ptr[u + 1])
                for j in range(j0, j1):
                    x = xfer[u, j] if by_row else in_x[j]
                    if x < 0:  # by_row only: no remote input in this column
                        continue
                    a = x_arrival[x]
                    if a < 0.0:
                        wait[d] = x
                        blocked = True
                        break
                    t = max(t, a)  # select(a > t, a, t), as the semantics' max
                if blocked:
                    break
                f = t + dur[u_code[u] if u_coded else u]
                if keep:
                    u_start[u] = t
                    u_finish[u] = f
                if u == u_ptr[d]:
                    dev_first[d] = t
                total += f - t
                o0, o1 = (out_ptr[u], out_ptr[u + 1]) if by_row else (u_out[u], u_out[u + 1])
                for x in range(o0, o1):
                    cls = x_cls[x] if x_coded else x
                    ser = x_ser[cls]
                    if ser != 0.0 and link_shared[x_link[x]]:
                        x_start[x] = f  # its issue time, until it is placed below
                        pend[n_pend] = x
                        n_pend += 1
                        continue
                    s = f
                    y = x_after[x] if after else -1
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
                    x_arrival[x] = e + x_lat[cls]
                    c = x_dst_dev[x]
                    if wait[c] == x:
                        wait[c] = NOT_WAITING
                        stack[top] = c
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
        x_arrival[x] = e + x_lat[cls]
        c = x_dst_dev[x]
        if wait[c] == x:
            wait[c] = NOT_WAITING
            stack[top] = c
            top += 1

    for d in range(p):
        if head[d] < u_ptr[d + 1]:
            return STATUS_DEADLOCK
    return STATUS_OK

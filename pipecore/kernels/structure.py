"""Validation and dependency structure of large schedules in one pass.

``core.rules.structure`` checks the rules with numpy over whole columns. At
millions of ops its temporaries (int64 copies, masks, a sort) cost seconds
and gigabytes; these kernels do every kind (F, B, W, BW, R, offloads O and
L to the host or a partner device, and all-reduces of replicated stages)
in a few linear passes into outputs
the caller allocates, carried in the named tuples below. They never
explain a failure: on any broken rule they return a nonzero status and the
numpy path, which names the rule, device, slot and op, runs instead.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from .codes import AR, BW, B, F, L, O, R, W


class OpColumns(NamedTuple):
    """The op table's columns, one entry per op (input). Rows are sorted
    by (device, slot, kind); any integer widths (the table's are int32,
    the kinds int8)."""

    dev: np.ndarray  # (n,) device that runs the op, 0..p-1
    slot: np.ndarray  # (n,) position in that device's program
    kind: np.ndarray  # (n,) kind code (codes.F .. codes.L)
    stage: np.ndarray  # (n,) model stage, 0..S-1
    mb: np.ndarray  # (n,) microbatch, 0..m-1 (an all-reduce's is ignored)


class KeyIndex(NamedTuple):
    """The row of every (stage, microbatch, kind), keyed ``stage * m +
    microbatch``: filled by :func:`structure_fbw_index`, read by
    :func:`structure_fbw_count`. Only the kinds a schedule can hold get a
    column, so an F/B/W or F/BW schedule fills and reads a narrower index."""

    col: np.ndarray  # (8,) int64, in: column of kind k's rows in idx, -1 for none
    #                  (AR rows are never indexed); col[F] == 0
    idx: np.ndarray  # (S*m, c) int32, out: all -1 beforehand, then the row of each
    #                  key's op of kind k in column col[k]
    first_dev: np.ndarray  # (S,) int32, out: the device of each stage's microbatch 0
    stage_mode: np.ndarray  # (S,) int8, in: 0 a stage that trains, 1 a frozen one (F and
    #                         B only), 2 a frozen one below the lowest trainable (F only)


class Dependencies(NamedTuple):
    """What each op waits for (output of pass 1, one row per op; the
    caller allocates, content any beforehand unless said)."""

    paired: np.ndarray  # (n,) bool: the row is the B or BW of an overlapped pair
    #                     whose F is the previous row (shares its slot)
    dep: np.ndarray  # (n, 2) int32: producer rows (same microbatch), -1 for none
    out_ptr: np.ndarray  # (n+2,) int64, all 0 beforehand: each producer's count of
    #                      transfers at [q + 2] (pass 1b), then by prefix_sum_counts
    #                      the first at [q + 1]; ends with [:n + 1] the CSR of
    #                      transfers by producer (pass 2a advances the cursors)


class Transfers(NamedTuple):
    """The cross-device transfers (output of pass 2; the caller allocates
    once pass 1 counted them, nx in all)."""

    xfer: np.ndarray  # (n, 2) int32: transfer id of each dep entry, -1 when local
    x_src: np.ndarray  # (nx,) int32: producer row, sorted by producer then consumer
    x_dst: np.ndarray  # (nx,) int32: consumer row
    x_dst_dev: np.ndarray  # (nx,) int32: consumer's device (the source device is
    #                        dev[x_src], not stored: one array fewer at scale)
    x_link: np.ndarray  # (nx,) int32: compact id of the directed link it takes
    link_id: np.ndarray  # (p*p + 2p,) int32 scratch, all -1 beforehand: 0 marks a
    #                      link with traffic (pass 2a), then its id (pass 2b); keys
    #                      src * p + dst between devices, p*p + 2 d + h - 1 for
    #                      direction h (1 to host, 2 back) of device d's host link
    x_host: np.ndarray  # (nx,) int8, or (0,) without offloads: 0 between devices,
    #                     1 an offload's copy out (O to L), 2 its copy back (L to
    #                     the backward)
    x_after: np.ndarray  # (nx,) int32, or (0,): the copy out each copy back waits
    #                      for, -1 for other transfers (pass 2b)
    x_peer: np.ndarray  # (nx,) int32, or (0,): the partner device holding a copy,
    #                     -1 for other transfers (pass 2b)
    partner: np.ndarray  # (p,) int32 in, or (0,) when every device offloads to
    #                      host: Schedule.offload_to, -1 for the host


@njit(cache=True)
def rows_sorted(dev, slot, kind):
    """True when rows are in (device, slot, kind) order, non-decreasing."""
    for r in range(1, dev.size):
        if dev[r] != dev[r - 1]:
            if dev[r] < dev[r - 1]:
                return False
        elif slot[r] != slot[r - 1]:
            if slot[r] < slot[r - 1]:
                return False
        elif kind[r] < kind[r - 1]:
            return False
    return True


@njit(cache=True, nogil=True)
def structure_fbw_index(ops, p, S, m, replicated, index, deps):
    """Pass 1a of the structure of a schedule made of F, B, W, BW, R, O and
    L ops, and AR ops when ``replicated``: the rules of each row on its own and in
    program order, and the row of every (stage, microbatch, kind).

    ``ops`` (:class:`OpColumns`) has ``p`` devices; ``S`` and ``m`` are one
    more than the largest stage and microbatch (of the non-AR rows). Fills
    ``index`` (:class:`KeyIndex`), each row's ``paired`` flag and the
    all-reduces' producers in ``deps`` (:class:`Dependencies`). The caller
    allocates the outputs. Returns a status:
    0 when these rules hold (then run :func:`structure_fbw_count`), 1 when
    one breaks (the numpy rules then name it), 2 when a row's kind has no
    column (run again with one for every kind).
    """
    dev, slot, kind, stage, mb = ops.dev, ops.slot, ops.kind, ops.stage, ops.mb
    col, idx, first_dev = index.col, index.idx, index.first_dev
    paired, dep = deps.paired, deps.dep
    n = dev.size
    # All-reduces (replicated only): a stage's two devices (from its F
    # rows; -2 in column 1 for three or more), the last backward row (B, W
    # or BW) of the stage on each, and the stage's AR row on each.
    n_ar = 0
    n_rep = S if replicated else 0
    rep_dev = np.full((n_rep, 2), -1, np.int32)
    last_back = np.full((n_rep, 2), -1, np.int32)
    ar_row = np.full((n_rep, 2), -1, np.int32)
    n_f = 0
    cb = col[B]
    for r in range(n):
        k = kind[r]
        if k < 0 or k > L or slot[r] < 0 or stage[r] < 0:
            return 1
        if dev[r] < 0 or dev[r] >= p or stage[r] >= S:
            return 1
        paired[r] = False
        if r > 0 and dev[r] == dev[r - 1] and slot[r] == slot[r - 1]:
            # Only an overlapped F&B pair shares a slot, F first, never three.
            if kind[r - 1] != F or (k != B and k != BW) or paired[r - 1]:
                return 1
            paired[r] = True
        if k == AR:
            if not replicated:
                return 1
            n_ar += 1
            continue
        if mb[r] < 0 or mb[r] >= m:
            return 1
        if replicated:
            s = stage[r]
            if k == F:
                if rep_dev[s, 0] < 0:
                    rep_dev[s, 0] = dev[r]
                elif rep_dev[s, 0] != dev[r] and rep_dev[s, 1] != dev[r]:
                    rep_dev[s, 1] = dev[r] if rep_dev[s, 1] == -1 else -2
            elif k != R and k != O and k != L:
                # Its F ran earlier on this device (checked below), so the
                # device is one of the stage's.
                last_back[s, 0 if dev[r] == rep_dev[s, 0] else 1] = r
        key = stage[r] * m + mb[r]
        c = col[k]
        if c < 0:
            return 2
        if idx[key, c] >= 0:
            return 1
        idx[key, c] = r
        if k == F:
            n_f += 1
        else:
            # In a valid schedule the F (and, for a W, its B) ran earlier on
            # this same device: anything else breaks placement or order
            # (an R too: it recomputes its F's activations there).
            f = idx[key, 0]
            if f < 0 or dev[f] != dev[r]:
                return 1
            if k == W and (cb < 0 or idx[key, cb] < 0):
                return 1
            # An L loads what its O (earlier, on its F's device) offloaded.
            if k == L and idx[key, col[O]] < 0:
                return 1
    if n_f != S * m or n_f == 0:
        return 1
    if n_ar:
        # One AR per replica of a stage on exactly two devices, after every
        # backward op of the stage there; it waits for the other replica's
        # last backward op.
        for r in range(n):
            if kind[r] != AR:
                continue
            s = stage[r]
            if rep_dev[s, 1] < 0:
                return 1
            i = 0 if dev[r] == rep_dev[s, 0] else 1
            if dev[r] != rep_dev[s, i] or ar_row[s, i] >= 0 or last_back[s, i] > r:
                return 1
            ar_row[s, i] = r
            dep[r, 0] = last_back[s, 1 - i]
        for s in range(S):
            if (ar_row[s, 0] < 0) != (ar_row[s, 1] < 0):
                return 1
    for s in range(S):
        first_dev[s] = dev[idx[s * m, 0]]
    return 0


@njit(cache=True, nogil=True)  # two threads may count halves of the rows
def structure_fbw_count(ops, S, m, replicated, index, deps, r0, r1):
    """Pass 1b, rows ``r0`` to ``r1``, after :func:`structure_fbw_index`
    filled ``index``: the remaining rules, each op's producers
    (``deps.dep``) and each producer's transfer count at
    ``deps.out_ptr[q + 2]`` (two places on, so that after
    :func:`prefix_sum_counts` ``out_ptr[q + 1]`` is the first transfer of
    producer q, the cursor :func:`structure_fbw_transfers` advances).
    An O and an L count their offload copy. Returns 0, or 1 when a rule
    breaks. Without all-reduces a producer has at most one transfer in a
    valid schedule, and each
    row counts its own transfers as a producer, so disjoint row ranges may
    be counted at once (an invalid one returns 1 and its counts are
    dropped).
    """
    dev, kind, stage, mb = ops.dev, ops.kind, ops.stage, ops.mb
    col, idx, first_dev = index.col, index.idx, index.first_dev
    mode = index.stage_mode
    paired, dep, out_ptr = deps.paired, deps.dep, deps.out_ptr
    cb = col[B]
    cw = col[W]
    cbw = col[BW]
    cr = col[R]
    co = col[O]
    cl = col[L]
    for r in range(r0, r1):
        k = kind[r]
        key = stage[r] * m + mb[r]
        q0 = -1
        q1 = -1
        if k == AR:
            if mode[stage[r]] != 0:  # a frozen stage has no gradient to reduce
                return 1
            q0 = dep[r, 0]
        elif k == F:
            # Exactly one backward (BW, or B and W) per (stage, microbatch);
            # a frozen stage's is a B alone, none below the lowest trainable.
            has_b = cb >= 0 and idx[key, cb] >= 0
            has_w = cw >= 0 and idx[key, cw] >= 0
            has_bw = cbw >= 0 and idx[key, cbw] >= 0
            # An O has its L and the reverse; an offloaded activation is not
            # also recomputed.
            has_o = co >= 0 and idx[key, co] >= 0
            has_l = cl >= 0 and idx[key, cl] >= 0
            has_r = cr >= 0 and idx[key, cr] >= 0
            if has_o != has_l or (has_o and has_r):
                return 1
            md = mode[stage[r]]
            if md == 1:
                if has_bw or has_w or not has_b:
                    return 1
            elif md == 2:
                if has_bw or has_b or has_w or has_r or has_o:
                    return 1
            elif has_bw:
                if has_b or has_w:
                    return 1
            elif not has_b or not has_w:
                return 1
            if not replicated and dev[r] != first_dev[stage[r]]:
                return 1
            if stage[r] > 0:
                q0 = idx[key - m, 0]
        elif k == W:
            q0 = idx[key, cb]  # the index pass checked the B is there
        elif k == R or k == O:
            q0 = idx[key, 0]
        elif k == L:
            q0 = idx[key, co]  # the index pass checked the O is there
        else:
            # An offloaded backward needs its L, a recomputed one its R
            # (each needs the F).
            if cl >= 0 and idx[key, cl] >= 0:
                q0 = idx[key, cl]
            elif cr >= 0 and idx[key, cr] >= 0:
                q0 = idx[key, cr]
            else:
                q0 = idx[key, 0]
            if stage[r] < S - 1:
                q1 = idx[key + m, cbw] if cbw >= 0 else -1
                if q1 < 0 and cb >= 0:
                    q1 = idx[key + m, cb]
        dep[r, 0] = q0
        dep[r, 1] = q1
        if not replicated:
            # Stage s runs on first_dev[s] (F rows are checked above, the
            # others run where their F does), so devices come from that
            # small array, not from rows far away; and this row's transfers
            # as a producer are known here: an F's to the next stage's F, a
            # B's or BW's to the previous stage's backward. Written at this
            # row only, so halves of the rows never share an entry.
            s = stage[r]
            dr = first_dev[s]
            if q0 >= 0:
                if paired[r] and q0 == r - 1:
                    return 1
                if first_dev[s - 1 if k == F else s] == dr and q0 > r:
                    return 1
            if q1 >= 0:
                if paired[r] and q1 == r - 1:
                    return 1
                if first_dev[s + 1] == dr and q1 > r:
                    return 1
            c = 0
            if k == F:
                if s < S - 1 and first_dev[s + 1] != dr:
                    c = 1
            elif k == B or k == BW:
                # No gradient goes to a stage below the lowest trainable one.
                if s > 0 and first_dev[s - 1] != dr and mode[s - 1] != 2:
                    c = 1
            elif k == O or k == L:
                c = 1  # its copy out (to the L) or back (to the backward)
            out_ptr[r + 2] = c
            continue
        if k == O or k == L:
            out_ptr[r + 2] += 1
        for q in (q0, q1):
            if q < 0:
                continue
            if paired[r] and q == r - 1:
                return 1
            if dev[q] == dev[r]:
                if q > r:
                    return 1
            else:
                out_ptr[q + 2] += 1
    return 0


@njit(cache=True, nogil=True)
def prefix_sum_counts(out_ptr):
    """After :func:`structure_fbw_count`: the counts at ``out_ptr[q + 2]``
    become, in place, each producer's first transfer at ``out_ptr[q + 1]``;
    returns the number of transfers."""
    n = out_ptr.size - 2
    for r in range(n):
        out_ptr[r + 2] += out_ptr[r + 1]
    return out_ptr[n + 1]


@njit(cache=True, nogil=True, inline="always")
def _link_key(src, dst, h, partner, p):
    """Key in ``Transfers.link_id`` of a transfer from device ``src`` to
    ``dst`` with host flag ``h``: an offload copy of a device with a
    partner takes the directed link to it (out) or from it (back)."""
    if h == 0:
        return src * p + dst
    if partner.size and partner[src] >= 0:
        return src * p + partner[src] if h == 1 else partner[src] * p + src
    return p * p + 2 * src + h - 1


@njit(cache=True, nogil=True)  # two threads may fill halves of the rows
def structure_fbw_transfers(ops, p, deps, transfers, r0, r1):
    """Pass 2a, rows ``r0`` to ``r1``, after pass 1 held and
    :func:`prefix_sum_counts`: every transfer's ends and destination
    device, each op's transfers in (``xfer``), each offload copy's
    ``x_host`` flag, and a 0 in ``link_id`` at the key of every link with
    traffic (not yet ``x_link``, ``x_after``, ``x_peer``). Without
    all-reduces a producer of a valid schedule has one transfer at most (an
    O's or L's is its offload copy), so disjoint row ranges may be filled
    at once.
    """
    dev, kind, dep, out_ptr = ops.dev, ops.kind, deps.dep, deps.out_ptr
    xfer, x_src, x_dst = transfers.xfer, transfers.x_src, transfers.x_dst
    x_dst_dev, link_id, x_host = transfers.x_dst_dev, transfers.link_id, transfers.x_host
    partner = transfers.partner
    host = x_host.size > 0
    # Consumers visited in row order: each producer's transfers come out
    # sorted by consumer, as the numpy path's lexsort orders them.
    # out_ptr[q + 1] serves as producer q's fill cursor and ends as the
    # start of producer q + 1.
    for r in range(r0, r1):
        d = dev[r]
        k = kind[r]
        for j in range(2):
            q = dep[r, j]
            # An offload's copies: O to L (no dependency entry: the L does
            # not wait for it) and L to the backward (its first entry).
            # (kind[q] read for a backward's first producer only, which is
            # local and near: an F's producer is far away.)
            h = 0
            if host and q >= 0:
                if k == L:
                    h = 1
                elif j == 0 and (k == B or k == BW) and kind[q] == L:
                    h = 2
            if h == 0 and (q < 0 or dev[q] == d):
                xfer[r, j] = -1
                continue
            i = out_ptr[q + 1]
            out_ptr[q + 1] = i + 1
            x_src[i] = q
            x_dst[i] = r
            x_dst_dev[i] = d
            xfer[r, j] = -1 if h == 1 else i
            if host:
                x_host[i] = h
            link_id[_link_key(dev[q], d, h, partner, p)] = 0


@njit(cache=True, nogil=True)
def structure_fbw_link_ids(ops, p, deps, transfers):
    """Pass 2b: number the links :func:`structure_fbw_transfers` marked, in
    key order (device links by (source, destination), then host links),
    and write each transfer's link (``transfers.x_link``); with offloads,
    each copy back's wait (``x_after``) and each copy's partner device
    (``x_peer``). Returns the number of links with traffic."""
    dev, x_src, x_dst_dev = ops.dev, transfers.x_src, transfers.x_dst_dev
    link_id, x_link, x_host = transfers.link_id, transfers.x_link, transfers.x_host
    x_after, x_peer, partner = transfers.x_after, transfers.x_peer, transfers.partner
    dep, out_ptr = deps.dep, deps.out_ptr
    n_links = 0
    for c in range(link_id.size):
        if link_id[c] == 0:
            link_id[c] = n_links
            n_links += 1
    # Sources gathered in producer order, so the reads stream.
    if x_host.size == 0:
        for i in range(x_src.size):
            x_link[i] = link_id[dev[x_src[i]] * p + x_dst_dev[i]]
        return n_links
    for i in range(x_src.size):
        q = x_src[i]
        h = x_host[i]
        x_link[i] = link_id[_link_key(dev[q], x_dst_dev[i], h, partner, p)]
        # A copy back waits for the copy out of its L's O, that O's one
        # transfer (out_ptr is the CSR of transfers by producer).
        x_after[i] = out_ptr[dep[q, 0]] if h == 2 else -1
        if x_peer.size:
            x_peer[i] = partner[dev[q]] if h > 0 else -1
    return n_links

"""Validation and dependency structure of large schedules in one pass.

``core.rules.structure`` checks the rules with numpy over whole columns. At
millions of ops its temporaries (int64 copies, masks, a sort) cost seconds
and gigabytes; these kernels do the common case (kinds F, B, W, BW, and
all-reduces of replicated stages) in a few linear passes that allocate only
their outputs. They
never explain a failure: on any broken rule they return a nonzero status and
the numpy path, which names the rule, device, slot and op, runs instead.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# Kind codes (core.ops): F=0, B=1, W=2, BW=3, AR=4.


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


@njit(cache=True)
def structure_fbw(dev, slot, kind, stage, mb, p, S, m, replicated):
    """Structure of a schedule made of F, B, W and BW ops, and AR ops when
    ``replicated``.

    Rows must be sorted by (device, slot, kind). ``S`` and ``m`` are one
    more than the largest stage and microbatch (of the non-AR rows; an
    AR's microbatch is ignored). Returns ``(status, f_idx
    (F row per key, only when replicated),
    paired, dep, xfer, x_src, x_dst, out_ptr, x_link, n_links, dev_ptr,
    first_dev (device of each stage's microbatch 0), x_src_dev, x_dst_dev)``;
    status 0 means every rule holds and the arrays equal the numpy path's.
    """
    n = dev.size
    nkey = S * m
    # Rows of F, B, W, BW per (stage, microbatch), side by side: one cache
    # line per key instead of four scattered ones.
    idx = np.full((nkey, 4), -1, np.int32)
    paired = np.zeros(n, np.bool_)
    e_dep = np.empty((0, 2), np.int32)
    e_i32 = np.empty(0, np.int32)
    e_i64 = np.empty(0, np.int64)
    fail = (1, e_i32, paired, e_dep, e_dep, e_i32, e_i32, e_i64, e_i32, 0, e_i64, e_i32,
            e_i32, e_i32)
    # All-reduces (replicated only): a stage's two devices (from its F
    # rows; -2 in column 1 for three or more), the last backward row (B, W
    # or BW) of the stage on each, and the stage's AR row on each.
    n_ar = 0
    n_rep = S if replicated else 0
    rep_dev = np.full((n_rep, 2), -1, np.int32)
    last_back = np.full((n_rep, 2), -1, np.int32)
    ar_row = np.full((n_rep, 2), -1, np.int32)
    n_f = 0
    for r in range(n):
        k = kind[r]
        if k < 0 or k > 4 or slot[r] < 0 or stage[r] < 0:
            return fail
        if dev[r] < 0 or dev[r] >= p or stage[r] >= S:
            return fail
        if r > 0 and dev[r] == dev[r - 1] and slot[r] == slot[r - 1]:
            # Only an overlapped F&B pair shares a slot, F first, never three.
            if kind[r - 1] != 0 or (k != 1 and k != 3) or paired[r - 1]:
                return fail
            paired[r] = True
        if k == 4:
            if not replicated:
                return fail
            n_ar += 1
            continue
        if mb[r] < 0 or mb[r] >= m:
            return fail
        if replicated:
            s = stage[r]
            if k == 0:
                if rep_dev[s, 0] < 0:
                    rep_dev[s, 0] = dev[r]
                elif rep_dev[s, 0] != dev[r] and rep_dev[s, 1] != dev[r]:
                    rep_dev[s, 1] = dev[r] if rep_dev[s, 1] == -1 else -2
            else:
                # Its F ran earlier on this device (checked below), so the
                # device is one of the stage's.
                last_back[s, 0 if dev[r] == rep_dev[s, 0] else 1] = r
        key = stage[r] * m + mb[r]
        if idx[key, k] >= 0:
            return fail
        idx[key, k] = r
        if k == 0:
            n_f += 1
        else:
            # In a valid schedule the F (and, for a W, its B) ran earlier on
            # this same device: anything else breaks placement or order.
            f = idx[key, 0]
            if f < 0 or dev[f] != dev[r]:
                return fail
            if k == 2 and idx[key, 1] < 0:
                return fail
    if n_f != nkey or n_f == 0:
        return fail
    dep = np.full((n, 2), -1, np.int32)
    if n_ar:
        # One AR per replica of a stage on exactly two devices, after every
        # backward op of the stage there; it waits for the other replica's
        # last backward op.
        for r in range(n):
            if kind[r] != 4:
                continue
            s = stage[r]
            if rep_dev[s, 1] < 0:
                return fail
            i = 0 if dev[r] == rep_dev[s, 0] else 1
            if dev[r] != rep_dev[s, i] or ar_row[s, i] >= 0 or last_back[s, i] > r:
                return fail
            ar_row[s, i] = r
            dep[r, 0] = last_back[s, 1 - i]
        for s in range(S):
            if (ar_row[s, 0] < 0) != (ar_row[s, 1] < 0):
                return fail
    # Transfers counted per producer (shifted by one for the prefix sum).
    out_ptr = np.zeros(n + 1, np.int64)
    first_dev = np.empty(S, np.int32)
    for s in range(S):
        first_dev[s] = dev[idx[s * m, 0]]
    for r in range(n):
        k = kind[r]
        key = stage[r] * m + mb[r]
        q0 = -1
        q1 = -1
        if k == 4:
            q0 = dep[r, 0]
        elif k == 0:
            # Exactly one backward (BW, or B and W) per (stage, microbatch).
            if idx[key, 3] >= 0:
                if idx[key, 1] >= 0 or idx[key, 2] >= 0:
                    return fail
            elif idx[key, 1] < 0 or idx[key, 2] < 0:
                return fail
            if not replicated and dev[r] != first_dev[stage[r]]:
                return fail
            if stage[r] > 0:
                q0 = idx[key - m, 0]
        elif k == 2:
            q0 = idx[key, 1]
        else:
            q0 = idx[key, 0]
            if stage[r] < S - 1:
                q1 = idx[key + m, 3]
                if q1 < 0:
                    q1 = idx[key + m, 1]
        dep[r, 0] = q0
        dep[r, 1] = q1
        for q in (q0, q1):
            if q < 0:
                continue
            if paired[r] and q == r - 1:
                return fail
            if dev[q] == dev[r]:
                if q > r:
                    return fail
            else:
                out_ptr[q + 1] += 1
    # The F rows are only needed to list a replicated stage's devices. Taken
    # at idx's last use, so Numba frees idx before the transfer arrays.
    f_idx = idx[:, 0].copy() if replicated else e_i32
    for r in range(n):
        out_ptr[r + 1] += out_ptr[r]
    nx = out_ptr[n]
    x_src = np.empty(nx, np.int32)
    x_dst = np.empty(nx, np.int32)
    # The devices of each transfer's ends, written here: gathering them
    # afterwards in numpy costs a second random pass and a temporary.
    x_src_dev = np.empty(nx, np.int32)
    x_dst_dev = np.empty(nx, np.int32)
    xfer = np.full((n, 2), -1, np.int32)
    # Consumers visited in row order: each producer's transfers come out
    # sorted by consumer, as the numpy path's lexsort orders them.
    # out_ptr[q] serves as producer q's fill cursor, then shifts back.
    link_id = np.full(p * p, -1, np.int32)
    for r in range(n):
        for j in range(2):
            q = dep[r, j]
            if q >= 0 and dev[q] != dev[r]:
                i = out_ptr[q]
                out_ptr[q] = i + 1
                x_src[i] = q
                x_dst[i] = r
                x_src_dev[i] = dev[q]
                x_dst_dev[i] = dev[r]
                xfer[r, j] = i
                link_id[dev[q] * p + dev[r]] = 0
    for r in range(n, 0, -1):
        out_ptr[r] = out_ptr[r - 1]
    out_ptr[0] = 0
    # Directed links with traffic, numbered in (source, destination) order.
    n_links = 0
    for c in range(p * p):
        if link_id[c] == 0:
            link_id[c] = n_links
            n_links += 1
    x_link = np.empty(nx, np.int32)
    for i in range(nx):
        x_link[i] = link_id[x_src_dev[i] * p + x_dst_dev[i]]
    dev_ptr = np.zeros(p + 1, np.int64)
    for r in range(n):
        dev_ptr[dev[r] + 1] += 1
    for d in range(p):
        dev_ptr[d + 1] += dev_ptr[d]
    return (0, f_idx, paired, dep, xfer, x_src, x_dst, out_ptr, x_link, n_links, dev_ptr,
            first_dev, x_src_dev, x_dst_dev)

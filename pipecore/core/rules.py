"""Schedule rules, checked with numpy over whole columns (no loop over ops).

`structure` validates a schedule and derives what the kernel needs: the
dependency of every op and the cross-device transfers. Deadlock needs a
simulation, so it is checked by :func:`pipecore.validate` through the kernel.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np

from ..kernels.codes import F_DROP
from ..kernels.structure import (
    Dependencies,
    KeyIndex,
    OpColumns,
    Transfers,
    prefix_sum_counts,
    structure_fbw_count,
    structure_fbw_index,
    structure_fbw_link_ids,
    structure_fbw_transfers,
)
from .cpus import local_cpus
from .ops import AR, BW, KINDS, B, F, L, O, R, ScheduleError, W, op_label
from .structure import Structure

#: Schedules with at least this many ops are checked by the one-pass kernel
#: (``kernels.structure``), which takes every kind (AR ops if replicated);
#: smaller ones use numpy, which needs no compile.
FAST_MIN_OPS = 1 << 18
# From this many ops on, two threads count and fill the transfers (halves of the rows).
COUNT_THREADS_MIN_OPS = 1 << 22

# A lower threshold while kernel_from() is active (None: FAST_MIN_OPS).
_kernel_from = None


@contextmanager
def kernel_from(ops):
    """Take the kernel path from ``ops`` ops (instead of FAST_MIN_OPS) for
    the schedules validated inside the block.

    For callers that validate many mid-sized schedules (``tune``): loading
    the kernels costs once per process, and from some ten thousand ops on
    the one-pass kernels beat numpy's passes over whole columns, so that
    cost returns over a few schedules. Both paths give the same structure,
    so the setting changes speed only.

    Parameters
    ----------
    ops : int
        The threshold in ops inside the block (never above FAST_MIN_OPS).

    Returns
    -------
    contextlib context manager
    """
    global _kernel_from
    before = _kernel_from
    _kernel_from = int(ops)
    try:
        yield
    finally:
        _kernel_from = before


def _error(schedule, rule, row, detail, mark=None):
    dev = int(schedule._column("device")[row])
    slot = int(schedule._column("slot")[row])
    stage = int(schedule._column("stage")[row])
    mb = int(schedule._column("microbatch")[row])
    code = schedule.kind_codes[row]
    kind = KINDS[code]
    label = op_label(code, stage, mb)
    where = (f"device {dev} slot {slot} ({label}: stage {stage})" if code == AR else
             f"device {dev} slot {slot} ({label}: stage {stage}, microbatch {mb})")
    text = (f"{rule}: {where}: {detail}\n"
            f"per-device programs (offending op marked >>..<<):\n"
            f"{schedule.render(mark if mark is not None else [row])}")
    return ScheduleError(text, rule=rule, device=dev, slot=slot, stage=stage,
                         microbatch=mb, kind=kind)


def structure(schedule, fast=None):
    """Validate a schedule's rules and derive its dependency structure.

    Parameters
    ----------
    schedule : Schedule
    fast : bool, optional
        Use the one-pass kernel (every op kind, offloads to host or partner
        devices included; up to 8192 devices);
        by default for schedules of :data:`FAST_MIN_OPS` ops or more. Its
        result equals the numpy path's; on a broken rule the numpy path
        runs and explains it.

    Returns
    -------
    Structure
        Placement, every op's producers, the transfers and their links (the
        fields are documented on :class:`~pipecore.core.structure.Structure`).

    Raises
    ------
    ScheduleError
        Naming the rule, device, slot, stage and microbatch, with the
        per-device programs rendered and the bad op marked.
    """
    threshold = FAST_MIN_OPS if _kernel_from is None else min(FAST_MIN_OPS, _kernel_from)
    if fast or (fast is None and schedule.num_ops >= threshold):
        out = _structure_fast(schedule)
        if out is not None:
            return out
    dev = schedule._column("device").astype(np.int64)
    slot = schedule._column("slot").astype(np.int64)
    stage = schedule._column("stage").astype(np.int64)
    mb = schedule._column("microbatch").astype(np.int64)
    kind = schedule.kind_codes.astype(np.int64)
    n = len(dev)
    p = schedule.devices
    if n == 0:
        raise ScheduleError("missing-op: the schedule has no ops", rule="missing-op")

    is_ar = kind == AR
    for name, col in (("slot", slot), ("stage", stage), ("microbatch", np.where(is_ar, 0, mb))):
        bad = np.flatnonzero(col < 0)
        if bad.size:
            raise _error(schedule, "range", int(bad[0]), f"'{name}' must be >= 0 (got {int(col[bad[0]])})")

    # Rows are sorted by (device, slot, kind): equal neighbours share a slot,
    # which only an overlapped F&B pair may do (its F row first).
    same = np.zeros(n, dtype=bool)  # row shares the previous row's slot
    same[1:] = (dev[1:] == dev[:-1]) & (slot[1:] == slot[:-1])
    dup = np.flatnonzero(same)
    if dup.size:
        first_bad = dup[(kind[dup - 1] != F) | ((kind[dup] != B) & (kind[dup] != BW))]
        triple = dup[np.isin(dup - 1, dup)]
        bad = np.union1d(first_bad, triple)
        if bad.size:
            r = int(bad[0])
            raise _error(schedule, "slot-unique", r,
                         f"slot {int(slot[r])} is used twice on device {int(dev[r])}; only an "
                         f"overlapped pair of one F and one B or BW may share a slot",
                         mark=[r - 1, r])

    S = int(stage.max()) + 1
    if is_ar.all():
        raise ScheduleError("missing-op: the schedule has only all-reduce ops", rule="missing-op")
    m = int(mb[~is_ar].max()) + 1
    mb = np.where(is_ar, 0, mb)  # all-reduce rows take no part in (stage, microbatch) keys
    if S * m > 50_000_000:
        raise ScheduleError(f"range: stages x microbatches = {S} x {m} is too large", rule="range")
    key = stage * m + mb
    nkey = S * m

    is_f = kind == F
    is_b = kind == B
    is_w = kind == W
    is_bw = kind == BW
    is_r = kind == R
    is_o = kind == O
    is_l = kind == L

    def index_of(code):
        rows = np.flatnonzero(kind == code)
        counts = np.bincount(key[rows], minlength=nkey)
        over = np.flatnonzero(counts > 1)
        if over.size:
            k = int(over[0])
            dups = rows[key[rows] == k]
            raise _error(schedule, "duplicate-op", int(dups[1]),
                         f"more than one {KINDS[code]} for stage {k // m} microbatch {k % m}",
                         mark=list(dups))
        idx = np.full(nkey, -1, dtype=np.int64)
        idx[key[rows]] = rows
        return idx

    # Row of each (stage, microbatch)'s op of each kind, -1 for none.
    f_idx, b_idx, w_idx, bw_idx, r_idx, o_idx, l_idx = (index_of(c) for c in (F, B, W, BW, R, O, L))

    # Exactly one forward, and either BW or B+W, per (stage, microbatch).
    both = np.flatnonzero((bw_idx >= 0) & ((b_idx >= 0) | (w_idx >= 0)))
    if both.size:
        k = int(both[0])
        other = b_idx[k] if b_idx[k] >= 0 else w_idx[k]
        raise _error(schedule, "duplicate-op", int(other),
                     f"stage {k // m} microbatch {k % m} has a fused BW and a split "
                     f"{KINDS[kind[other]]}; use BW or B+W, not both", mark=[int(bw_idx[k]), int(other)])
    has_back = (bw_idx >= 0) | (b_idx >= 0)
    # Frozen stages (Schedule.frozen): a frozen stage at or above the lowest
    # trainable one has F and B only; one below it has F only.
    no_back, b_only = _frozen_keys(schedule, S, m)
    if no_back is not None:
        _check_frozen(schedule, S, m, no_back, b_only,
                      (b_idx, w_idx, bw_idx, r_idx, o_idx, l_idx))
        need_back = ~no_back
        need_w = ~(no_back | b_only)
    else:
        need_back = need_w = True
    missing = np.flatnonzero((f_idx < 0) | (need_back & ~has_back)
                             | (need_w & ((b_idx >= 0) != (w_idx >= 0))))
    if missing.size:
        # Report a (stage, microbatch) that has some of its ops first: its
        # present op marks where the program went wrong. A pair with no op at
        # all usually only exists because another index ran past the range.
        first_row = np.full(missing.size, n, dtype=np.int64)
        for idx in (f_idx, b_idx, w_idx, bw_idx, r_idx, o_idx, l_idx):
            rows_k = idx[missing]
            first_row = np.where((rows_k >= 0) & (rows_k < first_row), rows_k, first_row)
        k = int(missing[int(np.argmin(first_row))])
        s_, mb_ = k // m, k % m
        if f_idx[k] < 0:
            need = "F"
        elif not has_back[k]:
            need = "backward (BW, or B and W)" if need_w is True or need_w[k] else "B"
        elif b_idx[k] < 0:
            need = "B (it has a W)"
        else:
            need = "W (it has a B)"
        present = [int(i) for i in (f_idx[k], b_idx[k], w_idx[k], bw_idx[k], r_idx[k], o_idx[k],
                                    l_idx[k]) if i >= 0]
        detail = (f"stage {s_} microbatch {mb_} has no {need}; every (stage, microbatch) in "
                  f"0..{S - 1} x 0..{m - 1} needs F and BW, or F, B and W"
                  + (" (a frozen stage F and B; one below the lowest trainable stage F alone)"
                     if no_back is not None else ""))
        if present:
            raise _error(schedule, "missing-op", present[0], detail, mark=present)
        raise ScheduleError(f"missing-op: {detail}\n{schedule.render()}", rule="missing-op",
                            stage=s_, microbatch=mb_)

    back_idx = np.where(bw_idx >= 0, bw_idx, b_idx)

    # An offload (O) needs its load (L) and the reverse; an activation is
    # either offloaded or recomputed, not both.
    lonely = np.flatnonzero((o_idx >= 0) != (l_idx >= 0))
    if lonely.size:
        k = int(lonely[0])
        r = int(o_idx[k] if o_idx[k] >= 0 else l_idx[k])
        have, need = ("O", "L") if o_idx[k] >= 0 else ("L", "O")
        raise _error(schedule, "missing-op", r,
                     f"stage {k // m} microbatch {k % m} has an {have} but no {need}; an offload "
                     f"(O after the F) needs its load (L before the backward)")
    both_ro = np.flatnonzero((o_idx >= 0) & (r_idx >= 0))
    if both_ro.size:
        k = int(both_ro[0])
        raise _error(schedule, "offload", int(o_idx[k]),
                     f"stage {k // m} microbatch {k % m} is both offloaded (O) and recomputed "
                     f"(R); choose one", mark=[int(o_idx[k]), int(r_idx[k])])

    # All ops of one (stage, microbatch) on one device: activations live there.
    for idx in (back_idx, w_idx, r_idx, o_idx, l_idx):
        present = idx >= 0
        bad = np.flatnonzero(present & (dev[np.where(present, idx, 0)] != dev[f_idx]))
        if bad.size:
            k = int(bad[0])
            r = int(idx[k])
            raise _error(schedule, "placement", r,
                         f"runs on device {int(dev[r])} but F of stage {k // m} microbatch "
                         f"{k % m} runs on device {int(dev[f_idx[k]])}; all ops of a "
                         f"(stage, microbatch) must share a device", mark=[int(f_idx[k]), r])
    # One device per stage, unless the schedule replicates stages (Chimera,
    # DualPipe): then each replica serves its own microbatches.
    stage_dev = dev[f_idx.reshape(S, m)]
    split = np.flatnonzero((stage_dev != stage_dev[:, :1]).any(axis=1))
    if split.size and not schedule.replicated:
        s_ = int(split[0])
        j = int(np.flatnonzero(stage_dev[s_] != stage_dev[s_, 0])[0])
        r0, r1 = int(f_idx[s_ * m]), int(f_idx[s_ * m + j])
        raise _error(schedule, "placement", r1,
                     f"stage {s_} runs on device {int(dev[r1])} for microbatch {j} but on "
                     f"device {int(dev[r0])} for microbatch 0; a stage lives on one device "
                     f"unless the schedule is built with replicated=True", mark=[r0, r1])
    placement = stage_dev[:, 0].astype(np.int32)
    stage_devices = _stage_devices(stage_dev)

    # Producers of each op (same microbatch).
    dep = np.full((n, 2), -1, dtype=np.int64)
    rows = np.arange(n)
    fr = rows[is_f & (stage > 0)]
    dep[fr, 0] = f_idx[key[fr] - m]
    rr = rows[is_r]
    dep[rr, 0] = f_idx[key[rr]]
    orow = rows[is_o]
    dep[orow, 0] = f_idx[key[orow]]
    lrow = rows[is_l]
    dep[lrow, 0] = o_idx[key[lrow]]
    br = rows[is_b | is_bw]
    # A recomputed (stage, microbatch)'s backward needs the R, an offloaded
    # one its L (and, below, the L's copy back), not the F.
    first = np.where(r_idx[key[br]] >= 0, r_idx[key[br]], f_idx[key[br]])
    dep[br, 0] = np.where(l_idx[key[br]] >= 0, l_idx[key[br]], first)
    inner = br[stage[br] < S - 1]
    dep[inner, 1] = back_idx[key[inner] + m]
    wr = rows[is_w]
    dep[wr, 0] = b_idx[key[wr]]

    # An all-reduce joins the two replicas of a replicated stage: one on each,
    # after every backward op of that stage there, waiting for the other
    # replica's last backward op (whose transfer carries the gradient).
    ar_rows = np.flatnonzero(is_ar)
    if ar_rows.size:
        # Last backward row (B, W or BW) of each (stage, device), found once:
        # a scan of every row per all-reduce is quadratic at scale.
        back_rows = np.flatnonzero(is_b | is_w | is_bw)
        back_key, last_at = np.unique((stage[back_rows] * p + dev[back_rows])[::-1],
                                      return_index=True)
        back_last = back_rows[::-1][last_at]

        def last_back(s_, d):
            i = int(np.searchsorted(back_key, s_ * p + d))
            return int(back_last[i]) if i < back_key.size and back_key[i] == s_ * p + d else -1

        seen = {}
        for r in ar_rows:
            r = int(r)
            s_, d = int(stage[r]), int(dev[r])
            if s_ in getattr(schedule, "frozen", ()):
                raise _error(schedule, "frozen", r, f"stage {s_} is frozen: it has no weight "
                                                    f"gradient to all-reduce")
            devices = stage_devices[s_]
            if len(devices) != 2 or d not in devices:
                raise _error(schedule, "all-reduce", r,
                             f"stage {s_} runs on device(s) {list(devices)}; an all-reduce joins "
                             f"the two replicas of a stage that runs on exactly two devices")
            if (s_, d) in seen:
                raise _error(schedule, "all-reduce", r,
                             f"a second all-reduce of stage {s_} on device {d}",
                             mark=[seen[(s_, d)], r])
            seen[(s_, d)] = r
            q = last_back(s_, d)
            if q > r:
                raise _error(schedule, "order", r,
                             f"runs before {op_label(kind[q], s_, mb[q])} (slot {int(slot[q])}); "
                             f"an all-reduce comes after every backward op of its stage",
                             mark=[r, q])
            other = devices[1] if devices[0] == d else devices[0]
            dep[r, 0] = last_back(s_, other)
        for (s_, d), r in seen.items():
            other = [x for x in stage_devices[s_] if x != d][0]
            if (s_, other) not in seen:
                raise _error(schedule, "all-reduce", r,
                             f"stage {s_} has an all-reduce on device {d} but none on its "
                             f"other replica, device {other}")

    # The B of an overlapped pair cannot need the pair's own F.
    own = np.flatnonzero(same & ((dep[:, 0] == rows - 1) | (dep[:, 1] == rows - 1)))
    if own.size:
        r = int(own[0])
        raise _error(schedule, "overlap", r,
                     "is paired with its own forward; an overlapped F&B pair runs two "
                     "independent ops together", mark=[r - 1, r])

    # A producer on the same device must come earlier in its program.
    has = dep >= 0
    safe = np.where(has, dep, 0)
    local = has & (dev[safe] == dev[:, None])
    late = local & (safe > rows[:, None])
    bad = np.flatnonzero(late.any(axis=1))
    if bad.size:
        r = int(bad[0])
        j = 0 if late[r, 0] else 1
        q = int(dep[r, j])
        raise _error(schedule, "order", r,
                     f"needs {op_label(kind[q], int(stage[q]), int(mb[q]))}, which runs later "
                     f"on the same device (slot {int(slot[q])})", mark=[r, q])

    # Transfers: one per cross-device dependency, plus the two host-link
    # copies of each offload (O -> L to host, L -> backward back), ordered
    # by (producer, consumer). The L does not wait for the copy to host;
    # the copy back starts after it (x_after).
    remote = has & ~local
    cons, which = np.nonzero(remote)
    prod = dep[cons, which]
    host = np.zeros(len(cons), dtype=np.int8)
    ko = np.flatnonzero(o_idx >= 0)
    if ko.size:
        cons = np.concatenate([cons, l_idx[ko], back_idx[ko]])
        prod = np.concatenate([prod, o_idx[ko], l_idx[ko]])
        which = np.concatenate([which, np.full(ko.size, -1), np.zeros(ko.size, dtype=which.dtype)])
        host = np.concatenate([host, np.full(ko.size, 1, np.int8), np.full(ko.size, 2, np.int8)])
    order = np.lexsort((cons, prod))
    x_src = prod[order]
    x_dst = cons[order]
    x_host = host[order]
    which = which[order]
    xfer = np.full((n, 2), -1, dtype=np.int64)
    ids = np.arange(len(order))
    xfer[x_dst[which >= 0], which[which >= 0]] = ids[which >= 0]
    x_after = np.full(len(order), -1, dtype=np.int64)
    if ko.size:
        # The copy back (from L) starts once the copy to host (from the O) ended.
        to_host = np.full(n, -1, dtype=np.int64)
        to_host[x_dst[x_host == 1]] = ids[x_host == 1]  # keyed by the L row
        x_after[x_host == 2] = to_host[x_src[x_host == 2]]
    out_ptr = np.searchsorted(x_src, np.arange(n + 1))
    dev_ptr = np.searchsorted(dev, np.arange(p + 1))

    # Directed links that carry traffic, numbered compactly; each device's
    # host link has two directions (to host, from host) of its own. A device
    # whose offloads go to a partner device (Schedule.offload_to) copies over
    # the directed links between the two, shared with the pipeline's sends.
    src_dev = dev[x_src]
    dst_dev = dev[x_dst]
    link_key = np.where(x_host == 0, src_dev * p + dst_dev, p * p + 2 * src_dev + x_host - 1)
    targets = getattr(schedule, "offload_to", None)
    x_peer = np.empty(0, dtype=np.int32)  # empty: no copy goes to a partner device
    if targets is not None and ko.size:
        partner = np.asarray(targets, dtype=np.int64)[src_dev]
        peer = (x_host > 0) & (partner >= 0)
        if peer.any():
            x_peer = np.where(peer, partner, -1).astype(np.int32)
            link_key = np.where(peer & (x_host == 1), src_dev * p + partner, link_key)
            link_key = np.where(peer & (x_host == 2), partner * p + src_dev, link_key)
    _, x_link = np.unique(link_key, return_inverse=True)
    op_class = kind.astype(np.int8)
    op_class[f_idx[r_idx >= 0]] = F_DROP
    return Structure(
        stages=S,
        microbatches=m,
        placement=placement,
        stage_devices=stage_devices,
        dev_ptr=dev_ptr.astype(np.int64),
        op_dev=schedule._column("device"),
        op_kind=np.ascontiguousarray(kind.astype(np.int8)),
        op_stage=np.ascontiguousarray(stage.astype(np.int32)),
        op_class=op_class,
        paired=same,
        dep=np.ascontiguousarray(dep.astype(np.int32)),
        xfer=np.ascontiguousarray(xfer.astype(np.int32)),
        out_ptr=out_ptr.astype(np.int64),
        x_src=x_src.astype(np.int32),
        x_dst=x_dst.astype(np.int32),
        x_dst_dev=np.ascontiguousarray(dst_dev.astype(np.int32)),
        x_link=np.ascontiguousarray(x_link.reshape(-1).astype(np.int32)),
        n_links=int(x_link.max()) + 1 if x_link.size else 0,
        x_is_ar=is_ar[x_dst] & (x_host == 0),
        x_host=x_host,
        x_after=(np.ascontiguousarray(x_after.astype(np.int32)) if (x_after >= 0).any()
                 else np.empty(0, dtype=np.int32)),  # empty: no transfer waits
        x_peer=x_peer,
    )


def _frozen_keys(schedule, S, m):
    """Per (stage, microbatch) key: whether it runs no backward (a frozen
    stage below the lowest trainable one) and whether it runs a B alone (a
    frozen stage above it); ``(None, None)`` without frozen stages."""
    frozen = getattr(schedule, "frozen", ())  # an unpickled older schedule has none
    if not frozen:
        return None, None
    if frozen[-1] >= S:
        raise ScheduleError(f"frozen: stage {frozen[-1]} is frozen but the schedule has {S} "
                            f"stages (0..{S - 1}); frozen stages must exist", rule="frozen",
                            stage=frozen[-1])
    is_frozen = np.zeros(S, dtype=bool)
    is_frozen[list(frozen)] = True
    if is_frozen.all():
        raise ScheduleError(f"frozen: every stage (0..{S - 1}) is frozen, so nothing trains; "
                            f"leave at least one stage trainable", rule="frozen")
    lowest = int(np.argmin(is_frozen))  # the lowest trainable stage
    dead = np.arange(S) < lowest
    return np.repeat(dead, m), np.repeat(is_frozen & ~dead, m)


def _check_frozen(schedule, S, m, no_back, b_only, indices):
    """Raise for an op a frozen stage cannot have: a W or BW (no weight
    gradient), or below the lowest trainable stage any backward, R, O or L
    (its forward keeps no activation)."""
    b_idx, w_idx, bw_idx, r_idx, o_idx, l_idx = indices
    lowest = int(np.argmin(no_back.reshape(S, m)[:, 0]))
    checks = ((b_only, w_idx, "W", "takes no weight gradient, so it has no W"),
              (b_only, bw_idx, "BW", "takes no weight gradient: its backward is a B "
                                     "(input gradient) alone, not a fused BW"))
    checks += tuple((no_back, idx, k, f"lies below the lowest trainable stage {lowest}: it runs "
                                      f"no backward and keeps no activation, so it has no {k}")
                    for idx, k in ((b_idx, "B"), (w_idx, "W"), (bw_idx, "BW"), (r_idx, "R"),
                                   (o_idx, "O"), (l_idx, "L")))
    for keys, idx, _, rule in checks:
        bad = np.flatnonzero(keys & (idx >= 0))
        if bad.size:
            k = int(bad[0])
            raise _error(schedule, "frozen", int(idx[k]), f"stage {k // m} is frozen and {rule}")


def _in_halves(kernel, halves, n, *args):
    """``kernel(*args, r0, r1)`` over rows 0 to n: in one call, or with
    ``halves`` in two threads at once; True when a call returned nonzero."""
    if not halves:
        return bool(kernel(*args, 0, n))
    with ThreadPoolExecutor(1) as pool:
        other = pool.submit(kernel, *args, n // 2, n)
        first = kernel(*args, 0, n // 2)
        return bool(other.result()) or bool(first)


def _stage_devices(stage_dev):
    """The sorted distinct devices of each row of ``stage_dev`` (a stage's
    device for each microbatch). A row holding only its least and greatest
    device (a stage on one device or two, every layout pipecore builds)
    is read from those two, without sorting it; others by ``np.unique``
    (sorting every stage's row costs more than the two reductions)."""
    lo = stage_dev.min(axis=1)
    hi = stage_dev.max(axis=1)
    two = ((stage_dev == lo[:, None]) | (stage_dev == hi[:, None])).all(axis=1)
    out = []
    for s, row in enumerate(stage_dev):
        if not two[s]:
            out.append(tuple(int(x) for x in np.unique(row)))
        elif lo[s] == hi[s]:
            out.append((int(lo[s]),))
        else:
            out.append((int(lo[s]), int(hi[s])))
    return out


def _index_columns(kind, top, guess=True):
    """Column of each kind code's rows in the fast path's per-key index
    (-1: none; AR rows are not indexed).

    Only kinds up to the largest code ``top`` get one. With ``guess``, an
    F/BW schedule (no B or W among a sample of about 4,096 rows) gets F and
    BW only: half the index of F, B, W and BW; one with offloads (O, L)
    gets F, O, L and the kinds among the sample's. The index kernel returns
    2 when a row's kind has no column; the caller then asks again without
    guessing.
    """
    col = np.full(L + 1, -1, np.int64)  # kinds F .. L
    if top >= O and guess:
        sample = kind[::max(1, kind.size >> 12)]
        kinds = [F]
        if ((sample == B) | (sample == W)).any():
            kinds += [B, W]
        kinds += [k for k in (BW, R) if (sample == k).any()]
        for c, k in enumerate(kinds + [O, L]):
            col[k] = c
        return col
    if top == BW and guess:
        sample = kind[::max(1, kind.size >> 12)]
        if not ((sample == B) | (sample == W)).any():
            col[F], col[BW] = 0, 1
            return col
    col[F], col[B], col[W] = 0, 1, 2
    if top >= BW:
        col[BW] = 3
    if top >= R:
        col[R] = 4
    if top >= O:
        col[O], col[L] = 5, 6
    return col


def _structure_fast(schedule):
    """The kernel path of :func:`structure`, or None where it does not apply
    or a rule is broken (the numpy path then finds and names it)."""
    n = schedule.num_ops
    if n == 0:
        return None
    kind = schedule.kind_codes
    top = int(kind.max())
    if int(kind.min()) < 0 or top > L:
        return None
    dev = schedule._column("device")
    slot = schedule._column("slot")
    stage = schedule._column("stage")
    mb = schedule._column("microbatch")
    p = schedule.devices
    if int(stage.min()) < 0 or p > 8192:
        return None
    S = int(stage.max()) + 1
    # An all-reduce's microbatch is no key (the table stores -1).
    has_ar = top >= AR and bool((kind == AR).any())
    mb_ops = mb[kind != AR] if has_ar else mb
    if mb_ops.size == 0 or int(mb_ops.min()) < 0:
        return None
    m = int(mb_ops.max()) + 1
    if S * m > 50_000_000:
        return None
    n = len(dev)
    paired = np.empty(n, bool)  # the kernels write every row of these
    dep = np.empty((n, 2), np.int32)
    xfer = np.empty((n, 2), np.int32)
    out_ptr = np.zeros(n + 2, np.int64)
    ops = OpColumns(dev=dev, slot=slot, kind=kind, stage=stage, mb=mb)
    deps = Dependencies(paired=paired, dep=dep, out_ptr=out_ptr)
    first_dev = np.empty(S, dtype=np.int32)
    stage_mode = np.zeros(S, dtype=np.int8)
    frozen = getattr(schedule, "frozen", ())
    if frozen:
        if frozen[-1] >= S or len(frozen) == S:  # the numpy rules name it
            return None
        stage_mode[list(frozen)] = 1
        stage_mode[:int(np.argmin(stage_mode))] = 2
    replicated = bool(schedule.replicated)
    for guess in (True, False):  # status 2: the sample missed a kind, so a column for each
        col = _index_columns(kind, top, guess)
        index = KeyIndex(col=col, idx=np.full((S * m, int(col.max()) + 1), -1, np.int32),
                         first_dev=first_dev, stage_mode=stage_mode)
        status = structure_fbw_index(ops, p, S, m, replicated, index, deps)
        if status != 2:
            break
        index = None  # freed before the wider one
    if status:
        return None
    # Without all-reduces each producer has one transfer at most (to a
    # consumer on another device, or an O's or L's offload copy), so two
    # threads count, then fill, halves of the rows (the
    # kernels release the GIL); an invalid schedule returns 1 from some half.
    halves = not replicated and n >= COUNT_THREADS_MIN_OPS and local_cpus() >= 2
    if _in_halves(structure_fbw_count, halves, n, ops, S, m, replicated, index, deps):
        return None
    nx = prefix_sum_counts(out_ptr)
    # The F rows are only needed to list a replicated stage's devices, and
    # to mark recomputed forwards.
    idx = index.idx
    f_idx = idx[:, col[F]].copy() if schedule.replicated else None
    dropped = idx[idx[:, col[R]] >= 0, col[F]] if col[R] >= 0 else None  # F rows with an R
    del idx, index
    x_src, x_dst, x_dst_dev, x_link = (np.empty(nx, np.int32) for _ in range(4))
    # Offloads (only where a row is an O or L, so the largest code is one)
    # add each copy's host flag, the copy back's wait and, with partner
    # devices, each copy's partner.
    offload = top >= O
    targets = getattr(schedule, "offload_to", None) if offload else None
    empty = np.empty(0, np.int32)
    transfers = Transfers(
        xfer=xfer, x_src=x_src, x_dst=x_dst, x_dst_dev=x_dst_dev, x_link=x_link,
        link_id=np.full(p * p + 2 * p, -1, np.int32),
        x_host=np.empty(nx if offload else 0, np.int8),
        x_after=np.empty(nx, np.int32) if offload else empty,
        x_peer=np.empty(nx, np.int32) if targets is not None else empty,
        partner=np.asarray(targets, np.int32) if targets is not None else empty)
    _in_halves(structure_fbw_transfers, halves, n, ops, p, deps, transfers)
    n_links = structure_fbw_link_ids(ops, p, deps, transfers)
    x_peer = transfers.x_peer
    if x_peer.size and not (x_peer >= 0).any():
        x_peer = empty  # empty: no copy goes to a partner device
    out_ptr = out_ptr[:n + 1]
    # Rows are sorted by device: each device's first row by bisection.
    # (Queries of the column's dtype: numpy would otherwise cast the column.)
    dev_ptr = np.searchsorted(dev, np.arange(p + 1, dtype=dev.dtype), side="left")
    dev_ptr = dev_ptr.astype(np.int64)
    if schedule.replicated:
        stage_dev = dev[f_idx.reshape(S, m)]
        placement = stage_dev[:, 0].astype(np.int32)
        stage_devices = _stage_devices(stage_dev)
    else:
        # Every op of a stage runs on its one device (checked by the kernel).
        placement = first_dev
        stage_devices = [(int(d),) for d in placement]
    # Kernels take writable arrays (a read-only one is another Numba type):
    # the schedule's own when they back its table, else a copy.
    op_kind = schedule._writable("kind", kind)
    if op_kind is None:
        op_kind = np.array(kind, dtype=np.int8)
    op_stage = schedule._writable("stage", stage)
    if op_stage is None:
        op_stage = np.array(stage, dtype=np.int32)
    # The kinds serve as the cost classes (one array fewer at scale) unless
    # an R drops its F's activations: that F is class F_DROP.
    op_class = op_kind
    if dropped is not None and dropped.size:
        op_class = op_kind.copy()
        op_class[dropped] = F_DROP
    return Structure(
        stages=S,
        microbatches=m,
        placement=placement,
        stage_devices=stage_devices,
        dev_ptr=dev_ptr,
        op_dev=dev,
        op_kind=op_kind,
        op_stage=op_stage,
        op_class=op_class,
        paired=paired,
        dep=dep,
        xfer=xfer,
        out_ptr=out_ptr,
        x_src=x_src,
        x_dst=x_dst,
        x_dst_dev=x_dst_dev,
        x_link=x_link,
        n_links=int(n_links),
        x_is_ar=kind[x_dst] == AR if has_ar else np.zeros(nx, dtype=bool),
        x_host=transfers.x_host if offload else np.zeros(nx, dtype=np.int8),
        # Without offloads no transfer waits for another: empty means none
        # (nx int32 fewer to fill here and to stream per simulation).
        x_after=transfers.x_after,
        x_peer=x_peer,
    )

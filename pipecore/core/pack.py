"""Schedule structures flattened for the batched kernels, and packs of them.

A *structure* is what a schedule fixes independently of costs: programs,
dependencies, transfers, links, and one execution order for replay. A
*pack* concatenates several (structure, devices_per_node) pairs so one
kernel call can serve configurations of all of them.
"""

from __future__ import annotations

import numpy as np

from ..kernels import codes as _codes
from ..kernels import replay as _replay
from ..kernels.carriers import (
    Groups,
    PackRows,
    PackTransfers,
    ReplayOrder,
    ReplayUnits,
    Structures,
)
from .ops import InputError
from .schedule import Schedule, refuse_factors

__all__ = ["ReplayStructure", "Pack", "structure_of"]


class ReplayStructure:
    """Cost-independent arrays of one validated schedule, in the form the
    batched replay kernels read (``kernels/replay.py``); derived from the
    schedule's :class:`pipecore.core.structure.Structure`."""

    def __init__(self, schedule: Schedule):
        from .simulate import validate

        validate(schedule)  # deadlock and every structural rule, with a clear error
        refuse_factors(schedule, "the batched kernels (simulate_many, scan, tune)")
        st = schedule._info()
        if st.x_host.any():
            raise InputError(f"schedule {schedule.name!r} offloads activations (O and L ops), whose "
                             f"memory moves at copy times; the batched kernels keep memory in "
                             f"program order, so use pipecore.simulate for it")
        dev_ptr = st.dev_ptr
        n = st.op_kind.shape[0]
        p = schedule.devices
        S = st.stages
        self.name = schedule.name
        self.frozen = tuple(getattr(schedule, "frozen", ()))
        self.devices = p
        self.stages = S
        self.microbatches = st.microbatches
        self.chunks_div = S // p if S % p == 0 else 0
        self.n_links = st.n_links
        paired = st.paired
        n_units = int(n - paired.sum())
        order = np.empty(max(n_units, 1), dtype=np.int64)
        count = _replay.execution_order(dev_ptr, st.dep, st.xfer, paired,
                                        st.out_ptr, st.x_dst_dev, order)
        if count != n_units:  # validate() would have raised; keep the kernel safe regardless
            raise RuntimeError("internal: execution order incomplete after validation")
        heads = order[:n_units]
        nxt = np.minimum(heads + 1, n - 1)
        is_pair = (heads + 1 < n) & paired[nxt]
        last = heads + is_pair
        dev = np.repeat(np.arange(p), np.diff(dev_ptr))
        kind = st.op_class  # the kernels' view of kinds (cost classes, see _replay)
        xfer = st.xfer
        self.u_dev = dev[heads].astype(np.int32)
        self.u_r1 = heads.astype(np.int64)  # rows of each unit's op(s); -1: no second op
        self.u_r2 = np.where(is_pair, last, -1).astype(np.int64)
        self.u_k1 = kind[heads].astype(np.int8)
        self.u_k2 = np.where(is_pair, kind[last], -1).astype(np.int8)
        self.u_first = heads == dev_ptr[self.u_dev]
        # Busy time per device from counts of (device, unit cost code): the
        # replay adds count * cost per code instead of a lane loop per unit.
        code = np.where(is_pair, _codes.N_CLASSES + _codes.N_CLASSES * kind[heads] + kind[last],
                        kind[heads]).astype(np.int64)
        key = self.u_dev.astype(np.int64) * (_codes.N_CLASSES * (_codes.N_CLASSES + 1)) + code
        keys, counts = np.unique(key, return_counts=True)
        self.b_dev = (keys // (_codes.N_CLASSES * (_codes.N_CLASSES + 1))).astype(np.int64)
        self.b_code = (keys % (_codes.N_CLASSES * (_codes.N_CLASSES + 1))).astype(np.int64)
        self.b_cnt = counts.astype(np.float64)
        ins = np.stack([xfer[heads, 0], xfer[heads, 1],
                        np.where(is_pair, xfer[last, 0], -1),
                        np.where(is_pair, xfer[last, 1], -1)], axis=1)
        has = ins >= 0
        self.u_in_ptr = np.concatenate([[0], np.cumsum(has.sum(axis=1))]).astype(np.int64)
        self.in_x = ins[has].astype(np.int32)
        self.u_out0 = st.out_ptr[heads].astype(np.int32)
        self.u_out1 = st.out_ptr[last + 1].astype(np.int32)
        self.x_link = st.x_link
        self.x_slot = np.empty(len(self.x_link), dtype=np.int32)
        self.in_slot = np.empty(len(self.in_x), dtype=np.int32)
        self.n_slots = int(_replay.transfer_slots(self.u_in_ptr, self.in_x, self.u_out0,
                                                  self.u_out1, self.x_slot, self.in_slot))
        if self.n_slots < 0:  # validate() would have raised; keep the kernel safe regardless
            raise RuntimeError("internal: a unit waits for a transfer not produced before it")
        self.x_ar = np.asarray(st.x_is_ar, dtype=bool)
        self.x_src_dev = np.asarray(st.x_src_dev, dtype=np.int64)
        self.x_dst_dev = np.asarray(st.x_dst_dev, dtype=np.int64)
        copies = np.zeros(p, dtype=np.int32)
        versions = schedule.weight_versions  # stashed weight versions count as copies
        for stage, devices in enumerate(st.stage_devices):
            for d in devices:
                copies[d] += versions[stage]
        self.d_copies = copies
        self.d_has = np.diff(dev_ptr) > 0
        # Row arrays for the full list scheduler.
        self.dev_ptr = dev_ptr
        self.op_kind = kind
        self.dep = st.dep
        self.xfer = xfer
        self.out_ptr = st.out_ptr
        self.paired = paired
        self.n_ops = n
        self.n_units = n_units
        self.n_transfers = len(self.x_link)
        self.order = ReplayOrder(self.u_dev, self.u_r1, self.u_r2, self.u_in_ptr, self.in_x,
                                 self.u_out0, self.u_out1, self.x_link)

    def x_code(self, devices_per_node):
        """2 * (feeds an all-reduce) + (crosses nodes), per transfer."""
        inter = np.zeros(self.n_transfers, dtype=bool)
        if devices_per_node:
            inter = (self.x_src_dev // devices_per_node) != (self.x_dst_dev // devices_per_node)
        return (2 * self.x_ar + inter).astype(np.int8)


def structure_of(schedule: Schedule) -> ReplayStructure:
    """The cached :class:`ReplayStructure` of a schedule (built on first use)."""
    cached = getattr(schedule, "_replay_structure", None)
    if cached is None:
        cached = ReplayStructure(schedule)
        schedule._replay_structure = cached
    return cached


def _cat(parts, dtype):
    if not parts:
        return np.zeros(0, dtype=dtype)
    return np.ascontiguousarray(np.concatenate(parts), dtype=dtype)


class Pack:
    """Concatenated arrays of several (ReplayStructure, devices_per_node) entries.

    Attributes
    ----------
    structures : kernels.carriers.Structures
        Per-structure offsets and sizes, per-device copies, busy counts.
    units : kernels.carriers.ReplayUnits
        The execution orders, for ``replay_groups``.
    transfers : kernels.carriers.PackTransfers
    rows : kernels.carriers.PackRows
        The op rows, for ``list_groups``.
    """

    def __init__(self, entries):
        self.entries = list(entries)
        structs = [s for s, _ in self.entries]
        for s in structs:
            if getattr(s, "frozen", ()):
                raise InputError(f"schedule {s.name!r} has frozen stages {list(s.frozen)}, whose "
                                 f"activations differ from their costs' (core.compile."
                                 f"frozen_memory); the batched kernels take one activation per "
                                 f"configuration, so use pipecore.simulate for it")
        codes = [s.x_code(dpn) for s, dpn in self.entries]

        def offsets(sizes):
            return np.concatenate([[0], np.cumsum(sizes)])[:-1].astype(np.int64)

        def sizes(values):
            return np.array(values, dtype=np.int64)

        unit_lo = offsets([s.n_units for s in structs])
        count_lo = offsets([len(s.b_dev) for s in structs])
        in_base = offsets([len(s.in_x) for s in structs])
        self.structures = Structures(
            unit_lo=unit_lo,
            unit_hi=unit_lo + sizes([s.n_units for s in structs]),
            xfer_lo=offsets([s.n_transfers for s in structs]),
            dev_lo=offsets([s.devices for s in structs]),
            row_lo=offsets([s.n_ops for s in structs]),
            ptr_lo=offsets([s.n_ops + 1 for s in structs]),
            devptr_lo=offsets([s.devices + 1 for s in structs]),
            devices=sizes([s.devices for s in structs]),
            links=sizes([s.n_links for s in structs]),
            stages=sizes([s.stages for s in structs]),
            chunks_div=sizes([s.chunks_div for s in structs]),
            count_lo=count_lo,
            count_hi=count_lo + sizes([len(s.b_dev) for s in structs]),
            copies=_cat([s.d_copies for s in structs], np.int32),
            has_ops=_cat([s.d_has for s in structs], np.bool_),
            count_dev=_cat([s.b_dev for s in structs], np.int64),
            count_code=_cat([s.b_code for s in structs], np.int64),
            count_n=_cat([s.b_cnt for s in structs], np.float64),
            max_devices=max(1, max(s.devices for s in structs)),
            max_links=max(1, max(s.n_links for s in structs)),
            max_slots=max(1, max(s.n_slots for s in structs)),
            max_rows=max(1, max(s.n_ops for s in structs)),
            max_transfers=max(1, max(s.n_transfers for s in structs)),
        )
        self.units = ReplayUnits(
            device=_cat([s.u_dev for s in structs], np.int32),
            cls1=_cat([s.u_k1 for s in structs], np.int8),
            cls2=_cat([s.u_k2 for s in structs], np.int8),
            first=_cat([s.u_first for s in structs], np.bool_),
            # CSR pointers made global; transfer ids inside stay local to a structure.
            in_ptr=_cat([s.u_in_ptr[:-1] + b for s, b in zip(structs, in_base)]
                        + [[sum(len(s.in_x) for s in structs)]], np.int64),
            in_slot=_cat([s.in_slot for s in structs], np.int32),
            send_lo=_cat([s.u_out0 for s in structs], np.int32),
            send_hi=_cat([s.u_out1 for s in structs], np.int32),
        )
        self.transfers = PackTransfers(
            link=_cat([s.x_link for s in structs], np.int32),
            code=_cat(codes, np.int8),
            slot=_cat([s.x_slot for s in structs], np.int32),
        )
        self.rows = PackRows(
            dev_ptr=_cat([s.dev_ptr for s in structs], np.int64),
            op_class=_cat([s.op_kind for s in structs], np.int8),
            xfer=np.ascontiguousarray(np.concatenate([s.xfer for s in structs]), dtype=np.int32),
            out_ptr=_cat([s.out_ptr for s in structs], np.int64),
            paired=_cat([s.paired for s in structs], np.bool_),
        )

    def replay(self, c_struct, params, out, n_threads):
        """Run ``replay_groups`` for configurations sorted by structure.

        ``c_struct`` must be non-decreasing; groups of up to LANES
        consecutive configurations of one structure are formed here.
        """
        N = c_struct.shape[0]
        if N == 0:
            return
        L = _replay.LANES
        if c_struct[0] == c_struct[-1]:  # one structure (sorted): no run search
            run_lo = np.zeros(1, dtype=np.int64)
            g_lo = np.arange(0, N, L, dtype=np.int64)
            g_hi = np.minimum(g_lo + L, N)
            g_struct = np.full(len(g_lo), c_struct[0], dtype=np.int64)
        else:
            cuts = np.flatnonzero(np.diff(c_struct)) + 1
            run_lo = np.concatenate([[0], cuts])
            run_hi = np.concatenate([cuts, [N]])
            per_run = (run_hi - run_lo + L - 1) // L
            g_run = np.repeat(np.arange(len(run_lo)), per_run)
            g_idx = np.arange(len(g_run)) - np.repeat(np.cumsum(per_run) - per_run, per_run)
            g_lo = run_lo[g_run] + g_idx * L
            g_hi = np.minimum(g_lo + L, run_hi[g_run])
            g_struct = c_struct[run_lo[g_run]]
        G = len(g_lo)
        n_chunks = int(min(G, max(1, 8 * n_threads)))
        # Memory depends only on the structure and the memory costs: when those
        # are the same in every configuration (the usual sweep), track it once
        # per structure instead of in every lane of every group.
        track = any(params[r].min() != params[r].max()
                    for r in (_codes.P_ACT, _codes.P_ACTW, _codes.P_CKPT, _codes.P_WEIGHTS))
        self._replay_groups(g_struct, g_lo, g_hi, n_chunks, params, out, track)
        if not track:
            first = (run_lo if len(run_lo) == 1 else
                     run_lo[np.unique(c_struct[run_lo], return_index=True)[1]])
            one = np.zeros((out.shape[0], len(first)))
            self._replay_groups(c_struct[first], np.arange(len(first)), np.arange(1, len(first) + 1),
                                1, np.ascontiguousarray(params[:, first]), one, True)
            if len(first) == 1:
                for row in (_codes.O_PEAK_ACT, _codes.O_PEAK_TOTAL):
                    out[row] = one[row, 0]
            else:
                which = np.searchsorted(c_struct[first], c_struct)
                for row in (_codes.O_PEAK_ACT, _codes.O_PEAK_TOTAL):
                    out[row] = one[row][which]

    def _replay_groups(self, g_struct, g_lo, g_hi, n_chunks, params, out, track_mem):
        groups = Groups(np.asarray(g_struct, dtype=np.int64), np.asarray(g_lo, dtype=np.int64),
                        np.asarray(g_hi, dtype=np.int64))
        _replay.replay_groups(self.structures, self.units, self.transfers, groups, n_chunks,
                              params, out, track_mem)

    def list_schedule(self, c_struct, params, out, status, n_threads):
        """Run ``list_groups``: the full list scheduler per configuration."""
        n_chunks = int(min(max(1, len(c_struct)), 8 * n_threads))
        _replay.list_groups(self.structures, self.rows, self.transfers,
                            np.ascontiguousarray(c_struct, dtype=np.int64), n_chunks, params,
                            out, status)

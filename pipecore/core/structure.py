"""The structure of a validated schedule: what it fixes independently of costs.

:func:`pipecore.core.rules.structure` checks a schedule's rules and returns
its :class:`Structure`: every op's producers, the cross-device transfers and
the links they take, in flat arrays the kernels read. A schedule computes it
once (``Schedule._info()``) and every simulation of it reads it again, so it
never changes; what a simulation derives from it once lives beside it, in
:attr:`Structure.memo` and the cached properties.

Rows are the schedule's ops in table order (sorted by device, slot, kind);
``n`` ops, ``nx`` transfers, ``p`` devices, ``S`` stages.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

__all__ = ["Structure"]


@dataclass(frozen=True, eq=False)
class Structure:
    """The dependency structure of one validated schedule.

    Frozen: the arrays are shared by every simulation of the schedule (and
    some with its table), so nothing writes into them. Two structures are
    equal only when they are the same object (their arrays do not compare
    as a whole).
    """

    #: int: number of model stages S (one more than the largest stage).
    stages: int
    #: int: number of microbatches m (one more than the largest, all-reduces aside).
    microbatches: int
    #: (S,) int32: the device of each stage; for a replicated stage, the
    #: device of its microbatch 0.
    placement: np.ndarray
    #: list of S tuples of int: the sorted devices each stage runs on (two
    #: for a replicated stage).
    stage_devices: list
    #: (p+1,) int64: CSR offsets of the device programs; device d's ops are
    #: rows ``dev_ptr[d]`` to ``dev_ptr[d + 1] - 1``.
    dev_ptr: np.ndarray
    #: (n,) int32: the device of each op (the table's column).
    op_dev: np.ndarray
    #: (n,) int8: the kind code of each op (kernels.codes F .. L).
    op_kind: np.ndarray
    #: (n,) int32: the stage of each op.
    op_stage: np.ndarray
    #: (n,) int8: the cost class of each op: its kind code, or
    #: ``codes.F_DROP`` for an F whose (stage, microbatch) an R recomputes
    #: (its activations are dropped). May be ``op_kind`` itself when no F
    #: is dropped.
    op_class: np.ndarray
    #: (n,) bool: the op is the B or BW of an overlapped F&B pair whose F
    #: is the previous row (the two share a slot and run together).
    paired: np.ndarray
    #: (n, 2) int32: the rows each op waits for (its producers, of the same
    #: microbatch; an all-reduce's is the other replica's last backward),
    #: -1 for none.
    dep: np.ndarray
    #: (n, 2) int32: the transfer that carries each ``dep`` entry to the op,
    #: -1 for a producer on the same device (or none).
    xfer: np.ndarray
    #: (n+1,) int64: CSR of the transfers by producer row: row q sends
    #: transfers ``out_ptr[q]`` to ``out_ptr[q + 1] - 1``.
    out_ptr: np.ndarray
    #: (nx,) int32: the producer row of each transfer; transfers are sorted
    #: by producer row, then consumer row.
    x_src: np.ndarray
    #: (nx,) int32: the consumer row of each transfer.
    x_dst: np.ndarray
    #: (nx,) int32: the consumer's device of each transfer.
    x_dst_dev: np.ndarray
    #: (nx,) int32: the directed link each transfer takes, numbered
    #: compactly (0 .. n_links-1) over the links with traffic; a device's
    #: host link counts as two (to host, from host).
    x_link: np.ndarray
    #: int: number of directed links with traffic.
    n_links: int
    #: (nx,) bool: the transfer feeds an all-reduce (carries a gradient).
    x_is_ar: np.ndarray
    #: (nx,) int8: 0 for a transfer between devices; for an offload's
    #: copies over the host link, 1 to host (O to L) and 2 back (L to the
    #: backward).
    x_host: np.ndarray
    #: (nx,) int32 or (0,) int32: the transfer each one waits for (a copy
    #: back waits for its copy to host), -1 for none; empty when no
    #: transfer waits (one array fewer to fill and stream).
    x_after: np.ndarray
    #: (nx,) int32 or (0,) int32: for an offload copy of a device whose
    #: offloads go to a partner device (``Schedule.offload_to``), that
    #: partner, whose memory holds the activation between the two copies;
    #: -1 for every other transfer; empty when no copy goes to a partner.
    x_peer: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.int32))
    #: dict: cost-independent arrays a simulation derives from the structure
    #: once and every later simulation of the schedule reuses, keyed by what
    #: they depend on beyond it (transfer classes per node size, program
    #: units per host-link sharing: see core/simulate.py). The fields above
    #: never change.
    memo: dict = field(default_factory=dict, repr=False)

    @cached_property
    def x_src_dev(self) -> np.ndarray:
        """(nx,) int32: the producer's device of each transfer, gathered on
        first use: only a network with nodes or shared host links reads it,
        and at millions of transfers it is one array fewer to fill per build."""
        return self.op_dev[self.x_src]

    @cached_property
    def op_code(self) -> np.ndarray:
        """(n,) uint32: ``op_class * stages + op_stage`` per op, where its
        time sits in the flattened (cost class, stage) table, so a schedule
        without pairs needs no per-op time array; empty when the schedule
        has overlapped pairs (a pair's unit takes both ops' times)."""
        if self.paired.any():
            return np.empty(0, dtype=np.uint32)
        code = self.op_class.astype(np.uint32)  # in place from here: one array, not four
        code *= np.uint32(self.stages)
        np.add(code, self.op_stage, out=code, casting="unsafe")  # stages are >= 0
        return code

"""Named carriers of the list scheduler and the batched replay kernels.

Each carrier is a ``typing.NamedTuple`` of arrays (and a few scalars) that
travels as one argument, so a call site reads as what goes in and what
comes out. They are defined here, at module level, so Numba's cache
pickles them by reference. Each field is documented once, below: what it
holds, its dtype and shape, and whether a kernel reads it (in), writes it
(out) or uses it as work space (scratch). Index arrays are unsigned where
a kernel reads them in a hot loop: Numba then leaves out its
negative-index fix-up.

Sizes: p devices, n op rows, nu units (an op, or an overlapped F&B pair),
nx transfers, n_links links; in a pack, S structures and N configurations.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

# --- one schedule: listsched ------------------------------------------------


class Units(NamedTuple):
    """In: a schedule's programs cut into units, cost-independent
    (``core.compile.make_units``); ``listsched.list_units`` runs them.

    Without overlapped pairs unit u is row u: ``unit_rows``, ``unit_sends``,
    ``wait_ptr`` and ``waits`` are then empty and a unit's remote inputs
    and transfers are read from ``row_xfer`` and ``row_sends`` instead.
    """

    n_units: int  # nu
    dev_units: np.ndarray  # uint32 (p + 1): device d runs units dev_units[d]..dev_units[d+1]-1
    unit_rows: np.ndarray  # int64 (nu + 1) or empty: unit u is rows unit_rows[u]..unit_rows[u+1]-1
    unit_sends: np.ndarray  # uint32 (nu + 1) or empty: unit u sends transfers unit_sends[u]..[u+1]-1
    wait_ptr: np.ndarray  # uint32 (nu + 1) or empty: unit u waits for waits[wait_ptr[u]..[u+1]-1]
    waits: np.ndarray  # uint32 (<= nx) or empty: remote inputs (transfer ids), row then slot order
    x_link: np.ndarray  # uint32 (nx): the link each transfer occupies
    x_after: np.ndarray  # int32 (nx) or empty: transfer x starts no earlier than transfer
    #                      x_after[x] arrives (an offload's copy back waits for its copy to
    #                      host); -1 or empty: no such wait
    link_shared: np.ndarray  # uint8 (>= n_links): a link with several senders (a shared host
    #                          link), served in issue order
    n_links: int  # number of links
    row_xfer: np.ndarray  # int32 (n, 2), or (0, 2) with pairs: each row's remote inputs, -1 none
    row_sends: np.ndarray  # int64 (n + 1), or empty with pairs: row r sends row_sends[r]..[r+1]-1


class OpCosts(NamedTuple):
    """In: what each op row costs (``listsched.run_units``)."""

    kind: np.ndarray  # int8 (n): the op's cost class (kernels/codes.py)
    stage: np.ndarray  # int32 (n): the op's stage
    code: np.ndarray  # uint32 (n) or empty: kind * stages + stage, its entry of ``table``
    scale: np.ndarray  # float64 (n) or empty: a factor on each op's time (stragglers, jitter)
    table: np.ndarray  # float64 (classes * stages): the time of an op of class k and stage s
    #                    at k * stages + s (a flat table: Numba compiles no ravel)
    stages: int  # number of stages
    fb_factor: float  # an overlapped F&B pair takes (F + B) * fb_factor


class TransferCosts(NamedTuple):
    """In: what each transfer costs."""

    cls: np.ndarray  # uint8/uint32 (nx) or empty: each transfer's row of ser and lat;
    #                  empty: transfer x's row is x
    ser: np.ndarray  # float64: serialisation time per class (0: never occupies its link)
    lat: np.ndarray  # float64: latency per class, added after serialisation


class Times(NamedTuple):
    """Out: what the list scheduler writes. ``start`` and ``finish`` are
    per op row for ``run_units`` and per unit for ``list_units``; with
    ``keep`` false they and ``x_start`` are neither written nor read."""

    start: np.ndarray  # float64 (n or nu): start of each op (unit)
    finish: np.ndarray  # float64 (n or nu): finish of each op (unit)
    x_start: np.ndarray  # float64 (nx): when each transfer starts on its link
    x_arrival: np.ndarray  # float64 (nx): when each transfer arrives
    head: np.ndarray  # int64/uint32 (p): each device's first op (unit) that did not run
    busy: np.ndarray  # float64 (p): busy time, summed in program order
    dev_free: np.ndarray  # float64 (p): last finish
    dev_first: np.ndarray  # float64 (p): first start (untouched for a device without ops)


class ListScratch(NamedTuple):
    """Scratch: work arrays of ``list_units``."""

    link_free: np.ndarray  # float64 (>= n_links): when each link is next free
    stack: np.ndarray  # uint32 (>= p): devices to visit
    pend: np.ndarray  # uint32 (>= nx): transfers held for a shared link


# --- packs of structures: replay --------------------------------------------


class Structures(NamedTuple):
    """In: the structures of a pack (``core.pack.Pack``), entry s per
    structure; their arrays are concatenated and indexed from these offsets."""

    unit_lo: np.ndarray  # int64 (S): first replay unit (ReplayUnits)
    unit_hi: np.ndarray  # int64 (S): one past the last replay unit
    xfer_lo: np.ndarray  # int64 (S): first transfer (PackTransfers; local ids are added)
    dev_lo: np.ndarray  # int64 (S): first device (copies, has_ops)
    row_lo: np.ndarray  # int64 (S): first op row (PackRows.op_class, xfer, paired)
    ptr_lo: np.ndarray  # int64 (S): first of its n + 1 row pointers (PackRows.out_ptr)
    devptr_lo: np.ndarray  # int64 (S): first of its p + 1 device pointers (PackRows.dev_ptr)
    devices: np.ndarray  # int64 (S): p
    links: np.ndarray  # int64 (S): number of links
    stages: np.ndarray  # int64 (S): number of stages
    chunks_div: np.ndarray  # int64 (S): stages // p when p divides them, else 0
    count_lo: np.ndarray  # int64 (S): first busy count (count_dev, count_code, count_n)
    count_hi: np.ndarray  # int64 (S): one past its last busy count
    copies: np.ndarray  # int32 (sum p): stages whose weights each device holds
    has_ops: np.ndarray  # bool (sum p): the device runs at least one op
    count_dev: np.ndarray  # int64: busy counts: device,
    count_code: np.ndarray  # int64: unit cost code (a class, or N_CLASSES + N_CLASSES * F + B),
    count_n: np.ndarray  # float64: and how many units of that code the device runs
    max_devices: int  # the largest p (at least 1)
    max_links: int  # the most links (at least 1)
    max_slots: int  # the most rows of a replay's arrival buffer (at least 1)
    max_rows: int  # the most op rows (at least 1)
    max_transfers: int  # the most transfers (at least 1)


class ReplayUnits(NamedTuple):
    """In: each structure's execution order (replay units), concatenated."""

    device: np.ndarray  # int32 (nu): the device that runs the unit
    cls1: np.ndarray  # int8 (nu): cost class of its (first) op
    cls2: np.ndarray  # int8 (nu): cost class of the B of a pair, -1 for a single op
    first: np.ndarray  # bool (nu): the first unit of its device's program
    in_ptr: np.ndarray  # int64 (nu + 1): its incoming edges are in_slot[in_ptr[u]..[u+1]-1]
    in_slot: np.ndarray  # int32: arrival-buffer row of each incoming transfer
    send_lo: np.ndarray  # int32 (nu): first transfer it sends (local id)
    send_hi: np.ndarray  # int32 (nu): one past the last


class PackTransfers(NamedTuple):
    """In: each structure's transfers, concatenated (local ids)."""

    link: np.ndarray  # int32/uint32 (nx): the link it occupies
    code: np.ndarray  # int8, or uint32 in list_groups (nx): 2 * (feeds an all-reduce)
    #                   + (crosses nodes)
    slot: np.ndarray  # int32 (nx): its row of the replay's arrival buffer


class PackRows(NamedTuple):
    """In: each structure's op rows, concatenated, for ``list_groups``."""

    dev_ptr: np.ndarray  # int64/uint64 (p + 1 each): rows of device d (local)
    op_class: np.ndarray  # int8/uint8 (n each): cost class of each op
    xfer: np.ndarray  # int32 (n each, 2): remote inputs per row (local transfer ids), -1 none
    out_ptr: np.ndarray  # int64 (n + 1 each): row r sends transfers out_ptr[r]..[r+1]-1
    paired: np.ndarray  # bool (n each): the B of an overlapped pair whose F is the row before


class PackPrograms(NamedTuple):
    """Scratch of ``list_groups``: each structure's programs as ``Units``,
    laid out like its rows (made once per call, read by every configuration).
    The fields a pack never uses (offload copies, shared links, the no-pairs
    form) are constant blanks, so the units of a structure are slices."""

    dev_units: np.ndarray  # uint32 (p + 1 each, at devptr_lo): Units.dev_units
    unit_sends: np.ndarray  # uint32 (n + 1 each, at ptr_lo): Units.unit_sends
    wait_ptr: np.ndarray  # uint32 (n + 1 each, at ptr_lo): Units.wait_ptr
    waits: np.ndarray  # uint32 (nx each, at xfer_lo): Units.waits
    unit_code: np.ndarray  # uint32 (n + 1 each, at ptr_lo): each unit's row of the duration table
    n_units: np.ndarray  # int64 (S): nu
    x_after: np.ndarray  # int32 (max_transfers): all -1
    link_shared: np.ndarray  # uint8 (max_links): all 0
    row_xfer: np.ndarray  # int32 (0, 2)
    row_sends: np.ndarray  # int64 (0)


class ConfigTables(NamedTuple):
    """Scratch of ``list_groups``: one configuration's cost tables, and the
    memo of the last peaks computed."""

    dur: np.ndarray  # float64 (N_CLASSES + N_CLASSES**2): unit time per class or pair code
    ser: np.ndarray  # float64 (4): serialisation per transfer code
    lat: np.ndarray  # float64 (4): latency per transfer code
    delta: np.ndarray  # float64 (N_CLASSES): activation change per class
    memo_struct: np.ndarray  # int64 (1): the structure the memo holds, -1 none
    memo: np.ndarray  # float64 (6): act, act_w, weights, ckpt shares; peak act, peak total


class Groups(NamedTuple):
    """In: the groups of ``replay_groups``: up to LANES configurations of one structure."""

    structure: np.ndarray  # int64 (G): the structure of group g
    lo: np.ndarray  # int64 (G): its first configuration (column of params and out)
    hi: np.ndarray  # int64 (G): one past its last


class ReplayOrder(NamedTuple):
    """In: one structure's execution order with rows, for ``replay_scaled``
    (per-op costs); ``core.pack.Structure`` makes it."""

    device: np.ndarray  # int32 (nu): the device that runs the unit
    row1: np.ndarray  # int64 (nu): its (first) op row
    row2: np.ndarray  # int64 (nu): the row of the B of a pair, -1 for a single op
    in_ptr: np.ndarray  # int64 (nu + 1): its incoming transfers are inputs[in_ptr[u]..[u+1]-1]
    inputs: np.ndarray  # int32: incoming transfer ids
    send_lo: np.ndarray  # int32 (nu): first transfer it sends
    send_hi: np.ndarray  # int32 (nu): one past the last
    link: np.ndarray  # int32 (nx): the link each transfer occupies

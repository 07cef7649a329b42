"""A repeated building block's ops as the V-block kernels read them.

Ops are numbered ``bi * m + j``: op bi of the block's K ops (``(kind,
stage)`` pairs), microbatch j. A producer or consumer of an op is an op of
the same microbatch, so the block's K-row tables (:class:`BlockTables`)
describe every op; a device's ops run through consecutive ids, which keeps
the memory accesses close together. The reorder (``kernels/vreorder.py``)
and the cool-down scheduler (``kernels/vcooldown.py``) share these tables,
the id arithmetic and the column writer below.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit


class BlockTables(NamedTuple):
    """The block's K ops and the layout's scalars (``schedules.block_kernels._block_tables``).

    Inputs only: no kernel writes them. Row bi describes block op bi, the
    op ``(kind, stage)`` of every microbatch j (op id ``bi * m + j``),
    which starts at ``off[bi] + j * interval`` in the layout.
    """

    kind: np.ndarray  #: (K,) int8: the op's kind code (``codes.F``, ``B``, ``W``, ``BW``).
    stage: np.ndarray  #: (K,) int32: the op's stage.
    dev: np.ndarray  #: (K,) int64: the device that holds the stage.
    off: np.ndarray  #: (K,) int64: start offset in the block (integer time units, >= 0).
    dur: np.ndarray  #: (K,) int64: duration (integer time units, >= 1).
    prod: np.ndarray  #: (K, P) int64: block ops it waits for (same microbatch), -1 padded.
    cons: np.ndarray  #: (K, C) int64: block ops that wait for it, -1 padded.
    is_f: np.ndarray  #: (K,) bool: the op is an F (its activation becomes alive at its start).
    is_last: np.ndarray  #: (K,) bool: the op is its stage's last backward (BW, or W).
    last: np.ndarray  #: (K,) int64: the block op of its stage's last backward.
    m: int  #: microbatches.
    interval: int  #: layout time between consecutive microbatches' copies (T).
    devices: int  #: devices (p).
    horizon: int  #: layout slots: every op of every microbatch ends before it.
    warm_end: int  #: layout start of stage 0's first backward: warm-up ops start before it.
    cool_start: int  #: layout start of stage 0's last F: cool-down ops start after it.


@njit(cache=True, error_model="numpy", inline="always")
def _block_of(op, m, inv):
    """op // m by a float product (inv = 1 / m), corrected to the exact
    quotient: an integer division per op took most of the time of the
    kernels that go over every op."""
    bi = np.int64(op * inv)
    if bi * m > op:
        bi -= 1
    elif (bi + 1) * m <= op:
        bi += 1
    return bi


@njit(cache=True, error_model="numpy")
def _tile(bi, j, K):
    """Index of op (bi, j) in arrays tiled by 64 microbatches: the ops of
    all block ops for microbatches 64k..64k+63 share pages, so ops close in
    time are close in memory (one step of the list scheduler, or a move
    reading its producers' starts, K rows apart in a by-op array, would
    touch far more pages with a row per block op: TLB misses)."""
    return (((j >> 6) * K + bi) << 6) | (j & 63)


@njit(cache=True, error_model="numpy", nogil=True)  # two threads, or beside the cool-down
def columns(order, dptr, lo, hi, l_kind, l_stage, out, d0, d1):
    """Fill rows ``lo[d]`` to ``hi[d] - 1`` of devices ``d0`` to ``d1 - 1``
    in ``out``, the op table's columns (device, slot, kind, stage,
    microbatch) of the programs ``order[dptr[d]:dptr[d + 1]]``, allocated
    by the caller."""
    n = order.shape[0]
    m = n // l_kind.shape[0]
    inv = 1.0 / m  # for _block_of
    dev, slot, kind, stage, mb = out
    for d in range(d0, d1):
        for i in range(lo[d], hi[d]):
            op = order[i]
            bi = _block_of(op, m, inv)
            dev[i] = d
            slot[i] = i - dptr[d]
            kind[i] = l_kind[bi]
            stage[i] = l_stage[bi]
            mb[i] = op - bi * m

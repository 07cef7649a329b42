"""The op table's five columns as one named carrier for the kernels that write them."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit, prange


class Columns(NamedTuple):
    """The columns of an op table in (device, slot) order, one row per op.

    A builder's kernel fills them in place (they are its output); a row's
    ``kind`` is -1 until an op is written there, which is how the kernels
    find a slot written twice or left empty.

    Attributes
    ----------
    device : numpy.ndarray of int32, shape (n,)
        Device (rank) that runs the op.
    slot : numpy.ndarray of int32, shape (n,)
        Position of the op in its device's program.
    kind : numpy.ndarray of int8, shape (n,)
        Op kind code (``kernels.codes``: F, B, W, BW, AR, ...).
    stage : numpy.ndarray of int32, shape (n,)
        Model stage of the op.
    microbatch : numpy.ndarray of int32, shape (n,)
        Microbatch of the op (-1 for an all-reduce).
    """

    device: np.ndarray
    slot: np.ndarray
    kind: np.ndarray
    stage: np.ndarray
    microbatch: np.ndarray


@njit(cache=True)
def _fill_device(out_ptr, device, slot, d):
    lo = out_ptr[d]
    for r in range(lo, out_ptr[d + 1]):
        device[r] = d
        slot[r] = r - lo


@njit(cache=True)
def fill_rows_paired(out_ptr, device, slot):
    """:func:`fill_rows` for a construction with overlapped units: a row the
    kernel marked with slot -1 shares the slot of the row before it.

    Parameters
    ----------
    out_ptr : int64 (p + 1,)
    device, slot : int32 (ops,)
        Output; ``slot`` holds the kernel's marks on entry.
    """
    for d in range(out_ptr.shape[0] - 1):
        k = -1
        for r in range(out_ptr[d], out_ptr[d + 1]):
            device[r] = d
            if slot[r] != -1:
                k += 1
            slot[r] = k


@njit(cache=True, parallel=True)
def fill_rows(out_ptr, device, slot):
    """Write the device and slot columns: device d's ops are rows
    ``out_ptr[d]:out_ptr[d + 1]``, in program order (devices in parallel,
    no temporary arrays).

    Parameters
    ----------
    out_ptr : int64 (p + 1,)
    device, slot : int32 (ops,)
        Output.
    """
    for d in prange(out_ptr.shape[0] - 1):
        _fill_device(out_ptr, device, slot, d)


@njit(cache=True)
def fill_rows_serial(out_ptr, device, slot):
    """:func:`fill_rows` on one thread, for small tables (starting threads
    costs more there).

    Parameters
    ----------
    out_ptr, device, slot
        As :func:`fill_rows`.
    """
    for d in range(out_ptr.shape[0] - 1):
        _fill_device(out_ptr, device, slot, d)

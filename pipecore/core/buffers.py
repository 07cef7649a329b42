"""Large arrays for kernels to fill, with one page-size policy.

numpy asks the kernel for transparent huge pages (madvise) on every array
of 4 MB or more; a Numba kernel's own allocations get none, so large
outputs are allocated here and passed in. Measured on this project's
2-vCPU VM (2026-11-25, fresh processes, p=1024 m=8192): with huge pages,
1f1b builds in 1.1 s on a second call against 1.8-2.2 s on 4 KB pages,
zb-v in 3.6-4.8 s against 5.6-6.8 s, and 1f1b simulates in 1.5-1.7 s
against 2.0-2.4 s; first calls in a process were within noise of each
other. ``PIPECORE_HUGEPAGES=0`` leaves out the hint for hosts where a fresh
huge page costs more than it saves.
"""

from __future__ import annotations

import os

import numpy as np

try:
    from numpy._core import multiarray as _ma
except ImportError:  # numpy < 2
    from numpy.core import multiarray as _ma

_SWITCH = getattr(_ma, "_set_madvise_hugepage", None)


def _huge(nbytes: int) -> bool:
    return os.environ.get("PIPECORE_HUGEPAGES") != "0"


def empty(shape, dtype=np.float64) -> np.ndarray:
    """An uninitialised array under the page-size policy of this module.

    Parameters
    ----------
    shape : int or tuple of int
    dtype : numpy dtype, default float64

    Returns
    -------
    numpy.ndarray

    Raises
    ------
    ValueError
        If ``shape`` is negative (numpy's error).
    """
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if _SWITCH is None or nbytes < (1 << 22):
        return np.empty(shape, dtype=dtype)  # below numpy's hint threshold anyway
    before = _SWITCH(_huge(nbytes))
    try:
        return np.empty(shape, dtype=dtype)
    finally:
        _SWITCH(before)


def full(shape, value, dtype) -> np.ndarray:
    """:func:`empty` filled with ``value``."""
    out = empty(shape, dtype)
    out.fill(value)
    return out

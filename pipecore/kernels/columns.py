"""The op table's five columns as one named carrier for the kernels that write them."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


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

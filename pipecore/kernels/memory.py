"""Activation memory in program order: per-device peaks, shared by the
simulator (``peak_memory``) and the local search (``kernels.localsearch``)."""

from __future__ import annotations

import numpy as np
from numba import njit

from .codes import BW, F_DROP, B, F, R, W


@njit(cache=True, inline="always")
def device_peak(order, lo, hi, op_class, op_stage, act, act_w, ckpt):
    """Peak of one device's activation total over rows ``order[lo:hi]``
    (rows ``lo`` to ``hi - 1`` themselves when ``order`` is empty).

    Classes (``core.rules``): F +act, B -(act - act_w), W -act_w, BW -act,
    AR nothing, R +(act - ckpt), O and L nothing (offload memory moves at
    copy times: see ``core.simulate``), F_DROP (a recomputed F) +ckpt.
    """
    total = 0.0
    best = 0.0
    by_order = order.shape[0] > 0
    for i in range(lo, hi):
        r = order[i] if by_order else i
        k = op_class[r]
        s = op_stage[r]
        if k == F or k == R or k == F_DROP:
            if k == F:
                total = total + act[s]
            elif k == R:
                total = total + (act[s] - ckpt[s])
            else:
                total = total + ckpt[s]
            if total > best:
                best = total
        elif k == B:
            total = total - (act[s] - act_w[s])
        elif k == W:
            total = total - act_w[s]
        elif k == BW:
            total = total - act[s]
        # AR (all-reduce), O and L hold no activation
    return best


@njit(cache=True)
def peak_memory(dev_ptr, op_class, op_stage, act, act_w, ckpt, peak):
    """Per-device peak of the activation total, rows in program order."""
    p = dev_ptr.shape[0] - 1
    order = np.empty(0, dtype=np.int64)  # rows in program order: no order array to fill
    for d in range(p):
        peak[d] = device_peak(order, dev_ptr[d], dev_ptr[d + 1], op_class, op_stage, act, act_w,
                              ckpt)

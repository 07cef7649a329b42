"""Per-configuration columns of the batched kernels: filling a parameter
row and turning the output rows into sweep metrics, over all threads."""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .codes import O_BUSY_MAX, O_BUSY_SUM, O_MAKESPAN, O_SPAN_MAX


@njit(cache=True, parallel=True)
def fill_row(dst, row, src, value, lo, hi, n_chunks):
    """``dst[row] = src`` (or ``value`` where ``src`` is empty), over all
    threads; chunk c's smallest and largest value go to ``lo[c]``,
    ``hi[c]`` (NaN when the chunk holds a NaN), so the caller checks a
    million-row column with two tiny reductions."""
    n = dst.shape[1]
    const = src.shape[0] == 0
    for c in prange(n_chunks):
        a = c * n // n_chunks
        b = (c + 1) * n // n_chunks
        mn = np.inf
        mx = -np.inf
        nan = False
        for k in range(a, b):
            v = value if const else src[k]
            dst[row, k] = v
            if v != v:
                nan = True
            if v < mn:
                mn = v
            if v > mx:
                mx = v
        lo[c] = np.nan if nan else mn
        hi[c] = np.nan if nan else mx


@njit(cache=True, parallel=True)
def sweep_metrics(out, devices, microbatches, ratio, rate, throughput):
    """Bubble ratio, bubble rate and throughput per configuration from the
    output rows, in one pass (the formulas of ``scan.batch.metrics_from``)."""
    for k in prange(out.shape[1]):
        makespan = out[O_MAKESPAN, k]
        if makespan > 0:
            ratio[k] = _unit(1.0 - out[O_BUSY_SUM, k] / (devices * makespan))
            throughput[k] = microbatches / makespan
        else:
            ratio[k] = 0.0
            throughput[k] = np.inf
        span = out[O_SPAN_MAX, k]
        rate[k] = _unit((span - out[O_BUSY_MAX, k]) / span) if span > 0 else 0.0


@njit(cache=True)
def _unit(x):
    """``x`` clipped to [0, 1], NaN kept: a ratio rounded an ulp past its range
    (as ``core.result.bubble_ratio``)."""
    if x < 0.0:
        return 0.0
    if x > 1.0:
        return 1.0
    return x

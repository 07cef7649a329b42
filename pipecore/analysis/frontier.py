"""Pareto frontiers of (cost, value) points, lower is better on both."""

from __future__ import annotations

import numpy as np

__all__ = ["pareto_front"]

def pareto_front(x, y):
    """Indices of the points no other point beats in both x and y (lower is better).

    Parameters
    ----------
    x, y : numpy.ndarray

    Returns
    -------
    numpy.ndarray
        Indices sorted by x.
    """
    order = np.lexsort((y, x))
    best = np.inf
    keep = []
    for i in order:
        if y[i] < best:
            keep.append(i)
            best = y[i]
    return np.array(keep, dtype=np.int64)

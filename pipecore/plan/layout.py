"""Pipeline stages on a cluster of several GPU pools.

A pipeline that spans pools runs each pipeline rank's ``tp * dp`` GPUs from
one pool and uses every GPU of every pool: the ranks of a pool form one
contiguous block of the pipeline, the blocks in some order of the pools.
Its layers are split so the slowest stage is as fast as it can be (a
bottleneck split: every layer is the same, so only how many each stage gets
matters).
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from ..core.ops import InputError
from . import costmodel


def spanning(cluster, tp: int, layers: int):
    """Pipelines over every GPU of every pool, the pools in contiguous blocks.

    Parameters
    ----------
    cluster : pipecore.Cluster
    tp : int
        Tensor-parallel degree.
    layers : int
        The model's layers (a pipeline has at most one rank per layer).

    Yields
    ------
    tuple
        ``(ranks, dp)``: the pool of each pipeline rank in pipeline order
        (pool ``k`` holds ``GPUs_k / (tp * dp)`` ranks), for every
        data-parallel degree ``dp`` with ``tp * dp`` dividing every pool's
        GPUs, and every order of the pools.
    """
    counts = [pl.count for pl in cluster.pools]
    common = math.gcd(*counts)
    if common % tp:
        return
    for dp in (d for d in range(1, common // tp + 1) if (common // tp) % d == 0):
        sizes = [c // (tp * dp) for c in counts]
        if sum(sizes) > layers:
            continue
        for order in itertools.permutations(range(len(counts))):
            yield tuple(k for k in order for _ in range(sizes[k])), dp


def balance(stage_times, first_extra: float, last_extra: float, layers: int) -> tuple:
    """Layers per stage that minimise the slowest stage's time.

    Parameters
    ----------
    stage_times : array_like of float
        Seconds of one layer on each stage (> 0).
    first_extra, last_extra : float
        Seconds the first and last stage spend beside their layers
        (embedding, head).
    layers : int
        Layers to split, at least one per stage.

    Returns
    -------
    tuple of int
        Layers of each stage, summing to ``layers``.

    Raises
    ------
    ValueError
        If there are fewer layers than stages or a time is not positive.
    """
    t = np.asarray(stage_times, dtype=float)
    n = len(t)
    if layers < n:
        raise InputError(f"{layers} layers cannot fill {n} stages (each needs at least one)")
    if not np.all(np.isfinite(t) & (t > 0)):
        raise InputError(f"balance: stage times must be finite and > 0 (got {t.tolist()})")
    extra = np.zeros(n)
    extra[0] += first_extra
    extra[-1] += last_extra

    def capacity(bound):
        return np.maximum(np.floor((bound - extra) / t + 1e-9), 0).astype(np.int64)

    # The optimum is one of the stage times n * t[s] + extra[s]: search them in order.
    candidates = np.unique((np.arange(1, layers + 1)[:, None] * t[None, :] + extra[None, :]).ravel())
    lo, hi = 0, len(candidates) - 1
    while lo < hi:
        mid = (lo + hi) // 2
        cap = capacity(candidates[mid])
        if np.all(cap >= 1) and cap.sum() >= layers:
            hi = mid
        else:
            lo = mid + 1
    counts = capacity(candidates[lo])
    # Give back the surplus from the stages that end latest, so the rest stay even.
    surplus = int(counts.sum()) - layers
    while surplus > 0:
        ends = counts * t + extra
        ends[counts <= 1] = -math.inf
        s = int(np.argmax(ends))
        counts[s] -= 1
        surplus -= 1
    return tuple(int(c) for c in counts)


def balanced_layers(arch, cluster, strategy, stage_pools) -> tuple:
    """Layers of each stage for ``strategy`` with stages on ``stage_pools``.

    Parameters
    ----------
    arch : pipecore.Architecture
    cluster : pipecore.Cluster
    strategy : pipecore.Strategy
        Its degrees, microbatch size and settings (its ``layers`` and
        ``pools`` are not read).
    stage_pools : sequence of int
        The pool of each stage, in model order (``pp * chunks`` entries).

    Returns
    -------
    tuple of int
        From :func:`balance` with each stage's forward, backward and
        weight-gradient time per layer on its pool's GPU.
    """
    per = {}
    for k in set(stage_pools):
        gpu = cluster.pools[k].gpu
        blk = costmodel.block_times(arch, gpu, cluster, k, strategy)
        emb = costmodel.embedding_times(arch, gpu, cluster, k, strategy)
        head = costmodel.head_times(arch, gpu, cluster, k, strategy)
        per[k] = (blk.f + blk.b + blk.w, emb.f + emb.b + emb.w, head.f + head.b + head.w)
    times = [per[k][0] for k in stage_pools]
    return balance(times, per[stage_pools[0]][1], per[stage_pools[-1]][2], arch.layers)

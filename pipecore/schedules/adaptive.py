"""Adaptive V-shape schedules from building blocks, searched under a memory limit.

This restates the adaptive scheduler of "Pipeline Parallelism with
Controllable Memory" (Qi et al., NeurIPS 2024) as published in the authors'
repository (sail-sg/zero-bubble-pipeline-parallelism,
``zerobubble/scheduler/v_auto_schedule.py``); see docs/research/tune.md §2.2.
The code here is our own.

Device d holds stage d (chunk 0) and stage 2p-1-d (chunk 1). Per microbatch a
device runs six unit ops, written with one letter each:

=====  ==============================  ==============
op     meaning                         pipecore op
=====  ==============================  ==============
``F``  forward of chunk 0 (goes down)  F(d)
``f``  forward of chunk 1 (goes up)    F(2p-1-d)
``B``  backward of chunk 1 (down)      B(2p-1-d)
``b``  backward of chunk 0 (up)        B(d)
``W``  weight gradient after ``B``     W(2p-1-d)
``w``  weight gradient after ``b``     W(d)
=====  ==============================  ==============

A building block gives each device the slot (0-5) of each op inside a
period of 6 slots (``pipecore.schedules.adaptive_space`` enumerates
them). Each block is laid out on a slot grid, squeezed, and its warm-up and
cool-down are rebuilt from the peak memory the steady phase needs; finally
idle slots are filled with later ops when that keeps the peak and the
dependencies (``pipecore.schedules.adaptive_grid``). Memory is counted in
chunk activations (+1 at a forward, -1 at a weight gradient; a ``B`` frees
nothing). Candidates whose peak exceeds the limit are dropped; the survivors
are timed with the real per-chunk costs and the one with the shortest longest
device span wins.

Pruning (the authors' search runs every block, which is slow at large p):
blocks are deduplicated (one split point when delta0 == delta1), their
steady-state peak is computed from the block alone before anything is laid
out, and only the blocks whose peak is the largest that fits are built (at
most 61 at any p; optionally fewer with ``max_blocks``, longest device-0
round trip first, which in our runs is the better half more often). Without
the authors' early exit over the split point this is a superset of their
search at that peak. Results are cached per (p, m, costs, limit).
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

from ..core.costs import Costs
from ..core.ops import InputError
from ..core.schedule import Schedule, check_int
from ..core.sizes import BYTES_PER_OP, MAX_OPS, OPS_RULE, check_size
from ..kernels.adaptive import LETTERS as _LETTERS
from .adaptive_grid import _build, _span
from .adaptive_space import _blocks, _chain, _steady_peak

__all__ = ["adaptive_v", "adaptive_blocks"]

_BLOCK_CACHE: OrderedDict = OrderedDict()
_RESULT_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 64


def adaptive_blocks(devices: int) -> list:
    """Every distinct V building block of the search space.

    Parameters
    ----------
    devices : int
        p >= 2.

    Returns
    -------
    list of tuple
        Each block is a tuple of p dicts mapping an op letter (``FfBbWw``)
        to its slot 0-5 on that device.

    Raises
    ------
    ValueError
        If ``devices`` is not an int >= 2.
    """
    p = check_int("devices", devices, minimum=2)
    return list(_blocks(p))


def _cached(cache, key, make):
    """``cache[key]``, made by ``make()`` when missing; the cache keeps the
    ``_CACHE_SIZE`` most recently used."""
    if key in cache:
        cache.move_to_end(key)
        return cache[key]
    value = make()
    cache[key] = value
    if len(cache) > _CACHE_SIZE:
        cache.popitem(last=False)
    return value


def _ranked_blocks(p):
    """Distinct blocks with their chain and steady peak, grouped by peak;
    within a peak, longest device-0 round trip (F to its w) first."""
    def make():
        groups = {}
        for blk in _blocks(p):
            chain = _chain(blk)
            peak = _steady_peak(chain)
            if peak > 2 * p:
                continue
            trip = chain[0]["w"] - chain[0]["F"]
            groups.setdefault(peak, []).append((trip, chain[p - 1]["f"] - chain[0]["F"],
                                                blk, chain))
        for v in groups.values():
            v.sort(key=lambda x: (-x[0], -x[1]))
        return groups
    return _cached(_BLOCK_CACHE, p, make)


def _scalar_costs(costs):
    """The costs the search uses, as floats; they must be scalars."""
    for k in ("f", "b", "w", "comm", "activation", "activation_w", "weights"):
        if np.ndim(getattr(costs, k)) != 0:
            raise InputError(f"adaptive_v needs scalar costs; 'costs.{k}' is a vector")
    return {k: float(getattr(costs, k)) for k in ("f", "b", "w", "comm", "activation",
                                                  "activation_w", "weights")}


def adaptive_v(devices: int, microbatches: int, costs: Costs | None = None,
               memory_limit: float | None = None, max_blocks: int | None = None,
               levels: int = 1) -> Schedule:
    """The adaptive V-shape schedule with the shortest span under a memory limit.

    Searches V building blocks (see the module docstring), builds the ones
    whose steady phase fits, and returns the fastest result whose peak fits.

    Parameters
    ----------
    devices : int
        p >= 2; device d holds stages d and 2p-1-d.
    microbatches : int
        m >= 1.
    costs : Costs, optional
        Scalar costs per device share (default ``Costs()``): a chunk takes
        half of ``f``, ``b`` and ``w``; ``comm`` is the latency of each hop
        between devices. The search counts memory with a ``B`` freeing
        nothing, so it is exact when ``activation_w == activation`` and safe
        otherwise (a B that frees memory only lowers the peak).
    memory_limit : float, optional
        Per-device limit on peak activation plus ``weights``, in the units
        of ``costs`` (one ``activation`` is a whole device share, two
        chunks). None means 1F1B-like memory, ``devices`` activations.
    max_blocks : int, optional
        Blocks built per memory level, in the order of a cheap ranking (the
        cost of the search); all of them by default (at most 61 per level).
    levels : int, default 1
        How many of the largest steady peaks that fit are searched. With
        unit costs the largest peak that fits always wins (the bubble falls
        by 3 slots per chunk activation); a second level can help when the
        costs are far from equal.

    Returns
    -------
    Schedule
        Named ``"adaptive-v"``; validated on construction.

    Raises
    ------
    ValueError
        For bad arguments, vector costs, or when no block gives a schedule
        within the limit (the leanest blocks need about p/2 activations at
        p <= 16 and somewhat less at larger p, never below a third of 1F1B's).
    """
    p = check_int("devices", devices, minimum=2)
    m = check_int("microbatches", microbatches, minimum=1)
    # 2p stages of F, B and W each, over at least 2p microbatches (the search pads m).
    check_size(f"adaptive_v(devices={p}, microbatches={m})", 6 * p * max(m, 2 * p), "ops",
               limit=MAX_OPS, rule=OPS_RULE, bytes_each=BYTES_PER_OP, exact=False)
    costs = Costs() if costs is None else costs
    if not isinstance(costs, Costs):
        raise InputError(f"'costs' must be a pipecore.Costs (got {type(costs).__name__})")
    if max_blocks is not None:
        max_blocks = check_int("max_blocks", max_blocks, minimum=1)
    levels = check_int("levels", levels, minimum=1)
    c = _scalar_costs(costs)
    if memory_limit is None:
        units = 2 * p
    else:
        lim = memory_limit
        if isinstance(lim, bool) or not isinstance(lim, (int, float)) or math.isnan(lim) \
                or lim <= 0:
            raise InputError(f"'memory_limit' must be a number > 0 (got {memory_limit!r})")
        if c["activation"] <= 0:
            units = 2 * p
        else:
            # One chunk activation is half a device share.
            units = int(math.floor((lim - c["weights"]) / (c["activation"] / 2) + 1e-9))
            units = min(units, 2 * p)
    key = (p, m, tuple(sorted(c.items())), units, max_blocks, levels)
    rows = _cached(_RESULT_CACHE, key, lambda: _search(p, m, c, units, max_blocks, levels))
    if rows is None:
        raise InputError(
            f"adaptive_v: no V building block gives a schedule for p={p}, m={m} within "
            f"memory_limit={memory_limit!r} ({units} chunk activations); try a larger limit")
    return Schedule.from_programs(_programs(rows), name="adaptive-v", devices=p)


def _search(p, m, c, units, max_blocks, levels):
    """The rows of the shortest schedule within ``units`` chunk activations,
    or None: blocks of the ``levels`` largest steady peaks that fit, at most
    ``max_blocks`` built per peak, each timed with half-device-share costs."""
    if units < 1:
        return None
    groups = _ranked_blocks(p)
    f, b, w = c["f"] / 2, c["b"] / 2, c["w"] / 2
    best, best_span = None, math.inf
    fitting = sorted((k for k in groups if k <= units), reverse=True)
    tried = 0
    for peak in fitting:
        if tried >= levels:
            break
        built = 0
        for _trip, _turn, blk, chain in groups[peak]:
            if max_blocks is not None and built >= max_blocks:
                break
            got = _build(blk, chain, m, units)
            if got is None:
                continue
            built += 1
            rows, _pk = got
            span = _span(rows, f, b, w, c["comm"])
            if span < best_span - 1e-12:
                best, best_span = rows, span
        if built:
            tried += 1
    return best


def _programs(rows):
    """Per-device programs of (kind, stage, microbatch) from rows of letters."""
    p = len(rows)
    out = []
    for i, row in enumerate(rows):
        cnt = dict.fromkeys(_LETTERS, 0)
        prog = []
        for c in row:
            if c is None:
                continue
            stage = i if c in "Fbw" else 2 * p - 1 - i
            kind = c.upper()
            prog.append((kind, stage, cnt[c]))
            cnt[c] += 1
        out.append(prog)
    return out

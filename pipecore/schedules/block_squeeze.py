"""Squeezing a repeated building block in pure Python.

The layout (every op at its block offset plus ``j * interval``), the
optional reordering of the warm-up and cool-down ops into earlier free
slots (``_reorder``) and the greedy re-ordering of each device's ops after
its last forward (``_greedy_cooldown``), as :meth:`Repeated.squeeze
<pipecore.schedules.blocks.Repeated.squeeze>` describes them. Below the
kernels' threshold (``block_kernels._KERNEL_MIN_OPS``), off the integer
grid, or while the kernels would compile, ``squeeze`` runs this version;
the kernels (``kernels/vreorder.py``, ``kernels/vcooldown.py``) equal it op
for op, and the tests hold them to it.

The functions take a block by its attributes (placement, offsets,
interval, durations, stages, devices), so this module does not import the
block model.
"""

from __future__ import annotations

import heapq

import numpy as np

from ..kernels.codes import BW, B, F, W

#: Kind names to their codes, in the order ties between ops are broken.
_KIND_ORDER = {"F": F, "B": B, "W": W, "BW": BW}


def _layout_times(block, microbatches):
    """Every op with its unsqueezed start time (see ``Repeated.times``):
    ``(start, device, kind, stage, microbatch)`` sorted by device, then
    start time."""
    b = block
    m = microbatches
    keys = list(b.offsets)
    off = np.array([b.offsets[key] for key in keys], dtype=np.float64)
    stage = np.array([s for _k, s in keys], dtype=np.int64)
    code = np.array([_KIND_ORDER[k] for k, _s in keys], dtype=np.int64)
    dev = np.array(b.placement, dtype=np.int64)[stage]
    j = np.repeat(np.arange(m, dtype=np.int64), len(keys))
    local = np.tile(np.arange(len(keys)), m)
    start = off[local] + j * b.interval  # the same float sums as t + j * interval
    order = np.lexsort((j, stage[local], code[local], start, dev[local]))
    kinds = [keys[i][0] for i in local[order].tolist()]
    return list(zip(start[order].tolist(), dev[local][order].tolist(), kinds,
                    stage[local][order].tolist(), j[order].tolist()))


def _producers(kind, stage, j, stages, offsets):
    """The ops (kind, stage, microbatch) that op (kind, stage, j) waits for."""
    if kind == "F":
        return [("F", stage - 1, j)] if stage > 0 else []
    if kind == "W":
        return [("B", stage, j)]
    out = [("F", stage, j)]
    if stage < stages - 1:
        out.append(("BW" if ("BW", stage + 1) in offsets else "B", stage + 1, j))
    return out


def _reorder(block, ops):
    """Move warm-up and cool-down ops into earlier free slots (see Repeated.squeeze).

    Works on the block's integer time grid: a device's busy slots are kept
    in a set and its activation curve (alive from F's start to the end of
    the stage's last backward op) in an array, so each tentative move costs
    the length of the move, not a pass over the device's ops.
    """
    dur = block.durations
    if any(t != int(t) for t in block.offsets.values()) or any(d != int(d) for d in dur.values()):
        return ops  # reordering needs the integer grid; squeezing alone still applies
    dur = {k: int(v) for k, v in dur.items()}
    start = {(k, s, j): int(t) for t, _d, k, s, j in ops}
    placement = block.placement
    S = block.stages
    act = block.devices / S
    last = {s: ("BW" if ("BW", s) in block.offsets else "W") for s in range(S)}
    horizon = max(start[op] + dur[op[0]] for op in start) + 1
    occupied = [dict() for _ in range(block.devices)]
    memory = [np.zeros(horizon) for _ in range(block.devices)]
    for op, t in start.items():
        k, s, j = op
        d = placement[s]
        for u in range(t, t + dur[k]):
            occupied[d][u] = op
        if k == "F":
            memory[d][t:start[(last[s], s, j)] + dur[last[s]]] += act
    limits = [float(mem.max()) for mem in memory]

    def free(d, lo, length, op):
        return all(occupied[d].get(u, op) == op for u in range(lo, lo + length))

    def move(op, new):
        k, s, j = op
        d = placement[s]
        old = start[op]
        for u in range(old, old + dur[k]):
            del occupied[d][u]
        for u in range(new, new + dur[k]):
            occupied[d][u] = op
        start[op] = new
        if k == "F":
            memory[d][new:old] += act
        elif k == last[s]:
            memory[d][new + dur[k]:old + dur[k]] -= act

    # Phases (per the paper): warm-up until device 0's first backward of
    # stage 0, cool-down after device 0's last forward of stage 0.
    m = max(j for _t, _d, _k, _s, j in ops) + 1
    back0 = "BW" if ("BW", 0) in block.offsets else "B"
    warm_end = start[(back0, 0, 0)]
    cool_start = start[("F", 0, m - 1)]
    candidates = [op for op in start if not warm_end <= start[op] <= cool_start]
    for _round in range(3):
        moved = False
        for op in sorted(candidates, key=lambda o: start[o]):
            k, s, j = op
            d = placement[s]
            t = start[op]
            ready = max((start[q] + dur[q[0]] for q in _producers(k, s, j, S, block.offsets)),
                        default=0)
            for slot in range(ready, t):
                if not free(d, slot, dur[k], op):
                    continue
                # An earlier F keeps its activation alive longer; others only free earlier.
                if k == "F" and memory[d][slot:t].max(initial=0.0) + act > limits[d] + 1e-9:
                    continue
                move(op, slot)
                moved = True
                break
        if not moved:
            break
    out = [(float(start[(k, s, j)]), d, k, s, j) for _t, d, k, s, j in ops]
    out.sort(key=lambda x: (x[1], x[0], _KIND_ORDER[x[2]], x[3], x[4]))
    return out


def _greedy_cooldown(block, programs):
    """Re-order each device's ops after its last forward: a ready backward
    (B or BW) first, else the oldest pending W, else wait.

    After its last F a device only frees memory, so any order of its
    remaining B and W keeps the peak; running the backward chain first and
    filling waits with W is how the zero-bubble schedules end. Devices are
    advanced in order of the time they become free; a device that cannot
    run anything waits until one of the ops it needs finishes.
    """
    dur = block.durations
    S = block.stages
    p = len(programs)
    fixed, tail = [], []
    for prog in programs:
        last_f = max((i for i, op in enumerate(prog) if op[0] == "F"), default=-1)
        fixed.append(prog[: last_f + 1])
        tail.append(prog[last_f + 1:])
    rank = {op: i for prog in tail for i, op in enumerate(prog)}
    producers = {op: _producers(op[0], op[1], op[2], S, block.offsets)
                 for prog in programs for op in prog}
    done = {}
    out = [[] for _ in range(p)]
    free_at = [0.0] * p
    pos = [0] * p
    pending = [list(t) for t in tail]
    waiters = {}
    heap = [(0.0, d) for d in range(p)]
    total = sum(len(x) for x in programs)

    def ready_at(op):
        t = 0.0
        for q in producers[op]:
            if q not in done:
                return None
            t = max(t, done[q])
        return t

    def wait(d, ops):
        for op in ops:
            for q in producers[op]:
                if q not in done:
                    waiters.setdefault(q, set()).add(d)

    while heap:
        now, d = heapq.heappop(heap)
        if now != free_at[d]:
            continue  # stale entry
        if pos[d] < len(fixed[d]):
            op = fixed[d][pos[d]]
            t = ready_at(op)
            if t is None:
                wait(d, [op])
                continue
            pos[d] += 1
        else:
            best = None
            for cand in pending[d]:
                t = ready_at(cand)
                if t is None:
                    continue
                key = (max(t, now), cand[0] == "W", rank[cand])
                if best is None or key < best[0]:
                    best = (key, cand, t)
            if best is None:
                if pending[d]:
                    wait(d, pending[d])
                continue
            _key, op, t = best
            pending[d].remove(op)
        begin = max(now, t)
        free_at[d] = begin + dur[op[0]]
        done[op] = free_at[d]
        out[d].append(op)
        if pos[d] < len(fixed[d]) or pending[d]:
            heapq.heappush(heap, (free_at[d], d))
        for e in waiters.pop(op, ()):
            if e != d:
                heapq.heappush(heap, (free_at[e], e))
    if len(done) < total:  # pragma: no cover - the layout order is always feasible
        raise RuntimeError("cool-down reordering stalled")
    return out


def _squeeze_programs(block, microbatches, reorder=True):
    """Per-device programs of :meth:`Repeated.squeeze` by the Python
    version (``_reorder`` and ``_greedy_cooldown``)."""
    ops = _layout_times(block, microbatches)
    if reorder:
        ops = _reorder(block, ops)
    programs = [[] for _ in range(block.devices)]
    for _t, d, k, s, j in ops:
        programs[d].append((k, s, j))
    if reorder:
        programs = _greedy_cooldown(block, programs)
    return programs

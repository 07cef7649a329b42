"""List scheduling of the adaptive V scheduler's slot grids (schedules.adaptive).

Ops are letter codes F=0, f=1, B=2, b=3, W=4, w=5 per device, in program
order: ``codes[ptr[i]:ptr[i + 1]]`` is device i's program. F and B of a
device wait for the same op of the device before (chunk 0 runs down the
pipeline), f and b for the device after (chunk 1 runs up); the k-th op of a
letter on a device pairs with the k-th of that letter on its neighbour.
"""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(cache=True)
def _offsets(codes, ptr):
    # Start of each (device, letter)'s list of times in one flat array.
    p = ptr.size - 1
    off = np.zeros(p * 6 + 1, np.int64)
    for i in range(p):
        for r in range(ptr[i], ptr[i + 1]):
            off[i * 6 + codes[r] + 1] += 1
    for x in range(p * 6):
        off[x + 1] += off[x]
    return off


@njit(cache=True)
def list_starts(codes, ptr, dur, hop):
    """Each op's start when device programs run in order and an op waits for
    its input on the neighbouring device (its end plus ``hop``); op code x
    takes ``dur[x]``. With every duration 1 and ``hop`` 0 the starts are the
    slots of the squeezed grid (one slot after the input's).

    Returns ``(ok, start)``; ``ok`` is False when the programs wait on each
    other in a cycle.
    """
    p = ptr.size - 1
    n = codes.size
    off = _offsets(codes, ptr)
    end = np.empty(n, np.float64)  # by (device, letter, k) through off
    placed = np.zeros((p, 6), np.int64)
    start = np.zeros(n, np.float64)
    clock = np.zeros(p, np.float64)
    head = ptr[:-1].copy()
    done = 0
    while done < n:
        moved = False
        for i in range(p):
            k = head[i]
            while k < ptr[i + 1]:
                c = codes[k]
                j = placed[i, c]
                ready = 0.0
                if (c == 0 or c == 2) and i > 0:
                    if j >= placed[i - 1, c]:
                        break
                    ready = end[off[(i - 1) * 6 + c] + j] + hop
                elif (c == 1 or c == 3) and i < p - 1:
                    if j >= placed[i + 1, c]:
                        break
                    ready = end[off[(i + 1) * 6 + c] + j] + hop
                t = max(ready, clock[i])
                start[k] = t
                clock[i] = t + dur[c]
                end[off[i * 6 + c] + j] = clock[i]
                placed[i, c] = j + 1
                k += 1
                done += 1
                moved = True
            head[i] = k
        if not moved:
            return False, start
    return True, start


@njit(cache=True, inline="always")
def _delta(c):
    # Activation held: a forward adds one, a weight gradient frees one.
    if c == 0 or c == 1:
        return 1
    if c == 4 or c == 5:
        return -1
    return 0


@njit(cache=True)
def fill_gaps(grid):
    """Pull a later op of the same device into each idle slot (-1) when its
    input is ready there and the device's peak does not rise; slots in
    order, devices ascending within a slot. Changes ``grid`` in place.

    A letter is wanted at slot j while its last slot in the original grid
    is after j (taken once, before any move); each wanted letter is tried
    at its first later occurrence only.
    """
    p, n = grid.shape
    peak = 0
    for i in range(p):
        mem = 0
        for j in range(n):
            c = grid[i, j]
            if c >= 0:
                mem += _delta(c)
                peak = max(peak, mem)
    last = np.full((p, 6), -1, np.int64)
    for i in range(p):
        for j in range(n):
            if grid[i, j] >= 0:
                last[i, grid[i, j]] = j
    count = np.zeros((p, 6), np.int64)
    where = np.empty((p, 6, n), np.int64)
    mem_at = np.zeros(p, np.int64)
    for j in range(n):
        for i in range(p):
            c = grid[i, j]
            if c >= 0:
                where[i, c, count[i, c]] = j
                count[i, c] += 1
                mem_at[i] += _delta(c)
                continue
            wanted = 0
            for x in range(6):
                if last[i, x] > j:
                    wanted |= 1 << x
            rise = 0
            top = 0
            for k in range(j + 1, n):
                if wanted == 0:
                    break
                x = grid[i, k]
                before = top
                if x >= 0:
                    rise += _delta(x)
                top = max(top, rise)
                if x < 0 or not (wanted >> x) & 1:
                    continue
                wanted &= ~(1 << x)
                if (x == 0 or x == 1) and mem_at[i] + before >= peak:
                    continue
                cnt = count[i, x]
                if x == 0 or x == 2:
                    if i > 0:
                        ok = cnt < count[i - 1, x] and where[i - 1, x, cnt] < j
                    else:
                        ok = x == 0 or count[i, 1] > cnt
                elif x == 1 or x == 3:
                    if i < p - 1:
                        ok = cnt < count[i + 1, x] and where[i + 1, x, cnt] < j
                    else:
                        ok = count[i, 0 if x == 1 else 2] > cnt
                else:
                    ok = count[i, 2 if x == 4 else 3] > cnt
                if not ok:
                    continue
                grid[i, j] = x
                grid[i, k] = -1
                where[i, x, cnt] = j
                count[i, x] = cnt + 1
                mem_at[i] += _delta(x)
                break
    return grid

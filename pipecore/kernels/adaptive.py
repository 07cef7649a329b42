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


# The grid steps below take each device's row as a slice of one flat int8
# array, ``codes[ptr[i]:ptr[i + 1]]``, with -1 for an idle slot.

@njit(cache=True)
def peaks(codes, ptr):
    """Each row's peak of held activations (0 at least): +1 at a forward,
    -1 at a weight gradient."""
    p = ptr.size - 1
    out = np.zeros(p, np.int64)
    for i in range(p):
        mem = 0
        peak = 0
        for r in range(ptr[i], ptr[i + 1]):
            c = codes[r]
            if c >= 0:
                mem += _delta(c)
                if mem > peak:
                    peak = mem
        out[i] = peak
    return out


@njit(cache=True)
def valid(codes, ptr, m):
    """Every letter exactly ``m`` times per row; the k-th W after the k-th
    B and w after b; on the first row f before B, on the last F before f
    and B before b (k-th against k-th)."""
    p = ptr.size - 1
    at = np.empty((6, m), np.int64)
    for i in range(p):
        cnt = np.zeros(6, np.int64)
        for r in range(ptr[i], ptr[i + 1]):
            c = codes[r]
            if c < 0:
                continue
            if cnt[c] >= m:
                return False
            at[c, cnt[c]] = r - ptr[i]
            cnt[c] += 1
        for c in range(6):
            if cnt[c] != m:
                return False
        for j in range(m):
            if at[2, j] >= at[4, j] or at[3, j] >= at[5, j]:
                return False
            if i == 0 and at[1, j] >= at[2, j]:
                return False
            if i == p - 1 and (at[0, j] >= at[1, j] or at[2, j] >= at[3, j]):
                return False
    return True


@njit(cache=True)
def relabel_w(codes, ptr):
    """Weight-gradient slots take W or w in the order of their backwards
    (B then W, b then w), oldest first; in place. False when a row has a
    weight gradient before any backward left to pair it with."""
    p = ptr.size - 1
    queue = np.empty(codes.size, np.int8)
    for i in range(p):
        n = 0
        head = 0
        for r in range(ptr[i], ptr[i + 1]):
            c = codes[r]
            if c == 2:
                queue[n] = 4
                n += 1
            elif c == 3:
                queue[n] = 5
                n += 1
            elif c == 4 or c == 5:
                if head >= n:
                    return False
                codes[r] = queue[head]
                head += 1
    return True


@njit(cache=True, inline="always")
def _put(grid, length, i, j, c):
    # A write past the row's end extends it with idle slots (grid is -1 there).
    if j >= length[i]:
        length[i] = j + 1
    grid[i, j] = c


@njit(cache=True)
def cooldown_rows(grid, length, m):
    """The cool-down rebuild of schedules.adaptive on rows ``grid[i, :length[i]]``
    (idle -1, the rest of each row -1 too, wide enough for the growth);
    changes both in place. Returns 0, 1 when a tail ``b`` lands on a taken
    slot (no schedule), or 2 when a slot index goes negative (Python would
    index from the row's end: the caller runs the reference instead)."""
    p = grid.shape[0]
    top = 0
    for i in range(p):
        mem = 0
        for j in range(length[i]):
            c = grid[i, j]
            if c >= 0:
                mem += _delta(c)
                top = max(top, mem)
    keep_b = min((top + 1) // 2, m)
    keep_B = min(top - keep_b, m)
    anchor = -1
    for i in range(p):
        nB = 0
        nb = 0
        nW = 0
        nw = 0
        last_f = -1
        for j in range(length[i] - 1, -1, -1):
            c = grid[i, j]
            if c == 1 and last_f < 0:
                last_f = j
            if c == 2 and nB < i + 1 and nB < keep_B:
                grid[i, j] = -1
                nB += 1
            if c == 3 and nb < keep_b:
                grid[i, j] = -1
                nb += 1
        for j in range(length[i] - 1, -1, -1):
            if nW >= nB and nw >= nb and nW + nw >= top:
                break
            if grid[i, j] == 4:
                grid[i, j] = -1
                nW += 1
            elif grid[i, j] == 5:
                grid[i, j] = -1
                nw += 1
        if i == 0:
            anchor = last_f
        for k in range(nb):
            j = anchor - i + 2 * p - 2 * k
            if j < 0:
                return 2
            if j < length[i] and grid[i, j] >= 0:
                return 1
            _put(grid, length, i, j, 3)
        for k in range(nB):
            j = anchor + 1 + i - 2 * k
            if j < 0:
                return 2
            _put(grid, length, i, j, 2)
    for i in range(p):
        owe_W = 0
        owe_w = 0
        last_w = -1
        for j in range(length[i]):
            if grid[i, j] == 4 or grid[i, j] == 5:
                last_w = j
        for j in range(length[i]):
            c = grid[i, j]
            if c == 2:
                owe_W += 1
            elif c == 3:
                owe_w += 1
            elif c == 4:
                owe_W -= 1
            elif c == 5:
                owe_w -= 1
            elif c < 0 and j > last_w:
                if owe_W > 0:
                    grid[i, j] = 4
                    owe_W -= 1
                elif owe_w > 0:
                    grid[i, j] = 5
                    owe_w -= 1
        for _ in range(owe_W):
            _put(grid, length, i, length[i], 4)
        for _ in range(owe_w):
            _put(grid, length, i, length[i], 5)
    return 0

"""Kernels of the adaptive V scheduler's slot grids (schedules.adaptive_grid).

Ops are the letter codes below per device, in program order:
``codes[ptr[i]:ptr[i + 1]]`` is device i's program (an idle slot is
``IDLE``). F and B of a device wait for the same op of the device before
(they run down the pipeline), f and b for the device after (they run up);
the k-th op of a letter on a device pairs with the k-th of that letter on
its neighbour.
"""

from __future__ import annotations

import numpy as np
from numba import njit

# The grid's letters and their codes: ``LETTERS[code]`` is the letter.
# Device d holds stage d (chunk 0) and stage 2p-1-d (chunk 1).
LETTERS = "FfBbWw"
F_DOWN = 0  # "F": forward of chunk 0, waits for the device before
F_UP = 1  # "f": forward of chunk 1, waits for the device after
B_DOWN = 2  # "B": backward of chunk 1, waits for the device before
B_UP = 3  # "b": backward of chunk 0, waits for the device after
W_DOWN = 4  # "W": weight gradient of chunk 1, after its "B"
W_UP = 5  # "w": weight gradient of chunk 0, after its "b"
N_LETTERS = 6
IDLE = -1  # an idle slot

# What cooldown_rows returns.
COOLDOWN_OK = 0
COOLDOWN_TAKEN = 1  # a tail b lands on a taken slot: no schedule
COOLDOWN_NEGATIVE = 2  # a slot index goes negative: the caller runs the Python path


@njit(cache=True)
def _offsets(codes, ptr):
    # Start of each (device, letter)'s list of times in one flat array.
    p = ptr.size - 1
    off = np.zeros(p * N_LETTERS + 1, np.int64)
    for i in range(p):
        for r in range(ptr[i], ptr[i + 1]):
            off[i * N_LETTERS + codes[r] + 1] += 1
    for x in range(p * N_LETTERS):
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
    placed = np.zeros((p, N_LETTERS), np.int64)
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
                if (c == F_DOWN or c == B_DOWN) and i > 0:
                    if j >= placed[i - 1, c]:
                        break
                    ready = end[off[(i - 1) * N_LETTERS + c] + j] + hop
                elif (c == F_UP or c == B_UP) and i < p - 1:
                    if j >= placed[i + 1, c]:
                        break
                    ready = end[off[(i + 1) * N_LETTERS + c] + j] + hop
                t = max(ready, clock[i])
                start[k] = t
                clock[i] = t + dur[c]
                end[off[i * N_LETTERS + c] + j] = clock[i]
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
    if c == F_DOWN or c == F_UP:
        return 1
    if c == W_DOWN or c == W_UP:
        return -1
    return 0


@njit(cache=True)
def fill_gaps(grid):
    """Pull a later op of the same device into each idle slot when its
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
    last = np.full((p, N_LETTERS), -1, np.int64)
    for i in range(p):
        for j in range(n):
            if grid[i, j] >= 0:
                last[i, grid[i, j]] = j
    count = np.zeros((p, N_LETTERS), np.int64)
    where = np.empty((p, N_LETTERS, n), np.int64)
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
            for x in range(N_LETTERS):
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
                if (x == F_DOWN or x == F_UP) and mem_at[i] + before >= peak:
                    continue
                cnt = count[i, x]
                # Its input is ready: the same op on the neighbour it waits
                # for ran before slot j; where the V turns (device 0 for B,
                # the last device for f and b) the op it follows on this
                # device has run, and so has a weight gradient's backward.
                if x == F_DOWN or x == B_DOWN:
                    if i > 0:
                        ok = cnt < count[i - 1, x] and where[i - 1, x, cnt] < j
                    else:
                        ok = x == F_DOWN or count[i, F_UP] > cnt
                elif x == F_UP or x == B_UP:
                    if i < p - 1:
                        ok = cnt < count[i + 1, x] and where[i + 1, x, cnt] < j
                    else:
                        ok = count[i, F_DOWN if x == F_UP else B_DOWN] > cnt
                else:
                    ok = count[i, B_DOWN if x == W_DOWN else B_UP] > cnt
                if not ok:
                    continue
                grid[i, j] = x
                grid[i, k] = IDLE
                where[i, x, cnt] = j
                count[i, x] = cnt + 1
                mem_at[i] += _delta(x)
                break
    return grid


# The grid steps below take each device's row as a slice of one flat int8
# array, ``codes[ptr[i]:ptr[i + 1]]``, with IDLE for an idle slot.

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
    at = np.empty((N_LETTERS, m), np.int64)
    for i in range(p):
        cnt = np.zeros(N_LETTERS, np.int64)
        for r in range(ptr[i], ptr[i + 1]):
            c = codes[r]
            if c < 0:
                continue
            if cnt[c] >= m:
                return False
            at[c, cnt[c]] = r - ptr[i]
            cnt[c] += 1
        for c in range(N_LETTERS):
            if cnt[c] != m:
                return False
        for j in range(m):
            if at[B_DOWN, j] >= at[W_DOWN, j] or at[B_UP, j] >= at[W_UP, j]:
                return False
            if i == 0 and at[F_UP, j] >= at[B_DOWN, j]:
                return False
            if i == p - 1 and (at[F_DOWN, j] >= at[F_UP, j] or at[B_DOWN, j] >= at[B_UP, j]):
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
            if c == B_DOWN:
                queue[n] = W_DOWN
                n += 1
            elif c == B_UP:
                queue[n] = W_UP
                n += 1
            elif c == W_DOWN or c == W_UP:
                if head >= n:
                    return False
                codes[r] = queue[head]
                head += 1
    return True


@njit(cache=True, inline="always")
def _put(grid, length, i, j, c):
    # A write past the row's end extends it with idle slots (grid is IDLE there).
    if j >= length[i]:
        length[i] = j + 1
    grid[i, j] = c


@njit(cache=True)
def cooldown_rows(grid, length, m):
    """The cool-down rebuild of schedules.adaptive_grid on rows ``grid[i, :length[i]]``
    (the rest of each row IDLE too, wide enough for the growth);
    changes both in place. Returns COOLDOWN_OK, COOLDOWN_TAKEN when a tail
    ``b`` lands on a taken slot (no schedule), or COOLDOWN_NEGATIVE when a
    slot index goes negative (Python would index from the row's end: the
    caller runs the Python version instead)."""
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
            if c == F_UP and last_f < 0:
                last_f = j
            if c == B_DOWN and nB < i + 1 and nB < keep_B:
                grid[i, j] = IDLE
                nB += 1
            if c == B_UP and nb < keep_b:
                grid[i, j] = IDLE
                nb += 1
        for j in range(length[i] - 1, -1, -1):
            if nW >= nB and nw >= nb and nW + nw >= top:
                break
            if grid[i, j] == W_DOWN:
                grid[i, j] = IDLE
                nW += 1
            elif grid[i, j] == W_UP:
                grid[i, j] = IDLE
                nw += 1
        if i == 0:
            anchor = last_f
        for k in range(nb):
            j = anchor - i + 2 * p - 2 * k
            if j < 0:
                return COOLDOWN_NEGATIVE
            if j < length[i] and grid[i, j] >= 0:
                return COOLDOWN_TAKEN
            _put(grid, length, i, j, B_UP)
        for k in range(nB):
            j = anchor + 1 + i - 2 * k
            if j < 0:
                return COOLDOWN_NEGATIVE
            _put(grid, length, i, j, B_DOWN)
    for i in range(p):
        owe_W = 0
        owe_w = 0
        last_w = -1
        for j in range(length[i]):
            if grid[i, j] == W_DOWN or grid[i, j] == W_UP:
                last_w = j
        for j in range(length[i]):
            c = grid[i, j]
            if c == B_DOWN:
                owe_W += 1
            elif c == B_UP:
                owe_w += 1
            elif c == W_DOWN:
                owe_W -= 1
            elif c == W_UP:
                owe_w -= 1
            elif c < 0 and j > last_w:
                if owe_W > 0:
                    grid[i, j] = W_DOWN
                    owe_W -= 1
                elif owe_w > 0:
                    grid[i, j] = W_UP
                    owe_w -= 1
        for _ in range(owe_W):
            _put(grid, length, i, length[i], W_DOWN)
        for _ in range(owe_w):
            _put(grid, length, i, length[i], W_UP)
    return COOLDOWN_OK

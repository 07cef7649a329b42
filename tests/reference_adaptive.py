"""Pure-Python references of the adaptive V scheduler's grid steps.

The package runs these steps in Numba (pipecore/kernels/adaptive.py, driven
by pipecore/schedules/adaptive_grid.py); tests/test_adaptive_kernels.py
checks that kernel and reference agree on random grids and on every grid
``_build`` passes. Rows are lists of letters (``FfBbWw``) with None for an
idle slot. The cool-down reference stays in the package
(``adaptive_grid._cooldown_rows_python``), since the package runs it when a
slot index goes negative.
"""

import math

from pipecore.schedules.adaptive_space import _LETTERS, _PERIOD, _with_w


def peaks_reference(rows):
    """Each row's peak of held chunk activations (+1 at a forward, -1 at a
    weight gradient, at least 0)."""
    out = []
    for row in rows:
        mem = peak = 0
        for c in row:
            if c is None:
                continue
            if c in "Ff":
                mem += 1
                if mem > peak:
                    peak = mem
            elif c in "Ww":
                mem -= 1
        out.append(peak)
    return out


def squeeze_reference(rows):
    """Each op as early as its device order and its cross-device input allow
    (one slot after the input's slot)."""
    p = len(rows)
    progs = [[c for c in row if c is not None] for row in rows]
    placed = [dict() for _ in range(p)]    # letter -> list of slots
    for i in range(p):
        for c in _LETTERS:
            placed[i][c] = []
    free = [0] * p
    ptr = [0] * p
    total = sum(len(x) for x in progs)
    done = 0
    while done < total:
        moved = False
        for i in range(p):
            prog = progs[i]
            k = ptr[i]
            while k < len(prog):
                c = prog[k]
                j = len(placed[i][c])
                ready = 0
                if c in "FB" and i > 0:
                    src = placed[i - 1][c]
                    if j >= len(src):
                        break
                    ready = src[j] + 1
                elif c in "fb" and i < p - 1:
                    src = placed[i + 1][c]
                    if j >= len(src):
                        break
                    ready = src[j] + 1
                t = max(ready, free[i])
                placed[i][c].append(t)
                free[i] = t + 1
                k += 1
                done += 1
                moved = True
            ptr[i] = k
        if not moved:
            return None  # a cross-device wait cycle: not a usable order
    length = max(free)
    out = [[None] * length for _ in range(p)]
    for i in range(p):
        for c, ts in placed[i].items():
            for t in ts:
                out[i][t] = c
    return out


def fill_gaps_reference(rows):
    """Pull a later op of the same device into each idle slot when its input
    is ready there and the device's peak does not rise (slot order, devices
    ascending within a slot)."""
    p = len(rows)
    peak = max(peaks_reference(rows))
    n = len(rows[0])
    last = [dict() for _ in range(p)]
    for i, row in enumerate(rows):
        for j, c in enumerate(row):
            if c is not None:
                last[i][c] = j
    count = [dict.fromkeys(_LETTERS, 0) for _ in range(p)]
    where = [{c: [] for c in _LETTERS} for _ in range(p)]
    mem = [0] * p
    for j in range(n):
        for i in range(p):
            row = rows[i]
            c = row[j]
            if c is not None:
                where[i][c].append(j)
                count[i][c] += 1
                mem[i] += 1 if c in "Ff" else (-1 if c in "Ww" else 0)
                continue
            wanted = {x for x, t in last[i].items() if t > j}
            rise = top = 0
            for k in range(j + 1, n):
                if not wanted:
                    break
                x = row[k]
                before = top
                if x is not None:
                    rise += 1 if x in "Ff" else (-1 if x in "Ww" else 0)
                top = max(top, rise)
                if x is None or x not in wanted:
                    continue
                wanted.discard(x)
                if x in "Ff" and mem[i] + before >= peak:
                    continue
                cnt = count[i][x]
                if not _ready(x, i, cnt, j, p, where, count):
                    continue
                row[j] = x
                row[k] = None
                where[i][x].append(j)
                count[i][x] = cnt + 1
                mem[i] += 1 if x in "Ff" else (-1 if x in "Ww" else 0)
                break
    return rows


def _ready(x, i, cnt, j, p, where, count):
    if x in "FB":
        if i > 0:
            src = where[i - 1][x]
            return cnt < len(src) and src[cnt] < j
        return x == "F" or count[i]["f"] > cnt
    if x in "fb":
        if i < p - 1:
            src = where[i + 1][x]
            return cnt < len(src) and src[cnt] < j
        return count[i]["F" if x == "f" else "B"] > cnt
    return count[i]["B" if x == "W" else "b"] > cnt


def relabel_w_reference(rows):
    """Weight gradients run oldest first, whichever chunk they belong to."""
    for row in rows:
        queue = []
        head = 0
        for j, c in enumerate(row):
            if c == "B":
                queue.append("W")
            elif c == "b":
                queue.append("w")
            elif c is not None and c in "Ww":
                if head >= len(queue):
                    return None
                row[j] = queue[head]
                head += 1
    return rows


def valid_reference(rows, m):
    """Every op m times, and each device's own dependencies in order (waits on
    other devices are checked when the order is timed)."""
    p = len(rows)
    for i, row in enumerate(rows):
        at = {c: [] for c in _LETTERS}
        for j, c in enumerate(row):
            if c is not None:
                at[c].append(j)
        if any(len(at[c]) != m for c in _LETTERS):
            return False
        for j in range(m):
            if at["B"][j] >= at["W"][j] or at["b"][j] >= at["w"][j]:
                return False
            if i == 0 and at["f"][j] >= at["B"][j]:
                return False
            if i == p - 1 and (at["F"][j] >= at["f"][j] or at["B"][j] >= at["b"][j]):
                return False
    return True


def span_reference(rows, f, b, w, c):
    """Longest device span (first forward start to last op end) with per-chunk
    costs f, b, w and a latency c on every hop between devices."""
    p = len(rows)
    dur = {"F": f, "f": f, "B": b, "b": b, "W": w, "w": w}
    progs = [[x for x in row if x is not None] for row in rows]
    end = [{x: [] for x in _LETTERS} for _ in range(p)]
    clock = [0.0] * p
    first = [None] * p
    ptr = [0] * p
    left = sum(len(x) for x in progs)
    while left:
        moved = False
        for i in range(p):
            prog = progs[i]
            k = ptr[i]
            while k < len(prog):
                x = prog[k]
                j = len(end[i][x])
                ready = 0.0
                if x in "FB" and i > 0:
                    src = end[i - 1][x]
                    if j >= len(src):
                        break
                    ready = src[j] + c
                elif x in "fb" and i < p - 1:
                    src = end[i + 1][x]
                    if j >= len(src):
                        break
                    ready = src[j] + c
                t = max(ready, clock[i])
                if first[i] is None:
                    first[i] = t
                clock[i] = t + dur[x]
                end[i][x].append(clock[i])
                k += 1
                left -= 1
                moved = True
            ptr[i] = k
        if not moved:
            return math.inf
    return max(clock[i] - first[i] for i in range(p))


def derive_reference(first, d0, d1, len0, p):
    """One block's rows as dicts from device 0's and the deltas, or None when
    a device's F, f, B, b collide (what ``adaptive_space._derive_slots``
    does on slot tuples)."""
    rows = [first]
    for i in range(p - 1):
        prev = rows[-1]
        delta = d0 if i < len0 else d1
        nxt = {"F": (prev["F"] + delta) % _PERIOD, "B": (prev["B"] + delta) % _PERIOD,
               "f": (prev["f"] - 1) % _PERIOD, "b": (prev["b"] - 1) % _PERIOD}
        if len(set(nxt.values())) < 4:
            return None
        rows.append(_with_w(nxt))
    return tuple(rows)

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

A building block gives each device the slot (0-5) of each op inside a period
of 6 slots. Device 0's slots are enumerated (F at 0; f, B, b on distinct
slots; each weight gradient in the first free slot after its backward), and
device d+1's follow from device d's by an offset: ops going down move by
delta, ops going up by -1 (one slot earlier, so they run one slot after the
device below). The first ``len0`` steps use delta0, the rest delta1 <= delta0.

Each block is laid out on a slot grid (the block repeated every 6 slots,
with a first microbatch placed along its dependency chain), squeezed, and its
warm-up and cool-down are rebuilt from the peak memory P the steady phase
needs (before the first ``B`` device d holds min(d+1, P//2) ``f`` and
P - that many ``F``; after the last ``f`` it keeps (P+1)//2 ``b`` and
min(d+1, P - that) ``B`` for the tail); finally idle slots are filled with
later ops when that keeps the peak and the dependencies. Memory is counted in
chunk activations (+1 at a forward, -1 at a weight gradient; a ``B`` frees
nothing). Candidates whose peak exceeds the limit are dropped; the survivors
are timed with the real per-chunk costs and the one with the shortest longest
device span wins.

Pruning (the authors' search runs every block, minutes per point at p=16):
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
from ..core.schedule import Schedule, _check_int
from ..kernels import adaptive as _kernels

__all__ = ["adaptive_v", "adaptive_blocks"]

_PERIOD = 6
_LETTERS = "FfBbWw"


# ---------------------------------------------------------------------------
# blocks
# ---------------------------------------------------------------------------

def _with_w(slots):
    """Put W after B and w after b, each in the first free slot (cyclic)."""
    slots = dict(slots)
    taken = set(slots.values())
    for back, wg in (("B", "W"), ("b", "w")):
        t = slots[back]
        for k in range(1, _PERIOD + 1):
            pos = (t + k) % _PERIOD
            if pos not in taken:
                slots[wg] = pos
                taken.add(pos)
                break
    return slots


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
    p = _check_int("devices", devices, minimum=2)
    return list(_blocks(p))


def _blocks(p):
    # Rows as (F, f, B, b, W, w) slot tuples while searching (a dict per row
    # of every candidate took seconds at p=32); dicts only for the blocks kept.
    seen = set()
    for f1 in range(1, _PERIOD):
        for b1 in range(1, _PERIOD):
            for bb1 in range(1, _PERIOD):
                if len({f1, b1, bb1}) < 3:
                    continue
                first = _with_w_slots(0, f1, b1, bb1)
                for d0 in range(1, _PERIOD):
                    for d1 in range(1, d0 + 1):
                        # With one delta the split point does not matter.
                        for len0 in (range(1, p) if d1 < d0 else (p - 1,)):
                            key = _derive_slots(first, d0, d1, len0, p)
                            if key is None or key in seen:
                                continue
                            seen.add(key)
                            # The dicts' key order is _derive's: F f B b W w on
                            # device 0, F B f b W w below.
                            yield (dict(zip(_LETTERS, key[0])),) + tuple(
                                {"F": r[0], "B": r[2], "f": r[1], "b": r[3], "W": r[4], "w": r[5]}
                                for r in key[1:])


_W_SLOTS: dict = {}


def _with_w_slots(F, f, B, b):
    """:func:`_with_w` on slots as a tuple (F, f, B, b, W, w), memoised."""
    key = (F, f, B, b)
    got = _W_SLOTS.get(key)
    if got is None:
        # Only B and b matter for W and w here; the input key order is _with_w's.
        slots = _with_w({"F": F, "f": f, "B": B, "b": b})
        got = _W_SLOTS[key] = tuple(slots[c] for c in _LETTERS)
    return got


def _derive_slots(first, d0, d1, len0, p):
    """:func:`_derive` on slot tuples: the block's rows, or None."""
    rows = [first]
    prev = first
    for i in range(p - 1):
        delta = d0 if i < len0 else d1
        F = (prev[0] + delta) % _PERIOD
        B = (prev[2] + delta) % _PERIOD
        f = (prev[1] - 1) % _PERIOD
        b = (prev[3] - 1) % _PERIOD
        if F == B or F == f or F == b or B == f or B == b or f == b:
            return None
        prev = _with_w_slots(F, f, B, b)
        rows.append(prev)
    return tuple(rows)


def _derive(first, d0, d1, len0, p):
    """One block's rows as dicts from device 0's and the deltas, or None when
    a device's F, f, B, b collide (the reference of :func:`_derive_slots`)."""
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


def _chain(blk):
    """Absolute slots of microbatch 0's ops on each device (first copy at or
    after slot 6), following F down, f up, B down, b up, each op the first
    copy after the one it waits for; W/w the first copy after their B/b."""
    p = len(blk)
    pos = [dict() for _ in range(p)]
    t = _PERIOD

    def first_at(row, letter, t):
        return t + (row[letter] - t) % _PERIOD

    for letter, order in (("F", range(p)), ("f", range(p - 1, -1, -1)),
                          ("B", range(p)), ("b", range(p - 1, -1, -1))):
        for i in order:
            t = first_at(blk[i], letter, t)
            pos[i][letter] = t
            t += 1
            if letter in "Bb":
                wg = "W" if letter == "B" else "w"
                pos[i][wg] = first_at(blk[i], wg, t)
    return pos


def _steady_peak(chain):
    """Peak chunk activations of the repeated block, from lifespans alone."""
    best = 0
    for pos in chain:
        cnt = [0] * _PERIOD
        for start, end in ((pos["F"], pos["w"]), (pos["f"], pos["W"])):
            # Alive in slots [start, end), one copy every 6 slots: count the
            # copies alive at a slot of each residue r.
            span = end - start
            for r in range(_PERIOD):
                lo = (r - start) % _PERIOD
                cnt[r] += 0 if lo >= span else (span - lo - 1) // _PERIOD + 1
        best = max(best, max(cnt))
    return best


# ---------------------------------------------------------------------------
# the slot grid
# ---------------------------------------------------------------------------

def _peaks(rows):
    """Each row's peak of held chunk activations; :func:`_peaks_reference` in Numba."""
    return _kernels.peaks(*_flat(rows)).tolist()


def _peaks_reference(rows):
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


def _layout(blk, chain, mb):
    """The block repeated for ``mb`` microbatches, microbatch 0 on ``chain``."""
    p = len(blk)
    length = max(max(pos.values()) for pos in chain) + _PERIOD * mb + 1
    grid = np.full((p, length), -1, dtype=np.int8)
    for i in range(p):
        for letter, t0 in chain[i].items():
            grid[i, t0:t0 + _PERIOD * mb:_PERIOD] = _CODE_OF[ord(letter)]
    return _rows(grid.reshape(-1), np.arange(p + 1, dtype=np.int64) * length)


# Letters to the kernels' codes (None, an idle slot, becomes '.' then -1).
_TO_CHAR = {None: ".", **{c: c for c in _LETTERS}}
_FROM_CHAR = {".": None, **{c: c for c in _LETTERS}}
_LETTER_BYTES = np.frombuffer(_LETTERS.encode("ascii"), dtype=np.uint8)
_CODE_OF = np.full(128, -1, dtype=np.int8)
for _i, _c in enumerate(_LETTERS):
    _CODE_OF[ord(_c)] = _i


def _encode(rows):
    """Each row's letters as one flat int8 array of codes, and row offsets
    (map and join run in C: the grids have thousands of slots per row)."""
    lines = ["".join(map(_TO_CHAR.__getitem__, row)) for row in rows]
    codes = _CODE_OF[np.frombuffer("".join(lines).encode("ascii"), dtype=np.uint8)]
    # Row offsets among the ops (idle slots dropped).
    ptr = np.zeros(len(rows) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(line) - line.count(".") for line in lines])
    return np.ascontiguousarray(codes[codes >= 0]), ptr


def _flat(rows):
    """All rows as one flat int8 array of codes, idle slots -1, and row
    offsets: ``codes[ptr[i]:ptr[i + 1]]`` is row i, slot for slot."""
    lines = ["".join(map(_TO_CHAR.__getitem__, row)) for row in rows]
    codes = _CODE_OF[np.frombuffer("".join(lines).encode("ascii"), dtype=np.uint8)]
    ptr = np.zeros(len(rows) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(line) for line in lines])
    return np.ascontiguousarray(codes), ptr


def _rows(codes, ptr):
    """The rows of letters (None idle) that :func:`_flat` encoded."""
    chars = np.where(codes >= 0, _LETTER_BYTES[np.maximum(codes, 0)], ord("."))
    text = chars.astype(np.uint8).tobytes().decode("ascii")
    return [list(map(_FROM_CHAR.__getitem__, text[a:b])) for a, b in zip(ptr[:-1], ptr[1:])]


def _squeeze(rows):
    """Each op as early as its device order and its cross-device input allow
    (one slot after the input's slot); :func:`_squeeze_reference` in Numba."""
    codes, ptr = _encode(rows)
    ok, start = _kernels.list_starts(codes, ptr, np.ones(6), 0.0)
    slot = start.astype(np.int64)
    if not ok:
        return None  # a cross-device wait cycle: not a usable order
    length = int(slot.max()) + 1 if slot.size else 0
    out = []
    for i in range(len(rows)):
        line = np.full(length, ord("."), dtype=np.uint8)
        a, b = ptr[i], ptr[i + 1]
        line[slot[a:b]] = _LETTER_BYTES[codes[a:b]]
        out.append(list(map(_FROM_CHAR.__getitem__, line.tobytes().decode("ascii"))))
    return out


def _squeeze_reference(rows):
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


def _rebuild_warmup(rows, mb):
    p = len(rows)
    P = min(max(_peaks(rows)), 2 * p)
    for i in range(p):
        row = rows[i]
        seen = dict.fromkeys("FfBW", 0)
        for j, c in enumerate(row):
            if c == "b":
                break
            if c is not None:
                seen[c] += 1
                row[j] = None
        want_f = min(i + 1, P // 2, mb)
        want_F = min(P - want_f, mb)
        # One letter per slot from slot i (None leaves the slot idle); a
        # letter is written only while its count is below both caps.
        plan = [("F", want_F)] * (2 * (p - 1 - i))
        plan += [("F", want_F), ("f", want_f)] * (i + 1)
        _write(row, i, plan, seen, dict.fromkeys("FfBW", 0))
    return rows


def _write(row, j, plan, seen, used):
    for letter, cap in plan:
        if used[letter] < cap and used[letter] < seen[letter]:
            _set(row, j, letter)
            used[letter] += 1
        j += 1
    # Then B, W and a forward (f first) in turn until everything is back.
    while any(used[c] < seen[c] for c in "FfBW"):
        fwd = "f" if used["f"] < seen["f"] else "F"
        for letter in ("B", "W", fwd):
            if used[letter] < seen[letter]:
                _set(row, j, letter)
                used[letter] += 1
            j += 1


def _set(row, j, letter):
    if j >= len(row):
        row.extend([None] * (j + 1 - len(row)))
    row[j] = letter


def _pad(rows):
    n = max(len(r) for r in rows)
    for r in rows:
        r.extend([None] * (n - len(r)))
    return rows


def _truncate(rows, m):
    for row in rows:
        cnt = dict.fromkeys(_LETTERS, 0)
        for j, c in enumerate(row):
            if c is None:
                continue
            if cnt[c] >= m:
                row[j] = None
            else:
                cnt[c] += 1
    return rows


def _release_w(rows, P):
    """Few microbatches: delay the first weight gradients of devices whose
    peak is below P, so their warm-up is not held back by memory it has."""
    peaks = _peaks(rows)
    low = min(peaks)
    for i, row in enumerate(rows):
        moved = []
        for j, c in enumerate(row):
            if peaks[i] + len(moved) >= P:
                break
            if c is not None and c in "Ww":
                moved.append(c)
                row[j] = None
        row.extend(moved + [None] * (P - low - len(moved)))
    return rows


def _rebuild_cooldown(rows, m):
    rows = _cooldown_rows(rows, m)
    return None if rows is None else _squeeze(_pad(rows))


def _cooldown_rows(rows, m):
    """Rebuild the cool-down (see the module docstring): the tail backwards
    packed along the pipeline, weight gradients after them; rows (ragged)
    or None; :func:`_cooldown_rows_reference` in Numba."""
    codes, ptr = _flat(rows)
    length = np.diff(ptr)
    width = int(length.max(initial=0))
    # Room for the tail (anchor + 2p at most) and the owed weight gradients.
    grid = np.full((len(rows), 2 * width + 4 * len(rows) + 4), -1, dtype=np.int8)
    for i in range(len(rows)):
        grid[i, :length[i]] = codes[ptr[i]:ptr[i + 1]]
    status = _kernels.cooldown_rows(grid, length, m)
    if status == 1:
        return None
    if status == 2:
        return _cooldown_rows_reference([list(r) for r in rows], m)
    out = np.concatenate([grid[i, :length[i]] for i in range(len(rows))])
    ptr = np.zeros(len(rows) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum(length)
    return _rows(out, ptr)


def _cooldown_rows_reference(rows, m):
    """Rebuild the cool-down in place: rows (ragged) or None."""
    p = len(rows)
    P = max(_peaks(rows))
    keep_b = min((P + 1) // 2, m)
    keep_B = min(P - keep_b, m)
    anchor = -1
    for i in range(p):
        row = rows[i]
        nB = nb = nW = nw = 0
        last_f = -1
        for j in range(len(row) - 1, -1, -1):
            c = row[j]
            if c == "f" and last_f < 0:
                last_f = j
            if c == "B" and nB < i + 1 and nB < keep_B:
                row[j] = None
                nB += 1
            if c == "b" and nb < keep_b:
                row[j] = None
                nb += 1
        for j in range(len(row) - 1, -1, -1):
            if nW >= nB and nw >= nb and nW + nw >= P:
                break
            if row[j] == "W":
                row[j] = None
                nW += 1
            elif row[j] == "w":
                row[j] = None
                nw += 1
        if i == 0:
            anchor = last_f
        # Tail backwards packed tightly along the pipeline.
        for k in range(nb):
            j = anchor - i + 2 * p - 2 * k
            if j < len(row) and row[j] is not None:
                return None
            _set(row, j, "b")
        for k in range(nB):
            _set(row, anchor + 1 + i - 2 * k, "B")
    for row in rows:
        owe = dict.fromkeys("Ww", 0)
        last_w = max((j for j, c in enumerate(row) if c is not None and c in "Ww"), default=-1)
        for j, c in enumerate(row):
            if c == "B":
                owe["W"] += 1
            elif c == "b":
                owe["w"] += 1
            elif c == "W":
                owe["W"] -= 1
            elif c == "w":
                owe["w"] -= 1
            elif c is None and j > last_w:
                if owe["W"] > 0:
                    row[j] = "W"
                    owe["W"] -= 1
                elif owe["w"] > 0:
                    row[j] = "w"
                    owe["w"] -= 1
        row.extend(["W"] * owe["W"] + ["w"] * owe["w"])
    return rows


def _fill_gaps(rows):
    """Pull a later op of the same device into each idle slot when its input
    is ready there and the device's peak does not rise (slot order, devices
    ascending within a slot); :func:`_fill_gaps_reference` in Numba."""
    n = len(rows[0]) if rows else 0
    if any(len(row) != n for row in rows):
        return _fill_gaps_reference(rows)  # ragged rows: the reference's own rules
    codes = _CODE_OF[np.frombuffer("".join(
        "".join(map(_TO_CHAR.__getitem__, row)) for row in rows).encode("ascii"),
        dtype=np.uint8)].reshape(len(rows), n)
    grid = _kernels.fill_gaps(np.ascontiguousarray(codes))
    chars = np.where(grid >= 0, _LETTER_BYTES[np.maximum(grid, 0)], ord("."))
    return [list(map(_FROM_CHAR.__getitem__, line.tobytes().decode("ascii")))
            for line in chars.astype(np.uint8)]


def _fill_gaps_reference(rows):
    """Pull a later op of the same device into each idle slot when its input
    is ready there and the device's peak does not rise (slot order, devices
    ascending within a slot)."""
    p = len(rows)
    peak = max(_peaks(rows))
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


def _relabel_w(rows):
    """Weight gradients run oldest first, whichever chunk they belong to;
    in place; :func:`_relabel_w_reference` in Numba."""
    codes, ptr = _flat(rows)
    if not _kernels.relabel_w(codes, ptr):
        return None
    for row, new in zip(rows, _rows(codes, ptr)):
        row[:] = new
    return rows


def _relabel_w_reference(rows):
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


def _valid(rows, m):
    """Every op m times, and each device's own dependencies in order;
    :func:`_valid_reference` in Numba."""
    return bool(_kernels.valid(*_flat(rows), m))


def _valid_reference(rows, m):
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


def _build(blk, chain, m, limit_units):
    """Run one block through the pipeline; (rows, peak) or None."""
    p = len(blk)
    mb = max(m, 2 * p)  # spare microbatches keep the warm-up rules well defined
    rows = _layout(blk, chain, mb)
    first = max(_peaks(rows))
    if first > 2 * p or (mb == m and first > limit_units):
        return None
    rows = _squeeze(rows)
    if rows is None:
        return None
    rows = _squeeze(_pad(_rebuild_warmup(rows, mb)))
    if rows is None:
        return None
    peak = max(_peaks(rows))
    if peak > first:
        return None
    ceiling = first
    if m < mb:
        rows = _truncate(rows, m)
        if m <= p and 2 * m <= limit_units:
            rows = _release_w(rows, min(2 * p, peak))
        rows = _squeeze(_pad(rows))
        if rows is None:
            return None
        ceiling = peak = max(_peaks(rows))
        if peak > limit_units:
            return None
    rows = _rebuild_cooldown(rows, m)
    if rows is None:
        return None
    rows = _relabel_w(_fill_gaps(rows))
    if rows is None:
        return None
    peak = max(_peaks(rows))
    if peak > ceiling or peak > limit_units or not _valid(rows, m):
        return None
    return rows, peak


def _span(rows, f, b, w, c):
    """Longest device span (first forward start to last op end) with per-chunk
    costs f, b, w and a latency c on every hop between devices;
    :func:`_span_reference` in Numba."""
    codes, ptr = _encode(rows)
    if len(rows) == 0:
        return _span_reference(rows, f, b, w, c)
    dur = np.array([f, f, b, b, w, w], dtype=np.float64)
    ok, start = _kernels.list_starts(codes, ptr, dur, float(c))
    if not ok:
        return math.inf
    # A device's span: its first op's start to its last op's end.
    spans = [start[b - 1] + dur[codes[b - 1]] - start[a]
             for a, b in zip(ptr[:-1], ptr[1:]) if b > a]
    return float(max(spans))


def _span_reference(rows, f, b, w, c):
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


def _programs(rows):
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


# ---------------------------------------------------------------------------
# search
# ---------------------------------------------------------------------------

_BLOCK_CACHE: OrderedDict = OrderedDict()
_RESULT_CACHE: OrderedDict = OrderedDict()
_CACHE_SIZE = 64


def _cached(cache, key, make):
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
    p = _check_int("devices", devices, minimum=2)
    m = _check_int("microbatches", microbatches, minimum=1)
    costs = Costs() if costs is None else costs
    if not isinstance(costs, Costs):
        raise InputError(f"'costs' must be a pipecore.Costs (got {type(costs).__name__})")
    if max_blocks is not None:
        max_blocks = _check_int("max_blocks", max_blocks, minimum=1)
    levels = _check_int("levels", levels, minimum=1)
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

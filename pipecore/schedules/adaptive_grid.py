"""The slot grids of the adaptive V search: one block laid out, squeezed and rebuilt.

A grid is a list of rows, one per device, each a list of slots holding an
op letter (``FfBbWw``, see :mod:`pipecore.schedules.adaptive`) or None for
an idle slot. :func:`_build` runs one block through these steps:

1. lay the block out for the microbatches (repeated every 6 slots, with
   microbatch 0 placed along its dependency chain) and squeeze it (each op
   as early as its device order and its inputs allow);
2. rebuild the warm-up from the peak memory P the steady phase needs:
   before the first ``b`` device d holds min(d+1, P//2) ``f`` and P - that
   many ``F``;
3. with fewer microbatches than the grid was built for, cut it back;
4. rebuild the cool-down: after the last ``f`` device d keeps (P+1)//2
   ``b`` and min(d+1, P - that) ``B`` for the tail, packed along the
   pipeline, weight gradients after them;
5. fill idle slots with later ops when that keeps the peak and the
   dependencies, and let weight gradients run oldest first.

Memory is counted in chunk activations (+1 at a forward, -1 at a weight
gradient; a ``B`` frees nothing). :func:`_span` times a grid with the real
per-chunk costs. The kernels (:mod:`pipecore.kernels.adaptive`) take the
rows as flat arrays of letter codes (:func:`_flat`, :func:`_encode`).
"""

from __future__ import annotations

import math

import numpy as np

from ..kernels import adaptive as _kernels
from ..kernels.adaptive import IDLE, N_LETTERS
from ..kernels.adaptive import LETTERS as _LETTERS
from .adaptive_space import _PERIOD

# Letters to the kernels' codes (None, an idle slot, becomes '.' then IDLE).
_TO_CHAR = {None: ".", **{c: c for c in _LETTERS}}
_FROM_CHAR = {".": None, **{c: c for c in _LETTERS}}
_LETTER_BYTES = np.frombuffer(_LETTERS.encode("ascii"), dtype=np.uint8)
_CODE_OF = np.full(128, IDLE, dtype=np.int8)
for _i, _c in enumerate(_LETTERS):
    _CODE_OF[ord(_c)] = _i


def _lines(rows):
    """Each row as a string, ``.`` for an idle slot (map and join run in C:
    the grids have thousands of slots per row)."""
    return ["".join(map(_TO_CHAR.__getitem__, row)) for row in rows]


def _codes(lines):
    """The letters of ``lines`` one after the other, as int8 codes (IDLE for ``.``)."""
    return _CODE_OF[np.frombuffer("".join(lines).encode("ascii"), dtype=np.uint8)]


def _flat(rows):
    """All rows as one flat int8 array of codes, idle slots IDLE, and row
    offsets: ``codes[ptr[i]:ptr[i + 1]]`` is row i, slot for slot."""
    lines = _lines(rows)
    ptr = np.zeros(len(rows) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum([len(line) for line in lines])
    return np.ascontiguousarray(_codes(lines)), ptr


def _encode(rows):
    """Each row's ops (idle slots dropped) as one flat int8 array of codes,
    and row offsets: ``codes[ptr[i]:ptr[i + 1]]`` is row i's program."""
    codes, ptr = _flat(rows)
    is_op = codes >= 0
    ops_before = np.zeros(codes.size + 1, dtype=np.int64)  # ops before each slot
    ops_before[1:] = np.cumsum(is_op)
    return np.ascontiguousarray(codes[is_op]), ops_before[ptr]


def _rows(codes, ptr):
    """The rows of letters (None idle) that :func:`_flat` encoded, or those of
    a 2-D grid of codes flattened with ``ptr = arange(p + 1) * width``."""
    chars = np.where(codes >= 0, _LETTER_BYTES[np.maximum(codes, 0)], ord("."))
    text = chars.astype(np.uint8).tobytes().decode("ascii")
    return [list(map(_FROM_CHAR.__getitem__, text[a:b])) for a, b in zip(ptr[:-1], ptr[1:])]


def _peaks(rows):
    """Each row's peak of held chunk activations (+1 at a forward, -1 at a
    weight gradient, at least 0)."""
    return _kernels.peaks(*_flat(rows)).tolist()


def _layout(blk, chain, mb):
    """The block repeated for ``mb`` microbatches, microbatch 0 on ``chain``."""
    p = len(blk)
    length = max(max(pos.values()) for pos in chain) + _PERIOD * mb + 1
    grid = np.full((p, length), IDLE, dtype=np.int8)
    for i in range(p):
        for letter, t0 in chain[i].items():
            grid[i, t0:t0 + _PERIOD * mb:_PERIOD] = _CODE_OF[ord(letter)]
    return _grid_rows(grid)


def _grid_rows(grid):
    """The rows of letters (None idle) of a 2-D grid of codes."""
    p, width = grid.shape
    return _rows(grid.reshape(-1), np.arange(p + 1, dtype=np.int64) * width)


def _squeeze(rows):
    """Each op as early as its device order and its cross-device input allow
    (one slot after the input's slot): the list schedule with every op one
    slot long and no hop latency."""
    codes, ptr = _encode(rows)
    ok, start = _kernels.list_starts(codes, ptr, np.ones(N_LETTERS), 0.0)
    slot = start.astype(np.int64)
    if not ok:
        return None  # a cross-device wait cycle: not a usable order
    length = int(slot.max()) + 1 if slot.size else 0
    grid = np.full((len(rows), length), IDLE, dtype=np.int8)
    for i in range(len(rows)):
        a, b = ptr[i], ptr[i + 1]
        grid[i, slot[a:b]] = codes[a:b]
    return _grid_rows(grid)


def _rebuild_warmup(rows, mb):
    """Rebuild each device's warm-up (everything before its first ``b``) from
    the peak P the grid needs (see the module docstring); in place, rows
    may grow ragged."""
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
    """Write the warm-up ``plan`` into ``row`` from slot j, then the rest of
    the ops taken out (counts ``seen``) in turns of B, W and a forward."""
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
    """``row[j] = letter``, growing the row with idle slots when j is past its end."""
    if j >= len(row):
        row.extend([None] * (j + 1 - len(row)))
    row[j] = letter


def _pad(rows):
    """Pad ragged rows with idle slots to one length; in place."""
    n = max(len(r) for r in rows)
    for r in rows:
        r.extend([None] * (n - len(r)))
    return rows


def _truncate(rows, m):
    """Keep the first m of each letter on each row (a grid built for spare
    microbatches cut back to m); the rest become idle slots."""
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
    """:func:`_cooldown_rows`, then squeezed; None when no schedule results."""
    rows = _cooldown_rows(rows, m)
    return None if rows is None else _squeeze(_pad(rows))


def _cooldown_rows(rows, m):
    """Rebuild the cool-down (see the module docstring): the tail backwards
    packed along the pipeline, weight gradients after them; rows (ragged)
    or None. The kernel does the work; a slot index that goes negative
    (possible only on grids :func:`_build` does not produce) takes
    :func:`_cooldown_rows_python`, whose Python indexing defines the result."""
    codes, ptr = _flat(rows)
    length = np.diff(ptr)
    width = int(length.max(initial=0))
    # Room for the tail (anchor + 2p at most) and the owed weight gradients.
    grid = np.full((len(rows), 2 * width + 4 * len(rows) + 4), -1, dtype=np.int8)
    for i in range(len(rows)):
        grid[i, :length[i]] = codes[ptr[i]:ptr[i + 1]]
    status = _kernels.cooldown_rows(grid, length, m)
    if status == _kernels.COOLDOWN_TAKEN:
        return None
    if status == _kernels.COOLDOWN_NEGATIVE:
        return _cooldown_rows_python([list(r) for r in rows], m)
    out = np.concatenate([grid[i, :length[i]] for i in range(len(rows))])
    ptr = np.zeros(len(rows) + 1, dtype=np.int64)
    ptr[1:] = np.cumsum(length)
    return _rows(out, ptr)


def _cooldown_rows_python(rows, m):
    """:func:`_cooldown_rows` in plain Python, in place: rows (ragged) or None.

    The run-time path when a slot index goes negative, where a negative
    index writes from the row's end (kept so that the result is defined on
    every grid), and the definition the kernel is tested against.
    """
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
    ascending within a slot). The rows must have one length, as
    :func:`_squeeze` returns them."""
    n = len(rows[0]) if rows else 0
    if any(len(row) != n for row in rows):
        raise ValueError("internal error: _fill_gaps needs rows of one length")
    codes = _codes(_lines(rows)).reshape(len(rows), n)
    return _grid_rows(_kernels.fill_gaps(np.ascontiguousarray(codes)))


def _relabel_w(rows):
    """Weight gradients run oldest first, whichever chunk they belong to;
    in place; None when a row has a weight gradient before any backward
    left to pair it with."""
    codes, ptr = _flat(rows)
    if not _kernels.relabel_w(codes, ptr):
        return None
    for row, new in zip(rows, _rows(codes, ptr)):
        row[:] = new
    return rows


def _valid(rows, m):
    """Every op m times, and each device's own dependencies in order (waits on
    other devices are checked when the order is timed)."""
    return bool(_kernels.valid(*_flat(rows), m))


def _build(blk, chain, m, limit_units):
    """Run one block through the steps of the module docstring: (rows, peak)
    of the schedule, or None when a step fails or the peak exceeds
    ``limit_units`` chunk activations."""
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
    costs f, b, w and a latency c on every hop between devices; inf when
    the rows wait on each other in a cycle."""
    codes, ptr = _encode(rows)
    dur = np.array([f, f, b, b, w, w], dtype=np.float64)
    ok, start = _kernels.list_starts(codes, ptr, dur, float(c))
    if not ok:
        return math.inf
    # A device's span: its first op's start to its last op's end.
    spans = [start[b - 1] + dur[codes[b - 1]] - start[a]
             for a, b in zip(ptr[:-1], ptr[1:]) if b > a]
    return float(max(spans))

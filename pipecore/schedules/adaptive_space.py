"""The space of V building blocks that the adaptive V search runs through.

A building block gives each device the slot (0-5) of each of its six unit
ops (letters ``FfBbWw``, see :mod:`pipecore.schedules.adaptive`) inside a
period of 6 slots. Device 0's slots are enumerated (F at 0; f, B, b on
distinct slots; each weight gradient in the first free slot after its
backward), and device d+1's follow from device d's by an offset: ops going
down move by delta, ops going up by -1 (one slot earlier, so they run one
slot after the device below). The first ``len0`` steps use delta0, the rest
delta1 <= delta0.

Before anything is laid out, :func:`_chain` places microbatch 0 along its
dependency chain and :func:`_steady_peak` counts the activations the
repeated block holds, which is what the search ranks blocks by.
"""

from __future__ import annotations

from ..kernels.adaptive import LETTERS as _LETTERS

# Slots in one period of a block: one for each of a microbatch's six ops.
_PERIOD = 6


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


def _blocks(p):
    """Every distinct block for p devices, in enumeration order (see the
    module docstring); each a tuple of p dicts, letter -> slot."""
    # Rows as (F, f, B, b, W, w) slot tuples while searching (cheap to build,
    # hash and compare for the many candidates); dicts only for the blocks kept.
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
                            # The dicts' key order (adaptive_blocks returns
                            # them): F f B b W w on device 0, F B f b W w below.
                            yield (dict(zip(_LETTERS, key[0])),) + tuple(
                                {"F": r[0], "B": r[2], "f": r[1], "b": r[3], "W": r[4], "w": r[5]}
                                for r in key[1:])


# _with_w_slots's memo: (F, f, B, b) -> the six slots.
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
    """One block's rows as slot tuples (F, f, B, b, W, w), from device 0's
    row ``first`` and the deltas (see the module docstring), or None when a
    device's F, f, B, b collide."""
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

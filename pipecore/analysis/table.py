"""The idealised view: a devices x time-slots grid at unit op times."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.ops import CapacityError, InputError
from ..core.schedule import Schedule, op_label, refuse_factors
from ..core.simulate import _deadlock_error

__all__ = ["IdealTable", "ideal_table"]


@dataclass(frozen=True)
class IdealTable:
    """A devices x slots grid; each cell holds an op row index or -1 (idle).

    Attributes
    ----------
    schedule : Schedule
    grid : numpy.ndarray
        Shape (devices, length), int64.
    slots : dict
        Slots each kind takes (F, B, W, BW, R).
    """

    schedule: Schedule
    grid: np.ndarray
    slots: dict

    @property
    def length(self) -> int:
        """int: number of time slots (the makespan at unit op times)."""
        return int(self.grid.shape[1])

    @property
    def idle(self) -> np.ndarray:
        """numpy.ndarray: idle slots per device."""
        return (self.grid < 0).sum(axis=1)

    def render(self, max_slots: int | None = None, width: int | None = None) -> str:
        """The grid as text, one row per device, ``.`` for idle.

        Parameters
        ----------
        max_slots : int, optional
            Show only the first ``max_slots`` slots.
        width : int, optional
            Columns a line may take: a grid wider than that is cut into
            panels of consecutive slots, one under the other, each headed
            by its slot range. By default one panel, however wide.

        Returns
        -------
        str
            One line per device (per panel), each cell one op's label.

        Raises
        ------
        ValueError
            If ``width`` leaves no room for one slot beside the device label.
        """
        s = self.schedule
        kinds = s.kind_codes
        stage = s._column("stage")
        mb = s._column("microbatch")
        labels = np.array([op_label(kinds[i], stage[i], mb[i]) for i in range(s.num_ops)],
                          dtype=object)
        paired = s._info().paired
        for i in np.flatnonzero(paired):
            labels[i - 1] = labels[i - 1] + "&" + labels[i]  # an overlapped F&B unit
        cell = max((len(x) for x in labels), default=1)
        grid = self.grid if max_slots is None else self.grid[:, :max_slots]
        slots = grid.shape[1]
        prefix = 6  # "d123| "
        per = slots if width is None else (width - prefix + 1) // (cell + 1)
        if per < 1:
            raise InputError(f"'width' must leave room for one slot of {cell} characters after "
                             f"the device label (got width={width})")
        lines = []
        for first in range(0, max(slots, 1), max(per, 1)):
            part = grid[:, first:first + per]
            if per < slots:
                lines.append(f"slots {first}-{first + part.shape[1] - 1}:")
            for d in range(grid.shape[0]):
                cells = [labels[c].rjust(cell) if c >= 0 else ".".rjust(cell) for c in part[d]]
                lines.append(f"d{d:<3}| " + " ".join(cells))
        if max_slots is not None and self.length > max_slots:
            lines.append(f"... {self.length - max_slots} more slots")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()


def _producers_of(unit_ops, where, stages):
    """What a unit waits for: the (kind, stage, microbatch) keys it needs."""
    need = []
    for kind, stage, mb in unit_ops:
        if kind == "F":
            if stage > 0:
                need.append(("F", stage - 1, mb))
        elif kind in ("R", "O"):
            need.append(("F", stage, mb))
        elif kind == "L":
            need.append(("O", stage, mb))
        elif kind in ("B", "BW"):
            # A recomputed backward needs its R, an offloaded one its L.
            rec, load = ("R", stage, mb), ("L", stage, mb)
            need.append(load if load in where else rec if rec in where else ("F", stage, mb))
            if stage < stages - 1:
                nxt = ("B", stage + 1, mb)
                need.append(nxt if nxt in where else ("BW", stage + 1, mb))
        elif kind == "W":
            need.append(("B", stage, mb))
    own = {(k, s, mb) for k, s, mb in unit_ops}
    return [key for key in need if key not in own]


#: Bytes per op of the slot-by-slot pass (its Python lists and dicts), rounded up from a
#: reading of 1f1b at p=256, m=2048.
BYTES_PER_OP = 500


#: Ops above which :func:`ideal_table` refuses unless told otherwise: its pass is pure
#: Python, one op at a time: minutes at this size.
MAX_OPS = 4_000_000


def ideal_table(schedule: Schedule, f: int = 1, b: int = 1, w: int = 1,
                r: int | None = None, max_ops: int | None = MAX_OPS) -> IdealTable:
    """Place every op in integer time slots, with no communication.

    Every op of kind F takes ``f`` slots whatever its chunk, B ``b``, W
    ``w``, a fused BW ``b + w``, a recompute R ``r``, an overlapped F&B
    unit the sum of its two ops, an all-reduce, an offload (O) and a load
    (L) none: host copies, like all communication, are free here. Time
    advances one slot at a time: in each slot every idle device starts its
    next unit if everything it needs finished by then. This is the tabular
    abstraction of a schedule, worked out slot by slot on its own (not with
    the simulation kernel), so comparing its length with the simulated
    makespan at unit costs is a real cross-check.

    Parameters
    ----------
    schedule : Schedule
    f, b, w : int
        Slots per op kind (>= 1 for f and b, >= 0 for w).
    r : int, optional
        Slots of an R op (>= 0); defaults to ``f``.
    max_ops : int or None, default 4,000,000
        Refuse a schedule with more ops (the pass is pure Python, one op at
        a time, and holds about 500 bytes per op); None lifts the cap, and
        the available memory still bounds it.

    Returns
    -------
    IdealTable

    Raises
    ------
    ValueError
        If a slot count is not a non-negative int (f and b must be >= 1), or
        the schedule has more than ``max_ops`` ops.
    ScheduleError
        If the schedule deadlocks (no device can ever start its next unit).
    MemoryError
        If the table needs more memory than the machine has available (the
        message gives both sizes), before any of it is allocated.
    """
    refuse_factors(schedule, "the ideal table (integer slots per op kind)")
    r = f if r is None else r
    for name, value, low in (("f", f, 1), ("b", b, 1), ("w", w, 0), ("r", r, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise InputError(f"'{name}' must be an int >= {low} (got {value!r})")
    slots = {"F": f, "B": b, "W": w, "BW": b + w, "AR": 0, "R": r, "O": 0, "L": 0}
    if max_ops is not None and schedule.num_ops > max_ops:
        raise InputError(
            f"ideal_table of {schedule.name!r}: {schedule.num_ops:,} ops is above "
            f"max_ops={max_ops:,}. The table is worked out slot by slot in pure Python (an "
            f"independent check of the simulator) and would hold about "
            f"{schedule.num_ops * BYTES_PER_OP / 1e9:.3g} GB for a long time; pass max_ops=None "
            f"to run it anyway, or use pc.simulate at unit costs (f=b=w=1) for the makespan")
    _check_size(schedule, slots)
    programs = schedule.programs()
    units = [[u if isinstance(u[0], tuple) else (u,) for u in prog] for prog in programs]
    where = {}
    last_back = {}
    for d, prog in enumerate(units):
        for unit in prog:
            for op in unit:
                if op[0] != "AR":
                    where[op] = d
                if op[0] in ("B", "W", "BW"):
                    last_back[(op[1], d)] = op
    # An all-reduce waits for the last backward of its stage on the *other* device.
    needs = []
    for d, prog in enumerate(units):
        row = []
        for unit in prog:
            if unit[0][0] == "AR":
                stage = unit[0][1]
                row.append([key for (st, dv), key in last_back.items() if st == stage and dv != d])
            else:
                row.append(_producers_of(unit, where, schedule.stages))
        needs.append(row)
    done_at = {}
    start_slot = [[0] * len(prog) for prog in units]
    head = [0] * len(units)
    free_at = [0] * len(units)
    remaining = sum(len(prog) for prog in units)
    t = 0
    while remaining:
        progressed = True
        while progressed:  # zero-slot units (all-reduces) may unlock others in the same slot
            progressed = False
            for d, prog in enumerate(units):
                while head[d] < len(prog) and free_at[d] <= t:
                    i = head[d]
                    if any(done_at.get(key, t + 1) > t for key in needs[d][i]):
                        break
                    length = sum(slots[op[0]] for op in prog[i])
                    start_slot[d][i] = t
                    free_at[d] = t + length
                    for op in prog[i]:
                        done_at[op] = t + length
                    head[d] += 1
                    remaining -= 1
                    progressed = True
        if not remaining:
            break
        # Every op finishing after t is its device's current unit, so its
        # finish is that device's free_at: the devices' times are all events
        # (scanning done_at instead made this quadratic in the ops).
        upcoming = [x for x in free_at if x > t]
        if not upcoming:
            dev_ptr = schedule._info().dev_ptr
            raise _deadlock_error(schedule, np.array(
                [dev_ptr[d] + _rows_before(units[d], head[d]) for d in range(len(units))]))
        t = min(upcoming)
    length = max(free_at) if units else 0
    grid = np.full((schedule.devices, length), -1, dtype=np.int64)
    dev_ptr = schedule._info().dev_ptr
    for d, prog in enumerate(units):
        row = int(dev_ptr[d])
        for i, unit in enumerate(prog):
            span = sum(slots[op[0]] for op in unit)
            grid[d, start_slot[d][i]:start_slot[d][i] + span] = row  # a pair is drawn under its F row
            row += len(unit)
    return IdealTable(schedule, grid, {"F": f, "B": b, "W": w, "BW": b + w, "R": r})


def _check_size(schedule, slots):
    """Refuse, before the pass starts, a table the machine cannot hold."""
    from ..core import hostmem

    codes = schedule.kind_codes
    per_kind = np.array([slots[k] for k in ("F", "B", "W", "BW", "AR", "R", "O", "L")],
                        dtype=np.int64)
    busy = np.bincount(schedule._column("device"), weights=per_kind[codes],
                       minlength=schedule.devices)
    length = int(busy.max()) if busy.size else 0  # every device's own slots: a lower bound
    grid = schedule.devices * length * 8
    need = schedule.num_ops * BYTES_PER_OP + grid
    free = hostmem.available_bytes()
    if free is not None and need > free:
        raise CapacityError(
            f"ideal_table of {schedule.name!r} ({schedule.num_ops:,} ops on {schedule.devices} "
            f"devices) needs at least {need / 1e9:.3g} GB: about {BYTES_PER_OP} bytes per op for "
            f"its slot-by-slot pass and a {schedule.devices} x {length:,}-slot grid of "
            f"{grid / 1e9:.3g} GB; {free / 1e9:.3g} GB are available. Use pc.simulate at unit "
            f"costs (f=b=w=1) for a schedule this large")


def _rows_before(prog, units_done):
    """Rows of the ops in the first ``units_done`` units of a program."""
    return sum(len(u) for u in prog[:units_done])

"""The idealised view: a devices x time-slots grid at unit op times."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from . import _kernels
from ._schedule import Schedule, op_label
from .costs import Costs
from .simulate import _deadlock_error, compile_schedule

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
        Slots each kind takes (F, B, W, BW).
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

    def render(self, max_slots: int | None = None) -> str:
        """The grid as text, one row per device, ``.`` for idle.

        Parameters
        ----------
        max_slots : int, optional
            Show only the first ``max_slots`` slots.

        Returns
        -------
        str
        """
        s = self.schedule
        kinds = s.kind_codes
        stage = s._column("stage")
        mb = s._column("microbatch")
        labels = np.array([op_label(kinds[i], stage[i], mb[i]) for i in range(s.num_ops)],
                          dtype=object)
        paired = s._info()["paired"]
        for i in np.flatnonzero(paired):
            labels[i - 1] = labels[i - 1] + "&" + labels[i]  # an overlapped F&B unit
        width = max((len(x) for x in labels), default=1)
        grid = self.grid if max_slots is None else self.grid[:, :max_slots]
        lines = []
        for d in range(grid.shape[0]):
            cells = [labels[c].rjust(width) if c >= 0 else ".".rjust(width) for c in grid[d]]
            lines.append(f"d{d:<3}| " + " ".join(cells))
        if max_slots is not None and self.length > max_slots:
            lines.append(f"... {self.length - max_slots} more slots")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.render()


def ideal_table(schedule: Schedule, f: int = 1, b: int = 1, w: int = 1) -> IdealTable:
    """Place every op in integer time slots, with no communication.

    Every op of kind F takes ``f`` slots whatever its chunk, B ``b``, W
    ``w`` and a fused BW ``b + w``. This is the tabular abstraction of a
    schedule: the list schedule at unit times.

    Parameters
    ----------
    schedule : Schedule
    f, b, w : int
        Slots per op kind (>= 1 for f and b, >= 0 for w).

    Returns
    -------
    IdealTable

    Raises
    ------
    ValueError
        If a slot count is not a non-negative int (f and b must be >= 1).
    ScheduleError
        If the schedule deadlocks.
    """
    for name, value, low in (("f", f, 1), ("b", b, 1), ("w", w, 0)):
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
            raise ValueError(f"'{name}' must be an int >= {low} (got {value!r})")
    S = schedule.stages
    costs = Costs(f=np.full(S, float(f)), b=np.full(S, float(b)), w=np.full(S, float(w)),
                  comm=0.0, activation=np.ones(S), activation_w=np.zeros(S), weights=np.ones(S))
    c = compile_schedule(schedule, costs)
    status, start, finish, *_rest, head = c.run()
    if status == _kernels.STATUS_DEADLOCK:
        raise _deadlock_error(schedule, head)
    length = int(round(finish.max())) if finish.size else 0
    grid = np.full((schedule.devices, length), -1, dtype=np.int64)
    dev = schedule._column("device")
    st = np.rint(start).astype(np.int64)
    du = np.rint(finish - start).astype(np.int64)
    first = ~c.paired  # an overlapped pair is drawn once, under its F row
    for k in range(int(du.max()) if du.size else 0):
        on = (du > k) & first
        grid[dev[on], st[on] + k] = np.flatnonzero(on)
    return IdealTable(schedule, grid, {"F": f, "B": b, "W": w, "BW": b + w})

"""The helpers a family's builder uses to turn its order into a :class:`Schedule`.

A family states its per-device order one of three ways, from the plainest
to the fastest at scale:

- as per-device programs of ``(kind, stage, microbatch)`` tuples
  (:class:`ProgramBuilder` numbers each stage's microbatches in order),
  turned into a table by :func:`programs_to_schedule`;
- as the closed-form slot of every op, numpy arrays per kind, written into
  the table by :func:`slots_to_schedule`;
- as a Numba kernel that writes every op straight into the table's
  :func:`column_buffers`, a block of devices at a time, run by
  :func:`kernel_to_schedule` (from :data:`SCATTER_MIN_OPS` ops on, where
  :func:`at_scale` is true; smaller shapes keep numpy and so compile
  nothing at a cold start).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..core.cpus import local_cpus as _local_cpus
from ..core.schedule import Schedule
from ..kernels.columns import Columns
from ..kernels.slots import scatter_slots

__all__ = ["ProgramBuilder", "programs_to_schedule", "slots_to_schedule", "column_buffers",
           "kernel_to_schedule", "at_scale", "Columns"]

# From this many ops on, slots_to_schedule writes the columns with a Numba
# kernel, and the families with a closed-form kernel (kernels/slots.py) use
# it (small shapes keep numpy and so compile nothing at a cold start).
SCATTER_MIN_OPS = 262_144
# The kernels write devices in blocks whose rows (17 bytes each) take about
# this many bytes, so a block stays in a core's L2 cache.
SCATTER_BLOCK_BYTES = 1 << 18
# From this many ops on, two threads write the columns (each half of the
# device blocks).
SCATTER_THREADS_MIN_OPS = 1 << 22


class ProgramBuilder:
    """One device's program, numbering each stage's microbatches in order.

    ``emit(kind, stage)`` appends ``(kind, stage, j)`` where j counts the
    earlier ops of that kind and stage, which is how schedules that visit
    microbatches in order (most of them) are written most plainly.

    Attributes
    ----------
    ops : list of tuple
        The program so far, ``(kind, stage, microbatch)`` per op.
    """

    def __init__(self):
        self.ops = []
        self.count = {}

    def emit(self, kind, stage):
        """Append the next op of ``kind`` on ``stage``.

        Parameters
        ----------
        kind : str
            Op kind ("F", "B", "W", "BW", ...).
        stage : int
            Model stage.

        Returns
        -------
        int
            ``stage`` (so a caller can queue it, e.g. for the W of a B).
        """
        j = self.count.get((kind, stage), 0)
        self.count[(kind, stage)] = j + 1
        self.ops.append((kind, stage, j))
        return stage

    def issued(self, kind, stage):
        """How many ops of ``kind`` on ``stage`` were emitted.

        Parameters
        ----------
        kind : str
            Op kind, as given to :meth:`emit`.
        stage : int
            Model stage.

        Returns
        -------
        int
        """
        return self.count.get((kind, stage), 0)


def programs_to_schedule(name, programs, devices):
    """A schedule from per-device programs.

    Parameters
    ----------
    name : str
        Schedule name.
    programs : list of list of tuple
        Device d's ops in order, ``(kind, stage, microbatch)`` each (see
        :meth:`Schedule.from_programs`).
    devices : int
        Pipeline devices p (``len(programs)``).

    Returns
    -------
    Schedule
    """
    return Schedule.from_programs(programs, name=name, devices=devices)


def at_scale(devices, length):
    """Whether a family with ``length`` slots per device writes its table with
    a kernel (:func:`kernel_to_schedule`) rather than numpy.

    Parameters
    ----------
    devices : int
        Pipeline devices p.
    length : int
        Ops per device.

    Returns
    -------
    bool
    """
    return devices * length >= SCATTER_MIN_OPS


def slots_to_schedule(name, devices, length, parts):
    """A schedule from the closed-form slot of every op.

    Parameters
    ----------
    name : str
        Schedule name (named in the error of a builder bug).
    devices : int
        Pipeline devices p.
    length : int
        Slots in every device's program.
    parts : list of tuple
        ``(kind_code, stage, microbatch, slot)`` where the last three are
        integer arrays that broadcast to ``(devices, k)``: op i of that part
        on device d is ``(kind_code, stage[d, i], microbatch[d, i])`` in slot
        ``slot[d, i]``. The parts must fill every slot exactly once.

    Returns
    -------
    Schedule
        Rows in (device, slot) order.

    Raises
    ------
    RuntimeError
        If the parts leave a slot empty or put two ops in one (a builder bug).
    """
    p = devices
    if at_scale(p, length):
        return _slots_kernel(name, p, length, parts)
    kind = np.full((p, length), -1, dtype=np.int8)
    stage = np.empty((p, length), dtype=np.int32)
    mb = np.empty((p, length), dtype=np.int32)
    rows = np.arange(p)[:, None]
    for code, st, j, sl in parts:
        sl = np.broadcast_to(sl, np.broadcast_shapes(np.shape(sl), np.shape(st), np.shape(j)))
        kind[rows, sl] = code
        stage[rows, sl] = st
        mb[rows, sl] = j
    if int(kind.min(initial=0)) < 0:
        raise RuntimeError(f"internal error: the {name} builder left a slot empty")
    device = np.repeat(np.arange(p, dtype=np.int32), length)
    slot = np.tile(np.arange(length, dtype=np.int32), p)
    return Schedule.from_arrays(device, slot, kind.reshape(-1), stage.reshape(-1),
                                mb.reshape(-1), name=name, devices=p, copy=False)


def column_buffers(n):
    """Empty op-table columns for a kernel to fill.

    Parameters
    ----------
    n : int
        Rows (ops).

    Returns
    -------
    Columns
        device, slot, kind, stage and microbatch arrays of n rows (int32,
        int8 for the kind), uninitialised: the kernel writes every row.
    """
    return Columns(np.empty(n, np.int32), np.empty(n, np.int32), np.empty(n, np.int8),
                   np.empty(n, np.int32), np.empty(n, np.int32))


def _as_2d(x):
    return np.ascontiguousarray(np.asarray(x, dtype=np.int32).reshape(
        (1, 1) if np.ndim(x) == 0 else np.shape(x) if np.ndim(x) == 2 else (1, -1)))


def _slots_kernel(name, p, length, parts):
    """:func:`slots_to_schedule` through :func:`kernels.slots.scatter_slots`."""
    parts = [(np.int8(code), _as_2d(st), _as_2d(j), _as_2d(sl)) for code, st, j, sl in parts]

    def fill(columns, d0, d1):
        return any(scatter_slots(columns, length, code, st, j, sl, d0, d1)
                   for code, st, j, sl in parts)

    return kernel_to_schedule(name, p, length, fill)


def kernel_to_schedule(name, devices, length, fill):
    """A schedule of ``length`` slots per device whose columns a kernel writes.

    Parameters
    ----------
    name, devices, length : str, int, int
        As in :func:`slots_to_schedule`.
    fill : callable
        ``fill(columns, d0, d1) -> bool`` writes the ops of devices d0 to
        d1 - 1 into ``columns`` (a :class:`Columns` of ``devices * length``
        rows in (device, slot) order, ``kind`` -1 on those rows) and returns
        True when a builder bug put two ops in one slot or one out of range.
        It is called a block of devices at a time (a block's rows stay in
        cache), from two threads on a large table: a Numba kernel that
        releases the GIL (``nogil=True``) keeps both CPUs busy.

    Returns
    -------
    Schedule
        Rows in (device, slot) order, as ``fill`` wrote them.

    Raises
    ------
    RuntimeError
        If ``fill`` reports a bug or leaves a slot empty.
    """
    p = devices
    n = p * length
    columns = column_buffers(n)
    kind = columns.kind
    block = max(1, SCATTER_BLOCK_BYTES // (17 * length))
    blocks = [(d0, min(p, d0 + block)) for d0 in range(0, p, block)]

    def scatter(chosen):
        """True when a builder bug put two ops in one slot (or out of range)."""
        for d0, d1 in chosen:
            kind[d0 * length:d1 * length] = -1
            if fill(columns, d0, d1):
                return True
        return False

    # Device blocks own disjoint rows: two threads (the kernel releases the
    # GIL) each scatter half of them.
    if n >= SCATTER_THREADS_MIN_OPS and len(blocks) > 1 and _local_cpus() >= 2:
        half = len(blocks) // 2
        with ThreadPoolExecutor(1) as pool:
            other = pool.submit(scatter, blocks[half:])
            broken = scatter(blocks[:half])
            broken = other.result() or broken
    else:
        broken = scatter(blocks)
    if broken:
        raise RuntimeError(f"internal error: the {name} builder put two ops in one "
                           f"slot or one outside its {length} slots")
    if int(kind.min(initial=0)) < 0:
        raise RuntimeError(f"internal error: the {name} builder left a slot empty")
    return Schedule.from_arrays(*columns, name=name, devices=p, copy=False)

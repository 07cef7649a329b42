"""Building blocks ("Pipeline Parallelism with Controllable Memory", Qi et al.,
NeurIPS 2024): a schedule is one microbatch's ops with fixed start offsets,
repeated every ``interval``, then squeezed.

A :class:`BuildingBlock` places each stage on a device and gives every op of
one microbatch a start offset in abstract unit times. :func:`repeat` lays out
``m`` copies, microbatch j shifted by ``j * interval``; if the block does not
collide with its own copies and respects the dependencies, that layout is a
valid timed schedule. :meth:`Repeated.squeeze` keeps each device's order and
drops the idle time (the list scheduler runs every op as early as it can).
The peak activation of device d never exceeds ``sum(ceil(l_s / T) * a_s)`` over
its stages, with l_s the stage's lifespan (F start to the end of its last
backward op) and a_s its activation, because at most ``ceil(l_s / T)``
microbatches of a stage are alive at once and squeezing keeps the order.

The V-shaped blocks of the paper: V-Min (peak (p+4)//3 M), V-Half
((p+2)//2 M) and V-ZB (p M, no bubble in the steady phase), all with device d
holding stages d and 2p-1-d, unit op times and an interval of 6.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from ..core import buffers, tier
from ..core.cpus import local_cpus
from ..core.ops import CapacityError, InputError
from ..core.rules import _in_halves
from ..core.schedule import Schedule, _check_int
from ..kernels.vblocks import (
    _BLOCK,
    _SPAN,
    _SUPER,
    _choose_cut,
    _done_after,
    _event_loop,
    _sweep,
    _tails,
    columns,
    reorder_emit,
    reorder_moves,
    reorder_setup,
)
from .registry import column_buffers

__all__ = ["BuildingBlock", "Repeated", "repeat", "v_min", "v_half", "v_zb", "v_block"]

_KIND_ORDER = {"F": 0, "B": 1, "W": 2, "BW": 3}


@dataclass(frozen=True)
class BuildingBlock:
    """One microbatch's ops and their start offsets.

    Parameters
    ----------
    placement : sequence of int
        Device of each stage, stages in model order.
    offsets : mapping of (str, int) to float
        Start offset of each op ``(kind, stage)``: every stage needs ``F``
        and either ``B`` and ``W`` or ``BW``.
    interval : float
        Time between the starts of consecutive microbatches' copies.
    durations : mapping of str to float, optional
        Length of each kind in the block's time unit (default F = B = W = 1,
        BW = 2).
    name : str, optional
        Label used for schedules built from the block.

    Raises
    ------
    ValueError
        If an op is missing, an offset breaks a dependency (naming the two
        ops and their times), or two copies of the block collide on a device
        (naming the ops and the device).
    """

    placement: tuple
    offsets: Mapping
    interval: float
    durations: Mapping = field(default_factory=lambda: {"F": 1.0, "B": 1.0, "W": 1.0, "BW": 2.0})
    name: str = "block"

    def __post_init__(self):
        placement = tuple(int(d) for d in self.placement)
        if not placement or min(placement) < 0:
            raise InputError(f"'placement' needs a device >= 0 for each stage (got {placement})")
        object.__setattr__(self, "placement", placement)
        if not isinstance(self.offsets, Mapping):
            raise InputError(f"'offsets' must map (kind, stage) to a start offset, e.g. "
                             f"{{('F', 0): 0.0, ('BW', 0): 3.0}} (got {type(self.offsets).__name__})")
        try:
            offsets = {(str(k), int(s)): float(t) for (k, s), t in self.offsets.items()}
        except (TypeError, ValueError) as exc:
            raise InputError(f"'offsets' must map (kind, stage) pairs to numbers ({exc})") from None
        object.__setattr__(self, "offsets", offsets)
        durations = {str(k): float(v) for k, v in dict(self.durations).items()}
        object.__setattr__(self, "durations", durations)
        if not (isinstance(self.interval, (int, float)) and math.isfinite(self.interval)
                and self.interval > 0):
            raise InputError(f"'interval' must be a finite number > 0 (got {self.interval!r})")
        for kind, d in durations.items():
            if kind not in _KIND_ORDER or not (math.isfinite(d) and d > 0):
                raise InputError(f"'durations' must map F, B, W, BW to times > 0 (got {kind}: {d})")
        self._check_ops()
        self._check_dependencies()
        self._check_collisions()

    # -- facts ------------------------------------------------------------
    @property
    def stages(self) -> int:
        """int: number of stages."""
        return len(self.placement)

    @property
    def devices(self) -> int:
        """int: number of devices (largest device index + 1)."""
        return max(self.placement) + 1

    def duration(self, kind: str) -> float:
        """Length of an op of ``kind`` in block time units.

        Parameters
        ----------
        kind : str

        Returns
        -------
        float

        Raises
        ------
        KeyError
            If the block has no duration for that kind.
        """
        return self.durations[kind]

    def end(self, kind, stage) -> float:
        """End offset of op ``(kind, stage)``.

        Parameters
        ----------
        kind : str
        stage : int

        Returns
        -------
        float

        Raises
        ------
        KeyError
            If the block has no such op.
        """
        return self.offsets[(kind, stage)] + self.durations[kind]

    def _last_backward(self, stage):
        return "BW" if ("BW", stage) in self.offsets else "W"

    def lifespan(self, stage: int) -> float:
        """Time from the stage's F start to the end of its last backward op.

        Parameters
        ----------
        stage : int

        Returns
        -------
        float

        Raises
        ------
        KeyError
            If the stage is not in the block.
        """
        return self.end(self._last_backward(stage), stage) - self.offsets[("F", stage)]

    def memory_bound(self, activation=None) -> np.ndarray:
        """Upper bound on each device's peak activation.

        Parameters
        ----------
        activation : array_like, optional
            Activation of each stage; default ``devices / stages`` (one M
            per device share, split evenly over its chunks).

        Returns
        -------
        numpy.ndarray
            ``sum(ceil(lifespan / interval) * activation)`` per device.

        Raises
        ------
        IndexError
            If ``activation`` has fewer entries than stages.
        """
        S = self.stages
        act = np.full(S, self.devices / S) if activation is None else np.asarray(activation, float)
        out = np.zeros(self.devices)
        for s in range(S):
            out[self.placement[s]] += math.ceil(self.lifespan(s) / self.interval - 1e-9) * act[s]
        return out

    # -- checks -----------------------------------------------------------
    def _check_ops(self):
        for (kind, stage) in self.offsets:
            if kind not in _KIND_ORDER:
                raise InputError(f"offset for unknown kind {kind!r} (stage {stage}); kinds are F, B, W, BW")
            if not 0 <= stage < self.stages:
                raise InputError(f"offset for {kind} of stage {stage}, but the block has stages "
                                 f"0..{self.stages - 1}")
        kinds_of = [set() for _ in range(self.stages)]  # one pass: per-stage scans were quadratic
        for (k, st) in self.offsets:
            kinds_of[st].add(k)
        for s in range(self.stages):
            has = kinds_of[s]
            if "F" not in has or not (has == {"F", "BW"} or has == {"F", "B", "W"}):
                raise InputError(f"stage {s} has offsets for {sorted(has)}; it needs F and BW, "
                                 f"or F, B and W")
            kinds_needed = {"F", "BW"} if "BW" in has else {"F", "B", "W"}
            for k in kinds_needed:
                if k not in self.durations:
                    raise InputError(f"'durations' has no time for {k}")

    def _check_dependencies(self):
        S = self.stages
        o = self.offsets

        def need(later, earlier):
            if o[later] < self.end(*earlier) - 1e-9:
                raise InputError(
                    f"offsets break a dependency: {later[1]}{later[0]} starts at {o[later]:g} but "
                    f"needs {earlier[1]}{earlier[0]}, which ends at {self.end(*earlier):g}")

        for s in range(S):
            back = "BW" if ("BW", s) in o else "B"
            if s > 0:
                need(("F", s), ("F", s - 1))
            need((back, s), ("F", s))
            if s < S - 1:
                need((back, s), ("BW" if ("BW", s + 1) in o else "B", s + 1))
            if back == "B":
                need(("W", s), ("B", s))

    def _check_collisions(self):
        T = self.interval
        on = [[] for _ in range(self.devices)]  # one pass: per-device scans were quadratic
        for (k, s), t in self.offsets.items():
            on[self.placement[s]].append((t % T, self.durations[k], k, s))
        for d in range(self.devices):
            ops = sorted(on[d])
            if not ops:
                raise InputError(f"device {d} holds no stage (placement {list(self.placement)}): "
                                 f"number the devices 0..{self.devices - 1} without gaps")
            busy = sum(x[1] for x in ops)
            if busy > T + 1e-9:
                raise InputError(f"device {d} has {busy:g} time units of ops per microbatch but the "
                                 f"interval is {T:g}: copies of the block must collide")
            for a, b in zip(ops, ops[1:] + [(ops[0][0] + T,) + ops[0][1:]]):
                if a is b:
                    continue
                if a[0] + a[1] > b[0] + 1e-9:
                    raise InputError(
                        f"copies of the block collide on device {d}: {a[3]}{a[2]} occupies "
                        f"[{a[0]:g}, {a[0] + a[1]:g}) modulo the interval {T:g} and "
                        f"{b[3]}{b[2]} starts at {b[0] % T:g}")


@dataclass(frozen=True)
class Repeated:
    """A building block laid out for ``microbatches`` microbatches.

    Attributes
    ----------
    block : BuildingBlock
    microbatches : int
    """

    block: BuildingBlock
    microbatches: int

    def times(self) -> list:
        """Every op with its unsqueezed start time.

        Returns
        -------
        list of tuple
            ``(start, device, kind, stage, microbatch)`` sorted by device,
            then start time.
        """
        b = self.block
        m = self.microbatches
        keys = list(b.offsets)
        off = np.array([b.offsets[key] for key in keys], dtype=np.float64)
        stage = np.array([s for _k, s in keys], dtype=np.int64)
        code = np.array([_KIND_ORDER[k] for k, _s in keys], dtype=np.int64)
        dev = np.array(b.placement, dtype=np.int64)[stage]
        j = np.repeat(np.arange(m, dtype=np.int64), len(keys))
        local = np.tile(np.arange(len(keys)), m)
        start = off[local] + j * b.interval  # the same float sums as t + j * interval
        order = np.lexsort((j, stage[local], code[local], start, dev[local]))
        kinds = [keys[i][0] for i in local[order].tolist()]
        return list(zip(start[order].tolist(), dev[local][order].tolist(), kinds,
                        stage[local][order].tolist(), j[order].tolist()))

    def squeeze(self, name: str | None = None, reorder: bool = True) -> Schedule:
        """The schedule: each device's ops in the order of the layout.

        Simulating it runs every op as early as dependencies and the device
        allow, which removes the layout's idle time without changing any
        device's order (the paper's squeezing). With ``reorder``, ops of the
        warm-up and cool-down first move into earlier free slots of the
        layout when their inputs are ready there and the device's peak does
        not rise (the paper's optional reordering); the steady phase, where
        the peak occurs, is untouched. Either way the memory bound holds.

        Parameters
        ----------
        name : str, optional
            Schedule name (default the block's).
        reorder : bool, default True
            Fill warm-up and cool-down gaps before squeezing.

        Returns
        -------
        Schedule

        Raises
        ------
        ScheduleError
            Never for a valid block; the schedule is validated on construction.
        MemoryError
            If the kernels' time grids would exceed ``_GRID_BYTES_MAX``.

        Notes
        -----
        From 4,096 ops on the integer time grid the reordering runs as
        Numba kernels (``kernels/vblocks.py``) that give the same programs
        as the Python version (``_squeeze_programs``, the tested reference).
        """
        b = self.block
        name = name or b.name
        ops = len(b.offsets) * self.microbatches
        if reorder and _use_kernels(ops):
            tables = _block_tables(b, self.microbatches)
            if tables is not None:
                return Schedule.from_arrays(*_squeeze_kernels(tables), name=name,
                                            devices=b.devices, copy=False)
        t0 = time.perf_counter()
        programs = _squeeze_programs(b, self.microbatches, reorder)
        if reorder and ops >= _KERNEL_MIN_OPS:
            global _python_spent
            _python_spent += time.perf_counter() - t0
        return Schedule.from_programs(programs, name=name, devices=b.devices)


# From this many ops squeeze(reorder=True) runs the kernels of kernels/vblocks.py;
# below it the Python version takes under 20 ms, less than loading them from
# the cache (0.2-0.4 s, once per process).
_KERNEL_MIN_OPS = 4096
# While the kernels would have to compile first (neither compiled in this
# process nor in Numba's cache), the Python version, far cheaper than that
# compile at this size, runs up to this many ops, until the process has spent
# _PYTHON_BUDGET seconds in such calls; past that they compile, as for any
# larger call.
_PYTHON_MAX_OPS = 1 << 16
_PYTHON_BUDGET = 3.0
_python_spent = 0.0
_KERNELS = (reorder_setup, reorder_moves, reorder_emit, _tails, _sweep, _choose_cut,
            _done_after, _event_loop, columns)


def _use_kernels(ops):
    """Whether squeeze(reorder=True) of ``ops`` ops runs the kernels (the
    Python version gives the same programs; see _KERNEL_MIN_OPS and
    _PYTHON_MAX_OPS)."""
    if ops < _KERNEL_MIN_OPS:
        return False
    if ops > _PYTHON_MAX_OPS or _python_spent >= _PYTHON_BUDGET:
        return True
    return all(tier.ready(k) for k in _KERNELS)
# From this many ops two threads write the columns, half of the devices each.
_COLUMNS_THREADS_MIN_OPS = 1 << 22
# The cool-down scheduler times the ops before the last microbatches by a
# sweep in layout order when it can (``kernels.vblocks._choose_cut``).
_CUT = True
# The kernels' two time grids (devices x horizon int32 each) may take this much.
_GRID_BYTES_MAX = 8 << 30


def _squeeze_programs(block, microbatches, reorder=True):
    """Per-device programs of :meth:`Repeated.squeeze` by the Python
    reference (``_reorder`` and ``_greedy_cooldown``)."""
    ops = Repeated(block, microbatches).times()
    if reorder:
        ops = _reorder(block, ops)
    programs = [[] for _ in range(block.devices)]
    for _t, d, k, s, j in ops:
        programs[d].append((k, s, j))
    if reorder:
        programs = _greedy_cooldown(block, programs)
    return programs


def _block_tables(block, microbatches):
    """The block's K ops as arrays for ``kernels/vblocks.py``, or None when
    the kernels would not take the Python path's decisions.

    They need what ``_reorder`` needs (integer offsets and durations) and
    an integer interval and offsets >= 0 (there ``_reorder`` truncates and
    indexes from the end). They count alive activations in integers, which
    equals ``_reorder``'s float sums of ``devices / stages`` when that is a
    multiple of 2**-20 (the sums are then exact).
    """
    offsets, dur = block.offsets, block.durations
    S, p, m = block.stages, block.devices, microbatches
    T = block.interval
    if not (float(T).is_integer() and all(float(t).is_integer() and t >= 0 for t in offsets.values())
            and all(float(v).is_integer() for v in dur.values())
            and (p / S * 2 ** 20).is_integer()):
        return None
    keys = list(offsets)
    K = len(keys)
    index = {key: i for i, key in enumerate(keys)}
    last = {s: ("BW" if ("BW", s) in offsets else "W") for s in range(S)}
    l_kind = np.array([_KIND_ORDER[k] for k, _s in keys], dtype=np.int8)
    l_stage = np.array([s for _k, s in keys], dtype=np.int32)
    l_dev = np.array([block.placement[s] for _k, s in keys], dtype=np.int64)
    l_off = np.array([int(offsets[key]) for key in keys], dtype=np.int64)
    l_dur = np.array([int(dur[k]) for k, _s in keys], dtype=np.int64)
    prods = [[index[(q[0], q[1])] for q in _producers(k, s, 0, S, offsets)] for k, s in keys]
    cons = [[] for _ in keys]
    for i, ps in enumerate(prods):
        for q in ps:
            cons[q].append(i)
    l_prod = np.full((K, max(1, max(map(len, prods)))), -1, dtype=np.int64)
    l_cons = np.full((K, max(1, max(map(len, cons)))), -1, dtype=np.int64)
    for i in range(K):
        l_prod[i, :len(prods[i])] = prods[i]
        l_cons[i, :len(cons[i])] = cons[i]
    l_is_f = l_kind == _KIND_ORDER["F"]
    l_is_last = np.array([k == last[s] for k, s in keys])
    l_last = np.array([index[(last[s], s)] for _k, s in keys], dtype=np.int64)
    T = int(T)
    horizon = int((l_off + l_dur).max()) + (m - 1) * T + 1
    back0 = "BW" if ("BW", 0) in offsets else "B"
    warm_end = int(offsets[(back0, 0)])
    cool_start = int(offsets[("F", 0)]) + (m - 1) * T
    # Numba does not check bounds: every index the kernels form stays inside these.
    # (Finish times in the cool-down kernel are at most the sum of all durations.)
    if K * m * int(l_dur.max()) >= 2 ** 31 - 1 or horizon >= 2 ** 31 - 1:
        raise InputError(f"{K * m} ops over {horizon} time units exceed the kernels' int32 range")
    grid = 8 * p * (horizon + 1)
    if grid > _GRID_BYTES_MAX:
        raise CapacityError(f"squeezing {K * m} ops needs two {p} x {horizon} time grids "
                          f"({grid / 2 ** 30:.1f} GiB, more than {_GRID_BYTES_MAX / 2 ** 30:.0f})")
    return dict(l_kind=l_kind, l_stage=l_stage, l_dev=l_dev, l_off=l_off, l_dur=l_dur,
                l_prod=l_prod, l_cons=l_cons, l_is_f=l_is_f, l_is_last=l_is_last, l_last=l_last,
                m=m, interval=T, devices=p, horizon=horizon, warm_end=warm_end,
                cool_start=cool_start)


def _squeeze_kernels(t):
    """Columns (device, slot, kind, stage, microbatch) of the squeezed schedule
    by ``kernels/vblocks.py``; equal to ``_squeeze_programs``."""
    p = t["devices"]
    n = len(t["l_dev"]) * t["m"]
    cols = column_buffers(n)
    two = n >= _COLUMNS_THREADS_MIN_OPS and p > 1 and local_cpus() >= 2
    ostart, order, dptr = _reorder_kernels(t, fault=cols if two else ())
    tails = _tails(order, dptr, t["l_kind"], t["m"], p)
    lo, split, hi = dptr[:-1], tails[0], dptr[1:]
    kinds = t["l_kind"], t["l_stage"]
    if two:
        # The cool-down scheduler (one thread) writes over ``order`` only each
        # device's ops after its last F: the rows before are final, so the
        # other CPU writes their columns meanwhile.
        with ThreadPoolExecutor(1) as pool:
            head = pool.submit(columns, order, dptr, lo, split, *kinds, cols, 0, p)
            try:
                out, ran, _swept = _cooldown_kernels(t, order, ostart, dptr, _CUT, tails)
            finally:
                head.result()
        lo = split
    else:
        out, ran, _swept = _cooldown_kernels(t, order, ostart, dptr, _CUT, tails)
    if ran < len(out):  # pragma: no cover - the layout order is always feasible
        raise RuntimeError("cool-down reordering stalled")
    # Devices own disjoint rows: two threads (the kernel releases the GIL).
    _in_halves(columns, two, p, out, dptr, lo, hi, *kinds, cols)
    return cols


_REORDER_THREADS_MIN_OPS = 1 << 20
# reorder_moves's sets: the warm-up ops, the cool-down ops.
_WARM, _COOL = 1, 2


def _reorder_windows(t, window=True):
    """The windows of the reorder's time grid: slots [0, A) and [B, horizon)
    are stored, and microbatches j0 to j1 lie wholly in [A, B) (all 0: the
    whole grid, when ``window`` is False or [A, B) would be too short)."""
    l_off, l_dur, m, T = t["l_off"], t["l_dur"], t["m"], t["interval"]
    warm_end, cool_start = t["warm_end"], t["cool_start"]
    # Only two windows of the time grid are stored: [0, A) holds every slot
    # a warm-up op reads or moves to, [B, horizon) every slot a cool-down op
    # does (its producers start after microbatch j's first F, at least
    # cool_start - max offset); nothing moves in [A, B), where the layout
    # and the alive counts repeat every interval. Whole superblocks in each
    # window, so the two threads of the moves never share one.
    minoff = int(l_off.min())
    maxoff = max(0, int(l_off.max()))
    maxend = max(0, int((l_off + l_dur).max()))
    maxdur = max(0, int(l_dur.max()))
    A = -(-max(warm_end + maxdur, maxend) // _SPAN) * _SPAN
    B = min(cool_start - maxoff, minoff + T * m) // _SPAN * _SPAN
    if B - A < T + _SPAN or not window:
        A = B = 0  # no window: the whole grid
    # Microbatches j0 to j1 start at A or later and end before B.
    j0 = j1 = 0
    if B > A:
        j0 = min(m, max(0, -((minoff - A) // T)))
        j1 = min(m, max(j0, -((maxend - B) // T)))
    return A, B, j0, j1


def _reorder_kernels(t, rounds=3, window=True, threads=None, fault=()):
    """``_reorder`` on the block tables ``t`` by ``kernels/vblocks.py``.

    Parameters
    ----------
    t : dict
        ``_block_tables``'s output.
    rounds : int
        At most this many rounds of moves.
    window : bool
        Store only the grid's warm-up and cool-down windows (the same
        result; False stores the whole grid, the tests' reference).
    threads : bool or None
        Two threads: each sets up and emits half of the devices, and they
        move the warm-up and the cool-down ops at once (with windows, where
        the two are independent). None: when the block has at least
        ``_REORDER_THREADS_MIN_OPS`` ops and two CPUs are free.
    fault : tuple of numpy.ndarray
        Arrays the caller fills next: their pages are faulted in on a
        helper thread from the moves on (the thread that ends its set of
        moves first leaves a CPU free).

    Returns
    -------
    ostart : numpy.ndarray of int32
        The start of ``order[i]``.
    order : numpy.ndarray of int32
        Op ids (``bi * m + j``), device by device, by start.
    dptr : numpy.ndarray of int64
        Device d's ops are ``order[dptr[d]:dptr[d + 1]]``.
    """
    l_dev, l_off, l_dur, m, T = t["l_dev"], t["l_off"], t["l_dur"], t["m"], t["interval"]
    p, horizon, warm_end, cool_start = t["devices"], t["horizon"], t["warm_end"], t["cool_start"]
    n = len(l_dev) * m
    if threads is None:
        threads = n >= _REORDER_THREADS_MIN_OPS and local_cpus() >= 2 and p > 1
    A, B, j0, j1 = _reorder_windows(t, window)
    H = horizon - (B - A)
    nsup = (H + _SPAN) // _SPAN  # at least one padding slot after H
    nblk = nsup << _SUPER
    # Starts of the microbatches outside [j0, j1) only, in whole tiles of
    # 64 microbatches by K block ops (kernels/vblocks.py's _kept).
    start = buffers.empty(((m - (j1 - j0) + 63) >> 6) * len(l_dev) * 64, np.int32)
    occ = buffers.empty((p, H), np.int32)
    alive = buffers.empty((p, nblk * _BLOCK), np.int32)
    # The moves visit the devices' rows by turns: on huge pages (v-zb at
    # p=1024: the reorder 5.09 s against 6.31, medians, six of six turns).
    bmax, lazy, smax, slazy = buffers.arena(((p, nblk), np.int32), ((p, nblk), np.int32),
                                            ((p, nsup), np.int32), ((p, nsup), np.int32))
    limit = np.empty(p, np.int32)
    ostart = buffers.empty(n, np.int32)
    order = buffers.empty(n, np.int32)
    # The outputs' pages fault in on a helper thread meanwhile.
    buffers.populate(order, ostart)
    setup = (l_dev, l_off, l_dur, t["l_is_f"], t["l_last"], m, T, warm_end, cool_start, A, B,
             j0, j1, start, occ, alive, bmax, lazy, smax, slazy, limit)
    dptr = np.zeros(p + 1, np.int64)
    dptr[1:] = np.cumsum(np.bincount(l_dev, minlength=p) * m)
    emit = (start, occ, l_dev, l_off, m, T, horizon, A, B, j0, j1, dptr, ostart, order)
    half = p // 2
    pool = ThreadPoolExecutor(1) if threads else None
    try:
        if pool is not None:
            other = pool.submit(reorder_setup, *setup, half, p)
            reorder_setup(*setup, 0, half)
            other.result()
        else:
            reorder_setup(*setup, 0, p)
        args = (start, occ, alive, bmax, lazy, smax, slazy, limit, l_dev, l_off, l_dur,
                t["l_prod"], t["l_is_f"], t["l_is_last"], m, T, warm_end, cool_start, p, horizon,
                A, B, j0, j1, rounds)
        if fault:
            buffers.populate(*fault)
        if B <= A:
            # No windows: a cool-down op may read a warm-up op's start.
            reorder_moves(_WARM | _COOL, *args)
        elif pool is not None:
            other = pool.submit(reorder_moves, _COOL, *args)
            reorder_moves(_WARM, *args)
            other.result()
        else:
            reorder_moves(_WARM, *args)
            reorder_moves(_COOL, *args)
        if pool is not None:
            other = pool.submit(reorder_emit, *emit, half, p)
            reorder_emit(*emit, 0, half)
            other.result()
        else:
            reorder_emit(*emit, 0, p)
    finally:
        if pool is not None:
            pool.shutdown()
    return ostart, order, dptr


def _cooldown_kernels(t, order, ostart, dptr, cut, tails=None):
    """Each device's program with its ops after the last F re-ordered.

    Event-driven like the Python version: devices take turns by least
    (free time, device) (Python's heap; a tournament tree here); before its last F a device runs its ops in
    order, after it the ready backward (B or BW) of lowest rank, else the
    W of lowest rank, else the op ready first. An op becomes ready (and
    joins its device's "later" heap keyed by (ready time, is W, rank)) when
    its last producer finishes; an attempt moves every op ready by then
    into the "now" set ordered by (is W, rank). Finishing an op wakes the
    devices of its consumers. Python keeps a set of waiting devices per op
    and may queue a device twice; waking every consumer device once (a
    device whose turn is pending is not queued again) takes the same
    decisions, since an attempt can only succeed after a wake-up that
    Python also makes.

    With ``cut``, the ops before the last microbatches get their times from
    ``kernels.vblocks._sweep`` (in layout order, no event queue) and the
    event loop starts at a time tau in the state it would have reached
    there by itself (``kernels.vblocks._choose_cut`` says why); the loop
    then covers only the last microbatches. Where the sweep cannot tell,
    the loop runs from the start. Separate kernels called from here, not
    one kernel: a kernel that calls another compiles the callee again
    inside itself (17 s of first compile against 13).

    Parameters
    ----------
    t : dict
        The block's tables (``_block_tables``).
    order : int32 array
        Op ids device by device in layout order (``_reorder_kernels``).
    ostart : int32 array
        Layout start of ``order[i]``.
    dptr : int64 array
        Device d's ops are ``order[dptr[d]:dptr[d + 1]]``.
    cut : bool
        Try the sweep and cut (False: the event loop over every op).
    tails : tuple, optional
        ``kernels.vblocks._tails`` of ``order`` when the caller has it.

    Returns
    -------
    out : int32 array
        Op ids, device by device in run order (``dptr`` as for ``order``):
        ``order`` itself, overwritten.
    ran : int
        Ops run (all of them unless the programs deadlock).
    swept : int
        Ops timed by the sweep before the cut (0 without a cut).
    """
    kind, dev, dur, prod = t["l_kind"], t["l_dev"], t["l_dur"], t["l_prod"]
    m = len(order) // len(dev)
    p = t["devices"]
    if tails is None:
        tails = _tails(order, dptr, kind, m, p)
    split, tail, tail_from, roff, rank = tails
    swept = 0
    base = dptr[:-1].copy()  # the event loop starts at these positions
    free_at = np.zeros(p, np.int64)
    queued = np.ones(p, np.bool_)
    ring = np.zeros(1, np.int64)
    if cut:
        ok, ptr, ring, _skipped = _sweep(order, ostart, dptr, split, prod, dev, dur, m, t["interval"])
        if ok and _choose_cut(order, dptr, prod, dev, dur, m, ptr, ring, base, free_at, queued):
            swept = int((base - dptr[:-1]).sum())
    if swept > 0:
        done, jb = _done_after(order, dptr, base, prod, dev, m, ring, True)
        if jb < 0:  # a producer on another device had left the ring
            swept = 0
    if swept == 0:  # the event loop from the start
        base = dptr[:-1].copy()
        free_at[:] = 0
        queued[:] = True
        done, jb = _done_after(order, dptr, base, prod, dev, m, ring, False)
    out, ran = _event_loop(order, dptr, split, tail, tail_from, roff, rank, base, free_at, queued,
                           done, jb, swept, kind, dev, dur, prod, t["l_cons"], p)
    return out, ran, swept


def _producers(kind, stage, j, stages, offsets):
    """The ops (kind, stage, microbatch) that op (kind, stage, j) waits for."""
    if kind == "F":
        return [("F", stage - 1, j)] if stage > 0 else []
    if kind == "W":
        return [("B", stage, j)]
    out = [("F", stage, j)]
    if stage < stages - 1:
        out.append(("BW" if ("BW", stage + 1) in offsets else "B", stage + 1, j))
    return out


def _reorder(block, ops):
    """Move warm-up and cool-down ops into earlier free slots (see Repeated.squeeze).

    Works on the block's integer time grid: a device's busy slots are kept
    in a set and its activation curve (alive from F's start to the end of
    the stage's last backward op) in an array, so each tentative move costs
    the length of the move, not a pass over the device's ops.
    """
    dur = block.durations
    if any(t != int(t) for t in block.offsets.values()) or any(d != int(d) for d in dur.values()):
        return ops  # reordering needs the integer grid; squeezing alone still applies
    dur = {k: int(v) for k, v in dur.items()}
    start = {(k, s, j): int(t) for t, _d, k, s, j in ops}
    placement = block.placement
    S = block.stages
    act = block.devices / S
    last = {s: ("BW" if ("BW", s) in block.offsets else "W") for s in range(S)}
    horizon = max(start[op] + dur[op[0]] for op in start) + 1
    occupied = [dict() for _ in range(block.devices)]
    memory = [np.zeros(horizon) for _ in range(block.devices)]
    for op, t in start.items():
        k, s, j = op
        d = placement[s]
        for u in range(t, t + dur[k]):
            occupied[d][u] = op
        if k == "F":
            memory[d][t:start[(last[s], s, j)] + dur[last[s]]] += act
    limits = [float(mem.max()) for mem in memory]

    def free(d, lo, length, op):
        return all(occupied[d].get(u, op) == op for u in range(lo, lo + length))

    def move(op, new):
        k, s, j = op
        d = placement[s]
        old = start[op]
        for u in range(old, old + dur[k]):
            del occupied[d][u]
        for u in range(new, new + dur[k]):
            occupied[d][u] = op
        start[op] = new
        if k == "F":
            memory[d][new:old] += act
        elif k == last[s]:
            memory[d][new + dur[k]:old + dur[k]] -= act

    # Phases (per the paper): warm-up until device 0's first backward of
    # stage 0, cool-down after device 0's last forward of stage 0.
    m = max(j for _t, _d, _k, _s, j in ops) + 1
    back0 = "BW" if ("BW", 0) in block.offsets else "B"
    warm_end = start[(back0, 0, 0)]
    cool_start = start[("F", 0, m - 1)]
    candidates = [op for op in start if not warm_end <= start[op] <= cool_start]
    for _round in range(3):
        moved = False
        for op in sorted(candidates, key=lambda o: start[o]):
            k, s, j = op
            d = placement[s]
            t = start[op]
            ready = max((start[q] + dur[q[0]] for q in _producers(k, s, j, S, block.offsets)),
                        default=0)
            for slot in range(ready, t):
                if not free(d, slot, dur[k], op):
                    continue
                # An earlier F keeps its activation alive longer; others only free earlier.
                if k == "F" and memory[d][slot:t].max(initial=0.0) + act > limits[d] + 1e-9:
                    continue
                move(op, slot)
                moved = True
                break
        if not moved:
            break
    out = [(float(start[(k, s, j)]), d, k, s, j) for _t, d, k, s, j in ops]
    out.sort(key=lambda x: (x[1], x[0], _KIND_ORDER[x[2]], x[3], x[4]))
    return out


def _greedy_cooldown(block, programs):
    """Re-order each device's ops after its last forward: a ready backward
    (B or BW) first, else the oldest pending W, else wait.

    After its last F a device only frees memory, so any order of its
    remaining B and W keeps the peak; running the backward chain first and
    filling waits with W is how the zero-bubble schedules end. Devices are
    advanced in order of the time they become free; a device that cannot
    run anything waits until one of the ops it needs finishes.
    """
    dur = block.durations
    S = block.stages
    p = len(programs)
    fixed, tail = [], []
    for prog in programs:
        last_f = max((i for i, op in enumerate(prog) if op[0] == "F"), default=-1)
        fixed.append(prog[: last_f + 1])
        tail.append(prog[last_f + 1:])
    rank = {op: i for prog in tail for i, op in enumerate(prog)}
    producers = {op: _producers(op[0], op[1], op[2], S, block.offsets)
                 for prog in programs for op in prog}
    done = {}
    out = [[] for _ in range(p)]
    free_at = [0.0] * p
    pos = [0] * p
    pending = [list(t) for t in tail]
    waiters = {}
    heap = [(0.0, d) for d in range(p)]
    total = sum(len(x) for x in programs)

    def ready_at(op):
        t = 0.0
        for q in producers[op]:
            if q not in done:
                return None
            t = max(t, done[q])
        return t

    def wait(d, ops):
        for op in ops:
            for q in producers[op]:
                if q not in done:
                    waiters.setdefault(q, set()).add(d)

    while heap:
        now, d = heapq.heappop(heap)
        if now != free_at[d]:
            continue  # stale entry
        if pos[d] < len(fixed[d]):
            op = fixed[d][pos[d]]
            t = ready_at(op)
            if t is None:
                wait(d, [op])
                continue
            pos[d] += 1
        else:
            best = None
            for cand in pending[d]:
                t = ready_at(cand)
                if t is None:
                    continue
                key = (max(t, now), cand[0] == "W", rank[cand])
                if best is None or key < best[0]:
                    best = (key, cand, t)
            if best is None:
                if pending[d]:
                    wait(d, pending[d])
                continue
            _key, op, t = best
            pending[d].remove(op)
        begin = max(now, t)
        free_at[d] = begin + dur[op[0]]
        done[op] = free_at[d]
        out[d].append(op)
        if pos[d] < len(fixed[d]) or pending[d]:
            heapq.heappush(heap, (free_at[d], d))
        for e in waiters.pop(op, ()):
            if e != d:
                heapq.heappush(heap, (free_at[e], e))
    if len(done) < total:  # pragma: no cover - the layout order is always feasible
        raise RuntimeError("cool-down reordering stalled")
    return out


def repeat(block: BuildingBlock, microbatches: int) -> Repeated:
    """Repeat a block for ``microbatches`` microbatches at its interval.

    Parameters
    ----------
    block : BuildingBlock
    microbatches : int
        m >= 1.

    Returns
    -------
    Repeated
        Call ``.squeeze()`` for the schedule.

    Raises
    ------
    ValueError
        If ``microbatches`` is not an int >= 1.
    """
    if not isinstance(block, BuildingBlock):
        raise InputError(f"'block' must be a BuildingBlock (got {type(block).__name__})")
    return Repeated(block, _check_int("microbatches", microbatches, minimum=1))


def _place_w(offsets, placement, stage_order, interval):
    """Put each W in the first free unit slot after its B (slots modulo the interval)."""
    T = int(interval)
    taken = {}  # per device, kept up to date (a scan per stage was quadratic)
    for (_k, st), t in offsets.items():
        taken.setdefault(placement[st], set()).add(int(t) % T)
    for s in stage_order:
        d = placement[s]
        t = int(offsets[("B", s)]) + 1
        while t % T in taken.setdefault(d, set()):
            t += 1
        offsets[("W", s)] = float(t)
        taken[d].add(t % T)


def v_block(devices: int, down: int, up: int, turn_bottom: int, turn_top: int, shift: int,
            name: str, turn_bottom_back: int | None = None) -> BuildingBlock:
    """A V-shaped block with uniform offsets, unit op times and interval 6.

    Device d holds stages d (chunk 0) and 2p-1-d (chunk 1). Forward chunk 0
    goes down the devices with offset ``down``, turns at device p-1 after
    ``turn_bottom`` and comes back up with offset ``up``; the backward of
    chunk 1 starts ``1 + shift`` after the last forward, goes down with
    ``down``, turns after ``turn_bottom_back`` (default ``turn_bottom``) and
    goes up with ``up``. Each W takes the first free slot after its B.

    Parameters
    ----------
    devices : int
        p >= 1.
    down, up : int
        Offsets between neighbouring devices for passes moving down (F of
        chunk 0, B of chunk 1) and up (F of chunk 1, B of chunk 0).
    turn_bottom, turn_top : int
        Offsets at the bottom turn (F of stage p-1 to F of stage p) and at
        the top (F of stage 2p-1 to B of stage 2p-1, before ``shift``).
    shift : int
        Extra delay before the backward of the last stage (avoids
        collisions).
    name : str
        Label of the block.
    turn_bottom_back : int, optional
        Offset from B of stage p to B of stage p-1.

    Returns
    -------
    BuildingBlock

    Raises
    ------
    ValueError
        If the offsets make copies collide or break a dependency.
    """
    p = _check_int("devices", devices, minimum=1)
    S = 2 * p
    placement = [s if s < p else 2 * p - 1 - s for s in range(S)]
    o = {}
    for s in range(p):
        o[("F", s)] = down * s
    for s in range(p, S):
        o[("F", s)] = down * (p - 1) + turn_bottom + up * (s - p)
    o[("B", S - 1)] = o[("F", S - 1)] + turn_top + shift
    for s in range(S - 2, p - 1, -1):
        o[("B", s)] = o[("B", s + 1)] + down
    back_turn = turn_bottom if turn_bottom_back is None else turn_bottom_back
    o[("B", p - 1)] = o[("B", p)] + back_turn
    for s in range(p - 2, -1, -1):
        o[("B", s)] = o[("B", s + 1)] + up
    # W fills free slots in the order the B ops run.
    order = sorted(range(S), key=lambda s: o[("B", s)])
    _place_w(o, placement, order, 6)
    return BuildingBlock(tuple(placement), o, 6.0, name=name)


def v_min(devices: int) -> BuildingBlock:
    """V-Min: offsets of 1 everywhere; peak (p+4)//3 M.

    From the paper's offset table for V-Min (by d mod 3): when p is a
    multiple of 3 the last stage's backward waits 2 more slots so the copies
    do not collide. The stated bubble needs W + 2B >= 2F and W + 2F >= 2B.

    Parameters
    ----------
    devices : int

    Returns
    -------
    BuildingBlock

    Raises
    ------
    ValueError
        If ``devices`` is not an int >= 1.
    """
    p = devices
    return v_block(p, down=1, up=1, turn_bottom=1, turn_top=1, shift=2 if p % 3 == 0 else 0,
                   name="v-min")


def v_half(devices: int) -> BuildingBlock:
    """V-Half: offset 2 down, 1 up; peak (p+2)//2 M.

    From the paper's offset table for V-Half (by d parity): with p even the
    last stage's backward waits 3 more slots; the backward turns at the
    bottom after 2 slots.

    Parameters
    ----------
    devices : int

    Returns
    -------
    BuildingBlock

    Raises
    ------
    ValueError
        If ``devices`` is not an int >= 1.
    """
    p = devices
    return v_block(p, down=2, up=1, turn_bottom=1, turn_top=1, shift=3 if p % 2 == 0 else 0,
                   name="v-half", turn_bottom_back=2)


def v_zb(devices: int) -> BuildingBlock:
    """V-ZB: offset 4 down, 2 up; peak p M and no bubble in the steady phase.

    The turns (3 slots at the bottom, 1 at the top) are those of ZB-V's
    steady phase, which this block repeats.

    Parameters
    ----------
    devices : int

    Returns
    -------
    BuildingBlock

    Raises
    ------
    ValueError
        If ``devices`` is not an int >= 1.
    """
    return v_block(devices, down=4, up=2, turn_bottom=3, turn_top=1, shift=0, name="v-zb")

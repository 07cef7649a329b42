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

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..core.ops import InputError
from ..core.schedule import Schedule, check_int
from .block_kernels import _squeeze
from .block_squeeze import _KIND_ORDER, _layout_times
from .docsections import complete

__all__ = ["BuildingBlock", "Repeated", "repeat", "v_min", "v_half", "v_zb", "v_block"]



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
            ``"F"``, ``"B"``, ``"W"`` or ``"BW"``.

        Returns
        -------
        float
            The duration the block gives that kind.

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
            The op's kind.
        stage : int
            The op's stage, in model order.

        Returns
        -------
        float
            Its start offset plus its kind's duration.

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
            The stage, in model order.

        Returns
        -------
        float
            In block time units; at most ``ceil(lifespan / interval)``
            microbatches of the stage are alive at once.

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
        return _layout_times(self.block, self.microbatches)

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
            If the kernels' time grids would exceed
            ``block_kernels._GRID_BYTES_MAX``.

        Notes
        -----
        From 4,096 ops on the integer time grid the reordering runs as
        Numba kernels (``kernels/vreorder.py``, ``kernels/vcooldown.py``,
        driven by ``schedules/block_kernels.py``) that give the same
        programs as the Python version (``schedules/block_squeeze.py``,
        the tested reference).
        """
        return _squeeze(self.block, self.microbatches, name or self.block.name, reorder)


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
    return Repeated(block, check_int("microbatches", microbatches, minimum=1))


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
        Placement d, 2p-1-d on device d; unit op times; interval 6.

    Raises
    ------
    ValueError
        If ``devices`` is not an int >= 1, or the offsets make copies
        collide or break a dependency.
    """
    p = check_int("devices", devices, minimum=1)
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


def _v_catalogue(make):
    """Give a block of the V catalogue the shared Parameters, Returns and Raises."""
    return complete(make, {"devices": ("int", "p >= 1.")}, "BuildingBlock",
                    "ValueError\n    If ``devices`` is not an int >= 1.")


@_v_catalogue
def v_min(devices: int) -> BuildingBlock:
    """V-Min: offsets of 1 everywhere; peak (p+4)//3 M.

    From the paper's offset table for V-Min (by d mod 3): when p is a
    multiple of 3 the last stage's backward waits 2 more slots so the copies
    do not collide. The stated bubble needs W + 2B >= 2F and W + 2F >= 2B.
    """
    return v_block(devices, down=1, up=1, turn_bottom=1, turn_top=1,
                   shift=2 if devices % 3 == 0 else 0, name="v-min")


@_v_catalogue
def v_half(devices: int) -> BuildingBlock:
    """V-Half: offset 2 down, 1 up; peak (p+2)//2 M.

    From the paper's offset table for V-Half (by d parity): with p even the
    last stage's backward waits 3 more slots; the backward turns at the
    bottom after 2 slots.
    """
    return v_block(devices, down=2, up=1, turn_bottom=1, turn_top=1,
                   shift=3 if devices % 2 == 0 else 0, name="v-half", turn_bottom_back=2)


@_v_catalogue
def v_zb(devices: int) -> BuildingBlock:
    """V-ZB: offset 4 down, 2 up; peak p M and no bubble in the steady phase.

    The turns (3 slots at the bottom, 1 at the top) are those of ZB-V's
    steady phase, which this block repeats.
    """
    return v_block(devices, down=4, up=2, turn_bottom=3, turn_top=1, shift=0, name="v-zb")

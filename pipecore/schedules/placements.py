"""Placements: which device runs each stage, the first of a composition's three choices.

A placement is a stage -> device map, stages in model order. The named ones
are the layouts the families use; any list of device numbers is a placement
too, as long as every device from 0 up holds a stage. A placement of two
chains (``bidirectional``, Chimera's) maps the stages twice, once per
pipeline; each pipeline carries half the microbatches.
"""

from __future__ import annotations

import inspect
import math
from dataclasses import dataclass

import numpy as np

from ..core.ops import InputError, check_int
from ..core.sizes import MAX_INT32, check_size
from .docsections import complete

__all__ = ["Placement", "linear", "looped", "v", "wave", "bidirectional", "NAMES", "resolve"]


@dataclass(frozen=True)
class Placement:
    """Device of each stage, stages in model order.

    Attributes
    ----------
    device_of : tuple of int
        ``device_of[s]`` runs stage s; devices are numbered from 0 without
        gaps. With two chains, ``device_of[c * S + s]`` runs stage s of
        pipeline c.
    name : str
        ``"linear"``, ``"looped"``, ``"v"``, ``"wave"``, ``"bidirectional"``
        or ``"custom"``.
    chains : int, default 1
        Pipelines over the same stages: 1, or 2 (each stage has a replica
        per pipeline, microbatches ``0..m/2-1`` go through the first and the
        rest through the second).
    """

    device_of: tuple
    name: str = "custom"
    chains: int = 1

    def __post_init__(self):
        try:  # a tuple: hashable, and a list given here cannot change under it
            object.__setattr__(self, "device_of", tuple(self.device_of))
        except TypeError:
            raise InputError(f"placement: 'device_of' must be a sequence of device numbers, "
                             f"one per stage (got {self.device_of!r:.60})") from None
        _check(self.device_of)
        if self.chains not in (1, 2) or isinstance(self.chains, bool):
            raise InputError(f"placement 'chains' must be 1 or 2 (got {self.chains!r})")
        if len(self.device_of) % self.chains:
            raise InputError(f"placement: {len(self.device_of)} entries do not split into "
                             f"{self.chains} chains of equal length")

    @property
    def devices(self) -> int:
        """int: devices p (the largest device number + 1)."""
        return max(self.device_of) + 1

    @property
    def stages(self) -> int:
        """int: stages S (of the model; a chain's length)."""
        return len(self.device_of) // self.chains

    def as_array(self) -> np.ndarray:
        """The map as an int64 array, one entry per stage of each chain (S x chains).

        Returns
        -------
        numpy.ndarray
        """
        return np.asarray(self.device_of, dtype=np.int64)

    def __len__(self):
        return len(self.device_of)

    def __iter__(self):
        return iter(self.device_of)


def _check(device_of):
    if len(device_of) == 0:
        raise InputError("a placement needs at least one stage (got an empty list)")
    for s, d in enumerate(device_of):
        if isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0:
            raise InputError(f"placement: stage {s} has device {d!r}; devices are ints >= 0")
    # S stages fill at most devices 0..S-1: a larger device number leaves a gap,
    # and the gaps are looked for among the first S + 8 numbers only (never a
    # range as long as the largest number, which the input bounds not at all).
    n, top = len(device_of), max(device_of)
    if top < n:
        # A byte per device, not a set (some 50 bytes an entry): laying out a
        # named placement must stay within the size guard's bytes per stage.
        held = bytearray(top + 1)
        for d in device_of:
            held[d] = 1
        if held.count(0) == 0:
            return
    used = set(device_of)
    missing = [d for d in range(min(top + 1, n + 8)) if d not in used][:8]
    beyond = ""
    if top >= n:
        fill = "stages fill" if n > 1 else "stage fills"
        beyond = f"; stage {device_of.index(top)} has device {top}, but {n} {fill} at most devices 0..{n - 1}"
    raise InputError(f"placement: device{'s' if len(missing) > 1 else ''} "
                     f"{', '.join(map(str, missing))}{' ...' if top + 1 - len(used) > len(missing) else ''} "
                     f"hold{'' if len(missing) > 1 else 's'} no stage; number the devices from 0 "
                     f"without gaps (devices used: {len(used)} of 0..{top}){beyond}")


# Bytes one stage of a named placement takes while it is laid out and checked
# (a tuple slot, an int object, the check's byte; linear's peak, measured with
# tracemalloc, is the most), with a margin: the size guard's estimate.
_BYTES_PER_STAGE = 48


def _lay_out(name, devices, *, back=False, chains=1, **laps):
    """Named placement ``name`` on p = ``devices``: the stages go down the
    devices 0..p-1 and, with ``back``, up again p-1..0; the pattern repeats as
    often as the one count in ``laps`` says (chunks or waves; once without).

    Every named placement is one of these. The counts are checked, and the
    stages put to the size guard (core/sizes.py), before any is laid out.
    """
    p = check_int("devices", devices, minimum=1)
    counts = {key: check_int(key, value, minimum=1) for key, value in laps.items()}
    repeats = math.prod(counts.values())
    shown = ", ".join(f"{key}={value}" for key, value in {"devices": p, **counts}.items())
    check_size(f"placements.{name}({shown})", (2 if back else 1) * p * repeats, "stages",
               limit=MAX_INT32, rule=f"an op table numbers stages with int32 (at most {MAX_INT32:,})",
               bytes_each=_BYTES_PER_STAGE, purpose="to lay out")
    down = tuple(range(p))
    return Placement((down + down[::-1] if back else down) * repeats, name, chains=chains)


def _named(make):
    """Give a named placement the sections all of them share: ``devices``
    first among its Parameters, the Returns, and the Raises naming its counts
    (its parameters)."""
    counts = " or ".join(inspect.signature(make).parameters)
    return complete(make, {"devices": ("int", "p >= 1.")}, "Placement", f"""
        ValueError
            If {counts} < 1, or the stages exceed int32.
        MemoryError
            (:class:`~pipecore.CapacityError`) if its stages would not fit in
            the memory available (checked before any is laid out).
        """)


@_named
def linear(devices: int) -> Placement:
    """Stage d on device d: one stage per device (GPipe, 1F1B, ZB-H1/H2)."""
    return _lay_out("linear", devices)


@_named
def looped(devices: int, chunks: int = 2) -> Placement:
    """Stage s on device s mod p: v chunks per device in a loop (interleaved 1F1B, looped BFS).

    Parameters
    ----------
    chunks : int, default 2
        v >= 1 stages per device.
    """
    return _lay_out("looped", devices, chunks=chunks)


@_named
def v(devices: int) -> Placement:
    """Stages d and 2p-1-d on device d: the V of ZB-V and DualPipeV."""
    return _lay_out("v", devices, back=True)


@_named
def wave(devices: int, waves: int = 1) -> Placement:
    """Hanayo's zig-zag: 2W stages per device, every turn on one device.

    Stage s with r = s mod 2p runs on device r for r < p, else on 2p-1-r;
    one wave is the V.

    Parameters
    ----------
    waves : int, default 1
        W >= 1.
    """
    return _lay_out("wave", devices, back=True, waves=waves)


@_named
def bidirectional(devices: int) -> Placement:
    """Chimera's two pipelines: stage s on device s going down and on device
    p-1-s going up, each pipeline with half the microbatches.

    Every device holds two stage replicas (twice a linear device's weights);
    a stage's replicas synchronise their gradients with an all-reduce (AR)
    at the end of each device's program.
    """
    return _lay_out("bidirectional", devices, back=True, chains=2)


NAMES = ("linear", "looped", "v", "wave", "bidirectional")


def resolve(placement, devices=None, chunks=None, waves=None) -> Placement:
    """A :class:`Placement` from a name, a list of devices or a Placement.

    Parameters
    ----------
    placement : str, sequence of int or Placement
        A name of :data:`NAMES` (needs ``devices``; ``looped`` takes
        ``chunks``, ``wave`` takes ``waves``) or a stage -> device list.
    devices : int, optional
        p; with a list it must equal the list's device count.
    chunks, waves : int, optional
        For ``looped`` and ``wave``.

    Returns
    -------
    Placement

    Raises
    ------
    ValueError
        For an unknown name, a name without ``devices``, an option the
        placement does not take, or a list whose devices have gaps or do not
        match ``devices``.
    """
    if isinstance(placement, str):
        key = placement.lower()
        if key not in NAMES:
            raise InputError(f"unknown placement {placement!r}; named placements: "
                             f"{', '.join(NAMES)}, or a list of devices, one per stage")
        if devices is None:
            raise InputError(f"placement {placement!r} needs 'devices'")
        if chunks is not None and key != "looped":
            raise InputError(f"placement {key!r} takes no 'chunks' (only 'looped' does)")
        if waves is not None and key != "wave":
            raise InputError(f"placement {key!r} takes no 'waves' (only 'wave' does)")
        if key == "looped":
            return looped(devices, 2 if chunks is None else chunks)
        if key == "wave":
            return wave(devices, 1 if waves is None else waves)
        if key == "bidirectional":
            return bidirectional(devices)
        return linear(devices) if key == "linear" else v(devices)
    if chunks is not None or waves is not None:
        raise InputError("'chunks' and 'waves' go with a named placement ('looped', 'wave'); "
                         "a list of devices already fixes them")
    if not isinstance(placement, Placement):
        try:
            ndim = np.ndim(placement)
        except (ValueError, TypeError, UnicodeDecodeError):  # ragged lists, undecodable bytes
            ndim = None
        if ndim != 1:
            raise InputError(f"'placement' must be a name, a Placement or a list of devices, "
                             f"one per stage (got {placement!r})")
        placement = Placement(tuple(int(d) if isinstance(d, (int, np.integer))
                                    and not isinstance(d, bool) else d for d in placement))
    if devices is not None:
        p = check_int("devices", devices, minimum=1)
        if p != placement.devices:
            raise InputError(f"'devices' is {p} but the placement uses {placement.devices} "
                             f"devices (0..{placement.devices - 1})")
    return placement

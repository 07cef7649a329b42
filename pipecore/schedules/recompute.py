"""Activation recompute: drop a forward's activations and recompute them
(an R op) just before the backward that needs them.

An F whose (stage, microbatch) has an R keeps only ``Costs.checkpoint``;
the R, which takes ``Costs.r`` (default ``f``), allocates the rest of the
activation; B, W and BW free as usual. The R depends on its F only, so a
device runs it while its B still waits for the gradient from downstream.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from ..core.ops import InputError, check_type
from ..core.schedule import BW, B, R, Schedule, refuse_factors

__all__ = ["recompute"]


def _index_set(name, values, upper):
    if values is None:
        return None
    if isinstance(values, (int,)) and not isinstance(values, bool):
        values = [values]
    if not isinstance(values, Iterable) or isinstance(values, (str, bytes)):
        raise InputError(f"'{name}' must be an int, an iterable of ints or None (got {values!r})")
    out = set()
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < upper:
            raise InputError(f"'{name}' entries must be ints in 0..{upper - 1} (got {v!r})")
        out.add(int(v))
    return out


def recompute(schedule: Schedule, stages=None, microbatches=None, name: str | None = None) -> Schedule:
    """Recompute the activations of some stages instead of keeping them.

    An R op is inserted on each chosen (stage, microbatch)'s device right
    before its backward (B or BW, or the overlapped F&B unit holding it).

    Parameters
    ----------
    schedule : Schedule
        A valid schedule.
    stages : int or iterable of int, optional
        Stages to recompute (default: every stage). This is the per-stage
        choice: all microbatches of a chosen stage are recomputed.
    microbatches : int or iterable of int, optional
        Restrict recompute to these microbatches (default: all), for a
        per-op choice.
    name : str, optional
        Name of the new schedule (default ``"<name>+r"``).

    Returns
    -------
    Schedule
        A validated schedule with the same placement.

    Raises
    ------
    ValueError
        If a stage or microbatch index is out of range, or a chosen
        (stage, microbatch) is already recomputed.
    ScheduleError
        If the input schedule is not valid.
    """
    check_type("schedule", schedule, Schedule, "a pipecore.Schedule")
    refuse_factors(schedule, "recompute (its new schedule would drop them)")
    st = schedule._info()  # validates
    S, m = st.stages, st.microbatches
    chosen_s = _index_set("stages", stages, S)
    chosen_m = _index_set("microbatches", microbatches, m)
    # Column arithmetic on the op table (rows sorted by device, slot): the
    # per-op Python loop this replaces took seconds at 100k ops in tune.
    dev = schedule._column("device")
    slot = schedule._column("slot")
    stage = schedule._column("stage").astype(np.int64)
    mb = schedule._column("microbatch").astype(np.int64)
    kind = schedule.kind_codes
    n = len(kind)
    back = (kind == B) | (kind == BW)
    if chosen_s is not None:
        pick = np.zeros(S, dtype=bool)
        pick[list(chosen_s)] = True
        back &= pick[stage]
    if chosen_m is not None:
        pick = np.zeros(m, dtype=bool)
        pick[list(chosen_m)] = True
        back[back] &= pick[mb[back]]
    rb = np.flatnonzero(back)
    has_r = kind == R
    if has_r.any():
        present = np.zeros(S * m, dtype=bool)
        present[stage[has_r] * m + mb[has_r]] = True
        clash = rb[present[stage[rb] * m + mb[rb]]]
        if clash.size:  # the first in program order, as a scan of the programs meets it
            s, j = int(stage[clash[0]]), int(mb[clash[0]])
            raise InputError(f"stage {s} microbatch {j} is already recomputed "
                             f"(the schedule has {s}R{j})")
    # A unit is one slot of a device program (an F&B pair is one unit of
    # two rows); each R goes right before the unit holding its backward.
    head = np.ones(n, dtype=bool)
    head[1:] = (dev[1:] != dev[:-1]) | (slot[1:] != slot[:-1])
    unit = np.cumsum(head) - 1
    first_row = np.flatnonzero(head)
    r_per_unit = np.bincount(unit[rb], minlength=len(first_row))
    total = n + len(rb)
    old_at = np.arange(n) + np.cumsum(r_per_unit)[unit]
    # The k-th R (row order) of unit u lands at u's first row plus every R
    # of units up to u before it: first_row[u] + k.
    r_at = first_row[unit[rb]] + np.arange(len(rb))
    new_dev = np.empty(total, dtype=np.int32)
    new_kind = np.empty(total, dtype=np.int8)
    new_stage = np.empty(total, dtype=np.int32)
    new_mb = np.empty(total, dtype=np.int32)
    new_head = np.ones(total, dtype=bool)
    for out, col, r_val in ((new_dev, dev, dev[rb]), (new_kind, kind, R),
                            (new_stage, stage, stage[rb]), (new_mb, mb, mb[rb]),
                            (new_head, head, True)):
        out[old_at] = col
        out[r_at] = r_val
    # Slots renumbered 0.. per device, as a program list's positions are.
    new_unit = np.cumsum(new_head) - 1
    dev_head = np.searchsorted(new_dev, new_dev)  # each row's device's first row
    new_slot = (new_unit - new_unit[dev_head]).astype(np.int32)
    return Schedule.from_arrays(new_dev, new_slot, new_kind, new_stage, new_mb,
                                name=name or f"{schedule.name}+r", devices=schedule.devices,
                                replicated=schedule.replicated,
                                offload_to=getattr(schedule, "offload_to", None),
                                frozen=getattr(schedule, "frozen", ()),
                                params=dict(getattr(schedule, "params", {}) or {}), copy=False)

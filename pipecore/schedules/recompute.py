"""Activation recompute: drop a forward's activations and recompute them
(an R op) just before the backward that needs them.

An F whose (stage, microbatch) has an R keeps only ``Costs.checkpoint``;
the R, which takes ``Costs.r`` (default ``f``), allocates the rest of the
activation; B, W and BW free as usual. The R depends on its F only, so a
device runs it while its B still waits for the gradient from downstream.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..core.schedule import Schedule, _as_ops

__all__ = ["recompute"]


def _index_set(name, values, upper):
    if values is None:
        return None
    if isinstance(values, (int,)) and not isinstance(values, bool):
        values = [values]
    if not isinstance(values, Iterable) or isinstance(values, (str, bytes)):
        raise ValueError(f"'{name}' must be an int, an iterable of ints or None (got {values!r})")
    out = set()
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < upper:
            raise ValueError(f"'{name}' entries must be ints in 0..{upper - 1} (got {v!r})")
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
    if not isinstance(schedule, Schedule):
        raise ValueError(f"'schedule' must be a pipecore.Schedule (got {type(schedule).__name__})")
    st = schedule._info()  # validates
    S, m = st["stages"], st["microbatches"]
    chosen_s = _index_set("stages", stages, S)
    chosen_m = _index_set("microbatches", microbatches, m)
    programs = schedule.programs()
    present = {(s, j) for prog in programs for unit in prog for k, s, j in _as_ops(unit) if k == "R"}
    out = []
    for prog in programs:
        new = []
        for unit in prog:
            for k, s, j in _as_ops(unit):
                if k in ("B", "BW") and (chosen_s is None or s in chosen_s) and (
                        chosen_m is None or j in chosen_m):
                    if (s, j) in present:
                        raise ValueError(f"stage {s} microbatch {j} is already recomputed "
                                         f"(the schedule has {s}R{j})")
                    new.append(("R", s, j))
            new.append(unit)
        out.append(new)
    return Schedule.from_programs(out, name=name or f"{schedule.name}+r", devices=schedule.devices,
                                  replicated=schedule.replicated,
                                  params=dict(getattr(schedule, "params", {}) or {}))

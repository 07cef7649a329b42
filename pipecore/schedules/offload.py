"""Activation offload: an F's activations go to host memory over the
device's host link (an O op) and come back (an L op) before the backward;
or, with ``to``, to another device's memory over the link between the two
(BPipe's activation balancing).

The O and L take no compute time; each issues a copy of ``Costs.offload``
(``Costs.evict`` to a partner device) on its direction of the link, one
copy at a time in issue order. The copy to host frees the activation when it ends; the copy back
starts no earlier than the L, the end of the copy to host and the end of
the previous copy back, and allocates the activation when it starts; the
backward waits for it to end.
"""

from __future__ import annotations

from ..core.ops import InputError, check_type
from ..core.schedule import Schedule, _as_ops, check_int, refuse_factors
from .recompute import _index_set

__all__ = ["offload"]


def offload(schedule: Schedule, stages=None, microbatches=None, prefetch: int = 1,
            name: str | None = None, to=None) -> Schedule:
    """Offload the activations of some (stage, microbatch)s to host memory
    (or to a partner device's).

    An O op goes right after each chosen F (after its unit when it is half
    of an overlapped F&B pair) and an L op ``prefetch`` units before the
    unit holding the backward (B or BW), but never before the O.

    Parameters
    ----------
    schedule : Schedule
        A valid schedule.
    stages : int or iterable of int, optional
        Stages to offload (default every stage).
    microbatches : int or iterable of int, optional
        Restrict to these microbatches (default all): the per-op choice.
    prefetch : int, default 1
        How many units ahead of the backward the L issues its copy back, so
        the copy can hide behind compute (0: right before the backward).
    name : str, optional
        Name of the new schedule (default ``"<name>+o"``).
    to : sequence of int, optional
        Where each device's offloads wait (``Schedule.offload_to``): entry
        d another device, whose memory holds them, or -1 for host. Default:
        the schedule's own (host when it has none).

    Returns
    -------
    Schedule
        A validated schedule with the same placement; simulate it with
        ``Costs(offload=...)`` (copies to host) and ``Costs(evict=...)``
        (copies to a partner device).

    Raises
    ------
    ValueError
        If an index is out of range, ``prefetch`` is not an int >= 0, a
        chosen (stage, microbatch) is already offloaded or recomputed, or
        ``to`` is not one entry per device, each -1 or another device.
    ScheduleError
        If the input schedule is not valid.
    """
    check_type("schedule", schedule, Schedule, "a pipecore.Schedule")
    refuse_factors(schedule, "offload (its new schedule would drop them)")
    prefetch = check_int("prefetch", prefetch, minimum=0)
    st = schedule._info()  # validates
    S, m = st.stages, st.microbatches
    chosen_s = _index_set("stages", stages, S)
    chosen_m = _index_set("microbatches", microbatches, m)
    programs = schedule.programs()
    taken = {(s, j): k for prog in programs for unit in prog for k, s, j in _as_ops(unit)
             if k in ("R", "O")}

    def picked(s, j):
        return (chosen_s is None or s in chosen_s) and (chosen_m is None or j in chosen_m)

    out = []
    for prog in programs:
        # Where each chosen (stage, microbatch)'s F and backward units are.
        f_at, back_at = {}, {}
        for i, unit in enumerate(prog):
            for k, s, j in _as_ops(unit):
                if k == "F" and picked(s, j):
                    f_at[(s, j)] = i
                elif k in ("B", "BW") and picked(s, j):
                    back_at[(s, j)] = i
        for key in f_at:
            if key in taken:
                what = "offloaded" if taken[key] == "O" else "recomputed"
                raise InputError(f"stage {key[0]} microbatch {key[1]} is already {what}")
        after = {}   # unit index -> O ops to put after it
        before = {}  # unit index -> L ops to put before it
        for key, i in f_at.items():
            after.setdefault(i, []).append(("O",) + key)
            at = max(back_at[key] - prefetch, i + 1)
            before.setdefault(at, []).append(("L",) + key)
        new = []
        for i, unit in enumerate(prog):
            new += before.get(i, [])
            new.append(unit)
            new += after.get(i, [])
        out.append(new)
    return Schedule.from_programs(out, name=name or f"{schedule.name}+o", devices=schedule.devices,
                                  replicated=schedule.replicated,
                                  frozen=getattr(schedule, "frozen", ()),
                                  offload_to=getattr(schedule, "offload_to", None) if to is None
                                  else to,
                                  params=dict(getattr(schedule, "params", {}) or {}))

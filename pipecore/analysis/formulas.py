"""Closed-form predictions per family (equal stages, no communication)."""

from __future__ import annotations

import numpy as np

from ..core.costs import Costs
from ..core.ops import InputError
from ..core.schedule import Schedule
from ..schedules.registry import family

__all__ = ["formula"]


def formula(schedule: Schedule, costs: Costs | None = None) -> dict:
    """The family's closed-form makespan, bubble and peak activation.

    The formulas assume equal stages and zero communication; a schedule
    simulated with ``comm > 0`` or a network is expected to differ.

    Parameters
    ----------
    schedule : Schedule
        Built by :func:`pipecore.build` (its family and parameters are
        read from ``schedule.params``).
    costs : Costs, optional
        Scalar costs; defaults to ``Costs()``.

    Returns
    -------
    dict
        ``makespan``, ``bubble_time`` (idle time of one device),
        ``bubble_ratio`` (``1 - busy / makespan``), ``bubble_rate`` (the
        zero-bubble papers' ``bubble / (busy + bubble)``), ``peak_activation``
        (numpy array per device, in the units of ``costs.activation``),
        ``exact`` (False where the literature's formula is approximate), and
        from some families where not exact ``gap_cause``: what in the
        schedule the formula leaves out (compare's notes show it).

    Raises
    ------
    ValueError
        If the schedule was not built from a family, or a cost is a
        per-stage vector (the formulas assume equal stages), or it has
        frozen stages and its family no frozen closed form.
    """
    costs = Costs() if costs is None else costs
    fam_name = schedule.params.get("family")
    if fam_name is None:
        raise InputError(f"schedule {schedule.name!r} was not built by pipecore.build; "
                         f"closed forms exist only for the families")
    for name in ("f", "b", "w", "comm", "activation", "activation_w"):
        if np.ndim(getattr(costs, name)) != 0:
            raise InputError(f"closed forms assume equal stages: Costs '{name}' must be a "
                             f"scalar (got a vector)")
    p = schedule.params["devices"]
    m = schedule.params["microbatches"]
    v = schedule.params["chunks"]
    fam = family(fam_name)
    options = {k: schedule.params[k] for k in fam.options if k in schedule.params}
    frozen = schedule.params.get("frozen")
    if frozen:  # pipecore.freeze: the family's frozen closed form, where it has one
        from ..schedules.freeze import frozen_formula

        out = frozen_formula(fam_name, p, m, v, costs, frozen)
        busy, busy_max = out.pop("busy_mean"), out.pop("busy_max")
    else:
        out = dict(fam.formula(p, m, v, costs, **options))
        busy = m * (costs.f + costs.b + costs.w)
        # A family whose devices do unequal work gives its fullest device's busy time.
        busy_max = out.pop("busy_max", busy)
    out["bubble_ratio"] = 1.0 - busy / out["makespan"] if out["makespan"] else 0.0
    span = busy_max + out["bubble_time"]
    out["bubble_rate"] = out["bubble_time"] / span if span else 0.0
    out["peak_activation"] = np.asarray(out["peak_activation"], dtype=float)
    return out

"""Slow, obvious reference versions of code that pipecore runs vectorised.

Each function here is the straightforward per-op implementation a faster
one replaced; property tests assert the two give identical results.
"""

from pipecore.core.schedule import Schedule, _as_ops


def recompute_reference(schedule, stages=None, microbatches=None, name=None):
    """:func:`pipecore.recompute` by walking the per-device programs: an R
    before each chosen backward's unit, then the programs rebuilt.

    ``stages`` and ``microbatches`` are sets of ints or None (the public
    function checks and normalises its arguments before this point).
    """
    programs = schedule.programs()
    present = {(s, j) for prog in programs for unit in prog for k, s, j in _as_ops(unit)
               if k == "R"}
    out = []
    for prog in programs:
        new = []
        for unit in prog:
            for k, s, j in _as_ops(unit):
                if k in ("B", "BW") and (stages is None or s in stages) and (
                        microbatches is None or j in microbatches):
                    if (s, j) in present:
                        raise ValueError(f"stage {s} microbatch {j} is already recomputed "
                                         f"(the schedule has {s}R{j})")
                    new.append(("R", s, j))
            new.append(unit)
        out.append(new)
    return Schedule.from_programs(out, name=name or f"{schedule.name}+r",
                                  devices=schedule.devices, replicated=schedule.replicated,
                                  params=dict(getattr(schedule, "params", {}) or {}))

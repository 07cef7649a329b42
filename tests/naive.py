"""Slow, obvious reference versions of code that pipecore runs vectorised.

Each function here is the straightforward per-op implementation a faster
one replaced; property tests assert the two give identical results.
"""

import numpy as np

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
                                  params=dict(getattr(schedule, "params", {}) or {}),
                                  offload_to=getattr(schedule, "offload_to", None),
                                  frozen=getattr(schedule, "frozen", ()))


def device_peaks_reference(sched, arrays, chosen):
    """tune's per-device peak activation if ``chosen`` stages were
    recomputed, from event arrays over the whole table (what
    ``pipecore.search.tune._RecomputePeaks`` computes one device at a time).
    """
    st = sched._info()
    kind = sched.kind_codes
    stage = sched._column("stage")
    act, act_w, ckpt = arrays["activation"], arrays["activation_w"], arrays["checkpoint"]
    rec = np.zeros(sched.stages, dtype=bool)
    rec[list(chosen)] = True
    n = len(kind)
    delta = np.select([kind == 0, kind == 1, kind == 2, kind == 3],
                      [np.where(rec[stage], ckpt[stage], act[stage]),
                       -(act[stage] - act_w[stage]), -act_w[stage], -act[stage]], 0.0)
    # Two positions per row: an R event (before the row's unit) then the row.
    ev = np.zeros(2 * n)
    ev[1::2] = delta
    back = ((kind == 1) | (kind == 3)) & rec[stage]
    rows = np.flatnonzero(back)
    unit_head = rows - st.paired[rows]  # a paired B's unit starts at its F row
    ev[2 * unit_head] += act[stage[rows]] - ckpt[stage[rows]]
    ptr = st.dev_ptr
    out = np.zeros(sched.devices)
    for d in range(sched.devices):
        a, b = 2 * ptr[d], 2 * ptr[d + 1]
        if b > a:
            out[d] = max(0.0, float(np.cumsum(ev[a:b]).max()))
    return out


def adaptive_blocks_reference(p):
    """The adaptive V search's distinct blocks, enumerated on dict rows
    (what ``pipecore.schedules.adaptive_space._blocks`` does on slot tuples)."""
    from reference_adaptive import derive_reference as _derive

    from pipecore.schedules.adaptive_space import _LETTERS, _PERIOD, _with_w

    seen = set()
    out = []
    for f1 in range(1, _PERIOD):
        for b1 in range(1, _PERIOD):
            for bb1 in range(1, _PERIOD):
                if len({f1, b1, bb1}) < 3:
                    continue
                first = _with_w({"F": 0, "f": f1, "B": b1, "b": bb1})
                for d0 in range(1, _PERIOD):
                    for d1 in range(1, d0 + 1):
                        for len0 in (range(1, p) if d1 < d0 else (p - 1,)):
                            blk = _derive(first, d0, d1, len0, p)
                            if blk is None:
                                continue
                            key = tuple(tuple(r[c] for c in _LETTERS) for r in blk)
                            if key in seen:
                                continue
                            seen.add(key)
                            out.append(blk)
    return out


def steady_peak_reference(chain):
    """The adaptive V block's steady-state peak, counted with numpy."""
    best = 0
    for pos in chain:
        cnt = np.zeros(6, dtype=np.int64)
        for start, end in ((pos["F"], pos["w"]), (pos["f"], pos["W"])):
            for r in range(6):
                lo = (r - start) % 6
                span = end - start
                cnt[r] += 0 if lo >= span else (span - lo - 1) // 6 + 1
        best = max(best, int(cnt.max()))
    return best

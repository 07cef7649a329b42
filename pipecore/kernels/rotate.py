"""The construction kernel of the "rotate" order: per-chunk 1F1B visits at unit time.

After a warm-up of forwards (the deepest stage whose forward is ready first),
a device visits its chunks in turn, deepest first: a visit to a chunk runs
that chunk's next forward (if it has one left), its next backward, then (split
backward) the W of that backward. A chunk joins the rotation once its next
backward is ready when a visit starts (the deepest is always in). With no
forward left, the device runs the rotation's next backward when it is ready,
and otherwise the oldest pending W of the chunk it visited last; after its
last backward, that W first, then the rest, deepest chunk first. On the V
placement with a warm-up of 2p-1 forwards this is ZB-V's order (the zb-v
family, from PyTorch's ScheduleZBVZeroBubble). Same steps and commit rule as
``kernels/compose.py``; oracle in tests/reference_compose.py.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

from .codes import BW, B, F, W
from .compose import DEADLOCK, OK, WAIT_CAP, _seen, time_op


class Visits(NamedTuple):
    """Scratch of the rotation (``schedules.compose._visits`` makes it).

    Attributes
    ----------
    chunk : int64 (p,)
        Stage of the device's visit in progress.
    phase : int64 (p,)
        Next op of that visit: 0 forward, 1 backward, 2 W; -1 between visits.
    last : int64 (p,)
        Stage of the device's latest visit (or cool-down backward), -1 before.
    after_b : int64 (p,)
        1 when the device's latest op was a cool-down backward.
    joined : int64 (S,)
        1 once the stage is in its device's rotation.
    nw : int64 (S,)
        W's of each stage run so far (a stage's W's follow its backwards,
        which run in microbatch order).
    """

    chunk: np.ndarray
    phase: np.ndarray
    last: np.ndarray
    after_b: np.ndarray
    joined: np.ndarray
    nw: np.ndarray


@njit(cache=True, inline="always")
def _next_in_rotation(lo, hi, last, stages, eligible):
    """The stage after ``last`` in descending order among ``eligible`` ones
    (wrapping round); the deepest eligible one when ``last`` is not."""
    first = -1
    after = False
    found = -1
    for i in range(hi - 1, lo - 1, -1):
        s = stages[i]
        if not eligible[i - lo]:
            if s == last:
                after = True
            continue
        if first < 0:
            first = s
        if after and found < 0:
            found = s
        if s == last:
            after = True
    last_eligible = False
    for i in range(lo, hi):
        if stages[i] == last and eligible[i - lo]:
            last_eligible = True
    if not last_eligible:
        return first
    return found if found >= 0 else first


@njit(cache=True)
def rotate_kernel(layout, rules, st, vis, out, tm):
    """Run the rotation; write every device's program into ``out``.

    Parameters
    ----------
    layout : kernels.compose.Layout
    rules : kernels.compose.Rules
        ``warmup`` (forwards before the first visit) and ``cap`` are used.
    st : kernels.compose.State
        Scratch.
    vis : Visits
        Scratch.
    out : Columns
        Output, as :func:`kernels.compose.compose_kernel`.
    tm : kernels.compose.Timing
        As :func:`kernels.compose.compose_kernel`.

    Returns
    -------
    status : int
        OK or DEADLOCK.
    steps : int
        Steps taken.
    """
    dev_ptr = layout.dev_ptr
    stages = layout.dev_stages
    out_ptr = layout.out_ptr
    m = layout.m
    split = layout.split
    p = dev_ptr.shape[0] - 1
    S = stages.shape[0]
    warmup = rules.warmup
    limit = st.limit
    nf = st.nf
    nb = st.nb
    last_f = st.last_f
    last_b = st.last_b
    kf_of = st.kf
    kb_of = st.kb
    kw_of = st.kw
    pick_kind = st.pick_kind
    pick_stage = st.pick_stage
    pick_mb = st.pick_mb
    wait_kind = st.wait_kind
    v_chunk = vis.chunk
    v_phase = vis.phase
    v_last = vis.last
    after_b = vis.after_b
    joined = vis.joined
    nw = vis.nw
    o_kind = out.kind
    o_stage = out.stage
    o_mb = out.microbatch
    most = 0
    for d in range(p):
        most = max(most, dev_ptr[d + 1] - dev_ptr[d])
    eligible = np.zeros(most, np.bool_)
    timed = tm.on
    remaining = S * m * (3 if split else 2)
    t = 0
    while remaining > 0:
        moved = 0
        for d in range(p):
            pick_kind[d] = -1
            wait_kind[d] = -1
            lo = dev_ptr[d]
            hi = dev_ptr[d + 1]
            total = (hi - lo) * m
            kf = kf_of[d]
            kb = kb_of[d]
            c0 = stages[lo]
            kind = -1
            s = -1
            j = 0
            if kf < warmup[d]:
                # Warm-up: the deepest stage whose next forward is ready.
                for i in range(hi - 1, lo - 1, -1):
                    x = stages[i]
                    y = nf[x]
                    if y >= m:
                        continue
                    if x == c0 and nf[c0] - nb[c0] >= limit[d]:
                        if s < 0:
                            s, j, wait_kind[d] = x, y, WAIT_CAP
                        continue
                    if x == 0 or _seen(nf[x - 1], last_f[x - 1], t) > y:
                        s, j, kind = x, y, F
                        break
                    if s < 0:
                        s, j, wait_kind[d] = x, y, F
            elif kf < total or v_phase[d] >= 0:
                if v_phase[d] < 0:  # a new visit
                    for i in range(lo, hi):
                        x = stages[i]
                        y = nb[x]
                        if (joined[x] == 0 and y < m and _seen(nf[x], last_f[x], t) > y
                                and (x == S - 1 or _seen(nb[x + 1], last_b[x + 1], t) > y)):
                            joined[x] = 1
                    joined[stages[hi - 1]] = 1
                    for i in range(lo, hi):
                        eligible[i - lo] = joined[stages[i]] == 1 and nb[stages[i]] < m
                    c = _next_in_rotation(lo, hi, v_last[d], stages, eligible)
                    v_chunk[d] = c
                    v_last[d] = c
                    v_phase[d] = 0 if nf[c] < m else 1
                c = v_chunk[d]
                if v_phase[d] == 0:
                    y = nf[c]
                    if c == c0 and nf[c0] - nb[c0] >= limit[d]:
                        s, j, wait_kind[d] = c, y, WAIT_CAP
                    elif c == 0 or _seen(nf[c - 1], last_f[c - 1], t) > y:
                        s, j, kind = c, y, F
                    else:
                        s, j, wait_kind[d] = c, y, F
                elif v_phase[d] == 1:
                    y = nb[c]
                    if _seen(nf[c], last_f[c], t) > y and (
                            c == S - 1 or _seen(nb[c + 1], last_b[c + 1], t) > y):
                        s, j, kind = c, y, B
                    else:
                        s, j, wait_kind[d] = c, y, B
                else:
                    s, j, kind = c, nw[c], W
            elif kb < total:
                # Cool-down: the rotation's next backward, else a pending W.
                for i in range(lo, hi):
                    eligible[i - lo] = nb[stages[i]] < m
                c = _next_in_rotation(lo, hi, v_last[d], stages, eligible)
                y = nb[c]
                if _seen(nf[c], last_f[c], t) > y and (
                        c == S - 1 or _seen(nb[c + 1], last_b[c + 1], t) > y):
                    s, j, kind = c, y, B
                elif split and kb > kw_of[d]:
                    s = v_last[d] if v_last[d] >= 0 and nw[v_last[d]] < nb[v_last[d]] else -1
                    if s < 0:  # the deepest stage with a W pending
                        for i in range(hi - 1, lo - 1, -1):
                            if s < 0 and nw[stages[i]] < nb[stages[i]]:
                                s = stages[i]
                    j, kind = nw[s], W
                else:
                    s, j, wait_kind[d] = c, y, B
            elif split and kb > kw_of[d]:
                # After the last backward: its chunk's oldest W, then the
                # rest, deepest chunk first.
                last = v_last[d]
                if after_b[d] == 1 and last >= 0 and nw[last] < nb[last]:
                    s = last
                else:
                    for i in range(hi - 1, lo - 1, -1):
                        if s < 0 and nw[stages[i]] < nb[stages[i]]:
                            s = stages[i]
                j, kind = nw[s], W
            if kind < 0:
                pick_stage[d] = s
                pick_mb[d] = j
                continue
            if kind == B and not split:
                kind = BW
            pick_kind[d] = kind
            moved += 1
            row = out_ptr[d] + kf + kb + kw_of[d]
            if kind == F:
                last_f[s] = t
                nf[s] += 1
                kf_of[d] = kf + 1
                if v_phase[d] == 0:
                    v_phase[d] = 1
            elif kind == W:
                nw[s] += 1
                kw_of[d] += 1
                after_b[d] = 0
                if v_phase[d] == 2:
                    v_phase[d] = -1
            else:
                last_b[s] = t
                nb[s] += 1
                kb_of[d] = kb + 1
                if v_phase[d] == 1:
                    v_phase[d] = 2 if split else -1
                else:  # a cool-down backward
                    v_last[d] = s
                    after_b[d] = 1
            if timed:
                time_op(d, kind, s, j, m, tm)
            o_kind[row] = kind
            o_stage[row] = s
            o_mb[row] = j
        remaining -= moved
        if moved == 0:
            return DEADLOCK, t
        t += 1
    return OK, t

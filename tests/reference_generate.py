"""Plain-Python forms of ``schedules.generate``'s kernels, which the tests
compare the kernels with (tests/test_generate_memory.py).

The package's own pure-Python paths (``generate._greedy_python`` and
``generate._one_pass_python``, for small shapes) stay in the package: they
run at run time.
"""

from collections import deque

import numpy as np

from pipecore.core.ops import InputError
from pipecore.core.schedule import Schedule
from pipecore.kernels.codes import B as _B
from pipecore.kernels.codes import F as _F
from pipecore.kernels.codes import W as _W
from pipecore.schedules.generate import _greedy_setup


def memory_greedy_reference(placement, microbatches, costs=None, memory_limit=None, warmup=None,
                            w_fill=1.0, name="memory-greedy"):
    """``generate.memory_greedy`` in plain Python, step by step: the loop the
    kernel ``kernels.greedy.memory_greedy_kernel`` was ported from."""
    g = _greedy_setup(placement, microbatches, costs, memory_limit, warmup)
    placement, S, m, p = g.placement, g.S, g.m, g.p
    tf, tb, tw, comm, act, act_w = g.tf, g.tb, g.tw, g.comm, g.act, g.act_w
    stages_of, static, limit, reserve, cap = g.stages_of, g.static, g.limit, g.reserve, g.cap
    f_done = np.full((S, m), np.nan)  # finish times
    b_done = np.full((S, m), np.nan)
    next_f = [0] * S
    next_b = [0] * S
    pending_w = [deque() for _ in range(p)]
    free = [0.0] * p
    mem = list(static)
    ahead = [0] * p  # forwards on the device still waiting for their backward
    programs = [[] for _ in range(p)]
    total = 3 * S * m

    def arrival(done, s_from, j, s_to):
        t = done[s_from, j]
        if np.isnan(t):
            return None
        return t if placement[s_from] == placement[s_to] else t + comm[s_from]

    def propose(d):
        """(start, kind, stage) of device d's next op, or None if it must wait for others."""
        t0 = free[d]
        best_b = None
        for s in stages_of[d]:
            j = next_b[s]
            if j >= m or next_f[s] <= j:
                continue
            r = arrival(f_done, s, j, s) if s == S - 1 else arrival(b_done, s + 1, j, s)
            if r is not None and (best_b is None or (max(r, t0), -s) < best_b[:2]):
                best_b = (max(r, t0), -s, s)
        best_f = None
        if ahead[d] < cap[d]:
            for s in stages_of[d]:
                j = next_f[s]
                # Keep room for one microbatch of each later stage here, so an
                # early stage cannot fill the device and starve the way back.
                if j >= m or mem[d] + act[s] + reserve[s] > limit * (1 + 1e-9):
                    continue
                r = 0.0 if s == 0 else arrival(f_done, s - 1, j, s)
                if r is not None and (best_f is None or (max(r, t0), -s) < best_f[:2]):
                    best_f = (max(r, t0), -s, s)
        if best_b is not None and best_b[0] <= t0:
            return (t0, _B, best_b[2])
        if best_f is not None and best_f[0] <= t0:
            return (t0, _F, best_f[2])
        options = [x for x in (best_b and (best_b[0], _B, best_b[2]),
                               best_f and (best_f[0], _F, best_f[2])) if x]
        nxt = min(options) if options else None
        if pending_w[d]:
            s_w = pending_w[d][0][0]
            # A W goes into a gap only if the gap is long enough (scaled by
            # w_fill); otherwise it would push back the B or F about to arrive.
            if nxt is None or nxt[0] - t0 >= w_fill * tw[s_w]:
                return (t0, _W, s_w)
        return nxt

    proposals = [propose(d) for d in range(p)]
    for _ in range(total):
        live = [(pr[0], d) for d, pr in enumerate(proposals) if pr is not None]
        if not live:
            # Devices with work left (a device may hold no stage at all).
            stuck = [d for d in range(p) if any(next_b[s] < m for s in stages_of[d])
                     or pending_w[d]]
            raise InputError(f"memory_greedy cannot continue: devices {stuck or 'all'} wait on "
                             f"each other under memory_limit {limit:g} and warmup {cap}")
        t, d = min(live)
        _, kind, s = proposals[d]
        if kind == _F:
            j = next_f[s]
            next_f[s] += 1
            fin = t + tf[s]
            f_done[s, j] = fin
            mem[d] += act[s]
            ahead[d] += 1
        elif kind == _B:
            j = next_b[s]
            next_b[s] += 1
            fin = t + tb[s]
            b_done[s, j] = fin
            mem[d] -= act[s] - act_w[s]
            ahead[d] -= 1
            pending_w[d].append((s, j))
        else:
            s, j = pending_w[d].popleft()
            fin = t + tw[s]
            mem[d] -= act_w[s]
        free[d] = fin
        programs[d].append((("F", "B", "W")[kind], s, j))
        touched = {d}
        if kind == _F and s + 1 < S:
            touched.add(placement[s + 1])
        if kind == _B and s > 0:
            touched.add(placement[s - 1])
        for e in touched:
            proposals[e] = propose(e)
    return Schedule.from_programs(programs, name=name, devices=p)

"""The limit kernel: the least work a cost sweep can do (issue 14).

Given one schedule's ops in a dependency-respecting order, it computes only
each op's finish time, for many cost settings, 64 lanes at a time, over all
threads:

* F of stage s waits for F of stage s - 1 (same microbatch),
* B (or fused BW) of stage s waits for B of stage s + 1 and its own F,
* W waits for its B,
* a dependency that crosses devices adds the setting's ``comm``,
* each device runs its ops in program order.

No memory, no links, no metrics beyond the makespan. ``simulate_many``
without a network must give the same makespans bit for bit
(tests/test_limit_kernel.py); its rate as a fraction of this kernel's,
measured in the same run, is the figure bench/ tracks across machines.

This module is bench code, not pipecore: it uses pipecore only to read the
schedule's op table.
"""

from __future__ import annotations

import numba
import numpy as np
from numba import njit, prange

LANES = 64
_F, _B, _W, _BW = 0, 1, 2, 3


class Limit:
    """One schedule prepared for the limit kernel.

    Parameters
    ----------
    schedule : pipecore.Schedule
        Ops of kinds F, B, W and BW only, one op per program entry.

    Raises
    ------
    ValueError
        If the schedule has other kinds (R, O, L, AR) or its programs
        cannot run to completion.
    """

    def __init__(self, schedule):
        t = schedule.table
        kinds = [str(k) for k in t.column("kind").to_pylist()]
        bad = sorted(set(kinds) - {"F", "B", "W", "BW"})
        if bad:
            raise ValueError(f"the limit kernel handles F, B, W, BW ops only (got {bad})")
        dev = np.asarray(t.column("device").to_numpy(), dtype=np.int64)
        stage = np.asarray(t.column("stage").to_numpy(), dtype=np.int64)
        mb = np.asarray(t.column("microbatch").to_numpy(), dtype=np.int64)
        code = np.array([{"F": _F, "B": _B, "W": _W, "BW": _BW}[k] for k in kinds], dtype=np.int64)
        n = len(kinds)
        p = schedule.devices
        S = int(stage.max()) + 1
        row = {}
        for r in range(n):
            row[(code[r] if code[r] != _BW else _B, int(stage[r]), int(mb[r]))] = r
        deps = np.full((n, 2), -1, dtype=np.int64)
        for r in range(n):
            s, j = int(stage[r]), int(mb[r])
            if code[r] == _F:
                deps[r, 0] = row.get((_F, s - 1, j), -1)
            elif code[r] in (_B, _BW):
                deps[r, 0] = row.get((_B, s + 1, j), -1)
                deps[r, 1] = row[(_F, s, j)]
            else:
                deps[r, 0] = row[(_B, s, j)]
        # A dependency-respecting order: run the devices' programs round-robin.
        rows_of = [np.flatnonzero(dev == d) for d in range(p)]  # table rows are in (device, slot) order
        head = [0] * p
        done = np.zeros(n, dtype=bool)
        order = []
        progress = True
        while progress:
            progress = False
            for d in range(p):
                prog = rows_of[d]
                while head[d] < len(prog):
                    r = prog[head[d]]
                    if any(q >= 0 and not done[q] for q in deps[r]):
                        break
                    done[r] = True
                    order.append(r)
                    head[d] += 1
                    progress = True
        if len(order) != n:
            raise ValueError("the schedule's programs cannot run to completion")
        order = np.array(order, dtype=np.int64)
        pos = np.empty(n, dtype=np.int64)
        pos[order] = np.arange(n)
        # Everything in execution order; a dependency is a position, -1 for none.
        self.o_dev = dev[order]
        self.o_class = code[order]
        self.o_dep = np.where(deps[order] >= 0, pos[np.maximum(deps[order], 0)], -1)
        self.o_cross = np.zeros((n, 2), dtype=np.bool_)
        for k in range(2):
            has = self.o_dep[:, k] >= 0
            src_dev = self.o_dev[np.maximum(self.o_dep[:, k], 0)]
            self.o_cross[:, k] = has & (src_dev != self.o_dev)
        self.devices = p
        # Per-device-share costs to per-stage, as pipecore.Costs does for scalars.
        self.cdiv = S // p if S % p == 0 else 0
        self.stages = S

    def makespans(self, f, b, w, comm, threads=None):
        """Makespan of every cost setting (arrays of equal length).

        Parameters
        ----------
        f, b, w, comm : array_like
            One value per setting, per device share as in ``pipecore.Costs``.
        threads : int, optional
            Numba threads (default: all).

        Returns
        -------
        numpy.ndarray

        Raises
        ------
        ValueError
            If the arrays differ in length.
        """
        f, b, w, comm = (np.ascontiguousarray(x, dtype=np.float64) for x in (f, b, w, comm))
        if not f.shape == b.shape == w.shape == comm.shape:
            raise ValueError("f, b, w and comm must have the same length")
        out = np.empty(f.shape[0])
        n_threads = threads or numba.get_num_threads()
        groups = (f.shape[0] + LANES - 1) // LANES
        limit_kernel(self.o_dev, self.o_class, self.o_dep, self.o_cross, self.devices,
                     self.cdiv, self.stages, f, b, w, comm, out, max(1, min(n_threads, groups)))
        return out


@njit(cache=True, inline="always")
def _share(value, cdiv, p, n_stages):
    if cdiv > 0:
        return value / cdiv
    return value * p / n_stages


@njit(cache=True, parallel=True)
def limit_kernel(o_dev, o_class, o_dep, o_cross, p, cdiv, n_stages, f, b, w, comm, out, n_chunks):
    n = o_dev.shape[0]
    k_all = f.shape[0]
    groups = (k_all + LANES - 1) // LANES
    for c in prange(n_chunks):
        fin = np.empty((n, LANES))
        free = np.empty((p, LANES))
        cost = np.empty((4, LANES))
        lat = np.empty(LANES)
        t = np.empty(LANES)
        for g in range(c * groups // n_chunks, (c + 1) * groups // n_chunks):
            lo = g * LANES
            for i in range(LANES):
                k = min(lo + i, k_all - 1)
                fs = _share(f[k], cdiv, p, n_stages)
                bs = _share(b[k], cdiv, p, n_stages)
                ws = _share(w[k], cdiv, p, n_stages)
                cost[0, i] = fs
                cost[1, i] = bs
                cost[2, i] = ws
                cost[3, i] = bs + ws
                lat[i] = comm[k]
            for d in range(p):
                for i in range(LANES):
                    free[d, i] = 0.0
            for r in range(n):
                d = o_dev[r]
                for i in range(LANES):
                    t[i] = free[d, i]
                for j in range(2):
                    q = o_dep[r, j]
                    if q >= 0:
                        if o_cross[r, j]:
                            for i in range(LANES):
                                t[i] = max(t[i], fin[q, i] + lat[i])
                        else:
                            for i in range(LANES):
                                t[i] = max(t[i], fin[q, i])
                kc = o_class[r]
                for i in range(LANES):
                    e = t[i] + cost[kc, i]
                    fin[r, i] = e
                    free[d, i] = e
            for i in range(LANES):
                if lo + i < k_all:
                    top = 0.0
                    for d in range(p):
                        top = max(top, free[d, i])
                    out[lo + i] = top

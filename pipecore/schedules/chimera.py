"""Chimera (Li and Hoefler, SC'21): two pipelines in opposite directions.

The down pipeline runs stage i on device i, the up pipeline runs it on
device p-1-i, so every device holds two stage replicas (twice the weights).
Each unit of p microbatches sends its first p/2 down and the rest up; each
pipeline runs its share 1F1B-style. The per-device order is the authors'
(the runtime of github.com/Shigangli/Chimera, branch ChimeraBk, and the slot
generator on its main branch agree), restated in docs/research/bidirectional.md.
More microbatches are handled by direct concatenation of units.
"""

from __future__ import annotations

import numpy as np

from ..core.schedule import Schedule
from .registry import Family, register


def build_chimera(devices, microbatches, chunks=1, variant="direct"):
    """Chimera with direct concatenation of basic units.

    With h = p/2, device d runs "own" and "other" pipelines: for d < h own is
    down (stage d) and other is up (stage p-1-d), with a = h-d, b = d; for
    d >= h own is up (stage p-1-d), other is down (stage d), a = d-h+1,
    b = h-a. A unit is a x [own F], b x [other F, own F], a x [other F,
    other BW], b x [own BW, other BW], a x [own BW]; in every unit after the
    first, its a x [own F] becomes a x [own BW of the previous unit, own F]
    and the last a x [own BW] runs once at the end. Each stage's two
    replicas (devices d and p-1-d) end with a gradient all-reduce (AR): the
    other pipeline's just before the final a x [own BW] (after it on the two
    middle devices), the own pipeline's last. With a network, the exchange
    costs ``grad_bytes / bandwidth + latency``.

    Parameters
    ----------
    devices : int
        Pipeline devices p.
    microbatches : int
        Microbatches m.
    chunks : int
        Stages per device (fixed by the family where it takes none).

    Returns
    -------
    Schedule

    With ``variant="forward-doubling"`` (the paper's answer to a backward
    twice as long as a forward) each step covers two units and runs
    forwards in pairs: a x [own F, own F] (a x [own BW, own F, own F] after
    the first step), b x [other F, other F, own F, own F], a x [other F,
    other F, other BW], (b + p/2) x [own BW, other BW], and after the last
    step a x [own BW]. It needs m to be a multiple of 2p and holds about
    twice the activations.

    Raises
    ------
    ValueError
        If p is odd, m is not a multiple of p (2p for forward doubling), or
        the variant is unknown.
    """
    p, m = devices, microbatches
    if variant not in ("direct", "forward-doubling"):
        raise ValueError(f"'chimera' variant must be 'direct' or 'forward-doubling' "
                         f"(got {variant!r})")
    if variant == "forward-doubling" and (m % (2 * p) or p % 2):
        raise ValueError(f"'chimera' forward doubling needs an even number of devices and "
                         f"microbatches a multiple of 2 * devices = {2 * p} (got devices={p}, "
                         f"microbatches={m})")
    if p % 2:
        raise ValueError(f"'chimera' needs an even number of devices (got devices={p})")
    if m % p:
        raise ValueError(f"'chimera' needs microbatches to be a multiple of devices "
                         f"(got microbatches={m}, devices={p})")
    h = p // 2
    units = m // p
    down = [k * p + j for k in range(units) for j in range(h)]
    up = [k * p + h + j for k in range(units) for j in range(h)]
    programs = []
    for d in range(p):
        if d < h:
            own, other = ("down", d), ("up", p - 1 - d)
            a, b = h - d, d
        else:
            own, other = ("up", p - 1 - d), ("down", d)
            a, b = d - h + 1, h - (d - h + 1)
        queues = {"down": down, "up": up}
        nxt = {}

        def op(kind, pipe, nxt=nxt, queues=queues):
            name, stage = pipe
            key = (kind, name)
            k = nxt.get(key, 0)
            nxt[key] = k + 1
            return ("F" if kind == "F" else "BW", stage, queues[name][k])

        prog = []
        middle = d in (h - 1, h)
        if variant == "direct":
            for unit in range(units):
                for _ in range(a):
                    if unit > 0:
                        prog.append(op("B", own))
                    prog.append(op("F", own))
                for _ in range(b):
                    prog += [op("F", other), op("F", own)]
                for _ in range(a):
                    prog += [op("F", other), op("B", other)]
                for _ in range(b):
                    prog += [op("B", own), op("B", other)]
        else:
            for step in range(units // 2):
                for _ in range(a):
                    if step > 0:
                        prog.append(op("B", own))
                    prog += [op("F", own), op("F", own)]
                for _ in range(b):
                    prog += [op("F", other), op("F", other), op("F", own), op("F", own)]
                for _ in range(a):
                    prog += [op("F", other), op("F", other), op("B", other)]
                for _ in range(b + h):
                    prog += [op("B", own), op("B", other)]
        # Gradient all-reduce with the replica on device p-1-d: the other
        # pipeline's stage is done before the tail and syncs eagerly (the
        # authors' runtime), except on the two middle devices.
        if not middle:
            prog.append(("AR", other[1], None))
        prog += [op("B", own) for _ in range(a)]
        if middle:
            prog.append(("AR", other[1], None))
        prog.append(("AR", own[1], None))
        programs.append(prog)
    return Schedule.from_programs(programs, name="chimera", devices=p, replicated=True)


def formula_chimera(p, m, v, c, variant="direct"):
    """Bubble ratio (p-2)/(2m+p-2): p-2 idle slots per device beside 2m busy
    ones, counted with F and B in equal slots (the paper's unit-slot
    figures); exact when T_F = T_B + T_W, or with forward doubling when the
    backward takes twice the forward. Peak p/2 + 1 + min(d, p-1-d)
    microbatches on device d, plus p more with forward doubling.

    Parameters
    ----------
    p, m, v : int
        Devices, microbatches, chunks.
    c : Costs
        Scalar costs.
    variant : str
        ``"direct"`` or ``"forward-doubling"``.

    Returns
    -------
    dict
        ``makespan``, ``bubble_time``, ``peak_activation``, ``exact``.

    Raises
    ------
    None
        Arithmetic only; the arguments are checked by :func:`pipecore.formula`.
    """
    f, bw = c.f, c.b + c.w
    t = f + bw
    d = np.arange(p)
    doubling = variant == "forward-doubling"
    peak = (p // 2 + 1 + np.minimum(d, p - 1 - d) + (p if doubling else 0)).astype(float)
    peak = np.minimum(peak, m) * c.activation
    exact = (bw == 2 * f) if doubling else (f == bw)
    return {"makespan": m * t + (p - 2) * t / 2, "bubble_time": (p - 2) * t / 2,
            "peak_activation": peak, "exact": bool(exact and m % p == 0)}


register(Family("chimera", build_chimera, formula_chimera, options=("variant",),
                tune_options={"variant": ("direct", "forward-doubling")},
                summary="bidirectional pipelines, stages replicated (2x weights)"))

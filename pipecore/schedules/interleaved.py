"""Interleaved 1F1B (Megatron-LM, Narayanan et al., SC'21)."""

from __future__ import annotations

import numpy as np

from . import Family, _programs_to_schedule, register


def build_interleaved(devices, microbatches, chunks=2):
    """Megatron's interleaved schedule; chunk c of device d is stage c*p + d.

    Forwards on every device visit microbatches in groups of p: the k-th
    forward is chunk ``(k // p) % v`` of microbatch
    ``(k // (p v)) p + k % p``; backwards use the same order with chunks
    reversed. Device d runs ``2(p - d - 1) + (v - 1) p`` warm-up forwards
    (all of them when m == p, as Megatron does), then alternates one
    forward and one backward.

    Raises
    ------
    ValueError
        If m is not a multiple of p (Megatron's requirement for this order).
    """
    p, m, v = devices, microbatches, chunks
    if m % p != 0:
        raise ValueError(f"'interleaved-1f1b' needs microbatches to be a multiple of devices "
                         f"(got microbatches={m}, devices={p})")
    total = m * v

    def fwd(d, k):
        return ("F", ((k // p) % v) * p + d, (k // (p * v)) * p + k % p)

    def bwd(d, k):
        return ("BW", (v - 1 - (k // p) % v) * p + d, (k // (p * v)) * p + k % p)

    programs = []
    for d in range(p):
        warm = total if m == p else min(2 * (p - d - 1) + (v - 1) * p, total)
        prog = [fwd(d, k) for k in range(warm)]
        for j in range(total - warm):
            prog.append(fwd(d, warm + j))
            prog.append(bwd(d, j))
        prog += [bwd(d, j) for j in range(total - warm, total)]
        programs.append(prog)
    return _programs_to_schedule("interleaved-1f1b", programs, p)


def formula_interleaved(p, m, v, c):
    """Bubble (p-1)(F+B+W)/v; device d peaks at its warm-up count + 1 chunks."""
    f, b, w = c.f, c.b, c.w
    t = f + b + w
    d = np.arange(p)
    warm = np.minimum(2 * (p - d - 1) + (v - 1) * p, m * v) if m != p else np.full(p, m * v)
    peak = np.minimum(warm + 1, m * v) / v
    return {"makespan": m * t + (p - 1) * t / v, "bubble_time": (p - 1) * t / v,
            "peak_activation": peak * c.activation, "exact": True}


register(Family("interleaved-1f1b", build_interleaved, formula_interleaved, chunks=True,
                default_chunks=2, summary="Megatron interleaving, v chunks per device"))

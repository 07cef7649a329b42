"""BitPipe (Wu, Chen, Yu; arXiv 2410.19367): two opposite pipelines, each
V-shaped over two stages per device, so every device holds four stage
replicas (twice the weights).

The per-device order is the authors' code's (github.com/wuhouming/BitPipe,
``bitpipe_schedule.py`` at 6fb0e22f), restated as rules in
docs/research/bidirectional.md, section 4.4b, and checked there against the
listings the code produces (which match the paper's p = 4 figure). The paper
body was not readable here; its bubble formula is not used. Where the paper's
figure for more microbatches joins units differently from the code (p = 4
only), the code's join is used.
"""

from __future__ import annotations

import numpy as np

from ..core.ops import InputError
from ..core.schedule import Schedule
from ..kernels import bidirectional as _kernel
from .construct import column_buffers
from .papers import BITPIPE
from .registry import Family, register, with_builder_doc, with_formula_doc


@with_builder_doc(devices="Pipeline devices p (even).",
                  microbatches="Microbatches m (a multiple of p).",
                  chunks="Must be 2 (two stages of each pipeline per device).")
def build_bitpipe(devices, microbatches, chunks=2):
    """BitPipe on device d with h = p/2, a and b as in Chimera.

    Down microbatches run stage s on device s (s < p) and 2p-1-s (s >= p);
    up ones on device p-1-s and s-p. Device d's roles: own1/own2 are its
    own pipeline's stages on the first and second leg of the V, oth1/oth2
    the other pipeline's (the own pipeline is down for d < h). A unit of p
    microbatches (h down, h up) has the forward list a x [own1], b x [oth1,
    own1], a x [oth1, oth2], b x [own2, oth2], a x [own2] and the backward
    list with own1<->own2 and oth1<->oth2 swapped; each role takes its
    pipeline's microbatches in order. The program runs W = 2p - a warm-up
    forwards, then per unit a pairs (forward, backward); between units the
    remaining backwards of the unit interleave with the next unit's
    warm-up (direct concatenation); last, the remaining backwards. The
    all-reduces (AR) with the replica device p-1-d follow the code's eager
    sync: second-leg stages just before the last backward (after it on the
    two middle devices), first-leg stages at the very end.

    Returns
    -------
    Schedule
        With ``replicated=True``.

    Raises
    ------
    ValueError
        If p is odd or m is not a multiple of p.
    """
    p, m = devices, microbatches
    if p % 2:
        raise InputError(f"'bitpipe' needs an even number of devices (got devices={p})")
    if m % p:
        raise InputError(f"'bitpipe' needs microbatches to be a multiple of devices "
                         f"(got microbatches={m}, devices={p})")
    if p * (4 * m + 4) >= BITPIPE_KERNEL_MIN_OPS:
        cols = _kernel.bitpipe_columns(p, m, column_buffers(p * (4 * m + 4)))
        return Schedule.from_arrays(*cols, name="bitpipe", devices=p, replicated=True,
                                    copy=False)
    return _bitpipe_per_op(p, m)


# From this many ops on, BitPipe is written by a Numba kernel
# (kernels/bidirectional.py); smaller ones keep the per-op builder below and
# so compile nothing (compare's p=8 bitpipe among them).
BITPIPE_KERNEL_MIN_OPS = 16_384


def _bitpipe_per_op(p, m):
    """BitPipe op by op: the builder of small shapes, and what the tests
    compare the kernel with."""
    h = p // 2
    units = m // p
    programs = []
    for d in range(p):
        if d < h:
            a, b = h - d, d
            roles = {"own1": ("down", d), "oth1": ("up", p - 1 - d),
                     "own2": ("down", 2 * p - 1 - d), "oth2": ("up", p + d)}
        else:
            a = d - h + 1
            b = h - a
            roles = {"own1": ("up", p - 1 - d), "oth1": ("down", d),
                     "own2": ("up", p + d), "oth2": ("down", 2 * p - 1 - d)}
        fwd_roles = (["own1"] * a + ["oth1", "own1"] * b + ["oth1", "oth2"] * a
                     + ["own2", "oth2"] * b + ["own2"] * a)
        swap = {"own1": "own2", "own2": "own1", "oth1": "oth2", "oth2": "oth1"}
        bwd_roles = [swap[r] for r in fwd_roles]

        def unit_ops(j, kind, order, roles=roles):
            taken = {}
            ops = []
            for role in order:
                pipe, stage = roles[role]
                k = taken.get(role, 0)
                taken[role] = k + 1
                first = j * p + (0 if pipe == "down" else h)
                ops.append((kind, stage, first + k))
            return ops

        F = [unit_ops(j, "F", fwd_roles) for j in range(units)]
        B = [unit_ops(j, "BW", bwd_roles) for j in range(units)]
        W = 2 * p - a
        prog = list(F[0][:W])
        for j in range(units):
            for i in range(a):
                prog += [F[j][W + i], B[j][i]]
            if j < units - 1:
                prog += B[j][a:W + 1]
                for i in range(a - 1):
                    prog += [F[j + 1][i], B[j][W + 1 + i]]
                prog += F[j + 1][a - 1:W]
            else:
                prog += B[j][a:]
        second = [("AR", roles["own2"][1], None), ("AR", roles["oth2"][1], None)]
        first_leg = [("AR", roles["own1"][1], None), ("AR", roles["oth1"][1], None)]
        if d in (h - 1, h):
            prog += second
        else:
            prog[-1:-1] = second  # just before the last backward
        prog += first_leg
        programs.append(prog)
    return Schedule.from_programs(programs, name="bitpipe", devices=p, replicated=True)


@with_formula_doc
def formula_bitpipe(p, m, v, c):
    """Closed forms derived from the authors' order, not from the paper.

    The paper body was not readable here. Each device is busy m (T_F +
    T_BW) with T_BW = T_B + T_W; with K = m / p units joined by direct
    concatenation (the paper's figure for more microbatches, and the
    code's join), it idles (p - 2)/2 hi in one unit (p - 2 chunk slots, each
    as long as the longer chunk op, hi the larger of T_F and T_BW) plus
    (p - 2)/2 ``|T_BW - T_F|`` at each of the K - 1 joins, where the next
    unit's forwards pair with this unit's backwards. At T_F = T_BW the
    bubble ratio is (p-2)/(4m+p-2), half of Chimera's bubble time. Device d
    peaks at (3p+2)/4 + min(d, p-1-d)/2 microbatches. Both are derived from
    the order and property-tested at any T_F and T_BW.
    """
    f, bw = c.f, c.b + c.w
    units = m // p
    bubble = (p - 2) / 2 * (max(f, bw) + (units - 1) * abs(bw - f))
    d = np.arange(p)
    peak = ((3 * p + 2) / 4 + np.minimum(d, p - 1 - d) / 2) * c.activation
    return {"makespan": m * (f + bw) + bubble, "bubble_time": bubble, "peak_activation": peak,
            "exact": bool(m % p == 0 and m >= p)}


register(Family("bitpipe", build_bitpipe, formula_bitpipe, chunks=True, default_chunks=2,
                fixed_chunks=2, summary="bidirectional V pipelines, 4 stage replicas per device",
                paper=BITPIPE))

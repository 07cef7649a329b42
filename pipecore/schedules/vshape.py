"""V-shape placement: device d holds stages d and 2p-1-d, so the turn at the
bottom of the V (stages p-1 and p) stays on device p-1 and the first and
last stages share device 0.

ZB-V is the V-shaped zero-bubble schedule of Qi et al. ("Zero Bubble
Pipeline Parallelism", arXiv:2401.10241, section 6; the ICLR 2024 version
has ZB-H1 and ZB-H2 only). Its per-device order follows
the rules PyTorch's ``ScheduleZBVZeroBubble`` uses (torch 2.13), restated
here and checked against a fixture generated from torch.
"""

from __future__ import annotations

import numpy as np

from ..core.schedule import Schedule
from ..kernels.codes import B, F, W
from ..kernels.slots import zb_v_columns, zb_v_phases
from .blocks import repeat, v_half, v_min, v_zb
from .construct import at_scale, kernel_to_schedule, slots_to_schedule
from .papers import V_HALF, V_MIN, V_ZB, ZERO_BUBBLE_V
from .registry import Family, register, with_builder_doc, with_formula_doc


def v_placement(devices):
    """Stage -> device for the V: stages d and 2p-1-d on device d.
    """
    p = devices
    return np.concatenate([np.arange(p), np.arange(p)[::-1]]).astype(np.int32)


@with_builder_doc
def build_zb_v(devices, microbatches, chunks=2):
    """ZB-V on device d (chunk 0 = stage d, chunk 1 = stage 2p-1-d).

    The pattern assumes n = max(m, 2p-1) microbatches so the warm-up is
    full; ops of microbatches >= m are then dropped, which keeps the order of
    the rest. On device d:

    1. warm-up: 2(p-d)-1 forwards of chunk 0;
    2. d pairs F(chunk 1), F(chunk 0);
    3. p-d triples F, B, W of chunk 1;
    4. steady: while chunk 1 trails chunk 0 or chunk 0 has forwards left:
       F(chunk 0) if any left, B and W of chunk 0, then F, B, W of chunk 1;
    5. cool-down: d pairs B(chunk 0), B(chunk 1); p-d pairs B(chunk 0) and
       the oldest pending W(chunk 0); then the pending W of chunk 1, then
       those of chunk 0.
    """
    return _zb_v_slots(devices, microbatches)


def _zb_v_slots(p, m):
    """:func:`build_zb_v` from the closed-form position of every op.

    Positions in device d's unfiltered program (n = max(m, 2p-1) microbatches,
    a = 2(p-d)-1 warm-up forwards, K = n-2p+d+1 steady iterations with a
    chunk-0 forward, T = n-p steady iterations in all, iteration t starting
    at P4 + 6 min(t, K) + 5 max(0, t-K)) follow the five phases of the
    docstring above; ops of microbatches >= m are then dropped, keeping the
    order (every device keeps 6m ops).
    """
    n = max(m, 2 * p - 1)
    if n == m and at_scale(p, 6 * m):
        # At scale one kernel writes every op straight into the columns.
        return kernel_to_schedule("zb-v", p, 6 * m,
                                  lambda out, d0, d1: zb_v_columns(out, p, m, d0, d1))
    d = np.arange(p, dtype=np.int32)[:, None]
    j = np.arange(n, dtype=np.int32)[None, :]
    a, K, T, P3, P4, P5, P5b, P5c, P5d = zb_v_phases.py_func(p, n, d)

    def start(t):
        return P4 + 6 * np.minimum(t, K) + 5 * np.maximum(0, t - K)

    def steady(t, early, late):  # offset of an op within steady iteration t
        return start(t) + np.where(t < K, early, late)

    f0 = np.where(j < a, j, np.where(j < a + d, a + 2 * (j - a) + 1, P4 + 6 * (j - (a + d))))
    f1 = np.where(j < d, a + 2 * j, np.where(j < p, P3 + 3 * (j - d), steady(j - p, 3, 2)))
    b1 = np.where(j < p - d, P3 + 3 * j + 1,
                  np.where(j < n - d, steady(j - (p - d), 4, 3), P5 + 2 * (j - (n - d)) + 1))
    w1 = np.where(j < p - d, P3 + 3 * j + 2,
                  np.where(j < n - d, steady(j - (p - d), 5, 4), P5c + (j - (n - d))))
    b0 = np.where(j < T, steady(j, 1, 0),
                  np.where(j < T + d, P5 + 2 * (j - T), P5b + 2 * (j - T - d)))
    w0 = np.where(j < T, steady(j, 2, 1),
                  np.where(j < n - d, P5b + 2 * (j - T) + 1, P5d + (j - (n - d))))
    c0, c1 = d, 2 * p - 1 - d
    parts = [(F, c0, j, f0), (F, c1, j, f1), (B, c0, j, b0), (B, c1, j, b1), (W, c0, j, w0),
             (W, c1, j, w1)]
    if n == m:  # nothing to drop: every slot holds an op
        return slots_to_schedule("zb-v", p, 6 * m, parts)
    full = 6 * n
    kind = np.empty((p, full), dtype=np.int8)
    stage = np.empty((p, full), dtype=np.int32)
    mb = np.empty((p, full), dtype=np.int32)
    rows = np.arange(p)[:, None]
    for code, st, _, pos in parts:
        kind[rows, pos] = code
        stage[rows, pos] = st
        mb[rows, pos] = j
    keep = mb < m
    length = 6 * m
    return Schedule.from_arrays(np.repeat(np.arange(p, dtype=np.int32), length),
                                np.tile(np.arange(length, dtype=np.int32), p),
                                kind[keep], stage[keep], mb[keep], name="zb-v", devices=p,
                                copy=False)


@with_formula_doc
def formula_zb_v(p, m, v, c):
    """ZB-V: zero bubble at T_F = T_B = T_W (ZB paper, section 6), peak p*M_B.

    The peak of device d is min(p, m, (m + 1 + d) / 2) M_B: chunks hold
    M_B / 2 each and the warm-up runs up to 2p-1 chunk-0 forwards before
    the first chunk-1 forward (derived from the order; property-tested).
    The bubble is zero only for equal times and m >= 2p-1.
    """
    f, b, w = c.f, c.b, c.w
    t = f + b + w
    d = np.arange(p)
    peak = np.minimum(np.minimum(p, m), (m + 1 + d) / 2) * c.activation
    # The first forward reaches the bottom of the V after p-1 chunk forwards.
    return {"makespan": m * t + (p - 1) * f / 2, "bubble_time": 0.0,
            "peak_activation": peak, "exact": bool(f == b == w and m >= 2 * p - 1)}


register(Family("zb-v", build_zb_v, formula_zb_v, chunks=True, default_chunks=2, split=True,
                fixed_chunks=2,
                summary="V-shaped zero bubble, peak p*M_B",
                paper=ZERO_BUBBLE_V))


def _block_builder(name, make):
    def build(devices, microbatches, chunks=2):
        return repeat(make(devices), microbatches).squeeze(name=name)

    build.__doc__ = (f"{name}: the paper's building block repeated for m microbatches, "
                     f"warm-up and cool-down reordered, then squeezed (see pipecore.blocks).")
    return with_builder_doc(build)


def _v_formula(share, target):
    """Closed forms of the Controllable Memory paper for a V block.

    ``share`` is the bubble as a fraction of 1F1B's (p-1)(T_F+T_B+T_W) (2/3
    for V-Min, 1/2 for V-Half, 0 for V-ZB: approximations the paper states
    for T_F = T_B = T_W); ``target(p)`` the peak in microbatches, exact
    when W releases the whole activation (activation_w == activation) and an
    upper bound otherwise.
    """

    def formula(p, m, v, c):
        f, b, w = c.f, c.b, c.w
        t = f + b + w
        bubble = share * (p - 1) * t
        peak = np.full(p, float(min(target(p), m))) * c.activation
        exact = share == 0 and f == b == w and m >= 2 * p and c.activation_w == c.activation
        return {"makespan": m * t + bubble + (p - 1) * f / 2, "bubble_time": bubble,
                "peak_activation": peak, "exact": bool(exact)}

    return formula


register(Family("v-min", _block_builder("v-min", v_min), _v_formula(2 / 3, lambda p: (p + 4) // 3),
                chunks=True, default_chunks=2, split=True, fixed_chunks=2,
                summary="V block, offsets 1: about 1/3 of 1F1B's activation",
                paper=V_MIN))
register(Family("v-half", _block_builder("v-half", v_half), _v_formula(1 / 2, lambda p: (p + 2) // 2),
                chunks=True, default_chunks=2, split=True, fixed_chunks=2,
                summary="V block, offsets 2/1: about half of 1F1B's activation",
                paper=V_HALF))
register(Family("v-zb", _block_builder("v-zb", v_zb), _v_formula(0.0, lambda p: p),
                chunks=True, default_chunks=2, split=True, fixed_chunks=2,
                summary="V block, offsets 4/2: 1F1B's activation, no bubble",
                paper=V_ZB))

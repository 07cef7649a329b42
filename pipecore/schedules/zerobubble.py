"""Handcrafted zero-bubble schedules ZB-H1 and ZB-H2 (Qi et al., "Zero Bubble
Pipeline Parallelism", ICLR 2024): backward split into B (input gradient)
and W (weight gradient), with W ops moved into what would be bubbles."""

from __future__ import annotations

import numpy as np

from ..kernels.codes import B, F, W
from ..kernels.slots import split_1f1b_columns
from .construct import at_scale, kernel_to_schedule, slots_to_schedule
from .papers import ZERO_BUBBLE
from .registry import Family, register, with_builder_doc, with_formula_doc


def split_1f1b_slots(devices, microbatches, warmup, lag, name):
    """:func:`split_1f1b` from the closed-form slot of every op.

    With k = min(warmup[d], m) and lag L: B(j) is in slot
    g(j) = k + j + max(0, j - L) + min(j, m - k) (k warm-up forwards, then
    per earlier iteration a B, a W once j >= L, an F while forwards
    remain); W(i) follows B(i + L) when i + L < m, else it is in the tail
    at 2m + i; F(i) is in slot i in the warm-up, else after B(i - k) and
    its W.
    """
    m = microbatches
    if at_scale(devices, 3 * m):
        # At scale one kernel writes every op straight into the columns.
        warm = np.asarray(warmup, dtype=np.int64)
        lags = np.asarray(lag, dtype=np.int64)
        return kernel_to_schedule(
            name, devices, 3 * m,
            lambda out, d0, d1: split_1f1b_columns(out, devices, m, warm, lags, d0, d1))
    # int32 halves the temporaries (slots stay below 3m, far from overflow).
    k = np.minimum(np.asarray(warmup, dtype=np.int32), m)[:, None]
    lag = np.asarray(lag, dtype=np.int32)[:, None]
    j = np.arange(m, dtype=np.int32)[None, :]
    stage = np.arange(devices, dtype=np.int32)[:, None]

    def g(i):
        return k + i + np.maximum(0, i - lag) + np.minimum(i, m - k)

    b_slot = g(j)
    w_slot = np.where(j + lag < m, g(j + lag) + 1, 2 * m + j)
    f_slot = np.where(j < k, j, g(j - k) + 1 + (j - k >= lag))
    return slots_to_schedule(name, devices, 3 * m,
                             [(F, stage, j, f_slot), (B, stage, j, b_slot), (W, stage, j, w_slot)])


@with_builder_doc
def build_zb_h1(devices, microbatches, chunks=1):
    """ZB-H1: 1F1B's warm-up (p - d forwards on device d); W lags B by d microbatches.

    Peak activation stays at 1F1B's p*M_B on device 0 (device d holds
    (p - d) M_B + d M_W); the bubble shrinks to (p-1)(T_F + T_B - T_W).
    """
    p = devices
    return split_1f1b_slots(p, microbatches, [p - d for d in range(p)], list(range(p)), "zb-h1")


@with_builder_doc
def build_zb_h2(devices, microbatches, chunks=1):
    """ZB-H2: 2(p - d) - 1 warm-up forwards on device d; W lags B by 2d microbatches.

    The extra forwards fill the warm-up bubble and the lagging W ops fill
    the cool-down, for (2p-1) M_B of activation on device 0.
    """
    p = devices
    return split_1f1b_slots(p, microbatches, [2 * (p - d) - 1 for d in range(p)],
                            [2 * d for d in range(p)], "zb-h2")


def _split_peak(p, m, warmup, lag, c):
    """Peak of the split-1F1B programs: k M_B at the end of warm-up, then each
    later forward adds M_B while up to ``lag`` finished B ops still hold M_W."""
    k = np.minimum(warmup, m)
    steady = np.maximum(m - k, 0)
    held_w = np.minimum(steady, lag)
    return k * c.activation + held_w * c.activation_w


@with_formula_doc
def formula_zb_h1(p, m, v, c):
    """Bubble (p-1)(T_F + T_B - T_W) (ZB paper, section 3.1).

    Exact here when T_W <= T_F (checked by property tests over p, m >= p
    and a grid of times); otherwise the schedule idles more than that.
    """
    f, b, w = c.f, c.b, c.w
    t = f + b + w
    bubble = (p - 1) * (f + b - w)
    d = np.arange(p)
    return {"makespan": m * t + (p - 1) * max(f, f + b - w), "bubble_time": bubble,
            "peak_activation": _split_peak(p, m, p - d, d, c),
            "exact": w <= f and m >= p}


@with_formula_doc
def formula_zb_h2(p, m, v, c):
    """Bubble max(0, (p-1)(T_F + T_B - 2 T_W)) (ZB paper, section 3.1).

    Exact here when T_B <= T_F and m >= 2p (checked by property tests);
    the makespan adds the (p-1) T_F it takes the first forward to reach
    the last device, which the span-based bubble does not count.
    """
    f, b, w = c.f, c.b, c.w
    t = f + b + w
    bubble = max(0.0, (p - 1) * (f + b - 2 * w))
    d = np.arange(p)
    return {"makespan": m * t + max((p - 1) * f, bubble), "bubble_time": bubble,
            "peak_activation": _split_peak(p, m, 2 * (p - d) - 1, 2 * d, c),
            "exact": b <= f and m >= 2 * p}


register(Family("zb-h1", build_zb_h1, formula_zb_h1, split=True,
                summary="zero bubble H1: split backward, 1F1B memory",
                paper=ZERO_BUBBLE))
register(Family("zb-h2", build_zb_h2, formula_zb_h2, split=True,
                summary="zero bubble H2: split backward, (2p-1) M_B, no bubble",
                paper=ZERO_BUBBLE))

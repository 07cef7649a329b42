"""Interleaved 1F1B (Megatron-LM, Narayanan et al., SC'21)."""

from __future__ import annotations

import numpy as np

from ..core.ops import InputError
from ..kernels.codes import BW, B, F, W
from ..kernels.slots import interleaved_columns, interleaved_zb_columns
from .construct import at_scale, kernel_to_schedule, slots_to_schedule
from .papers import MEGATRON_INTERLEAVED, ZERO_BUBBLE_INTERLEAVED
from .registry import Family, register, with_builder_doc, with_formula_doc


@with_builder_doc
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
        raise InputError(f"'interleaved-1f1b' needs microbatches to be a multiple of devices "
                         f"(got microbatches={m}, devices={p})")
    total = m * v
    if at_scale(p, 2 * total):
        # At scale one kernel writes every op straight into the columns.
        return kernel_to_schedule("interleaved-1f1b", p, 2 * total,
                                  lambda out, d0, d1: interleaved_columns(out, p, m, v, d0, d1))
    d = np.arange(p, dtype=np.int32)[:, None]
    warm = (np.full((p, 1), total, dtype=np.int32) if m == p
            else np.minimum(2 * (p - d - 1) + (v - 1) * p, total))
    k = np.arange(total, dtype=np.int32)[None, :]
    chunk = (k // p) % v
    mb = (k // (p * v)) * p + k % p
    # The k-th forward fills slot k during warm-up, then every other slot;
    # the k-th backward follows the forward it is paired with, then drains.
    f_slot = np.where(k < warm, k, 2 * k - warm)
    b_slot = np.where(k < total - warm, warm + 2 * k + 1, total + k)
    return slots_to_schedule("interleaved-1f1b", p, 2 * total,
                             [(F, chunk * p + d, mb, f_slot), (BW, (v - 1 - chunk) * p + d, mb, b_slot)])


@with_formula_doc
def formula_interleaved(p, m, v, c):
    """Bubble (p-1)(F+B+W)/v; device d peaks at its warm-up count + 1 chunks.
    """
    f, b, w = c.f, c.b, c.w
    t = f + b + w
    d = np.arange(p)
    warm = np.minimum(2 * (p - d - 1) + (v - 1) * p, m * v) if m != p else np.full(p, m * v)
    peak = np.minimum(warm + 1, m * v) / v
    return {"makespan": m * t + (p - 1) * t / v, "bubble_time": (p - 1) * t / v,
            "peak_activation": peak * c.activation, "exact": True}


@with_builder_doc
def build_interleaved_zb(devices, microbatches, chunks=2):
    """Interleaved 1F1B with split backward, W lagging B by d ops on device d.

    The order follows PyTorch's ``ScheduleInterleavedZeroBubble`` (torch
    2.13), restated: microbatches go in R = max(1, m // p) rounds of
    r = m / R; the k-th forward is chunk ``(k // r) % v`` and the k-th
    backward chunk ``v - 1 - (k // r) % v``, each stage taking its
    microbatches in order. Device d runs ``min((v-1) r + p-1-d, m v)``
    warm-up forwards, then pairs (forward, B), then the remaining B; from
    its (d+1)-th B on, each B is followed by the oldest pending W.

    Raises
    ------
    ValueError
        If m is not a multiple of the number of rounds.
    """
    p, m, v = devices, microbatches, chunks
    r = _zb_round(p, m)
    total = m * v
    if at_scale(p, 3 * total):
        # At scale one kernel writes every op straight into the columns.
        return kernel_to_schedule(
            "interleaved-zb", p, 3 * total,
            lambda out, d0, d1: interleaved_zb_columns(out, p, m, v, r, d0, d1))
    d = np.arange(p, dtype=np.int32)[:, None]
    k = np.arange(total, dtype=np.int32)[None, :]
    warm = np.minimum((v - 1) * r + p - 1 - d, total)
    # The k-th forward is chunk (k // r) % v, the k-th B chunk v-1-(k // r) % v;
    # each stage takes its microbatches in order.
    chunk = (k // r) % v
    mb = (k // (r * v)) * r + k % r

    def loop_pos(i):  # slot of steady iteration i's first op
        return warm + np.minimum(i, total - warm) + i + np.maximum(0, i - d)

    has_f = (warm + k < total).astype(np.int32)
    f_slot = np.where(k < warm, k, warm + 2 * (k - warm) + np.maximum(0, k - warm - d))
    b_slot = loop_pos(k) + has_f
    w_iter = k + d  # the W of the k-th B follows the (k+d)-th B, or drains at the end
    w_slot = np.where(w_iter < total,
                      loop_pos(np.minimum(w_iter, total - 1))
                      + (warm + np.minimum(w_iter, total - 1) < total) + 1, 2 * total + k)
    b_stage = (v - 1 - chunk) * p + d
    return slots_to_schedule("interleaved-zb", p, 3 * total,
                             [(F, chunk * p + d, mb, f_slot), (B, b_stage, mb, b_slot),
                              (W, b_stage, mb, w_slot)])


def _zb_round(p, m):
    """Microbatches per round of interleaved-zb, after checking m splits evenly."""
    rounds = max(1, m // p)
    if m % rounds != 0:
        raise InputError(f"'interleaved-zb' needs microbatches to be a multiple of "
                         f"max(1, microbatches // devices) = {rounds} (got microbatches={m})")
    return m // rounds


@with_formula_doc
def formula_interleaved_zb(p, m, v, c):
    """ZB-H1's bubble shrunk by interleaving: (p-1)(T_F + T_B - T_W)/v.

    Exact here when m >= 2p, T_B <= T_F and T_W <= T_F (property-tested).
    Device d holds its warm-up chunks plus one, min(w_d + 1, m v) M_B / v,
    plus M_W / v for each of the up to d backward ops whose W lags.
    """
    f, b, w = c.f, c.b, c.w
    t = f + b + w
    rounds = max(1, m // p)
    r = m // rounds
    d = np.arange(p)
    held = np.minimum((v - 1) * r + p - d, m * v)
    lagging = np.minimum(d, m * v - held)
    peak = (held * c.activation + lagging * c.activation_w) / v
    bubble = (p - 1) * (f + b - w) / v
    return {"makespan": m * t + bubble, "bubble_time": bubble, "peak_activation": peak,
            "exact": bool(m >= 2 * p and b <= f and w <= f)}


register(Family("interleaved-1f1b", build_interleaved, formula_interleaved, chunks=True,
                default_chunks=2, summary="Megatron interleaving, v chunks per device",
                paper=MEGATRON_INTERLEAVED))
register(Family("interleaved-zb", build_interleaved_zb, formula_interleaved_zb, chunks=True,
                default_chunks=2, split=True,
                summary="interleaved 1F1B with split backward (torch InterleavedZeroBubble)",
                paper=ZERO_BUBBLE_INTERLEAVED))

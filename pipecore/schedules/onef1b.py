"""1F1B (PipeDream-flush, Narayanan et al. 2021) and its eager variant."""

from __future__ import annotations

import numpy as np

from ..kernels.codes import BW, F
from ..kernels.slots import one_f_one_b_columns
from .construct import at_scale, kernel_to_schedule, slots_to_schedule
from .papers import EAGER_1F1B, PIPEDREAM_FLUSH
from .registry import Family, register, with_builder_doc, with_formula_doc


def _one_f_one_b_slots(name, devices, microbatches, warmup):
    """:func:`_one_f_one_b` from the closed-form slot of every op.

    With k = warmup[d]: F(j) is in slot j for j < k, else 2j - k + 1 (after
    BW(j - k)); BW(j) is in slot k + 2j while forwards remain, then m + j.
    """
    m = microbatches
    if at_scale(devices, 2 * m):
        # At scale one kernel writes every op straight into the columns.
        warm = np.asarray(warmup, dtype=np.int64)
        return kernel_to_schedule(
            name, devices, 2 * m,
            lambda out, d0, d1: one_f_one_b_columns(out, devices, m, warm, d0, d1))
    k = np.asarray(warmup, dtype=np.int32)[:, None]
    j = np.arange(m, dtype=np.int32)[None, :]
    stage = np.arange(devices, dtype=np.int32)[:, None]
    f_slot = np.where(j < k, j, 2 * j - k + 1)
    b_slot = np.where(j < m - k, k + 2 * j, m + j)
    return slots_to_schedule(name, devices, 2 * m, [(F, stage, j, f_slot), (BW, stage, j, b_slot)])


@with_builder_doc
def build_1f1b(devices, microbatches, chunks=1):
    """Device d runs min(p - d, m) forwards before its first backward.
    """
    warm = [min(devices - d, microbatches) for d in range(devices)]
    return _one_f_one_b_slots("1f1b", devices, microbatches, warm)


@with_builder_doc
def build_eager_1f1b(devices, microbatches, chunks=1):
    """Device d runs min(2(p - d) - 1, m) forwards before its first backward.

    The extra warm-up forwards (as in the "eager 1F1B" of the Controllable
    Memory paper's building-block illustration) give each send a forward's
    time to travel; the price is more activation memory.
    """
    warm = [min(2 * (devices - d) - 1, microbatches) for d in range(devices)]
    return _one_f_one_b_slots("eager-1f1b", devices, microbatches, warm)


@with_formula_doc
def formula_1f1b(p, m, v, c):
    """Bubble (p-1)(F+B+W); device d holds min(p-d, m) activations.
    """
    f, b, w = c.f, c.b, c.w
    t = f + b + w
    return {"makespan": (m + p - 1) * t, "bubble_time": (p - 1) * t,
            "peak_activation": np.minimum(p - np.arange(p), m) * c.activation, "exact": True}


@with_formula_doc
def formula_eager_1f1b(p, m, v, c):
    """As 1F1B without communication; device d holds min(2(p-d)-1, m).
    """
    out = formula_1f1b(p, m, v, c)
    out["peak_activation"] = np.minimum(2 * (p - np.arange(p)) - 1, m) * c.activation
    return out


register(Family("1f1b", build_1f1b, formula_1f1b,
                summary="one forward one backward; peak p*M on device 0",
                paper=PIPEDREAM_FLUSH))
register(Family("eager-1f1b", build_eager_1f1b, formula_eager_1f1b,
                summary="1F1B with doubled warm-up to hide communication",
                paper=EAGER_1F1B))

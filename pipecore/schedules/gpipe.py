"""GPipe (Huang et al., 2019): all forwards, then all backwards."""

from __future__ import annotations

import numpy as np

from ..kernels.codes import BW, F
from ..kernels.slots import gpipe_columns
from .construct import at_scale, kernel_to_schedule, slots_to_schedule
from .papers import GPIPE
from .registry import Family, register, with_builder_doc, with_formula_doc


@with_builder_doc
def build_gpipe(devices, microbatches, chunks=1):
    """Device d runs F(d, 0..m-1) then BW(d, 0..m-1).
    """
    m = microbatches
    if at_scale(devices, 2 * m):
        # At scale one kernel writes every op straight into the columns.
        return kernel_to_schedule("gpipe", devices, 2 * m,
                                  lambda out, d0, d1: gpipe_columns(out, devices, m, d0, d1))
    j = np.arange(m, dtype=np.int32)[None, :]
    stage = np.arange(devices, dtype=np.int32)[:, None]
    return slots_to_schedule("gpipe", devices, 2 * m, [(F, stage, j, j), (BW, stage, j, m + j)])


@with_formula_doc
def formula_gpipe(p, m, v, c):
    """Bubble (p-1)(F+B+W); every device holds all m activations at the flush.
    """
    f, b, w = c.f, c.b, c.w
    t = f + b + w
    return {"makespan": (m + p - 1) * t, "bubble_time": (p - 1) * t,
            "peak_activation": np.full(p, float(m)) * c.activation, "exact": True}


register(Family("gpipe", build_gpipe, formula_gpipe,
                summary="all forwards then all backwards; peak m*M",
                paper=GPIPE))

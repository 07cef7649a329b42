"""Looped breadth-first schedule (Lamy-Poirier, "Breadth-First Pipeline Parallelism")."""

from __future__ import annotations

import numpy as np

from ..kernels.codes import BW, F
from ..kernels.slots import looped_bfs_columns
from .construct import at_scale, kernel_to_schedule, slots_to_schedule
from .papers import BREADTH_FIRST
from .registry import Family, register, with_builder_doc, with_formula_doc


@with_builder_doc
def build_looped_bfs(devices, microbatches, chunks=2):
    """Every microbatch through chunk 0, then chunk 1, ...; backwards in reverse.

    Chunk c of device d is stage c*p + d (the interleaved placement). The
    backward pass takes chunks last to first and, within a chunk, the
    microbatches last to first (the newest activation first), which is the
    order PyTorch's ``ScheduleLoopedBFS`` uses.
    """
    p, m, v = devices, microbatches, chunks
    if at_scale(p, 2 * v * m):
        # At scale one kernel writes every op straight into the columns.
        return kernel_to_schedule("looped-bfs", p, 2 * v * m,
                                  lambda out, d0, d1: looped_bfs_columns(out, p, m, v, d0, d1))
    # Op i of a device's forward half is chunk i // m, microbatch i % m; its
    # backward half runs the same (chunk, microbatch)s in reverse.
    i = np.arange(v * m, dtype=np.int32)[None, :]
    d = np.arange(p, dtype=np.int32)[:, None]
    stage = (i // m) * p + d
    return slots_to_schedule("looped-bfs", p, 2 * v * m,
                             [(F, stage, i % m, i), (BW, stage, i % m, 2 * v * m - 1 - i)])


@with_formula_doc
def formula_looped_bfs(p, m, v, c):
    """Each pass over a chunk takes max(m, p) op times, the last one m + p - 1.

    With m >= p this is the interleaved bubble (p-1)(F+B+W)/v; each device
    holds all m microbatches' activations at the turn.
    """
    f, b, w = c.f, c.b, c.w
    t = f + b + w
    makespan = ((v - 1) * max(m, p) + m + p - 1) * t / v
    return {"makespan": makespan, "bubble_time": makespan - m * t,
            "peak_activation": np.full(p, float(m)) * c.activation, "exact": True}


register(Family("looped-bfs", build_looped_bfs, formula_looped_bfs, chunks=True,
                default_chunks=2, summary="breadth-first over chunks; peak m*M",
                paper=BREADTH_FIRST))

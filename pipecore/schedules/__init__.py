"""Schedules: the family registry, the families, building blocks, cost-driven generators and transforms.

Each family lives in its own module and registers a :class:`Family`: a
builder (devices, microbatches, chunks -> Schedule) and a closed-form
formula for its makespan and peak activation. A family's builder turns its
order into a Schedule with the helpers of :mod:`.construct`
(:class:`ProgramBuilder`, :func:`programs_to_schedule`,
:func:`slots_to_schedule`, :func:`kernel_to_schedule`,
:func:`column_buffers`), the same ones a new family uses.
"""

from . import (  # noqa: F401  (importing a family module registers it)
    asynchronous,
    bfs,
    bitpipe,
    bpipe,
    chimera,
    dualpipe,
    freeze,
    gpipe,
    hanayo,
    helixpipe,
    interleaved,
    onef1b,
    seq1f1b,
    vocab,
    vshape,
    zerobubble,
)
from .construct import (
    Columns,
    ProgramBuilder,
    at_scale,
    column_buffers,
    kernel_to_schedule,
    programs_to_schedule,
    slots_to_schedule,
)
from .registry import Family, build, family, register, schedules

__all__ = ["Family", "register", "build", "schedules", "family", "ProgramBuilder",
           "programs_to_schedule", "slots_to_schedule", "kernel_to_schedule", "column_buffers",
           "at_scale", "Columns"]

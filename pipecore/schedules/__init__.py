"""Schedules: the family registry, the families, building blocks, cost-driven generators and transforms.

Each family lives in its own module and registers a :class:`Family`: a
builder (devices, microbatches, chunks -> Schedule) and a closed-form
formula for its makespan and peak activation.
"""

from . import (  # noqa: F401  (importing a family module registers it)
    bfs,
    bitpipe,
    chimera,
    dualpipe,
    gpipe,
    hanayo,
    interleaved,
    onef1b,
    vshape,
    zerobubble,
)
from .registry import Family, ProgramBuilder, build, family, register, schedules  # noqa: F401

__all__ = ["Family", "register", "build", "schedules", "family"]

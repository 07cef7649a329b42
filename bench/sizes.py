"""Bench sizes, and the smaller ones of the CI smoke run.

``PIPECORE_BENCH_SMOKE=1 pytest bench/ --benchmark-disable`` runs every
benchmark once at a small size, so the benchmark code cannot rot without
CI spending minutes on timings it does not keep.
"""

import os

SMOKE = os.environ.get("PIPECORE_BENCH_SMOKE") == "1"


def pick(full, smoke):
    """The full bench value, or the smoke run's."""
    return smoke if SMOKE else full

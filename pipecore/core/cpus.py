"""How many CPUs this process may use."""

from __future__ import annotations

import os


def local_cpus() -> int:
    """CPUs this process may use (its affinity where the OS has one).

    Returns
    -------
    int
        At least 1.
    """
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def cpu_ids() -> list | None:
    """The ids of the CPUs this process may use, ascending; None where the OS
    has no affinity (then nothing can be pinned).

    Returns
    -------
    list of int or None
    """
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return None

"""How much memory the machine could give this process: the guard builders
and simulations check a large table against before writing it."""

from __future__ import annotations

__all__ = ["available_bytes"]


def available_bytes() -> int | None:
    """Memory the OS could give this process now, or None where unknown.

    Linux's ``MemAvailable`` plus free swap (from /proc/meminfo); None on
    other systems. Large arrays here are allocated lazily, so a table far
    larger than this would be killed by the OS while it is written, not
    refused at allocation: builders check their size against it first.

    Returns
    -------
    int or None
    """
    try:
        with open("/proc/meminfo") as fh:
            fields = dict(line.split(":", 1) for line in fh if ":" in line)
        kib = int(fields["MemAvailable"].split()[0]) + int(fields.get("SwapFree", "0 kB").split()[0])
    except (OSError, KeyError, ValueError, IndexError):
        return None
    return kib * 1024

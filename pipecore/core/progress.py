"""The progress bar every long step shows (scans, compare's charts, study, tune)."""

from __future__ import annotations

import math
import sys
import time

__all__ = ["Progress", "enabled"]


def enabled(progress) -> bool:
    """Whether to draw: ``progress`` if given, else whether stderr is a terminal.

    Parameters
    ----------
    progress : bool or None

    Returns
    -------
    bool

    Raises
    ------
    None
        Nothing beyond errors of the objects it is given.
    """
    return sys.stderr.isatty() if progress is None else bool(progress)


class Progress:
    """A one-line progress bar on stderr: done/total, rate and time left.

    The same display for every step a person waits for (scans, compare's
    charts, the study, tune). Shown when ``enabled`` (callers default it to
    "stderr is a terminal"), redrawn at most five times a second.

    Parameters
    ----------
    total : int
        Units of work.
    enabled : bool
        Draw at all.
    stream : file-like, optional
        Defaults to ``sys.stderr`` (looked up when the bar is made).
    unit : str, default "configs"
        Name of a unit of work in the rate.
    """

    def __init__(self, total, enabled, stream=None, unit="configs"):
        self.unit = unit
        self.total = total
        self.enabled = enabled
        self.stream = sys.stderr if stream is None else stream  # looked up now, not at import
        self.done = 0
        self.t0 = time.perf_counter()
        self.last = 0.0

    def update(self, n, final=False):
        """Count ``n`` more units done; draw (``final``: draw and end the line).

        Parameters
        ----------
        n : int
        final : bool, default False

        Returns
        -------
        None

        Raises
        ------
        None
            Nothing beyond errors of the objects it is given.
        """
        self.done += n
        if not self.enabled:
            return
        now = time.perf_counter()
        if not final and now - self.last < 0.2:
            return
        if final and self.total == 0:
            return
        self.last = now
        dt = max(now - self.t0, 1e-9)
        rate = self.done / dt
        left = (self.total - self.done) / rate if rate > 0 else math.inf
        frac = self.done / self.total if self.total else 1.0
        bar = "#" * int(30 * frac) + "-" * (30 - int(30 * frac))
        eta = "--:--" if not math.isfinite(left) else time.strftime("%M:%S", time.gmtime(left))
        self.stream.write(f"\r[{bar}] {100 * frac:5.1f}% {self.done:,}/{self.total:,} "
                          f"{rate:,.{0 if rate >= 10 else 1}f} {self.unit}/s ETA {eta}  ")
        if final:
            self.stream.write("\n")
        self.stream.flush()

"""The progress bar every long step shows (scans, compare's charts, study, tune)."""

from __future__ import annotations

import math
import sys
import threading
import time

from .ops import InputError

__all__ = ["Progress", "ProgressLines", "enabled", "reporter", "LINE_EVERY"]

#: Seconds between two progress lines on a stream that is not a terminal.
LINE_EVERY = 5.0


def enabled(progress) -> bool:
    """Whether to draw: ``progress`` if given, else whether stderr is a terminal.

    Parameters
    ----------
    progress : bool or None

    Returns
    -------
    bool
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


class ProgressLines:
    """Progress as plain lines, for a stream that is not a terminal (a log, CI).

    A line at least every ``every`` seconds while the work runs, also while
    one unit takes long (a Numba compile, a large shape): a background
    thread writes when the caller has not. No carriage returns, so a log
    file stays readable. Use as a context manager, or call :meth:`close`.

    Parameters
    ----------
    total : int
        Units of work.
    label : str
        What runs (starts every line).
    stream : file-like, optional
        Defaults to ``sys.stderr`` (looked up when the object is made).
    unit : str, default "units"
        Name of a unit of work.
    every : float, default LINE_EVERY
        Most seconds between two lines.

    Raises
    ------
    ValueError
        If ``every`` is not a positive number.
    """

    def __init__(self, total, label, stream=None, unit="units", every=LINE_EVERY):
        if not (isinstance(every, (int, float)) and every > 0):
            raise InputError(f"'every' must be a number of seconds > 0 (got {every!r})")
        self.total, self.label, self.unit, self.every = total, label, unit, float(every)
        self.stream = sys.stderr if stream is None else stream
        self.done = 0
        self.note = ""
        self.t0 = self.last = time.perf_counter()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._write("started")
        self._thread = threading.Thread(target=self._beat, name="pipecore-progress", daemon=True)
        self._thread.start()

    def _write(self, state):
        with self._lock:
            self.last = time.perf_counter()
            note = f" ({self.note})" if self.note else ""
            self.stream.write(f"{self.label}: {self.done:,}/{self.total:,} {self.unit} done, "
                              f"{self.last - self.t0:.0f} s elapsed, {state}{note}\n")
            self.stream.flush()

    def _beat(self):
        while not self._stop.wait(max(0.05, self.every - (time.perf_counter() - self.last))):
            if time.perf_counter() - self.last >= self.every * 0.999:
                self._write("working")

    def update(self, n, final=False, note=None):
        """Count ``n`` more units done; write a line when ``every`` seconds
        have passed (``final``: write the closing line and stop).

        Parameters
        ----------
        n : int
        final : bool, default False
        note : str, optional
            What runs now (shown in later lines until replaced).

        Returns
        -------
        None
        """
        self.done += n
        if note is not None:
            self.note = note
        if final:
            self.note = ""
            self.close()
        elif time.perf_counter() - self.last >= self.every:
            self._write("working")

    def close(self, state="finished"):
        """Stop the background thread and write the closing line (once).

        Parameters
        ----------
        state : str, default "finished"
            The closing line's word.

        Returns
        -------
        None
        """
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join()
        self._write(state)

    def __enter__(self):
        return self

    def __exit__(self, kind, *exc):
        self.close("finished" if kind is None else "stopped")


class _Silent:
    """The reporter when progress is off: counts and writes nothing."""

    def __init__(self):
        self.done = 0

    def update(self, n, final=False, note=None):
        self.done += n

    def close(self, state="finished"):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        pass


class _Bar(_Silent, Progress):
    """The terminal bar with the interface of :class:`ProgressLines` (the
    caller's ``with Progress(...)`` closes it, so closing here does nothing)."""

    def __init__(self, *args, **kwargs):
        Progress.__init__(self, *args, **kwargs)

    def update(self, n, final=False, note=None):
        Progress.update(self, n, final=final)


def reporter(total, progress, label, unit="units", every=LINE_EVERY):
    """The progress display for a long step: a bar, lines, or nothing.

    Parameters
    ----------
    total : int
        Units of work.
    progress : bool, None or "lines"
        True: the bar; False: nothing; None: the bar when stderr is a
        terminal, else nothing; ``"lines"``: a line at least every ``every``
        seconds (:class:`ProgressLines`, for logs: the command line's
        default when stderr is not a terminal).
    label : str
        What runs (starts every line).
    unit : str, default "units"
    every : float, default LINE_EVERY

    Returns
    -------
    object
        With ``update(n, final=False, note=None)`` and ``close()``; a
        context manager that closes it.

    Raises
    ------
    ValueError
        If ``progress`` is none of these, or as :class:`ProgressLines`.
    """
    if isinstance(progress, str):
        if progress != "lines":
            raise InputError(f"'progress' must be True, False, None or 'lines' (got {progress!r})")
        return ProgressLines(total, label, unit=unit, every=every)
    if enabled(progress):
        return _Bar(total, True, unit=unit)
    return _Silent()

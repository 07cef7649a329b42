"""Measurements of one machine (``pipecore calibrate``) and the constants they give.

``pipecore calibrate`` times GEMMs, a large copy, a tiny kernel and
collectives on the local torch device and writes them, as measured, in the
``[measurements]`` table of its TOML file. This module reads and checks
them (a file, or the same table as a dict) and turns them into constants,
each with a source naming the machine and date:

* the achievable GEMM rate: the best FLOP/s over the measured shapes
  (``2 m n k batch / seconds``);
* the achievable memory bandwidth: bytes moved (read plus written) over
  seconds, of the largest buffer measured (smaller ones may sit in cache);
* the kernel overhead: seconds per tiny kernel in a chain of dependent ones;
* per collective, nccl-tests' bus bandwidth (doc/PERFORMANCE.md of
  NVIDIA/nccl-tests): ``busbw = algbw * 2 (n-1)/n`` for an all-reduce,
  ``algbw * (n-1)/n`` for a reduce-scatter or an all-gather (``bytes`` is
  their whole buffer: the reduce-scatter input, the all-gather output) and
  ``algbw`` for a point-to-point send, ``algbw = bytes / seconds``, at the
  largest message; its latency is the time of the smallest message.

:meth:`pipecore.Hardware.calibrate` builds the roofline device from them;
``pipecore.plan.calibrate`` adds the GEMM shape fit and builds the
planner's GPU and cluster.

The table (units: bytes, seconds)::

    [measurements]
    tool = "pipecore calibrate"      # host, device, device_name, date, torch, dtype, backend: text
    ranks = 2                        # processes the collectives ran on (>= 2)
    compute_units = 1                # SMs of a GPU, threads of a CPU rank
    memory_bytes = 1.2e10            # memory of one device (a CPU rank: its share)
    kernel_seconds = 3e-6            # one tiny kernel
    gemm = [{seconds = T, m = 512, n = 512, k = 512, batch = 1}, ...]      # T: the median
    memory = [{seconds = T, op = "copy", bytes = 1.3e8}, ...]       # bytes read + written
    collectives = [{seconds = T, kind = "all-reduce", ranks = 2, bytes = 8}, ...]

Rows may carry ``samples`` (every repetition's seconds; ``seconds`` is their
median).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from ..core.ops import InputError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

__all__ = ["KINDS", "Measurements", "bus_factor", "read_measurements"]

#: Collectives a measurement row may hold, and the point-to-point send.
KINDS = ("all-reduce", "reduce-scatter", "all-gather", "p2p")

_TEXT = ("tool", "host", "device", "device_name", "date", "torch", "dtype", "backend", "like")
_GEMM = ("m", "n", "k", "batch")


def bus_factor(kind, ranks):
    """nccl-tests' ratio of bus bandwidth to algorithm bandwidth.

    Parameters
    ----------
    kind : str
        One of :data:`KINDS`.
    ranks : int
        Ranks in the group (>= 2).

    Returns
    -------
    float
        ``2 (n-1)/n`` (all-reduce), ``(n-1)/n`` (reduce-scatter,
        all-gather) or 1 (p2p).

    Raises
    ------
    InputError
        An unknown kind.
    """
    if kind not in KINDS:
        raise InputError(f"collective kind must be one of {', '.join(KINDS)}, got {kind!r}")
    if kind == "p2p":
        return 1.0
    return (ranks - 1) / ranks * (2.0 if kind == "all-reduce" else 1.0)


def _positive(value, at, key, integer=False, minimum=None):
    """``value`` as a float (or int), refused unless finite and > 0 (or >= minimum)."""
    ok = not isinstance(value, bool) and isinstance(value, int if integer else (int, float))
    if integer and ok and minimum is not None and value < minimum:
        raise InputError(f"{at}{key} must be an integer >= {minimum}, got {value!r}")
    if not ok or not math.isfinite(value) or value <= 0:
        what = "an integer > 0" if integer else "a finite number > 0"
        raise InputError(f"{at}{key} must be {what}, got {value!r}")
    return int(value) if integer else float(value)


def _rows(table, section, at, check):
    rows = table.get(section, [])
    if not isinstance(rows, list):
        raise InputError(f"{at}measurements.{section} must be a list of tables (one per "
                         f"measurement), got {type(rows).__name__}")
    out = []
    for i, row in enumerate(rows):
        key = f"measurements.{section}[{i}]"
        if not isinstance(row, Mapping):
            raise InputError(f"{at}{key} must be a table, got {row!r}")
        for name in ("seconds",) + check.required:
            if name not in row:
                raise InputError(f"{at}{key} has no '{name}' (a row needs "
                                 f"{', '.join(check.required + ('seconds',))})")
        parsed = {"seconds": _positive(row["seconds"], at, f"{key}.seconds")}
        samples = row.get("samples", [])
        if not isinstance(samples, list):
            raise InputError(f"{at}{key}.samples must be a list of seconds, got {samples!r}")
        parsed["samples"] = tuple(_positive(s, at, f"{key}.samples[{j}]") for j, s in enumerate(samples))
        parsed.update(check(row, at, key))
        out.append(parsed)
    return tuple(out)


def _gemm_row(row, at, key):
    return {d: _positive(row[d], at, f"{key}.{d}", integer=True) for d in _GEMM}


_gemm_row.required = _GEMM


def _memory_row(row, at, key):
    return {"op": str(row.get("op", "copy")), "bytes": _positive(row["bytes"], at, f"{key}.bytes")}


_memory_row.required = ("bytes",)


def _collective_row(row, at, key):
    kind = row["kind"]
    if kind not in KINDS:
        raise InputError(f"{at}{key}.kind must be one of {', '.join(KINDS)}, got {kind!r}")
    return {"kind": kind, "ranks": _positive(row["ranks"], at, f"{key}.ranks", integer=True, minimum=2),
            "bytes": _positive(row["bytes"], at, f"{key}.bytes")}


_collective_row.required = ("kind", "ranks", "bytes")


@dataclass(frozen=True)
class Measurements:
    """One machine's measurements, checked (:func:`read_measurements` makes them).

    Attributes
    ----------
    where : str
        The file they came from, or ``""`` for a dict.
    meta : dict
        The table's text fields (host, device, device_name, date, ...) and
        ``ranks``, ``compute_units``, ``memory_bytes``, ``kernel_seconds``
        when present.
    gemm, memory, collectives : tuple of dict
        The rows, each with ``seconds`` and ``samples``.
    """

    where: str
    meta: dict = field(default_factory=dict)
    gemm: tuple = ()
    memory: tuple = ()
    collectives: tuple = ()

    @property
    def at(self):
        """The prefix of messages: ``"<file>: "``, or nothing for a dict."""
        return f"{self.where}: " if self.where else ""

    def source(self):
        """The source string of every constant they give.

        Returns
        -------
        str
            ``"measured by <tool> on <host> (<device_name>, <device>) <date>"``.
        """
        m = self.meta
        return (f"measured by {m.get('tool', 'pipecore calibrate')} on {m.get('host', 'an unnamed host')} "
                f"({m.get('device_name', 'unnamed device')}, {m.get('device', 'torch device')}) "
                f"{m.get('date', 'undated')}")

    def need(self, key, why):
        """The value of ``key`` (a row section or a number), refused when absent.

        Parameters
        ----------
        key : str
            ``"gemm"``, ``"memory"``, ``"collectives"``, ``"kernel_seconds"``,
            ``"memory_bytes"``, ``"compute_units"`` or ``"ranks"``.
        why : str
            What needs it, for the message.

        Returns
        -------
        tuple or float or int

        Raises
        ------
        InputError
            The key is missing or empty, naming the file.
        """
        value = getattr(self, key) if key in ("gemm", "memory", "collectives") else self.meta.get(key)
        if value is None or value == ():
            raise InputError(f"{self.at}measurements.{key} is missing; {why} needs it "
                             f"(pipecore calibrate writes it)")
        return value

    def gemm_rate(self):
        """The best measured GEMM rate and its row.

        Returns
        -------
        (float, dict)
            FLOP/s (``2 m n k batch / seconds``) and the row.

        Raises
        ------
        InputError
            No GEMM rows.
        """
        rows = self.need("gemm", "the GEMM rate")
        best = max(rows, key=lambda r: _flops(r) / r["seconds"])
        return _flops(best) / best["seconds"], best

    def memory_bandwidth(self):
        """Achievable memory bandwidth: the fastest of the largest buffer's rows.

        Returns
        -------
        (float, dict)
            Bytes moved per second and the row.

        Raises
        ------
        InputError
            No memory rows.
        """
        rows = self.need("memory", "the memory bandwidth")
        largest = max(r["bytes"] for r in rows)
        best = max((r for r in rows if r["bytes"] == largest), key=lambda r: r["bytes"] / r["seconds"])
        return best["bytes"] / best["seconds"], best

    def collective(self, kind):
        """Bus bandwidth (largest message) and latency (smallest message) of one kind.

        Parameters
        ----------
        kind : str
            One of :data:`KINDS`.

        Returns
        -------
        dict
            ``busbw`` (bytes/s), ``latency`` (s), ``ranks``, and the
            ``largest`` and ``smallest`` rows.

        Raises
        ------
        InputError
            Fewer than two message sizes of that kind.
        """
        rows = [r for r in self.need("collectives", f"the {kind} figures") if r["kind"] == kind]
        if len({r["bytes"] for r in rows}) < 2:
            raise InputError(f"{self.at}measurements.collectives has {len(rows)} {kind} row(s) of "
                             f"{len({r['bytes'] for r in rows})} message size(s); it needs two sizes or more "
                             f"(the smallest gives the latency, the largest the bus bandwidth)")
        large = max(rows, key=lambda r: (r["bytes"], -r["seconds"]))
        small = min(rows, key=lambda r: (r["bytes"], r["seconds"]))
        busbw = bus_factor(kind, large["ranks"]) * large["bytes"] / large["seconds"]
        return {"busbw": busbw, "latency": small["seconds"], "ranks": large["ranks"],
                "largest": large, "smallest": small}

    def hardware_fields(self):
        """What :class:`pipecore.Hardware` takes from these measurements.

        Returns
        -------
        dict
            ``flops`` (the best GEMM rate), ``memory_bandwidth``,
            ``link_bandwidth`` and ``link_latency`` (point-to-point),
            ``hbm_bytes`` (inf when not measured) and ``name``.

        Raises
        ------
        InputError
            A section it needs is missing.
        """
        p2p = self.collective("p2p")
        return {"flops": self.gemm_rate()[0], "memory_bandwidth": self.memory_bandwidth()[0],
                "link_bandwidth": p2p["busbw"], "link_latency": p2p["latency"],
                "hbm_bytes": self.meta.get("memory_bytes", math.inf),
                "name": self.meta.get("device_name", "calibrated")}


def _flops(row):
    return 2.0 * row["m"] * row["n"] * row["k"] * row["batch"]


def read_measurements(source):
    """Measurements from a file or a dict, checked.

    Parameters
    ----------
    source : str, os.PathLike, dict or Measurements
        A TOML file with a ``[measurements]`` table (``pipecore
        calibrate``'s), that file read as a dict, or the table itself.

    Returns
    -------
    Measurements

    Raises
    ------
    InputError
        A file that is not TOML or has no ``[measurements]`` table, or a
        value that breaks a rule (named by file, key and rule).
    OSError
        A file that cannot be read.
    """
    if isinstance(source, Measurements):
        return source
    if isinstance(source, (str, os.PathLike)):
        where = str(source)
        try:
            with open(Path(source), "rb") as f:
                data = tomllib.load(f)
        except tomllib.TOMLDecodeError as exc:
            raise InputError(f"{where}: not a TOML file ({exc})") from None
        if "measurements" not in data:
            raise InputError(f"{where}: no [measurements] table (pipecore calibrate --out FILE writes one)")
        table = data["measurements"]
    elif isinstance(source, Mapping):
        where = ""
        table = source["measurements"] if "measurements" in source else source
    else:
        raise InputError(f"measurements must be a file path or a dict, got {type(source).__name__}")
    at = f"{where}: " if where else ""
    if not isinstance(table, Mapping):
        raise InputError(f"{at}measurements must be a table, got {type(table).__name__}")
    meta = {k: str(table[k]) for k in _TEXT if k in table}
    for key, integer in (("ranks", True), ("compute_units", True), ("memory_bytes", False),
                         ("kernel_seconds", False)):
        if key in table:
            meta[key] = _positive(table[key], at, f"measurements.{key}", integer=integer,
                                  minimum=2 if key == "ranks" else None)
    found = Measurements(where, meta, _rows(table, "gemm", at, _gemm_row),
                         _rows(table, "memory", at, _memory_row),
                         _rows(table, "collectives", at, _collective_row))
    if "ranks" in meta:
        for i, r in enumerate(found.collectives):
            if r["ranks"] != meta["ranks"]:
                raise InputError(f"{at}measurements.collectives[{i}].ranks must equal "
                                 f"measurements.ranks ({meta['ranks']}), got {r['ranks']}")
    return found

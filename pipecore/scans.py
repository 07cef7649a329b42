"""Design-space scans: a grid of schedules, shapes, costs and networks,
evaluated in batched kernel calls, streamed as Arrow record batches and
written as a Parquet dataset that survives interruption.

The grid's points are numbered: the index runs over (schedule, devices,
microbatches, chunks, network) first and the cost axes last, so
consecutive points share a schedule structure and replay side by side
(see ``_replay``). Parts are contiguous runs of that numbering (or of the
sorted sample), so a part's rows depend only on the grid and the part
number: a resumed scan writes exactly the rows an uninterrupted one would.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import sys
import time
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from . import _replay
from ._pack import Pack, Structure
from ._schedule import ScheduleError
from .batch import COST_COLUMNS, NETWORK_COLUMNS, metrics_from, threads
from .costs import Costs, Network, fits
from .schedules import build, family, schedules

__all__ = ["Grid", "scan", "scan_part", "write_scan", "ScanError", "pareto_front"]

#: Value axes, in index order (innermost last).
VALUE_AXES = COST_COLUMNS + ("memory_limit",)
_NETWORK_FIELDS = ("bytes", "bandwidth", "latency", "devices_per_node", "inter_bandwidth",
                   "inter_latency", "grad_bytes")
MANIFEST = "_scan.json"
SUMMARY = "_summary.json"


class ScanError(ValueError):
    """A grid that cannot be scanned, or an output folder that does not match it."""


def _toml_load(path):
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    with open(path, "rb") as fh:
        return tomllib.load(fh)


def _values(key, spec, integer=False, minimum=None):
    """A grid axis: a scalar, a list, or {min, max, num[, log]} (inclusive)."""
    if isinstance(spec, Mapping):
        extra = sorted(set(spec) - {"min", "max", "num", "log"})
        if extra or not {"min", "max", "num"} <= set(spec):
            raise ScanError(f"grid '{key}': a range is {{min, max, num[, log]}} (got keys "
                            f"{sorted(spec)})")
        lo, hi, num = spec["min"], spec["max"], spec["num"]
        if not isinstance(num, int) or num < 1:
            raise ScanError(f"grid '{key}': 'num' must be an integer >= 1 (got {num!r})")
        if spec.get("log", False):
            if lo <= 0 or hi <= 0:
                raise ScanError(f"grid '{key}': a log range needs min and max > 0")
            vals = np.geomspace(lo, hi, num)
        else:
            vals = np.linspace(lo, hi, num)
        vals = list(vals)
    elif isinstance(spec, (list, tuple)):
        vals = list(spec)
    else:
        vals = [spec]
    if not vals:
        raise ScanError(f"grid '{key}': needs at least one value")
    out = []
    for v in vals:
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise ScanError(f"grid '{key}': {v!r} is not a number")
        if integer:
            if float(v) != int(v):
                raise ScanError(f"grid '{key}': {v!r} is not an integer")
            v = int(v)
        else:
            v = float(v)
            if math.isnan(v):
                raise ScanError(f"grid '{key}': NaN is not a value")
        if minimum is not None and v < minimum:
            raise ScanError(f"grid '{key}': {v!r} is below the minimum {minimum}")
        out.append(v)
    return out


@dataclass
class Grid:
    """What a scan evaluates: the product of its axes, or a seeded sample.

    Parameters
    ----------
    schedules : list of str
        Family names (see :func:`pipecore.schedules`), or ``["all"]``.
    devices, microbatches : list of int
    chunks : list of int, optional
        Stages per device for the families that take them; a family with
        one (or a fixed number of) stages per device uses its own, and a
        repeated structure is evaluated once.
    costs : dict of str to list of float
        Axes among ``f``, ``b``, ``w``, ``comm``, ``fb_factor``,
        ``activation``, ``activation_w``, ``weights`` (per device share, as in
        :class:`~pipecore.Costs`) and ``memory_limit`` (per-device
        activation plus weights); a missing axis takes Costs' default (and no
        limit).
    networks : dict of str to Network or None
        Named networks, an axis of their own (``"free"`` is no network).
    options : dict of str to dict
        Fixed options per family, e.g. ``{"hanayo": {"waves": 2}}``.
    sample : int, optional
        Evaluate this many points drawn without replacement (seeded) instead
        of the whole product.
    seed : int
    part_size : int
        Rows per Parquet part (and per kernel call).
    """

    schedules: list
    devices: list
    microbatches: list
    chunks: list | None = None
    costs: dict = field(default_factory=dict)
    networks: dict = field(default_factory=lambda: {"free": None})
    options: dict = field(default_factory=dict)
    sample: int | None = None
    seed: int = 0
    part_size: int = 100_000
    source: dict | None = None

    def __post_init__(self):
        names = self.schedules
        if isinstance(names, str):
            names = [names]
        if not names:
            raise ScanError("grid 'schedules': needs at least one name")
        if [n.lower() for n in names] == ["all"]:
            names = schedules()
        self.schedules = [family(n).name for n in names]
        self.devices = _values("devices", self.devices, integer=True, minimum=1)
        self.microbatches = _values("microbatches", self.microbatches, integer=True, minimum=1)
        if self.chunks is not None:
            self.chunks = _values("chunks", self.chunks, integer=True, minimum=1)
        unknown = sorted(set(self.costs) - set(VALUE_AXES))
        if unknown:
            raise ScanError(f"grid: unknown cost axis {', '.join(unknown)}; axes are "
                            f"{', '.join(VALUE_AXES)}")
        defaults = Costs()
        axes = {}
        for name in VALUE_AXES:
            if name in self.costs:
                axes[name] = _values(name, self.costs[name], minimum=0.0)
            elif name == "memory_limit":
                axes[name] = [math.inf]
            else:
                axes[name] = [float(getattr(defaults, name))]
        if 0.0 in axes["fb_factor"]:
            raise ScanError("grid 'fb_factor': must be > 0")
        if max(axes["activation_w"]) > min(axes["activation"]):
            raise ScanError(f"grid: 'activation_w' up to {max(axes['activation_w'])} exceeds "
                            f"'activation' down to {min(axes['activation'])}; every combination "
                            f"must have activation_w <= activation")
        self.axes = axes
        if not self.networks:
            raise ScanError("grid 'networks': needs at least one (\"free\" is no network)")
        for name, net in self.networks.items():
            if net is not None and not isinstance(net, Network):
                raise ScanError(f"grid network {name!r} must be a pipecore.Network or None")
            if net is not None and (np.ndim(net.bytes) or np.ndim(net.grad_bytes)):
                raise ScanError(f"grid network {name!r}: scans take scalar 'bytes' and "
                                f"'grad_bytes'")
        for fam_name, opts in self.options.items():
            fam = family(fam_name)
            bad = sorted(set(opts) - set(fam.options))
            if bad:
                raise ScanError(f"grid options for {fam.name!r}: unknown {', '.join(bad)} "
                                f"(its options: {', '.join(fam.options) or 'none'})")
        self.options = {family(k).name: dict(v) for k, v in self.options.items()}
        if self.sample is not None and (not isinstance(self.sample, int) or self.sample < 1):
            raise ScanError(f"grid 'sample' must be an integer >= 1 (got {self.sample!r})")
        if not isinstance(self.part_size, int) or self.part_size < 1:
            raise ScanError(f"grid 'part_size' must be an integer >= 1 (got {self.part_size!r})")
        if not isinstance(self.seed, int):
            raise ScanError(f"grid 'seed' must be an integer (got {self.seed!r})")
        self._structures = self._structure_keys()
        self.network_names = list(self.networks)
        self.axis_sizes = tuple(len(self.axes[a]) for a in VALUE_AXES)
        self.values_per_entry = int(np.prod(self.axis_sizes, dtype=np.int64))
        self.entries = len(self._structures) * len(self.network_names)
        self.points = self.entries * self.values_per_entry
        self._sample = None

    def _structure_keys(self):
        keys = []
        seen = set()
        for name in self.schedules:
            fam = family(name)
            for p in self.devices:
                for m in self.microbatches:
                    for c in (self.chunks or [None]):
                        # A family without a chunks choice uses its own: one structure.
                        eff = c if fam.resolve is not None else fam.chunks_for(c)
                        key = (name, p, m, eff)
                        if key not in seen:
                            seen.add(key)
                            keys.append(key)
        return keys

    @classmethod
    def from_toml(cls, path) -> Grid:
        """Read a grid file.

        Parameters
        ----------
        path : str or Path

        Returns
        -------
        Grid

        Raises
        ------
        ScanError
            If the file is missing, not TOML, or a key is unknown or bad.
        """
        path = Path(path)
        if not path.is_file():
            raise ScanError(f"grid file {str(path)!r} does not exist")
        try:
            data = _toml_load(path)
        except Exception as exc:  # tomllib.TOMLDecodeError and friends
            raise ScanError(f"grid file {str(path)!r} is not valid TOML: {exc}") from None
        return cls.from_dict(data)

    @classmethod
    def from_dict(cls, data: Mapping) -> Grid:
        """A grid from the same keys a grid file has.

        Top-level keys: ``schedules``, ``devices``, ``microbatches``,
        ``chunks``, the cost axes (``f``, ``b``, ... ``memory_limit``),
        ``network`` (names to use, default every table in ``networks``, or
        ``"free"``), ``sample``, ``seed``, ``part_size``; tables
        ``[networks.NAME]`` with Network fields and ``[options.FAMILY]``.

        Parameters
        ----------
        data : mapping

        Returns
        -------
        Grid

        Raises
        ------
        ScanError
            For an unknown key or a bad value, naming it.
        """
        data = dict(data)
        known = {"schedules", "devices", "microbatches", "chunks", "network", "networks",
                 "options", "sample", "seed", "part_size"} | set(VALUE_AXES)
        unknown = sorted(set(data) - known)
        if unknown:
            raise ScanError(f"grid: unknown key(s) {', '.join(unknown)}; keys are "
                            f"{', '.join(sorted(known))}")
        for key in ("schedules", "devices", "microbatches"):
            if key not in data:
                raise ScanError(f"grid: '{key}' is required")
        tables = data.get("networks", {})
        if not isinstance(tables, Mapping):
            raise ScanError("grid 'networks' must be a table of named networks")
        nets = {"free": None}
        for name, spec in tables.items():
            if not isinstance(spec, Mapping):
                raise ScanError(f"grid network {name!r} must be a table of Network fields")
            bad = sorted(set(spec) - set(_NETWORK_FIELDS))
            if bad:
                raise ScanError(f"grid network {name!r}: unknown field(s) {', '.join(bad)}; "
                                f"fields are {', '.join(_NETWORK_FIELDS)}")
            if "bytes" not in spec:
                raise ScanError(f"grid network {name!r}: 'bytes' is required")
            try:
                nets[name] = Network(**spec)
            except ValueError as exc:
                raise ScanError(f"grid network {name!r}: {exc}") from None
        chosen = data.get("network")
        if chosen is None:
            chosen = list(tables) or ["free"]
        if isinstance(chosen, str):
            chosen = [chosen]
        missing = [n for n in chosen if n not in nets]
        if missing:
            raise ScanError(f"grid 'network': {', '.join(map(repr, missing))} not defined; "
                            f"define [networks.NAME] tables (known: {', '.join(nets)})")
        schedules_ = data["schedules"]
        try:
            grid = cls(schedules=schedules_, devices=data["devices"],
                       microbatches=data["microbatches"], chunks=data.get("chunks"),
                       costs={k: data[k] for k in VALUE_AXES if k in data},
                       networks={n: nets[n] for n in chosen},
                       options=dict(data.get("options", {})), sample=data.get("sample"),
                       seed=data.get("seed", 0), part_size=data.get("part_size", 100_000))
        except ScanError:
            raise
        except ValueError as exc:  # unknown schedule name and friends
            raise ScanError(f"grid: {exc}") from None
        grid.source = data
        return grid

    # -- numbering ---------------------------------------------------------

    @property
    def rows(self) -> int:
        """int: points the scan evaluates (before dropping unbuildable shapes)."""
        return self.points if self.sample is None else min(self.sample, self.points)

    @property
    def parts(self) -> int:
        """int: number of parts."""
        return -(-self.rows // self.part_size)

    def sample_indices(self) -> np.ndarray:
        """Sorted point indices of the sample (the whole product if none)."""
        if self.sample is None or self.sample >= self.points:
            return None
        if self._sample is None:
            rng = np.random.default_rng(self.seed)
            if self.points <= 50_000_000:
                idx = rng.choice(self.points, size=self.sample, replace=False)
            else:  # draw with replacement and top up: memory stays O(sample)
                got = np.unique(rng.integers(0, self.points, size=self.sample))
                while got.size < self.sample:
                    more = rng.integers(0, self.points, size=self.sample - got.size)
                    got = np.unique(np.concatenate([got, more]))
                idx = got
            self._sample = np.sort(idx).astype(np.int64)
        return self._sample

    def part_indices(self, k: int) -> np.ndarray:
        """Point indices of part k, ascending."""
        if not 0 <= k < self.parts:
            raise ScanError(f"part {k} out of range (the grid has {self.parts} parts)")
        lo = k * self.part_size
        hi = min(lo + self.part_size, self.rows)
        sample = self.sample_indices()
        if sample is None:
            return np.arange(lo, hi, dtype=np.int64)
        return sample[lo:hi]

    def describe(self) -> dict:
        """A JSON-able, canonical description (what the manifest stores)."""
        nets = {}
        for name, net in self.networks.items():
            nets[name] = None if net is None else {
                f: getattr(net, f) for f in _NETWORK_FIELDS if getattr(net, f) is not None}
        return {"schedules": self.schedules, "devices": self.devices,
                "microbatches": self.microbatches, "chunks": self.chunks,
                "axes": {k: [repr(v) for v in vals] for k, vals in self.axes.items()},
                "networks": {k: {f: repr(v) for f, v in d.items()} if d else None
                             for k, d in nets.items()},
                "options": self.options, "sample": self.sample, "seed": self.seed,
                "part_size": self.part_size}

    def fingerprint(self) -> str:
        """A hash of :meth:`describe`: two grids with the same one scan the same rows."""
        text = json.dumps(self.describe(), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def _as_grid(grid):
    if isinstance(grid, Grid):
        return grid
    if isinstance(grid, Mapping):
        return Grid.from_dict(grid)
    if isinstance(grid, (str, os.PathLike)):
        return Grid.from_toml(grid)
    raise ScanError(f"'grid' must be a Grid, a mapping or a path to a TOML file "
                    f"(got {type(grid).__name__})")


class _StructureCache:
    """Structures built so far, least recently used dropped beyond a bound."""

    def __init__(self, grid, limit=512):
        self.grid = grid
        self.limit = limit
        self.items = OrderedDict()
        self.skipped = {}

    def get(self, sid):
        if sid in self.items:
            self.items.move_to_end(sid)
            return self.items[sid]
        if sid in self.skipped:
            return None
        name, p, m, c = self.grid._structures[sid]
        try:
            sched = build(name, p, m, chunks=c, **self.grid.options.get(name, {}))
            struct = Structure(sched)
        except (ValueError, ScheduleError) as exc:
            self.skipped[sid] = str(exc).splitlines()[0]
            return None
        self.items[sid] = struct
        if len(self.items) > self.limit:
            self.items.popitem(last=False)
        return struct


def _part_table(grid, idx, cache, n_threads):
    """Evaluate the points ``idx`` (ascending) in one kernel call."""
    V = grid.values_per_entry
    n_net = len(grid.network_names)
    entry = idx // V
    rest = idx - entry * V
    uniq, first, counts = np.unique(entry, return_index=True, return_counts=True)
    keep = np.zeros(len(idx), dtype=bool)
    pack_entries = []
    c_struct = np.empty(len(idx), dtype=np.int64)
    meta = []
    for e, lo, cnt in zip(uniq.tolist(), first.tolist(), counts.tolist()):
        sid, net_i = divmod(e, n_net)
        struct = cache.get(sid)
        if struct is None:
            continue
        net = grid.networks[grid.network_names[net_i]]
        c_struct[lo:lo + cnt] = len(pack_entries)
        keep[lo:lo + cnt] = True
        pack_entries.append((struct, None if net is None else net.devices_per_node))
        meta.append((sid, net_i, lo, cnt))
    idx = idx[keep]
    rest = rest[keep]
    c_struct = c_struct[keep]
    n = len(idx)
    if n == 0:
        return None
    digits = np.unravel_index(rest, grid.axis_sizes)
    params = np.empty((_replay.N_PARAMS, n))
    for a, name in enumerate(VALUE_AXES):
        if name == "memory_limit":
            continue
        params[_replay.P_F + COST_COLUMNS.index(name)] = np.asarray(grid.axes[name])[digits[a]]
    params[_replay.P_R] = params[_replay.P_F]  # family schedules have no R ops
    params[_replay.P_CKPT] = 0.0
    limit = np.asarray(grid.axes["memory_limit"])[digits[VALUE_AXES.index("memory_limit")]]
    # Per-entry columns: shape, network.
    sched_i = np.empty(n, dtype=np.int32)
    dev = np.empty(n, dtype=np.int64)
    mbs = np.empty(n, dtype=np.int64)
    chk = np.empty(n, dtype=np.int64)
    net_col = np.empty(n, dtype=np.int32)
    pos = 0
    for (sid, net_i, _lo, cnt), (struct, _dpn) in zip(meta, pack_entries):
        name, p, m, _c = grid._structures[sid]
        sl = slice(pos, pos + cnt)
        sched_i[sl] = grid.schedules.index(name)
        dev[sl] = p
        mbs[sl] = m
        chk[sl] = struct.stages // struct.devices if struct.stages % struct.devices == 0 else 0
        net_col[sl] = net_i
        net = grid.networks[grid.network_names[net_i]]
        nb = 0.0 if net is None else float(net.bytes)
        gb = 0.0 if net is None else float(net.grad_bytes)
        bw = math.inf if net is None else float(net.bandwidth)
        lat = 0.0 if net is None else float(net.latency)
        two = net is not None and net.devices_per_node is not None
        params[_replay.P_BYTES, sl] = nb
        params[_replay.P_GRAD, sl] = gb
        params[_replay.P_BW, sl] = bw
        params[_replay.P_LAT, sl] = lat
        params[_replay.P_IBW, sl] = float(net.inter_bandwidth) if two else bw
        params[_replay.P_ILAT, sl] = float(net.inter_latency) if two else lat
        pos += cnt
    pack = Pack(pack_entries)
    out = np.zeros((_replay.N_OUT, n))
    pack.replay(c_struct, params, out, n_threads)
    metrics = metrics_from(out, dev, mbs)
    cols = {
        "config": pa.array(idx, pa.int64()),
        "schedule": pa.DictionaryArray.from_arrays(pa.array(sched_i), pa.array(grid.schedules)),
        "devices": pa.array(dev, pa.int32()),
        "microbatches": pa.array(mbs, pa.int32()),
        "chunks": pa.array(chk, pa.int32()),
        "network": pa.DictionaryArray.from_arrays(pa.array(net_col),
                                                  pa.array(grid.network_names)),
    }
    for name in COST_COLUMNS + NETWORK_COLUMNS:
        row = (_replay.P_F + COST_COLUMNS.index(name) if name in COST_COLUMNS
               else _replay.P_BYTES + NETWORK_COLUMNS.index(name))
        cols[name] = pa.array(params[row])
    cols["memory_limit"] = pa.array(limit)
    for name, values in metrics.items():
        cols[name] = pa.array(values)
    cols["fits"] = pa.array(fits(metrics["memory_max"], limit))
    return pa.table(cols)


def scan_part(grid, k: int, cache=None) -> pa.Table | None:
    """Evaluate part k of a grid.

    Parameters
    ----------
    grid : Grid, mapping or path
    k : int
        Part number, ``0 <= k < grid.parts``.
    cache : optional
        Structure cache shared across calls (internal).

    Returns
    -------
    pyarrow.Table or None
        The part's rows, or None when every point in it has a shape that
        cannot be built.

    Raises
    ------
    ScanError
        For a bad grid or part number.
    """
    grid = _as_grid(grid)
    cache = cache or _StructureCache(grid)
    return _part_table(grid, grid.part_indices(k), cache, threads())


def scan(grid, parts=None) -> Iterator[pa.RecordBatch]:
    """Evaluate a grid, streaming one Arrow record batch per part.

    Parameters
    ----------
    grid : Grid, mapping or path to a TOML grid file
    parts : iterable of int, optional
        Which parts (default all, in order).

    Yields
    ------
    pyarrow.RecordBatch
        Columns ``config`` (the point's index), ``schedule``, ``devices``,
        ``microbatches``, ``chunks``, ``network``, the cost and network
        columns, ``memory_limit``, then ``makespan``, ``bubble_ratio``,
        ``bubble_rate``, ``throughput``, ``peak_activation_max``,
        ``memory_max`` and ``fits``. Points whose shape cannot be built (a
        family's constraint) yield no row; :func:`write_scan` lists them.

    Raises
    ------
    ScanError
        For a bad grid.
    """
    grid = _as_grid(grid)
    cache = _StructureCache(grid)
    for k in (range(grid.parts) if parts is None else parts):
        table = scan_part(grid, k, cache)
        if table is not None:
            yield from table.to_batches(max_chunksize=table.num_rows)


# -- durable output -------------------------------------------------------

def _part_name(k):
    return f"part-{k:06d}.parquet"


def _write_atomic(table, folder, k):
    final = folder / _part_name(k)
    tmp = folder / f".{_part_name(k)}.{os.getpid()}.tmp"
    try:
        pq.write_table(table, tmp)
        with open(tmp, "rb") as fh:  # publish only what is on disk
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    except BaseException:  # Ctrl-C mid-write: leave no half part behind
        tmp.unlink(missing_ok=True)
        raise


def _empty_marker(folder, k):
    # A part with no buildable point leaves a marker so resume knows it is done.
    final = folder / f"_empty-{k:06d}"
    final.write_text("")


def _done_parts(folder):
    done = set()
    for path in folder.iterdir():
        name = path.name
        if name.startswith("part-") and name.endswith(".parquet"):
            done.add(int(name[5:11]))
        elif name.startswith("_empty-"):
            done.add(int(name[7:13]))
    return done


def pareto_front(x, y):
    """Indices of the points no other point beats in both x and y (lower is better).

    Parameters
    ----------
    x, y : numpy.ndarray

    Returns
    -------
    numpy.ndarray
        Indices sorted by x.

    Raises
    ------
    None
        Nothing beyond errors of the objects it is given.
    """
    order = np.lexsort((y, x))
    best = np.inf
    keep = []
    for i in order:
        if y[i] < best:
            keep.append(i)
            best = y[i]
    return np.array(keep, dtype=np.int64)


class _Progress:
    def __init__(self, total, enabled, stream=None):
        self.total = total
        self.enabled = enabled
        self.stream = sys.stderr if stream is None else stream  # looked up now, not at import
        self.done = 0
        self.t0 = time.perf_counter()
        self.last = 0.0

    def update(self, n, final=False):
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
                          f"{rate:,.0f} configs/s ETA {eta}  ")
        if final:
            self.stream.write("\n")
        self.stream.flush()


def write_scan(grid, out, resume: bool = False, backend: str = "local", address=None,
               progress=None, plot: bool = True) -> dict:
    """Evaluate a grid into a Parquet dataset, one file per part.

    A part becomes visible only when complete (written to a hidden
    temporary file, synced, then renamed), so a scan killed at any moment
    leaves only whole parts; ``resume=True`` skips them and writes exactly
    the rows an uninterrupted run would.

    Parameters
    ----------
    grid : Grid, mapping or path to a TOML grid file
    out : str or Path
        Output folder (created). It holds ``part-NNNNNN.parquet`` files,
        ``_scan.json`` (the grid, to check a resume against),
        ``_summary.json`` and ``_pareto.png`` when done (names starting with "_" or
        "." are skipped by Parquet dataset readers).
    resume : bool
        Continue a scan of the same grid in ``out``.
    backend : {"local", "ray"}
        Where parts are evaluated; ``"ray"`` needs the ``pipecore[ray]``
        extra.
    address : str, optional
        Ray cluster address (``"auto"`` for a running one); a local Ray
        instance by default.
    progress : bool, optional
        Show a progress bar (default: when stderr is a terminal).
    plot : bool
        Write ``_pareto.png`` (makespan over the bubble-free ideal
        ``m (f + b + w)`` vs memory of the worst device, per family) when
        matplotlib is installed.

    Returns
    -------
    dict
        The summary also written to ``_summary.json``: rows, parts, skipped
        shapes with their reasons, seconds, configs/s.

    Raises
    ------
    ScanError
        For a bad grid, a non-empty ``out`` holding another scan (or any
        scan without ``resume``), or an unknown backend.
    """
    grid = _as_grid(grid)
    if backend not in ("local", "ray"):
        raise ScanError(f"'backend' must be 'local' or 'ray' (got {backend!r})")
    if backend == "ray":
        import importlib.util

        if importlib.util.find_spec("ray") is None:  # before anything is written to ``out``
            raise ScanError('the Ray backend needs Ray: pip install "pipecore[ray]" '
                            '(or use the local backend)')
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    manifest = folder / MANIFEST
    fp = grid.fingerprint()
    if manifest.exists():
        old = json.loads(manifest.read_text())
        if old.get("fingerprint") != fp:
            raise ScanError(f"{str(folder)!r} holds a scan of a different grid "
                            f"(fingerprint {old.get('fingerprint')} != {fp}); use a new folder")
        if not resume:
            raise ScanError(f"{str(folder)!r} already holds this scan; pass resume=True "
                            f"(--resume) to continue it, or use a new folder")
    else:
        if any(p.name.startswith("part-") for p in folder.iterdir()):
            raise ScanError(f"{str(folder)!r} holds part files but no {MANIFEST}; use a new folder")
        manifest.write_text(json.dumps({"fingerprint": fp, "grid": grid.describe(),
                                        "points": grid.points, "rows": grid.rows,
                                        "parts": grid.parts}, indent=1))
    for stale in folder.glob(".part-*.tmp"):  # left by a killed run
        stale.unlink()
    done = _done_parts(folder)
    todo = [k for k in range(grid.parts) if k not in done]
    sizes = {k: min(grid.part_size, grid.rows - k * grid.part_size) for k in range(grid.parts)}
    enabled = sys.stderr.isatty() if progress is None else bool(progress)
    bar = _Progress(sum(sizes[k] for k in todo), enabled)
    t0 = time.perf_counter()
    written = 0
    skipped = {}
    # Testing aid: seconds to pause after each part, so a test can kill a scan mid-run.
    delay = float(os.environ.get("PIPECORE_SCAN_DELAY", "0") or 0)
    if backend == "local":
        cache = _StructureCache(grid)
        for k in todo:
            if delay:
                time.sleep(delay)
            table = _part_table(grid, grid.part_indices(k), cache, threads())
            if table is None:
                _empty_marker(folder, k)
            else:
                _write_atomic(table, folder, k)
                written += table.num_rows
            bar.update(sizes[k])
        skipped = cache.skipped
    else:
        from ._ray import run_parts

        for k, table, sk in run_parts(grid, todo, address):
            if table is None:
                _empty_marker(folder, k)
            else:
                _write_atomic(table, folder, k)
                written += table.num_rows
            skipped.update(sk)
            bar.update(sizes[k])
    bar.update(0, final=True)
    seconds = time.perf_counter() - t0
    summary = {"fingerprint": fp, "parts": grid.parts, "parts_written": len(todo),
               "rows_written": written, "seconds": seconds,
               "configs_per_s": (sum(sizes[k] for k in todo) / seconds) if seconds > 0 else None,
               "skipped": {"/".join(map(str, grid._structures[s])): why
                           for s, why in sorted(skipped.items())}}
    summary["rows"] = sum(pq.ParquetFile(f).metadata.num_rows
                          for f in folder.glob("part-*.parquet"))
    if plot:
        summary["plot"] = _plot_pareto(folder)
    (folder / SUMMARY).write_text(json.dumps(summary, indent=1))
    return summary


def _plot_pareto(folder):
    """Pareto frontier of normalised time vs memory, per family; path or None."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    files = sorted(folder.glob("part-*.parquet"))
    if not files:
        return None
    fronts = {}
    # One part at a time, keeping only each family's running frontier: memory stays flat.
    for path in files:
        t = pq.read_table(path, columns=["schedule", "makespan", "microbatches", "memory_max",
                                         "f", "b", "w"])
        sched = t.column("schedule").combine_chunks()
        names = sched.dictionary.to_pylist()
        codes = sched.indices.to_numpy()
        x = t.column("memory_max").to_numpy()
        # Time relative to the bubble-free ideal m (f + b + w), so rows with
        # different costs compare: 1.0 means no bubble.
        ideal = t.column("microbatches").to_numpy() * (
            t.column("f").to_numpy() + t.column("b").to_numpy() + t.column("w").to_numpy())
        with np.errstate(divide="ignore", invalid="ignore"):
            y = np.where(ideal > 0, t.column("makespan").to_numpy() / ideal, np.inf)
        for c in np.unique(codes):
            sel = codes == c
            px, py = x[sel], y[sel]
            old = fronts.get(names[c])
            if old is not None:
                px = np.concatenate([old[0], px])
                py = np.concatenate([old[1], py])
            keep = pareto_front(px, py)
            fronts[names[c]] = (px[keep], py[keep])
    fig, ax = plt.subplots(figsize=(8, 5))
    for name, (px, py) in sorted(fronts.items()):
        ax.step(px, py, where="post", marker=".", label=name)
    ax.set_xlabel("memory of the worst device (activation + weights)")
    ax.set_ylabel("makespan / (m (f + b + w))   [1 = no bubble]")
    ax.set_xscale("log")
    ax.set_title("Pareto frontier per schedule family")
    ax.legend(fontsize=7, ncol=2)
    ax.grid(alpha=0.3)
    path = folder / "_pareto.png"  # "_" keeps it out of Parquet dataset discovery
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return str(path)

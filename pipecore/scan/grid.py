"""A scan's grid: its axes, the numbering of its points and parts, and the
evaluation of one part (shared by the local and the Ray backend)."""

from __future__ import annotations

import hashlib
import json
import math
import os
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from ..core.costs import Costs, Network, fits
from ..core.ops import InputError
from ..core.pack import Pack, ReplayStructure
from ..core.schedule import ScheduleError
from ..kernels import codes as _codes
from ..schedules.registry import build, family, schedules
from .batch import COST_COLUMNS, METRIC_COLUMNS, NETWORK_COLUMNS, flag_overflow, metrics_from

#: Value axes, in index order (innermost last).
VALUE_AXES = COST_COLUMNS + ("memory_limit",)
_NETWORK_FIELDS = ("bytes", "bandwidth", "latency", "devices_per_node", "inter_bandwidth",
                   "inter_latency", "grad_bytes")
MANIFEST = "_scan.json"
SUMMARY = "_summary.json"


class ScanError(InputError):
    """A grid that cannot be scanned, or an output folder that does not match it."""


def _toml_load(path):
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib
    with open(path, "rb") as fh:
        return tomllib.load(fh)


#: Values one axis may hold: a grid is a product of axes, so more is a typo, not a scan.
_MAX_AXIS = 1_000_000
#: Shapes (family x devices x microbatches x chunks) a grid may hold: each is a schedule
#: to build, so more would not finish.
_MAX_SHAPES = 1_000_000
#: Parts a scan may have (10**12 rows at the default part size).
_MAX_PARTS = 10_000_000


def _values(key, spec, integer=False, minimum=None, allow_inf=False):
    """A grid axis: a scalar, a list, or {min, max, num[, log]} (inclusive)."""
    if isinstance(spec, Mapping):
        extra = sorted(set(spec) - {"min", "max", "num", "log"})
        if extra or not {"min", "max", "num"} <= set(spec):
            raise ScanError(f"grid '{key}': a range is {{min, max, num[, log]}} (got keys "
                            f"{sorted(spec)})")
        lo, hi, num = spec["min"], spec["max"], spec["num"]
        if isinstance(num, bool) or not isinstance(num, int) or not 1 <= num <= _MAX_AXIS:
            raise ScanError(f"grid '{key}': 'num' must be an integer from 1 to {_MAX_AXIS:,} "
                            f"(got {num!r})")
        for end, value in (("min", lo), ("max", hi)):
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value)):
                raise ScanError(f"grid '{key}': '{end}' must be a finite number (got {value!r})")
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
    if len(vals) > _MAX_AXIS:
        raise ScanError(f"grid '{key}': {len(vals):,} values; an axis holds at most "
                        f"{_MAX_AXIS:,}")
    out = []
    for v in vals:
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise ScanError(f"grid '{key}': {v!r} is not a number")
        if integer:
            if not math.isfinite(float(v)) or float(v) != int(v):
                raise ScanError(f"grid '{key}': {v!r} is not an integer")
            v = int(v)
        else:
            v = float(v)
            if math.isnan(v):
                raise ScanError(f"grid '{key}': NaN is not a value")
            if math.isinf(v) and not allow_inf:  # as Costs refuses it
                raise ScanError(f"grid '{key}': {v!r} is not a finite number")
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
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
            raise ScanError(f"grid 'schedules' must be a list of family names, or \"all\" "
                            f"(got {names!r:.60})")
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
                # An infinite memory limit is no limit; every cost must be finite.
                axes[name] = _values(name, self.costs[name], minimum=0.0,
                                     allow_inf=name == "memory_limit")
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
            if fam.check is not None:
                try:
                    fam.check(dict(opts))
                except ValueError as exc:
                    raise ScanError(f"grid [options.{fam.name}]: {exc}") from None
        self.options = {family(k).name: dict(v) for k, v in self.options.items()}
        if self.sample is not None and (not isinstance(self.sample, int) or self.sample < 1):
            raise ScanError(f"grid 'sample' must be an integer >= 1 (got {self.sample!r})")
        if not isinstance(self.part_size, int) or self.part_size < 1:
            raise ScanError(f"grid 'part_size' must be an integer >= 1 (got {self.part_size!r})")
        if not isinstance(self.seed, int):
            raise ScanError(f"grid 'seed' must be an integer (got {self.seed!r})")
        shapes = (len(self.schedules) * len(self.devices) * len(self.microbatches)
                  * len(self.chunks or [None]))
        if shapes > _MAX_SHAPES:  # before a key per shape is made
            raise ScanError(f"grid: {shapes:,} shapes (schedules x devices x microbatches x "
                            f"chunks); a grid holds at most {_MAX_SHAPES:,}")
        self._structures = self._structure_keys()
        self.network_names = list(self.networks)
        self.axis_sizes = tuple(len(self.axes[a]) for a in VALUE_AXES)
        self.values_per_entry = math.prod(self.axis_sizes)  # Python ints: no silent overflow
        self.entries = len(self._structures) * len(self.network_names)
        self.points = self.entries * self.values_per_entry
        if self.points >= 2**63:
            raise ScanError(f"grid: {self.points:.3g} points, more than a configuration number "
                            f"(int64) can hold; scan fewer values")
        if self.parts > _MAX_PARTS:  # write_scan keeps a little state per part
            raise ScanError(f"grid: {self.rows:,} rows make {self.parts:,} parts of part_size "
                            f"{self.part_size:,}; at most {_MAX_PARTS:,} parts: raise 'part_size', "
                            f"take a 'sample' or scan fewer values")
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
            A TOML file with the keys :meth:`from_dict` takes.

        Returns
        -------
        Grid
            As :meth:`from_dict` makes it from the file's tables.

        Raises
        ------
        ScanError
            If the file is missing, not TOML, or a key is unknown or bad.
        """
        path = Path(path)
        if path.is_dir():
            raise ScanError(f"grid file {str(path)!r} is a folder, not a TOML file")
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
            Keys and values as in a grid file (lists for the axes).

        Returns
        -------
        Grid
            Checked: every key known, every value in range.

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
        if not isinstance(chosen, (list, tuple)) or not all(isinstance(n, str) for n in chosen):
            raise ScanError(f"grid 'network' must be a name or a list of names of "
                            f"[networks.NAME] tables (got {chosen!r:.60})")
        options = data.get("options", {})
        if not isinstance(options, Mapping) or not all(isinstance(v, Mapping)
                                                       for v in options.values()):
            raise ScanError(f"grid 'options' must be tables [options.FAMILY] of option = value "
                            f"(got {options!r:.60})")
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
                       options=dict(options), sample=data.get("sample"),
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
            struct = ReplayStructure(sched)
        except (ValueError, ScheduleError) as exc:
            self.skipped[sid] = str(exc).splitlines()[0]
            return None
        self.items[sid] = struct
        if len(self.items) > self.limit:
            self.items.popitem(last=False)
        return struct


_LABELS = pa.dictionary(pa.int32(), pa.string())
#: The columns of every part of every scan, names and types: what
#: :func:`_part_table` makes and what verifying a part compares its footer with.
PART_SCHEMA = pa.schema(
    [("config", pa.int64()), ("schedule", _LABELS), ("devices", pa.int32()),
     ("microbatches", pa.int32()), ("chunks", pa.int32()), ("network", _LABELS)]
    + [(name, pa.float64()) for name in COST_COLUMNS + NETWORK_COLUMNS + ("memory_limit",)]
    + [(name, pa.float64()) for name in METRIC_COLUMNS]
    + [("fits", pa.bool_()), ("error", _LABELS)])


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
    params = np.empty((_codes.N_PARAMS, n))
    for a, name in enumerate(VALUE_AXES):
        if name == "memory_limit":
            continue
        params[_codes.P_F + COST_COLUMNS.index(name)] = np.asarray(grid.axes[name])[digits[a]]
    params[_codes.P_R] = params[_codes.P_F]  # family schedules have no R ops
    params[_codes.P_CKPT] = 0.0
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
        params[_codes.P_BYTES, sl] = nb
        params[_codes.P_GRAD, sl] = gb
        params[_codes.P_BW, sl] = bw
        params[_codes.P_LAT, sl] = lat
        params[_codes.P_IBW, sl] = float(net.inter_bandwidth) if two else bw
        params[_codes.P_ILAT, sl] = float(net.inter_latency) if two else lat
        pos += cnt
    pack = Pack(pack_entries)
    out = np.zeros((_codes.N_OUT, n))
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
        row = (_codes.P_F + COST_COLUMNS.index(name) if name in COST_COLUMNS
               else _codes.P_BYTES + NETWORK_COLUMNS.index(name))
        cols[name] = pa.array(params[row])
    cols["memory_limit"] = pa.array(limit)
    flagged = flag_overflow(metrics)
    error = flagged.pop("error")
    for name, values in flagged.items():
        cols[name] = pa.array(values)
    cols["fits"] = pa.array(fits(metrics["memory_max"], limit))
    cols["error"] = error
    return pa.table(cols, schema=PART_SCHEMA)

"""The communication-aware comparison study: every family, three views, a
grid of compute speeds x network speeds built from a model description.

The grid's two axes are SPEED factors on the hardware
(:meth:`Hardware.scaled`): compute speed x10 multiplies the FLOP/s and the
memory bandwidth by ten (every op takes a tenth of the time), network
speed x10 multiplies the link bandwidth by ten and divides the latency by
ten (every transfer takes a tenth of the time). Times are seconds, memory
is in M (one microbatch's activation of one device share).

For each grid cell (compute speed x network speed), each family and each
(devices, microbatches) it accepts, the study evaluates

* the closed formula (zero communication) at the cell's op times,
* the idealised table (unit op times, no communication), and
* the simulation with transfers on a bandwidth-limited network,

ranks the families under each view, and reports where the rankings differ:
where communication overturns what bubble counting predicts.
"""

from __future__ import annotations

import json
import textwrap
from dataclasses import asdict, dataclass

import numpy as np
import pyarrow as pa

from ..core import tier
from ..core.costs import Costs, Network
from ..core.ops import InputError
from ..core.progress import reporter
from ..core.simulate import simulate
from ..schedules.registry import build, family, schedules
from .formulas import formula
from .model import Hardware
from .table import ideal_table

__all__ = ["Hardware", "TransformerModel", "study", "summarize", "detail", "describe",
           "study_metadata", "GRID_FACTORS", "SPEED_COLUMNS"]

#: Speed factors of the 3 x 3 grid: a tenth of the preset's speed, the
#: preset, ten times faster.
GRID_FACTORS = (0.1, 1.0, 10.0)

#: The grid's columns: factors on the hardware's compute speed and network speed.
SPEED_COLUMNS = ("compute_speed", "network_speed")

#: What a speed factor means, as the Parquet metadata and the text say it.
SPEED_MEANING = ("compute_speed and network_speed are factors on the hardware's SPEED (not on "
                 "costs): compute_speed x10 multiplies FLOP/s and memory bandwidth by 10, so every "
                 "op takes a tenth of the time; network_speed x10 multiplies link bandwidth by 10 "
                 "and divides link latency by 10, so every transfer takes a tenth of the time")
MEMORY_MEANING = "M = one microbatch's activation of one device share (the device's layers)"


@dataclass(frozen=True)
class TransformerModel:
    """A stack of equal transformer layers, one microbatch at a time.

    Per layer and microbatch (b sequences of s tokens, hidden size h), the
    Zero Bubble paper's Table 1 gives the FLOPs: forward s b h (24h + 4s),
    backward for inputs s b h (24h + 8s), backward for weights 24 s b h^2.
    Bytes moved per op for the roofline: the layer's 12 h^2 weights plus
    its 34 s b h activation bytes (both in 2-byte values). A transfer
    between stages carries s b h values.

    Parameters
    ----------
    layers, hidden, seq, microbatch : int
        Model shape.
    bytes_per_value : int, default 2
        Size of one value (BF16).

    Raises
    ------
    ValueError
        If a shape value is not a positive int.
    """

    layers: int = 128
    hidden: int = 4096
    seq: int = 2048
    microbatch: int = 1
    bytes_per_value: int = 2

    def __post_init__(self):
        for field in ("layers", "hidden", "seq", "microbatch", "bytes_per_value"):
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
                raise InputError(f"TransformerModel '{field}' must be an int >= 1 (got {value!r})")

    def layer_times(self, hw: Hardware) -> tuple[float, float, float]:
        """Roofline times (seconds) of one layer's F, B and W for one microbatch.

        Parameters
        ----------
        hw : Hardware
            Timed with its roofline (:meth:`pipecore.Hardware.roofline`).

        Returns
        -------
        tuple of float
            ``(f, b, w)`` in seconds.
        """
        s, b, h = self.seq, self.microbatch, self.hidden
        flops = (s * b * h * (24 * h + 4 * s), s * b * h * (24 * h + 8 * s), 24 * s * b * h * h)
        moved = self.bytes_per_value * (12 * h * h) + 34 * s * b * h
        return tuple(hw.roofline(x, moved) for x in flops)

    def costs(self, hw: Hardware, devices: int) -> Costs:
        """Costs of one device share (layers / devices layers), seconds.

        Parameters
        ----------
        hw : Hardware
        devices : int

        Returns
        -------
        Costs
        """
        f, b, w = self.layer_times(hw)
        per_device = self.layers / devices
        return Costs(f=f * per_device, b=b * per_device, w=w * per_device)

    def network(self, hw: Hardware) -> Network:
        """Links carrying one activation (s b h values) per transfer.

        Parameters
        ----------
        hw : Hardware
            Its links' bandwidth and latency.

        Returns
        -------
        Network
            Uniform links, or two levels when ``hw`` has nodes.

        Raises
        ------
        ValueError
            If the link parameters are invalid.
        """
        return hw.network(self.seq * self.microbatch * self.hidden * self.bytes_per_value)


def study_metadata(model, hardware, factors) -> dict:
    """What a study's numbers were computed with, as Parquet metadata.

    Parameters
    ----------
    model : TransformerModel
    hardware : Hardware
        The unscaled hardware (the grid's factors apply to it).
    factors : sequence of float
        The speed factors of the grid.

    Returns
    -------
    dict of bytes to bytes
        ``pipecore.model`` and ``pipecore.hardware`` (JSON of their
        fields), ``pipecore.time_unit`` (``s``), ``pipecore.memory_unit``,
        ``pipecore.speed_factors`` (JSON list) and ``pipecore.speed_meaning``.
    """
    # JSON has no infinity: an unlimited memory is written as "inf".
    hw = {k: ("inf" if isinstance(v, float) and np.isinf(v) else v)
          for k, v in asdict(hardware).items()}
    return {b"pipecore.model": json.dumps({"kind": "transformer", **asdict(model)}).encode(),
            b"pipecore.hardware": json.dumps(hw).encode(),
            b"pipecore.time_unit": b"s",
            b"pipecore.memory_unit": MEMORY_MEANING.encode(),
            b"pipecore.speed_factors": json.dumps([float(x) for x in factors]).encode(),
            b"pipecore.speed_meaning": SPEED_MEANING.encode()}


def _si(value, unit):
    """``value`` with a decimal prefix (989e12 FLOP/s -> "989 TFLOP/s")."""
    for scale, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, ""),
                          (1e-3, "m"), (1e-6, "u"), (1e-9, "n")):
        if abs(value) >= scale:
            return f"{value / scale:.4g} {prefix}{unit}"
    return f"{value:g} {unit}"


def describe(model, hardware, factors) -> list[str]:
    """The lines that say what a study computed: model, hardware, grid and units.

    Parameters
    ----------
    model : TransformerModel
    hardware : Hardware
        Unscaled.
    factors : sequence of float
        Speed factors of the grid.

    Returns
    -------
    list of str
    """
    grid = ", ".join(f"x{x:g}" for x in factors)
    hbm = ("unlimited memory" if not np.isfinite(hardware.hbm_bytes)
           else f"{_si(hardware.hbm_bytes, 'B')} of memory")
    lines = [
        f"model: transformer, {model.layers} layers of hidden size {model.hidden}, sequence "
        f"{model.seq} tokens, microbatch {model.microbatch} sequence(s), "
        f"{model.bytes_per_value}-byte values; p devices hold {model.layers}/p layers each",
        f"hardware: preset \"{hardware.name}\": {_si(hardware.flops, 'FLOP/s')} and "
        f"{_si(hardware.memory_bandwidth, 'B/s')} memory bandwidth per device, {hbm}; links "
        f"{_si(hardware.link_bandwidth, 'B/s')} per direction, {_si(hardware.link_latency, 's')} "
        f"latency",
        f"grid: compute speed {grid} by network speed {grid}, factors on the hardware's "
        f"SPEED: compute x10 = ten times the FLOP/s and memory bandwidth (ops take a tenth of "
        f"the time); network x10 = ten times the link bandwidth and a tenth of the latency "
        f"(transfers take a tenth of the time)",
        "units: times in seconds per training iteration (all m microbatches, forward and "
        "backward); memory in M, one microbatch's activation of one device share",
    ]
    return [part for line in lines for part in textwrap.wrap(line, 100, subsequent_indent="  ")]


def _meta(table):
    """(model, hardware, factors) from a study table's metadata, or None."""
    meta = table.schema.metadata or {}
    if b"pipecore.model" not in meta or b"pipecore.hardware" not in meta:
        return None
    model = json.loads(meta[b"pipecore.model"])
    model.pop("kind", None)
    hw = {k: (np.inf if v == "inf" else v) for k, v in json.loads(meta[b"pipecore.hardware"]).items()}
    factors = json.loads(meta.get(b"pipecore.speed_factors", b"[]"))
    return TransformerModel(**model), Hardware(**hw), factors


@tier.compiled()  # many simulations: compile at once, no interpreted budget
def study(devices=(4, 8), microbatches=(8, 16, 32, 64, 128, 256), model=None, hardware=None,
          names=None, factors=GRID_FACTORS, progress=None) -> pa.Table:
    """Evaluate every family three ways over a grid of compute and network speeds.

    Parameters
    ----------
    devices, microbatches : sequence of int
        Pipeline shapes; a family that does not take a shape is skipped
        for it (the row says why).
    model : TransformerModel, optional
        Defaults to ``TransformerModel()`` (128 layers, hidden 4096).
    hardware : Hardware, optional
        Defaults to ``Hardware.preset("dgx-h100")``.
    names : sequence of str, optional
        Families; all by default.
    factors : sequence of float
        Speed factors for compute and for network (the grid is their
        product): x10 is ten times the hardware's speed
        (:meth:`Hardware.scaled`), so op or transfer times are ten times
        shorter.
    progress : bool, None or "lines", optional
        A progress bar per shape (default: when stderr is a terminal);
        ``"lines"``: a plain line at least every few seconds, for logs.

    Returns
    -------
    pyarrow.Table
        One row per (family, devices, microbatches, compute_speed,
        network_speed): ``formula_time`` and ``sim_time`` (seconds),
        ``table_slots`` and ``table_time`` (slots per chunk count: unit op
        times, comparable across chunkings), ``formula_rank``,
        ``table_rank``, ``sim_rank`` within the (devices, microbatches,
        compute_speed, network_speed) group (1 = fastest),
        ``peak_activation`` (simulated, in M), ``error`` (why the family
        was skipped, else null). The schema's metadata
        (:func:`study_metadata`) records the model, the hardware, the time
        unit and what the speed factors mean.

    Raises
    ------
    ValueError
        For bad shapes, unknown names or non-positive factors.
    """
    model = TransformerModel() if model is None else model
    hardware = Hardware.preset("dgx-h100") if hardware is None else hardware
    names = schedules() if names is None else [family(n).name for n in names]
    for x in factors:
        if not x > 0:
            raise InputError(f"grid factors must be > 0 (got {x})")
    rows = []
    devices, microbatches = list(devices), list(microbatches)
    with reporter(len(devices) * len(microbatches), progress, "study",
                  unit="shapes") as bar:
        for p in devices:
            for m in microbatches:
                bar.update(0, note=f"p={p} m={m}")
                built = {}
                for name in names:
                    try:
                        built[name] = build(name, p, m)
                    except ValueError as exc:
                        built[name] = exc
                slots = {n: ideal_table(s).length for n, s in built.items()
                         if not isinstance(s, Exception)}
                for cf in factors:
                    for nf in factors:
                        hw = hardware.scaled(cf, nf)
                        net = model.network(hw)
                        group = []
                        for name, sched in built.items():
                            row = {"family": name, "devices": p, "microbatches": m,
                                   "compute_speed": cf, "network_speed": nf,
                                   "formula_time": None, "table_slots": None,
                                   "table_time": None, "sim_time": None,
                                   "peak_activation": None, "error": None}
                            if isinstance(sched, Exception):
                                row["error"] = str(sched)
                                rows.append(row)
                                continue
                            costs = model.costs(hw, p)
                            res = simulate(sched, costs, net)
                            # A table slot is one op of one stage: 1/v of a device share's
                            # work, so slots / v compares families with different chunks.
                            row.update(formula_time=float(formula(sched, costs)["makespan"]),
                                       table_slots=int(slots[name]),
                                       table_time=slots[name] / sched.chunks,
                                       sim_time=res.makespan,
                                       peak_activation=float(res.peak_activation.max()))
                            group.append(row)
                            rows.append(row)
                        for view in ("formula_time", "table_time", "sim_time"):
                            order = sorted(group, key=lambda r, v=view: (r[v], r["family"]))
                            for rank, r in enumerate(order, 1):
                                r[view.split("_")[0] + "_rank"] = rank
                bar.update(1, final=(p, m) == (devices[-1], microbatches[-1]))
    for r in rows:
        for key in ("formula_rank", "table_rank", "sim_rank"):
            r.setdefault(key, None)
    table = pa.Table.from_pylist(rows)
    return table.replace_schema_metadata(study_metadata(model, hardware, factors))


def _groups(table):
    rows = [r for r in table.to_pylist() if r["error"] is None]
    groups = {}
    for r in rows:
        groups.setdefault((r["devices"], r["microbatches"], r["compute_speed"],
                           r["network_speed"]), []).append(r)
    return groups


def _left_out(table):
    """Lines naming the families a shape could not build, and why."""
    why = {}
    for r in table.to_pylist():
        if r["error"] is not None:
            why.setdefault((r["family"], r["error"]), set()).add((r["devices"], r["microbatches"]))
    lines = []
    for (name, error), shapes in sorted(why.items()):
        where = ", ".join(f"p={p} m={m}" for p, m in sorted(shapes))
        lines += textwrap.wrap(f"{name} at {where}: {error}", 118, initial_indent="  ",
                               subsequent_indent="    ")
    return lines


def summarize(table: pa.Table) -> str:
    """Text summary: what was computed, then per grid cell and shape the
    winner under each view and whether the simulation overturns the formula.

    Parameters
    ----------
    table : pyarrow.Table
        From :func:`study` (its metadata gives the model and hardware lines;
        a table without it gets no such lines).

    Returns
    -------
    str
    """
    groups = _groups(table)
    lines = []
    meta = _meta(table)
    if meta is not None:
        families = len({r["family"] for r in table.to_pylist()})
        lines += textwrap.wrap(f"pipecore study: {families} families, each three ways (closed "
                               "formula, ideal table, simulation with transfers) on a grid of "
                               "compute and network speeds", 120, subsequent_indent="  ")
        lines += describe(*meta)
        lines.append("")
    marks = {}
    overturned = 0
    for key in sorted(groups):
        g = groups[key]
        best = {v: min(g, key=lambda r, v=v: (r[v], r["family"]))
                for v in ("formula_time", "table_time", "sim_time")}
        # Overturned: the simulation's winner is not among the formula's best
        # (ties in the formula, e.g. two zero-bubble schedules, do not count).
        lowest = min(r["formula_time"] for r in g)
        flip = best["sim_time"]["formula_time"] > lowest * (1 + 1e-9)
        overturned += flip
        if flip:
            mark = "yes"
        elif best["sim_time"]["family"] != best["formula_time"]["family"]:
            mark = "no (tie)"  # the simulation's winner is one of the formula's tied best
        else:
            mark = "no"
        marks[key] = (best, mark)
    lines.append(f"summary: in {overturned} of {len(groups)} cells communication changes the "
                 f"winner the formula predicts")
    lines += textwrap.wrap(
        "p: devices; m: microbatches; compute-speed, network-speed: factors on the hardware's "
        "speed (x10 = ten times faster); *-best: the fastest family under the closed formula "
        "(no communication), the ideal table (unit op times) and the simulation (transfers on "
        "the links), ties by name; sim-time: the simulation's best iteration time; overturned: "
        "yes when the simulation's winner is not among the formula's best, 'no (tie)' when it "
        "is one of several the formula ties for best.", 118, initial_indent="  ",
        subsequent_indent="  ")
    lines.append("   p     m  compute-speed  network-speed  formula-best      table-best"
                 "        sim-best          sim-time (s)  overturned")
    for key in sorted(marks):
        best, mark = marks[key]
        lines.append(f"{key[0]:>4}  {key[1]:>4}  {'x%g' % key[2]:>13}  {'x%g' % key[3]:>13}  "
                     f"{best['formula_time']['family']:<16}  {best['table_time']['family']:<16}  "
                     f"{best['sim_time']['family']:<16}  {best['sim_time']['sim_time']:>12.4g}  "
                     f"{mark}")
    left = _left_out(table)
    if left:
        lines.append("left out (the family cannot build the shape):")
        lines += left
    return "\n".join(lines)


def detail(table: pa.Table) -> str:
    """Text detail: every family's simulated time per shape at one grid cell.

    The cell is compute and network speed x1 when the grid has it (else
    the first); the Parquet file holds every cell.

    Parameters
    ----------
    table : pyarrow.Table
        From :func:`study`.

    Returns
    -------
    str
    """
    rows = table.to_pylist()
    if not rows:
        return "detail: no rows"
    cells = sorted({(r["compute_speed"], r["network_speed"]) for r in rows})
    cell = (1.0, 1.0) if (1.0, 1.0) in cells else cells[0]
    at = {(r["family"], r["devices"], r["microbatches"]): r for r in rows
          if (r["compute_speed"], r["network_speed"]) == cell}
    families = sorted({k[0] for k in at})
    lines = textwrap.wrap(f"detail: simulated iteration time (s) of every family at compute "
                          f"speed x{cell[0]:g}, network speed x{cell[1]:g} (its rank in "
                          f"brackets, 1 = fastest; '-': the family cannot build the shape; "
                          f"study.parquet holds every cell)", 100, subsequent_indent="  ")
    for p in sorted({k[1] for k in at}):
        ms = sorted({k[2] for k in at if k[1] == p})
        lines.append(f"  p={p:<3} {'family':<16}" + "".join(f"{'m=' + str(m):>14}" for m in ms))
        for name in families:
            cols = []
            for m in ms:
                r = at.get((name, p, m))
                if r is None or r["error"] is not None:
                    cols.append(f"{'-':>14}")
                else:
                    cols.append(f"{r['sim_time']:>9.4g} ({r['sim_rank']:>2})")
            lines.append(f"        {name:<16}" + "".join(cols))
    return "\n".join(lines)

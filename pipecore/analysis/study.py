"""The communication-aware comparison study: every family, three views, a
compute x network grid built from a model description.

For each grid cell (compute speed x network speed), each family and each
(devices, microbatches) it accepts, the study evaluates

* the closed formula (zero communication) at the cell's op times,
* the idealised table (unit op times, no communication), and
* the simulation with transfers on a bandwidth-limited network,

ranks the families under each view, and reports where the rankings differ:
where communication overturns what bubble counting predicts.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from ..core import tier
from ..core.costs import Costs, Network
from ..core.progress import Progress, enabled
from ..core.simulate import simulate
from ..schedules.registry import build, family, schedules
from .formulas import formula
from .model import Hardware
from .table import ideal_table

__all__ = ["Hardware", "TransformerModel", "study", "summarize", "GRID_FACTORS"]

#: Scale factors of the 3 x 3 grid: a tenth, the preset, ten times.
GRID_FACTORS = (0.1, 1.0, 10.0)


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
                raise ValueError(f"TransformerModel '{field}' must be an int >= 1 (got {value!r})")

    def layer_times(self, hw: Hardware) -> tuple[float, float, float]:
        """Roofline times (seconds) of one layer's F, B and W for one microbatch.

        Parameters
        ----------
        hw : Hardware

        Returns
        -------
        tuple of float

        Raises
        ------
        None
            Nothing beyond errors of the objects it is given.
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

        Raises
        ------
        None
            Nothing beyond errors of the objects it is given.
        """
        f, b, w = self.layer_times(hw)
        per_device = self.layers / devices
        return Costs(f=f * per_device, b=b * per_device, w=w * per_device)

    def network(self, hw: Hardware) -> Network:
        """Links carrying one activation (s b h values) per transfer.

        Parameters
        ----------
        hw : Hardware

        Returns
        -------
        Network

        Raises
        ------
        ValueError
            If the link parameters are invalid.
        """
        return hw.network(self.seq * self.microbatch * self.hidden * self.bytes_per_value)


@tier.compiled()  # many simulations: compile at once, no interpreted budget
def study(devices=(4, 8), microbatches=(8, 16, 32, 64, 128, 256), model=None, hardware=None,
          names=None, factors=GRID_FACTORS, progress=None) -> pa.Table:
    """Evaluate every family three ways over a compute x network grid.

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
        Scale factors for compute and for network (the grid is their
        product).
    progress : bool, optional
        Show a progress bar per shape (default: when stderr is a terminal).

    Returns
    -------
    pyarrow.Table
        One row per (family, devices, microbatches, compute, network):
        ``formula_time`` and ``sim_time`` (seconds), ``table_slots`` and
        ``table_time`` (slots per chunk count: unit op times, comparable
        across chunkings), ``formula_rank``, ``table_rank``, ``sim_rank``
        within the (devices, microbatches, compute, network) group
        (1 = fastest), ``peak_activation`` (simulated, in M), ``error`` (why
        the family was skipped, else null).

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
            raise ValueError(f"grid factors must be > 0 (got {x})")
    rows = []
    devices, microbatches = list(devices), list(microbatches)
    bar = Progress(len(devices) * len(microbatches), enabled(progress), unit="shapes")
    for p in devices:
        for m in microbatches:
            bar.update(0)
            built = {}
            for name in names:
                try:
                    built[name] = build(name, p, m)
                except ValueError as exc:
                    built[name] = exc
            slots = {n: ideal_table(s).length for n, s in built.items() if not isinstance(s, Exception)}
            for cf in factors:
                for nf in factors:
                    hw = hardware.scaled(cf, nf)
                    net = model.network(hw)
                    group = []
                    for name, sched in built.items():
                        row = {"family": name, "devices": p, "microbatches": m, "compute": cf,
                               "network": nf, "formula_time": None, "table_slots": None,
                               "table_time": None, "sim_time": None, "peak_activation": None,
                               "error": None}
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
                                   table_time=slots[name] / sched.chunks, sim_time=res.makespan,
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
    return pa.Table.from_pylist(rows)


def summarize(table: pa.Table) -> str:
    """Text summary: per grid cell and shape, the winner under each view.

    Parameters
    ----------
    table : pyarrow.Table
        From :func:`study`.

    Returns
    -------
    str

    Raises
    ------
    None
        Nothing beyond errors of the objects it is given.
    """
    rows = [r for r in table.to_pylist() if r["error"] is None]
    groups = {}
    for r in rows:
        groups.setdefault((r["devices"], r["microbatches"], r["compute"], r["network"]), []).append(r)
    lines = ["devices  microbatches  compute  network  formula-best      table-best        "
             "sim-best          overturned"]
    overturned = 0
    for key in sorted(groups):
        g = groups[key]
        best = {v: min(g, key=lambda r, v=v: (r[v], r["family"]))["family"]
                for v in ("formula_time", "table_time", "sim_time")}
        # Overturned: the simulation's winner is not among the formula's best
        # (ties in the formula, e.g. two zero-bubble schedules, do not count).
        lowest = min(r["formula_time"] for r in g)
        sim_best = min(g, key=lambda r: (r["sim_time"], r["family"]))
        flip = sim_best["formula_time"] > lowest * (1 + 1e-9)
        overturned += flip
        if flip:
            mark = "yes"
        elif sim_best["family"] != best["formula_time"]:
            mark = "no (tie)"  # the simulation's winner is one of the formula's tied best
        else:
            mark = "no"
        lines.append(f"{key[0]:>7}  {key[1]:>12}  {key[2]:>7g}  {key[3]:>7g}  "
                     f"{best['formula_time']:<16}  {best['table_time']:<16}  "
                     f"{best['sim_time']:<16}  {mark}")
    lines.append(f"{overturned} of {len(groups)} settings: communication changes the winner "
                 f"the formula predicts")
    lines.append("compute, network: factors on the compute costs (f, b, w) and on the "
                 "communication costs; *-best: the fastest family under the closed formula, "
                 "the ideal table and the simulation (ties by name); overturned: yes when the "
                 "simulation's winner is not among the formula's best, 'no (tie)' when it is "
                 "one of several the formula ties for best.")
    return "\n".join(lines)


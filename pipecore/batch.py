"""Many cost settings of one schedule in one kernel call."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import pyarrow as pa

from . import _kernels
from ._schedule import Schedule
from .costs import Costs, Network
from .simulate import network_arrays, validate

__all__ = ["simulate_many"]

_COLUMNS = ("f", "b", "w", "comm", "fb_factor", "activation", "activation_w")


def _columns(costs_table, n_rows=None):
    if isinstance(costs_table, pa.Table):
        data = {name: costs_table.column(name).to_numpy() for name in costs_table.column_names}
    elif isinstance(costs_table, Mapping):
        data = {str(k): np.asarray(v) for k, v in costs_table.items()}
    else:
        raise ValueError(f"'costs_table' must be a pyarrow.Table or a mapping of columns "
                         f"(got {type(costs_table).__name__})")
    unknown = sorted(set(data) - set(_COLUMNS))
    if unknown:
        raise ValueError(f"unknown cost column(s) {', '.join(unknown)}; columns are "
                         f"{', '.join(_COLUMNS)}")
    lengths = {k: v.shape[0] if v.ndim == 1 else -1 for k, v in data.items()}
    if any(x < 0 for x in lengths.values()):
        bad = [k for k, x in lengths.items() if x < 0][0]
        raise ValueError(f"cost column '{bad}' must be one-dimensional")
    if len(set(lengths.values())) > 1:
        raise ValueError(f"cost columns differ in length: {lengths}")
    n = next(iter(lengths.values())) if lengths else 0
    if n == 0:
        raise ValueError("'costs_table' has no rows")
    defaults = Costs()
    out = {}
    for name in _COLUMNS:
        col = data.get(name)
        col = (np.full(n, float(getattr(defaults, name))) if col is None
               else np.ascontiguousarray(col, dtype=np.float64))
        positive = name == "fb_factor"
        bad = np.flatnonzero(~np.isfinite(col) | (col < 0) | ((col == 0) & positive))
        if bad.size:
            i = int(bad[0])
            rule = "> 0" if positive else ">= 0"
            raise ValueError(f"cost column '{name}' row {i}: must be finite and {rule} "
                             f"(got {col[i]})")
        out[name] = col
    over = np.flatnonzero(out["activation_w"] > out["activation"])
    if over.size:
        i = int(over[0])
        raise ValueError(f"row {i}: 'activation_w' must be <= 'activation' "
                         f"({out['activation_w'][i]} > {out['activation'][i]})")
    return out, n


def simulate_many(schedule: Schedule, costs_table, network: Network | None = None) -> pa.Table:
    """Simulate one schedule under many cost settings in a single kernel call.

    The settings run in parallel inside the kernel (one per row); each gives
    the same numbers as :func:`pipecore.simulate` with the matching scalar
    :class:`~pipecore.Costs`.

    Parameters
    ----------
    schedule : Schedule
    costs_table : pyarrow.Table or mapping of str to array_like
        One row per setting, columns among ``f``, ``b``, ``w``, ``comm``,
        ``fb_factor``, ``activation``, ``activation_w`` (scalars per device
        share, as in Costs); a missing column takes Costs' default.
    network : Network, optional
        The same links for every setting; without one, transfers take
        ``comm`` and never contend.

    Returns
    -------
    pyarrow.Table
        The input columns plus ``makespan``, ``bubble_ratio``,
        ``bubble_rate`` and ``peak_activation_max``.

    Raises
    ------
    ValueError
        For an unknown or malformed column, a negative or NaN value (naming
        the row), or a network that does not fit the schedule.
    ScheduleError
        If the schedule deadlocks.
    """
    if not isinstance(schedule, Schedule):
        raise ValueError(f"'schedule' must be a pipecore.Schedule (got {type(schedule).__name__})")
    cols, n = _columns(costs_table)
    validate(schedule)
    st = schedule._info()
    S = st["stages"]
    p = schedule.devices
    send_stage = st["op_stage"][st["x_src"]]
    x_ser, x_net_lat = network_arrays(st, network, S)
    chunks_div = S // p if S % p == 0 else 0
    makespan = np.empty(n)
    busy_sum = np.empty(n)
    busy_max = np.empty(n)
    span_max = np.empty(n)
    peak_max = np.empty(n)
    status = np.empty(n, dtype=np.int64)
    _kernels.simulate_batch(
        st["dev_ptr"], st["op_kind"], st["op_stage"], st["dep"], st["xfer"], st["out_ptr"],
        st["x_dst_dev"], st["x_link"], st["n_links"], st["paired"], send_stage.astype(np.int32),
        x_ser, x_net_lat, S, chunks_div, p,
        cols["f"], cols["b"], cols["w"], cols["comm"], cols["fb_factor"], cols["activation"],
        cols["activation_w"], makespan, busy_sum, busy_max, span_max, peak_max, status)
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(makespan > 0, 1.0 - busy_sum / (p * makespan), 0.0)
        rate = np.where(span_max > 0, (span_max - busy_max) / span_max, 0.0)
    out = {name: cols[name] for name in _COLUMNS}
    out.update(makespan=makespan, bubble_ratio=ratio, bubble_rate=rate,
               peak_activation_max=peak_max)
    return pa.table(out)

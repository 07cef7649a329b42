"""Many configurations of one schedule in one kernel call."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numba
import numpy as np
import pyarrow as pa

from ..core.costs import SMALLEST_NORMAL, Costs, Network, fits
from ..core.ops import InputError, check_choice, check_type
from ..core.pack import Pack, structure_of
from ..core.result import bubble_rate, bubble_ratio
from ..core.schedule import BW, B, R, Schedule, ScheduleError, W
from ..kernels import codes as _codes
from ..kernels import sweep as _sweep

__all__ = ["simulate_many", "product", "COST_COLUMNS", "NETWORK_COLUMNS", "RECOMPUTE_COLUMNS",
           "OP_TIME_COLUMNS", "METRIC_COLUMNS"]

#: Per-configuration cost columns (scalars per device share, as in Costs).
COST_COLUMNS = ("f", "b", "w", "comm", "fb_factor", "activation", "activation_w", "weights")
#: Per-configuration network columns (as in Network; inter_* apply across nodes).
NETWORK_COLUMNS = ("bytes", "grad_bytes", "bandwidth", "latency", "inter_bandwidth",
                   "inter_latency")
#: Metric columns every evaluation returns (``fits`` too when a limit is given).
METRIC_COLUMNS = ("makespan", "bubble_ratio", "bubble_rate", "throughput",
                  "peak_activation_max", "memory_max")

#: Recompute columns (Costs.r, Costs.checkpoint); ``r`` defaults to ``f``.
RECOMPUTE_COLUMNS = ("r", "checkpoint")
#: Fused-backward time and per-op overhead (Costs.bw, Costs.overhead); folded
#: into the f, b, w, r rows before the kernels run (see _fold_op_times).
OP_TIME_COLUMNS = ("bw", "overhead")

_PARAM_ROW = {name: i for i, name in enumerate(COST_COLUMNS + NETWORK_COLUMNS)}
_PARAM_ROW.update(r=_codes.P_R, checkpoint=_codes.P_CKPT)
_POSITIVE = {"fb_factor", "bandwidth", "inter_bandwidth"}
_INFINITE_OK = {"bandwidth", "inter_bandwidth"}


def _network_defaults(network):
    """Scalar network columns and devices_per_node from a Network (or none)."""
    if network is None:
        return ({"bytes": 0.0, "grad_bytes": 0.0, "bandwidth": math.inf, "latency": 0.0,
                 "inter_bandwidth": math.inf, "inter_latency": 0.0}, None)
    if not isinstance(network, Network):
        raise InputError(f"'network' must be a pipecore.Network (got {type(network).__name__})")
    for name in ("bytes", "grad_bytes"):
        if np.ndim(getattr(network, name)):
            raise InputError(f"simulate_many takes scalar Network '{name}' (one size for every "
                             f"stage); give per-stage sizes to simulate() instead")
    two = network.devices_per_node is not None
    return ({"bytes": float(network.bytes), "grad_bytes": float(network.grad_bytes),
             "bandwidth": float(network.bandwidth), "latency": float(network.latency),
             "inter_bandwidth": float(network.inter_bandwidth if two else network.bandwidth),
             "inter_latency": float(network.inter_latency if two else network.latency)},
            network.devices_per_node)


def _numbers(name, values, where="column"):
    """A column of real numbers, or an error naming the column, row and value.

    Bools and complex numbers are refused, as Costs refuses them: True is
    not a time, and numpy would silently drop an imaginary part.
    """
    if isinstance(values, (str, bytes, Mapping)):
        raise InputError(f"{where} {name!r}: {values!r:.40} is not a list of numbers")
    try:
        arr = np.asarray(values)
    except (ValueError, TypeError) as exc:  # ragged nesting
        raise InputError(f"{where} {name!r} is not a flat list of numbers ({exc})") from None
    kind = arr.dtype.kind
    if kind in "iuf":
        return arr
    # The caller's own values when it gave a list: numpy turns [1, "a"] into strings.
    items = values if isinstance(values, (list, tuple)) else arr.reshape(-1)
    for i, v in enumerate(items):
        if isinstance(v, (bool, np.bool_, complex, np.complexfloating)) \
                or not isinstance(v, (int, float, np.integer, np.floating)):
            shown = v.item() if isinstance(v, np.generic) else v
            row = f" row {i}" if arr.ndim <= 1 else ""
            raise InputError(f"{where} {name!r}{row}: {shown!r} is not a real number "
                             f"({type(shown).__name__})")
    return arr.astype(np.float64)


def _as_columns(table, what="costs_table"):
    if isinstance(table, pa.Table):
        out = {}
        for name in table.column_names:
            col = table.column(name)
            if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
                raise InputError(f"{what} column {name!r} has type {col.type}; it needs "
                                 f"numbers (integer or float)")
            if col.null_count:
                row = int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])
                raise InputError(f"{what} column {name!r} row {row}: null is not a value")
            out[name] = col.to_numpy()
        return out
    if isinstance(table, Mapping):
        return {str(k): _numbers(str(k), v) for k, v in table.items()}
    raise InputError(f"'{what}' must be a pyarrow.Table or a mapping of columns "
                     f"(got {type(table).__name__})")


def param_matrix(data, n, network_defaults):
    """Check configuration columns and stack them into the kernels' matrix.

    Parameters
    ----------
    data : dict of str to numpy.ndarray
        Columns among COST_COLUMNS, NETWORK_COLUMNS and RECOMPUTE_COLUMNS,
        each of length n.
    n : int
        Number of configurations.
    network_defaults : dict
        Values for missing network columns.

    Returns
    -------
    numpy.ndarray
        Shape (``kernels.codes.N_PARAMS``, n), float64, rows in ``kernels.codes.P_*``
        order.

    Raises
    ------
    ValueError
        Naming the column and row of the first bad value.
    """
    defaults = Costs()
    params = np.empty((_codes.N_PARAMS, n))
    # Filled and range-checked in one threaded pass per row; the element-wise
    # checks below only run to name the first bad row.
    n_chunks = max(1, min(threads() * 4, n // 65536))
    lo, hi = np.empty(n_chunks), np.empty(n_chunks)
    none = np.empty(0)
    for name, row in _PARAM_ROW.items():
        col = data.get(name)
        if col is None:
            if name == "r":
                continue  # filled from f below
            value = network_defaults[name] if name in network_defaults else float(getattr(defaults, name))
            _sweep.fill_row(params, row, none, float(value), lo, hi, n_chunks)
            continue
        # Writable too: a read-only column (Arrow's) would compile fill_row twice.
        col = np.require(col, np.float64, ["C", "W"])
        if col.shape != (n,):  # the kernel does not bounds-check
            raise InputError(f"column '{name}' has shape {col.shape}; expected ({n},)")
        positive = name in _POSITIVE
        _sweep.fill_row(params, row, col, 0.0, lo, hi, n_chunks)
        # NaN makes both comparisons false.
        low, high = (float(lo.min()), float(hi.max())) if n else (1.0, 1.0)
        if (low > 0 if positive else low >= 0) and (high < np.inf or (high == np.inf
                                                                   and name in _INFINITE_OK)):
            continue
        finite = np.isfinite(col) | (np.isposinf(col) & (name in _INFINITE_OK))
        bad = np.flatnonzero(~finite | (col < 0) | ((col == 0) & positive))
        if bad.size:
            i = int(bad[0])
            rule = "> 0" if positive else ">= 0"
            rule = ("finite or inf and " if name in _INFINITE_OK else "finite and ") + rule
            raise InputError(f"column '{name}' row {i}: must be {rule} (got {col[i]})")
    if data.get("r") is None:
        params[_codes.P_R] = params[_codes.P_F]
    for name, row in (("activation_w", _codes.P_ACTW), ("checkpoint", _codes.P_CKPT)):
        if name not in data and "activation" not in data:
            continue  # both rows hold the checked defaults
        over = np.flatnonzero(params[row] > params[_codes.P_ACT])
        if over.size:
            i = int(over[0])
            raise InputError(f"row {i}: '{name}' must be <= 'activation' "
                             f"({params[row, i]} > {params[_codes.P_ACT, i]})")
    return params


def _fold_op_times(data, params, schedule, struct):
    """Fold ``bw`` and ``overhead`` columns into the kernel's f, b, w, r rows.

    The kernels price a BW as b + w and know no overhead; adding the
    overhead times the chunk divisor to a per-device-share value adds it
    once per op after the kernel's share. A schedule with BW ops and no B
    or W ops gets b = bw (+ overhead) and w = 0, which only BW reads.
    Exact (bit for bit with simulate) for 1, 2 or 4 chunks per device;
    other divisors agree to rounding.
    """
    given = [name for name in OP_TIME_COLUMNS if name in data]
    if not given:
        return params
    n = params.shape[1]
    cols = {}
    for name in given:
        col = np.asarray(data[name], dtype=np.float64)
        bad = np.flatnonzero(~np.isfinite(col) | (col < 0))
        if bad.size:
            i = int(bad[0])
            raise InputError(f"column '{name}' row {i}: must be finite and >= 0 (got {col[i]})")
        cols[name] = col
    o = cols.get("overhead", np.zeros(n))
    k = struct.chunks_div if struct.chunks_div > 0 else struct.stages / struct.devices
    codes = schedule.kind_codes
    params = params.copy()
    b, w = params[_codes.P_B].copy(), params[_codes.P_W].copy()
    bw = cols.get("bw", b + w)
    for row in (_codes.P_F, _codes.P_R, _codes.P_B, _codes.P_W):
        params[row] = params[row] + o * k
    if (codes == BW).any():
        split = bool(((codes == B) | (codes == W)).any())
        if split:
            wrong = np.flatnonzero((o != 0) | (bw != b + w))
            if wrong.size:
                i = int(wrong[0])
                raise InputError(
                    f"row {i}: schedule {schedule.name!r} has both fused BW ops and split B/W ops; "
                    f"simulate_many prices its BW as b + w, so it takes no 'overhead' and no 'bw' "
                    f"other than b + w here (got overhead={o[i]}, bw={bw[i]}, b + w={b[i] + w[i]}); "
                    f"use pipecore.simulate")
        else:
            params[_codes.P_B] = bw + o * k
            params[_codes.P_W] = 0.0
    return params


def metrics_from(out, devices, microbatches):
    """Metric columns from the kernels' output rows (see METRIC_COLUMNS)."""
    makespan = out[_codes.O_MAKESPAN]
    if np.ndim(devices) == 0 and np.ndim(microbatches) == 0:
        # One shape for every row (simulate_many): one pass, no temporaries.
        n = makespan.shape[0]
        ratio, rate, throughput = np.empty(n), np.empty(n), np.empty(n)
        _sweep.sweep_metrics(out, float(devices), float(microbatches), ratio, rate, throughput)
    else:
        ratio = bubble_ratio(out[_codes.O_BUSY_SUM], devices, makespan)
        rate = bubble_rate(out[_codes.O_SPAN_MAX], out[_codes.O_BUSY_MAX])
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            throughput = np.where(makespan > 0, microbatches / makespan, np.inf)
    return {"makespan": makespan, "bubble_ratio": ratio, "bubble_rate": rate,
            "throughput": throughput, "peak_activation_max": out[_codes.O_PEAK_ACT],
            "memory_max": out[_codes.O_PEAK_TOTAL]}


#: The ``error`` column's text for a row whose times overflowed.
OVERFLOW = ("times overflow float64 (an op time, a transfer time or their sum exceeds "
            "1.8e308): scale the costs to a larger unit")
#: ... for a row whose makespan is positive but subnormal.
UNDERFLOW = ("times underflow float64 (the makespan is below 2.2e-308, float64's smallest "
             "normal number, where too few digits remain for accurate times and ratios): scale "
             "the costs to a smaller unit")
#: ... and for a row whose times are fine but whose throughput is not.
THROUGHPUT_OVERFLOW = ("throughput overflows float64 (microbatches / makespan exceeds 1.8e308): "
                       "scale the costs to a smaller unit")


def flag_overflow(metrics):
    """Rows whose times are not accurate numbers get null time metrics and an ``error``.

    Times that overflow (not finite) or underflow (a positive makespan below
    float64's smallest normal number, :data:`~pipecore.core.costs.SMALLEST_NORMAL`)
    null the row's makespan, ratios and throughput; a row whose times are
    fine but whose throughput overflows nulls the throughput alone. Each
    says why in ``error``. The column ``error`` is always there
    (dictionary-encoded, null on good rows), so every part of a scan has one
    schema.
    """
    makespan = metrics["makespan"]
    over = ~(np.isfinite(makespan) & np.isfinite(metrics["bubble_ratio"])
             & np.isfinite(metrics["bubble_rate"]))
    under = (makespan > 0) & (makespan < SMALLEST_NORMAL)
    bad = over | under
    fast = ~bad & (makespan > 0) & ~np.isfinite(metrics["throughput"])
    out = dict(metrics)
    if bad.any():
        for name in ("makespan", "bubble_ratio", "bubble_rate", "throughput"):
            out[name] = pa.array(metrics[name], mask=bad)
    if fast.any():
        out["throughput"] = pa.array(metrics["throughput"], mask=bad | fast)
    code = np.where(over, 0, np.where(under, 1, 2)).astype(np.int32)
    out["error"] = pa.DictionaryArray.from_arrays(
        pa.array(code, mask=~(bad | fast)), pa.array([OVERFLOW, UNDERFLOW, THROUGHPUT_OVERFLOW]))
    return out


def threads():
    """Numba threads the batched kernels use."""
    return numba.get_num_threads()


def product(**columns) -> dict:
    """Every combination of the given value lists, as columns for :func:`simulate_many`.

    ``simulate_many`` zips its columns row by row; ``product(f=[1, 2],
    b=[1, 2, 3])`` gives the 6 rows of every (f, b) pair, with the first
    column varying slowest (the order of ``itertools.product``).

    Parameters
    ----------
    **columns : sequence of float
        Column name to its values (a scalar counts as one value).

    Returns
    -------
    dict of str to numpy.ndarray
        One array per column, all of length the product of the lengths.

    Raises
    ------
    ValueError
        If no column is given or a column has no values.
    """
    if not columns:
        raise InputError("product() needs at least one column, e.g. product(f=[1, 2])")
    values = {}
    for name, v in columns.items():
        arr = np.atleast_1d(_numbers(name, v, where="product(): column").astype(np.float64))
        if arr.ndim != 1 or arr.size == 0:
            raise InputError(f"product(): column {name!r} needs a non-empty list of numbers "
                             f"(got {v!r})")
        values[name] = arr
    grids = np.meshgrid(*values.values(), indexing="ij")
    return {name: g.ravel() for name, g in zip(values, grids)}


def simulate_many(schedule: Schedule, costs_table, network: Network | None = None,
                  method: str = "replay") -> pa.Table:
    """Simulate one schedule under many configurations in a single kernel call.

    Each row gives the same numbers as :func:`pipecore.simulate` with the
    matching scalar :class:`~pipecore.Costs` and :class:`~pipecore.Network`
    (``makespan`` bit for bit). The schedule's execution order is computed
    once and replayed for every row, 64 rows side by side in SIMD lanes;
    this is exact because every link has one sender and queues transfers in
    that sender's program order (docs/semantics.md). ``method="list"`` runs
    the full list scheduler per row instead (the cross-check).

    Parameters
    ----------
    schedule : Schedule
    costs_table : pyarrow.Table or mapping of str to array_like
        One row per configuration: columns are zipped row by row (all the
        same length), not combined; :func:`product` makes every combination
        of value lists. Cost columns ``f``, ``b``, ``w``,
        ``comm``, ``fb_factor``, ``activation``, ``activation_w``,
        ``weights`` (scalars per device share, as in Costs); network columns
        ``bytes``, ``grad_bytes``, ``bandwidth``, ``latency``,
        ``inter_bandwidth``, ``inter_latency`` (as in Network); recompute
        columns ``r`` and ``checkpoint`` (as in Costs; ``r`` defaults to
        ``f``, and both are returned when given or when the schedule has R
        ops); and ``memory_limit`` (per-device total memory, activation
        plus weights). A missing cost column takes Costs' default, a
        missing network column the ``network`` argument's value (no
        network: free links).
    network : Network, optional
        Topology (``devices_per_node``) and default network values; its
        byte sizes must be scalars.
    method : {"replay", "list"}, default "replay"

    Returns
    -------
    pyarrow.Table
        The cost columns (resolved), the network columns when a network or
        any network column was given, ``memory_limit`` if given, then
        ``makespan``, ``bubble_ratio`` (makespan based), ``bubble_rate``
        (longest per-device span, the ZB paper's), ``throughput``
        (microbatches per time unit), ``peak_activation_max`` and
        ``memory_max`` (activation plus weights of the worst device), and
        ``fits`` (``memory_max <= memory_limit`` up to a relative 1e-9 for
        rounding, see ``pipecore.core.costs.fits``) when a limit is given,
        and ``error``: null, or why the row has no answer (its times
        overflow float64; its time metrics are then null, never inf or
        NaN).

    Raises
    ------
    ValueError
        For an unknown or malformed column, a negative or NaN value (naming
        the column and row), per-stage network sizes, or an unknown method.
    ScheduleError
        If the schedule breaks a rule or deadlocks.
    """
    check_type("schedule", schedule, Schedule, "a pipecore.Schedule")
    check_choice("method", method, ("replay", "list"))
    data = _as_columns(costs_table)
    allowed = COST_COLUMNS + NETWORK_COLUMNS + RECOMPUTE_COLUMNS + OP_TIME_COLUMNS + ("memory_limit",)
    unknown = sorted(set(data) - set(allowed))
    if unknown:
        raise InputError(f"unknown column(s) {', '.join(unknown)}; columns are "
                         f"{', '.join(allowed)}")
    lengths = {k: (v.shape[0] if v.ndim == 1 else -1) for k, v in data.items()}
    bad = [k for k, x in lengths.items() if x < 0]
    if bad:
        raise InputError(f"column '{bad[0]}' must be one-dimensional")
    if len(set(lengths.values())) > 1:
        raise InputError(f"columns differ in length: {lengths}")
    n = next(iter(lengths.values())) if lengths else 0
    if n == 0:
        raise InputError("'costs_table' has no rows")
    net_defaults, dpn = _network_defaults(network)
    params = param_matrix({k: v for k, v in data.items() if k not in OP_TIME_COLUMNS}, n,
                          net_defaults)
    limit = None
    if "memory_limit" in data:
        limit = np.asarray(data["memory_limit"], dtype=np.float64)
        wrong = np.flatnonzero(np.isnan(limit) | (limit < 0))
        if wrong.size:
            raise InputError(f"column 'memory_limit' row {int(wrong[0])}: must be >= 0 "
                             f"(got {limit[int(wrong[0])]})")
    struct = structure_of(schedule)
    pack = Pack([(struct, dpn)])
    out = np.zeros((_codes.N_OUT, n))
    c_struct = np.zeros(n, dtype=np.int64)
    run = _fold_op_times(data, params, schedule, struct)
    if method == "replay":
        pack.replay(c_struct, run, out, threads())
    else:
        status = np.zeros(n, dtype=np.int64)
        pack.list_schedule(c_struct, run, out, status, threads())
        if (status != _codes.STATUS_OK).any():  # validation ran first; keep the promise anyway
            raise ScheduleError("deadlock in the batched list scheduler", rule="deadlock")
    cols = {name: params[_PARAM_ROW[name]] for name in COST_COLUMNS}
    if network is not None or any(name in data for name in NETWORK_COLUMNS):
        cols.update({name: params[_PARAM_ROW[name]] for name in NETWORK_COLUMNS})
    if any(name in data for name in RECOMPUTE_COLUMNS) or (schedule.kind_codes == R).any():
        cols.update({name: params[_PARAM_ROW[name]] for name in RECOMPUTE_COLUMNS})
    for name in OP_TIME_COLUMNS:
        if name in data:
            cols[name] = np.asarray(data[name], dtype=np.float64)
    if limit is not None:
        cols["memory_limit"] = limit
    metrics = metrics_from(out, struct.devices, struct.microbatches)
    flagged = flag_overflow(metrics)
    error = flagged.pop("error")
    cols.update(flagged)
    if limit is not None:
        cols["fits"] = fits(metrics["memory_max"], limit)
    cols["error"] = error
    return pa.table(cols)



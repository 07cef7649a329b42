"""The planner's GPU and cluster from one machine's measurements (``pipecore calibrate``).

:mod:`pipecore.analysis.calibration` reads the measurements and gives the
plain figures (best GEMM rate, memory bandwidth, bus bandwidths, latencies).
This module fits the GEMM shape model of :class:`~pipecore.plan.hardware.GPU`
to the measured shapes, writes the calibration file (a ``[gpus.NAME]``
entry with the fields of ``data/gpus.toml``, a ``[clusters.NAME]`` entry
with those of ``data/clusters.toml``, and the ``[measurements]``) and reads
such a file back.

What the measurements determine, and what is kept
-------------------------------------------------
* ``kernel_overhead``: measured; ``hbm_bytes``, ``sm_count``: queried from
  the device (a CPU rank: its share of the host's memory, its threads).
* ``peak_flops``, ``hbm_bandwidth``: the data sheet's with ``like`` (a GPU
  preset), kept with its sources; without it, the measured best GEMM rate
  and the measured copy rate (``hbm_efficiency`` is then 1).
* ``gemm_max_efficiency`` (``e_max``): as for the presets, set so that the
  model's best measured shape runs at the best measured rate (each time
  less ``kernel_overhead``: ``gemm_time`` leaves the launch out). Without
  ``like`` it may exceed 1: ``peak_flops`` is then a measured rate, and a
  shape larger than those measured may run faster.
* ``gemm_k_half`` and ``gemm_tile_exponent``: fitted on the same grid as
  the H100 preset's (k_half 0-512 step 16, exponent 0-1.5 step 0.125, the
  RMS error of log time, ``kernel_overhead`` added to each modelled time),
  each only when the shapes determine it: k_half when three or more k
  were measured at one (m, n, batch), the exponent when three or more
  (m, n) were measured at one (k, batch). Otherwise it is kept from the
  prior (``like``, or the H100 preset's fit) with its source;
  ``gemm_tiles`` is always kept (cuBLAS's tile set).
* Pool: ``intra_allreduce_bus_bandwidth`` from the all-reduce,
  ``intra_bus_bandwidth`` the lower of the reduce-scatter's and the
  all-gather's, ``intra_latency`` the all-reduce's smallest message,
  ``p2p_intra_bandwidth`` the point-to-point send's. One node was
  measured: the ``inter_*`` figures are not in the file, and a cluster of
  more than one node needs them added (with their sources).
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from ..analysis.calibration import Measurements, read_measurements
from ..core.ops import InputError
from .hardware import GPU, Cluster, Pool

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

__all__ = ["calibrated_cluster", "calibrated_gpu", "calibration_toml", "cluster_from_file", "gemm_error",
           "gpu_entry", "gpu_from_entry", "gpu_key", "measurements_toml", "pool_entry",
           "pool_from_entry"]

#: The H100 preset's fit, the prior of the shape terms the measurements do not determine.
PRIOR = "h100-sxm5-80gb"
K_HALF_GRID = np.arange(0.0, 513.0, 16.0)
EXPONENT_GRID = np.arange(0.0, 1.5 + 1e-9, 0.125)
_INTER = ("inter_bus_bandwidth", "inter_latency", "p2p_inter_bandwidth")


def _slug(text):
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "device"


def gpu_key(meas):
    """The GPU entry's name: the device's, with a CPU rank's threads.

    Parameters
    ----------
    meas : Measurements

    Returns
    -------
    str
        E.g. ``"nvidia-h100-80gb-hbm3"``, ``"amd-epyc-1-thread"``.
    """
    name = _slug(meas.meta.get("device_name", "device"))
    if meas.meta.get("device") == "cpu":
        n = meas.meta.get("compute_units", 1)
        name += f"-{n}-thread" + ("s" if n > 1 else "")
    return name


def _determined(rows, fixed, varied):
    """Whether some group of rows equal in ``fixed`` holds 3+ distinct ``varied`` values."""
    groups = {}
    for r in rows:
        groups.setdefault(tuple(r[f] for f in fixed), set()).add(tuple(r[f] for f in varied))
    return max(len(v) for v in groups.values()) >= 3


def _log_errors(gpu, rows, overhead):
    m, n, k, b = (np.array([r[d] for r in rows], dtype=float) for d in ("m", "n", "k", "batch"))
    seconds = np.array([r["seconds"] for r in rows])
    return np.log((gpu.gemm_time(m, n, k, b) + overhead) / seconds)


def gemm_error(gpu, measurements):
    """RMS error of log time of ``gpu``'s GEMM model over the measured shapes.

    Parameters
    ----------
    gpu : GPU
        Its ``gemm_time`` plus ``kernel_overhead`` is compared with each
        measured time.
    measurements : str, os.PathLike, dict or Measurements
        With ``gemm`` rows.

    Returns
    -------
    float
        ``sqrt(mean(log(modelled / measured) ** 2))``; 0.1 is about 10%.

    Raises
    ------
    InputError
        No GEMM rows, or a bad value.
    """
    rows = read_measurements(measurements).need("gemm", "gemm_error")
    return float(np.sqrt(np.mean(_log_errors(gpu, rows, gpu.kernel_overhead) ** 2)))


def _fit_shape(meas, peak, prior, sm_count):
    """Grid fit of k_half and the tile exponent (those the shapes determine), e_max anchored."""
    rows = meas.gemm
    m, n, k, b = (np.array([r[d] for r in rows], dtype=float) for d in ("m", "n", "k", "batch"))
    seconds = np.array([r["seconds"] for r in rows])
    flops = 2.0 * m * n * k * b
    overhead = meas.need("kernel_seconds", "the GEMM fit")
    net = seconds - overhead  # gemm_time leaves the launch out; the fit adds kernel_overhead back
    if not (net > 0).any():
        raise InputError(f"{meas.at}every GEMM took less than measurements.kernel_seconds "
                         f"({overhead:.3g} s): the shapes are too small to fit a GEMM model to")
    best_rate = float(np.max(flops[net > 0] / net[net > 0]))
    fit_k = _determined(rows, ("m", "n", "batch"), ("k",))
    fit_x = _determined(rows, ("k", "batch"), ("m", "n"))
    khs = K_HALF_GRID if fit_k else [prior.gemm_k_half]
    xs = EXPONENT_GRID if fit_x else [prior.gemm_tile_exponent]
    best = None
    for kh in khs:
        for x in xs:
            gpu = GPU("fit", peak, 1.0, 1.0, 1.0, overhead, sm_count=sm_count, gemm_tiles=prior.gemm_tiles,
                      gemm_k_half=float(kh), gemm_tile_exponent=float(x))
            shape = gpu._shape_factor(m, n, k, b)
            e_max = best_rate / (peak * float(shape.max()))
            err = float(np.sqrt(np.mean(np.log((flops / (peak * e_max * shape) + overhead) / seconds) ** 2)))
            if best is None or err < best[0] - 1e-12:
                best = (err, float(kh), float(x), e_max)
    return best, fit_k, fit_x, best_rate


def _prior(like):
    if like is None:
        return GPU.preset(PRIOR)
    if like not in GPU.presets():
        raise InputError(f"like={like!r} is not a GPU preset; the presets are: {', '.join(GPU.presets())}")
    return GPU.preset(like)


def gpu_entry(measurements, like=None):
    """The ``[gpus.NAME]`` entry (fields of ``data/gpus.toml``) the measurements give.

    Parameters
    ----------
    measurements : str, os.PathLike, dict or Measurements
        ``pipecore calibrate``'s file or its ``measurements`` table.
    like : str, optional
        A GPU preset whose data-sheet peaks (FLOP/s, memory bandwidth) and
        unmeasured GEMM-model terms are kept; default: the measurements'
        ``like``, else none (peaks are the measured rates).

    Returns
    -------
    dict
        Each value beside its ``<field>_source``.

    Raises
    ------
    InputError
        A missing section, a bad value, an unknown ``like``, or a measured
        rate above ``like``'s data-sheet peak.
    """
    meas = read_measurements(measurements)
    like = meas.meta.get("like") if like is None else like
    prior = _prior(like)
    src = meas.source()
    rate, row = meas.gemm_rate()
    bw, mem_row = meas.memory_bandwidth()
    dtype = meas.meta.get("dtype", "the measured dtype")
    shape_text = "x".join(str(row[d]) for d in ("m", "n", "k")) + (f" (batch {row['batch']})"
                                                                     if row["batch"] > 1 else "")
    entry = {}
    if like is None:
        entry["peak_flops"] = rate
        entry["peak_flops_source"] = (f"{src}: the best {dtype} GEMM rate measured, {shape_text} (no "
                                      f"data-sheet peak given: pipecore calibrate --like PRESET keeps one)")
    else:
        if rate > prior.peak_flops:
            raise InputError(f"{meas.at}the measured GEMM rate {rate / 1e12:.1f} TFLOP/s exceeds "
                             f"like={like!r}'s data-sheet peak {prior.peak_flops / 1e12:.0f} TFLOP/s: "
                             f"is it the right preset?")
        entry["peak_flops"] = prior.peak_flops
        entry["peak_flops_source"] = f"kept from {like}: {prior.sources['peak_flops']}"
    entry["hbm_bytes"] = float(meas.need("memory_bytes", "hbm_bytes"))
    entry["hbm_bytes_source"] = (f"{src}: the device's memory as torch reports it"
                                 + (", divided among the ranks" if meas.meta.get("device") == "cpu" else ""))
    moved = f"{mem_row['op']} moving {mem_row['bytes']:.3g} bytes (read + written)"
    if like is None:
        entry["hbm_bandwidth"], entry["hbm_efficiency"] = bw, 1.0
        entry["hbm_bandwidth_source"] = f"{src}: achievable rate of a {moved}"
        entry["hbm_efficiency_source"] = "1: hbm_bandwidth is the measured achievable rate itself"
    else:
        if bw > prior.hbm_bandwidth:
            raise InputError(f"{meas.at}the measured memory bandwidth {bw / 1e9:.0f} GB/s exceeds "
                             f"like={like!r}'s data-sheet {prior.hbm_bandwidth / 1e9:.0f} GB/s: is it the "
                             f"right preset?")
        entry["hbm_bandwidth"], entry["hbm_efficiency"] = prior.hbm_bandwidth, bw / prior.hbm_bandwidth
        entry["hbm_bandwidth_source"] = f"kept from {like}: {prior.sources['hbm_bandwidth']}"
        entry["hbm_efficiency_source"] = (f"{src}: achievable rate of a {moved}, {bw / 1e9:.4g} GB/s, over "
                                          f"the data sheet's")
    entry["kernel_overhead"] = meas.need("kernel_seconds", "kernel_overhead")
    entry["kernel_overhead_source"] = f"{src}: median seconds per kernel of a chain of dependent tiny kernels"
    sm_count = meas.need("compute_units", "sm_count")
    entry["sm_count"] = sm_count
    entry["sm_count_source"] = (f"{src}: " + ("threads of one CPU rank (the GEMM model's wave size)"
                                              if meas.meta.get("device") == "cpu" else
                                              "multiprocessors torch reports"))
    (err, kh, x, e_max), fit_k, fit_x, net_rate = _fit_shape(meas, entry["peak_flops"], prior, sm_count)
    entry["mamf_flops"] = rate
    entry["mamf_shape"] = [row["m"], row["n"], row["k"]]
    entry["mamf_source"] = f"{src}: the best {dtype} GEMM rate of the {len(meas.gemm)} shapes, {shape_text}"
    entry["gemm_max_efficiency"] = e_max
    entry["gemm_max_efficiency_source"] = (f"{src}: set so that the model's best measured shape runs at "
                                           f"the best measured rate with kernel_overhead taken out "
                                           f"({net_rate / 1e9:.4g} GFLOP/s)")
    entry["gemm_tiles"] = [list(t) for t in prior.gemm_tiles]
    entry["gemm_tiles_source"] = f"kept from {prior.name}: {prior.sources['gemm_tiles']}"
    entry["gemm_k_half"], entry["gemm_tile_exponent"] = kh, x
    fitted = [name for name, done in (("k_half", fit_k), ("tile exponent", fit_x)) if done]
    kept = [name for name, done in (("k_half", fit_k), ("tile exponent", fit_x)) if not done]
    text = []
    if fitted:
        text.append(f"{src}: {' and '.join(fitted)} fitted on a grid (k_half 0-512 step 16, exponent 0-1.5 "
                    f"step 0.125; RMS log-time error {err:.1%} over the {len(meas.gemm)} shapes, "
                    f"kernel_overhead added to each modelled time)")
    if kept:
        text.append(f"{' and '.join(kept)} kept from {prior.name} (not determined: it needs 3 or more "
                    f"{'k at one (m, n, batch)' if not fit_k else '(m, n) at one (k, batch)'}): "
                    f"{prior.sources['gemm_shape']}")
    entry["gemm_shape_source"] = "; ".join(text)
    return entry


def pool_entry(measurements, gpu_name=None, price_per_gpu_hour=None):
    """The ``[clusters.NAME]`` entry (fields of ``data/clusters.toml``) the measurements give.

    Parameters
    ----------
    measurements : str, os.PathLike, dict or Measurements
        ``pipecore calibrate``'s file or its ``measurements`` table.
    gpu_name : str, optional
        The GPU entry it names (default: the measurements' device).
    price_per_gpu_hour : float, optional
        USD per device-hour, given by the user (not measured); default none.

    Returns
    -------
    dict
        Each value beside its ``<field>_source``; no ``inter_*`` fields
        (one node was measured).

    Raises
    ------
    InputError
        A missing section, a kind with fewer than two message sizes, a bad
        value or price.
    """
    meas = read_measurements(measurements)
    src = meas.source()
    backend = meas.meta.get("backend", "torch.distributed")
    figures = {kind: meas.collective(kind) for kind in ("all-reduce", "reduce-scatter", "all-gather", "p2p")}

    def said(kind, what="busbw"):
        f = figures[kind]
        row = f["largest"] if what == "busbw" else f["smallest"]
        return f"{kind} of {row['bytes']:.4g} bytes on {f['ranks']} ranks ({backend})"

    rs, ag = figures["reduce-scatter"], figures["all-gather"]
    low = "reduce-scatter" if rs["busbw"] <= ag["busbw"] else "all-gather"
    entry = {"gpu": gpu_name or gpu_key(meas), "gpus_per_node": figures["all-reduce"]["ranks"],
             "gpus_per_node_source": f"{src}: the ranks the collectives ran on",
             "intra_bus_bandwidth": min(rs["busbw"], ag["busbw"]),
             "intra_bus_bandwidth_source": (f"{src}: busbw (nccl-tests' convention) of the {said(low)}, "
                                            f"the lower of reduce-scatter ({rs['busbw'] / 1e9:.4g} GB/s) "
                                            f"and all-gather ({ag['busbw'] / 1e9:.4g} GB/s)"),
             "intra_allreduce_bus_bandwidth": figures["all-reduce"]["busbw"],
             "intra_allreduce_bus_bandwidth_source": f"{src}: busbw of an {said('all-reduce')}",
             "intra_latency": figures["all-reduce"]["latency"],
             "intra_latency_source": f"{src}: median time of an {said('all-reduce', 'latency')}",
             "p2p_intra_bandwidth": figures["p2p"]["busbw"],
             "p2p_intra_bandwidth_source": f"{src}: one-way bandwidth of a {said('p2p')} (half a round trip)"}
    if price_per_gpu_hour is not None:
        price = price_per_gpu_hour
        if isinstance(price, bool) or not isinstance(price, (int, float)) or not math.isfinite(price) \
                or price < 0:
            raise InputError(f"price_per_gpu_hour must be USD per device-hour, finite and >= 0, "
                             f"got {price!r}")
        entry["price_per_gpu_hour"] = float(price)
        entry["price_per_gpu_hour_source"] = "given by the user (pipecore calibrate --price-per-gpu-hour)"
    return entry


# -- reading entries ---------------------------------------------------------------------------

def _number(entry, key, where, minimum=0.0, strict=True, integer=False, required=True):
    if key not in entry:
        if required:
            raise InputError(f"{where}: {key} is missing")
        return None
    value = entry[key]
    kinds = (int,) if integer else (int, float)
    if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) \
            or (value <= minimum if strict else value < minimum):
        what = "an integer" if integer else "a finite number"
        raise InputError(f"{where}.{key} must be {what} {'>' if strict else '>='} {minimum:g}, got {value!r}")
    return int(value) if integer else float(value)


def _sources(entry):
    return {key[:-len("_source")]: str(text) for key, text in entry.items() if key.endswith("_source")}


def gpu_from_entry(name, entry, where):
    """A :class:`~pipecore.plan.hardware.GPU` from a ``[gpus.NAME]`` entry, checked.

    Parameters
    ----------
    name : str
        The GPU's name.
    entry : dict
        The fields of ``data/gpus.toml`` with ``gemm_max_efficiency`` in
        place of the ``mamf_*`` sweep; ``<field>_source`` keys become
        ``sources``.
    where : str
        The entry in messages (``"file.toml: gpus.NAME"``).

    Returns
    -------
    GPU

    Raises
    ------
    InputError
        A missing field or one that breaks its rule, named with ``where``.
    """
    if not isinstance(entry, Mapping):
        raise InputError(f"{where} must be a table, got {entry!r}")
    values = {key: _number(entry, key, where) for key in ("peak_flops", "hbm_bytes", "hbm_bandwidth",
                                                          "hbm_efficiency", "kernel_overhead",
                                                          "gemm_max_efficiency")}
    tiles = entry.get("gemm_tiles")
    if not isinstance(tiles, list) or not tiles or not all(
            isinstance(t, list) and len(t) == 2 and all(isinstance(v, int) and not isinstance(v, bool)
                                                        and v > 0 for v in t) for t in tiles):
        raise InputError(f"{where}.gemm_tiles must be a non-empty list of [rows, columns] pairs of "
                         f"integers > 0, got {tiles!r}")
    return GPU(name=name, sources=_sources(entry), sm_count=_number(entry, "sm_count", where, integer=True),
               gemm_tiles=tuple((a, b) for a, b in tiles),
               gemm_k_half=_number(entry, "gemm_k_half", where, strict=False),
               gemm_tile_exponent=_number(entry, "gemm_tile_exponent", where, strict=False), **values)


def pool_from_entry(entry, gpu, nodes, where):
    """A :class:`~pipecore.plan.hardware.Pool` of ``nodes`` nodes from a ``[clusters.NAME]`` entry.

    Parameters
    ----------
    entry : dict
        The fields of ``data/clusters.toml``; the ``inter_*`` ones may be
        left out for one node (the intra-node figures stand in) and
        ``price_per_gpu_hour`` altogether (NaN).
    gpu : GPU
    nodes : int
    where : str
        The entry in messages (``"file.toml: clusters.NAME"``).

    Returns
    -------
    Pool

    Raises
    ------
    InputError
        A missing field or one that breaks its rule, or missing ``inter_*``
        fields with ``nodes`` above 1.
    """
    if not isinstance(entry, Mapping):
        raise InputError(f"{where} must be a table, got {entry!r}")
    sources = _sources(entry)
    values = {key: _number(entry, key, where, strict=key != "intra_latency")
              for key in ("intra_bus_bandwidth", "intra_latency", "p2p_intra_bandwidth")}
    allreduce = _number(entry, "intra_allreduce_bus_bandwidth", where, required=False)
    missing = [key for key in _INTER if key not in entry]
    if missing and nodes > 1:
        raise InputError(f"{where}: {missing[0]} is missing, and a cluster of {nodes} nodes needs it: the "
                         f"measurements cover one node (add {', '.join(missing)} with their sources, or plan "
                         f"on one node)")
    stand_in = {"inter_bus_bandwidth": "intra_bus_bandwidth", "inter_latency": "intra_latency",
                "p2p_inter_bandwidth": "p2p_intra_bandwidth"}
    for key in _INTER:
        if key in entry:
            values[key] = _number(entry, key, where, strict=key != "inter_latency")
        else:
            values[key] = values[stand_in[key]]
            sources[key] = (f"not measured (one node): the {stand_in[key]} figure stands in, unused while "
                            f"the cluster has one node")
    price = _number(entry, "price_per_gpu_hour", where, strict=False, required=False)
    if price is None:
        price = math.nan
        sources["price_per_gpu_hour"] = "not given (pipecore calibrate --price-per-gpu-hour): costs are NaN"
    return Pool(gpu=gpu, nodes=nodes, gpus_per_node=_number(entry, "gpus_per_node", where, integer=True),
                intra_allreduce_bus_bandwidth=allreduce, price_per_gpu_hour=price, sources=sources, **values)


def _nodes(nodes, op):
    if isinstance(nodes, bool) or not isinstance(nodes, (int, np.integer)) or nodes < 1:
        raise InputError(f"{op}: nodes must be an integer >= 1, got {nodes!r}")
    return int(nodes)


def cluster_from_file(path, nodes=1, name=None):
    """The cluster a calibration file (or any file of that form) describes; see
    :meth:`pipecore.Cluster.from_file`."""
    nodes = _nodes(nodes, "Cluster.from_file")
    where = str(path)
    if not isinstance(path, (str, os.PathLike)):
        raise InputError(f"Cluster.from_file: path must be a file path, got {type(path).__name__}")
    try:
        with open(Path(path), "rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as exc:
        raise InputError(f"{where}: not a TOML file ({exc})") from None
    clusters = data.get("clusters")
    if not isinstance(clusters, Mapping) or not clusters:
        raise InputError(f"{where}: no [clusters.NAME] table (pipecore calibrate --out FILE writes one)")
    if name is None:
        if len(clusters) > 1:
            raise InputError(f"{where} holds clusters {', '.join(clusters)}: give name=")
        name = next(iter(clusters))
    if name not in clusters:
        raise InputError(f"{where}: no cluster {name!r}; it holds {', '.join(clusters)}")
    entry = clusters[name]
    gpu_name = entry.get("gpu") if isinstance(entry, Mapping) else None
    gpus = data.get("gpus", {})
    if not isinstance(gpu_name, str):
        raise InputError(f"{where}: clusters.{name}.gpu must name a [gpus.NAME] table of the file or a GPU "
                         f"preset, got {gpu_name!r}")
    if isinstance(gpus, Mapping) and gpu_name in gpus:
        gpu = gpu_from_entry(gpu_name, gpus[gpu_name], f"{where}: gpus.{gpu_name}")
    elif gpu_name in GPU.presets():
        gpu = GPU.preset(gpu_name)
    else:
        raise InputError(f"{where}: clusters.{name}.gpu = {gpu_name!r} is neither a [gpus.NAME] table of the "
                         f"file nor a GPU preset ({', '.join(GPU.presets())})")
    pool = pool_from_entry(entry, gpu, nodes, f"{where}: clusters.{name}")
    return Cluster(pools=(pool,), name=name)


def calibrated_gpu(measurements, like=None):
    """See :meth:`pipecore.GPU.calibrate`."""
    meas = read_measurements(measurements)
    key = gpu_key(meas)
    return gpu_from_entry(key, gpu_entry(meas, like), f"{meas.at}gpus.{key}")


def calibrated_cluster(measurements, nodes=1, like=None, price_per_gpu_hour=None):
    """See :meth:`pipecore.Cluster.calibrate`."""
    nodes = _nodes(nodes, "Cluster.calibrate")
    meas = read_measurements(measurements)
    gpu = calibrated_gpu(meas, like)
    entry = pool_entry(meas, gpu.name, price_per_gpu_hour)
    return Cluster(pools=(pool_from_entry(entry, gpu, nodes, f"{meas.at}clusters.local"),), name="local")


# -- writing the file ----------------------------------------------------------------------------

def _toml(value):
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) \
            else repr(value)
    if isinstance(value, str):
        return json.dumps(value)  # a TOML basic string: JSON's escapes are TOML's
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"no TOML form for {value!r}")


def _table(header, entry):
    lines = [f"[{header}]"]
    for key, value in entry.items():
        if isinstance(value, (list, tuple)) and value and isinstance(value[0], Mapping):
            lines.append(f"{key} = [")
            lines += [f"  {_toml(row)}," for row in value]
            lines.append("]")
        else:
            lines.append(f"{key} = {_toml(value)}")
    return lines


def measurements_toml(table):
    """The ``[measurements]`` table alone, as TOML text (no fit: nothing is checked).

    Parameters
    ----------
    table : dict
        The ``measurements`` table.

    Returns
    -------
    str
    """
    return "\n".join(_table("measurements", table)) + "\n"


def calibration_toml(measurements, like=None, price_per_gpu_hour=None):
    """The text of a calibration file: the fitted entries and the measurements.

    Parameters
    ----------
    measurements : dict
        The ``measurements`` table (``pipecore.bindings.torch.measure_hardware()``).
    like : str, optional
        See :func:`gpu_entry`; recorded in the measurements.
    price_per_gpu_hour : float, optional
        See :func:`pool_entry`.

    Returns
    -------
    str
        TOML: ``[gpus.NAME]``, ``[clusters.local]``, ``[measurements]``.

    Raises
    ------
    InputError
        As :func:`gpu_entry` and :func:`pool_entry`.
    """
    if isinstance(measurements, Measurements) or not isinstance(measurements, Mapping):
        raise InputError("calibration_toml takes the measurements table as a dict")
    table = dict(measurements["measurements"] if "measurements" in measurements else measurements)
    if like is not None:
        table["like"] = like
    meas = read_measurements(table)
    gpu = gpu_entry(meas)
    key = gpu_key(meas)
    pool = pool_entry(meas, key, price_per_gpu_hour)
    lines = [f"# {meas.source()}.",
             "# [gpus.*] has the fields of pipecore/plan/data/gpus.toml and [clusters.*] those of",
             "# clusters.toml (units: FLOP/s, bytes, bytes/s, seconds), each value beside its source;",
             "# [measurements] holds the raw timings (bytes, seconds). Read with pc.Cluster.from_file(path),",
             "# pc.Hardware.calibrate(path), pc.GPU.calibrate(path) or pipecore plan --hardware FILE.",
             "# One node was measured: a cluster of more nodes needs inter_bus_bandwidth, inter_latency and",
             "# p2p_inter_bandwidth (with their sources) added to [clusters.local].", ""]
    lines += _table(f"gpus.{key}", gpu) + [""] + _table("clusters.local", pool) + [""]
    lines += _table("measurements", table)
    return "\n".join(lines) + "\n"


# -- the classmethods -----------------------------------------------------------------------------
# GPU.calibrate, Cluster.calibrate and Cluster.from_file are attached here: hardware.py cannot
# import this module, which builds on it (tests/test_layout.py: no import cycles).

def _gpu_calibrate(cls, measurements, like=None):
    """The GPU that ``pipecore calibrate``'s measurements describe.

    The measured constants (GEMM rate, memory bandwidth, kernel overhead)
    and the GEMM shape terms the measured shapes determine replace the
    model's; the rest are kept with their sources (the docstring of
    ``pipecore.plan.calibrate`` says which). Every value's source
    names the machine and the date.

    Parameters
    ----------
    measurements : str, os.PathLike or dict
        The file ``pipecore calibrate --out FILE`` wrote, or its
        ``measurements`` table as a dict.
    like : str, optional
        A GPU preset (:meth:`presets`) whose data-sheet peaks and
        unmeasured terms are kept (so MFU is against the data sheet);
        default: the one the file was measured with (``--like``), else
        none: the peaks are the measured rates.

    Returns
    -------
    GPU
        Named after the device; ``sources`` per field.

    Raises
    ------
    InputError
        A missing section or a value that breaks a rule (naming the file,
        key and rule), an unknown ``like``, or a rate above its data sheet.
    """
    return calibrated_gpu(measurements, like)


def _cluster_calibrate(cls, measurements, nodes=1, like=None, price_per_gpu_hour=None):
    """The cluster of one node that ``pipecore calibrate``'s measurements describe.

    Its GPU is :meth:`GPU.calibrate`'s; its bus bandwidths, latency and
    point-to-point bandwidth are the measured ones (nccl-tests' busbw
    convention), its ``gpus_per_node`` the ranks measured.

    Parameters
    ----------
    measurements : str, os.PathLike or dict
        The file ``pipecore calibrate --out FILE`` wrote, or its
        ``measurements`` table as a dict.
    nodes : int, default 1
        Nodes; only 1, as the links between nodes were not measured
        (write the file and add them to use more: :meth:`from_file`).
    like : str, optional
        As :meth:`GPU.calibrate`.
    price_per_gpu_hour : float, optional
        USD per device-hour; default none (costs are NaN).

    Returns
    -------
    Cluster
        One pool, named ``"local"``.

    Raises
    ------
    InputError
        As :meth:`GPU.calibrate`; a collective with fewer than two message
        sizes; ``nodes`` above 1.
    """
    return calibrated_cluster(measurements, nodes, like, price_per_gpu_hour)


def _cluster_from_file(cls, path, nodes=1, name=None):
    """A cluster described by a file of the form ``pipecore calibrate`` writes.

    ``[clusters.NAME]`` has the fields of ``pipecore/plan/data/clusters.toml``;
    its ``gpu`` names a ``[gpus.NAME]`` table of the same file (the fields
    of ``gpus.toml``, with ``gemm_max_efficiency`` in place of the
    ``mamf_sweep``) or a GPU preset. The values are read as written: edit
    the file to change one (and its ``_source``).

    Parameters
    ----------
    path : str or os.PathLike
        The file.
    nodes : int, default 1
        Nodes; more than 1 needs the entry's ``inter_bus_bandwidth``,
        ``inter_latency`` and ``p2p_inter_bandwidth``.
    name : str, optional
        The cluster entry, when the file holds more than one.

    Returns
    -------
    Cluster
        One pool, named after the entry. A missing ``price_per_gpu_hour``
        is NaN (costs are NaN).

    Raises
    ------
    InputError
        A file that is not TOML, a missing table or field, a value that
        breaks a rule (each naming the file, key and rule).
    OSError
        A file that cannot be read.
    """
    return cluster_from_file(path, nodes, name)


for _cls, _name, _fn in ((GPU, "calibrate", _gpu_calibrate), (Cluster, "calibrate", _cluster_calibrate),
                         (Cluster, "from_file", _cluster_from_file)):
    _fn.__name__, _fn.__qualname__ = _name, f"{_cls.__name__}.{_name}"
    _fn.__module__ = _cls.__module__
    setattr(_cls, _name, classmethod(_fn))
del _cls, _name, _fn

"""The hardware a run is planned on: GPUs, pools of nodes, clusters (issue 53).

Every constant is read from ``data/gpus.toml`` and ``data/clusters.toml``,
each with a ``source`` string naming the public measurement or data sheet it
comes from (``GPU.sources``, ``Pool.sources``). No constant is fitted to the
end-to-end training throughputs that ``pipecore.plan`` is validated against.

The model
---------
GEMM. An ``(m x k) @ (k x n)`` BF16 GEMM runs at ``peak_flops * eff`` with::

    eff(m, n, k) = e_max * max_T [ u_T(m, n) * w_T ] * k / (k + k_half)

where, for each cuBLAS tile ``T = (tm, tn)`` (NVIDIA's Matrix Multiplication
Background guide, section 2.3)::

    tiles_T = batch * ceil(m / tm) * ceil(n / tn)
    waves_T = ceil(tiles_T / sm_count)
    u_T     = batch * m * n / (waves_T * sm_count * tm * tn)   # tile and wave quantization
    w_T     = (ai_T / ai_max) ** gemm_tile_exponent       # smaller tiles reuse less data
    ai_T    = tm * tn / (tm + tn)

``k / (k + k_half)`` is the prologue/epilogue of each tile, amortised over
the reduction; ``k_half`` and the tile exponent come from a fit to OpenXLA's
measured H100 GEMM table. ``e_max`` is set so that the best shape of the
model over the benchmark's sweep (m and n on its grid, k of its best shape)
reaches exactly the measured "maximum achievable matmul FLOPS"
(stas00/ml-engineering): no swept shape is predicted above the measurement.
``gemm_time`` adds no launch cost: ``kernel_overhead`` is separate.

Memory-bound kernels move bytes at ``hbm_bandwidth * hbm_efficiency``.

Collectives follow nccl-tests' bus-bandwidth convention (doc/PERFORMANCE.md
of NVIDIA/nccl-tests): a ring all-reduce of ``S`` bytes on ``n`` ranks moves
``2 (n-1)/n * S`` per rank, reduce-scatter and all-gather ``(n-1)/n * S``.
The time is ``latency + volume / busbw``, an alpha-beta model: small
messages are latency-bound and reach a small fraction of the peak busbw,
large ones approach it. Inside one node ``busbw`` is the NVLink figure (the
NVLink SHARP one for an H100 all-reduce); a group spanning nodes runs at the
slowest level, ``min(intra, r * inter)`` with ``r`` ranks per node, each
GPU having its own NIC (8 HDR NICs on a DGX A100 give 8 x 24 = 192 GB/s),
and its latency grows with ``log2(nodes)`` as NCCL's tree does.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from pipecore.core.ops import InputError

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

__all__ = ["COLLECTIVES", "GPU", "Cluster", "Pool"]

_DATA = Path(__file__).resolve().parent / "data"
COLLECTIVES = ("all-reduce", "reduce-scatter", "all-gather")

_GPU_FIELDS = ("peak_flops", "hbm_bytes", "hbm_bandwidth", "hbm_efficiency", "kernel_overhead")
_POOL_FIELDS = ("intra_bus_bandwidth", "inter_bus_bandwidth", "intra_latency", "inter_latency",
                "p2p_intra_bandwidth", "p2p_inter_bandwidth", "price_per_gpu_hour")


@functools.cache
def _table(name):
    with open(_DATA / name, "rb") as f:
        return tomllib.load(f)


def _sources(entry):
    return {key[:-len("_source")]: text for key, text in entry.items() if key.endswith("_source")}


def _positive_array(value, what, op, minimum=0.0, strict=False):
    """``value`` as a float array, refused unless finite and above ``minimum``."""
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise InputError(f"{op}: {what} must be a number or an array of numbers, got {value!r}") from None
    bad = ~np.isfinite(arr) | ((arr <= minimum) if strict else (arr < minimum))
    if bad.any():
        first = arr[bad].flat[0]
        rule = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise InputError(f"{op}: {what} must be finite and {rule}, got {first!r}")
    return arr


def _out(arr):
    return float(arr) if np.ndim(arr) == 0 else arr


def _int_arg(value, what, op, minimum=1):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise InputError(f"{op}: {what} must be an integer, got {value!r}")
    if value < minimum:
        raise InputError(f"{op}: {what} must be >= {minimum}, got {value}")
    return int(value)


@dataclass(frozen=True)
class GPU:
    """One GPU type: its data-sheet peaks and measured efficiencies.

    Attributes
    ----------
    name : str
        Preset key, e.g. ``"a100-sxm4-80gb"``.
    peak_flops : float
        Dense BF16 tensor-core FLOP/s from the data sheet.
    hbm_bytes : float
        Bytes of device memory.
    hbm_bandwidth : float
        Peak device-memory bytes/s from the data sheet.
    hbm_efficiency : float
        Achievable / peak memory bandwidth for large streaming kernels.
    kernel_overhead : float
        Seconds per kernel: launch plus the gap between dependent kernels.
    sources : dict
        Field name -> the public source of its value.
    sm_count : int
        Streaming multiprocessors (the wave size of the GEMM model).
    gemm_tiles : tuple of (int, int)
        The cuBLAS output tiles the GEMM model chooses among.
    gemm_k_half : float
        Reduction length at which a tile reaches half its rate.
    gemm_tile_exponent : float
        How strongly a tile's data reuse (tm tn / (tm + tn)) sets its rate.
    gemm_max_efficiency : float
        ``e_max`` of the model (module docstring), fixed by the measured
        best-shape throughput.
    """

    name: str
    peak_flops: float
    hbm_bytes: float
    hbm_bandwidth: float
    hbm_efficiency: float
    kernel_overhead: float
    sources: dict = field(default_factory=dict, compare=False, repr=False)
    sm_count: int = 108
    gemm_tiles: tuple = ((128, 128),)
    gemm_k_half: float = 0.0
    gemm_tile_exponent: float = 0.0
    gemm_max_efficiency: float = 1.0

    def _shape_factor(self, m, n, k, batch=1.0):
        ai_max = max(tm * tn / (tm + tn) for tm, tn in self.gemm_tiles)
        best = np.zeros(np.broadcast(m, n, k, batch).shape)
        for tm, tn in self.gemm_tiles:
            tiles = batch * np.ceil(m / tm) * np.ceil(n / tn)
            waves = np.ceil(tiles / self.sm_count)
            util = batch * m * n / (waves * self.sm_count * tm * tn)
            weight = (tm * tn / (tm + tn) / ai_max) ** self.gemm_tile_exponent
            best = np.maximum(best, util * weight)
        return best * k / (k + self.gemm_k_half)

    def gemm_efficiency(self, m, n, k, batch=1):
        """Achieved / peak FLOP/s of an ``(m x k) @ (k x n)`` BF16 GEMM.

        Parameters
        ----------
        m, n, k : int, float or array
            GEMM dimensions (positive); arrays broadcast.
        batch : int, float or array, optional
            GEMMs of that shape in one strided-batched call: their tiles
            share the waves.

        Returns
        -------
        float or numpy.ndarray
            The fraction of ``peak_flops`` reached, in (0, 1).

        Raises
        ------
        InputError
            A dimension that is not a positive finite number.
        """
        dims = [_positive_array(v, name, "gemm_efficiency", strict=True)
                for v, name in ((m, "m"), (n, "n"), (k, "k"), (batch, "batch"))]
        return _out(self.gemm_max_efficiency * self._shape_factor(*dims))

    def gemm_time(self, m, n, k, batch=1):
        """Seconds of ``batch`` BF16 GEMMs ``(m x k) @ (k x n)``, launch cost excluded.

        Parameters
        ----------
        m, n, k : int, float or array
            GEMM dimensions (positive); arrays broadcast.
        batch : int, float or array, optional
            GEMMs of that shape in one strided-batched call (positive).

        Returns
        -------
        float or numpy.ndarray
            ``2 m n k batch / (peak_flops * gemm_efficiency(m, n, k))`` seconds.

        Raises
        ------
        InputError
            A dimension or batch that is not a positive finite number.
        """
        b = _positive_array(batch, "batch", "gemm_time", strict=True)
        dims = [_positive_array(v, name, "gemm_time", strict=True)
                for v, name in ((m, "m"), (n, "n"), (k, "k"))]
        eff = self.gemm_max_efficiency * self._shape_factor(*dims, b)
        return _out(2.0 * dims[0] * dims[1] * dims[2] * b / (self.peak_flops * eff))

    def memory_time(self, nbytes):
        """Seconds to stream ``nbytes`` through device memory.

        Parameters
        ----------
        nbytes : int, float or array
            Bytes read plus written (>= 0).

        Returns
        -------
        float or numpy.ndarray
            ``nbytes / (hbm_bandwidth * hbm_efficiency)`` seconds.

        Raises
        ------
        InputError
            A negative or non-finite byte count.
        """
        size = _positive_array(nbytes, "nbytes", "memory_time")
        return _out(size / (self.hbm_bandwidth * self.hbm_efficiency))

    @classmethod
    def preset(cls, name):
        """The GPU preset ``name`` from ``data/gpus.toml``.

        Parameters
        ----------
        name : str
            A key of :meth:`presets`.

        Returns
        -------
        GPU
            The preset with its sources.

        Raises
        ------
        InputError
            An unknown name (the message lists the known ones).
        """
        table = _table("gpus.toml")
        if not isinstance(name, str) or name not in table:
            raise InputError(f"unknown GPU preset {name!r}; the presets are: {', '.join(sorted(table))}")
        entry = table[name]
        gpu = cls(name=name, **{key: float(entry[key]) for key in _GPU_FIELDS},
                  sources=_sources(entry), sm_count=int(entry["sm_count"]),
                  gemm_tiles=tuple((int(a), int(b)) for a, b in entry["gemm_tiles"]),
                  gemm_k_half=float(entry["gemm_k_half"]),
                  gemm_tile_exponent=float(entry["gemm_tile_exponent"]))
        # e_max: the best shape of the model over the benchmark's sweep (m, n on the
        # sweep grid, k of the measured best shape) runs at the measured maximum.
        lo, hi, step = (int(v) for v in entry["mamf_sweep"])
        grid = np.arange(lo, hi + 1, step, dtype=float)
        best = gpu._shape_factor(grid[:, None], grid[None, :], float(entry["mamf_shape"][2])).max()
        e_max = float(entry["mamf_flops"]) / gpu.peak_flops / float(best)
        sources = dict(gpu.sources)
        sources["gemm_max_efficiency"] = sources.pop("mamf")
        return cls(**{**gpu.__dict__, "gemm_max_efficiency": e_max, "sources": sources})

    @staticmethod
    def presets():
        """Names of the GPU presets.

        Returns
        -------
        list of str
            Sorted preset keys.
        """
        return sorted(_table("gpus.toml"))


@dataclass(frozen=True)
class Pool:
    """GPUs of one type in nodes, with the links between them.

    Attributes
    ----------
    gpu : GPU
        The GPU type.
    nodes, gpus_per_node : int
        How many nodes, how many GPUs in each.
    intra_bus_bandwidth : float
        Achievable collective bus bandwidth inside a node, bytes/s.
    inter_bus_bandwidth : float
        Achievable bus bandwidth per GPU across nodes (its own NIC), bytes/s.
    intra_latency, inter_latency : float
        Small-message time of a collective or send, seconds.
    p2p_intra_bandwidth, p2p_inter_bandwidth : float
        One-direction achievable send bandwidth, bytes/s.
    price_per_gpu_hour : float
        USD per GPU-hour on demand.
    intra_allreduce_bus_bandwidth : float or None
        Bus bandwidth of an all-reduce inside a node when in-switch reduction
        (NVLink SHARP) beats the ring; None: ``intra_bus_bandwidth``.
    sources : dict
        Field name -> the public source of its value.
    """

    gpu: GPU
    nodes: int
    gpus_per_node: int
    intra_bus_bandwidth: float
    inter_bus_bandwidth: float
    intra_latency: float
    inter_latency: float
    p2p_intra_bandwidth: float
    p2p_inter_bandwidth: float
    price_per_gpu_hour: float
    intra_allreduce_bus_bandwidth: float | None = None
    sources: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def count(self):
        """GPUs in the pool (``nodes * gpus_per_node``)."""
        return self.nodes * self.gpus_per_node


@dataclass(frozen=True)
class Cluster:
    """One or more pools of GPUs that a run is planned on.

    Attributes
    ----------
    pools : tuple of Pool
        The pools, in the order given.
    name : str
        A label (the preset name or the parsed spec).
    """

    pools: tuple
    name: str = "cluster"

    @classmethod
    def preset(cls, name, nodes):
        """A cluster of ``nodes`` nodes of preset ``name`` (``data/clusters.toml``).

        Parameters
        ----------
        name : str
            A key of :meth:`presets` (or its alias, e.g. ``"a100"``).
        nodes : int
            Number of nodes (>= 1).

        Returns
        -------
        Cluster
            One pool.

        Raises
        ------
        InputError
            An unknown name (the message lists the known ones) or a node count below 1.
        """
        key = _cluster_key(name)
        nodes = _int_arg(nodes, "nodes", f"Cluster.preset({name!r})")
        entry = _table("clusters.toml")[key]
        values = {f: float(entry[f]) for f in _POOL_FIELDS}
        allreduce = entry.get("intra_allreduce_bus_bandwidth")
        pool = Pool(gpu=GPU.preset(entry["gpu"]), nodes=nodes, gpus_per_node=int(entry["gpus_per_node"]),
                    intra_allreduce_bus_bandwidth=None if allreduce is None else float(allreduce),
                    sources=_sources(entry), **values)
        return cls(pools=(pool,), name=key)

    @staticmethod
    def presets():
        """Names of the cluster presets.

        Returns
        -------
        list of str
            Sorted preset keys.
        """
        return sorted(_table("clusters.toml"))

    @classmethod
    def parse(cls, spec):
        """A cluster from a spec such as ``"a100:64,h100:32"`` (GPU counts per preset).

        Parameters
        ----------
        spec : str
            Comma-separated ``kind:gpus`` items; ``kind`` is a cluster preset
            or its alias, ``gpus`` a multiple of that preset's GPUs per node.

        Returns
        -------
        Cluster
            One pool per item, in order.

        Raises
        ------
        InputError
            An empty or malformed spec, an unknown kind, or a GPU count that
            does not fill whole nodes.
        """
        if not isinstance(spec, str) or not spec.strip():
            raise InputError(f"cluster spec must be a non-empty string like 'a100:64,h100:32', got {spec!r}")
        pools = []
        for item in spec.split(","):
            kind, sep, count = item.strip().partition(":")
            if not sep or not count.strip().isdigit():
                raise InputError(f"cluster spec item {item.strip()!r} is not 'kind:gpus' (e.g. 'a100:64')")
            key = _cluster_key(kind.strip())
            gpus = int(count)
            per_node = int(_table("clusters.toml")[key]["gpus_per_node"])
            if gpus < per_node or gpus % per_node:
                raise InputError(f"cluster spec item {item.strip()!r}: {gpus} GPUs do not fill whole nodes "
                                 f"of {per_node} ({key}); use a positive multiple of {per_node}")
            pools.append(cls.preset(key, gpus // per_node).pools[0])
        return cls(pools=tuple(pools), name=spec.replace(" ", ""))

    def _pool(self, pool, op):
        is_index = isinstance(pool, (int, np.integer)) and not isinstance(pool, bool)
        if not is_index or not 0 <= pool < len(self.pools):
            raise InputError(f"{op}: pool must be an index in [0, {len(self.pools)}), got {pool!r}")
        return self.pools[int(pool)]

    def collective_time(self, kind, nbytes, ranks, ranks_per_node, pool=0):
        """Seconds of one ring collective, as nccl-tests would time it.

        Parameters
        ----------
        kind : str
            ``"all-reduce"``, ``"reduce-scatter"`` or ``"all-gather"``.
        nbytes : int, float or array
            Buffer bytes per rank: the all-reduce input, the reduce-scatter
            input, the all-gather output (>= 0).
        ranks : int
            Ranks in the group (>= 1).
        ranks_per_node : int
            How many of them share a node: ``ranks`` (one node), 1 (one per
            node) or a divisor of ``ranks`` in between.
        pool : int, optional
            Index of the pool the group runs in.

        Returns
        -------
        float or numpy.ndarray
            Seconds; 0.0 for one rank.

        Raises
        ------
        InputError
            An unknown kind, a negative size, or a group that does not fit
            the pool (ranks per node above the node's GPUs, ``ranks`` not a
            multiple of ``ranks_per_node``, more nodes than the pool has).
        """
        op = f"collective_time({kind!r})"
        if kind not in COLLECTIVES:
            raise InputError(f"collective kind must be one of {', '.join(COLLECTIVES)}, got {kind!r}")
        p = self._pool(pool, op)
        size = _positive_array(nbytes, "nbytes", op)
        ranks = _int_arg(ranks, "ranks", op)
        per_node = _int_arg(ranks_per_node, "ranks_per_node", op)
        if per_node > p.gpus_per_node or per_node > ranks:
            raise InputError(f"{op}: ranks_per_node={per_node} exceeds min(ranks={ranks}, "
                             f"GPUs per node={p.gpus_per_node})")
        if ranks % per_node:
            raise InputError(f"{op}: ranks={ranks} is not a multiple of ranks_per_node={per_node}")
        nodes = ranks // per_node
        if nodes > p.nodes:
            raise InputError(f"{op}: the group spans {nodes} nodes but the pool has {p.nodes}")
        if ranks == 1:
            return _out(np.zeros_like(size))
        share = (ranks - 1) / ranks * (2.0 if kind == "all-reduce" else 1.0)
        if nodes == 1:
            bus = p.intra_bus_bandwidth
            if kind == "all-reduce" and p.intra_allreduce_bus_bandwidth is not None:
                bus = p.intra_allreduce_bus_bandwidth
            latency = p.intra_latency
        else:
            bus = per_node * p.inter_bus_bandwidth
            if per_node > 1:
                bus = min(bus, p.intra_bus_bandwidth)
            latency = p.inter_latency * max(1.0, math.log2(nodes))
        return _out(latency + share * size / bus)

    def p2p_time(self, nbytes, inter_node, pool=0):
        """Seconds of one send of ``nbytes`` in one direction.

        Parameters
        ----------
        nbytes : int, float or array
            Bytes sent (>= 0).
        inter_node : bool
            True when the peer is on another node (InfiniBand), False for NVLink.
        pool : int, optional
            Index of the pool.

        Returns
        -------
        float or numpy.ndarray
            ``latency + nbytes / bandwidth`` seconds; 0.0 for 0 bytes.

        Raises
        ------
        InputError
            A negative size, a non-bool ``inter_node`` or an unknown pool.
        """
        op = "p2p_time"
        if not isinstance(inter_node, (bool, np.bool_)):
            raise InputError(f"{op}: inter_node must be True or False, got {inter_node!r}")
        p = self._pool(pool, op)
        size = _positive_array(nbytes, "nbytes", op)
        if inter_node:
            latency, bw = p.inter_latency, p.p2p_inter_bandwidth
        else:
            latency, bw = p.intra_latency, p.p2p_intra_bandwidth
        return _out(np.where(size > 0, latency + size / bw, 0.0))


def _cluster_key(name):
    table = _table("clusters.toml")
    if isinstance(name, str):
        if name in table:
            return name
        for key, entry in table.items():
            if name in entry.get("aliases", ()):
                return key
    known = ", ".join(f"{k} ({'/'.join(e.get('aliases', []))})" for k, e in sorted(table.items()))
    raise InputError(f"unknown cluster preset {name!r}; the presets (aliases) are: {known}")

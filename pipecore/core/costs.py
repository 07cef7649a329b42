"""Costs of compute ops and the network that carries transfers."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .ops import InputError

__all__ = ["Costs", "Network"]


#: float64's smallest normal number. Below it numbers are subnormal and keep
#: fewer significant digits the smaller they are (5e-324 keeps one bit): a
#: positive makespan this small is not an accurate answer (its shares, sums and
#: ratios round to whole multiples of 5e-324), so it is refused, or flagged in
#: a sweep, as an overflowing one is.
SMALLEST_NORMAL = float(np.finfo(np.float64).tiny)


def _check_value(owner, name, value, allow_inf=False, positive=False):
    """Return a float or a 1-D float array; reject NaN, negatives, bad types."""
    if isinstance(value, (bool, np.bool_, str, bytes)):
        raise InputError(f"{owner} '{name}' must be a number (got {value!r})")
    try:
        ndim = np.ndim(value)
    except (TypeError, ValueError):  # a ragged nesting
        raise InputError(f"{owner} '{name}' must be a number or a 1-D sequence of numbers "
                         f"(got {value!r:.60})") from None
    if ndim == 0:
        if not isinstance(value, (int, float, np.integer, np.floating)) and not (
                isinstance(value, np.ndarray) and value.dtype.kind in "iuf"):
            raise InputError(f"{owner} '{name}' must be a real number (got {value!r:.60})")
        x = float(value)
        if math.isnan(x) or (math.isinf(x) and not allow_inf):
            raise InputError(f"{owner} '{name}' must be finite (got {x})")
        if x < 0 or (positive and x == 0):
            op = "> 0" if positive else ">= 0"
            raise InputError(f"{owner} '{name}' must be {op} (got {x})")
        return x
    raw = np.asarray(value) if not isinstance(value, np.ndarray) else value
    if raw.dtype.kind not in "iuf" and not (raw.dtype.kind == "O" and all(
            isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, bool)
            for x in raw.reshape(-1))):
        raise InputError(f"{owner} '{name}' must be a number or a 1-D sequence of real numbers "
                         f"(got {value!r:.60})")
    try:
        # A copy: freezing a float64 input in place would freeze the caller's array.
        arr = np.array(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise InputError(f"{owner} '{name}' must be a number or a 1-D sequence of numbers") from None
    if arr.ndim != 1 or arr.size == 0:
        raise InputError(f"{owner} '{name}' must be a number or a non-empty 1-D sequence "
                         f"(got shape {arr.shape})")
    bad = np.flatnonzero(np.isnan(arr) | (np.isinf(arr) & (not allow_inf)) | (arr < 0)
                         | ((arr == 0) & positive))
    if bad.size:
        i = int(bad[0])
        rule = "> 0" if positive else ">= 0"
        raise InputError(f"{owner} '{name}'[{i}] must be finite and {rule} (got {arr[i]})")
    arr.setflags(write=False)
    return arr


def per_stage(owner, name, value, stages, devices):
    """Resolve a cost to one value per stage.

    A scalar is a per-device-share value: each of the S stages gets
    ``value * devices / stages`` (``value / v`` with v chunks per device).
    A vector gives each stage's value directly and must have S entries.
    """
    if np.ndim(value) == 0:
        if stages % devices == 0:
            each = value / (stages // devices)
        else:
            each = value * devices / stages
        return np.full(stages, each, dtype=np.float64)
    if value.shape[0] != stages:
        raise InputError(f"{owner} '{name}' has {value.shape[0]} entries but the schedule "
                         f"has {stages} stages (one entry per stage)")
    # A writable copy (S floats): a read-only array is another Numba type,
    # and each kernel would compile twice.
    return np.array(value, dtype=np.float64)


def per_stage_direct(owner, name, value, stages):
    """A per-transfer quantity (latency, bytes): a scalar applies to every stage."""
    if np.ndim(value) == 0:
        return np.full(stages, value, dtype=np.float64)
    if value.shape[0] != stages:
        raise InputError(f"{owner} '{name}' has {value.shape[0]} entries but the schedule "
                         f"has {stages} stages (one entry per stage)")
    # A writable copy (S floats): a read-only array is another Numba type,
    # and each kernel would compile twice.
    return np.array(value, dtype=np.float64)


@dataclass(frozen=True)
class Costs:
    """Times and memory of one microbatch.

    Times are for one microbatch through one device share of the model
    (1/p of it); a schedule with v chunks per device runs each chunk in
    ``f / v`` and so on. Each field also takes a vector with one entry per
    stage, which is used as that stage's value directly (not divided by v).

    Parameters
    ----------
    f : float or array_like, default 1.0
        Forward time.
    b : float or array_like, default 2.0
        Backward time for inputs (B).
    w : float or array_like, default 0.0
        Backward time for weights (W). With 0, W ops take no time.
    comm : float or array_like, default 0.0
        Latency of every transfer between devices; a vector is indexed by
        the stage of the op that sends. Added to a :class:`Network`'s own
        latency when both are given.
    activation : float or array_like, default 1.0
        Activation memory M that F allocates (per device share; M/v per
        chunk).
    activation_w : float or array_like, default 0.0
        The part of the activation that W still needs after B (M_W);
        B frees ``activation - activation_w``, W frees the rest, BW frees
        all. Must not exceed ``activation``.
    weights : float or array_like, default 1.0
        Static (weight) memory per device share, counted once per distinct
        stage a device holds.
    fb_factor : float, default 1.0
        An overlapped F&B unit (DualPipe's F&B, PyTorch's OVERLAP_F_B) takes
        ``fb_factor * (time of its F + time of its B)``; below 1 models the
        overlap of one microbatch's compute with the other's communication.
    r : float or array_like, optional
        Time of an R op (recompute of a forward whose activations were
        dropped). Defaults to ``f``; set it lower for selective recompute
        of cheap layers, or higher when recompute cannot overlap.
    checkpoint : float or array_like, default 0.0
        Memory an F keeps when its (stage, microbatch) is recomputed: the
        checkpoint (typically the stage's input). Such an F allocates
        ``checkpoint`` instead of ``activation``; its R allocates
        ``activation - checkpoint``, so B, W and BW free as usual. Must not
        exceed ``activation``.
    offload : float or array_like, optional
        Time of one copy of an F's activation (one device share; a chunk's
        copy takes ``offload / v``) over a device's host link, to host (O)
        or back (L). Each device has its own link, one copy at a time per
        direction, in issue order. Required by schedules with O and L ops.
    bw : float or array_like, optional
        Time of a fused backward (BW op, PyTorch's full backward), per
        device share like ``b``. Defaults to ``b + w``; a fused backward
        is often cheaper than B then W (one pass over the graph).
    overhead : float or array_like, default 0.0
        A fixed time added to every compute op (F, B, W, BW, R): the
        runtime's per-op work (dispatch, bookkeeping) that does not shrink
        with the stage. Not divided by chunks: a vector is indexed by
        stage, a scalar applies to every op. AR, O and L ops stay free.
        An overlapped F&B pair takes ``fb_factor * (F + overhead + B +
        overhead)``.
    host_link_devices : int, default 1
        Devices that share one host link: devices ``[k*n, (k+1)*n)`` send
        their copies over one link per direction, one copy at a time, in
        order of issue time (PipeOffload's A100 servers put two GPUs on one
        PCIe switch and interleave their copies: 2).
    evict : float or array_like, default 0.0
        Time of one copy of an F's activation (one device share; a chunk's
        copy takes ``evict / v``) to the partner device that holds it while
        it waits for its backward, or back (O and L ops of a schedule whose
        ``offload_to`` names a device, as BPipe's). A copy occupies the
        directed link between the two devices, which it shares with the
        pipeline's own transfers between them when a :class:`Network` is
        given. 0 (the default) makes the copies free, like ``comm``.

    Raises
    ------
    ValueError
        If a value is negative, NaN, infinite, or not a number.
    """

    f: float = 1.0
    b: float = 2.0
    w: float = 0.0
    comm: float = 0.0
    activation: float = 1.0
    activation_w: float = 0.0
    weights: float = 1.0
    fb_factor: float = 1.0
    r: float | None = None
    checkpoint: float = 0.0
    offload: float | None = None
    host_link_devices: int = 1
    bw: float | None = None
    overhead: float = 0.0
    evict: float = 0.0

    def __post_init__(self):
        for name in ("f", "b", "w", "comm", "activation", "activation_w", "weights", "checkpoint",
                     "overhead", "evict"):
            object.__setattr__(self, name, _check_value("Costs", name, getattr(self, name)))
        n = self.host_link_devices
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise InputError(f"Costs 'host_link_devices' must be an int >= 1 (got {n!r})")
        for name in ("r", "offload", "bw"):
            if getattr(self, name) is not None:
                object.__setattr__(self, name, _check_value("Costs", name, getattr(self, name)))
        factor = _check_value("Costs", "fb_factor", self.fb_factor, positive=True)
        if np.ndim(factor):
            raise InputError("Costs 'fb_factor' must be a scalar")
        object.__setattr__(self, "fb_factor", factor)
        a, aw = self.activation, self.activation_w
        if np.ndim(a) == 0 and np.ndim(aw) == 0 and aw > a:
            raise InputError(f"Costs 'activation_w' must be <= 'activation' (got {aw} > {a})")
        c = self.checkpoint
        if np.ndim(a) == 0 and np.ndim(c) == 0 and c > a:
            raise InputError(f"Costs 'checkpoint' must be <= 'activation' (got {c} > {a})")

    def stage_arrays(self, stages: int, devices: int) -> dict:
        """Resolve every field to one value per stage.

        Parameters
        ----------
        stages : int
            Number of model stages S.
        devices : int
            Number of devices p.

        Returns
        -------
        dict of str to numpy.ndarray
            Keys ``f``, ``b``, ``w``, ``comm``, ``activation``,
            ``activation_w``, ``weights``, ``r`` (``f`` when unset),
            ``checkpoint``, ``offload`` (None when unset), ``bw`` (``b + w``
            when unset), ``overhead`` and ``evict``, each of length S.

        Raises
        ------
        ValueError
            If a vector has the wrong length, or activation_w or checkpoint
            exceeds activation at some stage.
        """
        out = {}
        for name in ("f", "b", "w", "activation", "activation_w", "weights", "checkpoint", "evict"):
            out[name] = per_stage("Costs", name, getattr(self, name), stages, devices)
        out["r"] = out["f"] if self.r is None else per_stage("Costs", "r", self.r, stages, devices)
        out["offload"] = (None if self.offload is None else
                          per_stage("Costs", "offload", self.offload, stages, devices))
        out["comm"] = per_stage_direct("Costs", "comm", self.comm, stages)
        out["bw"] = (out["b"] + out["w"] if self.bw is None
                     else per_stage("Costs", "bw", self.bw, stages, devices))
        out["overhead"] = per_stage_direct("Costs", "overhead", self.overhead, stages)
        for name in ("activation_w", "checkpoint"):
            bad = np.flatnonzero(out[name] > out["activation"])
            if bad.size:
                s = int(bad[0])
                raise InputError(f"Costs '{name}' must be <= 'activation' at every stage "
                                 f"(stage {s}: {out[name][s]} > {out['activation'][s]})")
        return out


def check_two_level(obj, owner, latency):
    """Check (and store, as floats) the links between nodes of a frozen
    dataclass with ``devices_per_node``, ``inter_bandwidth`` and
    ``inter_latency`` fields: :class:`Network` and :class:`pipecore.Hardware`.

    Parameters
    ----------
    obj : dataclass instance
        Its three fields are read and the two numbers written back.
    owner : str
        Its class name, for messages.
    latency : float
        The latency between nodes when ``inter_latency`` is None (the one
        inside a node).

    Raises
    ------
    ValueError
        Naming the field and the rule: inter-node fields without
        ``devices_per_node``, a node size that is not an int >= 1, a missing
        ``inter_bandwidth``, or a value that is not a number >= 0 (> 0 for
        the bandwidth).
    """
    if obj.devices_per_node is None:
        if obj.inter_bandwidth is not None or obj.inter_latency is not None:
            raise InputError(f"{owner} 'inter_bandwidth'/'inter_latency' need 'devices_per_node'")
        return
    n = obj.devices_per_node
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise InputError(f"{owner} 'devices_per_node' must be an int >= 1 (got {n!r})")
    if obj.inter_bandwidth is None:
        raise InputError(f"{owner} 'inter_bandwidth' is required with 'devices_per_node'")
    object.__setattr__(obj, "inter_bandwidth", _check_value(
        owner, "inter_bandwidth", obj.inter_bandwidth, allow_inf=True, positive=True))
    lat = latency if obj.inter_latency is None else obj.inter_latency
    object.__setattr__(obj, "inter_latency", _check_value(owner, "inter_latency", lat))
    if np.ndim(obj.inter_bandwidth) or np.ndim(obj.inter_latency):
        raise InputError(f"{owner} 'inter_bandwidth' and 'inter_latency' must be scalars")


@dataclass(frozen=True)
class Network:
    """Links between devices: per-transfer bytes, bandwidth and latency.

    A transfer's serialisation time ``bytes / bandwidth`` occupies its
    directed link (one transfer at a time, in the order they become ready);
    its latency does not. Uniform by default; give ``devices_per_node`` for
    a two-level network whose inter-node links use ``inter_bandwidth`` and
    ``inter_latency``.

    Parameters
    ----------
    bytes : float or array_like
        Size of each transfer; a vector is indexed by the sending op's
        stage.
    bandwidth : float, default inf
        Bytes per time unit of a link (intra-node ones when two-level).
    latency : float, default 0.0
        Latency of a link (intra-node ones when two-level).
    devices_per_node : int, optional
        Devices ``[k*n, (k+1)*n)`` form node k. None means one level.
    inter_bandwidth : float, optional
        Bandwidth between nodes (required with ``devices_per_node``).
    inter_latency : float, optional
        Latency between nodes (defaults to ``latency``).
    grad_bytes : float or array_like, default 0.0
        Size of a stage's gradient, which each replica of a replicated
        stage sends to the other in its all-reduce (AR op); a vector is
        indexed by stage.

    Raises
    ------
    ValueError
        If a value is negative, NaN, zero bandwidth, or a two-level field
        is given without ``devices_per_node``.
    """

    bytes: float
    bandwidth: float = math.inf
    latency: float = 0.0
    devices_per_node: int | None = None
    inter_bandwidth: float | None = None
    inter_latency: float | None = None
    grad_bytes: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "bytes", _check_value("Network", "bytes", self.bytes))
        object.__setattr__(self, "grad_bytes", _check_value("Network", "grad_bytes", self.grad_bytes))
        object.__setattr__(self, "bandwidth", _check_value("Network", "bandwidth", self.bandwidth,
                                                           allow_inf=True, positive=True))
        object.__setattr__(self, "latency", _check_value("Network", "latency", self.latency))
        if np.ndim(self.bandwidth) or np.ndim(self.latency):
            raise InputError("Network 'bandwidth' and 'latency' must be scalars")
        check_two_level(self, "Network", self.latency)

    @classmethod
    def uniform(cls, bytes, bandwidth, latency=0.0) -> Network:
        """Every link has the same bandwidth and latency.

        Parameters
        ----------
        bytes : float or array_like
            Size of each transfer.
        bandwidth : float
            Bytes per time unit.
        latency : float, default 0.0
            Per-transfer latency.

        Returns
        -------
        Network
            One level: every pair of devices linked alike.

        Raises
        ------
        ValueError
            As :class:`Network`.
        """
        return cls(bytes=bytes, bandwidth=bandwidth, latency=latency)

    @classmethod
    def two_level(cls, bytes, devices_per_node, intra_bandwidth, inter_bandwidth,
                  intra_latency=0.0, inter_latency=0.0) -> Network:
        """Fast links inside a node, slower ones between nodes.

        Parameters
        ----------
        bytes : float or array_like
            Size of each transfer.
        devices_per_node : int
            Devices per node; device d is on node ``d // devices_per_node``.
        intra_bandwidth, inter_bandwidth : float
            Bytes per time unit inside and between nodes.
        intra_latency, inter_latency : float, default 0.0
            Latencies inside and between nodes.

        Returns
        -------
        Network
            Two levels: nodes of ``devices_per_node`` devices.

        Raises
        ------
        ValueError
            As :class:`Network`.
        """
        return cls(bytes=bytes, bandwidth=intra_bandwidth, latency=intra_latency,
                   devices_per_node=devices_per_node, inter_bandwidth=inter_bandwidth,
                   inter_latency=inter_latency)

    def link_params(self, src: np.ndarray, dst: np.ndarray):
        """Bandwidth and latency of the directed links ``src -> dst``.

        Parameters
        ----------
        src, dst : numpy.ndarray of int
            Device indices.

        Returns
        -------
        tuple of numpy.ndarray
            ``(bandwidth, latency)``, one entry per pair.
        """
        src = np.asarray(src)
        dst = np.asarray(dst)
        bw = np.full(src.shape, self.bandwidth, dtype=np.float64)
        lat = np.full(src.shape, self.latency, dtype=np.float64)
        if self.devices_per_node is not None:
            inter = (src // self.devices_per_node) != (dst // self.devices_per_node)
            bw[inter] = self.inter_bandwidth
            lat[inter] = self.inter_latency
        return bw, lat


#: Relative slack when comparing memory with a limit: per-chunk shares such as
#: 1/6 summed six times land a few ulps above the whole, which must still fit.
FIT_RTOL = 1e-9


def fits(memory, limit):
    """Whether memory (scalar or array) fits a limit, up to rounding.

    Parameters
    ----------
    memory, limit : float or numpy.ndarray

    Returns
    -------
    bool or numpy.ndarray of bool
        ``memory <= limit * (1 + FIT_RTOL)``.
    """
    return np.asarray(memory) <= np.asarray(limit) * (1.0 + FIT_RTOL)

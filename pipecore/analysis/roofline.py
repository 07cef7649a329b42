"""The roofline device: :class:`Hardware` and its presets.

One device's FLOP/s and memory bandwidth (the two roofs), its memory, and
the links between pipeline devices. :mod:`pipecore.analysis.model` times
its layers with it; :meth:`Hardware.calibrate` builds one from
``pipecore calibrate``'s measurements (:mod:`pipecore.analysis.calibration`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from ..core.costs import Network, check_two_level
from ..core.ops import InputError

__all__ = ["Hardware", "HARDWARE_PRESETS"]


def _number(owner, name, value, positive=False, allow_inf=False):
    if isinstance(value, bool):
        raise InputError(f"{owner} '{name}' must be a number (got {value!r})")
    try:
        x = float(value)
    except (TypeError, ValueError):
        raise InputError(f"{owner} '{name}' must be a number (got {value!r})") from None
    if math.isnan(x) or (math.isinf(x) and not allow_inf) or x < 0 or (positive and x == 0):
        rule = "> 0" if positive else ">= 0"
        raise InputError(f"{owner} '{name}' must be finite and {rule} (got {value!r})")
    return x


@dataclass(frozen=True)
class Hardware:
    """One device, its memory, and the links between pipeline devices.

    The one roofline in pipecore: ``pipecore.analysis.study``'s transformer costs
    and :class:`Model`'s layers both time their ops with :meth:`roofline`.

    Parameters
    ----------
    flops : float
        Peak FLOP/s of a device (dense, in the training precision).
    memory_bandwidth : float
        Device memory (HBM) bandwidth in bytes/s: the roofline's other roof.
    link_bandwidth : float
        Bytes/s of one direction of a link between pipeline neighbours
        (inside a node when ``devices_per_node`` is set).
    link_latency : float
        Seconds per transfer on such a link.
    name : str, default "custom"
        Label.
    hbm_bytes : float, default inf
        Memory of a device in bytes; :func:`pipecore.partition` uses it as
        the default per-device memory limit.
    devices_per_node : int, optional
        Devices ``[k*n, (k+1)*n)`` form node k; links between nodes use
        ``inter_bandwidth`` and ``inter_latency``. None: one level.
    inter_bandwidth : float, optional
        Bytes/s per direction between nodes (required with
        ``devices_per_node``).
    inter_latency : float, optional
        Seconds per transfer between nodes (defaults to ``link_latency``).

    Raises
    ------
    ValueError
        If a value is not a positive number (latencies may be 0), or an
        inter-node field is given without ``devices_per_node``.
    """

    flops: float
    memory_bandwidth: float
    link_bandwidth: float
    link_latency: float
    name: str = "custom"
    hbm_bytes: float = math.inf
    devices_per_node: int | None = None
    inter_bandwidth: float | None = None
    inter_latency: float | None = None

    def __post_init__(self):
        for name in ("flops", "memory_bandwidth", "link_bandwidth", "hbm_bytes"):
            object.__setattr__(self, name, _number("Hardware", name, getattr(self, name),
                                                   positive=True, allow_inf=True))
        if math.isinf(self.flops) and math.isinf(self.memory_bandwidth):
            raise InputError("Hardware 'flops' and 'memory_bandwidth' cannot both be inf")
        object.__setattr__(self, "link_latency", _number("Hardware", "link_latency", self.link_latency))
        check_two_level(self, "Hardware", self.link_latency)

    @classmethod
    def preset(cls, name: str) -> Hardware:
        """A named hardware description (one of :meth:`presets`).

        Parameters
        ----------
        name : str
            One of ``"h100-nvlink"``, ``"a100-nvlink"``, ``"h100-pcie"``,
            ``"dgx-h100"`` (the study's baseline), case-insensitive.

        Returns
        -------
        Hardware
            The preset (a frozen value, shared).

        Raises
        ------
        ValueError
            If the name is unknown (the message lists the valid ones).
        """
        key = str(name).strip().lower()
        if key not in HARDWARE_PRESETS:
            raise InputError(f"unknown hardware preset {name!r}; valid: {', '.join(HARDWARE_PRESETS)}")
        return HARDWARE_PRESETS[key]

    @classmethod
    def calibrate(cls, measurements) -> Hardware:
        """This machine as measured by ``pipecore calibrate``.

        ``flops`` is the best GEMM rate measured (achievable, not a data-sheet
        peak), ``memory_bandwidth`` the rate of the largest copy (bytes read
        plus written per second), ``link_bandwidth`` and ``link_latency`` a
        point-to-point send's (largest message's bandwidth, smallest
        message's one-way time), ``hbm_bytes`` the memory of one device.

        Parameters
        ----------
        measurements : str, os.PathLike or dict
            The file ``pipecore calibrate --out FILE`` wrote, or its
            ``measurements`` table as a dict (e.g.
            ``pipecore.bindings.torch.measure_hardware()``).

        Returns
        -------
        Hardware
            One level of links (``devices_per_node`` None): the
            measurements cover one node.

        Raises
        ------
        InputError
            A missing section or a value that breaks a rule, naming the
            file, the key and the rule.
        """
        from .calibration import read_measurements

        return cls(**read_measurements(measurements).hardware_fields())

    @staticmethod
    def presets() -> list[str]:
        """Names :meth:`preset` accepts.

        Returns
        -------
        list of str
        """
        return list(HARDWARE_PRESETS)

    def scaled(self, compute: float = 1.0, network: float = 1.0) -> Hardware:
        """The same hardware with compute (FLOP/s and HBM bandwidth) and network scaled.

        Parameters
        ----------
        compute, network : float
            Factors (> 0). Latencies are divided by ``network``.

        Returns
        -------
        Hardware
            A new value; this one is unchanged.

        Raises
        ------
        ValueError
            If a factor is not positive.
        """
        compute = _number("Hardware.scaled", "compute", compute, positive=True)
        network = _number("Hardware.scaled", "network", network, positive=True)
        inter = {}
        if self.devices_per_node is not None:
            inter = {"inter_bandwidth": self.inter_bandwidth * network,
                     "inter_latency": self.inter_latency / network}
        return replace(self, flops=self.flops * compute,
                       memory_bandwidth=self.memory_bandwidth * compute,
                       link_bandwidth=self.link_bandwidth * network,
                       link_latency=self.link_latency / network,
                       name=f"{self.name} compute x{compute:g} network x{network:g}", **inter)

    def roofline(self, flops: float, bytes_moved: float) -> float:
        """Seconds of one kernel: ``max(flops / self.flops, bytes / memory_bandwidth)``.

        Parameters
        ----------
        flops, bytes_moved : float
            The kernel's FLOPs and the bytes it moves through HBM.

        Returns
        -------
        float
            Seconds.

        Raises
        ------
        ValueError
            If the time overflows float64 (a ``flops`` or
            ``memory_bandwidth`` far too small for its unit), naming the
            field and its value.
        """
        compute, memory = flops / self.flops, bytes_moved / self.memory_bandwidth
        if math.isinf(compute) or math.isinf(memory):
            name, rate, work, unit, per_s = (
                ("flops", self.flops, flops, "FLOPs", "FLOP/s, e.g. 9.89e+14 for an H100")
                if math.isinf(compute) else
                ("memory_bandwidth", self.memory_bandwidth, bytes_moved, "bytes",
                 "bytes/s, e.g. 3.35e+12 for an H100"))
            raise InputError(f"Hardware {name}={rate:g} gives {work:g} {unit} a time of "
                             f"{work:g} / {rate:g} s, which overflows float64 (inf s): '{name}' is "
                             f"in {per_s}")
        return max(compute, memory)

    def network(self, nbytes) -> Network:
        """A :class:`~pipecore.Network` with these links carrying ``nbytes`` per transfer.

        Parameters
        ----------
        nbytes : float or array_like
            Bytes per transfer; a vector is indexed by the sending stage.

        Returns
        -------
        Network
            This hardware's links, two-level when it has nodes.

        Raises
        ------
        ValueError
            As :class:`~pipecore.Network`.
        """
        if self.devices_per_node is None:
            return Network.uniform(nbytes, self.link_bandwidth, self.link_latency)
        return Network.two_level(nbytes, self.devices_per_node, self.link_bandwidth,
                                 self.inter_bandwidth, self.link_latency, self.inter_latency)


# Data-sheet figures. Dense BF16 tensor-core FLOP/s (the data sheets print
# twice these "with sparsity"); HBM bandwidth and size; NVLink bandwidth per
# direction is half the "total" (bidirectional) figure. 80 GB is taken as
# 80e9 bytes. Latencies are not in the data sheets: 2 us inside a node and
# 5 us across InfiniBand are round figures of ours, to edit.
HARDWARE_PRESETS = {
    # NVIDIA H100 Tensor Core GPU data sheet, SXM5: 989 TFLOP/s BF16 dense,
    # 3.35 TB/s HBM3, 80 GB, NVLink 900 GB/s total; DGX H100: one 400 Gb/s
    # (50 GB/s) ConnectX-7 InfiniBand port per GPU, 8 GPUs per node.
    "h100-nvlink": Hardware(989e12, 3.35e12, 450e9, 2e-6, "h100-nvlink", hbm_bytes=80e9,
                            devices_per_node=8, inter_bandwidth=50e9, inter_latency=5e-6),
    # NVIDIA A100 data sheet, SXM4 80GB: 312 TFLOP/s BF16 dense, 2,039 GB/s
    # HBM2e, NVLink 600 GB/s total; DGX A100: one 200 Gb/s (25 GB/s) HDR
    # InfiniBand port per GPU, 8 GPUs per node.
    "a100-nvlink": Hardware(312e12, 2.039e12, 300e9, 2e-6, "a100-nvlink", hbm_bytes=80e9,
                            devices_per_node=8, inter_bandwidth=25e9, inter_latency=5e-6),
    # NVIDIA H100 data sheet, PCIe: 756 TFLOP/s BF16 dense, 2.0 TB/s HBM2e,
    # 80 GB; PCIe Gen5 x16 128 GB/s total (64 GB/s per direction), no bridge.
    "h100-pcie": Hardware(756e12, 2.0e12, 64e9, 5e-6, "h100-pcie", hbm_bytes=80e9),
    # pipecore.study's baseline: H100 SXM compute with 50 GB/s, 0.5 us links.
    "dgx-h100": Hardware(989e12, 3.35e12, 50e9, 0.5e-6, "dgx-h100", hbm_bytes=80e9),
}

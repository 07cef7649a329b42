"""A parallel layout of one training run: how its GPUs split the work.

Names follow Megatron-LM's options where it has them (tensor, pipeline and
data parallel sizes, micro-batch size, virtual pipeline stages as
``chunks``, recompute granularity, sequence parallelism, the distributed
optimizer as ZeRO stage 1), so a user can read a plan into a launch script.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..core.ops import InputError

RECOMPUTE = ("none", "selective", "full")
ATTENTION = ("flash", "unfused")
PRECISION = ("bf16", "fp16")


def _int(name, value, minimum=1):
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise InputError(f"Strategy '{name}' must be an int (got {value!r})")
    value = int(value)
    if value < minimum:
        raise InputError(f"Strategy '{name}' must be >= {minimum} (got {value})")
    return value


def _choice(name, value, choices):
    if value not in choices:
        raise InputError(f"Strategy '{name}' must be one of {', '.join(map(repr, choices))} "
                         f"(got {value!r})")
    return value


@dataclass(frozen=True)
class Strategy:
    """How a training run splits over its GPUs.

    Parameters
    ----------
    tp, pp, dp : int
        Tensor-, pipeline- and data-parallel degrees; the run uses
        ``tp * pp * dp`` GPUs. Ranks are ordered as Megatron orders them:
        tensor-parallel fastest (inside a node), then data, then pipeline.
    microbatch_size : int, default 1
        Sequences per microbatch (Megatron's ``--micro-batch-size``).
    schedule : str, default "1f1b"
        Any pipecore family (``pipecore families``) or compose preset.
    chunks : int, default 1
        Model chunks per pipeline device (Megatron's virtual pipeline
        stages); more than 1 needs an interleaved or V-shaped schedule.
    recompute : {"none", "selective", "full"}, default "none"
        Activation recomputation: none; the attention core only
        (Korthikanti et al.); or every layer, keeping its input.
    sequence_parallel : bool, default False
        Split layer norms and dropouts along the sequence over the
        tensor-parallel group (needs ``tp > 1`` to change anything).
    zero : int, default 0
        0: no sharding; 1: optimizer state sharded over data-parallel ranks
        (Megatron's distributed optimizer); 2: gradients too; 3: parameters
        too (gathered before each use).
    dp_overlap : bool, default False
        Overlap the gradient reduction with the backward pass
        (Megatron's ``--overlap-grad-reduce``).
    attention : {"flash", "unfused"}, default "flash"
        FlashAttention-style fused attention, or the unfused softmax
        kernels of Megatron-LM before it (2021).
    precision : {"bf16", "fp16"}, default "bf16"
        Training precision; with bf16 gradients are reduced in fp32 (as
        Megatron does), with fp16 in fp16.
    p2p_overlap : bool, default True
        Pipeline sends and receives run beside compute. False: each
        exchange between neighbouring stages blocks both GPUs until it
        (and the tensor-parallel all-gather that rebuilds a scattered
        activation) is done, as Megatron-LM's pipeline communication does
        without ``--overlap-p2p-communication`` (in 2021 it also
        synchronised the device after each exchange).
    grad_accumulation_fusion : bool, default True
        Weight-gradient GEMMs add into the accumulated gradient
        (Megatron's ``--gradient-accumulation-fusion``). False: from the
        second microbatch on, each gradient is added to the accumulated one
        by a separate pass over memory (PyTorch's ``grad += new``), as in
        Megatron-LM before 2022.
    layers : tuple of int, optional
        Transformer layers of each pipeline stage, in model order
        (``pp * chunks`` entries, each at least 1, summing to the model's
        layers). None: the same number on every stage.
    pools : tuple of int, optional
        The cluster pool (GPU type) of each pipeline rank, in pipeline
        order (``pp`` entries): every stage of rank ``i`` runs its ``tp *
        dp`` GPUs from pool ``pools[i]``. None: every rank on the pool
        :func:`pipecore.estimate` is given.

    Raises
    ------
    ValueError
        (:class:`~pipecore.InputError`) naming the field and the rule it
        breaks.
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    microbatch_size: int = 1
    schedule: str = "1f1b"
    chunks: int = 1
    recompute: str = "none"
    sequence_parallel: bool = False
    zero: int = 0
    dp_overlap: bool = False
    attention: str = "flash"
    precision: str = "bf16"
    p2p_overlap: bool = True
    grad_accumulation_fusion: bool = True
    layers: tuple | None = None
    pools: tuple | None = None

    def __post_init__(self):
        for name in ("tp", "pp", "dp", "microbatch_size", "chunks"):
            object.__setattr__(self, name, _int(name, getattr(self, name)))
        zero = _int("zero", self.zero, minimum=0)
        if zero > 3:
            raise InputError(f"Strategy 'zero' must be 0, 1, 2 or 3 (got {zero})")
        object.__setattr__(self, "zero", zero)
        if not isinstance(self.schedule, str) or not self.schedule:
            raise InputError(f"Strategy 'schedule' must be a schedule name (got {self.schedule!r})")
        _choice("recompute", self.recompute, RECOMPUTE)
        _choice("attention", self.attention, ATTENTION)
        _choice("precision", self.precision, PRECISION)
        for name in ("sequence_parallel", "dp_overlap", "p2p_overlap", "grad_accumulation_fusion"):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"Strategy '{name}' must be True or False "
                                 f"(got {getattr(self, name)!r})")
        for name, size, minimum in (("layers", self.pp * self.chunks, 1), ("pools", self.pp, 0)):
            value = getattr(self, name)
            if value is None:
                continue
            if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != size:
                raise InputError(f"Strategy '{name}' must be a sequence of {size} ints "
                                 f"({'pp * chunks' if name == 'layers' else 'pp'}; got {value!r})")
            checked = tuple(_int(f"{name}[{i}]", v, minimum) for i, v in enumerate(value))
            object.__setattr__(self, name, checked)

    @property
    def gpus(self) -> int:
        """int: GPUs the strategy uses (``tp * pp * dp``)."""
        return self.tp * self.pp * self.dp

    def microbatches(self, global_batch: int) -> int:
        """Microbatches each pipeline runs per iteration.

        Parameters
        ----------
        global_batch : int
            Sequences per iteration over all data-parallel replicas.

        Returns
        -------
        int
            ``global_batch / (microbatch_size * dp)``.

        Raises
        ------
        ValueError
            If the global batch does not split into whole microbatches.
        """
        gb = _int("global_batch", global_batch)
        per = self.microbatch_size * self.dp
        if gb % per:
            raise InputError(f"global batch {gb} does not split into microbatches of "
                             f"{self.microbatch_size} on {self.dp} data-parallel replicas "
                             f"(it must be a multiple of microbatch_size * dp = {per})")
        return gb // per

    def label(self) -> str:
        """str: a short description, e.g. ``tp8 pp8 dp16 mb1 interleaved-1f1b x3 full``."""
        parts = [f"tp{self.tp}", f"pp{self.pp}", f"dp{self.dp}", f"mb{self.microbatch_size}",
                 self.schedule + (f" x{self.chunks}" if self.chunks > 1 else "")]
        if self.recompute != "none":
            parts.append(f"rc={self.recompute}")
        if self.sequence_parallel:
            parts.append("sp")
        if self.zero:
            parts.append(f"zero{self.zero}")
        if not self.p2p_overlap:
            parts.append("p2p=blocking")
        if not self.grad_accumulation_fusion:
            parts.append("grad-acc=unfused")
        if self.pools is not None and len(set(self.pools)) > 1:
            parts.append("pools " + ",".join(f"{k}x{n}" for k, n in _runs(self.pools)))
        elif self.pools is not None:
            parts.append(f"pool {self.pools[0]}")
        if self.layers is not None and len(set(self.layers)) > 1:
            parts.append("layers " + ",".join(f"{k}x{n}" if n > 1 else str(k) for k, n in _runs(self.layers)))
        return " ".join(parts)


def _runs(values):
    """Run-length pairs (value, count) of a sequence, in order."""
    out = []
    for v in values:
        if out and out[-1][0] == v:
            out[-1][1] += 1
        else:
            out.append([v, 1])
    return out

"""A model as a list of layers and the hardware it runs on.

Each :class:`Layer` carries its FLOPs, memory traffic, activation, parameter
and transfer bytes for one microbatch; :class:`Hardware` (defined in
:mod:`pipecore.analysis.roofline`, importable from here) turns them into
F, B and W times with a roofline. :meth:`Model.costs` and
:meth:`Model.network` group layers into pipeline stages and give the
per-stage :class:`~pipecore.Costs` and :class:`~pipecore.Network` that
:func:`pipecore.simulate` takes, in **seconds and bytes**.

Everything is a plain dataclass: edit a preset or a layer with
:func:`dataclasses.replace`.

The sources of :meth:`Model.transformer`'s counts are in its References.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields

import numpy as np

from ..core.costs import Costs, Network
from ..core.ops import InputError
from ..core.sizes import check_size
from .architecture import Architecture, _positive_int
from .roofline import HARDWARE_PRESETS, Hardware, _number

__all__ = ["Layer", "Model", "Hardware", "LAYER_KINDS", "HARDWARE_PRESETS"]

#: Kinds a :class:`Layer` may have.
LAYER_KINDS = ("embedding", "block", "head")


@dataclass(frozen=True)
class Layer:
    """One layer for one microbatch: FLOPs, memory traffic and bytes.

    Parameters
    ----------
    name : str
        Label (e.g. ``"block 3"``).
    kind : str
        ``"embedding"``, ``"block"`` or ``"head"`` (the LM head with the loss).
    flops_f, flops_b, flops_w : float
        FLOPs of the forward (F), the backward for inputs (B) and the
        backward for weights (W).
    bytes_f, bytes_b, bytes_w : float
        Bytes each of F, B and W moves to and from device memory (the
        roofline's memory term).
    activation : float
        Bytes F keeps for the backward (freed by B, except ``activation_w``).
    activation_w : float
        Bytes W still needs after B (freed by W); at most ``activation``.
    params : float
        Number of parameters.
    param_bytes : float
        Static bytes the parameters take in training (weights, gradients
        and optimizer state).
    output_bytes : float
        Bytes of the layer's output, which a stage ending with this layer
        sends to the next stage (and the gradient of which comes back).

    Raises
    ------
    ValueError
        For an unknown kind, a negative or non-finite number, or
        ``activation_w > activation``.
    """

    name: str
    kind: str
    flops_f: float
    flops_b: float
    flops_w: float
    bytes_f: float
    bytes_b: float
    bytes_w: float
    activation: float
    activation_w: float
    params: float
    param_bytes: float
    output_bytes: float

    def __post_init__(self):
        if self.kind not in LAYER_KINDS:
            raise InputError(f"Layer 'kind' must be one of {', '.join(LAYER_KINDS)} (got {self.kind!r})")
        for f in fields(self):
            if f.name not in ("name", "kind"):
                object.__setattr__(self, f.name, _number("Layer", f.name, getattr(self, f.name)))
        if self.activation_w > self.activation:
            raise InputError(f"Layer 'activation_w' must be <= 'activation' "
                             f"(got {self.activation_w} > {self.activation} in {self.name!r})")

    def times(self, hardware: Hardware) -> tuple[float, float, float]:
        """Roofline seconds of F, B and W: ``max(FLOPs / flops, bytes / memory_bandwidth)``.

        Parameters
        ----------
        hardware : Hardware
            Its FLOP/s and memory bandwidth are the two roofs.

        Returns
        -------
        tuple of float
            ``(f, b, w)`` in seconds.

        Raises
        ------
        ValueError
            If a time overflows float64 (naming the layer, the op and the
            hardware field).
        """
        out = []
        for op, flops, moved in (("forward (F)", self.flops_f, self.bytes_f),
                                 ("backward (B)", self.flops_b, self.bytes_b),
                                 ("weight gradient (W)", self.flops_w, self.bytes_w)):
            try:
                out.append(hardware.roofline(flops, moved))
            except InputError as exc:
                raise InputError(f"layer {self.name!r}, {op}: {exc}") from None
        return tuple(out)


def _check_split(stage_layers, n_layers):
    """Layers per stage: a sequence of ints >= 1 summing to the model's layers."""
    try:
        counts = [int(c) for c in stage_layers]
    except (TypeError, ValueError):
        raise InputError(f"'stage_layers' must be a sequence of ints (got {stage_layers!r})") from None
    if any(isinstance(c, bool) for c in stage_layers) or \
            any(c != x for c, x in zip(counts, stage_layers)):
        raise InputError(f"'stage_layers' must hold ints (got {stage_layers!r})")
    if not counts:
        raise InputError("'stage_layers' must name at least one stage")
    if min(counts) < 1:
        s = counts.index(min(counts))
        raise InputError(f"'stage_layers' gives stage {s} {counts[s]} layers; every stage needs >= 1")
    if sum(counts) != n_layers:
        raise InputError(f"'stage_layers' sums to {sum(counts)} but the model has {n_layers} layers")
    return counts


@dataclass(frozen=True)
class Model:
    """A model as an ordered list of layers, for one microbatch.

    Parameters
    ----------
    layers : sequence of Layer
        In model order (stages take contiguous ranges of it).
    microbatch : int, default 1
        Sequences per microbatch (what the layers' numbers are for).
    seq : int, optional
        Tokens per sequence (informational).
    name : str, default "model"
        Label.
    architecture : Architecture, optional
        What :meth:`transformer` and :meth:`preset` built the layers from.

    Raises
    ------
    ValueError
        If there is no layer or an entry is not a :class:`Layer`.
    """

    layers: tuple
    microbatch: int = 1
    seq: int | None = None
    name: str = "model"
    architecture: Architecture | None = None
    _arrays: dict = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self):
        layers = tuple(self.layers)
        if not layers:
            raise InputError("Model 'layers' must hold at least one Layer")
        for i, layer in enumerate(layers):
            if not isinstance(layer, Layer):
                raise InputError(f"Model 'layers'[{i}] must be a pipecore Layer "
                                 f"(got {type(layer).__name__})")
        object.__setattr__(self, "layers", layers)
        _positive_int("Model", "microbatch", self.microbatch)
        if not isinstance(self.architecture, (Architecture, type(None))):
            kind = type(self.architecture).__name__
            raise InputError(f"Model 'architecture' must be an Architecture or None (got a {kind})")
        cols = ("activation", "activation_w", "param_bytes", "output_bytes", "params")
        object.__setattr__(self, "_arrays", {c: np.array([getattr(x, c) for x in layers]) for c in cols})

    def __len__(self) -> int:
        return len(self.layers)

    @classmethod
    def transformer(cls, layers: int, hidden: int, heads: int, seq: int, vocab: int,
                    microbatch: int = 1, bytes_per_value: int = 2, state_bytes_per_param: float = 16,
                    selective_recompute: bool = True, embedding: bool = True,
                    head: bool = True, name: str | None = None, ffn_hidden: int | None = None,
                    kv_heads: int | None = None, gated_mlp: bool = False, tied_embeddings: bool = True,
                    position_embedding: str = "rope", norm: str = "layernorm",
                    biases: bool = True) -> Model:
        """A GPT-style decoder: embedding, ``layers`` transformer blocks, LM head with loss.

        With b = ``microbatch``, s = ``seq``, h = ``hidden``, a = ``heads``,
        V = ``vocab``, q = ``bytes_per_value`` (2 for BF16), f = ``ffn_hidden``,
        kv = ``kv_heads * h / a``, and L = ``2 b s (h (h + 2 kv) + h^2 + 2 h f)``
        the linear layers' FLOPs (gated: ``3 h f`` for ``2 h f``; ``24 b s h^2``
        at the defaults). ``model.architecture`` (an
        :class:`~pipecore.analysis.architecture.Architecture`) gives the general forms.

        *Block*.

        - F FLOPs ``L + 4 b s^2 h`` [Megatron]_ (eq. 2's per-layer term
          ``24 b s h^2 + 4 b s^2 h`` at the defaults: QKV, projection and
          MLP matmuls, and the two attention matmuls).
        - B FLOPs ``L + 8 b s^2 h`` and W FLOPs ``L`` [ZB]_ (Table 1: the
          input gradient of every matmul and the attention core, twice the
          forward's; the weight gradients of the linear layers). With
          ``selective_recompute`` B also reruns the attention core's
          forward, ``+ 4 b s^2 h`` [Korthikanti]_ (sec. 5).
        - Activation bytes [Korthikanti]_ (eq. 1, 16-bit values, 1-byte
          dropout masks): ``s b h (34 + 5 a s / h)``. Generalised to q
          bytes per value: ``s b h (16 q + 2) + a s^2 b (2 q + 1)`` (GQA and
          other MLPs: ``Architecture.activation_bytes_per_layer``).
          With ``selective_recompute`` (Megatron's selective recompute, and
          what FlashAttention stores) the ``a s^2 b`` term is gone: ``34 s b h``.
        - Bytes W still needs after B: the inputs and output gradients of
          the linear layers, ``16 s b h`` values, ``32 s b h`` bytes in 16-bit
          [ZB]_ (Table 1's M_W; ``Architecture.weight_grad_bytes_per_layer``).
        - Parameters ``12 h^2 + 13 h`` (weights, biases, two layer norms)
          [Megatron]_ (``Architecture.block_params``); training state
          ``state_bytes_per_param`` each (16 with mixed-precision Adam [ZeRO]_).
        - Output (transfer) ``s b h`` values.
        - Bytes moved: F and B read the weights (q bytes each) and write or
          read the activation; W reads what it needs and writes the weight
          gradients (q bytes each).

        *Embedding*: ``V h`` parameters [Megatron]_ (``+ s h`` if learned
        positions); a lookup, so no matmul FLOPs: F moves ``2 s b h q`` bytes
        (rows read, output written), B nothing (token ids take no gradient),
        W scatter-adds the output gradient (``s b h`` FLOPs, ``2 s b h q``
        bytes). Activation: the dropout mask, ``s b h`` bytes [Korthikanti]_
        (sec. 4.3); W needs only the token ids (not counted).

        *Head* (final norm, output projection, cross-entropy loss):
        ``V h + 2 h`` parameters (RMSNorm: ``V h + h``; tied or not, the last
        stage holds its copy of ``V h``, so ``totals()["params"]`` counts a
        tied matrix twice, ``Architecture.params()`` once); F, B and W each
        ``2 b s h V`` FLOPs [Megatron]_ (the logit layer's ``6 b s h V``
        split like a linear layer's); activation ``2 s b h q + 4 s b V``
        bytes (layer-norm and projection inputs, and the FP32 logits the
        loss keeps [Korthikanti]_, sec. 4.3); W
        needs the projection input and the logit gradients,
        ``s b h q + s b V q`` bytes; bytes moved as for a block.

        Parameters
        ----------
        layers, hidden, heads, seq, vocab : int
            Transformer blocks, hidden size, attention heads, sequence
            length, vocabulary size.
        microbatch : int, default 1
            Sequences per microbatch.
        bytes_per_value : int, default 2
            Bytes of one activation or weight value (BF16).
        state_bytes_per_param : float, default 16
            Training bytes per parameter (weights, gradients, optimizer).
        selective_recompute : bool, default True
            Keep no ``s^2`` attention tensors and recompute the attention
            core in B (Megatron-LM's selective recompute; FlashAttention's
            memory). False gives Korthikanti's full ``34 + 5 a s / h``.
        embedding, head : bool, default True
            Include the embedding and the LM head.
        name : str, optional
            Label (of the model and its architecture).
        ffn_hidden, kv_heads, gated_mlp, tied_embeddings, norm, biases
            As :class:`~pipecore.analysis.architecture.Architecture`
            (``tied_embeddings`` changes ``Architecture.params()``, not the
            layers: see *Head*).
        position_embedding : str, default "rope"
            ``"rope"`` (no parameters, as these counts have always been) or
            ``"learned"`` (adds the ``s h`` table of [Megatron]_ eq. 2).

        Returns
        -------
        Model
            Embedding, ``layers`` blocks and head, in model order, with
            ``architecture`` set.

        Raises
        ------
        ValueError
            If a shape value is not a positive int, ``hidden`` is not a
            multiple of ``heads`` or ``heads`` of ``kv_heads``, or an
            architecture option is unknown.
        MemoryError
            (:class:`~pipecore.CapacityError`) if the layers would not fit in
            the memory available (checked before any is made).

        References
        ----------
        .. [Megatron] D. Narayanan et al., "Efficient Large-Scale Language Model
           Training on GPU Clusters Using Megatron-LM", SC'21, section 5.1 (FLOPs)
           and section 3.1 (parameters).
        .. [Korthikanti] V. Korthikanti et al., "Reducing Activation Recomputation
           in Large Transformer Models", MLSys 2023 (arXiv:2205.05198), section 4.1
           (activations per layer) and 4.3 (input and output layers).
        .. [ZB] P. Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024,
           Table 1 (F, B and W FLOPs and the memory W still needs).
        .. [ZeRO] S. Rajbhandari et al., "ZeRO: Memory Optimizations Toward
           Training Trillion Parameter Models", SC'20, section 3.1 (16 bytes of
           training state per parameter with mixed-precision Adam).
        """
        try:  # checks layers, hidden, heads, seq, vocab and the options, naming Model.transformer
            arch = Architecture(layers, hidden, heads, seq, vocab, ffn_hidden, kv_heads, gated_mlp,
                                tied_embeddings, position_embedding, norm, biases, name or "custom")
        except InputError as exc:
            raise InputError(str(exc).replace("Architecture", "Model.transformer", 1)) from None
        b = _positive_int("Model.transformer", "microbatch", microbatch)
        q = _positive_int("Model.transformer", "bytes_per_value", bytes_per_value)
        state = _number("Model.transformer", "state_bytes_per_param", state_bytes_per_param, positive=True)
        n = arch.layers
        _check_layers("transformer", n, n + bool(embedding) + bool(head))
        nums = arch.layer_costs(b, q, state, selective_recompute)
        out = ([Layer("embedding", "embedding", **nums["embedding"])] if embedding else []) \
            + [Layer(f"block {i}", "block", **nums["block"]) for i in range(n)] \
            + ([Layer("head", "head", **nums["head"])] if head else [])
        if not out:
            raise InputError("Model.transformer needs at least one layer")
        label = name or f"transformer L={n} h={hidden} a={heads} s={seq} V={vocab} b={b}"
        return cls(tuple(out), microbatch=b, seq=arch.seq, name=label, architecture=arch)

    @classmethod
    def preset(cls, name: str, microbatch: int = 1, seq: int | None = None, bytes_per_value: int = 2,
               state_bytes_per_param: float = 16, selective_recompute: bool = True, embedding: bool = True,
               head: bool = True) -> Model:
        """A published model (one of ``Architecture.presets()``) built by :meth:`transformer`.

        Parameters
        ----------
        name : str
            Preset name, case-insensitive (e.g. ``"gpt3-175b"``, ``"llama3-70b"``);
            the sources are in ``pipecore.analysis.architecture``.
        microbatch : int, default 1
            Sequences per microbatch.
        seq : int, optional
            Sequence length; the preset's (its training context) by default.
        bytes_per_value, state_bytes_per_param, selective_recompute, embedding, head
            As in :meth:`transformer`.

        Returns
        -------
        Model
            Named after the preset, ``architecture`` set.

        Raises
        ------
        ValueError
            For an unknown name (the message lists the valid ones) or an invalid value.
        """
        arch = Architecture.preset(name)
        shape = {f.name: getattr(arch, f.name) for f in fields(arch)} | ({} if seq is None else {"seq": seq})
        return cls.transformer(**shape, microbatch=microbatch, bytes_per_value=bytes_per_value,
                               state_bytes_per_param=state_bytes_per_param, embedding=embedding, head=head,
                               selective_recompute=selective_recompute)

    @classmethod
    def uniform(cls, layers: int, f: float = 1.0, b: float = 2.0, w: float = 0.0,
                activation: float = 1.0, activation_w: float = 0.0, weights: float = 1.0,
                output_bytes: float = 1.0, name: str = "uniform") -> Model:
        """Equal blocks with given per-layer costs, for a roofline at 1 FLOP/s.

        Each block's FLOPs are ``f``, ``b``, ``w`` and it moves no bytes, so
        on ``Hardware(flops=1, memory_bandwidth=inf, ...)`` its times are
        exactly ``f``, ``b`` and ``w``. Handy to compare with the unit-cost
        results of :class:`~pipecore.Costs`.

        Parameters
        ----------
        layers : int
            Number of blocks.
        f, b, w : float
            FLOPs (seconds at 1 FLOP/s) of F, B and W per layer.
        activation, activation_w, weights, output_bytes : float
            Bytes per layer.
        name : str, default "uniform"
            Label.

        Returns
        -------
        Model
            ``layers`` equal blocks.

        Raises
        ------
        ValueError
            For a bad count or a negative value.
        MemoryError
            (:class:`~pipecore.CapacityError`) if the layers would not fit in
            the memory available (checked before any is made).
        """
        n = _positive_int("Model.uniform", "layers", layers)
        _check_layers("uniform", n, n)
        blocks = tuple(Layer(f"block {i}", "block", f, b, w, 0.0, 0.0, 0.0, activation, activation_w,
                             weights, weights, output_bytes) for i in range(n))
        return cls(blocks, name=name)

    # -- per-layer and per-stage numbers --------------------------------
    def layer_times(self, hardware: Hardware) -> np.ndarray:
        """Roofline seconds of every layer's F, B and W.

        Parameters
        ----------
        hardware : Hardware

        Returns
        -------
        numpy.ndarray
            Shape ``(layers, 3)``: columns f, b, w.

        Raises
        ------
        ValueError
            If ``hardware`` is not a :class:`Hardware`, or a time or the
            sum of a column overflows float64 (naming the layer and the
            hardware field).
        """
        _check_hardware(hardware)
        times = np.array([x.times(hardware) for x in self.layers], dtype=np.float64).reshape(-1, 3)
        with np.errstate(over="ignore"):
            total = times.sum(axis=0)
        if not np.isfinite(total).all():  # every stage's sum is at most this
            op = "FBW"[int(np.flatnonzero(~np.isfinite(total))[0])]
            raise InputError(f"the {op} times of the {len(self)} layers of {self.name!r} on "
                             f"Hardware {hardware.name!r} (flops={hardware.flops:g} FLOP/s, "
                             f"memory_bandwidth={hardware.memory_bandwidth:g} bytes/s) sum to "
                             f"more than float64 holds (1.8e308 s): check the hardware's rates "
                             f"(FLOP/s, bytes/s) and the layers' FLOPs and bytes")
        return times

    def stage_ranges(self, stage_layers) -> list[tuple[int, int]]:
        """``(start, stop)`` layer indices of each stage.

        Parameters
        ----------
        stage_layers : sequence of int
            Layers per stage, in model order; each >= 1, summing to
            ``len(model)``.

        Returns
        -------
        list of tuple of int

        Raises
        ------
        ValueError
            If ``stage_layers`` is not such a sequence.
        """
        counts = _check_split(stage_layers, len(self.layers))
        ends = np.cumsum(counts)
        return [(int(e - c), int(e)) for c, e in zip(counts, ends)]

    def _stage_sums(self, values, stage_layers):
        counts = _check_split(stage_layers, len(self.layers))
        starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
        return np.add.reduceat(np.asarray(values, dtype=np.float64), starts, axis=0)

    def costs(self, stage_layers, hardware: Hardware, times: np.ndarray | None = None) -> Costs:
        """Per-stage :class:`~pipecore.Costs` in seconds and bytes.

        A stage's F, B and W take the sum of its layers' roofline times
        (one kernel after another); its ``activation``, ``activation_w`` and
        ``weights`` are its layers' activation, W-kept and parameter
        (training state) bytes. Every field is a vector with one entry per
        stage, so it is used as that stage's value directly.

        Parameters
        ----------
        stage_layers : sequence of int
            Layers per stage (see :meth:`stage_ranges`).
        hardware : Hardware
        times : numpy.ndarray, optional
            :meth:`layer_times` for this hardware, to skip recomputing it.

        Returns
        -------
        Costs
            ``comm`` is 0: transfers are timed by :meth:`network`.

        Raises
        ------
        ValueError
            If ``stage_layers`` is invalid.
        """
        if times is None:
            times = self.layer_times(hardware)
        t = self._stage_sums(times, stage_layers)
        arr = self._arrays
        act = self._stage_sums(arr["activation"], stage_layers)
        # Sums of per-layer values each <= activation stay <= up to rounding; clip the ulps.
        act_w = np.minimum(self._stage_sums(arr["activation_w"], stage_layers), act)
        return Costs(f=t[:, 0], b=t[:, 1], w=t[:, 2], comm=0.0, activation=act, activation_w=act_w,
                     weights=self._stage_sums(arr["param_bytes"], stage_layers))

    def transfer_bytes(self, stage_layers) -> np.ndarray:
        """Bytes each stage's ops send, indexed by the sending stage.

        Stage s's F sends the output of its last layer; its B sends the
        gradient of its input, the output of stage s-1, which for a
        transformer is the same ``s b h`` values. The vector holds the F
        payload for s < S-1 and, for the last stage (whose F sends
        nothing), the gradient its B sends.

        Parameters
        ----------
        stage_layers : sequence of int

        Returns
        -------
        numpy.ndarray

        Raises
        ------
        ValueError
            If ``stage_layers`` is invalid.
        """
        ranges = self.stage_ranges(stage_layers)
        out = self._arrays["output_bytes"]
        nbytes = np.array([out[stop - 1] for _, stop in ranges], dtype=np.float64)
        if len(ranges) > 1:
            nbytes[-1] = out[ranges[-1][0] - 1]
        return nbytes

    def network(self, stage_layers, hardware: Hardware) -> Network:
        """The :class:`~pipecore.Network` of ``hardware`` with :meth:`transfer_bytes`.

        Parameters
        ----------
        stage_layers : sequence of int
            Layers per stage, in model order.
        hardware : Hardware
            Whose links carry the transfers.

        Returns
        -------
        Network
            Bytes per transfer indexed by the sending stage.

        Raises
        ------
        ValueError
            If ``stage_layers`` is invalid.
        """
        _check_hardware(hardware)
        return hardware.network(self.transfer_bytes(stage_layers))

    def totals(self) -> dict:
        """Whole-model sums: ``params``, ``param_bytes``, ``activation``, ``flops``.

        Returns
        -------
        dict of str to float
        """
        return {"params": float(self._arrays["params"].sum()),
                "param_bytes": float(self._arrays["param_bytes"].sum()),
                "activation": float(self._arrays["activation"].sum()),
                "flops": float(sum(x.flops_f + x.flops_b + x.flops_w for x in self.layers))}


# Bytes a layer of Model.transformer and of Model.uniform takes (a frozen
# dataclass of 13 fields, its floats and its entries in the model's per-layer
# arrays; uniform's share their floats): the size guard's estimates, measured
# with tracemalloc, so that what passes the guard fits.
_BYTES_PER_LAYER = {"transformer": 460, "uniform": 290}


def _check_layers(kind, layers, count):
    """The size guard (core/sizes.py) on the layers a constructor makes, before any."""
    check_size(f"Model.{kind}(layers={layers})", count, "layers",
               bytes_each=_BYTES_PER_LAYER[kind], purpose="to list")


def _check_hardware(hardware):
    if not isinstance(hardware, Hardware):
        raise InputError(f"'hardware' must be a pipecore.model.Hardware (got {type(hardware).__name__})")
    return hardware

"""Per-stage op times and memory of one strategy, from the architecture and the GPU.

One microbatch of ``b`` sequences of ``s`` tokens (``T = b s`` rows)
through one transformer block on one tensor-parallel rank of ``t``:

- GEMMs, Megatron's split: QKV and the first MLP matrix split their
  output columns over ``t``, the projection and the second MLP matrix
  their input rows; each weight GEMM's backward is a data-gradient GEMM
  (pipecore's B) and a weight-gradient GEMM (W). Times from the GPU's
  shape-dependent GEMM efficiency (:mod:`pipecore.plan.hardware`).
- Attention core: unfused (two batched GEMMs per head, a fused
  scale-mask-softmax and a dropout over ``b a s^2 / t`` values, as
  Megatron-LM in 2021), or FlashAttention-style (one kernel, no ``s^2``
  tensor in memory).
- Memory-bound ops (layer norms, bias-GeLU, bias-dropout-add) at the
  GPU's achievable HBM bandwidth; the backward moves twice the forward's
  bytes. Every kernel adds the GPU's per-kernel overhead.
- Tensor-parallel collectives on the critical path (Megatron does not
  overlap them): two all-reduces of ``T h`` values in the forward, two in
  the backward; with sequence parallelism each is a reduce-scatter plus an
  all-gather of the same volume.
- Recomputation: full reruns the forward (its collectives too) inside B;
  selective reruns the unfused attention core (FlashAttention recomputes
  inside its own backward, counted there). Only the transformer blocks
  are recomputed: Megatron checkpoints its layers, not the embedding, the
  final norm, the LM head or the loss.

The first stage adds the embedding, the last the final norm, the LM head
(vocabulary split over ``t``) and the cross-entropy loss in fp32.

Around the ops (:func:`grad_accumulation_time`, :func:`p2p_exchange`):
without gradient-accumulation fusion each microbatch's weight gradients
are added to the accumulated ones by a separate pass over memory; a
pipeline send split over the tensor-parallel ranks (Megatron's
scatter-gather) is rebuilt by an all-gather inside the receiving node.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from ..core.ops import InputError

# FlashAttention-2 on A100 (Dao, arXiv 2307.08691, section 4.1, Figs. 4-6; causal, head
# dimension 128, sequence 2k): forward about 0.6 and backward about 0.5 of the
# GPU's peak, counting the causal kernel's FLOPs (half the full s^2 product).
FLASH_FORWARD_EFFICIENCY = 0.6
FLASH_BACKWARD_EFFICIENCY = 0.5
# FlashAttention-2's backward runs 5 matmuls to the forward's 2 (same paper, section 3.1.2).
FLASH_BACKWARD_FLOPS = 2.5

# Bytes each memory-bound op moves per value (16-bit activations, 1-byte dropout masks):
# a layer norm reads and writes its input (4); bias-dropout-add reads two inputs and writes
# the output and the mask (7); bias-GeLU reads and writes (4; a gated unit reads two, 6).
# Megatron's causal fused softmax (megatron/fused_kernels/scaled_upper_triang_masked_softmax.h,
# used for s <= 2048) reads a row only up to the diagonal, half the scores on average, and
# writes the whole row (1 + 2); the dropout after it reads, writes and keeps its mask (5).
LAYER_NORM_BYTES = 4
DROPOUT_ADD_BYTES = 7
GELU_BYTES = 4
GATED_BYTES = 6
SOFTMAX_DROPOUT_BYTES = 8
# Their backward: the dropout's reads the gradient and the mask and writes (5); the
# softmax's reads its output and the gradient up to the diagonal and writes the row
# (1 + 1 + 2), in the same kernel file; PyTorch's dropout backward is a masked scale.
SOFTMAX_DROPOUT_BACKWARD_BYTES = 9
# The backward of an element-wise op reads the saved input and the output gradient and
# writes the input gradient: about twice the forward's traffic.
BACKWARD_BYTES_FACTOR = 2.0
# Megatron's vocab-parallel cross-entropy (megatron/mpu/cross_entropy.py, unchanged in its
# steps since 2020) on logits cast to fp32: the cast (2 read, 4 written), the max (4 read),
# subtracting it in place (8), exp in place (8), the sum (4) and dividing by it in place (8):
# 38 bytes per logit forward. The backward scales the saved softmax in place (8) and casts
# the gradient back to 16 bits (4 read, 2 written): 14.
LOSS_FORWARD_BYTES = 38
LOSS_BACKWARD_BYTES = 14
# Kernels of one block's forward besides its GEMMs and collectives: 2 layer norms,
# 2 bias-dropout-adds, bias-GeLU, and with unfused attention the softmax and its dropout.
ELEMENTWISE_KERNELS = 5
UNFUSED_ATTENTION_KERNELS = 2
# Parameter tensors of one block (weights and biases of its four linear layers and two
# layer norms): one gradient-accumulation kernel each.
BLOCK_PARAM_TENSORS = 12


@dataclass(frozen=True)
class OpTimes:
    """Seconds and bytes of one piece of the model for one microbatch on one rank.

    Attributes
    ----------
    f, b, w : float
        Forward, input-gradient and weight-gradient time in seconds,
        tensor-parallel collectives and recomputation included.
    tp_f, tp_b : float
        The tensor-parallel collectives' part of ``f`` and ``b`` (seconds).
    dp_f, dp_b : float
        ZeRO-3's parameter all-gathers (and, in B, gradient reduce-scatter)
        in ``f`` and ``b`` (seconds).
    compute : float
        Seconds of ``f + b + w`` spent computing (collectives out).
    params : float
        Parameters this rank holds.
    """

    f: float
    b: float
    w: float
    tp_f: float
    tp_b: float
    compute: float
    params: float
    dp_f: float = 0.0
    dp_b: float = 0.0


@lru_cache(maxsize=65536)
def _gemm(gpu, m, n, k, batch=1):
    # A search asks for the same few shapes thousands of times (GPU is frozen, so hashable).
    return float(gpu.gemm_time(m, n, k, batch))


def _weight_gemms(gpu, shapes):
    """(forward, data-gradient, weight-gradient) seconds of weight GEMMs (m, n, k)."""
    f = sum(_gemm(gpu, m, n, k) for m, n, k in shapes)
    b = sum(_gemm(gpu, m, k, n) for m, n, k in shapes)
    w = sum(_gemm(gpu, k, n, m) for m, n, k in shapes)
    return f, b, w


@lru_cache(maxsize=4096)
def _tp_collectives(cluster, pool, nbytes, t, sp, count):
    """Seconds of ``count`` tensor-parallel reductions of ``nbytes`` each."""
    if t == 1:
        return 0.0
    if sp:
        one = (cluster.collective_time("reduce-scatter", nbytes, t, t, pool)
               + cluster.collective_time("all-gather", nbytes, t, t, pool))
    else:
        one = cluster.collective_time("all-reduce", nbytes, t, t, pool)
    return count * float(one)


def block_times(arch, gpu, cluster, pool, strategy) -> OpTimes:
    """One transformer block's times on one tensor-parallel rank.

    Parameters
    ----------
    arch : pipecore.analysis.architecture.Architecture
    gpu : pipecore.plan.hardware.GPU
    cluster : pipecore.plan.hardware.Cluster
    pool : int
        The cluster's pool the stage runs on.
    strategy : pipecore.plan.strategy.Strategy

    Returns
    -------
    OpTimes
    """
    t, b, s = strategy.tp, strategy.microbatch_size, arch.seq
    h, a, ffn = arch.hidden, arch.heads, arch.ffn_hidden
    d = h // a
    kv = arch.kv_heads * d
    T = b * s
    sp = strategy.sequence_parallel and t > 1
    up = ffn * (2 if arch.gated_mlp else 1)
    shapes = [(T, (h + 2 * kv) / t, h), (T, h, h / t), (T, up / t, h), (T, h, ffn / t)]
    gf, gb, gw = _weight_gemms(gpu, shapes)
    heads = b * a / t
    unfused = strategy.attention == "unfused"
    if unfused:
        att_f = _gemm(gpu, s, s, d, heads) + _gemm(gpu, s, d, s, heads)
        att_b = 2 * att_f
        att_mem = SOFTMAX_DROPOUT_BYTES * heads * s * s
        att_mem_b = SOFTMAX_DROPOUT_BACKWARD_BYTES * heads * s * s
    else:
        causal_flops = 0.5 * 4 * b * s * s * h / t
        att_f = causal_flops / (gpu.peak_flops * FLASH_FORWARD_EFFICIENCY)
        att_b = FLASH_BACKWARD_FLOPS * causal_flops / (gpu.peak_flops * FLASH_BACKWARD_EFFICIENCY)
        att_mem = att_mem_b = 0.0
    rows = T / t if sp else T
    mem_f = ((2 * LAYER_NORM_BYTES + 2 * DROPOUT_ADD_BYTES) * rows * h
             + (GATED_BYTES if arch.gated_mlp else GELU_BYTES) * T * ffn / t + att_mem)
    mem_tf = float(gpu.memory_time(mem_f))
    mem_tb = float(gpu.memory_time(BACKWARD_BYTES_FACTOR * (mem_f - att_mem) + att_mem_b))
    kernels_f = len(shapes) + ELEMENTWISE_KERNELS + (UNFUSED_ATTENTION_KERNELS if unfused else 1)
    over = gpu.kernel_overhead
    nbytes = T * h * 2
    tp_f = _tp_collectives(cluster, pool, nbytes, t, sp, 2)
    tp_b = tp_f
    f_compute = gf + att_f + mem_tf + kernels_f * over
    b_compute = gb + att_b + mem_tb + (kernels_f + len(shapes)) * over
    w_compute = gw + len(shapes) * over
    if strategy.recompute == "full":
        b_compute += f_compute
        tp_b += tp_f
    elif strategy.recompute == "selective" and unfused:
        b_compute += att_f + float(gpu.memory_time(att_mem)) + UNFUSED_ATTENTION_KERNELS * over
    params = arch.block_params() / t
    dp_f, dp_b = zero3_collectives(cluster, pool, strategy, params)
    return OpTimes(f=f_compute + tp_f + dp_f, b=b_compute + tp_b + dp_b, w=w_compute, tp_f=tp_f,
                   tp_b=tp_b, compute=f_compute + b_compute + w_compute, params=params,
                   dp_f=dp_f, dp_b=dp_b)


def zero3_collectives(cluster, pool, strategy, params):
    """Seconds of ZeRO-3's collectives for a layer of ``params`` parameters per
    tensor-parallel rank, for one microbatch: its 16-bit parameters all-gathered
    before the forward and again before the backward, and its gradients
    reduce-scattered after the backward (in the gradient precision). Counted on
    the critical path (no prefetch overlap modelled).

    Parameters
    ----------
    cluster, pool, strategy
        As :func:`block_times`.
    params : float
        Parameters of the layer on one tensor-parallel rank.

    Returns
    -------
    (float, float)
        Seconds added to the forward and to the backward.
    """
    dp = strategy.dp
    if strategy.zero < 3 or dp == 1:
        return 0.0, 0.0
    per_node = max(1, min(dp, cluster.pools[pool].gpus_per_node // strategy.tp))
    gather = float(cluster.collective_time("all-gather", params * 2, dp, per_node, pool))
    grad = 4 if strategy.precision == "bf16" else 2
    scatter = float(cluster.collective_time("reduce-scatter", params * grad, dp, per_node, pool))
    return gather, gather + scatter


def embedding_times(arch, gpu, cluster, pool, strategy) -> OpTimes:
    """The input embedding's times on one tensor-parallel rank (vocabulary split over tp).

    Parameters
    ----------
    arch, gpu, cluster, pool, strategy
        As :func:`block_times`.

    Returns
    -------
    OpTimes
    """
    t, T, h = strategy.tp, strategy.microbatch_size * arch.seq, arch.hidden
    sp = strategy.sequence_parallel and t > 1
    # Lookup (read and write a row), dropout (read, write, mask). PyTorch's dense embedding
    # backward (aten/src/ATen/native/cuda/Embedding.cu, embedding_dense_backward_cuda)
    # zero-fills a gradient of the whole table shard (16-bit), then adds each token's
    # gradient row into it (2 read, 4 read and written with fp32 accumulation).
    f = float(gpu.memory_time(4 * T * h + 5 * (T / t if sp else T) * h)) + 2 * gpu.kernel_overhead
    w = float(gpu.memory_time(2 * arch.vocab / t * h + 6 * T * h)) + 2 * gpu.kernel_overhead
    tp_f = _tp_collectives(cluster, pool, T * h * 2, t, sp, 1) if t > 1 else 0.0
    return OpTimes(f=f + tp_f, b=0.0, w=w, tp_f=tp_f, tp_b=0.0, compute=f + w,
                   params=arch.embedding_params() / t)


def head_times(arch, gpu, cluster, pool, strategy) -> OpTimes:
    """The final norm, LM head and loss on one tensor-parallel rank.

    Parameters
    ----------
    arch, gpu, cluster, pool, strategy
        As :func:`block_times`.

    Returns
    -------
    OpTimes
    """
    t, T, h, V = strategy.tp, strategy.microbatch_size * arch.seq, arch.hidden, arch.vocab
    sp = strategy.sequence_parallel and t > 1
    gf, gb, gw = _weight_gemms(gpu, [(T, V / t, h)])
    logits = T * V / t
    norm = LAYER_NORM_BYTES * (T / t if sp else T) * h
    over = gpu.kernel_overhead
    f = gf + float(gpu.memory_time(norm + LOSS_FORWARD_BYTES * logits)) + 5 * over
    b = gb + float(gpu.memory_time(BACKWARD_BYTES_FACTOR * norm + LOSS_BACKWARD_BYTES * logits)) \
        + 4 * over
    w = gw + over
    # The loss all-reduces a few fp32 numbers per token (max, sum, target logit); with
    # sequence parallelism the head's input is all-gathered first.
    tp_f = tp_b = 0.0
    if t > 1:
        tp_f = 3 * float(cluster.collective_time("all-reduce", T * 4, t, t, pool))
        tp_b = _tp_collectives(cluster, pool, T * h * 2, t, sp, 1)
    # Full recomputation leaves the head alone: Megatron checkpoints transformer layers only
    # (ParallelTransformer._checkpointed_forward; the final norm and the logits run outside).
    # A pipeline's last stage keeps its own copy of a tied table; the final norm is whole.
    return OpTimes(f=f + tp_f, b=b + tp_b, w=w, tp_f=tp_f, tp_b=tp_b, compute=f + b + w,
                   params=arch.vocab * arch.hidden / t + arch.norm_params())


def grad_accumulation_time(gpu, strategy, params, tensors, microbatches):
    """Seconds per microbatch of adding new weight gradients to the accumulated ones.

    Without gradient-accumulation fusion (Megatron-LM before Feb 2022, its
    commit 83b1e42f30 "gradient accumulation fusion"), a weight-gradient
    GEMM writes a fresh gradient and a separate kernel adds it in: with
    16-bit gradients PyTorch's ``AccumulateGrad`` runs ``grad += new``
    (torch/csrc/autograd/functions/accumulate_grad.h: read both, write one,
    6 bytes per parameter) from the second microbatch on, the first one's
    gradient being kept as it is; with fp32 main gradients (bf16) Megatron's
    DDP hook runs ``main_grad.add_(grad)`` on every microbatch (2 + 4 read,
    4 written). One kernel per parameter tensor.

    Parameters
    ----------
    gpu : pipecore.plan.hardware.GPU
    strategy : pipecore.plan.strategy.Strategy
    params : float or numpy.ndarray
        Parameters whose gradients are accumulated (per stage).
    tensors : float or numpy.ndarray
        Parameter tensors they are held in (per stage).
    microbatches : int
        Microbatches per iteration.

    Returns
    -------
    float or numpy.ndarray
        Seconds added to each microbatch's W op (0 with fusion), the
        iteration's total spread evenly over its microbatches.
    """
    params = np.asarray(params, dtype=float)
    if strategy.grad_accumulation_fusion:
        return np.zeros_like(params)
    if strategy.precision == "bf16":
        share, nbytes = 1.0, 10.0
    else:
        share, nbytes = (microbatches - 1) / microbatches, 6.0
    return share * (gpu.memory_time(nbytes * params) + np.asarray(tensors, dtype=float) * gpu.kernel_overhead)


def p2p_exchange(cluster, pool, strategy, nbytes, inter_node, scatter):
    """Seconds of one pipeline send between neighbouring stages and of rebuilding it.

    Megatron's scatter-gather (``--no-scatter-gather-tensors-in-pipeline``
    turns it off): with tensor parallelism each rank of a stage sends only
    its ``1/t`` of the activation to its peer in the next stage, and the
    receiving ranks all-gather the pieces over NVLink before using them
    (megatron/p2p_communication.py, ``_communicate``).

    Parameters
    ----------
    cluster : pipecore.plan.hardware.Cluster
    pool : int
    strategy : pipecore.plan.strategy.Strategy
    nbytes : float
        Bytes of the whole activation (or its gradient) crossing the boundary.
    inter_node : bool
        Whether the two stages sit on different nodes.
    scatter : bool
        Whether the send is split over the tensor-parallel ranks.

    Returns
    -------
    send : float
        Seconds of the send: latency plus the piece over the link.
    gather : float
        Seconds of the all-gather that rebuilds the activation (0 without scatter).
    """
    return _exchange(cluster, pool, strategy.tp, float(nbytes), bool(inter_node), bool(scatter))


@lru_cache(maxsize=4096)
def _exchange(cluster, pool, t, nbytes, inter_node, scatter):
    # A search asks for the same few boundaries thousands of times (Cluster is frozen).
    piece = nbytes / t if scatter and t > 1 else nbytes
    send = float(cluster.p2p_time(piece, inter_node, pool))
    gather = 0.0
    if scatter and t > 1:
        gather = float(cluster.collective_time("all-gather", nbytes, t, t, pool))
    return send, gather


def pipeline_comm(cluster, pool, strategy, stage_device, nbytes, cross_node, stages_per_node):
    """Seconds the pipeline's point-to-point traffic adds to each stage's F and B.

    A boundary between stages on two devices carries the activation forward
    and its gradient back (:func:`p2p_exchange`). With ``p2p_overlap`` the
    send itself is simulated on its link beside compute, and only the
    receiver's all-gather is added, to the op that needs the tensor. Without
    it each exchange blocks both GPUs until done (megatron/p2p_communication.py
    waits on its requests and, in 2021, called ``torch.cuda.synchronize()``),
    so the send and the all-gather are added to the op that produces the
    tensor: in a steady 1F1B step each device runs F, an exchange, B and an
    exchange, and the schedule's lock-step pairs every exchange with the
    neighbour's.

    Parameters
    ----------
    cluster, pool, strategy
        As :func:`block_times`.
    stage_device : sequence of int
        The device of each stage, in model order.
    nbytes : float
        Bytes of the activation crossing each boundary.
    cross_node : bool
        Whether every pipeline device is on its own node(s).
    stages_per_node : int
        Pipeline devices per node when they share nodes.

    Returns
    -------
    (numpy.ndarray, numpy.ndarray)
        Seconds added to each stage's F and to its B.
    """
    stages = len(stage_device)
    f_add, b_add = np.zeros(stages), np.zeros(stages)
    scatter = cross_node and strategy.tp > 1
    for s in range(stages - 1):
        a, b = stage_device[s], stage_device[s + 1]
        if a == b:
            continue
        inter = cross_node or a // stages_per_node != b // stages_per_node
        send, gather = p2p_exchange(cluster, pool, strategy, nbytes, inter, scatter)
        if strategy.p2p_overlap:
            f_add[s + 1] += gather
            b_add[s] += gather
        else:
            f_add[s] += send + gather
            b_add[s + 1] += send + gather
    return f_add, b_add


def activation_bytes(arch, strategy) -> tuple[float, float]:
    """Bytes one block keeps per microbatch on one rank until its backward, and
    the bytes a full recomputation rebuilds for the layer being differentiated.

    Parameters
    ----------
    arch : Architecture
    strategy : Strategy

    Returns
    -------
    kept : float
        Held from the forward to the backward (Korthikanti et al. Table 2
        through :meth:`Architecture.activation_bytes_per_layer`).
    transient : float
        With full recomputation, one layer's activations while it is
        differentiated; else 0.
    """
    t, b = strategy.tp, strategy.microbatch_size
    sp = strategy.sequence_parallel and t > 1
    # FlashAttention keeps no s^2 tensor, as selective recomputation does not.
    mode = strategy.recompute
    if mode == "none" and strategy.attention == "flash":
        mode = "selective"
    kept = arch.activation_bytes_per_layer(b, tp=t, sequence_parallel=sp, recompute=mode)
    transient = 0.0
    if strategy.recompute == "full":
        inner = "selective" if strategy.attention == "flash" else "none"
        transient = arch.activation_bytes_per_layer(b, tp=t, sequence_parallel=sp, recompute=inner)
    return float(kept), float(transient)


def check_layout(arch, strategy):
    """Refuse a strategy the model cannot be split by.

    Parameters
    ----------
    arch : Architecture
    strategy : Strategy

    Raises
    ------
    ValueError
        If heads, kv heads, the MLP, the vocabulary or the layers do not
        divide as tensor and pipeline parallelism need.
    """
    t, stages = strategy.tp, strategy.pp * strategy.chunks
    for name, value in (("heads", arch.heads), ("kv_heads", arch.kv_heads),
                        ("ffn_hidden", arch.ffn_hidden)):
        if value % t:
            raise InputError(f"tp={t} does not divide the model's {name} ({value}): each "
                             f"tensor-parallel rank needs a whole share")
    if strategy.layers is not None:
        if sum(strategy.layers) != arch.layers:
            raise InputError(f"Strategy 'layers' {list(strategy.layers)} sum to {sum(strategy.layers)}; "
                             f"the model has {arch.layers} layers")
    elif arch.layers % stages:
        raise InputError(f"pp * chunks = {strategy.pp} * {strategy.chunks} = {stages} stages do "
                         f"not divide the model's {arch.layers} layers (give Strategy(layers=...) "
                         f"for an uneven split)")

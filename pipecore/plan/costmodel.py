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
  inside its own backward, counted there).

The first stage adds the embedding, the last the final norm, the LM head
(vocabulary split over ``t``) and the cross-entropy loss in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

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
# the output and the mask (7); bias-GeLU reads and writes (4; a gated unit reads two, 6);
# the fused scale-mask-softmax reads and writes (4) and the dropout after it reads, writes
# and keeps its mask (5).
LAYER_NORM_BYTES = 4
DROPOUT_ADD_BYTES = 7
GELU_BYTES = 4
GATED_BYTES = 6
SOFTMAX_DROPOUT_BYTES = 9
# The backward of an element-wise op reads the saved input and the output gradient and
# writes the input gradient: about twice the forward's traffic.
BACKWARD_BYTES_FACTOR = 2.0
# Cross-entropy on fp32 logits: the cast (2 read, 4 written), max, exp-sum and the loss
# read them (12): 18 bytes per logit forward; the backward reads and writes (8).
LOSS_FORWARD_BYTES = 18
LOSS_BACKWARD_BYTES = 8
# Kernels of one block's forward besides its GEMMs and collectives: 2 layer norms,
# 2 bias-dropout-adds, bias-GeLU, and with unfused attention the softmax and its dropout.
ELEMENTWISE_KERNELS = 5
UNFUSED_ATTENTION_KERNELS = 2


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
    else:
        causal_flops = 0.5 * 4 * b * s * s * h / t
        att_f = causal_flops / (gpu.peak_flops * FLASH_FORWARD_EFFICIENCY)
        att_b = FLASH_BACKWARD_FLOPS * causal_flops / (gpu.peak_flops * FLASH_BACKWARD_EFFICIENCY)
        att_mem = 0.0
    rows = T / t if sp else T
    mem_f = ((2 * LAYER_NORM_BYTES + 2 * DROPOUT_ADD_BYTES) * rows * h
             + (GATED_BYTES if arch.gated_mlp else GELU_BYTES) * T * ffn / t + att_mem)
    mem_tf = float(gpu.memory_time(mem_f))
    mem_tb = float(gpu.memory_time(BACKWARD_BYTES_FACTOR * mem_f))
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
    # Lookup (read and write a row), dropout (read, write, mask); the backward
    # scatter-adds the gradient into the fp32 gradient of the table.
    f = float(gpu.memory_time(4 * T * h + 5 * (T / t if sp else T) * h)) + 2 * gpu.kernel_overhead
    w = float(gpu.memory_time(10 * T * h)) + gpu.kernel_overhead
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
    if strategy.recompute == "full":
        b += f
        tp_b += tp_f
    # A pipeline's last stage keeps its own copy of a tied table; the final norm is whole.
    return OpTimes(f=f + tp_f, b=b + tp_b, w=w, tp_f=tp_f, tp_b=tp_b, compute=f + b + w,
                   params=arch.vocab * arch.hidden / t + arch.norm_params())


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

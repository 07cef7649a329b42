"""One strategy's iteration time, throughput and memory per GPU.

The pipeline is pipecore's own: the strategy's schedule is built for its
``pp`` devices and microbatches, each stage's op times come from
:mod:`pipecore.plan.costmodel`, and the simulator times it with the
point-to-point transfers on their links. Around the pipeline: the
data-parallel gradient reduction (after each device's last backward,
overlapped with it when asked), the tied embedding's gradient all-reduce
between the first and last stage, the optimizer step, and ZeRO's
parameter all-gather.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import lru_cache

import numpy as np

from ..core.costs import Costs, Network
from ..core.ops import InputError
from ..core.simulate import simulate
from ..schedules.registry import build
from . import costmodel
from .strategy import Strategy

# Bytes per parameter of mixed-precision Adam (Megatron-LM, docs/source/api-guide/
# dist_optimizer.md: 16-bit parameters, fp32 gradients, fp32 master weights and two
# moments): 18 without sharding; the distributed optimizer shards the 12 of the optimizer.
PARAM_BYTES = 2
GRAD_BYTES = 4
OPTIMIZER_BYTES = 12
# An Adam step per parameter reads the fp32 gradient, master weight and two moments (16),
# writes the master weight, moments (12) and the 16-bit copy (2); the gradient norm reads
# the gradients once more (4) and zeroing them writes them (4).
STEP_BYTES = 38
# With fp16, Megatron's Float16Optimizer first copies the 16-bit gradients to fp32 (2 read,
# 4 written) and unscales them while checking for infinities (4 read, 4 written):
# megatron/optimizer/optimizer.py, _copy_model_grads_to_main_grads and
# _unscale_main_grads_and_check_for_nan.
FP16_STEP_BYTES = 14
# Memory a framework takes beside the model (CUDA context, NCCL buffers, allocator
# fragmentation): a stated assumption, not a measurement; estimate(reserve=...) changes it.
RESERVE_BYTES = 2e9


@dataclass(frozen=True)
class Estimate:
    """What one strategy predicts for one training iteration.

    Attributes
    ----------
    strategy : Strategy
    global_batch, microbatches : int
        Sequences per iteration; microbatches per pipeline.
    gpus : int
    iteration_time : float
        Seconds per iteration (lower is faster).
    tokens_per_second : float
        Tokens trained per second over the whole run (higher is faster).
    tflops_per_gpu : float
        Model FLOPs (no recomputation counted) per second per GPU, in
        TFLOP/s.
    hardware_tflops_per_gpu : float
        FLOPs executed, recomputation included (Megatron SC21's eq. 3
        counting with full recomputation), per second per GPU, in TFLOP/s.
    mfu, hfu : float
        ``tflops_per_gpu`` and ``hardware_tflops_per_gpu`` as a share of
        the GPU's peak (0-1).
    memory_per_gpu : float
        Bytes on the fullest GPU.
    memory : dict
        That GPU's bytes by part: ``params``, ``grads``, ``optimizer``,
        ``activations`` (the schedule's peak), ``transient`` (a layer
        rebuilt by recomputation, the logits), ``reserve``.
    breakdown : dict
        Seconds of the iteration by cause, summing to ``iteration_time``:
        ``compute``, ``tp_comm`` (tensor-parallel collectives on the
        critical path), ``bubble`` (pipeline idle time with free
        transfers), ``pp_comm`` (what the point-to-point transfers add),
        ``dp_comm`` (exposed gradient reduction and parameter gathering),
        ``embedding_sync``, ``optimizer``.
    cost_per_million_tokens : float
        US dollars per million tokens at the cluster's price per GPU-hour.
    fits : bool
        Whether every GPU's memory holds its share (``memory_per_gpu`` is
        the fullest one's, relative to its own GPU's memory).
    memory_gpu : str
        The fullest GPU's type.
    memory_capacity : float
        Its memory in bytes.
    pipeline : pipecore.Result
        The simulated pipeline (times in seconds, memory in bytes).
    """

    strategy: Strategy
    global_batch: int
    microbatches: int
    gpus: int
    iteration_time: float
    tokens_per_second: float
    tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    hfu: float
    memory_per_gpu: float
    memory: dict
    breakdown: dict
    cost_per_million_tokens: float
    fits: bool
    pipeline: object = field(repr=False)
    memory_gpu: str = ""
    memory_capacity: float = 0.0


@lru_cache(maxsize=128)
def _schedule(name, p, m, v):
    # Strategies of a search share few pipeline shapes: a schedule is built and
    # compiled once (a Schedule is immutable; simulate keeps its compiled form).
    return build(name, devices=p, microbatches=m, chunks=v if v > 1 else None)


def _architecture(model):
    arch = getattr(model, "architecture", model)
    if arch is None or not hasattr(arch, "activation_bytes_per_layer"):
        raise InputError("estimate needs a model with an architecture: pc.Model.preset(name) or "
                         "pc.Model.transformer(...) (a Model.uniform or hand-built Model has none)")
    return arch


def _placement(cluster, strategy, pool):
    """(ranks of a tp group per node, dp ranks per node, whether stages cross nodes)."""
    per_node = cluster.pools[pool].gpus_per_node
    t = strategy.tp
    if t > per_node and t % per_node:
        raise InputError(f"tp={t} does not fit nodes of {per_node} GPUs (a tensor-parallel group "
                         f"spans whole nodes or part of one)")
    if t <= per_node and per_node % t:
        raise InputError(f"tp={t} does not divide the {per_node} GPUs of a node")
    dp_per_node = max(1, min(strategy.dp, per_node // t))
    stage_ranks = t * strategy.dp
    return dp_per_node, stage_ranks >= per_node, max(1, per_node // stage_ranks)


def _network(cluster, strategy, sched, rank_pool, place, boundary_bytes):
    """The point-to-point network between the pipeline's stages."""
    t = strategy.tp
    stage_pool = [int(rank_pool[devs[0]]) for devs in sched.stage_devices]
    stages = len(stage_pool)
    if len(set(stage_pool)) == 1:
        pl = cluster.pools[stage_pool[0]]
        _, cross_node, stages_per_node = place[stage_pool[0]]
        # Megatron's scatter-gather: with tensor parallelism each rank sends its 1/t of a
        # stage boundary's activation over its own link (an all-gather inside the node rebuilds it).
        nbytes = np.full(stages, boundary_bytes / (t if cross_node and t > 1 else 1))
        if cross_node or strategy.pp == 1:
            return Network.uniform(nbytes, pl.p2p_inter_bandwidth, pl.inter_latency)
        return Network.two_level(nbytes, stages_per_node, pl.p2p_intra_bandwidth, pl.p2p_inter_bandwidth,
                                 pl.intra_latency, pl.inter_latency)
    # Mixed pools: pools sit on different nodes, so every link between stages is treated as
    # inter-node; a link between two pools runs at the slower pool's NIC. A transfer's size is
    # indexed by its sender, which sends both ways: each stage's bytes are scaled to the slower
    # of its two links (conservative on a pool's link next to a boundary).
    bw = np.array([cluster.pools[k].p2p_inter_bandwidth for k in stage_pool])
    link = np.minimum(bw[:-1], bw[1:])
    slowest = np.minimum(np.append(link, np.inf), np.insert(link, 0, np.inf)) if stages > 1 else bw
    ref = float(bw.max())
    nbytes = boundary_bytes / (t if t > 1 else 1) * ref / slowest
    latency = max(cluster.pools[k].inter_latency for k in set(stage_pool))
    return Network.uniform(nbytes, ref, latency)


def estimate(model, cluster, strategy: Strategy, global_batch: int, pool: int = 0,
             reserve: float = RESERVE_BYTES) -> Estimate:
    """Predict one training iteration of ``model`` on ``cluster`` with ``strategy``.

    Parameters
    ----------
    model : Model or Architecture
        A model with its architecture (:meth:`pipecore.Model.preset`,
        :meth:`pipecore.Model.transformer`).
    cluster : pipecore.plan.hardware.Cluster
        Where it runs (:meth:`Cluster.preset`).
    strategy : Strategy
        How it is split.
    global_batch : int
        Sequences per iteration.
    pool : int, default 0
        The cluster's GPU pool the whole run uses.
    reserve : float, default 2e9
        Bytes per GPU a framework takes beside the model (an assumption).

    Returns
    -------
    Estimate

    Raises
    ------
    ValueError
        (:class:`~pipecore.InputError`) if the strategy needs more GPUs
        than the pool has, its degrees do not divide the model or the
        node, or the global batch does not split into microbatches.
    """
    if not isinstance(strategy, Strategy):
        raise InputError(f"estimate 'strategy' must be a pipecore Strategy (got {type(strategy).__name__})")
    arch = _architecture(model)
    if not 0 <= pool < len(cluster.pools):
        raise InputError(f"estimate 'pool' must be 0..{len(cluster.pools) - 1} (got {pool})")
    p, v = strategy.pp, strategy.chunks
    rank_pool = np.array(strategy.pools if strategy.pools is not None else (pool,) * p, dtype=np.int64)
    used = sorted(set(rank_pool.tolist()))
    for k in used:
        if k >= len(cluster.pools):
            raise InputError(f"{strategy.label()}: pool {k} does not exist; the cluster has pools "
                             f"0..{len(cluster.pools) - 1}")
        need = int(np.sum(rank_pool == k)) * strategy.tp * strategy.dp
        have, name = cluster.pools[k].count, cluster.pools[k].gpu.name
        if need > have and strategy.pools is None:
            raise InputError(f"{strategy.label()} needs tp*pp*dp = {need} GPUs; the pool {name} has {have}")
        if need > have:
            raise InputError(f"{strategy.label()} needs {need} GPUs of pool {k} ({name}: tp*dp for each "
                             f"pipeline rank on it); the pool has {have}")
    costmodel.check_layout(arch, strategy)
    m = strategy.microbatches(global_batch)
    stages = p * v
    sched = _schedule(strategy.schedule, p, m, v)
    if len(sched.stage_devices) != stages:
        raise InputError(f"schedule {strategy.schedule!r} with chunks={v} has "
                         f"{len(sched.stage_devices)} stages; the strategy needs pp*chunks = {stages}")
    stage_pool = np.array([rank_pool[devs[0]] for devs in sched.stage_devices], dtype=np.int64)
    for s_, devs in enumerate(sched.stage_devices):
        if len({int(rank_pool[d]) for d in devs}) > 1:
            raise InputError(f"{strategy.label()}: stage {s_} runs on devices {list(devs)} of "
                             f"different pools; a replicated stage needs one GPU type")
    layers = np.array(strategy.layers if strategy.layers is not None else (arch.layers // stages,) * stages,
                      dtype=float)
    place = {k: _placement(cluster, strategy, k) for k in used}
    times = {k: (costmodel.block_times(arch, cluster.pools[k].gpu, cluster, k, strategy),
                 costmodel.embedding_times(arch, cluster.pools[k].gpu, cluster, k, strategy),
                 costmodel.head_times(arch, cluster.pools[k].gpu, cluster, k, strategy)) for k in used}
    kept, transient = costmodel.activation_bytes(arch, strategy)

    def per_layer(attr):
        return np.array([getattr(times[k][0], attr) for k in stage_pool]) * layers

    f, b, w = per_layer("f"), per_layer("b"), per_layer("w")
    tp = per_layer("tp_f") + per_layer("tp_b")
    zero3 = per_layer("dp_f") + per_layer("dp_b")
    params = per_layer("params")
    emb, head = times[int(stage_pool[0])][1], times[int(stage_pool[-1])][2]
    for arr, first, last in ((f, emb.f, head.f), (b, emb.b, head.b), (w, emb.w, head.w),
                             (tp, emb.tp_f + emb.tp_b, head.tp_f + head.tp_b),
                             (params, emb.params, head.params)):
        arr[0] += first
        arr[-1] += last
    t, T, h = strategy.tp, strategy.microbatch_size * arch.seq, arch.hidden
    act = layers * kept
    act_w = np.minimum(act, layers * 32.0 * T * h / t)
    # The first stage keeps its embedding's dropout mask; the last its head's input.
    act[0] += T * h / (t if strategy.sequence_parallel else 1)
    act[-1] += 2.0 * T * h
    act_w = np.minimum(act_w, act)
    h_model = arch.hidden
    if arch.tied_embeddings and set(sched.stage_devices[0]) & set(sched.stage_devices[-1]):
        # The head shares the embedding's table on a device that holds both.
        params[-1] -= arch.vocab * h_model / strategy.tp
    # Unfused gradient accumulation: a pass over each stage's gradients per microbatch.
    tensors = layers * costmodel.BLOCK_PARAM_TENSORS
    tensors[0] += 2  # word and position embeddings
    tensors[-1] += 3  # the head's table and the final norm
    for k in used:
        sel = stage_pool == k
        gpu_k = cluster.pools[k].gpu
        w[sel] += costmodel.grad_accumulation_time(gpu_k, strategy, params[sel], tensors[sel], m)
    weight_bytes = params * (PARAM_BYTES + GRAD_BYTES + OPTIMIZER_BYTES)
    costs = Costs(f=f, b=b, w=w, activation=act, activation_w=act_w, weights=weight_bytes)
    # Megatron's scatter-gather: with tensor parallelism each rank sends its 1/t of a
    # stage boundary's activation over its own link (an all-gather inside the node rebuilds it).
    # A pipeline over several pools is costed at its slowest pool's links, all across nodes.
    if len(used) == 1:
        comm_pool, (_, cross_node, stages_per_node) = used[0], place[used[0]]
    else:
        comm_pool = min(used, key=lambda k: cluster.pools[k].p2p_inter_bandwidth)
        cross_node, stages_per_node = True, 1
    f_comm, b_comm = costmodel.pipeline_comm(cluster, comm_pool, strategy,
                                             [devs[0] for devs in sched.stage_devices],
                                             T * h * 2.0, cross_node, stages_per_node)
    comm_costs = replace(costs, f=f + f_comm, b=b + b_comm)
    if not strategy.p2p_overlap:
        res = simulate(sched, comm_costs)  # blocking exchanges are folded into the ops
    else:
        res = simulate(sched, comm_costs, _network(cluster, strategy, sched, rank_pool, place, T * h * 2.0))
    free = simulate(sched, costs)

    # After the pipeline: each device reduces its gradients once its last backward is done.
    ops = res.ops
    dev = ops.column("device").to_numpy()
    fin = ops.column("finish").to_numpy()
    last = np.zeros(p)
    np.maximum.at(last, dev, fin)
    pairs = [(stage, d) for stage, devices in enumerate(sched.stage_devices) for d in devices]
    stage_of, device_of = (np.array(x, dtype=np.int64) for x in zip(*pairs))

    def per_device(values):
        """Sum a per-stage quantity over the stages each device holds."""
        return np.bincount(device_of, weights=np.asarray(values, dtype=float)[stage_of], minlength=p)

    dev_params = per_device(params)
    grad_bytes = 4 if strategy.precision == "bf16" else 2
    dp = strategy.dp
    reduce_kind = "all-reduce" if strategy.zero == 0 else "reduce-scatter"

    def on_pools(fn):
        """A per-device quantity, each device's from its own pool."""
        out = np.zeros(p)
        for k in used:
            sel = rank_pool == k
            out[sel] = np.asarray(fn(k, sel), dtype=float)
        return out

    dp_time = on_pools(lambda k, sel: cluster.collective_time(reduce_kind, dev_params[sel] * grad_bytes, dp,
                                                              place[k][0], k))
    gather = np.zeros(p)
    if strategy.zero == 3:
        # The blocks' gradients were reduce-scattered after each backward and their
        # parameters are gathered before each use (costmodel.zero3_collectives):
        # only the embedding's and head's remain for the end of the pipeline.
        blocks = per_device(per_layer("params"))
        dp_time = dp_time * np.clip(1.0 - blocks / np.maximum(dev_params, 1e-300), 0.0, 1.0)
    if 1 <= strategy.zero <= 2 and dp > 1:
        gather = on_pools(lambda k, sel: cluster.collective_time("all-gather", dev_params[sel] * PARAM_BYTES,
                                                                 dp, place[k][0], k))
    if strategy.dp_overlap:
        # Buckets reduce while the last microbatch's backward runs on that device.
        window = per_device(b + w)
        exposed = np.maximum(dp_time - window, 0.0)
    else:
        exposed = dp_time
    end = last + exposed
    crit = int(np.argmax(end))
    makespan = float(res.makespan)
    dp_exposed = float(end.max()) - makespan
    emb_sync = 0.0
    if arch.tied_embeddings and p > 1:
        # First and last stage: on two nodes when stages span nodes or pools, else in one.
        k0, k1 = int(stage_pool[0]), int(stage_pool[-1])
        nbytes = arch.vocab * h / t * grad_bytes
        if k0 == k1:
            emb_sync = float(cluster.collective_time("all-reduce", nbytes, 2, 1 if place[k0][1] else 2, k0))
        else:
            # Two ranks on two pools' NICs: a ring all-reduce of 2 ranks moves the buffer
            # once each way, at the slower NIC.
            ends = (cluster.pools[k0], cluster.pools[k1])
            emb_sync = max(e.inter_latency for e in ends) + nbytes / min(e.inter_bus_bandwidth for e in ends)
    shard = dp if strategy.zero >= 1 else 1
    step_bytes = STEP_BYTES + (FP16_STEP_BYTES if strategy.precision == "fp16" else 0)
    step = float(np.max(on_pools(lambda k, sel: cluster.pools[k].gpu.memory_time(
        dev_params[sel] / shard * step_bytes))))
    gather_exposed = float(gather.max()) if not strategy.dp_overlap else 0.0
    iteration = makespan + dp_exposed + emb_sync + step + gather_exposed

    tp_dev = per_device(tp * m)
    zero_dev = per_device(zero3 * m)
    busy = float(free.busy[crit])  # compute only: pipeline traffic is in pp_comm
    breakdown = {"compute": busy - float(tp_dev[crit]) - float(zero_dev[crit]),
                 "tp_comm": float(tp_dev[crit]),
                 "bubble": float(free.makespan) - busy, "pp_comm": makespan - float(free.makespan),
                 "dp_comm": dp_exposed + gather_exposed + float(zero_dev[crit]), "embedding_sync": emb_sync,
                 "optimizer": step}

    # Memory of each device against its own GPU's; the fullest (largest share) is reported.
    z = strategy.zero
    per_param = {"params": PARAM_BYTES / (dp if z >= 3 else 1),
                 "grads": GRAD_BYTES / (dp if z >= 2 else 1),
                 "optimizer": OPTIMIZER_BYTES / (dp if z >= 1 else 1)}
    act_peak = np.asarray(res.peak_activation, dtype=float)
    extra = np.full(p, transient)
    last_dev = sched.stage_devices[-1][0]
    extra[last_dev] += 2 * 4.0 * T * arch.vocab / t  # fp32 logits and their gradient
    totals = dev_params * sum(per_param.values()) + act_peak + extra + reserve
    hbm = np.array([cluster.pools[k].gpu.hbm_bytes for k in rank_pool])
    full = int(np.argmax(totals / hbm))
    memory = {k: float(dev_params[full] * v) for k, v in per_param.items()}
    memory.update(activations=float(act_peak[full]), transient=float(extra[full]), reserve=float(reserve))

    gpus = strategy.gpus
    tokens = global_batch * arch.seq
    model_flops = arch.flops_per_iteration(global_batch, recompute="none")
    hw_flops = arch.flops_per_iteration(global_batch, recompute=strategy.recompute)
    tflops = model_flops / iteration / gpus / 1e12
    hw_tflops = hw_flops / iteration / gpus / 1e12
    # A mixed run's peak is its GPUs' mean peak; its price the sum over its GPUs.
    per_rank = t * dp
    peak = per_rank * sum(cluster.pools[k].gpu.peak_flops for k in rank_pool) / gpus
    price = per_rank * sum(cluster.pools[k].price_per_gpu_hour for k in rank_pool) * iteration / 3600.0
    return Estimate(strategy=strategy, global_batch=int(global_batch), microbatches=m, gpus=gpus,
                    iteration_time=iteration, tokens_per_second=tokens / iteration,
                    tflops_per_gpu=tflops, hardware_tflops_per_gpu=hw_tflops,
                    mfu=tflops * 1e12 / peak, hfu=hw_tflops * 1e12 / peak,
                    memory_per_gpu=float(totals[full]), memory=memory, breakdown=breakdown,
                    cost_per_million_tokens=price / tokens * 1e6,
                    fits=bool(np.all(totals <= hbm)), pipeline=res,
                    memory_gpu=cluster.pools[int(rank_pool[full])].gpu.name, memory_capacity=float(hbm[full]))


def why_not_ranked(est, max_iteration_time=None):
    """Why an estimated strategy is left out of the ranking, or None.

    Parameters
    ----------
    est : Estimate
    max_iteration_time : float, optional
        Seconds per iteration above which a strategy is not ranked.

    Returns
    -------
    str or None
        Its memory against its fullest GPU's, or its time against the bound.
    """
    if not est.fits:
        return (f"needs {est.memory_per_gpu / 1e9:.1f} GB per GPU; "
                f"{est.memory_gpu} has {est.memory_capacity / 1e9:.0f} GB")
    if max_iteration_time is not None and est.iteration_time > max_iteration_time:
        return f"{est.iteration_time:.2f} s per iteration > max_iteration_time {max_iteration_time} s"
    return None

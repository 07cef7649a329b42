"""Every strategy for a model, a cluster and a global batch, estimated and ranked.

The space is declared, not sampled: tensor-parallel degrees that divide a
node and the model's heads, pipeline degrees that divide the layers and the
GPUs, the data-parallel degree that uses every GPU of the pool, microbatch
sizes that split the batch, each schedule with the chunk counts it takes,
recomputation, ZeRO and sequence parallelism. Each strategy is estimated
in full (:func:`pipecore.estimate`: its pipeline simulated); a strategy
that cannot run keeps its row with the reason.
"""

from __future__ import annotations

import functools
import itertools
import math
import time
from dataclasses import dataclass, field, replace

import pyarrow as pa

from ..core.ops import InputError
from . import layout
from .estimate import Estimate, _schedule, estimate, why_not_ranked
from .strategy import RECOMPUTE, Strategy

OBJECTIVES = ("time", "cost")
DEFAULT_SCHEDULES = ("1f1b", "interleaved-1f1b", "zb-h1")
DEFAULT_MICROBATCH_SIZES = (1, 2, 4, 8, 16)
DEFAULT_CHUNKS = (2, 3, 4)

_COLUMNS = ("rank", "strategy", "gpus", "pools", "layers", "tp", "pp", "dp", "microbatch_size",
            "microbatches", "schedule", "chunks", "recompute", "sequence_parallel", "zero", "iteration_time",
            "tokens_per_second", "tflops_per_gpu", "mfu", "memory_per_gpu", "cost_per_million_tokens", "fits",
            "why")


@dataclass
class Strategies:
    """The ranked result of :func:`strategies`.

    Attributes
    ----------
    table : pyarrow.Table
        One row per strategy of the space: ``rank`` (1 = best; null for a
        strategy that cannot run, does not fit or breaks the time bound),
        ``strategy`` (:meth:`Strategy.label`), ``gpus``, ``pools`` (GPUs
        used of each pool, e.g. ``a100-sxm4-80gb 64 + h100-sxm5-80gb 32``),
        ``layers`` (per stage, comma-separated; null for an even split),
        its degrees and settings,
        ``iteration_time`` (s, lower is faster),
        ``tokens_per_second``, ``tflops_per_gpu`` (model FLOP/s, TFLOP/s),
        ``mfu`` (0-1), ``memory_per_gpu`` (bytes), ``cost_per_million_tokens``
        (USD), ``fits`` and ``why`` (null, or why the row is not ranked).
    best : Estimate or None
        The best ranked strategy's estimate; None when none qualifies.
    objective : str
    estimated : int
        Strategies whose pipeline was simulated.
    seconds : float
        Wall time of the search.
    """

    table: pa.Table
    best: Estimate | None
    objective: str
    estimated: int
    seconds: float
    estimates: dict = field(default_factory=dict, repr=False)

    def rank_of(self, strategy, model, cluster, global_batch: int, pool: int = 0,
                max_iteration_time: float | None = None):
        """Where ``strategy`` ranks among these strategies, searched or not.

        A strategy of the searched space takes its rank (or its reason for
        having none) from ``table``; any other is estimated and placed
        where the search's order (the objective, then memory per GPU) puts
        it, saying which of its settings the space did not hold.

        Parameters
        ----------
        strategy : Strategy
            E.g. ``pipecore.plan.ranking.parse_strategy("tp=8,pp=8,mb=1,sp,zero=1", gpus)``.
        model, cluster, global_batch, pool, max_iteration_time
            As given to :func:`strategies` for this search.

        Returns
        -------
        pipecore.plan.ranking.Ranking
            ``rank`` (or the rank it would take), ``estimate``, ``why`` it
            has no rank, ``in_space``, ``outside``; ``describe()`` says it
            in one sentence.

        Raises
        ------
        ValueError
            (:class:`~pipecore.InputError`) if ``strategy`` is not a
            Strategy, or the model, cluster or batch are not the search's.
        """
        from .ranking import rank_of

        return rank_of(self, strategy, model, cluster, global_batch, pool, max_iteration_time)


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def _pools_text(cluster, s, pool):
    """GPUs of each pool a strategy uses, e.g. ``a100-sxm4-80gb 256 + h100-sxm5-80gb 128``."""
    ranks = s.pools if s.pools is not None else (pool or 0,) * s.pp
    counts = {}
    for k in ranks:
        counts[k] = counts.get(k, 0) + s.tp * s.dp
    return " + ".join(f"{cluster.pools[k].gpu.name} {n}" for k, n in counts.items())


def _values(name, value):
    """A setting's values: one value or a non-empty sequence of them."""
    values = (value,) if isinstance(value, (str, bool, int)) else tuple(value)
    if not values:
        raise InputError(f"strategies '{name}' is empty: give at least one value")
    return values


def _layouts(arch, cluster, pool):
    """(tp, pp, pool of each pipeline rank or None, dp) of the space."""
    pools = range(len(cluster.pools)) if pool is None else (pool,)
    per_node = math.gcd(*(cluster.pools[k].gpus_per_node for k in pools))
    for tp in _divisors(per_node):
        if arch.heads % tp or arch.kv_heads % tp or arch.ffn_hidden % tp:
            continue
        for k in pools:
            gpus = cluster.pools[k].count
            for pp in _divisors(arch.layers):
                if gpus % (tp * pp) == 0:
                    yield tp, pp, (None if len(pools) == 1 else (k,) * pp), gpus // (tp * pp)
        if len(pools) > 1:
            for ranks, dp in layout.spanning(cluster, tp, arch.layers):
                yield tp, len(ranks), ranks, dp


def _pipelines(arch, pp, m, schedules, chunks):
    """(schedule, chunks) pairs for ``pp`` ranks and ``m`` microbatches."""
    from ..schedules.registry import family

    for name in schedules:
        if not family(name).chunks:
            yield name, 1
        elif pp > 1 and m % pp == 0:  # interleaving needs whole rounds of pp microbatches
            yield from ((name, c) for c in chunks if arch.layers % (pp * c) == 0)


def space(model, cluster, global_batch: int, pool: int | None = None, schedules=DEFAULT_SCHEDULES,
          microbatch_sizes=DEFAULT_MICROBATCH_SIZES, chunks=DEFAULT_CHUNKS, recompute=RECOMPUTE,
          zero=(0, 1, 2, 3), sequence_parallel=(False, True), attention="flash", precision="bf16",
          dp_overlap=True, p2p_overlap=True, grad_accumulation_fusion=True) -> list[Strategy]:
    """The strategies :func:`strategies` estimates, in a fixed order.

    Parameters
    ----------
    model, cluster, global_batch, pool
        As :func:`strategies`.
    schedules, microbatch_sizes, chunks, recompute, zero, sequence_parallel
        The values of each setting to try (``chunks`` for schedules that take
        several; a schedule without chunks runs with 1).
    attention : str or sequence of str, default "flash"
        The attention kernels (``"flash"``, ``"unfused"``). With
        FlashAttention, selective recomputation changes nothing (no ``s^2``
        tensor is kept) and is left out of the space.
    precision : str or sequence of str, default "bf16"
        ``"bf16"``, ``"fp16"``.
    dp_overlap : bool or sequence of bool, default True
        Whether the gradient reduction overlaps the last backward.
    p2p_overlap, grad_accumulation_fusion : bool or sequence of bool, default True
        As :class:`pipecore.Strategy` (False: Megatron-LM's 2021 behaviour).

    Returns
    -------
    list of Strategy
        Every combination whose degrees divide the node, the model and the
        GPUs and whose microbatches split the global batch, using every GPU
        of the pools it runs on. On a cluster of several pools: each pool
        alone (as on one pool), and pipelines spanning every pool, each
        pipeline rank's GPUs from one pool, the pools in contiguous blocks
        in every order (:func:`pipecore.plan.layout.spanning`), with the
        layers balanced to each stage's speed
        (:func:`pipecore.plan.layout.balance`).

    Raises
    ------
    ValueError
        If a setting's values are empty or malformed.
    """
    arch = getattr(model, "architecture", model)
    named = {"schedules": schedules, "microbatch_sizes": microbatch_sizes, "chunks": chunks,
             "recompute": recompute, "zero": zero, "sequence_parallel": sequence_parallel,
             "attention": attention, "precision": precision, "dp_overlap": dp_overlap,
             "p2p_overlap": p2p_overlap, "grad_accumulation_fusion": grad_accumulation_fusion}
    v = {name: _values(name, value) for name, value in named.items()}
    if pool is not None and not 0 <= pool < len(cluster.pools):
        raise InputError(f"strategies 'pool' must be 0..{len(cluster.pools) - 1} (got {pool})")
    if pool is None and len(cluster.pools) == 1:
        pool = 0
    out = []
    for tp, pp, ranks, dp in _layouts(arch, cluster, pool):
        for mb in v["microbatch_sizes"]:
            if global_batch % (mb * dp):
                continue
            m = global_batch // (mb * dp)
            for name, c in _pipelines(arch, pp, m, v["schedules"], v["chunks"]):
                for rc, att, z, sp, prec, overlap, p2p, fusion in itertools.product(
                        v["recompute"], v["attention"], v["zero"], v["sequence_parallel"], v["precision"],
                        v["dp_overlap"], v["p2p_overlap"], v["grad_accumulation_fusion"]):
                    if rc == "selective" and att == "flash":
                        continue  # FlashAttention keeps no s^2 tensor: selective = none
                    if (z and dp == 1) or (sp and tp == 1):
                        continue  # the same strategy as zero=0 / sequence_parallel=False
                    s = Strategy(tp=tp, pp=pp, dp=dp, microbatch_size=mb, schedule=name, chunks=c,
                                 recompute=rc, sequence_parallel=sp, zero=z, dp_overlap=overlap,
                                 attention=att, precision=prec, pools=ranks, p2p_overlap=p2p,
                                 grad_accumulation_fusion=fusion)
                    if ranks is not None and len(set(ranks)) > 1:
                        devices = _schedule(name, pp, m, c).stage_devices
                        stage_pools = [ranks[d[0]] for d in devices]
                        s = replace(s, layers=layout.balanced_layers(arch, cluster, s, stage_pools))
                    out.append(s)
    return out


def _row(s, model, cluster, global_batch, pool, max_iteration_time):
    """One strategy's table row (without its rank) and its Estimate (None if it cannot run)."""
    row = {"strategy": s.label(), "gpus": s.gpus, "pools": _pools_text(cluster, s, pool),
           "layers": None if s.layers is None else ",".join(map(str, s.layers)),
           "tp": s.tp, "pp": s.pp, "dp": s.dp,
           "microbatch_size": s.microbatch_size,
           "microbatches": global_batch // (s.microbatch_size * s.dp), "schedule": s.schedule,
           "chunks": s.chunks, "recompute": s.recompute, "sequence_parallel": s.sequence_parallel,
           "zero": s.zero}
    try:
        est = estimate(model, cluster, s, global_batch, pool=pool or 0)
    except InputError as exc:
        row.update(iteration_time=math.nan, tokens_per_second=math.nan, tflops_per_gpu=math.nan,
                   mfu=math.nan, memory_per_gpu=math.nan, cost_per_million_tokens=math.nan,
                   fits=False, why=str(exc))
        return row, None
    why = why_not_ranked(est, max_iteration_time)
    row.update(iteration_time=est.iteration_time, tokens_per_second=est.tokens_per_second,
               tflops_per_gpu=est.tflops_per_gpu, mfu=est.mfu, memory_per_gpu=est.memory_per_gpu,
               cost_per_million_tokens=est.cost_per_million_tokens, fits=est.fits, why=why)
    return row, est


def strategies(model, cluster, global_batch: int, objective: str = "time",
               max_iteration_time: float | None = None, pool: int | None = None, progress=None,
               ray: bool = False, address: str | None = None, **space_options) -> Strategies:
    """Estimate every strategy of the declared space and rank them.

    Parameters
    ----------
    model : Model or Architecture
        With its architecture (:meth:`pipecore.Model.preset`).
    cluster : pipecore.Cluster
    global_batch : int
        Sequences per iteration.
    objective : {"time", "cost"}, default "time"
        Rank by iteration time, or by cost per million tokens.
    max_iteration_time : float, optional
        Seconds; strategies slower than this are not ranked (with
        ``objective="cost"``, the time bound of the cheapest plan).
    pool : int, optional
        The cluster's pool to use (all of its GPUs). None: the only pool of
        a one-pool cluster; on several pools, plans on each pool alone and
        plans whose pipeline spans pools (see ``pipecore.plan.search.space``).
    progress : callable, optional
        Called as ``progress(done, total)`` after each strategy (with
        ``ray``: as each task's strategies come back).
    ray : bool, default False
        Estimate the strategies as Ray tasks (the ``pipecore[ray]`` extra),
        a few consecutive ones per task; the result is the same as without.
    address : str, optional
        With ``ray``: a running Ray cluster's address (``"auto"`` finds one
        on this machine); by default a local Ray instance is started for
        this call and shut down after it. A Ray already initialised in this
        process is used as it is. On a cluster, every node needs pipecore.
    **space_options
        ``schedules``, ``microbatch_sizes``, ``chunks``, ``recompute``,
        ``zero``, ``sequence_parallel``, ``attention``, ``precision``,
        ``dp_overlap``, ``p2p_overlap``, ``grad_accumulation_fusion``: see
        ``pipecore.plan.search.space``.

    Returns
    -------
    Strategies

    Raises
    ------
    ValueError
        For an unknown objective, a bad bound or a bad pool, an ``address``
        without ``ray``, or ``ray`` without Ray installed.
    ray.exceptions.RayError
        With ``ray``: if Ray cannot start or connect, or a task fails.
    """
    if objective not in OBJECTIVES:
        raise InputError(f"strategies 'objective' must be one of {', '.join(OBJECTIVES)} "
                         f"(got {objective!r})")
    if max_iteration_time is not None and not (isinstance(max_iteration_time, (int, float))
                                               and max_iteration_time > 0):
        raise InputError(f"strategies 'max_iteration_time' must be seconds > 0 (got {max_iteration_time!r})")
    priced = range(len(cluster.pools)) if pool is None else (pool,)
    unpriced = [cluster.pools[k].gpu.name for k in priced if math.isnan(cluster.pools[k].price_per_gpu_hour)]
    if objective == "cost" and unpriced:
        raise InputError(f"strategies objective='cost' needs a price: {cluster.name}'s price_per_gpu_hour is "
                         f"not given for {', '.join(unpriced)} (NaN; pipecore calibrate --price-per-gpu-hour "
                         f"USD sets one)")
    if address is not None and not ray:
        raise InputError(f"strategies 'address' {address!r} is a Ray cluster's address: pass ray=True "
                         f"(--ray) too")
    if ray:
        from ..core.raysession import import_ray, missing_ray

        ray_module = import_ray(InputError(missing_ray("a search on Ray (ray=True, --ray)",
                                                       "search without it")))
    start = time.perf_counter()
    candidates = space(model, cluster, global_batch, pool, **space_options)
    if ray:
        from .ray import estimate_all

        row = functools.partial(_row, model=model, cluster=cluster, global_batch=global_batch, pool=pool,
                                max_iteration_time=max_iteration_time)
        rows, estimates = estimate_all(ray_module, address, row, candidates, progress)
    else:
        rows, estimates = [], {}
        for i, s in enumerate(candidates):
            row, est = _row(s, model, cluster, global_batch, pool, max_iteration_time)
            rows.append(row)
            if est is not None:
                estimates[i] = est
            if progress is not None:
                progress(i + 1, len(candidates))
    key = "iteration_time" if objective == "time" else "cost_per_million_tokens"
    ranked = sorted((i for i, r in enumerate(rows) if r["why"] is None),
                    key=lambda i: (rows[i][key], rows[i]["memory_per_gpu"], i))
    for r in rows:
        r["rank"] = None
    for n, i in enumerate(ranked, 1):
        rows[i]["rank"] = n
    order = ranked + [i for i, r in enumerate(rows) if r["why"] is not None]
    table = pa.Table.from_pylist([{c: rows[i][c] for c in _COLUMNS} for i in order])
    if table.num_rows and pa.types.is_null(table.schema.field("layers").type):
        table = table.set_column(table.schema.get_field_index("layers"), "layers",
                                 table.column("layers").cast(pa.string()))
    best = estimates[ranked[0]] if ranked else None
    return Strategies(table=table, best=best, objective=objective, estimated=len(estimates),
                      seconds=time.perf_counter() - start, estimates=estimates)

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

import math
import time
from dataclasses import dataclass, field

import pyarrow as pa

from ..core.ops import InputError
from .estimate import Estimate, estimate
from .strategy import RECOMPUTE, Strategy

OBJECTIVES = ("time", "cost")
DEFAULT_SCHEDULES = ("1f1b", "interleaved-1f1b", "zb-h1")
DEFAULT_MICROBATCH_SIZES = (1, 2, 4, 8)
DEFAULT_CHUNKS = (2, 3, 4)

_COLUMNS = ("rank", "strategy", "tp", "pp", "dp", "microbatch_size", "microbatches", "schedule", "chunks",
            "recompute", "sequence_parallel", "zero", "iteration_time", "tokens_per_second",
            "tflops_per_gpu", "mfu", "memory_per_gpu", "cost_per_million_tokens", "fits", "why")


@dataclass
class Strategies:
    """The ranked result of :func:`strategies`.

    Attributes
    ----------
    table : pyarrow.Table
        One row per strategy of the space: ``rank`` (1 = best; null for a
        strategy that cannot run, does not fit or breaks the time bound),
        ``strategy`` (:meth:`Strategy.label`), its degrees and settings,
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


def _divisors(n):
    return [d for d in range(1, n + 1) if n % d == 0]


def space(model, cluster, global_batch: int, pool: int = 0, schedules=DEFAULT_SCHEDULES,
          microbatch_sizes=DEFAULT_MICROBATCH_SIZES, chunks=DEFAULT_CHUNKS, recompute=RECOMPUTE,
          zero=(0, 1, 2, 3), sequence_parallel=(False, True),
          attention="flash") -> list[Strategy]:
    """The strategies :func:`strategies` estimates, in a fixed order.

    Parameters
    ----------
    model, cluster, global_batch, pool
        As :func:`strategies`.
    schedules, microbatch_sizes, chunks, recompute, zero, sequence_parallel
        The values of each setting to try (``chunks`` for schedules that take
        several; a schedule without chunks runs with 1).
    attention : {"flash", "unfused"}, default "flash"
        The attention kernels every strategy uses. With FlashAttention,
        selective recomputation changes nothing (no ``s^2`` tensor is kept)
        and is left out of the space.

    Returns
    -------
    list of Strategy
        Every combination whose degrees divide the node, the model and the
        GPUs and whose microbatches split the global batch.

    Raises
    ------
    ValueError
        If a setting's values are empty or malformed.
    """
    from ..schedules.registry import family

    arch = getattr(model, "architecture", model)
    pl = cluster.pools[pool]
    gpus, per_node = pl.count, pl.gpus_per_node
    for name, values in (("schedules", schedules), ("microbatch_sizes", microbatch_sizes),
                         ("recompute", recompute), ("zero", zero),
                         ("sequence_parallel", sequence_parallel)):
        if len(tuple(values)) == 0:
            raise InputError(f"strategies '{name}' is empty: give at least one value")
    out = []
    for tp in _divisors(per_node):
        if arch.heads % tp or arch.kv_heads % tp or arch.ffn_hidden % tp:
            continue
        for pp in _divisors(arch.layers):
            if gpus % (tp * pp):
                continue
            dp = gpus // (tp * pp)
            for mb in microbatch_sizes:
                if global_batch % (mb * dp):
                    continue
                m = global_batch // (mb * dp)
                for name in schedules:
                    fam = family(name)
                    options = [c for c in chunks if arch.layers % (pp * c) == 0] if fam.chunks else [1]
                    if fam.chunks and pp == 1:
                        continue
                    for c in options:
                        if fam.chunks and m % pp:
                            continue  # interleaving needs whole rounds of pp microbatches
                        for rc in recompute:
                            if rc == "selective" and attention == "flash":
                                continue  # FlashAttention keeps no s^2 tensor: selective = none
                            for z in zero:
                                if z and dp == 1:
                                    continue
                                for sp in sequence_parallel:
                                    if sp and tp == 1:
                                        continue
                                    out.append(Strategy(tp=tp, pp=pp, dp=dp, microbatch_size=mb,
                                                        schedule=name, chunks=c, recompute=rc,
                                                        sequence_parallel=sp, zero=z, dp_overlap=True,
                                                        attention=attention))
    return out


def strategies(model, cluster, global_batch: int, objective: str = "time",
               max_iteration_time: float | None = None, pool: int = 0, progress=None,
               **space_options) -> Strategies:
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
    pool : int, default 0
        The cluster's pool to use (all of its GPUs).
    progress : callable, optional
        Called as ``progress(done, total)`` after each strategy.
    **space_options
        ``schedules``, ``microbatch_sizes``, ``chunks``, ``recompute``,
        ``zero``, ``sequence_parallel``, ``attention``: see
        ``pipecore.plan.search.space``.

    Returns
    -------
    Strategies

    Raises
    ------
    ValueError
        For an unknown objective, a bad bound or a bad pool.
    """
    if objective not in OBJECTIVES:
        raise InputError(f"strategies 'objective' must be one of {', '.join(OBJECTIVES)} "
                         f"(got {objective!r})")
    if max_iteration_time is not None and not (isinstance(max_iteration_time, (int, float))
                                               and max_iteration_time > 0):
        raise InputError(f"strategies 'max_iteration_time' must be seconds > 0 (got {max_iteration_time!r})")
    if not 0 <= pool < len(cluster.pools):
        raise InputError(f"strategies 'pool' must be 0..{len(cluster.pools) - 1} (got {pool})")
    if objective == "cost" and math.isnan(cluster.pools[pool].price_per_gpu_hour):
        raise InputError(f"strategies objective='cost' needs a price: {cluster.name}'s price_per_gpu_hour is "
                         f"not given (NaN; pipecore calibrate --price-per-gpu-hour USD sets one)")
    start = time.perf_counter()
    candidates = space(model, cluster, global_batch, pool, **space_options)
    rows, estimates = [], {}
    key = "iteration_time" if objective == "time" else "cost_per_million_tokens"
    for i, s in enumerate(candidates):
        row = {"strategy": s.label(), "tp": s.tp, "pp": s.pp, "dp": s.dp,
               "microbatch_size": s.microbatch_size,
               "microbatches": global_batch // (s.microbatch_size * s.dp), "schedule": s.schedule,
               "chunks": s.chunks, "recompute": s.recompute, "sequence_parallel": s.sequence_parallel,
               "zero": s.zero}
        try:
            est = estimate(model, cluster, s, global_batch, pool=pool)
        except InputError as exc:
            row.update(iteration_time=math.nan, tokens_per_second=math.nan, tflops_per_gpu=math.nan,
                       mfu=math.nan, memory_per_gpu=math.nan, cost_per_million_tokens=math.nan,
                       fits=False, why=str(exc))
        else:
            why = None
            if not est.fits:
                why = (f"needs {est.memory_per_gpu / 1e9:.1f} GB per GPU; "
                       f"{cluster.pools[pool].gpu.name} has {cluster.pools[pool].gpu.hbm_bytes / 1e9:.0f} GB")
            elif max_iteration_time is not None and est.iteration_time > max_iteration_time:
                why = f"{est.iteration_time:.2f} s per iteration > max_iteration_time {max_iteration_time} s"
            row.update(iteration_time=est.iteration_time, tokens_per_second=est.tokens_per_second,
                       tflops_per_gpu=est.tflops_per_gpu, mfu=est.mfu, memory_per_gpu=est.memory_per_gpu,
                       cost_per_million_tokens=est.cost_per_million_tokens, fits=est.fits, why=why)
            estimates[i] = est
        rows.append(row)
        if progress is not None:
            progress(i + 1, len(candidates))
    ranked = sorted((i for i, r in enumerate(rows) if r["why"] is None),
                    key=lambda i: (rows[i][key], rows[i]["memory_per_gpu"], i))
    for r in rows:
        r["rank"] = None
    for n, i in enumerate(ranked, 1):
        rows[i]["rank"] = n
    order = ranked + [i for i, r in enumerate(rows) if r["why"] is not None]
    table = pa.Table.from_pylist([{c: rows[i][c] for c in _COLUMNS} for i in order])
    best = estimates[ranked[0]] if ranked else None
    return Strategies(table=table, best=best, objective=objective, estimated=len(estimates),
                      seconds=time.perf_counter() - start, estimates=estimates)

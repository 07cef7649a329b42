"""pipecore's predictions beside published measured runs.

Each published run (:func:`pipecore.plan.published.published_runs`) is
estimated with its own configuration on the cluster it ran on, and its
throughput compared in the run's own FLOP counting (Megatron SC21's eq. 3
counts recomputation; an MFU figure does not). Nothing here is fitted:
the hardware constants come from hardware measurements
(:mod:`pipecore.plan.hardware`), and these rows only check them.
"""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa

from ..analysis.architecture import Architecture
from ..core.ops import InputError
from .estimate import estimate
from .hardware import Cluster
from .published import published_runs
from .strategy import Strategy

# The cluster each published GPU ran on (8 GPUs a node, NVLink inside, one InfiniBand
# NIC per GPU: Selene's DGX A100 nodes for SC21, BLOOM's Jean Zay A100 nodes). A GPU
# named without its variant ("h100") has no preset: the run is left out, saying so.
CLUSTERS = {"a100-sxm4-80gb": "dgx-a100", "h100-sxm5-80gb": "dgx-h100"}
# Runs that predate FlashAttention in their framework ran unfused attention kernels:
# Megatron-LM in 2021 (SC21) and Megatron-DeepSpeed for BLOOM (2022).
UNFUSED_RUNS = ("megatron-sc21-", "bloom-")
# Megatron-LM as the SC21 runs used it (the code of commit 50a4b5fa02, 2021-04-08, which
# published Table 1): pipeline exchanges that block both GPUs (req.wait() then
# torch.cuda.synchronize() in p2p_communication.py) and gradient accumulation by
# PyTorch's AccumulateGrad (gradient-accumulation fusion arrived in Feb 2022).
MEGATRON_2021_RUNS = ("megatron-sc21-",)


def check_published(role: str | None = "validation") -> pa.Table:
    """Predict every published run of ``role`` and set it beside its measurement.

    Parameters
    ----------
    role : {"validation", "held-back"} or None, default "validation"
        Which runs; None for all.

    Returns
    -------
    pyarrow.Table
        One row per run: ``id``, ``gpus``, ``strategy`` (its label),
        ``measured_tflops`` and ``predicted_tflops`` (TFLOP/s per GPU, in
        the run's own FLOP counting, higher is faster),
        ``measured_iteration_time`` and ``predicted_iteration_time``
        (seconds; the measured one derived from its TFLOP/s when the
        source gives none), ``error`` (predicted / measured throughput - 1:
        positive means pipecore predicts the run faster than it was),
        ``memory_gb`` (predicted bytes per GPU / 1e9) and ``note``
        (placeholders the source leaves unpublished, or why a run was
        left out).
    """
    rows = []
    for run in published_runs(role):
        row = {"id": run.id, "gpus": run.gpus, "strategy": "", "measured_tflops": run.measured_tflops_per_gpu,
               "predicted_tflops": math.nan, "measured_iteration_time": math.nan,
               "predicted_iteration_time": math.nan, "error": math.nan, "memory_gb": math.nan,
               "note": ("unpublished: " + ", ".join(run.unpublished)) if run.unpublished else ""}
        cluster_name = CLUSTERS.get(run.gpu.strip().lower())
        why = []
        if cluster_name is None:
            why.append(f"no cluster preset for GPU {run.gpu!r}")
        if run.precision not in ("bf16", "fp16"):
            why.append(f"precision {run.precision!r} is not modelled")
        if run.unpublished:
            why.append("unpublished: " + ", ".join(run.unpublished))
        if cluster_name is None or run.precision not in ("bf16", "fp16"):
            row["note"] = "left out: " + "; ".join(why)
            rows.append(row)
            continue
        m = run.model
        arch = Architecture(layers=m.layers, hidden=m.hidden, heads=m.heads, seq=m.seq, vocab=m.vocab,
                            ffn_hidden=m.ffn_hidden, kv_heads=m.kv_heads, gated_mlp=m.gated_mlp,
                            name=run.id)
        strategy = Strategy(tp=run.tp, pp=run.pp, dp=run.dp, microbatch_size=run.microbatch_size,
                            schedule=run.schedule, chunks=run.chunks, recompute=run.recompute,
                            sequence_parallel=run.sequence_parallel, zero=run.zero,
                            dp_overlap=run.dp_overlap, precision=run.precision,
                            attention="unfused" if run.id.startswith(UNFUSED_RUNS) else "flash",
                            p2p_overlap=not run.id.startswith(MEGATRON_2021_RUNS),
                            grad_accumulation_fusion=not run.id.startswith(MEGATRON_2021_RUNS))
        nodes = -(-run.gpus // run.gpus_per_node)
        try:
            est = estimate(arch, Cluster.preset(cluster_name, nodes=nodes), strategy, run.global_batch)
        except InputError as exc:  # e.g. uneven layer splits, which pipecore's stages do not model yet
            row["note"] = f"left out: {exc}"
            rows.append(row)
            continue
        predicted = (est.hardware_tflops_per_gpu if run.flops_formula == "megatron-eq3"
                     else est.tflops_per_gpu)
        flops = arch.flops_per_iteration(run.global_batch, recompute=run.recompute
                                         if run.flops_formula == "megatron-eq3" else "none")
        measured_time = run.measured_iteration_time
        if not np.isfinite(measured_time):
            measured_time = flops / (run.measured_tflops_per_gpu * 1e12 * run.gpus)
        row.update(strategy=strategy.label(), predicted_tflops=predicted,
                   measured_iteration_time=measured_time, predicted_iteration_time=est.iteration_time,
                   error=predicted / run.measured_tflops_per_gpu - 1.0, memory_gb=est.memory_per_gpu / 1e9)
        rows.append(row)
    return pa.Table.from_pylist(rows)

"""Plan a training run

From a model and a cluster to the layout a training run should use: how
many GPUs split each layer (tensor parallelism, tp), how many pipeline
stages (pp), how many data-parallel replicas (dp), the microbatch size, the
pipeline schedule, recomputation and ZeRO. This tutorial estimates one
layout with `pc.estimate`, searches a space of layouts with
`pc.strategies`, looks at the best one, asks where a given layout and a
published run's layout rank, and writes the report page.

The setting is row 5 of Table 1 of the Megatron-LM paper (Narayanan et al.,
SC21): a 39-billion-parameter GPT on 512 A100 GPUs (64 DGX A100 nodes) with
1536 sequences of 2048 tokens per iteration. Units: seconds per iteration
(lower is faster), model TFLOP/s per GPU (higher is faster; MFU is its
share of the GPU's peak), GiB (2^30 bytes) on the fullest GPU, US dollars
per million tokens trained. The {doc}`../guide` ("Planning a training run")
has the rest of the API.
"""

# %%
# The model and the cluster are presets: `pc.Architecture.presets()` lists
# the models, and every constant of a GPU or cluster preset names its
# public source (`pool.sources`, `pool.gpu.sources`).
import textwrap

import pyarrow.parquet as pq

import pipecore as pc
from pipecore.plan.ranking import parse_strategy, published_rankings
from pipecore.plan.report import plan_report

model = pc.Model.preset("megatron-39.1b")
cluster = pc.Cluster.preset("dgx-a100", nodes=64)
arch, pool = model.architecture, cluster.pools[0]
print(f"{arch.name}: {arch.params() / 1e9:.1f} billion parameters, {arch.layers} layers, "
      f"hidden size {arch.hidden}, {arch.seq} tokens per sequence")
print(f"{pool.count} x {pool.gpu.name}: {pool.gpu.peak_flops / 1e12:.0f} TFLOP/s peak (bf16), "
      f"{pool.gpu.hbm_bytes / 2**30:.0f} GiB each, ${pool.price_per_gpu_hour} per GPU-hour")

# %%
# One layout, estimated: the paper's (tp 8 inside a node, pp 2, dp 32,
# microbatches of 4 sequences, 1F1B, every layer recomputed), here with
# bf16, FlashAttention, the distributed optimizer (ZeRO stage 1) and the
# gradient reduction overlapped with the backward. pipecore builds the
# 1F1B schedule of the 2 pipeline stages and simulates it with each op's
# time from the GPU and network model, then adds the data-parallel
# reduction, the embedding sync and the optimizer step. The breakdown says
# where each second of the iteration goes; memory is the fullest GPU's.
GLOBAL_BATCH = 1536
paper = pc.Strategy(tp=8, pp=2, dp=32, microbatch_size=4, schedule="1f1b", recompute="full", zero=1,
                    dp_overlap=True)
est = pc.estimate(model, cluster, paper, global_batch=GLOBAL_BATCH)
print(f"{paper.label()}: {est.iteration_time:.2f} s per iteration, {est.tflops_per_gpu:.0f} TFLOP/s "
      f"per GPU ({est.mfu:.0%} MFU),\n  {est.memory_per_gpu / 2**30:.1f} GiB per GPU, "
      f"${est.cost_per_million_tokens:.2f} per million tokens")
for cause, seconds in est.breakdown.items():
    print(f"  {cause:<15}{seconds:7.3f} s  {seconds / est.iteration_time:6.1%}")
print("memory: " + ", ".join(f"{part} {b / 2**30:.1f}" for part, b in est.memory.items()) + " GiB")

# %%
# A search: every layout of a declared space, each estimated in full and
# ranked. The default space (`pipecore plan` searches it) takes a few tens
# of seconds here; this one keeps two schedules, ZeRO 0 or 1, no or full
# recomputation and microbatches of 1, 2 or 4 sequences, so it runs in a
# few seconds. A layout that cannot run, does not fit the GPU or breaks a
# time bound keeps its row, with `why`.
plans = pc.strategies(model, cluster, GLOBAL_BATCH, schedules=("1f1b", "interleaved-1f1b"),
                      zero=(0, 1), recompute=("none", "full"), microbatch_sizes=(1, 2, 4))
rows = plans.table.to_pylist()
ranked = [r for r in rows if r["rank"] is not None]
print(f"{len(rows)} layouts estimated in {plans.seconds:.1f} s: {len(ranked)} ranked, "
      f"{sum(1 for r in rows if r['why'] and r['why'].startswith('needs '))} do not fit the GPU")
print(f"{'rank':>4}  {'layout':<46}{'s/iter':>7}{'TFLOP/s':>8}{'GiB/GPU':>8}")
for r in ranked[:5]:
    print(f"{r['rank']:>4}  {r['strategy']:<46}{r['iteration_time']:>7.2f}{r['tflops_per_gpu']:>8.0f}"
          f"{r['memory_per_gpu'] / 2**30:>8.1f}")
pq.write_table(plans.table, "plans.parquet")  # what `pipecore plan --out plans.parquet` writes

# %%
# The best layout and where its time goes. Compare its breakdown with the
# paper layout's above: full recomputation runs each forward again in the
# backward (a third more work, in the compute line), and the tensor-parallel
# all-reduces of every layer grow with tp (the tp_comm line).
best = plans.best
print(f"best: {best.strategy.label()}: {best.iteration_time:.2f} s per iteration,\n"
      f"  {best.tflops_per_gpu:.0f} TFLOP/s per GPU ({best.mfu:.0%} MFU), "
      f"{best.memory_per_gpu / 2**30:.1f} GiB per GPU")
for cause, seconds in best.breakdown.items():
    print(f"  {cause:<15}{seconds:7.3f} s  {seconds / best.iteration_time:6.1%}")

# %%
# Where a given layout ranks: `rank_of` takes any strategy. One the search
# holds takes its rank from the table; any other is estimated and placed
# where the search's order would put it, saying what the space did not
# hold. A layout also reads from a short string (`pipecore plan
# --strategy` takes the same), with dp the GPUs left over.
def say(name, ranking):
    print(textwrap.fill(f"{name}: {ranking.describe()}", 110, subsequent_indent="  "))


say("paper's layout", plans.rank_of(paper, model, cluster, GLOBAL_BATCH))
mine = parse_strategy("tp=4,pp=4,mb=1,schedule=interleaved-1f1b,chunks=3,sp,zero=1", gpus=pool.count)
say(mine.label(), plans.rank_of(mine, model, cluster, GLOBAL_BATCH))

# %%
# The run this setting comes from is one of pipecore's published runs:
# `published_rankings` finds the runs of this very model, GPU type and
# count and batch, and ranks each with its configuration as published (fp16,
# the unfused attention of 2021, the reduction after the backward).
marks = {"paper, bf16": plans.rank_of(paper, model, cluster, GLOBAL_BATCH)}
for run, ranking in published_rankings(plans, model, cluster, GLOBAL_BATCH):
    say(f"published {run.id}", ranking)
    marks[f"published {run.id}"] = ranking

# %%
# The report page: iteration time against memory per GPU for every layout,
# with the Pareto frontier (no ranked layout is both faster and lighter)
# and the marked layouts; the best layout's pipeline timeline and memory by
# part against the GPU's; each of the top plans' time by cause and memory by
# part; a sortable table. `pipecore plan --model megatron-39.1b --cluster
# dgx-a100 --nodes 64 --global-batch 1536 --strategy "tp8 pp2 mb4 1f1b
# rc=full zero1" --report plan.html` writes the same page for the default
# space.
page = plan_report(plans, "plan.html", model, cluster, GLOBAL_BATCH, top=8, marks=marks)

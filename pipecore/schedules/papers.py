"""Where each schedule family comes from: the publications its
:class:`~pipecore.Family` cites as ``paper``.

Titles and venues are as the papers appeared (checked against the
proceedings or arXiv pages); the link is the open text. Where a family
takes one schedule out of a paper, or where part of it is pipecore's own
choice, the ``note`` says so. ``pipecore families`` and the docs' gallery
print these.
"""

from __future__ import annotations

from dataclasses import replace

from .registry import Paper

__all__ = ["GPIPE", "PIPEDREAM_FLUSH", "MEGATRON_INTERLEAVED", "ZERO_BUBBLE", "ZERO_BUBBLE_V",
           "ZERO_BUBBLE_INTERLEAVED", "CONTROLLABLE_MEMORY", "EAGER_1F1B", "V_MIN", "V_HALF",
           "V_ZB", "BREADTH_FIRST", "CHIMERA", "HANAYO", "BITPIPE", "DUALPIPE", "DUALPIPE_V",
           "SEQ1F1B", "PIPEDREAM", "PIPEDREAM_2BW", "LAYERPIPE2", "TIMELY_FREEZE", "BPIPE",
           "HELIXPIPE", "VOCAB_PARALLEL"]

GPIPE = Paper(
    "Huang et al.", "GPipe: Efficient Training of Giant Neural Networks using Pipeline Parallelism",
    "NeurIPS 2019", 2019, "https://arxiv.org/abs/1811.06965")

# PipeDream-2BW's paper; 1F1B is its PipeDream-Flush variant.
PIPEDREAM_FLUSH = Paper(
    "Narayanan et al.", "Memory-Efficient Pipeline-Parallel DNN Training", "ICML 2021", 2021,
    "https://arxiv.org/abs/2006.09503", note="PipeDream-Flush: 1F1B with a pipeline flush")

MEGATRON_INTERLEAVED = Paper(
    "Narayanan et al.",
    "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM",
    "SC 2021", 2021, "https://arxiv.org/abs/2104.04473", note="the interleaved 1F1B schedule")

# The ICLR 2024 version (ZB-H1, ZB-H2) has a title of its own; ZB-V came
# with the arXiv version.
ZERO_BUBBLE = Paper(
    "Qi et al.", "Zero Bubble (Almost) Pipeline Parallelism", "ICLR 2024", 2024,
    "https://openreview.net/forum?id=tuzTN0eIO5", note="the handcrafted ZB-H1 and ZB-H2")
ZERO_BUBBLE_V = Paper(
    "Qi et al.", "Zero Bubble Pipeline Parallelism", "arXiv:2401.10241", 2024,
    "https://arxiv.org/abs/2401.10241",
    note="ZB-V (section 6 of the arXiv version); order as PyTorch's ScheduleZBVZeroBubble")
ZERO_BUBBLE_INTERLEAVED = replace(
    ZERO_BUBBLE_V, note="ZB-H1's split backward over v chunks, as PyTorch's "
    "ScheduleInterleavedZeroBubble builds it")

CONTROLLABLE_MEMORY = Paper(
    "Qi et al.", "Pipeline Parallelism with Controllable Memory", "NeurIPS 2024", 2024,
    "https://arxiv.org/abs/2405.15362")
EAGER_1F1B = replace(CONTROLLABLE_MEMORY,
                     note="eager 1F1B, an example of the paper's building blocks")
V_MIN = replace(CONTROLLABLE_MEMORY, note="the V-Min building block")
V_HALF = replace(CONTROLLABLE_MEMORY, note="the V-Half building block")
V_ZB = replace(CONTROLLABLE_MEMORY, note="the V-ZB building block")

BREADTH_FIRST = Paper(
    "Lamy-Poirier", "Breadth-First Pipeline Parallelism", "MLSys 2023", 2023,
    "https://arxiv.org/abs/2211.05953",
    note="the looped schedule; backward order as PyTorch's ScheduleLoopedBFS")

CHIMERA = Paper(
    "Li and Hoefler",
    "Chimera: Efficiently Training Large-Scale Neural Networks with Bidirectional Pipelines",
    "SC 2021", 2021, "https://arxiv.org/abs/2107.06925",
    note="order from the authors' runtime (github.com/Shigangli/Chimera)")

HANAYO = Paper(
    "Liu et al.",
    "Hanayo: Harnessing Wave-like Pipeline Parallelism for Enhanced Large Model Training Efficiency",
    "SC 2023", 2023, "https://arxiv.org/abs/2308.15762",
    note="the wave placement; the per-device order is pipecore's own (earliest-start greedy)")

BITPIPE = Paper(
    "Wu et al.",
    "BitPipe: Bidirectional Interleaved Pipeline Parallelism for Accelerating Large Models Training",
    "arXiv:2410.19367", 2024, "https://arxiv.org/abs/2410.19367",
    note="order from the authors' code (github.com/wuhouming/BitPipe)")

DUALPIPE = Paper(
    "DeepSeek-AI", "DeepSeek-V3 Technical Report", "arXiv:2412.19437", 2024,
    "https://arxiv.org/abs/2412.19437",
    note="DualPipe; each device runs the steps of DualPipeV (see dualpipev)")
DUALPIPE_V = Paper(
    "DeepSeek-AI", "DualPipe", "GitHub repository", 2025, "https://github.com/deepseek-ai/DualPipe",
    note="DualPipeV, Sea AI Lab's cut-in-half of DualPipe; order as PyTorch's ScheduleDualPipeV")

SEQ1F1B = Paper(
    "Sun et al.",
    "Seq1F1B: Efficient Sequence-Level Pipeline Parallelism for Large Language Model Training",
    "arXiv:2406.03488", 2024, "https://arxiv.org/abs/2406.03488",
    note="order from the authors' Megatron-LM code (github.com/thunlp/Seq1F1B)")
# The SOSP text; the arXiv preprint 1806.03377 carries an earlier title.
PIPEDREAM = Paper(
    "Narayanan et al.", "PipeDream: Generalized Pipeline Parallelism for DNN Training", "SOSP 2019",
    2019, "https://doi.org/10.1145/3341301.3359646",
    note="1F1B without flushes and weight stashing; no vertical sync")
PIPEDREAM_2BW = replace(PIPEDREAM_FLUSH, note="PipeDream-2BW: double-buffered weight updates; which "
                        "version a step uses is pipecore's reading of the one-step delay")
LAYERPIPE2 = Paper(
    "Unnikrishnan and Parhi",
    "LayerPipe2: Multistage Pipelining and Weight Recompute via Improved Exponential Moving Average "
    "for Training Neural Networks", "arXiv:2512.08160", 2025, "https://arxiv.org/abs/2512.08160",
    note="per-stage delays (stages downstream) and stored vs moving-average weights, from the "
    "abstract; one stage per device; the reconstruction's compute is not modelled")
TIMELY_FREEZE = Paper(
    "Cho et al.", "TimelyFreeze: Adaptive Parameter Freezing Mechanism for Pipeline Parallelism",
    "arXiv:2602.05754", 2026, "https://arxiv.org/abs/2602.05754",
    note="freezing skips backward work; pipecore freezes whole stages (pipecore.freeze), not "
         "the paper's per-microbatch freeze ratios chosen by a linear program")
BPIPE = Paper(
    "Kim et al.",
    "BPipe: Memory-Balanced Pipeline Parallelism for Training Large Language Models",
    "ICML 2023", 2023, "https://proceedings.mlr.press/v202/kim23l.html",
    note="activation balancing: device d evicts activations to device p-1-d; how many and "
         "which microbatches, and when they come back, are pipecore's own rule")
HELIXPIPE = Paper(
    "Zhang et al.",
    "HelixPipe: Efficient Distributed Training of Long Sequence Transformers with Attention "
    "Parallel Pipeline Parallelism", "arXiv:2507.00394", 2025, "https://arxiv.org/abs/2507.00394",
    note="placement from the authors' code (github.com/code-tunnel/Megatron-LM, branch dev); "
         "forward order a pipecore list schedule; communication not modelled")
VOCAB_PARALLEL = Paper(
    "Yeung et al.", "Balancing Pipeline Parallelism with Vocabulary Parallelism", "arXiv:2411.05288",
    2024, "https://arxiv.org/abs/2411.05288",
    note="p+2 / p+1 in flight from the figure 10 caption and the authors' README "
         "(github.com/sail-sg/VocabularyParallelism); the S and T passes are per-stage cost shares")

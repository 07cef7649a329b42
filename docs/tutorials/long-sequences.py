"""Long sequences: Seq1F1B against 1F1B, ZB-H1 and ZB-V from 8k to 128k tokens

Seq1F1B (Sun et al., arXiv:2406.03488) cuts every sequence into k chunks
and runs 1F1B over the chunks. Causal attention ties the chunks of one
sequence together: chunk j reads the keys and values of chunks 0..j-1, so
its forward follows theirs and the backwards run from the last chunk to the
first. Finer units shrink both the warm-up bubble and the activations held
in flight; the price is that the chunks are unequal: with an even token
split, the last chunk's attention reads k times more keys than the first's.

This page simulates one training step of Llama-2 7B (the `llama2-7b` preset
of `pc.Model`, one sequence per microbatch, 16 sequences) on 8 pipeline
devices with A100 roofline costs, at sequence lengths from 8k to 128k, and
compares step time and the fullest device's activation memory.

Units: step times in seconds (lower is better); `speedup` is 1F1B's step
time over the schedule's (above 1 is faster); memory in GB (1e9 bytes) on
the fullest device, without tensor parallelism, so the long sequences do
not fit one 80 GB GPU here: read the ratios. Communication is left out
(every schedule sends the same bytes per sequence).
"""

# %%
# `pc.analysis.longseq.seq1f1b_study` builds each schedule, reads the share
# of causal attention in the forward and the backward off the model (the
# model's FLOPs at s and s/2 tokens separate the s and s^2 terms), weights
# each Seq1F1B op by its chunk's work (`Schedule.with_factors`) and simulates.
# Two Seq1F1B partitions: `tokens` (equal tokens per chunk: equal memory,
# growing time) and `compute` (the paper's computation-wise partition: equal
# work, the later chunks shorter).
import matplotlib.pyplot as plt

from pipecore.analysis.longseq import seq1f1b_study

rows = seq1f1b_study()
print(f"{'tokens':>7} {'schedule':<21} {'step s':>8} {'speedup':>8} {'bubble':>7} "
      f"{'act GB':>7} {'vs 1F1B':>8}")
for r in rows:
    print(f"{r['seq']:>7} {r['schedule']:<21} {r['step_s']:>8.2f} {r['speedup']:>7.3f}x "
          f"{r['bubble_ratio']:>7.3f} {r['peak_activation_gb']:>7.1f} {r['memory_ratio']:>7.3f}x")

# %%
# Who wins where, and why:
#
# - **Memory**: Seq1F1B at every length. Device 0 holds p + k - 1 chunks of
#   1/k of a sequence against 1F1B's p sequences: (p + k - 1)/(k p) of
#   1F1B's activations, 0.56 at k = 2 and 0.34 at k = 4 with p = 8 (the
#   token split exactly; the compute split a little more, since its first
#   chunks are longer). ZB-H1 and ZB-V hold about as much as 1F1B.
# - **Time, short sequences (8k-16k)**: ZB-V. Attention is a quarter to
#   two fifths of the work; ZB-V's split backward fills the bubble, which
#   Seq1F1B only shrinks by k.
# - **Time, long sequences (32k-128k)**: Seq1F1B with the compute split at
#   k = 4. As attention grows to most of the work, W (the weight gradient,
#   linear in the tokens) becomes a small part of the backward, so the
#   zero-bubble schedules have little to fill their bubbles with; Seq1F1B's
#   bubble shrinks with k whatever the attention share.
# - **The token split loses time as sequences grow**: its last chunk's
#   attention dominates (chunk j costs (1-a) + a(2j+1)/k of the mean), and
#   the unequal units stall the pipeline; past 16k it is slower than 1F1B.
#   This is why the paper partitions by computation.
names = ["1f1b", "zb-h1", "zb-v", "seq1f1b k=4 tokens", "seq1f1b k=4 compute"]
fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
for name in names:
    mine = [r for r in rows if r["schedule"] == name]
    seqs = [r["seq"] // 1024 for r in mine]
    left.plot(seqs, [r["speedup"] for r in mine], marker="o", label=name)
    right.plot(seqs, [r["memory_ratio"] for r in mine], marker="o", label=name)
for ax, label in ((left, "speedup over 1F1B (higher is faster)"),
                  (right, "peak activation / 1F1B's (lower is less)")):
    ax.set_xscale("log", base=2)
    ax.set_xticks(seqs, [f"{s}k" for s in seqs])
    ax.set_xlabel("sequence length (tokens)")
    ax.set_ylabel(label)
    ax.grid(alpha=0.3)
left.legend(fontsize=8)
fig.suptitle("Llama-2 7B, 8 pipeline devices, 16 sequences, A100 roofline")
fig.tight_layout()
fig.savefig("long-sequences.png", dpi=110)

# %%
# HelixPipe (Zhang et al., arXiv:2507.00394) against the same baselines, on
# the paper's GPU (an H20 roofline, 148 TFLOP/s BF16): each block is cut at
# its attention core; the parameter parts run in a helix over the devices,
# and one layer's attention for p different microbatches runs on all p
# devices at once, so the warm-up waits on parameter parts, not attention.
# All forwards run before all backwards (first in, last out), and the
# parameter parts are recomputed in the backward (recomputation without
# attention), so each device keeps only their inputs and the attention's.
from pipecore.analysis.longseq import HELIX_PAPER_SPEEDUP, helixpipe_study

helix_rows = helixpipe_study()
print(f"{'tokens':>7} {'schedule':<21} {'step s':>8} {'speedup':>8} {'bubble':>7} "
      f"{'act GB':>7} {'vs 1F1B':>8}")
for r in helix_rows:
    print(f"{r['seq']:>7} {r['schedule']:<21} {r['step_s']:>8.2f} {r['speedup']:>7.3f}x "
          f"{r['bubble_ratio']:>7.3f} {r['peak_activation_gb']:>7.1f} {r['memory_ratio']:>7.3f}x")
at_128k = {r["schedule"]: r["step_s"] for r in helix_rows if r["seq"] == 131072}
for base in ("1f1b", "zb-v", "seq1f1b k=4 compute"):
    print(f"128k: HelixPipe {at_128k[base] / at_128k['helixpipe']:.2f}x faster than {base} "
          f"(the paper: {HELIX_PAPER_SPEEDUP:.2f}x over its baselines, 64 H20)")

# %%
# Who wins where, and why (8 pipeline devices, 16 sequences, H20 roofline):
#
# - **8k-16k**: ZB-V, then Seq1F1B. HelixPipe re-runs the linear layers in
#   the backward (three quarters of the work at 8k) and its first-in-last-out
#   order fills and drains the pipeline twice; it only draws level with
#   1F1B at 8k (1.02x).
# - **32k-64k**: Seq1F1B (k = 4, compute split), HelixPipe close behind at
#   64k (within 2 %).
# - **128k**: HelixPipe. Attention is most of the work and runs in
#   parallel over the devices, so its bubble falls from about a fifth of
#   the step at 8k to about 4 % at 128k, and the recomputation it pays is of
#   the linear layers only, a small part at 128k. At 128k it is about 1.33x
#   1F1B, 1.18x ZB-V and 3 % ahead of Seq1F1B.
# - **Memory**: Seq1F1B holds the least (a k-th of a sequence per unit).
#   HelixPipe holds every microbatch's checkpoints at the turn, the same on
#   every device (about 0.7 of 1F1B's fullest device here), where 1F1B's
#   device 0 holds p sequences and its last device one.
#
# Beside the paper: its 26 % is measured on 64 H20 GPUs with communication,
# its own pipeline size and its baselines' settings, which pipecore does not
# know; this page models 8 pipeline devices without communication, so read
# the ordering and the trend (HelixPipe's edge grows with the length), not
# the exact ratio.

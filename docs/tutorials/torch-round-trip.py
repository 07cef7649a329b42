"""A PyTorch round trip: export, run, profile, what-if

pipecore's schedules run for real in PyTorch's pipeline runtime. This
tutorial exports a 1F1B schedule, runs it on two CPU processes (one per
rank) with a tiny transformer while `torch.profiler` records it, fits costs
to the traces, and predicts how every other family would do on the same
model and machine, before running any of them.

It needs the `torch` extra (`pip install -e ".[torch]"`, the CPU build of
torch 2.13.0) and takes a few seconds. Times from real runs are in seconds
(printed in milliseconds, ms); the model is tiny, so a step takes
milliseconds and the numbers move from run to run by several percent. More
in `bindings/README.md` and the {doc}`../guide`.
"""

# %%
# Build the schedule and write it as the CSV torch's runtime loads
# (`pipecore export 1f1b -p 2 -m 4 --csv sched.csv` does the same).
# `pt.validate` runs torch's own checks and its send/receive lowering on it.
import statistics

from pipecore.bindings import torch as pt

import pipecore as pc

sched = pc.build("1f1b", devices=2, microbatches=4)
pt.to_csv(sched, "sched.csv")
pt.validate(sched)
print(open("sched.csv").read())

# %%
# Run it: two ranks, each a process with one stage of a tiny transformer,
# seven training steps. Steps 3-5 run under the profiler; steps 2, 6 and 7
# run without it as a reference, because the profiler slows every operator
# it records. The gradients are compared with the same model run unpipelined.
# (`pipecore run-torch sched.csv --ranks 2 --model tiny-transformer
# --profile traces/` on the command line.)
run = pt.run(sched, ranks=2, model="tiny-transformer", steps=7, profile="traces")
print(f"gradients match the unpipelined model: {run.grads_match}")
print("step times (ms):", " ".join(f"{t * 1e3:.1f}" for t in run.step_times))
print(f"median step after set-up: {run.iteration_time(warmup=1) * 1e3:.2f} ms")

# %%
# Fit costs to the traces: per stage, the median forward (F) and fused
# backward (BW) times with the profiler's slowdown taken out, the runtime's
# overhead per op, and the network's latency from the sends.
prof = pt.from_profile("traces")
for stage in range(2):
    print(f"stage {stage}: F {prof.costs.f[stage] * 1e3:.3f} ms, "
          f"BW {prof.costs.bw[stage] * 1e3:.3f} ms")
print(f"overhead per op {prof.costs.overhead * 1e3:.3f} ms, "
      f"latency per transfer {prof.network.latency * 1e3:.3f} ms")

# %%
# `prof.predict` simulates any schedule on those costs. For the schedule
# that ran, the prediction can be checked against the steps run without the
# profiler (steps 2, 6 and 7). The prediction gives each rank a core of its
# own; when other work shares the cores the measured steps grow, and the
# gap with them.
predicted = prof.predict("1f1b").makespan
measured = statistics.median(run.step_times[i] for i in run.reference_steps)
print(f"1f1b: predicted {predicted * 1e3:.2f} ms, measured {measured * 1e3:.2f} ms "
      f"({predicted / measured - 1:+.0%})")
print(f"gpipe: predicted {prof.predict('gpipe').makespan * 1e3:.2f} ms")

# %%
# What if we ran another schedule? `pt.what_if` ranks every family on the
# profiled setup (families with four stages get the per-stage times spread
# over the model's depth), with each one's peak activation, and says what
# it left out and why. `pipecore what-if traces/ --schedules all` prints the
# same table.
print(pt.format_what_if(pt.what_if(prof)))

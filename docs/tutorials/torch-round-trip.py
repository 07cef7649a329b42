"""A PyTorch round trip: export, run, profile, what-if

pipecore's schedules run for real in PyTorch's pipeline runtime. This
tutorial exports a 1F1B schedule, runs it on two CPU processes (one per
rank) with a tiny transformer while `torch.profiler` records it, fits costs
to the traces, checks the prediction for 1F1B against three timed runs, and
predicts how every other family would do on the same model and machine,
before running any of them.

It needs the `torch` extra (`pip install -e ".[torch]"`, the CPU build of
torch 2.13.0) and runs four short trainings, each in two fresh processes.
Times from real runs are in seconds (printed in milliseconds, ms); the
model is tiny, so a step takes milliseconds and the numbers move from run
to run by several percent: the measured time comes with its spread. More
in `bindings/README.md` and the {doc}`../guide`.
"""

# %%
# Build the schedule and write it as the CSV torch's runtime loads
# (`pipecore export 1f1b -p 2 -m 4 --csv sched.csv` does the same).
# `pt.validate` runs torch's own checks and its send/receive lowering on it.
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
# Fit costs to the traces: per stage, the mean forward (F) and fused
# backward (BW) times with the profiler's slowdown taken out, the runtime's
# overhead per op, and the network's latency from the sends.
prof = pt.from_profile("traces")
for stage in range(2):
    print(f"stage {stage}: F {prof.costs.f[stage] * 1e3:.3f} ms, "
          f"BW {prof.costs.bw[stage] * 1e3:.3f} ms")
print(f"overhead per op {prof.costs.overhead * 1e3:.3f} ms, "
      f"latency per transfer {prof.network.latency * 1e3:.3f} ms")

# %%
# `prof.predict` simulates any schedule on those costs. To check it on the
# schedule that ran, time that schedule the way pipecore's fidelity checks
# do (`pt.timed_runs`; `pipecore what-if traces/ --check` runs the same):
# three more runs of the same model without the profiler, each in fresh
# processes, six steps each. A run's time is the median of its steps 3-6
# (torch sets up in the first); the measurement is the median of the three
# runs, with their range (min-max) as its spread. The prediction gives each
# rank a core of its own; when other work shares the cores, every run (the
# profiled one too) slows down by its own amount, and the spread shows how
# far: a gap within it is noise.
predicted = prof.predict("1f1b").makespan
timed = pt.timed_runs([sched], 3, model="tiny-transformer", steps=6)["1f1b"]
print(f"1f1b: predicted {predicted * 1e3:.2f} ms per step")
print(f"1f1b: measured {timed['measured'] * 1e3:.2f} ms per step, the median of "
      f"{len(timed['runs'])} runs (min-max over the runs {timed['low'] * 1e3:.2f}-"
      f"{timed['high'] * 1e3:.2f} ms)")


def against_prediction(seconds):
    """How a measured step time compares with the prediction, in words."""
    gap = seconds / predicted - 1
    return f"{abs(gap):.0%} {'slower' if gap >= 0 else 'faster'}"


print(f"measured is {against_prediction(timed['measured'])} than predicted "
      f"(from {against_prediction(timed['low'])} to {against_prediction(timed['high'])} "
      f"over the runs' min-max)")
print(f"gpipe: predicted {prof.predict('gpipe').makespan * 1e3:.2f} ms per step")

# %%
# What if we ran another schedule? `pt.what_if` ranks every family on the
# profiled setup (families with four stages get the per-stage times spread
# over the model's depth), with each one's peak activation, and says what
# it left out and why. Its "profiled schedule" line compares the prediction
# with the profiled run's own unprofiled steps (2, 6 and 7): one run, so no
# spread across runs beside it, unlike the timed runs above.
# `pipecore what-if traces/ --schedules all` prints the same table, and with
# `--check` runs the top three as `pt.timed_runs` does.
print(pt.format_what_if(pt.what_if(prof)))

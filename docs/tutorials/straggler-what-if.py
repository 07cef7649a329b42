"""Stragglers: what a slow device costs, and who pays

One slow device (a throttled GPU, a noisy neighbour) slows the whole
pipeline, but by how much depends on where it sits and on the schedule.
This tutorial simulates a 4-device pipeline with one device 30% slower,
asks `pc.what_if` what the iteration would take without it and which
device's work set the pace, draws the critical path, and adds random
per-op jitter to see the spread over 10,000 iterations.

Units: times are in cost units (`f = 1` is one microbatch's forward through
one device's share of the model); a straggler factor of 1.3 makes every op
of that device take 1.3 times as long. The {doc}`../guide` ("Real model
shapes, partitioning, stragglers and what-if") has the rest of the API.
"""

# %%
# 1F1B on 4 devices with 8 microbatches, the backward twice the forward:
# (m + p - 1)(f + b) = 11 x 3 = 33 cost units. With device 3 slowed by 30%:
import matplotlib.pyplot as plt

import pipecore as pc

sched = pc.build("1f1b", devices=4, microbatches=8)
costs = pc.Costs(f=1.0, b=2.0)
base = pc.simulate(sched, costs)
slow = pc.simulate(sched, costs, stragglers={3: 1.3})
print(f"no straggler: {base.makespan:.2f}; device 3 at 1.3x: {slow.makespan:.2f} "
      f"({slow.makespan / base.makespan - 1:+.1%})")

# %%
# `pc.what_if` re-simulates without the stragglers and splits the critical
# path (the chain of ops and transfers that sets the makespan) by device:
# here the slow device carries most of it.
print(pc.what_if(slow).report())

# %%
# Where the slow device sits matters, and so does the schedule: a
# zero-bubble schedule (split backward, `w > 0`) fills its bubbles with
# weight-gradient work, which leaves less slack to absorb a slow device.
costs_zb = pc.Costs(f=1.0, b=1.0, w=1.0)
print(f"{'schedule':<17} {'normal':>7}  " + "  ".join(f"dev {d} slow" for d in range(4)))
for family in ("1f1b", "zb-h1", "zb-v", "interleaved-1f1b"):
    s = pc.build(family, devices=4, microbatches=8)
    times = [pc.simulate(s, costs_zb, stragglers={d: 1.3}).makespan for d in range(4)]
    print(f"{family:<17} {pc.simulate(s, costs_zb).makespan:>7.2f}  "
          + "  ".join(f"{t:>10.2f}" for t in times))

# %%
# Add noise: every op's time times a lognormal factor with mean 1 and a
# log-spread of 5% (seeded, so the page is the same every build). The Gantt
# chart outlines the critical path; `res.critical_path()` is the same as a
# table.
noisy = pc.simulate(sched, costs, stragglers={3: 1.3},
                    jitter=pc.Jitter.lognormal(0.05, seed=1))
noisy.write_gantt("straggler-gantt.png", critical=True,
                  title="1F1B, p=4, m=8, device 3 at 1.3x, 5% jitter (critical path outlined)")
path = noisy.critical_path()
ops = [d for e, d in zip(path["element"].to_pylist(), path["device"].to_pylist()) if e == "op"]
print(f"critical path: {len(ops)} ops, {ops.count(3)} of them on device 3")
print(pc.what_if(noisy).report().splitlines()[0])

# %%
# One draw is one iteration. `pc.monte_carlo` runs 10,000 draws in one
# batched call (draw k equals `simulate(..., draw=k)`) and gives the
# quantiles of the iteration time, drawn here as a histogram:
mc = pc.monte_carlo(sched, costs, pc.Jitter.lognormal(0.05, seed=1), draws=10_000,
                    stragglers={3: 1.3})
print(f"p50 {mc.p50:.2f}, p90 {mc.p90:.2f}, p99 {mc.p99:.2f} cost units")
fig, ax = plt.subplots(figsize=(6, 2.6), layout="constrained")
ax.hist(mc.makespans, bins=60, color="#4c72b0")
for q, value in (("p50", mc.p50), ("p99", mc.p99)):
    ax.axvline(value, color="black", lw=1, ls="--")
    ax.text(value, 1.02, q, transform=ax.get_xaxis_transform(), ha="center", fontsize=8)
ax.set_xlabel("iteration time (cost units)")
ax.set_ylabel("draws")
fig.savefig("monte-carlo.png", dpi=110)

"""SWARM: swarms of unequal, unreliable peers against a fixed pipeline

SWARM parallelism (Ryabinin et al., ICML 2023, arXiv 2301.11913) serves each
pipeline stage with a *swarm* of peers and routes every microbatch, stage by
stage, to one live peer of the next stage, so fast peers take more work and a
peer that leaves costs only the request it was running. `pc.swarm` simulates
that (a discrete-event simulation: who runs what is decided during the run,
so it is no op table) and runs a fixed pipeline of the same devices, a
registered family under `pc.simulate`, beside it under the same departures.

Units: times are in cost units (`f = 1` is one microbatch's forward through
one stage at speed 1); throughputs are microbatches per cost unit, higher is
better. A speed of 0.5 makes a peer take twice as long.
"""

# %%
# 4 stages of 4 peers, f=1, b=2, a hop of 0.1 between stages, 640
# microbatches. With equal peers SWARM reaches the capacity (4 peers / 3 per
# microbatch); the fixed 1F1B pipelines lose their bubble at every one of
# their 10 iterations (flushes that SWARM, with no optimizer step in this
# model, does not have).
import matplotlib.pyplot as plt

import pipecore as pc

costs = pc.Costs(f=1.0, b=2.0, comm=0.1)
equal = [[1.0, 1.0, 1.0, 1.0]] * 4
mixed = [[1.0, 1.0, 0.75, 0.5]] * 4     # in every stage, one peer at 3/4 and one at 1/2 speed
res = pc.swarm(equal, costs, microbatches=640)
print(res.report())

# %%
# Mixed peers. The routing rule matters: SWARM's balancer ('throughput')
# and the earliest-finish rule ('queue') keep every peer busy; a random peer
# in proportion to speed ('proportional') leaves some idle while others
# queue; a uniform random peer overloads the slow ones. The fixed pipelines
# get the best static split ('weighted': pipeline k, the k-th peer of every
# stage, takes microbatches in proportion to its slowest stage's rate), with
# 10 iterations and with one long one (a single flush).
print(f"{'routing':<13} {'SWARM':>7} {'steady':>7} {'bound':>7}   fixed 1F1B, 10 iterations: "
      f"{pc.swarm(mixed, costs, 640).fixed['throughput']:.4f}; 1 iteration: "
      f"{pc.swarm(mixed, costs, 640, fixed_iterations=1).fixed['throughput']:.4f}")
for routing in ("throughput", "queue", "proportional", "uniform"):
    r = pc.swarm(mixed, costs, 640, routing=routing, fixed=None)
    print(f"{routing:<13} {r.throughput:7.4f} {r.steady_throughput:7.4f} {r.capacity:7.4f}")

# %%
# Unreliable peers: each stays up for an exponential time of mean `up` and
# is away for a mean of 50 (the same seeded trace for both). SWARM re-routes
# the lost request; a synchronous pipeline must redo the iteration a
# departure cuts, once the peer is back.
ups = [5000.0, 2000.0, 1000.0, 500.0, 200.0]
rows = []
for up in ups:
    r = pc.swarm(mixed, costs, 640, churn=(up, 50.0), seed=1)
    rows.append((r.throughput, r.fixed["throughput"], r.lost_work, r.fixed["lost_work"]))
    print(f"mean uptime {up:>6g}: SWARM {r.throughput:.4f}, fixed {r.fixed['throughput']:.4f} "
          f"({r.speedup:.2f}x); lost work {r.lost_work:.1f} vs {r.fixed['lost_work']:.1f} cost units")

fig, ax = plt.subplots(figsize=(7, 3.6))
ax.plot(ups, [x[0] for x in rows], "o-", label="SWARM (balancer)")
ax.plot(ups, [x[1] for x in rows], "s--", label="fixed 1F1B, weighted pipelines")
ax.axhline(pc.swarm(mixed, costs, 40, fixed=None).capacity, color="grey", lw=0.8,
           label="capacity, every peer up")
ax.set_xscale("log")
ax.set_xticks(ups, [f"{u:g}" for u in ups])
ax.minorticks_off()
ax.set_xlabel("mean uptime of a peer (cost units; mean downtime 50)")
ax.set_ylabel("microbatches per cost unit\n(higher is better)")
ax.set_title("4 stages x 4 mixed peers, 640 microbatches")
ax.legend(fontsize=8)
fig.tight_layout()
fig.savefig("swarm-churn.png", dpi=110)

# %%
# Which requests were lost, and where: `requests` has one row per attempt.
r = pc.swarm(mixed, costs, 640, churn=(500.0, 50.0), seed=1)
t = r.requests
print(f"{int(t['lost'].sum())} of {t['lost'].size} attempts lost; per stage:",
      [int(t["lost"][t["stage"] == s].sum()) for s in range(4)])
print("utilisation (busy / up) of stage 0's peers:", [round(float(x), 2) for x in r.utilisation[0]])

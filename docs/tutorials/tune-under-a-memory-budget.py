"""Tune under a memory budget

Given a pipeline's op times and how much memory each device may spend on
activations, `pc.tune` finds the fastest schedule that fits: it tries every
family at every chunk count, cost-driven generated schedules, local search,
and recomputation or offload where a fast schedule does not fit. This
tutorial tunes one setting under three budgets and shows what each megabyte
of budget buys.

Units: times are in cost units (here the op times of a real model,
microseconds if you like: `f = 18.5` is one microbatch's forward through one
device's share of the model); memory is in M, one microbatch's activation on
one device's share. The {doc}`../guide` ("Tuning") lists what `tune`
searches.
"""

# %%
# The setting: 8 devices, 24 microbatches, a backward split into B (input
# gradient, 18.1) and W (weight gradient, 9.3), 0.6 per transfer. After B,
# half of a microbatch's activation stays until its W (`activation_w=0.5`).
# Weights are left out (`weights=0`), so the budget is activation alone.
import matplotlib.pyplot as plt
import pyarrow.compute as pcmp

import pipecore as pc

costs = pc.Costs(f=18.5, b=18.1, w=9.3, comm=0.6, activation_w=0.5, weights=0.0)
best = pc.tune(devices=8, microbatches=24, costs=costs, memory_limit=8.0, progress=False)
print(best.report().split("\n\n")[0])

# %%
# `best.schedule` is the winner, `best.result` its simulation and
# `best.candidates` a table of everything tried (fits or not, with a note
# when a candidate could not be built). The fastest candidate of all needs
# three times the budget:
rows = best.candidates.sort_by("makespan").to_pylist()
print(f"{'candidate':<22} {'makespan':>9} {'memory (M)':>10}  fits 8 M")
for r in rows[:6]:
    print(f"{r['candidate']:<22} {r['makespan']:>9.1f} {r['memory']:>10.2f}  "
          f"{'yes' if r['fits'] else 'no'}")

# %%
# Tighter budgets: below what any family needs, `tune` recomputes
# activations (an `R` op re-runs a forward before its backward, so only the
# stage's input is kept) and polishes the result with local search. Each
# halving of the budget costs time:
winners = {}
for limit in (8.0, 4.0, 2.0):
    winners[limit] = pc.tune(devices=8, microbatches=24, costs=costs, memory_limit=limit,
                             progress=False)
    res = winners[limit].result
    slower = res.makespan / best.result.makespan - 1
    print(f"budget {limit:3.0f} M: {res.makespan:7.1f} ({slower:+6.1%})  {winners[limit].label}")

# %%
# What the budget looks like: each winner's fullest device, its activation
# over the iteration against its limit (`res.memory` has every device's
# activation after each event).
fig, ax = plt.subplots(figsize=(7, 3.2), layout="constrained")
for (limit, tuned), colour in zip(winners.items(), ("#4c72b0", "#dd8452", "#55a868")):
    res = tuned.result
    fullest = int(res.peak_activation.argmax())
    mem = res.memory.filter(pcmp.equal(res.memory["device"], fullest))
    ax.step(mem["time"], mem["activation"], where="post", color=colour,
            label=f"budget {limit:g} M: device {fullest}, {res.makespan:.0f} cost units")
    ax.axhline(limit, color=colour, ls=":", lw=1)
ax.set_xlabel("time (cost units)")
ax.set_ylabel("activation held (M)")
fig.legend(loc="outside lower center", ncol=3, fontsize=7, frameon=False)
fig.savefig("memory-by-budget.png", dpi=110)

# %%
# The 4 M winner as an HTML page: its Gantt chart with zoom and hover (`R`
# is a recomputed forward), its memory per device over time against the
# limit and the three views. `tight.result.write_gantt("tuned.png")` draws
# the chart as a picture instead.
tight = winners[4.0]
page = pc.report(tight.result, "tuned-4M.html", memory_limit=4.0)

# %%
# Recomputation is what makes 2 M fast. Without it (and without offload),
# the only schedule that fits is `pc.generate.memory_greedy`'s, which starts
# a forward only when its activation fits under the limit, at about twice
# the time:
plain = pc.tune(devices=8, microbatches=24, costs=costs, memory_limit=2.0, recompute=False,
                offload=False, progress=False)
print(f"budget 2 M, no recompute: {plain.result.makespan:7.1f}  {plain.label}")

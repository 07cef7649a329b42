"""Compose a schedule, then explore the space

A pipeline schedule is three choices: where each stage runs (the
placement), which op a device runs next (the order policy), and where the
weight-gradient (W) ops go when the backward is split. `pc.compose` builds a
schedule from the three; `pc.explore` searches thousands of such
compositions for the fastest that fits a memory limit. {doc}`../composing`
explains every placement, policy and W rule; this tutorial uses them.

Units: times are in cost units (`f = 1` is one microbatch's forward through
one device's share of the model) except with a `pc.Model`, where they are
seconds; memory is in M (one microbatch's activation on one device's share)
except with a model, where it is bytes.
"""

# %%
# A family is a preset of the three choices: composing `"zb-v"` gives the
# same op table as `pc.build("zb-v", ...)`; `params["composition"]` records
# the three choices.
from pprint import pprint

import pipecore as pc

costs = pc.Costs(f=1.0, b=1.0, w=1.0)
preset = pc.compose("zb-v", devices=4, microbatches=8)
built = pc.build("zb-v", devices=4, microbatches=8)
print("same programs as pc.build:", preset.to_actions() == built.to_actions())
pprint(preset.params["composition"], width=88)

# %%
# Now change one choice at a time. The V placement (stages d and 2p-1-d on
# device d) with 1F1B capped at 3 microbatches in flight and W ops put into
# the bubbles trades a little time for memory:
capped = pc.compose(placement="v", devices=4, microbatches=8,
                    order=pc.orders.one_f_one_b(inflight=3), w="bubbles")
for name, s in (("zb-v preset", preset), ("V, 1F1B, 3 in flight", capped)):
    res = pc.simulate(s, costs)
    print(f"{name:<22} makespan {res.makespan:5.1f}  peak activation "
          f"{res.peak_activation.max():.0f} M")
chart = pc.simulate(capped, costs).write_gantt("v-capped.png", title="V placement, 1F1B with at most "
                                               "3 microbatches in flight, W in the bubbles")

# %%
# Any stage-to-device list is a placement, and an order that cannot finish
# on it is refused with an error that says which op each device waits for.
# Here 8 stages go down the devices and back up (a V written by hand),
# scheduled breadth first with every W at the end:
hand = pc.compose(placement=[0, 1, 2, 3, 3, 2, 1, 0], microbatches=8,
                  order=pc.orders.breadth_first(), w="late")
res = pc.simulate(hand, costs)
print(f"hand-made V, breadth first: makespan {res.makespan:.1f}, "
      f"peak activation {res.peak_activation.max():.0f} M")

# %%
# `pc.explore` searches placements x order policies x caps x W rules
# (thousands of compositions; about 10,000 at p = 8) and runs `pc.tune` too,
# so it is never slower than tune. On 4 devices with 16 microbatches and a
# limit of 5 M per device (activation plus weights, 1 M here), a composition
# that no family presets wins; its label reads placement/order/W rule:
costs = pc.Costs(f=1.0, b=1.2, w=0.8, comm=0.05)
best = pc.explore(4, 16, costs, memory_limit=5, progress=False)
print(best.report().split("\n\n")[0])
print(f"{best.candidates.num_rows} candidates tried")

# %%
# With a `pc.Model` instead of costs, each composition's layer split is
# searched too (uniform, balanced, then refined by moving a layer or two),
# and the costs and network come from the hardware (an H100 node with
# NVLink by default). The limit is then in bytes per device. A 30-layer
# transformer with hidden size 4096 on 4 devices, 16 microbatches, 40 GB:
model = pc.Model.transformer(layers=30, hidden=4096, heads=32, seq=4096, vocab=128000)
best = pc.explore(4, 16, model, memory_limit=40e9, progress=False)
print(f"winner: {best.label}")
print(f"layers per stage: {best.schedule.params['layers']}")
memory = best.result.peak_activation + best.result.static_memory   # bytes, per device
print(f"iteration {best.result.makespan * 1e3:.1f} ms; fullest device "
      f"{memory.max() / 1e9:.1f} GB of 40 GB")

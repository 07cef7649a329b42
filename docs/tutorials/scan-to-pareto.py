"""Scan a design space to a Pareto page

Which schedule should a pipeline of 8 devices run, and what does each choice
cost in memory? This tutorial writes a grid of schedules, shapes, costs and
networks to a file, scans all of it into a Parquet dataset, asks the dataset
a question with pyarrow, and writes the HTML page that draws throughput
against memory with the Pareto frontier.

Units: times are in cost units (`f = 1` is one microbatch's forward through
one device's share of the model), memory in M (one microbatch's activation on
one device's share), throughput in microbatches per cost unit. The
{doc}`../guide` has the grid file's keys under "Scans".
"""

# %%
# A grid file names what to scan. Each key is a value or a list of values,
# and the scan evaluates every combination: here 7 families x 2 device
# counts x 2 microbatch counts x 2 backward costs x 2 networks, each under
# two per-device memory limits (`interleaved-1f1b` with 2 chunks per
# device). `"free"` is no network; `slow` is a network defined in the file,
# where a transfer of 1 unit of bytes holds its link for 0.5 cost units.
from pathlib import Path

import pyarrow.compute as pcmp
import pyarrow.parquet as pq

import pipecore as pc

Path("grid.toml").write_text("""
schedules = ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "v-half", "v-min"]
devices = [4, 8]
microbatches = [16, 32]
chunks = [2]
f = 1.0
b = [1.0, 2.0]
w = 1.0
memory_limit = [6.0, 10.0]     # per device: activation + weights, in M
network = ["free", "slow"]

[networks.slow]
bytes = 1.0
bandwidth = 2.0
latency = 0.05
""")
grid = pc.Grid.from_toml("grid.toml")
print(f"{grid.points} configurations")

# %%
# `pc.write_scan` is what `pipecore scan grid.toml --out results/` runs: it
# writes the rows as Parquet parts, a summary, and a quick Pareto plot
# (makespan over the bubble-free ideal against the worst device's memory,
# one panel per shape, one colour per family).
summary = pc.write_scan("grid.toml", "results", progress=False)
print(f"{summary['rows']} rows in {summary['parts']} part(s)")

# %%
# Any Parquet reader opens the folder (DuckDB, polars, pandas); pyarrow
# comes with pipecore (`pq`, `pcmp` imported above). At p = 8 devices, m = 32 microbatches, b = 2 and on
# the slow network: how fast is each family, how much memory does its
# fullest device need, and which fit a budget of 6 M per device?
rows = pq.read_table("results")
shape = pcmp.and_(pcmp.and_(pcmp.equal(rows["devices"], 8), pcmp.equal(rows["microbatches"], 32)),
                  pcmp.and_(pcmp.equal(rows["network"], "slow"), pcmp.equal(rows["b"], 2.0)))
at_six = rows.filter(pcmp.and_(shape, pcmp.equal(rows["memory_limit"], 6.0)))
print(f"{'schedule':<17} {'makespan':>9} {'bubble':>7} {'memory (M)':>10}  fits 6 M")
for r in at_six.sort_by("makespan").to_pylist():
    print(f"{r['schedule']:<17} {r['makespan']:>9.2f} {r['bubble_ratio']:>7.1%} "
          f"{r['memory_max']:>10.2f}  {'yes' if r['fits'] else 'no'}")

# %%
# The page: `pc.report` of a scan folder (`pipecore report results/ --out
# scan.html`) draws every configuration's throughput against its worst
# device's memory, one colour per family, with selectors for the shape and
# the network, and writes the frontier's rows beside the page. It is one
# self-contained file (plotly inlined) that opens offline.
pc.report("results", "scan.html", title="Scan: 7 families at p = 4 and 8")
frontier = pq.read_table("scan_frontier.parquet")
print(f"{frontier.num_rows} configurations on the Pareto frontiers "
      f"(of {rows.num_rows})")

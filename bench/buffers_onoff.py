"""Does core/buffers.py pay for itself? Build plus simulate, machinery on and off.

Usage::

    python bench/buffers_onoff.py [--repeats 3] [--families 1f1b,zb-v,v-half,dualpipev]
                                  [--devices 1024] [--microbatches 8192]

Each measurement is a fresh process (first-touch page costs are what the
machinery is about, so a warm process would hide them) that builds the
family at the given shape and simulates it, twice: the first pass loads
every kernel on the large-schedule path, the second is timed (the case of
a scan or tuner that builds many large schedules in one process). "on" is the
module as shipped; "off" replaces its allocators by numpy's own
(``np.empty``/``np.zeros``, which keep numpy's default huge-page hint for
arrays of 4 MB or more), makes ``arena`` plain ``np.empty`` arrays and
``populate`` a no-op. On and off alternate within each repeat. The output
is the median build + simulate seconds of each and the gain of "on", in
per cent of "off"'s time (positive: the machinery saves time).
"""

import argparse
import json
import statistics
import subprocess
import sys

_CHILD = r"""
import json, sys, time
import numpy as np
import pipecore as pc
from pipecore.core import buffers

family, p, m, mode = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
if mode == "off":
    buffers.empty = lambda shape, dtype=np.float64: np.empty(shape, dtype)
    buffers.zeros = lambda shape, dtype=np.float64: np.zeros(shape, dtype)
    buffers.full = lambda shape, value, dtype: np.full(shape, value, dtype)
    buffers.arena = lambda *specs: [np.empty(s, d) for s, d in specs]
    buffers.populate = lambda *arrays: None
costs = pc.Costs(f=1.0, b=2.0, w=1.0, comm=0.1)
warm = pc.build(family, p, m)            # loads every kernel on the large-schedule path
pc.simulate(warm, costs).makespan
del warm
t0 = time.perf_counter()
s = pc.build(family, p, m)
t1 = time.perf_counter()
r = pc.simulate(s, costs)
_ = r.makespan
t2 = time.perf_counter()
print(json.dumps({"build": t1 - t0, "simulate": t2 - t1}))
"""


def _one(family, p, m, mode):
    out = subprocess.run([sys.executable, "-c", _CHILD, family, str(p), str(m), mode],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--families", default="1f1b,zb-v,v-half,dualpipev")
    ap.add_argument("--devices", type=int, default=1024)
    ap.add_argument("--microbatches", type=int, default=8192)
    a = ap.parse_args(argv)
    print(f"build + simulate at p={a.devices}, m={a.microbatches}, {a.repeats} repeats, "
          "fresh process each; seconds (median), gain of 'on' in % of 'off'")
    total = {"on": 0.0, "off": 0.0}
    for fam in a.families.split(","):
        runs = {"on": [], "off": []}
        for _ in range(a.repeats):
            for mode in ("on", "off"):
                t = _one(fam, a.devices, a.microbatches, mode)
                runs[mode].append(t["build"] + t["simulate"])
        med = {k: statistics.median(v) for k, v in runs.items()}
        for k in med:
            total[k] += med[k]
        print(f"{fam:>10}: on {med['on']:.2f} s [{min(runs['on']):.2f}-{max(runs['on']):.2f}]  "
              f"off {med['off']:.2f} s [{min(runs['off']):.2f}-{max(runs['off']):.2f}]  "
              f"gain {100 * (med['off'] - med['on']) / med['off']:+.1f}%", flush=True)
    print(f"{'all':>10}: on {total['on']:.2f} s  off {total['off']:.2f} s  "
          f"gain {100 * (total['off'] - total['on']) / total['off']:+.1f}%")


if __name__ == "__main__":
    main()

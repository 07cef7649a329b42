"""Issue 41's construction bar, one call per fresh process.

``pc.compose(preset, p, m)`` against ``pc.build(preset, p, m)`` at p=1024,
m=8192 (17M to 50M ops): each timed once in a process of its own (after a
small call loads the kernels from Numba's cache), build and compose
alternating, ``--rounds`` times each; medians. A user composes once per
process, and timing several calls in one process (as
bench/test_bench_compose.py does) also times how much of the memory the
previous call freed the allocator hands back: in-process medians of the same
pair moved by up to 2x between runs on this 2-core VM.

``--no-hugepages`` turns numpy's transparent huge pages off in both (numpy
asks for them on arrays of 4 MB and more). On a VM whose host backs a
guest's huge page on first touch, as this one, that fault is slow and how
slow varies from process to process: 1f1b's build at p=1024, m=8192 took
0.57 to 1.88 s with them and 0.83 to 1.05 s without (10 and 8 fresh
processes).

Run: python bench/compose_fresh.py [--rounds 3] [--no-hugepages] [preset ...]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

ONCE = """
import sys, time
import numpy as np
if sys.argv[5] == "no":
    (getattr(np, "_core", None) or np.core).multiarray._set_madvise_hugepage(False)
import pipecore as pc
how, name, p, m = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
getattr(pc, how)(name, 8, 32)
t0 = time.perf_counter()
getattr(pc, how)(name, p, m)
print(time.perf_counter() - t0)
"""


def once(how, name, p, m, hugepages=True):
    out = subprocess.run([sys.executable, "-c", ONCE, how, name, str(p), str(m),
                          "yes" if hugepages else "no"],
                         check=True, capture_output=True, text=True).stdout
    return float(out.split()[-1])


def main(argv=None):
    from pipecore.schedules.compose import presets

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("presets", nargs="*", default=presets())
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-p", type=int, default=1024)
    ap.add_argument("-m", type=int, default=8192)
    ap.add_argument("--no-hugepages", action="store_true",
                    help="turn off numpy's transparent huge pages for large arrays in both")
    args = ap.parse_args(argv)
    print(f"p={args.p} m={args.m}, medians of {args.rounds} fresh processes each (seconds)")
    for name in args.presets:
        b, c = [], []
        for _ in range(args.rounds):
            b.append(once("build", name, args.p, args.m, not args.no_hugepages))
            c.append(once("compose", name, args.p, args.m, not args.no_hugepages))
        mb, mc = statistics.median(b), statistics.median(c)
        print(f"{name:18s} build {mb:6.3f}  compose {mc:6.3f}  compose/build {mc / mb:4.2f}"
              f"   (build {min(b):.2f}-{max(b):.2f}, compose {min(c):.2f}-{max(c):.2f})",
              flush=True)


if __name__ == "__main__":
    main()

"""Numba compile time per kernel for a pipecore command, from an empty cache.

Usage::

    python bench/compile_times.py            # the main job: a table; --json for machine-readable
    python bench/compile_times.py --study    # also `pipecore study --asymmetric --no-plot`
    python bench/compile_times.py --repeat 3 --study   # medians of 3 cold/warm pairs

Runs a ``pipecore`` command (by default the main job, ``pipecore compare
--devices 8 --microbatches 32 --no-gantt``) in a fresh process with an empty
``NUMBA_CACHE_DIR`` and records Numba's ``numba:compile`` events: the
seconds spent compiling each kernel (nested compiles of the kernels it
calls are counted in their caller) and how many signatures each kernel was
compiled for (more than one: a kernel compiled twice, for argument types
that differ); then the same command again with the cache now filled. Both
runs report wall and CPU seconds of the whole process (CPU seconds count
less of the time other work on the machine takes the cores). The main job
runs twice: as a user gets it (small calls run the list scheduler
interpreted while nothing is compiled, pipecore.core.tier: nothing should
compile), and with that off (``PIPECORE_INTERPRET_MAX_OPS=0``), which is
what the first large simulation of a machine waits for once. The output
names the processor's AVX flags: compile times and code differ with them.
"""

import json
import os
import statistics
import subprocess
import sys
import tempfile

_CHILD = r"""
import json, os, sys, time
t0 = time.perf_counter()
import numba.core.event as ev
spans = []

class _Rec(ev.Listener):
    def __init__(self):
        self.open = {}
    def on_start(self, event):
        self.open[id(event.data["dispatcher"]) , str(event.data["args"])] = time.perf_counter()
    def on_end(self, event):
        key = (id(event.data["dispatcher"]), str(event.data["args"]))
        began = self.open.pop(key, None)
        if began is not None:
            d = event.data["dispatcher"]
            spans.append((f"{d.py_func.__module__}.{d.py_func.__qualname__}", key[1], began,
                          time.perf_counter()))

ev.register("numba:compile", _Rec())
from pipecore.cli import main
code = main(sys.argv[1:])
wall = time.perf_counter() - t0
times = os.times()
# Only outermost compiles: a span inside another is part of its caller's time.
spans.sort(key=lambda s: s[2])
outer, end = [], -1.0
for name, _args, a, b in spans:
    if a >= end:
        outer.append((name, b - a))
        end = b
signatures = {}
for name, args, _a, _b in spans:
    if name.startswith("pipecore.") and "<locals>" not in name:  # not overloads' per-type impls
        signatures.setdefault(name, set()).add(args)
print(json.dumps({"wall": wall, "cpu": times.user + times.system, "compiles": outer,
                  "signatures": {k: len(v) for k, v in signatures.items()}, "exit": code}))
"""

MAIN_JOB = ("compare", "--devices", "8", "--microbatches", "32", "--no-gantt")
STUDY = ("study", "--asymmetric", "--no-plot", "--no-progress")


def cpu_flags() -> str:
    """The processor's AVX flags, space-separated ("" where /proc/cpuinfo is missing)."""
    try:
        with open("/proc/cpuinfo") as f:
            words = f.read().split()
    except OSError:
        return ""
    return " ".join(sorted({w for w in words if w.startswith("avx")}))


def measure(args=MAIN_JOB, interpret=True):
    """Compile seconds per kernel for one CLI command, cold and then warm.

    Parameters
    ----------
    args : sequence of str
        The ``pipecore`` command line to run (``--out`` is added: a fresh
        folder).
    interpret : bool, default True
        False sets ``PIPECORE_INTERPRET_MAX_OPS=0``: every kernel compiles,
        however small the call.

    Returns
    -------
    dict
        ``cold_wall``, ``warm_wall``, ``cold_cpu`` and ``warm_cpu`` (seconds
        of the whole process), ``compiles`` (list of (kernel, seconds),
        slowest first), ``compile_total`` and ``signatures`` (kernel: number
        of signatures compiled, nested kernels included).

    Raises
    ------
    RuntimeError
        If the command fails.
    """
    cache = tempfile.mkdtemp(prefix="pipecore-numba-cache-")
    env = dict(os.environ, NUMBA_CACHE_DIR=cache)
    if not interpret:
        env["PIPECORE_INTERPRET_MAX_OPS"] = "0"
    runs = []
    for _ in range(2):
        out_dir = tempfile.mkdtemp(prefix="pipecore-compile-")
        proc = subprocess.run([sys.executable, "-c", _CHILD, *args, "--out", out_dir], env=env,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed:\n{proc.stderr[-2000:]}")
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    compiles = {}
    for name, sec in runs[0]["compiles"]:
        compiles[name] = compiles.get(name, 0.0) + sec
    ranked = sorted(compiles.items(), key=lambda kv: -kv[1])
    return {"cold_wall": runs[0]["wall"], "warm_wall": runs[1]["wall"],
            "cold_cpu": runs[0]["cpu"], "warm_cpu": runs[1]["cpu"], "compiles": ranked,
            "compile_total": sum(compiles.values()), "signatures": runs[0]["signatures"]}


def _medians(results):
    keys = ("cold_wall", "warm_wall", "cold_cpu", "warm_cpu", "compile_total")
    out = {k: statistics.median(r[k] for r in results) for k in keys}
    out["compiles"] = results[len(results) // 2]["compiles"]  # one run's table
    out["signatures"] = results[0]["signatures"]
    out["runs"] = len(results)
    return out


def main(argv=None):
    """Print the table (or JSON with --json)."""
    argv = sys.argv[1:] if argv is None else argv
    repeat = int(argv[argv.index("--repeat") + 1]) if "--repeat" in argv else 1
    cases = {"compare -p 8 -m 32 --no-gantt, as run (small calls interpreted while cold)":
             (MAIN_JOB, True),
             "compare -p 8 -m 32 --no-gantt, PIPECORE_INTERPRET_MAX_OPS=0": (MAIN_JOB, False)}
    if "--study" in argv:
        cases["study --asymmetric --no-plot"] = (STUDY, True)
    found = {label: _medians([measure(args, interpret) for _ in range(repeat)])
             for label, (args, interpret) in cases.items()}
    if "--json" in argv:
        print(json.dumps({"cpu_flags": cpu_flags(), **found}, indent=1))
        return
    print(f"CPU flags: {cpu_flags() or 'unknown'}; medians of {repeat} cold/warm pair(s)")
    for label, res in found.items():
        print(f"pipecore {label}: {res['cold_wall']:.2f} s with an empty Numba cache, "
              f"{res['warm_wall']:.2f} s with it filled (CPU {res['cold_cpu']:.2f} s and "
              f"{res['warm_cpu']:.2f} s)")
        print(f"compile time, outermost kernels: {res['compile_total']:.2f} s")
        for name, sec in res["compiles"]:
            twice = res["signatures"].get(name, 1)
            more = f"  ({twice} signatures)" if twice > 1 else ""
            print(f"  {sec:7.2f} s  {name}{more}")
        again = {k: v for k, v in res["signatures"].items() if v > 1}
        if again:
            print("  compiled for more than one signature: "
                  + ", ".join(f"{k} x{v}" for k, v in sorted(again.items())))


if __name__ == "__main__":
    main()

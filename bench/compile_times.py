"""Numba compile time per kernel for the README's main job, from an empty cache.

Usage::

    python bench/compile_times.py            # prints a table; --json for machine-readable

Runs ``pipecore compare --devices 8 --microbatches 32 --no-gantt`` in a
fresh process with an empty ``NUMBA_CACHE_DIR`` and records Numba's
``numba:compile`` events: the seconds spent compiling each kernel (nested
compiles of inlined helpers are counted in their caller), then the same
command again with the cache now filled. It does so twice: as a user gets
it (small calls run the list scheduler interpreted while nothing is
compiled, pipecore.core.tier: nothing should compile), and with that off
(``PIPECORE_INTERPRET_MAX_OPS=0``), which is what the first large simulation
of a machine waits for once.
"""

import json
import os
import subprocess
import sys
import tempfile

_CHILD = r"""
import json, sys, time
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
            spans.append((f"{d.py_func.__module__}.{d.py_func.__qualname__}", began,
                          time.perf_counter()))

ev.register("numba:compile", _Rec())
from pipecore.cli import main
code = main(sys.argv[1:])
wall = time.perf_counter() - t0
# Only outermost compiles: a span inside another is part of its caller's time.
spans.sort(key=lambda s: s[1])
outer, end = [], -1.0
for name, a, b in spans:
    if a >= end:
        outer.append((name, b - a))
        end = b
print(json.dumps({"wall": wall, "compiles": outer, "exit": code}))
"""


def measure(args=("compare", "--devices", "8", "--microbatches", "32", "--no-gantt"),
            interpret=True):
    """Compile seconds per kernel for one CLI command, cold and then warm.

    Parameters
    ----------
    args : sequence of str
        The ``pipecore`` command line to run.
    interpret : bool, default True
        False sets ``PIPECORE_INTERPRET_MAX_OPS=0``: every kernel compiles,
        however small the call.

    Returns
    -------
    dict
        ``cold_wall`` and ``warm_wall`` (seconds of the whole process),
        ``compiles`` (list of (kernel, seconds), slowest first) and
        ``compile_total``.

    Raises
    ------
    RuntimeError
        If the command fails.
    """
    cache = tempfile.mkdtemp(prefix="pipecore-numba-cache-")
    out_dir = tempfile.mkdtemp(prefix="pipecore-compile-")
    env = dict(os.environ, NUMBA_CACHE_DIR=cache)
    if not interpret:
        env["PIPECORE_INTERPRET_MAX_OPS"] = "0"
    runs = []
    for _ in range(2):
        proc = subprocess.run([sys.executable, "-c", _CHILD, *args, "--out", out_dir], env=env,
                              capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(args)} failed:\n{proc.stderr[-2000:]}")
        runs.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    compiles = {}
    for name, sec in runs[0]["compiles"]:
        compiles[name] = compiles.get(name, 0.0) + sec
    ranked = sorted(compiles.items(), key=lambda kv: -kv[1])
    return {"cold_wall": runs[0]["wall"], "warm_wall": runs[1]["wall"], "compiles": ranked,
            "compile_total": sum(compiles.values())}


def main():
    """Print the table (or JSON with --json)."""
    both = {"as run": measure(), "compiled": measure(interpret=False)}
    if "--json" in sys.argv:
        print(json.dumps(both, indent=1))
        return
    for label, res in both.items():
        how = ("small calls interpreted while cold" if label == "as run"
               else "PIPECORE_INTERPRET_MAX_OPS=0")
        print(f"pipecore compare -p 8 -m 32 --no-gantt ({how}): {res['cold_wall']:.2f} s with "
              f"an empty Numba cache, {res['warm_wall']:.2f} s with it filled")
        print(f"compile time, outermost kernels: {res['compile_total']:.2f} s")
        for name, sec in res["compiles"]:
            print(f"  {sec:7.2f} s  {name}")


if __name__ == "__main__":
    main()

"""Compare saved benchmark runs by the fraction of the limit kernel.

Usage::

    python bench/limit_fractions.py OLD.json NEW.json     # two saved runs
    python bench/limit_fractions.py                       # the last two in .benchmarks/

Each run is a pytest-benchmark JSON file (``pytest bench/ --benchmark-only
--benchmark-autosave`` writes one under ``.benchmarks/`` with the machine's
CPU info). In every group that holds a ``limit kernel`` benchmark, each other
benchmark's rate is divided by the limit kernel's rate from the same run;
that fraction, not an absolute rate, is what can be compared across machines.
"""

import glob
import json
import os
import sys


def fractions(path):
    """Return ``({(group, name): fraction}, cpu)`` for one saved run.

    Parameters
    ----------
    path : str
        A pytest-benchmark JSON file.

    Returns
    -------
    tuple of (dict, str)
        Fraction of the limit kernel per (group, benchmark name), and the CPU
        brand with its AVX flags.

    Raises
    ------
    ValueError
        If the file is not a pytest-benchmark run.
    """
    with open(path) as fh:
        run = json.load(fh)
    if "benchmarks" not in run:
        raise ValueError(f"{path}: not a pytest-benchmark JSON file (no 'benchmarks' key)")
    groups = {}
    for b in run["benchmarks"]:
        configs = (b.get("extra_info") or {}).get("configs", 1)
        groups.setdefault(b["group"], []).append((b["name"], b["stats"]["median"] / configs))
    out = {}
    for group, rows in groups.items():
        lim = [m for name, m in rows if name.startswith("limit kernel")]
        if not lim:
            continue
        for name, median in rows:
            if not name.startswith("limit kernel"):
                out[(group, name)] = lim[0] / median
    cpu = run.get("machine_info", {}).get("cpu", {})
    flags = sorted(f for f in cpu.get("flags", []) if f.startswith("avx"))
    return out, f"{cpu.get('brand_raw', '?')} [{' '.join(flags[:6])}]"


def main(argv):
    """Print both runs' fractions side by side."""
    if len(argv) == 2:
        old, new = argv
    elif not argv:
        runs = sorted(glob.glob(os.path.join(".benchmarks", "*", "*.json")), key=os.path.getmtime)
        if len(runs) < 2:
            sys.exit("need two saved runs: pytest bench/ --benchmark-only --benchmark-autosave "
                     "(twice), or pass two JSON files")
        old, new = runs[-2:]
    else:
        sys.exit(__doc__)
    fo, cpu_o = fractions(old)
    fn, cpu_n = fractions(new)
    print(f"old: {old}\n     {cpu_o}\nnew: {new}\n     {cpu_n}")
    print(f"{'group / benchmark':<78} {'old':>6} {'new':>6} {'new/old':>8}")
    for key in sorted(set(fo) | set(fn)):
        a, b = fo.get(key), fn.get(key)
        ratio = f"{b / a:8.3f}" if a and b else f"{'':>8}"
        fa = f"{a:6.3f}" if a else f"{'-':>6}"
        fb = f"{b:6.3f}" if b else f"{'-':>6}"
        print(f"{key[0][:40] + ' / ' + key[1][:35]:<78} {fa} {fb} {ratio}")


if __name__ == "__main__":
    main(sys.argv[1:])

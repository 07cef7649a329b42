"""Issue 14's tracked figure: simulate_many's rate as a fraction of the limit kernel's.

Run: pytest bench/test_bench_limit.py --benchmark-only
Each group times simulate_many (replay, costs f, b, w, comm, no network:
the common sweep) and bench/limit.py's kernel on the same settings in the
same run; the summary prints configs/s and the fraction of the limit.
Makespans are checked equal before timing.
"""

import numpy as np
import pytest
from limit import Limit
from sizes import pick

import pipecore as pc

CASES = {"zb-h1 p8-m32": ("zb-h1", 8, 32, pick(1_000_000, 500)),
         "1f1b p64-m256": ("1f1b", 64, 256, pick(20_000, 100))}


def _settings(n, seed=0):
    rng = np.random.default_rng(seed)
    return {"f": rng.uniform(0.5, 2, n), "b": rng.uniform(0.5, 2, n), "w": rng.uniform(0, 1, n),
            "comm": rng.uniform(0, 0.1, n)}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("who", ["simulate_many", "limit"])
def test_sweep(benchmark, case, who):
    name, p, m, n = CASES[case]
    sched = pc.build(name, p, m)
    table = _settings(n)
    lim = Limit(sched)
    small = {k: v[:256] for k, v in table.items()}
    want = lim.makespans(small["f"], small["b"], small["w"], small["comm"])
    got = pc.simulate_many(sched, small).column("makespan").to_numpy()
    assert np.array_equal(want, got)  # same work, or the fraction means nothing
    benchmark.group = f"sweep {case} (f, b, w, comm)"
    benchmark.extra_info["configs"] = n
    if who == "limit":
        benchmark.name = f"limit kernel ({n:,} configs/call)"
        benchmark.pedantic(lim.makespans, (table["f"], table["b"], table["w"], table["comm"]),
                           rounds=5, iterations=1)
    else:
        benchmark.name = f"simulate_many replay ({n:,} configs/call)"
        benchmark.pedantic(pc.simulate_many, (sched, table), rounds=5, iterations=1)

"""Cold start: Numba compile time per kernel for the README's main job.

Run: pytest bench/test_bench_compile.py --benchmark-only -s
The timed call is a whole ``pipecore compare -p 8 -m 32 --no-gantt`` process
with an empty Numba cache (and, after it, the same with the cache filled),
once as a user runs it (small calls interpreted while nothing is compiled)
and once with every kernel compiled (``PIPECORE_INTERPRET_MAX_OPS=0``);
extra_info holds the compile seconds of every outermost kernel, so saved runs
(--benchmark-autosave) keep them.
"""

import pytest
from compile_times import measure


@pytest.mark.parametrize("interpret", [True, False], ids=["as run", "compiled"])
def test_cold_start_compile_times(benchmark, interpret):
    res = {}

    def run():
        res.update(measure(interpret=interpret))

    benchmark.group = "cold start (compare -p 8 -m 32 --no-gantt)"
    benchmark.name = "empty Numba cache, whole process, " + ("as run" if interpret else "compiled")
    benchmark.pedantic(run, rounds=1, iterations=1)
    benchmark.extra_info["warm_wall"] = res["warm_wall"]
    benchmark.extra_info["compile_total"] = res["compile_total"]
    for name, sec in res["compiles"]:
        benchmark.extra_info[f"compile {name}"] = sec
    print(f"\ncold {res['cold_wall']:.2f} s, warm {res['warm_wall']:.2f} s, compile "
          f"{res['compile_total']:.2f} s: " + ", ".join(f"{n.rsplit('.', 1)[-1]} {s:.2f}"
                                                      for n, s in res["compiles"]))
    if interpret:  # the list scheduler's kernels run interpreted: nothing to compile
        assert res["compile_total"] < 1.0, res["compiles"]
    else:
        assert res["compiles"], "an empty cache must compile something"
        assert res["warm_wall"] < res["cold_wall"]

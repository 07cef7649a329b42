"""Cold start: Numba compile time per kernel for the README's main job and
for ``pipecore study --asymmetric``.

Run: pytest bench/test_bench_compile.py --benchmark-only -s
The timed call is a whole ``pipecore`` process with an empty Numba cache
(and, after it, the same with the cache filled): the main job, ``compare -p
8 -m 32 --no-gantt``, once as a user runs it (small calls interpreted while
nothing is compiled) and once with every kernel compiled
(``PIPECORE_INTERPRET_MAX_OPS=0``); and ``study --asymmetric --no-plot`` as
a user runs it (its simulations compile at once). extra_info holds the
compile seconds of every outermost kernel and the processor's AVX flags, so
saved runs (--benchmark-autosave) keep them.
"""

import pytest
from compile_times import MAIN_JOB, STUDY, cpu_flags, measure
from sizes import pick

CASES = {
    "compare as run": (MAIN_JOB, True),
    "compare compiled": (MAIN_JOB, False),
    # The smoke run: one shape of the study, one asymmetric microbatch count.
    "study --asymmetric": (STUDY + pick((), ("--devices", "4", "--microbatches", "8",
                                             "--asymmetric-microbatches", "4")), True),
}


@pytest.mark.parametrize("case", list(CASES))
def test_cold_start_compile_times(benchmark, case):
    args, interpret = CASES[case]
    res = {}

    def run():
        res.update(measure(args, interpret=interpret))

    benchmark.group = "cold start: empty Numba cache, whole process"
    benchmark.name = f"pipecore {case}"
    benchmark.pedantic(run, rounds=1, iterations=1)
    for key in ("warm_wall", "cold_cpu", "warm_cpu", "compile_total"):
        benchmark.extra_info[key] = res[key]
    benchmark.extra_info["cpu_flags"] = cpu_flags()
    for name, sec in res["compiles"]:
        benchmark.extra_info[f"compile {name}"] = sec
    print(f"\n{case}: cold {res['cold_wall']:.2f} s, warm {res['warm_wall']:.2f} s, compile "
          f"{res['compile_total']:.2f} s: " + ", ".join(f"{n.rsplit('.', 1)[-1]} {s:.2f}"
                                                      for n, s in res["compiles"]))
    # Each kernel compiles for one signature: a second one is a type that
    # differs between two calls (int32/int64, readonly, a literal), compiled twice.
    assert all(n == 1 for n in res["signatures"].values()), res["signatures"]
    if case == "compare as run":  # the list scheduler's kernels run interpreted: nothing to compile
        assert res["compile_total"] < 1.0, res["compiles"]
    elif case == "compare compiled":
        assert res["compiles"], "an empty cache must compile something"
        assert res["warm_wall"] < res["cold_wall"]

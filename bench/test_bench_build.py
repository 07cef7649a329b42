"""Issue 14's build bar: ``pc.build`` of every family at p=1024 m=8192
(< 2 s each for the families with a regular pattern), and the unit-time
greedy (hanayo's order) against its pure-Python reference.

Run: pytest bench/test_bench_build.py --benchmark-only

Each build round is a second or later build in the process (one warm-up
round first): a fresh process's first build also pays for loading the
kernels from Numba's cache and for memory the OS has not handed out
before. The p=1024 m=8192 tables hold 17M to 50M ops and need up to about
4 GB.
"""

import pytest
from sizes import pick

import pipecore as pc
from pipecore.schedules import generate, hanayo

P, M = pick((1024, 8192), (16, 64))


# Families defined only at smaller sizes (name -> the reason a user reads in the skip).
_SMALL_ONLY = {}


@pytest.mark.parametrize("name", [
    pytest.param(n, marks=pytest.mark.skip(reason=_SMALL_ONLY[n])) if n in _SMALL_ONLY and P * M > 2**20
    else n for n in pc.schedules()])
def test_build_at_scale(benchmark, name):
    benchmark.group = f"build p={P} m={M}"
    benchmark.name = name
    sched = benchmark.pedantic(pc.build, (name, P, M), rounds=pick(3, 1), iterations=1,
                               warmup_rounds=pick(1, 0))
    assert sched.devices == P and sched.microbatches == M


GREEDY_P, GREEDY_M = pick((16, 128), (4, 16))


def test_greedy(benchmark):
    placement = hanayo.wave_placement(GREEDY_P, 1)
    benchmark.group = f"greedy (hanayo W=1) p={GREEDY_P} m={GREEDY_M}"
    benchmark.name = "generate.greedy (kernel path, validated table)"
    generate.greedy(placement, GREEDY_M)  # compile / load from cache outside the timing
    got = benchmark(generate.greedy, placement, GREEDY_M)
    assert got.table.equals(generate._greedy_python([int(d) for d in placement], GREEDY_M,
                                                       "greedy").table)


def test_greedy_reference(benchmark):
    placement = [int(d) for d in hanayo.wave_placement(GREEDY_P, 1)]
    benchmark.group = f"greedy (hanayo W=1) p={GREEDY_P} m={GREEDY_M}"
    benchmark.name = "reference (pure Python heap loop)"
    benchmark.pedantic(generate._greedy_python, (placement, GREEDY_M, "greedy"),
                       rounds=pick(3, 1), iterations=1)

"""Issue 41's construction bar: ``pc.compose(preset, p, m)`` within 2x of
``pc.build(family, p, m)`` at p=1024, m=8192, for every preset.

Run: pytest bench/test_bench_compose.py --benchmark-only --benchmark-group-by=group

Both sides in one run, each group a preset (compose vs build), second and
later rounds after one warm-up round (the first call in a process also
loads kernels from Numba's cache and touches fresh memory). The tables hold
17M to 50M ops and need up to about 4 GB. Rounds in one process also time
how much memory the previous call freed the allocator hands back, which
favours whichever side follows a larger free: the bar's figures come from
bench/compose_fresh.py, one call per fresh process.
"""

import pytest
from sizes import pick

import pipecore as pc
from pipecore.schedules.compose import presets

P, M = pick((1024, 8192), (16, 64))


@pytest.mark.parametrize("how", ["compose", "build"])
@pytest.mark.parametrize("name", presets())
def test_compose_against_build(benchmark, name, how):
    benchmark.group = f"{name} p={P} m={M}"
    benchmark.name = how
    make = pc.compose if how == "compose" else pc.build
    sched = benchmark.pedantic(make, (name, P, M), rounds=pick(3, 1), iterations=1,
                               warmup_rounds=pick(1, 0))
    assert sched.devices == P and sched.microbatches == M


EXPLORE_P, EXPLORE_M = pick((8, 32), (2, 4))


@pytest.mark.parametrize("fb", [1.0, 0.7])
def test_explore_screening(benchmark, fb):
    """Issue 41's search bar: pc.explore(8, 32, ...) evaluates >= 10,000
    compositions in under 10 s; this times the screening (every composition
    built and timed with the costs, those over the limit again with every
    stage recomputed), the part that grows with the space. With fb_factor
    0.7 the space holds the overlapped F&B units too (3,060 more at p=8)."""
    from pipecore.search import explore as ex

    costs = pc.Costs(f=1.0, b=1.2, w=0.8, comm=0.05, fb_factor=fb)
    space = ex.default_space(EXPLORE_P, EXPLORE_M, overlap=fb < 1)
    benchmark.group = f"explore p={EXPLORE_P} m={EXPLORE_M}"
    benchmark.name = f"screen {len(space)} compositions" + (f" (fb_factor {fb})" if fb < 1 else "")
    splits = ex._Splits(None, None, costs, None)
    rows = benchmark.pedantic(ex._screen, (space, EXPLORE_M, splits, 6.0, False, True),
                              rounds=pick(3, 1), iterations=1, warmup_rounds=pick(1, 0))
    assert sum(not r["recompute"] for r in rows) == len(space)
    benchmark.extra_info["timings"] = len(rows)


def test_explore_end_to_end(benchmark):
    """The whole call: screening, full simulations of the best, recompute,
    polish and tune."""
    costs = pc.Costs(f=1.0, b=1.2, w=0.8, comm=0.05)
    benchmark.group = f"explore p={EXPLORE_P} m={EXPLORE_M}"
    benchmark.name = "pc.explore (with tune)"
    got = benchmark.pedantic(pc.explore, (EXPLORE_P, EXPLORE_M, costs),
                             {"memory_limit": 6.0, "progress": False},
                             rounds=pick(3, 1), iterations=1, warmup_rounds=pick(1, 0))
    assert got.result.makespan > 0


def test_compose_fresh_script_runs(capsys):
    """bench/compose_fresh.py (the bar's figures, one call per fresh process)
    at a small shape, so the script cannot rot."""
    import compose_fresh

    compose_fresh.main(["--rounds", "1", "-p", "4", "-m", "8", "1f1b"])
    out = capsys.readouterr().out
    assert "1f1b" in out and "compose/build" in out

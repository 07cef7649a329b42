"""Issue 52, part 5: ``pc.simulate`` of interleaved 1F1B (v=2) at p=1024,
m=8192 on a contended network within 1.5x of 1F1B's, in the same run.

Run: pytest bench/test_bench_interleaved.py --benchmark-only

Interleaved with v=2 has twice 1F1B's ops (33.6M against 16.8M), each half
the work; the summary prints each family's median and the ratio of the
interleaved median over 1F1B's. Both schedules are built once, outside the
timing; each round is one ``pc.simulate`` call on a built schedule:

* "simulate" rounds reuse what the schedule derives once for every
  simulation of it (its units and transfer classes, ``Structure.memo``);
* "first simulate" rounds forget those first, as a simulation right after
  ``pc.build`` pays for them.

Timings are CPU seconds of this process (``time.process_time``): on a
machine shared with other work, wall time also counts the time the process
waits for a core. Both schedules stay in memory together, about 5 GB.
"""

import time

import pytest
from sizes import pick

import pipecore as pc

P, M = pick((1024, 8192), (16, 64))
COSTS = pc.Costs(f=1.0, b=2.0, w=0.0, comm=0.0)
NETWORK = pc.Network.uniform(bytes=1.0, bandwidth=2.0, latency=0.1)  # contended links
FAMILIES = {"1f1b": 1, "interleaved-1f1b": 2}
_built = {}


def _schedule(name):
    if name not in _built:
        _built[name] = pc.build(name, P, M, chunks=FAMILIES[name])
    return _built[name]


def _forget(sched):
    # What simulate derives once per schedule: made again in the next call.
    info = sched._info()
    info.memo.clear()
    info.__dict__.pop("op_code", None)


@pytest.mark.benchmark(timer=time.process_time)
@pytest.mark.parametrize("first", [False, True], ids=["simulate", "first-simulate"])
@pytest.mark.parametrize("name", list(FAMILIES))
def test_simulate_contended(benchmark, name, first):
    sched = _schedule(name)
    pc.simulate(sched, COSTS, NETWORK)  # kernels loaded outside the timing
    label = "first simulate after build" if first else "simulate"
    benchmark.group = f"{label}: interleaved v=2 vs 1f1b, p={P} m={M}, contended network"
    benchmark.name = f"pc.simulate {name}"
    # The summary's ratio: each row of the group over this one.
    benchmark.extra_info["baseline"] = name == "1f1b"
    res = benchmark.pedantic(pc.simulate, (sched, COSTS, NETWORK), rounds=pick(5, 1),
                             iterations=1, setup=(lambda: _forget(sched)) if first else None)
    assert res.makespan > 0

"""bench/limit.py, the speed issue's limit kernel, against simulate_many.

The limit kernel computes only finish times from F/B/W dependencies; with
comm-only costs (no network) simulate_many's makespans must equal its own
bit for bit, or the fraction bench/ reports would compare different work.
"""

import os
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipecore as pc

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
from limit import Limit  # noqa: E402

# Run once more with Numba's bounds checking on in CI (.ci/run selects by this mark).
pytestmark = pytest.mark.kernels

CASES = [("zb-h1", 8, 32), ("1f1b", 8, 32), ("1f1b", 16, 64), ("gpipe", 4, 8), ("zb-h2", 4, 12),
         ("interleaved-1f1b", 4, 8), ("zb-v", 4, 8), ("looped-bfs", 4, 8), ("eager-1f1b", 5, 7)]


def _costs(n, seed):
    rng = np.random.default_rng(seed)
    return (rng.uniform(0.1, 3, n), rng.uniform(0.1, 3, n), rng.uniform(0, 2, n),
            rng.choice([0.0, 0.05, 0.3], n))


@pytest.mark.parametrize("name,p,m", CASES)
def test_limit_equals_simulate_many_bit_for_bit(name, p, m):
    sched = pc.build(name, p, m)
    f, b, w, comm = _costs(200, 1)  # 200: three full groups of 64 and a partial one
    ours = Limit(sched).makespans(f, b, w, comm)
    many = pc.simulate_many(sched, {"f": f, "b": b, "w": w, "comm": comm})
    assert np.array_equal(ours, many.column("makespan").to_numpy())


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(["1f1b", "zb-h1", "zb-h2", "gpipe", "interleaved-1f1b", "zb-v"]),
       p=st.integers(2, 6), m=st.integers(1, 12), seed=st.integers(0, 2**16))
def test_limit_equals_simulate_one_config(name, p, m, seed):
    try:
        sched = pc.build(name, p, m)
    except ValueError:
        return  # a shape the family cannot build
    f, b, w, comm = _costs(3, seed)
    ours = Limit(sched).makespans(f, b, w, comm)
    for k in range(3):
        # pc.simulate is the independent path here (the list scheduler, not the replay).
        res = pc.simulate(sched, pc.Costs(f=f[k], b=b[k], w=w[k], comm=comm[k]))
        assert ours[k] == res.makespan


def test_limit_refuses_what_it_does_not_model():
    sched = pc.recompute(pc.build("1f1b", 4, 8), stages=[0])
    with pytest.raises(ValueError, match="F, B, W, BW ops only"):
        Limit(sched)

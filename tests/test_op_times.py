"""Costs.bw (fused backward) and Costs.overhead (per compute op): closed
forms, defaults bit-identical, and simulate_many agreeing with simulate."""

import numpy as np
import pytest

import pipecore as pc

FAMILIES = ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipev", "looped-bfs"]


@pytest.mark.parametrize("p,m", [(2, 4), (4, 8), (3, 5)])
@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
def test_fused_backward_and_overhead_closed_form(name, p, m):
    # GPipe and 1F1B on equal stages without comm run (m + p - 1) forwards and
    # (m + p - 1) fused backwards on the critical path: each op pays overhead.
    f, bw, o = 1.0, 1.75, 0.25
    res = pc.simulate(pc.build(name, p, m), pc.Costs(f=f, b=2.0, w=0.5, bw=bw, overhead=o))
    assert res.makespan == pytest.approx((m + p - 1) * (f + o + bw + o), rel=1e-12)


def test_overhead_counts_once_per_chunk_op():
    # Interleaved with v chunks: a chunk's forward takes f / v + overhead (not divided by v).
    p, m, v, f, o = 2, 4, 2, 1.0, 0.5
    sched = pc.build("interleaved-1f1b", p, m, chunks=v)
    res = pc.simulate(sched, pc.Costs(f=f, b=0.0, w=0.0, overhead=o))
    finish = res.ops.to_pydict()
    first = [t for k, s, t in zip(finish["kind"], finish["stage"], finish["finish"])
             if k == "F" and s == 0]
    assert min(first) == pytest.approx(f / v + o)


def test_split_backward_unaffected_by_bw():
    # zb-h1 has only B and W ops: bw must not change anything there.
    sched = pc.build("zb-h1", 4, 8)
    a = pc.simulate(sched, pc.Costs(f=1.0, b=1.0, w=1.0))
    b = pc.simulate(sched, pc.Costs(f=1.0, b=1.0, w=1.0, bw=0.1))
    np.testing.assert_array_equal(a.finish, b.finish)


@pytest.mark.parametrize("name", FAMILIES)
def test_defaults_bit_identical(name):
    # Explicit defaults (bw = b + w, overhead 0) give exactly the old times.
    sched = pc.build(name, 4, 8)
    base = pc.Costs(f=1.1, b=2.3, w=0.7, comm=0.3)
    same = pc.Costs(f=1.1, b=2.3, w=0.7, comm=0.3, overhead=0.0)
    a, b = pc.simulate(sched, base), pc.simulate(sched, same)
    np.testing.assert_array_equal(a.start, b.start)
    np.testing.assert_array_equal(a.finish, b.finish)


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v",
                                  "looped-bfs"])
@pytest.mark.parametrize("method", ["replay", "list"])
def test_simulate_many_agrees_with_simulate(name, method):
    sched = pc.build(name, 4, 8)
    rows = [(1.0, 2.0, 0.5, 1.5, 0.0), (1.0, 2.0, 0.5, 2.5, 0.25), (0.7, 1.3, 0.9, 1.0, 0.125),
            (1.0, 1.0, 1.0, 2.0, 0.0)]
    f, b, w, bw, o = (np.array(c) for c in zip(*rows))
    table = pc.simulate_many(sched, {"f": f, "b": b, "w": w, "bw": bw, "overhead": o,
                                     "comm": np.full(4, 0.1)}, method=method)
    got = table.column("makespan").to_numpy()
    for i in range(len(rows)):
        want = pc.simulate(sched, pc.Costs(f=f[i], b=b[i], w=w[i], bw=bw[i], overhead=o[i],
                                           comm=0.1)).makespan
        assert got[i] == want  # 1 or 2 chunks per device: bit for bit
    np.testing.assert_array_equal(table.column("bw").to_numpy(), bw)
    np.testing.assert_array_equal(table.column("overhead").to_numpy(), o)
    np.testing.assert_array_equal(table.column("b").to_numpy(), b)


def test_simulate_many_refuses_mixed_backward_with_overhead():
    sched = pc.build("dualpipev", 4, 8)
    with pytest.raises(ValueError, match=r"row 1: .*both fused BW ops and split B/W.*overhead=0.5"):
        pc.simulate_many(sched, {"f": [1.0, 1.0], "overhead": [0.0, 0.5]})
    # Defaults still run there.
    t = pc.simulate_many(sched, {"f": [1.0], "overhead": [0.0]})
    assert t.column("makespan")[0].as_py() == pc.simulate(sched, pc.Costs(f=1.0)).makespan


@pytest.mark.parametrize("field,value,match", [
    ("bw", -1.0, r"Costs 'bw' must be >= 0"),
    ("overhead", float("nan"), r"Costs 'overhead' must be finite"),
    ("overhead", [0.1, -0.2], r"Costs 'overhead'\[1\] must be finite and >= 0"),
])
def test_bad_values_named(field, value, match):
    with pytest.raises(ValueError, match=match):
        pc.Costs(**{field: value})


def test_vector_overhead_length_checked():
    with pytest.raises(ValueError, match=r"'overhead' has 3 entries but the schedule has 4 stages"):
        pc.simulate(pc.build("1f1b", 4, 4), pc.Costs(overhead=[0.1, 0.1, 0.1]))


def test_simulate_many_bad_column_named():
    with pytest.raises(ValueError, match=r"column 'overhead' row 1: must be finite and >= 0"):
        pc.simulate_many(pc.build("1f1b", 2, 2), {"overhead": [0.0, -1.0]})

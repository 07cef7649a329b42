"""Golden values from closed forms that live outside pipecore.

Sources: ../shared/FIELD.md's table of families and issue 2's bars, which
restate the classic results: GPipe (Huang et al. 2019) and 1F1B
(PipeDream-flush, Narayanan et al. 2021) take (m + p - 1)(T_F + T_B + T_W);
Megatron's interleaved schedule (Narayanan et al., SC'21) cuts the bubble to
(p - 1)(T_F + T_B + T_W) / v. Every expected number below is computed in the
test from those formulas, never from pipecore.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipecore as pc

# Run once more with Numba's bounds checking on in CI (.ci/run selects by this mark).
pytestmark = pytest.mark.kernels


@pytest.mark.parametrize("name", ["gpipe", "1f1b"])
@pytest.mark.parametrize("p,m,expected", [(4, 8, 33.0), (8, 32, 117.0)])
def test_gpipe_1f1b_makespan_issue_bar(name, p, m, expected):
    # Issue 2 bar: f=1, b=2, comm=0 gives (m + p - 1) * 3.
    assert (m + p - 1) * 3 == expected
    res = pc.simulate(pc.build(name, devices=p, microbatches=m),
                      pc.Costs(f=1.0, b=2.0, w=0.0, comm=0.0))
    assert res.makespan == expected


def test_issue_example_1f1b():
    sched = pc.build("1f1b", devices=4, microbatches=8)
    res = pc.simulate(sched, pc.Costs(f=1.0, b=2.0, w=0.0, comm=0.0))
    assert res.makespan == 33.0
    assert res.ops.column_names == ["device", "slot", "kind", "stage", "microbatch",
                                    "start", "finish"]
    assert res.ops.num_rows == 2 * 4 * 8
    # 1F1B peak: p*M on device 0 and 1*M on the last (FIELD.md: p - i on device i).
    np.testing.assert_array_equal(res.peak_activation, [4.0, 3.0, 2.0, 1.0])
    assert set(pc.schedules()) >= {"gpipe", "1f1b", "eager-1f1b", "interleaved-1f1b", "looped-bfs"}


@pytest.mark.parametrize("p,m", [(4, 8), (8, 32), (3, 5)])
def test_gpipe_peak_is_m(p, m):
    # FIELD.md: GPipe holds every microbatch's activation at the flush: m*M.
    res = pc.simulate(pc.build("gpipe", p, m), pc.Costs())
    np.testing.assert_array_equal(res.peak_activation, np.full(p, float(m)))


def test_interleaved_issue_bar():
    # Issue 2 bar: v=2, chunk times F=1, B=2 (Costs f=2, b=4): 3*v*m + 3(p-1); p=4, m=8 -> 57.
    p, m, v = 4, 8, 2
    assert 3 * v * m + 3 * (p - 1) == 57
    res = pc.simulate(pc.build("interleaved-1f1b", p, m, chunks=v), pc.Costs(f=2.0, b=4.0))
    assert res.makespan == 57.0


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 8), k=st.integers(1, 4), v=st.integers(1, 4),
       f=st.sampled_from([0.5, 1.0, 2.0, 3.0]), b=st.sampled_from([0.5, 1.0, 2.0, 4.0]),
       w=st.sampled_from([0.0, 0.5, 1.0]))
def test_interleaved_closed_form(p, k, v, f, b, w):
    # Megatron (SC'21): makespan m(F+B+W) + (p-1)(F+B+W)/v for m a multiple of p.
    m = p * k
    res = pc.simulate(pc.build("interleaved-1f1b", p, m, chunks=v), pc.Costs(f=f, b=b, w=w))
    t = f + b + w
    assert res.makespan == pytest.approx(m * t + (p - 1) * t / v, rel=1e-12)
    # Megatron's warm-up is 2(p-d-1) + (v-1)p chunk forwards, so device 0 peaks at
    # (p(v+1) - 1)/v microbatches = p + (p-1)/v (FIELD.md: p*M*(1+(p-1)/(p*v))), capped at m.
    expected0 = m if m == p else min((2 * (p - 1) + (v - 1) * p + 1) / v, m)
    assert res.peak_activation[0] == pytest.approx(expected0)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(["gpipe", "1f1b", "eager-1f1b"]), p=st.integers(1, 8),
       m=st.integers(1, 20), f=st.sampled_from([0.5, 1.0, 2.0]),
       b=st.sampled_from([0.25, 1.0, 2.0, 3.0]), w=st.sampled_from([0.0, 1.0]))
def test_linear_families_closed_form(name, p, m, f, b, w):
    res = pc.simulate(pc.build(name, p, m), pc.Costs(f=f, b=b, w=w))
    assert res.makespan == pytest.approx((m + p - 1) * (f + b + w), rel=1e-12)
    # Bubble ratio 1 - busy/(p * makespan) = (p-1)/(m+p-1) for these families.
    assert res.bubble_ratio == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
    d = np.arange(p)
    expected = {"gpipe": np.full(p, m), "1f1b": np.minimum(p - d, m),
                "eager-1f1b": np.minimum(2 * (p - d) - 1, m)}[name]
    np.testing.assert_array_equal(res.peak_activation, expected.astype(float))


@settings(max_examples=40, deadline=None)
@given(p=st.integers(1, 8), m=st.integers(1, 20), v=st.integers(1, 4))
def test_looped_bfs(p, m, v):
    # BFS (Lamy-Poirier): for m >= p the interleaved bubble (p-1)(F+B)/v; each
    # chunk pass with m < p waits a full lap of p ops. Peak: all m microbatches.
    f, b = 1.0, 2.0
    res = pc.simulate(pc.build("looped-bfs", p, m, chunks=v), pc.Costs(f=f, b=b))
    expected = ((v - 1) * max(m, p) + m + p - 1) * (f + b) / v
    if m >= p:
        assert expected == pytest.approx(m * (f + b) + (p - 1) * (f + b) / v)
    assert res.makespan == pytest.approx(expected, rel=1e-12)
    # v chunks of M/v each: equal to m up to rounding of M/v.
    np.testing.assert_allclose(res.peak_activation, np.full(p, float(m)), rtol=1e-12)


def test_chunk_costs_and_static_memory():
    # A scalar cost is per device share: with v chunks each stage takes f/v.
    res = pc.simulate(pc.build("looped-bfs", 2, 4, chunks=2), pc.Costs(f=2.0, b=4.0, weights=3.0))
    ops = res.ops.to_pydict()
    durations = {(k, round(fi - st_, 9)) for k, st_, fi in zip(ops["kind"], ops["start"], ops["finish"])}
    assert durations == {("F", 1.0), ("BW", 2.0)}
    # Static memory: weights per device share, counted once per distinct stage.
    np.testing.assert_array_equal(res.static_memory, [3.0, 3.0])


def test_comm_latency_adds_per_hop():
    # 1F1B with a latency c per transfer: each of the 2(p-1) hops on the
    # critical path of the first and last microbatch adds c (FIELD.md notes the
    # same for ZB-H2's bubble). For GPipe the fill and drain each cross p-1 links.
    p, m, c = 4, 6, 0.5
    res = pc.simulate(pc.build("gpipe", p, m), pc.Costs(f=1.0, b=2.0, comm=c))
    assert res.makespan == pytest.approx((m + p - 1) * 3 + 2 * (p - 1) * c)

"""Zero-bubble schedules against the closed forms of Qi et al., "Zero Bubble
Pipeline Parallelism" (ICLR 2024), section 3 and FIELD.md:
ZB-H1 bubble (p-1)(T_F+T_B-T_W) with 1F1B's peak p*M_B; ZB-H2 bubble
(p-1)(T_F+T_B-2T_W) (zero at equal times) with peak (2p-1)*M_B.
Bubbles use the paper's definition: idle time within the longest per-device
span. Expected values are computed here from those formulas."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipecore as pc

TIMES = st.sampled_from([0.5, 1.0, 1.5, 2.0, 3.0])


def span_bubble(res):
    return float((res.span - res.busy).max())


@pytest.mark.parametrize("p", [2, 4, 6, 8, 16])
def test_unit_times(p):
    m = 4 * p
    c = pc.Costs(f=1.0, b=1.0, w=1.0, activation=1.0, activation_w=0.5)
    h1 = pc.simulate(pc.build("zb-h1", p, m), c)
    h2 = pc.simulate(pc.build("zb-h2", p, m), c)
    assert span_bubble(h1) == (p - 1) * (1.0 + 1.0 - 1.0)
    assert span_bubble(h2) == 0.0 and h2.bubble_rate == 0.0
    # ZB-H1 keeps 1F1B's memory: p*M_B on device 0.
    assert h1.peak_activation[0] == p * 1.0 and h1.peak_activation.max() == p * 1.0


@pytest.mark.parametrize("p", [4, 6, 8, 16])
def test_zb_h2_peak_is_2p_minus_1(p):
    # Issue 3 bar: ZB-H2 holds 2p-1 microbatches (M_B each) on device 0, m = 4p.
    for act_w in (0.0, 0.3, 1.0):
        res = pc.simulate(pc.build("zb-h2", p, 4 * p),
                          pc.Costs(f=1.0, b=1.0, w=1.0, activation=1.0, activation_w=act_w))
        assert res.peak_activation.max() == 2 * p - 1


@settings(max_examples=80, deadline=None)
@given(p=st.integers(1, 8), k=st.integers(1, 4), f=TIMES, b=TIMES, w=TIMES,
       aw=st.sampled_from([0.0, 0.25, 0.5, 1.0]))
def test_zb_h1_closed_form(p, k, f, b, w, aw):
    # The paper's bubble holds when T_W <= T_F (with T_W > T_F the cool-down
    # has more W than it has gaps to hide them in); checked for m >= p.
    m = k * p
    res = pc.simulate(pc.build("zb-h1", p, m), pc.Costs(f=f, b=b, w=w, activation_w=aw))
    assert res.peak_activation[0] == min(p, m)
    assert res.peak_activation.max() <= p
    if w <= f:
        assert span_bubble(res) == pytest.approx((p - 1) * (f + b - w), abs=1e-9)


@settings(max_examples=80, deadline=None)
@given(p=st.integers(1, 8), k=st.integers(2, 4), f=TIMES, b=TIMES, w=TIMES)
def test_zb_h2_closed_form(p, k, f, b, w):
    # Holds when T_B <= T_F and m >= 2p (enough microbatches to fill the warm-up).
    m = k * p
    res = pc.simulate(pc.build("zb-h2", p, m), pc.Costs(f=f, b=b, w=w))
    if b <= f:
        assert span_bubble(res) == pytest.approx(max(0.0, (p - 1) * (f + b - 2 * w)), abs=1e-9)


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(["zb-h1", "zb-h2"]), p=st.integers(1, 8), m=st.integers(1, 24),
       f=TIMES, b=TIMES, w=TIMES, aw=st.sampled_from([0.0, 0.5, 1.0]))
def test_formula_module_when_exact(name, p, m, f, b, w, aw):
    c = pc.Costs(f=f, b=b, w=w, activation_w=aw)
    sched = pc.build(name, p, m)
    res = pc.simulate(sched, c)
    fm = pc.formula(sched, c)
    # Peaks follow from the program order for any costs.
    np.testing.assert_allclose(res.peak_activation, fm["peak_activation"], rtol=1e-12)
    if fm["exact"]:
        assert res.makespan == pytest.approx(fm["makespan"], abs=1e-9)
        assert span_bubble(res) == pytest.approx(fm["bubble_time"], abs=1e-9)


def test_split_ops_and_memory_release():
    sched = pc.build("zb-h1", 2, 3)
    kinds = set(sched.table.column("kind").to_pylist())
    assert kinds == {"F", "B", "W"}
    res = pc.simulate(sched, pc.Costs(f=1.0, b=1.0, w=1.0, activation=2.0, activation_w=0.5))
    mem = res.memory.to_pydict()
    # Every device returns to zero; B releases M_B - M_W = 1.5, W the last 0.5.
    for d in (0, 1):
        series = [v for dev, v in zip(mem["device"], mem["activation"]) if dev == d]
        assert series[-1] == 0.0 and min(series) >= 0.0

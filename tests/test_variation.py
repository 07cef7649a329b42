"""Stragglers, jitter, Monte Carlo and what-if (issue 8, parts 3 and 4).

Golden values: GPipe with one slow device is a tandem line whose makespan
is worked out in the test; the batched Monte Carlo must equal pc.simulate
draw by draw, bit for bit (the same arithmetic), and simulate itself is
checked against the oracle elsewhere.
"""

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipecore as pc
from pipecore.testing import costs as cost_strategy
from pipecore.testing import family_schedules, networks


@pytest.mark.parametrize("slow", [0, 1, 3])
@pytest.mark.parametrize("s", [1.0, 1.5, 2.0])
def test_gpipe_with_a_straggler_is_a_tandem_line(slow, s):
    # GPipe, no communication: forwards pass devices 0..p-1 like a tandem
    # queue, so the last forward ends at sum_d f_d + (m - 1) max_d f_d, and
    # the backwards likewise from there. One device s times slower (s >= 1):
    # makespan (p - 1 + m s)(f + b); (m + p - 1)(f + b) without it.
    p, m, f, b = 4, 8, 1.0, 2.0
    res = pc.simulate(pc.build("gpipe", p, m), pc.Costs(f=f, b=b), stragglers={slow: s})
    assert res.makespan == pytest.approx((p - 1 + m * s) * (f + b))
    w = pc.what_if(res)
    assert w.counterfactual == pytest.approx((m + p - 1) * (f + b))
    assert w.saved == pytest.approx(m * (s - 1) * (f + b))
    assert set(w.per_device) == ({slow} if s != 1.0 else set())
    if s != 1.0:
        assert w.per_device[slow] == pytest.approx(w.saved)
        assert f"device {slow}" in w.report()
        assert f"device {slow}" in w._repr_html_() and len(repr(w)) < 120
    # The critical path: in each direction the tandem line's longest path
    # runs all m cells on the slowest device and one cell on each other one,
    # so with s > 1 the slow device computes m s (f + b) of the path.
    share = {r["device"]: r for r in w.share.to_pylist()}
    assert sum(r["total"] for r in share.values()) == pytest.approx(res.makespan)
    if s > 1.0:
        assert share[slow]["compute"] == pytest.approx(m * s * (f + b))


def test_what_if_attributes_two_stragglers():
    # Two slow devices in GPipe: the tandem line's makespan is
    # sum_d t_d + (m - 1) max_d t_d per direction, with t_d = s_d (f + b)
    # summed over F and B. Restoring only the milder one (1.2) removes its
    # one cell on the path: 0.2 (f + b) = 0.6; restoring only the slower
    # one leaves the milder one's pace: (p - 1 + m * 1.2)(f + b).
    p, m = 4, 8
    res = pc.simulate(pc.build("gpipe", p, m), pc.Costs(f=1.0, b=2.0), stragglers={1: 1.2, 2: 1.5})
    assert res.makespan == pytest.approx((1 + 1.2 + 1.5 + 1 + 7 * 1.5) * 3.0)
    w = pc.what_if(res)
    assert w.per_device[1] == pytest.approx(0.2 * 3.0)
    assert res.makespan - w.per_device[2] == pytest.approx((p - 1 + m * 1.2) * 3.0)


def test_what_if_uses_the_stragglers_the_result_was_simulated_with():
    # Found 2026-11-25: the result kept the caller's dict, so reusing it for
    # another scenario changed what what_if replayed. Same closed form as
    # the test above.
    p, m = 4, 8
    slow = {1: 1.2, 2: 1.5}
    res = pc.simulate(pc.build("gpipe", p, m), pc.Costs(f=1.0, b=2.0), stragglers=slow)
    slow[1] = 3.0
    del slow[2]
    w = pc.what_if(res)
    assert w.per_device[1] == pytest.approx(0.2 * 3.0)
    assert res.makespan - w.per_device[2] == pytest.approx((p - 1 + m * 1.2) * 3.0)


@settings(max_examples=40, deadline=None)
@given(sched=family_schedules(max_devices=6, max_microbatches=12, recompute=True), data=st.data())
def test_monte_carlo_equals_simulate_draw_by_draw(sched, data):
    c = data.draw(cost_strategy(stages=sched.stages))
    net = data.draw(networks(devices=sched.devices))
    jitter = data.draw(st.sampled_from([
        pc.Jitter.lognormal(0.1, seed=3), pc.Jitter.normal(0.2, seed=4, per="microbatch"),
        pc.Jitter.seqlen([512, 1024, 4096], attention_share=0.3, seed=5)]))
    strag = data.draw(st.none() | st.just({0: 1.25}))
    first = data.draw(st.integers(0, 300))
    mc = pc.monte_carlo(sched, c, jitter, draws=5, network=net, stragglers=strag, first=first)
    for k in range(5):
        res = pc.simulate(sched, c, net, stragglers=strag, jitter=jitter, draw=first + k)
        assert mc.makespans[k] == res.makespan


def test_draws_are_reproducible_across_calls_and_blocks():
    sched = pc.build("zb-h1", 4, 8)
    j = pc.Jitter.lognormal(0.1, seed=7)
    all_ = pc.monte_carlo(sched, pc.Costs(f=1, b=1, w=1), j, draws=600).makespans
    part = pc.monte_carlo(sched, pc.Costs(f=1, b=1, w=1), j, draws=100, first=250).makespans
    np.testing.assert_array_equal(part, all_[250:350])  # crosses the 256-draw block boundary
    other = pc.monte_carlo(sched, pc.Costs(f=1, b=1, w=1), pc.Jitter.lognormal(0.1, seed=8),
                           draws=600).makespans
    assert not np.array_equal(other, all_)


def test_zero_spread_is_the_plain_simulation():
    sched = pc.build("interleaved-1f1b", 4, 8, chunks=2)
    c = pc.Costs(f=1.0, b=2.0, comm=0.1)
    mc = pc.monte_carlo(sched, c, pc.Jitter.lognormal(0.0), draws=70)
    assert set(mc.makespans.tolist()) == {pc.simulate(sched, c).makespan}


def test_factors_have_the_stated_distribution():
    sched = pc.build("1f1b", 8, 32)
    fac = pc.Jitter.lognormal(0.2, seed=1).draw(sched, 512)
    assert abs(fac.mean() - 1.0) < 0.01  # mean 1 by construction (sd of the mean ~0.0004)
    assert abs(np.log(fac).std() - 0.2) < 0.005
    per_mb = pc.Jitter.normal(0.1, seed=2, per="microbatch").draw(sched, 3)
    mb = sched._column("microbatch")
    for j in range(32):  # every op of a microbatch shares its factor
        assert np.all(per_mb[mb == j] == per_mb[mb == j][0])
    # Sequence lengths 1 and 3 (mean 2), attention share 0.5:
    # 0.5 * 0.5 + 0.5 * 0.25 = 0.375 and 0.5 * 1.5 + 0.5 * 2.25 = 1.875.
    assert pc.Jitter.seqlen([1, 3], attention_share=0.5).factors == (0.375, 1.875)


def test_packed_sequences():
    # Documents of 100 or 300 tokens (each drawn with probability 1/2)
    # packed into 400-token microbatches, the last document cut to fit:
    # 100+100+100+100 (or a 300 cut to 100 last) gives a sum of squares
    # Q = 40,000; 100+100+(300 cut to 200) gives 60,000; 100+300, 300+100
    # and 300+(300 cut to 100) give 100,000. Tokens are always 400, so with
    # no attention share every factor is 1; with all of it the factors are
    # Q / mean(Q), whose ratios to the smallest are 1, 1.5 and 2.5.
    flat = pc.Jitter.seqlen([100, 300], attention_share=0.0, packed=400, pool=200)
    assert set(flat.factors) == {1.0}
    full = pc.Jitter.seqlen([100, 300], attention_share=1.0, packed=400, pool=200)
    q = np.array(full.factors)
    assert abs(q.mean() - 1.0) < 1e-12
    assert {round(x / q.min(), 9) for x in q} == {1.0, 1.5, 2.5}


def test_quantiles():
    mc = pc.MonteCarlo(np.arange(1.0, 102.0), pc.Jitter())
    assert (mc.p50, mc.p90, mc.p99) == (51.0, 91.0, 100.0)  # numpy's linear quantiles of 1..101
    assert mc.summary()["draws"] == 101


def test_what_if_report_says_more_when_removing_made_it_slower():
    # A list schedule can slow down when an op speeds up (Graham's anomalies):
    # the report must not print "-10.0% less".
    w = pc.WhatIf(makespan=10.0, counterfactual=11.0, per_device={2: -0.5, 3: 1.0},
                  removed="stragglers")
    lines = w.report().splitlines()
    assert lines[0] == ("iteration 10; without stragglers: 11 (10.0% more); times in the "
                        "costs' units")
    assert lines[1] == "  device 3: 1 of it (iteration 9 if only this device ran at normal speed)"
    assert lines[2] == ("  device 2: none of it; at normal speed alone it would make the iteration "
                        "0.5 longer (10.5)")


def _texts(svg):
    return re.findall(r"<text[^>]*>([^<]*)</text>", svg)


def test_monte_carlo_html_states_quantiles_units_and_draws():
    """Issue 37 item 6: a Monte Carlo result shows itself in Jupyter."""
    mc = pc.MonteCarlo(np.arange(1.0, 102.0), pc.Jitter.lognormal(0.05, seed=3), seconds=0.25)
    page = mc._repr_html_()
    # numpy's linear quantiles of 1..101 (test_quantiles): 51, 91, 100.
    assert ("101 draws (lognormal jitter, sigma 0.05, one factor per op, seed 3) in 0.25 s<br>"
            "iteration time p50 <b>51</b>, p90 <b>91</b>, p99 <b>100</b> cost units") in page
    assert ">iteration time (cost units)</th>" in page and "+78.43%" in page  # p90 = 91 / 51 - 1
    svg = page[page.index("<svg"):]
    # 40 bins of 2.5 over [1, 101]: every one holds two or three draws.
    assert svg.count("<rect") == 40
    texts = _texts(svg)
    assert ["p50", "p90", "p99"] == [t for t in texts if t.startswith("p")]
    assert {"20", "40", "60", "80", "100"} <= set(texts) and "iteration time (cost units)" in texts
    assert "draws" in texts


def test_monte_carlo_html_without_spread():
    # Sigma 0: every draw is GPipe's (m + p - 1)(f + b) = 3 * 3 = 9.
    mc = pc.monte_carlo(pc.build("gpipe", 2, 2), pc.Costs(f=1.0, b=2.0),
                        pc.Jitter.lognormal(0.0), draws=20)
    page = mc._repr_html_()
    assert "20 draws" in page and "p50 <b>9</b>, p90 <b>9</b>, p99 <b>9</b> cost units" in page
    assert page[page.index("<svg"):].count("<rect") == 1


def test_offloaded_schedules_fall_back_to_one_simulation_per_draw():
    sched = pc.offload(pc.build("1f1b", 4, 8), stages=[0])
    c = pc.Costs(f=1.0, b=2.0, offload=0.5)
    j = pc.Jitter.lognormal(0.1, seed=2)
    mc = pc.monte_carlo(sched, c, j, draws=4)
    assert [pc.simulate(sched, c, jitter=j, draw=k).makespan for k in range(4)] == mc.makespans.tolist()


def test_errors():
    sched = pc.build("1f1b", 2, 4)
    with pytest.raises(ValueError, match="straggler device 5 is not one of 0..1"):
        pc.simulate(sched, pc.Costs(), stragglers={5: 1.2})
    with pytest.raises(ValueError, match="straggler factor of device 0 must be a finite number > 0"):
        pc.simulate(sched, pc.Costs(), stragglers={0: 0.0})
    with pytest.raises(ValueError, match="one entry per op"):
        pc.simulate(sched, pc.Costs(), stragglers=[1.0, 2.0])
    with pytest.raises(ValueError, match="'jitter' must be a pipecore.Jitter"):
        pc.simulate(sched, pc.Costs(), jitter=0.05)
    with pytest.raises(ValueError, match="'sigma' must be a finite number >= 0"):
        pc.Jitter.lognormal(-1.0)
    with pytest.raises(ValueError, match="'per' must be 'op' or 'microbatch'"):
        pc.Jitter.lognormal(0.1, per="device")
    with pytest.raises(ValueError, match="'attention_share' must be in"):
        pc.Jitter.seqlen([1, 2], attention_share=2.0)
    with pytest.raises(ValueError, match="'draws' must be >= 1"):
        pc.monte_carlo(sched, pc.Costs(), draws=0)
    with pytest.raises(ValueError, match="nothing to remove"):
        pc.what_if(pc.simulate(sched, pc.Costs()), remove_stragglers=False)

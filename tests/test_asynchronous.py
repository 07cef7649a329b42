"""Asynchronous pipelines (issue 54, family 4): PipeDream, PipeDream-2BW and
LayerPipe2 stream microbatches without a flush.

Golden values come from the papers' update rules and from hand-worked
schedules, never from pipecore's own closed forms:

- PipeDream (SOSP 2019, weight stashing): the update with n stages is
  W^(t+1) = W^(t) - lr grad f(W_1^(t-n+1), W_2^(t-n+2), ..., W_n^(t)), so stage s
  (0-based) computes on weights p - 1 - s steps old, and stashes one version per
  microbatch in flight: p - s on stage s under 1F1B (p - s in flight).
- PipeDream-2BW (ICML 2021, its 2BW update semantics): W^(t+1) = W^(t) - lr grad f(W^(t-1)),
  one step stale on every stage, with two weight versions.
- LayerPipe2 (arXiv:2512.08160, abstract; the issue's text): the delay of a
  layer is the number of pipeline stages downstream of it, p - 1 - s; storing
  the history costs those versions, a moving average one extra copy.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from reference_versions import reference_versions

import pipecore as pc
from pipecore.analysis.compare import peak_memory
from pipecore.analysis.steady import weight_versions
from pipecore.schedules.asynchronous import steady_forms

ASYNC = ("pipedream", "pipedream-2bw", "layerpipe2")


@st.composite
def streams(draw):
    name = draw(st.sampled_from(ASYNC))
    p = draw(st.integers(1, 7))
    options = {}
    k = 1
    if name == "pipedream-2bw":
        k = draw(st.integers(p, 2 * p + 2))
        options["accumulation"] = k
    if name == "layerpipe2":
        options["history"] = draw(st.sampled_from(["stash", "ema"]))
    m = draw(st.integers(1, 2 * p + 3 * k + 6))
    return name, p, m, k, options


@settings(max_examples=120, deadline=None)
@given(streams())
def test_staleness_read_from_the_order_equals_the_papers_rule(case):
    name, p, m, k, options = case
    sched = pc.build(name, p, m, **options)
    sync = "input" if name == "pipedream-2bw" else "stage"
    read = weight_versions(sched)
    version, held = reference_versions(sched, k, sync)
    # The package's vectorised reading agrees with the op-by-op walk everywhere.
    for (s, j), v in version.items():
        assert read.version[s, j] == v, (name, p, m, k, s, j)
    assert read.held.tolist() == [held[s] for s in range(p)]
    # Steady steps (every microbatch of the step past the first p): the papers' staleness.
    for s in range(p):
        for j in range(m):
            if (j // k) * k < p:
                continue
            want = 1 if name == "pipedream-2bw" and p > 1 else (
                0 if name == "pipedream-2bw" else p - 1 - s)
            assert read.staleness[s, j] == want, (name, p, m, k, s, j)
    # Versions held at once, once the stream is long enough to reach steady state.
    if m >= 2 * p + 2 * k:
        want = [2 if p > 1 else 1] * p if name == "pipedream-2bw" else [p - s for s in range(p)]
        assert read.held.tolist() == want


def test_steady_throughput_against_1f1b_hand_worked():
    # f = 1, b = 2, p = 4: in steady state every device runs one F and one BW per
    # microbatch, 3 time units; 1F1B with a flush every step of k microbatches
    # takes (k + p - 1) * 3 (its bubble is (p - 1) * 3).
    costs = pc.Costs(f=1, b=2)
    dream = pc.steady_state(pc.simulate(pc.build("pipedream", 4, 40), costs), microbatch_size=8)
    assert dream.iterations >= 10
    assert dream.iteration_time == pytest.approx(3.0)
    assert dream.samples_per_time == pytest.approx(8 / 3)
    two = pc.steady_state(pc.simulate(pc.build("pipedream-2bw", 4, 80), costs), microbatch_size=8)
    assert two.accumulation == 4 and two.iterations >= 10
    assert two.iteration_time == pytest.approx(12.0)  # 4 microbatches * 3
    flush = pc.steady_state(pc.simulate(pc.build("1f1b", 4, 4), costs), microbatch_size=8)
    assert flush.iteration_time == pytest.approx(21.0)  # (4 + 4 - 1) * 3
    assert two.samples_per_time / flush.samples_per_time == pytest.approx(21 / 12)
    assert not dream.flags and not two.flags
    assert steady_forms("pipedream-2bw", 4, costs=costs)["speedup"] == pytest.approx(21 / 12)


def test_steady_state_with_communication_is_device_0s_round_trip():
    # Hand-worked: device 0 keeps p = 4 microbatches in flight; one round trip is
    # 4 * (1 + 2) compute plus 3 hops each way of 0.5: 15 per 4 microbatches.
    res = pc.simulate(pc.build("pipedream", 4, 60), pc.Costs(f=1, b=2, comm=0.5))
    steady = pc.steady_state(res)
    assert steady.iteration_time == pytest.approx(15 / 4)
    assert not steady.flags


def test_weight_versions_are_in_the_memory_watermark():
    # p = 4, M = 1 per microbatch, weights 1 per stage. PipeDream on device 0:
    # 4 activations + 4 weight versions = 8; 2BW: 4 + 2; 1F1B: 4 + 1.
    costs = pc.Costs(f=1, b=2, activation=1, weights=1)
    dream = pc.simulate(pc.build("pipedream", 4, 12), costs)
    assert dream.static_memory.tolist() == [4, 3, 2, 1]
    assert peak_memory(dream) == 8
    assert peak_memory(pc.simulate(pc.build("pipedream-2bw", 4, 12), costs)) == 6
    assert pc.simulate(pc.build("1f1b", 4, 12), costs).static_memory.tolist() == [1, 1, 1, 1]
    # The batched kernels count the versions too.
    table = pc.simulate_many(pc.build("pipedream", 4, 12), {"f": [1.0], "b": [2.0]})
    assert table.column("memory_max").to_pylist() == [8.0]


def test_layerpipe2_moving_average_keeps_one_copy_beside_the_live_weights():
    costs = pc.Costs(f=1, b=2, weights=1)
    stash = pc.steady_state(pc.simulate(pc.build("layerpipe2", 4, 40), costs))
    ema = pc.steady_state(pc.simulate(pc.build("layerpipe2", 4, 40, history="ema"), costs))
    # Delays = stages downstream (3, 2, 1, 0) either way; memory differs.
    assert stash.staleness.tolist() == ema.staleness.tolist() == [3, 2, 1, 0]
    assert stash.weight_copies.tolist() == [4, 3, 2, 1]
    assert ema.weight_copies.tolist() == [2, 2, 2, 1]
    assert ema.weight_memory.sum() == 7 and stash.weight_memory.sum() == 10  # 2(p-1)+1, p(p+1)/2
    assert not stash.flags and not ema.flags


def test_a_flushed_schedule_is_one_iteration_of_its_makespan():
    res = pc.simulate(pc.build("1f1b", 3, 5), pc.Costs(f=1, b=2))
    steady = pc.steady_state(res, microbatch_size=2)
    assert steady.iterations == 1 and steady.iteration_time == res.makespan == 21
    assert steady.samples_per_time == pytest.approx(10 / 21)
    assert steady.staleness.tolist() == [0, 0, 0]


def test_three_views_agree_on_the_streams():
    rows = pc.compare(4, 12, costs=pc.Costs(f=1, b=2, w=0), names=ASYNC)
    for row in rows:
        assert row["error"] is None and not row["flags"], (row["name"], row["flags"])
        assert row["makespan"] == row["formula_makespan"] == 45  # (12 + 3) * 3


@pytest.mark.parametrize("call, match", [
    (lambda: pc.build("pipedream-2bw", 4, 16, accumulation=3), "accumulation >= devices"),
    (lambda: pc.build("layerpipe2", 4, 16, history="avg"), "history"),
    (lambda: pc.steady_state(pc.simulate(pc.build("pipedream", 4, 16))), "microbatches >= 19"),
    (lambda: pc.steady_state(pc.simulate(pc.build("pipedream", 2, 40)), microbatch_size=0),
     "microbatch_size"),
    (lambda: pc.steady_state("not a result"), "Result"),
    (lambda: steady_forms("1f1b", 4), "not an asynchronous family"),
])
def test_bad_input_names_the_value_and_rule(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_declared_weight_versions_are_checked():
    sched = pc.build("1f1b", 2, 2)
    sched.params["weight_versions"] = [1, 0]
    with pytest.raises(ValueError, match="weight_versions"):
        sched.weight_versions  # noqa: B018


def test_summary_fits_120_columns_and_says_directions():
    steady = pc.steady_state(pc.simulate(pc.build("pipedream", 16, 80)))
    text = steady.summary()
    assert all(len(line) <= 120 for line in text.splitlines())
    assert "lower is better" in text and "higher is better" in text
    assert np.array_equal(steady.staleness, np.arange(15, -1, -1))

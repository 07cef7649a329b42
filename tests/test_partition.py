"""Layer partitioner: the equal split for equal layers, gains on a real shape,
memory limits from the schedule's own profile, errors."""

import itertools
import math

import numpy as np
import pytest

import pipecore as pc
from pipecore.analysis.model import Hardware, Model
from pipecore.search.partition import PartitionError, partition, uniform_split

# One FLOP per second and free links: a layer's times are its FLOPs, exactly.
UNIT = Hardware(flops=1.0, memory_bandwidth=math.inf, link_bandwidth=math.inf, link_latency=0.0,
                name="unit")

ISSUE = dict(layers=48, hidden=5120, heads=40, seq=4096, vocab=128000, microbatch=1)


def _same(a, b):
    assert a.makespan == b.makespan
    assert np.array_equal(a.start, b.start) and np.array_equal(a.finish, b.finish)
    assert np.array_equal(a.peak_activation, b.peak_activation)
    assert np.array_equal(a.static_memory, b.static_memory)


@pytest.mark.parametrize("name, chunks, layers", [
    ("1f1b", None, 8), ("interleaved-1f1b", 2, 16), ("zb-v", None, 16), ("zb-h1", None, 8)])
def test_uniform_model_gives_equal_split_and_foundation_results(name, chunks, layers):
    # Per layer: F 0.25, B 0.25, W 0.25, activation 1 (W keeps 0.5), weights 1.
    model = Model.uniform(layers, f=0.25, b=0.25, w=0.25, activation=1.0, activation_w=0.5,
                          weights=1.0)
    plan = partition(model, devices=4, chunks=chunks, schedule=name, hardware=UNIT, microbatches=8,
                     memory_limit=math.inf)
    S = plan.schedule.stages
    assert plan.layers == (layers // S,) * S
    assert plan.layers == plan.uniform_layers and plan.gain == 0.0
    # The foundation's costs: one device share is layers / 4 layers.
    k = layers / 4
    ref = pc.simulate(pc.build(name, 4, 8, chunks=chunks),
                      pc.Costs(f=0.25 * k, b=0.25 * k, w=0.25 * k, activation=k, activation_w=0.5 * k,
                               weights=k))
    _same(pc.simulate(plan.schedule, plan.costs, plan.network), ref)
    _same(plan.result, ref)


def test_uniform_1f1b_hits_the_readme_number():
    # README: 1F1B, p = 4, m = 8, f = 1, b = 2 takes (m + p - 1)(f + b) = 33.
    plan = partition(Model.uniform(8, f=0.5, b=1.0, w=0.0), devices=4, schedule="1f1b",
                     hardware=UNIT, microbatches=8, memory_limit=math.inf)
    assert plan.layers == (2, 2, 2, 2) and plan.makespan == 33.0
    # 1F1B's device d holds p - d activations of its stage: 2 layers of 1 each.
    assert plan.result.peak_activation.tolist() == [8.0, 6.0, 4.0, 2.0]


def test_uniform_split_puts_embedding_first_and_head_last():
    m = Model.transformer(**ISSUE)
    assert uniform_split(m, 8) == (7, 6, 6, 6, 6, 6, 6, 7)
    assert uniform_split(m, 16) == (4,) + (3,) * 14 + (4,)
    small = Model.transformer(layers=10, hidden=64, heads=4, seq=8, vocab=10)
    assert uniform_split(small, 4) == (1 + 3, 3, 2, 2 + 1)
    assert uniform_split(Model.uniform(6), 4) == (2, 2, 1, 1)
    # Embedding, 2 blocks, head over 4 stages: one layer each.
    tiny = Model.transformer(layers=2, hidden=64, heads=4, seq=8, vocab=10)
    assert uniform_split(tiny, 4) == (1, 1, 1, 1)
    with pytest.raises(ValueError, match="the model has 3 layers but the schedule has 4 stages"):
        uniform_split(Model.uniform(3), 4)


@pytest.mark.parametrize("name, chunks", [("1f1b", None), ("interleaved-1f1b", 2), ("zb-v", 2)])
@pytest.mark.parametrize("limit", [math.inf, None])
def test_issue_shape_beats_the_uniform_split(name, chunks, limit):
    model = Model.transformer(**ISSUE)
    hw = Hardware.preset("h100-nvlink")
    plan = partition(model, devices=8, chunks=chunks, schedule=name, hardware=hw, memory_limit=limit)
    print(f"\n{name} limit={limit}: {plan!r}\n{plan.report()}")
    assert plan.gain > 0.01 and plan.gain_seconds > 0
    assert plan.result.makespan < plan.uniform.makespan
    assert plan.memory.max() <= plan.memory_limit * (1 + 1e-9)
    assert (f"faster than uniform by {plan.gain_seconds * 1e3:.3f} ms per iteration "
            f"({plan.gain * 100:.2f}% less time)") in plan.report()
    assert sum(plan.layers) == len(model) and min(plan.layers) >= 1
    # The plan's own costs, re-simulated, give its result.
    assert pc.simulate(plan.schedule, plan.costs, plan.network).makespan == plan.makespan


def test_memory_limit_uses_the_schedules_profile():
    # 1F1B, p = 4, m = 8, 8 equal layers (activation 1, weights 1): device d holds
    # p - d microbatches of its stage, so the equal split needs 4*2 + 2 = 10 on device 0.
    model = Model.uniform(8, f=0.5, b=1.0, w=0.0)
    free = partition(model, devices=4, schedule="1f1b", hardware=UNIT, microbatches=8, memory_limit=10)
    assert free.layers == (2, 2, 2, 2) and free.memory.tolist() == [10.0, 8.0, 6.0, 4.0]
    # At 9.5 device 0 must shed a layer: 4*1 + 1 = 5 fits; with 7 layers on stages
    # 1..3 at (p - d) (n + 1) memory, e.g. (1, 2, 3, 2) needs 8, 9 and 4.
    plan = partition(model, devices=4, schedule="1f1b", hardware=UNIT, microbatches=8, memory_limit=9.5)
    assert plan.layers[0] == 1
    assert plan.memory.max() <= 9.5 and not plan.uniform_fits
    assert plan.makespan > 33.0  # the equal split's 33 is the best without a limit
    assert "does NOT fit" in plan.report()
    # Slower than the uniform split, which does not fit: said so, no sign to decode.
    slower = (plan.makespan - 33.0) * 1e3
    assert (f"uniform 33000.000 ms: slower than uniform by {slower:.3f} ms per iteration "
            f"({slower / 33000.0 * 100:.2f}% more time)") in plan.report()
    assert "% more time than uniform" in repr(plan) and "+" not in plan.report()


def _lopsided():
    # Embedding (free), four blocks (f=1, b=2) and a head (f=4, b=8), at 1 FLOP/s.
    def layer(name, kind, f, b):
        return pc.Layer(name, kind, f, b, 0.0, 0.0, 0.0, 0.0, 1.0, 0.0, 1.0, 1.0, 1.0)

    return Model((layer("embedding", "embedding", 0.0, 0.0),)
                 + tuple(layer(f"block {i}", "block", 1.0, 2.0) for i in range(4))
                 + (layer("head", "head", 4.0, 8.0),), name="lopsided")


def test_report_says_faster_in_words():
    """Issue 37 item 6: a faster plan reads "faster", with no sign to decode."""
    # 1F1B, p=2, m=4. Uniform (3, 3): stages f=2, b=4 and f=6, b=12; stage 1
    # is busy 4 * 18 after stage 0's first F (2) and before its last B (4):
    # 78 s. The plan (5, 1): stages f=4, b=8 each, (m + p - 1)(f + b) = 60 s.
    # 18 s less is 23.08% of 78 s.
    plan = partition(_lopsided(), devices=2, schedule="1f1b", hardware=UNIT, microbatches=4,
                     memory_limit=math.inf)
    assert plan.layers == (5, 1) and plan.uniform_layers == (3, 3)
    text = plan.report()
    assert ("iteration time    plan 60000.000 ms, uniform 78000.000 ms: faster than uniform by "
            "18000.000 ms per iteration (23.08% less time)") in text
    assert "+" not in text and "vs uniform" not in text
    assert repr(plan).endswith("makespan=60 s, 23.08% less time than uniform)")


def test_plan_html_has_the_headline_and_tables():
    plan = partition(_lopsided(), devices=2, schedule="1f1b", hardware=UNIT, microbatches=4,
                     memory_limit=math.inf)
    page = plan._repr_html_()
    assert "iteration time <b>60000.000 ms</b> (uniform split 78000.000 ms): faster than " \
           "uniform by 18000.000 ms per iteration (23.08% less time)" in page
    assert "limit none per device" in page
    for head in ("layer range", "F ms", "activation GB per microbatch", "busy ms", "total GB"):
        assert f">{head}</th>" in page
    # One row per stage (both changed: bold) and one per device.
    assert page.count("<tr style='font-weight:bold'>") == 2
    assert "embedding .. block 3" in page and ">head</td>" in page
    assert page.count("<tr") == 1 + 2 + 1 + 2


def test_nothing_fits_says_the_least_memory():
    model = Model.uniform(8, f=0.5, b=1.0, w=0.0)
    with pytest.raises(PartitionError, match="the least memory found is") as err:
        partition(model, devices=4, schedule="1f1b", hardware=UNIT, microbatches=8, memory_limit=3)
    least = err.value.smallest_memory
    # Device 0 holds 4 in-flight microbatches of at least one layer plus its weight: >= 5.
    assert least >= 5 and err.value.limit == 3
    plan = partition(model, devices=4, schedule="1f1b", hardware=UNIT, microbatches=8, memory_limit=least)
    assert plan.memory.max() <= least * (1 + 1e-9)


def test_issue_shape_too_small_a_limit():
    model = Model.transformer(**ISSUE)
    with pytest.raises(PartitionError, match="no split of .* fits 20.000 GB per device"):
        partition(model, devices=8, schedule="1f1b", memory_limit=20e9, max_evals=200)


def test_bad_inputs():
    m = Model.uniform(8)
    with pytest.raises(ValueError, match="unknown schedule 'nope'"):
        partition(m, devices=4, schedule="nope", hardware=UNIT)
    with pytest.raises(ValueError, match="the model has 8 layers but 'interleaved-1f1b' on 4 devices "
                                         "has 12 stages"):
        partition(m, devices=4, chunks=3, schedule="interleaved-1f1b", hardware=UNIT, microbatches=8)
    for bad in (-1.0, 0, math.nan, "8GB", True):
        with pytest.raises(ValueError, match="'memory_limit' must be a number of bytes > 0"):
            partition(m, devices=4, hardware=UNIT, memory_limit=bad)
    with pytest.raises(ValueError, match="'model' must be a pipecore Model"):
        partition("gpt", devices=4, hardware=UNIT)
    with pytest.raises(ValueError, match="'hardware' must be a pipecore.model.Hardware"):
        partition(m, devices=4, hardware="h100")
    with pytest.raises(ValueError, match="'devices' must be >= 1"):
        partition(m, devices=0, hardware=UNIT)


def _exhaustive(model, schedule, hw, limit):
    """The best split by trying every one (the oracle for small cases)."""
    L, S = len(model), schedule.stages
    best, least = None, math.inf
    for cuts in itertools.combinations(range(1, L), S - 1):
        bounds = (0, *cuts, L)
        split = [bounds[i + 1] - bounds[i] for i in range(S)]
        r = pc.simulate(schedule, model.costs(split, hw), model.network(split, hw))
        mem = (r.peak_activation + r.static_memory).max()
        least = min(least, mem)
        if mem <= limit and (best is None or r.makespan < best):
            best = r.makespan
    return best, least


@pytest.mark.parametrize("name, devices, microbatches", [
    ("1f1b", 3, 6), ("zb-v", 2, 4), ("interleaved-1f1b", 2, 4), ("dualpipev", 2, 4)])
def test_search_finds_the_exhaustive_optimum_on_small_cases(name, devices, microbatches):
    model = Model.transformer(layers=8, hidden=2048, heads=16, seq=2048, vocab=64000)
    hw = Hardware.preset("h100-nvlink")
    sched = pc.build(name, devices, microbatches)
    free, least = _exhaustive(model, sched, hw, math.inf)
    plan = partition(model, devices, schedule=name, hardware=hw, microbatches=microbatches,
                     memory_limit=math.inf)
    assert plan.makespan == pytest.approx(free, rel=1e-12)
    # A limit between the least memory any split needs and the free optimum's.
    limit = (least + plan.memory.max()) / 2
    tight, _ = _exhaustive(model, sched, hw, limit)
    plan = partition(model, devices, schedule=name, hardware=hw, microbatches=microbatches,
                     memory_limit=limit)
    assert plan.makespan == pytest.approx(tight, rel=1e-12) and plan.memory.max() <= limit

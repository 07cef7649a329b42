"""pc.estimate and pc.Strategy (issue 53, first slice): what one strategy predicts.

Golden values here are closed forms written in the test: Megatron SC21's eq. 3
(FLOPs per iteration), Megatron-LM's 18 bytes per parameter of mixed-precision
Adam without sharding and 6 + 12/d with the distributed optimizer
(docs/source/api-guide/dist_optimizer.md), and the pipeline's own makespan on
one device (m microbatches run back to back).
"""

from __future__ import annotations

import math

import pytest

import pipecore as pc
from pipecore.analysis.architecture import Architecture
from pipecore.plan.estimate import RESERVE_BYTES, estimate
from pipecore.plan.hardware import Cluster
from pipecore.plan.strategy import Strategy
from pipecore.plan.validation import check_published

GPT = Architecture(layers=8, hidden=1024, heads=16, seq=1024, vocab=51200, name="gpt-8x1024")
A100 = Cluster.preset("dgx-a100", nodes=2)


def _megatron_eq3_no_recompute(B, s, L, h, V):
    # Narayanan et al., SC21, eq. 3 with the recomputation pass taken out (72 instead of 96).
    return 72 * B * s * L * h * h * (1 + s / (6 * h) + V / (12 * L * h))


def test_breakdown_sums_to_the_iteration_and_figures_agree():
    est = estimate(GPT, A100, Strategy(tp=2, pp=2, dp=2, microbatch_size=2), global_batch=32)
    assert est.microbatches == 32 // (2 * 2)
    assert math.isclose(sum(est.breakdown.values()), est.iteration_time, rel_tol=1e-9)
    assert all(v >= -1e-12 for v in est.breakdown.values()), est.breakdown
    assert math.isclose(est.tokens_per_second, 32 * 1024 / est.iteration_time)
    flops = _megatron_eq3_no_recompute(32, 1024, 8, 1024, 51200)
    assert math.isclose(est.tflops_per_gpu * 1e12 * 8 * est.iteration_time, flops, rel_tol=1e-9)
    assert math.isclose(est.mfu, est.tflops_per_gpu * 1e12 / 312e12, rel_tol=1e-9)
    assert est.gpus == 8 and est.fits


def test_one_device_runs_its_microbatches_back_to_back():
    # pp=1: the pipeline is one device, its makespan m times one microbatch's F+B+W.
    one = estimate(GPT, A100, Strategy(microbatch_size=1), global_batch=1)
    four = estimate(GPT, A100, Strategy(microbatch_size=1), global_batch=4)
    assert math.isclose(four.pipeline.makespan, 4 * one.pipeline.makespan, rel_tol=1e-9)
    assert four.breakdown["bubble"] == pytest.approx(0.0, abs=1e-12)


def test_memory_per_parameter_follows_megatrons_table():
    params = GPT.params()  # pp=1: the tied head shares the embedding's table
    plain = estimate(GPT, A100, Strategy(dp=4), global_batch=4)
    assert plain.memory["params"] + plain.memory["grads"] + plain.memory["optimizer"] == \
        pytest.approx(18 * params, rel=1e-9)
    sharded = estimate(GPT, A100, Strategy(dp=4, zero=1), global_batch=4)
    assert sharded.memory["params"] + sharded.memory["grads"] + sharded.memory["optimizer"] == \
        pytest.approx((6 + 12 / 4) * params, rel=1e-9)
    assert plain.memory["reserve"] == RESERVE_BYTES
    assert math.isclose(plain.memory_per_gpu, sum(plain.memory.values()), rel_tol=1e-9)


def test_recomputation_trades_time_for_memory():
    base = dict(tp=1, pp=2, dp=1, microbatch_size=4)
    none = estimate(GPT, A100, Strategy(**base), global_batch=16)
    full = estimate(GPT, A100, Strategy(**base, recompute="full"), global_batch=16)
    assert full.iteration_time > none.iteration_time
    assert full.memory["activations"] < none.memory["activations"]
    assert full.hfu > full.mfu and none.hfu == pytest.approx(none.mfu)


def test_a_model_name_and_a_model_object_give_the_same_estimate():
    model = pc.Model.transformer(layers=8, hidden=1024, heads=16, seq=1024, vocab=51200)
    a = estimate(model, A100, Strategy(pp=2), global_batch=8)
    b = estimate(model.architecture, A100, Strategy(pp=2), global_batch=8)
    assert a.iteration_time == b.iteration_time


@pytest.mark.parametrize(("strategy", "batch", "words"), [
    (Strategy(tp=3), 4, ["tp=3", "heads (16)"]),
    (Strategy(pp=3), 3, ["pp * chunks", "8 layers"]),
    (Strategy(dp=3), 4, ["global batch 4", "microbatch_size * dp = 3"]),
    (Strategy(tp=8, pp=2, dp=2), 4, ["needs tp*pp*dp = 32 GPUs", "has 16"]),
])
def test_strategies_that_cannot_run_name_the_value_and_the_rule(strategy, batch, words):
    with pytest.raises(pc.InputError) as info:
        estimate(GPT, A100, strategy, global_batch=batch)
    for word in words:
        assert word in str(info.value), (word, str(info.value))


@pytest.mark.parametrize(("kwargs", "words"), [
    (dict(recompute="some"), ["'recompute'", "'some'"]),
    (dict(zero=4), ["'zero'", "4"]),
    (dict(tp=0), ["'tp'", ">= 1"]),
    (dict(sequence_parallel=1), ["'sequence_parallel'", "True or False"]),
])
def test_a_bad_strategy_field_is_named(kwargs, words):
    with pytest.raises(pc.InputError) as info:
        Strategy(**kwargs)
    for word in words:
        assert word in str(info.value)


def test_a_model_without_architecture_is_refused():
    with pytest.raises(pc.InputError, match="architecture"):
        estimate(pc.Model.uniform(4), A100, Strategy(), global_batch=1)


TABLE = check_published("validation")


def test_every_megatron_table1_row_is_predicted():
    # The ten rows of Megatron SC21 Table 1 (pipecore/plan/data/published.toml).
    rows = TABLE.to_pylist()
    assert len(rows) == 10
    for r in rows:
        assert math.isfinite(r["predicted_tflops"]) and r["predicted_tflops"] > 0, r
        assert math.isfinite(r["error"]), r
        assert 0 < r["memory_gb"] <= 80, r  # each ran on 80 GB A100s


@pytest.mark.xfail(strict=True, reason="issue 53's bar is not reached yet: from hardware "
                   "measurements alone pipecore predicts every Table 1 row faster than measured "
                   "(median 15.3%, worst 23.9%, with Megatron-LM's 2021 behaviours and byte counts "
                   "modelled); see CHANGELOG and docs")
def test_megatron_table1_within_the_bar():
    errors = sorted(abs(e) for e in TABLE.column("error").to_pylist())
    median = (errors[4] + errors[5]) / 2
    assert median <= 0.08 and errors[-1] <= 0.15, errors

"""The published-runs data file (pipecore/plan/data/published.toml) and its loader.

Golden relations come from the sources, not from the loader: Megatron SC21 (arXiv 2104.04473)
eq. 2 for the parameter count, and Table 1's own columns (aggregate = GPUs x per-GPU
throughput; percentage of peak = per-GPU throughput / 312 teraFLOP/s, the A100's dense FP16
peak the paper uses), each checked within the table's printed rounding.
"""

import copy
import math
from importlib import resources

import pytest
import tomllib

from pipecore.core.ops import InputError
from pipecore.plan.published import PublishedRun, parse_runs, published_runs

A100_PEAK_TFLOPS = 312.0  # SC21 §5: A100 half-precision peak the paper's "% of peak" divides by


def _doc():
    text = resources.files("pipecore.plan").joinpath("data/published.toml").read_text(encoding="utf-8")
    return tomllib.loads(text)


def _megatron_eq2_params(layers, h, vocab, seq):
    # SC21 eq. 2: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h)).
    return 12 * layers * h**2 * (1 + 13 / (12 * h) + (vocab + seq) / (12 * layers * h))


def test_file_loads_with_both_roles():
    runs = published_runs()
    assert all(isinstance(r, PublishedRun) for r in runs)
    assert len({r.id for r in runs}) == len(runs)
    assert published_runs("held-back"), "held-back runs are part of the bar"
    assert len(published_runs("validation")) + len(published_runs("held-back")) == len(runs)


def test_exactly_ten_validation_rows_are_sc21_table1():
    val = published_runs("validation")
    assert len(val) == 10
    # Table 1's model sizes, in the paper's order.
    assert [r.params_billion for r in val] == [1.7, 3.6, 7.5, 18.4, 39.1, 76.1, 145.6, 310.1, 529.6, 1008.0]
    for r in val:
        assert r.complete, r.id
        assert (r.model.seq, r.model.vocab) == (2048, 51200)
        assert r.recompute == "full" and r.flops_formula == "megatron-eq3"
        assert "run_table_1.sh" in r.config_source and "2104.04473" in r.source


@pytest.mark.parametrize("run", published_runs(), ids=lambda r: r.id)
def test_layout_adds_up(run):
    assert run.tp * run.pp * run.dp == run.gpus
    assert run.global_batch % (run.microbatch_size * run.dp) == 0
    assert run.microbatches * run.microbatch_size * run.dp == run.global_batch
    if run.chunks > 1:
        assert run.model.layers % (run.pp * run.chunks) == 0
        assert run.microbatches % run.pp == 0  # Megatron's interleaved schedule requires it


@pytest.mark.parametrize("run", published_runs("validation"), ids=lambda r: r.id)
def test_table1_params_match_megatron_eq2(run):
    m = run.model
    p = _megatron_eq2_params(m.layers, m.hidden, m.vocab, m.seq) / 1e9
    # Table 1 prints one decimal: the published count is eq. 2 rounded to 0.1 B.
    assert abs(p - run.params_billion) <= 0.05 + 1e-6, (p, run.params_billion)


@pytest.mark.parametrize("run", published_runs("validation"), ids=lambda r: r.id)
def test_table1_columns_agree_with_each_other(run):
    tf = run.measured_tflops_per_gpu
    # Per-GPU throughput is printed to 1 TFLOP/s and the aggregate to 0.1 PFLOP/s.
    slack = run.gpus * 0.5 / 1000 + 0.05
    assert abs(run.gpus * tf / 1000 - run.measured_aggregate_pflops) <= slack
    # Percentage of peak is printed to 1 %.
    assert abs(tf / A100_PEAK_TFLOPS - run.measured_peak_fraction) <= 0.005 + 0.5 / A100_PEAK_TFLOPS


def test_held_back_mfu_matches_its_tflops():
    # The Megatron README's H100 table: MFU = per-GPU model teraFLOP/s / 989 (H100 dense BF16 peak), 1 %.
    rows = [r for r in published_runs("held-back") if r.id.startswith("megatron-readme-h100")]
    assert len(rows) == 9
    for r in rows:
        assert abs(r.measured_tflops_per_gpu / 989.0 - r.measured_mfu) <= 0.005 + 0.05 / 989.0, r.id
        aggregate = r.gpus * r.measured_tflops_per_gpu / 1000
        assert abs(aggregate - r.measured_aggregate_pflops) <= 0.05 + 1e-9, r.id


def test_bloom_figure_is_megatron_eq3():
    # SC21 eq. 3 (recomputation included): F = 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) per iteration.
    # With the logged 104.70 s per iteration it gives the logged 149.77 TFLOP/s per GPU
    # (the time is printed to 0.01 s).
    (bloom,) = [r for r in published_runs("held-back") if r.id == "bloom-176b"]
    m = bloom.model
    flops = 96 * bloom.global_batch * m.seq * m.layers * m.hidden**2 * (
        1 + m.seq / (6 * m.hidden) + m.vocab / (16 * m.layers * m.hidden))
    tflops = flops / (bloom.measured_iteration_time * bloom.gpus) / 1e12
    assert bloom.flops_formula == "megatron-eq3"
    assert abs(tflops - bloom.measured_tflops_per_gpu) / bloom.measured_tflops_per_gpu < 1e-3


def test_nan_means_not_published():
    for r in published_runs("validation"):
        assert math.isnan(r.measured_iteration_time)


def _bad(mutate):
    doc = copy.deepcopy(_doc())
    mutate(doc["run"][0])
    return doc


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda r: r.update(dp=31), "gpus"),
        (lambda r: r.update(global_batch=500), "global_batch"),
        (lambda r: r.update(schedule="gpipe"), "schedule"),
        (lambda r: r.update(chunks=2), "chunks"),
        (lambda r: r.pop("tp"), "tp"),
        (lambda r: r.update(tp=1.0), "tp"),
        (lambda r: r.update(measured_tflops_per_gpu=-1), "measured_tflops_per_gpu"),
        (lambda r: r.update(role="test"), "role"),
        (lambda r: r.update(bogus=1), "bogus"),
        (lambda r: r.update(unpublished=["nope"]), "unpublished"),
        (lambda r: r["model"].update(heads=7), "heads"),
    ],
)
def test_bad_row_names_run_and_field(mutate, field):
    with pytest.raises(InputError) as err:
        parse_runs(_bad(mutate))
    msg = str(err.value)
    assert "megatron-sc21-table1-1.7b" in msg and repr(field) in msg, msg


def test_duplicate_id_and_bad_role_argument():
    doc = _doc()
    doc["run"].append(copy.deepcopy(doc["run"][0]))
    with pytest.raises(InputError, match="appears twice"):
        parse_runs(doc)
    with pytest.raises(InputError, match="role"):
        published_runs("validate")

"""Where one strategy ranks among a search's (issue 53, part 7): a strategy
string, ``Strategies.rank_of``, the published runs of a setting, and the
lines ``pipecore plan --strategy`` prints.

Golden values come from outside the ranking code: the search's own order
(pc.strategies sorts its table; tests/test_plan_search.py checks that
against a brute force), a second search over a larger space, and Megatron-LM
SC21 Table 1 (arXiv 2104.04473) for which runs match a preset.
"""

from __future__ import annotations

import dataclasses

import pytest

import pipecore as pc
from pipecore.cli import main
from pipecore.plan import published
from pipecore.plan.ranking import full_label, parse_strategy, published_matches, published_rankings
from pipecore.plan.search import strategies

ARCH = pc.Architecture(layers=8, hidden=1024, heads=16, seq=1024, vocab=51200, name="small")
NODE = pc.Cluster.preset("dgx-a100", nodes=1)
SMALL = dict(zero=(0, 1), recompute=("none", "full"), microbatch_sizes=(1, 2, 4))


@pytest.fixture(scope="module")
def plain():
    """1F1B only: interleaved strategies lie outside it."""
    return strategies(ARCH, NODE, 32, schedules=("1f1b",), **SMALL)


@pytest.fixture(scope="module")
def wider():
    """The same space with interleaving added."""
    return strategies(ARCH, NODE, 32, schedules=("1f1b", "interleaved-1f1b"), **SMALL)


def _strategy(row):
    return pc.Strategy(tp=row["tp"], pp=row["pp"], dp=row["dp"], microbatch_size=row["microbatch_size"],
                       schedule=row["schedule"], chunks=row["chunks"], recompute=row["recompute"],
                       sequence_parallel=row["sequence_parallel"], zero=row["zero"], dp_overlap=True)


# -- the strategy string ---------------------------------------------------------------------------

def test_the_issue_example_parses_to_its_strategy():
    s = parse_strategy("tp=8,pp=8,dp=16,mb=1,schedule=interleaved-1f1b,chunks=3,recompute=selective,sp,"
                       "zero=1")
    assert s == pc.Strategy(tp=8, pp=8, dp=16, microbatch_size=1, schedule="interleaved-1f1b", chunks=3,
                            recompute="selective", sequence_parallel=True, zero=1, dp_overlap=True)


@pytest.mark.parametrize("strategy", [
    pc.Strategy(tp=8, pp=8, dp=16, microbatch_size=1, schedule="interleaved-1f1b", chunks=3,
                recompute="selective", sequence_parallel=True, zero=1, dp_overlap=True),
    pc.Strategy(tp=1, pp=4, dp=2, microbatch_size=4, schedule="zb-h1", zero=3, dp_overlap=True),
    pc.Strategy(tp=2, pp=1, dp=4, recompute="full", dp_overlap=True),
    # Megatron-LM 2021's settings and a mixed cluster's: pools and layers per rank, in runs.
    pc.Strategy(tp=4, pp=3, dp=8, schedule="interleaved-1f1b", chunks=2, pools=(1, 1, 0),
                layers=(10, 10, 10, 10, 3, 4), p2p_overlap=False, grad_accumulation_fusion=False,
                dp_overlap=True),
    pc.Strategy(tp=1, pp=2, dp=8, pools=(1, 1), dp_overlap=True),
])
def test_a_table_label_reads_back_as_its_strategy(strategy):
    # What `pipecore plan` prints in its strategy column can be pasted into --strategy.
    assert parse_strategy(strategy.label()) == strategy


def test_unnamed_settings_take_the_search_defaults_and_dp_the_gpus_left():
    s = parse_strategy("tp=2 pp=2", gpus=64)
    assert (s.dp, s.microbatch_size, s.schedule, s.chunks, s.zero) == (16, 1, "1f1b", 1, 0)
    assert s.dp_overlap and s.attention == "flash" and s.precision == "bf16"
    assert parse_strategy("pp=2,schedule=interleaved-1f1b", gpus=8).chunks == 2  # the family's default
    off = parse_strategy("tp=1,dp=8,overlap=off,attention=unfused,precision=fp16")
    assert (off.dp_overlap, off.attention, off.precision) == (False, "unfused", "fp16")
    assert full_label(off) == "tp1 pp1 dp8 mb1 1f1b, fp16, unfused attention, no overlap"


@pytest.mark.parametrize(("text", "words"), [
    ("tp=8,foo=2,dp=1", ["unknown key 'foo'", "tp, pp, dp"]),
    ("tp=eight,dp=1", ["tp must be a whole number", "'eight'"]),
    ("tp=2,tp=4,dp=1", ["tp is given twice"]),
    ("tp=2,schedule=zigzag,dp=1", ["unknown schedule 'zigzag'", "1f1b"]),
    ("tp=2,sp=maybe,dp=1", ["sp must be on or off", "'maybe'"]),
    ("tp=2,recompute=some,dp=1", ["'recompute'", "'some'"]),
    ("tp=2", ["dp is missing"]),
    ("", ["strategy must be a string like"]),
    ("tp=2 wat dp=1", ["item 'wat'", "key=value"]),
    ("tp=2,dp=1,p2p=maybe", ["p2p must be overlapped or blocking", "'maybe'"]),
    ("pp=2,dp=1,pools=1x0,0x2", ["run '1x0' of pools", "n >= 1"]),
    ("pp=2,dp=1,pool=1,0", ["pool takes one pool for every rank", "1,0"]),
    ("pp=2 dp=1 pool 0 pools 1x2", ["pool and pools are both given"]),
    ("pp=2 dp=1 layers 3,5 layers=4,4", ["layers is given twice"]),
    ("pp=2,dp=1,layers=3", ["'layers' must be a sequence of 2 ints"]),
])
def test_a_bad_strategy_string_names_the_item_and_the_rule(text, words):
    with pytest.raises(pc.InputError) as info:
        parse_strategy(text)
    for word in words:
        assert word in str(info.value), str(info.value)


def test_pools_and_layers_read_in_both_forms():
    # "kxn" is k repeated n times; "pool k" puts every rank on pool k.
    s = parse_strategy("tp=2,pp=3,dp=2,pools=0x1,1x2,layers=3,5x2")
    assert (s.pools, s.layers) == ((0, 1, 1), (3, 5, 5))
    assert parse_strategy("tp2 pp3 dp2 mb1 1f1b pool 1").pools == (1, 1, 1)


def test_dp_from_gpus_needs_tp_times_pp_to_divide_them():
    with pytest.raises(pc.InputError, match="tp\\*pp = 6 does not divide the 8 GPUs"):
        parse_strategy("tp=2,pp=3", gpus=8)


# -- rank_of --------------------------------------------------------------------------------------

def test_a_searched_strategy_takes_its_rank_from_the_table(plain):
    rows = plain.table.to_pylist()
    for row in rows[:5] + rows[-3:]:
        r = plain.rank_of(_strategy(row), ARCH, NODE, 32)
        assert r.in_space and r.rank == row["rank"] and r.why == row["why"]
        assert r.estimate.iteration_time == row["iteration_time"]
    best = plain.rank_of(plain.best.strategy, ARCH, NODE, 32)
    assert best.rank == 1 and "as good as the best" in best.describe()


def test_a_strategy_outside_the_space_is_placed_where_a_wider_search_puts_it(plain, wider):
    wide = wider.table.to_pylist()
    outside = [r for r in wide if r["schedule"] == "interleaved-1f1b" and r["rank"] is not None]
    assert outside
    for row in outside[:: max(1, len(outside) // 6)]:
        r = plain.rank_of(_strategy(row), ARCH, NODE, 32)
        # In the wider search, the plain strategies ranked before it are the ones it
        # would follow in the plain one.
        ahead = sum(1 for w in wide if w["rank"] is not None and w["rank"] < row["rank"]
                    and w["schedule"] == "1f1b")
        assert not r.in_space and r.rank == ahead + 1
        # chunks too: 1F1B searched chunks 1 only.
        assert r.outside == f"not searched: schedule interleaved-1f1b, chunks {row['chunks']}"
        assert r.estimate.iteration_time == pytest.approx(row["iteration_time"], rel=1e-12)
        assert f"would rank {ahead + 1} of {len([x for x in plain.table.to_pylist() if x['rank']])}" \
            in r.describe()


def test_a_strategy_that_cannot_run_or_does_not_fit_has_no_rank_and_says_why():
    big = pc.Architecture.preset("megatron-18.4b")
    res = strategies(big, NODE, 8, schedules=("1f1b",), zero=(0,), recompute=("none",),
                     microbatch_sizes=(1,))
    assert res.best is not None
    heavy = res.rank_of(pc.Strategy(tp=1, pp=1, dp=8, dp_overlap=True), big, NODE, 8)
    assert heavy.rank is None and heavy.why.startswith("needs ") and "GB per GPU" in heavy.why
    odd = res.rank_of(pc.Strategy(tp=3, pp=1, dp=2, dp_overlap=True), big, NODE, 8)
    assert odd.rank is None and odd.estimate is None and "tp=3" in odd.why
    assert "cannot run" in odd.describe()
    bound = res.best.iteration_time * 0.5
    slow = res.rank_of(dataclasses.replace(res.best.strategy, dp_overlap=False), big, NODE, 8,
                       max_iteration_time=bound)
    assert slow.rank is None and "max_iteration_time" in slow.why


def test_rank_of_refuses_a_setting_that_is_not_the_search(plain):
    s = plain.best.strategy
    with pytest.raises(pc.InputError, match="global_batch 64 is not the search's \\(32\\)"):
        plain.rank_of(s, ARCH, NODE, 64)
    other = pc.Architecture(layers=8, hidden=2048, heads=16, seq=1024, vocab=51200, name="other")
    with pytest.raises(pc.InputError, match="model 'other' is not the searched model"):
        plain.rank_of(s, other, NODE, 32)
    with pytest.raises(pc.InputError, match="not the searched one"):
        plain.rank_of(s, ARCH, pc.Cluster.preset("dgx-h100", nodes=1), 32)
    with pytest.raises(pc.InputError, match="must be a pipecore Strategy"):
        plain.rank_of("tp=1", ARCH, NODE, 32)


# -- published runs -------------------------------------------------------------------------------

# Megatron-LM SC21 Table 1: model size, GPUs and global batch of each row; the presets
# megatron-<size> carry the same dimensions (pipecore.analysis.architecture). The last
# row's run id names its 1008 billion parameters, the preset "1t".
TABLE1 = [("1.7b", 32, 512), ("3.6b", 64, 512), ("7.5b", 128, 512), ("18.4b", 256, 1024),
          ("39.1b", 512, 1536), ("76.1b", 1024, 1792), ("145.6b", 1536, 2304), ("310.1b", 1920, 2160),
          ("529.6b", 2520, 2520), ("1t", 3072, 3072)]


@pytest.mark.parametrize(("size", "gpus", "batch"), TABLE1)
def test_each_table1_preset_matches_its_row_and_nothing_else(size, gpus, batch):
    model = pc.Architecture.preset(f"megatron-{size}")
    cluster = pc.Cluster.preset("dgx-a100", nodes=gpus // 8)
    run_id = "megatron-sc21-table1-" + ("1008b" if size == "1t" else size)
    assert [r.id for r in published_matches(model, cluster, batch)] == [run_id]
    assert published_matches(model, cluster, batch * 2) == []  # another batch
    assert published_matches(model, pc.Cluster.preset("dgx-h100", nodes=gpus // 8), batch) == []
    if gpus > 8:
        assert published_matches(model, pc.Cluster.preset("dgx-a100", nodes=gpus // 8 - 1), batch) == []


def test_a_published_run_ranks_with_its_own_configuration():
    model = pc.Architecture.preset("megatron-1.7b")
    cluster = pc.Cluster.preset("dgx-a100", nodes=4)
    res = strategies(model, cluster, 512, schedules=("1f1b",), zero=(0, 1), recompute=("none", "full"),
                     microbatch_sizes=(4, 8))
    [(run, r)] = published_rankings(res, model, cluster, 512)
    # Table 1 row 1 as published.toml records it: TP 1, PP 1, MBS 16, full recomputation, fp16,
    # unfused attention (2021 Megatron-LM).
    assert (r.strategy.tp, r.strategy.pp, r.strategy.dp, r.strategy.microbatch_size) == (1, 1, 32, 16)
    assert (r.strategy.recompute, r.strategy.precision, r.strategy.attention) == ("full", "fp16", "unfused")
    assert not r.in_space and "microbatch size 16" in r.outside and "precision fp16" in r.outside
    direct = pc.estimate(model, cluster, r.strategy, 512)
    assert r.estimate.iteration_time == direct.iteration_time
    ranked = [x for x in res.table.to_pylist() if x["rank"] is not None]
    assert r.rank == 1 + sum(1 for x in ranked if x["iteration_time"] <= direct.iteration_time)


# -- the command ----------------------------------------------------------------------------------

def _fake_run(monkeypatch):
    """A published run of megatron-1.7b on one DGX A100 at batch 32 (the real ones need 32+ GPUs)."""
    doc = {"run": [{
        "id": "test-1.7b-one-node", "role": "held-back", "source": "a test", "url": "https://example.org",
        "config_source": "a test", "notes": "a test", "gpu": "a100-sxm4-80gb", "params_billion": 1.7,
        "model": {"layers": 24, "hidden": 2304, "heads": 24, "seq": 2048, "vocab": 51200},
        "gpus": 8, "gpus_per_node": 8, "tp": 2, "pp": 2, "dp": 2, "microbatch_size": 2,
        "global_batch": 32, "schedule": "1f1b", "chunks": 1, "recompute": "full",
        "sequence_parallel": False, "zero": 0, "dp_overlap": False, "precision": "fp16",
        "measured_tflops_per_gpu": 100.0, "flops_formula": "megatron-eq3"}]}
    runs = published.parse_runs(doc)
    monkeypatch.setattr(published, "published_runs", lambda role=None: list(runs))


def test_plan_says_where_a_given_and_a_published_strategy_rank(monkeypatch, capsys, tmp_path):
    _fake_run(monkeypatch)
    code = main(["plan", "--model", "megatron-1.7b", "--cluster", "dgx-a100", "--nodes", "1",
                 "--global-batch", "32", "--top", "3", "--strategy", "tp=2,pp=2,mb=1,recompute=full,zero=1"])
    text = capsys.readouterr().out
    assert code == 0, text
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= 120
    head = "\n".join(lines[:lines.index("")])
    assert "yours: tp2 pp2 dp2 mb1 1f1b rc=full zero1: rank " in head
    assert "published test-1.7b-one-node: tp2 pp2 dp2 mb2 1f1b rc=full, fp16, no overlap: outside the " \
           "searched space" in head.replace("\n  ", " ")
    assert "it would rank" in head


@pytest.mark.parametrize(("argv", "words"), [
    (["--strategy", "tp=2,bogus=1"], ["--strategy", "unknown key 'bogus'"]),
    (["--strategy", "tp=3"], ["--strategy", "tp*pp = 3 does not divide the 8 GPUs"]),
    (["--report", "no/such/folder/plan.html"], ["--report", "does not exist"]),
])
def test_plan_bad_strategy_or_report_is_named_before_the_search(argv, words, capsys):
    code = main(["plan", "--model", "megatron-1.7b", "--cluster", "dgx-a100", "--nodes", "1",
                 "--global-batch", "32", *argv])
    err = capsys.readouterr().err
    assert code != 0
    for word in words:
        assert word in err, err

"""pc.strategies and ``pipecore plan`` (issue 53): the declared space, searched exactly.

The brute force below enumerates the whole product of settings with plain
loops and no filtering of its own beyond the rules the space declares
(interleaving needs pp > 1 and whole rounds of pp microbatches, as Megatron
requires; selective recomputation is the same strategy as none with
FlashAttention),
estimates each with pc.estimate and keeps those that run and fit: the
search must rank exactly those, best first.
"""

from __future__ import annotations

import itertools

import pyarrow.parquet as pq
import pytest

import pipecore as pc
from pipecore.cli import main
from pipecore.plan.search import strategies

ARCH = pc.Architecture(layers=8, hidden=1024, heads=16, seq=1024, vocab=51200, name="small")
NODE = pc.Cluster.preset("dgx-a100", nodes=1)


def _brute_force(batch):
    feasible = {}
    for tp, pp, mb, sched, chunks, rc, zero, sp in itertools.product(
            (1, 2, 4, 8), (1, 2, 4, 8), (1, 2, 4, 8, 16), ("1f1b", "interleaved-1f1b", "zb-h1"),
            (1, 2, 3, 4), ("none", "selective", "full"), (0, 1, 2, 3), (False, True)):
        if 8 % (tp * pp):
            continue
        dp = 8 // (tp * pp)
        interleaved = sched == "interleaved-1f1b"
        if interleaved != (chunks > 1) or rc == "selective" or (interleaved and pp == 1):
            continue
        if batch % (mb * dp) or (interleaved and (batch // (mb * dp)) % pp):
            continue
        s = pc.Strategy(tp=tp, pp=pp, dp=dp, microbatch_size=mb, schedule=sched, chunks=chunks,
                        recompute=rc, zero=zero, sequence_parallel=sp, dp_overlap=True)
        try:
            est = pc.estimate(ARCH, NODE, s, global_batch=batch)
        except pc.InputError:
            continue
        if est.fits:
            feasible[s] = est.iteration_time
    return feasible


def test_search_ranks_exactly_the_strategies_brute_force_finds():
    res = strategies(ARCH, NODE, 32)
    brute = _brute_force(32)
    ranked = [r for r in res.table.to_pylist() if r["rank"] is not None]
    got = {(r["tp"], r["pp"], r["dp"], r["microbatch_size"], r["schedule"], r["chunks"], r["recompute"],
            r["zero"], r["sequence_parallel"]): r["iteration_time"] for r in ranked}
    want = {(s.tp, s.pp, s.dp, s.microbatch_size, s.schedule, s.chunks, s.recompute, s.zero,
             s.sequence_parallel): t for s, t in brute.items()}
    # Strategies that change nothing (ZeRO with dp=1, sequence parallelism with tp=1) are
    # the same strategy: the space keeps one of each.
    canonical = {k: v for k, v in want.items() if not (k[7] and k[2] == 1) and not (k[8] and k[0] == 1)}
    assert got == pytest.approx(canonical, rel=1e-12)
    assert res.best.iteration_time == min(canonical.values())
    times = [r["iteration_time"] for r in ranked]
    assert times == sorted(times) and [r["rank"] for r in ranked] == list(range(1, len(ranked) + 1))


def test_cost_objective_with_a_time_bound():
    fast = strategies(ARCH, NODE, 32)
    bound = fast.best.iteration_time * 1.05
    res = strategies(ARCH, NODE, 32, objective="cost", max_iteration_time=bound)
    ranked = [r for r in res.table.to_pylist() if r["rank"] is not None]
    assert ranked and all(r["iteration_time"] <= bound for r in ranked)
    costs = [r["cost_per_million_tokens"] for r in ranked]
    assert costs == sorted(costs)
    slow = [r for r in res.table.to_pylist() if r["why"] and "max_iteration_time" in r["why"]]
    assert slow and all(r["iteration_time"] > bound for r in slow)


def test_a_model_that_fits_nowhere_gives_an_empty_ranking_that_says_why():
    huge = pc.Architecture.preset("megatron-1t")
    res = strategies(huge, NODE, 8)
    assert res.best is None and res.table.num_rows > 0
    assert all(r["rank"] is None and r["why"] for r in res.table.to_pylist())


@pytest.mark.parametrize(("kwargs", "words"), [
    (dict(objective="money"), ["'objective'", "'money'"]),
    (dict(max_iteration_time=-1), ["'max_iteration_time'", "-1"]),
    (dict(schedules=()), ["'schedules' is empty"]),
])
def test_bad_search_options_are_named(kwargs, words):
    with pytest.raises(pc.InputError) as info:
        strategies(ARCH, NODE, 32, **kwargs)
    for word in words:
        assert word in str(info.value)


def test_plan_command_headline_first_within_120_columns(tmp_path, capsys):
    out = tmp_path / "plans.parquet"
    code = main(["plan", "--model", "megatron-1.7b", "--cluster", "dgx-a100", "--nodes", "1",
                 "--global-batch", "32", "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    lines = text.splitlines()
    assert lines[0].startswith("best: ") and "s per iteration" in lines[0]
    assert max(len(line) for line in lines) <= 120
    table = pq.read_table(out)
    assert table.num_rows > 0 and "why" in table.column_names
    assert table.column("rank")[0].as_py() == 1  # the file too is best first


@pytest.mark.parametrize(("argv", "words"), [
    (["--model", "gpt-9", "--cluster", "dgx-a100", "--nodes", "1"], ["gpt-9", "gpt3-175b"]),
    (["--model", "megatron-1.7b", "--cluster", "dgx-a100"], ["needs --nodes"]),
    (["--model", "megatron-1.7b", "--cluster", "a100:8,h100:8", "--nodes", "2"], ["drop --nodes"]),
    (["--model", "megatron-1.7b", "--cluster", "a100:12"], ["do not fill whole nodes of 8"]),
])
def test_plan_command_errors_name_the_option(argv, words, capsys):
    code = main(["plan", *argv, "--global-batch", "32"])
    err = capsys.readouterr().err
    assert code != 0
    for word in words:
        assert word in err, err


def test_reference_batches_come_from_each_presets_own_run():
    from pipecore.plan.published import reference_batch

    # GPT-3: 1536 x 2048 tokens (Megatron-LM examples/gpt3, the paper's 3.2M); Llama 2:
    # 4M tokens of 4096 (Touvron et al. 2023, sec. 2.2); SC21 Table 1: its rows' batches.
    assert reference_batch("gpt3-175b") == 1536
    assert reference_batch("llama2-70b") == 4 * 2**20 // 4096
    assert reference_batch("megatron-1.7b") == 512
    assert reference_batch("megatron-39.1b") == 1536
    assert reference_batch("megatron-1t") == 3072
    for name in pc.Architecture.presets():  # every preset has one
        assert reference_batch(name) >= 1
    with pytest.raises(pc.InputError, match="unknown architecture preset 'gpt-9'"):
        reference_batch("gpt-9")


def test_plan_command_without_a_batch_takes_the_presets_own(capsys):
    rc = main(["plan", "--model", "megatron-1.7b", "--cluster", "dgx-a100", "--nodes", "4", "--top", "1"])
    out = capsys.readouterr().out
    assert rc == 0 and "global batch 512 x 2048 tokens" in out

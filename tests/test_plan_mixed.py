"""Plans on clusters of several GPU pools, and money (issue 53, part 5).

The hand-worked case: a pool of GPUs exactly twice as fast as another in
every respect (peak FLOP/s, memory bandwidth, every link's bandwidth, half
every latency and launch cost) runs any strategy in exactly half the time,
so its cost per token is ``price ratio / 2`` of the slow pool's: the cost
objective must choose the fast pool when it costs less than twice as much
and the slow one when it costs more. A pipeline spanning both gives each
fast stage about twice the layers. The layer split itself is checked
against a brute force over every split.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipecore as pc
from pipecore.cli import main
from pipecore.plan.layout import balance, spanning
from pipecore.plan.search import strategies

ARCH = pc.Architecture(layers=12, hidden=1024, heads=16, seq=1024, vocab=32768, name="small")


def _faster(pool, factor, price):
    """``pool`` with everything ``factor`` times faster, at ``price`` USD per GPU-hour."""
    g = pool.gpu
    gpu = replace(g, name=f"{g.name}-x{factor}", peak_flops=g.peak_flops * factor,
                  hbm_bandwidth=g.hbm_bandwidth * factor, kernel_overhead=g.kernel_overhead / factor)
    return replace(pool, gpu=gpu, intra_bus_bandwidth=pool.intra_bus_bandwidth * factor,
                   inter_bus_bandwidth=pool.inter_bus_bandwidth * factor,
                   intra_latency=pool.intra_latency / factor, inter_latency=pool.inter_latency / factor,
                   p2p_intra_bandwidth=pool.p2p_intra_bandwidth * factor,
                   p2p_inter_bandwidth=pool.p2p_inter_bandwidth * factor,
                   intra_allreduce_bus_bandwidth=None if pool.intra_allreduce_bus_bandwidth is None
                   else pool.intra_allreduce_bus_bandwidth * factor,
                   price_per_gpu_hour=price)


def _cluster(fast_price):
    slow = pc.Cluster.preset("dgx-a100", nodes=1).pools[0]
    return pc.Cluster(pools=(slow, _faster(slow, 2.0, fast_price)), name="slow+fast")


def test_a_pool_twice_as_fast_in_everything_halves_the_time():
    cluster = _cluster(fast_price=5.0)
    for s in (pc.Strategy(tp=2, pp=2, dp=2, microbatch_size=2, recompute="full", zero=1),
              pc.Strategy(tp=1, pp=4, dp=2, schedule="interleaved-1f1b", chunks=3, sequence_parallel=False)):
        slow = pc.estimate(ARCH, cluster, s, global_batch=32, pool=0)
        fast = pc.estimate(ARCH, cluster, s, global_batch=32, pool=1)
        assert fast.iteration_time == pytest.approx(slow.iteration_time / 2, rel=1e-9)
        # USD per million tokens: GPUs x price x seconds per iteration / tokens per iteration.
        tokens = 32 * ARCH.seq
        for est, price in ((slow, cluster.pools[0].price_per_gpu_hour), (fast, 5.0)):
            assert est.cost_per_million_tokens == pytest.approx(
                s.gpus * price * est.iteration_time / 3600 / tokens * 1e6, rel=1e-12)


@pytest.mark.parametrize(("ratio", "chosen"), [(1.5, 1), (2.5, 0)])
def test_the_cost_objective_takes_the_pool_with_the_lower_price_per_speed(ratio, chosen):
    slow_price = pc.Cluster.preset("dgx-a100", nodes=1).pools[0].price_per_gpu_hour
    cluster = _cluster(fast_price=ratio * slow_price)
    res = strategies(ARCH, cluster, 32, objective="cost", schedules=("1f1b",), microbatch_sizes=(1, 2),
                     zero=(0,), sequence_parallel=(False,))
    best = res.best.strategy
    # Twice as fast at `ratio` times the price: the fast pool's cost per token is ratio / 2 of
    # the slow pool's for every strategy, so the cheapest runs on one pool alone, all on it.
    assert best.pools == (chosen,) * best.pp
    assert best.gpus == 8
    same = pc.estimate(ARCH, cluster, replace(best, pools=(1 - chosen,) * best.pp), global_batch=32)
    assert res.best.cost_per_million_tokens == pytest.approx(
        same.cost_per_million_tokens * (ratio / 2 if chosen else 2 / ratio), rel=1e-9)


def test_a_pipeline_spanning_both_pools_gives_the_fast_stages_twice_the_layers():
    # A vocabulary of 256 makes the embedding and head negligible beside a layer, so the
    # bottleneck split of 12 layers puts exactly twice the layers on each fast stage.
    arch = replace(ARCH, vocab=256)
    res = strategies(arch, _cluster(fast_price=5.0), 32, schedules=("1f1b",), microbatch_sizes=(1,),
                     zero=(0,), sequence_parallel=(False,), recompute=("none",))
    splits = {e.strategy.pools: e.strategy.layers for e in res.estimates.values()
              if e.strategy.pools and len(set(e.strategy.pools)) == 2}
    assert splits == {(0, 1): (4, 8), (1, 0): (8, 4), (0, 0, 1, 1): (2, 2, 4, 4), (1, 1, 0, 0): (4, 4, 2, 2),
                      (0, 0, 0, 0, 1, 1, 1, 1): (1, 1, 1, 1, 2, 2, 2, 2),
                      (1, 1, 1, 1, 0, 0, 0, 0): (2, 2, 2, 2, 1, 1, 1, 1)}


def test_spanning_layouts_listed_by_hand():
    cluster = pc.Cluster.parse("a100:16,h100:8")
    # gcd(16, 8) = 8: tp=8 leaves dp=1 with 2 A100 ranks and 1 H100 rank, in either order.
    assert list(spanning(cluster, 8, layers=12)) == [((0, 0, 1), 1), ((1, 0, 0), 1)]
    # tp=4: dp=1 -> 4 + 2 ranks, dp=2 -> 2 + 1 ranks.
    assert list(spanning(cluster, 4, layers=12)) == [((0, 0, 0, 0, 1, 1), 1), ((1, 1, 0, 0, 0, 0), 1),
                                                    ((0, 0, 1), 2), ((1, 0, 0), 2)]
    # At most one rank per layer: 6 ranks do not fit 5 layers.
    assert list(spanning(cluster, 4, layers=5)) == [((0, 0, 1), 2), ((1, 0, 0), 2)]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=4), st.integers(0, 6), st.integers(0, 6),
       st.integers(0, 6))
def test_balance_matches_a_brute_force_over_every_split(times, first, last, spare):
    layers = len(times) + spare

    def worst(split):
        ends = [n * t for n, t in zip(split, times)]
        ends[0] += first
        ends[-1] += last
        return max(ends)

    splits = [c for c in itertools.product(range(1, layers + 1), repeat=len(times)) if sum(c) == layers]
    got = balance(times, first, last, layers)
    assert sum(got) == layers and min(got) >= 1
    assert worst(got) == min(worst(c) for c in splits)


def test_bad_mixed_strategies_name_the_rule():
    cluster = pc.Cluster.parse("a100:8,h100:8")
    with pytest.raises(pc.InputError, match=r"needs 16 GPUs of pool 0 .* has 8"):
        pc.estimate(ARCH, cluster, pc.Strategy(tp=8, pp=2, dp=2, pools=(0, 1)), global_batch=8)
    with pytest.raises(pc.InputError, match="pool 2 does not exist"):
        pc.estimate(ARCH, cluster, pc.Strategy(tp=8, pp=2, pools=(0, 2)), global_batch=8)
    with pytest.raises(pc.InputError, match=r"'layers' \[5, 5\] sum to 10; the model has 12"):
        pc.estimate(ARCH, cluster, pc.Strategy(tp=8, pp=2, pools=(0, 1), layers=(5, 5)), global_batch=8)
    with pytest.raises(pc.InputError, match="'pools' must be a sequence of 2 ints"):
        pc.Strategy(pp=2, pools=(0,))
    with pytest.raises(pc.InputError, match=r"'layers\[1\]' must be >= 1"):
        pc.Strategy(pp=2, layers=(12, 0))
    with pytest.raises(pc.InputError, match="12 layers cannot fill 13 stages"):
        balance([1.0] * 13, 0.0, 0.0, 12)


def test_uneven_layers_on_one_pool_move_time_to_the_heavier_stage():
    cluster = pc.Cluster.preset("dgx-a100", nodes=1)
    even = pc.estimate(ARCH, cluster, pc.Strategy(tp=4, pp=2, layers=(6, 6)), global_batch=8)
    same = pc.estimate(ARCH, cluster, pc.Strategy(tp=4, pp=2), global_batch=8)
    assert even.iteration_time == same.iteration_time
    skew = pc.estimate(ARCH, cluster, pc.Strategy(tp=4, pp=2, layers=(9, 3)), global_batch=8)
    assert skew.iteration_time > even.iteration_time


def test_plan_command_on_a_mixed_cluster_with_the_cost_objective(tmp_path, capsys):
    # The command, on a small model and cluster so it runs in seconds here.
    rc = main(["plan", "--model", "megatron-1.7b", "--cluster", "a100:8,h100:8", "--global-batch", "16",
               "--objective", "cost", "--max-iteration-time", "20", "--top", "5"])
    out = capsys.readouterr().out
    assert rc == 0
    lines = out.splitlines()
    assert lines[0].startswith("best: ") and "per million tokens" in out
    assert "8 x a100-sxm4-80gb + 8 x h100-sxm5-80gb" in out
    assert max(map(len, lines)) <= 120


def test_every_row_of_a_mixed_search_has_its_own_label_and_ranks_back():
    cluster = _cluster(fast_price=5.0)
    res = strategies(ARCH, cluster, 32, schedules=("1f1b",), microbatch_sizes=(1, 2), zero=(0,),
                     sequence_parallel=(False,), recompute=("none",))
    labels = res.table.column("strategy").to_pylist()
    assert len(labels) == len(set(labels))  # "pool 0" and "pool 1" tell the single-pool plans apart
    for e in list(res.estimates.values())[::7]:
        got = res.rank_of(e.strategy, ARCH, cluster, 32)
        row = next(r for r in res.table.to_pylist() if r["strategy"] == e.strategy.label())
        assert got.in_space and got.rank == row["rank"]

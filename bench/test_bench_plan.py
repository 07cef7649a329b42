"""Issue 53's speed bars: ``pc.estimate`` of one strategy under 50 ms warm, and
``pc.strategies`` for GPT-3 175B on 128 DGX A100 nodes (global batch 1,536)
estimating at least 2,000 strategies in under 30 s warm.

Run: pytest bench/test_bench_plan.py --benchmark-only

Both run after a warm-up, so what is timed is steady state: the Numba kernels
compiled and loaded (pipecore's tier runs the first calls interpreted), the
schedules of the warm-up built (estimate keeps recent ones). The strategies
bench times one whole search per round and prints how many strategies it
estimated.
"""

import pytest
from sizes import pick

import pipecore as pc

NODES, MODEL = pick((128, "gpt3-175b"), (1, "megatron-1.7b"))
BATCH = pick(1536, 32)
STRATEGY = pick(pc.Strategy(tp=8, pp=8, dp=16, microbatch_size=1, schedule="interleaved-1f1b", chunks=3,
                            recompute="selective", sequence_parallel=True, zero=1),
                pc.Strategy(tp=2, pp=2, dp=2, microbatch_size=1, schedule="interleaved-1f1b", chunks=2))


@pytest.fixture(scope="module")
def setting():
    return pc.Model.preset(MODEL), pc.Cluster.preset("dgx-a100", nodes=NODES)


def test_estimate_one_strategy(benchmark, setting):
    model, cluster = setting
    benchmark.group = f"pc.estimate {MODEL} on {NODES} DGX A100 nodes"
    for _ in range(20):  # past the interpreted tier, schedule built
        pc.estimate(model, cluster, STRATEGY, global_batch=BATCH)
    est = benchmark(pc.estimate, model, cluster, STRATEGY, global_batch=BATCH)
    assert est.iteration_time > 0


def test_strategies_search(benchmark, setting):
    model, cluster = setting
    benchmark.group = f"pc.strategies {MODEL} on {NODES} DGX A100 nodes, batch {BATCH}"
    pc.strategies(model, cluster, BATCH)  # warm-up: kernels and schedules
    res = benchmark.pedantic(pc.strategies, args=(model, cluster, BATCH), rounds=pick(3, 1), iterations=1)
    benchmark.extra_info["estimated"] = res.estimated
    print(f"\n[pc.strategies: {res.estimated} strategies estimated in {res.seconds:.1f} s, "
          f"{res.seconds / res.estimated * 1e3:.1f} ms each]")
    assert res.estimated > 0


def test_strategies_search_on_mixed_pools(benchmark):
    """The issue's mixed example, Llama 3 70B on 64 A100 + 32 H100, by cost within
    20 s per iteration (Astra: under 1.35 min on mixed GPU types)."""
    model = pc.Model.preset(pick("llama3-70b", "megatron-1.7b"))
    cluster = pc.Cluster.parse(pick("a100:64,h100:32", "a100:8,h100:8"))
    batch = pick(128, 32)
    benchmark.group = f"pc.strategies {model.architecture.name} on {cluster.name}, batch {batch}, by cost"
    kwargs = dict(objective="cost", max_iteration_time=20.0)
    pc.strategies(model, cluster, batch, **kwargs)  # warm-up
    res = benchmark.pedantic(pc.strategies, args=(model, cluster, batch), kwargs=kwargs, rounds=1,
                             iterations=1)
    benchmark.extra_info["estimated"] = res.estimated
    print(f"\n[pc.strategies mixed: {res.estimated} strategies estimated in {res.seconds:.1f} s]")
    assert res.estimated > 0

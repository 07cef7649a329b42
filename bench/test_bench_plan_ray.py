"""``pc.strategies(ray=True)`` against the serial search: GPT-3 175B on 128 DGX A100
nodes, global batch 1,536 (issue 53's search bar), on a local Ray instance of
this machine's CPUs.

Run: pytest bench/test_bench_plan_ray.py --benchmark-only   (needs pipecore[ray])

Steady state, as bench/test_bench_plan.py: Ray is started once for the
module and its workers warmed by a first search, so what is timed is the
tasks, the estimates they ship back (each with its simulated pipeline) and
the merge, not Ray's start (seconds: a one-off ``ray=True`` call pays it
too). The serial search is the group's baseline: the summary prints the Ray
search's median over it. On a machine whose CPUs other work already uses,
the tasks have no spare CPU to run on and the ratio is above 1.
"""

import logging

import pytest
from sizes import pick

import pipecore as pc
from pipecore.core.cpus import local_cpus

NODES, MODEL = pick((128, "gpt3-175b"), (1, "megatron-1.7b"))
BATCH = pick(1536, 32)
GROUP = f"pc.strategies {MODEL} on {NODES} DGX A100 nodes, batch {BATCH}: serial vs ray=True"


@pytest.fixture(scope="module")
def setting():
    ray = pytest.importorskip("ray", reason="the Ray search's bench needs the pipecore[ray] extra")
    ray.init(num_cpus=local_cpus(), include_dashboard=False, log_to_driver=False, logging_level=logging.ERROR)
    model, cluster = pc.Model.preset(MODEL), pc.Cluster.preset("dgx-a100", nodes=NODES)
    pc.strategies(model, cluster, BATCH)  # warm-up: kernels and schedules, here ...
    pc.strategies(model, cluster, BATCH, ray=True)  # ... and in the workers
    yield model, cluster
    ray.shutdown()


@pytest.mark.parametrize("on_ray", [False, True], ids=["serial", "ray"])
def test_strategies_search_on_ray(benchmark, setting, on_ray):
    model, cluster = setting
    benchmark.group = GROUP
    benchmark.extra_info["baseline"] = not on_ray
    res = benchmark.pedantic(pc.strategies, args=(model, cluster, BATCH), kwargs={"ray": on_ray},
                             rounds=pick(3, 1), iterations=1)
    print(f"\n[pc.strategies(ray={on_ray}): {res.estimated} strategies estimated in {res.seconds:.1f} s on "
          f"{local_cpus()} CPUs]")
    assert res.estimated > 0

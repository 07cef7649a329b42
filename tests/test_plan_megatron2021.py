"""What Megatron-LM did in 2021, as pc.estimate models it (issue 53, accuracy).

Each golden value is a closed form written here from the published constants of
the hardware presets (plan/data/gpus.toml, clusters.toml) and the byte counts
of the code the behaviour comes from:

- PyTorch's AccumulateGrad runs ``grad += new`` on 16-bit gradients from the
  second microbatch on (torch/csrc/autograd/functions/accumulate_grad.h):
  3 x 2 bytes per parameter; Megatron's fp32 main gradients (bf16) take
  ``main_grad.add_(grad)`` every microbatch: 2 + 4 + 4 bytes.
- Megatron's pipeline exchange (megatron/p2p_communication.py, 2021): each
  tensor-parallel rank sends 1/t of the activation over its own link, the
  receiving node all-gathers the pieces, and both GPUs wait for it.
- Megatron's Float16Optimizer copies fp16 gradients to fp32 and unscales them:
  (2 + 4) + (4 + 4) bytes per parameter beyond the bf16 step.
- Full recomputation reruns each transformer block's forward once, and not
  the head (Megatron checkpoints its layers only).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from reference_megatron2021 import interleaved_program, makespan, one_f_one_b_program

import pipecore as pc
from pipecore.analysis.architecture import Architecture
from pipecore.core.costs import Costs
from pipecore.core.simulate import simulate
from pipecore.plan import costmodel
from pipecore.plan.estimate import estimate
from pipecore.plan.hardware import Cluster
from pipecore.plan.strategy import Strategy
from pipecore.schedules.registry import build

GPT = Architecture(layers=8, hidden=1024, heads=16, seq=1024, vocab=51200, name="gpt-8x1024")
A100 = Cluster.preset("dgx-a100", nodes=2)
GPU = A100.pools[0].gpu
POOL = A100.pools[0]
# The A100 presets' constants, restated from the TOML files (bytes/s, seconds).
HBM = 2039e9 * 0.852
KERNEL = 5e-6
NVLINK_BUS, NVLINK_LATENCY = 230e9, 10e-6
IB_P2P, IB_LATENCY = 24e9, 20e-6


def test_the_presets_constants_are_the_ones_restated_here():
    assert GPU.hbm_bandwidth * GPU.hbm_efficiency == HBM and GPU.kernel_overhead == KERNEL
    assert (POOL.intra_bus_bandwidth, POOL.intra_latency) == (NVLINK_BUS, NVLINK_LATENCY)
    assert (POOL.p2p_inter_bandwidth, POOL.inter_latency) == (IB_P2P, IB_LATENCY)


@pytest.mark.parametrize("m", [1, 4])
def test_unfused_fp16_accumulation_reads_and_writes_six_bytes_per_parameter_after_the_first(m):
    # One GPU (pp = tp = 1): the pipeline is m microbatches back to back, so the
    # unfused run is slower by (m - 1) passes over every gradient, one kernel per tensor.
    fused = Strategy(microbatch_size=1, precision="fp16")
    unfused = Strategy(microbatch_size=1, precision="fp16", grad_accumulation_fusion=False)
    a = estimate(GPT, A100, fused, global_batch=m)
    b = estimate(GPT, A100, unfused, global_batch=m)
    params = GPT.params()  # one device holds the tied table once
    tensors = 12 * GPT.layers + 2 + 3
    expected = (m - 1) * (6 * params / HBM + tensors * KERNEL)
    assert b.iteration_time - a.iteration_time == pytest.approx(expected, rel=1e-9, abs=1e-12)


def test_unfused_bf16_accumulation_adds_into_fp32_main_gradients_every_microbatch():
    m = 3
    fused = Strategy(microbatch_size=1)
    unfused = Strategy(microbatch_size=1, grad_accumulation_fusion=False)
    a = estimate(GPT, A100, fused, global_batch=m)
    b = estimate(GPT, A100, unfused, global_batch=m)
    expected = m * (10 * GPT.params() / HBM + (12 * GPT.layers + 5) * KERNEL)
    assert b.iteration_time - a.iteration_time == pytest.approx(expected, rel=1e-9)


def _exchange(t, nbytes):
    # One scattered send over a GPU's own NIC, then the node's all-gather of the pieces.
    send = IB_LATENCY + nbytes / t / IB_P2P
    gather = NVLINK_LATENCY + (t - 1) / t * nbytes / NVLINK_BUS
    return send + gather


@pytest.mark.parametrize("overlap", [True, False])
def test_one_microbatch_through_two_nodes_pays_two_scattered_exchanges(overlap):
    # tp=8 fills a node, so stage 1 is on the other node. With one microbatch nothing
    # overlaps: the activation goes forward once and its gradient back once, each a
    # send of 1/8 over InfiniBand plus an all-gather over NVLink.
    s = Strategy(tp=8, pp=2, microbatch_size=2, p2p_overlap=overlap)
    est = estimate(GPT, A100, s, global_batch=2)
    nbytes = 2 * GPT.seq * GPT.hidden * 2
    assert est.breakdown["pp_comm"] == pytest.approx(2 * _exchange(8, nbytes), rel=1e-9)
    assert math.isclose(sum(est.breakdown.values()), est.iteration_time, rel_tol=1e-9)


def test_blocking_exchanges_cost_at_least_as_much_as_overlapped_ones():
    base = dict(tp=8, pp=2, microbatch_size=1, schedule="1f1b")
    a = estimate(GPT, A100, Strategy(**base), global_batch=16)
    b = estimate(GPT, A100, Strategy(**base, p2p_overlap=False), global_batch=16)
    assert b.iteration_time >= a.iteration_time
    # Blocking, two stages: each steady 1F1B step runs F, B and one exchange (the forward
    # send of device 0 and the backward send of device 1 are one batched exchange), so
    # the 16 microbatches pay about one exchange each, the first two.
    x = _exchange(8, GPT.seq * GPT.hidden * 2)
    assert 15 * x <= b.breakdown["pp_comm"] <= 17 * x * (1 + 1e-9)


def test_fp16_optimizer_copies_and_unscales_the_gradients():
    a = estimate(GPT, A100, Strategy(precision="bf16"), global_batch=1)
    b = estimate(GPT, A100, Strategy(precision="fp16"), global_batch=1)
    assert b.breakdown["optimizer"] - a.breakdown["optimizer"] == \
        pytest.approx(14 * GPT.params() / HBM, rel=1e-9)


def test_full_recomputation_reruns_the_blocks_not_the_head():
    none = estimate(GPT, A100, Strategy(), global_batch=1)
    full = estimate(GPT, A100, Strategy(recompute="full"), global_batch=1)
    block = costmodel.block_times(GPT, GPU, A100, 0, Strategy())
    assert full.iteration_time - none.iteration_time == pytest.approx(GPT.layers * block.f, rel=1e-9)


@pytest.mark.parametrize(("kwargs", "words"), [
    (dict(p2p_overlap="no"), ["'p2p_overlap'", "True or False"]),
    (dict(grad_accumulation_fusion=0), ["'grad_accumulation_fusion'", "True or False"]),
])
def test_the_new_fields_refuse_non_bools(kwargs, words):
    with pytest.raises(pc.InputError) as info:
        Strategy(**kwargs)
    for word in words:
        assert word in str(info.value)


def test_labels_say_when_the_2021_behaviours_are_on():
    s = Strategy(tp=8, pp=2, p2p_overlap=False, grad_accumulation_fusion=False)
    assert "p2p=blocking" in s.label() and "grad-acc=unfused" in s.label()
    assert "p2p" not in Strategy().label()


# pipecore's blocking exchanges against an independent rendezvous reference of Megatron's
# 2021 schedules (tests/reference_megatron2021.py): the folded exchange times, pipecore's
# schedule and its simulator together must time the pipeline as that code would.
@pytest.mark.parametrize(("schedule", "p", "v", "m", "head"), [
    ("1f1b", 4, 1, 12, 0.0), ("1f1b", 4, 1, 12, 0.4), ("interleaved-1f1b", 4, 3, 8, 0.0),
    ("interleaved-1f1b", 4, 3, 8, 0.4), ("interleaved-1f1b", 4, 2, 4, 0.0),
])
def test_blocking_exchanges_time_megatrons_2021_schedules(schedule, p, v, m, head):
    stages = p * v
    f, b = np.full(stages, 1.0), np.full(stages, 3.0)
    f[-1] += head / 2  # a heavier last stage, as the LM head makes it
    b[-1] += head
    cluster = Cluster.preset("dgx-a100", nodes=p)
    strategy = Strategy(tp=8, pp=p, chunks=v, schedule=schedule, p2p_overlap=False)
    sched = build(schedule, devices=p, microbatches=m, chunks=v if v > 1 else None)
    nbytes = 2e9  # large enough that an exchange is a tenth of a stage's forward
    f_add, b_add = costmodel.pipeline_comm(cluster, 0, strategy, [ds[0] for ds in sched.stage_devices],
                                           nbytes, True, 1)
    x = _exchange(8, nbytes)
    assert np.allclose(f_add[:-1], x) and np.allclose(b_add[1:], x) and f_add[-1] == b_add[0] == 0
    ours = simulate(sched, Costs(f=f + f_add, b=b + b_add, w=np.zeros(stages))).makespan
    programs = ([one_f_one_b_program(d, p, m) for d in range(p)] if v == 1
                else [interleaved_program(d, p, v, m) for d in range(p)])
    ref = makespan(programs, lambda d, c: f[c * p + d], lambda d, c: b[c * p + d], x)
    # Exact for 1F1B; the interleaved steady state sends two tensors per exchange where
    # pipecore charges one per op, which can move a few exchanges along the critical path.
    assert ours == pytest.approx(ref, rel=1e-9 if v == 1 else 2e-3)

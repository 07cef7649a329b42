"""Building blocks and the V-shaped schedules of "Pipeline Parallelism with
Controllable Memory" (Qi et al., NeurIPS 2024).

Golden numbers:
- peak activation in microbatches, V-Min (p+4)//3, V-Half (p+2)//2, V-ZB p
  (the paper's Table 1 and its Hugging Face space), counting an activation
  as alive until its W ends (activation_w == activation), as the paper does;
- bubbles at unit op times, in op-time units, for p = 2..9: the output of the
  authors' generator (megatron/core/pipeline_parallel/zerobubble/scheduler/
  zbv_greedy.py in sail-sg/zero-bubble-pipeline-parallelism, run at m = 8 and
  larger with F = B = W = 1 and no communication): V-Min 3 5 11 15 17 23 27 29,
  V-Half 1 5 5 11 11 17 17 23; V-ZB has none.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipecore as pc
from pipecore import blocks

UNIT = pc.Costs(f=2.0, b=2.0, w=2.0, activation=1.0, activation_w=1.0)  # chunk ops take 1


@pytest.mark.parametrize("p", [4, 6, 8, 16])
@pytest.mark.parametrize("name,target", [("v-min", lambda p: (p + 4) // 3),
                                         ("v-half", lambda p: (p + 2) // 2),
                                         ("v-zb", lambda p: p)])
def test_peak_activation(name, target, p):
    res = pc.simulate(pc.build(name, p, 4 * p), UNIT)
    assert res.peak_activation.max() == target(p)


@pytest.mark.parametrize("name,bubbles", [
    ("v-min", [3, 5, 11, 15, 17, 23, 27, 29]),
    ("v-half", [1, 5, 5, 11, 11, 17, 17, 23]),
    ("v-zb", [0] * 8),
])
def test_bubbles_match_authors_generator(name, bubbles):
    got = []
    for p in range(2, 10):
        res = pc.simulate(pc.build(name, p, 4 * p), UNIT)
        got.append(float((res.span - res.busy).max()))
    assert got == bubbles


def test_v_placement_and_doubled_transfers():
    p, m = 4, 8
    zbv = pc.build("v-zb", p, m)
    np.testing.assert_array_equal(zbv.placement, [0, 1, 2, 3, 3, 2, 1, 0])
    linear = pc.simulate(pc.build("zb-h1", p, m), UNIT)
    v = pc.simulate(zbv, UNIT)
    # Linear: 2(p-1) transfers per microbatch; V: 2p-1 boundaries, the turn
    # (stages p-1, p on device p-1) stays local, so 2(2p-2): twice as many.
    assert linear.transfers.num_rows == 2 * (p - 1) * m
    assert v.transfers.num_rows == 2 * linear.transfers.num_rows
    stages = set(v.transfers.column("stage").to_pylist())
    kinds = v.transfers.to_pydict()
    turn = [k for k in range(len(kinds["stage"]))
            if (kinds["stage"][k], kinds["kind"][k]) in {(p - 1, "F"), (p, "B")}]
    assert turn == [] and stages


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(["v-min", "v-half", "v-zb"]), p=st.integers(1, 7), m=st.integers(1, 20),
       aw=st.sampled_from([0.0, 0.4, 1.0]), reorder=st.booleans())
def test_memory_never_exceeds_block_bound(name, p, m, aw, reorder):
    block = {"v-min": blocks.v_min, "v-half": blocks.v_half, "v-zb": blocks.v_zb}[name](p)
    sched = blocks.repeat(block, m).squeeze(reorder=reorder)
    res = pc.simulate(sched, pc.Costs(f=2.0, b=2.0, w=2.0, activation=1.0, activation_w=aw))
    assert np.all(res.peak_activation <= block.memory_bound() + 1e-9)
    assert pc.validate(sched) is sched


def test_block_api_and_1f1b_block():
    # 1F1B as a block (the paper's Table 1): F(s) at s, fused BW (2 units) chained
    # back from the last stage, interval F + BW = 3. Lifespans 3p-2+2-s... give
    # ceil(l/3) = p - s live microbatches: 1F1B's peaks p, p-1, ..., 1.
    p = 3
    offsets = {("F", s): s for s in range(p)}
    offsets.update({("BW", s): p + 2 * (p - 1 - s) for s in range(p)})
    block = blocks.BuildingBlock(tuple(range(p)), offsets, 3.0, name="mine")
    assert block.lifespan(0) == 3 * p
    np.testing.assert_array_equal(block.memory_bound(), [3.0, 2.0, 1.0])
    sched = blocks.repeat(block, 6).squeeze()
    assert sched.name == "mine" and sched.microbatches == 6
    res = pc.simulate(sched, pc.Costs(f=1.0, b=2.0, w=0.0))
    np.testing.assert_array_equal(res.peak_activation, [3.0, 2.0, 1.0])
    # Its squeezed order is 1F1B's, so it takes 1F1B's (m + p - 1) * 3.
    assert res.makespan == (6 + p - 1) * 3


def test_block_errors_name_the_problem():
    with pytest.raises(ValueError, match="stage 1 has offsets for"):
        blocks.BuildingBlock((0, 1), {("F", 0): 0, ("BW", 0): 3, ("F", 1): 1}, 4.0)
    with pytest.raises(ValueError, match=r"1F starts at 0 but needs 0F, which ends at 1"):
        blocks.BuildingBlock((0, 1), {("F", 0): 0, ("F", 1): 0, ("BW", 1): 1, ("BW", 0): 3}, 5.0)
    with pytest.raises(ValueError, match="collide on device 0"):
        blocks.BuildingBlock((0, 0), {("F", 0): 0, ("F", 1): 1, ("BW", 1): 2, ("BW", 0): 7}, 8.0)
    with pytest.raises(ValueError, match="6 time units of ops per microbatch but the interval is 5"):
        blocks.BuildingBlock((0, 0), {("F", 0): 0, ("F", 1): 1, ("BW", 1): 2, ("BW", 0): 4}, 5.0)
    with pytest.raises(ValueError, match="interval"):
        blocks.BuildingBlock((0,), {("F", 0): 0, ("BW", 0): 1}, 0.0)
    with pytest.raises(ValueError, match=r"device 1 holds no stage \(placement \[0, 2\]\)"):
        blocks.BuildingBlock((0, 2), {("F", 0): 0, ("F", 1): 1, ("BW", 1): 2, ("BW", 0): 4}, 6.0)
    with pytest.raises(ValueError, match=r"'microbatches' must be >= 1 \(got 0\)"):
        blocks.repeat(blocks.v_zb(2), 0)

"""Model and hardware description: formulas against hand-computed numbers."""

import dataclasses
import math
import types

import numpy as np
import pytest

import pipecore as pc
from pipecore.analysis import study
from pipecore.analysis.model import Hardware, Layer, Model

# A small config, numbers worked by hand below:
# b = 2, s = 32, h = 64, a = 4, V = 100, 16-bit values (q = 2).
# s b h = 32 * 2 * 64 = 4096.
SMALL = dict(layers=2, hidden=64, heads=4, seq=32, vocab=100, microbatch=2)


def test_block_formulas_by_hand():
    full = Model.transformer(**SMALL, selective_recompute=False)
    emb, b0, b1, head = full.layers
    assert [x.kind for x in full.layers] == ["embedding", "block", "block", "head"]
    # Narayanan et al. forward: 24 b s h^2 + 4 b s^2 h = 24*2*32*4096 + 4*2*1024*64
    #                                              = 6,291,456 + 524,288
    assert b0.flops_f == 6_815_744
    # ZB Table 1: B = 24 b s h^2 + 8 b s^2 h = 6,291,456 + 1,048,576; W = 24 b s h^2
    assert b0.flops_b == 7_340_032
    assert b0.flops_w == 6_291_456
    # Korthikanti eq. 1: s b h (34 + 5 a s / h) = 4096 * (34 + 5*4*32/64) = 4096 * 44
    assert b0.activation == 180_224
    # ZB Table 1's M_W: 32 s b h = 131,072
    assert b0.activation_w == 131_072
    # Megatron: 12 h^2 + 13 h = 49,152 + 832 parameters; 16 bytes each with Adam (ZeRO)
    assert b0.params == 49_984
    assert b0.param_bytes == 49_984 * 16
    assert b0.output_bytes == 8192  # s b h values of 2 bytes
    assert b1 == dataclasses.replace(b0, name="block 1")
    # Embedding: V h = 6400 parameters; the dropout mask s b h bytes (Korthikanti 4.3)
    assert emb.params == 6400 and emb.activation == 4096 and emb.flops_f == 0
    # Head: 2 b s h V = 2*2*32*64*100 = 819,200 FLOPs each for F, B and W;
    # V h + 2 h = 6528 parameters; activation 2 s b h q + 4 s b V = 16,384 + 25,600
    assert head.flops_f == head.flops_b == head.flops_w == 819_200
    assert head.params == 6528
    assert head.activation == 41_984


def test_selective_recompute_drops_the_attention_scores():
    sel = Model.transformer(**SMALL)  # the default
    blk = sel.layers[1]
    assert blk.activation == 34 * 4096  # Korthikanti's selective-recompute 34 s b h
    # B reruns the attention core's forward, 4 b s^2 h = 524,288 more FLOPs
    assert blk.flops_b == 7_340_032 + 524_288
    assert blk.flops_f == 6_815_744


def test_total_flops_match_megatron_iteration_formula():
    # Narayanan et al. eq. 3 without recompute: 72 B s l h^2 (1 + s/(6h) + V/(12 h l)),
    # with B = 2, s = 32, l = 2, h = 64, V = 100: 37,748,736 * (1 + 1/12 + 25/384)
    # = 37,748,736 + 3,145,728 + 2,457,600 = 43,352,064. The embedding adds its
    # gradient scatter-add, s b h = 4096 FLOPs, which the formula leaves out.
    full = Model.transformer(**SMALL, selective_recompute=False)
    assert full.totals()["flops"] == 43_352_064 + 4096


def test_bytes_per_value_generalises_korthikanti():
    # 4-byte values: s b h (16*4 + 2) + a s^2 b (2*4 + 1) = 4096*66 + 4*1024*2*9
    m = Model.transformer(**SMALL, bytes_per_value=4, selective_recompute=False)
    assert m.layers[1].activation == 4096 * 66 + 73_728
    assert m.layers[1].output_bytes == 4096 * 4


def test_roofline_times():
    hw = Hardware(flops=1e9, memory_bandwidth=1e8, link_bandwidth=1e9, link_latency=0.0)
    m = Model.transformer(**SMALL)
    t = m.layer_times(hw)
    # Block F: compute-bound, 6,815,744 / 1e9 s (bytes: 49,984*2 + 139,264 = 239,232 -> 2.39e-3 s)
    assert t[1, 0] == pytest.approx(6.815744e-3, rel=1e-15)
    # Embedding F: no FLOPs; 2 s b h q = 16,384 bytes at 1e8 B/s
    assert t[0, 0] == pytest.approx(1.6384e-4, rel=1e-15)
    assert t[0, 1] == 0.0
    # A memory-bound block when the FLOP/s are huge: 239,232 bytes / 1e8
    fast = dataclasses.replace(hw, flops=1e15)
    assert m.layer_times(fast)[1, 0] == pytest.approx(2.39232e-3, rel=1e-15)


def test_stage_costs_and_network():
    hw = Hardware(flops=1e9, memory_bandwidth=1e8, link_bandwidth=1e9, link_latency=1e-6)
    m = Model.transformer(**SMALL)
    t = m.layer_times(hw)
    costs = m.costs([2, 1, 1], hw)  # [embedding, block 0], [block 1], [head]
    assert np.array_equal(costs.f, [t[0, 0] + t[1, 0], t[2, 0], t[3, 0]])
    assert np.array_equal(costs.w, [t[0, 2] + t[1, 2], t[2, 2], t[3, 2]])
    assert np.array_equal(costs.activation, [4096 + 139_264, 139_264, 41_984])
    assert np.array_equal(costs.weights, [(6400 + 49_984) * 16, 49_984 * 16, 6528 * 16])
    net = m.network([2, 1, 1], hw)
    # Every hop carries s b h 2-byte values (the last stage's entry is the gradient its B sends).
    assert np.array_equal(net.bytes, [8192, 8192, 8192])
    assert net.bandwidth == 1e9 and net.latency == 1e-6 and net.devices_per_node is None
    assert m.stage_ranges([2, 1, 1]) == [(0, 2), (2, 3), (3, 4)]
    two = Hardware.preset("h100-nvlink").network(1.0)
    assert two.devices_per_node == 8 and two.inter_bandwidth == 50e9


def test_presets_follow_the_data_sheets():
    h = Hardware.preset("h100-nvlink")
    assert (h.flops, h.memory_bandwidth, h.hbm_bytes, h.link_bandwidth) == (989e12, 3.35e12, 80e9, 450e9)
    a = Hardware.preset("A100-NVLINK")
    assert (a.flops, a.memory_bandwidth, a.link_bandwidth) == (312e12, 2.039e12, 300e9)
    p = Hardware.preset("h100-pcie")
    assert (p.flops, p.memory_bandwidth, p.link_bandwidth) == (756e12, 2.0e12, 64e9)
    assert set(Hardware.presets()) >= {"h100-nvlink", "a100-nvlink", "h100-pcie"}
    # Editable as a dataclass; the same first fields as the study's Hardware.
    edited = dataclasses.replace(h, hbm_bytes=40e9)
    assert edited.hbm_bytes == 40e9 and h.hbm_bytes == 80e9
    # One roofline: the study uses this Hardware (issue 13), so its preset is this one.
    assert study.Hardware is Hardware
    new = Hardware.preset("dgx-h100")
    assert (new.flops, new.memory_bandwidth, new.link_bandwidth, new.link_latency) == \
        (989e12, 3.35e12, 50e9, 0.5e-6)
    s = h.scaled(compute=2, network=0.5)
    assert s.flops == 2 * 989e12 and s.link_bandwidth == 225e9 and s.inter_bandwidth == 25e9


def test_uniform_model_gives_exact_times():
    m = Model.uniform(4, f=0.5, b=1.0, w=0.25)
    hw = Hardware(flops=1.0, memory_bandwidth=math.inf, link_bandwidth=math.inf, link_latency=0.0)
    costs = m.costs([2, 2], hw)
    assert costs.f.tolist() == [1.0, 1.0] and costs.b.tolist() == [2.0, 2.0]
    assert costs.w.tolist() == [0.5, 0.5]
    assert isinstance(costs, pc.Costs)


def test_bad_inputs():
    with pytest.raises(ValueError, match="unknown hardware preset 'tpu'"):
        Hardware.preset("tpu")
    with pytest.raises(ValueError, match="'flops' must be finite and > 0"):
        Hardware(flops=-1.0, memory_bandwidth=1.0, link_bandwidth=1.0, link_latency=0.0)
    with pytest.raises(ValueError, match="'inter_bandwidth' is required"):
        Hardware(1.0, 1.0, 1.0, 0.0, devices_per_node=4)
    with pytest.raises(ValueError, match="'hidden' \\(64\\) must be a multiple of 'heads' \\(5\\)"):
        Model.transformer(layers=2, hidden=64, heads=5, seq=8, vocab=10)
    with pytest.raises(ValueError, match="'layers' must be an int >= 1"):
        Model.transformer(layers=0, hidden=64, heads=4, seq=8, vocab=10)
    with pytest.raises(ValueError, match="Layer 'kind' must be one of"):
        Layer("x", "mlp", *[0.0] * 11)
    with pytest.raises(ValueError, match="'activation_w' must be <= 'activation'"):
        Layer("x", "block", 0, 0, 0, 0, 0, 0, 1.0, 2.0, 0, 0, 0)
    with pytest.raises(ValueError, match="Layer 'flops_f' must be finite"):
        Layer("x", "block", math.nan, 0, 0, 0, 0, 0, 1.0, 0.0, 0, 0, 0)
    m = Model.uniform(4)
    with pytest.raises(ValueError, match="sums to 3 but the model has 4 layers"):
        m.costs([2, 1], Hardware(1.0, 1.0, 1.0, 0.0))
    with pytest.raises(ValueError, match="gives stage 1 0 layers"):
        m.stage_ranges([4, 0])
    with pytest.raises(ValueError, match="'hardware' must be a pipecore.model.Hardware"):
        m.layer_times(types.SimpleNamespace(flops=1.0, memory_bandwidth=1.0))
    with pytest.raises(ValueError, match="Model 'layers'\\[0\\] must be a pipecore Layer"):
        Model(layers=[1.0])

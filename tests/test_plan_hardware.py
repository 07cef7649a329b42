"""pipecore.plan.hardware: GPU and cluster presets against the public measurements they cite.

Golden numbers come from outside the code: data sheets (NVIDIA A100 and H100),
nccl-tests results posted by NVIDIA engineers and users (issue numbers in each
test), the "maximum achievable matmul FLOPS" table of stas00/ml-engineering, and
OpenXLA's measured H100 GEMM table (XLA_H100 below).
"""

import numpy as np
import pytest

from pipecore.core.ops import InputError
from pipecore.plan.hardware import GPU, Cluster

GIB = 2**30

# OpenXLA, xla/service/gpu/model/matmul_interpolator_data.h (as vendored in tensorflow/tensorflow
# third_party/xla), key "sm_90" (H100), "BF16xBF16->BF16": (batch, m, n, k, measured FLOP/s).
# The entries with batch 1 set gemm_k_half and gemm_tile_exponent (data/gpus.toml); the
# batched ones are held out and checked here.
XLA_H100 = [
    (1, 1024, 4096, 512, 340681153010232), (4, 256, 1024, 256, 82850449382716),
    (2, 1024, 4096, 512, 448139325542570), (1, 2048, 1024, 256, 139810133333333),
    (1, 4096, 2048, 4096, 764093096602028), (2, 512, 256, 4096, 170111188846641),
    (4, 512, 512, 512, 148470938053097), (4, 1024, 4096, 512, 542020102978293),
    (2, 256, 4096, 1024, 362750616216216), (1, 512, 4096, 4096, 653127630170316),
    (4, 2048, 4096, 512, 608524694814395), (1, 4096, 256, 1024, 216131607085346),
    (4, 4096, 4096, 512, 621648182949775), (1, 1024, 256, 512, 41838443890274),
    (2, 1024, 256, 512, 77852510440835), (1, 512, 512, 2048, 115307326460481),
    (2, 256, 256, 1024, 37617076233183), (1, 512, 256, 4096, 92182505494505),
    (4, 4096, 256, 512, 334707551122194), (2, 4096, 512, 256, 214748364800000),
    (4, 2048, 256, 512, 233828794425087), (2, 512, 4096, 4096, 734182443760683),
    (2, 512, 512, 2048, 231809547495682), (2, 256, 2048, 4096, 426765430842607),
    (2, 2048, 1024, 256, 219310013071895), (4, 1024, 1024, 1024, 489845722627737),
    (4, 256, 1024, 4096, 456911414468085), (4, 2048, 1024, 1024, 598852104852203),
    (2, 1024, 4096, 256, 299927883798882), (1, 256, 2048, 4096, 288330242749731),
    (1, 256, 256, 1024, 17848102127659), (4, 4096, 1024, 1024, 673192366144200),
    (1, 2048, 1024, 4096, 659141696746470), (4, 1024, 256, 512, 138368791752577),
    (1, 4096, 4096, 1024, 681092181414525), (1, 1024, 4096, 256, 214748364800000),
    (4, 4096, 4096, 256, 505052598306679), (2, 1024, 1024, 1024, 378611362482369),
    (1, 1024, 1024, 1024, 246723764705882), (4, 1024, 4096, 256, 390735743813682),
    (4, 512, 512, 256, 80854053012048), (1, 256, 4096, 1024, 229040491467576),
    (1, 1024, 256, 256, 23967451428571), (2, 1024, 256, 256, 48210390804597),
    (2, 4096, 512, 512, 341955994904458), (4, 4096, 256, 256, 206806976887519),
    (4, 2048, 256, 256, 138368791752577), (4, 2048, 4096, 256, 455361248515691),
    (4, 1024, 256, 256, 77852510440835), (2, 2048, 1024, 4096, 742303369512616),
    (1, 1024, 512, 1024, 141879205073995), (2, 1024, 512, 1024, 240533562724014),
    (2, 2048, 2048, 1024, 604924971267605), (2, 2048, 256, 2048, 321865055155875),
    (1, 2048, 4096, 2048, 717502054126294), (2, 512, 2048, 512, 238821580071174),
    (4, 2048, 512, 1024, 489399190519598), (4, 256, 512, 4096, 307134389016018),
    (4, 4096, 512, 1024, 590617064906490), (4, 512, 4096, 1024, 597519100723427),
    (1, 2048, 512, 4096, 455747803056027), (2, 256, 512, 512, 41838443890274),
    (4, 256, 4096, 2048, 600526747203579), (2, 2048, 512, 4096, 656321408312958),
    (2, 2048, 4096, 2048, 726360104177236), (1, 256, 512, 256, 12520310447761),
    (4, 1024, 512, 1024, 373865537604456), (1, 2048, 2048, 1024, 492090661778185),
    (2, 1024, 2048, 2048, 632729418974661), (1, 1024, 2048, 2048, 526344031372549),
    (1, 4096, 512, 512, 239247286987522), (4, 512, 256, 1024, 139230008298755),
]


def test_presets_load_and_every_constant_names_its_source():
    assert GPU.presets() == ["a100-sxm4-80gb", "h100-sxm5-80gb"]
    assert set(Cluster.presets()) >= {"dgx-a100", "dgx-h100"}
    for name in GPU.presets():
        gpu = GPU.preset(name)
        for f in ("peak_flops", "hbm_bytes", "hbm_bandwidth", "hbm_efficiency", "kernel_overhead",
                  "sm_count", "gemm_tiles", "gemm_shape", "gemm_max_efficiency"):
            assert len(gpu.sources.get(f, "")) > 30, (name, f)
    for name in Cluster.presets():
        pool = Cluster.preset(name, 2).pools[0]
        for f in ("intra_bus_bandwidth", "inter_bus_bandwidth", "intra_latency", "inter_latency",
                  "p2p_intra_bandwidth", "p2p_inter_bandwidth", "price_per_gpu_hour"):
            assert len(pool.sources.get(f, "")) > 30, (name, f)
        assert pool.count == 2 * pool.gpus_per_node == 16


def test_values_match_the_data_sheets():
    # NVIDIA A100 data sheet: 312 TFLOPS BF16 dense, 2,039 GB/s (80GB SXM), 80 GB; 108 SMs.
    a100 = GPU.preset("a100-sxm4-80gb")
    assert (a100.peak_flops, a100.hbm_bandwidth, a100.sm_count) == (312e12, 2039e9, 108)
    assert a100.hbm_bytes == 80 * GIB
    # NVIDIA H100 data sheet: 1,979 TFLOPS BF16 with sparsity (989 dense), 3.35 TB/s, 80 GB; 132 SMs.
    h100 = GPU.preset("h100-sxm5-80gb")
    assert (h100.peak_flops, h100.hbm_bandwidth, h100.sm_count) == (989e12, 3.35e12, 132)
    assert 80e9 <= h100.hbm_bytes <= 80 * GIB
    for gpu in (a100, h100):
        assert 0.5 < gpu.hbm_efficiency < 1 and 1e-6 < gpu.kernel_overhead < 2e-5


# stas00/ml-engineering, "Maximum Achievable Matmul FLOPS comparison table" (BF16):
# A100 SXM 271.2 TFLOPS at 1024x10240x5120; H100 SXM 794.5 TFLOPS at 2048x2048x13312.
MAMF = {"a100-sxm4-80gb": (271.2e12, (1024, 10240, 5120)), "h100-sxm5-80gb": (794.5e12, (2048, 2048, 13312))}


@pytest.mark.parametrize("name", sorted(MAMF))
def test_gemm_efficiency_at_the_measured_best_shape_and_never_above_it(name):
    gpu = GPU.preset(name)
    flops, shape = MAMF[name]
    measured = flops / gpu.peak_flops
    # The model at the benchmark's best shape: within 5% of the measurement (not fitted there).
    assert gpu.gemm_efficiency(*shape) == pytest.approx(measured, rel=0.05)
    # No swept shape may beat the measured maximum.
    grid = np.arange(256, 20481, 256)
    assert gpu.gemm_efficiency(grid[:, None], grid[None, :], shape[2]).max() <= measured * (1 + 1e-9)


def test_gemm_time_against_openxla_measured_h100_batched_gemms():
    # Held-out entries (batch > 1); XLA times a whole op, so the launch cost is added.
    gpu = GPU.preset("h100-sxm5-80gb")
    data = np.array([row for row in XLA_H100 if row[0] > 1], dtype=float)
    b, m, n, k, flops = data.T
    measured = 2 * b * m * n * k / flops
    model = gpu.gemm_time(m, n, k, batch=b) + gpu.kernel_overhead
    err = np.log(model / measured)
    assert len(data) == 49
    assert np.sqrt(np.mean(err**2)) < 0.10  # RMS within 10%
    assert np.abs(err).max() < 0.20  # every shape within 20% (in log time)


def test_gemm_efficiency_falls_for_small_and_skinny_shapes():
    for name in GPU.presets():
        gpu = GPU.preset(name)
        square = gpu.gemm_efficiency(8192, 8192, 8192)
        # OpenXLA H100: 256x2048x4096 reaches 288 TFLOP/s (29%), 1024^3 247 TFLOP/s (25%) end to end.
        assert gpu.gemm_efficiency(256, 2048, 4096) < 0.8 * square
        assert gpu.gemm_efficiency(1024, 1024, 64) < 0.5 * square
        assert gpu.gemm_time(8192, 8192, 8192) == pytest.approx(2 * 8192**3 / (gpu.peak_flops * square))
        sizes = np.array([512, 1024, 2048, 4096])
        assert np.all(np.diff(gpu.gemm_time(sizes, sizes, sizes)) > 0)
        assert isinstance(gpu.gemm_efficiency(512, 512, 512), float)
        assert gpu.memory_time(GIB) == pytest.approx(GIB / (gpu.hbm_bandwidth * gpu.hbm_efficiency))


def test_all_reduce_inside_a_dgx_a100_matches_nccl_tests():
    cluster = Cluster.preset("dgx-a100", 2)
    t = cluster.collective_time("all-reduce", GIB, 8, 8)
    # NVIDIA/nccl issue 1048: 8x A100, 1 GiB and up, busbw 232.54 GB/s; FIELD.md: about 230 GB/s.
    assert GIB * 2 * 7 / 8 / t == pytest.approx(232.54e9, rel=0.03)
    # Across two nodes, 8 GPUs each with its HDR NIC: 8 x 24 GB/s (nccl-tests issue 119).
    t16 = cluster.collective_time("all-reduce", GIB, 16, 8)
    assert GIB * 2 * 15 / 16 / t16 == pytest.approx(192e9, rel=0.03)
    assert t16 > t
    # One rank per node: a single NIC's 24 GB/s.
    t2 = cluster.collective_time("all-reduce", GIB, 2, 1)
    assert GIB / t2 == pytest.approx(24e9, rel=0.03)


def test_h100_all_reduce_uses_nvlink_sharp_and_the_ring_for_the_rest():
    cluster = Cluster.preset("dgx-h100", 1)
    # nccl-tests issue 212 (sjeaugey): ~480 GB/s busbw all-reduce with NVLS; ~370 GB/s ring for other ops.
    t_ar = cluster.collective_time("all-reduce", 8 * GIB, 8, 8)
    t_ag = cluster.collective_time("all-gather", 8 * GIB, 8, 8)
    assert 8 * GIB * 2 * 7 / 8 / t_ar == pytest.approx(480e9, rel=0.02)
    assert 8 * GIB * 7 / 8 / t_ag == pytest.approx(370e9, rel=0.02)


@pytest.mark.parametrize("ranks,per_node", [(8, 8), (4, 4), (16, 8), (4, 1), (32, 4)])
def test_collectives_behave(ranks, per_node):
    cluster = Cluster.preset("dgx-a100", 8)
    sizes = np.logspace(3, 31, 15, base=2)
    times = {kind: cluster.collective_time(kind, sizes, ranks, per_node)
             for kind in ("all-reduce", "reduce-scatter", "all-gather")}
    for t in times.values():
        assert np.all(np.diff(t) > 0)
    # Ring volumes: all-reduce moves twice the data of reduce-scatter; all-gather the same as it.
    latency = times["reduce-scatter"][0] - (times["reduce-scatter"][1] - times["reduce-scatter"][0])
    assert np.allclose(times["all-reduce"] - latency, 2 * (times["reduce-scatter"] - latency), rtol=1e-6)
    assert np.allclose(times["all-gather"], times["reduce-scatter"])
    # Small messages are latency-bound: far below the peak bus bandwidth.
    busbw = sizes * 2 * (ranks - 1) / ranks / times["all-reduce"]
    assert busbw[0] < 0.01 * busbw[-1]
    assert cluster.collective_time("all-reduce", GIB, 1, 1) == 0.0


def test_p2p_times():
    cluster = Cluster.preset("dgx-h100", 2)
    assert cluster.p2p_time(0, True) == 0.0
    intra, inter = cluster.p2p_time(GIB, False), cluster.p2p_time(GIB, True)
    assert inter > 5 * intra
    # nccl-tests issue 290: 46-48 GB/s per NDR NIC.
    assert GIB / inter == pytest.approx(47e9, rel=0.01)
    assert np.all(np.diff(cluster.p2p_time(np.array([1e3, 1e6, 1e9]), False)) > 0)


def test_parse_builds_pools_of_whole_nodes():
    cluster = Cluster.parse("a100:64,h100:32")
    assert [(p.gpu.name, p.nodes, p.count) for p in cluster.pools] == [
        ("a100-sxm4-80gb", 8, 64), ("h100-sxm5-80gb", 4, 32)]
    assert cluster.collective_time("all-gather", GIB, 8, 8, pool=1) < cluster.collective_time(
        "all-gather", GIB, 8, 8, pool=0)
    assert Cluster.parse("dgx-a100:8").pools[0].nodes == 1


@pytest.mark.parametrize("call,words", [
    (lambda: GPU.preset("v100"), ["'v100'", "a100-sxm4-80gb", "h100-sxm5-80gb"]),
    (lambda: Cluster.preset("tpu", 2), ["'tpu'", "dgx-a100", "dgx-h100"]),
    (lambda: Cluster.preset("dgx-a100", 0), ["nodes", ">= 1"]),
    (lambda: Cluster.parse("a100:65"), ["65", "8", "whole nodes"]),
    (lambda: Cluster.parse("a100=64"), ["'a100=64'", "kind:gpus"]),
    (lambda: Cluster.parse(""), ["non-empty"]),
    (lambda: GPU.preset("a100-sxm4-80gb").gemm_efficiency(0, 128, 128), ["m", "> 0"]),
    (lambda: GPU.preset("a100-sxm4-80gb").gemm_time(128, float("nan"), 128), ["n", "finite"]),
    (lambda: GPU.preset("a100-sxm4-80gb").memory_time(-1), ["nbytes", ">= 0"]),
    (lambda: Cluster.preset("dgx-a100", 2).collective_time("broadcast", 1, 8, 8),
     ["broadcast", "all-reduce"]),
    (lambda: Cluster.preset("dgx-a100", 2).collective_time("all-reduce", 1, 12, 8), ["12", "multiple", "8"]),
    (lambda: Cluster.preset("dgx-a100", 2).collective_time("all-reduce", 1, 32, 16), ["16", "GPUs per node"]),
    (lambda: Cluster.preset("dgx-a100", 2).collective_time("all-reduce", 1, 24, 8), ["3 nodes", "2"]),
    (lambda: Cluster.preset("dgx-a100", 2).collective_time("all-reduce", 1, 8, 8, pool=1), ["pool", "1"]),
    (lambda: Cluster.preset("dgx-a100", 2).p2p_time(1, "yes"), ["inter_node", "'yes'"]),
])
def test_bad_input_is_refused_with_a_message_naming_it(call, words):
    with pytest.raises(InputError) as info:
        call()
    message = str(info.value)
    assert all(w in message for w in words), message

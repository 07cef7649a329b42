"""Hardware calibration (issue 53): measurements -> constants -> Hardware, GPU, Cluster; the file; the CLI.

Golden values are worked out by hand from the synthetic measurements below:

* the plain figures from their definitions: a GEMM's rate is 2 m n k batch /
  seconds, a copy's bandwidth bytes / seconds, nccl-tests' bus bandwidth
  (NVIDIA/nccl-tests doc/PERFORMANCE.md) is algbw * 2 (n-1)/n for an
  all-reduce, algbw * (n-1)/n for a reduce-scatter or all-gather, algbw for
  a send;
* the GEMM shape fit from times made with the model's closed form (the
  docstring of pipecore/plan/hardware.py) for shapes whose tile terms are
  worked out by hand in the comments: the fit must give back the constants
  the times were made with.
"""

import importlib.util
import io
import math
import sys

import pytest

import pipecore as pc
from pipecore.analysis.calibration import bus_factor, read_measurements
from pipecore.cli import main
from pipecore.core.ops import InputError
from pipecore.plan.calibrate import calibration_toml, gemm_error, measurements_toml

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

needs_torch = pytest.mark.skipif(importlib.util.find_spec("torch") is None,
                                 reason="pipecore calibrate measures with torch: pipecore[torch]")

RATE = 1e12      # FLOP/s of the synthetic device on a shape the model calls ideal
OVERHEAD = 1e-6  # seconds per kernel
K_HALF = 64.0


def gemm(m, n, k, factor, batch=1):
    """A row timed as the model would: 2 m n k batch / (RATE * factor) + OVERHEAD."""
    return {"m": m, "n": n, "k": k, "batch": batch,
            "seconds": 2.0 * m * n * k * batch / (RATE * factor) + OVERHEAD}


# m = n = 256 fills the 256x128 tile exactly on one SM (utilisation 1, the largest data reuse:
# weight 1), so only k / (k + k_half) moves: 64/128 = 0.5, 192/256 = 0.75, 448/512 = 0.875.
K_SWEEP = [gemm(256, 256, k, k / (k + K_HALF)) for k in (64, 192, 448)]
# With tile exponent 0.5 at k = 448 (factor 448/512): m = n = 64 is best on the 64x64 tile
# (utilisation 1, weight (32 / (256*128/384)) ** 0.5 = 0.375 ** 0.5; the 128x64 tile gives only
# 0.5 * 0.5 ** 0.5, the 128x128 one 0.25 * 0.75 ** 0.5); m = n = 128 on the 128x128 tile
# (utilisation 1, weight (64 / 85.33) ** 0.5 = 0.75 ** 0.5).
SIZE_SWEEP = [gemm(64, 64, 448, 0.375 ** 0.5 * 0.875), gemm(128, 128, 448, 0.75 ** 0.5 * 0.875)]

COLLECTIVES = [  # 4 ranks; (kind, bytes, seconds)
    ("all-reduce", 8, 30e-6), ("all-reduce", 1e8, 0.1),         # algbw 1e9: busbw 1e9 * 2 * 3/4 = 1.5e9
    ("reduce-scatter", 8, 20e-6), ("reduce-scatter", 1e8, 0.06),  # algbw 1e8/0.06: busbw 1.25e9
    ("all-gather", 8, 25e-6), ("all-gather", 1e8, 0.05),         # algbw 2e9: busbw 2e9 * 3/4 = 1.5e9
    ("p2p", 8, 10e-6), ("p2p", 1e8, 0.04),                       # 2.5e9, one way
]


def measurements(gemm_rows=K_SWEEP, **extra):
    table = {"tool": "a test", "host": "testhost", "device": "cuda", "device_name": "Synthetic GPU",
             "date": "2026-01-02", "dtype": "bfloat16", "backend": "nccl", "ranks": 4, "compute_units": 1,
             "memory_bytes": 8e9, "kernel_seconds": OVERHEAD, "gemm": list(gemm_rows),
             # A small buffer in cache (10 GB/s) and a large one (5 GB/s): the large one counts.
             "memory": [{"op": "copy", "bytes": 1e6, "seconds": 1e-4},
                        {"op": "copy", "bytes": 1e9, "seconds": 0.2}],
             "collectives": [{"kind": k, "ranks": 4, "bytes": b, "seconds": s} for k, b, s in COLLECTIVES]}
    table.update(extra)
    return table


def gross_best(rows):
    return max(2.0 * r["m"] * r["n"] * r["k"] * r["batch"] / r["seconds"] for r in rows)


# -- the plain figures -------------------------------------------------------------------------

def test_bus_factors_follow_nccl_tests():
    # doc/PERFORMANCE.md: all-reduce 2(n-1)/n, reduce-scatter and all-gather (n-1)/n.
    assert bus_factor("all-reduce", 8) == 1.75
    assert bus_factor("reduce-scatter", 8) == bus_factor("all-gather", 8) == 0.875
    assert bus_factor("p2p", 2) == 1.0
    with pytest.raises(InputError, match="broadcast"):
        bus_factor("broadcast", 2)


def test_figures_from_hand_worked_measurements():
    meas = read_measurements(measurements())
    rate, row = meas.gemm_rate()
    assert rate == pytest.approx(gross_best(K_SWEEP)) and row["k"] == 448
    assert meas.memory_bandwidth()[0] == pytest.approx(5e9)  # the largest buffer, not the fastest
    ar = meas.collective("all-reduce")
    assert ar["busbw"] == pytest.approx(1.5e9) and ar["latency"] == 30e-6
    assert meas.collective("reduce-scatter")["busbw"] == pytest.approx(1.25e9)
    assert meas.collective("p2p")["busbw"] == pytest.approx(2.5e9)
    hw = pc.Hardware.calibrate(measurements())
    assert hw.flops == pytest.approx(gross_best(K_SWEEP))
    assert (hw.memory_bandwidth, hw.link_bandwidth) == (pytest.approx(5e9), pytest.approx(2.5e9))
    assert (hw.link_latency, hw.hbm_bytes, hw.devices_per_node) == (10e-6, 8e9, None)
    assert "testhost" in meas.source() and "2026-01-02" in meas.source()


# -- the GEMM fit ---------------------------------------------------------------------------------

def test_k_half_is_fitted_and_the_tile_exponent_kept_when_only_k_varies():
    gpu = pc.GPU.calibrate(measurements())
    h100 = pc.GPU.preset("h100-sxm5-80gb")
    assert gpu.gemm_k_half == K_HALF
    assert gpu.gemm_tile_exponent == h100.gemm_tile_exponent  # one (m, n) only: not determined
    assert "kept from h100-sxm5-80gb" in gpu.sources["gemm_shape"] and "fitted" in gpu.sources["gemm_shape"]
    # No data sheet: the peak is the best measured rate; e_max makes the model's rate on an
    # ideal shape RATE again.
    assert gpu.peak_flops == pytest.approx(gross_best(K_SWEEP))
    assert gpu.peak_flops * gpu.gemm_max_efficiency == pytest.approx(RATE)
    # A shape not measured, by hand: 2 * 512 * 512 * 1024 / (RATE * 1024 / (1024 + 64)).
    assert gpu.gemm_time(512, 512, 1024) == pytest.approx(2 * 512 * 512 * 1024 / (RATE * 1024 / 1088))
    assert gemm_error(gpu, measurements()) == pytest.approx(0.0, abs=1e-9)
    assert (gpu.hbm_bandwidth, gpu.hbm_efficiency, gpu.kernel_overhead) == (pytest.approx(5e9), 1.0, OVERHEAD)
    assert (gpu.sm_count, gpu.hbm_bytes, gpu.name) == (1, 8e9, "synthetic-gpu")
    for field in ("peak_flops", "hbm_bytes", "hbm_bandwidth", "kernel_overhead", "sm_count",
                  "gemm_max_efficiency"):
        assert "measured by a test on testhost (Synthetic GPU, cuda) 2026-01-02" in gpu.sources[field], field


def test_both_shape_terms_are_fitted_from_a_k_and_a_size_sweep():
    gpu = pc.GPU.calibrate(measurements(K_SWEEP + SIZE_SWEEP))
    assert (gpu.gemm_k_half, gpu.gemm_tile_exponent) == (K_HALF, 0.5)
    assert "kept" not in gpu.sources["gemm_shape"]
    assert gemm_error(gpu, measurements(K_SWEEP + SIZE_SWEEP)) == pytest.approx(0.0, abs=1e-9)


def test_like_keeps_the_data_sheet_peaks_and_their_sources():
    h100 = pc.GPU.preset("h100-sxm5-80gb")
    gpu = pc.GPU.calibrate(measurements(), like="h100-sxm5-80gb")
    assert (gpu.peak_flops, gpu.hbm_bandwidth) == (989e12, 3.35e12)
    assert gpu.hbm_efficiency == pytest.approx(5e9 / 3.35e12)
    assert gpu.peak_flops * gpu.gemm_max_efficiency == pytest.approx(RATE)
    assert gpu.sources["peak_flops"] == f"kept from h100-sxm5-80gb: {h100.sources['peak_flops']}"
    # Recorded in the measurements, `like` is used without being named again.
    assert pc.GPU.calibrate(measurements(like="h100-sxm5-80gb")).peak_flops == 989e12


def test_like_refuses_a_rate_above_its_data_sheet():
    fast = [gemm(256, 256, 448, 0.875)]
    fast[0]["seconds"] = 2.0 * 256 * 256 * 448 / 400e12  # 400 TFLOP/s > the A100's 312
    with pytest.raises(InputError, match=r"exceeds like='a100-sxm4-80gb'.*312 TFLOP/s"):
        pc.GPU.calibrate(measurements(fast), like="a100-sxm4-80gb")
    with pytest.raises(InputError, match="not a GPU preset"):
        pc.GPU.calibrate(measurements(), like="tpu")
    table = measurements(memory=[{"op": "copy", "bytes": 5e12, "seconds": 1.0}])  # 5 TB/s > 3.35
    with pytest.raises(InputError, match=r"memory bandwidth 5000 GB/s exceeds like='h100-sxm5-80gb'"):
        pc.GPU.calibrate(table, like="h100-sxm5-80gb")


def test_shapes_all_faster_than_the_kernel_overhead_are_refused():
    with pytest.raises(InputError, match=r"every GEMM took less than measurements.kernel_seconds \(0.01 s\)"):
        pc.GPU.calibrate(measurements(kernel_seconds=0.01))


def test_cluster_from_the_measurements():
    cluster = pc.Cluster.calibrate(measurements())
    pool = cluster.pools[0]
    assert (cluster.name, pool.nodes, pool.gpus_per_node) == ("local", 1, 4)
    assert pool.intra_bus_bandwidth == pytest.approx(1.25e9)  # the lower of 1.25e9 and 1.5e9
    assert pool.intra_allreduce_bus_bandwidth == pytest.approx(1.5e9)
    assert (pool.intra_latency, pool.p2p_intra_bandwidth) == (30e-6, pytest.approx(2.5e9))
    assert math.isnan(pool.price_per_gpu_hour) and "not given" in pool.sources["price_per_gpu_hour"]
    assert "not measured" in pool.sources["inter_bus_bandwidth"]
    # The collective model of the planner reproduces the measured large all-reduce, up to its latency:
    # 30 us + 2 * 3/4 * 1e8 / 1.5e9 s = 0.1 s + 30 us.
    assert cluster.collective_time("all-reduce", 1e8, 4, 4) == pytest.approx(0.1 + 30e-6)
    assert pc.Cluster.calibrate(measurements(), price_per_gpu_hour=2.5).pools[0].price_per_gpu_hour == 2.5
    with pytest.raises(InputError, match="inter_bus_bandwidth is missing.*2 nodes"):
        pc.Cluster.calibrate(measurements(), nodes=2)


def test_the_planner_runs_on_a_calibrated_cluster():
    arch = pc.Architecture(layers=4, hidden=256, heads=4, seq=128, vocab=1024, name="tiny")
    plans = pc.strategies(arch, pc.Cluster.calibrate(measurements()), global_batch=8)
    assert plans.best is not None and plans.best.fits and plans.best.iteration_time > 0
    with pytest.raises(InputError, match="needs a price"):
        pc.strategies(arch, pc.Cluster.calibrate(measurements()), global_batch=8, objective="cost")
    priced = pc.strategies(arch, pc.Cluster.calibrate(measurements(), price_per_gpu_hour=1.0), global_batch=8,
                           objective="cost")
    assert priced.best.cost_per_million_tokens > 0


# -- the file ---------------------------------------------------------------------------------------

def test_file_round_trip(tmp_path):
    table = measurements(K_SWEEP + SIZE_SWEEP)
    path = tmp_path / "hw.toml"
    path.write_text(calibration_toml(table, price_per_gpu_hour=3.0))
    data = tomllib.loads(path.read_text())
    assert data["measurements"] == table  # every float written exactly
    assert set(data["gpus"]) == {"synthetic-gpu"} and set(data["clusters"]) == {"local"}
    assert data["gpus"]["synthetic-gpu"]["peak_flops_source"].startswith("measured by a test on testhost")
    from_file, fitted = pc.Cluster.from_file(path), pc.Cluster.calibrate(path, price_per_gpu_hour=3.0)
    assert from_file == fitted and from_file.pools[0].gpu.sources == fitted.pools[0].gpu.sources
    assert pc.Hardware.calibrate(path) == pc.Hardware.calibrate(table)
    assert pc.GPU.calibrate(path) == pc.GPU.calibrate(table)
    # The file's values are read as written: an edit counts, and the links between nodes can be added.
    text = path.read_text().replace("[clusters.local]\n", "[clusters.local]\ninter_bus_bandwidth = 2e10\n"
                                    "inter_latency = 2e-5\np2p_inter_bandwidth = 2.4e10\n")
    path.write_text(text)
    pool = pc.Cluster.from_file(path, nodes=3).pools[0]
    assert (pool.nodes, pool.inter_bus_bandwidth, pool.inter_latency) == (3, 2e10, 2e-5)
    assert pool.price_per_gpu_hour == 3.0


def test_a_cluster_file_may_name_a_gpu_preset(tmp_path):
    path = tmp_path / "net.toml"
    path.write_text('[clusters.mine]\ngpu = "a100-sxm4-80gb"\ngpus_per_node = 4\nintra_bus_bandwidth = 1e11\n'
                    'intra_latency = 1e-5\np2p_intra_bandwidth = 1e11\n')
    pool = pc.Cluster.from_file(path).pools[0]
    assert pool.gpu == pc.GPU.preset("a100-sxm4-80gb") and pool.gpus_per_node == 4


# -- bad input ------------------------------------------------------------------------------------

def _with(section, index, key, value):
    table = measurements()
    row = dict(table[section][index])
    if value is None:
        del row[key]
    else:
        row[key] = value
    table[section] = table[section][:index] + [row] + table[section][index + 1:]
    return table


G, M, C = r"measurements.gemm", r"measurements.memory", r"measurements.collectives"
NUMBER = "must be a finite number > 0, got"


@pytest.mark.parametrize(("table", "message"), [
    (_with("gemm", 1, "seconds", -1.0), rf"{G}\[1\].seconds {NUMBER} -1.0"),
    (_with("gemm", 0, "seconds", 0), rf"{G}\[0\].seconds {NUMBER} 0"),
    (_with("gemm", 0, "seconds", math.nan), rf"{G}\[0\].seconds {NUMBER} nan"),
    (_with("gemm", 0, "m", 1.5), rf"{G}\[0\].m must be an integer > 0, got 1.5"),
    (_with("gemm", 2, "k", None), rf"{G}\[2\] has no 'k'"),
    (_with("memory", 0, "bytes", 0), rf"{M}\[0\].bytes {NUMBER} 0"),
    (_with("collectives", 3, "kind", "broadcast"), rf"{C}\[3\].kind must be one of all-reduce"),
    (_with("collectives", 0, "ranks", 1), rf"{C}\[0\].ranks must be an integer >= 2, got 1"),
    (_with("collectives", 0, "ranks", 8), rf"{C}\[0\].ranks must equal measurements.ranks \(4\), got 8"),
    (measurements(kernel_seconds=-2e-6), rf"measurements.kernel_seconds {NUMBER} -2e-06"),
    (measurements(gemm={"m": 1}), "measurements.gemm must be a list of tables"),
])
def test_bad_values_are_named_with_their_rule(table, message, tmp_path):
    with pytest.raises(InputError, match=f"^{message}"):
        pc.Hardware.calibrate(table)
    # In a file, the message names the file first.
    path = tmp_path / "bad.toml"
    path.write_text(measurements_toml(table))
    with pytest.raises(InputError, match=f"^{path}: {message}"):
        pc.Hardware.calibrate(path)


@pytest.mark.parametrize(("drop", "what", "message"), [
    ("collectives", pc.Cluster.calibrate, "measurements.collectives is missing"),
    ("gemm", pc.Hardware.calibrate, "measurements.gemm is missing; the GEMM rate needs it"),
    ("memory", pc.GPU.calibrate, "measurements.memory is missing"),
    ("kernel_seconds", pc.GPU.calibrate, "measurements.kernel_seconds is missing"),
    ("memory_bytes", pc.GPU.calibrate, "measurements.memory_bytes is missing; hbm_bytes needs it"),
])
def test_a_missing_section_is_named(drop, what, message):
    table = measurements()
    del table[drop]
    with pytest.raises(InputError, match=message):
        what(table)


def test_a_collective_needs_two_sizes():
    table = measurements()
    table["collectives"] = [r for r in table["collectives"] if not (r["kind"] == "p2p" and r["bytes"] == 8)]
    with pytest.raises(InputError, match="1 p2p row.*two sizes or more"):
        pc.Hardware.calibrate(table)


def test_bad_files_are_named(tmp_path):
    path = tmp_path / "x.toml"
    path.write_text("gemm = [")
    with pytest.raises(InputError, match=f"^{path}: not a TOML file"):
        pc.Hardware.calibrate(path)
    path.write_text("[other]\na = 1\n")
    with pytest.raises(InputError, match=rf"^{path}: no \[measurements\] table"):
        pc.Hardware.calibrate(path)
    with pytest.raises(InputError, match=rf"^{path}: no \[clusters.NAME\] table"):
        pc.Cluster.from_file(path)
    good = calibration_toml(measurements())
    for old, new, message in [
        ("peak_flops = ", "peak_flop = ", r"gpus.synthetic-gpu: peak_flops is missing"),
        ("sm_count = 1\n", "sm_count = 0\n", r"gpus.synthetic-gpu.sm_count must be an integer > 0, got 0"),
        ("gemm_tiles = [[256, 128]", "gemm_tiles = [[256, -128]", r"gpus.synthetic-gpu.gemm_tiles must be"),
        ('gpu = "synthetic-gpu"', 'gpu = "v100"', r"clusters.local.gpu = 'v100' is neither"),
        ("intra_latency = ", "intra_latency = -", r"clusters.local.intra_latency must be a finite number >="),
    ]:
        assert old in good
        path.write_text(good.replace(old, new, 1))
        with pytest.raises(InputError, match=f"^{path}: {message}"):
            pc.Cluster.from_file(path)
    with pytest.raises(InputError, match="nodes must be an integer >= 1, got 0"):
        pc.Cluster.from_file(path, nodes=0)


# -- the command line ------------------------------------------------------------------------------

def run_cli(argv):
    out = io.StringIO()
    return main(argv, out=out), out.getvalue()


@needs_torch
def test_calibrate_quick_writes_a_file_the_library_and_the_planner_accept(tmp_path, capsys):
    path = tmp_path / "hw.toml"
    status, text = run_cli(["calibrate", "--quick", "--out", str(path)])
    assert status == 0, capsys.readouterr().err
    assert all(len(line) <= 120 for line in text.splitlines()), text
    assert f"wrote {path}" in text and "GFLOP/s" in text and "busbw" in text
    data = tomllib.loads(path.read_text())
    rows = data["measurements"]["gemm"]
    hw = pc.Hardware.calibrate(path)
    assert hw.flops == pytest.approx(gross_best(rows))  # the best rate of the file's own rows
    (gpu_name,) = data["gpus"]
    assert data["measurements"]["device"] == "cpu" and data["measurements"]["ranks"] == 2
    assert all(str(v).startswith(("measured by pipecore calibrate", "kept from", "1: "))
               for k, v in data["gpus"][gpu_name].items() if k.endswith("_source"))
    cluster = pc.Cluster.from_file(path)
    assert cluster == pc.Cluster.calibrate(path) and cluster.pools[0].gpus_per_node == 2
    status, text = run_cli(["plan", "--model", "megatron-1.7b", "--hardware", str(path),
                            "--global-batch", "32"])
    assert status == 0 and f"2 x {gpu_name}" in text


@needs_torch
def test_calibrate_prints_the_figures_it_writes(tmp_path, monkeypatch):
    from pipecore.bindings import _hardware

    monkeypatch.setattr(_hardware, "measure_hardware", lambda *args, **kwargs: measurements())
    path = tmp_path / "hw.toml"
    status, text = run_cli(["calibrate", "--out", str(path)])
    assert status == 0 and all(len(line) <= 120 for line in text.splitlines()), text
    # The hand-worked figures of measurements(), as printed.
    assert f"best {gross_best(K_SWEEP) / 1e9:.4g} GFLOP/s at 256x256x448" in text
    assert "k_half 64, tile exponent 0.375" in text and "memory          5 GB/s" in text
    assert "all-reduce      busbw 1.5 GB/s at 95.4 MiB, 30 us at 8 B" in text
    assert "reduce-scatter  busbw 1.25 GB/s" in text and "p2p             bandwidth 2.5 GB/s" in text
    assert pc.Cluster.from_file(path) == pc.Cluster.calibrate(measurements())
    # A fit that fails keeps the measurements, to refit.
    fast = [gemm(256, 256, 448, 0.875)]
    fast[0]["seconds"] = 2.0 * 256 * 256 * 448 / 400e12
    monkeypatch.setattr(_hardware, "measure_hardware", lambda *args, **kwargs: measurements(fast))
    status, _ = run_cli(["calibrate", "--out", str(path), "--like", "a100-sxm4-80gb"])
    assert status == 2
    assert tomllib.loads(path.read_text())["measurements"]["gemm"] == fast


@needs_torch
@pytest.mark.parametrize(("argv", "message"), [
    (["--ranks", "1"], "ranks must be an integer >= 2"),
    (["--ranks", "4096"], "ranks=4096 is more than the"),
    (["--out", "no/such/folder/hw.toml"], "folder no/such/folder does not exist"),
])
def test_calibrate_refuses_bad_options_before_measuring(argv, message, capsys):
    assert main(["calibrate", *argv]) == 2
    assert message in capsys.readouterr().err.replace("\n  ", " ")


@needs_torch
def test_calibrate_says_when_there_is_no_gpu(capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA GPU")
    assert main(["calibrate", "--device", "cuda"]) == 2
    assert "torch sees no CUDA GPU" in capsys.readouterr().err


def test_calibrate_without_torch_names_the_extra(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "pipecore.bindings._hardware", None)  # import fails as without torch
    assert main(["calibrate", "--quick"]) == 2
    assert "pip install 'pipecore[torch]'" in capsys.readouterr().err


@needs_torch
@pytest.mark.heavy  # a full calibration: about a minute on two busy cores
def test_calibrate_full_determines_both_shape_terms(tmp_path):
    path = tmp_path / "hw.toml"
    status, _ = run_cli(["calibrate", "--out", str(path)])
    assert status == 0
    gpu = pc.GPU.calibrate(path)
    assert "kept" not in gpu.sources["gemm_shape"]  # the k sweep and the size sweep determine both
    assert pc.Cluster.from_file(path) == pc.Cluster.calibrate(path)

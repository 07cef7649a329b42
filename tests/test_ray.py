"""pipecore scan on Ray: the same dataset as the local backend, retries, CLI, missing extra.

One local Ray instance serves the module (starting one takes seconds); the
CLI tests start their own or connect to it.
"""

import os
import subprocess
import sys

import numba
import pyarrow.parquet as pq
import pytest

import pipecore as pc
from pipecore.scan import scans as scan_mod

# Heavy (CI's `pytest -m heavy`): each test starts a Ray instance (15-60 s on two cores).
pytestmark = pytest.mark.heavy

GRID = {
    "schedules": ["1f1b", "zb-h1", "interleaved-1f1b", "zb-v", "dualpipev", "chimera"],
    "devices": [2, 4, 6],
    "microbatches": [4, 8, 12],
    "chunks": [2, 3],
    "f": [1.0, 1.5],
    "b": {"min": 1.0, "max": 2.0, "num": 3},
    "w": [0.0, 0.5],
    "comm": [0.0, 0.2],
    "weights": [0.5],
    "memory_limit": [4.0, 100.0],
    "network": ["free", "slow"],
    "networks": {"slow": {"bytes": 1.0, "bandwidth": 2.0, "latency": 0.1,
                          "devices_per_node": 2, "inter_bandwidth": 0.5, "grad_bytes": 2.0}},
    "part_size": 601,  # 12 parts, cutting through structures and lane groups
}

GRID_TOML = """
schedules = ["1f1b", "interleaved-1f1b", "dualpipev"]
devices = [2, 4]
microbatches = [4, 8]
chunks = [2]
f = [1.0, 2.0]
b = [1.0, 2.0]
comm = [0.0, 0.1]
part_size = 20
"""


def _dataset(folder):
    return pq.ParquetDataset(folder).read().sort_by("config")


@pytest.fixture(scope="module")
def ray_local():
    ray = pytest.importorskip("ray", reason="the Ray backend's tests need the pipecore[ray] extra")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def local_scan(tmp_path_factory):
    out = tmp_path_factory.mktemp("local") / "scan"
    summary = pc.write_scan(GRID, out, plot=False)
    return out, summary


def test_ray_scan_equals_local(ray_local, local_scan, tmp_path):
    ref, ref_summary = local_scan
    assert pc.Grid.from_dict(GRID).parts >= 10
    summary = pc.write_scan(GRID, tmp_path / "ray", backend="ray", plot=False)
    assert _dataset(tmp_path / "ray").equals(_dataset(ref))
    assert summary["rows"] == ref_summary["rows"] > 0
    assert summary["skipped"] == ref_summary["skipped"] and summary["skipped"]
    assert ray_local.is_initialized()  # a Ray it did not start is left running


def test_sampled_scan_equals_local(ray_local, tmp_path):
    grid = {**GRID, "sample": 2000, "seed": 5, "part_size": 300}
    pc.write_scan(grid, tmp_path / "local", plot=False)
    pc.write_scan(grid, tmp_path / "ray", backend="ray", plot=False)
    assert _dataset(tmp_path / "ray").equals(_dataset(tmp_path / "local"))


def test_failed_tasks_are_retried(ray_local, local_scan, tmp_path, monkeypatch):
    marks = tmp_path / "marks"
    marks.mkdir()
    monkeypatch.setenv("PIPECORE_RAY_FAIL_ONCE", str(marks))
    pc.write_scan(GRID, tmp_path / "ray", backend="ray", plot=False)
    grid = pc.Grid.from_dict(GRID)
    # Every part's first attempt failed (and left its marker); the retries wrote it all.
    assert sorted(p.name for p in marks.iterdir()) == [f"part-{k:06d}" for k in range(grid.parts)]
    assert _dataset(tmp_path / "ray").equals(_dataset(local_scan[0]))


def test_rows_do_not_depend_on_thread_count():
    # The Ray backend runs one Numba thread per task, the local one all of them.
    grid = pc.Grid.from_dict(GRID)
    cache = scan_mod._StructureCache(grid)
    most = numba.get_num_threads()
    for k in range(grid.parts):
        idx = grid.part_indices(k)
        ref = scan_mod._part_table(grid, idx, cache, most)
        numba.set_num_threads(1)
        try:
            one = scan_mod._part_table(grid, idx, cache, 1)
        finally:
            numba.set_num_threads(most)
        odd = scan_mod._part_table(grid, idx, cache, 7)  # other chunking of the lane groups
        assert (ref is None and one is None and odd is None) or (ref.equals(one) and ref.equals(odd)), k


def _cli(*args):
    return [sys.executable, "-m", "pipecore.cli", *args]


def test_cli_scan_on_ray(ray_local, tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID_TOML)
    pc.write_scan(grid, tmp_path / "local", plot=False)
    # Default: the command starts (and stops) a local Ray instance of its own.
    done = subprocess.run(_cli("scan", str(grid), "--out", str(tmp_path / "own"), "--backend",
                               "ray", "--no-plot"), capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert "rows in" in done.stdout
    assert _dataset(tmp_path / "own").equals(_dataset(tmp_path / "local"))
    # --address auto: joins the running cluster (this module's, named by RAY_ADDRESS).
    env = dict(os.environ, RAY_ADDRESS=ray_local.get_runtime_context().gcs_address)
    done = subprocess.run(_cli("scan", str(grid), "--out", str(tmp_path / "auto"), "--backend",
                               "ray", "--address", "auto", "--no-plot"), env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    assert _dataset(tmp_path / "auto").equals(_dataset(tmp_path / "local"))
    assert ray_local.is_initialized() and ray_local.cluster_resources().get("CPU") == 2


def test_missing_ray_is_a_clear_error(monkeypatch):
    from pipecore.scan.ray import run_parts

    monkeypatch.setitem(sys.modules, "ray", None)  # "import ray" now raises ImportError
    grid = pc.Grid.from_dict(GRID)
    with pytest.raises(pc.ScanError, match=r'pip install "pipecore\[ray\]"'):
        next(run_parts(grid, [0]))


def test_missing_ray_writes_nothing(tmp_path, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "ray" else real(name, *a, **k))
    out = tmp_path / "out"
    with pytest.raises(pc.ScanError, match=r'pipecore\[ray\]'):
        pc.write_scan({"schedules": ["1f1b"], "devices": [2], "microbatches": [2]}, out,
                      backend="ray", plot=False)
    assert not out.exists()

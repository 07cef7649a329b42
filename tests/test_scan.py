"""pipecore scan: grids, mixed-structure batches, durable Parquet output, resume, kill."""

import json
import signal
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from wrapped import flat

import pipecore as pc
from pipecore.scan import parts as parts_mod

# Run once more with Numba's bounds checking on in CI (.ci/run selects by this mark).
pytestmark = pytest.mark.kernels

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
    "part_size": 997,  # parts cut through structures and lane groups
}


def _rows(table):
    return table.sort_by("config").to_pylist()


def test_rows_equal_simulate():
    # Every scanned row, recomputed one by one with pc.simulate (itself checked
    # against the independent oracle in tests/reference.py), on a sample.
    grid = pc.Grid.from_dict({**GRID, "sample": 400, "seed": 3})
    with pytest.warns(pc.ScanWarning, match="cannot be built"):
        table = pa.Table.from_batches(list(pc.scan(grid)))
    assert 0 < table.num_rows <= 400
    assert len(set(table.column("config").to_pylist())) == table.num_rows
    nets = {"free": None, "slow": grid.networks["slow"]}
    for row in table.to_pylist():
        chunks = row["chunks"] if row["schedule"] in ("interleaved-1f1b",) else None
        sched = pc.build(row["schedule"], row["devices"], row["microbatches"], chunks=chunks)
        costs = pc.Costs(f=row["f"], b=row["b"], w=row["w"], comm=row["comm"],
                         weights=row["weights"])
        res = pc.simulate(sched, costs, nets[row["network"]])
        assert row["makespan"] == res.makespan, row
        assert row["bubble_rate"] == pytest.approx(res.bubble_rate, abs=1e-12)
        assert row["peak_activation_max"] == res.peak_activation.max()
        total = (res.peak_activation + res.static_memory).max()
        assert row["memory_max"] == total
        assert row["fits"] == (total <= row["memory_limit"] * (1 + 1e-9))
        assert row["throughput"] == row["microbatches"] / res.makespan


def test_product_numbering_and_parts():
    grid = pc.Grid.from_dict(GRID)
    # 6 families x 3 x 3 shapes; interleaved takes chunks 2 and 3, the others
    # one chunks value each: 3*9 + 9 + ... structures; values: 2*3*2*2*2 = 48 per entry.
    assert grid.values_per_entry == 2 * 3 * 2 * 2 * 1 * 2
    n_struct = 9 * (1 + 1 + 2 + 1 + 1 + 1)
    assert grid.points == n_struct * 2 * grid.values_per_entry
    seen = np.concatenate([grid.part_indices(k) for k in range(grid.parts)])
    assert np.array_equal(seen, np.arange(grid.points))
    with pytest.warns(pc.ScanWarning, match=r"left out 9 shape\(s\)") as caught:
        table = pa.Table.from_batches(list(pc.scan(grid)))
    assert "dualpipev/4/4/2" in str(caught[0].message)  # names the shape and why
    # Unbuildable shapes (m not a multiple of p for interleaved, dualpipev
    # with m < 2p, p odd) give no rows; every other point gives one.
    cfg = table.column("config").to_numpy()
    assert len(np.unique(cfg)) == len(cfg)
    per_entry = np.bincount(cfg // grid.values_per_entry)
    assert set(per_entry.tolist()) <= {0, grid.values_per_entry}


def test_sample_is_seeded_and_sorted():
    a = pc.Grid.from_dict({**GRID, "sample": 500, "seed": 1}).sample_indices()
    b = pc.Grid.from_dict({**GRID, "sample": 500, "seed": 1}).sample_indices()
    c = pc.Grid.from_dict({**GRID, "sample": 500, "seed": 2}).sample_indices()
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    assert len(np.unique(a)) == 500 and np.all(np.diff(a) > 0)


def _full(folder):
    return pq.ParquetDataset(folder).read().sort_by("config")


def test_write_resume_after_interrupt(tmp_path, monkeypatch):
    ref = tmp_path / "ref"
    pc.write_scan(GRID, ref, plot=False)
    expected = _full(ref)
    real = parts_mod.write_part
    calls = []

    def flaky(table, folder, k, fingerprint):
        calls.append(k)
        if len(calls) == 3:
            raise KeyboardInterrupt  # Ctrl-C in the middle of the third part
        return real(table, folder, k, fingerprint)

    out = tmp_path / "out"
    monkeypatch.setattr(parts_mod, "write_part", flaky)
    with pytest.raises(KeyboardInterrupt):
        pc.write_scan(GRID, out, plot=False)
    monkeypatch.setattr(parts_mod, "write_part", real)
    assert len(list(out.glob("part-*.parquet"))) == 2
    with pytest.raises(pc.ScanError, match="resume"):
        pc.write_scan(GRID, out, plot=False)
    summary = pc.write_scan(GRID, out, resume=True, plot=False)
    assert summary["parts_written"] == pc.Grid.from_dict(GRID).parts - 2
    got = _full(out)
    assert got.equals(expected)  # same rows, same values, none missing or repeated
    assert summary["rows"] == expected.num_rows


def test_other_grid_in_folder_is_refused(tmp_path):
    pc.write_scan({**GRID, "sample": 50}, tmp_path, plot=False)
    with pytest.raises(pc.ScanError, match="different grid"):
        pc.write_scan({**GRID, "sample": 60}, tmp_path, resume=True, plot=False)


GRID_TOML = """
schedules = ["1f1b", "zb-h1", "zb-v", "interleaved-1f1b"]
devices = [2, 4, 8]
microbatches = [8, 16, 24]
f = {min = 0.5, max = 2.0, num = 12}
b = {min = 0.5, max = 3.0, num = 12}
w = [0.0, 0.5, 1.0]
comm = [0.0, 0.1]
network = ["free", "ib"]
part_size = 3000

[networks.ib]
bytes = 1.0
bandwidth = 4.0
devices_per_node = 4
inter_bandwidth = 1.0
"""


def _cli(*args):
    return [sys.executable, "-m", "pipecore.cli", *args]


# Runs the command line in a child that signals itself right after its third part is
# published: the fault lands at a chosen point, not after a sleep.
_STOP_AFTER_THIRD_PART = """
import os, signal, sys
# A child inherits an ignored SIGINT (pytest-xdist's workers ignore it), and Python then
# installs no handler of its own: give it the one a terminal's Ctrl-C meets.
signal.signal(signal.SIGINT, signal.default_int_handler)
from pipecore.scan import parts
real = parts.write_part
done = []
def write_then_stop(table, folder, k, fingerprint):
    path = real(table, folder, k, fingerprint)
    done.append(k)
    if len(done) == 3:
        os.kill(os.getpid(), getattr(signal, sys.argv[1]))
    return path
parts.write_part = write_then_stop
from pipecore.cli import main
sys.exit(main(sys.argv[2:]))
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT])
def test_killed_scan_resumes_exactly(tmp_path, sig):
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID_TOML)
    ref = tmp_path / "ref"
    pc.write_scan(grid, ref, plot=False)
    expected = _full(ref)
    n_parts = pc.Grid.from_toml(grid).parts
    assert n_parts >= 20
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-c", _STOP_AFTER_THIRD_PART, sig.name, "scan",
                           str(grid), "--out", str(out), "--no-plot"],
                          capture_output=True, text=True, timeout=300)
    if sig == signal.SIGINT:
        assert proc.returncode == 130 and "--resume" in proc.stderr, proc.stderr
    else:
        assert proc.returncode == -signal.SIGKILL
    parts = sorted(out.glob("part-*.parquet"))
    assert len(parts) == 3
    for path in parts:  # every visible part is whole and equals the reference rows
        part = pq.read_table(path)
        assert pq.read_table(ref / path.name).equals(part), path.name
        assert part.num_rows > 0
    done = subprocess.run(_cli("scan", str(grid), "--out", str(out), "--resume", "--no-plot"),
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "set aside" not in done.stderr  # the three parts verified and were kept
    assert _full(out).equals(expected)
    assert not list(out.glob(".*tmp"))


@pytest.mark.parametrize("grid,match", [
    ({"schedules": ["nope"], "devices": [2], "microbatches": [2]}, "unknown schedule"),
    ({"schedules": ["1f1b"], "devices": [0], "microbatches": [2]}, "'devices': 0 is below"),
    ({"schedules": ["1f1b"], "devices": [2], "microbatches": [2], "speed": 1}, "unknown key"),
    ({"schedules": ["1f1b"], "devices": [2], "microbatches": [2], "f": {"min": 1}},
     "a range is"),
    ({"schedules": ["1f1b"], "devices": [2], "microbatches": [2], "f": ["x"]}, "not a number"),
    ({"schedules": ["1f1b"], "devices": [2], "microbatches": [2], "network": "ib"},
     "'ib' not defined"),
    ({"schedules": ["1f1b"], "devices": [2], "microbatches": [2],
      "networks": {"ib": {"bandwidth": 1.0}}}, "'bytes' is required"),
    ({"schedules": ["1f1b"], "devices": [2], "microbatches": [2], "activation": 1.0,
      "activation_w": [0.5, 2.0]}, "activation_w"),
    ({"schedules": ["1f1b"], "devices": [2], "microbatches": [2], "part_size": 0},
     "part_size"),
    ({"schedules": ["hanayo"], "devices": [2], "microbatches": [2],
      "options": {"hanayo": {"speed": 2}}}, "unknown speed"),
])
def test_bad_grids(grid, match):
    with pytest.raises(pc.ScanError, match=match):
        pc.Grid.from_dict(grid)


def test_cli_scan_writes_dataset_and_plot(tmp_path):
    grid = tmp_path / "grid.toml"
    grid.write_text(GRID_TOML.replace("part_size = 3000", "part_size = 50000"))
    out = tmp_path / "out"
    done = subprocess.run(_cli("scan", str(grid), "--out", str(out)), capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "rows in" in done.stdout
    assert "[" not in done.stderr  # not a terminal: no progress bar
    summary = json.loads((out / "_summary.json").read_text())
    assert summary["rows"] == pq.ParquetDataset(out).read().num_rows
    assert (out / "_pareto.png").stat().st_size > 10_000
    bad = subprocess.run(_cli("scan", str(tmp_path / "missing.toml"), "--out", str(out)),
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "does not exist" in flat(bad.stderr)


def test_progress_bar_when_asked(tmp_path, capsys):
    pc.write_scan(GRID, tmp_path / "a", progress=True, plot=False)
    err = capsys.readouterr().err
    assert "100.0%" in err and "configs/s" in err and "ETA" in err
    pc.write_scan(GRID, tmp_path / "b", progress=False, plot=False)
    assert capsys.readouterr().err == ""


def test_readme_grid_example_parses_and_runs(tmp_path):
    # The grid shown in the user guide (the README's until issue 42) must stay a valid grid.
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "docs" / "guide.md").read_text()
    block = re.search(r"```toml\n(.*?)```", readme, re.S).group(1)
    path = tmp_path / "grid.toml"
    path.write_text(block)
    grid = pc.Grid.from_toml(path)
    # 4 families x 3 devices x 3 microbatches, interleaved twice (chunks 2, 4):
    # 45 shapes x 2 networks x (7 f x 2 b x 2 w x 2 limits); the sample of
    # 100,000 is larger than that product, so the whole product is scanned.
    assert grid.points == 45 * 2 * (7 * 2 * 2 * 2) == grid.rows
    first = next(pc.scan({**grid.source, "sample": 50}))
    assert first.num_rows > 0

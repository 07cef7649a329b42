"""The comparison study: grid, three views, rankings, CLI."""

import io

import pyarrow.parquet as pq
import pytest

import pipecore as pc
from pipecore.analysis.study import Hardware, TransformerModel, study, summarize
from pipecore.cli import main


def test_small_study_rows_and_ranks():
    table = study(devices=[4], microbatches=[4, 8], names=["1f1b", "chimera", "zb-v"],
                  factors=[1.0, 10.0])
    rows = table.to_pylist()
    assert len(rows) == 3 * 2 * 4  # families x microbatches x grid cells
    # chimera takes m = 4 and 8 on 4 devices; every row here ran.
    assert all(r["error"] is None for r in rows)
    for m in (4, 8):
        for cf in (1.0, 10.0):
            for nf in (1.0, 10.0):
                g = [r for r in rows if (r["microbatches"], r["compute"], r["network"]) == (m, cf, nf)]
                for view in ("formula", "table", "sim"):
                    assert sorted(r[view + "_rank"] for r in g) == [1, 2, 3]
                best = min(g, key=lambda r: r["sim_time"])
                assert best["sim_rank"] == 1
    # The simulation includes communication: never faster than the zero-comm formula
    # for 1F1B, whose formula is exact without communication.
    for r in rows:
        if r["family"] == "1f1b":
            assert r["sim_time"] >= r["formula_time"] * (1 - 1e-12)


def test_unbuildable_shapes_are_reported_not_ranked():
    table = study(devices=[4], microbatches=[6], names=["1f1b", "chimera"], factors=[1.0])
    rows = {r["family"]: r for r in table.to_pylist()}
    assert "multiple of devices" in rows["chimera"]["error"]
    assert rows["chimera"]["sim_rank"] is None and rows["1f1b"]["sim_rank"] == 1


def test_model_costs_follow_the_zero_bubble_table():
    # ZB paper Table 1: F = sbh(24h+4s), B = sbh(24h+8s), W = 24sbh^2 FLOPs per layer;
    # with a compute-bound roofline the times are those over the peak FLOP/s.
    model = TransformerModel(layers=8, hidden=1024, seq=512, microbatch=2)
    hw = Hardware(flops=1e12, memory_bandwidth=1e15, link_bandwidth=1e9, link_latency=0.0)
    f, b, w = model.layer_times(hw)
    s, bb, h = 512, 2, 1024
    assert f == pytest.approx(s * bb * h * (24 * h + 4 * s) / 1e12)
    assert b == pytest.approx(s * bb * h * (24 * h + 8 * s) / 1e12)
    assert w == pytest.approx(24 * s * bb * h * h / 1e12)
    c = model.costs(hw, devices=4)
    assert c.f == pytest.approx(f * 2)  # 8 layers over 4 devices
    net = model.network(hw)
    assert net.bytes == s * bb * h * 2


def test_hardware_errors_and_scaling():
    with pytest.raises(ValueError, match="unknown hardware preset 'tpu'"):
        Hardware.preset("tpu")
    with pytest.raises(ValueError, match="'flops' must be finite and > 0"):
        Hardware(0.0, 1.0, 1.0, 0.0)
    hw = Hardware.preset("dgx-h100").scaled(compute=10.0, network=0.1)
    assert hw.flops == pytest.approx(9.89e15) and hw.link_bandwidth == pytest.approx(5e9)
    with pytest.raises(ValueError, match="grid factors must be > 0"):
        study(devices=[2], microbatches=[2], factors=[0.0])


def test_cli_study(tmp_path):
    out = io.StringIO()
    code = main(["study", "--devices", "4", "--microbatches", "8", "--out", str(tmp_path)], out=out)
    assert code == 0
    table = pq.read_table(tmp_path / "study.parquet")
    assert set(table.column("family").to_pylist()) == set(pc.schedules())
    assert (tmp_path / "study.png").read_bytes()[:4] == b"\x89PNG"
    assert "communication changes the winner" in out.getvalue()
    assert summarize(table).count("\n") == 9 + 2  # header, 9 cells, closing line, legend


def test_cli_study_bad_list(capsys):
    assert main(["study", "--devices", "4,x"]) == 2
    assert "--devices must be comma-separated integers" in capsys.readouterr().err


def test_summary_marks_overturned_and_formula_ties():
    # Hand-made rows (no pipecore computation): three settings.
    import pyarrow as pa

    from pipecore.analysis.study import summarize

    def rows(mb, formula, sim):
        return [{"devices": 4, "microbatches": mb, "compute": 1.0, "network": 1.0, "family": f,
                 "formula_time": formula[f], "table_time": formula[f], "sim_time": sim[f],
                 "error": None} for f in ("a", "b")]

    table = pa.Table.from_pylist(
        rows(8, {"a": 10, "b": 10}, {"a": 11, "b": 9})     # formula tie, sim picks b
        + rows(16, {"a": 10, "b": 12}, {"a": 11, "b": 9})  # sim overturns the formula
        + rows(32, {"a": 10, "b": 12}, {"a": 9, "b": 11}))  # both pick a
    marks = [line.split()[-1] if not line.endswith("(tie)") else "tie"
             for line in summarize(table).splitlines()[1:4]]
    assert marks == ["tie", "yes", "no"]

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
                g = [r for r in rows
                     if (r["microbatches"], r["compute_speed"], r["network_speed"]) == (m, cf, nf)]
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
    cells = [line for line in summarize(table).splitlines() if line.startswith("   4     8  ")]
    assert len(cells) == 9  # one line per grid cell


def test_cli_study_bad_list(capsys):
    assert main(["study", "--devices", "4,x"]) == 2
    assert "--devices must be comma-separated integers" in capsys.readouterr().err


def test_summary_marks_overturned_and_formula_ties():
    # Hand-made rows (no pipecore computation): three settings.
    import pyarrow as pa

    from pipecore.analysis.study import summarize

    def rows(mb, formula, sim):
        return [{"devices": 4, "microbatches": mb, "compute_speed": 1.0, "network_speed": 1.0,
                 "family": f,
                 "formula_time": formula[f], "table_time": formula[f], "sim_time": sim[f],
                 "error": None} for f in ("a", "b")]

    table = pa.Table.from_pylist(
        rows(8, {"a": 10, "b": 10}, {"a": 11, "b": 9})     # formula tie, sim picks b
        + rows(16, {"a": 10, "b": 12}, {"a": 11, "b": 9})  # sim overturns the formula
        + rows(32, {"a": 10, "b": 12}, {"a": 9, "b": 11}))  # both pick a
    cells = [line for line in summarize(table).splitlines() if line.startswith("   4  ")]
    marks = [line.split()[-1] if not line.endswith("(tie)") else "tie" for line in cells]
    assert marks == ["tie", "yes", "no"]


# -- issue 37: the grid's axes are speeds; what a reader sees ------------------

SMALL = dict(devices=[4], microbatches=[4, 8], names=["gpipe", "1f1b", "chimera", "zb-v", "v-min"],
             factors=[0.1, 1.0, 10.0])


@pytest.fixture(scope="module")
def small_study():
    return study(**SMALL)


def test_values_are_the_direct_simulation_at_the_scaled_hardware(small_study):
    # The numbers the study gave before issue 37, re-derived here without the
    # study: pc.simulate and pc.formula at Hardware.preset("dgx-h100").scaled(c, n)
    # with the model's costs and network. Equal bit for bit.
    from pipecore.analysis.formulas import formula
    from pipecore.analysis.table import ideal_table

    model, base = TransformerModel(), Hardware.preset("dgx-h100")
    rows = small_study.to_pylist()
    assert len(rows) == 5 * 2 * 9
    for r in rows:
        sched = pc.build(r["family"], 4, r["microbatches"])
        hw = base.scaled(compute=r["compute_speed"], network=r["network_speed"])
        costs = model.costs(hw, 4)
        res = pc.simulate(sched, costs, model.network(hw))
        assert r["sim_time"] == res.makespan
        assert r["formula_time"] == float(formula(sched, costs)["makespan"])
        assert r["peak_activation"] == float(res.peak_activation.max())
        assert r["table_slots"] == ideal_table(sched).length


def test_speed_factors_make_times_shorter(small_study):
    # x10 is ten times faster: with the network fixed, every op takes a tenth
    # of the time, so the compute-bound iteration is close to ten times shorter.
    rows = {(r["family"], r["microbatches"], r["compute_speed"], r["network_speed"]): r
            for r in small_study.to_pylist()}
    for (name, m, cf, nf), r in rows.items():
        if cf == 1.0 and nf == 10.0:
            faster = rows[(name, m, 10.0, 10.0)]["sim_time"]
            slower = rows[(name, m, 0.1, 10.0)]["sim_time"]
            assert slower > r["sim_time"] > faster
    gpipe = rows[("gpipe", 8, 1.0, 1.0)]["sim_time"]
    assert rows[("gpipe", 8, 10.0, 10.0)]["sim_time"] == pytest.approx(gpipe / 10, rel=1e-9)


def test_columns_and_metadata_name_speeds_model_hardware_and_units(small_study):
    import json

    names = small_study.column_names
    assert "compute_speed" in names and "network_speed" in names
    assert "compute" not in names and "network" not in names
    meta = small_study.schema.metadata
    model = json.loads(meta[b"pipecore.model"])
    assert (model["layers"], model["hidden"], model["seq"], model["microbatch"]) == (128, 4096,
                                                                                    2048, 1)
    hw = json.loads(meta[b"pipecore.hardware"])
    assert hw["name"] == "dgx-h100" and hw["flops"] == 989e12 and hw["link_bandwidth"] == 50e9
    assert meta[b"pipecore.time_unit"] == b"s"
    assert json.loads(meta[b"pipecore.speed_factors"]) == [0.1, 1.0, 10.0]
    assert b"SPEED" in meta[b"pipecore.speed_meaning"] and b"not on costs" in meta[
        b"pipecore.speed_meaning"]


def test_cli_prints_setup_then_summary_then_detail(tmp_path):
    out = io.StringIO()
    assert main(["study", "--devices", "4", "--microbatches", "8", "--no-plot",
                 "--out", str(tmp_path)], out=out) == 0
    text = out.getvalue()
    first = text.splitlines()[:12]
    assert first[0].startswith("pipecore study:")
    assert any("128 layers of hidden size 4096" in line for line in first)
    assert any('preset "dgx-h100"' in line and "989 TFLOP/s" in line for line in first)
    assert any("times in seconds" in line for line in first)
    order = [text.index(s) for s in ("model:", "hardware:", "units:", "summary:", "detail:",
                                     "findings:", "wrote ")]
    assert order == sorted(order)
    assert "costs" not in text.split("summary:")[0]  # speeds, never "cost factors"
    assert "factors on the compute costs" not in text
    # Columns of the saved table are named for speeds too.
    assert "compute_speed" in pq.read_table(tmp_path / "study.parquet").column_names


def _figures(monkeypatch):
    """The figures plot_study saves (matplotlib objects, not files)."""
    from matplotlib.figure import Figure

    saved = []
    real = Figure.savefig

    def keep(fig, *args, **kwargs):
        saved.append(fig)
        return real(fig, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", keep)
    return saved


def test_plots_one_labelled_panel_per_ratio_and_a_legend_inside(small_study, tmp_path,
                                                                 monkeypatch):
    from pipecore.output.plots import plot_study

    saved = _figures(monkeypatch)
    plot_study(small_study, tmp_path / "study.png")
    (fig,) = saved
    ratios = {round(cf / nf, 9) for cf in SMALL["factors"] for nf in SMALL["factors"]}
    axes = fig.get_axes()
    assert len(axes) == len(ratios) == 5  # no "same as" boxes
    fig.canvas.draw()
    for ax in axes:
        labels = [t.get_text() for t in ax.get_xticklabels() if t.get_text()]
        assert labels == ["4", "8"]  # every panel names its microbatch counts
        assert ax.get_lines()  # every panel draws
    (legend,) = fig.legends
    box = legend.get_window_extent(fig.canvas.get_renderer()).transformed(
        fig.transFigure.inverted())
    assert 0 <= box.x0 and box.x1 <= 1 and 0 <= box.y0 and box.y1 <= 1
    for ax in axes:  # outside every panel
        assert not box.overlaps(ax.get_position())
    styles = {}
    for line in axes[0].get_lines():
        styles[line.get_label()] = (line.get_color(), str(line.get_linestyle()), line.get_marker())
    assert set(styles) == set(SMALL["names"])
    assert len({s[:2] for s in styles.values()}) == len(styles)  # (colour, line style) apart
    assert styles["gpipe"][0] != styles["v-min"][0] and styles["gpipe"][1] != styles["v-min"][1]


def test_cells_of_one_ratio_have_the_same_relative_times(small_study):
    # Why one panel per ratio is enough: scaling both speeds alike scales every time alike.
    rows = [r for r in small_study.to_pylist() if r["compute_speed"] == r["network_speed"]]
    rel = {}
    for r in rows:
        best = min(x["sim_time"] for x in rows if (x["microbatches"], x["compute_speed"])
                   == (r["microbatches"], r["compute_speed"]))
        rel.setdefault((r["family"], r["microbatches"]), []).append(r["sim_time"] / best)
    for values in rel.values():
        assert len(values) == 3 and max(values) == pytest.approx(min(values), rel=1e-9)


def test_pareto_plot_axes_carry_enough_labelled_ticks(tmp_path, monkeypatch):
    # Worst-device memory of these shapes lies between 9 and 12.5 M: on a log
    # axis that is a single labelled tick ("10").
    saved = _figures(monkeypatch)
    grid = {"schedules": ["1f1b", "zb-h1", "interleaved-1f1b"], "devices": [8],
            "microbatches": [16], "f": [0.5, 1.0, 2.0], "b": [1.0, 2.0], "w": [0.0, 1.0]}
    pc.write_scan(grid, tmp_path / "scan", progress=False)
    (fig,) = saved
    fig.canvas.draw()
    for ax in fig.get_axes():
        lo, hi = ax.get_xlim()
        xs = [t.get_text() for t, v in zip(ax.get_xticklabels(), ax.get_xticks())
              if lo <= v <= hi and t.get_text()]
        lo, hi = ax.get_ylim()
        ys = [t.get_text() for t, v in zip(ax.get_yticklabels(), ax.get_yticks())
              if lo <= v <= hi and t.get_text()]
        assert len(xs) >= 3 and len(ys) >= 3, (xs, ys)

"""`pipecore study --asymmetric` and the five findings (issue 16).

The search's numbers are re-derived here with pc.simulate, one variant at a
time, and its memory with the byte counts written out below (34 s b h
activation bytes per layer and microbatch, 16 bytes of training state per
parameter, 12 h^2 parameters per layer). The findings' verdicts are checked
on small tables built by hand, where the answer is known by construction.
"""

import ast
import io

import pyarrow as pa
import pytest

import pipecore as pc
from pipecore.analysis.findings import findings, format_findings
from pipecore.analysis.study import TransformerModel
from pipecore.cli import main
from pipecore.search.asymmetric import asymmetric_study, summarize_asymmetric


@pytest.fixture(scope="module")
def small():
    return asymmetric_study(devices=[4], microbatches=[4, 6], factors=[1.0, 0.1], budget=80)


def _sim(p, m, knobs, cf, nf):
    model = TransformerModel()
    hw = pc.Hardware.preset("dgx-h100").scaled(cf, nf)
    layers = model.layers / p
    act = 34 * model.seq * model.hidden * layers
    state = 16 * 12 * model.hidden ** 2 * layers
    c = model.costs(hw, p)
    costs = pc.Costs(f=c.f, b=c.b, w=c.w, activation=act, weights=state)
    res = pc.simulate(pc.build("chimera", p, m, **knobs), costs, model.network(hw))
    return res.makespan, res.peak_activation + res.static_memory


def test_rows_agree_with_direct_simulation(small):
    table, info = small
    rows = table.to_pylist()
    assert len(rows) == 2 * 4  # two shapes, 2 x 2 grid
    bad = [r for r in rows if r["microbatches"] == 6]
    assert all("multiple of devices" in r["error"] for r in bad)
    assert info["evaluated"] <= 80
    for r in rows:
        if r["error"] is not None:
            continue
        t_sym, dev_sym = _sim(4, 4, {}, r["compute"], r["network"])
        assert r["chimera_time"] == pytest.approx(t_sym, rel=1e-12)
        assert r["chimera_device_peaks"] == pytest.approx(dev_sym.tolist(), rel=1e-12)
        assert r["chimera_peak"] == pytest.approx(dev_sym.max(), rel=1e-12)
        knobs = ast.literal_eval(r["best_variant"])
        assert knobs  # an asymmetric variant changes some knob
        t_best, dev_best = _sim(4, 4, knobs, r["compute"], r["network"])
        assert r["best_time"] == pytest.approx(t_best, rel=1e-12)
        assert r["best_peak"] == pytest.approx(dev_best.max(), rel=1e-12)
        assert r["gain"] == pytest.approx((t_sym - t_best) / t_sym, rel=1e-9)
        # The search tried every microbatch split: the best is at least as fast.
        for down in (1, 3):
            assert r["best_time"] <= _sim(4, 4, {"down": down}, r["compute"], r["network"])[0]
        t_list, _ = _sim(4, 4, {"order": "list"}, r["compute"], r["network"])
        assert r["list_time"] == pytest.approx(t_list, rel=1e-12)
    text = summarize_asymmetric(table, info)
    assert "not buildable: S=4 m=6" in text and "variants evaluated" in text


def test_tiny_budget_still_has_baselines():
    table, info = asymmetric_study(devices=[4], microbatches=[4], factors=[1.0], budget=3)
    (row,) = table.to_pylist()
    assert info["evaluated"] == 3 and row["evaluated"] == 3
    # The third variant is the first microbatch split, down = 1.
    assert row["best_variant"] == "{'down': 1}"
    assert row["best_time"] == pytest.approx(_sim(4, 4, {"down": 1}, 1.0, 1.0)[0], rel=1e-12)


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"grid factors must be > 0 \(got 0\)"):
        asymmetric_study(devices=[4], microbatches=[4], factors=[0])
    with pytest.raises(ValueError, match=r"'budget' must be an int >= 1 \(got 0\)"):
        asymmetric_study(devices=[4], microbatches=[4], budget=0)


def _row(family, p, m, cf, nf, formula, table, sim, peak):
    return {"family": family, "devices": p, "microbatches": m, "compute": cf, "network": nf,
            "formula_time": formula, "table_time": table, "sim_time": sim,
            "peak_activation": peak, "error": None}


def _study_table():
    rows = []
    for m in (4, 16):
        for nf in (0.1, 10.0):
            # Cell (4, 16, 1, 0.1) flips gpipe vs chimera between formula and sim.
            flip = m == 16 and nf == 0.1
            rows += [
                _row("gpipe", 4, m, 1.0, nf, 10, 10, 10, m),
                _row("1f1b", 4, m, 1.0, nf, 10, 10, 10.05, min(m, 4) - (m > 4)),
                _row("chimera", 4, m, 1.0, nf, 8, 8, 12 if flip else 9, 3),
                _row("hanayo", 4, m, 1.0, nf, 7, 7, 7.5 if nf > 1 else 8.5, 3),
            ]
    return pa.Table.from_pylist(rows)


def test_findings_verdicts_on_a_known_table():
    out = findings(_study_table())
    assert [f["verdict"] for f in out[:4]] == ["holds only in some cells", "holds only in some cells",
                                               "holds", "holds"]
    assert out[0]["cells"] == "S=4 m=16 (c1/n0.1)"
    # 1F1B's peak is lower only at m=16 (3 against 16); at m=4 both hold 4.
    assert out[1]["cells"] == "S=4 m=16 (all)"
    # Chimera beats both in every cell but the flipped one: more at m=4 than
    # m=16, more on the fast network than the slow.
    assert "S=4: ahead in 75% of cells, 100% at m=4 vs 50% at m=16" in out[2]["detail"]
    assert out[3]["cells"] == "S=4 m=4 (all)"
    assert out[4]["verdict"] == "not evaluated"
    text = format_findings(out)
    assert all(f"\n{i}. " in text for i in range(1, 6))


def test_findings_gpipe_1f1b_peak_rule():
    rows = [_row("gpipe", 4, 4, 1.0, 1.0, 1, 1, 1.0, 4), _row("1f1b", 4, 4, 1.0, 1.0, 1, 1, 1.0, 4),
            _row("gpipe", 4, 8, 1.0, 1.0, 1, 1, 1.0, 8), _row("1f1b", 4, 8, 1.0, 1.0, 1, 1, 1.0, 4)]
    f = findings(pa.Table.from_pylist(rows))[1]
    assert f["verdict"] == "holds only in some cells"
    assert f["cells"] == "S=4 m=8 (all)"
    assert "not lower in S=4 m=4 (all)" in f["detail"]


def _asym(p, gain, best_peak, sym_peak=10.0, min_peak=10.0):
    return {"devices": p, "microbatches": 8, "compute": 1.0, "network": 1.0, "gain": gain,
            "gain_vs_symmetric": gain, "best_peak": best_peak, "chimera_peak": sym_peak,
            "min_peak": min_peak, "error": None}


@pytest.mark.parametrize("rows,verdict", [
    ([_asym(4, 0.03, 11.0), _asym(8, -0.02, 12.0)], "holds"),
    ([_asym(4, 0.03, 11.0), _asym(8, 0.05, 12.0)], "holds only in some cells"),
    ([_asym(4, 0.30, 11.0), _asym(8, 0.05, 9.0)], "does not hold"),
])
def test_findings_asymmetric_rule(rows, verdict):
    f = findings(_study_table(), pa.Table.from_pylist(rows))[4]
    assert f["verdict"] == verdict


def test_findings_need_study_columns():
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['error'"):
        findings(pa.table({"family": ["gpipe"], "devices": [4], "microbatches": [4], "compute": [1.0],
                           "network": [1.0], "formula_time": [1.0], "table_time": [1.0],
                           "sim_time": [1.0], "peak_activation": [1.0]}))


def test_cli_study_asymmetric(tmp_path):
    out = io.StringIO()
    code = main(["study", "--devices", "4", "--microbatches", "4,8", "--asymmetric",
                 "--asymmetric-microbatches", "4", "--no-plot", "--out", str(tmp_path)], out=out)
    assert code == 0
    text = out.getvalue()
    for i in range(1, 6):
        assert f"\n{i}. " in text
    assert "5. asymmetric Chimera-style placement" in text and "NOT EVALUATED" not in text.split("5. ")[1]
    for name in ("study.parquet", "asymmetric.parquet", "asymmetric.txt", "findings.txt"):
        assert (tmp_path / name).exists()


def test_asymmetric_claim_without_buildable_shapes():
    table, _info = asymmetric_study(devices=[3], microbatches=[6], factors=[1.0])
    assert "even number of devices" in table.to_pylist()[0]["error"]
    assert findings(_study_table(), table)[4]["verdict"] == "not evaluated"


def test_cli_study_without_asymmetric_says_what_claim_five_needs(tmp_path):
    out = io.StringIO()
    assert main(["study", "--devices", "4", "--microbatches", "4", "--no-plot",
                 "--out", str(tmp_path)], out=out) == 0
    tail = out.getvalue().split("\n5. ")[1]
    assert tail.startswith("asymmetric") and "NOT EVALUATED" in tail
    assert "pipecore study --asymmetric" in tail
    assert not (tmp_path / "asymmetric.parquet").exists()

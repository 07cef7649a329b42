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


def _m_bytes(p):
    """One M in bytes: one microbatch's activation of one device share (128 / p layers)."""
    return 34 * TransformerModel().seq * TransformerModel().hidden * (TransformerModel().layers / p)


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
        unit = _m_bytes(4)
        assert r["m_bytes"] == unit
        t_sym, dev_sym = _sim(4, 4, {}, r["compute_speed"], r["network_speed"])
        assert r["chimera_time"] == t_sym  # the same simulation: the same bits
        assert r["chimera_device_peaks"] == pytest.approx((dev_sym / unit).tolist(), rel=1e-12)
        assert r["chimera_peak"] == pytest.approx(dev_sym.max() / unit, rel=1e-12)
        knobs = ast.literal_eval(r["best_variant"])
        assert knobs  # an asymmetric variant changes some knob
        t_best, dev_best = _sim(4, 4, knobs, r["compute_speed"], r["network_speed"])
        assert r["best_time"] == t_best
        assert r["best_peak"] == pytest.approx(dev_best.max() / unit, rel=1e-12)
        assert r["gain"] == pytest.approx((t_sym - t_best) / t_sym, rel=1e-9)
        # The search tried every microbatch split: the best is at least as fast.
        for down in (1, 3):
            assert r["best_time"] <= _sim(4, 4, {"down": down}, r["compute_speed"],
                                          r["network_speed"])[0]
        t_list, _ = _sim(4, 4, {"order": "list"}, r["compute_speed"], r["network_speed"])
        assert r["list_time"] == t_list
    text = summarize_asymmetric(table, info)
    assert "not buildable: p=4 m=6" in text and "variants evaluated" in text


def test_tiny_budget_still_has_baselines():
    table, info = asymmetric_study(devices=[4], microbatches=[4], factors=[1.0], budget=3)
    (row,) = table.to_pylist()
    assert info["evaluated"] == 3 and row["evaluated"] == 3
    # The third variant is the first microbatch split, down = 1.
    assert row["best_variant"] == "{'down': 1}"
    assert row["best_time"] == _sim(4, 4, {"down": 1}, 1.0, 1.0)[0]


def test_bad_arguments():
    with pytest.raises(ValueError, match=r"grid factors must be > 0 \(got 0\)"):
        asymmetric_study(devices=[4], microbatches=[4], factors=[0])
    with pytest.raises(ValueError, match=r"'budget' must be an int >= 1 \(got 0\)"):
        asymmetric_study(devices=[4], microbatches=[4], budget=0)


def _row(family, p, m, cf, nf, formula, table, sim, peak):
    return {"family": family, "devices": p, "microbatches": m, "compute_speed": cf,
            "network_speed": nf,
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
    assert out[0]["cells"] == "p=4 m=16 (c1/n0.1)"
    # 1F1B's peak is lower only at m=16 (3 against 16); at m=4 both hold 4.
    assert out[1]["cells"] == "p=4 m=16 (all)"
    # Chimera beats both in every cell but the flipped one: more at m=4 than
    # m=16, more on the fast network than the slow.
    assert "p=4: ahead in 75% of cells, 100% at m=4 vs 50% at m=16" in out[2]["detail"]
    assert out[3]["cells"] == "p=4 m=4 (all)"
    assert out[4]["verdict"] == "not evaluated"
    text = format_findings(out)
    assert all(f"\n{i}. " in text for i in range(1, 6))


def test_findings_gpipe_1f1b_peak_rule():
    rows = [_row("gpipe", 4, 4, 1.0, 1.0, 1, 1, 1.0, 4), _row("1f1b", 4, 4, 1.0, 1.0, 1, 1, 1.0, 4),
            _row("gpipe", 4, 8, 1.0, 1.0, 1, 1, 1.0, 8), _row("1f1b", 4, 8, 1.0, 1.0, 1, 1, 1.0, 4)]
    f = findings(pa.Table.from_pylist(rows))[1]
    assert f["verdict"] == "holds only in some cells"
    assert f["cells"] == "p=4 m=8 (all)"
    assert "not lower in p=4 m=4 (all)" in f["detail"]


def _asym(p, gain, best_peak, sym_peak=10.0, min_peak=10.0):
    return {"devices": p, "microbatches": 8, "compute_speed": 1.0, "network_speed": 1.0,
            "gain": gain,
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
        findings(pa.table({"family": ["gpipe"], "devices": [4], "microbatches": [4],
                           "compute_speed": [1.0], "network_speed": [1.0], "formula_time": [1.0],
                           "table_time": [1.0], "sim_time": [1.0], "peak_activation": [1.0]}))


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


# -- issue 37: memory in M, placements over the device's memory, progress, speed ----


def test_memory_in_m_and_placements_over_the_device_memory_marked(small):
    table, info = small
    rows = [r for r in table.to_pylist() if r["error"] is None]
    unit = _m_bytes(4)  # 9.13e9 bytes at p=4
    for r in rows:
        assert r["m_bytes"] == unit
        assert r["device_memory"] == pytest.approx(80e9 / unit, rel=1e-12)
        # Two replicas of 32 layers' training state (16 bytes per parameter)
        # alone are 2 * 16 * 12 * 4096^2 * 32 bytes = 206 GB: nothing fits 80 GB.
        assert r["chimera_peak"] > 2 * 16 * 12 * 4096 ** 2 * 32 / unit > r["device_memory"]
        assert not r["chimera_fits"] and not r["best_fits"] and not r["min_peak_fits"]
    text = summarize_asymmetric(table, info)
    assert "M = 9.13 GB, one microbatch's activation of one device share" in text
    assert "global peak (M)" in text and "(GB)" not in text
    assert "26.59! ->" in text and "!: more than the device's memory" in text
    # On a device with room for it, nothing is marked.
    import dataclasses

    roomy = dataclasses.replace(pc.Hardware.preset("dgx-h100"), hbm_bytes=1e12)
    big, big_info = asymmetric_study(devices=[4], microbatches=[4], factors=[1.0], budget=4,
                                     hardware=roomy)
    (row,) = big.to_pylist()
    assert row["chimera_fits"] and row["best_fits"] and row["min_peak_fits"]
    assert "!" not in summarize_asymmetric(big, big_info)


def test_metadata_and_columns_name_speeds_and_units(small):
    import json

    table, _info = small
    assert {"compute_speed", "network_speed"} <= set(table.column_names)
    assert "compute" not in table.column_names
    meta = table.schema.metadata
    assert json.loads(meta[b"pipecore.hardware"])["name"] == "dgx-h100"
    assert meta[b"pipecore.time_unit"] == b"s"
    assert json.loads(meta[b"pipecore.m_bytes"]) == {"4": _m_bytes(4)}


def test_progress_lines_while_a_unit_runs_long():
    # A line at least every `every` seconds even when the caller is stuck in
    # one unit (a compile): written by a background thread.
    import time

    from pipecore.core.progress import ProgressLines

    out = io.StringIO()
    with ProgressLines(2, "job", stream=out, unit="shapes", every=0.2) as bar:
        bar.update(0, note="first")
        # The caller is stuck: wait for the thread's lines (a generous bound, not a race
        # against a fixed sleep on a loaded machine).
        deadline = time.monotonic() + 60
        while out.getvalue().count("working (first)") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        bar.update(1)
        bar.update(1, final=True)
    lines = out.getvalue().splitlines()
    assert lines[0] == "job: 0/2 shapes done, 0 s elapsed, started"
    assert sum("working (first)" in line for line in lines) >= 2
    assert lines[-1].startswith("job: 2/2 shapes done") and lines[-1].endswith("finished")


def test_cli_writes_progress_lines_when_stderr_is_not_a_terminal(tmp_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "pipecore.cli", "study", "--devices", "4",
                           "--microbatches", "4", "--asymmetric", "--asymmetric-microbatches",
                           "4", "--no-plot", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    err = done.stderr.splitlines()
    assert "study: 0/1 shapes done, 0 s elapsed, started" in err
    assert any(line.startswith("study: 1/1 shapes done") and line.endswith("finished")
               for line in err)
    assert "asymmetric search: 0/1 shapes done, 0 s elapsed, started" in err
    assert any(line.startswith("asymmetric search: 1/1 shapes done") for line in err)
    assert "\r" not in done.stderr  # plain lines, no terminal bar
    quiet = subprocess.run([sys.executable, "-m", "pipecore.cli", "study", "--devices", "4",
                            "--microbatches", "4", "--no-plot", "--no-progress", "--out",
                            str(tmp_path)], capture_output=True, text=True, timeout=600)
    assert quiet.returncode == 0 and quiet.stderr == ""


def test_the_search_runs_on_the_list_scheduler_alone(monkeypatch):
    # The study compiles the list scheduler anyway; the search needs no
    # batched replay kernels (a compile of their own from an empty cache).
    from pipecore.core.pack import Pack

    def refuse(*args, **kwargs):
        raise AssertionError("the batched replay ran")

    monkeypatch.setattr(Pack, "replay", refuse)
    table, _info = asymmetric_study(devices=[4], microbatches=[4], factors=[1.0, 10.0], budget=12)
    assert all(r["error"] is None for r in table.to_pylist())


# p=8 shapes take 7-15 s each on two cores: CI's `pytest -m heavy` runs them.
@pytest.mark.parametrize("p,m", [(4, 8), pytest.param(8, 8, marks=pytest.mark.heavy)])
def test_shared_devices_are_known_before_building(p, m):
    from pipecore.search import asymmetric

    keys = asymmetric._initial(p, m)
    keys += [nb for k in keys[:20] for nb in asymmetric._neighbours(k, p, m)]
    seen = 0
    for key in dict.fromkeys(keys):
        sched = pc.build("chimera", p, m, **asymmetric._knobs(key, p, m))
        shared = any(len(d) != 2 for d in sched.stage_devices)
        assert asymmetric._shares_a_device(key, p, m) == shared, key
        seen += shared
    assert seen  # the keys include placements that share a device


def _greedy_by_scan(p, k, m, up_placement, ranges):
    """The list order as chimera.py wrote it before issue 37 (every queue
    scanned at every step), kept as the reference for the faster version."""
    size = {pipe: [(hi - lo) * p / ranges[pipe][-1][1] for lo, hi in ranges[pipe]]
            for pipe in ("down", "up")}
    place = {"down": list(range(p)), "up": list(up_placement)}
    mbs = {"down": list(range(k)), "up": list(range(k, m))}
    queues = []
    for pipe in ("down", "up"):
        n = len(mbs[pipe])
        for i in range(p):
            warm = min(n, p - i)
            q = [("F", j) for j in range(warm)]
            for j in range(n - warm):
                q += [("BW", j), ("F", warm + j)]
            q += [("BW", j) for j in range(n - warm, n)]
            queues.append((pipe, i, q))
    by_dev = [[qi for qi, (pipe, i, _q) in enumerate(queues) if place[pipe][i] == d]
              for d in range(p)]
    pos = [0] * len(queues)
    done, free, order = {}, [0.0] * p, [[] for _ in range(p)]
    left = sum(len(q) for _p, _i, q in queues)
    while left:
        best = None
        for d in range(p):
            for qi in by_dev[d]:
                pipe, i, q = queues[qi]
                if pos[qi] == len(q):
                    continue
                kind, j = q[pos[qi]]
                if kind == "F":
                    need = ("F", pipe, i - 1, j) if i > 0 else None
                else:
                    need = ("BW", pipe, i + 1, j) if i < p - 1 else ("F", pipe, i, j)
                if need is not None and need not in done:
                    continue
                ready = done[need] if need is not None else 0.0
                rank = (max(free[d], ready), kind != "BW", -i, pipe != "down", d)
                if best is None or rank < best[0]:
                    best = (rank, d, qi)
        rank, d, qi = best
        pipe, i, q = queues[qi]
        kind, j = q[pos[qi]]
        pos[qi] += 1
        left -= 1
        free[d] = rank[0] + size[pipe][i] * (1.0 if kind == "F" else 2.0)
        done[(kind, pipe, i, j)] = free[d]
        order[d].append((kind, pipe, i, mbs[pipe][j]))
    return order, done


@pytest.mark.parametrize("p,m", [(2, 4), (4, 4), (4, 8), pytest.param(8, 8, marks=pytest.mark.heavy),
                                 pytest.param(8, 16, marks=pytest.mark.heavy)])
def test_list_order_builds_equal_the_former_scan(p, m, monkeypatch):
    # A guard, not a new behaviour: the faster list order and column making
    # give the schedules they gave before, for the search's own variants.
    from pipecore.core.schedule import Schedule
    from pipecore.schedules import chimera
    from pipecore.search import asymmetric

    keys = asymmetric._initial(p, m)
    keys += [nb for k in keys[:6] for nb in asymmetric._neighbours(k, p, m)]
    for key in dict.fromkeys(keys):
        down, up, dl, ul, _order = key
        even = list(dl) == [asymmetric.UNITS] * p and list(ul) == [asymmetric.UNITS] * p
        ranges = chimera._segments(None if even else list(dl), None if even else list(ul), p)[2]
        assert chimera._greedy_programs(p, down, m, list(up), ranges) == \
            _greedy_by_scan(p, down, m, list(up), ranges)
        knobs = asymmetric._knobs(key, p, m)
        with monkeypatch.context() as patch:  # the former column making: op by op
            patch.setattr(chimera, "_from_programs", lambda programs, p: Schedule.from_programs(
                programs, name="chimera", devices=p, replicated=True))
            want = pc.build("chimera", p, m, **knobs)
        assert pc.build("chimera", p, m, **knobs).table.equals(want.table)

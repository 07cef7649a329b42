"""The three views (formula, ideal table, simulation), compare and the CLI."""

import io
import json
import re

import numpy as np
import pyarrow.parquet as pq
import pytest

import pipecore as pc
from pipecore.analysis.compare import compare, format_compare
from pipecore.cli import main


def test_ideal_table_1f1b_unit_slots():
    # Unit op times F=1, B=1, W=1 (fused BW = 2): 1F1B takes (m + p - 1) * 3 slots.
    t = pc.ideal_table(pc.build("1f1b", 4, 8))
    assert t.length == (8 + 4 - 1) * 3
    # Each device is busy m*(1 + 2) slots; the rest is the (p-1)*3 bubble.
    np.testing.assert_array_equal(t.idle, np.full(4, (4 - 1) * 3))
    text = t.render()
    assert text.splitlines()[0].split("|")[1].split()[:2] == ["0F0", "0F1"]
    assert text.splitlines()[3].split("|")[1].split()[:3] == [".", ".", "."]


def test_ideal_table_chunks_take_one_slot_each():
    # With v chunks every op still takes one slot: interleaved length is
    # 3*v*m + 3*(p-1) slots (issue 2's bar at chunk times F=1, B+W=2).
    p, m, v = 4, 8, 2
    t = pc.ideal_table(pc.build("interleaved-1f1b", p, m, chunks=v))
    assert t.length == 3 * v * m + 3 * (p - 1)
    cells = t.grid[t.grid >= 0]
    # Every op occupies slots equal to its slot count: F 1, BW 2.
    counts = np.bincount(cells, minlength=t.schedule.num_ops)
    kinds = t.schedule.kind_codes
    np.testing.assert_array_equal(counts, np.where(kinds == 0, 1, 2))


def test_ideal_table_rejects_bad_slots():
    with pytest.raises(ValueError, match=r"'f' must be an int >= 1 \(got 0\)"):
        pc.ideal_table(pc.build("1f1b", 2, 2), f=0)


def test_formula_requires_family_and_scalars():
    sched = pc.from_actions({0: ["0F0", "0BW0"]})
    with pytest.raises(ValueError, match="not built by pipecore.build"):
        pc.formula(sched)
    with pytest.raises(ValueError, match="must be a scalar"):
        pc.formula(pc.build("1f1b", 2, 2), pc.Costs(f=[1.0, 1.0]))


def test_compare_agrees_without_communication():
    # Equal F, B, W and W holding the whole activation: the regime in which
    # every closed form is exact, except V-Min's and V-Half's bubbles, which
    # the Controllable Memory paper only states approximately, and Hanayo's,
    # whose order (fixed at equal forward and backward times) leaves gaps
    # between units of p microbatches when BW = 2F, as the note says.
    rows = compare(8, 32, costs=pc.Costs(f=1.0, b=1.0, w=1.0, activation_w=1.0))
    assert {r["name"] for r in rows} == set(pc.schedules())
    for r in rows:
        assert r["error"] is None, r["name"]
        if r["name"] in ("v-min", "v-half", "helixpipe"):
            # HelixPipe's is device 0's work bound (attained in every shape simulated).
            assert not r["formula_exact"]
            assert all("approximate" in f for f in r["flags"])
        elif r["name"] == "hanayo":
            assert not r["formula_exact"]
            assert len(r["flags"]) == 3
            assert all(f.endswith("cause: idle gaps between units of p microbatches")
                       for f in r["flags"])
        else:
            assert r["formula_exact"], r["name"]
            assert r["flags"] == [], (r["name"], r["flags"])
    by = {r["name"]: r for r in rows}
    assert by["1f1b"]["makespan"] == (32 + 8 - 1) * 3 and by["gpipe"]["peak_max"] == 32.0
    # Issue 52: Chimera (forward doubling) is not slower than 1F1B here, and
    # its three views agree.
    assert by["chimera"]["makespan"] == by["chimera"]["table_slots"] == 105.0 < 117.0


def test_compare_marks_approximate_formulas():
    # ZB-V's zero bubble needs T_F = T_B = T_W; with f=1, b=2, w=0 it is flagged as approximate.
    rows = {r["name"]: r for r in compare(8, 32)}
    assert not rows["zb-v"]["formula_exact"]
    assert all("formula approximate" in f for f in rows["zb-v"]["flags"])
    assert rows["1f1b"]["flags"] == [] and rows["1f1b"]["makespan"] == 117.0


def test_compare_flags_communication_and_unbuildable():
    rows = compare(4, 6, costs=pc.Costs(f=1.0, b=2.0, comm=0.5))
    by = {r["name"]: r for r in rows}
    assert "multiple of devices" in by["interleaved-1f1b"]["error"]
    assert any("communication" in f for f in by["1f1b"]["flags"])
    # The simulation is slower than the formula once transfers cost time.
    assert by["1f1b"]["makespan"] > by["1f1b"]["formula_makespan"]
    text = format_compare(rows)
    assert "not built: 'interleaved-1f1b' needs microbatches" in text
    # Each note names the column it qualifies and the cause (wording since issue 37).
    assert re.search(r"^1f1b .* no \[\d+\]", text, re.M)
    assert "] makespan: simulation differs from formula; cause: communication" in text


def run_cli(args):
    out = io.StringIO()
    code = main(args, out=out)
    return code, out.getvalue()


def test_cli_compare_writes_gantt(tmp_path):
    code, text = run_cli(["compare", "--devices", "4", "--microbatches", "8", "--out", str(tmp_path)])
    assert code == 0
    assert "1f1b" in text and "yes" in text
    pngs = sorted(p.name for p in tmp_path.glob("*.png"))
    assert len(pngs) == len(pc.schedules())
    assert all((tmp_path / n).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for n in pngs)


def test_cli_compare_json(tmp_path):
    code, text = run_cli(["compare", "-p", "4", "-m", "8", "--no-gantt", "--json"])
    data = json.loads(text)
    assert code == 0 and {r["name"] for r in data["rows"]} == set(pc.schedules())


def test_cli_simulate_outputs(tmp_path):
    trace, gantt, parquet = tmp_path / "t.json", tmp_path / "g.png", tmp_path / "o.parquet"
    code, text = run_cli(["simulate", "1f1b", "--devices", "4", "--microbatches", "8",
                          "--f", "1", "--b", "2", "--w", "0", "--json", "--trace", str(trace),
                          "--gantt", str(gantt), "--parquet", str(parquet)])
    assert code == 0
    data = json.loads(text)
    assert data["makespan"] == 33.0 and data["peak_activation"] == [4.0, 3.0, 2.0, 1.0]
    events = json.loads(trace.read_text())["traceEvents"]
    assert sum(1 for e in events if e.get("ph") == "X" and e.get("pid") == 0) == 64
    assert pq.read_table(parquet).num_rows == 64
    assert gantt.read_bytes()[:4] == b"\x89PNG"


def test_cli_simulate_with_network_text():
    # Forward transfers hold link 0->1 for 4/2 = 2 each: start 1, 3, 5, land 3.5, 5.5, 7.5;
    # device 1 ends its forwards at 8.5; its zero-time backwards send gradients that
    # queue on link 1->0 (8.5, 10.5, 12.5) and land at 11, 13, 15: makespan 15.
    code, text = run_cli(["simulate", "gpipe", "-p", "2", "-m", "3", "--f", "1", "--b", "0", "--w", "0",
                          "--bytes", "4", "--bandwidth", "2", "--latency", "0.5"])
    assert code == 0 and "makespan             15  (cost units)\n" in text


def test_cli_table_and_list():
    code, text = run_cli(["table", "gpipe", "-p", "2", "-m", "2"])
    assert code == 0 and "gpipe: 9 slots" in text
    code, text = run_cli(["list"])
    assert code == 0 and all(n in text for n in pc.schedules())


@pytest.mark.parametrize("args,needle", [
    (["simulate", "nope", "-p", "2", "-m", "2"], "unknown schedule 'nope'; valid names"),
    (["simulate", "1f1b", "-p", "2", "-m", "2", "--f", "nan"], "Costs 'f' must be finite"),
    (["simulate", "interleaved-1f1b", "-p", "4", "-m", "6"], "multiple of devices"),
    (["simulate", "1f1b", "-p", "2", "-m", "2", "--bytes", "1"], "needs both --bytes and --bandwidth"),
])
def test_cli_errors_are_clear(args, needle, capsys):
    code, _ = run_cli(args)
    assert code == 2
    assert needle in capsys.readouterr().err


def test_cli_rejects_nonpositive_shape(capsys):
    with pytest.raises(SystemExit) as info:
        main(["simulate", "1f1b", "-p", "0", "-m", "2"])
    assert info.value.code == 2
    assert "must be >= 1 (got 0)" in capsys.readouterr().err


def test_result_writers(tmp_path):
    res = pc.simulate(pc.build("gpipe", 2, 2), pc.Costs())
    assert pq.read_table(res.write_parquet(tmp_path / "o.parquet")).num_rows == 8
    assert json.loads(res.write_trace(tmp_path / "t.json").read_text())["traceEvents"]
    assert res.write_gantt(tmp_path / "g.png").read_bytes()[:4] == b"\x89PNG"


def test_compare_rejects_bad_shape():
    with pytest.raises(ValueError, match=r"'devices' must be >= 1 \(got 0\)"):
        compare(0, 4)


def unit_costs(sched):
    """Per-op unit times whatever the chunk: F = B = W = 1 (BW = 2), free F&B overlap off."""
    ones = np.ones(sched.stages)
    return pc.Costs(f=ones, b=ones, w=ones, comm=0.0, fb_factor=1.0, offload=0.0)


def _buildable():
    # Every family at every shape it accepts (each family states its own rule).
    out = []
    for name in pc.schedules():
        for p, m in [(2, 4), (4, 8), (4, 16), (6, 12), (8, 16)]:
            try:
                pc.build(name, p, m)
            except ValueError:
                continue
            out.append((name, p, m))
    return out


@pytest.mark.parametrize("name,p,m", _buildable())
def test_table_length_equals_simulation_at_unit_costs(name, p, m):
    # Issue 4's bar: the idealised table (worked out slot by slot, independently
    # of the kernel) and the simulation agree when communication is free.
    sched = pc.build(name, p, m)
    assert pc.ideal_table(sched).length == pc.simulate(sched, unit_costs(sched)).makespan


def test_every_family_is_cross_checked():
    assert {name for name, _p, _m in _buildable()} == set(pc.schedules())


from hypothesis import given, settings  # noqa: E402

from pipecore.testing import schedules  # noqa: E402


@settings(max_examples=80, deadline=None)
@given(schedules())
def test_table_length_equals_simulation_random(sched):
    assert pc.ideal_table(sched).length == pc.simulate(sched, unit_costs(sched)).makespan

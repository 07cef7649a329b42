"""Tests for pipecore.output (Chrome trace, Gantt PNG, Parquet writers)."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import pipecore.output as output  # noqa: E402

KIND_TYPE = pa.dictionary(pa.int8(), pa.string())
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _kinds(values):
    return pa.array(values, pa.string()).dictionary_encode().cast(KIND_TYPE)


def _ops_table(rows):
    """rows: (device, slot, kind, stage, microbatch, start, finish)."""
    cols = list(zip(*rows)) if rows else [[]] * 7
    return pa.table(
        {
            "device": pa.array(cols[0], pa.int32()),
            "slot": pa.array(cols[1], pa.int32()),
            "kind": _kinds(list(cols[2])),
            "stage": pa.array(cols[3], pa.int32()),
            "microbatch": pa.array(cols[4], pa.int32()),
            "start": pa.array(cols[5], pa.float64()),
            "finish": pa.array(cols[6], pa.float64()),
        }
    )


def _transfers_table(rows):
    """rows: (src, dst, stage, microbatch, kind, ready, start, finish, arrival)."""
    cols = list(zip(*rows)) if rows else [[]] * 9
    return pa.table(
        {
            "src_device": pa.array(cols[0], pa.int32()),
            "dst_device": pa.array(cols[1], pa.int32()),
            "stage": pa.array(cols[2], pa.int32()),
            "microbatch": pa.array(cols[3], pa.int32()),
            "kind": _kinds(list(cols[4])),
            "ready": pa.array(cols[5], pa.float64()),
            "start": pa.array(cols[6], pa.float64()),
            "finish": pa.array(cols[7], pa.float64()),
            "arrival": pa.array(cols[8], pa.float64()),
        }
    )


def _memory_table(rows):
    cols = list(zip(*rows)) if rows else [[]] * 3
    return pa.table(
        {
            "device": pa.array(cols[0], pa.int32()),
            "time": pa.array(cols[1], pa.float64()),
            "activation": pa.array(cols[2], pa.float64()),
        }
    )


OPS_ROWS = [
    # device, slot, kind, stage, microbatch, start, finish
    (0, 0, "F", 0, 0, 0.0, 1.0),
    (0, 1, "F", 0, 1, 1.0, 2.0),
    (0, 2, "B", 0, 0, 4.0, 6.0),
    (0, 3, "W", 0, 0, 6.0, 6.0),  # zero-duration op must still appear
    (1, 0, "F", 1, 0, 1.5, 2.5),
    (1, 1, "BW", 1, 0, 2.5, 4.0),
    (1, 2, "F", 1, 1, 4.0, 5.0),
]

TRANSFER_ROWS = [
    # src, dst, stage, mb, kind, ready, start, finish, arrival
    (0, 1, 0, 0, "F", 1.0, 1.0, 1.2, 1.5),
    # Starts when the link is released (1.2) but before the previous arrival
    # (1.5): must land on a second lane of d0->d1.
    (0, 1, 0, 1, "F", 1.1, 1.2, 1.4, 1.7),
    (1, 0, 1, 0, "BW", 4.0, 4.0, 4.0, 4.0),  # zero-duration transfer
]

MEMORY_ROWS = [(0, 0.0, 10.0), (0, 1.0, 20.0), (1, 1.5, 10.0), (1, 4.0, 0.0)]


def make_result(ops_rows=OPS_ROWS, transfer_rows=TRANSFER_ROWS, memory_rows=MEMORY_ROWS):
    ops = _ops_table(ops_rows)
    return types.SimpleNamespace(
        ops=ops,
        transfers=_transfers_table(transfer_rows),
        memory=_memory_table(memory_rows),
        makespan=max((r[6] for r in ops_rows), default=0.0),
        devices=2,
        name="fake",
    )


def _load_trace(path):
    with open(path, encoding="utf-8") as fh:
        # Reject NaN / Infinity the way strict JSON parsers (Perfetto) do.
        return json.load(fh, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))


# ---------------------------------------------------------------------------
# Chrome trace
# ---------------------------------------------------------------------------


def test_chrome_trace_ops_events(tmp_path):
    result = make_result()
    out = output.write_chrome_trace(result, str(tmp_path / "t.json"), time_scale=1000.0)
    assert isinstance(out, Path) and out.exists()
    doc = _load_trace(out)
    assert doc["displayTimeUnit"] == "ms"
    events = doc["traceEvents"]

    ops_events = [e for e in events if e["ph"] == "X" and e["pid"] == 0]
    assert len(ops_events) == len(OPS_ROWS)
    by_key = {(e["tid"], e["args"]["slot"]): e for e in ops_events}
    for device, slot, kind, stage, mb, start, finish in OPS_ROWS:
        e = by_key[(device, slot)]
        assert e["name"] == f"{kind} s{stage} mb{mb}"
        assert e["ts"] == pytest.approx(start * 1000.0)
        assert e["dur"] == pytest.approx((finish - start) * 1000.0)
        assert e["args"]["stage"] == stage
        assert e["args"]["microbatch"] == mb
        assert e["args"]["kind"] == kind
    zero = by_key[(0, 3)]
    assert zero["dur"] == 0


def test_chrome_trace_metadata_and_counters(tmp_path):
    doc = _load_trace(output.write_chrome_trace(make_result(), tmp_path / "t.json"))
    events = doc["traceEvents"]
    meta = [e for e in events if e["ph"] == "M"]
    proc = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert proc == {0: "compute", 1: "links"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert threads[(0, 0)] == "device 0"
    assert threads[(0, 1)] == "device 1"

    counters = [e for e in events if e["ph"] == "C"]
    assert len(counters) == len(MEMORY_ROWS)
    assert {e["name"] for e in counters} == {"activation d0", "activation d1"}
    assert all(e["pid"] == 0 for e in counters)
    first = [e for e in counters if e["name"] == "activation d0"]
    assert [e["args"]["activation"] for e in sorted(first, key=lambda e: e["ts"])] == [10.0, 20.0]


def test_chrome_trace_link_events(tmp_path):
    doc = _load_trace(output.write_chrome_trace(make_result(), tmp_path / "t.json"))
    events = doc["traceEvents"]
    threads = {
        e["tid"]: e["args"]["name"]
        for e in events
        if e["ph"] == "M" and e["pid"] == 1 and e["name"] == "thread_name"
    }
    links = [e for e in events if e["ph"] == "X" and e["pid"] == 1]
    assert len(links) == len(TRANSFER_ROWS)
    assert sorted(threads.values()) == ["d0->d1", "d0->d1 (2)", "d1->d0"]

    by_mb = {(e["args"]["src_device"], e["args"]["microbatch"]): e for e in links}
    e0 = by_mb[(0, 0)]
    assert threads[e0["tid"]] == "d0->d1"
    assert e0["ts"] == pytest.approx(1.0)
    assert e0["dur"] == pytest.approx(0.5)  # start..arrival, not start..finish
    assert e0["args"] == {
        "src_device": 0,
        "dst_device": 1,
        "stage": 0,
        "microbatch": 0,
        "kind": "F",
        "ready": 1.0,
        "start": 1.0,
        "finish": 1.2,
        "arrival": 1.5,
    }
    # Overlapping transfer on the same link goes to its own lane.
    assert threads[by_mb[(0, 1)]["tid"]] == "d0->d1 (2)"
    assert threads[by_mb[(1, 0)]["tid"]] == "d1->d0"
    assert by_mb[(1, 0)]["dur"] == 0

    # Events on any one track never partially overlap (must nest for X).
    for tid in threads:
        spans = sorted((e["ts"], e["ts"] + e["dur"]) for e in links if e["tid"] == tid)
        for (_, end), (start, _) in zip(spans, spans[1:]):
            assert start >= end


def test_chrome_trace_empty_transfers_and_memory(tmp_path):
    result = make_result(transfer_rows=[], memory_rows=[])
    doc = _load_trace(output.write_chrome_trace(result, tmp_path / "t.json"))
    events = doc["traceEvents"]
    assert not [e for e in events if e.get("pid") == 1]
    assert not [e for e in events if e["ph"] == "C"]
    assert len([e for e in events if e["ph"] == "X"]) == len(OPS_ROWS)


def test_chrome_trace_rejects_nan_and_bad_scale(tmp_path):
    rows = list(OPS_ROWS)
    rows[0] = (0, 0, "F", 0, 0, float("nan"), 1.0)
    with pytest.raises(ValueError, match="non-finite"):
        output.write_chrome_trace(make_result(ops_rows=rows), tmp_path / "t.json")
    with pytest.raises(ValueError, match="time_scale"):
        output.write_chrome_trace(make_result(), tmp_path / "t.json", time_scale=0)


# ---------------------------------------------------------------------------
# Gantt
# ---------------------------------------------------------------------------


def _assert_png(path):
    assert isinstance(path, Path)
    data = path.read_bytes()
    assert len(data) > len(PNG_SIGNATURE)
    assert data.startswith(PNG_SIGNATURE)


def test_gantt_png(tmp_path):
    pytest.importorskip("matplotlib", reason="Gantt charts need the plot extra: pip install pipecore[plot]")
    _assert_png(output.write_gantt(make_result(), tmp_path / "g.png"))


def test_gantt_png_with_transfers_and_title(tmp_path):
    pytest.importorskip("matplotlib", reason="Gantt charts need the plot extra: pip install pipecore[plot]")
    out = output.write_gantt(
        make_result(), str(tmp_path / "g.png"), title="custom", show_transfers=True
    )
    _assert_png(out)


def test_gantt_png_empty_transfers_and_ops(tmp_path):
    pytest.importorskip("matplotlib", reason="Gantt charts need the plot extra: pip install pipecore[plot]")
    _assert_png(
        output.write_gantt(
            make_result(transfer_rows=[]), tmp_path / "a.png", show_transfers=True
        )
    )
    _assert_png(output.write_gantt(make_result(ops_rows=[], transfer_rows=[]), tmp_path / "b.png"))


def test_gantt_many_ops(tmp_path):
    """30k ops (8 devices, interleaved stages) must render quickly."""
    pytest.importorskip("matplotlib", reason="Gantt charts need the plot extra: pip install pipecore[plot]")
    p, per_dev = 8, 3750
    device = np.repeat(np.arange(p), per_dev)
    slot = np.tile(np.arange(per_dev), p)
    start = slot + device * 0.5
    kinds = np.array(["F", "B", "W", "BW"])[slot % 4]
    rows = list(
        zip(
            device.tolist(),
            slot.tolist(),
            kinds.tolist(),
            (device + p * (slot % 2)).tolist(),  # two chunks per device
            (slot // 4).tolist(),
            start.tolist(),
            (start + 0.9).tolist(),
        )
    )
    result = make_result(ops_rows=rows, transfer_rows=[], memory_rows=[])
    result.devices = p
    _assert_png(output.write_gantt(result, tmp_path / "big.png"))


def _png_text(path):
    from PIL import Image

    with Image.open(path) as im:
        return dict(im.text), im.size


def test_gantt_labels_what_fits_and_says_what_it_left_out(tmp_path):
    """Issue 37 item 8: two-digit numbers are drawn where they fit, and the
    title counts the boxes too small for theirs."""
    pytest.importorskip("matplotlib", reason="Gantt charts need the plot extra: pip install pipecore[plot]")
    # Twelve F boxes of one time unit (microbatches 0..11) and one of a
    # thousandth: at any width a chart is drawn (the 12-unit chart is at
    # least 800 px of axes, 66 px per unit) a two-digit number fits the
    # first twelve and no number fits a box of 0.07 px.
    rows = [(0, k, "F", 0, k, float(k), k + 1.0) for k in range(12)]
    rows.append((0, 12, "F", 0, 12, 12.0, 12.001))
    result = make_result(ops_rows=rows, transfer_rows=[], memory_rows=[])
    result.devices = 1
    text, _ = _png_text(output.write_gantt(result, tmp_path / "g.png", title="mine"))
    assert text["pipecore:labels"] == "12" and text["pipecore:ops"] == "13"
    assert text["Title"] == "mine\nmicrobatch numbers shown where they fit: 12 of 13 ops"


def test_gantt_title_is_plain_when_every_number_fits(tmp_path):
    pytest.importorskip("matplotlib", reason="Gantt charts need the plot extra: pip install pipecore[plot]")
    import pipecore as pc

    # 1F1B at p=8, m=32 (the README's main job): its shortest box, an F of
    # one unit, is 1/117 of the axes (at least 800 px: 6.8 px per unit is
    # too narrow for two digits at 6 pt; the chart widens for them).
    res = pc.simulate(pc.build("1f1b", 8, 32), pc.Costs(f=1.0, b=1.0, w=1.0))
    text, size = _png_text(output.write_gantt(res, tmp_path / "g.png"))
    assert text["pipecore:labels"] == text["pipecore:ops"] == "512"
    assert text["Title"] == ("1f1b, p=8 m=32, f=1 b=1 w=1 comm=0: makespan 117 cost units")
    assert size[0] <= 2100  # readable whole on a screen


def test_gantt_dense_chart_stays_screen_wide_and_says_no_numbers(tmp_path):
    pytest.importorskip("matplotlib", reason="Gantt charts need the plot extra: pip install pipecore[plot]")
    # 2,000 ops of 0.9 units on one device: at most 1,800 px of axes give
    # each box under a pixel, too narrow for any digit.
    rows = [(0, k, "F", 0, k, float(k), k + 0.9) for k in range(2000)]
    result = make_result(ops_rows=rows, transfer_rows=[], memory_rows=[])
    result.devices = 1
    text, size = _png_text(output.write_gantt(result, tmp_path / "g.png", title="dense"))
    assert text["pipecore:labels"] == "0"
    assert text["Title"] == ("dense\nmicrobatch numbers left out: at this size none fits its "
                             "box (2,000 ops)")
    assert size[0] <= 2100


def test_trace_reads_a_memory_table_with_the_old_column_name(tmp_path):
    # A hand-made result whose memory table still says 'bytes' (issue 37 item 6).
    result = make_result()
    result.memory = result.memory.rename_columns(["device", "time", "bytes"])
    with pytest.warns(DeprecationWarning, match="'bytes' is now called 'activation'"):
        doc = _load_trace(output.write_chrome_trace(result, tmp_path / "t.json"))
    counters = [e for e in doc["traceEvents"] if e["ph"] == "C"]
    assert [e["args"]["activation"] for e in counters] == [r[2] for r in MEMORY_ROWS]


def test_gantt_missing_matplotlib(tmp_path, monkeypatch):
    # A None entry in sys.modules makes `import matplotlib` raise ImportError.
    for name in list(sys.modules):
        if name == "matplotlib" or name.startswith("matplotlib."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(output.MissingDependencyError) as info:
        output.write_gantt(make_result(), tmp_path / "g.png")
    assert str(info.value) == "write_gantt needs matplotlib: pip install 'pipecore[plot]'"
    assert isinstance(info.value, ImportError)
    assert not (tmp_path / "g.png").exists()


# ---------------------------------------------------------------------------
# Parquet
# ---------------------------------------------------------------------------


def test_parquet_round_trip(tmp_path):
    result = make_result()
    out = output.write_parquet(result, str(tmp_path / "ops.parquet"))
    assert isinstance(out, Path)
    back = pq.read_table(out)
    assert back.equals(result.ops)
    assert back.schema.field("kind").type == KIND_TYPE


def test_parquet_empty_ops(tmp_path):
    result = make_result(ops_rows=[])
    back = pq.read_table(output.write_parquet(result, tmp_path / "ops.parquet"))
    assert back.num_rows == 0
    assert back.schema.equals(result.ops.schema)

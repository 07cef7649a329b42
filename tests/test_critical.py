"""The critical path (pipecore.critical): a contiguous chain of real
dependencies from time 0 to the makespan, on random schedules and costs,
plus hand-derived paths."""

import dataclasses
import math

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipecore as pc
from pipecore.analysis.critical import critical_path, device_share
from pipecore.testing import costs, family_schedules, networks, schedules

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def unit_of(res):
    """Per op row, the index of its unit (an op, or an overlapped F&B pair) in
    the whole table: units of one device are consecutive, in program order."""
    paired = np.asarray(res._c.paired, dtype=bool)
    return np.cumsum(~paired) - 1


def check_path(res):
    """Assert the path's contract from the result's own tables; return the path."""
    path = critical_path(res)
    seg = path.to_pydict()
    k = path.num_rows
    assert k >= 1
    ops = res.ops.to_pydict()
    tr = res.transfers.to_pydict()
    x_src, x_dst = res._c.x_src, res._c.x_dst
    unit = unit_of(res)
    dev = ops["device"]

    # Ends: 0 to the makespan, the last element an op finishing last.
    assert seg["start"][0] == 0.0
    assert seg["finish"][-1] == res.makespan
    assert seg["element"][-1] == "op"
    # Contiguous, exactly; durations are finish - start and add up to the makespan.
    for i in range(1, k):
        assert seg["start"][i] == seg["finish"][i - 1], (i, seg)
    for i in range(k):
        assert seg["duration"][i] == seg["finish"][i] - seg["start"][i]
        assert seg["duration"][i] >= 0.0
    total = math.fsum(seg["duration"])
    assert total == pytest.approx(res.makespan, rel=1e-9, abs=1e-12)

    # Every segment is what the result says of its op or transfer.
    for i in range(k):
        r = seg["row"][i]
        if seg["element"][i] == "op":
            assert (seg["start"][i], seg["finish"][i]) == (ops["start"][r], ops["finish"][r])
            assert seg["duration"][i] == ops["finish"][r] - ops["start"][r]
            assert seg["device"][i] == dev[r] and seg["dst_device"][i] is None
            assert (seg["kind"][i], seg["stage"][i]) == (ops["kind"][r], ops["stage"][r])
            q = seg["partner"][i]
            assert q == -1 or (unit[q] == unit[r] and q != r)
        else:
            assert (seg["device"][i], seg["dst_device"][i]) == (tr["src_device"][r], tr["dst_device"][r])
            assert seg["kind"][i] == tr["kind"][r] and seg["stage"][i] == tr["stage"][r]
            if seg["element"][i] == "transfer":
                assert (seg["start"][i], seg["finish"][i]) == (tr["start"][r], tr["finish"][r])
            else:
                assert seg["element"][i] == "latency"
                assert (seg["start"][i], seg["finish"][i]) == (tr["finish"][r], tr["arrival"][r])
                assert seg["duration"][i] > 0.0

    # Consecutive segments are real dependencies (so, being contiguous, the
    # earlier one binds the later one's start).
    host = tr["src_device"]
    for i in range(1, k):
        a, b = seg["element"][i - 1], seg["element"][i]
        ra, rb = seg["row"][i - 1], seg["row"][i]
        if a == "op" and b == "op":  # the next unit on the same device
            assert dev[ra] == dev[rb] and unit[rb] == unit[ra] + 1
        elif a == "op" and b == "transfer":  # the unit sends it
            assert unit[x_src[rb]] == unit[ra] and x_src[rb] == ra
        elif a == "transfer" and b == "latency":
            assert ra == rb
        elif b == "op":  # landed: the unit consumes it
            assert unit[x_dst[ra]] == unit[rb]
            if a == "transfer":
                assert tr["arrival"][ra] == tr["finish"][ra]
        elif b == "transfer":
            after = (tr["kind"][ra], tr["kind"][rb]) == ("O", "L") and \
                x_dst[ra] == x_src[rb]  # the copy back waits for its copy to host
            same_link = (tr["src_device"][ra], tr["dst_device"][ra]) == \
                (tr["src_device"][rb], tr["dst_device"][rb])
            shared_host = (host[ra] == tr["dst_device"][ra] and host[rb] == tr["dst_device"][rb]
                           and tr["kind"][ra] == tr["kind"][rb] and res.costs.host_link_devices > 1
                           and host[ra] // res.costs.host_link_devices
                           == host[rb] // res.costs.host_link_devices)
            queued = a == "transfer" and (same_link or shared_host) and ra != rb
            assert after or queued, (i, seg)
        else:
            raise AssertionError(f"segment {i}: {a} then {b}")

    share = device_share(res)
    assert math.fsum(share.column("total").to_pylist()) == pytest.approx(res.makespan, rel=1e-9,
                                                                         abs=1e-12)
    return path


def with_host_sharing(data, c, sched):
    """Sometimes put devices on shared host links (only matters with O/L)."""
    n = data.draw(st.sampled_from([1, 1, 2, 3]))
    return dataclasses.replace(c, host_link_devices=n) if n <= max(sched.devices, 1) else c


@SETTINGS
@given(data=st.data(), sched=schedules())
def test_path_random_schedules(data, sched):
    c = with_host_sharing(data, data.draw(costs(stages=sched.stages)), sched)
    net = data.draw(networks(devices=sched.devices))
    check_path(pc.simulate(sched, c, net))


@SETTINGS
@given(data=st.data(), sched=family_schedules(recompute=True))
def test_path_families(data, sched):
    c = data.draw(costs(stages=sched.stages))
    net = data.draw(networks(devices=sched.devices))
    check_path(pc.simulate(sched, c, net))


def rows_of(path):
    d = path.to_pydict()
    return [(d["element"][i], d["device"][i], d["kind"][i], d["stage"][i], d["microbatch"][i],
             d["start"][i], d["finish"][i]) for i in range(path.num_rows)]


def test_gpipe_two_devices_latency():
    # GPipe p=2 m=2, f=1, BW=b=2, comm latency 0.5, no serialisation:
    # d0: F0 [0,1] F1 [1,2] ........ BW0 [6,8] BW1 [8,10]
    # d1:   F0 [1.5,2.5] F1 [2.5,3.5] BW0 [3.5,5.5] BW1 [5.5,7.5]
    # (d1's F1 arrives at 2.5, when d1 frees up; BW0's gradient lands at 6.)
    # Back from d0 BW1 (ends at 10): it starts at 8, where d0's BW0 ends and
    # its gradient (7.5 + 0.5) lands; the device wins the tie. BW0 waits for
    # the gradient of d1's BW0 (5.5 + 0.5 = 6), which follows d1's F1 and F0
    # back-to-back, and d1's F0 waits for d0's F0 (1 + 0.5).
    res = pc.simulate(pc.build("gpipe", 2, 2), pc.Costs(f=1.0, b=2.0, w=0.0, comm=0.5))
    path = check_path(res)
    assert rows_of(path) == [
        ("op", 0, "F", 0, 0, 0.0, 1.0),
        ("transfer", 0, "F", 0, 0, 1.0, 1.0),
        ("latency", 0, "F", 0, 0, 1.0, 1.5),
        ("op", 1, "F", 1, 0, 1.5, 2.5),
        ("op", 1, "F", 1, 1, 2.5, 3.5),
        ("op", 1, "BW", 1, 0, 3.5, 5.5),
        ("transfer", 1, "BW", 1, 0, 5.5, 5.5),
        ("latency", 1, "BW", 1, 0, 5.5, 6.0),
        ("op", 0, "BW", 0, 0, 6.0, 8.0),
        ("op", 0, "BW", 0, 1, 8.0, 10.0),
    ]
    assert path.column("dst_device").to_pylist() == [None, 1, 1, None, None, None, 0, 0, None, None]
    assert path.schema.names == ["element", "device", "dst_device", "kind", "stage", "microbatch",
                                 "row", "partner", "start", "finish", "duration"]
    assert [path.schema.field(c).type for c in ("device", "row", "duration")] == \
        [pa.int32(), pa.int64(), pa.float64()]
    share = device_share(path).to_pydict()
    assert share["compute"] == [5.0, 4.0]
    assert share["latency"] == [0.5, 0.5]
    assert share["transfer"] == [0.0, 0.0]
    assert share["total"] == [5.5, 4.5]
    assert share["share"] == [0.55, 0.45]


def test_contended_link_queueing():
    # GPipe p=2 m=3, f=1, b=w=0; every transfer holds its link 4/2 = 2 and
    # then flies 0.5. d0's forwards end at 1, 2, 3 but its link to d1 serves
    # them at [1,3], [3,5], [5,7] (arrivals 3.5, 5.5, 7.5); d1 runs F0 [3.5,4.5],
    # F1 [5.5,6.5], F2 [7.5,8.5] and its three zero-time BWs at 8.5, whose
    # gradients queue on d1->d0 at [8.5,10.5], [10.5,12.5], [12.5,14.5]
    # (arrivals 11, 13, 15). d0's BW of microbatch 2 ends last, at 15.
    # Back from it: gradient 2's flight [14.5,15], its link time [12.5,14.5]
    # queued behind gradient 1 [10.5,12.5], behind gradient 0 [8.5,10.5],
    # sent as d1's BW0 ends (8.5), which follows d1's F2 [7.5,8.5] on the
    # device; F2 waits for forward 2's flight [7, 7.5] after its link time
    # [5,7], queued behind forward 1 [3,5] and forward 0 [1,3], sent as d0's
    # F0 [0,1] ends.
    res = pc.simulate(pc.build("gpipe", 2, 3), pc.Costs(f=1.0, b=0.0, w=0.0),
                      pc.Network.uniform(4.0, 2.0, 0.5))
    path = check_path(res)
    assert rows_of(path) == [
        ("op", 0, "F", 0, 0, 0.0, 1.0),
        ("transfer", 0, "F", 0, 0, 1.0, 3.0),
        ("transfer", 0, "F", 0, 1, 3.0, 5.0),
        ("transfer", 0, "F", 0, 2, 5.0, 7.0),
        ("latency", 0, "F", 0, 2, 7.0, 7.5),
        ("op", 1, "F", 1, 2, 7.5, 8.5),
        ("op", 1, "BW", 1, 0, 8.5, 8.5),
        ("transfer", 1, "BW", 1, 0, 8.5, 10.5),
        ("transfer", 1, "BW", 1, 1, 10.5, 12.5),
        ("transfer", 1, "BW", 1, 2, 12.5, 14.5),
        ("latency", 1, "BW", 1, 2, 14.5, 15.0),
        ("op", 0, "BW", 0, 2, 15.0, 15.0),
    ]
    share = device_share(res).to_pydict()
    assert share["compute"] == [1.0, 1.0]
    assert share["transfer"] == [6.0, 6.0]
    assert share["latency"] == [0.5, 0.5]


def test_offload_copy_back_waits_for_copy_to_host():
    # One device: F0 [0,1], O0 at 1 issues the copy to host [1,4]; F1 [1,2];
    # L0 at 2 issues the copy back, which waits for the copy to host: [4,7];
    # BW0 waits for it: [7,8]; BW1 [8,9]. Back from BW1: BW0 (device), the
    # copy back (BW0's input), the copy to host (what the copy back waited
    # for), the O that issued it (its ready time), F0 (device).
    sched = pc.from_actions({0: ["0F0", "0O0", "0F1", "0L0", "0BW0", "0BW1"]})
    res = pc.simulate(sched, pc.Costs(f=1.0, b=1.0, w=0.0, offload=3.0))
    path = check_path(res)
    assert rows_of(path) == [
        ("op", 0, "F", 0, 0, 0.0, 1.0),
        ("op", 0, "O", 0, 0, 1.0, 1.0),
        ("transfer", 0, "O", 0, 0, 1.0, 4.0),
        ("transfer", 0, "L", 0, 0, 4.0, 7.0),
        ("op", 0, "BW", 0, 0, 7.0, 8.0),
        ("op", 0, "BW", 0, 1, 8.0, 9.0),
    ]
    assert path.column("dst_device").to_pylist()[2:4] == [0, 0]


def test_shared_host_link_queues_copies_of_two_devices():
    # Stage 0 on d0, stage 1 on d1, one microbatch, each offloaded (O, L right
    # after F); f=b=1, offload=2, no comm; both devices share one host link per
    # direction, served in issue order.
    # To host: d0's copy (issued 1) [1,3], d1's (issued 2, after d1's F [1,2])
    # waits for the link: [3,5]. Back: d0's copy back waits for its copy to
    # host: [3,5]; d1's waits for its own copy to host (5) and the link (5),
    # tie won by the copy to host: [5,7]. d1's BW [7,8]; its gradient lands
    # at 8; d0's BW [8,9] ends last.
    # Back from d0's BW: the gradient (8, not its copy back at 5), d1's BW,
    # d1's copy back, d1's copy to host, queued behind d0's copy to host,
    # issued by d0's O at 1, after d0's F.
    sched = pc.from_actions({0: ["0F0", "0O0", "0L0", "0BW0"], 1: ["1F0", "1O0", "1L0", "1BW0"]})
    res = pc.simulate(sched, pc.Costs(f=1.0, b=1.0, w=0.0, offload=2.0, host_link_devices=2))
    path = check_path(res)
    assert rows_of(path) == [
        ("op", 0, "F", 0, 0, 0.0, 1.0),
        ("op", 0, "O", 0, 0, 1.0, 1.0),
        ("transfer", 0, "O", 0, 0, 1.0, 3.0),
        ("transfer", 1, "O", 1, 0, 3.0, 5.0),
        ("transfer", 1, "L", 1, 0, 5.0, 7.0),
        ("op", 1, "BW", 1, 0, 7.0, 8.0),
        ("transfer", 1, "BW", 1, 0, 8.0, 8.0),
        ("op", 0, "BW", 0, 0, 8.0, 9.0),
    ]
    share = device_share(path)
    assert share.schema.field("latency").type == pa.float64()
    assert share.to_pydict()["compute"] == [2.0, 1.0]
    assert share.to_pydict()["transfer"] == [2.0, 4.0]
    assert share.to_pydict()["latency"] == [0.0, 0.0]


def test_overlapped_pair_is_one_segment():
    # d0: F0, then F1 overlapped with BW0 (one unit), then BW1; d1: stage 1.
    # f=1, b=2, fb_factor 0.5, no comm. d0 F0 [0,1]; d1 F(1,0) [1,2], BW(1,0)
    # [2,4]; d0's unit waits for that gradient: [4, 4 + (1+2)*0.5 = 5.5];
    # d1 F(1,1) waits for the unit's F: [5.5,6.5], BW(1,1) [6.5,8.5]; d0 BW1
    # [8.5,10.5]. The path enters the unit through its BW's input and leaves
    # through its F's output, so the segment is the F row with the BW as partner.
    sched = pc.from_actions({0: ["0F0", "0F1&0BW0", "0BW1"],
                             1: ["1F0", "1BW0", "1F1", "1BW1"]})
    res = pc.simulate(sched, pc.Costs(f=1.0, b=2.0, w=0.0, fb_factor=0.5))
    path = check_path(res)
    assert rows_of(path) == [
        ("op", 0, "F", 0, 0, 0.0, 1.0),
        ("transfer", 0, "F", 0, 0, 1.0, 1.0),
        ("op", 1, "F", 1, 0, 1.0, 2.0),
        ("op", 1, "BW", 1, 0, 2.0, 4.0),
        ("transfer", 1, "BW", 1, 0, 4.0, 4.0),
        ("op", 0, "F", 0, 1, 4.0, 5.5),
        ("transfer", 0, "F", 0, 1, 5.5, 5.5),
        ("op", 1, "F", 1, 1, 5.5, 6.5),
        ("op", 1, "BW", 1, 1, 6.5, 8.5),
        ("transfer", 1, "BW", 1, 1, 8.5, 8.5),
        ("op", 0, "BW", 0, 1, 8.5, 10.5),
    ]
    # Rows by (device, slot, kind): d0 is F0 0, F1 1, BW0 2 (paired), BW1 3.
    assert path.column("row").to_pylist()[5] == 1
    assert path.column("partner").to_pylist() == [-1] * 5 + [2] + [-1] * 5


def test_zero_costs_path_is_one_op():
    res = pc.simulate(pc.build("1f1b", 3, 4), pc.Costs(f=0.0, b=0.0, w=0.0))
    path = check_path(res)
    assert path.num_rows == 1 and path.column("row").to_pylist() == [0]
    assert device_share(path, devices=3).column("share").to_pylist() == [0.0, 0.0, 0.0]


def test_errors():
    with pytest.raises(ValueError, match="'result' must be a pipecore simulation Result"):
        critical_path(object())
    res = pc.simulate(pc.build("gpipe", 2, 2), pc.Costs(f=1.0, b=2.0, comm=0.5))
    with pytest.raises(ValueError, match="lacks column"):
        device_share(pa.table({"device": [0]}))
    with pytest.raises(ValueError, match="outside 0..0"):
        device_share(critical_path(res), devices=1)
    with pytest.raises(ValueError, match="'devices' must be an int"):
        device_share(critical_path(res), devices=-1)
    bad = critical_path(res).set_column(0, "element", pa.array(["op", "hop"] + ["op"] * 8))
    with pytest.raises(ValueError, match="unknown element"):
        device_share(bad)
    res.start = res.start.copy()
    res.start[3] = 8.25  # d0's BW1 (last to end): neither d0's BW0 (8) nor its gradient (8)
    with pytest.raises(RuntimeError, match="inconsistent"):
        critical_path(res)


def test_trace_marks_the_path(tmp_path):
    import json

    from pipecore.output import write_chrome_trace

    # The contended GPipe case above: ops d0 F0 (row 0), d1 F2 (8), d1 BW0 (9),
    # d0 BW2 (5); transfers 0, 1, 2 (forwards) and 3, 4, 5 (gradients).
    res = pc.simulate(pc.build("gpipe", 2, 3), pc.Costs(f=1.0, b=0.0, w=0.0),
                      pc.Network.uniform(4.0, 2.0, 0.5))
    plain = json.loads(write_chrome_trace(res, tmp_path / "a.json").read_text())["traceEvents"]
    assert not any("critical" in e.get("args", {}) for e in plain)
    assert {e["pid"] for e in plain} == {0, 1}
    events = json.loads(write_chrome_trace(res, tmp_path / "b.json", critical=True)
                        .read_text())["traceEvents"]
    marked_ops = sorted((e["tid"], e["name"]) for e in events
                        if e["pid"] == 0 and e.get("args", {}).get("critical"))
    assert marked_ops == [(0, "BW s0 mb2"), (0, "F s0 mb0"), (1, "BW s1 mb0"), (1, "F s1 mb2")]
    marked_links = [e["name"] for e in events if e["pid"] == 1 and e.get("args", {}).get("critical")]
    assert sorted(marked_links) == ["BW s1 mb0", "BW s1 mb1", "BW s1 mb2",
                                    "F s0 mb0", "F s0 mb1", "F s0 mb2"]
    track = [e for e in events if e["pid"] == 2 and e["ph"] == "X"]
    assert [(e["ts"], e["ts"] + e["dur"]) for e in track] == [
        (0.0, 1.0), (1.0, 3.0), (3.0, 5.0), (5.0, 7.0), (7.0, 7.5), (7.5, 8.5), (8.5, 8.5),
        (8.5, 10.5), (10.5, 12.5), (12.5, 14.5), (14.5, 15.0), (15.0, 15.0)]
    assert track[1]["name"] == "transfer F s0 mb0 (d0->d1)"


def test_gantt_critical(tmp_path):
    pytest.importorskip("matplotlib", reason="Gantt charts need the plot extra: pip install pipecore[plot]")
    from pipecore.output import write_gantt

    res = pc.simulate(pc.from_actions({0: ["0F0", "0F1&0BW0", "0BW1"],
                                       1: ["1F0", "1BW0", "1F1", "1BW1"]}),
                      pc.Costs(f=1.0, b=2.0, w=0.0, fb_factor=0.5))
    a = write_gantt(res, tmp_path / "a.png").read_bytes()
    b = write_gantt(res, tmp_path / "b.png", critical=True, show_transfers=True).read_bytes()
    assert b[:4] == b"\x89PNG" and a != b


def test_outputs_refuse_critical_without_a_result(tmp_path):
    from pipecore.output import write_chrome_trace, write_gantt

    res = pc.simulate(pc.build("gpipe", 2, 2), pc.Costs(f=1.0, b=2.0))

    class Tables:  # the tables a writer needs, but not a simulation
        ops, transfers, memory, makespan, devices, name = (res.ops, res.transfers, res.memory,
                                                           res.makespan, res.devices, "x")

    write_chrome_trace(Tables(), tmp_path / "ok.json")  # fine without critical
    with pytest.raises(ValueError, match="simulation Result"):
        write_chrome_trace(Tables(), tmp_path / "t.json", critical=True)
    with pytest.raises(ValueError, match="simulation Result"):
        write_gantt(Tables(), tmp_path / "g.png", critical=True)


def test_cli_critical(tmp_path):
    import io
    import json

    from pipecore.cli import main

    out = io.StringIO()
    code = main(["simulate", "gpipe", "-p", "2", "-m", "2", "--f", "1", "--b", "2", "--w", "0",
                 "--comm", "0.5", "--critical"], out=out)
    text = out.getvalue()
    assert code == 0
    # The hand-derived GPipe path above: d0 computes 5 and its forward flies
    # 0.5 (55%); d1 computes 4 and its gradient flies 0.5 (45%).
    lines = [line.split() for line in text.splitlines()]
    assert "critical path 10 segments, from 0 to 10".split() in lines
    assert ["d0", "5", "0", "0.5", "5.5", "55.0%"] in lines
    assert ["d1", "4", "0", "0.5", "4.5", "45.0%"] in lines
    assert ["5.5", "6", "latency", "d1->d0", "s1", "BW0"] in lines
    out = io.StringIO()
    trace = tmp_path / "t.json"
    assert main(["simulate", "gpipe", "-p", "2", "-m", "2", "--comm", "0.5", "--critical",
                 "--json", "--trace", str(trace)], out=out) == 0
    data = json.loads(out.getvalue())
    assert [s["element"] for s in data["critical_path"]["segments"]] == [
        "op", "transfer", "latency", "op", "op", "op", "transfer", "latency", "op", "op"]
    assert [r["total"] for r in data["critical_path"]["device_share"]] == [5.5, 4.5]
    assert any(e["pid"] == 2 for e in json.loads(trace.read_text())["traceEvents"])


"""pt.from_profile on hand-built Kineto traces whose true costs are set here.

The synthetic trace of a schedule is written from a pipecore simulation with
known costs the way torch 2.13's runtime lays out a rank's actions: each
action is a ``PP:<stage><type><mb>`` label; between actions the runtime
spends the per-op overhead (a gap); inside a compute label it first waits
for its input (no operator) and then runs operators for the compute time.
"""

import io
import json

import numpy as np
import pytest
from wrapped import flat

import pipecore as pc

pytest.importorskip("torch", reason="needs torch: pip install 'pipecore[torch]'")
from pipecore.bindings import torch as pt  # noqa: E402

from pipecore.cli import main  # noqa: E402

TORCH_TYPE = {"F": "F", "B": "I", "W": "W", "BW": "B"}
US = 1e6  # trace times are microseconds


def write_traces(folder, sched, costs, steps=3, sends=((4096, 50.0), (16384, 110.0)),
                 world_size=True, stragglers=None):
    """One rankN.json per device: ``steps`` identical steps of the simulated schedule."""
    res = pc.simulate(sched, costs, stragglers=stragglers)
    ops = res.ops.to_pydict()
    o = float(costs.overhead)
    span = res.makespan
    folder.mkdir(parents=True, exist_ok=True)
    for d in range(sched.devices):
        events = []
        rows = [i for i in range(len(ops["device"])) if ops["device"][i] == d]
        rows.sort(key=lambda i: ops["start"][i])
        end = max(ops["finish"][i] for i in rows)  # a rank's step() returns after its last action
        for k in range(steps):
            t0 = k * (span + 1.0)
            events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k + 1}",
                           "ts": t0 * US, "dur": end * US, "pid": 1, "tid": 1})
            prev = 0.0
            units = {}
            for i in rows:  # an overlapped F&B pair shares one slot: one torch action
                units.setdefault(ops["slot"][i], []).append(i)
            for slot in sorted(units):
                unit = units[slot]
                i = unit[0]
                label = ";".join(f"{ops['stage'][j]}{TORCH_TYPE[ops['kind'][j]]}"
                                 f"{ops['microbatch'][j]}" for j in unit)
                label = f"({label})OVERLAP_F_B" if len(unit) == 2 else label
                a = prev + o  # the runtime's own time between actions
                c0 = ops["start"][i] + o  # after the wait for the input
                e = ops["finish"][i]
                events.append({"ph": "X", "cat": "user_annotation", "name": f"PP:{label}",
                               "ts": (t0 + a) * US, "dur": (e - a) * US, "pid": 1, "tid": 1})
                events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm",
                               "ts": (t0 + c0) * US, "dur": (e - c0) * US, "pid": 1, "tid": 1})
                prev = e
        for j, (nbytes, dur) in enumerate(sends):
            events.append({"ph": "X", "cat": "cpu_op", "name": "c10d::send",
                           "ts": (steps * (span + 1.0) + j) * US, "dur": dur, "pid": 1, "tid": 1,
                           "args": {"Input Dims": [[[nbytes // 4]], [], [], []],
                                    "Input type": ["ScalarList", "Int", "Int", "Int"]}})
        trace = {"schemaVersion": 1, "traceEvents": events}
        if world_size:
            trace["distributedInfo"] = {"backend": "gloo", "rank": d,
                                        "world_size": sched.devices}
        (folder / f"rank{d}.json").write_text(json.dumps(trace))
    return res


@pytest.mark.parametrize("name,p,m", [("gpipe", 2, 4), ("1f1b", 4, 8), ("zb-h1", 2, 6)])
def test_fit_recovers_true_costs(tmp_path, name, p, m):
    sched = pc.build(name, p, m)
    f = np.array([1.0, 1.5, 0.75, 1.25][:p])
    b = np.array([1.0, 1.25, 1.0, 0.5][:p])
    w = np.array([0.5, 0.75, 0.25, 0.5][:p])
    bw = np.array([1.25, 1.75, 1.0, 0.75][:p])
    true = pc.Costs(f=f, b=b, w=w, bw=bw, overhead=0.125)
    res = write_traces(tmp_path, sched, true, sends=())  # no send ops: free links
    prof = pt.from_profile(tmp_path)
    assert (prof.ranks, prof.stages, prof.microbatches) == (p, p, m)
    np.testing.assert_allclose(prof.costs.f, f, rtol=1e-9)
    if name == "zb-h1":
        np.testing.assert_allclose(prof.costs.b, b, rtol=1e-9)
        np.testing.assert_allclose(prof.costs.w, w, rtol=1e-9)
    else:
        np.testing.assert_allclose(prof.costs.bw, bw, rtol=1e-9)
    # Most ops do not wait in these schedules, so the low quantile of the lead-in is 0.
    assert prof.costs.overhead == pytest.approx(0.125, rel=1e-9)
    assert prof.schedule.to_actions() == sched.to_actions()
    assert prof.step_times == pytest.approx([res.makespan] * 3, rel=1e-9)
    # Simulating the profiled schedule with the fitted costs gives back the trace's step.
    assert prof.predict(prof.schedule).makespan == pytest.approx(res.makespan, rel=1e-9)


def test_costs_are_mean_op_times(tmp_path):
    """Hand-worked: one of stage 0's four forwards takes 3 s, the others 1 s. A device's
    busy time is the sum of its ops, so the cost is their mean, 1.5 s (the median is 1)."""
    sched = pc.build("gpipe", 2, 4)
    t = sched.table.to_pydict()
    slow = [i for i in range(sched.num_ops)
            if (t["stage"][i], t["kind"][i], t["microbatch"][i]) == (0, "F", 3)]
    fac = np.ones(sched.num_ops)
    fac[slow] = 3.0
    true = pc.Costs(f=1.0, b=1.0, w=1.0)
    res = write_traces(tmp_path, sched, true, sends=(), stragglers=fac)
    prof = pt.from_profile(tmp_path)
    np.testing.assert_allclose(prof.costs.f, [1.5, 1.0], rtol=1e-9)
    np.testing.assert_allclose(prof.costs.bw, [2.0, 2.0], rtol=1e-9)
    # By hand: rank 0's forwards end at 1, 2, 3, 6; rank 1's F3 runs [6, 7], its four BW
    # [7, 15]; rank 0's last BW ends at 17. The mean costs predict F0..F3 on rank 0 ending at
    # 6 too (4 x 1.5), so the same 17; medians (1 s) would predict 15.
    assert res.makespan == 17.0
    assert prof.predict(sched).makespan == pytest.approx(17.0, rel=1e-9)


def test_network_fit_from_send_sizes(tmp_path):
    # Two sizes: 4096 B in 50 us, 16384 B in 110 us -> 30 us + bytes / (204.8e6 B/s).
    write_traces(tmp_path, pc.build("1f1b", 2, 2), pc.Costs())
    net = pt.from_profile(tmp_path).network
    assert net.latency == pytest.approx(30e-6, rel=1e-6)
    assert net.bandwidth == pytest.approx(12288 / 60e-6, rel=1e-6)


def test_predict_other_family_uses_resampled_stages(tmp_path):
    write_traces(tmp_path, pc.build("1f1b", 2, 4), pc.Costs(f=[1.0, 3.0], b=1.0, w=1.0))
    prof = pt.from_profile(tmp_path)
    c4 = prof.costs_for(4)  # stage 0's forward work (1.0) splits over two halves
    np.testing.assert_allclose(c4.f, [0.5, 0.5, 1.5, 1.5])
    assert (c4.overhead, c4.fb_factor) == (prof.costs.overhead, prof.costs.fb_factor)
    assert prof.predict("interleaved-1f1b").makespan > 0


def test_labels_removed(tmp_path):
    write_traces(tmp_path, pc.build("1f1b", 2, 2), pc.Costs())
    path = tmp_path / "rank1.json"
    path.write_text(path.read_text().replace('"PP:', '"step:'))
    with pytest.raises(ValueError, match=r"rank1\.json \(rank 1\) has no pipelining labels"):
        pt.from_profile(tmp_path)


def test_truncated_file(tmp_path):
    write_traces(tmp_path, pc.build("1f1b", 2, 2), pc.Costs())
    path = tmp_path / "rank0.json"
    text = path.read_text()
    path.write_text(text[: len(text) // 2])
    with pytest.raises(ValueError, match=r"rank0\.json is not a complete JSON trace"):
        pt.from_profile(tmp_path)


@pytest.mark.parametrize("world_size", [True, False])
def test_missing_rank(tmp_path, world_size):
    write_traces(tmp_path, pc.build("1f1b", 4, 4), pc.Costs(), world_size=world_size)
    (tmp_path / "rank2.json").unlink()
    with pytest.raises(ValueError, match=r"no trace for rank\(s\) \[2\] \(the run has 4 ranks"):
        pt.from_profile(tmp_path)


def test_last_rank_missing_is_caught_by_world_size(tmp_path):
    write_traces(tmp_path, pc.build("1f1b", 2, 2), pc.Costs())
    (tmp_path / "rank1.json").unlink()
    with pytest.raises(ValueError, match=r"no trace for rank\(s\) \[1\]"):
        pt.from_profile(tmp_path)


def test_empty_folder_and_missing_path(tmp_path):
    with pytest.raises(ValueError, match=r"no trace files"):
        pt.from_profile(tmp_path)
    with pytest.raises(ValueError, match=r"does not exist"):
        pt.from_profile(tmp_path / "nope")


def test_overlapped_pairs_fit_fb_factor(tmp_path):
    # DualPipeV's F&B units appear as one PP:(..;..)OVERLAP_F_B action each.
    sched = pc.build("dualpipev", 2, 8)
    true = pc.Costs(f=[1.0, 1.25, 0.75, 1.0], b=1.0, w=0.5, bw=1.25, fb_factor=0.75,
                    overhead=0.125)
    res = write_traces(tmp_path, sched, true, sends=())
    prof = pt.from_profile(tmp_path)
    assert prof.costs.fb_factor == pytest.approx(0.75, rel=1e-9)
    np.testing.assert_allclose(prof.costs.f, [1.0, 1.25, 0.75, 1.0], rtol=1e-9)
    assert prof.schedule.to_actions() == sched.to_actions()
    assert prof.predict(prof.schedule).makespan == pytest.approx(res.makespan, rel=1e-9)


def test_pair_members_take_the_run_files_mean_over_every_call(tmp_path):
    """A kind that also runs inside overlapped pairs has few calls of its own in the traces
    (stage 1's fused backward: one, 1BW6, per step); the run file's unprofiled mean covers
    every call, pairs included, and is taken instead. Hand-made: the traces say 0.625 (a
    scalar bw of 1.25 is per device, halved per stage on two chunks), the run file 2.5 over
    every call (profiled and unprofiled alike, so no dilation)."""
    sched = pc.build("dualpipev", 2, 8)
    true = pc.Costs(f=[1.0, 1.25, 0.75, 1.0], b=1.0, w=0.5, bw=1.25, fb_factor=0.75,
                    overhead=0.125)
    write_traces(tmp_path, sched, true, sends=())
    assert pt.from_profile(tmp_path).costs.bw[1] == pytest.approx(0.625, rel=1e-9)
    seconds = {"1,BW": {"profiled": 2.5, "reference": 2.5}}
    (tmp_path / "pipecore-run.json").write_text(json.dumps({
        "ranks": 2, "steps": 7, "profiled_steps": [2, 3, 4], "reference_steps": [1, 5, 6],
        "step_times": [1.0] * 7, "op_seconds": seconds}))
    prof = pt.from_profile(tmp_path)
    assert prof.costs.bw[1] == 2.5
    # Stages without a run-file entry keep the traces' times; the pairs' factor stays.
    np.testing.assert_allclose(prof.costs.bw[[0, 2, 3]], [0.625] * 3, rtol=1e-9)
    assert prof.costs.fb_factor == pytest.approx(0.75, rel=1e-9)


def test_what_if_ranks_families(tmp_path):
    import io

    from pipecore.cli import main

    sched = pc.build("1f1b", 2, 4)
    write_traces(tmp_path, sched, pc.Costs(f=1.0, b=1.0, w=1.0, bw=2.0), sends=())
    rows = pt.what_if(tmp_path)
    preds = [r["predicted"] for r in rows]
    assert preds == sorted(preds)
    names = [r["schedule"] for r in rows]
    assert "dualpipe" not in names and "chimera" not in names  # replicated stages: torch cannot
    one = next(r for r in rows if r["schedule"] == "1f1b")
    assert one["profiled"] and one["predicted"] == pytest.approx((4 + 2 - 1) * 3.0)
    out = io.StringIO()
    assert main(["what-if", str(tmp_path), "--schedules", "all"], out=out) == 0
    text = out.getvalue()
    assert "1f1b *" in text and "zb-v" in text
    out = io.StringIO()
    assert main(["what-if", str(tmp_path), "--schedules", "gpipe,zb-h1", "--json"], out=out) == 0
    assert {r["schedule"] for r in json.loads(out.getvalue())["rows"]} == {"gpipe", "zb-h1"}


def test_what_if_lists_every_family_it_left_out(tmp_path):
    write_traces(tmp_path, pc.build("1f1b", 2, 4), pc.Costs(f=1.0, b=1.0, w=1.0, bw=2.0),
                 sends=())
    ranking = pt.what_if(tmp_path)
    left = {r["schedule"]: r["reason"] for r in ranking.left_out}
    # Replicated stages (stage 0 on both ranks; HelixPipe's attention stages): torch runs every
    # stage on one rank.
    assert set(left) == {"bitpipe", "chimera", "dualpipe", "helixpipe"}
    assert all("on ranks 0, 1" in why and "exactly one rank" in why for why in left.values())
    # Nothing asked for is dropped in silence: ranked or left out with a reason.
    assert {r["schedule"] for r in ranking} | set(left) == set(pc.schedules())
    # At m=3 chimera and bitpipe need m a multiple of p, dualpipe an even m.
    odd = {r["schedule"]: r["reason"] for r in pt.what_if(tmp_path, microbatches=3).left_out}
    assert {"chimera", "bitpipe", "dualpipe"} <= set(odd)
    assert odd["chimera"].startswith("does not build 2 ranks x 3 microbatches: ")
    assert "multiple of devices" in odd["chimera"]
    out = io.StringIO()
    assert main(["what-if", str(tmp_path)], out=out) == 0
    text = out.getvalue()
    assert "left out (4):" in text and "  chimera " in text
    out = io.StringIO()
    assert main(["what-if", str(tmp_path), "--json"], out=out) == 0
    data = json.loads(out.getvalue())
    assert {r["schedule"] for r in data["left_out"]} == {"bitpipe", "chimera", "dualpipe", "helixpipe"}


def test_what_if_sets_the_profiled_prediction_beside_its_measurement(tmp_path):
    import dataclasses

    write_traces(tmp_path, pc.build("1f1b", 2, 4), pc.Costs(f=1.0, b=1.0, w=1.0, bw=2.0),
                 sends=())
    prof = pt.from_profile(tmp_path)
    # 1F1B's step by hand: (m + p - 1) * (f + bw) = 5 * 3 = 15; say the run measured 30.
    slow = dataclasses.replace(prof, measured=30.0)
    own = pt.what_if(slow, ["gpipe"]).profiled  # the profiled schedule even when not ranked
    assert own["schedule"] == "profiled"
    assert own["predicted"] == pytest.approx(15.0) and own["measured"] == 30.0
    assert own["error"] == pytest.approx(-0.5)
    ranking = pt.what_if(slow)
    assert ranking.profiled["schedule"] == "1f1b"
    text = pt.format_what_if(ranking)
    assert ("profiled schedule (1f1b, 4 microbatches): predicted 15000.00 ms, measured "
            "30000.00 ms (median of 3 profiled steps): prediction -50.0% (50.0% low)") in flat(text)
    fast = pt.format_what_if(pt.what_if(dataclasses.replace(prof, measured=12.0)))
    assert "prediction +25.0% (25.0% high)" in fast
    # From the command line: the traces' own step, which the fit reproduces.
    out = io.StringIO()
    assert main(["what-if", str(tmp_path), "--json"], out=out) == 0
    data = json.loads(out.getvalue())["profiled"]
    assert data["predicted"] == pytest.approx(15.0) and data["measured"] == pytest.approx(15.0)
    out = io.StringIO()
    assert main(["what-if", str(tmp_path)], out=out) == 0
    assert "prediction within 0.1% of the measurement" in flat(out.getvalue())


def _dilated(costs, factor):
    """Costs with each kind's times multiplied by ``factor[kind]`` (what a profiler adds)."""
    return pc.Costs(**{k: np.asarray(getattr(costs, k)) * factor[k] for k in ("f", "b", "w", "bw")},
                    overhead=costs.overhead)


def test_reference_steps_take_the_profilers_share_out(tmp_path):
    # 1F1B, p=2, m=4, f=1 and bw=2 on both stages: a step is (m + p - 1) * (f + bw) = 15.
    # The traces show the profiled steps, where F took 1.25x and BW 1.5x as long.
    true = pc.Costs(f=1.0, b=1.0, w=1.0, bw=2.0)
    factor = {"f": 1.25, "b": 1.0, "w": 1.0, "bw": 1.5}
    write_traces(tmp_path, pc.build("1f1b", 2, 4), _dilated(true, factor), sends=())
    seconds = {f"{s},F": {"profiled": 2.5, "reference": 2.0} for s in (0, 1)}
    seconds.update({f"{s},BW": {"profiled": 6.0, "reference": 4.0} for s in (0, 1)})
    (tmp_path / "pipecore-run.json").write_text(json.dumps({
        "ranks": 2, "steps": 7, "profiled_steps": [2, 3, 4], "reference_steps": [1, 5, 6],
        "step_times": [40.0, 16.0, 99.0, 99.0, 99.0, 15.0, 14.0], "op_seconds": seconds}))
    prof = pt.from_profile(tmp_path)
    assert prof.dilation == {(0, "F"): 1.25, (1, "F"): 1.25, (0, "BW"): 1.5, (1, "BW"): 1.5}
    np.testing.assert_allclose(prof.costs.f, [1.0, 1.0], rtol=1e-9)
    np.testing.assert_allclose(prof.costs.bw, [2.0, 2.0], rtol=1e-9)
    assert prof.reference_times == [16.0, 15.0, 14.0]
    own = pt.what_if(prof, ["gpipe"]).profiled
    # Predicted 15 against the reference steps' median 15 (not the profiled steps' 99s).
    assert own["predicted"] == pytest.approx(15.0) and own["measured"] == 15.0
    assert own["measured_steps"] == "reference" and own["steps"] == 3
    out = io.StringIO()
    assert main(["what-if", str(tmp_path)], out=out) == 0
    assert ("it made ops +37.5% longer in the median, +25.0% to +50.0% over 4 stage and kind "
            "pairs") in flat(out.getvalue())
    assert "median of 3 unprofiled reference steps" in flat(out.getvalue())
    # reference=False keeps the traces' (profiled) times: 1.25 and 3.
    kept = pt.from_profile(tmp_path, reference=False)
    np.testing.assert_allclose(kept.costs.f, [1.25, 1.25], rtol=1e-9)
    np.testing.assert_allclose(kept.costs.bw, [3.0, 3.0], rtol=1e-9)
    assert kept.dilation == {} and kept.reference_times == []
    with pytest.raises(ValueError, match="'reference' must be True or False"):
        pt.from_profile(tmp_path, reference="yes")


def test_a_damaged_op_seconds_entry_only_loses_its_correction(tmp_path):
    true = pc.Costs(f=1.0, b=1.0, w=1.0, bw=2.0)
    write_traces(tmp_path, pc.build("1f1b", 2, 4), _dilated(true, {"f": 2, "b": 1, "w": 1,
                                                                   "bw": 1}), sends=())
    (tmp_path / "pipecore-run.json").write_text(json.dumps({"op_seconds": {
        "0,F": {"profiled": 2.0, "reference": 1.0}, "1,F": {"profiled": "x"},
        "bad": 3, "0,BW": {"profiled": 1.0, "reference": 0.0}}}))
    prof = pt.from_profile(tmp_path)
    assert prof.dilation == {(0, "F"): 2.0}
    np.testing.assert_allclose(prof.costs.f, [1.0, 2.0], rtol=1e-9)
    assert prof.reference_times == []  # no step_times in the file: the profiled steps measure


@pytest.mark.parametrize("steps,profiled,reference", [
    (1, [0], []), (2, [1], []), (4, [1, 2, 3], []), (5, [2, 3], [1, 4]),
    (7, [2, 3, 4], [1, 5, 6]), (8, [2, 3, 4, 5], [1, 6, 7])])
def test_which_steps_are_profiled(steps, profiled, reference):
    from pipecore.bindings import _torch_run

    assert _torch_run.profiled_steps(steps) == profiled
    assert _torch_run.reference_steps(steps) == reference


@pytest.mark.parametrize("cpus,warned", [(1, True), (2, False)])
def test_what_if_warns_when_ranks_exceed_the_runs_cpus(tmp_path, cpus, warned):
    write_traces(tmp_path, pc.build("1f1b", 2, 2), pc.Costs(), sends=())
    (tmp_path / "pipecore-run.json").write_text(json.dumps({"ranks": 2, "cpus": cpus}))
    ranking = pt.what_if(tmp_path)
    assert bool(ranking.warnings) is warned
    out = io.StringIO()
    assert main(["what-if", str(tmp_path)], out=out) == 0
    line = "warning: 2 ranks on 1 CPU (the run's machine): the ranks took turns on the cores"
    assert (line in out.getvalue()) is warned
    out = io.StringIO()
    assert main(["what-if", str(tmp_path), "--json"], out=out) == 0
    assert len(json.loads(out.getvalue())["warnings"]) == int(warned)


def test_what_if_without_run_file_compares_with_this_machine(tmp_path, monkeypatch):
    import pipecore.core.cpus

    write_traces(tmp_path, pc.build("1f1b", 4, 4), pc.Costs(), sends=())
    monkeypatch.setattr(pipecore.core.cpus, "local_cpus", lambda: 2)
    (warning,) = pt.what_if(tmp_path).warnings
    assert warning.startswith("4 ranks on 2 CPUs (this machine's; the traces do not record "
                              "the run's)")
    monkeypatch.setattr(pipecore.core.cpus, "local_cpus", lambda: 4)
    assert pt.what_if(tmp_path).warnings == []


def test_what_if_check_needs_run_file(tmp_path, capsys):
    from pipecore.cli import main

    write_traces(tmp_path, pc.build("1f1b", 2, 2), pc.Costs(), sends=())
    assert main(["what-if", str(tmp_path), "--check"]) == 2
    assert "pipecore-run.json" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"unknown"):
        pt.what_if(tmp_path, ["no-such-family"])


@pytest.mark.heavy  # a profiled real run (about 25 s); CI's heavy run and the docs' tutorial
def test_real_run_profile_round_trip(tmp_path):
    # One short real run: torch writes PP: labels the parser maps, for every rank.
    # At pt.run's default of one step, that step is profiled (set-up included).
    sched = pc.build("1f1b", 2, 2)
    res = pt.run(sched, model="tiny-transformer", hidden=16, profile=tmp_path)
    assert res.grads_match and res.profiled_steps == [0]
    prof = pt.from_profile(tmp_path)
    assert (prof.ranks, prof.stages, prof.microbatches) == (2, 2, 2)
    assert len(prof.step_times) == 1
    assert prof.schedule.to_actions() == sched.to_actions()
    assert prof.labels["F"] == 4 and prof.labels["BW"] == 4
    assert prof.labels["SEND_F"] == 2 and prof.labels["RECV_B"] == 2
    assert all(x > 0 for x in prof.costs.f) and prof.network.bytes > 0
    assert json.loads((tmp_path / "pipecore-run.json").read_text())["model"] == "tiny-transformer"


@pytest.mark.heavy  # real runs of the tiny transformer (about 20 s)
def test_tiny_transformer_split_backward_gradients():
    # zb-v splits every backward into I and W, and puts embedding and head on rank 0.
    res = pt.run(pc.build("zb-v", 2, 4), model="tiny-transformer", hidden=16)
    assert res.grads_match, res.max_abs_error


def test_tiny_transformer_bad_width():
    with pytest.raises(ValueError, match=r"hidden \(30\) must be a multiple of the 4 heads"):
        pt.run(pc.build("1f1b", 2, 2), model="tiny-transformer", hidden=30)


def test_sends_mode_checked(tmp_path):
    write_traces(tmp_path, pc.build("1f1b", 2, 2), pc.Costs(), sends=())
    with pytest.raises(ValueError, match=r"'sends' must be 'occupy' or 'wait' \(got 'x'\)"):
        pt.from_profile(tmp_path, sends="x")


@pytest.mark.parametrize("field,value,rule", [
    ("ts", "soon", "a finite number"),
    ("dur", -5.0, "a finite number >= 0"),
    ("dur", float("nan"), "a finite number >= 0"),
    ("ts", None, "a finite number"),
])
def test_bad_event_times_name_the_file_event_and_field(tmp_path, field, value, rule):
    # Issue 38: a non-numeric ts or a negative or NaN dur gave a message about Costs 'f'.
    write_traces(tmp_path, pc.build("1f1b", 2, 2), pc.Costs())
    path = tmp_path / "rank1.json"
    trace = json.loads(path.read_text())
    k = next(i for i, e in enumerate(trace["traceEvents"]) if e["name"].startswith("PP:"))
    trace["traceEvents"][k][field] = value
    path.write_text(json.dumps(trace))
    with pytest.raises(ValueError) as info:
        pt.from_profile(tmp_path)
    message = str(info.value)
    assert "rank1.json (rank 1)" in message and f"traceEvents[{k}]" in message
    assert f"{field}=" in message and rule in message


def test_binary_csv_names_the_file(tmp_path):
    path = tmp_path / "sched.csv"
    path.write_bytes(bytes(range(128, 256)) * 3)
    with pytest.raises(ValueError, match=r"sched\.csv: not a text CSV \(byte 0 is not UTF-8\)"):
        pt.from_csv(path)


@pytest.mark.parametrize("args", ["junk", {"Input Dims": "x"}, {"Input Dims": [[["a", 2]]]},
                                  {"Input Dims": [[[-4]]]}, {"Input Dims": [[[True]]]}])
def test_a_send_event_with_junk_args_is_skipped(tmp_path, args):
    # Found by the garbage fuzz: such an event crashed the size fit. It is left out and
    # the well-formed sends (4096 bytes: 1,024 float32 values) still give the network.
    write_traces(tmp_path, pc.build("1f1b", 2, 2), pc.Costs(), sends=((4096, 50.0),))
    path = tmp_path / "rank0.json"
    trace = json.loads(path.read_text())
    trace["traceEvents"].append({"ph": "X", "cat": "cpu_op", "name": "c10d::send", "ts": 1e9,
                                 "dur": 5.0, "pid": 1, "tid": 1, "args": args})
    path.write_text(json.dumps(trace))
    prof = pt.from_profile(tmp_path)
    assert prof.network.bytes == 4096

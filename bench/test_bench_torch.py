"""Predicted against measured iteration time of real PyTorch runs (pipecore.bindings.torch).

Run: pytest bench/test_bench_torch.py --benchmark-only -s
(needs pipecore[torch]; about two minutes at the default 5 repeats on 2 ranks).

Each schedule runs for real with torch's ``_PipelineScheduleRuntime`` on CPU
ranks (gloo), ``REPEATS`` times as fresh processes; the measured iteration
time is the median of the runs' median steps, and its spread is the range of
those medians. pipecore predicts the iteration time by simulating the
schedule with the per-stage F, B, W times (and the runtime's per-op
overhead) measured on the runs and the measured transfer time; the column
``calibrate()`` uses single-process stage timings without the runtime's
overhead. The table is printed and kept in ``benchmark.extra_info``; set
``PIPECORE_TORCH_REPORT=path.json`` to also write the rows to a file.

The bar: wherever two schedules' measured medians differ by more than their
spread, the predicted order agrees.
"""

import json
import os

import pytest
from sizes import pick

torch = pytest.importorskip("torch", reason="needs torch: pip install 'pipecore[torch]'")

from pipecore.bindings import torch as pt  # noqa: E402

SHAPES = {"p2-m8": (2, 8)}
SCHEDULES = pick(("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v"), ("1f1b",))
REPEATS = int(os.environ.get("PIPECORE_TORCH_REPEATS", pick("5", "1")))


@pytest.mark.parametrize("shape", list(SHAPES))
def test_torch_fidelity(benchmark, shape):
    p, m = SHAPES[shape]
    benchmark.group = f"torch-{shape}"
    benchmark.name = f"fidelity: {len(SCHEDULES)} schedules x {REPEATS} real runs + simulations"
    rows = benchmark.pedantic(pt.fidelity, args=(SCHEDULES, p, m),
                              kwargs={"repeats": REPEATS}, rounds=1, iterations=1)
    text = pt.format_fidelity(rows)
    print(f"\n{shape}: predicted vs measured iteration time (ms)\n{text}")
    benchmark.extra_info["rows"] = rows
    benchmark.extra_info["table"] = text
    report = os.environ.get("PIPECORE_TORCH_REPORT")
    if report:
        with open(report, "w") as fh:
            json.dump({"shape": shape, "rows": rows, "table": text}, fh, indent=1)
    agree, counted, wrong = pt.ranking_agreement(rows)
    assert not wrong, f"predicted order disagrees with the measured one for {wrong}\n{text}"


def test_profile_fidelity(benchmark, tmp_path):
    """Issue 39's protocol (bench/profile_fidelity.py): calibrated op sizes, pinned ranks,
    costs from profiled runs, step times from separate unprofiled runs, repeats
    interleaved.

    Smoke size (PIPECORE_BENCH_SMOKE=1): tiny shapes instead of the calibration,
    one repeat of gpipe and 1f1b on the MLP. Full: calibrate to 10 ms ops, then
    every schedule of both models, PIPECORE_TORCH_REPEATS repeats (default 3).
    Records the table and the bars; they are printed, not asserted (a slow phase
    of a shared machine moves them).
    """
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "profile_fidelity", Path(__file__).with_name("profile_fidelity.py"))
    pf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pf)
    smoke = pick(False, True)
    schedules, models = (("gpipe", "1f1b"), ("mlp",)) if smoke else (pf.SCHEDULES, pf.MODELS)
    repeats = int(os.environ.get("PIPECORE_TORCH_REPEATS", "1" if smoke else "3"))
    benchmark.group = "torch-profile"
    benchmark.name = "profile fidelity: calibrated, pinned, profiled and timed runs"

    def go():
        if smoke:
            (tmp_path / "shapes.json").write_text(json.dumps(
                {"mlp": {"hidden": 32, "rows": 2, "layers": pf.LAYERS}}))
        else:
            pf.calibrate(tmp_path)
        pf.run(tmp_path, repeats, schedules=schedules, models=models)
        return pf.report(tmp_path)

    summary, bars, text = benchmark.pedantic(go, rounds=1, iterations=1)
    benchmark.extra_info["summary"] = summary
    benchmark.extra_info["bars"] = {k: v for k, v in bars.items() if k != "lines"}
    benchmark.extra_info["table"] = text
    assert len(summary) == len(schedules) * len(models), text
    assert all(r["repeats"] == repeats and r["predicted"] is not None for r in summary), text


def test_paired_ranking_counts_pairs_ordered_in_all_repeats_but_one():
    """Hand-made runs (no timing): profile_fidelity's paired view of the ranking."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "profile_fidelity", Path(__file__).with_name("profile_fidelity.py"))
    pf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pf)

    def row(name, runs, predicted):
        return {"model": "m", "ranks": 2, "schedule": name, "predicted": predicted,
                "runs": dict(enumerate(runs))}

    rows = [row("a", [1, 2, 3, 4, 5], 1.0),    # faster than b in all 5 repeats
            row("b", [2, 3, 4, 5, 6], 2.0),
            row("c", [0.5, 9, 9, 9, 9], 0.5),  # slower than a and b in 4 of 5: still ordered
            row("d", [0, 8, 0, 8, 0], 3.0)]    # faster than c in all 5, than a and b in 3
    # a < b agrees (1 < 2); a < c, b < c and d < c are against the predictions (c's 0.5 is
    # the fastest predicted); d against a and against b: 3 of 5 repeats, not ordered.
    got = pf._paired(rows)
    assert (got["paired_agree"], got["paired_pairs"]) == (1, 4)
    assert sorted(got["paired_wrong"]) == ["m: a < c", "m: b < c", "m: d < c"]
    # With 3 repeats a pair must be ordered the same way in all of them: a < b (agrees) and
    # d < c (against); a and b beat c in only 2 of the first 3.
    three = [dict(r, runs={k: v for k, v in r["runs"].items() if k < 3}) for r in rows]
    got = pf._paired(three)
    assert (got["paired_agree"], got["paired_pairs"], got["paired_wrong"]) == (1, 2, ["m: d < c"])


def test_at_run_op_times_rescales_each_kind_by_its_median():
    """Hand-worked: profile_fidelity's "run ops" column rescales kinds, not stages."""
    import importlib.util
    from pathlib import Path

    import pipecore as pc

    spec = importlib.util.spec_from_file_location(
        "profile_fidelity", Path(__file__).with_name("profile_fidelity.py"))
    pf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pf)
    costs = pc.Costs(f=[1.0, 3.0, 5.0], b=[2.0, 2.0, 2.0], w=[1.0, 1.0, 1.0], overhead=0.5)
    prof = pt.Profile(costs=costs, network=pc.Network(bytes=1.0), schedule=pc.build("gpipe", 3, 3),
                      ranks=3, stages=3, microbatches=3, step_times=[], measured=0.0)
    got = pf.at_run_op_times(prof, {"F": 6.0, "W": 0.5}).costs
    # F: the stages' median is 3, the run's 6: every stage doubles; W: 1 -> 0.5 halves;
    # B is not in the run's ops and stays; the overhead is not a compute kind.
    assert list(got.f) == [2.0, 6.0, 10.0]
    assert list(got.w) == [0.5, 0.5, 0.5]
    assert list(got.b) == [2.0, 2.0, 2.0] and got.overhead == 0.5


def test_at_step_op_times_replays_a_step_with_each_ops_own_time():
    """Hand-worked: profile_fidelity's "exact ops" column (one slow op, gpipe p=2, m=2)."""
    import importlib.util
    from pathlib import Path

    import pipecore as pc

    spec = importlib.util.spec_from_file_location(
        "profile_fidelity", Path(__file__).with_name("profile_fidelity.py"))
    pf = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(pf)
    sched = pc.build("gpipe", 2, 2)
    costs = pc.Costs(f=1.0, b=1.0, w=1.0)
    prof = pt.Profile(costs=costs, network=pc.Network(bytes=1.0), schedule=sched, ranks=2,
                      stages=2, microbatches=2, step_times=[], measured=0.0)
    # Every op as the costs say but rank 1's first forward, 3 s instead of 1; the transfers'
    # postings (stage -1) are left out.
    step = [(0, 0, "F", 1.0), (0, -1, "post", 0.1), (0, 0, "F", 1.0), (1, 1, "F", 3.0),
            (1, 1, "F", 1.0), (1, 1, "BW", 2.0), (1, 1, "BW", 2.0), (0, 0, "BW", 2.0),
            (0, 0, "BW", 2.0)]
    fac = pf.at_step_op_times(prof, sched, step)
    assert sorted(fac) == [1.0] * 7 + [3.0]
    # By hand, no transfer time: rank 0 F0 [0,1] F1 [1,2]; rank 1 F0 [1,4] F1 [4,5] BW0 [5,7]
    # BW1 [7,9]; rank 0 BW0 waits for rank 1's BW0: [7,9], BW1 [9,11]. Without the slow op: 9.
    assert pc.simulate(sched, costs, prof.network).makespan == 9.0
    assert pc.simulate(sched, costs, prof.network, stragglers=fac).makespan == 11.0
    # A call the program does not have is named by rank and position.
    bad = [e if e[:2] != (1, 1) or e[2] != "BW" else (1, 1, "F", 2.0) for e in step]
    with pytest.raises(ValueError, match="rank 1, compute call 2: stage 1 F ran where"):
        pf.at_step_op_times(prof, sched, bad)
    with pytest.raises(ValueError, match="rank 0 made 3 compute calls"):
        pf.at_step_op_times(prof, sched, step[:-1])

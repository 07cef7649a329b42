"""Fidelity of predictions from torch.profiler traces, measured with a protocol
a reader can trust (issue 39).

    python bench/profile_fidelity.py calibrate DIR [--target-ms 10]
    python bench/profile_fidelity.py run DIR [--repeats 3]
    python bench/profile_fidelity.py report DIR [--json out.json]

The protocol:

* **Ranks no more than CPUs, each pinned to its own** (``pt.run(pin=True)``:
  ``os.sched_setaffinity`` before gloo starts, so gloo's threads share their
  rank's core and never another rank's); torch at one thread. Runs with more
  ranks than this process's CPUs are not made (4 ranks only where 4 CPUs
  are free; here they are checked for gradients, not timed).
* **Ops of at least ``--target-ms``** (default 10 ms): ``calibrate`` times
  one stage's F, B and W in this process, pinned, one thread, on the
  smallest stage the runs have (two blocks: 8 blocks in 4 stages for the
  two-chunk families), and picks per model the cheapest width and rows per
  microbatch whose three times all reach the target; ``shapes.json`` keeps
  the choice and the times.
* **Costs from profiled runs, step times from runs without the profiler**:
  per repeat and schedule one profiled run (7 steps: the first sets torch
  up, 3-5 are profiled, 2, 6 and 7 run without the profiler so
  ``from_profile`` can divide each stage's compute kind by what the
  profiler added in that very run) and one timed run (``WARMUP`` warm-up
  steps left out, then ``TIMED`` steps, their median), each a fresh set of
  processes; repeats run every schedule of both models before the next
  repeat starts, so a slow phase of the machine falls on all of them.
* **Spread beside every error**: a configuration's measured time is the
  median of its repeats' timed medians and its spread the range of them;
  its prediction is the median of the predictions from its repeats' own
  profiles (self-calibrated) or from the 1f1b profiles of the same model
  (cross-prediction).

``report`` prints the table bindings/README.md shows (``self`` and ``cross``:
predicted / measured - 1 against the timed runs; ``replay``: each profile's
prediction against its own run's unprofiled steps; ``run ops``: the
prediction with each compute kind rescaled to the timed run's own mean
op times, against that run, so what remains is the schedule model, the
runtime's waits and how op times vary within the run, not their drift
between runs; ``exact``: every timed step simulated with each of its ops'
own measured time, against that step, so what remains is the schedule
model and the network model alone; ``op spr``: the range over repeats of
the steps predicted at each timed run's own op times, over their median,
which is how much of the measured spread the op speed explains;
``prof+``: how much longer the profiler made the ops, median over stages
and kinds) and checks the bars:
median |self error| at most 5% with both signs and none beyond max(10%,
its spread); median |cross error| at most 8%; every pair of schedules
whose measured ranges do not overlap ordered as predicted. It adds, not as
a bar, a paired view: pairs ordered the same way in every repeat (all but
one from 5 repeats on), where two schedules of a repeat, run back to back,
share the machine's phase.
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipev")
MODELS = ("mlp", "tiny-transformer")
LAYERS = 8  # blocks in the whole model: 2 per stage for the two-chunk families at p=2
MICROBATCHES = 8
WARMUP, TIMED = 2, 6
PROFILE_STEPS = 7  # step 1 sets torch up; 3-5 profiled; 2, 6, 7 unprofiled references
# Candidate shapes per model, cheapest first (width, rows per microbatch).
LADDER = {
    "mlp": [(h, r) for h in (512, 768, 1024, 1536, 2048) for r in (32, 64, 128, 256)],
    "tiny-transformer": [(h, r) for h in (128, 192, 256, 384, 512) for r in (8, 16, 32, 64)],
}


def _ranks():
    from pipecore.core.cpus import local_cpus

    return (2, 4) if local_cpus() >= 4 else (2,)


def calibrate(folder, target_ms=10.0):
    """Pick per model the cheapest (width, rows) whose F, B and W all take ``target_ms``."""
    import os

    import torch
    from pipecore.bindings import _torch_run
    from pipecore.bindings._calibrate import _stage_times

    from pipecore.core.cpus import cpu_ids

    ids = cpu_ids()
    if ids:
        os.sched_setaffinity(0, {ids[0]})
    torch.set_num_threads(1)
    shapes = {}
    for model in MODELS:
        ladder = sorted(LADDER[model], key=lambda hr: hr[0] * hr[0] * hr[1])
        for hidden, rows in ladder:
            mods = _torch_run.build_model(model, 4, hidden, 0, LAYERS)
            x, _ = _torch_run.make_batch(rows, hidden, 0, model)
            with torch.no_grad():
                x1 = mods[0](x)  # stage 1's input: blocks only, the smallest stage
            times, _ = _stage_times(mods[1], x1, False, repeats=5, warmup=2)
            ms = {k: v * 1e3 for k, v in times.items()}
            print(f"{model}: hidden {hidden}, rows {rows}: F {ms['F']:.1f} B {ms['B']:.1f} "
                  f"W {ms['W']:.1f} BW {ms['BW']:.1f} ms", flush=True)
            if min(ms["F"], ms["B"], ms["W"]) >= target_ms:
                shapes[model] = {"hidden": hidden, "rows": rows, "layers": LAYERS,
                                 "stage_ms": ms, "target_ms": target_ms}
                break
        else:
            raise SystemExit(f"{model}: no shape in the ladder reaches {target_ms} ms per op")
    Path(folder).mkdir(parents=True, exist_ok=True)
    (Path(folder) / "shapes.json").write_text(json.dumps(shapes, indent=1))
    return shapes


def _shapes(folder):
    path = Path(folder) / "shapes.json"
    if not path.exists():
        raise SystemExit(f"{path} is missing: run 'calibrate {folder}' first")
    return json.loads(path.read_text())


def run(folder, repeats, schedules=SCHEDULES, models=MODELS):
    """Profiled and timed runs, interleaved: every schedule of every model per repeat."""
    from pipecore.bindings import torch as pt

    import pipecore as pc

    shapes = _shapes(folder)
    for p in _ranks():
        if p > 2:  # more ranks than 2: correctness only (issue 39, part 4)
            for model in models:
                s = shapes[model]
                res = pt.run(pc.build("1f1b", p, 2 * p), model=model, hidden=s["hidden"],
                             layers=2 * p, batch=2 * p * 2, pin=True)
                print(f"{model} p={p}: gradients match {res.grads_match}", flush=True)
            continue
        for rep in range(repeats):
            for model in models:
                s = shapes[model]
                kw = dict(model=model, hidden=s["hidden"], layers=s["layers"],
                          batch=s["rows"] * MICROBATCHES, check=False, pin=True)
                for name in schedules:
                    sched = pc.build(name, p, MICROBATCHES)
                    tag = f"{model}-p{p}-{name}-r{rep}"
                    prof_dir = Path(folder) / tag
                    done = Path(folder) / f"{tag}.timed.json"
                    if not (prof_dir / "pipecore-run.json").exists():
                        res = pt.run(sched, steps=PROFILE_STEPS, profile=prof_dir, **kw)
                        # Every op's time in every step, profiled or not, in call order per rank.
                        (Path(folder) / f"{tag}.ops.json").write_text(json.dumps(res.op_times))
                    if not done.exists():
                        t0 = time.perf_counter()
                        res = pt.run(sched, steps=WARMUP + TIMED, **kw)
                        done.write_text(json.dumps({
                            "step_times": res.step_times, "median": res.iteration_time(WARMUP),
                            "cpus": res.cpus, "threads": res.threads,
                            "ops": _op_stats(res, WARMUP), "op_times": res.op_times}))
                        print(f"{tag}: median step {res.iteration_time(WARMUP) * 1e3:.1f} ms "
                              f"({time.perf_counter() - t0:.0f} s)", flush=True)


def _op_stats(res, warmup):
    """Mean seconds of each compute kind in the timed steps (what the ops reached)."""
    return _kind_means(res.op_times[warmup:])


def _kind_means(steps):
    kinds = {}
    for step in steps:
        for _rank, stage, kind, seconds in step:
            if stage >= 0:
                kinds.setdefault(kind, []).append(seconds)
    return {k: statistics.fmean(v) for k, v in kinds.items()}


def _run_ops(timed):
    """A timed run's mean op time per kind (older runs kept only their medians)."""
    if "op_times" in timed:
        return _kind_means(timed["op_times"][WARMUP:])
    return timed["ops"]


def at_run_op_times(profile, ops):
    """The profile with each compute kind rescaled to a run's own op times.

    Every stage's F (B, W, BW) is multiplied by the same factor: the run's
    mean op time of that kind over the profile's mean over stages. A
    prediction from it leaves out how the profiled run's ops differed from
    the timed run's, so its error is what the schedule model and the
    runtime's waits add (the "run ops" column).

    Parameters
    ----------
    profile : pipecore.bindings.torch.Profile
    ops : dict
        Mean seconds per kind in the timed run (``"F"``, ``"B"``, ...).

    Returns
    -------
    Profile
    """
    import dataclasses

    c = profile.costs
    scaled = {}
    for kind, name in (("F", "f"), ("B", "b"), ("W", "w"), ("BW", "bw")):
        v = getattr(c, name)
        if kind in ops and v is not None:
            v = np.asarray(v, dtype=float)
            scaled[name] = v * (ops[kind] / float(np.mean(v)))
    return dataclasses.replace(profile, costs=dataclasses.replace(c, **scaled))


COMPUTE = ("F", "B", "W", "BW")


def at_step_op_times(profile, schedule, step):
    """Per-op time factors with which a simulation replays one real step.

    Each compute op of the schedule gets the time its own call took in the
    step (plus the profile's per-op overhead) where the costs give it
    ``cost``: factor ``(seconds + overhead) / cost``, for
    ``pc.simulate(schedule, profile.costs, profile.network,
    stragglers=factors)``. The error of that simulation against the step
    (the "exact ops" column) is what the schedule model and the network
    model miss when every op's time is known.

    Parameters
    ----------
    profile : pipecore.bindings.torch.Profile
    schedule : pipecore.Schedule
        The schedule the step ran.
    step : list of tuple
        ``(rank, stage, kind, seconds)`` per call in call order, as
        ``RunResult.op_times[i]`` holds; entries with stage < 0 (posting
        and waiting on transfers) are left out.

    Returns
    -------
    numpy.ndarray
        One factor per op row (1 for ops with no compute).

    Raises
    ------
    ValueError
        If a rank's compute calls differ in number, stage or kind from its
        device's program, naming the rank and position.
    """
    from pipecore.core.simulate import compile_schedule

    comp = compile_schedule(schedule, profile.costs, profile.network)
    cost = comp.stage_cost[comp.op_class, comp.op_stage]
    over = profile.costs.stage_arrays(schedule.stages, schedule.devices)["overhead"]
    t = schedule.table
    dev, slot, stage = (t[c].to_numpy() for c in ("device", "slot", "stage"))
    kind = [str(k) for k in t["kind"].to_pylist()]
    order = np.lexsort((slot, dev))
    fac = np.ones(schedule.num_ops)
    for d in range(schedule.devices):
        rows = [i for i in order if dev[i] == d and kind[i] in COMPUTE]
        calls = [e for e in step if e[0] == d and e[1] >= 0]
        if len(calls) != len(rows):
            raise ValueError(f"rank {d} made {len(calls)} compute calls in the step; its "
                             f"program has {len(rows)} compute ops")
        for pos, (i, (_r, st, kd, sec)) in enumerate(zip(rows, calls)):
            if (st, kd) != (int(stage[i]), kind[i]):
                raise ValueError(f"rank {d}, compute call {pos}: stage {st} {kd} ran where the "
                                 f"program has stage {int(stage[i])} {kind[i]}")
            if cost[i] > 0:
                fac[i] = (sec + over[st]) / cost[i]
    return fac


def _exact(profile, name, timed):
    """Median over a timed run's steps after the warm-up: replay with each op's own time / step - 1."""
    import pipecore as pc

    if "op_times" not in timed:
        return None
    sched = pc.build(name, profile.ranks, profile.microbatches)
    errs = []
    for k, step in enumerate(timed["op_times"]):
        if k >= WARMUP:
            fac = at_step_op_times(profile, sched, step)
            sim = pc.simulate(sched, profile.costs, profile.network, stragglers=fac).makespan
            errs.append(sim / timed["step_times"][k] - 1)
    return statistics.median(errs)


def _collect(folder):
    from pipecore.bindings import torch as pt

    profiles, timed = {}, {}
    for d in sorted(Path(folder).iterdir()):
        if d.is_dir() and (d / "pipecore-run.json").exists():
            model, p, name, rep = _parse(d.name)
            try:
                profiles[(model, p, name, rep)] = pt.from_profile(d)
            except ValueError as exc:
                print(f"{d.name}: {exc}", file=sys.stderr)
        elif d.name.endswith(".timed.json"):
            model, p, name, rep = _parse(d.name[: -len(".timed.json")])
            timed[(model, p, name, rep)] = json.loads(d.read_text())
    return profiles, timed


def _parse(tag):
    parts = tag.split("-")
    i = next(k for k, x in enumerate(parts) if x.startswith("p") and x[1:].isdigit())
    return "-".join(parts[:i]), int(parts[i][1:]), "-".join(parts[i + 1:-1]), int(parts[-1][1:])


def report(folder, json_path=None):
    """The fidelity table and the bars, from the runs in ``folder``."""
    profiles, timed = _collect(folder)
    keys = sorted({k[:3] for k in timed})
    summary = []
    for model, p, name in keys:
        reps = sorted(k[3] for k in timed if k[:3] == (model, p, name))
        meas = [timed[(model, p, name, r)]["median"] for r in reps]
        own = [profiles[(model, p, name, r)].predict(name).makespan
               for r in reps if (model, p, name, r) in profiles]
        # Replay: each profile's prediction against its own run's unprofiled steps, which
        # ran in the same processes: the model's error without the run-to-run noise.
        replay = [pr.predict(name).makespan / statistics.median(pr.reference_times) - 1
                  for r in reps if (pr := profiles.get((model, p, name, r))) is not None
                  and pr.reference_times]
        dil = [v for r in reps if (model, p, name, r) in profiles
               for v in profiles[(model, p, name, r)].dilation.values()]
        base = [profiles[(model, p, "1f1b", r)] for r in reps if (model, p, "1f1b", r) in profiles]
        cross = [b.predict(name).makespan for b in base] if name != "1f1b" else []
        ops = [_run_ops(timed[(model, p, name, r)]) for r in reps]
        # The step each timed run's own op times give (one prediction per run): its error
        # against that run is "run ops"; their range is how far op speed alone moved the runs.
        keyed = [(model, p, name, r) for r in reps if (model, p, name, r) in profiles]
        at_run = [(at_run_op_times(profiles[k], _run_ops(timed[k])).predict(name).makespan,
                   timed[k]["median"]) for k in keyed if _run_ops(timed[k])]
        at_ops = [pred / meas_r - 1 for pred, meas_r in at_run]
        # Each timed step replayed with its ops' own times (needs runs that kept them).
        exact = [e for k in keyed if (e := _exact(profiles[k], name, timed[k])) is not None]
        m = statistics.median(meas)
        row = {"model": model, "ranks": p, "schedule": name, "repeats": len(reps),
               "measured": m, "low": min(meas), "high": max(meas),
               "runs": dict(zip(reps, meas)),
               "spread": (max(meas) - min(meas)) / m,
               "predicted": statistics.median(own) if own else None,
               "cross": statistics.median(cross) if cross else None,
               "replay": statistics.median(replay) if replay else None,
               "run_ops": statistics.median(at_ops) if at_ops else None,
               "exact_ops": statistics.median(exact) if exact else None,
               "op_spread": (_range([pred for pred, _ in at_run]) if len(at_run) > 1
                             else None),
               "dilation": statistics.median(dil) - 1 if dil else None,
               "op_ms": {k: 1e3 * statistics.median(o[k] for o in ops if k in o)
                         for k in sorted({k for o in ops for k in o})}}
        row["error"] = None if row["predicted"] is None else row["predicted"] / m - 1
        row["cross_error"] = None if row["cross"] is None else row["cross"] / m - 1
        summary.append(row)
    lines = [f"{'model':<17}{'p':>2} {'schedule':<17}{'measured ms':>12}{'spread':>8}"
             f"{'self':>8}{'cross':>8}{'replay':>8}{'run ops':>8}{'exact':>8}{'op spr':>8}"
             f"{'prof+':>7}  op ms (mean)"]
    for r in summary:
        ops = " ".join(f"{k} {r['op_ms'][k]:.1f}" for k in ("F", "B", "W", "BW") if k in r["op_ms"])
        lines.append(f"{r['model']:<17}{r['ranks']:>2} {r['schedule']:<17}"
                     f"{r['measured'] * 1e3:>12.1f}{r['spread']:>8.1%}"
                     + (f"{r['error']:>+8.1%}" if r["error"] is not None else f"{'-':>8}")
                     + (f"{r['cross_error']:>+8.1%}" if r["cross_error"] is not None else f"{'-':>8}")
                     + (f"{r['replay']:>+8.1%}" if r["replay"] is not None else f"{'-':>8}")
                     + (f"{r['run_ops']:>+8.1%}" if r["run_ops"] is not None else f"{'-':>8}")
                     + (f"{r['exact_ops']:>+8.1%}" if r["exact_ops"] is not None else f"{'-':>8}")
                     + (f"{r['op_spread']:>8.1%}" if r["op_spread"] is not None else f"{'-':>8}")
                     + (f"{r['dilation']:>+7.0%}" if r["dilation"] is not None else f"{'-':>7}")
                     + f"  {ops}")
    bars = _bars(summary)
    lines += bars["lines"]
    text = "\n".join(lines)
    print(text)
    if json_path:
        Path(json_path).write_text(json.dumps({"summary": summary, "bars": bars, "table": text},
                                              indent=1))
    return summary, bars, text


def _bars(summary):
    errs = [r["error"] for r in summary if r["error"] is not None]
    cross = [abs(r["cross_error"]) for r in summary if r["cross_error"] is not None]
    out = {"lines": []}
    if errs:
        med = statistics.median(abs(e) for e in errs)
        high = sum(e > 0 for e in errs)
        beyond = [f"{r['model']} {r['schedule']} {r['error']:+.1%} (spread {r['spread']:.1%})"
                  for r in summary if r["error"] is not None
                  and abs(r["error"]) > max(0.10, r["spread"])]
        out.update(self_median=med, high=high, low=len(errs) - high, beyond=beyond)
        out["lines"].append(f"self-calibrated: median |error| {med:.1%} over {len(errs)} "
                            f"configurations ({high} high, {len(errs) - high} low); beyond "
                            f"max(10%, spread): {len(beyond)}" + (f" {beyond}" if beyond else ""))
    if cross:
        out["cross_median"] = statistics.median(cross)
        out["lines"].append(f"cross-prediction from 1f1b: median |error| "
                            f"{out['cross_median']:.1%} over {len(cross)}")
    agree, counted, wrong = _ranking(summary)
    out.update(ranking_agree=agree, ranking_pairs=counted, ranking_wrong=wrong)
    out["lines"].append(f"ranking: {agree} of {counted} separated pairs ordered as predicted"
                        + (f"; not: {wrong}" if wrong else ""))
    out.update(_paired(summary))
    out["lines"].append(f"paired (not a bar): {out['paired_agree']} of {out['paired_pairs']} pairs "
                        f"ordered the same way in all repeats but at most one agree with the "
                        f"prediction" + (f"; not: {out['paired_wrong']}" if out["paired_wrong"] else ""))
    return out


def _range(values):
    """(max - min) / median."""
    return (max(values) - min(values)) / statistics.median(values)


def _ranking(rows):
    """Pairs of a model's schedules whose ranges ("low" to "high") do not overlap:
    how many the "predicted" values order the same way, and those they do not."""
    agree = counted = 0
    wrong = []
    for model in sorted({r["model"] for r in rows}):
        for p in sorted({r["ranks"] for r in rows}):
            g = [r for r in rows if r["model"] == model and r["ranks"] == p
                 and r["predicted"] is not None]
            for i, a in enumerate(g):
                for c in g[i + 1:]:
                    fast, slow = (a, c) if a["measured"] < c["measured"] else (c, a)
                    if fast["high"] >= slow["low"]:
                        continue  # the ranges overlap: the order is not measured
                    counted += 1
                    if fast["predicted"] < slow["predicted"]:
                        agree += 1
                    else:
                        wrong.append(f"{model}: {fast['schedule']} < {slow['schedule']}")
    return agree, counted, wrong


def _paired(summary):
    """Pairs compared repeat by repeat: two schedules of a repeat ran back to back, so
    they share the machine's slow or fast phase that the ranges above mix in."""
    agree, counted, wrong = 0, 0, []
    groups = {}
    for r in summary:
        if r["predicted"] is not None:
            groups.setdefault((r["model"], r["ranks"]), []).append(r)
    for (model, _p), g in groups.items():
        for i, a in enumerate(g):
            for c in g[i + 1:]:
                common = sorted(set(a["runs"]) & set(c["runs"]))
                if len(common) < 3:
                    continue
                n = len(common)
                wins = sum(a["runs"][k] < c["runs"][k] for k in common)
                slack = 1 if n >= 5 else 0  # one repeat against the rest, from 5 repeats on
                if n - slack > wins > slack:
                    continue  # not ordered the same way in enough repeats
                fast, slow = (a, c) if wins > n / 2 else (c, a)
                counted += 1
                if fast["predicted"] < slow["predicted"]:
                    agree += 1
                else:
                    wrong.append(f"{model}: {fast['schedule']} < {slow['schedule']}")
    return {"paired_agree": agree, "paired_pairs": counted, "paired_wrong": wrong}


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("phase", choices=("calibrate", "run", "report"))
    ap.add_argument("folder")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--target-ms", type=float, default=10.0)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    if a.phase == "calibrate":
        calibrate(a.folder, a.target_ms)
    elif a.phase == "run":
        run(a.folder, a.repeats)
    else:
        report(a.folder, a.json)

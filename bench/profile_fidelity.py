"""Fidelity of predictions from torch.profiler traces (issue 17, part 4).

Two phases, so that the slow real runs and the fitting can be redone apart:

    python bench/profile_fidelity.py run DIR [--repeats 3]   # real runs, traces under DIR
    python bench/profile_fidelity.py report DIR [--json out.json]

``run``: every schedule of SCHEDULES at 2 and 4 ranks (m = 2p), for both
models, ``--repeats`` times (a fresh set of processes each; the schedules are
interleaved so that load on the machine falls on all of them), each run
profiled (``pt.run(profile=...)``) for ``STEPS`` steps (the first is not
profiled).

``report``: per run, the prediction from the run's own profile (simulating
the schedule it ran with ``pt.from_profile``'s costs and network) against
the measured step (median of the profiled steps); and cross-prediction:
the 1f1b run of the same repeat, model and ranks predicts every other
schedule. Prints per-(model, ranks, schedule) medians and ranges over
repeats, the median |error|, the sign counts, and the ranking check (pairs
whose measured ranges do not overlap must be ordered as predicted).
"""

import argparse
import json
import statistics
import sys
from pathlib import Path

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v", "dualpipev")
MODELS = {"mlp": {"hidden": 256, "layers": 8, "rows": 64},
          "tiny-transformer": {"hidden": 64, "layers": 8, "rows": 4}}
RANKS = (2, 4)
STEPS = 6


def run(folder, repeats):
    from pipecore.bindings import torch as pt

    import pipecore as pc

    for rep in range(repeats):
        for model, shape in MODELS.items():
            for p in RANKS:
                m = 2 * p
                for name in SCHEDULES:
                    out = Path(folder) / f"{model}-p{p}-{name}-r{rep}"
                    if (out / "pipecore-run.json").exists():
                        continue
                    sched = pc.build(name, p, m)
                    res = pt.run(sched, model=model, hidden=shape["hidden"], layers=shape["layers"],
                                 batch=shape["rows"] * m, steps=STEPS, check=False, profile=out)
                    (out / "steps.txt").write_text(json.dumps(res.step_times))
                    print(out.name, [round(t * 1e3, 1) for t in res.step_times], flush=True)


def _runs(folder, sends="occupy"):
    from pipecore.bindings import torch as pt

    out = {}
    for d in sorted(Path(folder).iterdir()):
        if not (d / "pipecore-run.json").exists():
            continue
        if (d / "steps.json").exists():  # older layout: keep only traces as *.json
            (d / "steps.json").rename(d / "steps.txt")
        parts = d.name.split("-")
        rep = int(parts[-1][1:])
        i = parts.index(next(x for x in parts if x.startswith("p") and x[1:].isdigit()))
        model, p, name = "-".join(parts[:i]), int(parts[i][1:]), "-".join(parts[i + 1:-1])
        try:
            prof = pt.from_profile(d, sends=sends)
        except ValueError as exc:
            print(f"{d.name}: {exc}", file=sys.stderr)
            continue
        out[(model, p, name, rep)] = prof
    return out


def report(folder, json_path=None, sends="occupy"):
    runs = _runs(folder, sends)
    rows = []
    for (model, p, name, rep), prof in sorted(runs.items()):
        pred = prof.predict(prof.schedule).makespan
        base = runs.get((model, p, "1f1b", rep))
        cross = base.predict(name).makespan if base is not None and name != "1f1b" else None
        rows.append({"model": model, "ranks": p, "schedule": name, "repeat": rep,
                     "measured": prof.measured, "predicted": pred,
                     "error": pred / prof.measured - 1,
                     "cross": cross, "cross_error": None if cross is None else cross / prof.measured - 1,
                     "overhead": float(prof.costs.overhead)})
    groups = {}
    for r in rows:
        groups.setdefault((r["model"], r["ranks"], r["schedule"]), []).append(r)
    table = [f"{'model':<17}{'p':>2} {'schedule':<17}{'measured ms':>12}{'range':>15}"
             f"{'self err':>9}{'range':>17}{'cross err':>10}"]
    summary = []
    for key, rs in groups.items():
        meas = [r["measured"] for r in rs]
        errs = [r["error"] for r in rs]
        cross = [r["cross_error"] for r in rs if r["cross_error"] is not None]
        summary.append({"model": key[0], "ranks": key[1], "schedule": key[2],
                        "measured": statistics.median(meas), "low": min(meas), "high": max(meas),
                        "error": statistics.median(errs), "error_low": min(errs),
                        "error_high": max(errs),
                        "cross_error": statistics.median(cross) if cross else None,
                        "predicted": statistics.median(r["predicted"] for r in rs),
                        "cross": statistics.median(r["cross"] for r in rs) if cross else None})
        s = summary[-1]
        table.append(f"{key[0]:<17}{key[1]:>2} {key[2]:<17}{s['measured'] * 1e3:>12.2f}"
                     f"{s['low'] * 1e3:>7.1f}-{s['high'] * 1e3:<7.1f}{s['error']:>+9.1%}"
                     f"{s['error_low']:>+8.1%}..{s['error_high']:<+7.1%}"
                     + (f"{s['cross_error']:>+10.1%}" if s["cross_error"] is not None else f"{'-':>10}"))
    self_abs = statistics.median(abs(s["error"]) for s in summary)
    pos = sum(s["error"] > 0 for s in summary)
    cross_abs = [abs(s["cross_error"]) for s in summary if s["cross_error"] is not None]
    table.append(f"self-calibrated: median |error| {self_abs:.1%} over {len(summary)} "
                 f"configurations ({pos} predicted high, {len(summary) - pos} low)")
    if cross_abs:
        table.append(f"cross-prediction from 1f1b: median |error| {statistics.median(cross_abs):.1%} "
                     f"over {len(cross_abs)}")
    agree = counted = 0
    wrong = []
    for model in MODELS:
        for p in RANKS:
            g = [s for s in summary if s["model"] == model and s["ranks"] == p]
            for i, a in enumerate(g):
                for c in g[i + 1:]:
                    fast, slow = (a, c) if a["measured"] < c["measured"] else (c, a)
                    if fast["high"] >= slow["low"]:
                        continue
                    counted += 1
                    if fast["predicted"] < slow["predicted"]:
                        agree += 1
                    else:
                        wrong.append(f"{model} p{p}: {fast['schedule']} < {slow['schedule']}")
    table.append(f"ranking (self-calibrated): {agree} of {counted} separated pairs agree"
                 + (f"; disagree: {wrong}" if wrong else ""))
    text = "\n".join(table)
    print(text)
    if json_path:
        Path(json_path).write_text(json.dumps({"runs": rows, "summary": summary, "table": text},
                                              indent=1))
    return rows, summary, text


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("phase", choices=("run", "report"))
    ap.add_argument("folder")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", default=None)
    ap.add_argument("--sends", default="occupy", choices=("occupy", "wait"))
    a = ap.parse_args()
    if a.phase == "run":
        run(a.folder, a.repeats)
    else:
        report(a.folder, a.json, a.sends)

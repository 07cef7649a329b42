"""The subcommands that meet PyTorch (``pipecore[torch]``): ``export`` (a
schedule as torch's CSV or as actions), ``run-torch`` (a real run on CPU
ranks) and ``what-if`` (every family ranked from one profiled run)."""

from __future__ import annotations

import json
import sys
import textwrap
from pathlib import Path

from ..core.cpus import local_cpus
from ..core.ops import InputError
from .options import positive_int, schedule_from, shape_args, write_file

__all__ = ["export_arguments", "export_command", "run_torch_arguments", "run_torch_command",
           "what_if_arguments", "what_if_command"]

#: run-torch --profile's default steps: the first sets torch's stages up and is
#: not profiled; steps 3-5 are profiled and 2, 6, 7 timed without the profiler,
#: so what-if can take out what the profiler adds to each op.
_PROFILE_STEPS = 7


def _binding(where=""):
    """:mod:`pipecore.bindings.torch`, or None once stderr says why it does not
    import (PyTorch is an optional extra: the subcommand then exits 2)."""
    try:
        from pipecore.bindings import torch as pt
    except ImportError as exc:
        print(f"pipecore: {where}{exc}", file=sys.stderr)
        return None
    return pt


def export_arguments(p):
    p.add_argument("name", help="schedule name (see 'pipecore list')")
    shape_args(p, None)
    p.add_argument("--csv", metavar="FILE", default=None,
                   help="torch's compute_only CSV, one line per rank (needs pipecore[torch]); "
                        "run it with pipecore run-torch FILE --ranks P")
    p.add_argument("--actions", metavar="FILE.json", default=None,
                   help="per-device programs as JSON, {device: [\"0F0\", \"0B0\", ...]} "
                        "(Schedule.to_actions(); pipecore.from_actions reads it back)")


def export_command(args, out):
    if args.csv is None and args.actions is None:
        raise InputError("export needs --csv FILE (what run-torch reads) and/or "
                         "--actions FILE.json (the per-device programs)")
    sched = schedule_from(args, args.name)
    shape = (f"{sched.name}: {sched.devices} devices, {sched.stages} stages, "
             f"{sched.microbatches} microbatches")
    if args.csv is not None and write_torch_csv(sched, args.csv, out) != 0:
        return 2
    if args.actions is not None:
        # One device per line; JSON's keys are strings ("0", "1", ...), which from_actions takes.
        programs = "{\n" + ",\n".join(f" {json.dumps(str(d))}: {json.dumps(prog)}"
                                       for d, prog in sched.to_actions().items()) + "\n}\n"
        path = write_file(args.actions, "--actions", lambda p: p.write_text(programs))
        shared = any(len(devs) > 1 for devs in sched.stage_devices)
        out.write(f"wrote {path} ({shape}; per-device programs, pipecore's kinds F, B, W, BW)\n")
        out.write(f"read it in Python: pc.from_actions(json.load(open({str(path)!r}))"
                  f"{', replicated=True' if shared else ''})\n")
    return 0


def write_torch_csv(sched, csv, out):
    """Write ``sched`` as torch's compute_only CSV (what run-torch reads).

    Parameters
    ----------
    sched : Schedule
    csv : str
        The file (``--csv``).
    out : file-like
        Where to say what was written and how to run it.

    Returns
    -------
    int
        0, or 2 when the torch binding is not installed (said on stderr).
    """
    pt = _binding("--csv: ")
    if pt is None:
        return 2
    pt.validate(sched)  # torch's own checks, so that run-torch will take the file
    path = write_file(csv, "--csv", lambda p: pt.to_csv(sched, p))
    shape = (f"{sched.name}: {sched.devices} devices, {sched.stages} stages, "
             f"{sched.microbatches} microbatches")
    out.write(f"wrote {path} ({shape})\n  torch's compute_only CSV, line r is rank r\n")
    out.write(f"run it: pipecore run-torch {path} --ranks {sched.devices}\n")
    return 0


def run_torch_arguments(p):
    p.add_argument("csv", help="compute_only schedule CSV (pipecore export SCHEDULE -p P -m M "
                               "--csv FILE, or pipecore.bindings.torch.to_csv)")
    p.add_argument("--ranks", type=positive_int, required=True, help="processes (one per CSV line)")
    p.add_argument("--model", default="mlp", choices=("mlp", "tiny-transformer"),
                   help="model split into stages (default mlp)")
    p.add_argument("--layers", type=positive_int, default=None,
                   help="blocks in the whole model (default one per stage; a multiple of stages)")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="write per-rank torch.profiler traces (rankN.json) to DIR, for pipecore "
                        "what-if; runs of 5 or more steps also time steps without the profiler, "
                        "so what-if can take out what it adds")
    p.add_argument("--hidden", type=positive_int, default=32, help="layer width (default 32)")
    p.add_argument("--batch", type=positive_int, default=None,
                   help="rows per step (default 2 per microbatch)")
    p.add_argument("--steps", type=positive_int, default=None,
                   help=f"steps to run (default 1; {_PROFILE_STEPS} with --profile: one to set "
                        f"torch up, 3 profiled, 3 timed without the profiler)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and data (default 0)")
    p.add_argument("--no-check", action="store_true",
                   help="do not compare gradients with the non-pipelined model")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def run_torch_command(args, out):
    pt = _binding()
    if pt is None:
        return 2
    from pipecore.bindings._trace import RUN_FILE
    from pipecore.bindings._what_if import oversubscribed

    if not Path(args.csv).is_file():
        raise InputError(f"run-torch: {args.csv}: no such file (write one with: pipecore export "
                         f"SCHEDULE -p P -m M --csv {args.csv})")
    steps = args.steps if args.steps is not None else (_PROFILE_STEPS if args.profile else 1)
    res = pt.run(args.csv, ranks=args.ranks, model=args.model, hidden=args.hidden, batch=args.batch,
                 steps=steps, seed=args.seed, check=not args.no_check, layers=args.layers,
                 profile=args.profile)
    summary = {"csv": args.csv, "ranks": res.ranks, "stages": res.stages,
               "microbatches": res.microbatches, "grads_match": res.grads_match,
               "max_abs_error": res.max_abs_error, "step_times": res.step_times}
    warnings = [w for w in [oversubscribed(res.ranks, local_cpus(), "this machine")] if w]
    if args.profile:
        folder = Path(args.profile)
        files = [str(folder / f"rank{r}.json") for r in range(res.ranks)] + [str(folder / RUN_FILE)]
        summary.update(profiled_steps=res.profiled_steps, profile_files=files)
        if res.reference_steps:
            summary["reference_steps"] = res.reference_steps
    if args.json:
        json.dump({**summary, "warnings": warnings}, out, indent=1)
        out.write("\n")
    else:
        for key, value in summary.items():
            if key == "step_times":
                value = " ".join(f"{t * 1e3:.2f}" for t in value) + " (ms, per step)"
            elif key == "profiled_steps":
                value = _profiled_text(value, len(res.step_times))
            elif key == "reference_steps":
                value = (", ".join(str(i + 1) for i in value)
                         + " (timed without the profiler, to take out what it adds)")
            elif key == "profile_files":
                key, value = "profile", ", ".join(value)
            out.write(textwrap.fill(f"{key:<14} {value}", 120, subsequent_indent=" " * 15,
                                    break_long_words=False, break_on_hyphens=False) + "\n")
        for w in warnings:
            out.write(textwrap.fill(f"warning: {w}", 120, subsequent_indent="  ",
                                    break_long_words=False) + "\n")
        if args.profile:
            out.write(f"next: pipecore what-if {args.profile}   (ranks every schedule family "
                      f"on this run's profile)\n")
    return 1 if res.grads_match is False else 0


def _profiled_text(indices, steps):
    """Which steps a run profiled, for a person (steps counted from 1)."""
    first, last = indices[0] + 1, indices[-1] + 1
    which = f"step {first}" if first == last else f"steps {first}-{last}"
    if first == 1:
        return (f"{which} of {steps} (it includes torch's set-up of the stages; run --steps 2 or "
                f"more to profile steps without it)")
    return f"{which} of {steps} (step 1 sets torch's stages up and is left out)"


def what_if_arguments(p):
    p.add_argument("profile_dir", help="folder of per-rank traces (run-torch --profile DIR)")
    p.add_argument("--schedules", default="all",
                   help="'all' or comma-separated family names (default all)")
    p.add_argument("--microbatches", type=positive_int, default=None,
                   help="microbatches to predict for (default: the profiled run's)")
    p.add_argument("--check", action="store_true",
                   help="run the top three for real (needs the run's pipecore-run.json and "
                        "pipecore[torch]) and print predicted against measured")
    p.add_argument("--steps", type=positive_int, default=6,
                   help="steps per --check run (default 6; the first two are left out)")
    p.add_argument("--repeats", type=positive_int, default=3,
                   help="--check runs per schedule, each in fresh processes, schedules taken in "
                        "turn (default 3); the table shows their median and spread")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")


def what_if_command(args, out):
    pt = _binding()
    if pt is None:
        return 2
    names = "all" if args.schedules == "all" else [s.strip() for s in args.schedules.split(",")
                                                  if s.strip()]
    prof = pt.from_profile(args.profile_dir)
    rows = pt.what_if(prof, names, microbatches=args.microbatches)
    measured = {}
    notes = []
    if args.check:
        measured, notes = _check_top(pt, args, rows[:3])
    if args.json:
        json.dump({"rows": rows, "measured": measured, "profiled_step": prof.measured,
                   "dilation": {f"{st},{kd}": v for (st, kd), v in sorted(prof.dilation.items())},
                   "profiled": rows.profiled, "left_out": rows.left_out,
                   "warnings": rows.warnings, "notes": notes}, out, indent=1)
        out.write("\n")
        return 0
    say = [f"profiled: {prof.ranks} ranks, {prof.stages} stages, {prof.microbatches} "
           f"microbatches, median step {prof.measured * 1e3:.2f} ms over "
           f"{len(prof.step_times)} profiled steps; overhead "
           f"{float(prof.costs.overhead) * 1e6:.0f} us per op", _dilation_text(prof)]
    for text in say:
        out.write("\n".join(textwrap.wrap(text, 120, subsequent_indent="  ")) + "\n")
    if args.microbatches is not None and args.microbatches != prof.microbatches:
        out.write(f"predicted for {args.microbatches} microbatches\n")
    out.write(pt.format_what_if(rows, measured) + "\n")
    for note in notes:
        out.write("\n".join(textwrap.wrap(note, 120, subsequent_indent="  ")) + "\n")
    return 0


def _dilation_text(prof):
    """What the profiler added to the compute times, and whether it was taken out."""
    if not prof.dilation:
        return ("costs: the profiled steps' times, profiler included (no unprofiled reference "
                "steps recorded; profile 5 or more steps with run-torch --profile to take its "
                "share out)")
    import statistics

    factors = sorted(prof.dilation.values())
    mid = statistics.median(factors)
    return (f"costs: compute times divided by what the profiler added, measured against "
            f"{len(prof.reference_times)} unprofiled steps of the same run (it made ops "
            f"{mid - 1:+.1%} longer in the median, {factors[0] - 1:+.1%} to "
            f"{factors[-1] - 1:+.1%} over {len(factors)} stage and kind pairs)")


def _check_top(pt, args, rows):
    """Run the given rows' schedules for real on the profiled run's setup.

    Each schedule runs ``--repeats`` times in fresh processes, every schedule
    once before any runs again (a slow phase of the machine falls on all),
    ranks pinned where the CPUs allow, ``--steps`` steps without the
    profiler of which the first two are left out (``pt.timed_runs``).
    Returns the median of each schedule's run medians (s), and notes with
    the spreads.
    """
    from ..schedules.registry import build

    run_file = Path(args.profile_dir) / "pipecore-run.json"
    if not run_file.exists():
        raise InputError(f"--check needs {run_file} (written by run-torch --profile) to know the "
                         f"model and shape of the run")
    cfg = json.loads(run_file.read_text())
    notes, runs = [], {}
    todo = {}
    layers = cfg["layers"] or cfg["stages"]
    for r in rows:
        sched = build(r["schedule"], cfg["ranks"], args.microbatches or cfg["microbatches"])
        if layers % sched.stages:
            notes.append(f"{r['schedule']}: not run ({sched.stages} stages do not divide the "
                         f"model's {layers} blocks)")
            continue
        todo[r["schedule"]] = sched
    if todo:
        runs = pt.timed_runs(todo, args.repeats, warmup=2, model=cfg["model"],
                             hidden=cfg["hidden"], layers=layers, batch=cfg["batch"],
                             steps=args.steps, seed=cfg["seed"])
    measured = {name: t["measured"] for name, t in runs.items()}
    if runs:
        parts = [f"{name} {t['low'] * 1e3:.2f}-{t['high'] * 1e3:.2f} ms "
                 f"({(t['high'] - t['low']) / t['measured']:.1%})" for name, t in runs.items()]
        which = (f"steps 3-{args.steps}" if args.steps > 3 else "step 3" if args.steps == 3
                 else f"all {args.steps} steps")  # the first two are left out when there are more
        notes.append(f"measured: median of {args.repeats} run(s) per schedule, each the median of "
                     f"{which}; spread over runs: " + ", ".join(parts)
                     + ("; a difference within the spread is noise" if args.repeats > 1 else ""))
    return measured, notes

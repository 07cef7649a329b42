"""Command line: ``pipecore compare``, ``simulate``, ``report``, ``table``, ``study``,
``scan``, ``verify``, ``tune``, ``run-torch``, ``what-if``, ``list`` and ``warm``.

Each subcommand is a pair of functions side by side, one adding its
arguments to its parser and one running it, and a row of :data:`COMMANDS`,
which builds the parser and dispatches.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple, TextIO

from . import __version__
from .analysis.table import ideal_table
from .core.costs import Costs, Network
from .core.cpus import local_cpus as _local_cpus  # CPUs this process may use
from .core.ops import InputError, PipecoreError
from .core.simulate import simulate
from .schedules.registry import build, family, schedules

__all__ = ["main"]


def _positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer (got {text!r})") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (got {value})")
    return value


def _shape_args(p, chunks_default):
    p.add_argument("--devices", "-p", type=_positive_int, required=True, help="pipeline devices")
    p.add_argument("--microbatches", "-m", type=_positive_int, required=True, help="microbatches")
    p.add_argument("--chunks", "-v", type=_positive_int, default=chunks_default,
                   help="stages per device for interleaved families")


def _cost_args(p):
    g = p.add_argument_group("costs (per microbatch, per device share of the model)")
    # f = b = w = 1: the zero-bubble papers' unit setting, where splitting the
    # backward pays (with w = 0 every zero-bubble schedule looks like 1F1B).
    g.add_argument("--f", type=float, default=1.0, help="forward time (default 1)")
    g.add_argument("--b", type=float, default=1.0, help="backward-for-inputs time (default 1)")
    g.add_argument("--w", type=float, default=1.0, help="backward-for-weights time (default 1)")
    g.add_argument("--comm", type=float, default=0.0, help="latency per transfer (default 0)")
    n = p.add_argument_group("network (optional: bandwidth-limited links with contention)")
    n.add_argument("--bytes", type=float, default=None, help="bytes per transfer")
    n.add_argument("--bandwidth", type=float, default=None, help="bytes per time unit")
    n.add_argument("--latency", type=float, default=0.0, help="link latency (default 0)")


def _memory_args(p, weights=0.0):
    mem = p.add_argument_group("memory (per microbatch, per device share; limit per device)")
    mem.add_argument("--activation", type=float, default=1.0, help="activation of one F (default 1)")
    mem.add_argument("--activation-w", type=float, default=0.0,
                     help="part of it kept until W (default 0)")
    mem.add_argument("--weights", type=float, default=weights,
                     help=("weights of one device share (default 0: the limit is on activations)"
                           if weights == 0 else f"weights of one device share (default {weights:g})"))
    mem.add_argument("--memory-limit", type=float, default=None,
                     help="per-device limit on activation + weights (default none)")
    return mem


def _progress_args(p, lines=False):
    bar = p.add_mutually_exclusive_group()
    default = ("on a terminal; elsewhere (a log) a progress line every few seconds" if lines
               else "only on a terminal")
    bar.add_argument("--progress", dest="progress", action="store_true", default=None,
                     help=f"always show the progress bar (default: {default})")
    bar.add_argument("--no-progress", dest="progress", action="store_false",
                     help="never show the progress bar")


def _costs(args):
    memory = {k: getattr(args, k) for k in ("activation", "activation_w", "weights")
              if hasattr(args, k)}
    return Costs(f=args.f, b=args.b, w=args.w, comm=args.comm, **memory)


def _network(args):
    if args.bytes is None and args.bandwidth is None:
        return None
    if args.bytes is None or args.bandwidth is None:
        raise InputError("a network needs both --bytes and --bandwidth")
    return Network.uniform(args.bytes, args.bandwidth, args.latency)


def _int_list(name, text):
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--{name} must be comma-separated integers (got {text!r})") from None
    if not values or min(values) < 1:
        raise InputError(f"--{name} needs integers >= 1 (got {text!r})")
    return values


def _output_file(option, path):
    """Refuse an output file whose folder is missing, before any work is done."""
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise InputError(f"{option} {path}: is a folder, not a file")
    folder = target.parent
    if not folder.is_dir():
        raise InputError(f"{option} {path}: folder {folder} does not exist")


def _write(name, option, write):
    """Write an output file; a ValueError naming the option and path if it cannot be."""
    path = Path(name)
    if path.is_dir():
        raise InputError(f"{option} {name}: is a folder; give a file name")
    if not path.parent.is_dir():
        raise InputError(f"{option} {name}: folder {path.parent} does not exist")
    try:
        write(path)
    except OSError as exc:
        raise InputError(f"{option} {name}: cannot write ({exc.strerror or exc})") from None
    return path


#: run-torch --profile's default steps: the first sets torch's stages up and is
#: not profiled; steps 3-5 are profiled and 2, 6, 7 timed without the profiler,
#: so what-if can take out what the profiler adds to each op.
_PROFILE_STEPS = 7


def _compare_arguments(p):
    _shape_args(p, 2)
    _cost_args(p)
    p.add_argument("--memory-limit", type=float, default=None, metavar="M",
                   help="per-device memory limit in M on activation + weights (the table's peak "
                        "memory column): the headline names the fastest schedule within it, the "
                        "table marks the rows above it and report.html draws it")
    p.add_argument("--out", default="pipecore_out", help="folder for Gantt charts (default pipecore_out)")
    p.add_argument("--no-gantt", action="store_true", help="do not write Gantt charts")
    p.add_argument("--no-report", action="store_true", help="do not write report.html")
    _progress_args(p)
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")



def _cmd_compare(args, out):
    from .analysis.compare import (
        compare,
        describe_costs,
        describe_network,
        format_compare,
        headline,
        sort_rows,
    )

    limit = args.memory_limit
    if limit is not None and not (math.isfinite(limit) and limit > 0):
        raise InputError(f"--memory-limit must be a finite number > 0 in M (got {limit:g})")
    costs, network = _costs(args), _network(args)
    rows = sort_rows(compare(args.devices, args.microbatches, chunks=args.chunks, costs=costs,
                             network=network))
    from .output import MissingDependencyError
    from .output.gantt import write_gantts

    written = []
    gantt_note = None
    if not args.no_gantt:
        folder = Path(args.out)
        folder.mkdir(parents=True, exist_ok=True)
        from .core.progress import Progress, enabled

        drawn = [r for r in rows if r["result"] is not None]
        bar = Progress(len(drawn), enabled(args.progress), unit="charts")
        jobs = [(r["result"], folder / f"{r['name']}-p{args.devices}-m{args.microbatches}.png")
                for r in drawn]
        try:
            written = write_gantts(jobs, bar)
        except MissingDependencyError as exc:
            gantt_note = f"Gantt charts not written: {exc}"
    page = None
    if not args.no_report:
        from .output.report import report

        try:
            page = report(rows, Path(args.out) / "report.html", memory_limit=limit,
                          title=f"pipecore compare: p={args.devices}, m={args.microbatches}")
        except MissingDependencyError as exc:
            print(f"report.html not written: {exc}", file=sys.stderr)
    if args.json:
        clean = [{k: v for k, v in r.items() if k != "result"} for r in rows]
        if limit is not None:
            for r in clean:
                r["fits_memory_limit"] = (None if r.get("error")
                                          else bool(r["peak_memory_max"] <= limit * (1 + 1e-9)))
        c = costs
        setting = {"devices": args.devices, "microbatches": args.microbatches,
                   "chunks": args.chunks,
                   "costs": {"f": c.f, "b": c.b, "w": c.w, "comm": c.comm,
                             "activation": c.activation, "activation_w": c.activation_w,
                             "weights": c.weights},
                   "network": None if network is None else {
                       "bytes": network.bytes, "bandwidth": network.bandwidth,
                       "latency": network.latency},
                   "units": {"time": "cost units (f=1: one microbatch's forward through one "
                                     "device's share of the model)",
                             "memory": "M (the unit of activation and weights)"}}
        json.dump({"rows": clean, "headline": headline(rows, limit), "setting": setting,
                   "memory_limit": limit, "gantt": written,
                   "report": str(page) if page else None}, out, indent=2)
        out.write("\n")
    else:
        out.write(f"pipecore compare: p={args.devices} devices, m={args.microbatches} "
                  f"microbatches, v={args.chunks} chunks per device where a family "
                  "interleaves\n")
        out.write(describe_costs(costs) + "\n")
        if network is not None:
            out.write(f"network {describe_network(network)}\n")
        out.write("\n" + format_compare(rows, memory_limit=limit) + "\n")
        if written:
            out.write(f"Gantt charts: {len(written)} PNG files in {args.out}/\n")
        if page:
            out.write(f"Report (open in a browser): {page}\n")
    if gantt_note:
        print(gantt_note, file=sys.stderr)
    return 0


def _simulate_arguments(p):
    p.add_argument("name", help="schedule name (see 'pipecore list')")
    _shape_args(p, None)
    _cost_args(p)
    _memory_args(p, weights=1.0)  # Costs' default, as pc.simulate
    p.add_argument("--json", action="store_true", help="print metrics as JSON")
    p.add_argument("--parquet", metavar="PATH", help="write the op table to Parquet")
    p.add_argument("--trace", metavar="PATH", help="write a Chrome trace JSON (opens in Perfetto)")
    p.add_argument("--gantt", metavar="PATH", help="write a Gantt chart PNG")
    p.add_argument("--critical", action="store_true",
                   help="print the critical path and each device's share of it; mark it in "
                        "--trace and --gantt")



def _cmd_simulate(args, out):
    for option in ("parquet", "trace", "gantt"):
        _output_file(f"--{option}", getattr(args, option))
    if args.memory_limit is not None and not args.memory_limit > 0:
        raise InputError(f"--memory-limit must be > 0 (got {args.memory_limit:g})")
    fam = family(args.name)
    sched = build(fam.name, args.devices, args.microbatches, chunks=args.chunks)
    res = simulate(sched, _costs(args), _network(args))
    from .output import write_chrome_trace, write_gantt, write_parquet

    files = {}
    if args.parquet:
        files["parquet"] = str(write_parquet(res, args.parquet))
    if args.trace:
        files["trace"] = str(write_chrome_trace(res, args.trace, critical=args.critical))
    if args.gantt:
        files["gantt"] = str(write_gantt(res, args.gantt, critical=args.critical))
    metrics = res.metrics()
    memory = res.peak_activation + res.static_memory
    metrics["memory_max"] = float(memory.max())
    if args.memory_limit is not None:
        metrics["memory_limit"] = args.memory_limit
        metrics["fits"] = bool(memory.max() <= args.memory_limit)
    extra = {}
    if args.critical:
        from .analysis.critical import critical_path, device_share

        path = critical_path(res)
        extra["critical_path"] = {"segments": path.to_pylist(),
                                  "device_share": device_share(path, res.devices).to_pylist()}
    if args.json:
        json.dump({**metrics, **extra, "files": files}, out, indent=2)
        out.write("\n")
    else:
        # Units as in the README: time in the costs' unit, memory in M (one activation).
        units = {"makespan": "  (cost units)", "bubble_ratio": "  (idle fraction)",
                 "bubble_rate": "  (idle fraction, longest span)",
                 "peak_activation_max": "  (M)", "peak_activation_min": "  (M)"}
        for key in ("name", "devices", "microbatches", "stages", "ops", "transfers", "makespan",
                    "bubble_ratio", "bubble_rate", "peak_activation_max", "peak_activation_min"):
            value = metrics[key]
            text = f"{value:.6g}" if isinstance(value, float) else f"{value}"
            out.write(f"{key:<20} {text}{units.get(key, '')}\n")
        out.write(f"{'peak_activation':<20} "
                  f"{' '.join(f'{x:g}' for x in metrics['peak_activation'])}  (M, per device)\n")
        worst = int(memory.argmax())
        out.write(f"{'memory_max':<20} {metrics['memory_max']:.6g}  (M, peak activation + weights "
                  f"{res.static_memory[worst]:g}, device {worst})\n")
        if args.memory_limit is not None:
            verdict = "yes" if metrics["fits"] else (
                f"no: device {worst} needs {metrics['memory_max']:.6g} M")
            out.write(f"{'fits':<20} {verdict}  (limit {args.memory_limit:g} M per device)\n")
        if extra:
            _write_critical(extra["critical_path"], out)
        for kind, path in files.items():
            out.write(f"wrote {kind}: {path}\n")
    return 0


def _write_critical(critical, out):
    """The critical path as text: each device's share, then the segments."""
    segs = critical["segments"]
    out.write(f"critical path        {len(segs)} segments, from 0 to "
              f"{segs[-1]['finish']:.6g}\n")
    out.write("  device    compute   transfer    latency      total   share\n")
    for r in critical["device_share"]:
        out.write(f"  d{r['device']:<6} {r['compute']:>9.6g} {r['transfer']:>10.6g} "
                  f"{r['latency']:>10.6g} {r['total']:>10.6g} {r['share']:>7.1%}\n")
    out.write("       start     finish  element   where     op\n")
    for r in segs:
        where = (f"d{r['device']}" if r["element"] == "op"
                 else f"d{r['device']}->d{r['dst_device']}")
        label = "AR" if r["kind"] == "AR" else f"{r['kind']}{r['microbatch']}"
        out.write(f"  {r['start']:>10.6g} {r['finish']:>10.6g}  {r['element']:<9} {where:<9} "
                  f"s{r['stage']} {label}\n")


def _report_arguments(p):
    p.add_argument("target", help="a schedule name (see 'pipecore list') or a scan directory")
    p.add_argument("--devices", "-p", type=_positive_int, default=None, help="pipeline devices")
    p.add_argument("--microbatches", "-m", type=_positive_int, default=None,
                    help="microbatches")
    p.add_argument("--chunks", "-v", type=_positive_int, default=None,
                    help="stages per device for interleaved families")
    _cost_args(p)
    p.add_argument("--memory-limit", type=float, default=None,
                    help="draw this per-device limit on the memory chart")
    p.add_argument("--out", default="report.html", help="HTML file (default report.html)")



def _cmd_report(args, out):
    from .output.report import report

    target = Path(args.target)
    if target.is_dir():
        path = report(target, args.out)
    else:
        if args.target not in schedules():
            raise InputError(f"{args.target!r} is neither a schedule name (see 'pipecore list') "
                             "nor a scan directory")
        if args.devices is None or args.microbatches is None:
            raise InputError(f"report {args.target} needs --devices/-p and --microbatches/-m")
        fam = family(args.target)
        sched = build(fam.name, args.devices, args.microbatches, chunks=args.chunks)
        res = simulate(sched, _costs(args), _network(args))
        path = report(res, args.out, memory_limit=args.memory_limit)
    out.write(f"wrote {path}\n")
    return 0


def _table_arguments(p):
    p.add_argument("name")
    _shape_args(p, None)
    p.add_argument("--max-slots", type=_positive_int, default=None, help="show only the first N slots")



def _cmd_table(args, out):
    fam = family(args.name)
    sched = build(fam.name, args.devices, args.microbatches, chunks=args.chunks)
    table = ideal_table(sched)
    out.write(f"{fam.name}: {table.length} slots (F=1, B=1, W=1, BW=2)\n")
    out.write(table.render(args.max_slots) + "\n")
    return 0


def _study_arguments(p):
    p.add_argument("--devices", default="4,8", help="comma-separated device counts (default 4,8)")
    p.add_argument("--microbatches", default="8,16,32,64,128,256",
                   help="comma-separated microbatch counts (default 8,16,32,64,128,256)")
    p.add_argument("--out", default="pipecore_out", help="folder for study.parquet and plots")
    p.add_argument("--no-plot", action="store_true", help="do not draw the plots")
    p.add_argument("--asymmetric", action="store_true",
                   help="also search asymmetric Chimera-style placements (down split, up-pipeline "
                        "placement, layer shares) and write asymmetric.parquet and "
                        "asymmetric.txt; the fifth finding needs it")
    p.add_argument("--asymmetric-microbatches", default="4,8,16,32,64",
                   help="microbatch counts of the asymmetric search (default 4,8,16,32,64)")

    _progress_args(p, lines=True)



def _study_progress(args):
    """The study's progress mode: the flag, else lines when stderr is no terminal (logs)."""
    if args.progress is not None:
        return args.progress
    return None if sys.stderr.isatty() else "lines"


def _cmd_study(args, out):
    import time

    import pyarrow.parquet as pq

    from .analysis.findings import findings, format_findings
    from .analysis.study import detail, study, summarize
    from .output.plots import plot_study

    t0 = time.perf_counter()
    devices = _int_list("devices", args.devices)
    microbatches = _int_list("microbatches", args.microbatches)
    asym_mbs = (_int_list("asymmetric-microbatches", args.asymmetric_microbatches)
                if args.asymmetric else None)
    progress = _study_progress(args)
    table = study(devices, microbatches, progress=progress)
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, folder / "study.parquet")
    out.write(summarize(table) + "\n\n")
    out.write(detail(table) + "\n")
    written = [f"{folder / 'study.parquet'} ({table.num_rows} rows)"]
    asym = None
    if args.asymmetric:
        import warnings

        from .schedules.chimera import PlacementWarning
        from .search.asymmetric import asymmetric_study, summarize_asymmetric

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", PlacementWarning)  # the search tries shared devices
            asym, info = asymmetric_study(devices, asym_mbs, progress=progress)
        pq.write_table(asym, folder / "asymmetric.parquet")
        (folder / "asymmetric.txt").write_text(summarize_asymmetric(asym, info) + "\n")
        out.write("\n" + summarize_asymmetric(asym, info, setup=False) + "\n")
        written += [f"{folder / 'asymmetric.parquet'} ({asym.num_rows} rows)",
                    str(folder / "asymmetric.txt")]
    text = format_findings(findings(table, asym))
    (folder / "findings.txt").write_text(text + "\n")
    out.write("\n" + text + "\n\n")
    written.append(str(folder / "findings.txt"))
    if not args.no_plot:
        from .output import MissingDependencyError

        try:
            written += plot_study(table, folder / "study.png")
        except MissingDependencyError as exc:
            print(f"plots not written: {exc}", file=sys.stderr)
    for path in written:
        out.write(f"wrote {path}\n")
    out.write(f"study took {time.perf_counter() - t0:.1f} s\n")
    return 0


def _scan_arguments(p):
    p.add_argument("grid", help="grid file (TOML; see README 'Scans')")
    p.add_argument("--out", required=True, help="output folder (one Parquet file per part)")
    p.add_argument("--resume", action="store_true", help="continue a scan of the same grid in --out")
    p.add_argument("--backend", choices=("local", "ray"), default="local",
                   help="evaluate parts here (default) or as Ray tasks (pipecore[ray])")
    p.add_argument("--address", default=None,
                   help="Ray cluster address ('auto' for a running one; default: start one)")
    bar = p.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_true", default=None,
                     help="always show the progress bar (default: only on a terminal)")
    bar.add_argument("--no-progress", dest="progress", action="store_false",
                     help="never show the progress bar")
    p.add_argument("--no-plot", action="store_true", help="do not draw _pareto.png")



def _cmd_scan(args, out):
    import warnings

    from .scan.scans import ScanWarning, write_scan

    try:
        with warnings.catch_warnings():  # restores showwarning on the way out
            warnings.simplefilter("always", ScanWarning)
            shown = warnings.showwarning

            def show(message, category, filename, lineno, file=None, line=None):
                if issubclass(category, ScanWarning):  # one plain line, as it happens
                    print(f"pipecore: set aside {message}", file=sys.stderr)
                else:
                    shown(message, category, filename, lineno, file, line)

            warnings.showwarning = show
            summary = write_scan(args.grid, args.out, resume=args.resume, backend=args.backend,
                                 address=args.address, progress=args.progress,
                                 plot=not args.no_plot)
    except KeyboardInterrupt:
        print(f"\npipecore: scan interrupted; finished parts are kept in {args.out}: "
              f"rerun with --resume to continue", file=sys.stderr)
        return 130
    out.write(f"{summary['rows']:,} rows in {summary['parts']} parts in {args.out} "
              f"({summary['parts_written']} parts written now in {summary['seconds']:.1f} s")
    if summary["configs_per_s"]:
        out.write(f", {summary['configs_per_s']:,.0f} configs/s")
    out.write(")\n")
    for shape, why in summary["skipped"].items():
        out.write(f"skipped {shape}: {why}\n")
    if summary.get("rows_with_error_written"):
        out.write(f"{summary['rows_with_error_written']:,} rows written now have no answer "
                  f"(their 'error' column says why; their time columns are null)\n")
    if summary.get("plot"):
        out.write(f"wrote {summary['plot']}\n")
    return 0


def _verify_arguments(p):
    p.add_argument("folder", help="the scan's --out folder")



def _cmd_verify(args, out):
    from .scan.scans import verify_scan

    check = verify_scan(args.folder)
    out.write(check.report() + "\n")
    return 0 if check.ok else 1


def _tune_arguments(p):
    p.add_argument("--devices", "-p", type=_positive_int, required=True, help="pipeline devices")
    p.add_argument("--microbatches", "-m", type=_positive_int, required=True, help="microbatches")
    _cost_args(p)
    mem = _memory_args(p)
    mem.add_argument("--checkpoint", type=float, default=0.0,
                     help="memory a recomputed F keeps (default 0)")
    mem.add_argument("--r", type=float, default=None,
                     help="time of a recompute (R) op (default: --f)")
    mem.add_argument("--no-recompute", action="store_true",
                     help="do not try activation recompute for schedules that do not fit")
    mem.add_argument("--offload", type=float, default=None,
                     help="time of one activation copy to host or back over a host link; "
                          "enables offload candidates (default: none)")
    mem.add_argument("--host-link-devices", type=_positive_int, default=1,
                     help="devices sharing one host link, copies one at a time (default 1)")
    p.add_argument("--families", default=None, help="comma-separated families (default all)")
    p.add_argument("--objective", choices=("makespan", "span"), default="makespan",
                   help="minimise the makespan (default) or the longest per-device span "
                        "(the zero-bubble papers' cost)")
    p.add_argument("--top", type=_positive_int, default=10, help="rows in the report (default 10)")
    p.add_argument("--json", action="store_true", help="print the winner and candidates as JSON")
    p.add_argument("--actions", action="store_true", help="also print the winner's programs")
    _progress_args(p)



def _cmd_tune(args, out):
    from .search.tune import TuneError, tune

    costs = Costs(f=args.f, b=args.b, w=args.w, comm=args.comm, activation=args.activation,
                  activation_w=args.activation_w, weights=args.weights, r=args.r,
                  checkpoint=args.checkpoint, offload=args.offload,
                  host_link_devices=args.host_link_devices)
    families = None if args.families is None else [x for x in args.families.split(",") if x]
    try:
        best = tune(args.devices, args.microbatches, costs, memory_limit=args.memory_limit,
                    network=_network(args), families=families, objective=args.objective,
                    recompute=not args.no_recompute, progress=args.progress)
    except TuneError as exc:
        print(f"pipecore: {exc}", file=sys.stderr)
        return 1
    if args.json:
        json.dump({"winner": best.label, "makespan": best.result.makespan,
                   "bubble_rate": best.result.bubble_rate,
                   "memory": float((best.result.peak_activation
                                    + best.result.static_memory).max()),
                   "actions": best.schedule.to_actions(),
                   "candidates": best.candidates.to_pylist()}, out, indent=1, default=str)
        out.write("\n")
        return 0
    out.write(best.report(args.top) + "\n")
    if args.actions:
        for d, prog in best.schedule.to_actions().items():
            out.write(f"device {d}: {' '.join(prog)}\n")
    return 0


def _cmd_list(args, out):
    for name in schedules():
        out.write(f"{name:<18} {family(name).summary}\n")
    return 0


def _cmd_warm(args, out):
    from .warm import warm

    warm(out)
    return 0


def _export_arguments(p):
    p.add_argument("name", help="schedule name (see 'pipecore list')")
    _shape_args(p, None)
    p.add_argument("--csv", metavar="FILE", default=None,
                   help="torch's compute_only CSV, one line per rank (needs pipecore[torch]); "
                        "run it with pipecore run-torch FILE --ranks P")
    p.add_argument("--actions", metavar="FILE.json", default=None,
                   help="per-device programs as JSON, {device: [\"0F0\", \"0B0\", ...]} "
                        "(Schedule.to_actions(); pipecore.from_actions reads it back)")



def _cmd_export(args, out):
    if args.csv is None and args.actions is None:
        raise InputError("export needs --csv FILE (what run-torch reads) and/or "
                         "--actions FILE.json (the per-device programs)")
    fam = family(args.name)
    sched = build(fam.name, args.devices, args.microbatches, chunks=args.chunks)
    shape = (f"{sched.name}: {sched.devices} devices, {sched.stages} stages, "
             f"{sched.microbatches} microbatches")
    if args.csv is not None:
        try:
            from pipecore.bindings import torch as pt
        except ImportError as exc:
            print(f"pipecore: --csv: {exc}", file=sys.stderr)
            return 2
        pt.validate(sched)  # torch's own checks, so that run-torch will take the file
        path = _write(args.csv, "--csv", lambda p: pt.to_csv(sched, p))
        out.write(f"wrote {path} ({shape}; torch's compute_only CSV, line r is rank r)\n")
        out.write(f"run it: pipecore run-torch {path} --ranks {sched.devices}\n")
    if args.actions is not None:
        # One device per line; JSON's keys are strings ("0", "1", ...), which from_actions takes.
        programs = "{\n" + ",\n".join(f" {json.dumps(str(d))}: {json.dumps(prog)}"
                                       for d, prog in sched.to_actions().items()) + "\n}\n"
        path = _write(args.actions, "--actions", lambda p: p.write_text(programs))
        shared = any(len(devs) > 1 for devs in sched.stage_devices)
        out.write(f"wrote {path} ({shape}; per-device programs, pipecore's kinds F, B, W, BW)\n")
        out.write(f"read it in Python: pc.from_actions(json.load(open({str(path)!r}))"
                  f"{', replicated=True' if shared else ''})\n")
    return 0


def _run_torch_arguments(p):
    p.add_argument("csv", help="compute_only schedule CSV (pipecore export SCHEDULE -p P -m M "
                               "--csv FILE, or pipecore.bindings.torch.to_csv)")
    p.add_argument("--ranks", type=_positive_int, required=True, help="processes (one per CSV line)")
    p.add_argument("--model", default="mlp", choices=("mlp", "tiny-transformer"),
                   help="model split into stages (default mlp)")
    p.add_argument("--layers", type=_positive_int, default=None,
                   help="blocks in the whole model (default one per stage; a multiple of stages)")
    p.add_argument("--profile", default=None, metavar="DIR",
                   help="write per-rank torch.profiler traces (rankN.json) to DIR, for pipecore "
                        "what-if; runs of 5 or more steps also time steps without the profiler, "
                        "so what-if can take out what it adds")
    p.add_argument("--hidden", type=_positive_int, default=32, help="layer width (default 32)")
    p.add_argument("--batch", type=_positive_int, default=None,
                   help="rows per step (default 2 per microbatch)")
    p.add_argument("--steps", type=_positive_int, default=None,
                   help=f"steps to run (default 1; {_PROFILE_STEPS} with --profile: one to set "
                        f"torch up, 3 profiled, 3 timed without the profiler)")
    p.add_argument("--seed", type=int, default=0, help="seed of weights and data (default 0)")
    p.add_argument("--no-check", action="store_true",
                   help="do not compare gradients with the non-pipelined model")
    p.add_argument("--json", action="store_true", help="print the result as JSON")



def _cmd_run_torch(args, out):
    try:
        from pipecore.bindings import torch as pt
        from pipecore.bindings._profile import RUN_FILE, oversubscribed
    except ImportError as exc:
        print(f"pipecore: {exc}", file=sys.stderr)
        return 2
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
    warnings = [w for w in [oversubscribed(res.ranks, _local_cpus(), "this machine")] if w]
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
            out.write(f"{key:<14} {value}\n")
        for w in warnings:
            out.write(f"warning: {w}\n")
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


def _what_if_arguments(p):
    p.add_argument("profile_dir", help="folder of per-rank traces (run-torch --profile DIR)")
    p.add_argument("--schedules", default="all",
                   help="'all' or comma-separated family names (default all)")
    p.add_argument("--microbatches", type=_positive_int, default=None,
                   help="microbatches to predict for (default: the profiled run's)")
    p.add_argument("--check", action="store_true",
                   help="run the top three for real (needs the run's pipecore-run.json and "
                        "pipecore[torch]) and print predicted against measured")
    p.add_argument("--steps", type=_positive_int, default=6,
                   help="steps per --check run (default 6; the first two are left out)")
    p.add_argument("--repeats", type=_positive_int, default=3,
                   help="--check runs per schedule, each in fresh processes, schedules taken in "
                        "turn (default 3); the table shows their median and spread")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")



def _cmd_what_if(args, out):
    try:
        from pipecore.bindings import torch as pt
    except ImportError as exc:
        print(f"pipecore: {exc}", file=sys.stderr)
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
    out.write(f"profiled: {prof.ranks} ranks, {prof.stages} stages, {prof.microbatches} "
              f"microbatches, median step {prof.measured * 1e3:.2f} ms over "
              f"{len(prof.step_times)} profiled steps; overhead "
              f"{float(prof.costs.overhead) * 1e6:.0f} us per op\n")
    out.write(_dilation_text(prof) + "\n")
    if args.microbatches is not None and args.microbatches != prof.microbatches:
        out.write(f"predicted for {args.microbatches} microbatches\n")
    out.write(pt.format_what_if(rows, measured) + "\n")
    for note in notes:
        out.write(note + "\n")
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
    profiler of which the first two are left out. Returns the median of
    each schedule's run medians (s), and notes with the spreads.
    """
    import statistics

    from .schedules.registry import build

    run_file = Path(args.profile_dir) / "pipecore-run.json"
    if not run_file.exists():
        raise InputError(f"--check needs {run_file} (written by run-torch --profile) to know the "
                         f"model and shape of the run")
    cfg = json.loads(run_file.read_text())
    notes, runs = [], {}
    todo = []
    for r in rows:
        sched = build(r["schedule"], cfg["ranks"], args.microbatches or cfg["microbatches"])
        layers = cfg["layers"] or cfg["stages"]
        if layers % sched.stages:
            notes.append(f"{r['schedule']}: not run ({sched.stages} stages do not divide the "
                         f"model's {layers} blocks)")
            continue
        todo.append((r["schedule"], sched, layers))
    for _ in range(args.repeats):
        for name, sched, layers in todo:
            res = pt.run(sched, model=cfg["model"], hidden=cfg["hidden"], layers=layers,
                         batch=cfg["batch"], steps=args.steps, seed=cfg["seed"], check=False)
            runs.setdefault(name, []).append(res.iteration_time(warmup=2))
    measured = {name: statistics.median(t) for name, t in runs.items()}
    if runs:
        parts = [f"{name} {min(t) * 1e3:.2f}-{max(t) * 1e3:.2f} ms "
                 f"({(max(t) - min(t)) / measured[name]:.1%})" for name, t in runs.items()]
        which = (f"steps 3-{args.steps}" if args.steps > 3 else "step 3" if args.steps == 3
                 else f"all {args.steps} steps")  # the first two are left out when there are more
        notes.append(f"measured: median of {args.repeats} run(s) per schedule, each the median of "
                     f"{which}; spread over runs: " + ", ".join(parts)
                     + ("; a difference within the spread is noise" if args.repeats > 1 else ""))
    return measured, notes


def _no_arguments(p):
    """A subcommand without options of its own."""


class _Command(NamedTuple):
    """A subcommand: its line in ``pipecore --help``, what adds its
    arguments to its parser, and what runs it (``run(args, out)`` returns
    the exit status)."""

    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, TextIO], int]


#: The subcommands, in the order ``pipecore --help`` lists them.
COMMANDS = {
    "compare": _Command("every schedule three ways: formula, ideal table, simulation",
                        _compare_arguments, _cmd_compare),
    "simulate": _Command("simulate one schedule", _simulate_arguments, _cmd_simulate),
    "report": _Command("write a self-contained HTML report of one schedule (FAMILY -p P -m M) or "
                       "of a scan (its Parquet directory)", _report_arguments, _cmd_report),
    "table": _Command("print the idealised devices x time-slots table", _table_arguments,
                      _cmd_table),
    "study": _Command("every family three ways over a grid of compute and network speeds "
                      "(x10 = ten times faster)", _study_arguments, _cmd_study),
    "scan": _Command("evaluate a grid of configurations into a Parquet dataset", _scan_arguments,
                     _cmd_scan),
    "verify": _Command("check a scan's Parquet folder: every part present, whole and of this "
                       "scan (exit 1 naming each bad part)", _verify_arguments, _cmd_verify),
    "tune": _Command("the fastest schedule that fits a per-device memory limit", _tune_arguments,
                     _cmd_tune),
    "list": _Command("list schedule names", _no_arguments, _cmd_list),
    "warm": _Command("compile every Numba kernel into the cache now (for container images and "
                     "CI; prints seconds per step)", _no_arguments, _cmd_warm),
    "export": _Command("write a schedule as the CSV run-torch reads (torch's compute_only "
                       "format) and/or as per-device actions (JSON)", _export_arguments,
                       _cmd_export),
    "run-torch": _Command("run a schedule CSV for real with PyTorch on CPU ranks (gloo; needs "
                          "pipecore[torch])", _run_torch_arguments, _cmd_run_torch),
    "what-if": _Command("rank every schedule family by its predicted step time from one "
                        "profiled run's torch.profiler traces", _what_if_arguments, _cmd_what_if),
}


def _parser():
    parser = argparse.ArgumentParser(prog="pipecore", description=(
        "Build, validate and simulate pipeline-parallel training schedules."))
    parser.add_argument("--version", action="version", version=f"pipecore {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        command.arguments(sub.add_parser(name, help=command.help))
    return parser


def _suggest(word, choices):
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _check_flags(parser, argv):
    """Reject a mistyped subcommand or flag with the subcommand's own usage
    and the closest valid name.

    argparse reports an unknown flag of a subcommand through the top-level
    parser (its usage lists only the subcommands), and reports a missing
    required flag before an unknown one, so ``--devics 8`` only says that
    ``--devices`` is required.
    """
    commands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    rest = list(argv)
    while rest and rest[0].startswith("-"):  # the top level's own flags take no values
        rest.pop(0)
    if not rest:
        return
    command, rest = rest[0], rest[1:]
    sub = commands.choices.get(command)
    if sub is None:
        parser.error(f"unknown command {command!r} (choose from {', '.join(commands.choices)})"
                     + _suggest(command, commands.choices))
    known = sub._option_string_actions
    longs = [o for o in known if o.startswith("--")]
    for token in rest:
        if token == "--":
            break
        if token.startswith("--"):
            name = token.split("=", 1)[0]
            if name in known or sum(o.startswith(name) for o in longs) == 1:
                continue  # exact, or an abbreviation argparse accepts
            if any(o.startswith(name) for o in longs):
                continue  # ambiguous: argparse says which flags it could mean
            sub.error(f"unrecognized argument {name}" + _suggest(name, longs))
        elif (len(token) > 1 and token[0] == "-" and token[1].isalpha()
              and token[:2] not in known):
            sub.error(f"unrecognized argument {token}"
                      + _suggest(token[:2], [o for o in known if not o.startswith("--")]))


def main(argv=None, out=None) -> int:
    """Run the command line.

    Parameters
    ----------
    argv : list of str, optional
        Arguments (defaults to ``sys.argv[1:]``).
    out : file-like, optional
        Where results go (defaults to stdout).

    Returns
    -------
    int
        Exit status: 0 on success, 2 on bad input.

    Raises
    ------
    SystemExit
        From argparse on malformed arguments (status 2).
    """
    out = sys.stdout if out is None else out
    parser = _parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    _check_flags(parser, argv)
    args = parser.parse_args(argv)
    try:
        return COMMANDS[args.command].run(args, out)
    except (PipecoreError, ValueError, MemoryError) as exc:  # pipecore's refusals, and numpy's
        print(f"pipecore: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # `pipecore compare | head`: the reader left; nothing more to say
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush is quiet
        except (OSError, ValueError):  # a stdout without a file descriptor (tests)
            pass
        return 141
    except OSError as exc:  # a file or folder: one line that names it
        where = f"{exc.filename}: " if getattr(exc, "filename", None) else ""
        print(f"pipecore: error: {where}{exc.strerror or exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

"""Command line: ``pipecore compare``, ``simulate``, ``table``, ``study``, ``scan``, ``tune``
and ``list``."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
from pathlib import Path

from . import __version__
from .analysis.table import ideal_table
from .core.costs import Costs, Network
from .core.cpus import local_cpus as _local_cpus  # CPUs this process may use
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


def _progress_args(p, lines=False):
    bar = p.add_mutually_exclusive_group()
    default = ("on a terminal; elsewhere (a log) a progress line every few seconds" if lines
               else "only on a terminal")
    bar.add_argument("--progress", dest="progress", action="store_true", default=None,
                     help=f"always show the progress bar (default: {default})")
    bar.add_argument("--no-progress", dest="progress", action="store_false",
                     help="never show the progress bar")


def _costs(args):
    return Costs(f=args.f, b=args.b, w=args.w, comm=args.comm)


def _network(args):
    if args.bytes is None and args.bandwidth is None:
        return None
    if args.bytes is None or args.bandwidth is None:
        raise ValueError("a network needs both --bytes and --bandwidth")
    return Network.uniform(args.bytes, args.bandwidth, args.latency)


def _parser():
    parser = argparse.ArgumentParser(prog="pipecore", description=(
        "Build, validate and simulate pipeline-parallel training schedules."))
    parser.add_argument("--version", action="version", version=f"pipecore {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    c = sub.add_parser("compare", help="every schedule three ways: formula, ideal table, simulation")
    _shape_args(c, 2)
    _cost_args(c)
    c.add_argument("--out", default="pipecore_out", help="folder for Gantt charts (default pipecore_out)")
    c.add_argument("--no-gantt", action="store_true", help="do not write Gantt charts")
    c.add_argument("--no-report", action="store_true", help="do not write report.html")
    _progress_args(c)
    c.add_argument("--json", action="store_true", help="print JSON instead of a table")

    s = sub.add_parser("simulate", help="simulate one schedule")
    s.add_argument("name", help="schedule name (see 'pipecore list')")
    _shape_args(s, None)
    _cost_args(s)
    s.add_argument("--json", action="store_true", help="print metrics as JSON")
    s.add_argument("--parquet", metavar="PATH", help="write the op table to Parquet")
    s.add_argument("--trace", metavar="PATH", help="write a Chrome trace JSON (opens in Perfetto)")
    s.add_argument("--gantt", metavar="PATH", help="write a Gantt chart PNG")
    s.add_argument("--critical", action="store_true",
                   help="print the critical path and each device's share of it; mark it in "
                        "--trace and --gantt")

    rp = sub.add_parser("report", help="write a self-contained HTML report of one schedule "
                        "(FAMILY -p P -m M) or of a scan (its Parquet directory)")
    rp.add_argument("target", help="a schedule name (see 'pipecore list') or a scan directory")
    rp.add_argument("--devices", "-p", type=_positive_int, default=None, help="pipeline devices")
    rp.add_argument("--microbatches", "-m", type=_positive_int, default=None,
                    help="microbatches")
    rp.add_argument("--chunks", "-v", type=_positive_int, default=None,
                    help="stages per device for interleaved families")
    _cost_args(rp)
    rp.add_argument("--memory-limit", type=float, default=None,
                    help="draw this per-device limit on the memory chart")
    rp.add_argument("--out", default="report.html", help="HTML file (default report.html)")

    t = sub.add_parser("table", help="print the idealised devices x time-slots table")
    t.add_argument("name")
    _shape_args(t, None)
    t.add_argument("--max-slots", type=_positive_int, default=None, help="show only the first N slots")

    y = sub.add_parser("study", help="every family three ways over a grid of compute and network "
                                     "speeds (x10 = ten times faster)")
    y.add_argument("--devices", default="4,8", help="comma-separated device counts (default 4,8)")
    y.add_argument("--microbatches", default="8,16,32,64,128,256",
                   help="comma-separated microbatch counts (default 8,16,32,64,128,256)")
    y.add_argument("--out", default="pipecore_out", help="folder for study.parquet and plots")
    y.add_argument("--no-plot", action="store_true", help="do not draw the plots")
    y.add_argument("--asymmetric", action="store_true",
                   help="also search asymmetric Chimera-style placements (down split, up-pipeline "
                        "placement, layer shares) and write asymmetric.parquet and "
                        "asymmetric.txt; the fifth finding needs it")
    y.add_argument("--asymmetric-microbatches", default="4,8,16,32,64",
                   help="microbatch counts of the asymmetric search (default 4,8,16,32,64)")

    _progress_args(y, lines=True)

    g = sub.add_parser("scan", help="evaluate a grid of configurations into a Parquet dataset")
    g.add_argument("grid", help="grid file (TOML; see README 'Scans')")
    g.add_argument("--out", required=True, help="output folder (one Parquet file per part)")
    g.add_argument("--resume", action="store_true", help="continue a scan of the same grid in --out")
    g.add_argument("--backend", choices=("local", "ray"), default="local",
                   help="evaluate parts here (default) or as Ray tasks (pipecore[ray])")
    g.add_argument("--address", default=None,
                   help="Ray cluster address ('auto' for a running one; default: start one)")
    bar = g.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_true", default=None,
                     help="always show the progress bar (default: only on a terminal)")
    bar.add_argument("--no-progress", dest="progress", action="store_false",
                     help="never show the progress bar")
    g.add_argument("--no-plot", action="store_true", help="do not draw _pareto.png")

    u = sub.add_parser("tune", help="the fastest schedule that fits a per-device memory limit")
    u.add_argument("--devices", "-p", type=_positive_int, required=True, help="pipeline devices")
    u.add_argument("--microbatches", "-m", type=_positive_int, required=True, help="microbatches")
    _cost_args(u)
    mem = u.add_argument_group("memory (per microbatch, per device share; limit per device)")
    mem.add_argument("--activation", type=float, default=1.0, help="activation of one F (default 1)")
    mem.add_argument("--activation-w", type=float, default=0.0,
                     help="part of it kept until W (default 0)")
    mem.add_argument("--weights", type=float, default=0.0,
                     help="weights of one device share (default 0: the limit is on activations)")
    mem.add_argument("--memory-limit", type=float, default=None,
                     help="per-device limit on activation + weights (default none)")
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
    u.add_argument("--families", default=None, help="comma-separated families (default all)")
    u.add_argument("--objective", choices=("makespan", "span"), default="makespan",
                   help="minimise the makespan (default) or the longest per-device span "
                        "(the zero-bubble papers' cost)")
    u.add_argument("--top", type=_positive_int, default=10, help="rows in the report (default 10)")
    u.add_argument("--json", action="store_true", help="print the winner and candidates as JSON")
    u.add_argument("--actions", action="store_true", help="also print the winner's programs")
    _progress_args(u)

    sub.add_parser("list", help="list schedule names")
    sub.add_parser("warm", help="compile every Numba kernel into the cache now (for container "
                                "images and CI; prints seconds per step)")

    r = sub.add_parser("run-torch", help="run a schedule CSV for real with PyTorch on CPU ranks "
                                         "(gloo; needs pipecore[torch])")
    r.add_argument("csv", help="compute_only schedule CSV (pipecore.bindings.torch.to_csv)")
    r.add_argument("--ranks", type=_positive_int, required=True, help="processes (one per CSV line)")
    r.add_argument("--model", default="mlp", choices=("mlp", "tiny-transformer"),
                   help="model split into stages (default mlp)")
    r.add_argument("--layers", type=_positive_int, default=None,
                   help="blocks in the whole model (default one per stage; a multiple of stages)")
    r.add_argument("--profile", default=None, metavar="DIR",
                   help="write per-rank torch.profiler traces (rankN.json) of the steps after the "
                        "first to DIR, for pipecore what-if")
    r.add_argument("--hidden", type=_positive_int, default=32, help="layer width (default 32)")
    r.add_argument("--batch", type=_positive_int, default=None,
                   help="rows per step (default 2 per microbatch)")
    r.add_argument("--steps", type=_positive_int, default=1, help="steps to run (default 1)")
    r.add_argument("--seed", type=int, default=0, help="seed of weights and data (default 0)")
    r.add_argument("--no-check", action="store_true",
                   help="do not compare gradients with the non-pipelined model")
    r.add_argument("--json", action="store_true", help="print the result as JSON")

    w = sub.add_parser("what-if", help="rank every schedule family by its predicted step time "
                                       "from one profiled run's torch.profiler traces")
    w.add_argument("profile_dir", help="folder of per-rank traces (run-torch --profile DIR)")
    w.add_argument("--schedules", default="all",
                   help="'all' or comma-separated family names (default all)")
    w.add_argument("--microbatches", type=_positive_int, default=None,
                   help="microbatches to predict for (default: the profiled run's)")
    w.add_argument("--check", action="store_true",
                   help="run the top three for real (needs the run's pipecore-run.json and "
                        "pipecore[torch]) and print predicted against measured")
    w.add_argument("--steps", type=_positive_int, default=6,
                   help="steps per --check run (default 6; the first two are left out)")
    w.add_argument("--json", action="store_true", help="print the rows as JSON")
    return parser


def _draw_gantts(jobs, bar):
    """Draw the charts; from four charts on, where ``os.fork`` exists and
    two CPUs are free to us, a forked child draws every other one.

    The parent draws the first chart before the fork, so the child starts
    with matplotlib imported and its fonts loaded (an earlier attempt whose
    workers imported matplotlib again was slower than one process). The
    child reports each chart it finished on a pipe; whatever it did not
    finish (it failed or was killed) the parent draws itself, so an error
    surfaces here as in one process.
    """
    from .output.writers import write_gantt

    def one(i):
        result, path = jobs[i]
        return str(write_gantt(result, path))

    n = len(jobs)
    out = [None] * n
    done = 0

    def tick(i, path):
        nonlocal done
        out[i] = path
        done += 1
        bar.update(1, final=done == n)

    if n < 4 or not hasattr(os, "fork") or _local_cpus() < 2:
        for i in range(n):
            tick(i, one(i))
        return out
    tick(0, one(0))
    read_end, write_end = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:  # child: the odd charts, then leave without Python's exit handlers
        code = 0
        try:
            os.close(read_end)
            for i in range(1, n, 2):
                one(i)
                os.write(write_end, i.to_bytes(4, "little"))
        except BaseException:  # noqa: BLE001 - the parent redraws it and reports
            code = 1
        finally:
            os._exit(code)
    os.close(write_end)
    try:
        for i in range(2, n, 2):
            tick(i, one(i))
        pending = b""
        while True:  # the child's charts, as it finishes them
            chunk = os.read(read_end, 4096)
            if not chunk:
                break
            pending += chunk
            whole = len(pending) // 4 * 4
            for k in range(0, whole, 4):
                i = int.from_bytes(pending[k:k + 4], "little")
                tick(i, str(Path(jobs[i][1])))
            pending = pending[whole:]
    except BaseException:
        os.kill(pid, signal.SIGKILL)
        raise
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    for i in range(n):
        if out[i] is None:
            tick(i, one(i))
    return out


def _cmd_compare(args, out):
    from .analysis.compare import compare, format_compare

    rows = compare(args.devices, args.microbatches, chunks=args.chunks, costs=_costs(args),
                   network=_network(args))
    from .output.writers import MissingDependencyError

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
            written = _draw_gantts(jobs, bar)
        except MissingDependencyError as exc:
            gantt_note = f"Gantt charts not written: {exc}"
    page = None
    if not args.no_report:
        from .output.report import report

        try:
            page = report(rows, Path(args.out) / "report.html",
                          title=f"pipecore compare: p={args.devices}, m={args.microbatches}")
        except MissingDependencyError as exc:
            print(f"report.html not written: {exc}", file=sys.stderr)
    if args.json:
        clean = [{k: v for k, v in r.items() if k != "result"} for r in rows]
        json.dump({"rows": clean, "gantt": written, "report": str(page) if page else None},
                  out, indent=2)
        out.write("\n")
    else:
        out.write(f"p={args.devices} m={args.microbatches} costs f={args.f:g} b={args.b:g} "
                  f"w={args.w:g} comm={args.comm:g}\n")
        out.write(format_compare(rows) + "\n")
        if written:
            out.write(f"Gantt charts: {len(written)} PNG files in {args.out}/\n")
        if page:
            out.write(f"Report (open in a browser): {page}\n")
    if gantt_note:
        print(gantt_note, file=sys.stderr)
    return 0


def _cmd_report(args, out):
    from .output.report import report

    target = Path(args.target)
    if target.is_dir():
        path = report(target, args.out)
    else:
        if args.target not in schedules():
            raise ValueError(f"{args.target!r} is neither a schedule name (see 'pipecore list') "
                             "nor a scan directory")
        if args.devices is None or args.microbatches is None:
            raise ValueError(f"report {args.target} needs --devices/-p and --microbatches/-m")
        fam = family(args.target)
        sched = build(fam.name, args.devices, args.microbatches, chunks=args.chunks)
        res = simulate(sched, _costs(args), _network(args))
        path = report(res, args.out, memory_limit=args.memory_limit)
    out.write(f"wrote {path}\n")
    return 0


def _cmd_simulate(args, out):
    fam = family(args.name)
    sched = build(fam.name, args.devices, args.microbatches, chunks=args.chunks)
    res = simulate(sched, _costs(args), _network(args))
    from .output import writers as output

    files = {}
    if args.parquet:
        files["parquet"] = str(output.write_parquet(res, args.parquet))
    if args.trace:
        files["trace"] = str(output.write_chrome_trace(res, args.trace, critical=args.critical))
    if args.gantt:
        files["gantt"] = str(output.write_gantt(res, args.gantt, critical=args.critical))
    metrics = res.metrics()
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


def _cmd_table(args, out):
    fam = family(args.name)
    sched = build(fam.name, args.devices, args.microbatches, chunks=args.chunks)
    table = ideal_table(sched)
    out.write(f"{fam.name}: {table.length} slots (F=1, B=1, W=1, BW=2)\n")
    out.write(table.render(args.max_slots) + "\n")
    return 0


def _int_list(name, text):
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--{name} must be comma-separated integers (got {text!r})") from None
    if not values or min(values) < 1:
        raise ValueError(f"--{name} needs integers >= 1 (got {text!r})")
    return values


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
        from .output.writers import MissingDependencyError

        try:
            written += plot_study(table, folder / "study.png")
        except MissingDependencyError as exc:
            print(f"plots not written: {exc}", file=sys.stderr)
    for path in written:
        out.write(f"wrote {path}\n")
    out.write(f"study took {time.perf_counter() - t0:.1f} s\n")
    return 0


def _cmd_scan(args, out):
    from .scan.scans import write_scan

    try:
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
    if summary.get("plot"):
        out.write(f"wrote {summary['plot']}\n")
    return 0


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


def _cmd_run_torch(args, out):
    try:
        from pipecore.bindings import torch as pt
    except ImportError as exc:
        print(f"pipecore: {exc}", file=sys.stderr)
        return 2
    res = pt.run(args.csv, ranks=args.ranks, model=args.model, hidden=args.hidden, batch=args.batch,
                 steps=args.steps, seed=args.seed, check=not args.no_check, layers=args.layers,
                 profile=args.profile)
    summary = {"csv": args.csv, "ranks": res.ranks, "stages": res.stages,
               "microbatches": res.microbatches, "grads_match": res.grads_match,
               "max_abs_error": res.max_abs_error, "step_times": res.step_times}
    if args.json:
        json.dump(summary, out, indent=1)
        out.write("\n")
    else:
        for key, value in summary.items():
            out.write(f"{key:<14} {value}\n")
    return 1 if res.grads_match is False else 0


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
                   "notes": notes}, out, indent=1)
        out.write("\n")
        return 0
    out.write(f"profiled: {prof.ranks} ranks, {prof.stages} stages, {prof.microbatches} "
              f"microbatches, median step {prof.measured * 1e3:.2f} ms; overhead "
              f"{float(prof.costs.overhead) * 1e6:.0f} us per op\n")
    out.write(pt.format_what_if(rows, measured) + "\n")
    for note in notes:
        out.write(note + "\n")
    return 0


def _check_top(pt, args, rows):
    """Run the given rows' schedules for real on the profiled run's setup."""
    import statistics

    from .schedules.registry import build

    run_file = Path(args.profile_dir) / "pipecore-run.json"
    if not run_file.exists():
        raise ValueError(f"--check needs {run_file} (written by run-torch --profile) to know the "
                         f"model and shape of the run")
    cfg = json.loads(run_file.read_text())
    measured, notes = {}, []
    for r in rows:
        sched = build(r["schedule"], cfg["ranks"], args.microbatches or cfg["microbatches"])
        layers = cfg["layers"] or cfg["stages"]
        if layers % sched.stages:
            notes.append(f"{r['schedule']}: not run ({sched.stages} stages do not divide the "
                         f"model's {layers} blocks)")
            continue
        res = pt.run(sched, model=cfg["model"], hidden=cfg["hidden"], layers=layers,
                     batch=cfg["batch"], steps=args.steps, seed=cfg["seed"], check=False)
        measured[r["schedule"]] = statistics.median(res.step_times[2:] or res.step_times)
    return measured, notes


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
    args = _parser().parse_args(argv)
    try:
        if args.command == "compare":
            return _cmd_compare(args, out)
        if args.command == "simulate":
            return _cmd_simulate(args, out)
        if args.command == "table":
            return _cmd_table(args, out)
        if args.command == "report":
            return _cmd_report(args, out)
        if args.command == "study":
            return _cmd_study(args, out)
        if args.command == "scan":
            return _cmd_scan(args, out)
        if args.command == "tune":
            return _cmd_tune(args, out)
        if args.command == "run-torch":
            return _cmd_run_torch(args, out)
        if args.command == "what-if":
            return _cmd_what_if(args, out)
        if args.command == "warm":
            from .warm import warm

            warm(out)
            return 0
        if args.command == "list":
            for name in schedules():
                out.write(f"{name:<18} {family(name).summary}\n")
            return 0
    except (ValueError, MemoryError) as exc:  # ScheduleError is a ValueError
        print(f"pipecore: error: {exc}", file=sys.stderr)
        return 2
    return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

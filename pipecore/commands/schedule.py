"""The subcommands about one schedule: ``list``, ``simulate``, ``report`` and ``table``."""

from __future__ import annotations

import json
from pathlib import Path

from ..analysis.table import ideal_table
from ..core.ops import InputError
from ..core.simulate import simulate
from ..schedules.registry import family, schedules
from .options import (
    check_limit,
    cost_args,
    costs_from,
    memory_args,
    network_from,
    output_file,
    positive_int,
    schedule_args,
    schedule_from,
    shape_args,
)

__all__ = ["list_command", "simulate_arguments", "simulate_command", "report_arguments", "report_command",
           "table_arguments", "table_command"]


def list_command(args, out):
    for name in schedules():
        out.write(f"{name:<18} {family(name).summary}\n")
    return 0


def simulate_arguments(p):
    p.add_argument("name", help="schedule name (see 'pipecore list')")
    schedule_args(p, None, "the output says whether the worst device fits",
                  "print metrics as JSON")
    p.add_argument("--parquet", metavar="PATH", help="write the op table to Parquet")
    p.add_argument("--trace", metavar="PATH", help="write a Chrome trace JSON (opens in Perfetto)")
    p.add_argument("--gantt", metavar="PATH", help="write a Gantt chart PNG")
    p.add_argument("--critical", action="store_true",
                   help="print the critical path and each device's share of it; mark it in "
                        "--trace and --gantt")


def simulate_command(args, out):
    for option in ("parquet", "trace", "gantt"):
        output_file(f"--{option}", getattr(args, option))
    check_limit(args.memory_limit)
    sched = schedule_from(args, args.name)
    res = simulate(sched, costs_from(args), network_from(args))
    from ..output import write_chrome_trace, write_gantt, write_parquet

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
        from ..analysis.critical import critical_path, device_share

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


def report_arguments(p):
    p.add_argument("target", help="a schedule name (see 'pipecore list') or a scan directory")
    p.add_argument("--devices", "-p", type=positive_int, default=None, help="pipeline devices")
    p.add_argument("--microbatches", "-m", type=positive_int, default=None,
                   help="microbatches")
    p.add_argument("--chunks", "-v", type=positive_int, default=None,
                   help="stages per device for interleaved families")
    cost_args(p)
    memory_args(p, "drawn on the memory chart")
    p.add_argument("--out", default="report.html", help="HTML file (default report.html)")


def report_command(args, out):
    from ..output.report import report

    target = Path(args.target)
    if target.is_dir():
        path = report(target, args.out)
    else:
        if args.target not in schedules():
            raise InputError(f"{args.target!r} is neither a schedule name (see 'pipecore list') "
                             "nor a scan directory")
        if args.devices is None or args.microbatches is None:
            raise InputError(f"report {args.target} needs --devices/-p and --microbatches/-m")
        check_limit(args.memory_limit)
        sched = schedule_from(args, args.target)
        res = simulate(sched, costs_from(args), network_from(args))
        path = report(res, args.out, memory_limit=args.memory_limit)
    out.write(f"wrote {path}\n")
    return 0


def table_arguments(p):
    p.add_argument("name")
    shape_args(p, None)
    p.add_argument("--max-slots", type=positive_int, default=None, help="show only the first N slots")


def table_command(args, out):
    table = ideal_table(schedule_from(args, args.name))
    out.write(f"{family(args.name).name}: {table.length} slots; F, B and W take one slot, BW two\n"
              "a cell is stage, op, microbatch (4F0: stage 4's forward of microbatch 0); . is idle\n")
    out.write(table.render(args.max_slots, width=120) + "\n")
    return 0

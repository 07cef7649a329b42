"""The subcommands over many configurations: ``scan`` (a grid into Parquet),
``verify`` (a scan's parts) and ``tune`` (the fastest schedule within a memory limit)."""

from __future__ import annotations

import sys

from ..core.costs import Costs
from .options import network_from, positive_int, progress_args, say_error, search_arguments, write_search

__all__ = ["scan_arguments", "scan_command", "verify_arguments", "verify_command", "tune_arguments",
           "tune_command"]


def scan_arguments(p):
    p.add_argument("grid", help="grid file (TOML; see README 'Scans')")
    p.add_argument("--out", required=True, help="output folder (one Parquet file per part)")
    p.add_argument("--resume", action="store_true", help="continue a scan of the same grid in --out")
    p.add_argument("--backend", choices=("local", "ray"), default="local",
                   help="evaluate parts here (default) or as Ray tasks (pipecore[ray])")
    p.add_argument("--address", default=None,
                   help="Ray cluster address ('auto' for a running one; default: start one)")
    progress_args(p)
    p.add_argument("--no-plot", action="store_true", help="do not draw _pareto.png")


def scan_command(args, out):
    import warnings

    from ..scan.scans import ScanWarning, write_scan

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


def verify_arguments(p):
    p.add_argument("folder", help="the scan's --out folder")


def verify_command(args, out):
    from ..scan.scans import verify_scan

    check = verify_scan(args.folder)
    out.write(check.report() + "\n")
    return 0 if check.ok else 1


def tune_arguments(p):
    mem = search_arguments(p, "do not try activation recompute for schedules that do not fit")
    mem.add_argument("--offload", type=float, default=None,
                     help="time of one activation copy to host or back over a host link; "
                          "enables offload candidates (default: none)")
    mem.add_argument("--host-link-devices", type=positive_int, default=1,
                     help="devices sharing one host link, copies one at a time (default 1)")
    p.add_argument("--families", default=None, help="comma-separated families (default all)")
    p.add_argument("--objective", choices=("makespan", "span"), default="makespan",
                   help="minimise the makespan (default) or the longest per-device span "
                        "(the zero-bubble papers' cost)")


def tune_command(args, out):
    from ..search.tune import TuneError, tune

    costs = Costs(f=args.f, b=args.b, w=args.w, comm=args.comm, activation=args.activation,
                  activation_w=args.activation_w, weights=args.weights, r=args.r,
                  checkpoint=args.checkpoint, offload=args.offload,
                  host_link_devices=args.host_link_devices)
    families = None if args.families is None else [x for x in args.families.split(",") if x]
    try:
        best = tune(args.devices, args.microbatches, costs, memory_limit=args.memory_limit,
                    network=network_from(args), families=families, objective=args.objective,
                    recompute=not args.no_recompute, progress=args.progress)
    except TuneError as exc:
        say_error(exc, "pipecore: ")
        return 1
    write_search(best, args, out)
    return 0

"""The subcommands about every family at once: ``compare`` (one shape, three
views, Gantt charts and a report) and ``study`` (a grid of shapes and speeds)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .options import (
    check_limit,
    costs_from,
    int_list,
    network_from,
    progress_args,
    schedule_args,
)

__all__ = ["compare_arguments", "compare_command", "study_arguments", "study_command"]


def compare_arguments(p):
    schedule_args(p, 2, "the headline names the fastest schedule within it, the table marks "
                        "the rows above it and report.html draws it",
                  "print JSON instead of a table")
    p.add_argument("--out", default="pipecore_out", help="folder for Gantt charts (default pipecore_out)")
    p.add_argument("--no-gantt", action="store_true", help="do not write Gantt charts")
    p.add_argument("--no-report", action="store_true", help="do not write report.html")
    p.add_argument("--no-tune", action="store_true",
                   help="with --memory-limit: do not run pipecore tune for the headline (it "
                        "searches chunk counts, generated and recomputed schedules too)")
    progress_args(p)


def compare_command(args, out):
    from ..analysis.compare import (
        compare,
        describe_costs,
        describe_network,
        format_compare,
        headline,
        sort_rows,
    )

    limit = check_limit(args.memory_limit)
    costs, network = costs_from(args), network_from(args)
    rows = sort_rows(compare(args.devices, args.microbatches, chunks=args.chunks, costs=costs,
                             network=network))
    tuned = None
    if limit is not None and not args.no_tune:
        # The question tune answers: one answer to "the fastest that fits" in both commands.
        from ..search.tune import TuneError, tune

        try:
            tuned = tune(args.devices, args.microbatches, costs, limit, network, progress=False)
        except TuneError as exc:
            tuned = exc
    from ..output import MissingDependencyError
    from ..output.gantt import write_gantts

    written = []
    gantt_note = None
    if not args.no_gantt:
        folder = Path(args.out)
        folder.mkdir(parents=True, exist_ok=True)
        from ..core.progress import Progress, enabled

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
        from ..output.report import report

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
        json.dump({"rows": clean, "headline": headline(rows, limit, tuned), "setting": setting,
                   "memory_limit": limit, "gantt": written,
                   "report": str(page) if page else None}, out, indent=2)
        out.write("\n")
    else:
        setting = (f"on p={args.devices} devices, m={args.microbatches} microbatches, "
                   f"v={args.chunks} chunks per device where a family interleaves; "
                   + describe_costs(costs)
                   + ("" if network is None else f"; network {describe_network(network)}"))
        out.write(format_compare(rows, memory_limit=limit, setting=setting, tuned=tuned) + "\n")
        if written:
            out.write(f"Gantt charts: {len(written)} PNG files in {args.out}/\n")
        if page:
            out.write(f"Report (open in a browser): {page}\n")
    if gantt_note:
        print(gantt_note, file=sys.stderr)
    return 0


def study_arguments(p):
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

    progress_args(p, lines=True)


def _study_progress(args):
    """The study's progress mode: the flag, else lines when stderr is no terminal (logs)."""
    if args.progress is not None:
        return args.progress
    return None if sys.stderr.isatty() else "lines"


def study_command(args, out):
    import time

    import pyarrow.parquet as pq

    from ..analysis.findings import findings, format_findings
    from ..analysis.study import detail, study, summarize
    from ..output.plots import plot_study

    t0 = time.perf_counter()
    devices = int_list("devices", args.devices)
    microbatches = int_list("microbatches", args.microbatches)
    asym_mbs = (int_list("asymmetric-microbatches", args.asymmetric_microbatches)
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

        from ..schedules.chimera import PlacementWarning
        from ..search.asymmetric import asymmetric_study, summarize_asymmetric

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
        from ..output import MissingDependencyError

        try:
            written += plot_study(table, folder / "study.png")
        except MissingDependencyError as exc:
            print(f"plots not written: {exc}", file=sys.stderr)
    for path in written:
        out.write(f"wrote {path}\n")
    out.write(f"study took {time.perf_counter() - t0:.1f} s\n")
    return 0

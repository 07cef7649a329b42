"""``pipecore plan``: every data x tensor x pipeline strategy for a model on a
cluster, estimated and ranked, best first (issue 53)."""

from __future__ import annotations

import sys
import textwrap

from ..core.ops import InputError
from ..core.progress import Progress, enabled
from .options import output_file, write_file

WIDTH = 120


def plan_arguments(p):
    p.add_argument("--model", required=True,
                   help="a model preset (pipecore.Architecture.presets(): gpt3-175b, megatron-1.7b, "
                        "llama3-70b, ...)")
    p.add_argument("--cluster", default=None,
                   help="a cluster preset (dgx-a100, dgx-h100) with --nodes, or a spec such as "
                        "a100:64 (GPUs of a preset)")
    p.add_argument("--hardware", default=None, metavar="FILE",
                   help="instead of --cluster: a hardware file (pipecore calibrate --out FILE, or one of "
                        "its form); --nodes defaults to 1")
    p.add_argument("--nodes", type=int, default=None, help="nodes of the cluster preset")
    p.add_argument("--global-batch", type=int, default=None,
                   help="sequences per iteration (default: the batch the preset's own published run used; "
                        "pipecore.plan.published.reference_batch)")
    p.add_argument("--objective", choices=("time", "cost"), default="time",
                   help="rank by iteration time (default) or by cost per million tokens")
    p.add_argument("--max-iteration-time", type=float, default=None,
                   help="seconds; slower strategies are not ranked")
    p.add_argument("--top", type=int, default=10, help="ranked strategies to print (default 10)")
    p.add_argument("--out", default=None, help="write every strategy's row to this Parquet file")
    p.add_argument("--progress", action="store_true", default=None,
                   help="draw a progress bar (default: when stderr is a terminal)")
    p.add_argument("--ray", action="store_true", help="estimate the strategies as Ray tasks (pipecore[ray])")
    p.add_argument("--address", default=None,
                   help="with --ray: Ray cluster address ('auto' for a running one; default: start one)")
    p.add_argument("--strategy", default=None, metavar="SPEC",
                   help="also say where this strategy ranks, e.g. 'tp=8,pp=8,mb=1,schedule=interleaved-1f1b,"
                        "chunks=3,recompute=selective,sp,zero=1' (dp defaults to the GPUs left; a row's "
                        "label from the table reads too, and a mixed plan's full label as the 'best:' line "
                        "prints it, e.g. '... pools 1x1,0x1 layers 10,14'); estimated if the search did not "
                        "hold it")
    p.add_argument("--report", default=None, metavar="HTML",
                   help="write the report page: time against memory per GPU with the Pareto frontier, "
                        "the best plan's timeline and memory, the top plans' breakdowns")


def _cluster(args):
    from ..plan.hardware import Cluster

    if (args.cluster is None) == (args.hardware is None):
        raise InputError("give --cluster (a preset or spec) or --hardware FILE (pipecore calibrate's), "
                         "one of the two")
    if args.hardware is not None:
        return Cluster.from_file(args.hardware, nodes=1 if args.nodes is None else args.nodes)
    if ":" in args.cluster:
        if args.nodes is not None:
            raise InputError(f"--nodes {args.nodes} with --cluster {args.cluster}: a spec gives "
                             f"GPU counts itself; drop --nodes")
        cluster = Cluster.parse(args.cluster)
    else:
        if args.nodes is None:
            raise InputError(f"--cluster {args.cluster} needs --nodes (how many nodes)")
        cluster = Cluster.preset(args.cluster, nodes=args.nodes)
    return cluster


def _mixed(rows, best):
    """' on <GPUs of each pool>' for the best row of a cluster of several pools."""
    row = next((r for r in rows if r["rank"] == 1), None)
    return f" on {row['pools']}" if row and best.strategy.pools is not None else ""


def _gib(x):
    return f"{x / 2**30:.1f}"


def plan_command(args, out):
    from ..analysis.architecture import Architecture
    from ..plan.ranking import mark_line
    from ..plan.search import strategies

    if args.top < 0:
        raise InputError(f"--top must be >= 0 (got {args.top})")
    arch = Architecture.preset(args.model)
    if args.global_batch is None:
        from ..plan.published import reference_batch

        args.global_batch = reference_batch(args.model)
    cluster = _cluster(args)
    output_file("--out", args.out)  # a missing folder is said now, not after the search
    output_file("--report", args.report)
    mine = None
    if args.strategy is not None:
        from ..plan.ranking import parse_strategy

        try:
            mine = parse_strategy(args.strategy, gpus=cluster.pools[0].count)
        except InputError as exc:
            raise InputError(f"--strategy: {exc}") from None
    bar = None

    def progress(done, total):
        nonlocal bar
        if bar is None:
            bar = Progress(total, enabled(args.progress), unit="strategies")
        bar.update(done - bar.done, final=done == total)  # --ray: a task's strategies at once

    res = strategies(arch, cluster, args.global_batch, objective=args.objective,
                     max_iteration_time=args.max_iteration_time, progress=progress, ray=args.ray,
                     address=args.address)
    table = res.table
    rows = table.to_pylist()
    ranked = [r for r in rows if r["rank"] is not None]
    memory = sum(1 for r in rows if r["why"] and r["why"].startswith("needs "))
    slow = sum(1 for r in rows if r["why"] and "max_iteration_time" in r["why"])
    other = len(rows) - len(ranked) - memory - slow
    lines = []
    gpus = " + ".join(f"{pl.count} x {pl.gpu.name}" for pl in cluster.pools)
    hbm = "/".join(sorted({_gib(pl.gpu.hbm_bytes) for pl in cluster.pools}))
    setting = (f"{arch.name} on {gpus} ({cluster.name}), global batch "
               f"{args.global_batch} x {arch.seq} tokens, objective {args.objective}")
    if res.best is None:
        lines += textwrap.wrap(f"no strategy qualifies for {setting}: {memory} do not fit memory, "
                               f"{slow} are slower than --max-iteration-time, {other} cannot run "
                               f"(the table's 'why' column says which rule each breaks)", WIDTH)
        fitting = [r for r in rows if r["fits"]]
        if fitting:  # what the bound would have to be
            quick = min(fitting, key=lambda r: r["iteration_time"])
            lines += textwrap.wrap(f"the fastest that fits: {quick['strategy']} on {quick['pools']}: "
                                   f"{quick['iteration_time']:.1f} s per iteration", WIDTH,
                                   subsequent_indent="  ")
    else:
        b = res.best
        lines += textwrap.wrap(
            f"best: {b.strategy.label()}{_mixed(rows, b)}: {b.iteration_time:.2f} s per iteration, "
            f"{b.tflops_per_gpu:.0f} TFLOP/s per GPU ({b.mfu:.0%} MFU), "
            f"{_gib(b.memory_per_gpu)} GiB per GPU, "
            f"${b.cost_per_million_tokens:.3g} per million tokens", WIDTH, subsequent_indent="  ")
        lines += textwrap.wrap(f"for {setting}", WIDTH, subsequent_indent="  ")
    marks = _marks(res, mine, arch, cluster, args)
    for name, mark in marks.items():
        lines += textwrap.wrap(mark_line(name, mark), WIDTH, subsequent_indent="  ", break_on_hyphens=False)
    lines += textwrap.wrap(f"estimated {res.estimated} of {len(rows)} strategies in {res.seconds:.1f} s: "
                           f"{len(ranked)} ranked, {memory} do not fit {hbm} GiB, "
                           f"{slow} too slow, {other} cannot run", WIDTH)
    if ranked and args.top:
        lines.append("")
        lines.append(f"{'rank':>4}  {'strategy':<62}{'s/iter':>8}{'TFLOP/s':>9}{'MFU':>6}"
                     f"{'GiB/GPU':>9}{'$/Mtok':>8}")
        lines.append(f"{'':>4}  (s/iter: lower is faster; TFLOP/s: model FLOPs per GPU; $/Mtok: USD per "
                     f"million tokens)")
        for r in ranked[:args.top]:
            core = r["strategy"].split(" pool")[0].split(" layers ")[0]
            lines.append(f"{r['rank']:>4}  {core[:62]:<62}{r['iteration_time']:>8.2f}"
                         f"{r['tflops_per_gpu']:>9.0f}{r['mfu']:>6.0%}{_gib(r['memory_per_gpu']):>9}"
                         f"{r['cost_per_million_tokens']:>8.3g}")
            if len(cluster.pools) > 1:  # which GPUs, and the layer split of a pipeline across pools
                where = f"on {r['pools']}" + (f", layers {r['layers']}" if r["layers"] else "")
                lines += textwrap.wrap(where, WIDTH, initial_indent=" " * 8, subsequent_indent=" " * 10)
    if args.out:
        import pyarrow.parquet as pq

        write_file(args.out, "--out", lambda path: pq.write_table(table, path))
        lines += textwrap.wrap(f"wrote {args.out} ({len(rows)} rows, one per strategy, with why a row is "
                               f"not ranked)", WIDTH, break_long_words=False, break_on_hyphens=False)
    if args.report:
        from ..output import MissingDependencyError
        from ..plan.report import plan_report

        try:
            write_file(args.report, "--report", lambda path: plan_report(
                res, path, arch, cluster, args.global_batch, top=max(args.top, 1), marks=marks,
                max_iteration_time=args.max_iteration_time))
        except MissingDependencyError as exc:
            print(f"--report {args.report} not written: {exc}", file=sys.stderr)
        else:
            lines += textwrap.wrap(f"wrote {args.report} (the report page: open it in a browser)", WIDTH,
                                   break_long_words=False, break_on_hyphens=False)
    out.write("\n".join(lines) + "\n")
    return 0


def _marks(res, mine, arch, cluster, args):
    """Name -> Ranking: the user's strategy, and each published run of this very setting."""
    from ..plan.ranking import published_rankings

    marks = {}
    if mine is not None:
        marks["yours"] = res.rank_of(mine, arch, cluster, args.global_batch,
                                     max_iteration_time=args.max_iteration_time)
    for run, ranking in published_rankings(res, arch, cluster, args.global_batch,
                                           max_iteration_time=args.max_iteration_time):
        marks[f"published {run.id}"] = ranking
    return marks

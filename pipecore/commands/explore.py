"""The ``explore`` subcommand: a joint search over composed schedules (pc.explore)."""

from __future__ import annotations

import sys

from ..core.costs import Costs
from .options import network_from, output_file, positive_int, say_error, search_arguments, write_search

__all__ = ["explore_arguments", "explore_command"]


# Options a model replaces: its layers give the times, memory and transfer bytes.
_COST_OPTIONS = ("f", "b", "w", "comm", "bytes", "bandwidth", "latency", "activation",
                 "activation_w", "weights", "r", "checkpoint", "fb_factor")


def explore_arguments(p):
    search_arguments(p, "do not try activation recompute for compositions that do not fit")
    overlap = p.add_argument_group("overlapped F&B units (DualPipe's)")
    overlap.add_argument("--fb-factor", type=float, default=1.0,
                         help="time of an overlapped F&B unit over its two ops' summed time "
                              "(default 1: overlap gains nothing); below 1, compositions "
                              "with overlapped units join the search")
    g = p.add_argument_group(
        "model (optional: a GPT-style decoder split over the stages, in seconds and bytes)")
    g.add_argument("--transformer", type=_transformer, default=None,
                   metavar="LAYERS,HIDDEN,HEADS,SEQ,VOCAB",
                   help="search the layers' split too (pipecore.Model.transformer); the cost "
                        "and network options then come from the model and --hardware, and "
                        "--memory-limit is in bytes (default: the hardware's HBM)")
    g.add_argument("--microbatch-size", type=positive_int, default=1,
                   help="sequences per microbatch with --transformer (default 1)")
    g.add_argument("--hardware", default=None,
                   help="hardware preset with --transformer (default h100-nvlink)")
    p.set_defaults(cost_defaults={k: p.get_default(k) for k in _COST_OPTIONS})
    p.add_argument("--no-tune", action="store_true",
                   help="compositions only: do not run tune and compare with its winner")
    p.add_argument("--out", default=None,
                   help="write the winner's HTML report page to this file (e.g. explore.html)")
    p.add_argument("--csv", default=None, metavar="FILE",
                   help="write the winner as torch's compute_only CSV (needs pipecore[torch]); "
                        "run it with pipecore run-torch FILE --ranks P. The search then "
                        "leaves out the two-pipeline (replicated) placements torch cannot run")


def explore_command(args, out):
    from ..search.explore import default_space, explore
    from ..search.tune import TuneError

    try:
        for option in ("csv", "out"):  # a missing folder is said now, not after the search
            output_file(f"--{option}", getattr(args, option))
        costs, network, hardware = _costs_or_model(args)
        space = None
        if args.csv:
            # torch runs a stage on one rank: leave out the replicated pipelines.
            overlap = hardware is None and costs.fb_factor < 1
            space = [c for c in default_space(args.devices, args.microbatches, overlap)
                     if c.placement.chains == 1]
        best = explore(args.devices, args.microbatches, costs, memory_limit=args.memory_limit,
                       network=network, hardware=hardware, include_tune=not args.no_tune,
                       recompute=not args.no_recompute, progress=args.progress, space=space)
    except (TuneError, ValueError) as exc:
        say_error(exc, "pipecore: ")
        return 1
    note = None if hardware is None else (
        f"Times in seconds per iteration, memory in bytes per device: {costs.name!r} on "
        f"{hardware.name}; the winner's layers per stage: {best.schedule.params['layers']}")
    write_search(best, args, out, note, composition=best.schedule.params.get("composition"),
                 layers=best.schedule.params.get("layers"))
    if args.csv:
        from .pytorch import write_torch_csv

        # With --json, stdout is the JSON document: say it on stderr.
        try:
            status = write_torch_csv(best.schedule, args.csv, sys.stderr if args.json else out)
        except ValueError as exc:
            hint = ("; compositions place every stage on one device: --no-tune searches only "
                    "them" if not args.no_tune else "")
            print(f"pipecore: --csv: the winner, {best.label}, cannot run in torch: {exc}{hint}",
                  file=sys.stderr)
            return 1
        if status:
            return status
    if args.out:
        from ..output.report import report

        path = report(best.result, args.out, title=f"pipecore explore: {best.label}",
                      memory_limit=args.memory_limit)
        if not args.json:
            out.write(f"wrote {path}\n")
    return 0


def _transformer(text):
    import argparse

    parts = text.split(",")
    try:
        values = [int(x) for x in parts]
    except ValueError:
        values = []
    if len(values) != 5 or min(values) < 1:
        raise argparse.ArgumentTypeError(
            f"expected five positive integers LAYERS,HIDDEN,HEADS,SEQ,VOCAB (got {text!r})")
    return values


def _costs_or_model(args):
    """Costs and network from the options, or a Model and its hardware."""
    if args.transformer is None:
        if args.hardware is not None or args.microbatch_size != 1:
            raise ValueError("--hardware and --microbatch-size describe a --transformer model; "
                             "give --transformer or leave them out")
        costs = Costs(f=args.f, b=args.b, w=args.w, comm=args.comm, activation=args.activation,
                      activation_w=args.activation_w, weights=args.weights, r=args.r,
                      checkpoint=args.checkpoint, fb_factor=args.fb_factor)
        return costs, network_from(args), None
    from ..analysis.model import Hardware, Model

    given = [k for k in _COST_OPTIONS if getattr(args, k) != args.cost_defaults[k]]
    if given:
        raise ValueError("--transformer takes times, memory and transfer bytes from the model: "
                         f"drop {', '.join('--' + k.replace('_', '-') for k in given)}")
    layers, hidden, heads, seq, vocab = args.transformer
    model = Model.transformer(layers=layers, hidden=hidden, heads=heads, seq=seq, vocab=vocab,
                              microbatch=args.microbatch_size)
    return model, None, Hardware.preset(args.hardware or "h100-nvlink")

"""The ``explore`` subcommand: a joint search over composed schedules (pc.explore)."""

from __future__ import annotations

import sys

from ..core.costs import Costs
from .options import network_from, positive_int, progress_args, search_arguments, write_winner

__all__ = ["explore_arguments", "explore_command"]


def explore_arguments(p):
    search_arguments(p, "do not try activation recompute for compositions that do not fit")
    p.add_argument("--no-tune", action="store_true",
                   help="compositions only: do not run tune and compare with its winner")
    p.add_argument("--top", type=positive_int, default=10, help="rows in the report (default 10)")
    p.add_argument("--json", action="store_true", help="print the winner and candidates as JSON")
    p.add_argument("--actions", action="store_true", help="also print the winner's programs")
    p.add_argument("--out", default=None,
                   help="write the winner's HTML report page to this file (e.g. explore.html)")
    progress_args(p)


def explore_command(args, out):
    from ..search.explore import explore
    from ..search.tune import TuneError

    costs = Costs(f=args.f, b=args.b, w=args.w, comm=args.comm, activation=args.activation,
                  activation_w=args.activation_w, weights=args.weights, r=args.r,
                  checkpoint=args.checkpoint)
    try:
        best = explore(args.devices, args.microbatches, costs, memory_limit=args.memory_limit,
                       network=network_from(args), include_tune=not args.no_tune,
                       recompute=not args.no_recompute, progress=args.progress)
    except TuneError as exc:
        print(f"pipecore: {exc}", file=sys.stderr)
        return 1
    if args.json:
        write_winner(best, out, composition=best.schedule.params.get("composition"))
    else:
        out.write(best.report(args.top) + "\n")
        if args.actions:
            for d, prog in best.schedule.to_actions().items():
                out.write(f"device {d}: {' '.join(prog)}\n")
    if args.out:
        from ..output.report import report

        path = report(best.result, args.out, title=f"pipecore explore: {best.label}",
                      memory_limit=args.memory_limit)
        if not args.json:
            out.write(f"wrote {path}\n")
    return 0

"""Command line: ``pipecore compare``, ``simulate``, ``report``, ``table``, ``study``,
``scan``, ``verify``, ``tune``, ``explore``, ``plan``, ``calibrate``, ``run-torch``,
``what-if``, ``list``, ``families`` and ``warm``.

:data:`COMMANDS` is the table of subcommands: each row names the function
that adds the subcommand's arguments to its parser and the one that runs
it, side by side in a module of :mod:`pipecore.commands` (one per group of
subcommands; the options they share are in ``commands/options.py``). This
module builds the parser from the table, checks the flags and dispatches.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Callable
from typing import NamedTuple, TextIO

from . import __version__
from .commands import calibrate, catalog, explore, families, grid, plan, pytorch, schedule
from .commands.options import say_error
from .core.ops import PipecoreError

__all__ = ["main", "parser", "subcommand_parsers", "COMMANDS"]


class Command(NamedTuple):
    """A subcommand: its line in ``pipecore --help``, what adds its arguments
    to its parser, and what runs it (``run(args, out)`` returns the exit status)."""

    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, TextIO], int]


def _no_arguments(parser):
    """A subcommand without options of its own."""


def _warm(args, out):
    from .warm import warm

    warm(out)
    return 0


#: The subcommands, in the order ``pipecore --help`` lists them.
COMMANDS = {
    "compare": Command("every schedule three ways: formula, ideal table, simulation",
                       families.compare_arguments, families.compare_command),
    "simulate": Command("simulate one schedule", schedule.simulate_arguments,
                        schedule.simulate_command),
    "report": Command("write a self-contained HTML report of one schedule (FAMILY -p P -m M) or "
                      "of a scan (its Parquet directory)", schedule.report_arguments,
                      schedule.report_command),
    "table": Command("print the idealised devices x time-slots table", schedule.table_arguments,
                     schedule.table_command),
    "study": Command("every family three ways over a grid of compute and network speeds "
                     "(x10 = ten times faster)", families.study_arguments, families.study_command),
    "scan": Command("evaluate a grid of configurations into a Parquet dataset",
                    grid.scan_arguments, grid.scan_command),
    "verify": Command("check a scan's Parquet folder: every part present, whole and of this "
                      "scan (exit 1 naming each bad part)", grid.verify_arguments, grid.verify_command),
    "tune": Command("the fastest schedule that fits a per-device memory limit",
                    grid.tune_arguments, grid.tune_command),
    "explore": Command("search composed schedules (placements x orders x caps x W rules) for "
                       "the fastest that fits a memory limit; never slower than tune",
                       explore.explore_arguments, explore.explore_command),
    "plan": Command("plan a training run: every data x tensor x pipeline strategy for a model "
                    "on a cluster, estimated and ranked (iteration time, memory, cost)",
                    plan.plan_arguments, plan.plan_command),
    "calibrate": Command("measure this machine's GEMMs, memory, kernels and collectives with torch "
                         "(needs pipecore[torch]) and write a hardware file for plan --hardware",
                         calibrate.calibrate_arguments, calibrate.calibrate_command),
    "list": Command("list schedule names", _no_arguments, schedule.list_command),
    "families": Command("every schedule family with its chunks, backward, options and the "
                        "paper it comes from (--json too)", catalog.families_arguments,
                        catalog.families_command),
    "warm": Command("compile every Numba kernel into the cache now (for container images and "
                    "CI; prints seconds per step)", _no_arguments, _warm),
    "export": Command("write a schedule as the CSV run-torch reads (torch's compute_only format) "
                      "and/or as per-device actions (JSON)", pytorch.export_arguments,
                      pytorch.export_command),
    "run-torch": Command("run a schedule CSV for real with PyTorch on CPU ranks (gloo; needs "
                         "pipecore[torch])", pytorch.run_torch_arguments, pytorch.run_torch_command),
    "what-if": Command("rank every schedule family by its predicted step time from one profiled "
                       "run's torch.profiler traces", pytorch.what_if_arguments,
                       pytorch.what_if_command),
}


def _build_parser():
    """The top-level parser and its subcommands' parsers, by name."""
    top = argparse.ArgumentParser(prog="pipecore", description=(
        "Build, validate and simulate pipeline-parallel training schedules."))
    top.add_argument("--version", action="version", version=f"pipecore {__version__}")
    sub = top.add_subparsers(dest="command", required=True)
    subs = {}
    for name, command in COMMANDS.items():
        subs[name] = sub.add_parser(name, help=command.help)
        command.arguments(subs[name])
    return top, subs


def parser() -> argparse.ArgumentParser:
    """The ``pipecore`` command line's argument parser, built from :data:`COMMANDS`.

    Returns
    -------
    argparse.ArgumentParser
        A new parser each call: ``parser().parse_args([...])`` gives the
        namespace a subcommand's ``run`` takes, defaults filled in.
    """
    return _build_parser()[0]


def subcommand_parsers() -> dict:
    """Each subcommand's own parser (what ``pipecore NAME --help`` prints), by name.

    Returns
    -------
    dict of str to argparse.ArgumentParser
        In the order of :data:`COMMANDS` (the order ``pipecore --help``
        lists them); new parsers each call.
    """
    return _build_parser()[1]


def _suggest(word, choices):
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {close[0]}?" if close else ""


def _check_flags(parser, subs, argv):
    """Reject a mistyped subcommand or flag with the subcommand's own usage
    and the closest valid name.

    argparse reports an unknown flag of a subcommand through the top-level
    parser (its usage lists only the subcommands), and reports a missing
    required flag before an unknown one, so ``--devics 8`` only says that
    ``--devices`` is required.
    """
    rest = list(argv)
    while rest and rest[0].startswith("-"):  # the top level's own flags take no values
        rest.pop(0)
    if not rest:
        return
    command, rest = rest[0], rest[1:]
    sub = subs.get(command)
    if sub is None:
        parser.error(f"unknown command {command!r} (choose from {', '.join(subs)})"
                     + _suggest(command, subs))
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
    top, subs = _build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    _check_flags(top, subs, argv)
    args = top.parse_args(argv)
    try:
        return COMMANDS[args.command].run(args, out)
    except (PipecoreError, ValueError, MemoryError) as exc:  # pipecore's refusals, and numpy's
        say_error(exc)
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
        say_error(f"{where}{exc.strerror or exc}")
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())

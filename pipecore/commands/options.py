"""The options several subcommands share, and what the handlers make of them:
shapes, costs, networks, memory, progress bars, integer lists and output files."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from ..core.costs import Costs, Network
from ..core.ops import InputError
from ..schedules.registry import build, family

__all__ = ["positive_int", "shape_args", "cost_args", "memory_args", "schedule_args",
           "progress_args", "check_limit", "costs_from", "network_from", "schedule_from",
           "int_list", "output_file", "write_file", "write_programs", "write_search", "say_error"]


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer (got {text!r})") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1 (got {value})")
    return value


def shape_args(p, chunks_default):
    p.add_argument("--devices", "-p", type=positive_int, required=True, help="pipeline devices")
    p.add_argument("--microbatches", "-m", type=positive_int, required=True, help="microbatches")
    p.add_argument("--chunks", "-v", type=positive_int, default=chunks_default,
                   help="stages per device for interleaved families")


def cost_args(p):
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


#: What ``--memory-limit`` means in every command that takes it.
LIMIT_HELP = ("per-device memory limit in M on peak activation + weights (the weights of the "
              "stages a device holds: --weights each); default none")


def memory_args(p, limit_help=""):
    """The memory options, one meaning in every command: ``--activation``,
    ``--activation-w``, ``--weights`` (default 1 M, as :class:`pipecore.Costs`)
    and ``--memory-limit`` on activation plus weights.

    Parameters
    ----------
    p : argparse.ArgumentParser
    limit_help : str
        What the limit does in this command, added to its help.

    Returns
    -------
    argparse._ArgumentGroup
        The group, for options of one command only.
    """
    mem = p.add_argument_group("memory (in M: one microbatch's activation of one device share; "
                               "limit per device)")
    mem.add_argument("--activation", type=float, default=1.0,
                     help="activation one F allocates (default 1)")
    mem.add_argument("--activation-w", type=float, default=0.0,
                     help="part of it kept until W (default 0)")
    mem.add_argument("--weights", type=float, default=1.0,
                     help="weights of one device share (default 1, as pipecore.Costs; 0 makes "
                          "the limit an activation budget)")
    mem.add_argument("--memory-limit", type=float, default=None, metavar="M",
                     help=LIMIT_HELP + (f": {limit_help}" if limit_help else ""))
    return mem


def check_limit(limit):
    """``--memory-limit`` as given, refused unless a finite number > 0.

    Parameters
    ----------
    limit : float or None

    Returns
    -------
    float or None

    Raises
    ------
    InputError
        Naming the option and the value.
    """
    if limit is not None and not (math.isfinite(limit) and limit > 0):
        raise InputError(f"--memory-limit must be a finite number > 0 in M (got {limit:g})")
    return limit


def schedule_args(p, chunks_default, limit_help, json_help):
    """What a command about schedules at one shape takes: the shape, the
    costs (and network), the memory options and ``--json``.

    Parameters
    ----------
    p : argparse.ArgumentParser
    chunks_default : int or None
        ``--chunks`` when not given (None: each family's own).
    limit_help, json_help : str
        What ``--memory-limit`` does and what ``--json`` prints in this command.
    """
    shape_args(p, chunks_default)
    cost_args(p)
    memory_args(p, limit_help)
    p.add_argument("--json", action="store_true", help=json_help)


def progress_args(p, lines=False):
    bar = p.add_mutually_exclusive_group()
    default = ("on a terminal; elsewhere (a log) a progress line every few seconds" if lines
               else "only on a terminal")
    bar.add_argument("--progress", dest="progress", action="store_true", default=None,
                     help=f"always show the progress bar (default: {default})")
    bar.add_argument("--no-progress", dest="progress", action="store_false",
                     help="never show the progress bar")


def costs_from(args):
    """The :class:`~pipecore.Costs` a subcommand's cost flags give.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed by a parser :func:`cost_args` (and maybe :func:`memory_args`)
        filled; ``pipecore.cli.parser().parse_args([...])`` gives one.

    Returns
    -------
    Costs
        ``f``, ``b``, ``w``, ``comm`` and the memory flags the parser has.

    Raises
    ------
    ValueError
        If a value breaks a rule of :class:`~pipecore.Costs`.
    """
    memory = {k: getattr(args, k) for k in ("activation", "activation_w", "weights")
              if hasattr(args, k)}
    return Costs(f=args.f, b=args.b, w=args.w, comm=args.comm, **memory)


def network_from(args):
    """The uniform :class:`~pipecore.Network` of ``--bytes``, ``--bandwidth`` and ``--latency``.

    Parameters
    ----------
    args : argparse.Namespace
        Parsed by a parser :func:`cost_args` filled.

    Returns
    -------
    Network or None
        None when neither ``--bytes`` nor ``--bandwidth`` is given
        (transfers then take ``comm``).

    Raises
    ------
    ValueError
        If only one of ``--bytes`` and ``--bandwidth`` is given.
    """
    if args.bytes is None and args.bandwidth is None:
        return None
    if args.bytes is None or args.bandwidth is None:
        raise InputError("a network needs both --bytes and --bandwidth")
    return Network.uniform(args.bytes, args.bandwidth, args.latency)


def schedule_from(args, name):
    """The schedule of family *name* at the shape options' devices, microbatches and chunks."""
    return build(family(name).name, args.devices, args.microbatches, chunks=args.chunks)


def int_list(name, text):
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise InputError(f"--{name} must be comma-separated integers (got {text!r})") from None
    if not values or min(values) < 1:
        raise InputError(f"--{name} needs integers >= 1 (got {text!r})")
    return values


def output_file(option, path, folder="is a folder, not a file"):
    """Refuse an output file whose folder is missing, before any work is done;
    ``folder`` says what is wrong with a path that is a folder."""
    if path is None:
        return
    target = Path(path)
    if target.is_dir():
        raise InputError(f"{option} {path}: {folder}")
    if not target.parent.is_dir():
        raise InputError(f"{option} {path}: folder {target.parent} does not exist")


def write_file(name, option, write):
    """Write an output file; a ValueError naming the option and path if it cannot be."""
    output_file(option, name, folder="is a folder; give a file name")
    path = Path(name)
    try:
        write(path)
    except OSError as exc:
        raise InputError(f"{option} {name}: cannot write ({exc.strerror or exc})") from None
    return path


def search_arguments(p, recompute_help):
    """The options tune and explore share: shape, costs, memory, what to print.

    Parameters
    ----------
    p : argparse.ArgumentParser
    recompute_help : str
        Help of ``--no-recompute``.

    Returns
    -------
    argparse._ArgumentGroup
        The memory group, for options of one command only.
    """
    p.add_argument("--devices", "-p", type=positive_int, required=True, help="pipeline devices")
    p.add_argument("--microbatches", "-m", type=positive_int, required=True, help="microbatches")
    cost_args(p)
    mem = memory_args(p)
    mem.add_argument("--checkpoint", type=float, default=0.0,
                     help="memory a recomputed F keeps (default 0)")
    mem.add_argument("--r", type=float, default=None,
                     help="time of a recompute (R) op (default: --f)")
    mem.add_argument("--no-recompute", action="store_true", help=recompute_help)
    p.add_argument("--top", type=positive_int, default=10, help="rows in the report (default 10)")
    p.add_argument("--json", action="store_true", help="print the winner and candidates as JSON")
    p.add_argument("--actions", action="store_true", help="also print the winner's programs")
    progress_args(p)
    return mem


def write_search(best, args, out, note=None, **extra):
    """What tune and explore print: the winner and candidates as JSON with
    ``--json``, else the report (``--top`` rows), a note, and with
    ``--actions`` the winner's programs.

    Parameters
    ----------
    best : Tuned
    args : argparse.Namespace
        With ``json``, ``top`` and ``actions``.
    out : file-like
    note : str, optional
        A sentence after the report (wrapped to 120 columns).
    **extra
        More keys for the JSON object (e.g. the composition).
    """
    import json
    import textwrap

    if args.json:
        res = best.result
        json.dump({"winner": best.label, "makespan": res.makespan, "bubble_rate": res.bubble_rate,
                   "memory": float((res.peak_activation + res.static_memory).max()), **extra,
                   "actions": best.schedule.to_actions(),
                   "candidates": best.candidates.to_pylist()}, out, indent=1, default=str)
        out.write("\n")
        return
    out.write(best.report(args.top) + "\n")
    if note:
        out.write("\n" + "\n".join(textwrap.wrap(note, 120, subsequent_indent="  ")) + "\n")
    if args.actions:
        write_programs(best.schedule, out)


def write_programs(schedule, out):
    """Each device's program in torch's action notation, wrapped to 120 columns.

    Parameters
    ----------
    schedule : Schedule
    out : file-like
    """
    import textwrap

    for d, prog in schedule.to_actions().items():
        out.write("\n".join(textwrap.wrap(" ".join(prog), 120, initial_indent=f"device {d}: ",
                                           subsequent_indent="  ")) + "\n")


def say_error(message, prefix="pipecore: error: ", file=None):
    """Print an error for a terminal: its first line (the sentence) wrapped to
    120 columns, continuations indented; any further lines (a schedule's
    program grid) as they are.

    Parameters
    ----------
    message : str or Exception
    prefix : str
    file : file-like, optional
        Defaults to stderr.
    """
    import sys
    import textwrap

    first, *rest = str(message).split("\n")
    # A path or name longer than a line stays whole: it is copied, not read.
    lines = textwrap.wrap(prefix + first, 120, subsequent_indent="  ", break_on_hyphens=False,
                          break_long_words=False) or [prefix.rstrip()]
    print("\n".join(lines + rest), file=sys.stderr if file is None else file)

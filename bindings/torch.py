"""PyTorch pipelining bindings: export, import, run and calibrate schedules.

``torch.distributed.pipelining`` describes a schedule as a
``pipeline_order``: per rank, a list of ``_Action`` values (or ``None`` for
an idle step). This module converts between that form (and the
``compute_only`` CSV that ``_PipelineScheduleRuntime._load_csv`` reads) and
pipecore's :class:`~pipecore.Schedule`.

Kinds map one to one::

    pipecore  F    B (input grad)     W (weight grad)    BW (fused)
    torch     F    I BACKWARD_INPUT   W BACKWARD_WEIGHT  B FULL_BACKWARD

and an overlapped pipecore unit (an F row and a B or BW row sharing one slot
of a device) is torch's ``OVERLAP_F_B`` action with the two as sub-actions.
Stage placement needs no mapping of its own: torch infers ``stage -> rank``
from which rank's list holds a stage's actions (``_validate_schedule``), so
loop, V and any other placement with one rank per stage export as they are.

What cannot be exported (a ``ValueError`` names the op or stage):

- replicated stages (a stage on two or more devices: ``chimera``,
  ``dualpipe`` and ``bitpipe``): torch assigns every stage to exactly one
  rank;
- any kind torch has no action for: pipecore's recompute ``R``, offload ``O`` and load ``L``.

``AR`` (the gradient all-reduce joining the replicas of a replicated stage)
has no counterpart in a ``pipeline_order`` (torch's end-of-step gradient work
is ``REDUCE_GRAD``, which its runtime inserts by itself); it is skipped. In
practice only replicated schedules hold ``AR`` ops and they are refused.

Beyond the formats: :func:`run` (and ``pipecore run-torch``) runs a
schedule for real on CPU ranks with torch's runtime and checks the gradients
against the unpipelined model; :func:`calibrate` and :func:`costs_from_run`
turn measured stage times into :class:`pipecore.Costs`, and :func:`fidelity`
compares pipecore's predicted iteration times with measured ones.

torch's private API (``_Action``, ``_validate_schedule``,
``_PipelineScheduleRuntime``) is what this module talks to; it was written
against torch 2.13.0 (:data:`TESTED_TORCH`).
"""

from __future__ import annotations

import csv
import statistics
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

import numpy as np

try:
    import torch
    from torch.distributed.pipelining import schedules as _ts
except ImportError as _exc:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "pipecore.bindings.torch needs PyTorch; install it with: pip install 'pipecore[torch]'"
    ) from _exc

from pipecore.core.costs import Costs
from pipecore.core.ops import InputError
from pipecore.core.schedule import Schedule, ScheduleError

from ._profile import Profile, WhatIfRanking, format_what_if, from_profile, what_if
from ._torch_run import RunResult

__all__ = [
    "TESTED_TORCH", "TORCH_SCHEDULES", "to_actions", "from_actions", "validate", "to_csv",
    "from_csv", "read_csv", "from_torch", "run", "RunResult", "calibrate", "costs_from_run", "fidelity",
    "format_fidelity", "ranking_agreement", "from_profile", "Profile", "what_if",
    "format_what_if", "WhatIfRanking",
]

#: The torch release these bindings were written and tested against.
TESTED_TORCH = "2.13.0"

_Action = _ts._Action
_CT = _ts._ComputationType

# pipecore kind -> torch computation type, and back.
_TO_TORCH = {"F": _CT.FORWARD, "B": _CT.BACKWARD_INPUT, "W": _CT.BACKWARD_WEIGHT,
             "BW": _CT.FULL_BACKWARD}
_FROM_TORCH = {v: k for k, v in _TO_TORCH.items()}
# Kinds pipecore has (or is getting) that torch cannot express, and why.
_NO_TORCH_ACTION = {
    "R": "torch has no recompute action (it recomputes inside a stage's module, e.g. with "
         "activation checkpointing, never as a schedule action)",
}

#: torch schedule classes :func:`from_torch` builds: short name -> (class name, placement).
TORCH_SCHEDULES = {
    "GPipe": ("ScheduleGPipe", "single"),
    "1F1B": ("Schedule1F1B", "single"),
    "Interleaved1F1B": ("ScheduleInterleaved1F1B", "loop"),
    "LoopedBFS": ("ScheduleLoopedBFS", "loop"),
    "InterleavedZeroBubble": ("ScheduleInterleavedZeroBubble", "loop"),
    "ZBVZeroBubble": ("ScheduleZBVZeroBubble", "v"),
    "DualPipeV": ("ScheduleDualPipeV", "v"),
}


def _label(kind, stage, microbatch):
    return f"{stage}{kind}" if kind == "AR" else f"{stage}{kind}{microbatch}"


def _columns(schedule):
    """The op table as Python lists: device, slot, kind name, stage, microbatch."""
    table = schedule.table
    kind = table.column("kind").combine_chunks()
    if hasattr(kind, "dictionary_decode"):
        kind = kind.dictionary_decode()
    return (table.column("device").to_pylist(), table.column("slot").to_pylist(), kind.to_pylist(),
            table.column("stage").to_pylist(), table.column("microbatch").to_pylist())


def to_actions(schedule) -> dict[int, list]:
    """Export a schedule as torch's ``pipeline_order``.

    Parameters
    ----------
    schedule : pipecore.Schedule
        Any schedule whose stages each run on one device.

    Returns
    -------
    dict of int to list of torch ``_Action``
        ``{rank: [action, ...]}`` for every rank ``0..devices-1`` (an idle
        device has an empty list), in program order. No ``None`` idle steps
        are written: pipecore's slots are program positions, not time steps,
        and torch's runtime skips ``None`` anyway.

    Raises
    ------
    ValueError
        If a stage runs on more than one device (a replicated schedule:
        ``chimera``, ``dualpipe``, ``bitpipe``), naming the stage and its
        devices; or if an op has a kind torch has no action for, naming the
        device, slot and op, e.g. ``device 0 slot 5 (3R2): torch has no
        recompute action``.
    """
    dev, slot, kind, stage, mb = _columns(schedule)
    homes: dict[int, set] = {}
    for d, k, s in zip(dev, kind, stage):
        if k != "AR":
            homes.setdefault(s, set()).add(d)
    for s in sorted(homes):
        if len(homes[s]) > 1:
            raise InputError(
                f"stage {s} runs on devices {sorted(homes[s])} (a replicated stage, as chimera, "
                f"dualpipe and bitpipe build): torch's pipelining runs every stage on exactly one "
                f"rank (_validate_schedule), so schedule {schedule.name!r} cannot be exported")
    order: dict[int, list] = {r: [] for r in range(int(schedule.devices))}
    last = None
    for d, sl, k, s, j in zip(dev, slot, kind, stage, mb):
        if k == "AR":
            continue  # no pipeline_order counterpart; see the module docstring
        ctype = _TO_TORCH.get(k)
        if ctype is None:
            why = _NO_TORCH_ACTION.get(k, f"torch has no action for kind {k!r}")
            raise InputError(f"device {d} slot {sl} ({_label(k, s, j)}): {why}; this schedule cannot "
                             f"be exported to torch")
        action = _Action(int(s), ctype, int(j))
        if last == (d, sl):
            # Second row of a slot: the B or BW of an overlapped F&B unit (F row first).
            first = order[d][-1]
            order[d][-1] = _Action(-1, _CT.OVERLAP_F_B, None, (first, action))
        else:
            order[d].append(action)
        last = (d, sl)
    return order


def _op(action, rank, step):
    if action.stage_index is None or action.stage_index < 0 or action.microbatch_index is None:
        raise InputError(f"rank {rank} step {step}: action {action} needs a stage >= 0 and a "
                         f"microbatch")
    return (_FROM_TORCH[action.computation_type], int(action.stage_index),
            int(action.microbatch_index))


def _parse(text, rank, step):
    try:
        return _Action.from_str(text)
    except RuntimeError as exc:  # torch's parser raises RuntimeError
        raise InputError(f"rank {rank} step {step}: {exc}") from None


def _full_backward_and_weight(seen, source):
    """A ScheduleError when a stage and microbatch has both torch's B (full) and W, else None.

    ``seen`` maps ``(stage, microbatch)`` to ``{"B": (rank, step, text), "W": ...}``;
    ``source`` is the CSV file the order came from, if any.
    """
    both = [(key, acts) for key, acts in seen.items() if "B" in acts and "W" in acts]
    if not both:
        return None
    (stage, mb), acts = min(both, key=lambda kv: min(kv[1]["B"][:2], kv[1]["W"][:2]))

    def row(rank):
        return f"rank {rank}" if source is None else f"line {rank + 1} (rank {rank})"

    def cell(step, text):
        return f"step {step} is {text}" if source is None else f"cell {step + 1} is {text}"

    (r1, s1, t1), (r2, s2, t2) = sorted((acts["B"], acts["W"]))
    where = f"{source}: " if source is not None else ""
    if r1 == r2:
        where += f"{row(r1)}: {cell(s1, t1)} and {cell(s2, t2)}"
    else:
        where += f"{row(r1)} {cell(s1, t1)} and {row(r2)} {cell(s2, t2)}"
    more = (f" ({len(both)} stage/microbatch pairs have both; the first is shown)"
            if len(both) > 1 else "")
    return ScheduleError(
        f"{where}: stage {stage} microbatch {mb} has a full "
        f"backward B and a weight backward W{more}. In torch's grammar B is the full backward "
        f"(input and weight gradients), so the W would compute the weight gradient a second "
        f"time; torch's older grammar wrote B for the backward-input action, which is I today. "
        f"Write {stage}I{mb} in place of {stage}B{mb} (backward-input, then {stage}W{mb} for the "
        f"weights), or drop the W to keep the full backward.",
        rule="duplicate-op", device=acts["W"][0], stage=stage, microbatch=mb, kind="W")


def from_actions(order, *, name: str = "torch", microbatches: int | None = None,
                 stages: int | None = None, params: Mapping | None = None) -> Schedule:
    """Import a torch ``pipeline_order`` as a pipecore schedule.

    Parameters
    ----------
    order : mapping of int to list
        ``{rank: [action, ...]}`` with ranks ``0..p-1``; an action is a torch
        ``_Action``, its string form (``"0F3"``, ``"(0F7;7B3)OVERLAP_F_B"``)
        or ``None`` (an idle step, dropped).
    name : str
        Label of the schedule.
    microbatches, stages : int, optional
        What the order should hold; a mismatch is an error.
    params : mapping, optional
        Kept as ``Schedule.params``.

    Returns
    -------
    pipecore.Schedule
        Slots are numbered ``0..n-1`` per device in list order.
        ``REDUCE_GRAD`` actions (torch's end-of-step gradient work, which its
        runtime adds by itself) are dropped.

    Raises
    ------
    ValueError
        If ranks are not ``0..p-1``, an entry cannot be parsed, an overlapped
        action is not one F and one I or B, or the order holds communication
        or FSDP actions (``SEND_F``, ``UNSHARD``, ...: a ``compute_comms``
        order, not a compute-only one).
    pipecore.ScheduleError
        If the imported schedule breaks a pipecore rule (naming the rule,
        device, stage and microbatch), or holds another number of
        microbatches or stages than asked for. A stage and microbatch with
        both a full backward ``B`` and a ``W`` (torch's older grammar,
        where ``B`` was backward-input) is refused with rule
        ``duplicate-op``, naming both actions and ``I``, today's
        backward-input.
    """
    return _from_actions(order, name=name, microbatches=microbatches, stages=stages,
                         params=params)


def _from_actions(order, *, name, microbatches=None, stages=None, params=None, source=None):
    if not isinstance(order, Mapping):
        raise InputError(f"expected a mapping rank -> actions (got {type(order).__name__})")
    ranks = sorted(order)
    if ranks != list(range(len(ranks))):
        raise InputError(f"ranks must be 0..p-1 (got {ranks})")
    programs = []
    seen: dict = {}  # (stage, microbatch) -> {"B" or "W": (rank, step, text)}
    for rank in ranks:
        prog = []
        for step, action in enumerate(order[rank]):
            if isinstance(action, str):
                action = _parse(action, rank, step)
            if action is None:
                continue
            if not isinstance(action, _Action):
                raise InputError(f"rank {rank} step {step}: expected a torch _Action, a string or "
                                 f"None (got {action!r})")
            ctype = action.computation_type
            if ctype == _CT.OVERLAP_F_B:
                subs = action.sub_actions or ()
                if (len(subs) != 2 or subs[0].computation_type != _CT.FORWARD
                        or subs[1].computation_type not in (_CT.BACKWARD_INPUT, _CT.FULL_BACKWARD)):
                    raise InputError(f"rank {rank} step {step}: {action} overlaps "
                                     f"{[str(a) for a in subs]}; pipecore overlaps one F with one "
                                     f"I or B, F first")
                prog.append((_op(subs[0], rank, step), _op(subs[1], rank, step)))
                if subs[1].computation_type == _CT.FULL_BACKWARD:
                    seen.setdefault((subs[1].stage_index, subs[1].microbatch_index), {}).setdefault(
                        "B", (rank, step, str(action)))
            elif ctype == _CT.REDUCE_GRAD:
                continue
            elif ctype in _FROM_TORCH:
                prog.append(_op(action, rank, step))
                if ctype in (_CT.FULL_BACKWARD, _CT.BACKWARD_WEIGHT):
                    letter = "B" if ctype == _CT.FULL_BACKWARD else "W"
                    seen.setdefault((action.stage_index, action.microbatch_index), {}).setdefault(
                        letter, (rank, step, str(action)))
            else:
                raise InputError(f"rank {rank} step {step}: {action} is a {ctype.name} action; "
                                 f"import a compute-only order (F, I, W, B, OVERLAP_F_B)")
        programs.append(prog)
    clash = _full_backward_and_weight(seen, source)
    if clash is not None:
        raise clash
    sched = Schedule.from_programs(programs, name=name, devices=max(len(programs), 1),
                                   params=params)
    for what, want, got in (("microbatches", microbatches, sched.microbatches),
                            ("stages", stages, sched.stages)):
        if want is not None and got != want:
            raise ScheduleError(f"range: the order holds {got} {what}, expected {want}", rule="range")
    return sched


def validate(schedule) -> dict[int, int]:
    """Run torch's own checks on a schedule's export.

    Calls torch's ``_validate_schedule`` on :func:`to_actions`'s order, then
    lowers it the way ``_PipelineScheduleRuntime`` does before running it
    (adding sends and receives), which fails if torch cannot order the
    communication without a hang.

    Parameters
    ----------
    schedule : pipecore.Schedule

    Returns
    -------
    dict of int to int
        torch's ``stage -> rank`` mapping.

    Raises
    ------
    ValueError
        If the schedule cannot be exported (see :func:`to_actions`), a
        device runs no op (torch's runtime needs a stage on every rank), or
        torch rejects the order (torch's message, without its rendering of
        the whole schedule).
    """
    order = to_actions(schedule)
    p, stages, m = int(schedule.devices), int(schedule.stages), int(schedule.microbatches)
    idle = [r for r, acts in order.items() if not acts]
    if idle:
        raise InputError(f"device {idle[0]} of {schedule.name!r} runs no op: torch's runtime needs at "
                         f"least one stage on every rank")
    try:
        mapping = _ts._validate_schedule(order, p, stages, m)
        _ts._add_send_recv({r: list(a) for r, a in order.items()}, mapping.__getitem__, stages)
    except AssertionError as exc:
        head = str(exc).split("\n\nFull pipeline schedule:")[0].strip()
        raise InputError(f"torch rejects the order of {schedule.name!r}: {head}") from None
    return mapping


def to_csv(schedule, path) -> Path:
    """Write the ``compute_only`` CSV that ``_PipelineScheduleRuntime._load_csv`` reads.

    Parameters
    ----------
    schedule : pipecore.Schedule
    path : str or os.PathLike

    Returns
    -------
    pathlib.Path
        The file written: one line per rank (line r is rank r), one cell per
        action in torch's string form.

    Raises
    ------
    ValueError
        As :func:`to_actions`.
    OSError
        If the file cannot be written.
    """
    order = to_actions(schedule)
    path = Path(path)
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        for rank in range(len(order)):
            writer.writerow([str(a) for a in order[rank]])
    return path


def read_csv(path) -> dict[int, list]:
    """Read a ``compute_only`` CSV into a ``pipeline_order`` with torch's own parser.

    Parameters
    ----------
    path : str or os.PathLike

    Returns
    -------
    dict of int to list
        ``{rank: [_Action or None, ...]}``; line r is rank r, an empty cell
        is ``None``.

    Raises
    ------
    ValueError
        If a cell is not an action torch can parse (naming rank and step).
    OSError
        If the file cannot be read.
    """
    try:
        with Path(path).open(newline="", encoding="utf-8") as fh:
            return {rank: [_parse(cell, rank, step) for step, cell in enumerate(row)]
                    for rank, row in enumerate(csv.reader(fh))}
    except UnicodeDecodeError as exc:
        raise InputError(f"{path}: not a text CSV (byte {exc.start} is not UTF-8); a "
                         f"compute_only schedule CSV has one line of actions per rank") from None
    except csv.Error as exc:
        raise InputError(f"{path}: not a readable CSV ({exc})") from None


def from_csv(path, *, name: str | None = None) -> Schedule:
    """Import a ``compute_only`` CSV (torch's ``_dump_csv`` or :func:`to_csv`).

    Parameters
    ----------
    path : str or os.PathLike
    name : str, optional
        Label of the schedule (default: the file's stem).

    Returns
    -------
    pipecore.Schedule

    Raises
    ------
    ValueError, pipecore.ScheduleError
        As :func:`read_csv` and :func:`from_actions`; a ``B`` and a ``W``
        of one stage and microbatch (torch's older grammar) are named by
        file, line (rank) and cell.
    """
    return _from_actions(read_csv(path), name=Path(path).stem if name is None else name,
                         source=path)


class _StubStage:
    """The fields torch's schedule constructors read from a stage; no module, no process group.

    torch computes ``pipeline_order`` for every rank from counts alone, so a
    stand-in with these attributes is enough to obtain it in one process.
    """

    def __init__(self, index, num_stages, ranks):
        self.stage_index = index
        self.num_stages = num_stages
        self.group_size = ranks
        self.group_rank = 0
        self.is_first = index == 0
        self.is_last = index == num_stages - 1
        self.submod = None  # torch's torch.compile check skips a stage without a module
        self.stage_index_to_group_rank = {}


def _resolve(name):
    key = str(name).strip().lower()
    for short, (cls, style) in TORCH_SCHEDULES.items():
        if key in (short.lower(), cls.lower()):
            return short, cls, style
    valid = ", ".join(f"{s} ({c})" for s, (c, _) in TORCH_SCHEDULES.items())
    raise InputError(f"unknown torch schedule {name!r}; valid names: {valid}")


def _rank0_stages(style, ranks, per_rank):
    """Rank 0's stage indices: stage s on rank s % p (loop) or the V's two ends."""
    if style == "v":
        return [0, 2 * ranks - 1]
    return list(range(0, ranks * per_rank, ranks))


def _loss(output, target):  # never called: its presence makes torch build backward actions
    return output.sum()


def from_torch(name: str, ranks: int, microbatches: int, stages_per_rank: int | None = None) -> Schedule:
    """torch's own schedule as a pipecore schedule.

    The schedule class is built in this process with stand-in stages (no
    process group, no model): its constructor computes ``pipeline_order``
    for every rank, which is then imported with :func:`from_actions` and so
    checked by pipecore's rules.

    Parameters
    ----------
    name : str
        One of :data:`TORCH_SCHEDULES` (``"GPipe"``, ``"1F1B"``,
        ``"Interleaved1F1B"``, ``"LoopedBFS"``, ``"InterleavedZeroBubble"``,
        ``"ZBVZeroBubble"``, ``"DualPipeV"``) or torch's class name
        (``"ScheduleZBVZeroBubble"``), case-insensitive.
    ranks : int
        Pipeline ranks p.
    microbatches : int
        Microbatches m.
    stages_per_rank : int, optional
        Stages per rank v: 1 for GPipe and 1F1B, 2 (the default, and the only
        value torch takes) for ZBVZeroBubble and DualPipeV, any v >= 1 for the
        looped ones (default 2).

    Returns
    -------
    pipecore.Schedule
        Named ``"torch-<name>"``; ``params`` records the class, ranks,
        microbatches and stages per rank.

    Raises
    ------
    ValueError
        For an unknown name, a bad count, or a shape torch's class rejects
        (torch's message included).
    pipecore.ScheduleError
        If torch's order breaks a pipecore rule. torch 2.13.0's ``1F1B`` does:
        its last rank never runs the forward of microbatch 0 (and runs one of
        microbatch m, which does not exist), so ``from_torch("1F1B", ...)``
        raises with rule ``missing-op``.
    """
    short, cls_name, style = _resolve(name)
    for what, value in (("ranks", ranks), ("microbatches", microbatches)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"'{what}' must be an int >= 1 (got {value!r})")
    if style == "single":
        if stages_per_rank not in (None, 1):
            raise InputError(f"torch's {cls_name} runs one stage per rank (got stages_per_rank="
                             f"{stages_per_rank})")
        per_rank = 1
    else:
        per_rank = 2 if stages_per_rank is None else stages_per_rank
        if isinstance(per_rank, bool) or not isinstance(per_rank, int) or per_rank < 1:
            raise InputError(f"'stages_per_rank' must be an int >= 1 (got {stages_per_rank!r})")
        if style == "v" and per_rank != 2:
            raise InputError(f"torch's {cls_name} places exactly 2 stages per rank (got "
                             f"stages_per_rank={per_rank})")
    num_stages = ranks * per_rank
    stubs = [_StubStage(i, num_stages, ranks) for i in _rank0_stages(style, ranks, per_rank)]
    cls = getattr(_ts, cls_name)
    try:
        if style == "single":
            built = cls(stubs[0], n_microbatches=microbatches, loss_fn=_loss)
        else:
            built = cls(stubs, n_microbatches=microbatches, loss_fn=_loss)
    except (ValueError, AssertionError) as exc:
        raise InputError(f"torch's {cls_name} rejects ranks={ranks}, microbatches={microbatches}, "
                         f"stages_per_rank={per_rank}: {exc}") from None
    params = {"torch_class": cls_name, "ranks": ranks, "microbatches": microbatches,
              "stages_per_rank": per_rank, "torch_version": torch.__version__}
    try:
        return from_actions(built.pipeline_order, name=f"torch-{short}", microbatches=microbatches,
                            stages=num_stages, params=params)
    except ScheduleError as exc:
        raise ScheduleError(
            f"torch {torch.__version__}'s {cls_name} pipeline_order (ranks={ranks}, microbatches="
            f"{microbatches}) breaks a pipecore rule: {exc}", rule=exc.rule, device=exc.device,
            slot=exc.slot, stage=exc.stage, microbatch=exc.microbatch, kind=exc.kind) from None


def run(schedule, ranks: int | None = None, *, model: str = "mlp", hidden: int = 32,
        layers: int | None = None, batch: int | None = None, steps: int = 1, seed: int = 0,
        timeout: float = 120.0, check: bool = True, measure_transfer: bool = False,
        profile=None, pin: bool | None = None):
    """Run a schedule for real with torch's ``_PipelineScheduleRuntime`` on CPU ranks (gloo).

    One fresh Python process per rank is started (``MASTER_ADDR``
    127.0.0.1, a free port). Every rank builds the same seeded model split
    into the schedule's stages, keeps its own stages, loads the schedule's
    ``compute_only`` CSV with torch's ``_load_csv`` and calls ``step`` on
    one batch per step.

    Parameters
    ----------
    schedule : pipecore.Schedule, str or os.PathLike
        The schedule, or a CSV written by :func:`to_csv` (or torch's
        ``_dump_csv``).
    ranks : int, optional
        Must equal the schedule's devices when given (a check for the CLI).
    model : str
        ``"mlp"``: blocks of ``Linear(hidden, hidden)`` + ``Tanh``, split
        evenly into the schedule's stages; ``"tiny-transformer"``: token
        embedding, pre-norm attention blocks, vocabulary head (see
        ``_torch_run.build_model``), embedding on the first stage and head
        on the last.
    hidden : int
        Layer width.
    layers : int, optional
        Blocks in the whole model (default one per stage); a multiple of the
        stages.
    batch : int, optional
        Rows per step (default 2 per microbatch); a multiple of the
        microbatches.
    steps : int
        Steps to run (gradients are those of the first; more give timings).
    seed : int
        Seed of weights and data.
    timeout : float
        Seconds for torch's collectives; the run is abandoned (its processes
        killed) a minute after that.
    check : bool
        Compare gradients with the model trained without pipelining.
    measure_transfer : bool
        Also time a ping-pong of one activation between ranks 0 and 1.
    profile : str or os.PathLike, optional
        A folder: every rank profiles steps with ``torch.profiler`` (CPU
        activities, shapes recorded), each step inside a
        ``ProfilerStep#i`` label, and writes ``rank{r}.json``
        (Chrome/Kineto trace) there, and ``pipecore-run.json`` (the model,
        shape, profiled and reference steps, each stage's compute times
        with and without the profiler, and the machine's CPUs); read them
        with :func:`from_profile`. The first step sets torch's stages up
        and is not profiled (a one-step run profiles its only step, set-up
        included); runs of up to 4 steps profile the others; longer runs
        profile the middle ones and time the rest without the profiler as
        a reference (``RunResult.profiled_steps``,
        ``RunResult.reference_steps``), which :func:`from_profile` uses to
        take out what the profiler adds to each op.
    pin : bool, optional
        Pin rank r to the r-th CPU this process may use
        (``os.sched_setaffinity``, before gloo starts its threads), so no
        two ranks share a core and none migrates. None (default): pin when
        there are at least as many CPUs as ranks; True: pin, or refuse when
        there are fewer; False: let the OS place them.
        ``RunResult.cpus`` says where each rank ran.

    Returns
    -------
    RunResult
        Gradients, the reference and their largest difference, per-step
        times and per-op times.

    Raises
    ------
    ValueError
        If the schedule cannot be exported, ``ranks`` disagrees with it, or
        an argument is out of range.
    TimeoutError
        If the processes do not finish.
    RuntimeError
        If a rank fails (the end of its traceback included).
    """
    from . import _torch_run

    if isinstance(schedule, (str, bytes)) or hasattr(schedule, "__fspath__"):
        path = Path(schedule).resolve()  # the rank processes read it
        sched = from_csv(path)
    else:
        sched, path = schedule, None
    if ranks is not None and ranks != sched.devices:
        raise InputError(f"the schedule has {sched.devices} ranks (got ranks={ranks})")
    for what, value in (("steps", steps), ("hidden", hidden)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"'{what}' must be an int >= 1 (got {value!r})")
    _torch_run.build_model(model, sched.stages, hidden, seed, layers)  # bad model arguments fail here
    mapping = validate(sched)
    stages_of_rank = [[s for s in sorted(mapping) if mapping[s] == r] for r in range(sched.devices)]
    cpus = _pins(pin, sched.devices)
    kwargs = dict(stages=sched.stages, microbatches=sched.microbatches, model=model, hidden=hidden,
                  layers=layers, batch=batch, steps=steps, seed=seed, timeout=timeout, check=check,
                  measure_transfer=measure_transfer, profile=profile, cpus=cpus)
    if path is not None:
        result = _torch_run.run_csv(path, stages_of_rank, **kwargs)
    else:
        with tempfile.TemporaryDirectory(prefix="pipecore-csv-") as tmp:
            csv_path = to_csv(sched, Path(tmp) / "schedule.csv")
            result = _torch_run.run_csv(csv_path, stages_of_rank, **kwargs)
    if profile is not None:
        # What `pipecore what-if --check` needs to run other schedules on the same setup.
        import json

        from pipecore.core.cpus import local_cpus

        from ._profile import RUN_FILE

        (Path(profile) / RUN_FILE).write_text(json.dumps(
            {"schedule": sched.name, "ranks": sched.devices, "stages": sched.stages,
             "microbatches": sched.microbatches, "model": model, "hidden": hidden,
             "layers": layers, "batch": batch, "steps": steps, "seed": seed,
             "profiled_steps": result.profiled_steps,
             "reference_steps": result.reference_steps, "op_seconds": result.op_seconds(),
             "step_times": result.step_times,
             "cpus": local_cpus(),
             "pinned": cpus, "threads": result.threads, "pin": pin}, indent=1))
    return result


def _pins(pin, ranks):
    """The CPU of each rank (a list), or None to leave placement to the OS."""
    from pipecore.core.cpus import cpu_ids

    if pin not in (None, True, False):
        raise InputError(f"'pin' must be None, True or False (got {pin!r})")
    ids = cpu_ids()
    if pin is False or ids is None and pin is None:
        return None
    if ids is None:
        raise InputError("pin=True: this OS gives no CPU affinity (os.sched_setaffinity)")
    if len(ids) < ranks:
        if pin:
            raise InputError(f"pin=True needs a CPU per rank: {ranks} ranks, {len(ids)} CPUs "
                             f"this process may use ({ids})")
        return None
    return ids[:ranks]


def _stage_times(mod, x, first, repeats, warmup):
    """Median F, B, W and fused BW seconds of one stage on input ``x``."""
    params = [q for q in mod.parameters() if q.requires_grad]
    inp = x.detach().clone().requires_grad_(not first)
    samples = {"F": [], "B": [], "W": [], "BW": []}
    for i in range(warmup + repeats):
        t0 = time.perf_counter()
        out = mod(inp)
        t1 = time.perf_counter()
        grad = torch.ones_like(out)
        if not first:
            torch.autograd.grad(out, inp, grad, retain_graph=True)
        t2 = time.perf_counter()
        torch.autograd.grad(out, params, grad)
        t3 = time.perf_counter()
        out = mod(inp)
        t4 = time.perf_counter()
        torch.autograd.grad(out, ([] if first else [inp]) + params, grad)
        t5 = time.perf_counter()
        if i >= warmup:
            for kind, dt in (("F", t1 - t0), ("B", t2 - t1), ("W", t3 - t2), ("BW", t5 - t4)):
                samples[kind].append(dt)
    return {k: statistics.median(v) for k, v in samples.items()}, out.detach()


def calibrate(model_stages, example_input, *, repeats: int = 20, warmup: int = 3, threads: int = 1,
              comm: float = 0.0, return_times: bool = False):
    """Measure each stage's F, B (input grad) and W (weight grad) times -> :class:`pipecore.Costs`.

    Runs in this process, one stage after the other, on one microbatch:
    F is the stage's forward; B is the gradient with respect to the stage's
    input (zero for stage 0, whose input needs none: torch's runtime then
    does all of stage 0's backward in W); W is the gradient with respect to
    the parameters, after B. Each is the median of ``repeats`` timings. The
    output gradient fed to a stage is all ones (its values do not change the
    time).

    Parameters
    ----------
    model_stages : sequence of torch.nn.Module
        The stages in model order (each maps the previous one's output).
    example_input : torch.Tensor
        One microbatch of input to stage 0.
    repeats, warmup : int
        Timed and untimed repetitions per measurement.
    threads : int
        torch intra-op threads while measuring (a run uses 1 per rank).
    comm : float
        Transfer time per cross-device dependency, seconds (e.g.
        ``RunResult.transfer``), stored as ``Costs.comm``.
    return_times : bool
        Also return the per-stage times, with the fused backward ``BW``
        measured separately (pipecore models BW as B + W).

    Returns
    -------
    pipecore.Costs or (pipecore.Costs, dict)
        Per-stage vectors ``f``, ``b``, ``w`` in seconds, and ``comm``; with
        ``return_times``, also ``{"F": [...], "B": [...], "W": [...],
        "BW": [...]}``.

    Raises
    ------
    ValueError
        If there are no stages or a count is below 1.
    """
    stages = list(model_stages)
    if not stages:
        raise InputError("calibrate needs at least one stage")
    for what, value in (("repeats", repeats), ("threads", threads)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(f"'{what}' must be an int >= 1 (got {value!r})")
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    times = {"F": [], "B": [], "W": [], "BW": []}
    try:
        x = example_input
        for s, mod in enumerate(stages):
            measured, x = _stage_times(mod, x, s == 0, repeats, warmup)
            for kind, dt in measured.items():
                times[kind].append(dt)
    finally:
        torch.set_num_threads(saved)
    costs = Costs(f=np.array(times["F"]), b=np.array(times["B"]), w=np.array(times["W"]), comm=comm)
    return (costs, times) if return_times else costs


def costs_from_run(result, warmup: int = 1, comm: float | None = None,
                   overhead: bool = True) -> Costs:
    """:class:`pipecore.Costs` from the times a real run measured.

    Per stage, the mean over microbatches and steps (after ``warmup``) of
    each compute kind (a device's busy time is the sum of its ops). A stage that ran fused backwards (BW) gets ``b`` =
    that time and ``w`` = 0 (pipecore times a BW as b + w). With
    ``overhead``, each op also carries its rank's share of the time torch's
    runtime spent neither computing nor waiting on a receive (dispatch,
    posting sends and receives, the loss): per rank and step, that time
    divided by the rank's compute calls, median over steps.

    Parameters
    ----------
    result : RunResult
        From :func:`run`.
    warmup : int
        Steps to leave out (when the run has more).
    comm : float, optional
        Transfer time; default the run's ping-pong ``transfer`` (or 0).
    overhead : bool
        Add the runtime's per-op overhead to every op's time.

    Returns
    -------
    pipecore.Costs
        Per-stage ``f``, ``b``, ``w`` in seconds, and ``comm``.

    Raises
    ------
    ValueError
        If a stage has no timed F or no backward.
    """
    first = warmup if len(result.op_times) > warmup else 0
    samples: dict = {}
    share: dict = {}
    rank_of: dict = {}
    for i in range(first, len(result.op_times)):
        calls: dict = {}
        computing: dict = {}
        waiting: dict = {}
        for rank, stage, kind, dt in result.op_times[i]:
            if stage >= 0:
                samples.setdefault((stage, kind), []).append(dt)
                rank_of[stage] = rank
                calls[rank] = calls.get(rank, 0) + 1
                computing[rank] = computing.get(rank, 0.0) + dt
            elif kind == "wait":
                waiting[rank] = waiting.get(rank, 0.0) + dt
        for rank, n in calls.items():
            # What the rank spent in step() neither computing nor waiting on a receive, per call.
            spent = result.rank_times[i][rank] if result.rank_times else computing[rank]
            rest = spent - computing[rank] - waiting.get(rank, 0.0)
            share.setdefault(rank, []).append(max(rest, 0.0) / n)
    med = {key: statistics.fmean(v) for key, v in samples.items()}
    f, b, w = [], [], []
    for s in range(result.stages):
        if (s, "F") not in med or not ((s, "BW") in med or (s, "B") in med):
            raise InputError(f"the run timed no F or no backward of stage {s}")
        extra = statistics.median(share[rank_of[s]]) if overhead else 0.0
        f.append(med[(s, "F")] + extra)
        if (s, "BW") in med:
            b.append(med[(s, "BW")] + extra)
            w.append(0.0)
        else:
            b.append(med[(s, "B")] + extra)
            w.append(med.get((s, "W"), 0.0) + extra)
    if comm is None:
        comm = result.transfer or 0.0
    return Costs(f=np.array(f), b=np.array(b), w=np.array(w), comm=comm)


def ranking_agreement(rows, spread: str = "range") -> tuple[int, int, list]:
    """Whether predictions order schedules as measurements do, where measurements tell them apart.

    A pair of schedules counts when their measured spreads do not overlap:
    ``low``..``high`` (the range over repeats) or, with ``spread="iqr"``,
    ``q1``..``q3`` (the interquartile range).

    Parameters
    ----------
    rows : sequence of mapping
        Each with ``schedule``, ``predicted``, ``measured`` and the spread's
        two bounds.
    spread : {"range", "iqr"}

    Returns
    -------
    (int, int, list)
        Pairs that agree, pairs counted, and the disagreeing pairs as
        ``(faster measured, slower measured)`` names.

    Raises
    ------
    ValueError
        For another ``spread``.
    KeyError
        If a row lacks a field.
    """
    if spread not in ("range", "iqr"):
        raise InputError(f"spread must be 'range' or 'iqr' (got {spread!r})")
    lo, hi = ("low", "high") if spread == "range" else ("q1", "q3")
    agree, counted, wrong = 0, 0, []
    for i, a in enumerate(rows):
        for c in rows[i + 1:]:
            fast, slow = (a, c) if a["measured"] < c["measured"] else (c, a)
            if fast[hi] >= slow[lo]:
                continue  # within the spread: the measurement does not rank them
            counted += 1
            if fast["predicted"] < slow["predicted"]:
                agree += 1
            else:
                wrong.append((fast["schedule"], slow["schedule"]))
    return agree, counted, wrong


def _quartiles(values):
    if len(values) < 2:
        return values[0], values[0]
    q = statistics.quantiles(values, n=4, method="inclusive")
    return q[0], q[2]


def fidelity(names=("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v"), ranks: int = 2,
             microbatches: int = 8, *, hidden: int = 256, layers: int = 8, rows: int = 64,
             repeats: int = 5, steps: int = 8, warmup: int = 2, seed: int = 0) -> list[dict]:
    """Predicted against measured iteration time of real runs, with spreads.

    Every schedule is run ``repeats`` times (each run a fresh set of
    processes; schedules interleaved so that changes in the machine's load
    fall on all of them), ``steps`` steps per run; a run's measurement is its
    median step after ``warmup``. Each run is predicted by a pipecore
    simulation (:func:`pipecore.simulate`) with the costs that run measured
    (:func:`costs_from_run`: per-stage F, B, W with the runtime's per-op
    overhead, and the ping-pong transfer time), so that load on the machine
    during a run weighs on its prediction too. ``predicted_calibrate`` uses
    :func:`calibrate` in this process instead (no runtime overhead).

    Parameters
    ----------
    names : sequence of str
        pipecore families (built with their default chunks).
    ranks, microbatches : int
        Shape of every schedule.
    hidden, layers, rows : int
        The MLP: width, blocks in the whole model (a multiple of every
        schedule's stages), rows per microbatch.
    repeats, steps, warmup : int
        Runs per schedule, steps per run, steps left out of each.
    seed : int

    Returns
    -------
    list of dict
        Per schedule: ``schedule``, ``stages``, ``measured`` (median of the
        runs' medians, s), ``low``/``high`` (their range), ``q1``/``q3``
        (their quartiles), ``runs`` (each run's median), ``predicted``
        (median of the runs' predictions), ``predictions``, ``error``
        (median over runs of predicted / measured - 1), ``error_low`` /
        ``error_high`` (their range), ``predicted_calibrate``,
        ``error_calibrate`` (against ``measured``), ``transfer`` (median
        ping-pong time, s).

    Raises
    ------
    ValueError
        If a family cannot build the shape or cannot be exported.
    """
    from pipecore.core.simulate import simulate
    from pipecore.schedules.registry import build

    from . import _torch_run

    scheds = {n: build(n, ranks, microbatches) for n in names}
    results: dict = {n: [] for n in names}
    for _ in range(repeats):
        for n, sched in scheds.items():
            results[n].append(run(sched, hidden=hidden, layers=layers, batch=rows * microbatches,
                                  steps=steps, seed=seed, check=False, measure_transfer=True))
    transfer = statistics.median(r.transfer for rs in results.values() for r in rs
                                 if r.transfer is not None)
    out = []
    for n, sched in scheds.items():
        medians = [r.iteration_time(warmup) for r in results[n]]
        preds = [simulate(sched, costs_from_run(r, warmup)).makespan for r in results[n]]
        errors = [p / m - 1 for p, m in zip(preds, medians)]
        modules = _torch_run.build_model("mlp", sched.stages, hidden, seed, layers)
        calibrated = calibrate(modules, torch.randn(rows, hidden), comm=transfer)
        measured = statistics.median(medians)
        predicted_cal = simulate(sched, calibrated).makespan
        q1, q3 = _quartiles(medians)
        out.append({"schedule": n, "stages": sched.stages, "measured": measured, "low": min(medians),
                    "high": max(medians), "q1": q1, "q3": q3, "runs": medians,
                    "predicted": statistics.median(preds), "predictions": preds,
                    "error": statistics.median(errors), "error_low": min(errors),
                    "error_high": max(errors), "predicted_calibrate": predicted_cal,
                    "error_calibrate": predicted_cal / measured - 1, "transfer": transfer})
    return out


def format_fidelity(rows) -> str:
    """The fidelity table (milliseconds): predicted, measured with its spreads, errors; a summary.

    Parameters
    ----------
    rows : list of dict
        From :func:`fidelity`.

    Returns
    -------
    str

    Raises
    ------
    KeyError
        If a row lacks a field.
    """
    lines = [f"{'schedule':<17} {'predicted':>9} {'measured':>9} {'range':>13} {'IQR':>13} "
             f"{'error':>7} {'error range':>15} {'calibrate()':>11} {'error':>7}"]
    for r in rows:
        lines.append(
            f"{r['schedule']:<17} {r['predicted'] * 1e3:>9.2f} {r['measured'] * 1e3:>9.2f} "
            f"{r['low'] * 1e3:>6.1f}-{r['high'] * 1e3:<6.1f} {r['q1'] * 1e3:>6.1f}-{r['q3'] * 1e3:<6.1f} "
            f"{r['error']:>+7.1%} {r['error_low']:>+7.1%}..{r['error_high']:<+6.1%} "
            f"{r['predicted_calibrate'] * 1e3:>11.2f} {r['error_calibrate']:>+7.1%}")
    mae = statistics.median(abs(r["error"]) for r in rows)
    mae_cal = statistics.median(abs(r["error_calibrate"]) for r in rows)
    spread = statistics.median((r["high"] - r["low"]) / r["measured"] for r in rows)
    iqr = statistics.median((r["q3"] - r["q1"]) / r["measured"] for r in rows)
    lines.append(f"median |error|: {mae:.1%} (costs measured on the runs), {mae_cal:.1%} "
                 f"(calibrate()); measured spread / median: range {spread:.1%}, IQR {iqr:.1%}")
    for spread_name in ("range", "iqr"):
        agree, counted, wrong = ranking_agreement(rows, spread_name)
        lines.append(f"ranking ({spread_name}): {agree} of {counted} pairs separated by more than "
                     f"their spread agree" + (f"; disagree: {wrong}" if wrong else ""))
    return "\n".join(lines)

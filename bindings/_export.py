"""Export and import of schedules in torch's own forms: ``pipeline_order`` and its CSV.

Part of :mod:`pipecore.bindings.torch`, which re-exports the public names and
whose docstring says how pipecore's kinds map to torch's computation types
and what cannot be exported.
"""

from __future__ import annotations

import csv
from collections.abc import Mapping
from pathlib import Path

from torch.distributed.pipelining import schedules as _ts

from pipecore.core.ops import InputError
from pipecore.core.schedule import Schedule, ScheduleError

__all__ = ["to_actions", "from_actions", "validate", "to_csv", "from_csv", "read_csv"]

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
    "O": "torch has no action that moves an activation off its rank (to host or to another "
         "rank, as offload and BPipe do); its schedules keep each activation on its stage's rank",
    "L": "torch has no action that loads an offloaded activation back (to host or from another "
         "rank, as offload and BPipe do); its schedules keep each activation on its stage's rank",
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
            continue  # no pipeline_order counterpart; see pipecore.bindings.torch's docstring
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

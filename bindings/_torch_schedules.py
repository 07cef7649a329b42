"""torch's own schedule classes, built in one process and imported as pipecore schedules.

Part of :mod:`pipecore.bindings.torch`, which re-exports :func:`from_torch`
and :data:`TORCH_SCHEDULES`.
"""

from __future__ import annotations

import torch
from torch.distributed.pipelining import schedules as _ts

from pipecore.core.ops import InputError
from pipecore.core.schedule import Schedule, ScheduleError

from ._export import from_actions

__all__ = ["TORCH_SCHEDULES", "from_torch"]

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

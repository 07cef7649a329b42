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
turn measured stage times into :class:`pipecore.Costs`; :func:`measure_hardware`
(and ``pipecore calibrate``) times GEMMs, memory, kernels and collectives for
:meth:`pipecore.Hardware.calibrate` and :meth:`pipecore.Cluster.calibrate`; :func:`timed_runs`
times schedules over repeated runs with their spread, and :func:`fidelity`
compares pipecore's predicted iteration times with measured ones.

torch's private API (``_Action``, ``_validate_schedule``,
``_PipelineScheduleRuntime``) is what this module talks to; it was written
against torch 2.13.0 (:data:`TESTED_TORCH`).

This module gathers the public names; the code lives in private modules of
one idea each: ``_export`` (``pipeline_order`` and its CSV, both ways),
``_torch_schedules`` (torch's own schedule classes), ``_run`` and
``_torch_run`` (real runs on CPU ranks), ``_calibrate`` (costs from
measured times), ``_fidelity`` (predicted against measured, with spreads),
``_trace`` and ``_profile`` (profiler traces read and costs fitted),
``_what_if`` (every family ranked on a profile) and ``_hardware`` with
``_bench_rank`` (the machine's measurements).
"""

from __future__ import annotations

try:
    import torch  # noqa: F401  (only to say how to install it when it is missing)
except ImportError as _exc:  # pragma: no cover - exercised only without torch
    raise ImportError(
        "pipecore.bindings.torch needs PyTorch; install it with: pip install 'pipecore[torch]'"
    ) from _exc

from ._calibrate import calibrate, costs_from_run
from ._export import from_actions, from_csv, read_csv, to_actions, to_csv, validate
from ._fidelity import fidelity, format_fidelity, ranking_agreement, timed_runs
from ._hardware import measure_hardware
from ._profile import Profile, from_profile
from ._run import run
from ._torch_run import RunResult
from ._torch_schedules import TORCH_SCHEDULES, from_torch
from ._what_if import WhatIfRanking, format_what_if, what_if

__all__ = [
    "TESTED_TORCH", "TORCH_SCHEDULES", "to_actions", "from_actions", "validate", "to_csv",
    "from_csv", "read_csv", "from_torch", "run", "RunResult", "calibrate", "costs_from_run", "fidelity",
    "format_fidelity", "ranking_agreement", "from_profile", "Profile", "what_if",
    "format_what_if", "WhatIfRanking", "timed_runs", "measure_hardware",
]

#: The torch release these bindings were written and tested against.
TESTED_TORCH = "2.13.0"

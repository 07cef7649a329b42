"""Per-stage costs measured on real work: in this process, or from a run's op times.

Part of :mod:`pipecore.bindings.torch`, which re-exports :func:`calibrate`
and :func:`costs_from_run`.
"""

from __future__ import annotations

import statistics
import time

import numpy as np
import torch

from pipecore.core.costs import Costs
from pipecore.core.ops import InputError

__all__ = ["calibrate", "costs_from_run"]


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
    each compute kind (a device's busy time is the sum of its ops). A stage
    that ran fused backwards (BW) gets ``b`` = that time and ``w`` = 0
    (pipecore times a BW as b + w). With
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

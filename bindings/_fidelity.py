"""Predicted against measured step times of real runs, with the spread of repeated runs.

:func:`timed_runs` is the protocol every such comparison here uses
(:func:`fidelity`, ``pipecore what-if --check``, the torch tutorial): schedules
run in turn, each run a fresh set of processes, a run's time its median step
after the warm-up, a schedule's time the median over its runs beside their
range and quartiles. Part of :mod:`pipecore.bindings.torch`, which re-exports
:func:`timed_runs`, :func:`fidelity`, :func:`format_fidelity` and
:func:`ranking_agreement`.
"""

from __future__ import annotations

import inspect
import statistics
from collections.abc import Mapping

import torch

from pipecore.core.ops import InputError
from pipecore.core.schedule import Schedule

from . import _run
from ._calibrate import calibrate, costs_from_run
from ._run import run

__all__ = ["timed_runs", "fidelity", "format_fidelity", "ranking_agreement"]


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


def timed_runs(schedules, repeats: int = 3, *, warmup: int = 2, **options) -> dict[str, dict]:
    """Time schedules in real runs, each ``repeats`` times, in turn, with the spread of the runs.

    Every schedule runs once before any runs again, so that a slow phase of
    the machine falls on all of them; each run is a fresh set of processes
    (:func:`run`). A run's time is its median step after ``warmup`` steps
    (:meth:`RunResult.iteration_time`); a schedule's is the median of its
    runs' times, with their range and quartiles as its spread.

    Parameters
    ----------
    schedules : mapping of str to pipecore.Schedule, or sequence of pipecore.Schedule
        What to run, by name (a sequence is keyed by each schedule's
        ``name``).
    repeats : int
        Runs per schedule.
    warmup : int
        Steps left out of each run's median (torch sets its stages up in
        the first); a run of no more steps keeps them all.
    **options
        Passed to :func:`run` for every run: ``model``, ``hidden``,
        ``layers``, ``batch``, ``steps``, ``seed``, ``pin``,
        ``measure_transfer``; ``check`` is False unless given.

    Returns
    -------
    dict of str to dict
        Per name, in the order given: ``schedule`` (the name),
        ``measured`` (median of the runs' times, s), ``low`` / ``high``
        (their range, s), ``q1`` / ``q3`` (their quartiles, s), ``runs``
        (each run's time, s, in run order) and ``results`` (each run's
        :class:`RunResult`).

    Raises
    ------
    ValueError
        If ``repeats`` is not an int >= 1, two schedules share a name, an
        option is not one of :func:`run`'s (``ranks`` and ``profile`` are
        not taken), or as :func:`run`.
    """
    if isinstance(repeats, bool) or not isinstance(repeats, int) or repeats < 1:
        raise InputError(f"'repeats' must be an int >= 1 (got {repeats!r})")
    allowed = set(inspect.signature(_run.run).parameters) - {"schedule", "ranks", "profile"}
    for key in options:
        if key not in allowed:
            raise InputError(f"timed_runs: {key!r} is not an option of its runs; they take "
                             f"{', '.join(sorted(allowed))} (no profiler: the runs are timed)")
    if isinstance(schedules, Mapping):
        scheds = dict(schedules)
    else:
        scheds = {}
        for sched in schedules:
            if not isinstance(sched, Schedule):
                raise InputError(f"timed_runs: expected a mapping of names to schedules or a "
                                 f"sequence of pipecore.Schedule (got a {type(sched).__name__} "
                                 f"in the sequence: {sched!r:.40})")
            if sched.name in scheds:
                raise InputError(f"two schedules are named {sched.name!r}; pass a mapping "
                                 f"{{name: schedule}} to tell them apart")
            scheds[sched.name] = sched
    options.setdefault("check", False)
    results: dict = {n: [] for n in scheds}
    for _ in range(repeats):
        for n, sched in scheds.items():
            results[n].append(run(sched, **options))
    out = {}
    for n in scheds:
        times = [r.iteration_time(warmup) for r in results[n]]
        q1, q3 = _quartiles(times)
        out[n] = {"schedule": n, "measured": statistics.median(times), "low": min(times),
                  "high": max(times), "q1": q1, "q3": q3, "runs": times, "results": results[n]}
    return out


def fidelity(names=("gpipe", "1f1b", "interleaved-1f1b", "zb-h1", "zb-v"), ranks: int = 2,
             microbatches: int = 8, *, hidden: int = 256, layers: int = 8, rows: int = 64,
             repeats: int = 5, steps: int = 8, warmup: int = 2, seed: int = 0) -> list[dict]:
    """Predicted against measured iteration time of real runs, with spreads.

    Every schedule is run ``repeats`` times (:func:`timed_runs`: each run a
    fresh set of processes; schedules interleaved so that changes in the
    machine's load fall on all of them), ``steps`` steps per run; a run's
    measurement is its median step after ``warmup``. Each run is predicted by a pipecore
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
    timed = timed_runs(scheds, repeats, warmup=warmup, hidden=hidden, layers=layers,
                       batch=rows * microbatches, steps=steps, seed=seed, measure_transfer=True)
    transfer = statistics.median(r.transfer for t in timed.values() for r in t["results"]
                                 if r.transfer is not None)
    out = []
    for n, sched in scheds.items():
        t = timed[n]
        medians, measured = t["runs"], t["measured"]
        preds = [simulate(sched, costs_from_run(r, warmup)).makespan for r in t["results"]]
        errors = [p / m - 1 for p, m in zip(preds, medians)]
        modules = _torch_run.build_model("mlp", sched.stages, hidden, seed, layers)
        calibrated = calibrate(modules, torch.randn(rows, hidden), comm=transfer)
        predicted_cal = simulate(sched, calibrated).makespan
        out.append({"schedule": n, "stages": sched.stages, "measured": measured, "low": t["low"],
                    "high": t["high"], "q1": t["q1"], "q3": t["q3"], "runs": medians,
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

"""Predicted against measured step times of real runs, with the spread of repeated runs.

Part of :mod:`pipecore.bindings.torch`, which re-exports :func:`fidelity`,
:func:`format_fidelity` and :func:`ranking_agreement`.
"""

from __future__ import annotations

import statistics

import torch

from pipecore.core.ops import InputError

from ._calibrate import calibrate, costs_from_run
from ._run import run

__all__ = ["fidelity", "format_fidelity", "ranking_agreement"]


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

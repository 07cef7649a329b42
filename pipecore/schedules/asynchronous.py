"""Asynchronous pipelines: 1F1B streamed without a flush, weights updated
while later microbatches are still in flight.

PipeDream (Narayanan et al., SOSP 2019) updates a stage's weights after
every microbatch's backward and stashes, per microbatch in flight, the
version its forward used (weight stashing). PipeDream-2BW (Narayanan et
al., ICML 2021) accumulates ``k >= p`` microbatches per optimizer step and
keeps two versions. LayerPipe2 (Unnikrishnan and Parhi, 2025) delays each
layer's gradient by the number of stages downstream of it, and either
stores the past weights or reconstructs them from a moving average.

The op order of all three is 1F1B's over the whole stream (device d keeps
p - d microbatches in flight); what sets them apart is when weights update
and which version each microbatch uses. A schedule records that in its
``params``: ``accumulation`` (microbatches per optimizer step, k),
``weight_sync`` (``"stage"``: a step takes the newest version on each
stage when it reaches that stage; ``"input"``: the newest version on the
input stage when the step enters the pipeline, used on every stage) and
``weight_versions`` (copies of each stage's weights held, which
``Result.static_memory`` counts for the whole run: their steady-state
number, which the first steps of the stream do not reach yet).
:func:`pipecore.steady_state` reads the versions back from the op order and
measures the steady-state throughput.
"""

from __future__ import annotations

import math

import numpy as np

from ..core.costs import Costs
from ..core.ops import InputError
from ..core.schedule import check_int
from .onef1b import _one_f_one_b_slots, formula_1f1b
from .papers import LAYERPIPE2, PIPEDREAM, PIPEDREAM_2BW
from .registry import Family, register, with_builder_doc, with_formula_doc

__all__ = ["ASYNCHRONOUS", "steady_forms", "stage_staleness", "stage_versions"]

#: The asynchronous families: name -> (version rule, fixed accumulation or
#: None where the family takes it as an option).
ASYNCHRONOUS = {"pipedream": ("stage", 1), "pipedream-2bw": ("input", None),
                "layerpipe2": ("stage", 1)}

HISTORIES = ("stash", "ema")


def stage_staleness(devices: int, accumulation: int, sync: str) -> np.ndarray:
    """Closed-form staleness of each stage in steady state, in optimizer steps.

    Under 1F1B's order stage s holds a = p - 1 - s microbatches ahead of the
    one it admits, so the updates it has applied lag its newest step by
    ceil(a / k). With ``"stage"`` each stage uses its own newest version
    (PipeDream's weight stashing: ``p - 1 - s`` for k = 1, its update rule
    W^(t+1) = W^(t) - lr grad f(W_1^(t-p+1), ..., W_p^(t))); with
    ``"input"`` every stage uses the input stage's version, ceil((p - 1)/k)
    (1 for PipeDream-2BW's k >= p - 1: W^(t+1) = W^(t) - lr grad f(W^(t-1))).

    Parameters
    ----------
    devices : int
        Pipeline devices p (one stage each).
    accumulation : int
        Microbatches per optimizer step k.
    sync : {"stage", "input"}
        Which stage's newest version a step uses.

    Returns
    -------
    numpy.ndarray
        int64, one per stage.

    Raises
    ------
    ValueError
        If ``sync`` is neither, or a count is not an int >= 1.
    """
    p = check_int("devices", devices, minimum=1)
    k = check_int("accumulation", accumulation, minimum=1)
    ahead = p - 1 - np.arange(p, dtype=np.int64)
    if sync == "stage":
        return -(-ahead // k)
    if sync == "input":
        return np.full(p, -(-(p - 1) // k), dtype=np.int64)
    raise InputError(f"'sync' must be 'stage' or 'input' (got {sync!r})")


def stage_versions(devices: int, accumulation: int, sync: str) -> np.ndarray:
    """Closed-form weight versions each stage needs at once in steady state.

    Weight stashing with k = 1 (``"stage"``): stage s holds one version per
    microbatch in flight, p - s (the last stage none stashed, its one live
    copy). Two-buffered (``"input"``, k >= p - 1): 2 on every stage once
    p > 1 (the version of the step in flight and the one just produced).

    Parameters
    ----------
    devices : int
        Pipeline devices p.
    accumulation : int
        Microbatches per optimizer step k.
    sync : {"stage", "input"}
        The version rule (see :func:`stage_staleness`).

    Returns
    -------
    numpy.ndarray
        int64, one per stage.

    Raises
    ------
    ValueError
        For a rule and accumulation with no closed form here: ``"stage"``
        with k > 1, ``"input"`` with k < p - 1.
    """
    p = check_int("devices", devices, minimum=1)
    k = check_int("accumulation", accumulation, minimum=1)
    if sync == "stage" and k == 1:
        return p - np.arange(p, dtype=np.int64)
    if sync == "input" and k >= p - 1:
        return np.full(p, 2 if p > 1 else 1, dtype=np.int64)
    raise InputError(f"no closed form for weight versions with sync={sync!r} and "
                     f"accumulation={k} on {p} devices (weight stashing takes k = 1, "
                     f"two buffers k >= p - 1)")


def steady_forms(name: str, devices: int, accumulation: int | None = None,
                 costs: Costs | None = None, history: str = "stash",
                 microbatch_size: float = 1.0) -> dict:
    """Closed forms of an asynchronous family in steady state (equal stages,
    no communication), beside 1F1B with a flush after every step.

    Parameters
    ----------
    name : str
        ``"pipedream"``, ``"pipedream-2bw"`` or ``"layerpipe2"``.
    devices : int
        Pipeline devices p.
    accumulation : int, optional
        Microbatches per optimizer step k for ``pipedream-2bw`` (default p);
        the others update after every microbatch (k = 1).
    costs : Costs, optional
        Scalar costs (default ``Costs()``).
    history : {"stash", "ema"}, default "stash"
        For ``layerpipe2``: store the past weights, or keep one moving
        average per stage that reconstructs them.
    microbatch_size : float, default 1.0
        Samples per microbatch.

    Returns
    -------
    dict
        ``accumulation``; ``iteration_time`` = k (T + 2 (p - 1) c / p) with
        T = T_F + T_BW and c = ``costs.comm``, time per optimizer step
        (lower is better: device 0 keeps p microbatches in flight, and each
        one's round trip takes p T + 2 (p - 1) c); ``samples_per_time`` = k *
        microbatch_size / iteration_time (higher is better);
        ``flush_iteration_time`` = (k + p - 1) T, 1F1B's step with its
        flush, and ``speedup`` = (k + p - 1) / k, their ratio (times the
        samples per time of 1F1B), both None when c > 0 (1F1B's flush with
        communication has no closed form here); ``staleness`` and
        ``versions`` per stage (steps,
        versions); ``weight_copies`` per stage (copies held: the versions,
        or 2 with a moving average where a stage has a delay);
        ``weight_memory`` per device, in the unit of ``Costs.weights``.

    Raises
    ------
    ValueError
        For an unknown name, a bad option, or a per-stage cost vector.
    """
    key = str(name).strip().lower()
    if key not in ASYNCHRONOUS:
        raise InputError(f"{name!r} is not an asynchronous family; valid names: "
                         f"{', '.join(ASYNCHRONOUS)}")
    p = check_int("devices", devices, minimum=1)
    sync, fixed = ASYNCHRONOUS[key]
    k = fixed if fixed is not None else _accumulation(p, accumulation)
    if fixed is not None and accumulation not in (None, fixed):
        raise InputError(f"'{key}' updates after every microbatch: 'accumulation' must be 1 or "
                         f"None (got {accumulation!r})")
    _check_history(history)
    c = Costs() if costs is None else costs
    for field in ("f", "b", "w", "comm", "weights") + (("bw",) if c.bw is not None else ()):
        if np.ndim(getattr(c, field)) != 0:
            raise InputError(f"closed forms assume equal stages: Costs '{field}' must be a scalar")
    size = float(microbatch_size)
    if not math.isfinite(size) or size <= 0:
        raise InputError(f"'microbatch_size' must be a finite number > 0 (got {microbatch_size!r})")
    op = c.f + (c.b + c.w if c.bw is None else c.bw)
    period = k * (op + 2 * (p - 1) * c.comm / p)
    flush = (k + p - 1) * op if c.comm == 0 else None
    staleness = stage_staleness(p, k, sync)
    versions = stage_versions(p, k, sync)
    copies = _copies(versions, staleness, history if key == "layerpipe2" else "stash")
    return {"accumulation": k, "iteration_time": period,
            "samples_per_time": k * size / period if period else math.inf,
            "flush_iteration_time": flush,
            "speedup": None if flush is None else (flush / period if period else 1.0),
            "staleness": staleness, "versions": versions, "weight_copies": copies,
            "weight_memory": copies * float(c.weights)}


def _copies(versions, staleness, history):
    """Copies of each stage's weights held: every needed version when
    stored; with a moving average, the live weights plus one average where
    the stage has a delay (none where it has not)."""
    if history == "ema":
        return np.where(staleness > 0, 2, 1).astype(np.int64)
    return versions


def _accumulation(p, accumulation):
    if accumulation is None:
        return p
    k = check_int("accumulation", accumulation, minimum=1)
    if k < p:
        raise InputError(f"'pipedream-2bw' needs accumulation >= devices (got accumulation={k} "
                         f"on {p} devices): with fewer microbatches per step than stages, "
                         f"two weight versions do not cover the microbatches in flight "
                         f"(the paper's m >= d)")
    return k


def _check_history(history):
    if history not in HISTORIES:
        raise InputError(f"'history' must be one of {', '.join(map(repr, HISTORIES))} "
                         f"(got {history!r})")


def _stream(name, devices, microbatches, accumulation, sync, copies):
    """1F1B's order over the whole stream, with the weight rule in params."""
    sched = _one_f_one_b_slots(name, devices, microbatches,
                               [min(devices - d, microbatches) for d in range(devices)])
    sched.params.update(accumulation=accumulation, weight_sync=sync,
                        weight_versions=[int(x) for x in copies])
    return sched


@with_builder_doc(microbatches="Microbatches m in the stream (no flush between optimizer steps).")
def build_pipedream(devices, microbatches, chunks=1):
    """1F1B without a flush; every stage updates after each backward.

    Device d keeps p - d microbatches in flight and stashes the weight
    version each one's forward used until its backward: p - d versions
    (``params['weight_versions']``), staleness p - 1 - d steps.
    """
    p = devices
    return _stream("pipedream", p, microbatches, 1, "stage", stage_versions(p, 1, "stage"))


@with_builder_doc(microbatches="Microbatches m in the stream (no flush between optimizer steps).")
def build_pipedream_2bw(devices, microbatches, chunks=1, accumulation=None):
    """1F1B without a flush; an optimizer step every ``accumulation`` microbatches.

    A step's microbatches use the version that was newest on the input
    stage when the step entered; every stage holds two versions (that one
    and the one its last update produced), and every gradient is one step
    stale.

    Parameters
    ----------
    accumulation : int, optional
        Microbatches per optimizer step k >= p (default p).

    Raises
    ------
    ValueError
        If ``accumulation`` is not an int >= devices.
    """
    p = devices
    k = _accumulation(p, accumulation)
    return _stream("pipedream-2bw", p, microbatches, k, "input", stage_versions(p, k, "input"))


@with_builder_doc(microbatches="Microbatches m in the stream (no flush between optimizer steps).")
def build_layerpipe2(devices, microbatches, chunks=1, history="stash"):
    """1F1B without a flush; stage d's gradient delayed by its p - 1 - d downstream stages.

    With ``history="stash"`` stage d stores the p - d weight versions those
    delays need; with ``"ema"`` it keeps its live weights and one moving
    average that reconstructs past versions (2 copies, 1 on the last stage,
    which has no delay). The reconstruction's own compute is not modelled.

    Parameters
    ----------
    history : {"stash", "ema"}, default "stash"
        Store past weights, or reconstruct them from a moving average.

    Raises
    ------
    ValueError
        If ``history`` is neither.
    """
    _check_history(history)
    p = devices
    versions = stage_versions(p, 1, "stage")
    copies = _copies(versions, stage_staleness(p, 1, "stage"), history)
    return _stream("layerpipe2", p, microbatches, 1, "stage", copies)


@with_formula_doc
def formula_stream(p, m, v, c, **options):
    """1F1B's over the stream: makespan (m + p - 1)(F + B + W), device d
    holds min(p - d, m) activations (weight versions are static memory).

    Parameters
    ----------
    **options
        The family's options (``accumulation``, ``history``); they change
        weights, not times or activations.
    """
    return formula_1f1b(p, m, v, c)


def _check_2bw(options):
    if options.get("accumulation") is not None:
        check_int("accumulation", options["accumulation"], minimum=1)


def _check_layerpipe2(options):
    _check_history(options.get("history", "stash"))


register(Family("pipedream", build_pipedream, formula_stream,
                summary="1F1B without flushes; a weight version stashed per microbatch in flight",
                paper=PIPEDREAM))
register(Family("pipedream-2bw", build_pipedream_2bw, formula_stream, options=("accumulation",),
                check=_check_2bw,
                summary="1F1B without flushes; two weight versions, a step every k >= p microbatches",
                paper=PIPEDREAM_2BW))
register(Family("layerpipe2", build_layerpipe2, formula_stream, options=("history",),
                check=_check_layerpipe2,
                summary="delay per stage = stages downstream; stored or moving-average weights",
                paper=LAYERPIPE2))

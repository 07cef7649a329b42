"""Vocabulary layers on a pipeline: the imbalance they cause and Vocabulary Parallelism's fix.

With a large vocabulary the output layer (and the input embedding) outweigh
a transformer block many times over, and a plain pipeline puts the whole
output layer on the last stage and the embedding on the first. Yeung et
al. (arXiv:2411.05288) split both over every device instead; pipecore's
families ``vocab-1`` and ``vocab-2`` (``pipecore.schedules.vocab``)
hold that schedule, and :func:`vocab_costs` gives the per-stage costs of
each way of placing the vocabulary layers of a :class:`~pipecore.Model`:

- ``"baseline"``: blocks split evenly, embedding on the first stage, head
  on the last (the paper's naive baseline);
- ``"redistribute"``: blocks moved off the first and last stages so the
  slowest stage is as fast as it can be (the paper's layer redistribution);
- ``"vocab"``: blocks split evenly, the embedding and head work, parameters
  and activations in equal 1/p shares on every stage.

:func:`vocab_study` simulates the three under 1F1B (and the vocab layout
under vocab-1 and vocab-2) and reports iteration time and peak memory per
device. Transfers are not simulated (every layout pays the same
point-to-point sends; the vocabulary passes' broadcast and all-reduces are
left out, see ``pipecore.schedules.vocab.LEFT_OUT``).
"""

from __future__ import annotations

import numpy as np

from ..analysis.model import Hardware, Model
from ..core.costs import Costs
from ..core.ops import InputError, check_int
from ..core.simulate import simulate
from ..schedules.registry import build
from ..schedules.vocab import EXTRA_WARMUP
from .layout import balance

__all__ = ["vocab_costs", "vocab_study", "LAYOUTS"]

#: Where the vocabulary layers go (see the module docstring).
LAYOUTS = ("baseline", "redistribute", "vocab")


def _even(n, parts):
    """n items in ``parts`` near-equal counts, the larger ones first."""
    return np.array([n // parts + (i < n % parts) for i in range(parts)], dtype=np.int64)


def _column(model, name):
    return np.array([getattr(layer, name) for layer in model.layers], dtype=np.float64)


def vocab_costs(model: Model, devices: int, hardware: Hardware, layout: str = "vocab",
                held: int | None = None, schedule: str = "vocab-1") -> Costs:
    """Per-stage costs (seconds, bytes) of a model with its vocabulary layers placed by ``layout``.

    Parameters
    ----------
    model : Model
        Its layers of kind ``"embedding"`` and ``"head"`` are the vocabulary
        layers; it needs at least ``devices`` blocks.
    devices : int
        Pipeline devices p (one stage each).
    hardware : Hardware
    layout : {"baseline", "redistribute", "vocab"}
        See :data:`LAYOUTS`.
    held : int, optional
        For ``"vocab"``: microbatches whose vocabulary-pass activations
        (logits shard, 1/p of the head's and embedding's activation) a
        device holds at once, counted as static memory on every device.
        Default: the family's extra warm-up (2 for vocab-1, 1 for vocab-2),
        the span between a microbatch's S and T passes in pipecore's
        reading of the paper's figure 10 (not a figure the paper states).
    schedule : {"vocab-1", "vocab-2"}
        The family whose default ``held`` is used.

    Returns
    -------
    Costs
        One entry per stage for every field; ``comm`` 0.

    Raises
    ------
    ValueError
        For an unknown layout or schedule, fewer blocks than devices, or a
        negative ``held``.
    """
    p = check_int("devices", devices, minimum=1)
    if layout not in LAYOUTS:
        raise InputError(f"'layout' must be one of {', '.join(LAYOUTS)} (got {layout!r})")
    if schedule not in EXTRA_WARMUP:
        raise InputError(f"'schedule' must be one of {', '.join(EXTRA_WARMUP)} (got {schedule!r})")
    kinds = np.array([layer.kind for layer in model.layers])
    block = kinds == "block"
    first = np.flatnonzero(kinds == "embedding")
    last = np.flatnonzero(kinds == "head")
    n = int(block.sum())
    if n < p:
        raise InputError(f"vocab_costs: the model has {n} blocks, fewer than devices={p} "
                         f"(each stage needs at least one)")
    if not (np.all(first < np.flatnonzero(block)[0]) and np.all(last > np.flatnonzero(block)[-1])):
        raise InputError("vocab_costs: the model's embedding must come before its blocks and its "
                         "head after them")
    times = model.layer_times(hardware)
    if layout != "vocab":
        if layout == "baseline":
            counts = _even(n, p)
        else:
            per = times[block].sum(axis=1)
            counts = np.array(balance(np.full(p, per.mean()), float(times[first].sum()),
                                      float(times[last].sum()), n), dtype=np.int64)
        counts[0] += len(first)
        counts[-1] += len(last)
        return model.costs([int(c) for c in counts], hardware, times)
    if held is None:
        held = EXTRA_WARMUP[schedule]
    held = check_int("held", held, minimum=0)
    counts = _even(n, p)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))

    def per_stage(values):
        return np.add.reduceat(values[block], starts, axis=0)

    vocab = ~block
    t = per_stage(times) + times[vocab].sum(axis=0) / p
    act = per_stage(_column(model, "activation"))
    act_w = np.minimum(per_stage(_column(model, "activation_w")), act)
    weights = (per_stage(_column(model, "param_bytes")) + _column(model, "param_bytes")[vocab].sum() / p
               + held * _column(model, "activation")[vocab].sum() / p)
    return Costs(f=t[:, 0], b=t[:, 1], w=t[:, 2], comm=0.0, activation=act, activation_w=act_w,
                 weights=weights)


def vocab_study(model: Model, devices: int, microbatches: int, hardware: Hardware) -> list[dict]:
    """Iteration time and per-device peak memory of the vocabulary layouts.

    Rows: 1F1B with the ``"baseline"`` and ``"redistribute"`` layouts, and
    vocab-1 and vocab-2 with the ``"vocab"`` layout (:func:`vocab_costs`).

    Parameters
    ----------
    model : Model
    devices, microbatches : int
        p and m.
    hardware : Hardware

    Returns
    -------
    list of dict
        One per row: ``schedule``, ``layout``, ``time`` (seconds per
        iteration, lower is better), ``speedup`` (baseline time over this
        one, higher is better), ``peak_memory`` (bytes per device: peak
        activation plus weights), ``memory_max`` and ``memory_min`` (bytes,
        the fullest and emptiest device), ``stage_time`` (F+B+W seconds of
        each stage per microbatch).

    Raises
    ------
    ValueError
        As :func:`vocab_costs`, or for microbatches < 1.
    """
    m = check_int("microbatches", microbatches, minimum=1)
    rows = []
    for name, layout in (("1f1b", "baseline"), ("1f1b", "redistribute"), ("vocab-1", "vocab"),
                         ("vocab-2", "vocab")):
        costs = vocab_costs(model, devices, hardware, layout,
                            schedule=name if name != "1f1b" else "vocab-1")
        res = simulate(build(name, devices, m), costs)
        mem = np.asarray(res.peak_activation, dtype=np.float64) + res.static_memory
        rows.append({"schedule": name, "layout": layout, "time": float(res.makespan),
                     "peak_memory": mem, "memory_max": float(mem.max()),
                     "memory_min": float(mem.min()),
                     "stage_time": np.broadcast_to(costs.f + costs.b + costs.w, (devices,)).copy()})
    base = rows[0]["time"]
    for row in rows:
        row["speedup"] = base / row["time"]
    return rows

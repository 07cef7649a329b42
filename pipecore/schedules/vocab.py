"""Vocabulary Parallelism on 1F1B (Yeung et al., arXiv:2411.05288): families vocab-1 and vocab-2.

Vocabulary Parallelism cuts the output layer (and the input embedding) over
the vocabulary into p equal shards, one per pipeline device, instead of
leaving them on the last and first stages. For every microbatch each
device runs two extra passes over its shard: S (logits of its vocabulary
slice, from the last stage's output broadcast to every device) and T (the
gradients, once the softmax statistics are all-reduced); the output
layer's input gradient is reduced back to the last stage. Algorithm 1
(vocab-1) needs one all-reduce barrier per microbatch, Algorithm 2
(vocab-2) two; the authors run the barriers on a separate stream so they
overlap the transformer layers (the repository's README).

How pipecore holds it (an approximation, said here in full):

- The op table is the transformer stages' 1F1B with ``extra`` more
  warm-up forwards on every device: device d runs min(p - d + extra, m)
  forwards before its first backward, extra = 2 for vocab-1 and 1 for
  vocab-2, so device 0 holds p + 2 and p + 1 microbatches' activations,
  as the paper's figure 10 caption and the authors' README table state.
  Those forwards fill the time the last stage's backward of a microbatch
  waits for that microbatch's S and T passes on every device.
- The S and T passes are not ops of the table: an op's inputs come from
  one stage's neighbour along the stage chain, and a pass whose input is
  broadcast from the last stage and whose output is all-reduced over every
  device is not such a dependency. Their time goes into each stage's F and
  B (+W) cost as an equal 1/p share per device
  (:func:`pipecore.plan.vocab.vocab_costs`), which is what each device
  computes per microbatch in the steady state.
- Left out: the broadcast of the output layer's input, the all-reduce
  barriers' latency (overlapped in the authors' implementation), the
  position of the S and T passes inside a device's order (so a schedule
  whose S/T placement would stall is not detected), and the lifetime of
  the vocabulary passes' own activations (``vocab_costs`` counts them as a
  constant number of microbatches' shards held on every device).

Torch: ``to_actions`` exports the transformer stages' order; the S and T
passes are not in it (a torch schedule action computes or sends for one
stage, with no collective over every rank), so stage modules that hold the
vocabulary shards must run those passes themselves.

``pipecore.compose("vocab-1", p, m)`` builds the same table (a linear
placement and 1F1B's order with the longer warm-up).

The closed forms below are exact for this op table with equal stage costs
(what the vocabulary layout gives): 1F1B's makespan (the extra warm-up
fills waiting time, it adds none) and min(p - d + extra, m) activations on
device d. With unequal stages a warm-up forward can delay a backward the
next stage waits for, so the schedule is then never faster than 1F1B.
"""

from __future__ import annotations

import numpy as np

from .onef1b import _one_f_one_b_slots
from .papers import VOCAB_PARALLEL
from .registry import Family, register, with_builder_doc, with_formula_doc

__all__ = ["build_vocab_1", "build_vocab_2", "formula_vocab_1", "formula_vocab_2", "warmup",
           "EXTRA_WARMUP", "LEFT_OUT"]

#: Extra warm-up forwards per device over 1F1B's: the paper's p + 2 (Algorithm 1)
#: and p + 1 (Algorithm 2) microbatches of activation memory.
EXTRA_WARMUP = {"vocab-1": 2, "vocab-2": 1}

#: What the op table and the costs leave out of the paper's schedule (shown by docs and reports).
LEFT_OUT = ("the S and T passes are per-stage cost shares, not ops: their broadcast input, the "
            "all-reduce barriers' latency and their place in each device's order are not simulated")


def warmup(devices, microbatches, extra):
    """Forwards device d runs before its first backward: min(p - d + extra, m).

    Parameters
    ----------
    devices, microbatches : int
        p and m.
    extra : int
        Extra warm-up forwards over 1F1B's (:data:`EXTRA_WARMUP`).

    Returns
    -------
    numpy.ndarray
        One count per device (int64).
    """
    d = np.arange(devices, dtype=np.int64)
    return np.minimum(devices - d + extra, microbatches)


def _build(name, devices, microbatches):
    sched = _one_f_one_b_slots(name, devices, microbatches,
                               warmup(devices, microbatches, EXTRA_WARMUP[name]))
    sched.params["vocab_extra_warmup"] = EXTRA_WARMUP[name]
    return sched


@with_builder_doc
def build_vocab_1(devices, microbatches, chunks=1):
    """Vocabulary Parallelism, Algorithm 1 (one all-reduce barrier): 1F1B
    over the transformer stages with min(p - d + 2, m) warm-up forwards on
    device d. The vocabulary passes are cost shares, not ops (see
    ``pipecore.schedules.vocab``).
    """
    return _build("vocab-1", devices, microbatches)


@with_builder_doc
def build_vocab_2(devices, microbatches, chunks=1):
    """Vocabulary Parallelism, Algorithm 2 (two all-reduce barriers): 1F1B
    over the transformer stages with min(p - d + 1, m) warm-up forwards on
    device d. The vocabulary passes are cost shares, not ops (see
    ``pipecore.schedules.vocab``).
    """
    return _build("vocab-2", devices, microbatches)


def _formula(p, m, c, extra):
    t = c.f + c.b + c.w
    return {"makespan": (m + p - 1) * t, "bubble_time": (p - 1) * t,
            "peak_activation": warmup(p, m, extra) * c.activation, "exact": True}


@with_formula_doc
def formula_vocab_1(p, m, v, c):
    """1F1B's bubble (p-1)(F+B+W), with F, B and W each stage's share of
    the transformer and vocabulary work; device d holds min(p-d+2, m)
    activations (p + 2 on device 0: the paper's figure 10 (a)). Exact for
    the op table; the table itself leaves out what
    ``pipecore.schedules.vocab.LEFT_OUT`` says.
    """
    return _formula(p, m, c, EXTRA_WARMUP["vocab-1"])


@with_formula_doc
def formula_vocab_2(p, m, v, c):
    """1F1B's bubble (p-1)(F+B+W); device d holds min(p-d+1, m)
    activations (p + 1 on device 0: the paper's figure 10 (b)). Exact for
    the op table; the table itself leaves out what ``pipecore.schedules.vocab.LEFT_OUT`` says.
    """
    return _formula(p, m, c, EXTRA_WARMUP["vocab-2"])


register(Family("vocab-1", build_vocab_1, formula_vocab_1,
                summary="vocabulary layers split over all devices (1 barrier); 1F1B with p+2 in flight",
                paper=VOCAB_PARALLEL))
register(Family("vocab-2", build_vocab_2, formula_vocab_2,
                summary="vocabulary layers split over all devices (2 barriers); 1F1B with p+1 in flight",
                paper=VOCAB_PARALLEL))

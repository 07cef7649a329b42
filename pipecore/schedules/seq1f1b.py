"""Seq1F1B (Sun et al., arXiv:2406.03488): 1F1B over sequence chunks.

Each sequence (a microbatch of 1F1B) is cut into k chunks along the tokens,
and the pipeline runs 1F1B over the chunks. Causal attention makes chunk j
read the keys and values of chunks 0..j-1 of its own sequence on the same
stage, so chunk j's forward follows chunk j-1's, and the backwards run in
reverse (chunk j's backward produces the gradients of the earlier chunks'
keys and values).

How the op table holds a chunk: a pipeline unit is one chunk, and the
``microbatch`` column counts units. Chunk j of sequence i is unit
``i * k + j``; ``microbatches`` is the number of units (a multiple of k),
so m units hold m / k sequences. Every column keeps its meaning (one row
per op of one unit on one stage) and the schedule's ``microbatches`` is the
table's, like every family's. The order inside a sequence is not a
dependency the simulator derives from (stage, microbatch, kind): it is held
by program order, each stage running its units on one device, and
:func:`check_chunk_order` checks it.

The order is the authors' Megatron-LM code (github.com/thunlp/Seq1F1B,
``forward_backward_pipelining_without_interleaving`` and its
``sequence_1f1b_queue``): device d runs p - d + k - 2 warm-up forwards and
then alternates a forward and a backward, so p - d + k - 1 forwards come
before its first backward; the backwards take the oldest sequence first and
its chunks from last to first. With k = 1 this is 1F1B.

Costs are per unit (one chunk on one stage). With an even token split and
equal chunk costs, a sequence's F/B/W times are k times a unit's; with
causal attention the later chunks cost more (see
:func:`pipecore.schedules.seq1f1b.chunk_factors`).
"""

from __future__ import annotations

import numpy as np

from ..core.ops import InputError, ScheduleError
from ..core.schedule import Schedule, check_int, op_label
from ..kernels.codes import BW, B, F, W
from ..kernels.seqchunks import seq1f1b_columns
from .construct import at_scale, kernel_to_schedule, slots_to_schedule
from .papers import SEQ1F1B
from .registry import Family, register, with_builder_doc, with_formula_doc

__all__ = ["build_seq1f1b", "formula_seq1f1b", "check_chunk_order", "warmup", "chunk_bounds",
           "chunk_factors", "with_chunk_costs", "SPLITS"]

#: How a sequence is cut: "tokens" (k equal token counts: equal memory, the
#: later chunks slower) or "compute" (the paper's computation-wise partition:
#: equal work, the later chunks shorter and lighter in memory).
SPLITS = ("tokens", "compute")

#: Chunks per sequence when ``seq_chunks`` is not given (the paper's figure 1 splits in two).
DEFAULT_SEQ_CHUNKS = 2


def _check_chunks(seq_chunks, microbatches=None):
    k = check_int("seq_chunks", seq_chunks, minimum=1)
    if microbatches is not None and microbatches % k:
        raise InputError(f"'seq1f1b': 'microbatches' counts sequence chunks and must be a "
                         f"multiple of seq_chunks={k} (got {microbatches}): m units are m / k "
                         f"sequences of k chunks")
    return k


def warmup(devices, microbatches, seq_chunks):
    """Forwards device d runs before its first backward: min(p - d + k - 1, m).

    Parameters
    ----------
    devices, microbatches, seq_chunks : int
        p, m (units) and k.

    Returns
    -------
    numpy.ndarray
        One count per device (int64).
    """
    d = np.arange(devices, dtype=np.int64)
    return np.minimum(devices - d + seq_chunks - 1, microbatches)


@with_builder_doc(microbatches="Pipeline units m (sequence chunks), a multiple of seq_chunks.")
def build_seq1f1b(devices, microbatches, chunks=1, seq_chunks=DEFAULT_SEQ_CHUNKS):
    """1F1B over sequence chunks: p - d + k - 1 forwards on device d before its
    first backward; a sequence's backwards from its last chunk to its first.

    Parameters
    ----------
    seq_chunks : int, default 2
        k, the chunks each sequence is cut into; unit i k + j is chunk j of
        sequence i.

    Raises
    ------
    ValueError
        If ``seq_chunks`` is not an int >= 1 or ``microbatches`` is not a
        multiple of it.
    """
    p, m = devices, microbatches
    k = _check_chunks(seq_chunks, m)
    warm = warmup(p, m, k)
    if at_scale(p, 2 * m):
        # At scale one kernel writes every op straight into the columns.
        sched = kernel_to_schedule(
            "seq1f1b", p, 2 * m, lambda out, d0, d1: seq1f1b_columns(out, p, m, k, warm, d0, d1))
    else:
        w = warm.astype(np.int32)[:, None]
        j = np.arange(m, dtype=np.int32)[None, :]
        stage = np.arange(p, dtype=np.int32)[:, None]
        f_slot = np.where(j < w, j, 2 * j - w + 1)
        b_slot = np.where(j < m - w, w + 2 * j, m + j)
        unit = (j // k) * k + k - 1 - j % k  # the j-th backward's unit
        sched = slots_to_schedule("seq1f1b", p, 2 * m,
                                  [(F, stage, j, f_slot), (BW, stage, unit, b_slot)])
        check_chunk_order(sched, k)
    sched.params["seq_chunks"] = k
    return sched


def check_chunk_order(schedule: Schedule, seq_chunks: int) -> Schedule:
    """Check the order causal attention needs inside each sequence.

    Unit i k + j is chunk j of sequence i. On every stage, chunk j's
    forward must run after chunk j - 1's on the same device (it reads that
    chunk's keys and values), and chunk j - 1's backward (B or BW) after
    chunk j's (which sends it their gradients).

    Parameters
    ----------
    schedule : Schedule
        Units in its ``microbatch`` column.
    seq_chunks : int
        k.

    Returns
    -------
    Schedule
        ``schedule``, for chaining.

    Raises
    ------
    ScheduleError
        Naming the first op (device, slot, stage, unit) out of order, or on
        another device than its neighbour chunk (rule ``chunk-order``).
    ValueError
        If ``seq_chunks`` is not an int >= 1 or the units are not a multiple
        of it.
    """
    k = _check_chunks(seq_chunks, schedule.microbatches)
    if k == 1:
        return schedule
    kinds = schedule.kind_codes.astype(np.int64)
    stage = schedule._column("stage").astype(np.int64)
    mb = schedule._column("microbatch").astype(np.int64)
    dev = schedule._column("device").astype(np.int64)
    slot = schedule._column("slot").astype(np.int64)
    S, m = schedule.stages, schedule.microbatches
    backward = np.isin(kinds, (B, BW))
    for name, rows, later in (("forward", kinds == F, 1), ("backward", backward, -1)):
        idx = np.flatnonzero(rows)
        if not idx.size:
            continue
        where = np.full((S, m), -1, dtype=np.int64)  # row of (stage, unit)
        where[stage[idx], mb[idx]] = idx
        # Pairs (chunk j - 1, chunk j) of one sequence on one stage.
        prev = where[:, :].reshape(S, m // k, k)[:, :, :-1].reshape(-1)
        this = where[:, :].reshape(S, m // k, k)[:, :, 1:].reshape(-1)
        first, second = (prev, this) if later == 1 else (this, prev)
        ok = (first >= 0) & (second >= 0)
        bad = ok & ((dev[first] != dev[second]) | (second < first))
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            r, q = int(second[i]), int(first[i])
            label = op_label(kinds[r], stage[r], mb[r])
            other = op_label(kinds[q], stage[q], mb[q])
            how = ("runs on device " + str(int(dev[r])) + " but " + other + " on device "
                   + str(int(dev[q]))) if dev[r] != dev[q] else (
                "comes before " + other + f" (slot {int(slot[q])})")
            raise ScheduleError(
                f"chunk-order: device {int(dev[r])} slot {int(slot[r])}: {label} {how}; with "
                f"seq_chunks={k}, chunk j's {name} must follow chunk j"
                f"{'-1' if later == 1 else '+1'}'s on the same device (causal attention)",
                rule="chunk-order", device=int(dev[r]), slot=int(slot[r]),
                stage=int(stage[r]), microbatch=int(mb[r]))
    return schedule


@with_formula_doc
def formula_seq1f1b(p, m, v, c, seq_chunks=DEFAULT_SEQ_CHUNKS):
    """1F1B's over m units: bubble (p-1)(F+B+W) of a unit; device d holds
    min(p - d + k - 1, m) units' activations.

    With a unit k times shorter than a sequence, the bubble is 1F1B's over
    the sequences divided by k, and device 0 holds (p + k - 1) / k
    sequences' activations against 1F1B's p (a ratio (p + k - 1) / (k p)).

    Parameters
    ----------
    seq_chunks : int, default 2
        k.
    """
    k = _check_chunks(seq_chunks)
    t = c.f + c.b + c.w
    return {"makespan": (m + p - 1) * t, "bubble_time": (p - 1) * t,
            "peak_activation": warmup(p, m, k) * c.activation, "exact": True}


def _share(name, value):
    try:
        a = float(value)
    except (TypeError, ValueError):
        raise InputError(f"'{name}' must be a number in [0, 1) (got {value!r})") from None
    if not 0.0 <= a < 1.0:
        raise InputError(f"'{name}' must be in [0, 1): the share of the work in causal attention "
                         f"(got {value!r})")
    return a


def chunk_bounds(seq_chunks, attention=0.0, split="tokens"):
    """Where the k chunks of a sequence start and end, as fractions of its tokens.

    A sequence's work is ``(1 - a) x + a x^2`` up to token fraction x: the
    linear layers' part grows with the tokens, causal attention's with the
    square (token t reads t keys). ``"tokens"`` cuts at j / k;
    ``"compute"`` where the work reaches j / k (the paper's
    computation-wise partition).

    Parameters
    ----------
    seq_chunks : int
        k.
    attention : float, default 0
        a, the share of the sequence's work in causal attention, in [0, 1).
    split : {"tokens", "compute"}

    Returns
    -------
    numpy.ndarray
        k + 1 increasing fractions from 0 to 1.

    Raises
    ------
    ValueError
        For k < 1, a share outside [0, 1) or an unknown split.
    """
    k = _check_chunks(seq_chunks)
    a = _share("attention", attention)
    if split not in SPLITS:
        raise InputError(f"'split' must be one of {', '.join(SPLITS)} (got {split!r})")
    c = np.arange(k + 1) / k
    if split == "tokens" or a == 0.0:
        return c
    # The root in [0, 1] of a x^2 + (1 - a) x = c.
    return (-(1 - a) + np.sqrt((1 - a) ** 2 + 4 * a * c)) / (2 * a)


def chunk_factors(bounds, attention):
    """Each chunk's work for an op kind, relative to the mean chunk (k of them average 1).

    Parameters
    ----------
    bounds : array_like of float
        :func:`chunk_bounds`.
    attention : float
        The kind's share of its work in causal attention, in [0, 1) (0 for
        W, which has none).

    Returns
    -------
    numpy.ndarray
        k factors, ``k ((1 - a) (x[j+1] - x[j]) + a (x[j+1]^2 - x[j]^2))``.

    Raises
    ------
    ValueError
        For a share outside [0, 1).
    """
    x = np.asarray(bounds, dtype=np.float64)
    a = _share("attention", attention)
    k = len(x) - 1
    return k * ((1 - a) * np.diff(x) + a * np.diff(x * x))


def with_chunk_costs(schedule, attention_f, attention_b, attention_w=0.0, split="tokens"):
    """A Seq1F1B schedule whose ops carry their chunk's work (:meth:`pipecore.Schedule.with_factors`).

    With costs per unit (a sequence's divided by k), chunk j's F takes
    ``chunk_factors(bounds, attention_f)[j]`` times the unit's F, its
    backward likewise (a BW weighs B and W by the unit's ``b`` and ``w``
    is not known here, so it takes B's share: pass the share of B + W), and
    its activation the chunk's share of the tokens (activations grow with
    the tokens when attention keeps no s^2 scores, as with FlashAttention).

    Parameters
    ----------
    schedule : Schedule
        Built by ``pipecore.build("seq1f1b", ...)``.
    attention_f, attention_b : float
        Shares of causal attention in a sequence's F and backward work
        (B, or B + W for a fused BW), in [0, 1).
    attention_w : float, default 0
        The share in W (0: the weight gradients are linear in the tokens).
    split : {"tokens", "compute"}
        How the sequence is cut; ``"compute"`` balances the total work with
        the share ``(attention_f + attention_b) / 2`` (equal F and B weight).

    Returns
    -------
    Schedule

    Raises
    ------
    ValueError
        If the schedule was not built by the seq1f1b family, or for a bad
        share or split.
    """
    k = schedule.params.get("seq_chunks")
    if schedule.params.get("family") != "seq1f1b" or k is None:
        raise InputError(f"with_chunk_costs needs a schedule built by pipecore.build('seq1f1b', "
                         f"...) (got {schedule.name!r})")
    a_f = _share("attention_f", attention_f)
    a_b = _share("attention_b", attention_b)
    a_w = _share("attention_w", attention_w)
    bounds = chunk_bounds(k, (a_f + a_b) / 2, split)
    j = schedule._column("microbatch") % k
    kinds = schedule.kind_codes
    per_kind = {F: chunk_factors(bounds, a_f), B: chunk_factors(bounds, a_b),
                BW: chunk_factors(bounds, a_b), W: chunk_factors(bounds, a_w)}
    time = np.ones(schedule.num_ops)
    for code, factors in per_kind.items():
        rows = kinds == code
        time[rows] = factors[j[rows]]
    tokens = k * np.diff(bounds)
    return schedule.with_factors(time=time, activation=tokens[j])


register(Family("seq1f1b", build_seq1f1b, formula_seq1f1b, options=("seq_chunks",),
                check=lambda o: _check_chunks(o.get("seq_chunks", DEFAULT_SEQ_CHUNKS)),
                summary="1F1B over sequence chunks: bubble and memory shrink with k chunks",
                paper=SEQ1F1B))

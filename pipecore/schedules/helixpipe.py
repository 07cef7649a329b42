"""HelixPipe (Zhang et al., arXiv:2507.00394): attention parallel partition, FILO order.

HelixPipe cuts every transformer layer at its attention core. The parts with
parameters (the post-attention of layer j - 1, its output projection and
MLP, with the pre-attention of layer j, its norm and QKV projection) stay on
one device each, layer j's on device j mod p, a helix through the devices.
The attention core of layer j has no parameters, and HelixPipe runs it for
different microbatches on different devices in parallel, which takes the
quadratic attention off the pipeline's warm-up path.

How the op table holds it: a chain of 2L + 1 stages for L = v p layers
(v = ``chunks``, layers per device). Stage 2j is the parameter part P_j
(P_0 also holds the embedding, P_L the last post-attention and the head
with the loss), on device j mod p. Stage 2j + 1 is the attention core A_j
of layer j, a *replicated* stage (``Schedule(replicated=True)``, as
Chimera's, without all-reduces: it has no weights): microbatch i's A_j runs
on device ``(j + d + 1) mod p`` with d = (i // folds) mod p its offset, so
the p offsets of one layer spread over all p devices. The placement is read
from the authors' code (github.com/code-tunnel/Megatron-LM, branch dev,
``megatron/core/pipeline_parallel/attn_pipe_schedule.py``: a parameter part
on rank r sends the QKV of the microbatch at data offset d to rank
``(r + d + 1) % p``; d = p - 1 computes it locally).

The order is first-in-last-out: every device runs all its forwards, then
its backwards in the reverse order (the code's backward loops are its
forward loops reversed, except the very last one: rank 0's backward of the
prelude's P_0 runs the folds in forward order, and so does this table).
``folds`` microbatches share an offset and run
back to back (the paper's two-fold schedule, which overlaps one fold's
communication with the other's compute; communication is not what this
table models). The forward order is the code's loop order
(``attention_pipeline``): per data repeat of p * folds microbatches, rank r
runs a warm-up (the attention of offsets r - 1 .. 0 of the first p layers,
offset 0 followed by its parameter part P_r, then P_r of offsets 1 .. p - 1,
offset p - 1's attention locally), v - 1 steady loops (attention of offsets
p - 2 .. 0, then the loop's parameter part of offsets 1 .. p - 1), and a
cool-down (the last layers' attention of offsets p - 2 .. r); folds are the
innermost loop everywhere. Rank 0 starts with P_0 of offset 0 and closes
each offset-1 .. p - 1 microbatch with P_L in the next repeat's warm-up
(``pipecore.kernels.helix``
writes the order; it is a closed rule, no simulation). With one device the
loops have no remote offset: each microbatch runs through every stage.

Not modelled here: recomputation without attention and chunked MLP are cost
choices (:func:`helix_costs` re-runs the parameter parts in the backward and
keeps the attention's inputs and outputs), and the communication volumes.
"""

from __future__ import annotations

import numpy as np

from ..core import tier
from ..core.costs import Costs
from ..core.ops import InputError
from ..core.schedule import Schedule, check_int
from ..core.sizes import MAX_OPS
from ..kernels.columns import fill_rows, fill_rows_serial
from ..kernels.helix import helix_columns
from .compose import PARALLEL_MIN_OPS
from .construct import column_buffers
from .papers import HELIXPIPE
from .registry import Family, register, with_builder_doc, with_formula_doc

__all__ = ["build_helixpipe", "formula_helixpipe", "attention_device", "helix_costs",
           "DEFAULT_FOLDS", "MAX_HELIX_OPS"]

#: Microbatches per offset when ``folds`` is not given (the paper's two-fold schedule).
DEFAULT_FOLDS = 2
#: The most ops a HelixPipe table may hold (the op table's int32 row index).
MAX_HELIX_OPS = MAX_OPS


def _check(p, m, v, folds):
    folds = check_int("folds", folds, minimum=1)
    if m % (p * folds):
        raise InputError(f"'helixpipe': 'microbatches' must be a multiple of devices * folds = "
                         f"{p} * {folds} = {p * folds} (got {m}): each round gives the p "
                         f"offsets {folds} microbatches")
    ops = 2 * (2 * v * p + 1) * m
    if ops > MAX_HELIX_OPS:
        raise InputError(f"'helixpipe' with p={p}, m={m}, chunks={v} has {ops} ops, more than "
                         f"{MAX_HELIX_OPS}, the most an op table's int32 row index holds")
    return folds


def attention_device(layer, microbatch, devices, folds=DEFAULT_FOLDS):
    """The device that runs layer ``layer``'s attention core for a microbatch.

    Parameters
    ----------
    layer, microbatch : int or array_like of int
        j and i.
    devices : int
        p.
    folds : int, default 2
        Microbatches per offset; i's offset is (i // folds) mod p.

    Returns
    -------
    int or numpy.ndarray
        ``(j + (i // folds) mod p + 1) mod p``.
    """
    offset = (np.asarray(microbatch) // folds) % devices
    out = (np.asarray(layer) + offset + 1) % devices
    return int(out) if np.ndim(out) == 0 else out


def _one_device(m, v):
    """p = 1: the authors' loops need two ranks (offset p - 1 = 0 would be
    both local and remote); each microbatch runs through every stage."""
    S = 2 * v + 1
    forward = [("F", s, i) for i in range(m) for s in range(S)]
    return [forward + [("BW", s, i) for _, s, i in reversed(forward)]]


@with_builder_doc(chunks="Layers per device v (the schedule has 2 v p + 1 stages).",
                  microbatches="Microbatches m, a multiple of devices * folds.")
def build_helixpipe(devices, microbatches, chunks=1, folds=DEFAULT_FOLDS):
    """HelixPipe: parameter parts in a helix over the devices, each layer's
    attention for different microbatches on different devices, in the
    authors' loop order; all forwards, then all backwards in reverse (first
    in, last out).

    Parameters
    ----------
    folds : int, default 2
        Microbatches per offset (the paper's two-fold schedule).

    Raises
    ------
    ValueError
        If ``folds`` is not an int >= 1, ``microbatches`` is not a multiple
        of ``devices * folds``, or the table would exceed
        :data:`MAX_HELIX_OPS` ops.
    """
    p, m, v = devices, microbatches, chunks
    folds = _check(p, m, v, folds)
    if p == 1:
        sched = Schedule.from_programs(_one_device(m, v), name="helixpipe", devices=1,
                                       replicated=True)
    else:
        # Rank r runs v (P) + v (A) forwards per microbatch, rank 0 also P_L.
        fwd = np.full(p, 2 * v * m, dtype=np.int64)
        fwd[0] += m
        out_ptr = np.zeros(p + 1, dtype=np.int64)
        np.cumsum(2 * fwd, out=out_ptr[1:])
        cols = column_buffers(int(out_ptr[-1]))
        n = int(out_ptr[-1])
        # Small tables run the kernels interpreted rather than compile them (core/tier.py):
        # the main job builds every family once.
        if tier.kernel(helix_columns, n)(cols.kind, cols.stage, cols.microbatch, out_ptr, p, v,
                                         folds, m // (p * folds)):
            raise RuntimeError("internal error: the helixpipe builder wrote a device's "
                               "forwards short or long")
        # The code's last backward loop (rank 0, P_0 of the prelude) runs the
        # folds in forward order, the one exception to the mirror.
        cols.microbatch[out_ptr[1] - folds:out_ptr[1]] = np.arange(folds, dtype=np.int32)
        # One thread below compose's threshold, as compose does (one signature per kernel).
        fill = fill_rows if n >= PARALLEL_MIN_OPS else fill_rows_serial
        tier.kernel(fill, n)(out_ptr, cols.device, cols.slot)
        sched = Schedule.from_arrays(*cols, name="helixpipe", devices=p, replicated=True,
                                     copy=False)
    sched.params["folds"] = folds
    sched.params["layers"] = v * p
    return sched


@with_formula_doc
def formula_helixpipe(p, m, v, c, folds=DEFAULT_FOLDS):
    """Device 0's work: (2 v + 1) m ops of each direction; FILO holds every
    microbatch's activations at the turn.

    With scalar costs each of the S = 2 v p + 1 stages takes p / S of a
    device share. Device 0 hosts v + 1 parameter stages (P_0 and P_L) and v
    attention stages of every microbatch, the others v and v, so the
    makespan is at least ``(2 v + 1) m (F + B + W) p / S``. The authors'
    order attains it in every shape tests/test_helixpipe.py simulates (p 2
    to 8, v 1 to 3, 1 to 3 folds, 1 or 2 repeats); ``exact`` stays False as
    that is checked, not proven. Peak activation: device 0 holds
    (2 v + 1) m stage activations, the others 2 v m (all forwards run before
    the first backward). ``busy_max`` is device 0's busy time (the bound),
    so its bubble (the zero-bubble papers' rate) is 0.

    Parameters
    ----------
    folds : int, default 2
        Microbatches per offset (does not change the bound).
    """
    S = 2 * v * p + 1
    t = c.f + c.b + c.w
    span = (2 * v + 1) * m * t * p / S
    held = np.full(p, 2 * v * m, dtype=np.float64)
    held[0] += m
    # Device 0 is busy for the whole bound: no bubble on the fullest device.
    return {"makespan": span, "bubble_time": 0.0, "busy_max": span,
            "peak_activation": held * c.activation * p / S, "exact": False}


def helix_costs(layer_f, layer_b, layer_act, attention_f, attention_b, layers, devices, *,
                pre_share=0.25, head_f=0.0, head_b=0.0, recompute=True, checkpoint_share=0.1,
                attention_act_share=0.25, weights=0.0) -> Costs:
    """Per-stage costs of a HelixPipe schedule from one transformer block's.

    A block's F takes ``layer_f`` (its backward ``layer_b``, B and W
    together), ``attention_f`` (``attention_b``) of it in the attention
    core; the rest, the linear layers, splits ``pre_share`` before the
    attention (norm, QKV) and the rest after (output projection, MLP).
    P_0 takes the pre-attention part, P_L the post-attention part plus the
    head, P_j both. With ``recompute`` (the paper's recomputation without
    attention) a parameter stage keeps only its input, ``checkpoint_share``
    of the block's activation, and its backward re-runs its forward; the
    attention stage keeps ``attention_act_share`` (its Q, K, V and output).

    Parameters
    ----------
    layer_f, layer_b : float
        Seconds of one block's F and of its backward (B + W).
    layer_act : float
        Bytes one block's F keeps without recomputation.
    attention_f, attention_b : float
        Shares of the attention core in ``layer_f`` and ``layer_b``, in [0, 1).
    layers, devices : int
        L = v p and p.
    pre_share : float, default 0.25
        Pre-attention share of the linear work (Llama-2 7B: QKV is 3 h^2 of
        about 12 h^2 of weights per block).
    head_f, head_b : float, default 0
        Seconds of the LM head with the loss (and embedding), on P_L.
    recompute : bool, default True
    checkpoint_share, attention_act_share : float
        Shares of ``layer_act`` kept by a parameter stage (with
        ``recompute``) and by an attention stage.
    weights : float, default 0
        Bytes of one block's training state (split like the linear work).

    Returns
    -------
    Costs
        One entry per stage (2 L + 1), ``comm`` 0, ``w`` 0 (fused BW).

    Raises
    ------
    ValueError
        For shares outside [0, 1) or a layer count not a multiple of devices.
    """
    L = check_int("layers", layers, minimum=1)
    p = check_int("devices", devices, minimum=1)
    if L % p:
        raise InputError(f"'layers' must be a multiple of devices={p} (got {L})")
    for name, a in (("attention_f", attention_f), ("attention_b", attention_b),
                    ("pre_share", pre_share), ("checkpoint_share", checkpoint_share),
                    ("attention_act_share", attention_act_share)):
        if not 0.0 <= float(a) < 1.0:
            raise InputError(f"'{name}' must be in [0, 1) (got {a!r})")
    S = 2 * L + 1
    lin_f, lin_b = layer_f * (1 - attention_f), layer_b * (1 - attention_b)
    part = np.full(S, 1.0)  # share of a block's linear work on each parameter stage
    part[0], part[S - 1] = pre_share, 1.0 - pre_share
    param = np.arange(S) % 2 == 0
    f = np.where(param, part * lin_f, layer_f * attention_f)
    b = np.where(param, part * lin_b, layer_b * attention_b)
    f[S - 1] += head_f
    b[S - 1] += head_b
    if recompute:
        b = b + np.where(param, f, 0.0)
        act_p = checkpoint_share * layer_act
    else:
        act_p = (1.0 - attention_act_share) * layer_act
    act = np.where(param, part * act_p, attention_act_share * layer_act)
    return Costs(f=f, b=b, w=0.0, comm=0.0, activation=act,
                 weights=np.where(param, part * weights, 0.0))


register(Family("helixpipe", build_helixpipe, formula_helixpipe, chunks=True, default_chunks=1,
                options=("folds",),
                summary="attention of different microbatches on different devices, FILO order",
                paper=HELIXPIPE))

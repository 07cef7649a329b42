"""Long sequences: Seq1F1B against 1F1B, ZB-H1 and ZB-V over sequence lengths.

Each schedule trains the same sequences of one :class:`~pipecore.Model`
(one sequence per microbatch) on p devices with the roofline costs of
:meth:`pipecore.Model.costs`; Seq1F1B cuts each sequence into k chunks and runs k
times as many units at a k-th of the costs, each op weighted by its
chunk's work (:func:`pipecore.schedules.seq1f1b.with_chunk_costs`), the
attention shares read off the model itself (:func:`attention_shares`).
Communication is left out (every schedule sends the same bytes per
sequence) and so are tensor parallelism and recomputation beyond the
model's own selective recompute: the figures compare schedules, not runs.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from ..core.ops import InputError
from ..core.schedule import check_int
from ..core.simulate import simulate
from ..schedules.registry import build
from ..schedules.seq1f1b import with_chunk_costs
from .model import Model
from .roofline import Hardware

__all__ = ["attention_shares", "seq1f1b_study", "SEQ_LENGTHS", "helixpipe_study", "H20",
           "HELIX_PAPER_SPEEDUP"]

#: The lengths of the study: 8k to 128k tokens.
SEQ_LENGTHS = (8192, 16384, 32768, 65536, 131072)


def attention_shares(full: Model, half: Model) -> dict:
    """The share of causal attention in a sequence's F, B, W and B + W FLOPs.

    A block's FLOPs are ``L s + Q s^2`` for s tokens (linear layers, then the
    attention core); the same model at s and s / 2 gives both terms:
    ``Q s^2 = 2 (F(s) - 2 F(s / 2))``.

    Parameters
    ----------
    full, half : Model
        The same transformer at s and s / 2 tokens (``Model.transformer`` or
        ``Model.preset`` with ``seq=``).

    Returns
    -------
    dict
        ``f``, ``b``, ``w``, ``bw``: shares in [0, 1) over the model's blocks.

    Raises
    ------
    ValueError
        If the two models' sequence lengths are not s and s / 2 or their
        layers differ.
    """
    if full.seq is None or half.seq is None or 2 * half.seq != full.seq \
            or len(full.layers) != len(half.layers):
        raise InputError(f"attention_shares needs one model at s and at s / 2 tokens with the "
                         f"same layers (got seq={full.seq} and {half.seq})")
    out = {}
    blocks = [i for i, layer in enumerate(full.layers) if layer.kind == "block"]
    for key, names in (("f", ("flops_f",)), ("b", ("flops_b",)), ("w", ("flops_w",)),
                       ("bw", ("flops_b", "flops_w"))):
        at_s = sum(getattr(full.layers[i], n) for i in blocks for n in names)
        at_half = sum(getattr(half.layers[i], n) for i in blocks for n in names)
        quad = 2.0 * (at_s - 2.0 * at_half)
        out[key] = float(min(max(quad / at_s, 0.0), 1.0 - 1e-12)) if at_s else 0.0
    return out


def _split(layers, stages):
    """Layers per stage, as even as the count allows, the extra ones at both ends."""
    base, extra = divmod(layers, stages)
    out = [base] * stages
    for i in range(extra):
        out[(i // 2) if i % 2 == 0 else stages - 1 - i // 2] += 1
    return out


def seq1f1b_study(seq_lengths=SEQ_LENGTHS, model: str = "llama2-7b",
                  hardware: str = "a100-nvlink", devices: int = 8, sequences: int = 16,
                  seq_chunks=(2, 4), splits=("tokens", "compute")) -> list[dict]:
    """Time and peak memory of Seq1F1B, 1F1B, ZB-H1 and ZB-V per sequence length.

    Parameters
    ----------
    seq_lengths : sequence of int, default 8k to 128k
        Tokens per sequence (even).
    model : str, default "llama2-7b"
        A ``Model.preset`` name.
    hardware : str, default "a100-nvlink"
        A ``Hardware.preset`` name.
    devices : int, default 8
        Pipeline devices p (ZB-V places 2p stages).
    sequences : int, default 16
        Sequences per step, one per microbatch (Seq1F1B's units are k times more).
    seq_chunks : sequence of int, default (2, 4)
        Seq1F1B's k values.
    splits : sequence of str, default ("tokens", "compute")
        Seq1F1B's partitions (:data:`pipecore.schedules.seq1f1b.SPLITS`).

    Returns
    -------
    list of dict
        One row per length and schedule: ``seq`` (tokens), ``schedule``
        (``"seq1f1b k=4 compute"`` for instance), ``step_s`` (the step's
        makespan in seconds, lower is better), ``speedup`` (1F1B's step
        time over this one's: above 1 is faster), ``bubble_ratio``
        (idle share of device time), ``peak_activation_gb`` (the fullest
        device's activation, GB = 1e9 bytes), ``peak_memory_gb`` (its
        activation plus its weights and optimizer state), ``memory_ratio``
        (peak activation over 1F1B's: below 1 is less).

    Raises
    ------
    ValueError
        For an unknown model or hardware, an odd length, or bad shapes.
    """
    p = check_int("devices", devices, minimum=1)
    m = check_int("sequences", sequences, minimum=1)
    hw = Hardware.preset(hardware)
    rows = []
    for s in seq_lengths:
        s = check_int("seq_lengths", s, minimum=2)
        if s % 2:
            raise InputError(f"'seq_lengths' must be even, to read attention off s and s / 2 "
                             f"(got {s})")
        full = Model.preset(model, seq=s)
        shares = attention_shares(full, Model.preset(model, seq=s // 2))
        one_stage = full.costs(_split(len(full.layers), p), hw)
        two_stages = full.costs(_split(len(full.layers), 2 * p), hw)
        runs = [("1f1b", build("1f1b", p, m), one_stage),
                ("zb-h1", build("zb-h1", p, m), one_stage),
                ("zb-v", build("zb-v", p, m), two_stages)]
        for k in seq_chunks:
            unit = replace(one_stage, f=one_stage.f / k, b=one_stage.b / k, w=one_stage.w / k,
                           activation=one_stage.activation / k,
                           activation_w=one_stage.activation_w / k)
            sched = build("seq1f1b", p, m * k, seq_chunks=k)
            for split in splits:
                runs.append((f"seq1f1b k={k} {split}",
                             with_chunk_costs(sched, shares["f"], shares["bw"], split=split), unit))
        rows += _rows(s, runs, shares["f"])
    return rows


# HelixPipe (arXiv:2507.00394) beside the schedules above.

#: H20 roofline (NVIDIA H20 data sheet: 148 TFLOP/s BF16 dense, 4.0 TB/s HBM3,
#: 96 GB, NVLink 900 GB/s total): the paper's cluster is 64 H20 GPUs.
H20 = Hardware(148e12, 4.0e12, 450e9, 2e-6, "h20", hbm_bytes=96e9)

#: The paper's headline: 26 % faster than its baselines, a 7B model at 128k tokens on
#: 64 H20 GPUs (abstract of arXiv:2507.00394).
HELIX_PAPER_SPEEDUP = 1.26


def _hardware(hardware):
    return H20 if hardware == "h20" else Hardware.preset(hardware)


def helixpipe_study(seq_lengths=SEQ_LENGTHS, model: str = "llama2-7b", hardware: str = "h20",
                    devices: int = 8, sequences: int = 16, seq_chunks: int = 4,
                    recompute: bool = True) -> list[dict]:
    """Time and peak memory of HelixPipe, 1F1B, ZB-V and Seq1F1B per sequence length.

    HelixPipe's stages are the parameter parts and the attention cores of
    the model's blocks (:func:`pipecore.schedules.helixpipe.helix_costs`:
    attention's share of a block's F and backward read off the model with
    :func:`attention_shares`; with ``recompute`` the parameter parts keep
    only their inputs and re-run in the backward, the paper's recomputation
    without attention). The other schedules use the model's per-stage costs
    as :func:`seq1f1b_study` does (Seq1F1B with the compute split).

    Parameters
    ----------
    seq_lengths : sequence of int, default 8k to 128k
        Tokens per sequence (even).
    model : str, default "llama2-7b"
        A ``Model.preset`` name; its blocks must divide among ``devices``.
    hardware : str, default "h20"
        ``"h20"`` or a ``Hardware.preset`` name.
    devices : int, default 8
        Pipeline devices p.
    sequences : int, default 16
        Sequences per step, one per microbatch (a multiple of 2 p for
        HelixPipe's two folds).
    seq_chunks : int, default 4
        Seq1F1B's k.
    recompute : bool, default True
        HelixPipe's recomputation without attention.

    Returns
    -------
    list of dict
        As :func:`seq1f1b_study`: ``seq``, ``schedule``, ``step_s`` (s,
        lower is better), ``speedup`` over 1F1B (above 1 is faster),
        ``bubble_ratio``, ``peak_activation_gb`` (fullest device, GB),
        ``peak_memory_gb``, ``memory_ratio`` (over 1F1B's, below 1 is
        less), ``attention_share_f``.

    Raises
    ------
    ValueError
        For an unknown model or hardware, an odd length, blocks that do not
        divide among the devices or sequences not a multiple of 2 p.
    """
    from ..schedules.helixpipe import helix_costs

    p = check_int("devices", devices, minimum=1)
    m = check_int("sequences", sequences, minimum=1)
    hw = _hardware(hardware)
    rows = []
    for s in seq_lengths:
        s = check_int("seq_lengths", s, minimum=2)
        if s % 2:
            raise InputError(f"'seq_lengths' must be even, to read attention off s and s / 2 "
                             f"(got {s})")
        full = Model.preset(model, seq=s)
        shares = attention_shares(full, Model.preset(model, seq=s // 2))
        blocks = [i for i, layer in enumerate(full.layers) if layer.kind == "block"]
        if len(blocks) % p:
            raise InputError(f"'devices' must divide the model's {len(blocks)} blocks for "
                             f"HelixPipe's helix (got {p})")
        per_layer = full.costs([1] * len(full.layers), hw)
        others = [i for i in range(len(full.layers)) if i not in blocks]
        k0 = blocks[0]
        helix = helix_costs(
            float(per_layer.f[k0]), float(per_layer.b[k0] + per_layer.w[k0]),
            float(per_layer.activation[k0]), shares["f"], shares["bw"], len(blocks), p,
            head_f=float(sum(per_layer.f[i] for i in others)),
            head_b=float(sum(per_layer.b[i] + per_layer.w[i] for i in others)),
            recompute=recompute, weights=float(per_layer.weights[k0]))
        one_stage = full.costs(_split(len(full.layers), p), hw)
        two_stages = full.costs(_split(len(full.layers), 2 * p), hw)
        unit = replace(one_stage, f=one_stage.f / seq_chunks, b=one_stage.b / seq_chunks,
                       w=one_stage.w / seq_chunks, activation=one_stage.activation / seq_chunks,
                       activation_w=one_stage.activation_w / seq_chunks)
        seq = with_chunk_costs(build("seq1f1b", p, m * seq_chunks, seq_chunks=seq_chunks),
                               shares["f"], shares["bw"], split="compute")
        runs = [("1f1b", build("1f1b", p, m), one_stage),
                ("zb-v", build("zb-v", p, m), two_stages),
                (f"seq1f1b k={seq_chunks} compute", seq, unit),
                ("helixpipe", build("helixpipe", p, m, chunks=len(blocks) // p), helix)]
        rows += _rows(s, runs, shares["f"])
    return rows


def _rows(seq, runs, share_f):
    """One study row per (name, schedule, costs) run at one sequence length; the first run
    is the base of ``speedup`` (its step time over the row's) and ``memory_ratio``."""
    out = []
    for name, sched, costs in runs:
        res = simulate(sched, costs)
        act = np.asarray(res.peak_activation)
        total = act + res.static_memory
        row = {"seq": seq, "schedule": name, "step_s": res.makespan,
               "bubble_ratio": res.bubble_ratio, "peak_activation_gb": float(act.max()) / 1e9,
               "peak_memory_gb": float(total.max()) / 1e9, "attention_share_f": share_f}
        base = out[0] if out else row
        row["speedup"] = base["step_s"] / row["step_s"]
        row["memory_ratio"] = row["peak_activation_gb"] / base["peak_activation_gb"]
        out.append(row)
    return out

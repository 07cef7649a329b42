"""Published measured training runs, the yardstick for run planning (issue 53).

``data/published.toml`` holds one ``[[run]]`` per published run: its model, its
parallel layout as the authors ran it, the throughput they measured and where
each figure comes from. ``role = "validation"`` marks the ten rows of the
Megatron-LM SC21 paper's Table 1; ``role = "held-back"`` marks the others.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from functools import cache
from importlib import resources

import tomllib

from pipecore.core.ops import InputError

ROLES = ("validation", "held-back")
SCHEDULES = ("1f1b", "interleaved-1f1b")
RECOMPUTE = ("none", "selective", "full")
FLOPS_FORMULAS = ("megatron-eq3", "model-flops-mfu")


@dataclass(frozen=True)
class PublishedModel:
    """A decoder-only transformer's shape as the source states it.

    Attributes
    ----------
    layers, hidden, heads : int
        Transformer layers, hidden size and attention heads.
    seq, vocab : int
        Sequence length (tokens) and vocabulary size (padded, as trained).
    ffn_hidden : int
        MLP inner width; 4 * hidden unless the source says otherwise.
    kv_heads : int
        Key/value heads; equal to ``heads`` (plain multi-head attention) unless stated.
    gated_mlp : bool
        True for a gated (SwiGLU-style) MLP.
    """

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    ffn_hidden: int
    kv_heads: int
    gated_mlp: bool


@dataclass(frozen=True)
class PublishedRun:
    """One published training run: configuration, measured figure and sources.

    Attributes
    ----------
    id, role : str
        Unique name; ``"validation"`` or ``"held-back"``.
    source, url, config_source, notes : str
        Where the measured figure and the configuration come from, and what was assumed.
    model : PublishedModel
        The model's shape.
    params_billion : float
        Parameter count as published, in billions.
    gpu : str
        The GPU as the source states it; gpus, gpus_per_node count devices.
    tp, pp, dp : int
        Tensor-, pipeline- and data-parallel degrees (tp * pp * dp == gpus).
    microbatch_size, global_batch : int
        Sequences per microbatch and per iteration.
    schedule : str
        ``"1f1b"`` or ``"interleaved-1f1b"``; chunks is virtual stages per device.
    recompute : str
        ``"none"``, ``"selective"`` or ``"full"`` activation recomputation.
    sequence_parallel, dp_overlap : bool
        Megatron sequence parallelism; gradient reduction overlapped with backward.
    zero : int
        0, or 1 when optimizer state is sharded over data-parallel ranks.
    precision : str
        ``"fp16"``, ``"bf16"``, ``"fp8"`` or ``"unknown"``.
    measured_tflops_per_gpu : float
        Published teraFLOP/s per GPU (higher is faster), counted by ``flops_formula``.
    flops_formula : str
        How the source counts FLOPs: ``"megatron-eq3"`` (SC21 eq. 3, recomputation
        included) or ``"model-flops-mfu"`` (model FLOPs, no recomputation).
    measured_iteration_time : float
        Seconds per iteration (lower is faster); nan when not published.
    measured_aggregate_pflops : float
        PetaFLOP/s over all GPUs; nan when not published.
    measured_peak_fraction, measured_mfu, measured_hfu : float
        Fractions (0..1) of peak as published; nan when not published.
    unpublished : tuple of str
        Fields whose value is a placeholder because the source does not publish it.
    stage_layers : tuple of int or None
        Transformer layers of each pipeline stage when the run split them
        unevenly (``pp * chunks`` entries); None for an even split.
    """

    id: str
    role: str
    source: str
    url: str
    config_source: str
    model: PublishedModel
    params_billion: float
    gpu: str
    gpus: int
    gpus_per_node: int
    tp: int
    pp: int
    dp: int
    microbatch_size: int
    global_batch: int
    schedule: str
    chunks: int
    recompute: str
    sequence_parallel: bool
    zero: int
    dp_overlap: bool
    precision: str
    measured_tflops_per_gpu: float
    flops_formula: str
    measured_iteration_time: float
    measured_aggregate_pflops: float
    measured_peak_fraction: float
    measured_mfu: float
    measured_hfu: float
    unpublished: tuple[str, ...]
    notes: str
    stage_layers: tuple[int, ...] | None = None

    @property
    def complete(self) -> bool:
        """True when every configuration field is published (``unpublished`` is empty)."""
        return not self.unpublished

    @property
    def microbatches(self) -> int:
        """Microbatches per pipeline per iteration: global_batch / (microbatch_size * dp)."""
        return self.global_batch // (self.microbatch_size * self.dp)


_OPTIONAL_FLOATS = ("measured_iteration_time", "measured_aggregate_pflops", "measured_peak_fraction",
                    "measured_mfu", "measured_hfu")


def _fail(run_id: str, field: str, rule: str) -> InputError:
    return InputError(f"published run {run_id!r}, field {field!r}: {rule}")


def _int(raw: dict, run_id: str, name: str, minimum: int = 1) -> int:
    if name not in raw:
        raise _fail(run_id, name, "missing")
    v = raw[name]
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise _fail(run_id, name, f"must be an integer >= {minimum}, got {v!r}")
    return v


def _str(raw: dict, run_id: str, name: str, choices: tuple[str, ...] | None = None) -> str:
    if name not in raw:
        raise _fail(run_id, name, "missing")
    v = raw[name]
    if not isinstance(v, str) or not v.strip():
        raise _fail(run_id, name, f"must be a non-empty string, got {v!r}")
    if choices is not None and v not in choices:
        raise _fail(run_id, name, f"must be one of {', '.join(choices)}, got {v!r}")
    return v


def _bool(raw: dict, run_id: str, name: str) -> bool:
    if name not in raw:
        raise _fail(run_id, name, "missing")
    v = raw[name]
    if not isinstance(v, bool):
        raise _fail(run_id, name, f"must be true or false, got {v!r}")
    return v


def _float(raw: dict, run_id: str, name: str, required: bool) -> float:
    if name not in raw:
        if required:
            raise _fail(run_id, name, "missing")
        return math.nan
    v = raw[name]
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _fail(run_id, name, f"must be a number, got {v!r}")
    v = float(v)
    if required and not (math.isfinite(v) and v > 0):
        raise _fail(run_id, name, f"must be a positive finite number, got {v!r}")
    if not required and not (math.isnan(v) or (math.isfinite(v) and v > 0)):
        raise _fail(run_id, name, f"must be positive, or nan when not published, got {v!r}")
    return v


def _model(raw: dict, run_id: str) -> PublishedModel:
    m = raw.get("model")
    if not isinstance(m, dict):
        raise _fail(run_id, "model", f"must be a table of layers, hidden, heads, seq, vocab, got {m!r}")
    known = {"layers", "hidden", "heads", "seq", "vocab", "ffn_hidden", "kv_heads", "gated_mlp"}
    extra = sorted(set(m) - known)
    if extra:
        raise _fail(run_id, "model", f"unknown keys {extra}")
    mid = f"{run_id}.model"
    layers, hidden, heads = _int(m, mid, "layers"), _int(m, mid, "hidden"), _int(m, mid, "heads")
    seq, vocab = _int(m, mid, "seq"), _int(m, mid, "vocab")
    ffn = _int(m, mid, "ffn_hidden") if "ffn_hidden" in m else 4 * hidden
    kv = _int(m, mid, "kv_heads") if "kv_heads" in m else heads
    gated = _bool(m, mid, "gated_mlp") if "gated_mlp" in m else False
    if hidden % heads:
        raise _fail(mid, "heads", f"hidden {hidden} is not divisible by heads {heads}")
    if heads % kv:
        raise _fail(mid, "kv_heads", f"heads {heads} is not divisible by kv_heads {kv}")
    return PublishedModel(layers, hidden, heads, seq, vocab, ffn, kv, gated)


def _run(raw: dict, index: int) -> PublishedRun:
    run_id = raw.get("id")
    if not isinstance(run_id, str) or not run_id.strip():
        raise InputError(f"published run #{index + 1}: field 'id' must be a non-empty string, got {run_id!r}")
    names = {f.name for f in fields(PublishedRun)}
    extra = sorted(set(raw) - names)
    if extra:
        raise _fail(run_id, extra[0], f"unknown field (known: {', '.join(sorted(names))})")
    kw: dict = {"id": run_id, "role": _str(raw, run_id, "role", ROLES)}
    for name in ("source", "url", "config_source", "gpu", "notes"):
        kw[name] = _str(raw, run_id, name)
    kw["model"] = _model(raw, run_id)
    kw["params_billion"] = _float(raw, run_id, "params_billion", required=True)
    for name in ("gpus", "gpus_per_node", "tp", "pp", "dp", "microbatch_size", "global_batch", "chunks"):
        kw[name] = _int(raw, run_id, name)
    kw["zero"] = _int(raw, run_id, "zero", minimum=0)
    kw["schedule"] = _str(raw, run_id, "schedule", SCHEDULES)
    kw["recompute"] = _str(raw, run_id, "recompute", RECOMPUTE)
    kw["precision"] = _str(raw, run_id, "precision", ("fp16", "bf16", "fp8", "unknown"))
    kw["flops_formula"] = _str(raw, run_id, "flops_formula", FLOPS_FORMULAS)
    for name in ("sequence_parallel", "dp_overlap"):
        kw[name] = _bool(raw, run_id, name)
    kw["measured_tflops_per_gpu"] = _float(raw, run_id, "measured_tflops_per_gpu", required=True)
    for name in _OPTIONAL_FLOATS:
        kw[name] = _float(raw, run_id, name, required=False)
    unpublished = raw.get("unpublished", [])
    if not isinstance(unpublished, list) or any(u not in names for u in unpublished):
        raise _fail(run_id, "unpublished", f"must list field names of a run, got {unpublished!r}")
    kw["unpublished"] = tuple(unpublished)
    stages = raw.get("stage_layers")
    if stages is not None:
        if (not isinstance(stages, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1
                                                     for n in stages)):
            raise _fail(run_id, "stage_layers", f"must be a list of positive ints, got {stages!r}")
        kw["stage_layers"] = tuple(stages)
    run = PublishedRun(**kw)
    _check_layout(run)
    return run


def _check_layout(r: PublishedRun) -> None:
    if r.zero > 1:
        raise _fail(r.id, "zero", f"must be 0 or 1, got {r.zero}")
    if r.tp * r.pp * r.dp != r.gpus:
        raise _fail(r.id, "gpus", f"tp*pp*dp = {r.tp}*{r.pp}*{r.dp} = {r.tp * r.pp * r.dp} != gpus {r.gpus}")
    if r.gpus % r.gpus_per_node and r.gpus > r.gpus_per_node:
        raise _fail(r.id, "gpus", f"{r.gpus} GPUs do not fill whole nodes of {r.gpus_per_node}")
    if r.global_batch % (r.microbatch_size * r.dp):
        raise _fail(r.id, "global_batch", f"{r.global_batch} is not divisible by microbatch_size*dp = "
                    f"{r.microbatch_size}*{r.dp}")
    if r.model.heads % r.tp:
        raise _fail(r.id, "tp", f"heads {r.model.heads} are not divisible by tp {r.tp}")
    if (r.schedule == "1f1b") != (r.chunks == 1):
        raise _fail(r.id, "chunks", f"schedule {r.schedule!r} with chunks {r.chunks}: interleaved-1f1b needs "
                    "chunks >= 2, 1f1b exactly 1")
    if r.chunks > 1:
        if r.model.layers % (r.pp * r.chunks):
            raise _fail(r.id, "chunks", f"layers {r.model.layers} do not split into pp*chunks = "
                        f"{r.pp}*{r.chunks} equal chunks")
        if r.microbatches % r.pp:
            raise _fail(r.id, "global_batch", f"interleaving needs microbatches ({r.microbatches}) to be a "
                        f"multiple of pp ({r.pp})")
    if r.sequence_parallel and r.tp == 1:
        raise _fail(r.id, "sequence_parallel", "needs tp > 1")
    if r.stage_layers is not None and (len(r.stage_layers) != r.pp * r.chunks
                                       or sum(r.stage_layers) != r.model.layers):
        raise _fail(r.id, "stage_layers", f"needs pp*chunks = {r.pp * r.chunks} entries summing to the "
                    f"{r.model.layers} layers, got {list(r.stage_layers)}")


def parse_runs(doc: dict) -> list[PublishedRun]:
    """Validate a parsed ``published.toml`` document and build its runs.

    Parameters
    ----------
    doc : dict
        The document as ``tomllib`` returns it, with a ``run`` array of tables.

    Returns
    -------
    list of PublishedRun
        In file order.

    Raises
    ------
    InputError
        If a row misses a field, has an unknown one, holds a value of the wrong type
        or range, repeats an id, or has a layout that does not add up (tp*pp*dp != gpus,
        global batch not a multiple of microbatch_size*dp, ...); the message names the
        run id and the field.
    """
    rows = doc.get("run")
    if not isinstance(rows, list) or not rows:
        raise InputError("published runs: the document needs a non-empty [[run]] array")
    runs, seen = [], set()
    for i, raw in enumerate(rows):
        run = _run(raw, i)
        if run.id in seen:
            raise _fail(run.id, "id", "appears twice")
        seen.add(run.id)
        runs.append(run)
    return runs


@cache
def _load() -> tuple[PublishedRun, ...]:
    text = resources.files("pipecore.plan").joinpath("data/published.toml").read_text(encoding="utf-8")
    return tuple(parse_runs(tomllib.loads(text)))


def published_runs(role: str | None = None) -> list[PublishedRun]:
    """The published measured runs shipped with pipecore, in file order.

    Parameters
    ----------
    role : {None, "validation", "held-back"}
        None for every run; ``"validation"`` for the Megatron SC21 Table 1 rows;
        ``"held-back"`` for the others.

    Returns
    -------
    list of PublishedRun

    Raises
    ------
    InputError
        If ``role`` is not one of the above, or the data file breaks a rule
        (see :func:`parse_runs`).
    """
    if role is not None and role not in ROLES:
        raise InputError(f"published_runs: role must be None or one of {', '.join(ROLES)}, got {role!r}")
    return [r for r in _load() if role is None or r.role == role]


# Sequences per iteration of each model preset's own training run, for a plan that names
# no batch: GPT-3 175B, 3.2M tokens (Brown et al. 2020, Table 2.1) as Megatron-LM's
# examples/gpt3 script runs it, 1536 sequences of 2048; Llama 2, 4M
# tokens of 4096 (Touvron et al. 2023, sec. 2.2); Llama 3, 4M tokens of 8192 (Llama Team
# 2024, sec. 3.4.1: the 405B's initial batch; the paper gives none for 8B and 70B).
# Megatron's Table 1 sizes take their row's batch from published.toml.
_REFERENCE_BATCHES = {"gpt3-175b": 1536, "llama2-7b": 1024, "llama2-13b": 1024, "llama2-70b": 1024,
                      "llama3-8b": 512, "llama3-70b": 512, "llama3-405b": 512}


def reference_batch(preset: str) -> int:
    """The global batch a model preset's own training run used, in sequences.

    Parameters
    ----------
    preset : str
        A model preset name (:meth:`pipecore.Architecture.presets`).

    Returns
    -------
    int
        Sequences per iteration, from the source cited beside the value.

    Raises
    ------
    ValueError
        (:class:`~pipecore.InputError`) if no published batch is known for
        the preset.
    """
    from ..analysis.architecture import Architecture

    key = str(preset).strip().lower()
    if key in _REFERENCE_BATCHES:
        return _REFERENCE_BATCHES[key]
    arch = Architecture.preset(key)
    for run in published_runs("validation"):
        m = run.model
        if (m.layers, m.hidden, m.heads, m.seq, m.vocab) == (arch.layers, arch.hidden, arch.heads, arch.seq,
                                                              arch.vocab):
            return run.global_batch
    raise InputError(f"no published global batch for model preset {preset!r}: give one "
                     f"(--global-batch); known for {', '.join(sorted(_REFERENCE_BATCHES))} and megatron-*")

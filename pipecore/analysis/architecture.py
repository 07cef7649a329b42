"""A decoder-only transformer's architecture: its shapes, parameters, GEMMs,
FLOPs and activation memory, in closed form.

:class:`Architecture` is what a training plan starts from (issue 53):
:meth:`pipecore.Model.transformer` builds its per-layer costs from one,
:meth:`Architecture.preset` names published models, and a strategy model
divides :meth:`Architecture.gemms` by its tensor-parallel degree.

Counts follow the papers in :class:`Architecture`'s References; every
formula reduces to the paper's at a GPT's defaults (a 4h MLP, as many
key/value heads as query heads, no gating), which tests/test_architecture.py
checks against the formulas written out independently.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..core.ops import InputError

__all__ = ["Architecture", "Gemm", "ARCHITECTURE_PRESETS", "RECOMPUTE_MODES"]

#: What a layer keeps for its backward: everything, all but the attention
#: scores (Megatron's selective recompute), or only its input (full).
RECOMPUTE_MODES = ("none", "selective", "full")
POSITION_EMBEDDINGS = ("learned", "rope")
NORMS = ("layernorm", "rmsnorm")
#: Which dimension of a :class:`Gemm` tensor parallelism divides.
TP_SPLITS = ("n", "k", "batch")


def _positive_int(owner, name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise InputError(f"{owner} '{name}' must be an int >= 1 (got {value!r})")
    return int(value)


def _choice(owner, name, value, valid):
    if value not in valid:
        raise InputError(f"{owner} '{name}' must be one of {', '.join(map(repr, valid))} (got {value!r})")
    return value


def _flag(owner, name, value):
    if not isinstance(value, (bool, np.bool_)):
        raise InputError(f"{owner} '{name}' must be True or False (got {value!r})")
    return bool(value)


@dataclass(frozen=True)
class Gemm:
    """One matrix multiply: ``batch`` products of an (m x k) and a (k x n) matrix.

    Parameters
    ----------
    name : str
        ``"qkv"``, ``"proj"``, ``"fc1"`` or ``"gate_up"``, ``"fc2"``,
        ``"scores"`` (Q K^T), ``"context"`` (scores times V) or ``"logits"``.
    m, n, k : int
        Rows of the output, columns of the output, and the reduced dimension.
    batch : int, default 1
        Independent products of that shape (microbatch x heads for the
        attention core).
    tp_split : str, default "n"
        The dimension Megatron's tensor parallelism divides by its degree t:
        ``"n"`` for a column-parallel layer (QKV, fc1, gate/up, logits), ``"k"``
        for a row-parallel one (proj, fc2; its output is then all-reduced),
        ``"batch"`` for the attention core (each rank has its heads).

    Raises
    ------
    ValueError
        If a dimension is not an int >= 1 or ``tp_split`` is unknown.
    """

    name: str
    m: int
    n: int
    k: int
    batch: int = 1
    tp_split: str = "n"

    def __post_init__(self):
        for dim in ("m", "n", "k", "batch"):
            object.__setattr__(self, dim, _positive_int(f"Gemm {self.name!r}", dim, getattr(self, dim)))
        _choice(f"Gemm {self.name!r}", "tp_split", self.tp_split, TP_SPLITS)

    @property
    def flops(self) -> int:
        """``2 batch m n k``: one multiply and one add per product term."""
        return 2 * self.batch * self.m * self.n * self.k


@dataclass(frozen=True)
class Architecture:
    """A decoder-only transformer: ``layers`` identical blocks between an
    embedding and an LM head.

    Parameters
    ----------
    layers, hidden, heads, seq, vocab : int
        Blocks (l), hidden size (h), query heads (a), sequence length (s),
        vocabulary size (V).
    ffn_hidden : int, optional
        Width f of the MLP's inner layer; None gives ``4 * hidden`` (a GPT's).
        A gated MLP's is usually smaller (Llama 2 7B: 11008), so give it.
    kv_heads : int, optional
        Key/value heads (grouped-query attention); None gives ``heads``.
    gated_mlp : bool, default False
        A gated MLP (SwiGLU): gate and up projections h -> f, then f -> h;
        three weight matrices instead of two.
    tied_embeddings : bool, default True
        The LM head reuses the embedding matrix (GPT-2/3, Megatron).
    position_embedding : str, default "learned"
        ``"learned"``: an ``s x h`` table of absolute positions (GPT);
        ``"rope"``: rotary, no parameters (Llama).
    norm : str, default "layernorm"
        ``"layernorm"`` (a gain and a bias, 2h parameters) or ``"rmsnorm"``
        (a gain, h).
    biases : bool, default True
        The linear layers have biases (GPT; Llama has none).
    name : str, default "custom"
        Label.

    Raises
    ------
    ValueError
        If a size is not an int >= 1, ``hidden`` is not a multiple of
        ``heads``, ``heads`` not a multiple of ``kv_heads``, a flag is not a
        bool, or a choice is unknown (the message names the value and rule).

    Notes
    -----
    The defaults describe Megatron's GPT, whose counts the papers give in
    closed form; the methods generalise them term by term to grouped-query
    attention, gated MLPs, any ``ffn_hidden``, untied heads, rotary
    positions, RMSNorm and bias-free layers. Attention FLOPs count the whole
    ``s x s`` score matrix (as [Megatron]_ does; a causal kernel may skip
    half). Elementwise work (norms, softmax, activation functions, rotary)
    is not counted in FLOPs.

    References
    ----------
    .. [Megatron] D. Narayanan et al., "Efficient Large-Scale Language Model
       Training on GPU Clusters Using Megatron-LM", SC'21 (arXiv:2104.04473),
       section 5.1: eq. 2 (parameters), eq. 3 (FLOPs per iteration), Table 1.
    .. [Korthikanti] V. Korthikanti et al., "Reducing Activation Recomputation
       in Large Transformer Models", MLSys 2023 (arXiv:2205.05198), section 4
       and Table 2 (activation bytes per layer).
    .. [ZB] P. Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024,
       Table 1 (the memory the weight gradient W still needs).
    .. [GQA] J. Ainslie et al., "GQA: Training Generalized Multi-Query
       Transformer Models from Multi-Head Checkpoints", EMNLP 2023.
    .. [SwiGLU] N. Shazeer, "GLU Variants Improve Transformer",
       arXiv:2002.05202 (the gated MLP's three matrices).
    """

    layers: int
    hidden: int
    heads: int
    seq: int
    vocab: int
    ffn_hidden: int | None = None
    kv_heads: int | None = None
    gated_mlp: bool = False
    tied_embeddings: bool = True
    position_embedding: str = "learned"
    norm: str = "layernorm"
    biases: bool = True
    name: str = "custom"

    def __post_init__(self):
        own = "Architecture"
        for key in ("layers", "hidden", "heads", "seq", "vocab"):
            object.__setattr__(self, key, _positive_int(own, key, getattr(self, key)))
        if self.hidden % self.heads:
            raise InputError(f"{own} 'hidden' ({self.hidden}) must be a multiple of 'heads' ({self.heads})")
        f = self.ffn_hidden
        ffn = 4 * self.hidden if f is None else _positive_int(own, "ffn_hidden", f)
        kv = self.heads if self.kv_heads is None else _positive_int(own, "kv_heads", self.kv_heads)
        if self.heads % kv:
            raise InputError(f"{own} 'heads' ({self.heads}) must be a multiple of 'kv_heads' ({kv}): "
                             f"each key/value head serves a whole group of query heads")
        object.__setattr__(self, "ffn_hidden", ffn)
        object.__setattr__(self, "kv_heads", kv)
        for key in ("gated_mlp", "tied_embeddings", "biases"):
            object.__setattr__(self, key, _flag(own, key, getattr(self, key)))
        _choice(own, "position_embedding", self.position_embedding, POSITION_EMBEDDINGS)
        _choice(own, "norm", self.norm, NORMS)
        if not isinstance(self.name, str):
            raise InputError(f"{own} 'name' must be a str (got {self.name!r})")

    # -- presets ----------------------------------------------------------
    @classmethod
    def preset(cls, name: str) -> Architecture:
        """A published model's architecture (one of :meth:`presets`).

        Parameters
        ----------
        name : str
            Case-insensitive, e.g. ``"gpt3-175b"``, ``"megatron-1t"``,
            ``"llama3-70b"``. The sources are in ``ARCHITECTURE_PRESETS``'s
            comments.

        Returns
        -------
        Architecture
            A frozen value; change a field with ``dataclasses.replace``
            (e.g. ``seq``).

        Raises
        ------
        ValueError
            If the name is unknown (the message lists the valid ones).
        """
        key = str(name).strip().lower()
        if key not in ARCHITECTURE_PRESETS:
            raise InputError(f"unknown architecture preset {name!r}; "
                             f"valid: {', '.join(ARCHITECTURE_PRESETS)}")
        return ARCHITECTURE_PRESETS[key]

    @staticmethod
    def presets() -> list[str]:
        """Names :meth:`preset` accepts.

        Returns
        -------
        list of str
        """
        return list(ARCHITECTURE_PRESETS)

    # -- shapes and parameters --------------------------------------------
    @property
    def head_dim(self) -> int:
        """``hidden / heads``: the width of one attention head."""
        return self.hidden // self.heads

    @property
    def kv_hidden(self) -> int:
        """``kv_heads * head_dim``: the width of K (and of V)."""
        return self.kv_heads * self.head_dim

    def norm_params(self) -> int:
        """Parameters of one normalisation layer: ``2h`` (LayerNorm) or ``h`` (RMSNorm).

        Returns
        -------
        int
        """
        return (2 if self.norm == "layernorm" else 1) * self.hidden

    def block_params(self) -> int:
        """Parameters of one block.

        QKV ``h (h + 2 kv_hidden)``, projection ``h^2``, MLP ``2 h f`` (gated:
        ``3 h f`` SwiGLU), with biases ``h + 2 kv_hidden``, ``h``, ``f``
        (gated: ``2 f``) and ``h``, and two norms. A GPT's (f = 4h, kv = h,
        LayerNorm, biases) is ``12 h^2 + 13 h``, Megatron eq. 2's per-layer
        term.

        Returns
        -------
        int
        """
        h, kv, f = self.hidden, self.kv_hidden, self.ffn_hidden
        up = 2 * f if self.gated_mlp else f
        weights = h * (h + 2 * kv) + h * h + h * up + f * h
        biases = (h + 2 * kv) + h + up + h if self.biases else 0
        return weights + biases + 2 * self.norm_params()

    def embedding_params(self) -> int:
        """Parameters of the input layer: ``V h`` tokens, ``+ s h`` learned positions.

        Returns
        -------
        int
        """
        pos = self.seq * self.hidden if self.position_embedding == "learned" else 0
        return self.vocab * self.hidden + pos

    def head_params(self) -> int:
        """Parameters only the output layer has: the final norm, plus ``V h``
        when the head is untied.

        A tied head's ``V h`` is the embedding's (counted there once); a
        pipeline still keeps a copy of it on the last stage, which is why
        :meth:`pipecore.Model.transformer`'s head layer holds ``V h`` either way.

        Returns
        -------
        int
        """
        return self.norm_params() + (0 if self.tied_embeddings else self.vocab * self.hidden)

    def params(self) -> int:
        """Distinct parameters of the model: embedding, ``layers`` blocks, head.

        For a GPT this is Megatron eq. 2, ``12 l h^2 (1 + 13/(12h) +
        (V + s)/(12 l h))``, plus the final LayerNorm's ``2h`` that eq. 2
        leaves out.

        Returns
        -------
        int
        """
        return self.embedding_params() + self.layers * self.block_params() + self.head_params()

    # -- GEMMs and FLOPs --------------------------------------------------
    def gemms(self, tokens: int) -> list[Gemm]:
        """The forward GEMMs of one block on ``tokens = b s`` rows.

        In order: ``qkv`` (tokens x (h + 2 kv_hidden) x h), ``proj`` (tokens x
        h x h), ``fc1`` (tokens x f x h) or, gated, ``gate_up`` (tokens x 2f x
        h), ``fc2`` (tokens x h x f), then the attention core per query head:
        ``scores`` (s x s x head_dim) and ``context`` (s x head_dim x s), each
        ``b * heads`` times. Every GEMM's backward is two of the same size
        (the input and the weight gradients; the core's are both input
        gradients).

        Parameters
        ----------
        tokens : int
            Rows: microbatch x seq (a multiple of ``seq``).

        Returns
        -------
        list of Gemm
            Each with (m, n, k) and the dimension tensor parallelism divides.

        Raises
        ------
        ValueError
            If ``tokens`` is not a positive multiple of ``seq``.
        """
        b = self._sequences("gemms", tokens)
        h, f, s, d = self.hidden, self.ffn_hidden, self.seq, self.head_dim
        fc1 = Gemm("gate_up", tokens, 2 * f, h) if self.gated_mlp else Gemm("fc1", tokens, f, h)
        return [Gemm("qkv", tokens, h + 2 * self.kv_hidden, h), Gemm("proj", tokens, h, h, tp_split="k"),
                fc1, Gemm("fc2", tokens, h, f, tp_split="k"),
                Gemm("scores", s, s, d, batch=b * self.heads, tp_split="batch"),
                Gemm("context", s, d, s, batch=b * self.heads, tp_split="batch")]

    def head_gemm(self, tokens: int) -> Gemm:
        """The LM head's forward GEMM, ``logits``: tokens x V x h (column-parallel over V).

        Parameters
        ----------
        tokens : int
            Rows: microbatch x seq (a multiple of ``seq``).

        Returns
        -------
        Gemm

        Raises
        ------
        ValueError
            If ``tokens`` is not a positive multiple of ``seq``.
        """
        self._sequences("head_gemm", tokens)
        return Gemm("logits", tokens, self.vocab, self.hidden)

    def _sequences(self, op, tokens):
        tokens = _positive_int(f"Architecture.{op}", "tokens", tokens)
        if tokens % self.seq:
            raise InputError(f"Architecture.{op} 'tokens' ({tokens}) must be a multiple of 'seq' "
                             f"({self.seq}): microbatch x seq rows")
        return tokens // self.seq

    def flops_per_iteration(self, global_batch: int, recompute: str = "none") -> float:
        """FLOPs one training iteration executes on ``global_batch`` sequences.

        Forward plus backward is three times the forward GEMMs (each
        backward GEMM pair is twice its forward); recomputation adds a
        forward of the blocks (``"full"``) or of their attention core
        (``"selective"``); the head is never recomputed. With
        ``recompute="none"`` this is the model FLOPs of MFU. For a GPT it is
        Megatron eq. 3: ``72 B s l h^2 (1 + s/(6h) + V/(12 l h))``, and
        with full recomputation ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))``;
        the embedding's lookup is not counted.

        Parameters
        ----------
        global_batch : int
            Sequences per iteration (B).
        recompute : str, default "none"
            One of ``RECOMPUTE_MODES``.

        Returns
        -------
        float
            FLOPs per iteration.

        Raises
        ------
        ValueError
            If ``global_batch`` is not an int >= 1 or ``recompute`` is unknown.
        """
        batch = _positive_int("Architecture.flops_per_iteration", "global_batch", global_batch)
        _choice("Architecture.flops_per_iteration", "recompute", recompute, RECOMPUTE_MODES)
        tokens = batch * self.seq
        blocks = self.gemms(tokens)
        block = sum(g.flops for g in blocks)
        core = sum(g.flops for g in blocks if g.tp_split == "batch")
        extra = {"none": 0, "selective": core, "full": block}[recompute]
        return float(self.layers * (3 * block + extra) + 3 * self.head_gemm(tokens).flops)

    # -- memory -----------------------------------------------------------
    def _check_tp(self, op, microbatch, tp, sequence_parallel, bytes_per_value):
        owner = f"Architecture.{op}"
        b = _positive_int(owner, "microbatch", microbatch)
        t = _positive_int(owner, "tp", tp)
        _flag(owner, "sequence_parallel", sequence_parallel)
        q = _positive_int(owner, "bytes_per_value", bytes_per_value)
        if self.kv_heads % t:
            raise InputError(f"{owner} 'tp' ({t}) must divide 'kv_heads' ({self.kv_heads}) (and so 'heads', "
                             f"{self.heads}): tensor parallelism gives each rank whole heads")
        return b, t, q

    def activation_bytes_per_layer(self, microbatch: int, tp: int = 1, sequence_parallel: bool = False,
                                   recompute: str = "none", bytes_per_value: int = 2) -> float:
        """Bytes one block keeps from its forward for its backward, per tensor-parallel rank.

        Korthikanti section 4 and Table 2, with 16-bit values and 1-byte
        dropout masks: ``s b h (34 + 5 a s / h)``; with tensor parallelism of
        degree t, ``s b h (10 + 24/t + 5 a s / (h t))``; with sequence
        parallelism too, ``s b h / t (34 + 5 a s / h)``; ``"selective"``
        drops the ``5 a s / h`` term (the attention scores, recomputed);
        ``"full"`` keeps only the block's input, ``2 s b h`` (``/ t`` with
        sequence parallelism, whose block input is split along s).

        Generalised term by term, in values of q bytes per token: the
        replicated ones (split only by sequence parallelism) are the two norm
        inputs, the QKV input and the fc1 input (``4h``) plus the two dropout
        masks (``2h`` bytes); the ones tensor parallelism splits are Q (h), K
        and V (``2 kv_hidden`` GQA: stored at their own width), the
        projection input (h), and the MLP's activation-function input and fc2
        input (``2f``; gated, the gate and up outputs and the fc2 input,
        ``3f``); the scores are ``a s`` per token (softmax output, its dropout
        mask, the dropout output: ``2q + 1`` bytes each). At the defaults and
        q = 2 these are 10, 24 and 5 a s, the paper's.

        Parameters
        ----------
        microbatch : int
            Sequences per microbatch (b).
        tp : int, default 1
            Tensor-parallel degree (t); must divide ``kv_heads``.
        sequence_parallel : bool, default False
            Megatron's sequence parallelism (the replicated part split by t).
        recompute : str, default "none"
            One of ``RECOMPUTE_MODES``.
        bytes_per_value : int, default 2
            Bytes of an activation value (q).

        Returns
        -------
        float
            Bytes per layer on one rank.

        Raises
        ------
        ValueError
            For a value that is not an int >= 1, a ``tp`` that does not divide
            ``kv_heads``, or an unknown ``recompute``.
        """
        b, t, q = self._check_tp("activation_bytes_per_layer", microbatch, tp, sequence_parallel,
                                 bytes_per_value)
        _choice("Architecture.activation_bytes_per_layer", "recompute", recompute, RECOMPUTE_MODES)
        sb, h = self.seq * b, self.hidden
        rep_t = t if sequence_parallel else 1
        if recompute == "full":
            return float(sb * h * q) / rep_t
        mlp = (3 if self.gated_mlp else 2) * self.ffn_hidden
        replicated = sb * (4 * h * q + 2 * h)
        split = sb * q * (2 * h + 2 * self.kv_hidden + mlp)
        scores = 0 if recompute == "selective" else self.heads * self.seq * sb * (2 * q + 1)
        if t == 1:  # exact integers
            return float(replicated + split + scores)
        return replicated / rep_t + (split + scores) / t

    def weight_grad_bytes_per_layer(self, microbatch: int, tp: int = 1, sequence_parallel: bool = False,
                                    bytes_per_value: int = 2) -> float:
        """Bytes the weight gradients (W) of one block still need once B is done, per rank.

        The input and the output gradient of each linear layer ZB (Table
        1's M_W, ``32 s b h`` for a GPT in 16-bit): inputs ``3h + f`` values
        per token (QKV, proj, fc1 or gate/up, fc2), output gradients ``3h +
        2 kv_hidden + f`` (gated: ``+ 2f``). The QKV and fc1 inputs (``2h``) are
        replicated across tensor-parallel ranks unless ``sequence_parallel``;
        the rest is split by t.

        Parameters
        ----------
        microbatch : int
            Sequences per microbatch (b).
        tp : int, default 1
            Tensor-parallel degree; must divide ``kv_heads``.
        sequence_parallel : bool, default False
            Megatron's sequence parallelism.
        bytes_per_value : int, default 2
            Bytes of a value.

        Returns
        -------
        float
            Bytes per layer on one rank.

        Raises
        ------
        ValueError
            For a value that is not an int >= 1 or a ``tp`` that does not
            divide ``kv_heads``.
        """
        b, t, q = self._check_tp("weight_grad_bytes_per_layer", microbatch, tp, sequence_parallel,
                                 bytes_per_value)
        h, f = self.hidden, self.ffn_hidden
        replicated = self.seq * b * q * 2 * h
        split = self.seq * b * q * (4 * h + 2 * self.kv_hidden + (3 if self.gated_mlp else 2) * f)
        if t == 1:
            return float(replicated + split)
        return replicated / (t if sequence_parallel else 1) + split / t


    def layer_costs(self, microbatch: int, bytes_per_value: int = 2, state_bytes_per_param: float = 16,
                    selective_recompute: bool = True) -> dict:
        """The numbers of :meth:`pipecore.Model.transformer`'s embedding, block and head layers.

        The formulas and their sources are in that method's docstring; the
        block's FLOPs are :meth:`gemms`' (F: the forward; B: the linear
        layers' input gradients and twice the attention core, plus its
        rerun with ``selective_recompute``; W: the linear layers' weight
        gradients), its activation :meth:`activation_bytes_per_layer` and
        what W keeps :meth:`weight_grad_bytes_per_layer`, with ``tp = 1``.

        Parameters
        ----------
        microbatch : int
            Sequences per microbatch.
        bytes_per_value : int, default 2
            Bytes of an activation or weight value.
        state_bytes_per_param : float, default 16
            Training bytes per parameter.
        selective_recompute : bool, default True
            Keep no attention scores; B reruns the attention core.

        Returns
        -------
        dict
            ``{"embedding": ..., "block": ..., "head": ...}``, each a dict of
            :class:`~pipecore.Layer`'s numeric fields (FLOPs, bytes, params).

        Raises
        ------
        ValueError
            If ``microbatch`` or ``bytes_per_value`` is not an int >= 1.
        """
        b = _positive_int("Architecture.layer_costs", "microbatch", microbatch)
        q = _positive_int("Architecture.layer_costs", "bytes_per_value", bytes_per_value)
        s, h, V = self.seq, self.hidden, self.vocab
        sbh = float(s * b * h)

        def layer(flops, moved, activation, activation_w, params, output_bytes):
            return dict(zip(("flops_f", "flops_b", "flops_w", "bytes_f", "bytes_b", "bytes_w", "activation",
                             "activation_w", "params", "param_bytes", "output_bytes"),
                            (*flops, *moved, activation, activation_w, params, params * state_bytes_per_param,
                             output_bytes)))

        p = float(self.embedding_params())
        embedding = layer((0.0, 0.0, sbh), (2 * sbh * q, 0.0, 2 * sbh * q), sbh, 0.0, p, sbh * q)
        gemms = self.gemms(s * b)
        linear = float(sum(g.flops for g in gemms if g.tp_split != "batch"))
        attn = float(sum(g.flops for g in gemms if g.tp_split == "batch"))
        p = float(self.block_params())
        act = self.activation_bytes_per_layer(b, recompute="selective" if selective_recompute else "none",
                                              bytes_per_value=q)
        act_w = self.weight_grad_bytes_per_layer(b, bytes_per_value=q)
        block_b = linear + 2 * attn + (attn if selective_recompute else 0.0)
        block = layer((linear + attn, block_b, linear), (p * q + act, p * q + act, act_w + p * q),
                      act, act_w, p, sbh * q)
        p = float(V * h + self.norm_params())  # the last stage's copy of a tied matrix too
        logits = float(self.head_gemm(s * b).flops)
        act = 2 * sbh * q + 4.0 * s * b * V
        act_w = sbh * q + float(s * b * V) * q
        head = layer((logits,) * 3, (p * q + act, p * q + act, act_w + p * q), act, act_w, p, 0.0)
        return {"embedding": embedding, "block": block, "head": head}

# Published architectures. Megatron's GPTs: 2048 tokens and the 51200-token
# vocabulary Megatron-LM pads GPT-2's 50257 to (a multiple of 128 x t, so the
# head splits evenly) and uses in [Megatron] eq. 3's FLOPs.
def _gpt(name, layers, hidden, heads):
    return Architecture(layers, hidden, heads, 2048, 51200, name=name)


def _llama(name, layers, hidden, heads, kv_heads, ffn, seq, vocab):
    return Architecture(layers, hidden, heads, seq, vocab, ffn_hidden=ffn, kv_heads=kv_heads, gated_mlp=True,
                        tied_embeddings=False, position_embedding="rope", norm="rmsnorm", biases=False,
                        name=name)


ARCHITECTURE_PRESETS = {
    # T. Brown et al., "Language Models are Few-Shot Learners" (NeurIPS 2020),
    # Table 2.1: 96 layers, d_model 12288, 96 heads, context 2048. Vocabulary:
    # Megatron's padded 51200 (GPT-2's BPE has 50257; the pad adds 0.007% of
    # the parameters), as Megatron trains it and counts its FLOPs.
    "gpt3-175b": _gpt("gpt3-175b", 96, 12288, 96),
    # [Megatron] Table 1 (weak scaling): heads, hidden, layers per row.
    **{f"megatron-{size}": _gpt(f"megatron-{size}", layers, hidden, heads)
       for size, heads, hidden, layers in (
           ("1.7b", 24, 2304, 24), ("3.6b", 32, 3072, 30), ("7.5b", 32, 4096, 36),
           ("18.4b", 48, 6144, 40), ("39.1b", 64, 8192, 48), ("76.1b", 80, 10240, 60),
           ("145.6b", 96, 12288, 80), ("310.1b", 128, 16384, 96), ("529.6b", 128, 20480, 105),
           ("1t", 160, 25600, 128))},
    # H. Touvron et al., "Llama 2: Open Foundation and Fine-Tuned Chat Models"
    # (arXiv:2307.09288): context 4096, GQA with 8 KV heads for 70B (Table 1,
    # sec. 2.2); SwiGLU, RMSNorm, rotary, 32000-token vocabulary, untied head;
    # sizes from the meta-llama/Llama-2-{7b,13b,70b}-hf config.json files.
    "llama2-7b": _llama("llama2-7b", 32, 4096, 32, 32, 11008, 4096, 32000),
    "llama2-13b": _llama("llama2-13b", 40, 5120, 40, 40, 13824, 4096, 32000),
    "llama2-70b": _llama("llama2-70b", 80, 8192, 64, 8, 28672, 4096, 32000),
    # Llama Team, "The Llama 3 Herd of Models" (arXiv:2407.21783), Table 3:
    # layers, model dim, FFN dim, heads, 8 KV heads; pre-training context
    # 8192 (sec. 3.4.1); vocabulary 128256 (config.json; "128K" in the paper).
    "llama3-8b": _llama("llama3-8b", 32, 4096, 32, 8, 14336, 8192, 128256),
    "llama3-70b": _llama("llama3-70b", 80, 8192, 64, 8, 28672, 8192, 128256),
    "llama3-405b": _llama("llama3-405b", 126, 16384, 128, 8, 53248, 8192, 128256),
}

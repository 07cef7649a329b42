"""Architecture: parameters, GEMMs, FLOPs and activations against the papers' formulas,
written out here independently of pipecore/analysis/architecture.py, and the presets
against published parameter counts."""

import dataclasses
from fractions import Fraction

import pytest

import pipecore as pc
from pipecore.analysis.architecture import Architecture, Gemm
from pipecore.analysis.model import Model

# Narayanan et al. SC'21 (Megatron) Table 1: parameters (billion), heads, hidden, layers.
MEGATRON_TABLE_1 = {
    "megatron-1.7b": (1.7, 24, 2304, 24), "megatron-3.6b": (3.6, 32, 3072, 30),
    "megatron-7.5b": (7.5, 32, 4096, 36), "megatron-18.4b": (18.4, 48, 6144, 40),
    "megatron-39.1b": (39.1, 64, 8192, 48), "megatron-76.1b": (76.1, 80, 10240, 60),
    "megatron-145.6b": (145.6, 96, 12288, 80), "megatron-310.1b": (310.1, 128, 16384, 96),
    "megatron-529.6b": (529.6, 128, 20480, 105), "megatron-1t": (1008.0, 160, 25600, 128),
}
# GPT shapes for the identities: small ones, odd ones, and Table 1's.
GPTS = [(2, 64, 4, 32, 100), (3, 96, 6, 48, 1000), (1, 8, 1, 5, 7), (96, 12288, 96, 2048, 51200)] + \
    [(layers, hidden, heads, 2048, 51200) for _, heads, hidden, layers in MEGATRON_TABLE_1.values()]


def megatron_eq2(L, h, s, V):
    """Narayanan et al. eq. 2: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h))."""
    return 12 * L * h * h * (1 + Fraction(13, 12 * h) + Fraction(V + s, 12 * L * h))


def megatron_eq3(B, s, L, h, V, full=False):
    """Narayanan et al. eq. 3: F = 72 B s l h^2 (1 + s/(6h) + V/(12 l h)); with full
    activation recomputation 96 B s l h^2 (1 + s/(6h) + V/(16 l h))."""
    if full:
        return 96 * B * s * L * h * h * (1 + Fraction(s, 6 * h) + Fraction(V, 16 * L * h))
    return 72 * B * s * L * h * h * (1 + Fraction(s, 6 * h) + Fraction(V, 12 * L * h))


@pytest.mark.parametrize("shape", GPTS)
@pytest.mark.parametrize("B", [1, 3, 1536])
def test_flops_per_iteration_is_megatron_eq3(shape, B):
    L, h, a, s, V = shape
    arch = Architecture(L, h, a, s, V)
    # float(exact) on both sides: equal exact values round to the same float.
    assert arch.flops_per_iteration(B) == float(megatron_eq3(B, s, L, h, V))
    assert arch.flops_per_iteration(B, "full") == float(megatron_eq3(B, s, L, h, V, full=True))
    # Selective recompute reruns the attention core's forward, 4 B s^2 h per layer
    # (Korthikanti et al. sec. 5): eq. 3's s/(6h) term becomes s/(6h) + s/(18h).
    selective = 72 * B * s * L * h * h * (1 + Fraction(2 * s, 9 * h) + Fraction(V, 12 * L * h))
    assert arch.flops_per_iteration(B, "selective") == float(selective)


@pytest.mark.parametrize("shape", GPTS)
def test_gpt_params_are_megatron_eq2_plus_the_final_layernorm(shape):
    L, h, a, s, V = shape
    arch = Architecture(L, h, a, s, V)
    assert arch.block_params() == 12 * h * h + 13 * h  # eq. 2's per-layer term
    assert arch.params() == megatron_eq2(L, h, s, V) + 2 * h  # eq. 2 leaves out the final LayerNorm
    assert arch.embedding_params() == (V + s) * h and arch.head_params() == 2 * h  # tied head


@pytest.mark.parametrize("name", list(MEGATRON_TABLE_1))
def test_megatron_presets_match_table_1(name):
    billions, heads, hidden, layers = MEGATRON_TABLE_1[name]
    arch = Architecture.preset(name)
    shape = (arch.heads, arch.hidden, arch.layers, arch.seq, arch.vocab)
    assert shape == (heads, hidden, layers, 2048, 51200)
    # Table 1 prints billions to one decimal: eq. 2 and our count both round to it.
    assert round(float(megatron_eq2(layers, hidden, 2048, 51200)) / 1e9, 1) == billions
    assert round(arch.params() / 1e9, 1) == billions


def test_gpt3_175b():
    # Brown et al. 2020 Table 2.1: 96 layers, d_model 12288, 96 heads, context 2048, "175.0B".
    arch = Architecture.preset("gpt3-175b")
    assert (arch.layers, arch.hidden, arch.heads, arch.head_dim, arch.seq) == (96, 12288, 96, 128, 2048)
    # The exact count of that shape is 174.6B (with GPT-2's 50257 tokens, or Megatron's
    # padded 51200 which adds 11.6M): within 0.05B of 174.6, and 0.3% of the paper's 175.0B.
    assert arch.params() == megatron_eq2(96, 12288, 2048, 51200) + 2 * 12288
    assert abs(arch.params() / 1e9 - 174.6) < 0.05
    assert abs(arch.params() / 175.0e9 - 1) < 0.003


def llama_inventory(layers, hidden, heads, kv_heads, ffn, vocab):
    """Sum of the tensor shapes in a Hugging Face Llama checkpoint (config.json names)."""
    kv = kv_heads * hidden // heads
    per_layer = [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden),  # q, k, v, o_proj
                 (ffn, hidden), (ffn, hidden), (hidden, ffn),                     # gate, up, down_proj
                 (hidden,), (hidden,)]                                            # two RMSNorms
    total = vocab * hidden + vocab * hidden + hidden  # embed_tokens, lm_head, final norm
    for shape in per_layer:
        n = 1
        for d in shape:
            n *= d
        total += layers * n
    return total


# (layers, hidden, heads, kv_heads, ffn, vocab, seq) from the papers (Llama 2: Touvron et al.
# 2023 Table 1 and the config.json files; Llama 3: "The Llama 3 Herd of Models" Table 3) and
# the published parameter count in billions with the half-unit of its last printed digit:
# the Hugging Face model pages (safetensors) print 6.74B, 13B, 69B, 8.03B, 70.6B, 406B;
# the brief gives 68.98B, 70.55B and 405.85B, which we use where more precise.
LLAMAS = {
    "llama2-7b": ((32, 4096, 32, 32, 11008, 32000, 4096), 6.74, 0.005),
    "llama2-13b": ((40, 5120, 40, 40, 13824, 32000, 4096), 13.0, 0.05),
    "llama2-70b": ((80, 8192, 64, 8, 28672, 32000, 4096), 68.98, 0.005),
    "llama3-8b": ((32, 4096, 32, 8, 14336, 128256, 8192), 8.03, 0.005),
    "llama3-70b": ((80, 8192, 64, 8, 28672, 128256, 8192), 70.55, 0.005),
    "llama3-405b": ((126, 16384, 128, 8, 53248, 128256, 8192), 405.85, 0.005),
}


@pytest.mark.parametrize("name", list(LLAMAS))
def test_llama_presets_match_published_counts(name):
    (layers, hidden, heads, kv_heads, ffn, vocab, seq), billions, tol = LLAMAS[name]
    arch = Architecture.preset(name)
    assert (arch.layers, arch.hidden, arch.heads, arch.kv_heads, arch.ffn_hidden, arch.vocab, arch.seq) == \
        (layers, hidden, heads, kv_heads, ffn, vocab, seq)
    assert arch.gated_mlp and not arch.tied_embeddings and not arch.biases
    assert arch.norm == "rmsnorm" and arch.position_embedding == "rope"
    assert arch.params() == llama_inventory(layers, hidden, heads, kv_heads, ffn, vocab)
    assert abs(arch.params() / 1e9 - billions) <= tol


def test_llama2_7b_exact_count():
    # 6,738,415,616: the checkpoint's tensor sizes summed (the figure PEFT's
    # print_trainable_parameters reports for Llama-2-7b without adapters).
    assert Architecture.preset("llama2-7b").params() == 6_738_415_616


def test_gemm_shapes_and_flops():
    arch = Architecture(2, 64, 4, 32, 100)  # h 64, 4 heads of 16, f 256
    g = {x.name: x for x in arch.gemms(2 * 32)}
    assert [x.name for x in arch.gemms(64)] == ["qkv", "proj", "fc1", "fc2", "scores", "context"]
    assert (g["qkv"].m, g["qkv"].n, g["qkv"].k, g["qkv"].tp_split) == (64, 192, 64, "n")
    assert (g["proj"].n, g["proj"].k, g["proj"].tp_split) == (64, 64, "k")
    assert (g["fc1"].n, g["fc1"].k) == (256, 64)
    assert (g["fc2"].n, g["fc2"].k, g["fc2"].tp_split) == (64, 256, "k")
    # per head s x s x d, batch b * heads = 8
    assert (g["scores"].m, g["scores"].n, g["scores"].k, g["scores"].batch) == (32, 32, 16, 8)
    assert (g["context"].m, g["context"].n, g["context"].k, g["context"].tp_split) == (32, 16, 32, "batch")
    # Forward FLOPs 24 b s h^2 + 4 b s^2 h (Narayanan et al. sec. 5.1), b = 2, s = 32, h = 64
    assert sum(x.flops for x in g.values()) == 24 * 2 * 32 * 64**2 + 4 * 2 * 32**2 * 64
    head = arch.head_gemm(64)
    assert (head.m, head.n, head.k, head.flops) == (64, 100, 64, 2 * 64 * 100 * 64)
    # GQA narrows QKV to h + 2 kv_hidden; a gated MLP fuses gate and up into one h -> 2f GEMM
    gqa = Architecture(2, 64, 4, 32, 100, kv_heads=1, ffn_hidden=96, gated_mlp=True)
    g = {x.name: x for x in gqa.gemms(32)}
    assert gqa.kv_hidden == 16 and g["qkv"].n == 64 + 32
    assert "fc1" not in g and (g["gate_up"].n, g["gate_up"].k) == (192, 64) and g["fc2"].k == 96
    assert g["scores"].batch == 4  # query heads: GQA does not change the attention core


def sbh_table2(s, b, h, a, t=1, sp=False, recompute="none"):
    """Korthikanti et al. Table 2, bytes per layer (16-bit values)."""
    if recompute == "full":
        return Fraction(2 * s * b * h)
    scores = Fraction(0) if recompute == "selective" else Fraction(5 * a * s, h)
    if sp:
        return Fraction(s * b * h, t) * (34 + scores)
    return s * b * h * (10 + Fraction(24, t) + scores / t)


@pytest.mark.parametrize("shape", [(64, 4, 32), (12288, 96, 2048), (4096, 32, 4096)])
@pytest.mark.parametrize("b", [1, 4])
@pytest.mark.parametrize("t", [1, 2, 4])
def test_activations_are_korthikanti_table_2(shape, b, t):
    h, a, s = shape
    arch = Architecture(2, h, a, s, 100)
    for sp in (False, True):
        for recompute in ("none", "selective"):
            got = arch.activation_bytes_per_layer(b, tp=t, sequence_parallel=sp, recompute=recompute)
            assert got == pytest.approx(float(sbh_table2(s, b, h, a, t, sp, recompute)), rel=1e-14)
    # Full recomputation keeps the layer's input, 2 s b h; sequence parallelism splits it by t.
    assert arch.activation_bytes_per_layer(b, tp=t, recompute="full") == 2 * s * b * h
    assert arch.activation_bytes_per_layer(b, tp=t, sequence_parallel=True, recompute="full") == \
        pytest.approx(2 * s * b * h / t, rel=1e-15)
    if t == 1:  # the unsplit case is exact: s b h (34 + 5 a s / h)
        assert arch.activation_bytes_per_layer(b) == s * b * h * 34 + 5 * a * s * s * b


def test_activations_generalise_by_tensor_inventory():
    # GQA (8 query heads, 2 KV heads of 8) and a gated MLP of f = 96, h = 64, s = 16, b = 2:
    # the tensors a block keeps, per token, in 2-byte values unless said.
    h, a, kv, f, s, b = 64, 8, 16, 96, 16, 2
    arch = Architecture(1, h, a, s, 10, kv_heads=2, ffn_hidden=f, gated_mlp=True)
    replicated = (h + h) * 2 + h * 2 + h * 2 + h + h  # 2 norm inputs, QKV in, gate/up in, 2 dropout masks
    split = (h + kv + kv + h) * 2 + (f + f + f) * 2  # Q, K, V, proj in; gate out, up out, down in
    scores = a * s * (2 + 1 + 2)  # softmax out, its dropout mask (1 byte), dropout out
    assert arch.activation_bytes_per_layer(b) == s * b * (replicated + split + scores)
    assert arch.activation_bytes_per_layer(b, recompute="selective") == s * b * (replicated + split)
    assert arch.activation_bytes_per_layer(b, tp=2) == s * b * (replicated + (split + scores) / 2)
    # What W keeps (ZB Table 1's M_W generalised): each linear layer's input and output gradient.
    inputs = h + h + h + f  # QKV, proj, gate/up, down
    grads = (h + 2 * kv) + h + 2 * f + h
    assert arch.weight_grad_bytes_per_layer(b) == s * b * 2 * (inputs + grads)
    assert Architecture(1, h, a, s, 10).weight_grad_bytes_per_layer(b) == 32 * s * b * h  # ZB: 32 s b h


def test_model_transformer_uses_the_architecture():
    base = dict(layers=2, hidden=64, heads=8, seq=16, vocab=50, microbatch=2)
    plain = Model.transformer(**base)
    gqa = Model.transformer(**base, kv_heads=2, ffn_hidden=96, gated_mlp=True)
    assert plain.architecture == Architecture(2, 64, 8, 16, 50, position_embedding="rope", name="custom")
    blk, gblk = plain.layers[1], gqa.layers[1]
    # Linear-layer FLOPs: 2 b s (h (h + 2 kv) + h^2 + 3 h f) = 2*32*(64*96 + 4096 + 3*64*96)
    linear = 2 * 32 * (64 * 96 + 64 * 64 + 3 * 64 * 96)
    attn = 4 * 2 * 16 * 16 * 64
    assert gblk.flops_w == linear and gblk.flops_f == linear + attn
    assert gblk.flops_b == linear + 3 * attn  # selective recompute reruns the core
    assert gblk.params == 64 * 96 + 64 * 64 + 3 * 64 * 96 + (96 + 64 + 2 * 96 + 64) + 4 * 64
    assert gblk.activation == gqa.architecture.activation_bytes_per_layer(2, recompute="selective")
    assert blk.flops_w == 24 * 32 * 64 * 64  # the defaults: Narayanan et al.'s 24 b s h^2
    # Model FLOPs of the iteration: the layers' sum is eq. 3 plus the embedding's scatter-add.
    full = Model.transformer(**base, selective_recompute=False, position_embedding="learned")
    assert full.totals()["flops"] == float(megatron_eq3(2, 16, 2, 64, 50)) + 2 * 16 * 64
    assert full.layers[0].params == (50 + 16) * 64  # learned positions add s h
    assert Model.uniform(3).architecture is None


def test_model_preset():
    m = pc.Model.preset("LLaMA3-8B", microbatch=2)
    arch = Architecture.preset("llama3-8b")
    assert m.architecture == arch and m.name == "llama3-8b" and m.microbatch == 2 and len(m) == 34
    assert m == Model.transformer(**{f.name: getattr(arch, f.name) for f in dataclasses.fields(arch)},
                                  microbatch=2)
    assert m.totals()["params"] == arch.params()  # untied: every matrix once
    gpt = Model.preset("gpt3-175b")  # tied: the last stage keeps its copy of V h
    assert gpt.totals()["params"] == gpt.architecture.params() + 51200 * 12288
    short = Model.preset("llama2-70b", seq=1024, selective_recompute=False)
    assert short.seq == 1024 and short.architecture.seq == 1024 and short.architecture.kv_heads == 8
    assert set(Architecture.presets()) >= {"gpt3-175b", *MEGATRON_TABLE_1, *LLAMAS}


@pytest.mark.parametrize("call, words", [
    (lambda: Architecture(2, 64, 5, 8, 10), ["'hidden' (64)", "multiple of 'heads' (5)"]),
    (lambda: Architecture(2, 64, 8, 8, 10, kv_heads=3), ["'heads' (8)", "'kv_heads' (3)"]),
    (lambda: Architecture(2, 64, 8, 8, 10, ffn_hidden=0), ["'ffn_hidden'", "int >= 1", "0"]),
    (lambda: Architecture(0, 64, 8, 8, 10), ["'layers'", "int >= 1"]),
    (lambda: Architecture(2, 64, 8, 8, 10, gated_mlp="yes"), ["'gated_mlp'", "True or False"]),
    (lambda: Architecture(2, 64, 8, 8, 10, norm="batchnorm"), ["'norm'", "'rmsnorm'", "'batchnorm'"]),
    (lambda: Architecture(2, 64, 8, 8, 10, position_embedding="alibi"), ["'position_embedding'", "'rope'"]),
    (lambda: Architecture.preset("gpt-5"), ["'gpt-5'", "llama3-405b"]),
    (lambda: Architecture(2, 64, 8, 8, 10).gemms(12), ["'tokens' (12)", "multiple of 'seq' (8)"]),
    (lambda: Architecture(2, 64, 8, 8, 10).flops_per_iteration(4, "some"), ["'recompute'", "'selective'"]),
    (lambda: Architecture(2, 64, 8, 8, 10, kv_heads=2).activation_bytes_per_layer(1, tp=4),
     ["'tp' (4)", "'kv_heads' (2)"]),
    (lambda: Model.transformer(2, 64, 8, 8, 10, kv_heads=3), ["Model.transformer 'heads' (8)", "(3)"]),
    (lambda: Model.transformer(2, 64, 5, 8, 10), ["Model.transformer 'hidden' (64)"]),
    (lambda: Model.preset("llama2-7b", seq=0), ["Model.transformer 'seq'", "int >= 1"]),
    (lambda: Model(Model.uniform(1).layers, architecture="gpt"), ["'architecture'", "got a str"]),
    (lambda: Gemm("x", 1, 0, 1), ["Gemm 'x' 'n'"]),
])
def test_bad_input_names_the_value_and_rule(call, words):
    with pytest.raises(pc.InputError) as info:
        call()
    for word in words:
        assert word in str(info.value)

"""Small random-weight GGUF models of each architecture family (issue 33), written with edgellama's writer,
for evaluating the same file in edgellama and in llama.cpp. Not a converter and not a reference forward pass:
the keys, tensor names, shapes and defaults are llama.cpp's (its src/models/<arch>.cpp, src/llama-model.cpp,
gguf-py/gguf/constants.py and conversion/*.py, read for facts), the vocabulary a real one copied from
llama.cpp's models/ggml-vocab-*.gguf, the weights seeded noise.

Shapes are realistic in kind (GQA ratios, head sizes 64/128/256, partial rotary, fused tensors) but tiny
(2-4 layers, n_embd 256-512); the vocabulary keeps its real size, so it dominates each file. Weights are
N(0, 1/fan_in) so every projection keeps unit-scale activations, norm weights 1 + N(0, 0.1) (as stored:
Gemma's converter has already added its 1), token embeddings (and the output matrix) scaled so logits spread
with a standard deviation of about 3, as a trained model's do: top-2 gaps are then mostly far above
quantization noise. Quantized files are the F32 file run through edgellama's quantizer (llama-quantize's
type mix and reference quantizers, bit-exact with llama.cpp's).
"""

from __future__ import annotations

import dataclasses
import math
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from edgellama.gguf.reader import GGUFFile
from edgellama.gguf.reader import GGUFValueType as V
from edgellama.gguf.writer import GGUFWriter


@dataclass(frozen=True)
class Spec:
    """One synthetic model: its GGUF architecture, vocabulary and the features its file carries."""

    arch: str  # general.architecture
    vocab: str  # models/ggml-vocab-<vocab>.gguf in llama.cpp's tree
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    head_dim: int | None = None  # written as attention.key_length/value_length; None: n_embd / n_head
    n_rot: int | None = None  # rope.dimension_count; None: the head size
    tied: bool = True  # no output.weight: the output matrix is token_embd
    rope_base: float | None = 10000.0  # None: no rope.freq_base key (llama.cpp's default, 10000)
    rms_eps: float = 1e-5
    n_ctx_train: int = 4096
    qkv_bias: bool = False  # qwen2: attn_q/k/v.bias
    qk_norm: bool = False  # qwen3: attn_q_norm / attn_k_norm, one weight per head dimension
    fused: bool = False  # phi3: attn_qkv (Q, K, V rows) and ffn_up holding gate (first n_ff rows) and up
    llama3_rope: tuple[float, float, float, int] | None = None  # (factor, low_freq, high_freq, original ctx)
    rope_scaling: tuple[str, float] | None = None  # rope.scaling.type and .factor
    orig_ctx: int | None = None  # rope.scaling.original_context_length
    longrope: bool = False  # phi3: rope_factors_long/short.weight + rope.scaling.attn_factor
    sliding_window: int | None = None  # attention.sliding_window
    attn_softcap: float | None = None  # attn_logit_softcapping
    final_softcap: float | None = None  # final_logit_softcapping
    post_norms: bool = False  # gemma2: post_attention_norm and post_ffw_norm
    logit_std: float = 3.0
    qk_gain: float = 1.0  # Q and K weights' std times this: attention scores of std ~qk_gain**2
    pooling: int | None = None  # encoders: {arch}.pooling_type (1 mean, 2 cls, 4 rank)
    rank_head: bool = False  # a reranker: cls.weight/bias and cls.output.weight/bias (one score)

    @property
    def encoder(self) -> bool:
        return self.arch in ENCODERS

    @property
    def n_embd_head(self) -> int:
        return self.head_dim or self.n_embd // self.n_head


ENCODERS = ("bert", "nomic-bert")

# The models; a comment names the real model each one imitates in shape.
MODELS: dict[str, Spec] = {
    # bge-small / all-MiniLM: WordPiece vocabulary, absolute positions, biases everywhere, GELU FFN, LayerNorms
    # after each block, mean pooling
    "bert": Spec("bert", "bert-bge", 384, 2, 12, 12, 1536, rope_base=None, rms_eps=1e-12, n_ctx_train=512,
                 pooling=1),
    # nomic-embed-text-v1.5: fused QKV without bias, NeoX rotary (base 1000), SwiGLU FFN without biases, token
    # types, mean pooling (its own vocabulary is bert-base-uncased's, as bert-bge's)
    "nomic-bert": Spec("nomic-bert", "bert-bge", 256, 2, 4, 4, 768, rope_base=1000.0, rms_eps=1e-12,
                       n_ctx_train=2048, fused=True, pooling=1),
    # bge-reranker-base in miniature: bert with the classification head on [CLS], rank pooling
    "bert-rerank": Spec("bert", "bert-bge", 384, 2, 12, 12, 1536, rope_base=None, rms_eps=1e-12, n_ctx_train=512,
                        pooling=4, rank_head=True),
    # Llama 2 / TinyLlama: SentencePiece vocabulary, untied output, GQA 4:1, head 64
    "llama": Spec("llama", "llama-spm", 256, 2, 4, 1, 768, tied=False, n_ctx_train=2048),
    # Llama 3.2 1B: BPE vocabulary (128256), tied, rope_freqs.weight as convert_hf_to_gguf computes it
    # for rope_type llama3 (factor 32, low/high freq factors 1 and 4, original context 8192); the
    # converter writes no rope.scaling.* key for llama3
    "llama3": Spec("llama", "llama-bpe", 256, 2, 4, 1, 1024, rope_base=500000.0, n_ctx_train=131072,
                   llama3_rope=(32.0, 1.0, 4.0, 8192)),
    # a Llama 2 stretched 4x by linear position interpolation, head 128, GQA 2:1
    "llama-linear": Spec("llama", "llama-spm", 256, 2, 2, 1, 768, tied=False, n_ctx_train=16384,
                         rope_scaling=("linear", 4.0)),
    # YaRN x4 from 4096 (what the converter writes for rope_type yarn: type, factor, original context)
    "llama-yarn": Spec("llama", "llama-spm", 256, 2, 4, 2, 768, tied=False, n_ctx_train=16384,
                       rope_scaling=("yarn", 4.0), orig_ctx=4096),
    # Qwen2.5 0.5B: QKV biases, NeoX RoPE, tied
    "qwen2": Spec("qwen2", "qwen2", 256, 2, 4, 2, 1280, rope_base=1e6, rms_eps=1e-6, n_ctx_train=32768,
                  qkv_bias=True),
    # Qwen3 0.6B: head 128 with Q wider than n_embd (key_length written), per-head Q/K RMS norms
    "qwen3": Spec("qwen3", "qwen2", 256, 2, 4, 2, 768, head_dim=128, rope_base=1e6, rms_eps=1e-6,
                  n_ctx_train=40960, qk_norm=True),
    # Phi-3-mini-128k: MHA, fused QKV and gate+up, untied, LongRoPE (4096 -> 131072); its config's
    # sliding_window 262144, which llama.cpp ignores for phi3
    "phi3": Spec("phi3", "phi-3", 512, 2, 8, 8, 1536, tied=False, n_ctx_train=131072, orig_ctx=4096,
                 fused=True, longrope=True, sliding_window=262144),
    # Phi-4-mini: tied (no output.weight), GQA 2:1, head 128 with 3/4 of it rotated (rope.dimension_count
    # 96), LongRoPE, sliding_window 0 (the converter's mark of Phi-4). The phi-3 vocabulary stands in for
    # Phi-4's o200k one, which llama.cpp's tree does not carry.
    "phi4-mini": Spec("phi3", "phi-3", 512, 2, 4, 2, 1536, n_rot=96, n_ctx_train=131072, orig_ctx=4096,
                      fused=True, longrope=True, sliding_window=0),
    # Gemma 2 2B: head 256 (Q 1024 wide on n_embd 512), GQA 2:1, post-attention and post-FFN norms, soft-
    # capped attention scores (50) and logits (30), tied, no rope.freq_base key (the converter writes none).
    # Sliding window 32 instead of 4096 so that the tests' prompts cross it. llama-spm stands in for Gemma's
    # own SentencePiece vocabulary (256000, not in llama.cpp's tree).
    "gemma2": Spec("gemma2", "llama-spm", 512, 4, 4, 2, 2048, head_dim=256, rope_base=None, rms_eps=1e-6,
                   n_ctx_train=8192, sliding_window=32, attn_softcap=50.0, final_softcap=30.0, post_norms=True,
                   qk_gain=2.0),
    # SmolLM3 3B: llama-like, tied, GQA 4:1; llama.cpp skips RoPE in every 4th layer (no key: fixed 4)
    "smollm3": Spec("smollm3", "llama-bpe", 256, 4, 4, 1, 1280, rope_base=5e6, rms_eps=1e-6, n_ctx_train=65536),
}


def vocab_path(vocab: str, vocab_dir: Path | None = None) -> Path:
    """models/ggml-vocab-<vocab>.gguf in llama.cpp's tree (the cached llama-cpp-python sdist by default)."""
    if vocab_dir is None:
        from llamacpp_ref import cached_sdist

        from edgellama.default_model import cache_dir

        vocab_dir = cached_sdist(cache_dir()) / "vendor" / "llama.cpp" / "models"
    return vocab_dir / f"ggml-vocab-{vocab}.gguf"


def llama3_rope_factors(spec: Spec) -> npt.NDArray[np.float32]:
    """rope_freqs.weight as convert_hf_to_gguf makes it for rope_type llama3: per frequency pair, 1 for short
    wavelengths, `factor` for long ones, a smooth blend between (ggml divides the angle by it)."""
    assert spec.llama3_rope is not None
    factor, low, high, old_ctx = spec.llama3_rope
    dim = spec.n_embd_head
    base = spec.rope_base or 10000.0
    freqs = 1.0 / (base ** (np.arange(0, dim, 2, dtype=np.float32) / dim))
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / float(freq)
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1.0 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def longrope_factors(spec: Spec) -> tuple[npt.NDArray[np.float32], npt.NDArray[np.float32], float]:
    """(long, short, attn_factor) shaped like Phi-3-128k's: short factors near 1, long ones rising from ~1 for
    the fastest-turning pairs to ~40 for the slowest; attn_factor by the converter's formula for longrope,
    sqrt(1 + ln(scale) / ln(original context)) with scale = context / original context."""
    assert spec.orig_ctx
    n = (spec.n_rot or spec.n_embd_head) // 2
    t = np.linspace(0.0, 1.0, n, dtype=np.float64)
    short = 1.0 + 0.25 * t**3
    long = np.exp(math.log(1.05) + t**2 * math.log(40.0 / 1.05))
    scale = spec.n_ctx_train / spec.orig_ctx
    attn_factor = math.sqrt(1 + math.log(scale) / math.log(spec.orig_ctx)) if scale > 1 else 1.0
    return long.astype(np.float32), short.astype(np.float32), attn_factor


def tensor_shapes(spec: Spec, n_vocab: int) -> dict[str, tuple[int, ...]]:
    """Every tensor of the file, GGUF order of dims (ne0 = row length first), as llama.cpp loads them."""
    E, F, HD = spec.n_embd, spec.n_ff, spec.n_embd_head
    QD, KVD = spec.n_head * HD, spec.n_head_kv * HD
    if spec.encoder:
        return _encoder_shapes(spec, n_vocab)
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (E, n_vocab), "output_norm.weight": (E,)}
    if not spec.tied:
        shapes["output.weight"] = (E, n_vocab)
    n_rot_half = (spec.n_rot or HD) // 2
    if spec.llama3_rope:
        shapes["rope_freqs.weight"] = (n_rot_half,)
    if spec.longrope:
        shapes["rope_factors_long.weight"] = (n_rot_half,)
        shapes["rope_factors_short.weight"] = (n_rot_half,)
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        shapes[p + "attn_norm.weight"] = (E,)
        if spec.fused:
            shapes[p + "attn_qkv.weight"] = (E, QD + 2 * KVD)
        else:
            shapes.update({p + "attn_q.weight": (E, QD), p + "attn_k.weight": (E, KVD), p + "attn_v.weight": (E, KVD)})
        if spec.qkv_bias:
            shapes.update({p + "attn_q.bias": (QD,), p + "attn_k.bias": (KVD,), p + "attn_v.bias": (KVD,)})
        if spec.qk_norm:
            shapes.update({p + "attn_q_norm.weight": (HD,), p + "attn_k_norm.weight": (HD,)})
        shapes[p + "attn_output.weight"] = (QD, E)
        if spec.post_norms:
            shapes[p + "post_attention_norm.weight"] = (E,)
        shapes[p + "ffn_norm.weight"] = (E,)
        if spec.fused:
            shapes[p + "ffn_up.weight"] = (E, 2 * F)  # rows 0..F-1 the gate (SiLU'd), F..2F-1 the up projection
        else:
            shapes.update({p + "ffn_gate.weight": (E, F), p + "ffn_up.weight": (E, F)})
        shapes[p + "ffn_down.weight"] = (F, E)
        if spec.post_norms:
            shapes[p + "post_ffw_norm.weight"] = (E,)
    return shapes


def _encoder_shapes(spec: Spec, n_vocab: int) -> dict[str, tuple[int, ...]]:
    """bert: separate Q/K/V with biases, position embeddings, GELU FFN with biases; nomic-bert: attn_qkv,
    rotary, gate/up/down without biases. Both: token types, an input LayerNorm, post-norm LayerNorms."""
    E, F = spec.n_embd, spec.n_ff
    nomic = spec.arch == "nomic-bert"
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (E, n_vocab), "token_types.weight": (E, 2)}
    if not nomic:
        shapes["position_embd.weight"] = (E, spec.n_ctx_train)
    shapes.update({"token_embd_norm.weight": (E,), "token_embd_norm.bias": (E,)})
    for il in range(spec.n_layer):
        p = f"blk.{il}."
        if nomic:
            shapes[p + "attn_qkv.weight"] = (E, 3 * E)
        else:
            for t in ("q", "k", "v"):
                shapes[p + f"attn_{t}.weight"] = (E, E)
                shapes[p + f"attn_{t}.bias"] = (E,)
        shapes[p + "attn_output.weight"] = (E, E)
        if not nomic:
            shapes[p + "attn_output.bias"] = (E,)
        shapes.update({p + "attn_output_norm.weight": (E,), p + "attn_output_norm.bias": (E,)})
        if nomic:
            shapes[p + "ffn_gate.weight"] = (E, F)
        shapes[p + "ffn_up.weight"] = (E, F)
        if not nomic:
            shapes[p + "ffn_up.bias"] = (F,)
        shapes[p + "ffn_down.weight"] = (F, E)
        if not nomic:
            shapes[p + "ffn_down.bias"] = (E,)
        shapes.update({p + "layer_output_norm.weight": (E,), p + "layer_output_norm.bias": (E,)})
    if spec.rank_head:
        shapes.update({"cls.weight": (E, E), "cls.bias": (E,), "cls.output.weight": (E, 1), "cls.output.bias": (1,)})
    return shapes


def _weights(spec: Spec, name: str, shape: tuple[int, ...], seed: int) -> npt.NDArray[np.float32]:
    """One tensor's values; its own generator (seed, name), so adding or dropping a tensor or a feature
    leaves every other tensor's values as they were."""
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    np_shape = tuple(reversed(shape))
    if name.endswith("norm.weight"):
        return (1.0 + 0.1 * rng.standard_normal(np_shape, dtype=np.float32)).astype(np.float32)
    if name.endswith(".bias"):
        return (0.3 * rng.standard_normal(np_shape, dtype=np.float32)).astype(np.float32)
    if name in ("token_embd.weight", "output.weight"):
        return rng.standard_normal(np_shape, dtype=np.float32) * np.float32(spec.logit_std / math.sqrt(spec.n_embd))
    x = rng.standard_normal(np_shape, dtype=np.float32) * np.float32(1.0 / math.sqrt(shape[0]))  # fan-in: row length
    if name.endswith(("attn_q.weight", "attn_k.weight")):
        x *= np.float32(spec.qk_gain)
    elif name.endswith("attn_qkv.weight"):
        x[: (spec.n_head + spec.n_head_kv) * spec.n_embd_head] *= np.float32(spec.qk_gain)  # the Q and K rows
    return x


def _encoder_keys(w: GGUFWriter, spec: Spec, kind: str) -> None:
    """What conversion/bert.py writes for BertModel / NomicBertModel."""
    a = spec.arch
    w.add("general.name", f"edgellama synthetic {kind}")
    w.add(f"{a}.block_count", spec.n_layer, V.UINT32)
    w.add(f"{a}.context_length", spec.n_ctx_train, V.UINT32)
    w.add(f"{a}.embedding_length", spec.n_embd, V.UINT32)
    w.add(f"{a}.feed_forward_length", spec.n_ff, V.UINT32)
    w.add(f"{a}.attention.head_count", spec.n_head, V.UINT32)
    w.add(f"{a}.attention.layer_norm_epsilon", spec.rms_eps, V.FLOAT32)
    w.add(f"{a}.attention.causal", False, V.BOOL)
    if spec.pooling is not None:
        w.add(f"{a}.pooling_type", spec.pooling, V.UINT32)
    if spec.rope_base is not None:
        w.add(f"{a}.rope.freq_base", spec.rope_base, V.FLOAT32)
    w.add("general.file_type", 0, V.UINT32)


def _model_keys(w: GGUFWriter, spec: Spec, kind: str, n_vocab: int) -> None:
    a = spec.arch
    if spec.encoder:
        _encoder_keys(w, spec, kind)
        return
    w.add("general.name", f"edgellama synthetic {kind}")
    w.add(f"{a}.context_length", spec.n_ctx_train, V.UINT32)
    w.add(f"{a}.embedding_length", spec.n_embd, V.UINT32)
    w.add(f"{a}.block_count", spec.n_layer, V.UINT32)
    w.add(f"{a}.feed_forward_length", spec.n_ff, V.UINT32)
    w.add(f"{a}.attention.head_count", spec.n_head, V.UINT32)
    w.add(f"{a}.attention.head_count_kv", spec.n_head_kv, V.UINT32)
    w.add(f"{a}.attention.layer_norm_rms_epsilon", spec.rms_eps, V.FLOAT32)
    if spec.head_dim:
        w.add(f"{a}.attention.key_length", spec.head_dim, V.UINT32)
        w.add(f"{a}.attention.value_length", spec.head_dim, V.UINT32)
    if spec.rope_base is not None:
        w.add(f"{a}.rope.freq_base", spec.rope_base, V.FLOAT32)
    if spec.arch != "gemma2":  # its converter writes no dimension count
        w.add(f"{a}.rope.dimension_count", spec.n_rot or spec.n_embd_head, V.UINT32)
    if spec.arch in ("llama", "smollm3"):  # the llama converter's
        w.add(f"{a}.vocab_size", n_vocab, V.UINT32)
    if spec.rope_scaling:
        w.add(f"{a}.rope.scaling.type", spec.rope_scaling[0])
        w.add(f"{a}.rope.scaling.factor", spec.rope_scaling[1], V.FLOAT32)
    if spec.orig_ctx:
        w.add(f"{a}.rope.scaling.original_context_length", spec.orig_ctx, V.UINT32)
    if spec.longrope:
        w.add(f"{a}.rope.scaling.attn_factor", longrope_factors(spec)[2], V.FLOAT32)
    if spec.sliding_window is not None:
        w.add(f"{a}.attention.sliding_window", spec.sliding_window, V.UINT32)
    if spec.attn_softcap is not None:
        w.add(f"{a}.attn_logit_softcapping", spec.attn_softcap, V.FLOAT32)
    if spec.final_softcap is not None:
        w.add(f"{a}.final_logit_softcapping", spec.final_softcap, V.FLOAT32)
    w.add("general.file_type", 0, V.UINT32)  # LLAMA_FTYPE_ALL_F32


def spec_of(kind: str, **overrides: Any) -> Spec:
    """MODELS[kind] with fields replaced (a feature switched off for a control file, another window...)."""
    if kind not in MODELS:
        raise ValueError(f"unknown model kind {kind!r}; one of {', '.join(MODELS)}")
    return dataclasses.replace(MODELS[kind], **overrides)


def write_arch_model(path: Path, kind: str, *, qtype: str = "F32", seed: int = 0, vocab_dir: Path | None = None,
                     f32_source: Path | None = None, **overrides: Any) -> Path:
    """Writes model KIND (a key of MODELS; OVERRIDES replace Spec fields) to PATH with weights from SEED.
    qtype: "F32", or a llama-quantize file type ("Q8_0", "Q4_K_M", "Q6_K", "Q4_0", ...) made from the F32
    file: F32_SOURCE if given (the same kind, seed and overrides, written before), else one written beside
    PATH and removed after."""
    path = Path(path)
    if qtype.upper() != "F32":
        from edgellama.quantize_model import quantize_model

        src = f32_source or path.with_name(path.name + ".f32.tmp")
        try:
            if f32_source is None:
                write_arch_model(src, kind, seed=seed, vocab_dir=vocab_dir, **overrides)
            quantize_model(src, path, qtype, threads=2)
        finally:
            if f32_source is None:
                src.unlink(missing_ok=True)
        return path
    spec = spec_of(kind, **overrides)
    with GGUFFile(vocab_path(spec.vocab, vocab_dir)) as vf:
        tok_keys = [k for k in vf.metadata if k.startswith("tokenizer.")]
        tok_bytes = {k: vf.kv_bytes(k) for k in tok_keys}
        n_vocab = len(vf.metadata["tokenizer.ggml.tokens"])
    w = GGUFWriter(path, arch=spec.arch)
    _model_keys(w, spec, kind, n_vocab)
    for k in tok_keys:  # the vocabulary bit for bit, types and all
        if spec.encoder and k == "tokenizer.ggml.token_type_count":
            continue  # written below: this model has 2 token types
        w.add_kv_bytes(k, tok_bytes[k])
    if spec.encoder:
        w.add("tokenizer.ggml.token_type_count", 2, V.UINT32)
    fixed: dict[str, npt.NDArray[np.float32]] = {}
    if spec.llama3_rope:
        fixed["rope_freqs.weight"] = llama3_rope_factors(spec)
    if spec.longrope:
        fixed["rope_factors_long.weight"], fixed["rope_factors_short.weight"], _ = longrope_factors(spec)
    for name, shape in tensor_shapes(spec, n_vocab).items():
        data = fixed[name] if name in fixed else _weights(spec, name, shape, seed)
        w.add_tensor(name, data, shape)
    return w.write()

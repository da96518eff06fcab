"""Model wiring: GGUF metadata and tensor names -> the engine's model description, per architecture.

The architectures are llama.cpp's, by its names and keys (ARCHS below: one entry each). Every tensor of
the file is either read by the graph or refused by name (a Llama 3 file's `rope_freqs.weight` ignored
would run with the wrong rotation); so is metadata that changes the math and is not implemented (a
RoPE scaling type, MoE experts, a decoder's non-causal attention): refused by key and value. Every missing
key or tensor and every wrong shape is a ModelError that names it; metadata is read only through the
typed keys of edgellama.gguf.metadata. No arithmetic on tensor data here; the one read of it is the
check that each F32 norm weight, bias and rotation factor holds only finite values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from edgellama.gguf import metadata as K
from edgellama.gguf.ggml_types import COMPUTE_TYPES, row_bytes, type_name
from edgellama.gguf.metadata import Metadata, ModelError  # callers catch ModelError from here
from edgellama.gguf.split import ModelFile
from edgellama.native.desc import FLOAT32_MAX, LayerDesc, ModelDesc, RopeExt, TensorRef


@dataclass(frozen=True)
class Arch:
    """How one of llama.cpp's architectures maps onto the engine's forward pass."""

    graph: str = "llama"  # the C pass: "llama", "gemma3" (Gemma's norms and embedding scale) or "bert"
    act: str = "silu"
    neox: bool = False  # NeoX rotation: pairs (i, i + n_rot/2)
    qk_norm: bool = False  # per-head RMS norms of Q and K (required)
    post_norms: bool = False  # norms after attention and after the FFN (Gemma)
    swa_pattern: int = 0  # default sliding-window pattern: layer il is local when il % n < n - 1
    swa_default: int = 0  # window when the file names none (Gemma 2: 4096)
    swa_base: float | None = None  # RoPE base of local layers when rope.freq_base_swa is absent (None: global)
    softcap: bool = False  # Gemma 2's soft-capping of attention scores and logits
    no_rope_step: int = 0  # SmolLM3: layer il is not rotated when (il + 1) % step == 0
    fused_ffn: bool = False  # Phi-3: ffn_up holds the gate's rows, then the up projection's
    rope_factors: bool = False  # reads rope_freqs.weight (Llama 3), or rope_factors_long/short (LongRoPE)
    ignores_window: bool = False  # Phi-3: llama.cpp runs it without its sliding window (it warns), so do we
    scale_q: bool = False  # the attention scale multiplies Q, as llama.cpp's graph does (its rounding)
    eps: float = 1e-5  # default RMS epsilon
    rope_base: float = 10000.0
    rotary: bool = True  # False: absolute position embeddings instead (BERT)


ARCHS: dict[str, Arch] = {
    "llama": Arch(rope_factors=True),
    "qwen2": Arch(neox=True, eps=1e-6),
    "qwen3": Arch(neox=True, qk_norm=True, eps=1e-6),
    "smollm3": Arch(no_rope_step=4),
    "phi3": Arch(neox=True, fused_ffn=True, rope_factors=True, ignores_window=True, scale_q=True),
    "gemma2": Arch(graph="gemma3", act="gelu", neox=True, post_norms=True, swa_pattern=2, swa_default=4096,
                   softcap=True, scale_q=True, eps=1e-6),
    "gemma3": Arch(graph="gemma3", act="gelu", neox=True, qk_norm=True, post_norms=True, swa_pattern=6,
                   swa_base=10000.0, scale_q=True, eps=1e-6, rope_base=1e6),
    # encoders: post-norm LayerNorms, non-causal unless the file says otherwise, no output head
    "bert": Arch(graph="bert", act="gelu", rotary=False, eps=1e-12),
    "nomic-bert": Arch(graph="bert", neox=True, eps=1e-12),
}
SUPPORTED_ARCHS = tuple(ARCHS)
LLAMA_FAMILY = tuple(a for a, s in ARCHS.items() if s.graph == "llama")
# llama.cpp's pooling types ({arch}.pooling_type, --pooling), by their numbers
POOLING_TYPES = {-1: "unspecified", 0: "none", 1: "mean", 2: "cls", 3: "last", 4: "rank"}

# Tensors a file may hold that no graph reads and that llama.cpp skips as well, with the reason. Empty
# today: llama.cpp refuses a file whose tensors it does not all create ("wrong number of tensors").
SKIPPED_TENSORS: dict[str, str] = {}

# Gemma's larger models scale queries by 1/sqrt(n_embd / n_head) rather than 1/sqrt(head size); llama.cpp
# recognises them by their layer count (Gemma 2 27B: 46, Gemma 3 27B: 62)
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}


@dataclass
class RankHead:
    """A reranker's classification head on the pooled (first token's) state, as llama.cpp's rank pooling:
    scores = out_w (tanh(w x + b)) + out_b, each stage optional (a file may have only one of them)."""

    w: TensorRef | None  # cls.weight (n_embd x n_embd) and cls.bias
    b: TensorRef | None
    out_w: TensorRef | None  # cls.output.weight (n_cls_out rows of n_embd) and cls.output.bias
    out_b: TensorRef | None
    labels: list[str]  # {arch}.classifier.output_labels; one score per label ([] = one unnamed score)


@dataclass
class HParams:
    """What the file says that the engine's ModelDesc does not carry: the architecture's own name
    (ModelDesc holds only its C graph), the context the model was trained for, and LongRoPE's two sets of
    frequency factors (which one runs depends on the context: for_context)."""

    arch: str
    n_ctx_train: int
    n_ctx_orig: int = 0  # rope.scaling.original_context_length (LongRoPE's switch point)
    pooling: str = "unspecified"  # the file's {arch}.pooling_type: how embeddings pool by default
    rank_head: RankHead | None = None  # a reranker's classification head (pooling rank)
    rope_long: TensorRef | None = None
    rope_short: TensorRef | None = None


def _architecture(meta: Metadata) -> str:
    arch: str = meta.get(K.ARCHITECTURE)
    if arch not in ARCHS:
        raise ModelError(f"architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})")
    return arch


def _check_finite(name: str, data: np.ndarray) -> None:
    """Refuses a F32 tensor holding NaN or an infinity: a norm weight or bias is used on every token, so
    one such value makes every logit NaN and the sampler pick garbage (issue 32). These tensors are
    small (n_embd or head_dim values each, a few hundred KB over a whole model): one pass at load."""
    values = data.view(np.float32)
    if not np.isfinite(values).all():
        bad = int(values.size - np.count_nonzero(np.isfinite(values)))
        raise ModelError(f"tensor {name}: {bad} of {values.size} values are NaN or infinite")


class _Tensors:
    """The file's tensors by name; remembers which ones the graph read (unused() is the rest)."""

    def __init__(self, f: ModelFile) -> None:
        self.by_name = {t.name: t for t in f.tensors}
        self.used: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.by_name

    def get(self, name: str, shape: tuple[int, ...], required: bool = True, f32: bool = False
            ) -> TensorRef | None:
        t = self.by_name.get(name)
        if t is None:
            if required:
                raise ModelError(f"tensor {name} is missing")
            return None
        self.used.add(name)
        got = tuple(int(x) for x in t.shape)
        if got != shape:
            raise ModelError(f"tensor {name} has shape {list(got)}, expected {list(shape)}")
        if f32 and t.ggml_type != 0:
            raise ModelError(f"tensor {name} is {type_name(t.ggml_type)}, expected F32")
        if f32:
            _check_finite(name, t.data)
        if not f32 and t.ggml_type not in COMPUTE_TYPES:
            raise ModelError(f"tensor {name} has type {type_name(t.ggml_type)}, which the kernels do not support")
        ne1 = shape[1] if len(shape) > 1 else 1
        return TensorRef(t.data, int(t.ggml_type), shape[0], ne1)

    def req(self, name: str, shape: tuple[int, ...], f32: bool = False) -> TensorRef:
        t = self.get(name, shape, True, f32)
        assert t is not None
        return t

    def unused(self) -> list[str]:
        return [n for n in self.by_name if n not in self.used and n not in SKIPPED_TENSORS]


def _rows(t: TensorRef, first: int, n: int) -> TensorRef:
    """Rows [first, first + n) of a 2-D tensor (or elements of a 1-D F32 one) as a tensor of their own:
    a view into the same mapping, no copy. A fused tensor (attn_qkv, Phi-3's gate+up) is its parts
    stacked by rows, and each output of a matmul reads one row: the parts' matmuls give the same bits."""
    if t.ne1 == 1 and n != 1:  # 1-D (a fused bias): elements
        return TensorRef(t.data[first * 4:(first + n) * 4], t.ggml_type, n, 1)
    rb = row_bytes(t.ggml_type, t.ne0)
    return TensorRef(t.data[first * rb:(first + n) * rb], t.ggml_type, t.ne0, n)


@dataclass
class _Dims:
    E: int
    n_head: int
    n_head_kv: int
    HD: int
    n_rot: int
    F: int
    V: int
    n_layer: int

    @property
    def QD(self) -> int:
        return self.n_head * self.HD

    @property
    def KVD(self) -> int:
        return self.n_head_kv * self.HD


def _dims(meta: Metadata, a: str, emb_shape: tuple[int, ...]) -> _Dims:
    E = meta.get(K.EMBEDDING_LENGTH)
    n_head = meta.get(K.HEAD_COUNT)
    n_head_kv = meta.get(K.HEAD_COUNT_KV, n_head)
    if n_head % n_head_kv:
        raise ModelError(f"{K.HEAD_COUNT.resolve(a)} {n_head} is not a multiple of "
                         f"{K.HEAD_COUNT_KV.resolve(a)} {n_head_kv}")
    if K.KEY_LENGTH not in meta and E < n_head:
        raise ModelError(f"{K.EMBEDDING_LENGTH.resolve(a)} {E} is less than {K.HEAD_COUNT.resolve(a)} {n_head}: "
                         f"no head size")
    HD = meta.get(K.KEY_LENGTH, E // n_head)
    if meta.get(K.VALUE_LENGTH, HD) != HD:
        raise ModelError(f"{K.KEY_LENGTH.resolve(a)} != {K.VALUE_LENGTH.resolve(a)} is not supported")
    n_rot = meta.get(K.ROPE_DIMENSION_COUNT, HD)
    if n_rot > HD or n_rot % 2:
        raise ModelError(f"metadata key {K.ROPE_DIMENSION_COUNT.resolve(a)} = {n_rot} must be even and at most "
                         f"the head size {HD}")
    V = meta.get(K.VOCAB_SIZE, int(emb_shape[1]))
    if V != emb_shape[1]:
        raise ModelError(f"{K.VOCAB_SIZE.resolve(a)} {V} != token_embd rows {emb_shape[1]}")
    return _Dims(E, n_head, n_head_kv, HD, n_rot, meta.get(K.FEED_FORWARD_LENGTH), V, meta.get(K.BLOCK_COUNT))


def _refuse_unimplemented(meta: Metadata, a: str, spec: Arch) -> None:
    """Metadata llama.cpp reads for every architecture that would change what this engine computes."""
    experts = meta.get(K.EXPERT_COUNT, 0)
    if experts > 1:  # llama.cpp treats 0 and 1 as dense
        raise ModelError(f"metadata key {K.EXPERT_COUNT.resolve(a)} = {experts}: mixture-of-experts models are "
                         f"not supported")
    if spec.graph != "bert" and not meta.get(K.ATTENTION_CAUSAL, True):
        raise ModelError(f"metadata key {K.ATTENTION_CAUSAL.resolve(a)} = false: non-causal attention is "
                         f"supported for encoders (bert, nomic-bert) only")
    pooling = meta.get(K.POOLING_TYPE, -1)
    if pooling not in POOLING_TYPES:
        raise ModelError(f"metadata key {K.POOLING_TYPE.resolve(a)} = {pooling} is not a pooling type "
                         f"({', '.join(f'{k} {v}' for k, v in POOLING_TYPES.items())})")


def _rope(meta: Metadata, a: str, n_ctx_train: int) -> tuple[str, float, RopeExt]:
    """The RoPE scaling type ("none", "linear", "yarn", "longrope"), the frequency scale of the global
    layers and the YaRN/attention-factor settings, as llama.cpp derives them from the file (no overrides)."""
    kind = meta.get(K.ROPE_SCALING_TYPE, "linear")  # llama.cpp's default when the key is absent
    if kind not in ("none", "linear", "yarn", "longrope"):
        raise ModelError(f"metadata key {K.ROPE_SCALING_TYPE.resolve(a)} = {kind!r} is not supported "
                         f"(none, linear, yarn, longrope)")
    factor = meta.get(K.ROPE_SCALING_FACTOR, meta.get(K.ROPE_SCALE_LINEAR, 0.0))
    scale = 1.0 if kind == "none" or factor == 0.0 else 1.0 / factor  # 0 = not set
    if scale > FLOAT32_MAX:
        raise ModelError(f"metadata key {K.ROPE_SCALING_FACTOR.resolve(a)} = {factor} is too small")
    f32 = np.float32
    attn = f32(1.0)
    ext = RopeExt(n_ctx_orig=meta.get(K.ROPE_SCALING_ORIG_CTX, n_ctx_train))
    if kind == "yarn":
        # llama.cpp's cparams: the magnitude llama.cpp's rope kernel multiplies in itself is cancelled here,
        # in float32 as there, so that the product in the kernel is the same
        fac = f32(1.0) / f32(scale)
        attn = f32(f32(0.1) * np.log(fac) + f32(1.0)) if fac > 1.0 else f32(1.0)
        attn = f32(attn * (f32(1.0) / (f32(1.0) + f32(0.1) * np.log(fac))))
        ext.ext_factor = 1.0
    attn = f32(attn * f32(meta.get(K.ROPE_SCALING_ATTN_FACTOR, 1.0)))
    ext.attn_factor = float(attn)
    return kind, scale, ext


def _softcaps(meta: Metadata, spec: Arch) -> tuple[float, float]:
    if spec.softcap:  # Gemma 2: both on, llama.cpp's defaults 50 and 30 unless the file says
        return meta.get(K.ATTN_SOFTCAP, 50.0), meta.get(K.FINAL_SOFTCAP, 30.0)
    if spec.graph == "gemma3":  # Gemma 3: a final soft-cap only if the file names one
        return 0.0, meta.get(K.FINAL_SOFTCAP, 0.0)
    return 0.0, 0.0


def build_desc(f: ModelFile) -> tuple[HParams, ModelDesc]:
    ts = _Tensors(f)
    emb = ts.by_name.get("token_embd.weight")
    if emb is None:
        raise ModelError("tensor token_embd.weight is missing")
    if len(emb.shape) != 2:
        raise ModelError("tensor token_embd.weight is not 2-D")
    meta = Metadata.of(f)
    a = _architecture(meta)
    spec = ARCHS[a]
    meta = meta.with_arch(a)
    _refuse_unimplemented(meta, a, spec)
    if spec.graph == "bert":
        return _build_encoder(ts, meta, a, spec, tuple(int(x) for x in emb.shape))
    d = _dims(meta, a, tuple(int(x) for x in emb.shape))
    n_ctx_train = meta.get(K.CONTEXT_LENGTH, 2048)
    norm_eps = meta.get(K.RMS_EPSILON, spec.eps)
    rope_base = meta.get(K.ROPE_FREQ_BASE, spec.rope_base)
    rope_kind, rope_scale, rope_ext = _rope(meta, a, n_ctx_train)
    if rope_kind == "longrope" and not spec.rope_factors:
        raise ModelError(f"metadata key {K.ROPE_SCALING_TYPE.resolve(a)} = 'longrope' is not supported for {a}")
    window, pattern = 0, 0
    if spec.swa_pattern:
        window = meta.get(K.SLIDING_WINDOW, spec.swa_default)
        pattern = meta.get(K.SLIDING_WINDOW_PATTERN, spec.swa_pattern)
    elif not spec.ignores_window and meta.get(K.SLIDING_WINDOW, 0):
        raise ModelError(f"metadata key {K.SLIDING_WINDOW.resolve(a)} = {meta.get(K.SLIDING_WINDOW)}: a sliding "
                         f"window is not supported for {a}")
    swa_base = meta.get(K.ROPE_FREQ_BASE_SWA, spec.swa_base if spec.swa_base is not None else rope_base)
    swa_scale = 1.0 if spec.swa_base is not None else rope_scale  # Gemma 3's local layers: never scaled
    hp = HParams(arch=a, n_ctx_train=n_ctx_train, n_ctx_orig=rope_ext.n_ctx_orig,
                 pooling=POOLING_TYPES[meta.get(K.POOLING_TYPE, -1)])

    # the rotation's frequency factors, one tensor for every layer (llama.cpp: duplicated per layer)
    freqs = None
    if spec.rope_factors:
        half = (d.n_rot // 2,)
        if rope_kind == "longrope" or a == "phi3":
            hp.rope_long = ts.get("rope_factors_long.weight", half, required=False, f32=True)
            hp.rope_short = ts.get("rope_factors_short.weight", half, required=False, f32=True)
            if (hp.rope_long is None) != (hp.rope_short is None):
                raise ModelError("tensors rope_factors_long.weight and rope_factors_short.weight come as a pair")
            freqs = hp.rope_short
        else:
            freqs = ts.get("rope_freqs.weight", half, required=False, f32=True)
    attn_softcap, final_softcap = _softcaps(meta, spec)

    layers = []
    for il in range(d.n_layer):
        layers.append(_layer(ts, spec, d, f"blk.{il}."))
        L = layers[-1]
        L.rope_base, L.rope_scale, L.rope_freqs = rope_base, rope_scale, freqs
        if window and (pattern == 0 or il % pattern < pattern - 1):
            L.window = window
            L.rope_base, L.rope_scale = swa_base, swa_scale
        if spec.no_rope_step and (il + 1) % spec.no_rope_step == 0:
            L.no_rope = True
    big = _GEMMA_27B_LAYERS.get(a) == d.n_layer
    desc = ModelDesc(
        arch=spec.graph,
        act=spec.act,
        rope_neox=spec.neox,
        n_layer=d.n_layer,
        n_embd=d.E,
        n_head=d.n_head,
        n_head_kv=d.n_head_kv,
        head_dim=d.HD,
        n_rot=d.n_rot,
        n_ff=d.F,
        n_vocab=d.V,
        norm_eps=norm_eps,
        emb_scale=math.sqrt(d.E) if spec.graph == "gemma3" else 1.0,
        attn_scale=1.0 / math.sqrt(d.E // d.n_head if big else d.HD),
        tok_embd=ts.req("token_embd.weight", (d.E, d.V)),
        output_norm=ts.req("output_norm.weight", (d.E,), f32=True),
        output=ts.get("output.weight", (d.E, d.V), required=False),
        layers=layers,
        attn_softcap=attn_softcap,
        final_softcap=final_softcap,
        scale_q=spec.scale_q,
        rope=rope_ext,
    )
    _refuse_unused(ts, a)
    return hp, desc


def _refuse_unused(ts: _Tensors, a: str) -> None:
    unused = ts.unused()
    if unused:
        more = f" and {len(unused) - 3} more" if len(unused) > 3 else ""
        raise ModelError(f"tensor {unused[0]} is not read by the {a} graph (unused: {', '.join(unused[:3])}{more}); "
                         f"this file needs a feature edgellama does not have")


def _build_encoder(ts: _Tensors, meta: Metadata, a: str, spec: Arch, emb_shape: tuple[int, ...]
                   ) -> tuple[HParams, ModelDesc]:
    """bert and nomic-bert, as llama.cpp's bert graph: token (+ type row 0) (+ absolute position)
    embeddings and a LayerNorm, then per layer attention with biases and a LayerNorm after the residual,
    the FFN (GELU without a gate: bert; SwiGLU: nomic-bert) and a LayerNorm after the residual."""
    d = _dims(meta, a, emb_shape)
    if d.n_head_kv != d.n_head:
        raise ModelError(f"{K.HEAD_COUNT_KV.resolve(a)} {d.n_head_kv} != {K.HEAD_COUNT.resolve(a)} {d.n_head}: "
                         f"the {a} graph has as many KV heads as query heads")
    n_ctx_train = meta.get(K.CONTEXT_LENGTH, 512)
    rope_base = meta.get(K.ROPE_FREQ_BASE, spec.rope_base)
    kind, rope_scale, rope_ext = _rope(meta, a, n_ctx_train) if spec.rotary else ("none", 1.0, RopeExt())
    if kind not in ("none", "linear"):
        raise ModelError(f"metadata key {K.ROPE_SCALING_TYPE.resolve(a)} = {kind!r} is not supported for {a}")
    E, F = d.E, d.F
    n_types = int(ts.by_name["token_types.weight"].shape[1]) if ts.has("token_types.weight") else 0
    layers = []
    for il in range(d.n_layer):
        p = f"blk.{il}."
        wq, wk, wv, bq, bk, bv = _qkv(ts, d, p)
        L = LayerDesc(
            attn_norm=ts.req(p + "attn_output_norm.weight", (E,), f32=True),
            attn_norm_b=ts.req(p + "attn_output_norm.bias", (E,), f32=True),
            wq=wq, wk=wk, wv=wv, bq=bq, bk=bk, bv=bv,
            wo=ts.req(p + "attn_output.weight", (d.QD, E)),
            bo=ts.get(p + "attn_output.bias", (E,), required=False, f32=True),
            ffn_norm=ts.req(p + "layer_output_norm.weight", (E,), f32=True),
            ffn_norm_b=ts.req(p + "layer_output_norm.bias", (E,), f32=True),
            w_gate=ts.req(p + "ffn_gate.weight", (E, F)) if spec.act == "silu" else None,
            w_up=ts.req(p + "ffn_up.weight", (E, F)), b_up=ts.get(p + "ffn_up.bias", (F,), required=False, f32=True),
            w_down=ts.req(p + "ffn_down.weight", (F, E)),
            b_down=ts.get(p + "ffn_down.bias", (E,), required=False, f32=True),
            rope_base=rope_base, rope_scale=rope_scale, no_rope=not spec.rotary,
        )
        layers.append(L)
    desc = ModelDesc(
        arch="bert", act=spec.act, rope_neox=spec.neox,
        n_layer=d.n_layer, n_embd=E, n_head=d.n_head, n_head_kv=d.n_head_kv, head_dim=d.HD, n_rot=d.n_rot,
        n_ff=F, n_vocab=d.V, norm_eps=meta.get(K.LAYERNORM_EPSILON, spec.eps), emb_scale=1.0,
        attn_scale=1.0 / math.sqrt(d.HD),
        tok_embd=ts.req("token_embd.weight", (E, d.V)), output_norm=None, output=None, layers=layers,
        rope=rope_ext,
        type_embd=ts.req("token_types.weight", (E, n_types)) if n_types else None,
        pos_embd=None if spec.rotary else ts.req("position_embd.weight", (E, n_ctx_train)),
        tok_norm=ts.req("token_embd_norm.weight", (E,), f32=True),
        tok_norm_b=ts.req("token_embd_norm.bias", (E,), f32=True),
        non_causal=not meta.get(K.ATTENTION_CAUSAL, False),
    )
    head = _rank_head(ts, meta, E)
    _refuse_unused(ts, a)
    pooling = POOLING_TYPES[meta.get(K.POOLING_TYPE, -1)]
    return HParams(arch=a, n_ctx_train=n_ctx_train, pooling=pooling, rank_head=head), desc


def _rank_head(ts: _Tensors, meta: Metadata, E: int) -> RankHead | None:
    """cls.weight / cls.bias (E x E) and cls.output.weight / .bias (one row per output label), if any."""
    labels = list(meta.get(K.CLASSIFIER_LABELS, []))
    n_out = len(labels) or 1
    w = ts.get("cls.weight", (E, E), required=False)
    b = ts.get("cls.bias", (E,), required=False, f32=True)
    out_w = ts.get("cls.output.weight", (E, n_out), required=False)
    out_b = ts.get("cls.output.bias", (n_out,), required=False, f32=True)
    if w is None and out_w is None:
        if b is not None or out_b is not None:
            raise ModelError("tensor cls.bias or cls.output.bias without its weight")
        return None
    if (w is None and b is not None) or (out_w is None and out_b is not None):
        raise ModelError("tensor cls.bias or cls.output.bias without its weight")
    return RankHead(w, b, out_w, out_b, labels)


def _qkv(ts: _Tensors, d: _Dims, p: str) -> tuple[TensorRef, TensorRef, TensorRef,
                                                   TensorRef | None, TensorRef | None, TensorRef | None]:
    """A layer's Q, K, V weights and optional biases, separate or fused (attn_qkv: their rows stacked)."""
    E, QD, KVD = d.E, d.QD, d.KVD
    if ts.has(p + "attn_qkv.weight"):
        qkv = ts.req(p + "attn_qkv.weight", (E, QD + 2 * KVD))
        wq, wk, wv = _rows(qkv, 0, QD), _rows(qkv, QD, KVD), _rows(qkv, QD + KVD, KVD)
        fused_b = ts.get(p + "attn_qkv.bias", (QD + 2 * KVD,), required=False, f32=True)
    else:
        wq, wk, wv = ts.req(p + "attn_q.weight", (E, QD)), ts.req(p + "attn_k.weight", (E, KVD)), \
            ts.req(p + "attn_v.weight", (E, KVD))
        fused_b = None
    if fused_b is not None:
        return wq, wk, wv, _rows(fused_b, 0, QD), _rows(fused_b, QD, KVD), _rows(fused_b, QD + KVD, KVD)
    return (wq, wk, wv, ts.get(p + "attn_q.bias", (QD,), required=False, f32=True),
            ts.get(p + "attn_k.bias", (KVD,), required=False, f32=True),
            ts.get(p + "attn_v.bias", (KVD,), required=False, f32=True))


def _layer(ts: _Tensors, spec: Arch, d: _Dims, p: str) -> LayerDesc:
    E, QD, HD, F = d.E, d.QD, d.HD, d.F
    attn_norm = ts.req(p + "attn_norm.weight", (E,), f32=True)
    # fused Q, K, V (Phi-3; any architecture llama.cpp loads it for) or separate
    wq, wk, wv, bq, bk, bv = _qkv(ts, d, p)
    if spec.fused_ffn:  # Phi-3: one matrix, the gate's F rows then the up projection's F rows
        up2 = ts.req(p + "ffn_up.weight", (E, 2 * F))
        w_gate, w_up = _rows(up2, 0, F), _rows(up2, F, F)
    else:
        w_gate, w_up = ts.req(p + "ffn_gate.weight", (E, F)), ts.req(p + "ffn_up.weight", (E, F))
    L = LayerDesc(
        attn_norm=attn_norm,
        wq=wq, wk=wk, wv=wv,
        wo=ts.req(p + "attn_output.weight", (QD, E)),
        ffn_norm=ts.req(p + "ffn_norm.weight", (E,), f32=True),
        w_gate=w_gate, w_up=w_up,
        w_down=ts.req(p + "ffn_down.weight", (F, E)),
        bq=bq, bk=bk, bv=bv,
        q_norm=ts.get(p + "attn_q_norm.weight", (HD,), required=spec.qk_norm, f32=True),
        k_norm=ts.get(p + "attn_k_norm.weight", (HD,), required=spec.qk_norm, f32=True),
    )
    if spec.post_norms:
        L.attn_post_norm = ts.req(p + "post_attention_norm.weight", (E,), f32=True)
        L.ffn_post_norm = ts.req(p + "post_ffw_norm.weight", (E,), f32=True)
    return L


def for_context(hp: HParams, desc: ModelDesc, n_ctx: int) -> ModelDesc:
    """desc for a context of n_ctx tokens per sequence: LongRoPE's long factors when n_ctx passes the
    original context (as llama.cpp chooses them, by the context size, for every position), else desc."""
    if hp.rope_long is None or n_ctx <= hp.n_ctx_orig:
        return desc
    return replace(desc, layers=[replace(L, rope_freqs=hp.rope_long) for L in desc.layers])


# how each architecture was checked against llama.cpp (README "Supported architectures" says the same)
CHECKED = {
    "gemma3": "real model (Gemma 3 270M): llama.cpp's reference logits, greedy text, perplexity",
    "llama": "real model (SmolLM2 135M) and synthetic files with Llama 3 factors, linear and YaRN scaling",
    "qwen2": "real model (Qwen2.5-Coder 0.5B) and synthetic files",
    "qwen3": "synthetic files, logits against llama.cpp on the same file",
    "smollm3": "synthetic files, logits against llama.cpp on the same file",
    "phi3": "synthetic files (fused QKV and gate+up, partial rotary, LongRoPE), logits against llama.cpp",
    "gemma2": "synthetic files (soft-capping, alternating sliding window), logits against llama.cpp",
    "bert": "real model (all-MiniLM-L6-v2, converted): embeddings against llama.cpp's on the same file",
    "nomic-bert": "synthetic files (fused QKV, rotary, SwiGLU): embeddings against llama.cpp's",
}


def support(f: ModelFile) -> tuple[bool, str]:
    """Whether this engine runs the file, and how (the graph's features) or why not (the ModelError)."""
    try:
        hp, d = build_desc(f)
    except ModelError as exc:
        return False, str(exc)
    if d.arch == "bert":
        feats = [f"bert graph (encoder, {'non-causal' if d.non_causal else 'causal'})",
                 "absolute positions" if d.pos_embd is not None else f"NeoX rotation of {d.n_rot}/{d.head_dim} dims",
                 f"{d.n_head} heads", "gated SiLU FFN" if d.act == "silu" else "GELU FFN",
                 f"embeddings only, pooling {hp.pooling}"]
        return True, f"{'; '.join(feats)} (checked: {CHECKED[hp.arch]})"
    feats = [f"{d.arch} graph", f"{'NeoX' if d.rope_neox else 'normal'} rotation of {d.n_rot}/{d.head_dim} dims",
             f"{d.n_head} query / {d.n_head_kv} KV heads"]
    if any(L.rope_freqs is not None for L in d.layers) or hp.rope_long is not None:
        feats.append("LongRoPE factors" if hp.rope_long is not None else "Llama 3 frequency factors")
    if d.rope.ext_factor:
        feats.append(f"YaRN from {d.rope.n_ctx_orig} tokens")
    elif d.layers and d.layers[-1].rope_scale != 1.0:
        feats.append(f"linear RoPE scaling x{1 / d.layers[-1].rope_scale:g}")
    local = sum(1 for L in d.layers if L.window)
    if local:
        feats.append(f"sliding window {max(L.window for L in d.layers)} on {local} of {d.n_layer} layers")
    unrotated = sum(1 for L in d.layers if L.no_rope)
    if unrotated:
        feats.append(f"{unrotated} unrotated layers")
    if d.attn_softcap or d.final_softcap:
        feats.append(f"soft-capping {d.attn_softcap:g}/{d.final_softcap:g}")
    feats.append("tied output" if d.output is None else "own output matrix")
    return True, f"{'; '.join(feats)} (checked: {CHECKED[hp.arch]})"

"""Model wiring: GGUF metadata and tensor names -> the engine's model description, per architecture.

Supports `gemma3` and the llama family (`llama`, `qwen2`, `qwen3`); every missing key or tensor,
wrong shape or unsupported architecture is a ModelError that names it. No arithmetic here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from edgellama.gguf.ggml_types import COMPUTE_TYPES, type_name
from edgellama.gguf.reader import GGUFFile
from edgellama.native.desc import ACT_GELU, ACT_SILU, ARCH_GEMMA3, ARCH_LLAMA, LayerDesc, ModelDesc, TensorRef

LLAMA_FAMILY = ("llama", "qwen2", "qwen3")
SUPPORTED_ARCHS = ("gemma3",) + LLAMA_FAMILY


class ModelError(ValueError):
    """The GGUF file does not describe a model this engine can run."""


@dataclass
class HParams:
    arch: str
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    n_ff: int
    n_vocab: int
    n_ctx_train: int
    norm_eps: float
    rope_base: float
    rope_scale: float
    sliding_window: int
    swa_pattern: int


def _get(md: dict[str, Any], key: str, default: Any = None, required: bool = True) -> Any:
    if key in md:
        v = md[key]
        if hasattr(v, "ndim") and getattr(v, "ndim", 0) > 0:
            raise ModelError(f"metadata key {key} is an array, expected a single value")
        return v
    if required and default is None:
        raise ModelError(f"metadata key {key} is missing")
    return default


def _int(md: dict[str, Any], key: str, default: int | None = None) -> int:
    v = _get(md, key, default)
    try:
        iv = int(v)
    except (TypeError, ValueError):
        raise ModelError(f"metadata key {key} = {v!r} is not an integer") from None
    if iv < 0:
        raise ModelError(f"metadata key {key} = {iv} is negative")
    return iv


def hparams(md: dict[str, Any], n_vocab_tensor: int) -> HParams:
    arch = md.get("general.architecture")
    if not isinstance(arch, str):
        raise ModelError("metadata key general.architecture is missing")
    if arch not in SUPPORTED_ARCHS:
        raise ModelError(f"architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})")
    a = arch
    n_embd = _int(md, f"{a}.embedding_length")
    n_head = _int(md, f"{a}.attention.head_count")
    if n_head == 0:
        raise ModelError(f"{a}.attention.head_count is 0")
    head_dim = _int(md, f"{a}.attention.key_length", n_embd // n_head)
    if _int(md, f"{a}.attention.value_length", head_dim) != head_dim:
        raise ModelError("key_length != value_length is not supported")
    scale_type = md.get(f"{a}.rope.scaling.type", "none")
    factor = float(md.get(f"{a}.rope.scaling.factor", 1.0) or 1.0)
    if scale_type not in ("none", "linear", None) and factor != 1.0:
        raise ModelError(f"RoPE scaling type {scale_type!r} is not supported")
    rope_scale = 1.0 / factor if scale_type == "linear" and factor > 0 else 1.0
    eps_default = 1e-6 if a == "gemma3" else 1e-5
    hp = HParams(
        arch=a,
        n_layer=_int(md, f"{a}.block_count"),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=_int(md, f"{a}.attention.head_count_kv", n_head),
        head_dim=head_dim,
        n_rot=_int(md, f"{a}.rope.dimension_count", head_dim),
        n_ff=_int(md, f"{a}.feed_forward_length"),
        n_vocab=_int(md, f"{a}.vocab_size", n_vocab_tensor),
        n_ctx_train=_int(md, f"{a}.context_length", 2048),
        norm_eps=float(_get(md, f"{a}.attention.layer_norm_rms_epsilon", eps_default)),
        rope_base=float(_get(md, f"{a}.rope.freq_base", 1e6 if a == "gemma3" else 10000.0)),
        rope_scale=rope_scale,
        sliding_window=_int(md, f"{a}.attention.sliding_window", 0),
        swa_pattern=_int(md, f"{a}.attention.sliding_window_pattern", 6 if a == "gemma3" else 0),
    )
    if hp.n_head_kv == 0 or hp.n_head % hp.n_head_kv:
        raise ModelError(f"head_count {hp.n_head} is not a multiple of head_count_kv {hp.n_head_kv}")
    if hp.n_vocab != n_vocab_tensor:
        raise ModelError(f"vocab_size {hp.n_vocab} != token_embd rows {n_vocab_tensor}")
    return hp


class _Tensors:
    def __init__(self, f: GGUFFile) -> None:
        self.f = f
        self.by_name = {t.name: t for t in f.tensors}

    def get(self, name: str, shape: tuple[int, ...], required: bool = True, f32: bool = False
            ) -> TensorRef | None:
        t = self.by_name.get(name)
        if t is None:
            if required:
                raise ModelError(f"tensor {name} is missing")
            return None
        got = tuple(int(x) for x in t.shape)
        if got != shape:
            raise ModelError(f"tensor {name} has shape {list(got)}, expected {list(shape)}")
        if f32 and t.ggml_type != 0:
            raise ModelError(f"tensor {name} is {type_name(t.ggml_type)}, expected F32")
        if not f32 and t.ggml_type not in COMPUTE_TYPES:
            raise ModelError(f"tensor {name} has type {type_name(t.ggml_type)}, which the kernels do not support")
        ne1 = shape[1] if len(shape) > 1 else 1
        return TensorRef(t.data, int(t.ggml_type), shape[0], ne1)

    def req(self, name: str, shape: tuple[int, ...], f32: bool = False) -> TensorRef:
        t = self.get(name, shape, True, f32)
        assert t is not None
        return t


def build_desc(f: GGUFFile) -> tuple[HParams, ModelDesc]:
    ts = _Tensors(f)
    emb = ts.by_name.get("token_embd.weight")
    if emb is None:
        raise ModelError("tensor token_embd.weight is missing")
    if len(emb.shape) != 2:
        raise ModelError("tensor token_embd.weight is not 2-D")
    hp = hparams(f.metadata, int(emb.shape[1]))
    E, HD, F, V = hp.n_embd, hp.head_dim, hp.n_ff, hp.n_vocab
    QD, KVD = hp.n_head * HD, hp.n_head_kv * HD
    gemma = hp.arch == "gemma3"
    layers = []
    for il in range(hp.n_layer):
        p = f"blk.{il}."
        L = LayerDesc(
            attn_norm=ts.req(p + "attn_norm.weight", (E,), f32=True),
            wq=ts.req(p + "attn_q.weight", (E, QD)),
            wk=ts.req(p + "attn_k.weight", (E, KVD)),
            wv=ts.req(p + "attn_v.weight", (E, KVD)),
            wo=ts.req(p + "attn_output.weight", (QD, E)),
            ffn_norm=ts.req(p + "ffn_norm.weight", (E,), f32=True),
            w_gate=ts.req(p + "ffn_gate.weight", (E, F)),
            w_up=ts.req(p + "ffn_up.weight", (E, F)),
            w_down=ts.req(p + "ffn_down.weight", (F, E)),
            bq=ts.get(p + "attn_q.bias", (QD,), required=False, f32=True),
            bk=ts.get(p + "attn_k.bias", (KVD,), required=False, f32=True),
            bv=ts.get(p + "attn_v.bias", (KVD,), required=False, f32=True),
            q_norm=ts.get(p + "attn_q_norm.weight", (HD,), required=gemma, f32=True),
            k_norm=ts.get(p + "attn_k_norm.weight", (HD,), required=gemma, f32=True),
            rope_base=hp.rope_base,
            rope_scale=hp.rope_scale,
        )
        if gemma:
            L.attn_post_norm = ts.req(p + "post_attention_norm.weight", (E,), f32=True)
            L.ffn_post_norm = ts.req(p + "post_ffw_norm.weight", (E,), f32=True)
            # 5 of every 6 layers are local: sliding window, RoPE base 10000, no scaling (as llama.cpp)
            if hp.swa_pattern and il % hp.swa_pattern < hp.swa_pattern - 1 and hp.sliding_window:
                L.window = hp.sliding_window
                L.rope_base = 10000.0
                L.rope_scale = 1.0
        layers.append(L)
    desc = ModelDesc(
        arch=ARCH_GEMMA3 if gemma else ARCH_LLAMA,
        act=ACT_GELU if gemma else ACT_SILU,
        rope_neox=hp.arch in ("gemma3", "qwen2", "qwen3"),
        n_layer=hp.n_layer,
        n_embd=E,
        n_head=hp.n_head,
        n_head_kv=hp.n_head_kv,
        head_dim=HD,
        n_rot=hp.n_rot,
        n_ff=F,
        n_vocab=V,
        norm_eps=hp.norm_eps,
        emb_scale=math.sqrt(E) if gemma else 1.0,
        attn_scale=1.0 / math.sqrt(HD),
        tok_embd=ts.req("token_embd.weight", (E, V)),
        output_norm=ts.req("output_norm.weight", (E,), f32=True),
        output=ts.get("output.weight", (E, V), required=False),
        layers=layers,
    )
    return hp, desc

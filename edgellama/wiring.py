"""Model wiring: GGUF metadata and tensor names -> the engine's model description, per architecture.

Supports `gemma3` and the llama family (`llama`, `qwen2`, `qwen3`); every missing key or tensor,
wrong shape or unsupported architecture is a ModelError that names it; metadata is read only through
the typed keys of edgellama.gguf.metadata. No arithmetic on tensor data here; the one read of it is the
check that each F32 norm weight and bias (the small 1-D tensors) holds only finite values.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from edgellama.gguf import metadata as K
from edgellama.gguf.ggml_types import COMPUTE_TYPES, type_name
from edgellama.gguf.metadata import Metadata, ModelError  # callers catch ModelError from here
from edgellama.gguf.split import ModelFile
from edgellama.native.desc import (
    FLOAT32_MAX,
    LayerDesc,
    ModelDesc,
    TensorRef,
)

LLAMA_FAMILY = ("llama", "qwen2", "qwen3")
SUPPORTED_ARCHS = ("gemma3",) + LLAMA_FAMILY


@dataclass
class HParams:
    """What the file says that the engine's ModelDesc does not carry: the architecture's own name
    (ModelDesc holds only its C family) and the context the model was trained for."""

    arch: str
    n_ctx_train: int


def _architecture(meta: Metadata) -> str:
    arch: str = meta.get(K.ARCHITECTURE)
    if arch not in SUPPORTED_ARCHS:
        raise ModelError(f"architecture {arch!r} is not supported (supported: {', '.join(SUPPORTED_ARCHS)})")
    return arch


def _rope_scale(meta: Metadata) -> float:
    """The frequency scale handed to C (1/factor for linear scaling, else 1)."""
    scale_type = meta.get(K.ROPE_SCALING_TYPE, "none")
    factor = meta.get(K.ROPE_SCALING_FACTOR, 1.0) or 1.0  # 0 = not set, as llama.cpp reads it
    if scale_type not in ("none", "linear") and factor != 1.0:
        raise ModelError(f"RoPE scaling type {scale_type!r} is not supported")
    scale = 1.0 / factor if scale_type == "linear" else 1.0
    if scale > FLOAT32_MAX:
        raise ModelError(f"metadata key {K.ROPE_SCALING_FACTOR.resolve(meta.arch)} = {factor} is too small")
    return scale


def _check_finite(name: str, data: np.ndarray) -> None:
    """Refuses a F32 tensor holding NaN or an infinity: a norm weight or bias is used on every token, so
    one such value makes every logit NaN and the sampler pick garbage (issue 32). These tensors are
    small (n_embd or head_dim values each, a few hundred KB over a whole model): one pass at load."""
    values = data.view(np.float32)
    if not np.isfinite(values).all():
        bad = int(values.size - np.count_nonzero(np.isfinite(values)))
        raise ModelError(f"tensor {name}: {bad} of {values.size} values are NaN or infinite")


class _Tensors:
    def __init__(self, f: ModelFile) -> None:
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


def build_desc(f: ModelFile) -> tuple[HParams, ModelDesc]:
    ts = _Tensors(f)
    emb = ts.by_name.get("token_embd.weight")
    if emb is None:
        raise ModelError("tensor token_embd.weight is missing")
    if len(emb.shape) != 2:
        raise ModelError("tensor token_embd.weight is not 2-D")
    meta = Metadata.of(f)
    a = _architecture(meta)
    meta = meta.with_arch(a)
    gemma = a == "gemma3"
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
    V = meta.get(K.VOCAB_SIZE, int(emb.shape[1]))
    if V != emb.shape[1]:
        raise ModelError(f"{K.VOCAB_SIZE.resolve(a)} {V} != token_embd rows {emb.shape[1]}")
    n_layer = meta.get(K.BLOCK_COUNT)
    F = meta.get(K.FEED_FORWARD_LENGTH)
    norm_eps = meta.get(K.RMS_EPSILON, 1e-6 if gemma else 1e-5)
    rope_base = meta.get(K.ROPE_FREQ_BASE, 1e6 if gemma else 10000.0)
    rope_scale = _rope_scale(meta)
    sliding_window = meta.get(K.SLIDING_WINDOW, 0)
    swa_pattern = meta.get(K.SLIDING_WINDOW_PATTERN, 6 if gemma else 0)
    hp = HParams(arch=a, n_ctx_train=meta.get(K.CONTEXT_LENGTH, 2048))
    QD, KVD = n_head * HD, n_head_kv * HD
    layers = []
    for il in range(n_layer):
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
            rope_base=rope_base,
            rope_scale=rope_scale,
        )
        if gemma:
            L.attn_post_norm = ts.req(p + "post_attention_norm.weight", (E,), f32=True)
            L.ffn_post_norm = ts.req(p + "post_ffw_norm.weight", (E,), f32=True)
            # 5 of every 6 layers are local: sliding window, RoPE base 10000, no scaling (as llama.cpp)
            if swa_pattern and il % swa_pattern < swa_pattern - 1 and sliding_window:
                L.window = sliding_window
                L.rope_base = 10000.0
                L.rope_scale = 1.0
        layers.append(L)
    desc = ModelDesc(
        arch="gemma3" if gemma else "llama",
        act="gelu" if gemma else "silu",
        rope_neox=a in ("gemma3", "qwen2", "qwen3"),
        n_layer=n_layer,
        n_embd=E,
        n_head=n_head,
        n_head_kv=n_head_kv,
        head_dim=HD,
        n_rot=n_rot,
        n_ff=F,
        n_vocab=V,
        norm_eps=norm_eps,
        emb_scale=math.sqrt(E) if gemma else 1.0,
        attn_scale=1.0 / math.sqrt(HD),
        tok_embd=ts.req("token_embd.weight", (E, V)),
        output_norm=ts.req("output_norm.weight", (E,), f32=True),
        output=ts.get("output.weight", (E, V), required=False),
        layers=layers,
    )
    return hp, desc

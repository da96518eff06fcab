"""The model description the engine runs: tensors as views into the mapped file, dimensions and per-layer
settings. Plain data (no C import), filled by the model wiring and handed to the engine binding, which
maps the names of the forward pass's architecture and activation to the C enums (engine.ARCHS, ACTS)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

# The ranges of the C types the description is handed over in (int32_t and float fields).
from edgellama.gguf.limits import FLOAT32_MAX, INT32_MAX, INT32_MIN


@dataclass
class TensorRef:
    """A tensor as the engine sees it: raw bytes (a view into the mapped file), type and 2-D shape."""

    data: npt.NDArray[np.uint8]
    ggml_type: int
    ne0: int
    ne1: int = 1


# The per-layer tensors, named as the fields of LayerDesc and of the C struct el_layer.
LAYER_TENSORS = ("attn_norm", "wq", "wk", "wv", "wo", "bq", "bk", "bv", "q_norm", "k_norm",
                 "attn_post_norm", "ffn_norm", "w_gate", "w_up", "w_down", "ffn_post_norm", "rope_freqs",
                 "bo", "b_up", "b_down", "attn_norm_b", "ffn_norm_b")
# BERT's input tensors, named as the fields of ModelDesc and of the C struct el_model_desc.
INPUT_TENSORS = ("type_embd", "pos_embd", "tok_norm", "tok_norm_b")


@dataclass
class LayerDesc:
    attn_norm: TensorRef
    wq: TensorRef
    wk: TensorRef
    wv: TensorRef
    wo: TensorRef
    ffn_norm: TensorRef
    w_gate: TensorRef | None  # None: an FFN without a gate (BERT)
    w_up: TensorRef
    w_down: TensorRef
    bq: TensorRef | None = None
    bk: TensorRef | None = None
    bv: TensorRef | None = None
    q_norm: TensorRef | None = None
    k_norm: TensorRef | None = None
    attn_post_norm: TensorRef | None = None
    ffn_post_norm: TensorRef | None = None
    rope_freqs: TensorRef | None = None  # F32 divisors of the n_rot/2 rotation frequencies
    bo: TensorRef | None = None  # biases of wo, w_up, w_down (BERT)
    b_up: TensorRef | None = None
    b_down: TensorRef | None = None
    attn_norm_b: TensorRef | None = None  # BERT: attn_norm and ffn_norm are post-norm LayerNorms with biases
    ffn_norm_b: TensorRef | None = None
    rope_base: float = 10000.0
    rope_scale: float = 1.0
    window: int = 0
    no_rope: bool = False  # queries and keys of this layer are not rotated


@dataclass
class RopeExt:
    """YaRN (ext_factor 1) and the rotation's magnitude factor (LongRoPE's attention factor): the C
    struct el_rope_ext."""

    ext_factor: float = 0.0
    attn_factor: float = 1.0
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    n_ctx_orig: int = 0


@dataclass
class ModelDesc:
    arch: str  # the forward pass: "llama", "gemma3" or "bert" (enum el_arch)
    act: str  # the FFN activation: "silu" or "gelu" (enum el_act)
    rope_neox: bool
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_rot: int
    n_ff: int
    n_vocab: int
    norm_eps: float
    emb_scale: float
    attn_scale: float
    tok_embd: TensorRef
    output_norm: TensorRef | None  # None only for "bert" (no output head)
    output: TensorRef | None
    layers: list[LayerDesc] = field(default_factory=list)
    attn_softcap: float = 0.0  # cap * tanh(score / cap) of every attention score; 0: none
    final_softcap: float = 0.0  # the same on the logits
    scale_q: bool = False  # attn_scale multiplies Q after RoPE (llama.cpp's phi3 and Gemma graphs), not the scores
    rope: RopeExt = field(default_factory=RopeExt)
    type_embd: TensorRef | None = None  # BERT's input: row 0 added to every token
    pos_embd: TensorRef | None = None  # absolute position embeddings
    tok_norm: TensorRef | None = None  # the LayerNorm of the input
    tok_norm_b: TensorRef | None = None
    non_causal: bool = False  # every token sees its whole sequence (BERT)


def c_int32(what: str, value: int) -> int:
    """value, refused with a ValueError naming it unless it fits a C int32_t."""
    if not INT32_MIN <= value <= INT32_MAX:
        raise ValueError(f"{what} = {value} does not fit a 32-bit integer")
    return int(value)


def c_float(what: str, value: float) -> float:
    """value, refused unless it is a finite number that fits a C float."""
    if not (math.isfinite(value) and abs(value) <= FLOAT32_MAX):
        raise ValueError(f"{what} = {value} is not a finite 32-bit float")
    return float(value)


_DESC_INTS = ("n_layer", "n_embd", "n_head", "n_head_kv", "head_dim", "n_rot", "n_ff", "n_vocab")
_DESC_FLOATS = ("norm_eps", "emb_scale", "attn_scale", "attn_softcap", "final_softcap")


def check_c_ranges(desc: ModelDesc) -> None:
    """Every number of desc fits the C field it is copied into (the wiring refuses bad metadata with
    the key's name first; this is the last check before C, for descriptions built by other code)."""
    for name in _DESC_INTS:
        c_int32(f"model {name}", getattr(desc, name))
    for name in _DESC_FLOATS:
        c_float(f"model {name}", getattr(desc, name))
    for name in ("ext_factor", "attn_factor", "beta_fast", "beta_slow"):
        c_float(f"model rope {name}", getattr(desc.rope, name))
    c_int32("model rope n_ctx_orig", desc.rope.n_ctx_orig)
    if len(desc.layers) != desc.n_layer:
        raise ValueError(f"model has {len(desc.layers)} layer descriptions for n_layer {desc.n_layer}")
    for i, L in enumerate(desc.layers):
        c_float(f"layer {i} rope_base", L.rope_base)
        c_float(f"layer {i} rope_scale", L.rope_scale)
        c_int32(f"layer {i} window", L.window)

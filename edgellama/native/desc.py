"""The model description the engine runs: tensors as views into the mapped file, dimensions and per-layer
settings. Plain data (no C import), filled by the model wiring and handed to the engine binding."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

ARCH_LLAMA = 1
ARCH_GEMMA3 = 2
ACT_SILU = 0
ACT_GELU = 1


@dataclass
class TensorRef:
    """A tensor as the engine sees it: raw bytes (a view into the mapped file), type and 2-D shape."""

    data: npt.NDArray[np.uint8]
    ggml_type: int
    ne0: int
    ne1: int = 1


# The per-layer tensors, named as the fields of LayerDesc and of the C struct el_layer.
LAYER_TENSORS = ("attn_norm", "wq", "wk", "wv", "wo", "bq", "bk", "bv", "q_norm", "k_norm",
                 "attn_post_norm", "ffn_norm", "w_gate", "w_up", "w_down", "ffn_post_norm")


@dataclass
class LayerDesc:
    attn_norm: TensorRef
    wq: TensorRef
    wk: TensorRef
    wv: TensorRef
    wo: TensorRef
    ffn_norm: TensorRef
    w_gate: TensorRef
    w_up: TensorRef
    w_down: TensorRef
    bq: TensorRef | None = None
    bk: TensorRef | None = None
    bv: TensorRef | None = None
    q_norm: TensorRef | None = None
    k_norm: TensorRef | None = None
    attn_post_norm: TensorRef | None = None
    ffn_post_norm: TensorRef | None = None
    rope_base: float = 10000.0
    rope_scale: float = 1.0
    window: int = 0


@dataclass
class ModelDesc:
    arch: int
    act: int
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
    output_norm: TensorRef
    output: TensorRef | None
    layers: list[LayerDesc] = field(default_factory=list)

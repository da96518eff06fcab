"""LoRA adapters on an Engine: which C weight slot a base tensor name is, and the checks before C.

The adapter itself (edgellama.lora.adapter: read, validated against the base model) is plain data: per
base tensor name A [rank, n_in] and B [n_out, rank] (float32, or float16 kept as halves), and the factor
alpha / rank. The engine reads B transposed, [rank, n_out]; the reader's B is a view of such an array.
This module hands those arrays to the engine (el_model_lora_attach_typed), which keeps them alive as
long as it uses them.
"""

from __future__ import annotations

import re
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from edgellama.native.lib import lib

# the per-layer matrices an adapter may change, by their GGUF names, as enum el_lora_target
LAYER_TARGETS = {
    "attn_q": int(lib.EL_LORA_WQ), "attn_k": int(lib.EL_LORA_WK), "attn_v": int(lib.EL_LORA_WV),
    "attn_output": int(lib.EL_LORA_WO), "ffn_gate": int(lib.EL_LORA_W_GATE), "ffn_up": int(lib.EL_LORA_W_UP),
    "ffn_down": int(lib.EL_LORA_W_DOWN),
}
# the same matrices as fields of edgellama.native.desc.LayerDesc
LAYER_FIELDS = {"attn_q": "wq", "attn_k": "wk", "attn_v": "wv", "attn_output": "wo", "ffn_gate": "w_gate",
                "ffn_up": "w_up", "ffn_down": "w_down"}
OUTPUT = int(lib.EL_LORA_OUTPUT)
MAX_ADAPTERS = int(lib.EL_MAX_LORA)
MAX_RANK = int(lib.EL_MAX_LORA_RANK)
_LAYER_NAME = re.compile(r"blk\.(\d+)\.([a-z_]+)\.weight")


class LoraWeightLike(Protocol):
    a: npt.NDArray[np.floating[Any]]
    b: npt.NDArray[np.floating[Any]]


class LoraAdapterLike(Protocol):
    """edgellama.lora.adapter.LoraAdapter's fields the engine reads."""

    name: str
    weights: dict[str, Any]

    def scale_of(self, base_name: str, user_scale: float) -> float: ...


def target_of(name: str, n_layer: int) -> tuple[int, int]:
    """(layer, el_lora_target) of a base tensor name; ValueError for a tensor the engine cannot adapt."""
    if name == "output.weight":
        return 0, OUTPUT
    m = _LAYER_NAME.fullmatch(name)
    if m and m.group(2) in LAYER_TARGETS and int(m.group(1)) < n_layer:
        return int(m.group(1)), LAYER_TARGETS[m.group(2)]
    raise ValueError(f"a LoRA adapter for {name!r}: adapters apply to the attention (attn_q/k/v/output) and FFN "
                     f"(ffn_gate/up/down) matrices of layers 0..{n_layer - 1} and to output.weight")


def max_rank(adapters: list[Any]) -> int:
    """The largest rank among the adapters' weights (0 without any): what the engine's scratch holds."""
    return max((int(w.a.shape[0]) for ad in adapters for w in ad.weights.values()), default=0)


def adapter_bytes(adapters: list[Any]) -> int:
    """Bytes of the adapters' arrays (the memory plan counts them: they are not file-backed)."""
    return sum(int(w.a.nbytes) + int(w.b.nbytes) for ad in adapters for w in ad.weights.values())


def scratch_bytes(n_batch: int, rank: int) -> int:
    """Scratch the engine allocates for terms up to rank (el_model_lora_bytes); 0 without adapters."""
    if rank <= 0:
        return 0
    if rank > MAX_RANK:
        raise ValueError(f"a LoRA rank of {rank} is more than this engine applies ({MAX_RANK})")
    return int(lib.el_model_lora_bytes(int(n_batch), int(rank)))


def term_matrix(what: str, x: Any, shape: tuple[int, int]) -> tuple[npt.NDArray[np.floating[Any]], int]:
    """x as a C-contiguous matrix of exactly shape and its EL_TYPE (ValueError naming what otherwise):
    float16 stays float16 (EL_TYPE_F16, half the bytes the engine reads per pass), the rest float32."""
    half = isinstance(x, np.ndarray) and x.dtype == np.float16
    arr: npt.NDArray[np.floating[Any]] = np.ascontiguousarray(x, dtype=np.float16 if half else np.float32)
    if arr.shape != shape:
        raise ValueError(f"{what} has shape {arr.shape}, expected {shape}")
    if not np.isfinite(arr).all():
        raise ValueError(f"{what} holds a value that is not finite")
    return arr, int(lib.EL_TYPE_F16 if half else lib.EL_TYPE_F32)

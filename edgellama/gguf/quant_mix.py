"""Which ggml type each tensor gets when a model is quantized to one of llama.cpp's file types
(`Q4_K_M`, `Q8_0`, ...): the rules of llama.cpp's llama-quant.cpp (no importance matrix), restated.

Only the file types whose tensor types edgellama's kernels compute on are offered (no IQ types). Not
reproduced: the bump llama.cpp gives attn_v of a model it classifies as 70B (it knows the size class
from its own tables; no model a board runs is one).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from edgellama.gguf.ggml_types import TYPE_SIZES
from edgellama.gguf.ggml_types import GGMLType as T

QUANTIZATION_VERSION = 2  # GGML_QNT_VERSION: the block layouts written

# name -> (llama_ftype number stored as general.file_type, default tensor type)
FILE_TYPES: dict[str, tuple[int, T]] = {
    "F32": (0, T.F32), "F16": (1, T.F16), "BF16": (32, T.BF16),
    "Q4_0": (2, T.Q4_0), "Q4_1": (3, T.Q4_1), "Q8_0": (7, T.Q8_0), "Q5_0": (8, T.Q5_0), "Q5_1": (9, T.Q5_1),
    "Q2_K": (10, T.Q2_K), "Q3_K_S": (11, T.Q3_K), "Q3_K_M": (12, T.Q3_K), "Q3_K_L": (13, T.Q3_K),
    "Q4_K_S": (14, T.Q4_K), "Q4_K_M": (15, T.Q4_K), "Q5_K_S": (16, T.Q5_K), "Q5_K_M": (17, T.Q5_K),
    "Q6_K": (18, T.Q6_K),
}
# llama-quantize's aliases: Q3_K = Q3_K_M, Q4_K = Q4_K_M, Q5_K = Q5_K_M
ALIASES = {"Q3_K": "Q3_K_M", "Q4_K": "Q4_K_M", "Q5_K": "Q5_K_M"}
QUANTIZED = {T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.Q2_K, T.Q3_K, T.Q4_K, T.Q5_K, T.Q6_K}
# the fallback of a 256-block type for a row length it does not divide
_FALLBACK = {T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0, T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}
_NO_QUANT_PARTS = (
    "_norm.weight", "ffn_gate_inp.weight", "ffn_gate_tid2eid.weight", "altup", "laurel", "per_layer_model_proj",
    "ssm_conv1d", "shortconv.conv.weight", "indexer.k_proj.weight", "indexer.q_proj.weight",
    "time_mix_first.weight", "time_mix_w0.weight", "time_mix_w1.weight", "time_mix_w2.weight",
    "time_mix_v0.weight", "time_mix_v1.weight", "time_mix_v2.weight", "time_mix_a0.weight",
    "time_mix_a1.weight", "time_mix_a2.weight", "time_mix_g1.weight", "time_mix_g2.weight",
    "time_mix_decay_w1.weight", "time_mix_decay_w2.weight", "time_mix_lerp_fused.weight", "attn_rel_b.weight",
    ".position_embd", "sam.pos_embd", "sam.neck.", "sam.net_", ".rel_pos", ".patch_embd", ".patch_merger",
    "a.rvq.codebook", "mm.a.code_embd",
)
_LAYER = re.compile(r"^blk\.(\d+)\.")


def file_type(name: str) -> tuple[str, int, T]:
    """A llama-quantize type name -> (canonical name, general.file_type, default tensor type)."""
    key = ALIASES.get(name.upper(), name.upper())
    if key not in FILE_TYPES:
        raise ValueError(f"unknown quantization type {name!r}; choose one of {', '.join(FILE_TYPES)}")
    return (key, *FILE_TYPES[key])


def tensor_type(name: str) -> T:
    """A tensor type name for --output-tensor-type / --token-embedding-type."""
    try:
        t = T[name.upper()]
    except KeyError:
        raise ValueError(f"unknown tensor type {name!r}") from None
    if t not in QUANTIZED | {T.F32, T.F16, T.BF16}:
        raise ValueError(f"tensor type {name!r} is not one edgellama computes on")
    return t


def llama_order(names: list[str]) -> list[str]:
    """The order llama.cpp's loader keeps tensors in, and so writes them: tensors outside the blocks
    first, then block by block; by name inside each."""
    def key(n: str) -> tuple[int, str]:
        m = _LAYER.match(n)
        return (int(m[1]) if m else -1, n)
    return sorted(names, key=key)


def _category(name: str) -> str:
    if name == "output.weight":
        return "output"
    if name in ("token_embd.weight", "per_layer_token_embd.weight"):
        return "token_embd"
    for part, cat in (("attn_qkv.weight", "attn_qkv"), ("attn_kv_b.weight", "attn_kv_b"), ("attn_v.weight", "attn_v"),
                      ("attn_k.weight", "attn_k"), ("attn_q.weight", "attn_q"),
                      ("attn_output.weight", "attn_output"), ("ffn_up", "ffn_up"), ("ffn_gate", "ffn_gate"),
                      ("ffn_down", "ffn_down")):
        if part in name:
            return cat
    return "other"


def _attn_v_like(cat: str) -> bool:
    return cat in ("attn_v", "attn_qkv", "attn_kv_b")


def _more_bits(i: int, n: int) -> bool:
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


@dataclass
class Options:
    pure: bool = False
    quantize_output: bool = True  # False: --leave-output-tensor
    output_type: T | None = None
    token_embedding_type: T | None = None


@dataclass
class MixState:
    """What llama.cpp's quantize state tracks across tensors (its counters advance in tensor order)."""

    arch: str
    n_layer: int
    n_gqa: int
    n_expert: int
    n_attention_wv: int = 0
    tied: bool = True
    i: dict[str, int] = field(default_factory=lambda: {"attn_v": 0, "ffn_down": 0, "ffn_gate": 0, "ffn_up": 0})


def allows_quantization(name: str, n_dims: int, opts: Options) -> bool:
    if n_dims < 2 or not name.endswith("weight"):
        return False
    if any(p in name for p in _NO_QUANT_PARTS):
        return False
    if not opts.quantize_output and name == "output.weight":
        return False
    return name not in ("position_embd.weight", "token_types.weight")


def _layer(st: MixState, counter: str, name: str) -> tuple[int, int]:
    if st.n_expert > 1:
        m = _LAYER.match(name)
        if m is None or not 0 <= int(m[1]) < st.n_layer:
            raise ValueError(f"cannot tell the layer of tensor {name!r}")
        return int(m[1]), st.n_layer
    return st.i[counter], st.n_layer


def _mix_type(st: MixState, t: T, name: str, ncols: int, ft: str, cat: str, opts: Options) -> T:
    """llama_tensor_get_type_impl for the non-IQ file types."""
    falcon = st.arch == "falcon"
    if cat == "output" or (st.tied and cat == "token_embd"):
        if opts.output_type is not None:
            return opts.output_type
        if falcon or ncols % TYPE_SIZES[t].block_size:
            return T.Q8_0
        return t if t == T.Q8_0 else T.Q6_K
    if cat == "token_embd":
        return opts.token_embedding_type if opts.token_embedding_type is not None else t
    if _attn_v_like(cat):
        i = st.i["attn_v"]
        if ft == "Q2_K":
            t = T.Q4_K if st.n_gqa >= 4 else T.Q3_K
        elif ft == "Q3_K_M":
            t = T.Q5_K if i < 2 else T.Q4_K
        elif ft == "Q3_K_L":
            t = T.Q5_K
        elif ft in ("Q4_K_M", "Q5_K_M") and _more_bits(i, st.n_attention_wv):
            t = T.Q6_K
        elif ft == "Q4_K_S" and i < 4:
            t = T.Q5_K
        if st.n_expert == 8:
            t = T.Q8_0
        st.i["attn_v"] += 1
    elif cat == "attn_k":
        if st.n_expert == 8:
            t = T.Q8_0
    elif cat == "ffn_down":
        il, nl = _layer(st, "ffn_down", name)
        if ft == "Q2_K":
            t = T.Q3_K
        elif ft == "Q3_K_M":
            t = T.Q5_K if il < nl // 16 else T.Q4_K if not falcon or _more_bits(il, nl) else T.Q3_K
        elif ft == "Q3_K_L":
            t = T.Q4_K if falcon else T.Q5_K
        elif ft == "Q4_K_M":
            if falcon:
                t = T.Q6_K if il < nl // 16 else T.Q5_K if _more_bits(il, nl) else T.Q4_K
            elif _more_bits(il, nl):
                t = T.Q6_K
        elif ft == "Q5_K_M" and _more_bits(il, nl):
            t = T.Q6_K
        elif ft == "Q4_K_S" and not falcon and il < nl // 8:
            t = T.Q5_K
        st.i["ffn_down"] += 1
    elif cat == "attn_output":
        if not falcon:
            if st.n_expert == 8:
                if ft in ("Q2_K", "Q3_K_S", "Q3_K_M", "Q4_K_S", "Q4_K_M"):
                    t = T.Q5_K
            else:
                t = {"Q2_K": T.Q3_K, "Q3_K_M": T.Q4_K, "Q3_K_L": T.Q5_K}.get(ft, t)
        elif ft == "Q3_K_L":
            t = T.Q4_K
    elif cat == "attn_qkv":  # unreachable (attn_v-like above), as in llama.cpp
        pass
    elif cat in ("ffn_gate", "ffn_up"):
        _layer(st, cat, name)
        st.i[cat] += 1
    return t


def _fallback(t: T, ncols: int) -> tuple[T, bool]:
    if ncols % TYPE_SIZES[t].block_size == 0:
        return t, False
    ft = _FALLBACK.get(t, t)
    if ncols % TYPE_SIZES[ft].block_size:
        ft = T.F16
    return ft, True


@dataclass
class Choice:
    name: str
    src_type: int
    new_type: int
    fallback: bool = False


def choose_types(tensors: list[Any], metadata: dict[str, Any], ft_name: str, opts: Options) -> list[Choice]:
    """The target type of every tensor (in llama.cpp's order, which the caller writes them in).
    tensors: objects with name, shape (GGUF order) and ggml_type."""
    ft, _, default = file_type(ft_name)
    arch = str(metadata.get("general.architecture", ""))

    def hp(key: str, dflt: int) -> int:
        v = metadata.get(f"{arch}.{key}", dflt)
        return int(v[0]) if hasattr(v, "__len__") and not isinstance(v, str) else int(v)

    n_head = hp("attention.head_count", 0)
    n_head_kv = hp("attention.head_count_kv", n_head) or n_head
    st = MixState(arch, hp("block_count", 0), n_head // n_head_kv if n_head_kv else 0, hp("expert_count", 0))
    for t in tensors:
        cat = _category(t.name)
        st.n_attention_wv += _attn_v_like(cat)
        if cat == "output":
            st.tied = False
    out = []
    for t in tensors:
        cat = _category(t.name)
        if not allows_quantization(t.name, len(t.shape), opts):
            out.append(Choice(t.name, t.ggml_type, t.ggml_type))
            continue
        if opts.token_embedding_type is not None and cat == "token_embd":
            out.append(Choice(t.name, t.ggml_type, opts.token_embedding_type))
            continue
        if opts.output_type is not None and cat == "output":
            out.append(Choice(t.name, t.ggml_type, opts.output_type))
            continue
        new: T = default
        fell = False
        if default in QUANTIZED:
            if not opts.pure:
                new = _mix_type(st, new, t.name, t.shape[0], ft, cat, opts)
            new, fell = _fallback(new, t.shape[0])
        out.append(Choice(t.name, t.ggml_type, int(new), fell))
    return out

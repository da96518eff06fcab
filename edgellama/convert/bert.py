"""BERT (BertModel, BertForMaskedLM) to GGUF as llama.cpp's convert_hf_to_gguf.py writes it
(conversion/bert.py BertModel on conversion/base.py TextModel): arch `bert`, its hparams, the WordPiece
vocabulary in phantom-space form, llama.cpp's tensor names, and each tensor's type under an outtype.

The pooler, the masked-LM head (cls.*) and position_ids are dropped, as there; everything else must map
to a llama.cpp name or the conversion stops naming the tensor.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from edgellama.convert.hf_folder import (
    CONTROL,
    ConvertError,
    Vocab,
    find_hparam,
    load_special_vocab,
    load_vocab,
)
from edgellama.convert.safetensors import SafetensorsFile, bf16_to_f32
from edgellama.gguf.ggml_types import GGMLType
from edgellama.gguf.reader import GGUFValueType

ARCHITECTURES = ("BertModel", "BertForMaskedLM")

# HF name -> GGUF name (gguf-py's tensor_mapping.py, the bert entries); {bid} is the layer
_GLOBAL = {
    "embeddings.word_embeddings": "token_embd",
    "embeddings.token_type_embeddings": "token_types",
    "embeddings.position_embeddings": "position_embd",
    "embeddings.LayerNorm": "token_embd_norm",
}
_LAYER = {
    "attention.self.query": "attn_q",
    "attention.self.key": "attn_k",
    "attention.self.value": "attn_v",
    "attention.output.dense": "attn_output",
    "attention.output.LayerNorm": "attn_output_norm",
    "intermediate.dense": "ffn_up",
    "output.dense": "ffn_down",
    "output.LayerNorm": "layer_output_norm",
}
_LAYER_RE = re.compile(r"encoder\.layer\.(\d+)\.(.+)")
# kept F32 whatever the outtype (base.py: llama.cpp's kernels want them so)
_F32_NAMES = ("position_embd.weight", "token_types.weight")

# convert_hf_to_gguf's pre-tokenizer check: the sha256 of str(ids) of this text, as the model's own
# tokenizer encodes it; the WordPiece entries of its table. The hash bert-bge (BAAI/bge-small-en-v1.5)
# shares with jina-v2-en comes later in the table, so the converter writes jina-v2-en for it.
CHKTXT = (
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n🚀 (normal) 😶\u200d🌫️ (multiple emojis concatenated) ✅ "
    "🦙🦙 3 33 333 3333 33333 333333 3333333 33333333 3.3 3..3 3...3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～ "
    "------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!?????? I've been 'told he's there, "
    "'RE you sure? 'M not sure I'll make it, 'D you like some tea? We'Ve a'lL"
)
WPM_PRE = {
    "0876d13b50744004aa9aeae05e7b0647eac9d801b5ba4668afc01e709c15e19f": "jina-v2-en",
    "8e62295832751ca1e8f92f2226f403dea30dc5165e448b5bfa05af5340c64ec7": "bert-bge-large",
}


@dataclass(frozen=True)
class Tensor:
    name: str  # the GGUF name
    src: str  # the HF name
    shape: tuple[int, ...]  # numpy order
    load: Callable[[], npt.NDArray[Any]]  # float16 or float32 values


def gguf_name(hf_name: str) -> str | None:
    """llama.cpp's name for an HF tensor name, None for the tensors BertModel drops."""
    name = hf_name.removeprefix("bert.")
    if name.endswith(".gamma"):
        name = name[:-6] + ".weight"
    elif name.endswith(".beta"):
        name = name[:-5] + ".bias"
    if name in ("embeddings.position_ids", "pooler.dense.weight", "pooler.dense.bias") \
            or name.startswith(("cls.predictions", "cls.seq_relationship")):
        return None
    base, _, suffix = name.rpartition(".")
    if suffix not in ("weight", "bias"):
        raise ConvertError(f"cannot map tensor {hf_name!r} to a llama.cpp name")
    if base in _GLOBAL:
        return f"{_GLOBAL[base]}.{suffix}"
    m = _LAYER_RE.fullmatch(base)
    if m and m.group(2) in _LAYER:
        return f"blk.{int(m.group(1))}.{_LAYER[m.group(2)]}.{suffix}"
    raise ConvertError(f"cannot map tensor {hf_name!r} to a llama.cpp name")


def tensors(files: list[SafetensorsFile]) -> list[Tensor]:
    """The tensors kept, in the converter's order: parts in order, each part's names sorted."""
    out: dict[str, Tensor] = {}
    for f in files:
        for hf in sorted(f.tensors):
            name = gguf_name(hf)
            if name is None:
                continue
            info = f.tensors[hf]
            if info.dtype not in ("F32", "F16", "BF16", "F64"):
                raise ConvertError(f"tensor {hf!r} is {info.dtype}, not a float type")
            out[name] = Tensor(name, hf, info.shape, _loader(f, hf, info.dtype))
    return list(out.values())


def _loader(f: SafetensorsFile, name: str, dtype: str) -> Callable[[], npt.NDArray[Any]]:
    def load() -> npt.NDArray[Any]:
        a = f.array(name)
        if dtype == "BF16":
            return bf16_to_f32(a)
        return a if dtype in ("F32", "F16") else a.astype(np.float32)  # base.py: others go to float32
    return load


def tensor_type(t: Tensor, outtype: int) -> int:
    """The tensor's GGUF type under outtype (GGMLType F32, F16 or Q8_0), by base.py's rules: 1-D
    tensors, norms, biases, position and token-type embeddings stay F32; a Q8_0 tensor whose rows do
    not split into 32-value blocks falls back to F16."""
    if len(t.shape) <= 1 or t.name.endswith("_norm.weight") or t.name in _F32_NAMES or not t.name.endswith(".weight"):
        return GGMLType.F32
    if outtype == GGMLType.Q8_0 and t.shape[-1] % 32:
        return GGMLType.F16
    return outtype


def phantom(tokens: list[str], types: list[int]) -> list[str]:
    """The converter's phantom-space vocabulary: "##x" -> "x", a control token as it is, any other
    token "\u2581" + token (llama.cpp's WordPiece marks a word start with U+2581)."""
    return [t if ty == CONTROL else t[2:] if t.startswith("##") else "\u2581" + t for t, ty in zip(tokens, types)]


def pre_tokenizer(tokens: list[str], vocab: Vocab) -> str:
    """tokenizer.ggml.pre by convert_hf_to_gguf's hash of its check text, tokenized here with
    llama.cpp's WordPiece (edgellama.tokenizers.wpm), [CLS] ... [SEP] as Hugging Face adds them."""
    from edgellama.tokenizers.wpm import wpm_tokenize, wpm_words

    index = {t: i for i, t in reversed(list(enumerate(tokens)))}
    words = wpm_words(CHKTXT, vocab.lowercase, vocab.lowercase)
    ids = [vocab.cls, *wpm_tokenize(words, index, max(len(t) for t in tokens), vocab.unk), vocab.sep]
    digest = hashlib.sha256(str(ids).encode()).hexdigest()
    if digest not in WPM_PRE:
        raise ConvertError(f"the tokenizer's pre-tokenizer hash {digest} is not one llama.cpp's converter knows "
                           f"(known WordPiece ones: {', '.join(sorted(set(WPM_PRE.values())))})")
    return WPM_PRE[digest]


KV = tuple[str, Any, GGUFValueType | None]


def hparams(config: dict[str, Any], n_layer: int, file_type: int, pooling: int | None) -> list[KV]:
    """TextModel.set_gguf_parameters for BERT's config, then BertModel's causal and pooling keys."""
    u32 = GGUFValueType.UINT32
    kv: list[KV] = [("bert.block_count", n_layer, u32)]
    for key, names in (("context_length", ["max_position_embeddings", "n_ctx", "n_positions", "max_length",
                                           "max_sequence_length", "model_max_length"]),
                       ("embedding_length", ["hidden_size", "n_embd", "dim"]),
                       ("feed_forward_length", ["prefix_dense_intermediate_size", "dense_intermediate_size",
                                                "intermediate_size", "n_inner", "hidden_dim"]),
                       ("attention.head_count", ["num_attention_heads", "n_head", "n_heads"]),
                       ("attention.head_count_kv", ["num_key_value_heads", "n_kv_heads"])):
        v = find_hparam(config, names, optional=True)
        if v is not None:
            kv.append((f"bert.{key}", _uint(v, names[0]), u32))
    # BertModel sets causal = False after TextModel; a config's is_causal = false sets it first, and
    # gguf-py keeps a key where it was first added
    causal_first = config.get("is_causal") is False
    if causal_first:
        kv.append(("bert.attention.causal", False, GGUFValueType.BOOL))
    for key, names in (("attention.layer_norm_rms_epsilon", ["rms_norm_eps", "norm_eps"]),
                       ("attention.layer_norm_epsilon", ["layer_norm_eps", "layer_norm_epsilon", "norm_epsilon"])):
        v = find_hparam(config, names, optional=True)
        if v is not None:
            if not isinstance(v, (int, float)) or isinstance(v, bool):
                raise ConvertError(f"config.json {names[0]} = {v!r} is not a number")
            kv.append((f"bert.{key}", float(v), GGUFValueType.FLOAT32))
    if isinstance(config.get("head_dim"), int):
        kv += [("bert.attention.key_length", config["head_dim"], u32),
               ("bert.attention.value_length", config["head_dim"], u32)]
    kv.append(("general.file_type", file_type, u32))
    if not causal_first:
        kv.append(("bert.attention.causal", False, GGUFValueType.BOOL))
    if pooling is not None:
        kv.append(("bert.pooling_type", pooling, u32))
    return kv


def _uint(v: Any, name: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v < 1 << 32:
        raise ConvertError(f"config.json {name} = {v!r} is not a count")
    return v


def tokenizer_keys(folder: Path, config: dict[str, Any]) -> tuple[list[KV], Vocab]:
    """BertModel.set_vocab: token type count, model, pre, tokens, types, then SpecialVocab's keys."""
    vocab = load_vocab(folder, config.get("vocab_size"))
    tokens = phantom(vocab.tokens, vocab.types)
    sv = load_special_vocab(folder, len(tokens))
    u32, b = GGUFValueType.UINT32, GGUFValueType.BOOL
    kv: list[KV] = [
        ("tokenizer.ggml.token_type_count", _uint(config.get("type_vocab_size", 1), "type_vocab_size"), u32),
        ("tokenizer.ggml.model", "bert", None),
        ("tokenizer.ggml.pre", pre_tokenizer(tokens, vocab), None),
        ("tokenizer.ggml.tokens", tokens, None),
        ("tokenizer.ggml.token_type", vocab.types, None),
    ]
    # gguf-py's writer has no cls_token_id any more (SpecialVocab's cls id is dropped with a warning)
    id_keys = {"bos": "bos_token_id", "eos": "eos_token_id", "unk": "unknown_token_id", "sep": "seperator_token_id",
               "pad": "padding_token_id", "mask": "mask_token_id", "eot": "eot_token_id", "eom": "eom_token_id"}
    kv += [(f"tokenizer.ggml.{id_keys[typ]}", tid, u32) for typ, tid in sv.ids.items() if typ in id_keys]
    kv += [(f"tokenizer.ggml.add_{typ}_token", v, b) for typ, v in sv.add.items() if typ in ("bos", "eos", "sep")]
    if sv.lowercase is not None:
        kv.append(("tokenizer.ggml.normalizer.lowercase", bool(sv.lowercase), b))
    if sv.strip_accents is not None:
        kv.append(("tokenizer.ggml.normalizer.strip_accents", bool(sv.strip_accents), b))
    return kv, vocab


def check_architecture(config: dict[str, Any]) -> None:
    archs = config.get("architectures")
    if not isinstance(archs, list) or not archs:
        raise ConvertError("config.json names no architectures")
    if archs[0] not in ARCHITECTURES:
        raise ConvertError(f"architecture {archs[0]} is not converted here (this converter does: "
                           f"{', '.join(ARCHITECTURES)})")


"""Typed access to the GGUF metadata keys the model loader reads: each key is declared once, with the
GGUF type(s) it may have, its range and whether it must be finite; anything else is refused with a
MetadataError naming the key, the type (or value) found and what was expected.

Holds no model logic: what a value means (defaults per architecture, cross-checks between keys and
tensors) is the wiring's and the tokenizer's job. Messages show file-provided text through repr().
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from edgellama.gguf.limits import FLOAT32_MAX, INT32_MAX
from edgellama.gguf.reader import GGUFValueType, ValueTypes

if TYPE_CHECKING:
    from edgellama.gguf.split import ModelFile

V = GGUFValueType
INT_TYPES = frozenset({V.UINT8, V.INT8, V.UINT16, V.INT16, V.UINT32, V.INT32, V.UINT64, V.INT64})
FLOAT_TYPES = frozenset({V.FLOAT32, V.FLOAT64})


class ModelError(ValueError):
    """The GGUF file does not describe a model this engine can run."""


class MetadataError(ModelError):
    """A metadata key has the wrong type, a value out of its range, or is missing."""


class Kind(Enum):
    """What a key holds, and the GGUF types accepted for it."""

    INT = "an integer"
    FLOAT = "a float"
    BOOL = "BOOL"
    STR = "STRING"
    STR_ARRAY = "an ARRAY of STRING"
    INT_ARRAY = "an ARRAY of integers"
    FLOAT_ARRAY = "an ARRAY of FLOAT32/FLOAT64"


def _accepts(kind: Kind, types: ValueTypes) -> bool:
    if kind is Kind.INT:
        return len(types) == 1 and types[0] in INT_TYPES
    if kind is Kind.FLOAT:  # an integer-typed float key is exact as a float; harmless to accept
        return len(types) == 1 and (types[0] in FLOAT_TYPES or types[0] in INT_TYPES)
    if kind is Kind.BOOL:
        return types == (V.BOOL,)
    if kind is Kind.STR:
        return types == (V.STRING,)
    if len(types) != 2 or types[0] != V.ARRAY:  # nested arrays are never what the loader wants
        return False
    elem = types[1]
    if kind is Kind.STR_ARRAY:
        return elem == V.STRING
    if kind is Kind.INT_ARRAY:
        return elem in INT_TYPES
    return elem in FLOAT_TYPES


@dataclass(frozen=True)
class Key:
    """One metadata key: its name ("{arch}" stands for general.architecture), kind and range.

    lo/hi bound numbers (scalars, or every element of a numeric array) and the length of arrays;
    lo_open makes lo exclusive (a float that must be > 0). Floats must be finite unless finite=False.
    """

    name: str
    kind: Kind
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False
    finite: bool = True

    def resolve(self, arch: str) -> str:
        return self.name.replace("{arch}", arch)


# ---- every key the loader reads --------------------------------------------------------------------
# Integers handed to C int32_t fields are bounded by INT32_MAX here; floats handed to C float fields by
# FLOAT32_MAX. Array lengths are checked against each other and the tensors by the tokenizer/wiring.

ARCHITECTURE = Key("general.architecture", Kind.STR)
BLOCK_COUNT = Key("{arch}.block_count", Kind.INT, 1, INT32_MAX)
EMBEDDING_LENGTH = Key("{arch}.embedding_length", Kind.INT, 1, INT32_MAX)
FEED_FORWARD_LENGTH = Key("{arch}.feed_forward_length", Kind.INT, 1, INT32_MAX)
CONTEXT_LENGTH = Key("{arch}.context_length", Kind.INT, 1, INT32_MAX)
VOCAB_SIZE = Key("{arch}.vocab_size", Kind.INT, 1, INT32_MAX)
HEAD_COUNT = Key("{arch}.attention.head_count", Kind.INT, 1, INT32_MAX)
HEAD_COUNT_KV = Key("{arch}.attention.head_count_kv", Kind.INT, 1, INT32_MAX)
KEY_LENGTH = Key("{arch}.attention.key_length", Kind.INT, 1, INT32_MAX)
VALUE_LENGTH = Key("{arch}.attention.value_length", Kind.INT, 1, INT32_MAX)
RMS_EPSILON = Key("{arch}.attention.layer_norm_rms_epsilon", Kind.FLOAT, 0.0, 1.0, lo_open=True)
LAYERNORM_EPSILON = Key("{arch}.attention.layer_norm_epsilon", Kind.FLOAT, 0.0, 1.0, lo_open=True)
SLIDING_WINDOW = Key("{arch}.attention.sliding_window", Kind.INT, 0, INT32_MAX)
SLIDING_WINDOW_PATTERN = Key("{arch}.attention.sliding_window_pattern", Kind.INT, 0, INT32_MAX)
ROPE_DIMENSION_COUNT = Key("{arch}.rope.dimension_count", Kind.INT, 1, INT32_MAX)
ROPE_FREQ_BASE = Key("{arch}.rope.freq_base", Kind.FLOAT, 0.0, FLOAT32_MAX, lo_open=True)
ROPE_SCALING_TYPE = Key("{arch}.rope.scaling.type", Kind.STR)
# 0 means "not set" (as llama.cpp reads it); the scale handed to C is 1/factor, so factor >= 1/FLOAT32_MAX
ROPE_SCALING_FACTOR = Key("{arch}.rope.scaling.factor", Kind.FLOAT, 0.0, FLOAT32_MAX)
ROPE_SCALE_LINEAR = Key("{arch}.rope.scale_linear", Kind.FLOAT, 0.0, FLOAT32_MAX)  # the factor's older name
ROPE_SCALING_ORIG_CTX = Key("{arch}.rope.scaling.original_context_length", Kind.INT, 1, INT32_MAX)
ROPE_SCALING_ATTN_FACTOR = Key("{arch}.rope.scaling.attn_factor", Kind.FLOAT, 0.0, 1e6, lo_open=True)
ROPE_FREQ_BASE_SWA = Key("{arch}.rope.freq_base_swa", Kind.FLOAT, 0.0, FLOAT32_MAX, lo_open=True)
ATTN_SOFTCAP = Key("{arch}.attn_logit_softcapping", Kind.FLOAT, 0.0, 1e30, lo_open=True)
EXPERT_COUNT = Key("{arch}.expert_count", Kind.INT, 0, INT32_MAX)
ATTENTION_CAUSAL = Key("{arch}.attention.causal", Kind.BOOL)
POOLING_TYPE = Key("{arch}.pooling_type", Kind.INT, -1, INT32_MAX)
CLASSIFIER_LABELS = Key("{arch}.classifier.output_labels", Kind.STR_ARRAY, 1, 1 << 16)
FINAL_SOFTCAP = Key("{arch}.final_logit_softcapping", Kind.FLOAT, 0.0, 1e30, lo_open=True)

TOKENIZER_MODEL = Key("tokenizer.ggml.model", Kind.STR)
TOKENIZER_PRE = Key("tokenizer.ggml.pre", Kind.STR)
TOKENS = Key("tokenizer.ggml.tokens", Kind.STR_ARRAY, 1, INT32_MAX)  # token ids are int32 in C
TOKEN_TYPE = Key("tokenizer.ggml.token_type", Kind.INT_ARRAY)
SCORES = Key("tokenizer.ggml.scores", Kind.FLOAT_ARRAY, finite=False)  # -inf marks unusable pieces
MERGES = Key("tokenizer.ggml.merges", Kind.STR_ARRAY)
# Token ids: an id outside the vocabulary falls back to the default, as llama.cpp does.
BOS_ID = Key("tokenizer.ggml.bos_token_id", Kind.INT)
EOS_ID = Key("tokenizer.ggml.eos_token_id", Kind.INT)
UNK_ID = Key("tokenizer.ggml.unknown_token_id", Kind.INT)
EOT_ID = Key("tokenizer.ggml.eot_token_id", Kind.INT)
EOM_ID = Key("tokenizer.ggml.eom_token_id", Kind.INT)
FIM_PAD_ID = Key("tokenizer.ggml.fim_pad_token_id", Kind.INT)
FIM_REP_ID = Key("tokenizer.ggml.fim_rep_token_id", Kind.INT)
FIM_SEP_ID = Key("tokenizer.ggml.fim_sep_token_id", Kind.INT)
ADD_BOS = Key("tokenizer.ggml.add_bos_token", Kind.BOOL)
ADD_EOS = Key("tokenizer.ggml.add_eos_token", Kind.BOOL)
ADD_SPACE_PREFIX = Key("tokenizer.ggml.add_space_prefix", Kind.BOOL)
# WordPiece (BERT): the separator ([SEP]) llama.cpp appends with add_special (its key's spelling), and
# the BertNormalizer switches (llama.cpp: lowercase true; strip_accents as lowercase unless stored)
SEP_ID = Key("tokenizer.ggml.seperator_token_id", Kind.INT)
ADD_SEP = Key("tokenizer.ggml.add_sep_token", Kind.BOOL)
NORMALIZER_LOWERCASE = Key("tokenizer.ggml.normalizer.lowercase", Kind.BOOL)
NORMALIZER_STRIP_ACCENTS = Key("tokenizer.ggml.normalizer.strip_accents", Kind.BOOL)
CHAT_TEMPLATE = Key("tokenizer.chat_template", Kind.STR)

KEYS = tuple(v for v in list(globals().values()) if isinstance(v, Key))


# ---- the accessor ----------------------------------------------------------------------------------


def _describe(types: ValueTypes) -> str:
    if types[0] != V.ARRAY:
        return types[0].name
    return "an ARRAY of " + (_describe(types[1:]) if len(types) > 1 else "?")


def _infer(value: Any) -> ValueTypes:
    """GGUF types of a value from a plain dict (other readers, tests): what it would be written as."""
    if isinstance(value, (bool, np.bool_)):
        return (V.BOOL,)
    if isinstance(value, (int, np.integer)):
        return (V.INT64,)
    if isinstance(value, (float, np.floating)):
        return (V.FLOAT64,)
    if isinstance(value, (str, bytes)):
        return (V.STRING,)
    if isinstance(value, np.ndarray):
        if value.dtype.kind in "iu":
            return (V.ARRAY, V.INT64)
        if value.dtype.kind == "f":
            return (V.ARRAY, V.FLOAT64)
        if value.dtype.kind == "b":
            return (V.ARRAY, V.BOOL)
        return (V.ARRAY, V.STRING)
    if isinstance(value, (list, tuple)):
        if not value:
            return (V.ARRAY, V.INT32)  # llama.cpp's element type of an empty array
        return (V.ARRAY, *_infer(value[0]))
    raise MetadataError(f"metadata value {value!r} has no GGUF type")


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()


def _num(x: float) -> str:
    if x == INT32_MAX:
        return "2^31-1"
    if x == FLOAT32_MAX:
        return "FLT_MAX"
    return str(int(x)) if float(x).is_integer() else str(x)


class Metadata:
    """The metadata of one file, read through Key declarations only.

    types maps each key to its GGUF types (GGUFFile.metadata_types); without it (a plain dict from
    another reader) the types are inferred from the Python values.
    """

    def __init__(self, values: Mapping[str, Any], types: Mapping[str, ValueTypes] | None = None,
                 arch: str = "") -> None:
        self.values = values
        self.types = types
        self.arch = arch

    @classmethod
    def of(cls, f: ModelFile) -> Metadata:
        return cls(f.metadata, f.metadata_types)

    def with_arch(self, arch: str) -> Metadata:
        return Metadata(self.values, self.types, arch)

    def __contains__(self, key: Key) -> bool:
        return key.resolve(self.arch) in self.values

    def _types(self, name: str) -> ValueTypes:
        if self.types is not None and name in self.types:
            return self.types[name]
        return _infer(self.values[name])

    def get(self, key: Key, default: Any = REQUIRED) -> Any:
        """The checked value of key (int, float, bool, str, list[str] or a numpy array), or default
        when the key is absent (no default: the key is required)."""
        name = key.resolve(self.arch)
        if name not in self.values:
            if default is REQUIRED:
                raise MetadataError(f"metadata key {name} is missing")
            return default
        types = self._types(name)
        if not _accepts(key.kind, types):
            raise MetadataError(f"metadata key {name} has type {_describe(types)}, expected {key.kind.value}")
        return self._check(key, name, self.values[name])

    def optional(self, key: Key) -> Any:
        """The checked value of key, or None when it is absent."""
        return self.get(key, None)

    def _check(self, key: Key, name: str, v: Any) -> Any:
        if key.kind is Kind.INT:
            iv = int(v)
            self._range(key, name, iv)
            return iv
        if key.kind is Kind.FLOAT:
            fv = float(v)
            if key.finite and not math.isfinite(fv):
                raise MetadataError(f"metadata key {name} = {fv} is not a finite number")
            self._range(key, name, fv)
            return fv
        if key.kind is Kind.BOOL:
            return bool(v)
        if key.kind is Kind.STR:
            return v.decode("utf-8", "replace") if isinstance(v, bytes) else str(v)
        n = len(v)
        if (key.lo is not None and n < key.lo) or (key.hi is not None and n > key.hi):
            lo = _num(key.lo) if key.lo is not None else "0"
            hi = _num(key.hi) if key.hi is not None else "any"
            raise MetadataError(f"metadata key {name} has {n} elements, expected {lo}..{hi}")
        if key.kind is Kind.STR_ARRAY:
            return [s.decode("utf-8", "replace") if isinstance(s, bytes) else str(s) for s in v]
        arr: npt.NDArray[Any] = np.asarray(v)
        if key.kind is Kind.INT_ARRAY:
            if arr.dtype == np.uint64:  # beyond int64 is as invalid as INT64_MAX for every use here
                arr = np.minimum(arr, np.uint64(np.iinfo(np.int64).max))
            return arr.astype(np.int64, copy=False)
        farr = arr.astype(np.float64, copy=False)
        if key.finite and n and not bool(np.isfinite(farr).all()):
            bad = int(np.argmin(np.isfinite(farr)))
            raise MetadataError(f"metadata key {name}[{bad}] = {farr[bad]} is not a finite number")
        return farr

    @staticmethod
    def _range(key: Key, name: str, v: float) -> None:
        below = key.lo is not None and (v <= key.lo if key.lo_open else v < key.lo)
        above = key.hi is not None and v > key.hi
        if below or above:
            lo = "any" if key.lo is None else _num(key.lo)
            hi = "any" if key.hi is None else _num(key.hi)
            lo_text = f"> {lo}" if key.lo_open else f"{lo}.."
            want = f"{lo_text} and <= {hi}" if key.lo_open else f"{lo_text}{hi}"
            raise MetadataError(f"metadata key {name} = {v} is out of range (expected {want})")

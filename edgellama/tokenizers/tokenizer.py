"""Tokenizers built from GGUF `tokenizer.*` metadata, giving the token ids llama.cpp gives.

Covers SentencePiece-style (`llama`), GPT-2 byte-level BPE (`gpt2`) and WordPiece (`bert`, wpm.py)
vocabularies: special-token splitting, encoding, detokenization and streaming detokenization; any other
`tokenizer.ggml.model`, or a `tokenizer.ggml.pre` pretokenize.py does not have, is refused with
UnsupportedTokenizer naming it.
Reads no files itself (the GGUF reader hands over the metadata dict) and knows nothing of models or
sampling.

llama.cpp's src/llama-vocab.cpp is the specification; the rules kept from it, by where they apply:
- token attributes come from `tokenizer.ggml.token_type`, then tokens llama.cpp recognises by text
  (end-of-turn and FIM markers) are forced to CONTROL and control tokens named "unused" get UNUSED;
- before the model tokenizer runs, special tokens are cut out of the text, longest first
  (tokenizer_st_partition): USER_DEFINED always, CONTROL and UNKNOWN only with parse_special;
- SPM: spaces become U+2581, a space is prefixed to a fragment that starts the text or follows a
  special token when add_space_prefix (llama.cpp's default true; Gemma 3 files store false);
- BPE: pre-tokenizer split (pretokenize.py), byte-level encoding, merges by rank;
- WPM: BERT's normalizer and words, longest pieces first (wpm.py); [SEP] after the text with add_special;
- BOS/EOS are added per add_bos_token/add_eos_token when add_special is true.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from edgellama.gguf import metadata as K
from edgellama.gguf.metadata import Metadata, MetadataError, ModelError
from edgellama.tokenizers.bpe import BPEMerger, byte_decode, parse_merges
from edgellama.tokenizers.pretokenize import PRE_TOKENIZERS, PreTokenizer
from edgellama.tokenizers.spm import spm_tokenize
from edgellama.tokenizers.wpm import WORD_START, wpm_tokenize, wpm_words

# llama_token_type values stored in GGUF, and llama_token_attr bits llama.cpp derives from them
TYPE_UNDEFINED, TYPE_NORMAL, TYPE_UNKNOWN, TYPE_CONTROL, TYPE_USER_DEFINED, TYPE_UNUSED, TYPE_BYTE = range(7)
ATTR_UNKNOWN = 1 << 0
ATTR_UNUSED = 1 << 1
ATTR_NORMAL = 1 << 2
ATTR_CONTROL = 1 << 3
ATTR_USER_DEFINED = 1 << 4
ATTR_BYTE = 1 << 5
_TYPE_TO_ATTR = np.array(
    [0, ATTR_NORMAL, ATTR_UNKNOWN, ATTR_CONTROL, ATTR_USER_DEFINED, ATTR_UNUSED, ATTR_BYTE, 0]
)

SPACE_ESCAPE = "\u2581"  # SentencePiece's visible space

# Texts llama.cpp treats as end of generation whatever their stored type (special_eog_ids).
EOG_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<\uff5cend\u2581of\u2581sentence\uff5c>", "[e~[",
)  # fmt: skip
# End-of-turn candidates when tokenizer.ggml.eot_token_id is absent, and FIM tokens that end
# generation; llama.cpp forces all of these to CONTROL.
EOT_TEXTS = (
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>",
    "_<EOT>", "[EOT]", "<\uff5cend\u2581of\u2581sentence\uff5c>", "<end_of_utterance>",
)  # fmt: skip
EOM_TEXTS = ("<|eom_id|>",)
FIM_PAD_TEXTS = ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]")
FIM_REP_TEXTS = ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>")
FIM_SEP_TEXTS = ("<|file_sep|>",)
# gpt-oss channel markers llama.cpp always renders (forced to USER_DEFINED)
ALWAYS_RENDERED = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>")


_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")

# tokenizer.ggml.model values llama.cpp knows and edgellama does not, with what each one is
UNSUPPORTED_MODELS = {
    "t5": "T5 SentencePiece Unigram",
    "gemma4": "Gemma 4 BPE over SentencePiece pieces",
    "rwkv": "RWKV greedy matching",
    "plamo2": "PLaMo-2",
    "no_vocab": "no vocabulary",
    "none": "no vocabulary",
}


class UnsupportedTokenizer(ModelError):
    """The file asks for a tokenizer (tokenizer.ggml.model or tokenizer.ggml.pre) edgellama does not have."""


def _as_metadata(md: Mapping[str, Any] | Metadata) -> Metadata:
    return md if isinstance(md, Metadata) else Metadata(md)


class Tokenizer:
    """Common part: vocabulary, attributes, special tokens, special-token splitting, detokenization."""

    vocab_type = ""  # "spm" or "bpe"

    def __init__(self, md: Metadata, *, default_bos: int | None, default_eos: int | None,
                 default_add_bos: bool, default_add_space_prefix: bool, n_rows: int | None = None) -> None:  # fmt: skip
        tokens: list[str] = md.get(K.TOKENS)
        n = len(tokens)
        if n_rows is not None and n != n_rows:
            raise MetadataError(f"{K.TOKENS.name} has {n} entries, but token_embd.weight has {n_rows} rows")
        for i, t in enumerate(tokens):
            if not t:  # llama.cpp's placeholder for an empty entry
                tokens[i] = f"[EMPTY_{i}]"
        self.tokens = tokens
        self.n_vocab = n
        self.token_to_id: dict[str, int] = {t: i for i, t in enumerate(tokens)}
        if len(self.token_to_id) != n:
            seen: dict[str, int] = {}
            for i, t in enumerate(tokens):
                if t in seen:
                    raise ValueError(f"duplicate token in vocabulary: {t!r} has ids {seen[t]} and {i}")
                seen[t] = i

        tarr = md.optional(K.TOKEN_TYPE)
        if tarr is None:
            attrs = np.full(n, ATTR_NORMAL, dtype=np.int64)
        else:
            if tarr.shape[0] != n:
                raise MetadataError(f"{K.TOKEN_TYPE.name} has {tarr.shape[0]} entries for {n} tokens")
            attrs = _TYPE_TO_ATTR[np.clip(tarr, 0, 7)]
            for i in np.nonzero(tarr == TYPE_BYTE)[0].tolist():
                if not _BYTE_TOKEN.fullmatch(tokens[i]):
                    raise MetadataError(f"{K.TOKEN_TYPE.name} marks token {i} ({tokens[i]!r}) as BYTE, "
                                        f"but it is not of the form <0xNN>")
        self._attrs: list[int] = attrs.tolist()

        key_id = self._key_id
        self.bos_id: int | None = key_id(md, K.BOS_ID, default_bos)
        self.eos_id: int | None = key_id(md, K.EOS_ID, default_eos)
        self.unk_id: int | None = key_id(md, K.UNK_ID, None)
        self.add_bos: bool = md.get(K.ADD_BOS, default_add_bos)
        self.add_eos: bool = md.get(K.ADD_EOS, False)
        self.add_space_prefix: bool = md.get(K.ADD_SPACE_PREFIX, default_add_space_prefix)
        if self.add_bos and self.bos_id is None:
            raise ValueError(
                "tokenizer.ggml.add_bos_token is true, but tokenizer.ggml.bos_token_id is not set"
            )
        if self.add_eos and self.eos_id is None:
            raise ValueError(
                "tokenizer.ggml.add_eos_token is true, but tokenizer.ggml.eos_token_id is not set"
            )

        def key_or_text(key: K.Key, texts: Sequence[str]) -> int | None:
            tid = key_id(md, key, None)
            return self._find_control(texts) if tid is None else tid

        self.eot_id: int | None = key_or_text(K.EOT_ID, EOT_TEXTS)
        eom = key_or_text(K.EOM_ID, EOM_TEXTS)
        fim = [
            key_or_text(K.FIM_PAD_ID, FIM_PAD_TEXTS),
            key_or_text(K.FIM_REP_ID, FIM_REP_TEXTS),
            key_or_text(K.FIM_SEP_ID, FIM_SEP_TEXTS),
        ]
        # control tokens whose name says "unused" are unused (Gemma's <unusedN>)
        for i in np.nonzero(attrs & ATTR_CONTROL)[0].tolist():
            if "unused" in tokens[i]:
                self._attrs[i] |= ATTR_UNUSED
        eog = {t for t in fim if t is not None}
        for text in EOG_TEXTS:
            tid = self.token_to_id.get(text)
            if tid is not None:
                eog.add(tid)
                self._attrs[tid] |= ATTR_CONTROL
        for text in ALWAYS_RENDERED:
            tid = self.token_to_id.get(text)
            if tid is not None:
                self._attrs[tid] = ATTR_USER_DEFINED
        eog.update(t for t in (self.eos_id, self.eot_id, eom) if t is not None)
        self.eot_ids: set[int] = eog  # every id that ends generation (llama.cpp's special_eog_ids)

        # special-token splitting order: longest (in UTF-8 bytes) first, as llama.cpp sorts them
        special = [
            i for i, a in enumerate(self._attrs) if a & (ATTR_CONTROL | ATTR_USER_DEFINED | ATTR_UNKNOWN)
        ]
        special.sort(key=lambda i: -len(tokens[i].encode("utf-8", "surrogatepass")))
        self._special_all = [(tokens[i], i) for i in special]
        self._special_user = [
            (tokens[i], i) for i in special if not self._attrs[i] & (ATTR_CONTROL | ATTR_UNKNOWN)
        ]
        self._piece_cache: dict[int, bytes] = {}

    def _key_id(self, md: Metadata, key: K.Key, default: int | None) -> int | None:
        """The id stored under key if it is in the vocabulary, else default if that is (llama.cpp's rule)."""
        v = md.optional(key)
        if v is not None and 0 <= v < self.n_vocab:
            return int(v)
        return default if default is not None and 0 <= default < self.n_vocab else None

    def _find_control(self, texts: Sequence[str]) -> int | None:
        for text in texts:
            tid = self.token_to_id.get(text)
            if tid is not None:
                self._attrs[tid] |= ATTR_CONTROL
                return tid
        return None

    # ---- attributes and pieces -------------------------------------------------------------
    def is_control(self, tid: int) -> bool:
        return bool(self._attrs[tid] & ATTR_CONTROL)

    def is_eog(self, tid: int) -> bool:
        return tid in self.eot_ids

    def is_user_defined(self, tid: int) -> bool:
        return bool(self._attrs[tid] & ATTR_USER_DEFINED)

    def is_byte(self, tid: int) -> bool:
        return bool(self._attrs[tid] & ATTR_BYTE)

    def token_to_piece(self, tid: int) -> str:
        """The vocabulary string of a token (as stored: '▁' or byte-level characters included)."""
        return self.tokens[tid]

    def token_id(self, text: str) -> int | None:
        """The id of the token whose vocabulary string is `text` (e.g. "<start_of_turn>"), if any."""
        return self.token_to_id.get(text)

    def token_bytes(self, tid: int) -> bytes:
        """What the token stands for in detokenized text; control, unknown and unused tokens -> b""."""
        if not 0 <= tid < self.n_vocab:
            raise IndexError(f"token id {tid} out of range for a vocabulary of {self.n_vocab}")
        b = self._piece_cache.get(tid)
        if b is None:
            b = self._piece_cache[tid] = self._compute_bytes(tid)
        return b

    def _compute_bytes(self, tid: int) -> bytes:
        # llama.cpp's token_to_piece with special=false
        attr = self._attrs[tid]
        text = self.tokens[tid]
        if attr & (ATTR_CONTROL | ATTR_UNKNOWN):
            return b""
        if attr & ATTR_USER_DEFINED:
            return text.encode("utf-8", "surrogatepass")
        if attr & ATTR_NORMAL:
            return self._normal_bytes(text)
        if attr & ATTR_BYTE:
            return bytes([int(text[3:5], 16)])
        return b""

    def _normal_bytes(self, text: str) -> bytes:
        raise NotImplementedError

    def decode(self, ids: Sequence[int], strip_space_prefix: bool | None = None) -> str:
        """Text of `ids`; invalid UTF-8 becomes U+FFFD.

        With add_space_prefix (SPM vocabularies that prefix a space) the space that the first piece
        starts with is dropped by default, so decode(encode(text)) == text; pass False to keep it
        (e.g. for a continuation, or use StreamDecoder).
        """
        data = b"".join(self.token_bytes(int(t)) for t in ids)
        if strip_space_prefix is None:
            strip_space_prefix = self.add_space_prefix
        if strip_space_prefix and data.startswith(b" "):
            data = data[1:]
        return data.decode("utf-8", "replace")

    # ---- encoding --------------------------------------------------------------------------
    def split_special(self, text: str, parse_special: bool) -> list[str | int]:
        """Fragments of `text`: raw text (str) and special token ids (int), in order.

        llama.cpp's tokenizer_st_partition: each special token in turn, longest first, is cut out of
        every raw fragment left so far, leftmost occurrences first.
        """
        frags: list[tuple[int, int] | int] = [(0, len(text))]
        specials = self._special_all if parse_special else self._special_user
        for s, tid in specials:
            if s not in text:  # cheap C-level filter: most special tokens never occur
                continue
            out: list[tuple[int, int] | int] = []
            for f in frags:
                if isinstance(f, int):
                    out.append(f)
                    continue
                a, b = f
                pos = text.find(s, a, b)
                if pos < 0:
                    out.append(f)
                    continue
                while pos >= 0:
                    if pos > a:
                        out.append((a, pos))
                    out.append(tid)
                    a = pos + len(s)
                    pos = text.find(s, a, b)
                if a < b:
                    out.append((a, b))
            frags = out
        return [f if isinstance(f, int) else text[f[0] : f[1]] for f in frags]

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of `text`, as llama_tokenize(text, add_special, parse_special) gives them."""
        frags = self.split_special(text, parse_special) if text else []
        out: list[int] = []
        if add_special and self.add_bos:
            assert self.bos_id is not None
            out.append(self.bos_id)
        self._encode_fragments(frags, out)
        if add_special and self.add_eos:
            assert self.eos_id is not None
            out.append(self.eos_id)
        return out

    def _encode_fragments(self, frags: list[str | int], out: list[int]) -> None:
        raise NotImplementedError


class SPMTokenizer(Tokenizer):
    """`tokenizer.ggml.model = llama`: SentencePiece-style vocabulary with scores and <0xNN> bytes."""

    vocab_type = "spm"

    def __init__(self, md: Metadata, n_rows: int | None = None) -> None:
        super().__init__(
            md, default_bos=1, default_eos=2, default_add_bos=True, default_add_space_prefix=True, n_rows=n_rows
        )
        scores = md.optional(K.SCORES)
        if scores is not None and len(scores) != self.n_vocab:
            raise MetadataError(f"{K.SCORES.name} has {len(scores)} entries for {self.n_vocab} tokens")
        self.scores: list[float] = (
            [0.0] * self.n_vocab if scores is None else scores.astype(np.float32).tolist()
        )
        # llama.cpp's byte_to_token: "<0xNN>", else the byte itself as a one-character token
        self.byte_ids: list[int | None] = []
        for b in range(256):
            tid = self.token_to_id.get(f"<0x{b:02X}>")
            if tid is None and b < 0x80:
                tid = self.token_to_id.get(chr(b))
            self.byte_ids.append(tid)

    def _normal_bytes(self, text: str) -> bytes:
        return text.replace(SPACE_ESCAPE, " ").encode("utf-8", "surrogatepass")

    def _encode_fragments(self, frags: list[str | int], out: list[int]) -> None:
        is_prev_special = True  # the first fragment gets the space prefix too
        for f in frags:
            if isinstance(f, int):
                out.append(f)
                is_prev_special = True
                continue
            if self.add_space_prefix and is_prev_special:
                f = " " + f
            out.extend(
                spm_tokenize(f.replace(" ", SPACE_ESCAPE), self.token_to_id, self.scores, self.byte_ids)
            )
            is_prev_special = False


class BPETokenizer(Tokenizer):
    """`tokenizer.ggml.model = gpt2`: byte-level BPE with merges and a named pre-tokenizer."""

    vocab_type = "bpe"

    def __init__(self, md: Metadata, n_rows: int | None = None) -> None:
        pre = md.get(K.TOKENIZER_PRE, "default")  # llama.cpp's fallback too (with a warning)
        if pre not in PRE_TOKENIZERS:
            raise UnsupportedTokenizer(
                f"unsupported pre-tokenizer tokenizer.ggml.pre = {pre!r} for a gpt2 (byte-level BPE) vocabulary"
            )
        self.pre = PreTokenizer(pre)
        super().__init__(md, default_bos=11, default_eos=11, default_add_bos=self.pre.spec.add_bos_default,
                         default_add_space_prefix=False, n_rows=n_rows)  # fmt: skip
        merges = md.optional(K.MERGES)
        if merges is None:
            raise MetadataError(f"cannot find {K.MERGES.name} for a gpt2 (BPE) vocabulary")
        self.ranks = parse_merges(merges)
        self.merger = BPEMerger(self.token_to_id, self.ranks, ignore_merges=self.pre.spec.ignore_merges)

    def _normal_bytes(self, text: str) -> bytes:
        return byte_decode(text)

    def _encode_fragments(self, frags: list[str | int], out: list[int]) -> None:
        split, word_ids = self.pre.split, self.merger.word_ids
        for f in frags:
            if isinstance(f, int):
                out.append(f)
                continue
            for word in split(f):
                out.extend(word_ids(word))


class WPMTokenizer(Tokenizer):
    """`tokenizer.ggml.model = bert`: WordPiece (wpm.py). With add_special: [CLS] (the BOS id, 101 by
    default) first and [SEP] (102) last, as llama.cpp's add_bos and add_sep for this vocabulary."""

    vocab_type = "wpm"

    def __init__(self, md: Metadata, n_rows: int | None = None) -> None:
        super().__init__(md, default_bos=101, default_eos=None, default_add_bos=True, default_add_space_prefix=False,
                         n_rows=n_rows)  # fmt: skip
        self.unk_id = self._key_id(md, K.UNK_ID, 100)  # llama.cpp's defaults for this vocabulary
        if self.unk_id is None:
            raise MetadataError(f"a bert (WordPiece) vocabulary needs {K.UNK_ID.name}")
        self.sep_id: int | None = self._key_id(md, K.SEP_ID, 102)
        self.add_sep: bool = md.get(K.ADD_SEP, True)
        if self.add_sep and self.sep_id is None:
            raise MetadataError(f"{K.ADD_SEP.name} is true, but {K.SEP_ID.name} is not set")
        self.lowercase: bool = md.get(K.NORMALIZER_LOWERCASE, True)
        self.strip_accents: bool = md.get(K.NORMALIZER_STRIP_ACCENTS, self.lowercase)
        self.max_len = max(len(t) for t in self.tokens)

    def _normal_bytes(self, text: str) -> bytes:
        return text.replace(WORD_START, " ").encode("utf-8", "surrogatepass")

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        out = super().encode(text, add_special, parse_special)
        if add_special and self.add_sep and self.sep_id is not None:
            out.append(self.sep_id)
        return out

    def _encode_fragments(self, frags: list[str | int], out: list[int]) -> None:
        assert self.unk_id is not None
        for f in frags:
            if isinstance(f, int):
                out.append(f)
            else:
                out.extend(wpm_tokenize(wpm_words(f, self.lowercase, self.strip_accents), self.token_to_id,
                                        self.max_len, self.unk_id))  # fmt: skip


class StreamDecoder:
    """Detokenizes one token at a time; text comes out only as complete UTF-8 characters.

    Bytes of a character split across tokens (byte-fallback <0xNN> tokens, byte-level BPE pieces)
    are held back until the character is complete; an impossible sequence becomes U+FFFD.
    """

    def __init__(self, tokenizer: Tokenizer, strip_space_prefix: bool = False) -> None:
        self.tokenizer = tokenizer
        self._buf = b""
        self._strip = strip_space_prefix  # drop the leading space of the first text (SPM prompt start)

    def push(self, tid: int) -> str:
        buf = self._buf + self.tokenizer.token_bytes(tid)
        if self._strip and buf:
            self._strip = False
            if buf.startswith(b" "):
                buf = buf[1:]
        cut = _complete_prefix_len(buf)
        self._buf = buf[cut:]
        return buf[:cut].decode("utf-8", "replace")

    def flush(self) -> str:
        """Whatever is held back (an unfinished character decodes to U+FFFD); resets the decoder."""
        buf, self._buf = self._buf, b""
        return buf.decode("utf-8", "replace")


def _complete_prefix_len(buf: bytes) -> int:
    """Length of `buf` without a trailing, still incomplete UTF-8 sequence."""
    n = len(buf)
    for k in range(1, min(4, n) + 1):
        c = buf[n - k]
        if c & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        need = 2 if c >> 5 == 0b110 else 3 if c >> 4 == 0b1110 else 4 if c >> 3 == 0b11110 else 1
        return n - k if need > k else n
    return n


def tokenizer_from_metadata(md: Mapping[str, Any] | Metadata, n_rows: int | None = None) -> Tokenizer:
    """The tokenizer a GGUF file's metadata describes (keys `tokenizer.ggml.*`), typed-checked; with
    n_rows (the embedding's rows) the vocabulary must have exactly that many tokens."""
    meta = _as_metadata(md)
    model = meta.get(K.TOKENIZER_MODEL)
    if model == "llama":
        return SPMTokenizer(meta, n_rows)
    if model == "gpt2":
        return BPETokenizer(meta, n_rows)
    if model == "bert":
        return WPMTokenizer(meta, n_rows)
    kind = f" ({UNSUPPORTED_MODELS[model]})" if model in UNSUPPORTED_MODELS else ""
    raise UnsupportedTokenizer(
        f"unsupported tokenizer model tokenizer.ggml.model = {model!r}{kind}; "
        f"supported: llama (SentencePiece), gpt2 (byte-level BPE), bert (WordPiece)"
    )

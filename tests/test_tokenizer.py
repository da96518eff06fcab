"""Tokenizers against llama.cpp's outputs (real Gemma 3 and SmolLM2 vocabularies) and small built vocabularies."""

from __future__ import annotations

import random
import unicodedata
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import load_reference, reference_dir

from edgellama.tokenizers.bpe import BYTE_TO_UNICODE, byte_decode, byte_encode
from edgellama.tokenizers.pretokenize import PRE_TOKENIZERS, WHITESPACE, PreTokenizer, collapse
from edgellama.tokenizers.tokenizer import (
    TYPE_BYTE,
    TYPE_CONTROL,
    TYPE_NORMAL,
    TYPE_USER_DEFINED,
    StreamDecoder,
    Tokenizer,
    tokenizer_from_metadata,
)

# ---- metadata readers ----------------------------------------------------------------------------


def metadata_via_gguf_package(path: Path) -> dict[str, Any]:
    """tokenizer.* / general.* keys read with the PyPI gguf package (the independent reader)."""
    import gguf

    reader = gguf.GGUFReader(path)
    md: dict[str, Any] = {}
    for key, field in reader.fields.items():
        if not key.startswith(("tokenizer.", "general.")):
            continue
        if field.types and field.types[0] == gguf.GGUFValueType.ARRAY:
            if field.types[-1] == gguf.GGUFValueType.STRING:
                md[key] = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
            else:
                md[key] = np.concatenate([np.asarray(field.parts[i]) for i in field.data])
        else:
            md[key] = field.contents()
    return md


def read_metadata(path: Path) -> dict[str, Any]:
    try:
        from edgellama.gguf.reader import GGUFFile
    except ImportError:
        return metadata_via_gguf_package(path)
    return dict(GGUFFile(path).metadata)


@pytest.fixture(scope="session")
def gemma_tok(gemma_path: Path) -> Tokenizer:
    return tokenizer_from_metadata(read_metadata(gemma_path))


@pytest.fixture(scope="session")
def smollm2_tok(smollm2_path: Path) -> Tokenizer:
    return tokenizer_from_metadata(read_metadata(smollm2_path))


@pytest.fixture(scope="session")
def qwen_tok(qwen_path: Path) -> Tokenizer:
    return tokenizer_from_metadata(read_metadata(qwen_path))


QWEN = pytest.param("qwen_tok", "qwen2.5-coder-0.5b", marks=pytest.mark.slow)  # 491 MB model: the slow set


# ---- against llama.cpp: real vocabularies ---------------------------------------------------------


def test_gemma3_prompt_ids_equal_llama_cpp(gemma_tok: Tokenizer) -> None:
    cases = load_reference("tokens.json")
    assert cases
    for case in cases:
        assert gemma_tok.encode(case["prompt"]) == case["ids"], case["prompt"]


@pytest.mark.parametrize(("tok_fixture", "model"), [("smollm2_tok", "smollm2-135m"), QWEN])
def test_bpe_prompt_ids_equal_llama_cpp(tok_fixture: str, model: str, request: Any) -> None:
    tok: Tokenizer = request.getfixturevalue(tok_fixture)
    cases = load_reference("tokens.json", model)
    assert cases
    for case in cases:
        assert tok.encode(case["prompt"]) == case["ids"], case["prompt"]


@pytest.mark.parametrize(("tok_fixture", "model"), [("gemma_tok", ""), ("smollm2_tok", "smollm2-135m"), QWEN])
def test_greedy_continuations_decode_to_llama_cpp_text(tok_fixture: str, model: str, request: Any) -> None:
    tok: Tokenizer = request.getfixturevalue(tok_fixture)
    for case in load_reference("greedy.json", model):
        assert tok.decode(case["ids"]) == case["text"]
        assert tok.decode(case["ids"][:16]) == case["text16"]
        stream = StreamDecoder(tok)
        assert "".join(stream.push(t) for t in case["ids"]) + stream.flush() == case["text"]


@pytest.mark.parametrize(("tok_fixture", "model"), [("gemma_tok", ""), ("smollm2_tok", "smollm2-135m"), QWEN])
def test_reference_text_token_count_equals_llama_cpp(tok_fixture: str, model: str, request: Any) -> None:
    # llama.cpp's perplexity run tokenized ppl-text.txt without BOS; only the count was recorded
    tok: Tokenizer = request.getfixturevalue(tok_fixture)
    text = (reference_dir() / "ppl-text.txt").read_text()
    assert (
        len(tok.encode(text, add_special=False)) == load_reference("perplexity.json", model)["n_text_tokens"]
    )


def test_gemma3_metadata_says_bos_and_no_space_prefix(gemma_tok: Tokenizer) -> None:
    assert gemma_tok.vocab_type == "spm"
    assert gemma_tok.n_vocab == 262144
    assert (gemma_tok.bos_id, gemma_tok.eos_id) == (2, 1)
    assert gemma_tok.add_bos and not gemma_tok.add_eos and not gemma_tok.add_space_prefix
    assert gemma_tok.token_id("<end_of_turn>") in gemma_tok.eot_ids
    assert gemma_tok.eos_id in gemma_tok.eot_ids
    assert gemma_tok.encode("") == [2]
    assert gemma_tok.encode("", add_special=False) == []


def test_smollm2_metadata_says_no_bos(smollm2_tok: Tokenizer) -> None:
    assert smollm2_tok.vocab_type == "bpe"
    assert not smollm2_tok.add_bos
    assert smollm2_tok.token_id("<|im_end|>") in smollm2_tok.eot_ids
    assert smollm2_tok.encode("") == []


def test_gemma3_user_defined_tokens_split_out_without_parse_special(gemma_tok: Tokenizer) -> None:
    tok = gemma_tok
    nl2, nl3, sp4, tab = (tok.token_id(s) for s in ("\n\n", "\n\n\n", "    ", "\t"))
    assert None not in (nl2, nl3, sp4, tab)
    assert all(tok.is_user_defined(t) for t in (nl2, nl3, sp4, tab))  # type: ignore[arg-type]
    # the longest user-defined token wins: "\n\n\n" is one token, not "\n\n" + "\n"
    assert tok.encode("a\n\n\nb", add_special=False) == [
        *tok.encode("a", add_special=False), nl3, *tok.encode("b", add_special=False)
    ]  # fmt: skip
    ids = tok.encode("x\n\n    y\tz", add_special=False)
    assert nl2 in ids and sp4 in ids and tab in ids
    assert tok.decode(ids) == "x\n\n    y\tz"


def test_gemma3_control_tokens_need_parse_special(gemma_tok: Tokenizer) -> None:
    tok = gemma_tok
    sot, eot = tok.token_id("<start_of_turn>"), tok.token_id("<end_of_turn>")
    assert sot is not None and eot is not None and tok.is_control(sot)
    text = "<start_of_turn>user\nHi<end_of_turn>"
    parsed = tok.encode(text, parse_special=True)
    assert parsed[:2] == [tok.bos_id, sot] and parsed[-1] == eot
    literal = tok.encode(text)
    assert sot not in literal and eot not in literal
    assert tok.decode(literal) == text  # spelled out as ordinary pieces
    assert tok.decode(parsed) == "user\nHi"  # control tokens detokenize to nothing
    assert tok.token_bytes(sot) == b"" and tok.token_to_piece(sot) == "<start_of_turn>"


def test_gemma3_byte_fallback_for_characters_not_in_vocab(gemma_tok: Tokenizer) -> None:
    tok = gemma_tok
    rare = "\U0010fffd"  # private use, plane 16: no token spells it
    ids = tok.encode("a" + rare + "b", add_special=False)
    byte_ids = [tok.token_id(f"<0x{b:02X}>") for b in rare.encode()]
    assert all(tok.is_byte(t) for t in byte_ids if t is not None)
    assert ids[1:-1] == byte_ids
    assert tok.decode(ids) == "a" + rare + "b"


@pytest.mark.parametrize("tok_fixture", ["gemma_tok", "smollm2_tok"])
def test_decode_inverts_encode_on_ordinary_text(tok_fixture: str, request: Any) -> None:
    tok: Tokenizer = request.getfixturevalue(tok_fixture)
    texts = [
        "  leading spaces, trailing spaces  ",
        "tabs\t\tand\r\nCRLF\n\n\nblank lines",
        "Ünïcödé: naïve café, Straße, Ωμέγα, 日本語のテキスト, emoji 😀👍🏽, math ∑∫√",
        "numbers 1234567 3.14159 -42 1e10, code: def f(x): return x**2  # comment",
        "quotes 'single' \"double\" it's we'll they're I'M",
    ]
    for text in texts:
        assert tok.decode(tok.encode(text)) == text
        assert tok.decode(tok.encode(text, add_special=False)) == text


@pytest.mark.parametrize("tok_fixture", ["gemma_tok", "smollm2_tok"])
def test_decode_inverts_encode_on_the_reference_text(tok_fixture: str, request: Any) -> None:
    tok: Tokenizer = request.getfixturevalue(tok_fixture)
    text = (reference_dir() / "ppl-text.txt").read_text()
    assert tok.decode(tok.encode(text)) == text
    assert tok.decode(tok.encode(text, add_special=False)) == text


def test_stream_decoder_holds_back_a_character_split_across_byte_tokens(gemma_tok: Tokenizer) -> None:
    tok = gemma_tok
    text = "é你😀\U0010fffd!"
    ids = [tok.token_id(f"<0x{b:02X}>") for b in text.encode()]
    assert None not in ids
    stream = StreamDecoder(tok)
    pieces = [stream.push(t) for t in ids]  # type: ignore[arg-type]
    assert "".join(pieces) + stream.flush() == text
    # one byte token per UTF-8 byte: a piece appears exactly when its character is complete
    assert [p for p in pieces if p] == list(text)
    assert sum(1 for p in pieces if p == "") == len(text.encode()) - len(text)


def test_stream_decoder_replaces_what_cannot_be_completed(smollm2_tok: Tokenizer) -> None:
    tok = smollm2_tok
    # byte-level BPE: single-byte tokens spell 0xE4 (a 3-byte lead) then "a"
    lead = tok.token_id(BYTE_TO_UNICODE[0xE4])
    a = tok.token_id("a")
    assert lead is not None and a is not None
    stream = StreamDecoder(tok)
    assert stream.push(lead) == ""
    assert stream.push(a) == "\ufffda"
    assert stream.push(lead) == ""
    assert stream.flush() == "\ufffd"
    assert stream.flush() == ""


def test_stream_decoder_passes_multibyte_bpe_pieces_whole(smollm2_tok: Tokenizer) -> None:
    tok = smollm2_tok
    text = "你好世界 — naïve 😀"
    ids = tok.encode(text)
    stream = StreamDecoder(tok)
    pieces = [stream.push(t) for t in ids]
    assert "".join(pieces) + stream.flush() == text
    assert all("\ufffd" not in p for p in pieces)


@pytest.mark.slow  # the gguf package's reader needs ~3-9 s for a 49k vocabulary
def test_both_gguf_readers_give_the_same_tokenizer(smollm2_path: Path) -> None:
    pytest.importorskip("gguf")
    a = tokenizer_from_metadata(read_metadata(smollm2_path))
    b = tokenizer_from_metadata(metadata_via_gguf_package(smollm2_path))
    assert a.tokens == b.tokens and a._attrs == b._attrs and a.eot_ids == b.eot_ids
    for case in load_reference("tokens.json", "smollm2-135m"):
        assert a.encode(case["prompt"]) == b.encode(case["prompt"])


# ---- SentencePiece-style rules on small built vocabularies ----------------------------------------


def spm_metadata(pieces: list[tuple[str, float, int]], **extra: Any) -> dict[str, Any]:
    tokens = [("<unk>", 0.0, 2), ("<s>", 0.0, TYPE_CONTROL), ("</s>", 0.0, TYPE_CONTROL)]
    tokens += [(f"<0x{b:02X}>", 0.0, TYPE_BYTE) for b in range(256)]
    tokens += pieces
    md: dict[str, Any] = {
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": [t for t, _, _ in tokens],
        "tokenizer.ggml.scores": np.array([s for _, s, _ in tokens], dtype=np.float32),
        "tokenizer.ggml.token_type": np.array([k for _, _, k in tokens], dtype=np.int32),
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }
    md.update(extra)
    return md


def spm_pieces(tok: Tokenizer, ids: list[int]) -> list[str]:
    return [tok.token_to_piece(i) for i in ids]


def test_spm_merges_highest_score_first_not_left_to_right() -> None:
    base = [("\u2581", -5.0, TYPE_NORMAL), ("a", -5.0, TYPE_NORMAL), ("b", -5.0, TYPE_NORMAL)]
    ab_first = tokenizer_from_metadata(spm_metadata(base + [("\u2581a", -2.0, 1), ("ab", -1.0, 1)]))
    assert spm_pieces(ab_first, ab_first.encode("ab")) == ["<s>", "\u2581", "ab"]
    pa_first = tokenizer_from_metadata(spm_metadata(base + [("\u2581a", -1.0, 1), ("ab", -2.0, 1)]))
    assert spm_pieces(pa_first, pa_first.encode("ab")) == ["<s>", "\u2581a", "b"]


def test_spm_equal_scores_merge_leftmost_first() -> None:
    tok = tokenizer_from_metadata(
        spm_metadata([("a", -5.0, 1), ("aa", -1.0, 1)], **{"tokenizer.ggml.add_space_prefix": False})
    )
    assert spm_pieces(tok, tok.encode("aaa", add_special=False)) == ["aa", "a"]


def test_spm_space_prefix_on_first_fragment_and_after_special_tokens() -> None:
    pieces = [("\u2581a", -1.0, 1), ("\u2581b", -1.0, 1), ("<x>", 0.0, TYPE_USER_DEFINED)]
    tok = tokenizer_from_metadata(spm_metadata(pieces))  # add_space_prefix absent: llama.cpp default true
    assert tok.add_space_prefix
    assert spm_pieces(tok, tok.encode("a<x>b")) == ["<s>", "\u2581a", "<x>", "\u2581b"]
    assert tok.decode(tok.encode("a b")) == "a b"  # the prefixed space is dropped again
    assert tok.decode(tok.encode("a b"), strip_space_prefix=False) == " a b"
    no_prefix = tokenizer_from_metadata(spm_metadata(pieces, **{"tokenizer.ggml.add_space_prefix": False}))
    assert spm_pieces(no_prefix, no_prefix.encode("a<x> b")) == ["<s>", "<0x61>", "<x>", "\u2581b"]


def test_spm_byte_fallback_and_eos_per_metadata() -> None:
    tok = tokenizer_from_metadata(
        spm_metadata([("\u2581", -1.0, 1)], **{"tokenizer.ggml.add_eos_token": True})
    )
    ids = tok.encode("é")
    assert spm_pieces(tok, ids) == ["<s>", "\u2581", "<0xC3>", "<0xA9>", "</s>"]
    assert tok.decode(ids) == "é"


def test_spm_user_defined_piece_keeps_its_spaces_and_control_piece_is_empty() -> None:
    tok = tokenizer_from_metadata(spm_metadata([("a\u2581b", 0.0, TYPE_USER_DEFINED), ("c\u2581d", -1.0, 1)]))
    assert tok.token_bytes(tok.token_id("a\u2581b")) == "a\u2581b".encode()  # type: ignore[arg-type]
    assert tok.token_bytes(tok.token_id("c\u2581d")) == b"c d"  # type: ignore[arg-type]
    assert tok.token_bytes(1) == b""


# ---- byte-level BPE rules on small built vocabularies ---------------------------------------------


def bpe_metadata(extra_tokens: list[str], merges: list[str], pre: str = "gpt-2") -> dict[str, Any]:
    tokens = ["<|endoftext|>"] + BYTE_TO_UNICODE + extra_tokens
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": pre,
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": [TYPE_CONTROL] + [TYPE_NORMAL] * (len(tokens) - 1),
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 0,
    }


def test_bpe_merges_follow_rank_order() -> None:
    ab = tokenizer_from_metadata(bpe_metadata(["ab", "bc"], ["a b", "b c"]))
    assert [ab.token_to_piece(i) for i in ab.encode("abc")] == ["ab", "c"]
    bc = tokenizer_from_metadata(bpe_metadata(["ab", "bc"], ["b c", "a b"]))
    assert [bc.token_to_piece(i) for i in bc.encode("abc")] == ["a", "bc"]


def test_bpe_merges_stay_inside_pre_tokenizer_words() -> None:
    tok = tokenizer_from_metadata(bpe_metadata(["a\u0120", "\u0120b"], ["a \u0120", "\u0120 b"]))
    # "a b" splits into "a", " b": the space joins the word after it, never the word before
    assert [tok.token_to_piece(i) for i in tok.encode("a b")] == ["a", "\u0120b"]


def test_bpe_llama3_family_skips_merges_for_whole_word_tokens() -> None:
    # "abc" is a token but no merge chain builds it: llama-bpe (ignore_merges) still emits it
    llama3 = tokenizer_from_metadata(bpe_metadata(["abc", "ab"], ["a b"], pre="llama-bpe"))
    assert [llama3.token_to_piece(i) for i in llama3.encode("abc", add_special=False)] == ["abc"]
    gpt2 = tokenizer_from_metadata(bpe_metadata(["abc", "ab"], ["a b"], pre="gpt-2"))
    assert [gpt2.token_to_piece(i) for i in gpt2.encode("abc")] == ["ab", "c"]


def test_bpe_long_words_merge_like_short_ones(smollm2_tok: Tokenizer) -> None:
    from edgellama.tokenizers.bpe import _merge_long, _merge_short

    ranks = smollm2_tok.ranks  # type: ignore[attr-defined]
    rng = random.Random(7)
    for _ in range(200):
        word = byte_encode("".join(rng.choice("abcdeinorst_-=0ÿé你 ") for _ in range(rng.randint(2, 80))))
        assert _merge_long(word, ranks) == _merge_short(list(word), ranks), word


def test_bpe_and_spm_round_trip_a_long_run(gemma_tok: Tokenizer, smollm2_tok: Tokenizer) -> None:
    # its time (a quadratic merge would take minutes) is measured by bench/tokenizer.py
    text = "x" * 20000 + "=" * 20000
    for tok in (gemma_tok, smollm2_tok):
        assert tok.decode(tok.encode(text, add_special=False)) == text


def test_byte_level_map_round_trips_every_byte() -> None:
    assert len(set(BYTE_TO_UNICODE)) == 256
    data = bytes(range(256))
    word = data.decode("latin-1")
    assert byte_decode("".join(BYTE_TO_UNICODE[b] for b in data)) == data
    assert (
        byte_encode("é ") == "\u00c3\u00a9\u0120"
        and byte_encode(word[:5]) == "\u0100\u0101\u0102\u0103\u0104"
    )


def test_unknown_tokenizer_model_or_pre_tokenizer_is_an_error() -> None:
    with pytest.raises(ValueError, match="tokenizer.ggml.model = 't5'"):
        tokenizer_from_metadata({"tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": ["a"]})
    # WordPiece turns unknown words into [UNK]: a vocabulary without one is refused naming the key
    with pytest.raises(ValueError, match="tokenizer.ggml.unknown_token_id"):
        tokenizer_from_metadata({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a", "b"],
                                 "tokenizer.ggml.add_bos_token": False})
    with pytest.raises(ValueError, match="no-such-pre"):
        tokenizer_from_metadata(bpe_metadata([], [], pre="no-such-pre"))


# ---- pre-tokenizer splits -------------------------------------------------------------------------

SAMPLE = "Hello world123 it's  x\n\n  y"


def test_qwen2_split_single_digits_and_newline_runs() -> None:
    # derived from qwen2's regex: \p{N} takes one digit, \s*[\r\n]+ ends at the last newline,
    # \s+(?!\S) leaves the last space of a run to the word after it
    assert PreTokenizer("qwen2").split(SAMPLE) == [
        "Hello", " world", "1", "2", "3", " it", "'s", " ", " x", "\n\n", " ", " y"
    ]  # fmt: skip


def test_llama3_split_digit_triples_and_case_insensitive_contractions() -> None:
    assert PreTokenizer("llama-bpe").split("abc 1234567 I'M HE'LL\tgo") == [
        "abc", " ", "123", "456", "7", " I", "'M", " HE", "'LL", "\tgo"
    ]  # fmt: skip


def test_gpt2_split_space_joins_next_word_and_runs_keep_last_space() -> None:
    assert PreTokenizer("gpt-2").split(SAMPLE) == [
        "Hello", " world", "123", " it", "'s", " ", " x", "\n\n ", " y"
    ]  # fmt: skip


def test_smollm_split_digits_before_the_gpt2_regex() -> None:
    assert PreTokenizer("smollm").split("abc 123 d4") == ["abc", " ", "1", "2", "3", " d", "4"]


def test_qwen2_split_uses_unicode_categories() -> None:
    text = "naïve e\u0301 你好 ٣٤ —x €5\u00a0\u3000z"
    # combining mark (M) is not a letter; Arabic-Indic digits are numbers; NBSP/ideographic space are \s
    assert PreTokenizer("qwen2").split(text) == [
        "na\u00efve", " e", "\u0301", " \u4f60\u597d", " ", "\u0663", "\u0664", " \u2014", "x", " \u20ac",
        "5", "\u00a0", "\u3000z",
    ]  # fmt: skip


def test_collapse_maps_categories_like_llama_cpp() -> None:
    assert collapse("aZ9 ") == "aZ9 "
    assert collapse("é٣\u0301—€\u00a0\x85\u200b") == "\xd2\xd1\xd4\xd3\xd5\x0b\x0b\xd0"


# Alphabet for the randomized comparison: ASCII, the tricky whitespace, letters/numbers/marks/
# symbols from several scripts; only characters whose category Python's unicodedata and the
# `regex` module agree on (their Unicode versions differ).
_ALPHABET = list("abcXYZ019 '\t\n\r\v\f.,!?-_()[]{}<>$+^~|`@#%&*/\\\"") + [
    "'s", "'S", "'t", "'re", "'VE", "'m", "'ll", "'d", "  ", "\n\n", " \n", "\x00", "\x7f",
    "é", "ñ", "ß", "Ω", "ж", "你", "好", "ア", "한", "٣", "Ⅻ", "½", "\u0301", "\u0903",
    "€", "—", "…", "«", "😀", "\u00a0", "\u3000", "\u2028", "\x85", "\u200b", "\ue000",
]  # fmt: skip


def _regex_reference_split(text: str, exprs: tuple[str, ...]) -> list[str]:
    """llama.cpp's split structure, with the `regex` module's real \\p{...} classes."""
    import regex

    from edgellama.tokenizers.pretokenize import SCANNER_EQUIVALENT

    segments = [text] if text else []
    for expr in exprs:
        pattern = regex.compile(SCANNER_EQUIVALENT.get(expr, expr), regex.V0)
        out: list[str] = []
        for seg in segments:
            pos = 0
            for m in pattern.finditer(seg):
                if m.start() == m.end():
                    continue
                if m.start() > pos:
                    out.append(seg[pos : m.start()])
                out.append(m.group())
                pos = m.end()
            if pos < len(seg):
                out.append(seg[pos:])
        segments = out
    return segments


@pytest.mark.parametrize("pre", ["default", "gpt-2", "llama-bpe", "qwen2", "smollm", "qwen35"])
def test_pre_tokenizer_matches_the_regex_module_on_random_text(pre: str) -> None:
    regex = pytest.importorskip("regex")
    # \s in `regex` is White_Space; std::regex (and our ASCII \s) agree on it only without 0x1C-0x1F
    assert not any(chr(c) in WHITESPACE for c in range(0x1C, 0x20))
    alphabet = [
        s for s in _ALPHABET
        if all((unicodedata.category(c)[0] == k) == bool(regex.match(rf"\p{{{k}}}", c)) for c in s for k in "LNPMS")
    ]  # fmt: skip
    assert len(alphabet) > len(_ALPHABET) - 3
    rng = random.Random(1234)
    spec = PRE_TOKENIZERS[pre]
    splitter = PreTokenizer(pre)
    for _ in range(1500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 24)))
        got = splitter.split(text)
        assert "".join(got) == text
        assert got == _regex_reference_split(text, spec.regexes), repr(text)

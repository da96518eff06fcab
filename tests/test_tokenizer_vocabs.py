"""Tokenizers against llama.cpp's own tokenizer tests: the vocab-only GGUFs models/ggml-vocab-*.gguf and
their .inp/.out cases, as llama.cpp's tests/test-tokenizer-0.cpp runs them.

The files come with llama.cpp's source in the llama-cpp-python sdist (llamacpp_ref.cached_sdist: downloaded
from PyPI once, cached); offline the tests skip, in CI they fail. Every file in models/ is listed below, as
checked case by case, loaded without cases, or refused with the reason.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import skip_or_fail

from edgellama.gguf.metadata import Metadata
from edgellama.gguf.reader import GGUFFile
from edgellama.tokenizers.pretokenize import PreTokenizer
from edgellama.tokenizers.tokenizer import Tokenizer, UnsupportedTokenizer, tokenizer_from_metadata

# the files with .inp/.out cases, by the name in ggml-vocab-<name>.gguf
WITH_CASES = [
    "bert-bge", "command-r", "deepseek-coder", "deepseek-llm", "falcon", "gpt-2", "llama-bpe", "llama-spm",
    "mpt", "phi-3", "qwen2", "qwen35", "refact", "starcoder",
]  # fmt: skip
# files llama.cpp ships without cases (its test-tokenizer-1 runs on them, commented out in its CMakeLists)
WITHOUT_CASES = {"aquila": "bpe", "baichuan": "spm", "gpt-neox": "bpe"}
# files whose tokenizer edgellama does not have: tokenizer.ggml.model, and why
REFUSED = {
    "nomic-bert-moe": ("t5", "SentencePiece Unigram (T5), for embedding models: a later embeddings issue"),
    "gemma-4": ("gemma4", "Gemma 4's BPE over SentencePiece pieces: not implemented"),
}

# test-tokenizer-0.cpp's case separator in .inp files (each case is followed by it)
CASE_SEPARATOR = "\n__ggml_vocab_test__\n"


@pytest.fixture(scope="session")
def vocab_dir() -> Path:
    """llama.cpp's models/ folder from the cached sdist."""
    from llamacpp_ref import ReferenceUnavailable, cached_sdist

    from edgellama.default_model import cache_dir

    try:
        return cached_sdist(cache_dir()) / "vendor" / "llama.cpp" / "models"
    except ReferenceUnavailable as exc:
        reason = str(exc)
    skip_or_fail(reason)  # outside the except: a CI failure shows the reason, not a chained traceback


def vocab_path(vocab_dir: Path, name: str) -> Path:
    return vocab_dir / f"ggml-vocab-{name}.gguf"


def load(path: Path) -> Tokenizer:
    """The tokenizer of a vocab-only file: from its metadata alone (it has no tensors, so no wiring)."""
    return tokenizer_from_metadata(Metadata.of(GGUFFile(path)))


def read_cases(path: Path) -> list[tuple[str, list[int]]]:
    """(text, expected ids) per case of PATH.inp / PATH.out: the n-th text, each ended by the separator,
    goes with the n-th line of ids; ids were made with add_special=false, parse_special=false."""
    raw = path.with_name(path.name + ".inp").read_bytes().decode("utf-8")
    lines = path.with_name(path.name + ".out").read_text(encoding="utf-8").splitlines()
    texts = raw.split(CASE_SEPARATOR)
    assert texts[-1] == "", f"{path.name}.inp does not end with the case separator"
    texts.pop()
    assert len(texts) == len(lines), f"{path.name}: {len(texts)} inputs, {len(lines)} outputs"
    return [(text, [int(t) for t in line.split()]) for text, line in zip(texts, lines)]


def test_every_vocab_file_is_listed(vocab_dir: Path) -> None:
    names = {p.name[len("ggml-vocab-") : -len(".gguf")] for p in vocab_dir.glob("ggml-vocab-*.gguf")}
    assert names == set(WITH_CASES) | set(WITHOUT_CASES) | set(REFUSED)
    for name in WITH_CASES:
        assert vocab_path(vocab_dir, name).with_suffix(".gguf.out").is_file(), name
    for name in WITHOUT_CASES:
        assert not vocab_path(vocab_dir, name).with_suffix(".gguf.inp").exists(), name


@pytest.mark.parametrize("name", WITH_CASES)
def test_vocab_gives_llama_cpp_ids_for_every_case(vocab_dir: Path, name: str) -> None:
    path = vocab_path(vocab_dir, name)
    tok = load(path)
    cases = read_cases(path)
    assert len(cases) >= 40
    failed = [
        f"{text!r}: expected {want}, got {got}"
        for text, want in cases
        if (got := tok.encode(text, add_special=False, parse_special=False)) != want
    ]
    assert not failed, f"{len(cases) - len(failed)}/{len(cases)} cases pass:\n" + "\n".join(failed)


@pytest.mark.parametrize("name", sorted(WITHOUT_CASES))
def test_vocab_without_cases_loads_and_round_trips(vocab_dir: Path, name: str) -> None:
    tok = load(vocab_path(vocab_dir, name))
    assert tok.vocab_type == WITHOUT_CASES[name]
    text = "Hello, world! 1234 naïve 你好\n\tdone"
    ids = tok.encode(text, add_special=False)
    assert len(ids) < len(text.encode("utf-8"))  # merges happened
    assert tok.decode(ids) == text


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_unsupported_vocab_is_refused_naming_its_tokenizer(vocab_dir: Path, name: str) -> None:
    model, _reason = REFUSED[name]
    with pytest.raises(UnsupportedTokenizer, match=f"tokenizer.ggml.model = '{model}'"):
        load(vocab_path(vocab_dir, name))


def test_unknown_pre_tokenizer_is_refused_by_name() -> None:
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "deepseek-v9", "tokenizer.ggml.tokens": ["a"],
          "tokenizer.ggml.merges": []}  # fmt: skip
    with pytest.raises(UnsupportedTokenizer, match="tokenizer.ggml.pre = 'deepseek-v9'"):
        tokenizer_from_metadata(md)


# ---- the DeepSeek pre-tokenizers, by what their regexes say ------------------------------------------

CODE = "def f(x):\n    return 12 你好"


def test_deepseek_coder_splits_single_digits_and_cjk_runs() -> None:
    # newlines alone; a letter or punctuation run takes one whitespace before it; CJK leaves its space behind
    assert PreTokenizer("deepseek-coder").split(CODE) == [
        "def", " f", "(", "x", "):", "\n", "   ", " return", " ", "1", "2", " ", "你好"
    ]  # fmt: skip


def test_deepseek_llm_keeps_digit_runs_and_splits_trailing_space() -> None:
    assert PreTokenizer("deepseek-llm").split(CODE) == [
        "def", " f", "(", "x", "):", "\n", "   ", " return", " ", "12", " ", "你好"
    ]  # fmt: skip
    # "\s+$" cuts the whitespace off the end of every segment the passes before it left, not only off
    # the end of the text: here off " × " between two letter words (× is in none of the classes)
    assert PreTokenizer("deepseek-llm").split("x ×  y") == ["x", " ×", " ", " y"]
    assert PreTokenizer("deepseek-llm").split("x ×  ") == ["x", " ×", "  "]


def test_wordpiece_adds_cls_and_sep_and_keeps_unknown_words_whole(vocab_dir: Path) -> None:
    tok = load(vocab_path(vocab_dir, "bert-bge"))
    assert tok.vocab_type == "wpm"
    ids = tok.encode("Hello, World!", add_special=True)
    assert ids[0] == 101 and ids[-1] == 102  # [CLS] ... [SEP], as llama.cpp's add_bos and add_sep
    assert ids[1:-1] == tok.encode("hello , world !", add_special=False)  # lowercased, punctuation split
    assert tok.decode(ids[1:-1]).split() == ["hello", ",", "world", "!"]
    # a character no piece covers makes its whole word one [UNK] (100), the words around it stay
    unk = tok.encode("abc\u2603def xyz", add_special=False)
    assert 100 in unk and unk[-1] == tok.encode("xyz", add_special=False)[-1]

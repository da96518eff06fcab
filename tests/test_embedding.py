"""Embeddings (issue 34) without llama.cpp: normalization against its formulas, pooling against the per-token
hidden states, texts batched together against each alone, the encoder's non-causal attention, the Python
API's shapes (llama-cpp-python's), the engine's refusals, every SIMD ISA against the scalar reference, and
`edgellama embed`. tests/test_embedding_peer.py compares the vectors with llama.cpp's."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from arch_models import write_arch_model
from conftest import skip_or_fail

from edgellama.embedding import EmbeddingError, normalize, resolve_pooling
from edgellama.llm import LLM

TEXTS = ["The cat sat on the mat.", "A dog is playing in the park with a red ball.", "Hello",
         "Quantum computers use qubits instead of bits."]


@pytest.fixture(scope="module")
def bert_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from llamacpp_ref import ReferenceUnavailable

    try:
        return write_arch_model(tmp_path_factory.mktemp("bert") / "bert.gguf", "bert")
    except ReferenceUnavailable as exc:  # the vocabulary comes from llama.cpp's tree
        skip_or_fail(str(exc))


@pytest.fixture(scope="module")
def bert(bert_file: Path) -> Iterator[LLM]:
    with LLM(bert_file, n_threads=1) as llm:
        yield llm


@pytest.fixture(scope="module")
def smol(smollm2_path: Path) -> Iterator[LLM]:
    with LLM(smollm2_path, embedding=True, pooling="mean", n_threads=1) as llm:
        yield llm


# ---- normalization and pooling rules ----

def test_normalize_follows_llamacpps_formulas() -> None:
    v = np.array([[3.0, -4.0, 1.0], [0.0, 0.0, 0.0]], dtype=np.float32)
    x = v[0].astype(np.float64)
    assert np.array_equal(normalize(v, -1), v)
    assert np.allclose(normalize(v, 0)[0], x * 32760.0 / 4.0)  # the largest |x| becomes 32760
    assert np.allclose(normalize(v, 1)[0], x / 8.0)
    assert np.allclose(normalize(v, 2)[0], x / np.sqrt(26.0))
    assert np.allclose(normalize(v, 3)[0], x / (27 + 64 + 1) ** (1 / 3))
    for p in (0, 1, 2, 3):
        assert not normalize(v, p)[1].any()  # a zero vector stays zero, no NaN
    with pytest.raises(EmbeddingError, match="embd-normalize"):
        normalize(v, -2)


def test_pooling_comes_from_the_request_then_the_file_then_none() -> None:
    assert resolve_pooling("cls", "mean") == "cls"
    assert resolve_pooling(None, "mean") == "mean"
    assert resolve_pooling(None, "unspecified") == "none"
    with pytest.raises(EmbeddingError, match="rank"):
        resolve_pooling("rank", "mean")
    with pytest.raises(EmbeddingError, match="not one of"):
        resolve_pooling("max", "mean")


@pytest.mark.parametrize("pooling", ["mean", "cls", "last"])
def test_pooled_vectors_are_the_pooled_token_states(smollm2_path: Path, pooling: str) -> None:
    with LLM(smollm2_path, embedding=True, pooling="none", n_threads=1) as llm:
        toks = [llm.tokenize(t) for t in TEXTS]
        rows = llm.embed_tokens(toks, -1)
    with LLM(smollm2_path, embedding=True, pooling=pooling, n_threads=1) as llm:
        pooled = llm.embed_tokens(toks, -1)
    for r, p, t in zip(rows, pooled, toks, strict=True):
        assert r.shape == (len(t), 576)
        want = {"mean": (r.astype(np.float64).sum(axis=0) / len(t)).astype(np.float32), "cls": r[0], "last": r[-1]}
        # the same hidden states whatever rows the pass kept: pooling picks and averages them
        assert np.allclose(p, want[pooling], atol=1e-6, rtol=1e-5)


def test_texts_embedded_together_equal_each_alone(smol: LLM) -> None:
    """Four texts in one forward pass (each its own sequence) give each text's own bits."""
    toks = [smol.tokenize(t) for t in TEXTS]
    together = smol.embed_tokens(toks, -1)
    assert smol.engine.n_seq == 4
    for t, v in zip(toks, together, strict=True):
        assert np.array_equal(smol.embed_tokens([t], -1)[0], v)
    # more texts than sequences, and texts longer than a batch, go in several passes
    many = smol.embed_tokens(toks * 3, -1)
    assert all(np.array_equal(a, b) for a, b in zip(many, together * 3, strict=True))


def test_a_causal_text_longer_than_a_batch_is_split_into_passes(smollm2_path: Path) -> None:
    with LLM(smollm2_path, embedding=True, pooling="mean", n_threads=1, n_ctx=128, n_batch=16) as small, \
            LLM(smollm2_path, embedding=True, pooling="mean", n_threads=1, n_ctx=128, n_batch=128) as big:
        t = small.tokenize(" ".join(TEXTS * 2))
        assert 16 < len(t) <= 128
        assert np.allclose(small.embed_tokens([t], -1)[0], big.embed_tokens([t], -1)[0], atol=1e-5)


# ---- the encoder ----

def test_encoder_attention_is_bidirectional(bert: LLM) -> None:
    """With pooling none, the first token's state changes when a later token does (BERT sees both ways);
    a causal decoder's would not."""
    assert bert.desc.arch == "bert" and bert.desc.non_causal and bert.embedding and bert.pooling == "mean"
    a, b = bert.tokenize("the cat sat"), bert.tokenize("the cat ran")
    assert a[:3] == b[:3] and a != b
    bert.embedder.pooling = "none"
    try:
        ra, rb = bert.embed_tokens([a, b], -1)
    finally:
        bert.embedder.pooling = "mean"
    assert not np.allclose(ra[0], rb[0], atol=1e-4)


def test_decoder_attention_is_causal(smollm2_path: Path) -> None:
    with LLM(smollm2_path, embedding=True, pooling="none", n_threads=1) as llm:
        a, b = llm.tokenize("the cat sat"), llm.tokenize("the cat ran")
        ra, rb = llm.embed_tokens([a, b], -1)
    n = next(i for i in range(len(a)) if a[i] != b[i])
    assert np.array_equal(ra[:n], rb[:n])


def test_encoder_refuses_logits_and_continued_sequences(bert: LLM) -> None:
    with pytest.raises(ValueError, match="embedding model"):
        bert.engine.decode([0, 0], [101, 102], [0, 1], [False, True])
    bert.engine.seq_clear(0)
    bert.engine.decode_embd([0, 0], [101, 7592], [0, 1], [False, False])  # fills sequence 0...
    with pytest.raises(Exception, match="non-causal model takes each sequence whole"):
        bert.engine.decode_embd([0], [102], [2], [True])  # ...which another batch may not continue
    bert.engine.seq_clear(0)


def test_encoder_text_longer_than_the_context_is_an_error_naming_it(bert: LLM) -> None:
    long = bert.tokenize(" ".join(["word"] * 600))
    assert len(long) > bert.n_ctx == 512
    with pytest.raises(EmbeddingError, match="text 1 is 602 tokens, longer than the context of 512"):
        bert.embed_tokens([bert.tokenize("short"), long], 2)
    with pytest.raises(EmbeddingError, match="longer than the context"):
        bert.embed(["short", " ".join(["word"] * 600)], truncate=False)
    assert len(bert.embed(" ".join(["word"] * 600))) == 384  # truncate=True (llama-cpp-python's default) cuts


def test_a_context_past_the_position_table_is_refused_naming_it(bert_file: Path) -> None:
    with pytest.raises(ValueError, match="longer than the model's 512 absolute positions"):
        LLM(bert_file, n_ctx=1024)


@pytest.mark.parametrize("key, value, vtype, message", [
    ("bert.pooling_type", 9, "UINT32", "bert.pooling_type = 9 is not a pooling type"),
    ("bert.attention.causal", "no", "STRING", "bert.attention.causal"),
    ("bert.attention.layer_norm_epsilon", -1.0, "FLOAT32", "bert.attention.layer_norm_epsilon"),
    ("bert.context_length", 256, "UINT32", "tensor position_embd.weight has shape [384, 512], expected [384, 256]"),
])
def test_hostile_encoder_metadata_is_refused_naming_the_key(bert_file: Path, tmp_path: Path, key: str, value: Any,
                                                            vtype: str, message: str) -> None:
    from gguf_fixtures import rewrite_metadata

    from edgellama.gguf.reader import GGUFValueType as V
    from edgellama.wiring import ModelError

    bad = rewrite_metadata(bert_file, tmp_path / "bad.gguf", {key: (value, V[vtype], None)})
    with pytest.raises((ModelError, ValueError), match=message.replace("[", r"\[").replace("]", r"\]")):
        LLM(bad, n_threads=1)


def test_every_simd_isa_gives_the_scalar_encoder_within_tolerance(bert_file: Path, simd_isa: str) -> None:
    from edgellama.native import kernels

    with LLM(bert_file, n_threads=2) as llm:
        toks = [llm.tokenize(t) for t in TEXTS]
        kernels.set_isa("scalar")
        ref = llm.embed_tokens(toks, 2)
        kernels.set_isa(simd_isa)
        got = llm.embed_tokens(toks, 2)
    for a, b in zip(ref, got, strict=True):
        assert float(np.dot(a, b)) > 0.99999  # unit vectors; F32 weights: only summation orders differ


# ---- the Python API (llama-cpp-python's shapes) ----

def test_embed_and_create_embedding_shapes(smol: LLM) -> None:
    one = smol.embed("Hello world")
    assert isinstance(one, list) and len(one) == 576 and all(isinstance(x, float) for x in one)
    many, n = smol.embed(["Hello world", "Bye"], normalize=True, return_count=True)
    assert len(many) == 2 and n == len(smol.tokenize("Hello world")) + len(smol.tokenize("Bye"))
    assert all(abs(float(np.linalg.norm(v)) - 1.0) < 1e-5 for v in many)
    assert np.allclose(np.array(many[0]) * np.linalg.norm(one), one, atol=1e-5)
    r = smol.create_embedding(["Hello world", [1, 2, 3]])
    assert r["object"] == "list" and [d["index"] for d in r["data"]] == [0, 1]
    assert r["data"][0]["embedding"] == one and r["usage"]["prompt_tokens"] == r["usage"]["total_tokens"] == n - 2 + 3
    assert len(smol.embed([5, 6, 7])) == 576  # one token list is one input
    with pytest.raises(EmbeddingError, match="token id outside"):
        smol.embed([[1, 2, 10**6]])


def test_an_llm_without_embedding_refuses(smollm2_path: Path) -> None:
    with LLM(smollm2_path, n_threads=1, n_ctx=256) as llm, pytest.raises(EmbeddingError, match="embedding=True"):
        llm.embed("hi")


def test_encoder_refuses_lora_and_completion(bert: LLM, bert_file: Path) -> None:
    with pytest.raises(ValueError, match="embedding model"):
        bert.create_completion("hello", max_tokens=2)
    with pytest.raises(ValueError, match="LoRA adapters are not supported"):
        LLM(bert_file, loras=[(bert_file, 1.0)])


# ---- edgellama embed ----

def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgellama.cli", "embed", *args], capture_output=True, text=True,
                          timeout=300, check=False)


def test_embed_command_gives_the_apis_vectors(bert_file: Path, bert: LLM) -> None:
    r = run_cli("-m", str(bert_file), "-t", "1", "-p", "\n".join(TEXTS[:2]), "--embd-output-format", "array")
    assert r.returncode == 0, r.stderr
    got = np.array(json.loads(r.stdout), dtype=np.float32)
    want = np.array(bert.embed_tokens([bert.tokenize(t, special=True) for t in TEXTS[:2]], 2))
    assert got.shape == (2, 384) and np.allclose(got, want, atol=1e-6)
    r = run_cli("-m", str(bert_file), "-t", "1", "-p", "a|b|c", "--embd-separator", "|", "--embd-output-format",
                "json+", "--embd-normalize", "-1")
    doc: dict[str, Any] = json.loads(r.stdout)
    assert [d["index"] for d in doc["data"]] == [0, 1, 2] and len(doc["cosineSimilarity"]) == 3
    assert doc["cosineSimilarity"][0][0] == pytest.approx(1.0)
    r = run_cli("-m", str(bert_file), "-t", "1", "-p", "one\ntwo")
    assert r.stdout.startswith("embedding 0: ") and "cosine similarity matrix" in r.stdout


def test_embed_command_errors_are_one_line(bert_file: Path, tmp_path: Path) -> None:
    r = run_cli("-m", str(bert_file), "-p", " ".join(["word"] * 600))
    assert r.returncode == 1 and r.stderr.strip().endswith("(--embd-separator)")
    assert "edgellama: error: text 0 is 602 tokens" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("-m", str(bert_file))
    assert r.returncode == 1 and "exactly one of -p/--prompt and -f/--file" in r.stderr
    r = run_cli("-m", str(bert_file), "-f", str(tmp_path / "missing.txt"))
    assert r.returncode == 2 and "edgellama: error:" in r.stderr

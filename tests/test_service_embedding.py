"""serve --embedding (issue 34) with real clients over the UNIX socket: the openai SDK's embeddings.create
(which asks for base64), curl on llama-server's /embedding, protocol v1 `embedding` lines; all-MiniLM-L6-v2
(converted by `edgellama convert`) and a chat model (SmolLM2) that answers embeddings and completions from
one server. The vectors are the Python API's (tests/test_embedding_peer.py compares those with llama.cpp's)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgellama.llm import LLM
from tests.service_util import ServerProc, UnixHTTP, openai_over_unix_socket
from tests.test_service_http import call, curl

TEXTS = ["The cat sat on the mat.", "A kitten is resting on a small rug.", "Stock markets fell sharply today."]


@pytest.fixture(scope="module")
def minilm_server(minilm: dict[str, Path]) -> Iterator[ServerProc]:
    srv = ServerProc("-m", str(minilm["f16"]), "--embedding", "--log-format", "json")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.kill()


@pytest.fixture(scope="module")
def minilm_api(minilm: dict[str, Path]) -> Iterator[LLM]:
    with LLM(minilm["f16"], n_threads=1, n_ctx=256) as llm:
        yield llm


def api_vectors(llm: LLM, inputs: list[Any], norm: int = 2) -> np.ndarray:
    toks = [llm.tokenize(x, special=True) if isinstance(x, str) else x for x in inputs]
    return np.array(llm.embed_tokens(toks, norm))


def test_openai_sdk_embeddings_on_minilm(minilm_server: ServerProc, minilm_api: LLM) -> None:
    want = api_vectors(minilm_api, TEXTS)
    with openai_over_unix_socket(minilm_server.path) as client:
        r = client.embeddings.create(model="all-minilm", input=TEXTS)  # the SDK asks for base64 and decodes it
        got = np.array([d.embedding for d in r.data])
        assert [d.index for d in r.data] == [0, 1, 2] and r.model == "all-minilm"
        n = sum(len(minilm_api.tokenize(t, special=True)) for t in TEXTS)
        assert r.usage.prompt_tokens == r.usage.total_tokens == n
        assert got.shape == (3, 384) and np.array_equal(got.astype(np.float32), want)
        one = client.embeddings.create(model="x", input="The cat sat on the mat.", encoding_format="float")
        assert np.allclose(one.data[0].embedding, want[0], atol=1e-7)
        toks = client.embeddings.create(model="x", input=[[101, 4937, 102]], encoding_format="float")
        assert np.allclose(toks.data[0].embedding, api_vectors(minilm_api, [[101, 4937, 102]])[0], atol=1e-7)
    # close meanings score higher than unrelated ones
    assert float(want[0] @ want[1]) > float(want[0] @ want[2]) + 0.3


def test_llama_server_shapes_and_protocol_v1(minilm_server: ServerProc, minilm_api: LLM) -> None:
    want = api_vectors(minilm_api, TEXTS[:2])
    body = json.loads(curl(minilm_server, "/embedding", {"content": TEXTS[:2]}))
    assert [e["index"] for e in body] == [0, 1] and len(body[0]["embedding"]) == 1  # [vector] per input
    assert np.allclose([e["embedding"][0] for e in body], want, atol=1e-7)
    raw = json.loads(curl(minilm_server, "/embeddings", {"content": TEXTS[0], "embd_normalize": -1}))
    norm = float(np.linalg.norm(raw[0]["embedding"][0]))
    assert norm > 1.5 and np.allclose(np.array(raw[0]["embedding"][0]) / norm, want[0], atol=1e-6)
    with minilm_server.connect() as c:
        c.send({"type": "embedding", "id": 7, "input": TEXTS[:2]})
        ev = c.event()
    assert ev["event"] == "done" and ev["id"] == 7 and ev["n_tokens"] == [len(minilm_api.tokenize(t, special=True))
                                                                          for t in TEXTS[:2]]
    assert np.allclose(ev["embeddings"], want, atol=1e-7) and ev["pooling"] == "mean" and ev["n_embd"] == 384


def test_errors_name_the_problem_and_the_server_goes_on(minilm_server: ServerProc) -> None:
    status, body = call(minilm_server, "POST", "/v1/embeddings", {"input": " ".join(["word"] * 400)})
    assert status == 400 and "text 0 is 402 tokens, longer than the context of 256" in body["error"]["message"]
    status, body = call(minilm_server, "POST", "/v1/embeddings", {"input": []})
    assert status == 400 and "must be a string" in body["error"]["message"]
    status, body = call(minilm_server, "POST", "/v1/embeddings", {"input": "x", "encoding_format": "hex"})
    assert status == 400 and "float or base64" in body["error"]["message"]
    status, body = call(minilm_server, "POST", "/v1/embeddings", {"texts": ["x"]})
    assert status == 400 and "\"input\" or \"content\"" in body["error"]["message"]
    status, body = call(minilm_server, "POST", "/completion", {"prompt": "Hello", "n_predict": 3})
    assert status == 400 and "is an embedding model (bert)" in body["error"]["message"]
    with minilm_server.connect() as c:
        c.send({"type": "embedding", "id": 1, "input": [[1, 2, 99999999]]})
        ev = c.event()
    assert ev["event"] == "error" and ev["code"] == "bad_request" and "token id outside" in ev["message"]
    status, body = call(minilm_server, "POST", "/v1/embeddings", {"input": "still serving"})
    assert status == 200 and len(body["data"][0]["embedding"]) == 384


@pytest.fixture(scope="module")
def chat_server(smollm2_path: Path) -> Iterator[ServerProc]:
    srv = ServerProc("-m", str(smollm2_path), "--embedding", "--pooling", "mean", "--parallel", "2")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.kill()


def test_a_chat_model_serves_embeddings_and_chat_from_one_server(chat_server: ServerProc, smollm2_path: Path) -> None:
    with LLM(smollm2_path, embedding=True, pooling="mean", n_threads=1, n_ctx=256, n_batch=64) as llm:
        want = api_vectors(llm, TEXTS)
    with openai_over_unix_socket(chat_server.path) as client:
        r = client.embeddings.create(model="smol", input=TEXTS)
        assert np.allclose([d.embedding for d in r.data], want, atol=1e-6)
        c = client.chat.completions.create(model="smol", messages=[{"role": "user", "content": "Hi"}], max_tokens=4,
                                           temperature=0)
        assert c.choices[0].message.content
        r2 = client.embeddings.create(model="smol", input=TEXTS[0])  # after a chat: the same vector
        assert np.allclose(r2.data[0].embedding, want[0], atol=1e-6)


def test_without_embedding_the_routes_say_how_to_turn_it_on(smollm2_path: Path) -> None:
    srv = ServerProc("-m", str(smollm2_path))
    try:
        srv.wait_ready()
        status, body = call(srv, "POST", "/v1/embeddings", {"input": "x"})
        assert status == 501 and "--embedding" in body["error"]["message"]
        with srv.connect() as c:
            c.send({"type": "embedding", "id": 1, "input": "x"})
            ev = c.event()
        assert ev["event"] == "error" and "start it with --embedding" in ev["message"]
    finally:
        srv.kill()


def test_pooling_none_is_not_openais_shape(smollm2_path: Path) -> None:
    srv = ServerProc("-m", str(smollm2_path), "--embedding", "--pooling", "none")
    try:
        srv.wait_ready()
        status, body = call(srv, "POST", "/v1/embeddings", {"input": "x"})
        assert status == 400 and "Pooling type 'none' is not OAI compatible" in body["error"]["message"]
        c = UnixHTTP(srv.path)
        c.request("POST", "/embedding", body=json.dumps({"content": "two words"}))
        per_token = json.loads(c.getresponse().read())
        c.close()
        assert len(per_token[0]["embedding"]) == 2 and len(per_token[0]["embedding"][0]) == 576  # a vector per token
    finally:
        srv.kill()


def test_rerank_routes_sort_documents_by_the_rerankers_scores(tmp_path_factory: pytest.TempPathFactory) -> None:
    from arch_models import write_arch_model

    path = write_arch_model(tmp_path_factory.mktemp("rerank") / "rerank.gguf", "bert-rerank")
    docs = ["the cat sat on the mat", "stock markets fell", "a kitten rests on a rug", "hello"]
    with LLM(path, n_threads=1, n_ctx=256) as llm:
        want = llm.rerank("where is the cat?", docs)
    srv = ServerProc("-m", str(path), "--reranking")
    try:
        srv.wait_ready()
        status, body = call(srv, "POST", "/v1/rerank", {"query": "where is the cat?", "documents": docs, "top_n": 3})
        assert status == 200 and body["object"] == "list" and body["usage"]["prompt_tokens"] > 0
        order = sorted(range(len(docs)), key=lambda i: -want[i])[:3]
        assert [r["index"] for r in body["results"]] == order
        assert np.allclose([r["relevance_score"] for r in body["results"]], [want[i] for i in order], atol=1e-6)
        status, tei = call(srv, "POST", "/rerank", {"query": "where is the cat?", "texts": docs, "return_text": True})
        assert status == 200 and [r["text"] for r in tei] == [docs[i] for i in sorted(range(4), key=lambda i: -want[i])]
        status, body = call(srv, "POST", "/rerank", {"documents": docs})
        assert status == 400 and "query" in body["error"]["message"]
        status, body = call(srv, "POST", "/rerank", {"query": "q", "documents": []})
        assert status == 400 and "non-empty string array" in body["error"]["message"]
    finally:
        srv.kill()


def test_rerank_needs_a_reranker(minilm_server: ServerProc) -> None:
    status, body = call(minilm_server, "POST", "/v1/rerank", {"query": "q", "documents": ["d"]})
    assert status == 501 and "--reranking" in body["error"]["message"]

"""Embeddings as llama-server serves them (with --embedding): /embedding and /embeddings in its own shape
(a list of {index, embedding: [vector, ...]}), OpenAI's /v1/embeddings (a string, strings or token
lists as `input`; `encoding_format` float or base64; `usage`); and reranking (--reranking: a reranker with
pooling rank): /rerank, /v1/rerank (Jina's shape; TEI's with `texts`). One request is one protocol v1
`embedding` request: its texts run together in the engine.
"""

from __future__ import annotations

import base64
from typing import Any

import h11
import numpy as np

from edgellama.service import protocol as P
from edgellama.service.api import NotReady
from edgellama.service.http import fields as F
from edgellama.service.http.connection import HttpConnection
from edgellama.service.http.model_choice import body_model, choose, loaded, model


async def _request(conn: HttpConnection, body: bytes, oai: bool) -> tuple[dict[str, Any], P.Embedding, bool, str]:
    """The body, its protocol v1 request, whether the answer is OpenAI's shape (llama-server: a body with
    `content` instead of `input` is answered in its own shape, whatever the path), and the model's name."""
    obj = F.json_body(body)
    name = body_model(obj)
    if not model(conn, name).embedding:
        raise F.HttpError(501, "This server does not support embeddings. Start it with `--embedding`"
                          if not conn.service.several else f"model {model(conn, name).name} does not serve "
                          "embeddings (embedding = true in its [models.NAME] table)")
    if "input" in obj:
        field = "input"
    elif "content" in obj:
        field, oai = "content", False
    else:
        raise F.HttpError(400, "\"input\" or \"content\" must be provided")
    fmt = obj.get("encoding_format", "float")
    if fmt not in ("float", "base64"):
        raise F.HttpError(400, "The format to return the embeddings in. Can be either float or base64")
    try:
        req = P.parse_embedding(obj[field], obj.get("embd_normalize", 2), conn.next_id(), what=field)
        req.keep_alive = P.keep_alive(obj.get("keep_alive"))
    except P.ProtocolError as exc:
        raise F.HttpError(400, str(exc)) from None
    req.model = name
    m = await loaded(conn, choose(conn, req))
    try:
        pooling = m.pooling()
    except NotReady:
        raise F.HttpError(503, "Loading model") from None
    if oai and pooling == "none":
        raise F.HttpError(400, "Pooling type 'none' is not OAI compatible. Please use a different pooling type "
                          "(serve --pooling mean|cls|last)")
    return obj, req, fmt == "base64", m.name


async def _vectors(conn: HttpConnection, req: P.Embedding) -> dict[str, Any]:
    async for ev in conn.events(req):
        if ev["event"] == "done":
            return ev
    raise F.HttpError(500, "the embedding request ended without an answer")


async def embedding(conn: HttpConnection, req: h11.Request, body: bytes) -> None:
    """/embedding, /embeddings: llama-server's own shape, or OpenAI's when the body has `input`."""
    await _serve(conn, body, oai=False)


async def v1_embeddings(conn: HttpConnection, req: h11.Request, body: bytes) -> None:
    await _serve(conn, body, oai=True)


async def rerank(conn: HttpConnection, req: h11.Request, body: bytes) -> None:
    """llama-server's /rerank: {query, documents (or TEI's texts), top_n} -> results sorted by score."""
    obj = F.json_body(body)
    name = body_model(obj)
    ranking = False
    if model(conn, name).embedding:
        ereq = P.Embedding(id=conn.next_id(), inputs=[], embd_normalize=-1, model=name)
        m = await loaded(conn, choose(conn, ereq))
        try:
            ranking = m.pooling() == "rank"
        except NotReady:
            raise F.HttpError(503, "Loading model") from None
    if not ranking:
        raise F.HttpError(501, "This server does not support reranking. Start it with `--reranking` (a reranker "
                          "model: --embedding --pooling rank)")
    query = obj.get("query")
    if not isinstance(query, str):
        raise F.HttpError(400, "\"query\" must be provided" if query is None else "\"query\" must be a string")
    tei = "texts" in obj
    docs = obj.get("documents", obj.get("texts"))
    if not isinstance(docs, list) or not docs or not all(isinstance(d, str) for d in docs):
        raise F.HttpError(400, "\"documents\" must be a non-empty string array")
    if len(docs) > P.MAX_EMBED_INPUTS:
        raise F.HttpError(400, f"{len(docs)} documents, at most {P.MAX_EMBED_INPUTS} per request")
    top_n = obj.get("top_n", len(docs))
    if isinstance(top_n, bool) or not isinstance(top_n, int) or top_n < 0:
        raise F.HttpError(400, "\"top_n\" must be a non-negative integer")
    try:
        inputs: list[str | list[int]] = [m.rerank_prompt(query, d) for d in docs]
    except NotReady:
        raise F.HttpError(503, "Loading model") from None
    ereq.inputs, ereq.prompt = inputs, query
    ereq.keep_alive = _keep_alive(obj)
    ev = await _vectors(conn, ereq)
    label = "score" if tei else "relevance_score"
    results: list[dict[str, Any]] = [{"index": i, label: float(v[0])} for i, v in enumerate(ev["embeddings"])]
    if tei and obj.get("return_text") is True:
        for r in results:
            r["text"] = docs[r["index"]]
    results.sort(key=lambda r: -float(r[label]))  # stable: equal scores keep document order
    results = results[:top_n]
    if tei:
        conn.respond_json(200, results)
        return
    n = int(ev["tokens_evaluated"])
    conn.respond_json(200, {"model": _answer_model(conn, obj, m.name), "object": "list",
                            "usage": {"prompt_tokens": n, "total_tokens": n}, "results": results})


async def _serve(conn: HttpConnection, body: bytes, oai: bool) -> None:
    obj, ereq, b64, name = await _request(conn, body, oai)
    oai = oai or "input" in obj and "content" not in obj
    ev = await _vectors(conn, ereq)
    vecs: list[Any] = ev["embeddings"]
    if not oai:  # llama-server: each input's vectors as a list (one for a pooled model, one per token with none)
        conn.respond_json(200, [{"index": i, "embedding": v if ev["pooling"] == "none" else [v]}
                                for i, v in enumerate(vecs)])
        return
    data: list[dict[str, Any]] = []
    for i, v in enumerate(vecs):
        if b64:
            raw = np.asarray(v, dtype="<f4").tobytes()
            data.append({"embedding": base64.b64encode(raw).decode("ascii"), "index": i, "object": "embedding",
                         "encoding_format": "base64"})
        else:
            data.append({"embedding": v, "index": i, "object": "embedding"})
    n = int(ev["tokens_evaluated"])
    conn.respond_json(200, {"model": _answer_model(conn, obj, name), "object": "list",
                            "usage": {"prompt_tokens": n, "total_tokens": n}, "data": data})


def _keep_alive(obj: dict[str, Any]) -> float | None:
    try:
        return P.keep_alive(obj.get("keep_alive"))
    except P.ProtocolError as exc:
        raise F.HttpError(400, str(exc)) from None


def _answer_model(conn: HttpConnection, obj: dict[str, Any], name: str) -> str:
    """The `model` an answer names: the model that answered; one model: the client's own name, as before."""
    if not conn.service.several and isinstance(obj.get("model"), str):
        return str(obj["model"])
    return name

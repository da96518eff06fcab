"""llama-server's own endpoints with its field names (tools/server/README.md of llama.cpp): /health,
/metrics, /props, /slots, /completion (SSE when streaming), /tokenize, /detokenize, /apply-template,
/lora-adapters.
"""

from __future__ import annotations

import json
from typing import Any

import h11

from edgellama import params
from edgellama.service import protocol as P
from edgellama.service.api import ModelView, NotReady, Tokenizer
from edgellama.service.http import fanout
from edgellama.service.http import fields as F
from edgellama.service.http.connection import HttpConnection
from edgellama.service.http.model_choice import body_model, choose_all, loaded, model, query_model


def sse(obj: Any) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode("utf-8") + b"\n\n"


def _tokenizer(m: ModelView) -> Tokenizer:
    """The loaded model's tokenizer, or 503 while it loads."""
    try:
        return m.tokenizer()
    except NotReady:
        raise F.HttpError(503, "Loading model") from None


async def health(conn: HttpConnection, req: h11.Request, body: bytes) -> None:
    if conn.service.stopping:
        raise F.HttpError(503, "Server is stopping")
    name = query_model(req)
    if name is None or not conn.service.several:
        if conn.service.status != "ok":
            raise F.HttpError(503, "Loading model")
        out: dict[str, Any] = {"status": "ok"}
        if conn.service.several:
            out["models"] = {i.name: i.state for i in conn.service.model_list()}
        conn.respond_json(200, out)
        return
    m = model(conn, name)
    if m.status == "loading":
        raise F.HttpError(503, f"Loading model {m.name}")
    if m.status == "failed":
        raise F.HttpError(503, f"model {m.name} failed: {m.reason}")
    conn.respond_json(200, {"status": m.status, "model": m.name})


async def metrics(conn: HttpConnection, req: h11.Request, body: bytes) -> None:
    conn.respond(200, conn.service.metrics_text().encode(), b"text/plain; version=0.0.4; charset=utf-8")


def default_params(conn: HttpConnection, req: P.Completion | None = None) -> dict[str, Any]:
    """A request's sampling settings by llama-server's names (protocol v1's defaults when req is None)."""
    r = req if req is not None else P.Completion(id=0)
    return {**params.as_dict(r), "max_tokens": conn.service.max_tokens, "stream": r.stream, "n_probs": 0,
            "cache_prompt": r.cache_prompt,
            "samplers": ["penalties", "mirostat"] if r.mirostat else ["penalties", "top_k", "top_p", "min_p",
                                                                       "temperature"],
            "lora": [{"id": i, "scale": sc} for i, sc in r.lora or []]}  # the request's own, as llama-server


def slots(conn: HttpConnection, m: ModelView) -> list[dict[str, Any]]:
    snap = m.snapshot()
    reqs = m.slot_requests()  # each slot's request, None while idle
    out = []
    for i in range(snap["slots"]):
        r = reqs[i] if i < len(reqs) else None
        out.append({"id": i, "n_ctx": snap["n_ctx"], "speculative": False, "is_processing": r is not None,
                    "params": default_params(conn, r)})
    return out


async def get_slots(conn: HttpConnection, req: h11.Request, body: bytes) -> None:
    conn.respond_json(200, slots(conn, model(conn, query_model(req))))


async def props(conn: HttpConnection, req: h11.Request, body: bytes) -> None:
    m = model(conn, query_model(req))
    facts = m.model_facts()
    template = facts.chat_template if facts is not None else ""
    snap = m.snapshot()
    from edgellama import __version__

    out = {
        "default_generation_settings": {"id": 0, "n_ctx": snap["n_ctx"], "speculative": False,
                                        "is_processing": False, "params": default_params(conn)},
        "total_slots": snap["slots"], "model_path": m.model_path, "chat_template": template,
        "modalities": {"vision": False, "audio": False}, "build_info": f"edgellama {__version__}",
        "is_sleeping": False}
    if conn.service.several:
        out |= {"model": m.name, "status": m.status}
    conn.respond_json(200, out)


def completion_result(conn: HttpConnection, req: P.Completion, done: dict[str, Any], content: str,
                      text: str) -> dict[str, Any]:
    """protocol v1's done -> llama-server's /completion result fields (content: this event's text; text:
    the whole answer)."""
    out: dict[str, Any] = {
        "index": 0, "content": content, "id_slot": 0, "stop": True, "model": done.get("model", req.model),
        "tokens_predicted": done.get("tokens_predicted", 0), "tokens_evaluated": done.get("tokens_evaluated", 0),
        "tokens_cached": done.get("tokens_cached", 0), "generation_settings": default_params(conn, req),
        "prompt": req.prompt, "has_new_line": "\n" in text, "truncated": done.get("stop_reason") == "context",
        "stop_type": F.STOP_TYPE.get(done["stop_reason"], "none"), "timings": F.llama_timings(done)}
    if req.probs_wanted >= 0:
        out["completion_probabilities"] = done.get("probs", [])
    if done["stop_reason"] == "stop" and len(req.stop) == 1:  # the event does not say which of several hit
        out["stopping_word"] = req.stop[0]
    elif done["stop_reason"] != "stop":
        out["stopping_word"] = ""
    return out


async def completion(conn: HttpConnection, req: h11.Request, body: bytes) -> None:
    """POST /completion: one prompt answers one result; several (a list of prompts) an array of results,
    streamed as their chunks come, each with its `index`."""
    obj = F.json_body(body)
    creqs = [F.parse_v1(F.llama_completion(obj, conn.next_id(), p)) for p in F.prompts(obj.get("prompt"))]
    choose_all(conn, creqs)
    texts: list[list[str]] = [[] for _ in creqs]
    results: dict[int, dict[str, Any]] = {}
    async for i, ev in fanout.merged(conn, creqs):
        creq = creqs[i]
        if ev["event"] == "token":
            if not conn.response_started:
                conn.start_stream()
            texts[i].append(ev["text"])
            chunk = {"index": i, "content": ev["text"], "stop": False, "id_slot": 0, "tokens_predicted": len(texts[i])}
            if creq.probs_wanted >= 0:
                chunk["completion_probabilities"] = ev.get("probs", [])
            conn.write(sse(chunk))
        elif ev["event"] == "done":
            if creq.stream:
                if not conn.response_started:
                    conn.start_stream()
                conn.write(sse(completion_result(conn, creq, ev, "", "".join(texts[i])) | {"index": i}))
            else:
                results[i] = completion_result(conn, creq, ev, ev.get("content", ""), ev.get("content", "")) | {
                    "index": i}
    if creqs[0].stream:
        conn.end_stream()
    elif len(creqs) == 1:
        conn.respond_json(200, results[0])
    else:
        conn.respond_json(200, [results[i] for i in sorted(results)])


async def tokenize(conn: HttpConnection, req: h11.Request, body: bytes) -> None:
    obj = F.json_body(body)
    content = obj.get("content")
    if not isinstance(content, str):
        raise F.HttpError(400, "field 'content' must be a string")
    flags = {}
    for name, default in (("add_special", False), ("parse_special", True), ("with_pieces", False)):
        v = obj.get(name, default)
        if not isinstance(v, bool):
            raise F.HttpError(400, f"field {name!r} must be true or false")
        flags[name] = v
    tok = _tokenizer(await loaded(conn, body_model(obj)))
    ids = tok.encode(content, add_special=flags["add_special"], parse_special=flags["parse_special"])
    if not flags["with_pieces"]:
        conn.respond_json(200, {"tokens": ids})
        return
    pieces = []
    for t in ids:
        b = tok.token_bytes(t)
        try:
            piece: Any = b.decode("utf-8")
        except UnicodeDecodeError:  # part of a character: its bytes, as llama-server does
            piece = list(b)
        pieces.append({"id": t, "piece": piece})
    conn.respond_json(200, {"tokens": pieces})


async def detokenize(conn: HttpConnection, req: h11.Request, body: bytes) -> None:
    obj = F.json_body(body)
    ids = obj.get("tokens")
    tok = _tokenizer(await loaded(conn, body_model(obj)))
    if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
        raise F.HttpError(400, "field 'tokens' must be a list of token ids")
    bad = [t for t in ids if not 0 <= t < tok.n_vocab]
    if bad:
        raise F.HttpError(400, f"token id {bad[0]} out of range for a vocabulary of {tok.n_vocab}")
    conn.respond_json(200, {"content": tok.decode(ids, strip_space_prefix=False)})


def chat_prompt(m: ModelView, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> str:
    """The text a chat request is evaluated as (the model's --system-prompt added as the scheduler does)."""
    try:
        return m.chat_prompt(messages, tools)
    except NotReady:
        raise F.HttpError(503, "Loading model") from None
    except P.ProtocolError as exc:
        raise F.from_protocol_error(exc.code, str(exc)) from None


async def get_lora_adapters(conn: HttpConnection, req: h11.Request, body: bytes) -> None:
    """llama-server's list of the adapters loaded at start (serve --lora / --lora-scaled), by number, at
    the scales requests without a `lora` field run with (?model=NAME: that model's)."""
    m = await loaded(conn, query_model(req))
    conn.respond_json(200, [{"id": i, "path": ad.path, "scale": ad.scale,
                             "task_name": ad.task_name, "prompt_prefix": ad.prompt_prefix}
                            for i, ad in enumerate(m.lora_adapters())])


async def post_lora_adapters(conn: HttpConnection, req: h11.Request, body: bytes) -> None:
    """llama-server's global adapter scales: the listed adapters at their scales, the others at 0, for
    requests admitted from now on without a `lora` field; an unknown id is a 400 and changes nothing."""
    m = await loaded(conn, query_model(req))
    lora = F.lora_list(F.json_value(body))
    try:
        m.set_lora_defaults(lora)
    except NotReady:
        raise F.HttpError(503, "Loading model") from None
    except P.ProtocolError as exc:
        raise F.from_protocol_error(exc.code, str(exc)) from None
    conn.respond_json(200, {"success": True})


async def apply_template(conn: HttpConnection, req: h11.Request, body: bytes) -> None:
    obj = F.json_body(body)
    # protocol v1's checks of the messages (roles, shapes) and tools (their schemas too), as a chat request's
    v1 = {"id": 0, "messages": F.chat_messages(obj.get("messages"))}
    v1.update({k: obj[k] for k in ("tools", "tool_choice") if obj.get(k) is not None})
    creq = F.parse_v1(v1)
    assert creq.messages is not None
    tools = creq.tools if creq.tool_choice != "none" else None
    conn.respond_json(200, {"prompt": chat_prompt(await loaded(conn, body_model(obj)), creq.messages, tools)})

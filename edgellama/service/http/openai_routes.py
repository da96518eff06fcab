"""OpenAI's endpoints as llama-server serves them: /v1/completions, /v1/chat/completions
(streams end with `data: [DONE]`; `usage`, `finish_reason`, and llama-server's `timings`).
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import h11

from edgellama.logprobs import openai_chat_content, openai_completion_logprobs
from edgellama.service import protocol as P
from edgellama.service.http import fields as F
from edgellama.service.http.connection import HttpConnection
from edgellama.service.http.llama_routes import sse
from edgellama.service.http.model_choice import choose

DONE = b"data: [DONE]\n\n"


def _stream_options(obj: dict[str, Any]) -> bool:
    so = obj.get("stream_options")
    if so is None:
        return False
    if not isinstance(so, dict) or not isinstance(so.get("include_usage", False), bool):
        raise F.HttpError(400, "field 'stream_options' must be {\"include_usage\": true|false}")
    return bool(so.get("include_usage", False))


async def _serve(conn: HttpConnection, obj: dict[str, Any], creq: P.Completion, chat: bool) -> None:
    include_usage = _stream_options(obj)
    rid = ("chatcmpl-" if chat else "cmpl-") + secrets.token_urlsafe(16)
    base = {"id": rid, "created": int(time.time()), "model": choose(conn, creq),
            "object": "chat.completion.chunk" if chat else "text_completion", "system_fingerprint": "edgellama"}

    wants = creq.probs_wanted >= 0
    offset = [0]  # completions' text_offset runs on across chunks

    def logprobs(entries: list[dict[str, Any]]) -> dict[str, Any] | None:
        if not wants:
            return None
        if chat:
            return {"content": openai_chat_content(entries)}
        out = openai_completion_logprobs(entries, offset[0])
        offset[0] += sum(len(e["token"]) for e in entries)
        return out

    def chunk(piece: str | None, finish: str | None, role: bool = False,
              entries: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        lp = logprobs(entries or []) if entries is not None else None
        if chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else (
                {"content": piece} if piece is not None else {})
            choice: dict[str, Any] = {"index": 0, "delta": delta, "logprobs": lp, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": piece or "", "logprobs": lp, "finish_reason": finish}
        return base | {"choices": [choice]}

    def begin() -> None:
        if not conn.response_started:
            conn.start_stream()
            if chat:
                conn.write(sse(chunk(None, None, role=True)))

    async for ev in conn.events(creq):
        if ev["event"] == "token":
            begin()
            conn.write(sse(chunk(ev["text"], None, entries=ev.get("probs", []))))
        elif ev["event"] == "done":
            finish = F.FINISH_REASON.get(ev["stop_reason"], "stop")
            if creq.stream:
                begin()
                conn.write(sse(chunk(None, finish, entries=ev.get("probs") if ev.get("probs") else None)
                               | {"timings": F.llama_timings(ev)}))
                if include_usage:
                    conn.write(sse(base | {"choices": [], "usage": F.usage(ev)}))
                conn.write(DONE)
                conn.end_stream()
                return
            text = ev.get("content", "")
            choice: dict[str, Any] = {"index": 0, "logprobs": logprobs(ev.get("probs", [])), "finish_reason": finish}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            conn.respond_json(200, base | {"object": "chat.completion" if chat else "text_completion",
                                           "choices": [choice], "usage": F.usage(ev),
                                           "timings": F.llama_timings(ev)})


async def completions(conn: HttpConnection, req: h11.Request, body: bytes) -> None:
    obj = F.json_body(body)
    creq = F.parse_v1(F.openai_completion(obj, conn.next_id()))
    await _serve(conn, obj, creq, chat=False)


async def chat_completions(conn: HttpConnection, req: h11.Request, body: bytes) -> None:
    obj = F.json_body(body)
    creq = F.parse_v1(F.openai_chat(obj, conn.next_id()))
    await _serve(conn, obj, creq, chat=True)

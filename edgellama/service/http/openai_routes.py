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
from edgellama.service.http import fanout
from edgellama.service.http import fields as F
from edgellama.service.http.connection import HttpConnection
from edgellama.service.http.llama_routes import sse
from edgellama.service.http.model_choice import choose_all

DONE = b"data: [DONE]\n\n"


def _stream_options(obj: dict[str, Any]) -> bool:
    so = obj.get("stream_options")
    if so is None:
        return False
    if not isinstance(so, dict) or not isinstance(so.get("include_usage", False), bool):
        raise F.HttpError(400, "field 'stream_options' must be {\"include_usage\": true|false}")
    return bool(so.get("include_usage", False))


def _finish(done: dict[str, Any]) -> str:
    """finish_reason: tool_calls for a reply that ended with its calls (a call cut by the limit: length)."""
    reason = F.FINISH_REASON.get(done["stop_reason"], "stop")
    return "tool_calls" if done.get("tool_calls") and reason != "length" else reason


def _requests(conn: HttpConnection, v1s: list[dict[str, Any]]) -> list[P.Completion]:
    """The mapped requests checked by protocol v1; one model answers them all (an alias picks it once)."""
    creqs = [F.parse_v1(v) for v in v1s]
    choose_all(conn, creqs)
    return creqs


async def _serve(conn: HttpConnection, obj: dict[str, Any], creqs: list[P.Completion], chat: bool) -> None:
    """The choices of creqs (one per prompt and per n), streamed as they come or answered at once."""
    include_usage = _stream_options(obj)
    rid = ("chatcmpl-" if chat else "cmpl-") + secrets.token_urlsafe(16)
    base = {"id": rid, "created": int(time.time()), "model": creqs[0].model,
            "object": "chat.completion.chunk" if chat else "text_completion", "system_fingerprint": "edgellama"}
    wants = creqs[0].probs_wanted >= 0
    offsets = [0] * len(creqs)  # completions' text_offset runs on across a choice's chunks

    def logprobs(i: int, entries: list[dict[str, Any]]) -> dict[str, Any] | None:
        if not wants:
            return None
        if chat:
            return {"content": openai_chat_content(entries)}
        out = openai_completion_logprobs(entries, offsets[i])
        offsets[i] += sum(len(e["token"]) for e in entries)
        return out

    def chunk(i: int, piece: str | None, finish: str | None, role: bool = False,
              entries: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        lp = logprobs(i, entries) if entries is not None else None
        if chat:
            delta: dict[str, Any] = {"role": "assistant", "content": ""} if role else (
                {"content": piece} if piece is not None else {})
            choice: dict[str, Any] = {"index": i, "delta": delta, "logprobs": lp, "finish_reason": finish}
        else:
            choice = {"index": i, "text": piece or "", "logprobs": lp, "finish_reason": finish}
        return base | {"choices": [choice]}

    begun: set[int] = set()

    def begin(i: int) -> None:
        if not conn.response_started:
            conn.start_stream()
        if chat and i not in begun:
            conn.write(sse(chunk(i, None, None, role=True)))
        begun.add(i)

    dones: dict[int, dict[str, Any]] = {}
    async for i, ev in fanout.merged(conn, creqs):
        if ev["event"] == "token":
            begin(i)
            conn.write(sse(chunk(i, ev["text"], None, entries=ev.get("probs", []))))
        elif ev["event"] == "tool_calls":  # a call's id and name, then its arguments as they are written
            begin(i)
            conn.write(sse(base | {"choices": [{"index": i, "delta": {"tool_calls": ev["tool_calls"]},
                                                "logprobs": logprobs(i, ev.get("probs", [])), "finish_reason": None}]}))
        elif ev["event"] == "done":
            dones[i] = ev
            if creqs[i].stream:
                begin(i)
                conn.write(sse(chunk(i, None, _finish(ev), entries=ev.get("probs") or None)
                               | {"timings": F.llama_timings(ev)}))
    usage = F.usage_of([dones[i] for i in sorted(dones)])
    if creqs[0].stream:
        if include_usage:
            conn.write(sse(base | {"choices": [], "usage": usage}))
        conn.write(DONE)
        conn.end_stream()
        return
    choices = []
    for i in sorted(dones):
        ev = dones[i]
        text = ev.get("content", "")
        choice: dict[str, Any] = {"index": i, "logprobs": logprobs(i, ev.get("probs", [])), "finish_reason": _finish(ev)}
        if chat:
            choice["message"] = {"role": "assistant", "content": text}
            if ev.get("tool_calls"):
                choice["message"] = {"role": "assistant", "content": text or None, "tool_calls": ev["tool_calls"]}
        else:
            choice["text"] = text
        choices.append(choice)
    conn.respond_json(200, base | {"object": "chat.completion" if chat else "text_completion", "choices": choices,
                                   "usage": usage, "timings": F.llama_timings(dones[0])})


async def completions(conn: HttpConnection, req: h11.Request, body: bytes) -> None:
    """POST /v1/completions: each prompt (a string, token ids, or a list of either) n times, choices in order."""
    obj = F.json_body(body)
    n = F.n_choices(obj)
    v1s: list[dict[str, Any]] = []
    for prompt in F.prompts(obj.get("prompt")):
        v1s += F.copies(F.openai_completion(obj, conn.next_id(), prompt), n, conn.next_id)
    await _serve(conn, obj, _requests(conn, v1s), chat=False)


async def chat_completions(conn: HttpConnection, req: h11.Request, body: bytes) -> None:
    obj = F.json_body(body)
    v1s = F.copies(F.openai_chat(obj, conn.next_id()), F.n_choices(obj), conn.next_id)
    await _serve(conn, obj, _requests(conn, v1s), chat=True)

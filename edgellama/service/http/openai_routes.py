"""OpenAI's endpoints as llama-server serves them: /v1/completions, /v1/chat/completions
(streams end with `data: [DONE]`; `usage`, `finish_reason`, and llama-server's `timings`).
"""

from __future__ import annotations

import secrets
import time
from typing import Any

import h11

from edgellama.openai_shapes import OpenAIShaper, finish_reason
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
    return finish_reason(done["stop_reason"], bool(done.get("tool_calls")))


def _requests(conn: HttpConnection, v1s: list[dict[str, Any]]) -> list[P.Completion]:
    """The mapped requests checked by protocol v1; one model answers them all (an alias picks it once)."""
    creqs = [F.parse_v1(v) for v in v1s]
    choose_all(conn, creqs)
    return creqs


async def _serve(conn: HttpConnection, obj: dict[str, Any], creqs: list[P.Completion], chat: bool) -> None:
    """The choices of creqs (one per prompt and per n), streamed as they come or answered at once."""
    include_usage = _stream_options(obj)
    rid = ("chatcmpl-" if chat else "cmpl-") + secrets.token_urlsafe(16)
    shape = OpenAIShaper(chat, rid, int(time.time()), creqs[0].model, creqs[0].probs_wanted >= 0)
    begun: set[int] = set()

    def begin(i: int) -> None:
        if not conn.response_started:
            conn.start_stream()
        if chat and i not in begun:
            conn.write(sse(shape.role(i)))
        begun.add(i)

    dones: dict[int, dict[str, Any]] = {}
    async for i, ev in fanout.merged(conn, creqs):
        if ev["event"] == "token":
            begin(i)
            conn.write(sse(shape.text(i, ev["text"], ev.get("probs", []))))
        elif ev["event"] == "tool_calls":  # a call's id and name, then its arguments as they are written
            begin(i)
            conn.write(sse(shape.tool_calls(i, ev["tool_calls"], ev.get("probs", []))))
        elif ev["event"] == "done":
            dones[i] = ev
            if creqs[i].stream:
                begin(i)
                conn.write(sse(shape.finish(i, _finish(ev), ev.get("probs") or None, F.llama_timings(ev))))
    used = F.usage_of([dones[i] for i in sorted(dones)])
    if creqs[0].stream:
        if include_usage:
            conn.write(sse(shape.usage_chunk(used)))
        conn.write(DONE)
        conn.end_stream()
        return
    choices = [shape.choice(i, dones[i].get("content", ""), _finish(dones[i]), dones[i].get("probs", []),
                            dones[i].get("tool_calls")) for i in sorted(dones)]
    conn.respond_json(200, shape.reply(choices, used, F.llama_timings(dones[0])))


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

"""OpenAI's completion and chat shapes, built in one place for the Python API (completion.py) and the HTTP
routes (service/http/openai_routes.py), so the same request gives the same JSON through both apart from
`id`, `created` and the timings' values: the head of every object, a stream's chunks (the role, text, tool
call deltas, the finish), a whole reply's choices, `usage` and llama-server's `timings`, the finish reason
(tool_calls when a reply ended with calls) and the log-probabilities with their running text offsets.

Knows shapes only: pieces of text, log-probability items (logprobs.py's llama-server items), calls' deltas.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from edgellama.logprobs import openai_chat_content, openai_completion_logprobs

# a generation's stop reason (generation.py) -> OpenAI's finish_reason
FINISH = {"eos": "stop", "stop": "stop", "length": "length", "context": "length", "cancelled": "stop"}
FINGERPRINT = "edgellama"


def finish_reason(stop_reason: str | None, calls: bool = False) -> str:
    """finish_reason of a reply: tool_calls when it ended with its calls (a call cut by the limit: length)."""
    reason = FINISH.get(stop_reason or "stop", "stop")
    return "tool_calls" if calls and reason != "length" else reason


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict[str, Any]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def llama_timings(cache_n: int, prompt_n: int, prompt_ms: float, predicted_n: int, predicted_ms: float) -> dict[str, Any]:
    """llama-server's `timings` object."""
    return {"cache_n": cache_n, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": 1000.0 * prompt_n / prompt_ms if prompt_ms else 0.0,
            "predicted_n": predicted_n, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / predicted_n if predicted_n else 0.0,
            "predicted_per_second": 1000.0 * predicted_n / predicted_ms if predicted_ms else 0.0}


class OpenAIShaper:
    """The objects of one OpenAI request (several choices: index i), chat or completion."""

    def __init__(self, chat: bool, rid: str, created: int, model: str | None, logprobs: bool) -> None:
        self.chat = chat
        self.logprobs_wanted = logprobs
        self.head = {"id": rid, "created": created, "model": model,
                     "object": "chat.completion.chunk" if chat else "text_completion",
                     "system_fingerprint": FINGERPRINT}
        self.offsets: dict[int, int] = defaultdict(int)  # completions' text_offset runs on across chunks

    def logprobs(self, i: int, entries: list[dict[str, Any]] | None) -> dict[str, Any] | None:
        if not self.logprobs_wanted or entries is None:
            return None
        if self.chat:
            return {"content": openai_chat_content(entries)}
        out = openai_completion_logprobs(entries, self.offsets[i])
        self.offsets[i] += sum(len(e["token"]) for e in entries)
        return out

    # a stream

    def chunk(self, i: int, delta: dict[str, Any] | None = None, text: str = "", finish: str | None = None,
              entries: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        """One chunk: a chat delta (role, content, tool_calls) or a completion's text piece."""
        lp = self.logprobs(i, entries)
        if self.chat:
            choice: dict[str, Any] = {"index": i, "delta": delta or {}, "logprobs": lp, "finish_reason": finish}
        else:
            choice = {"index": i, "text": text, "logprobs": lp, "finish_reason": finish}
        return self.head | {"choices": [choice]}

    def role(self, i: int) -> dict[str, Any]:
        # llama-cpp-python's first delta (no content key: its scripts join delta.get("content", ""))
        return self.chunk(i, {"role": "assistant"})

    def text(self, i: int, piece: str, entries: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        return self.chunk(i, {"content": piece} if piece else {}, piece, None, entries)

    def tool_calls(self, i: int, deltas: list[dict[str, Any]], entries: list[dict[str, Any]] | None = None
                   ) -> dict[str, Any]:
        return self.chunk(i, {"tool_calls": deltas}, "", None, entries)

    def finish(self, i: int, reason: str, entries: list[dict[str, Any]] | None = None,
               timings: dict[str, Any] | None = None) -> dict[str, Any]:
        out = self.chunk(i, {}, "", reason, entries)
        return out | {"timings": timings} if timings is not None else out

    def usage_chunk(self, used: dict[str, Any]) -> dict[str, Any]:
        return self.head | {"choices": [], "usage": used}

    # a whole reply

    def choice(self, i: int, text: str, reason: str, entries: list[dict[str, Any]] | None,
               calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {"index": i, "logprobs": self.logprobs(i, entries), "finish_reason": reason}
        if self.chat:
            out["message"] = {"role": "assistant", "content": text}
            if calls:
                out["message"] = {"role": "assistant", "content": text or None, "tool_calls": calls}
        else:
            out["text"] = text
        return out

    def reply(self, choices: list[dict[str, Any]], used: dict[str, Any], timings: dict[str, Any]) -> dict[str, Any]:
        return self.head | {"object": "chat.completion" if self.chat else "text_completion", "choices": choices,
                            "usage": used, "timings": timings}

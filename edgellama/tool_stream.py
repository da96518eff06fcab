"""A reply with tools as it is written, for every front end that streams one (the service's slots, the
Python API): the text that can no longer be part of a call, released as content, and each call's OpenAI
deltas (its index, id and name once the name is written, then its arguments' JSON text as the model writes
it). A call's final arguments are the model's own text (tool_calls.parse_reply keeps it), so the deltas add
up to the call the reply parses into. Calls stream as they are written only where the call grammar holds
them (`live`); otherwise each arrives whole at the end.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edgellama.generation import StopStrings
from edgellama.tool_calls import (
    HOLD_JSON,
    TRIGGERS,
    ToolCall,
    call_id,
    call_parts,
    generic_response,
    parse_reply,
    scan,
    skip_space,
)


@dataclass
class Finished:
    """What a reply ends with: the content not yet released, the last call deltas, the whole content and
    the calls (as streamed, a call cut short by the token limit included)."""
    rest: str
    deltas: list[dict[str, Any]]
    content: str
    calls: list[ToolCall] = field(default_factory=list)

    def finish_reason(self, reason: str) -> str:
        """OpenAI's finish_reason: tool_calls for a reply that ended with its calls, else reason (length)."""
        return "tool_calls" if self.calls and reason != "length" else reason


class ToolStream:
    def __init__(self, fmt: str, tools: list[dict[str, Any]], live: bool = True) -> None:
        self.fmt, self.tools, self.live = fmt, tools, live
        self.names = {t["function"]["name"] for t in tools}
        self.text = ""
        self.markers = StopStrings(TRIGGERS.get(fmt, ()))  # content ends where a call's marker begins
        self.released = 0  # characters of text released as content (not the generic format's: its JSON)
        self.shown = ""  # the content released so far
        self.sent: list[list[str]] = []  # per call streamed: [id, name, arguments so far]

    def feed(self, piece: str) -> tuple[str, list[dict[str, Any]]]:
        """The reply's next text -> (content to release now, call deltas to send now)."""
        self.text += piece
        content = self._content()
        self.shown += content
        return content, self._deltas(self._partial_calls()) if self.live else []

    def finish(self) -> Finished:
        content, calls = parse_reply(self.text, self.fmt, self.tools)
        deltas: list[dict[str, Any]] = []
        final: list[ToolCall] = []
        for k, call in enumerate(calls):
            if k < len(self.sent):
                ref, name, args = self.sent[k]
                if call.name != name or not call.arguments.startswith(args):
                    break  # not what was streamed (cannot happen under the call grammar): the streamed stands
                if call.arguments != args:
                    deltas.append({"index": k, "function": {"arguments": call.arguments[len(args):]}})
                final.append(ToolCall(name, call.arguments, ref))
            else:
                deltas.append({"index": k, **call.openai()})
                final.append(call)
        final += [ToolCall(name, args, ref) for ref, name, args in self.sent[len(final):]]
        if self.sent and not calls:  # a call cut short (the token limit): it stands as streamed
            content = self.shown
        rest = content[len(self.shown):] if content.startswith(self.shown) else ""
        return Finished(rest, deltas, content, final)

    # content

    def _content(self) -> str:
        if self.fmt == "generic":
            return self._response_text()
        if not self.markers.stops or (self.fmt in HOLD_JSON and self.released == 0
                                      and self.text.lstrip()[:1] in ("", "{")):
            return ""  # a reply that may be a bare JSON call is held until it ends
        # what is released never reaches a marker nor the start of one, so once a call began its marker
        # opens the unreleased text and nothing more is released
        out, _, _ = self.markers.split(self.text[self.released:], final=False)
        self.released += len(out)
        return out

    def _response_text(self) -> str:
        """The generic format's answer {"response": "..."}: the string as far as it is written."""
        text = generic_response(self.text)
        return text[len(self.shown):] if text is not None and text.startswith(self.shown) else ""

    # calls

    def _partial_calls(self) -> list[tuple[str | None, str | None]]:
        """(name once written, arguments' text so far) of each call begun, in order."""
        text, out = self.text, []
        starts: list[int] = []
        if self.fmt == "hermes":
            at = min((text.find(t) for t in TRIGGERS["hermes"] if t in text), default=-1)
            while at >= 0:
                marker = "<tool_call>" if text.startswith("<tool_call>", at) else "```json"
                j = skip_space(text, at + len(marker))
                if text[j:j + 1] != "{":
                    break
                starts.append(j)
                end = scan(text, j)[1]
                if end is None or end < 0 or marker == "```json":
                    break
                at = text.find("<tool_call>", end)
        elif self.fmt == "llama3":
            tag = text.find("<|python_tag|>")
            j = skip_space(text, tag + len("<|python_tag|>") if tag >= 0 else 0)
            while text[j:j + 1] == "{":
                starts.append(j)
                end = scan(text, j)[1]
                if end is None or end < 0:
                    break
                j = skip_space(text, end, ";")
        elif self.fmt == "mistral":
            at = text.find("[TOOL_CALLS]")
            j = skip_space(text, at + len("[TOOL_CALLS]")) if at >= 0 else len(text)
            if text[j:j + 1] == "[":
                starts = [s for _, s, _ in scan(text, j)[0] if text[s:s + 1] == "{"]
        else:
            j = skip_space(text, 0)
            if text[j:j + 1] == "{":
                starts = [s for k, s, _ in scan(text, j)[0] if k == "tool_call" and text[s:s + 1] == "{"]
        for j in starts:
            name, args, _, _ = call_parts(text, j)
            out.append((name, None if args is None else text[args[0]:args[1] if args[1] is not None else len(text)]))
        return out

    def _deltas(self, partial: list[tuple[str | None, str | None]]) -> list[dict[str, Any]]:
        deltas: list[dict[str, Any]] = []
        for k, (name, args) in enumerate(partial):
            if name is None or name not in self.names:
                break
            delta: dict[str, Any] = {}
            if k == len(self.sent):
                self.sent.append([call_id(self.fmt), name, ""])
                delta = {"id": self.sent[k][0], "type": "function", "function": {"name": name, "arguments": ""}}
            so_far = self.sent[k][2]
            if args is not None and len(args) > len(so_far) and args.startswith(so_far):
                delta.setdefault("function", {})["arguments"] = args[len(so_far):]
                self.sent[k][2] = args
            if delta:
                deltas.append({"index": k, **delta})
        return deltas

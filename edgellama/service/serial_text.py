"""Text mode of a serial port: a line is a prompt (or a chat turn with --chat) or a /command; the answer
streams back as plain text and ends with the end marker line, or with one `ERR <code> <message>` line.

It speaks to the server only through protocol v1 request objects (so every limit and check is the
socket's) and turns the events back into text; it never touches the wire or the engine.
"""

from __future__ import annotations

import json
import secrets
from collections import deque
from collections.abc import Callable
from typing import Any

from edgellama.service import protocol as P
from edgellama.service.serial_config import PortConfig

# the protocol fields /set may change for this port's later prompts
SETTABLE = P.PARAM_FIELDS
PENDING_MAX = 4  # lines received while an answer streams, answered after it in order
HELP = ("commands: /reset (forget the conversation), /cancel (stop the answer), /health, "
        "/set [KEY VALUE] (sampling for later prompts: " + " ".join(SETTABLE) + "), /help; "
        "a prompt that starts with / is written //")


class TextSession:
    """One port's text conversation: every line gets exactly one reply, in the order received."""

    def __init__(self, cfg: PortConfig, submit: Callable[[dict[str, Any]], None],
                 write: Callable[..., None]) -> None:
        self.chat = cfg.chat
        self.eol = "\r\n" if cfg.eol == "crlf" else "\n"
        self.encoding = cfg.encoding
        self.marker = "\x04" if cfg.end_marker.upper() == "EOT" else cfg.end_marker
        self.submit = submit
        self.write = write
        self.history: list[dict[str, str]] = []
        self.settings: dict[str, Any] = {}
        self.current: str | None = None  # id of the prompt or /health being answered
        self.user_text = ""
        self.answer: list[str] = []
        self.cancel_reason: str | None = None
        self.pending: deque[tuple[str, Any, str]] = deque()  # ("line", bytes, "") or ("err", code, message)
        self.at_line_start = True
        self.n = 0
        # request ids of this session: a JSON client on the same port (auto mode) cannot guess them
        self.id_prefix = f"text-{secrets.token_hex(4)}-"

    def owns(self, req_id: Any) -> bool:
        return req_id is not None and req_id == self.current

    # ---- lines in ----
    def handle(self, line: bytes) -> None:
        if line.strip() == b"/cancel":  # the one command that does not wait for the answer it ends
            self._cancel()
        elif self.current is not None or self.pending:
            self._queue(("line", line, ""))
        else:
            self._run(line)

    def error(self, code: str, message: str) -> None:
        """A wire fault's reply (half line, long line, framing error), in turn with the other replies."""
        if self.current is not None or self.pending:
            self._queue(("err", code, message))
        else:
            self._err(code, message)

    def _queue(self, item: tuple[str, Any, str]) -> None:
        if len(self.pending) >= PENDING_MAX:
            self._err(P.BUSY, f"{PENDING_MAX} lines already wait for the answer in progress; line dropped")
        else:
            self.pending.append(item)

    def _next(self) -> None:
        while self.current is None and self.pending:
            kind, a, b = self.pending.popleft()
            if kind == "err":
                self._err(a, b)
            else:
                self._run(a)

    def _run(self, line: bytes) -> None:
        try:
            text = line.decode(self.encoding)
        except UnicodeDecodeError as exc:
            self._err(P.BAD_REQUEST, f"the line is not valid {self.encoding} (byte {exc.start})")
            return
        bad = next((i for i, c in enumerate(text) if (ord(c) < 32 and c != "\t") or ord(c) == 127), None)
        if bad is not None:
            self._err(P.BAD_REQUEST, f"the line holds control byte 0x{ord(text[bad]):02x} at column {bad + 1}")
            return
        text = text.strip()
        if not text:
            return
        if text.startswith("/") and not text.startswith("//"):
            self._command(text)
        else:
            self._prompt(text[1:] if text.startswith("//") else text)

    def _command(self, text: str) -> None:
        cmd, _, rest = text.partition(" ")
        if cmd == "/reset":
            self.history.clear()
            self._reply("OK conversation cleared")
        elif cmd == "/health":
            self.n += 1
            self.current = f"{self.id_prefix}health-{self.n}"
            self.submit({"type": "health", "id": self.current})
        elif cmd == "/set":
            self._set(rest.strip())
        elif cmd == "/help":
            self._reply(HELP)
        else:
            self._err(P.BAD_REQUEST, f"unknown command {cmd!r} (/help lists them)")

    def _set(self, rest: str) -> None:
        if not rest:
            self._reply("OK " + " ".join(f"{k}={json.dumps(v)}" for k, v in self.settings.items()))
            return
        key, _, raw = rest.partition(" ")
        if key not in SETTABLE or not raw.strip():
            self._err(P.BAD_REQUEST, f"/set KEY VALUE, KEY one of {', '.join(SETTABLE)}")
            return
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw.strip()  # a bare word: a stop string
        try:  # checked by the protocol's own rules, as a JSON client's field would be
            P.parse_object({"id": 0, "prompt": "x", key: value})
        except P.ProtocolError as exc:
            self._err(exc.code, str(exc))
            return
        self.settings[key] = value
        self._reply(f"OK {key}={json.dumps(value)}")

    def _prompt(self, text: str) -> None:
        self.n += 1
        self.current = f"{self.id_prefix}{self.n}"
        self.user_text, self.answer, self.cancel_reason, self.at_line_start = text, [], None, True
        req: dict[str, Any] = {"id": self.current, **self.settings}
        if self.chat:
            req["messages"] = [*self.history, {"role": "user", "content": text}]
        else:
            req["prompt"] = text
        self.submit(req)  # a refusal (busy, context) comes back at once as an error event

    def _cancel(self) -> None:
        if self.current is None or self.current.startswith(self.id_prefix + "health-"):
            self._err(P.NOT_FOUND, "no answer in progress to cancel")
            return
        self.cancel_reason = "cancelled by /cancel"
        self.submit({"type": "cancel", "id": self.current})

    # ---- events out ----
    def on_event(self, event: dict[str, Any]) -> None:
        kind, req_id = event["event"], event.get("id")
        if kind == "token":
            self.answer.append(event["text"])
            self.write(self._encode(self._stuffed(event["text"])), final=False, req_id=req_id)
            return
        if kind == "health":
            fields = " ".join(f"{k}={event[k]}" for k in ("status", "slots", "slots_busy", "queue", "queue_max",
                                                           "n_ctx", "protocol"))
            self.current = None
            self._reply("OK " + fields)
            return
        end = self._encode(self.eol) if not self.at_line_start else b""
        self.at_line_start = True
        if kind == "done" and event["stop_reason"] == "cancelled":
            tail = self._err_line("cancelled", self.cancel_reason or "cancelled")
        elif kind == "done":
            if self.chat:
                self.history += [{"role": "user", "content": self.user_text},
                                 {"role": "assistant", "content": "".join(self.answer)}]
            tail = self._encode(self.marker + self.eol)
        else:
            hint = " (/reset starts a new conversation)" if self.chat and event["code"] == P.CONTEXT else ""
            tail = self._err_line(event["code"], event["message"] + hint)
        self.current = None
        self.write(end + tail, final=True, req_id=req_id)
        self._next()

    def forget(self, event: dict[str, Any]) -> None:
        """An event of a request from before a device loss: no output, only the state moves on."""
        if event["event"] in ("done", "error", "health"):
            self.current = None
            self._next()

    def note_cancel(self, req_id: Any, reason: str) -> None:
        if req_id is not None and req_id == self.current:
            self.cancel_reason = reason

    def lost(self) -> None:
        self.pending.clear()
        self.at_line_start = True

    # ---- text ----
    def _stuffed(self, text: str) -> str:
        """eol line endings; an answer line that starts with the marker's first character gets it
        doubled (as SMTP does with "."), so no answer line can read as the end marker."""
        out: list[str] = []
        for i, part in enumerate(text.split("\n")):
            if i:
                out.append(self.eol)
                self.at_line_start = True
            if part:
                if self.at_line_start and part.startswith(self.marker[0]):
                    part = self.marker[0] + part
                out.append(part)
                self.at_line_start = False
        return "".join(out)

    def _encode(self, text: str) -> bytes:
        return text.encode(self.encoding, "replace")

    def _err_line(self, code: str, message: str) -> bytes:
        return self._encode(f"ERR {code} {' '.join(message.split())}{self.eol}")

    def _err(self, code: str, message: str) -> None:
        self.write(self._err_line(code, message), final=True)

    def _reply(self, line: str) -> None:
        self.write(self._encode(line + self.eol + self.marker + self.eol), final=True)
        self._next()

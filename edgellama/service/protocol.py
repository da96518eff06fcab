"""Protocol v1: one JSON object per line in both directions (docs/protocol.md).

Parses and validates request lines into typed requests and builds event objects; it knows
nothing about sockets or the engine, so every rule here is checked the same way for every client.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

VERSION = 1
INT32_MAX = 2**31 - 1  # the sampler's and the engine's integer fields

# Stable error codes: clients branch on these, so they never change meaning.
BAD_REQUEST = "bad_request"  # not JSON, not UTF-8, a wrong field or type, no chat template
TOO_LONG = "too_long"  # a line over --max-line
BUSY = "busy"  # the wait queue is full
CONTEXT = "context"  # the prompt does not fit the context window
SHUTDOWN = "shutdown"  # the server is stopping
NOT_FOUND = "not_found"  # cancel of an id that is not in flight on this connection
INTERNAL = "internal"  # a bug or an engine failure; the message says what
ERROR_CODES = (BAD_REQUEST, TOO_LONG, BUSY, CONTEXT, SHUTDOWN, NOT_FOUND, INTERNAL)
STOP_REASONS = ("eos", "length", "stop", "cancelled", "context")


class ProtocolError(ValueError):
    """A request line that cannot be served; becomes one `error` event with this code."""

    def __init__(self, code: str, message: str, req_id: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.req_id = req_id


@dataclass
class Completion:
    """A generation request: `prompt` text or chat `messages`, with llama.cpp's sampling names."""

    id: str | int
    prompt: str | None = None
    messages: list[dict[str, str]] | None = None
    n_predict: int = -1
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = True
    cache_prompt: bool = True
    special: bool = False  # parse special tokens written in a raw prompt
    grammar: str | None = None  # GBNF text (docs/grammar.md)
    json_schema: Any = None  # a JSON Schema object, turned into a grammar
    constraint: Any = None  # the parsed grammar of either (edgellama.grammar.Grammar), checked at parse time
    lora: list[tuple[int, float]] | None = None  # (adapter id, scale); None: the server's default scales


@dataclass
class Control:
    """health, metrics, or cancel (of the request `id` on the same connection)."""

    type: str
    id: str | int | None


Request = Completion | Control

_NUM = (int, float)
# field -> (accepted JSON types, description for the error message)
_FIELDS: dict[str, tuple[tuple[type, ...], str]] = {
    "n_predict": ((int,), "an integer"),
    "temperature": (_NUM, "a number"),
    "top_k": ((int,), "an integer"),
    "top_p": (_NUM, "a number"),
    "min_p": (_NUM, "a number"),
    "repeat_penalty": (_NUM, "a number"),
    "repeat_last_n": ((int,), "an integer"),
    "seed": ((int,), "an integer"),
    "stream": ((bool,), "true or false"),
    "cache_prompt": ((bool,), "true or false"),
    "special": ((bool,), "true or false"),
}
_COMPLETION_KEYS = {"type", "id", "prompt", "messages", "stop", "grammar", "json_schema", "lora", *_FIELDS}
MAX_LORA_ENTRIES = 64
_CONTROL_KEYS = {"type", "id"}
TYPES = ("completion", "health", "metrics", "cancel")


def _check_type(name: str, value: Any, types: tuple[type, ...], what: str, req_id: Any) -> None:
    # bool is an int in Python; JSON true is not a number here
    if isinstance(value, bool) and bool not in types or not isinstance(value, types):
        raise ProtocolError(BAD_REQUEST, f"field {name!r} must be {what}, got {json.dumps(value)[:40]}", req_id)


def _no_constant(name: str) -> Any:
    # Python's json reads NaN, Infinity and -Infinity, which are not JSON: a NaN would pass every range check
    raise ProtocolError(BAD_REQUEST, f"the line is not JSON: {name} is not a JSON number")


def parse_line(line: bytes) -> Request:
    """One request line (without its newline) -> a request; raises ProtocolError."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ProtocolError(BAD_REQUEST, f"the line is not valid UTF-8 (byte {exc.start})") from None
    try:
        obj = json.loads(text, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise ProtocolError(BAD_REQUEST, f"the line is not JSON: {exc.msg} at column {exc.colno}") from None
    except RecursionError:  # arrays or objects nested thousands deep
        raise ProtocolError(BAD_REQUEST, "the line is not JSON this server takes: nested too deep") from None
    except ValueError as exc:  # an integer of thousands of digits (Python's int conversion limit)
        raise ProtocolError(BAD_REQUEST, f"the line is not JSON this server takes: {exc}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(BAD_REQUEST, "a request must be a JSON object")
    req_id = obj.get("id")
    if req_id is not None and (isinstance(req_id, bool) or not isinstance(req_id, (str, int))):
        raise ProtocolError(BAD_REQUEST, "field 'id' must be a string or an integer")
    kind = obj.get("type", "completion")
    if kind not in TYPES:
        raise ProtocolError(BAD_REQUEST, f"unknown type {kind!r} (one of {', '.join(TYPES)})", req_id)
    allowed = _COMPLETION_KEYS if kind == "completion" else _CONTROL_KEYS
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise ProtocolError(BAD_REQUEST, f"unknown field {unknown[0]!r} in a {kind} request", req_id)
    if kind != "completion":
        if kind == "cancel" and req_id is None:
            raise ProtocolError(BAD_REQUEST, "cancel needs the 'id' of the request to cancel")
        return Control(kind, req_id)
    if req_id is None:
        raise ProtocolError(BAD_REQUEST, "a completion request needs an 'id' (string or integer)")
    return _completion(obj, req_id)


def _completion(obj: dict[str, Any], req_id: str | int) -> Completion:
    req = Completion(id=req_id)
    prompt, messages = obj.get("prompt"), obj.get("messages")
    if (prompt is None) == (messages is None):
        raise ProtocolError(BAD_REQUEST, "give exactly one of 'prompt' or 'messages'", req_id)
    if prompt is not None:
        _check_type("prompt", prompt, (str,), "a string", req_id)
        req.prompt = prompt
    else:
        if not isinstance(messages, list) or not messages:
            raise ProtocolError(BAD_REQUEST, "field 'messages' must be a non-empty list", req_id)
        for i, m in enumerate(messages):
            if (not isinstance(m, dict) or set(m) - {"role", "content"} or not isinstance(m.get("role"), str)
                    or not isinstance(m.get("content"), str)):
                raise ProtocolError(BAD_REQUEST, f"messages[{i}] must be {{\"role\": str, \"content\": str}}",
                                    req_id)
            if m["role"] not in ("system", "user", "assistant"):
                raise ProtocolError(BAD_REQUEST, f"messages[{i}]: unknown role {m['role']!r}", req_id)
        req.messages = messages
    for name, (types, what) in _FIELDS.items():
        if name in obj and not (name == "seed" and obj[name] is None):
            _check_type(name, obj[name], types, what, req_id)
            setattr(req, name, obj[name])
    stop = obj.get("stop", [])
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop) or len(stop) > 16:
        raise ProtocolError(BAD_REQUEST, "field 'stop' must be a string or a list of up to 16 non-empty strings",
                            req_id)
    req.stop = stop
    if "lora" in obj:
        req.lora = parse_lora(obj["lora"], req_id)
    _check_ranges(req)
    _constraint(obj, req)
    return req


def parse_lora(value: Any, req_id: Any, what: str = "field 'lora'", item: str = "lora") -> list[tuple[int, float]]:
    """llama-server's `lora` list: [{"id": adapter number, "scale": number}, ...] (what, item: how messages
    name it and its entries, e.g. HTTP's POST /lora-adapters body); scales_of checks the ids."""
    shape = f'{what} must be a list of {{"id": integer, "scale": number}}'
    if not isinstance(value, list) or len(value) > MAX_LORA_ENTRIES:
        raise ProtocolError(BAD_REQUEST, f"{shape} (up to {MAX_LORA_ENTRIES})", req_id)
    out: list[tuple[int, float]] = []
    for i, e in enumerate(value):
        if (not isinstance(e, dict) or set(e) != {"id", "scale"} or isinstance(e["id"], bool)
                or not isinstance(e["id"], int) or isinstance(e["scale"], bool) or not isinstance(e["scale"], _NUM)):
            raise ProtocolError(BAD_REQUEST, f"{shape}: {item}[{i}] is not", req_id)
        if not math.isfinite(e["scale"]) or abs(e["scale"]) > 1e30:
            raise ProtocolError(BAD_REQUEST, f"{item}[{i}]: 'scale' must be a finite number", req_id)
        if any(e["id"] == j for j, _ in out):
            raise ProtocolError(BAD_REQUEST, f"{item}[{i}]: adapter {e['id']} is given twice", req_id)
        out.append((e["id"], float(e["scale"])))
    return out


def scales_of(lora: list[tuple[int, float]], n_adapters: int, req_id: Any) -> list[float]:
    """llama-server's reading of a `lora` list: the listed adapters at their scales, the others at 0;
    an id the server has no adapter for is a bad_request naming it."""
    scales = [0.0] * n_adapters
    for i, sc in lora:
        if not 0 <= i < n_adapters:
            raise ProtocolError(BAD_REQUEST, f"lora: no adapter {i} (the server loaded {n_adapters}"
                                + (f": ids 0..{n_adapters - 1})" if n_adapters else ")"), req_id)
        scales[i] = sc
    return scales


def lora_scales(req: Completion, defaults: list[float]) -> list[float] | None:
    """The adapter scales of a request as llama-server sets them (scales_of); None without a `lora`
    field: the server's default scales (the start-up ones, or as POST /lora-adapters last set them)."""
    if req.lora is None:
        return None
    return scales_of(req.lora, len(defaults), req.id)


def _constraint(obj: dict[str, Any], req: Completion) -> None:
    """`grammar` (GBNF text) or `json_schema` (an object): parsed here, so a bad one is a bad_request
    naming the problem before the request is queued."""
    grammar, schema = obj.get("grammar"), obj.get("json_schema")
    if grammar is not None:
        _check_type("grammar", grammar, (str,), "a string (GBNF)", req.id)
    if schema is not None and not isinstance(schema, (dict, bool)):
        raise ProtocolError(BAD_REQUEST, "field 'json_schema' must be a JSON Schema object", req.id)
    if grammar and schema is not None:
        raise ProtocolError(BAD_REQUEST, "give 'grammar' or 'json_schema', not both", req.id)
    if not grammar and schema is None:
        return
    from edgellama.grammar import GrammarError, SchemaError, grammar_from_schema, parse

    try:
        req.constraint = parse(grammar) if grammar else grammar_from_schema(schema)
    except (GrammarError, SchemaError) as exc:
        raise ProtocolError(BAD_REQUEST, f"{'grammar' if grammar else 'json_schema'}: {exc}", req.id) from None
    except RecursionError:
        raise ProtocolError(BAD_REQUEST, "grammar or json_schema nested too deep", req.id) from None
    req.grammar, req.json_schema = grammar or None, schema


def _check_ranges(r: Completion) -> None:
    def bad(msg: str) -> ProtocolError:
        return ProtocolError(BAD_REQUEST, msg, r.id)

    for name in ("temperature", "top_p", "min_p", "repeat_penalty"):
        if not math.isfinite(getattr(r, name)):  # 1e999 reads as infinity
            raise bad(f"'{name}' must be a finite number")
    for name in ("n_predict", "top_k", "repeat_last_n"):
        if getattr(r, name) > INT32_MAX:
            raise bad(f"'{name}' must be at most {INT32_MAX}")
    if r.n_predict < -1:
        raise bad("'n_predict' must be >= -1 (-1: up to the server's --max-tokens)")
    if r.temperature < 0:
        raise bad("'temperature' must be >= 0")
    if r.top_k < 0:
        raise bad("'top_k' must be >= 0")
    if not 0 <= r.top_p <= 1:
        raise bad("'top_p' must be in [0, 1]")
    if not 0 <= r.min_p <= 1:
        raise bad("'min_p' must be in [0, 1]")
    if r.repeat_penalty <= 0:
        raise bad("'repeat_penalty' must be > 0")
    if r.repeat_last_n < -1:
        raise bad("'repeat_last_n' must be >= -1")
    if r.seed is not None and not 0 <= r.seed < 2**63:
        raise bad("'seed' must be in 0..2^63-1")


def encode(event: dict[str, Any]) -> bytes:
    return (json.dumps(event, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


def error_event(req_id: Any, code: str, message: str) -> dict[str, Any]:
    return {"event": "error", "id": req_id, "code": code, "message": message}

"""Protocol v1: one JSON object per line in both directions (docs/protocol.md).

Parses and validates request lines into typed requests and builds event objects; it knows
nothing about sockets or the engine, so every rule here is checked the same way for every client.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from edgellama import params as R
from edgellama.logprobs import check_top
from edgellama.params import GenParams

VERSION = 1

# Stable error codes: clients branch on these, so they never change meaning.
BAD_REQUEST = "bad_request"  # not JSON, not UTF-8, a wrong field or type, no chat template
TOO_LONG = "too_long"  # a line over --max-line
BUSY = "busy"  # the wait queue is full
CONTEXT = "context"  # the prompt does not fit the context window
SHUTDOWN = "shutdown"  # the server is stopping
NOT_FOUND = "not_found"  # cancel of an id not in flight on this connection; a model name the server has not
INTERNAL = "internal"  # a bug or an engine failure; the message says what
UNAVAILABLE = "unavailable"  # the model asked for failed to load (or to verify): the message names it and why
ERROR_CODES = (BAD_REQUEST, TOO_LONG, BUSY, CONTEXT, SHUTDOWN, NOT_FOUND, INTERNAL, UNAVAILABLE)
STOP_REASONS = ("eos", "length", "stop", "cancelled", "context")


class ProtocolError(ValueError):
    """A request line that cannot be served; becomes one `error` event with this code."""

    def __init__(self, code: str, message: str, req_id: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.req_id = req_id


@dataclass(kw_only=True)
class Completion(GenParams):
    """A generation request: `prompt` text or chat `messages`, with the request-parameter table's
    fields (edgellama.params.GenParams: llama.cpp's sampling names, `stop`, the parsed `constraint`)."""

    id: str | int
    prompt: str | list[int | str] | None = None  # a list: token ids, strings among them tokenized in place
    messages: list[dict[str, str]] | None = None
    stream: bool = True
    cache_prompt: bool = True
    special: bool = True  # parse special tokens written in a raw prompt (as llama.cpp and llama-cpp-python)
    grammar: str | None = None  # GBNF text (docs/grammar.md)
    json_schema: Any = None  # a JSON Schema object, turned into a grammar
    lora: list[tuple[int, float]] | None = None  # (adapter id, scale); None: the server's default scales
    model: str | None = None  # a model or alias name of a server with several (serve --model NAME=FILE)
    keep_alive: float | None = None  # seconds the model stays loaded after this request (< 0: until evicted)
    tools: list[dict[str, Any]] | None = None  # OpenAI's tools (edgellama.tool_calls), messages only
    tool_choice: str = "none"  # auto, none, required, or the one function's name
    parallel_tool_calls: bool = False
    logprobs: bool = False  # each token's log-probability in its event (`probs`)
    n_probs: int = 0  # and the n most likely tokens' (0..20; > 0 implies logprobs)
    post_sampling_probs: bool = False  # llama-server's: probabilities after the sampling chain instead
    schema_notes: list[str] = field(default_factory=list)  # what a schema's grammar reads loosely (logged)

    @property
    def probs_wanted(self) -> int:
        """The generation's n_probs: -1 when no log-probabilities are asked for."""
        return self.n_probs if self.logprobs or self.n_probs > 0 else -1


@dataclass(kw_only=True)
class Embedding:
    """An embeddings request (the server runs with --embedding): `input` a string, a list of strings, a
    token list or a list of token lists; one vector per input, normalized by `embd_normalize` (llama.cpp's
    --embd-normalize values; not applied with pooling none, as llama-server)."""

    id: str | int
    inputs: list[str | list[int]]
    embd_normalize: int = 2
    stream: bool = False  # never streamed: the answer is one `done` event with every vector
    prompt: str | None = None  # what the log's --log-prompts shows (the first text)
    messages: None = None
    model: str | None = None
    keep_alive: float | None = None


@dataclass
class Control:
    """health, metrics, or cancel (of the request `id` on the same connection)."""

    type: str
    id: str | int | None
    model: str | None = None  # health: that model's slots and queue (default: the default model's)


Request = Completion | Embedding | Control

_NUM = (int, float)
# protocol v1's own fields beside the request-parameter table's (edgellama.params.FIELDS)
_FLAGS = ("stream", "cache_prompt", "special", "logprobs", "post_sampling_probs")
PARAM_FIELDS = tuple(R.names(R.V1))
_ROUTING = ("model", "keep_alive")  # which model answers, and how long it stays loaded after
_COMPLETION_KEYS = {"type", "id", "prompt", "messages", "grammar", "json_schema", "lora", "n_probs", *_FLAGS,
                    *PARAM_FIELDS, *_ROUTING, "tools", "tool_choice", "parallel_tool_calls"}
MAX_LORA_ENTRIES = 64
_CONTROL_KEYS = {"type", "id"}
TYPES = ("completion", "embedding", "health", "metrics", "cancel")
_EMBEDDING_KEYS = {"type", "id", "input", "embd_normalize", *_ROUTING}
MAX_NAME = 128
MAX_PROMPT_ITEMS = 1 << 20  # a token-list prompt's items (the context refuses what does not fit)
MAX_EMBED_INPUTS = 2048


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
    return parse_object(obj)


def parse_object(obj: Any, spelling: Mapping[str, str] | None = None) -> Request:
    """A parsed request object (a JSON line's, or one HTTP or the serial text mode built) -> a request;
    raises ProtocolError. spelling: protocol v1 field name -> the name the client used (OpenAI's
    max_tokens for n_predict), so a message names the field as the client wrote it."""
    if not isinstance(obj, dict):
        raise ProtocolError(BAD_REQUEST, "a request must be a JSON object")
    req_id = obj.get("id")
    if req_id is not None and (isinstance(req_id, bool) or not isinstance(req_id, (str, int))):
        raise ProtocolError(BAD_REQUEST, "field 'id' must be a string or an integer")
    kind = obj.get("type", "completion")
    if kind not in TYPES:
        raise ProtocolError(BAD_REQUEST, f"unknown type {kind!r} (one of {', '.join(TYPES)})", req_id)
    allowed = {"completion": _COMPLETION_KEYS, "embedding": _EMBEDDING_KEYS,
               "health": _CONTROL_KEYS | {"model"}}.get(kind, _CONTROL_KEYS)
    unknown = sorted(set(obj) - allowed)
    if unknown:
        raise ProtocolError(BAD_REQUEST, f"unknown field {unknown[0]!r} in a {kind} request", req_id)
    try:  # text that is not Unicode (a lone surrogate escape) is the client's mistake, named, on every door
        R.check_unicode({(spelling or {}).get(k, k): v for k, v in obj.items()}, "")
    except R.ParamError as exc:
        raise ProtocolError(BAD_REQUEST, str(exc), req_id) from None
    model = model_name(obj.get("model"), req_id)
    if kind == "embedding":
        if req_id is None:
            raise ProtocolError(BAD_REQUEST, "an embedding request needs an 'id' (string or integer)")
        ereq = parse_embedding(obj.get("input"), obj.get("embd_normalize", 2), req_id)
        ereq.model, ereq.keep_alive = model, keep_alive(obj.get("keep_alive"), req_id)
        return ereq
    if kind != "completion":
        if kind == "cancel" and req_id is None:
            raise ProtocolError(BAD_REQUEST, "cancel needs the 'id' of the request to cancel")
        return Control(kind, req_id, model)
    if req_id is None:
        raise ProtocolError(BAD_REQUEST, "a completion request needs an 'id' (string or integer)")
    req = _completion(obj, req_id, spelling or {})
    req.model, req.keep_alive = model, keep_alive(obj.get("keep_alive"), req_id)
    return req


def model_name(value: Any, req_id: Any = None) -> str | None:
    """A request's `model` field: a name, or None (absent, null or ""): the server's default model."""
    if value is None or value == "":
        return None
    if not isinstance(value, str) or len(value) > MAX_NAME:
        raise ProtocolError(BAD_REQUEST, f"field 'model' must be a model name (a string of at most {MAX_NAME} "
                            f"characters), got {json.dumps(value)[:40]}", req_id)
    return value


_DURATION_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_DURATION_PART = re.compile(r"([0-9]*\.?[0-9]+)(ns|us|µs|ms|s|m|h)")


def keep_alive(value: Any, req_id: Any = None, what: str = "field 'keep_alive'") -> float | None:
    """ollama's keep_alive: seconds as a number, or a Go duration ("5m", "1h30m", "90s", "-1"); negative:
    loaded until evicted; 0: unloaded as soon as the model is idle. None when absent."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ProtocolError(BAD_REQUEST, f"{what} must be seconds or a duration such as \"5m\"", req_id)
    if isinstance(value, str):
        text = value.strip()
        sign = -1.0 if text.startswith("-") else 1.0
        body = text.lstrip("+-")
        try:
            seconds = float(body)
        except ValueError:
            parts = _DURATION_PART.findall(body)
            if not body or "".join(n + u for n, u in parts) != body:
                raise ProtocolError(BAD_REQUEST, f"{what}: cannot read duration {value!r} (examples: 300, \"5m\", "
                                    f"\"1h30m\", \"-1\")", req_id) from None
            seconds = sum(float(n) * _DURATION_UNITS[u] for n, u in parts)
        value = sign * seconds
    if not math.isfinite(value):
        raise ProtocolError(BAD_REQUEST, f"{what} must be finite", req_id)
    return -1.0 if value < 0 else float(value)


def _completion(obj: dict[str, Any], req_id: str | int, spelling: Mapping[str, str]) -> Completion:
    req = Completion(id=req_id)
    prompt, messages = obj.get("prompt"), obj.get("messages")
    if (prompt is None) == (messages is None):
        raise ProtocolError(BAD_REQUEST, "give exactly one of 'prompt' or 'messages'", req_id)
    if prompt is not None:
        _check_type("prompt", prompt, (str, list), "a string, or a list of token ids (and strings)", req_id)
        if not prompt:
            raise ProtocolError(BAD_REQUEST, "field 'prompt' must not be empty", req_id)
        if isinstance(prompt, list) and (len(prompt) > MAX_PROMPT_ITEMS or not all(
                isinstance(t, str) or isinstance(t, int) and not isinstance(t, bool) and 0 <= t <= 2**31 - 1
                for t in prompt)):
            raise ProtocolError(BAD_REQUEST, "field 'prompt' as a list holds token ids (>= 0) and strings, up to "
                                f"{MAX_PROMPT_ITEMS} of them", req_id)
        req.prompt = prompt
    else:
        if not isinstance(messages, list) or not messages:
            raise ProtocolError(BAD_REQUEST, "field 'messages' must be a non-empty list", req_id)
        for i, m in enumerate(messages):
            _message(i, m, req_id)
        req.messages = messages
    for name in _FLAGS:
        if name in obj:
            _check_type(spelling.get(name, name), obj[name], (bool,), "true or false", req_id)
            setattr(req, name, obj[name])
    try:
        R.update(req, {R.names(R.V1)[k]: v for k, v in obj.items() if k in PARAM_FIELDS}, R.V1)
    except R.ParamError as exc:
        name = spelling.get(exc.field, exc.field)
        raise ProtocolError(BAD_REQUEST, f"'{name}' {exc.detail}", req_id) from None
    if "lora" in obj:
        req.lora = parse_lora(obj["lora"], req_id)
    _tools(obj, req)
    if obj.get("n_probs") is not None:
        try:
            req.n_probs = check_top(spelling.get("n_probs", "n_probs"), obj["n_probs"])
        except ValueError as exc:
            raise ProtocolError(BAD_REQUEST, str(exc), req_id) from None
    _constraint(obj, req)
    return req


def _message(i: int, m: Any, req_id: Any) -> None:
    """One chat turn: {"role", "content"}; a tool's result also names its call (`tool_call_id`, `name`); an
    assistant turn may hold its calls (`tool_calls`, OpenAI's shape)."""
    shape = f"messages[{i}] must be {{\"role\": str, \"content\": str}}"
    if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
        raise ProtocolError(BAD_REQUEST, shape, req_id)
    if m["role"] not in ("system", "user", "assistant", "tool"):
        raise ProtocolError(BAD_REQUEST, f"messages[{i}]: unknown role {m['role']!r}", req_id)
    extra = set(m) - {"role", "content"} - ({"tool_call_id", "name"} if m["role"] == "tool" else set()) - (
        {"tool_calls"} if m["role"] == "assistant" else set())
    if extra:
        raise ProtocolError(BAD_REQUEST, f"{shape} (a tool turn may add tool_call_id and name, an assistant turn "
                            f"tool_calls), not {min(extra)!r}", req_id)
    for key in ("tool_call_id", "name"):
        if key in m and not isinstance(m[key], str):
            raise ProtocolError(BAD_REQUEST, f"messages[{i}].{key} must be a string", req_id)
    calls = m.get("tool_calls")
    if calls is not None and (not isinstance(calls, list) or not all(
            isinstance(c, dict) and isinstance(c.get("function"), dict) and isinstance(c["function"].get("name"), str)
            and isinstance(c["function"].get("arguments", ""), (str, dict)) for c in calls)):
        raise ProtocolError(BAD_REQUEST, f"messages[{i}].tool_calls must be OpenAI's [{{\"id\", \"type\": "
                            f"\"function\", \"function\": {{\"name\", \"arguments\"}}}}]", req_id)


def _tools(obj: dict[str, Any], req: Completion) -> None:
    """tools, tool_choice, parallel_tool_calls (chat messages only)."""
    from edgellama.tool_calls import ToolError, check_choice, check_tools

    if all(obj.get(k) is None for k in ("tools", "tool_choice", "parallel_tool_calls")):
        return
    if req.messages is None:
        raise ProtocolError(BAD_REQUEST, "tools are for chat 'messages', not a raw 'prompt'", req.id)
    try:
        tools = check_tools(obj["tools"], req.schema_notes) if obj.get("tools") else []
        req.tool_choice = check_choice(obj.get("tool_choice"), tools)
    except ToolError as exc:
        raise ProtocolError(BAD_REQUEST, str(exc), req.id) from None
    parallel = obj.get("parallel_tool_calls", False)
    if not isinstance(parallel, bool):
        raise ProtocolError(BAD_REQUEST, "field 'parallel_tool_calls' must be true or false", req.id)
    if req.tool_choice not in ("auto", "none") and (obj.get("grammar") or obj.get("json_schema") is not None):
        raise ProtocolError(BAD_REQUEST, "tool_choice required (or a named function) constrains the reply: give no "
                            "grammar or json_schema with it", req.id)
    req.tools, req.parallel_tool_calls = tools or None, parallel


def _is_tokens(v: Any) -> bool:
    return isinstance(v, list) and bool(v) and all(isinstance(t, int) and not isinstance(t, bool) for t in v)


def parse_embedding(value: Any, embd_normalize: Any, req_id: str | int, what: str = "input") -> Embedding:
    """An embeddings input as OpenAI and llama-server take it: a string, a list of strings, a token list or
    a list of token lists (what: the field's name in messages: 'input', or llama-server's 'content')."""
    if isinstance(value, str) or _is_tokens(value):
        items: list[Any] = [value]
    elif isinstance(value, list) and value:
        items = value
    else:
        raise ProtocolError(BAD_REQUEST, f"field {what!r} must be a string, a list of strings, a list of token ids "
                            f"or a list of such lists, and not empty", req_id)
    if len(items) > MAX_EMBED_INPUTS:
        raise ProtocolError(BAD_REQUEST, f"field {what!r}: {len(items)} inputs, at most {MAX_EMBED_INPUTS} per "
                            f"request", req_id)
    for i, it in enumerate(items):
        if not (isinstance(it, str) or _is_tokens(it)):
            raise ProtocolError(BAD_REQUEST, f"{what}[{i}] must be a string or a non-empty list of token ids", req_id)
        if isinstance(it, str) and not it:
            raise ProtocolError(BAD_REQUEST, f"{what}[{i}] is empty (input content cannot be empty)", req_id)
    if isinstance(embd_normalize, bool) or not isinstance(embd_normalize, int) or not -1 <= embd_normalize <= 1000:
        raise ProtocolError(BAD_REQUEST, "field 'embd_normalize' must be an integer: -1 none, 0 max absolute, "
                            "1 taxicab, 2 euclidean, > 2 p-norm", req_id)
    first = items[0] if isinstance(items[0], str) else None
    return Embedding(id=req_id, inputs=items, embd_normalize=embd_normalize, prompt=first)


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
    from edgellama.grammar import GrammarError, SchemaError, parse, schema_grammar

    try:
        if grammar:
            req.constraint = parse(grammar)
        else:
            req.constraint, notes = schema_grammar(schema)
            req.schema_notes += [f"json_schema {n}" for n in notes]
    except (GrammarError, SchemaError) as exc:
        raise ProtocolError(BAD_REQUEST, f"{'grammar' if grammar else 'json_schema'}: {exc}", req.id) from None
    except RecursionError:
        raise ProtocolError(BAD_REQUEST, "grammar or json_schema nested too deep", req.id) from None
    req.grammar, req.json_schema = grammar or None, schema


def encode(event: dict[str, Any]) -> bytes:
    return (json.dumps(event, ensure_ascii=False, separators=(",", ":")) + "\n").encode("utf-8")


def error_event(req_id: Any, code: str, message: str) -> dict[str, Any]:
    return {"event": "error", "id": req_id, "code": code, "message": message}

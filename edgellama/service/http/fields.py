"""Field names between HTTP and protocol v1: llama-server's and OpenAI's request bodies become protocol
v1 request objects (validated afterwards by protocol.parse_object, the one set of rules, with no JSON
round trip), and protocol v1 `done` events become llama-server's and OpenAI's result fields. No I/O here.
"""

from __future__ import annotations

import json
from typing import Any

from edgellama import openai_shapes
from edgellama import params as R
from edgellama.service import protocol as P


class HttpError(Exception):
    """A request answered with an error status and llama-server's error JSON shape."""

    def __init__(self, status: int, message: str, type_: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.type = type_ or ERROR_TYPES.get(status, "invalid_request_error")


# llama-server's error `type` per status (its format_error_response), OpenAI's names
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 405: "invalid_request_error", 408: "invalid_request_error", 409: "conflict_error",
               413: "invalid_request_error", 431: "invalid_request_error", 500: "server_error",
               501: "not_supported_error", 503: "unavailable_error"}

# protocol v1 error code -> (HTTP status, error type)
CODE_STATUS = {P.BAD_REQUEST: (400, "invalid_request_error"), P.TOO_LONG: (413, "invalid_request_error"),
               P.BUSY: (503, "unavailable_error"), P.CONTEXT: (400, "exceed_context_size_error"),
               P.SHUTDOWN: (503, "unavailable_error"), P.NOT_FOUND: (404, "not_found_error"),
               P.INTERNAL: (500, "server_error"), P.UNAVAILABLE: (503, "unavailable_error")}


def error_body(status: int, message: str, type_: str) -> dict[str, Any]:
    return {"error": {"code": status, "message": message, "type": type_}}


def from_protocol_error(code: str, message: str) -> HttpError:
    status, type_ = CODE_STATUS.get(code, (500, "server_error"))
    return HttpError(status, message, type_)


def _no_constant(name: str) -> Any:
    raise HttpError(400, f"the body is not JSON: {name} is not a JSON number")


def json_body(body: bytes) -> dict[str, Any]:
    """The request body as a JSON object, or a 400 naming what is wrong with it."""
    obj = json_value(body)
    if not isinstance(obj, dict):
        raise HttpError(400, "the body must be a JSON object")
    return obj


def json_value(body: bytes) -> Any:
    """The request body as any JSON value, or a 400 naming what is wrong with it."""
    try:
        obj = json.loads(body.decode("utf-8"), parse_constant=_no_constant)
    except UnicodeDecodeError as exc:
        raise HttpError(400, f"the body is not valid UTF-8 (byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise HttpError(400, f"the body is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except (RecursionError, ValueError) as exc:
        raise HttpError(400, f"the body is not JSON this server takes: {exc}") from None
    try:  # text that is not Unicode (a lone surrogate escape): the client's mistake, named
        R.check_unicode(obj, "")
    except R.ParamError as exc:
        raise HttpError(400, str(exc)) from None
    return obj


# a mapped request's side note for parse_v1 (never a field): protocol v1 name -> the client's name
SPELLING = "__spelling__"
# llama-server's names that protocol v1 takes as they are: the request-parameter table's, and cache_prompt
SAMPLING = tuple(n for n in P.PARAM_FIELDS if n not in ("n_predict", "seed", "stop")) + ("cache_prompt",)
# llama-server fields for samplers and features this engine does not have: accepted at the value that
# turns them off (what a client sends when it copies llama-server's defaults), refused otherwise
NEUTRAL: dict[str, Any] = {"typical_p": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0,
                           "dynatemp_range": 0.0, "dry_multiplier": 0.0, "xtc_probability": 0.0, "n_keep": 0, "min_keep": 0, "t_max_predict_ms": 0,
                           "id_slot": -1, "n_cmpl": 1, "return_tokens": False, "timings_per_token": False,
                           "return_progress": False}


def _neutral(obj: dict[str, Any]) -> None:
    for name, off in NEUTRAL.items():
        v = obj.get(name)
        if v is None or v == off or (off is None and v in ([], {})):
            continue
        if isinstance(off, bool) != isinstance(v, bool):
            raise HttpError(400, f"field {name!r} must be {json.dumps(off)} here, got {json.dumps(v)[:40]}")
        raise HttpError(400, f"field {name!r} is not supported by this server (only {json.dumps(off)}: "
                             f"the engine has no such sampler or feature), got {json.dumps(v)[:40]}")


def grammar_fields(obj: dict[str, Any]) -> dict[str, Any]:
    """llama-server's `grammar` / `json_schema` and OpenAI's `response_format` -> protocol v1's `grammar` /
    `json_schema` request fields; protocol v1 parses them (a bad grammar or schema is a 400 naming it)."""
    out: dict[str, Any] = {}
    if obj.get("grammar") not in (None, ""):
        out["grammar"] = obj["grammar"]
    if obj.get("json_schema") is not None:
        out["json_schema"] = obj["json_schema"]
    from edgellama.grammar import response_format_schema

    try:
        schema = response_format_schema(obj.get("response_format"))
    except ValueError as exc:
        raise HttpError(400, str(exc)) from None
    if schema is None:
        return out
    if "grammar" in out or "json_schema" in out:
        raise HttpError(400, "give one of 'grammar', 'json_schema' or 'response_format'")
    out["json_schema"] = schema
    return out


def _lora(obj: dict[str, Any], v1: dict[str, Any]) -> None:
    """llama-server's `lora` field as protocol v1's (which checks its shape; the scheduler its ids); an
    empty list is llama-server's "no per-request adapters": the server's default scales, as when absent
    (protocol v1 reads [] as every adapter off)."""
    lora = obj.get("lora")
    if lora is not None and lora != []:
        v1["lora"] = lora


def routing(obj: dict[str, Any], v1: dict[str, Any]) -> dict[str, Any]:
    """The body's `model` (which model answers) and ollama's `keep_alive`, as protocol v1 takes them."""
    for name in ("model", "keep_alive"):
        if obj.get(name) is not None:
            v1[name] = obj[name]
    return v1


def _seed(obj: dict[str, Any], v1: dict[str, Any]) -> None:
    seed = obj.get("seed")
    if seed is not None and seed != -1:  # llama-server's -1: a random seed, protocol v1's null
        v1["seed"] = seed


MAX_PROMPTS = 64  # prompts in one request (each a protocol v1 request of its own)
MAX_N = 16  # OpenAI's n: choices of one prompt


def prompts(value: Any) -> list[Any]:
    """llama-server's `prompt` forms (its tokenize_input_prompts): a string, a token list, or a mixed list of
    ids and strings are one prompt; a list of strings or of such lists is several."""
    if value is None:
        raise HttpError(400, "field 'prompt' is required")
    if isinstance(value, str):
        return [value]
    if not isinstance(value, list) or not value:
        raise HttpError(400, "field 'prompt' must be a string, a list of token ids (mixed with strings), or a list "
                             "of those")
    if all(isinstance(x, (str, int)) and not isinstance(x, bool) for x in value) and any(
            isinstance(x, int) and not isinstance(x, bool) for x in value):
        return [value]  # one prompt of ids (and strings)
    if len(value) > MAX_PROMPTS:
        raise HttpError(400, f"field 'prompt': {len(value)} prompts, at most {MAX_PROMPTS} per request")
    return list(value)


def one_prompt(obj: dict[str, Any]) -> Any:
    """The body's prompt when it must be one (prompts() finds several: a 400)."""
    found = prompts(obj.get("prompt"))
    if len(found) != 1:
        raise HttpError(400, "field 'prompt' holds several prompts here; give one")
    return found[0]


def n_choices(obj: dict[str, Any], name: str = "n") -> int:
    n = obj.get(name, 1)
    if n is None:
        return 1
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_N:
        raise HttpError(400, f"field {name!r} must be an integer in 1..{MAX_N}")
    return n


def copies(v1: dict[str, Any], n: int, next_id: Any) -> list[dict[str, Any]]:
    """n protocol v1 requests of one mapped request (OpenAI's n): each its own id; a given seed becomes
    seed + i for choice i, so seeded choices differ and repeat."""
    out = []
    for i in range(n):
        c = dict(v1, id=next_id() if i else v1["id"])
        if i and isinstance(c.get("seed"), int) and not isinstance(c.get("seed"), bool) and c["seed"] >= 0:
            c["seed"] = (c["seed"] + i) % (1 << 64)
        out.append(c)
    return out


def llama_completion(obj: dict[str, Any], req_id: str, prompt: Any = None) -> dict[str, Any]:
    """POST /completion's body (llama-server names) -> a protocol v1 completion request object for one of
    its prompts (prompt: one item of prompts(); None: the body's own, which must be one)."""
    _neutral(obj)
    if prompt is None:
        prompt = one_prompt(obj)
    # llama-server parses special tokens in prompts; its stream default is false (protocol v1's is true)
    v1: dict[str, Any] = {"id": req_id, "prompt": prompt, "special": True, "stream": False}
    for name in (*SAMPLING, "n_predict", "stop", "stream", "n_probs", "post_sampling_probs"):
        if name in obj and obj[name] is not None:
            v1[name] = obj[name]
    _seed(obj, v1)
    _lora(obj, v1)
    routing(obj, v1)
    v1.update(grammar_fields(obj))
    return v1


def _openai_common(obj: dict[str, Any], v1: dict[str, Any]) -> None:
    _neutral(obj)
    if obj.get("post_sampling_probs") not in (None, False):
        raise HttpError(400, "field 'post_sampling_probs' is for llama-server's /completion (n_probs); OpenAI's "
                             "logprobs are the model's own, before sampling")
    for name in ("max_completion_tokens", "max_tokens"):
        if obj.get(name) is not None:
            v1["n_predict"] = obj[name]
            v1.setdefault(SPELLING, {})["n_predict"] = name  # messages name the field as the client sent it
            break
    for name in (*SAMPLING, "stream"):  # llama.cpp's own sampling fields work here too
        if obj.get(name) is not None:
            v1[name] = obj[name]
    if "n_predict" not in v1 and obj.get("n_predict") is not None:
        v1["n_predict"] = obj["n_predict"]
    if obj.get("stop") is not None:
        v1["stop"] = obj["stop"]
    _seed(obj, v1)
    _lora(obj, v1)
    routing(obj, v1)
    v1.update(grammar_fields(obj))


def _logprobs(obj: dict[str, Any], v1: dict[str, Any], chat: bool) -> None:
    """OpenAI's logprobs: chat's `logprobs: true` with `top_logprobs: N`; completions' `logprobs: N`."""
    lp, top = obj.get("logprobs"), obj.get("top_logprobs")
    if chat:
        if lp is not None and not isinstance(lp, bool):
            raise HttpError(400, "field 'logprobs' must be true or false")
        if top is not None:
            if not lp:
                raise HttpError(400, "field 'top_logprobs' needs 'logprobs': true")
            v1["n_probs"] = top
            v1.setdefault(SPELLING, {})["n_probs"] = "top_logprobs"
        v1["logprobs"] = bool(lp)
    elif lp is not None:
        if isinstance(lp, bool):
            v1["logprobs"] = lp
        else:
            v1["logprobs"], v1["n_probs"] = True, lp
            v1.setdefault(SPELLING, {})["n_probs"] = "logprobs"


def openai_completion(obj: dict[str, Any], req_id: str, prompt: Any = None) -> dict[str, Any]:
    """POST /v1/completions -> protocol v1, for one of its prompts (an item of prompts(); None: the body's
    own, which must be one)."""
    if prompt is None:
        prompt = one_prompt(obj)
    # refused by name, as llama-server refuses them, never ignored (the Python API's create_completion gives echo)
    if obj.get("echo") not in (None, False):
        raise HttpError(400, "field 'echo' is not supported on /v1/completions (as on llama-server); "
                             "the Python API's create_completion(echo=True) echoes the prompt")
    for name in ("suffix", "best_of"):
        if obj.get(name) is not None:
            raise HttpError(400, f"field {name!r} is not supported on /v1/completions")
    v1: dict[str, Any] = {"id": req_id, "prompt": prompt, "special": True, "stream": False}
    _openai_common(obj, v1)
    _logprobs(obj, v1, chat=False)
    return v1


def chat_messages(messages: Any) -> list[dict[str, Any]]:
    """OpenAI's messages -> protocol v1's {role, content} turns: text parts joined, `developer` as
    `system`; the roles and shapes left are protocol v1's to accept or refuse."""
    if not isinstance(messages, list) or not messages:
        raise HttpError(400, "field 'messages' must be a non-empty list")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise HttpError(400, f"messages[{i}] must be an object")
        content = m.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise HttpError(400, f"messages[{i}]: only text content parts are supported "
                                         "(this server has no image or audio input)")
                texts.append(part["text"])
            content = "".join(texts)
        role = m.get("role")
        if content is None and role == "assistant" and m.get("tool_calls"):
            content = ""  # a turn of calls only
        if not isinstance(content, str):
            raise HttpError(400, f"messages[{i}] needs a 'content' string")
        turn: dict[str, Any] = {"role": "system" if role == "developer" else role, "content": content}
        for key in ("tool_calls", "tool_call_id", "name"):  # protocol v1 checks their shapes
            if m.get(key) is not None:
                turn[key] = m[key]
        out.append(turn)
    return out


def openai_chat(obj: dict[str, Any], req_id: str) -> dict[str, Any]:
    """POST /v1/chat/completions -> protocol v1 (messages through the model's chat template)."""
    v1: dict[str, Any] = {"id": req_id, "messages": chat_messages(obj.get("messages")), "stream": False}
    for key in ("tools", "tool_choice", "parallel_tool_calls"):
        if obj.get(key) is not None:
            v1[key] = obj[key]
    _openai_common(obj, v1)
    _logprobs(obj, v1, chat=True)
    return v1


def lora_list(obj: Any) -> list[tuple[int, float]]:
    """POST /lora-adapters' body, [{"id", "scale"}, ...], checked by protocol v1's rules for `lora`."""
    if not isinstance(obj, list):
        raise HttpError(400, 'the body must be a JSON array of {"id": integer, "scale": number}')
    try:
        return P.parse_lora(obj, None, what="the body", item="body")
    except P.ProtocolError as exc:
        raise from_protocol_error(exc.code, str(exc)) from None


def parse_v1(v1: dict[str, Any]) -> P.Completion:
    """Protocol v1's own validation of the mapped request: the same rules and messages as on JSON lines."""
    spelling = v1.pop(SPELLING, None)
    try:
        req = P.parse_object(v1, spelling)
    except P.ProtocolError as exc:
        raise from_protocol_error(exc.code, str(exc)) from None
    assert isinstance(req, P.Completion)
    return req


# ---- results ----

STOP_TYPE = {"eos": "eos", "length": "limit", "context": "limit", "stop": "word", "cancelled": "none"}


def llama_timings(done: dict[str, Any]) -> dict[str, Any]:
    """protocol v1's done.timings -> llama-server's timings object."""
    t = done.get("timings") or {}
    return openai_shapes.llama_timings(done.get("tokens_cached", 0), t.get("prompt_n", 0), t.get("prompt_ms", 0.0),
                                       t.get("predicted_n", 0), t.get("predicted_ms", 0.0))


def usage_of(dones: list[dict[str, Any]]) -> dict[str, Any]:
    """OpenAI's usage of several choices: the prompt counted once per prompt, the completions summed."""
    parts = [usage(d) for d in dones]
    prompt = sum(p["prompt_tokens"] for p in parts)
    completion = sum(p["completion_tokens"] for p in parts)
    cached = sum(p["prompt_tokens_details"]["cached_tokens"] for p in parts)
    return openai_shapes.usage(prompt, completion, cached)


def usage(done: dict[str, Any]) -> dict[str, Any]:
    cached = done.get("tokens_cached", 0)
    return openai_shapes.usage(done.get("tokens_evaluated", 0) + cached, done.get("tokens_predicted", 0), cached)

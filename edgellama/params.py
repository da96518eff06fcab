"""The one table of request parameters: every field a generation request takes, once, with its type,
range, default and its name in each front end (a `run` flag, protocol v1 / llama-server, OpenAI, the
Python API). Every front end validates through `check`, so a rule and its message are the same
everywhere; only the spelling of the field's name differs.

Knows nothing of sockets, flags parsing or the engine: values in, GenParams or a ParamError out.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from edgellama.gguf.limits import INT32_MAX  # the sampler's and the engine's integer fields are C int32

SEED_MAX = (1 << 64) - 1  # the sampler's generator takes any 64-bit seed
MAX_STOPS = 16
MAX_BIASES = 1024  # logit_bias entries (OpenAI takes 300)

# the front ends, each with its own spelling of a field's name in messages
CLI, V1, OPENAI, PYTHON = "cli", "v1", "openai", "python"


class ParamError(ValueError):
    """A request parameter outside what the engine takes; `name` is the field as the front end spells it."""

    def __init__(self, name: str, message: str, field: str = "") -> None:
        super().__init__(f"{name} {message}")
        self.name = name  # as the front end spells it
        self.field = field  # the GenParams attribute
        self.detail = message


@dataclass
class GenParams:
    """One request's generation settings (llama.cpp's names and defaults). `constraint` is a parsed
    edgellama.grammar.Grammar (or None); `stop` holds the request's stop strings only (a chat format's
    stop pieces are added by the generation object)."""

    n_predict: int = -1
    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    mirostat: int = 0
    mirostat_tau: float = 5.0
    mirostat_eta: float = 0.1
    seed: int | None = None  # None or -1: a random seed
    ignore_eos: bool = False
    stop: list[str] = field(default_factory=list)
    # (token id, or a text whose every token is biased as llama-server does, bias); -inf: never sampled
    logit_bias: list[tuple[int | str, float]] = field(default_factory=list)
    constraint: Any = None


@dataclass(frozen=True)
class Field:
    name: str  # the GenParams attribute (protocol v1's and llama-server's name)
    kind: str  # "int", "float", "bool", "seed", "stops", "bias"
    names: Mapping[str, str]  # front end -> its spelling (missing: the front end does not take it)
    lo: float | None = None  # inclusive bounds
    hi: float | None = None
    lo_open: bool = False  # lo itself refused (a penalty of 0 divides by zero)
    choices: tuple[int, ...] = ()
    hint: str = ""  # what a special value means, appended to a range message
    notes: Mapping[str, str] = field(default_factory=dict)  # front end -> where its meaning differs, and why


def _names(cli: str | None, v1: str | None = None, openai: str | None = None, python: str | None = None,
           *, attr: str) -> dict[str, str]:
    out = {V1: v1 or attr, OPENAI: openai or v1 or attr, PYTHON: python or attr}
    if cli is not None:
        out[CLI] = cli
    return out


FIELDS: tuple[Field, ...] = (
    Field("n_predict", "int", _names("-n/--n-predict", openai="max_tokens", python="max_tokens", attr="n_predict"),
          -1, INT32_MAX, hint="-1: until the end of text or the limit",
          notes={PYTHON: "llama-cpp-python's: None or <= 0 is until the end of text or the context; default 16 "
                         "for completions, no limit for chat",
                 OPENAI: "also `max_completion_tokens`; `n_predict` is taken too"}),
    Field("temperature", "float", _names("--temp", attr="temperature"), 0.0, None, hint="0: greedy"),
    Field("top_k", "int", _names("--top-k", attr="top_k"), 0, INT32_MAX, hint="0: off"),
    Field("top_p", "float", _names("--top-p", attr="top_p"), 0.0, 1.0),
    Field("min_p", "float", _names("--min-p", attr="min_p"), 0.0, 1.0),
    Field("repeat_penalty", "float", _names("--repeat-penalty", attr="repeat_penalty"), 0.0, None, lo_open=True),
    Field("repeat_last_n", "int", _names("--repeat-last-n", attr="repeat_last_n"), -1, INT32_MAX,
          hint="-1: the context size"),
    Field("mirostat", "int", _names("--mirostat", python="mirostat_mode", attr="mirostat"), choices=(0, 2),
          hint="0: off, 2: mirostat v2; v1 is not implemented"),
    Field("mirostat_tau", "float", _names("--mirostat-ent", attr="mirostat_tau"), 0.0, None, lo_open=True),
    Field("mirostat_eta", "float", _names("--mirostat-lr", attr="mirostat_eta"), 0.0, None),
    Field("seed", "seed", _names("-s/--seed", attr="seed"), -1, SEED_MAX, hint="-1: random",
          notes={PYTHON: "None or < 0: the LLM's own seed (LLM(seed=...)), else random"}),
    Field("ignore_eos", "bool", _names("--ignore-eos", attr="ignore_eos")),
    Field("stop", "stops", _names("-r/--reverse-prompt", attr="stop"),
          notes={CLI: "llama-cli's reverse prompt: generation stops there and the text printed ends with it; the "
                      "other doors leave the stop string out of the text"}),
    Field("logit_bias", "bias", _names("-l/--logit-bias", attr="logit_bias")),
)
BY_NAME = {f.name: f for f in FIELDS}


def spelled(f: Field, front: str) -> str:
    name = f.names.get(front, f.name)
    return name if front == CLI else f"'{name}'"


def _fmt(x: float) -> str:
    return str(int(x)) if float(x).is_integer() and abs(x) < 1e18 else str(x)


def check_value(f: Field, value: Any, front: str = V1) -> Any:
    try:
        return _check_value(f, value, front)
    except ParamError as exc:
        raise ParamError(exc.name, exc.detail, f.name) from None


def _check_value(f: Field, value: Any, front: str) -> Any:
    """value as f takes it (an int of a float field becomes a float), or ParamError naming f as front spells
    it. JSON's types are strict: true is not a number, 1.0 is not an integer."""
    name = spelled(f, front)
    if f.kind == "bool":
        if not isinstance(value, bool):
            raise ParamError(name, "must be true or false")
        return value
    if f.kind == "stops":
        if isinstance(value, str):
            value = [value]
        if (not isinstance(value, list) or len(value) > MAX_STOPS
                or not all(isinstance(s, str) and s for s in value)):
            raise ParamError(name, f"must be a string or a list of up to {MAX_STOPS} non-empty strings")
        return list(value)
    if f.kind == "bias":
        return _bias(name, value)
    if f.kind == "seed" and value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ParamError(name, "must be an integer" if f.kind in ("int", "seed") else "must be a number")
    if f.kind in ("int", "seed"):
        if not isinstance(value, int):
            raise ParamError(name, "must be an integer")
    else:
        value = float(value)
        if not math.isfinite(value):  # 1e999 reads as infinity; a NaN passes every comparison
            raise ParamError(name, "must be a finite number")
    hint = f" ({f.hint})" if f.hint else ""
    if f.choices:
        if value not in f.choices:
            raise ParamError(name, f"must be one of {', '.join(map(str, f.choices))}{hint}")
        return value
    if f.kind == "seed" and not (value == -1 or 0 <= value <= SEED_MAX):
        raise ParamError(name, f"must be in 0..2^64-1, or -1{hint}")
    if f.hi is not None and value > f.hi:
        if f.lo is not None and f.kind != "float":
            raise ParamError(name, f"must be at most {_fmt(f.hi)} ({_fmt(f.lo)}..{_fmt(f.hi)}){hint}")
        raise ParamError(name, f"must be in [{_fmt(f.lo or 0)}, {_fmt(f.hi)}]{hint}")
    if f.lo is not None and (value < f.lo or (f.lo_open and value == f.lo)):
        if f.hi is not None and f.kind == "float":
            raise ParamError(name, f"must be in [{_fmt(f.lo)}, {_fmt(f.hi)}]{hint}")
        raise ParamError(name, f"must be {'>' if f.lo_open else '>='} {_fmt(f.lo)}{hint}")
    return value


def _bias(name: str, value: Any) -> list[tuple[int | str, float]]:
    """OpenAI's map {"token id": bias} or llama-server's [[token, bias], ...] (a token an id or a text, a bias
    a number or false: never) -> (token, bias) pairs, false as -inf."""
    shape = (f"must be a map of token ids to biases ({{\"15043\": -5}}) or a list of [token id or text, bias or "
             f"false] pairs, up to {MAX_BIASES}")
    if isinstance(value, Mapping):
        items: list[Any] = [[k, v] for k, v in value.items()]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        raise ParamError(name, shape)
    if len(items) > MAX_BIASES:
        raise ParamError(name, shape)
    out: list[tuple[int | str, float]] = []
    for item in items:
        if not isinstance(item, (list, tuple)) or len(item) != 2:
            raise ParamError(name, shape)
        tok, bias = item
        if isinstance(tok, str) and tok.strip().lstrip("-").isdigit():
            tok = int(tok)  # OpenAI's keys are token ids written as strings
        if isinstance(tok, bool) or not (isinstance(tok, int) and 0 <= tok <= INT32_MAX or isinstance(tok, str) and tok):
            raise ParamError(name, f"{shape}; {json_repr(tok)} is not a token id >= 0 or a text")
        if bias is False or bias == -math.inf:
            bias = -math.inf
        elif isinstance(bias, bool) or not isinstance(bias, (int, float)) or not math.isfinite(bias):
            raise ParamError(name, f"{shape}; the bias of {json_repr(tok)} must be a finite number or false")
        out.append((tok, float(bias)))
    return out


def lone_surrogate(value: Any, path: str) -> str | None:
    """The path (`stop[1]`, `messages[0].content`) of the first string or key in a JSON value that holds a
    lone UTF-16 surrogate (JSON's "\\ud800" escape decodes to one: no character, no UTF-8), or None.
    Walked with a stack: a value nested as deep as the JSON parser allows is no recursion error here."""
    stack = [(path, value)]
    while stack:
        where, v = stack.pop()
        if isinstance(v, str):
            if any(0xD800 <= ord(c) <= 0xDFFF for c in v):
                return where
        elif isinstance(v, list):
            stack += reversed([(f"{where}[{i}]", x) for i, x in enumerate(v)])
        elif isinstance(v, dict):
            for k, x in reversed(list(v.items())):
                name = f"{where}.{k}" if where else str(k)
                stack += [(name, x), (name, k)]
    return None


def check_token_ids(name: str, ids: Any, n_vocab: int) -> None:
    """A ParamError naming the field when a prompt given as token ids holds one outside the vocabulary (the
    same message on every door: the Python API, protocol v1 and HTTP)."""
    for t in ids:
        if not 0 <= t < n_vocab:
            raise ParamError(f"field {name!r}:", f"token id {t} is out of range for a vocabulary of {n_vocab} "
                                                  f"(0..{n_vocab - 1})")


def check_unicode(value: Any, path: str) -> None:
    """A ParamError naming the field when value holds text that is not valid Unicode (lone surrogates)."""
    found = lone_surrogate(value, path)
    if found:
        raise ParamError(f"field {found!r}", "is not valid Unicode: it holds a lone UTF-16 surrogate "
                                              "(\\ud800-\\udfff) that encodes no character")


def json_repr(v: Any) -> str:
    import json

    return json.dumps(v)[:40]


def check(params: GenParams, front: str = PYTHON) -> GenParams:
    """Every field of params within the table's rules (messages name fields as front spells them)."""
    for f in FIELDS:
        setattr(params, f.name, check_value(f, getattr(params, f.name), front))
    if params.seed == -1:
        params.seed = None
    return params


def update(params: GenParams, values: Mapping[str, Any], front: str) -> GenParams:
    """params with values (keys are GenParams names) checked and set; a JSON null keeps the default."""
    for name, value in values.items():
        f = BY_NAME[name]
        if value is None and f.kind != "seed":
            continue
        setattr(params, name, check_value(f, value, front))
    if params.seed == -1:
        params.seed = None
    return params


def names(front: str) -> dict[str, str]:
    """front's spelling -> GenParams name, for the fields front takes."""
    return {f.names[front]: f.name for f in FIELDS if front in f.names}


def as_dict(params: GenParams) -> dict[str, Any]:
    """The table's fields of params (for /props and /slots), seed -1 for random as llama-server."""
    out = {f.name: getattr(params, f.name) for f in FIELDS}
    out["seed"] = -1 if params.seed is None else params.seed
    out["stop"] = list(params.stop)
    out["logit_bias"] = [[t, False if b == -math.inf else b] for t, b in params.logit_bias]  # llama-server's form
    return out


def field_names() -> tuple[str, ...]:
    return tuple(f.name for f in fields(GenParams) if f.name in BY_NAME)


# ---- the other request fields: what each door calls them and where a door differs (docs/parameters.md) ----

@dataclass(frozen=True)
class RequestField:
    name: str
    what: str
    names: Mapping[str, str]  # front end -> its spelling ("" or missing: the front end does not take it)
    notes: str = ""


REQUEST_FIELDS: tuple[RequestField, ...] = (
    RequestField("prompt", "the text (or token ids, or a list of either over HTTP) to continue",
                 {CLI: "-p/--prompt, -f/--file", V1: "prompt", OPENAI: "prompt", PYTHON: "prompt"},
                 "special-token text (`<|im_start|>`) is parsed into special tokens on every door, as llama-cli, "
                 "llama-server and llama-cpp-python do; `run --no-parse-special` and protocol v1's `special: false` "
                 "read it as plain text. Text that is not valid Unicode (a lone UTF-16 surrogate) is refused on every "
                 "door, naming the field"),
    RequestField("messages", "chat turns, rendered by the model's own chat template",
                 {CLI: "--chat with -p, -cnv", V1: "messages", OPENAI: "messages",
                  PYTHON: "create_chat_completion(messages)"}),
    RequestField("stream", "tokens as they come", {V1: "stream (default true)", OPENAI: "stream (default false)",
                                                  PYTHON: "stream (default False)"},
                 "`run` always streams; llama-server's `/completion` defaults to false"),
    RequestField("grammar", "GBNF text the output must match (docs/grammar.md)",
                 {CLI: "--grammar, --grammar-file", V1: "grammar", OPENAI: "grammar", PYTHON: "grammar"}),
    RequestField("json_schema", "a JSON Schema the output must validate against (docs/grammar.md)",
                 {CLI: "-j/--json-schema", V1: "json_schema", OPENAI: "json_schema, response_format",
                  PYTHON: "response_format (chat), grammar=grammar_from_schema(...)"},
                 "`response_format` is read one way on every door (`grammar.response_format_schema`): a missing "
                 "`type` is an error"),
    RequestField("logprobs", "each token's log-probability and the n most likely (0..20)",
                 {V1: "logprobs, n_probs", OPENAI: "logprobs (+ top_logprobs for chat)",
                  PYTHON: "logprobs (completions: N; chat: logprobs=True, top_logprobs=N)"},
                 "one bound and message on every door (`logprobs.check_top`)"),
    RequestField("echo", "the prompt in front of the text, with its log-probabilities",
                 {PYTHON: "create_completion(echo=True)"},
                 "`/v1/completions` refuses it by name, as llama-server does"),
    RequestField("tools", "OpenAI's tools, tool_choice, parallel_tool_calls (docs/http.md)",
                 {V1: "tools, tool_choice, parallel_tool_calls", OPENAI: "tools, tool_choice, parallel_tool_calls",
                  PYTHON: "tools, tool_choice, parallel_tool_calls"},
                 "a tool whose schema cannot be enforced is refused on every door, naming the tool and the keyword"),
    RequestField("n", "several choices of one prompt (seed + i each)", {OPENAI: "n"}),
    RequestField("model", "which model of a service with several answers", {V1: "model", OPENAI: "model"}),
    RequestField("keep_alive", "how long the model stays loaded after this request", {V1: "keep_alive",
                                                                                         OPENAI: "keep_alive"}),
    RequestField("lora", "per-request LoRA adapter scales", {V1: "lora", OPENAI: "lora"},
                 "`run` and the Python API set adapters when the model loads (--lora, LLM(loras=...))"),
)

FRONT_TITLES = ((CLI, "`edgellama run`"), (PYTHON, "Python API"), (V1, "protocol v1 / llama-server"),
                (OPENAI, "OpenAI routes"))


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown() -> str:
    """docs/parameters.md: this module's tables, as the tests require the file to read."""
    head = "| field | " + " | ".join(t for _, t in FRONT_TITLES)
    lines = ["# Request parameters", "",
             ("Generated from `edgellama/params.py` (`python -m edgellama.params > docs/parameters.md`); "
             "`tests/test_params.py` keeps the two equal. Every door checks these fields through the one table, "
             "so a rule and its message are the same everywhere; only the spelling of a field differs, and where a "
             "door gives a field another meaning (as the ecosystem it copies does) the notes say so."), "",
             "## Sampling and generation", "", head + " | range | default | notes |",
             "|" + " --- |" * (len(FRONT_TITLES) + 4)]
    defaults = GenParams()
    for f in FIELDS:
        if f.choices:
            rng = ", ".join(map(str, f.choices))
        elif f.lo is not None or f.hi is not None:
            lo = "" if f.lo is None else ("(" if f.lo_open else "[") + _fmt(f.lo)
            hi = "∞)" if f.hi is None else _fmt(f.hi) + "]"
            rng = f"{lo}, {hi}" if f.lo is not None else f"..{hi}"
        else:
            rng = {"bool": "true / false", "stops": f"up to {MAX_STOPS} strings",
                   "bias": f"up to {MAX_BIASES} entries"}.get(f.kind, "")
        default = getattr(defaults, f.name)
        notes = "; ".join([f.hint] * bool(f.hint) + [f"{dict(FRONT_TITLES)[k]}: {v}" for k, v in f.notes.items()])
        cells = [f"`{f.names[k]}`" if k in f.names else "-" for k, _ in FRONT_TITLES]
        lines.append(f"| {f.name} | " + " | ".join(cells) + f" | {rng} | {json_repr(default)} | {_cell(notes)} |")
    lines += ["", "## The other fields of a request", "", head + " | what | notes |",
              "|" + " --- |" * (len(FRONT_TITLES) + 3)]
    for r in REQUEST_FIELDS:
        cells = [_cell(r.names[k]) if r.names.get(k) else "-" for k, _ in FRONT_TITLES]
        lines.append(f"| {r.name} | " + " | ".join(cells) + f" | {_cell(r.what)} | {_cell(r.notes)} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(markdown(), end="")

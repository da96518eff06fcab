"""HTTP on the service's socket (issue 19) with real clients: Debian's curl over --unix-socket, the real
`openai` SDK through its httpx transport's `uds=`, raw sockets for bad HTTP, and TCP with an API key.
One SmolLM2 server for the module (it has a chat template); greedy, short generations."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import skip_or_fail
from tests.service_util import Conn, ServerProc, UnixHTTP, cli_env, openai_over_unix_socket, text_of

KEY = "test-key-19"
MAX_BODY = 4096  # --max-line: the body limit
HEADER_TIMEOUT = 2.0
PROMPT = "The three primary colors are"
CHAT = [{"role": "user", "content": "Name a color."}]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def server(smollm2_path: Path) -> Iterator[ServerProc]:
    port = free_port()
    srv = ServerProc("-m", str(smollm2_path), "--max-line", str(MAX_BODY), "--max-tokens", "200",
                     "--http-header-timeout", str(HEADER_TIMEOUT), "--http-port", str(port), "--api-key", KEY,
                     "--log-format", "json")
    srv.port = port  # type: ignore[attr-defined]
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.kill()


def call(srv: ServerProc, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    c = UnixHTTP(srv.path)
    try:
        c.request(method, path, body=None if body is None else json.dumps(body),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        return r.status, json.loads(data) if r.getheader("content-type", "").startswith("application/json") else data
    finally:
        c.close()


def curl(srv: ServerProc, path: str, body: dict[str, Any] | None = None) -> str:
    if shutil.which("curl") is None:
        skip_or_fail("curl is not installed (apt install curl)")
    cmd = ["curl", "-sS", "--no-buffer", "--unix-socket", srv.path, f"http://localhost{path}"]
    if body is not None:
        cmd += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True)
    return r.stdout


def sse_data(text: str) -> list[str]:
    """The `data:` payloads of a server-sent event stream, in order."""
    return [line[len("data: "):] for line in text.split("\n") if line.startswith("data: ")]


def protocol_v1_text(srv: ServerProc, **req: Any) -> str:
    with srv.connect() as c:
        events = c.ask({"id": "v1", "temperature": 0, "cache_prompt": False, **req})
    assert events[-1]["event"] == "done", events
    return text_of(events)


# ---- curl ----

def test_curl_health_and_completion_with_and_without_stream(server: ServerProc) -> None:
    assert json.loads(curl(server, "/health")) == {"status": "ok"}
    req = {"prompt": PROMPT, "n_predict": 6, "temperature": 0, "cache_prompt": False}
    whole = json.loads(curl(server, "/completion", req))
    assert whole["content"] and whole["stop"] is True and whole["stop_type"] == "limit"
    assert whole["tokens_predicted"] == 6 and whole["timings"]["predicted_n"] == 6
    assert whole["content"] == protocol_v1_text(server, prompt=PROMPT, n_predict=6)
    events = [json.loads(d) for d in sse_data(curl(server, "/completion", req | {"stream": True}))]
    assert [e["stop"] for e in events] == [False] * 6 + [True]  # one event per token, then the result
    assert "".join(e["content"] for e in events) == whole["content"]
    assert events[-1]["tokens_predicted"] == 6 and events[-1]["timings"]["predicted_n"] == 6


def test_curl_chat_stream_ends_with_done(server: ServerProc) -> None:
    out = curl(server, "/v1/chat/completions", {"messages": CHAT, "max_tokens": 5, "temperature": 0,
                                                 "stream": True, "cache_prompt": False})
    data = sse_data(out)
    assert data[-1] == "[DONE]"
    chunks = [json.loads(d) for d in data[:-1]]
    assert all(c["object"] == "chat.completion.chunk" and len({c["id"] for c in chunks}) == 1 for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert text == protocol_v1_text(server, messages=CHAT, n_predict=5) and text.strip()


# ---- the openai SDK ----

@pytest.fixture(scope="module")
def openai_client(server: ServerProc) -> Iterator[Any]:
    with openai_over_unix_socket(server.path) as client:
        yield client


def test_openai_sdk_chat_completions_and_models(server: ServerProc, openai_client: Any, smollm2_path: Path) -> None:
    want_chat = protocol_v1_text(server, messages=CHAT, n_predict=6)
    nocache = {"cache_prompt": False}
    r = openai_client.chat.completions.create(model="any", messages=CHAT, max_tokens=6, temperature=0,
                                              extra_body=nocache)
    assert r.choices[0].message.content == want_chat and want_chat.strip()
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 6 and r.usage.prompt_tokens > 6
    stream = openai_client.chat.completions.create(model="any", messages=CHAT, max_tokens=6, temperature=0,
                                                   stream=True, stream_options={"include_usage": True},
                                                   extra_body=nocache)
    chunks = list(stream)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == want_chat
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 6  # stream_options.include_usage: the last chunk
    want_text = protocol_v1_text(server, prompt=PROMPT, n_predict=6)
    c = openai_client.completions.create(model="any", prompt=PROMPT, max_tokens=6, temperature=0, extra_body=nocache)
    assert c.choices[0].text == want_text and c.usage.completion_tokens == 6
    models = list(openai_client.models.list())
    assert [m.id for m in models] == [smollm2_path.name]


# ---- field names against llama-server's README (tools/server/README.md of llama.cpp, as vendored in
# llama-cpp-python 0.3.36): request fields it documents, and the result fields a client reads ----

LLAMA_REQUEST = {  # /completion options at llama-server's documented defaults (or a value this engine serves)
    "prompt": PROMPT, "temperature": 0.0, "dynatemp_range": 0.0, "top_k": 40, "top_p": 0.95, "min_p": 0.05,
    "n_predict": 3, "n_keep": 0, "stream": False, "stop": [], "typical_p": 1.0, "repeat_penalty": 1.0,
    "repeat_last_n": 64, "presence_penalty": 0.0, "frequency_penalty": 0.0, "dry_multiplier": 0.0,
    "xtc_probability": 0.0, "mirostat": 0, "seed": -1, "ignore_eos": False, "logit_bias": [], "n_probs": 0,
    "min_keep": 0, "t_max_predict_ms": 0, "id_slot": -1, "cache_prompt": True, "return_tokens": False,
    "samplers": ["top_k", "top_p", "min_p", "temperature"], "timings_per_token": False,
    "post_sampling_probs": False, "response_fields": [], "lora": []}
LLAMA_RESULT = {"content", "stop", "generation_settings", "model", "prompt", "stop_type", "stopping_word", "timings",
                "tokens_cached", "tokens_evaluated", "tokens_predicted", "truncated"}
LLAMA_TIMINGS = {"cache_n", "prompt_n", "prompt_ms", "prompt_per_token_ms", "prompt_per_second", "predicted_n",
                 "predicted_ms", "predicted_per_token_ms", "predicted_per_second"}
LLAMA_STOP_TYPES = {"none", "eos", "limit", "word"}
LLAMA_PROPS = {"default_generation_settings", "total_slots", "model_path", "chat_template", "modalities",
               "build_info"}
LLAMA_SLOT = {"id", "n_ctx", "speculative", "is_processing", "params"}
LLAMA_PARAMS = {"n_predict", "seed", "temperature", "top_k", "top_p", "min_p", "repeat_last_n", "repeat_penalty",
                "stop", "max_tokens", "stream", "n_probs", "samplers", "lora"}
OPENAI_USAGE = {"completion_tokens", "prompt_tokens", "total_tokens", "prompt_tokens_details"}


def test_llama_server_field_names(server: ServerProc) -> None:
    status, r = call(server, "POST", "/completion", LLAMA_REQUEST)
    assert status == 200, r
    assert LLAMA_RESULT <= set(r) and LLAMA_TIMINGS <= set(r["timings"]), set(r)
    assert r["stop_type"] in LLAMA_STOP_TYPES and r["stop_type"] == "limit"
    assert LLAMA_PARAMS <= set(r["generation_settings"])
    stopped = call(server, "POST", "/completion", {"prompt": PROMPT, "n_predict": 8, "temperature": 0,
                                                   "stop": [r["content"].split()[-1]]})[1]
    assert stopped["stop_type"] == "word" and stopped["stopping_word"] == r["content"].split()[-1]
    status, props = call(server, "GET", "/props")
    assert status == 200 and LLAMA_PROPS <= set(props) and "im_start" in props["chat_template"]
    assert LLAMA_PARAMS <= set(props["default_generation_settings"]["params"])
    status, slots = call(server, "GET", "/slots")
    assert status == 200 and len(slots) == 1 and LLAMA_SLOT <= set(slots[0])
    toks = call(server, "POST", "/tokenize", {"content": "Hello world", "with_pieces": True})[1]["tokens"]
    assert "".join(t["piece"] for t in toks) == "Hello world" and all(set(t) == {"id", "piece"} for t in toks)
    ids = call(server, "POST", "/tokenize", {"content": "Hello world"})[1]["tokens"]
    assert ids == [t["id"] for t in toks]
    assert call(server, "POST", "/detokenize", {"tokens": ids})[1] == {"content": "Hello world"}
    prompt = call(server, "POST", "/apply-template", {"messages": CHAT})[1]["prompt"]
    assert prompt.endswith("<|im_start|>assistant\n") and "Name a color." in prompt
    status, text = call(server, "GET", "/metrics")
    assert status == 200 and b"llamacpp:tokens_predicted_total" in text
    status, chat = call(server, "POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2})
    assert status == 200 and OPENAI_USAGE <= set(chat["usage"]) and LLAMA_TIMINGS <= set(chat["timings"])
    assert chat["object"] == "chat.completion" and chat["choices"][0]["finish_reason"] == "length"


@pytest.mark.parametrize(("field", "value"), [("echo", True), ("suffix", "}"), ("best_of", 2)])
def test_openai_completion_fields_not_served_are_refused_by_name(server: ServerProc, field: str, value: Any) -> None:
    """Never silently ignored (echo was): a 400 naming the field, as llama-server answers."""
    got, r = call(server, "POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, field: value})
    assert got == 400 and f"field {field!r} is not supported" in r["error"]["message"], r
    assert call(server, "POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 2, "echo": False})[0] == 200


@pytest.mark.parametrize(("path", "body", "field"), [
    ("/completion", {"prompt": "Hi \ud800", "n_predict": 2}, "prompt"),
    ("/completion", {"prompt": PROMPT, "stop": ["ok", "\udc00"], "n_predict": 2}, "stop[1]"),
    ("/v1/completions", {"prompt": "Hi \ud800", "max_tokens": 2}, "prompt"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "\ud83d"}], "max_tokens": 2},
     "messages[0].content"),
    ("/apply-template", {"messages": [{"role": "user", "content": "\ud800"}]}, "messages[0].content"),
    ("/tokenize", {"content": "\udfff"}, "content"),
])
def test_text_that_is_not_unicode_is_a_400_naming_the_field(server: ServerProc, path: str, body: dict[str, Any],
                                                            field: str) -> None:
    """A JSON escape of half a UTF-16 pair is the client's mistake: a 400 naming the field, before anything is
    generated, on every route (it was a 500 after the whole answer on /completion)."""
    got, r = call(server, "POST", path, body)
    assert got == 400 and f"field {field!r} is not valid Unicode" in r["error"]["message"], (path, r)
    with server.connect() as c:
        ev = c.ask({"id": 9, **{k: v for k, v in body.items() if k != "max_tokens"}})[-1]
        if path in ("/completion", "/v1/chat/completions"):  # the same request over protocol v1
            assert ev["event"] == "error" and ev["code"] == "bad_request" and field in ev["message"], ev


VOLUME_TOOL = {"type": "function", "function": {"name": "set_volume", "parameters": {
    "type": "object", "properties": {"level": {"type": "integer", "minimum": 0, "maximum": 100, "multipleOf": 5}},
    "required": ["level"]}}}
LOOSE_TOOL = {"type": "function", "function": {"name": "find", "parameters": {
    "type": "object", "properties": {"q": {"type": "string", "pattern": "[0-9]+"}}, "required": ["q"]}}}


def test_a_tool_schema_that_cannot_be_enforced_is_refused_on_every_door(server: ServerProc) -> None:
    """Never a silent any-object: the tool and the keyword are named before anything is generated."""
    msgs = [{"role": "user", "content": "Volume to 40."}]
    for path, choice in (("/v1/chat/completions", "required"), ("/v1/chat/completions", "auto"),
                         ("/apply-template", None)):
        body: dict[str, Any] = {"messages": msgs, "tools": [VOLUME_TOOL], "max_tokens": 4}
        if choice:
            body["tool_choice"] = choice
        got, r = call(server, "POST", path, body)
        assert got == 400, (path, r)
        assert "tools[0] (set_volume)" in r["error"]["message"] and "'multipleOf'" in r["error"]["message"], r
    with server.connect() as c:
        ev = c.ask({"id": 1, "messages": msgs, "tools": [VOLUME_TOOL], "tool_choice": "required"})[-1]
    assert ev["event"] == "error" and ev["code"] == "bad_request" and "'multipleOf'" in ev["message"], ev


def test_apply_template_renders_tools_as_chat_does_and_relaxations_are_logged(server: ServerProc) -> None:
    msgs = [{"role": "user", "content": "Find 42."}]
    plain = call(server, "POST", "/apply-template", {"messages": msgs})[1]["prompt"]
    with_tools = call(server, "POST", "/apply-template", {"messages": msgs, "tools": [LOOSE_TOOL]})[1]["prompt"]
    assert '"find"' in with_tools and '"find"' not in plain  # SmolLM2's generic tool text names the tool
    none = call(server, "POST", "/apply-template", {"messages": msgs, "tools": [LOOSE_TOOL], "tool_choice": "none"})
    assert none[1]["prompt"] == plain
    got, r = call(server, "POST", "/v1/chat/completions", {"messages": msgs, "tools": [LOOSE_TOOL],
                                                             "tool_choice": "required", "max_tokens": 24})
    assert got == 200, r
    deadline = time.monotonic() + 10
    while not [x for x in server.records() if x.get("msg") == "schema read loosely"] and time.monotonic() < deadline:
        time.sleep(0.1)
    notes = [x for x in server.records() if x.get("msg") == "schema read loosely"]
    assert notes and "tool find #/properties/q" in notes[-1]["notes"][0] and "not anchored" in notes[-1]["notes"][0]


@pytest.mark.parametrize(("body", "status", "words"), [
    ({"prompt": PROMPT, "mirostat": 1}, 400, "'mirostat' must be one of 0, 2"),  # v2 is served (below)
    ({"prompt": "", "n_predict": 2}, 400, "field 'prompt' must not be empty"),
    ({"prompt": PROMPT, "n_probs": 21}, 400, "'n_probs' must be an integer in 0..20"),
    ({"prompt": PROMPT, "typical_p": 0.5}, 400, "'typical_p' is not supported"),
    ({"prompt": PROMPT, "post_sampling_probs": "yes"}, 400, "'post_sampling_probs' must be true or false"),
    ({"prompt": [1, -2, 3]}, 400, "token ids (>= 0)"),
    ({"prompt": [[1, 2], []]}, 400, "field 'prompt' must not be empty"),
    ({"prompt": PROMPT, "top_p": 3}, 400, "top_p"),  # protocol v1's range check, its words
    ({"prompt": PROMPT, "grammar": "root ::= \"yes"}, 400, "line 1, column 14: unterminated string"),
    ({"prompt": PROMPT, "json_schema": {"type": "integer", "multipleOf": 2}}, 400, "'multipleOf' is not supported"),
    ({"prompt": PROMPT, "lora": [{"id": 0, "scale": 1}]}, 400, "lora: no adapter 0"),  # none loaded
])
def test_refused_fields_get_llama_server_error_json(server: ServerProc, body: dict[str, Any], status: int,
                                                    words: str) -> None:
    got, r = call(server, "POST", "/completion", body)
    assert got == status and r["error"]["code"] == status and r["error"]["type"] == "invalid_request_error"
    assert words in r["error"]["message"], r


def test_openai_fields_are_named_as_sent_and_mirostat_2_is_served(server: ServerProc) -> None:
    got, r = call(server, "POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": -5})
    assert got == 400 and "'max_tokens' must be >= -1" in r["error"]["message"], r
    got, r = call(server, "POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 4, "mirostat": 2,
                                                            "mirostat_tau": 4.0, "seed": 7})
    assert got == 200 and r["usage"]["completion_tokens"] >= 1, r
    got, r = call(server, "POST", "/completion", {"prompt": PROMPT, "n_predict": 4, "mirostat": 2, "seed": 7})
    assert got == 200 and r["generation_settings"]["n_predict"] == 4, r


def test_a_character_cut_by_the_token_limit_is_not_sent_as_u_fffd(server: ServerProc) -> None:
    """Issue 32: SmolLM2 answers "Say hello" with emoji; 10 tokens cut the fourth one in two. The incomplete
    character is dropped (llama-server sends the bytes it has: U+FFFD), streamed or not."""
    body = {"messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 10, "temperature": 0}
    got, r = call(server, "POST", "/v1/chat/completions", body)
    text = r["choices"][0]["message"]["content"]
    assert got == 200 and "\ufffd" not in text and r["choices"][0]["finish_reason"] == "length", r
    stream = curl(server, "/v1/chat/completions", body | {"stream": True})
    assert "\\ufffd" not in stream and "\ufffd" not in stream


def test_lora_adapters_on_a_server_without_adapters(server: ServerProc) -> None:
    """llama-server's LoRA routes with nothing loaded (tests/test_service_lora_http.py has adapters)."""
    assert call(server, "GET", "/lora-adapters") == (200, [])
    assert call(server, "POST", "/lora-adapters", []) == (200, {"success": True})
    for path, body in (("/lora-adapters", [{"id": 0, "scale": 1}]),
                       ("/completion", {"prompt": PROMPT, "n_predict": 1, "lora": [{"id": 0, "scale": 1}]})):
        status, r = call(server, "POST", path, body)
        assert status == 400 and "no adapter 0 (the server loaded 0)" in r["error"]["message"], r


@pytest.mark.parametrize(("body", "want"), [
    ({"grammar": "root ::= \"yes\""}, {"grammar": "root ::= \"yes\""}),
    ({"json_schema": {"type": "string"}}, {"json_schema": {"type": "string"}}),
    ({"response_format": {"type": "text"}}, {}),
    ({"response_format": {"type": "json_object"}}, {"json_schema": {"type": "object"}}),
    ({"response_format": {"type": "json_object", "schema": {"type": "array"}}}, {"json_schema": {"type": "array"}}),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": {"type": "integer"}}}},
     {"json_schema": {"type": "integer"}}),
])
def test_grammar_fields_map_onto_protocol_v1_names(body: dict[str, Any], want: dict[str, Any]) -> None:
    from edgellama.service.http import fields

    assert fields.grammar_fields(body) == want
    v1 = fields.openai_chat({"messages": CHAT, **body}, "g")
    assert {k: v1[k] for k in ("grammar", "json_schema") if k in v1} == want


PERSON = {"type": "object", "properties": {"name": {"type": "string", "minLength": 1, "maxLength": 16},
                                          "age": {"type": "integer"}}, "required": ["name", "age"],
          "additionalProperties": False}


def test_grammar_and_json_schema_served(server: ServerProc) -> None:
    """Protocol v1 on the socket and every HTTP spelling: outputs inside their grammar or schema, a bad
    grammar a clear error, and the server goes on."""
    import jsonschema

    with server.connect() as c:
        events = c.ask({"id": "g1", "prompt": "Is the sky blue? Answer:", "grammar": 'root ::= " yes" | " no"',
                        "seed": 1})
        assert events[-1]["stop_reason"] == "eos" and text_of(events) in (" yes", " no"), events
        bad = c.ask({"id": "g2", "prompt": "x", "grammar": 'root ::= "a" b'})[-1]
        assert bad["code"] == "bad_request" and "line 1, column 14: undefined rule 'b'" in bad["message"], bad
        bad = c.ask({"id": "g3", "prompt": "x", "json_schema": {"type": "string", "not": {"const": "x"}}})[-1]
        assert bad["code"] == "bad_request" and "keyword 'not' is not supported" in bad["message"], bad
    status, r = call(server, "POST", "/completion", {"prompt": "A person as JSON:", "json_schema": PERSON,
                                                     "n_predict": 150, "seed": 3})
    assert status == 200 and r["stop_type"] == "eos", r
    jsonschema.validate(json.loads(r["content"]), PERSON)
    fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
    status, chat = call(server, "POST", "/v1/chat/completions", {"messages": CHAT, "response_format": fmt,
                                                                 "max_tokens": 150, "seed": 4})
    assert status == 200 and chat["choices"][0]["finish_reason"] == "stop", chat
    jsonschema.validate(json.loads(chat["choices"][0]["message"]["content"]), PERSON)
    status, chat = call(server, "POST", "/v1/chat/completions", {
        "messages": CHAT, "response_format": {"type": "json_object", "schema": PERSON}, "max_tokens": 150, "seed": 5})
    assert status == 200 and isinstance(json.loads(chat["choices"][0]["message"]["content"]), dict), chat
    status, done = call(server, "POST", "/completion", {"prompt": PROMPT, "grammar": 'root ::= [0-9]{3}', "seed": 6})
    assert status == 200 and len(done["content"]) == 3 and done["content"].isdigit(), done
    assert call(server, "GET", "/health")[1] == {"status": "ok"}


def test_grammar_fields_refuse_what_they_cannot_map() -> None:
    from edgellama.service.http import fields

    for body, words in [({"response_format": {"type": "xml"}}, "not one of"),
                        ({"response_format": {"type": "json_schema"}}, "needs a 'json_schema'"),
                        ({"grammar": "x", "response_format": {"type": "json_object"}}, "give one of")]:
        with pytest.raises(fields.HttpError) as e:
            fields.grammar_fields(body)
        assert e.value.status == 400 and words in str(e.value)


# ---- bad HTTP: each answered 4xx or closed, and the server goes on ----

def raw(srv: ServerProc, data: bytes, then_close: bool = False, timeout: float = 30.0) -> bytes:
    """Sends data on a fresh connection; everything the server answers until it closes (or timeout)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(timeout)
    s.connect(srv.path)
    try:
        s.sendall(data)
        if then_close:
            s.shutdown(socket.SHUT_WR)
        out = b""
        while True:
            try:
                chunk = s.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            out += chunk
        return out
    finally:
        s.close()


def status_of(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def test_bad_http_is_refused_and_the_server_goes_on(server: ServerProc) -> None:
    assert status_of(raw(server, b"GARBAGE REQUEST\r\n\r\n")) == 400
    assert status_of(raw(server, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 40000 + b"\r\n\r\n")) == 431
    over = raw(server, b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY + 1))
    assert status_of(over) == 413 and b"--max-line" in over
    chunked = (b"POST /completion HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
               + (b"400\r\n" + b"x" * 1024 + b"\r\n") * 5 + b"0\r\n\r\n")
    assert status_of(raw(server, chunked)) == 413
    # a body shorter than its Content-Length, then the client closes: no request runs
    short = raw(server, b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{\"prompt\": \"x\"",
                then_close=True)
    assert status_of(short) in (0, 400)
    assert call(server, "GET", "/nowhere")[0] == 404 and call(server, "GET", "/completion")[0] == 405
    status, r = call(server, "POST", "/completion", None)
    assert status == 400 and "not JSON" in r["error"]["message"]
    assert call(server, "GET", "/health") == (200, {"status": "ok"})


def test_a_slowloris_trickle_is_cut_at_the_header_timeout(server: ServerProc) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(0.3)
    s.connect(server.path)
    s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    answer, t0 = b"", time.monotonic()
    try:
        while time.monotonic() - t0 < 10 * HEADER_TIMEOUT:  # it would trickle forever
            try:
                s.sendall(b"X-Slow: 1\r\n")
            except (BrokenPipeError, ConnectionResetError):  # closed: what it said before is still readable
                # unless the 408 was read on the last pass: then the queue is empty and a UNIX socket
                # whose peer closed with our headers unread reports ECONNRESET (the status check below
                # still needs the 408 to have arrived one way or the other)
                with contextlib.suppress(ConnectionResetError, TimeoutError):
                    answer += s.recv(4096)
                break
            try:
                chunk = s.recv(4096)
            except TimeoutError:
                continue
            except ConnectionResetError:
                break
            if not chunk:
                break
            answer += chunk
    finally:
        s.close()
    assert time.monotonic() - t0 < 10 * HEADER_TIMEOUT, "the trickling connection was never cut"
    assert status_of(answer) == 408, answer
    assert call(server, "GET", "/health")[0] == 200


def test_keep_alive_expect_100_continue_and_chunked_bodies(server: ServerProc) -> None:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(120)
    s.connect(server.path)
    body = json.dumps({"content": "Hello world"}).encode()
    s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: %d\r\n\r\n" % len(body))
    assert s.recv(4096).startswith(b"HTTP/1.1 100 ")  # asked to go on before the body is sent
    s.sendall(body)
    f = s.makefile("rb")
    r1 = http.client.HTTPResponse(s)
    r1.begin()
    tokens = json.loads(r1.read())["tokens"]
    # the same connection again (keep-alive), the body chunked this time
    s.sendall(b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
              + b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body))
    r2 = http.client.HTTPResponse(s)
    r2.begin()
    assert r2.status == 200 and json.loads(r2.read())["tokens"] == tokens and tokens
    f.close()
    s.close()


def test_framing_that_could_smuggle_a_request_is_not_kept_alive(server: ServerProc) -> None:
    """Transfer-Encoding and Content-Length together: framed by the former, answered, then closed (RFC 9112
    6.3), so bytes the two framings read differently never become a second request; two Authorization
    headers are refused (which one would count?)."""
    body = json.dumps({"content": "Hello world"}).encode()
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    answer = raw(server, b"POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: %d\r\n"
                         b"\r\n%sGET /health HTTP/1.1\r\nHost: x\r\n\r\n" % (len(body), chunked))
    assert status_of(answer) == 200 and b"connection: close" in answer.lower()
    assert answer.count(b"HTTP/1.1 ") == 1, answer  # the pipelined request after it was never read
    two = raw(server, b"GET /health HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer a\r\nAuthorization: Bearer b\r\n\r\n")
    assert status_of(two) == 400 and b"two Authorization headers" in two
    assert call(server, "GET", "/health")[0] == 200


def test_a_half_closed_http_client_still_gets_its_answer(server: ServerProc) -> None:
    body = json.dumps({"prompt": PROMPT, "n_predict": 2, "temperature": 0}).encode()
    answer = raw(server, b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body),
                 then_close=True)  # done sending, still reading (as `nc -N` does); then the server closes
    assert status_of(answer) == 200 and json.loads(answer.split(b"\r\n\r\n", 1)[1])["tokens_predicted"] == 2


# ---- TCP, cancellation, mixed clients ----

def test_tcp_needs_the_api_key(server: ServerProc) -> None:
    port = server.port  # type: ignore[attr-defined]

    def get(path: str, key: str | None) -> tuple[int, Any]:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        try:
            c.request("GET", path, headers={"Authorization": f"Bearer {key}"} if key else {})
            r = c.getresponse()
            return r.status, json.loads(r.read())
        finally:
            c.close()

    status, r = get("/v1/models", None)
    assert status == 401 and r["error"] == {"code": 401, "message": "Invalid API Key", "type": "authentication_error"}
    assert get("/v1/models", "wrong")[0] == 401
    assert get("/v1/models", KEY)[0] == 200
    assert get("/health", None)[0] == 200  # public, as on llama-server
    # a refused request's body, arriving with its headers, never reaches a route
    before = server.metrics()["llamacpp:prompt_tokens_total"]
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    body = json.dumps({"prompt": "Refused before any work", "n_predict": 2}).encode()
    s.sendall(b"POST /completion HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    answer = s.recv(65536)
    s.close()
    assert status_of(answer) == 401
    time.sleep(2.0)  # time enough for a prompt that slipped through to be evaluated
    assert server.metrics()["llamacpp:prompt_tokens_total"] == before


def test_tcp_without_a_key_or_insecure_flag_is_refused_at_start(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "edgellama.cli", "serve", "--socket", str(tmp_path / "s"),
                        "--http-port", "8080"], capture_output=True, text=True, env=cli_env(), timeout=60,
                       check=False)
    assert r.returncode == 1 and "--api-key" in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_closing_an_http_stream_cancels_its_generation(server: ServerProc) -> None:
    # the server is stopped (SIGSTOP) from the first streamed token until the client has closed, so the
    # close lands while 199 tokens are still to come however slowly this process gets scheduled
    def outcomes() -> list[dict[str, Any]]:
        return [r for r in server.records() if "outcome" in r]

    n_logged = len(outcomes())
    c = UnixHTTP(server.path)
    # greedy: this prompt runs past 200 tokens (sampled at llama-server's default temperature, it can end
    # at once with an end-of-text)
    c.request("POST", "/completion", body=json.dumps({"prompt": "Tell a long story.", "n_predict": 200,
                                                      "temperature": 0, "stream": True}))
    r = c.getresponse()
    try:
        assert r.status == 200 and r.readline().startswith(b"data: ")  # generating
        os.kill(server.proc.pid, signal.SIGSTOP)
        c.close()
        r.close()
    finally:
        os.kill(server.proc.pid, signal.SIGCONT)
    deadline = time.monotonic() + 60
    while call(server, "GET", "/slots")[1][0]["is_processing"] and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not call(server, "GET", "/slots")[1][0]["is_processing"]
    # the slot is freed on the engine thread before the loop delivers the end and logs it (a line of the
    # previous test's requests may land after n_logged was counted)
    while not any(e["outcome"] == "cancelled" for e in outcomes()[n_logged:]) and time.monotonic() < deadline:
        time.sleep(0.05)
    logged = [e for e in outcomes()[n_logged:] if e["outcome"] == "cancelled" or e.get("n_predicted") == 200]
    assert len(logged) == 1 and logged[0]["outcome"] == "cancelled" and logged[0]["n_predicted"] < 200, logged


def test_http_and_json_lines_clients_at_once(server: ServerProc) -> None:
    results: dict[str, str] = {}

    def http_client(i: int) -> None:
        status, r = call(server, "POST", "/completion", {"prompt": f"Count to {i + 2}:", "n_predict": 3,
                                                         "temperature": 0, "cache_prompt": False})
        results[f"http{i}"] = r["content"] if status == 200 else f"status {status}"

    def lines_client(i: int) -> None:
        with Conn(server.path) as c:
            events = c.ask({"id": i, "prompt": f"Count to {i + 2}:", "n_predict": 3, "temperature": 0,
                            "cache_prompt": False})
        results[f"lines{i}"] = text_of(events) if events[-1]["event"] == "done" else str(events[-1])

    threads = [threading.Thread(target=f, args=(i,)) for i in range(2) for f in (http_client, lines_client)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert sorted(results) == ["http0", "http1", "lines0", "lines1"]
    for i in range(2):  # the same greedy request gives the same text on either protocol
        assert results[f"http{i}"] == results[f"lines{i}"] and results[f"http{i}"].strip()


def test_base_model_health_503_while_loading_and_chat_refused(gemma_path: Path) -> None:
    srv = ServerProc("-m", str(gemma_path))
    try:
        statuses: list[int] = []
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and 200 not in statuses:
            try:
                statuses.append(call(srv, "GET", "/health")[0])
            except (FileNotFoundError, ConnectionRefusedError):
                time.sleep(0.01)
        assert statuses[0] == 503 and statuses[-1] == 200 and set(statuses) == {503, 200}, statuses
        status, r = call(srv, "POST", "/v1/chat/completions", {"messages": CHAT, "max_tokens": 2})
        assert status == 400 and "no chat template" in r["error"]["message"], r
        status, r = call(srv, "POST", "/apply-template", {"messages": CHAT})
        assert status == 400 and "no chat template" in r["error"]["message"], r
    finally:
        srv.kill()

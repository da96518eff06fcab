"""One request, every door, one outcome: a matrix of requests x doors (the Python API, `edgellama run`, protocol
v1, llama-server's `/completion`, OpenAI's `/v1/completions`, the serial line's text mode where a request fits
its one line; chat requests through the Python API, protocol
v1's messages and `/v1/chat/completions`) whose text and finish reason must agree, and invalid values that must
be refused on every door naming the same field. SmolLM2 (-c 256), explicit sampling on every door so that no
door's defaults decide."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgellama.grammar import grammar_from_schema
from edgellama.llm import LLM
from tests.serial_util import NullModem
from tests.service_util import ServerProc, UnixHTTP, cli_env, serving, text_of
from tests.test_service_serial import Client, answer_text

ROOT = Path(__file__).resolve().parents[1]
N_CTX = 256
CHATML = "<|im_start|>user\nWhat is the capital of Japan?<|im_end|>\n<|im_start|>assistant\n"
AGE = {"type": "object", "properties": {"age": {"type": "integer", "minimum": 0, "maximum": 120}}, "required": ["age"]}
GREEDY = {"temperature": 0.0, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repeat_penalty": 1.0, "seed": 1}

# name -> (prompt, generation length, sampling and constraints); the fields as protocol v1 names them
REQUESTS: dict[str, tuple[str, int, dict[str, Any]]] = {
    "greedy": ("The capital of France is", 16, GREEDY),
    "special tokens in a raw prompt": (CHATML, 24, GREEDY),
    "stop string": ("Count: 1, 2, 3,", 24, {**GREEDY, "stop": [" 6"]}),
    "seeded sampling": ("Once upon a time", 16, {**GREEDY, "temperature": 0.8, "seed": 42}),
    "grammar": ("Is the sky blue? Answer:", 8, {**GREEDY, "grammar": 'root ::= " yes" | " no"'}),
    "json schema": ("A person as JSON:", 24, {**GREEDY, "json_schema": AGE}),
}
DOORS = ["python", "run", "v1", "/completion", "/v1/completions", "serial text"]
# the serial text mode takes a line as the prompt and /set for the sampling fields: the requests it can carry
SERIAL = {"greedy", "stop string", "seeded sampling"}


@pytest.fixture(scope="module")
def modem() -> Iterator[NullModem]:
    m = NullModem()
    try:
        yield m
    finally:
        m.close()


@pytest.fixture(scope="module")
def server(smollm2_path: Path, modem: NullModem) -> Iterator[ServerProc]:
    """The service with a serial port in text mode beside its socket (the serial door)."""
    with serving("-m", str(smollm2_path), "-c", str(N_CTX), "--serial", f"{modem.device.path},mode=text") as srv:
        yield srv


@pytest.fixture(scope="module")
def port(server: ServerProc, modem: NullModem) -> Iterator[Client]:
    c = Client(modem)
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def llm(smollm2_path: Path) -> Iterator[Any]:
    with LLM(smollm2_path, n_ctx=N_CTX, n_threads=2) as m:
        yield m


def python_door(llm: Any, prompt: str, n: int, p: dict[str, Any]) -> tuple[str, str]:
    kw = {k: v for k, v in p.items() if k not in ("grammar", "json_schema")}
    grammar = p.get("grammar") or (grammar_from_schema(p["json_schema"]) if "json_schema" in p else None)
    out = llm.create_completion(prompt, max_tokens=n, grammar=grammar, **kw)["choices"][0]
    return out["text"], out["finish_reason"]


def run_door(path: Path, prompt: str, n: int, p: dict[str, Any], refused: bool = False) -> tuple[str, str]:
    flags = {"temperature": "--temp", "top_k": "--top-k", "top_p": "--top-p", "min_p": "--min-p",
             "repeat_penalty": "--repeat-penalty", "seed": "--seed", "grammar": "--grammar"}
    args = ["-m", str(path), "-c", str(N_CTX), "-p", prompt, "-n", str(n), "--json", "-t", "2"]
    for k, v in p.items():
        if k == "stop":
            for s in v:
                args += ["-r", s]
        elif k == "json_schema":
            args += ["-j", json.dumps(v)]
        else:
            args += [flags[k], str(v)]
    r = subprocess.run([sys.executable, "-m", "edgellama", "run", *args], capture_output=True, text=True,
                       timeout=300, env=cli_env(), cwd=ROOT, check=False)
    if refused:
        return r.stderr, str(r.returncode)
    assert r.returncode == 0, r.stderr
    events = [json.loads(line) for line in r.stdout.splitlines()]
    done = events[-1]
    text = "".join(e["text"] for e in events if e["event"] == "token")
    if done["stop_reason"] == "reverse_prompt":  # run prints the reverse prompt it stopped at, as llama-cli does
        hit = [s for s in p["stop"] if text.endswith(s)]
        assert hit, (text, p["stop"])
        text = text[:-len(hit[0])]
    finish = {"stop": "stop", "reverse_prompt": "stop", "length": "length"}.get(done["stop_reason"], done["stop_reason"])
    return text, finish


def serial_door(port: Client, prompt: str, n: int, p: dict[str, Any]) -> str:
    """The answer's text over a serial line in text mode (/set every field first: settings stay on the port)."""
    for key, value in {"n_predict": n, "stop": [], **p}.items():
        reply = port.reply(f"/set {key} {json.dumps(value)}".encode())
        assert reply[0].startswith("OK "), reply
    return answer_text(port.reply(prompt.encode()))


def v1_door(srv: ServerProc, prompt: str, n: int, p: dict[str, Any]) -> tuple[str, str]:
    with srv.connect() as c:
        events = c.ask({"id": 1, "prompt": prompt, "n_predict": n, **p})
    done = events[-1]
    assert done["event"] == "done", done
    return text_of(events), {"eos": "stop", "stop": "stop"}.get(done["stop_reason"], done["stop_reason"])


def http_door(srv: ServerProc, path: str, prompt: str, n: int, p: dict[str, Any]) -> tuple[str, str]:
    body = {"prompt": prompt, **p, ("n_predict" if path == "/completion" else "max_tokens"): n}
    c = UnixHTTP(srv.path)
    try:
        c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = c.getresponse()
        status, r = resp.status, json.loads(resp.read())
    finally:
        c.close()
    assert status == 200, r
    if path == "/completion":
        return r["content"], {"eos": "stop", "word": "stop", "limit": "length"}[r["stop_type"]]
    return r["choices"][0]["text"], r["choices"][0]["finish_reason"]


@pytest.mark.parametrize("name", list(REQUESTS))
def test_every_door_gives_the_same_outcome(name: str, llm: Any, server: ServerProc, port: Client,
                                          smollm2_path: Path) -> None:
    prompt, n, p = REQUESTS[name]
    got = {"python": python_door(llm, prompt, n, p), "run": run_door(smollm2_path, prompt, n, p),
           "v1": v1_door(server, prompt, n, p)}
    for path in ("/completion", "/v1/completions"):
        got[path] = http_door(server, path, prompt, n, p)
    assert len(set(got.values())) == 1, json.dumps(got, indent=1)
    text, finish = got["python"]
    assert text and finish in ("stop", "length")
    if name in SERIAL:  # text mode reports no finish reason: the text must agree
        assert serial_door(port, prompt, n, p) == text


# ---- refusals: each invalid value, the same error on every door, naming the field as that door spells it ----

BAD: dict[str, tuple[dict[str, Any], dict[str, str | None]]] = {
    # v1 field: value -> the field's spelling per door (from the parameter table)
    "top_p above 1": ({"top_p": 3}, {"run": "--top-p", "python": "top_p", "v1": "top_p", "http": "top_p"}),
    "negative temperature": ({"temperature": -1}, {"run": "--temp", "python": "temperature", "v1": "temperature",
                                                   "http": "temperature"}),
    "negative top_k": ({"top_k": -1}, {"run": "--top-k", "python": "top_k", "v1": "top_k", "http": "top_k"}),
    "too many stops": ({"stop": [f"s{i}" for i in range(17)]}, {"run": "-r/--reverse-prompt", "python": "stop",
                                                                 "v1": "stop", "http": "stop"}),
    "a grammar that does not parse": ({"grammar": 'root ::= "yes'}, {"run": "grammar", "python": "grammar",
                                                                     "v1": "grammar", "http": "grammar"}),
    "a token id outside the vocabulary": ({"prompt_ids": [1, 999999]}, {"run": None, "python": "token id 999999 is out "
                                          "of range", "v1": "token id 999999 is out of range",
                                          "http": "token id 999999 is out of range"}),
    "a response_format without a type": ({"response_format": {"schema": {"type": "object"}}},
                                         {"run": None, "python": "'response_format' must be an object with a 'type'",
                                          "v1": None, "http": "'response_format' must be an object with a 'type'"}),
    "a schema keyword that cannot be enforced": ({"json_schema": {"type": "integer", "multipleOf": 3}},
                                                 {"run": "multipleOf", "python": "multipleOf", "v1": "multipleOf",
                                                  "http": "multipleOf"}),
}


@pytest.mark.parametrize("name", list(BAD))
def test_every_door_refuses_the_same_value_naming_the_field(name: str, llm: Any, server: ServerProc,
                                                           smollm2_path: Path) -> None:
    bad, spelled = BAD[name]  # a door that has no such field (None) is left out
    p = {**GREEDY, **bad}
    prompt: Any = p.pop("prompt_ids", "Hi")
    if spelled["run"] is not None:
        stderr, code = run_door(smollm2_path, "Hi", 4, p, refused=True)
        assert code == "1" and stderr.startswith("edgellama: error:") and spelled["run"] in stderr, stderr
    if "response_format" in p:  # a chat field in the Python API
        with pytest.raises(ValueError) as e:
            llm.create_chat_completion([{"role": "user", "content": "Hi"}], max_tokens=4,
                                       response_format=p["response_format"])
    else:
        with pytest.raises(ValueError) as e:
            python_door(llm, prompt, 4, p)
    assert spelled["python"] in str(e.value), str(e.value)
    if spelled["v1"] is not None:
        with server.connect() as c:
            ev = c.ask({"id": 1, "prompt": prompt, "n_predict": 4, **p})[-1]
        assert ev["event"] == "error" and ev["code"] == "bad_request" and spelled["v1"] in ev["message"], ev
    for path in ("/completion", "/v1/completions"):
        c2 = UnixHTTP(server.path)
        try:
            c2.request("POST", path, body=json.dumps({"prompt": prompt, "max_tokens": 4, **p}),
                       headers={"Content-Type": "application/json"})
            resp = c2.getresponse()
            status, r = resp.status, json.loads(resp.read())
        finally:
            c2.close()
        assert status == 400 and spelled["http"] in r["error"]["message"], (path, r)


# ---- chat: the Python API, protocol v1's messages, /v1/chat/completions ----

CHATS: dict[str, tuple[list[dict[str, str]], int, dict[str, Any]]] = {
    "greedy chat": ([{"role": "user", "content": "What is the capital of Japan?"}], 24, GREEDY),
    "system and stop": ([{"role": "system", "content": "Answer in one word."},
                         {"role": "user", "content": "Name a colour."}], 16, {**GREEDY, "stop": ["."]}),
    "seeded chat": ([{"role": "user", "content": "Tell me a fact."}], 16, {**GREEDY, "temperature": 0.8, "seed": 7}),
}


@pytest.mark.parametrize("name", list(CHATS))
def test_chat_doors_give_the_same_reply(name: str, llm: Any, server: ServerProc) -> None:
    messages, n, p = CHATS[name]
    out = llm.create_chat_completion(messages, max_tokens=n, **p)["choices"][0]
    got = {"python": (out["message"]["content"], out["finish_reason"])}
    with server.connect() as c:
        events = c.ask({"id": 1, "messages": messages, "n_predict": n, **p})
    got["v1"] = (text_of(events), {"eos": "stop", "stop": "stop"}.get(events[-1]["stop_reason"],
                                                                     events[-1]["stop_reason"]))
    c2 = UnixHTTP(server.path)
    try:
        c2.request("POST", "/v1/chat/completions", body=json.dumps({"messages": messages, "max_tokens": n, **p}),
                   headers={"Content-Type": "application/json"})
        r = json.loads(c2.getresponse().read())
    finally:
        c2.close()
    got["/v1/chat/completions"] = (r["choices"][0]["message"]["content"], r["choices"][0]["finish_reason"])
    assert len(set(got.values())) == 1, json.dumps(got, indent=1)


# ---- one response shaper: the Python API and HTTP give the same JSON ----

def _normalized(obj: Any) -> Any:
    """obj without what differs by nature: ids, creation times, timings' values, the prompt cache's state."""
    if isinstance(obj, list):
        return [_normalized(x) for x in obj]
    if not isinstance(obj, dict):
        return obj
    out = {k: _normalized(v) for k, v in obj.items() if k not in ("id", "created")}
    if "timings" in out:
        out["timings"] = sorted(out["timings"])
    if isinstance(out.get("usage"), dict) and "prompt_tokens_details" in out["usage"]:
        out["usage"]["prompt_tokens_details"] = sorted(out["usage"]["prompt_tokens_details"])
    return out


def _http_json(srv: ServerProc, path: str, body: dict[str, Any]) -> Any:
    c = UnixHTTP(srv.path)
    try:
        c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        resp = c.getresponse()
        data = resp.read().decode()
    finally:
        c.close()
    assert resp.status == 200, data
    if not body.get("stream"):
        return json.loads(data)
    events = [line[6:] for line in data.split("\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


TOOL = {"type": "function", "function": {"name": "set_timer", "description": "Start a timer.", "parameters": {
    "type": "object", "properties": {"minutes": {"type": "integer", "minimum": 1, "maximum": 59}},
    "required": ["minutes"]}}}
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "completion": ("completion", {"prompt": "The capital of France is", "max_tokens": 8}),
    "completion, logprobs and a stop string": ("completion", {"prompt": "Count: 1, 2, 3,", "max_tokens": 16,
                                                              "logprobs": 2, "stop": [" 6"]}),
    "chat": ("chat", {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 8}),
    "chat, logprobs": ("chat", {"messages": [{"role": "user", "content": "Name a fruit."}], "max_tokens": 8,
                                "logprobs": True, "top_logprobs": 2}),
    "chat, a required tool call": ("chat", {"messages": [{"role": "user", "content": "Timer for 5 minutes."}],
                                            "max_tokens": 40, "tools": [TOOL], "tool_choice": "required"}),
    "chat, tools under auto": ("chat", {"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 24,
                                        "tools": [TOOL]}),
}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("name", list(SHAPES))
def test_python_api_and_http_give_the_same_json(name: str, stream: bool, llm: Any, server: ServerProc) -> None:
    kind, body = SHAPES[name]
    body = {**body, **GREEDY, "stream": stream}
    body.pop("repeat_penalty")
    args = {k: v for k, v in body.items() if k not in ("prompt", "messages")}
    if kind == "completion":
        got = llm.create_completion(body["prompt"], **args)
        want = _http_json(server, "/v1/completions", body)
    else:
        got = llm.create_chat_completion(body["messages"], **args)
        want = _http_json(server, "/v1/chat/completions", body)
    if stream:
        got = list(got)
    assert _normalized(got) == _normalized(want), json.dumps({"python": got, "http": want}, indent=1)[:6000]

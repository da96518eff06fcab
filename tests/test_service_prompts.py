"""Prompts as clients send them (issue 36): token ids, ids mixed with strings, several prompts in one request
(llama-server's /completion, OpenAI's /v1/completions), and OpenAI's `n` choices, on the real SmolLM2:
each answer is the one its prompt gets alone."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.service_util import FAST, ServerProc, openai_over_unix_socket
from tests.test_service_http import call, curl, sse_data

A, B = "The capital of France is", "Once upon a time"
GREEDY = {"temperature": 0, "n_predict": 5}


@pytest.fixture(scope="module")
def server(smollm2_path: Path) -> Any:
    srv = ServerProc("-m", str(smollm2_path), "--parallel", "2", engine=FAST)
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.terminate()
        srv.kill()


def alone(srv: ServerProc, prompt: Any) -> str:
    status, r = call(srv, "POST", "/completion", {"prompt": prompt, **GREEDY})
    assert status == 200, r
    return str(r["content"])


def test_token_prompts(server: ServerProc) -> None:
    ids = call(server, "POST", "/tokenize", {"content": A, "add_special": True})[1]["tokens"]
    assert alone(server, ids) == alone(server, A)
    head = call(server, "POST", "/tokenize", {"content": "The capital of", "add_special": True})[1]["tokens"]
    assert alone(server, [*head, " France is"]) == alone(server, A)  # ids, then a string tokenized in place
    status, r = call(server, "POST", "/completion", {"prompt": [1, 999999], **GREEDY})
    assert status == 400 and "token id 999999 is out of range" in r["error"]["message"]
    with server.connect() as c:  # protocol v1 takes the same forms
        events = c.ask({"id": 1, "prompt": ids, "n_predict": 5, "temperature": 0})
        assert "".join(e["text"] for e in events if e["event"] == "token") == alone(server, A)


def test_several_prompts_on_completion(server: ServerProc) -> None:
    want = [alone(server, A), alone(server, B)]
    status, r = call(server, "POST", "/completion", {"prompt": [A, B], **GREEDY})
    assert status == 200 and isinstance(r, list)
    assert [x["index"] for x in r] == [0, 1] and [x["content"] for x in r] == want
    events = [json.loads(d) for d in sse_data(curl(server, "/completion", {"prompt": [A, B], "stream": True,
                                                                             **GREEDY}))]
    for i in (0, 1):
        assert "".join(e["content"] for e in events if e["index"] == i) == want[i]
        assert sum(1 for e in events if e["index"] == i and e["stop"]) == 1
    status, r = call(server, "POST", "/completion", {"prompt": [A, "x" * 10, ""], **GREEDY})
    assert status == 400 and "must not be empty" in r["error"]["message"]


def test_openai_prompts_and_choices(server: ServerProc) -> None:
    want = [alone(server, A), alone(server, B)]
    status, r = call(server, "POST", "/v1/completions", {"prompt": [A, B], "n": 2, "max_tokens": 5,
                                                         "temperature": 0})
    assert status == 200
    assert [c["index"] for c in r["choices"]] == [0, 1, 2, 3]
    assert [c["text"] for c in r["choices"]] == [want[0], want[0], want[1], want[1]]
    assert r["usage"]["completion_tokens"] == 4 * 5
    chunks = [json.loads(d) for d in sse_data(curl(server, "/v1/completions", {
        "prompt": [A, B], "n": 2, "max_tokens": 5, "temperature": 0, "stream": True})) if d != "[DONE]"]
    for i, text in enumerate([want[0], want[0], want[1], want[1]]):
        assert "".join(c["choices"][0]["text"] for c in chunks if c["choices"][0]["index"] == i) == text
    chat = {"messages": [{"role": "user", "content": "Name a fruit."}], "max_tokens": 6, "temperature": 1.0,
            "seed": 7, "n": 3}
    status, first = call(server, "POST", "/v1/chat/completions", chat)
    status2, again = call(server, "POST", "/v1/chat/completions", chat)
    assert status == status2 == 200 and len(first["choices"]) == 3
    assert [c["message"]["content"] for c in first["choices"]] == [c["message"]["content"] for c in again["choices"]]
    one = call(server, "POST", "/v1/chat/completions", chat | {"n": 1})[1]
    assert one["choices"][0]["message"]["content"] == first["choices"][0]["message"]["content"]  # choice 0: seed 7
    assert call(server, "POST", "/v1/chat/completions", chat | {"n": 17})[0] == 400
    with openai_over_unix_socket(server.path) as client:
        out = client.completions.create(model="x", prompt=[A, B], max_tokens=5, temperature=0)
        assert [c.text for c in out.choices] == want

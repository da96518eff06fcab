"""LoRA adapters over HTTP (issue 23): llama-server's GET/POST /lora-adapters and its per-request `lora`
field on /completion, /v1/completions and /v1/chat/completions, with curl, http.client and the openai
SDK. One SmolLM2 server (--parallel 2) with two synthetic adapters written by tests/lora_util.py;
greedy, short generations; every HTTP text is checked against protocol v1 with the same scales."""

from __future__ import annotations

import importlib
import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from edgellama.gguf.reader import GGUFFile
from tests import lora_util
from tests.conftest import skip_or_fail
from tests.service_util import FAST, ServerProc, UnixHTTP, openai_over_unix_socket, text_of

PROMPT = "The capital of France is"
CHAT = [{"role": "user", "content": "Name a color."}]
N = 8
START = [{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.5}]  # --lora A --lora-scaled B 0.5


@pytest.fixture(scope="module")
def adapters(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    d = tmp_path_factory.mktemp("lora-http")
    base = GGUFFile(smollm2_path)
    a = lora_util.write_adapter(d / "menu.gguf", "llama", 8.0, lora_util.random_adapter(base, 8, seed=3, amplitude=4.0),
                                extra_kv={"adapter.lora.task_name": "menu", "adapter.lora.prompt_prefix": "Menu: "})
    b = lora_util.write_adapter(d / "support.gguf", "llama", 4.0,
                                lora_util.random_adapter(base, 4, ["attn_v", "ffn_down"], seed=5, amplitude=4.0))
    return [a, b]


@pytest.fixture(scope="module")
def server(smollm2_path: Path, adapters: list[Path]) -> Iterator[ServerProc]:
    srv = ServerProc("-m", str(smollm2_path), "--parallel", "2", "--max-tokens", "64",
                     "--lora", str(adapters[0]), "--lora-scaled", str(adapters[1]), "0.5", engine=FAST)
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.kill()


def call(srv: ServerProc, method: str, path: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
    c = UnixHTTP(srv.path)
    try:
        c.request(method, path, body=raw if raw is not None else None if body is None else json.dumps(body),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, json.loads(r.read())
    finally:
        c.close()


def curl(srv: ServerProc, path: str, body: Any = None) -> Any:
    if shutil.which("curl") is None:
        skip_or_fail("curl is not installed (apt install curl)")
    cmd = ["curl", "-sS", "--unix-socket", srv.path, f"http://localhost{path}"]
    if body is not None:
        cmd += ["-H", "Content-Type: application/json", "-d", json.dumps(body)]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=True).stdout)


def v1_text(srv: ServerProc, **req: Any) -> str:
    with srv.connect() as c:
        events = c.ask({"id": "v1", "temperature": 0, "n_predict": N, **req})
    assert events[-1]["event"] == "done", events
    return text_of(events)


def completion(srv: ServerProc, **extra: Any) -> dict[str, Any]:
    status, r = call(srv, "POST", "/completion", {"prompt": PROMPT, "n_predict": N, "temperature": 0, **extra})
    assert status == 200, r
    return r


def test_get_lora_adapters_lists_the_start_up_adapters(server: ServerProc, adapters: list[Path]) -> None:
    got = curl(server, "/lora-adapters")
    assert got == [{"id": 0, "path": str(adapters[0]), "scale": 1.0, "task_name": "menu", "prompt_prefix": "Menu: "},
                   {"id": 1, "path": str(adapters[1]), "scale": 0.5, "task_name": "", "prompt_prefix": ""}]


def test_request_lora_field_matches_protocol_v1(server: ServerProc) -> None:
    off, on = [{"id": 0, "scale": 0.0}], [{"id": 0, "scale": 1.0}, {"id": 1, "scale": 0.5}]
    r_off, r_on, r_b = completion(server, lora=off), completion(server, lora=on), completion(server, lora=[{"id": 1, "scale": 2}])
    assert r_off["content"] != r_on["content"] and r_b["content"] not in (r_off["content"], r_on["content"])
    assert r_off["content"] == v1_text(server, prompt=PROMPT, special=True, lora=off)
    assert r_on["content"] == v1_text(server, prompt=PROMPT, special=True, lora=on)
    assert r_b["content"] == v1_text(server, prompt=PROMPT, special=True, lora=[{"id": 1, "scale": 2}])
    assert r_on["generation_settings"]["lora"] == on and r_off["generation_settings"]["lora"] == off
    # absent and [] (llama-server's "no per-request adapters"): the default scales, here the start-up ones
    default = completion(server)
    assert default["content"] == completion(server, lora=[])["content"] == r_on["content"]
    assert default["generation_settings"]["lora"] == []
    # the scales of a request hold for its whole answer when other requests run beside it with others
    c = UnixHTTP(server.path)
    try:
        c.request("POST", "/completion", body=json.dumps({"prompt": PROMPT, "n_predict": N, "temperature": 0,
                                                          "lora": off, "stream": True}))
        stream = c.getresponse()
        assert completion(server, lora=on)["content"] == r_on["content"]
        events = [json.loads(line[6:]) for line in stream.read().decode().split("\n") if line.startswith("data: ")]
    finally:
        c.close()
    assert "".join(e["content"] for e in events) == r_off["content"]


def test_openai_routes_take_lora(server: ServerProc) -> None:
    off = [{"id": 0, "scale": 0}]
    status, r = call(server, "POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": N, "temperature": 0,
                                                          "lora": off})
    assert status == 200 and r["choices"][0]["text"] == v1_text(server, prompt=PROMPT, special=True, lora=off)
    with openai_over_unix_socket(server.path) as client:
        openai = importlib.import_module("openai")  # there: openai_over_unix_socket skips the test otherwise
        texts = {}
        for name, lora in (("off", off), ("on", START)):
            r = client.chat.completions.create(model="any", messages=CHAT, max_tokens=N, temperature=0,
                                               extra_body={"lora": lora})
            texts[name] = r.choices[0].message.content
            assert texts[name] == v1_text(server, messages=CHAT, lora=lora)
        assert texts["off"] != texts["on"]
        with pytest.raises(openai.BadRequestError, match="no adapter 2"):
            client.chat.completions.create(model="any", messages=CHAT, max_tokens=N,
                                           extra_body={"lora": [{"id": 2, "scale": 1}]})


def test_post_lora_adapters_sets_the_default_scales(server: ServerProc) -> None:
    want_b = v1_text(server, prompt=PROMPT, special=True, lora=[{"id": 1, "scale": 0.25}])
    want_start = v1_text(server, prompt=PROMPT, special=True, lora=START)
    c = UnixHTTP(server.path)
    try:  # a request under way when the defaults change keeps the ones it started with
        c.request("POST", "/completion", body=json.dumps({"prompt": PROMPT, "n_predict": N, "temperature": 0,
                                                          "stream": True}))
        stream = c.getresponse()  # its headers come with its first token
        assert curl(server, "/lora-adapters", [{"id": 1, "scale": 0.25}]) == {"success": True}
        events = [json.loads(line[6:]) for line in stream.read().decode().split("\n") if line.startswith("data: ")]
        assert "".join(e["content"] for e in events) == want_start
        assert [a["scale"] for a in curl(server, "/lora-adapters")] == [0.0, 0.25]  # unlisted: 0
        assert completion(server)["content"] == want_b
        assert v1_text(server, prompt=PROMPT, special=True) == want_b  # protocol v1 without `lora` too
        assert completion(server, lora=START)["content"] == want_start  # a request's own field still wins
        assert want_start != want_b
    finally:
        c.close()
        assert call(server, "POST", "/lora-adapters", START) == (200, {"success": True})
    assert [a["scale"] for a in curl(server, "/lora-adapters")] == [1.0, 0.5]


@pytest.mark.parametrize(("raw", "words"), [
    (b"[{\"id\": 0, ", "the body is not JSON"),
    (b"{\"id\": 0, \"scale\": 1}", "must be a JSON array"),
    (b"[{\"id\": 0}]", "body[0] is not"),
    (b"[{\"id\": \"0\", \"scale\": 1}]", "body[0] is not"),
    (b"[{\"id\": 0, \"scale\": 1}, {\"id\": 0, \"scale\": 2}]", "given twice"),
    (b"[{\"id\": 1, \"scale\": 1}, {\"id\": 2, \"scale\": 1}]", "no adapter 2 (the server loaded 2: ids 0..1)"),
    (b"[{\"id\": -1, \"scale\": 1}]", "no adapter -1"),
])
def test_bad_post_lora_adapters_is_a_400_and_changes_nothing(server: ServerProc, raw: bytes, words: str) -> None:
    status, r = call(server, "POST", "/lora-adapters", raw=raw)
    assert status == 400 and r["error"]["code"] == 400 and r["error"]["type"] == "invalid_request_error", r
    assert words in r["error"]["message"], r
    assert [a["scale"] for a in curl(server, "/lora-adapters")] == [1.0, 0.5]


@pytest.mark.parametrize(("path", "lora", "words"), [
    ("/completion", [{"id": 2, "scale": 1}], "no adapter 2"),
    ("/completion", {"id": 0, "scale": 1}, "field 'lora' must be a list"),
    ("/v1/completions", [{"id": 0, "scale": "1"}], "lora[0] is not"),
    ("/v1/chat/completions", [{"id": 5, "scale": 1}], "no adapter 5"),
])
def test_bad_request_lora_is_a_400(server: ServerProc, path: str, lora: Any, words: str) -> None:
    body = {"messages": CHAT} if "chat" in path else {"prompt": PROMPT}
    status, r = call(server, "POST", path, {**body, "max_tokens": 2, "n_predict": 2, "lora": lora})
    assert status == 400 and r["error"]["type"] == "invalid_request_error" and words in r["error"]["message"], r


def test_one_request_at_a_time_takes_the_posted_defaults(smollm2_path: Path, adapters: list[Path]) -> None:
    """--parallel 1 runs requests through LLM.generate, not the slots: the same defaults apply there."""
    srv = ServerProc("-m", str(smollm2_path), "--lora", str(adapters[0]), engine=FAST)
    try:
        srv.wait_ready()
        on = completion(srv)["content"]
        assert call(srv, "POST", "/lora-adapters", []) == (200, {"success": True})  # every adapter off
        off = completion(srv)["content"]
        assert off != on and off == v1_text(srv, prompt=PROMPT, special=True, lora=[{"id": 0, "scale": 0}])
        assert completion(srv, lora=[{"id": 0, "scale": 1}])["content"] == on
    finally:
        srv.kill()

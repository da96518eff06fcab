"""`edgellama serve` end to end: a real server process with the real default model on a real UNIX
socket, driven by real client connections (no mocked transport)."""

from __future__ import annotations

import json
import os
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

from tests.service_util import FAST, ServerProc, cli_env, text_of

SYSTEM = "You are a terse assistant on a small board. Answer in one short sentence."
LONG = 200  # n_predict of a request meant to still be running when the test acts on it (greedy:
# sampled, a request can end at once with an end-of-text and be done before the test acts on it)


@pytest.fixture(scope="module")
def server(gemma_path: Path) -> Iterator[ServerProc]:
    """The default model: a base model, no chat template."""
    srv = ServerProc("-m", str(gemma_path), "--queue", "3", "--max-line", "1024", "--max-tokens", str(LONG),
                     "--log-format", "json")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.kill()


@pytest.fixture(scope="module")
def chat_server(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProc]:
    """An instruct model (its GGUF carries a chat template) with a cached system prompt."""
    sys_file = tmp_path_factory.mktemp("sys") / "system.txt"
    sys_file.write_text(SYSTEM)
    srv = ServerProc("-m", str(smollm2_path), "--system-prompt", str(sys_file), "--log-format", "json")
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.kill()


def final(events: list[dict[str, Any]]) -> dict[str, Any]:
    assert events and events[-1]["event"] in ("done", "error"), events
    assert sum(e["event"] in ("done", "error") for e in events) == 1, events
    return events[-1]


# the long prompt spans several -b 64 chunks, evaluated with cancel checks between them
LONG_PROMPT = " ".join(f"Item {i} of the list is a {c} box." for i, c in
                       zip(range(14), ["red", "blue", "green", "small", "large", "wooden", "metal"] * 2))


@pytest.mark.parametrize("prompt", ["The three primary colors are", LONG_PROMPT], ids=["short", "chunked"])
def test_greedy_over_socket_equals_edgellama_run(server: ServerProc, gemma_path: Path, prompt: str) -> None:
    run = subprocess.run([sys.executable, "-m", "edgellama.cli", "run", "-m", str(gemma_path), "-p", prompt,
                          "-n", "8", "--temp", "0", "--json", *FAST], capture_output=True, text=True,
                         env=cli_env(), timeout=300, check=True)
    run_events = [json.loads(line) for line in run.stdout.splitlines()]
    assert prompt != LONG_PROMPT or run_events[0]["n_tokens"] > 128  # three chunks of -b 64
    run_text = "".join(e["text"] for e in run_events if e["event"] == "token")
    with server.connect() as c:
        events = c.ask({"id": "g", "prompt": prompt, "n_predict": 8, "temperature": 0})
    assert final(events)["stop_reason"] == run_events[-1]["stop_reason"] == "length"
    assert final(events)["tokens_predicted"] == 8
    assert text_of(events) == run_text and run_text.strip()
    assert final(events)["tokens_evaluated"] + final(events)["tokens_cached"] == run_events[0]["n_tokens"]


def test_concurrent_clients_all_answered(server: ServerProc) -> None:
    for n_clients in (2, 4):
        results: dict[int, list[dict[str, Any]]] = {}

        def one(i: int, results: dict[int, list[dict[str, Any]]] = results) -> None:
            with server.connect() as c:
                results[i] = c.ask({"id": f"c{i}", "prompt": f"Count to {i + 2}:", "n_predict": 3,
                                    "temperature": 0})

        threads = [threading.Thread(target=one, args=(i,)) for i in range(n_clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert sorted(results) == list(range(n_clients))
        for i, events in results.items():
            assert final(events)["event"] == "done", events
            assert final(events)["tokens_predicted"] == 3
            assert all(e["id"] == f"c{i}" for e in events)


def test_several_requests_in_flight_on_one_connection(server: ServerProc) -> None:
    with server.connect() as c:
        c.send({"id": 1, "prompt": "Red, green,", "n_predict": 2, "temperature": 0})
        c.send({"id": "two", "prompt": "One, two,", "n_predict": 2, "temperature": 0, "stream": False})
        got = c.until_final({1, "two"})
    assert final(got[1])["stop_reason"] == "length" and len(got[1]) == 3  # two tokens and done (stream)
    assert len(got["two"]) == 1 and got["two"][0]["content"]  # stream false: the text comes with done


def test_chat_turn_reuses_the_cached_system_prompt(chat_server: ServerProc) -> None:
    with chat_server.connect() as c:
        c.ask({"id": "raw", "prompt": "Something else first, to take the cache", "n_predict": 1})
        events = c.ask({"id": "chat", "messages": [{"role": "user", "content": "Name a color."}],
                        "n_predict": 4, "temperature": 0})
    done = final(events)
    assert done["event"] == "done"
    n_system = len(SYSTEM.split())  # a lower bound of its tokens
    assert done["tokens_cached"] > n_system, done  # the system prompt's KV came back, not evaluated again
    assert done["tokens_evaluated"] < 20


def test_chat_messages_on_a_model_without_a_chat_template_are_refused(server: ServerProc) -> None:
    with server.connect() as c:
        events = c.ask({"id": "nochat", "messages": [{"role": "user", "content": "Name a color."}]})
        assert final(events)["event"] == "error" and final(events)["code"] == "bad_request", events
        assert "chat template" in final(events)["message"] and "edgellama pull" in final(events)["message"]
        # the connection and the server go on
        assert final(c.ask({"id": "after", "prompt": "Red,", "n_predict": 1}))["event"] == "done"


def test_a_system_prompt_on_a_model_without_a_chat_template_stops_the_start(gemma_path: Path,
                                                                           tmp_path: Path) -> None:
    sys_file = tmp_path / "system.txt"
    sys_file.write_text(SYSTEM)
    r = subprocess.run([sys.executable, "-m", "edgellama.cli", "serve", "-m", str(gemma_path), "--socket",
                        str(tmp_path / "s.sock"), "--system-prompt", str(sys_file), *FAST], capture_output=True,
                       text=True, env=cli_env(), timeout=300, check=False)
    assert r.returncode == 1, r.stderr
    assert "--system-prompt needs a model with a chat template" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "s.sock").exists()


def test_bad_lines_each_get_an_error_and_the_connection_goes_on(server: ServerProc) -> None:
    bad: list[tuple[bytes, str, str]] = [
        (b"{not json\n", "bad_request", "not JSON"),
        (b'{"id": "u", "prompt": "\xff\xfe"}\n', "bad_request", "UTF-8"),
        (b'{"id": "t", "prompt": "hi", "n_predict": "ten"}\n', "bad_request", "n_predict"),
        (b'{"id": "f", "prompt": "hi", "temp": 0.5}\n', "bad_request", "unknown field 'temp'"),
        (b'{"id": "r", "prompt": "hi", "top_p": 3}\n', "bad_request", "top_p"),
        (b'{"id": "b", "messages": [{"role": "user"}]}\n', "bad_request", "messages[0]"),
        (b'{"id": "x", "prompt": "' + b"a" * 2000 + b'"}\n', "too_long", "--max-line"),
        (b"[1, 2]\n", "bad_request", "JSON object"),
    ]
    with server.connect() as c:
        for line, code, words in bad:
            c.send_raw(line)
            ev = c.event()
            assert ev["event"] == "error" and ev["code"] == code and words in ev["message"], (line[:40], ev)
        # an over-long line arriving in pieces, without its newline yet, is refused as it grows
        c.send_raw(b'{"id": "y", "prompt": "' + b"b" * 1500)
        ev = c.event()
        assert ev["code"] == "too_long"
        c.send_raw(b'bbbb"}\n')  # the rest of that line is dropped, not parsed
        events = c.ask({"id": "ok", "prompt": "Still there?", "n_predict": 2})
    assert final(events)["event"] == "done"


def test_prompt_over_the_context_is_refused_before_any_work(server: ServerProc) -> None:
    before = server.metrics()
    with server.connect() as c:
        events = c.ask({"id": "big", "prompt": "x " * 400, "n_predict": 4})  # > 256 tokens, < --max-line
    err = final(events)
    assert err["event"] == "error" and err["code"] == "context" and "256" in err["message"]
    after = server.metrics()
    assert after["llamacpp:prompt_tokens_total"] == before["llamacpp:prompt_tokens_total"]
    assert after['edgellama:requests_total{outcome="context"}'] == before.get(
        'edgellama:requests_total{outcome="context"}', 0) + 1


def test_cancel_ends_the_request_with_cancelled(server: ServerProc) -> None:
    with server.connect() as c:
        c.send({"id": "long", "prompt": "Tell me a long story about a lighthouse.", "n_predict": LONG, "temperature": 0})
        assert c.event()["event"] == "token"
        c.send({"type": "cancel", "id": "long"})
        events = c.until_final({"long"})["long"]
        done = final(events)
        assert done["event"] == "done" and done["stop_reason"] == "cancelled"
        assert done["tokens_predicted"] < LONG
        c.send({"type": "cancel", "id": "long"})  # no longer in flight
        ev = c.event()
        assert ev["event"] == "error" and ev["code"] == "not_found"


def test_queue_overflow_is_busy_at_once_and_queued_requests_can_be_cancelled(server: ServerProc) -> None:
    with server.connect() as c:
        c.send({"id": "run", "prompt": "Write a poem.", "n_predict": LONG, "temperature": 0})
        assert c.event()["event"] == "token"  # the slot is busy now
        for i in range(3):  # --queue 3
            c.send({"id": f"q{i}", "prompt": "Queued.", "n_predict": 2})
        t0 = time.monotonic()
        c.send({"id": "over", "prompt": "One too many.", "n_predict": 2})
        while True:
            ev = c.event()
            if ev["id"] == "over":
                break
        assert ev["event"] == "error" and ev["code"] == "busy", ev
        assert time.monotonic() - t0 < 30  # answered while the slot was still busy, not after
        h = server.health()
        assert h["queue"] == 3 and h["slots_busy"] == 1 and h["status"] == "ok"
        for i in range(3):
            c.send({"type": "cancel", "id": f"q{i}"})
        c.send({"type": "cancel", "id": "run"})
        got = c.until_final({"run", "q0", "q1", "q2"})
    for i in range(3):
        done = final(got[f"q{i}"])
        assert done["stop_reason"] == "cancelled" and done["tokens_predicted"] == 0
    assert final(got["run"])["stop_reason"] == "cancelled"


def test_a_client_that_disconnects_frees_the_slot(server: ServerProc) -> None:
    a = server.connect()
    a.send({"id": "gone", "prompt": "Describe the sea at length.", "n_predict": LONG, "temperature": 0})
    assert a.event()["event"] == "token"
    a.close()
    with server.connect() as b:
        events = b.ask({"id": "next", "prompt": "Hello", "n_predict": 2})
    assert final(events)["event"] == "done"
    logged = [r for r in server.records() if r.get("id") == "gone"]
    assert logged and logged[-1]["outcome"] == "cancelled"
    assert logged[-1]["n_predicted"] < LONG
    assert "prompt" not in logged[-1] and "output" not in logged[-1]  # not logged without --log-prompts


def test_health_and_metrics_use_llama_server_names(server: ServerProc) -> None:
    h = server.health()
    assert h["event"] == "health" and h["status"] == "ok" and h["slots"] == 1 and h["protocol"] == 1
    m = server.metrics()
    for name in ("llamacpp:prompt_tokens_total", "llamacpp:tokens_predicted_total", "llamacpp:prompt_seconds_total",
                 "llamacpp:tokens_predicted_seconds_total", "llamacpp:requests_processing",
                 "llamacpp:requests_deferred", "llamacpp:kv_cache_usage_ratio", "edgellama:queue_wait_seconds_count"):
        assert name in m, name
    assert m["llamacpp:tokens_predicted_total"] > 0
    assert 0 < m["llamacpp:kv_cache_usage_ratio"] <= 1


def test_client_command_streams_and_exits_by_outcome(server: ServerProc, chat_server: ServerProc) -> None:
    def client(srv: ServerProc, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "edgellama.cli", "client", "--socket", srv.path, *args],
                              input=stdin, check=False, capture_output=True, text=True, env=cli_env(), timeout=300)

    ok = client(server, "-n", "3", "--temp", "0", stdin="The sky is")
    assert ok.returncode == 0 and ok.stdout.strip(), ok.stderr
    chat = client(chat_server, "--chat", "-n", "3", "--json", "Say hi.")
    events = [json.loads(line) for line in chat.stdout.splitlines()]
    assert chat.returncode == 0 and events[-1]["event"] == "done"
    no_template = client(server, "--chat", "-n", "3", "Say hi.")  # the base model has no chat template
    assert no_template.returncode == 3 and "edgellama pull" in no_template.stderr, no_template.stderr
    refused = client(server, "--top-p", "5", "hi")
    assert refused.returncode == 3 and "bad_request" in refused.stderr
    nobody = client(server, "--socket", str(Path(server.path).with_name("none.sock")), "hi")
    assert nobody.returncode == 1 and "cannot connect" in nobody.stderr


def test_sigterm_during_generation_ends_streams_with_shutdown(gemma_path: Path) -> None:
    srv = ServerProc("-m", str(gemma_path), "--queue", "2")
    try:
        srv.wait_ready()
        c = srv.connect()
        c.send({"id": "a", "prompt": "Tell me everything about rivers.", "n_predict": LONG, "temperature": 0})
        c.send({"id": "b", "prompt": "Queued behind a.", "n_predict": 4})
        assert c.event()["event"] == "token"
        srv.proc.send_signal(signal.SIGTERM)
        got = c.until_final({"a", "b"})
        for rid in ("a", "b"):
            err = final(got[rid])
            assert err["event"] == "error" and err["code"] == "shutdown", err
        assert srv.proc.wait(60) == 0
        assert not os.path.exists(srv.path)  # the socket it created is gone
        c.close()
    finally:
        srv.kill()


def test_ctrl_c_stops_serve_as_sigterm_does_and_exits_130(smollm2_path: Path) -> None:
    """SIGINT (Ctrl-C in a terminal) is the same graceful stop, reported as the README's table says: 130
    (SIGTERM, systemd's stop, stays 0)."""
    srv = ServerProc("-m", str(smollm2_path))
    try:
        srv.wait_ready()
        srv.proc.send_signal(signal.SIGINT)
        assert srv.proc.wait(60) == 130
        assert not os.path.exists(srv.path)
    finally:
        srv.kill()


def test_sigterm_with_grace_lets_the_stream_finish(gemma_path: Path) -> None:
    srv = ServerProc("-m", str(gemma_path), "--grace", "120")
    try:
        srv.wait_ready()
        with srv.connect() as c:
            c.send({"id": "a", "prompt": "Name a fruit.", "n_predict": 6})
            assert c.event()["event"] == "token"
            srv.proc.send_signal(signal.SIGTERM)
            done = final(c.until_final({"a"})["a"])
        assert done["event"] == "done" and done["stop_reason"] in ("length", "eos")
        assert srv.proc.wait(60) == 0
        assert not os.path.exists(srv.path)
    finally:
        srv.kill()


def test_a_live_socket_is_not_taken_over() -> None:
    path = f"/tmp/elsv-live-{os.getpid()}.sock"  # AF_UNIX paths must be short
    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(path)
    live.listen(1)
    try:
        r = subprocess.run([sys.executable, "-m", "edgellama.cli", "serve", "--socket", path, *FAST],
                           check=False, capture_output=True, text=True, env=cli_env(), timeout=120)
        assert r.returncode == 1 and "another server is listening" in r.stderr
    finally:
        live.close()
        os.unlink(path)


def test_stop_string_ends_the_answer_before_it(server: ServerProc) -> None:
    prompt = "The days of the week are Monday,"
    with server.connect() as c:
        full = text_of(c.ask({"id": "full", "prompt": prompt, "n_predict": 8, "temperature": 0}))
        stop = full.strip().split()[1]  # a word from the middle of the greedy answer
        events = c.ask({"id": "cut", "prompt": prompt, "n_predict": 8, "temperature": 0, "stop": [stop]})
    assert final(events)["stop_reason"] == "stop"
    assert text_of(events) == full[:full.index(stop)]


def test_a_half_closed_client_still_gets_its_answer(server: ServerProc) -> None:
    with server.connect() as c:
        c.send({"id": "half", "prompt": "Good morning", "n_predict": 2})
        c.sock.shutdown(socket.SHUT_WR)  # done sending, still reading (as socat does)
        events = c.until_final({"half"})["half"]
        assert final(events)["event"] == "done"
        with pytest.raises(EOFError):
            c.event()  # then the server closes the connection


def test_a_last_line_without_its_newline_is_still_answered(server: ServerProc) -> None:
    """`printf '{...}' | nc -N`: the input ends where the line does; that request is served, not dropped."""
    with server.connect() as c:
        c.send_raw(json.dumps({"id": "nonl", "prompt": "Good morning", "n_predict": 2}).encode())
        c.sock.shutdown(socket.SHUT_WR)
        events = c.until_final({"nonl"})["nonl"]
        assert final(events)["event"] == "done"


def test_a_client_gone_while_queued_leaves_the_queue_at_once(server: ServerProc) -> None:
    with server.connect() as a:
        a.send({"id": "busy", "prompt": "Write about mountains.", "n_predict": LONG, "temperature": 0})
        assert a.event()["event"] == "token"
        b = server.connect()
        b.send({"id": "queued", "prompt": "Waiting.", "n_predict": 2})
        deadline = time.monotonic() + 30
        while server.health()["queue"] != 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        b.close()
        while server.health()["queue"] != 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        h = server.health()
        assert h["queue"] == 0 and h["slots_busy"] == 1  # gone from the queue while the slot is still busy
        a.send({"type": "cancel", "id": "busy"})
        assert final(a.until_final({"busy"})["busy"])["stop_reason"] == "cancelled"

"""The scheduler and the serial text session against a fake engine (tests/fake_engine.py): answers, exactly
one last event per request, and fault isolation: a fault injected at each stage of one request (admit,
evaluate, sample, detokenize, stream, finish) under --parallel 1 and 4 ends that request with an
`internal` error; the engine thread and the other requests go on, and the next request is answered."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from edgellama.service import protocol as P
from edgellama.service.job import Job
from edgellama.service.metrics import Metrics
from edgellama.service.scheduler import FAULT_ENV, FAULT_MARK, FAULT_STAGES, EngineConfig, Scheduler
from tests.fake_engine import FakeLLM, expected_answer

MAX_TOKENS = 12


class Harness:
    def __init__(self, parallel: int, **llm_kwargs: Any) -> None:
        self.llm = FakeLLM(n_seq=parallel, **llm_kwargs)
        self.ready = threading.Event()
        self.fatal: list[BaseException] = []
        self.sched = Scheduler(lambda: self.llm, EngineConfig(max_tokens=MAX_TOKENS, queue=16, parallel=parallel),
                               Metrics(), self.ready.set, self.fatal.append)
        self.sched.start()
        assert self.ready.wait(10), self.fatal

    def submit(self, prompt: str, **fields: Any) -> tuple[Job, list[dict[str, Any]], threading.Event]:
        req = P.parse_object({"id": prompt[:20] or "x", "prompt": prompt, "temperature": 0, **fields})
        assert isinstance(req, P.Completion)
        events: list[dict[str, Any]] = []
        ended = threading.Event()

        def emit(ev: dict[str, Any]) -> None:
            events.append(ev)
            if ev["event"] in ("done", "error"):
                ended.set()

        job = Job(req, emit)
        self.sched.submit(job)
        return job, events, ended

    def run(self, *prompts: str, **fields: Any) -> list[list[dict[str, Any]]]:
        subs = [self.submit(p, **fields) for p in prompts]
        for _job, events, ended in subs:
            assert ended.wait(10), events
        time.sleep(0.05)  # anything sent after the last event would show up now
        return [events for _job, events, _ended in subs]

    def close(self) -> None:
        self.sched.stop()
        self.sched.thread.join(10)
        assert not self.sched.thread.is_alive() and self.llm.closed


@pytest.fixture(params=[1, 4], ids=["parallel1", "parallel4"])
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    h = Harness(request.param)
    yield h
    h.close()


def text(events: list[dict[str, Any]]) -> str:
    return "".join(e.get("text", "") for e in events if e["event"] == "token")


def last(events: list[dict[str, Any]]) -> dict[str, Any]:
    finals = [e for e in events if e["event"] in ("done", "error")]
    assert len(finals) == 1 and events[-1] is finals[0], events  # exactly one, and nothing after it
    return finals[0]


def test_requests_get_their_greedy_answers(harness: Harness) -> None:
    prompts = ["say abc", "count from w", "stop at the dot x.", "tiny q"]
    for p, events in zip(prompts, harness.run(*prompts), strict=True):
        assert text(events) == expected_answer(p, MAX_TOKENS)
        assert last(events)["stop_reason"] == ("eos" if p.endswith(".") else "length")


def test_stop_strings_and_limits_end_requests(harness: Harness) -> None:
    (ev,) = harness.run("alphabet a", stop=["fg"], n_predict=50)
    assert text(ev) == "bcde" and last(ev)["stop_reason"] == "stop"
    (ev,) = harness.run("alphabet a", n_predict=3)
    assert text(ev) == "bcd" and last(ev)["stop_reason"] == "length"
    (ev,) = harness.run("non-streamed a", stream=False, n_predict=2)
    assert last(ev)["content"] == "bc" and [e["event"] for e in ev] == ["done"]


@pytest.mark.parametrize("stage", FAULT_STAGES)
def test_a_fault_at_each_stage_ends_only_its_request(harness: Harness, monkeypatch: pytest.MonkeyPatch,
                                                     stage: str) -> None:
    monkeypatch.setenv(FAULT_ENV, stage)
    prompts = ["first a", f"faulty {FAULT_MARK} b", "third c"]
    results = harness.run(*prompts)
    for p, events in zip(prompts, results, strict=True):
        end = last(events)
        if FAULT_MARK in p:
            assert end["event"] == "error" and end["code"] == P.INTERNAL, end
            assert f"injected fault at {stage}" in end["message"], end
        else:
            assert end["event"] == "done" and text(events) == expected_answer(p, MAX_TOKENS), (stage, events)
    monkeypatch.delenv(FAULT_ENV)
    assert harness.sched.thread.is_alive()
    (ev,) = harness.run("after the fault d")
    assert text(ev) == expected_answer("after the fault d", MAX_TOKENS)
    assert harness.sched.snapshot()["slots_busy"] == 0


def test_non_finite_logits_end_the_request_naming_the_model(harness: Harness) -> None:
    harness.llm.engine.nan = True
    (ev,) = harness.run("nan please")
    end = last(ev)
    assert end["code"] == P.INTERNAL and "fake.gguf" in end["message"] and "non-finite logits" in end["message"]
    harness.llm.engine.nan = False
    (ev,) = harness.run("fine again a")
    assert text(ev) == "bcdefghijklm"


def test_a_failed_forward_pass_is_retried_slot_by_slot(harness: Harness) -> None:
    harness.llm.engine.fail_decode = RuntimeError("transient")
    prompts = ["one a", "two b", "three c"]
    for p, events in zip(prompts, harness.run(*prompts), strict=True):
        assert text(events) == expected_answer(p, MAX_TOKENS)


def test_bad_input_is_a_bad_request_not_a_fault(harness: Harness) -> None:
    with pytest.raises(P.ProtocolError) as e:
        P.parse_object({"id": 1, "prompt": ""})
    assert e.value.code == P.BAD_REQUEST and "'prompt'" in str(e.value)
    (ev,) = harness.run("x" * 300)  # longer than the fake context of 256
    assert last(ev)["code"] == P.CONTEXT


def test_mirostat_2_is_served() -> None:
    h = Harness(2)
    try:
        (ev,) = h.run("mirostat a", mirostat=2, temperature=0.8, seed=3)
        assert last(ev)["event"] == "done" and text(ev)
    finally:
        h.close()


def test_a_full_context_without_shift_ends_with_context() -> None:
    h = Harness(1, n_ctx=32, context_shift=False)
    try:
        (ev,) = h.run("x" * 20 + " a", n_predict=-1)
        end = last(ev)
        assert end["stop_reason"] == "context" or end.get("code") == P.CONTEXT, end
    finally:
        h.close()


# ---- the serial text session against the same fake engine ----

def test_serial_text_session_over_the_fake_engine() -> None:
    from edgellama.service.serial_config import PortConfig
    from edgellama.service.serial_text import TextSession

    h = Harness(1)
    out: list[bytes] = []
    finals = threading.Semaphore(0)

    def write(data: bytes, final: bool, req_id: Any = None) -> None:
        out.append(data)
        if final:
            finals.release()

    session: TextSession | None = None

    def submit(obj: dict[str, Any]) -> None:
        try:
            req = P.parse_object(obj)
        except P.ProtocolError as exc:
            assert session is not None
            session.on_event(P.error_event(exc.req_id, exc.code, str(exc)))
            return
        assert isinstance(req, P.Completion)
        h.sched.submit(Job(req, lambda ev: session.on_event(ev) if session is not None else None))

    session = TextSession(PortConfig(url="loop://", mode="text", chat=True, eol="lf"), submit, write)
    try:
        def say(line: str) -> str:
            out.clear()
            session.handle(line.encode())
            assert finals.acquire(timeout=10)
            time.sleep(0.02)
            return b"".join(out).decode()

        assert say("/set temperature 0") == "OK temperature=0\n.\n"
        assert say("/set mirostat 2").startswith("OK mirostat=2")  # a sampler every front end takes
        assert say("/set mirostat 0").startswith("OK")
        assert say("/set top_p 2").startswith("ERR bad_request 'top_p' must be in [0, 1]")
        answer = say("hi")  # the chat template ends with "assistant: ": after the space comes 'a'
        assert answer == expected_answer("assistant: ", MAX_TOKENS) + "\n.\n", answer
        assert len(session.history) == 2
        assert say("/reset") == "OK conversation cleared\n.\n"
    finally:
        h.close()

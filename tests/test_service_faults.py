"""Fault isolation in a real `edgellama serve` (SmolLM2, a real UNIX socket): a fault injected into one
request (EDGELLAMA_TEST_FAULT names the stage; the request's prompt carries the marker) ends that request
with one `internal` error while the requests beside it are answered as they would be alone, under
--parallel 1 and 4, over protocol v1 and HTTP; the next request is answered. The scheduler's unit tests
(tests/test_scheduler.py) inject at every stage against a fake engine; this checks the real engine."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from edgellama.service.scheduler import FAULT_ENV, FAULT_MARK
from tests.service_util import Conn, ServerProc, UnixHTTP, text_of

PROMPTS = ["The capital of France is", f"Tell me {FAULT_MARK} a story", "One, two, three,"]


@pytest.mark.parametrize(("parallel", "stage"), [(1, "sample"), (4, "evaluate"), (4, "stream")])
def test_a_faulty_request_ends_alone(smollm2_path: Path, parallel: int, stage: str) -> None:
    srv = ServerProc("-m", str(smollm2_path), "--parallel", str(parallel), "--max-tokens", "12", env={FAULT_ENV: stage})
    try:
        srv.wait_ready()
        with Conn(srv.path) as c:
            solo = {p: text_of(c.ask({"id": 0, "prompt": p, "temperature": 0})) for p in PROMPTS if FAULT_MARK not in p}
            for i, p in enumerate(PROMPTS):  # all in flight together
                c.send({"id": i, "prompt": p, "temperature": 0})
            got = c.until_final(set(range(len(PROMPTS))))
            for i, p in enumerate(PROMPTS):
                finals = [e for e in got[i] if e["event"] in ("done", "error")]
                assert len(finals) == 1, got[i]
                if FAULT_MARK in p:
                    assert finals[0]["event"] == "error" and finals[0]["code"] == "internal", finals
                    assert f"injected fault at {stage}" in finals[0]["message"]
                else:
                    assert finals[0]["event"] == "done" and text_of(got[i]) == solo[p], (p, got[i])
            after = c.ask({"id": "next", "prompt": PROMPTS[0], "temperature": 0})
            assert text_of(after) == solo[PROMPTS[0]]
        http = UnixHTTP(srv.path)
        http.request("POST", "/completion", json.dumps({"prompt": PROMPTS[1], "n_predict": 4}),
                     {"Content-Type": "application/json"})
        r = http.getresponse()
        body: dict[str, Any] = json.loads(r.read())
        assert r.status == 500 and f"injected fault at {stage}" in body["error"]["message"], body
        http.request("POST", "/completion", json.dumps({"prompt": "", "n_predict": 4}),
                     {"Content-Type": "application/json"})
        r = http.getresponse()
        body = json.loads(r.read())
        assert r.status == 400 and "'prompt'" in body["error"]["message"], body  # bad input is not a fault
        assert srv.proc.poll() is None
    finally:
        srv.kill()


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_a_5xx_log_line_carries_the_exception_and_its_traceback(fmt: str) -> None:
    """log.exception (a route that failed: a 500) names the exception and where it was raised."""
    import logging
    import sys

    from edgellama.service.logs import Formatter

    try:
        {}["missing"]  # the failure under test
    except KeyError:
        record = logging.getLogger("t").makeRecord("t", logging.ERROR, __file__, 1, "http request failed", (),
                                                   exc_info=sys.exc_info(),
                                                   extra={"fields": {"path": "/x"}})
    line = Formatter(fmt, journal=False).format(record)
    if fmt == "json":
        obj = json.loads(line)
        assert obj["error"] == "KeyError: 'missing'" and obj["path"] == "/x"
        assert "Traceback" in obj["trace"] and "test_a_5xx_log_line" in obj["trace"]
    else:
        assert "error=\"KeyError: 'missing'\"" in line and "Traceback" in line

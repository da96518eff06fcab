"""The bounded soak of issue 16, run through bench/serve_soak.py: 300 requests, 4 at a time, 10% of the
clients disconnecting early. Slow (minutes): marked slow."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.service_util import ROOT, cli_env

RSS_GROWTH_KIB = 16 * 1024  # after warm-up; the weights' mapped pages are in RSS from the first requests on


@pytest.mark.slow
def test_soak_every_request_ends_rss_flat_no_fd_leak(smollm2_path: Path) -> None:
    # an instruct model: a third of the requests are chat turns
    r = subprocess.run([sys.executable, str(ROOT / "bench/serve_soak.py"), "-m", str(smollm2_path), "--requests",
                        "300", "--concurrency", "4", "--disconnect", "0.1", "--json"], capture_output=True,
                       text=True, env=cli_env(), timeout=3600, check=False)
    assert r.returncode == 0, r.stderr[-3000:]
    rep = json.loads(r.stdout.strip().splitlines()[-1])
    print(f"\nsoak: {rep}")
    assert rep["lost"] == [] and rep["answered"] == 300
    assert rep["unlogged"] == []  # the server ended every request, the disconnected ones too
    assert rep["outcomes"].get("disconnected", 0) >= 10
    # `busy` is an explicit refusal: a disconnected client's request holds its place until the engine's next
    # step, so a new request can briefly find 4 clients' worth of work plus a leaving one
    assert set(rep["outcomes"]) <= {"eos", "length", "stop", "disconnected", "busy"}
    assert rep["outcomes"].get("busy", 0) <= rep["outcomes"]["disconnected"]
    assert set(rep["server_outcomes"]) <= {"eos", "length", "stop", "cancelled", "busy"}
    assert rep["rss_kib"]["end"] - rep["rss_kib"]["warm"] <= RSS_GROWTH_KIB
    assert rep["fds"]["end"] <= rep["fds"]["start"]  # every connection's fd closed again
    assert rep["exit_code"] == 0

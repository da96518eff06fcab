"""A bounded soak of `edgellama serve` (issue 16): N requests, C at a time, mixed prompt and answer
lengths, a fraction of clients that disconnect early; every request must end explicitly, the server's
RSS stay flat and its fd count return to where it was.

Usage: python bench/serve_soak.py [-m MODEL] [--requests 300] [--concurrency 4] [--disconnect 0.1] [--json]
Each request opens its own connection (so fds are exercised). A disconnecting client closes after its
first event or right after sending; its request must still show in the server's log with an outcome.
RSS and fds are read from /proc after a warm-up (the first tenth of the requests) and at the end."""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tests.service_util import ServerProc

PROMPTS = [
    "Hi",
    "The capital of France is",
    "List three colors:",
    "Write one sentence about the sea and the wind over the harbour at dawn.",
    "Translate to French: good morning, how are you today, my friend?",
    "Explain in a few words why the sky looks blue on a clear summer afternoon in the mountains.",
]


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def n_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def one_request(srv: ServerProc, i: int, rng: random.Random, disconnect: bool) -> dict[str, Any]:
    req = {"id": f"soak-{i}", "prompt": rng.choice(PROMPTS), "n_predict": rng.choice([1, 2, 4, 8]),
           "temperature": rng.choice([0, 0.8])}
    if rng.random() < 0.3:
        req = {"id": req["id"], "messages": [{"role": "user", "content": req["prompt"]}],
               "n_predict": req["n_predict"]}
    with srv.connect(timeout=600) as c:
        c.send(req)
        if disconnect:
            if rng.random() < 0.5:
                c.event()  # close mid-stream (or after an immediate error)
            return {"id": req["id"], "outcome": "disconnected"}
        events = c.until_final({req["id"]})[req["id"]]
    finals = [e for e in events if e["event"] in ("done", "error")]
    assert len(finals) == 1, events
    f = finals[0]
    return {"id": req["id"], "outcome": f.get("stop_reason") or f["code"]}


def soak(model: str | None, n: int, concurrency: int, disconnect: float, seed: int = 1) -> dict[str, Any]:
    args = ["--queue", str(concurrency), "--max-tokens", "32", "--log-format", "json"]
    if model:
        args += ["-m", model]
    srv = ServerProc(*args, nice=10)
    results: list[dict[str, Any]] = []
    lock = threading.Lock()
    counter = iter(range(n))
    warm: dict[str, int] = {}
    failures: list[str] = []

    def worker(w: int) -> None:
        rng = random.Random(seed * 1000 + w)
        while True:
            with lock:
                i = next(counter, None)
            if i is None:
                return
            try:
                r = one_request(srv, i, rng, rng.random() < disconnect)
            except Exception as exc:  # noqa: BLE001 - a lost request is what the soak looks for
                failures.append(f"soak-{i}: {type(exc).__name__}: {exc}")
                continue
            with lock:
                results.append(r)
                if len(results) == max(1, n // 10) and not warm:
                    warm.update(rss=rss_kib(srv.proc.pid), fds=n_fds(srv.proc.pid))

    try:
        srv.wait_ready()
        pid = srv.proc.pid
        time.sleep(0.5)  # wait_ready's health connection is closed by the server's loop, not at once
        start = {"rss": rss_kib(pid), "fds": n_fds(pid)}
        t0 = time.monotonic()
        threads = [threading.Thread(target=worker, args=(w,)) for w in range(concurrency)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.monotonic() - t0
        deadline = time.monotonic() + 60  # disconnected requests end at their next step; connections close
        while time.monotonic() < deadline and (srv.health()["slots_busy"] or srv.health()["queue"]):
            time.sleep(0.2)
        time.sleep(0.5)
        end = {"rss": rss_kib(pid), "fds": n_fds(pid)}
        metrics = srv.metrics()
        rc = srv.terminate()
        logged = {}
        for line in srv.stderr().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if rec.get("msg") == "request":
                logged[rec["id"]] = rec["outcome"]
    finally:
        if os.environ.get("SOAK_KEEP_LOG"):
            print(srv.stderr()[-6000:], file=sys.stderr)
        srv.kill()
    outcomes: dict[str, int] = {}
    for r in results:
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
    unlogged = [r["id"] for r in results if r["id"] not in logged]
    return {"requests": n, "concurrency": concurrency, "answered": len(results), "lost": failures,
            "unlogged": unlogged, "outcomes": outcomes, "server_outcomes": _count(logged.values()),
            "seconds": round(elapsed, 1), "rss_kib": {"start": start["rss"], "warm": warm.get("rss"),
                                                      "end": end["rss"]},
            "fds": {"start": start["fds"], "warm": warm.get("fds"), "end": end["fds"]},
            "connections_open": metrics.get("edgellama:connections"), "exit_code": rc}


def _count(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[str(v)] = out.get(str(v), 0) + 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2-135m-instruct",
                    help="an instruct model (chat turns need its template); default %(default)s")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--disconnect", type=float, default=0.1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    rep = soak(a.model, a.requests, a.concurrency, a.disconnect)
    if a.json:
        print(json.dumps(rep))
    else:
        for k, v in rep.items():
            print(f"{k:>18}: {v}")


if __name__ == "__main__":
    main()

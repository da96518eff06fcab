"""`edgellama serve` speed (issue 16): what the socket path adds to a single stream against
`edgellama run`, time to first token of a short chat turn with the system prompt cached, and queue
wait / TTFT percentiles at 1, 2 and 4 concurrent clients.

Usage: python bench/serve.py [-m MODEL] [-c 512] [-t 1] [-n 32] [--repeats 3] [--json] [--http]
- overhead: the same raw prompt, greedy, n tokens, the cache cleared (cache_prompt false), run and
  socket requests alternated `--repeats` times (medians): client wall time over the socket against
  run's prompt + generation time; and the client's wall time against the server's own engine time
  (prompt_ms + predicted_ms in `done`), which isolates the socket, JSON and loop cost.
- ttft: a short user turn after a cached --system-prompt, measured by the client from send to first token.
- concurrency: C clients each send R chat turns back to back; queue_ms (from `done`) and client TTFT.
- --http (only this, issue 19): the same greedy raw-prompt stream over protocol v1 and over HTTP
  (`POST /completion`, SSE) on one socket, alternated `--repeats` times: client wall time of each
  (medians) and the inter-token gaps at the client (each token's arrival after the previous one), which
  show whether SSE events are flushed per token."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from tests.service_util import Conn, ServerProc, UnixHTTP, cli_env

PROMPT = "The history of the bicycle begins in the early nineteenth century, when"
SYSTEM = ("You are the voice assistant of a kitchen appliance. Answer in one or two short sentences, "
          "plainly, without lists or markup. If you do not know, say so. Units are metric.")


def pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def run_once(model: list[str], engine: list[str], n: int) -> float:
    r = subprocess.run([sys.executable, "-m", "edgellama.cli", "run", *model, *engine, "-p", PROMPT, "-n", str(n),
                        "--temp", "0", "--json"], capture_output=True, text=True, env=cli_env(), check=True)
    tm = json.loads(r.stdout.splitlines()[-1])["timings"]
    return float(tm["prompt_ms"] + tm["gen_ms"]) / 1000.0


def socket_once(c: Conn, n: int) -> tuple[float, float]:
    t0 = time.perf_counter()
    ev = c.ask({"id": "o", "prompt": PROMPT, "n_predict": n, "temperature": 0, "cache_prompt": False})[-1]
    wall = time.perf_counter() - t0
    assert ev["event"] == "done" and ev["tokens_predicted"] == n, ev
    return wall, (ev["timings"]["prompt_ms"] + ev["timings"]["predicted_ms"]) / 1000.0


def v1_stream(c: Conn, n: int) -> tuple[float, list[float]]:
    """(wall s, arrival gaps s between tokens) of one protocol v1 stream."""
    t0 = time.perf_counter()
    c.send({"id": "s", "prompt": PROMPT, "n_predict": n, "temperature": 0, "cache_prompt": False})
    arrivals: list[float] = []
    while True:
        ev = c.event()
        if ev["event"] == "token":
            arrivals.append(time.perf_counter())
        elif ev["event"] in ("done", "error"):
            assert ev["event"] == "done" and ev["tokens_predicted"] == n, ev
            return time.perf_counter() - t0, [b - a for a, b in itertools.pairwise(arrivals)]


def http_stream(h: UnixHTTP, n: int) -> tuple[float, list[float]]:
    """The same over HTTP: POST /completion with stream, read event by event on a keep-alive connection."""
    t0 = time.perf_counter()
    h.request("POST", "/completion", body=json.dumps({"prompt": PROMPT, "n_predict": n, "temperature": 0,
                                                      "cache_prompt": False, "stream": True}))
    r = h.getresponse()
    assert r.status == 200, r.read()
    arrivals: list[float] = []
    while True:
        line = r.readline()
        if not line.startswith(b"data: "):
            if not line:
                raise EOFError("stream ended without its last event")
            continue
        ev = json.loads(line[6:])
        if not ev["stop"]:
            arrivals.append(time.perf_counter())
            continue
        assert ev["tokens_predicted"] == n, ev
        r.read()  # the chunked body's end, so the connection is ready for the next request
        return time.perf_counter() - t0, [b - a for a, b in itertools.pairwise(arrivals)]


def http_vs_v1(srv: ServerProc, n: int, repeats: int) -> dict[str, Any]:
    v1_walls, http_walls, v1_gaps, http_gaps = [], [], [], []
    with srv.connect() as c:
        h = UnixHTTP(srv.path)
        v1_stream(c, 2)
        http_stream(h, 2)  # warm both paths
        for _ in range(repeats):
            wall, gaps = v1_stream(c, n)
            v1_walls.append(wall)
            v1_gaps += gaps
            wall, gaps = http_stream(h, n)
            http_walls.append(wall)
            http_gaps += gaps
        h.close()
    v1_s, http_s = statistics.median(v1_walls), statistics.median(http_walls)

    def gap_stats(gaps: list[float]) -> dict[str, float]:
        return {"p50_ms": round(1000 * pct(gaps, 50), 2), "p95_ms": round(1000 * pct(gaps, 95), 2),
                "min_ms": round(1000 * min(gaps), 2), "max_ms": round(1000 * max(gaps), 2), "n": len(gaps)}

    return {"v1_wall_s": round(v1_s, 3), "http_wall_s": round(http_s, 3),
            "http_vs_v1_pct": round(100 * (http_s / v1_s - 1), 2),
            "v1_walls_s": [round(x, 3) for x in v1_walls], "http_walls_s": [round(x, 3) for x in http_walls],
            "v1_gaps": gap_stats(v1_gaps), "http_gaps": gap_stats(http_gaps)}


def chat_turn(c: Conn, rid: str, text: str, n: int) -> tuple[float, float]:
    """(client TTFT s, server queue wait s)."""
    t0 = time.perf_counter()
    c.send({"id": rid, "messages": [{"role": "user", "content": text}], "n_predict": n, "temperature": 0})
    ttft = None
    while True:
        ev = c.event()
        if ev["event"] == "token" and ttft is None:
            ttft = time.perf_counter() - t0
        if ev["event"] in ("done", "error"):
            assert ev["event"] == "done", ev
            return (ttft if ttft is not None else time.perf_counter() - t0), ev["timings"]["queue_ms"] / 1000.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="smollm2-135m-instruct",
                    help="an instruct model (chat turns need its template); default %(default)s")
    ap.add_argument("-c", "--ctx-size", type=int, default=512)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("-n", "--n-predict", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--turns", type=int, default=4, help="chat turns per client in the concurrency runs")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--http", action="store_true", help="only HTTP streaming against protocol v1 (issue 19)")
    a = ap.parse_args()
    model = ["-m", a.model] if a.model else []
    engine = ["-c", str(a.ctx_size), "-t", str(a.threads)]
    sys_file = Path(tempfile.mkdtemp()) / "system.txt"
    sys_file.write_text(SYSTEM)
    srv = ServerProc(*model, "--system-prompt", str(sys_file), "--queue", "8", nice=0, engine=engine)
    rep: dict[str, Any] = {"n_predict": a.n_predict, "threads": a.threads, "n_ctx": a.ctx_size}
    try:
        srv.wait_ready()
        if a.http:
            rep["http"] = http_vs_v1(srv, a.n_predict, a.repeats)
            srv.terminate()
            print(json.dumps(rep) if a.json else json.dumps(rep, indent=1))
            return
        runs, walls, engines = [], [], []
        with srv.connect() as c:
            socket_once(c, 2)  # warm the weights' pages for both paths
            for _ in range(a.repeats):
                runs.append(run_once(model, engine, a.n_predict))
                wall, eng = socket_once(c, a.n_predict)
                walls.append(wall)
                engines.append(eng)
        run_s, wall_s, eng_s = statistics.median(runs), statistics.median(walls), statistics.median(engines)
        rep["overhead"] = {"run_s": round(run_s, 3), "socket_wall_s": round(wall_s, 3),
                           "server_engine_s": round(eng_s, 3),
                           "socket_vs_run_pct": round(100 * (wall_s / run_s - 1), 2),
                           "socket_vs_engine_pct": round(100 * (wall_s / eng_s - 1), 2),
                           "runs_s": [round(x, 3) for x in runs], "walls_s": [round(x, 3) for x in walls]}
        with srv.connect() as c:
            chat_turn(c, "warm", "Hello.", 1)
            ttfts = [chat_turn(c, f"t{i}", q, 1)[0] for i, q in
                     enumerate(["Hi!", "What time is it?", "Thanks.", "Is the oven on?", "Good night."])]
        rep["ttft_cached_system_s"] = {"p50": round(statistics.median(ttfts), 3), "max": round(max(ttfts), 3),
                                       "samples": [round(x, 3) for x in ttfts]}
        rep["concurrency"] = {}
        for n_clients in (1, 2, 4):
            ttft_all: list[float] = []
            wait_all: list[float] = []
            lock = threading.Lock()

            def client(k: int, ttft_all: list[float] = ttft_all, wait_all: list[float] = wait_all,
                       lock: threading.Lock = lock) -> None:
                with srv.connect(timeout=600) as c:
                    for i in range(a.turns):
                        ttft, wait = chat_turn(c, f"c{k}-{i}", f"Question {i} from client {k}: name a fruit.", 8)
                        with lock:
                            ttft_all.append(ttft)
                            wait_all.append(wait)

            threads = [threading.Thread(target=client, args=(k,)) for k in range(n_clients)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            rep["concurrency"][n_clients] = {
                "requests": len(ttft_all),
                "queue_wait_s": {"p50": round(pct(wait_all, 50), 3), "p95": round(pct(wait_all, 95), 3)},
                "ttft_s": {"p50": round(pct(ttft_all, 50), 3), "p95": round(pct(ttft_all, 95), 3)}}
        srv.terminate()
    finally:
        srv.kill()
    if a.json:
        print(json.dumps(rep))
    else:
        print(json.dumps(rep, indent=1))


if __name__ == "__main__":
    main()

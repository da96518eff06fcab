"""`edgellama bench`: llama-bench's two tests. pp N: one batch of N prompt tokens; tg N: N tokens
generated one at a time. Repeated, reported as mean +/- stdev tok/s in markdown or JSON."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from typing import Any

import numpy as np

from edgellama.cli_common import add_model_args, int_list, model_path


def add_parser(sub: Any) -> None:
    p = sub.add_parser("bench", help="prompt-processing and generation speed (like llama-bench)",
                       description=__doc__)
    add_model_args(p, threads_list=True)
    p.add_argument("-p", "--n-prompt", type=int_list, default=[128], help="prompt lengths, e.g. 128,512")
    p.add_argument("-n", "--n-gen", type=int_list, default=[64], help="generation lengths")
    p.add_argument("-r", "--repetitions", type=int, default=5)
    p.add_argument("--json", action="store_true")
    p.set_defaults(handler=run)


def _time_pp(llm: Any, toks: list[int]) -> float:
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(toks)
    return time.perf_counter() - t0


def _time_tg(llm: Any, first: int, n: int) -> float:
    llm.reset()
    tok = first
    t0 = time.perf_counter()
    for _ in range(n):
        logits = llm.eval([tok])
        tok = int(np.argmax(logits))
    return time.perf_counter() - t0


def bench(path: Any, threads: list[int], n_prompt: list[int], n_gen: list[int], reps: int, n_ctx: int,
          kv_type: str, numerics: str = "native") -> list[dict[str, Any]]:
    from edgellama.kernels import isa
    from edgellama.llm import LLM

    rows = []
    need_ctx = max([n_ctx] + n_prompt + n_gen)
    for t in threads:
        max_pp = max(n_prompt + [1])
        with LLM(path, n_ctx=need_ctx, n_batch=max_pp, n_threads=t, kv_type=kv_type, numerics=numerics) as llm:
            rng = np.random.default_rng(0)
            for kind, sizes in (("pp", n_prompt), ("tg", n_gen)):
                for n in sizes:
                    if n == 0:
                        continue
                    toks = rng.integers(0, llm.n_vocab, size=n).tolist()
                    def run_once(kind: str = kind, toks: list[int] = toks, n: int = n) -> float:
                        return _time_pp(llm, toks) if kind == "pp" else _time_tg(llm, toks[0], n)

                    run_once()  # warm-up: page in the weights, settle the pool
                    rates = [n / run_once() for _ in range(reps)]
                    rows.append({
                        "model": llm.path.name, "size_bytes": llm.path.stat().st_size, "arch": llm.hp.arch,
                        "isa": isa(), "numerics": numerics, "threads": t, "test": f"{kind}{n}", "n_tokens": n,
                        "tok_s_mean": statistics.fmean(rates),
                        "tok_s_stdev": statistics.stdev(rates) if len(rates) > 1 else 0.0,
                        "samples": rates,
                    })
    return rows


def run(args: argparse.Namespace) -> int:
    if args.repetitions < 1:
        raise ValueError("-r/--repetitions must be >= 1")
    from edgellama.llm import default_threads

    if any(t > 64 for t in args.threads):
        raise ValueError("-t/--threads must be in 0..64")
    threads = [t or default_threads() for t in args.threads]
    rows = bench(model_path(args), threads, args.n_prompt, args.n_gen, args.repetitions, args.ctx_size or 0,
                 args.cache_type, args.numerics)
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    print("| model | size | arch | isa | numerics | threads | test | t/s |")
    print("| --- | ---: | --- | --- | --- | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['model']} | {r['size_bytes'] / 2**20:.1f} MiB | {r['arch']} | {r['isa']} | {r['numerics']} | {r['threads']} | "
              f"{r['test']} | {r['tok_s_mean']:.2f} ± {r['tok_s_stdev']:.2f} |")
    return 0

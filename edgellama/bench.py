"""llama-bench's two tests on a loaded model. pp N: one batch of N prompt tokens; tg N: N tokens generated
one at a time; each repeated after a warm-up. Used by `edgellama bench`."""

from __future__ import annotations

import statistics
import time
from typing import Any

import numpy as np

from edgellama.progress import note


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
          kv_type: str, numerics: str = "native", progress: bool = False) -> list[dict[str, Any]]:
    """progress: a line per test on stderr when it is a terminal."""
    from edgellama.llm import LLM
    from edgellama.native.kernels import isa

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
                    if progress:
                        note(f"bench: {kind}{n} at {t} threads, {reps} repetitions")
                    rates = [n / run_once() for _ in range(reps)]
                    rows.append({
                        "model": llm.path.name, "size_bytes": llm.path.stat().st_size, "arch": llm.hp.arch,
                        "isa": isa(), "numerics": numerics, "threads": t, "test": f"{kind}{n}", "n_tokens": n,
                        "tok_s_mean": statistics.fmean(rates),
                        "tok_s_stdev": statistics.stdev(rates) if len(rates) > 1 else 0.0,
                        "samples": rates,
                    })
    return rows

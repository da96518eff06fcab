"""`edgellama perplexity`: llama.cpp's method. The text is cut into chunks of n_ctx tokens, the first
token of each chunk is replaced by BOS, and the second half of each chunk is scored."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from edgellama.cli.common import INT32_MAX, add_model_args, check_range, load
from edgellama.perplexity import perplexity
from edgellama.progress import enabled as progress_enabled


def add_parser(sub: Any) -> None:
    p = sub.add_parser("perplexity", help="perplexity of a text file (llama.cpp's method)", description=__doc__)
    add_model_args(p)
    p.add_argument("-f", "--file", required=True, help="text file to score")
    p.add_argument("--chunks", type=int, default=-1, help="score at most this many chunks")
    p.add_argument("--bos-id", type=int, default=None, help="token that replaces each chunk's first token")
    p.set_defaults(handler=run, ctx_size=512)


def run(args: argparse.Namespace) -> int:
    check_range("--chunks", args.chunks, -1, INT32_MAX)
    if args.chunks == 0:
        raise ValueError("--chunks must be -1 (every chunk) or at least 1")
    path = Path(args.file)
    if not path.is_file():
        raise FileNotFoundError(f"text file not found: {path}")
    text = path.read_text(encoding="utf-8", errors="replace")
    llm = load(args)
    with llm:
        if args.bos_id is not None:
            check_range("--bos-id", args.bos_id, 0, llm.n_vocab - 1)
        n_ctx = llm.n_ctx
        t0 = time.perf_counter()
        # no BOS in front of the text: each chunk's first token is replaced by BOS instead (the
        # method of the llama.cpp reference figures), so chunks cut the text at the same places
        toks = llm.tokenizer.encode(text, add_special=False)
        bos = args.bos_id if args.bos_id is not None else llm.tokenizer.bos_id
        n_chunks = len(toks) // n_ctx if args.chunks < 0 else min(args.chunks, len(toks) // n_ctx)
        print(f"edgellama: tokenized {len(toks)} tokens in {(time.perf_counter() - t0) * 1000:.0f} ms; "
              f"{n_chunks} chunks of {n_ctx}", file=sys.stderr)

        def progress(c: int, ppl: float) -> None:  # llama.cpp's running value per chunk, on a terminal
            if progress_enabled():
                sys.stderr.write(f"[{c + 1}]{ppl:.4f},")
                sys.stderr.flush()

        t1 = time.perf_counter()
        ppl, err, n, _ = perplexity(llm, toks, n_ctx, bos, args.chunks, progress)
        dt = time.perf_counter() - t1
        if progress_enabled():
            sys.stderr.write("\n")
        print(f"Final estimate: PPL = {ppl:.4f} +/- {err:.5f}  ({n} tokens scored, {dt:.1f} s, "
              f"{n_chunks * n_ctx / dt:.1f} tokens/s)")
    return 0

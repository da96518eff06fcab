"""`edgellama perplexity`: llama.cpp's method. The text is cut into chunks of n_ctx tokens, the first
token of each chunk is replaced by BOS, and the second half of each chunk is scored."""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from edgellama.cli_common import add_model_args, load


def add_parser(sub: Any) -> None:
    p = sub.add_parser("perplexity", help="perplexity of a text file (llama.cpp's method)", description=__doc__)
    add_model_args(p)
    p.add_argument("-f", "--file", required=True, help="text file to score")
    p.add_argument("--chunks", type=int, default=-1, help="score at most this many chunks")
    p.add_argument("--bos-id", type=int, default=None, help="token that replaces each chunk's first token")
    p.set_defaults(handler=run, ctx_size=512)


def _log_softmax_at(logits: npt.NDArray[np.float32], targets: npt.NDArray[np.int64]) -> npt.NDArray[np.float64]:
    x = logits.astype(np.float64)
    mx = x.max(axis=1, keepdims=True)
    lse = np.log(np.exp(x - mx).sum(axis=1)) + mx[:, 0]
    return x[np.arange(x.shape[0]), targets] - lse


def perplexity(llm: Any, tokens: list[int], n_ctx: int, bos_id: int | None, max_chunks: int = -1,
               progress: Any = None) -> tuple[float, float, int, list[float]]:
    """(ppl, stderr of ppl, scored tokens, running ppl after each chunk)."""
    n_chunks = len(tokens) // n_ctx
    if max_chunks >= 0:
        n_chunks = min(n_chunks, max_chunks)
    if n_chunks == 0:
        raise ValueError(f"the text has {len(tokens)} tokens, fewer than one chunk of {n_ctx} (-c)")
    first = n_ctx // 2
    nll: list[float] = []
    running = []
    for c in range(n_chunks):
        chunk = list(tokens[c * n_ctx:(c + 1) * n_ctx])
        if bos_id is not None:
            chunk[0] = bos_id
        llm.reset()
        logits = llm.eval(chunk, all_logits=True)
        targets = np.asarray(chunk[first + 1:], dtype=np.int64)
        lp = _log_softmax_at(logits[first:n_ctx - 1], targets)
        nll.extend((-lp).tolist())
        running.append(math.exp(sum(nll) / len(nll)))
        if progress:
            progress(c, running[-1])
    arr = np.asarray(nll)
    mean = float(arr.mean())
    # llama.cpp reports the uncertainty of exp(mean NLL) by error propagation
    err = float(arr.std(ddof=1) / math.sqrt(arr.size)) if arr.size > 1 else 0.0
    return math.exp(mean), math.exp(mean) * err, int(arr.size), running


def run(args: argparse.Namespace) -> int:
    path = Path(args.file)
    if not path.is_file():
        raise FileNotFoundError(f"text file not found: {path}")
    text = path.read_text(encoding="utf-8", errors="replace")
    llm = load(args)
    with llm:
        n_ctx = llm.n_ctx
        t0 = time.perf_counter()
        # no BOS in front of the text: each chunk's first token is replaced by BOS instead (the
        # method of the llama.cpp reference figures), so chunks cut the text at the same places
        toks = llm.tokenizer.encode(text, add_special=False)
        bos = args.bos_id if args.bos_id is not None else llm.tokenizer.bos_id
        n_chunks = len(toks) // n_ctx if args.chunks < 0 else min(args.chunks, len(toks) // n_ctx)
        print(f"edgellama: tokenized {len(toks)} tokens in {(time.perf_counter() - t0) * 1000:.0f} ms; "
              f"{n_chunks} chunks of {n_ctx}", file=sys.stderr)

        def progress(c: int, ppl: float) -> None:
            sys.stdout.write(f"[{c + 1}]{ppl:.4f},")
            sys.stdout.flush()

        t1 = time.perf_counter()
        ppl, err, n, _ = perplexity(llm, toks, n_ctx, bos, args.chunks, progress)
        dt = time.perf_counter() - t1
        print(f"\nFinal estimate: PPL = {ppl:.4f} +/- {err:.5f}  ({n} tokens scored, {dt:.1f} s, "
              f"{n_chunks * n_ctx / dt:.1f} tokens/s)")
    return 0

"""Perplexity by llama.cpp's method: the text is cut into chunks of n_ctx tokens, the first token of each
chunk is replaced by BOS, and the second half of each chunk is scored. Used by `edgellama perplexity`."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import numpy.typing as npt


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

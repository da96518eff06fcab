"""Token log-probabilities as llama-server reports them (`n_probs`, OpenAI's `logprobs`): the log-softmax of
the model's logits at the step a token was drawn (before the sampling chain: logit_bias, penalties, top-k,
temperature leave it unchanged), the drawn token's and the `n` most likely ones'; or, with llama-server's
`post_sampling_probs`, the probabilities of the candidates the chain drew from. And their shapes:
llama-server's `completion_probabilities`, OpenAI's chat and completions `logprobs`, llama-cpp-python's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

MAX_TOP = 20  # OpenAI's top_logprobs bound


def check_top(name: str, n: Any) -> int:
    """How many of the most likely tokens a request asks for (llama-server's n_probs, OpenAI's top_logprobs
    and completions' logprobs, the Python API's logprobs / top_logprobs): an integer in 0..MAX_TOP, or a
    ValueError naming the field as the door spells it. One rule and one message on every door."""
    if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= MAX_TOP:
        raise ValueError(f"'{name}' must be an integer in 0..{MAX_TOP}")
    return n


class Pieces(Protocol):
    def token_bytes(self, tid: int) -> bytes: ...


@dataclass(frozen=True)
class TokenProbs:
    id: int
    logprob: float  # post_sampling: a probability
    top: tuple[tuple[int, float], ...]  # the n most likely tokens, most likely first
    post_sampling: bool = False


def token_probs(logits: npt.NDArray[np.float32], token: int, n: int) -> TokenProbs:
    """log-softmax of logits (in float64) at token, and the n most likely tokens (ties: the lower id first)."""
    x = np.asarray(logits, dtype=np.float64)
    m = float(x.max())
    lse = m + float(np.log(np.exp(x - m).sum()))
    top: tuple[tuple[int, float], ...] = ()
    if n > 0:
        k = min(n, x.size)
        idx = np.argpartition(-x, k - 1)[:k]
        idx = idx[np.lexsort((idx, -x[idx]))]
        top = tuple((int(i), float(x[i]) - lse) for i in idx)
    return TokenProbs(int(token), float(x[token]) - lse, top)


def drawn_probs(ids: npt.NDArray[np.int64], probs: npt.NDArray[np.float64], token: int, n: int) -> TokenProbs:
    """llama-server's post_sampling_probs: the drawn token's probability among the candidates the sampling
    chain left (0 if it is not one: a grammar's fallback), and the n most probable of them, zeros left out."""
    order = np.argsort(-probs, kind="stable")
    where = np.flatnonzero(ids == token)
    top = tuple((int(ids[i]), float(probs[i])) for i in order[:n] if probs[i] > 0.0)
    return TokenProbs(int(token), float(probs[where[0]]) if where.size else 0.0, top, post_sampling=True)


def piece(tok: Pieces, tid: int) -> tuple[str, list[int]]:
    """A token's text (its bytes as UTF-8, a partial character replaced) and its bytes."""
    b = tok.token_bytes(tid)
    return b.decode("utf-8", "replace"), list(b)


def llama_entry(tok: Pieces, p: TokenProbs) -> dict[str, Any]:
    """One item of llama-server's `completion_probabilities` (also protocol v1's `probs`); post-sampling
    probabilities under llama-server's names for them (`prob`, `top_probs`)."""
    key, tops = ("prob", "top_probs") if p.post_sampling else ("logprob", "top_logprobs")
    text, raw = piece(tok, p.id)
    top = []
    for tid, lp in p.top:
        t, b = piece(tok, tid)
        top.append({"id": tid, "token": t, "bytes": b, key: lp})
    return {"id": p.id, "token": text, "bytes": raw, key: p.logprob, tops: top}


def openai_chat_content(entries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """llama-server's items -> OpenAI chat's `logprobs.content` items."""
    return [{"token": e["token"], "logprob": e["logprob"], "bytes": e["bytes"],
             "top_logprobs": [{"token": t["token"], "logprob": t["logprob"], "bytes": t["bytes"]}
                              for t in e["top_logprobs"]]} for e in entries]


def openai_completion_logprobs(entries: list[dict[str, Any]], offset0: int = 0) -> dict[str, Any]:
    """llama-server's items -> OpenAI completions' (and llama-cpp-python's) `logprobs`: tokens,
    token_logprobs, top_logprobs ({token: logprob}), text_offset (each token's start in the text)."""
    offsets, at = [], offset0
    for e in entries:
        offsets.append(at)
        at += len(e["token"])
    return {"tokens": [e["token"] for e in entries], "token_logprobs": [e["logprob"] for e in entries],
            "top_logprobs": [None if e["top_logprobs"] is None else {t["token"]: t["logprob"] for t in e["top_logprobs"]}
                             for e in entries],
            "text_offset": offsets}

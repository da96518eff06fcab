"""Embeddings: token lists in, one vector per text out (or one per token), pooled from the engine's
hidden states as llama.cpp pools them, normalized as llama.cpp's --embd-normalize does.

Many texts go through the engine together: each text is a sequence of its own (cleared before use),
and texts are packed into one forward pass until the batch or the sequences run out, so the weights are
read once per pass, not once per text. An encoder (non-causal) takes each text whole in one pass.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

# llama.cpp's pooling types (--pooling); "rank" needs a classification head (rerankers)
POOLINGS = ("none", "mean", "cls", "last", "rank")


class EmbeddingError(ValueError):
    """A text that cannot be embedded (a token outside the vocabulary, no tokens), or a setting that cannot
    be used."""


class TextTooLong(EmbeddingError):
    """A text longer than the context (the service's `context` error)."""


def check_token_ids(texts: Sequence[Sequence[int]], n_vocab: int) -> None:
    """Refuses, naming the input, a token id outside the vocabulary (inputs given as token lists)."""
    for i, t in enumerate(texts):
        if any(not 0 <= tok < n_vocab for tok in t):
            raise EmbeddingError(f"input {i}: a token id outside 0..{n_vocab - 1}")


def resolve_pooling(requested: str | None, file_pooling: str, has_head: bool = False) -> str:
    """The pooling a run uses: the one asked for, else the file's ({arch}.pooling_type), else none
    (llama.cpp's rule: a model without the key gives one vector per token)."""
    if requested is not None and requested not in POOLINGS:
        raise EmbeddingError(f"pooling {requested!r} is not one of {', '.join(POOLINGS)}")
    pooling = requested or (file_pooling if file_pooling in POOLINGS else "none")
    if pooling == "rank" and not has_head:
        raise EmbeddingError("pooling 'rank' needs a reranking model's classification head (cls.weight or "
                             "cls.output.weight), which this model does not have")
    return pooling


class RankScorer:
    """A reranker's classification head (wiring.RankHead) in float32, applied as llama.cpp's rank pooling
    does to the pooled state x: y = tanh(W x + b) if the head has cls.weight, then out_W y + out_b: one score
    per output label. Small (n_embd^2 at most per text): numpy, not the engine."""

    def __init__(self, head: Any) -> None:
        from edgellama.native.kernels import dequantize

        def mat(t: Any) -> npt.NDArray[np.float32] | None:
            return None if t is None else dequantize(t.data, t.ggml_type, t.ne0 * t.ne1).reshape(t.ne1, t.ne0)

        def vec(t: Any) -> npt.NDArray[np.float32] | None:
            return None if t is None else np.frombuffer(t.data, dtype=np.float32).copy()

        self.w, self.b, self.out_w, self.out_b = mat(head.w), vec(head.b), mat(head.out_w), vec(head.out_b)
        self.labels: list[str] = list(head.labels)

    def __call__(self, x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        y = x.astype(np.float32)
        if self.w is not None:
            y = self.w @ y
            if self.b is not None:
                y = y + self.b
            y = np.tanh(y)
        if self.out_w is not None:
            y = self.out_w @ y
            if self.out_b is not None:
                y = y + self.out_b
        return y.astype(np.float32)


def rerank_tokens(tok: Any, query: str, doc: str) -> list[int]:
    """A query and a document as one reranker input, as llama-server's format_prompt_rerank builds it
    without a rerank template: BOS if the model adds one, the query, EOS (or SEP when there is no EOS) if
    it adds one, SEP if it adds one, the document, EOS again."""
    q = tok.encode(query, add_special=False, parse_special=False)
    d = tok.encode(doc, add_special=False, parse_special=False)
    eos = tok.eos_id if tok.eos_id is not None else getattr(tok, "sep_id", None)
    out: list[int] = []
    if tok.add_bos and tok.bos_id is not None:
        out.append(tok.bos_id)
    out += q
    if tok.add_eos and eos is not None:
        out.append(eos)
    if getattr(tok, "add_sep", False) and getattr(tok, "sep_id", None) is not None:
        out.append(tok.sep_id)
    out += d
    if tok.add_eos and eos is not None:
        out.append(eos)
    return out


def normalize(v: npt.NDArray[np.float32], embd_normalize: int) -> npt.NDArray[np.float32]:
    """Rows of v scaled as llama.cpp's common_embd_normalize: -1 none, 0 max-abs to the int16 range
    (the largest |x| becomes 32760), 1 taxicab, 2 euclidean, p > 2 the p-norm; sums in double, a zero
    norm gives zeros."""
    if embd_normalize < -1:
        raise EmbeddingError(f"--embd-normalize {embd_normalize}: -1 none, 0 max absolute, 1 taxicab, "
                             f"2 euclidean, > 2 p-norm")
    x = v.astype(np.float64)
    if embd_normalize == -1:
        return v.copy()
    if embd_normalize == 0:
        s = np.abs(x).max(axis=-1, keepdims=True) / 32760.0
    elif embd_normalize == 2:
        s = np.sqrt((x * x).sum(axis=-1, keepdims=True))
    else:
        p = float(embd_normalize)
        s = (np.abs(x) ** p).sum(axis=-1, keepdims=True) ** (1.0 / p)
    scale = np.where(s > 0.0, 1.0 / np.where(s > 0.0, s, 1.0), 0.0).astype(np.float32)
    return (v * scale).astype(np.float32)


class Embedder:
    """Pooled embeddings from an engine's sequences (edgellama.native.engine.Engine: decode_embd,
    seq_clear). Uses sequences 0..n_seq-1 and leaves them cleared."""

    def __init__(self, engine: Any, n_ctx: int, n_batch: int, n_seq: int, pooling: str, non_causal: bool,
                 scorer: RankScorer | None = None) -> None:
        self.engine = engine
        self.n_ctx, self.n_batch, self.n_seq = n_ctx, n_batch, n_seq
        self.pooling = pooling
        self.non_causal = non_causal
        self.scorer = scorer  # pooling rank: the classification head

    @property
    def max_tokens(self) -> int:
        """The longest text: the context (an encoder's must also fit one batch)."""
        return min(self.n_ctx, self.n_batch) if self.non_causal else self.n_ctx

    def check_length(self, i: int, n: int) -> None:
        if n == 0:
            raise EmbeddingError(f"text {i} has no tokens")
        if n > self.max_tokens:
            raise TextTooLong(f"text {i} is {n} tokens, longer than the context of {self.max_tokens} tokens "
                                 f"(-c); shorten it or split it (--embd-separator)")

    def embed(self, texts: Sequence[Sequence[int]]) -> list[npt.NDArray[np.float32]]:
        """One array per text: n_embd floats (mean, cls, last) or n_tokens x n_embd (none)."""
        for i, t in enumerate(texts):
            self.check_length(i, len(t))
        out: list[npt.NDArray[np.float32] | None] = [None] * len(texts)
        # llama.cpp's numerics are exact per sequence: one text per pass there
        per_pass = self.n_seq if getattr(self.engine, "numerics", "native") == "native" else 1
        group: list[int] = []
        used = 0
        for i, t in enumerate(texts):
            if group and (used + len(t) > self.n_batch or len(group) == per_pass):
                self._run(texts, group, out)
                group, used = [], 0
            group.append(i)
            used += len(t)
        if group:
            self._run(texts, group, out)
        return [v for v in out if v is not None]

    def _wanted(self, n: int) -> list[bool]:
        # rank: the first token's state (llama.cpp: the last one's in a causal model)
        if self.pooling == "cls" or self.pooling == "rank" and self.non_causal:
            return [j == 0 for j in range(n)]
        if self.pooling in ("last", "rank"):
            return [j == n - 1 for j in range(n)]
        return [True] * n

    def _run(self, texts: Sequence[Sequence[int]], group: list[int], out: list[Any]) -> None:
        """The texts of group, text k in sequence k: one pass when they fit the batch, else (a causal
        model's text longer than a batch) that text alone in consecutive passes."""
        for s in range(len(group)):
            self.engine.seq_clear(s)
        try:
            if len(group) == 1 and len(texts[group[0]]) > self.n_batch:
                toks = list(texts[group[0]])
                parts = []
                wanted = self._wanted(len(toks))
                for p0 in range(0, len(toks), self.n_batch):
                    chunk = toks[p0:p0 + self.n_batch]
                    w = wanted[p0:p0 + len(chunk)]
                    if any(w):
                        parts.append(self.engine.decode_embd([0] * len(chunk), chunk,
                                                             list(range(p0, p0 + len(chunk))), w))
                    else:
                        self.engine.decode([0] * len(chunk), chunk, list(range(p0, p0 + len(chunk))), w)
                out[group[0]] = self._pool(np.concatenate(parts), len(toks))
                return
            seqs: list[int] = []
            tokens: list[int] = []
            pos: list[int] = []
            want: list[bool] = []
            for s, i in enumerate(group):
                n = len(texts[i])
                seqs += [s] * n
                tokens += list(texts[i])
                pos += range(n)
                want += self._wanted(n)
            rows = self.engine.decode_embd(seqs, tokens, pos, want)
            at = 0
            for i in group:
                n = len(texts[i])
                k = n if self.pooling in ("none", "mean") else 1
                out[i] = self._pool(rows[at:at + k], n)
                at += k
        finally:
            for s in range(len(group)):
                self.engine.seq_clear(s)

    def _pool(self, rows: npt.NDArray[np.float32], n: int) -> npt.NDArray[np.float32]:
        if self.pooling == "none":
            return rows.copy()
        if self.pooling == "mean":  # llama.cpp: the rows times 1/n, summed
            return (rows.astype(np.float64).sum(axis=0) * (1.0 / n)).astype(np.float32)
        if self.pooling == "rank":
            assert self.scorer is not None
            return self.scorer(rows[0])
        return rows[0].copy()


def cosine(a: npt.NDArray[np.float32], b: npt.NDArray[np.float32]) -> float:
    """Cosine similarity of two vectors (llama.cpp's common_embd_similarity_cos; 0 for a zero vector)."""
    na, nb = math.sqrt(float(np.dot(a, a))), math.sqrt(float(np.dot(b, b)))
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return float(np.dot(a.astype(np.float64), b.astype(np.float64)) / (na * nb))

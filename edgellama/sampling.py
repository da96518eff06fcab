"""Token sampling from logits, with llama.cpp's samplers and chain order:
repetition penalty -> top-k -> top-p -> min-p -> temperature -> draw (or mirostat v2, or greedy).

Works on a small candidate set after top-k so a 262k vocabulary costs one argpartition per token.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import replace
from typing import Any

import numpy as np
import numpy.typing as npt

from edgellama import params as R
from edgellama.params import GenParams

# the low-level API's names for three of the request parameters (llama-cli's flags without dashes)
_ALIASES = {"temp": "temperature", "mirostat_lr": "mirostat_eta", "mirostat_ent": "mirostat_tau"}


def SamplerParams(**fields: Any) -> GenParams:  # the name scripts and the low-level API use
    """Request parameters (edgellama.params.GenParams: one definition of every field and default) under the
    sampler's argument names: temp, top_k, top_p, min_p, repeat_penalty, repeat_last_n, mirostat,
    mirostat_lr (eta), mirostat_ent (tau), seed."""
    return GenParams(**{_ALIASES.get(k, k): v for k, v in fields.items()})


def _softmax(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    e = np.exp(x - x.max())
    return e / e.sum()


class Sampler:
    """Stateful sampler: remembers recent tokens (penalties) and mirostat's mu."""

    def __init__(self, params: GenParams, n_ctx: int = 4096) -> None:
        self.p = R.check(replace(params), R.PYTHON)  # the request-parameter table's rules, on a copy
        last_n = n_ctx if self.p.repeat_last_n == -1 else self.p.repeat_last_n
        self.history: deque[int] = deque(maxlen=max(last_n, 0) or 1)
        self._use_history = last_n > 0
        self.rng = np.random.default_rng(self.p.seed)  # None: random
        self.mu = 2.0 * self.p.mirostat_tau
        self.keep_draw = False  # set: last_draw holds each draw's candidates and probabilities
        self.last_draw: tuple[npt.NDArray[np.int64], npt.NDArray[np.float64]] | None = None

    def accept(self, token: int) -> None:
        if self._use_history:
            self.history.append(int(token))

    def reset(self) -> None:
        self.history.clear()
        self.mu = 2.0 * self.p.mirostat_tau

    def _penalize(self, logits: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
        if self.p.repeat_penalty == 1.0 or not self.history:
            return logits
        ids = np.fromiter(set(self.history), dtype=np.int64)
        ids = ids[(ids >= 0) & (ids < logits.size)]
        out = logits.copy()
        v = out[ids]
        out[ids] = np.where(v > 0, v / self.p.repeat_penalty, v * self.p.repeat_penalty)
        return out

    def sample(self, logits: npt.NDArray[np.float32]) -> int:
        p = self.p
        logits = self._penalize(logits)
        if p.temperature <= 0.0 and not p.mirostat:
            tok = int(np.argmax(logits))
            if self.keep_draw:  # llama.cpp's temperature 0 keeps the top token alone: probability 1
                self.last_draw = (np.array([tok], dtype=np.int64), np.ones(1))
            return tok
        if p.mirostat == 2:
            return self._mirostat_v2(logits)
        # top-k (0 = all), candidates sorted by descending logit
        n = logits.size
        k = p.top_k if 0 < p.top_k < n else n
        if k < n:
            idx = np.argpartition(logits, n - k)[n - k:]
        else:
            idx = np.arange(n)
        idx = idx[np.argsort(-logits[idx], kind="stable")]
        cand = logits[idx].astype(np.float64)
        if p.top_p < 1.0:
            probs = _softmax(cand)
            cum = np.cumsum(probs)
            keep = int(np.searchsorted(cum, p.top_p) + 1)
            idx, cand = idx[:keep], cand[:keep]
        if p.min_p > 0.0 and cand.size > 1:
            keep_mask = cand >= cand[0] + math.log(p.min_p)
            idx, cand = idx[keep_mask], cand[keep_mask]
        probs = _softmax(cand / max(p.temperature, 1e-8))
        if self.keep_draw:
            self.last_draw = (idx.astype(np.int64), probs)
        return int(idx[self.rng.choice(idx.size, p=probs)])

    def _mirostat_v2(self, logits: npt.NDArray[np.float32]) -> int:
        p = self.p
        x = logits.astype(np.float64) / max(p.temperature, 1e-8) if p.temperature > 0 else logits.astype(np.float64)
        probs = _softmax(x)
        order = np.argsort(-probs, kind="stable")
        sorted_p = probs[order]
        # keep tokens whose surprise -log2(p) is at most mu (always at least one)
        keep = max(1, int(np.sum(-np.log2(np.maximum(sorted_p, 1e-300)) <= self.mu)))
        cand = order[:keep]
        cp = sorted_p[:keep] / sorted_p[:keep].sum()
        if self.keep_draw:
            self.last_draw = (cand.astype(np.int64), cp)
        j = int(self.rng.choice(keep, p=cp))
        surprise = -math.log2(max(cp[j], 1e-300))
        self.mu -= p.mirostat_eta * (surprise - p.mirostat_tau)
        return int(cand[j])

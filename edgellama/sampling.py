"""Token sampling from logits, with llama.cpp's samplers and chain order:
repetition penalty -> top-k -> top-p -> min-p -> temperature -> draw (or mirostat v2, or greedy).

Works on a small candidate set after top-k so a 262k vocabulary costs one argpartition per token.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


@dataclass
class SamplerParams:
    temp: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    mirostat: int = 0
    mirostat_lr: float = 0.1  # eta
    mirostat_ent: float = 5.0  # tau
    seed: int | None = None

    def validate(self) -> None:
        """Refuses what the samplers cannot use by the request-parameter table's rules (edgellama.params),
        naming the attribute: NaN and infinities included (a NaN passes every `<` and `>` test)."""
        from edgellama import params as R

        for attr, name in (("temp", "temperature"), ("top_k", "top_k"), ("top_p", "top_p"), ("min_p", "min_p"),
                           ("repeat_penalty", "repeat_penalty"), ("repeat_last_n", "repeat_last_n"),
                           ("mirostat", "mirostat"), ("mirostat_lr", "mirostat_eta"),
                           ("mirostat_ent", "mirostat_tau"), ("seed", "seed")):
            f = R.BY_NAME[name]
            R.check_value(R.Field(f.name, f.kind, {R.PYTHON: attr}, f.lo, f.hi, f.lo_open, f.choices, f.hint),
                          getattr(self, attr), R.PYTHON)


def _softmax(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    e = np.exp(x - x.max())
    return e / e.sum()


class Sampler:
    """Stateful sampler: remembers recent tokens (penalties) and mirostat's mu."""

    def __init__(self, params: SamplerParams, n_ctx: int = 4096) -> None:
        params.validate()
        self.p = params
        last_n = n_ctx if params.repeat_last_n == -1 else params.repeat_last_n
        self.history: deque[int] = deque(maxlen=max(last_n, 0) or 1)
        self._use_history = last_n > 0
        self.rng = np.random.default_rng(None if params.seed == -1 else params.seed)
        self.mu = 2.0 * params.mirostat_ent

    def accept(self, token: int) -> None:
        if self._use_history:
            self.history.append(int(token))

    def reset(self) -> None:
        self.history.clear()
        self.mu = 2.0 * self.p.mirostat_ent

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
        if p.temp <= 0.0 and not p.mirostat:
            return int(np.argmax(logits))
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
        probs = _softmax(cand / max(p.temp, 1e-8))
        return int(idx[self.rng.choice(idx.size, p=probs)])

    def _mirostat_v2(self, logits: npt.NDArray[np.float32]) -> int:
        p = self.p
        x = logits.astype(np.float64) / max(p.temp, 1e-8) if p.temp > 0 else logits.astype(np.float64)
        probs = _softmax(x)
        order = np.argsort(-probs, kind="stable")
        sorted_p = probs[order]
        # keep tokens whose surprise -log2(p) is at most mu (always at least one)
        keep = max(1, int(np.sum(-np.log2(np.maximum(sorted_p, 1e-300)) <= self.mu)))
        cand = order[:keep]
        cp = sorted_p[:keep] / sorted_p[:keep].sum()
        j = int(self.rng.choice(keep, p=cp))
        surprise = -math.log2(max(cp[j], 1e-300))
        self.mu -= p.mirostat_lr * (surprise - p.mirostat_ent)
        return int(cand[j])

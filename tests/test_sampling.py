"""Samplers: llama.cpp's semantics for greedy, top-k, top-p, min-p, temperature, repetition penalty
and mirostat v2, on hand-made logits where the right answer is known."""

from __future__ import annotations

import math

import numpy as np
import pytest

from edgellama.sampling import Sampler, SamplerParams


def _draws(params: SamplerParams, logits: np.ndarray, n: int = 400) -> set[int]:
    s = Sampler(params)
    return {s.sample(logits) for _ in range(n)}


LOGITS = np.log(np.array([0.5, 0.25, 0.15, 0.06, 0.03, 0.01], dtype=np.float32))


def test_temperature_zero_is_argmax() -> None:
    assert _draws(SamplerParams(temp=0.0), LOGITS, 10) == {0}


def test_top_k_keeps_the_k_most_likely() -> None:
    assert _draws(SamplerParams(temp=1.0, top_k=2, top_p=1.0, min_p=0.0, seed=1), LOGITS) == {0, 1}


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    # cumulative 0.5, 0.75, 0.90: p = 0.8 needs three tokens
    assert _draws(SamplerParams(temp=1.0, top_k=0, top_p=0.8, min_p=0.0, seed=2), LOGITS) == {0, 1, 2}


def test_min_p_drops_tokens_below_a_fraction_of_the_best() -> None:
    # 0.5 * 0.2 = 0.1: tokens with p >= 0.1 survive
    assert _draws(SamplerParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.2, seed=3), LOGITS) == {0, 1, 2}


def test_seed_makes_sampling_reproducible_and_temperature_flattens() -> None:
    p = SamplerParams(temp=1.0, top_k=0, top_p=1.0, min_p=0.0, seed=42)
    a = [Sampler(p).sample(LOGITS) for _ in range(5)]
    s1, s2 = Sampler(p), Sampler(p)
    assert [s1.sample(LOGITS) for _ in range(50)] == [s2.sample(LOGITS) for _ in range(50)]
    assert len(set(a)) == 1  # a fresh sampler with one seed draws the same first token
    hot = Sampler(SamplerParams(temp=5.0, top_k=0, top_p=1.0, min_p=0.0, seed=0))
    cold = Sampler(SamplerParams(temp=0.2, top_k=0, top_p=1.0, min_p=0.0, seed=0))
    hot_rare = sum(hot.sample(LOGITS) >= 3 for _ in range(2000))
    cold_rare = sum(cold.sample(LOGITS) >= 3 for _ in range(2000))
    assert hot_rare > 10 * max(cold_rare, 1)


def test_repeat_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    s = Sampler(SamplerParams(temp=0.0, repeat_penalty=2.0, repeat_last_n=2))
    logits = np.array([3.0, 2.0, -1.0, 1.0], dtype=np.float32)
    s.accept(0)
    assert s.sample(logits) == 1  # 3 / 2 = 1.5 < 2
    s.accept(1)  # history [0, 1]: 1.5, 1.0, -1, 1 -> tie broken to the first: token 0
    out = s._penalize(logits)
    assert out.tolist() == [1.5, 1.0, -1.0, 1.0]
    s.accept(2)  # window of 2: token 0 leaves the history
    assert s._penalize(logits).tolist() == [3.0, 1.0, -2.0, 1.0]


def test_mirostat_v2_tracks_the_target_surprise() -> None:
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal(5000) * 3).astype(np.float32)
    s = Sampler(SamplerParams(mirostat=2, mirostat_ent=3.0, mirostat_lr=0.1, temp=1.0, seed=5))
    surprises = []
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    for _ in range(600):
        t = s.sample(logits)
        surprises.append(-math.log2(probs[t]))
    # the truncation keeps the observed surprise near tau (measured against the full distribution
    # it sits somewhat above tau after renormalisation; without mirostat it would be ~11 bits here)
    assert 2.0 < float(np.mean(surprises[100:])) < 5.0
    assert 0 < s.mu < 20


@pytest.mark.parametrize("bad", [{"top_p": 1.5}, {"min_p": -0.1}, {"top_k": -1}, {"mirostat": 1},
                                 {"repeat_penalty": 0.0}, {"repeat_last_n": -2}])
def test_bad_parameters_are_refused(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        Sampler(SamplerParams(**bad))  # type: ignore[arg-type]

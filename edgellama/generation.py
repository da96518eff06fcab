"""One request's generation, whoever drives it: its sampler (penalties, top-k/p, min-p, mirostat, grammar,
ignore-eos), stop strings (the request's and the chat format's stop pieces), streaming detokenization,
timings and stop reason. `run`, `LLM.generate` (and so the Python API) and every service slot use it.

It is fed logits and answers with the next token; it knows nothing of sockets, jobs, the KV cache or
which forward pass produced the logits. Text leaves through a callback, only as complete UTF-8.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from edgellama import params as R
from edgellama.params import GenParams
from edgellama.sampling import Sampler
from edgellama.tokenizers.tokenizer import StreamDecoder, Tokenizer

# Why a generation ended. eos: an end-of-generation token (or a grammar that is complete); stop: a stop
# string; length: the token limit; context: a full context that may not shift; cancelled: by the caller.
STOP_REASONS = ("eos", "stop", "length", "context", "cancelled")


class NonFiniteLogits(RuntimeError):
    """The model computed NaN or infinite logits: its weights (or the kernels) are broken, not the request."""


@dataclass
class Timings:
    load_ms: float = 0.0
    prompt_tokens: int = 0  # evaluated for this request (the cached prefix is not counted)
    prompt_ms: float = 0.0
    gen_tokens: int = 0
    gen_ms: float = 0.0

    @staticmethod
    def rate(n: int, ms: float) -> float:
        return n / (ms / 1000.0) if ms > 0 else 0.0

    def as_dict(self) -> dict[str, float]:
        return {
            "load_ms": round(self.load_ms, 2),
            "prompt_tokens": self.prompt_tokens,
            "prompt_ms": round(self.prompt_ms, 2),
            "prompt_tok_s": round(self.rate(self.prompt_tokens, self.prompt_ms), 2),
            "gen_tokens": self.gen_tokens,
            "gen_ms": round(self.gen_ms, 2),
            "gen_tok_s": round(self.rate(self.gen_tokens, self.gen_ms), 2),
        }


@dataclass
class Event:
    kind: str  # "token" or "done"
    token: int = -1
    text: str = ""
    stop_reason: str = ""
    timings: Timings = field(default_factory=Timings)
    probs: Any = None  # a token's logprobs.TokenProbs when the generation was asked for them


class StopStrings:
    """The one stop-string matcher: text is released only once no stop string can still begin in it,
    so a stop string is never half sent; the earliest stop string found wins."""

    def __init__(self, stops: Iterable[str]) -> None:
        self.stops = [s for s in stops if s]

    def split(self, text: str, final: bool) -> tuple[str, str, str | None]:
        """(text to send, text held back, the stop string found or None); final: nothing more comes."""
        if not self.stops:
            return text, "", None
        hits = [(i, s) for s in self.stops if (i := text.find(s)) >= 0]
        if hits:
            i, s = min(hits)
            return text[:i], "", s
        if final:
            return text, "", None
        keep = 0
        for s in self.stops:
            for k in range(min(len(s) - 1, len(text)), keep, -1):
                if text.endswith(s[:k]):
                    keep = k
                    break
        return text[:len(text) - keep], text[len(text) - keep:], None


class _NoEOS:
    """ignore_eos: end-of-generation tokens are never sampled (llama.cpp biases them to -inf)."""

    def __init__(self, inner: Any, eog: Iterable[int]) -> None:
        self.inner, self.eog = inner, np.fromiter(eog, dtype=np.int64)

    def accept(self, token: int) -> None:
        self.inner.accept(token)

    def sample(self, logits: npt.NDArray[np.float32]) -> int:
        masked = logits.copy()
        masked[self.eog[self.eog < masked.size]] = -np.inf
        return int(self.inner.sample(masked))


class _LogitBias:
    """logit_bias: added to the logits before llama.cpp's chain (its first sampler); -inf never drawn."""

    def __init__(self, inner: Any, ids: npt.NDArray[np.int64], bias: npt.NDArray[np.float32]) -> None:
        self.inner, self.ids, self.bias = inner, ids, bias

    def accept(self, token: int) -> None:
        self.inner.accept(token)

    def sample(self, logits: npt.NDArray[np.float32]) -> int:
        biased = logits.copy()
        np.add.at(biased, self.ids, self.bias)  # a token named twice gets both biases
        return int(self.inner.sample(biased))


def bias_arrays(params: GenParams, tokenizer: Tokenizer) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.float32]]:
    """The request's logit_bias as (token ids, biases): a text biases each of its tokens (llama-server's
    rule); a token id outside the vocabulary is a ParamError naming it."""
    ids: list[int] = []
    vals: list[float] = []
    for tok, bias in params.logit_bias:
        toks = tokenizer.encode(tok, add_special=False, parse_special=False) if isinstance(tok, str) else [tok]
        for t in toks:
            if not 0 <= t < tokenizer.n_vocab:
                raise R.ParamError("'logit_bias'", f"token id {t} is out of range for a vocabulary of "
                                   f"{tokenizer.n_vocab}", "logit_bias")
            ids.append(t)
            vals.append(bias)
    return np.array(ids, dtype=np.int64), np.array(vals, dtype=np.float32)


def build_sampler(params: GenParams, tokenizer: Tokenizer, n_ctx: int) -> Any:
    """The one place a sampler is built from request parameters: logit_bias, llama.cpp's chain, then
    ignore-eos, then the grammar (outermost, so its mask sees what the chain would draw)."""
    sampler: Any = Sampler(params, n_ctx)
    if params.logit_bias:
        sampler = _LogitBias(sampler, *bias_arrays(params, tokenizer))
    if params.ignore_eos:
        sampler = _NoEOS(sampler, tokenizer.eot_ids)
    if params.constraint is not None:
        from edgellama.grammar import constrain

        sampler = constrain(sampler, params.constraint, tokenizer)
    return sampler


def _base_sampler(sampler: Any) -> Any:
    """llama.cpp's chain under a request's wrappers (logit_bias, ignore-eos, grammar): the one that draws."""
    while hasattr(sampler, "inner"):
        sampler = sampler.inner
    return sampler if hasattr(sampler, "keep_draw") else None


def effective_n_predict(requested: int, limit: int | None) -> int:
    """A request's token limit under a front end's cap (limit None: none; requested -1: the cap)."""
    if limit is None:
        return requested
    return limit if requested < 0 else min(requested, limit)


class Generation:
    """One request: step(logits) -> the token to evaluate next, or None once it has ended (stop_reason
    says why). emit(text, token) is called for each sampled token that is not an end-of-generation token,
    with the text it releases (may be ""); finish() releases what was held back."""

    def __init__(self, tokenizer: Tokenizer, prompt: Sequence[int], sampler: Any, *, n_predict: int = -1,
                 stops: Iterable[str] = (), eog: Iterable[int] | None = None, keep_stop: bool = False,
                 emit: Callable[[str, int], None] | None = None, model: str = "the model",
                 n_cached: int = 0, load_ms: float = 0.0, n_probs: int = -1, post_sampling: bool = False,
                 t_start: float | None = None) -> None:
        """n_probs >= 0: each sampled token's log-probability (and the n_probs most likely tokens') is in
        last_probs when emit is called for it (edgellama.logprobs); post_sampling: the probabilities of the
        candidates the sampling chain drew it from instead (llama-server's post_sampling_probs)."""
        self.tokenizer = tokenizer
        self.sampler = sampler
        self.n_predict = n_predict
        self.stops = StopStrings(stops)
        self.keep_stop = keep_stop  # the stop string is part of the text sent (llama-cli's reverse prompts)
        self.eog = set(tokenizer.eot_ids if eog is None else eog)
        self.emit = emit
        self.model = model
        self.n_probs = n_probs
        self.draws = _base_sampler(sampler) if post_sampling and n_probs >= 0 else None
        if self.draws is not None:
            self.draws.keep_draw = True
        self.last_probs: Any = None
        self.dec = StreamDecoder(tokenizer)
        self.held = ""  # decoded text that could still become a stop string
        self.stop_hit: str | None = None
        self.stop_reason: str | None = None
        self.n_predicted = 0
        self.text: list[str] = []  # everything released
        self.timings = Timings(load_ms=load_ms, prompt_tokens=len(prompt) - n_cached)
        self.n_prompt = len(prompt)
        self.t_start = time.perf_counter() if t_start is None else t_start  # the one clock: time.perf_counter()
        self.t_prompt_done = 0.0
        self.t_first_token = 0.0
        accept_prompt = getattr(sampler, "accept_prompt", sampler.accept)  # a grammar starts at the output
        for t in prompt:
            accept_prompt(t)

    @property
    def done(self) -> bool:
        return self.stop_reason is not None

    def prompt_done(self) -> None:
        """The prompt's logits are ready (the first step calls it if the driver did not)."""
        if self.t_prompt_done == 0.0:
            self.t_prompt_done = time.perf_counter()

    def step(self, logits: npt.NDArray[np.float32]) -> int | None:
        if self.stop_reason is not None:
            return None
        self.prompt_done()
        if self.n_predict >= 0 and self.n_predicted >= self.n_predict:
            return self._end("length")
        # one reduction per token (a NaN anywhere makes the max NaN); the sampler would pick garbage
        top = float(np.max(logits))
        if not math.isfinite(top):
            raise NonFiniteLogits(f"{self.model} computed non-finite logits ({top}): its weights are damaged "
                                  "or hold NaN/inf values")
        tok = int(self.sampler.sample(logits))
        if self.draws is not None and self.draws.last_draw is not None:
            from edgellama.logprobs import drawn_probs

            ids, probs = self.draws.last_draw
            self.last_probs = drawn_probs(ids, probs, tok, self.n_probs)
        elif self.n_probs >= 0:
            from edgellama.logprobs import token_probs

            self.last_probs = token_probs(logits, tok, self.n_probs)
        self.sampler.accept(tok)
        self.n_predicted += 1
        if self.n_predicted == 1:
            self.t_first_token = time.perf_counter()
        if tok in self.eog:
            return self._end("eos")
        out, self.held, hit = self.stops.split(self.held + self.dec.push(tok), final=False)
        if hit is not None:
            self.stop_hit = hit
            out += hit if self.keep_stop else ""
        self._send(out, tok)
        if hit is not None:
            return self._end("stop")
        if getattr(self.sampler, "finished", False):  # a grammar is complete: nothing more may follow
            return self._end("eos")
        if self.n_predict >= 0 and self.n_predicted >= self.n_predict:
            return self._end("length")
        return tok

    def finish(self, reason: str | None = None) -> str:
        """Ends the generation (reason: the driver's, e.g. context or cancelled, unless it had already
        ended) and returns the text still held back: never an incomplete UTF-8 character, which is dropped
        (a token limit can cut a character in two; it is never sent as U+FFFD)."""
        if self.stop_reason is None:
            self._end(reason or "length")
        tail, self.held = self.held, ""
        self.dec = StreamDecoder(self.tokenizer)  # its unfinished bytes are dropped
        if tail:
            self.text.append(tail)
        return tail

    def _end(self, reason: str) -> int | None:
        """Records why and when the generation ended; None (step's answer: no token to evaluate)."""
        self.stop_reason = reason
        t = time.perf_counter()
        if self.t_prompt_done == 0.0:
            self.t_prompt_done = t
        self.timings.prompt_ms = (self.t_prompt_done - self.t_start) * 1000.0
        self.timings.gen_tokens = self.n_predicted
        self.timings.gen_ms = (t - self.t_prompt_done) * 1000.0
        return None

    def _send(self, out: str, tok: int) -> None:
        if out:
            self.text.append(out)
        if self.emit is not None:
            self.emit(out, tok)

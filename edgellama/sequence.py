"""One sequence of the engine's KV cache and the tokens it holds: the single owner of a sequence's
positions, used by the single-sequence LLM (sequence 0) and by every slot alike. Prefix reuse (keep
what a new prompt shares with the cache), the context shift (--keep, drop the oldest half) and the
bookkeeping of what is cached live here and nowhere else.

It never evaluates tokens itself: the caller runs the forward pass and then records what it appended.
"""

from __future__ import annotations

from typing import Any

from edgellama.native.lib import KernelError


class ContextFull(ValueError):
    """The tokens to evaluate do not fit the context window (no context shift, or --keep leaves no room)."""


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens a and b share (what a cache holding a can reuse for b)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


class KVSequence:
    """Sequence `index` of engine: tokens[i] is the token cached at position i."""

    def __init__(self, engine: Any, index: int, n_ctx: int, n_keep: int = 0, context_shift: bool = True) -> None:
        self.engine = engine
        self.index = index
        self.n_ctx = n_ctx
        self.n_keep = n_keep
        self.context_shift = context_shift
        self.tokens: list[int] = []
        self.n_shifts = 0

    def __len__(self) -> int:
        return len(self.tokens)

    def clear(self) -> None:
        self.engine.seq_clear(self.index)
        self.tokens = []

    def reuse(self, prompt: list[int]) -> int:
        """Keeps the longest cached prefix of prompt, leaving at least one prompt token to evaluate (its
        logits are needed); returns how many tokens are reused. The prompt must fit the context."""
        if not prompt:
            raise ValueError("empty prompt")
        if len(prompt) > self.n_ctx:
            raise ContextFull(f"the prompt has {len(prompt)} tokens, more than the context of {self.n_ctx} (-c)")
        common = min(common_prefix(self.tokens, prompt), len(prompt) - 1)
        try:
            self.engine.seq_truncate(self.index, common)
            del self.tokens[common:]
        except KernelError:  # a windowed layer's ring no longer holds that far back: start over
            self.clear()
        return len(self.tokens)

    def load(self, tokens: list[int], state: bytes) -> None:
        """A saved sequence state (Engine.seq_state of any sequence) and the tokens it holds."""
        self.engine.seq_load_state(self.index, state)
        self.tokens = list(tokens)

    def make_room(self, n_new: int) -> None:
        """Context shift (streaming): when n_new more tokens do not fit, keep the first n_keep and drop
        the oldest of the rest (half of them, as llama.cpp does, so shifts stay rare)."""
        n_past = len(self.tokens)
        if n_past + n_new <= self.n_ctx:
            return
        if not self.context_shift:
            raise ContextFull(f"{n_past + n_new} tokens do not fit the context of {self.n_ctx} (-c)")
        n_discard = max((n_past - self.n_keep) // 2, n_past + n_new - self.n_ctx)
        if n_new > self.n_ctx - self.n_keep or self.n_keep + n_discard > n_past:
            raise ContextFull(f"{n_new} new tokens do not fit the context of {self.n_ctx} with --keep {self.n_keep}")
        self.engine.seq_shift(self.index, self.n_keep, n_discard)
        del self.tokens[self.n_keep:self.n_keep + n_discard]
        self.n_shifts += 1

    def appended(self, tokens: list[int]) -> None:
        """tokens were evaluated at the next positions."""
        self.tokens.extend(tokens)

    def full(self, n_pending: int = 0) -> bool:
        """No room for another token without a shift (n_pending: tokens about to be evaluated)."""
        return len(self.tokens) + n_pending >= self.n_ctx

    def must_end(self) -> bool:
        """The full-context rule of every generation (the single sequence's and each slot's): the context is
        full and may not shift (--no-context-shift), so the generation ends with stop reason `context`."""
        return self.full() and not self.context_shift

"""A sampler under a grammar: the inner sampler draws as usual; when its token is outside the grammar,
the logits of every refused token become -inf and it draws again (llama.cpp's order: the full mask
costs a vocabulary walk, the check of one token a few memo lookups)."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from edgellama.grammar.matcher import GrammarDeadEnd, GrammarMatcher, vocab_trie


class GrammarSampler:
    def __init__(self, inner: Any, matcher: GrammarMatcher) -> None:
        self.inner = inner
        self.matcher = matcher
        self.n_masked = 0  # steps that needed the full mask (for benchmarks and tests)

    @property
    def finished(self) -> bool:
        """The grammar is complete and nothing may follow: generation ends after the last token."""
        return self.matcher.done

    def accept_prompt(self, token: int) -> None:
        """A prompt token: the inner sampler's history only, the grammar starts at the output."""
        self.inner.accept(token)

    def accept(self, token: int) -> None:
        self.inner.accept(token)
        self.matcher.accept(token)

    def sample(self, logits: npt.NDArray[np.float32]) -> int:
        tok = int(self.inner.sample(logits))
        if self.matcher.allows(tok):
            return tok
        self.n_masked += 1
        mask = self.matcher.mask()
        if mask.size < logits.size:  # rows past the tokenizer's vocabulary are never allowed
            mask = np.concatenate([mask, np.zeros(logits.size - mask.size, dtype=bool)])
        if not mask[:logits.size].any():
            raise GrammarDeadEnd("no token of the vocabulary continues the output inside the grammar")
        masked = np.where(mask[:logits.size], logits, np.float32(-np.inf)).astype(np.float32, copy=False)
        tok = int(self.inner.sample(masked))
        if not mask[tok]:  # the inner sampler only picks finite logits unless all are -inf
            tok = int(np.argmax(masked))
        return tok


def grammar_sampler(inner: Any, grammar: Any, tokenizer: Any) -> GrammarSampler:
    """inner under grammar (a parser.Grammar) over tokenizer's vocabulary, its end tokens allowed once complete."""
    return GrammarSampler(inner, GrammarMatcher(grammar, vocab_trie(tokenizer), set(tokenizer.eot_ids)))

"""The grammar matcher over a model's vocabulary: which tokens may come next, and the state after a
token. The hot part is C (csrc/grammar.c): a byte trie of the vocabulary built once per tokenizer,
states memoized per grammar. Sampling checks the token the sampler chose first and computes the full
mask only when that token is refused (llama.cpp's order), so most steps cost one token's bytes."""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from edgellama.grammar.compile import flatten
from edgellama.grammar.parser import Grammar
from edgellama.native.lib import check, ffi, lib

if TYPE_CHECKING:
    from edgellama.tokenizers.tokenizer import Tokenizer

MASKS_KEPT = 8  # x n_vocab bytes: 2 MiB for Gemma 3
MEMO_LIMIT = 64 << 20  # bytes of remembered states and transitions before the memo is dropped
ACCEPTING, DONE = int(lib.EL_GRAM_ACCEPTING), int(lib.EL_GRAM_DONE)


class GrammarDeadEnd(ValueError):
    """No token of the vocabulary can continue the output inside the grammar."""


class VocabTrie:
    """Every token's bytes in a byte trie (C); control tokens (no bytes) are left out."""

    def __init__(self, token_bytes: list[bytes]) -> None:
        self.n_tokens = len(token_bytes)
        lens = np.fromiter((len(b) for b in token_bytes), dtype=np.int64, count=self.n_tokens)
        offsets = np.zeros(self.n_tokens + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        blob = b"".join(token_bytes) or b"\0"
        out = ffi.new("el_vocab_trie **")
        check(lib.el_vocab_trie_create(blob, ffi.from_buffer("int64_t[]", offsets), self.n_tokens, out),
              "vocabulary trie")
        self.ptr = ffi.gc(out[0], lib.el_vocab_trie_free)
        self.token_bytes = token_bytes

    @property
    def n_nodes(self) -> int:
        return int(lib.el_vocab_trie_nodes(self.ptr))


_TRIES: weakref.WeakKeyDictionary[Any, VocabTrie] = weakref.WeakKeyDictionary()


def vocab_trie(tokenizer: Tokenizer) -> VocabTrie:
    """The tokenizer's trie, built on first use and kept as long as the tokenizer lives."""
    trie = _TRIES.get(tokenizer)
    if trie is None:
        n = tokenizer.n_vocab
        trie = VocabTrie([tokenizer.token_bytes(i) for i in range(n)])
        _TRIES[tokenizer] = trie
    return trie


class CompiledGrammar:
    """A grammar in C with its memo of states; one per generation (the memo is not shared between threads)."""

    def __init__(self, grammar: Grammar) -> None:
        self.grammar = grammar
        code, starts = flatten(grammar)
        out = ffi.new("el_grammar **")
        check(lib.el_grammar_create(ffi.from_buffer("int32_t[]", code), code.size,
                                    ffi.from_buffer("int32_t[]", starts), starts.size, grammar.root, out),
              "grammar")
        self.ptr = ffi.gc(out[0], lib.el_grammar_free)
        start = int(lib.el_grammar_start(self.ptr))
        if start < 0:
            check(start, "grammar start")
        self.start = start

    def step(self, state: int, data: bytes) -> int:
        """The state after data, or -1 when data leaves the grammar."""
        s = int(lib.el_grammar_step(self.ptr, state, data, len(data)))
        if s < -1:
            check(s, "grammar step")
        return s

    def flags(self, state: int) -> int:
        return int(lib.el_grammar_state_flags(self.ptr, state))

    def compact(self, state: int) -> int:
        if lib.el_grammar_memo_bytes(self.ptr) <= MEMO_LIMIT:
            return state
        s = int(lib.el_grammar_compact(self.ptr, state))
        if s < 0:
            check(s, "grammar memo")
        return s


class GrammarMatcher:
    """The grammar's position in one generation: allowed tokens, accept a token, accepting / done."""

    def __init__(self, grammar: Grammar, trie: VocabTrie, eog_ids: set[int]) -> None:
        self.g = CompiledGrammar(grammar)
        self.trie = trie
        self.eog = np.fromiter(sorted(t for t in eog_ids if 0 <= t < trie.n_tokens), dtype=np.int64)
        self.eog_set = {int(t) for t in self.eog}
        self.state = self.g.start
        self.ended = False  # an end-of-generation token was accepted
        self._mask = np.zeros(trie.n_tokens, dtype=np.uint8)
        # the last masks by state: a JSON string or a list item comes back to the same state again and again
        self._masks: OrderedDict[int, npt.NDArray[np.bool_]] = OrderedDict()

    @property
    def accepting(self) -> bool:
        """The output so far is a complete sentence of the grammar (an end token may come)."""
        return bool(self.g.flags(self.state) & ACCEPTING)

    @property
    def done(self) -> bool:
        """Complete, and nothing more may follow: generation should end here."""
        return self.ended or bool(self.g.flags(self.state) & DONE)

    def allows(self, token: int) -> bool:
        if token in self.eog_set:
            return self.accepting
        if not 0 <= token < self.trie.n_tokens:
            return False
        data = self.trie.token_bytes[token]
        return bool(data) and self.g.step(self.state, data) >= 0

    def accept(self, token: int) -> None:
        if token in self.eog_set:
            if not self.accepting:
                raise ValueError(f"token {token} (end of generation) is not allowed before the grammar is complete")
            self.ended = True
            return
        data = self.trie.token_bytes[token] if 0 <= token < self.trie.n_tokens else b""
        s = self.g.step(self.state, data) if data else -1
        if s < 0:
            raise ValueError(f"token {token} ({data!r}) does not continue the grammar")
        state = self.g.compact(s)
        if state != s:  # the memo was dropped: state ids were renumbered
            self._masks.clear()
        self.state = state

    def mask(self) -> npt.NDArray[np.bool_]:
        """Allowed tokens as a boolean array over the vocabulary (do not modify it: it is cached)."""
        m = self._masks.get(self.state)
        if m is not None:
            self._masks.move_to_end(self.state)
            return m
        check(lib.el_grammar_allowed(self.g.ptr, self.trie.ptr, self.state, ffi.from_buffer(self._mask),
                                     self._mask.size), "grammar mask")
        m = self._mask.astype(bool)
        if self.eog.size:
            m[self.eog] = self.accepting
        self._masks[self.state] = m
        if len(self._masks) > MASKS_KEPT:
            self._masks.popitem(last=False)
        return m

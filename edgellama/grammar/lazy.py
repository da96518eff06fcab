"""A grammar that holds from a trigger on (llama.cpp's lazy grammars, for tool calls under tool_choice auto):
the output is free until one of the trigger texts appears in it (or, for a format whose calls are bare JSON,
until the output opens with `{`); from the trigger's first byte on, the grammar (which starts with the
trigger) constrains every token, so a call that begins always parses."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from edgellama.grammar.parser import Grammar


@dataclass(frozen=True)
class LazyGrammar:
    grammar: Grammar  # the whole call, trigger included
    triggers: tuple[str, ...]  # texts that start it anywhere in the output
    json_start: bool = False  # also an output whose first non-space character is `{`


class LazyGrammarSampler:
    def __init__(self, inner: Any, lazy: LazyGrammar, tokenizer: Any) -> None:
        self.inner, self.lazy, self.tokenizer = inner, lazy, tokenizer
        self.triggers = [t.encode("utf-8") for t in lazy.triggers]
        self.out = bytearray()
        self.active: Any = None  # the GrammarSampler once triggered
        self.free = False  # the text after a trigger did not fit the grammar: left unconstrained

    @property
    def finished(self) -> bool:
        return bool(self.active is not None and self.active.finished)

    @property
    def n_masked(self) -> int:
        return int(self.active.n_masked) if self.active is not None else 0

    def accept_prompt(self, token: int) -> None:
        self.inner.accept(token)

    def accept(self, token: int) -> None:
        if self.active is not None:
            self.active.accept(token)
            return
        self.inner.accept(token)
        if self.free:
            return
        self.out += self.tokenizer.token_bytes(token)
        at = self._trigger()
        if at >= 0:
            self._activate(bytes(self.out[at:]))

    def _trigger(self) -> int:
        found = [i for i in (self.out.find(t) for t in self.triggers) if i >= 0]
        if self.lazy.json_start:
            text = bytes(self.out).lstrip()
            if text[:1] == b"{":
                found.append(len(self.out) - len(text))
        return min(found, default=-1)

    def _activate(self, head: bytes) -> None:
        from edgellama.grammar.sampler import grammar_sampler

        sampler = grammar_sampler(self.inner, self.lazy.grammar, self.tokenizer)
        m = sampler.matcher
        s = m.g.step(m.g.start, head)
        if s < 0:  # what the model wrote after the trigger is already outside the call's grammar
            self.free = True
            return
        m.state = m.g.compact(s)
        self.active = sampler

    def sample(self, logits: npt.NDArray[np.float32]) -> int:
        if self.active is not None:
            return int(self.active.sample(logits))
        return int(self.inner.sample(logits))

"""Sentences drawn at random from a parsed GBNF grammar (a random walk over its rules, steered towards the
shortest way out once deep), each confirmed by the C matcher: the property-based checks of the JSON-Schema
grammars draw from here."""

from __future__ import annotations

import random

from edgellama.grammar.matcher import ACCEPTING, CompiledGrammar
from edgellama.grammar.parser import Chars, Grammar, Ref

# what a negated class draws from: ASCII, JSON's troublesome characters, and a few multi-byte ones
POOL = [chr(c) for c in range(0x20, 0x7F)] + ["\t", "\n", "\x01", "é", "ß", "中", "😀", "\u2028"]


def _min_sizes(g: Grammar) -> list[float]:
    """The fewest characters each rule can produce (a fixpoint over the rules)."""
    inf = float("inf")
    size = [inf] * len(g.rules)
    changed = True
    while changed:
        changed = False
        for i, alts in enumerate(g.rules):
            best = min((sum(1 if isinstance(e, Chars) else size[e.rule] for e in alt) for alt in alts), default=inf)
            if best < size[i]:
                size[i], changed = best, True
    return size


class Sampler:
    def __init__(self, g: Grammar, seed: int) -> None:
        self.g = g
        self.rng = random.Random(seed)
        self.size = _min_sizes(g)
        self.compiled = CompiledGrammar(g)

    def char(self, c: Chars) -> str:
        if not c.negated:
            lo, hi = self.rng.choice(c.ranges)
            return chr(self.rng.randint(lo, min(hi, lo + 0x200)))
        options = [ch for ch in POOL if c.matches(ord(ch))]
        return self.rng.choice(options)

    def expand(self, rule: int, out: list[str], budget: int) -> None:
        alts = self.g.rules[rule]
        cost = [sum(1 if isinstance(e, Chars) else self.size[e.rule] for e in alt) for alt in alts]
        if budget <= 0:  # out of room: the shortest way out
            alt = alts[cost.index(min(cost))]
        else:
            alt = self.rng.choice([a for a, c in zip(alts, cost) if c != float("inf")])
        for e in alt:
            if isinstance(e, Chars):
                out.append(self.char(e))
            else:
                assert isinstance(e, Ref)
                self.expand(e.rule, out, budget - 1)

    def sentence(self, depth: int = 24) -> str:
        out: list[str] = []
        self.expand(self.g.root, out, depth)
        text = "".join(out)
        s = self.compiled.step(self.compiled.start, text.encode())
        assert s >= 0 and self.compiled.flags(s) & ACCEPTING, f"the matcher refuses a sentence of its grammar: {text!r}"
        return text

    def accepts(self, text: str) -> bool:
        s = self.compiled.step(self.compiled.start, text.encode())
        return s >= 0 and bool(self.compiled.flags(s) & ACCEPTING)

"""A parsed Grammar -> the flat (type, value) int32 code the C matcher reads (csrc/grammar.c, llama.cpp's
element layout): each rule's alternatives ended by ALT, the last by END."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from edgellama.grammar.parser import Chars, Grammar, Ref

END, ALT, RULE_REF, CHAR, CHAR_NOT, CHAR_RNG_UPPER, CHAR_ALT, CHAR_ANY = range(8)
NO_CODEPOINT = 0x110000  # `[]`: a set no character is in


def _chars(c: Chars, out: list[int]) -> None:
    if c.negated and not c.ranges:
        out += [CHAR_ANY, 0]
        return
    ranges = c.ranges or ((NO_CODEPOINT, NO_CODEPOINT),)
    for k, (lo, hi) in enumerate(ranges):
        out += [(CHAR_NOT if c.negated else CHAR) if k == 0 else CHAR_ALT, lo]
        if hi != lo:
            out += [CHAR_RNG_UPPER, hi]


def flatten(g: Grammar) -> tuple[npt.NDArray[np.int32], npt.NDArray[np.int32]]:
    """(code as int32 pairs, each rule's first pair index)."""
    code: list[int] = []
    starts: list[int] = []
    for alts in g.rules:
        starts.append(len(code) // 2)
        for k, alt in enumerate(alts):
            for e in alt:
                if isinstance(e, Ref):
                    code += [RULE_REF, e.rule]
                else:
                    _chars(e, code)
            code += [ALT if k + 1 < len(alts) else END, 0]
    return np.asarray(code, dtype=np.int32), np.asarray(starts, dtype=np.int32)

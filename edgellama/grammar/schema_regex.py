"""A JSON Schema `pattern` (an ECMA regex anchored ^...$) -> a GBNF expression over the string's characters
as they are written inside JSON quotes. Literals, classes, `.`, \\d \\w, groups (capturing or not),
alternation and the quantifiers * + ? {m,n}; anything else (lookarounds, backreferences, \\s, control
characters) raises SchemaError, which the converter reads as "unsupported" when the pattern is a valid regex.
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

from edgellama.grammar.gbnf_text import MAX_ITEMS_EXPANDED, SchemaError, literal


class Regex:
    """A JSON Schema `pattern` (ECMA regex, anchored ^...$) -> a GBNF expression over the string's
    characters as they appear inside JSON quotes (so `"` and `\\` are written escaped)."""

    # characters a JSON string holds raw: not `"`, not `\`, no control characters
    RAW_EXCLUDED = '"\\\\\\x00-\\x1F\\x7F'

    def __init__(self, pattern: Any, where: str) -> None:
        if not isinstance(pattern, str):
            raise SchemaError(f"{where}: pattern must be a string")
        if not (pattern.startswith("^") and pattern.endswith("$")) or pattern.endswith("\\$"):
            raise SchemaError(f"{where}: pattern {pattern!r} must be anchored: start with ^ and end with $")
        self.p = pattern[1:-1]
        self.i = 0
        self.where = where
        self.orig = pattern

    def fail(self, msg: str) -> SchemaError:
        return SchemaError(f"{self.where}: pattern {self.orig!r} at offset {self.i + 1}: {msg}")

    def convert(self) -> str:
        out = self.alternation()
        if self.i < len(self.p):
            raise self.fail(f"unexpected {self.p[self.i]!r}")
        return out

    def alternation(self) -> str:
        alts = [self.sequence()]
        while self.i < len(self.p) and self.p[self.i] == "|":
            self.i += 1
            alts.append(self.sequence())
        return " | ".join(a or '""' for a in alts)

    def sequence(self) -> str:
        parts: list[str] = []
        while self.i < len(self.p) and self.p[self.i] not in "|)":
            atom = self.atom()
            parts.append(self.quantifier(atom))
        return " ".join(parts)

    def quantifier(self, atom: str) -> str:
        if self.i >= len(self.p):
            return atom
        c = self.p[self.i]
        if c in "*+?":
            self.i += 1
            if self.i < len(self.p) and self.p[self.i] in "?+":
                raise self.fail("lazy and possessive quantifiers are not supported")
            return f"({atom}){c}"
        if c == "{":
            m = re.match(r"\{(\d+)(,(\d*))?\}", self.p[self.i:])
            if not m:
                raise self.fail("bad {m,n} quantifier")
            self.i += m.end()
            lo = int(m.group(1))
            hi = lo if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
            if hi is not None and hi < lo:
                raise self.fail("{m,n} with n < m")
            if max(lo, hi or 0) > MAX_ITEMS_EXPANDED:
                raise self.fail(f"repetition over {MAX_ITEMS_EXPANDED}")
            return f"({atom}){{{lo},{'' if hi is None else hi}}}" if hi != lo else f"({atom}){{{lo}}}"
        return atom

    def atom(self) -> str:
        c = self.p[self.i]
        if c == "(":
            self.i += 1
            if self.p.startswith("?:", self.i):
                self.i += 2
            elif self.p.startswith("?", self.i):
                raise self.fail("lookarounds and named groups are not supported")
            inner = self.alternation()
            if self.i >= len(self.p) or self.p[self.i] != ")":
                raise self.fail("missing ')'")
            self.i += 1
            return f"({inner or chr(34) * 2})"
        if c == "[":
            return self.char_class()
        if c == ".":
            self.i += 1
            return f"[^{self.RAW_EXCLUDED}\\n\\r]"
        if c in "^$":
            raise self.fail("anchors are supported only at the start and the end")
        if c in "*+?{":
            raise self.fail(f"{c!r} has nothing to repeat")
        if c == "\\":
            return self.escape(in_class=False)
        self.i += 1
        return self.char_literal(ord(c))

    @staticmethod
    def char_literal(cp: int) -> str:
        """The JSON text of one character, as a GBNF literal (escaped where JSON must escape)."""
        return literal(json.dumps(chr(cp), ensure_ascii=False)[1:-1])

    CLASSES: ClassVar[dict[str, str]] = {"d": "0-9", "w": "a-zA-Z0-9_", "s": " \\t\\n\\r"}

    def escape(self, in_class: bool) -> str:
        self.i += 1
        if self.i >= len(self.p):
            raise self.fail("'\\' at the end")
        e = self.p[self.i]
        self.i += 1
        if e.lower() in self.CLASSES:
            if e.lower() == "s":
                raise self.fail("\\s and \\S are not supported (JSON escapes whitespace)")
            body = self.CLASSES[e.lower()]
            if in_class:
                if e.isupper():
                    raise self.fail(f"\\{e} inside a class is not supported")
                return body
            return f"[{body}]" if e.islower() else f"[^{body}{self.RAW_EXCLUDED}]"
        if e in "nrtfv0":
            raise self.fail(f"\\{e}: control characters are not supported")
        if e == "x" or e == "u":
            width = 2 if e == "x" else 4
            digits = self.p[self.i:self.i + width]
            if len(digits) != width or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise self.fail(f"\\{e} needs {width} hex digits")
            self.i += width
            cp = int(digits, 16)
        elif e.isalnum():
            raise self.fail(f"\\{e} is not supported")
        else:
            cp = ord(e)
        if in_class:
            return self.class_char(cp)
        return self.char_literal(cp)

    def class_char(self, cp: int) -> str:
        if cp < 0x20 or cp == 0x7F or cp in (0x22, 0x5C):
            raise self.fail("control characters, '\"' and '\\' inside classes are not supported")
        ch = chr(cp)
        return f"\\x{cp:02X}" if ch in "]-^[" else ch  # GBNF has no \\- or \\^ escape

    def char_class(self) -> str:
        self.i += 1
        neg = self.i < len(self.p) and self.p[self.i] == "^"
        if neg:
            self.i += 1
        body: list[str] = []
        while True:
            if self.i >= len(self.p):
                raise self.fail("unterminated character class")
            c = self.p[self.i]
            if c == "]" and body:
                self.i += 1
                break
            if c == "\\":
                body.append(self.escape(in_class=True))
            else:
                self.i += 1
                if c == "-" and body and self.i < len(self.p) and self.p[self.i] != "]":
                    body.append("-")
                    continue
                body.append(self.class_char(ord(c)))
        text = "".join(body)
        return f"[^{text}{self.RAW_EXCLUDED}]" if neg else f"[{text}]"

"""GBNF (llama.cpp's grammar format, its grammars/README.md) -> a compiled grammar: rules as lists of
alternatives, each a sequence of elements, with repetitions rewritten into helper rules as llama.cpp
does (`x*` -> `r ::= x r |`), so the matcher only ever sees character sets and rule references.

Character sets are over Unicode code points; the matcher walks UTF-8 bytes.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_CODEPOINT = 0x10FFFF
MAX_REPEAT = 10_000  # {m,n} copies: a typo like {1,99999999} must not exhaust memory


class GrammarError(ValueError):
    """A grammar that cannot be used; the message names the line and column when it is a syntax error."""


@dataclass(frozen=True)
class Chars:
    """One code point out of ranges (inclusive pairs); negated: any code point outside them."""

    ranges: tuple[tuple[int, int], ...]
    negated: bool = False

    def matches(self, cp: int) -> bool:
        inside = any(lo <= cp <= hi for lo, hi in self.ranges)
        return inside != self.negated


@dataclass(frozen=True)
class Ref:
    rule: int


Element = Chars | Ref
ANY = Chars((), negated=True)  # `.`: any code point


@dataclass
class Grammar:
    """rules[i] = alternatives, each a list of elements; names[i] its name (helper rules get `name-N`)."""

    rules: list[list[list[Element]]] = field(default_factory=list)
    names: list[str] = field(default_factory=list)
    root: int = 0

    def rule_id(self, name: str) -> int:
        return self.names.index(name)


def _is_word(c: str) -> bool:
    return c.isascii() and (c.isalnum() or c == "-")


class _Parser:
    def __init__(self, text: str) -> None:
        self.s = text
        self.i = 0
        self.g = Grammar()
        self.ids: dict[str, int] = {}
        self.defined: set[int] = set()
        self.first_use: dict[int, int] = {}  # rule id -> position of its first reference (for errors)

    # ---- positions and errors ----
    def where(self, pos: int) -> str:
        line = self.s.count("\n", 0, pos) + 1
        col = pos - (self.s.rfind("\n", 0, pos) + 1) + 1
        return f"line {line}, column {col}"

    def error(self, msg: str, pos: int | None = None) -> GrammarError:
        return GrammarError(f"grammar error at {self.where(self.i if pos is None else pos)}: {msg}")

    def peek(self, k: int = 0) -> str:
        j = self.i + k
        return self.s[j] if j < len(self.s) else ""

    def space(self, newline_ok: bool) -> None:
        """Skips blanks and comments; newlines only where a rule may continue (inside parentheses)."""
        while self.i < len(self.s):
            c = self.s[self.i]
            if c in " \t":
                self.i += 1
            elif c == "#":
                while self.i < len(self.s) and self.s[self.i] not in "\r\n":
                    self.i += 1
            elif c in "\r\n" and newline_ok:
                self.i += 1
            else:
                break

    # ---- rules ----
    def rule(self, name: str) -> int:
        if name not in self.ids:
            self.ids[name] = len(self.g.rules)
            self.g.rules.append([])
            self.g.names.append(name)
        return self.ids[name]

    def helper(self, base: str) -> int:
        n = 1
        while f"{base}-{n}" in self.ids:
            n += 1
        return self.rule(f"{base}-{n}")

    def name(self) -> str:
        j = self.i
        while self.i < len(self.s) and _is_word(self.s[self.i]):
            self.i += 1
        if self.i == j:
            raise self.error("expected a rule name" if self.peek() else "expected a rule name, got the end")
        return self.s[j:self.i]

    def parse(self) -> Grammar:
        self.space(True)
        while self.i < len(self.s):
            start = self.i
            name = self.name()
            rid = self.rule(name)
            if rid in self.defined:
                raise self.error(f"rule {name!r} is defined twice", start)
            self.space(False)
            if not self.s.startswith("::=", self.i):
                raise self.error("expected '::=' after the rule name")
            self.i += 3
            self.space(True)
            self.g.rules[rid] = self.alternates(name, nested=False)
            self.defined.add(rid)
            self.space(False)
            if self.peek() == "\r":
                self.i += 1
            if self.peek() == "\n":
                self.i += 1
            elif self.i < len(self.s):
                raise self.error(f"unexpected {self.peek()!r}")
            self.space(True)
        for rid, pos in sorted(self.first_use.items(), key=lambda kv: kv[1]):
            if rid not in self.defined:
                raise self.error(f"undefined rule {self.g.names[rid]!r}", pos)
        if "root" not in self.ids:
            raise GrammarError("grammar error: no 'root' rule (generation starts at root)")
        self.g.root = self.ids["root"]
        _check_left_recursion(self.g)
        return self.g

    def alternates(self, name: str, nested: bool) -> list[list[Element]]:
        alts = [self.sequence(name, nested)]
        while self.peek() == "|":
            self.i += 1
            self.space(True)
            alts.append(self.sequence(name, nested))
        return alts

    def sequence(self, name: str, nested: bool) -> list[Element]:
        out: list[Element] = []
        last = len(out)  # where the last symbol starts: what a repetition operator repeats
        while self.i < len(self.s):
            c = self.peek()
            if c == '"':
                last = len(out)
                self.i += 1
                while self.peek() != '"':
                    if not self.peek() or self.peek() in "\r\n":
                        raise self.error("unterminated string literal")
                    cp = self.char()
                    out.append(Chars(((cp, cp),)))
                self.i += 1
            elif c == "[":
                last = len(out)
                out.append(self.char_class())
            elif c == ".":
                last = len(out)
                self.i += 1
                out.append(ANY)
            elif _is_word(c):
                last = len(out)
                pos = self.i
                rid = self.rule(self.name())
                self.first_use.setdefault(rid, pos)
                out.append(Ref(rid))
            elif c == "(":
                last = len(out)
                self.i += 1
                self.space(True)
                sub = self.helper(name)
                self.g.rules[sub] = self.alternates(name, nested=True)
                self.defined.add(sub)
                if self.peek() != ")":
                    raise self.error("expected ')'" if self.peek() else "missing ')' before the end")
                self.i += 1
                out.append(Ref(sub))
            elif c in "*+?":
                if last == len(out):
                    raise self.error(f"{c!r} has nothing before it to repeat")
                self.i += 1
                lo, hi = {"*": (0, None), "+": (1, None), "?": (0, 1)}[c]
                out[last:] = self.repeat(name, out[last:], lo, hi)
                last = len(out)
            elif c == "{":
                if last == len(out):
                    raise self.error("'{' has nothing before it to repeat")
                lo, hi = self.braces()
                out[last:] = self.repeat(name, out[last:], lo, hi)
                last = len(out)
            else:
                break
            self.space(nested)
        return out

    def braces(self) -> tuple[int, int | None]:
        start = self.i
        self.i += 1
        self.space(False)
        lo = self.integer()
        self.space(False)
        hi: int | None = lo
        if self.peek() == ",":
            self.i += 1
            self.space(False)
            hi = self.integer() if self.peek().isdigit() else None
            self.space(False)
        if self.peek() != "}":
            raise self.error("expected '}' to close the repetition")
        self.i += 1
        if hi is not None and hi < lo:
            raise self.error(f"repetition {{{lo},{hi}}}: the maximum is below the minimum", start)
        if max(lo, hi or 0) > MAX_REPEAT:
            raise self.error(f"repetition count over {MAX_REPEAT}", start)
        return lo, hi

    def integer(self) -> int:
        j = self.i
        while self.peek().isdigit() and self.peek().isascii():
            self.i += 1
        if j == self.i:
            raise self.error("expected a number")
        return int(self.s[j:self.i])

    def repeat(self, name: str, item: list[Element], lo: int, hi: int | None) -> list[Element]:
        """llama.cpp's rewrite: lo copies, then `r ::= item r |` (no maximum) or nested optionals."""
        out = item * lo
        if hi is None:
            r = self.helper(name)
            self.g.rules[r] = [[*item, Ref(r)], []]
            self.defined.add(r)
            return [*out, Ref(r)]
        tail: list[Element] = []
        for _ in range(hi - lo):  # innermost first: r_k ::= item r_{k+1} |
            r = self.helper(name)
            self.g.rules[r] = [[*item, *tail], []]
            self.defined.add(r)
            tail = [Ref(r)]
        return [*out, *tail]

    # ---- characters ----
    def char(self) -> int:
        """One character of a literal or class, escapes decoded."""
        c = self.peek()
        if c != "\\":
            self.i += 1
            return ord(c)
        pos = self.i
        e = self.peek(1)
        self.i += 2
        simple = {"n": 10, "r": 13, "t": 9, "\\": 92, '"': 34, "[": 91, "]": 93}  # llama.cpp's set, no more
        if e in simple:
            return simple[e]
        width = {"x": 2, "u": 4, "U": 8}.get(e)
        if width is None:
            raise self.error(f"unknown escape '\\{e}'" if e else "'\\' at the end", pos)
        digits = self.s[self.i:self.i + width]
        if len(digits) != width or any(d not in "0123456789abcdefABCDEF" for d in digits):
            raise self.error(f"'\\{e}' needs {width} hex digits", pos)
        self.i += width
        cp = int(digits, 16)
        if cp > MAX_CODEPOINT:
            raise self.error(f"'\\{e}{digits}' is beyond U+10FFFF", pos)
        return cp

    def char_class(self) -> Chars:
        start = self.i
        self.i += 1
        negated = self.peek() == "^"
        if negated:
            self.i += 1
        ranges: list[tuple[int, int]] = []
        while self.peek() != "]":
            if not self.peek() or self.peek() in "\r\n":
                raise self.error("unterminated character class", start)
            lo = self.char()
            hi = lo
            if self.peek() == "-" and self.peek(1) not in ("]", ""):
                self.i += 1
                hi = self.char()
                if hi < lo:
                    raise self.error(f"character range {chr(lo)!r}-{chr(hi)!r} is reversed", start)
            ranges.append((lo, hi))
        self.i += 1
        return Chars(tuple(ranges), negated)


def _check_left_recursion(g: Grammar) -> None:
    """A rule that can reach itself without consuming a character would loop forever in the matcher:
    refuse it, naming the rule (llama.cpp refuses these too)."""
    nullable = [False] * len(g.rules)
    changed = True
    while changed:
        changed = False
        for r, alts in enumerate(g.rules):
            if not nullable[r] and any(all(isinstance(e, Ref) and nullable[e.rule] for e in a) for a in alts):
                nullable[r] = changed = True
    first: list[set[int]] = [set() for _ in g.rules]  # rules reachable at the start without consuming
    for r, alts in enumerate(g.rules):
        for a in alts:
            for e in a:
                if not isinstance(e, Ref):
                    break
                first[r].add(e.rule)
                if not nullable[e.rule]:
                    break
    state = [0] * len(g.rules)  # 0 new, 1 on the path, 2 done

    def visit(r: int, path: list[int]) -> None:
        state[r] = 1
        path.append(r)
        for n in sorted(first[r]):
            if state[n] == 1:
                cycle = path[path.index(n):] + [n]
                names = " -> ".join(_user_name(g, x) for x in cycle)
                raise GrammarError(f"grammar error: left recursion in rule {_user_name(g, n)!r} ({names}): "
                                   f"it can reach itself before matching any character")
            if state[n] == 0:
                visit(n, path)
        path.pop()
        state[r] = 2

    import sys

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(max(old, 4 * len(g.rules) + 1000))
    try:
        for r in range(len(g.rules)):
            if state[r] == 0:
                visit(r, [])
    finally:
        sys.setrecursionlimit(old)


def _user_name(g: Grammar, r: int) -> str:
    return g.names[r]


def parse(text: str) -> Grammar:
    """GBNF text -> Grammar; raises GrammarError naming line and column."""
    return _Parser(text).parse()

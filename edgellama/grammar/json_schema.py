"""JSON Schema -> GBNF, in the manner of llama.cpp's json-schema-to-grammar: one rule per schema node,
shared primitive rules, compact JSON with bounded whitespace. Keywords it cannot enforce are refused by
name rather than silently ignored: an output must always validate against the schema it was given.

Objects: properties come in schema order, required ones always, optional ones maybe; further
properties only when additionalProperties allows them. Strings: minLength / maxLength, `format` date,
time, date-time, uuid, and `pattern` anchored with ^...$ using literals, classes, `.`, groups,
alternation and the quantifiers * + ? {m,n} (no backreferences or lookarounds).
"""

from __future__ import annotations

import json
import re
from typing import Any, ClassVar

MAX_ITEMS_EXPANDED = 1000


class SchemaError(ValueError):
    """A schema this converter cannot turn into a grammar; the message names the keyword and where."""


# annotations: they describe, they do not constrain
IGNORED = {"title", "description", "$schema", "$id", "$comment", "default", "examples", "deprecated",
           "readOnly", "writeOnly", "$defs", "definitions"}
SUPPORTED = {"type", "properties", "required", "additionalProperties", "enum", "const", "items",
             "minItems", "maxItems", "minLength", "maxLength", "pattern", "format", "anyOf", "oneOf", "$ref"}
FORMATS = ("date", "time", "date-time", "uuid")

SPACE = '| " " | "\\n" [ \\t]{0,20}'
PRIMITIVES = {
    "space": SPACE,
    "boolean": '("true" | "false") space',
    "null": '"null" space',
    "integral-part": '[0] | [1-9] [0-9]{0,15}',
    "decimal-part": '[0-9]{1,16}',
    "integer": '("-"? integral-part) space',
    "number": '("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)? space',
    "char": '[^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\/bfnrt] | "u" [0-9a-fA-F]{4})',
    "string": '"\\"" char* "\\"" space',
    "value": "object | array | string | number | boolean | null",
    "object": '"{" space ( string ":" space value ("," space string ":" space value)* )? "}" space',
    "array": '"[" space ( value ("," space value)* )? "]" space',
    "date": '[0-9]{4} "-" ( "0" [1-9] | "1" [0-2] ) "-" ( "0" [1-9] | [1-2] [0-9] | "3" [0-1] )',
    "time": '([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? '
            '( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )',
    "date-time": 'date "T" time',
    "uuid": '[0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12}',
}
# which primitives each one uses (so the output holds only what is needed)
DEPENDS = {"integer": ["integral-part", "space"], "number": ["integral-part", "decimal-part", "space"],
           "string": ["char", "space"], "boolean": ["space"], "null": ["space"],
           "value": ["object", "array", "string", "number", "boolean", "null"],
           "object": ["string", "value", "space"], "array": ["value", "space"], "date-time": ["date", "time"]}


def literal(text: str) -> str:
    """A GBNF string literal for text."""
    out = []
    for ch in text:
        if ch in '"\\':
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02X}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


def json_literal(value: Any) -> str:
    """The GBNF literal of value's compact JSON text (for const and enum)."""
    return literal(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


class _Converter:
    def __init__(self, root: dict[str, Any]) -> None:
        self.root = root
        self.rules: dict[str, str] = {}
        self.refs: dict[str, str] = {}  # $ref target -> rule name (visited or in progress)

    def add(self, name: str, body: str) -> str:
        name = re.sub(r"[^a-zA-Z0-9-]+", "-", name).strip("-") or "r"
        if name in PRIMITIVES:
            name += "-"
        key, n = name, 1
        while key in self.rules and self.rules[key] != body:
            n += 1
            key = f"{name}{n}"
        self.rules[key] = body
        return key

    def prim(self, name: str) -> str:
        if name not in self.rules:
            self.rules[name] = PRIMITIVES[name]
            for dep in DEPENDS.get(name, []):
                self.prim(dep)
        return name

    def resolve(self, ref: str, where: str) -> tuple[str, Any]:
        for prefix in ("#/$defs/", "#/definitions/"):
            if ref.startswith(prefix):
                key = ref[len(prefix):]
                defs = self.root.get(prefix[2:-1], {})
                if isinstance(defs, dict) and key in defs:
                    return key, defs[key]
        if ref == "#":
            return "root", self.root
        raise SchemaError(f"{where}: $ref {ref!r} is not a '#/$defs/NAME' of this schema")

    def visit(self, s: Any, name: str, where: str) -> str:
        """The rule name matching schema s (a JSON value followed by optional whitespace)."""
        if s is True or s == {}:
            return self.prim("value")
        if s is False:
            raise SchemaError(f"{where}: schema false allows no value")
        if not isinstance(s, dict):
            raise SchemaError(f"{where}: a schema must be an object or a boolean, got {json.dumps(s)[:40]}")
        unknown = sorted(set(s) - SUPPORTED - IGNORED)
        if unknown:
            raise SchemaError(f"{where}: keyword {unknown[0]!r} is not supported (supported: "
                              f"{', '.join(sorted(SUPPORTED))})")
        if "$ref" in s:
            if set(s) - IGNORED - {"$ref"}:
                raise SchemaError(f"{where}: $ref beside other keywords is not supported")
            key, target = self.resolve(s["$ref"], where)
            if s["$ref"] not in self.refs:
                rule = self.add(f"ref-{key}", "")  # placeholder: a recursive schema refers to it
                self.refs[s["$ref"]] = rule
                self.rules[rule] = self.visit(target, f"{key}-def", s["$ref"])
            return self.refs[s["$ref"]]
        for kw in ("anyOf", "oneOf"):
            if kw in s:
                alts = s[kw]
                if not isinstance(alts, list) or not alts:
                    raise SchemaError(f"{where}: {kw} must be a non-empty list")
                rest = {k: v for k, v in s.items() if k != kw and k not in IGNORED}
                if rest:
                    raise SchemaError(f"{where}: {kw} beside {min(rest)!r} is not supported")
                if kw == "oneOf":
                    self.check_disjoint(alts, where)
                names = [self.visit(a, f"{name}-{i}", f"{where}/{kw}/{i}") for i, a in enumerate(alts)]
                return self.add(name, " | ".join(names))
        if "const" in s:
            self.prim("space")
            return self.add(name, f"{json_literal(s['const'])} space")
        if "enum" in s:
            vals = s["enum"]
            if not isinstance(vals, list) or not vals:
                raise SchemaError(f"{where}: enum must be a non-empty list")
            self.prim("space")
            return self.add(name, "(" + " | ".join(json_literal(v) for v in vals) + ") space")
        t = s.get("type")
        if isinstance(t, list):
            if not t or not all(isinstance(x, str) for x in t):
                raise SchemaError(f"{where}: type must be a string or a list of strings")
            names = [self.visit(dict(s, type=x), f"{name}-{x}", where) for x in t]
            return self.add(name, " | ".join(names))
        if t is None:
            if "properties" in s or "additionalProperties" in s:
                t = "object"
            elif "items" in s:
                t = "array"
            elif any(k in s for k in ("minLength", "maxLength", "pattern", "format")):
                t = "string"
            else:
                return self.prim("value")
        if t == "object":
            return self.object(s, name, where)
        if t == "array":
            return self.array(s, name, where)
        if t == "string":
            return self.string(s, name, where)
        if t in ("number", "integer", "boolean", "null"):
            self.only(s, where, t, set())
            return self.prim(t)
        raise SchemaError(f"{where}: unknown type {t!r}")

    def check_disjoint(self, alts: list[Any], where: str) -> None:
        """oneOf is anyOf in a grammar unless the branches cannot both match: accept it when each
        branch has a different type or const/enum values that do not overlap."""
        seen: list[Any] = []
        for a in alts:
            if not isinstance(a, dict):
                raise SchemaError(f"{where}: oneOf branches must be objects")
            key = a.get("type") or a.get("const", a.get("enum"))
            if key is None or key in seen or ("$ref" in a and len(alts) > 1 and key is None):
                raise SchemaError(f"{where}: oneOf is supported only with branches of different types or "
                                  f"values (a grammar cannot forbid matching two of them); use anyOf")
            seen.append(key)

    def only(self, s: dict[str, Any], where: str, t: str, allowed: set[str]) -> None:
        bad = sorted(set(s) - IGNORED - {"type"} - allowed)
        if bad:
            raise SchemaError(f"{where}: keyword {bad[0]!r} does not apply to type {t!r} here")

    def object(self, s: dict[str, Any], name: str, where: str) -> str:
        self.only(s, where, "object", {"properties", "required", "additionalProperties"})
        props = s.get("properties", {})
        required = s.get("required", [])
        if not isinstance(props, dict) or not isinstance(required, list):
            raise SchemaError(f"{where}: properties must be an object and required a list")
        missing = [r for r in required if r not in props]
        if missing and s.get("additionalProperties") is False:
            raise SchemaError(f"{where}: required property {missing[0]!r} is not in properties")
        addl = s.get("additionalProperties", False)
        space = self.prim("space")
        kv: dict[str, str] = {}
        for key, sub in props.items():
            value = self.visit(sub, f"{name}-{key}", f"{where}/properties/{key}")
            kv[key] = self.add(f"{name}-{key}-kv", f'{literal(json.dumps(key, ensure_ascii=False))} space ":" '
                                                   f"{space} {value}")
        for key in missing:  # required but undescribed: any value under that name
            kv[key] = self.add(f"{name}-{key}-kv", f'{literal(json.dumps(key, ensure_ascii=False))} space ":" '
                                                   f"{space} {self.prim('value')}")
        req = [k for k in kv if k in required]
        opt = [k for k in kv if k not in required]
        extra = None
        if addl is not False:
            value = self.visit(addl, f"{name}-additional", f"{where}/additionalProperties")
            extra = self.add(f"{name}-additional-kv", f'{self.prim("string")} ":" space {value}')
        extras = f' ("," space {extra})*' if extra else ""
        if req:
            body = ' "," space '.join(kv[k] for k in req)
            body += "".join(f' ("," space {kv[k]})?' for k in opt) + extras
            return self.add(name, f'"{{" space {body} "}}" space')
        # all optional: the first present property has no comma before it
        alts = []
        tail = ""
        tails: list[str] = []
        for k in reversed(opt):
            tails.append(tail)
            tail = f' ("," space {kv[k]})?' + tail
        tails.reverse()
        for k, t in zip(opt, tails):
            alts.append(f"{kv[k]}{t}{extras}")
        if extra:
            alts.append(f"{extra}{extras}")
        inner = f" ( {' | '.join(alts)} )?" if alts else ""
        return self.add(name, f'"{{" space{inner} "}}" space')

    def array(self, s: dict[str, Any], name: str, where: str) -> str:
        self.only(s, where, "array", {"items", "minItems", "maxItems"})
        items = s.get("items", True)
        if isinstance(items, list):
            raise SchemaError(f"{where}: items as a list (tuples) is not supported")
        item = self.visit(items, f"{name}-item", f"{where}/items")
        lo, hi = s.get("minItems", 0), s.get("maxItems")
        if not isinstance(lo, int) or lo < 0 or hi is not None and (not isinstance(hi, int) or hi < lo):
            raise SchemaError(f"{where}: minItems / maxItems must be integers with 0 <= minItems <= maxItems")
        if max(lo, hi or 0) > MAX_ITEMS_EXPANDED:
            raise SchemaError(f"{where}: minItems / maxItems over {MAX_ITEMS_EXPANDED} are not supported")
        self.prim("space")
        if hi == 0:
            return self.add(name, '"[" space "]" space')
        more = _counted(f'("," space {item})', max(lo - 1, 0), None if hi is None else hi - 1)
        body = f"{item} {more}".strip()
        if lo == 0:
            body = f"( {body} )?"
        return self.add(name, f'"[" space {body} "]" space')

    def string(self, s: dict[str, Any], name: str, where: str) -> str:
        self.only(s, where, "string", {"minLength", "maxLength", "pattern", "format"})
        self.prim("space")
        if "format" in s:
            fmt = s["format"]
            if fmt not in FORMATS:
                raise SchemaError(f"{where}: string format {fmt!r} is not supported ({', '.join(FORMATS)})")
            if len(set(s) - IGNORED - {"type", "format"}):
                raise SchemaError(f"{where}: format beside minLength/maxLength/pattern is not supported")
            return self.add(name, f'"\\"" {self.prim(fmt)} "\\"" space')
        if "pattern" in s:
            if "minLength" in s or "maxLength" in s:
                raise SchemaError(f"{where}: pattern beside minLength/maxLength is not supported")
            body = _Regex(s["pattern"], where).convert()
            return self.add(name, f'"\\"" ({body}) "\\"" space')
        lo, hi = s.get("minLength", 0), s.get("maxLength")
        if not isinstance(lo, int) or lo < 0 or hi is not None and (not isinstance(hi, int) or hi < lo):
            raise SchemaError(f"{where}: minLength / maxLength must be integers with 0 <= minLength <= maxLength")
        if max(lo, hi or 0) > MAX_ITEMS_EXPANDED:
            raise SchemaError(f"{where}: minLength / maxLength over {MAX_ITEMS_EXPANDED} are not supported")
        if lo == 0 and hi is None:
            return self.prim("string")
        char = self.prim("char")
        return self.add(name, f'"\\"" {_counted(char, lo, hi)} "\\"" space')


def _counted(item: str, lo: int, hi: int | None) -> str:
    if hi is None:
        return f"{item}{{{lo},}}" if lo else f"{item}*"
    if hi == 0:
        return ""
    return f"{item}{{{lo},{hi}}}"


class _Regex:
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


def schema_to_gbnf(schema: Any, root_name: str = "root") -> str:
    """GBNF text for a JSON Schema (a dict or a boolean); raises SchemaError naming what it refuses.
    root_name: the top rule's name (and its sub-rules' prefix), for a grammar that embeds this one."""
    if not isinstance(schema, (dict, bool)):
        raise SchemaError("a JSON schema must be an object (or true)")
    conv = _Converter(schema if isinstance(schema, dict) else {})
    root = conv.visit(schema, root_name, "#")
    if root != root_name:
        conv.rules[root_name] = root
    ordered = [root_name] + sorted(k for k in conv.rules if k != root_name)
    return "".join(f"{k} ::= {conv.rules[k]}\n" for k in ordered)

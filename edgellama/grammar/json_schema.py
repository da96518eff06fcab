"""JSON Schema -> GBNF, accepting what llama.cpp's json-schema-to-grammar accepts: one rule per schema node,
shared primitive rules, JSON with bounded whitespace. Every sentence of the grammar validates against the
schema (the grammar may be narrower: properties in schema order, no exponent in a bounded number).

Keywords that constrain and are enforced: type (or a list), enum, const, anyOf, oneOf (branches that
cannot both match), allOf (merged, schema_merge.py), $ref (any JSON pointer into the same document);
objects: properties, required, additionalProperties (extra keys never repeat a declared name); arrays:
items, prefixItems (tuples; an object there is the item schema, as llama.cpp reads it), items as a list
with additionalItems (older drafts), minItems, maxItems; strings: minLength, maxLength, format date /
time / date-time / uuid, pattern (number_range.py: integers and numbers) minimum, maximum,
exclusiveMinimum, exclusiveMaximum (inclusive, exclusive, draft-4 booleans, fractional bounds rounded
inwards for integers).
Read more loosely, as llama.cpp does, and reported in Conversion.notes: a `pattern` that is not anchored
^...$ or uses what the regex converter lacks (lookarounds, \\s, backreferences) is any string (its
minLength / maxLength still hold); a `format` other than the four above is an annotation (JSON Schema's
default reading). Any other keyword is refused by name: a grammar must never silently allow what the
schema forbids.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import unquote

from edgellama.grammar.gbnf_text import MAX_ITEMS_EXPANDED, SchemaError, json_literal, literal
from edgellama.grammar.number_range import MAX_DIGITS, integer_range, number_range
from edgellama.grammar.schema_merge import ANNOTATIONS, merge, merge_refless
from edgellama.grammar.schema_regex import Regex

__all__ = ["MAX_ITEMS_EXPANDED", "Conversion", "Note", "SchemaConverter", "SchemaError", "convert_schema", "json_literal",
           "literal", "schema_to_gbnf"]

TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")
KEYWORDS = {
    "object": {"properties", "required", "additionalProperties"},
    "array": {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems"},
    "string": {"minLength", "maxLength", "pattern", "format"},
    "integer": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"},
}
GENERAL = {"type", "enum", "const", "anyOf", "oneOf", "allOf", "$ref"}
KNOWN = GENERAL | ANNOTATIONS | set().union(*KEYWORDS.values())
FORMATS = {"date": "date", "time": "time", "date-time": "date-time", "uuid": "uuid",
           **{f"uuid{i}": "uuid" for i in range(1, 6)}}
MAX_REF_CHAIN = 64  # $ref -> $ref -> ... resolved inline (allOf, anyOf beside keywords)

SPACE = '| " " | "\\n" [ \\t]{0,20}'
# a JSON string's character: raw, or an escape; \\u escapes of UTF-16 surrogates are left out, so every
# sentence is valid Unicode and a string's length in the grammar is its length in characters
CHAR = ('[^"\\\\\\x7F\\x00-\\x1F] | [\\\\] (["\\\\/bfnrt] | "u" ([0-9a-cA-Ce-fE-F] [0-9a-fA-F]{3} '
        '| [dD] [0-7] [0-9a-fA-F]{2}))')
# a leap year (Gregorian) and any other year, 0001-9999 (year 0 is no date for Python's datetime)
_LEAP_YY = '([02468] [48] | [13579] [26] | [2468] "0")'
PRIMITIVES = {
    "space": SPACE,
    "boolean": '("true" | "false") space',
    "null": '"null" space',
    "integral-part": '[0] | [1-9] [0-9]{0,15}',
    "decimal-part": '[0-9]{1,16}',
    "integer": '("-"? integral-part) space',
    "number": '("-"? integral-part) ("." decimal-part)? ([eE] [-+]? integral-part)? space',
    "char": CHAR,
    "string": '"\\"" char* "\\"" space',
    "value": "object | array | string | number | boolean | null",
    "object": '"{" space ( string ":" space value ("," space string ":" space value)* )? "}" space',
    "array": '"[" space ( value ("," space value)* )? "]" space',
    "date": 'year "-" ( ("0" [13578] | "1" [02]) "-" ("0" [1-9] | [12] [0-9] | "3" [01]) '
            '| ("0" [469] | "11") "-" ("0" [1-9] | [12] [0-9] | "30") | "02-" ("0" [1-9] | "1" [0-9] | "2" [0-8]) ) '
            f'| ( [0-9]{{2}} {_LEAP_YY} | {_LEAP_YY} "00" ) "-02-29"',
    "year": '"000" [1-9] | "00" [1-9] [0-9] | "0" [1-9] [0-9]{2} | [1-9] [0-9]{3}',
    "time": '([01] [0-9] | "2" [0-3]) ":" [0-5] [0-9] ":" [0-5] [0-9] ( "." [0-9]{3} )? '
            '( "Z" | ( "+" | "-" ) ( [01] [0-9] | "2" [0-3] ) ":" [0-5] [0-9] )',
    "date-time": 'date "T" time',
    "uuid": '[0-9a-fA-F]{8} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{4} "-" [0-9a-fA-F]{12}',
}
# which primitives each one uses (so the output holds only what is needed)
DEPENDS = {"integer": ["integral-part", "space"], "number": ["integral-part", "decimal-part", "space"],
           "string": ["char", "space"], "boolean": ["space"], "null": ["space"],
           "value": ["object", "array", "string", "number", "boolean", "null"],
           "object": ["string", "value", "space"], "array": ["value", "space"], "date-time": ["date", "time"],
           "date": ["year"]}
_KEY_RAW_EXCLUDED = '"\\\\\\x7F\\x00-\\x1F'
_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r",
                  "\t": "\\t"}


@dataclass(frozen=True)
class Note:
    """A keyword the grammar reads more loosely than the schema says (a documented relaxation)."""

    where: str  # JSON pointer of the schema node
    keyword: str
    how: str

    def __str__(self) -> str:
        return f"{self.where}: {self.how}"


@dataclass
class Conversion:
    gbnf: str
    notes: list[Note] = field(default_factory=list)


class SchemaConverter:
    """Schemas -> rules of one grammar. Each add_schema is its own document ($ref resolves inside it), so
    several tools' schemas share the primitives and never each other's definitions."""

    def __init__(self) -> None:
        self.rules: dict[str, str] = {}
        self.notes: list[Note] = []
        self.doc: Any = {}
        self.refs: dict[tuple[int, str], str] = {}  # (document, $ref) -> rule name (visited or in progress)
        self.doc_name = "root"

    def add_schema(self, schema: Any, name: str, where: str = "#") -> str:
        """The rule name matching schema (a JSON value followed by optional whitespace)."""
        if not isinstance(schema, (dict, bool)):
            raise SchemaError(f"{where}: a JSON schema must be an object (or true)")
        outer, self.doc, outer_name, self.doc_name = self.doc, schema, self.doc_name, name
        try:
            return self.visit(schema, name, where)
        finally:
            self.doc, self.doc_name = outer, outer_name

    def gbnf(self, root_name: str, root: str) -> str:
        rules = dict(self.rules)
        if root != root_name:
            rules[root_name] = root
        ordered = [root_name] + sorted(k for k in rules if k != root_name)
        return "".join(f"{k} ::= {rules[k]}\n" for k in ordered)

    # ---- rules ----

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

    def note(self, where: str, keyword: str, how: str) -> None:
        self.notes.append(Note(where, keyword, how))

    # ---- $ref ----

    def resolve(self, ref: Any, where: str) -> Any:
        if not isinstance(ref, str):
            raise SchemaError(f"{where}: $ref must be a string")
        if ref != "#" and not ref.startswith("#/"):
            raise SchemaError(f"{where}: $ref {ref!r} is not supported: only references into the same schema "
                              "('#/...')")
        target = self.doc
        for part in ref[2:].split("/") if ref != "#" else []:
            key = unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(target, dict) and key in target:
                target = target[key]
            elif isinstance(target, list) and key.isdigit() and int(key) < len(target):
                target = target[int(key)]
            else:
                raise SchemaError(f"{where}: $ref {ref!r} points to nothing in this schema ({key!r} not found)")
        return target

    def inline(self, s: Any, where: str) -> Any:
        """s with a $ref or allOf at its top replaced by what they stand for (for merging)."""
        for _ in range(MAX_REF_CHAIN):
            if not isinstance(s, dict):
                return s
            if "$ref" in s:
                rest = {k: v for k, v in s.items() if k != "$ref"}
                target = self.resolve(s["$ref"], where)
                s = merge_refless(target, rest, where) if _constrains(rest) else target
                continue
            if "allOf" in s:
                s = self.merged_all_of(s, where)
                continue
            return s
        raise SchemaError(f"{where}: $ref / allOf nested over {MAX_REF_CHAIN} deep (a $ref cycle?)")

    def merged_all_of(self, s: dict[str, Any], where: str) -> Any:
        branches = s["allOf"]
        if not isinstance(branches, list) or not branches:
            raise SchemaError(f"{where}: allOf must be a non-empty list")
        acc: Any = {k: v for k, v in s.items() if k != "allOf"}
        for i, b in enumerate(branches):
            b = self.inline(b, f"{where}/allOf/{i}")
            if b is False:
                raise SchemaError(f"{where}/allOf/{i}: schema false allows no value")
            if b is True:
                continue
            if not isinstance(b, dict):
                raise SchemaError(f"{where}/allOf/{i}: a schema must be an object or a boolean")
            acc = merge(acc, b, f"{where}/allOf")
        return acc

    # ---- the walk ----

    def visit(self, s: Any, name: str, where: str) -> str:
        if s is True or s == {}:
            return self.prim("value")
        if s is False:
            raise SchemaError(f"{where}: schema false allows no value")
        if not isinstance(s, dict):
            raise SchemaError(f"{where}: a schema must be an object or a boolean, got {json.dumps(s)[:40]}")
        unknown = sorted(set(s) - KNOWN)
        if unknown:
            raise SchemaError(f"{where}: keyword {unknown[0]!r} is not supported (docs/grammar.md lists what is)")
        if "$ref" in s:
            if _constrains({k: v for k, v in s.items() if k != "$ref"}):
                return self.visit(self.inline(s, where), name, where)
            return self.ref_rule(s["$ref"], where)
        if "allOf" in s:
            return self.visit(self.merged_all_of(s, where), name, where)
        for kw in ("anyOf", "oneOf"):
            if kw in s:
                return self.alternatives(s, kw, name, where)
        if "const" in s or "enum" in s:
            return self.values(s, name, where)
        t = s.get("type")
        if isinstance(t, list):
            if not t or not all(isinstance(x, str) for x in t):
                raise SchemaError(f"{where}: type must be a string or a list of strings")
            names = [self.visit(dict(s, type=x), f"{name}-{x}" if len(t) > 1 else name, where) for x in t]
            return names[0] if len(names) == 1 else self.add(name, " | ".join(names))
        if t is None:
            t = _implied_type(s)
            if t is None:
                return self.prim("value")
        if not isinstance(t, str):
            raise SchemaError(f"{where}: type must be a string or a list of strings")
        if t not in TYPES:
            raise SchemaError(f"{where}: unknown type {t!r}")
        # keywords of other types do not constrain a value of this one (JSON Schema): ignored here
        return getattr(self, "visit_" + t)(s, name, where)

    def ref_rule(self, ref: Any, where: str) -> str:
        target = self.resolve(ref, where)
        key = (id(self.doc), ref)
        if key not in self.refs:
            prefix = "" if self.doc_name == "root" else f"{self.doc_name}-"
            rule = self.add(f"{prefix}ref{ref[1:]}" if ref != "#" else f"{prefix}ref-root", "")  # placeholder: recursion refers to it
            self.refs[key] = rule
            self.rules[rule] = self.visit(target, rule, ref)
        return self.refs[key]

    def alternatives(self, s: dict[str, Any], kw: str, name: str, where: str) -> str:
        alts = s[kw]
        if not isinstance(alts, list) or not alts:
            raise SchemaError(f"{where}: {kw} must be a non-empty list")
        rest = {k: v for k, v in s.items() if k != kw}
        if _constrains(rest):  # keywords beside anyOf hold in every branch
            alts = [merge_refless(self.inline(rest, where), self.inline(a, f"{where}/{kw}/{i}"), where)
                    for i, a in enumerate(alts)]
        if kw == "oneOf":
            self.check_disjoint([self.inline(a, f"{where}/oneOf/{i}") for i, a in enumerate(alts)], where)
        names = []
        for i, a in enumerate(alts):
            if a is False:
                continue
            names.append(self.visit(a, f"{name}-{i}", f"{where}/{kw}/{i}"))
        if not names:
            raise SchemaError(f"{where}: no branch of {kw} allows a value")
        return names[0] if len(names) == 1 else self.add(name, " | ".join(names))

    def check_disjoint(self, alts: list[Any], where: str) -> None:
        """oneOf is anyOf in a grammar when no value can match two branches: accept it when the branches
        differ in type, in const / enum values, or in the const of one required property (a discriminator)."""
        keys: list[Any] = []
        for a in alts:
            if not isinstance(a, dict):
                raise SchemaError(f"{where}: oneOf branches must be objects")
            keys.append(_identity(a))
        for i, k in enumerate(keys):
            if k is None or any(_overlap(k, other) for other in keys[:i]):
                raise SchemaError(f"{where}: oneOf is supported only with branches of different types, values or "
                                  "discriminator consts (a grammar cannot forbid matching two of them); use anyOf")

    def values(self, s: dict[str, Any], name: str, where: str) -> str:
        if "const" in s:
            vals = [s["const"]]
            if "enum" in s and not any(_json_eq(s["const"], v) for v in _enum(s, where)):
                raise SchemaError(f"{where}: const is not one of enum's values")
        else:
            vals = _enum(s, where)
        fits = [v for v in vals if _fits(v, s)]
        if not fits:
            raise SchemaError(f"{where}: no value of {'const' if 'const' in s else 'enum'} fits the schema's other "
                              "keywords")
        self.prim("space")
        body = " | ".join(json_literal(v) for v in fits)
        return self.add(name, f"({body}) space" if len(fits) > 1 else f"{body} space")

    def visit_boolean(self, s: dict[str, Any], name: str, where: str) -> str:
        return self.prim("boolean")

    def visit_null(self, s: dict[str, Any], name: str, where: str) -> str:
        return self.prim("null")

    def visit_integer(self, s: dict[str, Any], name: str, where: str) -> str:
        m = s.get("multipleOf")
        if m is not None and not (_number(m) and m == 1):
            raise SchemaError(f"{where}: keyword 'multipleOf' is not supported (only 1 on an integer)")
        lo, lo_incl, hi, hi_incl = _bounds(s, where)
        if lo is None and hi is None:
            return self.prim("integer")
        ilo = None if lo is None else _ceil(lo) + (0 if lo_incl or lo != _ceil(lo) else 1)
        ihi = None if hi is None else _floor(hi) - (0 if hi_incl or hi != _floor(hi) else 1)
        if ilo is not None and ihi is not None and ilo > ihi:
            raise SchemaError(f"{where}: no integer lies between the minimum and the maximum")
        self.prim("space")
        return self.add(name, f"{integer_range(ilo, ihi)} space")

    def visit_number(self, s: dict[str, Any], name: str, where: str) -> str:
        if "multipleOf" in s:
            raise SchemaError(f"{where}: keyword 'multipleOf' is not supported on a number")
        lo, lo_incl, hi, hi_incl = _bounds(s, where)
        if lo is None and hi is None:
            return self.prim("number")
        body = number_range(lo, lo_incl, hi, hi_incl)
        if body is None:
            raise SchemaError(f"{where}: no number lies between the minimum and the maximum")
        self.prim("space")
        return self.add(name, f"{body} space")

    def visit_object(self, s: dict[str, Any], name: str, where: str) -> str:
        props = s.get("properties", {})
        required = s.get("required", [])
        if not isinstance(props, dict):
            raise SchemaError(f"{where}: properties must be an object")
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise SchemaError(f"{where}: required must be a list of property names")
        addl = s.get("additionalProperties", "properties" not in s)
        if addl is True and not props and not required:
            return self.prim("object")
        if addl is not True and addl is not False and not isinstance(addl, dict):
            raise SchemaError(f"{where}: additionalProperties must be a boolean or a schema")
        space = self.prim("space")
        kv: dict[str, str] = {}
        for key, sub in props.items():
            if sub is False:
                if key in required:
                    raise SchemaError(f"{where}: required property {key!r} has schema false")
                continue
            value = self.visit(sub, f"{name}-{key}", f"{where}/properties/{key}")
            kv[key] = self.add(f"{name}-{key}-kv", f'{literal(json.dumps(key, ensure_ascii=False))} space ":" '
                                                   f"{space} {value}")
        for key in required:
            if key in kv:
                continue
            if addl is False or key in props:
                raise SchemaError(f"{where}: required property {key!r} is not allowed by the schema")
            value = self.visit(addl, f"{name}-{key}", f"{where}/additionalProperties")
            kv[key] = self.add(f"{name}-{key}-kv", f'{literal(json.dumps(key, ensure_ascii=False))} space ":" '
                                                   f"{space} {value}")
        req = [k for k in kv if k in required]
        opt = [k for k in kv if k not in required]
        extra = None
        if addl is not False:
            value = self.visit(addl, f"{name}-additional", f"{where}/additionalProperties")
            key_rule = self.add(f"{name}-additional-k", self.key_not_in(list(props) + required))
            extra = self.add(f"{name}-additional-kv", f'{key_rule} space ":" space {value}')
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

    def key_not_in(self, names: list[str]) -> str:
        """A JSON string that is none of names (an extra property must not repeat a declared one). Keys are
        written raw or with the short escapes; \\u escapes are left out so a name cannot come back spelled
        another way."""
        self.prim("char")
        trie: dict[str, Any] = {}
        for n in names:
            node = trie
            for ch in n:
                node = node.setdefault(ch, {})
            node[""] = {}  # a name ends here

        def spell(ch: str) -> str:
            if ch in _SHORT_ESCAPES:
                return literal(_SHORT_ESCAPES[ch])
            if ord(ch) < 0x20 or ord(ch) == 0x7F:
                return '"\\\\u' + f'{ord(ch):04x}"'
            return literal(ch)

        def key_char(exclude: set[str]) -> str:
            raw = "".join(_class_char(c) for c in sorted(exclude) if not (ord(c) < 0x20 or c in '"\\\x7f'))
            esc = [e for c, e in _SHORT_ESCAPES.items() if c not in exclude]
            alts = [f"[^{_KEY_RAW_EXCLUDED}{raw}]"] + [literal(e) for e in esc]
            return "(" + " | ".join(alts) + ")"

        any_char = self.add("key-char", key_char(set()))

        def rest(node: dict[str, Any]) -> str:
            children = {c: sub for c, sub in node.items() if c}
            alts = [f"{spell(c)} {rest(sub)}" for c, sub in children.items()]
            alts.append(f"{key_char(set(children))} {any_char}*")
            ends = "" in node
            body = " | ".join(alts)
            return f"({body})" if ends else f"({body})?"

        return f'"\\"" {rest(trie) if trie else any_char + "*"} "\\""'

    def visit_array(self, s: dict[str, Any], name: str, where: str) -> str:
        if s.get("uniqueItems", False) is not False:
            raise SchemaError(f"{where}: keyword 'uniqueItems' is not supported")
        lo, hi = s.get("minItems", 0), s.get("maxItems")
        if not _count(lo) or hi is not None and (not _count(hi) or hi < lo):
            raise SchemaError(f"{where}: minItems / maxItems must be integers with 0 <= minItems <= maxItems")
        if max(lo, hi or 0) > MAX_ITEMS_EXPANDED:
            raise SchemaError(f"{where}: minItems / maxItems over {MAX_ITEMS_EXPANDED} are not supported")
        items, prefix, rest_where = s.get("items"), None, f"{where}/items"
        if isinstance(items, list):  # older drafts' tuple, additionalItems for the rest
            prefix, items, rest_where = items, s.get("additionalItems"), f"{where}/additionalItems"
        elif isinstance(s.get("prefixItems"), list):
            prefix = s["prefixItems"]
        elif items is None and isinstance(s.get("prefixItems"), dict):
            items, rest_where = s["prefixItems"], f"{where}/prefixItems"  # llama.cpp reads it as the item schema
        self.prim("space")
        parts: list[str] = []
        n_prefix = 0
        if prefix is not None:
            n_prefix = len(prefix) if hi is None else min(len(prefix), hi)
            for i, sub in enumerate(prefix[:n_prefix]):
                parts.append(self.visit(sub, f"{name}-tuple-{i}", f"{where}/prefixItems/{i}"))
            if items is None:
                items = n_prefix < lo  # llama.cpp writes the tuple alone
        elif items is None:
            items = True
        more_lo = max(lo - n_prefix, 0)
        more_hi = None if hi is None else hi - n_prefix
        if items is False:
            more_hi = 0
            if more_lo:
                raise SchemaError(f"{where}: minItems asks for more items than the schema allows")
        first = ' "," space '.join(parts)
        if more_hi == 0:
            return self.add(name, f'"[" space {first} "]" space'.replace("space  ", "space "))
        item = self.visit(items, f"{name}-item", rest_where)
        if parts:
            tail = _counted(f'("," space {item})', more_lo, more_hi)
            return self.add(name, f'"[" space {first} {tail} "]" space')
        more = _counted(f'("," space {item})', max(lo - 1, 0), None if hi is None else hi - 1)
        body = f"{item} {more}".strip()
        if lo == 0:
            body = f"( {body} )?"
        return self.add(name, f'"[" space {body} "]" space')

    def visit_string(self, s: dict[str, Any], name: str, where: str) -> str:
        self.prim("space")
        lo, hi = s.get("minLength", 0), s.get("maxLength")
        if not _count(lo) or hi is not None and (not _count(hi) or hi < lo):
            raise SchemaError(f"{where}: minLength / maxLength must be integers with 0 <= minLength <= maxLength")
        if max(lo, hi or 0) > MAX_ITEMS_EXPANDED:
            raise SchemaError(f"{where}: minLength / maxLength over {MAX_ITEMS_EXPANDED} are not supported")
        fmt = s.get("format")
        if fmt is not None:
            if not isinstance(fmt, str):
                raise SchemaError(f"{where}: format must be a string")
            if fmt in FORMATS:
                if set(s) & {"pattern", "minLength", "maxLength"}:
                    raise SchemaError(f"{where}: format {fmt!r} beside pattern / minLength / maxLength is not "
                                      "supported")
                return self.add(name, f'"\\"" {self.prim(FORMATS[fmt])} "\\"" space')
            self.note(where, "format", f"format {fmt!r} is an annotation here (not checked): any string")
        if "pattern" in s:
            pattern = s["pattern"]
            if not isinstance(pattern, str):
                raise SchemaError(f"{where}: pattern must be a string")
            body, why = self.pattern(pattern, where, bool(set(s) & {"minLength", "maxLength"}))
            if body is not None:
                return self.add(name, f'"\\"" ({body}) "\\"" space')
            self.note(where, "pattern", f"pattern {pattern!r} {why}: read as any string"
                      + (" of the given length" if set(s) & {"minLength", "maxLength"} else ""))
        if lo == 0 and hi is None:
            return self.prim("string")
        char = self.prim("char")
        return self.add(name, f'"\\"" {_counted(char, lo, hi)} "\\"" space')

    @staticmethod
    def pattern(pattern: str, where: str, with_length: bool) -> tuple[str | None, str]:
        """(GBNF of the pattern, "") or (None, why it is read as any string); SchemaError for a regex that
        is invalid under any flavour."""
        try:
            re.compile(pattern)
        except re.error as exc:
            raise SchemaError(f"{where}: pattern {pattern!r} is not a valid regular expression: {exc}") from None
        if not (pattern.startswith("^") and pattern.endswith("$")) or pattern.endswith("\\$"):
            return None, "is not anchored ^...$"
        if with_length:
            return None, "beside minLength / maxLength is not converted"
        try:
            return Regex(pattern, where).convert(), ""
        except SchemaError as exc:
            return None, f"is not converted ({str(exc).rsplit(': ', 1)[-1]})"


def _constrains(s: dict[str, Any]) -> bool:
    return any(k not in ANNOTATIONS for k in s)


def _implied_type(s: dict[str, Any]) -> str | None:
    """The type a schema without `type` is read as, by its keywords (llama.cpp's order)."""
    if "properties" in s or s.get("additionalProperties", True) is not True or "required" in s:
        return "object"
    if "items" in s or "prefixItems" in s or "minItems" in s or "maxItems" in s:
        return "array"
    if any(k in s for k in ("pattern", "minLength", "maxLength", "format")):
        return "string"
    if any(k in s for k in KEYWORDS["number"]):
        return "number"
    return None


def _identity(a: dict[str, Any]) -> Any:
    """What sets a oneOf branch apart: ("type", types), ("values", [...]) or ("tag", property, value)."""
    if "const" in a or "enum" in a:
        return ("values", [a["const"]] if "const" in a else list(a["enum"]))
    for key, sub in (a.get("properties") or {}).items():
        if key in a.get("required", []) and isinstance(sub, dict) and ("const" in sub or "enum" in sub):
            return ("tag", key, [sub["const"]] if "const" in sub else list(sub["enum"]))
    t = a.get("type")
    if t is not None:
        ts = set(t) if isinstance(t, list) else {t}
        if "number" in ts:
            ts.add("integer")
        return ("type", ts)
    return None


def _overlap(x: Any, y: Any) -> bool:
    if x[0] == "type" and y[0] == "type":
        return bool(x[1] & y[1])
    if x[0] == "values" and y[0] == "values":
        return any(_json_eq(p, q) for p in x[1] for q in y[1])
    if x[0] == "tag" and y[0] == "tag":
        return x[1] != y[1] or any(_json_eq(p, q) for p in x[2] for q in y[2])
    return True


def _json_eq(x: Any, y: Any) -> bool:
    return json.dumps(x, sort_keys=True) == json.dumps(y, sort_keys=True)


def _enum(s: dict[str, Any], where: str) -> list[Any]:
    vals = s["enum"]
    if not isinstance(vals, list) or not vals:
        raise SchemaError(f"{where}: enum must be a non-empty list")
    return vals


def _type_of(v: Any) -> set[str]:
    if v is None:
        return {"null"}
    if isinstance(v, bool):
        return {"boolean"}
    if isinstance(v, int) or isinstance(v, float) and v.is_integer():
        return {"integer", "number"}
    if isinstance(v, float):
        return {"number"}
    if isinstance(v, str):
        return {"string"}
    return {"array"} if isinstance(v, list) else {"object"}


def _fits(v: Any, s: dict[str, Any]) -> bool:
    """v (a const or enum value) satisfies the scalar keywords beside it (type, bounds, lengths, pattern)."""
    t = s.get("type")
    if t is not None and not (_type_of(v) & (set(t) if isinstance(t, list) else {t})):
        return False
    if _number(v):
        lo, lo_incl, hi, hi_incl = _bounds(s, "#")
        d = Decimal(str(v))
        if lo is not None and (d < lo or d == lo and not lo_incl) or hi is not None and (d > hi or d == hi and not
                                                                                          hi_incl):
            return False
    if isinstance(v, str):
        if len(v) < s.get("minLength", 0) or len(v) > s.get("maxLength", len(v)):
            return False
        if isinstance(s.get("pattern"), str):
            try:
                return re.search(s["pattern"], v) is not None
            except re.error:
                return False
    return True


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _count(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def _bounds(s: dict[str, Any], where: str) -> tuple[Decimal | None, bool, Decimal | None, bool]:
    """(low, low inclusive, high, high inclusive) from minimum / exclusiveMinimum / maximum /
    exclusiveMaximum (numbers, or draft 4's booleans that make minimum / maximum exclusive)."""
    def dec(key: str) -> Decimal | None:
        v = s.get(key)
        if v is None or isinstance(v, bool) and key.startswith("exclusive"):
            return None
        if not _number(v):
            raise SchemaError(f"{where}: {key} must be a number")
        try:
            d = Decimal(str(v))
        except InvalidOperation:
            raise SchemaError(f"{where}: {key} must be a finite number") from None
        if not d.is_finite():
            raise SchemaError(f"{where}: {key} must be a finite number")
        if abs(d) >= Decimal(10) ** MAX_DIGITS and key in ("minimum", "exclusiveMinimum") and d > 0 or \
                abs(d) >= Decimal(10) ** MAX_DIGITS and key in ("maximum", "exclusiveMaximum") and d < 0:
            raise SchemaError(f"{where}: {key} {v} is beyond the {MAX_DIGITS} digits a number may have here")
        return d

    lo, lo_incl = dec("minimum"), s.get("exclusiveMinimum") is not True
    hi, hi_incl = dec("maximum"), s.get("exclusiveMaximum") is not True
    xlo, xhi = dec("exclusiveMinimum"), dec("exclusiveMaximum")
    if xlo is not None and (lo is None or xlo >= lo):
        lo, lo_incl = xlo, False
    if xhi is not None and (hi is None or xhi <= hi):
        hi, hi_incl = xhi, False
    cap = Decimal(10) ** MAX_DIGITS
    if lo is not None and lo <= -cap:
        lo = None  # past what any number here can be: no bound
    if hi is not None and hi >= cap:
        hi = None
    return lo, lo_incl, hi, hi_incl


def _ceil(d: Decimal) -> int:
    return int(d.to_integral_value(rounding="ROUND_CEILING"))


def _floor(d: Decimal) -> int:
    return int(d.to_integral_value(rounding="ROUND_FLOOR"))


def _class_char(c: str) -> str:
    return f"\\x{ord(c):02X}" if c in "]-^[\\" else c if ord(c) > 0x20 else f"\\x{ord(c):02X}"


def _counted(item: str, lo: int, hi: int | None) -> str:
    if hi is None:
        return f"{item}{{{lo},}}" if lo else f"{item}*"
    if hi == 0:
        return ""
    return f"{item}{{{lo},{hi}}}"


def convert_schema(schema: Any, root_name: str = "root") -> Conversion:
    """GBNF for a JSON Schema (a dict or a boolean) and the notes of what it reads loosely; raises
    SchemaError naming what it refuses. root_name: the top rule's name (and its sub-rules' prefix)."""
    conv = SchemaConverter()
    try:
        root = conv.add_schema(schema, root_name)
    except RecursionError:
        raise SchemaError("the JSON schema is nested too deep") from None
    return Conversion(conv.gbnf(root_name, root), conv.notes)


def schema_to_gbnf(schema: Any, root_name: str = "root") -> str:
    """GBNF text for a JSON Schema (a dict or a boolean); raises SchemaError naming what it refuses."""
    return convert_schema(schema, root_name).gbnf

"""JSON Schema -> grammar, held to llama.cpp's converter and to the schemas themselves: every case of
llama.cpp's tests/test-json-schema-to-grammar.cpp (from the llama-cpp-python sdist) converts or is refused
as there; sentences drawn at random from each grammar validate under their schema (jsonschema); integer
and number bounds are exact at and around every bound; what cannot be enforced is refused by name."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path
from typing import Any

import jsonschema
import pytest
from conftest import skip_or_fail
from grammar_sampling import Sampler

from edgellama.grammar import SchemaError, parse, schema_grammar
from edgellama.grammar.json_schema import convert_schema
from edgellama.grammar.number_range import integer_range, number_range
from edgellama.tool_calls import ToolError, call_grammar, check_schemas, check_tools

CASE = re.compile(r'test\(\{\s*(SUCCESS|FAILURE),\s*"((?:[^"\\]|\\.)*)",\s*(?:R"""\((.*?)\)"""|"((?:[^"\\]|\\.)*)"),'
                  r'\s*(?:R"""\((.*?)\)"""|"")\s*\}\);', re.DOTALL)


def llamacpp_cases() -> list[tuple[str, str, Any]]:
    """(SUCCESS | FAILURE, name, schema) of every test({...}) in llama.cpp's converter tests."""
    from llamacpp_ref import ReferenceUnavailable, cached_sdist

    from edgellama.default_model import cache_dir

    try:
        src = cached_sdist(cache_dir()) / "vendor" / "llama.cpp" / "tests" / "test-json-schema-to-grammar.cpp"
    except ReferenceUnavailable as exc:
        skip_or_fail(str(exc))
    cases = []
    for m in CASE.finditer(Path(src).read_text()):
        text = m.group(3) if m.group(3) is not None else json.loads(f'"{m.group(4)}"')
        cases.append((m.group(1), m.group(2), json.loads(text)))
    return cases


@pytest.fixture(scope="module")
def cases() -> list[tuple[str, str, Any]]:
    found = llamacpp_cases()
    assert len(found) >= 80, f"only {len(found)} cases read: has the test file's layout changed?"
    return found


def validator(schema: Any, relaxed: list[Any]) -> Any:
    """jsonschema's validator for schema minus the keywords the conversion notes say it reads loosely
    (documented relaxations), in the draft whose meaning of `items` the schema uses."""
    schema = json.loads(json.dumps(schema))
    for note in relaxed:
        node = schema
        for part in note.where.lstrip("#").split("/")[1:]:
            node = node[int(part)] if isinstance(node, list) else node[part]
        node.pop(note.keyword)
    listy = '"items": [' in json.dumps(schema)
    cls = jsonschema.Draft7Validator if listy else jsonschema.Draft202012Validator
    return cls(_prefix_items_as_llamacpp_reads_them(schema), format_checker=cls.FORMAT_CHECKER)


def _prefix_items_as_llamacpp_reads_them(node: Any) -> Any:
    """`prefixItems` given as an object is the item schema (unless `items` is there too, which wins)."""
    if isinstance(node, list):
        return [_prefix_items_as_llamacpp_reads_them(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _prefix_items_as_llamacpp_reads_them(v) for k, v in node.items()}
    if isinstance(out.get("prefixItems"), dict):
        prefix = out.pop("prefixItems")
        out.setdefault("items", prefix)
    return out


def test_every_llamacpp_case_converts_or_is_refused_as_there(cases: list[tuple[str, str, Any]]) -> None:
    converted, refused = [], []
    for status, name, schema in cases:
        try:
            parse(convert_schema(schema).gbnf)
            converted.append(name)
        except SchemaError:
            refused.append(name)
        assert (name in converted) == (status == "SUCCESS"), (name, status)
    assert len(converted) == sum(s == "SUCCESS" for s, _, _ in cases) >= 77
    assert refused == ["unknown type", "invalid type", "regexp with unbalanced parentheses"]


def test_sentences_of_each_llamacpp_case_validate_under_its_schema(cases: list[tuple[str, str, Any]]) -> None:
    for status, name, schema in cases:
        if status != "SUCCESS":
            continue
        conv = convert_schema(schema)
        check = validator(schema, conv.notes)
        sampler = Sampler(parse(conv.gbnf), seed=len(name))
        for _ in range(40):
            text = sampler.sentence()
            errors = [e.message for e in check.iter_errors(json.loads(text))]
            assert not errors, (name, text, errors)


def test_only_the_documented_relaxations_are_noted(cases: list[tuple[str, str, Any]]) -> None:
    noted = {name: [n.keyword for n in convert_schema(schema).notes]
             for status, name, schema in cases if status == "SUCCESS"}
    assert {k: v for k, v in noted.items() if v} == {
        "unanchored regexp": ["pattern"], "unsupported regexp in a property": ["pattern"]}


# ---- bounds: exact at and around every bound ----

def _accepts(expr: str, text: str) -> bool:
    return Sampler(parse(f"root ::= {expr}\n"), 0).accepts(text)


INT_RANGES = [(0, None), (1, None), (3, None), (9, None), (10, None), (25, None), (None, 30), (None, 1), (None, 100),
              (-5, None), (-123, None), (None, -5), (0, 23), (15, 300), (5, 30), (-123, 42), (-10, 10), (0, 59),
              (0, 100), (5, 35), (-12, 207), (7, 7), (-1, -1), (0, 0), (99, 1001), (-1000, -999)]


@pytest.mark.parametrize(("lo", "hi"), INT_RANGES)
def test_integer_bounds_accept_every_integer_in_range_and_none_outside(lo: int | None, hi: int | None) -> None:
    from edgellama.grammar.matcher import ACCEPTING, CompiledGrammar

    g = CompiledGrammar(parse(f"root ::= {integer_range(lo, hi)}\n"))
    first = -1500 if lo is None else lo - 40
    last = 1500 if hi is None else hi + 40
    for v in range(first, last + 1):
        s = g.step(g.start, str(v).encode())
        got = s >= 0 and bool(g.flags(s) & ACCEPTING)
        assert got == ((lo is None or v >= lo) and (hi is None or v <= hi)), v
    for text in ("-0", "01", "00", "+1", "1.0", "1e2", ""):
        s = g.step(g.start, text.encode())
        assert not (s >= 0 and g.flags(s) & ACCEPTING), text


@pytest.mark.parametrize(("schema", "inside", "outside"), [
    ({"type": "integer", "minimum": 0, "maximum": 100}, [0, 100, 57], [-1, 101, 1000]),
    ({"type": "integer", "exclusiveMinimum": 0, "exclusiveMaximum": 10}, [1, 9], [0, 10, -3]),
    ({"type": "integer", "minimum": 0.5, "maximum": 9.5}, [1, 9], [0, 10]),  # fractional bounds round inwards
    ({"type": "integer", "minimum": 5, "exclusiveMinimum": True}, [6], [5]),  # draft 4's boolean
    ({"type": "integer", "minimum": -40, "maximum": -10}, [-40, -10, -25], [-41, -9, 0, 10]),
    ({"type": "number", "minimum": 5, "maximum": 35}, [5, 35, 21.5, 5.0, 34.999], [4.999, 35.001, -5, 350]),
    ({"type": "number", "exclusiveMinimum": 0, "maximum": 1}, [0.001, 1, 0.5], [0, -0.5, 1.0001]),
    ({"type": "number", "minimum": -2.25, "exclusiveMaximum": 3.125}, [-2.25, 0, 3.124], [-2.26, 3.125, 4]),
])
def test_bounds_at_the_boundary(schema: dict[str, Any], inside: list[Any], outside: list[Any]) -> None:
    draft4 = isinstance(schema.get("exclusiveMinimum"), bool)
    check = (jsonschema.Draft4Validator if draft4 else jsonschema.Draft202012Validator)(schema)
    sampler = Sampler(parse(convert_schema(schema).gbnf), 0)
    for v in inside:
        assert check.is_valid(v) and sampler.accepts(json.dumps(v)), v
    for v in outside:
        assert not check.is_valid(v) and not sampler.accepts(json.dumps(v)), v


@pytest.mark.parametrize(("lo", "lo_incl", "hi", "hi_incl"), [
    ("5", True, "35", True), ("0.5", True, "1.5", False), ("0", False, None, True), (None, True, "0", False),
    ("-2.25", True, "3.125", True), ("-1", False, "-0.5", True), ("0.001", True, "0.002", True),
    ("1.5", False, "1.6", False), ("-10", True, None, True), ("5", True, "5", True)])
def test_number_bounds_are_exact_on_decimals(lo: str | None, lo_incl: bool, hi: str | None, hi_incl: bool) -> None:
    import random

    dlo = None if lo is None else Decimal(lo)
    dhi = None if hi is None else Decimal(hi)
    expr = number_range(dlo, lo_incl, dhi, hi_incl)
    assert expr is not None
    sampler = Sampler(parse(f"root ::= {expr}\n"), 0)
    rng = random.Random(7)
    values = {Decimal(rng.randint(-40000, 40000)) / Decimal(10) ** rng.randint(0, 4) for _ in range(1500)}
    for b in (dlo, dhi):
        for d in ("0", "0.001", "-0.001", "0.1", "-0.1", "1", "-1", "0.0000001", "-0.0000001"):
            if b is not None:
                values.add(b + Decimal(d))
    for v in values:
        want = (dlo is None or (v >= dlo if lo_incl else v > dlo)) and (dhi is None or (v <= dhi if hi_incl else v < dhi))
        text = format(v, "f")
        for t in (text, text + ("0" if "." in text else ".000")):
            if not (t.startswith("-") and Decimal(t) == 0):
                assert sampler.accepts(t) == want, (t, want)


# ---- tool schemas: what the held-out agents send ----

TOOLS = [
    {"name": "set_light", "parameters": {"type": "object", "properties": {
        "room": {"type": "string", "enum": ["kitchen", "living room", "bedroom"]},
        "brightness": {"type": "integer", "minimum": 0, "maximum": 100}}, "required": ["room", "brightness"]}},
    {"name": "set_thermostat", "parameters": {"type": "object", "properties": {
        "celsius": {"type": "number", "minimum": 5, "maximum": 35}, "mode": {"enum": ["heat", "cool", "auto"]}},
        "required": ["celsius"], "additionalProperties": False}},
    {"name": "set_timer", "parameters": {"type": "object", "properties": {
        "minutes": {"type": "integer", "minimum": 0, "maximum": 59},
        "label": {"type": "string", "maxLength": 20, "pattern": "[a-z]"}}, "required": ["minutes"]}},
    {"name": "move", "parameters": {"$defs": {"pos": {"type": "array", "prefixItems": [
        {"type": "integer", "minimum": -10, "maximum": 10}, {"type": "integer", "minimum": -10, "maximum": 10}],
        "items": False}}, "type": "object", "properties": {"to": {"$ref": "#/$defs/pos"},
                                                         "speed": {"allOf": [{"type": "number"}, {"exclusiveMinimum": 0}]}},
        "required": ["to"]}},
    {"name": "remind", "parameters": {"type": "object", "properties": {
        "when": {"type": "string", "format": "date-time"},
        "repeat": {"anyOf": [{"type": "null"}, {"type": "string", "enum": ["daily", "weekly"]}]},
        "tags": {"type": "array", "items": {"type": "string", "minLength": 1}, "maxItems": 3}},
        "required": ["when"], "additionalProperties": {"type": "boolean"}}},
]


@pytest.mark.parametrize("tool", TOOLS, ids=[t["name"] for t in TOOLS])
def test_tool_schema_sentences_validate(tool: dict[str, Any]) -> None:
    conv = convert_schema(tool["parameters"])
    check = validator(tool["parameters"], conv.notes)
    sampler = Sampler(parse(conv.gbnf), 3)
    for _ in range(60):
        text = sampler.sentence()
        errors = [e.message for e in check.iter_errors(json.loads(text))]
        assert not errors, (text, errors)


def test_tool_calls_keep_each_tools_schema() -> None:
    """The call grammar over several tools: every sentence names a real tool and its arguments validate."""
    tools = [{"type": "function", "function": t} for t in TOOLS]
    check_tools(tools)
    sampler = Sampler(call_grammar("hermes", tools), 11)
    by_name = {t["name"]: validator(t["parameters"], convert_schema(t["parameters"]).notes) for t in TOOLS}
    for _ in range(100):
        text = sampler.sentence()
        body = text.removeprefix("<tool_call>").removesuffix("</tool_call>")
        call = json.loads(body)
        assert call["name"] in by_name
        errors = [e.message for e in by_name[call["name"]].iter_errors(call["arguments"])]
        assert not errors, (text, errors)
    # the minimum itself and one below it, through the whole call
    head = '<tool_call>{"name": "set_timer", "arguments": {"minutes": %s}}</tool_call>'
    assert sampler.accepts(head % 0) and sampler.accepts(head % 59)
    assert not sampler.accepts(head % -1) and not sampler.accepts(head % 60)
    assert not sampler.accepts('<tool_call>{"name": "set_timer", "arguments": {}}</tool_call>')  # minutes required


@pytest.mark.parametrize(("schema", "words"), [
    ({"type": "integer", "multipleOf": 5}, "'multipleOf'"),
    ({"type": "array", "uniqueItems": True}, "'uniqueItems'"),
    ({"not": {"type": "string"}}, "'not'"),
    ({"if": {"type": "string"}, "then": {"minLength": 2}}, "'if'"),
    ({"type": "object", "patternProperties": {"^a": {}}}, "'patternProperties'"),
    ({"type": "object", "minProperties": 1}, "'minProperties'"),
    ({"oneOf": [{"type": "string"}, {"type": "string", "maxLength": 2}]}, "use anyOf"),
    ({"$ref": "https://example.com/s.json"}, "only references into the same schema"),
    ({"$ref": "#/$defs/missing"}, "points to nothing"),
    ({"type": "string", "pattern": "^(a$"}, "not a valid regular expression"),
    ({"type": "integer", "minimum": 5, "maximum": 4}, "no integer lies between"),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "no value is both"),
    ({"allOf": [{"enum": ["a"]}, {"enum": ["b"]}]}, "no value in common"),
    ({"type": "thing"}, "unknown type"),
])
def test_unsupported_keywords_refused_by_name(schema: dict[str, Any], words: str) -> None:
    with pytest.raises(SchemaError) as e:
        convert_schema(schema)
    assert words in str(e.value), str(e.value)


def test_a_tool_with_an_unenforceable_schema_is_refused_naming_tool_and_keyword() -> None:
    tools = [{"type": "function", "function": {"name": "volume", "parameters": {
        "type": "object", "properties": {"level": {"type": "integer", "multipleOf": 5}}}}}]
    with pytest.raises(ToolError) as e:
        check_tools(tools)
    assert "tools[0] (volume)" in str(e.value) and "'multipleOf'" in str(e.value)
    assert "#/properties/level" in str(e.value)


def test_relaxations_are_named() -> None:
    tools = [{"type": "function", "function": {"name": "find", "parameters": {
        "type": "object", "properties": {"q": {"type": "string", "pattern": "[0-9]+"},
                                         "mail": {"type": "string", "format": "email"}}}}}]
    notes = check_schemas(tools)
    assert any("tool find #/properties/q" in n and "not anchored" in n for n in notes), notes
    assert any("'email'" in n for n in notes), notes
    _, schema_notes = schema_grammar({"type": "string", "pattern": "^(?=a)a$"})
    assert [n.keyword for n in schema_notes] == ["pattern"]


def test_schema_features_beyond_the_old_converter() -> None:
    def ok(schema: Any, good: list[str], bad: list[str]) -> None:
        sampler = Sampler(parse(convert_schema(schema).gbnf), 0)
        for t in good:
            assert sampler.accepts(t), (schema, t)
        for t in bad:
            assert not sampler.accepts(t), (schema, t)

    # $ref to any JSON pointer, ~1 escapes included
    ok({"properties": {"a/b": {"type": "integer"}, "c": {"$ref": "#/properties/a~1b"}}, "required": ["c"]},
       ['{"c":1}', '{"c":1,"a/b":2}'], ['{"c":"x"}'])
    # anyOf beside type holds in every branch; allOf merged
    ok({"type": "object", "anyOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]},
                                    {"properties": {"b": {"type": "string"}}, "required": ["b"]}]},
       ['{"a":1}', '{"b":"x"}'], ['1', '{"a":"x"}'])
    ok({"allOf": [{"type": "integer", "minimum": 0}, {"maximum": 9}]}, ["0", "9"], ["10", "-1"])
    # tuples: prefixItems and the older list-form items
    ok({"prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False}, ['["a",1]'], ['["a"]', '[1,"a"]'])
    ok({"items": [{"type": "boolean"}], "additionalItems": {"type": "null"}, "maxItems": 3},
       ["[true]", "[true,null,null]"], ["[true,null,null,null]", "[null]"])
    # extra properties never repeat a declared name
    ok({"properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "string"}},
       ['{"a":1,"b":"x"}', '{"ab":"x"}'], ['{"a":1,"a":"x"}', '{"a":"x"}'])
    # dates are real dates
    ok({"type": "string", "format": "date"}, ['"2024-02-29"', '"2023-12-31"'],
       ['"2023-02-29"', '"2023-04-31"', '"0000-01-01"', '"1900-02-29"'])

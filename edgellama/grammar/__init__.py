"""Grammar-constrained decoding: GBNF grammars (llama.cpp's format) and JSON Schema.

`grammar_from_args` turns what a user gives (GBNF text, a bundled grammar's name or a file, a JSON
Schema) into a parsed Grammar; `constrain` wraps a sampler so every token keeps the output inside it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from edgellama.grammar.json_schema import Note, SchemaError, convert_schema, schema_to_gbnf
from edgellama.grammar.parser import Grammar, GrammarError, parse

BUNDLED = Path(__file__).resolve().parent / "bundled"

__all__ = ["BUNDLED", "Grammar", "GrammarError", "SchemaError", "bundled_names", "constrain", "grammar_file",
           "grammar_from_args", "grammar_from_schema", "parse", "response_format_schema", "schema_grammar", "schema_to_gbnf"]


def bundled_names() -> list[str]:
    return sorted(p.stem for p in BUNDLED.glob("*.gbnf"))


def grammar_file(name: str) -> str:
    """GBNF text of a file, or of a bundled grammar by name (`json`, `list`, ...)."""
    path = Path(name)
    if not path.is_file():
        stem = name.removesuffix(".gbnf")
        bundled = BUNDLED / f"{stem}.gbnf"
        if "/" in name or not bundled.is_file():
            raise GrammarError(f"grammar file {name!r} not found (bundled grammars: {', '.join(bundled_names())})")
        path = bundled
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise GrammarError(f"cannot read grammar file {path}: {exc}") from None


def grammar_from_schema(schema: Any) -> Grammar:
    """A JSON Schema (dict or JSON text) -> Grammar."""
    return schema_grammar(schema)[0]


def schema_grammar(schema: Any) -> tuple[Grammar, list[Note]]:
    """A JSON Schema (dict or JSON text) -> Grammar, and the notes of what it reads loosely (docs/grammar.md)."""
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise SchemaError(f"the JSON schema is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") \
                from None
    conv = convert_schema(schema)
    return parse(conv.gbnf), conv.notes


def response_format_schema(rf: Any) -> Any:
    """OpenAI's `response_format` -> the JSON Schema it asks for, or None for text: {"type": "text"},
    {"type": "json_object"} (any JSON object, or llama-server's "schema" beside it), {"type": "json_schema",
    "json_schema": {"schema": ...}} or llama-server's {"type": "json_schema", "schema": ...}. One reading for
    the Python API and HTTP; ValueError naming what is wrong (a missing type is an error on both)."""
    if rf is None:
        return None
    if not isinstance(rf, dict) or not isinstance(rf.get("type"), str):
        raise ValueError("field 'response_format' must be an object with a 'type'")  # noqa: TRY004 - a 400, as every bad value
    kind = rf["type"]
    if kind == "text":
        return None
    if kind not in ("json_object", "json_schema"):
        raise ValueError(f"response_format type {kind!r} is not one of text, json_object, json_schema")
    schema = rf.get("schema")
    if schema is None and isinstance(rf.get("json_schema"), dict):
        schema = rf["json_schema"].get("schema")
    if schema is None:
        if kind == "json_schema":
            raise ValueError("response_format json_schema needs a 'json_schema': {'schema': {...}}")
        schema = {"type": "object"}
    return schema


def grammar_from_args(grammar: str | None = None, grammar_file_name: str | None = None,
                      json_schema: Any = None) -> Grammar | None:
    """At most one of: GBNF text, a grammar file (or bundled name), a JSON Schema (dict, JSON text, or
    @FILE). None when none is given. Raises GrammarError / SchemaError naming the problem."""
    given = [x is not None and x != "" for x in (grammar, grammar_file_name, json_schema)]
    if sum(given) > 1:
        raise GrammarError("give one of a grammar, a grammar file or a JSON schema")
    if grammar:
        return parse(grammar)
    if grammar_file_name:
        return parse(grammar_file(grammar_file_name))
    if json_schema is not None and json_schema != "":
        if isinstance(json_schema, str) and json_schema.startswith("@"):
            try:
                json_schema = Path(json_schema[1:]).read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as exc:
                raise SchemaError(f"cannot read the JSON schema file {json_schema[1:]}: {exc}") from None
        return grammar_from_schema(json_schema)
    return None


def constrain(sampler: Any, grammar: Any, tokenizer: Any) -> Any:
    """sampler wrapped so that it only draws tokens that keep the output inside grammar (a Grammar, or a
    lazy.LazyGrammar: from its trigger on)."""
    from edgellama.grammar.lazy import LazyGrammar, LazyGrammarSampler
    from edgellama.grammar.sampler import grammar_sampler

    if isinstance(grammar, LazyGrammar):
        return LazyGrammarSampler(sampler, grammar, tokenizer)
    return grammar_sampler(sampler, grammar, tokenizer)

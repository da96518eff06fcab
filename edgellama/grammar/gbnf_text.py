"""What the JSON-Schema modules share: the error they raise and how a text becomes a GBNF literal."""

from __future__ import annotations

import json
from typing import Any

MAX_ITEMS_EXPANDED = 1000  # minItems / maxLength / {m,n} beyond this are refused (each copy is grammar)


class SchemaError(ValueError):
    """A schema this converter cannot turn into a grammar; the message names the keyword and where."""


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

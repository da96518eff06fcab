"""`allOf` as one schema: the branches' keywords merged so that a value valid under the merge is valid under
every branch (types intersected, bounds tightened, enums intersected, properties merged with what each
branch's additionalProperties allows, anyOf distributed). What cannot be merged exactly (two different
patterns, formats or oneOfs) is refused by name. Knows schemas only: no grammar.
"""

from __future__ import annotations

from typing import Any

from edgellama.grammar.gbnf_text import SchemaError

# annotations: they describe, they do not constrain
ANNOTATIONS = frozenset({"title", "description", "$schema", "$id", "$comment", "default", "examples", "deprecated",
                         "readOnly", "writeOnly", "$defs", "definitions", "$anchor", "contentMediaType",
                         "contentEncoding", "discriminator", "x-order"})
_LOWER = ("minimum", "minLength", "minItems")
_UPPER = ("maximum", "maxLength", "maxItems")


def both(a: Any, b: Any) -> Any:
    """A schema that holds where a and b both hold (True is neutral, False absorbs)."""
    if a is True or a == {}:
        return b
    if b is True or b == {}:
        return a
    if a is False or b is False:
        return False
    return {"allOf": [a, b]}


def merge(a: dict[str, Any], b: dict[str, Any], where: str) -> dict[str, Any]:
    """One schema equal to allOf [a, b] (neither holds $ref or allOf: the caller resolves those first)."""
    out = {k: v for k, v in a.items() if k not in ANNOTATIONS}
    for k, v in b.items():
        if k in ANNOTATIONS:
            continue
        if k not in out:
            out[k] = v
            continue
        u = out[k]
        if k == "type":
            ua, vb = (u if isinstance(u, list) else [u]), (v if isinstance(v, list) else [v])
            common = [t for t in ua if t in vb or (t == "integer" and "number" in vb)]
            common += [t for t in vb if t == "integer" and "number" in ua and t not in common]
            if not common:
                raise SchemaError(f"{where}: allOf asks for type {u!r} and type {v!r}: no value is both")
            out[k] = common if len(common) > 1 else common[0]
        elif k in _LOWER or k == "exclusiveMinimum" and not isinstance(v, bool):
            out[k] = max(u, v)
        elif k in _UPPER or k == "exclusiveMaximum" and not isinstance(v, bool):
            out[k] = min(u, v)
        elif k == "required":
            out[k] = list(u) + [x for x in v if x not in u]
        elif k == "enum":
            out[k] = [x for x in u if any(_same(x, y) for y in v)]
            if not out[k]:
                raise SchemaError(f"{where}: allOf's enums have no value in common")
        elif k == "anyOf":
            out[k] = [merge_refless(x, y, where) for x in u for y in v]
        elif k in ("items", "additionalItems"):
            out[k] = both(u, v)
        elif k in ("properties", "additionalProperties"):
            continue  # below, together
        elif not _same(u, v):
            raise SchemaError(f"{where}: allOf with two different {k!r} is not supported")
    if any(k in x for x in (a, b) for k in ("properties", "additionalProperties")):
        _merge_object(a, b, out, where)
    return out


def merge_refless(a: Any, b: Any, where: str) -> Any:
    """merge for two anyOf branches (they may be booleans); branches holding $ref or allOf are kept whole
    under a new allOf, which the converter resolves."""
    if a is True or a == {}:
        return b
    if b is True or b == {}:
        return a
    if not isinstance(a, dict) or not isinstance(b, dict) or any(k in x for x in (a, b) for k in ("$ref", "allOf")):
        return both(a, b)
    return merge(a, b, where)


def _merge_object(a: dict[str, Any], b: dict[str, Any], out: dict[str, Any], where: str) -> None:
    pa, pb = a.get("properties", {}), b.get("properties", {})
    xa, xb = a.get("additionalProperties", True), b.get("additionalProperties", True)
    if not isinstance(pa, dict) or not isinstance(pb, dict):
        raise SchemaError(f"{where}: properties must be an object")
    required = set(out.get("required", []))
    props: dict[str, Any] = {}
    for name in list(pa) + [n for n in pb if n not in pa]:
        sa = pa.get(name, xa)
        sb = pb.get(name, xb)
        if sa is False or sb is False:  # a branch that forbids this name
            if name in required:
                raise SchemaError(f"{where}: allOf requires property {name!r}, which one branch forbids")
            continue
        props[name] = both(sa, sb)
    out["properties"] = props
    extra = both(xa, xb)
    if extra is True:
        out.pop("additionalProperties", None)
    else:
        out["additionalProperties"] = extra


def _same(x: Any, y: Any) -> bool:
    """JSON equality (1 == 1.0, but True is not 1)."""
    if isinstance(x, bool) or isinstance(y, bool):
        return isinstance(x, bool) and isinstance(y, bool) and x == y
    if isinstance(x, dict) and isinstance(y, dict):
        return x.keys() == y.keys() and all(_same(x[k], y[k]) for k in x)
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(_same(p, q) for p, q in zip(x, y))
    if isinstance(x, (int, float)) and isinstance(y, (int, float)):
        return x == y
    return type(x) is type(y) and bool(x == y)

"""OpenAI tool calls on a model's own call format: which format a chat template speaks (Hermes
`<tool_call>{json}</tool_call>` for Qwen2.5 / Qwen3 / SmolLM3, Llama 3.x JSON and `<|python_tag|>`, Mistral
`[TOOL_CALLS][...]`, or llama.cpp's generic JSON for a template without tools), the grammar of a call built
from the tools' JSON schemas (so a required call always parses: a tool's name and arguments its schema
validates), and the parse of a reply into content and calls.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

MAX_TOOLS = 128
FORMATS = ("hermes", "llama3", "mistral", "generic")
# where a call starts in a reply: the auto grammar's triggers, and where a streamed reply is withheld from
# (the generic format's reply is JSON: withheld whole)
TRIGGERS = {"hermes": ("<tool_call>", "```json"), "llama3": ("<|python_tag|>",), "mistral": ("[TOOL_CALLS]",),
            "generic": ()}
# small Hermes-format models (Qwen2.5-Coder 0.5B) often write the call as a ```json block or bare JSON instead of
# inside <tool_call>: both are parsed as calls; a ```json block is also a trigger of the auto grammar, bare JSON
# is not (the model also answers plain questions with call-shaped JSON: constraining that would force a tool)
JSON_START = {"llama3"}  # formats whose calls are bare JSON: a reply opening with `{` triggers the grammar
HOLD_JSON = {"hermes", "llama3"}  # formats where a streamed reply opening with `{` is held until it ends


HERMES_CALL = '"<tool_call>" "\\n"? tool-call "\\n"? "</tool_call>"'  # GBNF of one Hermes call


class ToolError(ValueError):
    """tools / tool_choice / tool messages a client sent that cannot be served; the message names what."""


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI carries it
    id: str

    def openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def check_tools(tools: Any, notes: list[str] | None = None) -> list[dict[str, Any]]:
    """OpenAI's `tools`: [{"type": "function", "function": {"name", "description"?, "parameters"?}}], each
    one's schema converted (check_schemas); notes, when given, receives what the grammars read loosely."""
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise ToolError(f"field 'tools' must be a list of up to {MAX_TOOLS} tools")
    names = set()
    for i, t in enumerate(tools):
        fn = t.get("function") if isinstance(t, dict) else None
        if not isinstance(t, dict) or t.get("type", "function") != "function" or not isinstance(fn, dict):
            raise ToolError(f"tools[{i}] must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}")
        name = fn.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.:-]{1,64}", name):
            raise ToolError(f"tools[{i}].function.name must be 1-64 letters, digits, _ . : -")
        if name in names:
            raise ToolError(f"tools[{i}]: the name {name!r} is given twice")
        if name in ("auto", "none", "required"):
            raise ToolError(f"tools[{i}]: {name!r} is a tool_choice value, not a tool name")
        names.add(name)
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise ToolError(f"tools[{i}].function.parameters must be a JSON Schema object")
    found = check_schemas(tools)
    if notes is not None:
        notes += found
    return tools


def check_choice(choice: Any, tools: list[dict[str, Any]]) -> str:
    """tool_choice -> "auto", "none", "required", or the name of the one function to call."""
    if choice is None:
        return "auto" if tools else "none"
    if choice in ("auto", "none", "required"):
        if choice == "required" and not tools:
            raise ToolError("tool_choice 'required' needs tools")
        return str(choice)
    if isinstance(choice, dict) and isinstance(choice.get("function"), dict):
        name = choice["function"].get("name")
        if name in {t["function"]["name"] for t in tools}:
            return str(name)
        raise ToolError(f"tool_choice names {name!r}, which is not one of the tools")
    raise ToolError("field 'tool_choice' must be auto, none, required or {\"type\": \"function\", \"function\": "
                    "{\"name\": ...}}")


def format_of(template: str) -> str:
    """The call format a chat template speaks (llama.cpp's detection, by the markers it writes)."""
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|python_tag|>" in template or ("<|start_header_id|>" in template and "tools" in template):
        return "llama3"
    return "generic"


def template_has_tools(template: str) -> bool:
    return "tools" in template


def generic_system(tools: list[dict[str, Any]]) -> str:
    """The system text that tells a model without a tool template how to call (llama.cpp's generic form)."""
    return ("You can call these tools. To call one, answer with only a JSON object "
            '{"tool_call": {"name": <tool name>, "arguments": <arguments object>}}; otherwise answer with '
            '{"response": <your answer as a string>}.\nTools:\n'
            + "\n".join(json.dumps(t["function"], ensure_ascii=False) for t in tools))


def _params(fn: dict[str, Any]) -> Any:
    return fn.get("parameters") or {"type": "object", "properties": {}}


def check_schemas(tools: list[dict[str, Any]]) -> list[str]:
    """Every tool's parameters converted to a grammar before anything is generated: a keyword the grammar
    cannot express is a ToolError naming the tool and the keyword (never a silent any-object); returns
    the notes of what is read loosely (an unanchored pattern: any string), each naming its tool."""
    from edgellama.grammar.json_schema import SchemaError, convert_schema

    notes = []
    for i, t in enumerate(tools):
        name = t["function"]["name"]
        try:
            conv = convert_schema(_params(t["function"]), "args")
        except SchemaError as exc:
            raise ToolError(f"tools[{i}] ({name}): its parameters schema cannot be enforced: {exc}") from None
        notes += [f"tool {name} {n}" for n in conv.notes]
    return notes


def _call_rules(fmt: str, tools: list[dict[str, Any]], only: str | None) -> str:
    """GBNF of one call's JSON, rule `tool-call`: a tool's name and arguments its schema validates (each
    tool's schema its own document, so its $refs stay inside it)."""
    from edgellama.grammar.json_schema import SchemaConverter, literal

    key = "parameters" if fmt == "llama3" else "arguments"
    conv = SchemaConverter()
    space = conv.prim("space")
    alts = []
    for i, t in enumerate(tools):
        name = t["function"]["name"]
        if only is not None and name != only:
            continue
        args = conv.add_schema(_params(t["function"]), f"tool-{i}-args", f"tools[{i}] ({name}).parameters")
        head = literal(json.dumps(name, ensure_ascii=False))
        alts.append(conv.add(f"tool-{i}", f'"{{" {space} "\\"name\\"" {space} ":" {space} {head} {space} "," '
                                          f'{space} "\\"{key}\\"" {space} ":" {space} {args} "}}" {space}'))
    return conv.gbnf("tool-call", " | ".join(alts))


def call_grammar(fmt: str, tools: list[dict[str, Any]], only: str | None = None, parallel: bool = False) -> Any:
    """The grammar of a reply that is a call (or, parallel, several) to one of tools (only: that one):
    the format's markers around JSON whose name is a tool's and whose arguments its schema validates."""
    from edgellama.grammar import parse

    body = _call_rules(fmt, tools, only)
    many = parallel and fmt in ("hermes", "mistral")
    if fmt == "hermes":
        one = HERMES_CALL
        root = f'root ::= {one} ( "\\n"? {one} )*' if many else f"root ::= {one}"
    elif fmt == "mistral":
        root = 'root ::= "[TOOL_CALLS]" "[" tool-call ( "," " "? tool-call )* "]"' if many else \
            'root ::= "[TOOL_CALLS]" "[" tool-call "]"'
    elif fmt == "llama3":
        root = 'root ::= "<|python_tag|>"? tool-call'
    else:
        root = 'root ::= "{" " "? "\\"tool_call\\"" " "? ":" " "? tool-call " "? "}"'
    return parse(root + "\n" + body)


def choice_grammar(fmt: str, tools: list[dict[str, Any]], choice: str, parallel: bool = False) -> Any:
    """The constraint of a reply under tool_choice (auto, required, or a function's name; not none)."""
    if choice == "auto":
        return auto_grammar(fmt, tools, parallel)
    return call_grammar(fmt, tools, None if choice == "required" else choice, parallel)


def auto_grammar(fmt: str, tools: list[dict[str, Any]], parallel: bool = False) -> Any:
    """tool_choice auto: free text, but a call that begins (the format's marker, or a reply opening with
    JSON where calls are bare JSON) is held to the call grammar; the generic format's whole reply is its
    JSON: a call, or {"response": text}."""
    from edgellama.grammar import parse
    from edgellama.grammar.json_schema import schema_to_gbnf
    from edgellama.grammar.lazy import LazyGrammar

    if fmt == "generic":
        answer = schema_to_gbnf({"type": "object", "properties": {"response": {"type": "string"}},
                                 "required": ["response"], "additionalProperties": False}, "answer")
        root = 'root ::= "{" " "? "\\"tool_call\\"" " "? ":" " "? tool-call " "? "}" | answer'
        return parse(_merged(root, _call_rules(fmt, tools, None), answer))
    if fmt == "hermes":  # its other forms: a ```json block, bare JSON
        one = HERMES_CALL
        rest = f'( "\\n"? {one} )*' if parallel else ""
        root = f'root ::= {one} {rest} | "```json" "\\n"? tool-call "\\n"? "```"'
        grammar = parse(root + "\n" + _call_rules(fmt, tools, None))
    else:  # the call grammar itself (built once: each tool's schema converted once)
        grammar = call_grammar(fmt, tools, None, parallel)
    return LazyGrammar(grammar, TRIGGERS[fmt], json_start=fmt in JSON_START)


def _merged(*texts: str) -> str:
    """GBNF texts joined, each rule once (schema grammars share helpers such as `space` and `string`)."""
    seen: dict[str, str] = {}
    for text in texts:
        for line in text.splitlines():
            name = line.split("::=", 1)[0].strip()
            if line.strip() and name not in seen:
                seen[name] = line
    return "\n".join(seen.values()) + "\n"


_DEC = json.JSONDecoder()


def skip_space(text: str, i: int, extra: str = "") -> int:
    while i < len(text) and text[i] in " \t\r\n" + extra:
        i += 1
    return i


def _objects(text: str) -> list[tuple[int, int, Any]]:
    """(start, end, value) of the JSON values that follow each other in text (whitespace and ; between)."""
    out, i = [], 0
    while i < len(text):
        i = skip_space(text, i, ";,")
        if i >= len(text) or text[i] not in "{[":
            break
        try:
            value, end = _DEC.raw_decode(text, i)
        except json.JSONDecodeError:
            break
        out.append((i, end, value))
        i = end
    return out


def scan(text: str, i: int) -> tuple[list[tuple[str | None, int, int | None]], int | None]:
    """The members of the JSON object (or the elements of the array) opening at text[i], as far as text goes:
    [(key, or None in an array; value start; value end, None while unfinished)], and where it closes (None:
    not yet; -1: not JSON). A value that ends with the text and could still grow (a number) is unfinished."""
    close = "}" if text[i] == "{" else "]"
    out: list[tuple[str | None, int, int | None]] = []
    j = skip_space(text, i + 1)
    if j < len(text) and text[j] == close:
        return out, j + 1
    while j < len(text):
        key = None
        if close == "}":
            if text[j] != '"':
                return out, -1
            try:
                key, j = _DEC.raw_decode(text, j)
            except json.JSONDecodeError:
                return out, None  # the key is still being written
            j = skip_space(text, j)
            if j >= len(text):
                return out, None
            if text[j] != ":":
                return out, -1
            j = skip_space(text, j + 1)
        try:
            end = _DEC.raw_decode(text, j)[1]
        except json.JSONDecodeError:
            out.append((key, j, None))
            return out, None
        if end == len(text) and text[j] not in '{["':
            out.append((key, j, None))
            return out, None
        out.append((key, j, end))
        j = skip_space(text, end)
        if j >= len(text):
            return out, None
        if text[j] == ",":
            j = skip_space(text, j + 1)
        elif text[j] == close:
            return out, j + 1
        else:
            return out, -1
    return out, None


def _value(text: str, span: tuple[int, int | None] | None) -> Any:
    return json.loads(text[span[0]:span[1]]) if span is not None and span[1] is not None else None


def call_parts(text: str, i: int) -> tuple[str | None, tuple[int, int | None] | None,
                                             dict[str | None, tuple[int, int | None]], int | None]:
    """The call object at text[i] as far as it is written: its name once whole, the span of its arguments
    ("arguments", else "parameters"; end None while unfinished), its members' spans, where it closes (scan)."""
    members, end = scan(text, i)
    spans = {k: (s, e) for k, s, e in members}
    name = _value(text, spans.get("name"))
    return (name if isinstance(name, str) else None), spans.get("arguments", spans.get("parameters")), spans, end


def _call_at(text: str, i: int, names: set[str], fmt: str = "") -> ToolCall | None:
    """The call written as the JSON object at text[i] ({"name", "arguments" or "parameters"}, or OpenAI's
    {"type": "function", "function": {...}}), its arguments the model's own JSON text (so streamed deltas of
    that text add up to it), or None."""
    name, args, spans, end = call_parts(text, i)
    if end is None or end < 0:
        return None
    if "function" in spans and text[spans["function"][0]] == "{":
        return _call_at(text, spans["function"][0], names, fmt)
    if name is None or name not in names or args is None:
        return None
    raw = text[args[0]:args[1]]  # closed object: every member's end is known
    arguments = json.loads(raw) if raw.startswith('"') else raw  # arguments given as JSON text
    call_ref = _value(text, spans.get("id"))
    return ToolCall(name, str(arguments), call_ref if isinstance(call_ref, str) and call_ref else call_id(fmt))


def _xml_call(body: str, names: set[str]) -> ToolCall | None:
    """Qwen3-Coder's form inside <tool_call>: <function=NAME><parameter=KEY>VALUE</parameter>...</function>
    (a value that reads as JSON is that JSON, else the text)."""
    m = re.fullmatch(r"\s*<function=([^>\n]+)>(.*?)</function>\s*", body, flags=re.DOTALL)
    if m is None:
        return None
    args: dict[str, Any] = {}
    for key, value in re.findall(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", m.group(2), flags=re.DOTALL):
        try:
            args[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            args[key.strip()] = value
    return _call({"name": m.group(1).strip(), "arguments": args}, names)


def call_id(fmt: str) -> str:
    """A new call's id: Mistral's templates want 9 letters and digits; others take OpenAI's call_ form."""
    if fmt == "mistral":
        return "".join(secrets.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") for _ in range(9))
    return "call_" + secrets.token_urlsafe(12)


def _call(obj: Any, names: set[str], key: str = "arguments", fmt: str = "") -> ToolCall | None:
    if not isinstance(obj, dict):
        return None
    if isinstance(obj.get("function"), dict):  # {"type": "function", "function": {...}}
        obj = obj["function"]
    name = obj.get("name")
    args = obj.get(key, obj.get("arguments", obj.get("parameters")))
    if not isinstance(name, str) or name not in names or args is None:
        return None
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return ToolCall(name, text, str(obj.get("id") or call_id(fmt)))


def _calls_at(text: str, starts: list[int], names: set[str], fmt: str = "") -> list[ToolCall] | None:
    """The calls written as the JSON objects starting at starts, or None unless every one is a call."""
    calls = [_call_at(text, i, names, fmt) if text[i] == "{" else None for i in starts]
    return [c for c in calls if c is not None] if calls and None not in calls else None


def parse_reply(text: str, fmt: str, tools: list[dict[str, Any]]) -> tuple[str, list[ToolCall]]:
    """A reply -> (its content, the calls in it); text that does not parse as a call stays content. A call's
    arguments are the JSON text the model wrote."""
    names = {t["function"]["name"] for t in tools}
    if fmt == "hermes":
        return _parse_hermes(text, names)
    if fmt == "mistral":
        return _parse_mistral(text, names)
    if fmt == "llama3":
        body = text.split("<|python_tag|>", 1)[1] if "<|python_tag|>" in text else text
        found = _objects(body)
        calls = _calls_at(body, [i for i, _, _ in found], names) if found else None
        return ("", calls) if calls and not body[found[-1][1]:].strip() else (text, [])
    found = _objects(text)  # generic: {"tool_call": {...}}, {"tool_calls": [...]} or {"response": text}
    if len(found) == 1 and isinstance(found[0][2], dict):
        members, _ = scan(text, found[0][0])
        spans = {k: (s, e) for k, s, e in members}
        obj = found[0][2]
        if isinstance(obj.get("tool_call"), dict):
            calls = _calls_at(text, [spans["tool_call"][0]], names)
            if calls:
                return "", calls
        if isinstance(obj.get("tool_calls"), list):
            calls = _calls_at(text, [s for _, s, _ in scan(text, spans["tool_calls"][0])[0]], names)
            if calls:
                return "", calls
        if isinstance(obj.get("response"), str):
            return obj["response"], []
    if not found:  # an answer cut short: its text, not the JSON around it
        answer = generic_response(text)
        if answer is not None:
            return answer, []
    return text, []


_OPEN_ESCAPE = re.compile(r"(?<!\\)((?:\\\\)*)\\(?:u[0-9a-fA-F]{0,3})?$")
_HIGH_SURROGATE = re.compile(r"\\u[dD][89abAB][0-9a-fA-F]{2}$")


def partial_string(text: str, start: int, end: int | None) -> str | None:
    """The JSON string at text[start] decoded as far as it is written (an escape being written held back)."""
    if end is not None:
        value = json.loads(text[start:end])
        return value if isinstance(value, str) else None
    body = _HIGH_SURROGATE.sub("", _OPEN_ESCAPE.sub(r"\1", text[start + 1:]))
    try:
        value = json.loads('"' + body + '"', strict=False)
    except json.JSONDecodeError:
        return None
    return value if isinstance(value, str) else None


def generic_response(text: str) -> str | None:
    """The generic format's answer {"response": "..."} as far as it is written (a reply cut by the token
    limit included), or None when text is not that answer."""
    j = skip_space(text, 0)
    if text[j:j + 1] != "{":
        return None
    members, _ = scan(text, j)
    if not members or members[0][0] != "response" or text[members[0][1]:members[0][1] + 1] != '"':
        return None
    return partial_string(text, members[0][1], members[0][2])


def _parse_hermes(text: str, names: set[str]) -> tuple[str, list[ToolCall]]:
    parts = re.split(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", text, flags=re.DOTALL)
    content = parts[0]
    calls: list[ToolCall] = []
    for i in range(1, len(parts), 2):
        found = _objects(parts[i])
        got = _calls_at(parts[i], [found[0][0]], names) if found else None
        call = got[0] if got else (None if found else _xml_call(parts[i], names))
        if call is None:
            return text, []
        calls.append(call)
        content += parts[i + 1] if i + 1 < len(parts) else ""
    if calls:
        return content.strip(), calls
    fenced = re.fullmatch(r"\s*```(?:json)?\s*(.*?)\s*```\s*", text, flags=re.DOTALL)
    body = fenced.group(1) if fenced else text
    found = _objects(body)
    got = _calls_at(body, [i for i, _, _ in found], names) if found else None
    if got and not body[found[-1][1]:].strip() and not body[:found[0][0]].strip():
        return "", got
    return text, []


def _parse_mistral(text: str, names: set[str]) -> tuple[str, list[ToolCall]]:
    head, sep, rest = text.partition("[TOOL_CALLS]")
    if not sep:
        return text, []
    calls: list[ToolCall] = []
    if "[ARGS]" in rest:  # newer Mistral templates: [TOOL_CALLS]name[ARGS]{...} (or name[CALL_ID]id[ARGS]), repeated
        for piece in text[len(head):].split("[TOOL_CALLS]")[1:]:
            name, _, args = piece.partition("[ARGS]")
            name, _, ref = name.partition("[CALL_ID]")
            found = _objects(args)
            if not found or name.strip() not in names:
                return text, []
            calls.append(ToolCall(name.strip(), args[found[0][0]:found[0][1]], ref.strip() or call_id("mistral")))
        return head.strip(), calls
    found = _objects(rest)
    if found and isinstance(found[0][2], list):
        starts = [s for _, s, _ in scan(rest, found[0][0])[0]]
    else:
        starts = [i for i, _, _ in found]
    got = _calls_at(rest, starts, names, "mistral") if starts else None
    return (head.strip(), got) if got else (text, [])


def call_format(template: str) -> str:
    """The format a chat template (its source; "" for a hand-written format) calls tools in."""
    return format_of(template) if "tools" in template else "generic"


def prepare(template: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]], args_as_text: bool = False,
            system_in_user: bool = False) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, the template's `tools`) for a chat with tools: a template with tool support gets them as
    they are (calls' arguments as objects, or args_as_text: OpenAI's JSON text); another gets llama.cpp's
    generic system text, calls and results written as that JSON. system_in_user: a system message's text
    goes to the start of the first user turn (for a template without a system role)."""
    if call_format(template) != "generic":
        turns = messages if args_as_text else template_messages(messages)
        return (_system_in_user(turns) if system_in_user else turns), tools or None
    out: list[dict[str, Any]] = []
    for m in messages:
        if m.get("role") == "tool":
            out.append({"role": "user", "content": json.dumps(
                {"tool_response": {"tool_call_id": m.get("tool_call_id"), "content": m.get("content")}},
                ensure_ascii=False)})
        elif m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                     for c in template_messages([m])[0]["tool_calls"]]
            body = {"tool_call": calls[0]} if len(calls) == 1 else {"tool_calls": calls}
            out.append({"role": "assistant", "content": json.dumps(body, ensure_ascii=False)})
        else:
            out.append({k: v for k, v in m.items() if k in ("role", "content")})
    if tools:
        text = generic_system(tools)
        if out and out[0].get("role") == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{text}"}
        else:
            out.insert(0, {"role": "system", "content": text})
    return (_system_in_user(out) if system_in_user else out), None


def _system_in_user(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not messages or messages[0].get("role") != "system":
        return messages
    system, rest = messages[0], list(messages[1:])
    for i, m in enumerate(rest):
        if m.get("role") == "user":
            rest[i] = dict(m, content=f"{system['content']}\n\n{m.get('content', '')}")
            return rest
    return [{"role": "user", "content": system["content"]}, *rest]


def template_messages(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Messages as chat templates read them (transformers' convention): a tool call's arguments an
    object, not OpenAI's JSON text."""
    out = []
    for m in messages:
        if m.get("tool_calls"):
            m = dict(m, tool_calls=[_template_call(tc) for tc in m["tool_calls"]])
        out.append(m)
    return out


def _template_call(tc: dict[str, Any]) -> dict[str, Any]:
    fn = dict(tc.get("function") or {})
    if isinstance(fn.get("arguments"), str):
        try:
            fn["arguments"] = json.loads(fn["arguments"])
        except json.JSONDecodeError:
            pass
    return dict(tc, function=fn, type=tc.get("type", "function"))

"""edgellama.tool_stream: a reply with tools fed piece by piece releases its content and its calls' OpenAI
deltas; the deltas add up to the calls the whole reply parses into (tool_calls.parse_reply), whatever the
pieces' sizes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from edgellama.tool_calls import parse_reply
from edgellama.tool_stream import ToolStream

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "set_timer", "parameters": {
        "type": "object", "properties": {"minutes": {"type": "integer"}}, "required": ["minutes"]}}},
]

REPLIES = [
    ("hermes", ('Let me look. <tool_call>\n{"name": "get_weather", "arguments": {"city": "S\\u00e3o \\"Paulo\\""}}\n'
               '</tool_call>\n<tool_call>\n{"name": "set_timer", "arguments": {"minutes": 125}}\n</tool_call>'),
     "Let me look.", [("get_weather", {"city": 'São "Paulo"'}), ("set_timer", {"minutes": 125})]),
    ("hermes", '```json\n{"name": "set_timer", "arguments": {"minutes": 5}}\n```', "", [("set_timer", {"minutes": 5})]),
    ("llama3", '<|python_tag|>{"name": "set_timer", "parameters": {"minutes": 10}}', "", [("set_timer", {"minutes": 10})]),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Oslo"}}', "", [("get_weather", {"city": "Oslo"})]),
    ("mistral", ('[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Oslo"}}, '
                '{"name": "set_timer", "arguments": {"minutes": 3}}]'), "",
     [("get_weather", {"city": "Oslo"}), ("set_timer", {"minutes": 3})]),
    ("generic", '{"tool_call": {"name": "get_weather", "arguments": {"city": "Rome"}}}', "",
     [("get_weather", {"city": "Rome"})]),
    ("generic", '{"response": "Hi \\"you\\", caf\\u00e9 \\ud83d\\ude00\\n\\\\ end"}', 'Hi "you", café 😀\n\\ end', []),
]


def _run(stream: ToolStream, text: str, size: int) -> tuple[str, list[dict[str, Any]], Any]:
    """Feed text in pieces of size; the content released and the calls assembled from the deltas."""
    content, calls, n_deltas = "", {}, 0

    def take(deltas: list[dict[str, Any]]) -> None:
        nonlocal n_deltas
        for d in deltas:
            n_deltas += 1
            call = calls.setdefault(d["index"], {"id": None, "name": None, "arguments": ""})
            if "id" in d:
                assert call["id"] is None, "a call's id and name come once, in its first delta"
                call["id"], call["name"] = d["id"], d["function"]["name"]
            call["arguments"] += d.get("function", {}).get("arguments", "")

    for i in range(0, len(text), size):
        piece, deltas = stream.feed(text[i:i + size])
        content += piece
        take(deltas)
    end = stream.finish()
    take(end.deltas)
    return content + end.rest, [calls[k] for k in sorted(calls)], (end, n_deltas)


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), REPLIES)
@pytest.mark.parametrize("size", [1, 2, 5, 1000])
def test_deltas_add_up_to_the_parsed_calls(fmt: str, text: str, content: str, calls: list[Any], size: int) -> None:
    streamed, got, (end, n_deltas) = _run(ToolStream(fmt, TOOLS), text, size)
    assert streamed.strip() == content == end.content
    assert [(c["name"], json.loads(c["arguments"])) for c in got] == calls
    assert [(c["id"], c["name"], c["arguments"]) for c in got] == [(c.id, c.name, c.arguments) for c in end.calls]
    parsed = parse_reply(text, fmt, TOOLS)[1]  # the same text as the non-streamed reply's
    assert [(c.name, c.arguments) for c in parsed] == [(c["name"], c["arguments"]) for c in got]
    if calls and size == 1:  # arguments arrive while they are written, not at the end
        assert n_deltas > 2 * len(calls) and not end.deltas
    if calls:
        assert end.finish_reason("stop") == "tool_calls" and end.finish_reason("length") == "length"


def test_content_before_a_call_streams_and_a_marker_in_the_making_is_held() -> None:
    stream = ToolStream("hermes", TOOLS)
    assert stream.feed("It is ") == ("It is ", [])
    assert stream.feed("sunny <tool") == ("sunny ", [])  # "<tool" may begin <tool_call>
    assert stream.feed("_call>\n{\"name\": \"get_we") == ("", [])  # the name is not whole yet
    piece, deltas = stream.feed("ather\", \"arguments\": {\"ci")
    assert piece == "" and deltas[0]["function"] == {"name": "get_weather", "arguments": '{"ci'}
    assert "id" in deltas[0] and deltas[0]["index"] == 0


def test_a_call_cut_by_the_token_limit_stands_as_streamed() -> None:
    stream = ToolStream("hermes", TOOLS)
    _, deltas = stream.feed('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Ber')
    end = stream.finish()
    assert end.calls[0].name == "get_weather" and end.calls[0].arguments == '{"city": "Ber'
    assert end.calls[0].id == deltas[0]["id"] and end.rest == "" and end.content == ""
    assert end.finish_reason("length") == "length"


def test_calls_not_held_by_the_grammar_arrive_whole_at_the_end() -> None:
    """live=False (the client's own grammar or response_format): nothing that may be a call is sent early."""
    stream = ToolStream("hermes", TOOLS, live=False)
    text = '<tool_call>\n{"name": "set_timer", "arguments": {"minutes": 2}}\n</tool_call>'
    assert all(stream.feed(c) == ("", []) for c in text)
    end = stream.finish()
    assert end.deltas == [{"index": 0, **end.calls[0].openai()}]
    assert json.loads(end.calls[0].arguments) == {"minutes": 2}


def test_a_plain_answer_streams_as_content() -> None:
    stream = ToolStream("hermes", TOOLS)
    out = "".join(stream.feed(c)[0] for c in "Paris is in France.")
    end = stream.finish()
    assert out + end.rest == "Paris is in France." and not end.calls and end.finish_reason("stop") == "stop"
    held = ToolStream("hermes", TOOLS)  # a reply opening with `{` may be a bare JSON call: held to its end
    assert held.feed('{"a": 1}') == ("", []) and held.finish().rest == '{"a": 1}'


def test_a_generic_answer_cut_by_the_token_limit_is_its_text_not_its_json() -> None:
    """Not streamed, a `{"response": ...` cut short gives the answer as far as written (no JSON wrapper),
    the same text the stream gave; an escape being written is held back."""
    for cut, text in (('{"response": "The capital is Par', "The capital is Par"),
                      ('{"response": "caf\\u00e', "caf"), ('{"response": "a\\nb', "a\nb")):
        assert parse_reply(cut, "generic", TOOLS) == (text, [])
        s = ToolStream("generic", TOOLS)
        streamed = "".join(s.feed(ch)[0] for ch in cut)
        assert streamed == text and s.finish().content == text

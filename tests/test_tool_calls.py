"""Tool calls (issue 36): each family's call format parsed, the grammar of a required call, llama.cpp's own
chat templates rendered with tools and tool turns by edgellama's sandbox, and (slow set) Qwen2.5-Coder-0.5B-
Instruct calling a tool over the socket with the openai SDK: the call, the tool's result, the answer."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from edgellama.tool_calls import (
    ToolError,
    call_format,
    call_grammar,
    check_choice,
    check_tools,
    format_of,
    parse_reply,
)
from tests.conftest import skip_or_fail

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city now",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"},
                                                    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
                   "required": ["city"]}}}
TIMER = {"type": "function", "function": {
    "name": "set_timer", "description": "Start a timer",
    "parameters": {"type": "object", "properties": {"minutes": {"type": "integer"}}, "required": ["minutes"]}}}
TOOLS = [WEATHER, TIMER]
TURNS = [{"role": "user", "content": "Weather in Paris?"},
         {"role": "assistant", "content": "", "tool_calls": [{"id": "abcdefghi", "type": "function", "function": {
             "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
         {"role": "tool", "tool_call_id": "abcdefghi", "name": "get_weather", "content": "18 C, cloudy"}]


@pytest.mark.parametrize(("fmt", "text", "content", "calls"), [
    ("hermes", 'Let me check.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
     "Let me check.", [("get_weather", {"city": "Paris"})]),
    ("hermes", ('<tool_call>{"name": "set_timer", "arguments": {"minutes": 5}}</tool_call>\n<tool_call>{"name": '
                '"get_weather", "arguments": {"city": "Oslo"}}</tool_call>'), "",
     [("set_timer", {"minutes": 5}), ("get_weather", {"city": "Oslo"})]),
    ("hermes", "<tool_call>\n{\"name\": \"unknown_tool\", \"arguments\": {}}\n</tool_call>",
     "<tool_call>\n{\"name\": \"unknown_tool\", \"arguments\": {}}\n</tool_call>", []),
    ("hermes", "It is sunny.", "It is sunny.", []),
    ("hermes", '```json\n{"name": "get_weather", "arguments": {"city": "Nice"}}\n```', "",
     [("get_weather", {"city": "Nice"})]),  # small models' form
    ("hermes", '{"name": "set_timer", "arguments": {"minutes": 2}}', "", [("set_timer", {"minutes": 2})]),
    ("hermes", '{"name": "cat joke", "arguments": {}}', '{"name": "cat joke", "arguments": {}}', []),
    ("llama3", '{"name": "get_weather", "parameters": {"city": "Rome"}}', "", [("get_weather", {"city": "Rome"})]),
    ("llama3", '<|python_tag|>{"type": "function", "name": "set_timer", "parameters": {"minutes": 3}}', "",
     [("set_timer", {"minutes": 3})]),
    ("llama3", "{not json", "{not json", []),
    ("mistral", '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Lyon"}, "id": "abcdefghi"}]', "",
     [("get_weather", {"city": "Lyon"})]),
    ("hermes", ("<tool_call>\n<function=get_weather>\n<parameter=city>\nOulu\n</parameter>\n</function>\n</tool_call>\n"
                "<tool_call>\n<function=set_timer>\n<parameter=minutes>\n7\n</parameter>\n</function>\n</tool_call>"),
     "", [("get_weather", {"city": "Oulu"}), ("set_timer", {"minutes": 7})]),  # Qwen3-Coder's form
    ("mistral", '[TOOL_CALLS]set_timer[ARGS]{"minutes": 1}[TOOL_CALLS]get_weather[ARGS]{"city": "Bergen"}', "",
     [("set_timer", {"minutes": 1}), ("get_weather", {"city": "Bergen"})]),  # newer Mistral templates
    ("generic", '{"tool_call": {"name": "set_timer", "arguments": {"minutes": 10}}}', "",
     [("set_timer", {"minutes": 10})]),
    ("generic", '{"response": "Hello!"}', "Hello!", []),
])
def test_replies_parse_into_content_and_calls(fmt: str, text: str, content: str,
                                              calls: list[tuple[str, Any]]) -> None:
    got_content, got = parse_reply(text, fmt, TOOLS)
    assert got_content == content
    assert [(c.name, json.loads(c.arguments)) for c in got] == calls
    assert all(c.id for c in got)


def test_tools_and_choices_are_checked() -> None:
    assert check_tools(TOOLS) == TOOLS
    assert check_choice(None, TOOLS) == "auto" and check_choice(None, []) == "none"
    assert check_choice({"type": "function", "function": {"name": "set_timer"}}, TOOLS) == "set_timer"
    for bad in ([{"type": "function"}], [{"type": "function", "function": {"name": "a b"}}], [WEATHER, WEATHER], "x"):
        with pytest.raises(ToolError):
            check_tools(bad)
    for choice in ("always", {"type": "function", "function": {"name": "nope"}}):
        with pytest.raises(ToolError):
            check_choice(choice, TOOLS)
    with pytest.raises(ToolError, match="needs tools"):
        check_choice("required", [])


def test_formats_by_template_markers() -> None:
    assert format_of("... <tool_call> ...") == "hermes"
    assert format_of("{{ '[TOOL_CALLS]' }}") == "mistral"
    assert format_of("<|python_tag|> {% if tools %}") == "llama3"
    assert call_format("{{ messages }}") == "generic" and call_format("") == "generic"


@pytest.mark.parametrize("fmt", ["hermes", "llama3", "mistral", "generic"])
def test_a_required_call_grammar_takes_valid_calls_only(fmt: str) -> None:
    from edgellama.grammar.matcher import CompiledGrammar

    key = "parameters" if fmt == "llama3" else "arguments"
    call = json.dumps({"name": "get_weather", key: {"city": "Paris", "unit": "celsius"}})
    wrapped = {"hermes": f"<tool_call>\n{call}\n</tool_call>", "llama3": call, "mistral": f"[TOOL_CALLS][{call}]",
               "generic": f'{{"tool_call": {call}}}'}[fmt]
    g = CompiledGrammar(call_grammar(fmt, TOOLS))
    assert accepts(g, wrapped)
    bad_enum = wrapped.replace("celsius", "kelvin")
    bad_name = wrapped.replace("get_weather", "get_wether")
    assert not accepts(g, bad_enum) and not accepts(g, bad_name)
    only_timer = CompiledGrammar(call_grammar(fmt, TOOLS, only="set_timer"))
    assert not accepts(only_timer, wrapped)


def accepts(g: Any, text: str) -> bool:
    from edgellama.grammar.matcher import ACCEPTING

    state = g.step(g.start, text.encode())
    return state >= 0 and bool(g.flags(state) & ACCEPTING)


def test_the_auto_grammar_holds_from_a_calls_marker_on(smollm2_path: Path) -> None:
    """A lazy grammar over SmolLM2's tokenizer: free text until the marker, then only a valid call."""
    import numpy as np

    from edgellama.gguf.metadata import Metadata
    from edgellama.gguf.split import open_model_file
    from edgellama.grammar import constrain
    from edgellama.tokenizers.tokenizer import tokenizer_from_metadata
    from edgellama.tool_calls import auto_grammar

    with open_model_file(smollm2_path) as f:
        tok = tokenizer_from_metadata(Metadata.of(f))

    class Pick:  # draws the highest logit; accept() records nothing
        def accept(self, token: int) -> None:
            pass

        def sample(self, logits: Any) -> int:
            return int(np.argmax(logits))

    s = constrain(Pick(), auto_grammar("hermes", TOOLS), tok)
    for t in tok.encode("Sure. <tool_call>\n", add_special=False):  # free text, then the marker: accepted
        s.accept(t)
    assert s.active is not None
    bad = tok.encode('{"name": "launch_rocket"', add_special=False)
    logits = np.zeros(tok.n_vocab, dtype=np.float32)
    logits[bad[0]] = 5.0
    first = s.sample(logits)
    assert tok.token_bytes(first).startswith(b"{") or tok.token_bytes(first).isspace()
    for t in tok.encode('{"name": "', add_special=False):
        s.accept(t)
    logits = np.zeros(tok.n_vocab, dtype=np.float32)
    logits[tok.encode("launch", add_special=False)[0]] = 10.0  # the model wants another name: refused
    assert tok.token_bytes(s.sample(logits)).decode() in "get_weatherset_timer"


@pytest.fixture(scope="session")
def templates() -> Path:
    from llamacpp_ref import ReferenceUnavailable, cached_sdist

    from edgellama.default_model import cache_dir

    try:
        return cached_sdist(cache_dir()) / "vendor" / "llama.cpp" / "models" / "templates"
    except ReferenceUnavailable as exc:
        reason = str(exc)
    skip_or_fail(reason)


def test_llama_cpps_templates_render_tools_and_tool_turns(templates: Path) -> None:
    from edgellama.tokenizers.chat import JinjaChatTemplate, render_prompt

    files = sorted(templates.glob("*.jinja"))
    assert len(files) >= 40
    failed = {}
    for f in files:
        try:
            out = render_prompt(JinjaChatTemplate(f.read_text(), "<s>", "</s>"), TURNS, tools=TOOLS).text
            assert "get_weather" in out and "18 C, cloudy" in out
        except (ValueError, AssertionError) as exc:
            failed[f.name] = str(exc)[:120]
    # firefunction-v2 reads its own `functions` variable, not `tools`
    assert set(failed) <= {"fireworks-ai-llama-3-firefunction-v2.jinja"}, failed
    for name, fmt in (("Qwen-Qwen2.5-7B-Instruct.jinja", "hermes"), ("Qwen-Qwen3-0.6B.jinja", "hermes"),
                      ("HuggingFaceTB-SmolLM3-3B.jinja", "generic"),  # this copy has no tool support
                      ("meta-llama-Llama-3.1-8B-Instruct.jinja", "llama3"),
                      ("meta-llama-Llama-3.2-3B-Instruct.jinja", "llama3"),
                      ("mistralai-Mistral-Nemo-Instruct-2407.jinja", "mistral")):
        assert call_format((templates / name).read_text()) == fmt, name


@pytest.mark.slow
def test_qwen_calls_tools_over_the_socket_with_the_openai_sdk(qwen_path: Path) -> None:
    from tests.service_util import ServerProc, openai_over_unix_socket

    srv = ServerProc("-m", str(qwen_path), engine=["-c", "2048", "-t", "2", "-b", "256"])
    ask = [{"role": "user", "content": "What is the weather in Paris right now?"}]
    try:
        srv.wait_ready()
        with openai_over_unix_socket(srv.path) as client:
            r = client.chat.completions.create(model="qwen", messages=ask, tools=TOOLS, tool_choice="required",
                                               temperature=0, max_tokens=96)
            choice = r.choices[0]
            assert choice.finish_reason == "tool_calls" and choice.message.content is None
            call = choice.message.tool_calls[0]
            assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"] == "Paris"
            named = client.chat.completions.create(model="qwen", messages=ask, tools=TOOLS, temperature=0,
                                                   max_tokens=96, tool_choice={"type": "function",
                                                                               "function": {"name": "set_timer"}})
            timer = named.choices[0].message.tool_calls[0]
            assert timer.function.name == "set_timer" and isinstance(json.loads(timer.function.arguments)["minutes"], int)
            # the tool's result back, then the answer
            turns = [*ask, choice.message.model_dump(exclude_none=True),
                     {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"sky": "cloudy", "celsius": 18})}]
            final = client.chat.completions.create(model="qwen", messages=turns, tools=TOOLS, tool_choice="none",
                                                   temperature=0, max_tokens=48)
            assert final.choices[0].finish_reason in ("stop", "length") and final.choices[0].message.content
            assert not final.choices[0].message.tool_calls
            # streamed: the call in tool_calls deltas
            parts = list(client.chat.completions.create(model="qwen", messages=ask, tools=TOOLS, tool_choice="required",
                                                        temperature=0, max_tokens=96, stream=True))
            deltas = [tc for p in parts if p.choices for tc in (p.choices[0].delta.tool_calls or [])]
            assert deltas and deltas[0].function.name == "get_weather" and len(deltas) > 3
            assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
            assert parts[-1].choices[0].finish_reason == "tool_calls"
        with srv.connect() as c:  # protocol v1
            events = c.ask({"id": 1, "messages": ask, "tools": TOOLS, "tool_choice": "required", "temperature": 0,
                            "n_predict": 96, "stream": False})
            done = events[-1]
            assert done["event"] == "done" and done["tool_calls"][0]["function"]["name"] == "get_weather"
            err = c.ask({"id": 2, "prompt": "x", "tools": TOOLS})[-1]
            assert err["code"] == "bad_request" and "tools are for chat" in err["message"]
    finally:
        srv.terminate()
        srv.kill()


def test_smollm2_calls_through_the_generic_format_over_the_socket(smollm2_path: Path) -> None:
    """SmolLM2's template has no tools: llama.cpp's generic instruction, and a required call that parses."""
    from tests.service_util import FAST, ServerProc, openai_over_unix_socket

    srv = ServerProc("-m", str(smollm2_path), engine=FAST)
    try:
        srv.wait_ready()
        with openai_over_unix_socket(srv.path) as client:
            r = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Start a timer for 4 "
                                                                                                "minutes."}],
                                               tools=TOOLS, tool_choice="required", temperature=0, max_tokens=64)
            call = r.choices[0].message.tool_calls[0]
            assert r.choices[0].finish_reason == "tool_calls" and call.function.name in ("get_weather", "set_timer")
            args = json.loads(call.function.arguments)
            assert ("minutes" in args and isinstance(args["minutes"], int)) if call.function.name == "set_timer" else (
                isinstance(args["city"], str))
            # streamed: the call's id and name in its first delta, its arguments as they are written
            parts = list(client.chat.completions.create(
                model="x", messages=[{"role": "user", "content": "Start a timer for 4 minutes."}], tools=TOOLS,
                tool_choice="required", temperature=0, max_tokens=64, stream=True))
            deltas = [tc for p in parts if p.choices for tc in (p.choices[0].delta.tool_calls or [])]
            assert deltas[0].id and deltas[0].function.name == call.function.name
            assert len(deltas) > 3 and all(d.id is None and d.function.name is None for d in deltas[1:])
            assert "".join(d.function.arguments or "" for d in deltas) == call.function.arguments
            assert parts[-1].choices[0].finish_reason == "tool_calls"
            # auto: the generic format's {"response": ...} streams as the answer's text
            said = [p.choices[0].delta.content for p in client.chat.completions.create(
                model="x", messages=[{"role": "user", "content": "Say hello."}], tools=TOOLS, temperature=0,
                max_tokens=48, stream=True) if p.choices and p.choices[0].delta.content]
            whole = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Say hello."}],
                                                   tools=TOOLS, temperature=0, max_tokens=48).choices[0].message
            assert len(said) > 2 and "".join(said) == whole.content and not whole.tool_calls
            free = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Say hello."}],
                                                  tools=TOOLS, tool_choice="none", temperature=0, max_tokens=8)
            assert free.choices[0].message.content and not free.choices[0].message.tool_calls
            with pytest.raises(Exception, match="tool_choice names 'nope'"):
                client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}], tools=TOOLS,
                                               tool_choice={"type": "function", "function": {"name": "nope"}})
    finally:
        srv.terminate()
        srv.kill()


def test_the_python_api_streams_calls_as_they_are_written(smollm2_path: Path) -> None:
    """LLM.create_chat_completion with tools: the stream's deltas add up to the answer given whole; the
    tokens' log-probabilities all arrive, whether their text went out as content or as a call."""
    from edgellama import LLM

    ask = [{"role": "user", "content": "Start a timer for 4 minutes."}]
    with LLM(smollm2_path, n_ctx=1024, n_threads=2) as llm:
        kw: dict[str, Any] = {"tools": TOOLS, "tool_choice": "required", "temperature": 0, "max_tokens": 64}
        whole = llm.create_chat_completion(ask, logprobs=True, **kw)
        call = whole["choices"][0]["message"]["tool_calls"][0]
        assert whole["choices"][0]["finish_reason"] == "tool_calls"
        parts = list(llm.create_chat_completion(ask, stream=True, logprobs=True, **kw))
        deltas = [d for p in parts for d in p["choices"][0]["delta"].get("tool_calls", [])]
        assert deltas[0]["id"] and deltas[0]["function"]["name"] == call["function"]["name"] and len(deltas) > 3
        assert "".join(d["function"].get("arguments", "") for d in deltas) == call["function"]["arguments"]
        entries = [e for p in parts if p["choices"][0]["logprobs"] for e in p["choices"][0]["logprobs"]["content"]]
        assert [e["token"] for e in entries] == [e["token"] for e in whole["choices"][0]["logprobs"]["content"]]
        assert parts[-1]["choices"][0]["finish_reason"] == "tool_calls"
        # cut by max_tokens inside the call: finish_reason length, the call as far as it was written
        cut = llm.create_chat_completion(ask, **dict(kw, max_tokens=20))["choices"][0]
        assert cut["finish_reason"] == "length"
        assert call["function"]["arguments"].startswith(cut["message"]["tool_calls"][0]["function"]["arguments"])


_C_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\", "'": "'", "r": "\r"}


def _test_chat_replies(source: str) -> list[str]:
    """The model replies llama.cpp's tests/test-chat.cpp feeds its parsers: each `tst.test(...)` argument,
    its C string literals ("..." with escapes, R"(...)") joined."""
    out = []
    for m in re.finditer(r"tst\.test\(", source):
        i, parts = m.end(), []
        while True:
            while source[i] in " \t\r\n":
                i += 1
            if source.startswith('R"(', i):
                j = source.index(')"', i + 3)
                parts.append(source[i + 3:j])
                i = j + 2
            elif source[i] == '"':
                i += 1
                buf = []
                while source[i] != '"':
                    if source[i] == "\\":
                        buf.append(_C_ESCAPES[source[i + 1]])
                        i += 2
                    else:
                        buf.append(source[i])
                        i += 1
                parts.append("".join(buf))
                i += 1
            else:
                break
        out.append("".join(parts))
    return out


def test_the_replies_llama_cpps_chat_tests_expect_parse(templates: Path) -> None:
    """llama.cpp's own parser tests (test-chat.cpp in the same sdist): every reply there in a format edgellama
    parses (Hermes <tool_call> JSON, Mistral [TOOL_CALLS] list, name[ARGS] and name[CALL_ID]id[ARGS]) calls
    special_function ({"arg1": 1}) and special_function_with_opt ({"arg1": 1, "arg2": 2}) as llama.cpp expects,
    the text before the call its content; a reply cut inside a call streams that call as far as it is written
    (llama.cpp's partial message: the same name, the same arguments text up to spaces)."""
    from edgellama.tool_stream import ToolStream

    source = (templates.parent.parent / "tests" / "test-chat.cpp").read_text()
    tools = [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}}
             for n in ("special_function", "special_function_with_opt")]
    want_args = {"special_function": {"arg1": 1}, "special_function_with_opt": {"arg1": 1, "arg2": 2}}
    seen = {"whole": 0, "cut": 0}
    for reply in _test_chat_replies(source):
        if "special_function" not in reply or any(t in reply for t in ("<think>", "</think>", "[THINK]")):
            continue
        if '<tool_call>\n{"name"' in reply:
            fmt, at = "hermes", reply.index("<tool_call>")
        elif "[TOOL_CALLS]" in reply:
            fmt, at = "mistral", reply.index("[TOOL_CALLS]")
        else:
            continue  # another family's format (XML invokes, Python-style calls, ...)
        content, calls = parse_reply(reply, fmt, tools)
        names = re.findall(r"special_function(?:_with_opt)?", reply)
        if reply.rstrip().endswith(("}", "]", "</tool_call>")):
            seen["whole"] += 1
            assert [c.name for c in calls] == names, reply
            assert all(json.loads(c.arguments) == want_args[c.name] for c in calls), reply
            assert content == reply[:at].strip(), reply
            for ref in re.findall(r"\[CALL_ID\](\w+)|\"id\": \"(\w+)\"", reply):
                assert "".join(ref) in [c.id for c in calls], reply
        else:  # cut inside the call, as a stream is
            seen["cut"] += 1
            stream = ToolStream(fmt, tools)
            stream.feed(reply)
            end = stream.finish()
            written = reply.split('"arguments": ', 1)[1]
            assert [c.name for c in end.calls] == ["special_function"], reply
            assert end.calls[0].arguments.replace(" ", "") == written.replace(" ", ""), reply
    assert seen["whole"] >= 8 and seen["cut"] >= 2, seen

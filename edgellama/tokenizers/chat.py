"""Chat prompts: the model's own `tokenizer.chat_template` (Jinja) rendered in jinja2's sandbox, as
llama-cpp-python and transformers render it; hand-written formats only when the user names one.

Only formatting lives here (messages in, prompt text out). The template comes from an untrusted
file: never a plain jinja2 Environment, and the rendered text is bounded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, NoReturn, Protocol

MAX_RENDERED_CHARS = 1 << 20  # far beyond any context window; a template that loops stops here
PULL_HINT = "edgellama pull smollm2-135m-instruct"


class NoChatTemplate(ValueError):
    """The model has no chat template and no format was named."""


class ChatFormatter(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def stop_pieces(self) -> tuple[str, ...]: ...
    @property
    def added_special(self) -> bool: ...  # the text holds BOS itself (a template), else encode adds it

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None) -> str: ...


@dataclass(frozen=True)
class ChatFormat:
    name: str
    system: str  # with {content}
    user: str
    assistant_prefix: str
    assistant_suffix: str  # closes a finished assistant turn in the history
    stop_pieces: tuple[str, ...]
    added_special: bool = False

    source = ""  # no template: tools reach the model as llama.cpp's generic system text (tool_calls.py)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None) -> str:
        out = []
        pending_system = ""
        for m in messages:
            role, content = m.get("role", "user"), m.get("content", "")
            if role == "system":
                if self.name == "gemma":
                    pending_system += content + "\n\n"  # Gemma has no system turn: prefix the first user turn
                else:
                    out.append(self.system.format(content=content))
            elif role == "user":
                out.append(self.user.format(content=pending_system + content))
                pending_system = ""
            elif role == "assistant":
                out.append(self.assistant_prefix + content + self.assistant_suffix)
            else:
                raise ValueError(f"unknown chat role {role!r}")
        if add_generation_prompt:
            out.append(self.assistant_prefix)
        return "".join(out)


GEMMA = ChatFormat(
    name="gemma",
    system="",
    user="<start_of_turn>user\n{content}<end_of_turn>\n",
    assistant_prefix="<start_of_turn>model\n",
    assistant_suffix="<end_of_turn>\n",
    stop_pieces=("<end_of_turn>",),
)
CHATML = ChatFormat(
    name="chatml",
    system="<|im_start|>system\n{content}<|im_end|>\n",
    user="<|im_start|>user\n{content}<|im_end|>\n",
    assistant_prefix="<|im_start|>assistant\n",
    assistant_suffix="<|im_end|>\n",
    stop_pieces=("<|im_end|>",),
)
FORMATS = {"gemma": GEMMA, "chatml": CHATML}


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """transformers' chat-template tojson (what templates are written against): unescaped, unlike Jinja's."""
    import json

    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _generation_tag() -> Any:
    """transformers' {% generation %}...{% endgeneration %} (it marks the assistant's tokens for training):
    renders its body, nothing more."""
    from jinja2 import nodes
    from jinja2.ext import Extension

    class Generation(Extension):
        tags = {"generation"}  # noqa: RUF012 - jinja2's Extension declares it so

        def parse(self, parser: Any) -> Any:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.Scope(body, lineno=lineno)

    return Generation


class JinjaChatTemplate:
    """The GGUF's chat template, with the variables llama-cpp-python's Jinja2ChatFormatter passes."""

    name = "gguf"
    added_special = True

    def __init__(self, source: str, bos_token: str, eos_token: str) -> None:
        import jinja2
        import jinja2.ext
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        env = ImmutableSandboxedEnvironment(loader=jinja2.BaseLoader(), trim_blocks=True, lstrip_blocks=True,
                                            extensions=[jinja2.ext.loopcontrols, _generation_tag()])
        env.filters["tojson"] = _tojson  # transformers' tojson: ensure_ascii, indent, separators, sort_keys
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise ValueError(f"the model's chat template does not parse: {exc}") from None
        self.bos_token, self.eos_token = bos_token, eos_token
        self.stop_pieces: tuple[str, ...] = (eos_token,) if eos_token else ()
        self.source = source

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
               tools: list[dict[str, Any]] | None = None) -> str:
        """tools: OpenAI's tool list, the `tools` variable (as transformers and llama.cpp's --jinja pass it)."""
        import jinja2

        def raise_exception(message: str) -> NoReturn:
            raise ValueError(f"the model's chat template refused the messages: {message}")

        def strftime_now(fmt: str) -> str:
            return datetime.now().strftime(fmt)

        out: list[str] = []
        size = 0
        try:
            extra = {"tools": tools} if tools else {}
            for piece in self._template.generate(messages=messages, add_generation_prompt=add_generation_prompt,
                                                 bos_token=self.bos_token, eos_token=self.eos_token,
                                                 raise_exception=raise_exception, strftime_now=strftime_now,
                                                 **extra):
                size += len(piece)
                if size > MAX_RENDERED_CHARS:
                    raise ValueError(f"the model's chat template rendered more than {MAX_RENDERED_CHARS} characters")
                out.append(piece)
        except jinja2.TemplateError as exc:  # includes the sandbox's SecurityError
            raise ValueError(f"the model's chat template failed: {exc}") from None
        return "".join(out)


def _token_text(md: Mapping[str, Any], key: str) -> str:
    tokens = md.get("tokenizer.ggml.tokens")
    tid = md.get(key)
    if isinstance(tid, int) and isinstance(tokens, Sequence) and 0 <= tid < len(tokens):
        return str(tokens[tid])
    return ""


def chat_formatter(md: Mapping[str, Any], named: str | None = None) -> ChatFormatter:
    """The chat format for a model: a named hand-written one, else the GGUF's template, else an
    error naming the way to a model that has one."""
    if named:
        try:
            return FORMATS[named]
        except KeyError:
            raise ValueError(f"unknown chat format {named!r}; choices: {', '.join(FORMATS)}") from None
    source = md.get("tokenizer.chat_template")
    if isinstance(source, str) and source.strip():
        return JinjaChatTemplate(source, _token_text(md, "tokenizer.ggml.bos_token_id"),
                                 _token_text(md, "tokenizer.ggml.eos_token_id"))
    name = md.get("general.name") or md.get("general.architecture") or "this model"
    raise NoChatTemplate(
        f"{name} has no chat template (a base model, not an instruct model): for chat, fetch one with "
        f"`{PULL_HINT}` and run with -m smollm2-135m-instruct, or name a format with --chat-template "
        f"{'|'.join(FORMATS)}"
    )


SENTINEL = "\ue000"  # a private-use character that no chat template emits


@dataclass(frozen=True)
class ChatPrompt:
    """A rendered chat prompt and whether encoding must add BOS (a template writes it itself)."""

    text: str
    add_special: bool

    def encode(self, tokenizer: Any) -> list[int]:
        """Its token ids: special-token text (the template's turn markers) parsed."""
        ids: list[int] = tokenizer.encode(self.text, add_special=self.add_special, parse_special=True)
        return ids


def render_prompt(fmt: ChatFormatter, messages: list[dict[str, Any]], system: str | None = None,
                  add_generation_prompt: bool = True, tools: list[dict[str, Any]] | None = None) -> ChatPrompt:
    """messages through fmt (`run --chat`, the Python API and the service alike); system: a default
    system message, put first when messages have none; tools: OpenAI's, through the template's own tool
    support, else as llama.cpp's generic system text (edgellama.tool_calls). Raises ValueError when the
    format refuses them."""
    if system and not any(m.get("role") == "system" for m in messages):
        messages = [{"role": "system", "content": system}, *messages]
    if not tools and not any(m.get("role") == "tool" or m.get("tool_calls") for m in messages):
        return ChatPrompt(str(fmt.render(messages, add_generation_prompt=add_generation_prompt)), not fmt.added_special)
    from edgellama.tool_calls import prepare

    # templates differ in what they take (llama.cpp's minja tries them the same way): a call's arguments as an
    # object or as JSON text; a system message, or its text at the start of the first user turn
    error: ValueError | None = None
    for args_as_text in (False, True):
        for system_in_user in (False, True):
            turns, tools_arg = prepare(getattr(fmt, "source", ""), messages, tools or [], args_as_text, system_in_user)
            try:
                text = fmt.render(turns, add_generation_prompt=add_generation_prompt, tools=tools_arg)
                return ChatPrompt(str(text), not fmt.added_special)
            except (ValueError, TypeError) as exc:
                error = error or (exc if isinstance(exc, ValueError) else ValueError(str(exc)))
    assert error is not None
    raise error


def system_prefix(fmt: ChatFormatter, system: str) -> ChatPrompt:
    """What every chat prompt with this system message starts with: the template up to the first user text
    (a service evaluates it once and keeps its KV cache)."""
    p = render_prompt(fmt, [{"role": "system", "content": system}, {"role": "user", "content": SENTINEL}])
    return ChatPrompt(p.text[:p.text.index(SENTINEL)], p.add_special)

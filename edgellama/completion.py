"""llama-cpp-python's high-level calls on a loaded model: `llm(prompt, ...)`, `create_completion`,
`create_chat_completion` (OpenAI's response and stream-chunk shapes), `tokenize`, `detokenize`.

Shapes only: generation itself is LLM.generate; nothing here touches the engine directly.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from edgellama import params as R
from edgellama.generation import Event, build_sampler
from edgellama.logprobs import check_top, llama_entry, piece
from edgellama.openai_shapes import OpenAIShaper, finish_reason, llama_timings, usage
from edgellama.params import GenParams
from edgellama.sequence import ContextFull
from edgellama.tokenizers.chat import render_prompt

ECHO_ROWS = 64  # prompt tokens evaluated at once for echo's log-probabilities (64 x vocabulary floats)

if TYPE_CHECKING:
    from collections.abc import Callable, Generator
    from pathlib import Path

    from edgellama.tokenizers.chat import ChatFormatter
    from edgellama.tokenizers.tokenizer import Tokenizer
    from edgellama.tool_stream import ToolStream



class CompletionAPI:
    """Mixed into LLM. Defaults are llama-cpp-python's."""

    if TYPE_CHECKING:  # what LLM provides
        tokenizer: Tokenizer
        n_ctx: int
        path: Path
        seed: int | None
        generate: Callable[..., Generator[Event, None, None]]
        eval: Callable[..., npt.NDArray[np.float32]]
        reset: Callable[[], None]

        @property
        def chat(self) -> ChatFormatter: ...

    def tokenize(self, text: bytes | str, add_bos: bool = True, special: bool = False) -> list[int]:
        """Token ids of text (bytes are UTF-8). add_bos: the model's BOS if it uses one; special:
        parse special-token text such as <|im_start|>."""
        s = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
        return self.tokenizer.encode(s, add_special=add_bos, parse_special=special)

    def detokenize(self, tokens: list[int], prev_tokens: list[int] | None = None,
                   special: bool = False) -> bytes:
        """The bytes the tokens stand for (control tokens give none), as llama-cpp-python returns them."""
        return b"".join(self.tokenizer.token_bytes(int(t)) for t in tokens)

    def __call__(self, prompt: str | list[int], **kwargs: Any) -> Any:
        return self.create_completion(prompt, **kwargs)

    def _sampler(self, temperature: float, top_p: float, top_k: int, min_p: float, repeat_penalty: float,
                 seed: int | None, grammar: Any = None, max_tokens: int | None = None,
                 stop: str | list[str] | None = None, mirostat: tuple[int, float, float] = (0, 5.0, 0.1),
                 logit_bias: Any = None) -> tuple[Any, GenParams]:
        """The request's parameters checked by the request-parameter table (named as this API's
        arguments), and its sampler. grammar: GBNF text or a parsed edgellama.grammar.Grammar (llama-cpp-
        python's LlamaGrammar role)."""
        if seed is None or seed < 0:
            seed = self.seed
        constraint = None
        if grammar is not None:
            from edgellama.grammar import parse

            constraint = parse(grammar) if isinstance(grammar, str) else grammar
        p = R.check(GenParams(n_predict=-1 if max_tokens is None or max_tokens <= 0 else max_tokens,
                              temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                              repeat_penalty=repeat_penalty, seed=seed, mirostat=mirostat[0],
                              mirostat_tau=mirostat[1], mirostat_eta=mirostat[2],
                              stop=[stop] if isinstance(stop, str) else list(stop or []), constraint=constraint,
                              logit_bias=logit_bias or []),
                    R.PYTHON)
        return build_sampler(p, self.tokenizer, self.n_ctx), p

    def _stream_text(self, ids: list[int], sampler: Any, params: GenParams, stops: list[str],
                     end: dict[str, Any], n_probs: int = -1
                     ) -> Iterator[tuple[str, str | None, list[dict[str, Any]]]]:
        """(text piece, None, its tokens' logprobs) while generating, then ("", finish_reason, the rest);
        text stops before a stop string; logprobs (llama-server's items) only with n_probs >= 0. end
        receives OpenAI's `usage` and llama-server's `timings` once the generation is over."""
        if len(ids) >= self.n_ctx:
            raise ContextFull(f"the prompt has {len(ids)} tokens, the context only {self.n_ctx}")
        room = self.n_ctx - len(ids)
        n_predict = room if params.n_predict < 0 else min(params.n_predict, room)
        n = 0
        finish = "length"
        timings = None
        pending: list[dict[str, Any]] = []
        gen = self.generate(ids, sampler, n_predict, stops=stops, n_probs=n_probs)
        try:
            for ev in gen:
                if ev.kind == "token":
                    n += 1
                    if ev.probs is not None:
                        pending.append(llama_entry(self.tokenizer, ev.probs))
                else:
                    finish, timings = finish_reason(ev.stop_reason), ev.timings
                if ev.text:
                    yield ev.text, None, pending
                    pending = []
        finally:
            gen.close()
        evaluated = timings.prompt_tokens if timings is not None else len(ids)
        end["usage"] = usage(len(ids), n, len(ids) - evaluated)
        end["timings"] = llama_timings(len(ids) - evaluated, evaluated, timings.prompt_ms if timings else 0.0, n,
                                       timings.gen_ms if timings else 0.0)
        yield "", finish, pending

    def _prompt_logprobs(self, ids: list[int], n: int) -> list[dict[str, Any]]:
        """llama-server's items for the prompt's tokens after a leading BOS (the text it echoes), each one's
        log-probability given those before it; the first has none (null, as OpenAI's echo). The prompt is
        evaluated in pieces of at most ECHO_ROWS tokens, so its logits never take more than that many rows."""
        from edgellama.logprobs import token_probs

        self.reset()
        skip = 1 if ids and ids[0] == self.tokenizer.bos_id else 0
        out: list[dict[str, Any]] = []
        prev: npt.NDArray[np.float32] | None = None
        for i in range(0, len(ids), ECHO_ROWS):
            rows = self.eval(ids[i:i + ECHO_ROWS], all_logits=True)
            for j, tok in enumerate(ids[i:i + ECHO_ROWS]):
                k = i + j
                if k >= skip:
                    if k == skip or prev is None:
                        text, raw = piece(self.tokenizer, tok)
                        out.append({"id": tok, "token": text, "bytes": raw, "logprob": None, "top_logprobs": None})
                    else:
                        out.append(llama_entry(self.tokenizer, token_probs(prev, tok, n)))
                prev = rows[j]
        return out

    def create_completion(self, prompt: str | list[int], suffix: str | None = None, max_tokens: int | None = 16,
                          temperature: float = 0.8, top_p: float = 0.95, min_p: float = 0.05, echo: bool = False,
                          stop: str | list[str] | None = None, stream: bool = False, repeat_penalty: float = 1.0,
                          top_k: int = 40, seed: int | None = None, logprobs: int | None = None,
                          grammar: Any = None, mirostat_mode: int = 0, mirostat_tau: float = 5.0,
                          mirostat_eta: float = 0.1, logit_bias: dict[int | str, float] | None = None) -> Any:
        """{"choices": [{"text", "finish_reason", "logprobs", ...}], "usage": {...}} or, with stream=True, an
        iterator of chunks of the same shape. grammar: GBNF text or an edgellama.grammar.Grammar.
        logit_bias: {token id: bias} added to the logits (llama-server's list form too; -inf or False: never).
        logprobs: N, each generated token's log-probability and the N most likely (0..20), in llama-cpp-
        python's shape (tokens, token_logprobs, top_logprobs, text_offset); with echo, the prompt's tokens
        first (each given the ones before it; the first one's null, as OpenAI's)."""
        if suffix is not None:
            raise ValueError("suffix is not supported")
        R.check_unicode({"prompt": prompt, "stop": stop}, "")
        if logprobs is not None:
            check_top("logprobs", logprobs)
        # special-token text in the prompt is parsed, as llama-cpp-python's create_completion does
        ids = list(prompt) if isinstance(prompt, list) else self.tokenize(prompt, special=True)
        R.check_token_ids("prompt", ids, self.tokenizer.n_vocab)
        echoed = self._prompt_logprobs(ids, logprobs) if echo and logprobs is not None else []
        sampler, params = self._sampler(temperature, top_p, top_k, min_p, repeat_penalty, seed, grammar,
                                        max_tokens, stop, (mirostat_mode, mirostat_tau, mirostat_eta), logit_bias)
        shape = OpenAIShaper(False, f"cmpl-{uuid.uuid4()}", int(time.time()), self.path.name, logprobs is not None)
        end: dict[str, Any] = {}
        pieces = self._stream_text(ids, sampler, params, params.stop, end, -1 if logprobs is None else logprobs)
        prompt_text = (prompt if isinstance(prompt, str) else self.detokenize(ids).decode("utf-8", "replace"))

        if stream:
            def chunks() -> Iterator[dict[str, Any]]:
                if echo:
                    yield shape.text(0, prompt_text, echoed)
                for text, finish, entries in pieces:
                    yield shape.text(0, text, entries) if finish is None else \
                        shape.finish(0, finish, entries or None, end["timings"])
            return chunks()
        out, finish, every = [], "stop", list(echoed)
        for text, fin, entries in pieces:
            out.append(text)
            every += entries
            finish = fin or finish
        body = (prompt_text if echo else "") + "".join(out)
        return shape.reply([shape.choice(0, body, finish, every)], end["usage"], end["timings"])

    def create_chat_completion(self, messages: list[dict[str, Any]], temperature: float = 0.2,
                               top_p: float = 0.95, top_k: int = 40, min_p: float = 0.05,
                               stop: str | list[str] | None = None, stream: bool = False,
                               seed: int | None = None, max_tokens: int | None = None,
                               repeat_penalty: float = 1.0, response_format: dict[str, Any] | None = None,
                               grammar: Any = None, mirostat_mode: int = 0, mirostat_tau: float = 5.0,
                               mirostat_eta: float = 0.1, logit_bias: dict[int | str, float] | None = None,
                               logprobs: bool | None = None, top_logprobs: int | None = None,
                               tools: list[dict[str, Any]] | None = None, tool_choice: Any = None,
                               parallel_tool_calls: bool | None = None) -> Any:
        """OpenAI's chat.completion shape (or chat.completion.chunk stream), the prompt rendered by
        the model's own chat template. response_format: {"type": "json_object"} (optionally with a
        "schema") or {"type": "json_schema", "json_schema": {"schema": ...}}, as llama-cpp-python.
        logprobs / top_logprobs (0..20): OpenAI's `logprobs.content`, each token's log-probability.
        tools / tool_choice (auto, none, required, {"type": "function", "function": {"name": ...}}) /
        parallel_tool_calls: OpenAI's; the reply's calls in message.tool_calls with finish_reason
        "tool_calls"; required or a named function constrain the reply to a call that parses (edgellama.
        tool_calls); streamed, a call arrives as OpenAI's deltas while it is written (edgellama.tool_stream)."""
        from edgellama.tool_calls import call_format, check_choice, check_tools, choice_grammar

        R.check_unicode({"messages": messages, "stop": stop}, "")
        tool_list = check_tools(tools) if tools else []
        choice = check_choice(tool_choice, tool_list)
        if choice not in ("auto", "none") and (grammar is not None or response_format is not None):
            raise ValueError("tool_choice required (or a named function) constrains the reply: give no grammar or "
                             "response_format with it")
        live = False  # calls held by the call grammar: streamed as they are written
        if choice == "none":
            tool_list = []
        elif grammar is None and response_format is None:  # a call that begins is held to the tools' schemas
            grammar = choice_grammar(call_format(getattr(self.chat, "source", "")), tool_list, choice,
                                     bool(parallel_tool_calls))
            live = True
        if top_logprobs is not None:
            check_top("top_logprobs", top_logprobs)
            if not logprobs:
                raise ValueError("'top_logprobs' needs logprobs=True")
        n_probs = (top_logprobs or 0) if logprobs else -1
        from edgellama.grammar import grammar_from_schema, response_format_schema

        schema = response_format_schema(response_format)  # one reading with HTTP's
        if schema is not None:
            if grammar is not None:
                raise ValueError("give grammar or response_format, not both")
            grammar = grammar_from_schema(schema)
        fmt = self.chat
        ids = render_prompt(fmt, messages, tools=tool_list or None).encode(self.tokenizer)
        sampler, params = self._sampler(temperature, top_p, top_k, min_p, repeat_penalty, seed, grammar,
                                        max_tokens, stop, (mirostat_mode, mirostat_tau, mirostat_eta), logit_bias)
        shape = OpenAIShaper(True, f"chatcmpl-{uuid.uuid4()}", int(time.time()), self.path.name, n_probs >= 0)
        end: dict[str, Any] = {}
        pieces = self._stream_text(ids, sampler, params, params.stop + list(fmt.stop_pieces), end, n_probs)
        calls = None
        if tool_list:
            from edgellama.tool_stream import ToolStream

            calls = ToolStream(call_format(getattr(fmt, "source", "")), tool_list, live)
        if stream:
            return self._chat_chunks(shape, pieces, calls, end)
        out, finish, every = [], "stop", []
        for text, fin, entries in pieces:
            out.append(text)
            if calls is not None:
                calls.feed(text)
            every += entries
            finish = fin or finish
        if calls is None:
            return shape.reply([shape.choice(0, "".join(out), finish, every)], end["usage"], end["timings"])
        done = calls.finish()
        reason = done.finish_reason(finish)
        answer = shape.choice(0, done.content, reason, every, [c.openai() for c in done.calls] or None)
        return shape.reply([answer], end["usage"], end["timings"])

    @staticmethod
    def _chat_chunks(shape: OpenAIShaper, pieces: Iterator[tuple[str, str | None, list[dict[str, Any]]]],
                     calls: ToolStream | None, end: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """A chat reply as OpenAI's stream: the role, content as it comes (with tools: as it can no longer be a
        call, each call's deltas as it is written: edgellama.tool_stream), the finish."""
        yield shape.role(0)
        finish = "stop"
        held: list[dict[str, Any]] = []  # log-probabilities of tokens whose text is not sent yet
        for text, fin, entries in pieces:
            if fin is not None:
                finish = fin
                held += entries
                break
            if calls is None:
                yield shape.text(0, text, entries)
                continue
            content, deltas = calls.feed(text)
            held += entries
            if content:
                yield shape.text(0, content, held)
                held = []
            if deltas:
                yield shape.tool_calls(0, deltas, held)
                held = []
        if calls is not None:
            done = calls.finish()
            if done.rest:
                yield shape.text(0, done.rest, held)
                held = []
            if done.deltas:
                yield shape.tool_calls(0, done.deltas, held)
                held = []
            finish = done.finish_reason(finish)
        yield shape.finish(0, finish, held or None, end["timings"])

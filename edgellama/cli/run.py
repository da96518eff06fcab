"""`edgellama run`: generate text from a prompt with llama-cli's flags, streaming tokens as they are
made, with llama.cpp-style timings at the end; `--chat` renders the model's chat template, `-i`
keeps reading input, `-cnv` is a chat conversation, `--json` prints one JSON object per event and
always ends a stream with a `done` or an `error` event.
"""

from __future__ import annotations

import argparse
import codecs
import json
import random
import sys
from pathlib import Path
from typing import Any, TextIO

from edgellama.cli.common import add_model_args, load
from edgellama.session import check_session_path

COLOR_PROMPT, COLOR_RESET = "\x1b[33m", "\x1b[0m"  # llama-cli's yellow prompt


def add_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="generate text from a prompt", description=__doc__)
    add_model_args(p)
    p.add_argument("-p", "--prompt", help="prompt text")
    p.add_argument("-f", "--file", help="read the prompt from a file")
    p.add_argument("-n", "--n-predict", type=int, default=-1,
                   help="tokens to generate (default: %(default)s = until the end of text)")
    p.add_argument("-e", "--escape", action="store_true",
                   help=r"process escapes in the prompt and inputs (\n, \t, \", \\, \xNN, \uNNNN)")
    p.add_argument("-r", "--reverse-prompt", action="append", default=[], metavar="TEXT",
                   help="stop generating at TEXT (repeatable); in interactive mode, hand the turn back")
    p.add_argument("--chat", action="store_true", help="render the prompt with the model's chat template")
    p.add_argument("--chat-template", choices=("chatml", "gemma"), default=None,
                   help="a hand-written chat format instead of the model's template (for a model that has none)")
    p.add_argument("-sys", "--system-prompt", "--system", dest="system", default=None,
                   help="system message (chat and conversation)")
    p.add_argument("-cnv", "--conversation", action="store_true",
                   help="conversation: the chat template, turn after turn from stdin (-p is the first turn)")
    p.add_argument("-no-cnv", "--no-conversation", action="store_true",
                   help="plain text completion (the default; overrides -cnv)")
    p.add_argument("-st", "--single-turn", action="store_true", help="conversation: answer one turn, then exit")
    p.add_argument("-i", "--interactive", action="store_true", help="keep reading input lines from stdin")
    p.add_argument("--interactive-first", action="store_true",
                   help="interactive, and wait for the first input line before generating")
    p.add_argument("--in-prefix", default="", metavar="TEXT", help="put before each input line (interactive)")
    p.add_argument("--in-suffix", default="", metavar="TEXT", help="put after each input line (interactive)")
    p.add_argument("--no-display-prompt", action="store_true", help="do not echo the prompt")
    p.add_argument("--color", action="store_true", help="colour the echoed prompt (only when stdout is a terminal)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="never end at an end-of-text token (they are not sampled); stop with -n")
    p.add_argument("--json", action="store_true", help="one JSON object per event on stdout")
    p.add_argument("--no-parse-special", dest="parse_special", action="store_false",
                   help="read special-token text in the prompt (<|im_start|>) as plain text; by default it is parsed "
                        "into the special tokens, as llama-cli, llama-server and llama-cpp-python do")
    p.add_argument("--special", dest="parse_special", action="store_true", help=argparse.SUPPRESS)  # the default
    p.add_argument("--prompt-cache", metavar="FILE", default=None,
                   help="reuse the KV cache saved in FILE when the prompt starts with its tokens; save it after "
                        "the prompt is evaluated")
    g = p.add_argument_group("constrained output (llama.cpp's GBNF grammars, docs/grammar.md)")
    g.add_argument("--grammar", metavar="GBNF", default=None, help="only generate text this GBNF grammar accepts")
    g.add_argument("--grammar-file", metavar="FILE", default=None,
                   help="the grammar from FILE, or a bundled one by name: " + ", ".join(_bundled()))
    g.add_argument("-j", "--json-schema", metavar="SCHEMA", default=None,
                   help="only generate JSON valid under this JSON Schema (JSON text, or @FILE)")
    s = p.add_argument_group("sampling (llama.cpp's chain: penalties, top-k, top-p, min-p, temperature)")
    s.add_argument("--temp", type=float, default=0.8, help="temperature; 0 = greedy (default: %(default)s)")
    s.add_argument("--top-k", type=int, default=40, help="top-k sampling, 0 = off (default: %(default)s)")
    s.add_argument("--top-p", type=float, default=0.95, help="top-p sampling, 1.0 = off (default: %(default)s)")
    s.add_argument("--min-p", type=float, default=0.05, help="min-p sampling, 0.0 = off (default: %(default)s)")
    s.add_argument("--repeat-penalty", type=float, default=1.0,
                   help="penalize repeated tokens, 1.0 = off (default: %(default)s)")
    s.add_argument("--repeat-last-n", type=int, default=64,
                   help="last N tokens penalized, 0 = off, -1 = context size (default: %(default)s)")
    s.add_argument("--mirostat", type=int, default=0, choices=(0, 2),
                   help="mirostat sampling: 0 = off, 2 = mirostat v2 (default: %(default)s)")
    s.add_argument("--mirostat-lr", type=float, default=0.1, help="mirostat learning rate, eta (default: %(default)s)")
    s.add_argument("--mirostat-ent", type=float, default=5.0, help="mirostat target entropy, tau (default: %(default)s)")
    s.add_argument("-s", "--seed", type=int, default=-1, help="RNG seed, -1 = random, printed (default: %(default)s)")
    s.add_argument("-l", "--logit-bias", metavar="TOKEN_ID(+/-)BIAS", type=logit_bias, action="append", default=[],
                   help="add BIAS to a token's logit (llama-cli's form: 15043+1, 15043-1.5, 15043-inf: never); "
                        "repeatable")
    p.set_defaults(handler=run)


def logit_bias(text: str) -> tuple[int, float]:
    """llama-cli's --logit-bias TOKEN_ID(+/-)BIAS -> (token id, bias); -inf bans the token."""
    import math
    import re

    m = re.fullmatch(r"\s*(\d+)\s*([+-])\s*(inf|[0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*", text)
    if m is None:
        raise argparse.ArgumentTypeError(f"expected TOKEN_ID+BIAS or TOKEN_ID-BIAS (e.g. 15043+1, 15043-inf), "
                                         f"got {text!r}")
    value = math.inf if m.group(3) == "inf" else float(m.group(3))
    return int(m.group(1)), -value if m.group(2) == "-" else value


def _bundled() -> list[str]:
    from edgellama.grammar import bundled_names

    return bundled_names()


def _prompt_text(args: argparse.Namespace) -> str:
    if args.prompt is not None and args.file:
        raise ValueError("give the prompt with -p or -f, not both")
    if args.file:
        path = Path(args.file)
        if not path.is_file():
            raise FileNotFoundError(f"prompt file not found: {path}")
        return path.read_text(encoding="utf-8", errors="replace")
    return args.prompt or ""


def unescape(text: str) -> str:
    """llama.cpp's -e: backslash escapes in the prompt, as in a C string."""
    try:
        return codecs.decode(text.encode("utf-8", "backslashreplace"), "unicode_escape").encode(
            "latin-1", "backslashreplace").decode("utf-8", "replace")
    except UnicodeDecodeError as exc:
        raise ValueError(f"-e: bad escape in the prompt: {exc.reason}") from None


def _emit(out: TextIO, obj: dict[str, Any]) -> None:
    out.write(json.dumps(obj, ensure_ascii=False) + "\n")
    out.flush()


def _print_timings(tm: Any, err: TextIO) -> None:
    def line(label: str, n: int, ms: float, unit: str) -> str:
        per = ms / n if n else 0.0
        rate = n / (ms / 1000.0) if ms > 0 else 0.0
        return (f"edgellama: {label:>16} = {ms:10.2f} ms / {n:5d} {unit:6} ({per:8.2f} ms per token, "
                f"{rate:8.2f} tokens per second)")

    err.write(f"\nedgellama: {'load time':>16} = {tm.load_ms:10.2f} ms\n")
    err.write(line("prompt eval time", tm.prompt_tokens, tm.prompt_ms, "tokens") + "\n")
    err.write(line("eval time", tm.gen_tokens, tm.gen_ms, "runs") + "\n")
    err.flush()


def _params(args: argparse.Namespace) -> Any:
    """The flags as request parameters, checked by the request-parameter table (messages name the flags)."""
    from edgellama import params as R

    return R.check(R.GenParams(n_predict=args.n_predict, temperature=args.temp, top_k=args.top_k, top_p=args.top_p,
                               min_p=args.min_p, repeat_penalty=args.repeat_penalty,
                               repeat_last_n=args.repeat_last_n, mirostat=args.mirostat,
                               mirostat_tau=args.mirostat_ent, mirostat_eta=args.mirostat_lr, seed=args.seed,
                               ignore_eos=args.ignore_eos, stop=list(args.reverse_prompt),
                               logit_bias=list(args.logit_bias)), R.CLI)


# the generation's stop reasons as `run --json` has always named them
_JSON_REASON = {"eos": "stop", "stop": "reverse_prompt"}


def run(args: argparse.Namespace) -> int:
    """--json: whatever happens after the arguments parse, the stream ends with done or error."""
    if not args.json:
        return _run(args)
    from edgellama.cli.common import expected_errors

    try:
        return _run(args)
    except KeyboardInterrupt:
        _emit(sys.stdout, {"event": "error", "message": "interrupted"})
        raise
    except expected_errors() as exc:
        _emit(sys.stdout, {"event": "error", "message": str(exc)})
        raise


def _run(args: argparse.Namespace) -> int:
    from edgellama.generation import build_sampler
    from edgellama.llm import ContextFull
    from edgellama.tokenizers.chat import render_prompt

    text = _prompt_text(args)
    if args.escape:
        text = unescape(text)
    conversation = args.conversation and not args.no_conversation
    chat = args.chat or conversation or args.chat_template is not None
    interactive = (args.interactive or args.interactive_first or conversation) and not args.single_turn
    params = _params(args)
    if args.prompt_cache:
        check_session_path(Path(args.prompt_cache))
    out, err = sys.stdout, sys.stderr
    random_seed = params.seed is None
    if random_seed:
        args.seed = params.seed = random.SystemRandom().randrange(2**32)
    from edgellama.grammar import grammar_from_args

    grammar = grammar_from_args(args.grammar, args.grammar_file, args.json_schema)  # refused before the model loads
    reads_stdin = interactive or (args.single_turn and conversation and not text)
    if not text and not reads_stdin and not chat:
        raise ValueError("no prompt: give -p TEXT, -f FILE or -i")
    color = args.color and out.isatty() and not args.json
    llm = load(args)
    with llm:
        fmt = llm.chat if chat else None  # a model without a chat template stops here, before any output
        if random_seed and (args.temp > 0 or args.mirostat):  # greedy decoding draws nothing: no seed to report
            err.write(f"edgellama: seed = {args.seed}\n")
        if args.prompt_cache and Path(args.prompt_cache).exists():
            from edgellama.session import SessionError

            try:
                n = len(llm.load_session(args.prompt_cache))
                err.write(f"edgellama: prompt cache {args.prompt_cache}: {n} tokens restored\n")
            except SessionError as exc:
                err.write(f"edgellama: ignoring prompt cache: {exc}\n")
        tok = llm.tokenizer
        sampler = build_sampler(params, tok, llm.n_ctx)  # shared by the turns: penalties see the whole session
        stops = list(params.stop) + (list(fmt.stop_pieces) if fmt is not None else [])
        messages: list[dict[str, str]] = []
        if args.system:
            messages.append({"role": "system", "content": args.system})
        transcript = ""  # raw-text interactive mode: the whole conversation so far
        turn = 0
        first_turn_cache = True  # the prompt cache holds the first prompt only
        while True:
            typed = True
            if turn == 0 and args.interactive_first and text and fmt is None:
                transcript = text  # evaluated with the first input line, llama-cli's --interactive-first
            if turn == 0 and text and not args.interactive_first:
                user, typed = text, False
            else:
                if not args.json:
                    err.write("\n> ")
                    err.flush()
                line = sys.stdin.readline()
                if not line:
                    break
                line = line.rstrip("\n")
                user = args.in_prefix + (unescape(line) if args.escape else line) + args.in_suffix
                if turn == 0 and text and fmt is not None:
                    user = text + user
            turn += 1
            if fmt is not None:
                history = messages + [{"role": "user", "content": user}]
                ids = render_prompt(fmt, history).encode(tok)
            else:
                history = []
                ids = tok.encode(transcript + user, add_special=True, parse_special=args.parse_special)
            limit = llm.n_ctx - (1 if args.no_context_shift else 0)
            if len(ids) > limit:
                msg = f"the prompt has {len(ids)} tokens, the context only {llm.n_ctx} (-c)"
                if not interactive or turn == 1:
                    raise ContextFull(msg)
                err.write(f"edgellama: {msg}; starting a new conversation\n")
                messages = messages[:1] if args.system else []
                transcript = ""
                llm.reset()
                turn = 1
                continue
            if fmt is not None:
                messages = history
            else:
                transcript += user
            if args.json:
                _emit(out, {"event": "prompt", "n_tokens": len(ids)})
            elif not args.no_display_prompt and not typed:
                out.write(f"{COLOR_PROMPT}{user}{COLOR_RESET}" if color else user)
                if fmt is not None:
                    out.write("\n\n")  # the question, then the answer: chat text is not one continuation
                out.flush()
            reply = ""
            on_prompt = None
            if args.prompt_cache and first_turn_cache:
                def on_prompt() -> None:
                    llm.save_session(args.prompt_cache)
            first_turn_cache = False
            turn_sampler = sampler
            if grammar is not None:  # each answer starts at the grammar's root
                from edgellama.grammar import constrain

                turn_sampler = constrain(sampler, grammar, tok)
            # raw text keeps a reverse prompt in the text, as llama-cli shows it; a chat reply ends before it
            reason = ""
            for ev in llm.generate(ids, turn_sampler, params.n_predict, stop_ids=set() if args.ignore_eos else None,
                                   on_prompt=on_prompt, stops=stops, keep_stop=fmt is None):
                piece = ev.text
                reply += piece
                if args.json:
                    if piece or ev.kind == "token":
                        _emit(out, {"event": "token", "id": ev.token, "text": piece})
                    if ev.kind == "done":
                        reason = _JSON_REASON.get(ev.stop_reason, ev.stop_reason)
                        _emit(out, {"event": "done", "stop_reason": reason, "timings": ev.timings.as_dict()})
                else:
                    out.write(piece + ("\n" if ev.kind == "done" else ""))
                    out.flush()
                    if ev.kind == "done":
                        _print_timings(ev.timings, err)
                if ev.kind == "done" and ev.stop_reason == "context":
                    err.write(f"edgellama: the context is full ({llm.n_ctx} tokens, -c) and --no-context-shift "
                              "is set: generation stopped\n")
            if fmt is not None:
                messages.append({"role": "assistant", "content": reply})
            else:
                transcript += reply
            if not interactive:
                break
    return 0

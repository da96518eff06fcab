"""`edgellama run`: generate text from a prompt (llama.cpp's familiar flags), streaming tokens as
they are made, with llama.cpp-style timings at the end; `--chat` uses the model's turn format,
`-i` keeps a conversation going, `--json` prints one JSON object per event.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from edgellama.cli.common import INT32_MAX, add_model_args, check_range, load
from edgellama.session import check_session_path


def add_parser(sub: Any) -> None:
    p = sub.add_parser("run", help="generate text from a prompt", description=__doc__)
    add_model_args(p)
    p.add_argument("-p", "--prompt", help="prompt text")
    p.add_argument("-f", "--file", help="read the prompt from a file")
    p.add_argument("-n", "--n-predict", type=int, default=-1, help="tokens to generate (-1 = until end of text)")
    p.add_argument("--temp", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=40)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--min-p", type=float, default=0.05)
    p.add_argument("--repeat-penalty", type=float, default=1.0)
    p.add_argument("--repeat-last-n", type=int, default=64)
    p.add_argument("--mirostat", type=int, default=0, choices=(0, 2), help="2 = mirostat v2")
    p.add_argument("--mirostat-lr", type=float, default=0.1, help="mirostat eta")
    p.add_argument("--mirostat-ent", type=float, default=5.0, help="mirostat tau (target entropy)")
    p.add_argument("-s", "--seed", type=int, default=None)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat turn format")
    p.add_argument("-sys", "--system", default=None, help="system prompt (with --chat)")
    p.add_argument("-i", "--interactive", action="store_true", help="keep reading prompts from stdin")
    p.add_argument("--json", action="store_true", help="one JSON object per event on stdout")
    p.add_argument("--no-display-prompt", action="store_true", help="do not echo the prompt")
    p.add_argument("--special", action="store_true", help="parse special tokens written in the prompt text")
    p.add_argument("--prompt-cache", metavar="FILE", default=None,
                   help="reuse the KV cache saved in FILE when the prompt starts with its tokens; save it after "
                        "the prompt is evaluated")
    p.set_defaults(handler=run)


def _prompt_text(args: argparse.Namespace) -> str:
    if args.prompt is not None and args.file:
        raise ValueError("give the prompt with -p or -f, not both")
    if args.file:
        path = Path(args.file)
        if not path.is_file():
            raise FileNotFoundError(f"prompt file not found: {path}")
        return path.read_text(encoding="utf-8", errors="replace")
    return args.prompt or ""


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


def run(args: argparse.Namespace) -> int:
    from edgellama.llm import ContextFull
    from edgellama.sampling import Sampler, SamplerParams

    text = _prompt_text(args)
    check_range("-n/--n-predict", args.n_predict, -1, INT32_MAX)
    if args.prompt_cache:
        check_session_path(Path(args.prompt_cache))
    params = SamplerParams(temp=args.temp, top_k=args.top_k, top_p=args.top_p, min_p=args.min_p,
                           repeat_penalty=args.repeat_penalty, repeat_last_n=args.repeat_last_n,
                           mirostat=args.mirostat, mirostat_lr=args.mirostat_lr,
                           mirostat_ent=args.mirostat_ent, seed=args.seed)
    params.validate()
    if not text and not args.interactive and not args.chat:
        raise ValueError("no prompt: give -p TEXT, -f FILE or -i")
    out, err = sys.stdout, sys.stderr
    llm = load(args)
    with llm:
        if args.prompt_cache and Path(args.prompt_cache).exists():
            from edgellama.session import SessionError

            try:
                n = len(llm.load_session(args.prompt_cache))
                err.write(f"edgellama: prompt cache {args.prompt_cache}: {n} tokens restored\n")
            except SessionError as exc:
                err.write(f"edgellama: ignoring prompt cache: {exc}\n")
        sampler = Sampler(params, llm.n_ctx)
        tok = llm.tokenizer
        messages: list[dict[str, str]] = []
        if args.system:
            messages.append({"role": "system", "content": args.system})
        transcript = ""  # raw-text interactive mode: the whole conversation so far
        first = True
        first_turn_cache = True  # the prompt cache holds the first prompt only
        while True:
            if first and (text or not args.interactive):
                user = text
            else:
                if not args.json:
                    err.write("\n> ")
                    err.flush()
                line = sys.stdin.readline()
                if not line:
                    break
                user = line.rstrip("\n")
            first = False
            if args.chat:
                messages.append({"role": "user", "content": user})
                prompt_text = llm.chat.render(messages)
                ids = tok.encode(prompt_text, add_special=True, parse_special=True)
            else:
                transcript += user
                ids = tok.encode(transcript, add_special=True, parse_special=args.special)
            if args.json:
                _emit(out, {"event": "prompt", "n_tokens": len(ids)})
            elif not args.no_display_prompt and not args.interactive:
                out.write(user)
                out.flush()
            reply = ""
            on_prompt = None
            if args.prompt_cache and first_turn_cache:
                def on_prompt() -> None:
                    llm.save_session(args.prompt_cache)
            first_turn_cache = False
            try:
                for ev in llm.generate(ids, sampler, args.n_predict, on_prompt=on_prompt):
                    if ev.kind == "token":
                        reply += ev.text
                        if args.json:
                            _emit(out, {"event": "token", "id": ev.token, "text": ev.text})
                        else:
                            out.write(ev.text)
                            out.flush()
                    else:
                        reply += ev.text
                        if args.json:
                            if ev.text:
                                _emit(out, {"event": "token", "id": -1, "text": ev.text})
                            _emit(out, {"event": "done", "stop_reason": ev.stop_reason,
                                        "timings": ev.timings.as_dict()})
                        else:
                            out.write(ev.text + "\n")
                            out.flush()
                            _print_timings(ev.timings, err)
            except ContextFull as exc:
                if not args.interactive:
                    raise
                err.write(f"edgellama: {exc}; starting a new conversation\n")
                messages = messages[:1] if args.system else []
                transcript = ""
                llm.reset()
                continue
            if args.chat:
                messages.append({"role": "assistant", "content": reply})
            else:
                transcript += reply
            if not args.interactive:
                break
    return 0

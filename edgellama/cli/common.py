"""Flags shared by the subcommands that load a model (-m, -c, -t, -b, --cache-type)."""

from __future__ import annotations

import argparse
from pathlib import Path


def int_list(s: str) -> list[int]:
    try:
        vals = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None
    if not vals or any(v < 0 for v in vals):
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got {s!r}")
    return vals


def add_model_args(p: argparse.ArgumentParser, threads_list: bool = False) -> None:
    p.add_argument("-m", "--model", help="GGUF model file (default: the bundled Gemma 3 270M)")
    p.add_argument("-c", "--ctx-size", type=int, default=0, help="context size in tokens (default: 4096 or the model's)")
    if threads_list:
        p.add_argument("-t", "--threads", type=int_list, default=[0], help="thread counts, e.g. 1,2")
    else:
        p.add_argument("-t", "--threads", type=int, default=0, help="threads (default: the CPUs available)")
    p.add_argument("-b", "--batch-size", type=int, default=512, help="prompt tokens per forward pass")
    p.add_argument("--cache-type", choices=("f16", "q8_0", "f32"), default="f16",
                   help="KV cache format (q8_0 halves it)")
    p.add_argument("--mem-budget", metavar="SIZE", default=None,
                   help="RAM budget, e.g. 300M or 1.5G: without -c, the largest context that fits; refuses a model "
                        "that does not fit, showing the plan")
    p.add_argument("--keep", type=int, default=0,
                   help="tokens kept at the start when the context fills up and shifts (system prompt, sinks)")
    p.add_argument("--no-context-shift", action="store_true",
                   help="stop at a full context instead of dropping the oldest tokens")
    p.add_argument("--numerics", choices=("native", "llamacpp"), default="native",
                   help="native: this CPU's fastest kernels; llamacpp: llama.cpp's own order of every float "
                        "operation (its x86 build), so logits and greedy text equal llama.cpp's bit for bit")


def model_path(args: argparse.Namespace) -> Path:
    if args.model:
        path = Path(args.model)
        if not path.exists():
            raise FileNotFoundError(f"model file not found: {path}")
        if not path.is_file():
            raise ValueError(f"model path is not a file: {path}")
        return path
    from edgellama.default_model import default_model_path

    return default_model_path()


INT32_MAX = (1 << 31) - 1
MAX_CTX = 1 << 24  # memplan.MAX_CTX, repeated so that `info` need not import numpy to check a flag
MAX_THREADS = 64


def check_range(flag: str, value: int, lo: int, hi: int) -> None:
    """Refuses a flag's value outside lo..hi, naming the flag (before it reaches arithmetic or C)."""
    if not lo <= value <= hi:
        raise ValueError(f"{flag} {value} is out of range ({lo}..{hi})")


def check_model_args(args: argparse.Namespace) -> None:
    """The flags of add_model_args (and info --plan's subset), each within what the engine takes."""
    check_range("-c/--ctx-size", args.ctx_size, 0, MAX_CTX)
    for t in args.threads if isinstance(args.threads, list) else [args.threads]:
        check_range("-t/--threads", t, 0, MAX_THREADS)
    check_range("-b/--batch-size", args.batch_size, 1, INT32_MAX)
    check_range("--keep", getattr(args, "keep", 0), 0, INT32_MAX)


def load(args: argparse.Namespace):  # -> LLM (import kept lazy: `info` must start fast)
    from edgellama.llm import LLM

    check_model_args(args)
    from edgellama.memplan import parse_size

    budget = parse_size(args.mem_budget) if args.mem_budget else None
    return LLM(model_path(args), n_ctx=args.ctx_size or None, n_batch=args.batch_size,
               n_threads=args.threads or None, kv_type=args.cache_type, mem_budget=budget, n_keep=args.keep,
               context_shift=not args.no_context_shift, numerics=args.numerics)

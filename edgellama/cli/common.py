"""Flags shared by the subcommands that load a model (-m, -c, -t, -b, --cache-type, llama.cpp's
GPU flags that mean nothing here), the parser every subcommand uses, and the exit codes."""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any, NoReturn

from edgellama.gguf.limits import INT32_MAX  # noqa: F401 - re-exported for the commands

# one model's settings, whoever gives them (edgellama/load_options.py): the commands reach them from here
from edgellama.load_options import (  # noqa: F401 - re-exported for the commands
    MAX_CTX,
    MAX_THREADS,
    check_model_args,
    check_range,
    load,
    lora_list,
    model_path,
)

# --numerics: engine.NUMERICS's names (tests/test_c_api.py holds the two equal)
NUMERICS = ("native", "llamacpp", "llamacpp-avx2", "llamacpp-avx512")

EXIT_ERROR, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


class Parser(argparse.ArgumentParser):
    """No abbreviations (llama.cpp's `-fa`, `-ngl`, `-cnv` must never parse as `-f a`, `-n gl`, `-c nv`
    or as a prefix of a longer flag), and usage errors in the one `edgellama: error:` form, exit 2."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"edgellama: error: {message}\n")


def expected_errors() -> tuple[type[BaseException], ...]:
    from edgellama.default_model import ModelNotAvailable
    from edgellama.generation import NonFiniteLogits
    from edgellama.gguf.reader import GGUFError

    errs: list[type[BaseException]] = [GGUFError, ModelNotAvailable, NonFiniteLogits, OSError, ValueError]
    try:
        from edgellama.native.lib import KernelError

        errs.append(KernelError)
    except (ImportError, ValueError):  # not built, or a bad EDGELLAMA_ISA: reported where it is used
        pass
    return tuple(errs)


def int_list(s: str) -> list[int]:
    try:
        vals = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None
    if not vals or any(v < 0 for v in vals):
        raise argparse.ArgumentTypeError(f"expected non-negative integers, got {s!r}")
    return vals


class _Ignored(argparse.Action):
    """A llama.cpp flag with no meaning here: accepted, and said so once on stderr."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        print(f"edgellama: {option_string} is ignored ({self.help})", file=sys.stderr)


def add_ignored_args(p: argparse.ArgumentParser) -> None:
    """llama.cpp's GPU / backend / memory-mapping flags, so its command lines run unchanged."""
    g = p.add_argument_group("llama.cpp flags accepted and ignored (one stderr line each)")
    cpu = "no GPU offload: everything runs on this CPU"
    g.add_argument("-ngl", "--gpu-layers", "--n-gpu-layers", metavar="N", action=_Ignored, help=cpu)
    g.add_argument("-fa", "--flash-attn", nargs="?", metavar="on|off|auto", action=_Ignored,
                   help="attention is one fused CPU kernel")
    g.add_argument("-dev", "--device", metavar="DEV", action=_Ignored, help=cpu)
    g.add_argument("-sm", "--split-mode", metavar="MODE", action=_Ignored, help=cpu)
    g.add_argument("-mg", "--main-gpu", metavar="N", action=_Ignored, help=cpu)
    g.add_argument("-ts", "--tensor-split", metavar="SPLIT", action=_Ignored, help=cpu)
    g.add_argument("-nkvo", "--no-kv-offload", nargs=0, action=_Ignored, help=cpu)
    g.add_argument("--no-mmap", nargs=0, action=_Ignored, help="weights are always used in place from the mmapped file")
    g.add_argument("--mlock", nargs=0, action=_Ignored, help="pages are not locked")
    g.add_argument("--numa", metavar="MODE", action=_Ignored, help="no NUMA placement")


class _AddLora(argparse.Action):
    """--lora FILE and --lora-scaled FILE SCALE into one list of (file, scale), in command-line order
    (the order the adapters are applied in)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        if option_string == "--lora-scaled":
            path, text = values
            try:
                scale = float(text)
            except ValueError:
                parser.error(f"--lora-scaled {path} {text}: the scale must be a number")
            if not math.isfinite(scale):
                parser.error(f"--lora-scaled {path} {text}: the scale must be finite")
        else:
            path, scale = values, 1.0
        have = getattr(namespace, self.dest, None)  # serve's --config marks it unset (service/config.py)
        setattr(namespace, self.dest, [*(have if isinstance(have, list) else []), (Path(path), scale)])


def add_lora_args(p: Any) -> None:
    """llama.cpp's adapter flags (an argument parser or group)."""
    p.add_argument("--lora", metavar="FILE", action=_AddLora, dest="lora", default=[],
                   help="a GGUF LoRA adapter, at scale 1 (repeatable; applied in the order given)")
    p.add_argument("--lora-scaled", metavar=("FILE", "SCALE"), nargs=2, action=_AddLora, dest="lora",
                   help="a GGUF LoRA adapter at a user scale (repeatable); alpha / rank of the file applies too")


def add_model_args(p: argparse.ArgumentParser, threads_list: bool = False, several: bool = False) -> None:
    """several: -m is repeatable, NAME=FILE (serve's several models, edgellama.service.model_config)."""
    if several:
        p.add_argument("-m", "--model", action="append", metavar="[NAME=]FILE",
                       help="GGUF file or a model name from `edgellama list` (default: the bundled Gemma 3 270M); "
                            "NAME=FILE, repeated, serves several models, a request's `model` choosing one")
    else:
        p.add_argument("-m", "--model",
                       help="GGUF file or a model name from `edgellama list` (default: the bundled Gemma 3 270M)")
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
    p.add_argument("--numerics", choices=NUMERICS, default="native",
                   help="native: this CPU's fastest kernels; llamacpp: llama.cpp's own order of every float "
                        "operation as its x86 build for this CPU runs it (AVX-512 or AVX2), so logits and greedy "
                        "text equal llama.cpp's bit for bit; llamacpp-avx2, llamacpp-avx512: that of the build named")
    add_lora_args(p)
    add_ignored_args(p)

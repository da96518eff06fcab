"""The `edgellama` command: one subcommand per job (run, embed, perplexity, bench, info, pull, list, split, merge, quantize,
export-lora, convert).

Every expected failure (bad file, bad flag, missing model, prompt too long) ends as one line on
stderr, `edgellama: error: ...`, and a non-zero exit, never a traceback. Exit status, the same in
every subcommand: 0 done; 1 the work failed (bad model file, bad value, prompt too long, checksum
mismatch); 2 usage error or missing input (unknown flag, no such file, model not installed or not
pulled); 130 interrupted.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable

# numpy's OpenBLAS starts a thread per core at import, and its threads spin after each call: on a
# 2-core board that is a core taken from the engine's own pool (1-2% of a prompt's samples here).
# The command does no BLAS work that threads would speed up; set before anything imports numpy.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from edgellama.cli.common import EXIT_ERROR, EXIT_INTERRUPTED, EXIT_USAGE, Parser, expected_errors

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_USAGE", "build_parser", "main"]


def build_parser() -> argparse.ArgumentParser:
    from edgellama.cli import (
        bench,
        client,
        convert,
        embed,
        export_lora,
        info,
        install_service,
        models,
        perplexity,
        quantize,
        run,
        serve,
        split,
    )

    p = Parser(prog="edgellama", description="Offline LLM inference for small boards (GGUF).")
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for mod in (run, embed, perplexity, bench, info, models, serve, client, install_service, split, quantize,
                export_lora, convert):
        mod.add_parser(sub)
    return p


def _version() -> str:
    from edgellama import __version__

    return f"edgellama {__version__}"


def _missing_input(exc: BaseException) -> bool:
    from edgellama.default_model import ModelNotAvailable
    from edgellama.registry import UnknownModel

    return isinstance(exc, (FileNotFoundError, ModelNotAvailable, UnknownModel))


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["info"]:
        from edgellama.cli import info

        if info.several_models(argv[1:]):  # `info --plan` on serve's flags for several models
            return info.models_plan(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    if getattr(args, "json", False):
        from edgellama import progress

        progress.silence()
    try:
        return int(handler(args) or 0)
    except KeyboardInterrupt:
        print("edgellama: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0
    except expected_errors() as exc:
        print(f"edgellama: error: {exc}", file=sys.stderr)
        return EXIT_USAGE if _missing_input(exc) else EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())

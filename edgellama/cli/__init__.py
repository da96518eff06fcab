"""The `edgellama` command: one subcommand per job (run, perplexity, bench, info, serve).

Every expected failure (bad file, bad flag, missing model, prompt too long) ends as one line on
stderr and a non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

EXIT_ERROR = 1


def expected_errors() -> tuple[type[BaseException], ...]:
    from edgellama.default_model import ModelNotAvailable
    from edgellama.gguf.reader import GGUFError

    errs: list[type[BaseException]] = [GGUFError, ModelNotAvailable, OSError, ValueError]
    try:
        from edgellama.native.lib import KernelError

        errs.append(KernelError)
    except ImportError:
        pass
    return tuple(errs)


def build_parser() -> argparse.ArgumentParser:
    from edgellama.cli import bench, client, info, install_service, perplexity, run, serve

    p = argparse.ArgumentParser(prog="edgellama", description="Offline LLM inference for small boards (GGUF).")
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for mod in (run, perplexity, bench, info, serve, client, install_service):
        mod.add_parser(sub)
    return p


def _version() -> str:
    from edgellama import __version__

    return f"edgellama {__version__}"


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return int(handler(args) or 0)
    except KeyboardInterrupt:
        print("edgellama: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except expected_errors() as exc:
        print(f"edgellama: error: {exc}", file=sys.stderr)
        return EXIT_ERROR


if __name__ == "__main__":
    sys.exit(main())

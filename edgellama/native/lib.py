"""Loads the compiled cffi extension and turns C status codes into exceptions.

Everything that calls into C goes through ``lib``/``ffi`` from here.
"""

from __future__ import annotations

import os

# EDGELLAMA_ISA is checked here, before the library loads: a typo is an error, not a silent fallback.
ISA_CHOICES = ("auto", "scalar", "avx2", "avx512", "neon", "neon-dotprod")
_isa = os.environ.get("EDGELLAMA_ISA", "")
if _isa and _isa not in ISA_CHOICES:
    raise ValueError(f"EDGELLAMA_ISA={_isa!r} is not a kernel set; choices: {', '.join(ISA_CHOICES)}")


def _not_built_hint() -> str:
    from edgellama.default_model import source_checkout

    root = source_checkout()
    if root is not None:  # imported from a clone (editable install, PYTHONPATH, pytest in the checkout)
        return (f"edgellama's C library is not built in the source checkout {root}: build it in place with "
                f"`pip install -e '.[test,model]'` there (or `python3 edgellama/native/build.py`)")
    return "edgellama's C library is missing from this installation: reinstall with `pip install --force-reinstall edgellama`"


try:
    from edgellama.native._edgellama_c import ffi, lib  # type: ignore[import-not-found]
except ImportError as exc:  # pragma: no cover - only without a build
    raise ImportError(_not_built_hint()) from exc


class KernelError(RuntimeError):
    """A call into the C library returned an error status."""

    def __init__(self, what: str, status: int) -> None:
        super().__init__(f"{what}: {ffi.string(lib.el_status_str(status)).decode()} ({status})")
        self.status = status


def check(status: int, what: str) -> None:
    if status != 0:
        raise KernelError(what, status)


__all__ = ["KernelError", "check", "ffi", "lib"]

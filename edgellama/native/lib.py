"""Loads the compiled cffi extension and turns C status codes into exceptions.

Everything that calls into C goes through ``lib``/``ffi`` from here.
"""

from __future__ import annotations

try:
    from edgellama.native._edgellama_c import ffi, lib  # type: ignore[import-not-found]
except ImportError as exc:  # pragma: no cover - only without a build
    raise ImportError(
        "edgellama's C library is not built: install the package with 'pip install .' "
        "(or 'python edgellama/native/build.py' in a source tree)"
    ) from exc


class KernelError(RuntimeError):
    """A call into the C library returned an error status."""

    def __init__(self, what: str, status: int) -> None:
        super().__init__(f"{what}: {ffi.string(lib.el_status_str(status)).decode()} ({status})")
        self.status = status


def check(status: int, what: str) -> None:
    if status != 0:
        raise KernelError(what, status)


__all__ = ["KernelError", "check", "ffi", "lib"]

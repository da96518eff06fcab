"""The hook that protects each file mapping the GGUF reader makes against the file being truncated
underneath it (reads of the lost pages raise SIGBUS). Only C can catch that signal and this layer never
imports the C binding, so the guard is installed from above: the package root (edgellama/__init__.py)
installs the C library's (edgellama.native.sigbus) for every process that imports edgellama."""

from __future__ import annotations

import mmap
from collections.abc import Callable
from pathlib import Path

# Called with a new mapping and the path of its file; returns the function that unregisters the mapping
# (the reader calls it right after unmapping), or None when the mapping is left unguarded.
MappingGuard = Callable[[mmap.mmap, Path], Callable[[], object] | None]

_guard: MappingGuard | None = None


def set_mapping_guard(guard: MappingGuard | None) -> MappingGuard | None:
    """Installs guard for every mapping made from now on (None: no guard); returns the one it replaces."""
    global _guard
    previous, _guard = _guard, guard
    return previous


def guard_mapping(mm: mmap.mmap, path: Path) -> Callable[[], object] | None:
    """Hands mm to the installed guard; None (unguarded) when there is none."""
    return None if _guard is None else _guard(mm, path)

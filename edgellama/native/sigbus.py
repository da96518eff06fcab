"""Registers file mappings with the C library's SIGBUS handler, so that a model file truncated on disk
while mapped ends the process with one line naming the file instead of a silent bus error (rc 135).

Only C can catch this signal: a Python signal handler runs between bytecodes, too late for a fault
inside the engine. The process still exits (a read from a lost page cannot be resumed).
"""

from __future__ import annotations

import mmap
import os
import weakref
from collections.abc import Callable

from edgellama.native.lib import ffi, lib

EXIT_CODE = int(lib.EL_SIGBUS_EXIT_CODE)


def guard(mm: mmap.mmap, path: str | os.PathLike[str]) -> Callable[[], None]:
    """Registers mm's address range under path; returns the unregister function, which runs by
    itself when the mmap object goes away (call it sooner, right after mm.close() unmaps).
    A full registration table leaves the mapping unguarded rather than failing the open."""
    buf = ffi.from_buffer(mm)
    try:
        addr = int(ffi.cast("uintptr_t", buf))
    finally:
        ffi.release(buf)  # the export would keep mm from closing
    name = os.fsencode(path)
    if lib.el_sigbus_register(ffi.cast("void *", addr), len(mm), name) != 0:
        return lambda: None
    return weakref.finalize(mm, lib.el_sigbus_unregister, ffi.cast("void *", addr))

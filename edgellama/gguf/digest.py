"""sha256 of a whole file, read in chunks: what a manifest or a model card publishes for a model file.
Standard library only; showing progress is the caller's (progress is called with the bytes read so far).
Also a file's identity (device, inode, size, mtime, ctime): what tells a mapped model from the file its
path names now, and sha256 of mapped bytes themselves (what is checked is what the engine reads)."""

from __future__ import annotations

import hashlib
import os
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

CHUNK = 4 << 20


def identity(path: str | os.PathLike[str]) -> tuple[int, ...]:
    """The file path names now, as GGUFFile.identity records the one it mapped; () if there is none.
    Renaming another file over the path changes the inode; writing into it changes size, mtime or ctime."""
    try:
        st = os.stat(path)
    except OSError:
        return ()
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def sha256_buffer(buf: Any, stop: threading.Event | None = None) -> str | None:
    """sha256 of a buffer (a mapped file), CHUNK bytes at a time (hashlib lets go of the GIL for each, so
    the hash runs beside Python work on another core); None when stop was set before the end."""
    h = hashlib.sha256()
    mv = memoryview(buf)
    try:
        for start in range(0, len(mv), CHUNK):
            if stop is not None and stop.is_set():
                return None
            h.update(mv[start:start + CHUNK])
    finally:
        mv.release()
    return h.hexdigest()


def sha256_file(path: Path, chunk: int = 1 << 20, progress: Callable[[int], None] | None = None) -> str:
    h = hashlib.sha256()
    done = 0
    with open(path, "rb") as f:
        while True:
            b = f.read(chunk)
            if not b:
                return h.hexdigest()
            h.update(b)
            done += len(b)
            if progress is not None:
                progress(done)

"""sha256 of a whole file, read in chunks: what a manifest or a model card publishes for a model file.
Standard library only; showing progress is the caller's (progress is called with the bytes read so far)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path


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

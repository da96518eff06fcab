"""Session files: the KV cache and the tokens it holds, saved so that a fixed prompt (a kiosk's system
prompt) is evaluated once and reloaded at start. Validated on load: model fingerprint, context,
batch, cache type and numerics mode must match (a cache filled under llama.cpp's numerics holds other
roundings than the native ones), and the C side re-checks the blob's structure."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

MAGIC = b"EDGELLAMA-SESSION\n"
VERSION = 1
MAX_HEADER = 1 << 26  # the token list lives in the header; 64 MiB covers any context


class SessionError(ValueError):
    """A session file that cannot be used with this model and settings."""


def model_fingerprint(path: Path, data_offset: int) -> str:
    """sha256 of the GGUF header (metadata + tensor table) and the file size: identifies the model
    without reading its 100s of MB of weights."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        remaining = data_offset
        while remaining > 0:
            b = f.read(min(remaining, 1 << 20))
            if not b:
                break
            h.update(b)
            remaining -= len(b)
    h.update(str(path.stat().st_size).encode())
    return h.hexdigest()


def check_session_path(path: Path) -> None:
    """Refuses, before any work, a session path that can be neither read nor written: a directory or
    other non-file, an unreadable file, or a folder that does not exist or cannot be written to."""
    if path.exists() or path.is_symlink():
        if not path.is_file():
            raise SessionError(f"prompt cache {path} is not a regular file")
        if not os.access(path, os.R_OK):
            raise SessionError(f"prompt cache {path} cannot be read")
    folder = path.parent
    if not folder.is_dir():
        raise SessionError(f"prompt cache {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise SessionError(f"prompt cache {path}: folder {folder} is not writable")


def _mismatch(key: str, saved: Any, want: Any) -> str:
    if key == "model":
        return "another model"
    if key == "numerics":  # a cache filled under one mode's roundings does not continue another's
        mode = "an unrecorded (older edgellama)" if saved is None else saved
        return f"{mode} numerics, now {want} (its KV cache holds that mode's roundings)"
    return f"{key}={saved!r}, now {want!r}"


def save(path: Path, header: dict[str, Any], blob: bytes) -> None:
    meta = dict(header, version=VERSION, blob_bytes=len(blob), blob_sha256=hashlib.sha256(blob).hexdigest())
    head = json.dumps(meta, separators=(",", ":")).encode()
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(MAGIC)
        f.write(len(head).to_bytes(8, "little"))
        f.write(head)
        f.write(blob)
    os.replace(tmp, path)  # never leave a half-written session under the real name


def load(path: Path, expect: dict[str, Any]) -> tuple[list[int], bytes]:
    """(tokens, blob) of a session file whose header matches every key of expect."""
    try:
        with open(path, "rb") as f:
            if f.read(len(MAGIC)) != MAGIC:
                raise SessionError(f"{path} is not an edgellama session file")
            n = int.from_bytes(f.read(8), "little")
            if not 0 < n <= MAX_HEADER:
                raise SessionError(f"{path}: damaged session header")
            try:
                meta = json.loads(f.read(n))
            except (UnicodeDecodeError, json.JSONDecodeError):
                raise SessionError(f"{path}: damaged session header") from None
            if not isinstance(meta, dict) or meta.get("version") != VERSION:
                raise SessionError(f"{path}: unsupported session version {meta.get('version') if isinstance(meta, dict) else '?'}")
            for key, want in expect.items():
                if meta.get(key) != want:
                    raise SessionError(f"{path} was saved for {_mismatch(key, meta.get(key), want)}")
            size = meta.get("blob_bytes")
            if not isinstance(size, int) or size < 0 or size > os.fstat(f.fileno()).st_size:
                raise SessionError(f"{path}: damaged session (bad size)")
            blob = f.read(size)
    except OSError as exc:
        raise SessionError(f"cannot read session {path}: {exc.strerror or exc}") from None
    if len(blob) != size or hashlib.sha256(blob).hexdigest() != meta.get("blob_sha256"):
        raise SessionError(f"{path}: session data is truncated or damaged")
    tokens = meta.get("tokens")
    if not isinstance(tokens, list) or not all(isinstance(t, int) for t in tokens):
        raise SessionError(f"{path}: damaged session (token list)")
    return tokens, blob

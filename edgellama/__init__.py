"""edgellama: offline LLM inference for small ARM boards (GGUF models, quantized C kernels).

Public names: LLM (a loaded model, llama-cpp-python's high-level API), dequantize / quantize (the
block formats), __version__.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["LLM", "__version__", "dequantize", "quantize"]


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

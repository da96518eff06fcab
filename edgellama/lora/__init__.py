"""LoRA adapters in llama.cpp's GGUF layout: reading and validating them against a base model
(adapter.py) and merging them into a new model file (export.py). Applying them at run time is the
engine's job; nothing here touches the base weights in place."""

from edgellama.lora.adapter import LoraAdapter, LoraError, LoraWeight, read_adapter

__all__ = ["LoraAdapter", "LoraError", "LoraWeight", "read_adapter"]

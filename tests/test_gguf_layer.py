"""The GGUF layer knows the file format only (docs/architecture.md, "Layers"): no module under
edgellama/gguf/ imports the C binding (edgellama.native) or any layer above it. Read from the source with
ast, so an import inside a function or under TYPE_CHECKING counts as much as one at the top."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from edgellama.gguf import mapguard
from edgellama.gguf.reader import GGUFFile
from edgellama.gguf.writer import GGUFWriter

ROOT = Path(__file__).resolve().parent.parent
GGUF = ROOT / "edgellama" / "gguf"
LAYER = "edgellama.gguf"


def _inside(name: str) -> bool:
    return name == LAYER or name.startswith(LAYER + ".")


def outside_imports(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, name) of every edgellama name the source of `module` imports from outside edgellama.gguf:
    `import`, `from ... import` (absolute or relative; `from edgellama import native` counts as
    edgellama.native), wherever the statement is, and importlib.import_module / __import__ of a literal."""
    package = module if is_package else module.rpartition(".")[0]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            f = node.func
            called = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if called in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                names = [node.args[0].value]
        found += [(node.lineno, n) for n in names
                  if (n == "edgellama" or n.startswith("edgellama.")) and not _inside(n)]
    return found


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_the_checker_sees_every_kind_of_import() -> None:
    src = textwrap.dedent("""
        import numpy
        import edgellama.gguf.reader
        from edgellama.gguf import writer
        from . import ggml_types
        from .split import open_model_file
        from typing import TYPE_CHECKING
        import edgellama.native.lib
        from edgellama.native.desc import INT32_MAX
        from edgellama import native
        from .. import wiring
        if TYPE_CHECKING:
            from edgellama.llm import LLM
        def f():
            from edgellama.native import kernels
            import importlib
            return importlib.import_module("edgellama.default_model"), __import__("edgellama.native.sigbus")
        class C:
            def g(self):
                from ..native.sigbus import guard
    """)
    found = outside_imports(src, "edgellama.gguf.example")
    assert sorted(n for _, n in found) == sorted([
        "edgellama.native.lib", "edgellama.native.desc.INT32_MAX", "edgellama.native", "edgellama.wiring",
        "edgellama.llm.LLM", "edgellama.native.kernels", "edgellama.default_model", "edgellama.native.sigbus",
        "edgellama.native.sigbus.guard",
    ]), found
    assert outside_imports("from . import reader\n", "edgellama.gguf", is_package=True) == []
    assert outside_imports("from .. import native\n", "edgellama.gguf", is_package=True) == [(1, "edgellama.native")]


def test_gguf_modules_import_nothing_outside_the_gguf_layer() -> None:
    paths = sorted(GGUF.rglob("*.py"))
    assert {p.name for p in paths} >= {"reader.py", "writer.py", "metadata.py", "split.py"}
    bad = [f"{p.relative_to(ROOT)}:{line}: {name}"
           for p in paths
           for line, name in outside_imports(p.read_text(encoding="utf-8"), _module_name(p), p.name == "__init__.py")]
    assert not bad, "edgellama/gguf/ imports outside its layer:\n" + "\n".join(bad)


def test_importing_the_gguf_layer_loads_no_other_edgellama_module() -> None:
    """What the source check cannot see: the package root runs first on any import, and must stay
    light (it installs the mapping guard without loading the C binding)."""
    mods = sorted(_module_name(p) for p in GGUF.rglob("*.py"))
    code = ("import importlib, sys\n"
            f"for m in {mods!r}: importlib.import_module(m)\n"
            "print(' '.join(sorted(m for m in sys.modules if m.startswith('edgellama'))))\n")
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                       check=True)
    loaded = p.stdout.split()
    assert "edgellama.gguf.reader" in loaded
    assert [m for m in loaded if m != "edgellama" and not _inside(m)] == [], loaded


def test_the_reader_hands_each_mapping_to_the_installed_guard(tmp_path: Path) -> None:
    w = GGUFWriter(tmp_path / "m.gguf", arch="llama")  # no array metadata: nothing keeps the mapping past close()
    w.add_tensor("t", np.arange(64, dtype=np.float32))
    path = w.write()
    calls: list[tuple[int, Path]] = []
    released: list[Path] = []

    def fake(mm: object, p: Path) -> Callable[[], object]:
        calls.append((len(mm), p))  # type: ignore[arg-type]
        return lambda: released.append(p)

    previous = mapguard.set_mapping_guard(fake)
    try:
        with GGUFFile(path) as f:
            assert calls == [(f.file_size, path)] and released == []
        assert released == [path]
        assert mapguard.set_mapping_guard(None) is fake
        with GGUFFile(path):  # no guard: the reader works unguarded
            pass
        assert len(calls) == 1
    finally:
        mapguard.set_mapping_guard(previous)


@pytest.mark.parametrize("entry", ["edgellama.gguf.reader", "edgellama"])
def test_importing_edgellama_installs_the_c_sigbus_guard(entry: str) -> None:
    code = textwrap.dedent(f"""
        import importlib, sys
        importlib.import_module({entry!r})
        from edgellama.gguf import mapguard
        assert 'edgellama.native.lib' not in sys.modules  # installed without loading the C library
        guard = mapguard.set_mapping_guard(None)
        print(guard.__module__, guard.__qualname__)
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env,
                       check=False)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["edgellama", "_sigbus_guard"]

"""The wheel carries the whole package: every module of the source tree is in the built wheel (x86 here;
the aarch64 wheel in test_aarch64.py) and imports from it, with its C extension, outside the source tree."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

IMPORT_ALL = """
import importlib, pkgutil, sys
import edgellama
mods = sorted(m.name for m in pkgutil.walk_packages(edgellama.__path__, 'edgellama.') if not m.name.endswith('__main__'))
for name in mods:
    mod = importlib.import_module(name)
    assert mod.__file__.startswith(sys.argv[1]), (name, mod.__file__)
print(' '.join(mods))
"""


def source_modules() -> set[str]:
    """Module names of every .py in the package folders of the source tree (no __main__)."""
    pkg = ROOT / "edgellama"
    names = set()
    for py in pkg.rglob("*.py"):
        rel = py.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        if rel.name != "__main__":
            names.add(".".join(parts))
    return names


def walked_modules() -> set[str]:
    """What pkgutil.walk_packages finds in an installed copy: the source modules but the top package
    itself (it lists what is under it), and the C extension module."""
    return (source_modules() - {"edgellama"}) | {"edgellama.native._edgellama_c"}


def wheel_modules(names: list[str]) -> set[str]:
    out = set()
    for n in names:
        if n.endswith(".py") and n.startswith("edgellama/"):
            rel = Path(n).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            if rel.name != "__main__":
                out.add(".".join(parts))
    return out


def test_every_source_module_is_in_a_package_folder() -> None:
    # a folder of modules without __init__.py is left out of the wheel by setuptools' find
    for py in (ROOT / "edgellama").rglob("*.py"):
        for parent in py.relative_to(ROOT).parents:
            if parent != Path("."):
                assert (ROOT / parent / "__init__.py").is_file(), f"{parent} has no __init__.py"


def build_wheel(tmp_path: Path) -> Path:
    """The x86 wheel pip builds from this checkout (the C library compiled as setuptools does)."""
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "-w", str(tmp_path / "dist"), str(ROOT)], capture_output=True, text=True, timeout=900,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    wheels = list((tmp_path / "dist").glob("edgellama-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.mark.slow
def test_built_wheel_contains_and_imports_every_module(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        z.extractall(tmp_path / "site")
    assert wheel_modules(names) == source_modules()
    assert any(n.startswith("edgellama/native/_edgellama_c") and n.endswith(".so") for n in names), names
    assert "edgellama/__main__.py" in names and "edgellama/cli/__main__.py" in names
    # the units and default config that install-service puts in place, as data files under the prefix
    data = f"edgellama-{wheel.name.split('-')[1]}.data/data/share/edgellama/systemd"
    for unit in ("edgellama.service", "edgellama.socket", "edgellama.toml", "edgellama-tcp.conf"):
        assert f"{data}/{unit}" in names, names
        assert (tmp_path / "site" / data / unit).read_bytes() == (ROOT / "systemd" / unit).read_bytes()
    site = str(tmp_path / "site")
    # -P and cwd outside the checkout: the source tree cannot shadow the unpacked wheel
    run = subprocess.run([sys.executable, "-P", "-c", IMPORT_ALL, site], cwd=tmp_path, capture_output=True,
                         text=True, env={"PYTHONPATH": site, "PATH": "/usr/bin:/bin"}, timeout=300, check=False)
    assert run.returncode == 0, run.stderr[-4000:]
    assert set(run.stdout.split()) == walked_modules()


@pytest.mark.slow
def test_install_service_from_an_installed_wheel_finds_the_units(tmp_path: Path) -> None:
    """Outside a checkout, install-service takes the units the wheel installed under its prefix."""
    wheel = build_wheel(tmp_path)
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=300)
    py = str(venv / "bin" / "python")
    subprocess.run([py, "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel)],
                   check=True, timeout=300, capture_output=True)
    root = tmp_path / "root"
    r = subprocess.run([py, "-P", "-m", "edgellama.cli", "install-service", "--root", str(root), "--exec",
                        "/usr/bin/edgellama"], cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert r.returncode == 0, r.stderr
    for unit in ("edgellama.service", "edgellama.socket", "edgellama-serial@.service"):
        assert (root / "etc/systemd/system" / unit).read_text() == (ROOT / "systemd" / unit).read_text()
    for conf in ("edgellama.toml", "serial.toml"):
        assert (root / "etc/edgellama" / conf).read_bytes() == (ROOT / "systemd" / conf).read_bytes()
    assert "99-edgellama-serial.rules" in r.stdout


"""The standalone C test runner (csrc/tests/run_tests.c) built and run natively, warnings as errors,
then again under AddressSanitizer + UndefinedBehaviorSanitizer; plus its golden-vector round trip."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import skip_or_fail

ROOT = Path(__file__).resolve().parent.parent
BUILD_SH = ROOT / "csrc" / "tests" / "build.sh"
SUMMARY = re.compile(r"^(\d+) passed, (\d+) failed$")
SANITIZE = ["-fsanitize=address,undefined", "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]


def _cc() -> str:
    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        skip_or_fail(f"no C compiler ({cc})")
    return cc


def _build(out: Path, *cflags: str) -> Path:
    env = dict(os.environ, CC=_cc())
    proc = subprocess.run(
        ["sh", str(BUILD_SH), str(out), *cflags],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, f"build failed:\n{proc.stdout}\n{proc.stderr}"
    return out


def _run(
    binary: Path, *args: str, env_extra: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, **(env_extra or {}))
    env.pop("EDGELLAMA_ISA", None)
    return subprocess.run(
        [str(binary), *args], env=env, check=False, capture_output=True, text=True, timeout=600
    )


def _summary(proc: subprocess.CompletedProcess[str]) -> tuple[int, int]:
    lines = proc.stdout.strip().splitlines()
    assert lines, f"no output; stderr:\n{proc.stderr}"
    m = SUMMARY.match(lines[-1])
    assert m, f"last line is not the summary: {lines[-1]!r}\n{proc.stderr}"
    return int(m.group(1)), int(m.group(2))


def _sanitizers_available(tmp: Path) -> bool:
    src = tmp / "probe.c"
    src.write_text("int main(void) { return 0; }\n")
    proc = subprocess.run(
        [_cc(), *SANITIZE, str(src), "-o", str(tmp / "probe")], check=False, capture_output=True
    )
    return proc.returncode == 0 and subprocess.run([str(tmp / "probe")], check=False).returncode == 0


@pytest.fixture(scope="module")
def native_runner(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _build(tmp_path_factory.mktemp("native") / "run_tests")


def test_every_isa_matches_scalar_reference_natively(native_runner: Path) -> None:
    proc = _run(native_runner)
    passed, failed = _summary(proc)
    assert proc.returncode == 0 and failed == 0, proc.stdout[-4000:]
    assert passed > 1000  # every suite ran: a runner that skipped its work would not get here
    assert "isa=" in proc.stdout.splitlines()[0]


def test_golden_vectors_round_trip_and_catch_a_changed_value(native_runner: Path, tmp_path: Path) -> None:
    golden = tmp_path / "golden.txt"
    assert _run(native_runner, "--emit-golden", str(golden)).returncode == 0
    ok = _run(native_runner, "--check-golden", str(golden), "--golden-only")
    assert ok.returncode == 0 and _summary(ok)[1] == 0, ok.stdout[-3000:]
    # one dequantized value changed in the last bit: an exact record, so the check must fail
    lines = golden.read_text().splitlines()
    i = lines.index(next(line for line in lines if line.startswith("rec dequant.q4_K "))) + 3
    value = float.fromhex(lines[i])
    lines[i] = float.hex(value * (1 + 2**-20) if value else 2**-30)
    golden.write_text("\n".join(lines) + "\n")
    bad = _run(native_runner, "--check-golden", str(golden), "--golden-only")
    assert bad.returncode == 1 and _summary(bad)[1] > 0
    assert "golden dequant.q4_K" in bad.stdout


def test_runner_is_clean_under_address_and_undefined_sanitizers(tmp_path: Path) -> None:
    if not _sanitizers_available(tmp_path):
        skip_or_fail("the compiler lacks -fsanitize=address,undefined")
    # -O1 keeps the instrumented build and run short; the native test covers -O2
    binary = _build(tmp_path / "run_tests_asan", *SANITIZE, "-O1", "-g")
    proc = _run(
        binary,
        env_extra={"ASAN_OPTIONS": "detect_leaks=1:abort_on_error=0", "UBSAN_OPTIONS": "print_stacktrace=1"},
    )
    passed, failed = _summary(proc)
    assert proc.returncode == 0 and failed == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "runtime error" not in proc.stderr and "AddressSanitizer" not in proc.stderr
    assert passed > 1000

"""The aarch64 build, proven under qemu: the cross-built C test runner on a Cortex-A72 (NEON) and a
Cortex-A76 (NEON + dotprod) against the x86 scalar golden vectors, and the aarch64 wheel's smoke test."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CROSS = ROOT / "cross"
ARM_ROOT = Path(
    os.environ.get("EDGELLAMA_ARM64_ROOT", Path.home() / ".cache" / "edgellama" / "arm64-bookworm")
)
IN_CI = os.environ.get("CI") == "true"


def _need_cross_tools() -> None:
    missing = [t for t in ("aarch64-linux-gnu-gcc", "qemu-aarch64", "cc") if shutil.which(t) is None]
    if missing:
        if IN_CI:
            pytest.fail(f"CI must run the aarch64 checks, but {missing} are missing (cross/setup.sh)")
        pytest.skip(f"cross tools missing: {missing} (run cross/setup.sh)")


def _sh(script: str, timeout: int) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    env.pop("EDGELLAMA_ISA", None)
    return subprocess.run(
        ["sh", str(CROSS / script)],
        cwd=ROOT,
        env=env,
        check=False,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.slow
def test_aarch64_runner_picks_neon_on_a72_and_dotprod_on_a76_and_matches_x86_golden() -> None:
    _need_cross_tools()
    build = _sh("build-tests.sh", 900)
    assert build.returncode == 0, build.stdout + build.stderr
    run = _sh("run-tests.sh", 900)
    out = run.stdout
    assert run.returncode == 0, out[-5000:] + run.stderr[-2000:]
    assert "ok: -cpu cortex-a72 isa=neon:" in out
    assert "ok: -cpu cortex-a76 isa=neon-dotprod:" in out
    # the NEON paths themselves were held to the x86 scalar results, not only to their own scalar path
    golden = [line for line in out.splitlines() if line.strip().startswith("golden vs")]
    assert any("isa=neon " in line for line in golden) and any("isa=neon-dotprod " in line for line in golden)


@pytest.mark.slow
def test_aarch64_wheel_imports_and_dequantizes_under_emulation() -> None:
    _need_cross_tools()
    if not (ARM_ROOT / ".edgellama-root-ok").exists() and not IN_CI:
        pytest.skip(f"no cached arm64 root at {ARM_ROOT} (cross/make-root.sh builds it in about 2 minutes)")
    proc = _sh("build-wheel.sh", 1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "smoke ok: -cpu cortex-a72 isa neon " in proc.stdout
    assert "smoke ok: -cpu cortex-a76 isa neon-dotprod " in proc.stdout
    wheel = Path(proc.stdout.strip().splitlines()[-1])
    assert wheel.name.endswith("-cp311-cp311-linux_aarch64.whl") and wheel.is_file()

"""The aarch64 build, proven under qemu: the cross-built C test runner on a Cortex-A72 (NEON) and a
Cortex-A76 (NEON + dotprod) against the x86 scalar golden vectors, the aarch64 wheel's smoke test,
and the whole stack in the arm64 root (gemma3 greedy decoding, a pytest subset, instruction counts)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import in_ci, load_reference, skip_or_fail

ROOT = Path(__file__).resolve().parent.parent
CROSS = ROOT / "cross"
ARM_ROOT = Path(
    os.environ.get("EDGELLAMA_ARM64_ROOT", Path.home() / ".cache" / "edgellama" / "arm64-bookworm")
)


def _need_cross_tools() -> None:
    missing = [t for t in ("aarch64-linux-gnu-gcc", "qemu-aarch64", "cc") if shutil.which(t) is None]
    if missing:
        skip_or_fail(f"cross tools missing: {missing} (run cross/setup.sh)")


def _need_root() -> None:
    if not (ARM_ROOT / ".edgellama-root-ok").exists() and not in_ci():
        pytest.skip(f"no cached arm64 root at {ARM_ROOT} (cross/make-root.sh builds it in about 2 minutes)")


def _sh(script: str, timeout: int, **extra_env: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, **extra_env)
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
def test_aarch64_wheel_imports_and_dequantizes_under_emulation(tmp_path: Path) -> None:
    _need_cross_tools()
    _need_root()
    proc = _sh("build-wheel.sh", 1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "smoke ok: -cpu cortex-a72 isa neon " in proc.stdout
    assert "smoke ok: -cpu cortex-a76 isa neon-dotprod " in proc.stdout
    wheel = Path(proc.stdout.strip().splitlines()[-1])
    assert wheel.name.endswith("-cp311-cp311-linux_aarch64.whl") and wheel.is_file()
    # every module of the source tree is in the wheel and imported from it on both CPUs
    from test_packaging import walked_modules

    imported = [line.split(":", 1)[1].split() for line in proc.stdout.splitlines() if line.startswith("smoke modules:")]
    assert len(imported) == 2 and all(set(m) == walked_modules() for m in imported), imported
    # its extension exports the declared API only, as the x86 one (test_c_api.py)
    import zipfile

    from test_c_api import check_exports

    with zipfile.ZipFile(wheel) as z:
        (so,) = [n for n in z.namelist() if n.startswith("edgellama/native/_edgellama_c") and n.endswith(".so")]
        check_exports(Path(z.extract(so, tmp_path)), "aarch64-linux-gnu-nm")


@pytest.mark.slow
def test_gemma3_on_emulated_a72_and_a76_decodes_llama_cpp_tokens_and_runs_the_pytest_subset(
    gemma_path: Path,
) -> None:
    """cross/run-python-tests.sh: the wheel in the arm64 root's python3.11 under qemu; greedy tokens
    equal llama.cpp's on both CPUs, aarch64 scalar logits equal the host's bit for bit, so do the
    llama.cpp-order logits (and those equal llama.cpp's reference), and the documented pytest subset
    passes on both CPUs."""
    _need_cross_tools()
    _need_root()
    proc = _sh("run-python-tests.sh", 1800, EDGELLAMA_MODEL=str(gemma_path))
    out = proc.stdout
    assert proc.returncode == 0, out[-6000:] + proc.stderr[-3000:]
    want = load_reference("greedy.json")[0]["ids"]
    runs = {}  # (cpu, isa) -> greedy_check.py's report, from lines "-cpu CPU: {json} (N s)"
    for m in re.finditer(r"^-cpu (\S+): (\{.*\}) \(\d+ s\)$", out, re.MULTILINE):
        report = json.loads(m.group(2))
        runs[(m.group(1), report["isa"])] = report
    assert set(runs) == {("cortex-a72", "neon"), ("cortex-a76", "neon-dotprod"), ("cortex-a72", "scalar")}
    for (cpu, isa), report in runs.items():
        assert report["machine"] == "aarch64"
        assert report["tokens"] == want[: len(report["tokens"])], (cpu, isa, report["tokens"])
        assert f"ok: -cpu {cpu} isa={isa}: tokens" in out
    assert len(runs[("cortex-a76", "neon-dotprod")]["tokens"]) == 8
    scalar = next(ln for ln in out.splitlines() if ln.startswith("ok: -cpu cortex-a72 isa=scalar"))
    assert "max |diff| 0 " in scalar  # the same C on another target: bit-identical logits
    # --numerics llamacpp on aarch64: the host's bits, which are llama.cpp's reference logits
    assert ("ok: -cpu cortex-a72 numerics=llamacpp: logits bit-identical to the host's True, "
            "prompt top-10 equal llama.cpp's reference True") in out
    for cpu in ("cortex-a72", "cortex-a76"):
        m2 = re.search(rf"^ok: pytest -cpu {cpu} .*: (\d+) passed", out, re.MULTILINE)
        assert m2 and int(m2.group(1)) > 50, out[-3000:]


@pytest.mark.slow
def test_insn_count_plugin_counts_a_loop_linearly_under_qemu(tmp_path: Path) -> None:
    """cross/insn-count-plugin.c: getppid() markers report growing totals, and a Python loop twice
    as long costs about twice the instructions (the counter sees the guest's work, not noise)."""
    _need_cross_tools()
    _need_root()
    so = tmp_path / "insn-count.so"
    subprocess.run(["cc", "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-o", str(so),
                    str(CROSS / "insn-count-plugin.c")], check=True)
    script = tmp_path / "loop.py"
    script.write_text(
        "import os\n"
        "def spin(n):\n    s = 0\n    for i in range(n):\n        s += i\n    return s\n"
        "os.getppid(); spin(20000); os.getppid(); spin(40000); os.getppid()\n"
    )
    marks_file = tmp_path / "marks.txt"
    py = ARM_ROOT / "usr" / "bin" / "python3.11"
    subprocess.run(["qemu-aarch64", "-L", str(ARM_ROOT), "-cpu", "cortex-a72", "-plugin",
                    f"{so},out={marks_file}", str(py), str(script)], check=True, timeout=300)
    lines = marks_file.read_text().splitlines()
    marks = [int(x.split()[-1]) for x in lines if x.startswith("insn-count: ")]
    total = int(lines[-1].split()[-1])
    assert len(marks) == 3 and marks[0] < marks[1] < marks[2] < total
    once, twice = marks[1] - marks[0], marks[2] - marks[1]
    assert 1.8 < twice / once < 2.2, (once, twice)


@pytest.mark.slow
def test_armhf_scalar_kernels_pass_and_match_x86_golden_under_qemu_arm() -> None:
    """cross/run-armhf-tests.sh: the C runner built for 32-bit Raspberry Pi OS (ARMv7 + NEON, hard
    float; the kernels' NEON is aarch64-only, so the scalar path) passes on a Cortex-A7 and -A15."""
    if shutil.which("arm-linux-gnueabihf-gcc") is None or shutil.which("qemu-arm") is None:
        skip_or_fail("armhf cross compiler or qemu-arm missing (apt-get install gcc-arm-linux-gnueabihf "
                     "libc6-dev-armhf-cross qemu-user)")
    proc = _sh("run-armhf-tests.sh", 900)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    for cpu in ("cortex-a7", "cortex-a15"):
        assert f"ok: qemu-arm -cpu {cpu} isa=scalar:" in proc.stdout
    assert proc.stdout.count("records bit-identical") == 2


@pytest.mark.slow
def test_neon_paths_execute_fewer_aarch64_instructions_per_token_than_scalar(
    smollm2_path: Path, tmp_path: Path
) -> None:
    """cross/count_instructions.py on SmolLM2 (two decode steps per path, one guest thread): every
    path decodes llama.cpp's greedy tokens, and per token NEON < scalar, NEON+dotprod < NEON."""
    _need_cross_tools()
    _need_root()
    out = tmp_path / "counts.json"
    env = {k: v for k, v in os.environ.items() if k != "EDGELLAMA_ISA"}
    proc = subprocess.run(
        ["python3", str(CROSS / "count_instructions.py"), "--models", "smollm2", "-n", "2", "--json", str(out)],
        cwd=ROOT, env=env, check=False, capture_output=True, text=True, timeout=1200,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    counts = {r["isa"]: r for r in json.loads(out.read_text())}
    want = load_reference("greedy.json", "smollm2-135m")[0]["ids"]
    for r in counts.values():
        assert r["tokens"] == want[:2]
    per = {isa: counts[isa]["per_token_insns"] for isa in ("scalar", "neon", "neon-dotprod")}
    assert per["neon"] < per["scalar"] and per["neon-dotprod"] < per["neon"], per

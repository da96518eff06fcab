"""llama.cpp as a peer engine for the tests: llama-cpp-python (pinned, built from its sdist into a folder of
its own) run in a subprocess over given token ids, handing back every position's logits through .npy files.
It never imports llama_cpp into the calling process (two ggml/OpenMP runtimes in one process, and a crash
of the peer would take the test run with it), and it changes nothing in edgellama.

    python tests/llamacpp_peer.py --ensure-site      # .ci/run's build step: prints the site folder

Numerics chosen for a like-for-like comparison with edgellama's native engine:
- flash attention OFF, explicitly. edgellama's attention is the plain algorithm (scores, softmax over the
  whole row in F32, weighted sum of V). llama.cpp's default is AUTO, which resolves to flash attention on the
  CPU backend: Q converted to F16, online softmax, F16 accumulation of V - other roundings, not other maths.
- the KV cache type is the caller's (F32 for F32 weights: with it and flash attention off, llama.cpp's
  attention is all-F32 matmuls; F16, both engines' default, for quantized weights).
- one thread by default: llama.cpp's threads meet at a spinning barrier after every graph node, and on a
  shared 2-core host a 2-thread run of these tiny models took 8-20 s instead of 1 (bench/README.md, "Reading
  the figures on a shared host"); the thread count does not change llama.cpp's results.
- one sequence, each prompt from an empty cache (llama_memory_clear), n_batch = n_ubatch >= the longest
  prompt so a prompt is one llama_decode, logits requested for every token.
"""

from __future__ import annotations

import argparse
import fcntl
import functools
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

# Portable x86 build: GGML_NATIVE=OFF and the x86-64-v3 ISA by name, so the library runs on any AVX2 CI box
# (and on an AMX host whose kernel does not grant the tile state, where a native build's AMX matmul dies at
# its first ldtilecfg: see bench/quantize_vs_llamacpp.py).
X86_CMAKE_ARGS = "-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON"
OTHER_CMAKE_ARGS = "-DGGML_NATIVE=OFF"
BUILD_TIMEOUT = 3 * 3600  # 10-20 minutes on two idle cores; a loaded host takes longer
KV_TYPES = {"f32": 0, "f16": 1}  # GGML_TYPE_F32, GGML_TYPE_F16


class PeerBuildError(RuntimeError):
    """llama-cpp-python could not be built into the site folder; the message names the log."""


def default_site(cache: Path) -> Path:
    """The site folder of this machine's build (the one bench/*_vs_llamacpp.py default to on x86)."""
    machine = platform.machine().lower()
    name = "llamacpp-x86" if machine in ("x86_64", "amd64") else f"llamacpp-{machine}-host"
    return cache / name / "site"


def _ask_site(site: Path, expr: str) -> str | None:
    """print(EXPR) of llama_cpp imported from SITE, in a fresh interpreter with SITE first on sys.path (the way
    the worker imports it): its output, or None when llama_cpp does not import from there (or hangs)."""
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import llama_cpp; "
            f"assert llama_cpp.__file__.startswith(sys.argv[1]), llama_cpp.__file__; print({expr})")
    try:
        proc = subprocess.run([sys.executable, "-c", code, str(site)], capture_output=True, text=True,
                              timeout=300, check=False, cwd=tempfile.gettempdir())
    except subprocess.TimeoutExpired:
        return None
    return proc.stdout if proc.returncode == 0 else None


def site_version(site: Path) -> str | None:
    """llama_cpp.__version__ when the package imports from SITE, else None."""
    if not (site / "llama_cpp").is_dir():
        return None
    out = _ask_site(site, "llama_cpp.__version__")
    return None if out is None else out.strip()


def build_numerics(system_info: str) -> str:
    """edgellama's numerics that follow the llama.cpp build which printed SYSTEM_INFO
    (llama_print_system_info): the order of its AVX-512 x86 build when it has AVX-512, else of its AVX2
    one. The peer's flags (X86_CMAKE_ARGS) make an AVX2 build whatever the host."""
    return "llamacpp-avx512" if "AVX512 = 1" in system_info else "llamacpp-avx2"


@functools.cache
def site_numerics(site: Path) -> str:
    """build_numerics of the llama_cpp in SITE (an ensure_site folder)."""
    info = _ask_site(site, "llama_cpp.llama_print_system_info().decode()")
    if info is None:
        raise PeerBuildError(f"llama_cpp does not import from {site}")
    return build_numerics(info)


def _check_version(site: Path, version: str) -> Path:
    from llamacpp_ref import LLAMA_CPP_PYTHON

    if version != LLAMA_CPP_PYTHON:
        raise PeerBuildError(f"{site} holds llama-cpp-python {version}, the tests pin {LLAMA_CPP_PYTHON}: "
                             f"remove that folder to have it rebuilt")
    return site


def ensure_site(cache: Path, site: Path | None = None, log: Path | None = None) -> Path:
    """The folder holding an importable llama_cpp of the pinned version: SITE (default: default_site(cache))
    when it already imports, else llama-cpp-python built there from the cached sdist (llamacpp_ref.cached_sdist,
    downloaded on first use) under a file lock, so concurrent callers build once. The build log goes to LOG
    (default: beside the site). Raises llamacpp_ref.ReferenceUnavailable when the sdist cannot be downloaded,
    PeerBuildError when the build fails."""
    site = site or default_site(cache)
    version = site_version(site)
    if version is not None:
        return _check_version(site, version)
    from llamacpp_ref import cached_sdist

    site.parent.mkdir(parents=True, exist_ok=True)
    log = log or site.parent / "build.log"
    with open(site.parent / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        version = site_version(site)  # another process may have built it while we waited
        if version is not None:
            return _check_version(site, version)
        src = cached_sdist(cache)
        part = site.parent / f"site.partial-{os.getpid()}"
        shutil.rmtree(part, ignore_errors=True)
        x86 = platform.machine().lower() in ("x86_64", "amd64")
        env = dict(os.environ, CMAKE_ARGS=X86_CMAKE_ARGS if x86 else OTHER_CMAKE_ARGS,
                   CMAKE_BUILD_PARALLEL_LEVEL=str(os.cpu_count() or 1))
        # --no-cache-dir: pip reuses a cached wheel of the same sdist whatever CMAKE_ARGS says
        cmd = [sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-cache-dir", "--no-deps",
               "--target", str(part), str(src), "diskcache"]
        with open(log, "w") as out:
            out.write(f"CMAKE_ARGS={env['CMAKE_ARGS']}\n{' '.join(cmd)}\n")
            out.flush()
            try:
                proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, timeout=BUILD_TIMEOUT,
                                      check=False)
                rc: int | str = proc.returncode
            except subprocess.TimeoutExpired:
                rc = f"timeout after {BUILD_TIMEOUT} s"
            out.write(f"rc={rc}\n")
        if rc != 0 or site_version(part) is None:
            tail = "".join(log.read_text(errors="replace").splitlines(keepends=True)[-15:])
            shutil.rmtree(part, ignore_errors=True)
            raise PeerBuildError(f"building llama-cpp-python into {site} failed (pip: {rc}); log {log}:\n{tail}")
        if site.exists():  # a folder that did not import (a half-finished manual install)
            shutil.rmtree(site)
        part.rename(site)
        version = site_version(site)
        if version is None:
            raise PeerBuildError(f"llama_cpp built into {site} does not import from there")
        return _check_version(site, version)


@dataclass
class PeerRun:
    """What llama.cpp computed: per prompt, the logits of every position (n_tokens x n_vocab, float32) and
    the greedy continuation (argmax, n_greedy tokens, EOS not special); info: the context as llama.cpp
    made it (n_ctx after its padding to 256, flash attention, KV type, system_info)."""

    logits: list[npt.NDArray[np.float32]]
    greedy: list[list[int]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)


def llamacpp_run(site: Path, model_path: Path, prompts: list[list[int]], n_ctx: int, *, n_threads: int = 1,
                 n_greedy: int = 0, kv_type: str = "f32", flash_attn: bool = False,
                 timeout: float = 900.0, out_dir: Path | None = None) -> PeerRun:
    """llama.cpp over PROMPTS (token ids, each from an empty KV cache) in a fresh subprocess with SITE first
    on sys.path. kv_type: "f32" or "f16" for K and V alike. OUT_DIR (an empty folder the caller keeps): the
    logits stay there as .npy files, memory-mapped read-only, instead of in memory."""
    if not prompts or not all(prompts):
        raise ValueError("give at least one non-empty prompt")
    if kv_type not in KV_TYPES:
        raise ValueError(f"kv_type {kv_type!r}: one of {', '.join(KV_TYPES)}")
    longest = max(len(p) for p in prompts)
    if longest + n_greedy > n_ctx:
        raise ValueError(f"a prompt of {longest} tokens and {n_greedy} more do not fit n_ctx {n_ctx}")
    with tempfile.TemporaryDirectory(prefix="llamacpp-peer-") as tmp:
        out = Path(out_dir or tmp)
        req = {"site": str(site), "model": str(model_path), "prompts": prompts, "n_ctx": n_ctx,
               "n_threads": n_threads, "n_greedy": n_greedy, "kv_type": kv_type, "flash_attn": flash_attn,
               "out": str(out)}
        (out / "request.json").write_text(json.dumps(req))
        try:
            proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", str(out / "request.json")],
                                  capture_output=True, text=True, timeout=timeout, check=False, cwd=tmp)
        except subprocess.TimeoutExpired as exc:
            raise RuntimeError(f"llama.cpp on {model_path} did not finish in {timeout} s") from exc
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-25:])
            raise RuntimeError(f"llama.cpp on {model_path} failed (exit {proc.returncode}):\n{tail}")
        done = json.loads((out / "result.json").read_text())
        logits = [np.load(out / f"logits{i}.npy", mmap_mode="r" if out_dir else None) for i in range(len(prompts))]
    return PeerRun(logits, done["greedy"], done["info"])


def llamacpp_logits(site: Path, model_path: Path, prompts: list[list[int]], n_ctx: int,
                    **kwargs: Any) -> list[npt.NDArray[np.float32]]:
    """Every position's logits of each prompt (llamacpp_run's, without a continuation)."""
    return llamacpp_run(site, model_path, prompts, n_ctx, **kwargs).logits


POOLING = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}  # enum llama_pooling_type


def llamacpp_embeddings(site: Path, model_path: Path, prompts: list[list[int]], n_ctx: int, pooling: str, *,
                        n_threads: int = 1, kv_type: str = "f32", timeout: float = 900.0
                        ) -> list[npt.NDArray[np.float32]]:
    """llama.cpp's embeddings (llama_get_embeddings_seq after one llama_decode of each prompt from an empty
    memory, as llama-embedding does it; unnormalized) with POOLING, one vector per prompt (pooling none: one
    per token, n_tokens x n_embd)."""
    if not prompts or not all(prompts):
        raise ValueError("give at least one non-empty prompt")
    with tempfile.TemporaryDirectory(prefix="llamacpp-peer-") as tmp:
        out = Path(tmp)
        req = {"site": str(site), "model": str(model_path), "prompts": prompts, "n_ctx": n_ctx,
               "n_threads": n_threads, "kv_type": kv_type, "flash_attn": False, "out": str(out),
               "embed": pooling}
        (out / "request.json").write_text(json.dumps(req))
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--worker", str(out / "request.json")],
                              capture_output=True, text=True, timeout=timeout, check=False, cwd=tmp)
        if proc.returncode != 0:
            tail = "\n".join(proc.stderr.strip().splitlines()[-25:])
            raise RuntimeError(f"llama.cpp embeddings on {model_path} failed (exit {proc.returncode}):\n{tail}")
        return [np.load(out / f"embd{i}.npy") for i in range(len(prompts))]


def _open(lc: Any, req: dict[str, Any], n_batch: int) -> tuple[Any, Any]:
    """The model and one context for the request: n_batch = n_ubatch (a prompt is one llama_decode, as an
    encoder's sequence must be), one sequence, flash attention and the KV type as asked; embeddings with a
    pooling type when req["embed"] names one."""
    model = lc.llama_model_load_from_file(req["model"].encode(), lc.llama_model_default_params())
    if not model:
        raise SystemExit(f"llama.cpp could not load {req['model']}")
    cp = lc.llama_context_default_params()
    cp.n_ctx = req["n_ctx"]
    cp.n_batch = cp.n_ubatch = n_batch
    cp.n_seq_max = 1
    cp.n_threads = cp.n_threads_batch = req["n_threads"]
    cp.flash_attn_type = lc.LLAMA_FLASH_ATTN_TYPE_ENABLED if req["flash_attn"] else lc.LLAMA_FLASH_ATTN_TYPE_DISABLED
    cp.type_k = cp.type_v = KV_TYPES[req["kv_type"]]
    if req.get("embed"):
        cp.embeddings = True
        cp.pooling_type = POOLING[req["embed"]]
    cp.no_perf = True
    ctx = lc.llama_init_from_model(model, cp)
    if not ctx:
        raise SystemExit("llama.cpp could not create the context")
    return model, ctx


def _decode(lc: Any, ctx: Any, batch: Any, tokens: list[int], pos0: int) -> None:
    """tokens of sequence 0 at pos0.. in one llama_decode, every one an output."""
    for k, tok in enumerate(tokens):
        batch.token[k] = tok
        batch.pos[k] = pos0 + k
        batch.n_seq_id[k] = 1
        batch.seq_id[k][0] = 0
        batch.logits[k] = True
    batch.n_tokens = len(tokens)
    rc = lc.llama_decode(ctx, batch)
    if rc != 0:
        raise SystemExit(f"llama_decode returned {rc}")


def _embed_worker(lc: Any, req: dict[str, Any]) -> None:
    out = Path(req["out"])
    prompts: list[list[int]] = req["prompts"]
    n_batch = max(len(p) for p in prompts)
    model, ctx = _open(lc, req, n_batch)
    mem = lc.llama_get_memory(ctx)
    n_embd = int(lc.llama_model_n_embd(model))
    n_out = int(lc.llama_model_n_cls_out(model)) if req["embed"] == "rank" else n_embd  # rank: the scores
    batch = lc.llama_batch_init(n_batch, 0, 1)
    for i, prompt in enumerate(prompts):
        if mem:
            lc.llama_memory_clear(mem, True)
        _decode(lc, ctx, batch, prompt, 0)
        if req["embed"] == "none":
            e = np.stack([np.ctypeslib.as_array(lc.llama_get_embeddings_ith(ctx, k), shape=(n_embd,)).copy()
                          for k in range(len(prompt))])
        else:
            e = np.ctypeslib.as_array(lc.llama_get_embeddings_seq(ctx, 0), shape=(n_out,)).copy()
        np.save(out / f"embd{i}.npy", e)
    lc.llama_batch_free(batch)
    lc.llama_free(ctx)
    lc.llama_model_free(model)


# ---- the worker (runs in the subprocess; llama_cpp from the site folder) ----
def _worker(request: Path) -> None:
    req = json.loads(request.read_text())
    sys.path.insert(0, req["site"])
    import llama_cpp as lc

    lc.llama_backend_init()
    if req.get("embed"):
        _embed_worker(lc, req)
        return
    out = Path(req["out"])
    prompts: list[list[int]] = req["prompts"]
    n_batch = max(len(p) for p in prompts)
    model, ctx = _open(lc, req, n_batch)
    mem = lc.llama_get_memory(ctx)
    n_vocab = int(lc.llama_vocab_n_tokens(lc.llama_model_get_vocab(model)))
    batch = lc.llama_batch_init(n_batch, 0, 1)

    def decode(tokens: list[int], pos0: int) -> npt.NDArray[np.float32]:
        _decode(lc, ctx, batch, tokens, pos0)
        return np.ctypeslib.as_array(lc.llama_get_logits(ctx), shape=(len(tokens), n_vocab)).copy()

    greedy = []
    for i, prompt in enumerate(prompts):
        lc.llama_memory_clear(mem, True)
        logits = decode(prompt, 0)
        np.save(out / f"logits{i}.npy", logits)
        cont: list[int] = []
        for step in range(req["n_greedy"]):
            cont.append(int(np.argmax(logits[-1])))
            logits = decode(cont[-1:], len(prompt) + step)
        greedy.append(cont)
    info = {"version": lc.__version__, "n_vocab": n_vocab, "n_ctx": int(lc.llama_n_ctx(ctx)),
            "n_ctx_seq": int(lc.llama_n_ctx_seq(ctx)), "n_batch": int(lc.llama_n_batch(ctx)),
            "flash_attn": bool(req["flash_attn"]), "kv_type": req["kv_type"],
            "system_info": lc.llama_print_system_info().decode().strip()}
    (out / "result.json").write_text(json.dumps({"greedy": greedy, "info": info}))
    lc.llama_batch_free(batch)
    lc.llama_free(ctx)
    lc.llama_model_free(model)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--ensure-site", action="store_true", help="build llama-cpp-python into the cache if needed")
    ap.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.worker:
        _worker(a.worker)
        return 0
    if a.ensure_site:
        root = Path(__file__).resolve().parent
        sys.path[:0] = [str(root), str(root.parent)]
        from edgellama.default_model import cache_dir

        print(ensure_site(cache_dir()))
        return 0
    ap.print_help()
    return 2


if __name__ == "__main__":
    sys.exit(main())

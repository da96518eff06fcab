"""--numerics llamacpp: llama.cpp's own order of every float operation, so its reference outputs are
reproduced to the last bit (prompt logits, greedy continuations, perplexity); the SIMD versions of
those kernels give the bits of their scalar references; the thread count changes nothing; and what
this order cannot reproduce is refused with a message naming it."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    REFERENCE_DIRS,
    REFERENCE_MODELS,
    REFERENCE_NUMERICS,
    ROOT,
    load_reference,
    open_reference_model,
    reference_dir,
    reference_pairs,
)

from edgellama.gguf.ggml_types import GGMLType as T
from edgellama.gguf.ggml_types import row_bytes
from edgellama.llm import LLM
from edgellama.native import kernels
from edgellama.native.engine import Engine, Pool
from edgellama.native.lib import check, ffi, lib

# token that replaced each 512-token chunk's first token in llama.cpp's perplexity reference
PPL_BOS = {"gemma": 2, "smollm2": 1, "qwen": 151643}


@pytest.fixture(scope="module", params=REFERENCE_MODELS)
def exact(request: pytest.FixtureRequest) -> Iterator[tuple[str, LLM]]:
    llm = open_reference_model(request, numerics=REFERENCE_NUMERICS)
    yield request.param, llm
    llm.close()


def test_prompt_logits_equal_llamacpp_to_the_bit(exact: tuple[str, LLM]) -> None:
    name, llm = exact
    for ref_tok, ref_log in reference_pairs(name, "logits.json"):
        llm.reset()
        logits = llm.eval(ref_tok["ids"]).copy()
        ids = ref_log["top10_ids"]
        np.testing.assert_array_equal(logits[ids], np.array(ref_log["top10_logits"], dtype=np.float32),
                                      err_msg=ref_tok["prompt"])
        assert np.argsort(-logits, kind="stable")[:10].tolist() == ids, ref_tok["prompt"]


def test_greedy_continuations_equal_llamacpp_token_for_token(exact: tuple[str, LLM]) -> None:
    """Free-running, one token per forward pass as llama.cpp made them: all 32 tokens of every prompt."""
    name, llm = exact
    for ref_tok, ref_greedy in reference_pairs(name, "greedy.json"):
        llm.reset()
        logits = llm.eval(ref_tok["ids"])
        got = []
        for _ in ref_greedy["ids"]:
            got.append(int(np.argmax(logits)))
            logits = llm.eval([got[-1]])
        assert got == ref_greedy["ids"], ref_tok["prompt"]


@pytest.mark.slow
def test_perplexity_equals_llamacpp(exact: tuple[str, LLM]) -> None:
    from edgellama.perplexity import perplexity

    name, llm = exact
    text = (reference_dir() / "ppl-text.txt").read_text()
    ppl, _err, n, _ = perplexity(llm, llm.tokenizer.encode(text, add_special=False), 512, PPL_BOS[name])
    want = load_reference("perplexity.json", REFERENCE_DIRS[name])
    print(f"{name}: perplexity {ppl:.6f}, llama.cpp {want['ppl']:.6f}")
    assert n == want["scored_tokens"]
    assert abs(ppl - want["ppl"]) < 1e-4 * want["ppl"]  # the reference keeps llama.cpp's printed digits


def test_thread_counts_give_the_same_bits(gemma_path: Path) -> None:
    ids = load_reference("tokens.json")[2]["ids"]
    outs = []
    for t in (1, 3):
        with LLM(gemma_path, n_ctx=256, n_threads=t, numerics=REFERENCE_NUMERICS) as llm:
            first = llm.eval(ids).copy()
            outs.append((first, llm.eval([int(np.argmax(first))]).copy()))
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    np.testing.assert_array_equal(outs[0][1], outs[1][1])


def test_llamacpp_follows_the_build_llama_cpp_makes_for_this_cpu(smollm2_path: Path) -> None:
    """'llamacpp' gives the bits of the order of llama.cpp's x86 build for this CPU: its AVX-512 build's
    where the CPU has AVX-512 VNNI (edgellama's avx512 ISA), else its AVX2 build's (other CPUs: the
    AVX-512 one); and the two orders are not the same (SwiGLU, softmax, exp and attention sums in 16 or 8
    lanes; on short prompts the 8-bit activations often hide it)."""
    got = {}
    for mode in ("llamacpp", "llamacpp-avx2", "llamacpp-avx512"):
        with LLM(smollm2_path, n_ctx=256, n_threads=2, numerics=mode) as llm:
            ids = llm.tokenize((reference_dir() / "ppl-text.txt").read_text()[:600])
            got[mode] = llm.eval(ids, all_logits=True).copy()
    x86 = platform.machine().lower() in ("x86_64", "amd64")
    want = "llamacpp-avx2" if x86 and not kernels.isa_available("avx512") else "llamacpp-avx512"
    np.testing.assert_array_equal(got["llamacpp"], got[want])
    assert (got["llamacpp-avx2"] != got["llamacpp-avx512"]).any()


def test_cli_run_prints_llamacpps_greedy_text(gemma_path: Path) -> None:
    ref = load_reference("greedy.json")[0]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-m", "edgellama.cli", "run", "-m", str(gemma_path), "-p", ref["prompt"],
                        "-n", "16", "--temp", "0", "--numerics", REFERENCE_NUMERICS, "--no-display-prompt", "-c", "256"],
                       capture_output=True, text=True, timeout=300, env=env, cwd=ROOT, check=False)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == ref["text16"].strip()


# ---- refusals ----
def test_what_this_order_cannot_reproduce_is_refused(smollm2_path: Path) -> None:
    with pytest.raises(ValueError, match="f16 KV cache"):
        LLM(smollm2_path, n_ctx=128, n_threads=1, kv_type="q8_0", numerics="llamacpp")
    with pytest.raises(ValueError, match="unknown numerics"):
        LLM(smollm2_path, n_ctx=128, n_threads=1, numerics="ggml-arm")
    # weights of a type without a llama.cpp-order kernel (F32 here)
    from numpy_reference import as_f32
    from test_engine import _load

    f, desc = _load(smollm2_path)
    try:
        pool = Pool(1)
        with pytest.raises(ValueError, match="Q5_0, Q8_0"):
            Engine(as_f32(desc), pool, 64, 16, "f16", numerics="llamacpp")
    finally:
        f.close()


# ---- SIMD against the scalar references, through the test API (csrc/edgellama_test.h) ----


def _random_blocks(wtype: int, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Weights made by the reference quantizer from random floats: valid scales, every level used."""
    x = rng.standard_normal((rows, cols)).astype(np.float32) * rng.uniform(0.1, 3.0, (rows, 1)).astype(np.float32)
    return np.concatenate([kernels.quantize(r, wtype) for r in x])


def _matmul(wtype: int, w: np.ndarray, rows: int, cols: int, x: np.ndarray, pool: Pool) -> np.ndarray:
    y = np.empty((x.shape[0], rows), np.float32)
    check(lib.el_test_llx_matmul(pool.ptr, wtype, ffi.from_buffer(w), w.size, rows, cols,
                                 ffi.from_buffer("float[]", x), x.shape[0], ffi.from_buffer("float[]", y)),
          "llama.cpp-order matmul")
    return y


@pytest.mark.parametrize("wtype,cols", [(T.Q8_0, 640), (T.Q5_0, 640), (T.Q4_1, 576), (T.Q6_K, 768), (T.Q4_K, 1024)])
def test_simd_matmul_gives_the_scalar_bits(simd_isa: str, wtype: int, cols: int) -> None:
    """Batches of 1..9 rows cover every path: vec_dot, the Q4_K gemv / gemm split at groups of 4, the
    tiled Q6_K kernel from 8 rows, the re-blocked Q5_0 of a batch."""
    rng = np.random.default_rng(wtype)
    rows = 24
    w = _random_blocks(wtype, rows, cols, rng)
    assert w.size == rows * row_bytes(wtype, cols)
    pool = Pool(2)
    for n in (1, 2, 5, 8, 9):
        x = (rng.standard_normal((n, cols)) * rng.uniform(0.01, 50.0, (n, 1))).astype(np.float32)
        kernels.set_isa("scalar")
        want = _matmul(wtype, w, rows, cols, x, pool)
        kernels.set_isa(simd_isa)
        got = _matmul(wtype, w, rows, cols, x, pool)
        np.testing.assert_array_equal(got, want, err_msg=f"{simd_isa} n_vec={n}")
        assert np.isfinite(want).all()


@pytest.mark.parametrize("build", [0, 1], ids=["avx2", "avx512"])  # llama.cpp's x86 build (el_llx_build)
@pytest.mark.parametrize("n_q,head_dim", [(1, 256), (5, 256), (1, 64), (7, 64), (1, 80), (3, 80), (1, 96), (3, 96)])
def test_simd_attention_gives_the_scalar_bits(simd_isa: str, build: int, n_q: int, head_dim: int) -> None:
    """Decode (vec_dot_f16 lanes) and prefill (tinyBLAS lanes) in the order of llama.cpp's AVX2 and
    AVX-512 builds, head sizes with and without a tail past 32 / 64 / 16, GQA 4:2, a sliding window of
    40 over 100 cached positions."""
    rng = np.random.default_rng(n_q * head_dim)
    n_head, n_head_kv, n_kv = 4, 2, 100
    q = rng.standard_normal((n_q, n_head * head_dim)).astype(np.float32)
    k = (rng.standard_normal((n_kv, n_head_kv * head_dim)) * 2).astype(np.float16)
    v = rng.standard_normal((n_kv, n_head_kv * head_dim)).astype(np.float16)
    kv_pos = np.arange(n_kv, dtype=np.int32)
    q_pos = np.arange(n_kv - n_q, n_kv, dtype=np.int32)
    cells = 128
    pool = Pool(2)
    outs = []
    for isa in ("scalar", simd_isa):
        kernels.set_isa(isa)
        out = np.zeros((n_q, n_head * head_dim), np.float32)
        check(lib.el_test_llx_attention(pool.ptr, build, ffi.from_buffer("float[]", q), n_q, ffi.from_buffer("int32_t[]", q_pos),
                                        n_head, n_head_kv, head_dim, ffi.from_buffer(k), ffi.from_buffer(v),
                                        ffi.from_buffer("int32_t[]", kv_pos), n_kv, 40, 1.0 / np.sqrt(head_dim), cells,
                                        ffi.from_buffer("float[]", out)), "llama.cpp-order attention")
        outs.append(out)
    np.testing.assert_array_equal(outs[1], outs[0])
    # and it is attention: close to a float64 softmax(q k^T) v over the window
    kf, vf = k.astype(np.float64), v.astype(np.float64)
    for t in range(n_q):
        for h in range(n_head):
            hk = h // (n_head // n_head_kv)
            vis = [j for j in range(n_kv) if kv_pos[j] <= q_pos[t] and q_pos[t] - kv_pos[j] < 40]
            s = kf[vis, hk * head_dim:(hk + 1) * head_dim] @ q[t, h * head_dim:(h + 1) * head_dim] / np.sqrt(head_dim)
            p = np.exp(s - s.max())
            p /= p.sum()
            ref = p @ vf[vis, hk * head_dim:(hk + 1) * head_dim]
            np.testing.assert_allclose(outs[0][t, h * head_dim:(h + 1) * head_dim], ref, atol=2e-3, rtol=2e-3)

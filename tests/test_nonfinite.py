"""Issue 32: a model whose F32 norm weights or biases hold NaN or an infinity is refused at load, naming the
tensor and how many of its values are not finite (every logit of such a model is NaN; the sampler would
still pick tokens). One check in the wiring (edgellama.wiring.build_desc) covers the Python API, `run` and
`serve`; here on tiny synthetic models (each architecture's norm and bias tensors) and on copies of SmolLM2
with four values of one norm overwritten in place.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf_fixtures import write_tiny_model
from service_util import FAST, cli_env

from edgellama.cli import main
from edgellama.gguf.reader import GGUFFile
from edgellama.llm import LLM
from edgellama.wiring import ModelError, build_desc

INF, NAN = float("inf"), float("nan")


def poison(path: Path, tensor: str, value: float, where: tuple[int, ...] = (0, 7, 100, -1)) -> int:
    """Overwrites the float32 values at indices where of F32 tensor in the GGUF file at path, in place;
    returns the tensor's value count."""
    with GGUFFile(path) as f:
        t = f.tensor(tensor)
        assert t.type_name == "F32", t.type_name
        offset, n = t.offset, t.n_elements
    with open(path, "r+b") as fh:
        for i in where:
            fh.seek(offset + 4 * (i % n))
            fh.write(np.float32(value).tobytes())
    return n


def message(tensor: str, bad: int, n: int) -> str:
    return f"tensor {tensor}: {bad} of {n} values are NaN or infinite"


# ---- tiny synthetic models: every kind of norm and bias tensor the wiring reads ---------------------


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tiny")
    return {arch: write_tiny_model(d / f"{arch}.gguf", arch, "bpe" if arch == "qwen2" else "spm")
            for arch in ("llama", "qwen2", "gemma3")}


CASES = [
    ("llama", "output_norm.weight", NAN),
    ("llama", "blk.1.attn_norm.weight", INF),
    ("llama", "blk.0.ffn_norm.weight", -INF),
    ("qwen2", "blk.0.attn_q.bias", NAN),
    ("qwen2", "blk.1.attn_k.bias", INF),
    ("qwen2", "blk.1.attn_v.bias", -INF),
    ("gemma3", "blk.0.attn_q_norm.weight", NAN),
    ("gemma3", "blk.1.attn_k_norm.weight", INF),
    ("gemma3", "blk.1.post_attention_norm.weight", NAN),
    ("gemma3", "blk.0.post_ffw_norm.weight", -INF),
]


def test_the_clean_tiny_models_load(tiny: dict[str, Path]) -> None:
    for path in tiny.values():
        with GGUFFile(path) as f:
            build_desc(f)


@pytest.mark.parametrize(("arch", "tensor", "value"), CASES)
def test_a_non_finite_norm_or_bias_is_refused_naming_the_tensor(
        tiny: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        arch: str, tensor: str, value: float) -> None:
    path = tmp_path / "bad.gguf"
    shutil.copyfile(tiny[arch], path)
    where = (0, 1, 2) if np.isnan(value) else (3,)  # three NaNs, or one infinity
    n = poison(path, tensor, value, where)
    bad = len(where)
    with GGUFFile(path) as f, pytest.raises(ModelError) as exc:
        build_desc(f)
    assert str(exc.value) == message(tensor, bad, n)
    with pytest.raises(ModelError, match=f"^{message(tensor, bad, n)}$".replace(".", r"\.")):
        LLM(path, n_ctx=64, n_threads=1)
    rc = main(["run", "-m", str(path), "-p", "hi", "-n", "2", "-c", "64", "-t", "1"])
    out, err = capsys.readouterr()
    assert rc == 1 and out == "", (rc, out, err)
    assert err.splitlines() == [f"edgellama: error: {message(tensor, bad, n)}"], err


def test_only_the_first_bad_tensor_is_named(tiny: dict[str, Path], tmp_path: Path) -> None:
    """Refused at the first bad tensor in the order the wiring reads them (layer 0's before the output
    norm), as any other bad tensor is."""
    path = tmp_path / "bad.gguf"
    shutil.copyfile(tiny["llama"], path)
    poison(path, "output_norm.weight", NAN)
    n = poison(path, "blk.0.ffn_norm.weight", INF, (5, 6))
    with GGUFFile(path) as f, pytest.raises(ModelError, match=r"^tensor blk\.0\.ffn_norm\.weight: 2 of "):
        build_desc(f)
    assert n == 64


# ---- SmolLM2 (Q4_1) with four values of one norm overwritten: the API, `run` and `serve` ----------------


@pytest.fixture(scope="module", params=[("output_norm.weight", NAN), ("blk.3.attn_norm.weight", INF)],
                ids=["nan-output_norm", "inf-blk3-attn_norm"])
def bad_smollm2(request: pytest.FixtureRequest, smollm2_path: Path,
                tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, str]:
    """(copy of SmolLM2 with 4 values of the tensor set to the value, tensor name, expected message)."""
    tensor, value = request.param
    path = tmp_path_factory.mktemp("smollm2") / "bad.gguf"
    shutil.copyfile(smollm2_path, path)
    n = poison(path, tensor, value)
    assert n == 576
    return path, tensor, message(tensor, 4, n)


def test_smollm2_itself_loads(smollm2_path: Path) -> None:
    with GGUFFile(smollm2_path) as f:
        build_desc(f)


def test_llm_refuses_a_non_finite_smollm2(bad_smollm2: tuple[Path, str, str]) -> None:
    path, tensor, msg = bad_smollm2
    with pytest.raises(ModelError) as exc:
        LLM(path, n_ctx=64, n_threads=1)
    assert str(exc.value) == msg and tensor in msg
    assert isinstance(exc.value, ValueError)  # what the CLI maps to exit status 1


def test_run_exits_1_with_one_line_naming_the_tensor(bad_smollm2: tuple[Path, str, str]) -> None:
    path, _tensor, msg = bad_smollm2
    r = subprocess.run([sys.executable, "-m", "edgellama.cli", "run", "-m", str(path), "-p", "hi", "-n", "4"],
                       capture_output=True, text=True, env=cli_env(), timeout=120, check=False)
    assert r.returncode == 1, (r.returncode, r.stdout, r.stderr)
    assert r.stdout == ""
    assert r.stderr.splitlines() == [f"edgellama: error: {msg}"], r.stderr


def test_serve_stops_at_start_naming_the_tensor(bad_smollm2: tuple[Path, str, str], tmp_path: Path) -> None:
    path, _tensor, msg = bad_smollm2
    sock = tmp_path / "s.sock"
    r = subprocess.run([sys.executable, "-m", "edgellama.cli", "serve", "-m", str(path), "--socket", str(sock),
                        *FAST], capture_output=True, text=True, env=cli_env(), timeout=120, check=False)
    assert r.returncode != 0, (r.returncode, r.stdout, r.stderr)
    assert msg in r.stdout + r.stderr and "Traceback" not in r.stderr, r.stderr
    assert not sock.exists()


# ---- finite norms, non-finite logits: the check in the generation object ---------------------------------


@pytest.fixture(scope="module")
def nan_logits_smollm2(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of SmolLM2 whose tied output row 100 (token_embd, Q8_0) has a NaN block scale: every norm is
    finite, so it loads, and the logit of token 100 is NaN at every position."""
    path = tmp_path_factory.mktemp("smollm2") / "nan-logits.gguf"
    shutil.copyfile(smollm2_path, path)
    with GGUFFile(path) as f:
        t = f.tensor("token_embd.weight")
        assert t.type_name == "Q8_0", t.type_name
        offset, n_embd = t.offset, t.shape[0]
    with open(path, "r+b") as fh:
        fh.seek(offset + 100 * (n_embd // 32) * 34)  # row 100, block 0: its f16 scale comes first
        fh.write(np.float16(np.nan).tobytes())
    return path


def test_non_finite_logits_end_generation_naming_the_model(nan_logits_smollm2: Path, tmp_path: Path) -> None:
    from edgellama.generation import NonFiniteLogits
    from tests.service_util import Conn, ServerProc

    with LLM(nan_logits_smollm2, n_ctx=64, n_threads=1) as llm, pytest.raises(NonFiniteLogits, match="nan-logits.gguf"):
        llm("The capital of France is", max_tokens=4, temperature=0)
    r = subprocess.run([sys.executable, "-m", "edgellama.cli", "run", "-m", str(nan_logits_smollm2), "-p", "hi",
                        "-n", "4", "--temp", "0"], capture_output=True, text=True, env=cli_env(), timeout=120,
                       check=False)
    assert r.returncode == 1 and r.stdout == "hi", (r.returncode, r.stdout, r.stderr)  # the echoed prompt only
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and "nan-logits.gguf computed non-finite logits" in lines[0], r.stderr
    srv = ServerProc("-m", str(nan_logits_smollm2), "--parallel", "2")
    try:
        srv.wait_ready()
        with Conn(srv.path) as c:
            for i in range(2):  # the request ends with an error; the service goes on
                ev = c.ask({"id": i, "prompt": "hi", "n_predict": 4})
                assert ev[-1]["event"] == "error" and ev[-1]["code"] == "internal", ev
                assert "nan-logits.gguf computed non-finite logits" in ev[-1]["message"], ev
        assert srv.health()["status"] == "ok"
    finally:
        srv.kill()

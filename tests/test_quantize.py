"""`edgellama quantize`: llama-quantize's tensor types per file type, and every tensor's bytes equal to
an independent quantizer's (the gguf package's numpy quantizers where it has one, llama.cpp's own
quantize_row_*_ref for the K types)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from edgellama.cli import main
from edgellama.gguf.ggml_types import GGMLType as T
from edgellama.gguf.quant_mix import Options, llama_order
from edgellama.gguf.reader import GGUFError, GGUFFile, GGUFValueType
from edgellama.gguf.writer import GGUFWriter
from edgellama.quantize_model import RequantizeError, parse_override, quantize_model

N_LAYER, N_EMBD, N_KV, N_FF, N_VOCAB = 8, 256, 64, 512, 32
GGUF_QUANTIZERS = {T.Q4_0, T.Q4_1, T.Q5_0, T.Q5_1, T.Q8_0, T.F16, T.BF16}


def _model(path: Path, tied: bool = False, dtype: Any = np.float32) -> Path:
    """A llama-shaped F32 model (n_gqa 4), tensors written in an order llama.cpp's loader changes,
    plus two odd row lengths (96: no 256-block type fits; 40: no block type fits)."""
    rng = np.random.default_rng(7)
    w = GGUFWriter(path, arch="llama")
    w.add("general.name", "synthetic")
    w.add("general.file_type", 0, GGUFValueType.UINT32)
    for k, v in (("block_count", N_LAYER), ("embedding_length", N_EMBD), ("attention.head_count", 4),
                 ("attention.head_count_kv", 1), ("feed_forward_length", N_FF)):
        w.add(f"llama.{k}", v, GGUFValueType.UINT32)

    def add(name: str, *shape: int) -> None:  # shape in numpy order (rows, row length)
        w.add_tensor(name, rng.standard_normal(shape).astype(dtype))

    for i in reversed(range(N_LAYER)):
        add(f"blk.{i}.attn_norm.weight", N_EMBD)
        add(f"blk.{i}.attn_q.weight", N_EMBD, N_EMBD)
        add(f"blk.{i}.attn_k.weight", N_KV, N_EMBD)
        add(f"blk.{i}.attn_v.weight", N_KV, N_EMBD)
        add(f"blk.{i}.attn_output.weight", N_EMBD, N_EMBD)
        add(f"blk.{i}.ffn_gate.weight", N_FF, N_EMBD)
        add(f"blk.{i}.ffn_up.weight", N_FF, N_EMBD)
        add(f"blk.{i}.ffn_down.weight", N_EMBD, N_FF)
    add("blk.0.odd96.weight", 4, 96)
    add("blk.0.odd40.weight", 4, 40)
    add("token_embd.weight", N_VOCAB, N_EMBD)
    if not tied:
        add("output.weight", N_VOCAB, N_EMBD)
    add("output_norm.weight", N_EMBD)
    return w.write()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _model(tmp_path_factory.mktemp("q") / "f32.gguf")


def _more_bits(i: int, n: int) -> bool:  # llama-quant.cpp's use_more_bits, restated for the expectations
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def expected_types(ft: str, name: str, tied: bool = False) -> int:
    """llama-quantize's choice for this synthetic model (8 layers, n_gqa 4, no experts), worked out
    by hand from llama-quant.cpp."""
    default = {"Q2_K": T.Q2_K, "Q3_K_S": T.Q3_K, "Q3_K_M": T.Q3_K, "Q3_K_L": T.Q3_K, "Q4_K_S": T.Q4_K,
               "Q4_K_M": T.Q4_K, "Q5_K_S": T.Q5_K, "Q5_K_M": T.Q5_K, "Q6_K": T.Q6_K}.get(ft) or T[ft]
    if name.endswith("norm.weight"):
        return T.F32
    if default in (T.F32, T.F16, T.BF16):
        return default  # no mix, no fallback
    if name == "blk.0.odd40.weight":
        return T.F16  # no block type divides 40
    if name == "blk.0.odd96.weight":
        return {T.Q2_K: T.Q4_0, T.Q3_K: T.Q4_0, T.Q4_K: T.Q5_0, T.Q5_K: T.Q5_1, T.Q6_K: T.Q8_0}.get(default, default)
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return T.Q8_0 if default == T.Q8_0 else T.Q6_K
    layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
    more = _more_bits(layer, N_LAYER)
    if "attn_v" in name:
        return {"Q2_K": T.Q4_K, "Q3_K_M": T.Q5_K if layer < 2 else T.Q4_K, "Q3_K_L": T.Q5_K,
                "Q4_K_M": T.Q6_K if more else default, "Q5_K_M": T.Q6_K if more else default,
                "Q4_K_S": T.Q5_K if layer < 4 else default}.get(ft, default)
    if "ffn_down" in name:
        return {"Q2_K": T.Q3_K, "Q3_K_M": T.Q4_K, "Q3_K_L": T.Q5_K, "Q4_K_M": T.Q6_K if more else default,
                "Q5_K_M": T.Q6_K if more else default, "Q4_K_S": T.Q5_K if layer < 1 else default}.get(ft, default)
    if "attn_output" in name:
        return {"Q2_K": T.Q3_K, "Q3_K_M": T.Q4_K, "Q3_K_L": T.Q5_K}.get(ft, default)
    return default


TYPES = ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K_S", "Q3_K_M", "Q3_K_L", "Q4_K_S", "Q4_K_M",
         "Q5_K_S", "Q5_K_M", "Q6_K", "F16", "BF16", "F32"]
FILE_TYPE_IDS = {"F32": 0, "F16": 1, "Q4_0": 2, "Q4_1": 3, "Q8_0": 7, "Q5_0": 8, "Q5_1": 9, "Q2_K": 10, "Q3_K_S": 11,
                 "Q3_K_M": 12, "Q3_K_L": 13, "Q4_K_S": 14, "Q4_K_M": 15, "Q5_K_S": 16, "Q5_K_M": 17, "Q6_K": 18,
                 "BF16": 32}


@pytest.mark.parametrize("ft", TYPES)
def test_types_and_bytes_match_independent_quantizers(model: Path, tmp_path: Path, ft: str, llamacpp_quants: Any) -> None:
    out = quantize_model(model, tmp_path / "o.gguf", ft).path
    with GGUFFile(model) as src, GGUFFile(out) as q:
        assert [t.name for t in q.tensors] == llama_order([t.name for t in src.tensors])
        for t in q.tensors:
            want = expected_types(ft, t.name)
            assert t.ggml_type == want, f"{t.name}: {T(t.ggml_type).name}, llama.cpp picks {T(want).name}"
            x = src.tensor(t.name).data.view(np.float32).reshape(-1)
            if t.ggml_type == T.F32:
                ref = x.view(np.uint8)
            elif t.ggml_type in GGUF_QUANTIZERS:
                ref = gguf.quants.quantize(x.reshape(t.shape[::-1]), gguf.GGMLQuantizationType(t.ggml_type))
            else:
                ref = llamacpp_quants.quantize(t.ggml_type, x)
            assert np.array_equal(t.data, np.asarray(ref).reshape(-1).view(np.uint8)), t.name
        keys = list(q.metadata)
        assert keys[-2:] == ["general.quantization_version", "general.file_type"]
        assert q.get("general.quantization_version") == 2
        assert q.get("general.file_type") == FILE_TYPE_IDS[ft]  # llama.h's llama_ftype numbers
    r = gguf.GGUFReader(out)  # the gguf package reads the result
    assert len(r.tensors) == 8 * N_LAYER + 5


def test_tied_embeddings_take_the_output_type(tmp_path: Path) -> None:
    src = _model(tmp_path / "tied.gguf", tied=True)
    r = quantize_model(src, tmp_path / "o.gguf", "Q4_K_M")
    got = {c.name: c.new_type for c in r.choices}
    assert got["token_embd.weight"] == T.Q6_K
    opts = Options(output_type=T.Q8_0, token_embedding_type=T.Q4_0)
    r2 = quantize_model(src, tmp_path / "o2.gguf", "Q4_K_M", opts=opts)
    assert {c.name: c.new_type for c in r2.choices}["token_embd.weight"] == T.Q4_0


def test_options_pure_leave_output_and_override_kv(model: Path, tmp_path: Path) -> None:
    pure = {c.name: c.new_type for c in quantize_model(model, tmp_path / "p.gguf", "Q4_K_M",
                                                        opts=Options(pure=True)).choices}
    assert pure["blk.0.attn_v.weight"] == T.Q4_K and pure["output.weight"] == T.Q4_K
    assert pure["blk.0.odd96.weight"] == T.Q5_0  # the fallback still applies
    left = quantize_model(model, tmp_path / "l.gguf", "Q8_0", opts=Options(quantize_output=False),
                          overrides=[parse_override("general.name=str:renamed"), parse_override("x.n=int:-5")])
    assert {c.name: c.new_type for c in left.choices}["output.weight"] == T.F32
    with GGUFFile(left.path) as f:
        assert f.get("general.name") == "renamed" and f.get("x.n") == 5
        assert f.metadata_types["x.n"] == (GGUFValueType.UINT32,)
    with pytest.raises(ValueError, match="KEY=TYPE:VALUE"):
        parse_override("general.name=renamed")


def test_requantize_is_refused_unless_allowed_and_dequantize_round_trips(model: Path, tmp_path: Path) -> None:
    q8 = quantize_model(model, tmp_path / "q8.gguf", "Q8_0").path
    with pytest.raises(RequantizeError, match="already Q8_0: requantizing is refused without --allow-requantize"):
        quantize_model(q8, tmp_path / "q4.gguf", "Q4_0")
    f32 = quantize_model(q8, tmp_path / "back.gguf", "F32", allow_requantize=True).path
    again = quantize_model(f32, tmp_path / "again.gguf", "Q8_0").path
    with GGUFFile(q8) as a, GGUFFile(again) as b:  # Q8_0 of its own dequantized values: the same blocks
        for t in a.tensors:
            assert np.array_equal(t.data, b.tensor(t.name).data), t.name


def test_f16_input_and_threads_give_the_same_bytes(tmp_path: Path) -> None:
    src = _model(tmp_path / "f16.gguf", dtype=np.float16)
    one = quantize_model(src, tmp_path / "a.gguf", "Q5_K_M", threads=1).path
    two = quantize_model(src, tmp_path / "b.gguf", "Q5_K_M", threads=2).path
    assert one.read_bytes() == two.read_bytes()


def test_smollm2_requantized_keeps_its_greedy_tokens(smollm2_path: Path, tmp_path: Path) -> None:
    from edgellama.llm import LLM

    out = quantize_model(smollm2_path, tmp_path / "q8.gguf", "Q8_0", allow_requantize=True, threads=2).path
    prompt = [1, 504, 3458, 282, 4649, 314, 253, 1345, 28, 378, 1848, 282]
    with LLM(smollm2_path, n_ctx=64, n_threads=1) as a:
        want = a.eval(prompt, all_logits=True).argmax(axis=1)
    with LLM(out, n_ctx=64, n_threads=1) as b:
        got = b.eval(prompt, all_logits=True).argmax(axis=1)
    assert (got == want).mean() >= 0.9, (got, want)


def test_cli_json_and_bad_input(model: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["quantize", str(model), str(tmp_path / "o.gguf"), "q4_k", "--json", "-t", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["file_type"] == "Q4_K_M" and doc["types"]["Q6_K"] == 9 and doc["size_out"] < doc["size_in"]
    assert main(["quantize", str(model), str(tmp_path / "o.gguf"), "Q4_0"]) == 1
    assert "already exists" in capsys.readouterr().err
    assert main(["quantize", str(model), str(tmp_path / "x.gguf"), "IQ9_Z"]) == 1
    assert "unknown quantization type 'IQ9_Z'" in capsys.readouterr().err
    bad = tmp_path / "trunc.gguf"
    bad.write_bytes(model.read_bytes()[:5000])
    assert main(["quantize", str(bad), str(tmp_path / "y.gguf"), "Q8_0"]) == 1
    assert "trunc.gguf" in capsys.readouterr().err  # the reader's error, naming the file
    nan = tmp_path / "nan.gguf"
    w = GGUFWriter(nan, arch="llama")
    w.add_tensor("blk.0.attn_q.weight", np.full((2, 32), np.nan, np.float32))
    w.write()
    assert main(["quantize", str(nan), str(tmp_path / "z.gguf"), "Q8_0"]) == 1
    assert "inf or NaN" in capsys.readouterr().err
    with pytest.raises(GGUFError):
        quantize_model(bad, tmp_path / "w.gguf", "Q8_0")


@pytest.mark.parametrize("which", ["gemma", "smollm2", pytest.param("qwen", marks=pytest.mark.slow)])
def test_type_choices_equal_those_llama_quantize_made(which: str, request: pytest.FixtureRequest) -> None:
    """The shipped models were made by llama-quantize (no importance matrix changes a type choice):
    for each file's own type, every tensor gets the type the file holds. Gemma's was made by a recent
    llama-quantize, whose tensor order (by layer, then name) quantize writes too; the older SmolLM2
    and Qwen files keep their converter's order."""
    from edgellama.gguf.quant_mix import FILE_TYPES, choose_types

    path = request.getfixturevalue(f"{which}_path")
    names = {v[0]: k for k, v in FILE_TYPES.items()}
    with GGUFFile(path) as f:
        ft = names[int(f.get("general.file_type"))]
        choices = choose_types(f.tensors, f.metadata, ft, Options())
        differ = [(c.name, T(c.new_type).name, f.tensor(c.name).type_name) for c in choices
                  if c.new_type != f.tensor(c.name).ggml_type]
        assert not differ, f"{which} {ft}: {differ[:5]}"
        if which == "gemma":
            assert [t.name for t in f.tensors] == llama_order([t.name for t in f.tensors])


def test_hostile_inputs_fail_with_a_clear_error(tmp_path: Path) -> None:
    """Truncations and random header bytes of a small model: quantize and split either work or raise
    one of the expected errors (never crash); a type the kernels cannot read is named."""
    from edgellama.gguf.split import split_model
    from edgellama.native.lib import KernelError

    src = tmp_path / "small.gguf"
    w = GGUFWriter(src, arch="llama")
    w.add("llama.block_count", 1, GGUFValueType.UINT32)
    w.add_tensor("blk.0.attn_q.weight", np.linspace(-1, 1, 64 * 4, dtype=np.float32).reshape(4, 64))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(64, np.float32))
    w.write()
    data = src.read_bytes()
    rng = np.random.default_rng(3)
    bad = tmp_path / "bad.gguf"
    for i in range(120):
        b = bytearray(data)
        if i % 3 == 0:
            b = b[: int(rng.integers(0, len(b)))]
        else:
            for _ in range(int(rng.integers(1, 4))):
                b[int(rng.integers(0, 300))] = int(rng.integers(0, 256))
        bad.write_bytes(bytes(b))
        for op in (lambda: quantize_model(bad, tmp_path / "o.gguf", "Q8_0", allow_requantize=True),
                   lambda: split_model(bad, tmp_path / "p", max_tensors=1)):
            try:
                op()
            except (GGUFError, ValueError, KernelError, UnicodeError):
                pass
    iq = tmp_path / "iq.gguf"
    w = GGUFWriter(iq, arch="llama")
    w.add_tensor("blk.0.attn_q.weight", np.zeros(66 * 2, np.uint8), (256, 2), T.IQ2_XXS)
    w.write()
    with pytest.raises(ValueError, match="tensor .blk.0.attn_q.weight.: its type IQ2_XXS is not supported"):
        quantize_model(iq, tmp_path / "x.gguf", "Q8_0", allow_requantize=True)


# llama.cpp's own outputs (llama_model_quantize of llama-cpp-python 0.3.36) from F16 inputs made by
# `edgellama quantize MODEL F16 --allow-requantize`: hashes recorded by bench/quantize_vs_llamacpp.py,
# which compares every type tensor by tensor. Here edgellama's outputs are made again for a subset.
LLAMACPP_RECORD = Path(__file__).parent / "data" / "quantize_llamacpp.json"
RECHECK = {"smollm2": ["Q4_K_M", "Q8_0", "Q3_K_S"], "gemma": ["Q4_K_M", "Q5_K_M", "Q4_0", "Q6_K", "BF16"]}


def _recheck_params() -> list[Any]:
    rec = json.loads(LLAMACPP_RECORD.read_text())["models"] if LLAMACPP_RECORD.exists() else {}
    marks = {"smollm2": [], "gemma": [pytest.mark.slow]}
    return [pytest.param(m, ft, marks=marks[m], id=f"{m}-{ft}") for m, fts in RECHECK.items()
            for ft in fts if ft in rec.get(m, {}).get("types", {})]


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 24):
            h.update(chunk)
    return h.hexdigest()


@pytest.fixture(scope="module")
def f16_inputs(tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest) -> Any:
    """The F16 input of a model, made once per module and checked against the recorded hash."""
    made: dict[str, Path] = {}
    folder = tmp_path_factory.mktemp("f16")

    def get(which: str) -> Path:
        if which not in made:
            rec = json.loads(LLAMACPP_RECORD.read_text())["models"][which]
            src = request.getfixturevalue(f"{which}_path")
            assert _sha256(src) == rec["source_sha256"], f"{src} is not the file the reference was made from"
            made[which] = quantize_model(src, folder / f"{which}-f16.gguf", "F16", allow_requantize=True,
                                         threads=2).path
            assert _sha256(made[which]) == rec["f16_sha256"], f"{which}: the F16 input differs from the recorded one"
        return made[which]

    return get


@pytest.mark.parametrize(("which", "ft"), _recheck_params())
def test_bytes_equal_llama_quantize_output(which: str, ft: str, f16_inputs: Any, tmp_path: Path) -> None:
    want = json.loads(LLAMACPP_RECORD.read_text())["models"][which]["types"][ft]
    out = quantize_model(f16_inputs(which), tmp_path / "o.gguf", ft, threads=2).path
    with GGUFFile(out) as f:
        counts: dict[str, int] = {}
        for t in f.tensors:
            counts[t.type_name] = counts.get(t.type_name, 0) + 1
    assert counts == want["tensor_types"], f"{which} {ft}: tensor types {counts}, llama.cpp's {want['tensor_types']}"
    assert out.stat().st_size == want["size"]
    assert _sha256(out) == want["sha256"], (f"{which} {ft}: bytes differ from llama.cpp's output; "
                                            f"bench/quantize_vs_llamacpp.py --models {which} --types {ft} tells where")

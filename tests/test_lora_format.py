"""LoRA adapter files: what tests/lora_util.py writes is llama.cpp's layout (read back by the gguf
package), edgellama reads it back per tensor type, and every mismatch with the base model is refused
by name, on the real SmolLM2 (llama) and gemma3 bases."""

from __future__ import annotations

import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from lora_util import DTYPES, encode, random_adapter, to_bf16, write_adapter

from edgellama.gguf.ggml_types import GGMLType
from edgellama.gguf.reader import GGUFValueType
from edgellama.gguf.split import ModelFile, open_model_file
from edgellama.lora import LoraAdapter, LoraError, LoraWeight, read_adapter

BASES = ["smollm2", "gemma"]


@pytest.fixture(scope="module", params=BASES)
def base(request: pytest.FixtureRequest) -> Iterator[ModelFile]:
    with open_model_file(request.getfixturevalue(f"{request.param}_path")) as f:
        yield f


def two_layer_pairs(base: ModelFile, rank: int, seed: int = 1) -> dict[str, tuple[Any, Any]]:
    """Random pairs on layers 0 and 1 only: enough to exercise every target, and fast."""
    pairs = random_adapter(base, rank, seed=seed, amplitude=0.1)
    return {n: p for n, p in pairs.items() if n.startswith(("blk.0.", "blk.1."))}


def expected_decode(x: np.ndarray, dtype: str) -> np.ndarray:
    """What a reader must get back from x written as dtype."""
    from edgellama.native import kernels

    raw, gtype = encode(x, dtype)
    if dtype == "BF16":
        return (raw.astype(np.uint32) << 16).view(np.float32).reshape(x.shape)
    if dtype == "Q8_0":
        return kernels.dequantize(raw, gtype, x.size).reshape(x.shape)
    return raw.astype(np.float32).reshape(x.shape)


# --- the layout, read by an independent reader ------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_gguf_package_reads_written_adapter(base: ModelFile, tmp_path: Path, dtype: str) -> None:
    import gguf

    pairs = two_layer_pairs(base, rank=32)
    path = write_adapter(tmp_path / "a.gguf", base.architecture or "", 16.0, pairs, dtype=dtype)
    r = gguf.GGUFReader(path)
    assert r.fields["general.type"].contents() == "adapter"
    assert r.fields["adapter.type"].contents() == "lora"
    assert r.fields["general.architecture"].contents() == base.architecture
    alpha = r.fields["adapter.lora.alpha"]
    assert alpha.types == [gguf.GGUFValueType.FLOAT32] and alpha.contents() == 16.0
    got = {t.name: t for t in r.tensors}
    assert set(got) == {n + s for n in pairs for s in (".lora_a", ".lora_b")}
    for name, (a, b) in pairs.items():
        w = base.tensor(name)
        ta, tb = got[name + ".lora_a"], got[name + ".lora_b"]
        # llama.cpp's shape rule: a.ne0 == W.ne0, b.ne1 == W.ne1, a.ne1 == b.ne0 (the rank)
        assert tuple(ta.shape) == (w.shape[0], 32) and tuple(tb.shape) == (32, w.shape[1])
        assert ta.tensor_type.name == dtype
        for t, m in ((ta, a), (tb, b)):
            vals = gguf.quants.dequantize(t.data, t.tensor_type).reshape(m.shape)
            np.testing.assert_array_equal(vals.astype(np.float32), expected_decode(m, dtype))


# --- round trips ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_round_trip_per_dtype(base: ModelFile, tmp_path: Path, dtype: str) -> None:
    pairs = two_layer_pairs(base, rank=32, seed=2)
    path = write_adapter(tmp_path / "task-menu.gguf", base.architecture or "", 8.0, pairs, dtype=dtype)
    ad = read_adapter(path, base)
    assert isinstance(ad, LoraAdapter)
    assert ad.path == path and ad.name == "task-menu" and ad.alpha == 8.0
    assert set(ad.weights) == set(pairs)
    for name, (a, b) in pairs.items():
        w = ad.weights[name]
        assert isinstance(w, LoraWeight) and w.rank == 32
        for got, want in ((w.a, a), (w.b, b)):
            # F16 is kept as halves (what the engine reads), the other types widened to float32
            held = np.float16 if dtype == "F16" else np.float32
            assert got.dtype == held and got.shape == want.shape
            # A row-major; B the transpose of a row-major [rank, n_out] (what the engine reads, uncopied)
            assert got.flags.c_contiguous if got is w.a else got.T.flags.c_contiguous
            np.testing.assert_array_equal(got, expected_decode(want, dtype))
            # the stated precision of each type, against the values written
            err = np.abs(got - want).max() / np.abs(want).max()
            assert err <= {"F32": 0, "F16": 1e-3, "BF16": 8e-3, "Q8_0": 8e-3}[dtype]
    item = 2 if dtype == "F16" else 4
    assert ad.nbytes == sum(item * (a.size + b.size) for a, b in pairs.values())


def test_q8_0_adapter_of_small_rank_keeps_lora_b_in_f16(base: ModelFile, tmp_path: Path) -> None:
    """convert_lora_to_gguf.py falls back to F16 for a tensor whose rows are not whole Q8_0 blocks:
    lora_b of rank 8. Such a mixed file reads back like any other."""
    pairs = two_layer_pairs(base, rank=8)
    path = write_adapter(tmp_path / "q8.gguf", base.architecture or "", 8.0, pairs, dtype="Q8_0")
    from edgellama.gguf.reader import GGUFFile

    with GGUFFile(path) as f:
        assert {t.type_name for t in f.tensors if t.name.endswith(".lora_a")} == {"Q8_0"}
        assert {t.type_name for t in f.tensors if t.name.endswith(".lora_b")} == {"F16"}
    ad = read_adapter(path, base)
    for name, (a, b) in pairs.items():
        np.testing.assert_array_equal(ad.weights[name].a, expected_decode(a, "Q8_0"))
        np.testing.assert_array_equal(ad.weights[name].b, expected_decode(b, "F16"))
        assert ad.weights[name].a.dtype == np.float32 and ad.weights[name].b.dtype == np.float16


def test_scale_is_user_scale_times_alpha_over_rank(base: ModelFile, tmp_path: Path) -> None:
    pairs = {**two_layer_pairs(base, rank=8)}
    first = next(iter(pairs))
    a, b = pairs[first]
    pairs[first] = (a[:4], b[:, :4])  # one tensor of rank 4 beside the rank-8 ones
    arch = base.architecture or ""
    ad = read_adapter(write_adapter(tmp_path / "a.gguf", arch, 12.0, pairs), base)
    assert ad.weights[first].rank == 4
    assert ad.scale_of(first, 0.5) == pytest.approx(0.5 * 12 / 4, rel=1e-7)
    other = next(n for n in pairs if n != first)
    assert ad.scale_of(other, 1.0) == float(np.float32(1.0) * np.float32(12.0) / np.float32(8.0))
    assert ad.scale_of(other, 0.0) == 0.0
    # alpha 0 means "no alpha": the user scale alone, whatever the rank (llama.cpp's rule)
    zero = read_adapter(write_adapter(tmp_path / "z.gguf", arch, 0.0, pairs), base)
    assert zero.scale_of(first, 0.75) == 0.75 and zero.scale_of(other, 0.75) == 0.75
    with pytest.raises(KeyError):
        zero.scale_of("output_norm.weight", 1.0)


def test_reads_f64_alpha_and_ignores_norm_tensors(base: ModelFile, tmp_path: Path) -> None:
    """mergekit-extract-lora adapters carry *_norm.weight tensors llama.cpp ignores; so do we."""
    pairs = two_layer_pairs(base, rank=4)
    norm = np.ones(base.tensor("blk.0.attn_norm.weight").shape[0], np.float32)
    path = write_adapter(tmp_path / "a.gguf", base.architecture or "", 4.0, pairs,
                         extra_kv={"adapter.lora.alpha": (4.0, GGUFValueType.FLOAT64)},
                         extra_tensors={"blk.0.attn_norm.weight": norm})
    ad = read_adapter(path, base)
    assert ad.alpha == 4.0 and set(ad.weights) == set(pairs)


# --- refusals ---------------------------------------------------------------------------------------


def refused(path: Path, base: ModelFile, *needles: str) -> str:
    with pytest.raises(LoraError) as ei:
        read_adapter(path, base)
    msg = str(ei.value)
    assert str(path) in msg, msg
    for n in needles:
        assert n in msg, msg
    return msg


def test_refuses_files_that_are_not_adapters(base: ModelFile, tmp_path: Path) -> None:
    text = tmp_path / "notes.gguf"
    text.write_text("not a model at all\n")
    refused(text, base, "not a GGUF file")
    refused(tmp_path / "missing.gguf", base, "cannot open")
    good = write_adapter(tmp_path / "good.gguf", base.architecture or "", 8.0, two_layer_pairs(base, 8))
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good.read_bytes()[: good.stat().st_size // 2])
    refused(cut, base, "outside")
    refused(base.path, base, "not a LoRA adapter", "this is a model file")


@pytest.mark.parametrize(("kv", "drop", "needles"), [
    ({"general.type": "model"}, (), ("general.type is 'model'", "expected 'adapter'")),
    ({}, ("general.type",), ("general.type is missing",)),
    ({"adapter.type": "control_vector"}, (), ("adapter.type is 'control_vector'", "expected 'lora'")),
    ({}, ("adapter.type",), ("adapter.type is missing",)),
    ({}, ("adapter.lora.alpha",), ("no adapter.lora.alpha",)),
    ({"adapter.lora.alpha": "16"}, (), ("adapter.lora.alpha has type STRING",)),
    ({"adapter.lora.alpha": (float("nan"), GGUFValueType.FLOAT32)}, (), ("not a finite number",)),
    ({"general.architecture": "qwen2"}, (), ("architecture 'qwen2'",)),
    ({}, ("general.architecture",), ("no general.architecture",)),
    ({"adapter.alora.invocation_tokens": ([1, 2], GGUFValueType.ARRAY)}, (), ("activated LoRA",)),
])
def test_refuses_bad_metadata(base: ModelFile, tmp_path: Path, kv: dict[str, Any], drop: tuple[str, ...],
                              needles: tuple[str, ...]) -> None:
    path = write_adapter(tmp_path / "a.gguf", base.architecture or "", 8.0, two_layer_pairs(base, 8),
                         extra_kv=kv, drop_kv=drop)
    msg = refused(path, base, *needles)
    if "architecture 'qwen2'" in needles:
        assert repr(base.architecture) in msg and base.path.name in msg


def test_refuses_adapter_for_the_other_base(smollm2_path: Path, gemma_path: Path, tmp_path: Path) -> None:
    """A SmolLM2 adapter on gemma3 (and back): the architecture check names both."""
    with open_model_file(smollm2_path) as smol, open_model_file(gemma_path) as gemma:
        for src, dst in ((smol, gemma), (gemma, smol)):
            path = write_adapter(tmp_path / f"{src.architecture}.gguf", src.architecture or "", 8.0,
                                 two_layer_pairs(src, 8))
            refused(path, dst, f"architecture {src.architecture!r}", repr(dst.architecture))


def test_refuses_unpaired_tensors(base: ModelFile, tmp_path: Path) -> None:
    arch = base.architecture or ""
    pairs = two_layer_pairs(base, 8)
    name = "blk.1.ffn_up.weight"
    a, b = pairs.pop(name)
    p = write_adapter(tmp_path / "a_only.gguf", arch, 8.0, pairs, extra_tensors={name + ".lora_a": a})
    refused(p, base, f"'{name}.lora_a' has no '{name}.lora_b'")
    p = write_adapter(tmp_path / "b_only.gguf", arch, 8.0, pairs, extra_tensors={name + ".lora_b": b})
    refused(p, base, f"'{name}.lora_b' has no '{name}.lora_a'")
    p = write_adapter(tmp_path / "odd.gguf", arch, 8.0, pairs, extra_tensors={name: a})
    refused(p, base, f"tensor '{name}' is neither a .lora_a nor a .lora_b")
    refused(write_adapter(tmp_path / "empty.gguf", arch, 8.0, {}), base, "no lora_a/lora_b tensor pairs")


def test_refuses_tensors_the_base_lacks_or_cannot_take(base: ModelFile, tmp_path: Path) -> None:
    arch = base.architecture or ""
    a, b = two_layer_pairs(base, 8)["blk.0.attn_q.weight"]
    n_layer = sum(1 for t in base.tensors if t.name.endswith(".attn_q.weight"))
    missing = f"blk.{n_layer}.attn_q.weight"
    refused(write_adapter(tmp_path / "m.gguf", arch, 8.0, {missing: (a, b)}), base,
            f"tensor '{missing}' does not exist in the base model", base.path.name)
    emb = base.tensor("token_embd.weight")
    rng = np.random.default_rng(0)
    emb_pair = (rng.standard_normal((8, emb.shape[0])).astype(np.float32),
                rng.standard_normal((emb.shape[1], 8)).astype(np.float32))
    refused(write_adapter(tmp_path / "e.gguf", arch, 8.0, {"token_embd.weight": emb_pair}), base,
            "LoRA on token_embd is not supported")
    n = base.tensor("blk.0.attn_norm.weight").shape[0]
    vec = (np.ones((8, n), np.float32), np.ones((1, 8), np.float32))
    refused(write_adapter(tmp_path / "v.gguf", arch, 8.0, {"blk.0.attn_norm.weight": vec}), base,
            "'blk.0.attn_norm.weight'", "is not a matrix")


def test_refuses_wrong_shapes(base: ModelFile, tmp_path: Path) -> None:
    arch = base.architecture or ""
    name = "blk.0.ffn_down.weight"
    a, b = two_layer_pairs(base, 8)[name]
    w = base.tensor(name)
    # the shapes of the transposed matrix (an adapter for a model with other sizes looks the same)
    up = base.tensor("blk.0.ffn_up.weight")
    assert up.shape == (w.shape[1], w.shape[0])
    a_up, b_up = two_layer_pairs(base, 8)["blk.0.ffn_up.weight"]
    cases = {
        "a_in": (a_up, b),          # a.ne0 != W.ne0
        "b_out": (a, b_up),         # b.ne1 != W.ne1
        "swapped": (a_up, b_up),    # both: the pair of ffn_up under ffn_down's name
        "rank": (a, b[:, :4]),      # a.ne1 != b.ne0
        "flipped": (b.T.copy(), a.T.copy()),  # A and B exchanged
    }
    for what, pair in cases.items():
        p = write_adapter(tmp_path / f"{what}.gguf", arch, 8.0, {name: pair})
        msg = refused(p, base, f"tensor '{name}'")
        assert ("rank" in msg) if what == "rank" else (str(w.shape) in msg), msg


def test_refuses_rank_zero(base: ModelFile, tmp_path: Path) -> None:
    """A zero dimension cannot be written by our writer: patch the header of a rank-1 file."""
    name = "blk.0.attn_v.weight"
    a, b = two_layer_pairs(base, 1)[name]
    path = write_adapter(tmp_path / "r0.gguf", base.architecture or "", 1.0, {name: (a, b)})
    data = bytearray(path.read_bytes())
    key = (name + ".lora_a").encode()
    at = data.index(struct.pack("<Q", len(key)) + key) + 8 + len(key)
    assert struct.unpack_from("<IQQ", data, at) == (2, a.shape[1], 1)
    struct.pack_into("<Q", data, at + 12, 0)
    path.write_bytes(bytes(data))
    refused(path, base, f"'{name}.lora_a'", "dimension 1 is 0")


def test_refuses_other_tensor_types(base: ModelFile, tmp_path: Path) -> None:
    from edgellama.native import kernels

    arch = base.architecture or ""
    name = "blk.0.attn_k.weight"
    a, b = two_layer_pairs(base, 32)[name]
    p = write_adapter(tmp_path / "f64.gguf", arch, 8.0, {}, extra_tensors={
        name + ".lora_a": a.astype(np.float64), name + ".lora_b": b})
    refused(p, base, f"'{name}.lora_a' has type F64", "F32, F16, BF16, Q8_0")
    from edgellama.gguf.writer import GGUFWriter

    q4 = tmp_path / "q4.gguf"
    w = GGUFWriter(q4, arch)
    w.add("general.type", "adapter")
    w.add("adapter.type", "lora")
    w.add("adapter.lora.alpha", 8.0)
    w.add_tensor(name + ".lora_a", a)
    w.add_tensor(name + ".lora_b", kernels.quantize(b, GGMLType.Q4_0), (b.shape[1], b.shape[0]), GGMLType.Q4_0)
    w.write()
    refused(q4, base, f"'{name}.lora_b' has type Q4_0")


@pytest.mark.parametrize("dtype", ["F32", "F16", "BF16"])
def test_refuses_non_finite_values(base: ModelFile, tmp_path: Path, dtype: str) -> None:
    name = "blk.1.attn_output.weight"
    a, b = two_layer_pairs(base, 8)[name]
    b = b.copy()
    b[3, 5] = np.inf if dtype == "F16" else np.nan
    if dtype == "BF16":  # to_bf16 rounds NaN's payload: keep it a NaN of bf16
        assert np.isnan((to_bf16(b).astype(np.uint32) << 16).view(np.float32)[3, 5])
    p = write_adapter(tmp_path / "nan.gguf", base.architecture or "", 8.0, {name: (a, b)}, dtype=dtype)
    refused(p, base, f"'{name}.lora_b'", "non-finite", f"element {3 * b.shape[1] + 5}")

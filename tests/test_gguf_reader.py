"""The GGUF reader against the `gguf` package on real models, plus its zero-copy and format promises."""

from __future__ import annotations

import mmap
import os
from pathlib import Path

import numpy as np
import pytest
from gguf_fixtures import assert_same_as_gguf_py, mapped_rss_bytes, write_big_model, write_small_model

from edgellama.gguf.reader import GGUFError, GGUFFile, GGUFValueType


@pytest.mark.slow  # gguf.GGUFReader needs ~13 s to parse the 262144-entry vocabulary
def test_gemma3_reads_exactly_like_gguf_py(gemma_path: Path) -> None:
    assert_same_as_gguf_py(gemma_path)


def test_smollm2_reads_exactly_like_gguf_py(smollm2_path: Path) -> None:
    assert_same_as_gguf_py(smollm2_path)


def test_gemma3_vocab_arrays_are_typed_readonly_views_of_the_mapping(gemma_path: Path) -> None:
    with GGUFFile(gemma_path) as f:
        assert f.architecture == "gemma3"
        scores = f.metadata["tokenizer.ggml.scores"]
        assert scores.dtype == np.float32 and scores.shape == (262144,)
        base = scores.base  # a view, not a copy: its buffer is the file mapping
        assert isinstance(getattr(base, "obj", base), mmap.mmap)
        with pytest.raises(ValueError, match="read-only"):
            scores[0] = 1.0
        tokens = f.metadata["tokenizer.ggml.tokens"]
        assert len(tokens) == 262144 and tokens[:3] == ["<pad>", "<eos>", "<bos>"]
        assert f.metadata_types["tokenizer.ggml.tokens"] == (GGUFValueType.ARRAY, GGUFValueType.STRING)
        assert f.get("gemma3.block_count") == 18 and f.get("no.such.key", "dflt") == "dflt"


def test_tensor_data_is_a_readonly_view_of_exactly_its_bytes(tmp_path: Path) -> None:
    path = write_small_model(tmp_path / "m.gguf")
    blob = path.read_bytes()
    with GGUFFile(path) as f:
        for t in f.tensors:
            assert t.data.dtype == np.uint8 and t.data.size == t.n_bytes
            assert t.data.tobytes() == blob[t.offset : t.offset + t.n_bytes]
            assert t.offset % f.alignment == 0
            assert not t.data.flags.writeable
        norm = f.tensor("output_norm.weight")
        assert norm.shape == (32,) and norm.type_name == "F32"
        assert np.array_equal(norm.data.view(np.float32), np.ones(32, np.float32))
        with pytest.raises(KeyError, match="no tensor named"):
            f.tensor("missing.weight")


def test_open_touches_only_header_pages(tmp_path: Path) -> None:
    path = write_big_model(tmp_path / "big.gguf", data_mb=32)
    with GGUFFile(path) as f:
        assert f.metadata["llama.block_count"] == 4
        _ = [t.shape for t in f.tensors]
        header = f.data_offset
        # pages in our page tables: the header plus the kernel's 64 KiB fault-around, not 32 MiB of data
        assert mapped_rss_bytes(path) <= header + 128 * 1024
        f.tensors[2].data[::4096].max()  # positive control: touching a tensor does show up
        assert mapped_rss_bytes(path) >= f.tensors[2].n_bytes


def test_raw_gives_exact_bytes_of_invalid_utf8_strings(tmp_path: Path) -> None:
    from edgellama.gguf.writer import GGUFWriter

    w = GGUFWriter(tmp_path / "bytes.gguf")
    w.add("tok.bad", b"\xff\xfeab")
    w.add("tok.list", [b"\xe2\x82", "é".encode(), b""], GGUFValueType.ARRAY, GGUFValueType.STRING)
    w.add("tok.nested", [[b"\x80"], [b"ok"]], GGUFValueType.ARRAY, GGUFValueType.ARRAY)
    with GGUFFile(w.write()) as f:
        assert f.metadata["tok.bad"] == "\ufffd\ufffdab"
        assert f.raw("tok.bad") == b"\xff\xfeab"
        assert f.metadata["tok.list"] == ["\ufffd", "é", ""]
        assert f.raw("tok.list") == [b"\xe2\x82", "é".encode(), b""]
        assert f.raw("tok.nested") == [[b"\x80"], [b"ok"]]


def test_raw_vocab_bytes_match_decoded_tokens(smollm2_path: Path) -> None:
    with GGUFFile(smollm2_path) as f:
        raw = f.raw("tokenizer.ggml.tokens")
        assert [b.decode("utf-8") for b in raw] == f.metadata["tokenizer.ggml.tokens"]


def test_version_2_reads_like_version_3(tmp_path: Path) -> None:
    path = write_small_model(tmp_path / "v3.gguf")
    v2 = tmp_path / "v2.gguf"
    v2.write_bytes(path.read_bytes()[:4] + (2).to_bytes(4, "little") + path.read_bytes()[8:])
    with GGUFFile(path) as a, GGUFFile(v2) as b:
        assert (a.version, b.version) == (3, 2)
        assert list(a.metadata) == list(b.metadata)
        assert [(t.name, t.shape, t.offset) for t in a.tensors] == [(t.name, t.shape, t.offset) for t in b.tensors]


@pytest.mark.parametrize(
    ("version_bytes", "message"),
    [
        ((1).to_bytes(4, "little"), "version 1 is unsupported"),
        ((3).to_bytes(4, "big"), "big-endian GGUF"),
        ((2).to_bytes(4, "big"), "big-endian GGUF"),
        ((4).to_bytes(4, "little"), "unsupported GGUF version 4"),
    ],
)
def test_unsupported_versions_and_byte_orders_are_refused(tmp_path: Path, version_bytes: bytes, message: str) -> None:
    blob = write_small_model(tmp_path / "m.gguf").read_bytes()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(blob[:4] + version_bytes + blob[8:])
    with pytest.raises(GGUFError, match=message) as exc:
        GGUFFile(bad)
    assert exc.value.offset == 4


def test_default_alignment_is_32_and_data_section_is_aligned(tmp_path: Path) -> None:
    with GGUFFile(write_small_model(tmp_path / "m.gguf")) as f:
        assert "general.alignment" not in f.metadata
        assert f.alignment == 32 and f.data_offset % 32 == 0
    with GGUFFile(write_small_model(tmp_path / "m64.gguf", alignment=4096)) as f:
        assert f.alignment == 4096 and f.data_offset == 4096


def test_missing_directory_and_empty_paths_raise_gguf_error(tmp_path: Path) -> None:
    with pytest.raises(GGUFError, match="cannot open"):
        GGUFFile(tmp_path / "nope.gguf")
    with pytest.raises(GGUFError, match="cannot open: a directory"):
        GGUFFile(tmp_path)
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(GGUFError, match="not a regular file"):  # and it must not block in open()
        GGUFFile(tmp_path / "fifo")
    (tmp_path / "empty.gguf").write_bytes(b"")
    with pytest.raises(GGUFError, match="empty file"):
        GGUFFile(tmp_path / "empty.gguf")


def test_views_taken_before_close_stay_valid(tmp_path: Path) -> None:
    path = write_small_model(tmp_path / "m.gguf")
    f = GGUFFile(path)
    data = f.tensor("output_norm.weight").data
    scores = f.metadata["tokenizer.ggml.scores"]
    f.close()
    assert np.array_equal(data.view(np.float32), np.ones(32, np.float32))  # no use-after-unmap
    assert scores.tolist() == [0.0, -1.0, -2.0]
    with pytest.raises(ValueError, match="closed"):
        _ = f.tensor("token_embd.weight").data

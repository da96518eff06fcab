"""The GGUF writer: what it writes reads back identically through edgellama's reader and gguf-py's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf_fixtures import ALL_VALUES, assert_same_as_gguf_py, flatten, tensor_specs, write_all_types

from edgellama.gguf.ggml_types import GGMLType
from edgellama.gguf.reader import GGUFFile, GGUFValueType
from edgellama.gguf.writer import GGUFWriter, infer_element_type, infer_type

ALIGNMENTS = [1, 8, 32, 64, 4096]


def expected_flat(value: Any, elem: GGUFValueType | None) -> list[Any]:
    """The values a written array must read back as (float32 elements rounded to float32)."""
    flat = flatten(value) if isinstance(value, (list, np.ndarray)) else [value]
    if elem == GGUFValueType.FLOAT32 or (flat and isinstance(flat[0], float) and elem is None):
        return [float(np.float32(x)) for x in flat]
    return flat


@pytest.mark.parametrize("alignment", ALIGNMENTS)
def test_every_value_type_reads_back_as_written(tmp_path: Path, alignment: int) -> None:
    with GGUFFile(write_all_types(tmp_path / "all.gguf", alignment=alignment)) as f:
        assert f.alignment == alignment
        assert f.architecture == "testarch"
        for key, (value, vtype, elem) in ALL_VALUES.items():
            got = f.metadata[key]
            types = f.metadata_types[key]
            want_type = vtype if vtype is not None else infer_type(value)
            assert types[0] == want_type, key
            if want_type == GGUFValueType.ARRAY:
                assert len(got) == len(value), key
                if elem is not None:
                    assert types[1] == elem, key
                assert flatten(got) == expected_flat(value, elem), key
            elif want_type == GGUFValueType.FLOAT32:
                assert got == float(np.float32(value)), key
            else:
                assert got == value and type(got) is type(value), key


@pytest.mark.parametrize("alignment", ALIGNMENTS)
def test_gguf_py_reads_the_writers_files_identically(tmp_path: Path, alignment: int) -> None:
    assert_same_as_gguf_py(write_all_types(tmp_path / "all.gguf", alignment=alignment))


@pytest.mark.parametrize("alignment", ALIGNMENTS)
def test_tensors_are_laid_out_aligned_with_their_exact_bytes(tmp_path: Path, alignment: int) -> None:
    path = write_all_types(tmp_path / "t.gguf", alignment=alignment, seed=5)
    specs = tensor_specs(5)
    with GGUFFile(path) as f:
        assert [t.name for t in f.tensors] == [s[0] for s in specs]
        assert f.data_offset % alignment == 0
        end = f.data_offset
        for t, (name, shape, ggml_type, raw) in zip(f.tensors, specs):
            assert (t.shape, t.ggml_type, t.n_bytes) == (shape, ggml_type, len(raw)), name
            assert t.offset == end, name  # packed in order, each padded to the alignment
            assert t.data.tobytes() == raw, name
            end = t.offset + t.n_bytes + (-t.n_bytes) % alignment
        assert f.file_size == end


def test_quantized_tensors_dequantize_the_same_through_gguf_py(tmp_path: Path) -> None:
    from gguf import GGMLQuantizationType, GGUFReader, quants

    rng = np.random.default_rng(3)
    x = rng.standard_normal((4, 256)).astype(np.float32)
    q8 = quants.quantize(x, GGMLQuantizationType.Q8_0)
    w = GGUFWriter(tmp_path / "q.gguf", arch="llama")
    w.add_tensor("q8.weight", q8, (256, 4), GGMLType.Q8_0)
    w.add_tensor("f16.weight", x.astype(np.float16))  # shape and type from the numpy array
    w.add_tensor("f32.weight", x)
    path = w.write()
    ref = {t.name: t for t in GGUFReader(path).tensors}
    with GGUFFile(path) as f:
        q = f.tensor("q8.weight")
        ours = quants.dequantize(q.data.reshape(4, -1), GGMLQuantizationType.Q8_0)
        assert np.array_equal(ours, quants.dequantize(ref["q8.weight"].data, GGMLQuantizationType.Q8_0))
        assert np.abs(ours - x).max() < 0.05  # and it is the data we quantized
        h = f.tensor("f16.weight")
        assert h.shape == (256, 4) and h.ggml_type == GGMLType.F16
        assert np.array_equal(h.data.view(np.float16).reshape(4, 256), ref["f16.weight"].data)
        assert np.array_equal(f.tensor("f32.weight").data.view(np.float32).reshape(4, 256), x)


@pytest.mark.parametrize(
    ("value", "vtype"),
    [
        (0, GGUFValueType.INT32),
        (-(1 << 31), GGUFValueType.INT32),
        ((1 << 31) - 1, GGUFValueType.INT32),
        (1 << 31, GGUFValueType.UINT32),
        ((1 << 32) - 1, GGUFValueType.UINT32),
        (1 << 32, GGUFValueType.INT64),
        (-(1 << 31) - 1, GGUFValueType.INT64),
        (1 << 63, GGUFValueType.UINT64),
        (True, GGUFValueType.BOOL),
        (1.0, GGUFValueType.FLOAT32),
        ("s", GGUFValueType.STRING),
        ([1], GGUFValueType.ARRAY),
    ],
)
def test_type_inference_follows_int32_first_widening_rule(value: Any, vtype: GGUFValueType) -> None:
    assert infer_type(value) == vtype


def test_array_element_type_covers_all_elements() -> None:
    assert infer_element_type([1, 2]) == GGUFValueType.INT32
    assert infer_element_type([1, 1 << 31]) == GGUFValueType.UINT32
    assert infer_element_type([-1, 1 << 31]) == GGUFValueType.INT64
    assert infer_element_type(np.zeros(2, np.uint16)) == GGUFValueType.UINT16
    assert infer_element_type([[1], [2]]) == GGUFValueType.ARRAY
    with pytest.raises(ValueError, match="one type"):
        infer_element_type([1, 1.5])
    with pytest.raises(ValueError, match="one type"):
        infer_element_type([True, 2])
    with pytest.raises(ValueError, match="fits no GGUF integer type"):
        infer_type(1 << 64)


def test_writer_refuses_what_would_make_a_bad_file(tmp_path: Path) -> None:
    w = GGUFWriter(tmp_path / "x.gguf")
    w.add("a", 1)
    with pytest.raises(ValueError, match="duplicate metadata key"):
        w.add("a", 2)
    with pytest.raises(ValueError, match="does not fit"):
        w.add("b", 300, GGUFValueType.UINT8)
    with pytest.raises(ValueError, match="power of two"):
        w.add("general.alignment", 48, GGUFValueType.UINT32)
    with pytest.raises(ValueError, match="power of two"):
        GGUFWriter(tmp_path / "y.gguf", alignment=3)
    w.add_tensor("t", bytes(34), (32,), GGMLType.Q8_0)
    with pytest.raises(ValueError, match="duplicate tensor name"):
        w.add_tensor("t", bytes(34), (32,), GGMLType.Q8_0)
    with pytest.raises(ValueError, match="needs 68 bytes, got 34"):
        w.add_tensor("u", bytes(34), (32, 2), GGMLType.Q8_0)
    with pytest.raises(ValueError, match="whole number of Q4_K blocks"):
        w.add_tensor("v", bytes(144), (128, 2), GGMLType.Q4_K)
    with pytest.raises(ValueError, match="positive dims"):
        w.add_tensor("w", bytes(0), (0,), GGMLType.F32)
    with pytest.raises(ValueError, match="unknown ggml type"):
        w.add_tensor("x", bytes(4), (1,), 99)
    w.write()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.gguf"]  # no temporary left behind


def test_set_alignment_through_metadata_changes_the_layout(tmp_path: Path) -> None:
    w = GGUFWriter(tmp_path / "a.gguf")
    w.add("general.alignment", 256, GGUFValueType.UINT32)
    w.add_tensor("t", np.ones(3, np.float32))
    with GGUFFile(w.write()) as f:
        assert f.alignment == 256 and f.data_offset % 256 == 0 and f.file_size % 256 == 0

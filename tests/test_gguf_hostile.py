"""Hostile input: truncated and corrupted GGUF files give GGUFError (with a byte offset) or a valid read.

Never another exception type, never a crash, never an allocation sized by a field nobody checked.
"""

from __future__ import annotations

import random
import tracemalloc
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from gguf_fixtures import HeaderField, field_of, header_fields, put_uint, write_all_types, write_small_model

from edgellama.gguf.reader import GGUFError, GGUFFile, GGUFValueType
from edgellama.gguf.writer import GGUFWriter

ALLOC_LIMIT = 2 << 20  # a ~1.3 KB file never needs more than a few KB of Python/numpy memory to open


def exercise(path: Path) -> GGUFFile | None:
    """Open path and use everything the reader hands out; None when it was refused with GGUFError."""
    try:
        f = GGUFFile(path)
    except GGUFError as exc:
        assert exc.offset is not None, f"error without a byte offset: {exc}"
        assert "byte offset" in str(exc)
        return None
    with f:
        for key, value in f.metadata.items():
            f.raw(key)
            if isinstance(value, np.ndarray):
                value.sum()
        for t in f.tensors:
            assert t.data.size == t.n_bytes
            int(t.data.sum())  # every view really lies inside the mapping
        assert f.data_offset % f.alignment == 0
    return f


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    return write_small_model(tmp_path_factory.mktemp("small") / "small.gguf").read_bytes()


def test_truncation_at_every_byte_offset(small: bytes, tmp_path: Path) -> None:
    with GGUFFile(write_small_model(tmp_path / "ref.gguf")) as ref:
        data_end = max(t.offset + t.n_bytes for t in ref.tensors)
    path = tmp_path / "cut.gguf"
    for n in range(len(small) + 1):
        path.write_bytes(small[:n])
        f = exercise(path)
        # anything cut before the last tensor byte is refused; cutting only trailing padding is harmless
        assert (f is not None) == (n >= data_end), n


INTERESTING_U64 = [0, 1, 2, 3, 4, 7, 8, 31, 32, 33, 255, 1 << 31, (1 << 32) - 1, 1 << 32, (1 << 63) - 1,
                   1 << 63, (1 << 64) - 1, (1 << 64) - 8]
INTERESTING_U32 = [0, 1, 2, 3, 4, 5, 7, 8, 9, 12, 13, 14, 15, 30, 31, 34, 39, 40, 41, 255, 1 << 31, (1 << 32) - 1]


def mutate(blob: bytes, fields: list[HeaderField], header_end: int, rng: random.Random) -> bytes:
    out = bytearray(blob)
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        how = rng.random()
        if how < 0.5:  # aim at a length, count, dim, type or offset
            f = rng.choice([f for f in fields if f.kind != "str"])
            if f.size == 8:
                v = rng.choice([*INTERESTING_U64, len(blob), len(blob) - 1, rng.getrandbits(64), rng.getrandbits(12)])
            else:
                v = rng.choice([*INTERESTING_U32, rng.getrandbits(32), rng.getrandbits(6)])
            out[f.offset : f.offset + f.size] = (v & ((1 << (8 * f.size)) - 1)).to_bytes(f.size, "little")
        elif how < 0.65:  # a string body byte, often making it invalid UTF-8
            strs = [f for f in fields if f.kind == "str" and f.size]
            f = rng.choice(strs)
            out[f.offset + rng.randrange(f.size)] = rng.choice([0xFF, 0x80, 0xC3, 0, rng.getrandbits(8)])
        elif how < 0.85:  # flip one bit anywhere in the header
            i = rng.randrange(header_end)
            out[i] ^= 1 << rng.randrange(8)
        else:  # smash an 8-byte window
            i = rng.randrange(max(1, header_end - 8))
            out[i : i + 8] = rng.choice([b"\xff" * 8, b"\x00" * 8, rng.randbytes(8)])
    if rng.random() < 0.05:
        del out[rng.randrange(len(out)) :]
    return bytes(out)


@pytest.mark.parametrize("which", ["small", "all_types"])
def test_seeded_random_mutations_give_gguf_error_or_a_valid_read(which: str, small: bytes, tmp_path: Path) -> None:
    blob = small if which == "small" else write_all_types(tmp_path / "all.gguf").read_bytes()
    fields = header_fields(blob)
    (tmp_path / "base.gguf").write_bytes(blob)
    with GGUFFile(tmp_path / "base.gguf") as base:
        header_end = base.data_offset
    rng = random.Random(20240611 if which == "small" else 7)
    path = tmp_path / "mutant.gguf"
    outcomes = {"refused": 0, "read": 0}
    tracemalloc.start()
    try:
        for case in range(2000 if which == "small" else 600):
            mutant = mutate(blob, fields, header_end, rng)
            path.write_bytes(mutant)
            tracemalloc.reset_peak()
            try:
                f = exercise(path)
            except Exception as exc:  # anything but GGUFError is the bug this test exists to find
                raise AssertionError(f"case {case}: {type(exc).__name__}: {exc}") from exc
            peak = tracemalloc.get_traced_memory()[1]
            assert peak < ALLOC_LIMIT, f"case {case}: opening a {len(mutant)}-byte file allocated {peak} bytes"
            outcomes["refused" if f is None else "read"] += 1
    finally:
        tracemalloc.stop()
    # the mutations must really reach the checks, and some must be harmless (a changed float, say)
    n = sum(outcomes.values())
    assert outcomes["refused"] > n // 4 and outcomes["read"] > n // 100, outcomes


# --- one corruption per check: the right message at the right offset --------------------------------


def _first(blob: bytes, kind: str, owner: str) -> HeaderField:
    return next(f for f in header_fields(blob) if f.kind == kind and f.owner == owner)


Corruption = Callable[[bytes], tuple[bytes, int]]


def _set(kind: str, owner: str, value: int) -> Corruption:
    def corrupt(blob: bytes) -> tuple[bytes, int]:
        f = _first(blob, kind, owner)
        return put_uint(blob, f, value), f.offset

    return corrupt


def _bad_utf8(owner: str) -> Corruption:
    def corrupt(blob: bytes) -> tuple[bytes, int]:
        f = next(f for f in header_fields(blob) if f.kind == "str" and blob[f.offset : f.offset + f.size] == owner.encode())
        return blob[: f.offset] + b"\xff" + blob[f.offset + 1 :], f.offset - 8

    return corrupt


def _alias_offset(name: str, other: str) -> Corruption:
    """Give tensor name the data offset of tensor other."""

    def corrupt(blob: bytes) -> tuple[bytes, int]:
        src = field_of(blob, "tensor_offset", other)
        f = field_of(blob, "tensor_offset", name)
        return put_uint(blob, f, int.from_bytes(blob[src.offset : src.offset + 8], "little")), f.offset

    return corrupt


CORRUPTIONS: dict[str, tuple[Corruption, str]] = {
    "bad magic": (lambda b: (b"GGUG" + b[4:], 0), "not a GGUF file"),
    "huge tensor count": (_set("tensor_count", "", 1 << 40), "tensor count .* more than"),
    "huge kv count": (_set("kv_count", "", (1 << 64) - 1), "metadata count .* more than"),
    "huge key length": (_set("strlen", "key", 1 << 62), "metadata key length .* exceeds"),
    "huge string value length": (_set("strlen", "tokenizer.ggml.tokens", 1 << 62), "string 0 of array .* exceeds"),
    "huge array length": (_set("array_len", "tokenizer.ggml.scores", 1 << 61), "claims .* elements"),
    "unknown value type": (_set("vtype", "llama.block_count", 13), "unknown value type 13"),
    "unknown array element type": (_set("elem_type", "tokenizer.ggml.scores", 99), "unknown value type 99"),
    "bool not 0 or 1": (_set("value", "tokenizer.ggml.add_bos_token", 2), "bool value .* is 2"),
    "zero n_dims": (_set("ndims", "output_norm.weight", 0), "n_dims 0, expected 1..4"),
    "five n_dims": (_set("ndims", "output_norm.weight", 5), "n_dims 5, expected 1..4"),
    "zero dim": (_set("dim", "output_norm.weight", 0), "dimension 0 is 0"),
    "dim beyond int64": (_set("dim", "output_norm.weight", 1 << 63), "dimension 0 is"),
    "unknown ggml type": (_set("ggml_type", "output_norm.weight", 99), "'output_norm.weight' has unknown ggml type 99"),
    "row not whole blocks": (_set("ggml_type", "token_embd.weight", 12), "row length 32 is not a multiple of the Q4_K"),
    "misaligned offset": (_set("tensor_offset", "blk.0.ffn_up.weight", 132), "not a multiple of alignment 32"),
    "offset past the end": (_set("tensor_offset", "blk.0.ffn_up.weight", 1 << 40), "lies outside the"),
    "overlapping tensors": (_alias_offset("blk.0.ffn_up.weight", "output_norm.weight"), "overlaps tensor"),
    "invalid utf-8 key": (_bad_utf8("llama.block_count"), "metadata key is not valid UTF-8"),
    "invalid utf-8 tensor name": (_bad_utf8("output_norm.weight"), "tensor name is not valid UTF-8"),
}


@pytest.mark.parametrize("case", list(CORRUPTIONS))
def test_each_corruption_names_the_problem_and_its_offset(case: str, small: bytes, tmp_path: Path) -> None:
    corrupt, message = CORRUPTIONS[case]
    blob, offset = corrupt(small)
    path = tmp_path / "bad.gguf"
    path.write_bytes(blob)
    with pytest.raises(GGUFError, match=message) as exc:
        GGUFFile(path)
    assert exc.value.offset == offset
    assert str(path) in str(exc.value)


def test_dims_whose_product_overflows_int64_are_refused(tmp_path: Path) -> None:
    w = GGUFWriter(tmp_path / "o.gguf")
    w.add_tensor("big", bytes(4 * 4), (4, 1, 1, 1), 0)
    blob = w.write().read_bytes()
    for f in [h for h in header_fields(blob) if h.kind == "dim"][1:]:
        blob = put_uint(blob, f, 1 << 21)
    (tmp_path / "o.gguf").write_bytes(blob)
    with pytest.raises(GGUFError, match="overflows int64"):
        GGUFFile(tmp_path / "o.gguf")


def test_duplicate_keys_and_tensor_names_are_refused(tmp_path: Path) -> None:
    w = GGUFWriter(tmp_path / "d.gguf")
    w.add("dup.k1", 1)
    w.add("dup.k2", 2)
    w.add_tensor("t.a1", np.zeros(8, np.float32))
    w.add_tensor("t.a2", np.zeros(8, np.float32))
    blob = w.write().read_bytes()
    key2 = blob.index(b"dup.k2")
    (tmp_path / "k.gguf").write_bytes(blob[:key2] + b"dup.k1" + blob[key2 + 6 :])
    with pytest.raises(GGUFError, match="duplicate metadata key 'dup.k1'") as exc:
        GGUFFile(tmp_path / "k.gguf")
    assert exc.value.offset == key2 - 8
    t2 = blob.index(b"t.a2")
    (tmp_path / "t.gguf").write_bytes(blob[:t2] + b"t.a1" + blob[t2 + 4 :])
    with pytest.raises(GGUFError, match="duplicate tensor name 't.a1'") as exc:
        GGUFFile(tmp_path / "t.gguf")
    assert exc.value.offset == t2 - 8


@pytest.mark.parametrize(("value", "vtype", "message"), [
    (48, GGUFValueType.UINT32, "48 is not a non-zero power of two"),
    (0, GGUFValueType.UINT32, "0 is not a non-zero power of two"),
    (64, GGUFValueType.INT32, "general.alignment has type INT32, expected UINT32"),
])
def test_bad_alignment_is_refused(tmp_path: Path, value: int, vtype: GGUFValueType, message: str) -> None:
    blob = write_small_model(tmp_path / "a.gguf", alignment=64).read_bytes()
    blob = put_uint(blob, field_of(blob, "value", "general.alignment"), value)
    blob = put_uint(blob, field_of(blob, "vtype", "general.alignment"), vtype)
    (tmp_path / "a.gguf").write_bytes(blob)
    with pytest.raises(GGUFError, match=message) as exc:
        GGUFFile(tmp_path / "a.gguf")
    assert exc.value.offset == field_of(blob, "value", "general.alignment").offset


def test_arrays_nested_too_deep_are_refused(tmp_path: Path) -> None:
    value: list[object] = [1]
    for _ in range(10):
        value = [value]
    w = GGUFWriter(tmp_path / "n.gguf")
    w.add("deep", value)
    with pytest.raises(GGUFError, match="nests deeper than 8"):
        GGUFFile(w.write())

"""Reads Hugging Face safetensors files with numpy: an 8-byte little-endian header length, a JSON header
{name: {dtype, shape, data_offsets}}, then the raw little-endian tensor bytes.

The file is mmapped and every header field is checked against the file before a view is handed out: a
hostile or truncated file is refused with an error naming the file and the tensor, never read beyond.
"""

from __future__ import annotations

import json
import math
import mmap
import os
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import numpy as np
import numpy.typing as npt

MAX_HEADER = 100 << 20  # the safetensors library's own limit on the JSON header

# safetensors dtype -> numpy dtype (little-endian); BF16 is kept as its raw 16-bit words
DTYPES: dict[str, np.dtype[Any]] = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"), "U32": np.dtype("<u4"), "U16": np.dtype("<u2"), "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
}


class SafetensorsError(ValueError):
    """A safetensors file that is not one (bad header, offsets outside the file, sizes that disagree)."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # the safetensors name: F32, F16, BF16, ...
    shape: tuple[int, ...]  # numpy order (the row length last)
    start: int  # absolute offsets of the bytes in the file
    end: int


class SafetensorsFile:
    """One mmapped safetensors file: its tensors by name, in the header's order, and their views."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        with open(self.path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 8:
                raise SafetensorsError(f"{self.path}: {size} bytes is too short for a safetensors file")
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self.metadata, self.tensors = self._parse(size)
        except BaseException:
            self._map.close()
            raise

    def _fail(self, what: str) -> SafetensorsError:
        return SafetensorsError(f"{self.path}: {what}")

    def _parse(self, size: int) -> tuple[dict[str, str], dict[str, TensorInfo]]:
        n = int.from_bytes(self._map[:8], "little")
        if n > MAX_HEADER or 8 + n > size:
            raise self._fail(f"header of {n} bytes does not fit in the file ({size} bytes)"
                             if n <= MAX_HEADER else f"header of {n} bytes is over the {MAX_HEADER} limit")
        try:
            header = json.loads(bytes(self._map[8 : 8 + n]).decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise self._fail(f"header is not JSON ({exc})") from None
        if not isinstance(header, dict):
            raise self._fail("header is not a JSON object")
        base, data_len = 8 + n, size - 8 - n
        meta = header.pop("__metadata__", {}) or {}
        if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
            raise self._fail("__metadata__ is not a map of strings")
        tensors: dict[str, TensorInfo] = {}
        for name, entry in header.items():
            tensors[name] = self._check(name, entry, base, data_len)
        return meta, tensors

    def _check(self, name: str, entry: Any, base: int, data_len: int) -> TensorInfo:
        if not isinstance(entry, dict):
            raise self._fail(f"tensor {name!r}: entry is not an object")
        dtype, shape, offs = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in DTYPES:
            raise self._fail(f"tensor {name!r}: unknown dtype {dtype!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0
                                                   for d in shape):
            raise self._fail(f"tensor {name!r}: shape {shape!r} is not a list of non-negative integers")
        if (not isinstance(offs, list) or len(offs) != 2
                or not all(isinstance(o, int) and not isinstance(o, bool) for o in offs)):
            raise self._fail(f"tensor {name!r}: data_offsets {offs!r} is not [begin, end]")
        begin, end = offs
        if not 0 <= begin <= end <= data_len:
            raise self._fail(f"tensor {name!r}: data_offsets [{begin}, {end}] are outside the "
                             f"{data_len} data bytes (a truncated file?)")
        need = math.prod(shape) * DTYPES[dtype].itemsize
        if end - begin != need:
            raise self._fail(f"tensor {name!r}: {dtype} {shape} needs {need} bytes, data_offsets give {end - begin}")
        return TensorInfo(name, dtype, tuple(shape), base + begin, base + end)

    def array(self, name: str) -> npt.NDArray[Any]:
        """The tensor as a read-only numpy view of the mapping (no copy)."""
        t = self.tensors[name]
        return np.frombuffer(self._map, dtype=DTYPES[t.dtype], count=math.prod(t.shape),
                             offset=t.start).reshape(t.shape)

    def close(self) -> None:
        try:
            self._map.close()
        except BufferError:
            pass  # a view is still alive; the mapping goes when it does

    def __enter__(self) -> Self:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


def bf16_to_f32(words: npt.NDArray[np.uint16]) -> npt.NDArray[np.float32]:
    """bfloat16 is the upper half of a float32: widening is exact."""
    return (words.astype(np.uint32) << 16).view(np.float32)

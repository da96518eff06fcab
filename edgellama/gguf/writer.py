"""Writes GGUF version 3 files (little-endian): metadata key/values and raw tensor block bytes.

Used for test fixtures, quantize, split/merge and adapters. It checks what it is given (types, sizes,
alignment) but never converts or quantizes data: tensors are written as the bytes handed in, or as
the bytes a producer returns when write() reaches that tensor (so a tool streams tensor by tensor).
"""

from __future__ import annotations

import os
import struct
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple, Union

import numpy as np
import numpy.typing as npt

from edgellama.gguf.ggml_types import TYPE_SIZES, GGMLType, row_bytes, type_name
from edgellama.gguf.reader import DEFAULT_ALIGNMENT, GGML_MAX_DIMS, GGUF_MAGIC, SCALAR_STRUCTS, GGUFValueType

GGUF_VERSION = 3

_INT_RANGES: list[tuple[GGUFValueType, int, int]] = [
    # Inference order for Python ints: int32 like gguf-py, widened only when the value needs it.
    (GGUFValueType.INT32, -(1 << 31), (1 << 31) - 1),
    (GGUFValueType.UINT32, 0, (1 << 32) - 1),
    (GGUFValueType.INT64, -(1 << 63), (1 << 63) - 1),
    (GGUFValueType.UINT64, 0, (1 << 64) - 1),
]
_NUMPY_TO_VTYPE: dict[np.dtype[Any], GGUFValueType] = {
    np.dtype(np.uint8): GGUFValueType.UINT8,
    np.dtype(np.int8): GGUFValueType.INT8,
    np.dtype(np.uint16): GGUFValueType.UINT16,
    np.dtype(np.int16): GGUFValueType.INT16,
    np.dtype(np.uint32): GGUFValueType.UINT32,
    np.dtype(np.int32): GGUFValueType.INT32,
    np.dtype(np.float32): GGUFValueType.FLOAT32,
    np.dtype(np.bool_): GGUFValueType.BOOL,
    np.dtype(np.uint64): GGUFValueType.UINT64,
    np.dtype(np.int64): GGUFValueType.INT64,
    np.dtype(np.float64): GGUFValueType.FLOAT64,
}
_NUMPY_TO_GGML: dict[np.dtype[Any], int] = {
    np.dtype(np.float32): GGMLType.F32,
    np.dtype(np.float16): GGMLType.F16,
    np.dtype(np.float64): GGMLType.F64,
    np.dtype(np.int8): GGMLType.I8,
    np.dtype(np.int16): GGMLType.I16,
    np.dtype(np.int32): GGMLType.I32,
    np.dtype(np.int64): GGMLType.I64,
}

TensorData = Union[bytes, bytearray, memoryview, "npt.NDArray[Any]"]


class _Tensor(NamedTuple):
    name: str
    shape: tuple[int, ...]
    ggml_type: int
    n_bytes: int
    data: npt.NDArray[np.uint8] | None  # None: produce() gives the bytes at write time
    produce: Callable[[], Any] | None = None


def _int_type(lo: int, hi: int) -> GGUFValueType:
    for vtype, tmin, tmax in _INT_RANGES:
        if tmin <= lo and hi <= tmax:
            return vtype
    raise ValueError(f"integer range [{lo}, {hi}] fits no GGUF integer type")


def infer_type(value: Any) -> GGUFValueType:
    """The GGUF value type a Python value is written as when no type is given."""
    if isinstance(value, (bool, np.bool_)):
        return GGUFValueType.BOOL
    if isinstance(value, (int, np.integer)):
        return _int_type(int(value), int(value))
    if isinstance(value, (float, np.floating)):
        return GGUFValueType.FLOAT32
    if isinstance(value, (str, bytes, bytearray)):
        return GGUFValueType.STRING
    if isinstance(value, (list, tuple, np.ndarray)):
        return GGUFValueType.ARRAY
    raise ValueError(f"cannot store a {type(value).__name__} in GGUF metadata")


def infer_element_type(items: Sequence[Any] | npt.NDArray[Any]) -> GGUFValueType:
    """One element type for a whole array (ints widened to the type covering all of them)."""
    if isinstance(items, np.ndarray):
        vt = _NUMPY_TO_VTYPE.get(items.dtype.newbyteorder("="))
        if vt is None:
            raise ValueError(f"no GGUF array type for numpy dtype {items.dtype}")
        return vt
    if len(items) == 0:
        return GGUFValueType.INT32  # any type will do for no elements; this is what llama.cpp writes
    kinds = {infer_type(v) for v in items}
    ints = {GGUFValueType.INT32, GGUFValueType.UINT32, GGUFValueType.INT64, GGUFValueType.UINT64}
    if kinds <= ints:
        return _int_type(min(int(v) for v in items), max(int(v) for v in items))
    if len(kinds) != 1:
        raise ValueError(f"GGUF array elements must share one type, got {sorted(k.name for k in kinds)}")
    return kinds.pop()


def _pack_scalar(vtype: GGUFValueType, value: Any) -> bytes:
    if vtype == GGUFValueType.BOOL:
        if not isinstance(value, (bool, np.bool_, int, np.integer)) or int(value) not in (0, 1):
            raise ValueError(f"bool value must be True/False, got {value!r}")
        return bytes([int(value)])
    st = SCALAR_STRUCTS[vtype]
    if vtype in (GGUFValueType.FLOAT32, GGUFValueType.FLOAT64):
        if not isinstance(value, (int, float, np.integer, np.floating)) or isinstance(value, bool):
            raise ValueError(f"{vtype.name} value must be a number, got {value!r}")
        return st.pack(float(value))
    if not isinstance(value, (int, np.integer)) or isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{vtype.name} value must be an int, got {value!r}")
    try:
        return st.pack(int(value))
    except struct.error:
        raise ValueError(f"{value} does not fit in {vtype.name}") from None


def _pack_string(value: Any) -> bytes:
    if isinstance(value, str):
        b = value.encode("utf-8")
    elif isinstance(value, (bytes, bytearray)):
        b = bytes(value)  # exact bytes: lets tests write strings that are not valid UTF-8
    else:
        raise TypeError(f"string value must be str or bytes, got {type(value).__name__}")
    return struct.pack("<Q", len(b)) + b


def pack_value(value: Any, vtype: GGUFValueType, elem_type: GGUFValueType | None = None) -> bytes:
    """The encoded bytes of one value (without its type tag) as GGUF stores it."""
    if vtype == GGUFValueType.STRING:
        return _pack_string(value)
    if vtype != GGUFValueType.ARRAY:
        return _pack_scalar(vtype, value)
    if not isinstance(value, (list, tuple, np.ndarray)):
        raise TypeError(f"array value must be a list, tuple or numpy array, got {type(value).__name__}")
    et = elem_type if elem_type is not None else infer_element_type(value)
    head = struct.pack("<IQ", et, len(value))
    if et in (GGUFValueType.STRING, GGUFValueType.ARRAY):
        return head + b"".join(pack_value(v, et) for v in value)
    dtype = np.dtype(SCALAR_STRUCTS[et].format).newbyteorder("<")
    if et == GGUFValueType.BOOL:
        return head + b"".join(_pack_scalar(et, v) for v in value)
    if isinstance(value, np.ndarray) and value.dtype.newbyteorder("=") == dtype.newbyteorder("="):
        return head + np.ascontiguousarray(value, dtype=dtype).tobytes()
    return head + b"".join(_pack_scalar(et, v) for v in value)


def _as_bytes(data: TensorData) -> npt.NDArray[np.uint8]:
    if isinstance(data, np.ndarray):
        a = np.ascontiguousarray(data)
        if a.dtype.byteorder == ">":
            raise ValueError("big-endian arrays cannot be written to GGUF; convert them first")
        return a.reshape(-1).view(np.uint8)
    return np.frombuffer(bytes(data), dtype=np.uint8)


class GGUFWriter:
    """Collects metadata and tensors, then write() lays out and writes the whole file at once.

    The file is written to a temporary name beside ``path`` and renamed, so a failed write never
    leaves a truncated file under the real name.
    """

    def __init__(self, path: str | os.PathLike[str], arch: str | None = None, alignment: int = DEFAULT_ALIGNMENT):
        if alignment <= 0 or alignment & (alignment - 1):
            raise ValueError(f"alignment {alignment} is not a positive power of two")
        self.path = Path(path)
        self.alignment = alignment
        self._kv: dict[str, bytes] = {}
        self._tensors: dict[str, _Tensor] = {}
        if arch is not None:
            self.add("general.architecture", arch)
        if alignment != DEFAULT_ALIGNMENT:
            self.add("general.alignment", alignment, GGUFValueType.UINT32)

    def add(
        self, key: str, value: Any, vtype: GGUFValueType | None = None, elem_type: GGUFValueType | None = None
    ) -> None:
        """Add one key. vtype forces the value type; elem_type forces an array's element type."""
        if not isinstance(key, str):
            raise TypeError(f"metadata key must be str, got {type(key).__name__}")
        if key in self._kv:
            raise ValueError(f"duplicate metadata key {key!r}")
        vt = GGUFValueType(vtype) if vtype is not None else infer_type(value)
        if key == "general.alignment":
            if vt != GGUFValueType.UINT32 or not isinstance(value, int) or value <= 0 or value & (value - 1):
                raise ValueError(f"general.alignment must be a UINT32 power of two, got {value!r} as {vt.name}")
            self.alignment = value
        self._kv[key] = struct.pack("<Q", len(key.encode("utf-8"))) + key.encode("utf-8") + struct.pack(
            "<I", vt
        ) + pack_value(value, vt, elem_type)

    def add_kv_bytes(self, key: str, entry: bytes) -> None:
        """Add one key as an already encoded entry (GGUFFile.kv_bytes): metadata copied bit for bit."""
        if key in self._kv:
            raise ValueError(f"duplicate metadata key {key!r}")
        kb = key.encode("utf-8")
        if entry[: 8 + len(kb)] != struct.pack("<Q", len(kb)) + kb:
            raise ValueError(f"encoded entry does not start with key {key!r}")
        if key == "general.alignment":
            if entry[8 + len(kb) : 12 + len(kb)] != struct.pack("<I", GGUFValueType.UINT32):
                raise ValueError("general.alignment must be a UINT32")
            (a,) = struct.unpack_from("<I", entry, 12 + len(kb))
            if a <= 0 or a & (a - 1):
                raise ValueError(f"general.alignment {a} is not a power of two")
            self.alignment = a
        self._kv[key] = bytes(entry)

    def remove(self, key: str) -> None:
        """Drop a key added before (a no-op when absent)."""
        self._kv.pop(key, None)

    def add_tensor(
        self,
        name: str,
        data: TensorData,
        shape: Sequence[int] | None = None,
        ggml_type: int | None = None,
    ) -> None:
        """Add a tensor of raw block bytes. shape is in GGUF order (ne0, the row length, first);
        for a plain numpy array both may be left out (shape = reversed numpy shape, type from dtype)."""
        if name in self._tensors:
            raise ValueError(f"duplicate tensor name {name!r}")
        if ggml_type is None:
            if not isinstance(data, np.ndarray) or data.dtype.newbyteorder("=") not in _NUMPY_TO_GGML:
                raise ValueError(f"tensor {name!r}: give ggml_type for raw bytes or dtype {getattr(data, 'dtype', '')}")
            ggml_type = _NUMPY_TO_GGML[data.dtype.newbyteorder("=")]
        if shape is None:
            if not isinstance(data, np.ndarray):
                raise ValueError(f"tensor {name!r}: give the shape of raw bytes")
            shape = tuple(reversed(data.shape)) or (1,)
        dims = tuple(int(d) for d in shape)
        raw = _as_bytes(data)
        need = self._check_info(name, dims, ggml_type)
        if raw.size != need:
            raise ValueError(
                f"tensor {name!r}: {type_name(ggml_type)} {dims} needs {need} bytes, got {raw.size}"
            )
        self._tensors[name] = _Tensor(name, dims, int(ggml_type), need, raw)

    def add_tensor_producer(
        self, name: str, shape: Sequence[int], ggml_type: int, produce: Callable[[], Any]
    ) -> None:
        """Add a tensor whose bytes produce() returns (whole, or as an iterable of slabs) when write()
        gets to it, one tensor at a time:
        what lets quantize and split hold one tensor in memory, not the model."""
        if name in self._tensors:
            raise ValueError(f"duplicate tensor name {name!r}")
        dims = tuple(int(d) for d in shape)
        need = self._check_info(name, dims, ggml_type)
        self._tensors[name] = _Tensor(name, dims, int(ggml_type), need, None, produce)

    @staticmethod
    def _check_info(name: str, dims: tuple[int, ...], ggml_type: int) -> int:
        if not 1 <= len(dims) <= GGML_MAX_DIMS or any(d <= 0 for d in dims):
            raise ValueError(f"tensor {name!r}: shape {dims} must have 1..{GGML_MAX_DIMS} positive dims")
        if ggml_type not in TYPE_SIZES:
            raise ValueError(f"tensor {name!r}: unknown ggml type {ggml_type}")
        return row_bytes(ggml_type, dims[0]) * int(np.prod(dims[1:], dtype=object))

    def _pad(self, n: int) -> int:
        return (-n) % self.alignment

    def header_bytes(self) -> tuple[bytes, list[int]]:
        """Everything before the data section (padded), and each tensor's offset inside the data section."""
        parts = [GGUF_MAGIC, struct.pack("<IQQ", GGUF_VERSION, len(self._tensors), len(self._kv))]
        parts += self._kv.values()
        offsets = []
        rel = 0
        for t in self._tensors.values():
            nb = t.name.encode("utf-8")
            parts.append(struct.pack("<Q", len(nb)) + nb)
            parts.append(struct.pack(f"<I{len(t.shape)}QIQ", len(t.shape), *t.shape, t.ggml_type, rel))
            offsets.append(rel)
            rel += t.n_bytes + self._pad(t.n_bytes)
        head = b"".join(parts)
        return head + bytes(self._pad(len(head))), offsets

    def write(self) -> Path:
        head, _ = self.header_bytes()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.")
        try:
            with os.fdopen(fd, "wb") as f:
                self.write_to(f, head)
            os.chmod(tmp, 0o644)  # mkstemp makes 0600; a model file is meant to be shared
            os.replace(tmp, self.path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return self.path

    def write_to(self, f: Any, head: bytes | None = None) -> None:
        """The whole file into f (anything with write(): a file, a hash), tensor by tensor."""
        f.write(self.header_bytes()[0] if head is None else head)
        for t in self._tensors.values():
            self._write_tensor(f, t)

    def _write_tensor(self, f: Any, t: _Tensor) -> None:
        if t.data is not None:
            f.write(t.data.data)
        else:
            assert t.produce is not None
            made = t.produce()
            chunks = [made] if isinstance(made, (bytes, bytearray, memoryview, np.ndarray)) else made
            n = 0
            for chunk in chunks:  # a producer may hand the bytes over in slabs, each written at once
                data = _as_bytes(chunk)
                n += data.size
                if n > t.n_bytes:
                    break
                f.write(data.data)
            if n != t.n_bytes:
                raise ValueError(f"tensor {t.name!r}: producer gave {n}+ bytes, {t.n_bytes} expected")
        f.write(bytes(self._pad(t.n_bytes)))

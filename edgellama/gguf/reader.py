"""Reads GGUF files (versions 2 and 3, little-endian): metadata, tensor infos, zero-copy tensor bytes.

Every header field is checked against the file size before it is trusted; tensor data is never read at
open time and nothing here computes on it (dequantizing and model wiring live elsewhere).

Errors: every problem with the file, including a missing path, a directory or an empty file, raises
``GGUFError`` (a ``ValueError``) whose message names the file, what is wrong and the byte offset.
"""

from __future__ import annotations

import itertools
import mmap
import os
import stat
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import IntEnum
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Union

import numpy as np
import numpy.typing as npt

from edgellama.gguf.ggml_types import TYPE_SIZES, type_name
from edgellama.gguf.mapguard import guard_mapping

if TYPE_CHECKING:
    from typing import Self

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
GGML_MAX_DIMS = 4
HEADER_SIZE = 24  # magic, u32 version, u64 tensor count, u64 kv count
# Nested arrays are legal but no real file nests deeper than 2; the bound keeps a hostile file
# from driving the parser's recursion into a RecursionError.
MAX_ARRAY_DEPTH = 8
INT64_MAX = (1 << 63) - 1


class GGUFError(ValueError):
    """A file that is not a valid GGUF file we can read. ``offset`` is where the problem is (or None)."""

    def __init__(self, message: str, offset: int | None = None) -> None:
        super().__init__(message if offset is None else f"{message} (at byte offset {offset})")
        self.offset = offset


class GGUFValueType(IntEnum):
    UINT8 = 0
    INT8 = 1
    UINT16 = 2
    INT16 = 3
    UINT32 = 4
    INT32 = 5
    FLOAT32 = 6
    BOOL = 7
    STRING = 8
    ARRAY = 9
    UINT64 = 10
    INT64 = 11
    FLOAT64 = 12


# Fixed-size value types: struct format (scalars) and numpy dtype (arrays), both little-endian.
SCALAR_STRUCTS: dict[GGUFValueType, struct.Struct] = {
    GGUFValueType.UINT8: struct.Struct("<B"),
    GGUFValueType.INT8: struct.Struct("<b"),
    GGUFValueType.UINT16: struct.Struct("<H"),
    GGUFValueType.INT16: struct.Struct("<h"),
    GGUFValueType.UINT32: struct.Struct("<I"),
    GGUFValueType.INT32: struct.Struct("<i"),
    GGUFValueType.FLOAT32: struct.Struct("<f"),
    GGUFValueType.BOOL: struct.Struct("<B"),
    GGUFValueType.UINT64: struct.Struct("<Q"),
    GGUFValueType.INT64: struct.Struct("<q"),
    GGUFValueType.FLOAT64: struct.Struct("<d"),
}
NUMPY_DTYPES: dict[GGUFValueType, np.dtype[Any]] = {
    GGUFValueType.UINT8: np.dtype("<u1"),
    GGUFValueType.INT8: np.dtype("<i1"),
    GGUFValueType.UINT16: np.dtype("<u2"),
    GGUFValueType.INT16: np.dtype("<i2"),
    GGUFValueType.UINT32: np.dtype("<u4"),
    GGUFValueType.INT32: np.dtype("<i4"),
    GGUFValueType.FLOAT32: np.dtype("<f4"),
    GGUFValueType.BOOL: np.dtype(np.bool_),
    GGUFValueType.UINT64: np.dtype("<u8"),
    GGUFValueType.INT64: np.dtype("<i8"),
    GGUFValueType.FLOAT64: np.dtype("<f8"),
}

# A metadata value: Python scalar, str, read-only numpy array (numeric arrays), list (string/nested arrays).
MetadataValue = Union[int, float, bool, str, "npt.NDArray[Any]", list[Any]]
# (type,) for scalars; (ARRAY, element type, ...) for arrays, following the first element of nested arrays.
ValueTypes = tuple[GGUFValueType, ...]

_U32 = struct.Struct("<I")
_U64 = struct.Struct("<Q")
_EMPTY = np.zeros(0, dtype=np.uint8)
_EMPTY.flags.writeable = False


def _min_value_size(vtype: GGUFValueType) -> int:
    """Fewest bytes a value of vtype can occupy: bounds counts before anything is allocated."""
    if vtype == GGUFValueType.STRING:
        return 8
    if vtype == GGUFValueType.ARRAY:
        return 12  # u32 element type + u64 count
    return SCALAR_STRUCTS[vtype].size


@dataclass(eq=False)
class GGUFTensor:
    """One tensor info. ``shape`` is in GGUF order (ne0 = row length first); ``offset`` is absolute."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    offset: int
    n_elements: int
    n_bytes: int
    _buf: Any = field(repr=False, default=None)
    _data: npt.NDArray[np.uint8] | None = field(repr=False, default=None)

    @property
    def type_name(self) -> str:
        return type_name(self.ggml_type)

    @property
    def data(self) -> npt.NDArray[np.uint8]:
        """Read-only uint8 view of exactly n_bytes raw block bytes in the mapping (made on first use)."""
        if self._data is None:
            if self._buf is None:
                raise ValueError(f"tensor {self.name!r}: the GGUF file is closed")
            if self.n_bytes == 0:
                self._data = _EMPTY
            else:
                self._data = np.frombuffer(self._buf, dtype=np.uint8, count=self.n_bytes, offset=self.offset)
        return self._data


class _Parser:
    """Walks the header of a mapped file; every read is bounds-checked against the file size."""

    def __init__(self, buf: Any, size: int, path: str) -> None:
        self.buf = buf
        self.size = size
        self.path = path
        self.pos = 0

    def fail(self, message: str, offset: int | None = None) -> GGUFError:
        return GGUFError(f"{self.path}: {message}", self.pos if offset is None else offset)

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise self.fail(f"file ends inside {what}: {n} bytes needed, {self.size - self.pos} left")

    def u32(self, what: str) -> int:
        self.need(4, what)
        (v,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return int(v)

    def u64(self, what: str) -> int:
        self.need(8, what)
        (v,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return int(v)

    def raw_string(self, what: str) -> bytes:
        start = self.pos
        n = self.u64(f"{what} length")
        if n > self.size - self.pos:
            raise self.fail(f"{what} length {n} exceeds the {self.size - self.pos} bytes left in the file", start)
        b = self.buf[self.pos : self.pos + n]
        self.pos += n
        return bytes(b)

    def name(self, what: str) -> str:
        start = self.pos
        b = self.raw_string(what)
        try:
            return b.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise self.fail(f"{what} is not valid UTF-8 ({exc.reason} at byte {exc.start})", start) from None

    def value_type(self, what: str) -> GGUFValueType:
        start = self.pos
        t = self.u32(what)
        try:
            return GGUFValueType(t)
        except ValueError:
            raise self.fail(f"{what}: unknown value type {t}", start) from None

    def value(self, vtype: GGUFValueType, key: str, raw: bool, depth: int = 0) -> tuple[Any, ValueTypes]:
        """One value of vtype at pos -> (Python value, types). raw=True keeps strings as bytes."""
        start = self.pos
        if vtype == GGUFValueType.STRING:
            b = self.raw_string(f"string value of {key!r}")
            return (b if raw else b.decode("utf-8", "replace")), (vtype,)
        if vtype == GGUFValueType.ARRAY:
            return self.array(key, raw, depth)
        st = SCALAR_STRUCTS[vtype]
        self.need(st.size, f"value of {key!r}")
        (v,) = st.unpack_from(self.buf, self.pos)
        if vtype == GGUFValueType.BOOL:
            if v > 1:
                raise self.fail(f"bool value of {key!r} is {v}, not 0 or 1", start)
            v = bool(v)
        self.pos += st.size
        return v, (vtype,)

    def array(self, key: str, raw: bool, depth: int) -> tuple[Any, ValueTypes]:
        start = self.pos
        if depth >= MAX_ARRAY_DEPTH:
            raise self.fail(f"array value of {key!r} nests deeper than {MAX_ARRAY_DEPTH} levels", start)
        etype = self.value_type(f"element type of array {key!r}")
        count_pos = self.pos
        n = self.u64(f"length of array {key!r}")
        left = self.size - self.pos
        if n > left // _min_value_size(etype):
            raise self.fail(
                f"array {key!r} claims {n} {etype.name} elements, more than the {left} bytes left can hold",
                count_pos,
            )
        if etype == GGUFValueType.STRING:
            return self.string_array(n, key, raw), (GGUFValueType.ARRAY, etype)
        if etype == GGUFValueType.ARRAY:
            items: list[Any] = []
            inner: ValueTypes = ()
            for _ in range(n):
                v, t = self.array(key, raw, depth + 1)
                items.append(v)
                if not inner:
                    inner = t
            return items, (GGUFValueType.ARRAY, *(inner or (GGUFValueType.ARRAY,)))
        dt = NUMPY_DTYPES[etype]
        nbytes = n * dt.itemsize  # bounded above by `left`, checked above
        a: npt.NDArray[Any] = np.frombuffer(self.buf, dtype=dt, count=n, offset=self.pos) if n else np.zeros(0, dt)
        if etype == GGUFValueType.BOOL and n and int(a.view(np.uint8).max()) > 1:
            bad = int(np.argmax(a.view(np.uint8) > 1))
            raise self.fail(f"bool array {key!r} holds a value other than 0 or 1", self.pos + bad)
        a.flags.writeable = False
        self.pos += nbytes
        return a, (GGUFValueType.ARRAY, etype)

    def string_array(self, n: int, key: str, raw: bool) -> list[Any]:
        # The hot loop of opening a model (262144 vocabulary strings): locals only, no method calls.
        buf, end, pos = self.buf, self.size, self.pos
        unpack = _U64.unpack_from
        out: list[Any] = []
        append = out.append
        for i in range(n):
            if end - pos < 8:
                self.pos = pos
                raise self.fail(f"file ends inside the length of string {i} of array {key!r}")
            (ln,) = unpack(buf, pos)
            pos += 8
            if ln > end - pos:
                raise self.fail(
                    f"string {i} of array {key!r}: length {ln} exceeds the {end - pos} bytes left", pos - 8
                )
            b = buf[pos : pos + ln]
            append(b if raw else b.decode("utf-8", "replace"))
            pos += ln
        self.pos = pos
        return out


class GGUFFile:
    """A mapped GGUF file: ``metadata``, ``metadata_types``, ``tensors`` (file order) and views of the data.

    The mapping lives until close() (or the end of a ``with`` block); numpy views taken from it keep it
    alive past close() rather than dangling, so data handed out stays valid. As with any mmap, a file
    truncated by another process while mapped makes later access to the lost pages raise SIGBUS:
    replace model files by rename, never rewrite them in place. The mapping is handed to the installed
    guard (mapguard.py): with the C library built, its SIGBUS handler, which then exits with one line
    naming the file.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.metadata: dict[str, Any] = {}
        self.metadata_types: dict[str, ValueTypes] = {}
        self.tensors: list[GGUFTensor] = []
        self._by_name: dict[str, GGUFTensor] = {}
        self._value_pos: dict[str, int] = {}  # key -> offset of its value, for raw()
        self._kv_span: dict[str, tuple[int, int]] = {}  # key -> [start, end) of its whole entry, for kv_bytes()
        self._mm: mmap.mmap | None = None
        self._unguard: Callable[[], object] | None = None
        self.identity: tuple[int, ...] = ()
        try:
            # A FIFO or device would block open() or have no size: only regular files are mapped.
            if not stat.S_ISREG(os.stat(self.path).st_mode):
                kind = "a directory" if self.path.is_dir() else "not a regular file"
                raise GGUFError(f"{self.path}: cannot open: {kind}")
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                if st.st_size == 0:
                    raise GGUFError(f"{self.path}: empty file, not a GGUF file", 0)
                self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
                # the mapped file as it was when mapped: a later os.stat of the path that differs means the
                # path now names another file (renamed over) or this one was rewritten (digest.identity)
                self.identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
        except GGUFError:
            raise
        except OSError as exc:
            raise GGUFError(f"{self.path}: cannot open: {exc.strerror or exc}") from None
        except ValueError as exc:  # mmap's own complaints (e.g. a file that shrank to 0 meanwhile)
            raise GGUFError(f"{self.path}: cannot map: {exc}", 0) from None
        self.file_size = len(self._mm)
        self._unguard = guard_mapping(self._mm, self.path)
        try:
            self._parse(_Parser(self._mm, self.file_size, str(self.path)))
        except BaseException:
            self.close()
            raise

    # --- parsing -------------------------------------------------------------------------------

    def _parse(self, p: _Parser) -> None:
        if p.size < 4 or p.buf[0:4] != GGUF_MAGIC:
            raise p.fail(f"not a GGUF file (magic {bytes(p.buf[0:4])!r}, expected b'GGUF')", 0)
        p.pos = 4
        version = p.u32("version")
        if version not in SUPPORTED_VERSIONS:
            swapped = int.from_bytes(version.to_bytes(4, "little"), "big")
            if swapped in (1, 2, 3):
                raise p.fail(f"big-endian GGUF (version {swapped}) is unsupported; convert to little-endian", 4)
            if version == 1:
                raise p.fail("GGUF version 1 is unsupported (only versions 2 and 3); reconvert the model", 4)
            raise p.fail(f"unsupported GGUF version {version} (only versions 2 and 3)", 4)
        self.version = version
        n_tensors = p.u64("tensor count")
        n_kv = p.u64("metadata key/value count")
        left = p.size - HEADER_SIZE
        # Smallest possible entries: a KV is an 8-byte key length, a 4-byte type and a 1-byte value;
        # a tensor info is a name length, n_dims, one dim, a type and an offset (32 bytes).
        if n_kv > left // 13:
            raise p.fail(f"metadata count {n_kv} is more than a {p.size}-byte file can hold", 16)
        if n_tensors > left // 32:
            raise p.fail(f"tensor count {n_tensors} is more than a {p.size}-byte file can hold", 8)

        for _ in range(n_kv):
            kv_pos = p.pos
            key = p.name("metadata key")
            if key in self.metadata:
                raise p.fail(f"duplicate metadata key {key!r}", kv_pos)
            vtype = p.value_type(f"value type of {key!r}")
            self._value_pos[key] = p.pos
            value, types = p.value(vtype, key, raw=False)
            self.metadata[key] = value
            self.metadata_types[key] = types
            self._kv_span[key] = (kv_pos, p.pos)

        self.alignment = DEFAULT_ALIGNMENT
        if "general.alignment" in self.metadata:
            at = self._value_pos["general.alignment"]
            if self.metadata_types["general.alignment"] != (GGUFValueType.UINT32,):
                t = self.metadata_types["general.alignment"][0].name
                raise p.fail(f"general.alignment has type {t}, expected UINT32", at)
            a = int(self.metadata["general.alignment"])
            if a == 0 or a & (a - 1):
                raise p.fail(f"general.alignment {a} is not a non-zero power of two", at)
            self.alignment = a

        # (info offset, offset-field offset, name, dims, type, relative data offset) per tensor
        infos: list[tuple[int, int, str, tuple[int, ...], int, int]] = []
        for _ in range(n_tensors):
            info_pos = p.pos
            name = p.name("tensor name")
            n_dims_pos = p.pos
            n_dims = p.u32(f"n_dims of tensor {name!r}")
            if not 1 <= n_dims <= GGML_MAX_DIMS:
                raise p.fail(f"tensor {name!r} has n_dims {n_dims}, expected 1..{GGML_MAX_DIMS}", n_dims_pos)
            dims = []
            for d in range(n_dims):
                dim_pos = p.pos
                ne = p.u64(f"dimension {d} of tensor {name!r}")
                if not 1 <= ne <= INT64_MAX:
                    raise p.fail(f"tensor {name!r} dimension {d} is {ne}, expected 1..2^63-1", dim_pos)
                dims.append(ne)
            type_pos = p.pos
            ggml_type = p.u32(f"type of tensor {name!r}")
            offset_pos = p.pos
            rel = p.u64(f"data offset of tensor {name!r}")
            infos.append((info_pos, offset_pos, name, tuple(dims), ggml_type, rel))
            self._check_tensor_info(p, name, tuple(dims), ggml_type, type_pos, offset_pos, rel)

        header_end = p.pos
        self.data_offset = header_end + (-header_end) % self.alignment
        self._build_tensors(p, infos)

    def _check_tensor_info(
        self, p: _Parser, name: str, dims: tuple[int, ...], ggml_type: int, type_pos: int, offset_pos: int, rel: int
    ) -> None:
        ts = TYPE_SIZES.get(ggml_type)
        if ts is None:
            raise p.fail(f"tensor {name!r} has unknown ggml type {ggml_type}", type_pos)
        if dims[0] % ts.block_size:
            raise p.fail(
                f"tensor {name!r}: row length {dims[0]} is not a multiple of the "
                f"{type_name(ggml_type)} block size {ts.block_size}",
                type_pos,
            )
        if rel % self.alignment:
            raise p.fail(f"tensor {name!r}: data offset {rel} is not a multiple of alignment {self.alignment}", offset_pos)

    def _build_tensors(self, p: _Parser, infos: list[tuple[int, int, str, tuple[int, ...], int, int]]) -> None:
        for info_pos, offset_pos, name, dims, ggml_type, rel in infos:
            if name in self._by_name:
                raise p.fail(f"duplicate tensor name {name!r}", info_pos)
            n_elements = 1
            for ne in dims:
                n_elements *= ne
                # ggml counts elements and bytes in int64: a product beyond that is a corrupt file.
                if n_elements > INT64_MAX:
                    raise p.fail(f"tensor {name!r}: element count {dims} overflows int64", info_pos)
            ts = TYPE_SIZES[ggml_type]
            n_bytes = n_elements // ts.block_size * ts.type_size
            offset = self.data_offset + rel
            if n_bytes > self.file_size or offset > self.file_size - n_bytes:
                raise p.fail(
                    f"tensor {name!r}: data [{offset}, {offset + n_bytes}) lies outside the "
                    f"{self.file_size}-byte file",
                    offset_pos,
                )
            t = GGUFTensor(name, dims, ggml_type, offset, n_elements, n_bytes, self._mm)
            self.tensors.append(t)
            self._by_name[name] = t
        # Sorted by data offset (file order breaks ties), each tensor must end before the next begins.
        ordered = sorted(zip(self.tensors, (i[1] for i in infos)), key=lambda ti: ti[0].offset)
        for (a, _), (b, b_pos) in itertools.pairwise(ordered):
            if b.offset < a.offset + a.n_bytes:
                raise p.fail(
                    f"tensor {b.name!r} data at {b.offset} overlaps tensor {a.name!r} "
                    f"[{a.offset}, {a.offset + a.n_bytes})",
                    b_pos,
                )

    # --- access --------------------------------------------------------------------------------

    @property
    def architecture(self) -> str | None:
        a = self.metadata.get("general.architecture")
        return a if isinstance(a, str) else None

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def tensor(self, name: str) -> GGUFTensor:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {name!r}") from None

    def raw(self, key: str) -> Any:
        """The value of key with strings as their exact bytes (bytes, or a list of bytes for string
        arrays): what a byte-level tokenizer needs when a file holds invalid UTF-8."""
        if self._mm is None:
            raise ValueError(f"{self.path}: the GGUF file is closed")
        p = _Parser(self._mm, self.file_size, str(self.path))
        p.pos = self._value_pos[key]
        return p.value(self.metadata_types[key][0], key, raw=True)[0]

    def kv_bytes(self, key: str) -> bytes:
        """The exact encoded entry of key (key, type tag, value) as the file holds it: lets split and
        merge carry metadata over bit for bit, whatever types the writer chose."""
        if self._mm is None:
            raise ValueError(f"{self.path}: the GGUF file is closed")
        start, end = self._kv_span[key]
        return bytes(self._mm[start:end])

    def close(self) -> None:
        mm, self._mm = self._mm, None
        for t in self.tensors:
            t._buf = None
            t._data = None  # a view we cached would keep the mapping exported and block the unmap
        if mm is not None:
            try:
                mm.close()
            except BufferError:
                return  # numpy views still use the mapping; it is unmapped (and unguarded) when the last one goes
            if self._unguard is not None:
                self._unguard()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"GGUFFile({str(self.path)!r}, v{self.version}, {len(self.metadata)} keys, {len(self.tensors)} tensors)"

"""Split GGUF models (llama.cpp's gguf-split format): open a set in place, split a model, merge a set.

The format: piece i (0-based) of n is ``PREFIX-{i+1:05d}-of-{n:05d}.gguf``, a complete GGUF file of its
own holding some of the tensors. Every piece carries ``split.no`` (u16, i), ``split.count`` (u16, n)
and ``split.tensors.count`` (i32, tensors in the whole set); the first piece also carries all the
model's metadata. A file with ``split.count`` 0 or without it is a single model (llama.cpp's merge
leaves ``split.count`` 0 behind for that reason).

``open_model_file`` opens either kind. A set is validated whole before anything uses it: every piece
present, each with the right ``split.no``, the same ``split.count`` and ``split.tensors.count``, no
tensor name twice, the tensor total matching; each piece is mmapped as it is (tensor data zero-copy,
every tensor inside its own piece, as the single-file reader checks).
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from edgellama.gguf.digest import sha256_file
from edgellama.gguf.reader import DEFAULT_ALIGNMENT, GGUFError, GGUFFile, GGUFTensor, GGUFValueType
from edgellama.gguf.writer import GGUFWriter

if TYPE_CHECKING:
    from typing import Self

KEY_NO = "split.no"
KEY_COUNT = "split.count"
KEY_TENSORS = "split.tensors.count"
SPLIT_KEYS = (KEY_NO, KEY_COUNT, KEY_TENSORS)
MAX_PIECES = 65535  # split.count is a u16
_PIECE_NAME = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def piece_path(prefix: str | os.PathLike[str], i: int, n: int) -> Path:
    """Path of piece i (0-based) of n, as llama.cpp's llama_split_path names it."""
    return Path(f"{os.fspath(prefix)}-{i + 1:05d}-of-{n:05d}.gguf")


def _split_int(f: GGUFFile, key: str, want: GGUFValueType) -> int | None:
    if key not in f.metadata:
        return None
    t = f.metadata_types[key]
    if t != (want,):
        raise GGUFError(f"{f.path}: {key} has type {t[0].name}, expected {want.name}")
    return int(f.metadata[key])


def split_count(f: GGUFFile) -> int:
    """How many pieces f says its set has (0: not a split model)."""
    return _split_int(f, KEY_COUNT, GGUFValueType.UINT16) or 0


class SplitGGUF:
    """A split model opened by its first piece: the reader's interface (metadata from the first piece,
    tensors of all pieces in order, each a zero-copy view into its own piece's mapping)."""

    def __init__(self, first: str | os.PathLike[str]) -> None:
        self.path = Path(first)
        self.pieces: list[GGUFFile] = []
        try:
            self._open_all()
        except BaseException:
            self.close()
            raise
        head = self.pieces[0]
        self.metadata = head.metadata
        self.metadata_types = head.metadata_types
        self.version = head.version
        self.alignment = head.alignment
        self.data_offset = head.data_offset
        self.file_size = sum(p.file_size for p in self.pieces)
        self.tensors: list[GGUFTensor] = [t for p in self.pieces for t in p.tensors]
        self._by_name = {t.name: t for t in self.tensors}

    def _open_all(self) -> None:
        head = GGUFFile(self.path)
        self.pieces.append(head)
        n = split_count(head)
        if n == 0:
            raise GGUFError(f"{self.path}: not a split model (no {KEY_COUNT})")
        no = _split_int(head, KEY_NO, GGUFValueType.UINT16)
        if no != 0:
            raise GGUFError(f"{self.path}: is piece {no if no is None else no + 1} of a split model, "
                            "not the first; open the -00001-of- file")
        total = _split_int(head, KEY_TENSORS, GGUFValueType.INT32)
        if total is None or total < 0:
            raise GGUFError(f"{self.path}: split model without a valid {KEY_TENSORS}")
        m = _PIECE_NAME.match(self.path.name)
        if m is None or int(m["no"]) != 1 or int(m["count"]) != n:
            raise GGUFError(f"{self.path}: the first piece of a {n}-piece split model must be named "
                            f"PREFIX-00001-of-{n:05d}.gguf")
        prefix = self.path.with_name(m["prefix"])
        self.paths = [piece_path(prefix, i, n) for i in range(n)]
        seen: dict[str, Path] = {t.name: self.path for t in head.tensors}
        for i in range(1, n):
            path = self.paths[i]
            if not path.exists():
                raise GGUFError(f"{path}: piece {i + 1} of {n} of split model {self.path.name} is missing")
            p = GGUFFile(path)
            self.pieces.append(p)
            got = (_split_int(p, KEY_NO, GGUFValueType.UINT16), split_count(p),
                   _split_int(p, KEY_TENSORS, GGUFValueType.INT32))
            if got != (i, n, total):
                raise GGUFError(
                    f"{path}: does not belong in this split model as piece {i + 1} of {n}: it says "
                    f"split.no {got[0]}, split.count {got[1]}, split.tensors.count {got[2]}; expected "
                    f"{i}, {n}, {total} (a piece of another set, or renamed?)")
            if not p.tensors:
                raise GGUFError(f"{path}: piece {i + 1} of {n} holds no tensors")
            for t in p.tensors:
                if t.name in seen:
                    raise GGUFError(f"{path}: tensor {t.name!r} is also in {seen[t.name].name} "
                                    "(pieces of different sets mixed?)")
                seen[t.name] = path
        if len(seen) != total:
            raise GGUFError(f"{self.path}: the {n} pieces hold {len(seen)} tensors, the set says {total}")

    # --- the reader's interface ------------------------------------------------------------------

    @property
    def architecture(self) -> str | None:
        return self.pieces[0].architecture

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    def tensor(self, name: str) -> GGUFTensor:
        try:
            return self._by_name[name]
        except KeyError:
            raise KeyError(f"{self.path}: no tensor named {name!r}") from None

    def raw(self, key: str) -> Any:
        return self.pieces[0].raw(key)

    def kv_bytes(self, key: str) -> bytes:
        return self.pieces[0].kv_bytes(key)

    def piece_of(self, name: str) -> int:
        """Index of the piece holding tensor name."""
        for i, p in enumerate(self.pieces):
            if any(t.name == name for t in p.tensors):
                return i
        raise KeyError(name)

    def close(self) -> None:
        for p in self.pieces:
            p.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"SplitGGUF({str(self.path)!r}, {len(self.pieces)} pieces, {len(self.tensors)} tensors)"


ModelFile = GGUFFile | SplitGGUF


def open_model_file(path: str | os.PathLike[str]) -> ModelFile:
    """A single GGUF file, or the whole split set when path is the first piece of one."""
    f = GGUFFile(path)
    try:
        if split_count(f) == 0:
            return f
    except BaseException:
        f.close()
        raise
    f.close()
    return SplitGGUF(path)


def model_paths(f: ModelFile) -> list[Path]:
    """Every file the model is read from, in order."""
    return list(f.paths) if isinstance(f, SplitGGUF) else [f.path]


# --- writing ---------------------------------------------------------------------------------------


def parse_split_size(text: str) -> int:
    """--split-max-size: N with M (10^6) or G (10^9) as llama-gguf-split takes it; K (10^3) and plain
    bytes are accepted too (small test models)."""
    units = {"K": 10**3, "M": 10**6, "G": 10**9}
    s = text.strip().upper()
    mult = units.get(s[-1:], 1)
    digits = s[:-1] if s[-1:] in units else s
    if not digits.isdigit() or int(digits) <= 0:
        raise ValueError(f"--split-max-size {text!r}: want a positive number with M or G (e.g. 2G, 500M)")
    return int(digits) * mult


def _pad(n: int, a: int) -> int:
    return n + (-n) % a


def plan_split(tensors: list[GGUFTensor], max_tensors: int | None, max_size: int | None,
               no_tensor_first_split: bool = False) -> list[list[GGUFTensor]]:
    """Which tensors go in each piece, by llama-gguf-split's rule: a new piece starts at every
    max_tensors-th tensor, or when the piece's padded tensor bytes would pass max_size (a tensor
    larger than max_size gets a piece of its own: tensors are never cut)."""
    if (max_tensors is None) == (max_size is None):
        raise ValueError("give exactly one of --split-max-tensors and --split-max-size")
    if max_tensors is not None and max_tensors <= 0:
        raise ValueError(f"--split-max-tensors {max_tensors}: must be positive")
    pieces: list[list[GGUFTensor]] = [[]]
    if no_tensor_first_split:
        pieces.append([])
    size = 0
    for i, t in enumerate(tensors):
        nb = _pad(t.n_bytes, DEFAULT_ALIGNMENT)
        if max_size is not None:
            cut = size + nb > max_size
        else:
            assert max_tensors is not None
            cut = 0 < i and i % max_tensors == 0
        if cut:
            if not pieces[-1]:
                raise ValueError(f"tensor {t.name!r} ({t.n_bytes} bytes) alone is over --split-max-size "
                                 "before any tensor was placed: the size is too small")
            pieces.append([])
            size = nb
        else:
            size += nb
        pieces[-1].append(t)
    if len(pieces) > MAX_PIECES:
        raise ValueError(f"{len(pieces)} pieces: more than the format's {MAX_PIECES}")
    return pieces


def _copy_metadata(w: GGUFWriter, src: ModelFile) -> None:
    for key in src.metadata:
        if key not in SPLIT_KEYS:
            w.add_kv_bytes(key, src.kv_bytes(key))


def split_model(src_path: str | os.PathLike[str], prefix: str | os.PathLike[str], *,
                max_tensors: int | None = None, max_size: int | None = None,
                no_tensor_first_split: bool = False, dry_run: bool = False) -> list[tuple[Path, int]]:
    """Write src (a file or a split set) as pieces PREFIX-0000i-of-0000n.gguf; returns (path, tensors)
    per piece. Metadata goes in the first piece, copied bit for bit; tensor bytes are copied from the
    mapping one at a time. Keys are laid out as llama-gguf-split does (split.no, split.tensors.count,
    then split.count, after the model's keys)."""
    with open_model_file(src_path) as src:
        pieces = plan_split(src.tensors, max_tensors, max_size, no_tensor_first_split)
        n = len(pieces)
        out: list[tuple[Path, int]] = []
        for i, ts in enumerate(pieces):
            path = piece_path(prefix, i, n)
            out.append((path, len(ts)))
            if dry_run:
                continue
            if path.exists() and path.resolve() in {p.resolve() for p in model_paths(src)}:
                raise ValueError(f"{path}: would overwrite the model being split")
            w = GGUFWriter(path, alignment=src.alignment)
            w.remove("general.alignment")  # carried over with the rest, in its place
            if i == 0:
                _copy_metadata(w, src)
            w.add(KEY_NO, i, GGUFValueType.UINT16)
            w.add(KEY_TENSORS, len(src.tensors), GGUFValueType.INT32)
            w.add(KEY_COUNT, n, GGUFValueType.UINT16)
            if i > 0 and src.alignment != DEFAULT_ALIGNMENT:
                w.add_kv_bytes("general.alignment", src.kv_bytes("general.alignment"))
            for t in ts:
                w.add_tensor(t.name, t.data, t.shape, t.ggml_type)
            w.write()
        return out


def merge_model(first: str | os.PathLike[str], out: str | os.PathLike[str], *, force: bool = False) -> Path:
    """Write the split set opened by its first piece as one file: the first piece's metadata without
    the split.* keys, then every tensor in piece order. A model split by `edgellama split` (or
    llama-gguf-split) from a file laid out the usual way merges back byte for byte."""
    out = Path(out)
    if out.exists() and not force:
        raise FileExistsError(f"{out}: already exists (give --force to replace it)")
    with open_model_file(first) as src:
        if not isinstance(src, SplitGGUF):
            raise ValueError(f"{first}: not a split model (no {KEY_COUNT}); nothing to merge")  # noqa: TRY004
        if out.resolve() in {p.resolve() for p in src.paths}:
            raise ValueError(f"{out}: is a piece of the set being merged")
        return _merged(src, out).write()


def _merged(src: SplitGGUF, out: Path) -> GGUFWriter:
    w = GGUFWriter(out, alignment=src.alignment)
    w.remove("general.alignment")
    _copy_metadata(w, src)
    for t in src.tensors:
        w.add_tensor(t.name, t.data, t.shape, t.ggml_type)
    return w


class _Hasher:
    def __init__(self) -> None:
        self.h = hashlib.sha256()

    def write(self, b: Any) -> None:
        self.h.update(b)


def merged_sha256(src: SplitGGUF) -> str:
    """sha256 of the file `merge` would write, without writing it: for a set split from a usual
    file, the original's sha256 (what a model card publishes)."""
    sink = _Hasher()
    _merged(src, src.path).write_to(sink)
    return sink.h.hexdigest()


def write_manifest(paths: list[Path], manifest: Path, sha256: Callable[[Path], str] = sha256_file) -> Path:
    """sha256sum-format lines (\"HEX  name\") for every piece: `sha256sum -c` reads it, and so does
    `edgellama info` (as the first piece's sidecar FIRST.sha256). sha256 hashes one piece (the CLI
    passes one that shows progress)."""
    lines = [f"{sha256(p)}  {p.name}\n" for p in paths]
    manifest.write_text("".join(lines))
    return manifest


def manifest_path(first: Path) -> Path:
    return first.with_name(first.name + ".sha256")


def iter_pieces(f: ModelFile) -> Iterator[tuple[Path, GGUFFile]]:
    if isinstance(f, SplitGGUF):
        yield from zip(f.paths, f.pieces)
    else:
        yield f.path, f

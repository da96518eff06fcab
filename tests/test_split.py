"""Split models (llama.cpp's gguf-split format): split, merge, loading by the first piece, and the
ways a set can be broken (a piece missing, truncated, from another set, out of order)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest

from edgellama.cli import main
from edgellama.gguf.reader import GGUFError, GGUFFile, GGUFValueType
from edgellama.gguf.split import (
    SplitGGUF,
    merge_model,
    merged_sha256,
    open_model_file,
    parse_split_size,
    piece_path,
    plan_split,
    split_model,
)
from edgellama.gguf.writer import GGUFWriter

PROMPT = [1, 504, 3458, 282, 4649, 314, 253, 1345, 28]  # a few SmolLM2 ids ("The capital of France is ...")


def _tiny(path: Path, n: int = 6, rows: int = 4) -> Path:
    w = GGUFWriter(path, arch="llama")
    w.add("general.name", "tiny")
    for i in range(n):
        w.add_tensor(f"t{i}", np.full((rows, 32), i, np.float32))
    return w.write()


@pytest.fixture(scope="module")
def sets(smollm2_path: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Path]:
    """SmolLM2 (272 tensors) split into 3 and into 7 pieces: the first piece of each."""
    d = tmp_path_factory.mktemp("split")
    out = {}
    for n, per in ((3, 91), (7, 39)):
        pieces = split_model(smollm2_path, d / f"s{n}", max_tensors=per)
        assert len(pieces) == n
        out[n] = pieces[0][0]
    return out


def _copy_set(first: Path, dst: Path) -> Path:
    """A copy of a whole set in dst (so a test can break it), its first piece returned."""
    n = int(first.name[-10:-5])
    prefix = first.name[: -len("-00001-of-00000.gguf")]
    for i in range(n):
        shutil.copy(first.with_name(piece_path(prefix, i, n).name), dst)
    return dst / first.name


@pytest.mark.parametrize("n", [3, 7])
def test_split_set_merges_back_byte_for_byte(sets: dict[int, Path], smollm2_path: Path, tmp_path: Path, n: int) -> None:
    out = merge_model(sets[n], tmp_path / "merged.gguf")
    assert out.read_bytes() == smollm2_path.read_bytes()
    with SplitGGUF(sets[n]) as s:
        assert merged_sha256(s) == hashlib.sha256(smollm2_path.read_bytes()).hexdigest()


def test_every_piece_reads_with_the_gguf_package(sets: dict[int, Path], smollm2_path: Path) -> None:
    n = 3  # gguf's reader takes ~20 s over the vocabulary of the first piece: one set
    with GGUFFile(smollm2_path) as orig, SplitGGUF(sets[n]) as s:
        seen = 0
        for i, path in enumerate(s.paths):
            r = gguf.GGUFReader(path)
            assert int(r.fields["split.no"].parts[-1][0]) == i
            assert int(r.fields["split.count"].parts[-1][0]) == n
            assert int(r.fields["split.tensors.count"].parts[-1][0]) == len(orig.tensors)
            for t in r.tensors:
                assert bytes(t.data.reshape(-1).view(np.uint8)) == bytes(orig.tensor(t.name).data)
            seen += len(r.tensors)
        assert seen == len(orig.tensors)
        assert [t.name for t in s.tensors] == [t.name for t in orig.tensors]
        assert {k: v for k, v in s.metadata.items() if not k.startswith("split.")}.keys() == orig.metadata.keys()


def test_split_model_loads_by_its_first_piece_with_the_same_logits(sets: dict[int, Path], smollm2_path: Path) -> None:
    from edgellama.llm import LLM

    with LLM(smollm2_path, n_ctx=64, n_threads=1) as one:
        want = one.eval(PROMPT, all_logits=True).copy()
    with LLM(sets[7], n_ctx=64, n_threads=1) as split:
        assert isinstance(split.file, SplitGGUF) and len(split.file.pieces) == 7
        got = split.eval(PROMPT, all_logits=True)
        assert np.array_equal(got, want)


def test_plan_follows_llamacpp_rules() -> None:
    class T:
        def __init__(self, name: str, n: int) -> None:
            self.name, self.n_bytes = name, n

    ts = [T(f"t{i}", n) for i, n in enumerate([100, 100, 100, 40, 500])]
    by_size = plan_split(ts, None, 260)  # type: ignore[arg-type]
    assert [[t.name for t in p] for p in by_size] == [["t0", "t1"], ["t2", "t3"], ["t4"]]  # padded to 32: 128+128
    by_count = plan_split(ts, 2, None)  # type: ignore[arg-type]
    assert [len(p) for p in by_count] == [2, 2, 1]
    assert [len(p) for p in plan_split(ts, 2, None, no_tensor_first_split=True)] == [0, 2, 2, 1]  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="too small"):
        plan_split(ts, None, 50)  # type: ignore[arg-type]
    assert parse_split_size("2G") == 2 * 10**9 and parse_split_size("500M") == 5 * 10**8
    with pytest.raises(ValueError, match="split-max-size"):
        parse_split_size("-3G")


def test_metadata_only_first_piece_and_tiny_model_round_trip(tmp_path: Path) -> None:
    src = _tiny(tmp_path / "tiny.gguf")
    pieces = split_model(src, tmp_path / "p", max_tensors=4, no_tensor_first_split=True)
    assert [n for _, n in pieces] == [0, 4, 2]
    with open_model_file(pieces[0][0]) as f:
        assert isinstance(f, SplitGGUF) and f.get("general.name") == "tiny"
        assert [t.name for t in f.tensors] == [f"t{i}" for i in range(6)]
        assert float(f.tensor("t5").data.view(np.float32)[0]) == 5.0
    assert merge_model(pieces[0][0], tmp_path / "m.gguf").read_bytes() == src.read_bytes()
    with pytest.raises(FileExistsError, match="already exists"):
        merge_model(pieces[0][0], tmp_path / "m.gguf")
    with pytest.raises(ValueError, match="not a split model"):
        merge_model(src, tmp_path / "m2.gguf")
    with open_model_file(src) as single:
        assert isinstance(single, GGUFFile)


# --- broken sets -----------------------------------------------------------------------------------


def test_missing_piece_is_named(sets: dict[int, Path], tmp_path: Path) -> None:
    first = _copy_set(sets[3], tmp_path)
    gone = first.with_name(first.name.replace("00001-of", "00002-of"))
    gone.unlink()
    with pytest.raises(GGUFError, match=f"{gone.name}: piece 2 of 3 .* is missing"):
        open_model_file(first)


def test_truncated_piece_is_named(sets: dict[int, Path], tmp_path: Path) -> None:
    first = _copy_set(sets[3], tmp_path)
    last = first.with_name(first.name.replace("00001-of", "00003-of"))
    os.truncate(last, last.stat().st_size - 1000)
    with pytest.raises(GGUFError, match=f"{last.name}: tensor .* lies outside"):
        open_model_file(first)


def test_pieces_out_of_order_are_refused(sets: dict[int, Path], tmp_path: Path) -> None:
    first = _copy_set(sets[3], tmp_path)
    a, b = (first.with_name(first.name.replace("00001-of", f"0000{i}-of")) for i in (2, 3))
    a.rename(tmp_path / "x")
    b.rename(a)
    (tmp_path / "x").rename(b)
    with pytest.raises(GGUFError, match=f"{a.name}: does not belong .* split.no 2"):
        open_model_file(first)


def test_piece_of_another_set_is_refused(sets: dict[int, Path], tmp_path: Path) -> None:
    # another model split into 3: the foreign second piece says another tensor total
    other = split_model(_tiny(tmp_path / "o.gguf", n=9), tmp_path / "o", max_tensors=3)
    (tmp_path / "set").mkdir()
    first = _copy_set(sets[3], tmp_path / "set")
    second = first.with_name(first.name.replace("00001-of", "00002-of"))
    shutil.copy(other[1][0], second)
    with pytest.raises(GGUFError, match=f"{second.name}: does not belong .* split.tensors.count 9"):
        open_model_file(first)


def test_same_shape_set_with_duplicate_tensor_is_refused(tmp_path: Path) -> None:
    # two sets of the same layout, one piece re-labelled: caught by a tensor name seen twice
    a = split_model(_tiny(tmp_path / "a.gguf"), tmp_path / "a", max_tensors=3)
    w = GGUFWriter(a[1][0])
    w.add("split.no", 1, GGUFValueType.UINT16)
    w.add("split.tensors.count", 6, GGUFValueType.INT32)
    w.add("split.count", 2, GGUFValueType.UINT16)
    for i in (0, 3, 4):
        w.add_tensor(f"t{i}", np.zeros((4, 32), np.float32))
    w.write()
    with pytest.raises(GGUFError, match="tensor 't0' is also in a-00001-of-00002.gguf"):
        open_model_file(a[0][0])


def test_counts_that_do_not_add_up_are_refused(tmp_path: Path) -> None:
    first = tmp_path / "c-00001-of-00001.gguf"
    w = GGUFWriter(first)
    w.add("split.no", 0, GGUFValueType.UINT16)
    w.add("split.tensors.count", 5, GGUFValueType.INT32)
    w.add("split.count", 1, GGUFValueType.UINT16)
    w.add_tensor("t", np.zeros(32, np.float32))
    w.write()
    with pytest.raises(GGUFError, match="hold 1 tensors, the set says 5"):
        open_model_file(first)


def test_opening_a_later_piece_or_a_renamed_first_is_refused(sets: dict[int, Path], tmp_path: Path) -> None:
    second = sets[3].with_name(sets[3].name.replace("00001-of", "00002-of"))
    with pytest.raises(GGUFError, match="is piece 2 of a split model, not the first"):
        open_model_file(second)
    renamed = tmp_path / "model.gguf"
    shutil.copy(sets[3], renamed)
    with pytest.raises(GGUFError, match="must be named PREFIX-00001-of-00003.gguf"):
        open_model_file(renamed)


def test_bad_split_key_type_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "b-00001-of-00001.gguf"
    w = GGUFWriter(p)
    w.add("split.count", "one")
    w.write()
    with pytest.raises(GGUFError, match="split.count has type STRING, expected UINT16"):
        open_model_file(p)


# --- the commands ----------------------------------------------------------------------------------


def test_split_merge_info_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = _tiny(tmp_path / "tiny.gguf")
    assert main(["split", str(src), str(tmp_path / "p"), "--split-max-size", "1K", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    first = Path(doc["pieces"][0]["path"])
    assert len(doc["pieces"]) == 6 and Path(doc["manifest"]).is_file()
    assert main(["info", str(first), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["tensor_count"] == 6 and len(info["pieces"]) == 6
    assert [t["piece"] for t in info["tensors"]] == [1, 2, 3, 4, 5, 6]
    assert info["sha256"]["source"].endswith(".sha256")
    assert main(["merge", str(first), str(tmp_path / "m.gguf")]) == 0
    assert (tmp_path / "m.gguf").read_bytes() == src.read_bytes()
    whole = hashlib.sha256(src.read_bytes()).hexdigest()
    assert main(["info", str(first), "--sha256", whole]) == 0
    capsys.readouterr()
    assert main(["info", str(first), "--sha256", "0" * 64]) == 1
    assert "sha256 mismatch" in capsys.readouterr().err
    # a piece altered after the manifest was written
    third = first.with_name(first.name.replace("00001-of", "00003-of"))
    data = bytearray(third.read_bytes())
    data[-1] ^= 1
    third.write_bytes(bytes(data))
    assert main(["info", str(first)]) == 1
    assert f"{third.name}: sha256 mismatch" in capsys.readouterr().err
    assert main(["merge", str(tmp_path / "none-00001-of-00002.gguf"), str(tmp_path / "x.gguf")]) == 2

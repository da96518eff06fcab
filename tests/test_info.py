"""`edgellama info`: text and JSON reports, checksum verification, errors, and touching only the header."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from gguf_fixtures import mapped_rss_bytes, write_all_types, write_big_model, write_small_model

from edgellama.cli import info
from edgellama.gguf import split as gguf_split
from edgellama.gguf.ggml_types import type_name
from edgellama.gguf.reader import GGUFFile

ROOT = Path(__file__).resolve().parent.parent


def run_info(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = info.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def run_module(*argv: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-m", "edgellama.cli.info", *argv], capture_output=True, text=True, env=env, timeout=60, check=False
    )


def quant_rows(path: Path) -> dict[str, tuple[int, int]]:
    """type -> (tensor count, bytes), computed from the reader, for checking the report's table."""
    rows: dict[str, tuple[int, int]] = {}
    with GGUFFile(path) as f:
        for t in f.tensors:
            n, b = rows.get(type_name(t.ggml_type), (0, 0))
            rows[type_name(t.ggml_type)] = (n + 1, b + t.n_bytes)
    return rows


def test_text_report_has_architecture_hyperparameters_and_quant_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write_small_model(tmp_path / "m.gguf")
    code, out, err = run_info(capsys, str(path))
    assert code == 0 and err == ""
    assert "architecture  llama" in out
    # hyperparameters, the architecture prefix stripped
    assert re.search(r"^  block_count +1$", out, re.MULTILINE) and re.search(r"^  embedding_length +32$", out, re.MULTILINE)
    table = out.split("tensor types\n", 1)[1].split("\n\n", 1)[0].splitlines()
    for tname, (n, nbytes) in quant_rows(path).items():
        row = next(r.split() for r in table if r.split()[0] == tname)
        assert int(row[1]) == n and int(row[3].replace(",", "")) == nbytes, row
    assert f"{path.stat().st_size:,} bytes" in out
    assert "tokenizer.ggml.tokens" in out and "['<s>', 'a', 'bc']" in out


def test_tensor_table_lists_every_tensor_with_offset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_small_model(tmp_path / "m.gguf")
    code, out, _ = run_info(capsys, str(path), "--tensors")
    assert code == 0
    lines = out.split("\ntensors (4)\n", 1)[1].splitlines()[1:]
    with GGUFFile(path) as f:
        for line, t in zip(lines, f.tensors):
            cols = line.split()
            assert cols[1] == t.name and f"{t.offset:,}" in cols and t.type_name in cols


def test_long_arrays_are_summarized_unless_full(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_all_types(tmp_path / "a.gguf")
    _, out, _ = run_info(capsys, str(path))
    line = next(ln for ln in out.splitlines() if "test.arr.long" in ln)
    assert line.endswith("[1000 x int32] [0, 1, 2, ...]")
    _, out, _ = run_info(capsys, str(path), "--full")
    line = next(ln for ln in out.splitlines() if "test.arr.long" in ln)
    assert line.endswith("[" + ", ".join(str(i) for i in range(1000)) + "]")


def test_json_has_counts_types_metadata_and_tensors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_all_types(tmp_path / "a.gguf", alignment=64)
    code, out, _ = run_info(capsys, str(path), "--json")
    assert code == 0
    doc = json.loads(out)
    with GGUFFile(path) as f:
        assert doc["tensor_count"] == len(f.tensors) == len(doc["tensors"])
        assert doc["metadata_count"] == len(f.metadata) == len(doc["metadata"])
        assert [t["offset"] for t in doc["tensors"]] == [t.offset for t in f.tensors]
    assert doc["architecture"] == "testarch" and doc["hyperparameters"]["context_length"] == 128
    assert doc["alignment"] == 64 and doc["file_size"] == path.stat().st_size
    assert {r["type"]: (r["tensors"], r["bytes"]) for r in doc["types"]} == quant_rows(path)
    long = doc["metadata"]["test.arr.long"]
    assert (long["length"], long["head"], "value" in long) == (1000, [0, 1, 2], False)
    assert doc["metadata"]["test.uint64"] == {"type": "uint64", "value": (1 << 64) - 1}
    code, out, _ = run_info(capsys, str(path), "--json", "--full")
    assert json.loads(out)["metadata"]["test.arr.long"]["value"] == list(range(1000))


def test_real_model_report(gemma_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_info(capsys, str(gemma_path))
    assert code == 0
    assert "architecture  gemma3" in out and "  sliding_window" not in out  # keys keep their sub-path
    assert re.search(r"^  attention\.sliding_window +512$", out, re.MULTILINE)
    assert "[262144 x string] ['<pad>', '<eos>', '<bos>', ...]" in out
    rows = quant_rows(gemma_path)
    assert {"Q4_K", "Q6_K", "Q8_0", "F32"} <= set(rows)
    total = next(ln for ln in out.splitlines() if ln.split()[:1] == ["total"]).split()
    assert int(total[1]) == sum(n for n, _ in rows.values())
    assert int(total[3].replace(",", "")) == sum(b for _, b in rows.values())


def test_sha256_argument_verifies_and_refuses_a_mismatch(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = write_small_model(tmp_path / "m.gguf")
    good = hashlib.sha256(path.read_bytes()).hexdigest()
    code, out, _ = run_info(capsys, str(path), "--sha256", good)
    assert code == 0 and f"sha256        {good} verified (--sha256)" in out
    code, out, err = run_info(capsys, str(path), "--sha256", "0" * 64)
    assert code == 1 and out == "" and "sha256 mismatch" in err
    code, _, err = run_info(capsys, str(path), "--sha256", "xyz")
    assert code == 2 and "64 hex digits" in err


@pytest.mark.parametrize("form", ["sha256sum", "star", "bare"])
def test_sidecar_sha256_file_is_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str], form: str) -> None:
    path = write_small_model(tmp_path / "m.gguf")
    good = hashlib.sha256(path.read_bytes()).hexdigest()
    line = {"sha256sum": f"{good}  m.gguf\n", "star": f"{good} *m.gguf\n", "bare": f"{good}\n"}[form]
    sidecar = tmp_path / "m.gguf.sha256"
    sidecar.write_text(line)
    code, out, _ = run_info(capsys, str(path), "--json")
    assert code == 0 and json.loads(out)["sha256"] == {"expected": good, "source": str(sidecar), "ok": True}
    sidecar.write_text(line.replace(good, "f" * 64))
    code, out, err = run_info(capsys, str(path))
    assert code == 1 and "sha256 mismatch" in err and out == ""
    sidecar.write_text("not a checksum\n")
    code, _, err = run_info(capsys, str(path))
    assert code == 2 and "no sha256 line" in err


def test_bad_or_missing_file_is_one_line_error_without_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + (3).to_bytes(4, "little") + b"\xff" * 16)
    r = run_module(str(bad))
    assert r.returncode == 1 and r.stdout == ""
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr and "invalid GGUF" in r.stderr
    assert "byte offset" in r.stderr
    r = run_module(str(tmp_path / "missing.gguf"))
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "no such file" in r.stderr
    r = run_module(str(tmp_path))
    assert r.returncode == 2 and "is a directory" in r.stderr


def test_module_entry_point_prints_json(tmp_path: Path) -> None:
    path = write_small_model(tmp_path / "m.gguf")
    r = run_module(str(path), "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["tensor_count"] == 4


def test_no_model_argument_uses_the_default_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_small_model(tmp_path / "default.gguf")
    monkeypatch.setenv("EDGELLAMA_MODEL", str(path))  # honoured by default_model_path()
    code, out, _ = run_info(capsys, "--json")
    assert code == 0 and json.loads(out)["path"] == str(path)


def test_system_flag_reports_kernels_or_their_absence(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_small_model(tmp_path / "m.gguf")
    fake = types.ModuleType("edgellama.native.kernels")
    fake.isa = lambda: "fake-isa"  # type: ignore[attr-defined]
    fake.cpu_features = lambda: "feat1 feat2"  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "edgellama.native.kernels", fake)
    monkeypatch.setattr("edgellama.native.kernels", fake, raising=False)
    code, out, _ = run_info(capsys, str(path), "--system")
    assert code == 0 and "kernels       fake-isa" in out and "cpu features  feat1 feat2" in out
    monkeypatch.setitem(sys.modules, "edgellama.native.kernels", None)  # import now raises ImportError
    monkeypatch.delattr("edgellama.native.kernels", raising=False)
    code, out, _ = run_info(capsys, str(path), "--system")
    assert code == 0 and "C extension not available" in out and "architecture  llama" in out


def test_add_parser_plugs_into_a_dispatcher() -> None:
    parser = argparse.ArgumentParser(prog="edgellama")
    sub = parser.add_subparsers(dest="command")
    info.add_parser(sub)
    args = parser.parse_args(["info", "x.gguf", "--json", "--tensors"])
    assert args.func is info.run and args.handler is info.run and args.model == Path("x.gguf") and args.json and args.tensors


def test_info_touches_only_header_pages(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = write_big_model(tmp_path / "big.gguf", data_mb=32)
    seen: dict[str, Any] = {}

    class Spy(GGUFFile):
        def close(self) -> None:  # measure the mapping just before info unmaps it
            seen["rss"] = mapped_rss_bytes(self.path)
            seen["header"] = self.data_offset
            super().close()

    monkeypatch.setattr(gguf_split, "GGUFFile", Spy)  # info opens through open_model_file
    code, out, _ = run_info(capsys, str(path), "--tensors", "--json")
    assert code == 0 and json.loads(out)["tensor_count"] == 4
    assert 0 < seen["rss"] <= seen["header"] + 128 * 1024  # header + fault-around; data is 32 MiB

"""Hostile models and flags: every metadata key of an unexpected type or value, every flag beyond what
the engine takes, ends as one `edgellama: error:` line naming the key or flag and exit status 1.

Each case of issue 15's list is here, on tiny synthetic models (tests/gguf_fixtures.write_tiny_model)
changed one key at a time; a truncated mapped file ends with one line naming the file.
"""

from __future__ import annotations

import dataclasses
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from gguf_fixtures import rewrite_metadata, write_tiny_model

from edgellama.cli import main
from edgellama.gguf import metadata as K
from edgellama.gguf.metadata import Metadata, MetadataError
from edgellama.gguf.reader import GGUFFile
from edgellama.gguf.reader import GGUFValueType as V
from edgellama.native.desc import ModelDesc, check_c_ranges
from edgellama.wiring import HParams, build_desc

ROOT = Path(__file__).resolve().parent.parent
RUN = ["-p", "hi", "-n", "2", "-c", "64", "-t", "1"]
ESC = "\x1b]0;pwned\x07\x1b[2J\nfake line"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("tiny")
    return {
        "llama": write_tiny_model(d / "llama.gguf", "llama", "spm"),
        "gemma3": write_tiny_model(d / "gemma3.gguf", "gemma3", "spm"),
        "qwen2": write_tiny_model(d / "qwen2.gguf", "qwen2", "bpe"),
    }


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(capsys: pytest.CaptureFixture[str], argv: list[str], *names: str) -> str:
    rc, out, err = cli(capsys, *argv)
    lines = err.strip().splitlines()
    assert rc == 1, (rc, out, err)
    assert len(lines) == 1 and lines[0].startswith("edgellama: error:"), err
    for name in names:
        assert name in lines[0], (name, lines[0])
    assert out == "", "nothing may be printed before the error"
    return lines[0]


def test_the_tiny_models_run(tiny: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    for path in tiny.values():
        rc, out, err = cli(capsys, "run", "-m", str(path), *RUN)
        assert rc == 0, err
        assert out.startswith("hi")


# ---- tokenizer arrays -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arch", "key", "new", "message"),
    [
        ("llama", "tokenizer.ggml.tokens", (7, V.UINT32, None), "has type UINT32, expected an ARRAY of STRING"),
        ("llama", "tokenizer.ggml.tokens", (["<unk>", "<s>", "</s>"], V.ARRAY, V.STRING),
         "has 3 entries, but token_embd.weight has 268 rows"),
        ("qwen2", "tokenizer.ggml.merges", (5, V.UINT32, None), "has type UINT32, expected an ARRAY of STRING"),
        ("llama", "tokenizer.ggml.token_type", (1, V.INT32, None), "has type INT32, expected an ARRAY of integers"),
        ("llama", "tokenizer.ggml.token_type", ([1, 1], V.ARRAY, V.INT32), "has 2 entries for 268 tokens"),
        ("llama", "tokenizer.ggml.token_type", (np.full(268, 6, np.int32), V.ARRAY, V.INT32),
         "marks token 0 ('<unk>') as BYTE"),
        ("llama", "tokenizer.ggml.scores", ([0.5], V.ARRAY, V.FLOAT32), "has 1 entries for 268 tokens"),
    ],
)
def test_tokenizer_arrays_of_the_wrong_type_or_length_are_named(
    tiny: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], arch: str, key: str, new: Any,
    message: str,
) -> None:
    path = rewrite_metadata(tiny[arch], tmp_path / "m.gguf", {key: new})
    one_line_error(capsys, ["run", "-m", str(path), *RUN], key, message)


@pytest.mark.parametrize("key", ["bos_token_id", "eos_token_id", "eot_token_id"])
@pytest.mark.parametrize(
    ("new", "found"),
    [(([1, 2], V.ARRAY, V.UINT32), "an ARRAY of UINT32"), (("1", V.STRING, None), "STRING"),
     ((math.inf, V.FLOAT32, None), "FLOAT32")],
)
def test_token_id_keys_of_another_type_are_named(
    tiny: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, new: Any, found: str
) -> None:
    path = rewrite_metadata(tiny["llama"], tmp_path / "m.gguf", {f"tokenizer.ggml.{key}": new})
    one_line_error(capsys, ["run", "-m", str(path), *RUN], f"tokenizer.ggml.{key}", f"has type {found}")


def test_add_bos_token_as_the_string_false_is_refused(
    tiny: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = rewrite_metadata(tiny["llama"], tmp_path / "m.gguf", {"tokenizer.ggml.add_bos_token": ("false", V.STRING, None)})
    one_line_error(capsys, ["run", "-m", str(path), *RUN], "tokenizer.ggml.add_bos_token", "STRING, expected BOOL")


# ---- hyperparameters --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arch", "key", "new", "message"),
    [
        ("llama", "block_count", (math.inf, V.FLOAT32, None), "has type FLOAT32, expected an integer"),
        ("llama", "context_length", (math.inf, V.FLOAT32, None), "has type FLOAT32, expected an integer"),
        ("llama", "attention.head_count", (math.inf, V.FLOAT64, None), "has type FLOAT64, expected an integer"),
        ("llama", "vocab_size", (math.inf, V.FLOAT32, None), "has type FLOAT32, expected an integer"),
        ("gemma3", "attention.sliding_window", (math.inf, V.FLOAT32, None), "FLOAT32, expected an integer"),
        ("llama", "rope.freq_base", ([1.0, 2.0], V.ARRAY, V.FLOAT32), "an ARRAY of FLOAT32, expected a float"),
        ("llama", "rope.scaling.factor", ([2.0], V.ARRAY, V.FLOAT32), "an ARRAY of FLOAT32, expected a float"),
        ("llama", "rope.scaling.type", ([1, 2], V.ARRAY, V.UINT32), "an ARRAY of UINT32, expected STRING"),
        ("llama", "feed_forward_length", (1 << 40, V.UINT64, None), "= 1099511627776 is out of range (expected 1..2^31-1)"),
        ("llama", "rope.dimension_count", (1 << 31, V.UINT32, None), "= 2147483648 is out of range"),
        ("llama", "context_length", (0, V.UINT32, None), "= 0 is out of range (expected 1..2^31-1)"),
        ("llama", "context_length", (1 << 40, V.UINT64, None), "= 1099511627776 is out of range"),
        ("llama", "block_count", (0, V.UINT32, None), "= 0 is out of range"),
        ("llama", "attention.key_length", (0, V.UINT32, None), "= 0 is out of range"),
        ("llama", "rope.freq_base", (math.nan, V.FLOAT32, None), "= nan is not a finite number"),
        ("llama", "rope.freq_base", (-10000.0, V.FLOAT32, None), "= -10000.0 is out of range (expected > 0"),
        ("llama", "rope.dimension_count", (15, V.UINT32, None), "= 15 must be even"),
        ("llama", "attention.layer_norm_rms_epsilon", (math.nan, V.FLOAT32, None), "is not a finite number"),
        ("llama", "attention.layer_norm_rms_epsilon", (-1e-6, V.FLOAT32, None), "is out of range (expected > 0"),
        ("llama", "rope.scaling.factor", (math.nan, V.FLOAT32, None), "= nan is not a finite number"),
        ("llama", "rope.scaling.factor", (-2.0, V.FLOAT32, None), "= -2.0 is out of range"),
        ("llama", "attention.head_count", (0, V.UINT32, None), "= 0 is out of range"),
        ("llama", "embedding_length", (2, V.UINT32, None), "no head size"),
    ],
)
def test_hyperparameters_of_a_wrong_type_or_range_are_named(
    tiny: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], arch: str, key: str, new: Any,
    message: str,
) -> None:
    path = rewrite_metadata(tiny[arch], tmp_path / "m.gguf", {f"{arch}.{key}": new})
    one_line_error(capsys, ["run", "-m", str(path), *RUN], f"{arch}.{key}", message)


def test_zero_layers_and_zero_head_size_name_a_key(
    tiny: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = rewrite_metadata(tiny["llama"], tmp_path / "m.gguf", {"llama.block_count": (0, V.UINT32, None),
                                                                 "llama.attention.key_length": (0, V.UINT32, None)})
    one_line_error(capsys, ["run", "-m", str(path), *RUN], "out of range")


def test_huge_training_context_with_a_budget_is_refused_by_key(
    tiny: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = rewrite_metadata(tiny["llama"], tmp_path / "m.gguf", {"llama.context_length": (1 << 40, V.UINT64, None)})
    one_line_error(capsys, ["run", "-m", str(path), "-p", "hi", "-n", "2", "--mem-budget", "1G"],
                   "llama.context_length")


def test_largest_legal_training_context_with_a_budget_plans_within_the_engine_limit(
    tiny: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = rewrite_metadata(tiny["llama"], tmp_path / "m.gguf", {"llama.context_length": ((1 << 31) - 1, V.UINT32, None)})
    rc, out, err = cli(capsys, "info", str(path), "--plan", "--mem-budget", "64G", "--json")
    assert rc == 0, err
    assert '"n_ctx": 16777216' in out  # capped at the engine's limit, not handed to C as 2^31-1


# ---- flags ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["run", "-m", "{m}", "-p", "hi", "-c", "3000000000"], "-c/--ctx-size"),
        (["perplexity", "-m", "{m}", "-f", "{t}", "-c", "2147483648"], "-c/--ctx-size"),
        (["bench", "-m", "{m}", "-c", "3000000000"], "-c/--ctx-size"),
        (["bench", "-m", "{m}", "-p", "3000000000"], "-p/--n-prompt"),
        (["bench", "-m", "{m}", "-r", "2147483648"], "-r/--repetitions"),
        (["run", "-m", "{m}", "-p", "hi", "-b", "2147483648"], "-b/--batch-size"),
        (["run", "-m", "{m}", "-p", "hi", "--keep", "-1"], "--keep"),
        (["run", "-m", "{m}", "-p", "hi", "-n", "2147483648"], "-n/--n-predict"),
        (["run", "-m", "{m}", "-p", "hi", "--temp", "nan"], "--temp"),
        (["run", "-m", "{m}", "-p", "hi", "--temp", "inf"], "--temp"),
        (["run", "-m", "{m}", "-p", "hi", "--repeat-penalty", "nan"], "--repeat-penalty"),
        (["run", "-m", "{m}", "-p", "hi", "--mirostat-lr", "nan"], "--mirostat-lr"),
        (["run", "-m", "{m}", "-p", "hi", "--mirostat-ent", "nan"], "--mirostat-ent"),
        (["run", "-m", "{m}", "-p", "hi", "--repeat-last-n", "9223372036854775808"], "--repeat-last-n"),
        (["run", "-m", "{m}", "-p", "hi", "-s", "-5"], "-s/--seed"),
        (["perplexity", "-m", "{m}", "-f", "{t}", "-c", "64", "--bos-id", "4294967296"], "--bos-id"),
        (["perplexity", "-m", "{m}", "-f", "{t}", "-c", "64", "--chunks", "0"], "--chunks"),
    ],
)
def test_flags_beyond_what_the_engine_takes_are_named(
    tiny: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], flag: str
) -> None:
    text = tmp_path / "t.txt"
    text.write_text("hi ab. " * 100)
    args = [a.replace("{m}", str(tiny["llama"])).replace("{t}", str(text)) for a in argv]
    one_line_error(capsys, args, flag)


def test_info_plan_context_beyond_int32_is_one_line(tiny: dict[str, Path], capsys: pytest.CaptureFixture[str]) -> None:
    rc, _out, err = cli(capsys, "info", str(tiny["llama"]), "--plan", "-c", "3000000000")
    assert rc == 1 and err.strip().count("\n") == 0 and "-c/--ctx-size 3000000000 is out of range" in err


def test_engine_context_limit_is_the_one_the_c_plan_enforces(tiny: dict[str, Path]) -> None:
    from edgellama.memplan import MAX_CTX
    from edgellama.native.engine import plan_bytes
    from edgellama.native.lib import KernelError

    with GGUFFile(tiny["llama"]) as f:
        _hp, desc = build_desc(f)
        plan_bytes(desc, MAX_CTX, 64, "f16", 1)
        with pytest.raises(KernelError):
            plan_bytes(desc, MAX_CTX + 1, 64, "f16", 1)


def test_numbers_beyond_the_c_types_never_reach_cffi(tiny: dict[str, Path]) -> None:
    from edgellama.native.engine import Engine, Pool, plan_bytes

    with GGUFFile(tiny["llama"]) as f:
        _hp, desc = build_desc(f)
        with pytest.raises(ValueError, match="n_ff = 2147483648 does not fit"):
            check_c_ranges(dataclasses.replace(desc, n_ff=1 << 31))
        with pytest.raises(ValueError, match="norm_eps = nan"):
            check_c_ranges(dataclasses.replace(desc, norm_eps=math.nan))
        with pytest.raises(ValueError, match="n_ctx = 4294967296"):
            plan_bytes(desc, 1 << 32, 64, "f16", 1)
        pool = Pool(1)
        eng = Engine(desc, pool, 64, 8)
        with pytest.raises(ValueError, match="32-bit"):
            eng.eval([1 << 40], 0)
        with pytest.raises(ValueError, match="32-bit"):
            eng.eval([1 << 70], 0)
        eng.close()
        pool.close()


# ---- info escapes names -----------------------------------------------------------------------------


def test_info_escapes_key_tensor_and_architecture_names(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from edgellama.gguf.writer import GGUFWriter

    w = GGUFWriter(tmp_path / "e.gguf", arch="llama" + ESC)
    w.add("general.name" + ESC, "x" + ESC)
    w.add_tensor("blk.0" + ESC, np.zeros(4, np.float32))
    w.write()
    rc, out, err = cli(capsys, "info", str(tmp_path / "e.gguf"), "--tensors")
    assert rc == 0, err
    assert "\x1b" not in out and "\x07" not in out
    assert "fake line" in out and not any(line.startswith("fake line") for line in out.splitlines())
    assert out.count("\\x1b]0;pwned\\x07\\x1b[2J") >= 3  # architecture, key, tensor name (and the value)


# ---- prompt cache -----------------------------------------------------------------------------------


def test_prompt_cache_that_is_a_directory_is_refused_before_any_work(
    tiny: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    d = tmp_path / "cache"
    d.mkdir()
    one_line_error(capsys, ["run", "-m", str(tiny["llama"]), *RUN, "--prompt-cache", str(d)], "is not a regular file")
    assert not (tmp_path / "cache.tmp").exists()
    one_line_error(capsys, ["run", "-m", str(tiny["llama"]), *RUN, "--prompt-cache", str(tmp_path / "no" / "c")],
                   "does not exist")
    rc, _out, err = cli(capsys, "run", "-m", str(tiny["llama"]), *RUN, "--prompt-cache", str(tmp_path / "c.bin"))
    assert rc == 0 and (tmp_path / "c.bin").is_file(), err


# ---- the typed accessor and the HParams/ModelDesc split ---------------------------------------------


def test_every_key_is_declared_once_with_a_kind() -> None:
    names = [k.name for k in K.KEYS]
    assert len(names) == len(set(names)) and len(names) >= 30
    assert K.BLOCK_COUNT in K.KEYS and K.TOKENS in K.KEYS


def test_accessor_names_key_type_found_and_type_expected() -> None:
    types = {"llama.block_count": (V.FLOAT64,), "tokenizer.ggml.tokens": (V.ARRAY, V.UINT32)}
    md = Metadata({"llama.block_count": 2.0, "tokenizer.ggml.tokens": np.zeros(3, np.uint32)}, types, "llama")
    with pytest.raises(MetadataError, match=r"^metadata key llama\.block_count has type FLOAT64, expected an integer$"):
        md.get(K.BLOCK_COUNT)
    with pytest.raises(MetadataError, match="tokenizer.ggml.tokens has type an ARRAY of UINT32, expected an ARRAY"):
        md.get(K.TOKENS)
    with pytest.raises(MetadataError, match="llama.embedding_length is missing"):
        md.get(K.EMBEDDING_LENGTH)
    assert md.get(K.EMBEDDING_LENGTH, 7) == 7
    plain = Metadata({"tokenizer.ggml.add_bos_token": "false"})  # types inferred from a plain dict
    with pytest.raises(MetadataError, match="STRING, expected BOOL"):
        plain.get(K.ADD_BOS)


def test_hparams_hold_only_what_the_model_description_does_not(tiny: dict[str, Path]) -> None:
    hp_fields = {f.name for f in dataclasses.fields(HParams)}
    # only the name is shared: HParams.arch is the file's architecture name, ModelDesc.arch its C family
    assert hp_fields & {f.name for f in dataclasses.fields(ModelDesc)} == {"arch"}
    with GGUFFile(tiny["gemma3"]) as f:
        hp, desc = build_desc(f)
    assert (hp.arch, hp.n_ctx_train) == ("gemma3", 256)
    assert [L.window for L in desc.layers] == [8, 8]  # sliding window pattern 6: both layers local


# ---- SIGBUS: a model file truncated while mapped ----------------------------------------------------

_TRUNCATE_WHILE_RUNNING = textwrap.dedent("""
    import os, sys
    from edgellama.llm import LLM
    llm = LLM(sys.argv[1], n_ctx=64, n_threads=1)
    os.truncate(sys.argv[1], llm.file.data_offset)
    llm.eval([1, 2, 3])
    print("survived")
""")


def test_truncated_model_file_ends_with_one_line_naming_it(tiny: dict[str, Path], tmp_path: Path) -> None:
    victim = tmp_path / "victim.gguf"
    victim.write_bytes(tiny["llama"].read_bytes())
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", _TRUNCATE_WHILE_RUNNING, str(victim)], capture_output=True,
                       text=True, timeout=120, env=env, check=False)
    from edgellama.native.sigbus import EXIT_CODE

    assert p.returncode == EXIT_CODE == 74, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"edgellama: error: {victim}: the file was truncated"), p.stderr
    assert "survived" not in p.stdout


def test_a_file_truncated_under_the_bare_reader_ends_with_one_line_naming_it(tiny: dict[str, Path],
                                                                             tmp_path: Path) -> None:
    """A script that imports only the GGUF reader (no LLM, no C binding) is guarded too: the package root
    installs the C library's guard for every mapping the reader makes."""
    victim = tmp_path / "victim.gguf"
    victim.write_bytes(tiny["llama"].read_bytes())
    code = textwrap.dedent("""
        import os, sys
        from edgellama.gguf.reader import GGUFFile
        f = GGUFFile(sys.argv[1])
        os.truncate(sys.argv[1], 0)
        print(sum(int(t.data.sum()) for t in f.tensors))
        print("survived")
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", code, str(victim)], capture_output=True, text=True, timeout=120,
                       env=env, check=False)
    assert p.returncode == 74, (p.returncode, p.stderr)
    lines = p.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"edgellama: error: {victim}: the file was truncated"), p.stderr
    assert "survived" not in p.stdout


def test_a_bus_error_outside_registered_mappings_still_kills(tiny: dict[str, Path], tmp_path: Path) -> None:
    other = tmp_path / "other.bin"
    other.write_bytes(b"x" * 65536)
    code = textwrap.dedent("""
        import mmap, os, sys
        from edgellama.gguf.reader import GGUFFile
        f = GGUFFile(sys.argv[1])  # registers the handler and this mapping
        m = mmap.mmap(os.open(sys.argv[2], os.O_RDONLY), 0, access=mmap.ACCESS_READ)
        os.truncate(sys.argv[2], 10)
        print(m[60000])
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.run([sys.executable, "-c", code, str(tiny["llama"]), str(other)], capture_output=True,
                       text=True, timeout=120, env=env, check=False)
    assert p.returncode == -7, (p.returncode, p.stderr)  # SIGBUS, default action: not misreported as ours
    assert "edgellama" not in p.stderr

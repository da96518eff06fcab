"""Several models behind one socket (issue 35), with real server processes and the real models: SmolLM2 and
Gemma 3 within a RAM budget that holds only one of them. Requests route by name and each answer is the one
the Python API gives that model alone; swaps are counted and the peak RSS stays under the budget; a sha256
mismatch, a truncated file and a file replaced on disk; unload refused while a request runs; keep_alive."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.service_util import ServerProc, cli_env, openai_over_unix_socket
from tests.test_service_http import call

BUDGET_MIB = 450  # SmolLM2 (~200 MiB at -c 1024) or Gemma 3 (~375 MiB), never both (~540 MiB)
ENGINE = ["-c", "1024", "-t", "1", "-b", "64"]
PROMPTS = {"smol": "The capital of France is", "gemma": "The three primary colors are"}
N_PREDICT = 8


def complete(srv: ServerProc, model: str | None, prompt: str, n: int = N_PREDICT, **extra: Any) -> tuple[int, Any]:
    body: dict[str, Any] = {"prompt": prompt, "n_predict": n, "temperature": 0, **extra}
    if model is not None:
        body["model"] = model
    return call(srv, "POST", "/completion", body)


def states(srv: ServerProc) -> dict[str, dict[str, Any]]:
    status, doc = call(srv, "GET", "/v1/models")
    assert status == 200
    return {m["id"]: m["status"] for m in doc["data"]}


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmHWM")


def server_pid(srv: ServerProc) -> int:
    """The python process under `nice`."""
    kids = Path(f"/proc/{srv.proc.pid}/task/{srv.proc.pid}/children")
    text = kids.read_text().split() if kids.exists() else []
    return int(text[0]) if text else srv.proc.pid


@pytest.fixture(scope="module")
def expected(smollm2_path: Path, gemma_path: Path) -> dict[str, str]:
    """Each model's greedy answer, by the Python API with the model alone (what `run` answers)."""
    from edgellama.llm import LLM

    out = {}
    for name, path in (("smol", smollm2_path), ("gemma", gemma_path)):
        with LLM(path, n_ctx=1024, n_threads=1, n_batch=64) as llm:
            out[name] = llm.create_completion(PROMPTS[name], max_tokens=N_PREDICT, temperature=0)["choices"][0]["text"]
    return out


@pytest.fixture(scope="module")
def two(smollm2_path: Path, gemma_path: Path) -> Any:
    srv = ServerProc("-m", f"smol={smollm2_path}", "-m", f"gemma={gemma_path}", "--mem-budget", f"{BUDGET_MIB}M",
                     "--alias", "chat=smol", engine=ENGINE)
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.terminate()
        srv.kill()


def test_alternating_requests_swap_within_the_budget(two: ServerProc, expected: dict[str, str]) -> None:
    before = two.metrics().get("edgellama:model_swaps_total", 0.0)
    for name in ["smol", "gemma", "smol", "gemma", "smol"]:
        status, doc = complete(two, name, PROMPTS[name])
        assert status == 200, doc
        assert doc["model"] == name
        assert doc["content"] == expected[name], (name, doc["content"])
        st = states(two)
        assert st[name]["value"] == "loaded"
        assert st["gemma" if name == "smol" else "smol"]["value"] == "unloaded"  # never both
    m = two.metrics()
    assert m["edgellama:model_swaps_total"] - before >= 4
    assert m['edgellama:model_loads_total{model="gemma"}'] >= 2
    assert m['llamacpp:tokens_predicted_total{model="smol"}'] >= 3 * N_PREDICT
    assert m["edgellama:models_memory_budget_bytes"] == BUDGET_MIB << 20
    assert m["edgellama:models_memory_bytes"] <= BUDGET_MIB << 20
    peak = peak_rss_mib(server_pid(two))
    print(f"peak RSS {peak:.1f} MiB, budget {BUDGET_MIB} MiB")
    assert peak < BUDGET_MIB


def test_concurrent_requests_for_both_while_one_loads(two: ServerProc, expected: dict[str, str]) -> None:
    results: dict[int, tuple[str, int, Any]] = {}

    def ask(i: int, name: str) -> None:
        results[i] = (name, *complete(two, name, PROMPTS[name]))

    names = ["gemma", "smol", "gemma", "smol", "smol", "gemma"]
    threads = [threading.Thread(target=ask, args=(i, n)) for i, n in enumerate(names)]
    for t in threads:
        t.start()
        time.sleep(0.02)
    for t in threads:
        t.join(300)
    assert len(results) == len(names)
    for name, status, doc in results.values():
        assert status == 200, doc
        assert doc["model"] == name and doc["content"] == expected[name]


def test_routing_names_and_refusals(two: ServerProc, expected: dict[str, str]) -> None:
    status, doc = complete(two, "nope", "x")
    assert status == 404 and "smol, gemma, chat" in doc["error"]["message"]
    status, doc = complete(two, "chat", PROMPTS["smol"])  # an alias of one model
    assert status == 200 and doc["model"] == "smol" and doc["content"] == expected["smol"]
    with two.connect() as c:  # protocol v1's model field; not_found for an unknown one
        events = c.ask({"id": 1, "model": "gemma", "prompt": PROMPTS["gemma"], "n_predict": N_PREDICT,
                        "temperature": 0})
        assert events[-1]["event"] == "done" and events[-1]["model"] == "gemma"
        assert "".join(e["text"] for e in events if e["event"] == "token") == expected["gemma"]
        err = c.ask({"id": 2, "model": "nope", "prompt": "x"})[-1]
        assert err["event"] == "error" and err["code"] == "not_found"
        c.send({"type": "health", "id": "h", "model": "gemma"})
        h = c.event()
        assert h["model"] == "gemma" and set(h["models"]) == {"smol", "gemma"}
    status, props = call(two, "GET", "/props?model=gemma")
    assert status == 200 and props["model"] == "gemma" and props["model_path"].endswith(".gguf")
    status, slots = call(two, "GET", "/slots?model=smol")
    assert status == 200 and len(slots) == 1
    assert call(two, "GET", "/props?model=nope")[0] == 404
    status, toks = call(two, "POST", "/tokenize", {"model": "gemma", "content": "Hello"})
    assert status == 200 and toks["tokens"]
    text = two.metrics()
    assert any(k.startswith('edgellama:requests_total{model="gemma"') for k in text)
    with openai_over_unix_socket(two.path) as client:  # the openai SDK: its model field, and models.list
        listed = {m.id for m in client.models.list()}
        assert listed == {"smol", "gemma"}
        out = client.completions.create(model="gemma", prompt=PROMPTS["gemma"], max_tokens=N_PREDICT, temperature=0)
        assert out.model == "gemma" and out.choices[0].text == expected["gemma"]
        import openai

        with pytest.raises(openai.NotFoundError):
            client.completions.create(model="gpt-4o", prompt="x", max_tokens=1)


def test_unload_is_refused_while_a_request_runs(two: ServerProc) -> None:
    assert call(two, "POST", "/models/load", {"model": "smol"})[0] == 200
    deadline = time.monotonic() + 60
    while states(two)["smol"]["value"] != "loaded" and time.monotonic() < deadline:
        time.sleep(0.05)
    with two.connect() as c:
        c.send({"id": "long", "model": "smol", "prompt": "Once upon a time", "n_predict": 200, "temperature": 0,
                "ignore_eos": True})
        assert c.event()["event"] == "token"  # it runs
        status, doc = call(two, "POST", "/models/unload", {"model": "smol"})
        assert status == 409 and "running or queued" in doc["error"]["message"]
        events = c.until_final({"long"})["long"]
        assert events[-1]["event"] == "done"
    assert call(two, "POST", "/models/unload", {"model": "smol"})[0] == 200
    assert states(two)["smol"]["value"] == "unloaded"
    assert call(two, "POST", "/models/unload", {"model": "nope"})[0] == 404


def test_bad_files_leave_the_other_model_serving(smollm2_path: Path, gemma_path: Path, tmp_path: Path,
                                                 expected: dict[str, str]) -> None:
    truncated = tmp_path / "truncated.gguf"
    with open(smollm2_path, "rb") as src, open(truncated, "wb") as dst:
        dst.write(src.read(os.path.getsize(smollm2_path) // 2))
    swapped = tmp_path / "swapped.gguf"
    os.link(smollm2_path, swapped)
    cfg = tmp_path / "models.toml"
    cfg.write_text(f'''
[models.smol]
model = "{smollm2_path}"
[models.badsum]
model = "{gemma_path}"
sha256 = "{'0' * 64}"
[models.truncated]
model = "{truncated}"
[models.swapped]
model = "{swapped}"
keep-alive = 0
''')
    srv = ServerProc("--config", str(cfg), "--mem-budget", f"{BUDGET_MIB}M", engine=ENGINE)
    try:
        srv.wait_ready()
        status, doc = complete(srv, "badsum", "x")
        assert status == 503 and doc["error"]["message"].startswith("model badsum is unavailable: sha256 mismatch")
        status, doc = complete(srv, "truncated", "x")
        assert status == 503 and "model truncated is unavailable" in doc["error"]["message"]
        assert "truncated.gguf" in doc["error"]["message"]
        st = states(srv)
        assert st["badsum"]["value"] == "failed" and "sha256 mismatch" in st["badsum"]["reason"]
        assert st["truncated"]["value"] == "failed"
        status, doc = complete(srv, "smol", PROMPTS["smol"])  # the others keep serving
        assert status == 200 and doc["content"] == expected["smol"]
        # a file replaced on disk (another renamed over it) is what the next load reads
        status, doc = complete(srv, "swapped", PROMPTS["gemma"])
        assert status == 200
        (tmp_path / "new.gguf").hardlink_to(gemma_path)
        os.replace(tmp_path / "new.gguf", swapped)
        status, doc = complete(srv, "swapped", PROMPTS["gemma"])
        assert status == 200 and doc["content"] == expected["gemma"]
        # keep_alive 0 (the table's): unloaded once idle
        deadline = time.monotonic() + 30
        while states(srv)["swapped"]["value"] != "unloaded" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert states(srv)["swapped"]["value"] == "unloaded"
        # a truncated file made whole again (renamed over) is tried again
        (tmp_path / "fixed.gguf").hardlink_to(smollm2_path)
        os.replace(tmp_path / "fixed.gguf", truncated)
        status, doc = complete(srv, "truncated", PROMPTS["smol"])
        assert status == 200 and doc["content"] == expected["smol"]
        assert srv.proc.poll() is None
    finally:
        srv.terminate()
        srv.kill()


def test_a_request_keep_alive_unloads_its_model(smollm2_path: Path, gemma_path: Path) -> None:
    srv = ServerProc("-m", f"smol={smollm2_path}", "-m", f"gemma={gemma_path}", engine=ENGINE)
    try:
        srv.wait_ready()
        assert complete(srv, "smol", "Hi", 2, keep_alive=0)[0] == 200
        deadline = time.monotonic() + 30
        while states(srv)["smol"]["value"] != "unloaded" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert states(srv)["smol"]["value"] == "unloaded"
        status = complete(srv, "smol", "Hi", 2, keep_alive="5m")[0]
        assert status == 200 and states(srv)["smol"]["value"] == "loaded"
        assert complete(srv, "smol", "Hi", 2, keep_alive="soon")[0] == 400
    finally:
        srv.terminate()
        srv.kill()


def test_an_encoder_among_models_serves_embeddings_within_its_positions(smollm2_path: Path,
                                                                        minilm: dict[str, Path]) -> None:
    """`serve -m chat=FILE -m mini=BERT -c 1024`: the encoder's own file says it embeds (no table needed), and
    the service-wide -c, past its 512 positions, is its positions for it; chat still runs at 1024."""
    srv = ServerProc("-m", f"chat={smollm2_path}", "-m", f"mini={minilm['q8_0']}", "-c", "1024", engine=ENGINE)
    try:
        srv.wait_ready()
        status, r = call(srv, "POST", "/v1/embeddings", {"model": "mini", "input": ["a cat", "a dog"]})
        assert status == 200 and len(r["data"]) == 2 and len(r["data"][0]["embedding"]) == 384, r
        assert complete(srv, "chat", "Hi", 2)[0] == 200
        props = call(srv, "GET", "/props?model=mini")[1]
        assert props["default_generation_settings"]["n_ctx"] == 512, props
    finally:
        srv.terminate()
        srv.kill()


def test_a_model_that_fits_not_even_alone_is_refused_at_start(smollm2_path: Path, gemma_path: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "edgellama.cli", "serve", "--socket", "/tmp/elsv-never.sock",
                        *ENGINE, "-m", f"smol={smollm2_path}", "-m", f"gemma={gemma_path}", "--mem-budget", "300M"],
                       capture_output=True, text=True, timeout=120, env=cli_env(), check=False)
    assert r.returncode == 1
    assert "model gemma does not fit the memory budget" in r.stderr and "KV cache" in r.stderr
    assert not os.path.exists("/tmp/elsv-never.sock")


def test_info_plan_on_the_same_flags(smollm2_path: Path, gemma_path: Path) -> None:
    argv = [sys.executable, "-m", "edgellama.cli", "info", "--plan", *ENGINE, "-m", f"smol={smollm2_path}",
            "-m", f"gemma={gemma_path}", "--mem-budget"]
    r = subprocess.run([*argv, f"{BUDGET_MIB}M"], capture_output=True, text=True, timeout=120, env=cli_env(),
                       check=False)
    assert r.returncode == 0, r.stderr
    assert "model smol" in r.stdout and "model gemma" in r.stdout and "take turns" in r.stdout
    r = subprocess.run([*argv, "2G", "--json"], capture_output=True, text=True, timeout=120, env=cli_env(),
                       check=False)
    doc = json.loads(r.stdout)["plans"]
    assert [s["models"] for s in doc["fit_together"]] == [["smol", "gemma"]]
    r = subprocess.run([*argv, "300M"], capture_output=True, text=True, timeout=120, env=cli_env(), check=False)
    assert r.returncode == 1 and "gemma: does NOT fit even alone" in r.stdout


def test_models_dir_names_models_after_files(smollm2_path: Path, tmp_path: Path) -> None:
    (tmp_path / "tiny-chat.gguf").symlink_to(smollm2_path)
    (tmp_path / "mmproj-x.gguf").write_bytes(b"not a model")
    (tmp_path / "notes.txt").write_text("x")
    srv = ServerProc("--models-dir", str(tmp_path), engine=ENGINE)
    try:
        srv.wait_ready()
        assert list(states(srv)) == ["tiny-chat"]
        status, doc = complete(srv, None, "Hi", 2)  # no model field: the default
        assert status == 200 and doc["model"] == "tiny-chat"
    finally:
        srv.terminate()
        srv.kill()

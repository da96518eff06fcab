"""logit_bias (issue 36): OpenAI's map and llama-server's list forms (token ids or texts; false bans), added to
the logits before llama.cpp's chain, in the Python API, `run -l`, protocol v1 and HTTP, on the real SmolLM2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgellama import params as R
from tests.service_util import FAST, ServerProc, cli_env
from tests.test_service_http import call

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def smol(smollm2_path: Path) -> Any:
    from edgellama.llm import LLM

    with LLM(smollm2_path, n_ctx=256, n_threads=1, n_batch=64) as llm:
        yield llm


def greedy(llm: Any, n: int = 6, **kw: Any) -> list[int]:
    out = llm.create_completion(PROMPT, max_tokens=n, temperature=0, **kw)["choices"][0]["text"]
    return llm.tokenize(out, add_bos=False)


def first_logits(llm: Any) -> np.ndarray:
    llm.reset()
    return np.array(llm.eval(llm.tokenize(PROMPT)), dtype=np.float64).reshape(-1)[-llm.n_vocab:]


def test_forms_are_checked() -> None:
    p = R.check(R.GenParams(logit_bias={"15": -5, 16: 2.5, "Paris": False}), R.OPENAI)
    assert p.logit_bias == [(15, -5.0), (16, 2.5), ("Paris", float("-inf"))]
    assert R.check(R.GenParams(logit_bias=[[15, False], ["x", 1]]), R.V1).logit_bias == [(15, float("-inf")),
                                                                                           ("x", 1.0)]
    for bad in (3, [[1]], [[True, 1]], [[1, "a"]], [[-2, 1]], [[1, float("inf")]], {"a": None},
                [[i, 1] for i in range(R.MAX_BIASES + 1)]):
        with pytest.raises(R.ParamError, match="'logit_bias' must be"):
            R.check(R.GenParams(logit_bias=bad), R.OPENAI)


def test_a_banned_token_gives_the_next_best_and_a_bias_can_force_one(smol: Any) -> None:
    logits = first_logits(smol)
    order = np.argsort(-logits)
    best, second = int(order[0]), int(order[1])
    assert greedy(smol)[0] == best
    assert greedy(smol, logit_bias={best: False})[0] == second
    assert greedy(smol, logit_bias={str(best): -1e9})[0] == second  # OpenAI's string keys
    # a bias of exactly the gap makes a tie, a hair more makes the third-ranked token win
    third = int(order[2])
    gap = float(logits[best] - logits[third])
    assert greedy(smol, logit_bias={third: gap + 0.01})[0] == third
    forced = smol.tokenize(" banana", add_bos=False)[0]
    assert set(greedy(smol, 4, logit_bias={forced: 100.0})) == {forced}
    with pytest.raises(R.ParamError, match="token id 999999 is out of range"):
        greedy(smol, logit_bias={999999: 1.0})


def test_a_text_biases_each_of_its_tokens(smol: Any) -> None:
    best = int(np.argmax(first_logits(smol)))
    text = smol.detokenize([best]).decode()
    assert greedy(smol, logit_bias=[[text, False]])[0] != best


def test_run_takes_llama_clis_flag(smollm2_path: Path, smol: Any) -> None:
    best = int(np.argmax(first_logits(smol)))
    base = [sys.executable, "-m", "edgellama.cli", "run", "-m", str(smollm2_path), "-p", PROMPT, "-n", "3",
            "--temp", "0", "-c", "256", "-t", "1", "--json"]

    def tokens(argv: list[str]) -> list[int]:
        out = subprocess.run(argv, capture_output=True, text=True, env=cli_env(), check=True, timeout=120).stdout
        return [ev["id"] for ev in map(json.loads, out.splitlines()) if ev["event"] == "token"]

    assert tokens(base)[0] == best
    assert tokens([*base, "-l", f"{best}-inf"])[0] != best
    r = subprocess.run([*base, "-l", "12x"], capture_output=True, text=True, env=cli_env(), check=False, timeout=120)
    assert r.returncode == 2 and "TOKEN_ID+BIAS" in r.stderr


def test_service_forms(smollm2_path: Path, smol: Any) -> None:
    best = int(np.argmax(first_logits(smol)))
    srv = ServerProc("-m", str(smollm2_path), engine=FAST)
    try:
        srv.wait_ready()
        body = {"prompt": PROMPT, "n_predict": 3, "temperature": 0, "return_tokens": False}
        status, plain = call(srv, "POST", "/completion", body)
        assert status == 200
        status, banned = call(srv, "POST", "/completion", body | {"logit_bias": [[best, False]]})
        assert status == 200 and banned["content"] != plain["content"]
        assert banned["generation_settings"]["logit_bias"] == [[best, False]]
        status, oai = call(srv, "POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": 3, "temperature": 0,
                                                             "logit_bias": {str(best): -100}})
        assert status == 200 and oai["choices"][0]["text"] == banned["content"]
        with srv.connect() as c:
            events = c.ask({"id": 1, "prompt": PROMPT, "n_predict": 3, "temperature": 0,
                            "logit_bias": {str(best): -100}})
            assert "".join(e["text"] for e in events if e["event"] == "token") == banned["content"]
            err = c.ask({"id": 2, "prompt": PROMPT, "logit_bias": {"999999": 1}})[-1]
            assert err["code"] == "bad_request" and "token id 999999 is out of range" in err["message"]
            err = c.ask({"id": 3, "prompt": PROMPT, "logit_bias": "x"})[-1]
            assert err["code"] == "bad_request" and "'logit_bias' must be" in err["message"]
        status, doc = call(srv, "POST", "/completion", body | {"logit_bias": {"x": "y"}})
        assert status == 400 and "logit_bias" in doc["error"]["message"]
    finally:
        srv.terminate()
        srv.kill()

"""Token log-probabilities (issue 36): the log-softmax of the logits a token was drawn from, in llama-cpp-
python's, llama-server's and OpenAI's shapes, through the Python API, protocol v1 and HTTP (and the openai
SDK), on the real SmolLM2; equal to llama.cpp's logits' log-softmax with --numerics llamacpp."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgellama.logprobs import TokenProbs, drawn_probs, token_probs
from edgellama.sampling import Sampler, SamplerParams
from tests.service_util import FAST, ServerProc, openai_over_unix_socket
from tests.test_service_http import call, curl, sse_data

PROMPT = "The capital of France is"
N = 4


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    m = x.max()
    return x - (m + math.log(np.exp(x - m).sum()))


@pytest.fixture(scope="module")
def smol(smollm2_path: Path) -> Any:
    from edgellama.llm import LLM

    with LLM(smollm2_path, n_ctx=256, n_threads=1, n_batch=64) as llm:
        yield llm


def test_token_probs_is_a_log_softmax() -> None:
    x = np.array([1.0, 3.0, 3.0, -2.0, 0.5], dtype=np.float32)
    p = token_probs(x, 4, 3)
    want = log_softmax(x)
    assert p.id == 4 and p.logprob == pytest.approx(want[4], abs=1e-12)
    assert [i for i, _ in p.top] == [1, 2, 0]  # ties: the lower id first
    assert sum(math.exp(lp) for lp in [*(lp for _, lp in p.top), p.logprob, want[3]]) == pytest.approx(1.0)
    assert token_probs(x, 0, 0).top == ()


def test_post_sampling_probs_are_the_drawn_candidates() -> None:
    """drawn_probs: the chain's candidates as probabilities (llama-server's post_sampling_probs)."""
    logits = np.array([0.0, 3.0, 1.0, 2.0, -1.0], dtype=np.float32)
    sampler = Sampler(SamplerParams(temp=0.5, top_k=3, top_p=1.0, min_p=0.0, seed=3))
    sampler.keep_draw = True
    tok = sampler.sample(logits)
    assert sampler.last_draw is not None
    p = drawn_probs(*sampler.last_draw, tok, 2)
    want = np.exp(np.array([3.0, 2.0, 1.0]) / 0.5)
    want /= want.sum()
    assert [t for t, _ in p.top] == [1, 3] and [q for _, q in p.top] == pytest.approx(list(want[:2]))
    assert p.logprob == pytest.approx(want[[1, 3, 2].index(tok)]) and p.post_sampling
    greedy = Sampler(SamplerParams(temp=0.0))  # llama.cpp's temperature 0 leaves the top token alone
    greedy.keep_draw = True
    tok = greedy.sample(logits)
    assert greedy.last_draw is not None and tok == 1
    assert drawn_probs(*greedy.last_draw, tok, 3) == TokenProbs(1, 1.0, ((1, 1.0),), post_sampling=True)


def test_python_api_completion_logprobs(smol: Any) -> None:
    out = smol.create_completion(PROMPT, max_tokens=N, temperature=0, logprobs=3)["choices"][0]
    lp = out["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == N
    assert "".join(lp["tokens"]) == out["text"]
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(N)]
    smol.reset()
    first = np.array(smol.eval(smol.tokenize(PROMPT)), dtype=np.float64).reshape(-1)[-smol.n_vocab:]
    want = log_softmax(first)
    best = int(np.argmax(first))
    assert lp["tokens"][0] == smol.detokenize([best]).decode()
    assert lp["token_logprobs"][0] == pytest.approx(want[best], abs=1e-6)
    top = lp["top_logprobs"][0]
    assert len(top) == 3 and max(top.values()) == pytest.approx(lp["token_logprobs"][0])  # greedy: the top one
    for step in range(N):  # greedy: every token is its step's most likely
        assert lp["token_logprobs"][step] == pytest.approx(max(lp["top_logprobs"][step].values()))
        assert lp["token_logprobs"][step] <= 0.0
    # logit_bias moves the draw, not the reported distribution (llama-server's n_probs: the model's logits)
    banned = smol.create_completion(PROMPT, max_tokens=1, temperature=0, logprobs=2,
                                    logit_bias={best: False})["choices"][0]["logprobs"]
    second = int(np.argsort(-first)[1])
    assert banned["token_logprobs"][0] == pytest.approx(want[second], abs=1e-6)
    plain = smol.create_completion(PROMPT, max_tokens=N, temperature=0)["choices"][0]
    assert plain["logprobs"] is None and plain["text"] == out["text"]
    with pytest.raises(ValueError, match="0..20"):
        smol.create_completion(PROMPT, logprobs=21)


def test_python_api_echo_logprobs(smol: Any) -> None:
    """echo with logprobs: the prompt's tokens first, each one's log-probability given those before it (the
    first null, as OpenAI's); each equals what a one-token completion of the prompt so far reports for it
    (logit_bias forces the token and leaves the logprobs alone)."""
    ids = smol.tokenize(PROMPT)
    out = smol.create_completion(PROMPT, max_tokens=N, temperature=0, logprobs=2, echo=True)["choices"][0]
    lp = out["logprobs"]
    skip = 1 if ids[0] == smol.tokenizer.bos_id else 0
    n_prompt = len(ids) - skip
    assert len(lp["tokens"]) == n_prompt + N and out["text"].startswith(PROMPT)
    assert "".join(lp["tokens"]) == out["text"]
    assert lp["text_offset"] == [sum(len(t) for t in lp["tokens"][:i]) for i in range(len(lp["tokens"]))]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    for k in range(skip + 1, len(ids)):
        alone = smol.create_completion(ids[:k], max_tokens=1, temperature=0, logprobs=0,
                                       logit_bias={ids[k]: 100.0})["choices"][0]["logprobs"]
        assert lp["token_logprobs"][k - skip] == pytest.approx(alone["token_logprobs"][0], abs=2e-3)
    plain = smol.create_completion(PROMPT, max_tokens=N, temperature=0, logprobs=2)["choices"][0]["logprobs"]
    assert lp["tokens"][n_prompt:] == plain["tokens"]
    assert lp["token_logprobs"][n_prompt:] == pytest.approx(plain["token_logprobs"], abs=1e-6)


def test_python_api_chat_logprobs(smol: Any) -> None:
    msgs = [{"role": "user", "content": "Say hi."}]
    out = smol.create_chat_completion(msgs, max_tokens=N, temperature=0, logprobs=True, top_logprobs=2)
    content = out["choices"][0]["logprobs"]["content"]
    assert "".join(c["token"] for c in content) == out["choices"][0]["message"]["content"]
    assert all(len(c["top_logprobs"]) == 2 and bytes(c["bytes"]).decode() == c["token"] for c in content)
    chunks = list(smol.create_chat_completion(msgs, max_tokens=N, temperature=0, logprobs=True, top_logprobs=2,
                                              stream=True))
    streamed = [c for ch in chunks if ch["choices"][0]["logprobs"] for c in ch["choices"][0]["logprobs"]["content"]]
    assert [c["token"] for c in streamed] == [c["token"] for c in content]
    assert [c["logprob"] for c in streamed] == pytest.approx([c["logprob"] for c in content])
    with pytest.raises(ValueError, match="top_logprobs"):
        smol.create_chat_completion(msgs, top_logprobs=2)


@pytest.mark.slow
def test_logprobs_equal_llama_cpps_with_its_numerics(smollm2_path: Path, peer_site: Path) -> None:
    from llamacpp_peer import llamacpp_run, site_numerics

    from edgellama.llm import LLM

    with LLM(smollm2_path, n_ctx=256, n_threads=1, numerics=site_numerics(peer_site)) as llm:
        ids = llm.tokenize(PROMPT)
        out = llm.create_completion(ids, max_tokens=3, temperature=0, logprobs=5)["choices"][0]["logprobs"]
        gen = [llm.tokenize(t, add_bos=False) for t in out["tokens"]]
    assert all(len(g) == 1 for g in gen)
    toks = [g[0] for g in gen]
    run = llamacpp_run(peer_site, smollm2_path, [ids], n_ctx=256, n_greedy=3, kv_type="f16")
    assert run.greedy[0] == toks  # the same draws
    want = log_softmax(run.logits[0][-1])  # the prompt's last logits, bit for bit ours (llama.cpp numerics)
    assert out["token_logprobs"][0] == pytest.approx(want[toks[0]], abs=1e-9)
    top_ids = np.argsort(-want, kind="stable")[:5]
    assert list(out["top_logprobs"][0].values()) == pytest.approx([want[i] for i in top_ids], abs=1e-9)
    # post-sampling (top-k 5, temperature 0.7): llama.cpp's chain on its own logits, softmax over the five
    logits = np.asarray(run.logits[0][-1], dtype=np.float64)
    kept = logits[top_ids] / 0.7
    chain = np.exp(kept - kept.max()) / np.exp(kept - kept.max()).sum()
    sampler = Sampler(SamplerParams(temp=0.7, top_k=5, top_p=1.0, min_p=0.0, seed=1))
    sampler.keep_draw = True
    tok = sampler.sample(np.asarray(run.logits[0][-1], dtype=np.float32))
    assert sampler.last_draw is not None
    post = drawn_probs(*sampler.last_draw, tok, 5)
    assert [t for t, _ in post.top] == [int(i) for i in top_ids]
    assert [p for _, p in post.top] == pytest.approx(list(chain), abs=1e-6)  # llama.cpp's chain is float32


def test_service_logprobs(smollm2_path: Path, smol: Any) -> None:
    api = smol.create_completion(PROMPT, max_tokens=N, temperature=0, logprobs=2)["choices"][0]["logprobs"]
    srv = ServerProc("-m", str(smollm2_path), engine=FAST)
    try:
        srv.wait_ready()
        status, r = call(srv, "POST", "/completion", {"prompt": PROMPT, "n_predict": N, "temperature": 0,
                                                      "n_probs": 2})
        assert status == 200
        probs = r["completion_probabilities"]
        assert [p["token"] for p in probs] == api["tokens"]
        assert [p["logprob"] for p in probs] == pytest.approx(api["token_logprobs"], abs=1e-6)
        assert all(len(p["top_logprobs"]) == 2 and {"id", "token", "bytes", "logprob"} <= set(p["top_logprobs"][0])
                   for p in probs)
        stream = [json.loads(d) for d in sse_data(curl(srv, "/completion", {
            "prompt": PROMPT, "n_predict": N, "temperature": 0, "n_probs": 2, "stream": True}))]
        streamed = [p for ev in stream for p in ev.get("completion_probabilities", [])]
        assert [p["logprob"] for p in streamed] == pytest.approx(api["token_logprobs"], abs=1e-6)
        status, r = call(srv, "POST", "/v1/completions", {"prompt": PROMPT, "max_tokens": N, "temperature": 0,
                                                          "logprobs": 2})
        assert status == 200 and r["choices"][0]["logprobs"]["tokens"] == api["tokens"]
        assert r["choices"][0]["logprobs"]["token_logprobs"] == pytest.approx(api["token_logprobs"], abs=1e-6)
        with srv.connect() as c:
            events = c.ask({"id": 1, "prompt": PROMPT, "n_predict": N, "temperature": 0, "logprobs": True})
            got = [p for e in events for p in e.get("probs", [])]
            assert [p["logprob"] for p in got] == pytest.approx(api["token_logprobs"], abs=1e-6)
            assert all(p["top_logprobs"] == [] for p in got)
            err = c.ask({"id": 2, "prompt": PROMPT, "n_probs": 21})[-1]
            assert err["code"] == "bad_request" and "'n_probs' must be an integer in 0..20" in err["message"]
        bad = {"messages": [{"role": "user", "content": "x"}], "logprobs": True, "top_logprobs": 21}
        status, r = call(srv, "POST", "/v1/chat/completions", bad)
        assert status == 400 and "'top_logprobs'" in r["error"]["message"]
        status, r = call(srv, "POST", "/v1/chat/completions", bad | {"logprobs": False, "top_logprobs": 1})
        assert status == 400
        # post_sampling_probs: the candidates top-k (3) and temperature (0.7) left, as probabilities; the
        # first step's are the softmax of the three most likely tokens' logprobs over the temperature
        status, r = call(srv, "POST", "/completion", {"prompt": PROMPT, "n_predict": N, "temperature": 0.7, "top_k": 3,
                                                      "top_p": 1.0, "min_p": 0.0, "seed": 5, "n_probs": 3,
                                                      "post_sampling_probs": True})
        assert status == 200
        post = r["completion_probabilities"]
        assert len(post) == N and all({"prob", "top_probs"} <= set(p) and "logprob" not in p for p in post)
        status, pre = call(srv, "POST", "/completion", {"prompt": PROMPT, "n_predict": 1, "temperature": 0,
                                                        "n_probs": 3})
        top3 = np.array([t["logprob"] for t in pre["completion_probabilities"][0]["top_logprobs"]])
        want = np.exp(top3 / 0.7) / np.exp(top3 / 0.7).sum()
        assert [t["prob"] for t in post[0]["top_probs"]] == pytest.approx(list(want), abs=1e-6)
        assert [t["id"] for t in post[0]["top_probs"]] == [t["id"] for t in pre["completion_probabilities"][0]["top_logprobs"]]
        for p in post:  # the drawn token is one of the candidates, with its probability
            assert sum(t["prob"] for t in p["top_probs"]) == pytest.approx(1.0, abs=1e-6)
            assert p["prob"] == next(t["prob"] for t in p["top_probs"] if t["id"] == p["id"])
        status, r = call(srv, "POST", "/completion", {"prompt": PROMPT, "n_predict": 2, "temperature": 0, "n_probs": 4,
                                                      "post_sampling_probs": True})  # greedy: the top token alone
        assert [(len(p["top_probs"]), p["prob"]) for p in r["completion_probabilities"]] == [(1, 1.0), (1, 1.0)]
        status, r = call(srv, "POST", "/v1/completions", {"prompt": PROMPT, "logprobs": 2, "post_sampling_probs": True})
        assert status == 400 and "post_sampling_probs" in r["error"]["message"]
        with openai_over_unix_socket(srv.path) as client:
            out = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Say hi."}],
                                                 max_tokens=N, temperature=0, logprobs=True, top_logprobs=2)
            content = out.choices[0].logprobs.content
            assert "".join(c.token for c in content) == out.choices[0].message.content
            assert all(len(c.top_logprobs) == 2 and c.logprob <= 0 for c in content)
            parts = list(client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Say hi."}],
                                                        max_tokens=N, temperature=0, logprobs=True, stream=True))
            streamed_lp = [c.logprob for p in parts if p.choices and p.choices[0].logprobs
                           for c in p.choices[0].logprobs.content or []]
            assert streamed_lp == pytest.approx([c.logprob for c in content], abs=1e-6)
    finally:
        srv.terminate()
        srv.kill()

"""Several sequences in one forward pass (edgellama.slots over Engine.decode) on the real models, and
the service's --parallel slots over the real UNIX socket."""

from __future__ import annotations

import hashlib
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgellama.llm import LLM
from edgellama.native.lib import KernelError
from edgellama.slots import Slots

N_CTX = 40  # small: the longest sequence below shifts its context
N_BATCH = 16  # small: prompts take several passes, next to other slots' decode tokens
PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "Once upon a time, in a quiet village by the sea,",
           "1, 2, 3, 4,"]
N_GEN = [8, 36, 5, 8]  # sequence 1 outgrows the context of 40 and shifts
JOIN = [0, 0, 3, 9]  # the step at which each sequence starts; 3 takes the slot 2 leaves


def _digest(logits: np.ndarray) -> str:
    return hashlib.sha256(logits.tobytes()).hexdigest()  # bit for bit, without keeping 1 MB rows


def _solo(llm: LLM, prompt: list[int], n_gen: int) -> tuple[list[int], list[str]]:
    """Greedy tokens and the digests of the logits they were picked from, the sequence alone."""
    llm.reset()
    logits = llm.prefill(prompt)
    toks, seen = [], []
    for _ in range(n_gen):
        seen.append(_digest(logits))
        toks.append(int(np.argmax(logits)))
        logits = llm.eval([toks[-1]])
    return toks, seen


@pytest.mark.parametrize("model", ["smollm2", "gemma"])
def test_each_sequence_stepped_together_gives_its_solo_tokens_and_logits(model: str, request: Any) -> None:
    path = request.getfixturevalue(f"{model}_path")
    with LLM(path, n_ctx=N_CTX, n_batch=N_BATCH, n_threads=1, n_keep=4) as solo_llm:
        prompts = [solo_llm.tokenizer.encode(p, add_special=True) for p in PROMPTS]
        want = [_solo(solo_llm, p, n) for p, n in zip(prompts, N_GEN)]
        assert solo_llm.n_shifts > 0  # the long sequence did shift
    with LLM(path, n_ctx=N_CTX, n_batch=N_BATCH, n_threads=2, n_keep=4, n_seq=3) as llm:
        slots = Slots(llm)
        got: list[list[int]] = [[] for _ in PROMPTS]
        seen: list[list[str]] = [[] for _ in PROMPTS]
        where: dict[int, int] = {}  # sequence -> slot
        max_together = 0
        for step in range(400):
            for q in range(len(PROMPTS)):
                if q not in where and step >= JOIN[q] and len(got[q]) < N_GEN[q]:
                    slot = slots.best_slot(prompts[q])
                    if slot is not None:
                        slots.start(slot, prompts[q])
                        where[q] = slot.index
            if not where:
                if all(len(g) == n for g, n in zip(got, N_GEN)):
                    break
                continue
            max_together = max(max_together, len(where))
            ready = slots.step()
            for q, i in list(where.items()):
                if i not in ready:
                    continue
                seen[q].append(_digest(ready[i]))
                got[q].append(int(np.argmax(ready[i])))
                if len(got[q]) == N_GEN[q]:
                    slots.release(slots.slots[i])
                    del where[q]
                else:
                    slots.feed(slots.slots[i], got[q][-1])
        assert max_together == 3 and sum(s.seq.n_shifts for s in slots.slots) > 0  # together, and one shifted
        for q in range(len(PROMPTS)):
            assert got[q] == want[q][0], f"sequence {q}: tokens differ from its run alone"
            assert seen[q] == want[q][1], f"sequence {q}: logits differ from its run alone"


def test_the_plan_counts_every_slot_and_a_budget_too_small_for_them_is_refused(smollm2_path: Path) -> None:
    from edgellama.memplan import BudgetError, make_plan

    with LLM(smollm2_path, n_ctx=128, n_batch=32, n_threads=1, n_seq=4) as llm:
        one = make_plan(llm.desc, 128, 32, "f16", 1)
        four = make_plan(llm.desc, 128, 32, "f16", 1, n_seq=4)
        assert four.kv_cache == 4 * one.kv_cache == llm.engine.kv_bytes and four.scratch == one.scratch
        assert four.n_seq == 4 and "x 4 slots" in four.table()
        budget = four.total - 1  # one slot fits, four do not
        with pytest.raises(BudgetError, match="for each of 4 slots"):
            LLM(smollm2_path, n_ctx=128, n_batch=32, n_threads=1, n_seq=4, mem_budget=budget)
        # the engine refuses what a batch cannot mean, naming it
        with pytest.raises(ValueError, match="sequence id"):
            llm.engine.decode([4], [1], [0], [True])
        with pytest.raises(KernelError, match="continue each sequence"):
            llm.engine.decode([0, 1], [1, 1], [0, 5], [True, True])
        llm.engine.set_numerics("llamacpp")
        with pytest.raises(ValueError, match="one sequence per batch"):
            llm.engine.decode([0, 1], [1, 1], [0, 0], [True, True])
        assert llm.engine.decode([2], [1], [0], [True]).shape == (1, llm.n_vocab)


# ---- the service: `edgellama serve --parallel 3` over the real UNIX socket ----
SERVE_PROMPTS = ["The capital of France is", "Water boils at", "The three primary colors are"]
LONG = 150  # n_predict of a request meant to still be running when the test acts on it (greedy:
# sampled, a request can end at once with an end-of-text and be done before the test acts on it)


@pytest.fixture(scope="module")
def parallel_server(smollm2_path: Path) -> Any:
    from tests.service_util import ServerProc

    srv = ServerProc("-m", str(smollm2_path), "--parallel", "3", "--max-tokens", str(LONG), "--log-format", "json",
                     engine=["-c", "256", "-t", "2", "-b", "64"])
    try:
        srv.wait_ready()
        yield srv
    finally:
        srv.kill()


def _logged(srv: Any, req_id: str) -> list[dict[str, Any]]:
    return [r for r in srv.records() if r.get("id") == req_id]


def test_parallel_slots_serve_concurrent_clients_their_solo_answers(parallel_server: Any) -> None:
    from tests.service_util import text_of

    srv = parallel_server
    solo = []
    for i, p in enumerate(SERVE_PROMPTS):  # one at a time: each alone in the engine
        with srv.connect() as c:
            solo.append(text_of(c.ask({"id": f"solo{i}", "prompt": p, "n_predict": 12, "temperature": 0,
                                       "cache_prompt": False})))
    got: dict[int, str] = {}
    conns = [srv.connect() for _ in SERVE_PROMPTS]
    try:
        for i, (c, p) in enumerate(zip(conns, SERVE_PROMPTS)):
            c.send({"id": f"par{i}", "prompt": p, "n_predict": 12, "temperature": 0, "cache_prompt": False})

        def read(i: int) -> None:
            got[i] = text_of(conns[i].until_final({f"par{i}"})[f"par{i}"])

        threads = [threading.Thread(target=read, args=(i,)) for i in range(len(conns))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        for c in conns:
            c.close()
    assert [got.get(i) for i in range(len(SERVE_PROMPTS))] == solo
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and len({r.get("slot") for i in range(3) for r in _logged(srv, f"par{i}")}) < 3:
        time.sleep(0.05)
    assert {r.get("slot") for i in range(3) for r in _logged(srv, f"par{i}")} == {0, 1, 2}  # in three slots at once
    assert srv.health()["slots"] == 3


def test_parallel_a_dropped_client_frees_its_slot_while_others_run(parallel_server: Any) -> None:
    srv = parallel_server
    with srv.connect() as keep:
        keep.send({"id": "stays", "prompt": "Count: one, two,", "n_predict": 40, "temperature": 0})
        gone = srv.connect()
        gone.send({"id": "leaves", "prompt": "Describe the sea at length.", "n_predict": LONG, "temperature": 0})
        assert gone.event()["event"] == "token"
        gone.close()
        events = keep.until_final({"stays"})["stays"]
    assert events[-1]["event"] == "done" and events[-1]["tokens_predicted"] == 40
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and (not _logged(srv, "leaves") or srv.health()["slots_busy"]):
        time.sleep(0.05)
    logged = _logged(srv, "leaves")
    assert logged and logged[-1]["outcome"] == "cancelled" and logged[-1]["n_predicted"] < LONG
    assert srv.health()["slots_busy"] == 0


def test_parallel_a_prompt_too_long_errors_only_its_request(parallel_server: Any) -> None:
    srv = parallel_server
    with srv.connect() as c:
        c.send({"id": "ok", "prompt": "Red, green,", "n_predict": 20, "temperature": 0})
        c.send({"id": "long", "prompt": "word " * 400, "n_predict": 4})
        got = c.until_final({"ok", "long"})
    assert got["long"][-1]["event"] == "error" and got["long"][-1]["code"] == "context"
    assert got["ok"][-1]["event"] == "done" and got["ok"][-1]["tokens_predicted"] == 20


def test_parallel_grammars_constrain_their_own_slot_only(parallel_server: Any) -> None:
    """Grammar and JSON-schema requests side by side with a free one, each in its own slot: every output
    inside its own grammar, the free one unconstrained, a grammar error ends only its request."""
    from tests.service_util import text_of

    srv = parallel_server
    reqs = {"yn": {"prompt": "Is the sky blue? Answer:", "grammar": 'root ::= " yes" | " no"', "seed": 1},
            "num": {"prompt": "Three digits:", "grammar": "root ::= [0-9]{3}", "seed": 2},
            "free": {"prompt": SERVE_PROMPTS[0], "n_predict": 12, "temperature": 0}}
    conns = {k: srv.connect() for k in reqs}
    got: dict[str, list[dict[str, Any]]] = {}
    try:
        for k, c in conns.items():
            c.send({"id": k, **reqs[k]})

        def read(k: str) -> None:
            got[k] = conns[k].until_final({k})[k]

        threads = [threading.Thread(target=read, args=(k,)) for k in conns]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        for c in conns.values():
            c.close()
    assert got["yn"][-1]["stop_reason"] == "eos" and text_of(got["yn"]) in (" yes", " no"), got["yn"]
    num = text_of(got["num"])
    assert got["num"][-1]["stop_reason"] == "eos" and len(num) == 3 and num.isdigit(), got["num"]
    assert got["free"][-1]["event"] == "done" and text_of(got["free"]), got["free"]
    with srv.connect() as c:
        bad = c.ask({"id": "bad", "prompt": "x", "grammar": 'root ::= "a" b'})[-1]
    assert bad["code"] == "bad_request" and "undefined rule 'b'" in bad["message"], bad
    assert srv.health()["status"] == "ok"

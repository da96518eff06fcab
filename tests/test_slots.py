"""Several sequences in one forward pass (edgellama.slots over Engine.decode) on the real models, and
the service's --parallel slots over the real UNIX socket."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from edgellama.llm import LLM
from edgellama.slots import Slots

N_CTX = 64  # small: the longest sequence below shifts its context
N_BATCH = 16  # small: prompts take several passes, next to other slots' decode tokens
PROMPTS = ["The capital of France is", "def fibonacci(n):\n    ", "Once upon a time, in a quiet village by the sea,",
           "1, 2, 3, 4,"]
N_GEN = [10, 64, 6, 12]  # sequence 1 outgrows the context of 64 and shifts
JOIN = [0, 0, 3, 9]  # the step at which each sequence starts; 3 takes the slot 2 leaves


def _solo(llm: LLM, prompt: list[int], n_gen: int) -> tuple[list[int], list[np.ndarray]]:
    """Greedy tokens and the logits they were picked from, the sequence alone."""
    llm.reset()
    logits = llm.prefill(prompt)
    toks, seen = [], []
    for _ in range(n_gen):
        seen.append(logits.copy())
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
        seen: list[list[np.ndarray]] = [[] for _ in PROMPTS]
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
                seen[q].append(ready[i].copy())
                got[q].append(int(np.argmax(ready[i])))
                if len(got[q]) == N_GEN[q]:
                    slots.release(slots.slots[i])
                    del where[q]
                else:
                    slots.feed(slots.slots[i], got[q][-1])
        assert max_together == 3 and sum(s.n_shifts for s in slots.slots) > 0  # together, and one shifted
        for q in range(len(PROMPTS)):
            assert got[q] == want[q][0], f"sequence {q}: tokens differ from its run alone"
            for a, b in zip(seen[q], want[q][1]):
                assert np.array_equal(a, b), f"sequence {q}: logits differ from its run alone"

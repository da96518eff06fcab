"""Several sequences stepped together on one LLM: a slot per sequence of its engine, each with the
tokens its KV cache holds and the tokens still to evaluate; step() runs one forward pass over all of
them (every slot's pending decode token first, then prompt chunks within the per-step token budget)
and returns the logits of the slots that are ready to sample.

Knows nothing of sampling, requests or sockets (the service's scheduler drives it). In native
numerics a slot's logits are the ones it would get alone: the engine promises that bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from edgellama.native.lib import KernelError


class SlotContextFull(ValueError):
    """A slot's next tokens do not fit its context (no context shift, or --keep leaves no room)."""


@dataclass
class Slot:
    index: int
    tokens: list[int] = field(default_factory=list)  # what the slot's KV cache holds, position i = tokens[i]
    pending: list[int] = field(default_factory=list)  # to evaluate, in order; logits wanted for the last
    busy: bool = False
    n_shifts: int = 0


class Slots:
    """The sequences of llm.engine (LLM(..., n_seq=N)) as slots. Slot 0 is sequence 0, which the LLM's
    own calls use: it starts out holding llm.tokens, so a prompt cached there (a system prompt) is
    reused. Not thread-safe: one driver (the engine thread)."""

    def __init__(self, llm: Any) -> None:
        self.llm = llm
        self.engine = llm.engine
        self.n_ctx: int = llm.n_ctx
        self.slots = [Slot(i) for i in range(self.engine.n_seq)]
        self.slots[0].tokens = list(llm.tokens)
        self.budget: int = llm.n_batch  # tokens per forward pass

    def __len__(self) -> int:
        return len(self.slots)

    def best_slot(self, prompt: list[int], scales: list[float] | None = None) -> Slot | None:
        """The idle slot whose cache shares the longest prefix with prompt (prefix reuse per slot), among
        caches computed with these LoRA adapter scales (None: the start-up ones) first."""
        idle = [s for s in self.slots if not s.busy]
        if not idle:
            return None
        want = self._scales(scales)
        return max(idle, key=lambda s: (self.llm.seq_scales(s.index) == want,
                                        common_prefix(s.tokens, prompt), -s.index))

    def _scales(self, scales: list[float] | None) -> tuple[float, ...]:
        return tuple(self.llm.lora_scales) if scales is None else tuple(float(x) for x in scales)

    def use_scales(self, slot: Slot, scales: list[float] | None) -> None:
        """slot's sequence runs with these LoRA adapter scales (None: the start-up ones); a cache
        computed with others is cleared (LLM.use_lora_scales)."""
        if self.llm.use_lora_scales(scales, slot.index):
            slot.tokens = []

    def start(self, slot: Slot, prompt: list[int]) -> int:
        """Makes slot evaluate prompt next, reusing the longest prefix its cache holds; returns the
        number of prompt tokens reused. The prompt must fit the context."""
        if not prompt:
            raise ValueError("empty prompt")
        if len(prompt) > self.n_ctx:
            raise SlotContextFull(f"the prompt has {len(prompt)} tokens, more than the context of {self.n_ctx} (-c)")
        common = min(common_prefix(slot.tokens, prompt), len(prompt) - 1)  # evaluate at least one token
        try:
            self.engine.seq_truncate(slot.index, common)
        except KernelError:  # a windowed layer's ring no longer holds that far back: start over
            common = 0
            self.engine.seq_clear(slot.index)
        slot.tokens = slot.tokens[:common]
        slot.pending = list(prompt[common:])
        slot.busy = True
        return common

    def load(self, slot: Slot, tokens: list[int], state: bytes) -> None:
        """Puts a saved sequence state (Engine.seq_state of any slot) and the tokens it holds into slot."""
        self.engine.seq_load_state(slot.index, state)
        slot.tokens = list(tokens)

    def feed(self, slot: Slot, token: int) -> None:
        """The token sampled for slot: evaluated at the next step."""
        slot.pending = [token]

    def release(self, slot: Slot) -> None:
        """The slot is idle again; its cache stays for prefix reuse by the next prompt."""
        slot.busy = False
        slot.pending = []

    def full(self, slot: Slot) -> bool:
        return len(slot.tokens) + len(slot.pending) >= self.n_ctx

    def _make_room(self, slot: Slot, n_new: int) -> None:
        """LLM.make_room's context shift for one slot."""
        n_past, n_keep = len(slot.tokens), self.llm.n_keep
        if n_past + n_new <= self.n_ctx:
            return
        if not self.llm.context_shift:
            raise SlotContextFull(f"{n_past + n_new} tokens do not fit the context of {self.n_ctx} (-c)")
        n_discard = max((n_past - n_keep) // 2, n_past + n_new - self.n_ctx)
        if n_new > self.n_ctx - n_keep or n_keep + n_discard > n_past:
            raise SlotContextFull(f"{n_new} new tokens do not fit the context of {self.n_ctx} with --keep {n_keep}")
        self.engine.seq_shift(slot.index, n_keep, n_discard)
        del slot.tokens[n_keep:n_keep + n_discard]
        slot.n_shifts += 1

    def plan_step(self) -> list[tuple[Slot, int]]:
        """(slot, tokens to take from its pending) for the next pass: every decoding slot's one token
        first (their latency stays one pass), then prompt chunks in slot order within the budget."""
        plan: list[tuple[Slot, int]] = []
        left = self.budget
        busy = [s for s in self.slots if s.busy and s.pending]
        for s in busy:
            if len(s.pending) == 1 and left > 0:
                plan.append((s, 1))
                left -= 1
        for s in busy:
            if len(s.pending) > 1 and left > 0:
                n = min(len(s.pending), left, self.n_ctx)
                plan.append((s, n))
                left -= n
        return plan

    def step(self, failed: dict[int, Exception] | None = None) -> dict[int, npt.NDArray[np.float32]]:
        """One forward pass; {slot index: logits} for the slots whose pending tokens are all evaluated.
        A slot whose tokens cannot fit (SlotContextFull) is left out of the pass and reported in
        failed (when given; raised otherwise)."""
        plan = []
        for s, n in self.plan_step():
            try:
                self._make_room(s, n)
            except SlotContextFull as exc:
                if failed is None:
                    raise
                failed[s.index] = exc
                continue
            plan.append((s, n))
        if not plan:
            return {}
        seqs: list[int] = []
        toks: list[int] = []
        pos: list[int] = []
        want: list[bool] = []
        for s, n in plan:
            chunk = s.pending[:n]
            last = n == len(s.pending)
            seqs += [s.index] * n
            toks += chunk
            pos += range(len(s.tokens), len(s.tokens) + n)
            want += [False] * (n - 1) + [last]
        logits = self.engine.decode(seqs, toks, pos, want)
        out: dict[int, npt.NDArray[np.float32]] = {}
        k = 0
        for s, n in plan:
            s.tokens += s.pending[:n]
            del s.pending[:n]
            if not s.pending:
                out[s.index] = logits[k]
                k += 1
        return out


def common_prefix(a: list[int], b: list[int]) -> int:
    """How many leading tokens a and b share (what a cache holding a can reuse for b)."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n

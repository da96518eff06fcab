"""Several sequences stepped together on one LLM: a slot per sequence of its engine, each with the
tokens its KV cache holds and the tokens still to evaluate; step() runs one forward pass over all of
them (every slot's pending decode token first, then prompt chunks within the per-step token budget)
and returns the logits of the slots that are ready to sample.

Knows nothing of sampling, requests or sockets (the service's scheduler drives it). In native
numerics a slot's logits are the ones it would get alone: the engine promises that bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import numpy.typing as npt

from edgellama.sequence import ContextFull, KVSequence, common_prefix

if TYPE_CHECKING:
    from edgellama.llm import LLM

SlotContextFull = ContextFull  # a slot's next tokens do not fit its context (the name older callers use)


@dataclass
class Slot:
    seq: KVSequence  # the slot's sequence of the engine: what its KV cache holds
    pending: list[int] = field(default_factory=list)  # to evaluate, in order; logits wanted for the last
    busy: bool = False

    @property
    def index(self) -> int:
        return self.seq.index

    @property
    def tokens(self) -> list[int]:
        return self.seq.tokens


class Slots:
    """The sequences of llm.engine (LLM(..., n_seq=N)) as slots. Slot 0 is sequence 0, the very
    KVSequence the LLM's own calls use, so a prompt cached there (a system prompt) is reused. Not
    thread-safe: one driver (the engine thread)."""

    def __init__(self, llm: LLM) -> None:
        self.llm = llm
        self.engine = llm.engine
        self.n_ctx: int = llm.n_ctx
        self.slots = [Slot(llm.seq if i == 0 else KVSequence(self.engine, i, llm.n_ctx, llm.n_keep, llm.context_shift))
                      for i in range(self.engine.n_seq)]
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
            slot.seq.tokens = []

    def start(self, slot: Slot, prompt: list[int]) -> int:
        """Makes slot evaluate prompt next, reusing the longest prefix its cache holds; returns the
        number of prompt tokens reused. The prompt must fit the context."""
        common = slot.seq.reuse(prompt)
        slot.pending = list(prompt[common:])
        slot.busy = True
        return common

    def load(self, slot: Slot, tokens: list[int], state: bytes) -> None:
        """Puts a saved sequence state (Engine.seq_state of any slot) and the tokens it holds into slot."""
        slot.seq.load(tokens, state)

    def feed(self, slot: Slot, token: int) -> None:
        """The token sampled for slot: evaluated at the next step."""
        slot.pending = [token]

    def release(self, slot: Slot) -> None:
        """The slot is idle again; its cache stays for prefix reuse by the next prompt."""
        slot.busy = False
        slot.pending = []

    def full(self, slot: Slot) -> bool:
        return slot.seq.full(len(slot.pending))

    def plan_step(self, only: set[int] | None = None) -> list[tuple[Slot, int]]:
        """(slot, tokens to take from its pending) for the next pass: every decoding slot's one token
        first (their latency stays one pass), then prompt chunks in slot order within the budget."""
        plan: list[tuple[Slot, int]] = []
        left = self.budget
        busy = [s for s in self.slots if s.busy and s.pending and (only is None or s.index in only)]
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

    def step(self, failed: dict[int, Exception] | None = None, only: set[int] | None = None
             ) -> dict[int, npt.NDArray[np.float32]]:
        """One forward pass (over the slots in only, when given); {slot index: logits} for the slots whose
        pending tokens are all evaluated. A slot whose tokens cannot fit (ContextFull) is left out of the
        pass and reported in failed (when given; raised otherwise)."""
        plan = []
        for s, n in self.plan_step(only):
            try:
                s.seq.make_room(n)
            except ContextFull as exc:
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
            s.seq.appended(s.pending[:n])
            del s.pending[:n]
            if not s.pending:
                out[s.index] = logits[k]
                k += 1
        return out


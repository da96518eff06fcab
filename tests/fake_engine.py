"""A fake LLM for fast unit tests of the scheduler and the serial text session: the real Slots, KVSequence,
Generation and sampler over an engine whose "model" is arithmetic. Token ids are bytes + 1 (0 is the
end-of-text token); after token t the most likely next token is the next letter of the alphabet (z wraps
to a), and after the byte of '.' it is end of text, so every answer is known in advance.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from edgellama.sequence import KVSequence

EOS = 0
N_VOCAB = 257


class FakeTokenizer:
    n_vocab = N_VOCAB
    eot_ids = frozenset({EOS})

    def encode(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return [b + 1 for b in text.encode("utf-8")]

    def token_bytes(self, tid: int) -> bytes:
        return b"" if tid == EOS else bytes([tid - 1])

    def decode(self, ids: list[int], strip_space_prefix: bool = False) -> str:
        return b"".join(self.token_bytes(t) for t in ids).decode("utf-8", "replace")


class FakeChat:
    name = "fake"
    stop_pieces = ("<end>",)
    added_special = False

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + ("assistant: " if add_generation_prompt else "")


def next_token(tok: int) -> int:
    ch = tok - 1
    if ch == ord("."):
        return EOS
    if ord("a") <= ch <= ord("z"):
        return (ch - ord("a") + 1) % 26 + ord("a") + 1
    return ord("a") + 1


class FakeEngine:
    """The slot calls of native.engine.Engine on Python lists; decode gives one-hot-ish logits."""

    def __init__(self, n_seq: int, n_ctx: int, n_batch: int) -> None:
        self.n_seq, self.n_ctx, self.n_batch = n_seq, n_ctx, n_batch
        self.cache: list[list[int]] = [[] for _ in range(n_seq)]
        self.passes = 0
        self.fail_decode: Exception | None = None  # raised by the next decode (a broken forward pass)
        self.nan = False  # decode returns NaN logits

    def decode(self, seqs: list[int], tokens: list[int], positions: list[int], want: list[bool]
               ) -> npt.NDArray[np.float32]:
        if self.fail_decode is not None:
            exc, self.fail_decode = self.fail_decode, None
            raise exc
        self.passes += 1
        rows = []
        for s, t, p, w in zip(seqs, tokens, positions, want, strict=True):
            assert p == len(self.cache[s]), (s, p, len(self.cache[s]))
            self.cache[s].append(t)
            if w:
                row = np.zeros(N_VOCAB, np.float32)
                row[next_token(t)] = 10.0
                if self.nan:
                    row[3] = np.nan
                rows.append(row)
        return np.stack(rows) if rows else np.zeros((0, N_VOCAB), np.float32)

    def eval(self, tokens: list[int], pos0: int, all_logits: bool = False) -> npt.NDArray[np.float32]:
        out = self.decode([0] * len(tokens), list(tokens), list(range(pos0, pos0 + len(tokens))),
                          [all_logits or i == len(tokens) - 1 for i in range(len(tokens))])
        return out if all_logits else out[-1]

    def seq_clear(self, seq: int) -> None:
        self.cache[seq] = []

    def seq_truncate(self, seq: int, pos: int) -> None:
        del self.cache[seq][pos:]

    def seq_shift(self, seq: int, n_keep: int, n_discard: int) -> None:
        del self.cache[seq][n_keep:n_keep + n_discard]

    def seq_state(self, seq: int) -> bytes:
        return bytes(np.asarray(self.cache[seq], np.int32))

    def seq_load_state(self, seq: int, blob: bytes) -> None:
        self.cache[seq] = np.frombuffer(blob, np.int32).tolist()


class FakeLLM:
    """What the scheduler uses of edgellama.llm.LLM."""

    def __init__(self, n_seq: int = 1, n_ctx: int = 256, n_batch: int = 16, context_shift: bool = True) -> None:
        self.engine = FakeEngine(n_seq, n_ctx, n_batch)
        self.n_ctx, self.n_batch, self.n_keep, self.context_shift = n_ctx, n_batch, 0, context_shift
        self.tokenizer = FakeTokenizer()
        self.chat = FakeChat()
        self.path = Path("fake.gguf")
        self.load_ms = 0.0
        self.loras: list[Any] = []
        self.lora_scales: list[float] = []
        self.seq = KVSequence(self.engine, 0, n_ctx, 0, context_shift)
        self.closed = False
        self.generates = True  # a decoder (an encoder answers embeddings only)

    def seq_scales(self, seq: int) -> tuple[float, ...]:
        return ()

    def use_lora_scales(self, scales: Any, seq: int = 0) -> bool:
        return False

    def prefill(self, prompt: list[int]) -> npt.NDArray[np.float32]:
        n = self.seq.reuse(prompt)
        logits = self.engine.eval(prompt[n:], n)
        self.seq.appended(prompt[n:])
        return logits

    def close(self) -> None:
        self.closed = True


def expected_answer(prompt: str, n: int) -> str:
    """What the fake model answers greedily to prompt, at most n tokens."""
    out, tok = [], prompt.encode()[-1] + 1
    for _ in range(n):
        tok = next_token(tok)
        if tok == EOS:
            break
        out.append(chr(tok - 1))
    return "".join(out)

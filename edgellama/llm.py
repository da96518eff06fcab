"""A loaded model ready to generate: GGUF file + wiring + engine + tokenizer, and the token
sequence held in the KV cache (so a new prompt only evaluates what differs from the cached one).

Threads: an LLM serves one caller at a time. A call made while another is in progress (on another
thread, or while a generate() has neither finished nor been closed) raises LLMBusy at once instead
of waiting; close() is always allowed (the other caller's next step then raises ValueError).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Generator, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Self

import numpy as np
import numpy.typing as npt

from edgellama import session
from edgellama.completion import CompletionAPI
from edgellama.embedding import Embedder, EmbeddingError, RankScorer, normalize, resolve_pooling
from edgellama.embedding_api import EmbeddingAPI
from edgellama.generation import Event, Generation, Timings
from edgellama.gguf.metadata import Metadata
from edgellama.gguf.reader import GGUFFile
from edgellama.gguf.split import SplitGGUF, iter_pieces, open_model_file
from edgellama.memplan import BudgetError, MemoryPlan, choose_plan, with_loras
from edgellama.native.engine import Engine, Pool
from edgellama.native.lib import KernelError
from edgellama.registry import resolve_model
from edgellama.sequence import ContextFull, KVSequence
from edgellama.tokenizers.chat import ChatFormatter, chat_formatter
from edgellama.tokenizers.tokenizer import tokenizer_from_metadata
from edgellama.wiring import build_desc, for_context

DEFAULT_CTX = 4096
EMBD_CTX = 512  # embeddings: the context per text when none is given (llama-cpp-python's default)
EMBD_SEQS = 4  # embeddings: texts evaluated together in one forward pass (each a sequence)
__all__ = ["DEFAULT_CTX", "LLM", "ContextFull", "Event", "LLMBusy", "Timings", "default_threads"]


class LLMBusy(RuntimeError):
    """Another caller is using this LLM."""


class _Turn:
    """Whose turn it is to use an LLM. A call takes the turn or fails at once with LLMBusy: it never
    waits, because generate holds the turn from its first step until it finishes or is closed, and
    the thread that would wait may be the one that has to advance (or close) that generator. Code run
    by the holder itself (a method calling another, generate's on_prompt callback) goes through."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # released by whichever thread ends the holder (a generator's close)
        self._inside: int | None = None  # the thread running the holder's code; None while it is suspended

    @contextmanager
    def take(self, what: str) -> Iterator[None]:
        me = threading.get_ident()
        if self._inside == me:
            yield
            return
        if not self._lock.acquire(blocking=False):
            raise LLMBusy(f"{what}: this LLM is in use by another caller (a call on another thread, or a "
                          f"generate() that has not finished or been closed); an LLM serves one caller at a time")
        self._inside = me
        try:
            yield
        finally:
            self._inside = None
            self._lock.release()

    def suspend(self, event: Event) -> Iterator[Event]:
        """Yields event from the holding generator: while it waits for its consumer nobody is inside,
        and whichever thread resumes it is inside again."""
        self._inside = None
        try:
            yield event
        finally:
            self._inside = threading.get_ident()


def default_threads() -> int:
    n = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(n, 8))


def load_plan(hp: Any, desc: Any, n_ctx: int | None, n_batch: int, threads: int, kv_type: str,
              mem_budget: int | None, numerics: str, n_seq: int | None, adapters: list[Any],
              embedding: bool) -> MemoryPlan:
    """The memory plan LLM(...) loads with (memplan.choose_plan under LLM's defaults: an embedding
    model's context of EMBD_CTX per text and EMBD_SEQS texts at once, an encoder's batch of its whole
    context); raises memplan.BudgetError when it does not fit mem_budget."""
    train = hp.n_ctx_train or DEFAULT_CTX
    if embedding and not (n_ctx and n_ctx > 0):
        n_ctx = min(train, EMBD_CTX)
    if desc.non_causal:  # an encoder's text is one batch: the whole context
        n_batch = max(n_batch, n_ctx or train)
    if n_seq is None:
        n_seq = EMBD_SEQS if embedding else 1
    ctx_max = train if mem_budget is not None else min(train, DEFAULT_CTX)
    return choose_plan(desc, n_ctx if n_ctx and n_ctx > 0 else None, ctx_max, n_batch, kv_type, threads,
                       mem_budget, numerics, n_seq, adapters)


class LLM(CompletionAPI, EmbeddingAPI):
    def __init__(self, path: str | Path | None = None, n_ctx: int | None = None, n_batch: int = 512,
                 n_threads: int | None = None, kv_type: str = "f16", mem_budget: int | None = None,
                 n_keep: int = 0, context_shift: bool = True, numerics: str = "native", *,
                 model_path: str | Path | None = None, chat_format: str | None = None, seed: int | None = None,
                 verbose: bool = True, n_gpu_layers: int = 0, n_seq: int | None = None,
                 loras: Sequence[tuple[str | Path | Any, float]] = (), embedding: bool = False,
                 pooling: str | None = None) -> None:
        """path (or llama-cpp-python's model_path): a GGUF file or a known name (`edgellama list`).
        n_ctx None: the largest context within mem_budget (up to the model's training context), or
        min(training context, 4096) without a budget. Raises memplan.BudgetError, with the plan, when
        the model does not fit; nothing large is allocated before that check. chat_format names a
        hand-written chat format (chatml, gemma) instead of the model's template; seed None or < 0 is
        random. verbose and n_gpu_layers are accepted for llama-cpp-python scripts and change nothing
        (this runtime prints nothing while loading and runs on the CPU). n_seq: sequences the engine holds
        (each a KV cache of n_ctx, all counted by the plan) for edgellama.slots.Slots; this LLM's own
        calls use sequence 0. loras: (adapter, scale) pairs, an adapter a GGUF LoRA file (checked against
        this model) or a read edgellama.lora.adapter.LoraAdapter, applied in this order with these
        scales on every sequence (llama.cpp's --lora / --lora-scaled); the plan counts them.
        embedding (always on for an encoder such as BERT): embed() and create_embedding() work, pooled
        by pooling (none, mean, cls, last) or the file's pooling type; n_ctx then defaults to
        min(training context, 512) per text and n_seq (texts per forward pass) to 4."""
        t0 = time.perf_counter()
        if (path is None) == (model_path is None):
            raise TypeError("give the model as path or model_path, exactly once")
        self.seed = seed if seed is not None and seed >= 0 else None
        self.chat_format_name = chat_format
        self._chat: ChatFormatter | None = None
        given = path if isinstance(path, (GGUFFile, SplitGGUF)) else None
        self.path = given.path if given is not None else resolve_model(path if path is not None else model_path)  # type: ignore[arg-type]
        self.file = given if given is not None else open_model_file(self.path)
        try:
            self.hp, self.desc = build_desc(self.file)
            self.embedding = embedding or not self.generates
            self.pooling = (resolve_pooling(pooling, self.hp.pooling, self.hp.rank_head is not None)
                            if self.embedding else "none")
            if loras and not self.generates:
                raise ValueError(f"LoRA adapters are not supported on the {self.hp.arch} encoder")
            adapters = [(self._read_lora(ad), float(scale)) for ad, scale in loras]
            threads = n_threads or default_threads()
            self.plan: MemoryPlan = load_plan(self.hp, self.desc, n_ctx, n_batch, threads, kv_type, mem_budget,
                                              numerics, n_seq, [ad for ad, _ in adapters], self.embedding)
            n_seq = self.plan.n_seq
            self.n_ctx = self.plan.n_ctx
            self.n_batch = self.plan.n_batch
            self.desc = for_context(self.hp, self.desc, self.n_ctx)  # LongRoPE: long factors past n_ctx_orig
            if n_keep < 0 or n_keep >= self.n_ctx:
                raise ValueError(f"--keep {n_keep} must be in 0..{self.n_ctx - 1}")
            self.n_keep = n_keep
            self.context_shift = context_shift
            self.tokenizer = tokenizer_from_metadata(Metadata.of(self.file), n_rows=self.desc.n_vocab)
            self.pool = Pool(threads)
            self.engine = Engine(self.desc, self.pool, self.n_ctx, self.n_batch, kv_type, numerics, n_seq)
            self.loras: list[Any] = []  # the adapters by number, with lora_scales their start-up scales
            self.lora_scales: list[float] = []
            self._seq_scales: dict[int, tuple[float, ...]] = {}  # sequences not at the start-up scales
            for ad, scale in adapters:
                self._attach(ad, scale)
        except BaseException:
            if hasattr(self, "engine"):
                self.engine.close()
            if hasattr(self, "pool"):
                self.pool.close()
            if given is None:  # an open file handed in stays its caller's until the LLM is made
                self.file.close()
            raise
        self._turn = _Turn()
        self.kv_type = kv_type
        self.n_prompt_evaluated = 0
        self.seq = KVSequence(self.engine, 0, self.n_ctx, n_keep, context_shift)  # what sequence 0 holds
        scorer = RankScorer(self.hp.rank_head) if self.pooling == "rank" and self.hp.rank_head else None
        self.embedder = Embedder(self.engine, self.n_ctx, self.n_batch, self.engine.n_seq, self.pooling,
                                 self.desc.non_causal, scorer)
        self.load_ms = (time.perf_counter() - t0) * 1000.0

    @property
    def generates(self) -> bool:
        """The model has an output head to generate text with (an encoder such as BERT has none)."""
        return self.desc.arch != "bert"

    # ---- embeddings ----
    def embed_tokens(self, texts: Sequence[Sequence[int]], embd_normalize: int = 2
                     ) -> list[npt.NDArray[np.float32]]:
        """One array per token list: the pooled vector (n_embd), or n_tokens x n_embd with pooling none,
        normalized as llama.cpp's --embd-normalize (2: euclidean). Raises EmbeddingError for a text longer
        than the context. Clears the cache (the texts run in the engine's sequences)."""
        if not self.embedding:
            raise EmbeddingError("this LLM was loaded without embedding=True (the command's --embedding)")
        with self._turn.take("embed"):
            self.seq.tokens = []  # sequence 0 is one of the texts' sequences
            return [normalize(v, embd_normalize) for v in self.embedder.embed(texts)]

    # ---- LoRA adapters ----
    def _read_lora(self, adapter: str | Path | Any) -> Any:
        if isinstance(adapter, (str, Path)):
            from edgellama.lora.adapter import read_adapter  # the reader checks it against this model

            return read_adapter(Path(adapter), self.file)
        return adapter

    def _attach(self, adapter: Any, scale: float) -> int:
        index = len(self.loras)
        self.engine.lora_attach(index, adapter)
        self.loras.append(adapter)
        self.lora_scales.append(scale)
        self.engine.lora_scale(index, scale)
        return index

    def add_lora(self, adapter: str | Path | Any, scale: float = 1.0) -> int:
        """Attaches an adapter (a GGUF LoRA file or a read LoraAdapter) at scale on every sequence, after
        the ones attached before; returns its number. self.plan counts it; an adapter that takes the
        plan past the memory budget is refused (BudgetError, with the plan). The cache is cleared (its
        keys were computed without it when the scale is not 0)."""
        with self._turn.take("add_lora"):
            ad = self._read_lora(adapter)
            plan = with_loras(self.plan, [*self.loras, ad])
            if not plan.fits:
                raise BudgetError(f"adapter {getattr(ad, 'name', adapter)} does not fit the memory budget:\n"
                                  f"{plan.table()}")
            index = self._attach(ad, float(scale))
            self.plan = plan
            self._seq_scales = {q: (*t, float(scale)) for q, t in self._seq_scales.items()}
            self._forget_cache(None)
            return index

    def set_lora_scale(self, index: int, scale: float, seq: int | None = None) -> None:
        """Adapter index's scale on sequence seq (None: every sequence, and the start-up scale slots
        return to); 0 turns it off. Clears the affected sequences' caches when the scale changes:
        their keys and values were computed with the old one."""
        with self._turn.take("set_lora_scale"):
            if not 0 <= index < len(self.loras):
                raise ValueError(f"no adapter number {index} ({len(self.loras)} attached)")
            self.engine.lora_scale(index, float(scale), seq)
            if seq is None:
                self.lora_scales[index] = float(scale)
                self._seq_scales.clear()
            else:
                now = list(self.seq_scales(seq))
                now[index] = float(scale)
                self._seq_scales[seq] = tuple(now)
            self._forget_cache(seq)

    def seq_scales(self, seq: int) -> tuple[float, ...]:
        """Every adapter's scale on sequence seq, in adapter order."""
        return self._seq_scales.get(seq, tuple(self.lora_scales))

    def use_lora_scales(self, scales: Sequence[float] | None, seq: int = 0) -> bool:
        """Sets every adapter's scale on sequence seq (None: the start-up scales). When they differ from
        the ones its cache was computed with, that cache is cleared and True returned."""
        want = tuple(self.lora_scales) if scales is None else tuple(float(x) for x in scales)
        if len(want) != len(self.loras):
            raise ValueError(f"{len(want)} adapter scales for {len(self.loras)} adapters")
        if want == self.seq_scales(seq):
            return False
        with self._turn.take("use_lora_scales"):
            for i, sc in enumerate(want):
                self.engine.lora_scale(i, sc, seq)
            self._seq_scales[seq] = want
            self._forget_cache(seq)
        return True

    def _forget_cache(self, seq: int | None) -> None:
        for s in range(self.engine.n_seq) if seq is None else [seq]:
            self.engine.seq_clear(s)
        if seq in (None, 0):
            self.seq.tokens = []

    @property
    def n_vocab(self) -> int:
        return self.desc.n_vocab

    @property
    def chat(self) -> ChatFormatter:
        """The chat format: the one named at load, else the model's template; a model without one
        raises tokenizers.chat.NoChatTemplate naming a model that has one."""
        if self._chat is None:
            self._chat = chat_formatter(self.file.metadata, self.chat_format_name)
        return self._chat

    def close(self) -> None:
        self.engine.close()
        self.pool.close()
        self.file.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def tokens(self) -> list[int]:
        """What sequence 0's KV cache holds, position i = tokens[i] (self.seq owns it)."""
        return self.seq.tokens

    @property
    def n_shifts(self) -> int:
        return self.seq.n_shifts

    def reset(self) -> None:
        with self._turn.take("reset"):
            self.seq.clear()

    def make_room(self, n_new: int) -> None:
        """Sequence.make_room for sequence 0: the context shift when n_new more tokens do not fit."""
        with self._turn.take("make_room"):
            self.seq.make_room(n_new)

    def eval(self, tokens: list[int], all_logits: bool = False) -> npt.NDArray[np.float32]:
        """Appends tokens to the cached sequence (shifting the context when full, if enabled); logits
        of the last one (or of all, n x vocab)."""
        if not tokens:
            raise ValueError("nothing to evaluate")
        if not self.generates:
            raise ValueError(f"{self.path.name} is an embedding model ({self.hp.arch}): it has no output head to "
                             f"generate text with; use embed()")
        outs = []
        logits: npt.NDArray[np.float32] = np.empty(0, dtype=np.float32)
        with self._turn.take("eval"):
            for i in range(0, len(tokens), self.n_batch):
                chunk = tokens[i:i + self.n_batch]
                self.seq.make_room(len(chunk))
                logits = self.engine.eval(chunk, len(self.seq), all_logits)
                self.seq.appended(chunk)
                if all_logits:
                    outs.append(logits)
        return np.concatenate(outs) if all_logits else logits

    def prefill(self, prompt: list[int]) -> npt.NDArray[np.float32]:
        """Makes the cache hold exactly prompt, reusing the longest cached prefix."""
        with self._turn.take("prefill"):
            n_reused = self.seq.reuse(prompt)
            self.n_prompt_evaluated = len(prompt) - n_reused
            return self.eval(prompt[n_reused:])

    def generate(self, prompt: list[int], sampler: Any, n_predict: int = -1,
                 stop_ids: set[int] | None = None,
                 on_prompt: Callable[[], None] | None = None, stops: Sequence[str] = (),
                 keep_stop: bool = False, n_probs: int = -1) -> Generator[Event, None, None]:
        """Yields a token event per generated token, then one done event (edgellama.generation.Generation
        decides: text is complete UTF-8 only, held back while it could begin one of stops; stop_ids are
        the end-of-generation tokens, the tokenizer's by default). n_probs >= 0: each token event's probs
        (edgellama.logprobs.TokenProbs, with the n_probs most likely tokens). Holds the LLM (other calls
        raise LLMBusy) from the first step until the done event has been taken or the generator is closed."""
        with self._turn.take("generate"):
            pieces: list[tuple[str, int, Any]] = []
            gen = Generation(self.tokenizer, prompt, sampler, n_predict=n_predict, stops=stops, eog=stop_ids,
                             keep_stop=keep_stop, model=self.path.name, load_ms=self.load_ms, n_probs=n_probs)
            gen.emit = lambda text, tok: pieces.append((text, tok, gen.last_probs if tok >= 0 else None))
            logits = self.prefill(prompt)
            gen.timings.prompt_tokens = self.n_prompt_evaluated  # what the cache did not already hold
            gen.prompt_done()
            if on_prompt is not None:
                on_prompt()  # e.g. save the prompt cache: the KV cache holds exactly the prompt now
            while True:
                tok = gen.step(logits)
                for text, t, probs in pieces:
                    yield from self._turn.suspend(Event("token", t, text, probs=probs))
                pieces.clear()
                if tok is None:
                    break
                if self.seq.must_end():
                    gen.finish("context")
                    break
                logits = self.eval([tok])
            tail = gen.finish()
            yield from self._turn.suspend(Event("done", text=tail, stop_reason=gen.stop_reason or "length",
                                                timings=gen.timings))

    # ---- session save / restore (prompt cache) ----
    def _session_header(self) -> dict[str, object]:
        # a split model: every piece's header and size, so a session never outlives a replaced piece
        model = ":".join(session.model_fingerprint(p, pc.data_offset) for p, pc in iter_pieces(self.file))
        return {"model": model, "n_ctx": self.n_ctx,
                "n_batch": self.n_batch, "kv_type": self.kv_type, "numerics": self.engine.numerics,
                # the adapters and scales the cache was computed with (null without: older files match)
                "lora": [[ad.name, sc] for ad, sc in zip(self.loras, self.seq_scales(0), strict=True)] or None}

    def save_session(self, path: str | Path) -> None:
        """Writes the KV cache and the tokens it holds."""
        with self._turn.take("save_session"):
            header = dict(self._session_header(), tokens=list(self.tokens))
            session.save(Path(path), header, self.engine.state())

    def load_session(self, path: str | Path) -> list[int]:
        """Restores a saved KV cache; returns the tokens it holds. Raises session.SessionError."""
        with self._turn.take("load_session"):
            tokens, blob = session.load(Path(path), self._session_header())
            if len(tokens) > self.n_ctx or any(not 0 <= t < self.n_vocab for t in tokens):
                raise session.SessionError(f"{path}: damaged session (tokens)")
            try:
                self.engine.load_state(blob)
            except KernelError as exc:
                self.reset()
                raise session.SessionError(f"{path}: {exc}") from None
            self.seq.tokens = list(tokens)
            return self.tokens

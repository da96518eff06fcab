"""The RAM plan: weights (mmapped, file-backed), KV cache, scratch and runtime overhead, computed
before anything large is allocated; picks the largest context that fits a budget, or refuses.

KV and scratch figures come from the C code that allocates them (el_model_plan), so they are exact;
the overhead (interpreter, numpy, vocabulary tables) is an estimate calibrated on this runtime.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from typing import Any

from edgellama.gguf.limits import INT32_MAX
from edgellama.native import lora
from edgellama.native.desc import INPUT_TENSORS, LAYER_TENSORS, ModelDesc
from edgellama.native.engine import plan_bytes

# Interpreter + numpy + cffi + the C library, measured at about 29 MiB; the vocabulary (metadata
# strings and tokenizer tables) at about 250 bytes per token (Gemma 3: 262144 tokens, ~64 MiB).
BASE_OVERHEAD = 32 << 20
PER_TOKEN_OVERHEAD = 256
MIN_CTX = 64
MAX_CTX = 1 << 24  # el_model_plan refuses longer contexts (tests/test_hostile_models.py holds the two equal)
MAX_THREADS = 64


class BudgetError(ValueError):
    """The model, or the context asked for, does not fit the memory budget."""


_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """'300M', '1.5G', '512MiB', '2GB', '1000000' -> bytes (binary multiples)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(I?B)?\s*", text.upper())
    if not m:
        raise ValueError(f"cannot read memory size {text!r} (examples: 300M, 1.5G, 2048MiB)")
    value = float(m.group(1)) * _UNITS[m.group(2)]
    if value < 1:
        raise ValueError(f"memory size {text!r} is too small")
    return int(value)


def fmt_bytes(n: int) -> str:
    return f"{n / (1 << 20):8.1f} MiB"


@dataclass
class MemoryPlan:
    n_ctx: int
    n_batch: int
    kv_type: str
    n_threads: int
    weights: int
    kv_cache: int
    scratch: int
    logits: int
    overhead: int
    budget: int | None = None
    n_seq: int = 1  # sequences (service slots), each with its own KV cache of n_ctx positions
    lora: int = 0  # LoRA adapters: their arrays and the engine's scratch for their largest rank
    n_lora: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.scratch + self.logits + self.overhead + self.lora

    @property
    def fits(self) -> bool:
        return self.budget is None or self.total <= self.budget

    def as_dict(self) -> dict[str, Any]:
        return {
            "n_ctx": self.n_ctx, "n_seq": self.n_seq, "n_batch": self.n_batch, "kv_type": self.kv_type, "n_threads": self.n_threads,
            "weights_bytes": self.weights, "kv_cache_bytes": self.kv_cache, "scratch_bytes": self.scratch,
            "logits_bytes": self.logits, "lora_bytes": self.lora, "n_lora": self.n_lora,
            "overhead_bytes": self.overhead, "total_bytes": self.total,
            "budget_bytes": self.budget, "fits": self.fits,
        }

    def table(self) -> str:
        rows = [
            ("weights (mmapped file, page cache)", self.weights),
            (f"KV cache ({self.kv_type}, {self.n_ctx} positions"
             + (f" x {self.n_seq} slots)" if self.n_seq > 1 else ")"), self.kv_cache),
            (f"scratch (batches of {self.n_batch})", self.scratch),
            ("logits", self.logits),
            *([(f"LoRA adapters ({self.n_lora}) and their scratch", self.lora)] if self.n_lora else []),
            ("runtime overhead (estimate)", self.overhead),
            ("total", self.total),
        ]
        lines = [f"  {name:<40} {fmt_bytes(v)}" for name, v in rows]
        if self.budget is not None:
            verdict = "fits" if self.fits else "does NOT fit"
            lines.append(f"  {'budget':<40} {fmt_bytes(self.budget)}  ({verdict})")
        return "\n".join(lines)


def weights_bytes(desc: ModelDesc) -> int:
    ts = [desc.tok_embd, desc.output_norm, desc.output, *(getattr(desc, f) for f in INPUT_TENSORS)]
    for L in desc.layers:
        ts += [getattr(L, f) for f in LAYER_TENSORS]
    # once per tensor of the file: every layer reads the same rotation factors (one TensorRef)
    return sum(int(t.data.nbytes) for t in {id(t): t for t in ts if t is not None}.values())


def check_ranges(n_ctx: int | None, n_batch: int, n_threads: int) -> None:
    """Refuses, before any arithmetic or C call, a context, batch or thread count out of range."""
    if n_ctx is not None and not 1 <= n_ctx <= MAX_CTX:
        raise ValueError(f"a context of {n_ctx} tokens is out of range (1..{MAX_CTX})")
    if not 1 <= n_batch <= INT32_MAX:
        raise ValueError(f"a batch of {n_batch} tokens is out of range (1..{INT32_MAX})")
    if not 1 <= n_threads <= MAX_THREADS:
        raise ValueError(f"{n_threads} threads is out of range (1..{MAX_THREADS})")


def physical_memory() -> int | None:
    """Bytes of RAM of this machine, if the OS says."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def make_plan(desc: ModelDesc, n_ctx: int, n_batch: int, kv_type: str, n_threads: int,
              budget: int | None = None, numerics: str = "native", n_seq: int = 1,
              loras: list[Any] | None = None) -> MemoryPlan:
    """loras: the adapters the engine will hold (edgellama.lora.adapter.LoraAdapter)."""
    check_ranges(n_ctx, n_batch, n_threads)
    n_batch = max(1, min(n_batch, n_ctx))
    kv, scratch = plan_bytes(desc, n_ctx, n_batch, kv_type, n_threads, numerics, n_seq)
    ads = loras or []
    return MemoryPlan(
        n_ctx=n_ctx, n_batch=n_batch, kv_type=kv_type, n_threads=n_threads, weights=weights_bytes(desc),
        kv_cache=kv, scratch=scratch, logits=desc.n_vocab * 4 * n_seq,  # a step's logits: a row per slot
        overhead=BASE_OVERHEAD + PER_TOKEN_OVERHEAD * desc.n_vocab, budget=budget, n_seq=n_seq,
        lora=_lora_bytes(n_batch, ads), n_lora=len(ads),
    )


def _lora_bytes(n_batch: int, loras: list[Any]) -> int:
    """The adapters' arrays and the engine's scratch for their largest rank."""
    return lora.adapter_bytes(loras) + lora.scratch_bytes(n_batch, lora.max_rank(loras))


def with_loras(plan: MemoryPlan, loras: list[Any]) -> MemoryPlan:
    """plan with these adapters in place of the ones it counted (LLM.add_lora: the same context)."""
    return replace(plan, lora=_lora_bytes(plan.n_batch, loras), n_lora=len(loras))


def _slots(n_seq: int) -> str:
    return f" for each of {n_seq} slots" if n_seq > 1 else ""


def choose_plan(desc: ModelDesc, n_ctx: int | None, n_ctx_max: int, n_batch: int, kv_type: str,
                n_threads: int, budget: int | None, numerics: str = "native", n_seq: int = 1,
                loras: list[Any] | None = None) -> MemoryPlan:
    """The plan for n_ctx, or (n_ctx None) for the largest context up to n_ctx_max within budget
    (n_seq sequences, each a context of that size).
    Raises BudgetError, with the plan in the message, when nothing fits. Without a budget, a plan
    whose allocations (all but the file-backed weights) exceed this machine's RAM is refused too."""
    check_ranges(n_ctx, n_batch, n_threads)
    if n_ctx is not None:
        p = make_plan(desc, n_ctx, n_batch, kv_type, n_threads, budget, numerics, n_seq, loras)
        if not p.fits:
            raise BudgetError(f"a context of {n_ctx}{_slots(n_seq)} does not fit the memory budget:\n{p.table()}")
        ram = physical_memory()
        if budget is None and ram is not None and p.total - p.weights > ram:
            raise BudgetError(f"a context of {n_ctx}{_slots(n_seq)} needs more memory than this machine has "
                              f"({ram >> 20} MiB):\n{p.table()}")
        return p
    hi = min(max(n_ctx_max, MIN_CTX), MAX_CTX)
    p = make_plan(desc, hi, n_batch, kv_type, n_threads, budget, numerics, n_seq, loras)
    if p.fits:
        return p
    lo_plan = make_plan(desc, MIN_CTX, n_batch, kv_type, n_threads, budget, numerics, n_seq, loras)
    if not lo_plan.fits:
        raise BudgetError(f"the model does not fit the memory budget even with a context of {MIN_CTX}{_slots(n_seq)}:\n"
                          f"{lo_plan.table()}")
    lo = MIN_CTX  # fits; hi does not: bisect on the context (memory grows with it)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if make_plan(desc, mid, n_batch, kv_type, n_threads, budget, numerics, n_seq, loras).fits:
            lo = mid
        else:
            hi = mid
    return make_plan(desc, lo, n_batch, kv_type, n_threads, budget, numerics, n_seq, loras)

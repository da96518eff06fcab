"""cffi wrapper around the C engine: the thread pool and the model (forward pass + KV cache).

Owns C handles and the memory they point into; knows nothing about GGUF keys or tokens' meaning.

Threads: an Engine may be called from several threads; its calls are serialized (a lock here, and
the C library holds the pool for each call, so Engines sharing a Pool take turns too). Each call
runs whole; a sequence of calls that must stay together (truncate, then eval) needs the caller's
own lock, or LLM, which refuses a second caller.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import numpy.typing as npt

from edgellama.native import lora
from edgellama.native.desc import (
    INPUT_TENSORS,
    INT32_MAX,
    INT32_MIN,
    LAYER_TENSORS,
    ModelDesc,
    TensorRef,
    c_float,
    c_int32,
    check_c_ranges,
)
from edgellama.native.lib import KernelError, check, ffi, lib
from edgellama.native.lora import LoraAdapterLike


def _enum(prefix: str) -> dict[str, int]:
    """A C enum from the library (cffi exposes its constants) as {lower-case name: value}, in value
    order: EL_ARCH_GEMMA3 -> "gemma3"."""
    names = [n for n in dir(lib) if n.startswith(prefix)]
    return {n[len(prefix):].lower(): int(getattr(lib, n)) for n in sorted(names, key=lambda n: getattr(lib, n))}


ARCHS = _enum("EL_ARCH_")  # ModelDesc.arch
ACTS = _enum("EL_ACT_")  # ModelDesc.act
# el_numerics, the forward pass's float order: native, llamacpp (llama.cpp's x86 build for this CPU),
# llamacpp-avx2, llamacpp-avx512 (that build's order)
NUMERICS = {name.replace("_", "-"): code for name, code in _enum("EL_NUMERICS_").items()}
# the KV cache formats el_model_create takes, by their ggml type names
KV_TYPES = {name: int(getattr(lib, f"EL_TYPE_{name.upper()}")) for name in ("f32", "f16", "q8_0")}


class Pool:
    """A persistent pthread pool (n_threads including the caller). Engines created on it keep it
    alive; close() refuses while one of them is open."""

    def __init__(self, n_threads: int) -> None:
        out = ffi.new("el_pool **")
        check(lib.el_pool_create(int(n_threads), out), f"thread pool of {n_threads}")
        self._ptr: Any = out[0]
        self._lock = threading.Lock()  # close vs an Engine being created on the pool
        self.n_threads = int(n_threads)

    @property
    def ptr(self) -> Any:
        if self._ptr is None:
            raise ValueError("thread pool is closed")
        return self._ptr

    @property
    def users(self) -> int:
        """Engines created on this pool and not closed (the C library's count)."""
        with self._lock:
            return int(lib.el_pool_users(self.ptr))

    def close(self) -> None:
        """Stops the threads; RuntimeError while an Engine created on this pool is open."""
        with self._lock:
            if self._ptr is None:
                return
            users = int(lib.el_pool_users(self._ptr))
            if users:
                raise RuntimeError(f"the thread pool is in use by {users} open engine(s): close them first")
            lib.el_pool_free(self._ptr)
            self._ptr = None

    def __del__(self) -> None:
        # Engines hold their pool, so this runs after theirs, unless both die in one garbage cycle
        # (either order): the C library then frees the pool with its last model.
        if getattr(self, "_ptr", None) is not None:
            lib.el_pool_free(self._ptr)
            self._ptr = None


def _fill_tensor(dst: Any, t: TensorRef | None, keep: list[Any]) -> None:
    if t is None:
        dst.data = ffi.NULL
        dst.nbytes = 0
        return
    buf = ffi.from_buffer(t.data)
    keep.append(buf)
    dst.data = buf
    dst.nbytes = t.data.nbytes
    dst.type = t.ggml_type
    dst.ne0 = t.ne0
    dst.ne1 = t.ne1


def _c_desc(desc: ModelDesc) -> tuple[Any, list[Any]]:
    """The C el_model_desc for desc, plus the cffi objects that must outlive it."""
    check_c_ranges(desc)
    if desc.arch not in ARCHS:
        raise ValueError(f"unknown architecture {desc.arch!r} (the engine runs {', '.join(ARCHS)})")
    if desc.act not in ACTS:
        raise ValueError(f"unknown activation {desc.act!r} (the engine has {', '.join(ACTS)})")
    keep: list[Any] = []
    layers = ffi.new("el_layer[]", len(desc.layers))
    keep.append(layers)
    for i, L in enumerate(desc.layers):
        c = layers[i]
        for name in LAYER_TENSORS:
            _fill_tensor(getattr(c, name), getattr(L, name), keep)
        c.rope_base = L.rope_base
        c.rope_scale = L.rope_scale
        c.window = L.window
        c.no_rope = int(L.no_rope)
    d = ffi.new("el_model_desc *")
    d.arch, d.act, d.rope_neox = ARCHS[desc.arch], ACTS[desc.act], int(desc.rope_neox)
    d.n_layer, d.n_embd, d.n_head, d.n_head_kv = desc.n_layer, desc.n_embd, desc.n_head, desc.n_head_kv
    d.head_dim, d.n_rot, d.n_ff, d.n_vocab = desc.head_dim, desc.n_rot, desc.n_ff, desc.n_vocab
    d.norm_eps, d.emb_scale, d.attn_scale = desc.norm_eps, desc.emb_scale, desc.attn_scale
    d.attn_softcap, d.final_softcap = desc.attn_softcap, desc.final_softcap
    d.scale_q = int(desc.scale_q)
    r = desc.rope
    d.rope.ext_factor, d.rope.attn_factor, d.rope.beta_fast, d.rope.beta_slow = (r.ext_factor, r.attn_factor,
                                                                                 r.beta_fast, r.beta_slow)
    d.rope.n_ctx_orig = r.n_ctx_orig
    _fill_tensor(d.tok_embd, desc.tok_embd, keep)
    _fill_tensor(d.output_norm, desc.output_norm, keep)
    _fill_tensor(d.output, desc.output, keep)
    for name in INPUT_TENSORS:
        _fill_tensor(getattr(d, name), getattr(desc, name), keep)
    d.non_causal = int(desc.non_causal)
    d.layers = layers
    return d, keep


def numerics_code(numerics: str) -> int:
    if numerics not in NUMERICS:
        raise ValueError(f"unknown numerics {numerics!r} (choose from {', '.join(NUMERICS)})")
    return NUMERICS[numerics]


MAX_SEQ = int(lib.EL_MAX_SEQ)


def check_n_seq(n_seq: int) -> int:
    if not 1 <= n_seq <= MAX_SEQ:
        raise ValueError(f"{n_seq} sequences is out of range (1..{MAX_SEQ})")
    return int(n_seq)


def plan_bytes(desc: ModelDesc, n_ctx: int, n_batch: int, kv_type: str, n_threads: int,
               numerics: str = "native", n_seq: int = 1) -> tuple[int, int]:
    """(KV cache bytes, scratch bytes) the engine would allocate: computed by the C code that allocates
    (scratch includes what the numerics mode adds; the KV cache counts all n_seq sequences)."""
    if kv_type not in KV_TYPES:
        raise ValueError(f"unknown KV cache type {kv_type!r} (choose from {', '.join(KV_TYPES)})")
    n_ctx, n_batch = c_int32("n_ctx", n_ctx), c_int32("n_batch", n_batch)
    n_threads = c_int32("n_threads", n_threads)
    if desc.pos_embd is not None and n_ctx > desc.pos_embd.ne1:
        raise ValueError(f"a context of {n_ctx} tokens is longer than the model's {desc.pos_embd.ne1} absolute "
                         f"positions (position_embd.weight): -c at most {desc.pos_embd.ne1}")
    d, _keep = _c_desc(desc)
    kv = ffi.new("size_t *")
    scratch = ffi.new("size_t *")
    check(lib.el_model_plan_seqs(d, int(n_ctx), int(min(n_batch, n_ctx)), KV_TYPES[kv_type], int(n_threads),
                                 check_n_seq(n_seq), kv, scratch),
          f"planning a context of {n_ctx}")
    extra = 0
    if numerics != "native":
        extra = int(lib.el_model_numerics_bytes(d, int(n_ctx), int(min(n_batch, n_ctx)), int(n_threads),
                                                numerics_code(numerics)))
    return int(kv[0]), int(scratch[0]) + extra


# enum el_lora_target -> the LayerDesc field of that weight
_LORA_FIELDS = {lora.LAYER_TARGETS[k]: f for k, f in lora.LAYER_FIELDS.items()}

# el_batch_entry as numpy sees it
BATCH_ENTRY = np.dtype([("seq", np.int32), ("token", np.int32), ("pos", np.int32), ("logits", np.int32)])


class Engine:
    """One model instance: n_seq sequences (KV caches of n_ctx positions each), batches of up to
    n_batch tokens. eval / n_past / truncate / shift / state act on sequence 0; decode and the seq_*
    calls on any."""

    def __init__(self, desc: ModelDesc, pool: Pool, n_ctx: int, n_batch: int, kv_type: str = "f16",
                 numerics: str = "native", n_seq: int = 1) -> None:
        if kv_type not in KV_TYPES:
            raise ValueError(f"unknown KV cache type {kv_type!r} (choose from {', '.join(KV_TYPES)})")
        self.desc = desc
        self.pool = pool
        self.n_ctx = c_int32("n_ctx", n_ctx)
        self.n_batch = int(min(n_batch, n_ctx))
        self.kv_type = kv_type
        self.n_seq = check_n_seq(n_seq)
        d, keep = _c_desc(desc)
        out = ffi.new("el_model **")
        with pool._lock:  # not closed meanwhile; from here on the C model holds the pool
            status = lib.el_model_create_seqs(d, pool.ptr, self.n_ctx, self.n_batch, KV_TYPES[kv_type], self.n_seq, out)
        if status != 0:
            raise KernelError("creating the model (shapes, types or memory)", status)
        self._keep = keep  # cffi buffers: the C model points into these views of the file
        self._ptr: Any = out[0]
        self._lock = threading.Lock()  # a call in C, and close, never overlap another thread's
        self._lora_keep: list[tuple[npt.NDArray[np.float32], npt.NDArray[np.float32]]] = []
        self._lora_names: dict[int, str] = {}
        self.numerics = "native"
        if numerics != "native":
            try:
                self.set_numerics(numerics)
            except BaseException:
                self.close()  # the C model holds the pool: free it now, not at garbage collection
                raise

    @property
    def _model(self) -> Any:
        """The C model; call with self._lock held."""
        if self._ptr is None:
            raise ValueError("the engine is closed")
        return self._ptr

    def set_numerics(self, numerics: str) -> None:
        """'native' (this CPU's fastest kernels), 'llamacpp-avx2' / 'llamacpp-avx512' (the float order of
        llama.cpp's AVX2 / AVX-512 x86 build, bit for bit) or 'llamacpp' (the one llama.cpp builds for this
        CPU)."""
        code = numerics_code(numerics)
        with self._lock:
            status = lib.el_model_set_numerics(self._model, code)
        if status == lib.EL_EUNSUPPORTED:
            raise ValueError(f"numerics {numerics!r} needs an f16 KV cache and weights of types Q5_0, Q8_0, Q4_1, "
                             f"Q4_K (rows a multiple of 8) or Q6_K; this model or cache has others")
        check(status, f"switching to {numerics} numerics")
        self.numerics = numerics

    @property
    def kv_bytes(self) -> int:
        with self._lock:
            return int(lib.el_model_kv_bytes(self._model))

    @property
    def scratch_bytes(self) -> int:
        with self._lock:
            return int(lib.el_model_scratch_bytes(self._model))

    def eval(self, tokens: list[int] | npt.NDArray[np.int32], pos0: int, all_logits: bool = False
             ) -> npt.NDArray[np.float32]:
        """Logits of the last token (n_vocab floats), or of every token (n x n_vocab): a new array
        per call, so threads never share one."""
        try:  # int64 first: an id beyond int32 must be refused, not wrapped (C checks the vocabulary)
            ids = np.asarray(tokens, dtype=np.int64)
        except OverflowError:
            raise ValueError("a token id does not fit a 32-bit integer") from None
        n = ids.size
        if n == 0 or n > self.n_batch:
            raise ValueError(f"a batch holds 1..{self.n_batch} tokens, got {n}")
        if int(ids.min()) < INT32_MIN or int(ids.max()) > INT32_MAX:
            raise ValueError("a token id does not fit a 32-bit integer")
        toks = np.ascontiguousarray(ids.astype(np.int32))
        out = np.empty((n, self.desc.n_vocab) if all_logits else self.desc.n_vocab, dtype=np.float32)
        with self._lock:
            status = lib.el_model_eval(self._model, ffi.from_buffer("int32_t[]", toks), n, int(pos0),
                                       ffi.from_buffer("float[]", out), int(all_logits))
            n_past = int(lib.el_model_n_past(self._model)) if status == lib.EL_ECTX else 0
        if status == lib.EL_ECTX and 0 <= pos0 != n_past:
            raise KernelError(f"evaluating {n} tokens at position {pos0}: the KV cache holds {n_past} positions, "
                              f"so the next batch must start at position {n_past}", status)
        check(status, f"evaluating {n} tokens at position {pos0}")
        return out

    @property
    def n_past(self) -> int:
        """Positions the KV cache holds: where the next eval must start."""
        with self._lock:
            return int(lib.el_model_n_past(self._model))

    def truncate(self, pos: int) -> None:
        with self._lock:
            status = lib.el_model_truncate(self._model, int(pos))
        check(status, f"rewinding the KV cache to {pos}")

    def shift(self, n_keep: int, n_discard: int) -> None:
        """Drops cached positions [n_keep, n_keep + n_discard); later ones move down, keys re-rotated."""
        with self._lock:
            status = lib.el_model_shift(self._model, int(n_keep), int(n_discard))
        check(status, f"shifting the KV cache (keep {n_keep}, discard {n_discard})")

    def state(self) -> bytes:
        with self._lock:  # the size and the blob of one cache state
            size = int(lib.el_model_state_size(self._model))
            buf = bytearray(size)
            status = lib.el_model_state_save(self._model, ffi.from_buffer(buf), size)
        check(status, "saving the KV cache")
        return bytes(buf)

    def load_state(self, blob: bytes) -> None:
        with self._lock:
            status = lib.el_model_state_load(self._model, ffi.from_buffer(blob), len(blob))
        check(status, "restoring the KV cache (the session does not fit this model, context, batch or cache type)")

    # ---- several sequences ----
    def decode(self, seqs: list[int], tokens: list[int], positions: list[int], want: list[bool]
               ) -> npt.NDArray[np.float32]:
        """One forward pass over entries of several sequences (entry i: token tokens[i] of sequence
        seqs[i] at positions[i], which continue that sequence's cache in order). Returns the logits of
        the entries with want[i], in entry order (n_want x n_vocab)."""
        return self._decode(seqs, tokens, positions, want, embd=False)

    def decode_embd(self, seqs: list[int], tokens: list[int], positions: list[int], want: list[bool]
                    ) -> npt.NDArray[np.float32]:
        """decode's pass, returning for each entry with want[i] the hidden state the output head reads
        (n_want x n_embd, after the output norm; an encoder's last layer): what embeddings pool. A
        non-causal model (BERT) takes each sequence whole, in one call, from an empty cache."""
        return self._decode(seqs, tokens, positions, want, embd=True)

    def _decode(self, seqs: list[int], tokens: list[int], positions: list[int], want: list[bool], embd: bool
                ) -> npt.NDArray[np.float32]:
        n = len(tokens)
        if not 1 <= n <= self.n_batch or not len(seqs) == len(positions) == len(want) == n:
            raise ValueError(f"a batch holds 1..{self.n_batch} entries, each with a sequence, token, position "
                             f"and logits flag; got {n}")
        b = np.empty(n, dtype=BATCH_ENTRY)
        try:
            b["seq"], b["token"], b["pos"] = seqs, tokens, positions
        except OverflowError:
            raise ValueError("a sequence id, token id or position does not fit a 32-bit integer") from None
        b["logits"] = [1 if w else 0 for w in want]
        n_want = int(b["logits"].sum())
        out = np.empty((n_want, self.desc.n_embd if embd else self.desc.n_vocab), dtype=np.float32)
        call = lib.el_model_decode_embd if embd else lib.el_model_decode
        with self._lock:
            status = call(self._model, ffi.from_buffer("el_batch_entry[]", b), n,
                          ffi.from_buffer("float[]", out) if n_want else ffi.NULL)
            past = ({s: int(lib.el_model_seq_n_past(self._model, s)) for s in set(seqs) if 0 <= s < self.n_seq}
                    if status == lib.EL_ECTX else {})
        if status == lib.EL_ECTX and self.desc.non_causal:
            raise KernelError(f"decoding {n} entries: a non-causal model takes each sequence whole, in one batch "
                              f"from position 0 of an empty sequence, within the context of {self.n_ctx} "
                              f"(cached positions {past})", status)
        if status == lib.EL_ECTX:
            raise KernelError(f"decoding {n} entries: positions must continue each sequence's cache "
                              f"(next positions {past}) within the context of {self.n_ctx}", status)
        if status == lib.EL_EUNSUPPORTED and self.desc.arch == "bert":
            raise ValueError("this is an embedding model (an encoder): it has no output head, so no logits")
        if status == lib.EL_EUNSUPPORTED:
            raise ValueError(f"{self.numerics} numerics evaluates one sequence per batch (its bits are llama.cpp's "
                             f"per sequence); this batch mixes sequences {sorted(set(seqs))}")
        if status == lib.EL_EINVAL:
            raise ValueError(f"decoding {n} entries: a sequence id outside 0..{self.n_seq - 1} or a token id "
                             f"outside 0..{self.desc.n_vocab - 1}")
        check(status, f"decoding {n} entries")
        return out

    def seq_n_past(self, seq: int) -> int:
        with self._lock:
            n = int(lib.el_model_seq_n_past(self._model, int(seq)))
        if n < 0:
            raise ValueError(f"no sequence {seq} (0..{self.n_seq - 1})")
        return n

    def seq_clear(self, seq: int) -> None:
        with self._lock:
            status = lib.el_model_seq_clear(self._model, int(seq))
        check(status, f"clearing sequence {seq}")

    def seq_truncate(self, seq: int, pos: int) -> None:
        with self._lock:
            status = lib.el_model_seq_truncate(self._model, int(seq), int(pos))
        check(status, f"rewinding sequence {seq} to {pos}")

    def seq_shift(self, seq: int, n_keep: int, n_discard: int) -> None:
        with self._lock:
            status = lib.el_model_seq_shift(self._model, int(seq), int(n_keep), int(n_discard))
        check(status, f"shifting sequence {seq} (keep {n_keep}, discard {n_discard})")

    def seq_state(self, seq: int) -> bytes:
        with self._lock:
            size = int(lib.el_model_seq_state_size(self._model, int(seq)))
            buf = bytearray(size)
            status = lib.el_model_seq_state_save(self._model, int(seq), ffi.from_buffer(buf), size)
        check(status, f"saving sequence {seq}")
        return bytes(buf)

    def seq_load_state(self, seq: int, blob: bytes) -> None:
        with self._lock:
            status = lib.el_model_seq_state_load(self._model, int(seq), ffi.from_buffer(blob), len(blob))
        check(status, f"restoring sequence {seq} (a state of another model, context, batch or cache type)")

    # ---- LoRA adapters ----
    def lora_attach(self, index: int, adapter: LoraAdapterLike) -> None:
        """Attaches every weight of adapter as adapter number index (applied after the lower numbers),
        its scale 0 on every sequence until lora_scale. All of adapter's shapes are checked before any
        is attached; an allocation failure while attaching detaches every adapter (lora_clear)."""
        if not 0 <= index < lora.MAX_ADAPTERS:
            raise ValueError(f"adapter number {index} is out of range (0..{lora.MAX_ADAPTERS - 1})")
        if index in self._lora_names:
            raise ValueError(f"adapter number {index} is attached already ({self._lora_names[index]})")
        terms = []
        for name, w in adapter.weights.items():
            layer, target = lora.target_of(name, self.desc.n_layer)
            base = (self.desc.output if target == lora.OUTPUT else
                    getattr(self.desc.layers[layer], _LORA_FIELDS[target]))
            if base is None:
                raise ValueError(f"adapter {adapter.name}: the model has no {name} (its output is the token embedding)")
            rank = int(np.shape(w.a)[0]) if np.ndim(w.a) == 2 else 0
            if not 1 <= rank <= lora.MAX_RANK:
                raise ValueError(f"adapter {adapter.name}: {name} has rank {rank} (1..{lora.MAX_RANK})")
            a, a_type = lora.term_matrix(f"adapter {adapter.name}: {name}.lora_a", w.a, (rank, base.ne0))
            # B transposed ([rank, n_out]: csrc/lora.c's layout); the reader's B is a view of that already
            b, b_type = lora.term_matrix(f"adapter {adapter.name}: {name}.lora_b transposed", np.asarray(w.b).T,
                                         (rank, base.ne1))
            factor = c_float(f"adapter {adapter.name}: {name}'s alpha / rank", adapter.scale_of(name, 1.0))
            terms.append((layer, target, a, a_type, b, b_type, rank, base.ne0, base.ne1, factor, name))
        with self._lock:
            for layer, target, a, a_type, b, b_type, rank, n_in, n_out, factor, name in terms:
                status = lib.el_model_lora_attach_typed(self._model, index, layer, target, a_type, ffi.from_buffer(a),
                                                        b_type, ffi.from_buffer(b), rank, n_in, n_out, factor)
                if status != 0:
                    lib.el_model_lora_clear(self._model)
                    self._lora_keep.clear()
                    self._lora_names.clear()
                    check(status, f"attaching adapter {adapter.name}'s {name} (every adapter is detached)")
                self._lora_keep.append((a, b))  # the C model reads these arrays in every pass
            self._lora_names[index] = adapter.name

    def lora_scale(self, index: int, scale: float, seq: int | None = None) -> None:
        """Adapter index's scale (the user's: the engine multiplies each weight's alpha / rank) for
        sequence seq, or every sequence. 0 turns it off there: that sequence gets the base model's bits."""
        if index not in self._lora_names:
            raise ValueError(f"no adapter number {index} is attached (attached: {sorted(self._lora_names)})")
        if seq is not None and not 0 <= seq < self.n_seq:
            raise ValueError(f"no sequence {seq} (0..{self.n_seq - 1})")
        value = c_float(f"the scale of adapter {self._lora_names[index]}", scale)
        with self._lock:
            status = lib.el_model_lora_scale(self._model, int(index), -1 if seq is None else int(seq), value)
        check(status, f"setting adapter {index}'s scale")

    def lora_clear(self) -> None:
        """Detaches every adapter."""
        with self._lock:
            status = lib.el_model_lora_clear(self._model)
            self._lora_keep.clear()
            self._lora_names.clear()
        check(status, "detaching the LoRA adapters")

    @property
    def lora_names(self) -> dict[int, str]:
        """The attached adapters' names by number."""
        return dict(self._lora_names)

    def close(self) -> None:
        """Frees the model (after a call another thread is making returns); later calls raise ValueError."""
        lock = getattr(self, "_lock", None)  # absent when __init__ failed before it
        if lock is None:
            return
        with lock:
            if self._ptr is not None:
                lib.el_model_free(self._ptr)
                self._ptr = None

    def __del__(self) -> None:
        self.close()

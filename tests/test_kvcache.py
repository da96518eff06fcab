"""The KV cache under a RAM budget: streaming past the context with constant memory and no allocation
in the decode loop, shifts that keep positions consistent, the memory plan, session save/restore."""

from __future__ import annotations

import ctypes
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from numpy_reference import as_f32
from test_engine import engine_heap_bytes, heap_matches_plan

from edgellama import memplan
from edgellama.llm import LLM, ContextFull
from edgellama.sampling import Sampler, SamplerParams
from edgellama.session import SessionError


def _rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


_mallinfo2 = ctypes.CDLL(None).mallinfo2
_mallinfo2.restype = _MallInfo2


def _malloc_in_use() -> int:
    info = _mallinfo2()
    return int(info.uordblks + info.hblkhd)


def test_generating_4x_the_context_keeps_memory_flat_and_the_decode_loop_allocation_free(smollm2_path: Path) -> None:
    with LLM(smollm2_path, n_ctx=128, n_batch=32, n_keep=8, n_threads=2) as llm:
        prompt = llm.tokenizer.encode("Once upon a time, in a small village by the sea,")
        sampler = Sampler(SamplerParams(temp=0.8, seed=3))
        samples = []
        for i, ev in enumerate(llm.generate(prompt, sampler, 4 * 128, stop_ids=set())):
            if i >= 128 and i % 16 == 0:  # after the first shift: every buffer has been touched
                samples.append(_rss_kb())
        assert llm.n_shifts >= 4
        assert max(samples) - min(samples) < 512, samples  # kB: flat, not a snapshot
        # the C engine itself: the heap is exactly as large after 200 decode steps and their shifts
        from edgellama.native.lib import ffi, lib

        ptr = llm.engine._ptr
        tok = ffi.new("int32_t[1]", [int(prompt[0])])
        out = ffi.new("float[]", llm.n_vocab)
        pos = len(llm.tokens)

        def decode(steps: int, pos: int) -> int:
            for _ in range(steps):
                if pos == llm.n_ctx:
                    assert lib.el_model_shift(ptr, 8, 60) == 0
                    pos -= 60
                assert lib.el_model_eval(ptr, tok, 1, pos, out, 0) == 0
                pos += 1
            return pos

        pos = decode(100, pos)  # warm-up: the interpreter's own first-call allocations
        before = _malloc_in_use()
        decode(200, pos)
        assert _malloc_in_use() == before


def test_after_shifts_logits_stay_finite_and_the_text_stays_coherent(gemma_path: Path) -> None:
    with LLM(gemma_path, n_ctx=96, n_batch=32, n_keep=4, n_threads=2) as llm:
        prompt = llm.tokenizer.encode("The three laws of thermodynamics are")
        engine_eval = llm.engine.eval

        def finite_eval(*args: Any, **kwargs: Any) -> Any:
            logits = engine_eval(*args, **kwargs)
            assert np.isfinite(logits).all()
            return logits

        llm.engine.eval = finite_eval  # type: ignore[method-assign]
        text = ""
        for ev in llm.generate(prompt, Sampler(SamplerParams(temp=0.0, repeat_penalty=1.2)), 300, stop_ids=set()):
            text += ev.text
        assert llm.n_shifts >= 3
        words = text.split()
        assert len(words) > 100 and len(set(words)) > 30  # not a degenerate loop of one token


def test_a_shift_equals_evaluating_the_shortened_sequence_afresh(smollm2_path: Path) -> None:
    """In a one-layer model a cached key depends only on its token and position, so after a shift the
    re-rotated keys must equal those of the kept tokens evaluated afresh at their new positions. Float
    weights and an F32 cache keep 8-bit rounding from amplifying the difference."""
    import copy

    from edgellama.native.engine import Engine, Pool

    with LLM(smollm2_path, n_ctx=64) as llm:
        d32 = as_f32(llm.desc)
    d32 = copy.copy(d32)
    d32.layers = d32.layers[:1]
    d32.n_layer = 1
    pool = Pool(2)
    toks = list(range(100, 150))
    keep, drop = 5, 20
    a = Engine(d32, pool, 64, 64, "f32")
    a.eval(toks, 0)
    a.shift(keep, drop)
    nxt = [7, 8, 9]
    got = a.eval(nxt, len(toks) - drop, all_logits=True).copy()
    b = Engine(d32, pool, 64, 64, "f32")
    want = b.eval(toks[:keep] + toks[keep + drop:] + nxt, 0, all_logits=True)[-3:]
    assert np.abs(got - want).max() < 1e-3


def _nll(row: np.ndarray, target: int) -> float:
    m = float(row.max())
    return -(float(row[target]) - m - math.log(float(np.exp(row - m).sum())))


@pytest.mark.slow
def test_streaming_perplexity_stays_close_to_windowed_evaluation(smollm2_path: Path) -> None:
    """The same tokens scored two ways at n_ctx 256: windowed (llama.cpp's method: fresh chunks, the
    second half scored) and streaming (one pass over the text, the cache shifting whenever it is
    full, keeping 4 sink tokens). Both give every scored token 128..255 tokens of history."""
    from conftest import reference_dir

    n_ctx, bos = 256, 1
    text = (reference_dir() / "ppl-text.txt").read_text()
    with LLM(smollm2_path, n_ctx=n_ctx, n_batch=64, n_keep=4) as llm:
        toks = [bos] + llm.tokenizer.encode(text, add_special=False)[: 8 * n_ctx - 1]
        windowed: dict[int, float] = {}
        for c in range(len(toks) // n_ctx):
            chunk = toks[c * n_ctx:(c + 1) * n_ctx]
            chunk[0] = bos
            llm.reset()
            logits = llm.eval(chunk, all_logits=True)
            for j in range(n_ctx // 2, n_ctx - 1):
                windowed[c * n_ctx + j + 1] = _nll(logits[j], chunk[j + 1])
        llm.reset()
        streaming: dict[int, float] = {}
        for i in range(0, len(toks) - 1, 64):
            logits = llm.eval(toks[i:i + 64], all_logits=True)
            for k, row in enumerate(logits):
                if i + k + 1 in windowed:
                    streaming[i + k + 1] = _nll(row, toks[i + k + 1])
        assert llm.n_shifts > 5
        assert np.isfinite(list(streaming.values())).all()
    assert streaming.keys() == windowed.keys()
    ppl_w = math.exp(float(np.mean(list(windowed.values()))))
    ppl_s = math.exp(float(np.mean(list(streaming.values()))))
    print(f"same {len(windowed)} tokens: windowed ppl {ppl_w:.3f}, streaming ppl {ppl_s:.3f}")
    assert abs(ppl_s / ppl_w - 1.0) < 0.05


def test_plan_refuses_a_budget_too_small_before_allocating(smollm2_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import edgellama.llm as llm_mod

    def no_engine(*a: object, **k: object) -> None:
        raise AssertionError("the engine (KV cache, scratch) must not be created for a model that does not fit")

    monkeypatch.setattr(llm_mod, "Engine", no_engine)
    with pytest.raises(memplan.BudgetError) as exc:
        LLM(smollm2_path, mem_budget=memplan.parse_size("50M"))
    assert "weights" in str(exc.value) and "KV cache" in str(exc.value)
    with pytest.raises(memplan.BudgetError, match="context of 8192"):
        LLM(smollm2_path, n_ctx=8192, mem_budget=memplan.parse_size("150M"))


def test_budget_picks_the_largest_context_that_fits(smollm2_path: Path) -> None:
    with LLM(smollm2_path, n_ctx=64) as llm:
        desc = llm.desc
    budget = memplan.parse_size("200M")
    plan = memplan.choose_plan(desc, None, 8192, 512, "f16", 2, budget)
    assert plan.fits and plan.n_ctx < 8192
    assert not memplan.make_plan(desc, plan.n_ctx + 1, 512, "f16", 2, budget).fits
    with LLM(smollm2_path, mem_budget=budget, n_threads=2) as llm:
        assert (llm.n_ctx, llm.n_batch) == (plan.n_ctx, plan.n_batch)
    # and an engine of that plan allocates what the plan counted (glibc's count, not the engine's)
    [(got, mmapped)] = engine_heap_bytes(smollm2_path, [(plan.n_ctx, plan.n_batch, "f16", 2, "native")])
    assert heap_matches_plan(desc, got, plan.kv_cache + plan.scratch, mmapped)


def test_parse_size() -> None:
    assert memplan.parse_size("300M") == 300 << 20
    assert memplan.parse_size("1.5G") == 3 << 29
    assert memplan.parse_size("512MiB") == 512 << 20
    for bad in ("", "lots", "-1G", "1.2.3M"):
        with pytest.raises(ValueError):
            memplan.parse_size(bad)


def test_session_restore_gives_identical_next_token_logits(smollm2_path: Path, tmp_path: Path) -> None:
    sess = tmp_path / "kiosk.session"
    with LLM(smollm2_path, n_ctx=256, n_batch=64) as llm:
        system = llm.tokenizer.encode("You are the help desk of the Central Library. Opening hours: 9 to 5. " * 3)
        llm.eval(system)
        llm.save_session(sess)
        question = llm.tokenizer.encode(" When do you open?")
        want = llm.eval(question).copy()
    with LLM(smollm2_path, n_ctx=256, n_batch=64) as llm2:
        assert llm2.load_session(sess) == system
        got = llm2.eval(question).copy()
    assert np.array_equal(got, want)


def test_session_mismatch_and_damage_are_clear_errors(smollm2_path: Path, gemma_path: Path, tmp_path: Path) -> None:
    sess = tmp_path / "s.session"
    with LLM(smollm2_path, n_ctx=128, n_batch=32) as llm:
        llm.eval([1, 2, 3, 4])
        llm.save_session(sess)
    with LLM(smollm2_path, n_ctx=256, n_batch=32) as other_ctx, pytest.raises(SessionError, match="n_ctx"):
        other_ctx.load_session(sess)
    with LLM(gemma_path, n_ctx=128, n_batch=32) as other_model, pytest.raises(SessionError, match="another model"):
        other_model.load_session(sess)
    # the numerics mode, both ways: a cache filled under one mode's roundings does not continue the other's
    with LLM(smollm2_path, n_ctx=128, n_batch=32, numerics="llamacpp") as exact:
        with pytest.raises(SessionError, match="saved for native numerics, now llamacpp"):
            exact.load_session(sess)
        assert exact.tokens == []
        exact.eval([1, 2, 3, 4])
        exact.save_session(tmp_path / "exact.session")
    with LLM(smollm2_path, n_ctx=128, n_batch=32) as native:
        with pytest.raises(SessionError, match="saved for llamacpp numerics, now native"):
            native.load_session(tmp_path / "exact.session")
        native.load_session(sess)  # its own mode still loads
    raw = bytearray(sess.read_bytes())
    raw[-10] ^= 0xFF
    (tmp_path / "bad.session").write_bytes(bytes(raw))
    (tmp_path / "short.session").write_bytes(bytes(raw[: len(raw) // 2]))
    (tmp_path / "junk.session").write_bytes(b"not a session")
    with LLM(smollm2_path, n_ctx=128, n_batch=32) as llm:
        for name in ("bad", "short", "junk"):
            with pytest.raises(SessionError):
                llm.load_session(tmp_path / f"{name}.session")
        assert llm.tokens == []  # a refused session leaves the cache empty and usable
        assert np.isfinite(llm.eval([1, 2])).all()


def test_context_full_without_shift_is_an_error(smollm2_path: Path) -> None:
    with LLM(smollm2_path, n_ctx=64, context_shift=False) as llm:
        with pytest.raises(ContextFull):
            llm.prefill(list(range(65)))
        llm.eval(list(range(60)))
        with pytest.raises(ContextFull):
            llm.eval(list(range(10)))

"""LoRA adapters applied at run time (csrc/lora.c through Engine.lora_attach and LLM(loras=...)) on
SmolLM2 and gemma3: logits against a float64 numpy forward of the merged weights, scale 0 and B = 0
give the base model's bits, two adapters add, per-sequence scales in one batch, refusals, the plan.

Adapters are built in memory (random low-rank A and B); reading adapter files is tests/test_lora_format.py's."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import numpy as np
import numpy_reference as ref
import pytest

from edgellama.gguf.reader import GGUFFile
from edgellama.native import lora
from edgellama.native.desc import ModelDesc, TensorRef
from edgellama.native.engine import Engine, Pool
from edgellama.wiring import build_desc

try:
    from edgellama.lora.adapter import LoraAdapter, LoraWeight
except ImportError:  # the reader lands separately: stand-ins with its fields
    @dataclasses.dataclass(frozen=True, eq=False)
    class LoraWeight:  # type: ignore[no-redef]
        a: Any
        b: Any

        @property
        def rank(self) -> int:
            return int(self.a.shape[0])

    @dataclasses.dataclass
    class LoraAdapter:  # type: ignore[no-redef]
        path: Path
        name: str
        alpha: float
        weights: dict[str, Any]

        def scale_of(self, base_name: str, user_scale: float) -> float:
            rank = self.weights[base_name].rank
            if self.alpha == 0:
                return float(np.float32(user_scale))
            return float(np.float32(user_scale) * np.float32(self.alpha) / np.float32(rank))

        @property
        def nbytes(self) -> int:
            return sum(w.a.nbytes + w.b.nbytes for w in self.weights.values())


FIELDS = lora.LAYER_FIELDS  # GGUF name -> LayerDesc field
SMOL_IDS = [1, 504, 3458, 282, 4649, 314, 2114, 30]
GEMMA_IDS = [2, 818, 5279, 529, 7001, 563]


def _load(path: Path) -> ModelDesc:
    return build_desc(GGUFFile(path))[1]


def _base(desc: ModelDesc, name: str) -> TensorRef:
    if name == "output.weight":
        assert desc.output is not None
        return desc.output
    _blk, il, kind, _w = name.split(".")
    t = getattr(desc.layers[int(il)], FIELDS[kind])
    assert isinstance(t, TensorRef)
    return t


def random_adapter(desc: ModelDesc, layers: list[int], rank: int, alpha: float, seed: int, b_scale: float = 0.05,
                   name: str = "test") -> Any:
    """An adapter on every attention and FFN matrix of the given layers, random A (unit rows over
    n_in) and B."""
    rng = np.random.default_rng(seed)
    weights = {}
    for il in layers:
        for kind in FIELDS:
            nm = f"blk.{il}.{kind}.weight"
            t = _base(desc, nm)
            a = (rng.standard_normal((rank, t.ne0)) / np.sqrt(t.ne0)).astype(np.float32)
            b = (rng.standard_normal((t.ne1, rank)) * b_scale).astype(np.float32)
            weights[nm] = LoraWeight(a, b)
    return LoraAdapter(Path(f"{name}.gguf"), name, alpha, weights)


def as_f32(desc: ModelDesc, merged: dict[str, np.ndarray] | None = None) -> ModelDesc:
    """desc with every weight in F32 (numpy_reference.as_f32), the merged deltas (float64, rounded once
    to float32 with the weight) added to the named weights."""
    d = ref.as_f32(desc)
    for name, delta in (merged or {}).items():
        t = _base(d, name)
        w = np.frombuffer(t.data, dtype=np.float32).reshape(t.ne1, t.ne0).astype(np.float64) + delta
        new = TensorRef(w.astype(np.float32).view(np.uint8).reshape(-1), 0, t.ne0, t.ne1)
        if name == "output.weight":
            d.output = new
        else:
            _b, il, kind, _w = name.split(".")
            setattr(d.layers[int(il)], FIELDS[kind], new)
    return d


def merged_deltas(pairs: list[tuple[Any, float]]) -> dict[str, np.ndarray]:
    """sum over adapters of scale_of(name, s) * B @ A, in float64."""
    out: dict[str, np.ndarray] = {}
    for ad, s in pairs:
        for nm, w in ad.weights.items():
            d = ad.scale_of(nm, s) * (w.b.astype(np.float64) @ w.a.astype(np.float64))
            out[nm] = out.get(nm, 0) + d
    return out


def engine_with(desc: ModelDesc, pairs: list[tuple[Any, float]], n_seq: int = 1, kv: str = "f16") -> Engine:
    eng = Engine(desc, Pool(2), 64, 64, kv, n_seq=n_seq)
    for i, (ad, s) in enumerate(pairs):
        eng.lora_attach(i, ad)
        eng.lora_scale(i, s)
    return eng


# ---- against float64 numpy of the merged weights ----

@pytest.mark.parametrize("model", ["smollm2", "gemma"])
def test_logits_match_float64_reference_of_merged_weights(model: str, request: pytest.FixtureRequest) -> None:
    desc = _load(request.getfixturevalue(f"{model}_path"))
    ids = SMOL_IDS if model == "smollm2" else GEMMA_IDS
    last = desc.n_layer - 1
    # ranks 1, 8 and 16; alpha 0 (factor 1), alpha = 2 rank, alpha < rank; several layers each
    pairs = [(random_adapter(desc, [0, last], 1, 0.0, 1, name="r1"), 0.8),
             (random_adapter(desc, [1, last // 2], 8, 16.0, 2, name="r8"), 1.0),
             (random_adapter(desc, [0, 2, last], 16, 4.0, 3, name="r16"), -1.5)]
    d32 = as_f32(desc)
    base = engine_with(d32, []).eval(ids, 0, all_logits=True)
    ours = engine_with(d32, pairs, kv="f32").eval(ids, 0, all_logits=True)
    emb = ref.deq(d32.tok_embd)
    want = ref.forward(as_f32(desc, merged_deltas(pairs)), ids, emb)
    err = float(np.abs(ours - want).max())
    moved = float(np.abs(want - base).max())
    # the same tolerances as the base model's F32 comparison (tests/test_engine.py): float32
    # accumulation (SmolLM2), GELU rounded through fp16 (gemma)
    tol = 2e-3 if model == "smollm2" else 5e-2
    print(f"{model}: adapters move the logits by {moved:.3f}; engine vs float64 merged: {err:.2e}")
    assert moved > 20 * tol, moved  # the adapters matter far beyond the tolerance
    assert err < tol, err
    assert (ours.argmax(axis=1) == want.argmax(axis=1)).all()


# ---- exact properties on the quantized models ----

@pytest.mark.parametrize("model", ["smollm2", "gemma"])
def test_scale_zero_and_zero_b_give_the_base_bits(model: str, request: pytest.FixtureRequest) -> None:
    desc = _load(request.getfixturevalue(f"{model}_path"))
    ids = SMOL_IDS if model == "smollm2" else GEMMA_IDS
    ad = random_adapter(desc, list(range(desc.n_layer)), 16, 32.0, 4)
    zero_b = LoraAdapter(Path("z.gguf"), "zero-b", 16.0,
                         {n: LoraWeight(w.a, np.zeros_like(w.b)) for n, w in ad.weights.items()})
    base = engine_with(desc, []).eval(ids, 0, all_logits=True)
    eng = engine_with(desc, [(ad, 0.0)])
    assert np.array_equal(eng.eval(ids, 0, all_logits=True), base)  # attached, scale 0
    eng.lora_scale(0, 1.0)
    eng.truncate(0)
    on = eng.eval(ids, 0, all_logits=True)
    assert np.abs(on - base).max() > 0.05
    eng.lora_scale(0, 0.0)
    eng.truncate(0)
    assert np.array_equal(eng.eval(ids, 0, all_logits=True), base)  # back off
    assert np.array_equal(engine_with(desc, [(zero_b, 1.0)]).eval(ids, 0, all_logits=True), base)


@pytest.mark.parametrize("model", ["smollm2", "gemma"])
def test_two_adapters_add(model: str, request: pytest.FixtureRequest) -> None:
    """Adapters at s1, s2 == one adapter of rank r1 + r2 holding A = [A1; A2], B = [f1 B1 | f2 B2]
    (f: scale_of), alpha = its rank (factor 1), scale 1. On F32 weights and cache: with quantized
    activations a last-bit difference can move a value across a rounding step of the next layer's
    quantization, which is not what this compares."""
    desc = as_f32(_load(request.getfixturevalue(f"{model}_path")))
    ids = SMOL_IDS if model == "smollm2" else GEMMA_IDS
    layers = [0, 1, desc.n_layer - 1]
    a1, a2 = random_adapter(desc, layers, 4, 8.0, 5), random_adapter(desc, layers, 8, 0.0, 6)
    s1, s2 = 0.75, -0.5
    stacked = {}
    for nm in a1.weights:
        w1, w2 = a1.weights[nm], a2.weights[nm]
        a = np.ascontiguousarray(np.vstack([w1.a, w2.a]))
        b = np.ascontiguousarray(np.hstack([a1.scale_of(nm, s1) * w1.b, a2.scale_of(nm, s2) * w2.b]))
        stacked[nm] = LoraWeight(a.astype(np.float32), b.astype(np.float32))
    one = LoraAdapter(Path("s.gguf"), "stacked", 12.0, stacked)
    base = engine_with(desc, [], kv="f32").eval(ids, 0, all_logits=True)
    two_out = engine_with(desc, [(a1, s1), (a2, s2)], kv="f32").eval(ids, 0, all_logits=True)
    one_out = engine_with(desc, [(one, 1.0)], kv="f32").eval(ids, 0, all_logits=True)
    moved, err = float(np.abs(two_out - base).max()), float(np.abs(two_out - one_out).max())
    print(f"{model}: two adapters move the logits by {moved:.3f}; vs the stacked one: {err:.2e}")
    # the sum of two rank-r dots against one dot over both (float32, fed through every layer):
    # measured 2.4e-5 (SmolLM2), 4.5e-3 (gemma: its GELU reads an fp16 table, so a last-bit input
    # difference can become an fp16 step) on logits of magnitude ~20
    tol = 1e-3 if model == "smollm2" else 5e-2
    assert moved > 20 * tol and err < tol, (moved, err)


def test_batched_sequences_use_their_own_scales(smollm2_path: Path) -> None:
    """Sequence 0 with the adapter, sequence 1 without (and 2 at another scale) in the same passes:
    each gets the bits of its run alone."""
    desc = _load(smollm2_path)
    ad = random_adapter(desc, [0, 3, 7], 8, 16.0, 7)
    ids = [SMOL_IDS, SMOL_IDS[::-1], SMOL_IDS[2:] + SMOL_IDS[:2]]
    scales = [1.0, 0.0, 0.4]
    solo = []
    for s, toks in zip(scales, ids):
        eng = engine_with(desc, [(ad, s)])
        solo.append(eng.eval(toks, 0, all_logits=True))
    eng = engine_with(desc, [(ad, 0.0)], n_seq=3)
    for seq, s in enumerate(scales):
        eng.lora_scale(0, s, seq)
    # interleaved entries in two passes (5 then 3 tokens per sequence), every logits row wanted
    got: list[list[np.ndarray]] = [[], [], []]
    for lo, hi in ((0, 5), (5, 8)):
        seqs, toks, pos = [], [], []
        for i in range(lo, hi):
            for seq in range(3):
                seqs.append(seq), toks.append(ids[seq][i]), pos.append(i)
        out = eng.decode(seqs, toks, pos, [True] * len(toks))
        for row, seq in zip(out, seqs):
            got[seq].append(row)
    for seq in range(3):
        assert np.array_equal(np.stack(got[seq]), solo[seq]), seq
    assert not np.array_equal(solo[0][-1], engine_with(desc, []).eval(ids[0], 0))


def test_llamacpp_numerics_applies_adapters(smollm2_path: Path) -> None:
    """Under --numerics llamacpp the terms are added after the mode's own matmuls: scale 0 keeps its
    bits, an adapter moves the logits as much as in native numerics."""
    desc = _load(smollm2_path)
    ad = random_adapter(desc, [0, 4, 9], 8, 16.0, 13)

    def run(numerics: str, scale: float | None) -> np.ndarray:
        eng = Engine(desc, Pool(2), 64, 64, "f16", numerics=numerics)
        if scale is not None:
            eng.lora_attach(0, ad)
            eng.lora_scale(0, scale)
        return eng.eval(SMOL_IDS, 0, all_logits=True)

    base, native_base = run("llamacpp", None), run("native", None)
    assert np.array_equal(run("llamacpp", 0.0), base)
    moved, native_moved = run("llamacpp", 1.0) - base, run("native", 1.0) - native_base
    assert np.abs(moved).max() > 0.1
    # the same change to the logits, up to how the two modes' activation rounding carries it through
    # 30 layers: the changes agree in direction (correlation over every logit)
    corr = float(np.corrcoef(moved.ravel(), native_moved.ravel())[0, 1])
    print(f"llamacpp vs native numerics: the adapter's change to the logits correlates {corr:.3f}")
    assert corr > 0.9, corr


# ---- refusals, plan, LLM ----

def test_refusals(smollm2_path: Path) -> None:
    desc = _load(smollm2_path)
    eng = Engine(desc, Pool(1), 64, 16, "f16")
    good = random_adapter(desc, [0], 2, 0.0, 8)
    w = good.weights["blk.0.attn_q.weight"]

    def one(name: str, a: Any, b: Any) -> Any:
        return LoraAdapter(Path("x.gguf"), "x", 0.0, {name: LoraWeight(a, b)})

    with pytest.raises(ValueError, match="token_embd.weight"):
        eng.lora_attach(0, one("token_embd.weight", w.a, w.b))
    with pytest.raises(ValueError, match="blk.99.attn_q.weight"):
        eng.lora_attach(0, one("blk.99.attn_q.weight", w.a, w.b))
    with pytest.raises(ValueError, match="shape"):
        eng.lora_attach(0, one("blk.0.attn_k.weight", w.a, w.b))  # k has fewer rows than q
    with pytest.raises(ValueError, match="shape"):
        eng.lora_attach(0, one("blk.0.attn_q.weight", w.a[:, :-1], w.b))
    with pytest.raises(ValueError, match="not finite"):
        eng.lora_attach(0, one("blk.0.attn_q.weight", w.a, np.full_like(w.b, np.nan)))
    with pytest.raises(ValueError, match="output"):
        eng.lora_attach(0, one("output.weight", w.a, w.b))  # SmolLM2's output is the embedding
    with pytest.raises(ValueError, match="rank"):
        eng.lora_attach(0, one("blk.0.attn_q.weight", w.a[:0], w.b[:, :0]))
    with pytest.raises(ValueError, match="out of range"):
        eng.lora_attach(lora.MAX_ADAPTERS, good)
    assert eng.lora_names == {}  # nothing half attached
    eng.lora_attach(0, good)
    with pytest.raises(ValueError, match="attached already"):
        eng.lora_attach(0, good)
    with pytest.raises(ValueError, match="no adapter number 1"):
        eng.lora_scale(1, 1.0)
    with pytest.raises(ValueError, match="no sequence 1"):
        eng.lora_scale(0, 1.0, seq=1)
    with pytest.raises(ValueError, match="finite"):
        eng.lora_scale(0, float("inf"))
    eng.lora_clear()
    assert eng.lora_names == {}


@pytest.mark.parametrize("model", ["smollm2", "gemma"])
def test_f16_adapter_is_read_as_halves_with_the_bits_of_its_f32_values(model: str,
                                                                       request: pytest.FixtureRequest) -> None:
    """An adapter held as float16 (how the reader keeps F16 files) is attached as halves and gives,
    prompt and decode steps alike, the bits of the same values widened to float32; the plan counts
    2 bytes a value."""
    desc = _load(request.getfixturevalue(f"{model}_path"))
    ids = SMOL_IDS if model == "smollm2" else GEMMA_IDS
    ad = random_adapter(desc, list(range(desc.n_layer)), 16, 16.0, 7)
    half = LoraAdapter(Path("h.gguf"), "half", ad.alpha,
                       {n: LoraWeight(w.a.astype(np.float16), w.b.astype(np.float16)) for n, w in ad.weights.items()})
    wide = LoraAdapter(Path("w.gguf"), "wide", ad.alpha,
                       {n: LoraWeight(w.a.astype(np.float32), w.b.astype(np.float32)) for n, w in half.weights.items()})
    assert half.nbytes * 2 == wide.nbytes
    runs = []
    for a in (half, wide):
        eng = engine_with(desc, [(a, 1.0)])
        prompt = eng.eval(ids, 0, all_logits=True)
        steps = [eng.eval([t], len(ids) + i) for i, t in enumerate(ids[:4])]  # one row a pass: the matvec path
        runs.append((prompt, np.stack(steps)))
    assert np.array_equal(runs[0][0], runs[1][0]) and np.array_equal(runs[0][1], runs[1][1])
    assert np.abs(runs[0][0] - engine_with(desc, []).eval(ids, 0, all_logits=True)).max() > 0.05


def test_plan_counts_adapters_and_scratch(smollm2_path: Path) -> None:
    from edgellama.memplan import make_plan

    desc = _load(smollm2_path)
    ads = [random_adapter(desc, [0, 1], 4, 0.0, 9), random_adapter(desc, [2], 32, 0.0, 10)]
    base = make_plan(desc, 128, 32, "f16", 2)
    p = make_plan(desc, 128, 32, "f16", 2, loras=ads)
    scratch = lora.scratch_bytes(32, 32)
    assert scratch >= 32 * 32 * 4
    assert p.lora == sum(a.nbytes for a in ads) + scratch and p.n_lora == 2
    assert p.total == base.total + p.lora and "LoRA adapters (2)" in p.table()
    eng = Engine(desc, Pool(1), 128, 32, "f16")
    before = eng.scratch_bytes
    for i, ad in enumerate(ads):
        eng.lora_attach(i, ad)
    assert eng.scratch_bytes == before + scratch  # what the plan said the engine allocates


def test_llm_loras_and_scales(smollm2_path: Path, tmp_path: Path) -> None:
    from edgellama.llm import LLM

    desc = _load(smollm2_path)
    ad = random_adapter(desc, [0, 5], 8, 16.0, 11)
    with LLM(smollm2_path, n_ctx=64, n_batch=16, n_threads=1) as plain:
        base = plain.eval(SMOL_IDS).copy()
    with LLM(smollm2_path, n_ctx=64, n_batch=16, n_threads=1, loras=[(ad, 0.5)]) as llm:
        assert llm.plan.n_lora == 1 and llm.plan.lora >= ad.nbytes
        on = llm.eval(SMOL_IDS).copy()
        assert np.abs(on - base).max() > 0.05
        llm.set_lora_scale(0, 0.0)
        assert llm.tokens == []  # the cache held keys of the old scale
        assert np.array_equal(llm.eval(SMOL_IDS), base)
        llm.set_lora_scale(0, 0.5)
        assert np.array_equal(llm.eval(SMOL_IDS), on)
        with pytest.raises(ValueError, match="no adapter number 3"):
            llm.set_lora_scale(3, 1.0)
        before = llm.plan.lora
        extra = random_adapter(desc, [1], 2, 0.0, 12)
        i = llm.add_lora(extra, 1.0)
        assert i == 1 and not np.array_equal(llm.eval(SMOL_IDS), on)
        assert llm.plan.n_lora == 2 and llm.plan.lora == before + extra.nbytes  # the plan counts it
        llm.save_session(tmp_path / "s.bin")
    with LLM(smollm2_path, n_ctx=64, n_batch=16, n_threads=1) as plain:
        from edgellama.session import SessionError

        with pytest.raises(SessionError, match="lora"):  # its cache was computed with the adapters
            plain.load_session(tmp_path / "s.bin")


def test_add_lora_past_the_memory_budget_is_refused_with_the_plan(smollm2_path: Path) -> None:
    from edgellama.llm import LLM
    from edgellama.memplan import BudgetError

    desc = _load(smollm2_path)
    small, big = random_adapter(desc, [0], 2, 0.0, 13), random_adapter(desc, list(range(8)), 64, 0.0, 14)
    with LLM(smollm2_path, n_ctx=64, n_batch=16, n_threads=1) as probe:
        budget = probe.plan.total + small.nbytes + (1 << 20)  # room for the small adapter, not the big one
    with LLM(smollm2_path, n_ctx=64, n_batch=16, n_threads=1, mem_budget=budget) as llm:
        assert llm.add_lora(small) == 0
        with pytest.raises(BudgetError, match="does not fit the memory budget") as e:
            llm.add_lora(big)
        assert "LoRA adapters" in str(e.value)  # the plan's table
        assert len(llm.loras) == 1 and llm.plan.n_lora == 1 and llm.plan.fits
        assert llm.engine.lora_names == {0: small.name}


# ---- the command line, on adapter files (the reader and tests/lora_util.py's writer) ----

def _cli(*args: str) -> Any:
    import os
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    return subprocess.run([sys.executable, "-m", "edgellama.cli", *args], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, PYTHONPATH=str(root)), cwd=root, check=False)


def test_cli_run_lora_and_lora_scaled(smollm2_path: Path, tmp_path: Path) -> None:
    """run --lora FILE changes greedy text, --lora-scaled FILE 0 gives the base text; info --plan
    counts the adapter."""
    lora_util = pytest.importorskip("lora_util", reason="tests/lora_util.py (the adapter writer) lands with the reader")
    base = GGUFFile(smollm2_path)
    path = lora_util.write_adapter(tmp_path / "a.gguf", "llama", 8.0,
                                   lora_util.random_adapter(base, 8, seed=3, amplitude=4.0))
    common = ["run", "-m", str(smollm2_path), "-c", "128", "-t", "1", "-p", "The capital of France is", "-n", "12",
              "--temp", "0"]
    plain, zero, on = _cli(*common), _cli(*common, "--lora-scaled", str(path), "0"), _cli(*common, "--lora", str(path))
    for p in (plain, zero, on):
        assert p.returncode == 0, p.stderr
    assert zero.stdout == plain.stdout
    assert on.stdout != plain.stdout
    plan = _cli("info", str(smollm2_path), "--plan", "-c", "128", "--lora", str(path))
    assert plan.returncode == 0, plan.stderr
    assert "LoRA adapters (1)" in plan.stdout
    bad = _cli(*common, "--lora", str(tmp_path / "missing.gguf"))
    assert bad.returncode != 0 and "missing.gguf" in bad.stderr


# ---- serve: per-request adapter scales (protocol v1 field "lora", llama-server's) ----

def test_protocol_lora_field() -> None:
    from edgellama.service import protocol as P

    def req(lora: Any) -> Any:
        return P.parse_line(json.dumps({"id": 1, "prompt": "x", "lora": lora}).encode())

    r = req([{"id": 1, "scale": 0.5}, {"id": 0, "scale": -1}])
    assert r.lora == [(1, 0.5), (0, -1.0)]
    assert P.lora_scales(r, [1.0, 1.0, 2.0]) == [-1.0, 0.5, 0.0]  # listed at their scales, the others 0
    assert P.lora_scales(P.parse_line(b'{"id": 1, "prompt": "x"}'), [1.0]) is None  # the start-up scales
    with pytest.raises(P.ProtocolError, match="no adapter 1"):
        P.lora_scales(r, [1.0])
    for bad, msg in (({"id": 0}, "must be a list"), ([{"id": 0}], "lora\\[0\\] is not"),
                     ([{"id": True, "scale": 1}], "lora\\[0\\] is not"), ([{"id": 0, "scale": "1"}], "is not"),
                     ([{"id": 0, "scale": 1e300}], "finite"), ([{"id": 0, "scale": 1}, {"id": 0, "scale": 2}], "twice")):
        with pytest.raises(P.ProtocolError, match=msg):
            req(bad)


def test_http_lora_field_maps_onto_protocol_v1() -> None:
    from edgellama.service.http import fields

    lora = [{"id": 0, "scale": 0.25}]
    assert fields.llama_completion({"prompt": "x", "lora": lora}, "r")["lora"] == lora
    assert fields.openai_completion({"prompt": "x", "lora": lora}, "r")["lora"] == lora
    assert "lora" not in fields.llama_completion({"prompt": "x"}, "r")


@pytest.mark.parametrize("parallel", ["1", "2"])
def test_serve_per_request_scales(smollm2_path: Path, tmp_path: Path, parallel: str) -> None:
    """One request at a time, or --parallel 2 slots, with an adapter loaded at scale 1: a request with "lora": [] (every adapter off)
    and one without the field (start-up scales), run together and alone, give the texts they give
    alone; a slot that served one never reuses its cache for the other; a bad id is a bad_request."""
    lora_util = pytest.importorskip("lora_util", reason="tests/lora_util.py (the adapter writer) lands with the reader")
    from tests.service_util import FAST, ServerProc, text_of

    path = lora_util.write_adapter(tmp_path / "a.gguf", "llama", 8.0,
                                   lora_util.random_adapter(GGUFFile(smollm2_path), 8, seed=3, amplitude=4.0))
    srv = ServerProc("-m", str(smollm2_path), "--parallel", parallel, "--lora", str(path), engine=FAST)
    try:
        srv.wait_ready()
        prompt = {"prompt": "The capital of France is", "n_predict": 10, "temperature": 0}
        with srv.connect() as c:
            on = text_of(c.ask({"id": "on", **prompt}))
            off = text_of(c.ask({"id": "off", **prompt, "lora": []}))
            on2 = text_of(c.ask({"id": "on2", **prompt, "lora": [{"id": 0, "scale": 1.0}]}))
            c.send({"id": "a", **prompt})
            c.send({"id": "b", **prompt, "lora": [{"id": 0, "scale": 0}]})
            both = c.until_final({"a", "b"})
            bad = c.ask({"id": "bad", **prompt, "lora": [{"id": 1, "scale": 1}]})
        assert on != off and on2 == on
        assert text_of(both["a"]) == on and text_of(both["b"]) == off
        assert bad[-1]["event"] == "error" and bad[-1]["code"] == "bad_request" and "no adapter 1" in bad[-1]["message"]
    finally:
        srv.kill()

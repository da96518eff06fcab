"""The forward pass's per-architecture features (issue 33) against the float64 numpy reference, each alone
and all together, on SmolLM2's weights cut to 4 layers: Llama 3's frequency factors, linear and YaRN
scaling with an attention factor (LongRoPE's magnitude), SmolLM3's unrotated layers, Gemma 2's soft-capping
of attention scores and logits. Positions run past YaRN's original context. The wiring's reading of these
from GGUF metadata is checked against llama.cpp itself (test_arch_peer.py); this is the C engine's math."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import numpy_reference as ref
import pytest

from edgellama.gguf.reader import GGUFFile
from edgellama.native.desc import ModelDesc, RopeExt, TensorRef
from edgellama.native.engine import Engine, Pool
from edgellama.native.lib import KernelError, lib
from edgellama.wiring import build_desc

N_LAYER = 4
IDS = [1, 504, 3458, 282, 4649, 314, 2114, 30, 1070, 3458, 282, 504, 30, 4649, 314, 2114] * 3  # 48 positions


@pytest.fixture(scope="module")
def base(smollm2_path: Path) -> ModelDesc:
    f = GGUFFile(smollm2_path)
    desc = ref.as_f32(build_desc(f)[1])
    return dataclasses.replace(desc, n_layer=N_LAYER, layers=desc.layers[:N_LAYER])


def _factors(n: int, seed: int) -> TensorRef:
    rng = np.random.default_rng(seed)
    f = rng.uniform(1.0, 8.0, n).astype(np.float32)
    return TensorRef(f.view(np.uint8), 0, n, 1)


def _variant(base: ModelDesc, name: str) -> ModelDesc:
    half = base.n_rot // 2
    layers = [dataclasses.replace(L) for L in base.layers]
    d = dataclasses.replace(base, layers=layers, rope=RopeExt())
    if name in ("freqs", "all"):
        t = _factors(half, 1)
        for L in layers:
            L.rope_freqs = t
    if name in ("linear", "all"):
        for L in layers:
            L.rope_scale = 0.25
        d.rope.attn_factor = 1.2
    if name in ("yarn", "all"):
        for L in layers:
            L.rope_scale = 0.25
        d.rope = RopeExt(ext_factor=1.0, attn_factor=0.9, beta_fast=32.0, beta_slow=1.0, n_ctx_orig=16)
    if name in ("no_rope", "all"):
        layers[3].no_rope = True
    if name in ("softcap", "all"):
        d.attn_softcap, d.final_softcap = 2.0, 15.0  # small caps: most scores and logits are bent
    return d


@pytest.mark.parametrize("name", ["freqs", "linear", "yarn", "no_rope", "softcap", "all"])
def test_feature_matches_float64_reference(base: ModelDesc, name: str) -> None:
    d = _variant(base, name)
    eng = Engine(d, Pool(2), 64, 64, "f32")
    ours = eng.eval(IDS, 0, all_logits=True).copy()
    want = ref.forward(d, IDS)
    plain = ref.forward(base, IDS)
    err = float(np.abs(ours - want).max())
    # the feature changes the logits (so the check can fail), and the engine follows the reference
    assert float(np.abs(want - plain).max()) > 0.05, name
    assert err < 2e-3, (name, err)  # float32 accumulation over 4 layers; measured below 2e-4
    assert (ours.argmax(axis=1) == want.argmax(axis=1)).all()


@pytest.mark.parametrize("no_rope", [False, True])
def test_context_shift_rerotates_keys_with_factors_and_yarn(base: ModelDesc, no_rope: bool) -> None:
    """A shift re-rotates cached keys by a position delta (a pure rotation: the attention factor stays
    applied once). With one layer a token's key and value depend on that token alone, so after the shift
    the cache must equal a fresh evaluation of the kept tokens at their new positions: with frequency
    factors, YaRN and an attention factor, and for an unrotated layer (whose keys a shift must not touch)."""
    d = _variant(base, "all")
    d.attn_softcap = d.final_softcap = 0.0
    d = dataclasses.replace(d, n_layer=1, layers=[dataclasses.replace(d.layers[0], no_rope=no_rope)])
    eng = Engine(d, Pool(2), 64, 64, "f32")
    keep, drop = 4, 8
    eng.eval(IDS[:32], 0, all_logits=False)
    eng.shift(keep, drop)
    after = eng.eval(IDS[32:36], 32 - drop, all_logits=True).copy()
    fresh = Engine(d, Pool(2), 64, 64, "f32")
    want = fresh.eval(IDS[:keep] + IDS[keep + drop:36], 0, all_logits=True)[-4:]
    assert float(np.abs(after - want).max()) < 2e-3


def test_bad_rope_and_softcap_settings_are_refused_by_c(base: ModelDesc) -> None:
    """The C library checks what a description built by other code could hold: NaN, negative caps, YaRN
    without an original context, factors of the wrong length or type."""
    bad = [dataclasses.replace(base, attn_softcap=-1.0), dataclasses.replace(base, final_softcap=float("inf")),
           dataclasses.replace(base, rope=RopeExt(ext_factor=1.0, n_ctx_orig=0)),
           dataclasses.replace(base, rope=RopeExt(attn_factor=-1.0))]
    short = dataclasses.replace(base, layers=[dataclasses.replace(L, rope_freqs=_factors(base.n_rot // 2 - 1, 0))
                                              for L in base.layers])
    bad.append(short)
    for d in bad:
        with pytest.raises((KernelError, ValueError)):
            Engine(d, Pool(1), 16, 16, "f32")
    # a flag is 0 or 1 (Python's bool cannot say otherwise: the C description is written directly)
    from edgellama.native.engine import KV_TYPES, _c_desc
    from edgellama.native.lib import ffi

    pool = Pool(1)
    for scale_q, want in ((2, lib.EL_EINVAL), (1, lib.EL_OK)):
        c, _keep = _c_desc(base)
        c.scale_q = scale_q
        out = ffi.new("el_model **")
        assert lib.el_model_create_seqs(c, pool.ptr, 16, 16, KV_TYPES["f32"], 1, out) == want
        if out[0] != ffi.NULL:
            lib.el_model_free(out[0])


def test_llamacpp_numerics_soft_caps_and_prescales_q(smollm2_path: Path) -> None:
    """llama.cpp numerics take Gemma 2's soft-caps and the Q pre-scaling of phi3/gemma graphs (their bits on
    those files are checked against llama.cpp in test_arch_peer.py). Here, on SmolLM2's Q4_1/Q8_0 weights
    cut to one layer: each agrees with the native kernels within quantization noise and moves the logits."""
    desc = build_desc(GGUFFile(smollm2_path))[1]
    d = dataclasses.replace(desc, n_layer=1, layers=desc.layers[:1], attn_scale=0.1)  # not a power of two
    variants = {"plain": d, "softcap": dataclasses.replace(d, attn_softcap=2.0, final_softcap=8.0),
                "scale_q": dataclasses.replace(d, scale_q=True),
                "scale_q_pow2": dataclasses.replace(d, scale_q=True, attn_scale=0.125),
                "pow2": dataclasses.replace(d, attn_scale=0.125)}
    got = {}
    for name, v in variants.items():
        exact = Engine(v, Pool(1), 64, 64, "f16", "llamacpp").eval(IDS, 0, all_logits=True).copy()
        native = Engine(v, Pool(1), 64, 64, "f16").eval(IDS, 0, all_logits=True)
        # Q8_1 vs Q8_K activations: measured 0.56 on logits up to 94 (0.32 capped), same argmax at 98%
        assert float(np.abs(exact - native).max()) < 1.0, name
        assert (exact.argmax(axis=1) == native.argmax(axis=1)).mean() > 0.9, name
        got[name] = exact
    assert float(np.abs(got["softcap"]).max()) <= 8.0  # the final cap bounds every logit
    assert float(np.abs(got["softcap"] - got["plain"]).max()) > 1.0
    # scaling Q instead of the scores is the same math, only the rounding moves (Q meets the f16 cache
    # after scaling; measured 0.31): not at all for a power of two
    assert 0 < float(np.abs(got["scale_q"] - got["plain"]).max()) < 1.0
    assert (got["scale_q_pow2"] == got["pow2"]).all()

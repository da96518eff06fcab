"""A float64 numpy forward pass (Gemma 3 and llama family) over dequantized weights: the independent
reference that the C engine's logits are compared with. Slow and simple on purpose, no KV cache."""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import numpy.typing as npt

from edgellama.native.desc import ModelDesc, TensorRef
from edgellama.native.kernels import dequantize

F64 = npt.NDArray[np.float64]


def deq(t: TensorRef | None) -> F64 | None:
    if t is None:
        return None
    w = dequantize(t.data, t.ggml_type, t.ne0 * t.ne1).astype(np.float64)
    return w.reshape(t.ne1, t.ne0) if t.ne1 > 1 else w


def as_f32(desc: ModelDesc) -> ModelDesc:
    """The same model with every weight dequantized to F32: the engine then does float dots with
    unquantized activations, which makes a tight comparison with this float64 forward possible."""

    def f32(t: TensorRef | None) -> TensorRef | None:
        if t is None or t.ggml_type == 0:
            return t
        w = dequantize(t.data, t.ggml_type, t.ne0 * t.ne1)
        return TensorRef(w.view(np.uint8), 0, t.ne0, t.ne1)

    d = copy.copy(desc)
    d.tok_embd = f32(desc.tok_embd)  # type: ignore[assignment]
    d.output = f32(desc.output)
    layers = []
    for L in desc.layers:
        L2 = copy.copy(L)
        for fld in dataclasses.fields(L):
            v = getattr(L, fld.name)
            if isinstance(v, TensorRef):
                setattr(L2, fld.name, f32(v))
        layers.append(L2)
    d.layers = layers
    return d


def rmsnorm(x: F64, w: F64 | None, eps: float) -> F64:
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y * w if w is not None else y


def rope(x: F64, pos: npt.NDArray[np.int64], n_rot: int, base: float, scale: float, neox: bool,
         factors: F64 | None = None, ext_factor: float = 0.0, attn_factor: float = 1.0,
         corr: tuple[float, float] = (0.0, 0.0)) -> F64:
    """x: (T, H, D) rotated at positions pos: frequencies base^(-2i/n_rot) divided by factors, scaled
    (linear), or YaRN's per-dim mix of scaled and unscaled with its magnitude correction; cos and sin
    multiplied by attn_factor."""
    half = n_rot // 2
    inv = base ** (-2.0 * np.arange(half) / n_rot)
    if factors is not None:
        inv = inv / factors
    extrap = pos[:, None] * inv[None, :]  # (T, half)
    ang = extrap * scale
    mscale = attn_factor
    if ext_factor:
        y = (np.arange(half) - corr[0]) / max(0.001, corr[1] - corr[0])
        ramp = (1.0 - np.clip(y, 0.0, 1.0)) * ext_factor
        ang = ang * (1.0 - ramp) + extrap * ramp
        mscale *= 1.0 + 0.1 * math.log(1.0 / scale)
    c, s = mscale * np.cos(ang)[:, None, :], mscale * np.sin(ang)[:, None, :]
    y = x.copy()
    if neox:
        a, b = x[..., :half], x[..., half:n_rot]
        y[..., :half] = a * c - b * s
        y[..., half:n_rot] = a * s + b * c
    else:
        a, b = x[..., 0:n_rot:2], x[..., 1:n_rot:2]
        y[..., 0:n_rot:2] = a * c - b * s
        y[..., 1:n_rot:2] = a * s + b * c
    return y


def yarn_corr(n_rot: int, n_ctx_orig: int, base: float, beta_fast: float, beta_slow: float) -> tuple[float, float]:
    """YaRN's correction dims: the rotary dims whose wavelength spans n_ctx_orig / beta turns."""
    def dim(beta: float) -> float:
        return n_rot * math.log(n_ctx_orig / (beta * 2 * math.pi)) / (2 * math.log(base))
    return max(0.0, math.floor(dim(beta_fast))), min(n_rot - 1.0, math.ceil(dim(beta_slow)))


def softcap(x: F64, cap: float) -> F64:
    return cap * np.tanh(x / cap) if cap else x


def gelu(x: F64) -> F64:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * x * (1.0 + 0.044715 * x * x)))


def forward(desc: ModelDesc, tokens: list[int], emb: F64 | None = None) -> F64:
    """Logits (T x n_vocab) of every position of tokens evaluated from position 0."""
    T = len(tokens)
    H, KH, D = desc.n_head, desc.n_head_kv, desc.head_dim
    if emb is None:
        emb = deq(desc.tok_embd)
    assert emb is not None
    x = emb[tokens] * desc.emb_scale
    pos = np.arange(T)
    for L in desc.layers:
        h = rmsnorm(x, deq(L.attn_norm), desc.norm_eps)
        q = h @ deq(L.wq).T
        k = h @ deq(L.wk).T
        v = h @ deq(L.wv).T
        for y, b in ((q, L.bq), (k, L.bk), (v, L.bv)):
            if b is not None:
                y += deq(b)
        q = q.reshape(T, H, D)
        k = k.reshape(T, KH, D)
        v = v.reshape(T, KH, D)
        if L.q_norm is not None:
            q = rmsnorm(q, deq(L.q_norm), desc.norm_eps)
        if L.k_norm is not None:
            k = rmsnorm(k, deq(L.k_norm), desc.norm_eps)
        if not L.no_rope:
            r = desc.rope
            corr = yarn_corr(desc.n_rot, r.n_ctx_orig, L.rope_base, r.beta_fast, r.beta_slow) if r.ext_factor \
                else (0.0, 0.0)
            args = (pos, desc.n_rot, L.rope_base, L.rope_scale, desc.rope_neox, deq(L.rope_freqs), r.ext_factor,
                    r.attn_factor, corr)
            q = rope(q, *args)
            k = rope(k, *args)
        g = H // KH
        att = np.empty((T, H, D))
        for hh in range(H):
            s = softcap((q[:, hh, :] @ k[:, hh // g, :].T) * desc.attn_scale, desc.attn_softcap)  # (T, T)
            mask = pos[None, :] > pos[:, None]
            if L.window:
                mask |= (pos[:, None] - pos[None, :]) >= L.window
            s[mask] = -np.inf
            s = np.exp(s - s.max(axis=1, keepdims=True))
            s /= s.sum(axis=1, keepdims=True)
            att[:, hh, :] = s @ v[:, hh // g, :]
        o = att.reshape(T, H * D) @ deq(L.wo).T
        if L.attn_post_norm is not None:
            o = rmsnorm(o, deq(L.attn_post_norm), desc.norm_eps)
        x = x + o
        h = rmsnorm(x, deq(L.ffn_norm), desc.norm_eps)
        gt = h @ deq(L.w_gate).T
        up = h @ deq(L.w_up).T
        a = gelu(gt) if desc.act == "gelu" else gt / (1.0 + np.exp(-gt))
        d = (a * up) @ deq(L.w_down).T
        if L.ffn_post_norm is not None:
            d = rmsnorm(d, deq(L.ffn_post_norm), desc.norm_eps)
        x = x + d
    x = rmsnorm(x, deq(desc.output_norm), desc.norm_eps)
    out = deq(desc.output) if desc.output is not None else emb
    assert out is not None
    return softcap(x @ out.T, desc.final_softcap)

/* ops.c - the float32 element-wise and row ops of a decoder: RMSNorm, softmax, RoPE, SiLU, GELU.
 * Accumulations that ggml does in double are done in double here too, to stay close to llama.cpp. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "edgellama.h"
#include "fp16.h"
#include "ops.h"

/* out = x / rms(x) (* weight), from sum, x's squares summed in double */
static void rms_apply(float *out, const float *x, const float *weight, size_t n, double sum, float eps) {
    const float scale = 1.0f / sqrtf((float)(sum / (double)n) + eps);
    if (weight)
        for (size_t i = 0; i < n; i++) out[i] = (x[i] * scale) * weight[i];
    else
        for (size_t i = 0; i < n; i++) out[i] = x[i] * scale;
}

void el_rmsnorm(float *out, const float *x, const float *weight, size_t n, float eps) {
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) sum += (double)(x[i] * x[i]);
    rms_apply(out, x, weight, n, sum, eps);
}

/* el_rmsnorm of rows rows of n values (out may be x): four rows at a time, each row's double sum a
 * chain of its own in el_rmsnorm's order (the same bits), the four chains side by side instead of
 * one after another (a chain of dependent double adds is latency-bound) */
void el_rmsnorm_rows(float *out, const float *x, const float *weight, size_t rows, size_t n, float eps) {
    size_t r = 0;
    for (; r + 4 <= rows; r += 4) {
        const float *x0 = x + r * n, *x1 = x0 + n, *x2 = x1 + n, *x3 = x2 + n;
        double s[4] = {0.0, 0.0, 0.0, 0.0};
        for (size_t i = 0; i < n; i++) {
            s[0] += (double)(x0[i] * x0[i]);
            s[1] += (double)(x1[i] * x1[i]);
            s[2] += (double)(x2[i] * x2[i]);
            s[3] += (double)(x3[i] * x3[i]);
        }
        for (size_t k = 0; k < 4; k++) rms_apply(out + (r + k) * n, x + (r + k) * n, weight, n, s[k], eps);
    }
    for (; r < rows; r++) el_rmsnorm(out + r * n, x + r * n, weight, n, eps);
}

/* LayerNorm of rows rows of n values (out may be x) as ggml_norm then the graph's weight and bias:
 * the mean and the variance of the centred values summed in double, y = (x - mean) / sqrtf(var + eps),
 * then y * w + b (two roundings, as the graph's separate mul and add) */
void el_layernorm_rows(float *out, const float *x, const float *w, const float *b, size_t rows, size_t n,
                       float eps) {
    for (size_t r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float *yr = out + r * n;
        double sum = 0.0;
        for (size_t i = 0; i < n; i++) sum += (double)xr[i];
        const float mean = (float)(sum / (double)n);
        double sum2 = 0.0;
        for (size_t i = 0; i < n; i++) {
            const float v = xr[i] - mean;
            yr[i] = v;
            sum2 += (double)(v * v);
        }
        const float scale = 1.0f / sqrtf((float)(sum2 / (double)n) + eps);
        for (size_t i = 0; i < n; i++) yr[i] = yr[i] * scale * w[i] + b[i];
    }
}

void el_softmax(float *x, size_t n) {
    if (n == 0) return;
    float mx = -INFINITY;
    for (size_t i = 0; i < n; i++) mx = x[i] > mx ? x[i] : mx;
    double sum = 0.0;
    for (size_t i = 0; i < n; i++) {
        const float e = expf(x[i] - mx);
        x[i] = e;
        sum += (double)e;
    }
    const float inv = (float)(1.0 / sum);
    for (size_t i = 0; i < n; i++) x[i] *= inv;
}

/* YaRN's correction dim: the rotary dim whose wavelength spans n_ctx_orig / n_rot turns */
static float yarn_corr_dim(size_t n_dims, int32_t n_ctx_orig, float n_rot, float base) {
    return (float)n_dims * logf((float)n_ctx_orig / (n_rot * 2.0f * 3.14159265358979323846f)) / (2.0f * logf(base));
}

el_rope_args el_rope_init(const el_model_desc *d, const el_layer *L, int magnitude) {
    el_rope_args r = {L->rope_base, L->rope_scale, L->rope_freqs.data ? (const float *)L->rope_freqs.data : NULL,
                      d->rope.ext_factor, magnitude && d->rope.attn_factor != 0.0f ? d->rope.attn_factor : 1.0f,
                      {0.0f, 0.0f}};
    if (r.ext_factor != 0.0f) {
        const size_t n = (size_t)d->n_rot;
        const float lo = floorf(yarn_corr_dim(n, d->rope.n_ctx_orig, d->rope.beta_fast, r.base));
        const float hi = ceilf(yarn_corr_dim(n, d->rope.n_ctx_orig, d->rope.beta_slow, r.base));
        r.corr[0] = lo > 0.0f ? lo : 0.0f;
        r.corr[1] = hi < (float)(n - 1) ? hi : (float)(n - 1);
        /* YaRN's magnitude correction (a shift rotates by a delta: no magnitude at all) */
        if (magnitude) r.mscale *= 1.0f + 0.1f * logf(1.0f / r.scale);
    }
    return r;
}

void el_rope_cache(float *cs, size_t n_rot, int32_t pos, const el_rope_args *r) {
    /* theta_i = pos * base^(-2i/n_rot), built by repeated multiplication exactly as ggml does; a
     * frequency divisor, then the scale (linear), or YaRN's mix of scaled and unscaled per dim */
    const float theta_scale = powf(r->base, -2.0f / (float)n_rot);
    float theta = (float)pos;
    for (size_t i = 0; i < n_rot / 2; i++) {
        const float extrap = r->factors ? theta / r->factors[i] : theta;
        float t = r->scale * extrap;
        if (r->ext_factor != 0.0f) {
            const float y = ((float)i - r->corr[0]) / fmaxf(0.001f, r->corr[1] - r->corr[0]);
            const float ramp = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * r->ext_factor;
            t = t * (1.0f - ramp) + extrap * ramp;
        }
        cs[2 * i] = cosf(t) * r->mscale; /* * 1.0f changes no bit */
        cs[2 * i + 1] = sinf(t) * r->mscale;
        theta *= theta_scale;
    }
}

/* fused: as llama.cpp computes it, whose compiler fuses the first product of each pair into an FMA
 * (GCC's contraction of ggml's rotate_pairs under -march=native); else two rounded products */
void el_rope_apply(float *x, size_t n_head, size_t head_dim, size_t n_rot, const float *cs, int neox, int fused) {
    for (size_t h = 0; h < n_head; h++) {
        float *v = x + h * head_dim;
        for (size_t i = 0; i < n_rot / 2; i++) {
            const float c = cs[2 * i], s = cs[2 * i + 1];
            const size_t a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
            const float x0 = v[a], x1 = v[b];
            v[a] = fused ? fmaf(x0, c, -(x1 * s)) : x0 * c - x1 * s;
            v[b] = fused ? fmaf(x0, s, x1 * c) : x0 * s + x1 * c;
        }
    }
}

void el_rope(float *x, size_t n_head, size_t head_dim, size_t n_rot, int32_t pos, float freq_base,
             float freq_scale, int neox) {
    if (n_rot > head_dim || n_rot % 2 || n_rot > EL_MAX_HEAD_DIM) return;
    float cs[EL_MAX_HEAD_DIM];
    const el_rope_args r = {freq_base, freq_scale, NULL, 0.0f, 1.0f, {0.0f, 0.0f}};
    el_rope_cache(cs, n_rot, pos, &r);
    el_rope_apply(x, n_head, head_dim, n_rot, cs, neox, 0);
}

/* SiLU x / (1 + e^t), t = -x, with its own e^t, in operations the compiler vectorizes (libm's expf
 * is one call per value: 3-5% of a prompt's time). t = n ln2 + b, n = round(t / ln2) by the
 * 1.5 * 2^23 trick (the integer then sits in the low bits of z), b = t - n ln2 in two FMAs (ln2 as the
 * float nearest it plus the rest), e^b by its degree-7 Taylor polynomial (|b| <= ln2 / 2: truncation
 * under 2^-24 relative), 2^n from the bits of z. t is clamped to [-87, 89]: below, 2^n stays a
 * normal float and 1 + e^t is 1 anyway; above t = 88.37, n = 128 puts all ones in the exponent
 * field, 2^n = infinity, so the result is -0 where the true one is below 1e-36 in size. A NaN x
 * stays NaN (the quotient). Explicit FMAs, no contraction: scalar and vector code, on every ISA, give
 * the same bits. */
static inline float silu1(float x) {
    const float shift = 0x1.8p23f, log2e = 0x1.715476p+0f, ln2_hi = 0x1.62e43p-1f, ln2_lo = -0x1.05c61p-29f;
    float t = -x;
    t = t < -87.0f ? -87.0f : t;
    t = t > 89.0f ? 89.0f : t;
    const float z = fmaf(t, log2e, shift), n = z - shift;
    const float b = fmaf(-n, ln2_lo, fmaf(-n, ln2_hi, t));
    float p = fmaf(b, 1.0f / 5040.0f, 1.0f / 720.0f);
    p = fmaf(p, b, 1.0f / 120.0f);
    p = fmaf(p, b, 1.0f / 24.0f);
    p = fmaf(p, b, 1.0f / 6.0f);
    p = fmaf(p, b, 0.5f);
    p = fmaf(p, b, 1.0f);
    p = fmaf(p, b, 1.0f);
    uint32_t zb, sb;
    memcpy(&zb, &z, 4);
    memcpy(&sb, &shift, 4);
    const uint32_t eb = (zb - sb + 127u) << 23; /* n + 127 in the exponent field */
    float e2n;
    memcpy(&e2n, &eb, 4);
    return x / (1.0f + p * e2n);
}

EL_HOT static void silu_run(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] = silu1(x[i]);
}

void el_silu(float *x, size_t n) { silu_run(x, n); }

/* 1 + a x^2 as one FMA: ggml's ggml_gelu_f32 is compiled with FMA contraction, and its fp16 table
 * (which llama.cpp's GELU reads) differs from the unfused form in a few entries */
static inline float gelu_f32(float x) {
    const float sqrt_2_over_pi = 0.79788456080286535587989211986876f;
    return 0.5f * x * (1.0f + tanhf(sqrt_2_over_pi * x * fmaf(0.044715f * x, x, 1.0f)));
}

/* ggml evaluates GELU through an fp16 table (input and output rounded to half, |x| >= 10 exact);
 * computing the table entry directly gives the same numbers without a 128 KiB global table. */
void el_gelu(float *x, size_t n) {
    for (size_t i = 0; i < n; i++) {
        const float v = x[i];
        if (v <= -10.0f) x[i] = 0.0f;
        else if (v < 10.0f) x[i] = el_fp16_to_fp32(el_fp32_to_fp16(gelu_f32(el_fp16_to_fp32(el_fp32_to_fp16(v)))));
    }
}

void el_gelu_table_fill(el_half *table) {
    for (uint32_t i = 0; i < 65536; i++)
        table[i] = el_fp32_to_fp16(gelu_f32(el_fp16_to_fp32((el_half)i)));
}

/* el_gelu through the model's table: the same numbers, one lookup per element */
void el_gelu_lut(float *x, size_t n, const el_half *table) {
    for (size_t i = 0; i < n; i++) {
        const float v = x[i];
        if (v <= -10.0f) x[i] = 0.0f;
        else if (v < 10.0f) x[i] = el_fp16_to_fp32(table[el_fp32_to_fp16(v)]);
    }
}

void el_add(float *y, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = a[i] + b[i];
}

void el_mul(float *y, const float *a, const float *b, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = a[i] * b[i];
}

void el_scale(float *x, float s, size_t n) {
    for (size_t i = 0; i < n; i++) x[i] *= s;
}

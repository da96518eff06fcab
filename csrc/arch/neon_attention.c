/* arch/neon_attention.c - attention over an F16 cache for a group of query heads (aarch64 NEON, the
 * same on A72 and A76). Each key and value row is converted from f16 once for all the heads that
 * share it. Results depend on the inputs only (fixed lane order), not on how the work is split. */
#include "../dispatch.h"
#include "head_block.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#include <math.h>

#define EL_INLINE static inline __attribute__((always_inline))

EL_INLINE float32x4_t ld4h(const el_half *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }

/* the head and column loops must be unrolled for their accumulators to stay in registers */
#define EL_UNROLL _Pragma("GCC unroll 4")

/* GB (1..4) heads' dots with one key row: two accumulators per head keep eight FMA chains going */
EL_INLINE void qk_row(size_t hd, const float *q, const el_half *kr, const int GB, float *s) {
    float32x4_t a0[4], a1[4];
    EL_UNROLL
    for (int b = 0; b < GB; b++) a0[b] = a1[b] = vdupq_n_f32(0.0f);
    size_t i = 0;
    for (; i + 8 <= hd; i += 8) {
        const float32x4_t k0 = ld4h(kr + i), k1 = ld4h(kr + i + 4);
        EL_UNROLL
        for (int b = 0; b < GB; b++) {
            a0[b] = vfmaq_f32(a0[b], vld1q_f32(q + b * hd + i), k0);
            a1[b] = vfmaq_f32(a1[b], vld1q_f32(q + b * hd + i + 4), k1);
        }
    }
    if (i + 4 <= hd) {
        const float32x4_t k0 = ld4h(kr + i);
        EL_UNROLL
        for (int b = 0; b < GB; b++) a0[b] = vfmaq_f32(a0[b], vld1q_f32(q + b * hd + i), k0);
        i += 4;
    }
    EL_UNROLL
    for (int b = 0; b < GB; b++) {
        float r = vaddvq_f32(vaddq_f32(a0[b], a1[b]));
        for (size_t t = i; t < hd; t++) r += q[b * hd + t] * el_fp16_to_fp32(kr[t]);
        s[b] = r;
    }
}

/* The cache is far bigger than the caches once the weights have streamed through them: rows a few
 * keys ahead are asked for early (a row is 8 lines at head_dim 256) */
#define QK_AHEAD 4
EL_INLINE void prefetch_row(const char *p, size_t bytes) {
    for (size_t i = 0; i < bytes; i += 64) __builtin_prefetch(p + i, 0, 3);
}

static void attn_qk_f16_neon(size_t hd, size_t g, const float *q, const void *k, size_t stride,
                             const int32_t *idx, size_t n, float *s) {
    for (size_t j = 0; j < n; j++) {
        const el_half *kr = (const el_half *)((const char *)k + (size_t)idx[j] * stride);
        if (j + QK_AHEAD < n) prefetch_row((const char *)k + (size_t)idx[j + QK_AHEAD] * stride, hd * 2);
        for (size_t h = 0; h < g; h += 4) {
            const float *qh = q + h * hd;
            float *sh = s + j * g + h;
#define QK_HEADS(GB) qk_row(hd, qh, kr, GB, sh)
            HEAD_BLOCK(g - h, QK_HEADS)
#undef QK_HEADS
        }
    }
}

/* o_b[d0 .. d0 + 4 W) += sum_j p[j g + b] v_j for GB heads, accumulators in registers over all n
 * rows (W = 4: 16 of them at GB = 4, of the 32 NEON registers) */
EL_INLINE void pv_cols(size_t hd, size_t g, const float *p, const char *v, size_t stride, const int32_t *idx,
                       size_t n, float *o, size_t d0, const int GB, const int W) {
    float32x4_t acc[4][4];
    EL_UNROLL
    for (int b = 0; b < GB; b++)
        EL_UNROLL
        for (int w = 0; w < W; w++) acc[b][w] = vld1q_f32(o + b * hd + d0 + 4 * w);
    for (size_t j = 0; j < n; j++) {
        const el_half *vr = (const el_half *)(v + (size_t)idx[j] * stride) + d0;
        float32x4_t x[4];
        EL_UNROLL
        for (int w = 0; w < W; w++) x[w] = ld4h(vr + 4 * w);
        EL_UNROLL
        for (int b = 0; b < GB; b++) {
            const float pb = p[j * g + b];
            EL_UNROLL
            for (int w = 0; w < W; w++) acc[b][w] = vfmaq_n_f32(acc[b][w], x[w], pb);
        }
    }
    EL_UNROLL
    for (int b = 0; b < GB; b++)
        EL_UNROLL
        for (int w = 0; w < W; w++) vst1q_f32(o + b * hd + d0 + 4 * w, acc[b][w]);
}

EL_INLINE void pv_heads(size_t hd, size_t g, const float *p, const char *v, size_t stride, const int32_t *idx,
                        size_t n, float *o, const int GB) {
    size_t d = 0;
    for (; d + 16 <= hd; d += 16) pv_cols(hd, g, p, v, stride, idx, n, o, d, GB, 4);
    for (; d + 4 <= hd; d += 4) pv_cols(hd, g, p, v, stride, idx, n, o, d, GB, 1);
    for (; d < hd; d++)
        for (size_t j = 0; j < n; j++) {
            const float x = el_fp16_to_fp32(((const el_half *)(v + (size_t)idx[j] * stride))[d]);
            EL_UNROLL
            for (int b = 0; b < GB; b++) o[b * hd + d] = fmaf(p[j * g + b], x, o[b * hd + d]);
        }
}

/* Keys in blocks of PV_KEYS (head_block.h's driver): a block's value rows are 8 KB at head_dim 256. */
#define PV_KEYS 16
ATTN_PV_KEY_BLOCKS(attn_pv_f16_neon, PV_KEYS)

/* FPCR's default rounding (nearest even) applies to the narrowing conversion */
static void round_f16_neon(size_t n, const float *x, float *y) {
    size_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vcvt_f32_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; i++) y[i] = el_fp16_to_fp32(el_fp32_to_fp16(x[i]));
}

static void to_f16_neon(size_t n, const float *x, el_half *y) {
    size_t i = 0;
    for (; i + 4 <= n; i += 4) vst1_u16(y + i, vreinterpret_u16_f16(vcvt_f16_f32(vld1q_f32(x + i))));
    for (; i < n; i++) y[i] = el_fp32_to_fp16(x[i]);
}

void el_kernels_fill_neon_attention(el_kernels *k) {
    k->round_f16 = round_f16_neon;
    k->to_f16 = to_f16_neon;
    k->attn_qk_f16 = attn_qk_f16_neon;
    k->attn_pv_f16 = attn_pv_f16_neon;
}
#else
typedef int el_neon_attention_unused; /* ISO C wants a declaration in every translation unit */
#endif

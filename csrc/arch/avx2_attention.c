/* arch/avx2_attention.c - attention over an F16 cache for a group of query heads (x86-64, AVX2 + FMA
 * + F16C). Each key and value row is converted from f16 once for all the heads that share it,
 * which is what makes a long cache cheap: Gemma 3 has four query heads per KV head.
 * Results depend on the inputs only (fixed lane order), not on how the caller splits the work. */
#include "../dispatch.h"

#if defined(__x86_64__)
#include <math.h>

#include "avx2_common.h"

EL_AVX2 EL_FORCE_INLINE __m256 ld8h(const el_half *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* the head and column loops must be unrolled for their accumulators to stay in registers */
#define EL_UNROLL _Pragma("GCC unroll 4")

/* GB (1..4) heads' dots with one key row: two accumulators per head keep eight FMA chains going */
EL_AVX2 EL_FORCE_INLINE void qk_row(size_t hd, const float *q, const el_half *kr, const int GB, float *s) {
    __m256 a0[4], a1[4];
    EL_UNROLL
    for (int b = 0; b < GB; b++) a0[b] = a1[b] = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 16 <= hd; i += 16) {
        const __m256 k0 = ld8h(kr + i), k1 = ld8h(kr + i + 8);
        EL_UNROLL
        for (int b = 0; b < GB; b++) {
            a0[b] = _mm256_fmadd_ps(_mm256_loadu_ps(q + b * hd + i), k0, a0[b]);
            a1[b] = _mm256_fmadd_ps(_mm256_loadu_ps(q + b * hd + i + 8), k1, a1[b]);
        }
    }
    if (i + 8 <= hd) {
        const __m256 k0 = ld8h(kr + i);
        EL_UNROLL
        for (int b = 0; b < GB; b++) a0[b] = _mm256_fmadd_ps(_mm256_loadu_ps(q + b * hd + i), k0, a0[b]);
        i += 8;
    }
    EL_UNROLL
    for (int b = 0; b < GB; b++) {
        float r = el_hsum_ps(_mm256_add_ps(a0[b], a1[b]));
        for (size_t t = i; t < hd; t++) r += q[b * hd + t] * _cvtsh_ss(kr[t]);
        s[b] = r;
    }
}

/* The cache is far bigger than the caches once the weights have streamed through them, and a row
 * is only 8 lines: asking for the rows a few keys ahead keeps the loads from waiting on memory. */
#ifndef QK_AHEAD
#define QK_AHEAD 4
#endif
EL_AVX2 EL_FORCE_INLINE void prefetch_row(const char *p, size_t bytes) {
    for (size_t i = 0; i < bytes; i += 64) _mm_prefetch(p + i, _MM_HINT_T0);
}

EL_AVX2 static void attn_qk_f16_avx2(size_t hd, size_t g, const float *q, const void *k, size_t stride,
                                     const int32_t *idx, size_t n, float *s) {
    for (size_t j = 0; j < n; j++) {
        const el_half *kr = (const el_half *)((const char *)k + (size_t)idx[j] * stride);
        if (j + QK_AHEAD < n) prefetch_row((const char *)k + (size_t)idx[j + QK_AHEAD] * stride, hd * 2);
        for (size_t h = 0; h < g; h += 4) {
            const float *qh = q + h * hd;
            float *sh = s + j * g + h;
            switch (g - h) {
            case 1: qk_row(hd, qh, kr, 1, sh); break;
            case 2: qk_row(hd, qh, kr, 2, sh); break;
            case 3: qk_row(hd, qh, kr, 3, sh); break;
            default: qk_row(hd, qh, kr, 4, sh); break;
            }
        }
    }
}

/* o_b[d0 .. d0 + 8 W) += sum_j p[j g + b] v_j for GB heads: the accumulators stay in registers over
 * all n rows (W = 2: 8 of them at GB = 4), each value row slice converted once for the GB heads. */
EL_AVX2 EL_FORCE_INLINE void pv_cols(size_t hd, size_t g, const float *p, const char *v, size_t stride,
                                     const int32_t *idx, size_t n, float *o, size_t d0, const int GB, const int W) {
    __m256 acc[4][2];
    EL_UNROLL
    for (int b = 0; b < GB; b++)
        EL_UNROLL
        for (int w = 0; w < W; w++) acc[b][w] = _mm256_loadu_ps(o + b * hd + d0 + 8 * w);
    for (size_t j = 0; j < n; j++) {
        const el_half *vr = (const el_half *)(v + (size_t)idx[j] * stride) + d0;
        __m256 x[2];
        EL_UNROLL
        for (int w = 0; w < W; w++) x[w] = ld8h(vr + 8 * w);
        EL_UNROLL
        for (int b = 0; b < GB; b++) {
            const __m256 pb = _mm256_broadcast_ss(p + j * g + b);
            EL_UNROLL
            for (int w = 0; w < W; w++) acc[b][w] = _mm256_fmadd_ps(pb, x[w], acc[b][w]);
        }
    }
    EL_UNROLL
    for (int b = 0; b < GB; b++)
        EL_UNROLL
        for (int w = 0; w < W; w++) _mm256_storeu_ps(o + b * hd + d0 + 8 * w, acc[b][w]);
}

EL_AVX2 EL_FORCE_INLINE void pv_heads(size_t hd, size_t g, const float *p, const char *v, size_t stride,
                                      const int32_t *idx, size_t n, float *o, const int GB) {
    size_t d = 0;
    for (; d + 16 <= hd; d += 16) pv_cols(hd, g, p, v, stride, idx, n, o, d, GB, 2);
    if (d + 8 <= hd) pv_cols(hd, g, p, v, stride, idx, n, o, d, GB, 1), d += 8;
    for (; d < hd; d++)
        for (size_t j = 0; j < n; j++) {
            const float x = _cvtsh_ss(((const el_half *)(v + (size_t)idx[j] * stride))[d]);
            EL_UNROLL
            for (int b = 0; b < GB; b++) o[b * hd + d] = fmaf(p[j * g + b], x, o[b * hd + d]);
        }
}

/* Keys in blocks of PV_KEYS: a block's value rows (8 KB at head_dim 256) are read once from memory,
 * front to back, and stay in L1 while the column slices pass over them; o stays in L1 too. Every
 * output still sums its keys in ascending order. */
#define PV_KEYS 16

EL_AVX2 static void attn_pv_f16_avx2(size_t hd, size_t g, const float *p, const void *v, size_t stride,
                                     const int32_t *idx, size_t n, float *o) {
    for (size_t j0 = 0; j0 < n; j0 += PV_KEYS) {
        const size_t nb = n - j0 < PV_KEYS ? n - j0 : PV_KEYS;
        const float *pj = p + j0 * g;
        for (size_t h = 0; h < g; h += 4) {
            const float *ph = pj + h;
            float *oh = o + h * hd;
            switch (g - h) {
            case 1: pv_heads(hd, g, ph, v, stride, idx + j0, nb, oh, 1); break;
            case 2: pv_heads(hd, g, ph, v, stride, idx + j0, nb, oh, 2); break;
            case 3: pv_heads(hd, g, ph, v, stride, idx + j0, nb, oh, 3); break;
            default: pv_heads(hd, g, ph, v, stride, idx + j0, nb, oh, 4); break;
            }
        }
    }
}

EL_AVX2 static void round_f16_avx2(size_t n, const float *x, float *y) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT)));
    for (; i < n; i++) y[i] = _cvtsh_ss(_cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT));
}

void el_kernels_fill_avx2_attention(el_kernels *k) {
    k->round_f16 = round_f16_avx2;
    k->attn_qk_f16 = attn_qk_f16_avx2;
    k->attn_pv_f16 = attn_pv_f16_avx2;
}
#else
typedef int el_avx2_attention_unused; /* ISO C wants a declaration in every translation unit */
#endif

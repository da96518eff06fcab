/* arch/avx2_attention.c - attention over an F16 cache for a group of query heads (x86-64, AVX2 + FMA
 * + F16C). Each key and value row is converted from f16 once for all the heads that share it,
 * which is what makes a long cache cheap: Gemma 3 has four query heads per KV head.
 * Results depend on the inputs only (fixed lane order), not on how the caller splits the work. */
#include "../dispatch.h"

#if defined(__x86_64__)
#include <math.h>

#include "avx2_common.h"
#include "head_block.h"

EL_AVX2 EL_FORCE_INLINE __m256 ld8h(const el_half *p) { return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p)); }

/* GB (1..4) heads' dots with NK (1 or 2) key rows, one accumulator per (key, head): each q slice
 * is loaded once for both keys, and a key's score has the same operations whether or not it was
 * paired (eight FMA chains in flight at GB = 4, NK = 2) */
EL_AVX2 EL_FORCE_INLINE void qk_rows(size_t hd, const float *q, const el_half *const *kr, const int GB, const int NK,
                                     float *s, size_t g) {
    __m256 acc[2][4];
    EL_UNROLL
    for (int r = 0; r < NK; r++)
        EL_UNROLL
        for (int b = 0; b < GB; b++) acc[r][b] = _mm256_setzero_ps();
    size_t i = 0;
    for (; i + 8 <= hd; i += 8) {
        __m256 kv[2];
        EL_UNROLL
        for (int r = 0; r < NK; r++) kv[r] = ld8h(kr[r] + i);
        EL_UNROLL
        for (int b = 0; b < GB; b++) {
            const __m256 qv = _mm256_loadu_ps(q + b * hd + i);
            EL_UNROLL
            for (int r = 0; r < NK; r++) acc[r][b] = _mm256_fmadd_ps(qv, kv[r], acc[r][b]);
        }
    }
    EL_UNROLL
    for (int r = 0; r < NK; r++)
        EL_UNROLL
        for (int b = 0; b < GB; b++) {
            float t = el_hsum_ps(acc[r][b]);
            for (size_t e = i; e < hd; e++) t += q[b * hd + e] * _cvtsh_ss(kr[r][e]);
            s[r * g + b] = t;
        }
}

/* The cache is far bigger than the caches once the weights have streamed through them, and a row
 * is only 8 lines: asking for the rows a few keys ahead keeps the loads from waiting on memory. */
#define QK_AHEAD 4
EL_AVX2 EL_FORCE_INLINE void prefetch_row(const char *p, size_t bytes) {
    for (size_t i = 0; i < bytes; i += 64) _mm_prefetch(p + i, _MM_HINT_T0);
}

#define QK_KEYS2(GB) qk_rows(hd, qh, kr, GB, 2, sh, g)
#define QK_KEYS1(GB) qk_rows(hd, qh, kr, GB, 1, sh, g)

EL_AVX2 static void attn_qk_f16_avx2(size_t hd, size_t g, const float *q, const void *k, size_t stride,
                                     const int32_t *idx, size_t n, float *s) {
    size_t j = 0;
    for (; j < n; j += 2) {
        const el_half *kr[2] = {(const el_half *)((const char *)k + (size_t)idx[j] * stride),
                                (const el_half *)((const char *)k + (size_t)idx[j + (j + 1 < n)] * stride)};
        for (size_t a = j + QK_AHEAD; a < j + QK_AHEAD + 2 && a < n; a++)
            prefetch_row((const char *)k + (size_t)idx[a] * stride, hd * 2);
        for (size_t h = 0; h < g; h += 4) {
            const float *qh = q + h * hd;
            float *sh = s + j * g + h;
            if (j + 1 < n) {
                HEAD_BLOCK(g - h, QK_KEYS2)
            } else {
                HEAD_BLOCK(g - h, QK_KEYS1)
            }
        }
    }
}

/* o_b[d0 .. d0 + 8 W) += sum_j p[j g + b] v_j for GB heads: the accumulators stay in registers over
 * all n rows (W = 3: 12 of them at GB = 4, with the 3 row slices and a broadcast the 16 ymm), each
 * value row slice converted once for the GB heads. */
EL_AVX2 EL_FORCE_INLINE void pv_cols(size_t hd, size_t g, const float *p, const char *v, size_t stride,
                                     const int32_t *idx, size_t n, float *o, size_t d0, const int GB, const int W) {
    __m256 acc[4][3];
    EL_UNROLL
    for (int b = 0; b < GB; b++)
        EL_UNROLL
        for (int w = 0; w < W; w++) acc[b][w] = _mm256_loadu_ps(o + b * hd + d0 + 8 * w);
    for (size_t j = 0; j < n; j++) {
        const el_half *vr = (const el_half *)(v + (size_t)idx[j] * stride) + d0;
        __m256 x[3];
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
    for (; d + 24 <= hd; d += 24) pv_cols(hd, g, p, v, stride, idx, n, o, d, GB, 3);
    if (d + 16 <= hd) pv_cols(hd, g, p, v, stride, idx, n, o, d, GB, 2), d += 16;
    if (d + 8 <= hd) pv_cols(hd, g, p, v, stride, idx, n, o, d, GB, 1), d += 8;
    for (; d < hd; d++)
        for (size_t j = 0; j < n; j++) {
            const float x = _cvtsh_ss(((const el_half *)(v + (size_t)idx[j] * stride))[d]);
            EL_UNROLL
            for (int b = 0; b < GB; b++) o[b * hd + d] = fmaf(p[j * g + b], x, o[b * hd + d]);
        }
}

/* Keys in blocks of PV_KEYS (head_block.h's driver): a block's value rows are 2 KB at head_dim 256.
 * 4 measured best from memory (1 thread, 2048 keys not in L3: 4 keys ~290 us, 8 ~320, 16 ~410,
 * 32 ~490). */
#define PV_KEYS 4
EL_AVX2 ATTN_PV_KEY_BLOCKS(attn_pv_f16_avx2, PV_KEYS)

EL_AVX2 static void round_f16_avx2(size_t n, const float *x, float *y) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_cvtph_ps(_mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT)));
    for (; i < n; i++) y[i] = _cvtsh_ss(_cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT));
}

EL_AVX2 static void to_f16_avx2(size_t n, const float *x, el_half *y) {
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm_storeu_si128((__m128i *)(y + i), _mm256_cvtps_ph(_mm256_loadu_ps(x + i), _MM_FROUND_TO_NEAREST_INT));
    for (; i < n; i++) y[i] = (el_half)_cvtss_sh(x[i], _MM_FROUND_TO_NEAREST_INT);
}

void el_kernels_fill_avx2_attention(el_kernels *k) {
    k->round_f16 = round_f16_avx2;
    k->to_f16 = to_f16_avx2;
    k->attn_qk_f16 = attn_qk_f16_avx2;
    k->attn_pv_f16 = attn_pv_f16_avx2;
}
#else
typedef int el_avx2_attention_unused; /* ISO C wants a declaration in every translation unit */
#endif

/* arch/avx2_common.h - small helpers shared by avx2.c and avx2_kquants.c (x86-64 only).
 * Every function carries the target attribute: the library itself is built without -mavx2. */
#ifndef EL_AVX2_COMMON_H
#define EL_AVX2_COMMON_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "../dispatch.h"
#include "tile_entries.h"

#define EL_AVX2 __attribute__((target("avx2,fma,f16c")))

/* vec_dot_panel (dispatch.h) NAME from a two-row panel tile PTILE(n, w, ws, group, NV, out), out[r * NV + j]
 * = row r . activation j of the group: count tiles of rows k and k + q, their outputs into y */
#define EL_PANEL_FROM_TILE(ATTR, NAME, PTILE)                                                      \
    ATTR EL_FORCE_INLINE void NAME##_nv(size_t n, const uint8_t *w, size_t w_row, size_t q, size_t count, \
                                        const uint8_t *g, const int NV, float *y, size_t ldy) {    \
        for (size_t k = 0; k < count; k++) {                                                       \
            float out[EL_TILE_ROWS * EL_PANEL_ROWS_MAX];                                           \
            PTILE(n, w + k * w_row, q * w_row, g, NV, out);                                        \
            EL_UNROLL for (int j = 0; j < NV; j++) {                                               \
                y[j * ldy + k] = out[j];                                                           \
                y[j * ldy + k + q] = out[NV + j];                                                  \
            }                                                                                      \
        }                                                                                          \
    }                                                                                              \
    ATTR static void NAME(size_t n, const void *w, size_t w_row, size_t q, size_t count, const void *g, size_t nv, \
                          float *y, size_t ldy) {                                                  \
        switch (nv) {                                                                              \
        case 1: NAME##_nv(n, w, w_row, q, count, g, 1, y, ldy); break;                             \
        case 2: NAME##_nv(n, w, w_row, q, count, g, 2, y, ldy); break;                             \
        case 3: NAME##_nv(n, w, w_row, q, count, g, 3, y, ldy); break;                             \
        default: NAME##_nv(n, w, w_row, q, count, g, 4, y, ldy); break;                            \
        }                                                                                          \
    }

/* the same for groups of up to 8 rows (EL_PANEL_K_ROWS) */
#define EL_PANEL8_FROM_TILE(ATTR, NAME, PTILE)                                                     \
    EL_PANEL_FROM_TILE(ATTR, NAME##_4, PTILE)                                                      \
    ATTR static void NAME(size_t n, const void *w, size_t w_row, size_t q, size_t count, const void *g, size_t nv, \
                          float *y, size_t ldy) {                                                  \
        switch (nv) {                                                                              \
        case 5: NAME##_4_nv(n, w, w_row, q, count, g, 5, y, ldy); break;                           \
        case 6: NAME##_4_nv(n, w, w_row, q, count, g, 6, y, ldy); break;                           \
        case 7: NAME##_4_nv(n, w, w_row, q, count, g, 7, y, ldy); break;                           \
        case 8: NAME##_4_nv(n, w, w_row, q, count, g, 8, y, ldy); break;                           \
        default: NAME##_4(n, w, w_row, q, count, g, nv, y, ldy); break;                            \
        }                                                                                          \
    }


#define EL_ALIGN32 __attribute__((aligned(32)))

EL_AVX2 static inline float el_hsum_ps(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

EL_AVX2 static inline float el_hmax_ps(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    s = _mm_max_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

EL_AVX2 static inline int el_hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    return _mm_cvtsi128_si32(s);
}

/* fp16 at any address -> float (F16C) */
EL_AVX2 static inline float el_h2f(const void *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* float -> fp16 at any address, round to nearest even: the same bits as el_fp32_to_fp16 */
EL_AVX2 static inline void el_store_f2h(void *p, float f) {
    const uint16_t h = (uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
    memcpy(p, &h, 2);
}


/* ---- 32-value block helpers (avx2.c, avx512.c) ---- */

/* 16 bytes of nibbles -> 32 bytes: low nibbles are values 0..15, high nibbles values 16..31 */
EL_AVX2 static inline __m256i unpack_nibbles_32(const uint8_t *p) {
    /* one broadcast load, then the high lane shifted by 4 (a per-lane shift count) */
    const __m256i b = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)p));
    return _mm256_and_si256(_mm256_srlv_epi64(b, _mm256_setr_epi64x(0, 0, 4, 4)), _mm256_set1_epi8(0x0F));
}

/* 32 bits (little endian) -> 32 bytes, 0xFF where bit j is set */
EL_AVX2 static inline __m256i unpack_bits_32(const uint8_t *p) {
    uint32_t x;
    memcpy(&x, p, 4);
    /* byte j takes byte j/8 of x (vpshufb works within 128-bit lanes; each lane holds x) */
    const __m256i spread = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                            2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i b = _mm256_shuffle_epi8(_mm256_set1_epi32((int)x), spread);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_cmpeq_epi8(_mm256_and_si256(b, bit), bit);
}

static inline uint32_t ld16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

/* the fp16 pairs at p and q (d, m of a weight block or d, s of a Q8_1 block) -> [p0, p1, q0, q1] */
EL_AVX2 static inline __m128 halves_dm2(const uint8_t *p, const uint8_t *q) {
    uint32_t a, b;
    memcpy(&a, p, 4);
    memcpy(&b, q, 4);
    return _mm_cvtph_ps(_mm_cvtsi64_si128((long long)((uint64_t)a | (uint64_t)b << 32)));
}

/* d(x0) d(y0) and d(x1) d(y1) of two block pairs, broadcast: the four halves go through one
 * vcvtph2ps (vector ports are the bottleneck here; the packing runs on the integer ALUs) */
EL_AVX2 static inline void scales2(const uint8_t *x0, const uint8_t *x1, const uint8_t *y0, const uint8_t *y1,
                                   __m256 *d0, __m256 *d1) {
    const __m128i h = _mm_setr_epi32((int)(ld16(x0) | ld16(x1) << 16), (int)(ld16(y0) | ld16(y1) << 16), 0, 0);
    const __m128 f = _mm_cvtph_ps(h); /* dx0 dx1 dy0 dy1 */
    const __m128 p = _mm_mul_ps(f, _mm_movehl_ps(f, f));
    *d0 = _mm256_broadcastss_ps(p);
    *d1 = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(p), _mm256_set1_epi32(1));
}

/* scales2 for several activation rows against one weight row: fx = (dx0, dx1) from scales_x2, then
 * each row's d0 = dx0 dy0, d1 = dx1 dy1 with the very bits scales2 gives (one multiply each) */
EL_AVX2 static inline __m128 scales_x2(const uint8_t *x0, const uint8_t *x1) {
    return _mm_cvtph_ps(_mm_cvtsi32_si128((int)(ld16(x0) | ld16(x1) << 16)));
}
EL_AVX2 static inline void scales2_y(__m128 fx, const uint8_t *y0, const uint8_t *y1, __m256 *d0, __m256 *d1) {
    const __m128 p = _mm_mul_ps(fx, _mm_cvtph_ps(_mm_cvtsi32_si128((int)(ld16(y0) | ld16(y1) << 16))));
    *d0 = _mm256_broadcastss_ps(p);
    *d1 = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(p), _mm256_set1_epi32(1));
}

/* Several weight rows against one activation row: (dx0, dx1) of rows 0..nr-1 (nr <= 4, blocks x and
 * x + wb of each row) as floats 2r, 2r + 1 of one vector, and (dy0, dy1) repeated to match, so one
 * multiply gives every row's d0 = dx0 dy0, d1 = dx1 dy1 with the bits scales2 gives */
EL_AVX2 static inline __m256 scales_x2_rows(const uint8_t *x, size_t ws, size_t wb, int nr) {
    uint32_t p[4] = {0, 0, 0, 0};
    for (int r = 0; r < nr; r++) p[r] = ld16(x + r * ws) | ld16(x + r * ws + wb) << 16;
    return _mm256_cvtph_ps(_mm_setr_epi32((int)p[0], (int)p[1], (int)p[2], (int)p[3]));
}
EL_AVX2 static inline __m256 scales_y2_x4(const uint8_t *y0, const uint8_t *y1) {
    return _mm256_cvtph_ps(_mm_set1_epi32((int)(ld16(y0) | ld16(y1) << 16)));
}

EL_AVX2 static inline __m256i load_q8_0(const uint8_t *b) { return _mm256_loadu_si256((const __m256i *)(b + 2)); }

/* ---- K-quant helpers (avx2_kquants.c, avx512.c) ---- */

/* block_q8_K: float d at 0, 256 int8 at 4, 16 int16 bsums at 260 */
#define Q8K_BYTES 292
#define Q8K_QS 4
#define Q8K_BSUMS 260

EL_AVX2 static inline __m256i loadu256(const uint8_t *p) { return _mm256_loadu_si256((const __m256i *)p); }

EL_AVX2 static inline float load_f32(const uint8_t *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}

/* For 16-value sub-blocks (Q2_K, Q3_K, Q6_K): `sc` holds 8 int16 scales in both 128-bit lanes;
 * returns scale 2g in every int16 of the low lane and 2g+1 in the high lane, which is how the 32
 * values of one 256-bit register split into two sub-blocks after vpmaddubsw. */
EL_AVX2 static inline __m256i scale_pair(__m256i sc, int g) {
    const short lo = (short)(((4 * g + 1) << 8) | (4 * g)), hi = (short)(((4 * g + 3) << 8) | (4 * g + 2));
    const __m256i mask = _mm256_setr_epi16(lo, lo, lo, lo, lo, lo, lo, lo, hi, hi, hi, hi, hi, hi, hi, hi);
    return _mm256_shuffle_epi8(sc, mask);
}

/* For 32-value sub-blocks (Q4_K, Q5_K): `sc` holds 8 int16 scales in both lanes; scale s everywhere */
EL_AVX2 static inline __m256i scale_all(__m256i sc, int s) {
    return _mm256_shuffle_epi8(sc, _mm256_set1_epi16((short)(((2 * s + 1) << 8) | (2 * s))));
}

/* 16 int8 scales -> int16 scales 0..7 in both lanes (lo) and 8..15 in both lanes (hi) */
EL_AVX2 static inline void split_scales16(__m256i sc16, __m256i *lo, __m256i *hi) {
    *lo = _mm256_permute2x128_si256(sc16, sc16, 0x00);
    *hi = _mm256_permute2x128_si256(sc16, sc16, 0x11);
}

/* Q4_K / Q5_K: 8 sub-blocks of 32, 6-bit scales and mins packed in 12 bytes */
/* 12 packed bytes -> int16 scales 0..7 (low lane) and mins 0..7 (high lane) */
EL_AVX2 static inline __m256i unpack_scales_mins_k4(const uint8_t *p) {
    const uint32_t m6 = 0x3f3f3f3f, m4 = 0x0f0f0f0f, m2 = 0x03030303;
    uint32_t u[3];
    memcpy(u, p, 12);
    /* scales 0..3 and mins 0..3 are the low 6 bits of bytes 0..7; 4..7 take their low/high nibble
     * from bytes 8..11 and the top 2 bits from bytes 0..7 */
    const uint32_t sc_lo = u[0] & m6, mn_lo = u[1] & m6;
    const uint32_t sc_hi = (u[2] & m4) | (((u[0] >> 6) & m2) << 4);
    const uint32_t mn_hi = ((u[2] >> 4) & m4) | (((u[1] >> 6) & m2) << 4);
    return _mm256_cvtepu8_epi16(_mm_setr_epi32((int)sc_lo, (int)sc_hi, (int)mn_lo, (int)mn_hi));
}

/* bsums[2s] + bsums[2s+1] for the 8 sub-blocks s of 32 (int16: |sum| <= 32 * 128) */
EL_AVX2 static inline __m128i bsums_pairs(const uint8_t *y) {
    const __m256i bs = loadu256(y + Q8K_BSUMS);
    return _mm_hadd_epi16(_mm256_castsi256_si128(bs), _mm256_extracti128_si256(bs, 1));
}

/* sum over sub-blocks s of min[s] * (bsums[2s] + bsums[2s+1]), as 4 int32 lanes */
EL_AVX2 static inline __m128i mins_dot_bsums(__m256i scmn, const uint8_t *y) {
    return _mm_madd_epi16(_mm256_extracti128_si256(scmn, 1), bsums_pairs(y));
}

/* defined in avx2_kquants.c */
void el_kernels_fill_avx2_kquants(el_kernels *k);

#endif

/* arch/avx512.c - AVX-512 (F, BW, VL) + VNNI kernels for x86-64 hosts, compiled with target
 * attributes like avx2.c (the library is built without -mavx512*); dispatch.c installs them on top
 * of the AVX2 table only when cpuid and xgetbv say the CPU and OS have them. vpdpbusd does a
 * u8 x s8 dot of 4 bytes straight into int32 (no int16 stage), and one zmm holds two 32-value
 * blocks or two K-quant sub-blocks. Each kernel body serves vec_dot and vec_dot_nv (same bits). */
#include "../dispatch.h"

#if defined(__x86_64__)
#include "avx512_common.h"

_Static_assert(EL_MV_ROWS >= EL_TILE_ROWS, "the tile kernels size their row arrays by EL_MV_ROWS");

/* ---- 32-value blocks (Q8_0, Q4_0, Q5_0 x Q8_0; Q4_1, Q5_1 x Q8_1): two blocks per zmm, NR weight rows
 * x NV activation rows per call ----
 * vpdpbusd multiplies u8 by s8 into int32, so one side must be unsigned:
 * - Q8_0 (signed w, signed a): the activations go unsigned as a + 128 (one xor per activation pair,
 *   shared by the NR rows) and the accumulator starts at -128 sum(w) (once per weight pair, shared
 *   by the NV activations): sum((a + 128) w) - 128 sum(w) = sum(a w).
 * - Q5_0 (w = u - 16 with u = nibble + 16 h in 0..31): u is the unsigned side as it stands, and the
 *   accumulator starts at -16 sum(a) (once per activation pair, shared by the NR rows):
 *   sum(u a) - 16 sum(a) = sum(w a). No per-row offset, no complement of the h mask. Q4_0 likewise
 *   with u = nibble and -8 sum(a).
 * - Q4_1 / Q5_1 (x = d u + m, u unsigned): sum(u a) straight, the min term m s (Q8_1's s = dy sum(a))
 *   added per block apart.
 * All exact in int32. Floats: the block scales of a pair as one xmm product p = hx hy (Q8_0 / Q5_0:
 * [dx0 dy0, dx1 dy1]; Q4_1 / Q5_1: [dx0 dy0, m0 s0, dx1 dy1, m1 s1]), broadcast to the 16 lanes,
 * acc += d * float(isum), one accumulator per output; the min terms add up in p's lanes 1 and 3.
 * Each type supplies _w (weight pair), _wst (its start term), _a, _ast, _dot, _h (scale halves). */

/* the start term of a type that needs none */
EL_AVX512 static inline __m512i zero_st(__m512i v) { return (void)v, _mm512_setzero_si512(); }

EL_AVX512 static inline __m512i q8_0_w(const uint8_t *x0, const uint8_t *x1) { return bytes32_x2(x0 + 2, x1 + 2); }
EL_AVX512 static inline __m512i q8_0_wst(__m512i w) { return neg_scaled_sum4(w, (char)0x80); }
EL_AVX512 static inline __m512i q8_0_a(const uint8_t *y0, const uint8_t *y1) {
    return _mm512_xor_si512(bytes32_x2(y0 + 2, y1 + 2), _mm512_set1_epi8((char)0x80));
}
#define q8_0_ast zero_st
EL_AVX512 static inline __m512i q8_0_dot(__m512i w, __m512i wst, __m512i a, __m512i ast) {
    return (void)ast, _mm512_dpbusd_epi32(wst, a, w);
}
#define q8_0_h halves1
#define q8_0_MIN 0

#define q5_0_w q5_0_u_x2
#define q5_0_wst zero_st
EL_AVX512 static inline __m512i q5_0_a(const uint8_t *y0, const uint8_t *y1) { return bytes32_x2(y0 + 2, y1 + 2); }
EL_AVX512 static inline __m512i q5_0_ast(__m512i a) { return neg_scaled_sum4(a, 16); }
EL_AVX512 static inline __m512i q5_0_dot(__m512i w, __m512i wst, __m512i a, __m512i ast) {
    return (void)wst, _mm512_dpbusd_epi32(ast, w, a);
}
#define q5_0_h halves1
#define q5_0_MIN 0

/* Q4_0 (w = u - 8, u the nibble): as Q5_0, with -8 sum(a) */
EL_AVX512 static inline __m512i q4_0_w(const uint8_t *x0, const uint8_t *x1) { return nibbles_x2(x0 + 2, x1 + 2); }
EL_AVX512 static inline __m512i q4_0_ast(__m512i a) { return neg_scaled_sum4(a, 8); }
#define q4_0_wst zero_st
#define q4_0_a q5_0_a
#define q4_0_dot q5_0_dot
#define q4_0_h halves1
#define q4_0_MIN 0

/* Q4_1: d, m, qs[16]; Q5_1: d, m, qh[4], qs[16]; Q8_1: d, s, qs[32] */
EL_AVX512 static inline __m512i q4_1_w(const uint8_t *x0, const uint8_t *x1) { return nibbles_x2(x0 + 4, x1 + 4); }
EL_AVX512 static inline __m512i q5_1_w(const uint8_t *x0, const uint8_t *x1) {
    return add_high_x2(nibbles_x2(x0 + 8, x1 + 8), x0 + 4, x1 + 4);
}
EL_AVX512 static inline __m512i q8_1_a(const uint8_t *y0, const uint8_t *y1) { return bytes32_x2(y0 + 4, y1 + 4); }
EL_AVX512 static inline __m512i unsigned_dot(__m512i w, __m512i wst, __m512i a, __m512i ast) {
    return (void)wst, (void)ast, _mm512_dpbusd_epi32(_mm512_setzero_si512(), w, a);
}
#define q4_1_wst zero_st
#define q4_1_a q8_1_a
#define q4_1_ast zero_st
#define q4_1_dot unsigned_dot
#define q4_1_h halves_dm2
#define q4_1_MIN 1
#define q5_1_wst zero_st
#define q5_1_a q8_1_a
#define q5_1_ast zero_st
#define q5_1_dot unsigned_dot
#define q5_1_h halves_dm2
#define q5_1_MIN 1

/* One pair of blocks at block index I (PAIR = 0: I is the odd last block, paired with a zero block
 * of scale 0, which adds +0 to every lane) into the accumulators ACC[r][j] (and MINS[r][j]). */
#define EL_BLK512_PAIR(ACC, MINS, I, PAIR, WB, AB, T)                                              \
    do {                                                                                           \
        __m512i wv[EL_MV_ROWS], wo[EL_MV_ROWS];                                                    \
        __m128 hx[EL_MV_ROWS];                                                                     \
        for (int r = 0; r < NR; r++) {                                                             \
            const uint8_t *x0 = pw + r * ws + (I) * (WB), *x1 = (PAIR) ? x0 + (WB) : zero_w;       \
            _mm_prefetch((const char *)x0 + EL_PF_DIST, _MM_HINT_T0);                              \
            wv[r] = T##_w(x0, x1);                                                                 \
            wo[r] = T##_wst(wv[r]);                                                                \
            hx[r] = T##_h(x0, x1);                                                                 \
        }                                                                                          \
        for (int j = 0; j < NV; j++) {                                                             \
            const uint8_t *y0 = pa + j * as + (I) * (AB), *y1 = (PAIR) ? y0 + (AB) : zero_a;       \
            const __m512i av = T##_a(y0, y1), ao = T##_ast(av);                                    \
            const __m128 hy = T##_h(y0, y1);                                                       \
            for (int r = 0; r < NR; r++) {                                                         \
                const __m128 p = _mm_mul_ps(hx[r], hy);                                            \
                const __m512 d = _mm512_permutexvar_ps(didx, _mm512_castps128_ps512(p));           \
                const __m512 f = _mm512_cvtepi32_ps(T##_dot(wv[r], wo[r], av, ao));                \
                ACC[r][j] = _mm512_fmadd_ps(d, f, ACC[r][j]);                                      \
                if (T##_MIN) MINS[r][j] = _mm_add_ps(MINS[r][j], p);                               \
            }                                                                                      \
        }                                                                                          \
    } while (0)

/* out[r * ldo + j] = row r . activation row j; NR = NV = 1 is vec_dot, NR = 1 vec_dot_nv */
#define EL_DOT_BLK512(NAME, WBYTES, ABYTES, T)                                                     \
    EL_AVX512 EL_FORCE_INLINE void NAME##_tile(size_t n, const void *w, size_t ws, const int NR,   \
                                               const void *a, size_t as, const int NV, float *out, \
                                               size_t ldo) {                                      \
        static const uint8_t zero_w[WBYTES], zero_a[ABYTES];                                       \
        const uint8_t *pw = w, *pa = a;                                                            \
        const size_t nb = n / 32;                                                                  \
        /* lanes 0-7 <- p[0], 8-15 <- p[1] (one scale per block) or p[2] (scale, min per block) */ \
        const __m512i didx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1 + T##_MIN, 1 + T##_MIN,   \
                                               1 + T##_MIN, 1 + T##_MIN, 1 + T##_MIN, 1 + T##_MIN, \
                                               1 + T##_MIN, 1 + T##_MIN);                          \
        __m512 acc[EL_MV_ROWS][EL_NV_MAX];                                                         \
        __m128 mins[EL_MV_ROWS][EL_NV_MAX];                                                        \
        for (int r = 0; r < NR; r++)                                                               \
            for (int j = 0; j < NV; j++) acc[r][j] = _mm512_setzero_ps(), mins[r][j] = _mm_setzero_ps(); \
        size_t i = 0;                                                                              \
        for (; i + 4 <= nb; i += 4) {                                                              \
            EL_BLK512_PAIR(acc, mins, i, 1, WBYTES, ABYTES, T);                                    \
            EL_BLK512_PAIR(acc, mins, i + 2, 1, WBYTES, ABYTES, T);                                \
        }                                                                                          \
        if (i + 2 <= nb) {                                                                         \
            EL_BLK512_PAIR(acc, mins, i, 1, WBYTES, ABYTES, T);                                    \
            i += 2;                                                                                \
        }                                                                                          \
        if (i < nb) EL_BLK512_PAIR(acc, mins, i, 0, WBYTES, ABYTES, T);                            \
        for (int r = 0; r < NR; r++)                                                               \
            for (int j = 0; j < NV; j++) {                                                         \
                const float s = _mm512_reduce_add_ps(acc[r][j]);                                   \
                if (T##_MIN) {                                                                     \
                    const __m128 m = mins[r][j];                                                   \
                    out[r * ldo + j] = s + (_mm_cvtss_f32(_mm_shuffle_ps(m, m, 1)) +               \
                                            _mm_cvtss_f32(_mm_shuffle_ps(m, m, 3)));               \
                } else {                                                                           \
                    out[r * ldo + j] = s;                                                          \
                }                                                                                  \
            }                                                                                      \
    }                                                                                              \
    EL_TILE_ENTRIES(EL_AVX512, NAME, NAME##_tile)                                                  \
    EL_TILE2_ENTRY(EL_AVX512, NAME, NAME##_tile)

EL_DOT_BLK512(vec_dot_q8_0_avx512, 34, 34, q8_0)
EL_DOT_BLK512(vec_dot_q5_0_avx512, 22, 34, q5_0)
EL_DOT_BLK512(vec_dot_q4_0_avx512, 18, 34, q4_0)
EL_DOT_BLK512(vec_dot_q4_1_avx512, 20, 36, q4_1)
EL_DOT_BLK512(vec_dot_q5_1_avx512, 24, 36, q5_1)

/* ---- K-quants x Q8_K: Q4_K and Q6_K, one superblock per step (avx512_common.h) ----
 * NR weight rows (at w + r * ws) x NV activation rows, the type's step per output and superblock, so
 * every output has the operations of NR = NV = 1 (vec_dot) in the same order. One activation row
 * (the matvec): its reordering once, the rows in turn; several (a batch without the panel): the rows'
 * unpacking once, the activation rows in turn. No software prefetch: streaming a Q4_K or Q6_K matrix
 * from DRAM (the 151936 x 1024 output head, 2 threads) measured 10-25% faster without it. */
#define EL_KQ_TILE512(NAME, T, BLOCK)                                                              \
    EL_AVX512 EL_FORCE_INLINE void NAME##_tile(size_t n, const void *w, size_t ws, const int NR, const void *a, \
                                               size_t as, const int NV, float *out, size_t ldo) {  \
        const uint8_t *pw = w, *pa = a;                                                            \
        __m512 acc[EL_MV_ROWS][EL_NV_MAX];                                                         \
        EL_UNROLL for (int r = 0; r < NR; r++)                                                     \
            EL_UNROLL for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();                \
        for (size_t i = 0; i < n / QK_K; i++) {                                                    \
            if (NV == 1) {                                                                         \
                el_q8k_act y;                                                                      \
                el_q8k_act_prep(pa + i * Q8K_BYTES, &y);                                           \
                const __m512 yd = _mm512_set1_ps(y.d);                                             \
                EL_UNROLL for (int r = 0; r < NR; r++) {                                           \
                    const uint8_t *x = pw + r * ws + i * sizeof(BLOCK);                            \
                    T##_w x4;                                                                      \
                    T##_w_prep(x, &x4);                                                            \
                    acc[r][0] = T##_step(acc[r][0], &x4, &y, yd);                                  \
                }                                                                                  \
            } else {                                                                               \
                T##_w x4[EL_MV_ROWS];                                                              \
                EL_UNROLL for (int r = 0; r < NR; r++) T##_w_prep(pw + r * ws + i * sizeof(BLOCK), &x4[r]); \
                EL_UNROLL for (int v = 0; v < NV; v++) {                                           \
                    el_q8k_act y;                                                                  \
                    el_q8k_act_prep(pa + v * as + i * Q8K_BYTES, &y);                              \
                    const __m512 yd = _mm512_set1_ps(y.d);                                         \
                    EL_UNROLL for (int r = 0; r < NR; r++) acc[r][v] = T##_step(acc[r][v], &x4[r], &y, yd); \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        EL_UNROLL for (int r = 0; r < NR; r++)                                                     \
            EL_UNROLL for (int v = 0; v < NV; v++) out[r * ldo + v] = _mm512_reduce_add_ps(acc[r][v]); \
    }                                                                                              \
    EL_TILE_ENTRIES(EL_AVX512, NAME, NAME##_tile)                                                  \
    EL_TILE2_ENTRY(EL_AVX512, NAME, NAME##_tile)

EL_KQ_TILE512(vec_dot_q4_K_avx512, el_q4k, block_q4_K)
EL_KQ_TILE512(vec_dot_q6_K_avx512, el_q6k, block_q6_K)

/* ---- float weights (F32, F16, BF16) x F32 activations: 16 lanes, one accumulator per output ----
 * Prompts of F16 models (a converted BERT) were one vec_dot per (row, token), each converting its row's
 * halves again and ending in a horizontal sum. Here NR weight rows x NV activation rows per call: a
 * weight vector is converted once for the NV activations, an activation vector loaded once for the NR
 * rows, and each output is one chain of FMAs over 16-lane steps (the last step masked: zeros in both
 * operands add nothing) and _mm512_reduce_add_ps, whatever NR and NV: vec_dot's bits. The three types
 * share the chain, so a weight stored as halves gives the bits of its values widened to F32 (LoRA's
 * F16 adapters rely on it). LOAD16(row, i, mask): values i..i+15 of a row as floats. */
EL_AVX512 static inline __m512 f32x16(const uint8_t *p, size_t i, __mmask16 m) {
    return _mm512_maskz_loadu_ps(m, (const float *)p + i);
}
EL_AVX512 static inline __m512 f16x16(const uint8_t *p, size_t i, __mmask16 m) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p + 2 * i));
}
EL_AVX512 static inline __m512 bf16x16(const uint8_t *p, size_t i, __mmask16 m) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p + 2 * i)), 16));
}

#define EL_FLOAT_STEP512(LOAD16, M)                                                                \
    do {                                                                                           \
        __m512 y[EL_NV_MAX];                                                                       \
        EL_UNROLL for (int v = 0; v < NV; v++) y[v] = f32x16(pa + v * as, i, (M));                 \
        EL_UNROLL for (int r = 0; r < NR; r++) {                                                   \
            const __m512 x = LOAD16(pw + r * ws, i, (M));                                          \
            EL_UNROLL for (int v = 0; v < NV; v++) acc[r][v] = _mm512_fmadd_ps(x, y[v], acc[r][v]); \
        }                                                                                          \
    } while (0)

#define EL_FLOAT_TILE512(NAME, LOAD16)                                                             \
    EL_AVX512 EL_FORCE_INLINE void NAME##_tile(size_t n, const void *w, size_t ws, const int NR, const void *a, \
                                               size_t as, const int NV, float *out, size_t ldo) {  \
        const uint8_t *pw = w, *pa = a;                                                            \
        __m512 acc[EL_MV_ROWS][EL_NV_MAX];                                                         \
        EL_UNROLL for (int r = 0; r < NR; r++)                                                     \
            EL_UNROLL for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();                \
        size_t i = 0;                                                                              \
        for (; i + 16 <= n; i += 16) EL_FLOAT_STEP512(LOAD16, (__mmask16)0xFFFF);                  \
        if (i < n) EL_FLOAT_STEP512(LOAD16, (__mmask16)((1u << (n - i)) - 1));                     \
        EL_UNROLL for (int r = 0; r < NR; r++)                                                     \
            EL_UNROLL for (int v = 0; v < NV; v++) out[r * ldo + v] = _mm512_reduce_add_ps(acc[r][v]); \
    }                                                                                              \
    EL_TILE_ENTRIES(EL_AVX512, NAME, NAME##_tile)                                                  \
    EL_TILE2_ENTRY(EL_AVX512, NAME, NAME##_tile)

EL_FLOAT_TILE512(vec_dot_f32_avx512, f32x16)
EL_FLOAT_TILE512(vec_dot_f16_avx512, f16x16)
EL_FLOAT_TILE512(vec_dot_bf16_avx512, bf16x16)

/* Replaces the AVX2 entries of the types above (EL_SET_DOT_ENTRIES: vec_dot, vec_dot_nv, vec_dot_tile
 * and vec_dot_rows together, vec_dot_panel cleared); every other type keeps the AVX2 kernels
 * el_kernels_fill_avx2 installed. */
void el_kernels_fill_avx512(el_kernels *k) {
    k->name = "avx512";
    EL_SET_DOT_ENTRIES(k, EL_TYPE_Q8_0, vec_dot_q8_0_avx512, vec_dot_q8_0_avx512_tile2);
    EL_SET_DOT_ENTRIES(k, EL_TYPE_Q4_0, vec_dot_q4_0_avx512, vec_dot_q4_0_avx512_tile2);
    EL_SET_DOT_ENTRIES(k, EL_TYPE_Q5_0, vec_dot_q5_0_avx512, vec_dot_q5_0_avx512_tile2);
    EL_SET_DOT_ENTRIES(k, EL_TYPE_Q4_1, vec_dot_q4_1_avx512, vec_dot_q4_1_avx512_tile2);
    EL_SET_DOT_ENTRIES(k, EL_TYPE_Q5_1, vec_dot_q5_1_avx512, vec_dot_q5_1_avx512_tile2);
    EL_SET_DOT_ENTRIES(k, EL_TYPE_Q4_K, vec_dot_q4_K_avx512, vec_dot_q4_K_avx512_tile2);
    EL_SET_DOT_ENTRIES(k, EL_TYPE_Q6_K, vec_dot_q6_K_avx512, vec_dot_q6_K_avx512_tile2);
    EL_SET_DOT_ENTRIES(k, EL_TYPE_F32, vec_dot_f32_avx512, vec_dot_f32_avx512_tile2);
    EL_SET_DOT_ENTRIES(k, EL_TYPE_F16, vec_dot_f16_avx512, vec_dot_f16_avx512_tile2);
    EL_SET_DOT_ENTRIES(k, EL_TYPE_BF16, vec_dot_bf16_avx512, vec_dot_bf16_avx512_tile2);
}
#endif

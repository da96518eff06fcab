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

/* ---- K-quants x Q8_K ----
 * One zmm = 64 weight values against 64 contiguous activation bytes: vpmaddubsw makes exact int16
 * pair sums (|u a| <= 2 * 63 * 127), then VNNI's vpdpwssd multiplies them by the int16 sub-block
 * scale and adds into int32 in one step (AVX2 needs vpmaddwd and vpaddd). */

/* int16 lanes 0-15 = a, 16-31 = b */
EL_AVX512 static inline __m512i rep16(int a, int b) {
    const int x = (a & 0xffff) * 0x10001, y = (b & 0xffff) * 0x10001;
    return _mm512_setr_epi32(x, x, x, x, x, x, x, x, y, y, y, y, y, y, y, y);
}
/* int16 lanes 8k..8k+7 = a + k, k < 4 */
EL_AVX512 static inline __m512i rep8(int a) {
    const int w = a * 0x10001, x = (a + 1) * 0x10001, y = (a + 2) * 0x10001, z = (a + 3) * 0x10001;
    return _mm512_setr_epi32(w, w, w, w, x, x, x, x, y, y, y, y, z, z, z, z);
}

/* NR weight rows (at w + r * ws) x NV activation rows; each output's operations are those of
 * NR = NV = 1 (vec_dot), in the same order: the rows only interleave independent chains */
EL_AVX512 EL_FORCE_INLINE void q4_K_tile512(size_t n, const void *w, size_t ws, const int NR, const void *a,
                                            size_t as, const int NV, float *out, size_t ldo) {
    const uint8_t *pw = w, *pa = a;
    const __m512i m4 = _mm512_set1_epi8(0x0F), shift_hi = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
    __m512 acc[EL_MV_ROWS][EL_NV_MAX];
    __m128 accm[EL_MV_ROWS][EL_NV_MAX];
    for (int r = 0; r < NR; r++)
        for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps(), accm[r][v] = _mm_setzero_ps();
    for (size_t i = 0; i < n / QK_K; i++) {
        for (int r = 0; r < NR; r++) {
            const uint8_t *x = pw + r * ws + i * sizeof(block_q4_K);
            const float xd = el_h2f(x), xmin = el_h2f(x + 2);
            const __m256i scmn = unpack_scales_mins_k4(x + 4);
            /* int16 scales 0..7 in the low 128 bits; chunk j uses 2j on int16 lanes 0-15, 2j+1 on 16-31 */
            const __m512i sc16 = _mm512_castsi256_si512(scmn);
            __m512i s[EL_NV_MAX];
            for (int v = 0; v < NV; v++) {
                const uint8_t *y = pa + v * as + i * Q8K_BYTES;
                accm[r][v] = _mm_fmadd_ps(_mm_set1_ps(load_f32(y) * xmin), _mm_cvtepi32_ps(mins_dot_bsums(scmn, y)),
                                          accm[r][v]);
                s[v] = _mm512_setzero_si512();
            }
            for (int j = 0; j < 4; j++) {
                const __m256i qb = _mm256_loadu_si256((const __m256i *)(x + 16 + 32 * j));
                /* low nibbles (sub-block 2j) in the low half, high nibbles (2j+1) in the high half */
                const __m512i q = _mm512_and_si512(_mm512_srlv_epi64(join256(qb, qb), shift_hi), m4);
                const __m512i sc = _mm512_permutexvar_epi16(rep16(2 * j, 2 * j + 1), sc16);
                for (int v = 0; v < NV; v++) {
                    const uint8_t *q8 = pa + v * as + i * Q8K_BYTES + Q8K_QS + 64 * j;
                    s[v] = _mm512_dpwssd_epi32(s[v], _mm512_maddubs_epi16(q, loadu512(q8)), sc);
                }
            }
            for (int v = 0; v < NV; v++) {
                const float yd = load_f32(pa + v * as + i * Q8K_BYTES);
                acc[r][v] = _mm512_fmadd_ps(_mm512_set1_ps(yd * xd), _mm512_cvtepi32_ps(s[v]), acc[r][v]);
            }
        }
    }
    for (int r = 0; r < NR; r++)
        for (int v = 0; v < NV; v++) {
            __m128 m = _mm_add_ps(accm[r][v], _mm_movehl_ps(accm[r][v], accm[r][v]));
            m = _mm_add_ss(m, _mm_movehdup_ps(m));
            out[r * ldo + v] = _mm512_reduce_add_ps(acc[r][v]) - _mm_cvtss_f32(m);
        }
}
EL_TILE_ENTRIES(EL_AVX512, vec_dot_q4_K_avx512, q4_K_tile512)

/* Q6_K: levels u - 32 (u 6-bit unsigned): sum(u a sc) - 32 sum(sc bsums), as in avx2_kquants.c */
EL_AVX512 EL_FORCE_INLINE void q6_K_tile512(size_t n, const void *w, size_t ws, const int NR, const void *a,
                                            size_t as, const int NV, float *out, size_t ldo) {
    const uint8_t *pw = w, *pa = a;
    const __m512i m4 = _mm512_set1_epi8(0x0F), m2 = _mm512_set1_epi8(3);
    __m512 acc[EL_MV_ROWS][EL_NV_MAX];
    for (int r = 0; r < NR; r++)
        for (int v = 0; v < NV; v++) acc[r][v] = _mm512_setzero_ps();
    for (size_t i = 0; i < n / QK_K; i++) {
        for (int r = 0; r < NR; r++) {
            const uint8_t *x = pw + r * ws + i * sizeof(block_q6_K);
            const __m128i sc8 = _mm_loadu_si128((const __m128i *)(x + 192));
            const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);
            const __m512i sc16z = _mm512_castsi256_si512(sc16);
            __m512i s[EL_NV_MAX];
            for (int v = 0; v < NV; v++) {
                const uint8_t *y = pa + v * as + i * Q8K_BYTES;
                const __m256i corr = _mm256_slli_epi32(_mm256_madd_epi16(sc16, loadu256(y + Q8K_BSUMS)), 5);
                s[v] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_zextsi256_si512(corr));
            }
            for (int c = 0; c < 2; c++) {
                const __m512i ql = loadu512(x + 64 * c);
                const __m256i qh = loadu256(x + 128 + 32 * c);
                const __m512i hq = join256(qh, _mm256_srli_epi16(qh, 2));
                /* values 0-63 of this half (sub-blocks 8c..8c+3), then 64-127 (8c+4..8c+7); 2-bit
                 * fields are masked before the shift left, so nothing carries into the next byte */
                const __m512i u01 = _mm512_or_si512(_mm512_and_si512(ql, m4), _mm512_slli_epi16(_mm512_and_si512(hq, m2), 4));
                const __m512i u23 = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(ql, 4), m4),
                                                    _mm512_slli_epi16(_mm512_and_si512(_mm512_srli_epi16(hq, 4), m2), 4));
                /* 16-value sub-blocks: 8 int16 pair sums each */
                const __m512i sc_a = _mm512_permutexvar_epi16(rep8(8 * c), sc16z);
                const __m512i sc_b = _mm512_permutexvar_epi16(rep8(8 * c + 4), sc16z);
                for (int v = 0; v < NV; v++) {
                    const uint8_t *q8 = pa + v * as + i * Q8K_BYTES + Q8K_QS + 128 * c;
                    s[v] = _mm512_dpwssd_epi32(s[v], _mm512_maddubs_epi16(u01, loadu512(q8)), sc_a);
                    s[v] = _mm512_dpwssd_epi32(s[v], _mm512_maddubs_epi16(u23, loadu512(q8 + 64)), sc_b);
                }
            }
            const float xd = el_h2f(x + 208);
            for (int v = 0; v < NV; v++) {
                const float yd = load_f32(pa + v * as + i * Q8K_BYTES);
                acc[r][v] = _mm512_fmadd_ps(_mm512_set1_ps(yd * xd), _mm512_cvtepi32_ps(s[v]), acc[r][v]);
            }
        }
    }
    for (int r = 0; r < NR; r++)
        for (int v = 0; v < NV; v++) out[r * ldo + v] = _mm512_reduce_add_ps(acc[r][v]);
}
EL_TILE_ENTRIES(EL_AVX512, vec_dot_q6_K_avx512, q6_K_tile512)

/* Replaces the AVX2 entries of the types above: vec_dot, vec_dot_nv, vec_dot_tile and vec_dot_rows
 * together, and clears vec_dot_panel, as dispatch.h requires (an AVX2 multi-row kernel left in place
 * would give AVX2's bits); every other type keeps the AVX2 kernels el_kernels_fill_avx2 installed. */
#define EL_SET_ENTRIES(K, TYPE, NAME, TILE)                                                        \
    ((K)->vec_dot[TYPE] = NAME, (K)->vec_dot_nv[TYPE] = NAME##_nv, (K)->vec_dot_tile[TYPE] = (TILE), \
     (K)->vec_dot_rows[TYPE] = NAME##_rows, (K)->vec_dot_panel[TYPE] = NULL)
void el_kernels_fill_avx512(el_kernels *k) {
    k->name = "avx512";
    EL_SET_ENTRIES(k, EL_TYPE_Q8_0, vec_dot_q8_0_avx512, vec_dot_q8_0_avx512_tile2);
    EL_SET_ENTRIES(k, EL_TYPE_Q4_0, vec_dot_q4_0_avx512, vec_dot_q4_0_avx512_tile2);
    EL_SET_ENTRIES(k, EL_TYPE_Q5_0, vec_dot_q5_0_avx512, vec_dot_q5_0_avx512_tile2);
    EL_SET_ENTRIES(k, EL_TYPE_Q4_1, vec_dot_q4_1_avx512, vec_dot_q4_1_avx512_tile2);
    EL_SET_ENTRIES(k, EL_TYPE_Q5_1, vec_dot_q5_1_avx512, vec_dot_q5_1_avx512_tile2);
    EL_SET_ENTRIES(k, EL_TYPE_Q4_K, vec_dot_q4_K_avx512, NULL);
    EL_SET_ENTRIES(k, EL_TYPE_Q6_K, vec_dot_q6_K_avx512, NULL);
}
#endif

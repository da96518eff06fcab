/* arch/avx2_kquants.c - AVX2 dot products of the K-quants (256-value super-blocks) with Q8_K
 * activations, and Q8_K activation quantization. Integer sums per super-block are exact; only the
 * float accumulation across super-blocks differs in order from quants_k.c's reference. */
#include <math.h>

#include "../dispatch.h"

#if defined(__x86_64__)
#include "avx2_common.h"

/* ---- Q4_K / Q5_K ---- */

/* Integer sums are exact in any order, so each output keeps one int32 accumulator; the float steps
 * per super-block (mins, then the scaled sum) are the same for every output. NR weight rows (at
 * w + r * ws) x NV activation rows share the activation loads and the pairing of the bsums; NR = NV
 * = 1 is vec_dot. Q5 = 0: block_q4_K (d, dmin, scales[12], qs[128] at 16). Q5 = 1: block_q5_K
 * (qh[32] at 16, qs[128] at 48); the 5th bit of chunk j's low half is bit 2j of qh[l], of its high
 * half bit 2j+1. */
EL_AVX2 EL_FORCE_INLINE void q45_K_tile(size_t n, const void *w, size_t ws, const int NR, const void *a, size_t as,
                                        const int NV, float *out, size_t ldo, const int Q5) {
    const uint8_t *pw = w, *pa = a;
    const size_t bbytes = Q5 ? sizeof(block_q5_K) : sizeof(block_q4_K);
    const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
    __m256 acc[EL_MV_ROWS][EL_NV_MAX];
    __m128 accm[EL_MV_ROWS][EL_NV_MAX];
    EL_UNROLL for (int r = 0; r < NR; r++)
        EL_UNROLL for (int v = 0; v < NV; v++) acc[r][v] = _mm256_setzero_ps(), accm[r][v] = _mm_setzero_ps();
    for (size_t i = 0; i < n / QK_K; i++) {
        __m128i bs32[EL_NV_MAX];
        float yd[EL_NV_MAX];
        EL_UNROLL for (int v = 0; v < NV; v++) {
            const uint8_t *y = pa + v * as + i * Q8K_BYTES;
            bs32[v] = bsums_pairs(y);
            yd[v] = load_f32(y);
        }
        EL_UNROLL for (int r = 0; r < NR; r++) {
            const uint8_t *x = pw + r * ws + i * bbytes;
            const float xd = el_h2f(x), xmin = el_h2f(x + 2);
            const __m256i scmn = unpack_scales_mins_k4(x + 4);
            const __m256i sc = _mm256_permute2x128_si256(scmn, scmn, 0x00);
            __m256i s[EL_NV_MAX];
            EL_UNROLL for (int v = 0; v < NV; v++) {
                const __m128i mins = _mm_madd_epi16(_mm256_extracti128_si256(scmn, 1), bs32[v]);
                accm[r][v] = _mm_fmadd_ps(_mm_set1_ps(yd[v] * xmin), _mm_cvtepi32_ps(mins), accm[r][v]);
                s[v] = _mm256_setzero_si256();
            }
            const uint8_t *qs = x + (Q5 ? 48 : 16);
            __m256i hb = Q5 ? loadu256(x + 16) : _mm256_setzero_si256();
            for (int j = 0; j < 4; j++) {
                const __m256i qb = loadu256(qs + 32 * j);
                __m256i ql = _mm256_and_si256(qb, m4);
                __m256i qh = _mm256_and_si256(_mm256_srli_epi16(qb, 4), m4);
                if (Q5) {
                    /* bits masked to 0/1 per byte first, so the 16-bit shifts cannot carry across bytes */
                    ql = _mm256_or_si256(ql, _mm256_slli_epi16(_mm256_and_si256(hb, one), 4));
                    qh = _mm256_or_si256(qh, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 1), one), 4));
                    hb = _mm256_srli_epi16(hb, 2);
                }
                const __m256i scl = scale_all(sc, 2 * j), sch = scale_all(sc, 2 * j + 1);
                EL_UNROLL for (int v = 0; v < NV; v++) {
                    const uint8_t *q8 = pa + v * as + i * Q8K_BYTES + Q8K_QS;
                    const __m256i pl = _mm256_maddubs_epi16(ql, loadu256(q8 + 64 * j));
                    const __m256i ph = _mm256_maddubs_epi16(qh, loadu256(q8 + 64 * j + 32));
                    s[v] = _mm256_add_epi32(s[v], _mm256_add_epi32(_mm256_madd_epi16(scl, pl), _mm256_madd_epi16(sch, ph)));
                }
            }
            EL_UNROLL for (int v = 0; v < NV; v++)
                acc[r][v] = _mm256_fmadd_ps(_mm256_set1_ps(yd[v] * xd), _mm256_cvtepi32_ps(s[v]), acc[r][v]);
        }
    }
    EL_UNROLL for (int r = 0; r < NR; r++)
        EL_UNROLL for (int v = 0; v < NV; v++) {
            __m128 m = _mm_add_ps(accm[r][v], _mm_movehl_ps(accm[r][v], accm[r][v]));
            m = _mm_add_ss(m, _mm_movehdup_ps(m));
            out[r * ldo + v] = el_hsum_ps(acc[r][v]) - _mm_cvtss_f32(m);
        }
}
EL_AVX2 EL_FORCE_INLINE void q4_K_tile(size_t n, const void *w, size_t ws, const int NR, const void *a, size_t as,
                                       const int NV, float *out, size_t ldo) {
    q45_K_tile(n, w, ws, NR, a, as, NV, out, ldo, 0);
}
EL_AVX2 EL_FORCE_INLINE void q5_K_tile(size_t n, const void *w, size_t ws, const int NR, const void *a, size_t as,
                                       const int NV, float *out, size_t ldo) {
    q45_K_tile(n, w, ws, NR, a, as, NV, out, ldo, 1);
}
EL_TILE_ENTRIES(EL_AVX2, vec_dot_q4_K_avx2, q4_K_tile)
EL_TILE2_ENTRY(EL_AVX2, vec_dot_q4_K_avx2, q4_K_tile)
/* Q5_K serves vec_dot and vec_dot_nv only (see the fill below for why no rows entry) */
EL_TILE_NV_ENTRIES(EL_AVX2, vec_dot_q5_K_avx2, q5_K_tile)

/* ---- Q6_K: ql[128], qh[64], int8 scales[16] at 192, d at 208 ----
 * Levels are u - 32 with u = 6-bit unsigned; sum((u-32) a sc) = sum(u a sc) - 32 sum(sc bsums),
 * since a scale covers exactly one 16-value bsum. That keeps vpmaddubsw on unsigned u. */
EL_AVX2 EL_FORCE_INLINE void q6_K_tile(size_t n, const void *w, size_t ws, const int NR, const void *a, size_t as,
                                       const int NV, float *out, size_t ldo) {
    const uint8_t *pw = w, *pa = a;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    __m256 acc[EL_MV_ROWS][EL_NV_MAX];
    EL_UNROLL for (int r = 0; r < NR; r++)
        EL_UNROLL for (int v = 0; v < NV; v++) acc[r][v] = _mm256_setzero_ps();
    for (size_t i = 0; i < n / QK_K; i++) {
        EL_UNROLL for (int r = 0; r < NR; r++) {
            const uint8_t *x = pw + r * ws + i * sizeof(block_q6_K);
            const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(x + 192)));
            __m256i sc[2];
            split_scales16(sc16, &sc[0], &sc[1]);
            __m256i s[EL_NV_MAX];
            EL_UNROLL for (int v = 0; v < NV; v++) {
                const uint8_t *y = pa + v * as + i * Q8K_BYTES;
                /* the offset term first: sum(u a sc) - 32 sum(sc bsums) */
                s[v] = _mm256_sub_epi32(_mm256_setzero_si256(),
                                        _mm256_slli_epi32(_mm256_madd_epi16(sc16, loadu256(y + Q8K_BSUMS)), 5));
            }
            for (int c = 0; c < 2; c++) {
                const __m256i qa = loadu256(x + 64 * c), qb = loadu256(x + 64 * c + 32);
                const __m256i qh = loadu256(x + 128 + 32 * c);
                /* 2-bit fields masked before the shift left: at most 0x30, no carry into the next byte */
                const __m256i u0 = _mm256_or_si256(_mm256_and_si256(qa, m4), _mm256_slli_epi16(_mm256_and_si256(qh, m2), 4));
                const __m256i u1 = _mm256_or_si256(_mm256_and_si256(qb, m4),
                                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), m2), 4));
                const __m256i u2 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qa, 4), m4),
                                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), m2), 4));
                const __m256i u3 = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qb, 4), m4),
                                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), m2), 4));
                EL_UNROLL for (int v = 0; v < NV; v++) {
                    const uint8_t *q8 = pa + v * as + i * Q8K_BYTES + Q8K_QS + 128 * c;
                    const __m256i p0 = _mm256_madd_epi16(scale_pair(sc[c], 0), _mm256_maddubs_epi16(u0, loadu256(q8)));
                    const __m256i p1 = _mm256_madd_epi16(scale_pair(sc[c], 1), _mm256_maddubs_epi16(u1, loadu256(q8 + 32)));
                    const __m256i p2 = _mm256_madd_epi16(scale_pair(sc[c], 2), _mm256_maddubs_epi16(u2, loadu256(q8 + 64)));
                    const __m256i p3 = _mm256_madd_epi16(scale_pair(sc[c], 3), _mm256_maddubs_epi16(u3, loadu256(q8 + 96)));
                    s[v] = _mm256_add_epi32(s[v], _mm256_add_epi32(_mm256_add_epi32(p0, p1), _mm256_add_epi32(p2, p3)));
                }
            }
            const float xd = el_h2f(x + 208);
            EL_UNROLL for (int v = 0; v < NV; v++) {
                const float yd = load_f32(pa + v * as + i * Q8K_BYTES);
                acc[r][v] = _mm256_fmadd_ps(_mm256_set1_ps(yd * xd), _mm256_cvtepi32_ps(s[v]), acc[r][v]);
            }
        }
    }
    EL_UNROLL for (int r = 0; r < NR; r++)
        EL_UNROLL for (int v = 0; v < NV; v++) out[r * ldo + v] = el_hsum_ps(acc[r][v]);
}
EL_TILE_ENTRIES(EL_AVX2, vec_dot_q6_K_avx2, q6_K_tile)
EL_TILE2_ENTRY(EL_AVX2, vec_dot_q6_K_avx2, q6_K_tile)

/* ---- Q3_K: hmask[32], qs[64] at 32, scales[12] at 96, d at 108 ----
 * Level = lo - 4 (1 - h) = (lo | h << 2) - 4: unsigned 0..7 for vpmaddubsw, minus 4 sum(sc bsums). */
EL_AVX2 static inline __m128i unpack_scales_q3_K(const uint8_t *p) {
    const uint32_t m4 = 0x0f0f0f0f, m2 = 0x03030303;
    uint32_t u[3];
    memcpy(u, p, 12);
    /* scale j: low nibble from byte j (j < 8) or high nibble of byte j-8; top 2 bits from byte
     * 8 + j%4 at bit 2(j/4) */
    const uint32_t s0 = (u[0] & m4) | ((u[2] & m2) << 4);
    const uint32_t s1 = (u[1] & m4) | (((u[2] >> 2) & m2) << 4);
    const uint32_t s2 = ((u[0] >> 4) & m4) | (((u[2] >> 4) & m2) << 4);
    const uint32_t s3 = ((u[1] >> 4) & m4) | (((u[2] >> 6) & m2) << 4);
    return _mm_sub_epi8(_mm_setr_epi32((int)s0, (int)s1, (int)s2, (int)s3), _mm_set1_epi8(32));
}

EL_AVX2 static float vec_dot_q3_K_avx2(size_t n, const void *w, const void *a) {
    const uint8_t *pw = w, *pa = a;
    const __m256i m2 = _mm256_set1_epi8(3), one = _mm256_set1_epi8(1);
    __m256 acc = _mm256_setzero_ps();
    for (size_t i = 0; i < n / QK_K; i++) {
        const uint8_t *x = pw + i * sizeof(block_q3_K), *y = pa + i * Q8K_BYTES;
        const __m256i sc16 = _mm256_cvtepi8_epi16(unpack_scales_q3_K(x + 96));
        __m256i sc[2];
        split_scales16(sc16, &sc[0], &sc[1]);
        const __m256i corr = _mm256_madd_epi16(sc16, loadu256(y + Q8K_BSUMS));
        __m256i hb = loadu256(x); /* bit 4c + g of byte l: chunk c, group g, value l */
        __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
        for (int c = 0; c < 2; c++) {
            const uint8_t *q8 = y + Q8K_QS + 128 * c;
            const __m256i qb = loadu256(x + 32 + 32 * c);
            __m256i p[4];
            for (int g = 0; g < 4; g++) {
                const __m256i lo = _mm256_and_si256(_mm256_srli_epi16(qb, 2 * g), m2);
                const __m256i h = _mm256_slli_epi16(_mm256_and_si256(hb, one), 2);
                hb = _mm256_srli_epi16(hb, 1);
                p[g] = _mm256_maddubs_epi16(_mm256_or_si256(lo, h), loadu256(q8 + 32 * g));
            }
            s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(scale_pair(sc[c], 0), p[0]));
            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(scale_pair(sc[c], 1), p[1]));
            s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(scale_pair(sc[c], 2), p[2]));
            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(scale_pair(sc[c], 3), p[3]));
        }
        const __m256i sumi = _mm256_sub_epi32(_mm256_add_epi32(s0, s1), _mm256_slli_epi32(corr, 2));
        acc = _mm256_fmadd_ps(_mm256_set1_ps(load_f32(y) * el_h2f(x + 108)), _mm256_cvtepi32_ps(sumi), acc);
    }
    return el_hsum_ps(acc);
}

/* ---- Q2_K: scales[16] (low nibble scale, high nibble min) at 0, qs[64] at 16, d at 80, dmin at 82 ---- */
EL_AVX2 static float vec_dot_q2_K_avx2(size_t n, const void *w, const void *a) {
    const uint8_t *pw = w, *pa = a;
    const __m256i m2 = _mm256_set1_epi8(3);
    const __m128i m4 = _mm_set1_epi8(0x0F);
    __m256 acc = _mm256_setzero_ps(), accm = _mm256_setzero_ps();
    for (size_t i = 0; i < n / QK_K; i++) {
        const uint8_t *x = pw + i * sizeof(block_q2_K), *y = pa + i * Q8K_BYTES;
        const float yd = load_f32(y);
        const __m128i raw = _mm_loadu_si128((const __m128i *)x);
        const __m256i mn16 = _mm256_cvtepu8_epi16(_mm_and_si128(_mm_srli_epi16(raw, 4), m4));
        const __m256i summ = _mm256_madd_epi16(mn16, loadu256(y + Q8K_BSUMS));
        accm = _mm256_fmadd_ps(_mm256_set1_ps(yd * el_h2f(x + 82)), _mm256_cvtepi32_ps(summ), accm);
        __m256i sc[2];
        split_scales16(_mm256_cvtepu8_epi16(_mm_and_si128(raw, m4)), &sc[0], &sc[1]);
        __m256i s0 = _mm256_setzero_si256(), s1 = _mm256_setzero_si256();
        for (int c = 0; c < 2; c++) {
            const uint8_t *q8 = y + Q8K_QS + 128 * c;
            const __m256i qb = loadu256(x + 16 + 32 * c);
            const __m256i p0 = _mm256_maddubs_epi16(_mm256_and_si256(qb, m2), loadu256(q8));
            const __m256i p1 = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(qb, 2), m2), loadu256(q8 + 32));
            const __m256i p2 = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(qb, 4), m2), loadu256(q8 + 64));
            const __m256i p3 = _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(qb, 6), m2), loadu256(q8 + 96));
            s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(scale_pair(sc[c], 0), p0));
            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(scale_pair(sc[c], 1), p1));
            s0 = _mm256_add_epi32(s0, _mm256_madd_epi16(scale_pair(sc[c], 2), p2));
            s1 = _mm256_add_epi32(s1, _mm256_madd_epi16(scale_pair(sc[c], 3), p3));
        }
        acc = _mm256_fmadd_ps(_mm256_set1_ps(yd * el_h2f(x + 80)), _mm256_cvtepi32_ps(_mm256_add_epi32(s0, s1)), acc);
    }
    return el_hsum_ps(acc) - el_hsum_ps(accm);
}

/* ---- Q8_K activations: the bytes of quants_k.c's q8_K_from_float ----
 * iscale = -127 / max (max = the first value of largest magnitude, with its sign),
 * q = nearest_int(iscale x) (round half to even, which vcvtps2dq does), d = 1 / iscale. */
EL_AVX2 static void quantize_q8_K_avx2(const float *src, void *dst, size_t n) {
    uint8_t *p = dst;
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    for (size_t i = 0; i < n / QK_K; i++) {
        const float *x = src + i * QK_K;
        uint8_t *b = p + i * Q8K_BYTES;
        /* a NaN |x| never wins `ax > amax`: vmaxps returns its second operand, the running max */
        __m256 m = _mm256_setzero_ps();
        for (int j = 0; j < QK_K; j += 8) m = _mm256_max_ps(_mm256_and_ps(_mm256_loadu_ps(x + j), absmask), m);
        const float amax = el_hmax_ps(m);
        if (amax == 0.0f) { /* all zero: the reference writes a zero block */
            memset(b, 0, Q8K_BYTES);
            continue;
        }
        /* the first index holding amax is the one the reference's strict `>` scan keeps */
        float max = 0.0f;
        const __m256 vmax = _mm256_set1_ps(amax);
        for (int j = 0; j < QK_K; j += 8) {
            const __m256 v = _mm256_loadu_ps(x + j);
            const int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_and_ps(v, absmask), vmax, _CMP_EQ_OQ));
            if (hit) {
                max = x[j + __builtin_ctz((unsigned)hit)];
                break;
            }
        }
        const float iscale = -127.f / max;
        if (isinf(iscale)) { /* |max| < 127 / FLT_MAX: the reference writes zero quants, d = 1/iscale */
            memset(b, 0, Q8K_BYTES);
            const float d0 = 1 / iscale;
            memcpy(b, &d0, 4);
            continue;
        }
        const __m256 vs = _mm256_set1_ps(iscale);
        const __m256i vmin = _mm256_set1_epi32(-128), vmax127 = _mm256_set1_epi32(127);
        int8_t *qs = (int8_t *)(b + Q8K_QS);
        for (int j = 0; j < QK_K; j += 32) {
            __m256i q[4];
            for (int k = 0; k < 4; k++) {
                const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + j + 8 * k), vs);
                /* NaN products: nearest_int gives 0 for the default NaN, vcvtps2dq INT_MIN */
                const __m256 vv = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));
                q[k] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(vv), vmin), vmax127);
            }
            const __m256i ab = _mm256_packs_epi32(q[0], q[1]), cd = _mm256_packs_epi32(q[2], q[3]);
            const __m256i all = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(ab, cd),
                                                            _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
            _mm256_storeu_si256((__m256i *)(qs + j), all);
            /* bsums of the two 16-value halves: vpsadbw on q ^ 0x80 sums 8 bytes as unsigned, so
             * each 8-byte sum is off by 8 * 128 */
            const __m256i sad = _mm256_sad_epu8(_mm256_xor_si256(all, _mm256_set1_epi8((char)0x80)), _mm256_setzero_si256());
            int64_t s[4];
            _mm256_storeu_si256((__m256i *)s, sad);
            const int16_t b0 = (int16_t)(s[0] + s[1] - 2048), b1 = (int16_t)(s[2] + s[3] - 2048);
            memcpy(b + Q8K_BSUMS + 2 * (j / 16), &b0, 2);
            memcpy(b + Q8K_BSUMS + 2 * (j / 16 + 1), &b1, 2);
        }
        const float d = 1 / iscale;
        memcpy(b, &d, 4);
    }
}

void el_kernels_fill_avx2_kquants(el_kernels *k) {
    k->vec_dot[EL_TYPE_Q2_K] = vec_dot_q2_K_avx2;
    k->vec_dot[EL_TYPE_Q3_K] = vec_dot_q3_K_avx2;
    k->vec_dot[EL_TYPE_Q4_K] = vec_dot_q4_K_avx2;
    k->vec_dot[EL_TYPE_Q5_K] = vec_dot_q5_K_avx2;
    k->vec_dot[EL_TYPE_Q6_K] = vec_dot_q6_K_avx2;
    k->vec_dot_nv[EL_TYPE_Q4_K] = vec_dot_q4_K_avx2_nv;
    k->vec_dot_nv[EL_TYPE_Q5_K] = vec_dot_q5_K_avx2_nv;
    k->vec_dot_nv[EL_TYPE_Q6_K] = vec_dot_q6_K_avx2_nv;
    k->vec_dot_rows[EL_TYPE_Q4_K] = vec_dot_q4_K_avx2_rows;
    k->vec_dot_rows[EL_TYPE_Q6_K] = vec_dot_q6_K_avx2_rows;
    k->vec_dot_tile[EL_TYPE_Q4_K] = vec_dot_q4_K_avx2_tile2;
    k->vec_dot_tile[EL_TYPE_Q6_K] = vec_dot_q6_K_avx2_tile2;
    /* no Q5_K rows entry: q5_K_tile with 4 rows ran faster from cache but 15-30% slower streaming a
     * 138 MB matrix from DRAM (bench/kernels.py, alternated with the one-row kernel) */
    k->quantize_act[EL_TYPE_Q8_K] = quantize_q8_K_avx2;
}
#endif

/* arch/avx512_common.h - small AVX-512 helpers shared by avx512.c (vec_dot and tiles) and
 * avx512_panel.c (batches over packed activations); x86-64 only, every function with the target
 * attribute (the library is built without -mavx512*). */
#ifndef EL_AVX512_COMMON_H
#define EL_AVX512_COMMON_H

#include "avx2_common.h"

#define EL_AVX512 __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

/* How far ahead of a weight row the kernels ask for its bytes. The hardware prefetcher alone left the
 * output head (a 178 MB Q8_0 matrix read two or more rows at a time, each row's stream separate) at
 * ~60% of the DRAM bandwidth; 2-8 KB ahead measured alike (4 KB: 11.3 -> 6.9 ms for four vectors). */
#define EL_PF_DIST 4096

EL_AVX512 static inline __m512i loadu512(const uint8_t *p) { return _mm512_loadu_si512((const void *)p); }

EL_AVX512 static inline __m512i join256(__m256i lo, __m256i hi) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
}

/* the 32 bytes at q0 and the 32 at q1 in one zmm */
EL_AVX512 static inline __m512i bytes32_x2(const uint8_t *q0, const uint8_t *q1) {
    return join256(_mm256_loadu_si256((const __m256i *)q0), _mm256_loadu_si256((const __m256i *)q1));
}

/* -K * (sum of each 4 signed bytes of v), K a u8 constant */
EL_AVX512 static inline __m512i neg_scaled_sum4(__m512i v, char k) {
    return _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(k), v));
}

/* the 16 nibbles at q of two blocks in value order (low nibbles 0-15, high 16-31), as u8 */
EL_AVX512 static inline __m512i nibbles_x2(const uint8_t *q0, const uint8_t *q1) {
    const __m256i b0 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)q0));
    const __m256i b1 = _mm256_broadcastsi128_si256(_mm_loadu_si128((const __m128i *)q1));
    /* 128-bit lanes qs0 qs0 qs1 qs1 -> low nibbles, high nibbles of each */
    return _mm512_and_si512(_mm512_srlv_epi64(join256(b0, b1), _mm512_setr_epi64(0, 0, 4, 4, 0, 0, 4, 4)),
                            _mm512_set1_epi8(0x0F));
}

/* + 16 where the qh bit (32 per block, at h0 / h1) is set */
EL_AVX512 static inline __m512i add_high_x2(__m512i nib, const uint8_t *h0, const uint8_t *h1) {
    uint32_t b0, b1;
    memcpy(&b0, h0, 4);
    memcpy(&b1, h1, 4);
    return _mm512_mask_add_epi8(nib, _cvtu64_mask64((uint64_t)b0 | (uint64_t)b1 << 32), nib, _mm512_set1_epi8(16));
}

/* Q5_0's unsigned values u = nibble + 16 h (0..31) of the blocks at x0 and x1 */
EL_AVX512 static inline __m512i q5_0_u_x2(const uint8_t *x0, const uint8_t *x1) {
    return add_high_x2(nibbles_x2(x0 + 6, x1 + 6), x0 + 2, x1 + 2);
}

/* one fp16 at p and q -> [p, q, 0, 0] (halves_dm2, in avx2_common.h, takes two of each) */
EL_AVX512 static inline __m128 halves1(const uint8_t *p, const uint8_t *q) {
    return _mm_cvtph_ps(_mm_cvtsi32_si128((int)(ld16(p) | ld16(q) << 16)));
}

/* ---- K-quants x Q8_K, one superblock (256 values) per step: Q4_K and Q6_K ----
 * Q4_K takes the activations reordered (el_q8k_act_prep; the AVX-512 panel stores them once per
 * batch): a[j] holds values 64k + 16j .. 64k + 16j + 15 in 128-bit lane k (a 4x4 transpose of 128-bit
 * lanes); Q6_K takes them in their own order (nat). Each weight type unpacks its values into its
 * order, so vpdpbusd (u8 weights x s8 activations) gives int32 lanes that each sum 4 products of one
 * sub-block. Those fit in int16 (bounds below): vpackssdw makes them int16 exactly and vpmaddwd /
 * vpdpwssd apply the sub-block scales. Per output and superblock then one conversion, the product
 * d dy and an FMA. Every path (vec_dot, tile, rows, panel) runs a type's step per output in this
 * order, so all give vec_dot's bits. */
typedef struct {
    __m512i a[4];  /* the values, reordered as above */
    __m512 bs;     /* dy (bsums[2s] + bsums[2s+1]) in lane s < 8, 0 above: Q4_K's mins term */
    __m256i bsums; /* the 16 int16 sums of 16 values: Q6_K's offset term */
    float d;       /* dy */
    const uint8_t *nat; /* the 256 values in their own order (Q6_K's) */
} el_q8k_act;

/* a Q8_K block (Q8K_BYTES at y) in that order */
EL_AVX512 static inline void el_q8k_act_prep(const uint8_t *y, el_q8k_act *p) {
    const __m512i n0 = loadu512(y + Q8K_QS), n1 = loadu512(y + Q8K_QS + 64);
    const __m512i n2 = loadu512(y + Q8K_QS + 128), n3 = loadu512(y + Q8K_QS + 192);
    const __m512i t0 = _mm512_shuffle_i64x2(n0, n1, _MM_SHUFFLE(2, 0, 2, 0));
    const __m512i t1 = _mm512_shuffle_i64x2(n0, n1, _MM_SHUFFLE(3, 1, 3, 1));
    const __m512i t2 = _mm512_shuffle_i64x2(n2, n3, _MM_SHUFFLE(2, 0, 2, 0));
    const __m512i t3 = _mm512_shuffle_i64x2(n2, n3, _MM_SHUFFLE(3, 1, 3, 1));
    p->a[0] = _mm512_shuffle_i64x2(t0, t2, _MM_SHUFFLE(2, 0, 2, 0));
    p->a[1] = _mm512_shuffle_i64x2(t1, t3, _MM_SHUFFLE(2, 0, 2, 0));
    p->a[2] = _mm512_shuffle_i64x2(t0, t2, _MM_SHUFFLE(3, 1, 3, 1));
    p->a[3] = _mm512_shuffle_i64x2(t1, t3, _MM_SHUFFLE(3, 1, 3, 1));
    p->d = load_f32(y);
    const __m256 b = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(bsums_pairs(y)));
    p->bs = _mm512_zextps256_ps512(_mm256_mul_ps(_mm256_set1_ps(p->d), b));
    p->bsums = loadu256(y + Q8K_BSUMS);
    p->nat = y + Q8K_QS;
}

/* Q4_K: d, dmin, 12 bytes of 6-bit scales and mins, qs[128]; 8 sub-blocks of 32, x = d sc u - dmin m.
 * qs bytes 32k..32k+31 hold values 64k..64k+31 (low nibbles) and 64k+32..64k+63 (high): so
 * w[j] (j < 2) takes qs[32k + 16j .. +15] into lane k (one vshufi64x2 from two loads) and its low
 * nibbles, w[j + 2] the high ones: in lane k, w[0], w[1] are sub-block 2k, w[2], w[3] 2k + 1. lo
 * (hi) sums two vpdpbusd: |.| <= 8 * 15 * 128 < 2^15. The mins term, -dmin m[s] against
 * dy (bsums[2s] + bsums[2s+1]) as 8 floats, is one FMA into the same accumulator (lanes 8-15 add 0 x 0). */
typedef struct {
    __m512i w[4];
    __m512i sc;  /* int16 scales: sc[2k] in lanes 8k..8k+3, sc[2k+1] in 8k+4..8k+7 */
    __m512 d;    /* d in every lane */
    __m512 nfm;  /* -dmin m[s] in lane s < 8, 0 above */
} el_q4k_w;

/* int16 scales 0..7, then mins 0..7, of the 12 packed bytes at p (unpack_scales_mins_k4's, in
 * vector registers: scales and mins 0..3 are the low 6 bits of bytes 0..7; 4..7 take the low (high)
 * nibble of bytes 8..11 and the top 2 bits of bytes 0..3 (4..7)). Reads 16 bytes: the block has them. */
EL_AVX512 static inline __m256i el_q4k_scales_mins(const uint8_t *p) {
    const __m128i x = _mm_loadu_si128((const __m128i *)p);
    /* [b0-3, b8-11, b4-7, b8-11] and [0, b0-3, 0, b4-7] */
    const __m128i a = _mm_shuffle_epi8(x, _mm_setr_epi8(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 8, 9, 10, 11));
    const __m128i h = _mm_shuffle_epi8(x, _mm_setr_epi8(-1, -1, -1, -1, 0, 1, 2, 3, -1, -1, -1, -1, 4, 5, 6, 7));
    const __m128i lo = _mm_and_si128(_mm_srlv_epi32(a, _mm_setr_epi32(0, 0, 0, 4)),
                                     _mm_setr_epi32(0x3f3f3f3f, 0x0f0f0f0f, 0x3f3f3f3f, 0x0f0f0f0f));
    /* bits 6-7 of b0-7 to bits 4-5 (a 16-bit shift: what the next byte shifts in is masked off) */
    const __m128i hi = _mm_and_si128(_mm_srli_epi16(h, 2), _mm_set1_epi8(0x30));
    return _mm256_cvtepu8_epi16(_mm_or_si128(lo, hi));
}

EL_AVX512 static inline void el_q4k_w_prep(const uint8_t *x, el_q4k_w *p) {
    static const int16_t sc_idx[32] = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3,
                                       4, 4, 4, 4, 5, 5, 5, 5, 6, 6, 6, 6, 7, 7, 7, 7};
    const __m512i m4 = _mm512_set1_epi8(0x0F);
    const __m512i l0 = loadu512(x + 16), l1 = loadu512(x + 80);
    const __m512i c0 = _mm512_shuffle_i64x2(l0, l1, _MM_SHUFFLE(2, 0, 2, 0));
    const __m512i c1 = _mm512_shuffle_i64x2(l0, l1, _MM_SHUFFLE(3, 1, 3, 1));
    p->w[0] = _mm512_and_si512(c0, m4);
    p->w[1] = _mm512_and_si512(c1, m4);
    p->w[2] = _mm512_and_si512(_mm512_srli_epi16(c0, 4), m4);
    p->w[3] = _mm512_and_si512(_mm512_srli_epi16(c1, 4), m4);
    const __m256i scmn = el_q4k_scales_mins(x + 4);
    p->sc = _mm512_permutexvar_epi16(_mm512_loadu_si512((const void *)sc_idx), _mm512_castsi256_si512(scmn));
    p->d = _mm512_set1_ps(el_h2f(x));
    const __m256 mins = _mm256_cvtepi32_ps(_mm256_cvtepi16_epi32(_mm256_extracti128_si256(scmn, 1)));
    p->nfm = _mm512_zextps256_ps512(_mm256_mul_ps(_mm256_set1_ps(-el_h2f(x + 2)), mins));
}

EL_AVX512 static inline __m512 el_q4k_step(__m512 acc, const el_q4k_w *w, const el_q8k_act *y, __m512 yd) {
    const __m512i z = _mm512_setzero_si512();
    const __m512i lo = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, w->w[0], y->a[0]), w->w[1], y->a[1]);
    const __m512i hi = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(z, w->w[2], y->a[2]), w->w[3], y->a[3]);
    const __m512i s = _mm512_madd_epi16(_mm512_packs_epi32(lo, hi), w->sc);
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(w->d, yd), acc);
    return _mm512_fmadd_ps(w->nfm, y->bs, acc);
}

/* Q6_K: ql[128], qh[64], int8 scales[16], d; 16 sub-blocks of 16, x = d sc (u - 32), u 6-bit. In
 * half c (values 128c..128c+127) value 128c + 32q + l (q < 4, l < 32) has its low 4 bits in ql[64c
 * + l] (q = 0), ql[64c + 32 + l] (q = 1) or their high nibbles (q = 2, 3), its top 2 bits at bit 2q
 * of qh[32c + l]. w[m] holds values 64m..64m+63 in their order (the activations' own, nat), so lane
 * k of w[m] is sub-block 4m + k. Each vpdpbusd alone: |.| <= 4 * 63 * 128 < 2^15. The -32 offset:
 * -32 sc[s] against the activation's bsums[s], one vpdpwssd into the same int32 lanes (lanes 8-15
 * add 0 x 0). */
typedef struct {
    __m512i w[4];
    __m512i sc01, sc23; /* int16 scales: sc[k + 4 (e / 4)] (sc01) and sc[8 + k + 4 (e / 4)] (sc23) in lane 8k + e */
    __m512i nsc;        /* -32 sc[s] in int16 lane s < 16, 0 above */
    __m512 d;
} el_q6k_w;

EL_AVX512 static inline void el_q6k_w_prep(const uint8_t *x, el_q6k_w *p) {
    static const int16_t idx01[32] = {0, 0, 0, 0, 4, 4, 4, 4, 1, 1, 1, 1, 5, 5, 5, 5,
                                      2, 2, 2, 2, 6, 6, 6, 6, 3, 3, 3, 3, 7, 7, 7, 7};
    static const int16_t idx23[32] = {8, 8, 8, 8, 12, 12, 12, 12, 9, 9, 9, 9, 13, 13, 13, 13,
                                      10, 10, 10, 10, 14, 14, 14, 14, 11, 11, 11, 11, 15, 15, 15, 15};
    const __m512i m4 = _mm512_set1_epi8(0x0F), m30 = _mm512_set1_epi8(0x30);
    for (int c = 0; c < 2; c++) {
        const __m512i ql = loadu512(x + 64 * c);
        const __m256i qh = loadu256(x + 128 + 32 * c);
        /* bits 0-1 (values 0-31 of the half), 2-3 (32-63) in the low / high 256 bits; then 4-5, 6-7 at 4-5 */
        const __m512i hq = join256(qh, _mm256_srli_epi16(qh, 2));
        /* (low 4 bits from the nibble) | (2 bits at 4-5): ternary select by 0x0F */
        p->w[2 * c] = _mm512_ternarylogic_epi32(ql, _mm512_and_si512(_mm512_slli_epi16(hq, 4), m30), m4, 0xE4);
        p->w[2 * c + 1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(ql, 4), _mm512_and_si512(hq, m30), m4, 0xE4);
    }
    const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)(x + 192)));
    const __m512i scz = _mm512_castsi256_si512(sc);
    p->sc01 = _mm512_permutexvar_epi16(_mm512_loadu_si512((const void *)idx01), scz);
    p->sc23 = _mm512_permutexvar_epi16(_mm512_loadu_si512((const void *)idx23), scz);
    p->nsc = _mm512_zextsi256_si512(_mm256_sub_epi16(_mm256_setzero_si256(), _mm256_slli_epi16(sc, 5)));
    p->d = _mm512_set1_ps(el_h2f(x + 208));
}

EL_AVX512 static inline __m512 el_q6k_step(__m512 acc, const el_q6k_w *w, const el_q8k_act *y, __m512 yd) {
    const __m512i z = _mm512_setzero_si512();
    const uint8_t *a = y->nat;
    const __m512i d0 = _mm512_dpbusd_epi32(z, w->w[0], loadu512(a)), d1 = _mm512_dpbusd_epi32(z, w->w[1], loadu512(a + 64));
    const __m512i d2 = _mm512_dpbusd_epi32(z, w->w[2], loadu512(a + 128)), d3 = _mm512_dpbusd_epi32(z, w->w[3], loadu512(a + 192));
    __m512i s = _mm512_madd_epi16(_mm512_packs_epi32(d0, d1), w->sc01);
    s = _mm512_dpwssd_epi32(s, _mm512_packs_epi32(d2, d3), w->sc23);
    s = _mm512_dpwssd_epi32(s, _mm512_zextsi256_si512(y->bsums), w->nsc);
    return _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(w->d, yd), acc);
}

#endif

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

#endif

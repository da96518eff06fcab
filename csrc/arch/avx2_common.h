/* arch/avx2_common.h - small helpers shared by avx2.c and avx2_kquants.c (x86-64 only).
 * Every function carries the target attribute: the library itself is built without -mavx2. */
#ifndef EL_AVX2_COMMON_H
#define EL_AVX2_COMMON_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#include "../dispatch.h"

#define EL_AVX2 __attribute__((target("avx2,fma,f16c")))

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

/* defined in avx2_kquants.c */
void el_kernels_fill_avx2_kquants(el_kernels *k);

#endif

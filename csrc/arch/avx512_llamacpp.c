/* arch/avx512_llamacpp.c - the llama.cpp-order batch dot (llamacpp_exact.c) with AVX-512 VNNI.
 * One zmm carries two activation rows (their 8 lanes each) against the same weight block: vpdpbusd
 * gives the same exact int32 lane sums as maddubs + madd, and each half gets the same FMA per block
 * and the same final sum as llx_q8_0 in arch/avx2_llamacpp.c, so every output keeps the scalar
 * reference's bits. x86-64 only; installed on top of the AVX2 entries for the avx512 table. */
#if defined(__x86_64__)
#include <immintrin.h>

#include "../dispatch.h"
#include "../llamacpp_exact.h"
#include "avx2_common.h"

#define EL_AVX512_LLX __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512dq,avx512vnni")))

EL_AVX512_LLX static void llx_q8_0_nv_vnni(size_t n, const void *w, const void *a, size_t a_stride, size_t nv,
                                           float *out) {
    const block_q8_0 *x = w;
    __m512 acc[(LLX_NV + 1) / 2];
    const size_t np = (nv + 1) / 2; /* row pairs; an odd last row pairs with itself */
    for (size_t p = 0; p < np; p++) acc[p] = _mm512_setzero_ps();
    for (size_t i = 0; i < n / QK8_0; i++) {
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);
        const __m512i qx2 = _mm512_inserti64x4(_mm512_castsi256_si512(qx), qx, 1);
        const __m512i ax = _mm512_abs_epi8(qx2);
        const __mmask64 neg = _mm512_movepi8_mask(qx2); /* the weight's sign goes to the activation */
        const float dx = _cvtsh_ss(x[i].d);
        for (size_t p = 0; p < np; p++) {
            const size_t j0 = 2 * p, j1 = j0 + 1 < nv ? j0 + 1 : j0;
            const block_q8_0 *y0 = (const block_q8_0 *)((const char *)a + j0 * a_stride) + i;
            const block_q8_0 *y1 = (const block_q8_0 *)((const char *)a + j1 * a_stride) + i;
            const __m512i ay = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)y0->qs)),
                                                  _mm256_loadu_si256((const __m256i *)y1->qs), 1);
            const __m512i sy = _mm512_mask_sub_epi8(ay, neg, _mm512_setzero_si512(), ay);
            const __m512i s32 = _mm512_dpbusd_epi32(_mm512_setzero_si512(), ax, sy);
            const __m512 d = _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_set1_ps(dx * _cvtsh_ss(y0->d))),
                                                _mm256_set1_ps(dx * _cvtsh_ss(y1->d)), 1);
            acc[p] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s32), acc[p]);
        }
    }
    for (size_t j = 0; j < nv; j++) {
        const __m512 v = acc[j / 2];
        out[j] = el_hsum_ps(j % 2 ? _mm512_extractf32x8_ps(v, 1) : _mm512_castps512_ps256(v));
    }
}

void el_llx_fill_avx512(el_llx_kernels *k) { k->q8_0_nv = llx_q8_0_nv_vnni; }
#endif

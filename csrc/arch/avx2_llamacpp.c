/* arch/avx2_llamacpp.c - the llama.cpp-order dot products (llamacpp_exact.c) in AVX2 + FMA.
 * The same operations as the scalar references there, in the same order: exact integer lane sums
 * of 4 bytes, one FMA per block and lane, the 8 lanes summed high-into-low then pairwise. So every
 * result has the scalar's bits (tests/test_llamacpp_numerics.py holds them to it). x86-64 only. */
#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "../dispatch.h"
#include "../llamacpp_exact.h"
#include "avx2_common.h"

/* fp16 -> fp32 in hardware (F16C): exact, like the portable conversion */
EL_AVX2 static inline float h2f(el_half h) { return _cvtsh_ss(h); }

/* 8 lanes of sum(x[4l..4l+3] * y[4l..4l+3]) for signed x (|x| <= 128) and y (|y| <= 127) */
EL_AVX2 static inline __m256 lanes_i8(__m256i x, __m256i y) {
    const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

/* the same for unsigned x (0..15) */
EL_AVX2 static inline __m256 lanes_u8(__m256i x, __m256i y) {
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(_mm256_maddubs_epi16(x, y), _mm256_set1_epi16(1)));
}

/* 32 nibbles of 16 bytes: low nibbles (values 0..15) then high nibbles (values 16..31) */
EL_AVX2 static inline __m256i nibbles32(const uint8_t *qs) {
    const __m128i t = _mm_loadu_si128((const __m128i *)qs);
    return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(t, 4), t), _mm256_set1_epi8(0x0F));
}

/* bit j of a 32-bit word -> byte j = 0xFF or 0x00 */
EL_AVX2 static inline __m256i bits32(const uint8_t *b) {
    uint32_t w;
    memcpy(&w, b, 4);
    const __m256i shuf = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0);
    const __m256i bytes = _mm256_shuffle_epi8(_mm256_set1_epi32((int)w), shuf);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL);
    return _mm256_cmpeq_epi8(_mm256_and_si256(bytes, bit), bit);
}

EL_AVX2 static float llx_q8_0(size_t n, const void *w, const void *a) {
    const block_q8_0 *x = w, *y = a;
    __m256 acc = _mm256_setzero_ps();
    for (size_t i = 0; i < n / QK8_0; i++) {
        const __m256 d = _mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d));
        const __m256 q = lanes_i8(_mm256_loadu_si256((const __m256i *)x[i].qs), _mm256_loadu_si256((const __m256i *)y[i].qs));
        acc = _mm256_fmadd_ps(d, q, acc);
    }
    return el_hsum_ps(acc);
}

EL_AVX2 static float llx_q5_0(size_t n, const void *w, const void *a) {
    const block_q5_0 *x = w;
    const block_q8_0 *y = a;
    __m256 acc = _mm256_setzero_ps();
    for (size_t i = 0; i < n / QK5_0; i++) {
        const __m256 d = _mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d));
        /* value = nibble | 16 h - 16: OR in 0xF0 (that is, -16) where the fifth bit is clear */
        const __m256i hi = _mm256_andnot_si256(bits32(x[i].qh), _mm256_set1_epi8((char)0xF0));
        const __m256i qx = _mm256_or_si256(nibbles32(x[i].qs), hi);
        acc = _mm256_fmadd_ps(d, lanes_i8(qx, _mm256_loadu_si256((const __m256i *)y[i].qs)), acc);
    }
    return el_hsum_ps(acc);
}

EL_AVX2 static float llx_q4_1(size_t n, const void *w, const void *a) {
    const block_q4_1 *x = w;
    const block_q8_1 *y = a;
    __m256 acc = _mm256_setzero_ps();
    float summs = 0.0f;
    for (size_t i = 0; i < n / QK4_1; i++) {
        summs = fmaf(h2f(x[i].m), h2f(y[i].s), summs);
        const __m256 d = _mm256_set1_ps(h2f(x[i].d) * h2f(y[i].d));
        acc = _mm256_fmadd_ps(d, lanes_u8(nibbles32(x[i].qs), _mm256_loadu_si256((const __m256i *)y[i].qs)), acc);
    }
    return el_hsum_ps(acc) + summs;
}

/* Q6_K: levels 0..63 per 32 values in 8 lanes, each 16-value half weighted by its scale, the -32
 * offset removed per lane as 32 (bsums[2l] sc[2l] + bsums[2l+1] sc[2l+1]) */
EL_AVX2 static float llx_q6_K(size_t n, const void *w, const void *a) {
    const block_q6_K *x = w;
    const block_q8_K *y = a;
    const __m256i m4 = _mm256_set1_epi8(0x0F), m2 = _mm256_set1_epi8(3);
    __m256 acc = _mm256_setzero_ps();
    for (size_t i = 0; i < n / QK_K; i++) {
        __m256i sumi = _mm256_setzero_si256();
        for (int c = 0; c < QK_K / 128; c++) {
            const uint8_t *ql = x[i].ql + 64 * c, *qh = x[i].qh + 32 * c;
            const int8_t *q8 = y[i].qs + 128 * c;
            const __m256i l0 = _mm256_loadu_si256((const __m256i *)ql), l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            const __m256i h = _mm256_loadu_si256((const __m256i *)qh);
            __m256i q[4];
            q[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m2), 4));
            q[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m2), 4));
            q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m2), 4));
            q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4),
                                   _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m2), 4));
            for (int j = 0; j < 4; j++) {
                const int s = 8 * c + 2 * j; /* scales of the two 16-value halves */
                const __m256i p16 = _mm256_maddubs_epi16(q[j], _mm256_loadu_si256((const __m256i *)(q8 + 32 * j)));
                const __m256i sc = _mm256_set_m128i(_mm_set1_epi16(x[i].scales[s + 1]), _mm_set1_epi16(x[i].scales[s]));
                sumi = _mm256_add_epi32(sumi, _mm256_madd_epi16(p16, sc));
            }
        }
        const __m256i bsums = _mm256_loadu_si256((const __m256i *)y[i].bsums);
        const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)x[i].scales));
        sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(_mm256_madd_epi16(bsums, sc16), 5));
        const float d = y[i].d * h2f(x[i].d);
        acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
    return el_hsum_ps(acc);
}

/* KQ score in a form LLX_KQ_*: TINY16 = tinyBLAS's 16 lanes (lanes 0-7 in a0, 8-15 in a1), TINY8 its
 * 8, DOT64 = vec_dot_f16's 4 x 16 (element d in register (d % 64) / 8), DOT32 its 4 x 8; each reduced
 * as llamacpp_exact.c's hsum16 / hsum8 / reduce_dot_f16 / reduce_dot_f16_32 */
EL_AVX2 static float llx_kq(size_t hd, const float *q, const el_half *k, int form) {
    if (form == LLX_KQ_TINY16) {
        __m256 a0 = _mm256_setzero_ps(), a1 = _mm256_setzero_ps();
        for (size_t d = 0; d < hd; d += 16) {
            a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + d))), _mm256_loadu_ps(q + d), a0);
            a1 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + d + 8))), _mm256_loadu_ps(q + d + 8), a1);
        }
        return el_hsum_ps(_mm256_add_ps(a1, a0));
    }
    if (form == LLX_KQ_TINY8) {
        __m256 a0 = _mm256_setzero_ps();
        for (size_t d = 0; d < hd; d += 8)
            a0 = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + d))), _mm256_loadu_ps(q + d), a0);
        return el_hsum_ps(a0);
    }
    const int nreg = form == LLX_KQ_DOT64 ? 8 : 4;
    const size_t step = 8 * (size_t)nreg, np = hd - hd % step;
    __m256 r[8];
    for (int i = 0; i < 8; i++) r[i] = _mm256_setzero_ps();
    for (size_t d = 0; d < np; d += step)
        for (int i = 0; i < nreg; i++)
            r[i] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(k + d + 8 * i))),
                                   _mm256_loadu_ps(q + d + 8 * i), r[i]);
    double sum;
    if (form == LLX_KQ_DOT64) {
        /* lanes 0-15 of (acc0 + acc2) + (acc1 + acc3), acc j = registers 2j, 2j+1 */
        const __m256 x0 = _mm256_add_ps(_mm256_add_ps(r[0], r[4]), _mm256_add_ps(r[2], r[6]));
        const __m256 x1 = _mm256_add_ps(_mm256_add_ps(r[1], r[5]), _mm256_add_ps(r[3], r[7]));
        sum = (double)el_hsum_ps(_mm256_add_ps(x1, x0));
    } else {
        /* GGML_F32x8_REDUCE: (acc0 + acc2) + (acc1 + acc3), low + high half, two hadds */
        const __m256 x = _mm256_add_ps(_mm256_add_ps(r[0], r[2]), _mm256_add_ps(r[1], r[3]));
        const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
        const __m128 t1 = _mm_hadd_ps(t0, t0);
        sum = (double)_mm_cvtss_f32(_mm_hadd_ps(t1, t1));
    }
    for (size_t d = np; d < hd; d++) sum += (double)(h2f(k[d]) * q[d]);
    return (float)sum;
}

EL_AVX2 static void llx_pv(size_t hd, float p, const el_half *v, float *lane) {
    const __m256 pv = _mm256_set1_ps(p);
    size_t d = 0;
    for (; d + 8 <= hd; d += 8)
        _mm256_storeu_ps(lane + d, _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(v + d))), pv,
                                                   _mm256_loadu_ps(lane + d)));
    for (; d < hd; d++) lane[d] = fmaf(h2f(v[d]), p, lane[d]);
}

/* nv activation rows (nv <= LLX_NV) against one row of Q8_0 blocks: the weight bytes, their absolute
 * values and scale loaded once per block; each output's lanes, FMAs and sum exactly llx_q8_0's */
EL_AVX2 static void llx_q8_0_nv(size_t n, const void *w, const void *a, size_t a_stride, size_t nv, float *out) {
    const block_q8_0 *x = w;
    __m256 acc[LLX_NV];
    for (size_t j = 0; j < nv; j++) acc[j] = _mm256_setzero_ps();
    for (size_t i = 0; i < n / QK8_0; i++) {
        const __m256i qx = _mm256_loadu_si256((const __m256i *)x[i].qs);
        const __m256i ax = _mm256_sign_epi8(qx, qx);
        const float dx = h2f(x[i].d);
        for (size_t j = 0; j < nv; j++) {
            const block_q8_0 *y = (const block_q8_0 *)((const char *)a + j * a_stride) + i;
            const __m256i p16 = _mm256_maddubs_epi16(ax, _mm256_sign_epi8(_mm256_loadu_si256((const __m256i *)y->qs), qx));
            const __m256 q = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
            acc[j] = _mm256_fmadd_ps(_mm256_set1_ps(dx * h2f(y->d)), q, acc[j]);
        }
    }
    for (size_t j = 0; j < nv; j++) out[j] = el_hsum_ps(acc[j]);
}

/* out[s] = integer dot of the s-th len-value run (16 or 32) of 256 levels, |q| <= 32 */
EL_AVX2 static void llx_isums(const int8_t *q, const int8_t *a, int len, int32_t *out) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256i p[8];
    for (int i = 0; i < 8; i++) {
        const __m256i qv = _mm256_loadu_si256((const __m256i *)(q + 32 * i));
        const __m256i av = _mm256_loadu_si256((const __m256i *)(a + 32 * i));
        p[i] = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_sign_epi8(qv, qv), _mm256_sign_epi8(av, qv)), ones);
    }
    /* two hadd levels: per 128-bit half, the 4-lane sums of p0..p3 (and of p4..p7) */
    const __m256i h0 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[0], p[1]), _mm256_hadd_epi32(p[2], p[3]));
    const __m256i h1 = _mm256_hadd_epi32(_mm256_hadd_epi32(p[4], p[5]), _mm256_hadd_epi32(p[6], p[7]));
    if (len == 32) { /* a run is a whole register: add its two halves */
        const __m256i lo = _mm256_permute2x128_si256(h0, h1, 0x20), hi = _mm256_permute2x128_si256(h0, h1, 0x31);
        _mm256_storeu_si256((__m256i *)out, _mm256_add_epi32(lo, hi));
        return;
    }
    /* len 16: run 2i is the low half of p[i], run 2i + 1 the high half */
    int32_t t0[8], t1[8];
    _mm256_storeu_si256((__m256i *)t0, h0);
    _mm256_storeu_si256((__m256i *)t1, h1);
    for (int i = 0; i < 4; i++) {
        out[2 * i] = t0[i];
        out[2 * i + 1] = t0[4 + i];
        out[8 + 2 * i] = t1[i];
        out[8 + 2 * i + 1] = t1[4 + i];
    }
}

void el_llx_fill_avx2(el_llx_kernels *k) {
    k->q8_0_nv = llx_q8_0_nv;
    k->isums = llx_isums;
    k->kq = llx_kq;
    k->pv = llx_pv;
    k->vec_dot[EL_TYPE_Q8_0] = llx_q8_0;
    k->vec_dot[EL_TYPE_Q5_0] = llx_q5_0;
    k->vec_dot[EL_TYPE_Q4_1] = llx_q4_1;
    k->vec_dot[EL_TYPE_Q6_K] = llx_q6_K;
}
#endif

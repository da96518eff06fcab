/* arch/neon.c - NEON kernels for aarch64; the dotprod variant (vdotq_s32) is this same source compiled
 * again by neon_dotprod.c with a target pragma, installed only when HWCAP_ASIMDDP is set (Cortex-A76 /
 * Pi 5, not A72 / Pi 4). Must not change any result the scalar reference defines exactly: see below. */

/* Exactness: every block dot product forms the same exact integer sums as quants.c / quants_k.c and
 * then the same float expression in the same block order, so with contraction off (as in the
 * reference files) its result is bit-identical to the scalar one. The quantizers are bit-identical
 * too. Only the float kernels reassociate (4-lane partial sums, fused multiply-add): dot_f32, dot_f32_f16,
 * the axpys and the vec_dots of F32 / F16 / BF16 weights. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "../dispatch.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#include <float.h>
#include <math.h>
#include <stddef.h>
#include <string.h>

#include "neon_common.h"
#include "tile_entries.h"

/* ---------------- 32-value blocks: Q4_0 / Q5_0 / Q8_0 x Q8_0, Q4_1 / Q5_1 x Q8_1 ---------------- */

static float EL_FN(q8_0_vec_dot)(size_t n, const void *w, const void *a) {
    const uint8_t *pw = w, *pa = a;
    float sumf = 0.0f;
    for (size_t i = 0; i < n / QK8_0; i++, pw += sizeof(block_q8_0), pa += sizeof(block_q8_0)) {
        const int32_t sumi = dot32(ld_s8(pw + 2), ld_s8(pw + 18), pa + 2);
        sumf += (float)sumi * (ld_f16(pw) * ld_f16(pa));
    }
    return sumf;
}

static float EL_FN(q4_0_vec_dot)(size_t n, const void *w, const void *a) {
    const uint8_t *pw = w, *pa = a;
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    const int8x16_t eight = vdupq_n_s8(8);
    float sumf = 0.0f;
    for (size_t i = 0; i < n / QK4_0; i++, pw += sizeof(block_q4_0), pa += sizeof(block_q8_0)) {
        const uint8x16_t qs = vld1q_u8(pw + 2); /* low nibbles: values 0..15, high: 16..31 */
        const int8x16_t w0 = vsubq_s8(as_s8(vandq_u8(qs, m4)), eight);
        const int8x16_t w1 = vsubq_s8(as_s8(vshrq_n_u8(qs, 4)), eight);
        const int32_t sumi = dot32(w0, w1, pa + 2);
        sumf += (float)sumi * (ld_f16(pw) * ld_f16(pa));
    }
    return sumf;
}

static float EL_FN(q5_0_vec_dot)(size_t n, const void *w, const void *a) {
    const uint8_t *pw = w, *pa = a;
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    const int8x16_t sixteen = vdupq_n_s8(16);
    float sumf = 0.0f;
    for (size_t i = 0; i < n / QK5_0; i++, pw += sizeof(block_q5_0), pa += sizeof(block_q8_0)) {
        uint32_t qh;
        memcpy(&qh, pw + 2, 4);
        const uint8x16_t qs = vld1q_u8(pw + 6);
        const int8x16_t w0 = vsubq_s8(as_s8(vorrq_u8(vandq_u8(qs, m4), q5_high_bits(qh, 0))), sixteen);
        const int8x16_t w1 = vsubq_s8(as_s8(vorrq_u8(vshrq_n_u8(qs, 4), q5_high_bits(qh, 1))), sixteen);
        const int32_t sumi = dot32(w0, w1, pa + 2);
        sumf += (float)sumi * (ld_f16(pw) * ld_f16(pa));
    }
    return sumf;
}

static float EL_FN(q4_1_vec_dot)(size_t n, const void *w, const void *a) {
    const uint8_t *pw = w, *pa = a;
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    float sumf = 0.0f;
    for (size_t i = 0; i < n / QK4_1; i++, pw += sizeof(block_q4_1), pa += sizeof(block_q8_1)) {
        const uint8x16_t qs = vld1q_u8(pw + 4);
        const int32_t sumi = dot32(as_s8(vandq_u8(qs, m4)), as_s8(vshrq_n_u8(qs, 4)), pa + 4);
        sumf += (ld_f16(pw) * ld_f16(pa)) * (float)sumi + ld_f16(pw + 2) * ld_f16(pa + 2);
    }
    return sumf;
}

static float EL_FN(q5_1_vec_dot)(size_t n, const void *w, const void *a) {
    const uint8_t *pw = w, *pa = a;
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    float sumf = 0.0f;
    for (size_t i = 0; i < n / QK5_1; i++, pw += sizeof(block_q5_1), pa += sizeof(block_q8_1)) {
        uint32_t qh;
        memcpy(&qh, pw + 4, 4);
        const uint8x16_t qs = vld1q_u8(pw + 8);
        const int8x16_t w0 = as_s8(vorrq_u8(vandq_u8(qs, m4), q5_high_bits(qh, 0)));
        const int8x16_t w1 = as_s8(vorrq_u8(vshrq_n_u8(qs, 4), q5_high_bits(qh, 1)));
        const int32_t sumi = dot32(w0, w1, pa + 4);
        sumf += (ld_f16(pw) * ld_f16(pa)) * (float)sumi + ld_f16(pw + 2) * ld_f16(pa + 2);
    }
    return sumf;
}

/* ---------------- K-quants x Q8_K ---------------- */

static float EL_FN(q4_K_vec_dot)(size_t n, const void *w, const void *a) {
    const uint8_t *pw = w, *pa = a;
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    float sumf = 0.0f;
    for (size_t i = 0; i < n / QK_K; i++, pw += sizeof(block_q4_K), pa += sizeof(block_q8_K)) {
        uint8_t sc[8], mn[8];
        k4_scales_mins(pw + offsetof(block_q4_K, scales), sc, mn);
        const uint8_t *qs = pw + offsetof(block_q4_K, qs), *aq = pa + Q8K_QS;
        int32x4_t acc = vdupq_n_s32(0);
        /* 64 values per step: low nibbles of 32 bytes are sub-block 2c, high nibbles 2c + 1 */
        for (int c = 0; c < QK_K / 64; c++, qs += 32, aq += 64) {
            const uint8x16_t q0 = vld1q_u8(qs), q1 = vld1q_u8(qs + 16);
            int32x4_t lo = dot_s8(vdupq_n_s32(0), as_s8(vandq_u8(q0, m4)), ld_s8(aq));
            lo = dot_s8(lo, as_s8(vandq_u8(q1, m4)), ld_s8(aq + 16));
            int32x4_t hi = dot_s8(vdupq_n_s32(0), as_s8(vshrq_n_u8(q0, 4)), ld_s8(aq + 32));
            hi = dot_s8(hi, as_s8(vshrq_n_u8(q1, 4)), ld_s8(aq + 48));
            acc = vmlaq_n_s32(acc, lo, sc[2 * c]);
            acc = vmlaq_n_s32(acc, hi, sc[2 * c + 1]);
        }
        const int32_t isum = vaddvq_s32(acc), summ = k4_min_sum(pa, mn);
        const float da = ld_f32(pa);
        const float d = ld_f16(pw) * da, dmin = ld_f16(pw + 2) * da;
        sumf += d * (float)isum - dmin * (float)summ;
    }
    return sumf;
}

static float EL_FN(q5_K_vec_dot)(size_t n, const void *w, const void *a) {
    const uint8_t *pw = w, *pa = a;
    const uint8x16_t m4 = vdupq_n_u8(0x0F), one = vdupq_n_u8(1), two = vdupq_n_u8(2);
    float sumf = 0.0f;
    for (size_t i = 0; i < n / QK_K; i++, pw += sizeof(block_q5_K), pa += sizeof(block_q8_K)) {
        uint8_t sc[8], mn[8];
        k4_scales_mins(pw + offsetof(block_q5_K, scales), sc, mn);
        const uint8_t *qs = pw + offsetof(block_q5_K, qs), *aq = pa + Q8K_QS;
        /* bit 2c of qh[l] is the 5th bit of value 64c + l, bit 2c + 1 that of value 64c + 32 + l;
         * shifting qh right by 2 per step brings them to bits 0 and 1 */
        uint8x16_t h0 = vld1q_u8(pw + offsetof(block_q5_K, qh)), h1 = vld1q_u8(pw + offsetof(block_q5_K, qh) + 16);
        int32x4_t acc = vdupq_n_s32(0);
        for (int c = 0; c < QK_K / 64; c++, qs += 32, aq += 64) {
            const uint8x16_t q0 = vld1q_u8(qs), q1 = vld1q_u8(qs + 16);
            const uint8x16_t l0 = vorrq_u8(vandq_u8(q0, m4), vshlq_n_u8(vandq_u8(h0, one), 4));
            const uint8x16_t l1 = vorrq_u8(vandq_u8(q1, m4), vshlq_n_u8(vandq_u8(h1, one), 4));
            const uint8x16_t u0 = vorrq_u8(vshrq_n_u8(q0, 4), vshlq_n_u8(vandq_u8(h0, two), 3));
            const uint8x16_t u1 = vorrq_u8(vshrq_n_u8(q1, 4), vshlq_n_u8(vandq_u8(h1, two), 3));
            int32x4_t lo = dot_s8(dot_s8(vdupq_n_s32(0), as_s8(l0), ld_s8(aq)), as_s8(l1), ld_s8(aq + 16));
            int32x4_t hi = dot_s8(dot_s8(vdupq_n_s32(0), as_s8(u0), ld_s8(aq + 32)), as_s8(u1), ld_s8(aq + 48));
            acc = vmlaq_n_s32(acc, lo, sc[2 * c]);
            acc = vmlaq_n_s32(acc, hi, sc[2 * c + 1]);
            h0 = vshrq_n_u8(h0, 2);
            h1 = vshrq_n_u8(h1, 2);
        }
        const int32_t isum = vaddvq_s32(acc), summ = k4_min_sum(pa, mn);
        const float da = ld_f32(pa);
        const float d = ld_f16(pw + offsetof(block_q5_K, d)) * da, dmin = ld_f16(pw + offsetof(block_q5_K, dmin)) * da;
        sumf += d * (float)isum - dmin * (float)summ;
    }
    return sumf;
}

static float EL_FN(q6_K_vec_dot)(size_t n, const void *w, const void *a) {
    const uint8_t *pw = w, *pa = a;
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m2 = vdupq_n_u8(0x03), m2h = vdupq_n_u8(0x30);
    const int8x16_t k32 = vdupq_n_s8(32);
    float sumf = 0.0f;
    for (size_t i = 0; i < n / QK_K; i++, pw += sizeof(block_q6_K), pa += sizeof(block_q8_K)) {
        const int8_t *sc = (const int8_t *)(pw + offsetof(block_q6_K, scales));
        int32x4_t acc = vdupq_n_s32(0);
        /* per 128 values: value l (l < 32) = low nibble of ql[l] | bits 0-1 of qh[l] << 4; l + 32 =
         * low nibble of ql[l + 32] | bits 2-3; l + 64 = high nibble of ql[l] | bits 4-5; l + 96 = high
         * nibble of ql[l + 32] | bits 6-7. Levels are stored + 32; one scale per 16 values. */
        for (int c = 0; c < QK_K / 128; c++, sc += 8) {
            const uint8_t *ql = pw + offsetof(block_q6_K, ql) + 64 * c;
            const uint8_t *qh = pw + offsetof(block_q6_K, qh) + 32 * c;
            const uint8_t *aq = pa + Q8K_QS + 128 * c;
            const uint8x16_t l0 = vld1q_u8(ql), l1 = vld1q_u8(ql + 16), l2 = vld1q_u8(ql + 32), l3 = vld1q_u8(ql + 48);
            const uint8x16_t h0 = vld1q_u8(qh), h1 = vld1q_u8(qh + 16);
            int8x16_t v[8];
            v[0] = as_s8(vorrq_u8(vandq_u8(l0, m4), vshlq_n_u8(vandq_u8(h0, m2), 4)));
            v[1] = as_s8(vorrq_u8(vandq_u8(l1, m4), vshlq_n_u8(vandq_u8(h1, m2), 4)));
            v[2] = as_s8(vorrq_u8(vandq_u8(l2, m4), vshlq_n_u8(vandq_u8(vshrq_n_u8(h0, 2), m2), 4)));
            v[3] = as_s8(vorrq_u8(vandq_u8(l3, m4), vshlq_n_u8(vandq_u8(vshrq_n_u8(h1, 2), m2), 4)));
            v[4] = as_s8(vorrq_u8(vshrq_n_u8(l0, 4), vandq_u8(h0, m2h)));
            v[5] = as_s8(vorrq_u8(vshrq_n_u8(l1, 4), vandq_u8(h1, m2h)));
            v[6] = as_s8(vorrq_u8(vshrq_n_u8(l2, 4), vandq_u8(vshrq_n_u8(h0, 2), m2h)));
            v[7] = as_s8(vorrq_u8(vshrq_n_u8(l3, 4), vandq_u8(vshrq_n_u8(h1, 2), m2h)));
            for (int g = 0; g < 8; g++) {
                const int32x4_t p = dot_s8(vdupq_n_s32(0), vsubq_s8(v[g], k32), ld_s8(aq + 16 * g));
                acc = vmlaq_n_s32(acc, p, sc[g]);
            }
        }
        const int32_t isum = vaddvq_s32(acc);
        sumf += (ld_f16(pw + offsetof(block_q6_K, d)) * ld_f32(pa)) * (float)isum;
    }
    return sumf;
}

static float EL_FN(q3_K_vec_dot)(size_t n, const void *w, const void *a) {
    const uint8_t *pw = w, *pa = a;
    const uint8x16_t m3 = vdupq_n_u8(3), four = vdupq_n_u8(4);
    float sumf = 0.0f;
    for (size_t i = 0; i < n / QK_K; i++, pw += sizeof(block_q3_K), pa += sizeof(block_q8_K)) {
        int8_t sc[16];
        q3_K_scales(pw + offsetof(block_q3_K, scales), sc);
        const uint8x16_t hm0 = vld1q_u8(pw + offsetof(block_q3_K, hmask));
        const uint8x16_t hm1 = vld1q_u8(pw + offsetof(block_q3_K, hmask) + 16);
        uint8x16_t bit = vdupq_n_u8(1);
        int32x4_t acc = vdupq_n_s32(0);
        /* value 128k + 32j + l: bits 2j of qs[32k + l] minus 4 unless bit 4k + j of hmask[l] is set */
        for (int k = 0; k < QK_K / 128; k++) {
            uint8x16_t q0 = vld1q_u8(pw + offsetof(block_q3_K, qs) + 32 * k);
            uint8x16_t q1 = vld1q_u8(pw + offsetof(block_q3_K, qs) + 32 * k + 16);
            const uint8_t *aq = pa + Q8K_QS + 128 * k;
            for (int j = 0; j < 4; j++, aq += 32) {
                const int8x16_t w0 = vsubq_s8(as_s8(vandq_u8(q0, m3)), as_s8(vbicq_u8(four, vtstq_u8(hm0, bit))));
                const int8x16_t w1 = vsubq_s8(as_s8(vandq_u8(q1, m3)), as_s8(vbicq_u8(four, vtstq_u8(hm1, bit))));
                const int s = 8 * k + 2 * j;
                acc = vmlaq_n_s32(acc, dot_s8(vdupq_n_s32(0), w0, ld_s8(aq)), sc[s]);
                acc = vmlaq_n_s32(acc, dot_s8(vdupq_n_s32(0), w1, ld_s8(aq + 16)), sc[s + 1]);
                q0 = vshrq_n_u8(q0, 2);
                q1 = vshrq_n_u8(q1, 2);
                bit = vshlq_n_u8(bit, 1);
            }
        }
        const int32_t isum = vaddvq_s32(acc);
        sumf += (ld_f16(pw + offsetof(block_q3_K, d)) * ld_f32(pa)) * (float)isum;
    }
    return sumf;
}

static float EL_FN(q2_K_vec_dot)(size_t n, const void *w, const void *a) {
    const uint8_t *pw = w, *pa = a;
    const uint8x16_t m3 = vdupq_n_u8(3);
    float sumf = 0.0f;
    for (size_t i = 0; i < n / QK_K; i++, pw += sizeof(block_q2_K), pa += sizeof(block_q8_K)) {
        const uint8_t *scales = pw + offsetof(block_q2_K, scales); /* low nibble scale, high nibble min */
        const uint8x16_t sv = vld1q_u8(scales);
        /* mins: sum_s bsums[s] * (scales[s] >> 4) */
        const int16x8_t mlo = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(vshrq_n_u8(sv, 4))));
        const int16x8_t mhi = vreinterpretq_s16_u16(vmovl_high_u8(vshrq_n_u8(sv, 4)));
        const int16x8_t b0 = vreinterpretq_s16_u8(vld1q_u8(pa + Q8K_BSUMS));
        const int16x8_t b1 = vreinterpretq_s16_u8(vld1q_u8(pa + Q8K_BSUMS + 16));
        int32x4_t ms = vmull_s16(vget_low_s16(b0), vget_low_s16(mlo));
        ms = vmlal_high_s16(ms, b0, mlo);
        ms = vmlal_s16(ms, vget_low_s16(b1), vget_low_s16(mhi));
        ms = vmlal_high_s16(ms, b1, mhi);
        const int32_t summ = vaddvq_s32(ms);
        int32x4_t acc = vdupq_n_s32(0);
        /* value 128k + 32j + l: bits 2j of qs[32k + l]; one scale per 16 values */
        for (int k = 0; k < QK_K / 128; k++) {
            uint8x16_t q0 = vld1q_u8(pw + offsetof(block_q2_K, qs) + 32 * k);
            uint8x16_t q1 = vld1q_u8(pw + offsetof(block_q2_K, qs) + 32 * k + 16);
            const uint8_t *aq = pa + Q8K_QS + 128 * k;
            for (int j = 0; j < 4; j++, aq += 32) {
                const int s = 8 * k + 2 * j;
                acc = vmlaq_n_s32(acc, dot_s8(vdupq_n_s32(0), as_s8(vandq_u8(q0, m3)), ld_s8(aq)), scales[s] & 0xF);
                acc = vmlaq_n_s32(acc, dot_s8(vdupq_n_s32(0), as_s8(vandq_u8(q1, m3)), ld_s8(aq + 16)),
                                  scales[s + 1] & 0xF);
                q0 = vshrq_n_u8(q0, 2);
                q1 = vshrq_n_u8(q1, 2);
            }
        }
        const int32_t isum = vaddvq_s32(acc);
        const float da = ld_f32(pa);
        const float dall = da * ld_f16(pw + offsetof(block_q2_K, d)), dmin = da * ld_f16(pw + offsetof(block_q2_K, dmin));
        sumf += dall * (float)isum - dmin * (float)summ;
    }
    return sumf;
}

#ifdef EL_NEON_DOTPROD

void el_neon_fill_dotprod(el_kernels *k);
void el_neon_fill_dotprod(el_kernels *k) {
    k->name = "neon-dotprod";
    k->vec_dot[EL_TYPE_Q4_0] = q4_0_vec_dot_dotprod;
    k->vec_dot[EL_TYPE_Q4_1] = q4_1_vec_dot_dotprod;
    k->vec_dot[EL_TYPE_Q5_0] = q5_0_vec_dot_dotprod;
    k->vec_dot[EL_TYPE_Q5_1] = q5_1_vec_dot_dotprod;
    k->vec_dot[EL_TYPE_Q8_0] = q8_0_vec_dot_dotprod;
    k->vec_dot[EL_TYPE_Q2_K] = q2_K_vec_dot_dotprod;
    k->vec_dot[EL_TYPE_Q3_K] = q3_K_vec_dot_dotprod;
    k->vec_dot[EL_TYPE_Q4_K] = q4_K_vec_dot_dotprod;
    k->vec_dot[EL_TYPE_Q5_K] = q5_K_vec_dot_dotprod;
    k->vec_dot[EL_TYPE_Q6_K] = q6_K_vec_dot_dotprod;
}

#else /* the plain variant also owns the ISA-independent kernels and the filler */

/* ---------------- activation quantizers (bit-identical to the reference) ---------------- */

static inline float absmax32(const float *x) {
    float32x4_t m = vabsq_f32(vld1q_f32(x));
    for (int j = 4; j < 32; j += 4) m = vmaxq_f32(m, vabsq_f32(vld1q_f32(x + j)));
    return vmaxvq_f32(m);
}

/* 32 floats * id rounded half away from zero (roundf, as the reference), saturated to int8 */
static inline void round32(const float *x, float id, int8_t *q) {
    for (int j = 0; j < 32; j += 8) {
        const int32x4_t a = vcvtaq_s32_f32(vmulq_n_f32(vld1q_f32(x + j), id));
        const int32x4_t b = vcvtaq_s32_f32(vmulq_n_f32(vld1q_f32(x + j + 4), id));
        vst1_s8(q + j, vqmovn_s16(vcombine_s16(vqmovn_s32(a), vqmovn_s32(b))));
    }
}

/* 1/d, or 0 where d is 0 or 1/d overflows (a block of denormals): the scalar reference rounds the
 * non-finite x * (1/d) to 0, while NEON's conversion would saturate it to 127 / -128 */
static inline float inv_scale(float d) {
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    return id <= FLT_MAX ? id : 0.0f;
}

static void q8_0_quantize(const float *src, void *dst, size_t n) {
    uint8_t *p = dst;
    for (size_t i = 0; i < n / QK8_0; i++, p += sizeof(block_q8_0)) {
        const float *x = src + i * QK8_0;
        const float d = absmax32(x) / 127;
        const float id = inv_scale(d);
        const el_half h = el_fp32_to_fp16(d);
        memcpy(p, &h, 2);
        int8_t q[QK8_0];
        round32(x, id, q);
        memcpy(p + 2, q, QK8_0);
    }
}

static void q8_1_quantize(const float *src, void *dst, size_t n) {
    uint8_t *p = dst;
    for (size_t i = 0; i < n / QK8_1; i++, p += sizeof(block_q8_1)) {
        const float *x = src + i * QK8_1;
        const float d = absmax32(x) / 127;
        const float id = inv_scale(d);
        int8_t q[QK8_1];
        round32(x, id, q);
        const int16x8_t s16 = vaddq_s16(vpaddlq_s8(vld1q_s8(q)), vpaddlq_s8(vld1q_s8(q + 16)));
        const int sum = vaddlvq_s16(s16);
        const el_half hd = el_fp32_to_fp16(d), hs = el_fp32_to_fp16((float)sum * d);
        memcpy(p, &hd, 2);
        memcpy(p + 2, &hs, 2);
        memcpy(p + 4, q, QK8_1);
    }
}

static void q8_K_quantize(const float *src, void *dst, size_t n) {
    uint8_t *p = dst;
    for (size_t i = 0; i < n / QK_K; i++, p += sizeof(block_q8_K)) {
        const float *x = src + i * QK_K;
        float32x4_t m = vdupq_n_f32(0.0f);
        for (int j = 0; j < QK_K; j += 4) m = vmaxq_f32(m, vabsq_f32(vld1q_f32(x + j)));
        const float amax = vmaxvq_f32(m);
        block_q8_K y;
        if (!amax) {
            memset(&y, 0, sizeof y);
            memcpy(p, &y, sizeof y);
            continue;
        }
        /* the reference keeps the sign of the first value of largest magnitude */
        float max = 0.0f;
        for (int j = 0; j < QK_K; j++)
            if (fabsf(x[j]) == amax) {
                max = x[j];
                break;
            }
        const float iscale = -127.f / max;
        if (isinf(iscale)) { /* |max| < 127 / FLT_MAX: the reference writes zero quants, d = 1/iscale */
            memset(&y, 0, sizeof y);
            y.d = 1 / iscale;
            memcpy(p, &y, sizeof y);
            continue;
        }
        for (int j = 0; j < QK_K; j += 8) {
            /* vcvtn rounds half to even, as ggml's nearest_int (|v| <= 127 here) */
            const int32x4_t a = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + j), iscale));
            const int32x4_t b = vcvtnq_s32_f32(vmulq_n_f32(vld1q_f32(x + j + 4), iscale));
            vst1_s8(y.qs + j, vqmovn_s16(vcombine_s16(vqmovn_s32(a), vqmovn_s32(b))));
        }
        for (int j = 0; j < QK_K / 16; j++) y.bsums[j] = (int16_t)vaddlvq_s8(vld1q_s8(y.qs + 16 * j));
        y.d = 1 / iscale;
        memcpy(p, &y, sizeof y);
    }
}

/* ---------------- float kernels (attention, F32 / F16 rows): 4-lane partial sums, FMA ---------------- */

static float dot_f32_neon(size_t n, const float *a, const float *b) {
    float32x4_t s0 = vdupq_n_f32(0), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
        s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
        s2 = vfmaq_f32(s2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
        s3 = vfmaq_f32(s3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
    }
    for (; i + 4 <= n; i += 4) s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
    float s = vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static inline float32x4_t ld_f16x4(const el_half *p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }

static float dot_f32_f16_neon(size_t n, const float *a, const el_half *b) {
    float32x4_t s0 = vdupq_n_f32(0), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        s0 = vfmaq_f32(s0, vld1q_f32(a + i), ld_f16x4(b + i));
        s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), ld_f16x4(b + i + 4));
        s2 = vfmaq_f32(s2, vld1q_f32(a + i + 8), ld_f16x4(b + i + 8));
        s3 = vfmaq_f32(s3, vld1q_f32(a + i + 12), ld_f16x4(b + i + 12));
    }
    for (; i + 4 <= n; i += 4) s0 = vfmaq_f32(s0, vld1q_f32(a + i), ld_f16x4(b + i));
    float s = vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
    for (; i < n; i++) s += a[i] * el_fp16_to_fp32(b[i]);
    return s;
}

/* Float weights (F32, F16, BF16) x F32 activations, NR weight rows x NV activation rows per call (the
 * batch entries of dispatch.h; without them these types ran the scalar reference): a weight vector is
 * widened once for the NV activations, an activation vector loaded once for the NR rows. Each output is
 * one 4-lane FMA chain, vaddvq_f32, then the n % 4 tail as multiply and add, whatever NR and NV, so every
 * entry has vec_dot's bits, and a weight stored as halves the bits of its values as F32 (LoRA's F16
 * adapters rely on it). LOAD4(row, i): values i..i+3 as floats; TO_F32(row, i): value i. */
static inline float32x4_t f32x4_ld(const uint8_t *p, size_t i) { return vld1q_f32((const float *)p + i); }
static inline float f32_at(const uint8_t *p, size_t i) { float x; memcpy(&x, p + 4 * i, 4); return x; }
static inline float32x4_t f16x4_ld(const uint8_t *p, size_t i) {
    return vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(p + 2 * i)));
}
static inline float f16_at(const uint8_t *p, size_t i) { uint16_t h; memcpy(&h, p + 2 * i, 2); return el_fp16_to_fp32(h); }
static inline float32x4_t bf16x4_ld(const uint8_t *p, size_t i) {
    return vreinterpretq_f32_u32(vshll_n_u16(vreinterpret_u16_u8(vld1_u8(p + 2 * i)), 16));
}
static inline float bf16_at(const uint8_t *p, size_t i) { uint16_t h; memcpy(&h, p + 2 * i, 2); return el_bf16_to_fp32(h); }

#define EL_FLOAT_TILE_NEON(NAME, LOAD4, TO_F32)                                                    \
    EL_FORCE_INLINE void NAME##_tile(size_t n, const void *w, size_t ws, const int NR, const void *a, size_t as, \
                                     const int NV, float *out, size_t ldo) {                       \
        const uint8_t *pw = w, *pa = a;                                                            \
        float32x4_t acc[EL_MV_ROWS][EL_NV_MAX];                                                    \
        EL_UNROLL for (int r = 0; r < NR; r++)                                                     \
            EL_UNROLL for (int v = 0; v < NV; v++) acc[r][v] = vdupq_n_f32(0.0f);                  \
        size_t i = 0;                                                                              \
        for (; i + 4 <= n; i += 4) {                                                               \
            float32x4_t y[EL_NV_MAX];                                                              \
            EL_UNROLL for (int v = 0; v < NV; v++) y[v] = f32x4_ld(pa + v * as, i);                \
            EL_UNROLL for (int r = 0; r < NR; r++) {                                               \
                const float32x4_t x = LOAD4(pw + r * ws, i);                                       \
                EL_UNROLL for (int v = 0; v < NV; v++) acc[r][v] = vfmaq_f32(acc[r][v], x, y[v]);  \
            }                                                                                      \
        }                                                                                          \
        EL_UNROLL for (int r = 0; r < NR; r++)                                                     \
            EL_UNROLL for (int v = 0; v < NV; v++) {                                               \
                float s = vaddvq_f32(acc[r][v]);                                                   \
                for (size_t k = i; k < n; k++) s += TO_F32(pw + r * ws, k) * f32_at(pa + v * as, k); \
                out[r * ldo + v] = s;                                                              \
            }                                                                                      \
    }                                                                                              \
    EL_TILE_ENTRIES(, NAME, NAME##_tile)                                                           \
    EL_TILE2_ENTRY(, NAME, NAME##_tile)

EL_FLOAT_TILE_NEON(vec_dot_f32_neon, f32x4_ld, f32_at)
EL_FLOAT_TILE_NEON(vec_dot_f16_neon, f16x4_ld, f16_at)
EL_FLOAT_TILE_NEON(vec_dot_bf16_neon, bf16x4_ld, bf16_at)

static void axpy_f16_neon(size_t n, float alpha, const el_half *x, float *y) {
    size_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), ld_f16x4(x + i), alpha));
    for (; i < n; i++) y[i] = fmaf(alpha, el_fp16_to_fp32(x[i]), y[i]);
}

static void axpy_f32_neon(size_t n, float alpha, const float *x, float *y) {
    size_t i = 0;
    for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vld1q_f32(x + i), alpha));
    for (; i < n; i++) y[i] = fmaf(alpha, x[i], y[i]);
}

/* d = t B for m outputs (dispatch.h): 16 outputs in four registers while k runs, then 4, then one;
 * vfmaq is the fused step the tail's fmaf is. LOAD4 reads 4 values of b as floats, TO_F32 one. */
#define EL_VECMAT(NAME, T, LOAD4, TO_F32)                                                          \
    static void NAME(size_t rank, size_t m, const float *t, const T *b, size_t ld, float *d) {    \
        size_t o = 0;                                                                              \
        for (; o + 16 <= m; o += 16) {                                                             \
            float32x4_t s0 = vdupq_n_f32(0), s1 = s0, s2 = s0, s3 = s0;                            \
            for (size_t k = 0; k < rank; k++) {                                                    \
                const T *bk = b + k * ld + o;                                                      \
                s0 = vfmaq_n_f32(s0, LOAD4(bk), t[k]), s1 = vfmaq_n_f32(s1, LOAD4(bk + 4), t[k]);  \
                s2 = vfmaq_n_f32(s2, LOAD4(bk + 8), t[k]), s3 = vfmaq_n_f32(s3, LOAD4(bk + 12), t[k]); \
            }                                                                                      \
            vst1q_f32(d + o, s0), vst1q_f32(d + o + 4, s1), vst1q_f32(d + o + 8, s2), vst1q_f32(d + o + 12, s3); \
        }                                                                                          \
        for (; o + 4 <= m; o += 4) {                                                               \
            float32x4_t s0 = vdupq_n_f32(0);                                                       \
            for (size_t k = 0; k < rank; k++) s0 = vfmaq_n_f32(s0, LOAD4(b + k * ld + o), t[k]);   \
            vst1q_f32(d + o, s0);                                                                  \
        }                                                                                          \
        for (; o < m; o++) {                                                                       \
            float s = 0.0f;                                                                        \
            for (size_t k = 0; k < rank; k++) s = fmaf(t[k], TO_F32(b[k * ld + o]), s);            \
            d[o] = s;                                                                              \
        }                                                                                          \
    }

static inline float f32_id(float x) { return x; }
EL_VECMAT(vecmat_f32_neon, float, vld1q_f32, f32_id)
EL_VECMAT(vecmat_f16_neon, el_half, ld_f16x4, el_fp16_to_fp32)

void el_neon_fill_dotprod(el_kernels *k); /* neon_dotprod.c */

void el_kernels_fill_neon(el_kernels *k, int dotprod) {
    k->name = "neon";
    k->vec_dot[EL_TYPE_Q4_0] = q4_0_vec_dot_neon;
    k->vec_dot[EL_TYPE_Q4_1] = q4_1_vec_dot_neon;
    k->vec_dot[EL_TYPE_Q5_0] = q5_0_vec_dot_neon;
    k->vec_dot[EL_TYPE_Q5_1] = q5_1_vec_dot_neon;
    k->vec_dot[EL_TYPE_Q8_0] = q8_0_vec_dot_neon;
    k->vec_dot[EL_TYPE_Q2_K] = q2_K_vec_dot_neon;
    k->vec_dot[EL_TYPE_Q3_K] = q3_K_vec_dot_neon;
    k->vec_dot[EL_TYPE_Q4_K] = q4_K_vec_dot_neon;
    k->vec_dot[EL_TYPE_Q5_K] = q5_K_vec_dot_neon;
    k->vec_dot[EL_TYPE_Q6_K] = q6_K_vec_dot_neon;
    k->quantize_act[EL_TYPE_Q8_0] = q8_0_quantize;
    k->quantize_act[EL_TYPE_Q8_1] = q8_1_quantize;
    k->quantize_act[EL_TYPE_Q8_K] = q8_K_quantize;
    EL_SET_DOT_ENTRIES(k, EL_TYPE_F32, vec_dot_f32_neon, vec_dot_f32_neon_tile2);
    EL_SET_DOT_ENTRIES(k, EL_TYPE_F16, vec_dot_f16_neon, vec_dot_f16_neon_tile2);
    EL_SET_DOT_ENTRIES(k, EL_TYPE_BF16, vec_dot_bf16_neon, vec_dot_bf16_neon_tile2);
    k->dot_f32 = dot_f32_neon;
    k->dot_f32_f16 = dot_f32_f16_neon;
    k->axpy_f16 = axpy_f16_neon;
    k->axpy_f32 = axpy_f32_neon;
    k->vecmat_f32 = vecmat_f32_neon;
    k->vecmat_f16 = vecmat_f16_neon;
    if (dotprod) el_neon_fill_dotprod(k);
}

#endif /* EL_NEON_DOTPROD */
#endif /* __aarch64__ */

/* arch/neon_common.h - the helpers every NEON kernel file shares: the int8 dot step (vdotq_s32 with
 * dotprod, widening multiply-accumulate without), unaligned block loads, and the unpacking of the
 * packed Q5 high bits and K-quant scales. Included once per translation unit by neon.c (compiled twice:
 * plain and, through neon_dotprod.c, with EL_NEON_DOTPROD) and by the other arch/neon*.c files. */
#ifndef EL_ARCH_NEON_COMMON_H
#define EL_ARCH_NEON_COMMON_H

#include "../dispatch.h"
#include <arm_neon.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef EL_NEON_DOTPROD
#define EL_FN(name) name##_dotprod
/* acc[i] += sum of the 4 byte products a[4i..4i+3] * b[4i..4i+3] */
static inline int32x4_t dot_s8(int32x4_t acc, int8x16_t a, int8x16_t b) { return vdotq_s32(acc, a, b); }
#else
#define EL_FN(name) name##_neon
/* Plain NEON (A72): widen to 16-bit products and pairwise-accumulate into 32-bit lanes. Each
 * product (at most 128*128) fits int16; adding two first could overflow, so each half goes alone.
 * Lanes hold different partial sums than vdotq's, but only the total is ever used. */
static inline int32x4_t dot_s8(int32x4_t acc, int8x16_t a, int8x16_t b) {
    acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
    return vpadalq_s16(acc, vmull_high_s8(a, b));
}
#endif

/* Blocks sit back to back at any address (GGUF packing, numpy views): scalars come out through
 * memcpy and vectors through vld1q_u8, which has no alignment requirement. */
static inline float ld_f16(const uint8_t *p) {
    __fp16 h;
    memcpy(&h, p, 2);
    return (float)h; /* exact, equal to el_fp16_to_fp32 on every non-NaN value */
}
static inline float ld_f32(const uint8_t *p) {
    float f;
    memcpy(&f, p, 4);
    return f;
}
static inline int8x16_t ld_s8(const void *p) { return vreinterpretq_s8_u8(vld1q_u8((const uint8_t *)p)); }
static inline int8x16_t as_s8(uint8x16_t v) { return vreinterpretq_s8_u8(v); }

/* sum of the 32 products of two 32-value int8 runs */
static inline int32_t dot32(int8x16_t w0, int8x16_t w1, const uint8_t *a) {
    const int32x4_t p = dot_s8(dot_s8(vdupq_n_s32(0), w0, ld_s8(a)), w1, ld_s8(a + 16));
    return vaddvq_s32(p);
}

/* 16 bytes of 0x10 where bit j of (qh >> 16 * half) is set (value j's 5th bit in Q5_0 / Q5_1) */
static inline uint8x16_t q5_high_bits(uint32_t qh, int half) {
    static const uint8_t sel_lo[16] = {0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
    static const uint8_t sel_hi[16] = {2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3};
    static const uint8_t bit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t bytes = vreinterpretq_u8_u32(vdupq_n_u32(qh)); /* little endian: byte k = bits 8k.. */
    const uint8x16_t spread = vqtbl1q_u8(bytes, vld1q_u8(half ? sel_hi : sel_lo));
    return vandq_u8(vtstq_u8(spread, vld1q_u8(bit)), vdupq_n_u8(0x10));
}

/* ---------------- K-quant helpers ---------------- */

#define Q8K_QS offsetof(block_q8_K, qs)
#define Q8K_BSUMS offsetof(block_q8_K, bsums)

/* The 8 six-bit scales and mins of Q4_K / Q5_K from their 12 packed bytes, 4 at a time as words.
 * Bytes 0..3 hold scale 0..3 (low 6 bits), bytes 4..7 min 0..3; scale / min 4..7 have their low
 * nibble in bytes 8..11 (low / high nibble) and their top 2 bits in the top of bytes 0..3 / 4..7. */
static inline void k4_scales_mins(const uint8_t *packed, uint8_t sc[8], uint8_t mn[8]) {
    uint32_t b[3], out[4];
    memcpy(b, packed, 12);
    out[0] = b[0] & 0x3f3f3f3fu;                                          /* scales 0..3 */
    out[1] = (b[2] & 0x0f0f0f0fu) | (((b[0] >> 6) & 0x03030303u) << 4);   /* scales 4..7 */
    out[2] = b[1] & 0x3f3f3f3fu;                                          /* mins 0..3 */
    out[3] = ((b[2] >> 4) & 0x0f0f0f0fu) | (((b[1] >> 6) & 0x03030303u) << 4); /* mins 4..7 */
    memcpy(sc, out, 8);
    memcpy(mn, out + 2, 8);
}

/* sum_j bsums[j] * mn[j / 2]: the activation sums of the 8 32-value sub-blocks times their mins */
static inline int32_t k4_min_sum(const uint8_t *ba, const uint8_t mn[8]) {
    const int16x8_t b0 = vreinterpretq_s16_u8(vld1q_u8(ba + Q8K_BSUMS));
    const int16x8_t b1 = vreinterpretq_s16_u8(vld1q_u8(ba + Q8K_BSUMS + 16));
    const int16x8_t pairs = vpaddq_s16(b0, b1); /* |sum of 32 int8| <= 4096: no overflow */
    const int16x8_t m = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(mn)));
    return vaddvq_s32(vmull_s16(vget_low_s16(pairs), vget_low_s16(m))) + vaddvq_s32(vmull_high_s16(pairs, m));
}
/* The 16 six-bit scales of Q3_K (stored + 32): low nibbles in bytes 0..7 (scales 0..7 in the low,
 * 8..15 in the high nibble), top 2 bits in bytes 8..11 (pair k of byte 8 + j % 4 for j / 4 = k). */
static inline void q3_K_scales(const uint8_t *packed, int8_t sc[16]) {
    uint32_t b[3], out[4];
    memcpy(b, packed, 12);
    out[0] = (b[0] & 0x0f0f0f0fu) | ((b[2] & 0x03030303u) << 4);
    out[1] = (b[1] & 0x0f0f0f0fu) | (((b[2] >> 2) & 0x03030303u) << 4);
    out[2] = ((b[0] >> 4) & 0x0f0f0f0fu) | (((b[2] >> 4) & 0x03030303u) << 4);
    out[3] = ((b[1] >> 4) & 0x0f0f0f0fu) | (((b[2] >> 6) & 0x03030303u) << 4);
    memcpy(sc, out, 16);
    for (int j = 0; j < 16; j++) sc[j] = (int8_t)(sc[j] - 32);
}

#endif /* EL_ARCH_NEON_COMMON_H */

/* fp16.h - IEEE half and bfloat16 <-> float conversions, portable C.
 * Round-to-nearest-even, NaN/inf preserved: results equal numpy's astype(float16) and gguf-py's bf16. */
#ifndef EL_FP16_H
#define EL_FP16_H

#include <stdint.h>
#include <string.h>

typedef uint16_t el_half;
typedef uint16_t el_bf16;

static inline float el_bits_to_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t el_f32_to_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static inline float el_fp16_to_fp32(el_half h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    const uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t mant = h & 0x3ffu;
    if (exp == 0) {
        if (mant == 0) return el_bits_to_f32(sign);
        /* subnormal half: normalise */
        int e = -1;
        do { mant <<= 1; e++; } while ((mant & 0x400u) == 0);
        mant &= 0x3ffu;
        return el_bits_to_f32(sign | ((uint32_t)(127 - 15 - e) << 23) | (mant << 13));
    }
    if (exp == 31) return el_bits_to_f32(sign | 0x7f800000u | (mant << 13));
    return el_bits_to_f32(sign | ((exp + 127 - 15) << 23) | (mant << 13));
}

static inline el_half el_fp32_to_fp16(float f) {
    const uint32_t x = el_f32_to_bits(f);
    const uint32_t sign = (x >> 16) & 0x8000u;
    const uint32_t ax = x & 0x7fffffffu;
    if (ax >= 0x7f800000u) /* inf or nan */
        return (el_half)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu) : 0));
    if (ax >= 0x477ff000u) return (el_half)(sign | 0x7c00u); /* rounds to >= 65520: overflow */
    if (ax < 0x38800000u) { /* below the smallest normal half: subnormal or zero */
        if (ax < 0x33000000u) return (el_half)sign; /* < 2^-25 rounds to zero */
        const uint32_t e = ax >> 23;
        const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
        const uint32_t shift = 126 - e; /* 14..24 */
        uint32_t r = m >> shift;
        const uint32_t rem = m & ((1u << shift) - 1);
        const uint32_t half = 1u << (shift - 1);
        if (rem > half || (rem == half && (r & 1u))) r++;
        return (el_half)(sign | r);
    }
    uint32_t r = (ax - 0x38000000u) >> 13; /* rebias exponent 127 -> 15 */
    const uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) r++;
    return (el_half)(sign | r);
}

static inline float el_bf16_to_fp32(el_bf16 h) { return el_bits_to_f32((uint32_t)h << 16); }

static inline el_bf16 el_fp32_to_bf16(float f) {
    uint32_t u = el_f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (el_bf16)((u >> 16) | 64); /* quiet nan, as ggml */
    return (el_bf16)((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

#endif

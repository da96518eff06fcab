/* arch/neon_batch.c - the NEON batch kernels for prompt processing: vec_dot_nv (one weight row x
 * EL_NV_MAX activation rows) for every quantized type, and the EL_TILE_ROWS x EL_NV_MAX tiles where
 * they pay. Each weight block is unpacked once for all activation rows (and each activation block
 * loaded once for both tile rows); the per-output work left is the integer dots and one vector of
 * float updates per row, lane j holding activation row j. Compiled twice like neon.c: plain (A72)
 * and, through neon_batch_dotprod.c, with vdotq_s32 (A76). The 4-row matvec (decode) is elsewhere.
 *
 * Exactness (dispatch.h's contract: every output has the bits of the table's vec_dot): each block's
 * integer sums are exact whatever the lane layout, and lane j of the float update is the very
 * expression of neon.c's vec_dot (= quants.c / quants_k.c) for activation j, in the same block
 * order: IEEE products are commutative, so da * dw broadcast over lanes equals dw * da, and with
 * contraction off nothing fuses.
 *
 * Which types have tiles: a tile must execute fewer instructions per output than two nv calls.
 * Compared by the static instruction counts of the compiled functions (aarch64 gcc -O3, objdump;
 * each is one straight-line loop over weight blocks), a tile's for 8 outputs against nv's for 4
 * (a tile pays below 2x): the 32-value types gain (dotprod Q4_1: 151 against 104), and so does
 * Q4_K with dotprod (623 against 355). Without dotprod each 32-value dot needs an int16 temporary
 * and two rows of Q4_K spill (1264, with 424 stack accesses, against 500). Q2_K, Q3_K, Q5_K and
 * Q6_K unpack 8 registers per row per step (Q5_K: 4 plus its high-bit state): their tiles spill on
 * both variants (dotprod: 856, 1061, 948, 887 against 420, 473, 421, 445; plain: about 3.2x nv),
 * so they have none and matmul uses vec_dot_nv for them. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include "../dispatch.h"

#if defined(__aarch64__)
#include <arm_neon.h>
#include <stddef.h>
#include <string.h>

#include "neon_common.h"

#define EL_INL static inline __attribute__((always_inline))
/* every loop over lanes, rows or steps is unrolled whatever the -O level: the arrays indexed by
 * them are then registers, not stack slots */
#define UNROLL _Pragma("GCC unroll 8")

_Static_assert(EL_NV_MAX == 4, "the kernels put activation row j in lane j of a 4-lane vector");
_Static_assert(EL_TILE_ROWS == 2, "the tiles hold two weight rows");

/* ---------------- shared helpers ---------------- */

/* Activation row j of nv at ap[j]; lanes j >= nv repeat the last row (computed, never stored), so
 * one 4-lane body serves every nv without reading outside the rows given. */
EL_INL void act_rows(const void *a, size_t as, size_t nv, const uint8_t *ap[4]) {
    UNROLL
    for (size_t j = 0; j < 4; j++) ap[j] = (const uint8_t *)a + (j < nv ? j : nv - 1) * as;
}

/* lane j = the total of p_j's four lanes */
EL_INL int32x4_t hsum4(int32x4_t p0, int32x4_t p1, int32x4_t p2, int32x4_t p3) {
    return vpaddq_s32(vpaddq_s32(p0, p1), vpaddq_s32(p2, p3));
}

/* lane j = the f16 / f32 at ap[j] + off (any alignment) */
EL_INL float32x4_t f16x4(const uint8_t *const ap[4], size_t off) {
    uint16_t h[4];
    UNROLL
    for (int j = 0; j < 4; j++) memcpy(&h[j], ap[j] + off, 2);
    uint16x4_t v = vdup_n_u16(h[0]);
    v = vset_lane_u16(h[1], v, 1);
    v = vset_lane_u16(h[2], v, 2);
    v = vset_lane_u16(h[3], v, 3);
    return vcvt_f32_f16(vreinterpret_f16_u16(v)); /* exact, as ld_f16 */
}
EL_INL float32x4_t f32x4(const uint8_t *const ap[4], size_t off) {
    float32x4_t v = vdupq_n_f32(ld_f32(ap[0] + off));
    v = vsetq_lane_f32(ld_f32(ap[1] + off), v, 1);
    v = vsetq_lane_f32(ld_f32(ap[2] + off), v, 2);
    return vsetq_lane_f32(ld_f32(ap[3] + off), v, 3);
}

EL_INL void store_rows(const float32x4_t *sum, int nr, size_t nv, float *out, size_t ldo) {
    for (int r = 0; r < nr; r++) {
        float t[4];
        vst1q_f32(t, sum[r]);
        for (size_t j = 0; j < nv; j++) out[(size_t)r * ldo + j] = t[j];
    }
}

/* Integer dots of weights w with |w| <= 32 against int8 activations (|a| <= 128): partial sums in
 * 4 lanes, only their total is used. Without dotprod, 4 products (<= 4 * 4096) fit an int16 lane,
 * so 32 values take 4 widening multiply-accumulates and one pairwise widen instead of dot_s8's 8. */
#ifdef EL_NEON_DOTPROD
/* acc + the 16 products w a, in 4 lanes */
EL_INL int32x4_t dot16_run(int32x4_t acc, int8x16_t w, int8x16_t a) { return vdotq_s32(acc, w, a); }
EL_INL int32x4_t dot32_run(int32x4_t acc, int8x16_t w0, int8x16_t w1, int8x16_t a0, int8x16_t a1) {
    return vdotq_s32(vdotq_s32(acc, w0, a0), w1, a1);
}
EL_INL int32x4_t dot32s(int8x16_t w0, int8x16_t w1, int8x16_t a0, int8x16_t a1) {
    return vdotq_s32(vdotq_s32(vdupq_n_s32(0), w0, a0), w1, a1);
}
#else
EL_INL int32x4_t dot16_run(int32x4_t acc, int8x16_t w, int8x16_t a) {
    return vpadalq_s16(acc, vmlal_high_s8(vmull_s8(vget_low_s8(w), vget_low_s8(a)), w, a));
}
EL_INL int32x4_t dot32_run(int32x4_t acc, int8x16_t w0, int8x16_t w1, int8x16_t a0, int8x16_t a1) {
    int16x8_t s = vmull_s8(vget_low_s8(w0), vget_low_s8(a0));
    s = vmlal_high_s8(s, w0, a0);
    s = vmlal_s8(s, vget_low_s8(w1), vget_low_s8(a1));
    return vpadalq_s16(acc, vmlal_high_s8(s, w1, a1));
}
EL_INL int32x4_t dot32s(int8x16_t w0, int8x16_t w1, int8x16_t a0, int8x16_t a1) {
    int16x8_t s = vmull_s8(vget_low_s8(w0), vget_low_s8(a0));
    s = vmlal_high_s8(s, w0, a0);
    s = vmlal_s8(s, vget_low_s8(w1), vget_low_s8(a1));
    return vpaddlq_s16(vmlal_high_s8(s, w1, a1));
}
#endif

/* acc + p * scale g of the 8 in s03 (lanes 0..3) and s47 (lanes 4..7); g is a constant after the
 * callers' unrolled loops, so the switch folds to one multiply-accumulate by lane */
EL_INL int32x4_t mla_sc(int32x4_t acc, int32x4_t p, int32x4_t s03, int32x4_t s47, const int g) {
    switch (g) {
    case 0: return vmlaq_laneq_s32(acc, p, s03, 0);
    case 1: return vmlaq_laneq_s32(acc, p, s03, 1);
    case 2: return vmlaq_laneq_s32(acc, p, s03, 2);
    case 3: return vmlaq_laneq_s32(acc, p, s03, 3);
    case 4: return vmlaq_laneq_s32(acc, p, s47, 0);
    case 5: return vmlaq_laneq_s32(acc, p, s47, 1);
    case 6: return vmlaq_laneq_s32(acc, p, s47, 2);
    default: return vmlaq_laneq_s32(acc, p, s47, 3);
    }
}

/* 8 scales (int16 lanes) as two int32x4 */
/* summation by parts (k16_tile): each scale less the next one; next = the 8 scales after s (0 past the end) */
EL_INL int16x8_t scale_steps(int16x8_t s, int16x8_t next) { return vsubq_s16(s, vextq_s16(s, next, 1)); }
EL_INL void widen_scales(int16x8_t s, int32x4_t *s03, int32x4_t *s47) {
    *s03 = vmovl_s16(vget_low_s16(s));
    *s47 = vmovl_high_s16(s);
}

/* ---------------- 32-value blocks: Q4_0 / Q5_0 / Q8_0 x Q8_0, Q4_1 / Q5_1 x Q8_1 ---------------- */

EL_INL size_t legacy_bytes(const int T) {
    switch (T) {
    case EL_TYPE_Q4_0: return sizeof(block_q4_0);
    case EL_TYPE_Q4_1: return sizeof(block_q4_1);
    case EL_TYPE_Q5_0: return sizeof(block_q5_0);
    case EL_TYPE_Q5_1: return sizeof(block_q5_1);
    default: return sizeof(block_q8_0);
    }
}

/* a weight block's 32 values as int8 (values 0..15 in w0, 16..31 in w1), as neon.c unpacks them */
EL_INL void legacy_unpack(const int T, const uint8_t *x, int8x16_t *w0, int8x16_t *w1) {
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    if (T == EL_TYPE_Q8_0) {
        *w0 = ld_s8(x + 2);
        *w1 = ld_s8(x + 18);
    } else if (T == EL_TYPE_Q4_0) {
        const uint8x16_t qs = vld1q_u8(x + 2);
        *w0 = vsubq_s8(as_s8(vandq_u8(qs, m4)), vdupq_n_s8(8));
        *w1 = vsubq_s8(as_s8(vshrq_n_u8(qs, 4)), vdupq_n_s8(8));
    } else if (T == EL_TYPE_Q4_1) {
        const uint8x16_t qs = vld1q_u8(x + 4);
        *w0 = as_s8(vandq_u8(qs, m4));
        *w1 = as_s8(vshrq_n_u8(qs, 4));
    } else if (T == EL_TYPE_Q5_0) {
        uint32_t qh;
        memcpy(&qh, x + 2, 4);
        const uint8x16_t qs = vld1q_u8(x + 6);
        *w0 = vsubq_s8(as_s8(vorrq_u8(vandq_u8(qs, m4), q5_high_bits(qh, 0))), vdupq_n_s8(16));
        *w1 = vsubq_s8(as_s8(vorrq_u8(vshrq_n_u8(qs, 4), q5_high_bits(qh, 1))), vdupq_n_s8(16));
    } else { /* Q5_1 */
        uint32_t qh;
        memcpy(&qh, x + 4, 4);
        const uint8x16_t qs = vld1q_u8(x + 8);
        *w0 = as_s8(vorrq_u8(vandq_u8(qs, m4), q5_high_bits(qh, 0)));
        *w1 = as_s8(vorrq_u8(vshrq_n_u8(qs, 4), q5_high_bits(qh, 1)));
    }
}

/* NR weight rows x 4 activation lanes. Per block: the activations' quants and scales are loaded
 * once, each row's block is unpacked once; lane j of row r's float update is vec_dot's
 * sumf += (float)sumi * (dw * da) (Q4_1 / Q5_1: sumf += (dw * da) * (float)sumi + mw * sa). */
EL_INL void legacy_tile(const int T, const int NR, size_t n, const void *w, size_t ws, const void *a, size_t as,
                        size_t nv, float *out, size_t ldo) {
    const int has_min = T == EL_TYPE_Q4_1 || T == EL_TYPE_Q5_1;
    const size_t wb = legacy_bytes(T), ab = has_min ? sizeof(block_q8_1) : sizeof(block_q8_0), aq = has_min ? 4 : 2;
    const uint8_t *ap[4];
    act_rows(a, as, nv, ap);
    float32x4_t sum[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    for (size_t i = 0; i < n / 32; i++) {
        const size_t ao = i * ab;
        int8x16_t a0[4], a1[4];
        UNROLL
        for (int j = 0; j < 4; j++) {
            a0[j] = ld_s8(ap[j] + ao + aq);
            a1[j] = ld_s8(ap[j] + ao + aq + 16);
        }
        const float32x4_t da = f16x4(ap, ao);
        const float32x4_t sa = has_min ? f16x4(ap, ao + 2) : vdupq_n_f32(0.0f);
        UNROLL
        for (int r = 0; r < NR; r++) {
            const uint8_t *x = (const uint8_t *)w + r * ws + i * wb;
            int8x16_t w0, w1;
            legacy_unpack(T, x, &w0, &w1);
            int32x4_t p[4];
            UNROLL
            for (int j = 0; j < 4; j++) {
#ifndef EL_NEON_DOTPROD
                /* Q8_0 weights reach -128: products up to 2^14, two of them overflow int16 */
                if (T == EL_TYPE_Q8_0) p[j] = dot_s8(dot_s8(vdupq_n_s32(0), w0, a0[j]), w1, a1[j]);
                else
#endif
                    p[j] = dot32s(w0, w1, a0[j], a1[j]);
            }
            const float32x4_t fi = vcvtq_f32_s32(hsum4(p[0], p[1], p[2], p[3]));
            const float32x4_t d = vmulq_n_f32(da, ld_f16(x));
            if (has_min) sum[r] = vaddq_f32(sum[r], vaddq_f32(vmulq_f32(d, fi), vmulq_n_f32(sa, ld_f16(x + 2))));
            else sum[r] = vaddq_f32(sum[r], vmulq_f32(fi, d));
        }
    }
    store_rows(sum, NR, nv, out, ldo);
}

#define LEGACY_ENTRIES(NAME, T)                                                                            \
    static void EL_FN(NAME##_nv)(size_t n, const void *w, const void *a, size_t as, size_t nv, float *out) { \
        legacy_tile(T, 1, n, w, 0, a, as, nv, out, 0);                                                     \
    }                                                                                                      \
    static void EL_FN(NAME##_tile)(size_t n, const void *w, size_t ws, const void *a, size_t as, size_t nv,  \
                                   float *out, size_t ldo) {                                               \
        legacy_tile(T, EL_TILE_ROWS, n, w, ws, a, as, nv, out, ldo);                                       \
    }

LEGACY_ENTRIES(q4_0, EL_TYPE_Q4_0)
LEGACY_ENTRIES(q4_1, EL_TYPE_Q4_1)
LEGACY_ENTRIES(q5_0, EL_TYPE_Q5_0)
LEGACY_ENTRIES(q5_1, EL_TYPE_Q5_1)
LEGACY_ENTRIES(q8_0, EL_TYPE_Q8_0)

/* ---------------- Q4_K / Q5_K x Q8_K: 8 sub-blocks of 32 with a scale and a min each ---------------- */

/* Per super-block and row r: isum = sum_s sc[s] * dot(sub-block s), summ = sum_s mn[s] * (activation
 * sum of sub-block s) in exact integers, then lane j gets vec_dot's sumf += d * isum - dmin * summ
 * with d = dw * da, dmin = dmw * da. Steps of 64 values: 4 weight registers per row. isum by summation
 * by parts over a running dot, as k16_tile below. */
EL_INL void k45_tile(const int T, const int NR, size_t n, const void *w, size_t ws, const void *a, size_t as,
                     size_t nv, float *out, size_t ldo) {
    const int q5 = T == EL_TYPE_Q5_K;
    const size_t wb = q5 ? sizeof(block_q5_K) : sizeof(block_q4_K);
    const size_t o_sc = q5 ? offsetof(block_q5_K, scales) : offsetof(block_q4_K, scales);
    const size_t o_qs = q5 ? offsetof(block_q5_K, qs) : offsetof(block_q4_K, qs);
    const size_t o_d = q5 ? offsetof(block_q5_K, d) : offsetof(block_q4_K, d);
    const size_t o_dmin = q5 ? offsetof(block_q5_K, dmin) : offsetof(block_q4_K, dmin);
    const uint8x16_t m4 = vdupq_n_u8(0x0F), one = vdupq_n_u8(1), two = vdupq_n_u8(2);
    const uint8_t *ap[4];
    act_rows(a, as, nv, ap);
    float32x4_t sum[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    for (size_t i = 0; i < n / QK_K; i++) {
        const size_t ao = i * sizeof(block_q8_K);
        const uint8_t *x[2];
        int32x4_t s03[2], s47[2], acc[2][4], run[2][4];
        uint8_t mn[2][8];
        uint8x16_t h0[2], h1[2];
        UNROLL
        for (int r = 0; r < NR; r++) {
            x[r] = (const uint8_t *)w + r * ws + i * wb;
            uint8_t sc[8];
            k4_scales_mins(x[r] + o_sc, sc, mn[r]);
            const int16x8_t s16 = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(sc)));
            widen_scales(scale_steps(s16, vdupq_n_s16(0)), &s03[r], &s47[r]);
            UNROLL
            for (int j = 0; j < 4; j++) acc[r][j] = run[r][j] = vdupq_n_s32(0);
            if (q5) {
                h0[r] = vld1q_u8(x[r] + offsetof(block_q5_K, qh));
                h1[r] = vld1q_u8(x[r] + offsetof(block_q5_K, qh) + 16);
            }
        }
        UNROLL
        for (int c = 0; c < QK_K / 64; c++) {
            /* low nibbles of 32 bytes are sub-block 2c, high nibbles 2c + 1 (Q5_K: plus bit 2c / 2c + 1
             * of qh, brought to bits 0 and 1 by a shift of 2 per step) */
            int8x16_t l0[2], l1[2], u0[2], u1[2];
            UNROLL
            for (int r = 0; r < NR; r++) {
                const uint8x16_t q0 = vld1q_u8(x[r] + o_qs + 32 * c), q1 = vld1q_u8(x[r] + o_qs + 32 * c + 16);
                if (q5) {
                    l0[r] = as_s8(vorrq_u8(vandq_u8(q0, m4), vshlq_n_u8(vandq_u8(h0[r], one), 4)));
                    l1[r] = as_s8(vorrq_u8(vandq_u8(q1, m4), vshlq_n_u8(vandq_u8(h1[r], one), 4)));
                    u0[r] = as_s8(vorrq_u8(vshrq_n_u8(q0, 4), vshlq_n_u8(vandq_u8(h0[r], two), 3)));
                    u1[r] = as_s8(vorrq_u8(vshrq_n_u8(q1, 4), vshlq_n_u8(vandq_u8(h1[r], two), 3)));
                    h0[r] = vshrq_n_u8(h0[r], 2);
                    h1[r] = vshrq_n_u8(h1[r], 2);
                } else {
                    l0[r] = as_s8(vandq_u8(q0, m4));
                    l1[r] = as_s8(vandq_u8(q1, m4));
                    u0[r] = as_s8(vshrq_n_u8(q0, 4));
                    u1[r] = as_s8(vshrq_n_u8(q1, 4));
                }
            }
            UNROLL
            for (int j = 0; j < 4; j++) {
                const uint8_t *aq = ap[j] + ao + Q8K_QS + 64 * c;
                const int8x16_t a0 = ld_s8(aq), a1 = ld_s8(aq + 16), a2 = ld_s8(aq + 32), a3 = ld_s8(aq + 48);
                UNROLL
                for (int r = 0; r < NR; r++) {
                    run[r][j] = dot32_run(run[r][j], l0[r], l1[r], a0, a1);
                    acc[r][j] = mla_sc(acc[r][j], run[r][j], s03[r], s47[r], 2 * c);
                    run[r][j] = dot32_run(run[r][j], u0[r], u1[r], a2, a3);
                    acc[r][j] = mla_sc(acc[r][j], run[r][j], s03[r], s47[r], 2 * c + 1);
                }
            }
        }
        /* the min terms: activation sums of the 8 sub-blocks (pairs of bsums), once per lane */
        int16x8_t pairs[4];
        UNROLL
        for (int j = 0; j < 4; j++) {
            const uint8_t *bs = ap[j] + ao + Q8K_BSUMS;
            pairs[j] = vpaddq_s16(vreinterpretq_s16_u8(vld1q_u8(bs)), vreinterpretq_s16_u8(vld1q_u8(bs + 16)));
        }
        const float32x4_t da = f32x4(ap, ao);
        UNROLL
        for (int r = 0; r < NR; r++) {
            const int16x8_t m = vreinterpretq_s16_u16(vmovl_u8(vld1_u8(mn[r])));
            int32x4_t ms[4];
            UNROLL
            for (int j = 0; j < 4; j++)
                ms[j] = vmlal_high_s16(vmull_s16(vget_low_s16(pairs[j]), vget_low_s16(m)), pairs[j], m);
            const float32x4_t fi = vcvtq_f32_s32(hsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
            const float32x4_t fm = vcvtq_f32_s32(hsum4(ms[0], ms[1], ms[2], ms[3]));
            const float32x4_t d = vmulq_n_f32(da, ld_f16(x[r] + o_d)), dmin = vmulq_n_f32(da, ld_f16(x[r] + o_dmin));
            sum[r] = vaddq_f32(sum[r], vsubq_f32(vmulq_f32(d, fi), vmulq_f32(dmin, fm)));
        }
    }
    store_rows(sum, NR, nv, out, ldo);
}

static void EL_FN(q4_K_nv)(size_t n, const void *w, const void *a, size_t as, size_t nv, float *out) {
    k45_tile(EL_TYPE_Q4_K, 1, n, w, 0, a, as, nv, out, 0);
}
#ifdef EL_NEON_DOTPROD
static void EL_FN(q4_K_tile)(size_t n, const void *w, size_t ws, const void *a, size_t as, size_t nv, float *out,
                             size_t ldo) {
    k45_tile(EL_TYPE_Q4_K, EL_TILE_ROWS, n, w, ws, a, as, nv, out, ldo);
}
#endif
static void EL_FN(q5_K_nv)(size_t n, const void *w, const void *a, size_t as, size_t nv, float *out) {
    k45_tile(EL_TYPE_Q5_K, 1, n, w, 0, a, as, nv, out, 0);
}

/* ---------------- Q2_K / Q3_K / Q6_K x Q8_K: 16 groups of 16 values with a scale each ---------------- */

/* Steps of 128 values: the 8 groups as int8 registers (group g = values 16g.. of the step, matching
 * the activation at 16g) and their 8 scales. Per row and super-block: Q3_K's unpacked scales and
 * high-bit mask, Q2_K's packed scales (low nibble scale, high nibble min). */
typedef struct {
    int8_t sc3[16];
    uint8x16_t hm0, hm1;
} k16_row;

EL_INL void k16_prepare(const int T, const uint8_t *x, k16_row *st) {
    if (T == EL_TYPE_Q3_K) {
        q3_K_scales(x + offsetof(block_q3_K, scales), st->sc3);
        st->hm0 = vld1q_u8(x + offsetof(block_q3_K, hmask));
        st->hm1 = vld1q_u8(x + offsetof(block_q3_K, hmask) + 16);
    }
}

EL_INL void k16_unpack(const int T, const uint8_t *x, const k16_row *st, int c, int8x16_t v[8]) {
    if (T == EL_TYPE_Q6_K) {
        /* the level's 2 high bits masked, then its nibble shifted in by sli (keeps the destination's
         * low nibble) or sri (keeps its high nibble), then the + 32 taken off */
        const uint8x16_t m3 = vdupq_n_u8(0x03), m30 = vdupq_n_u8(0x30);
        const int8x16_t k32 = vdupq_n_s8(32);
        const uint8_t *ql = x + offsetof(block_q6_K, ql) + 64 * c, *qh = x + offsetof(block_q6_K, qh) + 32 * c;
        const uint8x16_t l0 = vld1q_u8(ql), l1 = vld1q_u8(ql + 16), l2 = vld1q_u8(ql + 32), l3 = vld1q_u8(ql + 48);
        const uint8x16_t h0 = vld1q_u8(qh), h1 = vld1q_u8(qh + 16), h2 = vshrq_n_u8(h0, 2), h3 = vshrq_n_u8(h1, 2);
        v[4] = vsubq_s8(as_s8(vsriq_n_u8(vandq_u8(h0, m30), l0, 4)), k32);
        v[5] = vsubq_s8(as_s8(vsriq_n_u8(vandq_u8(h1, m30), l1, 4)), k32);
        v[6] = vsubq_s8(as_s8(vsriq_n_u8(vandq_u8(h2, m30), l2, 4)), k32);
        v[7] = vsubq_s8(as_s8(vsriq_n_u8(vandq_u8(h3, m30), l3, 4)), k32);
        v[0] = vsubq_s8(as_s8(vsliq_n_u8(l0, vandq_u8(h0, m3), 4)), k32);
        v[1] = vsubq_s8(as_s8(vsliq_n_u8(l1, vandq_u8(h1, m3), 4)), k32);
        v[2] = vsubq_s8(as_s8(vsliq_n_u8(l2, vandq_u8(h2, m3), 4)), k32);
        v[3] = vsubq_s8(as_s8(vsliq_n_u8(l3, vandq_u8(h3, m3), 4)), k32);
    } else if (T == EL_TYPE_Q3_K) {
        /* value 128c + 32j + l: bits 2j of qs[32c + l] minus 4 unless bit 4c + j of hmask[l] is set */
        const uint8x16_t m3 = vdupq_n_u8(3), four = vdupq_n_u8(4);
        uint8x16_t q0 = vld1q_u8(x + offsetof(block_q3_K, qs) + 32 * c);
        uint8x16_t q1 = vld1q_u8(x + offsetof(block_q3_K, qs) + 32 * c + 16);
        uint8x16_t bit = vdupq_n_u8((uint8_t)(1u << (4 * c)));
        UNROLL
        for (int j = 0; j < 4; j++) {
            v[2 * j] = vsubq_s8(as_s8(vandq_u8(q0, m3)), as_s8(vbicq_u8(four, vtstq_u8(st->hm0, bit))));
            v[2 * j + 1] = vsubq_s8(as_s8(vandq_u8(q1, m3)), as_s8(vbicq_u8(four, vtstq_u8(st->hm1, bit))));
            q0 = vshrq_n_u8(q0, 2);
            q1 = vshrq_n_u8(q1, 2);
            bit = vshlq_n_u8(bit, 1);
        }
    } else { /* Q2_K: value 128c + 32j + l = bits 2j of qs[32c + l] */
        const uint8x16_t m3 = vdupq_n_u8(3);
        const uint8x16_t q0 = vld1q_u8(x + offsetof(block_q2_K, qs) + 32 * c);
        const uint8x16_t q1 = vld1q_u8(x + offsetof(block_q2_K, qs) + 32 * c + 16);
        v[0] = as_s8(vandq_u8(q0, m3));
        v[1] = as_s8(vandq_u8(q1, m3));
        v[2] = as_s8(vandq_u8(vshrq_n_u8(q0, 2), m3));
        v[3] = as_s8(vandq_u8(vshrq_n_u8(q1, 2), m3));
        v[4] = as_s8(vandq_u8(vshrq_n_u8(q0, 4), m3));
        v[5] = as_s8(vandq_u8(vshrq_n_u8(q1, 4), m3));
        v[6] = as_s8(vshrq_n_u8(q0, 6));
        v[7] = as_s8(vshrq_n_u8(q1, 6));
    }
}

/* The 16 group scales of a super-block as int16: groups 0-7 in lo, 8-15 in hi */
EL_INL void k16_scales(const int T, const uint8_t *x, const k16_row *st, int16x8_t *lo, int16x8_t *hi) {
    if (T == EL_TYPE_Q6_K || T == EL_TYPE_Q3_K) {
        const int8x16_t s = T == EL_TYPE_Q6_K ? vld1q_s8((const int8_t *)(x + offsetof(block_q6_K, scales))) : vld1q_s8(st->sc3);
        *lo = vmovl_s8(vget_low_s8(s));
        *hi = vmovl_high_s8(s);
    } else {
        const uint8x16_t sc = vandq_u8(vld1q_u8(x + offsetof(block_q2_K, scales)), vdupq_n_u8(0x0F));
        *lo = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(sc)));
        *hi = vreinterpretq_s16_u16(vmovl_high_u8(sc));
    }
}

/* Per super-block and row: isum = sum_g scale[g] * dot(group g) exact; Q2_K also summ = sum_s
 * bsums[s] * min[s]. Lane j then gets vec_dot's float update: Q3_K / Q6_K sumf += (dw * da) * isum,
 * Q2_K sumf += (da * dw) * isum - (da * dmw) * summ.
 * isum by summation by parts: with the running dot R_g = dot(groups 0..g) (one sdot into a running
 * register, none zeroed per group), sum_g s_g (R_g - R_(g-1)) = sum_g R_g (s_g - s_(g+1)), s_16 = 0.
 * The same integer (the partial sums may wrap in int32; the total, below 2^31, comes out exact). */
EL_INL void k16_tile(const int T, const int NR, size_t n, const void *w, size_t ws, const void *a, size_t as,
                     size_t nv, float *out, size_t ldo) {
    const size_t wb = T == EL_TYPE_Q6_K   ? sizeof(block_q6_K)
                      : T == EL_TYPE_Q3_K ? sizeof(block_q3_K)
                                          : sizeof(block_q2_K);
    const size_t o_d = T == EL_TYPE_Q6_K ? offsetof(block_q6_K, d)
                       : T == EL_TYPE_Q3_K ? offsetof(block_q3_K, d) : offsetof(block_q2_K, d);
    const uint8_t *ap[4];
    act_rows(a, as, nv, ap);
    float32x4_t sum[2] = {vdupq_n_f32(0.0f), vdupq_n_f32(0.0f)};
    for (size_t i = 0; i < n / QK_K; i++) {
        const size_t ao = i * sizeof(block_q8_K);
        const uint8_t *x[2];
        k16_row st[2];
        int32x4_t acc[2][4], run[2][4];
        int16x8_t dif[2][2]; /* s_g - s_(g+1): groups 0-7, 8-15 */
        UNROLL
        for (int r = 0; r < NR; r++) {
            x[r] = (const uint8_t *)w + r * ws + i * wb;
            k16_prepare(T, x[r], &st[r]);
            int16x8_t lo, hi;
            k16_scales(T, x[r], &st[r], &lo, &hi);
            dif[r][0] = scale_steps(lo, hi);
            dif[r][1] = scale_steps(hi, vdupq_n_s16(0));
            UNROLL
            for (int j = 0; j < 4; j++) acc[r][j] = run[r][j] = vdupq_n_s32(0);
        }
        UNROLL
        for (int c = 0; c < QK_K / 128; c++) {
            int8x16_t v[2][8];
            int32x4_t s03[2], s47[2];
            UNROLL
            for (int r = 0; r < NR; r++) {
                k16_unpack(T, x[r], &st[r], c, v[r]);
                widen_scales(dif[r][c], &s03[r], &s47[r]);
            }
            UNROLL
            for (int j = 0; j < 4; j++) {
                const uint8_t *aq = ap[j] + ao + Q8K_QS + 128 * c;
                UNROLL
                for (int g = 0; g < 8; g++) {
                    const int8x16_t av = ld_s8(aq + 16 * g);
                    UNROLL
                    for (int r = 0; r < NR; r++) {
                        run[r][j] = dot16_run(run[r][j], v[r][g], av);
                        acc[r][j] = mla_sc(acc[r][j], run[r][j], s03[r], s47[r], g);
                    }
                }
            }
        }
        const float32x4_t da = f32x4(ap, ao);
        int16x8_t b0[4], b1[4];
        if (T == EL_TYPE_Q2_K)
            UNROLL
            for (int j = 0; j < 4; j++) {
                b0[j] = vreinterpretq_s16_u8(vld1q_u8(ap[j] + ao + Q8K_BSUMS));
                b1[j] = vreinterpretq_s16_u8(vld1q_u8(ap[j] + ao + Q8K_BSUMS + 16));
            }
        UNROLL
        for (int r = 0; r < NR; r++) {
            const float32x4_t fi = vcvtq_f32_s32(hsum4(acc[r][0], acc[r][1], acc[r][2], acc[r][3]));
            const float32x4_t d = vmulq_n_f32(da, ld_f16(x[r] + o_d));
            if (T == EL_TYPE_Q2_K) {
                const uint8x16_t mins = vshrq_n_u8(vld1q_u8(x[r] + offsetof(block_q2_K, scales)), 4);
                const int16x8_t mlo = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mins)));
                const int16x8_t mhi = vreinterpretq_s16_u16(vmovl_high_u8(mins));
                int32x4_t ms[4];
                UNROLL
                for (int j = 0; j < 4; j++) {
                    int32x4_t t = vmull_s16(vget_low_s16(b0[j]), vget_low_s16(mlo));
                    t = vmlal_high_s16(t, b0[j], mlo);
                    t = vmlal_s16(t, vget_low_s16(b1[j]), vget_low_s16(mhi));
                    ms[j] = vmlal_high_s16(t, b1[j], mhi);
                }
                const float32x4_t fm = vcvtq_f32_s32(hsum4(ms[0], ms[1], ms[2], ms[3]));
                const float32x4_t dmin = vmulq_n_f32(da, ld_f16(x[r] + offsetof(block_q2_K, dmin)));
                sum[r] = vaddq_f32(sum[r], vsubq_f32(vmulq_f32(d, fi), vmulq_f32(dmin, fm)));
            } else {
                sum[r] = vaddq_f32(sum[r], vmulq_f32(d, fi));
            }
        }
    }
    store_rows(sum, NR, nv, out, ldo);
}

static void EL_FN(q2_K_nv)(size_t n, const void *w, const void *a, size_t as, size_t nv, float *out) {
    k16_tile(EL_TYPE_Q2_K, 1, n, w, 0, a, as, nv, out, 0);
}
static void EL_FN(q3_K_nv)(size_t n, const void *w, const void *a, size_t as, size_t nv, float *out) {
    k16_tile(EL_TYPE_Q3_K, 1, n, w, 0, a, as, nv, out, 0);
}
static void EL_FN(q6_K_nv)(size_t n, const void *w, const void *a, size_t as, size_t nv, float *out) {
    k16_tile(EL_TYPE_Q6_K, 1, n, w, 0, a, as, nv, out, 0);
}

/* ---------------- the filler (one per variant; the plain one picks) ---------------- */

#ifdef EL_NEON_DOTPROD
void el_neon_batch_fill_dotprod(el_kernels *k);
void el_neon_batch_fill_dotprod(el_kernels *k)
#else
static void fill_plain(el_kernels *k)
#endif
{
    k->vec_dot_nv[EL_TYPE_Q4_0] = EL_FN(q4_0_nv);
    k->vec_dot_nv[EL_TYPE_Q4_1] = EL_FN(q4_1_nv);
    k->vec_dot_nv[EL_TYPE_Q5_0] = EL_FN(q5_0_nv);
    k->vec_dot_nv[EL_TYPE_Q5_1] = EL_FN(q5_1_nv);
    k->vec_dot_nv[EL_TYPE_Q8_0] = EL_FN(q8_0_nv);
    k->vec_dot_nv[EL_TYPE_Q2_K] = EL_FN(q2_K_nv);
    k->vec_dot_nv[EL_TYPE_Q3_K] = EL_FN(q3_K_nv);
    k->vec_dot_nv[EL_TYPE_Q4_K] = EL_FN(q4_K_nv);
    k->vec_dot_nv[EL_TYPE_Q5_K] = EL_FN(q5_K_nv);
    k->vec_dot_nv[EL_TYPE_Q6_K] = EL_FN(q6_K_nv);
    k->vec_dot_tile[EL_TYPE_Q4_0] = EL_FN(q4_0_tile);
    k->vec_dot_tile[EL_TYPE_Q4_1] = EL_FN(q4_1_tile);
    k->vec_dot_tile[EL_TYPE_Q5_0] = EL_FN(q5_0_tile);
    k->vec_dot_tile[EL_TYPE_Q5_1] = EL_FN(q5_1_tile);
    k->vec_dot_tile[EL_TYPE_Q8_0] = EL_FN(q8_0_tile);
#ifdef EL_NEON_DOTPROD
    /* without dotprod each 32-value dot needs an int16 temporary, and two rows of Q4_K spill
     * (about 160 instructions per output and super-block against 112 for the nv kernel) */
    k->vec_dot_tile[EL_TYPE_Q4_K] = EL_FN(q4_K_tile);
#endif
}

#ifndef EL_NEON_DOTPROD
void el_neon_batch_fill_dotprod(el_kernels *k); /* neon_batch_dotprod.c */

void el_kernels_fill_neon_batch(el_kernels *k, int dotprod) {
    if (dotprod) el_neon_batch_fill_dotprod(k);
    else fill_plain(k);
}
#endif

#endif /* __aarch64__ */

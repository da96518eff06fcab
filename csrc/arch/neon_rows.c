/* arch/neon_rows.c - vec_dot_rows for NEON (decode's matvec): EL_MV_ROWS = 4 weight rows against one
 * activation row. Each activation vector is loaded once for the 4 rows, the 4 rows' integer sums are
 * gathered into one vector by pairwise adds, and the per-block float update runs once for the 4 rows
 * as lanes of one vector. Compiled twice like neon.c: plain (A72) and, through neon_rows_dotprod.c,
 * with EL_NEON_DOTPROD (vdotq_s32, A76).
 *
 * Exactness (the contract of dispatch.h: out[r] has the bits of vec_dot on row r): the integer sums
 * are exact (only their association differs, which integers do not see), and lane r of every float
 * vector operation computes the very expression neon.c / the scalar reference compute for row r, in
 * the same order, without contraction (the float vector operations here are separate multiplies and
 * adds; each lane is an IEEE single operation like the scalar one). */
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

#define R EL_MV_ROWS
#if EL_MV_ROWS != 4
#error "neon_rows.c gathers exactly 4 rows per vector"
#endif

/* ---------------- shared steps ---------------- */

/* [sum of p0's lanes, p1's, p2's, p3's] */
static inline int32x4_t hsum4(const int32x4_t p[4]) {
    return vpaddq_s32(vpaddq_s32(p[0], p[1]), vpaddq_s32(p[2], p[3]));
}

typedef uint16_t u16_unaligned __attribute__((aligned(1), may_alias));

/* the F16 at byte off of each row's block, as 4 float lanes (exact) */
static inline float32x4_t ld_f16_rows(const uint8_t *const p[4], size_t off) {
    uint16x4_t h = vdup_n_u16(0);
    h = vset_lane_u16(*(const u16_unaligned *)(p[0] + off), h, 0);
    h = vset_lane_u16(*(const u16_unaligned *)(p[1] + off), h, 1);
    h = vset_lane_u16(*(const u16_unaligned *)(p[2] + off), h, 2);
    h = vset_lane_u16(*(const u16_unaligned *)(p[3] + off), h, 3);
    return vcvt_f32_f16(vreinterpret_f16_u16(h));
}

/* Sum of the 32 products w0 * a0 + w1 * a1 added to acc, for weights with |w| <= 63: without dotprod,
 * 4 products per 16-bit lane stay below 2^15 (4 * 63 * 128), so one widening step serves 32 values. */
static inline int32x4_t dot32_small(int32x4_t acc, int8x16_t w0, int8x16_t a0, int8x16_t w1, int8x16_t a1) {
#ifdef EL_NEON_DOTPROD
    return vdotq_s32(vdotq_s32(acc, w0, a0), w1, a1);
#else
    int16x8_t p = vmull_s8(vget_low_s8(w0), vget_low_s8(a0));
    p = vmlal_high_s8(p, w0, a0);
    p = vmlal_s8(p, vget_low_s8(w1), vget_low_s8(a1));
    p = vmlal_high_s8(p, w1, a1);
    return vpadalq_s16(acc, p);
#endif
}

/* acc += sc * (sum of the 32 products w0 * a0 + w1 * a1), |w| <= 63 */
static inline int32x4_t dot32_scaled(int32x4_t acc, int8x16_t w0, int8x16_t a0, int8x16_t w1, int8x16_t a1,
                                     int32_t sc) {
#ifdef EL_NEON_DOTPROD
    return vmlaq_n_s32(acc, vdotq_s32(vdotq_s32(vdupq_n_s32(0), w0, a0), w1, a1), sc);
#else
    int16x8_t p = vmull_s8(vget_low_s8(w0), vget_low_s8(a0));
    p = vmlal_high_s8(p, w0, a0);
    p = vmlal_s8(p, vget_low_s8(w1), vget_low_s8(a1));
    p = vmlal_high_s8(p, w1, a1);
    acc = vmlal_n_s16(acc, vget_low_s16(p), (int16_t)sc);
    return vmlal_high_n_s16(acc, p, (int16_t)sc);
#endif
}

/* acc += sc * (sum of the 16 products w * a), |w| <= 63, sc an int8 */
static inline int32x4_t dot16_scaled(int32x4_t acc, int8x16_t w, int8x16_t a, int32_t sc) {
#ifdef EL_NEON_DOTPROD
    return vmlaq_n_s32(acc, vdotq_s32(vdupq_n_s32(0), w, a), sc);
#else
    const int16x8_t p = vmlal_high_s8(vmull_s8(vget_low_s8(w), vget_low_s8(a)), w, a);
    acc = vmlal_n_s16(acc, vget_low_s16(p), (int16_t)sc);
    return vmlal_high_n_s16(acc, p, (int16_t)sc);
#endif
}

/* sum of the 32 int8 activations of a block (|sum| <= 4096) */
static inline int32_t sum32(int8x16_t a0, int8x16_t a1) {
    return vaddvq_s16(vaddq_s16(vpaddlq_s8(a0), vpaddlq_s8(a1)));
}

/* the row pointers: row r's blocks start at w + r * ws; next() moves all 4 to their next block */
static inline void rows_at(const void *w, size_t ws, const uint8_t *p[4]) {
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) p[r] = (const uint8_t *)w + r * ws;
}
static inline void next(const uint8_t *p[4], size_t block_bytes) {
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) p[r] += block_bytes;
}

/* ---------------- 32-value blocks ---------------- */

/* Per row a running int32 accumulator for the whole row (no zeroing per block): a block's 4 sums are
 * the difference of the gathered running totals after and before it. The lanes wrap modulo 2^32 on
 * very long rows, and so does the difference (unsigned), which is then the exact block sum: that fits
 * int32 by far (32 products). */
static inline int32x4_t block_sums(const int32x4_t acc[4], uint32x4_t *prev) {
    const uint32x4_t t = vreinterpretq_u32_s32(hsum4(acc));
    const int32x4_t s = vreinterpretq_s32_u32(vsubq_u32(t, *prev));
    *prev = t;
    return s;
}

/* The first 2 / 4 bytes of each row's block as lanes (the F16 scale, or Q4_1's scale and min), each row
 * pointer then moved on by block_bytes: one post-indexed lane load per row (GCC would spend an address
 * add per lane load). The "memory" clobber keeps the block's other loads before it (else GCC hoists
 * the asm and copies the pointers). */
static inline uint16x4_t ld_u16_rows_next(const uint8_t *p[4], size_t block_bytes) {
    uint16x4_t h;
    __asm__("ld1 {%0.h}[0], [%1], %5\n\tld1 {%0.h}[1], [%2], %5\n\tld1 {%0.h}[2], [%3], %5\n\tld1 {%0.h}[3], [%4], %5"
            : "=&w"(h), "+r"(p[0]), "+r"(p[1]), "+r"(p[2]), "+r"(p[3])
            : "r"(block_bytes)
            : "memory");
    return h;
}
static inline uint32x4_t ld_u32_rows_next(const uint8_t *p[4], size_t block_bytes) {
    uint32x4_t v;
    __asm__("ld1 {%0.s}[0], [%1], %5\n\tld1 {%0.s}[1], [%2], %5\n\tld1 {%0.s}[2], [%3], %5\n\tld1 {%0.s}[3], [%4], %5"
            : "=&w"(v), "+r"(p[0]), "+r"(p[1]), "+r"(p[2]), "+r"(p[3])
            : "r"(block_bytes)
            : "memory");
    return v;
}
static inline float32x4_t f16_lanes(uint16x4_t h) { return vcvt_f32_f16(vreinterpret_f16_u16(h)); }

/* row r: sumf += (float)sumi * (d_w * d_a) */
static inline float32x4_t q_0_update(float32x4_t sumf, uint16x4_t dw, const uint8_t *pa, int32x4_t sumi) {
    return vaddq_f32(sumf, vmulq_f32(vcvtq_f32_s32(sumi), vmulq_n_f32(f16_lanes(dw), ld_f16(pa))));
}
/* row r: sumf += (d_w * d_a) * (float)sumi + m_w * s_a, dm = the rows' (d, m) pairs */
static inline float32x4_t q_1_update(float32x4_t sumf, uint16x8_t dm, const uint8_t *pa, int32x4_t sumi) {
    const uint16x8_t dd = vuzp1q_u16(dm, dm), mm = vuzp2q_u16(dm, dm);
    const float32x4_t d = vmulq_n_f32(f16_lanes(vget_low_u16(dd)), ld_f16(pa));
    const float32x4_t m = vmulq_n_f32(f16_lanes(vget_low_u16(mm)), ld_f16(pa + 2));
    return vaddq_f32(sumf, vaddq_f32(vmulq_f32(d, vcvtq_f32_s32(sumi)), m));
}

#ifdef EL_NEON_DOTPROD
/* Q8_0 with dotprod in assembly: gemma3's output head is a 262k-row Q8_0 matrix, the largest part of its
 * decode. The same operations as the intrinsics below, but GCC copies the loop-carried row pointers
 * and accumulators each iteration (about 7.3 instructions per row-block here, against 11). Every pointer
 * walks its block in two post-indexed loads: the F16 scale (a lane load, #2), then the 32 int8 as one
 * load pair (#32, which ldp's immediate can encode where 34 cannot). Per block: the 4 rows' running
 * sums (sdot), gathered (addp) less the previous totals = the block sums (block_sums); lane r: sumf +=
 * (float)sumi * (d_w * d_a). */
#define Q8_0_ROWS_BLOCK(T, P) \
    "ldr h18, [%[pa]], #2\n\t" \
    "ldp q16, q17, [%[pa]], #32\n\t" \
    "ld1 {v19.h}[0], [%[p0]], #2\n\t" \
    "ldp q0, q1, [%[p0]], #32\n\t" \
    "ld1 {v19.h}[1], [%[p1]], #2\n\t" \
    "ldp q2, q3, [%[p1]], #32\n\t" \
    "ld1 {v19.h}[2], [%[p2]], #2\n\t" \
    "ldp q4, q5, [%[p2]], #32\n\t" \
    "ld1 {v19.h}[3], [%[p3]], #2\n\t" \
    "ldp q6, q7, [%[p3]], #32\n\t" \
    "sdot %[c0].4s, v0.16b, v16.16b\n\t" \
    "sdot %[c1].4s, v2.16b, v16.16b\n\t" \
    "sdot %[c2].4s, v4.16b, v16.16b\n\t" \
    "sdot %[c3].4s, v6.16b, v16.16b\n\t" \
    "sdot %[c0].4s, v1.16b, v17.16b\n\t" \
    "sdot %[c1].4s, v3.16b, v17.16b\n\t" \
    "sdot %[c2].4s, v5.16b, v17.16b\n\t" \
    "sdot %[c3].4s, v7.16b, v17.16b\n\t" \
    "addp v24.4s, %[c0].4s, %[c1].4s\n\t" \
    "addp v25.4s, %[c2].4s, %[c3].4s\n\t" \
    "addp " T ".4s, v24.4s, v25.4s\n\t" \
    "sub v25.4s, " T ".4s, " P ".4s\n\t" \
    "fcvt s18, h18\n\t" \
    "fcvtl v19.4s, v19.4h\n\t" \
    "fmul v19.4s, v19.4s, v18.s[0]\n\t" \
    "scvtf v25.4s, v25.4s\n\t" \
    "fmul v25.4s, v25.4s, v19.4s\n\t" \
    "fadd %[sumf].4s, %[sumf].4s, v25.4s\n\t"
static void q8_0_rows_dotprod(size_t n, const void *w, size_t ws, const void *a, float *out) {
    const size_t nb = n / QK8_0;
    _Static_assert(sizeof(block_q8_0) == 2 + 32, "the loads below walk a block as its F16 scale, then 32 bytes");
    float32x4_t sumf = vdupq_n_f32(0.0f);
    if (nb) {
        const uint8_t *p0 = w, *p1 = p0 + ws, *p2 = p1 + ws, *p3 = p2 + ws, *pa = a;
        const uint8_t *end = pa + nb * sizeof(block_q8_0);
        int32x4_t c0 = vdupq_n_s32(0), c1 = c0, c2 = c0, c3 = c0, prev = c0;
        /* an odd block first, then 2 blocks per iteration: the gathered totals alternate between prev
         * and v26, so no copy of them and one loop test per 2 blocks */
        __asm__("tbz %[nb], #0, 1f\n\t"
                Q8_0_ROWS_BLOCK("v26", "%[prev]")
                "mov %[prev].16b, v26.16b\n\t"
                "cmp %[pa], %[end]\n\t"
                "b.eq 2f\n\t"
                "1:\n\t"
                Q8_0_ROWS_BLOCK("v26", "%[prev]")
                Q8_0_ROWS_BLOCK("%[prev]", "v26")
                "cmp %[pa], %[end]\n\t"
                "b.ne 1b\n\t"
                "2:"
                : [p0] "+r"(p0), [p1] "+r"(p1), [p2] "+r"(p2), [p3] "+r"(p3), [pa] "+r"(pa), [c0] "+w"(c0),
                  [c1] "+w"(c1), [c2] "+w"(c2), [c3] "+w"(c3), [prev] "+w"(prev), [sumf] "+w"(sumf)
                : [end] "r"(end), [nb] "r"(nb)
                : "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v16", "v17", "v18", "v19", "v24", "v25", "v26",
                  "cc", "memory");
    }
    vst1q_f32(out, sumf);
}
#undef Q8_0_ROWS_BLOCK
#else
static void EL_FN(q8_0_rows)(size_t n, const void *w, size_t ws, const void *a, float *out) {
    const uint8_t *pa = a, *p[4];
    rows_at(w, ws, p);
    float32x4_t sumf = vdupq_n_f32(0.0f);
    int32x4_t acc[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
    uint32x4_t prev = vdupq_n_u32(0);
    for (size_t i = 0; i < n / QK8_0; i++, pa += sizeof(block_q8_0)) {
        const int8x16_t a0 = ld_s8(pa + 2), a1 = ld_s8(pa + 18);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) acc[r] = dot_s8(dot_s8(acc[r], ld_s8(p[r] + 2), a0), ld_s8(p[r] + 18), a1);
        const uint16x4_t dw = ld_u16_rows_next(p, sizeof(block_q8_0));
        sumf = q_0_update(sumf, dw, pa, block_sums(acc, &prev));
    }
    vst1q_f32(out, sumf);
}
#endif

/* Q4_0 levels are stored + 8: sum (q - 8) a = sum q a - 8 sum a, the second term shared by the 4 rows
 * (exact integers, so the same sumi as the reference) */
static void EL_FN(q4_0_rows)(size_t n, const void *w, size_t ws, const void *a, float *out) {
    const uint8_t *pa = a, *p[4];
    rows_at(w, ws, p);
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    float32x4_t sumf = vdupq_n_f32(0.0f);
    int32x4_t acc[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
    uint32x4_t prev = vdupq_n_u32(0);
    for (size_t i = 0; i < n / QK4_0; i++, pa += sizeof(block_q8_0)) {
        const int8x16_t a0 = ld_s8(pa + 2), a1 = ld_s8(pa + 18);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8x16_t qs = vld1q_u8(p[r] + 2);
            acc[r] = dot32_small(acc[r], as_s8(vandq_u8(qs, m4)), a0, as_s8(vshrq_n_u8(qs, 4)), a1);
        }
        const uint16x4_t dw = ld_u16_rows_next(p, sizeof(block_q4_0));
        const int32x4_t sumi = vsubq_s32(block_sums(acc, &prev), vdupq_n_s32(8 * sum32(a0, a1)));
        sumf = q_0_update(sumf, dw, pa, sumi);
    }
    vst1q_f32(out, sumf);
}

static void EL_FN(q4_1_rows)(size_t n, const void *w, size_t ws, const void *a, float *out) {
    const uint8_t *pa = a, *p[4];
    rows_at(w, ws, p);
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    float32x4_t sumf = vdupq_n_f32(0.0f);
    int32x4_t acc[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
    uint32x4_t prev = vdupq_n_u32(0);
    for (size_t i = 0; i < n / QK4_1; i++, pa += sizeof(block_q8_1)) {
        const int8x16_t a0 = ld_s8(pa + 4), a1 = ld_s8(pa + 20);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8x16_t qs = vld1q_u8(p[r] + 4);
            acc[r] = dot32_small(acc[r], as_s8(vandq_u8(qs, m4)), a0, as_s8(vshrq_n_u8(qs, 4)), a1);
        }
        const uint16x8_t dm = vreinterpretq_u16_u32(ld_u32_rows_next(p, sizeof(block_q4_1)));
        sumf = q_1_update(sumf, dm, pa, block_sums(acc, &prev));
    }
    vst1q_f32(out, sumf);
}

/* Q5_0 / Q5_1: the first 8 bytes of rows 0, 1 (and 2, 3) in one vector hold the scales and the qh words.
 * With the qh bits inverted, t = 0xFF where a value's 5th bit is clear; shift-left-insert of t by 4
 * over the nibble gives nibble | 0xF0 = nibble - 16 there and the nibble elsewhere: level - 16 as an
 * int8 in one instruction, which is Q5_0's weight and Q5_1's less 16 (added back as 16 sum a). */
static inline void q5_rows_head(const uint8_t *const p[4], uint8x16_t *h01, uint8x16_t *h23) {
    *h01 = vcombine_u8(vld1_u8(p[0]), vld1_u8(p[1]));
    *h23 = vcombine_u8(vld1_u8(p[2]), vld1_u8(p[3]));
}
/* value j's inverted 5th bit as 0xFF / 0, for values 16 half .. 16 half + 15 of the row whose qh word is
 * at byte qh_at of the inverted head nh */
static inline uint8x16_t q5_clear_mask(uint8x16_t nh, const uint8x16_t idx, uint8x16_t bits) {
    return vtstq_u8(vqtbl1q_u8(nh, idx), bits);
}
static inline uint8x16_t q5_idx(int at) { /* bytes at (8 lanes) and at + 1 (8 lanes) */
    return vcombine_u8(vdup_n_u8((uint8_t)at), vdup_n_u8((uint8_t)(at + 1)));
}

#ifdef EL_NEON_DOTPROD
/* Q5_0 with dotprod in assembly (gemma3's FFN matrices): the steps of the intrinsics below, without the
 * register copies GCC adds around the destructive sli, and with post-indexed loads: each row's head (8
 * bytes from the block start: scale, qh and 2 qs bytes) moves the pointer on by 6, its 16 qs bytes by
 * 16 (22 = a block); rows 1 and 3 go to the high half of the head vectors with a lane load. */
#define Q5_0_ROWS_BLOCK(T, P) \
    "ldr h18, [%[pa]], #2\n\t" \
    "ldp q16, q17, [%[pa]], #32\n\t" \
    "ldr d0, [%[p0]], #6\n\t" \
    "ld1 {v0.d}[1], [%[p1]], %[six]\n\t" \
    "ldr d1, [%[p2]], #6\n\t" \
    "ld1 {v1.d}[1], [%[p3]], %[six]\n\t" \
    "ldr q24, [%[p0]], #16\n\t" \
    "ldr q25, [%[p1]], #16\n\t" \
    "ldr q26, [%[p2]], #16\n\t" \
    "ldr q27, [%[p3]], #16\n\t" \
    "mvn v2.16b, v0.16b\n\t" \
    "mvn v3.16b, v1.16b\n\t" \
    /* the 4 scales: halves 0 and 4 of each head vector */ \
    "uzp1 v0.8h, v0.8h, v1.8h\n\t" \
    "uzp1 v0.8h, v0.8h, v0.8h\n\t" \
    "ushr v28.16b, v24.16b, #4\n\t" \
    "ushr v29.16b, v25.16b, #4\n\t" \
    "ushr v30.16b, v26.16b, #4\n\t" \
    "ushr v31.16b, v27.16b, #4\n\t" \
    /* rows 0, 1: 0xFF where a value's 5th bit is clear, inserted above the nibbles */ \
    "tbl v5.16b, {v2.16b}, %[i00].16b\n\t" \
    "tbl v6.16b, {v2.16b}, %[i01].16b\n\t" \
    "tbl v7.16b, {v2.16b}, %[i10].16b\n\t" \
    "tbl v19.16b, {v2.16b}, %[i11].16b\n\t" \
    "cmtst v5.16b, v5.16b, %[bits].16b\n\t" \
    "cmtst v6.16b, v6.16b, %[bits].16b\n\t" \
    "cmtst v7.16b, v7.16b, %[bits].16b\n\t" \
    "cmtst v19.16b, v19.16b, %[bits].16b\n\t" \
    "sli v24.16b, v5.16b, #4\n\t" \
    "sli v28.16b, v6.16b, #4\n\t" \
    "sli v25.16b, v7.16b, #4\n\t" \
    "sli v29.16b, v19.16b, #4\n\t" \
    /* rows 2, 3 */ \
    "tbl v5.16b, {v3.16b}, %[i00].16b\n\t" \
    "tbl v6.16b, {v3.16b}, %[i01].16b\n\t" \
    "tbl v7.16b, {v3.16b}, %[i10].16b\n\t" \
    "tbl v19.16b, {v3.16b}, %[i11].16b\n\t" \
    "cmtst v5.16b, v5.16b, %[bits].16b\n\t" \
    "cmtst v6.16b, v6.16b, %[bits].16b\n\t" \
    "cmtst v7.16b, v7.16b, %[bits].16b\n\t" \
    "cmtst v19.16b, v19.16b, %[bits].16b\n\t" \
    "sli v26.16b, v5.16b, #4\n\t" \
    "sli v30.16b, v6.16b, #4\n\t" \
    "sli v27.16b, v7.16b, #4\n\t" \
    "sli v31.16b, v19.16b, #4\n\t" \
    "sdot %[c0].4s, v24.16b, v16.16b\n\t" \
    "sdot %[c1].4s, v25.16b, v16.16b\n\t" \
    "sdot %[c2].4s, v26.16b, v16.16b\n\t" \
    "sdot %[c3].4s, v27.16b, v16.16b\n\t" \
    "sdot %[c0].4s, v28.16b, v17.16b\n\t" \
    "sdot %[c1].4s, v29.16b, v17.16b\n\t" \
    "sdot %[c2].4s, v30.16b, v17.16b\n\t" \
    "sdot %[c3].4s, v31.16b, v17.16b\n\t" \
    "addp v2.4s, %[c0].4s, %[c1].4s\n\t" \
    "addp v3.4s, %[c2].4s, %[c3].4s\n\t" \
    "addp " T ".4s, v2.4s, v3.4s\n\t" \
    "sub v3.4s, " T ".4s, " P ".4s\n\t" \
    "fcvt s18, h18\n\t" \
    "fcvtl v0.4s, v0.4h\n\t" \
    "fmul v0.4s, v0.4s, v18.s[0]\n\t" \
    "scvtf v3.4s, v3.4s\n\t" \
    "fmul v3.4s, v3.4s, v0.4s\n\t" \
    "fadd %[sumf].4s, %[sumf].4s, v3.4s\n\t"
static void q5_0_rows_dotprod(size_t n, const void *w, size_t ws, const void *a, float *out) {
    const size_t nb = n / QK5_0;
    _Static_assert(sizeof(block_q5_0) == 2 + 4 + 16, "the loads below walk a block as 6 head bytes, then 16");
    _Static_assert(sizeof(block_q8_0) == 2 + 32, "the loads below walk a block as its F16 scale, then 32 bytes");
    static const uint8_t bit_tab[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t bits = vld1q_u8(bit_tab);
    /* qh at bytes 2..5 of a block: values 0..15 from bytes 2, 3, values 16..31 from 4, 5; row 1 / 3 + 8 */
    const uint8x16_t i00 = q5_idx(2), i01 = q5_idx(4), i10 = q5_idx(10), i11 = q5_idx(12);
    float32x4_t sumf = vdupq_n_f32(0.0f);
    if (nb) {
        const uint8_t *p0 = w, *p1 = p0 + ws, *p2 = p1 + ws, *p3 = p2 + ws, *pa = a;
        const uint8_t *end = pa + nb * sizeof(block_q8_0);
        const size_t six = 6;
        int32x4_t c0 = vdupq_n_s32(0), c1 = c0, c2 = c0, c3 = c0, prev = c0;
        /* as in q8_0_rows_dotprod: an odd block first, then 2 per step, the totals alternating registers */
        __asm__("tbz %[nb], #0, 1f\n\t"
                Q5_0_ROWS_BLOCK("v4", "%[prev]")
                "mov %[prev].16b, v4.16b\n\t"
                "cmp %[pa], %[end]\n\t"
                "b.eq 2f\n\t"
                "1:\n\t"
                Q5_0_ROWS_BLOCK("v4", "%[prev]")
                Q5_0_ROWS_BLOCK("%[prev]", "v4")
                "cmp %[pa], %[end]\n\t"
                "b.ne 1b\n\t"
                "2:"
                : [p0] "+r"(p0), [p1] "+r"(p1), [p2] "+r"(p2), [p3] "+r"(p3), [pa] "+r"(pa), [c0] "+w"(c0),
                  [c1] "+w"(c1), [c2] "+w"(c2), [c3] "+w"(c3), [prev] "+w"(prev), [sumf] "+w"(sumf)
                : [end] "r"(end), [nb] "r"(nb), [six] "r"(six), [bits] "w"(bits), [i00] "w"(i00), [i01] "w"(i01),
                  [i10] "w"(i10), [i11] "w"(i11)
                : "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v16", "v17", "v18", "v19", "v24", "v25", "v26",
                  "v27", "v28", "v29", "v30", "v31", "cc", "memory");
    }
    vst1q_f32(out, sumf);
}
#undef Q5_0_ROWS_BLOCK
#else
static void EL_FN(q5_0_rows)(size_t n, const void *w, size_t ws, const void *a, float *out) {
    const uint8_t *pa = a, *p[4];
    rows_at(w, ws, p);
    static const uint8_t bit_tab[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t bits = vld1q_u8(bit_tab);
    /* qh at bytes 2..5 of a block: values 0..15 from bytes 2, 3, values 16..31 from 4, 5; row 1 / 3 + 8 */
    const uint8x16_t ix[2][2] = {{q5_idx(2), q5_idx(4)}, {q5_idx(10), q5_idx(12)}};
    float32x4_t sumf = vdupq_n_f32(0.0f);
    int32x4_t acc[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
    uint32x4_t prev = vdupq_n_u32(0);
    for (size_t i = 0; i < n / QK5_0; i++, next(p, sizeof(block_q5_0)), pa += sizeof(block_q8_0)) {
        const int8x16_t a0 = ld_s8(pa + 2), a1 = ld_s8(pa + 18);
        uint8x16_t h[2];
        q5_rows_head(p, &h[0], &h[1]);
        const uint8x16_t nh[2] = {vmvnq_u8(h[0]), vmvnq_u8(h[1])};
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8x16_t qs = vld1q_u8(p[r] + 6);
            const uint8x16_t t0 = q5_clear_mask(nh[r / 2], ix[r % 2][0], bits);
            const uint8x16_t t1 = q5_clear_mask(nh[r / 2], ix[r % 2][1], bits);
            acc[r] = dot32_small(acc[r], as_s8(vsliq_n_u8(qs, t0, 4)), a0, as_s8(vsliq_n_u8(vshrq_n_u8(qs, 4), t1, 4)), a1);
        }
        /* the scales: halves 0 and 4 of each head vector */
        const uint16x8_t d = vuzp1q_u16(vreinterpretq_u16_u8(h[0]), vreinterpretq_u16_u8(h[1]));
        sumf = q_0_update(sumf, vget_low_u16(vuzp1q_u16(d, d)), pa, block_sums(acc, &prev));
    }
    vst1q_f32(out, sumf);
}
#endif

static void EL_FN(q5_1_rows)(size_t n, const void *w, size_t ws, const void *a, float *out) {
    const uint8_t *pa = a, *p[4];
    rows_at(w, ws, p);
    static const uint8_t bit_tab[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
    const uint8x16_t bits = vld1q_u8(bit_tab);
    /* qh at bytes 4..7 of a block */
    const uint8x16_t ix[2][2] = {{q5_idx(4), q5_idx(6)}, {q5_idx(12), q5_idx(14)}};
    float32x4_t sumf = vdupq_n_f32(0.0f);
    int32x4_t acc[4] = {vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0), vdupq_n_s32(0)};
    uint32x4_t prev = vdupq_n_u32(0);
    for (size_t i = 0; i < n / QK5_1; i++, next(p, sizeof(block_q5_1)), pa += sizeof(block_q8_1)) {
        const int8x16_t a0 = ld_s8(pa + 4), a1 = ld_s8(pa + 20);
        uint8x16_t h[2];
        q5_rows_head(p, &h[0], &h[1]);
        const uint8x16_t nh[2] = {vmvnq_u8(h[0]), vmvnq_u8(h[1])};
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const uint8x16_t qs = vld1q_u8(p[r] + 8);
            const uint8x16_t t0 = q5_clear_mask(nh[r / 2], ix[r % 2][0], bits);
            const uint8x16_t t1 = q5_clear_mask(nh[r / 2], ix[r % 2][1], bits);
            acc[r] = dot32_small(acc[r], as_s8(vsliq_n_u8(qs, t0, 4)), a0, as_s8(vsliq_n_u8(vshrq_n_u8(qs, 4), t1, 4)), a1);
        }
        /* sum q a = sum (q - 16) a + 16 sum a; the (d, m) pairs: words 0 and 2 of each head vector */
        const int32x4_t sumi = vaddq_s32(block_sums(acc, &prev), vdupq_n_s32(16 * sum32(a0, a1)));
        const uint16x8_t dm = vreinterpretq_u16_u32(vuzp1q_u32(vreinterpretq_u32_u8(h[0]), vreinterpretq_u32_u8(h[1])));
        sumf = q_1_update(sumf, dm, pa, sumi);
    }
    vst1q_f32(out, sumf);
}

/* ---------------- K-quants x Q8_K ---------------- */

/* the 8 products bsums-pair * min of one row, as lanes to be summed: sum_j pairs[j] * m[j] */
static inline int32x4_t k4_min_lanes(int16x8_t pairs, int16x8_t m) {
    return vmlal_high_s16(vmull_s16(vget_low_s16(pairs), vget_low_s16(m)), pairs, m);
}
static inline int16x8_t k4_mins16(const uint8_t mn[8]) { return vreinterpretq_s16_u16(vmovl_u8(vld1_u8(mn))); }

/* the activation's bsums summed in pairs: the 8 sums of its 32-value sub-blocks (|sum| <= 4096) */
static inline int16x8_t q8K_pairs(const uint8_t *pa) {
    const int16x8_t b0 = vreinterpretq_s16_u8(vld1q_u8(pa + Q8K_BSUMS));
    const int16x8_t b1 = vreinterpretq_s16_u8(vld1q_u8(pa + Q8K_BSUMS + 16));
    return vpaddq_s16(b0, b1);
}

/* row r: sumf += d * (float)isum - dmin * (float)summ with d = d_w * d_a, dmin = dmin_w * d_a */
static inline float32x4_t k4_update(float32x4_t sumf, const uint8_t *const p[4], size_t off_d, size_t off_dmin,
                                    float da, int32x4_t isum, int32x4_t summ) {
    const float32x4_t d = vmulq_n_f32(ld_f16_rows(p, off_d), da);
    const float32x4_t dmin = vmulq_n_f32(ld_f16_rows(p, off_dmin), da);
    return vaddq_f32(sumf, vsubq_f32(vmulq_f32(d, vcvtq_f32_s32(isum)), vmulq_f32(dmin, vcvtq_f32_s32(summ))));
}

#ifdef EL_NEON_DOTPROD
/* neon_common.h's k4_scales_mins for the 4 rows at once, as lanes: their 12 packed bytes (read as 16, still
 * within the block) transposed to words w0, w1, w2 of rows 0..3, then its masks and shifts per lane. Lane r
 * of sc03 holds row r's scales 0..3 (a byte each), sc47 scales 4..7, mn03 / mn47 the mins. */
static inline void k4_scales_mins_x4(const uint8_t *const p[4], uint32x4_t *sc03, uint32x4_t *sc47, uint32x4_t *mn03,
                                     uint32x4_t *mn47) {
    _Static_assert(offsetof(block_q4_K, scales) == 4, "the packed scales read below");
    const uint32x4_t k3f = vdupq_n_u32(0x3f3f3f3fu), k0f = vdupq_n_u32(0x0f0f0f0fu), k03 = vdupq_n_u32(0x03030303u);
    const uint32x4_t r0 = vreinterpretq_u32_u8(vld1q_u8(p[0] + 4)), r1 = vreinterpretq_u32_u8(vld1q_u8(p[1] + 4));
    const uint32x4_t r2 = vreinterpretq_u32_u8(vld1q_u8(p[2] + 4)), r3 = vreinterpretq_u32_u8(vld1q_u8(p[3] + 4));
    const uint64x2_t lo01 = vreinterpretq_u64_u32(vzip1q_u32(r0, r1)), lo23 = vreinterpretq_u64_u32(vzip1q_u32(r2, r3));
    const uint64x2_t hi01 = vreinterpretq_u64_u32(vzip2q_u32(r0, r1)), hi23 = vreinterpretq_u64_u32(vzip2q_u32(r2, r3));
    const uint32x4_t b0 = vreinterpretq_u32_u64(vzip1q_u64(lo01, lo23)), b1 = vreinterpretq_u32_u64(vzip2q_u64(lo01, lo23));
    const uint32x4_t b2 = vreinterpretq_u32_u64(vzip1q_u64(hi01, hi23));
    *sc03 = vandq_u32(b0, k3f);
    *sc47 = vorrq_u32(vandq_u32(b2, k0f), vshlq_n_u32(vandq_u32(vshrq_n_u32(b0, 6), k03), 4));
    *mn03 = vandq_u32(b1, k3f);
    *mn47 = vorrq_u32(vandq_u32(vshrq_n_u32(b2, 4), k0f), vshlq_n_u32(vandq_u32(vshrq_n_u32(b1, 6), k03), 4));
}

/* Q4_K with dotprod: the sub-block scales applied once per sub-block for the 4 rows as lanes. Each row
 * keeps a running sdot total; after every 32-value sub-block the 4 totals are gathered (addp) less the
 * previous ones (the two registers of totals alternate) and multiplied by the vector of the 4 rows'
 * scales of that sub-block (the scales transposed by one table lookup). isum is the same integer as the
 * reference's: only its association differs.
 *
 * The 256 values of the 4 rows in assembly: from intrinsics GCC kept every row's weights and the
 * transposed scales live across the unrolled loop and spilled to the stack. Per 64 values (c): the 4
 * rows' 32 bytes, low nibbles (sub-block 2c, mask) against activations 0-31, high nibbles (2c + 1,
 * shift) against 32-63. The 6-bit scales and mins of the 4 rows are unpacked together, as lanes. */
#define Q4K_STEP(C, SRC, XTL)                                                                        \
    "ldp q16, q17, [%[a], #" #C "*64]\n\t"                                                           \
    "ldp q18, q19, [%[a], #" #C "*64+32]\n\t"                                                        \
    "ldp q0, q1, [%[p0], #16+" #C "*32]\n\t"                                                         \
    "ldp q2, q3, [%[p1], #16+" #C "*32]\n\t"                                                         \
    "ldp q4, q5, [%[p2], #16+" #C "*32]\n\t"                                                         \
    "ldp q6, q7, [%[p3], #16+" #C "*32]\n\t"                                                         \
    XTL " v24.8h, " SRC "\n\t"                                                                       \
    "uxtl v25.4s, v24.4h\n\t"                                                                        \
    "uxtl2 v28.4s, v24.8h\n\t"                                                                       \
    "and v20.16b, v0.16b, %[m4].16b\n\t"                                                             \
    "and v21.16b, v1.16b, %[m4].16b\n\t"                                                             \
    "sdot %[c0].4s, v20.16b, v16.16b\n\t"                                                            \
    "sdot %[c0].4s, v21.16b, v17.16b\n\t"                                                            \
    "and v20.16b, v2.16b, %[m4].16b\n\t"                                                             \
    "and v21.16b, v3.16b, %[m4].16b\n\t"                                                             \
    "sdot %[c1].4s, v20.16b, v16.16b\n\t"                                                            \
    "sdot %[c1].4s, v21.16b, v17.16b\n\t"                                                            \
    "and v20.16b, v4.16b, %[m4].16b\n\t"                                                             \
    "and v21.16b, v5.16b, %[m4].16b\n\t"                                                             \
    "sdot %[c2].4s, v20.16b, v16.16b\n\t"                                                            \
    "sdot %[c2].4s, v21.16b, v17.16b\n\t"                                                            \
    "and v20.16b, v6.16b, %[m4].16b\n\t"                                                             \
    "and v21.16b, v7.16b, %[m4].16b\n\t"                                                             \
    "sdot %[c3].4s, v20.16b, v16.16b\n\t"                                                            \
    "sdot %[c3].4s, v21.16b, v17.16b\n\t"                                                            \
    "addp v22.4s, %[c0].4s, %[c1].4s\n\t"                                                            \
    "addp v23.4s, %[c2].4s, %[c3].4s\n\t"                                                            \
    "addp v26.4s, v22.4s, v23.4s\n\t"                                                                \
    "sub v22.4s, v26.4s, v27.4s\n\t"                                                                 \
    "mla %[isum].4s, v22.4s, v25.4s\n\t"                                                             \
    "ushr v20.16b, v0.16b, #4\n\t"                                                                   \
    "ushr v21.16b, v1.16b, #4\n\t"                                                                   \
    "sdot %[c0].4s, v20.16b, v18.16b\n\t"                                                            \
    "sdot %[c0].4s, v21.16b, v19.16b\n\t"                                                            \
    "ushr v20.16b, v2.16b, #4\n\t"                                                                   \
    "ushr v21.16b, v3.16b, #4\n\t"                                                                   \
    "sdot %[c1].4s, v20.16b, v18.16b\n\t"                                                            \
    "sdot %[c1].4s, v21.16b, v19.16b\n\t"                                                            \
    "ushr v20.16b, v4.16b, #4\n\t"                                                                   \
    "ushr v21.16b, v5.16b, #4\n\t"                                                                   \
    "sdot %[c2].4s, v20.16b, v18.16b\n\t"                                                            \
    "sdot %[c2].4s, v21.16b, v19.16b\n\t"                                                            \
    "ushr v20.16b, v6.16b, #4\n\t"                                                                   \
    "ushr v21.16b, v7.16b, #4\n\t"                                                                   \
    "sdot %[c3].4s, v20.16b, v18.16b\n\t"                                                            \
    "sdot %[c3].4s, v21.16b, v19.16b\n\t"                                                            \
    "addp v22.4s, %[c0].4s, %[c1].4s\n\t"                                                            \
    "addp v23.4s, %[c2].4s, %[c3].4s\n\t"                                                            \
    "addp v27.4s, v22.4s, v23.4s\n\t"                                                                \
    "sub v22.4s, v27.4s, v26.4s\n\t"                                                                 \
    "mla %[isum].4s, v22.4s, v28.4s\n\t"
static void q4_K_rows_dotprod(size_t n, const void *w, size_t ws, const void *a, float *out) {
    _Static_assert(offsetof(block_q4_K, qs) == 16, "the offset written in the assembly");
    const uint8_t *pa = a;
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    /* lane r's byte j -> byte 4j + r: scale j of rows 0..3 side by side, as the assembly wants them */
    static const uint8_t tr_tab[16] = {0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15};
    const uint8x16_t tr = vld1q_u8(tr_tab);
    float32x4_t sumf = vdupq_n_f32(0.0f);
    const uint8_t *p[4];
    rows_at(w, ws, p);
    for (size_t i = 0; i < n / QK_K; i++, next(p, sizeof(block_q4_K)), pa += sizeof(block_q8_K)) {
        uint32x4_t sc03, sc47, mn03, mn47;
        k4_scales_mins_x4(p, &sc03, &sc47, &mn03, &mn47);
        const uint8x16_t t0 = vqtbl1q_u8(vreinterpretq_u8_u32(sc03), tr), t1 = vqtbl1q_u8(vreinterpretq_u8_u32(sc47), tr);
        /* mins: row r's 8 bytes are lane r of mn03 then of mn47 (rows 0, 1 in z01, rows 2, 3 in z23) */
        const uint8x16_t z01 = vreinterpretq_u8_u32(vzip1q_u32(mn03, mn47)), z23 = vreinterpretq_u8_u32(vzip2q_u32(mn03, mn47));
        const int16x8_t pairs = q8K_pairs(pa);
        const int16x8_t mr[4] = {vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(z01))), vreinterpretq_s16_u16(vmovl_high_u8(z01)),
                                 vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(z23))), vreinterpretq_s16_u16(vmovl_high_u8(z23))};
        int32x4_t ms[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) ms[r] = k4_min_lanes(pairs, mr[r]);
        int32x4_t c0, c1, c2, c3, isum;
        __asm__("movi %[c0].4s, #0\n\t"
                "movi %[c1].4s, #0\n\t"
                "movi %[c2].4s, #0\n\t"
                "movi %[c3].4s, #0\n\t"
                "movi %[isum].4s, #0\n\t"
                "movi v27.4s, #0\n\t"
                Q4K_STEP(0, "%[t0].8b", "uxtl")
                Q4K_STEP(1, "%[t0].16b", "uxtl2")
                Q4K_STEP(2, "%[t1].8b", "uxtl")
                Q4K_STEP(3, "%[t1].16b", "uxtl2")
                : [c0] "=&w"(c0), [c1] "=&w"(c1), [c2] "=&w"(c2), [c3] "=&w"(c3), [isum] "=&w"(isum)
                : [p0] "r"(p[0]), [p1] "r"(p[1]), [p2] "r"(p[2]), [p3] "r"(p[3]), [a] "r"(pa + Q8K_QS),
                  [t0] "w"(t0), [t1] "w"(t1), [m4] "w"(m4)
                : "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v16", "v17", "v18", "v19", "v20", "v21", "v22",
                  "v23", "v24", "v25", "v26", "v27", "v28", "memory");
        sumf = k4_update(sumf, p, offsetof(block_q4_K, d), offsetof(block_q4_K, dmin), ld_f32(pa), isum, hsum4(ms));
    }
    vst1q_f32(out, sumf);
}
#undef Q4K_STEP
#else
static void EL_FN(q4_K_rows)(size_t n, const void *w, size_t ws, const void *a, float *out) {
    const uint8_t *pa = a;
    const uint8x16_t m4 = vdupq_n_u8(0x0F);
    float32x4_t sumf = vdupq_n_f32(0.0f);
    const uint8_t *p[4];
    rows_at(w, ws, p);
    for (size_t i = 0; i < n / QK_K; i++, next(p, sizeof(block_q4_K)), pa += sizeof(block_q8_K)) {
        uint8_t sc[4][8], mn[4][8];
        int32x4_t acc[4], ms[4];
        const int16x8_t pairs = q8K_pairs(pa);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            k4_scales_mins(p[r] + offsetof(block_q4_K, scales), sc[r], mn[r]);
            ms[r] = k4_min_lanes(pairs, k4_mins16(mn[r]));
            acc[r] = vdupq_n_s32(0);
        }
        /* 64 values per step: low nibbles of 32 bytes are sub-block 2c, high nibbles 2c + 1 */
        for (int c = 0; c < QK_K / 64; c++) {
            const uint8_t *aq = pa + Q8K_QS + 64 * c;
            const int8x16_t a0 = ld_s8(aq), a1 = ld_s8(aq + 16), a2 = ld_s8(aq + 32), a3 = ld_s8(aq + 48);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const uint8_t *qs = p[r] + offsetof(block_q4_K, qs) + 32 * c;
                const uint8x16_t q0 = vld1q_u8(qs), q1 = vld1q_u8(qs + 16);
                acc[r] = dot32_scaled(acc[r], as_s8(vandq_u8(q0, m4)), a0, as_s8(vandq_u8(q1, m4)), a1, sc[r][2 * c]);
                acc[r] = dot32_scaled(acc[r], as_s8(vshrq_n_u8(q0, 4)), a2, as_s8(vshrq_n_u8(q1, 4)), a3,
                                      sc[r][2 * c + 1]);
            }
        }
        sumf = k4_update(sumf, p, offsetof(block_q4_K, d), offsetof(block_q4_K, dmin), ld_f32(pa), hsum4(acc), hsum4(ms));
    }
    vst1q_f32(out, sumf);
}
#endif

static void EL_FN(q5_K_rows)(size_t n, const void *w, size_t ws, const void *a, float *out) {
    const uint8_t *pa = a;
    const uint8x16_t m4 = vdupq_n_u8(0x0F), one = vdupq_n_u8(1), two = vdupq_n_u8(2);
    float32x4_t sumf = vdupq_n_f32(0.0f);
    const uint8_t *p[4];
    rows_at(w, ws, p);
    for (size_t i = 0; i < n / QK_K; i++, next(p, sizeof(block_q5_K)), pa += sizeof(block_q8_K)) {
        uint8_t sc[4][8], mn[4][8];
        int32x4_t acc[4], ms[4];
        uint8x16_t h0[4], h1[4];
        const int16x8_t pairs = q8K_pairs(pa);
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            k4_scales_mins(p[r] + offsetof(block_q5_K, scales), sc[r], mn[r]);
            ms[r] = k4_min_lanes(pairs, k4_mins16(mn[r]));
            acc[r] = vdupq_n_s32(0);
            h0[r] = vld1q_u8(p[r] + offsetof(block_q5_K, qh));
            h1[r] = vld1q_u8(p[r] + offsetof(block_q5_K, qh) + 16);
        }
        /* bit 2c of qh[l] is the 5th bit of value 64c + l, bit 2c + 1 that of value 64c + 32 + l */
        for (int c = 0; c < QK_K / 64; c++) {
            const uint8_t *aq = pa + Q8K_QS + 64 * c;
            const int8x16_t a0 = ld_s8(aq), a1 = ld_s8(aq + 16), a2 = ld_s8(aq + 32), a3 = ld_s8(aq + 48);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const uint8_t *qs = p[r] + offsetof(block_q5_K, qs) + 32 * c;
                const uint8x16_t q0 = vld1q_u8(qs), q1 = vld1q_u8(qs + 16);
                const uint8x16_t l0 = vorrq_u8(vandq_u8(q0, m4), vshlq_n_u8(vandq_u8(h0[r], one), 4));
                const uint8x16_t l1 = vorrq_u8(vandq_u8(q1, m4), vshlq_n_u8(vandq_u8(h1[r], one), 4));
                const uint8x16_t u0 = vorrq_u8(vshrq_n_u8(q0, 4), vshlq_n_u8(vandq_u8(h0[r], two), 3));
                const uint8x16_t u1 = vorrq_u8(vshrq_n_u8(q1, 4), vshlq_n_u8(vandq_u8(h1[r], two), 3));
                acc[r] = dot32_scaled(acc[r], as_s8(l0), a0, as_s8(l1), a1, sc[r][2 * c]);
                acc[r] = dot32_scaled(acc[r], as_s8(u0), a2, as_s8(u1), a3, sc[r][2 * c + 1]);
                h0[r] = vshrq_n_u8(h0[r], 2);
                h1[r] = vshrq_n_u8(h1[r], 2);
            }
        }
        sumf = k4_update(sumf, p, offsetof(block_q5_K, d), offsetof(block_q5_K, dmin), ld_f32(pa), hsum4(acc), hsum4(ms));
    }
    vst1q_f32(out, sumf);
}

/* row r: sumf += (d_w * d_a) * (float)isum */
static inline float32x4_t k_update(float32x4_t sumf, const uint8_t *const p[4], size_t off_d, float da, int32x4_t isum) {
    return vaddq_f32(sumf, vmulq_f32(vmulq_n_f32(ld_f16_rows(p, off_d), da), vcvtq_f32_s32(isum)));
}

#ifdef EL_NEON_DOTPROD
/* Q6_K with dotprod: levels used as stored (0..63), the + 32 taken off once per row as 32 * sum_g sc_g *
 * bsums_g (the Q8_K sums of 16 activations, exact integers, so isum is the reference's integer).
 *
 * One row's 256 values in assembly, a row at a time: compiled from intrinsics, GCC interleaved the 4
 * unrolled rows, kept all 16 activation vectors live and spilled about 50 vectors to the stack per
 * block (0.73 instructions per weight under qemu). Per 128 values (c) and half of them (h): value l
 * (l < 32) = low nibble of ql[l] | bits 0-1 of qh[l] << 4; l + 32: low nibble of ql[l + 32] | bits
 * 2-3; l + 64: high nibble of ql[l] | bits 4-5; l + 96: high nibble of ql[l + 32] | bits 6-7. Half h
 * takes the groups 2h, 2h + 1 (low nibbles) and 2h + 4, 2h + 5 (high nibbles) from two ql vectors and
 * the qh pair shifted right by 2h. A level vector costs two instructions: the 2 high bits masked, then
 * the nibble shifted in by sli (keeps the destination's low nibble) or sri (keeps its high nibble).
 * The 16-value groups' scales by summation by parts, as neon_batch.c's k16_tile: two running dots,
 * A over groups 0 4 2 6 8 12 10 14 and B over 1 5 3 7 9 13 11 15 (the order they are reached), each
 * added after every group times its sequence's scale less the next one's (the last one alone), into
 * its own accumulator: no register zeroed per group. The same exact integer. */
#define Q6_HALF(LOFF, A0, A4, DA, DB, K0, K1)                                                         \
    "ldp q0, q1, [%[x], #" LOFF "]\n\t"                                                              \
    "and v2.16b, v20.16b, %[m30].16b\n\t"                                                           \
    "sri v2.16b, v0.16b, #4\n\t"                                                                    \
    "and v3.16b, v21.16b, %[m30].16b\n\t"                                                           \
    "sri v3.16b, v1.16b, #4\n\t"                                                                    \
    "and v6.16b, v20.16b, %[m3].16b\n\t"                                                            \
    "sli v0.16b, v6.16b, #4\n\t"                                                                    \
    "and v7.16b, v21.16b, %[m3].16b\n\t"                                                            \
    "sli v1.16b, v7.16b, #4\n\t"                                                                    \
    "ldp q16, q17, [%[a], #" A0 "]\n\t"                                                             \
    "ldp q18, q19, [%[a], #" A4 "]\n\t"                                                             \
    "sdot v4.4s, v0.16b, v16.16b\n\t"                                                               \
    "mla %[s0].4s, v4.4s, " DA ".s[" K0 "]\n\t"                                                     \
    "sdot v5.4s, v1.16b, v17.16b\n\t"                                                               \
    "mla %[s1].4s, v5.4s, " DB ".s[" K0 "]\n\t"                                                     \
    "sdot v4.4s, v2.16b, v18.16b\n\t"                                                               \
    "mla %[s0].4s, v4.4s, " DA ".s[" K1 "]\n\t"                                                     \
    "sdot v5.4s, v3.16b, v19.16b\n\t"                                                               \
    "mla %[s1].4s, v5.4s, " DB ".s[" K1 "]\n\t"
static inline int32x4_t q6_K_row_dot(const uint8_t *x, const uint8_t *a, uint8x16_t m3, uint8x16_t m30,
                                     uint8x16_t seq, uint8x16_t seq_next) {
    _Static_assert(offsetof(block_q6_K, ql) == 0 && offsetof(block_q6_K, qh) == 128 &&
                   offsetof(block_q6_K, scales) == 192, "the offsets written in the assembly");
    int32x4_t s0, s1;
    __asm__("ldr q22, [%[x], #192]\n\t"
            "tbl v23.16b, {v22.16b}, %[seq].16b\n\t"      /* scales in sequence order: A, then B */
            "tbl v22.16b, {v22.16b}, %[seq_next].16b\n\t" /* each one's successor (0 after the last) */
            "ssubl v24.8h, v23.8b, v22.8b\n\t"
            "ssubl2 v25.8h, v23.16b, v22.16b\n\t"
            "sxtl v26.4s, v24.4h\n\t"  /* A 0-3 */
            "sxtl2 v27.4s, v24.8h\n\t" /* A 4-7 */
            "sxtl v24.4s, v25.4h\n\t"  /* B 0-3 */
            "sxtl2 v25.4s, v25.8h\n\t" /* B 4-7 */
            "movi %[s0].4s, #0\n\t"
            "movi %[s1].4s, #0\n\t"
            "movi v4.4s, #0\n\t"
            "movi v5.4s, #0\n\t"
            "ldp q20, q21, [%[x], #128]\n\t"
            Q6_HALF("0", "0", "64", "v26", "v24", "0", "1")
            "ushr v20.16b, v20.16b, #2\n\t"
            "ushr v21.16b, v21.16b, #2\n\t"
            Q6_HALF("32", "32", "96", "v26", "v24", "2", "3")
            "ldp q20, q21, [%[x], #160]\n\t"
            Q6_HALF("64", "128", "192", "v27", "v25", "0", "1")
            "ushr v20.16b, v20.16b, #2\n\t"
            "ushr v21.16b, v21.16b, #2\n\t"
            Q6_HALF("96", "160", "224", "v27", "v25", "2", "3")
            : [s0] "=&w"(s0), [s1] "=&w"(s1)
            : [x] "r"(x), [a] "r"(a), [m3] "w"(m3), [m30] "w"(m30), [seq] "w"(seq), [seq_next] "w"(seq_next)
            : "v0", "v1", "v2", "v3", "v4", "v5", "v6", "v7", "v16", "v17", "v18", "v19", "v20", "v21", "v22",
              "v23", "v24", "v25", "v26", "v27", "memory");
    return vaddq_s32(s0, s1);
}
#undef Q6_HALF

static void q6_K_rows_dotprod(size_t n, const void *w, size_t ws, const void *a, float *out) {
    const uint8_t *pa = a;
    const uint8x16_t m3 = vdupq_n_u8(0x03), m30 = vdupq_n_u8(0x30);
    static const uint8_t seq_tab[32] = {0, 4, 2, 6, 8, 12, 10, 14,   1, 5, 3, 7, 9, 13, 11, 15,
                                        4, 2, 6, 8, 12, 10, 14, 255, 5, 3, 7, 9, 13, 11, 15, 255};
    const uint8x16_t seq = vld1q_u8(seq_tab), seq_next = vld1q_u8(seq_tab + 16);
    float32x4_t sumf = vdupq_n_f32(0.0f);
    const uint8_t *p[4];
    rows_at(w, ws, p);
    for (size_t i = 0; i < n / QK_K; i++, next(p, sizeof(block_q6_K)), pa += sizeof(block_q8_K)) {
        const int16x8_t b0 = vreinterpretq_s16_u8(vld1q_u8(pa + Q8K_BSUMS));
        const int16x8_t b1 = vreinterpretq_s16_u8(vld1q_u8(pa + Q8K_BSUMS + 16));
        int32x4_t acc[4], off[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            const int8x16_t s = vld1q_s8((const int8_t *)(p[r] + offsetof(block_q6_K, scales)));
            const int16x8_t lo = vmovl_s8(vget_low_s8(s)), hi = vmovl_high_s8(s);
            int32x4_t m = vmull_s16(vget_low_s16(b0), vget_low_s16(lo));
            m = vmlal_high_s16(m, b0, lo);
            m = vmlal_s16(m, vget_low_s16(b1), vget_low_s16(hi));
            off[r] = vmlal_high_s16(m, b1, hi);
            acc[r] = q6_K_row_dot(p[r], pa + Q8K_QS, m3, m30, seq, seq_next);
        }
        const int32x4_t isum = vsubq_s32(hsum4(acc), vshlq_n_s32(hsum4(off), 5));
        sumf = k_update(sumf, p, offsetof(block_q6_K, d), ld_f32(pa), isum);
    }
    vst1q_f32(out, sumf);
}
#else
static void EL_FN(q6_K_rows)(size_t n, const void *w, size_t ws, const void *a, float *out) {
    const uint8_t *pa = a;
    const uint8x16_t m4 = vdupq_n_u8(0x0F), m2 = vdupq_n_u8(0x03), m2h = vdupq_n_u8(0x30);
    const int8x16_t k32 = vdupq_n_s8(32);
    float32x4_t sumf = vdupq_n_f32(0.0f);
    const uint8_t *p[4];
    rows_at(w, ws, p);
    for (size_t i = 0; i < n / QK_K; i++, next(p, sizeof(block_q6_K)), pa += sizeof(block_q8_K)) {
        int32x4_t acc[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) acc[r] = vdupq_n_s32(0);
        /* per 128 values (neon.c's layout): value l (l < 32) = low nibble of ql[l] | bits 0-1 of qh[l] << 4,
         * l + 32: low nibble of ql[l + 32] | bits 2-3, l + 64: high nibble of ql[l] | bits 4-5, l + 96:
         * high nibble of ql[l + 32] | bits 6-7; levels stored + 32, one scale per 16 values */
        for (int c = 0; c < QK_K / 128; c++) {
            const uint8_t *aq = pa + Q8K_QS + 128 * c;
            int8x16_t av[8];
            for (int g = 0; g < 8; g++) av[g] = ld_s8(aq + 16 * g);
#pragma GCC unroll 4
            for (int r = 0; r < R; r++) {
                const uint8_t *ql = p[r] + offsetof(block_q6_K, ql) + 64 * c;
                const uint8_t *qh = p[r] + offsetof(block_q6_K, qh) + 32 * c;
                const int8_t *sc = (const int8_t *)(p[r] + offsetof(block_q6_K, scales)) + 8 * c;
                const uint8x16_t l0 = vld1q_u8(ql), l1 = vld1q_u8(ql + 16), l2 = vld1q_u8(ql + 32), l3 = vld1q_u8(ql + 48);
                const uint8x16_t h0 = vld1q_u8(qh), h1 = vld1q_u8(qh + 16);
                const uint8x16_t h0s = vshrq_n_u8(h0, 2), h1s = vshrq_n_u8(h1, 2);
                int8x16_t v[8];
                v[0] = as_s8(vorrq_u8(vandq_u8(l0, m4), vshlq_n_u8(vandq_u8(h0, m2), 4)));
                v[1] = as_s8(vorrq_u8(vandq_u8(l1, m4), vshlq_n_u8(vandq_u8(h1, m2), 4)));
                v[2] = as_s8(vorrq_u8(vandq_u8(l2, m4), vshlq_n_u8(vandq_u8(h0s, m2), 4)));
                v[3] = as_s8(vorrq_u8(vandq_u8(l3, m4), vshlq_n_u8(vandq_u8(h1s, m2), 4)));
                v[4] = as_s8(vorrq_u8(vshrq_n_u8(l0, 4), vandq_u8(h0, m2h)));
                v[5] = as_s8(vorrq_u8(vshrq_n_u8(l1, 4), vandq_u8(h1, m2h)));
                v[6] = as_s8(vorrq_u8(vshrq_n_u8(l2, 4), vandq_u8(h0s, m2h)));
                v[7] = as_s8(vorrq_u8(vshrq_n_u8(l3, 4), vandq_u8(h1s, m2h)));
                for (int g = 0; g < 8; g++) acc[r] = dot16_scaled(acc[r], vsubq_s8(v[g], k32), av[g], sc[g]);
            }
        }
        sumf = k_update(sumf, p, offsetof(block_q6_K, d), ld_f32(pa), hsum4(acc));
    }
    vst1q_f32(out, sumf);
}
#endif

static void EL_FN(q3_K_rows)(size_t n, const void *w, size_t ws, const void *a, float *out) {
    const uint8_t *pa = a;
    const uint8x16_t m3 = vdupq_n_u8(3), four = vdupq_n_u8(4);
    float32x4_t sumf = vdupq_n_f32(0.0f);
    const uint8_t *p[4];
    rows_at(w, ws, p);
    for (size_t i = 0; i < n / QK_K; i++, next(p, sizeof(block_q3_K)), pa += sizeof(block_q8_K)) {
        int8_t sc[4][16];
        int32x4_t acc[4];
        uint8x16_t hm0[4], hm1[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            q3_K_scales(p[r] + offsetof(block_q3_K, scales), sc[r]);
            acc[r] = vdupq_n_s32(0);
            hm0[r] = vld1q_u8(p[r] + offsetof(block_q3_K, hmask));
            hm1[r] = vld1q_u8(p[r] + offsetof(block_q3_K, hmask) + 16);
        }
        /* value 128k + 32j + l: bits 2j of qs[32k + l] minus 4 unless bit 4k + j of hmask[l] is set */
        for (int k = 0; k < QK_K / 128; k++) {
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const uint8_t *aq = pa + Q8K_QS + 128 * k + 32 * j;
                const int8x16_t a0 = ld_s8(aq), a1 = ld_s8(aq + 16);
                const uint8x16_t bit = vdupq_n_u8((uint8_t)(1u << (4 * k + j)));
                const int s = 8 * k + 2 * j;
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    const uint8_t *qs = p[r] + offsetof(block_q3_K, qs) + 32 * k;
                    const uint8x16_t q0 = vshlq_u8(vld1q_u8(qs), vdupq_n_s8((int8_t)(-2 * j)));
                    const uint8x16_t q1 = vshlq_u8(vld1q_u8(qs + 16), vdupq_n_s8((int8_t)(-2 * j)));
                    const int8x16_t w0 = vsubq_s8(as_s8(vandq_u8(q0, m3)), as_s8(vbicq_u8(four, vtstq_u8(hm0[r], bit))));
                    const int8x16_t w1 = vsubq_s8(as_s8(vandq_u8(q1, m3)), as_s8(vbicq_u8(four, vtstq_u8(hm1[r], bit))));
                    acc[r] = dot16_scaled(acc[r], w0, a0, sc[r][s]);
                    acc[r] = dot16_scaled(acc[r], w1, a1, sc[r][s + 1]);
                }
            }
        }
        sumf = k_update(sumf, p, offsetof(block_q3_K, d), ld_f32(pa), hsum4(acc));
    }
    vst1q_f32(out, sumf);
}

static void EL_FN(q2_K_rows)(size_t n, const void *w, size_t ws, const void *a, float *out) {
    const uint8_t *pa = a;
    const uint8x16_t m3 = vdupq_n_u8(3);
    float32x4_t sumf = vdupq_n_f32(0.0f);
    const uint8_t *p[4];
    rows_at(w, ws, p);
    for (size_t i = 0; i < n / QK_K; i++, next(p, sizeof(block_q2_K)), pa += sizeof(block_q8_K)) {
        const int16x8_t b0 = vreinterpretq_s16_u8(vld1q_u8(pa + Q8K_BSUMS));
        const int16x8_t b1 = vreinterpretq_s16_u8(vld1q_u8(pa + Q8K_BSUMS + 16));
        int32x4_t acc[4], ms[4];
#pragma GCC unroll 4
        for (int r = 0; r < R; r++) {
            /* mins: sum_s bsums[s] * (scales[s] >> 4) */
            const uint8x16_t mv = vshrq_n_u8(vld1q_u8(p[r] + offsetof(block_q2_K, scales)), 4);
            const int16x8_t mlo = vreinterpretq_s16_u16(vmovl_u8(vget_low_u8(mv)));
            const int16x8_t mhi = vreinterpretq_s16_u16(vmovl_high_u8(mv));
            int32x4_t m = vmull_s16(vget_low_s16(b0), vget_low_s16(mlo));
            m = vmlal_high_s16(m, b0, mlo);
            m = vmlal_s16(m, vget_low_s16(b1), vget_low_s16(mhi));
            ms[r] = vmlal_high_s16(m, b1, mhi);
            acc[r] = vdupq_n_s32(0);
        }
        /* value 128k + 32j + l: bits 2j of qs[32k + l]; one scale (low nibble) per 16 values */
        for (int k = 0; k < QK_K / 128; k++) {
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) {
                const uint8_t *aq = pa + Q8K_QS + 128 * k + 32 * j;
                const int8x16_t a0 = ld_s8(aq), a1 = ld_s8(aq + 16);
                const int s = 8 * k + 2 * j;
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    const uint8_t *qs = p[r] + offsetof(block_q2_K, qs) + 32 * k;
                    const uint8_t *scales = p[r] + offsetof(block_q2_K, scales);
                    const uint8x16_t q0 = vshlq_u8(vld1q_u8(qs), vdupq_n_s8((int8_t)(-2 * j)));
                    const uint8x16_t q1 = vshlq_u8(vld1q_u8(qs + 16), vdupq_n_s8((int8_t)(-2 * j)));
                    acc[r] = dot16_scaled(acc[r], as_s8(vandq_u8(q0, m3)), a0, scales[s] & 0xF);
                    acc[r] = dot16_scaled(acc[r], as_s8(vandq_u8(q1, m3)), a1, scales[s + 1] & 0xF);
                }
            }
        }
        /* row r: sumf += dall * (float)isum - dmin * (float)summ, dall = d_a * d_w, dmin = d_a * dmin_w */
        sumf = k4_update(sumf, p, offsetof(block_q2_K, d), offsetof(block_q2_K, dmin), ld_f32(pa), hsum4(acc), hsum4(ms));
    }
    vst1q_f32(out, sumf);
}

#ifdef EL_NEON_DOTPROD
void el_neon_rows_fill_dotprod(el_kernels *k);
void el_neon_rows_fill_dotprod(el_kernels *k) {
#define ROWS_FN(t) t##_rows_dotprod
#else
void el_neon_rows_fill_dotprod(el_kernels *k); /* neon_rows_dotprod.c */
void el_kernels_fill_neon_rows(el_kernels *k, int dotprod) {
    if (dotprod) {
        el_neon_rows_fill_dotprod(k);
        return;
    }
#define ROWS_FN(t) t##_rows_neon
#endif
    k->vec_dot_rows[EL_TYPE_Q4_0] = ROWS_FN(q4_0);
    k->vec_dot_rows[EL_TYPE_Q4_1] = ROWS_FN(q4_1);
    k->vec_dot_rows[EL_TYPE_Q5_0] = ROWS_FN(q5_0);
    k->vec_dot_rows[EL_TYPE_Q5_1] = ROWS_FN(q5_1);
    k->vec_dot_rows[EL_TYPE_Q8_0] = ROWS_FN(q8_0);
    k->vec_dot_rows[EL_TYPE_Q2_K] = ROWS_FN(q2_K);
    k->vec_dot_rows[EL_TYPE_Q3_K] = ROWS_FN(q3_K);
    k->vec_dot_rows[EL_TYPE_Q4_K] = ROWS_FN(q4_K);
    k->vec_dot_rows[EL_TYPE_Q5_K] = ROWS_FN(q5_K);
    k->vec_dot_rows[EL_TYPE_Q6_K] = ROWS_FN(q6_K);
#undef ROWS_FN
}

#endif /* __aarch64__ */

/* quants.c - the scalar reference for the float and 32-value block formats, the type table and the
 * public type API. It is the spec the SIMD paths are tested against: plain loops, no hand vectorising.
 * K-quants (256-value super-blocks) and Q8_K live in quants_k.c. */

/* Bit-exactness with gguf-py needs every a*b+c rounded twice, as numpy does. GCC in gnu11 mode would
 * fuse them into FMA on aarch64 (-ffp-contract=fast is its default there), so turn contraction off
 * for this file. Placed before the includes so the fp16.h inlines get the same setting. */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "dispatch.h"
#include "quants.h"

/* Q2_K .. Q8_K (type numbers 10..15, contiguous), defined in quants_k.c */
extern const el_type_traits el_k_traits[EL_TYPE_Q8_K - EL_TYPE_Q2_K + 1];

/* ---- conversions that stay defined for any float (ggml's casts are UB for NaN / inf) ---- */

/* (int)trunc(v) limited to [0, hi]; NaN, inf and negatives give 0, which is what x86 ggml and numpy
 * produce for them. Finite inputs of the 32-value quantizers are always in range. */
static inline int trunc_clamp(float v, int hi) {
    if (!(v >= 0.0f) || v >= 256.0f) return 0;
    const int i = (int)v;
    return i < hi ? i : hi;
}

/* roundf (half away from zero) to int8, as ggml's `qs[j] = roundf(x)`; non-finite -> 0 */
static inline int8_t round_i8(float v) {
    if (!(v > -128.0f && v < 128.0f)) return 0;
    const float r = roundf(v);
    return (int8_t)(r > 127.0f ? 127 : r < -128.0f ? -128 : (int)r);
}

/* ---- F32 / F16 / BF16 ---- */

static void f32_to_float(const void *src, float *dst, size_t n) { memcpy(dst, src, n * sizeof(float)); }
static void f32_from_float(const float *src, void *dst, size_t n) { memcpy(dst, src, n * sizeof(float)); }

/* The row may sit at any byte offset, so 16-bit values are loaded with memcpy. */
static void f16_to_float(const void *src, float *dst, size_t n) {
    const uint8_t *p = src;
    for (size_t i = 0; i < n; i++) {
        el_half h;
        memcpy(&h, p + 2 * i, 2);
        dst[i] = el_fp16_to_fp32(h);
    }
}

static void f16_from_float(const float *src, void *dst, size_t n) {
    uint8_t *p = dst;
    for (size_t i = 0; i < n; i++) {
        const el_half h = el_fp32_to_fp16(src[i]);
        memcpy(p + 2 * i, &h, 2);
    }
}

static void bf16_to_float(const void *src, float *dst, size_t n) {
    const uint8_t *p = src;
    for (size_t i = 0; i < n; i++) {
        el_bf16 h;
        memcpy(&h, p + 2 * i, 2);
        dst[i] = el_bf16_to_fp32(h);
    }
}

static void bf16_from_float(const float *src, void *dst, size_t n) {
    uint8_t *p = dst;
    for (size_t i = 0; i < n; i++) {
        const el_bf16 h = el_fp32_to_bf16(src[i]);
        memcpy(p + 2 * i, &h, 2);
    }
}

/* float weights dot float32 activations: one float accumulator, index order */
static float f32_vec_dot(size_t n, const void *w, const void *a) {
    const uint8_t *pw = w, *pa = a;
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) {
        float x, y;
        memcpy(&x, pw + 4 * i, 4);
        memcpy(&y, pa + 4 * i, 4);
        s += x * y;
    }
    return s;
}

static float f16_vec_dot(size_t n, const void *w, const void *a) {
    const uint8_t *pw = w, *pa = a;
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) {
        el_half h;
        float y;
        memcpy(&h, pw + 2 * i, 2);
        memcpy(&y, pa + 4 * i, 4);
        s += el_fp16_to_fp32(h) * y;
    }
    return s;
}

static float bf16_vec_dot(size_t n, const void *w, const void *a) {
    const uint8_t *pw = w, *pa = a;
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) {
        el_bf16 h;
        float y;
        memcpy(&h, pw + 2 * i, 2);
        memcpy(&y, pa + 4 * i, 4);
        s += el_bf16_to_fp32(h) * y;
    }
    return s;
}

/* ---- 32-value blocks ----
 * Each format unpacks a block to its 32 integer quants in value order (q[j] is value j); dequantize
 * and the dot products share that unpacking, so they cannot disagree about the layout.
 * Blocks are copied out with memcpy: GGUF packs them back to back, so a block may start at any
 * even (or, from Python, any) address. */

#define QK 32

void el_unpack_q4_0(const block_q4_0 *b, int8_t q[QK]) {
    for (int j = 0; j < QK / 2; j++) {
        q[j] = (int8_t)((b->qs[j] & 0x0F) - 8);
        q[j + QK / 2] = (int8_t)((b->qs[j] >> 4) - 8);
    }
}

void el_unpack_q4_1(const block_q4_1 *b, int8_t q[QK]) {
    for (int j = 0; j < QK / 2; j++) {
        q[j] = (int8_t)(b->qs[j] & 0x0F);
        q[j + QK / 2] = (int8_t)(b->qs[j] >> 4);
    }
}

/* the 5th bit of value j is bit j of the little-endian qh word */
void el_unpack_q5_0(const block_q5_0 *b, int8_t q[QK]) {
    uint32_t qh;
    memcpy(&qh, b->qh, 4);
    for (int j = 0; j < QK / 2; j++) {
        const int h0 = (int)((qh >> j) & 1u) << 4;
        const int h1 = (int)((qh >> (j + 16)) & 1u) << 4;
        q[j] = (int8_t)(((b->qs[j] & 0x0F) | h0) - 16);
        q[j + QK / 2] = (int8_t)(((b->qs[j] >> 4) | h1) - 16);
    }
}

void el_unpack_q5_1(const block_q5_1 *b, int8_t q[QK]) {
    uint32_t qh;
    memcpy(&qh, b->qh, 4);
    for (int j = 0; j < QK / 2; j++) {
        const int h0 = (int)((qh >> j) & 1u) << 4;
        const int h1 = (int)((qh >> (j + 16)) & 1u) << 4;
        q[j] = (int8_t)((b->qs[j] & 0x0F) | h0);
        q[j + QK / 2] = (int8_t)((b->qs[j] >> 4) | h1);
    }
}

/* dequantize: y = q*d (symmetric) or q*d + m (with a min), in float, as dequantize_row_* */
#define DEQUANT_SYM(NAME, BLOCK, UNPACK)                                  \
    static void NAME(const void *src, float *dst, size_t n) {           \
        const uint8_t *p = src;                                          \
        for (size_t i = 0; i < n / QK; i++) {                            \
            BLOCK b;                                                     \
            int8_t q[QK];                                                \
            memcpy(&b, p + i * sizeof b, sizeof b);                      \
            UNPACK(&b, q);                                               \
            const float d = el_fp16_to_fp32(b.d);                        \
            for (int j = 0; j < QK; j++) dst[i * QK + j] = (float)q[j] * d; \
        }                                                                \
    }

#define DEQUANT_MIN(NAME, BLOCK, UNPACK)                                  \
    static void NAME(const void *src, float *dst, size_t n) {           \
        const uint8_t *p = src;                                          \
        for (size_t i = 0; i < n / QK; i++) {                            \
            BLOCK b;                                                     \
            int8_t q[QK];                                                \
            memcpy(&b, p + i * sizeof b, sizeof b);                      \
            UNPACK(&b, q);                                               \
            const float d = el_fp16_to_fp32(b.d);                        \
            const float m = el_fp16_to_fp32(b.m);                        \
            for (int j = 0; j < QK; j++) dst[i * QK + j] = (float)q[j] * d + m; \
        }                                                                \
    }

static void unpack_q8_0(const block_q8_0 *b, int8_t q[QK]) { memcpy(q, b->qs, QK); }
static void unpack_q8_1(const block_q8_1 *b, int8_t q[QK]) { memcpy(q, b->qs, QK); }

DEQUANT_SYM(q4_0_to_float, block_q4_0, el_unpack_q4_0)
DEQUANT_MIN(q4_1_to_float, block_q4_1, el_unpack_q4_1)
DEQUANT_SYM(q5_0_to_float, block_q5_0, el_unpack_q5_0)
DEQUANT_MIN(q5_1_to_float, block_q5_1, el_unpack_q5_1)
DEQUANT_SYM(q8_0_to_float, block_q8_0, unpack_q8_0)
DEQUANT_SYM(q8_1_to_float, block_q8_1, unpack_q8_1)

/* the value of largest magnitude, with its sign (first one on ties), as ggml's quantizers pick it */
static float signed_absmax(const float *x, int n) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max;
}

static void min_max(const float *x, int n, float *min, float *max) {
    float lo = 3.402823466e+38f, hi = -3.402823466e+38f; /* FLT_MAX, as ggml starts */
    for (int j = 0; j < n; j++) {
        if (x[j] < lo) lo = x[j];
        if (x[j] > hi) hi = x[j];
    }
    *min = lo;
    *max = hi;
}

/* quantize_row_q4_0_ref: d = max / -8 with the signed max, q = trunc(x/d + 8.5) capped at 15 */
static void q4_0_from_float(const float *src, void *dst, size_t n) {
    uint8_t *p = dst;
    for (size_t i = 0; i < n / QK; i++) {
        const float *x = src + i * QK;
        const float d = signed_absmax(x, QK) / -8;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        block_q4_0 b;
        b.d = el_fp32_to_fp16(d);
        for (int j = 0; j < QK / 2; j++) {
            const int q0 = trunc_clamp(x[j] * id + 8.5f, 15);
            const int q1 = trunc_clamp(x[j + QK / 2] * id + 8.5f, 15);
            b.qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
        memcpy(p + i * sizeof b, &b, sizeof b);
    }
}

/* quantize_row_q4_1_ref: d = (max - min) / 15, m = min, q = trunc((x - min)/d + 0.5) */
static void q4_1_from_float(const float *src, void *dst, size_t n) {
    uint8_t *p = dst;
    for (size_t i = 0; i < n / QK; i++) {
        const float *x = src + i * QK;
        float min, max;
        min_max(x, QK, &min, &max);
        const float d = (max - min) / 15;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        block_q4_1 b;
        b.d = el_fp32_to_fp16(d);
        b.m = el_fp32_to_fp16(min);
        for (int j = 0; j < QK / 2; j++) {
            const int q0 = trunc_clamp((x[j] - min) * id + 0.5f, 15);
            const int q1 = trunc_clamp((x[j + QK / 2] - min) * id + 0.5f, 15);
            b.qs[j] = (uint8_t)(q0 | (q1 << 4));
        }
        memcpy(p + i * sizeof b, &b, sizeof b);
    }
}

/* quantize_row_q5_0_ref: d = max / -16, q = trunc(x/d + 16.5) capped at 31 */
static void q5_0_from_float(const float *src, void *dst, size_t n) {
    uint8_t *p = dst;
    for (size_t i = 0; i < n / QK; i++) {
        const float *x = src + i * QK;
        const float d = signed_absmax(x, QK) / -16;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        block_q5_0 b;
        b.d = el_fp32_to_fp16(d);
        uint32_t qh = 0;
        for (int j = 0; j < QK / 2; j++) {
            const int q0 = trunc_clamp(x[j] * id + 16.5f, 31);
            const int q1 = trunc_clamp(x[j + QK / 2] * id + 16.5f, 31);
            b.qs[j] = (uint8_t)((q0 & 0x0F) | ((q1 & 0x0F) << 4));
            qh |= (uint32_t)(q0 >> 4) << j;
            qh |= (uint32_t)(q1 >> 4) << (j + QK / 2);
        }
        memcpy(b.qh, &qh, 4);
        memcpy(p + i * sizeof b, &b, sizeof b);
    }
}

/* quantize_row_q5_1_ref: d = (max - min) / 31; ggml does not cap q at 31 (it never exceeds it for
 * finite input), gguf-py clips: capping is the same on finite input and safe on the rest */
static void q5_1_from_float(const float *src, void *dst, size_t n) {
    uint8_t *p = dst;
    for (size_t i = 0; i < n / QK; i++) {
        const float *x = src + i * QK;
        float min, max;
        min_max(x, QK, &min, &max);
        const float d = (max - min) / 31;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        block_q5_1 b;
        b.d = el_fp32_to_fp16(d);
        b.m = el_fp32_to_fp16(min);
        uint32_t qh = 0;
        for (int j = 0; j < QK / 2; j++) {
            const int q0 = trunc_clamp((x[j] - min) * id + 0.5f, 31);
            const int q1 = trunc_clamp((x[j + QK / 2] - min) * id + 0.5f, 31);
            b.qs[j] = (uint8_t)((q0 & 0x0F) | ((q1 & 0x0F) << 4));
            qh |= (uint32_t)(q0 >> 4) << j;
            qh |= (uint32_t)(q1 >> 4) << (j + QK / 2);
        }
        memcpy(b.qh, &qh, 4);
        memcpy(p + i * sizeof b, &b, sizeof b);
    }
}

static float absmax(const float *x, int n) {
    float amax = 0.0f;
    for (int j = 0; j < n; j++) amax = fmaxf(amax, fabsf(x[j]));
    return amax;
}

/* quantize_row_q8_0_ref: d = amax / 127, q = roundf(x / d) */
static void q8_0_from_float(const float *src, void *dst, size_t n) {
    uint8_t *p = dst;
    for (size_t i = 0; i < n / QK; i++) {
        const float *x = src + i * QK;
        const float d = absmax(x, QK) / 127;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        block_q8_0 b;
        b.d = el_fp32_to_fp16(d);
        for (int j = 0; j < QK; j++) b.qs[j] = round_i8(x[j] * id);
        memcpy(p + i * sizeof b, &b, sizeof b);
    }
}

/* quantize_row_q8_1_ref: as Q8_0, plus s = d * sum(q) for the min term of Q4_1 / Q5_1 dots */
static void q8_1_from_float(const float *src, void *dst, size_t n) {
    uint8_t *p = dst;
    for (size_t i = 0; i < n / QK; i++) {
        const float *x = src + i * QK;
        const float d = absmax(x, QK) / 127;
        const float id = d != 0.0f ? 1.0f / d : 0.0f;
        block_q8_1 b;
        b.d = el_fp32_to_fp16(d);
        int sum = 0;
        for (int j = 0; j < QK; j++) {
            b.qs[j] = round_i8(x[j] * id);
            sum += b.qs[j];
        }
        b.s = el_fp32_to_fp16((float)sum * d);
        memcpy(p + i * sizeof b, &b, sizeof b);
    }
}

/* ---- dot products with 8-bit activations: integer sum per block, one float term per block,
 * accumulated in block order (ggml_vec_dot_*_generic) ---- */

/* symmetric weights x Q8_0: sum_b d_w d_a sum(q_w q_a) */
#define VEC_DOT_SYM(NAME, BLOCK, UNPACK)                                  \
    static float NAME(size_t n, const void *w, const void *a) {         \
        const uint8_t *pw = w, *pa = a;                                  \
        float sumf = 0.0f;                                               \
        for (size_t i = 0; i < n / QK; i++) {                            \
            BLOCK bw;                                                    \
            block_q8_0 ba;                                               \
            int8_t q[QK];                                                \
            memcpy(&bw, pw + i * sizeof bw, sizeof bw);                  \
            memcpy(&ba, pa + i * sizeof ba, sizeof ba);                  \
            UNPACK(&bw, q);                                              \
            const int sumi = el_dot_i8(q, ba.qs, QK);                    \
            sumf += (float)sumi * (el_fp16_to_fp32(bw.d) * el_fp16_to_fp32(ba.d)); \
        }                                                                \
        return sumf;                                                     \
    }

/* weights with a min x Q8_1: sum_b d_w d_a sum(q_w q_a) + m_w s_a, s_a = d_a sum(q_a) */
#define VEC_DOT_MIN(NAME, BLOCK, UNPACK)                                  \
    static float NAME(size_t n, const void *w, const void *a) {         \
        const uint8_t *pw = w, *pa = a;                                  \
        float sumf = 0.0f;                                               \
        for (size_t i = 0; i < n / QK; i++) {                            \
            BLOCK bw;                                                    \
            block_q8_1 ba;                                               \
            int8_t q[QK];                                                \
            memcpy(&bw, pw + i * sizeof bw, sizeof bw);                  \
            memcpy(&ba, pa + i * sizeof ba, sizeof ba);                  \
            UNPACK(&bw, q);                                              \
            const int sumi = el_dot_i8(q, ba.qs, QK);                    \
            sumf += (el_fp16_to_fp32(bw.d) * el_fp16_to_fp32(ba.d)) * (float)sumi + \
                    el_fp16_to_fp32(bw.m) * el_fp16_to_fp32(ba.s);       \
        }                                                                \
        return sumf;                                                     \
    }

VEC_DOT_SYM(q4_0_vec_dot, block_q4_0, el_unpack_q4_0)
VEC_DOT_MIN(q4_1_vec_dot, block_q4_1, el_unpack_q4_1)
VEC_DOT_SYM(q5_0_vec_dot, block_q5_0, el_unpack_q5_0)
VEC_DOT_MIN(q5_1_vec_dot, block_q5_1, el_unpack_q5_1)
VEC_DOT_SYM(q8_0_vec_dot, block_q8_0, unpack_q8_0)

/* ---- the type table ---- */

static const el_type_traits g_traits[] = {
    [EL_TYPE_F32] = {"f32", 1, 4, EL_TYPE_F32, f32_to_float, f32_from_float, f32_vec_dot},
    [EL_TYPE_F16] = {"f16", 1, 2, EL_TYPE_F32, f16_to_float, f16_from_float, f16_vec_dot},
    [EL_TYPE_Q4_0] = {"q4_0", QK4_0, sizeof(block_q4_0), EL_TYPE_Q8_0, q4_0_to_float, q4_0_from_float, q4_0_vec_dot},
    [EL_TYPE_Q4_1] = {"q4_1", QK4_1, sizeof(block_q4_1), EL_TYPE_Q8_1, q4_1_to_float, q4_1_from_float, q4_1_vec_dot},
    [EL_TYPE_Q5_0] = {"q5_0", QK5_0, sizeof(block_q5_0), EL_TYPE_Q8_0, q5_0_to_float, q5_0_from_float, q5_0_vec_dot},
    [EL_TYPE_Q5_1] = {"q5_1", QK5_1, sizeof(block_q5_1), EL_TYPE_Q8_1, q5_1_to_float, q5_1_from_float, q5_1_vec_dot},
    [EL_TYPE_Q8_0] = {"q8_0", QK8_0, sizeof(block_q8_0), EL_TYPE_Q8_0, q8_0_to_float, q8_0_from_float, q8_0_vec_dot},
    /* activations only: no dot product of their own */
    [EL_TYPE_Q8_1] = {"q8_1", QK8_1, sizeof(block_q8_1), EL_TYPE_Q8_1, q8_1_to_float, q8_1_from_float, NULL},
    [EL_TYPE_BF16] = {"bf16", 1, 2, EL_TYPE_F32, bf16_to_float, bf16_from_float, bf16_vec_dot},
};

const el_type_traits *el_get_type_traits(int type) {
    if (type >= EL_TYPE_Q2_K && type <= EL_TYPE_Q8_K) return &el_k_traits[type - EL_TYPE_Q2_K];
    if (type < 0 || (size_t)type >= sizeof g_traits / sizeof g_traits[0]) return NULL;
    /* gaps in the designated initialiser are zero: no name = unknown type */
    return g_traits[type].name ? &g_traits[type] : NULL;
}

/* ---- public API ---- */

int el_type_supported(int type) {
    const el_type_traits *t = el_get_type_traits(type);
    return t && t->to_float && t->from_float && t->vec_dot;
}

size_t el_type_block_size(int type) {
    const el_type_traits *t = el_get_type_traits(type);
    return t ? t->blck_size : 0;
}

size_t el_type_block_bytes(int type) {
    const el_type_traits *t = el_get_type_traits(type);
    return t ? t->type_size : 0;
}

/* bytes of n values, 0 when n is not a whole number of blocks or the size overflows */
static size_t row_bytes(const el_type_traits *t, size_t n) {
    if (n % t->blck_size) return 0;
    const size_t nb = n / t->blck_size;
    if (nb > SIZE_MAX / t->type_size) return 0;
    return nb * t->type_size;
}

size_t el_row_bytes(int type, size_t n) {
    const el_type_traits *t = el_get_type_traits(type);
    return t ? row_bytes(t, n) : 0;
}

/* n must be whole blocks and bytes exactly their size (n = 0 with 0 bytes is an empty row) */
static int check_row(const el_type_traits *t, size_t n, size_t bytes) {
    if (n % t->blck_size) return EL_EINVAL;
    const size_t nb = n / t->blck_size;
    if (nb > SIZE_MAX / t->type_size) return EL_EINVAL;
    return nb * t->type_size == bytes ? EL_OK : EL_EINVAL;
}

int el_vec_dot_type(int wtype) {
    const el_type_traits *t = el_get_type_traits(wtype);
    return t && t->vec_dot ? t->vec_dot_type : EL_EUNSUPPORTED;
}

int el_dequantize(int type, const void *src, size_t src_bytes, float *dst, size_t n) {
    const el_type_traits *t = el_get_type_traits(type);
    if (!t || !t->to_float) return EL_EUNSUPPORTED;
    if (!src || !dst) return EL_EINVAL;
    const int st = check_row(t, n, src_bytes);
    if (st != EL_OK) return st;
    if (n > SIZE_MAX / sizeof(float)) return EL_EINVAL;
    t->to_float(src, dst, n);
    return EL_OK;
}

int el_quantize(int type, const float *src, size_t n, void *dst, size_t dst_bytes) {
    const el_type_traits *t = el_get_type_traits(type);
    if (!t || !t->from_float) return EL_EUNSUPPORTED;
    if (!src || !dst) return EL_EINVAL;
    const int st = check_row(t, n, dst_bytes);
    if (st != EL_OK) return st;
    /* Block formats cannot hold inf / NaN: refuse rather than write a block that silently means
     * something else. The float formats store them as they are. */
    if (t->blck_size > 1)
        for (size_t i = 0; i < n; i++)
            if (!isfinite(src[i])) return EL_EINVAL;
    t->from_float(src, dst, n);
    return EL_OK;
}

int el_vec_dot(int wtype, size_t n, const void *w, size_t w_bytes, const void *a, size_t a_bytes, float *out) {
    const el_type_traits *t = el_get_type_traits(wtype);
    if (!t || !t->vec_dot) return EL_EUNSUPPORTED;
    if (!w || !a || !out) return EL_EINVAL;
    int st = check_row(t, n, w_bytes);
    if (st != EL_OK) return st;
    const el_type_traits *ta = el_get_type_traits(t->vec_dot_type);
    st = check_row(ta, n, a_bytes);
    if (st != EL_OK) return st;
    /* through the dispatch table, so the active ISA's kernel is what gets tested */
    const el_vec_dot_fn fn = el_kern()->vec_dot[wtype];
    if (!fn) return EL_EUNSUPPORTED;
    *out = fn(n, w, a);
    return EL_OK;
}

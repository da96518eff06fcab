/* arch/avx2.c - AVX2 + FMA + F16C kernels for x86-64 hosts (compiled with target attributes, so
 * the library still loads on CPUs without them; dispatch.c only installs these when cpuid says so).
 * Float rows, the 32-value block formats and activation quantization live here; the K-quant dot
 * products and Q8_K quantization are in avx2_kquants.c. No AVX-512 here: a separate path. */
#include "../dispatch.h"

#if defined(__x86_64__)
#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "../ops.h"
#include "avx2_common.h"

/* ---- float rows ---- */

/* Four independent accumulators of 8 lanes: enough FMAs in flight to hide their latency. */
EL_AVX2 static float dot_f32_avx2(size_t n, const float *a, const float *b) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float s = el_hsum_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

/* 8 halves from p (any alignment) as floats */
EL_AVX2 static inline __m256 load_f16x8(const void *p) {
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
}

/* 8 bfloat16 from p as floats: a bf16 is the top half of a float32 */
EL_AVX2 static inline __m256 load_bf16x8(const void *p) {
    const __m256i u = _mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(u, 16));
}

EL_AVX2 static float dot_f32_f16_avx2(size_t n, const float *a, const el_half *b) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load_f16x8(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), load_f16x8(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), load_f16x8(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), load_f16x8(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), load_f16x8(b + i), s0);
    float s = el_hsum_ps(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) s += a[i] * _cvtsh_ss(b[i]);
    return s;
}

EL_AVX2 static void axpy_f16_avx2(size_t n, float alpha, const el_half *x, float *y) {
    const __m256 va = _mm256_set1_ps(alpha);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, load_f16x8(x + i), _mm256_loadu_ps(y + i)));
        _mm256_storeu_ps(y + i + 8, _mm256_fmadd_ps(va, load_f16x8(x + i + 8), _mm256_loadu_ps(y + i + 8)));
    }
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, load_f16x8(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += alpha * _cvtsh_ss(x[i]);
}

EL_AVX2 static void axpy_f32_avx2(size_t n, float alpha, const float *x, float *y) {
    const __m256 va = _mm256_set1_ps(alpha);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
        _mm256_storeu_ps(y + i + 8, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i + 8), _mm256_loadu_ps(y + i + 8)));
    }
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(y + i, _mm256_fmadd_ps(va, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += alpha * x[i];
}

/* d = t B for m outputs (dispatch.h): 32 outputs in four registers while k runs, then 8, then one;
 * the tail's scalar fmaf is the same fused step as a lane's. */
#define EL_VECMAT(NAME, T, LOAD8, TO_F32)                                                          \
    EL_AVX2 static void NAME(size_t rank, size_t m, const float *t, const T *b, size_t ld, float *d) { \
        size_t o = 0;                                                                              \
        for (; o + 32 <= m; o += 32) {                                                             \
            __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;                            \
            for (size_t k = 0; k < rank; k++) {                                                    \
                const __m256 tk = _mm256_set1_ps(t[k]);                                            \
                const T *bk = b + k * ld + o;                                                      \
                s0 = _mm256_fmadd_ps(tk, LOAD8(bk), s0);                                           \
                s1 = _mm256_fmadd_ps(tk, LOAD8(bk + 8), s1);                                       \
                s2 = _mm256_fmadd_ps(tk, LOAD8(bk + 16), s2);                                      \
                s3 = _mm256_fmadd_ps(tk, LOAD8(bk + 24), s3);                                      \
            }                                                                                      \
            _mm256_storeu_ps(d + o, s0), _mm256_storeu_ps(d + o + 8, s1);                          \
            _mm256_storeu_ps(d + o + 16, s2), _mm256_storeu_ps(d + o + 24, s3);                    \
        }                                                                                          \
        for (; o + 8 <= m; o += 8) {                                                               \
            __m256 s0 = _mm256_setzero_ps();                                                       \
            for (size_t k = 0; k < rank; k++) s0 = _mm256_fmadd_ps(_mm256_set1_ps(t[k]), LOAD8(b + k * ld + o), s0); \
            _mm256_storeu_ps(d + o, s0);                                                           \
        }                                                                                          \
        for (; o < m; o++) {                                                                       \
            float s = 0.0f;                                                                        \
            for (size_t k = 0; k < rank; k++) s = fmaf(t[k], TO_F32(b[k * ld + o]), s);            \
            d[o] = s;                                                                              \
        }                                                                                          \
    }

static inline float f32_id(float x) { return x; }
EL_VECMAT(vecmat_f32_avx2, float, _mm256_loadu_ps, f32_id)
EL_VECMAT(vecmat_f16_avx2, el_half, load_f16x8, _cvtsh_ss)

/* Float weight rows (F32, F16, BF16) x F32 activations, NR weight rows x NV activation rows per call:
 * a weight vector is widened once for the NV activations, an activation vector loaded once for the NR
 * rows. Each output is one 8-lane FMA chain, el_hsum_ps, then the n % 8 tail in order as multiply and
 * add, whatever NR and NV: every entry has vec_dot's bits, and the three types share the chain, so a
 * weight stored as halves gives the bits of its values as F32 (LoRA's F16 adapters rely on it). GGUF
 * rows may sit at any byte offset: every load is loadu, the scalar tails go through memcpy.
 * LOAD8(row, i): values i..i+7 as floats; TO_F32(row, i): value i. */
EL_AVX2 static inline __m256 f32x8_ld(const uint8_t *p, size_t i) { return _mm256_loadu_ps((const float *)p + i); }
EL_AVX2 static inline __m256 f16x8_ld(const uint8_t *p, size_t i) { return load_f16x8(p + 2 * i); }
EL_AVX2 static inline __m256 bf16x8_ld(const uint8_t *p, size_t i) { return load_bf16x8(p + 2 * i); }
static inline float f32_at(const uint8_t *p, size_t i) {
    float x;
    memcpy(&x, p + 4 * i, 4);
    return x;
}
EL_AVX2 static inline float f16_at(const uint8_t *p, size_t i) {
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return _cvtsh_ss(h);
}
static inline float bf16_at(const uint8_t *p, size_t i) {
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return el_bf16_to_fp32(h);
}

#define EL_FLOAT_TILE_AVX2(NAME, LOAD8, TO_F32)                                                    \
    EL_AVX2 EL_FORCE_INLINE void NAME##_tile(size_t n, const void *w, size_t ws, const int NR, const void *a, \
                                             size_t as, const int NV, float *out, size_t ldo) {    \
        const uint8_t *pw = w, *pa = a;                                                            \
        __m256 acc[EL_MV_ROWS][EL_NV_MAX];                                                         \
        EL_UNROLL for (int r = 0; r < NR; r++)                                                     \
            EL_UNROLL for (int v = 0; v < NV; v++) acc[r][v] = _mm256_setzero_ps();                \
        size_t i = 0;                                                                              \
        for (; i + 8 <= n; i += 8) {                                                               \
            __m256 y[EL_NV_MAX];                                                                   \
            EL_UNROLL for (int v = 0; v < NV; v++) y[v] = f32x8_ld(pa + v * as, i);                \
            EL_UNROLL for (int r = 0; r < NR; r++) {                                               \
                const __m256 x = LOAD8(pw + r * ws, i);                                            \
                EL_UNROLL for (int v = 0; v < NV; v++) acc[r][v] = _mm256_fmadd_ps(x, y[v], acc[r][v]); \
            }                                                                                      \
        }                                                                                          \
        EL_UNROLL for (int r = 0; r < NR; r++)                                                     \
            EL_UNROLL for (int v = 0; v < NV; v++) {                                               \
                float s = el_hsum_ps(acc[r][v]);                                                   \
                for (size_t k = i; k < n; k++) s += TO_F32(pw + r * ws, k) * f32_at(pa + v * as, k); \
                out[r * ldo + v] = s;                                                              \
            }                                                                                      \
    }                                                                                              \
    EL_TILE_ENTRIES(EL_AVX2, NAME, NAME##_tile)                                                    \
    EL_TILE2_ENTRY(EL_AVX2, NAME, NAME##_tile)

EL_FLOAT_TILE_AVX2(vec_dot_f32_avx2, f32x8_ld, f32_at)
EL_FLOAT_TILE_AVX2(vec_dot_f16_avx2, f16x8_ld, f16_at)
EL_FLOAT_TILE_AVX2(vec_dot_bf16_avx2, bf16x8_ld, bf16_at)

/* ---- 32-value blocks: unpack to 32 int8 in value order, then one integer dot per block ---- */

/* unsigned x (< 128) x signed y */
EL_AVX2 static inline __m256 dot_u8_f32(__m256i x, __m256i y) {
    const __m256i p16 = _mm256_maddubs_epi16(x, y);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

EL_AVX2 static inline __m256i load_q4_1(const uint8_t *b) { return unpack_nibbles_32(b + 4); }

EL_AVX2 static inline __m256i load_q5_1(const uint8_t *b) {
    const __m256i hi = _mm256_and_si256(unpack_bits_32(b + 4), _mm256_set1_epi8(0x10));
    return _mm256_or_si256(unpack_nibbles_32(b + 8), hi);
}

/* Symmetric weights x Q8_0 (34-byte blocks: fp16 d, 32 int8): NR weight rows (at w + r * ws) x NV
 * activation rows, two blocks per iteration into two accumulators per output, so the convert/FMA
 * chains of neighbouring blocks overlap. PREP unpacks a weight block into two registers once per
 * row; APRE is the part of a block dot that depends on the activation block alone (once per
 * activation, shared by the NR rows); ACT finishes the block dot. Every output sees the operations
 * of NR = NV = 1 (vec_dot) in the same order: the scale products dx dy are the same single
 * multiplies however they are packed, and each output keeps its own two accumulators. */
#define EL_DOT_SYM(NAME, WBYTES, PREP, APRE, ACT)                                                  \
    EL_AVX2 EL_FORCE_INLINE void NAME##_tile(size_t n, const void *w, size_t ws, const int NR,     \
                                             const void *a, size_t as, const int NV, float *out,   \
                                             size_t ldo) {                                        \
        const uint8_t *pw = w, *pa = a;                                                            \
        const size_t nb = n / 32;                                                                  \
        __m256 acc0[EL_MV_ROWS][EL_NV_MAX], acc1[EL_MV_ROWS][EL_NV_MAX];                           \
        EL_UNROLL for (int r = 0; r < NR; r++)                                                     \
            EL_UNROLL for (int j = 0; j < NV; j++) acc0[r][j] = acc1[r][j] = _mm256_setzero_ps();  \
        size_t i = 0;                                                                              \
        for (; i + 2 <= nb; i += 2) {                                                              \
            __m256i a0[EL_NV_MAX], a1[EL_NV_MAX], c0[EL_NV_MAX], c1[EL_NV_MAX];                    \
            /* NR > 1: d[j][2r + b] = dx(row r, block b) dy(activation j, block b) */              \
            EL_ALIGN32 float d[EL_NV_MAX][8];                                                      \
            const __m256 dx = NR > 1 ? scales_x2_rows(pw + i * (WBYTES), ws, (WBYTES), NR) : _mm256_setzero_ps(); \
            EL_UNROLL for (int j = 0; j < NV; j++) {                                               \
                const uint8_t *y0 = pa + j * as + i * 34;                                          \
                a0[j] = load_q8_0(y0), a1[j] = load_q8_0(y0 + 34);                                 \
                c0[j] = APRE(a0[j]), c1[j] = APRE(a1[j]);                                          \
                if (NR > 1) _mm256_store_ps(d[j], _mm256_mul_ps(dx, scales_y2_x4(y0, y0 + 34)));   \
            }                                                                                      \
            EL_UNROLL for (int r = 0; r < NR; r++) {                                               \
                const uint8_t *x0 = pw + r * ws + i * (WBYTES), *x1 = x0 + (WBYTES);               \
                __m256i p00, p01, p10, p11;                                                        \
                PREP(x0, &p00, &p01);                                                              \
                PREP(x1, &p10, &p11);                                                              \
                const __m128 fx = NR == 1 && NV > 1 ? scales_x2(x0, x1) : _mm_setzero_ps();        \
                EL_UNROLL for (int j = 0; j < NV; j++) {                                           \
                    const uint8_t *y0 = pa + j * as + i * 34, *y1 = y0 + 34;                       \
                    __m256 d0, d1;                                                                 \
                    if (NR > 1) d0 = _mm256_broadcast_ss(&d[j][2 * r]), d1 = _mm256_broadcast_ss(&d[j][2 * r + 1]); \
                    else if (NV == 1) scales2(x0, x1, y0, y1, &d0, &d1);                           \
                    else scales2_y(fx, y0, y1, &d0, &d1);                                          \
                    acc0[r][j] = _mm256_fmadd_ps(d0, ACT(p00, p01, a0[j], c0[j]), acc0[r][j]);     \
                    acc1[r][j] = _mm256_fmadd_ps(d1, ACT(p10, p11, a1[j], c1[j]), acc1[r][j]);     \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        if (i < nb) {                                                                              \
            EL_UNROLL for (int r = 0; r < NR; r++) {                                               \
                const uint8_t *x0 = pw + r * ws + i * (WBYTES);                                    \
                __m256i p00, p01;                                                                  \
                PREP(x0, &p00, &p01);                                                              \
                EL_UNROLL for (int j = 0; j < NV; j++) {                                           \
                    const uint8_t *y0 = pa + j * as + i * 34;                                      \
                    const __m256i a0 = load_q8_0(y0);                                              \
                    const __m256 d0 = _mm256_set1_ps(el_h2f(x0) * el_h2f(y0));                     \
                    acc0[r][j] = _mm256_fmadd_ps(d0, ACT(p00, p01, a0, APRE(a0)), acc0[r][j]);     \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        EL_UNROLL for (int r = 0; r < NR; r++)                                                     \
            EL_UNROLL for (int j = 0; j < NV; j++) out[r * ldo + j] = el_hsum_ps(_mm256_add_ps(acc0[r][j], acc1[r][j])); \
    }                                                                                              \
    EL_TILE_ENTRIES(EL_AVX2, NAME, NAME##_tile)

/* Weights with a min x Q8_1 (36-byte blocks: fp16 d, fp16 s = d * sum(q), 32 int8):
 * d_w d_a sum(q_w q_a) + m_w s_a per block. NR weight rows x NV activation rows, two blocks per
 * iteration into two accumulators per output; the four scale products of a block pair come from one
 * multiply ([d, m] of the weights by [d, s] of the activations), the min terms add up in its lanes
 * 1 and 3. Every output sees the operations of NR = NV = 1 (vec_dot) in the same order. */

#define EL_DOT_MIN(NAME, WBYTES, LOADW)                                                            \
    EL_AVX2 EL_FORCE_INLINE void NAME##_tile(size_t n, const void *w, size_t ws, const int NR,     \
                                             const void *a, size_t as, const int NV, float *out,  \
                                             size_t ldo) {                                        \
        static const uint8_t zero_w[WBYTES], zero_a[36];                                           \
        const uint8_t *pw = w, *pa = a;                                                            \
        const size_t nb = n / 32;                                                                  \
        __m256 acc0[EL_MV_ROWS][EL_NV_MAX], acc1[EL_MV_ROWS][EL_NV_MAX];                           \
        __m128 mins[EL_MV_ROWS][EL_NV_MAX];                                                        \
        EL_UNROLL for (int r = 0; r < NR; r++)                                                     \
            EL_UNROLL for (int j = 0; j < NV; j++)                                                 \
                acc0[r][j] = acc1[r][j] = _mm256_setzero_ps(), mins[r][j] = _mm_setzero_ps();      \
        for (size_t i = 0; i < nb; i += 2) {                                                       \
            const int pair = i + 1 < nb; /* else the odd last block, with a zero block of scale 0 */ \
            EL_UNROLL for (int r = 0; r < NR; r++) {                                               \
                const uint8_t *x0 = pw + r * ws + i * (WBYTES), *x1 = pair ? x0 + (WBYTES) : zero_w; \
                const __m256i w0 = LOADW(x0), w1 = LOADW(x1);                                      \
                const __m128 hx = halves_dm2(x0, x1);                                              \
                EL_UNROLL for (int j = 0; j < NV; j++) {                                           \
                    const uint8_t *y0 = pa + j * as + i * 36, *y1 = pair ? y0 + 36 : zero_a;       \
                    /* [dx0 dy0, m0 s0, dx1 dy1, m1 s1] */                                         \
                    const __m128 p = _mm_mul_ps(hx, halves_dm2(y0, y1));                           \
                    const __m256 d0 = _mm256_broadcastss_ps(p);                                    \
                    const __m256 d1 = _mm256_permutevar8x32_ps(_mm256_castps128_ps256(p), _mm256_set1_epi32(2)); \
                    mins[r][j] = _mm_add_ps(mins[r][j], p);                                        \
                    acc0[r][j] = _mm256_fmadd_ps(d0, dot_u8_f32(w0, loadu256(y0 + 4)), acc0[r][j]); \
                    acc1[r][j] = _mm256_fmadd_ps(d1, dot_u8_f32(w1, loadu256(y1 + 4)), acc1[r][j]); \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        EL_UNROLL for (int r = 0; r < NR; r++)                                                     \
            EL_UNROLL for (int j = 0; j < NV; j++) {                                               \
                const __m128 m = mins[r][j];                                                       \
                out[r * ldo + j] = el_hsum_ps(_mm256_add_ps(acc0[r][j], acc1[r][j])) +             \
                                   (_mm_cvtss_f32(_mm_shuffle_ps(m, m, 1)) + _mm_cvtss_f32(_mm_shuffle_ps(m, m, 3))); \
            }                                                                                      \
    }                                                                                              \
    EL_TILE_ENTRIES(EL_AVX2, NAME, NAME##_tile)

/* Q4_0 keeps its quants unsigned (u = value + 8) for vpmaddubsw and takes the offset off with a
 * second vpmaddubsw: sum((u - 8) a) = sum(u a) - sum(8 a). sum(8 a) depends on the activation block
 * alone, so a multi-row call does it once for all rows. Both int16 sums are exact: |u a| <= 2 * 15 *
 * 128 per pair; the int16 differences, hence every later bit, are those of the true values. */
EL_AVX2 static inline void prep_q4_0(const uint8_t *x, __m256i *u, __m256i *unused) {
    *u = unpack_nibbles_32(x + 2);
    *unused = _mm256_setzero_si256();
}
EL_AVX2 static inline __m256i apre_off8(__m256i a) { return _mm256_maddubs_epi16(_mm256_set1_epi8(8), a); }
EL_AVX2 static inline __m256 act_off(__m256i u, __m256i unused, __m256i a, __m256i oa) {
    (void)unused;
    const __m256i p = _mm256_sub_epi16(_mm256_maddubs_epi16(u, a), oa);
    return _mm256_cvtepi32_ps(_mm256_madd_epi16(p, _mm256_set1_epi16(1)));
}

EL_DOT_SYM(vec_dot_q4_0_avx2, 18, prep_q4_0, apre_off8, act_off)

/* ---- Q5_0 and Q8_0 x Q8_0: two blocks per register ----
 * A register holds 16 bytes of block i in its low lane and the same 16 bytes of block i + 1 in its
 * high lane, so each block pair takes two registers per operand (values 0-15, values 16-31) and the
 * activation halves are paired once per activation, shared by the rows. Each output's two 128-bit
 * lanes then hold its partial sums of blocks i and i + 1; two vphaddd levels reduce four outputs at
 * once to one register [o0 o1 o2 o3 of block i | o0 o1 o2 o3 of block i + 1] of exact block sums, and
 * one convert, one scale multiply and one FMA per pair serve the four. Each block's integer dot is
 * exact, as in the scalar reference; per output the float steps are, per pair, acc_k += d cvt(sum)
 * in its lanes k and 4 + k and at the end lane k + lane 4 + k, whatever the shape (NR rows x NV
 * activations, at most 8 outputs o = r * NV + j in groups of four): vec_dot, vec_dot_nv, the
 * two-row tile and vec_dot_rows give the same bits. An odd last block pairs with a zero block. */
#define PAIR_OUT_MAX 8
_Static_assert(EL_TILE_ROWS * EL_NV_MAX <= PAIR_OUT_MAX && EL_MV_ROWS <= PAIR_OUT_MAX && EL_TILE_ROWS <= EL_MV_ROWS,
               "pair kernels: outputs, rows");
static const uint8_t q5_0_zero_w[22], q8_0_zero_w[34], q8_0_zero_a[34];

EL_AVX2 static inline __m256i loadu2_128(const uint8_t *lo, const uint8_t *hi) {
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)lo)),
                                   _mm_loadu_si128((const __m128i *)hi), 1);
}

/* four fp16 repeated: the 64-bit pattern of [h h h h] */
static inline uint64_t rep4_16(const uint8_t *p) { return (uint64_t)ld16(p) * 0x0001000100010001ULL; }

/* the fp16 scales at p0..p3 (block i) in lanes 0-3 and at pk + bytes (block i + 1, if pair) in lanes
 * 4-7, as floats; lanes k >= nk are zero */
EL_AVX2 static inline __m256 halves_group(const uint8_t *p0, const uint8_t *p1, const uint8_t *p2, const uint8_t *p3,
                                          int nk, size_t bytes, int pair) {
    const uint8_t *q[4] = {p0, p1, p2, p3};
    uint64_t lo = 0, hi = 0;
    for (int k = 0; k < nk; k++) {
        lo |= (uint64_t)ld16(q[k]) << 16 * k;
        if (pair) hi |= (uint64_t)ld16(q[k] + bytes) << 16 * k;
    }
    return _mm256_cvtph_ps(_mm_set_epi64x((long long)hi, (long long)lo));
}

EL_AVX2 static inline __m256i hsum4_epi32(__m256i a, __m256i b, __m256i c, __m256i d) {
    return _mm256_hadd_epi32(_mm256_hadd_epi32(a, b), _mm256_hadd_epi32(c, d));
}

/* The float side of a pair: v[o] are output o's int32 partial sums (lanes 0-3 block i, 4-7 block
 * i + 1), minus t[o] when T (Q5_0's 16 sum(a)); the weight blocks are WB bytes, the scale first.
 * DX: the caller has the four rows' scales of a vec_dot_rows call in dx4 already. */
EL_AVX2 EL_FORCE_INLINE void pair_finish(const uint8_t *pw, size_t ws, const size_t WB, const int NR, const uint8_t *pa,
                                         size_t as, const int NV, size_t i, const int PAIR, const __m256i *v,
                                         const int T, const __m256i *t, const int DX, __m256 dx4, __m256 *acc) {
    const int NO = NR * NV, NG = (NO + 3) / 4;
    const uint8_t *x = pw + i * WB, *y = pa + i * 34;
    EL_UNROLL for (int g = 0; g < NG; g++) {
        const int nk = NO - 4 * g < 4 ? NO - 4 * g : 4;
        __m256i u[4];
        EL_UNROLL for (int k = 0; k < 4; k++) u[k] = T ? _mm256_sub_epi32(v[4 * g + k], t[4 * g + k]) : v[4 * g + k];
        const __m256i s = hsum4_epi32(u[0], u[1], u[2], u[3]);
        /* d(o, b) = dx(r, b) dy(j, b), one multiply each; a group is one row when NV = 4 */
        __m256 dx, dy;
        if (DX) {
            dx = dx4;
        } else if (NV == 4 || NR == 1) {
            const uint8_t *x0 = x + (NV == 4 ? g : 0) * ws;
            dx = _mm256_cvtph_ps(_mm_set_epi64x((long long)(PAIR ? rep4_16(x0 + WB) : 0), (long long)rep4_16(x0)));
        } else {
            const int o = 4 * g;
            dx = halves_group(x + (o / NV) * ws, x + ((o + 1) / NV) * ws, x + ((o + 2) / NV) * ws,
                              x + ((o + 3) / NV) * ws, nk, WB, PAIR);
        }
        if (NV == 1) {
            dy = _mm256_cvtph_ps(_mm_set_epi64x((long long)(PAIR ? rep4_16(y + 34) : 0), (long long)rep4_16(y)));
        } else {
            const int o = 4 * g;
            dy = halves_group(y + (o % NV) * as, y + ((o + 1) % NV) * as, y + ((o + 2) % NV) * as,
                              y + ((o + 3) % NV) * as, nk, 34, PAIR);
        }
        acc[g] = _mm256_fmadd_ps(_mm256_mul_ps(dx, dy), _mm256_cvtepi32_ps(s), acc[g]);
    }
}

/* the activation pairs of the NV rows: al values 0-15, ah values 16-31 */
EL_AVX2 EL_FORCE_INLINE void pair_acts(const uint8_t *pa, size_t as, const int NV, size_t i, const int PAIR,
                                       __m256i *al, __m256i *ah) {
    EL_UNROLL for (int j = 0; j < NV; j++) {
        const uint8_t *y0 = pa + j * as + i * 34, *y1 = PAIR ? y0 + 34 : q8_0_zero_a;
        al[j] = loadu2_128(y0 + 2, y1 + 2);
        ah[j] = loadu2_128(y0 + 18, y1 + 18);
    }
}

/* sum(w a) of signed w (|w| <= 128 as unsigned) and a (|a| <= 127), both halves: |w| against a with
 * w's sign through vpmaddubsw; HALVES16: the two halves' int16 sums may be added before vpmaddwd
 * (|w| <= 16), else each half goes to int32 (pair sums <= 2 * 128 * 127 < 2^15: exact either way) */
EL_AVX2 static inline __m256i dot_signed(__m256i wl, __m256i wh, __m256i pl, __m256i ph, __m256i al, __m256i ah,
                                        int halves16) {
    const __m256i ones = _mm256_set1_epi16(1);
    const __m256i l = _mm256_maddubs_epi16(pl, _mm256_sign_epi8(al, wl));
    const __m256i h = _mm256_maddubs_epi16(ph, _mm256_sign_epi8(ah, wh));
    if (halves16) return _mm256_madd_epi16(_mm256_add_epi16(l, h), ones);
    return _mm256_add_epi32(_mm256_madd_epi16(l, ones), _mm256_madd_epi16(h, ones));
}

/* h: the two blocks' first 16 bytes (d, qh, ...), lane 0 block i, lane 1 block i + 1 -> 0x10 where a
 * high bit is set, for the low-nibble register (bits 0-15 of qh) and the high-nibble one (16-31) */
EL_AVX2 static inline void q5_0_pair_high(__m256i h, __m256i *hl, __m256i *hh) {
    const __m256i spread_l = _mm256_setr_epi8(2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3,
                                              2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i spread_h = _mm256_setr_epi8(4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5,
                                              4, 4, 4, 4, 4, 4, 4, 4, 5, 5, 5, 5, 5, 5, 5, 5);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ULL), b16 = _mm256_set1_epi8(0x10);
    *hl = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(h, spread_l), bit), bit), b16);
    *hh = _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(h, spread_h), bit), bit), b16);
}

/* Q5_0 (22-byte blocks: fp16 d, 32 high bits qh, 16 bytes of nibbles qs): low nibbles (values
 * 0-15) and high nibbles (values 16-31) each fill one register with one and / shift, the high bits
 * spread from qh. u = nibble + 16 h = w + 16 in 0..31. Several rows: u goes to vpmaddubsw unsigned
 * (|u a| <= 31 * 128; a pair plus the other half's pair < 2^15) and 16 sum(a), once per activation,
 * comes off the exact block sums. One row: that would be a second dot for this row alone, so w
 * against a with w's sign instead; the same integers. */
EL_AVX2 EL_FORCE_INLINE void q5_0_pair(const uint8_t *pw, size_t ws, const int NR, const uint8_t *pa, size_t as,
                                       const int NV, size_t i, const int PAIR, __m256 *acc) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1), o16 = _mm256_set1_epi8(16);
    __m256i al[EL_NV_MAX], ah[EL_NV_MAX], v[PAIR_OUT_MAX], t[PAIR_OUT_MAX], h[EL_MV_ROWS];
    pair_acts(pa, as, NV, i, PAIR, al, ah);
    EL_UNROLL for (int o = 0; o < PAIR_OUT_MAX; o++) t[o] = v[o] = _mm256_setzero_si256();
    EL_UNROLL for (int r = 0; r < NR; r++) {
        const uint8_t *x0 = pw + r * ws + i * 22, *x1 = PAIR ? x0 + 22 : q5_0_zero_w;
        const __m256i q = loadu2_128(x0 + 6, x1 + 6);
        __m256i hl, hh;
        h[r] = loadu2_128(x0, x1);
        q5_0_pair_high(h[r], &hl, &hh);
        const __m256i ul = _mm256_or_si256(_mm256_and_si256(q, m4), hl);
        const __m256i uh = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q, 4), m4), hh);
        if (NR == 1) {
            const __m256i wl = _mm256_sub_epi8(ul, o16), wh = _mm256_sub_epi8(uh, o16);
            const __m256i pl = _mm256_sign_epi8(wl, wl), ph = _mm256_sign_epi8(wh, wh);
            EL_UNROLL for (int j = 0; j < NV; j++) v[j] = dot_signed(wl, wh, pl, ph, al[j], ah[j], 1);
        } else {
            EL_UNROLL for (int j = 0; j < NV; j++)
                v[r * NV + j] = _mm256_madd_epi16(
                    _mm256_add_epi16(_mm256_maddubs_epi16(ul, al[j]), _mm256_maddubs_epi16(uh, ah[j])), ones);
        }
    }
    if (NR > 1)
        EL_UNROLL for (int j = 0; j < NV; j++) {
            const __m256i c = _mm256_madd_epi16(
                _mm256_add_epi16(_mm256_maddubs_epi16(o16, al[j]), _mm256_maddubs_epi16(o16, ah[j])), ones);
            EL_UNROLL for (int r = 0; r < NR; r++) t[r * NV + j] = c;
        }
    /* rows (NR = 4, NV = 1): word 0 of each lane of h[r] is dx(r, b); gathered to [dx0 dx1 dx2 dx3] per lane */
    const int DX = NR == EL_MV_ROWS && NV == 1;
    __m256 dx4 = _mm256_setzero_ps();
    if (DX) {
        const __m256i x01 = _mm256_unpacklo_epi16(h[0], h[1]), x23 = _mm256_unpacklo_epi16(h[2], h[3]);
        dx4 = _mm256_cvtph_ps(_mm256_castsi256_si128(_mm256_permute4x64_epi64(_mm256_unpacklo_epi32(x01, x23), 0x08)));
    }
    pair_finish(pw, ws, 22, NR, pa, as, NV, i, PAIR, v, NR > 1, t, DX, dx4, acc);
}

/* Q8_0 (34-byte blocks: fp16 d, 32 int8): w against a with w's sign, each half to int32 */
EL_AVX2 EL_FORCE_INLINE void q8_0_pair(const uint8_t *pw, size_t ws, const int NR, const uint8_t *pa, size_t as,
                                       const int NV, size_t i, const int PAIR, __m256 *acc) {
    __m256i al[EL_NV_MAX], ah[EL_NV_MAX], v[PAIR_OUT_MAX];
    pair_acts(pa, as, NV, i, PAIR, al, ah);
    EL_UNROLL for (int o = NR * NV; o < PAIR_OUT_MAX; o++) v[o] = _mm256_setzero_si256();
    EL_UNROLL for (int r = 0; r < NR; r++) {
        const uint8_t *x0 = pw + r * ws + i * 34, *x1 = PAIR ? x0 + 34 : q8_0_zero_w;
        const __m256i wl = loadu2_128(x0 + 2, x1 + 2), wh = loadu2_128(x0 + 18, x1 + 18);
        const __m256i pl = _mm256_sign_epi8(wl, wl), ph = _mm256_sign_epi8(wh, wh);
        EL_UNROLL for (int j = 0; j < NV; j++) v[r * NV + j] = dot_signed(wl, wh, pl, ph, al[j], ah[j], 0);
    }
    pair_finish(pw, ws, 34, NR, pa, as, NV, i, PAIR, v, 0, v, 0, _mm256_setzero_ps(), acc);
}

/* vec_dot, vec_dot_nv, vec_dot_rows and the two-row vec_dot_tile of a pair kernel */
#define EL_PAIR_ENTRIES(NAME, PAIRFN)                                                              \
    EL_AVX2 EL_FORCE_INLINE void NAME##_tile(size_t n, const void *w, size_t ws, const int NR, const void *a, \
                                             size_t as, const int NV, float *out, size_t ldo) {    \
        const size_t nb = n / 32;                                                                  \
        __m256 acc[PAIR_OUT_MAX / 4] = {_mm256_setzero_ps(), _mm256_setzero_ps()};                 \
        size_t i = 0;                                                                              \
        for (; i + 2 <= nb; i += 2) PAIRFN(w, ws, NR, a, as, NV, i, 1, acc);                       \
        if (i < nb) PAIRFN(w, ws, NR, a, as, NV, i, 0, acc);                                       \
        EL_ALIGN32 float f[PAIR_OUT_MAX / 4][8];                                                   \
        EL_UNROLL for (int g = 0; g < (NR * NV + 3) / 4; g++) _mm256_store_ps(f[g], acc[g]);       \
        EL_UNROLL for (int r = 0; r < NR; r++)                                                     \
            EL_UNROLL for (int j = 0; j < NV; j++) {                                               \
                const int o = r * NV + j;                                                          \
                out[r * ldo + j] = f[o / 4][o % 4] + f[o / 4][4 + o % 4];                          \
            }                                                                                      \
    }                                                                                              \
    EL_TILE_ENTRIES(EL_AVX2, NAME, NAME##_tile)                                                    \
    EL_TILE2_ENTRY(EL_AVX2, NAME, NAME##_tile)

EL_PAIR_ENTRIES(vec_dot_q5_0_avx2, q5_0_pair)
EL_PAIR_ENTRIES(vec_dot_q8_0_avx2, q8_0_pair)

/* ---- GELU through the fp16 table ----
 * el_gelu_lut eight at a time: vcvtps2ph rounds to nearest even as el_fp32_to_fp16 does (finite
 * inputs; the lanes that are not looked up, |x| >= 10 or NaN, are blended over), the lookups stay
 * scalar (AVX2 has no 16-bit gather). */
EL_AVX2 static void gelu_lut_avx2(float *x, size_t n, const el_half *table) {
    const __m256 lo = _mm256_set1_ps(-10.0f), hi = _mm256_set1_ps(10.0f);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        uint16_t h[8];
        _mm_storeu_si128((__m128i *)h, _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
        const __m128i t = _mm_setr_epi16((short)table[h[0]], (short)table[h[1]], (short)table[h[2]], (short)table[h[3]],
                                         (short)table[h[4]], (short)table[h[5]], (short)table[h[6]], (short)table[h[7]]);
        /* v < 10: the table's value, else v itself (NaN too); v <= -10: +0 */
        const __m256 r = _mm256_blendv_ps(v, _mm256_cvtph_ps(t), _mm256_cmp_ps(v, hi, _CMP_LT_OQ));
        _mm256_storeu_ps(x + i, _mm256_andnot_ps(_mm256_cmp_ps(v, lo, _CMP_LE_OQ), r));
    }
    if (i < n) el_gelu_lut(x + i, n - i, table);
}

/* ---- activation panels for the pair kernels' two-row tile ----
 * A group of EL_NV_MAX Q8_0 activation rows, per block pair (i, i + 1): the rows' scales as floats
 * [dy(j, i) for j < 4 | dy(j, i + 1)], in the same lanes 16 sum(a) per block as int32 (Q5_0's offset),
 * then per row j the two registers pair_acts builds (values 0-15 of both blocks, values 16-31). Rows
 * past the batch and the block after an odd last one are zeros. Packed once per batch, the tile loads
 * whole registers instead of inserting halves and gathering fp16 scales per call (Q8_0 2 x 4 tile:
 * about 20% fewer cycles). The integer block sums and the float steps per output are pair_finish's,
 * so every output keeps the bits of vec_dot. */
EL_AVX2 static void pack_panel_q8_0_avx2(const void *a, size_t as, size_t cols, size_t n_vec, void *panel) {
    const size_t nb = cols / 32, np = (nb + 1) / 2, group_bytes = el_panel_group_bytes(EL_TYPE_Q8_0, cols);
    for (size_t g = 0; g * EL_NV_MAX < n_vec; g++) {
        const size_t nv = n_vec - g * EL_NV_MAX < EL_NV_MAX ? n_vec - g * EL_NV_MAX : EL_NV_MAX;
        for (size_t p = 0; p < np; p++) {
            uint8_t *q = (uint8_t *)panel + g * group_bytes + p * EL_PANEL_PAIR_BYTES;
            float dy[8] = {0};
            int32_t c[8] = {0};
            memset(q + 64, 0, EL_NV_MAX * 64);
            for (size_t j = 0; j < nv; j++)
                for (size_t b = 0; b < 2 && 2 * p + b < nb; b++) {
                    const uint8_t *y = (const uint8_t *)a + (g * EL_NV_MAX + j) * as + (2 * p + b) * 34;
                    const __m256i v = _mm256_loadu_si256((const __m256i *)(y + 2));
                    dy[4 * b + j] = el_h2f(y);
                    c[4 * b + j] = 16 * el_hsum_epi32(_mm256_madd_epi16(
                                            _mm256_maddubs_epi16(_mm256_set1_epi8(1), v), _mm256_set1_epi16(1)));
                    memcpy(q + 64 + 64 * j + 16 * b, y + 2, 16);
                    memcpy(q + 96 + 64 * j + 16 * b, y + 18, 16);
                }
            memcpy(q, dy, sizeof dy);
            memcpy(q + 32, c, sizeof c);
        }
    }
}

/* lanes of output group g: output o = r * NV + j in lane o % 4 (block i) and 4 + o % 4 (block i + 1);
 * by row: the index of row r's scale in [dx(0, i) dx(1, i) dx(0, i + 1) dx(1, i + 1)], else of
 * activation j's in the panel's [dy(j, i) | dy(j, i + 1)]. Lanes past the outputs take any valid index. */
EL_AVX2 EL_FORCE_INLINE __m256i panel_lanes(const int NV, const int g, const int by_row) {
    int ix[8];
    EL_UNROLL for (int k = 0; k < 4; k++) {
        const int o = 4 * g + k, v = by_row ? (o / NV) % 2 : o % NV;
        ix[k] = v;
        ix[4 + k] = (by_row ? 2 : 4) + v;
    }
    return _mm256_setr_epi32(ix[0], ix[1], ix[2], ix[3], ix[4], ix[5], ix[6], ix[7]);
}

/* The float side, as pair_finish: v[o] output o's int32 partial sums, minus 16 sum(a) when T. */
EL_AVX2 EL_FORCE_INLINE void panel_finish(const uint8_t *q, __m256 dxx, const int NV, const __m256i *v, const int T,
                                          __m256 *acc) {
    const int NG = (EL_TILE_ROWS * NV + 3) / 4;
    const __m256 dy = _mm256_load_ps((const float *)q);
    EL_UNROLL for (int g = 0; g < NG; g++) {
        __m256i s = hsum4_epi32(v[4 * g], v[4 * g + 1], v[4 * g + 2], v[4 * g + 3]);
        const __m256i lj = panel_lanes(NV, g, 0);
        if (T) s = _mm256_sub_epi32(s, _mm256_permutevar8x32_epi32(_mm256_load_si256((const __m256i *)(q + 32)), lj));
        const __m256 dx = _mm256_permutevar8x32_ps(dxx, panel_lanes(NV, g, 1));
        const __m256 dyg = NV == EL_NV_MAX ? dy : _mm256_permutevar8x32_ps(dy, lj);
        acc[g] = _mm256_fmadd_ps(_mm256_mul_ps(dx, dyg), _mm256_cvtepi32_ps(s), acc[g]);
    }
}

/* [dx(0, i) dx(1, i) dx(0, i + 1) dx(1, i + 1)] from the fp16 scales at the blocks' starts */
EL_AVX2 static inline __m256 panel_dx(const uint8_t *x00, const uint8_t *x10, const uint8_t *x01, const uint8_t *x11) {
    const uint64_t h = (uint64_t)ld16(x00) | (uint64_t)ld16(x10) << 16 | (uint64_t)ld16(x01) << 32 |
                       (uint64_t)ld16(x11) << 48;
    return _mm256_castps128_ps256(_mm_cvtph_ps(_mm_cvtsi64_si128((long long)h)));
}

EL_AVX2 EL_FORCE_INLINE void q8_0_panel_pair(const uint8_t *pw, size_t ws, const uint8_t *q, const int NV, size_t i,
                                             const int PAIR, __m256 *acc) {
    __m256i v[PAIR_OUT_MAX];
    const uint8_t *x[EL_TILE_ROWS][2];
    EL_UNROLL for (int o = EL_TILE_ROWS * NV; o < PAIR_OUT_MAX; o++) v[o] = _mm256_setzero_si256();
    EL_UNROLL for (int r = 0; r < EL_TILE_ROWS; r++) {
        x[r][0] = pw + r * ws + i * 34, x[r][1] = PAIR ? x[r][0] + 34 : q8_0_zero_w;
        const __m256i wl = loadu2_128(x[r][0] + 2, x[r][1] + 2), wh = loadu2_128(x[r][0] + 18, x[r][1] + 18);
        const __m256i pl = _mm256_sign_epi8(wl, wl), ph = _mm256_sign_epi8(wh, wh);
        EL_UNROLL for (int j = 0; j < NV; j++)
            v[r * NV + j] = dot_signed(wl, wh, pl, ph, _mm256_load_si256((const __m256i *)(q + 64 + 64 * j)),
                                       _mm256_load_si256((const __m256i *)(q + 96 + 64 * j)), 0);
    }
    panel_finish(q, panel_dx(x[0][0], x[1][0], x[0][1], x[1][1]), NV, v, 0, acc);
}

EL_AVX2 EL_FORCE_INLINE void q5_0_panel_pair(const uint8_t *pw, size_t ws, const uint8_t *q, const int NV, size_t i,
                                             const int PAIR, __m256 *acc) {
    const __m256i m4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
    __m256i v[PAIR_OUT_MAX];
    const uint8_t *x[EL_TILE_ROWS][2];
    EL_UNROLL for (int o = EL_TILE_ROWS * NV; o < PAIR_OUT_MAX; o++) v[o] = _mm256_setzero_si256();
    EL_UNROLL for (int r = 0; r < EL_TILE_ROWS; r++) {
        x[r][0] = pw + r * ws + i * 22, x[r][1] = PAIR ? x[r][0] + 22 : q5_0_zero_w;
        const __m256i qs = loadu2_128(x[r][0] + 6, x[r][1] + 6);
        __m256i hl, hh;
        q5_0_pair_high(loadu2_128(x[r][0], x[r][1]), &hl, &hh);
        const __m256i ul = _mm256_or_si256(_mm256_and_si256(qs, m4), hl);
        const __m256i uh = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(qs, 4), m4), hh);
        EL_UNROLL for (int j = 0; j < NV; j++)
            v[r * NV + j] = _mm256_madd_epi16(
                _mm256_add_epi16(_mm256_maddubs_epi16(ul, _mm256_load_si256((const __m256i *)(q + 64 + 64 * j))),
                                 _mm256_maddubs_epi16(uh, _mm256_load_si256((const __m256i *)(q + 96 + 64 * j)))),
                ones);
    }
    panel_finish(q, panel_dx(x[0][0], x[1][0], x[0][1], x[1][1]), NV, v, 1, acc);
}

/* vec_dot_panel of a pair kernel: two-row tiles over one panel group */
#define EL_PANEL_ENTRY(NAME, PAIRFN)                                                               \
    EL_AVX2 EL_FORCE_INLINE void NAME##_panel_tile(size_t n, const uint8_t *w, size_t ws, const uint8_t *q, \
                                                   const int NV, float *out) {                     \
        const size_t nb = n / 32;                                                                  \
        __m256 acc[PAIR_OUT_MAX / 4] = {_mm256_setzero_ps(), _mm256_setzero_ps()};                 \
        size_t i = 0;                                                                              \
        for (; i + 2 <= nb; i += 2) PAIRFN(w, ws, q + i / 2 * EL_PANEL_PAIR_BYTES, NV, i, 1, acc);    \
        if (i < nb) PAIRFN(w, ws, q + i / 2 * EL_PANEL_PAIR_BYTES, NV, i, 0, acc);                    \
        EL_ALIGN32 float f[PAIR_OUT_MAX / 4][8];                                                   \
        EL_UNROLL for (int g = 0; g < (EL_TILE_ROWS * NV + 3) / 4; g++) _mm256_store_ps(f[g], acc[g]); \
        EL_UNROLL for (int o = 0; o < EL_TILE_ROWS * NV; o++) out[o] = f[o / 4][o % 4] + f[o / 4][4 + o % 4]; \
    }                                                                                              \
    EL_PANEL_FROM_TILE(EL_AVX2, NAME##_panel, NAME##_panel_tile)
_Static_assert(EL_TILE_ROWS == 2, "panel tiles: two rows");

EL_PANEL_ENTRY(vec_dot_q5_0_avx2, q5_0_panel_pair)
EL_PANEL_ENTRY(vec_dot_q8_0_avx2, q8_0_panel_pair)

EL_DOT_MIN(vec_dot_q4_1_avx2, 20, load_q4_1)
EL_DOT_MIN(vec_dot_q5_1_avx2, 24, load_q5_1)

/* ---- activation quantization: the same bytes as quants.c's reference ----
 * d = amax / 127, id = 1 / d, q = roundf(x * id) (half away from zero, not the nearest-even of
 * vcvtps2dq), out-of-range or NaN products -> 0: each step is the reference's own float op. */

/* roundf per lane, exactly: x - trunc(x) is exact, so compare its magnitude with 0.5 */
EL_AVX2 static inline __m256 round_away(__m256 v) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256 t = _mm256_round_ps(v, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
    const __m256 frac = _mm256_andnot_ps(sign, _mm256_sub_ps(v, t));
    const __m256 up = _mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ);
    const __m256 one = _mm256_or_ps(_mm256_and_ps(v, sign), _mm256_set1_ps(1.0f)); /* copysign(1, v) */
    return _mm256_add_ps(t, _mm256_and_ps(up, one));
}

/* round_i8 of quants.c on 8 lanes, as int32 */
EL_AVX2 static inline __m256i round_i8x8(__m256 v) {
    const __m256 ok = _mm256_and_ps(_mm256_cmp_ps(v, _mm256_set1_ps(-128.0f), _CMP_GT_OQ),
                                    _mm256_cmp_ps(v, _mm256_set1_ps(128.0f), _CMP_LT_OQ));
    const __m256 r = _mm256_min_ps(round_away(v), _mm256_set1_ps(127.0f));
    return _mm256_cvttps_epi32(_mm256_and_ps(r, ok));
}

/* four vectors of 8 int32 (each in [-128, 127]) -> 32 int8 in order */
EL_AVX2 static inline __m256i pack_i32x32(__m256i a, __m256i b, __m256i c, __m256i d) {
    const __m256i ab = _mm256_packs_epi32(a, b); /* lanes interleave: a0-3 b0-3 | a4-7 b4-7 */
    const __m256i cd = _mm256_packs_epi32(c, d);
    const __m256i abcd = _mm256_packs_epi16(ab, cd); /* a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7 d4-7 */
    return _mm256_permutevar8x32_epi32(abcd, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* quantizes the 32 floats at x to qs; returns d (float, before fp16 rounding) and the int sum */
EL_AVX2 static inline float quant_block_q8(const float *x, int8_t *qs, int *sum) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    const __m256 v0 = _mm256_loadu_ps(x), v1 = _mm256_loadu_ps(x + 8);
    const __m256 v2 = _mm256_loadu_ps(x + 16), v3 = _mm256_loadu_ps(x + 24);
    /* fmaxf(amax, |x|) ignores a NaN |x|; vmaxps returns its second operand when either is NaN,
     * so the running max goes second and stays a number */
    __m256 m = _mm256_setzero_ps();
    m = _mm256_max_ps(_mm256_and_ps(v0, absmask), m);
    m = _mm256_max_ps(_mm256_and_ps(v1, absmask), m);
    m = _mm256_max_ps(_mm256_and_ps(v2, absmask), m);
    m = _mm256_max_ps(_mm256_and_ps(v3, absmask), m);
    const float amax = el_hmax_ps(m);
    const float d = amax / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    const __m256 vid = _mm256_set1_ps(id);
    const __m256i i0 = round_i8x8(_mm256_mul_ps(v0, vid)), i1 = round_i8x8(_mm256_mul_ps(v1, vid));
    const __m256i i2 = round_i8x8(_mm256_mul_ps(v2, vid)), i3 = round_i8x8(_mm256_mul_ps(v3, vid));
    _mm256_storeu_si256((__m256i *)qs, pack_i32x32(i0, i1, i2, i3));
    if (sum) *sum = el_hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(i0, i1), _mm256_add_epi32(i2, i3)));
    return d;
}

EL_AVX2 static void quantize_q8_0_avx2(const float *src, void *dst, size_t n) {
    uint8_t *p = dst;
    for (size_t i = 0; i < n / 32; i++) {
        uint8_t *b = p + i * 34;
        const float d = quant_block_q8(src + i * 32, (int8_t *)(b + 2), NULL);
        el_store_f2h(b, d);
    }
}

EL_AVX2 static void quantize_q8_1_avx2(const float *src, void *dst, size_t n) {
    uint8_t *p = dst;
    for (size_t i = 0; i < n / 32; i++) {
        uint8_t *b = p + i * 36;
        int sum;
        const float d = quant_block_q8(src + i * 32, (int8_t *)(b + 4), &sum);
        el_store_f2h(b, d);
        el_store_f2h(b + 2, (float)sum * d);
    }
}

void el_kernels_fill_avx2(el_kernels *k) {
    k->name = "avx2";
    EL_SET_DOT_ENTRIES(k, EL_TYPE_F32, vec_dot_f32_avx2, vec_dot_f32_avx2_tile2);
    EL_SET_DOT_ENTRIES(k, EL_TYPE_F16, vec_dot_f16_avx2, vec_dot_f16_avx2_tile2);
    EL_SET_DOT_ENTRIES(k, EL_TYPE_BF16, vec_dot_bf16_avx2, vec_dot_bf16_avx2_tile2);
    k->vec_dot[EL_TYPE_Q8_0] = vec_dot_q8_0_avx2;
    k->vec_dot[EL_TYPE_Q4_0] = vec_dot_q4_0_avx2;
    k->vec_dot[EL_TYPE_Q5_0] = vec_dot_q5_0_avx2;
    k->vec_dot[EL_TYPE_Q4_1] = vec_dot_q4_1_avx2;
    k->vec_dot[EL_TYPE_Q5_1] = vec_dot_q5_1_avx2;
    k->vec_dot_nv[EL_TYPE_Q8_0] = vec_dot_q8_0_avx2_nv;
    k->vec_dot_nv[EL_TYPE_Q4_0] = vec_dot_q4_0_avx2_nv;
    k->vec_dot_nv[EL_TYPE_Q5_0] = vec_dot_q5_0_avx2_nv;
    k->vec_dot_nv[EL_TYPE_Q4_1] = vec_dot_q4_1_avx2_nv;
    k->vec_dot_nv[EL_TYPE_Q5_1] = vec_dot_q5_1_avx2_nv;
    k->vec_dot_rows[EL_TYPE_Q8_0] = vec_dot_q8_0_avx2_rows;
    k->vec_dot_tile[EL_TYPE_Q8_0] = vec_dot_q8_0_avx2_tile2;
    k->vec_dot_rows[EL_TYPE_Q4_0] = vec_dot_q4_0_avx2_rows;
    k->vec_dot_rows[EL_TYPE_Q5_0] = vec_dot_q5_0_avx2_rows;
    k->vec_dot_tile[EL_TYPE_Q5_0] = vec_dot_q5_0_avx2_tile2;
    k->vec_dot_rows[EL_TYPE_Q4_1] = vec_dot_q4_1_avx2_rows;
    k->vec_dot_rows[EL_TYPE_Q5_1] = vec_dot_q5_1_avx2_rows;
    k->quantize_act[EL_TYPE_Q8_0] = quantize_q8_0_avx2;
    k->quantize_act[EL_TYPE_Q8_1] = quantize_q8_1_avx2;
    k->gelu_lut = gelu_lut_avx2;
    k->pack_panel[EL_TYPE_Q8_0] = pack_panel_q8_0_avx2;
    k->panel_layout = EL_PANEL_AVX2;
    k->vec_dot_panel[EL_TYPE_Q8_0] = vec_dot_q8_0_avx2_panel;
    k->vec_dot_panel[EL_TYPE_Q5_0] = vec_dot_q5_0_avx2_panel;
    k->dot_f32 = dot_f32_avx2;
    k->dot_f32_f16 = dot_f32_f16_avx2;
    k->axpy_f16 = axpy_f16_avx2;
    k->axpy_f32 = axpy_f32_avx2;
    k->vecmat_f32 = vecmat_f32_avx2;
    k->vecmat_f16 = vecmat_f16_avx2;
    el_kernels_fill_avx2_kquants(k);
}
#endif

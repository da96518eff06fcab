/* llamacpp_exact.c - llama.cpp's CPU arithmetic, operation for operation, for bit-identical logits.
 *
 * Why: activations are quantized to 8 bits before every matmul, so a 1-ulp difference anywhere
 * flips a few roundings, and within a layer or two the logits differ by ~0.2: enough to flip the
 * near-tied greedy choices a model meets every few dozen tokens. Matching llama.cpp's tokens on
 * those needs its exact float order, which this file reproduces in portable C (fmaf wherever ggml
 * fuses, its SIMD lanes as arrays, its horizontal sums as written by its intrinsics):
 *   ggml x86 build (AVX2 or AVX-512: el_llx_build, llamafile sgemm, Q4_K repacked 8x8), flash
 *   attention off.
 * The lane structure is the one of that build's kernels, not of this machine: the results are the
 * same on any CPU. The C here is the reference; the ISA tables of el_llx_kernels (arch/avx2_llamacpp.c)
 * give its bits faster. Selected per model by el_model_set_numerics(EL_NUMERICS_LLAMACPP). */
#include <math.h>
#include <pthread.h>
#include <string.h>

#include "checked.h"
#include "dispatch.h"
#include "edgellama.h"
#include "fp16.h"
#include "llamacpp_exact.h"
#include "quants.h"
#include "ops.h"


/* ---- horizontal sums, in the order of ggml's (x86) helpers ---- */

/* hsum_float_8 / tinyBLAS hsum(__m256): high half + low half, then movehl, then movehdup */
static inline float hsum8(const float a[8]) {
    const float r0 = a[4] + a[0], r1 = a[5] + a[1], r2 = a[6] + a[2], r3 = a[7] + a[3];
    return (r0 + r2) + (r1 + r3);
}

/* GGML_F32x8_REDUCE's last step (AVX): low half + high half, then two hadds */
static inline float hsum8_hadd(const float a[8]) {
    const float t0 = a[0] + a[4], t1 = a[1] + a[5], t2 = a[2] + a[6], t3 = a[3] + a[7];
    return (t0 + t1) + (t2 + t3);
}

/* _mm512_reduce_add_ps as GCC writes it: 256-bit halves, 128-bit halves, {2,3,0,1}, then [0]+[1] */
static inline float hsum16(const float a[16]) {
    float t[8];
    for (int i = 0; i < 8; i++) t[i] = a[8 + i] + a[i];
    const float u0 = t[4] + t[0], u1 = t[5] + t[1], u2 = t[6] + t[2], u3 = t[7] + t[3];
    return (u0 + u2) + (u1 + u3);
}

/* ggml_vec_dot_f16 (AVX-512): 4 accumulators of 16 lanes, element i in acc[i % 64]; reduced as
 * (acc0 + acc2) + (acc1 + acc3) lane by lane, then across the lanes */
static inline float reduce_dot_f16(const float acc[64]) {
    float x[16];
    for (int l = 0; l < 16; l++) x[l] = (acc[l] + acc[32 + l]) + (acc[16 + l] + acc[48 + l]);
    return hsum16(x);
}

/* ggml_vec_dot_f16 (AVX2): 4 accumulators of 8 lanes, element i in acc[i % 32]; reduced as
 * (acc0 + acc2) + (acc1 + acc3) lane by lane (GGML_F32x8_REDUCE), then across the lanes */
static inline float reduce_dot_f16_32(const float acc[32]) {
    float x[8];
    for (int l = 0; l < 8; l++) x[l] = (acc[l] + acc[16 + l]) + (acc[8 + l] + acc[24 + l]);
    return hsum8_hadd(x);
}

/* the two reductions by the build's vector width KN (16 or 8): of KN lanes (hsum(__m512) / hsum_float_8),
 * and of ggml_vec_dot_f16's 4 x KN */
static inline float hsum_kn(size_t kn, const float *a) { return kn == 16 ? hsum16(a) : hsum8(a); }
static inline float reduce_dot_kn(size_t kn, const float *acc) {
    return kn == 16 ? reduce_dot_f16(acc) : reduce_dot_f16_32(acc);
}

static inline float round_f16(float x) { return el_fp16_to_fp32(el_fp32_to_fp16(x)); }

/* ---- activations: ggml's x86 quantize_row_q8_0 / q8_1 (127/amax, round half to even) ---- */

/* one 32-value block: levels into qs, d = amax / 127 returned (its fp16 goes into the block) */
static float quantize_32_x86(const float *x, int8_t qs[32], int *sum) {
    float amax = 0.0f;
    for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
    const float id = amax != 0.0f ? 127.f / amax : 0.0f;
    *sum = 0;
    for (int j = 0; j < 32; j++) {
        const float v = nearbyintf(x[j] * id); /* the default rounding mode: half to even */
        qs[j] = (int8_t)(v > 127.f ? 127 : v < -128.f ? -128 : (int)v);
        *sum += qs[j];
    }
    return amax / 127.f;
}

static void quantize_q8_0_x86(const float *x, block_q8_0 *y, size_t n) {
    int sum;
    for (size_t i = 0; i < n / QK8_0; i++) y[i].d = el_fp32_to_fp16(quantize_32_x86(x + i * QK8_0, y[i].qs, &sum));
}

/* Q8_1 adds s = d * (sum of the levels), rounded to fp16 */
static void quantize_q8_1_x86(const float *x, block_q8_1 *y, size_t n) {
    for (size_t i = 0; i < n / QK8_1; i++) {
        int sum;
        const float d = quantize_32_x86(x + i * QK8_1, y[i].qs, &sum);
        y[i].d = el_fp32_to_fp16(d);
        y[i].s = el_fp32_to_fp16(d * (float)sum);
    }
}

/* ---- dot products, one weight row with one activation row ---- */

/* one 32-value block into the 8 lanes of ggml's AVX2 kernels: lane l gets d times the exact integer
 * dot of values 4l..4l+3, in one FMA */
static inline void lanes8_fma(float acc[8], float d, const int8_t q[32], const int8_t a[32]) {
    for (int l = 0; l < 8; l++) {
        int s = 0;
        for (int k = 4 * l; k < 4 * l + 4; k++) s += (int)q[k] * (int)a[k];
        acc[l] = fmaf(d, (float)s, acc[l]);
    }
}

/* Q5_0 / Q8_0 x Q8_0: vec_dot (decode) and tinyBLAS_Q0_AVX (prefill) do the same per output:
 * 8 lanes of 4-byte integer dots, one FMA per block with d = dx * dy, hsum_float_8 */
EL_HOT static float dot_q0(int wtype, const void *w, const block_q8_0 *a, size_t nb) {
    float acc[8] = {0};
    int8_t q[32];
    for (size_t ib = 0; ib < nb; ib++) {
        float dx;
        if (wtype == EL_TYPE_Q5_0) {
            block_q5_0 b;
            memcpy(&b, (const char *)w + ib * sizeof b, sizeof b);
            el_unpack_q5_0(&b, q);
            dx = el_fp16_to_fp32(b.d);
        } else {
            block_q8_0 b;
            memcpy(&b, (const char *)w + ib * sizeof b, sizeof b);
            memcpy(q, b.qs, 32);
            dx = el_fp16_to_fp32(b.d);
        }
        const float d = dx * el_fp16_to_fp32(a[ib].d);
        lanes8_fma(acc, d, q, a[ib].qs);
    }
    return hsum8(acc);
}

/* Q4_1 x Q8_1 (AVX2 vec_dot; no tinyBLAS or repack on x86, so prefill too): the Q0 lanes for
 * d0 d1 sum(q x), the min terms m x s summed apart by scalar FMAs, added last */
EL_HOT static float dot_q4_1(const void *w, const block_q8_1 *a, size_t nb) {
    float acc[8] = {0}, summs = 0.0f;
    int8_t q[32];
    for (size_t ib = 0; ib < nb; ib++) {
        block_q4_1 b;
        memcpy(&b, (const char *)w + ib * sizeof b, sizeof b);
        el_unpack_q4_1(&b, q);
        summs = fmaf(el_fp16_to_fp32(b.m), el_fp16_to_fp32(a[ib].s), summs);
        const float d = el_fp16_to_fp32(b.d) * el_fp16_to_fp32(a[ib].d);
        lanes8_fma(acc, d, q, a[ib].qs);
    }
    return hsum8(acc) + summs;
}

/* A K-quant super-block unpacked once per weight row, then dotted with every activation row */
typedef struct {
    int8_t q[QK_K];  /* levels: Q4_K 0..15, Q6_K -32..31 */
    int16_t sc[16];  /* Q4_K: 8 sub-block scales; Q6_K: 16 */
    int16_t mn[8];   /* Q4_K mins */
    float d, dmin;
} kblock;
#define KROW_MAX 64    /* super-blocks per row unpacked at once (16384 columns) */
#define Q5_ROW_MAX 512 /* Q5_0 blocks per row re-blocked at once (16384 columns) */

static void unpack_k_row(int wtype, const void *w, size_t nb, kblock *out) {
    for (size_t i = 0; i < nb; i++) {
        if (wtype == EL_TYPE_Q4_K) {
            block_q4_K b;
            uint8_t sc[8], mn[8];
            memcpy(&b, (const char *)w + i * sizeof b, sizeof b);
            el_unpack_q4_K(&b, out[i].q, sc, mn);
            for (int j = 0; j < 8; j++) out[i].sc[j] = sc[j], out[i].mn[j] = mn[j];
            out[i].d = el_fp16_to_fp32(b.d);
            out[i].dmin = el_fp16_to_fp32(b.dmin);
        } else {
            block_q6_K b;
            memcpy(&b, (const char *)w + i * sizeof b, sizeof b);
            el_unpack_q6_K(&b, out[i].q);
            for (int j = 0; j < 16; j++) out[i].sc[j] = b.scales[j];
            out[i].d = el_fp16_to_fp32(b.d);
        }
    }
}

/* Q4_K, repacked 8x8. Per super-block an integer sum of scale x dot and one of min x bsum, each
 * FMA'd into its own accumulator, the two subtracted at the end. gemv (rows left over from groups
 * of 4 activation rows: decode) adds once per super-block; gemm (groups of 4) once per pair of
 * 32-value sub-blocks. */
typedef void (*isums_fn)(const int8_t *q, const int8_t *a, int len, int32_t *out);

EL_HOT static float dot_q4_K(const kblock *b, const block_q8_K *a, size_t nb, int gemm, isums_fn isums) {
    float acc = 0.0f, accm = 0.0f;
    for (size_t i = 0; i < nb; i++) {
        const float d = b[i].d * a[i].d, dm = b[i].dmin * a[i].d;
        int32_t dots[8];
        isums(b[i].q, a[i].qs, 32, dots);
        int isum = 0, imin = 0;
        for (int sb = 0; sb < 8; sb++) {
            isum += (int)b[i].sc[sb] * dots[sb];
            imin += (int)b[i].mn[sb] * ((int)a[i].bsums[2 * sb] + (int)a[i].bsums[2 * sb + 1]);
            if (gemm && sb % 2 == 1) {
                acc = fmaf((float)isum, d, acc);
                accm = fmaf((float)imin, dm, accm);
                isum = imin = 0;
            }
        }
        if (!gemm) {
            acc = fmaf((float)isum, d, acc);
            accm = fmaf((float)imin, dm, accm);
        }
    }
    return acc - accm;
}

/* Q6_K (AVX2 vec_dot): levels 0..63 in 8 lanes of 4 bytes per 32, the -32 offset taken off per lane
 * through bsums x scales (pairs 2l, 2l+1), one FMA per super-block */
EL_HOT static float dot_q6_K(const void *w, const block_q8_K *a, size_t nb) {
    float acc[8] = {0};
    int8_t q[QK_K];
    for (size_t i = 0; i < nb; i++) {
        block_q6_K b;
        memcpy(&b, (const char *)w + i * sizeof b, sizeof b);
        el_unpack_q6_K(&b, q);
        int lane[8] = {0};
        for (int e = 0; e < QK_K; e++) lane[(e % 32) / 4] += (int)b.scales[e / 16] * ((int)q[e] + 32) * (int)a[i].qs[e];
        for (int l = 0; l < 8; l++)
            lane[l] -= 32 * ((int)a[i].bsums[2 * l] * b.scales[2 * l] + (int)a[i].bsums[2 * l + 1] * b.scales[2 * l + 1]);
        const float d = a[i].d * el_fp16_to_fp32(b.d);
        for (int l = 0; l < 8; l++) acc[l] = fmaf(d, (float)lane[l], acc[l]);
    }
    return hsum8(acc);
}

/* Q6_K in ggml's tiled K-quant matmul (batches of 8 or more rows; the AVX2 build's as well as the
 * AVX-512 one's, each checked against llama.cpp): per
 * 256-value block an exact integer sum of scale x (dot - 32 bsum) over the 16-value sub-blocks,
 * times the weight's d, times the activation's d, added to the output block by block (the add and
 * the last multiply fused by the compiler) */
EL_HOT static float dot_q6_K_tiled(const kblock *b, const block_q8_K *a, size_t nb, isums_fn isums) {
    float out = 0.0f;
    for (size_t i = 0; i < nb; i++) {
        /* sum((q + 32) a) - 32 bsum of a sub-block is exactly sum(q a) with the signed levels */
        int32_t dots[16];
        isums(b[i].q, a[i].qs, 16, dots);
        int s1 = 0;
        for (int sb = 0; sb < QK_K / 16; sb++) s1 += (int)b[i].sc[sb] * dots[sb];
        out = fmaf((float)s1 * b[i].d, a[i].d, out);
    }
    return out;
}

/* sub-block integer dots of 256 levels: out[s] = sum of q[k] a[k] over the s-th run of len (16 or 32) */
static void ref_isums(const int8_t *q, const int8_t *a, int len, int32_t *out) {
    for (int s = 0; s < QK_K / len; s++) {
        int32_t sum = 0;
        for (int k = s * len; k < (s + 1) * len; k++) sum += (int32_t)q[k] * (int32_t)a[k];
        out[s] = sum;
    }
}

/* a batch of Q8_0-format weight blocks against nv activation rows: vec_dot for each */
static void ref_q8_0_nv(size_t n, const void *w, const void *a, size_t a_stride, size_t nv, float *out) {
    for (size_t j = 0; j < nv; j++) out[j] = dot_q0(EL_TYPE_Q8_0, w, (const block_q8_0 *)((const char *)a + j * a_stride), n / QK8_0);
}

/* the per-row dots as el_vec_dot_fn (n values) for the llx tables */
static float ref_q5_0(size_t n, const void *w, const void *a) { return dot_q0(EL_TYPE_Q5_0, w, a, n / QK5_0); }
static float ref_q8_0(size_t n, const void *w, const void *a) { return dot_q0(EL_TYPE_Q8_0, w, a, n / QK8_0); }
static float ref_q4_1(size_t n, const void *w, const void *a) { return dot_q4_1(w, a, n / QK4_1); }
static float ref_q6_K(size_t n, const void *w, const void *a) { return dot_q6_K(w, a, n / QK_K); }

static float ref_kq(size_t hd, const float *q, const el_half *k, int form);
static void ref_pv(size_t hd, float p, const el_half *v, float *lane);

void el_llx_fill_scalar(el_llx_kernels *k) {
    memset(k, 0, sizeof *k);
    k->vec_dot[EL_TYPE_Q5_0] = ref_q5_0;
    k->vec_dot[EL_TYPE_Q8_0] = ref_q8_0;
    k->vec_dot[EL_TYPE_Q4_1] = ref_q4_1;
    k->vec_dot[EL_TYPE_Q6_K] = ref_q6_K;
    k->kq = ref_kq;
    k->pv = ref_pv;
    k->isums = ref_isums;
    k->q8_0_nv = ref_q8_0_nv;
}

static el_llx_kernels g_scalar;
#if defined(__x86_64__)
static el_llx_kernels g_avx2, g_avx512;
#endif
static pthread_once_t g_once = PTHREAD_ONCE_INIT;

static void build_tables(void) {
    el_llx_fill_scalar(&g_scalar);
#if defined(__x86_64__)
    g_avx2 = g_scalar;
    el_llx_fill_avx2(&g_avx2);
    g_avx512 = g_avx2;
    el_llx_fill_avx512(&g_avx512);
#endif
}

const el_llx_kernels *el_llx_kernels_for(const char *isa) {
    pthread_once(&g_once, build_tables);
#if defined(__x86_64__)
    if (strcmp(isa, "avx2") == 0) return &g_avx2;
    if (strcmp(isa, "avx512") == 0) return &g_avx512;
#endif
    (void)isa;
    return &g_scalar;
}

/* ---- matmul ---- */

static int act_type(int wtype) {
    switch (wtype) {
    case EL_TYPE_Q5_0: case EL_TYPE_Q8_0: return EL_TYPE_Q8_0;
    case EL_TYPE_Q4_1: return EL_TYPE_Q8_1;
    case EL_TYPE_Q4_K: case EL_TYPE_Q6_K: return EL_TYPE_Q8_K;
    default: return -1;
    }
}

int el_llx_type_supported(int wtype, size_t cols) {
    if (act_type(wtype) < 0) return 0;
    return !(wtype == EL_TYPE_Q4_K || wtype == EL_TYPE_Q6_K) || cols <= (size_t)KROW_MAX * QK_K;
}

size_t el_llx_act_bytes(int wtype, size_t cols, size_t n_vec) {
    const int at = act_type(wtype);
    return at < 0 ? 0 : el_size_mul(el_row_bytes(at, cols), n_vec); /* SIZE_MAX: does not fit */
}

typedef struct {
    int wtype;
    const void *w;
    size_t rows, cols, n_vec, ldy, wrow, arow;
    const float *x;    /* quantize: the float rows */
    float *y;
    const void *act;   /* matmul: the quantized rows */
    void *qout;        /* quantize: where they go */
    el_vec_dot_fn dot; /* the per-row dot of this ISA (types other than Q4_K) */
} llx_mm;

static void llx_quantize(void *p, int ith, int nth) {
    const llx_mm *t = p;
    size_t v0, v1;
    el_split(t->n_vec, ith, nth, &v0, &v1);
    const int at = act_type(t->wtype);
    for (size_t v = v0; v < v1; v++) {
        void *dst = (char *)t->qout + v * t->arow;
        if (at == EL_TYPE_Q8_0) quantize_q8_0_x86(t->x + v * t->cols, dst, t->cols);
        else if (at == EL_TYPE_Q8_1) quantize_q8_1_x86(t->x + v * t->cols, dst, t->cols);
        else el_get_type_traits(EL_TYPE_Q8_K)->from_float(t->x + v * t->cols, dst, t->cols);
    }
}

static void llx_rows(void *p, int ith, int nth) {
    const llx_mm *t = p;
    size_t r0, r1;
    el_split(t->rows, ith, nth, &r0, &r1);
    const size_t bs = el_type_block_size(t->wtype), nb = t->cols / bs;
    const size_t n_gemm = t->n_vec - t->n_vec % 4; /* rows ggml's repacked kernels take 4 at a time */
    const int q6_tiled = t->wtype == EL_TYPE_Q6_K && t->n_vec >= 8;
    if (t->wtype == EL_TYPE_Q4_K || q6_tiled) {
        kblock ub[KROW_MAX]; /* el_llx_type_supported: K-quant rows have at most KROW_MAX super-blocks */
        const isums_fn isums = el_kern()->llx->isums;
        for (size_t r = r0; r < r1; r++) {
            unpack_k_row(t->wtype, (const char *)t->w + r * t->wrow, nb, ub);
            for (size_t v = 0; v < t->n_vec; v++) {
                const block_q8_K *a = (const block_q8_K *)((const char *)t->act + v * t->arow);
                t->y[v * t->ldy + r] = q6_tiled ? dot_q6_K_tiled(ub, a, nb, isums) : dot_q4_K(ub, a, nb, v < n_gemm, isums);
            }
        }
        return;
    }
    if ((t->wtype == EL_TYPE_Q5_0 || t->wtype == EL_TYPE_Q8_0) && t->n_vec > 1 && nb <= Q5_ROW_MAX) {
        /* a batch: each weight row (Q5_0 re-blocked as Q8_0: same levels, same d, so the very same
         * operations) against all the activation rows, the weights loaded once per block */
        const el_vec_dot_nv_fn dot_nv = el_kern()->llx->q8_0_nv;
        block_q8_0 row[Q5_ROW_MAX];
        float out[LLX_NV];
        for (size_t r = r0; r < r1; r++) {
            const void *wr = (const char *)t->w + r * t->wrow;
            if (t->wtype == EL_TYPE_Q5_0) {
                for (size_t i = 0; i < nb; i++) {
                    block_q5_0 b;
                    memcpy(&b, (const char *)wr + i * sizeof b, sizeof b);
                    el_unpack_q5_0(&b, row[i].qs);
                    row[i].d = b.d;
                }
                wr = row;
            }
            for (size_t v0 = 0; v0 < t->n_vec; v0 += LLX_NV) {
                const size_t nv = t->n_vec - v0 < LLX_NV ? t->n_vec - v0 : LLX_NV;
                dot_nv(t->cols, wr, (const char *)t->act + v0 * t->arow, t->arow, nv, out);
                for (size_t j = 0; j < nv; j++) t->y[(v0 + j) * t->ldy + r] = out[j];
            }
        }
        return;
    }
    for (size_t v = 0; v < t->n_vec; v++) {
        const void *a = (const char *)t->act + v * t->arow;
        for (size_t r = r0; r < r1; r++) t->y[v * t->ldy + r] = t->dot(t->cols, (const char *)t->w + r * t->wrow, a);
    }
}

void el_llx_quantize(el_pool *pool, int wtype, const float *x, size_t cols, size_t n_vec, void *act) {
    llx_mm t = {wtype, NULL, 0, cols, n_vec, 0, 0, el_row_bytes(act_type(wtype), cols), x, NULL, NULL, act, NULL};
    el_pool_run(pool, llx_quantize, &t);
}

void el_llx_matmul_act(el_pool *pool, int wtype, const void *w, size_t rows, size_t cols, const void *act,
                       size_t n_vec, float *y, size_t ldy) {
    llx_mm t = {wtype, w, rows, cols, n_vec, ldy, el_row_bytes(wtype, cols), el_row_bytes(act_type(wtype), cols),
                NULL, y, act, NULL, el_kern()->llx->vec_dot[wtype]};
    el_pool_run(pool, llx_rows, &t);
}

void el_llx_matmul(el_pool *pool, int wtype, const void *w, size_t rows, size_t cols, const float *x,
                   size_t n_vec, float *y, size_t ldy, void *act) {
    el_llx_quantize(pool, wtype, x, cols, n_vec, act);
    el_llx_matmul_act(pool, wtype, w, rows, cols, act, n_vec, y, ldy);
}

/* ---- attention ---- */

static inline uint32_t f32_bits(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    return u;
}

static inline float bits_f32(uint32_t u) {
    float x;
    memcpy(&x, &u, 4);
    return x;
}

/* ggml_v_expf (AVX-512), one lane */
static float expf_ggml512(float x) {
    const float r = 0x1.8p23f;
    const float z = fmaf(x, 0x1.715476p+0f, r);
    const float n = z - r;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    const float u = b * b;
    const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)), u,
                         fmaf(0x1.ffffecp-1f, b, 1.0f));
    if (fabsf(n) > 192.0f) return n <= 0.0f ? 0.0f : INFINITY;
    return ldexpf(j, (int)n); /* _mm512_scalef_ps: n is integral here */
}

/* ggml_v_expf (AVX2), one lane: the polynomial's last term b times 0x1.ffffecp-1 without the 1, then
 * 2^n j + 2^n with 2^n made from z's bits; past |n| > 126 its two-factor form, past 192 0 or inf */
static float expf_ggml256(float x) {
    const float r = 0x1.8p23f;
    const float z = fmaf(x, 0x1.715476p+0f, r);
    const float n = z - r;
    const float b = fmaf(-n, 0x1.7f7d1cp-20f, fmaf(-n, 0x1.62e4p-1f, x));
    const uint32_t e = f32_bits(z) << 23;
    const float k = bits_f32(e + f32_bits(1.0f));
    const float u = b * b;
    const float j = fmaf(fmaf(fmaf(0x1.0e4020p-7f, b, 0x1.573e2ep-5f), u, fmaf(0x1.555e66p-3f, b, 0x1.fffdb6p-2f)), u,
                         0x1.ffffecp-1f * b);
    if (!(fabsf(n) > 126.0f)) return fmaf(k, j, k);
    const uint32_t g = n <= 0.0f ? 0x82000000u : 0u; /* integer adds wrap, as the vector ones do */
    const float s1 = bits_f32(g + 0x7f000000u), s2 = bits_f32(e - g);
    if (fabsf(n) > 192.0f) return s1 * s1;
    return fmaf(s2, j, s2) * s1;
}

static inline float expf_ggml(el_llx_build build, float x) {
    return build == EL_LLX_AVX512 ? expf_ggml512(x) : expf_ggml256(x);
}

static inline size_t build_lanes(el_llx_build build) { return build == EL_LLX_AVX512 ? 16 : 8; }

/* ggml_vec_swiglu_f32: silu(g) = g / (1 + exp(-g)) with the build's exp, times u, in its vectors of
 * 16 or 8; a tail shorter than a vector takes libm's expf, as ggml's scalar remainder loop does */
EL_HOT static void swiglu(el_llx_build build, float *g, const float *u, size_t n) {
    const size_t nv = n - n % build_lanes(build);
    size_t i = 0;
    for (; i < nv; i++) g[i] = g[i] / (1.0f + expf_ggml(build, 0.0f - g[i])) * u[i];
    for (; i < n; i++) g[i] = g[i] / (1.0f + expf(-g[i])) * u[i];
}

/* a plain function around the clones: GCC exports the ifunc of an extern target_clones function
 * whatever its visibility, and the library exports nothing but its API */
void el_llx_swiglu(el_llx_build build, float *g, const float *u, size_t n) { swiglu(build, g, u, n); }

size_t el_llx_attn_scratch_floats(size_t n_cells, size_t head_dim, int n_threads) {
    /* SIZE_MAX (checked.h): does not fit size_t */
    return el_size_mul((size_t)n_threads, el_size_add(el_size_add(head_dim, n_cells), el_size_mul(head_dim, 64)));
}

typedef struct {
    const el_attn_args *a;
    size_t n_cells;
    float *scratch;
    el_llx_build build;
} llx_attn;

static int visible(const el_attn_args *a, int32_t p, int32_t qp) {
    return p >= 0 && p <= qp && !(a->window > 0 && qp - p >= a->window);
}

/* one score of KQ: q (fp16-exact floats) . k (an fp16 row) in tinyBLAS's 16 or 8 lanes (TINY16,
 * TINY8) or ggml_vec_dot_f16's 4 x 16 or 4 x 8 (DOT64, DOT32), a tail past the last step summed in
 * double as there */
static float ref_kq(size_t hd, const float *q, const el_half *k, int form) {
    if (form == LLX_KQ_TINY16 || form == LLX_KQ_TINY8) {
        const size_t kn = form == LLX_KQ_TINY16 ? 16 : 8;
        float l16[16] = {0};
        for (size_t d = 0; d < hd; d++) l16[d % kn] = fmaf(el_fp16_to_fp32(k[d]), q[d], l16[d % kn]);
        return hsum_kn(kn, l16);
    }
    const size_t kn = form == LLX_KQ_DOT64 ? 16 : 8, np = hd - hd % (4 * kn);
    float l64[64] = {0};
    for (size_t d = 0; d < np; d++) l64[d % (4 * kn)] = fmaf(el_fp16_to_fp32(k[d]), q[d], l64[d % (4 * kn)]);
    double sum = (double)reduce_dot_kn(kn, l64);
    for (size_t d = np; d < hd; d++) sum += (double)(el_fp16_to_fp32(k[d]) * q[d]);
    return (float)sum;
}

/* one cell of KQV: lane[d] += v[d] * p, the lane being the cell's */
static void ref_pv(size_t hd, float p, const el_half *v, float *lane) {
    for (size_t d = 0; d < hd; d++) lane[d] = fmaf(el_fp16_to_fp32(v[d]), p, lane[d]);
}

static void llx_attn_items(void *p, int ith, int nth) {
    const llx_attn *x = p;
    const el_attn_args *a = x->a;
    const el_llx_kernels *kern = el_kern()->llx;
    const size_t HD = a->head_dim, NC = x->n_cells, group = a->n_head / a->n_head_kv;
    /* prefill runs llamafile's tinyBLAS (one accumulator of the build's KN lanes) when the row length
     * is a multiple of KN, decode ggml_vec_dot_f16 (4 x KN lanes) */
    const size_t kn = build_lanes(x->build);
    const int tiny_kq = a->n_q >= 2 && HD % kn == 0, tiny_pv = a->n_q >= 2;
    const int kq_form = kn == 16 ? (tiny_kq ? LLX_KQ_TINY16 : LLX_KQ_DOT64) : (tiny_kq ? LLX_KQ_TINY8 : LLX_KQ_DOT32);
    const size_t lanes = tiny_pv ? kn : 4 * kn;
    float *qf = x->scratch + (size_t)ith * (HD + NC + HD * 64), *s = qf + HD, *acc = s + NC;
    size_t i0, i1;
    el_split(a->n_q * a->n_head, ith, nth, &i0, &i1);
    for (size_t it = i0; it < i1; it++) {
        const size_t t = it / a->n_head, h = it % a->n_head, hk = h / group;
        const int32_t qp = a->q_pos[t];
        const float *q = a->q + (t * a->n_head + h) * HD;
        for (size_t d = 0; d < HD; d++) qf[d] = round_f16(q[d]);
        for (size_t c = 0; c < NC; c++) s[c] = -INFINITY;
        /* KQ */
        for (size_t j = 0; j < a->n_kv; j++) {
            const int32_t c = a->kv_pos[j];
            if (!visible(a, c, qp)) continue;
            const float dot = kern->kq(HD, qf, (const el_half *)a->k + (j * a->n_head_kv + hk) * HD, kq_form);
            const float sc = dot * a->scale; /* scale 1 where the graph scaled Q (desc.scale_q) */
            s[c] = a->softcap > 0.0f ? el_softcap(sc, a->softcap) : sc;
        }
        /* softmax: ggml_vec_soft_max_f32 in chunks of KN (NC is a multiple of 64), chunk sums
         * accumulated in double */
        float mx = -INFINITY;
        for (size_t c = 0; c < NC; c++) mx = s[c] > mx ? s[c] : mx;
        double sum = 0.0;
        for (size_t c0 = 0; c0 < NC; c0 += kn) {
            for (size_t c = c0; c < c0 + kn; c++) s[c] = expf_ggml(x->build, s[c] - mx);
            sum += (double)hsum_kn(kn, s + c0);
        }
        const float inv = (float)(1.0 / sum);
        for (size_t c = 0; c < NC; c++) s[c] = round_f16(s[c] * inv); /* the fp16 copy KQV reads */
        /* KQV: the cells in lanes (acc: lanes x HD); zero probabilities add nothing, so only the
         * visible cells, in ascending order */
        memset(acc, 0, lanes * HD * sizeof *acc);
        for (size_t j = 0; j < a->n_kv; j++) {
            const int32_t c = a->kv_pos[j];
            if (!visible(a, c, qp)) continue;
            kern->pv(HD, s[c], (const el_half *)a->v + (j * a->n_head_kv + hk) * HD, acc + ((size_t)c % lanes) * HD);
        }
        float *out = a->out + (t * a->n_head + h) * HD;
        for (size_t d = 0; d < HD; d++) {
            float col[64];
            for (size_t l = 0; l < lanes; l++) col[l] = acc[l * HD + d];
            out[d] = tiny_pv ? hsum_kn(kn, col) : reduce_dot_kn(kn, col);
        }
    }
}

void el_llx_attention(el_pool *pool, el_llx_build build, const el_attn_args *a, size_t n_cells, float *scratch) {
    llx_attn x = {a, n_cells, scratch, build};
    el_pool_run(pool, llx_attn_items, &x);
}

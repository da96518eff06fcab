/* run_tests.c - standalone C test runner for the kernel library (no Python): every ISA path the CPU
 * offers against the scalar reference, ops and attention against double references, and golden
 * vectors so a cross-built binary is checked against the x86 scalar outputs. Must not need a file
 * other than the one named by --check-golden; all inputs come from a seeded PRNG.
 *
 *   run_tests [--seed N] [-v] [--isa NAME] [--check-golden FILE] [--golden-only]
 *   run_tests --emit-golden FILE
 *
 * Tolerances (all stated next to their check):
 *   - quantize (reference and activation quantizers of every ISA), dequantize: bit-exact.
 *   - block dot products: |simd - scalar| <= (blocks + 4) * 2^-22 * M, M = sum_j (|w_j| + 2 |o_j|) |a_j|
 *     with o_j the block's offset (its value with all quant bits zero): reassociating the per-block
 *     float terms can lose that much, and no more. ISAs that promise bit-identical block dots (neon,
 *     neon-dotprod: see arch/neon.c) must match exactly.
 *   - matmul vs a double product of the dequantized weights and dequantized (reference-quantized)
 *     activations: the same bound, plus 2^-10 sum_j |o_j a_j| for Q8_1 activations (their fp16 s).
 *     1, 2, 3 and 4 threads: bit-identical.
 *   - float kernels (dot_f32, dot_f32_f16, axpy): 2^-20 * sum |terms| (+ n-dependent slack).
 *   - rmsnorm 4e-6 relative; softmax 1e-6 + 1e-5 relative; rope 2e-7 * (n_rot / 2 + 2) * (|pos| + 1)
 *     * max|x| + 1e-6 (float angles are built by repeated multiplication); attention 1e-4 absolute.
 * Last line: "N passed, M failed"; exit status 1 when M > 0. */

/* The generated inputs and the double references must be the same numbers on every architecture:
 * no fused multiply-add in this file (GCC contracts by default on aarch64). */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../attention.h"
#include "../dispatch.h"
#include "../edgellama.h"
#include "../llamacpp_exact.h"
#include "../lora.h"
#include "../matmul.h"
#include "../ops.h"
#include "../pool.h"
#include "../quants.h"

/* ------------------------------------------------------------------ results */

static int g_pass, g_fail, g_verbose, g_fail_prints;

static void check(int ok, const char *fmt, ...) {
    if (ok) {
        g_pass++;
        return;
    }
    g_fail++;
    if (g_fail_prints++ < 60) {
        va_list ap;
        va_start(ap, fmt);
        printf("FAIL: ");
        vprintf(fmt, ap);
        printf("\n");
        va_end(ap);
    }
}

static void *xmalloc(size_t n) {
    void *p = malloc(n ? n : 1);
    if (!p) {
        fprintf(stderr, "out of memory (%zu bytes)\n", n);
        exit(2);
    }
    return p;
}

/* ------------------------------------------------------------------ PRNG (integer only: same on all CPUs) */

typedef struct { uint64_t s; } rng_t;

static uint64_t rng_u64(rng_t *r) { /* splitmix64 */
    uint64_t z = (r->s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}
static uint32_t rng_below(rng_t *r, uint32_t n) { return (uint32_t)(rng_u64(r) % n); }
/* uniform in [-1, 1), a multiple of 2^-23: exactly representable */
static float rng_unit(rng_t *r) { return (float)((int32_t)(rng_u64(r) >> 40) - (1 << 23)) * 0x1p-23f; }
/* a finite half with exponent in [emin, emax], random sign and mantissa */
static el_half rng_half(rng_t *r, int emin, int emax) {
    const uint32_t e = (uint32_t)(emin + (int)rng_below(r, (uint32_t)(emax - emin + 1)) + 15);
    return (el_half)(((rng_u64(r) & 1) << 15) | (e << 10) | (rng_u64(r) & 0x3ff));
}
static void rng_floats(rng_t *r, float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = rng_unit(r) * scale;
}

/* ------------------------------------------------------------------ block layouts the tests know */

typedef struct {
    int type;
    size_t half_off[2]; /* fp16 fields (scales, mins) that must be finite */
    int n_half;
    size_t q_lo, q_hi;  /* byte range of the quant bits: zeroed, the block holds its offset */
} block_desc;

static const block_desc g_desc[] = {
    {EL_TYPE_Q4_0, {0, 0}, 1, 2, 18},
    {EL_TYPE_Q4_1, {0, 2}, 2, 4, 20},
    {EL_TYPE_Q5_0, {0, 0}, 1, 2, 22},
    {EL_TYPE_Q5_1, {0, 2}, 2, 4, 24},
    {EL_TYPE_Q8_0, {0, 0}, 1, 2, 34},
    {EL_TYPE_Q8_1, {0, 2}, 2, 4, 36},
    {EL_TYPE_Q2_K, {offsetof(block_q2_K, d), offsetof(block_q2_K, dmin)}, 2, offsetof(block_q2_K, qs),
     offsetof(block_q2_K, qs) + QK_K / 4},
    {EL_TYPE_Q3_K, {offsetof(block_q3_K, d), 0}, 1, 0, offsetof(block_q3_K, scales)},
    {EL_TYPE_Q4_K, {offsetof(block_q4_K, d), offsetof(block_q4_K, dmin)}, 2, offsetof(block_q4_K, qs),
     sizeof(block_q4_K)},
    {EL_TYPE_Q5_K, {offsetof(block_q5_K, d), offsetof(block_q5_K, dmin)}, 2, offsetof(block_q5_K, qh),
     sizeof(block_q5_K)},
    {EL_TYPE_Q6_K, {offsetof(block_q6_K, d), 0}, 1, 0, offsetof(block_q6_K, scales)},
};

static const block_desc *desc_of(int type) {
    for (size_t i = 0; i < sizeof g_desc / sizeof g_desc[0]; i++)
        if (g_desc[i].type == type) return &g_desc[i];
    return NULL;
}

/* weight types with dequant, quant and dot; activation-only types excluded */
static const int g_types[] = {EL_TYPE_F32,  EL_TYPE_F16,  EL_TYPE_BF16, EL_TYPE_Q4_0, EL_TYPE_Q4_1,
                              EL_TYPE_Q5_0, EL_TYPE_Q5_1, EL_TYPE_Q8_0, EL_TYPE_Q2_K, EL_TYPE_Q3_K,
                              EL_TYPE_Q4_K, EL_TYPE_Q5_K, EL_TYPE_Q6_K};
#define N_TYPES (sizeof g_types / sizeof g_types[0])
static const int g_act_types[] = {EL_TYPE_Q8_0, EL_TYPE_Q8_1, EL_TYPE_Q8_K};

static const char *tname(int type) {
    const el_type_traits *t = el_get_type_traits(type);
    return t ? t->name : "?";
}

/* Random data of n values of `type`: random bytes with finite fp16 scales (exponents -14..-2, as
 * real weights and activations have), consistent Q8_1 s and Q8_K bsums, finite F16 / BF16 / F32. */
static void fill_row(rng_t *r, int type, void *dst, size_t n) {
    uint8_t *p = dst;
    const size_t bytes = el_row_bytes(type, n);
    for (size_t i = 0; i < bytes; i++) p[i] = (uint8_t)rng_u64(r);
    if (type == EL_TYPE_F32) {
        for (size_t i = 0; i < n; i++) {
            const float f = rng_unit(r);
            memcpy(p + 4 * i, &f, 4);
        }
        return;
    }
    if (type == EL_TYPE_F16) {
        for (size_t i = 0; i < n; i++) {
            const el_half h = rng_half(r, -10, 3);
            memcpy(p + 2 * i, &h, 2);
        }
        return;
    }
    if (type == EL_TYPE_BF16) {
        for (size_t i = 0; i < n; i++) {
            const uint16_t e = (uint16_t)(127 - 10 + rng_below(r, 14));
            const uint16_t b = (uint16_t)(((rng_u64(r) & 1) << 15) | (e << 7) | (rng_u64(r) & 0x7f));
            memcpy(p + 2 * i, &b, 2);
        }
        return;
    }
    const size_t bs = el_type_block_bytes(type), nb = n / el_type_block_size(type);
    if (type == EL_TYPE_Q8_K) {
        for (size_t b = 0; b < nb; b++) {
            block_q8_K y;
            memcpy(&y, p + b * bs, sizeof y);
            y.d = (float)(rng_below(r, 1u << 20) + 1) * 0x1p-28f;
            for (int j = 0; j < QK_K; j++)
                if (y.qs[j] == -128) y.qs[j] = -127;
            for (int g = 0; g < QK_K / 16; g++) {
                int s = 0;
                for (int j = 0; j < 16; j++) s += y.qs[16 * g + j];
                y.bsums[g] = (int16_t)s;
            }
            memcpy(p + b * bs, &y, sizeof y);
        }
        return;
    }
    const block_desc *d = desc_of(type);
    for (size_t b = 0; b < nb; b++) {
        uint8_t *blk = p + b * bs;
        /* activation quants are in [-127, 127], as the quantizers make them: the x86 sign trick
         * (|w| times sign-adjusted a) relies on it, as ggml's does */
        if (type == EL_TYPE_Q8_0 || type == EL_TYPE_Q8_1)
            for (size_t j = d->q_lo; j < d->q_hi; j++)
                if (blk[j] == 0x80) blk[j] = 0x81;
        for (int h = 0; h < d->n_half; h++) {
            const el_half v = rng_half(r, -14, -2);
            memcpy(blk + d->half_off[h], &v, 2);
        }
        if (type == EL_TYPE_Q8_1) { /* s = d * sum(qs), as the quantizer writes it */
            el_half hd;
            memcpy(&hd, blk, 2);
            int sum = 0;
            for (int j = 0; j < QK8_1; j++) sum += (int8_t)blk[4 + j];
            const el_half hs = el_fp32_to_fp16((float)sum * el_fp16_to_fp32(hd));
            memcpy(blk + 2, &hs, 2);
        }
    }
}

/* values of a row (any type, activation types included), through the scalar reference */
static void row_to_float(int type, const void *src, size_t n, float *dst) {
    el_get_type_traits(type)->to_float(src, dst, n);
}

/* the per-value offsets o_j: the row with every quant bit zeroed, dequantized (0 for float types) */
static void row_offsets(int type, const void *src, size_t n, float *dst) {
    const block_desc *d = desc_of(type);
    if (!d) {
        memset(dst, 0, n * sizeof(float));
        return;
    }
    const size_t bytes = el_row_bytes(type, n), bs = el_type_block_bytes(type);
    uint8_t *tmp = xmalloc(bytes);
    memcpy(tmp, src, bytes);
    for (size_t b = 0; b < bytes / bs; b++) memset(tmp + b * bs + d->q_lo, 0, d->q_hi - d->q_lo);
    row_to_float(type, tmp, n, dst);
    free(tmp);
}

typedef struct { double mag, mag_off; } dot_bound;

/* M = sum (|w| + 2|o|)|a| and sum |o||a| for the tolerances in the header */
static dot_bound dot_magnitude(int wtype, size_t n, const void *w, const void *a) {
    const int at = el_vec_dot_type(wtype);
    float *wf = xmalloc(n * sizeof(float)), *of = xmalloc(n * sizeof(float)), *af = xmalloc(n * sizeof(float));
    row_to_float(wtype, w, n, wf);
    row_offsets(wtype, w, n, of);
    row_to_float(at, a, n, af);
    dot_bound b = {0, 0};
    for (size_t j = 0; j < n; j++) {
        b.mag += (fabs(wf[j]) + 2 * fabs(of[j])) * fabs(af[j]);
        b.mag_off += fabs(of[j]) * fabs(af[j]);
    }
    free(wf);
    free(of);
    free(af);
    return b;
}

static double dot_tol(int wtype, size_t n, dot_bound b) {
    const double nb = (double)(n / el_type_block_size(wtype));
    return (nb + 4) * 0x1p-22 * b.mag + 1e-30;
}

/* ------------------------------------------------------------------ ISAs */

static const char *g_isas[5];
static int g_n_isas;
static const char *g_auto_isa;

static int isa_exact_blocks(const char *isa) {
    /* arch/neon.c documents bit-identical block dot products (same integer sums, same float order) */
    return strcmp(isa, "neon") == 0 || strcmp(isa, "neon-dotprod") == 0 || strcmp(isa, "scalar") == 0;
}

/* the dot products of wtype on isa must equal scalar's bits: NEON's block types; its float weight
 * types (F32, F16, BF16) sum in 4-lane partial sums, within tolerance as on x86 */
static int isa_exact_dot(const char *isa, int wtype) {
    const int is_float = wtype == EL_TYPE_F32 || wtype == EL_TYPE_F16 || wtype == EL_TYPE_BF16;
    return isa_exact_blocks(isa) && (!is_float || strcmp(isa, "scalar") == 0);
}

/* switching is not itself a test: only a failure to switch is counted */
static void use_isa(const char *isa) {
    const int st = el_isa_set(isa);
    if (st != EL_OK || strcmp(el_isa_name(), isa) != 0) check(0, "el_isa_set(%s) -> %d, active %s", isa, st, el_isa_name());
}

/* One pool alive at a time: idle workers spin before they sleep, and several pools' spinners on a
 * small (or emulated) machine would starve the threads doing the work. */
static el_pool *g_pool;

static el_pool *pool_of(int n_threads) {
    if (g_pool && el_pool_threads(g_pool) == n_threads) return g_pool;
    el_pool_free(g_pool);
    g_pool = NULL;
    if (el_pool_create(n_threads, &g_pool) != EL_OK) {
        fprintf(stderr, "cannot create a pool of %d threads\n", n_threads);
        exit(2);
    }
    return g_pool;
}

/* ------------------------------------------------------------------ tests: ISA paths vs scalar */

static size_t sizes_for(int type, size_t out[4]) {
    const size_t bs = el_type_block_size(type);
    if (bs == 1) {
        out[0] = 1, out[1] = 7, out[2] = 64, out[3] = 1001;
        return 4;
    }
    if (bs == QK_K) {
        out[0] = 256, out[1] = 768, out[2] = 2048;
        return 3;
    }
    /* odd and even block counts: kernels that take 2 blocks per step have a lone-block path */
    out[0] = 32, out[1] = 96, out[2] = 1056, out[3] = 640;
    return 4;
}

static void test_vec_dot(rng_t *r) {
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const int wt = g_types[ti], at = el_vec_dot_type(wt);
        size_t ns[4];
        const size_t nn = sizes_for(wt, ns);
        for (size_t si = 0; si < nn; si++) {
            const size_t n = ns[si], wb = el_row_bytes(wt, n), ab = el_row_bytes(at, n);
            for (int trial = 0; trial < 6; trial++) {
                /* odd trials put both rows at odd addresses: blocks are packed, never aligned */
                const size_t off = (size_t)(trial & 1);
                uint8_t *wbuf = xmalloc(wb + off), *abuf = xmalloc(ab + off);
                uint8_t *w = wbuf + off, *a = abuf + off;
                fill_row(r, wt, w, n);
                fill_row(r, at, a, n);
                float ref = 0, got = 0;
                use_isa("scalar");
                check(el_vec_dot(wt, n, w, wb, a, ab, &ref) == EL_OK, "vec_dot %s scalar status", tname(wt));
                const dot_bound b = dot_magnitude(wt, n, w, a);
                const double tol = dot_tol(wt, n, b);
                check(isfinite(ref), "vec_dot %s n=%zu scalar not finite", tname(wt), n);
                for (int k = 0; k < g_n_isas; k++) {
                    if (strcmp(g_isas[k], "scalar") == 0) continue;
                    use_isa(g_isas[k]);
                    check(el_vec_dot(wt, n, w, wb, a, ab, &got) == EL_OK, "vec_dot status");
                    const double err = fabs((double)got - (double)ref);
                    if (isa_exact_dot(g_isas[k], wt))
                        check(got == ref, "vec_dot %s n=%zu isa=%s: %.9g != scalar %.9g (must be bit-identical)",
                              tname(wt), n, g_isas[k], got, ref);
                    else
                        check(err <= tol, "vec_dot %s n=%zu isa=%s: %.9g vs scalar %.9g (err %.3g > tol %.3g)",
                              tname(wt), n, g_isas[k], got, ref, err, tol);
                }
                free(wbuf);
                free(abuf);
            }
        }
    }
    use_isa(g_auto_isa);
}

/* a block where scaling gives exact .5 ties (amax 127 -> d = 1), to pin the rounding mode */
static void tie_block(float *x, size_t n, int neg) {
    for (size_t j = 0; j < n; j++) x[j] = (float)((int)(j % 40) - 20) + 0.5f;
    x[0] = neg ? -127.0f : 127.0f;
}

static void test_quantize_act(rng_t *r) {
    for (size_t ai = 0; ai < sizeof g_act_types / sizeof g_act_types[0]; ai++) {
        const int at = g_act_types[ai];
        const el_type_traits *tr = el_get_type_traits(at);
        for (int trial = 0; trial < 8; trial++) {
            const size_t n = tr->blck_size * (size_t)(1 + trial % 4 * 3), bytes = el_row_bytes(at, n);
            float *x = xmalloc(n * sizeof(float));
            rng_floats(r, x, n, trial % 2 ? 3.0f : 0.01f);
            if (trial == 2) memset(x, 0, n * sizeof(float));        /* all-zero block: d = 0 */
            if (trial == 3 || trial == 5) tie_block(x, n, trial == 5); /* rounding of exact halves */
            uint8_t *ref = xmalloc(bytes), *got = xmalloc(bytes + 1);
            tr->from_float(x, ref, n);
            for (int k = 0; k < g_n_isas; k++) {
                use_isa(g_isas[k]);
                memset(got, 0xA5, bytes);
                /* odd output address: activation rows live in a shared scratch buffer */
                el_kern()->quantize_act[at](x, got + (trial & 1), n);
                check(memcmp(ref, got + (trial & 1), bytes) == 0, "quantize_act %s n=%zu isa=%s trial %d differs from reference",
                      tname(at), n, g_isas[k], trial);
            }
            free(x);
            free(ref);
            free(got);
        }
    }
    use_isa(g_auto_isa);
}

static void test_float_kernels(rng_t *r) {
    static const size_t ns[] = {1, 3, 4, 15, 16, 17, 64, 255, 1000};
    for (size_t si = 0; si < sizeof ns / sizeof ns[0]; si++) {
        const size_t n = ns[si];
        float *a = xmalloc((n + 1) * sizeof(float)), *b = xmalloc((n + 1) * sizeof(float));
        el_half *h = xmalloc((n + 1) * sizeof(el_half));
        float *y0 = xmalloc(n * sizeof(float)), *y1 = xmalloc(n * sizeof(float)), *yr = xmalloc(n * sizeof(float));
        rng_floats(r, a, n + 1, 2.0f);
        rng_floats(r, b, n + 1, 2.0f);
        for (size_t i = 0; i < n + 1; i++) h[i] = rng_half(r, -6, 1);
        rng_floats(r, yr, n, 1.0f);
        const float alpha = rng_unit(r);
        /* one element in: unaligned starts, as rows of a KV cache can be */
        const float *ua = a + 1, *ub = b + 1;
        const el_half *uh = h + 1;
        double mag_ff = 0, mag_fh = 0;
        for (size_t i = 0; i < n; i++) {
            mag_ff += fabs((double)ua[i] * ub[i]);
            mag_fh += fabs((double)ua[i] * el_fp16_to_fp32(uh[i]));
        }
        const double slack = 0x1p-23 * (double)(n + 8);
        const float ref_ff = el_dot_f32_scalar(n, ua, ub), ref_fh = el_dot_f32_f16_scalar(n, ua, uh);
        for (int k = 0; k < g_n_isas; k++) {
            use_isa(g_isas[k]);
            const el_kernels *K = el_kern();
            const float g_ff = K->dot_f32(n, ua, ub), g_fh = K->dot_f32_f16(n, ua, uh);
            check(fabs((double)g_ff - ref_ff) <= slack * mag_ff + 1e-30, "dot_f32 n=%zu isa=%s %.9g vs %.9g", n,
                  g_isas[k], g_ff, ref_ff);
            check(fabs((double)g_fh - ref_fh) <= slack * mag_fh + 1e-30, "dot_f32_f16 n=%zu isa=%s %.9g vs %.9g", n,
                  g_isas[k], g_fh, ref_fh);
            /* axpy: one product and one sum per element, fused or not: 2^-23 of the terms */
            memcpy(y0, yr, n * sizeof(float));
            memcpy(y1, yr, n * sizeof(float));
            K->axpy_f32(n, alpha, ua, y0);
            K->axpy_f16(n, alpha, uh, y1);
            int ok0 = 1, ok1 = 1;
            for (size_t i = 0; i < n; i++) {
                const double e0 = (double)yr[i] + (double)alpha * ua[i];
                const double e1 = (double)yr[i] + (double)alpha * el_fp16_to_fp32(uh[i]);
                ok0 &= fabs(y0[i] - e0) <= 0x1p-22 * (fabs(yr[i]) + fabs((double)alpha * ua[i])) + 1e-38;
                ok1 &= fabs(y1[i] - e1) <= 0x1p-22 * (fabs(yr[i]) + fabs((double)alpha * el_fp16_to_fp32(uh[i]))) + 1e-38;
            }
            check(ok0, "axpy_f32 n=%zu isa=%s out of tolerance", n, g_isas[k]);
            check(ok1, "axpy_f16 n=%zu isa=%s out of tolerance", n, g_isas[k]);
        }
        free(a);
        free(b);
        free(h);
        free(y0);
        free(y1);
        free(yr);
    }
    /* vecmat (LoRA's B t from B^T): every ISA bit-exact with the scalar fmaf chain, F32 and F16, odd
     * widths and ranks, a row stride beyond the width; an F16 B gives the bits of its values as F32 */
    static const size_t vm[][3] = {{1, 1, 1}, {16, 64, 64}, {3, 37, 40}, {64, 8, 200}, {5, 33, 33}, {2, 100, 131}};
    for (size_t vi = 0; vi < sizeof vm / sizeof vm[0]; vi++) {
        const size_t rk = vm[vi][0], m = vm[vi][1], ld = vm[vi][2];
        float *t = xmalloc(rk * sizeof(float)), *bf = xmalloc(rk * ld * sizeof(float));
        el_half *bh = xmalloc(rk * ld * sizeof(el_half));
        float *ref = xmalloc(m * sizeof(float)), *refh = xmalloc(m * sizeof(float)), *got = xmalloc(m * sizeof(float));
        rng_floats(r, t, rk, 1.0f);
        for (size_t i = 0; i < rk * ld; i++) bh[i] = rng_half(r, -6, 1), bf[i] = el_fp16_to_fp32(bh[i]);
        el_vecmat_f32_scalar(rk, m, t, bf, ld, ref);
        el_vecmat_f16_scalar(rk, m, t, bh, ld, refh);
        check(!memcmp(ref, refh, m * sizeof(float)), "vecmat_f16 rank %zu m %zu: not the bits of F32", rk, m);
        int tol_ok = 1;
        for (size_t o = 0; o < m; o++) {
            double e = 0, mag = 0;
            for (size_t k = 0; k < rk; k++) e += (double)t[k] * bf[k * ld + o], mag += fabs((double)t[k] * bf[k * ld + o]);
            tol_ok &= fabs(ref[o] - e) <= 0x1p-24 * (double)(rk + 1) * mag + 1e-38;
        }
        check(tol_ok, "vecmat rank %zu m %zu: off the double sum", rk, m);
        for (int k = 0; k < g_n_isas; k++) {
            use_isa(g_isas[k]);
            el_kern()->vecmat_f32(rk, m, t, bf, ld, got);
            check(!memcmp(got, ref, m * sizeof(float)), "vecmat_f32 rank %zu m %zu isa=%s differs", rk, m, g_isas[k]);
            el_kern()->vecmat_f16(rk, m, t, bh, ld, got);
            check(!memcmp(got, ref, m * sizeof(float)), "vecmat_f16 rank %zu m %zu isa=%s differs", rk, m, g_isas[k]);
        }
        free(t), free(bf), free(bh), free(ref), free(refh), free(got);
    }
    use_isa(g_auto_isa);
    /* round_f16 (q of an F16 cache): bit-exact with the scalar conversion, random bit patterns of
     * every exponent (overflow, subnormals, ties) plus the special values; NaN stays NaN */
    enum { NR = 4099 };
    float *x = xmalloc(NR * sizeof(float)), *y0 = xmalloc(NR * sizeof(float)), *y1 = xmalloc(NR * sizeof(float));
    for (size_t i = 0; i < NR; i++) {
        uint32_t u = (uint32_t)rng_u64(r);
        if (i % 3 == 0) u = (u & 0x80001fffu) | ((uint32_t)(100 + i % 60) << 23) | 0x1000u; /* f16 ties */
        memcpy(&x[i], &u, 4);
    }
    x[0] = INFINITY, x[1] = -INFINITY, x[2] = NAN, x[3] = 65520.0f, x[4] = 65519.0f, x[5] = 0x1p-25f, x[6] = -0.0f;
    el_round_f16_scalar(NR, x, y0);
    for (int k = 0; k < g_n_isas; k++) {
        use_isa(g_isas[k]);
        el_kern()->round_f16(NR, x, y1);
        int same = 1;
        for (size_t i = 0; i < NR; i++) same &= isnan(y0[i]) ? isnan(y1[i]) != 0 : memcmp(&y0[i], &y1[i], 4) == 0;
        check(same, "round_f16 isa=%s differs from the scalar conversion", g_isas[k]);
        el_half *h0 = xmalloc(NR * sizeof(el_half)), *h1 = xmalloc(NR * sizeof(el_half));
        el_to_f16_scalar(NR, x, h0);
        el_kern()->to_f16(NR, x, h1);
        same = 1;
        for (size_t i = 0; i < NR; i++)
            same &= isnan(y0[i]) ? isnan(el_fp16_to_fp32(h1[i])) != 0 : h0[i] == h1[i];
        check(same, "to_f16 isa=%s differs from the scalar conversion", g_isas[k]);
        free(h0);
        free(h1);
    }
    free(x);
    free(y0);
    free(y1);
    /* gelu_lut: the bits of el_gelu (the table computed on the fly) for every half value, random
     * floats around the +-10 cut-offs and between halves, odd lengths (the scalar tail) */
    enum { NG = 65536 + 4001 };
    el_half *table = xmalloc(65536 * sizeof(el_half));
    el_gelu_table_fill(table);
    float *g = xmalloc(NG * sizeof(float)), *g0 = xmalloc(NG * sizeof(float)), *g1 = xmalloc(NG * sizeof(float));
    for (size_t i = 0; i < 65536; i++) g[i] = el_fp16_to_fp32((el_half)i);
    rng_floats(r, g + 65536, NG - 65536, 12.0f);
    g[65536] = 10.0f, g[65537] = -10.0f, g[65538] = nextafterf(10.0f, 0.0f), g[65539] = nextafterf(-10.0f, 0.0f);
    g[65540] = NAN, g[65541] = INFINITY, g[65542] = -INFINITY, g[65543] = -0.0f;
    memcpy(g0, g, NG * sizeof(float));
    el_gelu(g0, NG);
    for (int k = 0; k < g_n_isas; k++) {
        use_isa(g_isas[k]);
        for (size_t len = NG; len + 8 > NG; len -= 3) {
            memcpy(g1, g, NG * sizeof(float));
            el_kern()->gelu_lut(g1, len, table);
            int same = 1;
            for (size_t i = 0; i < NG; i++) {
                const float want = i < len ? g0[i] : g[i];
                same &= isnan(want) ? isnan(g1[i]) != 0 : memcmp(&want, &g1[i], 4) == 0;
            }
            check(same, "gelu_lut isa=%s length %zu differs from el_gelu", g_isas[k], len);
        }
    }
    free(table);
    free(g);
    free(g0);
    free(g1);
    use_isa(g_auto_isa);
}

/* ------------------------------------------------------------------ matmul */

typedef struct {
    size_t rows, cols, n_vec;
    uint8_t *w;
    float *x, *ref;
    double *tol;
} mm_case;

static void mm_case_make(rng_t *r, int wt, size_t rows, size_t cols, size_t n_vec, mm_case *c) {
    const int at = el_vec_dot_type(wt);
    const size_t rb = el_row_bytes(wt, cols);
    c->rows = rows, c->cols = cols, c->n_vec = n_vec;
    c->w = xmalloc(rows * rb);
    c->x = xmalloc(cols * n_vec * sizeof(float));
    c->ref = xmalloc(rows * n_vec * sizeof(float));
    c->tol = xmalloc(rows * n_vec * sizeof(double));
    for (size_t i = 0; i < rows; i++) fill_row(r, wt, c->w + i * rb, cols);
    rng_floats(r, c->x, cols * n_vec, 1.5f);
    /* reference: double products of dequantized weights and reference-quantized activations */
    const size_t ab = at == EL_TYPE_F32 ? cols * sizeof(float) : el_row_bytes(at, cols);
    uint8_t *act = xmalloc(ab);
    float *wf = xmalloc(cols * sizeof(float)), *af = xmalloc(cols * sizeof(float));
    for (size_t v = 0; v < n_vec; v++) {
        if (at == EL_TYPE_F32) memcpy(act, c->x + v * cols, ab);
        else el_get_type_traits(at)->from_float(c->x + v * cols, act, cols);
        row_to_float(at, act, cols, af);
        for (size_t i = 0; i < rows; i++) {
            row_to_float(wt, c->w + i * rb, cols, wf);
            double s = 0;
            for (size_t j = 0; j < cols; j++) s += (double)wf[j] * af[j];
            c->ref[v * rows + i] = (float)s;
            const dot_bound b = dot_magnitude(wt, cols, c->w + i * rb, act);
            c->tol[v * rows + i] = dot_tol(wt, cols, b) + (at == EL_TYPE_Q8_1 ? 0x1p-10 * b.mag_off : 0) +
                                   0x1p-24 * fabs(s); /* the final rounding to float */
        }
    }
    free(act);
    free(wf);
    free(af);
}

static void mm_case_free(mm_case *c) {
    free(c->w);
    free(c->x);
    free(c->ref);
    free(c->tol);
}

static void test_matmul(rng_t *r) {
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const int wt = g_types[ti];
        const size_t bs = el_type_block_size(wt);
        /* odd row counts, 17 blocks of 32 (odd) or 2 super-blocks, and sizes big enough that the
         * pool splits both the quantization and the rows over every thread */
        const size_t cols = bs == QK_K ? 512 : bs == 32 ? 544 : 67;
        for (size_t nv = 1; nv <= 5; nv += 4) {
            mm_case c;
            mm_case_make(r, wt, 37, cols, nv, &c);
            const size_t ny = c.rows * nv;
            float *y = xmalloc(ny * sizeof(float)), *y1 = xmalloc(ny * sizeof(float)), *ys = xmalloc(ny * sizeof(float));
            for (int k = 0; k < g_n_isas; k++) {
                use_isa(g_isas[k]);
                for (int nt = 1; nt <= 4; nt++) {
                    float *out = nt == 1 ? y1 : y;
                    const int st = el_matmul(pool_of(nt), wt, c.w, c.rows * el_row_bytes(wt, cols), c.rows, cols, c.x, nv, out);
                    check(st == EL_OK, "matmul %s status %d", tname(wt), st);
                    if (nt > 1)
                        check(memcmp(y, y1, ny * sizeof(float)) == 0, "matmul %s n_vec=%zu isa=%s: %d threads differ from 1",
                              tname(wt), nv, g_isas[k], nt);
                }
                size_t bad = 0, worst = 0;
                double worst_ratio = 0;
                for (size_t i = 0; i < ny; i++) {
                    const double err = fabs((double)y1[i] - c.ref[i]), ratio = err / c.tol[i];
                    if (!(err <= c.tol[i])) bad++;
                    if (!(ratio <= worst_ratio)) worst_ratio = ratio, worst = i;
                }
                check(bad == 0, "matmul %s n_vec=%zu isa=%s: %zu of %zu outputs off the double reference (worst [%zu] %.9g vs %.9g, tol %.3g)",
                      tname(wt), nv, g_isas[k], bad, ny, worst, y1[worst], c.ref[worst], c.tol[worst]);
                if (g_verbose) printf("  matmul %-5s n_vec=%zu isa=%-12s worst err/tol %.3f\n", tname(wt), nv, g_isas[k], worst_ratio);
                if (strcmp(g_isas[k], "scalar") == 0) memcpy(ys, y1, ny * sizeof(float));
                else if (isa_exact_dot(g_isas[k], wt))
                    check(memcmp(ys, y1, ny * sizeof(float)) == 0, "matmul %s isa=%s not bit-identical to scalar", tname(wt), g_isas[k]);
            }
            free(y);
            free(y1);
            free(ys);
            mm_case_free(&c);
        }
    }
    /* argument checks: wrong byte count, unsupported activation-only type */
    float x[32] = {0}, y[1];
    uint8_t w[34] = {0};
    check(el_matmul(pool_of(1), EL_TYPE_Q8_0, w, 33, 1, 32, x, 1, y) == EL_EINVAL, "matmul accepts a short weight buffer");
    check(el_matmul(pool_of(1), EL_TYPE_Q8_K, w, 34, 1, 32, x, 1, y) != EL_OK, "matmul accepts Q8_K weights");
    use_isa(g_auto_isa);
}

/* ------------------------------------------------------------------ batches: bit-identical to single rows */

/* Quant bytes at their extreme (scales left random): every weight at the type's largest magnitude,
 * every activation -128 (Q8_K's bsums to match: the NEON Q6_K matvec uses them; Q8_0 weights -127: AVX2
 * documents -128 weights as outside its domain), all products of one sign. The integer sums then reach their largest values, which is where a narrow
 * (int16) partial sum in a SIMD kernel would overflow (arch/neon_batch.c's dot32s, for one). */
static void make_extreme(int type, uint8_t *p, size_t n) {
    static const struct { int type; size_t bytes, from, to; uint8_t v; } ext[] = {
        {EL_TYPE_Q4_0, 18, 2, 18, 0x00},   {EL_TYPE_Q4_1, 20, 4, 20, 0xFF},   {EL_TYPE_Q5_0, 22, 2, 22, 0x00},
        {EL_TYPE_Q5_1, 24, 4, 24, 0xFF},   {EL_TYPE_Q8_0, 34, 2, 34, 0x81},   {EL_TYPE_Q2_K, 84, 16, 80, 0xFF},
        {EL_TYPE_Q3_K, 110, 0, 96, 0x00},  {EL_TYPE_Q4_K, 144, 16, 144, 0xFF}, {EL_TYPE_Q5_K, 176, 16, 176, 0xFF},
        {EL_TYPE_Q6_K, 210, 0, 192, 0x00}, {EL_TYPE_Q8_1, 36, 4, 36, 0x80},   {EL_TYPE_Q8_K, 292, 4, 260, 0x80},
    };
    for (size_t t = 0; t < sizeof ext / sizeof ext[0]; t++)
        if (ext[t].type == type)
            for (size_t b = 0; b < el_row_bytes(type, n) / ext[t].bytes; b++) {
                memset(p + b * ext[t].bytes + ext[t].from, ext[t].v, ext[t].to - ext[t].from);
                if (type == EL_TYPE_Q8_K) { /* bsums stay the sums of their 16 values, as the quantizer makes them */
                    const int16_t s = -128 * 16;
                    for (size_t j = 0; j < QK_K / 16; j++) memcpy(p + b * ext[t].bytes + offsetof(block_q8_K, bsums) + 2 * j, &s, 2);
                }
            }
}

/* Every lane of vec_dot_nv, vec_dot_tile, vec_dot_panel and vec_dot_rows carries the bits of the same table's vec_dot (the
 * contract in dispatch.h): rows at odd strides and addresses, every nv up to EL_NV_MAX; random quants,
 * then (ext = 1) quants at their extremes (make_extreme). */
static void test_vec_dot_nv(rng_t *r) {
    for (int k = 0; k < g_n_isas; k++) {
        use_isa(g_isas[k]);
        const el_kernels *K = el_kern();
        for (size_t ti = 0; ti < N_TYPES; ti++) {
            const int wt = g_types[ti], at = el_vec_dot_type(wt);
            if (!K->vec_dot_nv[wt] && !K->vec_dot_tile[wt] && !K->vec_dot_rows[wt]) continue;
            size_t ns[4];
            const size_t nn = sizes_for(wt, ns);
            for (size_t si = 0; si < 2 * nn; si++) {
                const int ext = si >= nn;
                const size_t n = ns[si % nn], wb = el_row_bytes(wt, n), ab = el_row_bytes(at, n), stride = ab + 3;
                /* EL_PANEL_ROWS_MAX activation rows: a panel's group may hold more than EL_NV_MAX */
                uint8_t *wbuf = xmalloc(wb + 1), *abuf = xmalloc(stride * EL_PANEL_ROWS_MAX + 1);
                uint8_t *w = wbuf + 1, *a = abuf + 1;
                fill_row(r, wt, w, n);
                for (size_t j = 0; j < EL_PANEL_ROWS_MAX; j++) fill_row(r, at, a + j * stride, n);
                if (ext) {
                    make_extreme(wt, w, n);
                    for (size_t j = 0; j < EL_PANEL_ROWS_MAX; j++) make_extreme(at, a + j * stride, n);
                }
                for (size_t nv = 1; nv <= EL_NV_MAX && K->vec_dot_nv[wt]; nv++) {
                    float out[EL_NV_MAX];
                    K->vec_dot_nv[wt](n, w, a, stride, nv, out);
                    for (size_t j = 0; j < nv; j++) {
                        const float one = K->vec_dot[wt](n, w, a + j * stride);
                        check(memcmp(&one, &out[j], sizeof one) == 0 && isfinite(one),
                              "vec_dot_nv %s n=%zu nv=%zu lane %zu isa=%s: %.9g != vec_dot %.9g", tname(wt), n, nv, j,
                              g_isas[k], out[j], one);
                    }
                }
                if (K->vec_dot_tile[wt]) {
                    /* the tile: EL_TILE_ROWS rows at a stride of wb + 1 against the same rows */
                    uint8_t *tbuf = xmalloc((wb + 1) * EL_TILE_ROWS);
                    for (size_t i = 0; i < EL_TILE_ROWS; i++) {
                        fill_row(r, wt, tbuf + i * (wb + 1), n);
                        if (ext) make_extreme(wt, tbuf + i * (wb + 1), n);
                    }
                    for (size_t nv = 1; nv <= EL_NV_MAX; nv++) {
                        float out[EL_TILE_ROWS * EL_NV_MAX + 1];
                        K->vec_dot_tile[wt](n, tbuf, wb + 1, a, stride, nv, out, nv + 1);
                        for (size_t i = 0; i < EL_TILE_ROWS; i++)
                            for (size_t j = 0; j < nv; j++) {
                                const float one = K->vec_dot[wt](n, tbuf + i * (wb + 1), a + j * stride);
                                check(memcmp(&one, &out[i * (nv + 1) + j], sizeof one) == 0,
                                      "vec_dot_tile %s n=%zu nv=%zu [%zu][%zu] isa=%s: %.9g != vec_dot %.9g", tname(wt), n,
                                      nv, i, j, g_isas[k], out[i * (nv + 1) + j], one);
                            }
                    }
                    if (K->vec_dot_panel[wt]) {
                        /* the same tile over the activations packed as a panel (one group of nv rows) */
                        for (size_t nv = 1; nv <= el_panel_group_rows(at); nv++) {
                            const size_t pb = el_panel_group_bytes(at, n);
                            uint8_t *panel = aligned_alloc(64, (pb + 63) / 64 * 64);
                            check(panel != NULL, "panel of %zu rows: %zu bytes", nv, pb);
                            K->pack_panel[at](a, stride, n, nv, panel);
                            /* one tile (rows 0 and 1, q = 1) into y[j * 3 + row], a stride past the rows */
                            float y[EL_PANEL_ROWS_MAX * 3];
                            K->vec_dot_panel[wt](n, tbuf, wb + 1, 1, 1, panel, nv, y, 3);
                            for (size_t i = 0; i < EL_TILE_ROWS; i++)
                                for (size_t j = 0; j < nv; j++) {
                                    const float one = K->vec_dot[wt](n, tbuf + i * (wb + 1), a + j * stride);
                                    check(memcmp(&one, &y[j * 3 + i], sizeof one) == 0,
                                          "vec_dot_panel %s n=%zu nv=%zu [%zu][%zu] isa=%s: %.9g != vec_dot %.9g",
                                          tname(wt), n, nv, i, j, g_isas[k], y[j * 3 + i], one);
                                }
                            free(panel);
                        }
                    }
                    free(tbuf);
                }
                if (K->vec_dot_rows[wt]) {
                    /* matvec: EL_MV_ROWS rows at an odd stride (2 wb + 1: rows that are not neighbours,
                     * as matmul passes them) against one activation row */
                    const size_t ms = 2 * wb + 1;
                    uint8_t *mbuf = xmalloc(ms * EL_MV_ROWS);
                    for (size_t i = 0; i < EL_MV_ROWS; i++) {
                        fill_row(r, wt, mbuf + i * ms, n);
                        if (ext) make_extreme(wt, mbuf + i * ms, n);
                    }
                    float out[EL_MV_ROWS];
                    K->vec_dot_rows[wt](n, mbuf, ms, a, out);
                    for (size_t i = 0; i < EL_MV_ROWS; i++) {
                        const float one = K->vec_dot[wt](n, mbuf + i * ms, a);
                        check(memcmp(&one, &out[i], sizeof one) == 0 && isfinite(one),
                              "vec_dot_rows %s n=%zu row %zu isa=%s: %.9g != vec_dot %.9g", tname(wt), n, i, g_isas[k],
                              out[i], one);
                    }
                    free(mbuf);
                }
                free(wbuf);
                free(abuf);
            }
        }
    }
    use_isa(g_auto_isa);
}

/* A matmul of many activation rows gives, row for row, the bits of one-row matmuls: what makes a
 * batched prompt produce the logits of token-by-token evaluation. */
static void test_matmul_batch(rng_t *r) {
    const int types[] = {EL_TYPE_Q8_0, EL_TYPE_Q5_0, EL_TYPE_Q4_0, EL_TYPE_Q4_1, EL_TYPE_Q5_1, EL_TYPE_Q2_K,
                         EL_TYPE_Q3_K, EL_TYPE_Q4_K, EL_TYPE_Q6_K, EL_TYPE_Q5_K, EL_TYPE_F16};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const int wt = types[ti];
        const size_t bs = el_type_block_size(wt), cols = bs == QK_K ? 512 : 160, rows = 45, nv = 71;
        const size_t rb = el_row_bytes(wt, cols);
        uint8_t *w = xmalloc(rows * rb);
        float *x = xmalloc(nv * cols * sizeof(float)), *yb = xmalloc(nv * rows * sizeof(float));
        float *y1 = xmalloc(rows * sizeof(float)), *y1x = xmalloc(nv * rows * sizeof(float));
        for (size_t i = 0; i < rows; i++) fill_row(r, wt, w + i * rb, cols);
        rng_floats(r, x, nv * cols, 1.5f);
        for (int k = 0; k < g_n_isas; k++) {
            use_isa(g_isas[k]);
            for (int nt = 1; nt <= 3; nt += 2) {
                check(el_matmul(pool_of(nt), wt, w, rows * rb, rows, cols, x, nv, yb) == EL_OK, "batch matmul status");
                size_t bad = 0;
                for (size_t v = 0; v < nv; v++) {
                    check(el_matmul(pool_of(nt), wt, w, rows * rb, rows, cols, x + v * cols, 1, y1) == EL_OK, "matmul status");
                    if (memcmp(y1, yb + v * rows, rows * sizeof(float)) != 0) bad++;
                }
                check(bad == 0, "matmul %s isa=%s %d threads: %zu of %zu batch rows differ from one-row matmuls", tname(wt),
                      g_isas[k], nt, bad, nv);
            }
        }
        /* the ISA switched between quantizing and multiplying (el_isa_set may run meanwhile): the
         * buffer's size does not depend on the ISA, and a panel is used only where one was packed, so
         * the result is the multiplying ISA's, bit for bit */
        for (int qk = 0; qk < g_n_isas; qk++)
            for (int mk = 0; mk < g_n_isas; mk++) {
                use_isa(g_isas[mk]);
                check(el_matmul(pool_of(1), wt, w, rows * rb, rows, cols, x, nv, yb) == EL_OK, "matmul status");
                const size_t ab = el_act_bytes(wt, cols, nv);
                use_isa(g_isas[qk]);
                check(el_act_bytes(wt, cols, nv) == ab, "activation bytes of %s depend on the ISA", tname(wt));
                uint8_t *act = aligned_alloc(64, (ab + 63) / 64 * 64);
                memset(act, 0xA5, (ab + 63) / 64 * 64);
                el_quantize_act(pool_of(1), wt, x, cols, nv, act);
                use_isa(g_isas[mk]);
                el_matmul_act(pool_of(1), wt, w, rows, cols, act, nv, y1x, rows);
                check(memcmp(y1x, yb, nv * rows * sizeof(float)) == 0,
                      "matmul %s quantized under %s, multiplied under %s: differs from %s alone", tname(wt), g_isas[qk],
                      g_isas[mk], g_isas[mk]);
                free(act);
            }
        free(w);
        free(x);
        free(yb);
        free(y1);
        free(y1x);
    }
    use_isa(g_auto_isa);
}

/* every item of el_pool_for runs exactly once, whatever the thread count and however many tasks
 * follow each other (a worker that wakes late must not run a stale or a closed task) */
typedef struct { int *hits; size_t n; } pool_case;
static void pool_hit(void *p, size_t i, size_t n) {
    pool_case *c = p;
    if (n == c->n && i < n) __atomic_fetch_add(&c->hits[i], 1, __ATOMIC_RELAXED);
}

static void test_pool(rng_t *r) {
    (void)r;
    for (int nt = 1; nt <= 4; nt++) {
        size_t wrong = 0;
        for (size_t round = 0; round < 2000; round++) {
            const size_t n = 1 + round % 37;
            int hits[37] = {0};
            pool_case c = {hits, n};
            el_pool_for(pool_of(nt), n, pool_hit, &c);
            for (size_t i = 0; i < n; i++) wrong += hits[i] != 1;
        }
        check(wrong == 0, "el_pool_for with %d threads: %zu items not run exactly once", nt, wrong);
    }
}

/* ------------------------------------------------------------------ dequantize / quantize round trips */

static void test_dequant_quant(rng_t *r) {
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const int t = g_types[ti];
        const size_t n = el_type_block_size(t) == 1 ? 67 : 512, bytes = el_row_bytes(t, n);
        uint8_t *q = xmalloc(bytes + 1), *q2 = xmalloc(bytes);
        float *x = xmalloc(n * sizeof(float)), *y = xmalloc(n * sizeof(float)), *y2 = xmalloc(n * sizeof(float));
        fill_row(r, t, q, n);
        check(el_dequantize(t, q, bytes, y, n) == EL_OK, "dequantize %s status", tname(t));
        memmove(q + 1, q, bytes); /* the same row one byte on: reading must not depend on alignment */
        check(el_dequantize(t, q + 1, bytes, y2, n) == EL_OK, "dequantize %s status (unaligned)", tname(t));
        check(memcmp(y, y2, n * sizeof(float)) == 0, "dequantize %s depends on alignment", tname(t));
        int finite = 1;
        for (size_t i = 0; i < n; i++) finite &= isfinite(y[i]) != 0;
        check(finite, "dequantize %s of finite-scale blocks gives non-finite values", tname(t));
        check(el_dequantize(t, q, bytes - 1, y, n) == EL_EINVAL, "dequantize %s accepts a short buffer", tname(t));
        /* quantize -> dequantize error is bounded by the format's step (levels over the range) */
        rng_floats(r, x, n, 1.0f);
        check(el_quantize(t, x, n, q2, bytes) == EL_OK, "quantize %s status", tname(t));
        check(el_dequantize(t, q2, bytes, y, n) == EL_OK, "dequantize %s status", tname(t));
        const double levels = t == EL_TYPE_F32 ? 1e9 : t == EL_TYPE_F16 ? 2048 : t == EL_TYPE_BF16 ? 128
                            : t == EL_TYPE_Q8_0 ? 127 : t == EL_TYPE_Q6_K ? 31 : t == EL_TYPE_Q5_0 || t == EL_TYPE_Q5_1 ? 15
                            : t == EL_TYPE_Q5_K ? 15 : t == EL_TYPE_Q4_0 || t == EL_TYPE_Q4_1 || t == EL_TYPE_Q4_K ? 7
                            : t == EL_TYPE_Q3_K ? 3 : 1.5;
        /* inputs are uniform in [-1, 1): |x - y| <= 1/levels covers a half step plus the 6-bit or
         * fp16 rounding of the scales (a generous bound: it catches layout bugs, not tuning) */
        double worst = 0;
        for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)x[i] - y[i]));
        check(worst <= 1.0 / levels + 1e-7, "quantize %s round trip error %.4g > %.4g", tname(t), worst, 1.0 / levels);
        x[n / 2] = NAN;
        if (el_type_block_size(t) > 1)
            check(el_quantize(t, x, n, q2, bytes) == EL_EINVAL, "quantize %s accepts NaN input", tname(t));
        free(q);
        free(q2);
        free(x);
        free(y);
        free(y2);
    }
}

/* ------------------------------------------------------------------ float ops vs double references */

static double rope_theta(int32_t pos, size_t i, size_t n_rot, float base, float scale) {
    return (double)scale * (double)pos * pow((double)base, -2.0 * (double)i / (double)n_rot);
}

static void test_ops(rng_t *r) {
    /* rmsnorm */
    for (size_t n = 1; n <= 2049; n += 512) {
        float *x = xmalloc(n * sizeof(float)), *w = xmalloc(n * sizeof(float)), *o = xmalloc(n * sizeof(float));
        rng_floats(r, x, n, 4.0f);
        rng_floats(r, w, n, 2.0f);
        for (int with_w = 0; with_w < 2; with_w++) {
            el_rmsnorm(o, x, with_w ? w : NULL, n, 1e-6f);
            double ss = 0;
            for (size_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
            const double sc = 1.0 / sqrt(ss / (double)n + 1e-6);
            int ok = 1;
            for (size_t i = 0; i < n; i++) {
                const double e = (double)x[i] * sc * (with_w ? w[i] : 1.0);
                ok &= fabs(o[i] - e) <= 4e-6 * fabs(e) + 1e-30;
            }
            check(ok, "rmsnorm n=%zu weight=%d off the double reference", n, with_w);
        }
        /* in place */
        memcpy(o, x, n * sizeof(float));
        el_rmsnorm(o, o, w, n, 1e-6f);
        float *o2 = xmalloc(n * sizeof(float));
        el_rmsnorm(o2, x, w, n, 1e-6f);
        check(memcmp(o, o2, n * sizeof(float)) == 0, "rmsnorm in place differs");
        /* el_rmsnorm_rows: each row's bits of el_rmsnorm, 1 to 9 rows (groups of four and the rest), in place too */
        for (size_t rows = 1; rows <= 9; rows += 4) {
            float *xs = xmalloc(rows * n * sizeof(float)), *ys = xmalloc(rows * n * sizeof(float));
            rng_floats(r, xs, rows * n, 3.0f);
            el_rmsnorm_rows(ys, xs, w, rows, n, 1e-6f);
            int same = 1;
            for (size_t k = 0; k < rows; k++) {
                el_rmsnorm(o2, xs + k * n, w, n, 1e-6f);
                same &= memcmp(o2, ys + k * n, n * sizeof(float)) == 0;
            }
            el_rmsnorm_rows(xs, xs, w, rows, n, 1e-6f); /* in place: the same as into ys */
            same &= memcmp(xs, ys, rows * n * sizeof(float)) == 0;
            check(same, "rmsnorm_rows n=%zu rows=%zu differs from el_rmsnorm", n, rows);
            free(xs);
            free(ys);
        }
        free(o2);
        free(x);
        free(w);
        free(o);
    }
    /* softmax, including a large offset (needs the max subtraction) and -inf entries (masked) */
    for (int trial = 0; trial < 4; trial++) {
        const size_t n = trial == 0 ? 1 : 257 * (size_t)trial;
        float *x = xmalloc(n * sizeof(float));
        double *e = xmalloc(n * sizeof(double));
        rng_floats(r, x, n, 8.0f);
        if (trial == 2)
            for (size_t i = 0; i < n; i++) x[i] += 1000.0f;
        if (trial == 3)
            for (size_t i = 0; i < n; i += 3) x[i] = -INFINITY;
        double mx = -INFINITY, s = 0;
        for (size_t i = 0; i < n; i++) mx = fmax(mx, x[i]);
        for (size_t i = 0; i < n; i++) s += (e[i] = x[i] == -INFINITY ? 0.0 : exp((double)x[i] - mx));
        el_softmax(x, n);
        int ok = 1;
        double total = 0;
        for (size_t i = 0; i < n; i++) {
            ok &= fabs(x[i] - e[i] / s) <= 1e-6 + 1e-5 * e[i] / s;
            total += x[i];
        }
        check(ok && fabs(total - 1.0) < 1e-4, "softmax n=%zu trial %d off the double reference", n, trial);
        free(x);
        free(e);
    }
    /* silu: its own e^t (ops.c) against double, within 4 ulp down to 1e-30 in size, at random
     * values, across the clamp and at the ends; NaN stays NaN; any length (vector body and tail) */
    {
        static const float special[] = {0.0f, -0.0f, 1e-30f, -1e-30f, 0.5f, -0.5f, 86.9f, -86.9f, 87.0f, -87.0f,
                                        87.5f, -87.5f, 88.0f, -88.0f, 88.5f, -88.5f, 100.0f, -100.0f, 1e30f, -1e30f};
        const size_t ns = sizeof special / sizeof special[0], n = 1000 + ns;
        float *x = xmalloc(n * sizeof(float)), *y = xmalloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) x[i] = i < ns ? special[i] : rng_unit(r) * (i % 2 ? 20.0f : 120.0f);
        memcpy(y, x, n * sizeof(float));
        el_silu(y, n);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) {
            const double ref = (double)x[i] / (1.0 + exp(-(double)x[i]));
            const double tol = fabs(ref) >= 1e-30 ? 4.0 * 0x1p-24 * fabs(ref) : 1e-30;
            if (!(fabs((double)y[i] - ref) <= tol)) {
                if (bad++ < 3) fprintf(stderr, "silu(%.9g) = %.9g, double %.9g\n", x[i], y[i], ref);
            }
        }
        check(bad == 0, "silu: %zu of %zu values off the double reference", bad, n);
        float nan_in[5] = {NAN, 1.0f, NAN, -2.0f, NAN};
        el_silu(nan_in, 5);
        check(isnan(nan_in[0]) && isnan(nan_in[2]) && isnan(nan_in[4]) && !isnan(nan_in[1]) && !isnan(nan_in[3]),
              "silu: NaN in, NaN out");
        for (size_t len = 1; len < 40; len++) { /* every length: the same bits value by value */
            float z[40], one;
            memcpy(z, x + ns, len * sizeof(float));
            el_silu(z, len);
            one = x[ns + len - 1];
            el_silu(&one, 1);
            check(memcmp(&one, &z[len - 1], sizeof one) == 0, "silu length %zu: the last value differs alone", len);
        }
        free(x);
        free(y);
    }
    /* rope: both layouts, partial rotation, frequency scaling */
    static const int32_t positions[] = {0, 1, 17, 300, 4095};
    for (int neox = 0; neox < 2; neox++)
        for (size_t pi = 0; pi < sizeof positions / sizeof positions[0]; pi++) {
            const size_t n_head = 3, head_dim = 64, n_rot = pi % 2 ? 32 : 64;
            const float base = pi % 2 ? 1e6f : 10000.0f, fscale = pi == 3 ? 0.25f : 1.0f;
            const int32_t pos = positions[pi];
            float x[3 * 64], x0[3 * 64];
            rng_floats(r, x0, n_head * head_dim, 1.0f);
            memcpy(x, x0, sizeof x);
            el_rope(x, n_head, head_dim, n_rot, pos, base, fscale, neox);
            const double tol = 2e-7 * (double)(n_rot / 2 + 2) * (fabs((double)pos) + 1) + 1e-6;
            int ok = 1;
            for (size_t h = 0; h < n_head; h++) {
                const float *v0 = x0 + h * head_dim, *v = x + h * head_dim;
                for (size_t i = 0; i < n_rot / 2; i++) {
                    const double th = rope_theta(pos, i, n_rot, base, fscale);
                    const size_t a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
                    const double ea = v0[a] * cos(th) - v0[b] * sin(th), eb = v0[a] * sin(th) + v0[b] * cos(th);
                    ok &= fabs(v[a] - ea) <= tol && fabs(v[b] - eb) <= tol;
                }
                for (size_t i = n_rot; i < head_dim; i++) ok &= v[i] == v0[i]; /* unrotated dims untouched */
            }
            check(ok, "rope neox=%d pos=%d n_rot=%zu off the double reference", neox, pos, n_rot);
        }
}

/* ------------------------------------------------------------------ attention */

#define ATTN_MAX_HD 128

typedef struct {
    size_t n_q, n_head, n_head_kv, head_dim, n_kv;
    int kv_type;
    int32_t window;
    float scale;
    float *q, *out;
    int32_t *q_pos, *kv_pos;
    uint8_t *k, *v;
} attn_case;

static void attn_make(rng_t *r, int kv_type, size_t n_head, size_t n_head_kv, int32_t window, size_t n_kv,
                      size_t head_dim, attn_case *c) {
    c->n_q = 4, c->n_head = n_head, c->n_head_kv = n_head_kv, c->head_dim = head_dim, c->n_kv = n_kv;
    c->kv_type = kv_type, c->window = window, c->scale = 0.125f;
    const size_t row = el_row_bytes(kv_type, c->head_dim), slot = row * n_head_kv;
    c->q = xmalloc(c->n_q * n_head * c->head_dim * sizeof(float));
    c->out = xmalloc(c->n_q * n_head * c->head_dim * sizeof(float));
    c->q_pos = xmalloc(c->n_q * sizeof(int32_t));
    c->kv_pos = xmalloc(c->n_kv * sizeof(int32_t));
    c->k = xmalloc(c->n_kv * slot);
    c->v = xmalloc(c->n_kv * slot);
    rng_floats(r, c->q, c->n_q * n_head * c->head_dim, 2.0f);
    float tmp[ATTN_MAX_HD];
    for (size_t j = 0; j < c->n_kv * n_head_kv; j++) {
        rng_floats(r, tmp, c->head_dim, 2.0f);
        el_quantize(kv_type, tmp, c->head_dim, c->k + j * row, row);
        rng_floats(r, tmp, c->head_dim, 1.0f);
        el_quantize(kv_type, tmp, c->head_dim, c->v + j * row, row);
    }
    /* slots hold positions 0..n_kv-2 in a shuffled order, one slot empty (-1), as a ring cache does */
    const int32_t last = (int32_t)n_kv - 1;
    for (size_t j = 0; j < c->n_kv; j++) c->kv_pos[j] = (int32_t)j;
    for (size_t j = c->n_kv - 1; j > 0; j--) {
        const size_t s = rng_below(r, (uint32_t)(j + 1));
        const int32_t t = c->kv_pos[j];
        c->kv_pos[j] = c->kv_pos[s], c->kv_pos[s] = t;
    }
    for (size_t j = 0; j < c->n_kv; j++)
        if (c->kv_pos[j] == last) c->kv_pos[j] = -1;
    /* early (few keys), late (all), middle, beyond the window of every key (nothing visible: zeros) */
    c->q_pos[0] = 3, c->q_pos[1] = last - 1, c->q_pos[2] = last / 2 + 1, c->q_pos[3] = window ? last + window + 18 : 0;
}

static void attn_free(attn_case *c) {
    free(c->q), free(c->out), free(c->q_pos), free(c->kv_pos), free(c->k), free(c->v);
}

/* double reference; q is first rounded to the cache's dot format, which is the defined semantics
 * (llama.cpp converts f32 q to f16 / q8_0 before multiplying by the keys) */
static void attn_reference(const attn_case *c, double *ref) {
    const size_t hd = c->head_dim, group = c->n_head / c->n_head_kv, row = el_row_bytes(c->kv_type, hd);
    float qr[ATTN_MAX_HD], kf[ATTN_MAX_HD], vf[ATTN_MAX_HD];
    uint8_t qq[sizeof(block_q8_0) * ATTN_MAX_HD / 32];
    double *sc = xmalloc(c->n_kv * sizeof(double));
    for (size_t i = 0; i < c->n_q; i++)
        for (size_t h = 0; h < c->n_head; h++) {
            const float *q = c->q + (i * c->n_head + h) * hd;
            if (c->kv_type == EL_TYPE_F16) for (size_t d = 0; d < hd; d++) qr[d] = el_fp16_to_fp32(el_fp32_to_fp16(q[d]));
            else if (c->kv_type == EL_TYPE_Q8_0) {
                const size_t qb = el_row_bytes(EL_TYPE_Q8_0, hd);
                check(el_quantize(EL_TYPE_Q8_0, q, hd, qq, qb) == EL_OK && el_dequantize(EL_TYPE_Q8_0, qq, qb, qr, hd) == EL_OK,
                      "q8_0 round trip of q");
            } else memcpy(qr, q, hd * sizeof(float));
            const size_t hk = h / group;
            double mx = -INFINITY;
            for (size_t j = 0; j < c->n_kv; j++) {
                const int32_t kp = c->kv_pos[j], qp = c->q_pos[i];
                if (kp < 0 || kp > qp || (c->window > 0 && qp - kp >= c->window)) {
                    sc[j] = -INFINITY;
                    continue;
                }
                el_dequantize(c->kv_type, c->k + (j * c->n_head_kv + hk) * row, row, kf, hd);
                double s = 0;
                for (size_t d = 0; d < hd; d++) s += (double)qr[d] * kf[d];
                sc[j] = s * c->scale;
                mx = fmax(mx, sc[j]);
            }
            double *o = ref + (i * c->n_head + h) * hd;
            for (size_t d = 0; d < hd; d++) o[d] = 0;
            if (mx == -INFINITY) continue;
            double sum = 0;
            for (size_t j = 0; j < c->n_kv; j++) sum += (sc[j] = sc[j] == -INFINITY ? 0 : exp(sc[j] - mx));
            for (size_t j = 0; j < c->n_kv; j++) {
                if (sc[j] == 0) continue;
                el_dequantize(c->kv_type, c->v + (j * c->n_head_kv + hk) * row, row, vf, hd);
                for (size_t d = 0; d < hd; d++) o[d] += sc[j] / sum * vf[d];
            }
        }
    free(sc);
}

static void test_attention(rng_t *r) {
    static const int kv_types[] = {EL_TYPE_F16, EL_TYPE_Q8_0, EL_TYPE_F32};
    for (size_t ki = 0; ki < 3; ki++)
        for (int variant = 0; variant < 6; variant++) {
            /* GQA 4:2 without window, GQA 4:1 with a window of 8, plain MHA 2:2 with a window of 5, over
             * 23 keys (one chunk); then 700 keys (three chunks): GQA 8:2, GQA 4:1 with a window of 300,
             * and GQA 6:1 with head_dim 40 (SIMD tails; not a Q8_0 size) */
            static const size_t nhs[] = {4, 4, 2, 8, 4, 6}, nkvs[] = {2, 1, 2, 2, 1, 1};
            static const int32_t windows[] = {0, 8, 5, 0, 300, 0};
            const size_t nh = nhs[variant], nkv = nkvs[variant], n_kv = variant < 3 ? 23 : 700;
            const size_t hd = variant == 5 ? 40 : 64;
            const int32_t window = windows[variant];
            if (hd % 32 && kv_types[ki] == EL_TYPE_Q8_0) continue;
            attn_case c;
            attn_make(r, kv_types[ki], nh, nkv, window, n_kv, hd, &c);
            const size_t nout = c.n_q * nh * c.head_dim;
            double *ref = xmalloc(nout * sizeof(double));
            attn_reference(&c, ref);
            float *o1 = xmalloc(nout * sizeof(float));
            for (int k = 0; k < g_n_isas; k++) {
                use_isa(g_isas[k]);
                const int st = el_attention(c.q, c.n_q, c.q_pos, nh, nkv, c.head_dim, c.kv_type, c.k, c.v, c.kv_pos,
                                            c.n_kv, window, c.scale, c.out);
                check(st == EL_OK, "attention status %d", st);
                double worst = 0;
                for (size_t i = 0; i < nout; i++) worst = fmax(worst, fabs(c.out[i] - ref[i]));
                check(worst <= 1e-4, "attention kv=%s heads %zu/%zu window %d keys %zu hd %zu isa=%s: max error %.3g > 1e-4",
                      tname(c.kv_type), nh, nkv, window, n_kv, hd, g_isas[k], worst);
                if (window) { /* the last query sees nothing: exact zeros */
                    int zero = 1;
                    for (size_t i = (c.n_q - 1) * nh * c.head_dim; i < nout; i++) zero &= c.out[i] == 0.0f;
                    check(zero, "attention with no visible key is not zero");
                }
                /* the pooled internal entry: 1..4 threads bit-identical to the public call, for all the
                 * queries at once (prefill: queries spread) and for each query alone (decode: chunks spread) */
                memcpy(o1, c.out, nout * sizeof(float));
                for (int nt = 1; nt <= 4; nt++) {
                    float *scratch = xmalloc(el_attention_scratch_floats(c.n_kv, nh, nkv, c.head_dim, nt) * sizeof(float));
                    el_attn_args a = {c.q, c.n_q, c.q_pos, nh, nkv, c.head_dim, c.kv_type, c.k, c.v, c.kv_pos,
                                      c.n_kv, window, c.scale, 0.0f, c.out, scratch};
                    el_attention_run(pool_of(nt), &a);
                    check(memcmp(o1, c.out, nout * sizeof(float)) == 0, "attention with %d threads differs", nt);
                    for (size_t i = 0; i < c.n_q; i++) {
                        const size_t per = nh * c.head_dim;
                        el_attn_args one = a;
                        one.q = c.q + i * per, one.n_q = 1, one.q_pos = c.q_pos + i, one.out = c.out;
                        el_attention_run(pool_of(nt), &one);
                        check(memcmp(o1 + i * per, c.out, per * sizeof(float)) == 0,
                              "attention of query %zu alone with %d threads differs", i, nt);
                    }
                    free(scratch);
                }
            }
            free(ref);
            free(o1);
            attn_free(&c);
        }
    float q[64] = {0}, out[64];
    int32_t pos = 0;
    check(el_attention(q, 1, &pos, 3, 2, 64, EL_TYPE_F16, q, q, &pos, 1, 0, 1.0f, out) == EL_EINVAL,
          "attention accepts n_head not a multiple of n_head_kv");
    check(el_attention(q, 1, &pos, 2, 2, 64, EL_TYPE_Q4_0, q, q, &pos, 1, 0, 1.0f, out) == EL_EUNSUPPORTED,
          "attention accepts a Q4_0 cache");
    use_isa(g_auto_isa);
}

/* ------------------------------------------------------------------ golden vectors */

/* A record is named outputs: bytes (compared exactly) or floats with an absolute tolerance chosen
 * on the emitting host. Emit writes them; check compares each ISA's recomputation with them. */
typedef struct {
    char name[64];
    int is_bytes;
    size_t n;
    float tol;
    float *f;
    uint8_t *b;
} golden_rec;

typedef struct {
    FILE *out;            /* emit mode */
    golden_rec *recs;     /* check mode */
    size_t n_recs, next;
    const char *isa;
    int exact_blocks;
    size_t n_exact, n_close;
    uint64_t input_hash;
} golden_sink;

static void hash_bytes(golden_sink *g, const void *p, size_t n) {
    const uint8_t *b = p;
    for (size_t i = 0; i < n; i++) g->input_hash = (g->input_hash ^ b[i]) * 0x100000001B3ull;
}

static golden_rec *golden_next(golden_sink *g, const char *name) {
    if (g->next >= g->n_recs || strcmp(g->recs[g->next].name, name) != 0) {
        check(0, "golden: record %s missing (file from another version?)", name);
        return NULL;
    }
    return &g->recs[g->next++];
}

/* tol is what emit records; with `exact` the check ignores it and wants the very bits */
static void golden_f32(golden_sink *g, const char *name, const float *v, size_t n, double tol, int exact) {
    if (g->out) {
        fprintf(g->out, "rec %s f32 %zu %a\n", name, n, (float)tol);
        for (size_t i = 0; i < n; i++) fprintf(g->out, "%a\n", v[i]);
        return;
    }
    golden_rec *r = golden_next(g, name);
    if (!r) return;
    if (r->is_bytes || r->n != n) {
        check(0, "golden %s: shape differs", name);
        return;
    }
    const double eff_tol = exact ? 0.0 : r->tol;
    size_t bad = 0, worst = 0;
    int same = 1;
    double werr = 0;
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&v[i], &r->f[i], 4) == 0) continue;
        same = 0;
        const double err = fabs((double)v[i] - r->f[i]);
        if (exact || !(err <= eff_tol)) bad++;
        if (!(err <= werr)) werr = err, worst = i;
    }
    check(bad == 0, "golden %s isa=%s: %zu of %zu values off (worst [%zu] %.9g vs %.9g, tol %.3g%s)", name, g->isa, bad,
          n, worst, v[worst], r->f[worst], eff_tol, exact ? ", bit-exact required" : "");
    if (same) g->n_exact++;
    else g->n_close++;
    if (g_verbose && !same) printf("  golden %-28s isa=%-12s max err %.3g (tol %.3g)\n", name, g->isa, werr, eff_tol);
}

static void golden_bytes(golden_sink *g, const char *name, const void *p, size_t n) {
    const uint8_t *b = p;
    if (g->out) {
        fprintf(g->out, "rec %s u8 %zu 0x0p+0\n", name, n);
        for (size_t i = 0; i < n; i++) fprintf(g->out, "%02x%s", b[i], (i % 32 == 31 || i + 1 == n) ? "\n" : "");
        return;
    }
    golden_rec *r = golden_next(g, name);
    if (!r) return;
    check(r->is_bytes && r->n == n && memcmp(r->b, b, n) == 0, "golden %s isa=%s: bytes differ", name, g->isa);
    g->n_exact++;
}

/* Everything the golden file pins, computed from seed-derived inputs through the active ISA. */
static void golden_compute(golden_sink *g, uint64_t seed) {
    rng_t r = {seed ^ 0x601d};
    char name[64];
    g->input_hash = 0xcbf29ce484222325ull;
    for (size_t ti = 0; ti < N_TYPES; ti++) {
        const int t = g_types[ti], at = el_vec_dot_type(t);
        const size_t n = el_type_block_size(t) == 1 ? 96 : 512, bytes = el_row_bytes(t, n);
        uint8_t *q = xmalloc(bytes), *q2 = xmalloc(bytes);
        float *x = xmalloc(n * sizeof(float)), *y = xmalloc(n * sizeof(float));
        /* dequantize random blocks: exact */
        fill_row(&r, t, q, n);
        hash_bytes(g, q, bytes);
        el_dequantize(t, q, bytes, y, n);
        snprintf(name, sizeof name, "dequant.%s", tname(t));
        golden_f32(g, name, y, n, 0, 1);
        /* reference quantizer: exact bytes */
        rng_floats(&r, x, n, 1.0f);
        hash_bytes(g, x, n * sizeof(float));
        el_quantize(t, x, n, q2, bytes);
        snprintf(name, sizeof name, "quant.%s", tname(t));
        golden_bytes(g, name, q2, bytes);
        /* vec_dot of 4 random weight rows with random activations */
        const size_t ab = el_row_bytes(at, n);
        uint8_t *a = xmalloc(ab);
        float dots[4];
        double tol = 0;
        for (int k = 0; k < 4; k++) {
            fill_row(&r, t, q, n);
            fill_row(&r, at, a, n);
            hash_bytes(g, q, bytes);
            hash_bytes(g, a, ab);
            el_vec_dot(t, n, q, bytes, a, ab, &dots[k]);
            const double tk = g->out ? dot_tol(t, n, dot_magnitude(t, n, q, a)) : 0;
            tol = fmax(tol, tk);
        }
        snprintf(name, sizeof name, "vec_dot.%s", tname(t));
        golden_f32(g, name, dots, 4, tol, g->exact_blocks && isa_exact_dot(g->isa, t));
        /* matmul, 2 threads, 2 vectors */
        mm_case c;
        const size_t cols = el_type_block_size(t) == QK_K ? 512 : el_type_block_size(t) == 32 ? 544 : 67;
        mm_case_make(&r, t, 19, cols, 2, &c);
        hash_bytes(g, c.w, c.rows * el_row_bytes(t, cols));
        float ym[38];
        el_matmul(pool_of(2), t, c.w, c.rows * el_row_bytes(t, cols), c.rows, cols, c.x, 2, ym);
        double mtol = 0;
        for (size_t i = 0; i < 38; i++) mtol = fmax(mtol, c.tol[i]);
        snprintf(name, sizeof name, "matmul.%s", tname(t));
        golden_f32(g, name, ym, 38, 2 * mtol, g->exact_blocks && isa_exact_dot(g->isa, t));
        mm_case_free(&c);
        free(a);
        free(q);
        free(q2);
        free(x);
        free(y);
    }
    /* activation quantizers of the active ISA: exact bytes */
    for (size_t ai = 0; ai < 3; ai++) {
        const int at = g_act_types[ai];
        float x[512];
        uint8_t q[sizeof(block_q8_K) * 2];
        rng_floats(&r, x, 512, 2.0f);
        el_kern()->quantize_act[at](x, q, 512);
        snprintf(name, sizeof name, "quantize_act.%s", tname(at));
        golden_bytes(g, name, q, el_row_bytes(at, 512));
    }
    /* float ops (not bit-pinned across compilers: libm and contraction differ) */
    float x[640], w[640], o[640];
    rng_floats(&r, x, 640, 3.0f);
    rng_floats(&r, w, 640, 1.0f);
    el_rmsnorm(o, x, w, 640, 1e-6f);
    golden_f32(g, "rmsnorm", o, 640, 4e-6 * 8, 0);
    memcpy(o, x, sizeof o);
    el_softmax(o, 640);
    golden_f32(g, "softmax", o, 640, 1e-6, 0);
    for (int neox = 0; neox < 2; neox++) {
        memcpy(o, x, sizeof o);
        el_rope(o, 10, 64, 64, 123, 10000.0f, 1.0f, neox);
        golden_f32(g, neox ? "rope.neox" : "rope.normal", o, 640, 2e-7 * 34 * 124 * 3.0 + 1e-6, 0);
    }
    static const int kv_types[] = {EL_TYPE_F16, EL_TYPE_Q8_0, EL_TYPE_F32};
    for (size_t ki = 0; ki < 3; ki++) {
        attn_case c;
        attn_make(&r, kv_types[ki], 4, 2, ki == 1 ? 6 : 0, 23, 64, &c);
        el_attention(c.q, c.n_q, c.q_pos, 4, 2, c.head_dim, c.kv_type, c.k, c.v, c.kv_pos, c.n_kv, c.window, c.scale,
                     c.out);
        snprintf(name, sizeof name, "attention.%s", tname(kv_types[ki]));
        golden_f32(g, name, c.out, c.n_q * 4 * c.head_dim, 2e-5, 0);
        attn_free(&c);
    }
    /* last: a mismatch here means the inputs differ, so every other mismatch is moot */
    uint8_t hb[8];
    memcpy(hb, &g->input_hash, 8);
    golden_bytes(g, "input_hash", hb, 8);
}

static int golden_emit(const char *path, uint64_t seed) {
    FILE *f = fopen(path, "w");
    if (!f) {
        perror(path);
        return 2;
    }
    fprintf(f, "edgellama-golden 1 seed %llu\n", (unsigned long long)seed);
    use_isa("scalar");
    golden_sink g = {0};
    g.out = f;
    g.isa = "scalar";
    golden_compute(&g, seed);
    fprintf(f, "end\n");
    fclose(f);
    printf("golden vectors of the scalar reference written to %s\n", path);
    return 0;
}

static golden_rec *golden_load(const char *path, uint64_t *seed, size_t *n_out) {
    FILE *f = fopen(path, "r");
    if (!f) {
        perror(path);
        return NULL;
    }
    unsigned long long s = 0;
    int version = 0;
    if (fscanf(f, "edgellama-golden %d seed %llu", &version, &s) != 2 || version != 1) {
        fprintf(stderr, "%s: not a golden file\n", path);
        fclose(f);
        return NULL;
    }
    size_t cap = 64, n = 0;
    golden_rec *recs = xmalloc(cap * sizeof *recs);
    char word[16], kind[8];
    while (fscanf(f, " %15s", word) == 1 && strcmp(word, "rec") == 0) {
        if (n == cap) {
            cap *= 2;
            golden_rec *nr = realloc(recs, cap * sizeof *recs);
            if (!nr) exit(2);
            recs = nr;
        }
        golden_rec *r = &recs[n];
        memset(r, 0, sizeof *r);
        if (fscanf(f, " %63s %7s %zu %a", r->name, kind, &r->n, &r->tol) != 4 || r->n > (1u << 24)) break;
        r->is_bytes = strcmp(kind, "u8") == 0;
        int ok = 1;
        if (r->is_bytes) {
            r->b = xmalloc(r->n);
            for (size_t i = 0; i < r->n && ok; i++) {
                unsigned v;
                ok = fscanf(f, "%2x", &v) == 1;
                r->b[i] = (uint8_t)v;
            }
        } else {
            r->f = xmalloc(r->n * sizeof(float));
            for (size_t i = 0; i < r->n && ok; i++) ok = fscanf(f, " %a", &r->f[i]) == 1;
        }
        if (!ok) {
            fprintf(stderr, "%s: truncated record %s\n", path, r->name);
            break;
        }
        n++;
    }
    fclose(f);
    *seed = s;
    *n_out = n;
    return recs;
}

static void golden_check(const char *path) {
    uint64_t seed = 0;
    size_t n = 0;
    golden_rec *recs = golden_load(path, &seed, &n);
    check(recs != NULL && n > 0, "golden file %s unreadable", path);
    if (!recs) return;
    for (int k = 0; k < g_n_isas; k++) {
        use_isa(g_isas[k]);
        golden_sink g = {0};
        g.recs = recs, g.n_recs = n, g.isa = g_isas[k], g.exact_blocks = isa_exact_blocks(g_isas[k]);
        golden_compute(&g, seed);
        check(g.next == n, "golden isa=%s: %zu of %zu records compared", g_isas[k], g.next, n);
        printf("golden vs %s: isa=%s %zu records bit-identical, %zu within tolerance\n", path, g_isas[k], g.n_exact,
               g.n_close);
    }
    for (size_t i = 0; i < n; i++) free(recs[i].f), free(recs[i].b);
    free(recs);
    use_isa(g_auto_isa);
}

/* ------------------------------------------------------------------ main */

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------------ sizes past 32 bits */

/* A description whose tensors are fake pointers with consistent sizes: planning reads only the
 * shapes, never the weights (nothing here is dereferenced or allocated). */
typedef struct { el_layer layer; el_model_desc d; } fake_model;

static el_tensor fake_tensor(int type, int64_t ne0, int64_t ne1) {
    el_tensor t = {(const void *)(uintptr_t)64, el_row_bytes(type, (size_t)ne0) * (size_t)ne1, type, ne0, ne1};
    return t;
}

static void fake_model_make(fake_model *f, int32_t n_ff) {
    const int32_t E = 256, NH = 2, NKV = 1, HD = 128, V = 256;
    memset(f, 0, sizeof *f);
    el_layer *L = &f->layer;
    L->attn_norm = fake_tensor(EL_TYPE_F32, E, 1);
    L->ffn_norm = fake_tensor(EL_TYPE_F32, E, 1);
    L->wq = fake_tensor(EL_TYPE_Q8_0, E, NH * HD);
    L->wk = fake_tensor(EL_TYPE_Q8_0, E, NKV * HD);
    L->wv = fake_tensor(EL_TYPE_Q8_0, E, NKV * HD);
    L->wo = fake_tensor(EL_TYPE_Q8_0, NH * HD, E);
    L->w_gate = fake_tensor(EL_TYPE_Q8_0, E, n_ff);
    L->w_up = fake_tensor(EL_TYPE_Q8_0, E, n_ff);
    L->w_down = fake_tensor(EL_TYPE_Q8_0, n_ff, E);
    L->rope_base = 10000.0f, L->rope_scale = 1.0f;
    el_model_desc *d = &f->d;
    d->arch = EL_ARCH_LLAMA, d->act = EL_ACT_SILU;
    d->n_layer = 1, d->n_embd = E, d->n_head = NH, d->n_head_kv = NKV, d->head_dim = HD, d->n_rot = HD;
    d->n_ff = n_ff, d->n_vocab = V, d->norm_eps = 1e-5f, d->emb_scale = 1.0f, d->attn_scale = 0.088f;
    d->tok_embd = fake_tensor(EL_TYPE_Q8_0, E, V);
    d->output_norm = fake_tensor(EL_TYPE_F32, E, 1);
    d->layers = &f->layer;
}

/* Shapes whose scratch or KV cache passes 4 GiB: a 32-bit build (armhf) must refuse them with
 * EL_ENOMEM before allocating, never plan or allocate a wrapped size; a 64-bit build plans their
 * true sizes (checked against bounds computed here in 64 bits). */
/* ---- grammar matcher: a hand-compiled grammar, the trie mask against per-token steps, random bytes ---- */
static void test_grammar(rng_t *r) {
    /* root ::= "a" rep | "\u4e2d"   rep ::= [b-d] rep |   (rule 1: `[b-d]*` as the parser writes it) */
    const int32_t code[] = {EL_GRAM_CHAR, 'a', EL_GRAM_RULE_REF, 1, EL_GRAM_ALT, 0, EL_GRAM_CHAR, 0x4E2D, EL_GRAM_END, 0,
                            EL_GRAM_CHAR, 'b', EL_GRAM_CHAR_RNG_UPPER, 'd', EL_GRAM_RULE_REF, 1, EL_GRAM_ALT, 0,
                            EL_GRAM_END, 0};
    const int32_t starts[] = {0, 5};
    el_grammar *g = NULL;
    check(el_grammar_create(code, sizeof code / sizeof code[0], starts, 2, 0, &g) == EL_OK, "grammar create");
    if (!g) return;
    const int32_t s0 = el_grammar_start(g);
    check(s0 >= 0 && el_grammar_state_flags(g, s0) == 0, "grammar start state");
    const int32_t sa = el_grammar_step(g, s0, (const uint8_t *)"abdc", 4);
    check(sa >= 0 && el_grammar_state_flags(g, sa) == EL_GRAM_ACCEPTING, "grammar: abdc accepted, more may follow");
    check(el_grammar_step(g, s0, (const uint8_t *)"ae", 2) == -1, "grammar: ae refused");
    const int32_t half = el_grammar_step(g, s0, (const uint8_t *)"\xe4\xb8", 2);
    check(half >= 0 && el_grammar_state_flags(g, half) == 0, "grammar: half a UTF-8 character is pending");
    const int32_t full = el_grammar_step(g, half, (const uint8_t *)"\xad", 1);
    check(full >= 0 && el_grammar_state_flags(g, full) == (EL_GRAM_ACCEPTING | EL_GRAM_DONE), "grammar: done after U+4E2D");
    check(el_grammar_step(g, s0, (const uint8_t *)"\xe0\x80", 2) == -1, "grammar: overlong prefix refused");
    /* a small vocabulary: the mask equals stepping each token */
    const char *vocab[] = {"a", "ab", "abc", "b", "", "\xe4", "\xe4\xb8\xad", "ae", "bcd", "a", "dd", "\xb8\xad"};
    enum { NV = sizeof vocab / sizeof vocab[0] };
    uint8_t bytes[64];
    int64_t off[NV + 1] = {0};
    for (int i = 0; i < NV; i++) {
        size_t n = strlen(vocab[i]);
        memcpy(bytes + off[i], vocab[i], n);
        off[i + 1] = off[i] + (int64_t)n;
    }
    el_vocab_trie *t = NULL;
    check(el_vocab_trie_create(bytes, off, NV, &t) == EL_OK, "vocabulary trie create");
    if (t) {
        const int32_t states[] = {s0, sa, half, full};
        for (int k = 0; k < 4; k++) {
            uint8_t mask[NV];
            check(el_grammar_allowed(g, t, states[k], mask, NV) == EL_OK, "grammar mask");
            for (int i = 0; i < NV; i++) {
                const size_t n = strlen(vocab[i]);
                const int want = n > 0 && el_grammar_step(g, states[k], (const uint8_t *)vocab[i], n) >= 0;
                check(mask[i] == want, "grammar mask state %d token %d: %d, stepping says %d", k, i, mask[i], want);
            }
        }
        uint8_t small[4];
        check(el_grammar_allowed(g, t, s0, small, 4) == EL_EINVAL, "grammar mask refuses a short buffer");
        el_vocab_trie_free(t);
    }
    /* random bytes from random states never leave memory the matcher owns (sanitizer runs) */
    for (int i = 0; i < 2000; i++) {
        uint8_t buf[8];
        for (int j = 0; j < 8; j++) buf[j] = (uint8_t)(rng_u64(r) & 0xFF);
        const int32_t st = el_grammar_step(g, s0, buf, 1 + (size_t)(rng_u64(r) % 8));
        check(st >= -1, "grammar step on random bytes: %d", st);
    }
    const int32_t kept = el_grammar_compact(g, sa);
    check(kept >= 0 && el_grammar_state_flags(g, kept) == EL_GRAM_ACCEPTING &&
          el_grammar_step(g, kept, (const uint8_t *)"b", 1) >= 0, "grammar compact keeps the state");
    el_grammar_free(g);
    /* malformed code is refused */
    const int32_t bad_ref[] = {EL_GRAM_RULE_REF, 7, EL_GRAM_END, 0};
    const int32_t no_end[] = {EL_GRAM_CHAR, 'a', EL_GRAM_ALT, 0};
    const int32_t lone_upper[] = {EL_GRAM_CHAR_RNG_UPPER, 'a', EL_GRAM_END, 0};
    const int32_t s1[] = {0};
    el_grammar *bad = NULL;
    check(el_grammar_create(bad_ref, 4, s1, 1, 0, &bad) == EL_EINVAL && !bad, "grammar: bad rule reference refused");
    check(el_grammar_create(no_end, 4, s1, 1, 0, &bad) == EL_EINVAL, "grammar: missing END refused");
    check(el_grammar_create(lone_upper, 4, s1, 1, 0, &bad) == EL_EINVAL, "grammar: range without a start refused");
    check(el_grammar_create(bad_ref, 3, s1, 1, 0, &bad) == EL_EINVAL, "grammar: odd code length refused");
}

static void test_size_overflow(rng_t *r) {
    (void)r;
    const int narrow = sizeof(size_t) < 8;
    static fake_model f; /* static: a handle could keep pointers into it */
    struct { int32_t n_ff, n_ctx, n_batch; int kv_type; const char *what; } cases[] = {
        {1 << 18, 2048, 2048, EL_TYPE_F16, "g and u 2 GiB each: only their sum wraps"},
        {1 << 18, 8192, 8192, EL_TYPE_F16, "B * n_ff * 4 = 8 GiB: one product wraps"},
        {512, 1 << 24, 1, EL_TYPE_F32, "KV cache of 2^24 slots: 16 GiB"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        fake_model_make(&f, cases[i].n_ff);
        const uint64_t B = (uint64_t)cases[i].n_batch, slots = (uint64_t)cases[i].n_ctx;
        const uint64_t row = cases[i].kv_type == EL_TYPE_F32 ? 4 * 128 : 2 * 128;
        const uint64_t kv_want = slots * (2 * row * 1 + 4);
        const uint64_t scratch_min = 2 * B * (uint64_t)cases[i].n_ff * 4 + 2 * B * 256 * 4; /* g, u, x, xn */
        size_t kv = 1, scratch = 1;
        const int st = el_model_plan(&f.d, cases[i].n_ctx, cases[i].n_batch, cases[i].kv_type, 4, &kv, &scratch);
        /* the llama.cpp mode's own scratch (its activations share the native buffers): per thread q,
         * the scores of every cell and 64 lanes of V sums */
        for (int nth = 4; nth <= 64; nth *= 16) {
            const uint64_t cells = ((uint64_t)cases[i].n_ctx + 63) / 64 * 64;
            const uint64_t want = (uint64_t)nth * (128 + cells + 128 * 64) * 4; /* a multiple of 64 */
            const size_t llx = el_model_numerics_bytes(&f.d, cases[i].n_ctx, cases[i].n_batch, nth, EL_NUMERICS_LLAMACPP);
            check(want <= SIZE_MAX ? (uint64_t)llx == want : llx == 0, "numerics bytes of %s, %d threads: %zu, want %llu%s",
                  cases[i].what, nth, llx, (unsigned long long)want, want <= SIZE_MAX ? "" : " (0: does not fit)");
        }
        if (narrow) {
            check(st == EL_ENOMEM && kv == 1 && scratch == 1, "32-bit plan of %s: status %d, kv %zu, scratch %zu (want EL_ENOMEM, untouched)",
                  cases[i].what, st, kv, scratch);
            el_pool *pool = pool_of(2);
            el_model *m = NULL;
            const int cs = el_model_create(&f.d, pool, cases[i].n_ctx, cases[i].n_batch, cases[i].kv_type, &m);
            check(cs == EL_ENOMEM && m == NULL, "32-bit create of %s: status %d (want EL_ENOMEM)", cases[i].what, cs);
        } else {
            check(st == EL_OK && (uint64_t)kv == kv_want && (uint64_t)scratch >= scratch_min,
                  "64-bit plan of %s: status %d, kv %zu (want %llu), scratch %zu (want >= %llu)", cases[i].what, st, kv,
                  (unsigned long long)kv_want, scratch, (unsigned long long)scratch_min);
        }
    }
    /* the public attention sizes its own scratch: 2^30 slots need > 4 GiB of it */
    if (narrow) {
        float q[128] = {0}, out[128];
        const int32_t qp = 0;
        const int st = el_attention(q, 1, &qp, 1, 1, 128, EL_TYPE_F16, (const void *)(uintptr_t)64, (const void *)(uintptr_t)64,
                                    (const int32_t *)(uintptr_t)64, (size_t)1 << 30, 0, 1.0f, out);
        check(st == EL_ENOMEM, "32-bit el_attention over 2^30 slots: status %d (want EL_ENOMEM)", st);
    }
}

/* ------------------------------------------------------------------ llama.cpp's float order */

/* el_llx_*: every ISA gives the scalar references' bits (the order is llama.cpp's, not the CPU's),
 * for 1..4 threads; batches of 1..9 rows reach every path (vec_dot, Q4_K gemv / gemm, tiled Q6_K,
 * Q0 batches); attention, in both x86 builds' orders, over a window in decode and prefill, with head
 * sizes with and without tails past 8, 16, 32 and 64. */
static void test_llamacpp_order(rng_t *r) {
    static const int types[] = {EL_TYPE_Q5_0, EL_TYPE_Q8_0, EL_TYPE_Q4_1, EL_TYPE_Q4_K, EL_TYPE_Q6_K};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        const int wt = types[ti];
        const size_t rows = 21, cols = el_type_block_size(wt) == QK_K ? 512 : 544;
        check(el_llx_type_supported(wt, cols), "llx: %s unsupported", tname(wt));
        const size_t rb = el_row_bytes(wt, cols);
        uint8_t *w = xmalloc(rows * rb);
        for (size_t i = 0; i < rows; i++) fill_row(r, wt, w + i * rb, cols);
        for (size_t nv = 1; nv <= 9; nv += 2) {
            float *x = xmalloc(nv * cols * sizeof(float)), *ys = xmalloc(nv * rows * sizeof(float));
            float *y = xmalloc(nv * rows * sizeof(float));
            rng_floats(r, x, nv * cols, 8.0f);
            void *act = xmalloc(el_llx_act_bytes(wt, cols, nv));
            for (int k = 0; k < g_n_isas; k++) {
                use_isa(g_isas[k]);
                for (int nt = 1; nt <= 4; nt += 3) {
                    el_llx_matmul(pool_of(nt), wt, w, rows, cols, x, nv, y, rows, act);
                    if (k == 0 && nt == 1) memcpy(ys, y, nv * rows * sizeof(float));
                    else
                        check(memcmp(ys, y, nv * rows * sizeof(float)) == 0, "llx matmul %s n_vec=%zu isa=%s threads=%d: not the scalar bits",
                              tname(wt), nv, g_isas[k], nt);
                }
            }
            size_t finite = 0;
            for (size_t i = 0; i < nv * rows; i++) finite += isfinite(ys[i]) != 0;
            check(finite == nv * rows, "llx matmul %s: non-finite outputs", tname(wt));
            free(x), free(y), free(ys), free(act);
        }
        free(w);
    }
    static const size_t head_dims[] = {64, 80, 96, 256};
    for (int build = EL_LLX_AVX2; build <= EL_LLX_AVX512; build++) /* each build's order, same cases */
        for (size_t hi = 0; hi < 4; hi++)
            for (size_t n_q = 1; n_q <= 5; n_q += 4) {
                const size_t hd = head_dims[hi], nh = 4, nkv = 2, n_kv = 70, cells = 128;
                float *q = xmalloc(n_q * nh * hd * sizeof(float)), *o = xmalloc(n_q * nh * hd * sizeof(float));
                float *os = xmalloc(n_q * nh * hd * sizeof(float));
                el_half *kc = xmalloc(n_kv * nkv * hd * sizeof(el_half)), *vc = xmalloc(n_kv * nkv * hd * sizeof(el_half));
                int32_t *kv_pos = xmalloc(n_kv * sizeof(int32_t)), *q_pos = xmalloc(n_q * sizeof(int32_t));
                rng_floats(r, q, n_q * nh * hd, 2.0f);
                for (size_t i = 0; i < n_kv * nkv * hd; i++) kc[i] = rng_half(r, -6, 1), vc[i] = rng_half(r, -6, 1);
                for (size_t j = 0; j < n_kv; j++) kv_pos[j] = (int32_t)j;
                for (size_t t = 0; t < n_q; t++) q_pos[t] = (int32_t)(n_kv - n_q + t);
                for (int k = 0; k < g_n_isas; k++) {
                    use_isa(g_isas[k]);
                    for (int nt = 1; nt <= 4; nt += 3) {
                        float *scratch = xmalloc(el_llx_attn_scratch_floats(cells, hd, nt) * sizeof(float));
                        el_attn_args a = {q, n_q, q_pos, nh, nkv, hd, EL_TYPE_F16, kc, vc, kv_pos, n_kv, 33, 0.125f, 0.0f, o, NULL};
                        el_llx_attention(pool_of(nt), (el_llx_build)build, &a, cells, scratch);
                        free(scratch);
                        if (k == 0 && nt == 1) memcpy(os, o, n_q * nh * hd * sizeof(float));
                        else
                            check(memcmp(os, o, n_q * nh * hd * sizeof(float)) == 0, "llx attention hd=%zu n_q=%zu isa=%s threads=%d build=%d: not the scalar bits",
                                  hd, n_q, g_isas[k], nt, build);
                    }
                }
                free(q), free(o), free(os), free(kc), free(vc), free(kv_pos), free(q_pos);
            }
    use_isa(g_auto_isa);
}

/* ------------------------------------------------------------------ threads */

/* el_isa_set while another thread reads the table: every table a reader sees is one ISA's complete
 * table, byte for byte (the table used to be cleared and refilled in place) */
typedef struct { const char *isa[2]; int stop; long switches; } isa_flip;

static void *flip_isas(void *p) {
    isa_flip *f = p;
    while (!__atomic_load_n(&f->stop, __ATOMIC_ACQUIRE)) {
        if (el_isa_set(f->isa[f->switches & 1]) != EL_OK) break;
        __atomic_fetch_add(&f->switches, 1, __ATOMIC_RELAXED);
    }
    return NULL;
}

static void test_isa_switch_while_reading(void) {
    if (g_n_isas < 2) {
        printf("  (one ISA only: no switch to race)\n");
        return;
    }
    isa_flip f = {{"scalar", g_isas[g_n_isas - 1]}, 0, 0};
    static el_kernels ref[2], seen;
    for (int i = 0; i < 2; i++) {
        use_isa(f.isa[i]);
        memcpy(&ref[i], el_kern(), sizeof ref[i]);
    }
    pthread_t th;
    if (pthread_create(&th, NULL, flip_isas, &f) != 0) {
        check(0, "pthread_create");
        return;
    }
    long torn = 0, reads = 0;
    for (; reads < 2000000 && __atomic_load_n(&f.switches, __ATOMIC_RELAXED) < 2000; reads++) {
        memcpy(&seen, el_kern(), sizeof seen);
        const int which = seen.name && strcmp(seen.name, f.isa[1]) == 0;
        torn += memcmp(&seen, &ref[which], sizeof seen) != 0;
    }
    __atomic_store_n(&f.stop, 1, __ATOMIC_RELEASE);
    pthread_join(th, NULL);
    check(torn == 0 && f.switches > 0, "el_isa_set %s <-> %s: %ld of %ld table reads torn (%ld switches)",
          f.isa[0], f.isa[1], torn, reads, f.switches);
    use_isa(g_auto_isa);
}

/* A tiny llama-style model from the PRNG (Q8_0 matrices, F32 norms; layer 1 windowed), for the
 * model-level thread guarantees; n_ctx TINY_CTX, batches of TINY_BATCH. */
#define TINY_CTX 32
#define TINY_BATCH 8
#define TINY_VOCAB 40
typedef struct {
    el_model_desc d;
    el_layer L[2];
    void *bufs[40];
    int n_bufs;
} tiny_model;

static void tiny_tensor(rng_t *r, tiny_model *t, el_tensor *dst, int type, int64_t ne0, int64_t ne1, float scale,
                        float offset) {
    const size_t n = (size_t)ne0 * (size_t)ne1, bytes = el_row_bytes(type, (size_t)ne0) * (size_t)ne1;
    float *x = xmalloc(n * sizeof(float));
    rng_floats(r, x, n, scale);
    for (size_t i = 0; i < n; i++) x[i] += offset;
    void *data = x;
    if (type != EL_TYPE_F32) {
        data = xmalloc(bytes);
        el_quantize(type, x, n, data, bytes);
        free(x);
    }
    t->bufs[t->n_bufs++] = data;
    *dst = (el_tensor){data, bytes, type, ne0, ne1};
}

static void tiny_make(rng_t *r, tiny_model *t) {
    memset(t, 0, sizeof *t);
    el_model_desc *d = &t->d;
    d->arch = EL_ARCH_LLAMA, d->act = EL_ACT_SILU, d->rope_neox = 0;
    d->n_layer = 2, d->n_embd = 64, d->n_head = 4, d->n_head_kv = 2, d->head_dim = 16, d->n_rot = 16;
    d->n_ff = 128, d->n_vocab = TINY_VOCAB, d->norm_eps = 1e-5f, d->emb_scale = 1.0f, d->attn_scale = 0.25f;
    const int q = EL_TYPE_Q8_0, f = EL_TYPE_F32;
    tiny_tensor(r, t, &d->tok_embd, q, 64, TINY_VOCAB, 1.0f, 0.0f);
    tiny_tensor(r, t, &d->output_norm, f, 64, 1, 0.2f, 1.0f);
    for (int il = 0; il < 2; il++) {
        el_layer *L = &t->L[il];
        tiny_tensor(r, t, &L->attn_norm, f, 64, 1, 0.2f, 1.0f);
        tiny_tensor(r, t, &L->wq, q, 64, 64, 0.2f, 0.0f);
        tiny_tensor(r, t, &L->wk, q, 64, 32, 0.2f, 0.0f);
        tiny_tensor(r, t, &L->wv, q, 64, 32, 0.2f, 0.0f);
        tiny_tensor(r, t, &L->wo, q, 64, 64, 0.2f, 0.0f);
        tiny_tensor(r, t, &L->ffn_norm, f, 64, 1, 0.2f, 1.0f);
        tiny_tensor(r, t, &L->w_gate, q, 64, 128, 0.2f, 0.0f);
        tiny_tensor(r, t, &L->w_up, q, 64, 128, 0.2f, 0.0f);
        tiny_tensor(r, t, &L->w_down, q, 128, 64, 0.2f, 0.0f);
        L->rope_base = 10000.0f, L->rope_scale = 1.0f, L->window = il == 1 ? 8 : 0;
    }
    d->layers = t->L;
}

static void tiny_free(tiny_model *t) {
    for (int i = 0; i < t->n_bufs; i++) free(t->bufs[i]);
}

/* one thread's work on a model: `rounds` times, rewind to 0 and evaluate the sequence (token by
 * token, or as one batch with every token's logits), comparing the logits with `want` bit for bit */
typedef struct {
    el_model *m;
    const int32_t *tokens;
    size_t n;
    int batch, rounds;
    const float *want;
    int wrong, ectx, other;
} eval_job;

static void eval_once(eval_job *j, float *out) {
    int st = el_model_truncate(j->m, 0);
    if (st == EL_OK && j->batch) st = el_model_eval(j->m, j->tokens, j->n, 0, out, 1);
    for (size_t i = 0; st == EL_OK && !j->batch && i < j->n; i++)
        st = el_model_eval(j->m, j->tokens + i, 1, (int32_t)i, out + i * TINY_VOCAB, 0);
    if (st == EL_ECTX) j->ectx++; /* another thread moved the shared cache between the two calls */
    else if (st != EL_OK) j->other++;
    else if (j->want && memcmp(out, j->want, j->n * TINY_VOCAB * sizeof(float)) != 0) j->wrong++;
}

static void *eval_rounds(void *p) {
    eval_job *j = p;
    float *out = xmalloc(j->n * TINY_VOCAB * sizeof(float));
    for (int k = 0; k < j->rounds; k++) eval_once(j, out);
    free(out);
    return NULL;
}

/* two threads at once: results as when alone (each call runs whole), never a mix */
static void run_pair(eval_job *a, eval_job *b) {
    pthread_t th;
    if (pthread_create(&th, NULL, eval_rounds, b) != 0) {
        check(0, "pthread_create");
        return;
    }
    eval_rounds(a);
    pthread_join(th, NULL);
}

static void test_model_threads(rng_t *r) {
    tiny_model t;
    tiny_make(r, &t);
    int32_t tokens[TINY_BATCH];
    for (int i = 0; i < TINY_BATCH; i++) tokens[i] = (int32_t)rng_below(r, TINY_VOCAB);
    el_pool *pool;
    if (el_pool_create(3, &pool) != EL_OK) {
        check(0, "el_pool_create(3)");
        tiny_free(&t);
        return;
    }
    el_model *ma = NULL, *mb = NULL;
    int st = el_model_create(&t.d, pool, TINY_CTX, TINY_BATCH, EL_TYPE_F16, &ma);
    if (st == EL_OK) st = el_model_create(&t.d, pool, TINY_CTX, TINY_BATCH, EL_TYPE_F16, &mb);
    check(st == EL_OK, "el_model_create of the tiny model -> %d", st);
    if (st == EL_OK) {
        float *step = xmalloc(TINY_BATCH * TINY_VOCAB * sizeof(float)), *all = xmalloc(TINY_BATCH * TINY_VOCAB * sizeof(float));
        eval_job ref = {ma, tokens, TINY_BATCH, 0, 1, NULL, 0, 0, 0};
        eval_once(&ref, step);
        ref.batch = 1;
        eval_once(&ref, all);
        check(ref.other == 0 && memcmp(step, all, sizeof(float) * TINY_BATCH * TINY_VOCAB) == 0,
              "tiny model: a batch gives the logits of token-by-token evaluation");
        /* two models on one pool, one thread each (a pool's task fields are shared by its models) */
        eval_job a = {ma, tokens, TINY_BATCH, 0, 40, step, 0, 0, 0}, b = {mb, tokens, TINY_BATCH, 1, 40, all, 0, 0, 0};
        run_pair(&a, &b);
        check(a.wrong + b.wrong + a.ectx + b.ectx + a.other + b.other == 0,
              "two models on one pool from two threads: %d + %d rounds wrong, %d + %d errors", a.wrong, b.wrong,
              a.ectx + a.other, b.ectx + b.other);
        /* two threads on one model: each call runs whole; between truncate and eval the other
         * thread may move the cache (then EL_ECTX), but logits are right or the call refused */
        eval_job c = {ma, tokens, TINY_BATCH, 1, 40, all, 0, 0, 0}, e = {ma, tokens, TINY_BATCH, 1, 40, all, 0, 0, 0};
        run_pair(&c, &e);
        check(c.wrong + e.wrong + c.other + e.other == 0 && c.ectx + e.ectx < 80,
              "two threads on one model: %d + %d rounds wrong, %d + %d other errors (%d + %d EL_ECTX)", c.wrong,
              e.wrong, c.other, e.other, c.ectx, e.ectx);
        /* a public call from inside a call on the same pool is refused, not a deadlock */
        check(el_pool_enter(pool) == EL_OK, "el_pool_enter");
        float y[4];
        const float x[32] = {1.0f};
        const int sm = el_matmul(pool, EL_TYPE_F32, x, sizeof x, 1, 32, x, 1, y);
        const int se = el_model_eval(ma, tokens, 1, 0, y, 0);
        el_pool_leave(pool);
        check(sm == EL_EBUSY && se == EL_EBUSY, "a call nested in a call on the same pool: %d, %d (want EL_EBUSY)", sm, se);
        free(step);
        free(all);
    }
    el_model_free(ma);
    el_model_free(mb);
    el_pool_free(pool);
    tiny_free(&t);
}

/* el_pool_free while a model uses the pool: the pool lives on (its threads still work for the
 * model) until the model is freed, which frees it (a leak checker would not see a pool left
 * behind: its own threads still point to it; el_pool_live counts them) */
static void test_pool_outlives_its_owner(rng_t *r) {
    tiny_model t;
    tiny_make(r, &t);
    const int32_t tokens[3] = {1, 2, 3};
    float want[TINY_VOCAB], got[TINY_VOCAB];
    el_pool *pool;
    el_model *m = NULL;
    const int live0 = el_pool_live();
    if (el_pool_create(2, &pool) != EL_OK) {
        check(0, "el_pool_create(2)");
        tiny_free(&t);
        return;
    }
    check(el_pool_users(pool) == 0, "a new pool has no users");
    int st = el_model_create(&t.d, pool, TINY_CTX, TINY_BATCH, EL_TYPE_F16, &m);
    check(st == EL_OK && el_pool_users(pool) == 1, "el_model_create -> %d, pool users %d", st, el_pool_users(pool));
    if (st == EL_OK) {
        st = el_model_eval(m, tokens, 3, 0, want, 0);
        el_pool_free(pool); /* the owner lets go: deferred while m uses it */
        const int live_after_free = el_pool_live();
        if (st == EL_OK) st = el_model_truncate(m, 0);
        if (st == EL_OK) st = el_model_eval(m, tokens, 3, 0, got, 0);
        check(st == EL_OK && memcmp(want, got, sizeof want) == 0 && live_after_free == live0 + 1,
              "a model after its pool's el_pool_free: %d (pools live %d, want %d)", st, live_after_free, live0 + 1);
        el_model_free(m); /* frees the pool too */
    } else {
        el_pool_free(pool);
    }
    check(el_pool_live() == live0, "the last model's el_model_free frees the pool: %d pools live, want %d",
          el_pool_live(), live0);
    tiny_free(&t);
}

/* el_model_eval continues the cached sequence: pos0 is el_model_n_past, through truncate and shift */
static void test_eval_continues_the_cache(rng_t *r) {
    tiny_model t;
    tiny_make(r, &t);
    const int32_t tokens[4] = {5, 6, 7, 8};
    float y[TINY_VOCAB];
    el_model *m = NULL;
    const int st = el_model_create(&t.d, pool_of(2), TINY_CTX, TINY_BATCH, EL_TYPE_F16, &m);
    check(st == EL_OK, "el_model_create -> %d", st);
    if (st == EL_OK) {
        const int fresh_at_1 = el_model_eval(m, tokens, 1, 1, y, 0); /* a hole before it */
        const int at_0 = el_model_eval(m, tokens, 3, 0, y, 0);
        const int n3 = el_model_n_past(m);
        const int again_0 = el_model_eval(m, tokens, 1, 0, y, 0);        /* overwrite */
        const int back_2 = el_model_eval(m, tokens, 1, 2, y, 0);         /* overlap */
        const int ahead_4 = el_model_eval(m, tokens, 1, 4, y, 0);        /* a hole */
        const int at_3 = el_model_eval(m, tokens + 3, 1, 3, y, 0);
        const int tr = el_model_truncate(m, 2);
        const int n2 = el_model_n_past(m), at_2 = el_model_eval(m, tokens, 1, 2, y, 0);
        const int sh = el_model_shift(m, 1, 2); /* 3 positions -> 1 */
        const int n1 = el_model_n_past(m), at_1 = el_model_eval(m, tokens, 1, 1, y, 0);
        check(fresh_at_1 == EL_ECTX && at_0 == EL_OK && n3 == 3 && again_0 == EL_ECTX && back_2 == EL_ECTX &&
                  ahead_4 == EL_ECTX && at_3 == EL_OK && tr == EL_OK && n2 == 2 && at_2 == EL_OK && sh == EL_OK &&
                  n1 == 1 && at_1 == EL_OK && el_model_n_past(m) == 2,
              "eval positions vs the cache: %d %d n=%d %d %d %d %d | %d n=%d %d | %d n=%d %d", fresh_at_1, at_0, n3,
              again_0, back_2, ahead_4, at_3, tr, n2, at_2, sh, n1, at_1);
    }
    el_model_free(m);
    tiny_free(&t);
}

/* el_matmul from two threads on one pool: each result as computed alone */
typedef struct { el_pool *pool; const mm_case *c; const float *want; int rounds, wrong; } mm_job;

static void *mm_rounds(void *p) {
    mm_job *j = p;
    float *y = xmalloc(j->c->rows * j->c->n_vec * sizeof(float));
    const size_t wb = j->c->rows * el_row_bytes(EL_TYPE_Q4_K, j->c->cols);
    for (int k = 0; k < j->rounds; k++) {
        const int st = el_matmul(j->pool, EL_TYPE_Q4_K, j->c->w, wb, j->c->rows, j->c->cols, j->c->x, j->c->n_vec, y);
        j->wrong += st != EL_OK || memcmp(y, j->want, j->c->rows * j->c->n_vec * sizeof(float)) != 0;
    }
    free(y);
    return NULL;
}

static void test_matmul_threads(rng_t *r) {
    mm_case c[2];
    mm_case_make(r, EL_TYPE_Q4_K, 96, 512, 3, &c[0]);
    mm_case_make(r, EL_TYPE_Q4_K, 64, 768, 2, &c[1]);
    el_pool *pool = pool_of(3);
    float *want[2];
    for (int i = 0; i < 2; i++) {
        want[i] = xmalloc(c[i].rows * c[i].n_vec * sizeof(float));
        el_matmul(pool, EL_TYPE_Q4_K, c[i].w, c[i].rows * el_row_bytes(EL_TYPE_Q4_K, c[i].cols), c[i].rows, c[i].cols,
                  c[i].x, c[i].n_vec, want[i]);
    }
    mm_job a = {pool, &c[0], want[0], 300, 0}, b = {pool, &c[1], want[1], 300, 0};
    pthread_t th;
    if (pthread_create(&th, NULL, mm_rounds, &b) != 0) {
        check(0, "pthread_create");
    } else {
        mm_rounds(&a);
        pthread_join(th, NULL);
        check(a.wrong + b.wrong == 0, "el_matmul from two threads on one pool: %d + %d of 300 rounds wrong", a.wrong,
              b.wrong);
    }
    for (int i = 0; i < 2; i++) {
        free(want[i]);
        mm_case_free(&c[i]);
    }
}

static void test_threads(rng_t *r) {
    test_isa_switch_while_reading();
    test_matmul_threads(r);
    test_model_threads(r);
    test_pool_outlives_its_owner(r);
    test_eval_continues_the_cache(r);
}

/* ------------------------------------------------------------------ tests: several sequences */

/* Three sequences of the tiny model (layer 1 windowed: its ring of 15 slots wraps), sequence 1
 * shifted (keep 2, drop 6) after SEQ_SHIFT_AT tokens. */
#define SEQ_N 3
#define SEQ_SHIFT_AT 24
static const int g_seq_len[SEQ_N] = {22, 30, 26};
static const int g_seq_start[SEQ_N] = {0, 3, 7}; /* the step at which each joins */

/* every token's logits of sequence s alone, token by token on a model of one sequence and one thread */
static int seq_solo(tiny_model *t, const int32_t *tok, int len, int shift_at, float *out) {
    el_model *m = NULL;
    int st = el_model_create(&t->d, pool_of(1), TINY_CTX, TINY_BATCH, EL_TYPE_F16, &m);
    for (int i = 0; st == EL_OK && i < len; i++) {
        if (i == shift_at) st = el_model_shift(m, 2, 6);
        if (st == EL_OK) st = el_model_eval(m, tok + i, 1, el_model_n_past(m), out + (size_t)i * TINY_VOCAB, 0);
    }
    el_model_free(m);
    return st;
}

/* a sequence's state blob (malloc'ed), to see that other sequences' operations leave it alone */
static void *seq_blob(el_model *m, int32_t seq, size_t *size) {
    *size = el_model_seq_state_size(m, seq);
    void *b = xmalloc(*size ? *size : 1);
    if (el_model_seq_state_save(m, seq, b, *size) != EL_OK) memset(b, 0, *size);
    return b;
}

static int blob_same(el_model *m, int32_t seq, const void *b, size_t size) {
    size_t n;
    void *now = seq_blob(m, seq, &n);
    const int same = n == size && memcmp(now, b, n) == 0;
    free(now);
    return same;
}

/* the three sequences stepped together on 3 threads: mixed batches (a prompt chunk of one, single
 * tokens of the others, entries interleaved across sequences, some without logits) */
static void seq_together(rng_t *r, tiny_model *t, int32_t tok[SEQ_N][32], float *solo[SEQ_N], const char *isa) {
    el_model *m = NULL;
    int st = el_model_create_seqs(&t->d, pool_of(3), TINY_CTX, TINY_BATCH, EL_TYPE_F16, 4, &m);
    check(st == EL_OK && el_model_n_seq(m) == 4, "%s: el_model_create_seqs(4) -> %d", isa, st);
    if (st != EL_OK) return;
    int next[SEQ_N] = {0}, shifted = 0, wrong = 0, isolated = 1, steps = 0, max_seqs = 0;
    el_batch_entry b[TINY_BATCH];
    float *logits = xmalloc(TINY_BATCH * TINY_VOCAB * sizeof(float));
    int src_seq[TINY_BATCH], src_i[TINY_BATCH];
    for (int step = 0; st == EL_OK && step < 200; step++) {
        if (!shifted && next[1] == SEQ_SHIFT_AT) { /* the others' caches must not move */
            size_t n0, n2;
            void *b0 = seq_blob(m, 0, &n0), *b2 = seq_blob(m, 2, &n2);
            st = el_model_seq_shift(m, 1, 2, 6);
            isolated &= blob_same(m, 0, b0, n0) && blob_same(m, 2, b2, n2);
            free(b0);
            free(b2);
            shifted = 1;
        }
        int chunk[SEQ_N] = {0}, total = 0, active = 0;
        for (int s = 0; s < SEQ_N; s++) {
            if (step < g_seq_start[s] || next[s] >= g_seq_len[s]) continue;
            /* a prompt chunk of 1..5 tokens at a sequence's start or now and then, else one token */
            const int want = next[s] == 0 || rng_below(r, 4) == 0 ? 1 + (int)rng_below(r, 5) : 1;
            int c = want < g_seq_len[s] - next[s] ? want : g_seq_len[s] - next[s];
            if (s == 1 && !shifted && next[1] + c > SEQ_SHIFT_AT) c = SEQ_SHIFT_AT - next[1];
            if (total + c > TINY_BATCH) c = TINY_BATCH - total;
            chunk[s] = c, total += c, active += c > 0;
        }
        if (total == 0) {
            if (next[0] >= g_seq_len[0] && next[1] >= g_seq_len[1] && next[2] >= g_seq_len[2]) break;
            continue;
        }
        max_seqs = active > max_seqs ? active : max_seqs;
        int n = 0, pos[SEQ_N];
        for (int s = 0; s < SEQ_N; s++) pos[s] = el_model_seq_n_past(m, s);
        for (int j = 0; j < TINY_BATCH; j++) /* round robin: a sequence's entries stay in order */
            for (int s = 0; s < SEQ_N; s++)
                if (j < chunk[s]) {
                    const int i = next[s] + j;
                    b[n] = (el_batch_entry){s, tok[s][i], pos[s] + j, rng_below(r, 3) != 0};
                    src_seq[n] = s, src_i[n] = i;
                    n++;
                }
        st = el_model_decode(m, b, (size_t)n, logits);
        for (int e = 0, k = 0; st == EL_OK && e < n; e++)
            if (b[e].logits)
                wrong += memcmp(logits + (size_t)k++ * TINY_VOCAB, solo[src_seq[e]] + (size_t)src_i[e] * TINY_VOCAB,
                                TINY_VOCAB * sizeof(float)) != 0;
        for (int s = 0; s < SEQ_N; s++) next[s] += chunk[s];
        steps++;
    }
    check(st == EL_OK && wrong == 0 && max_seqs == SEQ_N && shifted,
          "%s: 3 sequences stepped together (%d steps, mixed batches, one shifted): %d logits rows differ from "
          "the sequences run alone (status %d)", isa, steps, wrong, st);
    check(isolated, "%s: a shift of sequence 1 leaves sequences 0 and 2 untouched", isa);

    /* clear and reuse a sequence while the others hold theirs: as a new model */
    size_t n1, n2;
    void *b1 = seq_blob(m, 1, &n1), *b2 = seq_blob(m, 2, &n2);
    st = el_model_seq_clear(m, 0);
    check(st == EL_OK && el_model_seq_n_past(m, 0) == 0 && blob_same(m, 1, b1, n1) && blob_same(m, 2, b2, n2),
          "%s: clearing sequence 0 leaves 1 and 2 untouched", isa);
    for (int i = 0; st == EL_OK && i < g_seq_len[2]; i++) {
        const el_batch_entry e = {0, tok[2][i], i, 1};
        st = el_model_decode(m, &e, 1, logits);
        wrong += st == EL_OK && memcmp(logits, solo[2] + (size_t)i * TINY_VOCAB, TINY_VOCAB * sizeof(float)) != 0;
    }
    check(st == EL_OK && wrong == 0, "%s: a cleared sequence reused gives a new model's logits (%d wrong)", isa, wrong);
    /* truncate of one sequence leaves the others */
    b1 = (free(b1), seq_blob(m, 1, &n1));
    st = el_model_seq_truncate(m, 2, 5);
    check(st == EL_ECTX || st == EL_OK, "%s: truncate 2 -> %d", isa, st);
    check(blob_same(m, 1, b1, n1) && el_model_seq_n_past(m, 0) == g_seq_len[2],
          "%s: truncating sequence 2 leaves sequences 0 and 1", isa);
    /* a sequence's state moves to another sequence */
    size_t n0;
    void *b0 = seq_blob(m, 0, &n0);
    st = el_model_seq_state_load(m, 3, b0, n0);
    check(st == EL_OK && el_model_seq_n_past(m, 3) == g_seq_len[2] && blob_same(m, 3, b0, n0),
          "%s: sequence 0's state loads into sequence 3 -> %d", isa, st);
    free(b0);
    free(b1);
    free(b2);
    free(logits);
    el_model_free(m);
}

static void test_sequences(rng_t *r) {
    tiny_model t;
    tiny_make(r, &t);
    int32_t tok[SEQ_N][32];
    for (int s = 0; s < SEQ_N; s++)
        for (int i = 0; i < 32; i++) tok[s][i] = (int32_t)rng_below(r, TINY_VOCAB);
    for (int ii = 0; ii < g_n_isas; ii++) {
        use_isa(g_isas[ii]);
        float *solo[SEQ_N];
        int st = EL_OK;
        for (int s = 0; s < SEQ_N; s++) {
            solo[s] = xmalloc(32 * TINY_VOCAB * sizeof(float));
            if (st == EL_OK) st = seq_solo(&t, tok[s], g_seq_len[s], s == 1 ? SEQ_SHIFT_AT : -1, solo[s]);
        }
        check(st == EL_OK, "%s: the sequences alone -> %d", g_isas[ii], st);
        if (st == EL_OK) seq_together(r, &t, tok, solo, g_isas[ii]);
        for (int s = 0; s < SEQ_N; s++) free(solo[s]);
    }
    use_isa(g_auto_isa);

    /* the plan counts every sequence's cache; bad sequence ids and positions are refused, and a
     * refused batch writes nothing */
    size_t kv1, sc1, kv4, sc4;
    int st1 = el_model_plan_seqs(&t.d, TINY_CTX, TINY_BATCH, EL_TYPE_F16, 2, 1, &kv1, &sc1);
    int st4 = el_model_plan_seqs(&t.d, TINY_CTX, TINY_BATCH, EL_TYPE_F16, 2, 4, &kv4, &sc4);
    const int bad0 = el_model_plan_seqs(&t.d, TINY_CTX, TINY_BATCH, EL_TYPE_F16, 2, 0, &kv4, &sc4);
    const int bad257 = el_model_plan_seqs(&t.d, TINY_CTX, TINY_BATCH, EL_TYPE_F16, 2, EL_MAX_SEQ + 1, &kv4, &sc4);
    check(st1 == EL_OK && st4 == EL_OK && kv4 == 4 * kv1 && sc4 == sc1 && bad0 == EL_EINVAL && bad257 == EL_EINVAL,
          "plan of 4 sequences: kv %zu = 4 x %zu, scratch %zu = %zu; n_seq 0 / 257 -> %d / %d", kv4, kv1, sc4, sc1,
          bad0, bad257);
    el_model *m = NULL;
    int st = el_model_create_seqs(&t.d, pool_of(2), TINY_CTX, TINY_BATCH, EL_TYPE_F16, 4, &m);
    check(st == EL_OK && el_model_kv_bytes(m) == kv4, "created 4 sequences: kv %zu, planned %zu",
          m ? el_model_kv_bytes(m) : 0, kv4);
    if (st == EL_OK) {
        float y[3 * TINY_VOCAB];
        const el_batch_entry ok[2] = {{0, 1, 0, 1}, {2, 3, 0, 1}};
        const el_batch_entry bad_seq[2] = {{0, 1, 1, 1}, {4, 3, 0, 1}};
        const el_batch_entry bad_pos[2] = {{0, 1, 1, 1}, {2, 3, 2, 1}};
        const el_batch_entry bad_tok[1] = {{1, TINY_VOCAB, 0, 1}};
        const int a = el_model_decode(m, ok, 2, y);
        size_t n0;
        void *b0 = seq_blob(m, 0, &n0);
        const int bs = el_model_decode(m, bad_seq, 2, y), bp = el_model_decode(m, bad_pos, 2, y);
        const int bt = el_model_decode(m, bad_tok, 1, y), none = el_model_decode(m, ok, 2, NULL);
        check(a == EL_OK && bs == EL_EINVAL && bp == EL_ECTX && bt == EL_EINVAL && none == EL_ECTX &&
                  blob_same(m, 0, b0, n0) && el_model_seq_n_past(m, 0) == 1 && el_model_seq_n_past(m, 1) == 0,
              "decode refusals: ok %d, seq 4 %d, hole %d, token %d, logits NULL %d; caches unchanged", a, bs, bp,
              bt, none);
        free(b0);
        const el_batch_entry quiet[2] = {{0, 1, 1, 0}, {1, 2, 0, 0}};
        const int q = el_model_decode(m, quiet, 2, NULL);
        check(q == EL_OK && el_model_seq_n_past(m, 0) == 2 && el_model_seq_n_past(m, 1) == 1,
              "a batch without wanted logits fills the caches -> %d", q);
        check(el_model_seq_truncate(m, 4, 0) == EL_EINVAL && el_model_seq_shift(m, -1, 0, 1) == EL_EINVAL &&
                  el_model_seq_n_past(m, 9) == -1 && el_model_seq_clear(m, 4) == EL_EINVAL,
              "per-sequence calls refuse a bad sequence id");
        /* llama.cpp numerics: per sequence only */
        if (el_model_set_numerics(m, EL_NUMERICS_LLAMACPP) == EL_OK) {
            const el_batch_entry mixed[2] = {{0, 1, 2, 1}, {1, 2, 1, 1}}, one[1] = {{3, 1, 0, 1}};
            const int mx = el_model_decode(m, mixed, 2, y), on = el_model_decode(m, one, 1, y);
            check(mx == EL_EUNSUPPORTED && on == EL_OK,
                  "llama.cpp numerics: a batch of two sequences -> %d (want EL_EUNSUPPORTED), of one -> %d", mx, on);
        } else {
            check(0, "the tiny model takes llama.cpp numerics");
        }
    }
    el_model_free(m);
    tiny_free(&t);
}

/* ------------------------------------------------------------------ LoRA */

/* el_lora_apply against a double reference: y0 + s * B (A x), B passed transposed (b[k * no + o]).
 * Tolerance: the float dots of n_in and rank terms and the final multiply-add each lose at most their
 * length times 2^-24 of the sum of the absolute terms:
 * (n_in + rank + 2) * 2^-24 * (|y0| + |s| * sum_k |b_ok| sum_c |a_kc x_c|). Rows with
 * scale 0 keep y0's bits; 1, 2 and 3 threads and each row alone give the same bits. */
static void test_lora(rng_t *r) {
    static const size_t shapes[][4] = {/* n rows, n_in, rank, n_out */
                                       {1, 64, 1, 96}, {5, 576, 64, 1536}, {7, 33, 3, 17}, {16, 128, 16, 200},
                                       {3, 257, 1, 5}, {9, 96, 64, 65}};
    for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
        const size_t n = shapes[si][0], ni = shapes[si][1], rk = shapes[si][2], no = shapes[si][3];
        float *x = xmalloc(n * ni * sizeof(float)), *a = xmalloc(rk * ni * sizeof(float));
        float *b = xmalloc(no * rk * sizeof(float)), *y0 = xmalloc(n * no * sizeof(float));
        float *y = xmalloc(n * no * sizeof(float)), *y1 = xmalloc(n * no * sizeof(float));
        float *t = xmalloc(n * rk * sizeof(float)), *s = xmalloc(n * sizeof(float));
        rng_floats(r, x, n * ni, 1.0f), rng_floats(r, a, rk * ni, 0.1f), rng_floats(r, b, no * rk, 0.1f);
        rng_floats(r, y0, n * no, 1.0f);
        for (size_t v = 0; v < n; v++) s[v] = v % 3 == 1 ? 0.0f : rng_unit(r) * 2.0f;
        int bad = 0, moved = 0, zero_kept = 1;
        for (int nt = 1; nt <= 3; nt++) {
            memcpy(y, y0, n * no * sizeof(float));
            el_lora_apply(pool_of(nt), x, n, ni, EL_TYPE_F32, a, EL_TYPE_F32, b, rk, no, s, t, y, no);
            if (nt == 1) {
                memcpy(y1, y, n * no * sizeof(float));
                for (size_t v = 0; v < n; v++)
                    for (size_t o = 0; o < no; o++) {
                        double acc = 0, mag = 0;
                        for (size_t k = 0; k < rk; k++) {
                            double tk = 0, tm = 0;
                            for (size_t c = 0; c < ni; c++) {
                                tk += (double)a[k * ni + c] * x[v * ni + c];
                                tm += fabs((double)a[k * ni + c] * x[v * ni + c]);
                            }
                            acc += tk * b[k * no + o];
                            mag += tm * fabs((double)b[k * no + o]);
                        }
                        const double ref = (double)y0[v * no + o] + (double)s[v] * acc;
                        const double tol = (double)(ni + rk + 2) * 0x1p-24 * (fabs((double)y0[v * no + o]) +
                                                                              fabs((double)s[v]) * mag);
                        if (fabs((double)y[v * no + o] - ref) > tol) bad++;
                        if (s[v] == 0.0f && memcmp(&y[v * no + o], &y0[v * no + o], sizeof(float))) zero_kept = 0;
                        moved += s[v] != 0.0f && y[v * no + o] != y0[v * no + o];
                    }
            } else {
                check(!memcmp(y, y1, n * no * sizeof(float)), "lora %zux%zu r%zu: %d threads differ from 1", ni, no,
                      rk, nt);
            }
        }
        check(!bad, "lora n=%zu %zux%zu rank %zu: %d outputs off the double reference", n, ni, no, rk, bad);
        check(zero_kept, "lora rank %zu: a row with scale 0 changed", rk);
        check(moved > 0, "lora rank %zu: no output moved", rk);
        for (size_t v = 0; v < n; v++) { /* each row alone: the bits it has in the batch */
            memcpy(y, y0 + v * no, no * sizeof(float));
            el_lora_apply(pool_of(2), x + v * ni, 1, ni, EL_TYPE_F32, a, EL_TYPE_F32, b, rk, no, s + v, t, y, no);
            check(!memcmp(y, y1 + v * no, no * sizeof(float)), "lora rank %zu: row %zu alone differs", rk, v);
        }
        /* F16 storage: A and B rounded to halves, kept as halves, against the same values widened to F32
         * (A, B or both as halves, 1-3 threads, the batch and each row alone): the same bits */
        el_half *ah = xmalloc(rk * ni * sizeof(el_half)), *bh = xmalloc(no * rk * sizeof(el_half));
        for (size_t i = 0; i < rk * ni; i++) ah[i] = el_fp32_to_fp16(a[i]), a[i] = el_fp16_to_fp32(ah[i]);
        for (size_t i = 0; i < no * rk; i++) bh[i] = el_fp32_to_fp16(b[i]), b[i] = el_fp16_to_fp32(bh[i]);
        memcpy(y1, y0, n * no * sizeof(float));
        el_lora_apply(pool_of(1), x, n, ni, EL_TYPE_F32, a, EL_TYPE_F32, b, rk, no, s, t, y1, no);
        int f16_same = 1;
        for (int mix = 1; mix <= 3; mix++) {
            const int at = mix & 1 ? EL_TYPE_F16 : EL_TYPE_F32, bt = mix & 2 ? EL_TYPE_F16 : EL_TYPE_F32;
            const void *pa = mix & 1 ? (const void *)ah : a, *pb = mix & 2 ? (const void *)bh : b;
            for (int nt = 1; nt <= 3; nt++) {
                memcpy(y, y0, n * no * sizeof(float));
                el_lora_apply(pool_of(nt), x, n, ni, at, pa, bt, pb, rk, no, s, t, y, no);
                f16_same &= !memcmp(y, y1, n * no * sizeof(float));
            }
            for (size_t v = 0; v < n; v++) {
                memcpy(y, y0 + v * no, no * sizeof(float));
                el_lora_apply(pool_of(2), x + v * ni, 1, ni, at, pa, bt, pb, rk, no, s + v, t, y, no);
                f16_same &= !memcmp(y, y1 + v * no, no * sizeof(float));
            }
        }
        check(f16_same, "lora n=%zu %zux%zu rank %zu: F16 storage differs from its values as F32", n, ni, no, rk);
        free(ah), free(bh);
        free(x), free(a), free(b), free(y0), free(y), free(y1), free(t), free(s);
    }

    /* on a model: every refusal of el_model_lora_attach / _scale; scale 0 and B = 0 give the base
     * logits' bits; a sequence with the adapter beside one without equals their runs alone */
    tiny_model tm;
    tiny_make(r, &tm);
    el_model *m = NULL;
    check(el_model_create_seqs(&tm.d, pool_of(2), TINY_CTX, TINY_BATCH, EL_TYPE_F16, 2, &m) == EL_OK, "lora model");
    if (!m) return;
    const int32_t rk = 4;
    float *a = xmalloc(rk * 128 * sizeof(float)), *b = xmalloc(128 * rk * sizeof(float));
    float *bz = calloc(128 * rk, sizeof(float));
    rng_floats(r, a, rk * 128, 0.3f), rng_floats(r, b, 128 * rk, 0.3f);
    check(el_model_lora_attach(m, -1, 0, EL_LORA_WQ, a, b, rk, 64, 64, 1.0f) == EL_EINVAL, "lora: adapter -1");
    check(el_model_lora_attach(m, EL_MAX_LORA, 0, EL_LORA_WQ, a, b, rk, 64, 64, 1.0f) == EL_EINVAL, "lora: adapter max");
    check(el_model_lora_attach(m, 0, 2, EL_LORA_WQ, a, b, rk, 64, 64, 1.0f) == EL_EINVAL, "lora: layer 2");
    check(el_model_lora_attach(m, 0, -1, EL_LORA_WQ, a, b, rk, 64, 64, 1.0f) == EL_EINVAL, "lora: layer -1");
    check(el_model_lora_attach(m, 0, 0, 8, a, b, rk, 64, 64, 1.0f) == EL_EINVAL, "lora: target 8");
    check(el_model_lora_attach(m, 0, 0, EL_LORA_WK, a, b, rk, 64, 64, 1.0f) == EL_EINVAL, "lora: wk has 32 rows");
    check(el_model_lora_attach(m, 0, 0, EL_LORA_W_DOWN, a, b, rk, 64, 64, 1.0f) == EL_EINVAL, "lora: down has 128 cols");
    check(el_model_lora_attach(m, 0, 0, EL_LORA_WQ, NULL, b, rk, 64, 64, 1.0f) == EL_EINVAL, "lora: NULL a");
    check(el_model_lora_attach(m, 0, 0, EL_LORA_WQ, a, b, rk, 64, 64, INFINITY) == EL_EINVAL, "lora: factor inf");
    check(el_model_lora_attach(m, 0, 0, EL_LORA_WQ, a, b, 0, 64, 64, 1.0f) == EL_EINVAL, "lora: rank 0");
    check(el_model_lora_attach(m, 0, 0, EL_LORA_WQ, a, b, EL_MAX_LORA_RANK + 1, 64, 64, 1.0f) == EL_EINVAL, "lora: rank");
    check(el_model_lora_attach(m, 0, 0, EL_LORA_OUTPUT, a, b, rk, 64, 64, 1.0f) == EL_EINVAL, "lora: output rows");
    check(el_model_lora_attach_typed(m, 0, 0, EL_LORA_WQ, EL_TYPE_BF16, a, EL_TYPE_F32, b, rk, 64, 64, 1.0f) ==
              EL_EINVAL, "lora: BF16 A");
    check(el_model_lora_attach_typed(m, 0, 0, EL_LORA_WQ, EL_TYPE_F32, a, EL_TYPE_Q8_0, b, rk, 64, 64, 1.0f) ==
              EL_EINVAL, "lora: Q8_0 B");
    check(el_model_lora_attach_typed(m, 0, 0, EL_LORA_WQ, -1, a, EL_TYPE_F32, b, rk, 64, 64, 1.0f) == EL_EINVAL,
          "lora: type -1");
    check(el_model_lora_scale(m, 0, 2, 1.0f) == EL_EINVAL, "lora: scale of seq 2");
    check(el_model_lora_scale(m, 0, 0, NAN) == EL_EINVAL, "lora: NaN scale");
    check(el_model_lora_scale(m, EL_MAX_LORA, 0, 1.0f) == EL_EINVAL, "lora: scale of adapter max");
    const size_t sc0 = el_model_scratch_bytes(m);
    int32_t tok[6];
    for (int i = 0; i < 6; i++) tok[i] = (int32_t)rng_below(r, TINY_VOCAB);
    float base[2][TINY_VOCAB], got[2][TINY_VOCAB];
    /* base logits of sequences 0 and 1 (tokens 0..5), then cleared */
    el_batch_entry e[12];
    for (int s2 = 0; s2 < 2; s2++)
        for (int i = 0; i < 6; i++) e[s2 * 6 + i] = (el_batch_entry){s2, tok[i], i, i == 5};
    check(el_model_decode(m, e, 6, base[0]) == EL_OK && el_model_decode(m, e + 6, 6, base[1]) == EL_OK, "lora base");
    int st = EL_OK;
    for (int il = 0; il < 2; il++) {
        static const int tg[7] = {EL_LORA_WQ, EL_LORA_WK, EL_LORA_WV, EL_LORA_WO, EL_LORA_W_GATE, EL_LORA_W_UP,
                                  EL_LORA_W_DOWN};
        static const int64_t ins[7] = {64, 64, 64, 64, 64, 64, 128}, outs[7] = {64, 32, 32, 64, 128, 128, 64};
        for (int k = 0; k < 7 && st == EL_OK; k++) {
            st = el_model_lora_attach(m, 0, il, tg[k], a, b, rk, ins[k], outs[k], 0.5f);
            if (st == EL_OK) st = el_model_lora_attach(m, 1, il, tg[k], a, bz, rk, ins[k], outs[k], 2.0f);
        }
    }
    if (st == EL_OK) st = el_model_lora_attach(m, 0, 0, EL_LORA_OUTPUT, a, b, rk, 64, TINY_VOCAB, 0.5f);
    check(st == EL_OK, "lora attach -> %d", st);
    check(el_model_lora_attach(m, 0, 0, EL_LORA_WQ, a, b, rk, 64, 64, 1.0f) == EL_EINVAL, "lora: attached twice");
    check(el_model_scratch_bytes(m) == sc0 + el_model_lora_bytes(TINY_BATCH, rk), "lora scratch counted");
    /* every scale 0 (attached, not enabled), then adapter 1 (B = 0) at scale 3: the base bits */
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1) check(el_model_lora_scale(m, 1, -1, 3.0f) == EL_OK, "lora scale");
        check(el_model_seq_clear(m, 0) == EL_OK && el_model_seq_clear(m, 1) == EL_OK, "lora clear");
        check(el_model_decode(m, e, 6, got[0]) == EL_OK && !memcmp(got[0], base[0], sizeof got[0]),
              "lora pass %d: not the base logits", pass);
    }
    /* adapter 0 on sequence 0 only: solo, then both sequences in one batch */
    check(el_model_lora_scale(m, 0, 0, 0.5f) == EL_OK, "lora scale seq 0");
    float solo[TINY_VOCAB];
    check(el_model_seq_clear(m, 0) == EL_OK && el_model_decode(m, e, 6, solo) == EL_OK, "lora solo");
    check(memcmp(solo, base[0], sizeof solo) != 0, "lora: the adapter changed nothing");
    check(el_model_seq_clear(m, 0) == EL_OK && el_model_seq_clear(m, 1) == EL_OK, "lora clear");
    /* interleaved: 4 + 4 entries, then the last 2 + 2 (logits of the last of each) */
    el_batch_entry mix8[8];
    for (int i = 0; i < 4; i++) mix8[2 * i] = e[6 + i], mix8[2 * i + 1] = e[i], mix8[2 * i].logits = mix8[2 * i + 1].logits = 0;
    float two[2][TINY_VOCAB];
    check(el_model_decode(m, mix8, 8, NULL) == EL_OK, "lora mixed 1");
    el_batch_entry tail[4] = {e[10], e[4], e[11], e[5]};
    check(el_model_decode(m, tail, 4, two[0]) == EL_OK, "lora mixed 2");
    check(!memcmp(two[0], base[1], sizeof solo), "lora: sequence 1 (no adapter) in a mixed batch differs");
    check(!memcmp(two[1], solo, sizeof solo), "lora: sequence 0 (adapter) in a mixed batch differs");
    check(el_model_lora_clear(m) == EL_OK && el_model_scratch_bytes(m) == sc0, "lora clear frees its scratch");
    el_model_free(m);
    tiny_free(&tm);
    free(a), free(b), free(bz);
}

int main(int argc, char **argv) {
    uint64_t seed = 20240607;
    const char *emit = NULL, *golden = NULL, *only = NULL;
    int golden_only = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--seed") && i + 1 < argc) seed = strtoull(argv[++i], NULL, 10);
        else if (!strcmp(argv[i], "-v")) g_verbose = 1;
        else if (!strcmp(argv[i], "--emit-golden") && i + 1 < argc) emit = argv[++i];
        else if (!strcmp(argv[i], "--check-golden") && i + 1 < argc) golden = argv[++i];
        else if (!strcmp(argv[i], "--golden-only")) golden_only = 1;
        else if (!strcmp(argv[i], "--isa") && i + 1 < argc) only = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--seed N] [-v] [--isa NAME] [--check-golden FILE [--golden-only]] | --emit-golden FILE\n", argv[0]);
            return 2;
        }
    }
    /* the automatic choice, before anything overrides it: what the scripts check per CPU */
    g_auto_isa = el_isa_name();
    static const char *all[] = {"scalar", "avx2", "avx512", "neon", "neon-dotprod"};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (el_isa_available(all[i]) && (!only || !strcmp(only, all[i]) || !strcmp(all[i], "scalar"))) g_isas[g_n_isas++] = all[i];
    printf("edgellama run_tests: isa=%s features=[%s] testing:", g_auto_isa, el_cpu_features());
    for (int i = 0; i < g_n_isas; i++) printf(" %s", g_isas[i]);
    printf(" seed=%llu\n", (unsigned long long)seed);
    check(el_isa_set("no-such-isa") == EL_EUNSUPPORTED, "el_isa_set accepts an unknown ISA");
    int rc = 0;
    if (emit) {
        rc = golden_emit(emit, seed);
    } else {
        rng_t r = {seed};
        if (!golden_only) {
            struct { const char *name; void (*fn)(rng_t *); } suites[] = {
                {"quantize_act", test_quantize_act}, {"vec_dot", test_vec_dot},   {"float kernels", test_float_kernels},
                {"dequant/quant", test_dequant_quant}, {"matmul", test_matmul},   {"ops", test_ops},
                {"attention", test_attention}, {"vec_dot_nv", test_vec_dot_nv}, {"batch == single", test_matmul_batch},
                {"pool", test_pool}, {"llama.cpp order", test_llamacpp_order}, {"model/threads", test_threads},
                {"size overflow", test_size_overflow}, {"sequences", test_sequences}, {"grammar", test_grammar}, {"lora", test_lora},
            };
            for (size_t i = 0; i < sizeof suites / sizeof suites[0]; i++) {
                const int f0 = g_fail, p0 = g_pass;
                const double t0 = now_s();
                suites[i].fn(&r);
                printf("%-14s %5d passed, %d failed (%.2f s)\n", suites[i].name, g_pass - p0, g_fail - f0, now_s() - t0);
            }
        }
        if (golden) golden_check(golden);
    }
    el_pool_free(g_pool);
    if (rc) return rc;
    printf("%d passed, %d failed\n", g_pass, g_fail);
    return g_fail ? 1 : 0;
}

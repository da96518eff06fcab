/* dispatch.c - CPU feature detection (cpuid / getauxval) and the choice of kernels.
 * EDGELLAMA_ISA=scalar|avx2|avx512|neon|neon-dotprod overrides the automatic choice.
 * Each ISA's table is filled once, aside, and never written again; the active one is a pointer
 * swapped atomically, so a thread reading the table while another calls el_isa_set sees either the
 * old table or the new one, never a half-filled one. */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "dispatch.h"
#include "llamacpp_exact.h"
#include "ops.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define EL_X86 1
#endif
#if defined(__aarch64__)
#include <sys/auxv.h>
#ifndef HWCAP_ASIMDDP
#define HWCAP_ASIMDDP (1 << 20)
#endif
#ifndef HWCAP_ASIMD
#define HWCAP_ASIMD (1 << 1)
#endif
#endif

/* one table per ISA name, filled on first selection (under g_lock) and read-only from then on */
static const char *const g_isa_names[] = {"scalar", "avx2", "avx512", "neon", "neon-dotprod"};
#define N_ISAS (sizeof g_isa_names / sizeof g_isa_names[0])
static el_kernels g_tables[N_ISAS];
static int g_filled[N_ISAS];
static _Atomic(const el_kernels *) g_active;
static pthread_once_t g_once = PTHREAD_ONCE_INIT;
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static char g_features[256];

typedef struct { int avx2, fma, f16c, avx512, neon, dotprod; } cpu_caps;

static cpu_caps detect(void) {
    cpu_caps c = {0, 0, 0, 0, 0, 0};
#ifdef EL_X86
    unsigned a, b, cx, d;
    if (__get_cpuid(1, &a, &b, &cx, &d)) {
        const int osxsave = (cx >> 27) & 1;
        int ymm_ok = 0, zmm_ok = 0;
        if (osxsave) {
            unsigned lo, hi;
            __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
            ymm_ok = (lo & 6u) == 6u;       /* OS saves xmm and ymm state */
            zmm_ok = (lo & 0xe6u) == 0xe6u; /* ... and opmask, zmm0-15 upper halves, zmm16-31 */
        }
        c.fma = ymm_ok && ((cx >> 12) & 1);
        c.f16c = ymm_ok && ((cx >> 29) & 1);
        if (ymm_ok && __get_cpuid_count(7, 0, &a, &b, &cx, &d)) {
            c.avx2 = (b >> 5) & 1;
            /* avx512f (b16), avx512bw (b30), avx512vl (b31), avx512_vnni (ecx bit 11) */
            c.avx512 = zmm_ok && ((b >> 16) & 1) && ((b >> 30) & 1) && ((b >> 31) & 1) && ((cx >> 11) & 1);
        }
    }
#endif
#if defined(__aarch64__)
    unsigned long hw = getauxval(AT_HWCAP);
    c.neon = (hw & HWCAP_ASIMD) != 0;
    c.dotprod = (hw & HWCAP_ASIMDDP) != 0;
#endif
    return c;
}

static int isa_ok(const cpu_caps *c, const char *name) {
    if (strcmp(name, "scalar") == 0) return 1;
#ifdef EL_X86
    if (strcmp(name, "avx2") == 0) return c->avx2 && c->fma && c->f16c;
    if (strcmp(name, "avx512") == 0) return c->avx2 && c->fma && c->f16c && c->avx512;
#endif
#if defined(__aarch64__)
    if (strcmp(name, "neon") == 0) return c->neon;
    if (strcmp(name, "neon-dotprod") == 0) return c->neon && c->dotprod;
#endif
    (void)c;
    return 0;
}

static void fill(el_kernels *k, const char *name) {
    memset(k, 0, sizeof *k);
    el_kernels_fill_scalar(k);
    (void)name; /* only scalar exists on other architectures (armhf) */
#ifdef EL_X86
    if (strcmp(name, "avx2") == 0 || strcmp(name, "avx512") == 0) {
        el_kernels_fill_avx2(k); /* the types avx512 does not accelerate keep their AVX2 entries */
        el_kernels_fill_avx2_attention(k);
    }
    if (strcmp(name, "avx512") == 0) {
        el_kernels_fill_avx512(k);
        el_kernels_fill_avx512_panel(k);
    }
#endif
#if defined(__aarch64__)
    if (strcmp(name, "neon") == 0 || strcmp(name, "neon-dotprod") == 0) {
        el_kernels_fill_neon(k, strcmp(name, "neon-dotprod") == 0);
        el_kernels_fill_neon_batch(k, strcmp(name, "neon-dotprod") == 0);
        el_kernels_fill_neon_attention(k);
        el_kernels_fill_neon_rows(k, strcmp(name, "neon-dotprod") == 0);
    }
#endif
    k->llx = el_llx_kernels_for(name);
}

/* the filled table of an available ISA: its first selection fills it, aside from the active one */
static const el_kernels *table_of(const char *name) {
    size_t i = 0;
    while (i < N_ISAS && strcmp(g_isa_names[i], name) != 0) i++;
    if (i == N_ISAS) return NULL;
    pthread_mutex_lock(&g_lock);
    if (!g_filled[i]) {
        fill(&g_tables[i], name);
        g_filled[i] = 1;
    }
    pthread_mutex_unlock(&g_lock);
    return &g_tables[i];
}

static const char *best_isa(const cpu_caps *c) {
    static const char *order[] = {"neon-dotprod", "neon", "avx512", "avx2", "scalar"};
    for (size_t i = 0; i < sizeof order / sizeof order[0]; i++)
        if (isa_ok(c, order[i])) return order[i];
    return "scalar";
}

static void init_once(void) {
    cpu_caps c = detect();
    snprintf(g_features, sizeof g_features, "%s%s%s%s%s%s", c.avx2 ? "avx2 " : "", c.fma ? "fma " : "",
             c.f16c ? "f16c " : "", c.avx512 ? "avx512vnni " : "", c.neon ? "neon " : "", c.dotprod ? "dotprod " : "");
    size_t len = strlen(g_features);
    if (len && g_features[len - 1] == ' ') g_features[len - 1] = 0;
    const char *want = getenv("EDGELLAMA_ISA");
    const char *name = best_isa(&c);
    if (want && *want && isa_ok(&c, want)) name = want;
    else if (want && *want && strcmp(want, "auto") != 0)
        fprintf(stderr, "edgellama: EDGELLAMA_ISA=%s is not available on this CPU/build; using %s\n", want, name);
    atomic_store_explicit(&g_active, table_of(name), memory_order_release);
}

const el_kernels *el_kern(void) {
    pthread_once(&g_once, init_once);
    return atomic_load_explicit(&g_active, memory_order_acquire);
}

const char *el_isa_name(void) { return el_kern()->name; }

const char *el_cpu_features(void) {
    el_kern();
    return g_features;
}

int el_isa_available(const char *name) {
    if (!name) return 0;
    cpu_caps c = detect();
    return isa_ok(&c, name);
}

int el_isa_set(const char *name) {
    el_kern();
    cpu_caps c = detect();
    if (!name) name = best_isa(&c);
    if (!isa_ok(&c, name)) return EL_EUNSUPPORTED;
    /* a kernel lookup meanwhile gets the old table or the new one, each complete; a computation
     * that spans the switch may mix ISAs (results within each ISA's tolerance, not bit-identical),
     * so callers still switch between computations */
    atomic_store_explicit(&g_active, table_of(name), memory_order_release);
    return EL_OK;
}

int el_kernels_for_isa(const char *name, el_kernels *out) {
    cpu_caps c = detect();
    if (!name || !isa_ok(&c, name)) return EL_EUNSUPPORTED;
    fill(out, name);
    return EL_OK;
}

/* ---- scalar float helpers ---- */
float el_dot_f32_scalar(size_t n, const float *a, const float *b) {
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

float el_dot_f32_f16_scalar(size_t n, const float *a, const el_half *b) {
    float s = 0.0f;
    for (size_t i = 0; i < n; i++) s += a[i] * el_fp16_to_fp32(b[i]);
    return s;
}

void el_axpy_f16_scalar(size_t n, float alpha, const el_half *x, float *y) {
    for (size_t i = 0; i < n; i++) y[i] += alpha * el_fp16_to_fp32(x[i]);
}

void el_axpy_f32_scalar(size_t n, float alpha, const float *x, float *y) {
    for (size_t i = 0; i < n; i++) y[i] += alpha * x[i];
}

void el_vecmat_f32_scalar(size_t rank, size_t m, const float *t, const float *b, size_t ld, float *d) {
    for (size_t o = 0; o < m; o++) {
        float s = 0.0f;
        for (size_t k = 0; k < rank; k++) s = fmaf(t[k], b[k * ld + o], s);
        d[o] = s;
    }
}

void el_vecmat_f16_scalar(size_t rank, size_t m, const float *t, const el_half *b, size_t ld, float *d) {
    for (size_t o = 0; o < m; o++) {
        float s = 0.0f;
        for (size_t k = 0; k < rank; k++) s = fmaf(t[k], el_fp16_to_fp32(b[k * ld + o]), s);
        d[o] = s;
    }
}

void el_round_f16_scalar(size_t n, const float *x, float *y) {
    for (size_t i = 0; i < n; i++) y[i] = el_fp16_to_fp32(el_fp32_to_fp16(x[i]));
}

size_t el_panel_group_bytes(int act_type, size_t cols) {
    if (act_type == EL_TYPE_Q8_0) {
        const size_t pair = EL_PANEL_PAIR_BYTES > EL_PANEL512_PAIR_BYTES ? EL_PANEL_PAIR_BYTES : EL_PANEL512_PAIR_BYTES;
        return el_size_mul((cols / 32 + 1) / 2, pair);
    }
    if (act_type == EL_TYPE_Q8_K) return el_size_mul(cols / QK_K, EL_PANEL512K_SB_BYTES);
    return 0;
}

size_t el_panel_group_rows(int act_type) { return act_type == EL_TYPE_Q8_K ? EL_PANEL_K_ROWS : EL_NV_MAX; }

size_t el_panel_bytes(int act_type, size_t cols, size_t n_vec) {
#if defined(__x86_64__)
    const size_t group = el_panel_group_bytes(act_type, cols), rows = el_panel_group_rows(act_type);
    if (n_vec < 2 || group == 0) return 0;
    const size_t groups = n_vec / rows + (n_vec % rows != 0);
    return el_size_add(EL_PANEL_HEADER, el_size_mul(groups, group));
#else
    (void)act_type, (void)cols, (void)n_vec;
    return 0;
#endif
}

void el_to_f16_scalar(size_t n, const float *x, el_half *y) {
    for (size_t i = 0; i < n; i++) y[i] = el_fp32_to_fp16(x[i]);
}

void el_attn_qk_f16_scalar(size_t hd, size_t g, const float *q, const void *k, size_t stride, const int32_t *idx,
                           size_t n, float *s) {
    for (size_t j = 0; j < n; j++) {
        const el_half *kr = (const el_half *)((const char *)k + (size_t)idx[j] * stride);
        for (size_t h = 0; h < g; h++) s[j * g + h] = el_dot_f32_f16_scalar(hd, q + h * hd, kr);
    }
}

void el_attn_pv_f16_scalar(size_t hd, size_t g, const float *p, const void *v, size_t stride, const int32_t *idx,
                           size_t n, float *o) {
    for (size_t j = 0; j < n; j++) {
        const el_half *vr = (const el_half *)((const char *)v + (size_t)idx[j] * stride);
        for (size_t h = 0; h < g; h++) el_axpy_f16_scalar(hd, p[j * g + h], vr, o + h * hd);
    }
}

void el_kernels_fill_scalar(el_kernels *k) {
    k->name = "scalar";
    for (int t = 0; t < EL_TYPE_COUNT; t++) {
        const el_type_traits *tr = el_get_type_traits(t);
        k->vec_dot[t] = tr ? tr->vec_dot : NULL;
        k->quantize_act[t] = tr ? tr->from_float : NULL;
    }
    k->dot_f32 = el_dot_f32_scalar;
    k->dot_f32_f16 = el_dot_f32_f16_scalar;
    k->axpy_f16 = el_axpy_f16_scalar;
    k->axpy_f32 = el_axpy_f32_scalar;
    k->attn_qk_f16 = el_attn_qk_f16_scalar;
    k->attn_pv_f16 = el_attn_pv_f16_scalar;
    k->round_f16 = el_round_f16_scalar;
    k->to_f16 = el_to_f16_scalar;
    k->gelu_lut = el_gelu_lut;
    k->vecmat_f32 = el_vecmat_f32_scalar;
    k->vecmat_f16 = el_vecmat_f16_scalar;
}

/* Builds without an ISA's file still link: the filler is a no-op there. */
#if !defined(EL_X86)
void el_kernels_fill_avx2(el_kernels *k) { (void)k; }
void el_kernels_fill_avx512(el_kernels *k) { (void)k; }
void el_kernels_fill_avx2_attention(el_kernels *k) { (void)k; }
#endif
#if !defined(__aarch64__)
void el_kernels_fill_neon(el_kernels *k, int dotprod) { (void)k; (void)dotprod; }
void el_kernels_fill_neon_attention(el_kernels *k) { (void)k; }
void el_kernels_fill_neon_batch(el_kernels *k, int dotprod) { (void)k; (void)dotprod; }
void el_kernels_fill_neon_rows(el_kernels *k, int dotprod) { (void)k; (void)dotprod; }
#endif

/* test_api.c - the test API (edgellama_test.h): one kernel of a named ISA's table, called with checked
 * buffer sizes, so tests compare each ISA's entries with the scalar ones without touching the active
 * table. Not used by the library itself. */
#include <stdlib.h>
#include <string.h>

#include "dispatch.h"
#include "edgellama_test.h"
#include "llamacpp_exact.h"

static_assert(EL_TEST_NV_MAX == EL_NV_MAX, "test API batch shape");
static_assert(EL_TEST_TILE_ROWS == EL_TILE_ROWS, "test API tile shape");
static_assert(EL_TEST_MV_ROWS == EL_MV_ROWS, "test API matvec shape");

static int table(const char *isa, el_kernels *k) { return el_kernels_for_isa(isa, k); }

/* the entry's function pointer, or NULL; *bad = 1 for an unknown entry or type */
static const void *entry(const el_kernels *k, int e, int type, int *bad) {
    const int per_type = e >= EL_TEST_VEC_DOT && e <= EL_TEST_QUANTIZE_ACT;
    *bad = 0;
    if (per_type && (type < 0 || type >= EL_TYPE_COUNT)) {
        *bad = 1;
        return NULL;
    }
    switch (e) {
    case EL_TEST_VEC_DOT: return (const void *)k->vec_dot[type];
    case EL_TEST_VEC_DOT_NV: return (const void *)k->vec_dot_nv[type];
    case EL_TEST_VEC_DOT_TILE: return (const void *)k->vec_dot_tile[type];
    case EL_TEST_VEC_DOT_ROWS: return (const void *)k->vec_dot_rows[type];
    case EL_TEST_QUANTIZE_ACT: return (const void *)k->quantize_act[type];
    case EL_TEST_DOT_F32: return (const void *)k->dot_f32;
    case EL_TEST_DOT_F32_F16: return (const void *)k->dot_f32_f16;
    case EL_TEST_AXPY_F16: return (const void *)k->axpy_f16;
    case EL_TEST_AXPY_F32: return (const void *)k->axpy_f32;
    case EL_TEST_ATTN_QK_F16: return (const void *)k->attn_qk_f16;
    case EL_TEST_ATTN_PV_F16: return (const void *)k->attn_pv_f16;
    case EL_TEST_ROUND_F16: return (const void *)k->round_f16;
    default: *bad = 1; return NULL;
    }
}

int el_test_kernel_present(const char *isa, int e, int type) {
    el_kernels k, scalar;
    if (table(isa, &k) != EL_OK) return EL_EUNSUPPORTED;
    int bad;
    const void *fn = entry(&k, e, type, &bad);
    if (bad) return EL_EINVAL;
    if (!fn) return 0;
    el_kernels_for_isa("scalar", &scalar);
    return fn == entry(&scalar, e, type, &bad) ? 1 : 2;
}

int el_test_table_is_active(const char *isa) {
    el_kernels k;
    if (table(isa, &k) != EL_OK) return EL_EUNSUPPORTED;
    /* both tables are zeroed, then filled by the same code: equal bytes = equal entries */
    return memcmp(&k, el_kern(), sizeof k) == 0;
}

/* bytes of `rows` rows of row_bytes at a stride (the last row need not be followed by padding) */
static int span_fits(size_t rows, size_t stride, size_t row_bytes, size_t have) {
    if (row_bytes == 0 || rows == 0) return 0;
    if (rows - 1 > 0 && stride > (SIZE_MAX - row_bytes) / (rows - 1)) return 0;
    return (rows - 1) * stride + row_bytes <= have;
}

/* the sizes of a weight type's rows: EL_OK, or why not */
static int dot_rows(int wtype, size_t n, size_t *w_row, size_t *a_row) {
    const int at = el_vec_dot_type(wtype);
    if (at < 0) return EL_EUNSUPPORTED;
    *w_row = el_row_bytes(wtype, n);
    *a_row = el_row_bytes(at, n);
    return *w_row && *a_row ? EL_OK : EL_EINVAL;
}

int el_test_vec_dot(const char *isa, int wtype, size_t n, const void *w, size_t w_bytes, const void *a,
                    size_t a_bytes, float *out) {
    el_kernels k;
    size_t wr, ar;
    int st = table(isa, &k);
    if (st == EL_OK) st = dot_rows(wtype, n, &wr, &ar);
    if (st != EL_OK) return st;
    if (!w || !a || !out || w_bytes != wr || a_bytes != ar) return EL_EINVAL;
    if (!k.vec_dot[wtype]) return EL_EUNSUPPORTED;
    *out = k.vec_dot[wtype](n, w, a);
    return EL_OK;
}

int el_test_vec_dot_nv(const char *isa, int wtype, size_t n, const void *w, size_t w_bytes, const void *a,
                       size_t a_bytes, size_t a_stride, size_t nv, float *out) {
    el_kernels k;
    size_t wr, ar;
    int st = table(isa, &k);
    if (st == EL_OK) st = dot_rows(wtype, n, &wr, &ar);
    if (st != EL_OK) return st;
    if (!w || !a || !out || nv < 1 || nv > EL_NV_MAX || w_bytes != wr || !span_fits(nv, a_stride, ar, a_bytes))
        return EL_EINVAL;
    if (!k.vec_dot_nv[wtype]) return EL_EUNSUPPORTED;
    k.vec_dot_nv[wtype](n, w, a, a_stride, nv, out);
    return EL_OK;
}

int el_test_vec_dot_tile(const char *isa, int wtype, size_t n, const void *w, size_t w_bytes, size_t w_stride,
                         const void *a, size_t a_bytes, size_t a_stride, size_t nv, float *out, size_t ldo) {
    el_kernels k;
    size_t wr, ar;
    int st = table(isa, &k);
    if (st == EL_OK) st = dot_rows(wtype, n, &wr, &ar);
    if (st != EL_OK) return st;
    if (!w || !a || !out || nv < 1 || nv > EL_NV_MAX || nv > ldo || !span_fits(EL_TILE_ROWS, w_stride, wr, w_bytes) ||
        !span_fits(nv, a_stride, ar, a_bytes))
        return EL_EINVAL;
    if (!k.vec_dot_tile[wtype]) return EL_EUNSUPPORTED;
    k.vec_dot_tile[wtype](n, w, w_stride, a, a_stride, nv, out, ldo);
    return EL_OK;
}

int el_test_vec_dot_rows(const char *isa, int wtype, size_t n, const void *w, size_t w_bytes, size_t w_stride,
                         const void *a, size_t a_bytes, float *out) {
    el_kernels k;
    size_t wr, ar;
    int st = table(isa, &k);
    if (st == EL_OK) st = dot_rows(wtype, n, &wr, &ar);
    if (st != EL_OK) return st;
    if (!w || !a || !out || !span_fits(EL_MV_ROWS, w_stride, wr, w_bytes) || a_bytes != ar) return EL_EINVAL;
    if (!k.vec_dot_rows[wtype]) return EL_EUNSUPPORTED;
    k.vec_dot_rows[wtype](n, w, w_stride, a, out);
    return EL_OK;
}

int el_test_quantize_act(const char *isa, int act_type, const float *x, size_t n, void *out, size_t out_bytes) {
    el_kernels k;
    if (table(isa, &k) != EL_OK) return EL_EUNSUPPORTED;
    if (act_type < 0 || act_type >= EL_TYPE_COUNT || !k.quantize_act[act_type]) return EL_EUNSUPPORTED;
    const size_t need = el_row_bytes(act_type, n);
    if (!x || !out || need == 0 || out_bytes != need) return EL_EINVAL;
    k.quantize_act[act_type](x, out, n);
    return EL_OK;
}

int el_test_dot_f32(const char *isa, size_t n, const float *a, const float *b, float *out) {
    el_kernels k;
    if (table(isa, &k) != EL_OK) return EL_EUNSUPPORTED;
    if (!a || !b || !out) return EL_EINVAL;
    *out = k.dot_f32(n, a, b);
    return EL_OK;
}

int el_test_dot_f32_f16(const char *isa, size_t n, const float *a, const uint16_t *b, float *out) {
    el_kernels k;
    if (table(isa, &k) != EL_OK) return EL_EUNSUPPORTED;
    if (!a || !b || !out) return EL_EINVAL;
    *out = k.dot_f32_f16(n, a, (const el_half *)b);
    return EL_OK;
}

int el_test_axpy_f16(const char *isa, size_t n, float alpha, const uint16_t *x, float *y) {
    el_kernels k;
    if (table(isa, &k) != EL_OK) return EL_EUNSUPPORTED;
    if (!x || !y) return EL_EINVAL;
    k.axpy_f16(n, alpha, (const el_half *)x, y);
    return EL_OK;
}

int el_test_axpy_f32(const char *isa, size_t n, float alpha, const float *x, float *y) {
    el_kernels k;
    if (table(isa, &k) != EL_OK) return EL_EUNSUPPORTED;
    if (!x || !y) return EL_EINVAL;
    k.axpy_f32(n, alpha, x, y);
    return EL_OK;
}

/* ---- llama.cpp numerics ---- */

int el_test_llx_matmul(el_pool *pool, int wtype, const void *w, size_t w_bytes, size_t rows, size_t cols,
                       const float *x, size_t n_vec, float *y) {
    if (!el_llx_type_supported(wtype, cols)) return EL_EUNSUPPORTED;
    const size_t row = el_row_bytes(wtype, cols);
    if (!pool || !w || !x || !y || rows == 0 || n_vec == 0 || row == 0 || rows > SIZE_MAX / row ||
        w_bytes != rows * row)
        return EL_EINVAL;
    void *act = malloc(el_llx_act_bytes(wtype, cols, n_vec));
    if (!act) return EL_ENOMEM;
    el_llx_matmul(pool, wtype, w, rows, cols, x, n_vec, y, rows, act);
    free(act);
    return EL_OK;
}

int el_test_llx_attention(el_pool *pool, int build, const float *q, size_t n_q, const int32_t *q_pos, size_t n_head,
                          size_t n_head_kv, size_t head_dim, const void *k, const void *v, const int32_t *kv_pos,
                          size_t n_kv, int32_t window, float scale, size_t n_cells, float *out) {
    if ((build != EL_LLX_AVX2 && build != EL_LLX_AVX512) || !pool || !q || !q_pos || !k || !v || !kv_pos || !out ||
        n_q == 0 || head_dim == 0 || n_head_kv == 0 || n_head % n_head_kv || n_cells == 0 || n_cells % 16)
        return EL_EINVAL;
    for (size_t j = 0; j < n_kv; j++)
        if (kv_pos[j] < -1 || (kv_pos[j] >= 0 && (size_t)kv_pos[j] >= n_cells)) return EL_EINVAL;
    float *scratch = malloc(el_llx_attn_scratch_floats(n_cells, head_dim, el_pool_threads(pool)) * sizeof(float));
    if (!scratch) return EL_ENOMEM;
    const el_attn_args a = {q, n_q, q_pos, n_head, n_head_kv, head_dim, EL_TYPE_F16, k, v, kv_pos, n_kv,
                            window, scale, 0.0f, out, NULL};
    el_llx_attention(pool, (el_llx_build)build, &a, n_cells, scratch);
    free(scratch);
    return EL_OK;
}

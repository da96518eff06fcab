/* edgellama_test.h - the TEST API: single kernels of a named ISA's dispatch table, and the llama.cpp
 * numerics' internals, for edgellama's own tests (tests/test_simd.py, tests/test_llamacpp_numerics.py).
 * NOT a stable API: it follows the internals (csrc/dispatch.h, llamacpp_exact.h) and changes with
 * them. It is exported and in the cffi module like edgellama.h, so the tests reach the internals
 * through declared functions the compiler checks, not through hand-written copies of internal
 * structs. Arguments are checked as in edgellama.h: EL_EINVAL for sizes that do not fit. */
#ifndef EDGELLAMA_TEST_H
#define EDGELLAMA_TEST_H

#include "edgellama.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- one ISA's dispatch table (dispatch.h), whichever ISA is active ----
 * isa: "scalar", "avx2", ...; EL_EUNSUPPORTED when this CPU/build lacks it or its table has no such
 * entry (NULL: the caller then falls back, e.g. matmul loops over vec_dot). */

/* the entries of el_kernels; the per-type ones are indexed by weight type, QUANTIZE_ACT by
 * activation type (Q8_0, Q8_1, Q8_K) */
enum el_test_entry {
    EL_TEST_VEC_DOT = 0,
    EL_TEST_VEC_DOT_NV = 1,
    EL_TEST_VEC_DOT_TILE = 2,
    EL_TEST_VEC_DOT_ROWS = 3,
    EL_TEST_QUANTIZE_ACT = 4,
    EL_TEST_DOT_F32 = 5,
    EL_TEST_DOT_F32_F16 = 6,
    EL_TEST_AXPY_F16 = 7,
    EL_TEST_AXPY_F32 = 8,
    EL_TEST_ATTN_QK_F16 = 9,
    EL_TEST_ATTN_PV_F16 = 10,
    EL_TEST_ROUND_F16 = 11
};
/* the batch shapes of the multi-row entries (EL_NV_MAX, EL_TILE_ROWS, EL_MV_ROWS) */
enum el_test_shape { EL_TEST_NV_MAX = 4, EL_TEST_TILE_ROWS = 2, EL_TEST_MV_ROWS = 4 };

/* What isa's table holds in the entry (for type, where the entry is per type): 0 nothing (NULL),
 * 1 the scalar table's function, 2 a function of its own; EL_EUNSUPPORTED for an ISA not available
 * here, EL_EINVAL for an unknown entry or type. */
EL_API int el_test_kernel_present(const char *isa, int entry, int type);
/* 1 if isa's table is, entry for entry, the one the library computes with now; 0 if not. */
EL_API int el_test_table_is_active(const char *isa);

/* In the dots, a weight row of n values of wtype is el_row_bytes(wtype, n) bytes, an activation row
 * el_row_bytes(el_vec_dot_type(wtype), n); w_bytes / a_bytes are the buffers' sizes, which must hold
 * every row the call reads (rows at w + r * w_stride, a + j * a_stride). */
/* *out = w . a (vec_dot) */
EL_API int el_test_vec_dot(const char *isa, int wtype, size_t n, const void *w, size_t w_bytes, const void *a,
                           size_t a_bytes, float *out);
/* out[j] = w . (a + j * a_stride) for j < nv, 1 <= nv <= EL_TEST_NV_MAX (vec_dot_nv) */
EL_API int el_test_vec_dot_nv(const char *isa, int wtype, size_t n, const void *w, size_t w_bytes, const void *a,
                              size_t a_bytes, size_t a_stride, size_t nv, float *out);
/* out[r * ldo + j] = (w + r * w_stride) . (a + j * a_stride) for r < EL_TEST_TILE_ROWS, j < nv <= ldo
 * (vec_dot_tile); out holds (EL_TEST_TILE_ROWS - 1) * ldo + nv floats */
EL_API int el_test_vec_dot_tile(const char *isa, int wtype, size_t n, const void *w, size_t w_bytes, size_t w_stride,
                                const void *a, size_t a_bytes, size_t a_stride, size_t nv, float *out, size_t ldo);
/* out[r] = (w + r * w_stride) . a for r < EL_TEST_MV_ROWS (vec_dot_rows) */
EL_API int el_test_vec_dot_rows(const char *isa, int wtype, size_t n, const void *w, size_t w_bytes, size_t w_stride,
                                const void *a, size_t a_bytes, float *out);
/* n floats -> one activation row of act_type (quantize_act); out_bytes = el_row_bytes(act_type, n) */
EL_API int el_test_quantize_act(const char *isa, int act_type, const float *x, size_t n, void *out, size_t out_bytes);
/* the float helpers of attention: *out = a . b; *out = a . b (b fp16 bits); y += alpha * x */
EL_API int el_test_dot_f32(const char *isa, size_t n, const float *a, const float *b, float *out);
EL_API int el_test_dot_f32_f16(const char *isa, size_t n, const float *a, const uint16_t *b, float *out);
EL_API int el_test_axpy_f16(const char *isa, size_t n, float alpha, const uint16_t *x, float *y);
EL_API int el_test_axpy_f32(const char *isa, size_t n, float alpha, const float *x, float *y);

/* ---- llama.cpp numerics (llamacpp_exact.h), through the ACTIVE ISA ---- */
/* y (n_vec x rows) = x (n_vec x cols) times W^T (rows x cols of wtype, w_bytes) in llama.cpp's order;
 * EL_EUNSUPPORTED for a type or row length it does not implement. Allocates its activation scratch. */
EL_API int el_test_llx_matmul(el_pool *pool, int wtype, const void *w, size_t w_bytes, size_t rows, size_t cols,
                              const float *x, size_t n_vec, float *y);
/* Attention over an F16 cache as llama.cpp computes it (q not pre-scaled): q n_q x n_head x head_dim at
 * q_pos, k / v n_kv x n_head_kv x head_dim at kv_pos (each -1 or < n_cells, the llama.cpp cells; n_cells
 * a multiple of 16), out n_q x n_head x head_dim. Allocates its scratch. */
/* build: the order of llama.cpp's AVX2 (0) or AVX-512 (1) x86 build (el_llx_build) */
EL_API int el_test_llx_attention(el_pool *pool, int build, const float *q, size_t n_q, const int32_t *q_pos, size_t n_head,
                                 size_t n_head_kv, size_t head_dim, const void *k, const void *v,
                                 const int32_t *kv_pos, size_t n_kv, int32_t window, float scale, size_t n_cells,
                                 float *out);

#ifdef __cplusplus
}
#endif
#endif

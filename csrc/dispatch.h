/* dispatch.h - the CPU-feature dispatch table: the library's one piece of global state.
 * Each ISA file fills in the entries it accelerates; everything else stays the scalar reference. */
#ifndef EL_DISPATCH_H
#define EL_DISPATCH_H

#include "quants.h"

/* Multi-vector dot for batches: out[j] = w . (a + j * a_stride) for j < nv, 1 <= nv <= EL_NV_MAX.
 * The weight row is unpacked once for all nv activation rows. Contract: every out[j] has the very
 * bits vec_dot of the same table gives for that activation row (same per-output operations in the
 * same order), so a batched prompt yields the logits of token-by-token evaluation. NULL = matmul
 * loops over vec_dot. An ISA that replaces a type's vec_dot must replace (or clear) its vec_dot_nv,
 * vec_dot_tile and vec_dot_panel. */
#define EL_NV_MAX 4
typedef void (*el_vec_dot_nv_fn)(size_t n, const void *w, const void *a, size_t a_stride, size_t nv, float *out);
/* Tile for batches: EL_TILE_ROWS weight rows (at w + r * w_stride) x nv activation rows,
 * out[r * ldo + j] = row r . activation j; both the weight unpacking and the activation loads are
 * shared. Same contract: every output has the bits of vec_dot. NULL = use vec_dot_nv. */
#define EL_TILE_ROWS 2
typedef void (*el_vec_dot_tile_fn)(size_t n, const void *w, size_t w_stride, const void *a, size_t a_stride,
                                   size_t nv, float *out, size_t ldo);

/* Matvec: EL_MV_ROWS weight rows (at w + r * w_stride) x one activation row, out[r] = row r . a:
 * the activation loads and its half of the scale products are shared, the rows' chains interleave.
 * Same contract: every out[r] has the bits of vec_dot. NULL = vec_dot row by row. */
#define EL_MV_ROWS 4
typedef void (*el_vec_dot_rows_fn)(size_t n, const void *w, size_t w_stride, const void *a, float *out);

/* Activation panels for batches (x86-64 builds): pack_panel copies the quantized activation rows of a
 * batch (Q8_0 or Q8_K; n_vec rows at a + v * a_stride, cols values each) into groups of
 * el_panel_group_rows rows (Q8_0: EL_NV_MAX; Q8_K: EL_PANEL_K_ROWS, so a K-quant tile unpacks its
 * weights once for twice the activations), in the layout its ISA's vec_dot_panel loads (registers
 * ready to load, the scales as floats), once per batch, sparing every tile call the gathering. Layouts: EL_PANEL_AVX2 (arch/avx2.c, Q8_0 only,
 * EL_PANEL_PAIR_BYTES per group and block pair) and EL_PANEL_AVX512 (arch/avx512_panel.c: Q8_0 with
 * EL_PANEL512_PAIR_BYTES per group and block pair, Q8_K with EL_PANEL512K_SB_BYTES per group and
 * superblock). A batch's activation buffer reserves el_panel_bytes(act_type, cols, n_vec) for it after
 * the rows, whatever ISA is active (0 in builds with no panel kernels; room for the largest layout of
 * the activation type): EL_PANEL_HEADER bytes naming the layout the quantizing table packed (0:
 * none), then the groups, el_panel_group_bytes(act_type, cols) apart. A matmul uses the panel only if
 * its own table's layout was packed, so an el_isa_set between quantizing and multiplying cannot hand
 * a kernel an unpacked panel or another ISA's. vec_dot_panel: count tiles over one group (its first
 * nv rows), each EL_TILE_ROWS = 2 weight rows q rows apart: rows k and k + q (at w + row * w_row) for
 * k < count, into y[j * ldy + row] (the matmul's layout, so no copy per tile), 1 <= nv <= the group's
 * rows; same contract: every output has the bits of vec_dot. */
#define EL_PANEL_AVX2 1u
#define EL_PANEL_AVX512 2u
#define EL_PANEL_PAIR_BYTES (64 + EL_NV_MAX * 64)
#define EL_PANEL512_ACT_BYTES 256
#define EL_PANEL512_PAIR_BYTES (EL_NV_MAX * EL_PANEL512_ACT_BYTES)
#define EL_PANEL_K_ROWS 8
#define EL_PANEL_ROWS_MAX 8 /* the most rows of any layout's group */
#define EL_PANEL512K_ACT_BYTES 640
#define EL_PANEL512K_SB_BYTES (EL_PANEL_K_ROWS * EL_PANEL512K_ACT_BYTES)
#define EL_PANEL_HEADER 64
/* both saturating (checked.h): SIZE_MAX if it does not fit; 0 for an activation type with no panel */
size_t el_panel_group_bytes(int act_type, size_t cols);
size_t el_panel_bytes(int act_type, size_t cols, size_t n_vec);
size_t el_panel_group_rows(int act_type); /* activation rows per group */
typedef void (*el_pack_panel_fn)(const void *a, size_t a_stride, size_t cols, size_t n_vec, void *panel);
typedef void (*el_vec_dot_panel_fn)(size_t n, const void *w, size_t w_row, size_t q, size_t count,
                                    const void *group, size_t nv, float *y, size_t ldy);

/* Attention over an F16 cache for the g query heads of one KV head (q: g x hd floats, f16-exact).
 * Key / value row j is at base + idx[j] * stride bytes, j < n. qk: s[j * g + h] = q_h . k_j.
 * pv: o_h += sum over j of p[j * g + h] * v_j (o: g x hd), j ascending for every output. */
typedef void (*el_attn_qk_fn)(size_t hd, size_t g, const float *q, const void *k, size_t stride,
                              const int32_t *idx, size_t n, float *s);
typedef void (*el_attn_pv_fn)(size_t hd, size_t g, const float *p, const void *v, size_t stride,
                              const int32_t *idx, size_t n, float *o);

typedef struct el_kernels {
    const char *name;
    el_vec_dot_fn vec_dot[EL_TYPE_COUNT];          /* by weight type */
    el_from_float_fn quantize_act[EL_TYPE_COUNT];  /* by activation type: Q8_0, Q8_1, Q8_K */
    float (*dot_f32)(size_t n, const float *a, const float *b);
    float (*dot_f32_f16)(size_t n, const float *a, const el_half *b);
    void (*axpy_f16)(size_t n, float alpha, const el_half *x, float *y); /* y += alpha * x */
    void (*axpy_f32)(size_t n, float alpha, const float *x, float *y);
    el_vec_dot_nv_fn vec_dot_nv[EL_TYPE_COUNT];    /* by weight type; after the fields above so
                                                      tests/test_simd.py's mirror of the prefix holds */
    el_vec_dot_tile_fn vec_dot_tile[EL_TYPE_COUNT];
    el_vec_dot_rows_fn vec_dot_rows[EL_TYPE_COUNT];
    el_attn_qk_fn attn_qk_f16;
    el_attn_pv_fn attn_pv_f16;
    void (*round_f16)(size_t n, const float *x, float *y); /* y = x rounded to f16 (nearest even), exact */
    void (*to_f16)(size_t n, const float *x, el_half *y);  /* the same halves (an F16 cache's rows) */
    /* the llama.cpp numerics' kernels of this ISA (llamacpp_exact.h), switched with the ISA */
    const struct el_llx_kernels *llx;
    /* d[o] = sum over k < rank of t[k] * b[k * ld + o], for o < m: per output one chain of fused
     * multiply-adds from 0, k ascending, on every ISA (the same bits everywhere; F16 b widened
     * exactly, so it gives the bits of its values as F32). A LoRA term's B t, from B^T (lora.c). */
    void (*vecmat_f32)(size_t rank, size_t m, const float *t, const float *b, size_t ld, float *d);
    void (*vecmat_f16)(size_t rank, size_t m, const float *t, const el_half *b, size_t ld, float *d);
    /* GELU through the model's fp16 table (ops.h, el_gelu_lut): the same bits on every ISA */
    void (*gelu_lut)(float *x, size_t n, const el_half *table);
    el_pack_panel_fn pack_panel[EL_TYPE_COUNT];      /* by activation type */
    el_vec_dot_panel_fn vec_dot_panel[EL_TYPE_COUNT]; /* by weight type; an ISA that replaces the type's
                                                        vec_dot must replace or clear it */
    unsigned panel_layout; /* EL_PANEL_*: what this table's pack_panel writes and vec_dot_panel reads */
} el_kernels;

/* The active table (initialised on first use, best ISA unless EDGELLAMA_ISA says otherwise). */
const el_kernels *el_kern(void);
/* Fills out with ISA name's table without making it active (the test API compares ISAs' entries
 * through it); EL_EUNSUPPORTED if this CPU/build lacks the ISA. */
int el_kernels_for_isa(const char *name, el_kernels *out);

/* Fillers: scalar sets every entry; the others override what they implement. */
void el_kernels_fill_scalar(el_kernels *k);
void el_kernels_fill_avx2(el_kernels *k);               /* x86-64 builds only */
void el_kernels_fill_avx512(el_kernels *k);             /* x86-64 only; on top of the avx2 table */
void el_kernels_fill_avx512_panel(el_kernels *k);       /* arch/avx512_panel.c: its panel and kernels */
void el_kernels_fill_neon(el_kernels *k, int dotprod);  /* aarch64 builds only */
void el_kernels_fill_avx2_attention(el_kernels *k);     /* arch/avx2_attention.c */
void el_kernels_fill_neon_attention(el_kernels *k);     /* arch/neon_attention.c */
void el_kernels_fill_neon_batch(el_kernels *k, int dotprod); /* arch/neon_batch.c: vec_dot_nv, tiles */
void el_kernels_fill_neon_rows(el_kernels *k, int dotprod); /* arch/neon_rows.c: vec_dot_rows */

/* scalar float helpers, also the references for the SIMD versions */
float el_dot_f32_scalar(size_t n, const float *a, const float *b);
float el_dot_f32_f16_scalar(size_t n, const float *a, const el_half *b);
void el_axpy_f16_scalar(size_t n, float alpha, const el_half *x, float *y);
void el_axpy_f32_scalar(size_t n, float alpha, const float *x, float *y);
void el_vecmat_f32_scalar(size_t rank, size_t m, const float *t, const float *b, size_t ld, float *d);
void el_vecmat_f16_scalar(size_t rank, size_t m, const float *t, const el_half *b, size_t ld, float *d);
void el_round_f16_scalar(size_t n, const float *x, float *y);
void el_to_f16_scalar(size_t n, const float *x, el_half *y);
void el_attn_qk_f16_scalar(size_t hd, size_t g, const float *q, const void *k, size_t stride, const int32_t *idx,
                           size_t n, float *s);
void el_attn_pv_f16_scalar(size_t hd, size_t g, const float *p, const void *v, size_t stride, const int32_t *idx,
                           size_t n, float *o);

#endif

/* llamacpp_exact.h - llama.cpp's CPU arithmetic, operation for operation (internal).
 * The forward pass routes its matmuls, RoPE and attention here when a model's numerics are set to
 * EL_NUMERICS_LLAMACPP (RoPE through el_rope_apply's fused form); every other op of the pass already
 * rounds as ggml does. */
#ifndef EL_LLAMACPP_EXACT_H
#define EL_LLAMACPP_EXACT_H

#include <stddef.h>
#include <stdint.h>

#include "attention.h"
#include "dispatch.h"
#include "quants.h"
#include "pool.h"

/* activation rows per call of an llx table's q8_0_nv */
#define LLX_NV 8

/* The x86 build of llama.cpp whose order is followed. Its vector width shapes ggml's softmax, SwiGLU
 * and exp (vec.cpp / vec.h), llamafile's tinyBLAS and ggml_vec_dot_f16: 16 lanes in an AVX-512 build,
 * 8 in an AVX2 one (ggml_v_expf differs too: scalef there, 2^n times j plus 2^n here). The matmuls'
 * orders are the same in both. */
typedef enum { EL_LLX_AVX2 = 0, EL_LLX_AVX512 = 1 } el_llx_build;

/* the forms of one KQ score: llamafile's tinyBLAS (prefill; one accumulator of 16 or 8 lanes) or
 * ggml_vec_dot_f16 (decode; 4 accumulators of 16 or 8 lanes) */
enum { LLX_KQ_TINY16, LLX_KQ_DOT64, LLX_KQ_TINY8, LLX_KQ_DOT32 };

/* The kernels of llama.cpp's order, one table per ISA: every entry gives the scalar reference's bits
 * (the order is llama.cpp's, not the CPU's), SIMD only makes it faster. */
typedef struct el_llx_kernels {
    el_vec_dot_fn vec_dot[EL_TYPE_COUNT]; /* per-row dots by weight type: Q5_0, Q8_0, Q4_1, Q6_K */
    /* one KQ score of an fp16 key in a form LLX_KQ_* and one cell of KQV (lane[d] += v[d] p) */
    float (*kq)(size_t hd, const float *q, const el_half *k, int form);
    void (*pv)(size_t hd, float p, const el_half *v, float *lane);
    /* integer dots of the len-value runs (16 or 32) of 256 levels, |q| <= 32 (K-quant batches) */
    void (*isums)(const int8_t *q, const int8_t *a, int len, int32_t *out);
    /* Q8_0 blocks x up to LLX_NV activation rows, each output with vec_dot[Q8_0]'s bits */
    el_vec_dot_nv_fn q8_0_nv;
} el_llx_kernels;

/* The table of an ISA (dispatch.c's fill() points el_kernels.llx at it): "avx2" and "avx512" on
 * x86-64, the scalar references otherwise. Built once. */
const el_llx_kernels *el_llx_kernels_for(const char *isa);
void el_llx_fill_scalar(el_llx_kernels *k);   /* llamacpp_exact.c */
void el_llx_fill_avx2(el_llx_kernels *k);     /* arch/avx2_llamacpp.c, x86-64 only */
void el_llx_fill_avx512(el_llx_kernels *k);   /* arch/avx512_llamacpp.c, x86-64 only; over avx2's */

/* 1 if llama.cpp's order is implemented for this weight type and row length */
int el_llx_type_supported(int wtype, size_t cols);
/* bytes of the quantized activations of n_vec rows of cols floats for wtype */
size_t el_llx_act_bytes(int wtype, size_t cols, size_t n_vec);
/* x (n_vec rows of cols floats) quantized for wtype as ggml's x86 from_float does, into act
 * (el_llx_act_bytes bytes; the block formats of el_quantize_act's, other roundings) */
void el_llx_quantize(el_pool *pool, int wtype, const float *x, size_t cols, size_t n_vec, void *act);
/* y[v * ldy + r] = W[r] . act[v] as ggml computes it, each output summed in its SIMD lanes */
void el_llx_matmul_act(el_pool *pool, int wtype, const void *w, size_t rows, size_t cols, const void *act,
                       size_t n_vec, float *y, size_t ldy);
/* both: x quantized into the scratch act, then multiplied */
void el_llx_matmul(el_pool *pool, int wtype, const void *w, size_t rows, size_t cols, const float *x,
                   size_t n_vec, float *y, size_t ldy, void *act);

/* g = silu(g) * u as the build's fused SwiGLU computes it */
void el_llx_swiglu(el_llx_build build, float *g, const float *u, size_t n);

/* Attention without flash attention, as ggml's graph runs it: q rounded to fp16 (a graph that
 * scales Q has done so before, el_model_desc.scale_q, and passes scale 1), KQ in fp16 rows,
 * softmax with ggml's exp, probabilities rounded to fp16, V^T products.
 * kv_type must be F16. Bit-exact while every slot holds the position of its llama.cpp cell (a fresh
 * sequence that has not wrapped a ring or shifted). scratch: el_llx_attn_scratch_floats floats. */
size_t el_llx_attn_scratch_floats(size_t n_cells, size_t head_dim, int n_threads);
void el_llx_attention(el_pool *pool, el_llx_build build, const el_attn_args *a, size_t n_cells, float *scratch);

#endif

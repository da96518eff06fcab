/* llamacpp_exact.h - llama.cpp's CPU arithmetic, operation for operation (internal).
 * The forward pass routes its matmuls, RoPE and attention here when a model's numerics are set to
 * EL_NUMERICS_LLAMACPP (RoPE through el_rope_apply's fused form); every other op of the pass already
 * rounds as ggml does. */
#ifndef EL_LLAMACPP_EXACT_H
#define EL_LLAMACPP_EXACT_H

#include <stddef.h>
#include <stdint.h>

#include "attention.h"
#include "quants.h"
#include "pool.h"

/* The scalar references of the per-row dots (Q5_0, Q8_0, Q4_1, Q6_K) into a dispatch table's
 * llx_vec_dot; SIMD files override them with bit-identical versions. */
void el_llx_fill_scalar(el_vec_dot_fn table[EL_TYPE_COUNT]);

/* activation rows per call of a dispatch table's llx_q8_0_nv */
#define LLX_NV 8

/* 1 if llama.cpp's order is implemented for this weight type and row length */
int el_llx_type_supported(int wtype, size_t cols);
/* bytes of the quantized activations of n_vec rows of cols floats for wtype */
size_t el_llx_act_bytes(int wtype, size_t cols, size_t n_vec);
/* x (n_vec rows of cols floats) quantized for wtype as ggml's x86 from_float does, into act
 * (el_llx_act_bytes bytes; the block formats of el_quantize_act's, other roundings) */
void el_llx_quantize(el_pool *pool, int wtype, const float *x, size_t cols, size_t n_vec, void *act);
/* y[v * ldy + r] = W[r] . act[v] as ggml computes it, each output summed in ggml's SIMD lanes */
void el_llx_matmul_act(el_pool *pool, int wtype, const void *w, size_t rows, size_t cols, const void *act,
                       size_t n_vec, float *y, size_t ldy);
/* both: x quantized into the scratch act, then multiplied */
void el_llx_matmul(el_pool *pool, int wtype, const void *w, size_t rows, size_t cols, const float *x,
                   size_t n_vec, float *y, size_t ldy, void *act);

/* g = silu(g) * u as ggml's fused SwiGLU computes it */
void el_llx_swiglu(float *g, const float *u, size_t n);

/* Attention without flash attention, as ggml's graph runs it: q (times scale when scale_q) rounded
 * to fp16, KQ in fp16 rows, softmax with ggml's exp, probabilities rounded to fp16, V^T products.
 * kv_type must be F16. Bit-exact while every slot holds the position of its llama.cpp cell (a fresh
 * sequence that has not wrapped a ring or shifted). scratch: el_llx_attn_scratch_floats floats. */
size_t el_llx_attn_scratch_floats(size_t n_cells, size_t head_dim, int n_threads);
void el_llx_attention(el_pool *pool, const el_attn_args *a, int scale_q, size_t n_cells, float *scratch);

#endif

/* ops.h - internal helpers behind the public float ops (RoPE with a precomputed cos/sin row). */
#ifndef EL_OPS_H
#define EL_OPS_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "edgellama.h"
#include "fp16.h"

#define EL_MAX_HEAD_DIM 512

/* Hot loops get an x86 clone with FMA and AVX2 (picked at load time by an ifunc): fmaf becomes one
 * instruction and the loops vectorize. Same operations, same bits: -ffp-contract=off and no
 * reassociation keep every rounding where the C puts it. Elsewhere fmaf is native (aarch64) or exact
 * in software. Only on static functions: GCC exports the ifunc of an extern target_clones function
 * whatever its visibility, and the library exports nothing but its API (so a plain function wraps it). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define EL_HOT __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define EL_HOT
#endif

/* How one layer rotates: frequency base and scale, the optional per-frequency divisors, YaRN. */
typedef struct {
    float base, scale;
    const float *factors;   /* n_rot/2 divisors of the frequencies, NULL = none */
    float ext_factor;       /* YaRN's extrapolation mix, 0 = off */
    float mscale;           /* multiplies cos and sin (LongRoPE/YaRN attention factor), 1 = none */
    float corr[2];          /* YaRN's correction dims (el_rope_init) */
} el_rope_args;

/* Gemma 2's soft-capping, cap * tanh(x / cap), rounded as llama.cpp's graph does it: x times the
 * float 1/cap, tanhf, times cap */
static inline float el_softcap(float x, float cap) { return tanhf(x * (1.0f / cap)) * cap; }

/* the rotation of layer L of a model description; mscale 1 when magnitude is 0 (a pure rotation, for
 * re-rotating cached keys by a position delta) */
el_rope_args el_rope_init(const el_model_desc *d, const el_layer *L, int magnitude);
/* cs[2i], cs[2i+1] = cos, sin of the i-th rotation angle at pos. */
void el_rope_cache(float *cs, size_t n_rot, int32_t pos, const el_rope_args *r);
/* GELU via a 65536-entry fp16 table (held by the model, not global): bit-identical to el_gelu. */
void el_gelu_table_fill(el_half *table);
void el_gelu_lut(float *x, size_t n, const el_half *table);
void el_layernorm_rows(float *out, const float *x, const float *w, const float *b, size_t rows, size_t n,
                       float eps);
void el_rmsnorm_rows(float *out, const float *x, const float *weight, size_t rows, size_t n, float eps);
void el_rope_apply(float *x, size_t n_head, size_t head_dim, size_t n_rot, const float *cs, int neox, int fused);

#endif

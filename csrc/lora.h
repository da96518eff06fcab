/* lora.h - LoRA adapters on a model's matmul weights (internal): y += s * B (A x) after the base
 * matmul, the base weights untouched in the mapping. Terms live on the model (model.h: el_model.lora);
 * forward.c calls el_lora_mm after each weight's matmul. */
#ifndef EL_LORA_H
#define EL_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "edgellama.h"
#include "pool.h"

typedef struct el_model el_model;

/* one adapter's term on one weight: A [rank x n_in], B [n_out x rank], F32, owned by the caller */
typedef struct {
    int32_t adapter, rank;
    float factor; /* this weight's share of the scale: the row's scale is factor * the sequence's */
    const float *a, *b;
} el_lora_term;

/* the terms on one weight, in adapter order */
typedef struct {
    el_lora_term *terms;
    int32_t n;
} el_lora_list;

/* the weight slots: layer il's target k at il * EL_LORA_LAYER_TARGETS + k, the output head last */
enum { EL_LORA_LAYER_TARGETS = 7 };

/* y[v * ldy + o] += s[v] * sum_k t[v][k] B[o][k], t = x A^T (t: n x rank scratch), for the rows v with
 * s[v] != 0 (the others are not touched). t has the bits of the F32 matmul (one vec_dot per output),
 * the second product one dot_f32 per output: each row's result does not depend on the other rows or
 * the thread count. */
void el_lora_apply(el_pool *pool, const float *x, size_t n, size_t n_in, const float *a, const float *b,
                   size_t rank, size_t n_out, const float *s, float *t, float *y, size_t ldy);

/* every term of weight slot `slot` on the n rows of x (row v of sequence m->lora_seq[v]) into y */
void el_lora_mm(el_model *m, int32_t slot, const float *x, size_t n, float *y, size_t ldy);

/* the weight of slot `slot` (the output head: output, or tok_embd when tied) */
const el_tensor *el_lora_weight(const el_model *m, int32_t slot);

/* frees every term, the scales and the scratch (el_model_free, el_model_lora_clear) */
void el_lora_free(el_model *m);

#endif

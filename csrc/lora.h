/* lora.h - LoRA adapters on a model's matmul weights (internal): y += s * B (A x) after the base
 * matmul, the base weights untouched in the mapping. Terms live on the model (model.h: el_model.lora);
 * forward.c calls el_lora_mm after the matmuls of each group of weights that read one input. */
#ifndef EL_LORA_H
#define EL_LORA_H

#include <stddef.h>
#include <stdint.h>

#include "edgellama.h"
#include "pool.h"

typedef struct el_model el_model;

/* one adapter's term on one weight: A [rank x n_in] and B^T [rank x n_out] (B transposed), each
 * EL_TYPE_F32 or EL_TYPE_F16, owned by the caller */
typedef struct {
    int32_t adapter, rank;
    float factor; /* this weight's share of the scale: the row's scale is factor * the sequence's */
    int a_type, b_type;
    const void *a, *bt;
} el_lora_term;

/* the terms on one weight, in adapter order */
typedef struct {
    el_lora_term *terms;
    int32_t n;
} el_lora_list;

/* the weight slots: layer il's target k at il * EL_LORA_LAYER_TARGETS + k, the output head last */
enum { EL_LORA_LAYER_TARGETS = 7 };

/* y[v * ldy + o] += s[v] * sum_k t[v][k] B^T[k][o], t = x A^T (t: n x rank scratch), for the rows v
 * with s[v] != 0 (the others are not touched). t has the bits of the matmul of A's type with float
 * activations (one vec_dot per output), the second product per output a chain of fused multiply-adds,
 * k ascending (vecmat): each row's result does not depend on the other rows or the thread count. The F16
 * kernels widen each half exactly and compute as the F32 ones do, so F16 matrices give the bits of
 * the same matrices widened to F32 (on every ISA: the dispatch table pairs them). */
void el_lora_apply(el_pool *pool, const float *x, size_t n, size_t n_in, int a_type, const void *a, int b_type,
                   const void *bt, size_t rank, size_t n_out, const float *s, float *t, float *y, size_t ldy);

/* the most weights that read one input (q, k, v): a group's terms share the pool's hand-offs */
enum { EL_LORA_GROUP = 3 };

/* every term of the weight slots slots[0..n_slots) (weights that read the same input, at most
 * EL_LORA_GROUP) on the n rows of x (row v of sequence m->lora_seq[v]), slot j's into ys[j] (rows of
 * that weight's n_out floats); adapter by adapter in index order, so each output takes its terms in
 * the order a slot alone would */
void el_lora_mm(el_model *m, const int32_t *slots, size_t n_slots, const float *x, size_t n, float *const *ys);

/* the weight of slot `slot` (the output head: output, or tok_embd when tied) */
const el_tensor *el_lora_weight(const el_model *m, int32_t slot);

/* frees every term, the scales and the scratch (el_model_free, el_model_lora_clear) */
void el_lora_free(el_model *m);

#endif

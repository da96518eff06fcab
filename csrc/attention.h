/* attention.h - multi-head attention over a KV cache (internal form used by the forward pass). */
#ifndef EL_ATTENTION_H
#define EL_ATTENTION_H

#include <stddef.h>
#include <stdint.h>

#include "pool.h"

typedef struct {
    const float *q;          /* n_q x n_head x head_dim */
    size_t n_q;
    const int32_t *q_pos;    /* n_q positions */
    size_t n_head, n_head_kv, head_dim;
    int kv_type;             /* EL_TYPE_F32, F16 or Q8_0 */
    const void *k, *v;       /* n_kv slots, each n_head_kv rows of head_dim values in kv_type */
    const int32_t *kv_pos;   /* position held by each slot, -1 = empty */
    size_t n_kv;
    int32_t window;          /* 0 = no sliding window */
    float scale;
    float softcap;           /* scores become softcap * tanh(score / softcap); 0 = none */
    float *out;              /* n_q x n_head x head_dim */
    float *scratch;          /* el_attention_scratch_floats() floats */
} el_attn_args;

size_t el_attention_scratch_floats(size_t n_kv, size_t n_head, size_t n_head_kv, size_t head_dim, int n_threads);
size_t el_kv_row_bytes(int kv_type, size_t head_dim); /* bytes of one head's key or value row */
void el_attention_run(el_pool *pool, const el_attn_args *a);
/* n sequences' attention of one layer (each its own cache and scratch-sharing args): the bits of
 * el_attention_run on each, in one pool run when they have enough (query, KV head) pairs */
void el_attention_run_seqs(el_pool *pool, const el_attn_args *a, size_t n);

#endif

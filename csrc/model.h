/* model.h - the model handle (internal): description, KV cache and scratch, shared by model.c
 * (validation, sizing, creation), kv_cache.c (cache policy operations) and forward.c (the pass). */
#ifndef EL_MODEL_H
#define EL_MODEL_H

#include "edgellama.h"
#include "fp16.h"
#include "pool.h"

enum { ACT_F32, ACT_Q8_0, ACT_Q8_1, ACT_Q8_K, ACT_KINDS };

typedef struct {
    void *k, *v;      /* n_slots x n_head_kv x head_dim in kv_type */
    int32_t *pos;     /* position held by each slot, -1 = empty */
    int32_t n_slots;
    int32_t ring;     /* windowed layer: slots reused in write order (head = next to write) */
    int32_t head;
    int32_t n_used;   /* slots [0, n_used) may hold data; attention scans only those */
} kv_layer;

#define EL_SCRATCH_BUFS 13

struct el_model {
    el_model_desc d;
    el_layer *layers;
    el_pool *pool;
    int32_t n_ctx, n_batch;
    int kv_type;
    kv_layer *kv;
    size_t kv_bytes, scratch_bytes;
    /* scratch, n_batch rows each */
    float *x, *xn, *q, *k, *v, *att, *o, *g, *u, *cs;
    int32_t *q_pos;
    float *attn_scratch;
    el_half *gelu_table;             /* GELU of every fp16 value (Gemma), filled at creation */
    void *act[ACT_KINDS];
    const float *act_src[ACT_KINDS]; /* which input an activation buffer holds (NULL = stale) */
    void *block;                     /* the single allocation behind all scratch */
    int numerics;                    /* enum el_numerics */
    void *llx_act;                   /* EL_NUMERICS_LLAMACPP: quantized activations */
    float *llx_scratch;              /* EL_NUMERICS_LLAMACPP: attention, per thread */
    size_t llx_cells;                /* cells the llama.cpp attention scratch holds */
};

/* A public call on a model holds the model's pool for its whole run (pool.h, edgellama.h):
 *   const int st = el_model_enter(m); return st != EL_OK ? st : el_model_leave(m, held_call(m, ...)); */
static inline int el_model_enter(const el_model *m) { return m ? el_pool_enter(m->pool) : EL_EINVAL; }
static inline int el_model_leave(const el_model *m, int status) {
    el_pool_leave(m->pool);
    return status;
}

/* bytes of one slot (all kv heads) of K or of V */
size_t el_kv_slot_bytes(const el_model *m);
/* slots a layer with this window gets */
int32_t el_kv_layer_slots(int32_t window, int32_t n_ctx, int32_t n_batch);
/* the length of the cached sequence: the position the next batch must start at */
int32_t el_kv_n_past(const el_model *m);
/* stores n new keys/values at positions pos0.. */
void el_kv_store(el_model *m, kv_layer *c, const float *k, const float *v, size_t n, int32_t pos0);
int el_act_kind(int wtype);

#endif

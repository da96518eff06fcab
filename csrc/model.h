/* model.h - the model handle (internal): description, KV cache and scratch, shared by model.c
 * (validation, sizing, creation), kv_cache.c (cache policy operations) and forward.c (the pass). */
#ifndef EL_MODEL_H
#define EL_MODEL_H

#include "attention.h"
#include "edgellama.h"
#include "fp16.h"
#include "lora.h"
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

/* Every scratch buffer by name, placed by one table of {offset, size} (model.c: scratch_table) used
 * by both the plan and the allocation. Two blocks: [0, SC_NATIVE_END) allocated by el_model_create,
 * [SC_NATIVE_END, SC_COUNT) by el_model_set_numerics(EL_NUMERICS_LLAMACPP). */
enum {
    SC_X, SC_XN, SC_Q, SC_K, SC_V, SC_ATT, SC_O, SC_G, SC_U,
    SC_CS,                                  /* rope cos/sin per token */
    SC_Q_POS,
    SC_MASK_POS,                            /* non-causal: the position each query row masks by */
    SC_ROW_SEQ, SC_ROW_TOK, SC_ROW_SRC,     /* a batch's rows grouped by sequence: seq, token, entry index */
    SC_ENTRIES,                             /* el_model_eval's batch as el_batch_entry */
    SC_ATTN,                                /* attention scratch (el_attention_scratch_floats) */
    SC_GELU,                                /* GELU table (Gemma), else empty */
    SC_ACT_Q8_0, SC_ACT_Q8_1, SC_ACT_Q8_K,  /* quantized activations, one per kind (ACT_Q8_0..) */
    SC_NATIVE_END,
    SC_LLX_ATTN = SC_NATIVE_END,            /* llama.cpp numerics: attention scratch (its quantized
                                               activations share SC_ACT_*: the same block formats) */
    SC_COUNT
};
typedef struct { size_t offset, size; } el_span;

/* A numerics mode (enum el_numerics) as the operations of the pass that differ between modes
 * (numerics.c): el_model_set_numerics picks the table, forward.c and kv_cache.c call through it. */
typedef struct el_numerics_ops {
    /* x (n_vec rows of cols floats) into act in the activation format of wtype's matmul */
    void (*quantize)(el_pool *pool, int wtype, const float *x, size_t cols, size_t n_vec, void *act);
    /* y[v * ldy + r] = W[r] . act[v], act from quantize (or the floats, for float weights) */
    void (*matmul)(el_pool *pool, int wtype, const void *w, size_t rows, size_t cols, const void *act,
                   size_t n_vec, float *y, size_t ldy);
    void (*swiglu)(float *g, const float *u, size_t n); /* g = silu(g) * u */
    void (*attention)(el_model *m, const kv_layer *c, const el_attn_args *a);
    /* several sequences' attention of one layer at once (NULL: attention on each in turn) */
    void (*attention_seqs)(el_model *m, const el_attn_args *a, size_t n);
    int rope_fused; /* el_rope_apply's fused form (llama.cpp's rounding of the rotation) */
} el_numerics_ops;

const el_numerics_ops *el_numerics_ops_of(int numerics); /* NULL: no such mode */

struct el_model {
    el_model_desc d;
    el_layer *layers;
    el_pool *pool;
    int32_t n_ctx, n_batch, n_seq;
    int kv_type;
    kv_layer *kv;                    /* n_seq x n_layer: sequence s's layers at kv + s * n_layer */
    size_t kv_bytes, scratch_bytes;
    /* scratch, n_batch rows each */
    float *x, *xn, *q, *k, *v, *att, *o, *g, *u, *cs;
    int32_t *q_pos, *mask_pos;
    int32_t *row_seq, *row_tok, *row_src;
    el_batch_entry *entries;
    float *attn_scratch;
    el_half *gelu_table;             /* GELU of every fp16 value (Gemma), filled at creation */
    void *act[ACT_KINDS];            /* [ACT_F32] unused: a float input is read in place */
    void *block;                     /* the single allocation behind the native scratch */
    const el_numerics_ops *ops;      /* the numerics mode (el_model_set_numerics) */
    void *llx_block;                 /* the allocation behind the llama.cpp numerics' scratch */
    float *llx_scratch;              /* EL_NUMERICS_LLAMACPP: attention, per thread */
    size_t llx_cells;                /* cells the llama.cpp attention scratch holds */
    /* LoRA adapters (lora.c): NULL until the first el_model_lora_attach / nonzero scale */
    el_lora_list *lora;              /* n_layer * EL_LORA_LAYER_TARGETS + 1 weight slots */
    float *lora_scale;               /* EL_MAX_LORA x n_seq: adapter a's scale for sequence s */
    void *lora_block;                /* scratch for the largest rank attached (counted in scratch_bytes) */
    size_t lora_bytes;
    int32_t lora_rank_cap;
    float *lora_t;                   /* EL_LORA_GROUP x n_batch x lora_rank_cap: t = x A^T per term of a group */
    float *lora_rs;                  /* EL_LORA_GROUP x n_batch: each row's scale per term of a group */
    int32_t *lora_seq;               /* n_batch: the sequence of each row of the current matmul input */
};

/* A public call on a model holds the model's pool for its whole run (pool.h, edgellama.h):
 *   const int st = el_model_enter(m); return st != EL_OK ? st : el_model_leave(m, held_call(m, ...)); */
static inline int el_model_enter(const el_model *m) { return m ? el_pool_enter(m->pool) : EL_EINVAL; }
static inline int el_model_leave(const el_model *m, int status) {
    el_pool_leave(m->pool);
    return status;
}

/* sequence seq's layers (n_layer kv_layer) */
static inline kv_layer *el_seq_kv(const el_model *m, int32_t seq) { return m->kv + (size_t)seq * (size_t)m->d.n_layer; }

/* bytes of one slot (all kv heads) of K or of V */
size_t el_kv_slot_bytes(const el_model *m);
/* slots a layer with this window gets */
int32_t el_kv_layer_slots(int32_t window, int32_t n_ctx, int32_t n_batch);
/* the length of sequence seq's cached tokens: the position its next entry must have */
int32_t el_kv_n_past(const el_model *m, int32_t seq);
/* stores n new keys/values at positions pos0.. */
void el_kv_store(el_model *m, kv_layer *c, const float *k, const float *v, size_t n, int32_t pos0);
int el_act_kind(int wtype);

#endif

/* forward.c - the decoder forward pass (Gemma 3 and the llama family) in one call per batch:
 * embeddings, every layer, final norm, logits. Weights are read in place from the caller's
 * mapping; the KV cache and all scratch are allocated once in el_model_create. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "dispatch.h"
#include "edgellama.h"
#include "matmul.h"
#include "ops.h"
#include "pool.h"

enum { ACT_F32, ACT_Q8_0, ACT_Q8_1, ACT_Q8_K, ACT_KINDS };

typedef struct {
    void *k, *v;       /* n_slots x n_head_kv x head_dim in kv_type */
    int32_t *pos;      /* position held by each slot, -1 = empty */
    int32_t n_slots;
    int32_t ring;      /* 1: slot = pos % n_slots (windowed layer), 0: slot = pos */
} kv_layer;

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
    void *act[ACT_KINDS];
    const float *act_src[ACT_KINDS]; /* which input the buffer currently holds (NULL = stale) */
    void *block;                     /* single allocation behind all scratch */
};

static int act_kind(int wtype) {
    switch (el_vec_dot_type(wtype)) {
    case EL_TYPE_Q8_0: return ACT_Q8_0;
    case EL_TYPE_Q8_1: return ACT_Q8_1;
    case EL_TYPE_Q8_K: return ACT_Q8_K;
    default: return ACT_F32;
    }
}

/* ---- validation of the description: sizes come from a file, so check them all ---- */
static int tensor_ok(const el_tensor *t, int64_t ne0, int64_t ne1, int need_matmul) {
    if (!t->data) return 0;
    if (t->ne0 != ne0 || t->ne1 != ne1 || ne0 <= 0 || ne1 <= 0) return 0;
    const size_t rb = el_row_bytes(t->type, (size_t)ne0);
    if (rb == 0 || (size_t)ne1 > SIZE_MAX / rb || t->nbytes != rb * (size_t)ne1) return 0;
    if (need_matmul && el_act_bytes(t->type, (size_t)ne0, 1) == 0) return 0;
    if (!need_matmul && t->type != EL_TYPE_F32) return 0; /* norms and biases are F32 */
    return 1;
}

static int opt_ok(const el_tensor *t, int64_t ne0, int64_t ne1, int need_matmul) {
    return !t->data || tensor_ok(t, ne0, ne1, need_matmul);
}

static int desc_ok(const el_model_desc *d) {
    if (d->arch != EL_ARCH_LLAMA && d->arch != EL_ARCH_GEMMA3) return EL_EUNSUPPORTED;
    if (d->n_layer <= 0 || d->n_embd <= 0 || d->n_head <= 0 || d->n_head_kv <= 0 || d->head_dim <= 0 ||
        d->n_ff <= 0 || d->n_vocab <= 0 || d->n_head % d->n_head_kv || d->head_dim > EL_MAX_HEAD_DIM ||
        d->n_rot <= 0 || d->n_rot > d->head_dim || d->n_rot % 2 || !d->layers)
        return EL_EINVAL;
    if (d->n_layer > 4096 || d->n_embd > (1 << 16) || d->n_ff > (1 << 18) || d->n_head > 1024) return EL_EINVAL;
    const int64_t E = d->n_embd, Q = (int64_t)d->n_head * d->head_dim, KV = (int64_t)d->n_head_kv * d->head_dim;
    if (!tensor_ok(&d->tok_embd, E, d->n_vocab, 1) || !tensor_ok(&d->output_norm, E, 1, 0)) return EL_EINVAL;
    if (!opt_ok(&d->output, E, d->n_vocab, 1)) return EL_EINVAL;
    for (int32_t il = 0; il < d->n_layer; il++) {
        const el_layer *L = &d->layers[il];
        if (!tensor_ok(&L->attn_norm, E, 1, 0) || !tensor_ok(&L->wq, E, Q, 1) || !tensor_ok(&L->wk, E, KV, 1) ||
            !tensor_ok(&L->wv, E, KV, 1) || !tensor_ok(&L->wo, Q, E, 1) || !tensor_ok(&L->ffn_norm, E, 1, 0) ||
            !tensor_ok(&L->w_gate, E, d->n_ff, 1) || !tensor_ok(&L->w_up, E, d->n_ff, 1) ||
            !tensor_ok(&L->w_down, d->n_ff, E, 1))
            return EL_EINVAL;
        if (!opt_ok(&L->bq, Q, 1, 0) || !opt_ok(&L->bk, KV, 1, 0) || !opt_ok(&L->bv, KV, 1, 0) ||
            !opt_ok(&L->q_norm, d->head_dim, 1, 0) || !opt_ok(&L->k_norm, d->head_dim, 1, 0) ||
            !opt_ok(&L->attn_post_norm, E, 1, 0) || !opt_ok(&L->ffn_post_norm, E, 1, 0))
            return EL_EINVAL;
        if (L->window < 0 || !(L->rope_base > 0.0f) || !(L->rope_scale > 0.0f)) return EL_EINVAL;
    }
    return EL_OK;
}

/* ---- creation: one allocation for scratch, one per layer for K and V ---- */
static void carve(char **p, void **out, size_t bytes) {
    *out = *p;
    *p += (bytes + 63) & ~(size_t)63;
}

static size_t max_act(const el_model_desc *d, int kind, size_t n_batch) {
    /* the largest activation row any matmul of this kind consumes */
    size_t best = 0;
    const el_tensor *ts[2] = {&d->tok_embd, d->output.data ? &d->output : &d->tok_embd};
    for (int i = 1; i < 2; i++)
        if (act_kind(ts[i]->type) == kind) {
            size_t b = el_act_bytes(ts[i]->type, (size_t)ts[i]->ne0, n_batch);
            best = b > best ? b : best;
        }
    for (int32_t il = 0; il < d->n_layer; il++) {
        const el_layer *L = &d->layers[il];
        const el_tensor *ws[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7; i++)
            if (act_kind(ws[i]->type) == kind) {
                size_t b = el_act_bytes(ws[i]->type, (size_t)ws[i]->ne0, n_batch);
                best = b > best ? b : best;
            }
    }
    return best;
}

int el_model_create(const el_model_desc *desc, el_pool *pool, int32_t n_ctx, int32_t n_batch, int kv_type,
                    el_model **out) {
    if (!desc || !pool || !out || n_ctx <= 0 || n_batch <= 0 || n_batch > n_ctx || n_ctx > (1 << 24))
        return EL_EINVAL;
    if (kv_type != EL_TYPE_F16 && kv_type != EL_TYPE_Q8_0 && kv_type != EL_TYPE_F32) return EL_EUNSUPPORTED;
    int st = desc_ok(desc);
    if (st != EL_OK) return st;
    if (el_kv_row_bytes(kv_type, (size_t)desc->head_dim) == 0) return EL_EINVAL;
    el_model *m = calloc(1, sizeof *m);
    if (!m) return EL_ENOMEM;
    m->d = *desc;
    m->pool = pool;
    m->n_ctx = n_ctx;
    m->n_batch = n_batch;
    m->kv_type = kv_type;
    m->layers = calloc((size_t)desc->n_layer, sizeof *m->layers);
    m->kv = calloc((size_t)desc->n_layer, sizeof *m->kv);
    if (!m->layers || !m->kv) goto nomem;
    memcpy(m->layers, desc->layers, (size_t)desc->n_layer * sizeof *m->layers);
    m->d.layers = m->layers;

    const size_t E = (size_t)desc->n_embd, HD = (size_t)desc->head_dim, B = (size_t)n_batch;
    const size_t QD = (size_t)desc->n_head * HD, KVD = (size_t)desc->n_head_kv * HD, F = (size_t)desc->n_ff;
    const size_t row = el_kv_row_bytes(kv_type, HD) * (size_t)desc->n_head_kv;
    for (int32_t il = 0; il < desc->n_layer; il++) {
        kv_layer *c = &m->kv[il];
        const int32_t w = m->layers[il].window;
        /* a windowed layer needs its window plus the rest of a batch written before attention */
        c->ring = w > 0 && (int64_t)w + n_batch - 1 < n_ctx;
        c->n_slots = c->ring ? w + n_batch - 1 : n_ctx;
        c->k = malloc(row * (size_t)c->n_slots);
        c->v = malloc(row * (size_t)c->n_slots);
        c->pos = malloc(sizeof(int32_t) * (size_t)c->n_slots);
        if (!c->k || !c->v || !c->pos) goto nomem;
        for (int32_t s = 0; s < c->n_slots; s++) c->pos[s] = -1;
        m->kv_bytes += 2 * row * (size_t)c->n_slots;
    }

    size_t sizes[16], n = 0, total = 0;
    sizes[n++] = B * E * 4;   /* x */
    sizes[n++] = B * E * 4;   /* xn */
    sizes[n++] = B * QD * 4;  /* q */
    sizes[n++] = B * KVD * 4; /* k */
    sizes[n++] = B * KVD * 4; /* v */
    sizes[n++] = B * QD * 4;  /* att */
    sizes[n++] = B * (E > QD ? E : QD) * 4; /* o */
    sizes[n++] = B * F * 4;   /* g */
    sizes[n++] = B * F * 4;   /* u */
    sizes[n++] = B * HD * 4;  /* cs: rope cos/sin per token */
    sizes[n++] = B * 4;       /* q_pos */
    int32_t max_slots = 0;
    for (int32_t il = 0; il < desc->n_layer; il++) max_slots = m->kv[il].n_slots > max_slots ? m->kv[il].n_slots : max_slots;
    sizes[n++] = el_attention_scratch_floats((size_t)max_slots, HD, el_pool_threads(pool)) * 4;
    for (int k = 0; k < ACT_KINDS; k++) sizes[n++] = max_act(desc, k, B);
    for (size_t i = 0; i < n; i++) total += (sizes[i] + 63) & ~(size_t)63;
    if (posix_memalign(&m->block, 64, total) != 0) { m->block = NULL; goto nomem; }
    m->scratch_bytes = total;
    char *p = m->block;
    void *ptr;
    size_t i = 0;
    carve(&p, &ptr, sizes[i++]); m->x = ptr;
    carve(&p, &ptr, sizes[i++]); m->xn = ptr;
    carve(&p, &ptr, sizes[i++]); m->q = ptr;
    carve(&p, &ptr, sizes[i++]); m->k = ptr;
    carve(&p, &ptr, sizes[i++]); m->v = ptr;
    carve(&p, &ptr, sizes[i++]); m->att = ptr;
    carve(&p, &ptr, sizes[i++]); m->o = ptr;
    carve(&p, &ptr, sizes[i++]); m->g = ptr;
    carve(&p, &ptr, sizes[i++]); m->u = ptr;
    carve(&p, &ptr, sizes[i++]); m->cs = ptr;
    carve(&p, &ptr, sizes[i++]); m->q_pos = ptr;
    carve(&p, &ptr, sizes[i++]); m->attn_scratch = ptr;
    for (int k = 0; k < ACT_KINDS; k++) carve(&p, &m->act[k], sizes[i++]);
    *out = m;
    return EL_OK;
nomem:
    el_model_free(m);
    return EL_ENOMEM;
}

void el_model_free(el_model *m) {
    if (!m) return;
    if (m->kv)
        for (int32_t il = 0; il < m->d.n_layer; il++) {
            free(m->kv[il].k);
            free(m->kv[il].v);
            free(m->kv[il].pos);
        }
    free(m->kv);
    free(m->layers);
    free(m->block);
    free(m);
}

size_t el_model_kv_bytes(const el_model *m) { return m ? m->kv_bytes : 0; }
size_t el_model_scratch_bytes(const el_model *m) { return m ? m->scratch_bytes : 0; }

int el_model_truncate(el_model *m, int32_t pos) {
    if (!m || pos < 0) return EL_EINVAL;
    int status = EL_OK;
    for (int32_t il = 0; il < m->d.n_layer; il++) {
        kv_layer *c = &m->kv[il];
        int32_t oldest = INT32_MAX;
        for (int32_t s = 0; s < c->n_slots; s++) {
            if (c->pos[s] >= pos) c->pos[s] = -1;
            else if (c->pos[s] >= 0 && c->pos[s] < oldest) oldest = c->pos[s];
        }
        /* a ring that already overwrote keys the new end still needs cannot rewind that far */
        const int32_t w = m->layers[il].window;
        if (c->ring && pos > w && (oldest == INT32_MAX || oldest > pos - w)) status = EL_ECTX;
    }
    return status;
}

/* ---- the pass ---- */
static void mm(el_model *m, const el_tensor *w, const float *x, size_t n, float *y) {
    const int kind = act_kind(w->type);
    const size_t cols = (size_t)w->ne0;
    const void *act = x;
    if (kind != ACT_F32) {
        if (m->act_src[kind] != x) {
            el_quantize_act(m->pool, w->type, x, cols, n, m->act[kind]);
            m->act_src[kind] = x;
        }
        act = m->act[kind];
    }
    el_matmul_act(m->pool, w->type, w->data, (size_t)w->ne1, cols, act, n, y, (size_t)w->ne1);
}

/* the contents of x changed: forget quantized copies of it */
static void invalidate(el_model *m) {
    for (int k = 0; k < ACT_KINDS; k++) m->act_src[k] = NULL;
}

static void norm_rows(float *out, const float *x, const el_tensor *w, size_t n, size_t dim, float eps) {
    for (size_t i = 0; i < n; i++) el_rmsnorm(out + i * dim, x + i * dim, (const float *)w->data, dim, eps);
}

static void add_bias(float *y, const el_tensor *b, size_t n, size_t dim) {
    if (!b->data) return;
    for (size_t i = 0; i < n; i++) el_add(y + i * dim, y + i * dim, (const float *)b->data, dim);
}

static void store_kv(el_model *m, kv_layer *c, const float *k, const float *v, size_t n, int32_t pos0) {
    const size_t HD = (size_t)m->d.head_dim, NKV = (size_t)m->d.n_head_kv;
    const size_t row = el_kv_row_bytes(m->kv_type, HD), slot_bytes = row * NKV;
    const el_type_traits *tr = el_get_type_traits(m->kv_type);
    for (size_t i = 0; i < n; i++) {
        const int32_t p = pos0 + (int32_t)i;
        const int32_t s = c->ring ? p % c->n_slots : p;
        char *kd = (char *)c->k + (size_t)s * slot_bytes, *vd = (char *)c->v + (size_t)s * slot_bytes;
        if (m->kv_type == EL_TYPE_F32) {
            memcpy(kd, k + i * NKV * HD, NKV * HD * 4);
            memcpy(vd, v + i * NKV * HD, NKV * HD * 4);
        } else {
            tr->from_float(k + i * NKV * HD, kd, NKV * HD);
            tr->from_float(v + i * NKV * HD, vd, NKV * HD);
        }
        c->pos[s] = p;
    }
}

int el_model_eval(el_model *m, const int32_t *tokens, size_t n, int32_t pos0, float *logits, int all_logits) {
    if (!m || !tokens || !logits || n == 0 || n > (size_t)m->n_batch || pos0 < 0) return EL_EINVAL;
    if ((int64_t)pos0 + (int64_t)n > m->n_ctx) return EL_ECTX;
    const el_model_desc *d = &m->d;
    const size_t E = (size_t)d->n_embd, HD = (size_t)d->head_dim, NH = (size_t)d->n_head;
    const size_t NKV = (size_t)d->n_head_kv, F = (size_t)d->n_ff, QD = NH * HD, KVD = NKV * HD;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] < 0 || tokens[i] >= d->n_vocab) return EL_EINVAL;
    for (size_t i = 0; i < n; i++) m->q_pos[i] = pos0 + (int32_t)i;

    /* embeddings */
    const el_type_traits *te = el_get_type_traits(d->tok_embd.type);
    const size_t erow = el_row_bytes(d->tok_embd.type, E);
    for (size_t i = 0; i < n; i++) {
        te->to_float((const char *)d->tok_embd.data + (size_t)tokens[i] * erow, m->x + i * E, E);
        if (d->emb_scale != 1.0f) el_scale(m->x + i * E, d->emb_scale, E);
    }

    for (int32_t il = 0; il < d->n_layer; il++) {
        const el_layer *L = &m->layers[il];
        kv_layer *c = &m->kv[il];
        /* attention block */
        norm_rows(m->xn, m->x, &L->attn_norm, n, E, d->norm_eps);
        invalidate(m);
        mm(m, &L->wq, m->xn, n, m->q);
        mm(m, &L->wk, m->xn, n, m->k);
        mm(m, &L->wv, m->xn, n, m->v);
        add_bias(m->q, &L->bq, n, QD);
        add_bias(m->k, &L->bk, n, KVD);
        add_bias(m->v, &L->bv, n, KVD);
        if (L->q_norm.data) norm_rows(m->q, m->q, &L->q_norm, n * NH, HD, d->norm_eps);
        if (L->k_norm.data) norm_rows(m->k, m->k, &L->k_norm, n * NKV, HD, d->norm_eps);
        for (size_t i = 0; i < n; i++) {
            float *cs = m->cs + i * HD;
            el_rope_cache(cs, (size_t)d->n_rot, m->q_pos[i], L->rope_base, L->rope_scale);
            el_rope_apply(m->q + i * QD, NH, HD, (size_t)d->n_rot, cs, d->rope_neox);
            el_rope_apply(m->k + i * KVD, NKV, HD, (size_t)d->n_rot, cs, d->rope_neox);
        }
        store_kv(m, c, m->k, m->v, n, pos0);
        el_attn_args a = {m->q, n, m->q_pos, NH, NKV, HD, m->kv_type, c->k, c->v, c->pos, (size_t)c->n_slots,
                          L->window, d->attn_scale, m->att, m->attn_scratch};
        el_attention_run(m->pool, &a);
        mm(m, &L->wo, m->att, n, m->o);
        if (L->attn_post_norm.data) norm_rows(m->o, m->o, &L->attn_post_norm, n, E, d->norm_eps);
        el_add(m->x, m->x, m->o, n * E);

        /* feed-forward block */
        norm_rows(m->xn, m->x, &L->ffn_norm, n, E, d->norm_eps);
        invalidate(m);
        mm(m, &L->w_gate, m->xn, n, m->g);
        mm(m, &L->w_up, m->xn, n, m->u);
        if (d->act == EL_ACT_GELU) el_gelu(m->g, n * F);
        else el_silu(m->g, n * F);
        el_mul(m->g, m->g, m->u, n * F);
        invalidate(m);
        mm(m, &L->w_down, m->g, n, m->o);
        if (L->ffn_post_norm.data) norm_rows(m->o, m->o, &L->ffn_post_norm, n, E, d->norm_eps);
        el_add(m->x, m->x, m->o, n * E);
    }

    /* output: only the rows whose logits are wanted */
    const size_t first = all_logits ? 0 : n - 1, rows = all_logits ? n : 1;
    norm_rows(m->xn, m->x + first * E, &d->output_norm, rows, E, d->norm_eps);
    invalidate(m);
    mm(m, d->output.data ? &d->output : &d->tok_embd, m->xn, rows, logits);
    return EL_OK;
}

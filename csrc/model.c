/* model.c - validating a model description (its sizes come from a file), planning its memory and
 * creating the handle: the KV cache and every scratch buffer are allocated here, once. */
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "checked.h"
#include "llamacpp_exact.h"
#include "matmul.h"
#include "model.h"
#include "ops.h"

int el_act_kind(int wtype) {
    switch (el_vec_dot_type(wtype)) {
    case EL_TYPE_Q8_0: return ACT_Q8_0;
    case EL_TYPE_Q8_1: return ACT_Q8_1;
    case EL_TYPE_Q8_K: return ACT_Q8_K;
    default: return ACT_F32;
    }
}

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
    if (d->arch != EL_ARCH_LLAMA && d->arch != EL_ARCH_GEMMA3 && d->arch != EL_ARCH_BERT) return EL_EUNSUPPORTED;
    if (d->n_layer <= 0 || d->n_embd <= 0 || d->n_head <= 0 || d->n_head_kv <= 0 || d->head_dim <= 0 ||
        d->n_ff <= 0 || d->n_vocab <= 0 || d->n_head % d->n_head_kv || d->head_dim > EL_MAX_HEAD_DIM ||
        d->n_rot <= 0 || d->n_rot > d->head_dim || d->n_rot % 2 || !d->layers)
        return EL_EINVAL;
    if (d->n_layer > 4096 || d->n_embd > (1 << 16) || d->n_ff > (1 << 18) || d->n_head > 1024) return EL_EINVAL;
    if (d->non_causal != 0 && d->non_causal != 1) return EL_EINVAL;
    const int bert = d->arch == EL_ARCH_BERT;
    const int64_t E = d->n_embd, Q = (int64_t)d->n_head * d->head_dim, KV = (int64_t)d->n_head_kv * d->head_dim;
    if (!tensor_ok(&d->tok_embd, E, d->n_vocab, 1)) return EL_EINVAL;
    if (bert ? d->output_norm.data || d->output.data : !tensor_ok(&d->output_norm, E, 1, 0)) return EL_EINVAL;
    if (!opt_ok(&d->output, E, d->n_vocab, 1)) return EL_EINVAL;
    /* BERT's input: an embedding LayerNorm (required), a type row and position rows (optional) */
    if (bert != (d->tok_norm.data != NULL) || bert != (d->tok_norm_b.data != NULL)) return EL_EINVAL;
    if (!opt_ok(&d->tok_norm, E, 1, 0) || !opt_ok(&d->tok_norm_b, E, 1, 0)) return EL_EINVAL;
    if (d->type_embd.data && (!bert || d->type_embd.ne1 < 1 || !tensor_ok(&d->type_embd, E, d->type_embd.ne1, 1)))
        return EL_EINVAL;
    if (d->pos_embd.data && (!bert || d->pos_embd.ne1 < 1 || !tensor_ok(&d->pos_embd, E, d->pos_embd.ne1, 1)))
        return EL_EINVAL;
    for (int32_t il = 0; il < d->n_layer; il++) {
        const el_layer *L = &d->layers[il];
        /* BERT's attn_norm / ffn_norm are its post-norms: LayerNorms, so with biases; a gate is optional */
        if (!tensor_ok(&L->attn_norm, E, 1, 0) || !tensor_ok(&L->wq, E, Q, 1) || !tensor_ok(&L->wk, E, KV, 1) ||
            !tensor_ok(&L->wv, E, KV, 1) || !tensor_ok(&L->wo, Q, E, 1) || !tensor_ok(&L->ffn_norm, E, 1, 0) ||
            !(bert ? opt_ok(&L->w_gate, E, d->n_ff, 1) : tensor_ok(&L->w_gate, E, d->n_ff, 1)) ||
            !tensor_ok(&L->w_up, E, d->n_ff, 1) || !tensor_ok(&L->w_down, d->n_ff, E, 1))
            return EL_EINVAL;
        if (bert != (L->attn_norm_b.data != NULL) || bert != (L->ffn_norm_b.data != NULL) ||
            !opt_ok(&L->attn_norm_b, E, 1, 0) || !opt_ok(&L->ffn_norm_b, E, 1, 0))
            return EL_EINVAL;
        if (!opt_ok(&L->bo, E, 1, 0) || !opt_ok(&L->b_up, d->n_ff, 1, 0) || !opt_ok(&L->b_down, E, 1, 0))
            return EL_EINVAL;
        if (!opt_ok(&L->bq, Q, 1, 0) || !opt_ok(&L->bk, KV, 1, 0) || !opt_ok(&L->bv, KV, 1, 0) ||
            !opt_ok(&L->q_norm, d->head_dim, 1, 0) || !opt_ok(&L->k_norm, d->head_dim, 1, 0) ||
            !opt_ok(&L->attn_post_norm, E, 1, 0) || !opt_ok(&L->ffn_post_norm, E, 1, 0))
            return EL_EINVAL;
        if (L->window < 0 || !(L->rope_base > 0.0f) || !(L->rope_scale > 0.0f)) return EL_EINVAL;
        if (!opt_ok(&L->rope_freqs, d->n_rot / 2, 1, 0) || (L->no_rope != 0 && L->no_rope != 1)) return EL_EINVAL;
    }
    /* NaN fails every comparison: each test is written so that it refuses NaN */
    const el_rope_ext *r = &d->rope;
    if (!(r->attn_factor >= 0.0f && r->attn_factor < 1e6f) || !(r->ext_factor >= 0.0f && r->ext_factor <= 1.0f))
        return EL_EINVAL;
    if (r->ext_factor != 0.0f && !(r->n_ctx_orig > 0 && r->beta_fast > 0.0f && r->beta_fast < 1e6f &&
                                   r->beta_slow > 0.0f && r->beta_slow < 1e6f))
        return EL_EINVAL;
    if (!(d->attn_softcap >= 0.0f && d->attn_softcap < 1e30f) || !(d->final_softcap >= 0.0f && d->final_softcap < 1e30f))
        return EL_EINVAL;
    if (d->scale_q != 0 && d->scale_q != 1) return EL_EINVAL;
    return EL_OK;
}

int32_t el_kv_layer_slots(int32_t window, int32_t n_ctx, int32_t n_batch) {
    /* a windowed layer needs its window plus the rest of a batch written before attention */
    if (window > 0 && (int64_t)window + n_batch - 1 < n_ctx) return window + n_batch - 1;
    return n_ctx;
}

/* the weights a layer multiplies by, in the order the pass uses them */
static void layer_matmuls(const el_layer *L, const el_tensor *ws[7]) {
    ws[0] = &L->wq, ws[1] = &L->wk, ws[2] = &L->wv, ws[3] = &L->wo;
    ws[4] = &L->w_gate, ws[5] = &L->w_up, ws[6] = &L->w_down;
}

static size_t max_act(const el_model_desc *d, int kind, size_t n_batch) {
    /* the largest activation block any matmul of this kind consumes */
    size_t best = 0;
    const el_tensor *out = d->output.data ? &d->output : &d->tok_embd;
    if (el_act_kind(out->type) == kind) best = el_act_bytes(out->type, (size_t)out->ne0, n_batch);
    for (int32_t il = 0; il < d->n_layer; il++) {
        const el_tensor *ws[7];
        layer_matmuls(&d->layers[il], ws);
        for (int i = 0; i < 7; i++)
            if (ws[i]->data && el_act_kind(ws[i]->type) == kind) {
                size_t b = el_act_bytes(ws[i]->type, (size_t)ws[i]->ne0, n_batch);
                best = b > best ? b : best;
            }
    }
    return best;
}

static size_t llx_cells(int32_t n_ctx) { return ((size_t)n_ctx + 63) & ~(size_t)63; } /* n_ctx <= 2^24 */

/* The table behind el_model_plan, el_model_create, el_model_numerics_bytes and el_model_set_numerics:
 * one computation of every buffer's size and place, so the plan is the truth. block[0]: bytes of the
 * native block, block[1]: of the llama.cpp numerics' block (offsets start at 0 in each, every buffer
 * on a cache line). Saturating arithmetic (checked.h): SIZE_MAX when a size does not fit size_t. */
static void scratch_table(const el_model_desc *d, int32_t n_ctx, int32_t n_batch, int n_threads,
                          el_span t[SC_COUNT], size_t block[2]) {
    const size_t E = (size_t)d->n_embd, HD = (size_t)d->head_dim, B = (size_t)n_batch;
    const size_t QD = (size_t)d->n_head * HD, KVD = (size_t)d->n_head_kv * HD, F = (size_t)d->n_ff;
    int32_t max_slots = 0;
    for (int32_t il = 0; il < d->n_layer; il++) {
        int32_t s = el_kv_layer_slots(d->layers[il].window, n_ctx, n_batch);
        max_slots = s > max_slots ? s : max_slots;
    }
    t[SC_X].size = el_size_mul3(B, E, 4);
    t[SC_XN].size = el_size_mul3(B, E, 4);
    t[SC_Q].size = el_size_mul3(B, QD, 4);
    t[SC_K].size = el_size_mul3(B, KVD, 4);
    t[SC_V].size = el_size_mul3(B, KVD, 4);
    t[SC_ATT].size = el_size_mul3(B, QD, 4);
    t[SC_O].size = el_size_mul3(B, E > QD ? E : QD, 4);
    t[SC_G].size = el_size_mul3(B, F, 4);
    t[SC_U].size = el_size_mul3(B, F, 4);
    t[SC_CS].size = el_size_mul3(B, HD, 4);
    t[SC_Q_POS].size = t[SC_MASK_POS].size = el_size_mul(B, sizeof(int32_t));
    t[SC_ROW_SEQ].size = t[SC_ROW_TOK].size = t[SC_ROW_SRC].size = el_size_mul(B, sizeof(int32_t));
    t[SC_ENTRIES].size = el_size_mul(B, sizeof(el_batch_entry));
    t[SC_ATTN].size = el_size_mul(
        el_attention_scratch_floats((size_t)max_slots, (size_t)d->n_head, (size_t)d->n_head_kv, HD, n_threads),
        sizeof(float));
    t[SC_GELU].size = d->act == EL_ACT_GELU ? 65536 * sizeof(el_half) : 0;
    for (int k = ACT_Q8_0; k < ACT_KINDS; k++) t[SC_ACT_Q8_0 + k - ACT_Q8_0].size = max_act(d, k, B);
    t[SC_LLX_ATTN].size =
        el_size_mul(el_llx_attn_scratch_floats(llx_cells(n_ctx), HD, n_threads), sizeof(float));
    const int first[2] = {0, SC_NATIVE_END}, end[2] = {SC_NATIVE_END, SC_COUNT};
    for (int b = 0; b < 2; b++) {
        size_t off = 0;
        for (int i = first[b]; i < end[b]; i++) {
            t[i].offset = off;
            off = el_size_add(off, el_size_round64(t[i].size));
        }
        block[b] = off;
    }
}

/* KV cache bytes of the whole model (SIZE_MAX: does not fit size_t) */
static size_t kv_total(const el_model_desc *d, int32_t n_ctx, int32_t n_batch, int kv_type) {
    const size_t slot = el_size_mul(el_kv_row_bytes(kv_type, (size_t)d->head_dim), (size_t)d->n_head_kv);
    const size_t per_slot = el_size_add(el_size_mul(2, slot), sizeof(int32_t)); /* K, V and the position */
    size_t kv = 0;
    for (int32_t il = 0; il < d->n_layer; il++)
        kv = el_size_add(kv, el_size_mul(per_slot, (size_t)el_kv_layer_slots(d->layers[il].window, n_ctx, n_batch)));
    return kv;
}

static int plan(const el_model_desc *d, int32_t n_ctx, int32_t n_batch, int kv_type, int n_threads, int32_t n_seq,
                size_t *kv_bytes, size_t *scratch_bytes) {
    if (!d || n_ctx <= 0 || n_batch <= 0 || n_batch > n_ctx || n_ctx > (1 << 24) || n_threads < 1) return EL_EINVAL;
    if (n_seq < 1 || n_seq > EL_MAX_SEQ) return EL_EINVAL;
    if (kv_type != EL_TYPE_F16 && kv_type != EL_TYPE_Q8_0 && kv_type != EL_TYPE_F32) return EL_EUNSUPPORTED;
    int st = desc_ok(d);
    if (st != EL_OK) return st;
    if (d->pos_embd.data && n_ctx > d->pos_embd.ne1) return EL_ECTX; /* positions past the table */
    if (el_kv_row_bytes(kv_type, (size_t)d->head_dim) == 0) return EL_EINVAL;
    el_span t[SC_COUNT];
    size_t block[2];
    scratch_table(d, n_ctx, n_batch, n_threads, t, block);
    const size_t kv = el_size_mul(kv_total(d, n_ctx, n_batch, kv_type), (size_t)n_seq), total = block[0];
    /* more than this machine's size_t can count (a 32-bit build): refused before any allocation */
    if (!el_size_ok(kv) || !el_size_ok(total) || !el_size_ok(el_size_add(kv, total))) return EL_ENOMEM;
    *kv_bytes = kv;
    *scratch_bytes = total;
    return EL_OK;
}

int el_model_plan_seqs(const el_model_desc *desc, int32_t n_ctx, int32_t n_batch, int kv_type, int n_threads,
                       int32_t n_seq, size_t *kv_bytes, size_t *scratch_bytes) {
    if (!kv_bytes || !scratch_bytes) return EL_EINVAL;
    return plan(desc, n_ctx, n_batch, kv_type, n_threads, n_seq, kv_bytes, scratch_bytes);
}

int el_model_plan(const el_model_desc *desc, int32_t n_ctx, int32_t n_batch, int kv_type, int n_threads,
                  size_t *kv_bytes, size_t *scratch_bytes) {
    return el_model_plan_seqs(desc, n_ctx, n_batch, kv_type, n_threads, 1, kv_bytes, scratch_bytes);
}

int el_model_create(const el_model_desc *desc, el_pool *pool, int32_t n_ctx, int32_t n_batch, int kv_type,
                    el_model **out) {
    return el_model_create_seqs(desc, pool, n_ctx, n_batch, kv_type, 1, out);
}

int el_model_create_seqs(const el_model_desc *desc, el_pool *pool, int32_t n_ctx, int32_t n_batch, int kv_type,
                         int32_t n_seq, el_model **out) {
    if (!pool || !out) return EL_EINVAL;
    size_t kv_total = 0, scratch_total = 0;
    int st = plan(desc, n_ctx, n_batch, kv_type, el_pool_threads(pool), n_seq, &kv_total, &scratch_total);
    if (st != EL_OK) return st;
    el_model *m = calloc(1, sizeof *m);
    if (!m) return EL_ENOMEM;
    m->d = *desc;
    m->pool = pool;
    el_pool_ref(pool); /* the pool outlives the model, even past its owner's el_pool_free */
    m->n_ctx = n_ctx;
    m->n_batch = n_batch;
    m->n_seq = n_seq;
    m->kv_type = kv_type;
    m->ops = el_numerics_ops_of(EL_NUMERICS_NATIVE);
    m->layers = calloc((size_t)desc->n_layer, sizeof *m->layers);
    m->kv = calloc((size_t)n_seq * (size_t)desc->n_layer, sizeof *m->kv);
    if (!m->layers || !m->kv) goto nomem;
    memcpy(m->layers, desc->layers, (size_t)desc->n_layer * sizeof *m->layers);
    m->d.layers = m->layers;

    const size_t slot = el_kv_slot_bytes(m);
    /* one allocation per sequence and layer: a sequence's pages are touched only when it is used */
    for (size_t i = 0; i < (size_t)n_seq * (size_t)desc->n_layer; i++) {
        const int32_t il = (int32_t)(i % (size_t)desc->n_layer);
        kv_layer *c = &m->kv[i];
        c->n_slots = el_kv_layer_slots(m->layers[il].window, n_ctx, n_batch);
        c->ring = c->n_slots < n_ctx;
        /* plan() checked the sum of these products, so none of them wraps */
        c->k = malloc(slot * (size_t)c->n_slots);
        c->v = malloc(slot * (size_t)c->n_slots);
        c->pos = malloc(sizeof(int32_t) * (size_t)c->n_slots);
        if (!c->k || !c->v || !c->pos) goto nomem;
        for (int32_t s = 0; s < c->n_slots; s++) c->pos[s] = -1;
        m->kv_bytes += 2 * slot * (size_t)c->n_slots + sizeof(int32_t) * (size_t)c->n_slots;
    }

    el_span t[SC_COUNT];
    size_t block[2];
    scratch_table(desc, n_ctx, n_batch, el_pool_threads(pool), t, block);
    if (posix_memalign(&m->block, 64, block[0]) != 0) {
        m->block = NULL;
        goto nomem;
    }
    m->scratch_bytes = block[0];
    char *b = m->block;
    m->x = (float *)(b + t[SC_X].offset);
    m->xn = (float *)(b + t[SC_XN].offset);
    m->q = (float *)(b + t[SC_Q].offset);
    m->k = (float *)(b + t[SC_K].offset);
    m->v = (float *)(b + t[SC_V].offset);
    m->att = (float *)(b + t[SC_ATT].offset);
    m->o = (float *)(b + t[SC_O].offset);
    m->g = (float *)(b + t[SC_G].offset);
    m->u = (float *)(b + t[SC_U].offset);
    m->cs = (float *)(b + t[SC_CS].offset);
    m->q_pos = (int32_t *)(b + t[SC_Q_POS].offset);
    m->mask_pos = (int32_t *)(b + t[SC_MASK_POS].offset);
    m->row_seq = (int32_t *)(b + t[SC_ROW_SEQ].offset);
    m->row_tok = (int32_t *)(b + t[SC_ROW_TOK].offset);
    m->row_src = (int32_t *)(b + t[SC_ROW_SRC].offset);
    m->entries = (el_batch_entry *)(b + t[SC_ENTRIES].offset);
    m->attn_scratch = (float *)(b + t[SC_ATTN].offset);
    m->gelu_table = (el_half *)(b + t[SC_GELU].offset);
    if (desc->act == EL_ACT_GELU) el_gelu_table_fill(m->gelu_table);
    for (int k = ACT_Q8_0; k < ACT_KINDS; k++) m->act[k] = b + t[SC_ACT_Q8_0 + k - ACT_Q8_0].offset;
    *out = m;
    return EL_OK;
nomem:
    el_model_free(m);
    return EL_ENOMEM;
}

void el_model_free(el_model *m) {
    if (!m) return;
    if (m->kv)
        for (size_t i = 0; i < (size_t)m->n_seq * (size_t)m->d.n_layer; i++) {
            free(m->kv[i].k);
            free(m->kv[i].v);
            free(m->kv[i].pos);
        }
    free(m->kv);
    free(m->layers);
    free(m->block);
    free(m->llx_block);
    el_lora_free(m);
    if (m->pool) el_pool_unref(m->pool);
    free(m);
}

/* a llama.cpp-order kernel exists for w (Q4_K: only as ggml repacks it, 8 rows at a time), and its
 * activations fit the native SC_ACT_* buffers they are quantized into (same block formats) */
static int llx_weight_ok(const el_tensor *w) {
    const size_t cols = (size_t)w->ne0;
    return el_llx_type_supported(w->type, cols) && !(w->type == EL_TYPE_Q4_K && w->ne1 % 8) &&
           el_llx_act_bytes(w->type, cols, 1) == el_act_bytes(w->type, cols, 1);
}

/* every matmul weight of the model has one */
static int llx_weights_ok(const el_model_desc *d) {
    if (d->arch == EL_ARCH_BERT || d->non_causal) return 0; /* graphs llama.cpp's numerics do not model */
    if (!llx_weight_ok(d->output.data ? &d->output : &d->tok_embd)) return 0;
    for (int32_t il = 0; il < d->n_layer; il++) {
        const el_tensor *ws[7];
        layer_matmuls(&d->layers[il], ws);
        for (int i = 0; i < 7; i++)
            if (!llx_weight_ok(ws[i])) return 0;
    }
    return 1;
}

size_t el_model_numerics_bytes(const el_model_desc *desc, int32_t n_ctx, int32_t n_batch, int n_threads,
                               int numerics) {
    if (!desc || numerics == EL_NUMERICS_NATIVE || !el_numerics_ops_of(numerics) || n_ctx <= 0 || n_batch <= 0 ||
        n_threads < 1 || desc_ok(desc) != EL_OK || !llx_weights_ok(desc))
        return 0;
    el_span t[SC_COUNT];
    size_t block[2];
    scratch_table(desc, n_ctx, n_batch > n_ctx ? n_ctx : n_batch, n_threads, t, block);
    return el_size_ok(block[1]) ? block[1] : 0;
}

static int set_numerics_held(el_model *m, int numerics) {
    const el_numerics_ops *ops = el_numerics_ops_of(numerics);
    if (!ops) return EL_EINVAL;
    if (numerics == EL_NUMERICS_NATIVE) {
        m->ops = ops;
        return EL_OK;
    }
    if (m->kv_type != EL_TYPE_F16 || !llx_weights_ok(&m->d)) return EL_EUNSUPPORTED;
    if (!m->llx_block) {
        el_span t[SC_COUNT];
        size_t block[2];
        scratch_table(&m->d, m->n_ctx, m->n_batch, el_pool_threads(m->pool), t, block);
        if (!el_size_ok(block[1])) return EL_ENOMEM;
        if (posix_memalign(&m->llx_block, 64, block[1]) != 0) {
            m->llx_block = NULL;
            return EL_ENOMEM;
        }
        char *b = m->llx_block;
        m->llx_scratch = (float *)(b + t[SC_LLX_ATTN].offset);
        m->llx_cells = llx_cells(m->n_ctx);
        m->scratch_bytes += block[1];
    }
    m->ops = ops;
    return EL_OK;
}

int el_model_set_numerics(el_model *m, int numerics) {
    const int st = el_model_enter(m);
    return st != EL_OK ? st : el_model_leave(m, set_numerics_held(m, numerics));
}

size_t el_model_kv_bytes(const el_model *m) { return m ? m->kv_bytes : 0; }
int32_t el_model_n_seq(const el_model *m) { return m ? m->n_seq : 0; }
size_t el_model_scratch_bytes(const el_model *m) { return m ? m->scratch_bytes : 0; }

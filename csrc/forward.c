/* forward.c - the forward pass (the decoders: Gemma and the llama family; the BERT encoders) in one
 * call per batch: embeddings, every layer, final norm, logits or hidden states. Reads top to bottom like
 * llama2.c's forward(); weights are read in place from the caller's mapping, all memory was allocated by
 * model.c. */
#include <math.h>
#include <string.h>

#include "attention.h"
#include "dispatch.h"
#include "edgellama.h"
#include "matmul.h"
#include "model.h"
#include "ops.h"

/* ---- the pass ---- */

/* A matmul input: n rows of floats, quantized once where they are produced into the activation
 * format of each kind the matmuls that read them need (float weights read x in place). */
typedef struct {
    const float *x;
    size_t n;
    const void *act[ACT_KINDS]; /* NULL: no matmul on this input reads that kind */
} mm_input;

static mm_input quantize_input(el_model *m, const float *x, size_t n, const el_tensor *const *ws, size_t nw) {
    mm_input in = {x, n, {NULL}};
    for (size_t i = 0; i < nw; i++) {
        const int kind = el_act_kind(ws[i]->type);
        if (kind == ACT_F32 || in.act[kind]) continue;
        /* the weights of one kind read rows of the same length, so one quantization serves them all */
        m->ops->quantize(m->pool, ws[i]->type, x, (size_t)ws[i]->ne0, n, m->act[kind]);
        in.act[kind] = m->act[kind];
    }
    return in;
}

/* y = w in: in was quantized for w's kind by quantize_input */
static void mm(el_model *m, const el_tensor *w, const mm_input *in, float *y) {
    const int kind = el_act_kind(w->type);
    const void *act = kind == ACT_F32 ? (const void *)in->x : in->act[kind];
    m->ops->matmul(m->pool, w->type, w->data, (size_t)w->ne1, (size_t)w->ne0, act, in->n, y, (size_t)w->ne1);
}

/* the LoRA terms of layer il's targets ks[0..n) (weights that read in) into ys, after their matmuls */
static void lora(el_model *m, int32_t il, const int *ks, size_t nk, const mm_input *in, float *const *ys) {
    if (!m->lora_block) return;
    int32_t slots[EL_LORA_GROUP];
    for (size_t i = 0; i < nk; i++) slots[i] = il * EL_LORA_LAYER_TARGETS + ks[i];
    el_lora_mm(m, slots, nk, in->x, in->n, ys);
}

static void norm_rows(float *out, const float *x, const el_tensor *w, size_t n, size_t dim, float eps) {
    el_rmsnorm_rows(out, x, (const float *)w->data, n, dim, eps);
}

/* BERT's post-norm: x = LayerNorm(x + o) with w and its bias b */
static void add_norm(float *x, const float *o, const el_tensor *w, const el_tensor *b, size_t n, size_t dim,
                     float eps) {
    el_add(x, x, o, n * dim);
    el_layernorm_rows(x, x, (const float *)w->data, (const float *)b->data, n, dim, eps);
}

static void add_bias(float *y, const el_tensor *b, size_t n, size_t dim) {
    if (!b->data) return;
    for (size_t i = 0; i < n; i++) el_add(y + i * dim, y + i * dim, (const float *)b->data, dim);
}

/* g = act(g) * u (u NULL: g = act(g), an FFN without a gate), row by row over the pool: element-wise,
 * so the split cannot change a bit */
typedef struct { el_model *m; size_t F; const float *u; } glu_task;

static void glu_row(void *p, size_t i, size_t n) {
    const glu_task *t = p;
    float *g = t->m->g + i * t->F;
    if (!t->u) {
        if (t->m->d.act == EL_ACT_GELU) el_kern()->gelu_lut(g, t->F, t->m->gelu_table);
        else el_silu(g, t->F);
    } else if (t->m->d.act == EL_ACT_GELU) {
        el_kern()->gelu_lut(g, t->F, t->m->gelu_table);
        el_mul(g, g, t->u + i * t->F, t->F);
    } else {
        t->m->ops->swiglu(g, t->u + i * t->F, t->F);
    }
    (void)n;
}

static void glu(el_model *m, size_t n, size_t F, const float *u) {
    glu_task t = {m, F, u};
    if (n == 1) glu_row(&t, 0, 1);
    else el_pool_for(m->pool, n, glu_row, &t);
}

/* A checked batch grouped by sequence: row r of the pass is entry row_src[r], of sequence row_seq[r];
 * rows of one sequence are consecutive and keep their entry order (a stable counting sort), so each
 * sequence's attention reads one run of q rows. Every other step of the pass works row by row, so
 * the order of the rows changes no bit. */
static int group_rows(el_model *m, const el_batch_entry *b, size_t n, size_t *n_want) {
    int32_t cnt[EL_MAX_SEQ + 1];
    memset(cnt, 0, sizeof cnt);
    *n_want = 0;
    for (size_t i = 0; i < n; i++) {
        if (b[i].seq < 0 || b[i].seq >= m->n_seq || b[i].token < 0 || b[i].token >= m->d.n_vocab) return EL_EINVAL;
        cnt[b[i].seq + 1]++;
        *n_want += b[i].logits != 0;
    }
    int n_seqs_present = 0;
    for (int32_t s = 0; s < m->n_seq; s++) n_seqs_present += cnt[s + 1] > 0;
    if (n_seqs_present > 1 && m->ops != el_numerics_ops_of(EL_NUMERICS_NATIVE)) return EL_EUNSUPPORTED;
    for (int32_t s = 0; s < m->n_seq; s++) cnt[s + 1] += cnt[s]; /* cnt[s]: first row of sequence s */
    int32_t next_pos[EL_MAX_SEQ];
    for (int32_t s = 0; s < m->n_seq; s++) {
        next_pos[s] = cnt[s + 1] > cnt[s] ? el_kv_n_past(m, s) : 0;
        /* non-causal: a token sees the later ones, so a sequence cannot be continued by another batch */
        if (m->d.non_causal && next_pos[s] != 0) return EL_ECTX;
    }
    for (size_t i = 0; i < n; i++) {
        const int32_t s = b[i].seq, r = cnt[s]++;
        /* a sequence's entries continue its cache, one position each, within the context */
        if (b[i].pos != next_pos[s] || b[i].pos >= m->n_ctx) return EL_ECTX;
        next_pos[s]++;
        m->row_seq[r] = s, m->row_tok[r] = b[i].token, m->row_src[r] = (int32_t)i, m->q_pos[r] = b[i].pos;
    }
    /* the position each row masks by: its own (causal), or its sequence's last (it sees them all) */
    for (size_t r = 0; r < n; r++) m->mask_pos[r] = m->d.non_causal ? next_pos[m->row_seq[r]] - 1 : m->q_pos[r];
    return EL_OK;
}

/* moves the wanted rows (of width dim) to the front, keeping their order: row k is the k-th wanted */
static void compact_rows(float *x, const el_batch_entry *b, const int32_t *src, size_t n, size_t dim) {
    size_t k = 0;
    for (size_t r = 0; r < n; r++)
        if (b[src[r]].logits) {
            if (k != r) memcpy(x + k * dim, x + r * dim, dim * sizeof(float));
            k++;
        }
}

/* BERT's input row i: token, type 0 and position embeddings summed, into x (xn: scratch) */
static void bert_input(el_model *m, size_t n) {
    const el_model_desc *d = &m->d;
    const size_t E = (size_t)d->n_embd;
    for (size_t i = 0; i < n; i++) {
        float *x = m->x + i * E, *t = m->xn + i * E;
        if (d->type_embd.data) {
            el_get_type_traits(d->type_embd.type)->to_float(d->type_embd.data, t, E);
            el_add(x, x, t, E);
        }
        if (d->pos_embd.data) {
            const size_t prow = el_row_bytes(d->pos_embd.type, E);
            el_get_type_traits(d->pos_embd.type)->to_float((const char *)d->pos_embd.data + (size_t)m->q_pos[i] * prow,
                                                            t, E);
            el_add(x, t, x, E);
        }
    }
    el_layernorm_rows(m->x, m->x, (const float *)d->tok_norm.data, (const float *)d->tok_norm_b.data, n, E,
                      d->norm_eps);
}

/* logits != NULL: the logits of the wanted entries; else embd: their hidden states (n_embd each) */
static int decode(el_model *m, const el_batch_entry *batch, size_t n, float *logits, float *embd) {
    if (!batch || n == 0 || n > (size_t)m->n_batch) return EL_EINVAL;
    size_t n_want = 0;
    const int gst = group_rows(m, batch, n, &n_want);
    if (gst != EL_OK) return gst;
    const el_model_desc *d = &m->d;
    const int bert = d->arch == EL_ARCH_BERT;
    if (n_want && logits && bert) return EL_EUNSUPPORTED; /* an encoder has no output head */
    if (n_want && !logits && !embd) return EL_EINVAL;
    const size_t E = (size_t)d->n_embd, HD = (size_t)d->head_dim, NH = (size_t)d->n_head;
    const size_t NKV = (size_t)d->n_head_kv, F = (size_t)d->n_ff, QD = NH * HD, KVD = NKV * HD;

    /* each row's sequence, for its LoRA scales (follows the rows through the compaction below) */
    if (m->lora_block) memcpy(m->lora_seq, m->row_seq, n * sizeof(int32_t));

    /* embeddings */
    const el_type_traits *te = el_get_type_traits(d->tok_embd.type);
    const size_t erow = el_row_bytes(d->tok_embd.type, E);
    for (size_t i = 0; i < n; i++) {
        te->to_float((const char *)d->tok_embd.data + (size_t)m->row_tok[i] * erow, m->x + i * E, E);
        if (d->emb_scale != 1.0f) el_scale(m->x + i * E, d->emb_scale, E);
    }
    if (bert) bert_input(m, n);

    for (int32_t il = 0; il < d->n_layer; il++) {
        const el_layer *L = &m->layers[il];
        /* attention block (BERT: on the layer's input itself, its norms come after) */
        if (!bert) norm_rows(m->xn, m->x, &L->attn_norm, n, E, d->norm_eps);
        const el_tensor *qkv[3] = {&L->wq, &L->wk, &L->wv};
        const mm_input xn = quantize_input(m, bert ? m->x : m->xn, n, qkv, 3);
        mm(m, &L->wq, &xn, m->q);
        mm(m, &L->wk, &xn, m->k);
        mm(m, &L->wv, &xn, m->v);
        lora(m, il, (const int[]){EL_LORA_WQ, EL_LORA_WK, EL_LORA_WV}, 3, &xn, (float *const[]){m->q, m->k, m->v});
        add_bias(m->q, &L->bq, n, QD);
        add_bias(m->k, &L->bk, n, KVD);
        add_bias(m->v, &L->bv, n, KVD);
        if (L->q_norm.data) norm_rows(m->q, m->q, &L->q_norm, n * NH, HD, d->norm_eps);
        if (L->k_norm.data) norm_rows(m->k, m->k, &L->k_norm, n * NKV, HD, d->norm_eps);
        const el_rope_args rope = el_rope_init(d, L, 1);
        for (size_t i = 0; i < n && !L->no_rope; i++) {
            float *cs = m->cs + i * HD;
            el_rope_cache(cs, (size_t)d->n_rot, m->q_pos[i], &rope);
            const int fused = m->ops->rope_fused;
            el_rope_apply(m->q + i * QD, NH, HD, (size_t)d->n_rot, cs, d->rope_neox, fused);
            el_rope_apply(m->k + i * KVD, NKV, HD, (size_t)d->n_rot, cs, d->rope_neox, fused);
        }
        /* where llama.cpp's graph scales (Q, or each score): the same math, another rounding */
        if (d->scale_q) el_scale(m->q, d->attn_scale, n * QD);
        const float score_scale = d->scale_q ? 1.0f : d->attn_scale;
        /* per sequence: its new keys into its cache, its queries over its cache only */
        el_attn_args args[EL_MAX_SEQ];
        const kv_layer *caches[EL_MAX_SEQ];
        size_t na = 0;
        for (size_t r0 = 0, r1; r0 < n; r0 = r1) {
            const int32_t seq = m->row_seq[r0];
            for (r1 = r0 + 1; r1 < n && m->row_seq[r1] == seq; r1++) {}
            kv_layer *c = &el_seq_kv(m, seq)[il];
            el_kv_store(m, c, m->k + r0 * KVD, m->v + r0 * KVD, r1 - r0, m->q_pos[r0]);
            args[na] = (el_attn_args){m->q + r0 * QD, r1 - r0, m->mask_pos + r0, NH, NKV, HD, m->kv_type, c->k, c->v,
                                      c->pos, (size_t)c->n_used, L->window, score_scale, d->attn_softcap,
                                      m->att + r0 * QD,
                                      m->attn_scratch};
            caches[na++] = c;
        }
        if (m->ops->attention_seqs) m->ops->attention_seqs(m, args, na);
        else
            for (size_t i = 0; i < na; i++) m->ops->attention(m, caches[i], &args[i]);
        const el_tensor *wo = &L->wo;
        const mm_input att = quantize_input(m, m->att, n, &wo, 1);
        mm(m, wo, &att, m->o);
        lora(m, il, (const int[]){EL_LORA_WO}, 1, &att, &m->o);
        add_bias(m->o, &L->bo, n, E);
        /* past the last attention only the rows whose logits are wanted matter; llama.cpp drops the
         * others here too, so the rest of the layer runs on the same batch sizes as there */
        size_t nr = n;
        if (il == d->n_layer - 1 && n_want < n) {
            if (n_want == 0) return EL_OK; /* the caches hold the batch: nothing more to compute */
            compact_rows(m->x, batch, m->row_src, n, E);
            compact_rows(m->o, batch, m->row_src, n, E);
            if (m->lora_block)
                for (size_t r = 0, k = 0; r < n; r++)
                    if (batch[m->row_src[r]].logits) m->lora_seq[k++] = m->row_seq[r];
            nr = n_want;
        }
        if (L->attn_post_norm.data) norm_rows(m->o, m->o, &L->attn_post_norm, nr, E, d->norm_eps);
        if (bert) add_norm(m->x, m->o, &L->attn_norm, &L->attn_norm_b, nr, E, d->norm_eps);
        else el_add(m->x, m->x, m->o, nr * E);

        /* feed-forward block: act(gate) * up, or act(up) without a gate (BERT) */
        if (!bert) norm_rows(m->xn, m->x, &L->ffn_norm, nr, E, d->norm_eps);
        const float *ffn_in = bert ? m->x : m->xn;
        const el_tensor *down = &L->w_down;
        if (L->w_gate.data) {
            const el_tensor *gate_up[2] = {&L->w_gate, &L->w_up};
            const mm_input xf = quantize_input(m, ffn_in, nr, gate_up, 2);
            mm(m, &L->w_gate, &xf, m->g);
            mm(m, &L->w_up, &xf, m->u);
            lora(m, il, (const int[]){EL_LORA_W_GATE, EL_LORA_W_UP}, 2, &xf, (float *const[]){m->g, m->u});
            add_bias(m->u, &L->b_up, nr, F);
            glu(m, nr, F, m->u);
        } else {
            const el_tensor *up = &L->w_up;
            const mm_input xf = quantize_input(m, ffn_in, nr, &up, 1);
            mm(m, up, &xf, m->g);
            lora(m, il, (const int[]){EL_LORA_W_UP}, 1, &xf, &m->g);
            add_bias(m->g, &L->b_up, nr, F);
            glu(m, nr, F, NULL);
        }
        const mm_input gu = quantize_input(m, m->g, nr, &down, 1);
        mm(m, down, &gu, m->o);
        lora(m, il, (const int[]){EL_LORA_W_DOWN}, 1, &gu, &m->o);
        add_bias(m->o, &L->b_down, nr, E);
        if (L->ffn_post_norm.data) norm_rows(m->o, m->o, &L->ffn_post_norm, nr, E, d->norm_eps);
        if (bert) add_norm(m->x, m->o, &L->ffn_norm, &L->ffn_norm_b, nr, E, d->norm_eps);
        else el_add(m->x, m->x, m->o, nr * E);
    }

    /* output: the wanted rows, put back in entry order (the caller's rows), one matmul for all */
    if (bert) memcpy(m->o, m->x, n_want * E * sizeof(float));
    else norm_rows(m->o, m->x, &d->output_norm, n_want, E, d->norm_eps);
    int32_t *rank = m->row_tok; /* the tokens were read: now each entry's rank among the wanted ones */
    for (size_t i = 0, k = 0; i < n; i++) rank[i] = batch[i].logits ? (int32_t)k++ : -1;
    float *rows = logits ? m->xn : embd;
    for (size_t r = 0, k = 0; r < n; r++)
        if (rank[m->row_src[r]] >= 0) memcpy(rows + (size_t)rank[m->row_src[r]] * E, m->o + k++ * E, E * sizeof(float));
    if (!logits) return EL_OK;
    if (m->lora_block)
        for (size_t i = 0; i < n; i++)
            if (rank[i] >= 0) m->lora_seq[rank[i]] = batch[i].seq;
    const el_tensor *out = d->output.data ? &d->output : &d->tok_embd;
    const mm_input xo = quantize_input(m, m->xn, n_want, &out, 1);
    mm(m, out, &xo, logits);
    if (m->lora_block) {
        const int32_t head = d->n_layer * EL_LORA_LAYER_TARGETS;
        el_lora_mm(m, &head, 1, xo.x, xo.n, &logits);
    }
    if (d->final_softcap > 0.0f) {
        for (size_t i = 0; i < n_want * (size_t)d->n_vocab; i++) logits[i] = el_softcap(logits[i], d->final_softcap);
    }
    return EL_OK;
}

int el_model_decode(el_model *m, const el_batch_entry *batch, size_t n, float *logits) {
    const int st = el_model_enter(m);
    return st != EL_OK ? st : el_model_leave(m, decode(m, batch, n, logits, NULL));
}

int el_model_decode_embd(el_model *m, const el_batch_entry *batch, size_t n, float *embd) {
    const int st = el_model_enter(m);
    return st != EL_OK ? st : el_model_leave(m, decode(m, batch, n, NULL, embd));
}

/* the single-sequence form: n entries of sequence 0 at pos0.. */
static int eval(el_model *m, const int32_t *tokens, size_t n, int32_t pos0, float *logits, int all_logits) {
    if (!tokens || !logits || n == 0 || n > (size_t)m->n_batch || pos0 < 0) return EL_EINVAL;
    if ((int64_t)pos0 + (int64_t)n > m->n_ctx) return EL_ECTX;
    /* a batch that does not continue the cached sequence would attend to stale or missing keys */
    if (pos0 != el_kv_n_past(m, 0)) return EL_ECTX;
    el_batch_entry *b = m->entries;
    for (size_t i = 0; i < n; i++) b[i] = (el_batch_entry){0, tokens[i], pos0 + (int32_t)i, all_logits || i == n - 1};
    return decode(m, b, n, logits, NULL);
}

int el_model_eval(el_model *m, const int32_t *tokens, size_t n, int32_t pos0, float *logits, int all_logits) {
    const int st = el_model_enter(m);
    return st != EL_OK ? st : el_model_leave(m, eval(m, tokens, n, pos0, logits, all_logits));
}

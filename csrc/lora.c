/* lora.c - LoRA adapters at run time: attach, per-sequence scales, and the apply kernel.
 *
 * Order of the float operations, in both numerics modes (llama.cpp's graph does the same steps:
 * mul_mat(A), mul_mat(B), scale, add, adapter by adapter): y = W x first (the base matmul of the
 * mode), then for each adapter in index order t = A x (F32 dots), d = B t (F32 dots), y = y + (s * d)
 * with s = factor * the sequence's scale (llama.cpp: user_scale * alpha / rank in one float, so s
 * may differ from it in the last bit).
 * The dots are this library's F32 kernels, not ggml's: llama.cpp's bits are promised for the base
 * model only, an adapter's term agrees to float rounding. */
#include "lora.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "checked.h"
#include "dispatch.h"
#include "edgellama.h"
#include "matmul.h"
#include "model.h"

/* ---- the kernel ---- */

typedef struct {
    const float *t, *b, *s;
    size_t n, rank, n_out, ldy;
    float *y;
    float (*dot)(size_t n, const float *a, const float *b);
} lora_b_task;

enum { LORA_B_ROWS = 64, LORA_POOL_MIN = 65536 }; /* output rows per pool item; pool from this many MACs */

static void lora_b_item(void *p, size_t i, size_t n_items) {
    const lora_b_task *k = p;
    const size_t o0 = i * LORA_B_ROWS, o1 = o0 + LORA_B_ROWS < k->n_out ? o0 + LORA_B_ROWS : k->n_out;
    for (size_t v = 0; v < k->n; v++) {
        const float s = k->s[v];
        if (s == 0.0f) continue;
        const float *tv = k->t + v * k->rank;
        float *yv = k->y + v * k->ldy;
        for (size_t o = o0; o < o1; o++) {
            const float d = k->dot(k->rank, tv, k->b + o * k->rank);
            yv[o] = yv[o] + s * d;
        }
    }
    (void)n_items;
}

void el_lora_apply(el_pool *pool, const float *x, size_t n, size_t n_in, const float *a, const float *b,
                   size_t rank, size_t n_out, const float *s, float *t, float *y, size_t ldy) {
    size_t live = 0;
    for (size_t v = 0; v < n; v++) live += s[v] != 0.0f;
    if (!live) return;
    /* t[v][k] = A[k] . x[v]: the F32 matmul reads the floats in place */
    el_matmul_act(pool, EL_TYPE_F32, a, rank, n_in, x, n, t, rank);
    lora_b_task k = {t, b, s, n, rank, n_out, ldy, y, el_kern()->dot_f32};
    const size_t n_items = (n_out + LORA_B_ROWS - 1) / LORA_B_ROWS;
    /* a decode step's term is a few tens of thousands of multiply-adds: waking the workers would cost more */
    if (!pool || n_items == 1 || n * n_out * rank < LORA_POOL_MIN) {
        for (size_t i = 0; i < n_items; i++) lora_b_item(&k, i, n_items);
    } else {
        el_pool_for(pool, n_items, lora_b_item, &k);
    }
}

void el_lora_mm(el_model *m, int32_t slot, const float *x, size_t n, float *y, size_t ldy) {
    const el_lora_list *l = &m->lora[slot];
    for (int32_t i = 0; i < l->n; i++) {
        const el_lora_term *tm = &l->terms[i];
        const float *sc = m->lora_scale + (size_t)tm->adapter * (size_t)m->n_seq;
        for (size_t v = 0; v < n; v++) m->lora_rs[v] = tm->factor * sc[m->lora_seq[v]];
        const el_tensor *w = el_lora_weight(m, slot);
        el_lora_apply(m->pool, x, n, (size_t)w->ne0, tm->a, tm->b, (size_t)tm->rank, (size_t)w->ne1, m->lora_rs,
                      m->lora_t, y, ldy);
    }
}

/* ---- attaching ---- */

static size_t lora_block_bytes(size_t n_batch, size_t rank, size_t offs[3]) {
    const size_t sz[3] = {el_size_mul3(n_batch, rank, sizeof(float)), el_size_mul(n_batch, sizeof(float)),
                          el_size_mul(n_batch, sizeof(int32_t))};
    size_t off = 0;
    for (int i = 0; i < 3; i++) {
        offs[i] = off;
        off = el_size_add(off, el_size_round64(sz[i]));
    }
    return off;
}

size_t el_model_lora_bytes(int32_t n_batch, int32_t max_rank) {
    if (n_batch <= 0 || max_rank <= 0 || max_rank > EL_MAX_LORA_RANK) return 0;
    size_t offs[3];
    const size_t b = lora_block_bytes((size_t)n_batch, (size_t)max_rank, offs);
    return el_size_ok(b) ? b : 0;
}

const el_tensor *el_lora_weight(const el_model *m, int32_t slot) {
    const int32_t nl = m->d.n_layer;
    if (slot == nl * EL_LORA_LAYER_TARGETS) return m->d.output.data ? &m->d.output : &m->d.tok_embd;
    const el_layer *L = &m->layers[slot / EL_LORA_LAYER_TARGETS];
    const el_tensor *ws[EL_LORA_LAYER_TARGETS] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
    return ws[slot % EL_LORA_LAYER_TARGETS];
}

/* the model's adapter tables and a scratch for rank `rank` (grown, never shrunk) */
static int lora_reserve(el_model *m, int32_t rank) {
    const size_t n_slots = (size_t)m->d.n_layer * EL_LORA_LAYER_TARGETS + 1;
    if (!m->lora) {
        m->lora = calloc(n_slots, sizeof *m->lora);
        m->lora_scale = calloc((size_t)EL_MAX_LORA * (size_t)m->n_seq, sizeof(float));
        if (!m->lora || !m->lora_scale) {
            free(m->lora), free(m->lora_scale);
            m->lora = NULL, m->lora_scale = NULL;
            return EL_ENOMEM;
        }
    }
    if (rank <= m->lora_rank_cap) return EL_OK;
    size_t offs[3];
    const size_t bytes = lora_block_bytes((size_t)m->n_batch, (size_t)rank, offs);
    void *blk = NULL;
    if (!el_size_ok(bytes) || posix_memalign(&blk, 64, bytes) != 0) return EL_ENOMEM;
    free(m->lora_block);
    m->scratch_bytes = m->scratch_bytes - m->lora_bytes + bytes;
    m->lora_block = blk, m->lora_bytes = bytes, m->lora_rank_cap = rank;
    m->lora_t = (float *)((char *)blk + offs[0]);
    m->lora_rs = (float *)((char *)blk + offs[1]);
    m->lora_seq = (int32_t *)((char *)blk + offs[2]);
    return EL_OK;
}

static int attach_held(el_model *m, int32_t adapter, int32_t layer, int target, const float *a, const float *b,
                       int32_t rank, int64_t n_in, int64_t n_out, float factor) {
    if (adapter < 0 || adapter >= EL_MAX_LORA || !a || !b || rank <= 0 || rank > EL_MAX_LORA_RANK) return EL_EINVAL;
    if (!isfinite(factor)) return EL_EINVAL;
    int32_t slot;
    if (target == EL_LORA_OUTPUT) slot = m->d.n_layer * EL_LORA_LAYER_TARGETS;
    else if (target >= 0 && target < EL_LORA_LAYER_TARGETS && layer >= 0 && layer < m->d.n_layer)
        slot = layer * EL_LORA_LAYER_TARGETS + target;
    else return EL_EINVAL;
    const el_tensor *w = el_lora_weight(m, slot);
    if (n_in != w->ne0 || n_out != w->ne1) return EL_EINVAL;
    int st = lora_reserve(m, rank);
    if (st != EL_OK) return st;
    el_lora_list *l = &m->lora[slot];
    int32_t at = 0;
    while (at < l->n && l->terms[at].adapter < adapter) at++;
    if (at < l->n && l->terms[at].adapter == adapter) return EL_EINVAL; /* one term per adapter and weight */
    el_lora_term *grown = realloc(l->terms, (size_t)(l->n + 1) * sizeof *grown);
    if (!grown) return EL_ENOMEM;
    l->terms = grown;
    memmove(l->terms + at + 1, l->terms + at, (size_t)(l->n - at) * sizeof *l->terms);
    l->terms[at] = (el_lora_term){adapter, rank, factor, a, b};
    l->n++;
    return EL_OK;
}

int el_model_lora_attach(el_model *m, int32_t adapter, int32_t layer, int target, const float *a, const float *b,
                         int32_t rank, int64_t n_in, int64_t n_out, float factor) {
    const int st = el_model_enter(m);
    return st != EL_OK ? st
                       : el_model_leave(m, attach_held(m, adapter, layer, target, a, b, rank, n_in, n_out, factor));
}

static int scale_held(el_model *m, int32_t adapter, int32_t seq, float scale) {
    if (adapter < 0 || adapter >= EL_MAX_LORA || seq < -1 || seq >= m->n_seq || !isfinite(scale)) return EL_EINVAL;
    if (!m->lora) {
        if (scale == 0.0f) return EL_OK; /* nothing attached: every scale is 0 already */
        const int st = lora_reserve(m, 0);
        if (st != EL_OK) return st;
    }
    float *sc = m->lora_scale + (size_t)adapter * (size_t)m->n_seq;
    for (int32_t s = seq < 0 ? 0 : seq; s < (seq < 0 ? m->n_seq : seq + 1); s++) sc[s] = scale;
    return EL_OK;
}

int el_model_lora_scale(el_model *m, int32_t adapter, int32_t seq, float scale) {
    const int st = el_model_enter(m);
    return st != EL_OK ? st : el_model_leave(m, scale_held(m, adapter, seq, scale));
}

void el_lora_free(el_model *m) {
    if (m->lora)
        for (size_t i = 0; i < (size_t)m->d.n_layer * EL_LORA_LAYER_TARGETS + 1; i++) free(m->lora[i].terms);
    free(m->lora);
    free(m->lora_scale);
    free(m->lora_block);
    m->scratch_bytes -= m->lora_bytes;
    m->lora = NULL, m->lora_scale = NULL, m->lora_block = NULL;
    m->lora_bytes = 0, m->lora_rank_cap = 0;
}

int el_model_lora_clear(el_model *m) {
    const int st = el_model_enter(m);
    if (st != EL_OK) return st;
    el_lora_free(m);
    return el_model_leave(m, EL_OK);
}

/* lora.c - LoRA adapters at run time: attach, per-sequence scales, and the apply kernel.
 *
 * Order of the float operations, in both numerics modes (llama.cpp's graph does the same steps:
 * mul_mat(A), mul_mat(B), scale, add, adapter by adapter): y = W x first (the base matmul of the
 * mode), then for each adapter in index order t = A x (float dots over F32 or F16 rows), d = B t (per
 * output, fused multiply-adds over the rank in ascending order), y = y + (s * d) with s = factor * the
 * sequence's scale (llama.cpp: user_scale * alpha / rank in one float, so s may differ from it in the
 * last bit).
 * The kernels are this library's, not ggml's: llama.cpp's bits are promised for the base model only,
 * an adapter's term agrees to float rounding. */
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

/* Decode passes (a row or a few) are where an adapter costs: its matrices are read once per pass like
 * the weights, and for a small model they are a fifth of the weights' bytes (rank 16 on SmolLM2-135M,
 * F32). Both products are split over the pool then, in items small enough for every thread to
 * stream its share; a prefill's product with A goes through the matmul's tiling instead. */
enum {
    LORA_A_ROWS = 4,      /* rank rows per item of t = A x for a few rows */
    LORA_SMALL_N = 4,     /* up to this many rows: items of LORA_A_ROWS (group_a_item), else el_matmul_act */
    LORA_B_ROWS = 64,     /* output rows per item of B t */
    LORA_POOL_MIN = 4096, /* multiply-adds from which a product is worth the pool's hand-off */
};

/* d = B t for LORA_B_ROWS outputs at a time, from B^T (rank x n_out) by the vecmat kernels: each
 * output is one chain of fused multiply-adds over k ascending, the same bits for any batch, thread
 * count, item split or ISA, and an F16 B^T gives the bits of its values as F32. (A row-major B would
 * be n_out dots of length rank, each mostly loop set-up and a horizontal sum: that was most of an
 * adapter's decode cost.) */
typedef struct {
    float *t; /* n x rank: t = x A^T, written by the A phase */
    const float *s;
    const void *bt;
    size_t n, rank, n_out, ldy;
    float *y;
    void (*vecmat)(size_t rank, size_t m, const float *t, const float *b, size_t ld, float *d);     /* F32 */
    void (*vecmat_h)(size_t rank, size_t m, const float *t, const el_half *b, size_t ld, float *d); /* F16 */
} lora_b_task;

static void lora_b_item(void *p, size_t i, size_t n_items) {
    const lora_b_task *k = p;
    const size_t o0 = i * LORA_B_ROWS, m = o0 + LORA_B_ROWS < k->n_out ? LORA_B_ROWS : k->n_out - o0;
    float d[LORA_B_ROWS];
    for (size_t v = 0; v < k->n; v++) {
        const float s = k->s[v];
        if (s == 0.0f) continue;
        const float *tv = k->t + v * k->rank;
        if (k->vecmat_h) k->vecmat_h(k->rank, m, tv, (const el_half *)k->bt + o0, k->n_out, d);
        else k->vecmat(k->rank, m, tv, (const float *)k->bt + o0, k->n_out, d);
        float *yv = k->y + v * k->ldy + o0;
        for (size_t o = 0; o < m; o++) yv[o] = yv[o] + s * d[o];
    }
    (void)n_items;
}

/* One term's product within a group: the weights of a group read the same input, so their terms
 * (one adapter at a time) share each phase's hand-off to the pool: two per group and adapter. */
typedef struct {
    el_vec_dot_fn dot;
    int a_type;
    const char *a;
    size_t a_row, n_in;
    lora_b_task b;    /* t, s, bt, n, rank, n_out, ldy, y and the vecmat of B^T's type */
    size_t a_items, b_items, macs_a, macs_b; /* 0 items: no live row */
} lora_job;

typedef struct {
    lora_job *jobs;
    size_t n_jobs;
    const float *x;
} lora_group;

/* rank rows [r0, r1) of one job's t for every row of x: one vec_dot each, as el_matmul_act computes them */
static void group_a_item(void *p, size_t i, size_t n_items) {
    const lora_group *g = p;
    size_t j = 0;
    while (i >= g->jobs[j].a_items) i -= g->jobs[j++].a_items;
    const lora_job *jb = &g->jobs[j];
    const size_t rank = jb->b.rank, r0 = i * LORA_A_ROWS, r1 = r0 + LORA_A_ROWS < rank ? r0 + LORA_A_ROWS : rank;
    for (size_t v = 0; v < jb->b.n; v++)
        for (size_t r = r0; r < r1; r++)
            jb->b.t[v * rank + r] = jb->dot(jb->n_in, jb->a + r * jb->a_row, g->x + v * jb->n_in);
    (void)n_items;
}

static void group_b_item(void *p, size_t i, size_t n_items) {
    const lora_group *g = p;
    size_t j = 0;
    while (i >= g->jobs[j].b_items) i -= g->jobs[j++].b_items;
    lora_b_item(&g->jobs[j].b, i, n_items);
}

static void run_items(el_pool *pool, size_t n_items, size_t macs, el_item_fn fn, void *ctx) {
    if (!n_items) return;
    if (!pool || n_items == 1 || macs < LORA_POOL_MIN) {
        for (size_t i = 0; i < n_items; i++) fn(ctx, i, n_items);
    } else {
        el_pool_for(pool, n_items, fn, ctx);
    }
}

static lora_job make_job(size_t n, size_t n_in, int a_type, const void *a, int b_type,
                         const void *bt, size_t rank, size_t n_out, const float *s, float *t, float *y, size_t ldy) {
    const el_kernels *kern = el_kern();
    size_t live = 0;
    for (size_t v = 0; v < n; v++) live += s[v] != 0.0f;
    const lora_b_task b = {t, s, bt, n, rank, n_out, ldy, y, kern->vecmat_f32,
                           b_type == EL_TYPE_F16 ? kern->vecmat_f16 : NULL};
    lora_job jb = {kern->vec_dot[a_type], a_type, a, el_row_bytes(a_type, n_in), n_in, b, 0, 0, n * rank * n_in,
                   live * n_out * rank};
    if (live) {
        jb.a_items = (rank + LORA_A_ROWS - 1) / LORA_A_ROWS;
        jb.b_items = (n_out + LORA_B_ROWS - 1) / LORA_B_ROWS;
    }
    return jb;
}

/* both phases of the jobs (all on the n rows of x) */
static void run_group(el_pool *pool, const float *x, size_t n, lora_job *jobs, size_t n_jobs) {
    lora_group g = {jobs, n_jobs, x};
    size_t items = 0, macs = 0;
    for (size_t j = 0; j < n_jobs; j++) items += jobs[j].a_items, macs += jobs[j].a_items ? jobs[j].macs_a : 0;
    /* t[v][k] = A[k] . x[v]: F32 / F16 rows with float activations read in place; a prefill's through
     * the matmul's tiling (the same vec_dot per output, so the same bits) */
    if (n <= LORA_SMALL_N) {
        run_items(pool, items, macs, group_a_item, &g);
    } else {
        for (size_t j = 0; j < n_jobs; j++)
            if (jobs[j].a_items)
                el_matmul_act(pool, jobs[j].a_type, jobs[j].a, jobs[j].b.rank, jobs[j].n_in, x, n, jobs[j].b.t,
                              jobs[j].b.rank);
    }
    items = 0, macs = 0;
    for (size_t j = 0; j < n_jobs; j++) items += jobs[j].b_items, macs += jobs[j].macs_b;
    run_items(pool, items, macs, group_b_item, &g);
}

void el_lora_apply(el_pool *pool, const float *x, size_t n, size_t n_in, int a_type, const void *a, int b_type,
                   const void *bt, size_t rank, size_t n_out, const float *s, float *t, float *y, size_t ldy) {
    lora_job jb = make_job(n, n_in, a_type, a, b_type, bt, rank, n_out, s, t, y, ldy);
    run_group(pool, x, n, &jb, 1);
}

void el_lora_mm(el_model *m, const int32_t *slots, size_t n_slots, const float *x, size_t n, float *const *ys) {
    lora_job jobs[EL_LORA_GROUP];
    int32_t at[EL_LORA_GROUP] = {0};
    if (n_slots > EL_LORA_GROUP) n_slots = EL_LORA_GROUP; /* forward.c's groups are at most this large */
    for (;;) { /* adapter by adapter, in index order: each slot's terms are sorted by adapter */
        int32_t next = EL_MAX_LORA;
        for (size_t j = 0; j < n_slots; j++) {
            const el_lora_list *l = &m->lora[slots[j]];
            if (at[j] < l->n && l->terms[at[j]].adapter < next) next = l->terms[at[j]].adapter;
        }
        if (next == EL_MAX_LORA) return;
        size_t nj = 0;
        for (size_t j = 0; j < n_slots; j++) {
            const el_lora_list *l = &m->lora[slots[j]];
            if (at[j] >= l->n || l->terms[at[j]].adapter != next) continue;
            const el_lora_term *tm = &l->terms[at[j]++];
            const float *sc = m->lora_scale + (size_t)tm->adapter * (size_t)m->n_seq;
            float *rs = m->lora_rs + nj * (size_t)m->n_batch;
            for (size_t v = 0; v < n; v++) rs[v] = tm->factor * sc[m->lora_seq[v]];
            const el_tensor *w = el_lora_weight(m, slots[j]);
            float *t = m->lora_t + nj * (size_t)m->n_batch * (size_t)m->lora_rank_cap;
            jobs[nj++] = make_job(n, (size_t)w->ne0, tm->a_type, tm->a, tm->b_type, tm->bt, (size_t)tm->rank,
                                  (size_t)w->ne1, rs, t, ys[j], (size_t)w->ne1);
        }
        run_group(m->pool, x, n, jobs, nj);
    }
}

/* ---- attaching ---- */

static size_t lora_block_bytes(size_t n_batch, size_t rank, size_t offs[3]) {
    const size_t sz[3] = {el_size_mul3(n_batch, rank, EL_LORA_GROUP * sizeof(float)),
                          el_size_mul(n_batch, EL_LORA_GROUP * sizeof(float)), el_size_mul(n_batch, sizeof(int32_t))};
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

static int lora_type_ok(int type) { return type == EL_TYPE_F32 || type == EL_TYPE_F16; }

static int attach_held(el_model *m, int32_t adapter, int32_t layer, int target, int a_type, const void *a,
                       int b_type, const void *bt, int32_t rank, int64_t n_in, int64_t n_out, float factor) {
    if (adapter < 0 || adapter >= EL_MAX_LORA || !a || !bt || rank <= 0 || rank > EL_MAX_LORA_RANK) return EL_EINVAL;
    if (!lora_type_ok(a_type) || !lora_type_ok(b_type)) return EL_EINVAL;
    if (!isfinite(factor)) return EL_EINVAL;
    int32_t slot;
    if (target == EL_LORA_OUTPUT) slot = m->d.n_layer * EL_LORA_LAYER_TARGETS;
    else if (target >= 0 && target < EL_LORA_LAYER_TARGETS && layer >= 0 && layer < m->d.n_layer)
        slot = layer * EL_LORA_LAYER_TARGETS + target;
    else return EL_EINVAL;
    const el_tensor *w = el_lora_weight(m, slot);
    if (!w->data || n_in != w->ne0 || n_out != w->ne1) return EL_EINVAL; /* no such weight (BERT's gate) */
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
    l->terms[at] = (el_lora_term){adapter, rank, factor, a_type, b_type, a, bt};
    l->n++;
    return EL_OK;
}

int el_model_lora_attach_typed(el_model *m, int32_t adapter, int32_t layer, int target, int a_type, const void *a,
                               int b_type, const void *bt, int32_t rank, int64_t n_in, int64_t n_out, float factor) {
    const int st = el_model_enter(m);
    return st != EL_OK ? st
                       : el_model_leave(m, attach_held(m, adapter, layer, target, a_type, a, b_type, bt, rank, n_in,
                                                       n_out, factor));
}

int el_model_lora_attach(el_model *m, int32_t adapter, int32_t layer, int target, const float *a, const float *bt,
                         int32_t rank, int64_t n_in, int64_t n_out, float factor) {
    return el_model_lora_attach_typed(m, adapter, layer, target, EL_TYPE_F32, a, EL_TYPE_F32, bt, rank, n_in, n_out,
                                      factor);
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

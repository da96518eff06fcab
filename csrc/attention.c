/* attention.c - softmax(q k^T * scale) v for grouped-query heads over cached keys and values
 * stored as F16 (default), Q8_0 or F32.
 *
 * The slots a query sees are cut, in slot order, into fixed chunks of EL_ATTN_CHUNK. For one query,
 * one KV head and one chunk, a partial softmax is formed for all the query heads sharing that KV
 * head (each key and value row is read once for the group): its maximum m, its sum l of exp(s - m)
 * and its output o = sum exp(s - m) v. The partials of a (query, KV head) are then merged in chunk
 * order. The chunking depends on the cache contents only, so the result is the same whichever
 * thread computes which partial: decode (one query) spreads the chunks of a long cache over the
 * threads, prefill spreads the queries. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "checked.h"
#include "dispatch.h"
#include "edgellama.h"
#include "ops.h"

#define EL_ATTN_CHUNK 128

size_t el_kv_row_bytes(int kv_type, size_t head_dim) { return el_row_bytes(kv_type, head_dim); }

static size_t n_chunks(size_t n) { return (n + EL_ATTN_CHUNK - 1) / EL_ATTN_CHUNK; }

/* one partial: m[g], l[g], o[g * hd] */
static size_t part_floats(size_t group, size_t hd) { return group * (hd + 2); }

/* per worker: scores (chunk x group), q in the cache's dot format (group x hd), a dequantized row,
 * the visible slots of one query (n_kv) */
static size_t worker_floats(size_t n_kv, size_t group, size_t hd) {
    return EL_ATTN_CHUNK * group + group * hd + hd + n_kv + 64;
}

/* Counts, partials and visible slots for 2 * n_threads (query, KV head) pairs:
 * prefill uses one pair per thread at a time, decode (fewer pairs than 2 * n_threads) holds every
 * chunk of every pair at once. SIZE_MAX (checked.h) when the count does not fit size_t; once it
 * does, every offset el_attention_run takes into the scratch is below it. */
size_t el_attention_scratch_floats(size_t n_kv, size_t n_head, size_t n_head_kv, size_t head_dim, int n_threads) {
    const size_t group = n_head_kv ? n_head / n_head_kv : 1, nth = n_threads > 0 ? (size_t)n_threads : 1;
    const size_t nc = n_chunks(n_kv) ? n_chunks(n_kv) : 1;
    const size_t part = el_size_mul(group, el_size_add(head_dim, 2));
    const size_t worker = el_size_add(el_size_add(el_size_mul(EL_ATTN_CHUNK + head_dim, group), head_dim),
                                      el_size_add(n_kv, 64));
    const size_t per_pair = el_size_add(el_size_add(2, el_size_mul(nc, part)), n_kv);
    return el_size_add(el_size_mul3(2, nth, per_pair), el_size_mul(nth, worker));
}

typedef struct {
    const el_attn_args *a;
    size_t group, hd, row, slot, pf;
    float *parts;     /* partials */
    float *workers;   /* worker_floats() per ith */
    int split;        /* 1: an item is (pair, chunk); 0: an item is a pair, all its chunks in turn */
    int32_t *vis;     /* split: visible slots of query i at vis + i * n_kv */
    size_t *n_vis;    /* split: how many */
    size_t n_items;
} attn_ctx;

/* the slots query iq sees, in slot order; the chunks are runs of EL_ATTN_CHUNK of them, so they
 * depend on the cache contents only and the work they carry is even (a ring's window is not) */
static size_t visible_slots(const el_attn_args *a, size_t iq, int32_t *idx) {
    const int32_t qp = a->q_pos[iq];
    size_t n = 0;
    for (size_t j = 0; j < a->n_kv; j++) {
        const int32_t kp = a->kv_pos[j];
        if (kp >= 0 && kp <= qp && !(a->window > 0 && qp - kp >= a->window)) idx[n++] = (int32_t)j;
    }
    return n;
}

/* the partial of query iq, KV head hk over the n slots idx (1 <= n <= EL_ATTN_CHUNK), into part */
static void chunk_partial(const attn_ctx *x, float *wk, size_t iq, size_t hk, const int32_t *idx, size_t n,
                          float *part) {
    const el_attn_args *a = x->a;
    const el_kernels *K = el_kern();
    const size_t g = x->group, hd = x->hd;
    float *s = wk, *qbuf = s + EL_ATTN_CHUNK * g, *vtmp = qbuf + g * hd;
    float *m = part, *l = part + g, *o = part + 2 * g;

    const float *q = a->q + (iq * a->n_head + hk * g) * hd;
    const char *kb = (const char *)a->k + hk * x->row, *vb = (const char *)a->v + hk * x->row;
    /* llama.cpp multiplies f32 q with f16 (or q8_0) keys by first converting q to that format */
    if (a->kv_type == EL_TYPE_F16) {
        K->round_f16(g * hd, q, qbuf);
        /* qbuf holds f16-exact values: the f32 x f16 dot is then exactly the f16 x f16 one */
        K->attn_qk_f16(hd, g, qbuf, kb, x->slot, idx, n, s);
    } else if (a->kv_type == EL_TYPE_Q8_0) {
        const size_t qrow = el_row_bytes(EL_TYPE_Q8_0, hd);
        for (size_t h = 0; h < g; h++) K->quantize_act[EL_TYPE_Q8_0](q + h * hd, (char *)qbuf + h * qrow, hd);
        for (size_t t = 0; t < n; t++)
            for (size_t h = 0; h < g; h++)
                s[t * g + h] = K->vec_dot[EL_TYPE_Q8_0](hd, kb + (size_t)idx[t] * x->slot, (char *)qbuf + h * qrow);
    } else {
        for (size_t t = 0; t < n; t++)
            for (size_t h = 0; h < g; h++)
                s[t * g + h] = K->dot_f32(hd, q + h * hd, (const float *)(kb + (size_t)idx[t] * x->slot));
    }

    for (size_t i = 0; i < n * g; i++) s[i] *= a->scale;
    if (a->softcap > 0.0f)
        for (size_t i = 0; i < n * g; i++) s[i] = el_softcap(s[i], a->softcap);
    for (size_t h = 0; h < g; h++) {
        float mx = -INFINITY;
        for (size_t t = 0; t < n; t++) mx = s[t * g + h] > mx ? s[t * g + h] : mx;
        double sum = 0.0;
        for (size_t t = 0; t < n; t++) {
            const float e = expf(s[t * g + h] - mx);
            s[t * g + h] = e;
            sum += (double)e;
        }
        m[h] = mx, l[h] = (float)sum;
    }

    memset(o, 0, g * hd * sizeof(float));
    if (a->kv_type == EL_TYPE_F16) {
        K->attn_pv_f16(hd, g, s, vb, x->slot, idx, n, o);
    } else {
        for (size_t t = 0; t < n; t++) {
            const char *vr = vb + (size_t)idx[t] * x->slot;
            const float *vf = (const float *)vr;
            if (a->kv_type == EL_TYPE_Q8_0) {
                el_get_type_traits(EL_TYPE_Q8_0)->to_float(vr, vtmp, hd);
                vf = vtmp;
            }
            for (size_t h = 0; h < g; h++) K->axpy_f32(hd, s[t * g + h], vf, o + h * hd);
        }
    }
}

/* out rows of query iq, KV head hk from its nc partials (pf floats apart), merged in chunk order */
static void merge(const attn_ctx *x, const float *parts, size_t nc, size_t iq, size_t hk) {
    const el_attn_args *a = x->a;
    const size_t g = x->group, hd = x->hd;
    for (size_t h = 0; h < g; h++) {
        float *out = a->out + (iq * a->n_head + hk * g + h) * hd;
        memset(out, 0, hd * sizeof(float));
        if (nc == 0) continue; /* nothing visible: zero output */
        float mx = -INFINITY;
        for (size_t c = 0; c < nc; c++) mx = parts[c * x->pf + h] > mx ? parts[c * x->pf + h] : mx;
        double sum = 0.0;
        for (size_t c = 0; c < nc; c++) {
            const float *p = parts + c * x->pf;
            const float w = expf(p[h] - mx);
            sum += (double)p[g + h] * w;
            const float *o = p + 2 * g + h * hd;
            for (size_t d = 0; d < hd; d++) out[d] += w * o[d];
        }
        const float inv = (float)(1.0 / sum);
        for (size_t d = 0; d < hd; d++) out[d] *= inv;
    }
}

/* split mode: item w -> (pair, chunk); items run pair by pair over each pair's chunks */
static size_t item_pair(const attn_ctx *x, size_t w, size_t *chunk) {
    const size_t nkv = x->a->n_head_kv;
    for (size_t pair = 0;; pair++) {
        const size_t nc = n_chunks(x->n_vis[pair / nkv]);
        if (w < nc) {
            *chunk = w;
            return pair;
        }
        w -= nc;
    }
}

/* split mode: partials of pair p start at item_base(p) */
static size_t item_base(const attn_ctx *x, size_t pair) {
    size_t b = 0;
    for (size_t p = 0; p < pair; p++) b += n_chunks(x->n_vis[p / x->a->n_head_kv]);
    return b;
}

/* one (query, KV head) pair w whole, its chunks in turn, then their merge (non-split mode) */
static void pair_run(const attn_ctx *x, float *wk, float *mine, size_t w) {
    const el_attn_args *a = x->a;
    int32_t *idx = (int32_t *)(wk + EL_ATTN_CHUNK * x->group + x->group * x->hd + x->hd);
    const size_t iq = w / a->n_head_kv, hk = w % a->n_head_kv;
    const size_t nv = visible_slots(a, iq, idx), nc = n_chunks(nv);
    for (size_t c = 0; c < nc; c++) {
        const size_t c0 = c * EL_ATTN_CHUNK, n = nv - c0 < EL_ATTN_CHUNK ? nv - c0 : EL_ATTN_CHUNK;
        chunk_partial(x, wk, iq, hk, idx + c0, n, mine + c * x->pf);
    }
    merge(x, mine, nc, iq, hk);
}

static void attn_run(void *p, int ith, int nth) {
    const attn_ctx *x = p;
    const el_attn_args *a = x->a;
    float *wk = x->workers + (size_t)ith * worker_floats(a->n_kv, x->group, x->hd);
    size_t w0, w1;
    if (x->split) {
        el_split(x->n_items, ith, nth, &w0, &w1);
        for (size_t w = w0; w < w1; w++) {
            size_t c;
            const size_t pair = item_pair(x, w, &c), iq = pair / a->n_head_kv, nv = x->n_vis[iq];
            const size_t c0 = c * EL_ATTN_CHUNK, n = nv - c0 < EL_ATTN_CHUNK ? nv - c0 : EL_ATTN_CHUNK;
            chunk_partial(x, wk, iq, pair % a->n_head_kv, x->vis + iq * a->n_kv + c0, n, x->parts + w * x->pf);
        }
        return;
    }
    float *mine = x->parts + (size_t)ith * (n_chunks(a->n_kv) ? n_chunks(a->n_kv) : 1) * x->pf;
    el_split(a->n_q * a->n_head_kv, ith, nth, &w0, &w1);
    for (size_t w = w0; w < w1; w++) pair_run(x, wk, mine, w);
}

void el_attention_run(el_pool *pool, const el_attn_args *a) {
    const int nth = pool ? el_pool_threads(pool) : 1;
    const size_t group = a->n_head / a->n_head_kv, row = el_kv_row_bytes(a->kv_type, a->head_dim);
    const size_t pairs = a->n_q * a->n_head_kv, pf = part_floats(group, a->head_dim);
    const size_t ncmax = n_chunks(a->n_kv) ? n_chunks(a->n_kv) : 1;
    attn_ctx x = {a, group, a->head_dim, row, row * a->n_head_kv, pf, NULL, NULL, 0, NULL, NULL, 0};
    float *sp = a->scratch; /* the counts first: the scratch start is aligned for them */
    x.n_vis = (size_t *)(void *)sp, sp += 2 * (size_t)nth * 2;
    x.parts = sp, sp += 2 * (size_t)nth * ncmax * pf;
    x.vis = (int32_t *)sp, sp += 2 * (size_t)nth * a->n_kv;
    x.workers = sp;
    /* few pairs (decode): spread each pair's chunks over the threads */
    x.split = pairs < 2 * (size_t)nth && ncmax > 1;
    if (x.split) {
        for (size_t iq = 0; iq < a->n_q; iq++) {
            x.n_vis[iq] = visible_slots(a, iq, x.vis + iq * a->n_kv);
            x.n_items += n_chunks(x.n_vis[iq]) * a->n_head_kv;
        }
    }
    const size_t work = x.split ? x.n_items : pairs;
    if (pool && work > 1) el_pool_run(pool, attn_run, &x);
    else if (work > 0) attn_run(&x, 0, 1);
    if (x.split)
        for (size_t pair = 0; pair < pairs; pair++) {
            const size_t iq = pair / a->n_head_kv;
            merge(&x, x.parts + item_base(&x, pair) * pf, n_chunks(x.n_vis[iq]), iq, pair % a->n_head_kv);
        }
}

/* Several sequences' attention (same layer: same heads and cache type), one pool run for all their
 * (query, KV head) pairs when they are enough to busy the threads, each pair as el_attention_run's
 * non-split mode computes it: the same bits as one el_attention_run per sequence, with one wake-up
 * of the pool instead of n. The scratch is the one of a cache of the largest n_kv among them. */
typedef struct {
    const el_attn_args *a;
    size_t n, total, n_kv_max, ncmax;
    float *parts, *workers;
} seqs_ctx;

static void seqs_run(void *p, int ith, int nth) {
    const seqs_ctx *m = p;
    const el_attn_args *a0 = m->a;
    const size_t group = a0->n_head / a0->n_head_kv, hd = a0->head_dim, row = el_kv_row_bytes(a0->kv_type, hd);
    float *wk = m->workers + (size_t)ith * worker_floats(m->n_kv_max, group, hd);
    float *mine = m->parts + (size_t)ith * m->ncmax * part_floats(group, hd);
    size_t w0, w1;
    el_split(m->total, ith, nth, &w0, &w1);
    size_t ai = 0, base = 0; /* the sequence of item w0, and its first item */
    for (size_t w = w0; w < w1; w++) {
        while (w - base >= m->a[ai].n_q * m->a[ai].n_head_kv) base += m->a[ai].n_q * m->a[ai].n_head_kv, ai++;
        const attn_ctx x = {&m->a[ai], group, hd, row, row * a0->n_head_kv, part_floats(group, hd), mine, wk, 0,
                            NULL, NULL, 0};
        pair_run(&x, wk, mine, w - base);
    }
}

void el_attention_run_seqs(el_pool *pool, const el_attn_args *a, size_t n) {
    const int nth = pool ? el_pool_threads(pool) : 1;
    size_t total = 0, n_kv_max = 0;
    for (size_t i = 0; i < n; i++) {
        total += a[i].n_q * a[i].n_head_kv;
        n_kv_max = a[i].n_kv > n_kv_max ? a[i].n_kv : n_kv_max;
    }
    if (n == 1 || !pool || total < 2 * (size_t)nth) { /* few pairs: each sequence spreads its chunks */
        for (size_t i = 0; i < n; i++) el_attention_run(pool, &a[i]);
        return;
    }
    /* the scratch as el_attention_run lays it out for a cache of n_kv_max */
    const size_t group = a[0].n_head / a[0].n_head_kv, pf = part_floats(group, a[0].head_dim);
    const size_t ncmax = n_chunks(n_kv_max) ? n_chunks(n_kv_max) : 1;
    float *sp = a[0].scratch + 2 * (size_t)nth * 2;
    seqs_ctx m = {a, n, total, n_kv_max, ncmax, sp, NULL};
    sp += 2 * (size_t)nth * ncmax * pf;
    sp += 2 * (size_t)nth * n_kv_max;
    m.workers = sp;
    el_pool_run(pool, seqs_run, &m);
}

int el_attention(const float *q, size_t n_q, const int32_t *q_pos, size_t n_head, size_t n_head_kv,
                 size_t head_dim, int kv_type, const void *k, const void *v, const int32_t *kv_pos,
                 size_t n_kv, int32_t window, float scale, float *out) {
    if (!q || !q_pos || !k || !v || !kv_pos || !out || n_q == 0 || n_head == 0 || n_head_kv == 0 ||
        head_dim == 0 || n_head % n_head_kv || window < 0)
        return EL_EINVAL;
    if (kv_type != EL_TYPE_F32 && kv_type != EL_TYPE_F16 && kv_type != EL_TYPE_Q8_0) return EL_EUNSUPPORTED;
    if (el_kv_row_bytes(kv_type, head_dim) == 0) return EL_EINVAL;
    const size_t bytes = el_size_mul(el_attention_scratch_floats(n_kv, n_head, n_head_kv, head_dim, 1), sizeof(float));
    float *scratch = el_size_ok(bytes) ? malloc(bytes) : NULL;
    if (!scratch) return EL_ENOMEM;
    el_attn_args a = {q, n_q, q_pos, n_head, n_head_kv, head_dim, kv_type, k, v, kv_pos, n_kv,
                      window, scale, 0.0f, out, scratch};
    el_attention_run(NULL, &a);
    free(scratch);
    return EL_OK;
}

/* attention.c - softmax(q k^T * scale) v for grouped-query heads over cached keys and values
 * stored as F16 (default), Q8_0 or F32.
 *
 * The keys are cut into fixed chunks of EL_ATTN_CHUNK slots. For one query, one KV head and one
 * chunk, a partial softmax is formed for all the query heads sharing that KV head (each key and
 * value row is read once for the group): its maximum m, its sum l of exp(s - m) and its output
 * o = sum exp(s - m) v. The partials of a (query, KV head) are then merged in chunk order. Since the
 * chunking is fixed, the result is the same whichever thread computes which partial: decode
 * (one query) spreads the chunks of a long cache over the threads, prefill spreads the queries. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "dispatch.h"
#include "edgellama.h"

#define EL_ATTN_CHUNK 256

size_t el_kv_row_bytes(int kv_type, size_t head_dim) { return el_row_bytes(kv_type, head_dim); }

static size_t n_chunks(size_t n_kv) { return n_kv ? (n_kv + EL_ATTN_CHUNK - 1) / EL_ATTN_CHUNK : 1; }

/* one partial: m[g], l[g], o[g * hd] */
static size_t part_floats(size_t group, size_t hd) { return group * (hd + 2); }

/* per worker: scores (chunk x group), q in the cache's dot format (group x hd), a dequantized row,
 * the visible slots of a chunk */
static size_t worker_floats(size_t group, size_t hd) {
    return EL_ATTN_CHUNK * group + group * hd + hd + EL_ATTN_CHUNK + 64;
}

/* Partials for 2 * n_threads (query, KV head) pairs: prefill uses one pair per thread at a time,
 * decode (fewer pairs than 2 * n_threads) holds every chunk of every pair at once. */
size_t el_attention_scratch_floats(size_t n_kv, size_t n_head, size_t n_head_kv, size_t head_dim, int n_threads) {
    const size_t group = n_head_kv ? n_head / n_head_kv : 1, nth = n_threads > 0 ? (size_t)n_threads : 1;
    return 2 * nth * n_chunks(n_kv) * part_floats(group, head_dim) + nth * worker_floats(group, head_dim);
}

typedef struct {
    const el_attn_args *a;
    size_t group, hd, nc, row, slot;
    float *parts;   /* partials, indexed by (pair slot, chunk) */
    float *workers; /* worker_floats() per ith */
    int split;      /* 1: an item is (pair, chunk); 0: an item is a pair, all its chunks in turn */
} attn_ctx;

static int visible(const el_attn_args *a, int32_t kp, int32_t qp) {
    return kp >= 0 && kp <= qp && !(a->window > 0 && qp - kp >= a->window);
}

/* the partial of query iq, KV head hk, chunk c for the group's heads, into part */
static void chunk_partial(const attn_ctx *x, float *wk, size_t iq, size_t hk, size_t c, float *part) {
    const el_attn_args *a = x->a;
    const el_kernels *K = el_kern();
    const size_t g = x->group, hd = x->hd;
    float *s = wk, *qbuf = s + EL_ATTN_CHUNK * g, *vtmp = qbuf + g * hd;
    int32_t *idx = (int32_t *)(vtmp + hd);
    float *m = part, *l = part + g, *o = part + 2 * g;
    const int32_t qp = a->q_pos[iq];
    const size_t j0 = c * EL_ATTN_CHUNK, j1 = j0 + EL_ATTN_CHUNK < a->n_kv ? j0 + EL_ATTN_CHUNK : a->n_kv;
    size_t n = 0;
    for (size_t j = j0; j < j1; j++)
        if (visible(a, a->kv_pos[j], qp)) idx[n++] = (int32_t)j;
    for (size_t h = 0; h < g; h++) m[h] = -INFINITY, l[h] = 0.0f;
    if (n == 0) return; /* m = -inf marks an empty partial; its o is never read */

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

/* out rows of query iq, KV head hk from its nc partials (stride part_floats apart), in chunk order */
static void merge(const attn_ctx *x, const float *parts, size_t iq, size_t hk) {
    const el_attn_args *a = x->a;
    const size_t g = x->group, hd = x->hd, pf = part_floats(g, hd);
    for (size_t h = 0; h < g; h++) {
        float *out = a->out + (iq * a->n_head + hk * g + h) * hd;
        float mx = -INFINITY;
        for (size_t c = 0; c < x->nc; c++) mx = parts[c * pf + h] > mx ? parts[c * pf + h] : mx;
        memset(out, 0, hd * sizeof(float));
        if (mx == -INFINITY) continue; /* nothing visible: zero output */
        double sum = 0.0;
        for (size_t c = 0; c < x->nc; c++) {
            const float *p = parts + c * pf;
            if (p[h] == -INFINITY) continue;
            const float w = expf(p[h] - mx);
            sum += (double)p[g + h] * w;
            const float *o = p + 2 * g + h * hd;
            for (size_t d = 0; d < hd; d++) out[d] += w * o[d];
        }
        const float inv = (float)(1.0 / sum);
        for (size_t d = 0; d < hd; d++) out[d] *= inv;
    }
}

static void attn_run(void *p, int ith, int nth) {
    const attn_ctx *x = p;
    const el_attn_args *a = x->a;
    const size_t pf = part_floats(x->group, x->hd), pairs = a->n_q * a->n_head_kv;
    float *wk = x->workers + (size_t)ith * worker_floats(x->group, x->hd);
    size_t w0, w1;
    if (x->split) { /* item = (pair, chunk): partial slot = item */
        el_split(pairs * x->nc, ith, nth, &w0, &w1);
        for (size_t w = w0; w < w1; w++) {
            const size_t pair = w / x->nc, c = w % x->nc;
            chunk_partial(x, wk, pair / a->n_head_kv, pair % a->n_head_kv, c, x->parts + w * pf);
        }
        return;
    }
    float *mine = x->parts + (size_t)ith * x->nc * pf;
    el_split(pairs, ith, nth, &w0, &w1);
    for (size_t w = w0; w < w1; w++) {
        const size_t iq = w / a->n_head_kv, hk = w % a->n_head_kv;
        for (size_t c = 0; c < x->nc; c++) chunk_partial(x, wk, iq, hk, c, mine + c * pf);
        merge(x, mine, iq, hk);
    }
}

void el_attention_run(el_pool *pool, const el_attn_args *a) {
    const int nth = pool ? el_pool_threads(pool) : 1;
    const size_t group = a->n_head / a->n_head_kv, row = el_kv_row_bytes(a->kv_type, a->head_dim);
    attn_ctx x = {a, group, a->head_dim, n_chunks(a->n_kv), row, row * a->n_head_kv, NULL, NULL, 0};
    const size_t pairs = a->n_q * a->n_head_kv;
    x.split = x.nc > 1 && pairs < 2 * (size_t)nth;
    x.parts = a->scratch;
    x.workers = a->scratch + 2 * (size_t)nth * x.nc * part_floats(group, a->head_dim);
    if (pool && (x.split ? pairs * x.nc : pairs) > 1) el_pool_run(pool, attn_run, &x);
    else attn_run(&x, 0, 1);
    if (x.split) {
        const size_t pf = part_floats(group, a->head_dim);
        for (size_t pair = 0; pair < pairs; pair++)
            merge(&x, x.parts + pair * x.nc * pf, pair / a->n_head_kv, pair % a->n_head_kv);
    }
}

int el_attention(const float *q, size_t n_q, const int32_t *q_pos, size_t n_head, size_t n_head_kv,
                 size_t head_dim, int kv_type, const void *k, const void *v, const int32_t *kv_pos,
                 size_t n_kv, int32_t window, float scale, float *out) {
    if (!q || !q_pos || !k || !v || !kv_pos || !out || n_q == 0 || n_head == 0 || n_head_kv == 0 ||
        head_dim == 0 || n_head % n_head_kv || window < 0)
        return EL_EINVAL;
    if (kv_type != EL_TYPE_F32 && kv_type != EL_TYPE_F16 && kv_type != EL_TYPE_Q8_0) return EL_EUNSUPPORTED;
    if (el_kv_row_bytes(kv_type, head_dim) == 0) return EL_EINVAL;
    float *scratch = malloc(el_attention_scratch_floats(n_kv, n_head, n_head_kv, head_dim, 1) * sizeof(float));
    if (!scratch) return EL_ENOMEM;
    el_attn_args a = {q, n_q, q_pos, n_head, n_head_kv, head_dim, kv_type, k, v, kv_pos, n_kv,
                      window, scale, out, scratch};
    el_attention_run(NULL, &a);
    free(scratch);
    return EL_OK;
}

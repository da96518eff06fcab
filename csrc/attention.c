/* attention.c - softmax(q k^T * scale) v for grouped-query heads over cached keys and values
 * stored as F16 (default), Q8_0 or F32. Work is split over (query, head) pairs, each computed by
 * one thread in a fixed order, so the thread count does not change the result. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "attention.h"
#include "dispatch.h"
#include "edgellama.h"

size_t el_kv_row_bytes(int kv_type, size_t head_dim) { return el_row_bytes(kv_type, head_dim); }

/* per thread: scores (n_kv), q in cache format (head_dim floats is the largest), v row (head_dim) */
size_t el_attention_scratch_floats(size_t n_kv, size_t head_dim, int n_threads) {
    return (size_t)n_threads * (n_kv + 2 * head_dim + 16);
}

static void attn_run(void *p, int ith, int nth) {
    const el_attn_args *a = p;
    const el_kernels *K = el_kern();
    const size_t hd = a->head_dim, group = a->n_head / a->n_head_kv;
    const size_t row = el_kv_row_bytes(a->kv_type, hd), slot = row * a->n_head_kv;
    float *scores = a->scratch + (size_t)ith * (a->n_kv + 2 * hd + 16);
    float *qbuf = scores + a->n_kv;  /* q converted to the cache's dot format */
    float *vtmp = qbuf + hd + 8;
    size_t w0, w1;
    el_split(a->n_q * a->n_head, ith, nth, &w0, &w1);
    for (size_t w = w0; w < w1; w++) {
        const size_t iq = w / a->n_head, h = w % a->n_head, hk = h / group;
        const float *q = a->q + (iq * a->n_head + h) * hd;
        const int32_t qp = a->q_pos[iq];
        /* llama.cpp multiplies f32 q with f16 (or q8_0) keys by first converting q to that format */
        if (a->kv_type == EL_TYPE_F16)
            for (size_t i = 0; i < hd; i++) qbuf[i] = el_fp16_to_fp32(el_fp32_to_fp16(q[i]));
        else if (a->kv_type == EL_TYPE_Q8_0)
            K->quantize_act[EL_TYPE_Q8_0](q, qbuf, hd);
        float mx = -INFINITY;
        for (size_t j = 0; j < a->n_kv; j++) {
            const int32_t kp = a->kv_pos[j];
            if (kp < 0 || kp > qp || (a->window > 0 && qp - kp >= a->window)) {
                scores[j] = -INFINITY;
                continue;
            }
            const char *kr = (const char *)a->k + j * slot + hk * row;
            float s;
            if (a->kv_type == EL_TYPE_F16) {
                /* qbuf holds f16-exact values: the f32 x f16 dot is then exactly the f16 x f16 one */
                s = K->dot_f32_f16(hd, qbuf, (const el_half *)kr);
            } else if (a->kv_type == EL_TYPE_Q8_0) {
                s = K->vec_dot[EL_TYPE_Q8_0](hd, kr, qbuf);
            } else {
                s = K->dot_f32(hd, q, (const float *)kr);
            }
            s *= a->scale;
            scores[j] = s;
            if (s > mx) mx = s;
        }
        float *o = a->out + (iq * a->n_head + h) * hd;
        memset(o, 0, hd * sizeof(float));
        if (mx == -INFINITY) continue; /* nothing visible: zero output */
        double sum = 0.0;
        for (size_t j = 0; j < a->n_kv; j++) {
            const float e = scores[j] == -INFINITY ? 0.0f : expf(scores[j] - mx);
            scores[j] = e;
            sum += (double)e;
        }
        const float inv = (float)(1.0 / sum);
        for (size_t j = 0; j < a->n_kv; j++) {
            if (scores[j] == 0.0f) continue;
            const float pj = scores[j] * inv;
            const char *vr = (const char *)a->v + j * slot + hk * row;
            if (a->kv_type == EL_TYPE_F16) {
                K->axpy_f16(hd, pj, (const el_half *)vr, o);
            } else if (a->kv_type == EL_TYPE_Q8_0) {
                el_get_type_traits(EL_TYPE_Q8_0)->to_float(vr, vtmp, hd);
                K->axpy_f32(hd, pj, vtmp, o);
            } else {
                K->axpy_f32(hd, pj, (const float *)vr, o);
            }
        }
    }
}

void el_attention_run(el_pool *pool, const el_attn_args *a) {
    if (pool && a->n_q * a->n_head > 1) el_pool_run(pool, attn_run, (void *)a);
    else attn_run((void *)a, 0, 1);
}

int el_attention(const float *q, size_t n_q, const int32_t *q_pos, size_t n_head, size_t n_head_kv,
                 size_t head_dim, int kv_type, const void *k, const void *v, const int32_t *kv_pos,
                 size_t n_kv, int32_t window, float scale, float *out) {
    if (!q || !q_pos || !k || !v || !kv_pos || !out || n_q == 0 || n_head == 0 || n_head_kv == 0 ||
        head_dim == 0 || n_head % n_head_kv || window < 0)
        return EL_EINVAL;
    if (kv_type != EL_TYPE_F32 && kv_type != EL_TYPE_F16 && kv_type != EL_TYPE_Q8_0) return EL_EUNSUPPORTED;
    if (el_kv_row_bytes(kv_type, head_dim) == 0) return EL_EINVAL;
    float *scratch = malloc(el_attention_scratch_floats(n_kv, head_dim, 1) * sizeof(float));
    if (!scratch) return EL_ENOMEM;
    el_attn_args a = {q, n_q, q_pos, n_head, n_head_kv, head_dim, kv_type, k, v, kv_pos, n_kv,
                      window, scale, out, scratch};
    el_attention_run(NULL, &a);
    free(scratch);
    return EL_OK;
}

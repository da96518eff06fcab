/* kv_cache.c - the KV cache's operations: storing new entries, rewinding, the streaming shift
 * (drop the oldest tokens after the first n_keep, re-rotate the keys that move) and the state
 * blob behind session save/restore. None of these allocate. */
#include <string.h>

#include "attention.h"
#include "checked.h"
#include "dispatch.h"
#include "model.h"
#include "ops.h"
#include "quants.h"

size_t el_kv_slot_bytes(const el_model *m) {
    return el_kv_row_bytes(m->kv_type, (size_t)m->d.head_dim) * (size_t)m->d.n_head_kv;
}

void el_kv_store(el_model *m, kv_layer *c, const float *k, const float *v, size_t n, int32_t pos0) {
    const size_t kvd = (size_t)m->d.n_head_kv * (size_t)m->d.head_dim, slot = el_kv_slot_bytes(m);
    const el_type_traits *tr = el_get_type_traits(m->kv_type);
    for (size_t i = 0; i < n; i++) {
        const int32_t p = pos0 + (int32_t)i;
        int32_t s;
        if (c->ring) {
            s = c->head;
            c->head = (c->head + 1) % c->n_slots;
            if (c->n_used < c->n_slots) c->n_used++;
        } else {
            s = p; /* a global layer's slot is its position */
            if (p + 1 > c->n_used) c->n_used = p + 1;
        }
        char *kd = (char *)c->k + (size_t)s * slot, *vd = (char *)c->v + (size_t)s * slot;
        if (m->kv_type == EL_TYPE_F32) {
            memcpy(kd, k + i * kvd, kvd * sizeof(float));
            memcpy(vd, v + i * kvd, kvd * sizeof(float));
        } else if (m->kv_type == EL_TYPE_F16) { /* rows are 2-byte aligned: slot sizes are even */
            el_kern()->to_f16(kvd, k + i * kvd, (el_half *)kd);
            el_kern()->to_f16(kvd, v + i * kvd, (el_half *)vd);
        } else {
            tr->from_float(k + i * kvd, kd, kvd);
            tr->from_float(v + i * kvd, vd, kvd);
        }
        c->pos[s] = p;
    }
}

/* a sequence's cache as a new model's: the slot layout (ring heads) then matches a fresh run's, so
 * a reused sequence computes the very bits a new model would */
static void clear_held(el_model *m, int32_t seq) {
    kv_layer *kv = el_seq_kv(m, seq);
    for (int32_t il = 0; il < m->d.n_layer; il++) {
        kv_layer *c = &kv[il];
        for (int32_t s = 0; s < c->n_used; s++) c->pos[s] = -1;
        c->head = 0;
        c->n_used = 0;
    }
}

static int seq_ok(const el_model *m, int32_t seq) { return seq >= 0 && seq < m->n_seq; }

static int truncate_held(el_model *m, int32_t seq, int32_t pos) {
    if (pos < 0 || !seq_ok(m, seq)) return EL_EINVAL;
    if (pos == 0) {
        clear_held(m, seq);
        return EL_OK;
    }
    int status = EL_OK;
    kv_layer *kv = el_seq_kv(m, seq);
    for (int32_t il = 0; il < m->d.n_layer; il++) {
        kv_layer *c = &kv[il];
        int32_t removed = 0;
        for (int32_t s = 0; s < c->n_used; s++)
            if (c->pos[s] >= pos) {
                c->pos[s] = -1;
                removed++;
            }
        if (!c->ring) {
            if (c->n_used > pos) c->n_used = pos;
            continue;
        }
        /* the removed entries are the newest writes: hand their slots back */
        c->head = ((c->head - removed) % c->n_slots + c->n_slots) % c->n_slots;
        if (c->n_used < c->n_slots) c->n_used = c->head;
        /* a ring that already overwrote keys the new end still needs cannot rewind that far */
        const int32_t w = m->layers[il].window, lo = pos > w ? pos - w : 0;
        int32_t present = 0;
        for (int32_t s = 0; s < c->n_used; s++)
            if (c->pos[s] >= lo && c->pos[s] < pos) present++;
        if (present != pos - lo) status = EL_ECTX;
    }
    return status;
}

/* rotates the keys of one slot by delta positions (RoPE is additive in the angle) */
static void rerotate(el_model *m, char *kslot, const float *cs) {
    const size_t hd = (size_t)m->d.head_dim, row = el_kv_row_bytes(m->kv_type, hd);
    const el_type_traits *tr = el_get_type_traits(m->kv_type);
    float buf[EL_MAX_HEAD_DIM];
    for (int32_t h = 0; h < m->d.n_head_kv; h++) {
        char *r = kslot + (size_t)h * row;
        if (m->kv_type == EL_TYPE_F32) {
            el_rope_apply((float *)r, 1, hd, (size_t)m->d.n_rot, cs, m->d.rope_neox, m->ops->rope_fused);
        } else {
            tr->to_float(r, buf, hd);
            el_rope_apply(buf, 1, hd, (size_t)m->d.n_rot, cs, m->d.rope_neox, m->ops->rope_fused);
            tr->from_float(buf, r, hd);
        }
    }
}

int32_t el_kv_n_past(const el_model *m, int32_t seq) {
    /* the sequence length is what the global layers hold (every layer if all are windowed) */
    const kv_layer *kv = el_seq_kv(m, seq);
    int32_t n_past = 0;
    for (int32_t il = 0; il < m->d.n_layer; il++)
        if (!kv[il].ring) return kv[il].n_used;
    for (int32_t il = 0; il < m->d.n_layer; il++)
        for (int32_t s = 0; s < kv[il].n_used; s++)
            if (kv[il].pos[s] + 1 > n_past) n_past = kv[il].pos[s] + 1;
    return n_past;
}

static int shift_held(el_model *m, int32_t seq, int32_t n_keep, int32_t n_discard) {
    if (n_keep < 0 || n_discard <= 0 || !seq_ok(m, seq)) return EL_EINVAL;
    if ((int64_t)n_keep + n_discard > el_kv_n_past(m, seq)) return EL_EINVAL;
    const size_t slot = el_kv_slot_bytes(m);
    float cs[EL_MAX_HEAD_DIM];
    kv_layer *kv = el_seq_kv(m, seq);
    for (int32_t il = 0; il < m->d.n_layer; il++) {
        kv_layer *c = &kv[il];
        const el_layer *L = &m->layers[il];
        const el_rope_args rope = el_rope_init(&m->d, L, 0); /* a pure rotation by -n_discard */
        el_rope_cache(cs, (size_t)m->d.n_rot, -n_discard, &rope);
        if (!c->ring) {
            const int32_t from = n_keep + n_discard, n_move = c->n_used - from;
            if (n_move > 0) {
                memmove((char *)c->k + (size_t)n_keep * slot, (char *)c->k + (size_t)from * slot, (size_t)n_move * slot);
                memmove((char *)c->v + (size_t)n_keep * slot, (char *)c->v + (size_t)from * slot, (size_t)n_move * slot);
                for (int32_t s = n_keep; s < n_keep + n_move; s++) {
                    if (!L->no_rope) rerotate(m, (char *)c->k + (size_t)s * slot, cs);
                    c->pos[s] = s;
                }
            }
            for (int32_t s = c->n_used - n_discard; s < c->n_used; s++)
                if (s >= n_keep) c->pos[s] = -1;
            c->n_used -= n_discard;
            continue;
        }
        for (int32_t s = 0; s < c->n_used; s++) {
            const int32_t p = c->pos[s];
            if (p < n_keep) continue;
            if (p < n_keep + n_discard) {
                c->pos[s] = -1;
            } else {
                if (!L->no_rope) rerotate(m, (char *)c->k + (size_t)s * slot, cs);
                c->pos[s] = p - n_discard;
            }
        }
    }
    return EL_OK;
}

/* ---- state blob: header, then per layer its bookkeeping and the used slots ---- */
#define EL_STATE_MAGIC 0x564b4c45u /* "ELKV" */
#define EL_STATE_VERSION 1u
#define EL_STATE_HDR 8

/* a layer's used slots fit in its allocated cache, but the blob adds headers: checked (checked.h) */
static size_t layer_bytes(const el_model *m, const kv_layer *c) {
    return el_size_add(4 * sizeof(int32_t), el_size_mul((size_t)c->n_used, sizeof(int32_t) + 2 * el_kv_slot_bytes(m)));
}

/* 0 when the blob would not fit size_t (then save and load refuse every size) */
static size_t state_size_held(const el_model *m, int32_t seq) {
    if (!seq_ok(m, seq)) return 0;
    size_t n = EL_STATE_HDR * sizeof(int32_t);
    const kv_layer *kv = el_seq_kv(m, seq);
    for (int32_t il = 0; il < m->d.n_layer; il++) n = el_size_add(n, layer_bytes(m, &kv[il]));
    return el_size_ok(n) ? n : 0;
}

static void header(const el_model *m, int32_t h[EL_STATE_HDR]) {
    h[0] = (int32_t)EL_STATE_MAGIC;
    h[1] = (int32_t)EL_STATE_VERSION;
    h[2] = m->d.n_layer;
    h[3] = m->kv_type;
    h[4] = m->d.head_dim;
    h[5] = m->d.n_head_kv;
    h[6] = m->n_ctx;
    h[7] = m->n_batch;
}

static int state_save_held(const el_model *m, int32_t seq, void *buf, size_t size) {
    if (!buf || size == 0 || size != state_size_held(m, seq)) return EL_EINVAL;
    const kv_layer *kv = el_seq_kv(m, seq);
    char *p = buf;
    int32_t h[EL_STATE_HDR];
    header(m, h);
    memcpy(p, h, sizeof h);
    p += sizeof h;
    const size_t slot = el_kv_slot_bytes(m);
    for (int32_t il = 0; il < m->d.n_layer; il++) {
        const kv_layer *c = &kv[il];
        const int32_t meta[4] = {c->n_slots, c->ring, c->head, c->n_used};
        memcpy(p, meta, sizeof meta);
        p += sizeof meta;
        memcpy(p, c->pos, (size_t)c->n_used * sizeof(int32_t));
        p += (size_t)c->n_used * sizeof(int32_t);
        memcpy(p, c->k, (size_t)c->n_used * slot);
        p += (size_t)c->n_used * slot;
        memcpy(p, c->v, (size_t)c->n_used * slot);
        p += (size_t)c->n_used * slot;
    }
    return EL_OK;
}

static int state_load_held(el_model *m, int32_t seq, const void *buf, size_t size) {
    if (!buf || !seq_ok(m, seq)) return EL_EINVAL;
    kv_layer *kv = el_seq_kv(m, seq);
    const char *p = buf, *end = p + size;
    int32_t h[EL_STATE_HDR], want[EL_STATE_HDR];
    if (size < sizeof h) return EL_EINVAL;
    memcpy(h, p, sizeof h);
    p += sizeof h;
    header(m, want);
    if (memcmp(h, want, sizeof h) != 0) return EL_EINVAL; /* another model, cache type or context */
    const size_t slot = el_kv_slot_bytes(m);
    /* validate the whole blob before touching the cache */
    const char *q = p;
    for (int32_t il = 0; il < m->d.n_layer; il++) {
        const kv_layer *c = &kv[il];
        int32_t meta[4];
        if ((size_t)(end - q) < sizeof meta) return EL_EINVAL;
        memcpy(meta, q, sizeof meta);
        q += sizeof meta;
        if (meta[0] != c->n_slots || meta[1] != c->ring || meta[2] < 0 || meta[2] >= c->n_slots || meta[3] < 0 ||
            meta[3] > c->n_slots)
            return EL_EINVAL;
        /* meta[3] <= n_slots: no more than the layer's allocated cache, so no wrap */
        const size_t need = (size_t)meta[3] * (sizeof(int32_t) + 2 * slot);
        if ((size_t)(end - q) < need) return EL_EINVAL;
        for (int32_t s = 0; s < meta[3]; s++) {
            int32_t pos;
            memcpy(&pos, q + (size_t)s * sizeof(int32_t), sizeof pos);
            if (pos < -1 || pos >= m->n_ctx || (!c->ring && pos != -1 && pos != s)) return EL_EINVAL;
        }
        q += need;
    }
    if (q != end) return EL_EINVAL;
    for (int32_t il = 0; il < m->d.n_layer; il++) {
        kv_layer *c = &kv[il];
        int32_t meta[4];
        memcpy(meta, p, sizeof meta);
        p += sizeof meta;
        c->head = meta[2];
        c->n_used = meta[3];
        for (int32_t s = 0; s < c->n_slots; s++) c->pos[s] = -1;
        memcpy(c->pos, p, (size_t)c->n_used * sizeof(int32_t));
        p += (size_t)c->n_used * sizeof(int32_t);
        memcpy(c->k, p, (size_t)c->n_used * slot);
        p += (size_t)c->n_used * slot;
        memcpy(c->v, p, (size_t)c->n_used * slot);
        p += (size_t)c->n_used * slot;
    }
    return EL_OK;
}

/* the public calls: each holds the model's pool while it runs (model.h); the single-sequence
 * forms act on sequence 0 */
int32_t el_model_seq_n_past(const el_model *m, int32_t seq) {
    if (el_model_enter(m) != EL_OK) return -1;
    const int32_t n = seq_ok(m, seq) ? el_kv_n_past(m, seq) : -1;
    el_model_leave(m, EL_OK);
    return n;
}

size_t el_model_seq_state_size(const el_model *m, int32_t seq) {
    if (el_model_enter(m) != EL_OK) return 0;
    const size_t n = state_size_held(m, seq);
    el_model_leave(m, EL_OK);
    return n;
}

int el_model_seq_clear(el_model *m, int32_t seq) {
    const int st = el_model_enter(m);
    return st != EL_OK ? st : el_model_leave(m, seq_ok(m, seq) ? (clear_held(m, seq), EL_OK) : EL_EINVAL);
}

int el_model_seq_truncate(el_model *m, int32_t seq, int32_t pos) {
    const int st = el_model_enter(m);
    return st != EL_OK ? st : el_model_leave(m, truncate_held(m, seq, pos));
}

int el_model_seq_shift(el_model *m, int32_t seq, int32_t n_keep, int32_t n_discard) {
    const int st = el_model_enter(m);
    return st != EL_OK ? st : el_model_leave(m, shift_held(m, seq, n_keep, n_discard));
}

int el_model_seq_state_save(const el_model *m, int32_t seq, void *buf, size_t size) {
    const int st = el_model_enter(m);
    return st != EL_OK ? st : el_model_leave(m, state_save_held(m, seq, buf, size));
}

int el_model_seq_state_load(el_model *m, int32_t seq, const void *buf, size_t size) {
    const int st = el_model_enter(m);
    return st != EL_OK ? st : el_model_leave(m, state_load_held(m, seq, buf, size));
}

int32_t el_model_n_past(const el_model *m) { return el_model_seq_n_past(m, 0); }
size_t el_model_state_size(const el_model *m) { return el_model_seq_state_size(m, 0); }
int el_model_truncate(el_model *m, int32_t pos) { return el_model_seq_truncate(m, 0, pos); }
int el_model_shift(el_model *m, int32_t n_keep, int32_t n_discard) { return el_model_seq_shift(m, 0, n_keep, n_discard); }
int el_model_state_save(const el_model *m, void *buf, size_t size) { return el_model_seq_state_save(m, 0, buf, size); }
int el_model_state_load(el_model *m, const void *buf, size_t size) { return el_model_seq_state_load(m, 0, buf, size); }

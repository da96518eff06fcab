/* Grammar-constrained decoding: the per-step hot part.
 *
 * A matcher state is llama.cpp's: the set of element stacks the output so far can be in (each stack's
 * top is a character set still to match; an empty stack means the grammar is complete) plus the
 * leading bytes of a UTF-8 character not yet finished. States are interned (one id per distinct set)
 * and each (state, byte) transition is computed once and remembered, so walking a token's bytes is
 * a few hash lookups after the first time. The allowed-token mask walks a byte trie of the vocabulary
 * with the state: a shared prefix is stepped once for all tokens under it, and a prefix that leaves
 * the grammar prunes its whole subtree. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "edgellama.h"

#define MAX_STACK 4096     /* deeper nesting than this ends the match (no real output nests so deep) */
#define MAX_ADVANCE 100000 /* stacks one step may expand to: a pathological grammar fails, not hangs */

typedef struct { int32_t type, value; } gel;

typedef struct { /* growable int32 buffer */
    int32_t *v;
    size_t n, cap;
} ibuf;

static int ibuf_push(ibuf *b, int32_t x) {
    if (b->n == b->cap) {
        size_t cap = b->cap ? b->cap * 2 : 256;
        int32_t *v = realloc(b->v, cap * sizeof *v);
        if (!v) return EL_ENOMEM;
        b->v = v;
        b->cap = cap;
    }
    b->v[b->n++] = x;
    return EL_OK;
}

struct el_grammar {
    gel *code;
    size_t n_code;
    int32_t *rule_start;
    size_t n_rules;
    int32_t root;
    /* interned states: serialized as [partial value, bytes still missing, n stacks, (len, elems...)*] */
    ibuf arena;
    ibuf state_off;  /* state id -> offset in arena */
    ibuf state_len;
    int32_t *state_hash; /* open addressing: state id or -1 */
    size_t hash_cap;
    int32_t **rows; /* per state: 256 next states by byte, NOT_YET until computed (allocated on first use) */
    size_t rows_cap, n_rows;
    ibuf scratch;  /* stacks produced by one step: (len, elems...)* */
    size_t n_advance;
};

/* Nodes in depth-first order: node i's subtree is nodes [i, i + size[i]), its first child is i + 1 and
 * the next sibling of child c is c + size[c], so a walk reads memory forwards and skips a refused
 * subtree in one jump. */
struct el_vocab_trie {
    int32_t *size, *token; /* per node; token: first token ending here, -1 none */
    uint8_t *byte;
    int32_t *tok_next; /* per token: next token with the same bytes */
    size_t n_nodes, n_tokens;
};

#define NOT_YET (-2)

/* ---- hashing ---- */
static uint64_t hash_ints(const int32_t *v, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) {
        h ^= (uint32_t)v[i];
        h *= 1099511628211ull;
        h ^= h >> 29;
    }
    return h;
}

static int is_end(const gel *e) { return e->type == EL_GRAM_END || e->type == EL_GRAM_ALT; }

/* ---- creation ---- */
static int check_code(const gel *code, size_t n_code, const int32_t *rule_start, size_t n_rules) {
    if (n_code == 0 || code[n_code - 1].type != EL_GRAM_END) return EL_EINVAL;
    for (size_t r = 0; r < n_rules; r++)
        if (rule_start[r] < 0 || (size_t)rule_start[r] >= n_code) return EL_EINVAL;
    for (size_t i = 0; i < n_code; i++) {
        int t = code[i].type;
        if (t < EL_GRAM_END || t > EL_GRAM_CHAR_ANY) return EL_EINVAL;
        if (t == EL_GRAM_RULE_REF && (code[i].value < 0 || (size_t)code[i].value >= n_rules)) return EL_EINVAL;
        /* a range's upper bound or an extra alternative must follow a character element */
        if ((t == EL_GRAM_CHAR_RNG_UPPER || t == EL_GRAM_CHAR_ALT) &&
            (i == 0 || code[i - 1].type < EL_GRAM_CHAR || code[i - 1].type == EL_GRAM_CHAR_ANY))
            return EL_EINVAL;
    }
    return EL_OK;
}

int el_grammar_create(const int32_t *code, size_t n_code, const int32_t *rule_start, size_t n_rules,
                      int32_t root, el_grammar **out) {
    if (!code || !rule_start || !out || n_code % 2 || n_code / 2 > (size_t)INT32_MAX || n_rules == 0 ||
        n_rules > (size_t)INT32_MAX || root < 0 || (size_t)root >= n_rules)
        return EL_EINVAL;
    *out = NULL;
    size_t n = n_code / 2;
    int st = check_code((const gel *)code, n, rule_start, n_rules);
    if (st) return st;
    el_grammar *g = calloc(1, sizeof *g);
    if (!g) return EL_ENOMEM;
    g->code = malloc(n * sizeof *g->code);
    g->rule_start = malloc(n_rules * sizeof *g->rule_start);
    if (!g->code || !g->rule_start) {
        el_grammar_free(g);
        return EL_ENOMEM;
    }
    memcpy(g->code, code, n * sizeof *g->code);
    memcpy(g->rule_start, rule_start, n_rules * sizeof *g->rule_start);
    g->n_code = n;
    g->n_rules = n_rules;
    g->root = root;
    *out = g;
    return EL_OK;
}

static void memo_free(el_grammar *g) {
    free(g->arena.v);
    free(g->state_off.v);
    free(g->state_len.v);
    free(g->state_hash);
    for (size_t i = 0; i < g->n_rows; i++) free(g->rows[i]);
    free(g->rows);
    memset(&g->arena, 0, sizeof g->arena);
    memset(&g->state_off, 0, sizeof g->state_off);
    memset(&g->state_len, 0, sizeof g->state_len);
    g->state_hash = NULL;
    g->rows = NULL;
    g->hash_cap = g->rows_cap = g->n_rows = 0;
}

void el_grammar_free(el_grammar *g) {
    if (!g) return;
    memo_free(g);
    free(g->scratch.v);
    free(g->code);
    free(g->rule_start);
    free(g);
}

/* ---- stack expansion (llama.cpp's advance_stack) ---- */
/* Pushes onto g->scratch every stack reachable from stk by expanding rule references on top, until
 * each top is a character set (or the stack is empty). */
static int advance(el_grammar *g, const int32_t *stk, int32_t n, int depth) {
    if (++g->n_advance > MAX_ADVANCE || depth > MAX_STACK) return EL_EINVAL;
    if (n == 0 || g->code[stk[n - 1]].type != EL_GRAM_RULE_REF) {
        int st = ibuf_push(&g->scratch, n);
        for (int32_t i = 0; i < n && !st; i++) st = ibuf_push(&g->scratch, stk[i]);
        return st;
    }
    int32_t pos = stk[n - 1];
    if (n + 1 > MAX_STACK) return EL_EINVAL;
    int32_t *buf = malloc((size_t)(n + 1) * sizeof *buf);
    if (!buf) return EL_ENOMEM;
    memcpy(buf, stk, (size_t)(n - 1) * sizeof *buf);
    int32_t base = n - 1;
    if (!is_end(&g->code[pos + 1])) buf[base++] = pos + 1;
    int32_t a = g->rule_start[g->code[pos].value];
    int st = EL_OK;
    for (;;) {
        int32_t m = base;
        if (!is_end(&g->code[a])) buf[m++] = a;
        st = advance(g, buf, m, depth + 1);
        if (st) break;
        while (!is_end(&g->code[a])) a++;
        if (g->code[a].type != EL_GRAM_ALT) break;
        a++;
    }
    free(buf);
    return st;
}

/* Does the character set at pos hold cp? *next: the element after the set. */
static int match_char(const gel *c, uint32_t cp, int32_t *skip) {
    const gel *start = c;
    if (c->type == EL_GRAM_CHAR_ANY) {
        *skip = 1;
        return 1;
    }
    int positive = c->type == EL_GRAM_CHAR, found = 0;
    do {
        if (c[1].type == EL_GRAM_CHAR_RNG_UPPER) {
            found |= (uint32_t)c->value <= cp && cp <= (uint32_t)c[1].value;
            c += 2;
        } else {
            found |= (uint32_t)c->value == cp;
            c += 1;
        }
    } while (c->type == EL_GRAM_CHAR_ALT);
    *skip = (int32_t)(c - start);
    return found == positive;
}

/* Can a character in [lo, hi] (the completions of a pending UTF-8 prefix) match the set at c? */
static int match_partial(const gel *c, uint32_t lo, uint32_t hi) {
    if (c->type == EL_GRAM_CHAR_ANY) return 1;
    int positive = c->type == EL_GRAM_CHAR;
    do {
        uint32_t a = (uint32_t)c->value, b = a;
        if (c[1].type == EL_GRAM_CHAR_RNG_UPPER) {
            b = (uint32_t)c[1].value;
            c += 2;
        } else {
            c += 1;
        }
        if (positive && a <= hi && lo <= b) return 1;
        if (!positive && a <= lo && hi <= b) return 0; /* every completion is excluded */
    } while (c->type == EL_GRAM_CHAR_ALT);
    return !positive;
}

/* ---- interning ---- */
static int cmp_stack(const int32_t *a, const int32_t *b) {
    if (a[0] != b[0]) return a[0] < b[0] ? -1 : 1;
    for (int32_t i = 1; i <= a[0]; i++)
        if (a[i] != b[i]) return a[i] < b[i] ? -1 : 1;
    return 0;
}

static int qcmp(const void *x, const void *y) { return cmp_stack(*(int32_t *const *)x, *(int32_t *const *)y); }

static const int32_t *state_ptr(const el_grammar *g, int32_t s) { return g->arena.v + g->state_off.v[s]; }

static int hash_grow(el_grammar *g) {
    size_t cap = g->hash_cap ? g->hash_cap * 2 : 1024;
    int32_t *h = malloc(cap * sizeof *h);
    if (!h) return EL_ENOMEM;
    for (size_t i = 0; i < cap; i++) h[i] = -1;
    for (size_t s = 0; s < g->state_off.n; s++) {
        size_t i = hash_ints(state_ptr(g, (int32_t)s), (size_t)g->state_len.v[s]) & (cap - 1);
        while (h[i] >= 0) i = (i + 1) & (cap - 1);
        h[i] = (int32_t)s;
    }
    free(g->state_hash);
    g->state_hash = h;
    g->hash_cap = cap;
    return EL_OK;
}

/* The id of the state made of the stacks in g->scratch (sorted and deduplicated here) and a pending
 * UTF-8 prefix. */
static int32_t intern(el_grammar *g, uint32_t pvalue, int32_t pmissing) {
    size_t n = 0;
    for (size_t i = 0; i < g->scratch.n; i += (size_t)g->scratch.v[i] + 1) n++;
    int32_t **sv = malloc((n ? n : 1) * sizeof *sv);
    if (!sv) return EL_ENOMEM;
    size_t k = 0;
    for (size_t i = 0; i < g->scratch.n; i += (size_t)g->scratch.v[i] + 1) sv[k++] = g->scratch.v + i;
    qsort(sv, n, sizeof *sv, qcmp);
    size_t start = g->arena.n;
    int st = ibuf_push(&g->arena, (int32_t)pvalue);
    if (!st) st = ibuf_push(&g->arena, pmissing);
    size_t count_at = g->arena.n;
    if (!st) st = ibuf_push(&g->arena, 0);
    int32_t count = 0;
    for (size_t i = 0; i < n && !st; i++) {
        if (i > 0 && cmp_stack(sv[i], sv[i - 1]) == 0) continue;
        for (int32_t j = 0; j <= sv[i][0] && !st; j++) st = ibuf_push(&g->arena, sv[i][j]);
        count++;
    }
    free(sv);
    if (st) {
        g->arena.n = start;
        return st;
    }
    g->arena.v[count_at] = count;
    size_t len = g->arena.n - start;
    if (g->hash_cap == 0 || (g->state_off.n + 1) * 2 > g->hash_cap) {
        if ((st = hash_grow(g))) {
            g->arena.n = start;
            return st;
        }
    }
    const int32_t *key = g->arena.v + start;
    size_t i = hash_ints(key, len) & (g->hash_cap - 1);
    for (; g->state_hash[i] >= 0; i = (i + 1) & (g->hash_cap - 1)) {
        int32_t s = g->state_hash[i];
        if ((size_t)g->state_len.v[s] == len && !memcmp(state_ptr(g, s), key, len * sizeof *key)) {
            g->arena.n = start; /* already known */
            return s;
        }
    }
    if (g->state_off.n >= (size_t)INT32_MAX || start > (size_t)INT32_MAX) {
        g->arena.n = start;
        return EL_ENOMEM;
    }
    int32_t id = (int32_t)g->state_off.n;
    if ((st = ibuf_push(&g->state_off, (int32_t)start)) || (st = ibuf_push(&g->state_len, (int32_t)len))) {
        g->state_off.n = (size_t)id;
        g->arena.n = start;
        return st;
    }
    g->state_hash[i] = id;
    return id;
}

int32_t el_grammar_start(el_grammar *g) {
    if (!g) return EL_EINVAL;
    g->scratch.n = 0;
    g->n_advance = 0;
    int32_t a = g->rule_start[g->root];
    int32_t one[1];
    for (;;) { /* each alternative of root, expanded */
        int st = is_end(&g->code[a]) ? advance(g, one, 0, 0) : (one[0] = a, advance(g, one, 1, 0));
        if (st) return st;
        while (!is_end(&g->code[a])) a++;
        if (g->code[a].type != EL_GRAM_ALT) break;
        a++;
    }
    return intern(g, 0, 0);
}

/* ---- one byte ---- */
static int32_t compute_step(el_grammar *g, int32_t s, uint8_t b) {
    const int32_t *p = state_ptr(g, s);
    /* the pending prefix: p[1] = bytes still missing + 8 * the sequence's length */
    static const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000}; /* shorter encodings are overlong */
    uint32_t value = (uint32_t)p[0];
    int32_t missing = p[1] & 7, seqlen = p[1] >> 3, n_stacks = p[2];
    const int32_t *stacks = p + 3;
    if (missing == 0) {
        if (b < 0x80) value = b, seqlen = 1;
        else if ((b & 0xE0) == 0xC0) value = b & 0x1F, missing = 1, seqlen = 2;
        else if ((b & 0xF0) == 0xE0) value = b & 0x0F, missing = 2, seqlen = 3;
        else if ((b & 0xF8) == 0xF0) value = b & 0x07, missing = 3, seqlen = 4;
        else return -1; /* a continuation byte with nothing to continue, or not UTF-8 */
    } else {
        if ((b & 0xC0) != 0x80) return -1;
        value = (value << 6) | (b & 0x3F);
        missing--;
    }
    g->scratch.n = 0;
    g->n_advance = 0;
    if (missing > 0) { /* keep the stacks a completion of this prefix could still match */
        uint32_t lo = value << (6 * missing), hi = lo | ((1u << (6 * missing)) - 1);
        if (lo < min_cp[seqlen]) lo = min_cp[seqlen];
        if (hi > 0x10FFFF) hi = 0x10FFFF;
        if (lo > hi) return -1;
        int any = 0;
        for (int32_t k = 0, o = 0; k < n_stacks; k++, o += stacks[o] + 1) {
            int32_t len = stacks[o];
            if (len > 0 && match_partial(&g->code[stacks[o + len]], lo, hi)) {
                any = 1;
                break;
            }
        }
        if (!any) return -1;
        for (int32_t k = 0, o = 0; k < n_stacks; k++, o += stacks[o] + 1)
            for (int32_t j = 0; j <= stacks[o]; j++)
                if (ibuf_push(&g->scratch, stacks[o + j])) return EL_ENOMEM;
        return intern(g, value, missing + 8 * seqlen);
    }
    if (value > 0x10FFFF || value < min_cp[seqlen] || (value >= 0xD800 && value <= 0xDFFF)) return -1;
    for (int32_t k = 0, o = 0; k < n_stacks; k++, o += stacks[o] + 1) {
        int32_t len = stacks[o];
        if (len == 0) continue;
        int32_t pos = stacks[o + len], skip;
        if (!match_char(&g->code[pos], value, &skip)) continue;
        int32_t tmp_stack[64];
        int32_t *buf = len <= 64 ? tmp_stack : malloc((size_t)len * sizeof *buf);
        if (!buf) return EL_ENOMEM;
        /* state_ptr may move while advance pushes to scratch: the arena is not touched, only scratch */
        memcpy(buf, stacks + o + 1, (size_t)(len - 1) * sizeof *buf);
        int32_t m = len - 1;
        if (!is_end(&g->code[pos + skip])) buf[m++] = pos + skip;
        int st = advance(g, buf, m, 0);
        if (buf != tmp_stack) free(buf);
        if (st) return st == EL_EINVAL ? -1 : st; /* too deep or too wide: treat as leaving the grammar */
    }
    if (g->scratch.n == 0) return -1;
    return intern(g, 0, 0);
}

static int32_t step_byte(el_grammar *g, int32_t s, uint8_t b) {
    if ((size_t)s < g->n_rows && g->rows[s] && g->rows[s][b] != NOT_YET) return g->rows[s][b];
    int32_t next = compute_step(g, s, b);
    if (next < -1) return next; /* an error: not remembered */
    if ((size_t)s >= g->rows_cap) {
        size_t cap = g->rows_cap ? g->rows_cap : 256;
        while (cap <= (size_t)s) cap *= 2;
        int32_t **rows = realloc(g->rows, cap * sizeof *rows);
        if (!rows) return EL_ENOMEM;
        memset(rows + g->rows_cap, 0, (cap - g->rows_cap) * sizeof *rows);
        g->rows = rows;
        g->rows_cap = cap;
    }
    if ((size_t)s >= g->n_rows) g->n_rows = (size_t)s + 1;
    if (!g->rows[s]) {
        g->rows[s] = malloc(256 * sizeof(int32_t));
        if (!g->rows[s]) return EL_ENOMEM;
        for (int i = 0; i < 256; i++) g->rows[s][i] = NOT_YET;
    }
    g->rows[s][b] = next;
    return next;
}

int32_t el_grammar_step(el_grammar *g, int32_t state, const uint8_t *bytes, size_t n) {
    if (!g || state < 0 || (size_t)state >= g->state_off.n || (n && !bytes)) return EL_EINVAL;
    for (size_t i = 0; i < n && state >= 0; i++) state = step_byte(g, state, bytes[i]);
    return state;
}

int el_grammar_state_flags(const el_grammar *g, int32_t state) {
    if (!g || state < 0 || (size_t)state >= g->state_off.n) return 0;
    const int32_t *p = state_ptr(g, state);
    if (p[1] != 0) return 0; /* half a UTF-8 character is never a complete output */
    int has_empty = p[2] > 0 && p[3] == 0; /* stacks are sorted by length: an empty one comes first */
    if (!has_empty) return 0;
    return EL_GRAM_ACCEPTING | (p[2] == 1 ? EL_GRAM_DONE : 0);
}

size_t el_grammar_memo_bytes(const el_grammar *g) {
    if (!g) return 0;
    size_t rows = 0;
    for (size_t i = 0; i < g->n_rows; i++) rows += g->rows[i] ? 256 * sizeof(int32_t) : 0;
    return (g->arena.cap + g->state_off.cap + g->state_len.cap + g->hash_cap) * sizeof(int32_t) +
           g->rows_cap * sizeof(int32_t *) + rows;
}

int32_t el_grammar_compact(el_grammar *g, int32_t state) {
    if (!g || state < 0 || (size_t)state >= g->state_off.n) return EL_EINVAL;
    const int32_t *p = state_ptr(g, state);
    size_t len = (size_t)g->state_len.v[state];
    int32_t *copy = malloc(len * sizeof *copy);
    if (!copy) return EL_ENOMEM;
    memcpy(copy, p, len * sizeof *copy);
    memo_free(g);
    g->scratch.n = 0;
    int st = EL_OK;
    for (size_t i = 3; i < len && !st; i++) st = ibuf_push(&g->scratch, copy[i]);
    int32_t id = st ? st : intern(g, (uint32_t)copy[0], copy[1]);
    free(copy);
    return id;
}

/* ---- the vocabulary trie ---- */
void el_vocab_trie_free(el_vocab_trie *t) {
    if (!t) return;
    free(t->size);
    free(t->token);
    free(t->byte);
    free(t->tok_next);
    free(t);
}

size_t el_vocab_trie_nodes(const el_vocab_trie *t) { return t ? t->n_nodes : 0; }

/* qsort has no context argument: the sort's input is in these, under the lock */
static pthread_mutex_t g_sort_lock = PTHREAD_MUTEX_INITIALIZER;
static const uint8_t *g_sort_bytes;
static const int64_t *g_sort_off;

static int cmp_token(const void *x, const void *y) {
    int32_t a = *(const int32_t *)x, b = *(const int32_t *)y;
    int64_t la = g_sort_off[a + 1] - g_sort_off[a], lb = g_sort_off[b + 1] - g_sort_off[b];
    int c = memcmp(g_sort_bytes + g_sort_off[a], g_sort_bytes + g_sort_off[b], (size_t)(la < lb ? la : lb));
    if (c) return c;
    if (la != lb) return la < lb ? -1 : 1;
    return a < b ? -1 : a > b;
}

/* Built from the tokens sorted by bytes: each token adds nodes only past its common prefix with the
 * one before it, and nodes come out in depth-first order directly (linear after the sort). */
int el_vocab_trie_create(const uint8_t *bytes, const int64_t *offsets, size_t n_tokens, el_vocab_trie **out) {
    if (!offsets || !out || n_tokens == 0 || n_tokens > (size_t)INT32_MAX || offsets[0] != 0) return EL_EINVAL;
    *out = NULL;
    size_t total = 0, longest = 0;
    for (size_t i = 0; i < n_tokens; i++) {
        if (offsets[i + 1] < offsets[i]) return EL_EINVAL;
        total = (size_t)offsets[i + 1];
        if ((size_t)(offsets[i + 1] - offsets[i]) > longest) longest = (size_t)(offsets[i + 1] - offsets[i]);
    }
    if (total && !bytes) return EL_EINVAL;
    if (total + 1 > (size_t)INT32_MAX) return EL_EINVAL;
    size_t cap = total + 1; /* at most one node per byte, plus the root */
    el_vocab_trie *t = calloc(1, sizeof *t);
    int32_t *order = malloc(n_tokens * sizeof *order), *path = malloc((longest + 1) * sizeof *path);
    int st = EL_ENOMEM;
    if (!t || !order || !path) goto done;
    t->size = malloc(cap * sizeof(int32_t));
    t->token = malloc(cap * sizeof(int32_t));
    t->byte = malloc(cap);
    t->tok_next = malloc(n_tokens * sizeof(int32_t));
    if (!t->size || !t->token || !t->byte || !t->tok_next) goto done;
    t->n_tokens = n_tokens;
    for (size_t i = 0; i < n_tokens; i++) order[i] = (int32_t)i, t->tok_next[i] = -1;
    pthread_mutex_lock(&g_sort_lock);
    g_sort_bytes = bytes;
    g_sort_off = offsets;
    qsort(order, n_tokens, sizeof *order, cmp_token);
    pthread_mutex_unlock(&g_sort_lock);
    size_t n_nodes = 1, depth = 0; /* path[0..depth] = the nodes of the previous token's bytes */
    path[0] = 0;
    t->token[0] = -1;
    t->byte[0] = 0;
    int32_t prev = -1;
    for (size_t k = 0; k < n_tokens; k++) {
        int32_t tok = order[k];
        const uint8_t *p = bytes + offsets[tok];
        size_t len = (size_t)(offsets[tok + 1] - offsets[tok]);
        if (len == 0) continue; /* control tokens: never allowed by bytes */
        size_t common = 0;
        if (prev >= 0) {
            const uint8_t *q = bytes + offsets[prev];
            size_t plen = (size_t)(offsets[prev + 1] - offsets[prev]);
            while (common < len && common < plen && p[common] == q[common]) common++;
        }
        while (depth > common) { /* close the nodes the new token does not share */
            int32_t n = path[depth--];
            t->size[n] = (int32_t)n_nodes - n;
        }
        for (size_t j = common; j < len; j++) {
            int32_t n = (int32_t)n_nodes++;
            t->byte[n] = p[j];
            t->token[n] = -1;
            path[++depth] = n;
        }
        int32_t node = path[depth];
        t->tok_next[tok] = t->token[node];
        t->token[node] = tok;
        prev = tok;
    }
    while (depth > 0) {
        int32_t n = path[depth--];
        t->size[n] = (int32_t)n_nodes - n;
    }
    t->size[0] = (int32_t)n_nodes;
    t->n_nodes = n_nodes;
    st = EL_OK;
done:
    free(order);
    free(path);
    if (st) el_vocab_trie_free(t);
    else *out = t;
    return st;
}

static int walk(el_grammar *g, const el_vocab_trie *t, int32_t node, int32_t state, uint8_t *mask) {
    int32_t end = node + t->size[node];
    for (int32_t c = node + 1; c < end; c += t->size[c]) {
        int32_t next = step_byte(g, state, t->byte[c]);
        if (next == -1) continue; /* the whole subtree leaves the grammar */
        if (next < 0) return next;
        for (int32_t k = t->token[c]; k >= 0; k = t->tok_next[k]) mask[k] = 1;
        if (t->size[c] > 1) {
            int st = walk(g, t, c, next, mask);
            if (st) return st;
        }
    }
    return EL_OK;
}

int el_grammar_allowed(el_grammar *g, const el_vocab_trie *t, int32_t state, uint8_t *mask, size_t n_mask) {
    if (!g || !t || !mask || n_mask < t->n_tokens || state < 0 || (size_t)state >= g->state_off.n)
        return EL_EINVAL;
    memset(mask, 0, n_mask);
    return walk(g, t, 0, state, mask);
}

/* matmul.c - Y = W X over the thread pool. Blocks of rows (and of activation rows) are handed out
 * from the pool's counter, and each output is one vec_dot call or a lane of vec_dot_nv, vec_dot_tile
 * or vec_dot_rows with the same bits, so 1, 2, 3 or 4 threads and batch or token-by-token give
 * bit-identical results. */
#include <string.h>

#include "checked.h"
#include "matmul.h"

/* A batch's Q8_0 and Q8_K activations have room for a panel (el_panel_bytes) after the rows, on a
 * cache line (dispatch.h) */
static size_t panel_offset(size_t row_bytes, size_t n_vec) { return el_size_round64(el_size_mul(row_bytes, n_vec)); }

size_t el_act_bytes(int wtype, size_t cols, size_t n_vec) {
    const el_type_traits *tw = el_get_type_traits(wtype);
    if (!tw || !tw->vec_dot) return 0;
    if (tw->vec_dot_type == EL_TYPE_F32) return cols * n_vec * sizeof(float);
    const el_type_traits *ta = el_get_type_traits(tw->vec_dot_type);
    if (!ta || cols % ta->blck_size) return 0;
    /* saturating (checked.h): a batch too big for size_t gives SIZE_MAX, which no allocation meets */
    const size_t row = el_size_mul(cols / ta->blck_size, ta->type_size);
    const size_t panel = el_panel_bytes(tw->vec_dot_type, cols, n_vec);
    return panel ? el_size_add(panel_offset(row, n_vec), panel) : el_size_mul(row, n_vec);
}

typedef struct {
    const float *x;
    size_t cols, n_vec, act_row, bpr, blk_vals, blk_bytes, blk_per_item;
    void *act;
    el_from_float_fn quant;
} quant_task;

/* an item is a run of blocks of the flattened rows, so one long vector also uses every thread */
static void quant_item(void *p, size_t item, size_t n_items) {
    const quant_task *t = p;
    const size_t nblk = t->bpr * t->n_vec;
    size_t b0 = item * t->blk_per_item, b1 = b0 + t->blk_per_item;
    if (b1 > nblk || item + 1 == n_items) b1 = nblk;
    /* chunks never straddle a row */
    while (b0 < b1) {
        const size_t v = b0 / t->bpr, in_row = b0 % t->bpr;
        size_t cnt = t->bpr - in_row;
        if (cnt > b1 - b0) cnt = b1 - b0;
        t->quant(t->x + v * t->cols + in_row * t->blk_vals, (char *)t->act + v * t->act_row + in_row * t->blk_bytes,
                 cnt * t->blk_vals);
        b0 += cnt;
    }
}

typedef struct {
    el_pack_panel_fn pack;
    const char *act;
    size_t act_row, cols, n_vec, groups, group_rows;
    char *panel;
    size_t group_bytes;
} pack_task;

/* a prefill's panel is packed in PACK_ITEMS runs of whole groups */
#define PACK_ITEMS 8
static void pack_item(void *p, size_t item, size_t n_items) {
    const pack_task *t = p;
    const size_t g0 = t->groups * item / n_items, g1 = t->groups * (item + 1) / n_items;
    if (g0 == g1) return;
    const size_t v0 = g0 * t->group_rows, v1 = g1 * t->group_rows < t->n_vec ? g1 * t->group_rows : t->n_vec;
    t->pack(t->act + v0 * t->act_row, t->act_row, t->cols, v1 - v0, t->panel + g0 * t->group_bytes);
}

/* blocks per quantization item: big enough that the counter is noise, small enough to balance */
#define QUANT_ITEM_BLOCKS 64

void el_quantize_act(el_pool *pool, int wtype, const float *x, size_t cols, size_t n_vec, void *act) {
    const el_type_traits *tw = el_get_type_traits(wtype);
    if (tw->vec_dot_type == EL_TYPE_F32) {
        if (act != (const void *)x) memcpy(act, x, cols * n_vec * sizeof(float));
        return;
    }
    const el_type_traits *ta = el_get_type_traits(tw->vec_dot_type);
    const size_t bpr = cols / ta->blck_size;
    quant_task t = {x, cols, n_vec, el_act_bytes(wtype, cols, 1), bpr, ta->blck_size, ta->type_size,
                    QUANT_ITEM_BLOCKS, act, el_kern()->quantize_act[tw->vec_dot_type]};
    const size_t nblk = bpr * n_vec, n_items = (nblk + QUANT_ITEM_BLOCKS - 1) / QUANT_ITEM_BLOCKS;
    if (!pool || cols * n_vec < 4096) quant_item(&t, 0, 1); /* not worth waking the workers */
    else el_pool_for(pool, n_items, quant_item, &t);
    if (el_panel_bytes(tw->vec_dot_type, cols, n_vec)) {
        /* the header names the layout this table packed (el_matmul_act reads it, not its own table) */
        char *head = (char *)act + panel_offset(t.act_row, n_vec);
        const el_pack_panel_fn pack = el_kern()->pack_panel[tw->vec_dot_type];
        const uint32_t packed = pack != NULL ? el_kern()->panel_layout : 0;
        memcpy(head, &packed, sizeof packed);
        if (pack) {
            const size_t gr = el_panel_group_rows(tw->vec_dot_type);
            pack_task p = {pack, act, t.act_row, cols, n_vec, (n_vec + gr - 1) / gr, gr,
                           head + EL_PANEL_HEADER, el_panel_group_bytes(tw->vec_dot_type, cols)};
            if (!pool || cols * n_vec < 16384) pack_item(&p, 0, 1);
            else el_pool_for(pool, p.groups < PACK_ITEMS ? p.groups : PACK_ITEMS, pack_item, &p);
        }
    }
}

typedef struct {
    el_vec_dot_fn dot;
    el_vec_dot_nv_fn dot_nv;     /* NULL: loop over dot */
    el_vec_dot_tile_fn dot_tile; /* NULL: rows one at a time */
    el_vec_dot_rows_fn dot_rows; /* matvec; NULL: rows one at a time */
    el_vec_dot_panel_fn dot_panel; /* batches, over the activations' panel; NULL: dot_tile */
    const char *panel;
    size_t group_bytes, group_rows; /* the panel's groups; without one, EL_NV_MAX rows at a time */
    const char *w;
    size_t w_row, a_row, rows, cols, n_vec, ldy;
    size_t rows_per_item, vecs_per_item, n_vb;
    const char *act;
    float *y;
} mm_task;

/* Batches: a block of weight rows stays in L1 while groups of EL_NV_MAX activation rows (a panel's
 * group: el_panel_group_rows) pass over it (EL_TILE_ROWS rows at a time where the ISA has a tile
 * kernel); an item is (row block, vector block).
 * Matvec: an item is a run of rows, EL_MV_ROWS at a time where the ISA has vec_dot_rows. Either way
 * every output has the bits of one vec_dot, so any split gives the same result. */
#define MM_ROW_BLOCK 16
#define MM_VEC_BLOCK 64
_Static_assert(MM_VEC_BLOCK % EL_PANEL_ROWS_MAX == 0 && EL_PANEL_ROWS_MAX % EL_NV_MAX == 0, "whole groups per item");

static void mm_item(void *p, size_t item, size_t n_items) {
    (void)n_items;
    const mm_task *t = p;
    const size_t rb = item / t->n_vb, vb = item % t->n_vb;
    const size_t r0 = rb * t->rows_per_item, r1 = r0 + t->rows_per_item < t->rows ? r0 + t->rows_per_item : t->rows;
    if (t->n_vec == 1) {
        size_t r = r0;
        if (t->dot_rows) {
            /* the run splits into EL_MV_ROWS equal parts read side by side: each part is one
             * ascending stream, which the hardware prefetchers follow. Adjacent rows in one call hop
             * back and forth within a few KB, and that ran at 4 GB/s instead of 10 on Zen 3. */
            const size_t q = (r1 - r0) / EL_MV_ROWS;
            for (size_t k = 0; k < q; k++) {
                float out[EL_MV_ROWS];
                t->dot_rows(t->cols, t->w + (r0 + k) * t->w_row, q * t->w_row, t->act, out);
                for (size_t m = 0; m < EL_MV_ROWS; m++) t->y[r0 + k + m * q] = out[m];
            }
            r = r0 + q * EL_MV_ROWS;
        }
        for (; r < r1; r++) t->y[r] = t->dot(t->cols, t->w + r * t->w_row, t->act);
        return;
    }
    const size_t v0 = vb * t->vecs_per_item, v1 = v0 + t->vecs_per_item < t->n_vec ? v0 + t->vecs_per_item : t->n_vec;
    for (size_t v = v0; v < v1; v += t->group_rows) {
        const size_t nv = v1 - v < t->group_rows ? v1 - v : t->group_rows;
        const char *a = t->act + v * t->a_row;
        float *yv = t->y + v * t->ldy;
        size_t r = r0;
        if ((t->dot_panel || t->dot_tile) && nv > 1) {
            /* the tile's rows far apart, as the matvec's: EL_TILE_ROWS ascending streams (adjacent
             * rows in one call hop within a few KB and stall the prefetchers when weights stream) */
            const size_t q = (r1 - r0) / EL_TILE_ROWS;
            if (t->dot_panel) { /* all q tiles in one call, straight into y */
                t->dot_panel(t->cols, t->w + r0 * t->w_row, t->w_row, q, q, t->panel + v / t->group_rows * t->group_bytes,
                             nv, yv + r0, t->ldy);
            } else {
                for (size_t k = 0; k < q; k++) {
                    float out[EL_TILE_ROWS * EL_NV_MAX];
                    t->dot_tile(t->cols, t->w + (r0 + k) * t->w_row, q * t->w_row, a, t->a_row, nv, out, EL_NV_MAX);
                    for (size_t i = 0; i < EL_TILE_ROWS; i++)
                        for (size_t j = 0; j < nv; j++) yv[j * t->ldy + r0 + k + i * q] = out[i * EL_NV_MAX + j];
                }
            }
            r = r0 + q * EL_TILE_ROWS;
        }
        for (; r < r1; r++) {
            const char *wr = t->w + r * t->w_row;
            for (size_t j0 = 0; j0 < nv; j0 += EL_NV_MAX) { /* a panel's group may hold more rows */
                const size_t n = nv - j0 < EL_NV_MAX ? nv - j0 : EL_NV_MAX;
                if (t->dot_nv && n > 1) {
                    float out[EL_NV_MAX];
                    t->dot_nv(t->cols, wr, a + j0 * t->a_row, t->a_row, n, out);
                    for (size_t j = 0; j < n; j++) yv[(j0 + j) * t->ldy + r] = out[j];
                } else {
                    for (size_t j = j0; j < j0 + n; j++) yv[j * t->ldy + r] = t->dot(t->cols, wr, a + j * t->a_row);
                }
            }
        }
    }
}

/* Rows per item when one item is one stream of rows (the matvec, a decode batch): about 8 items
 * per thread, so a thread that is descheduled holds up at most one of them; at least MM_ROW_BLOCK,
 * rounded up to whole multi-row calls of `multiple` rows. */
static size_t stream_rows_per_item(size_t rows, int nth, size_t multiple) {
    size_t per = rows / ((size_t)nth * 8);
    if (per < MM_ROW_BLOCK) per = MM_ROW_BLOCK;
    return (per + multiple - 1) / multiple * multiple;
}

void el_matmul_act(el_pool *pool, int wtype, const void *w, size_t rows, size_t cols, const void *act,
                   size_t n_vec, float *y, size_t ldy) {
    const el_kernels *k = el_kern();
    const int nth = pool ? el_pool_threads(pool) : 1;
    const size_t a_row = el_act_bytes(wtype, cols, 1);
    const int act_type = el_get_type_traits(wtype)->vec_dot_type;
    const char *panel = NULL; /* the panel, if el_quantize_act packed this table's layout (its header says) */
    if (k->vec_dot_panel[wtype] && el_panel_bytes(act_type, cols, n_vec)) {
        const char *head = (const char *)act + panel_offset(a_row, n_vec);
        uint32_t packed;
        memcpy(&packed, head, sizeof packed);
        if (packed != 0 && packed == k->panel_layout) panel = head + EL_PANEL_HEADER;
    }
    mm_task t = {k->vec_dot[wtype], k->vec_dot_nv[wtype], k->vec_dot_tile[wtype], k->vec_dot_rows[wtype],
                 panel ? k->vec_dot_panel[wtype] : NULL, panel,
                 panel ? el_panel_group_bytes(act_type, cols) : 0, panel ? el_panel_group_rows(act_type) : EL_NV_MAX,
                 w, el_row_bytes(wtype, cols), a_row,
                 rows, cols, n_vec, ldy, 0, 0, 1, act, y};
    if (n_vec == 1) {
        t.rows_per_item = stream_rows_per_item(rows, nth, EL_MV_ROWS);
        t.vecs_per_item = 1;
    } else {
        /* a decode batch (one group of EL_NV_MAX vectors or fewer) has nothing to keep in L1 across
         * groups: its items are streams, as the matvec's */
        t.rows_per_item = n_vec <= EL_NV_MAX ? stream_rows_per_item(rows, nth, MM_ROW_BLOCK) : MM_ROW_BLOCK;
        t.vecs_per_item = MM_VEC_BLOCK;
        t.n_vb = (n_vec + MM_VEC_BLOCK - 1) / MM_VEC_BLOCK;
    }
    const size_t n_items = (rows + t.rows_per_item - 1) / t.rows_per_item * t.n_vb;
    if (!pool || rows * cols * n_vec < 16384) {
        for (size_t i = 0; i < n_items; i++) mm_item(&t, i, n_items);
    } else {
        el_pool_for(pool, n_items, mm_item, &t);
    }
}

int el_matmul(el_pool *pool, int wtype, const void *w, size_t w_bytes, size_t rows, size_t cols,
              const float *x, size_t n_vec, float *y) {
    if (!pool || !w || !x || !y || rows == 0 || cols == 0 || n_vec == 0) return EL_EINVAL;
    const el_type_traits *tw = el_get_type_traits(wtype);
    if (!tw || !tw->vec_dot || !el_kern()->vec_dot[wtype]) return EL_EUNSUPPORTED;
    const size_t rb = el_row_bytes(wtype, cols);
    if (rb == 0 || rows > SIZE_MAX / rb || w_bytes != rows * rb) return EL_EINVAL;
    const size_t ab = el_act_bytes(wtype, cols, n_vec);
    if (ab == 0) return EL_EINVAL;
    const int st = el_pool_enter(pool); /* the pool's scratch and task are ours until leave */
    if (st != EL_OK) return st;
    void *act = el_pool_scratch(pool, ab);
    if (act) {
        el_quantize_act(pool, wtype, x, cols, n_vec, act);
        el_matmul_act(pool, wtype, w, rows, cols, act, n_vec, y, rows);
    }
    el_pool_leave(pool);
    return act ? EL_OK : EL_ENOMEM;
}

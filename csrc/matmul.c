/* matmul.c - Y = W X over the thread pool. Rows are split in contiguous ranges per thread, and
 * each output is one vec_dot call, so 1, 2, 3 or 4 threads give bit-identical results. */
#include <string.h>

#include "matmul.h"

size_t el_act_bytes(int wtype, size_t cols, size_t n_vec) {
    const el_type_traits *tw = el_get_type_traits(wtype);
    if (!tw || !tw->vec_dot) return 0;
    if (tw->vec_dot_type == EL_TYPE_F32) return cols * n_vec * sizeof(float);
    const el_type_traits *ta = el_get_type_traits(tw->vec_dot_type);
    if (!ta || cols % ta->blck_size) return 0;
    return cols / ta->blck_size * ta->type_size * n_vec;
}

typedef struct {
    int wtype;
    const float *x;
    size_t cols, n_vec, act_row;
    void *act;
    el_from_float_fn quant;
} quant_task;

static void quant_run(void *p, int ith, int nth) {
    const quant_task *t = p;
    /* split the blocks of all rows so one long vector also uses every thread */
    const el_type_traits *ta = el_get_type_traits(el_get_type_traits(t->wtype)->vec_dot_type);
    const size_t bpr = t->cols / ta->blck_size, nblk = bpr * t->n_vec;
    size_t b0, b1;
    el_split(nblk, ith, nth, &b0, &b1);
    /* chunks never straddle a row */
    while (b0 < b1) {
        const size_t v = b0 / bpr, in_row = b0 % bpr;
        size_t cnt = bpr - in_row;
        if (cnt > b1 - b0) cnt = b1 - b0;
        t->quant(t->x + v * t->cols + in_row * ta->blck_size,
                 (char *)t->act + v * t->act_row + in_row * ta->type_size, cnt * ta->blck_size);
        b0 += cnt;
    }
}

void el_quantize_act(el_pool *pool, int wtype, const float *x, size_t cols, size_t n_vec, void *act) {
    const el_type_traits *tw = el_get_type_traits(wtype);
    if (tw->vec_dot_type == EL_TYPE_F32) {
        if (act != (const void *)x) memcpy(act, x, cols * n_vec * sizeof(float));
        return;
    }
    quant_task t = {wtype, x, cols, n_vec, el_act_bytes(wtype, cols, 1), act,
                    el_kern()->quantize_act[tw->vec_dot_type]};
    if (cols * n_vec < 4096) quant_run(&t, 0, 1); /* not worth waking the workers */
    else el_pool_run(pool, quant_run, &t);
}

typedef struct {
    el_vec_dot_fn dot;
    const char *w;
    size_t w_row, a_row, rows, cols, n_vec, ldy;
    const char *act;
    float *y;
} mm_task;

#define MM_ROW_BLOCK 16

static void mm_run(void *p, int ith, int nth) {
    const mm_task *t = p;
    size_t r0, r1;
    el_split(t->rows, ith, nth, &r0, &r1);
    if (t->n_vec == 1) {
        for (size_t r = r0; r < r1; r++) t->y[r] = t->dot(t->cols, t->w + r * t->w_row, t->act);
        return;
    }
    /* batch: a block of weight rows stays in cache while every activation row passes over it */
    for (size_t rb = r0; rb < r1; rb += MM_ROW_BLOCK) {
        const size_t re = rb + MM_ROW_BLOCK < r1 ? rb + MM_ROW_BLOCK : r1;
        for (size_t v = 0; v < t->n_vec; v++) {
            const char *a = t->act + v * t->a_row;
            float *yv = t->y + v * t->ldy;
            for (size_t r = rb; r < re; r++) yv[r] = t->dot(t->cols, t->w + r * t->w_row, a);
        }
    }
}

void el_matmul_act(el_pool *pool, int wtype, const void *w, size_t rows, size_t cols, const void *act,
                   size_t n_vec, float *y, size_t ldy) {
    mm_task t = {el_kern()->vec_dot[wtype], w, el_row_bytes(wtype, cols), el_act_bytes(wtype, cols, 1),
                 rows, cols, n_vec, ldy, act, y};
    if (rows * cols * n_vec < 16384) mm_run(&t, 0, 1);
    else el_pool_run(pool, mm_run, &t);
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
    void *act = el_pool_scratch(pool, ab);
    if (!act) return EL_ENOMEM;
    el_quantize_act(pool, wtype, x, cols, n_vec, act);
    el_matmul_act(pool, wtype, w, rows, cols, act, n_vec, y, rows);
    return EL_OK;
}

/* matmul.h - quantized matrix x activations (internal): activations are quantized once to the
 * weight type's vec_dot format, then blocks of output rows are handed out to whichever thread runs. */
#ifndef EL_MATMUL_H
#define EL_MATMUL_H

#include "dispatch.h"
#include "pool.h"

/* Bytes of the quantized form of n_vec rows of cols floats for weight type wtype (0 = unsupported):
 * the rows (el_act_bytes(wtype, cols, 1) apart), then for a batch of Q8_0 rows the room for a panel
 * (dispatch.h; the same whatever ISA is active). */
size_t el_act_bytes(int wtype, size_t cols, size_t n_vec);

/* Quantizes x (n_vec x cols) into act (el_act_bytes bytes, on a 64-byte boundary: a batch's panel
 * is read with aligned loads) for wtype, split over the pool. */
void el_quantize_act(el_pool *pool, int wtype, const float *x, size_t cols, size_t n_vec, void *act);

/* y[v * ldy + r] = W[r] . act[v] for rows [0, rows); act from el_quantize_act with the same n_vec.
 * No validation. */
void el_matmul_act(el_pool *pool, int wtype, const void *w, size_t rows, size_t cols, const void *act,
                   size_t n_vec, float *y, size_t ldy);

#endif

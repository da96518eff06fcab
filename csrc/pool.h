/* pool.h - the persistent worker pool (internal). One computation runs on a pool at a time. */
#ifndef EL_POOL_H
#define EL_POOL_H

#include <stddef.h>

#include "edgellama.h"

/* fn(ctx, ith, nth) runs once on every thread (the caller is thread 0); returns when all are done. */
typedef void (*el_task_fn)(void *ctx, int ith, int nth);
void el_pool_run(el_pool *pool, el_task_fn fn, void *ctx);

/* Scratch owned by the pool, grown on demand (64-byte aligned); NULL on allocation failure.
 * The model sizes it once at creation so the decode loop never allocates. */
void *el_pool_scratch(el_pool *pool, size_t bytes);

/* [start, end) of n items for thread ith of nth: contiguous, fixed for given n and nth. */
static inline void el_split(size_t n, int ith, int nth, size_t *start, size_t *end) {
    const size_t per = n / (size_t)nth, rem = n % (size_t)nth;
    const size_t i = (size_t)ith;
    *start = i * per + (i < rem ? i : rem);
    *end = *start + per + (i < rem ? 1 : 0);
}

#endif

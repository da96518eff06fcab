/* pool.h - the persistent worker pool (internal). One computation runs on a pool at a time: every
 * public call that runs on one holds it from entry to return (el_pool_enter / el_pool_leave).
 * Work is handed out item by item from an atomic counter, so a descheduled worker delays nobody:
 * whichever thread is running takes the next item, and the caller never waits for a late joiner. */
#ifndef EL_POOL_H
#define EL_POOL_H

#include <stddef.h>

#include "edgellama.h"

/* A model's hold on its pool: el_model_create refs it, el_model_free unrefs it, and the last unref
 * (this or the owner's el_pool_free) destroys it. */
void el_pool_ref(el_pool *pool);
void el_pool_unref(el_pool *pool);
int el_pool_live(void); /* pools not yet destroyed, process-wide (tests: a deferred free happens) */

/* Takes the pool for one public call (el_matmul, el_model_*): waits while another thread's call
 * holds it; EL_EBUSY, without waiting, when this thread holds it already (a public call made
 * from inside another would otherwise deadlock). el_pool_leave after an EL_OK only. */
int el_pool_enter(el_pool *pool);
void el_pool_leave(el_pool *pool);

/* fn(ctx, i, n) runs exactly once for every item i in [0, n), on whichever pool thread (the caller
 * included) takes it first; returns when all items are done. Items may run on one thread in turn,
 * so results must depend on the item only, never on which thread ran it. */
typedef void (*el_item_fn)(void *ctx, size_t i, size_t n);
void el_pool_for(el_pool *pool, size_t n_items, el_item_fn fn, void *ctx);

/* fn(ctx, ith, nth) runs once for every ith in [0, nth) with nth = the pool's thread count (an
 * el_pool_for of nth items): per-ith scratch is safe, but two ith may run on one thread. */
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

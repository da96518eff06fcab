/* pool.c - persistent pthread pool. A task is a count of items taken from an atomic counter by the
 * caller and by every worker that joins in time; idle workers spin for a bounded time (decode issues
 * a few hundred parallel regions per token, too many for a condvar round trip each), then sleep. */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "pool.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define EL_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define EL_PAUSE() __asm__ volatile("yield")
#else
#define EL_PAUSE() ((void)0)
#endif

#define EL_MAX_THREADS 64
/* How long an idle worker spins before it sleeps on the condvar, in microseconds (EDGELLAMA_SPIN_US
 * overrides). Gaps between the parallel regions of one token are a few microseconds; between tokens
 * the caller samples in Python (~0.1-1 ms). A spinner beyond that only takes a core from others on
 * a 2-core board, and a sleeper costs one futex wake (tens of microseconds) per token. */
#define EL_SPIN_US_DEFAULT 300
/* the caller's wait for joined workers: pause-spins before each sched_yield, so a worker that was
 * preempted on the caller's core gets it back */
#define EL_WAIT_SPINS 256

/* state: task generation in the high 32 bits, CLOSED once the caller has finished its items (no
 * worker may join after that), and the count of workers that joined in the low bits. Joining is a
 * CAS on the whole word, so a worker can never join a task that is closed or already replaced. */
#define ST_CLOSED ((uint64_t)1 << 31)
#define ST_JOINED ((uint64_t)0x7fffffff)

struct el_pool {
    int n_threads;
    long spin_ns;
    pthread_t threads[EL_MAX_THREADS];
    pthread_mutex_t busy; /* held by the thread whose public call runs on the pool (error-checking) */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    _Atomic uint64_t state;
    atomic_size_t next;   /* next item to hand out */
    atomic_int done;      /* joined workers that finished */
    atomic_int sleeping;  /* workers in (or entering) cond_wait */
    atomic_int stop;
    atomic_int refs;      /* the owner's (until el_pool_free) + one per model created on the pool */
    /* the current task, written before the release of a new generation */
    size_t n_items;
    el_item_fn item_fn;
    el_task_fn task_fn;
    void *ctx;
    void *scratch;
    size_t scratch_size;
};

typedef struct { el_pool *pool; } worker_arg;

static atomic_int g_live; /* pools created and not yet destroyed (el_pool_live, for tests) */

static long now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long)ts.tv_sec * 1000000000L + ts.tv_nsec;
}

static void run_items(el_pool *p) {
    for (;;) {
        const size_t i = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (i >= p->n_items) return;
        if (p->item_fn) p->item_fn(p->ctx, i, p->n_items);
        else p->task_fn(p->ctx, (int)i, p->n_threads);
    }
}

static uint32_t gen_of(uint64_t s) { return (uint32_t)(s >> 32); }

/* the state once its generation differs from `seen` (or stop is set) */
static uint64_t wait_new(el_pool *p, uint32_t seen) {
    uint64_t s;
    long t0 = 0;
    for (unsigned spins = 0;; spins++) {
        s = atomic_load_explicit(&p->state, memory_order_acquire);
        if (gen_of(s) != seen || atomic_load_explicit(&p->stop, memory_order_relaxed)) return s;
        if ((spins & 63) == 0) { /* the clock is read rarely: it costs more than a pause */
            const long t = now_ns();
            if (!t0) t0 = t;
            else if (t - t0 > p->spin_ns) break;
        }
        EL_PAUSE();
    }
    pthread_mutex_lock(&p->mu);
    /* seq_cst on both sides (here and in el_pool_for): either the caller sees sleeping > 0 and
     * broadcasts under the mutex, or this thread sees the new generation */
    atomic_fetch_add(&p->sleeping, 1);
    while (gen_of(s = atomic_load(&p->state)) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv, &p->mu);
    atomic_fetch_sub(&p->sleeping, 1);
    pthread_mutex_unlock(&p->mu);
    return s;
}

static void *worker_main(void *arg) {
    el_pool *p = ((worker_arg *)arg)->pool;
    free(arg);
    uint32_t seen = gen_of(atomic_load(&p->state));
    for (;;) {
        uint64_t s = wait_new(p, seen);
        if (atomic_load(&p->stop)) return NULL;
        seen = gen_of(s);
        int joined = 0;
        while (!(s & ST_CLOSED) && gen_of(s) == seen) {
            if (atomic_compare_exchange_weak_explicit(&p->state, &s, s + 1, memory_order_acq_rel, memory_order_acquire)) {
                joined = 1;
                break;
            }
        }
        if (!joined) continue; /* too late for this task (or a newer one is up: wait_new returns at once) */
        run_items(p);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    }
}

int el_pool_create(int n_threads, el_pool **out) {
    if (!out || n_threads < 1 || n_threads > EL_MAX_THREADS) return EL_EINVAL;
    el_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return EL_ENOMEM;
    pool->n_threads = 1;
    atomic_init(&pool->refs, 1);
    atomic_fetch_add(&g_live, 1);
    long us = EL_SPIN_US_DEFAULT;
    const char *env = getenv("EDGELLAMA_SPIN_US");
    if (env && *env) {
        char *end;
        const long v = strtol(env, &end, 10);
        if (*end == 0 && v >= 0 && v <= 1000000) us = v;
    }
    pool->spin_ns = us * 1000L;
    pthread_mutexattr_t attr;
    pthread_mutexattr_init(&attr);
    pthread_mutexattr_settype(&attr, PTHREAD_MUTEX_ERRORCHECK);
    pthread_mutex_init(&pool->busy, &attr);
    pthread_mutexattr_destroy(&attr);
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv, NULL);
    for (int i = 1; i < n_threads; i++) {
        worker_arg *a = malloc(sizeof *a);
        if (!a) { el_pool_free(pool); return EL_ENOMEM; }
        a->pool = pool;
        if (pthread_create(&pool->threads[i], NULL, worker_main, a) != 0) {
            free(a);
            el_pool_free(pool);
            return EL_ETHREAD;
        }
        pool->n_threads = i + 1;
    }
    *out = pool;
    return EL_OK;
}

static void destroy(el_pool *pool) {
    pthread_mutex_lock(&pool->mu);
    atomic_store(&pool->stop, 1);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 1; i < pool->n_threads; i++) pthread_join(pool->threads[i], NULL);
    pthread_mutex_destroy(&pool->busy);
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->cv);
    free(pool->scratch);
    free(pool);
    atomic_fetch_sub(&g_live, 1);
}

void el_pool_ref(el_pool *pool) { atomic_fetch_add(&pool->refs, 1); }

void el_pool_unref(el_pool *pool) {
    if (atomic_fetch_sub(&pool->refs, 1) == 1) destroy(pool);
}

void el_pool_free(el_pool *pool) {
    if (pool) el_pool_unref(pool); /* the last model's el_model_free finishes the job otherwise */
}

int el_pool_live(void) { return atomic_load(&g_live); }

int el_pool_users(const el_pool *pool) {
    return pool ? atomic_load((atomic_int *)&pool->refs) - 1 : 0;
}

int el_pool_threads(const el_pool *pool) { return pool ? pool->n_threads : 0; }

int el_pool_enter(el_pool *pool) {
    /* EDEADLK: this thread holds it already (the mutex checks its owner instead of deadlocking) */
    return pthread_mutex_lock(&pool->busy) == 0 ? EL_OK : EL_EBUSY;
}

void el_pool_leave(el_pool *pool) { pthread_mutex_unlock(&pool->busy); }

static void pool_go(el_pool *p, size_t n_items, el_item_fn item_fn, el_task_fn task_fn, void *ctx) {
    p->n_items = n_items;
    p->item_fn = item_fn;
    p->task_fn = task_fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    const uint32_t gen = gen_of(atomic_load_explicit(&p->state, memory_order_relaxed)) + 1;
    atomic_store(&p->state, (uint64_t)gen << 32); /* seq_cst: publishes the task, pairs with `sleeping` */
    if (atomic_load(&p->sleeping) > 0) {
        pthread_mutex_lock(&p->mu);
        pthread_cond_broadcast(&p->cv);
        pthread_mutex_unlock(&p->mu);
    }
    run_items(p);
    /* no joins after this; wait only for the workers that did join (each finishes its last item) */
    const uint64_t s = atomic_fetch_or_explicit(&p->state, ST_CLOSED, memory_order_acq_rel);
    const int joined = (int)(s & ST_JOINED);
    for (unsigned spins = 1; atomic_load_explicit(&p->done, memory_order_acquire) < joined; spins++) {
        if (spins % EL_WAIT_SPINS == 0) sched_yield();
        else EL_PAUSE();
    }
}

void el_pool_for(el_pool *pool, size_t n_items, el_item_fn fn, void *ctx) {
    if (n_items == 0) return;
    if (pool->n_threads == 1 || n_items == 1) {
        for (size_t i = 0; i < n_items; i++) fn(ctx, i, n_items);
        return;
    }
    pool_go(pool, n_items, fn, NULL, ctx);
}

void el_pool_run(el_pool *pool, el_task_fn fn, void *ctx) {
    if (pool->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pool_go(pool, (size_t)pool->n_threads, NULL, fn, ctx);
}

void *el_pool_scratch(el_pool *pool, size_t bytes) {
    if (bytes <= pool->scratch_size) return pool->scratch;
    size_t size = (bytes + 63) & ~(size_t)63;
    void *p = NULL;
    if (posix_memalign(&p, 64, size) != 0) return NULL;
    free(pool->scratch);
    pool->scratch = p;
    pool->scratch_size = size;
    return p;
}

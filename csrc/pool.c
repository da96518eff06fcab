/* pool.c - persistent pthread pool: workers spin briefly for the next task (decode issues a few
 * hundred parallel regions per token, too many for a condvar round trip each), then sleep. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

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
#define EL_SPIN_ITERS 200000

struct el_pool {
    int n_threads;
    pthread_t threads[EL_MAX_THREADS];
    pthread_mutex_t mu;
    pthread_cond_t cv;
    atomic_uint gen;      /* bumped once per task */
    atomic_int pending;   /* workers still running the current task */
    atomic_int stop;
    el_task_fn fn;
    void *ctx;
    void *scratch;
    size_t scratch_size;
};

typedef struct { el_pool *pool; int ith; } worker_arg;

static void *worker_main(void *p) {
    el_pool *pool = ((worker_arg *)p)->pool;
    const int ith = ((worker_arg *)p)->ith;
    free(p);
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&pool->gen, memory_order_acquire)) == seen &&
               !atomic_load_explicit(&pool->stop, memory_order_acquire) && spins < EL_SPIN_ITERS) {
            EL_PAUSE();
            spins++;
        }
        if (g == seen && !atomic_load(&pool->stop)) {
            pthread_mutex_lock(&pool->mu);
            while ((g = atomic_load(&pool->gen)) == seen && !atomic_load(&pool->stop))
                pthread_cond_wait(&pool->cv, &pool->mu);
            pthread_mutex_unlock(&pool->mu);
        }
        if (atomic_load(&pool->stop)) return NULL;
        seen = g;
        pool->fn(pool->ctx, ith, pool->n_threads);
        atomic_fetch_sub_explicit(&pool->pending, 1, memory_order_release);
    }
}

int el_pool_create(int n_threads, el_pool **out) {
    if (!out || n_threads < 1 || n_threads > EL_MAX_THREADS) return EL_EINVAL;
    el_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return EL_ENOMEM;
    pool->n_threads = 1;
    pthread_mutex_init(&pool->mu, NULL);
    pthread_cond_init(&pool->cv, NULL);
    for (int i = 1; i < n_threads; i++) {
        worker_arg *a = malloc(sizeof *a);
        if (!a) { el_pool_free(pool); return EL_ENOMEM; }
        a->pool = pool;
        a->ith = i;
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

void el_pool_free(el_pool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->mu);
    atomic_store(&pool->stop, 1);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    for (int i = 1; i < pool->n_threads; i++) pthread_join(pool->threads[i], NULL);
    pthread_mutex_destroy(&pool->mu);
    pthread_cond_destroy(&pool->cv);
    free(pool->scratch);
    free(pool);
}

int el_pool_threads(const el_pool *pool) { return pool ? pool->n_threads : 0; }

void el_pool_run(el_pool *pool, el_task_fn fn, void *ctx) {
    if (pool->n_threads == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pool->fn = fn;
    pool->ctx = ctx;
    atomic_store_explicit(&pool->pending, pool->n_threads - 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&pool->gen, 1, memory_order_release);
    /* wakes sleepers; cheap when every worker is still spinning */
    pthread_mutex_lock(&pool->mu);
    pthread_cond_broadcast(&pool->cv);
    pthread_mutex_unlock(&pool->mu);
    fn(ctx, 0, pool->n_threads);
    while (atomic_load_explicit(&pool->pending, memory_order_acquire) > 0) EL_PAUSE();
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

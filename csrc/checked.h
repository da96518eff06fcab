/* checked.h - size arithmetic that cannot wrap (internal). On a 32-bit size_t (armhf) the product
 * of a model's shapes easily passes 4 GiB, and a wrapped size would become an undersized malloc.
 * These saturate instead: a result that does not fit is SIZE_MAX, and SIZE_MAX stays SIZE_MAX
 * through every later step, so one check of the final total (el_size_ok) catches any overflow.
 * No real allocation can be SIZE_MAX bytes, so the value doubles as the error. */
#ifndef EL_CHECKED_H
#define EL_CHECKED_H

#include <stddef.h>
#include <stdint.h>

static inline size_t el_size_mul(size_t a, size_t b) {
    size_t r;
    return __builtin_mul_overflow(a, b, &r) ? SIZE_MAX : r;
}

static inline size_t el_size_mul3(size_t a, size_t b, size_t c) { return el_size_mul(el_size_mul(a, b), c); }

static inline size_t el_size_add(size_t a, size_t b) {
    size_t r;
    return __builtin_add_overflow(a, b, &r) ? SIZE_MAX : r;
}

/* n rounded up to a multiple of 64 (cache lines; every scratch buffer starts on one) */
static inline size_t el_size_round64(size_t n) {
    const size_t r = el_size_add(n, 63);
    return r == SIZE_MAX ? SIZE_MAX : r & ~(size_t)63;
}

static inline int el_size_ok(size_t n) { return n != SIZE_MAX; }

#endif

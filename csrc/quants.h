/* quants.h - the ggml block formats as plain structs, and the per-type function table.
 * The structs are the on-disk layout of GGUF tensor data; a static_assert pins each size. */
#ifndef EL_QUANTS_H
#define EL_QUANTS_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#include "edgellama.h"
#include "fp16.h"

#define QK4_0 32
#define QK4_1 32
#define QK5_0 32
#define QK5_1 32
#define QK8_0 32
#define QK8_1 32
#define QK_K 256
#define K_SCALE_SIZE 12

typedef struct { el_half d; uint8_t qs[QK4_0 / 2]; } block_q4_0;
static_assert(sizeof(block_q4_0) == 18, "block_q4_0 size");
typedef struct { el_half d, m; uint8_t qs[QK4_1 / 2]; } block_q4_1;
static_assert(sizeof(block_q4_1) == 20, "block_q4_1 size");
typedef struct { el_half d; uint8_t qh[4]; uint8_t qs[QK5_0 / 2]; } block_q5_0;
static_assert(sizeof(block_q5_0) == 22, "block_q5_0 size");
typedef struct { el_half d, m; uint8_t qh[4]; uint8_t qs[QK5_1 / 2]; } block_q5_1;
static_assert(sizeof(block_q5_1) == 24, "block_q5_1 size");
typedef struct { el_half d; int8_t qs[QK8_0]; } block_q8_0;
static_assert(sizeof(block_q8_0) == 34, "block_q8_0 size");
/* activations for Q4_1/Q5_1: s = d * sum(qs) */
typedef struct { el_half d, s; int8_t qs[QK8_1]; } block_q8_1;
static_assert(sizeof(block_q8_1) == 36, "block_q8_1 size");

typedef struct { uint8_t scales[QK_K / 16]; uint8_t qs[QK_K / 4]; el_half d, dmin; } block_q2_K;
static_assert(sizeof(block_q2_K) == 84, "block_q2_K size");
typedef struct { uint8_t hmask[QK_K / 8]; uint8_t qs[QK_K / 4]; uint8_t scales[12]; el_half d; } block_q3_K;
static_assert(sizeof(block_q3_K) == 110, "block_q3_K size");
typedef struct { el_half d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qs[QK_K / 2]; } block_q4_K;
static_assert(sizeof(block_q4_K) == 144, "block_q4_K size");
typedef struct { el_half d, dmin; uint8_t scales[K_SCALE_SIZE]; uint8_t qh[QK_K / 8]; uint8_t qs[QK_K / 2]; } block_q5_K;
static_assert(sizeof(block_q5_K) == 176, "block_q5_K size");
typedef struct { uint8_t ql[QK_K / 2]; uint8_t qh[QK_K / 4]; int8_t scales[QK_K / 16]; el_half d; } block_q6_K;
static_assert(sizeof(block_q6_K) == 210, "block_q6_K size");
/* activations for the K-quants: bsums[i] = sum of qs[16 i .. 16 i + 15] */
typedef struct { float d; int8_t qs[QK_K]; int16_t bsums[QK_K / 16]; } block_q8_K;
static_assert(sizeof(block_q8_K) == 292, "block_q8_K size");

/* n is always a multiple of the type's block size (checked by the public API before the call). */
typedef void (*el_to_float_fn)(const void *src, float *dst, size_t n);
typedef void (*el_from_float_fn)(const float *src, void *dst, size_t n);
/* dot of one weight row (n values) with one activation row in the type's vec_dot_type */
typedef float (*el_vec_dot_fn)(size_t n, const void *w, const void *a);

typedef struct {
    const char *name;
    size_t blck_size, type_size;
    int vec_dot_type;               /* EL_TYPE_F32, Q8_0, Q8_1 or Q8_K */
    el_to_float_fn to_float;        /* reference dequantizer */
    el_from_float_fn from_float;    /* reference quantizer */
    el_vec_dot_fn vec_dot;          /* scalar reference dot product */
} el_type_traits;

/* A block's integer quants in value order (q[j] is value j's level); shared by the dequantizers,
 * the scalar dot products and llamacpp_exact.c. Q4_0/Q5_0 levels are signed (offset removed),
 * Q4_1/Q5_1/Q4_K unsigned; Q6_K levels are -32..31 with scale scales[j / 16]. */
void el_unpack_q4_0(const block_q4_0 *b, int8_t q[QK4_0]);
void el_unpack_q4_1(const block_q4_1 *b, int8_t q[QK4_1]);
void el_unpack_q5_0(const block_q5_0 *b, int8_t q[QK5_0]);
void el_unpack_q5_1(const block_q5_1 *b, int8_t q[QK5_1]);
void el_unpack_q4_K(const block_q4_K *b, int8_t q[QK_K], uint8_t sc[8], uint8_t mn[8]);
void el_unpack_q6_K(const block_q6_K *b, int8_t q[QK_K]);

/* sum of a[j] b[j] over n 8-bit levels: the exact integer sum of a sub-block, shared by the scalar
 * dot products of quants.c and quants_k.c */
static inline int el_dot_i8(const int8_t *a, const int8_t *b, int n) {
    int s = 0;
    for (int j = 0; j < n; j++) s += a[j] * b[j];
    return s;
}

/* NULL for types the library does not know. Defined in quants.c. */
const el_type_traits *el_get_type_traits(int type);

#endif

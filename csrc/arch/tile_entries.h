/* arch/tile_entries.h - a kernel body written once, its dispatch entries generated from it (any ISA):
 * a tile body TILE(n, w, w_stride, NR, a, a_stride, NV, out, ldo) of NR weight rows x NV activation rows
 * (compile-time constants at each call) gives vec_dot, vec_dot_nv, vec_dot_rows and vec_dot_tile, which
 * then run the same operations in the same order per output: the bits dispatch.h's contract asks for. */
#ifndef EL_TILE_ENTRIES_H
#define EL_TILE_ENTRIES_H

#include "../dispatch.h"

/* Kernel bodies written once for NV activation rows (a compile-time constant at each call), so the
 * single-row vec_dot and every lane of vec_dot_nv run the same operations in the same order. */
#define EL_FORCE_INLINE static inline __attribute__((always_inline))
/* before the row / activation / head loops of such bodies: unrolled, their accumulator arrays live
 * in registers; GCC otherwise may keep them on the stack (a store and reload on every FMA chain) */
#define EL_UNROLL _Pragma("GCC unroll 16")

/* vec_dot_nv entry and vec_dot from one body IMPL(n, w, a, a_stride, NV, out) */
#define EL_NV_ENTRIES(ATTR, NAME, IMPL)                                                            \
    ATTR static float NAME(size_t n, const void *w, const void *a) {                               \
        float r;                                                                                   \
        IMPL(n, w, a, 0, 1, &r);                                                                   \
        return r;                                                                                  \
    }                                                                                              \
    ATTR static void NAME##_nv(size_t n, const void *w, const void *a, size_t s, size_t nv, float *out) { \
        switch (nv) {                                                                              \
        case 1: IMPL(n, w, a, s, 1, out); break;                                                   \
        case 2: IMPL(n, w, a, s, 2, out); break;                                                   \
        case 3: IMPL(n, w, a, s, 3, out); break;                                                   \
        default: IMPL(n, w, a, s, 4, out); break;                                                  \
        }                                                                                          \
    }

/* vec_dot_rows (EL_MV_ROWS weight rows x one activation row) from a body
 * TILE(n, w, w_stride, NR, a, a_stride, NV, out, ldo) that also serves vec_dot (NR = NV = 1) */
#define EL_ROWS_ENTRY(ATTR, NAME, TILE)                                                            \
    ATTR static void NAME##_rows(size_t n, const void *w, size_t ws, const void *a, float *out) {  \
        TILE(n, w, ws, EL_MV_ROWS, a, 0, 1, out, 1);                                               \
    }

/* vec_dot and vec_dot_nv from a tile body, through its one-weight-row case */
#define EL_TILE_NV_ENTRIES(ATTR, NAME, TILE)                                                       \
    ATTR EL_FORCE_INLINE void NAME##_one(size_t n, const void *w, const void *a, size_t as, const int NV, \
                                         float *out) {                                            \
        TILE(n, w, 0, 1, a, as, NV, out, 0);                                                       \
    }                                                                                              \
    EL_NV_ENTRIES(ATTR, NAME, NAME##_one)

/* vec_dot_tile (EL_TILE_ROWS weight rows x nv activation rows) from a tile body: NAME##_tile2 */
#define EL_TILE2_ENTRY(ATTR, NAME, TILE)                                                           \
    ATTR static void NAME##_tile2(size_t n, const void *w, size_t ws, const void *a, size_t as, size_t nv, \
                                  float *out, size_t ldo) {                                       \
        switch (nv) {                                                                              \
        case 1: TILE(n, w, ws, EL_TILE_ROWS, a, as, 1, out, ldo); break;                           \
        case 2: TILE(n, w, ws, EL_TILE_ROWS, a, as, 2, out, ldo); break;                           \
        case 3: TILE(n, w, ws, EL_TILE_ROWS, a, as, 3, out, ldo); break;                           \
        default: TILE(n, w, ws, EL_TILE_ROWS, a, as, 4, out, ldo); break;                          \
        }                                                                                          \
    }

/* vec_dot, vec_dot_nv and vec_dot_rows from one tile body */
#define EL_TILE_ENTRIES(ATTR, NAME, TILE) EL_TILE_NV_ENTRIES(ATTR, NAME, TILE) EL_ROWS_ENTRY(ATTR, NAME, TILE)

/* Installs a type's kernels made by EL_TILE_ENTRIES (NAME, NAME##_nv, NAME##_rows) and its tile: the
 * four together, and clears vec_dot_panel, as dispatch.h requires of an ISA that replaces a vec_dot (a
 * multi-row kernel of the table below left in place would give that table's bits). */
#define EL_SET_DOT_ENTRIES(K, TYPE, NAME, TILE)                                                    \
    ((K)->vec_dot[TYPE] = NAME, (K)->vec_dot_nv[TYPE] = NAME##_nv, (K)->vec_dot_tile[TYPE] = (TILE), \
     (K)->vec_dot_rows[TYPE] = NAME##_rows, (K)->vec_dot_panel[TYPE] = NULL)

#endif

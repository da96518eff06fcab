/* arch/head_block.h - the attention kernels' dispatch over the query heads left in a group, and the
 * value side's key-block driver built on it (shared by the AVX2 and NEON files).
 * CALL(GB) runs for GB = min(LEFT, 4) heads; GB is a constant in each call, so the inlined kernel
 * keeps its per-head accumulators in registers. */
#ifndef EL_HEAD_BLOCK_H
#define EL_HEAD_BLOCK_H

#define HEAD_BLOCK(LEFT, CALL)                                                                     \
    switch (LEFT) {                                                                                \
    case 1: CALL(1); break;                                                                        \
    case 2: CALL(2); break;                                                                        \
    case 3: CALL(3); break;                                                                        \
    default: CALL(4); break;                                                                       \
    }

/* Defines `static void NAME(...)`, an el_attn_pv_fn (put the ISA's target attribute before it).
 * Keys in blocks of KEYS: a block's value rows are read once from memory, front to back, and stay in
 * L1 while the including file's pv_heads(hd, g, p, v, stride, idx, n, o, GB) passes its column slices
 * over them; o stays in L1 too, and the file's prefetch_row(p, bytes) asks for the next block early.
 * Every output still sums its keys in ascending order. */
#define PV_HEADS_OF_BLOCK(GB) pv_heads(hd, g, ph, v, stride, idx + j0, nb, oh, GB)
#define ATTN_PV_KEY_BLOCKS(NAME, KEYS)                                                             \
    static void NAME(size_t hd, size_t g, const float *p, const void *v, size_t stride,           \
                     const int32_t *idx, size_t n, float *o) {                                     \
        for (size_t j0 = 0; j0 < n; j0 += (KEYS)) {                                                \
            const size_t nb = n - j0 < (KEYS) ? n - j0 : (KEYS);                                   \
            const float *pj = p + j0 * g;                                                          \
            for (size_t a = j0 + (KEYS); a < j0 + 2 * (KEYS) && a < n; a++) /* the next block */   \
                prefetch_row((const char *)v + (size_t)idx[a] * stride, hd * 2);                   \
            for (size_t h = 0; h < g; h += 4) {                                                    \
                const float *ph = pj + h;                                                          \
                float *oh = o + h * hd;                                                            \
                HEAD_BLOCK(g - h, PV_HEADS_OF_BLOCK)                                               \
            }                                                                                      \
        }                                                                                          \
    }

#endif

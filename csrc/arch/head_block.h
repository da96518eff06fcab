/* arch/head_block.h - the attention kernels' dispatch over the query heads left in a group.
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

#endif

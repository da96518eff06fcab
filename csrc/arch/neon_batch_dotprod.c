/* arch/neon_batch_dotprod.c - the batch kernels of neon_batch.c compiled again with the dotprod
 * extension (vdotq_s32), as neon_dotprod.c does for neon.c; installed only with HWCAP_ASIMDDP. */
#if defined(__aarch64__)
#pragma GCC target("arch=armv8.2-a+dotprod")
#define EL_NEON_DOTPROD 1
#include "neon_batch.c"
#else
typedef int el_neon_batch_dotprod_unused; /* ISO C wants a declaration in every translation unit */
#endif

/* arch/neon_dotprod.c - the integer dot products of neon.c compiled again with the dotprod extension
 * (vdotq_s32, Cortex-A76 / Pi 5 and later). Only reached when dispatch.c saw HWCAP_ASIMDDP. */
#if defined(__aarch64__)
/* armv8.2-a as well: GCC's arm_neon.h declares vdotq_s32 for "arch=armv8.2-a+dotprod", and a bare
 * "+dotprod" on armv8-a is not a superset of that (the inliner refuses). The dotprod cores (A55, A75,
 * A76 and later) are all v8.2. */
#pragma GCC target("arch=armv8.2-a+dotprod")
#define EL_NEON_DOTPROD 1
#include "neon.c"
#else
typedef int el_neon_dotprod_unused; /* ISO C wants a declaration in every translation unit */
#endif

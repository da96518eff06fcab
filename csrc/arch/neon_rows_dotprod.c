/* arch/neon_rows_dotprod.c - the matvec kernels of neon_rows.c compiled again with the dotprod extension
 * (vdotq_s32); reached only through el_kernels_fill_neon_rows(k, 1), which dispatch.c calls when it saw
 * HWCAP_ASIMDDP. Target as in neon_dotprod.c (armv8.2-a: what GCC's arm_neon.h wants for vdotq_s32). */
#if defined(__aarch64__)
#pragma GCC target("arch=armv8.2-a+dotprod")
#define EL_NEON_DOTPROD 1
#include "neon_rows.c"
#else
typedef int el_neon_rows_dotprod_unused; /* ISO C wants a declaration in every translation unit */
#endif

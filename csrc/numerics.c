/* numerics.c - the forward pass's numerics modes (enum el_numerics) as tables of the operations
 * that differ: activation quantizer, matmul, SwiGLU, attention, RoPE's rounding. NATIVE is this
 * CPU's fastest kernels; LLAMACPP llama.cpp's float order (llamacpp_exact.c). el_model_set_numerics
 * picks a table (model.c checks what the mode needs and allocates its scratch); the pass calls
 * through it without knowing the modes. */
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
static void llx_attention(el_model *m, const kv_layer *c, const el_attn_args *a) {
    int32_t max_pos = 0;
    for (int32_t s = 0; s < c->n_used; s++) max_pos = c->pos[s] > max_pos ? c->pos[s] : max_pos;
    const size_t cells = ((size_t)max_pos + 1 + 63) & ~(size_t)63;
    el_llx_attention(m->pool, a, cells < m->llx_cells ? cells : m->llx_cells,
                     m->llx_scratch);
}

static const el_numerics_ops g_native = {el_quantize_act, el_matmul_act, native_swiglu, native_attention,
                                         native_attention_seqs, 0};
static const el_numerics_ops g_llamacpp = {el_llx_quantize, el_llx_matmul_act, el_llx_swiglu, llx_attention, NULL, 1};

const el_numerics_ops *el_numerics_ops_of(int numerics) {
    switch (numerics) {
    case EL_NUMERICS_NATIVE: return &g_native;
    case EL_NUMERICS_LLAMACPP: return &g_llamacpp;
    default: return NULL;
    }
}

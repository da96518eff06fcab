/* edgellama.h - the public C API of the edgellama kernel library.
 * Opaque handles, explicit sizes, integer status codes. The only global state is the
 * CPU-feature dispatch table (el_isa_*).
 * Threads: any function may be called from any thread. A pool runs one computation at a time:
 * el_matmul and every el_model_* call on a model's cache or numerics (eval, n_past, truncate, shift,
 * set_numerics, state size / save / load) hold the pool (the model's pool) until they return, and
 * a call from another thread waits for it, so several threads may share a pool or a model and
 * their calls are serialized (each one whole; calls that must go together, such as truncate then
 * eval, need the caller's own lock). el_isa_set may run meanwhile: every kernel lookup sees one
 * ISA's complete table. Freeing a handle while another thread uses it is the caller's error (a
 * pool's owner may free it while models use it: see el_pool_free). */
#ifndef EDGELLAMA_H
#define EDGELLAMA_H

#include <stddef.h>
#include <stdint.h>

/* The library is built with -fvisibility=hidden: the functions marked EL_API (here and in the
 * test API, edgellama_test.h) are the only symbols it exports. */
#if defined(__GNUC__) || defined(__clang__)
#define EL_API __attribute__((visibility("default")))
#else
#define EL_API
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ---- status codes (negative = error) ---- */
enum el_status {
    EL_OK = 0,
    EL_EINVAL = -1,       /* bad argument: size mismatch, NULL, out of range */
    EL_ENOMEM = -2,       /* allocation failed */
    EL_EUNSUPPORTED = -3, /* type / ISA / architecture not supported */
    EL_ETHREAD = -4,      /* thread creation failed */
    EL_ECTX = -5,         /* context (KV cache) full or position out of range */
    EL_EBUSY = -6         /* the pool is already held by this thread (a call made from inside another) */
};
EL_API const char *el_status_str(int status);

/* ---- ggml tensor types, numbered as in GGUF ---- */
enum el_type {
    EL_TYPE_F32 = 0,
    EL_TYPE_F16 = 1,
    EL_TYPE_Q4_0 = 2,
    EL_TYPE_Q4_1 = 3,
    EL_TYPE_Q5_0 = 6,
    EL_TYPE_Q5_1 = 7,
    EL_TYPE_Q8_0 = 8,
    EL_TYPE_Q8_1 = 9,   /* activations only (internal) */
    EL_TYPE_Q2_K = 10,
    EL_TYPE_Q3_K = 11,
    EL_TYPE_Q4_K = 12,
    EL_TYPE_Q5_K = 13,
    EL_TYPE_Q6_K = 14,
    EL_TYPE_Q8_K = 15,  /* activations only (internal) */
    EL_TYPE_BF16 = 30,
    EL_TYPE_COUNT = 31
};

EL_API int el_type_supported(int type);          /* 1 if dequant/quant/dot exist for it */
EL_API size_t el_type_block_size(int type);      /* values per block, 0 if unknown */
EL_API size_t el_type_block_bytes(int type);     /* bytes per block, 0 if unknown */
EL_API size_t el_row_bytes(int type, size_t n);  /* 0 if unknown type or n not a multiple of the block */
EL_API int el_vec_dot_type(int wtype);           /* activation format the dot product of wtype uses */

/* n values of `type` in src (src_bytes must equal el_row_bytes(type, n)) -> n floats. */
EL_API int el_dequantize(int type, const void *src, size_t src_bytes, float *dst, size_t n);
/* n floats -> dst (dst_bytes must equal el_row_bytes(type, n)), reference quantizer. */
EL_API int el_quantize(int type, const float *src, size_t n, void *dst, size_t dst_bytes);
/* Dot product of one weight row (wtype) with one activation row already in el_vec_dot_type(wtype). */
EL_API int el_vec_dot(int wtype, size_t n, const void *w, size_t w_bytes, const void *a, size_t a_bytes, float *out);

/* ---- CPU feature dispatch ---- */
EL_API const char *el_isa_name(void);         /* "scalar", "avx2", "avx512", "neon", "neon-dotprod" */
EL_API int el_isa_set(const char *name);      /* EL_EUNSUPPORTED if this CPU/build lacks it; NULL = best */
EL_API int el_isa_available(const char *name);
EL_API const char *el_cpu_features(void);     /* space separated feature names seen at run time */

/* ---- thread pool: persistent workers, no thread creation per call ---- */
typedef struct el_pool el_pool;
EL_API int el_pool_create(int n_threads, el_pool **out);
/* The owner lets go of the pool. Models created on it keep it alive: while any is not freed, the
 * pool (and its threads) stays, and the last el_model_free frees it; the handle must not be used
 * after this call either way. */
EL_API void el_pool_free(el_pool *pool);
EL_API int el_pool_threads(const el_pool *pool);
EL_API int el_pool_users(const el_pool *pool);  /* models created on the pool and not yet freed */

/* Y[v][r] = sum_c W[r][c] * X[v][c] for v < n_vec, r < rows.
 * W: rows x el_row_bytes(wtype, cols) bytes (w_bytes must equal that product); X: n_vec x cols floats;
 * Y: n_vec x rows floats. Each output is computed by one thread in a fixed order, so results do not
 * depend on the thread count. Scratch for quantized activations comes from the pool. */
EL_API int el_matmul(el_pool *pool, int wtype, const void *w, size_t w_bytes, size_t rows, size_t cols,
                     const float *x, size_t n_vec, float *y);

/* ---- float32 ops a decoder needs ---- */
EL_API void el_rmsnorm(float *out, const float *x, const float *weight, size_t n, float eps); /* weight may be NULL */
EL_API void el_softmax(float *x, size_t n);
/* Rotates n_head heads of head_dim floats at position pos; the first n_rot dims of each head rotate.
 * neox=0: pairs (2i, 2i+1) (llama); neox=1: pairs (i, i + n_rot/2) (NeoX, Gemma, Qwen). */
EL_API void el_rope(float *x, size_t n_head, size_t head_dim, size_t n_rot, int32_t pos, float freq_base,
                    float freq_scale, int neox);
EL_API void el_silu(float *x, size_t n);
EL_API void el_gelu(float *x, size_t n);  /* tanh approximation */
EL_API void el_add(float *y, const float *a, const float *b, size_t n);
EL_API void el_mul(float *y, const float *a, const float *b, size_t n);
EL_API void el_scale(float *x, float s, size_t n);

/* Attention of n_q query rows (each n_head x head_dim, at positions q_pos[i]) over n_kv cached
 * keys/values (each n_head_kv x head_dim, at positions kv_pos[j]; kv_type F32, F16 or Q8_0 rows of
 * head_dim). Causal: key j is visible to query i when kv_pos[j] <= q_pos[i], and when window > 0
 * also q_pos[i] - kv_pos[j] < window. out: n_q x n_head x head_dim. */
EL_API int el_attention(const float *q, size_t n_q, const int32_t *q_pos, size_t n_head, size_t n_head_kv,
                        size_t head_dim, int kv_type, const void *k, const void *v, const int32_t *kv_pos,
                        size_t n_kv, int32_t window, float scale, float *out);

/* ---- decoder model: weights are pointers into the caller's mmapped file (never copied) ---- */
typedef struct el_tensor {
    const void *data;   /* NULL = absent */
    size_t nbytes;
    int type;           /* enum el_type */
    int64_t ne0, ne1;   /* ne0 = row length (inner), ne1 = rows; 1-D tensors have ne1 = 1 */
} el_tensor;

/* LLAMA and GEMMA3: pre-norm decoders (RMS norms). BERT: a post-norm encoder (bert, nomic-bert): the
 * embedding row plus type_embd's row 0 plus pos_embd's row at the position (each optional), then
 * LayerNorm tok_norm / tok_norm_b; per layer no norm before the blocks, x = LayerNorm(x + attention)
 * with attn_norm / attn_norm_b and x = LayerNorm(x + FFN) with ffn_norm / ffn_norm_b; an FFN without
 * w_gate is down(act(up x + b_up)) + b_down. It has no output head: only el_model_decode_embd. */
enum el_arch { EL_ARCH_LLAMA = 1, EL_ARCH_GEMMA3 = 2, EL_ARCH_BERT = 3 };
enum el_act { EL_ACT_SILU = 0, EL_ACT_GELU = 1 };

typedef struct el_layer {
    el_tensor attn_norm, wq, wk, wv, wo, bq, bk, bv, q_norm, k_norm, attn_post_norm;
    el_tensor ffn_norm, w_gate, w_up, w_down, ffn_post_norm;
    el_tensor rope_freqs;         /* F32, n_rot/2 divisors of the rotation frequencies (Llama 3's
                                     scaling, Phi-3's LongRoPE factors); data NULL = none */
    float rope_base, rope_scale;  /* per layer: Gemma 3 local layers use another base */
    int32_t window;               /* sliding window in tokens, 0 = global */
    int32_t no_rope;              /* 1: queries and keys are not rotated (SmolLM3's every 4th layer) */
    el_tensor bo, b_up, b_down;   /* F32 biases of wo, w_up, w_down; data NULL = none */
    el_tensor attn_norm_b, ffn_norm_b; /* BERT: the LayerNorms' biases (required there, absent elsewhere) */
} el_layer;

/* YaRN (rope.scaling.type yarn): ext_factor 0 = off; a layer's rope_scale is then 1/factor. The
 * rotation's cos and sin are multiplied by attn_factor (LongRoPE's attention factor; YaRN's own
 * magnitude correction on top when ext_factor != 0); 0 = 1 = none, so a zeroed struct is plain RoPE. */
typedef struct el_rope_ext {
    float ext_factor, attn_factor, beta_fast, beta_slow;
    int32_t n_ctx_orig;           /* YaRN's original context (its correction dims depend on it) */
} el_rope_ext;

typedef struct el_model_desc {
    int arch, act, rope_neox;
    int32_t n_layer, n_embd, n_head, n_head_kv, head_dim, n_rot, n_ff, n_vocab;
    float norm_eps, emb_scale, attn_scale;
    float attn_softcap, final_softcap;        /* Gemma 2's cap*tanh(x/cap) of the attention scores and
                                                 of the logits; 0 = none */
    int scale_q;                              /* 1: attn_scale multiplies Q after RoPE, the scores are not
                                                 scaled (llama.cpp's phi3 and Gemma graphs); 0: the scores */
    el_rope_ext rope;
    el_tensor tok_embd, output_norm, output;  /* output.data NULL = tied to tok_embd; BERT: neither */
    const el_layer *layers;                   /* n_layer entries */
    /* BERT's input: token-type embeddings (row 0 is added: every token is of type 0), absolute
     * position embeddings (n_ctx must not pass their rows), the LayerNorm after them; NULL elsewhere */
    el_tensor type_embd, pos_embd, tok_norm, tok_norm_b;
    int non_causal;                           /* 1: every token of a sequence sees all of them (BERT): a
                                                 sequence's tokens must all come in one batch, from
                                                 position 0 of an empty sequence */
} el_model_desc;

typedef struct el_model el_model;
/* Allocates the KV cache (n_ctx slots per global layer, min(n_ctx, window) per windowed layer, in
 * kv_type F16 or Q8_0) and all scratch for batches of up to n_batch tokens, once. EL_ENOMEM when an
 * allocation fails or when the sizes do not even fit size_t (a 32-bit build): never a wrapped size. */
EL_API int el_model_create(const el_model_desc *desc, el_pool *pool, int32_t n_ctx, int32_t n_batch,
                           int kv_type, el_model **out);
EL_API void el_model_free(el_model *model);
EL_API size_t el_model_kv_bytes(const el_model *model);
EL_API size_t el_model_scratch_bytes(const el_model *model);
/* Evaluates n tokens at positions pos0..pos0+n-1, continuing the cached sequence: pos0 must equal
 * el_model_n_past (EL_ECTX otherwise, and when pos0 + n passes n_ctx). Writes logits of the last
 * token (n_vocab floats), or of every token when all_logits (n x n_vocab). */
EL_API int el_model_eval(el_model *model, const int32_t *tokens, size_t n, int32_t pos0, float *logits,
                         int all_logits);
/* Length of the cached sequence (what the global layers hold; the newest position + 1 when every
 * layer is windowed): the pos0 of the next el_model_eval. */
EL_API int32_t el_model_n_past(const el_model *model);
/* Forgets cached positions >= pos (to re-evaluate from there). EL_ECTX when a windowed layer's ring
 * no longer holds the keys that position needs (the caller must then re-evaluate from 0). */
EL_API int el_model_truncate(el_model *model, int32_t pos);
/* Streaming: drops positions [n_keep, n_keep + n_discard) and moves every later entry down by
 * n_discard, re-rotating its key, so generation continues at position n_past - n_discard. */
EL_API int el_model_shift(el_model *model, int32_t n_keep, int32_t n_discard);
/* Memory a model would take, computed exactly as el_model_create allocates it (no allocation).
 * EL_ENOMEM when a size does not fit size_t (a 32-bit build with a large context or batch). */
EL_API int el_model_plan(const el_model_desc *desc, int32_t n_ctx, int32_t n_batch, int kv_type, int n_threads,
                         size_t *kv_bytes, size_t *scratch_bytes);
/* Numerics of a model's forward pass. NATIVE: the fastest kernels of this CPU. LLAMACPP_AVX2 /
 * LLAMACPP_AVX512: llama.cpp's own order of every float operation as its x86 AVX2 / AVX-512 build
 * runs it (flash attention off; the two sum softmax, SwiGLU and fp16 attention in vectors of 8 and
 * 16), so logits equal that build's bit for bit on any CPU (portable C, with SIMD versions of the
 * same bits), at some cost in speed. LLAMACPP: the one of the two llama.cpp builds natively for this
 * CPU (AVX-512 on an x86 CPU with AVX-512 VNNI, else AVX2; on other CPUs AVX-512). They need an F16
 * KV cache and weights of the types they implement (Q5_0, Q8_0, Q4_1, Q4_K with rows % 8 == 0, Q6_K;
 * F32 norms): EL_EUNSUPPORTED otherwise. Their scratch (el_model_numerics_bytes, then counted in
 * el_model_scratch_bytes) is allocated here, once. Exact while no ring has wrapped and no shift ran. */
enum el_numerics { EL_NUMERICS_NATIVE = 0, EL_NUMERICS_LLAMACPP = 1, EL_NUMERICS_LLAMACPP_AVX2 = 2,
                   EL_NUMERICS_LLAMACPP_AVX512 = 3 };
EL_API int el_model_set_numerics(el_model *model, int numerics);
/* Bytes el_model_set_numerics allocates for a model of this shape (0: native, or not possible,
 * including sizes that do not fit size_t; el_model_set_numerics then returns EL_ENOMEM). */
EL_API size_t el_model_numerics_bytes(const el_model_desc *desc, int32_t n_ctx, int32_t n_batch, int n_threads,
                                      int numerics);
/* KV cache state (session save/restore): a blob of el_model_state_size bytes (0 = does not fit
 * size_t: save refuses); load refuses a blob from another model shape, cache type, context or batch size. */
EL_API size_t el_model_state_size(const el_model *model);
EL_API int el_model_state_save(const el_model *model, void *buf, size_t size);
EL_API int el_model_state_load(el_model *model, const void *buf, size_t size);

/* ---- several sequences in one model (slots): one forward pass carries tokens of many ----
 * A model created with n_seq sequences holds n_seq KV caches of the shape el_model_create gives one
 * (each its own positions, rings, truncate, shift and state); el_model_create is n_seq = 1, and the
 * single-sequence calls above act on sequence 0. A batch of el_model_decode mixes entries of any
 * sequences: every matmul runs once over all its rows (the weights are read once per pass), attention
 * runs per sequence over that sequence's cache only. In native numerics a sequence's logits do not
 * depend on what else is in the batch (every matmul output has the bits of one vec_dot, attention
 * chunks by the cache contents): the same bits as running it alone. EL_NUMERICS_LLAMACPP refuses a
 * batch with entries of more than one sequence (EL_EUNSUPPORTED): its exactness is per sequence. */
enum { EL_MAX_SEQ = 256 };
typedef struct el_batch_entry {
    int32_t seq;    /* 0 <= seq < n_seq */
    int32_t token;  /* 0 <= token < n_vocab */
    int32_t pos;    /* a sequence's entries continue it: el_model_seq_n_past, then +1 per entry in order */
    int32_t logits; /* nonzero: this entry's logits are wanted */
} el_batch_entry;
/* el_model_plan / el_model_create for n_seq (1..EL_MAX_SEQ) sequences: kv_bytes counts every
 * sequence's cache (n_seq times one), the scratch is shared (batches of up to n_batch entries). */
EL_API int el_model_plan_seqs(const el_model_desc *desc, int32_t n_ctx, int32_t n_batch, int kv_type, int n_threads,
                              int32_t n_seq, size_t *kv_bytes, size_t *scratch_bytes);
EL_API int el_model_create_seqs(const el_model_desc *desc, el_pool *pool, int32_t n_ctx, int32_t n_batch,
                                int kv_type, int32_t n_seq, el_model **out);
EL_API int32_t el_model_n_seq(const el_model *model);
/* Evaluates n (1..n_batch) entries in one pass. logits: one row of n_vocab floats per entry that wants
 * them, in entry order (NULL allowed when none does). EL_ECTX when an entry's position does not
 * continue its sequence or passes n_ctx; EL_EINVAL for a bad sequence id or token. Nothing is
 * written to any cache unless the whole batch is valid. */
EL_API int el_model_decode(el_model *model, const el_batch_entry *batch, size_t n, float *logits);
/* el_model_decode's pass, returning for each entry that wants it (its logits flag set) the hidden state
 * the output head would read: n_embd floats after the output norm (a BERT model's last layer), rows in
 * entry order. Embeddings are pooled from these (by the caller). The only output of a BERT model. */
EL_API int el_model_decode_embd(el_model *model, const el_batch_entry *batch, size_t n, float *embd);
/* The single-sequence calls for sequence seq (EL_EINVAL / -1 / 0 for a bad seq). Clear forgets the
 * whole sequence and leaves its cache as a new model's (truncate to 0 does the same). */
EL_API int32_t el_model_seq_n_past(const el_model *model, int32_t seq);
EL_API int el_model_seq_clear(el_model *model, int32_t seq);
EL_API int el_model_seq_truncate(el_model *model, int32_t seq, int32_t pos);
EL_API int el_model_seq_shift(el_model *model, int32_t seq, int32_t n_keep, int32_t n_discard);
/* A sequence's state blob: loads into any sequence of a model of the same shape, cache type, context
 * and batch size (the number of sequences may differ). */
EL_API size_t el_model_seq_state_size(const el_model *model, int32_t seq);
EL_API int el_model_seq_state_save(const el_model *model, int32_t seq, void *buf, size_t size);
EL_API int el_model_seq_state_load(el_model *model, int32_t seq, const void *buf, size_t size);

/* ---- LoRA adapters: y = W x + scale * B (A x) on a model's matmul weights ----
 * An adapter (index 0..EL_MAX_LORA-1) is a set of terms, one per weight it changes: A (rank x n_in
 * values, row-major) and B transposed, bt (rank x n_out, row-major: B^T[k][o] = B[o][k]), for weight
 * W of n_in columns and n_out rows. The values are the caller's and must stay valid and unchanged
 * until el_model_lora_clear or el_model_free (the weights of the model are never touched). Every term
 * is applied to the rows of a pass after its base matmul, adapters in index order, each with s = the
 * term's factor * the adapter's scale for the row's sequence: a scale of 0 (every scale starts at 0)
 * skips the adapter, so those rows have the base model's bits. A GGUF adapter's term has factor
 * alpha / rank (rank: that weight's; 1 without alpha) and the scale is the user's (llama.cpp's
 * --lora-scaled). Order of the float operations in both numerics modes: y = W x (the mode's matmul),
 * then per adapter t = A x (float dots), d = B t (per output, fused multiply-adds over k ascending),
 * y = y + s * d (llama.cpp's graph steps; the kernels are this library's).
 * Per row the result does not depend on the other rows of the batch. */
enum el_lora_target { EL_LORA_WQ = 0, EL_LORA_WK = 1, EL_LORA_WV = 2, EL_LORA_WO = 3, EL_LORA_W_GATE = 4,
                      EL_LORA_W_UP = 5, EL_LORA_W_DOWN = 6, EL_LORA_OUTPUT = 7 /* layer ignored */ };
enum { EL_MAX_LORA = 64, EL_MAX_LORA_RANK = 8192 };
/* EL_EINVAL for a bad adapter index, layer, target, rank (1..EL_MAX_LORA_RANK), NULL pointers, n_in /
 * n_out that are not the weight's columns / rows, a factor that is not finite, or a second term of
 * one adapter on one weight;
 * EL_ENOMEM when the scratch for a new largest rank (el_model_lora_bytes) cannot be allocated. */
EL_API int el_model_lora_attach(el_model *model, int32_t adapter, int32_t layer, int target, const float *a,
                                const float *bt, int32_t rank, int64_t n_in, int64_t n_out, float factor);
/* the same with A and B^T stored as a_type / b_type: EL_TYPE_F32 or EL_TYPE_F16 (any other: EL_EINVAL).
 * Halves are kept as they are (half the bytes read per pass, the cost of an adapter in decode) and
 * widened exactly inside kernels that compute as the F32 ones do: an F16 term gives the bits of the
 * same values stored as F32. */
EL_API int el_model_lora_attach_typed(el_model *model, int32_t adapter, int32_t layer, int target, int a_type,
                                      const void *a, int b_type, const void *bt, int32_t rank, int64_t n_in,
                                      int64_t n_out, float factor);
/* adapter's scale for sequence seq (-1: every sequence); finite, else EL_EINVAL */
EL_API int el_model_lora_scale(el_model *model, int32_t adapter, int32_t seq, float scale);
/* detaches every adapter (scales back to 0) and frees their scratch */
EL_API int el_model_lora_clear(el_model *model);
/* scratch bytes a model of batch n_batch allocates for terms of rank up to max_rank (0: invalid) */
EL_API size_t el_model_lora_bytes(int32_t n_batch, int32_t max_rank);

/* ---- grammar-constrained decoding (edgellama/grammar/) ---- */
/* A compiled grammar: code[] holds (type, value) int32 pairs, llama.cpp's layout: each rule's
 * alternatives are element runs ended by ALT, the last by END; a character set is CHAR or CHAR_NOT
 * then RNG_UPPER / CHAR_ALT pairs; CHAR_ANY is `.`. rule_start[r] is rule r's first pair. The grammar
 * object also holds the matcher's memo: states (sets of element stacks and a pending UTF-8 prefix),
 * interned, and their transitions by byte. States are ids >= 0; -1 is "no longer in the grammar". */
enum el_gram_type { EL_GRAM_END = 0, EL_GRAM_ALT = 1, EL_GRAM_RULE_REF = 2, EL_GRAM_CHAR = 3,
                    EL_GRAM_CHAR_NOT = 4, EL_GRAM_CHAR_RNG_UPPER = 5, EL_GRAM_CHAR_ALT = 6,
                    EL_GRAM_CHAR_ANY = 7 };
enum { EL_GRAM_ACCEPTING = 1, EL_GRAM_DONE = 2 };
typedef struct el_grammar el_grammar;
typedef struct el_vocab_trie el_vocab_trie;
/* EL_EINVAL names no position: the Python side validated the code; C re-checks every index. */
EL_API int el_grammar_create(const int32_t *code, size_t n_code, const int32_t *rule_start, size_t n_rules,
                             int32_t root, el_grammar **out);
EL_API void el_grammar_free(el_grammar *g);
EL_API int32_t el_grammar_start(el_grammar *g);  /* the state before any output (<0: error status) */
/* The state after bytes from state (-1: those bytes leave the grammar; < -1: error status). */
EL_API int32_t el_grammar_step(el_grammar *g, int32_t state, const uint8_t *bytes, size_t n);
EL_API int el_grammar_state_flags(const el_grammar *g, int32_t state);  /* EL_GRAM_ACCEPTING | EL_GRAM_DONE */
EL_API size_t el_grammar_memo_bytes(const el_grammar *g);
/* Drops the memo but state; returns state's new id (<0: error status). */
EL_API int32_t el_grammar_compact(el_grammar *g, int32_t state);
/* A byte trie over a vocabulary: token i's bytes are bytes[offsets[i] .. offsets[i+1]); tokens with no
 * bytes (control tokens) are left out, so no mask ever allows them. */
EL_API int el_vocab_trie_create(const uint8_t *bytes, const int64_t *offsets, size_t n_tokens, el_vocab_trie **out);
EL_API void el_vocab_trie_free(el_vocab_trie *t);
EL_API size_t el_vocab_trie_nodes(const el_vocab_trie *t);
/* mask[i] = 1 for each token whose bytes keep state inside the grammar, else 0 (n_mask >= the trie's tokens). */
EL_API int el_grammar_allowed(el_grammar *g, const el_vocab_trie *t, int32_t state, uint8_t *mask, size_t n_mask);

/* ---- file mappings: a SIGBUS (the file was truncated while mapped) reported by name ---- */
/* Registers [addr, addr + len) as a mapping of the file `name` (copied, up to 511 bytes). On the first
 * call a SIGBUS handler is installed: a fault inside a registered mapping writes one line naming the
 * file to stderr and exits with EL_SIGBUS_EXIT_CODE; other faults go to the previous handler. Up to
 * 64 mappings at a time (EL_ENOMEM beyond). Unregister before the range is unmapped. */
enum { EL_SIGBUS_EXIT_CODE = 74 }; /* EX_IOERR of sysexits.h */
EL_API int el_sigbus_register(const void *addr, size_t len, const char *name);
EL_API int el_sigbus_unregister(const void *addr);

#ifdef __cplusplus
}
#endif
#endif

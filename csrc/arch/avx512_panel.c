/* arch/avx512_panel.c - AVX-512 VNNI batches over packed activations (dispatch.h, "Activation panels"):
 * Q8_0 and Q5_0 weights against a group of up to EL_NV_MAX Q8_0 activation rows, Q4_K and Q6_K
 * weights against a group of up to EL_PANEL_K_ROWS Q8_K rows, two weight rows per tile. Per output
 * and block pair the Q8_0 / Q5_0 tile runs four zmm operations (vpdpbusd, the scale product, the
 * conversion, the FMA), the ones avx512.c's vec_dot runs, on the same int32 lanes in the same order;
 * the K-quant tiles run avx512_common.h's step per superblock, as vec_dot does. Everything that
 * depends on one activation row alone was done once by the packer. */
#include "../dispatch.h"

#if defined(__x86_64__)
#include "avx512_common.h"

/* Per group (EL_NV_MAX activation rows) and block pair (2p, 2p + 1), EL_PANEL512_ACT_BYTES per row j:
 *   [0, 64)    the pair's 64 values as they are (signed), the zmm bytes32_x2 loads
 *   [64, 128)  the scales as floats: lanes 0-7 dy(2p), lanes 8-15 dy(2p + 1)
 *   [128, 192) -16 (sum of each 4 values) as int32: Q5_0's start term (weights u = w + 16, unsigned)
 *   [192, 256) -128 (the same sums): Q8_0's (weights u = w + 128, unsigned)
 * vpdpbusd then gives each lane sum(u a) - K sum(a) = sum(w a), the int32 of avx512.c's lanes (which
 * for Q8_0 offsets the activations instead: the same exact integer). Rows past the batch and the
 * block after an odd last one are zeros (scale 0, as avx512.c's zero block). */
#define ACT_VALS 0
#define ACT_DY 64
#define ACT_ST16 128
#define ACT_ST128 192
_Static_assert(EL_PANEL512_ACT_BYTES == 256, "four zmm per activation row and block pair");

EL_AVX512 static void pack_panel_q8_0_avx512(const void *a, size_t as, size_t cols, size_t n_vec, void *panel) {
    static const uint8_t zero_a[34];
    const size_t nb = cols / 32, np = (nb + 1) / 2, group_bytes = el_panel_group_bytes(EL_TYPE_Q8_0, cols);
    const __m512i didx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    for (size_t g = 0; g * EL_NV_MAX < n_vec; g++) {
        const size_t nv = n_vec - g * EL_NV_MAX < EL_NV_MAX ? n_vec - g * EL_NV_MAX : EL_NV_MAX;
        for (size_t p = 0; p < np; p++) {
            uint8_t *q = (uint8_t *)panel + g * group_bytes + p * EL_PANEL512_PAIR_BYTES;
            for (size_t j = 0; j < EL_NV_MAX; j++) {
                uint8_t *o = q + j * EL_PANEL512_ACT_BYTES;
                if (j >= nv) {
                    memset(o, 0, EL_PANEL512_ACT_BYTES);
                    continue;
                }
                const uint8_t *y0 = (const uint8_t *)a + (g * EL_NV_MAX + j) * as + 2 * p * 34;
                const uint8_t *y1 = 2 * p + 1 < nb ? y0 + 34 : zero_a;
                const __m512i v = bytes32_x2(y0 + 2, y1 + 2);
                const __m512i s = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(1), v);
                const __m512i ns = _mm512_sub_epi32(_mm512_setzero_si512(), s);
                _mm512_storeu_si512((void *)(o + ACT_VALS), v);
                _mm512_storeu_ps(o + ACT_DY, _mm512_permutexvar_ps(didx, _mm512_castps128_ps512(halves1(y0, y1))));
                _mm512_storeu_si512((void *)(o + ACT_ST16), _mm512_slli_epi32(ns, 4));
                _mm512_storeu_si512((void *)(o + ACT_ST128), _mm512_slli_epi32(ns, 7));
            }
        }
    }
}

/* a weight pair's unsigned values: Q8_0 w + 128, Q5_0 nibble + 16 h */
EL_AVX512 static inline __m512i q8_0_u(const uint8_t *x0, const uint8_t *x1) {
    return _mm512_xor_si512(bytes32_x2(x0 + 2, x1 + 2), _mm512_set1_epi8((char)0x80));
}
#define q5_0_u q5_0_u_x2
#define q8_0_ST ACT_ST128
#define q5_0_ST ACT_ST16

/* Two weight rows (at w and w + ws) x NV rows of the group at g: out[r * NV + j]. avx512.c's tile body
 * with one accumulator per output, the pairs in order, the same reduction at the end. */
#define EL_PANEL512_TILE(T, WB)                                                                    \
    EL_AVX512 EL_FORCE_INLINE void T##_ptile(size_t n, const uint8_t *w, size_t ws, const uint8_t *g, const int NV, \
                                             float *out) {                                         \
        static const uint8_t zero_w[WB];                                                           \
        const size_t nb = n / 32;                                                                  \
        const __m512i didx = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);    \
        __m512 acc[EL_TILE_ROWS][EL_NV_MAX];                                                       \
        EL_UNROLL for (int r = 0; r < EL_TILE_ROWS; r++)                                           \
            EL_UNROLL for (int j = 0; j < NV; j++) acc[r][j] = _mm512_setzero_ps();                \
        for (size_t i = 0; i < nb; i += 2) {                                                       \
            const uint8_t *q = g + i / 2 * EL_PANEL512_PAIR_BYTES;                                 \
            __m512i u[EL_TILE_ROWS];                                                               \
            __m512 dx[EL_TILE_ROWS];                                                               \
            EL_UNROLL for (int r = 0; r < EL_TILE_ROWS; r++) {                                     \
                const uint8_t *x0 = w + r * ws + i * (WB), *x1 = i + 1 < nb ? x0 + (WB) : zero_w;  \
                _mm_prefetch((const char *)x0 + EL_PF_DIST, _MM_HINT_T0);                          \
                u[r] = T##_u(x0, x1);                                                              \
                dx[r] = _mm512_permutexvar_ps(didx, _mm512_castps128_ps512(halves1(x0, x1)));      \
            }                                                                                      \
            EL_UNROLL for (int j = 0; j < NV; j++) {                                               \
                const uint8_t *o = q + j * EL_PANEL512_ACT_BYTES;                                  \
                const __m512i av = _mm512_loadu_si512((const void *)(o + ACT_VALS));                \
                const __m512i st = _mm512_loadu_si512((const void *)(o + T##_ST));                  \
                const __m512 dy = _mm512_loadu_ps(o + ACT_DY);                                      \
                EL_UNROLL for (int r = 0; r < EL_TILE_ROWS; r++) {                                 \
                    const __m512 f = _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(st, u[r], av));        \
                    acc[r][j] = _mm512_fmadd_ps(_mm512_mul_ps(dx[r], dy), f, acc[r][j]);           \
                }                                                                                  \
            }                                                                                      \
        }                                                                                          \
        EL_UNROLL for (int r = 0; r < EL_TILE_ROWS; r++)                                           \
            EL_UNROLL for (int j = 0; j < NV; j++) out[r * NV + j] = _mm512_reduce_add_ps(acc[r][j]); \
    }                                                                                              \
    EL_PANEL_FROM_TILE(EL_AVX512, T##_panel512, T##_ptile)
_Static_assert(EL_TILE_ROWS == 2, "panel tiles: two rows");

EL_PANEL512_TILE(q8_0, 34)
EL_PANEL512_TILE(q5_0, 22)

/* ---- K-quants (Q4_K, Q6_K) x Q8_K ----
 * Per group (EL_PANEL_K_ROWS activation rows) and superblock, EL_PANEL512K_ACT_BYTES per row j:
 * el_q8k_act (avx512_common.h) as avx512.c's vec_dot builds it for every weight row:
 *   [0, 256)    the values reordered (a[0..3])
 *   [256, 288)  dy (bsums[2s] + bsums[2s + 1]) as 8 floats (bs)
 *   [288, 320)  bsums as they are (16 int16)
 *   [320, 576)  the values in their own order (nat)
 *   [576, 580)  dy; the rest zero. Rows past the batch are zeros. */
#define ACTK_BS 256
#define ACTK_BSUMS 288
#define ACTK_NAT 320
#define ACTK_DY 576
_Static_assert(EL_PANEL512K_ACT_BYTES >= ACTK_DY + 4 && EL_PANEL512K_ACT_BYTES % 64 == 0, "Q8_K panel row");

EL_AVX512 static void pack_panel_q8_K_avx512(const void *a, size_t as, size_t cols, size_t n_vec, void *panel) {
    const size_t nsb = cols / QK_K, group_bytes = el_panel_group_bytes(EL_TYPE_Q8_K, cols);
    for (size_t g = 0; g * EL_PANEL_K_ROWS < n_vec; g++) {
        const size_t nv = n_vec - g * EL_PANEL_K_ROWS < EL_PANEL_K_ROWS ? n_vec - g * EL_PANEL_K_ROWS : EL_PANEL_K_ROWS;
        for (size_t i = 0; i < nsb; i++)
            for (size_t j = 0; j < EL_PANEL_K_ROWS; j++) {
                uint8_t *o = (uint8_t *)panel + g * group_bytes + i * EL_PANEL512K_SB_BYTES + j * EL_PANEL512K_ACT_BYTES;
                memset(o, 0, EL_PANEL512K_ACT_BYTES);
                if (j >= nv) continue;
                el_q8k_act y;
                el_q8k_act_prep((const uint8_t *)a + (g * EL_PANEL_K_ROWS + j) * as + i * Q8K_BYTES, &y);
                for (int c = 0; c < 4; c++) _mm512_storeu_si512((void *)(o + 64 * c), y.a[c]);
                _mm256_storeu_ps((float *)(o + ACTK_BS), _mm512_castps512_ps256(y.bs));
                _mm256_storeu_si256((__m256i *)(o + ACTK_BSUMS), y.bsums);
                memcpy(o + ACTK_NAT, y.nat, QK_K);
                memcpy(o + ACTK_DY, &y.d, sizeof y.d);
            }
    }
}

/* Two rows (at w and w + ws) x NV rows of the group at g: out[r * NV + j], the type's step per output
 * and superblock as avx512.c's vec_dot, the same reduction at the end. Each row's unpacking serves all
 * the group's activation rows (up to 8: 16 accumulators, some unpacked registers spill to L1; that
 * measured faster than 4 at a time or one row at a time, for Q6_K too). */
#define EL_KQ_PANEL512(NAME, T, BLOCK)                                                             \
    EL_AVX512 EL_FORCE_INLINE void NAME##_ptile(size_t n, const uint8_t *w, size_t ws, const uint8_t *g, \
                                                const int NV, float *out) {                        \
        __m512 acc[EL_TILE_ROWS][EL_PANEL_K_ROWS];                                                 \
        EL_UNROLL for (int r = 0; r < EL_TILE_ROWS; r++)                                           \
            EL_UNROLL for (int j = 0; j < NV; j++) acc[r][j] = _mm512_setzero_ps();                \
        for (size_t i = 0; i < n / QK_K; i++) {                                                    \
            T##_w x4[EL_TILE_ROWS];                                                                \
            EL_UNROLL for (int r = 0; r < EL_TILE_ROWS; r++) T##_w_prep(w + r * ws + i * sizeof(BLOCK), &x4[r]); \
            EL_UNROLL for (int j = 0; j < NV; j++) {                                               \
                const uint8_t *o = g + i * EL_PANEL512K_SB_BYTES + (size_t)j * EL_PANEL512K_ACT_BYTES; \
                el_q8k_act y;                                                                      \
                for (int c = 0; c < 4; c++) y.a[c] = loadu512(o + 64 * c);                         \
                y.bs = _mm512_zextps256_ps512(_mm256_loadu_ps((const float *)(o + ACTK_BS)));      \
                y.bsums = loadu256(o + ACTK_BSUMS);                                                \
                y.nat = o + ACTK_NAT;                                                              \
                const __m512 yd = _mm512_set1_ps(load_f32(o + ACTK_DY));                           \
                EL_UNROLL for (int r = 0; r < EL_TILE_ROWS; r++) acc[r][j] = T##_step(acc[r][j], &x4[r], &y, yd); \
            }                                                                                      \
        }                                                                                          \
        EL_UNROLL for (int r = 0; r < EL_TILE_ROWS; r++)                                           \
            EL_UNROLL for (int j = 0; j < NV; j++) out[r * NV + j] = _mm512_reduce_add_ps(acc[r][j]); \
    }                                                                                              \
    EL_PANEL8_FROM_TILE(EL_AVX512, NAME, NAME##_ptile)

_Static_assert(EL_PANEL_K_ROWS == 8, "the K-quant panel tiles take up to 8 activation rows");
EL_KQ_PANEL512(q4_K_panel512, el_q4k, block_q4_K)
EL_KQ_PANEL512(q6_K_panel512, el_q6k, block_q6_K)

void el_kernels_fill_avx512_panel(el_kernels *k) {
    k->pack_panel[EL_TYPE_Q8_0] = pack_panel_q8_0_avx512;
    k->vec_dot_panel[EL_TYPE_Q8_0] = q8_0_panel512;
    k->vec_dot_panel[EL_TYPE_Q5_0] = q5_0_panel512;
    k->pack_panel[EL_TYPE_Q8_K] = pack_panel_q8_K_avx512;
    k->vec_dot_panel[EL_TYPE_Q4_K] = q4_K_panel512;
    k->vec_dot_panel[EL_TYPE_Q6_K] = q6_K_panel512;
    k->panel_layout = EL_PANEL_AVX512;
}
#endif

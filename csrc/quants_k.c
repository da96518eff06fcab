/* quants_k.c - scalar reference for the K-quants (Q2_K..Q6_K, 256-value super-blocks with 16- or
 * 32-value sub-blocks) and their Q8_K activations: ggml's *_ref quantizers, bit-exact dequantizers,
 * integer dot products. No SIMD here; this is what the SIMD files are tested against. */

/* see quants.c: keep a*b+c as two roundings so dequantization matches gguf-py on every ISA */
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "quants.h"

#define GROUP_MAX_EPS 1e-15f
#define MAXI(a, b) ((a) > (b) ? (a) : (b))
#define MINI(a, b) ((a) < (b) ? (a) : (b))

/* ggml's nearest_int: round half to even through the float mantissa. ggml asserts |fval| <= 4194303;
 * beyond that (or for NaN) the value is wrong but defined, and every caller clamps the result. */
static inline int nearest_int(float fval) {
    const float val = fval + 12582912.f;
    int32_t i;
    memcpy(&i, &val, sizeof i);
    return (i & 0x007fffff) - 0x00400000;
}

/* ====================== the scale searches of ggml-quants.c ====================== */

/* The value of largest magnitude with its sign (the first on ties): the symmetric searches of Q3_K
 * and Q6_K scale their levels from it, per sub-block and again over the sub-block scales. */
static float signed_max(const float *x, int n) {
    float max = 0, amax = 0;
    for (int i = 0; i < n; ++i) {
        const float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    return max;
}

/* levels l = nearest_int(iscale x) in -nmax..nmax-1 and their x^2-weighted fit sums
 * sum(w x l), sum(w l^2): the trial both symmetric searches start from (make_qx_quants also
 * repeats it per candidate scale) */
static void fit_levels(int n, int nmax, float iscale, const float *x, int8_t *L, float *sumlx, float *suml2) {
    float slx = 0, sl2 = 0;
    for (int i = 0; i < n; ++i) {
        int l = nearest_int(iscale * x[i]);
        l = MAXI(-nmax, MINI(nmax - 1, l));
        L[i] = (int8_t)l;
        const float w = x[i] * x[i];
        slx += w * x[i] * l;
        sl2 += w * l * l;
    }
    *sumlx = slx;
    *suml2 = sl2;
}

/* The start both searches share: levels fitted at the group's signed max. 0 (L all zero) when the
 * group is all but zero, which both then return as scale 0. */
static int start_levels(int n, int nmax, const float *x, int8_t *L, float *max, float *sumlx, float *suml2) {
    *max = signed_max(x, n);
    if (fabsf(*max) < GROUP_MAX_EPS) {
        memset(L, 0, (size_t)n);
        return 0;
    }
    fit_levels(n, nmax, -nmax / *max, x, L, sumlx, suml2);
    return 1;
}

/* make_qx_quants with rmse_type 1 and no importance weights (the only form the _ref quantizers
 * use): symmetric levels -nmax..nmax-1 stored as L + nmax, weights x^2, 19 trial scales. */
static float make_qx_quants(int n, int nmax, const float *x, int8_t *L) {
    float max, sumlx, suml2;
    if (!start_levels(n, nmax, x, L, &max, &sumlx, &suml2)) return 0.f;
    float scale = suml2 ? sumlx / suml2 : 0.0f;
    float best = scale * sumlx;
    int8_t Laux[QK_K];
    for (int is = -9; is <= 9; ++is) {
        if (is == 0) continue;
        fit_levels(n, nmax, -(nmax + 0.1f * is) / max, x, Laux, &sumlx, &suml2);
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            memcpy(L, Laux, (size_t)n);
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    for (int i = 0; i < n; ++i) L[i] = (int8_t)(L[i] + nmax);
    return scale;
}

/* make_q3_quants with do_rmse (as quantize_row_q3_K_ref calls it): start from the max, then up to
 * five passes moving single levels while the weighted fit improves. L holds levels + nmax. */
static float make_q3_quants(int n, int nmax, const float *x, int8_t *L) {
    float max, sumlx, suml2;
    if (!start_levels(n, nmax, x, L, &max, &sumlx, &suml2)) return 0.f;
    for (int itry = 0; itry < 5; ++itry) {
        int n_changed = 0;
        for (int i = 0; i < n; ++i) {
            const float w = x[i] * x[i];
            float slx = sumlx - w * x[i] * L[i];
            if (slx > 0) {
                float sl2 = suml2 - w * L[i] * L[i];
                int new_l = nearest_int(x[i] * sl2 / slx);
                new_l = MAXI(-nmax, MINI(nmax - 1, new_l));
                if (new_l != L[i]) {
                    slx += w * x[i] * new_l;
                    sl2 += w * new_l * new_l;
                    if (sl2 > 0 && slx * slx * suml2 > sumlx * sumlx * sl2) {
                        L[i] = (int8_t)new_l;
                        sumlx = slx;
                        suml2 = sl2;
                        ++n_changed;
                    }
                }
            }
        }
        if (!n_changed) break;
    }
    for (int i = 0; i < n; ++i) L[i] = (int8_t)(L[i] + nmax);
    return suml2 > 0.0f ? sumlx / suml2 : 0.0f;
}

/* make_qkx2_quants: asymmetric levels 0..nmax with x ~ scale*L - the_min, min <= 0; tries
 * nstep+1 scales around nmax/(max-min) and keeps the least weighted error (abs if use_mad). */
static float make_qkx2_quants(int n, int nmax, const float *x, const float *weights, uint8_t *L,
                              float *the_min, uint8_t *Laux, float rmin, float rdelta, int nstep,
                              int use_mad) {
    float min = x[0], max = x[0];
    float sum_w = weights[0];
    float sum_x = sum_w * x[0];
    for (int i = 1; i < n; ++i) {
        if (x[i] < min) min = x[i];
        if (x[i] > max) max = x[i];
        const float w = weights[i];
        sum_w += w;
        sum_x += w * x[i];
    }
    if (min > 0) min = 0;
    if (max == min) {
        memset(L, 0, (size_t)n);
        *the_min = -min;
        return 0.f;
    }
    float iscale = nmax / (max - min);
    float scale = 1 / iscale;
    float best_error = 0;
    for (int i = 0; i < n; ++i) {
        const int l = nearest_int(iscale * (x[i] - min));
        L[i] = (uint8_t)MAXI(0, MINI(nmax, l));
        float diff = scale * L[i] + min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        best_error += weights[i] * diff;
    }
    for (int is = 0; is <= nstep; ++is) {
        iscale = (rmin + rdelta * is + nmax) / (max - min);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; ++i) {
            int l = nearest_int(iscale * (x[i] - min));
            l = MAXI(0, MINI(nmax, l));
            Laux[i] = (uint8_t)l;
            const float w = weights[i];
            sum_l += w * l;
            sum_l2 += w * l * l;
            sum_xl += w * l * x[i];
        }
        const float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float cur_error = 0;
            for (int i = 0; i < n; ++i) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                diff = use_mad ? fabsf(diff) : diff * diff;
                cur_error += weights[i] * diff;
            }
            if (cur_error < best_error) {
                memcpy(L, Laux, (size_t)n);
                best_error = cur_error;
                scale = this_scale;
                min = this_min;
            }
        }
    }
    *the_min = -min;
    return scale;
}

/* the 6-bit scale j and min j of Q4_K / Q5_K, packed in 12 bytes */
static inline void get_scale_min_k4(int j, const uint8_t *q, uint8_t *d, uint8_t *m) {
    if (j < 4) {
        *d = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *d = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4));
    }
}

/* the 6-bit scale j (0..63, stored +32) of Q3_K */
static inline int q3_K_scale(const uint8_t *s, int j) {
    const int lo = j < 8 ? (s[j] & 0xF) : (s[j - 8] >> 4);
    return lo | (((s[8 + j % 4] >> (2 * (j / 4))) & 3) << 4);
}

/* the 2-bit (Q2_K, Q3_K) interleave: value 128*k + 32*j + l sits in bits 2j of byte 32*k + l */
static void pack_2bit(const uint8_t *L, uint8_t *qs) {
    for (int j = 0; j < QK_K; j += 128)
        for (int l = 0; l < 32; ++l)
            qs[j / 4 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 2) | (L[j + l + 64] << 4) | (L[j + l + 96] << 6));
}

/* Q4_K / Q5_K: 8 scales and 8 mins of 6 bits in 12 bytes */
static void pack_scale_min_k4(const uint8_t ls[8], const uint8_t lm[8], uint8_t s[K_SCALE_SIZE]) {
    memset(s, 0, K_SCALE_SIZE);
    for (int j = 0; j < 8; ++j) {
        if (j < 4) {
            s[j] = ls[j];
            s[j + 4] = lm[j];
        } else {
            s[j + 4] = (uint8_t)((ls[j] & 0xF) | ((lm[j] & 0xF) << 4));
            s[j - 4] |= (uint8_t)((ls[j] >> 4) << 6);
            s[j - 0] |= (uint8_t)((lm[j] >> 4) << 6);
        }
    }
}

/* 0..hi, for scales that should never be negative (a rounding-level negative would wrap in ggml) */
static inline uint8_t clamp_u(int v, int hi) { return (uint8_t)MAXI(0, MINI(hi, v)); }

/* ====================== quantizers (quantize_row_*_K_ref) ====================== */

static void q2_K_from_float(const float *src, void *dst, size_t n) {
    uint8_t *out = dst;
    for (size_t i = 0; i < n / QK_K; i++) {
        const float *x = src + i * QK_K;
        block_q2_K y;
        uint8_t L[QK_K], Laux[16];
        float weights[16], mins[QK_K / 16], scales[QK_K / 16];
        float max_scale = 0, max_min = 0; /* scales and mins are >= 0 once the min is taken out */
        for (int j = 0; j < QK_K / 16; ++j) {
            for (int l = 0; l < 16; ++l) weights[l] = fabsf(x[16 * j + l]);
            scales[j] = make_qkx2_quants(16, 3, x + 16 * j, weights, L + 16 * j, &mins[j], Laux, -0.5f, 0.1f, 15, 1);
            if (scales[j] > max_scale) max_scale = scales[j];
            if (mins[j] > max_min) max_min = mins[j];
        }
        if (max_scale > 0) {
            const float iscale = 15.f / max_scale;
            for (int j = 0; j < QK_K / 16; ++j) y.scales[j] = clamp_u(nearest_int(iscale * scales[j]), 15);
            y.d = el_fp32_to_fp16(max_scale / 15.f);
        } else {
            memset(y.scales, 0, sizeof y.scales);
            y.d = el_fp32_to_fp16(0.f);
        }
        if (max_min > 0) {
            const float iscale = 15.f / max_min;
            for (int j = 0; j < QK_K / 16; ++j)
                y.scales[j] |= (uint8_t)(clamp_u(nearest_int(iscale * mins[j]), 15) << 4);
            y.dmin = el_fp32_to_fp16(max_min / 15.f);
        } else {
            y.dmin = el_fp32_to_fp16(0.f);
        }
        /* requantize against the rounded scales actually stored */
        for (int j = 0; j < QK_K / 16; ++j) {
            const float d = el_fp16_to_fp32(y.d) * (y.scales[j] & 0xF);
            if (!d) continue;
            const float dm = el_fp16_to_fp32(y.dmin) * (y.scales[j] >> 4);
            for (int ii = 0; ii < 16; ++ii) {
                const int l = nearest_int((x[16 * j + ii] + dm) / d);
                L[16 * j + ii] = (uint8_t)MAXI(0, MINI(3, l));
            }
        }
        pack_2bit(L, y.qs);
        memcpy(out + i * sizeof y, &y, sizeof y);
    }
}

static void q3_K_from_float(const float *src, void *dst, size_t n) {
    uint8_t *out = dst;
    for (size_t i = 0; i < n / QK_K; i++) {
        const float *x = src + i * QK_K;
        block_q3_K y;
        int8_t L[QK_K];
        float scales[QK_K / 16];
        for (int j = 0; j < QK_K / 16; ++j) scales[j] = make_q3_quants(16, 4, x + 16 * j, L + 16 * j);
        const float max_scale = signed_max(scales, QK_K / 16);
        memset(y.scales, 0, sizeof y.scales);
        if (max_scale) {
            const float iscale = -32.f / max_scale;
            for (int j = 0; j < QK_K / 16; ++j) {
                const int l = MAXI(-32, MINI(31, nearest_int(iscale * scales[j]))) + 32;
                if (j < 8) y.scales[j] = (uint8_t)(l & 0xF);
                else y.scales[j - 8] |= (uint8_t)((l & 0xF) << 4);
                y.scales[j % 4 + 8] |= (uint8_t)((l >> 4) << (2 * (j / 4)));
            }
            y.d = el_fp32_to_fp16(1 / iscale);
        } else {
            y.d = el_fp32_to_fp16(0.f);
        }
        for (int j = 0; j < QK_K / 16; ++j) {
            const float d = el_fp16_to_fp32(y.d) * (q3_K_scale(y.scales, j) - 32);
            if (!d) continue;
            for (int ii = 0; ii < 16; ++ii) {
                const int l = nearest_int(x[16 * j + ii] / d);
                L[16 * j + ii] = (int8_t)(MAXI(-4, MINI(3, l)) + 4);
            }
        }
        /* the high bit of value j goes to bit j / 32 of hmask[j % 32] */
        memset(y.hmask, 0, sizeof y.hmask);
        uint8_t Lu[QK_K];
        for (int j = 0; j < QK_K; ++j) {
            int l = L[j];
            if (l > 3) {
                y.hmask[j % 32] |= (uint8_t)(1u << (j / 32));
                l -= 4;
            }
            Lu[j] = (uint8_t)l;
        }
        pack_2bit(Lu, y.qs);
        memcpy(out + i * sizeof y, &y, sizeof y);
    }
}

/* Q4_K and Q5_K share everything but the level count (15 / 31) and the search grid */
static void qk_scales_mins_32(const float *x, int nmax, float rmin, int nstep, uint8_t L[QK_K], uint8_t ls[8],
                              uint8_t lm[8], el_half *d, el_half *dmin) {
    uint8_t Laux[32];
    float weights[32], mins[QK_K / 32], scales[QK_K / 32];
    float max_scale = 0, max_min = 0;
    for (int j = 0; j < QK_K / 32; ++j) {
        float sum_x2 = 0;
        for (int l = 0; l < 32; ++l) sum_x2 += x[32 * j + l] * x[32 * j + l];
        const float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; ++l) weights[l] = av_x + fabsf(x[32 * j + l]);
        scales[j] = make_qkx2_quants(32, nmax, x + 32 * j, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f, nstep, 0);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
    const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    for (int j = 0; j < QK_K / 32; ++j) {
        ls[j] = clamp_u(nearest_int(inv_scale * scales[j]), 63);
        lm[j] = clamp_u(nearest_int(inv_min * mins[j]), 63);
    }
    *d = el_fp32_to_fp16(max_scale / 63.f);
    *dmin = el_fp32_to_fp16(max_min / 63.f);
}

/* requantize x against the stored (rounded) 6-bit scales and mins */
static void qk_requant_32(const float *x, int nmax, const uint8_t *packed, el_half dh, el_half mh, uint8_t L[QK_K]) {
    for (int j = 0; j < QK_K / 32; ++j) {
        uint8_t sc, m;
        get_scale_min_k4(j, packed, &sc, &m);
        const float d = el_fp16_to_fp32(dh) * sc;
        if (!d) continue;
        const float dm = el_fp16_to_fp32(mh) * m;
        for (int ii = 0; ii < 32; ++ii) {
            const int l = nearest_int((x[32 * j + ii] + dm) / d);
            L[32 * j + ii] = (uint8_t)MAXI(0, MINI(nmax, l));
        }
    }
}

static void q4_K_from_float(const float *src, void *dst, size_t n) {
    uint8_t *out = dst;
    for (size_t i = 0; i < n / QK_K; i++) {
        const float *x = src + i * QK_K;
        block_q4_K y;
        uint8_t L[QK_K], ls[8], lm[8];
        qk_scales_mins_32(x, 15, -1.f, 20, L, ls, lm, &y.d, &y.dmin);
        pack_scale_min_k4(ls, lm, y.scales);
        qk_requant_32(x, 15, y.scales, y.d, y.dmin, L);
        /* value 64*c + l in the low nibble of qs[32*c + l], value 64*c + 32 + l in the high one */
        for (int c = 0; c < QK_K / 64; ++c)
            for (int l = 0; l < 32; ++l) y.qs[32 * c + l] = (uint8_t)(L[64 * c + l] | (L[64 * c + l + 32] << 4));
        memcpy(out + i * sizeof y, &y, sizeof y);
    }
}

static void q5_K_from_float(const float *src, void *dst, size_t n) {
    uint8_t *out = dst;
    for (size_t i = 0; i < n / QK_K; i++) {
        const float *x = src + i * QK_K;
        block_q5_K y;
        uint8_t L[QK_K], ls[8], lm[8];
        qk_scales_mins_32(x, 31, -0.5f, 15, L, ls, lm, &y.d, &y.dmin);
        pack_scale_min_k4(ls, lm, y.scales);
        qk_requant_32(x, 31, y.scales, y.d, y.dmin, L);
        /* as Q4_K, plus the 5th bit of sub-block s in bit s of qh[l] */
        memset(y.qh, 0, sizeof y.qh);
        for (int c = 0; c < QK_K / 64; ++c) {
            for (int l = 0; l < 32; ++l) {
                int l1 = L[64 * c + l], l2 = L[64 * c + l + 32];
                if (l1 > 15) {
                    l1 -= 16;
                    y.qh[l] |= (uint8_t)(1u << (2 * c));
                }
                if (l2 > 15) {
                    l2 -= 16;
                    y.qh[l] |= (uint8_t)(1u << (2 * c + 1));
                }
                y.qs[32 * c + l] = (uint8_t)(l1 | (l2 << 4));
            }
        }
        memcpy(out + i * sizeof y, &y, sizeof y);
    }
}

static void q6_K_from_float(const float *src, void *dst, size_t n) {
    uint8_t *out = dst;
    for (size_t i = 0; i < n / QK_K; i++) {
        const float *x = src + i * QK_K;
        block_q6_K y;
        int8_t L[QK_K];
        float scales[QK_K / 16];
        for (int ib = 0; ib < QK_K / 16; ++ib) scales[ib] = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib);
        const float max_scale = signed_max(scales, QK_K / 16);
        if (fabsf(max_scale) < GROUP_MAX_EPS) {
            memset(&y, 0, sizeof y);
            memcpy(out + i * sizeof y, &y, sizeof y);
            continue;
        }
        const float iscale = -128.f / max_scale;
        y.d = el_fp32_to_fp16(1 / iscale);
        for (int ib = 0; ib < QK_K / 16; ++ib)
            y.scales[ib] = (int8_t)MAXI(-128, MINI(127, nearest_int(iscale * scales[ib])));
        for (int j = 0; j < QK_K / 16; ++j) {
            const float d = el_fp16_to_fp32(y.d) * y.scales[j];
            if (!d) continue;
            for (int ii = 0; ii < 16; ++ii) {
                const int l = nearest_int(x[16 * j + ii] / d);
                L[16 * j + ii] = (int8_t)(MAXI(-32, MINI(31, l)) + 32);
            }
        }
        /* per 128 values: low nibbles of 0..31 | 64..95 in ql[0..31], 32..63 | 96..127 in ql[32..63],
         * the four 2-bit high parts of value l, l+32, l+64, l+96 in qh[l] */
        for (int c = 0; c < QK_K / 128; ++c) {
            const int8_t *Lc = L + 128 * c;
            uint8_t *ql = y.ql + 64 * c, *qh = y.qh + 32 * c;
            for (int l = 0; l < 32; ++l) {
                ql[l] = (uint8_t)((Lc[l] & 0xF) | ((Lc[l + 64] & 0xF) << 4));
                ql[l + 32] = (uint8_t)((Lc[l + 32] & 0xF) | ((Lc[l + 96] & 0xF) << 4));
                qh[l] = (uint8_t)((Lc[l] >> 4) | ((Lc[l + 32] >> 4) << 2) | ((Lc[l + 64] >> 4) << 4) | ((Lc[l + 96] >> 4) << 6));
            }
        }
        memcpy(out + i * sizeof y, &y, sizeof y);
    }
}

/* quantize_row_q8_K_ref: d = max / -127 with the signed max (ggml switched from -128 so that no
 * quant is -128 and SIMD sign tricks stay exact); bsums for the min terms. */
static void q8_K_from_float(const float *src, void *dst, size_t n) {
    uint8_t *out = dst;
    for (size_t i = 0; i < n / QK_K; i++) {
        const float *x = src + i * QK_K;
        block_q8_K y;
        const float max = signed_max(x, QK_K);
        const float iscale = max ? -127.f / max : 0.f;
        if (!max) {
            memset(&y, 0, sizeof y); /* ggml leaves bsums unset here; ours are 0 */
        } else if (isinf(iscale)) {
            /* |max| < 127 / FLT_MAX: every product is inf or NaN, which ggml's nearest_int turns into
             * a value whose int8 store wraps to 0: quants and bsums 0, d = 1/iscale (a signed zero) */
            memset(&y, 0, sizeof y);
            y.d = 1 / iscale;
        } else {
            for (int j = 0; j < QK_K; ++j) y.qs[j] = (int8_t)MAXI(-128, MINI(127, nearest_int(iscale * x[j])));
            for (int j = 0; j < QK_K / 16; ++j) {
                int sum = 0;
                for (int ii = 0; ii < 16; ++ii) sum += y.qs[16 * j + ii];
                y.bsums[j] = (int16_t)sum;
            }
            y.d = 1 / iscale;
        }
        memcpy(out + i * sizeof y, &y, sizeof y);
    }
}

/* ====================== unpacking: the integer quant of every value, in value order ======================
 * Shared by dequantize and the dot products. q[i] is value i's level; sc / mn are per sub-block. */

static void unpack_q2_K(const block_q2_K *b, int8_t q[QK_K]) {
    for (int k = 0; k < QK_K / 128; ++k)
        for (int j = 0; j < 4; ++j)
            for (int l = 0; l < 32; ++l) q[128 * k + 32 * j + l] = (int8_t)((b->qs[32 * k + l] >> (2 * j)) & 3);
}

/* levels -4..3: the low 2 bits, minus 4 when the hmask bit is clear */
static void unpack_q3_K(const block_q3_K *b, int8_t q[QK_K], int sc[16]) {
    for (int k = 0; k < QK_K / 128; ++k)
        for (int j = 0; j < 4; ++j)
            for (int l = 0; l < 32; ++l) {
                const int lo = (b->qs[32 * k + l] >> (2 * j)) & 3;
                const int hi = (b->hmask[l] >> (4 * k + j)) & 1;
                q[128 * k + 32 * j + l] = (int8_t)(lo - (hi ? 0 : 4));
            }
    for (int j = 0; j < 16; ++j) sc[j] = q3_K_scale(b->scales, j) - 32;
}

void el_unpack_q4_K(const block_q4_K *b, int8_t q[QK_K], uint8_t sc[8], uint8_t mn[8]) {
    for (int c = 0; c < QK_K / 64; ++c)
        for (int l = 0; l < 32; ++l) {
            q[64 * c + l] = (int8_t)(b->qs[32 * c + l] & 0xF);
            q[64 * c + 32 + l] = (int8_t)(b->qs[32 * c + l] >> 4);
        }
    for (int j = 0; j < 8; ++j) get_scale_min_k4(j, b->scales, &sc[j], &mn[j]);
}

static void unpack_q5_K(const block_q5_K *b, int8_t q[QK_K], uint8_t sc[8], uint8_t mn[8]) {
    for (int c = 0; c < QK_K / 64; ++c)
        for (int l = 0; l < 32; ++l) {
            const int h0 = (b->qh[l] >> (2 * c)) & 1, h1 = (b->qh[l] >> (2 * c + 1)) & 1;
            q[64 * c + l] = (int8_t)((b->qs[32 * c + l] & 0xF) | (h0 << 4));
            q[64 * c + 32 + l] = (int8_t)((b->qs[32 * c + l] >> 4) | (h1 << 4));
        }
    for (int j = 0; j < 8; ++j) get_scale_min_k4(j, b->scales, &sc[j], &mn[j]);
}

/* levels -32..31; the scale of value i is scales[i / 16] */
void el_unpack_q6_K(const block_q6_K *b, int8_t q[QK_K]) {
    for (int c = 0; c < QK_K / 128; ++c) {
        const uint8_t *ql = b->ql + 64 * c, *qh = b->qh + 32 * c;
        int8_t *y = q + 128 * c;
        for (int l = 0; l < 32; ++l) {
            y[l] = (int8_t)(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
            y[l + 32] = (int8_t)(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
            y[l + 64] = (int8_t)(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
            y[l + 96] = (int8_t)(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
    }
}

/* ====================== dequantize: the float expressions of dequantize_row_*_K ====================== */

static void q2_K_to_float(const void *src, float *dst, size_t n) {
    const uint8_t *p = src;
    for (size_t i = 0; i < n / QK_K; i++, dst += QK_K) {
        block_q2_K b;
        int8_t q[QK_K];
        memcpy(&b, p + i * sizeof b, sizeof b);
        unpack_q2_K(&b, q);
        const float d = el_fp16_to_fp32(b.d), min = el_fp16_to_fp32(b.dmin);
        for (int s = 0; s < 16; ++s) {
            const float dl = d * (b.scales[s] & 0xF), ml = min * (b.scales[s] >> 4);
            for (int l = 0; l < 16; ++l) dst[16 * s + l] = dl * q[16 * s + l] - ml;
        }
    }
}

static void q3_K_to_float(const void *src, float *dst, size_t n) {
    const uint8_t *p = src;
    for (size_t i = 0; i < n / QK_K; i++, dst += QK_K) {
        block_q3_K b;
        int8_t q[QK_K];
        int sc[16];
        memcpy(&b, p + i * sizeof b, sizeof b);
        unpack_q3_K(&b, q, sc);
        const float d = el_fp16_to_fp32(b.d);
        for (int s = 0; s < 16; ++s) {
            const float dl = d * sc[s];
            for (int l = 0; l < 16; ++l) dst[16 * s + l] = dl * q[16 * s + l];
        }
    }
}

#define DEQUANT_K_MIN(NAME, BLOCK, UNPACK)                                          \
    static void NAME(const void *src, float *dst, size_t n) {                     \
        const uint8_t *p = src;                                                    \
        for (size_t i = 0; i < n / QK_K; i++, dst += QK_K) {                       \
            BLOCK b;                                                               \
            int8_t q[QK_K];                                                        \
            uint8_t sc[8], mn[8];                                                  \
            memcpy(&b, p + i * sizeof b, sizeof b);                                \
            UNPACK(&b, q, sc, mn);                                                 \
            const float d = el_fp16_to_fp32(b.d), min = el_fp16_to_fp32(b.dmin);   \
            for (int s = 0; s < 8; ++s) {                                          \
                const float d1 = d * sc[s], m1 = min * mn[s];                      \
                for (int l = 0; l < 32; ++l) dst[32 * s + l] = d1 * q[32 * s + l] - m1; \
            }                                                                      \
        }                                                                          \
    }

DEQUANT_K_MIN(q4_K_to_float, block_q4_K, el_unpack_q4_K)
DEQUANT_K_MIN(q5_K_to_float, block_q5_K, unpack_q5_K)

static void q6_K_to_float(const void *src, float *dst, size_t n) {
    const uint8_t *p = src;
    for (size_t i = 0; i < n / QK_K; i++, dst += QK_K) {
        block_q6_K b;
        int8_t q[QK_K];
        memcpy(&b, p + i * sizeof b, sizeof b);
        el_unpack_q6_K(&b, q);
        const float d = el_fp16_to_fp32(b.d);
        for (int l = 0; l < QK_K; ++l) dst[l] = d * b.scales[l / 16] * q[l];
    }
}

static void q8_K_to_float(const void *src, float *dst, size_t n) {
    const uint8_t *p = src;
    for (size_t i = 0; i < n / QK_K; i++, dst += QK_K) {
        block_q8_K b;
        memcpy(&b, p + i * sizeof b, sizeof b);
        for (int l = 0; l < QK_K; ++l) dst[l] = b.d * b.qs[l];
    }
}

/* ====================== dot products with Q8_K ======================
 * Per super-block: an exact integer sum of scale * sum(q_w q_a) over sub-blocks, the mins through
 * the activation's bsums, then one float update sumf += d*isum - dmin*summ, in block order
 * (the arithmetic of ggml_vec_dot_*_q8_K_generic; its 8-lane float split is only for vectorisers). */

static float q2_K_vec_dot(size_t n, const void *w, const void *a) {
    const uint8_t *pw = w, *pa = a;
    float sumf = 0.0f;
    for (size_t i = 0; i < n / QK_K; i++) {
        block_q2_K bw;
        block_q8_K ba;
        int8_t q[QK_K];
        memcpy(&bw, pw + i * sizeof bw, sizeof bw);
        memcpy(&ba, pa + i * sizeof ba, sizeof ba);
        unpack_q2_K(&bw, q);
        int isum = 0, summ = 0;
        for (int s = 0; s < 16; ++s) {
            isum += (bw.scales[s] & 0xF) * el_dot_i8(q + 16 * s, ba.qs + 16 * s, 16);
            summ += ba.bsums[s] * (bw.scales[s] >> 4);
        }
        const float dall = ba.d * el_fp16_to_fp32(bw.d), dmin = ba.d * el_fp16_to_fp32(bw.dmin);
        sumf += dall * (float)isum - dmin * (float)summ;
    }
    return sumf;
}

static float q3_K_vec_dot(size_t n, const void *w, const void *a) {
    const uint8_t *pw = w, *pa = a;
    float sumf = 0.0f;
    for (size_t i = 0; i < n / QK_K; i++) {
        block_q3_K bw;
        block_q8_K ba;
        int8_t q[QK_K];
        int sc[16];
        memcpy(&bw, pw + i * sizeof bw, sizeof bw);
        memcpy(&ba, pa + i * sizeof ba, sizeof ba);
        unpack_q3_K(&bw, q, sc);
        int isum = 0;
        for (int s = 0; s < 16; ++s) isum += sc[s] * el_dot_i8(q + 16 * s, ba.qs + 16 * s, 16);
        sumf += (el_fp16_to_fp32(bw.d) * ba.d) * (float)isum;
    }
    return sumf;
}

#define VEC_DOT_K_MIN(NAME, BLOCK, UNPACK)                                             \
    static float NAME(size_t n, const void *w, const void *a) {                       \
        const uint8_t *pw = w, *pa = a;                                                \
        float sumf = 0.0f;                                                             \
        for (size_t i = 0; i < n / QK_K; i++) {                                        \
            BLOCK bw;                                                                  \
            block_q8_K ba;                                                             \
            int8_t q[QK_K];                                                            \
            uint8_t sc[8], mn[8];                                                      \
            memcpy(&bw, pw + i * sizeof bw, sizeof bw);                                \
            memcpy(&ba, pa + i * sizeof ba, sizeof ba);                                \
            UNPACK(&bw, q, sc, mn);                                                    \
            int isum = 0, summ = 0;                                                    \
            for (int s = 0; s < 8; ++s) isum += sc[s] * el_dot_i8(q + 32 * s, ba.qs + 32 * s, 32); \
            for (int j = 0; j < 16; ++j) summ += ba.bsums[j] * mn[j / 2];              \
            const float d = el_fp16_to_fp32(bw.d) * ba.d;                              \
            const float dmin = el_fp16_to_fp32(bw.dmin) * ba.d;                        \
            sumf += d * (float)isum - dmin * (float)summ;                              \
        }                                                                              \
        return sumf;                                                                   \
    }

VEC_DOT_K_MIN(q4_K_vec_dot, block_q4_K, el_unpack_q4_K)
VEC_DOT_K_MIN(q5_K_vec_dot, block_q5_K, unpack_q5_K)

static float q6_K_vec_dot(size_t n, const void *w, const void *a) {
    const uint8_t *pw = w, *pa = a;
    float sumf = 0.0f;
    for (size_t i = 0; i < n / QK_K; i++) {
        block_q6_K bw;
        block_q8_K ba;
        int8_t q[QK_K];
        memcpy(&bw, pw + i * sizeof bw, sizeof bw);
        memcpy(&ba, pa + i * sizeof ba, sizeof ba);
        el_unpack_q6_K(&bw, q);
        int isum = 0;
        for (int s = 0; s < 16; ++s) isum += bw.scales[s] * el_dot_i8(q + 16 * s, ba.qs + 16 * s, 16);
        sumf += (el_fp16_to_fp32(bw.d) * ba.d) * (float)isum;
    }
    return sumf;
}

/* indexed by type - EL_TYPE_Q2_K; quants.c's el_get_type_traits hands these out */
const el_type_traits el_k_traits[EL_TYPE_Q8_K - EL_TYPE_Q2_K + 1] = {
    {"q2_K", QK_K, sizeof(block_q2_K), EL_TYPE_Q8_K, q2_K_to_float, q2_K_from_float, q2_K_vec_dot},
    {"q3_K", QK_K, sizeof(block_q3_K), EL_TYPE_Q8_K, q3_K_to_float, q3_K_from_float, q3_K_vec_dot},
    {"q4_K", QK_K, sizeof(block_q4_K), EL_TYPE_Q8_K, q4_K_to_float, q4_K_from_float, q4_K_vec_dot},
    {"q5_K", QK_K, sizeof(block_q5_K), EL_TYPE_Q8_K, q5_K_to_float, q5_K_from_float, q5_K_vec_dot},
    {"q6_K", QK_K, sizeof(block_q6_K), EL_TYPE_Q8_K, q6_K_to_float, q6_K_from_float, q6_K_vec_dot},
    /* activations only */
    {"q8_K", QK_K, sizeof(block_q8_K), EL_TYPE_Q8_K, q8_K_to_float, q8_K_from_float, NULL},
};

/* lin_kernel.h: op_linear's summation order as one inline kernel, shared by
 * ops/basic.c (F32 weights: op_linear) and ops/qlinear.c (stored formats
 * decoded in registers: op_qlinear), so both sum in the same order by
 * construction.
 *
 * The order: y[i][o] = sum_k x[i][k] W[o][k] as LIN_LANES partial sums, lane
 * l adding the products of k = l, l + 16, ... in increasing k (a multiply,
 * then an add: the build never contracts to FMA), then a fixed halving tree
 * over the lanes (l + 8, l + 4, l + 2, l + 1). Nothing in that order depends
 * on n, on the row's place in the call, on the tile that computes it or on
 * the ISA level: a row's bits are the same whether it is computed alone
 * (decode), in a chunk (prefill), in a batch of requests or in a speculative
 * verify. OpenBLAS's sgemm picks its kernels and blocking by shape, so its
 * rows differ in the last bits between n = 1 and n > 1; that is why cedar
 * does not call it there.
 *
 * Speed: tiles of LIN_R rows x LIN_O outputs keep their partial sums in
 * vector registers (each W row is read once per LIN_R rows, each x row once
 * per LIN_O outputs); outputs go in panels of about LIN_PANEL bytes of F32
 * weights so a panel stays in L2 while every row block streams past it.
 * One-row calls (decode) use 1 x LIN_O1 tiles: LIN_O1 independent sums hide
 * the add latency while W streams from memory.
 *
 * Weights reach a tile through lin_wload: 16 consecutive weights of one
 * output row as floats. For a stored format it decodes the bytes in vector
 * registers (integer shifts and masks, one exact float multiply that also
 * applies the block's power-of-two scale), giving the bits of
 * dec(q) * 2^(s - 127) exactly (the proof is beside each loader).
 *
 * Include only from the ops/ sources that build kernels with OP_ISA_KERNEL (ops/isa.h):
 * every function here is `static inline OP_ISA_BODY`.
 */
#ifndef CEDAR_OPS_LIN_KERNEL_H
#define CEDAR_OPS_LIN_KERNEL_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#include "ops/formats.h"
#include "ops/isa.h"
#include "ops/qweight.h"

#define LIN_LANES 16
#define LIN_R 4
#define LIN_O 4
#define LIN_O1 8
#define LIN_PANEL (256 << 10)

/* 16 fp32 lanes as one GCC vector: element-wise + and * on it are the same
 * IEEE operations as on each float (the default level splits it into four
 * SSE registers, AVX2 into two, AVX-512 holds it in one); written this way so
 * the partial sums stay in registers. lin_vu is the unaligned load type. */
typedef float lin_v __attribute__((vector_size(LIN_LANES * sizeof(float))));
typedef float lin_vu __attribute__((vector_size(LIN_LANES * sizeof(float)), aligned(4)));
typedef float lin_v8 __attribute__((vector_size(8 * sizeof(float))));
typedef float lin_v4 __attribute__((vector_size(4 * sizeof(float))));
typedef float lin_v2 __attribute__((vector_size(2 * sizeof(float))));
/* The integer views the decoders work in: 16 x u32, and the stored bytes. */
typedef uint32_t lin_vi __attribute__((vector_size(LIN_LANES * sizeof(uint32_t))));
typedef uint16_t lin_vh16 __attribute__((vector_size(32), aligned(2)));
typedef uint16_t lin_vh __attribute__((vector_size(32)));
typedef uint8_t lin_vb __attribute__((vector_size(16)));
typedef uint8_t lin_vb8x __attribute__((vector_size(8)));
typedef uint16_t lin_vh8 __attribute__((vector_size(16)));
typedef uint32_t lin_vi8 __attribute__((vector_size(32)));

/* The helpers below pass and return 64-byte vectors; GCC warns that this
 * changes the ABI at levels without AVX-512. They are all always inlined
 * (OP_ISA_BODY) into one level's clone, so no call crosses an ABI: moot
 * (suppressed for the rest of the including file: GCC reports it at the
 * end of the translation unit, where OP_ISA_KERNEL's clones are emitted). */
#pragma GCC diagnostic ignored "-Wpsabi"

/* The lanes' halving tree: (l, l + 8), then (l, l + 4), (l, l + 2), (0, 1),
 * as vector halves (the same adds, pair for pair). */
static inline OP_ISA_BODY float lin_tree(lin_v v) {
  lin_v8 t8 = __builtin_shufflevector(v, v, 0, 1, 2, 3, 4, 5, 6, 7) +
              __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15);
  lin_v4 t4 = __builtin_shufflevector(t8, t8, 0, 1, 2, 3) + __builtin_shufflevector(t8, t8, 4, 5, 6, 7);
  lin_v2 t2 = __builtin_shufflevector(t4, t4, 0, 1) + __builtin_shufflevector(t4, t4, 2, 3);
  return t2[0] + t2[1];
}

static inline OP_ISA_BODY float lin_fbits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

/* ---- the weight loaders ---------------------------------------------------- */


/* The decoders build each weight's float bits with integer adds, so no
 * float operation ever sees a subnormal (x86 cores take a slow assist for
 * those: a decode through float(code bits) * 2^k ran 6-15x slower here on
 * real-looking codes). A code's magnitude bits a, shifted so its exponent
 * field e and mantissa m land in the float's, plus the scale's exponent K1,
 * are the bits of dec(|q|) 2^(s - 127) when e > 0. For e = 0 (zero and the
 * subnormal codes) one more unit of exponent makes the normal float
 * 2^t (1 + m f) and subtracting 2^t (K2's float, exact by Sterbenz's lemma)
 * leaves m f 2^t, the value; the other lanes subtract +0 (unchanged). Each
 * result is exactly dec(q) 2^(s - 127), which is what the reference's one
 * multiply dec(q) * scale rounds to, since that product is exact (at most 4
 * significant bits, inside the normal range for the scales of the fast
 * path). Scales outside it (weights below 2^-117 or above 2^119, the NaN
 * scale 0xFF) decode dec(q) with the unscaled constants and multiply by the
 * scale, exactly as the reference. */

/* 16 bytes as 16 u32 lanes. Through u16: GCC 12 turns a direct u8 -> u32
 * conversion into 16 scalar byte loads, this into two pmovzx steps. */
static inline OP_ISA_BODY lin_vi lin_widen(const uint8_t *q) {
  lin_vb b;
  memcpy(&b, q, sizeof b);
  return __builtin_convertvector(__builtin_convertvector(b, lin_vh), lin_vi);
}

/* FP8: 16 E4M3 codes of one row (in one 32-column tile: k is a multiple of
 * 16), tile scale code s. a = q & 0x7F shifted by 20 puts e (4 bits) and m
 * (3 bits) in place; the float exponent is e + s - 7 (fast path s in
 * [10, 246]: every result and operand normal). The sign is bit 7 moved to
 * bit 31 (-0 stays -0, as -0 * scale); the NaN codes 0x7F / 0xFF give
 * 0x7FC00000, the reference's NaN * scale. */
static inline OP_ISA_BODY lin_v lin_load_fp8(const uint8_t *q, uint8_t s) {
  const bool fast = s >= 10 && s <= 246;
  const uint32_t t = fast ? s : 127u; /* 127: dec(q) itself, scaled below */
  const lin_vi v = lin_widen(q);
  const lin_vi a = v & 0x7Fu;
  const lin_vi z = (lin_vi)(a < 8u), nan = (lin_vi)(a == 0x7Fu);
  const lin_vi o = (a << 20) + ((t - 7u) << 23) + (z & (1u << 23));
  const lin_v f = (lin_v)o - (lin_v)(z & ((t - 6u) << 23));
  lin_vi bits = (lin_vi)f | ((v << 24) & 0x80000000u);
  bits = (bits & ~nan) | (0x7FC00000u & nan);
  if (!fast) return (lin_v)bits * op_e8m0_decode(s);
  return (lin_v)bits;
}

/* FP4: 16 E2M1 codes from 8 bytes (element 2j in the low nibble of byte j),
 * group scale code s. a = c & 7 shifted by 22 puts e (2 bits) and m (1 bit)
 * in place; the float exponent is e + s - 1 (fast path s in [2, 252]). The
 * sign is bit 3 moved to bit 31. E2M1 has no NaN. */
static inline OP_ISA_BODY lin_v lin_load_fp4(const uint8_t *q, uint8_t s) {
  const bool fast = s >= 2 && s <= 252;
  const uint32_t t = fast ? s : 127u;
  lin_vb8x b;
  memcpy(&b, q, sizeof b);
  const lin_vi8 v = __builtin_convertvector(__builtin_convertvector(b, lin_vh8), lin_vi8);
  const lin_vi8 lo = v & 0xFu, hi = v >> 4;
  const lin_vi c = __builtin_shufflevector(lo, hi, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
  const lin_vi a = c & 7u;
  const lin_vi z = (lin_vi)(a < 2u);
  const lin_vi o = (a << 22) + ((t - 1u) << 23) + (z & (1u << 23));
  const lin_v f = (lin_v)o - (lin_v)(z & (t << 23));
  const lin_v w = (lin_v)((lin_vi)f | ((c & 8u) << 28));
  if (!fast) return w * op_e8m0_decode(s);
  return w;
}

/* BF16: the 16 bits are a float's high half (runtime/ckpt_map.c's widening). */
static inline OP_ISA_BODY lin_v lin_load_bf16(const uint16_t *h) {
  return (lin_v)(__builtin_convertvector(*(const lin_vh16 *)h, lin_vi) << 16);
}

/* The scale codes of output row o (FP8: its tile row; FP4: its groups);
 * code of column k: [k / 32]. NULL for the unscaled formats. */
static inline OP_ISA_BODY const uint8_t *lin_scale_row(const struct op_qweight *w, int o, const enum op_wfmt fmt) {
  const size_t B = OP_QW_BLOCK;
  if (fmt == OP_W_FP8) return w->scale + (size_t)o / B * (((size_t)w->in + B - 1) / B);
  if (fmt == OP_W_FP4) return w->scale + (size_t)o * ((size_t)w->in / B);
  return NULL;
}

/* Where output row o's elements start. */
static inline OP_ISA_BODY const void *lin_row(const struct op_qweight *w, int o, const enum op_wfmt fmt) {
  const size_t e = (size_t)o * (size_t)w->in;
  switch (fmt) {
    case OP_W_BF16: return (const uint16_t *)w->data + e;
    case OP_W_FP8: return (const uint8_t *)w->data + e;
    case OP_W_FP4: return (const uint8_t *)w->data + e / 2;
    default: return (const float *)w->data + e;
  }
}

/* 16 weights at column k (a multiple of 16, k + 16 <= in) of the row whose
 * elements start at p (lin_row) and scale codes at sr (lin_scale_row). fmt
 * is a constant at every call site, so each kernel keeps one branch. */
static inline OP_ISA_BODY lin_v lin_wload(const void *p, int k, const uint8_t *sr, const enum op_wfmt fmt) {
  switch (fmt) {
    case OP_W_BF16: return lin_load_bf16((const uint16_t *)p + k);
    case OP_W_FP8: return lin_load_fp8((const uint8_t *)p + k, sr[k / OP_QW_BLOCK]);
    case OP_W_FP4: return lin_load_fp4((const uint8_t *)p + k / 2, sr[k / OP_QW_BLOCK]);
    default: return *(const lin_vu *)((const float *)p + k);
  }
}

/* The last m < 16 weights of row o from column k, then zeros: decoded one by
 * one through ops/formats.h (FP4 rows are whole groups and never get here). */
static inline OP_ISA_BODY void lin_wtail(float *t /* (LIN_LANES), zeroed */, const struct op_qweight *w, int o, int k,
                                         int m, const enum op_wfmt fmt) {
  const size_t row = (size_t)o * (size_t)w->in;
  if (fmt == OP_W_F32) {
    memcpy(t, (const float *)w->data + row + k, (size_t)m * sizeof(float));
  } else if (fmt == OP_W_BF16) {
    for (int j = 0; j < m; j++) t[j] = lin_fbits((uint32_t)((const uint16_t *)w->data)[row + k + j] << 16);
  } else {
    const float sc = op_e8m0_decode(op_qweight_scale_at(w, o, k));
    for (int j = 0; j < m; j++) t[j] = op_e4m3_decode(((const uint8_t *)w->data)[row + k + j]) * sc;
  }
}

/* ---- the tile and the kernel ------------------------------------------------ */

/* R rows x O outputs (R * O <= LIN_R * LIN_O1, O <= LIN_O1) of outputs o0..
 * of w. The last in mod 16 products go to lanes 0.. with both operands
 * zero-padded: the padding is the same for every row count and tile, so it
 * keeps the order fixed; its +-0 products leave every partial sum as it is
 * (except that an all -0 lane ends +0). */
static inline OP_ISA_BODY void lin_tile(float *y, size_t ldy, const float *x, size_t ldx, const struct op_qweight *w,
                                        int o0, const int R, const int O, const enum op_wfmt fmt) {
  const int in = w->in;
  const uint8_t *sr[LIN_O1];
  const void *rp[LIN_O1];
  for (int o = 0; o < O; o++) sr[o] = lin_scale_row(w, o0 + o, fmt), rp[o] = lin_row(w, o0 + o, fmt);
  lin_v acc[LIN_R * LIN_O1];
  for (int t = 0; t < R * O; t++) acc[t] = (lin_v){0};
  int k = 0;
  /* x's rows first, then each output's weights decoded and used at once:
   * every accumulator still takes its products in increasing k. */
  for (; k + LIN_LANES <= in; k += LIN_LANES) {
    lin_v xr[LIN_R];
    for (int r = 0; r < R; r++) xr[r] = *(const lin_vu *)(x + (size_t)r * ldx + k);
#pragma GCC unroll 8
    for (int o = 0; o < O; o++) {
      const lin_v wv = lin_wload(rp[o], k, sr[o], fmt);
      for (int r = 0; r < R; r++) acc[r * O + o] += xr[r] * wv;
    }
  }
  if (k < in) {
    int m = in - k;
    lin_v wv[LIN_O1];
    for (int o = 0; o < O; o++) {
      float t[LIN_LANES] = {0};
      lin_wtail(t, w, o0 + o, k, m, fmt);
      memcpy(&wv[o], t, sizeof t);
    }
    for (int r = 0; r < R; r++) {
      float t[LIN_LANES] = {0};
      memcpy(t, x + (size_t)r * ldx + k, (size_t)m * sizeof(float));
      lin_v xr;
      memcpy(&xr, t, sizeof t);
      for (int o = 0; o < O; o++) acc[r * O + o] += xr * wv[o];
    }
  }
  for (int r = 0; r < R; r++)
    for (int o = 0; o < O; o++) y[(size_t)r * ldy + o] = lin_tree(acc[r * O + o]);
}

/* Outputs o0..o1 of w as floats into P (o1 - o0, in): the loaders' values. */
static inline OP_ISA_BODY void lin_decode_rows(float *P, const struct op_qweight *w, int o0, int o1,
                                               const enum op_wfmt fmt) {
  const int in = w->in;
  for (int o = o0; o < o1; o++) {
    float *p = P + (size_t)(o - o0) * in;
    int k = 0;
    const uint8_t *sr = lin_scale_row(w, o, fmt);
    const void *rp = lin_row(w, o, fmt);
    for (; k + LIN_LANES <= in; k += LIN_LANES) *(lin_vu *)(p + k) = lin_wload(rp, k, sr, fmt);
    if (k < in) {
      float t[LIN_LANES] = {0};
      lin_wtail(t, w, o, k, in - k, fmt);
      memcpy(p + k, t, (size_t)(in - k) * sizeof(float));
    }
  }
}

/* Rows i.. of outputs o0..o1 of w, the tiles' walk: LIN_R-row blocks of LIN_O
 * outputs, then single rows in 1 x LIN_O1 tiles (one-row calls too). */
static inline OP_ISA_BODY void lin_panel(float *y, const float *x, const struct op_qweight *w, int n, int o0, int o1,
                                         int ldx, int ldy, const enum op_wfmt fmt) {
  int i = 0;
  if (n > 1)
    for (; i + LIN_R <= n; i += LIN_R) {
      const float *xi = x + (size_t)i * ldx;
      float *yi = y + (size_t)i * ldy;
      int o = o0;
      for (; o + LIN_O <= o1; o += LIN_O) lin_tile(yi + o, ldy, xi, ldx, w, o, LIN_R, LIN_O, fmt);
      for (; o < o1; o++) lin_tile(yi + o, ldy, xi, ldx, w, o, LIN_R, 1, fmt);
    }
  for (; i < n; i++) {
    const float *xi = x + (size_t)i * ldx;
    float *yi = y + (size_t)i * ldy;
    int o = o0;
    for (; o + LIN_O1 <= o1; o += LIN_O1) lin_tile(yi + o, 0, xi, 0, w, o, 1, LIN_O1, fmt);
    for (; o < o1; o++) lin_tile(yi + o, 0, xi, 0, w, o, 1, 1, fmt);
  }
}

/* Outputs per panel: about LIN_PANEL bytes of F32 weights, a multiple of
 * LIN_O (and of 32 when >= 32, so a panel starts on an FP8 scale tile). */
static inline int lin_panel_rows(int in) {
  size_t row_bytes = (size_t)in * sizeof(float);
  int panel = (int)(LIN_PANEL / (row_bytes ? row_bytes : 1));
  if (panel >= 32) return panel - panel % 32;
  return panel < LIN_O ? LIN_O : panel - panel % LIN_O;
}

/* y = x W^T over w, n >= 1, in >= 1. scratch: NULL (every tile decodes its
 * weights) or lin_panel_rows(in) x in floats, into which each panel of a
 * stored format is decoded once before the tiles run over it as F32. */
static inline OP_ISA_BODY void lin_body(float *y, const float *x, const struct op_qweight *w, int n, int ldx, int ldy,
                                        float *scratch, const enum op_wfmt fmt) {
  const int out = w->out;
  if (n == 1) {
    lin_panel(y, x, w, 1, 0, out, ldx, ldy, fmt);
    return;
  }
  const int panel = lin_panel_rows(w->in);
  for (int o0 = 0; o0 < out; o0 += panel) {
    int o1 = o0 + panel < out ? o0 + panel : out;
    if (fmt != OP_W_F32 && scratch) {
      lin_decode_rows(scratch, w, o0, o1, fmt);
      const struct op_qweight f = {OP_W_F32, o1 - o0, w->in, scratch, NULL};
      lin_panel(y + o0, x, &f, n, 0, o1 - o0, ldx, ldy, OP_W_F32);
    } else {
      lin_panel(y, x, w, n, o0, o1, ldx, ldy, fmt);
    }
  }
}

#endif /* CEDAR_OPS_LIN_KERNEL_H */

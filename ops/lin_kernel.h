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

#include <stdint.h>
#include <string.h>

#include "ops/formats.h"
#include "ops/isa.h"
#include "ops/qlinear.h"

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
typedef uint8_t lin_vb16 __attribute__((vector_size(16), aligned(1)));
typedef uint8_t lin_vb8 __attribute__((vector_size(8), aligned(1)));
typedef uint16_t lin_vh16 __attribute__((vector_size(32), aligned(2)));

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

/* The loaders return a 64-byte vector; GCC warns that such a return changes
 * the ABI at levels without AVX-512. They are always inlined (OP_ISA_BODY)
 * into one level's clone, so no call crosses an ABI: the warning is moot
 * (suppressed for the rest of the including file: GCC reports it at the
 * end of the translation unit, where OP_ISA_KERNEL's clones are emitted). */
#pragma GCC diagnostic ignored "-Wpsabi"

/* FP8 (E4M3 with a UE8M0 scale code s) for the 16 columns k.. of a row, all
 * in one 32-column tile since k is a multiple of 16.
 * a = q & 0x7F read as float bits (a << 20) has exponent field e and mantissa
 * m << 20: for e > 0 it is (1 + m/8) 2^(e - 127), for e = 0 the subnormal
 * m 2^-129; either way dec(|q|) 2^-120 exactly. Multiplying by 2^(s - 7) =
 * 2^120 2^(s - 127) (a float for s <= 134) gives dec(|q|) 2^(s - 127), which
 * has at most 4 significant bits and lies in [2^-136, 2^149): exact, so it
 * is the bits of the reference's one rounding dec(q) * scale. The sign is
 * bit 7 moved to bit 31 (-0 stays -0: -0 * scale is -0); the NaN codes
 * 0x7F / 0xFF decode to 0x7FC00000, which the reference's NaN * scale also
 * gives. Scales past 134 (weights above 2^7 448) and the NaN scale 0xFF go
 * the two-multiply way of the reference. */
static inline OP_ISA_BODY lin_v lin_load_fp8(const uint8_t *q, uint8_t s) {
  const lin_vi v = __builtin_convertvector(*(const lin_vb16 *)q, lin_vi);
  const lin_vi a = v & 0x7Fu;
  const lin_vi nan = (lin_vi)(a == 0x7Fu);
  lin_v mag = (lin_v)(a << 20);
  if (s <= 134)
    mag = mag * lin_fbits(((uint32_t)s + 120u) << 23);
  else
    mag = mag * 0x1p120f;
  lin_vi bits = ((lin_vi)mag | ((v & 0x80u) << 24));
  bits = (bits & ~nan) | (0x7FC00000u & nan);
  if (s > 134) return (lin_v)bits * op_e8m0_decode(s);
  return (lin_v)bits;
}

/* FP4 (E2M1, element 2j in the low nibble of byte j, a UE8M0 group scale s)
 * for the 16 columns k.. (8 bytes). c read as float bits ((c & 7) << 22)
 * has exponent field e = (c >> 1) & 3 and mantissa m << 22: (1 + m/2)
 * 2^(e - 127), or 2^-127 for c = 1: dec(|c|) 2^-126 exactly. Multiplying by
 * 2^(s - 1) (a float for s <= 128) gives dec(|c|) 2^(s - 127) exactly (at
 * most 2 significant bits, >= 2^-128); the sign is bit 3 moved to bit 31.
 * E2M1 has no NaN. Larger scales and 0xFF take the reference's two steps. */
static inline OP_ISA_BODY lin_v lin_load_fp4(const uint8_t *q, uint8_t s) {
  const lin_vb8 b = *(const lin_vb8 *)q, lo = b & 0xF, hi = b >> 4;
  const lin_vb16 nib = __builtin_shufflevector(lo, hi, 0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15);
  const lin_vi c = __builtin_convertvector(nib, lin_vi);
  lin_v mag = (lin_v)((c & 7u) << 22);
  if (s <= 128)
    mag = mag * lin_fbits(((uint32_t)s + 126u) << 23);
  else
    mag = mag * 0x1p126f;
  const lin_v w = (lin_v)((lin_vi)mag | ((c & 8u) << 28));
  if (s > 128) return w * op_e8m0_decode(s);
  return w;
}

/* BF16: the 16 bits are a float's high half (runtime/ckpt_map.c's widening). */
static inline OP_ISA_BODY lin_v lin_load_bf16(const uint16_t *h) {
  return (lin_v)(__builtin_convertvector(*(const lin_vh16 *)h, lin_vi) << 16);
}

/* 16 weights of output row o at column k (a multiple of 16, k + 16 <= in).
 * fmt is a constant at every call site, so each kernel keeps one branch. */
static inline OP_ISA_BODY lin_v lin_wload(const struct op_qweight *w, int o, int k, const enum op_wfmt fmt) {
  const size_t row = (size_t)o * (size_t)w->in;
  switch (fmt) {
    case OP_W_BF16: return lin_load_bf16((const uint16_t *)w->data + row + k);
    case OP_W_FP8: return lin_load_fp8((const uint8_t *)w->data + row + k, op_qweight_scale_at(w, o, k));
    case OP_W_FP4: return lin_load_fp4((const uint8_t *)w->data + row / 2 + k / 2, op_qweight_scale_at(w, o, k));
    default: return *(const lin_vu *)((const float *)w->data + row + k);
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
  lin_v acc[LIN_R * LIN_O1];
  for (int t = 0; t < R * O; t++) acc[t] = (lin_v){0};
  int k = 0;
  for (; k + LIN_LANES <= in; k += LIN_LANES) {
    lin_v wv[LIN_O1];
    for (int o = 0; o < O; o++) wv[o] = lin_wload(w, o0 + o, k, fmt);
    for (int r = 0; r < R; r++) {
      lin_v xr = *(const lin_vu *)(x + (size_t)r * ldx + k);
      for (int o = 0; o < O; o++) acc[r * O + o] += xr * wv[o];
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
    for (; k + LIN_LANES <= in; k += LIN_LANES) *(lin_vu *)(p + k) = lin_wload(w, o, k, fmt);
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

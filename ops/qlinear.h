/* qlinear.h: linear layers straight from weights in their stored formats.
 *
 * What it is: y = x W^T where W (out, in) stays as the release stores it and
 * is decoded in registers inside the kernel:
 *   OP_W_F32   float (out, in);
 *   OP_W_BF16  uint16 (out, in), the high half of a float;
 *   OP_W_FP8   E4M3 bytes (out, in) and UE8M0 scales (ceil(out/32),
 *              ceil(in/32)), one per 32 x 32 tile (the FP8 linears);
 *   OP_W_FP4   E2M1 (out, in/2), element 2j in the low nibble of byte j, and
 *              UE8M0 scales (out, in/32), one per row group of 32 (the
 *              routed experts); in must be a multiple of 32.
 * The weight a kernel uses is dec(q) * 2^(s - 127), one float multiply of
 * op_e4m3_decode / op_e2m1_decode by op_e8m0_decode (ops/formats.h): the
 * values runtime/ckpt_map.c's dequantizers write.
 *
 * Bits: op_qlinear sums every output in op_linear's order (ops/lin_kernel.h:
 * 16 lanes over k, mul then add, a fixed halving tree), so its result is
 * bitwise op_linear over op_qweight_dequant's F32 matrix, at every ISA level,
 * for every n (row-invariant, as op_linear), and a row's bits do not depend
 * on which path (fused tiles or a dequantized panel) computed it.
 *
 * What it is not: a quantizer (runtime/ckpt_map.c writes these bytes) or a
 * way to change numerics (the weights are exactly the dequantized ones).
 * Test: tests/test_ops_qlinear.c (ctest -R ops_qlinear). Docs: docs/ops.md
 * "Linear layers from stored weights", docs/weights.md.
 */
#ifndef CEDAR_OPS_QLINEAR_H
#define CEDAR_OPS_QLINEAR_H

#include <stddef.h>
#include <stdint.h>

#include "ops/qweight.h"

#ifdef __cplusplus /* the CUDA twins in kernels/ include it */
extern "C" {
#endif

/* W (out, in) as floats: the values the kernels use (op_qweight_check(w)
 * must be NULL). */
void op_qweight_dequant(float *W /* (out, in) */, const struct op_qweight *w);

/* y = x W^T, y (n, ldy), x (n, ldx), ldx >= in, ldy >= out; bitwise
 * op_linear(y, x, W, n, in, out, ldx, ldy) with W = op_qweight_dequant(w).
 * y must not overlap x or w. One-row calls (decode) and calls of a few rows
 * (batched decode, an expert over its rows) decode each weight in registers
 * as the tile reads it; calls of OP_QLINEAR_PANEL_ROWS rows or more decode a
 * panel of W (about 256 KiB of floats, in L2) once and run op_linear's tiles
 * over it, so the decode is shared by every row. A panel that cannot be
 * allocated falls back to the fused tiles (the same bits). */
#define OP_QLINEAR_PANEL_ROWS 8
void op_qlinear(float *y /* (n, ldy) */, const float *x /* (n, ldx) */, const struct op_qweight *w, int n, int ldx,
                int ldy);

/* ---- the descriptor's checked call (shared with kernels/qlinear.cu) ---- */
struct op_desc;
struct op_io;
struct op_qlinear_call {
  struct op_qweight w;
  const float *x;
  float *y;
  int n;
};
/* 0, or the status after op_io_fail. */
int op_qlinear_prepare(const struct op_desc *self, struct op_io *io, struct op_qlinear_call *c);

#ifdef __cplusplus
}
#endif

#endif

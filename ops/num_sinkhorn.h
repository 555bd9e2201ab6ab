/* num_sinkhorn.h: mHC's Sinkhorn normalization in Appendix V #5's order, one
 * source for ops/mhc.c (op_mhc_sinkhorn) and the CUDA kernels (kernels/mhc.cu):
 *
 *   C = softmax_rows(logits) + eps          (max-subtracted; sum j = 0..hc-1)
 *   C /= colsum + eps                       (columns j = 0..hc-1, sums over i in order)
 *   repeat iters - 1 times: C /= rowsum + eps; C /= colsum + eps
 *
 * Every sum runs in index order, each division is one IEEE division of the
 * entry by (sum + eps). Entry q = i * hc + j of a matrix lives at C[q *
 * stride] (stride 1: a plain hc x hc matrix; ops/mhc.c's lane layout and a
 * kernel's per-thread layout pass theirs). logits may be C itself (same
 * stride): row i is read before it is written.
 *
 * Bits: adds and divisions round the same in C and CUDA (OP_HD_ADD/DIV); the
 * softmax's expf does not (ops/num.h), so a kernel shares this order, and
 * its tests compare under a tolerance; tests/test_num_core.c checks that the
 * C build of this header gives op_mhc_sinkhorn's bits.
 */
#ifndef CEDAR_OPS_NUM_SINKHORN_H
#define CEDAR_OPS_NUM_SINKHORN_H

#include "ops/num.h"

/* Divide each line a (a row when major = hc, minor = 1; a column when major
 * = 1, minor = hc) by its sum + eps. */
OP_HD_INLINE void op_hd_sinkhorn_norm(float *C, int stride, int hc, float eps, int major, int minor) {
  for (int a = 0; a < hc; a++) {
    float s = 0.0f;
    for (int b = 0; b < hc; b++) s = OP_HD_ADD(s, C[(a * major + b * minor) * stride]);
    const float den = OP_HD_ADD(s, eps);
    for (int b = 0; b < hc; b++) {
      float *c = &C[(a * major + b * minor) * stride];
      *c = OP_HD_DIV(*c, den);
    }
  }
}

OP_HD_INLINE void op_hd_sinkhorn(float *C, int stride, const float *logits, int lstride, int hc, int iters,
                                 float eps) {
  for (int i = 0; i < hc; i++) { /* softmax over each row, + eps */
    float m = logits[(i * hc) * lstride];
    for (int j = 1; j < hc; j++) {
      const float v = logits[(i * hc + j) * lstride];
      m = v > m ? v : m;
    }
    float s = 0.0f;
    for (int j = 0; j < hc; j++) {
      const float e = OP_HD_EXPF(OP_HD_ADD(logits[(i * hc + j) * lstride], -m));
      C[(i * hc + j) * stride] = e;
      s = OP_HD_ADD(s, e);
    }
    for (int j = 0; j < hc; j++) C[(i * hc + j) * stride] = OP_HD_ADD(OP_HD_DIV(C[(i * hc + j) * stride], s), eps);
  }
  op_hd_sinkhorn_norm(C, stride, hc, eps, 1, hc); /* columns */
  for (int it = 1; it < iters; it++) {
    op_hd_sinkhorn_norm(C, stride, hc, eps, hc, 1); /* rows */
    op_hd_sinkhorn_norm(C, stride, hc, eps, 1, hc); /* columns */
  }
}

#endif

/* num_engram.h: the Engram n-gram hash arithmetic (Appendix V #18), one
 * source for ops/engram.c and the CUDA kernels (kernels/engram.cu):
 *
 *   mix_n   = XOR_{k<n} g_k * mult[k]   in int64 arithmetic: the products
 *             wrap as two's complement, as the vendor's numpy int64 does
 *             (computed on uint64, whose wrapping has the same bits);
 *   row     = floor_mod(mix_n, prime) + offset, Python's sign rule: the
 *             residue is in [0, prime) even when the mix is negative.
 *
 * g_k are the compressed ids k positions back (pad past the sequence start),
 * as int64 bits. Integer only: the same bits on every compiler, checked by
 * tests/test_num_core.c and its nvcc twin tests/num_core_nvcc.cu.
 */
#ifndef CEDAR_OPS_NUM_ENGRAM_H
#define CEDAR_OPS_NUM_ENGRAM_H

#include "ops/num.h"

/* a mod p for p > 0, in [0, p). */
OP_HD_INLINE int64_t op_hd_floor_mod(int64_t a, int64_t p) {
  const int64_t r = a % p;
  return r < 0 ? r + p : r;
}

/* XOR of the first `order` wrapped products g[k] * mult[k]. */
OP_HD_INLINE uint64_t op_hd_engram_mix(const uint64_t *g, const uint64_t *mult, int order) {
  uint64_t mix = 0;
  for (int k = 0; k < order; k++) mix ^= g[k] * mult[k];
  return mix;
}

/* The row of one (order, head) table for a mix. */
OP_HD_INLINE int64_t op_hd_engram_row(uint64_t mix, int64_t prime, int64_t offset) {
  return op_hd_floor_mod((int64_t)mix, prime) + offset;
}

#endif

/* num_softmax.h: the online softmax with a sink (Appendix V #14), one source
 * for ops/attention.c and the CUDA sparse-attention kernel
 * (kernels/attention.cu):
 *
 *   start:  m = sink, l = 1 (the sink's term e^(sink - m)), acc = 0;
 *           without a sink m = -inf, l = 0
 *   block:  mb = max(m, the block's logits) (a NaN logit fails the compare);
 *           if mb > m: c = e^(m - mb), l *= c, acc *= c, m = mb
 *           each entry in order: w = e^(z - m), l += w, acc += w k
 *   merge:  two partial states of disjoint entry sets (a kernel's split of
 *           the entries): m = max, each side scaled by e^(m_side - m)
 *   finish: o = acc / l, or 0 when l == 0 (neither a sink nor an entry)
 *
 * The order of the CPU op is start, then blocks in entry order, then finish
 * (ops/attention.c, ATTN_BLOCK entries per block); the kernel splits the
 * entries over warps and merges, so it shares the rules, not the order, and
 * expf differs by an ulp between libm and CUDA (ops/num.h): the kernel's
 * tests compare under a tolerance from the entry count. tests/test_num_core.c
 * checks the C build of these rules against a float64 softmax.
 */
#ifndef CEDAR_OPS_NUM_SOFTMAX_H
#define CEDAR_OPS_NUM_SOFTMAX_H

#include "ops/num.h"

struct op_hd_online {
  float m; /* running max (the sink counts) */
  float l; /* running sum of e^(z - m) */
};

OP_HD_INLINE struct op_hd_online op_hd_online_start(int has_sink, float sink) {
  struct op_hd_online st;
  st.m = has_sink ? sink : -INFINITY;
  st.l = has_sink ? 1.0f : 0.0f;
  return st;
}

/* Raise the running max to mb (the block's max when it exceeds m): rescales
 * l and returns the factor acc must be multiplied by; 1 (exact, so callers
 * may skip the multiply) when the max stays. */
OP_HD_INLINE float op_hd_online_raise(struct op_hd_online *st, float mb) {
  if (!(mb > st->m)) return 1.0f;
  const float c = OP_HD_EXPF(OP_HD_ADD(st->m, -mb));
  st->l = OP_HD_MUL(st->l, c);
  st->m = mb;
  return c;
}

/* One entry's weight e^(z - m), added to l; m must already be >= z. */
OP_HD_INLINE float op_hd_online_weight(struct op_hd_online *st, float z) {
  const float w = OP_HD_EXPF(OP_HD_ADD(z, -st->m));
  st->l = OP_HD_ADD(st->l, w);
  return w;
}

/* Merge b into a: returns in *ca, *cb the factors of a's and b's acc (acc =
 * ca acc_a + cb acc_b). A side with m = -inf (no terms) gets 0. */
OP_HD_INLINE void op_hd_online_merge(struct op_hd_online *a, struct op_hd_online b, float *ca, float *cb) {
  const float m = b.m > a->m ? b.m : a->m;
  if (m == -INFINITY) {
    *ca = 1.0f, *cb = 0.0f;
    return;
  }
  *ca = a->m == -INFINITY ? 0.0f : OP_HD_EXPF(OP_HD_ADD(a->m, -m));
  *cb = b.m == -INFINITY ? 0.0f : OP_HD_EXPF(OP_HD_ADD(b.m, -m));
  a->l = OP_HD_ADD(OP_HD_MUL(a->l, *ca), OP_HD_MUL(b.l, *cb));
  a->m = m;
}

/* The output of one channel: acc / l, or 0 when l == 0. */
OP_HD_INLINE float op_hd_online_out(float acc, float l) { return l == 0.0f ? 0.0f : OP_HD_DIV(acc, l); }

#endif

/* mhc.h: manifold-constrained hyper-connections, the residual streams around every
 * sublayer (SPEC 1.3, 3.3, 3.14, R.7).
 *
 * What it is: the CPU reference for the mHC coefficients, the input mix, the state update,
 * the single-pass fused update and the head merge. The state of one position is X (hc,
 * hidden): hc residual streams (4 [A]). With M = (2 + hc) * hc rows of W_fn and
 * xf = X flattened (hc * hidden):
 *   mixes = (W_fn xf) * rsqrt(mean(xf^2) + norm_eps)                   (M)
 *   pre   = sigmoid(mixes[0:hc]   * scale[0] + base[0:hc])   + hc_eps   in (0, 1 + hc_eps]
 *   post  = 2 sigmoid(mixes[hc:2hc] * scale[1] + base[hc:2hc])           in (0, 2)
 *   C     = Sinkhorn(softmax_rows(mixes[2hc:] * scale[2] + base[2hc:] viewed (hc, hc)) + hc_eps)
 *   u     = sum_i pre[i] X_i                 sublayer input, BEFORE the sublayer's RMSNorm
 *   X'_j  = post[j] F + sum_i C[i][j] X_i     F = the sublayer's output for this position
 * Sinkhorn in R.7's order: C /= (column sums + eps); then (iters - 1) times
 * { C /= (row sums + eps); C /= (column sums + eps) }. Column sums are 1 to rounding after
 * it; row sums converge slowly for spread-out logits (tests/test_ops_mhc.c measures it).
 * In fp32 the open intervals close at saturation: sigmoid rounds to 1 for z >~ 17 (post =
 * 2 exactly) and to 0 below about -88 (post = 0).
 *
 * Single pass (SPEC 3.14 [A]): the coefficients split into statistics of a state
 * (op_mhc_stats: the M dot products W_fn xf and the sum of squares) and a cheap per-row
 * transform (op_mhc_coeffs_from_stats). op_mhc_update_mix_fused writes X', mixes
 * u_next = sum_i pre_next[i] X'_i with a pre that was predicted earlier, and accumulates
 * the statistics of X' in one pass over X, tile by tile. Which sublayer's coefficients
 * those statistics feed (SPEC 3.14: pre of the next sublayer, post and C of this one) is the
 * executor's wiring: the fused op takes any m rows of weights. X' and u_next are bit-equal
 * to op_mhc_update then op_mhc_mix (same per-element expressions, same order), and sumsq to
 * op_mhc_stats on X' (both follow the fixed order at OP_MHC_TILE below). The dots differ
 * from op_mhc_stats by summation order only: the fused pass sums them in that fixed order,
 * op_mhc_stats through op_linear (row-invariant too, in its own order: 16 lanes over
 * the width, then a tree; ops/basic.h), so the two are within
 * 2 gamma(hc * hidden) of the sum of |terms|. Every
 * fixed-order value of a position depends on that position's inputs only, not on n or on
 * its neighbours; a twin kernel that follows the same order gets the same bits. Step 5 of
 * SPEC's pass (pre-norm and FP8 cast of u) is not fused here: the RMSNorm of u needs u's
 * whole row first.
 *
 * Decisions where SPEC is silent: sums over streams run i = 0..hc-1 in fp32; X'_j adds
 * post[j] F after the stream sum; the sum of squares accumulates in fp32 (SPEC 3.2).
 * The plain-sum merge (plan `merge: sum`) is op_mhc_mix with pre = 1.
 *
 * What it is not: the sublayers, their RMSNorm, or any knowledge of which layer owns which
 * W_fn (separate W_fn/scale/base per sublayer and one for the head, R.7).
 * Test: tests/test_ops_mhc.c (ctest -R ops_mhc).
 */
#ifndef CEDAR_OPS_MHC_H
#define CEDAR_OPS_MHC_H

#ifdef __cplusplus /* the CUDA twins in kernels/ include it */
extern "C" {
#endif

/* Dimensions and [R]/[R-cfg] parameters (plan: model.mhc.*). */
struct op_mhc_cfg {
  int hc;             /* residual streams: 4 [A] */
  int hidden;         /* d: 5120 */
  int sinkhorn_iters; /* 20 [R-cfg]; >= 1 */
  float hc_eps;       /* 1e-6 [R-cfg] */
  float norm_eps;     /* eps inside rsqrt(mean(xf^2) + eps): the model's norm_eps (R.1 reports
                         1e-20, SPEC 1.1 defaults RMSNorm eps to 1e-6) */
};

/* Rows of a sublayer's W_fn: (2 + hc) * hc (24 for hc = 4). */
static inline int op_mhc_rows(int hc) { return (2 + hc) * hc; }

/* The fixed order of the fused pass's statistics (and of every sum of squares here). Per
 * position, each of the m dot products and the sum of squares is a sum over tiles of
 * OP_MHC_TILE columns of every stream, added to the total tile after tile (the total starts
 * at 0). A tile's partial runs in OP_MHC_LANES lanes: lane l sums, in order, the products at
 * tile columns l, l + LANES, l + 2 LANES, ... of stream 0, then of stream 1, ..., hc - 1 (a
 * short last tile leaves the higher lanes short); the partial is then lane 0 + lane 1 + ...
 * + lane LANES - 1. A product is rounded once, then passes through at most
 * hc ceil(TILE / LANES) + LANES - 1 + ceil(hidden / TILE) additions (99 at the real widths),
 * so its error bound is far below a sequential sum's gamma(hc * hidden). */
#define OP_MHC_TILE 256
#define OP_MHC_LANES 16

/* Initial state: every stream of position t is h[t] (SPEC 3.1 [R]). */
void op_mhc_expand(float *X /* (n, hc, d) */, const float *h /* (n, d) */, int n, int hc, int d);

/* Statistics of n states against m rows of W: dots = xf W^T through op_linear (a
 * position's bits depend on its state only, ops/basic.h), sumsq = sum(xf^2) in the fixed order
 * above (a position's bits depend on its state only). */
void op_mhc_stats(float *dots /* (n, m) */, float *sumsq /* (n) */, const float *X /* (n, hc, d) */,
                  const float *W /* (m, hc * d) */, int n, int m, int hc, int d);

/* pre, post, C from the statistics (R.7). scale (3), base (M). Several positions go
 * through Sinkhorn at once, one per vector lane, with op_mhc_sinkhorn's operations in its
 * order: each position's C is bit-equal to op_mhc_sinkhorn on its logits, whatever n. */
void op_mhc_coeffs_from_stats(float *pre /* (n, hc) */, float *post /* (n, hc) */, float *C /* (n, hc, hc) */,
                              const float *dots /* (n, M) */, const float *sumsq /* (n) */,
                              const float *scale /* (3) */, const float *base /* (M) */, int n,
                              const struct op_mhc_cfg *c);

/* op_mhc_stats then op_mhc_coeffs_from_stats; dots and sumsq are outputs too (traces). */
void op_mhc_coeffs(float *pre /* (n, hc) */, float *post /* (n, hc) */, float *C /* (n, hc, hc) */,
                   float *dots /* (n, M) */, float *sumsq /* (n) */, const float *X /* (n, hc, d) */,
                   const float *W_fn /* (M, hc * d) */, const float *scale /* (3) */, const float *base /* (M) */,
                   int n, const struct op_mhc_cfg *c);

/* H_res of one position: C = Sinkhorn(softmax_rows(logits) + eps), iters >= 1, in R.7's
 * order. C may alias logits. */
void op_mhc_sinkhorn(float *C /* (hc, hc) */, const float *logits /* (hc, hc) */, int hc, int iters, float eps);

/* u = sum_i pre[i] X_i. u must not alias X. */
void op_mhc_mix(float *u /* (n, d) */, const float *X /* (n, hc, d) */, const float *pre /* (n, hc) */, int n, int hc,
                int d);

/* X'_j = sum_i C[i][j] X_i + post[j] F. Xn must not alias X. */
void op_mhc_update(float *Xn /* (n, hc, d) */, const float *X /* (n, hc, d) */, const float *C /* (n, hc, hc) */,
                   const float *post /* (n, hc) */, const float *F /* (n, d) */, int n, int hc, int d);

/* op_mhc_update written over X itself, bit for bit the same X': each tile of
 * a position's streams is copied to a buffer first (L1-sized), instead of a
 * whole second state and a copy back. */
void op_mhc_update_inplace(float *X /* (n, hc, d) */, const float *C /* (n, hc, hc) */, const float *post /* (n, hc) */,
                           const float *F /* (n, d) */, int n, int hc, int d);

/* One pass: Xn = op_mhc_update(X, C, post, F); u_next = op_mhc_mix(Xn, pre_next);
 * dots, sumsq = the statistics of Xn against W (m, hc * d), accumulated tile by tile.
 * Xn must not alias X. */
void op_mhc_update_mix_fused(float *Xn /* (n, hc, d) */, float *u_next /* (n, d) */, float *dots /* (n, m) */,
                             float *sumsq /* (n) */, const float *X /* (n, hc, d) */, const float *C /* (n, hc, hc) */,
                             const float *post /* (n, hc) */, const float *F /* (n, d) */,
                             const float *pre_next /* (n, hc) */, const float *W /* (m, hc * d) */, int n, int m,
                             int hc, int d);

/* Head merge (R.7 last lines): pre = sigmoid(mixes * scale + base) + hc_eps with
 * mixes = (W_fn xf) * rsqrt(mean(xf^2) + norm_eps), y = sum_i pre[i] X_i; no Sinkhorn.
 * pre is returned too. */
void op_mhc_merge(float *y /* (n, d) */, float *pre /* (n, hc) */, const float *X /* (n, hc, d) */,
                  const float *W_fn /* (hc, hc * d) */, float scale, const float *base /* (hc) */, int n,
                  const struct op_mhc_cfg *c);

/* The checked calls of mhc_coeffs, mhc_mix, mhc_update and mhc_merge
 * (outputs allocated), shared by their CPU runs and the CUDA twins
 * (kernels/mhc.cu): 0 or the status after op_io_fail. Fields an op does not
 * use stay NULL; cfg.hc and cfg.hidden are always set. */
enum op_mhc_kind { OP_MHC_COEFFS = 0, OP_MHC_MIX, OP_MHC_UPDATE, OP_MHC_MERGE };
struct op_desc;
struct op_io;
struct op_mhc_call {
  const float *X, *W_fn, *scale, *base; /* coeffs, merge (X: every op) */
  const float *pre_in;                  /* mix */
  const float *C_in, *post_in, *F;      /* update */
  float *pre, *post, *C, *dots, *sumsq; /* coeffs outputs (merge: pre) */
  float *u, *X_next, *y;                /* mix, update, merge outputs */
  int n;
  struct op_mhc_cfg cfg;
};
int op_mhc_prepare(const struct op_desc *self, struct op_io *io, enum op_mhc_kind kind, struct op_mhc_call *c);

#ifdef __cplusplus
}
#endif

#endif

/* mhc.c: mHC coefficients, Sinkhorn, mix, update, the fused single pass and the head
 * merge (see mhc.h for the math and the decisions). */
#include "ops/mhc.h"

#include <limits.h>
#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ops/basic.h"
#include "ops/registry.h"
#include "runtime/check.h"

/* The per-element expressions, in tiles of len values of every stream, shared by the plain
 * and the fused paths so that both give the same bits (the build is ISO C11: no
 * floating-point contraction into FMA). x points at stream 0 of one position, at the
 * tile's first column; streams are d apart. Each element follows the same sequence of
 * roundings as the scalar formula (stream 0's product, then streams 1..hc-1 added in
 * order, then post[j] F); the loops run over k innermost so that they vectorize. */
static void mix_tile(float *restrict u, const float *restrict x, const float *pre, int hc, size_t d, int len) {
  const float p0 = pre[0];
  for (int k = 0; k < len; k++) u[k] = p0 * x[k];
  for (int i = 1; i < hc; i++) {
    const float p = pre[i], *restrict xi = x + (size_t)i * d;
    for (int k = 0; k < len; k++) u[k] += p * xi[k];
  }
}

/* X'_j[k] = sum_i C[i][j] X_i[k] + post[j] F[k]. */
static void update_tile(float *restrict xn, const float *restrict x, const float *C, const float *post,
                        const float *restrict f, int hc, size_t d, int len) {
  for (int j = 0; j < hc; j++) {
    float *restrict y = xn + (size_t)j * d;
    const float c0 = C[j], pj = post[j];
    for (int k = 0; k < len; k++) y[k] = c0 * x[k];
    for (int i = 1; i < hc; i++) {
      const float c = C[i * hc + j], *restrict xi = x + (size_t)i * d;
      for (int k = 0; k < len; k++) y[k] += c * xi[k];
    }
    for (int k = 0; k < len; k++) y[k] += pj * f[k];
  }
}

/* The tile statistics in the fixed order of mhc.h: OP_MHC_LANES partial sums, lane l
 * taking columns l, l + LANES, l + 2 LANES, ... of stream 0, then of stream 1, ...; then
 * the lanes added in lane order. Independent lanes let the compiler keep them in vector
 * registers. A tile is hc streams of len values, d apart. */
enum { LANES = OP_MHC_LANES, ROWS = 4 };

/* sum_j sum_k x_j[k]^2 of one tile. */
static float tile_sumsq(const float *restrict x, int hc, size_t d, int len) {
  float acc[LANES] = {0};
  for (int j = 0; j < hc; j++) {
    const float *restrict xj = x + (size_t)j * d;
    int k = 0;
    for (; k + LANES <= len; k += LANES)
      for (int l = 0; l < LANES; l++) acc[l] += xj[k + l] * xj[k + l];
    for (int l = 0; k + l < len; l++) acc[l] += xj[k + l] * xj[k + l];
  }
  float s = acc[0];
  for (int l = 1; l < LANES; l++) s += acc[l];
  return s;
}

/* out[r] = sum_j sum_k w_r,j[k] x_j[k] of one tile for ROWS rows of W at once (w_r = w +
 * r ws; ws = 0 repeats one row), so that the rows share the loads of x. Each row keeps
 * its own lanes: the number of rows at once does not change any row's order. */
static void tile_dots(float out[ROWS], const float *restrict w, size_t ws, const float *restrict x, int hc, size_t d,
                      int len) {
  float acc[ROWS][LANES] = {{0}};
  for (int j = 0; j < hc; j++) {
    const float *restrict wj = w + (size_t)j * d, *restrict xj = x + (size_t)j * d;
    int k = 0;
    for (; k + LANES <= len; k += LANES)
      for (int r = 0; r < ROWS; r++)
        for (int l = 0; l < LANES; l++) acc[r][l] += wj[r * ws + k + l] * xj[k + l];
    for (int r = 0; r < ROWS; r++)
      for (int l = 0; k + l < len; l++) acc[r][l] += wj[r * ws + k + l] * xj[k + l];
  }
  for (int r = 0; r < ROWS; r++) {
    out[r] = acc[r][0];
    for (int l = 1; l < LANES; l++) out[r] += acc[r][l];
  }
}

void op_mhc_expand(float *X, const float *h, int n, int hc, int d) {
  for (int t = 0; t < n; t++)
    for (int i = 0; i < hc; i++) memcpy(X + ((size_t)t * hc + i) * d, h + (size_t)t * d, (size_t)d * sizeof *X);
}

/* ---- coefficients ---------------------------------------------------------------- */

void op_mhc_stats(float *dots, float *sumsq, const float *X, const float *W, int n, int m, int width) {
  op_linear(dots, X, W, n, width, m, width, m);
  for (int t = 0; t < n; t++) {
    const float *x = X + (size_t)t * width;
    float ss = 0.0f;
    for (int k = 0; k < width; k++) ss += x[k] * x[k];
    sumsq[t] = ss;
  }
}

static void norm_cols(float *C, int hc, float eps) {
  for (int j = 0; j < hc; j++) {
    float s = 0.0f;
    for (int i = 0; i < hc; i++) s += C[i * hc + j];
    for (int i = 0; i < hc; i++) C[i * hc + j] /= s + eps;
  }
}

static void norm_rows(float *C, int hc, float eps) {
  for (int i = 0; i < hc; i++) {
    float s = 0.0f;
    for (int j = 0; j < hc; j++) s += C[i * hc + j];
    for (int j = 0; j < hc; j++) C[i * hc + j] /= s + eps;
  }
}

void op_mhc_sinkhorn(float *C, const float *logits, int hc, int iters, float eps) {
  for (int i = 0; i < hc; i++) { /* softmax over each row, + eps */
    const float *l = logits + i * hc;
    float *c = C + i * hc;
    float m = l[0];
    for (int j = 1; j < hc; j++) m = l[j] > m ? l[j] : m;
    float s = 0.0f;
    for (int j = 0; j < hc; j++) {
      c[j] = expf(l[j] - m);
      s += c[j];
    }
    for (int j = 0; j < hc; j++) c[j] = c[j] / s + eps;
  }
  norm_cols(C, hc, eps);
  for (int it = 1; it < iters; it++) {
    norm_rows(C, hc, eps);
    norm_cols(C, hc, eps);
  }
}

void op_mhc_coeffs_from_stats(float *pre, float *post, float *C, const float *dots, const float *sumsq,
                              const float *scale, const float *base, int n, const struct op_mhc_cfg *c) {
  int hc = c->hc, M = op_mhc_rows(hc);
  float width = (float)hc * (float)c->hidden;
  for (int t = 0; t < n; t++) {
    const float *mx = dots + (size_t)t * M;
    float r = 1.0f / sqrtf(sumsq[t] / width + c->norm_eps);
    float *pt = pre + (size_t)t * hc, *qt = post + (size_t)t * hc, *ct = C + (size_t)t * hc * hc;
    for (int i = 0; i < hc; i++) {
      pt[i] = op_sigmoid(mx[i] * r * scale[0] + base[i]) + c->hc_eps;
      qt[i] = 2.0f * op_sigmoid(mx[hc + i] * r * scale[1] + base[hc + i]);
    }
    for (int q = 0; q < hc * hc; q++) ct[q] = mx[2 * hc + q] * r * scale[2] + base[2 * hc + q];
    op_mhc_sinkhorn(ct, ct, hc, c->sinkhorn_iters, c->hc_eps);
  }
}

void op_mhc_coeffs(float *pre, float *post, float *C, float *dots, float *sumsq, const float *X, const float *W_fn,
                   const float *scale, const float *base, int n, const struct op_mhc_cfg *c) {
  op_mhc_stats(dots, sumsq, X, W_fn, n, op_mhc_rows(c->hc), c->hc * c->hidden);
  op_mhc_coeffs_from_stats(pre, post, C, dots, sumsq, scale, base, n, c);
}

/* ---- mix and update ------------------------------------------------------------------ */

void op_mhc_mix(float *u, const float *X, const float *pre, int n, int hc, int d) {
  for (int t = 0; t < n; t++)
    for (int k0 = 0; k0 < d; k0 += OP_MHC_TILE)
      mix_tile(u + (size_t)t * d + k0, X + (size_t)t * hc * d + k0, pre + (size_t)t * hc, hc, (size_t)d,
               d - k0 < OP_MHC_TILE ? d - k0 : OP_MHC_TILE);
}

void op_mhc_update(float *Xn, const float *X, const float *C, const float *post, const float *F, int n, int hc, int d) {
  for (int t = 0; t < n; t++)
    for (int k0 = 0; k0 < d; k0 += OP_MHC_TILE) {
      size_t o = (size_t)t * hc * d + k0;
      update_tile(Xn + o, X + o, C + (size_t)t * hc * hc, post + (size_t)t * hc, F + (size_t)t * d + k0, hc,
                  (size_t)d, d - k0 < OP_MHC_TILE ? d - k0 : OP_MHC_TILE);
    }
}

/* One position's tile [k0, k0 + len) of the fused pass: write X', mix u, then add the
 * tile's partial sum of squares and partial dot products to the totals. All pointers are
 * at the position and the tile's first column (W at row 0); width = hc d. */
static void fused_tile(float *xn, float *u, float *dots, float *sumsq, const float *x, const float *C,
                       const float *post, const float *f, const float *pre, const float *W, int m, int hc, size_t d,
                       int len) {
  size_t width = (size_t)hc * d;
  update_tile(xn, x, C, post, f, hc, d, len);
  mix_tile(u, xn, pre, hc, d, len);
  *sumsq += tile_sumsq(xn, hc, d, len);
  float part[ROWS];
  for (int q = 0; q < m;) { /* the last m % ROWS rows one at a time (ws = 0) */
    int nr = m - q >= ROWS ? ROWS : 1;
    tile_dots(part, W + q * width, nr == ROWS ? width : 0, xn, hc, d, len);
    for (int r = 0; r < nr; r++) dots[q + r] += part[r];
    q += nr;
  }
}

/* Positions go in blocks of BLOCK, tiles outermost inside a block, so that W's columns of
 * one tile (m hc OP_MHC_TILE values, 96 KiB for hc = 4) stay in cache for the block's
 * positions; the order of every sum is the same for any blocking. */
enum { BLOCK = 16 };

void op_mhc_update_mix_fused(float *Xn, float *u_next, float *dots, float *sumsq, const float *X, const float *C,
                             const float *post, const float *F, const float *pre_next, const float *W, int n, int m,
                             int hc, int d) {
  size_t width = (size_t)hc * d;
  for (size_t i = 0; i < (size_t)n * m; i++) dots[i] = 0.0f;
  for (int t = 0; t < n; t++) sumsq[t] = 0.0f;
  for (int t0 = 0; t0 < n; t0 += BLOCK)
    for (int k0 = 0; k0 < d; k0 += OP_MHC_TILE)
      for (int t = t0; t < t0 + BLOCK && t < n; t++) {
        size_t o = t * width + k0;
        fused_tile(Xn + o, u_next + (size_t)t * d + k0, dots + (size_t)t * m, sumsq + t, X + o,
                   C + (size_t)t * hc * hc, post + (size_t)t * hc, F + (size_t)t * d + k0, pre_next + (size_t)t * hc,
                   W + k0, m, hc, (size_t)d, d - k0 < OP_MHC_TILE ? d - k0 : OP_MHC_TILE);
      }
}

/* ---- head merge -------------------------------------------------------------------- */

void op_mhc_merge(float *y, float *pre, const float *X, const float *W_fn, float scale, const float *base, int n,
                  const struct op_mhc_cfg *c) {
  int hc = c->hc, width = hc * c->hidden;
  op_linear(pre, X, W_fn, n, width, hc, width, hc); /* the dots, transformed in place below */
  for (int t = 0; t < n; t++) {
    const float *x = X + (size_t)t * width;
    float ss = 0.0f;
    for (int k = 0; k < width; k++) ss += x[k] * x[k];
    float r = 1.0f / sqrtf(ss / (float)width + c->norm_eps);
    float *p = pre + (size_t)t * hc;
    for (int i = 0; i < hc; i++) p[i] = op_sigmoid(p[i] * r * scale + base[i]) + c->hc_eps;
  }
  op_mhc_mix(y, X, pre, n, hc, c->hidden);
}

/* ---- registry descriptors (ops/registry.h) -------------------------------------------- */

/* Shape checks for the descriptors. (The same small helpers sit in each family file that
 * registers ops: registry.c offers none that format shapes.) */

/* The state X (n, hc, d): hc >= 1 streams of d >= 1 values, n and hc * d ints. */
static const struct op_tensor *mhc_state(const struct op_desc *self, struct op_io *io, int64_t *xd) {
  const struct op_tensor *X = op_io_in(self, io, "X", 3, xd);
  if (X && (xd[1] < 1 || xd[2] < 1 || xd[0] > INT_MAX || xd[1] > INT_MAX || xd[2] > INT_MAX ||
            xd[1] * xd[2] > INT_MAX)) {
    char b[192];
    op_io_fail(io, "%s: X is %s; it needs hc >= 1 streams of d >= 1 values, with n and hc * d at most %d",
               self->name, op_dims_str(b, sizeof b, xd, 3), INT_MAX);
    return NULL;
  }
  return X;
}

/* hc, d from X's shape; sinkhorn_iters (when the op has it, else 1), hc_eps, norm_eps. */
static bool mhc_config(const struct op_desc *self, struct op_io *io, const int64_t *xd, bool sinkhorn,
                       struct op_mhc_cfg *c) {
  int64_t iters = 1;
  if (sinkhorn && !op_io_param_int(self, io, "sinkhorn_iters", 1, 1000000, &iters)) return false;
  c->hc = (int)xd[1], c->hidden = (int)xd[2], c->sinkhorn_iters = (int)iters;
  return op_io_param_nonneg(self, io, "hc_eps", &c->hc_eps) && op_io_param_nonneg(self, io, "norm_eps", &c->norm_eps);
}

static int mhc_coeffs_run(const struct op_desc *self, struct op_io *io) {
  int64_t xd[3], wd[2], sd[1], bd[1];
  const struct op_tensor *X = mhc_state(self, io, xd), *W = NULL, *scale = NULL, *base = NULL;
  if (!X || !(W = op_io_in(self, io, "W_fn", 2, wd)) || !(scale = op_io_in(self, io, "scale", 1, sd)) ||
      !(base = op_io_in(self, io, "base", 1, bd)))
    return CEDAR_EINVAL;
  int64_t n = xd[0], hc = xd[1], M = (2 + hc) * hc;
  struct op_mhc_cfg c;
  if (!op_io_dims_match(io, self->name, "W_fn", wd, (int64_t[]){M, hc * xd[2]}, 2, "X", xd, 3) ||
      !op_io_dims_match(io, self->name, "scale", sd, (int64_t[]){3}, 1, "the three scales (pre, post, res)", NULL, 0) ||
      !op_io_dims_match(io, self->name, "base", bd, (int64_t[]){M}, 1, "W_fn", wd, 2) || !mhc_config(self, io, xd, true, &c))
    return CEDAR_EINVAL;
  float *pre = op_io_out(self, io, "pre", 2, (int64_t[]){n, hc});
  float *post = pre ? op_io_out(self, io, "post", 2, (int64_t[]){n, hc}) : NULL;
  float *C = post ? op_io_out(self, io, "C", 3, (int64_t[]){n, hc, hc}) : NULL;
  float *dots = C ? op_io_out(self, io, "dots", 2, (int64_t[]){n, M}) : NULL;
  float *sumsq = dots ? op_io_out(self, io, "sumsq", 1, (int64_t[]){n}) : NULL;
  if (!sumsq) return CEDAR_ENOMEM;
  op_mhc_coeffs(pre, post, C, dots, sumsq, X->data, W->data, scale->data, base->data, (int)n, &c);
  return 0;
}

static int mhc_mix_run(const struct op_desc *self, struct op_io *io) {
  int64_t xd[3], pd[2];
  const struct op_tensor *X = mhc_state(self, io, xd), *pre = X ? op_io_in(self, io, "pre", 2, pd) : NULL;
  if (!pre || !op_io_dims_match(io, self->name, "pre", pd, (int64_t[]){xd[0], xd[1]}, 2, "X", xd, 3)) return CEDAR_EINVAL;
  float *u = op_io_out(self, io, "u", 2, (int64_t[]){xd[0], xd[2]});
  if (!u) return CEDAR_ENOMEM;
  op_mhc_mix(u, X->data, pre->data, (int)xd[0], (int)xd[1], (int)xd[2]);
  return 0;
}

static int mhc_update_run(const struct op_desc *self, struct op_io *io) {
  int64_t xd[3], cd[3], pd[2], fd[2];
  const struct op_tensor *X = mhc_state(self, io, xd), *C = NULL, *post = NULL, *F = NULL;
  if (!X || !(C = op_io_in(self, io, "C", 3, cd)) || !(post = op_io_in(self, io, "post", 2, pd)) ||
      !(F = op_io_in(self, io, "F", 2, fd)))
    return CEDAR_EINVAL;
  int64_t n = xd[0], hc = xd[1], d = xd[2];
  if (!op_io_dims_match(io, self->name, "C", cd, (int64_t[]){n, hc, hc}, 3, "X", xd, 3) ||
      !op_io_dims_match(io, self->name, "post", pd, (int64_t[]){n, hc}, 2, "X", xd, 3) ||
      !op_io_dims_match(io, self->name, "F", fd, (int64_t[]){n, d}, 2, "X", xd, 3))
    return CEDAR_EINVAL;
  float *Xn = op_io_out(self, io, "X_next", 3, xd);
  if (!Xn) return CEDAR_ENOMEM;
  op_mhc_update(Xn, X->data, C->data, post->data, F->data, (int)n, (int)hc, (int)d);
  return 0;
}

static int mhc_merge_run(const struct op_desc *self, struct op_io *io) {
  int64_t xd[3], wd[2], sd[1], bd[1];
  const struct op_tensor *X = mhc_state(self, io, xd), *W = NULL, *scale = NULL, *base = NULL;
  if (!X || !(W = op_io_in(self, io, "W_fn", 2, wd)) || !(scale = op_io_in(self, io, "scale", 1, sd)) ||
      !(base = op_io_in(self, io, "base", 1, bd)))
    return CEDAR_EINVAL;
  int64_t n = xd[0], hc = xd[1];
  struct op_mhc_cfg c;
  if (!op_io_dims_match(io, self->name, "W_fn", wd, (int64_t[]){hc, hc * xd[2]}, 2, "X", xd, 3) ||
      !op_io_dims_match(io, self->name, "scale", sd, (int64_t[]){1}, 1, "the head's one scale", NULL, 0) ||
      !op_io_dims_match(io, self->name, "base", bd, (int64_t[]){hc}, 1, "X", xd, 3) || !mhc_config(self, io, xd, false, &c))
    return CEDAR_EINVAL;
  float *y = op_io_out(self, io, "y", 2, (int64_t[]){n, xd[2]});
  float *pre = y ? op_io_out(self, io, "pre", 2, (int64_t[]){n, hc}) : NULL;
  if (!pre) return CEDAR_ENOMEM;
  op_mhc_merge(y, pre, X->data, W->data, ((const float *)scale->data)[0], base->data, (int)n, &c);
  return 0;
}

#define MHC_X_ARG {"X", OP_F32, "(n, hc, d)", "residual state: hc streams of d values per position"}
#define MHC_EPS_PARAMS                                                                                     \
  {"hc_eps", OP_PARAM_FLOAT, 1e-6, "hc_eps [R-cfg]"},                                                      \
  {"norm_eps", OP_PARAM_FLOAT, 1e-6, "eps in rsqrt(mean(xf^2) + eps) [R] (SPEC 1.1; R.1 reports 1e-20)"}

const struct op_desc op_desc_mhc_coeffs = {
    .name = "mhc_coeffs",
    .summary = "mHC coefficients pre, post and Sinkhorn C of each position's state (SPEC 3.14, R.7)",
    .inputs = (const struct op_arg[]){MHC_X_ARG,
                                      {"W_fn", OP_F32, "((2 + hc) * hc, hc * d)", "the sublayer's mHC projection"},
                                      {"scale", OP_F32, "(3)", "scales of the pre, post and res mixes"},
                                      {"base", OP_F32, "((2 + hc) * hc)", "biases of the mixes"},
                                      {0}},
    .outputs = (const struct op_arg[]){{"pre", OP_F32, "(n, hc)", "input mix: sigmoid(.) + hc_eps"},
                                       {"post", OP_F32, "(n, hc)", "output gains: 2 sigmoid(.)"},
                                       {"C", OP_F32, "(n, hc, hc)", "H_res after Sinkhorn"},
                                       {"dots", OP_F32, "(n, (2 + hc) * hc)", "statistics: W_fn xf"},
                                       {"sumsq", OP_F32, "(n)", "statistics: sum of xf^2"},
                                       {0}},
    .params = (const struct op_param[]){{"sinkhorn_iters", OP_PARAM_INT, 20, "hc_sinkhorn_iters [R-cfg]"},
                                        MHC_EPS_PARAMS,
                                        {0}},
    .run = mhc_coeffs_run,
};

const struct op_desc op_desc_mhc_mix = {
    .name = "mhc_mix",
    .summary = "mHC input mix u = sum_i pre[i] X_i, before the sublayer's RMSNorm (SPEC 3.14, R.7)",
    .inputs = (const struct op_arg[]){MHC_X_ARG, {"pre", OP_F32, "(n, hc)", "input mix coefficients"}, {0}},
    .outputs = (const struct op_arg[]){{"u", OP_F32, "(n, d)", "sublayer input"}, {0}},
    .run = mhc_mix_run,
};

const struct op_desc op_desc_mhc_update = {
    .name = "mhc_update",
    .summary = "mHC state update X'_j = sum_i C[i][j] X_i + post[j] F (SPEC 3.14, R.7)",
    .inputs = (const struct op_arg[]){MHC_X_ARG,
                                      {"C", OP_F32, "(n, hc, hc)", "H_res (Sinkhorn output)"},
                                      {"post", OP_F32, "(n, hc)", "output gains"},
                                      {"F", OP_F32, "(n, d)", "the sublayer's output"},
                                      {0}},
    .outputs = (const struct op_arg[]){{"X_next", OP_F32, "(n, hc, d)", "updated state"}, {0}},
    .run = mhc_update_run,
};

const struct op_desc op_desc_mhc_merge = {
    .name = "mhc_merge",
    .summary = "mHC head merge: y = sum_i pre[i] X_i with pre = sigmoid(.) + hc_eps, no Sinkhorn (R.7)",
    .inputs = (const struct op_arg[]){MHC_X_ARG,
                                      {"W_fn", OP_F32, "(hc, hc * d)", "the head's mHC projection"},
                                      {"scale", OP_F32, "(1)", "the head's scale"},
                                      {"base", OP_F32, "(hc)", "the head's biases"},
                                      {0}},
    .outputs = (const struct op_arg[]){{"y", OP_F32, "(n, d)", "merged hidden state (before the final RMSNorm)"},
                                       {"pre", OP_F32, "(n, hc)", "merge coefficients"},
                                       {0}},
    .params = (const struct op_param[]){MHC_EPS_PARAMS, {0}},
    .run = mhc_merge_run,
};

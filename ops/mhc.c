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

/* The per-element expressions, shared by the plain and the fused paths so that both give
 * the same bits (the build is ISO C11: no floating-point contraction into FMA). X points at
 * stream 0 of one position; streams are d apart. */
static inline float mix_elem(const float *X, const float *pre, int hc, size_t d, size_t k) {
  float acc = pre[0] * X[k];
  for (int i = 1; i < hc; i++) acc += pre[i] * X[(size_t)i * d + k];
  return acc;
}

static inline float update_elem(const float *X, const float *C, float post_j, float f, int hc, size_t d, int j,
                                size_t k) {
  float acc = C[j] * X[k];
  for (int i = 1; i < hc; i++) acc += C[i * hc + j] * X[(size_t)i * d + k];
  return acc + post_j * f;
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
  for (int t = 0; t < n; t++) {
    const float *x = X + (size_t)t * hc * d, *p = pre + (size_t)t * hc;
    float *ut = u + (size_t)t * d;
    for (int k = 0; k < d; k++) ut[k] = mix_elem(x, p, hc, d, k);
  }
}

void op_mhc_update(float *Xn, const float *X, const float *C, const float *post, const float *F, int n, int hc, int d) {
  for (int t = 0; t < n; t++) {
    const float *x = X + (size_t)t * hc * d, *ct = C + (size_t)t * hc * hc, *f = F + (size_t)t * d;
    float *xn = Xn + (size_t)t * hc * d;
    for (int j = 0; j < hc; j++)
      for (int k = 0; k < d; k++)
        xn[(size_t)j * d + k] = update_elem(x, ct, post[(size_t)t * hc + j], f[k], hc, d, j, k);
  }
}

/* One position of the fused pass: per tile [k0, k1) of every stream, write X', mix u,
 * then add the tile's partial sum of squares and partial dot products to the totals. */
static void fused_row(float *xn, float *u, float *dots, float *sumsq, const float *x, const float *ct,
                      const float *post, const float *f, const float *pre, const float *W, int m, int hc, int d) {
  size_t width = (size_t)hc * d;
  float ss = 0.0f;
  for (int q = 0; q < m; q++) dots[q] = 0.0f;
  for (int k0 = 0; k0 < d; k0 += OP_MHC_TILE) {
    int k1 = k0 + OP_MHC_TILE < d ? k0 + OP_MHC_TILE : d;
    for (int j = 0; j < hc; j++)
      for (int k = k0; k < k1; k++) xn[(size_t)j * d + k] = update_elem(x, ct, post[j], f[k], hc, d, j, k);
    for (int k = k0; k < k1; k++) u[k] = mix_elem(xn, pre, hc, d, k);
    float part = 0.0f;
    for (int j = 0; j < hc; j++)
      for (int k = k0; k < k1; k++) part += xn[(size_t)j * d + k] * xn[(size_t)j * d + k];
    ss += part;
    for (int q = 0; q < m; q++) {
      const float *w = W + (size_t)q * width;
      float dp = 0.0f;
      for (int j = 0; j < hc; j++)
        for (int k = k0; k < k1; k++) dp += w[(size_t)j * d + k] * xn[(size_t)j * d + k];
      dots[q] += dp;
    }
  }
  *sumsq = ss;
}

void op_mhc_update_mix_fused(float *Xn, float *u_next, float *dots, float *sumsq, const float *X, const float *C,
                             const float *post, const float *F, const float *pre_next, const float *W, int n, int m,
                             int hc, int d) {
  for (int t = 0; t < n; t++) {
    size_t o = (size_t)t * hc * d;
    fused_row(Xn + o, u_next + (size_t)t * d, dots + (size_t)t * m, sumsq + t, X + o, C + (size_t)t * hc * hc,
              post + (size_t)t * hc, F + (size_t)t * d, pre_next + (size_t)t * hc, W, m, hc, d);
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

/* mhc.c: mHC coefficients, Sinkhorn, mix, update, the fused single pass and the head
 * merge (see mhc.h for the math and the decisions). */
#include "ops/mhc.h"

#include <math.h>
#include <string.h>

#include "ops/basic.h"

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

/* test_ops_mhc.c: mHC (ops/mhc.h) against float64 references written here.
 *
 * What it is: the coefficients (pre, post, C from a state, R.7), Sinkhorn alone, the mix,
 * the update, the head merge and the stream expansion, at odd and real sizes, with derived
 * error bounds; the single-pass fused update+mix+statistics against the unfused sequence
 * (X', u and the sum of squares bit for bit, the dots within the bound of two summation
 * orders, both statistics bit for bit in mhc.h's fixed order); row independence (the fused
 * pass over runs of positions, the batched Sinkhorn of the coefficients against
 * op_mhc_sinkhorn and against each position alone); and
 * SPEC 8.6.27: H_res entries >= 0, column sums 1 to rounding, row sums bounded per logit
 * range by values measured here (SPEC's "1e-3 for |logit| <~ 4" does not hold at 20
 * iterations; see check_sinkhorn_rows), pre in (0, 1 + eps], post in (0, 2).
 *
 * What it is not: a test of a whole block or of the executor's single-pass wiring.
 *
 * Run: ctest --test-dir build -R ops_mhc --output-on-failure
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/basic.h"
#include "ops/mhc.h"
#include "tests/harness.h"

/* ---- helpers ----------------------------------------------------------------------- */

static float *fvec(size_t n, uint64_t *seed, float lo, float hi) {
  float *v = malloc((n ? n : 1) * sizeof(float));
  h_fill(v, n, seed, lo, hi);
  return v;
}

static double *dvec(size_t n) { return malloc((n ? n : 1) * sizeof(double)); }

static double ref_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }

/* ---- float64 Sinkhorn and its bound ---------------------------------------------------- */

/* R.7 in float64: softmax rows + eps, columns, then (iters - 1) x (rows, columns). */
static void ref_sinkhorn(double *C, const double *z, int hc, int iters, double eps) {
  for (int i = 0; i < hc; i++) {
    double m = -INFINITY, s = 0;
    for (int j = 0; j < hc; j++) m = fmax(m, z[i * hc + j]);
    for (int j = 0; j < hc; j++) s += exp(z[i * hc + j] - m);
    for (int j = 0; j < hc; j++) C[i * hc + j] = exp(z[i * hc + j] - m) / s + eps;
  }
  for (int it = 0; it < iters; it++) {
    if (it > 0)
      for (int i = 0; i < hc; i++) {
        double s = 0;
        for (int j = 0; j < hc; j++) s += C[i * hc + j];
        for (int j = 0; j < hc; j++) C[i * hc + j] /= s + eps;
      }
    for (int j = 0; j < hc; j++) {
      double s = 0;
      for (int i = 0; i < hc; i++) s += C[i * hc + j];
      for (int i = 0; i < hc; i++) C[i * hc + j] /= s + eps;
    }
  }
}

/* Bound on |C_fp32 - C_ref| for logits known to within dz (absolute, max over the matrix).
 * Every step of Sinkhorn is a diagonal scaling, so write the fp32 result as the reference
 * times exp(D), D a matrix of log errors. The logits' error enters the softmax as
 * |D| <= 2 dz (numerator and normaliser; the +eps only dilutes it). Each fp32 step adds a
 * relative error <= eta: a sum of hc terms gamma(hc), + eps and the division 2u; the
 * softmax step also rounds z - m (u |z - m| in the exponent), expf (2u), the sum, the
 * division and + eps. Linearised, a normalisation maps D to D minus its C-weighted row (or
 * column) mean: an orthogonal projection in the norm ||D||_w^2 = sum C_ij D_ij^2, so it
 * never grows D in that norm; steps' errors add. sum_ij C_ij = hc (columns sum to 1), so
 * ||D||_w <= sqrt(hc) (2 dz + eta_softmax + (2 iters - 1) eta), and
 * |C_ij D_ij| <= sqrt(C_ij) ||D||_w. Plus the last rounding, u C_ij. */
static void sinkhorn_bound(double *bd, const double *C, const double *z, double dz, int hc, int iters) {
  double zmax = 0;
  for (int q = 0; q < hc * hc; q++) zmax = fmax(zmax, fabs(z[q]));
  double eta = h_gamma(hc) + 2 * H_U32;
  double eta_soft = H_U32 * (2 * 2 * zmax + 2 + 3) + h_gamma(hc);
  double w = sqrt((double)hc) * (2 * dz + eta_soft + (2 * iters - 1) * eta);
  for (int q = 0; q < hc * hc; q++) bd[q] = sqrt(C[q]) * w + H_U32 * C[q];
}

/* ---- Sinkhorn alone and SPEC 8.6.27 ---------------------------------------------------- */

static void sums(double *rmax, double *cmax, double *emin, const float *C, int hc) {
  *rmax = 0, *cmax = 0, *emin = INFINITY;
  for (int i = 0; i < hc; i++) {
    double r = 0, c = 0;
    for (int j = 0; j < hc; j++) r += C[i * hc + j], c += C[j * hc + i], *emin = fmin(*emin, C[i * hc + j]);
    *rmax = fmax(*rmax, fabs(r - 1)), *cmax = fmax(*cmax, fabs(c - 1));
  }
}

/* op_mhc_sinkhorn against float64 on exact fp32 logits (dz = 0), in place too. */
static void check_sinkhorn_ref(int hc, int iters, float spread, uint64_t *seed) {
  char what[96];
  snprintf(what, sizeof what, "sinkhorn hc %d iters %d |logit| <= %g", hc, iters, spread);
  int q2 = hc * hc;
  float *z = fvec(q2, seed, -spread, spread), *C = h_alloc(q2), *Cin = h_alloc(q2);
  double *zd = dvec(q2), *ref = dvec(q2), *bd = dvec(q2);
  for (int q = 0; q < q2; q++) zd[q] = z[q];
  ref_sinkhorn(ref, zd, hc, iters, 1e-6);
  sinkhorn_bound(bd, ref, zd, 0, hc, iters);
  op_mhc_sinkhorn(C, z, hc, iters, 1e-6f);
  h_within(C, ref, bd, q2, what);
  memcpy(Cin, z, q2 * sizeof(float));
  op_mhc_sinkhorn(Cin, Cin, hc, iters, 1e-6f);
  EXPECT(memcmp(C, Cin, q2 * sizeof(float)) == 0, "%s: in place differs", what);
  h_free(C, q2, what), h_free(Cin, q2, what);
  free(z), free(zd), free(ref), free(bd);
}

/* Worst row-sum errors |sum_j C_ij - 1| after 20 iterations (hc = 4, eps = 1e-6), measured
 * with a float64 model of R.7: hill climbing from 64 random starts x 3000 steps inside the
 * box |logit| <= A, three independent searches agreeing to 3-4 digits (fp32 gives the same
 * digits: the error is convergence, not rounding):
 *   A = 1: 1.25e-6 (rounding level)   A = 2: 6.93e-3   A = 4: 4.80e-2   A >= 20: 8.504e-2
 * (A = 20 and A = 50 give the same value: the error saturates). Uniform random logits give
 * less: A = 2 max 6e-4 over 2e5 draws; A = 4 max 3.1e-2, and 16% of draws exceed 1e-3;
 * A = 20 median 2.4e-2. So SPEC 8.6.27's "1e-3 for |logit| <~ 4" holds only for |logit| <=
 * about 1.5 at 20 iterations; its "about 1e-2" for extreme logits is 8.5e-2 at worst.
 * Bounds: 1e-3 for A = 1 (SPEC's number), and the measured sup x 1.2-1.45 for the others,
 * rounded up (1e-2, 6e-2, 0.1): a search only approaches the sup from below, and the
 * margin covers the part of the box it did not reach. The adversarial matrices found are
 * pinned too: their error must stay within 10% of the measured value, which ties the
 * iteration count and order to R.7. */
static const float adversarial[3][16] = {
    {2, 2, 2, -2, 2, 2, 2, -2, -1.5f, -1.6f, -1.8f, 1.9f, 2, 2, 2, -2}, /* A = 2: 6.926e-3 */
    {-3.4f, 2, 4, -3.3f, 4, -4, -4, 4, 4, -4, -4, 4, 4, 4, -4, -2.4f},  /* A = 4: 4.796e-2 */
    {6.1f, -0.8f, -19.3f, -15.6f, 20, -16.7f, -3.4f, -19.5f, -7.8f, 12.4f, -11.1f, 14.2f, -3.6f, -19.3f, 16.1f,
     13.4f}, /* A = 20: 8.503e-2 */
};
static const double adversarial_err[3] = {6.926e-3, 4.796e-2, 8.503e-2};

static void check_sinkhorn_rows(uint64_t *seed) {
  const float A[4] = {1, 2, 4, 50};
  const double row_bound[4] = {1e-3, 1e-2, 6e-2, 0.1};
  /* column sums: the last step divides each column by its fp32 sum + eps: gamma(hc) + 2u,
   * and eps / S_j <= 2 eps for the pre-division column sums S_j >= 1/2 seen here */
  const double col_bound = h_gamma(4) + 2 * H_U32 + 2e-6;
  float z[16], C[16];
  for (int a = 0; a < 4; a++) {
    double worst_r = 0, worst_c = 0, emin = INFINITY;
    for (int trial = 0; trial < 20000; trial++) {
      h_fill(z, 16, seed, -A[a], A[a]);
      op_mhc_sinkhorn(C, z, 4, 20, 1e-6f);
      double r, c, e;
      sums(&r, &c, &e, C, 4);
      worst_r = fmax(worst_r, r), worst_c = fmax(worst_c, c), emin = fmin(emin, e);
    }
    printf("sinkhorn |logit| <= %g, 20000 random: worst row error %.3g, column %.3g, min entry %.3g\n", A[a], worst_r,
           worst_c, emin);
    EXPECT(emin >= 0, "8.6.27 |logit| <= %g: negative entry %g", A[a], emin);
    EXPECT(worst_r <= row_bound[a], "8.6.27 |logit| <= %g: row error %.3g > %.3g", A[a], worst_r, row_bound[a]);
    EXPECT(worst_c <= col_bound, "8.6.27 |logit| <= %g: column error %.3g > %.3g", A[a], worst_c, col_bound);
  }
  for (int a = 0; a < 3; a++) {
    double r, c, e;
    op_mhc_sinkhorn(C, adversarial[a], 4, 20, 1e-6f);
    sums(&r, &c, &e, C, 4);
    EXPECT(e >= 0 && c <= col_bound, "8.6.27 adversarial %d: min entry %g, column error %.3g", a, e, c);
    EXPECT(r <= row_bound[a + 1] && fabs(r - adversarial_err[a]) <= 0.1 * adversarial_err[a],
           "8.6.27 adversarial %d: row error %.4g, measured %.4g (bound %.3g)", a, r, adversarial_err[a],
           row_bound[a + 1]);
  }
}

/* ---- coefficients ---------------------------------------------------------------------- */

struct mhc_case {
  struct op_mhc_cfg c;
  int n, M, width;
  float *X, *W, *scale, *base;
};

/* X rows at different scales (so norm_eps matters in none and the rsqrt in all); W_fn rows
 * 2/sqrt(width) give mixes of order 1; scale multiplies them into the logit range. */
static void case_init(struct mhc_case *m, int n, int hc, int d, float scale_mag, uint64_t *seed) {
  m->c = (struct op_mhc_cfg){.hc = hc, .hidden = d, .sinkhorn_iters = 20, .hc_eps = 1e-6f, .norm_eps = 1e-6f};
  m->n = n, m->M = op_mhc_rows(hc), m->width = hc * d;
  m->X = fvec((size_t)n * m->width, seed, -1, 1);
  for (int t = 0; t < n; t++)
    for (int k = 0; k < m->width; k++) m->X[(size_t)t * m->width + k] *= (float)ldexp(1.0, (t % 4) * 3 - 4);
  float a = 2.0f / sqrtf((float)m->width);
  m->W = fvec((size_t)m->M * m->width, seed, -a, a);
  m->scale = fvec(3, seed, 0.5f * scale_mag, scale_mag);
  m->base = fvec(m->M, seed, -1, 1);
}

static void case_free(struct mhc_case *m) { free(m->X), free(m->W), free(m->scale), free(m->base); }

/* Float64 coefficients and bounds for position t. dots: fp32 dot products of `width` terms,
 * gamma(width) sum|W x|; sumsq likewise relative gamma(width) (both hold for any summation
 * order: a term passes through at most width - 1 additions; sumsq's fixed tile-and-lane
 * order, mhc.h, has a far smaller one). r = 1/sqrt(ss/width + eps):
 * relative 0.5 (gamma(width) + 2u) (the /width and + eps roundings, halved by the sqrt) +
 * 2u (sqrtf, 1/). mixes * scale + base: three more roundings. Then
 * pre: |d sigmoid| <= s(1-s) |dz| + 5u s (op_sigmoid, test_ops_basic) + u (+ hc_eps);
 * post: twice that; C: sinkhorn_bound with dz = the largest logit error of the position. */
static void ref_coeffs(double *pre, double *bpre, double *post, double *bpost, double *C, double *bC,
                       const struct mhc_case *m, int t) {
  int hc = m->c.hc, W = m->width;
  const float *x = m->X + (size_t)t * W;
  double ss = 0, *z = dvec(m->M), *ez = dvec(m->M);
  for (int k = 0; k < W; k++) ss += (double)x[k] * x[k];
  double r = 1 / sqrt(ss / W + m->c.norm_eps), er = 0.5 * (h_gamma(W) + 2 * H_U32) + 2 * H_U32;
  for (int q = 0; q < m->M; q++) {
    double dot = 0, ad = 0;
    for (int k = 0; k < W; k++) {
      double p = (double)m->W[(size_t)q * W + k] * x[k];
      dot += p, ad += fabs(p);
    }
    double s = m->scale[q < hc ? 0 : (q < 2 * hc ? 1 : 2)], mix = dot * r;
    z[q] = mix * s + m->base[q];
    ez[q] = fabs(s) * (r * h_gamma(W) * ad + fabs(mix) * (er + H_U32)) + H_U32 * (fabs(mix * s) + fabs(z[q]));
  }
  double dz = 0;
  for (int i = 0; i < hc; i++) {
    double sp = ref_sigmoid(z[i]), sq = ref_sigmoid(z[hc + i]);
    pre[i] = sp + m->c.hc_eps, bpre[i] = sp * (1 - sp) * ez[i] + 5 * H_U32 * sp + H_U32 * pre[i];
    post[i] = 2 * sq, bpost[i] = 2 * (sq * (1 - sq) * ez[hc + i] + 5 * H_U32 * sq);
  }
  for (int q = 2 * hc; q < m->M; q++) dz = fmax(dz, ez[q]);
  ref_sinkhorn(C, z + 2 * hc, hc, m->c.sinkhorn_iters, m->c.hc_eps);
  sinkhorn_bound(bC, C, z + 2 * hc, dz, hc, m->c.sinkhorn_iters);
  free(z), free(ez);
}

/* op_mhc_coeffs against ref_coeffs, plus SPEC 8.6.27's ranges pre in (0, 1 + eps] and
 * post in (0, 2) (closed [0, 2] where fp32 sigmoid saturates, at the wide scales). */
static void check_coeffs(int n, int hc, int d, float scale_mag, uint64_t *seed) {
  char what[96];
  snprintf(what, sizeof what, "coeffs n %d hc %d d %d scale %g", n, hc, d, scale_mag);
  struct mhc_case m;
  case_init(&m, n, hc, d, scale_mag, seed);
  size_t nh = (size_t)n * hc, nc = nh * hc;
  float *pre = h_alloc(nh), *post = h_alloc(nh), *C = h_alloc(nc), *dots = h_alloc((size_t)n * m.M), *ss = h_alloc(n);
  double *rp = dvec(nh), *bp = dvec(nh), *rq = dvec(nh), *bq = dvec(nh), *rc = dvec(nc), *bc = dvec(nc);
  op_mhc_coeffs(pre, post, C, dots, ss, m.X, m.W, m.scale, m.base, n, &m.c);
  for (int t = 0; t < n; t++)
    ref_coeffs(rp + t * hc, bp + t * hc, rq + t * hc, bq + t * hc, rc + (size_t)t * hc * hc, bc + (size_t)t * hc * hc,
               &m, t);
  h_within(pre, rp, bp, nh, what);
  h_within(post, rq, bq, nh, what);
  h_within(C, rc, bc, nc, what);
  int out = 0; /* post is open (0, 2) where the reference is 2^-20 clear of the ends */
  for (size_t q = 0; q < nh; q++) {
    bool inner = rq[q] > 0x1p-20 && rq[q] < 2 - 0x1p-20;
    out += !(pre[q] > 0 && pre[q] <= 1 + m.c.hc_eps) +
           !(inner ? post[q] > 0 && post[q] < 2 : post[q] >= 0 && post[q] <= 2);
  }
  for (size_t q = 0; q < nc; q++) out += !(C[q] >= 0);
  EXPECT(out == 0, "%s: %d coefficients outside pre (0, 1+eps], post (0, 2), C >= 0 (8.6.27)", what, out);
  h_free(pre, nh, what), h_free(post, nh, what), h_free(C, nc, what), h_free(dots, (size_t)n * m.M, what);
  h_free(ss, n, what);
  free(rp), free(bp), free(rq), free(bq), free(rc), free(bc);
  case_free(&m);
}

/* Saturated coefficients: logits far past fp32 sigmoid's range. pre stays in (0, 1 + eps]
 * (>= hc_eps); post reaches exactly 0 and 2, the closed interval, as mhc.h says. The same
 * for the head merge's pre, whose hc_eps is otherwise below the bound of a random test. */
static void check_coeff_extremes(void) {
  struct op_mhc_cfg c = {.hc = 2, .hidden = 1, .sinkhorn_iters = 20, .hc_eps = 1e-6f, .norm_eps = 1e-6f};
  float dots[8] = {0}, ss = 2, scale[3] = {1, 1, 1}, base[8] = {200, -200, 200, -200, 0, 0, 0, 0};
  float pre[2], post[2], C[4];
  op_mhc_coeffs_from_stats(pre, post, C, dots, &ss, scale, base, 1, &c);
  EXPECT(pre[0] == 1 + 1e-6f && pre[1] == 1e-6f, "extreme pre: %.9g %.9g, want 1 + eps and eps", pre[0], pre[1]);
  EXPECT(post[0] == 2 && post[1] == 0, "extreme post: %.9g %.9g, want the closed ends 2 and 0", post[0], post[1]);
  /* the head merge: W_fn = 0, so pre = sigmoid(base) + eps exactly; y = pre . X */
  float X[2] = {3, 5}, W[4] = {0, 0, 0, 0}, y[1], hp[2]; /* W_fn is (hc, hc * hidden) = 2 x 2 */
  op_mhc_merge(y, hp, X, W, 1, base, 1, &c);
  EXPECT(hp[0] == 1 + 1e-6f && hp[1] == 1e-6f, "extreme merge pre: %.9g %.9g, want 1 + eps and eps", hp[0], hp[1]);
  EXPECT(y[0] == (1 + 1e-6f) * 3 + 1e-6f * 5, "extreme merge y: %.9g", y[0]);
}

/* ---- mix, update, expand, merge -------------------------------------------------------- */

/* mix: u = sum_i pre_i X_i, an fp32 dot product of hc terms: gamma(hc) sum|pre_i X_i|.
 * update: X'_j = sum_i C_ij X_i + post_j F, hc + 1 terms: gamma(hc + 1) sum|terms|. */
static void check_mix_update(int n, int hc, int d, uint64_t *seed) {
  char what[96];
  snprintf(what, sizeof what, "mix/update n %d hc %d d %d", n, hc, d);
  size_t lx = (size_t)n * hc * d, lu = (size_t)n * d;
  float *X = fvec(lx, seed, -3, 3), *F = fvec(lu, seed, -2, 2), *pre = fvec((size_t)n * hc, seed, 0, 1.1f);
  float *post = fvec((size_t)n * hc, seed, 0, 2), *C = fvec((size_t)n * hc * hc, seed, 0, 1);
  float *u = h_alloc(lu), *Xn = h_alloc(lx);
  double *ru = dvec(lu), *bu = dvec(lu), *rx = dvec(lx), *bx = dvec(lx);
  for (int t = 0; t < n; t++)
    for (int k = 0; k < d; k++) {
      const float *x = X + (size_t)t * hc * d + k;
      double s = 0, a = 0;
      for (int i = 0; i < hc; i++)
        s += (double)pre[t * hc + i] * x[(size_t)i * d], a += fabs((double)pre[t * hc + i] * x[(size_t)i * d]);
      ru[(size_t)t * d + k] = s, bu[(size_t)t * d + k] = h_gamma(hc) * a;
      for (int j = 0; j < hc; j++) {
        double f = (double)post[t * hc + j] * F[(size_t)t * d + k], v = f, av = fabs(f);
        for (int i = 0; i < hc; i++) {
          double p = (double)C[((size_t)t * hc + i) * hc + j] * x[(size_t)i * d];
          v += p, av += fabs(p);
        }
        rx[((size_t)t * hc + j) * d + k] = v, bx[((size_t)t * hc + j) * d + k] = h_gamma(hc + 1) * av;
      }
    }
  op_mhc_mix(u, X, pre, n, hc, d);
  h_within(u, ru, bu, lu, what);
  op_mhc_update(Xn, X, C, post, F, n, hc, d);
  h_within(Xn, rx, bx, lx, what);
  /* in place: the same bits, written over X */
  float *Xi = h_alloc(lx);
  memcpy(Xi, X, lx * sizeof *Xi);
  op_mhc_update_inplace(Xi, C, post, F, n, hc, d);
  EXPECT(!memcmp(Xi, Xn, lx * sizeof *Xi), "%s: op_mhc_update_inplace is not bitwise op_mhc_update", what);
  h_free(Xi, lx, what);
  h_free(u, lu, what), h_free(Xn, lx, what);
  free(X), free(F), free(pre), free(post), free(C), free(ru), free(bu), free(rx), free(bx);
}

static void check_expand(uint64_t *seed) {
  int n = 3, hc = 4, d = 37;
  float *h = fvec((size_t)n * d, seed, -5, 5), *X = h_alloc((size_t)n * hc * d);
  op_mhc_expand(X, h, n, hc, d);
  int bad = 0;
  for (int t = 0; t < n; t++)
    for (int i = 0; i < hc; i++) bad += memcmp(X + ((size_t)t * hc + i) * d, h + (size_t)t * d, d * sizeof(float)) != 0;
  EXPECT(bad == 0, "expand: %d streams differ from h", bad);
  h_free(X, (size_t)n * hc * d, "expand");
  free(h);
}

/* Head merge: pre as in ref_coeffs (hc rows of W_fn, one scale), y = sum pre_i X_i:
 * |dy| <= sum |dpre_i| |X_i| + gamma(hc) sum |pre_i X_i|. */
static void check_merge(int n, int hc, int d, uint64_t *seed) {
  char what[96];
  snprintf(what, sizeof what, "merge n %d hc %d d %d", n, hc, d);
  struct mhc_case m;
  case_init(&m, n, hc, d, 1.5f, seed); /* only W's first hc rows, scale[0] and base[0:hc] are used */
  size_t lu = (size_t)n * d, nh = (size_t)n * hc;
  float *y = h_alloc(lu), *pre = h_alloc(nh);
  double *ry = dvec(lu), *by = dvec(lu), *rp = dvec(nh), *bp = dvec(nh);
  double *tq = dvec(hc), *tb = dvec(hc), *tc = dvec((size_t)hc * hc), *tcb = dvec((size_t)hc * hc);
  for (int t = 0; t < n; t++) {
    ref_coeffs(rp + t * hc, bp + t * hc, tq, tb, tc, tcb, &m, t); /* rows 0..hc-1 give the merge pre */
    const float *x = m.X + (size_t)t * m.width;
    for (int k = 0; k < d; k++) {
      double s = 0, a = 0, e = 0;
      for (int i = 0; i < hc; i++) {
        double xi = x[(size_t)i * d + k];
        s += rp[t * hc + i] * xi, a += fabs(rp[t * hc + i] * xi), e += bp[t * hc + i] * fabs(xi);
      }
      ry[(size_t)t * d + k] = s, by[(size_t)t * d + k] = e + h_gamma(hc) * (a + e);
    }
  }
  op_mhc_merge(y, pre, m.X, m.W, m.scale[0], m.base, n, &m.c);
  h_within(pre, rp, bp, nh, what);
  h_within(y, ry, by, lu, what);
  h_free(y, lu, what), h_free(pre, nh, what);
  free(ry), free(by), free(rp), free(bp), free(tq), free(tb), free(tc), free(tcb);
  case_free(&m);
}

/* ---- single pass -------------------------------------------------------------------------- */

/* The fused pass against op_mhc_update, op_mhc_mix and op_mhc_stats on X': X', u_next and
 * sumsq must match bit for bit (the same per-element expressions in the same order, one
 * shared sum-of-squares order); dots are two fp32 summations of the same `width` terms in
 * different orders (mhc.h's tiles and lanes against sgemm's blocking), so each is within
 * gamma(width) sum|terms| of the exact value (any order: a term passes through at most
 * width - 1 additions, and the additions of the empty lanes' exact zeros do not round) and
 * the two within twice that. */
/* One fp32 statistic in the fixed order mhc.h documents (the order a twin kernel must
 * follow to be bit-equal): per tile, OP_MHC_LANES lane sums over stream 0's columns then
 * stream 1's ..., the lanes added in lane order, the tile partials added tile after tile. */
static float ordered_dot(const float *w, const float *x, int hc, int d) {
  float total = 0.0f;
  for (int k0 = 0; k0 < d; k0 += OP_MHC_TILE) {
    float lane[OP_MHC_LANES] = {0};
    for (int j = 0; j < hc; j++)
      for (int k = k0; k < d && k < k0 + OP_MHC_TILE; k++)
        lane[(k - k0) % OP_MHC_LANES] += w[(size_t)j * d + k] * x[(size_t)j * d + k];
    float part = lane[0];
    for (int l = 1; l < OP_MHC_LANES; l++) part += lane[l];
    total += part;
  }
  return total;
}

/* The fused statistics bit for bit against ordered_dot on X' (the op's own X', checked
 * equal to op_mhc_update's before). */
static void check_fused_order(const float *dots, const float *sumsq, const float *Xn, const float *W, int n, int m,
                              int hc, int d, const char *what) {
  size_t width = (size_t)hc * d;
  int bad = 0;
  for (int t = 0; t < n; t++) {
    const float *x = Xn + t * width;
    bad += ordered_dot(x, x, hc, d) != sumsq[t];
    for (int q = 0; q < m; q++) bad += ordered_dot(W + q * width, x, hc, d) != dots[(size_t)t * m + q];
  }
  EXPECT(bad == 0, "%s: %d statistics differ from mhc.h's fixed order", what, bad);
}

static void check_fused(int n, int hc, int d, int m, uint64_t *seed) {
  char what[96];
  snprintf(what, sizeof what, "fused n %d hc %d d %d m %d", n, hc, d, m);
  int width = hc * d;
  size_t lx = (size_t)n * width, lu = (size_t)n * d, nm = (size_t)n * m;
  float *X = fvec(lx, seed, -2, 2), *F = fvec(lu, seed, -3, 3), *post = fvec((size_t)n * hc, seed, 0, 2);
  float *pre = fvec((size_t)n * hc, seed, 0, 1), *z = fvec((size_t)n * hc * hc, seed, -3, 3);
  float *C = malloc((size_t)n * hc * hc * sizeof(float));
  for (int t = 0; t < n; t++) op_mhc_sinkhorn(C + (size_t)t * hc * hc, z + (size_t)t * hc * hc, hc, 20, 1e-6f);
  float a = 2.0f / sqrtf((float)width), *W = fvec((size_t)m * width, seed, -a, a);
  float *Xf = h_alloc(lx), *uf = h_alloc(lu), *df = h_alloc(nm), *sf = h_alloc(n);
  float *Xu = h_alloc(lx), *uu = h_alloc(lu), *du = h_alloc(nm), *su = h_alloc(n);
  op_mhc_update_mix_fused(Xf, uf, df, sf, X, C, post, F, pre, W, n, m, hc, d);
  op_mhc_update(Xu, X, C, post, F, n, hc, d);
  op_mhc_mix(uu, Xu, pre, n, hc, d);
  op_mhc_stats(du, su, Xu, W, n, m, hc, d);
  EXPECT(memcmp(Xf, Xu, lx * sizeof(float)) == 0, "%s: X' differs from op_mhc_update", what);
  EXPECT(memcmp(uf, uu, lu * sizeof(float)) == 0, "%s: u_next differs from op_mhc_mix", what);
  EXPECT(memcmp(sf, su, (size_t)n * sizeof(float)) == 0, "%s: sumsq differs from op_mhc_stats (one shared order)",
         what);
  double *rd = dvec(nm), *bd = dvec(nm), *rs = dvec(n), *bs = dvec(n);
  for (int t = 0; t < n; t++) {
    const float *x = Xu + (size_t)t * width;
    double s = 0;
    for (int k = 0; k < width; k++) s += (double)x[k] * x[k];
    rs[t] = su[t], bs[t] = 2 * h_gamma(width) * s;
    for (int q = 0; q < m; q++) {
      double ad = 0;
      for (int k = 0; k < width; k++) ad += fabs((double)W[(size_t)q * width + k] * x[k]);
      rd[(size_t)t * m + q] = du[(size_t)t * m + q], bd[(size_t)t * m + q] = 2 * h_gamma(width) * ad;
    }
  }
  h_within(df, rd, bd, nm, what);
  h_within(sf, rs, bs, n, what);
  check_fused_order(df, sf, Xu, W, n, m, hc, d, what);
  h_free(Xf, lx, what), h_free(uf, lu, what), h_free(df, nm, what), h_free(sf, n, what);
  h_free(Xu, lx, what), h_free(uu, lu, what), h_free(du, nm, what), h_free(su, n, what);
  free(X), free(F), free(post), free(pre), free(z), free(C), free(W), free(rd), free(bd), free(rs), free(bs);
}

/* ---- row independence and the batched Sinkhorn ---------------------------------------- */

/* op_mhc_coeffs_from_stats runs Sinkhorn on several positions at once (one per vector lane,
 * mhc.c). Each position's pre, post and C must equal what it gets alone (n = 1), whatever
 * the batch and its padding lanes hold, and C must equal op_mhc_sinkhorn (checked against
 * float64 above) bit for bit on the same fp32 logits, which this test forms with the op's
 * own expression: mixes * r * scale + base, r = 1 / sqrtf(sumsq / width + norm_eps). */
static void check_coeffs_lanes(int n, int hc, float spread, uint64_t *seed) {
  char what[96];
  snprintf(what, sizeof what, "coeffs lanes n %d hc %d spread %g", n, hc, spread);
  struct op_mhc_cfg c = {.hc = hc, .hidden = 3, .sinkhorn_iters = 20, .hc_eps = 1e-6f, .norm_eps = 1e-6f};
  int M = op_mhc_rows(hc), q2 = hc * hc;
  float *dots = fvec((size_t)n * M, seed, -spread, spread), *ss = fvec(n, seed, 0.5f, 40), scale[3] = {1.5f, 0.7f, 1.2f};
  float *base = fvec(M, seed, -1, 1), *pre = h_alloc((size_t)n * hc), *post = h_alloc((size_t)n * hc);
  float *C = h_alloc((size_t)n * q2), one[3][128], z[128], want[128]; /* hc <= 11 */
  op_mhc_coeffs_from_stats(pre, post, C, dots, ss, scale, base, n, &c);
  int bad_alone = 0, bad_sinkhorn = 0;
  for (int t = 0; t < n; t++) {
    op_mhc_coeffs_from_stats(one[0], one[1], one[2], dots + (size_t)t * M, ss + t, scale, base, 1, &c);
    bad_alone += memcmp(one[0], pre + (size_t)t * hc, hc * sizeof(float)) != 0 ||
                 memcmp(one[1], post + (size_t)t * hc, hc * sizeof(float)) != 0 ||
                 memcmp(one[2], C + (size_t)t * q2, q2 * sizeof(float)) != 0;
    float r = 1.0f / sqrtf(ss[t] / ((float)hc * (float)c.hidden) + c.norm_eps);
    for (int q = 0; q < q2; q++) z[q] = dots[(size_t)t * M + 2 * hc + q] * r * scale[2] + base[2 * hc + q];
    op_mhc_sinkhorn(want, z, hc, c.sinkhorn_iters, c.hc_eps);
    bad_sinkhorn += memcmp(want, C + (size_t)t * q2, q2 * sizeof(float)) != 0;
  }
  EXPECT(bad_alone == 0, "%s: %d positions differ from the same position alone (n = 1)", what, bad_alone);
  EXPECT(bad_sinkhorn == 0, "%s: %d positions' C differ from op_mhc_sinkhorn", what, bad_sinkhorn);
  h_free(pre, (size_t)n * hc, what), h_free(post, (size_t)n * hc, what), h_free(C, (size_t)n * q2, what);
  free(dots), free(ss), free(base);
}

/* The fused pass of positions [t0, t0 + k) alone against the same rows of a pass over all
 * n positions, bit for bit: every output of a position depends on that position only. */
static void check_fused_rows(int n, int hc, int d, int m, uint64_t *seed) {
  char what[96];
  snprintf(what, sizeof what, "fused rows n %d hc %d d %d m %d", n, hc, d, m);
  size_t width = (size_t)hc * d;
  float *X = fvec(n * width, seed, -2, 2), *F = fvec((size_t)n * d, seed, -3, 3), *post = fvec((size_t)n * hc, seed, 0, 2);
  float *pre = fvec((size_t)n * hc, seed, 0, 1), *C = fvec((size_t)n * hc * hc, seed, 0, 1);
  float *W = fvec((size_t)m * width, seed, -0.1f, 0.1f);
  float *Xa = h_alloc(n * width), *ua = h_alloc((size_t)n * d), *da = h_alloc((size_t)n * m), *sa = h_alloc(n);
  float *Xb = h_alloc(n * width), *ub = h_alloc((size_t)n * d), *db = h_alloc((size_t)n * m), *sb = h_alloc(n);
  op_mhc_update_mix_fused(Xa, ua, da, sa, X, C, post, F, pre, W, n, m, hc, d);
  int bad = 0;
  for (int t0 = 0, k = 1; t0 < n; t0 += k, k = k % 5 + 2) { /* runs of 1, 3, 5, 2, 4, ... positions */
    k = t0 + k > n ? n - t0 : k;
    op_mhc_update_mix_fused(Xb + t0 * width, ub + (size_t)t0 * d, db + (size_t)t0 * m, sb + t0, X + t0 * width,
                            C + (size_t)t0 * hc * hc, post + (size_t)t0 * hc, F + (size_t)t0 * d, pre + (size_t)t0 * hc,
                            W, k, m, hc, d);
  }
  bad += memcmp(Xa, Xb, n * width * sizeof(float)) != 0;
  bad += memcmp(ua, ub, (size_t)n * d * sizeof(float)) != 0;
  bad += memcmp(da, db, (size_t)n * m * sizeof(float)) != 0;
  bad += memcmp(sa, sb, (size_t)n * sizeof(float)) != 0;
  EXPECT(bad == 0, "%s: %d of X', u, dots, sumsq differ between one pass and runs of positions", what, bad);
  h_free(Xa, n * width, what), h_free(ua, (size_t)n * d, what), h_free(da, (size_t)n * m, what), h_free(sa, n, what);
  h_free(Xb, n * width, what), h_free(ub, (size_t)n * d, what), h_free(db, (size_t)n * m, what), h_free(sb, n, what);
  free(X), free(F), free(post), free(pre), free(C), free(W);
}

int main(void) {
  op_blas_init();
  uint64_t seed = 0x3C0FFEE5;

  check_sinkhorn_ref(4, 20, 2, &seed);
  check_sinkhorn_ref(4, 20, 30, &seed);
  check_sinkhorn_ref(3, 1, 4, &seed);
  check_sinkhorn_ref(5, 7, 8, &seed);
  check_sinkhorn_ref(1, 20, 1, &seed);
  check_sinkhorn_rows(&seed);

  check_coeffs(1, 4, 5120, 1.0f, &seed); /* the real width: 4 x 5120 */
  check_coeffs(7, 4, 37, 1.0f, &seed);
  check_coeffs(5, 3, 129, 3.0f, &seed);
  check_coeffs(4, 1, 16, 1.0f, &seed);
  check_coeffs(9, 5, 64, 8.0f, &seed); /* wide logits: Sinkhorn far from converged */
  check_coeffs(3, 9, 8, 1.0f, &seed);  /* hc * hc past the batched Sinkhorn's stack buffer */
  check_coeff_extremes();

  check_mix_update(5, 4, 37, &seed);
  check_mix_update(2, 4, 5120, &seed);
  check_mix_update(3, 1, 7, &seed);
  check_mix_update(4, 3, 129, &seed);
  check_mix_update(2, 9, 300, &seed); /* hc > 8: the in-place update's buffer on the heap */
  check_expand(&seed);
  check_merge(6, 4, 37, &seed);
  check_merge(2, 4, 5120, &seed);
  check_merge(3, 3, 11, &seed);

  check_fused(3, 4, 5120, op_mhc_rows(4), &seed); /* whole tiles */
  check_fused(4, 4, 1000, op_mhc_rows(4), &seed); /* a partial last tile */
  check_fused(5, 3, 7, 5, &seed);                 /* less than a tile, odd m */
  check_fused(2, 4, OP_MHC_TILE + 1, 1, &seed);
  check_fused(19, 4, 300, 7, &seed); /* more positions than a block; lanes of the last tile short */
  check_fused(17, 2, 2 * OP_MHC_TILE, 8, &seed);
  check_fused_rows(37, 4, 300, op_mhc_rows(4), &seed); /* past two blocks of positions */
  check_fused_rows(9, 3, 70, 7, &seed);
  check_coeffs_lanes(19, 4, 3, &seed); /* two whole batches of positions and a short one */
  check_coeffs_lanes(17, 4, 3, &seed); /* ... and a lone one */
  check_coeffs_lanes(5, 4, 30, &seed);
  check_coeffs_lanes(11, 3, 2, &seed);
  check_coeffs_lanes(3, 9, 2, &seed);
  return h_report("ops_mhc");
}

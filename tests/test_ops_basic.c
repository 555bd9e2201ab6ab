/* test_ops_basic.c: embedding, RMSNorm, linear and the scalar activations
 * (ops/basic.h) against float64 references written here.
 *
 * What it is: op_embed (rows copied bit for bit, the first bad token index
 * returned, bad rows untouched), op_rmsnorm (with and without gamma, in place,
 * several eps), op_linear (odd n/in/out, row strides with columns between
 * that must keep their bits, in = 0), op_sigmoid/op_silu/op_softplus (a sweep
 * over [-120, 120], random values, and extremes where a naive softplus
 * overflows). Sentinels surround every output (h_alloc).
 *
 * What it is not: a performance test, or a test of OpenBLAS itself beyond the
 * error bound any summation order satisfies.
 *
 * Run: ctest --test-dir build -R ops_basic --output-on-failure
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/basic.h"
#include "tests/harness.h"

/* ---- op_embed ------------------------------------------------------------ */

static void check_embed(int n, int d, int vocab, int first_bad, uint64_t *seed) {
  char what[96];
  snprintf(what, sizeof what, "embed n %d d %d vocab %d", n, d, vocab);
  float *table = malloc((size_t)vocab * d * sizeof(float));
  int32_t *tok = malloc((size_t)(n > 0 ? n : 1) * sizeof(int32_t));
  float *out = h_alloc((size_t)n * d), *out0 = malloc((size_t)(n > 0 ? n : 1) * d * sizeof(float));
  h_fill(table, (size_t)vocab * d, seed, -2, 2);
  h_fill(out, (size_t)n * d, seed, -9, 9); /* prior contents bad rows must keep */
  memcpy(out0, out, (size_t)n * d * sizeof(float));
  for (int i = 0; i < n; i++) tok[i] = (int32_t)(h_uniform(seed) * vocab);
  if (n > 0) tok[n - 1] = vocab - 1; /* the last valid row */
  if (first_bad >= 0) {
    tok[first_bad] = (first_bad & 1) ? vocab : -1; /* just past either end */
    if (first_bad + 2 < n) tok[first_bad + 2] = INT32_MIN;
  }
  int got = op_embed(out, table, tok, n, d, vocab);
  EXPECT(got == first_bad, "%s: returned %d, first bad token is at %d", what, got, first_bad);
  int wrong = 0;
  for (int i = 0; i < n; i++) {
    bool ok = tok[i] >= 0 && tok[i] < vocab;
    const float *want = ok ? table + (size_t)tok[i] * d : out0 + (size_t)i * d;
    if (memcmp(out + (size_t)i * d, want, (size_t)d * sizeof(float)) != 0) wrong++;
  }
  EXPECT(wrong == 0, "%s: %d rows differ from the table row (or, for bad tokens, from the old row)", what, wrong);
  h_free(out, (size_t)n * d, what);
  free(table), free(tok), free(out0);
}

/* ---- op_rmsnorm ---------------------------------------------------------- */

/* Tolerance: ss = sum x^2 is an fp32 dot product of d terms, relative error
 * <= gamma(d); the mean (/d) and +eps add one rounding each, so ss/d + eps
 * is within gamma(d + 2), and the sqrt halves that (we keep it whole: the
 * margin is at most 2x on this term). Then sqrtf, 1/, x*r and *gamma add one
 * rounding each: 4 ulps. Relative to |ref|: gamma(d + 2) + 4u. */
static void check_rmsnorm(int n, int d, float eps, bool with_gamma, uint64_t *seed) {
  char what[96];
  snprintf(what, sizeof what, "rmsnorm n %d d %d eps %g%s", n, d, eps, with_gamma ? " gamma" : "");
  size_t len = (size_t)n * d;
  float *x = malloc(len * sizeof(float)), *g = malloc((size_t)d * sizeof(float));
  float *out = h_alloc(len), *inplace = h_alloc(len);
  double *ref = malloc(len * sizeof(double));
  /* Rows of different scales, so eps matters in some and not in others. */
  h_fill(x, len, seed, -1, 1);
  for (int i = 0; i < n; i++)
    for (int j = 0; j < d; j++) x[(size_t)i * d + j] *= (float)ldexp(1.0, (i % 5) * 3 - 6);
  h_fill(g, d, seed, -2, 2);
  const float *gamma = with_gamma ? g : NULL;
  for (int i = 0; i < n; i++) {
    const float *xi = x + (size_t)i * d;
    double ss = 0;
    for (int j = 0; j < d; j++) ss += (double)xi[j] * xi[j];
    double r = 1.0 / sqrt(ss / d + eps);
    for (int j = 0; j < d; j++) ref[(size_t)i * d + j] = xi[j] * r * (gamma ? gamma[j] : 1.0);
  }
  op_rmsnorm(out, x, gamma, n, d, eps);
  h_close(out, ref, NULL, len, d + 2, 4, 0, what);
  /* out == x: same arithmetic in the same order, so the same bits. */
  memcpy(inplace, x, len * sizeof(float));
  op_rmsnorm(inplace, inplace, gamma, n, d, eps);
  EXPECT(memcmp(inplace, out, len * sizeof(float)) == 0, "%s: in place differs from out of place", what);
  /* Row independence: rows go several at a time (basic.c), but each keeps
   * its own order, so a row normalised alone gives the same bits. */
  float *one = malloc((size_t)(d ? d : 1) * sizeof(float));
  for (int i = 0; i < n; i++) {
    op_rmsnorm(one, x + (size_t)i * d, gamma, 1, d, eps);
    EXPECT(memcmp(one, out + (size_t)i * d, (size_t)d * sizeof(float)) == 0, "%s: row %d alone differs", what, i);
  }
  free(one);
  h_free(out, len, what), h_free(inplace, len, what);
  free(x), free(g), free(ref);
}

/* ---- op_linear ----------------------------------------------------------- */

/* y = x W^T. Tolerance: each y is an fp32 dot product of `in` terms; any
 * summation order (blocked, FMA or not) is within gamma(in) sum|x||w|. */
static void check_linear(int n, int in, int out, int padx, int pady, uint64_t *seed) {
  char what[96];
  snprintf(what, sizeof what, "linear n %d in %d out %d ldx +%d ldy +%d", n, in, out, padx, pady);
  int ldx = in + padx, ldy = out + pady;
  size_t lenx = (size_t)n * ldx, leny = (size_t)n * ldy;
  float *x = malloc((lenx ? lenx : 1) * sizeof(float)), *W = malloc(((size_t)out * in + 1) * sizeof(float));
  float *y = h_alloc(leny), *y0 = malloc((leny ? leny : 1) * sizeof(float));
  double *ref = malloc((leny ? leny : 1) * sizeof(double)), *abs = malloc((leny ? leny : 1) * sizeof(double));
  h_fill(x, lenx, seed, -1, 1);
  /* Columns of x past `in` are poison: reading them would show. */
  for (int i = 0; i < n; i++)
    for (int k = in; k < ldx; k++) x[(size_t)i * ldx + k] = 1e30f;
  h_fill(W, (size_t)out * in, seed, -0.5f, 0.5f);
  h_fill(y, leny, seed, -7, 7);
  memcpy(y0, y, leny * sizeof(float));
  for (int i = 0; i < n; i++)
    for (int o = 0; o < out; o++) {
      double s = 0, a = 0;
      for (int k = 0; k < in; k++) {
        double t = (double)x[(size_t)i * ldx + k] * W[(size_t)o * in + k];
        s += t, a += fabs(t);
      }
      ref[(size_t)i * ldy + o] = s, abs[(size_t)i * ldy + o] = a;
    }
  op_linear(y, x, W, n, in, out, ldx, ldy);
  /* Compare the (n, out) block; the columns between rows must keep their bits. */
  int moved = 0;
  for (int i = 0; i < n; i++) {
    size_t r = (size_t)i * ldy;
    h_close(y + r, ref + r, abs + r, out, in, 0, 0, what);
    if (memcmp(y + r + out, y0 + r + out, (size_t)pady * sizeof(float)) != 0) moved++;
  }
  EXPECT(moved == 0, "%s: %d rows wrote past column out", what, moved);
  h_free(y, leny, what);
  free(x), free(W), free(y0), free(ref), free(abs);
}

/* ---- activations --------------------------------------------------------- */

static double ref_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
static double ref_silu(double x) { return x / (1.0 + exp(-x)); }
static double ref_softplus(double x) { return x > 0 ? x + log1p(exp(-x)) : log1p(exp(x)); }

/* Tolerance, relative to |ref|: expf and log1pf within 1 ulp (<= 2u
 * relative) each, 1 + e and the division one rounding each; the exp error
 * enters with weight e/(1+e) <= 1: sigmoid and silu <= 2u + 2u = 4u,
 * softplus <= 2u (exp, weighted by e/((1+e) log1p e) <= 1) + 2u (log1pf) +
 * the 1e-10 relative of dropping log1p(e^-x) above 20 (< u). So 5 ulps.
 * Absolute floors: results below FLT_MIN are subnormal (no relative
 * precision), and where expf(-x) overflows (x < -88.73) sigmoid and silu
 * return 0 for true values <= e^-88.72 = FLT_MAX^-1 and 89 FLT_MAX^-1. */
static void check_activations(uint64_t *seed) {
  enum { N = 4096 };
  float *x = malloc(N * sizeof(float)), *y = h_alloc(N);
  double *ref = malloc(N * sizeof(double));
  int n = 0;
  for (double v = -120; v <= 120 && n < N; v += 0.0625) x[n++] = (float)v;
  const float extreme[] = {-FLT_MAX, -1e30f, -1e4f, -104, -88.8f, -88.7f, -20.5f, -1e-30f, FLT_MIN, 1e-6f,
                           20, 20.0001f, 20.5f, 88.7f, 88.8f, 89, 100, 1e4f, 1e30f, FLT_MAX};
  int ne = (int)(sizeof extreme / sizeof extreme[0]);
  for (int i = 0; i < ne; i++) x[n++] = extreme[i];
  h_fill(x + n, N - n, seed, -30, 30);
  const double floor_sig = FLT_MIN, floor_silu = 89.0 / FLT_MAX + FLT_MIN;

  for (int i = 0; i < N; i++) y[i] = op_sigmoid(x[i]), ref[i] = ref_sigmoid(x[i]);
  h_close(y, ref, NULL, N, 0, 5, floor_sig, "sigmoid");
  for (int i = 0; i < N; i++) y[i] = op_silu(x[i]), ref[i] = ref_silu(x[i]);
  h_close(y, ref, NULL, N, 0, 5, floor_silu, "silu");
  for (int i = 0; i < N; i++) y[i] = op_softplus(x[i]), ref[i] = ref_softplus(x[i]);
  h_close(y, ref, NULL, N, 0, 5, FLT_MIN, "softplus");
  /* The point of the threshold: log1pf(expf(89)) would be +Inf. */
  EXPECT(op_softplus(89.0f) == 89.0f && op_softplus(FLT_MAX) == FLT_MAX, "softplus overflows at large x");
  EXPECT(op_softplus(-FLT_MAX) == 0.0f && op_sigmoid(-FLT_MAX) == 0.0f && op_sigmoid(FLT_MAX) == 1.0f,
         "activations wrong at -+FLT_MAX");
  h_free(y, N, "activations");
  free(x), free(ref);
}

int main(void) {
  op_blas_init();
  uint64_t seed = 0xBA51C001;

  check_embed(9, 13, 37, -1, &seed);
  check_embed(9, 13, 37, 4, &seed);
  check_embed(6, 5, 11, 0, &seed);
  check_embed(17, 64, 1000, 3, &seed);
  check_embed(0, 8, 4, -1, &seed);

  const int rms_d[] = {1, 7, 64, 513, 5120};
  const float eps[] = {1e-6f, 0.5f, 1e-20f}; /* SPEC default; large; R.1's reported norm_eps */
  for (int a = 0; a < 5; a++)
    for (int e = 0; e < 3; e++) {
      check_rmsnorm(5, rms_d[a], eps[e], true, &seed);
      check_rmsnorm(3, rms_d[a], eps[e], false, &seed);
      check_rmsnorm(19, rms_d[a], eps[e], a % 2 == 0, &seed); /* two blocks of rows and a remainder */
    }

  check_linear(1, 1, 1, 0, 0, &seed);
  check_linear(7, 13, 5, 0, 0, &seed);
  check_linear(7, 13, 5, 3, 2, &seed);
  check_linear(33, 129, 17, 1, 5, &seed);
  check_linear(3, 1280, 97, 0, 31, &seed);
  check_linear(64, 512, 96, 64, 0, &seed);
  check_linear(5, 0, 9, 0, 3, &seed); /* in = 0: y = 0 */
  check_linear(0, 8, 4, 0, 0, &seed); /* n = 0: nothing to write */

  check_activations(&seed);
  return h_report("test_ops_basic");
}

/* test_ops_rope.c: RoPE and inverse RoPE (ops/rope.h) against float64.
 *
 * What it is: op_rope_init/op_rope_apply compared with a double-precision
 * reference written here (frequencies, YaRN correction, rotation), at several
 * (dim, rope_dim, heads, n) including odd ones, first- and last-slice RoPE,
 * padded row strides, and positions up to 2^20 - 1 (SPEC 3.1 precision note:
 * a float32 angle would be off by ~0.06 rad there; the test shows its
 * tolerance would reject that). Invariants: inverse(apply(x)) == x, channels
 * outside the rope slice untouched bit for bit, norm preservation, shift
 * invariance as SPEC 8.4.21 uses it (q.k depends on p - s only; R(-p)R(s)v
 * depends on s - p only), YaRN on/off and factor 1, init's rejections.
 *
 * What it is not: a test of which layers use which theta (plans decide).
 *
 * Tolerances. Each output is y = fl(fl(a*fl(c)) - fl(b*fl(s))) (or the +
 * twin): each of its two terms carries three fp32 roundings (cos/sin to
 * float, the product, the sum), so |y - (a c - b s)| <= gamma(3)(|a c| +
 * |b s|) for the exact cos/sin of the op's angle. The op's double angle
 * pos*freq differs from the reference's by a few double ulps of pos*freq
 * (pow, the YaRN blend and the product, in both codes: we allow 16 ulps),
 * plus <= 1 ulp in each double sin/cos; an angle error e moves an output by
 * at most e(|a| + |b|). That is the `abs_floor` term (ANGLE_ULPS).
 *
 * Run: ctest --test-dir build -R ops_rope --output-on-failure
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/basic.h"
#include "ops/rope.h"
#include "base/check.h"
#include "tests/harness.h"

#define PI 3.14159265358979323846
#define U64 (1.0 / 9007199254740992.0) /* unit roundoff of double, 2^-53 */
#define ANGLE_ULPS 16.0                /* see the header: op vs reference angle */
#define MAX_POS 1048575                /* 2^20 - 1 = max_position_embeddings - 1 */

struct cfg {
  int dim, rope_dim;
  bool last;
  double theta;
  bool yarn;
  double factor;
  int64_t olen;
  double beta_fast, beta_slow;
};

static const struct cfg CSA2 = {512, 64, true, 160000, true, 16, 65536, 32, 1};
static const struct cfg SWA0 = {512, 64, true, 10000, false, 1, 0, 0, 0};

static int init_cfg(struct op_rope *r, const struct cfg *c) {
  return op_rope_init(r, c->dim, c->rope_dim, c->last, c->theta, c->yarn, c->factor, c->olen, c->beta_fast,
                      c->beta_slow);
}

/* ---- float64 reference -------------------------------------------------- */

/* The YaRN range bound of DeepSeek's reference: the pair index whose
 * frequency turns `beta` times over the original length. */
static double ref_corr(const struct cfg *c, double beta) {
  return c->rope_dim * log((double)c->olen / (beta * 2.0 * PI)) / (2.0 * log(c->theta));
}

static void ref_freq(double *f, const struct cfg *c) {
  for (int i = 0; i < c->rope_dim / 2; i++) f[i] = 1.0 / pow(c->theta, (double)(2 * i) / c->rope_dim);
  if (!c->yarn) return;
  double lo = fmax(floor(ref_corr(c, c->beta_fast)), 0.0);
  double hi = fmin(ceil(ref_corr(c, c->beta_slow)), c->rope_dim - 1.0);
  if (lo == hi) hi += 0.001;
  for (int i = 0; i < c->rope_dim / 2; i++) {
    double ramp = fmin(fmax((i - lo) / (hi - lo), 0.0), 1.0); /* 0: keep, 1: interpolate */
    f[i] = f[i] * ramp / c->factor + f[i] * (1.0 - ramp);
  }
}

/* Rotate one head row x (dim) at angle sign*pos*f into y, and the error
 * scale |a c| + |b s| of each output into e (inputs outside the slice are
 * copied, with e = 0: they must come back exactly). */
static void ref_rope(double *y, double *e, const float *x, const double *f, const struct cfg *c, int64_t pos,
                     int sign) {
  int off = c->last ? c->dim - c->rope_dim : 0;
  for (int j = 0; j < c->dim; j++) y[j] = x[j], e[j] = 0;
  for (int i = 0; i < c->rope_dim / 2; i++) {
    double t = sign * (double)pos * f[i], cs = cos(t), sn = sin(t);
    double a = x[off + 2 * i], b = x[off + 2 * i + 1];
    y[off + 2 * i] = a * cs - b * sn;
    y[off + 2 * i + 1] = a * sn + b * cs;
    e[off + 2 * i] = fabs(a * cs) + fabs(b * sn);
    e[off + 2 * i + 1] = fabs(a * sn) + fabs(b * cs);
  }
}

/* The angle error allowance (radians) for angles up to tmax. */
static double angle_err(double tmax) { return ANGLE_ULPS * U64 * tmax + 4.0 * U64; }

static bool in_slice(const struct cfg *c, int j) {
  int off = c->last ? c->dim - c->rope_dim : 0;
  return j >= off && j < off + c->rope_dim;
}

/* ---- one configuration ---------------------------------------------------- */

struct bufs {
  int n, heads, ld;
  float *x, *x0;
  int64_t *pos;
  double *ref, *err;
};

static void fill_case(struct bufs *b, int n, int heads, int pad, const struct cfg *c, uint64_t *seed) {
  b->n = n, b->heads = heads, b->ld = heads * c->dim + pad;
  size_t len = (size_t)n * b->ld;
  b->x = h_alloc(len);
  b->x0 = malloc(len * sizeof(float));
  b->pos = malloc((size_t)n * sizeof(int64_t));
  b->ref = malloc(len * sizeof(double));
  b->err = malloc(len * sizeof(double));
  h_fill(b->x, len, seed, -1.0f, 1.0f);
  memcpy(b->x0, b->x, len * sizeof(float));
  for (int i = 0; i < n; i++) b->pos[i] = (int64_t)(h_uniform(seed) * MAX_POS);
  b->pos[0] = 0;
  if (n > 1) b->pos[n - 1] = MAX_POS;
}

static void free_case(struct bufs *b, const char *what) {
  h_free(b->x, (size_t)b->n * b->ld, what);
  free(b->x0), free(b->pos), free(b->ref), free(b->err);
}

/* Reference for the whole buffer: rows of heads, padding copied (exact). */
static void ref_case(struct bufs *b, const double *f, const struct cfg *c, int sign) {
  for (int i = 0; i < b->n; i++) {
    size_t row = (size_t)i * b->ld;
    for (int j = b->heads * c->dim; j < b->ld; j++) b->ref[row + j] = b->x0[row + j], b->err[row + j] = 0;
    for (int h = 0; h < b->heads; h++) {
      size_t o = row + (size_t)h * c->dim;
      ref_rope(b->ref + o, b->err + o, b->x0 + o, f, c, b->pos[i], sign);
    }
  }
}

/* Everything outside the rope slices (other channels, padding) keeps its bits. */
static void check_untouched(const struct bufs *b, const struct cfg *c, const char *what) {
  int bad = 0;
  for (int i = 0; i < b->n; i++)
    for (int j = 0; j < b->ld; j++) {
      size_t k = (size_t)i * b->ld + j;
      bool rot = j < b->heads * c->dim && in_slice(c, j % c->dim);
      if (!rot && memcmp(&b->x[k], &b->x0[k], sizeof(float)) != 0) bad++;
    }
  EXPECT(bad == 0, "%s: %d channels outside the rope slice changed", what, bad);
}

/* |‖y‖ - ‖x‖| per rotated head slice <= ‖y - Rx‖ <= sqrt(sum E_j^2), with
 * E_j = (gamma(3) + angle error)(|a| + |b|) of the pair of channel j. */
static void check_norms(const struct bufs *b, const struct cfg *c, double ang) {
  int off = c->last ? c->dim - c->rope_dim : 0, bad = 0;
  for (int i = 0; i < b->n; i++)
    for (int h = 0; h < b->heads; h++) {
      size_t o = (size_t)i * b->ld + (size_t)h * c->dim + off;
      double nx = 0, ny = 0, e2 = 0;
      for (int j = 0; j < c->rope_dim; j += 2) {
        double a = b->x0[o + j], bb = b->x0[o + j + 1], m = (h_gamma(3) + ang) * (fabs(a) + fabs(bb));
        nx += a * a + bb * bb;
        ny += (double)b->x[o + j] * b->x[o + j] + (double)b->x[o + j + 1] * b->x[o + j + 1];
        e2 += 2 * m * m;
      }
      if (fabs(sqrt(ny) - sqrt(nx)) > sqrt(e2) + 4 * U64 * sqrt(nx)) bad++;
    }
  EXPECT(bad == 0, "rope norm: %d head slices changed length beyond the rounding bound", bad);
}

static void check_config(const struct cfg *c, int n, int heads, int pad, uint64_t *seed) {
  char what[128];
  snprintf(what, sizeof what, "rope dim %d rope_dim %d %s theta %g%s n %d heads %d pad %d", c->dim, c->rope_dim,
           c->last ? "last" : "first", c->theta, c->yarn ? " yarn" : "", n, heads, pad);
  struct op_rope r;
  EXPECT(init_cfg(&r, c) == 0, "%s: init failed", what);
  double f[512];
  ref_freq(f, c);
  double fmaxv = 0;
  for (int i = 0; i < c->rope_dim / 2; i++) fmaxv = fmax(fmaxv, f[i]);
  double ang = angle_err(MAX_POS * fmaxv);

  struct bufs b;
  fill_case(&b, n, heads, pad, c, seed);
  size_t len = (size_t)n * b.ld;
  ref_case(&b, f, c, +1);
  op_rope_apply(b.x, &r, b.pos, n, heads, b.ld, +1);
  /* Inputs lie in [-1, 1], so |a| + |b| <= 2 bounds the angle term. */
  h_close(b.x, b.ref, b.err, len, 3, 0, 2 * ang, what);
  check_untouched(&b, c, what);
  check_norms(&b, c, ang);
  /* Row 0 sits at position 0: cos 1, sin 0 give the input back exactly. */
  EXPECT(memcmp(b.x, b.x0, (size_t)heads * c->dim * sizeof(float)) == 0, "%s: position 0 is not the identity",
         what);

  /* Inverse: R(-t) applied to R(t)x + e1 gives x + R(-t)e1 + e2; with
   * |e1_k| <= gamma(3) m (m = |a| + |b| of the pair) and |y0| + |y1| <= sqrt2
   * |(a, b)|, both are <= sqrt2 gamma(3) m (1 + gamma(3)); 2 sqrt2 (1 +
   * gamma(3)) < 3, so 3 m is the error scale, plus two angle errors. */
  op_rope_apply(b.x, &r, b.pos, n, heads, b.ld, -1);
  int off = c->last ? c->dim - c->rope_dim : 0;
  for (size_t k = 0; k < len; k++) {
    b.ref[k] = b.x0[k], b.err[k] = 0;
    int j = (int)(k % b.ld);
    if (j < heads * c->dim && in_slice(c, j % c->dim)) {
      size_t p = k - (size_t)((j % c->dim - off) & 1); /* first channel of the pair */
      b.err[k] = 3 * (fabs(b.x0[p]) + fabs(b.x0[p + 1]));
    }
  }
  char inv[160];
  snprintf(inv, sizeof inv, "%s inverse", what);
  h_close(b.x, b.ref, b.err, len, 3, 0, 2 * 2 * ang, inv);
  check_untouched(&b, c, inv);
  free_case(&b, what);
}

/* ---- SPEC 3.1 precision note -------------------------------------------- */

/* The same rotation with a float32 angle (float freq, float pos*freq,
 * sinf/cosf), as a naive kernel would do it. The tolerance above must reject
 * it near position 1e6, or the test could not tell the two apart. */
static void check_float_angle_rejected(uint64_t *seed) {
  const struct cfg *c = &CSA2;
  double f[512];
  ref_freq(f, c);
  float x[64], y[64];
  h_fill(x, 64, seed, -1.0f, 1.0f);
  double worst = 0;
  for (int64_t pos = MAX_POS - 1000; pos <= MAX_POS; pos += 97) {
    for (int i = 0; i < 32; i++) {
      float t = (float)pos * (float)f[i];
      y[2 * i] = x[2 * i] * cosf(t) - x[2 * i + 1] * sinf(t);
      y[2 * i + 1] = x[2 * i] * sinf(t) + x[2 * i + 1] * cosf(t);
      double td = (double)pos * f[i], a = x[2 * i], b = x[2 * i + 1];
      double r0 = a * cos(td) - b * sin(td), r1 = a * sin(td) + b * cos(td);
      double e0 = fabs(a * cos(td)) + fabs(b * sin(td)), e1 = fabs(a * sin(td)) + fabs(b * cos(td));
      double tol0 = h_gamma(3) * e0 + 2 * angle_err(MAX_POS), tol1 = h_gamma(3) * e1 + 2 * angle_err(MAX_POS);
      worst = fmax(worst, fmax(fabs(y[2 * i] - r0) / tol0, fabs(y[2 * i + 1] - r1) / tol1));
    }
  }
  EXPECT(worst > 100, "a float32 angle stays within %.3g x the tolerance: the test cannot see SPEC 3.1's error", worst);
}

/* ---- SPEC 8.4.21: shift invariance ---------------------------------------- */

/* Per-component error of one op rotation, relative to the exact rotation at
 * the op's own frequency: gamma(3) m + angle error m (m = |a| + |b|). */
static void comp_err(double *e, const float *x, int rd, double ang) {
  for (int j = 0; j < rd; j += 2) e[j] = e[j + 1] = (h_gamma(3) + ang) * (fabs(x[j]) + fabs(x[j + 1]));
}

/* Rope-slice dot product q.k of rotated rows and its error bound:
 * sum(Eq |k| + Ek |q| + Eq Ek) plus the double sum (rd * 2^-53 sum|q k|). */
static double dot_bound(double *bound, const float *q, const float *k, const double *eq, const double *ek, int rd) {
  double d = 0, s = 0, bnd = 0;
  for (int j = 0; j < rd; j++) {
    d += (double)q[j] * k[j];
    s += fabs((double)q[j] * k[j]);
    bnd += eq[j] * fabs(k[j]) + ek[j] * fabs(q[j]) + eq[j] * ek[j];
  }
  *bound = bnd + rd * U64 * s;
  return d;
}

static void check_shift_invariance(uint64_t *seed) {
  const struct cfg *c = &CSA2;
  struct op_rope r;
  init_cfg(&r, c);
  const int rd = c->rope_dim, dim = c->dim;
  double ang = angle_err(2.0 * MAX_POS); /* positions below 2^21; freq[0] = 1 is the largest */
  const int64_t ps[][3] = {{1000, 37, 999000}, {65537, 131071, 700001}, {5, 5, 1048000}, {300000, 1, 12345}};
  float q[512], k[512], q1[512], k1[512], q2[512], k2[512], v1[512], v2[512];
  double eq[64], ek[64], ev[512], ref[512];
  for (size_t t = 0; t < sizeof ps / sizeof ps[0]; t++) {
    int64_t p = ps[t][0], s = ps[t][1], dl = ps[t][2];
    h_fill(q, dim, seed, -1, 1), h_fill(k, dim, seed, -1, 1);
    memcpy(q1, q, sizeof q), memcpy(k1, k, sizeof k), memcpy(q2, q, sizeof q), memcpy(k2, k, sizeof k);
    int64_t P1 = p, S1 = s, P2 = p + dl, S2 = s + dl;
    op_rope_apply(q1, &r, &P1, 1, 1, dim, +1), op_rope_apply(k1, &r, &S1, 1, 1, dim, +1);
    op_rope_apply(q2, &r, &P2, 1, 1, dim, +1), op_rope_apply(k2, &r, &S2, 1, 1, dim, +1);
    const int off = dim - rd;
    double b1, b2;
    comp_err(eq, q + off, rd, ang), comp_err(ek, k + off, rd, ang);
    double d1 = dot_bound(&b1, q1 + off, k1 + off, eq, ek, rd);
    double d2 = dot_bound(&b2, q2 + off, k2 + off, eq, ek, rd);
    EXPECT(fabs(d1 - d2) <= b1 + b2, "shift invariance q.k: p %lld s %lld shift %lld: %.9g vs %.9g (bound %.3g)",
           (long long)p, (long long)s, (long long)dl, d1, d2, b1 + b2);

    /* The value path: R(-p) R(s) v depends on s - p only. Each is two
     * rotations (the inverse bound: 3 gamma(3) m + 2 angle errors per
     * component), so the two shifts differ by at most twice that. */
    memcpy(v1, k, sizeof k), memcpy(v2, k, sizeof k);
    op_rope_apply(v1, &r, &S1, 1, 1, dim, +1), op_rope_apply(v1, &r, &P1, 1, 1, dim, -1);
    op_rope_apply(v2, &r, &S2, 1, 1, dim, +1), op_rope_apply(v2, &r, &P2, 1, 1, dim, -1);
    for (int j = 0; j < dim; j++) {
      ref[j] = v1[j];
      ev[j] = j < off ? 0 : 2 * 3 * (fabs(k[off + ((j - off) & ~1)]) + fabs(k[off + ((j - off) | 1)]));
    }
    h_close(v2, ref, ev, dim, 3, 0, 2 * 2 * 2 * ang, "shift invariance R(-p)R(s)v");
  }
}

/* ---- YaRN structure and init's rejections -------------------------------- */

static void check_yarn(uint64_t *seed) {
  struct op_rope off, on, one;
  struct cfg c1 = CSA2;
  c1.factor = 1;
  struct cfg c0 = CSA2;
  c0.yarn = false;
  EXPECT(init_cfg(&on, &CSA2) == 0 && init_cfg(&off, &c0) == 0 && init_cfg(&one, &c1) == 0, "yarn: init failed");
  /* Worked example at SPEC's defaults: c(32) = 64 ln(65536/(64 pi)) / (2 ln
   * 160000) = 15.45 -> low 15; c(1) = 24.71 -> high 25. Pairs <= 15 keep
   * their frequency exactly, pairs >= 25 are divided by 16, between blend. */
  for (int i = 0; i < 32; i++) {
    double f0 = off.freq[i], f1 = on.freq[i];
    if (i <= 15) EXPECT(f1 == f0, "yarn: pair %d changed (%.17g vs %.17g)", i, f1, f0);
    else if (i >= 25) EXPECT(fabs(f1 - f0 / 16) <= 4 * U64 * f0 / 16, "yarn: pair %d is not freq/16", i);
    else EXPECT(f1 < f0 && f1 > f0 / 16, "yarn: pair %d (%.17g) not strictly between freq/16 and freq", i, f1);
    /* Factor 1: freq (1 - s) + freq s, two products and a sum: <= 3 ulps. */
    EXPECT(fabs(one.freq[i] - f0) <= 4 * U64 * f0, "yarn factor 1: pair %d differs from no YaRN", i);
  }
  /* And the rotations differ where the frequencies do. */
  float a[512], b[512];
  h_fill(a, 512, seed, -1, 1);
  memcpy(b, a, sizeof a);
  int64_t pos = 100000;
  op_rope_apply(a, &on, &pos, 1, 1, 512, +1), op_rope_apply(b, &off, &pos, 1, 1, 512, +1);
  double diff = 0;
  for (int j = 0; j < 512; j++) diff = fmax(diff, fabs(a[j] - b[j]));
  EXPECT(diff > 0.1, "yarn on vs off: rotations agree to %.3g at position %lld", diff, (long long)pos);
}

static void check_init_rejects(void) {
  struct op_rope r, r0;
  memset(&r, 0xAB, sizeof r);
  memcpy(&r0, &r, sizeof r);
  EXPECT(op_rope_init(&r, 512, 63, true, 10000, false, 1, 0, 0, 0) == -1, "init accepts odd rope_dim");
  EXPECT(op_rope_init(&r, 512, -2, true, 10000, false, 1, 0, 0, 0) == -1, "init accepts negative rope_dim");
  EXPECT(op_rope_init(&r, 32, 64, true, 10000, false, 1, 0, 0, 0) == -1, "init accepts rope_dim > dim");
  EXPECT(op_rope_init(&r, 4096, 1026, true, 10000, false, 1, 0, 0, 0) == -1, "init accepts rope_dim > 1024");
  EXPECT(op_rope_init(&r, 512, 64, true, 0, false, 1, 0, 0, 0) == -1, "init accepts theta 0");
  EXPECT(op_rope_init(&r, 512, 64, true, 1, true, 16, 65536, 32, 1) == -1, "init accepts yarn with theta 1");
  EXPECT(op_rope_init(&r, 512, 64, true, 160000, true, 0, 65536, 32, 1) == -1, "init accepts yarn factor 0");
  EXPECT(op_rope_init(&r, 512, 64, true, 160000, true, 16, 0, 32, 1) == -1, "init accepts original_len 0");
  EXPECT(memcmp(&r, &r0, sizeof r) == 0, "a rejected init wrote to the struct");
  EXPECT(op_rope_init(&r, 2048, 1024, true, 10000, false, 1, 0, 0, 0) == 0, "init rejects rope_dim 1024");
  /* rope_dim 0 is valid and rotates nothing. */
  EXPECT(op_rope_init(&r, 8, 0, true, 10000, false, 1, 0, 0, 0) == 0, "init rejects rope_dim 0");
  float x[16], x0[16];
  uint64_t seed = 7;
  h_fill(x, 16, &seed, -1, 1);
  memcpy(x0, x, sizeof x);
  int64_t pos[2] = {3, 1000};
  op_rope_apply(x, &r, pos, 2, 1, 8, +1);
  EXPECT(memcmp(x, x0, sizeof x) == 0, "rope_dim 0 changed the rows");
}

/* op_rope_apply_two is bitwise two op_rope_apply calls, whether the two
 * RoPEs share their angles (the compressor's kM at 512 and kI at 128, both
 * rope_dim 64 [A]) or not (another rope_dim, another theta). */
static void check_apply_two(uint64_t *seed) {
  struct op_rope m, i_same, i_dim, i_theta;
  CEDAR_ASSERT(op_rope_init(&m, 512, 64, true, 160000, true, 16, 65536, 32, 1) == 0);
  CEDAR_ASSERT(op_rope_init(&i_same, 128, 64, true, 160000, true, 16, 65536, 32, 1) == 0);
  CEDAR_ASSERT(op_rope_init(&i_dim, 128, 32, false, 160000, true, 16, 65536, 32, 1) == 0);
  CEDAR_ASSERT(op_rope_init(&i_theta, 128, 64, true, 10000, false, 1, 0, 0, 0) == 0);
  EXPECT(op_rope_same_angles(&m, &i_same), "rope_dim 64 at widths 512 and 128: the same angles");
  EXPECT(!op_rope_same_angles(&m, &i_dim) && !op_rope_same_angles(&m, &i_theta),
         "another rope_dim or theta: other angles");
  const struct op_rope *ys[3] = {&i_same, &i_dim, &i_theta};
  const int64_t positions[3] = {0, 77, 1000003};
  float x[512], y[128], xa[512], ya[128];
  for (int k = 0; k < 3; k++)
    for (int p = 0; p < 3; p++) {
      h_fill(x, 512, seed, -2, 2);
      h_fill(y, 128, seed, -2, 2);
      memcpy(xa, x, sizeof x), memcpy(ya, y, sizeof y);
      op_rope_apply(xa, &m, &positions[p], 1, 1, 512, +1);
      op_rope_apply(ya, ys[k], &positions[p], 1, 1, 128, +1);
      op_rope_apply_two(x, &m, y, ys[k], positions[p]);
      EXPECT(!memcmp(x, xa, sizeof x) && !memcmp(y, ya, sizeof y),
             "op_rope_apply_two (case %d, pos %lld) is not two op_rope_apply calls", k, (long long)positions[p]);
    }
}

/* op_rope_rotate from an angle table is bitwise op_rope_apply at the
 * table's positions, both signs, any row offset, several heads, a row
 * stride past the heads, and under another geometry with the same angles
 * (a table built for 512-wide rows rotating 128-wide ones). */
static void check_angles(uint64_t *seed) {
  struct op_rope m, i_same;
  CEDAR_ASSERT(op_rope_init(&m, 512, 64, true, 160000, true, 16, 65536, 32, 1) == 0);
  CEDAR_ASSERT(op_rope_init(&i_same, 128, 64, false, 160000, true, 16, 65536, 32, 1) == 0);
  enum { N = 11, HEADS = 3, PAD = 5 };
  const int64_t pos[N] = {0, 1, 2, 77, 78, 4095, 65536, 65537, 1000003, 1048575, 5};
  float *buf = malloc(op_rope_angles_floats(&m, N) * sizeof *buf);
  EXPECT(op_rope_angles_floats(&m, N) == 2 * N * 32, "a table of %d rows at rope_dim 64 holds %d floats", N, 2 * N * 32);
  struct op_rope_angles a;
  op_rope_angles_init(&a, buf, &m, pos, N);
  const struct op_rope *rs[2] = {&m, &i_same};
  for (int k = 0; k < 2; k++)
    for (int sign = -1; sign <= 1; sign += 2)
      for (int row0 = 0; row0 <= 4; row0 += 4) {
        const int dim = rs[k]->dim, ld = HEADS * dim + PAD, n = N - row0;
        const size_t len = (size_t)n * ld;
        float *x = malloc(len * sizeof *x), *y = malloc(len * sizeof *y);
        h_fill(x, len, seed, -2, 2);
        memcpy(y, x, len * sizeof *x);
        op_rope_apply(x, rs[k], pos + row0, n, HEADS, ld, sign);
        op_rope_rotate(y, rs[k], &a, row0, n, HEADS, ld, sign);
        EXPECT(!memcmp(x, y, len * sizeof *x), "op_rope_rotate (width %d, sign %d, rows from %d) is not op_rope_apply",
               dim, sign, row0);
        free(x), free(y);
      }
  free(buf);
}

int main(void) {
  op_blas_init();
  uint64_t seed = 0x5EED0001;
  /* SPEC defaults: CSA2 main heads (YaRN), SWA-only layers, indexer heads. */
  check_config(&CSA2, 7, 5, 3, &seed);
  check_config(&SWA0, 5, 3, 0, &seed);
  struct cfg idx = CSA2;
  idx.dim = 128;
  check_config(&idx, 33, 7, 0, &seed);
  idx.last = false; /* indexer rope position is a plan parameter */
  check_config(&idx, 9, 3, 5, &seed);
  /* Odd widths, and a YaRN range whose high end (ceil 8.04 = 9) passes the
   * last pair index 7: the reference clamps at rope_dim - 1 = 15. */
  check_config(&(struct cfg){37, 10, true, 10000, false, 1, 0, 0, 0}, 11, 1, 0, &seed);
  check_config(&(struct cfg){37, 16, false, 10000, true, 4, 65536, 32, 1}, 3, 5, 1, &seed);
  /* Small ranges: theta 500, length 64: low 0, high 2 (ramp 0, 0.5, 1);
   * length 1: both bounds clamp to 0, the reference's +0.001 guard. */
  check_config(&(struct cfg){12, 6, true, 500, true, 2, 64, 4, 0.5}, 13, 9, 2, &seed);
  check_config(&(struct cfg){6, 6, true, 500, true, 3, 1, 32, 1}, 4, 2, 0, &seed);
  struct cfg f1 = CSA2;
  f1.factor = 1;
  check_config(&f1, 1, 1, 0, &seed);

  check_float_angle_rejected(&seed);
  check_shift_invariance(&seed);
  check_yarn(&seed);
  check_init_rejects();
  check_apply_two(&seed);
  check_angles(&seed);
  return h_report("test_ops_rope");
}

/* harness.c: see harness.h. Linked into every tests/test_ops_*.c. */
#include "tests/harness.h"

#include "ops/rope.h"
#include "scheduler/plan.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

int h_failures;

#define SENTINEL 0xA5
#define GUARD 64

double h_gamma(double k) { return k * H_U32 / (1.0 - k * H_U32); }

uint8_t *h_alloc_bytes(size_t n) {
  uint8_t *raw = malloc(n + 2 * GUARD);
  if (!raw) {
    fprintf(stderr, "harness: out of memory\n");
    exit(2);
  }
  memset(raw, SENTINEL, n + 2 * GUARD);
  return raw + GUARD;
}

static bool guard_ok(const uint8_t *buf, size_t n) {
  for (size_t i = 0; i < GUARD; i++)
    if (buf[-1 - (ptrdiff_t)i] != SENTINEL || buf[n + i] != SENTINEL) return false;
  return true;
}

void h_free_bytes(uint8_t *buf, size_t n, const char *what) {
  if (!buf) return;
  EXPECT(guard_ok(buf, n), "%s: write outside the output buffer (sentinel damaged)", what);
  free(buf - GUARD);
}

float *h_alloc(size_t n) { return (float *)h_alloc_bytes(n * sizeof(float)); }

bool h_sentinels_ok(const float *buf, size_t n) { return guard_ok((const uint8_t *)buf, n * sizeof(float)); }

void h_free(float *buf, size_t n, const char *what) { h_free_bytes((uint8_t *)buf, n * sizeof(float), what); }

double h_uniform(uint64_t *seed) {
  *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(*seed >> 11) * (1.0 / 9007199254740992.0);
}

void h_fill(float *x, size_t n, uint64_t *seed, float lo, float hi) {
  double floor_mag = 1e-3 * fmax(fabs(lo), fabs(hi));
  for (size_t i = 0; i < n; i++) {
    double v;
    do v = lo + (hi - lo) * h_uniform(seed);
    while (fabs(v) < floor_mag);
    x[i] = (float)v;
  }
}

bool h_finite(const float *x, size_t n, const char *what) {
  for (size_t i = 0; i < n; i++)
    if (!isfinite(x[i])) {
      EXPECT(false, "%s: element %zu is %g", what, i, x[i]);
      return false;
    }
  return true;
}

bool h_close(const float *got, const double *ref, const double *absref, size_t n, double k, double extra_ulps,
             double abs_floor, const char *what) {
  if (!h_finite(got, n, what)) return false;
  size_t worst = 0;
  double worst_ratio = 0;
  for (size_t i = 0; i < n; i++) {
    double a = absref ? absref[i] : fabs(ref[i]);
    double bound = h_gamma(k) * a + extra_ulps * H_U32 * fabs(ref[i]) + abs_floor;
    double err = fabs((double)got[i] - ref[i]);
    double ratio = bound > 0 ? err / bound : (err > 0 ? INFINITY : 0);
    if (ratio > worst_ratio) worst_ratio = ratio, worst = i;
  }
  EXPECT(worst_ratio <= 1.0, "%s: element %zu got %.9g, reference %.17g (error %.3g x the derived bound)", what,
         worst, got[worst], ref[worst], worst_ratio);
  return worst_ratio <= 1.0;
}

int h_report(const char *suite) {
  if (h_failures) {
    fprintf(stderr, "%s: %d failure(s)\n", suite, h_failures);
    return 1;
  }
  printf("%s: all checks passed\n", suite);
  return 0;
}

/* ---- memory-backed op_io (ops/op_io_mem.h) ------------------------------ */

void h_io_init(struct h_io *h) { op_io_mem_init(h); }

void h_io_input(struct h_io *h, const char *name, enum op_dtype dtype, int ndim, const int64_t *shape, void *data) {
  EXPECT(op_io_mem_input(h, name, dtype, ndim, shape, data) == 0, "test bug: input '%s' does not fit the call", name);
}

void h_io_param(struct h_io *h, const char *name, double value) {
  EXPECT(op_io_mem_param(h, name, value) == 0, "test bug: parameter '%s' does not fit the call", name);
}

int h_io_run(struct h_io *h, const char *name) {
  const struct op_desc *d = op_find(name);
  EXPECT(d, "op '%s' is not registered", name);
  return d ? d->run(d, &h->io) : -1;
}

const struct op_tensor *h_io_output(const struct h_io *h, const char *name) { return op_io_mem_output(h, name); }

void h_io_free(struct h_io *h) { op_io_mem_free(h); }

/* ---- float64 references with propagated error bounds ------------------- */

/* Each h_ref_* computes its op in double and, beside every value y, a bound
 * yb on |fp32 op - y| given inputs off by at most xb (NULL = exact inputs):
 * chained stages pass their bounds on. Derivations: linear, gamma(K) on
 * sum|w|(|x| + xb) plus the propagated sum|w| xb; RMSNorm, a perturbation
 * bound through the rms plus gamma(d)/2 + 6u for its own rounding; RoPE, the
 * rotation keeps the input bound and adds 3u (tests/test_ops_qkv.c and
 * tests/test_ops_compressor.c explain them in full). */
void h_ref_linear(double *y, double *yb, const float *W, const double *x, const double *xb, int n, int in,
                       int out) {
  for (int i = 0; i < n; i++)
    for (int j = 0; j < out; j++) {
      double s = 0, a = 0, e = 0;
      for (int k = 0; k < in; k++) {
        double w = W[(size_t)j * in + k], xv = x[(size_t)i * in + k], xe = xb ? xb[(size_t)i * in + k] : 0;
        s += w * xv, a += fabs(w) * fabs(xv), e += fabs(w) * xe;
      }
      y[(size_t)i * out + j] = s;
      yb[(size_t)i * out + j] = h_gamma(in) * (a + e) + e;
    }
}

/* In place allowed (y == x, yb == xb). */
void h_ref_rmsnorm(double *y, double *yb, const double *x, const double *xb, const float *gamma, int n, int d,
                        float eps) {
  for (int i = 0; i < n; i++) {
    const double *xi = x + (size_t)i * d, *ei = xb + (size_t)i * d;
    double ss = 0, dl = 0;
    for (int j = 0; j < d; j++) ss += xi[j] * xi[j], dl += ei[j] * ei[j];
    double rms = sqrt(ss / d + (double)eps), delta = sqrt(dl), lo = rms - delta / sqrt((double)d);
    EXPECT(lo > 0.5 * rms, "rmsnorm reference: input error %g too close to rms %g for a perturbation bound", delta,
           rms);
    double own = h_gamma(d) / 2 + 6 * H_U32;
    for (int j = 0; j < d; j++) {
      double g = gamma ? gamma[j] : 1.0, xv = xi[j], xe = ei[j];
      double v = xv * g / rms;
      double prop = fabs(g) * (xe / lo + fabs(xv) * delta / (sqrt((double)d) * rms * lo));
      y[(size_t)i * d + j] = v;
      yb[(size_t)i * d + j] = prop + own * (fabs(v) + prop);
    }
  }
}

/* x: (n, heads * r->dim), rotated in place with its bounds. */
void h_ref_rope(double *x, double *xb, const struct op_rope *r, const int64_t *pos, int n, int heads) {
  int off = r->last ? r->dim - r->rope_dim : 0;
  for (int i = 0; i < n; i++)
    for (int h = 0; h < heads; h++)
      for (int j = 0; j < r->rope_dim / 2; j++) {
        size_t ia = (size_t)i * heads * r->dim + (size_t)h * r->dim + off + 2 * j, ib = ia + 1;
        double t = (double)pos[i] * r->freq[j], c = cos(t), s = sin(t);
        double a = x[ia], b = x[ib], ea = xb[ia], eb = xb[ib];
        double A = fabs(a) + ea, B = fabs(b) + eb;
        x[ia] = a * c - b * s;
        x[ib] = a * s + b * c;
        xb[ia] = ea * fabs(c) + eb * fabs(s) + 3 * H_U32 * (A * fabs(c) + B * fabs(s));
        xb[ib] = ea * fabs(s) + eb * fabs(c) + 3 * H_U32 * (A * fabs(s) + B * fabs(c));
      }
}

bool h_within(const float *got, const double *ref, const double *bound, size_t n, const char *what) {
  if (!h_finite(got, n, what)) return false;
  size_t worst = 0;
  double wr = 0;
  for (size_t i = 0; i < n; i++) {
    double err = fabs((double)got[i] - ref[i]);
    double r = bound[i] > 0 ? err / bound[i] : (err > 0 ? INFINITY : 0);
    if (r > wr) wr = r, worst = i;
  }
  EXPECT(wr <= 1.0, "%s: element %zu got %.9g, reference %.17g (error %.3g x the derived bound %.3g)", what, worst,
         got[worst], ref[worst], wr, bound[worst]);
  if (getenv("CEDAR_TEST_VERBOSE")) printf("  %-56s worst error / bound = %.3g\n", what, wr);
  return wr <= 1.0;
}

bool h_load_plan(const char *path, struct plan *p) {
  struct plan_diags d = {0};
  int rc = plan_load(path, p, &d);
  if (rc) plan_diags_print(&d, stderr);
  plan_diags_free(&d);
  EXPECT(rc == 0, "plan %s does not load", path);
  return rc == 0;
}

static void *h_kept[H_KEEP_MAX];
static int h_n_kept;

void *h_keep(void *p) {
  if (!p || h_n_kept >= H_KEEP_MAX) {
    fprintf(stderr, "harness: %s\n", p ? "more than H_KEEP_MAX kept buffers" : "out of memory for a test buffer");
    abort();
  }
  return h_kept[h_n_kept++] = p;
}

void h_kept_free(void) {
  while (h_n_kept) free(h_kept[--h_n_kept]);
}

float *h_kept_floats(size_t n, uint64_t *seed, float lo, float hi) {
  float *x = h_keep(malloc((n ? n : 1) * sizeof *x));
  h_fill(x, n, seed, lo, hi);
  return x;
}

void *h_kept_zeros(size_t bytes) { return h_keep(calloc(bytes ? bytes : 1, 1)); }

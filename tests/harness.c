/* harness.c: see harness.h. Linked into every tests/test_ops_*.c. */
#include "tests/harness.h"

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

/* test_formats_act.c: the activation rounding of ops/formats_act.c
 * (docs/model.md s7, Appendix V #22): op_mxfp8_qdq and op_bf16_round_n.
 *
 * What it checks:
 *  - hand-computed MXFP8 blocks: amax 3 gives s = 2^ceil(log2(3/448)) = 2^-7,
 *    so 3 stays, 1.1 -> 140.8 s -> 144 s = 1.125, -0.01 -> -1.25 s; the
 *    amax floor (1e-6 everywhere: s = 2^ceil(log2(1e-4/448)) = 2^-22); a
 *    block whose amax is exactly 448 2^k (s = 2^k, nothing saturates);
 *  - random rows of many magnitudes, with a leading dimension wider than the
 *    row and a width that leaves a short last block, against a float64
 *    reference written from the formula: the scale from frexp, the nearest
 *    E4M3 value by scanning all 126 positive codes (ties to the even code);
 *    bytes past each row untouched;
 *  - a block holding NaN or Inf becomes NaN and leaves its neighbours alone;
 *  - op_bf16_round_n equals op_bf16_round elementwise.
 *
 * Run: ctest --test-dir build -R formats_act --output-on-failure
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/formats.h"
#include "tests/harness.h"

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static double unit(void) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(rng >> 11) * 0x1p-53;
}

/* Nearest E4M3 magnitude to a >= 0 by scanning every finite code; ties to the
 * even code; saturates at 448. */
static double e4m3_nearest(double a) {
  double best = 0.0, bd = INFINITY;
  int bc = 0;
  for (int c = 0; c <= 0x7E; c++) {
    int e = c >> 3, m = c & 7;
    double v = e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m / 8.0, -6);
    double dd = fabs(v - a);
    if (dd < bd || (dd == bd && (c & 1) == 0 && (bc & 1))) best = v, bd = dd, bc = c;
  }
  return best;
}

static void reference(double *out, const float *x, int w) {
  double amax = 0.0;
  for (int i = 0; i < w; i++) amax = fmax(amax, fabs(x[i]));
  double t = (double)(float)(fmax(amax, (double)1e-4f) / 448.0); /* the op divides in float */
  int e;
  double m = frexp(t, &e);
  double s = ldexp(1.0, m == 0.5 ? e - 1 : e);
  for (int i = 0; i < w; i++) out[i] = copysign(e4m3_nearest(fabs(x[i]) / s), x[i]) * s;
}

static void test_hand(void) {
  float x[32] = {3.0f, 1.1f, -0.01f};
  op_mxfp8_qdq(x, 1, 32, 32, 32);
  EXPECT(x[0] == 3.0f && x[1] == 1.125f && x[2] == -1.25f / 128, "amax 3: %g %g %g", x[0], x[1], x[2]);
  float y[32];
  for (int i = 0; i < 32; i++) y[i] = 1e-6f;
  op_mxfp8_qdq(y, 1, 32, 32, 32);
  float want = (float)(e4m3_nearest(1e-6 * 0x1p22) * 0x1p-22); /* the floor's scale 2^-22 */
  EXPECT(y[0] == want && y[31] == want, "floored block: %g, want %g", y[0], want);
  float z[32] = {448.0f * 4, 1.0f, 3.0f}; /* s = 4 exactly: 1 -> 0.25 (a subnormal-free E4M3), 3 -> 0.75 */
  op_mxfp8_qdq(z, 1, 32, 32, 32);
  EXPECT(z[0] == 1792.0f && z[1] == 1.0f && z[2] == 3.0f, "amax 448 x 4: %g %g %g", z[0], z[1], z[2]);
}

static void test_random(void) {
  enum { ROWS = 40, COLS = 200, LD = 208, B = 32 };
  float *x = malloc(sizeof(float) * ROWS * LD), *x0 = malloc(sizeof(float) * ROWS * LD);
  double ref[B];
  for (int r = 0; r < ROWS; r++) {
    double mag = ldexp(1.0, (int)(unit() * 40) - 20);
    for (int c = 0; c < LD; c++) x0[r * LD + c] = (float)((unit() * 2 - 1) * mag * (unit() < 0.1 ? 50 : 1));
  }
  memcpy(x, x0, sizeof(float) * ROWS * LD);
  op_mxfp8_qdq(x, ROWS, COLS, LD, B);
  int bad = 0;
  for (int r = 0; r < ROWS; r++) {
    for (int b = 0; b < COLS; b += B) {
      int w = COLS - b < B ? COLS - b : B;
      reference(ref, x0 + r * LD + b, w);
      for (int i = 0; i < w; i++) bad += x[r * LD + b + i] != (float)ref[i];
    }
    for (int c = COLS; c < LD; c++) bad += x[r * LD + c] != x0[r * LD + c];
  }
  EXPECT(bad == 0, "%d values differ from the float64 reference (or past the row)", bad);
  free(x), free(x0);
}

static void test_poison_and_bf16(void) {
  float x[64];
  for (int i = 0; i < 64; i++) x[i] = (float)i;
  x[40] = INFINITY;
  op_mxfp8_qdq(x, 1, 64, 64, 32);
  EXPECT(x[0] == 0.0f && x[31] == 32.0f /* 31 / 2^-3 = 248, a tie: 256 */ && isnan(x[32]) && isnan(x[63]), "poisoned block: %g %g %g", x[31],
         x[32], x[63]);
  x[5] = NAN;
  op_mxfp8_qdq(x, 1, 32, 32, 32);
  EXPECT(isnan(x[0]) && isnan(x[31]), "NaN block");
  float v[100], w[100];
  for (int i = 0; i < 100; i++) v[i] = w[i] = (float)((unit() * 2 - 1) * 1e3);
  op_bf16_round_n(v, 100);
  int bad = 0;
  for (int i = 0; i < 100; i++) bad += v[i] != op_bf16_round(w[i]);
  EXPECT(bad == 0, "op_bf16_round_n differs from op_bf16_round at %d values", bad);
}

int main(void) {
  test_hand();
  test_random();
  test_poison_and_bf16();
  return h_report("formats_act");
}

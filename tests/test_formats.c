/* test_formats.c: bit-exact tests of the KV-cache storage formats (ops/formats.h).
 *
 * What it is: exhaustive checks of the E2M1 and E4M3 codecs, rounding checked
 * against a float64 reference that scans the value tables (it never calls the
 * code under test), scale rules checked against their definitions, round-trip
 * error bounds derived from the element grids, byte sizes, the documented
 * byte layout, sentinel bytes around every output, and the NaN/Inf policy of
 * docs/formats.md; the fast packers byte for byte against per-element
 * reference packers, at every vector ISA level the CPU has (ops/isa.h).
 *
 * What it is not: a performance test, or a test of any cache built on these.
 *
 * Run: ctest --test-dir build -R formats --output-on-failure
 *      (or build/tests/test_formats; exit 0 = pass, 1 = a check failed)
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ops/formats.h"
#include "ops/isa.h"

static int g_checks, g_fails;

#define EXPECT(cond, ...)                                                      \
  do {                                                                         \
    g_checks++;                                                                \
    if (!(cond)) {                                                             \
      if (++g_fails <= 40) {                                                   \
        fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);        \
        fprintf(stderr, __VA_ARGS__);                                          \
        fputc('\n', stderr);                                                   \
      }                                                                        \
    }                                                                          \
  } while (0)

/* ---- independent float64 references ----------------------------------- */

static double ref_e2m1(int code) { /* the SPEC 4.1 table, written out */
  static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  return (code & 8) ? -mag[code & 7] : mag[code & 7];
}

static double ref_e4m3(int code) { /* OCP E4M3FN; NaN codes return NAN */
  int e = (code >> 3) & 15, m = code & 7;
  if (e == 15 && m == 7)
    return NAN;
  double v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, e - 7);
  return (code & 0x80) ? -v : v;
}

/* Nearest positive code (0..maxcode) to |v| by scanning the table; ties go to
 * the even code (mantissa LSB 0). Values beyond the max pick the max, which
 * is saturation. The sign bit is copied from v. */
static int ref_nearest(double v, double (*tab)(int), int maxcode, int signbit_) {
  double a = fabs(v);
  if (a >= tab(maxcode)) /* saturation, before distances to 1e30 all tie */
    return signbit(v) ? (maxcode | signbit_) : maxcode;
  int best = 0;
  double bestd = INFINITY;
  for (int c = 0; c <= maxcode; c++) {
    double d = fabs(a - tab(c));
    if (d < bestd || (d == bestd && (c & 1) == 0 && (best & 1) == 1)) {
      best = c;
      bestd = d;
    }
  }
  return signbit(v) ? (best | signbit_) : best;
}

/* Smallest positive E4M3 code whose value times mult is >= a; 0x7E if none. */
static int ref_e4m3_up(double a, double mult) {
  for (int c = 0; c <= 0x7E; c++)
    if (ref_e4m3(c) * mult >= a)
      return c;
  return 0x7E;
}

/* Smallest k in [-127, 127] with qmax * 2^k >= amax. */
static int ref_e8m0_ceil(double amax, double qmax) {
  for (int k = -127; k <= 127; k++)
    if (qmax * ldexp(1.0, k) >= amax)
      return k + 127;
  return 254;
}

/* floor(log2 amax) - 2, clamped, by scanning powers of two. */
static int ref_e8m0_ocp_e2m1(double amax) {
  int j = -200;
  while (ldexp(1.0, j + 1) <= amax)
    j++;
  int k = j - 2;
  return (k < -127 ? -127 : k > 127 ? 127 : k) + 127;
}

/* Half the grid spacing around a (in units of the scale). E2M1 points are
 * 0, .5, 1, 1.5, 2 (spacing .5), 2, 3, 4 (spacing 1) and 4, 6 (spacing 2); a
 * value in a stretch is at most half that stretch's spacing from a point.
 * Above 6 the only error is saturation, a - 6 (OCP rule only). */
static double e2m1_bound(double a) {
  if (a > 6)
    return a - 6;
  return a < 2 ? 0.25 : a < 4 ? 0.5 : 1.0;
}

/* E4M3 points in the binade [2^k, 2^(k+1)) are 2^(k-3) apart (8 per binade),
 * and the subnormals below 2^-6 are 2^-9 apart; half of that. */
static double e4m3_bound(double a) {
  if (a < ldexp(1.0, -6))
    return ldexp(1.0, -10);
  int e;
  frexp(a, &e); /* a = f 2^e, f in [0.5, 1): floor(log2 a) = e - 1 */
  return ldexp(1.0, e - 1 - 4);
}

/* ---- helpers ----------------------------------------------------------- */

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint64_t rng_next(void) { /* splitmix64 */
  uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static double rng_unit(void) { return (double)(rng_next() >> 11) * 0x1p-53; }

/* sign * [1, 2) * 2^[lo, hi), rounded to float: non-zero unless lo < -150. */
static float rng_float(double lo, double hi) {
  double v = (1.0 + rng_unit()) * exp2(lo + (hi - lo) * rng_unit());
  return (float)((rng_next() & 1) ? -v : v);
}

static uint32_t fbits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}

/* Sentinels: every output buffer lives between two GUARD-byte fences. */
#define GUARD 64
#define FENCE 0xA5

static uint8_t *fenced(size_t n, uint8_t fill) {
  uint8_t *p = malloc(n + 2 * GUARD);
  if (!p) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  memset(p, FENCE, GUARD);
  memset(p + GUARD, fill, n);
  memset(p + GUARD + n, FENCE, GUARD);
  return p + GUARD;
}

static int fence_ok(const uint8_t *p, size_t n) {
  for (size_t i = 1; i <= GUARD; i++)
    if (p[-(ptrdiff_t)i] != FENCE || p[n + i - 1] != FENCE)
      return 0;
  return 1;
}

static void fenced_free(uint8_t *p) { free(p - GUARD); }

/* ---- element tests ---------------------------------------------------- */

static void test_e2m1_exhaustive(void) {
  for (int c = 0; c < 16; c++) {
    float v = op_e2m1_decode((uint8_t)c);
    EXPECT((double)v == ref_e2m1(c) && !!signbit(v) == !!(c & 8),
           "e2m1 decode(0x%x) = %g, want %g", c, v, ref_e2m1(c));
    EXPECT(op_e2m1_encode(v) == c, "e2m1 encode(decode(0x%x)) = 0x%x", c,
           op_e2m1_encode(v));
    EXPECT(fbits(op_e2m1_decode(op_e2m1_encode(v))) == fbits(v),
           "e2m1 decode(encode(decode(0x%x))) != decode", c);
  }
  EXPECT(op_e2m1_decode(0x17) == 6.0f, "decode must use the low nibble only");
}

static void test_e4m3_exhaustive(void) {
  for (int c = 0; c < 256; c++) {
    float v = op_e4m3_decode((uint8_t)c);
    double r = ref_e4m3(c);
    if (isnan(r)) {
      EXPECT(isnan(v), "e4m3 decode(0x%02x) should be NaN, got %g", c, v);
      continue;
    }
    EXPECT((double)v == r && !!signbit(v) == !!(c & 0x80),
           "e4m3 decode(0x%02x) = %g, want %g", c, v, r);
    EXPECT(op_e4m3_encode(v) == c, "e4m3 encode(decode(0x%02x)) = 0x%02x", c,
           op_e4m3_encode(v));
    EXPECT(fbits(op_e4m3_decode(op_e4m3_encode(v))) == fbits(v),
           "e4m3 decode(encode(decode(0x%02x))) != decode", c);
  }
  EXPECT(op_e4m3_decode(0x7E) == 448.0f, "max E4M3 must be 448");
  EXPECT(op_e4m3_decode(0x01) == 0x1p-9f, "min subnormal must be 2^-9");
}

/* The decoders before they became tables (ldexpf arithmetic), kept as a
 * second reference: the tables must give the same bits for every code,
 * NaN payloads and signed zeros included. */
static float arith_e2m1(int code) {
  static const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
  float v = mag[code & 7];
  return (code & 8) ? -v : v;
}

static float arith_e4m3(int code) {
  unsigned e = (code >> 3) & 0xFu, m = code & 0x7u;
  if (e == 0xFu && m == 0x7u)
    return NAN;
  float v = e == 0 ? ldexpf((float)m, -9) : ldexpf((float)(8u + m), (int)e - 10);
  return (code & 0x80) ? -v : v;
}

static float arith_e8m0(int code) { return code == 0xFF ? NAN : ldexpf(1.0f, code - 127); }

static void test_decode_tables_vs_arithmetic(void) {
  for (int c = 0; c < 256; c++) {
    uint8_t u = (uint8_t)c;
    EXPECT(c > 15 || fbits(op_e2m1_decode(u)) == fbits(arith_e2m1(c)), "e2m1 0x%x", c);
    EXPECT(fbits(op_e4m3_decode(u)) == fbits(arith_e4m3(c)), "e4m3 0x%02x: %g", c, op_e4m3_decode(u));
    EXPECT(fbits(op_e8m0_decode(u)) == fbits(arith_e8m0(c)), "e8m0 0x%02x: %g", c, op_e8m0_decode(u));
  }
}

/* Checks encode(x) against the scan reference for x, its float neighbours
 * and -x. */
static void check_round(float x, int e4m3) {
  float xs[4] = {x, nextafterf(x, INFINITY), nextafterf(x, 0.0f), -x};
  for (int i = 0; i < 4; i++) {
    float v = xs[i];
    if (e4m3) {
      int want = ref_nearest(v, ref_e4m3, 0x7E, 0x80);
      EXPECT(op_e4m3_encode(v) == want, "e4m3 encode(%.9g) = 0x%02x, want 0x%02x",
             v, op_e4m3_encode(v), want);
    } else {
      int want = ref_nearest(v, ref_e2m1, 7, 8);
      EXPECT(op_e2m1_encode(v) == want, "e2m1 encode(%.9g) = 0x%x, want 0x%x",
             v, op_e2m1_encode(v), want);
    }
  }
}

static void test_rounding_vs_reference(void) {
  for (int c = 0; c < 7; c++) /* every E2M1 tie, its neighbours, -tie */
    check_round((float)((ref_e2m1(c) + ref_e2m1(c + 1)) / 2), 0);
  for (int c = 0; c < 0x7E; c++) /* every E4M3 tie */
    check_round((float)((ref_e4m3(c) + ref_e4m3(c + 1)) / 2), 1);
  /* beyond the max: ties to "the next value" must saturate, not overflow */
  float big[] = {6.5f, 7.0f, 100.0f, 449.0f, 464.0f, 480.0f, 1e30f, FLT_MAX};
  for (size_t i = 0; i < sizeof big / sizeof big[0]; i++) {
    check_round(big[i], 0);
    check_round(big[i], 1);
  }
  float tiny[] = {0x1p-149f, 0x1p-126f, 0x1p-11f, 0x1p-10f, 0x3p-11f, 0.25f};
  for (size_t i = 0; i < sizeof tiny / sizeof tiny[0]; i++) {
    check_round(tiny[i], 0);
    check_round(tiny[i], 1);
  }
  for (int i = 0; i < 20000; i++) {
    check_round(rng_float(-4, 3), 0);
    check_round(rng_float(-12, 9), 1);
  }
  for (uint32_t hi = 0; hi < 0x7F80u; hi++) { /* E2M1: a sweep of all binades */
    uint32_t u = hi << 16 | 0x8000u;
    float x;
    memcpy(&x, &u, 4);
    check_round(x, 0);
  }
  check_round(0.0f, 0); /* covers -0 through -x */
  check_round(0.0f, 1);
}

static void test_e4m3_roundup(void) {
  for (int c = 1; c <= 0x7E; c++) {
    float v = (float)ref_e4m3(c);
    float xs[3] = {v, nextafterf(v, INFINITY), nextafterf(v, 0.0f)};
    for (int i = 0; i < 3; i++) {
      int want = ref_e4m3_up(xs[i], 1.0);
      EXPECT(op_e4m3_roundup(xs[i]) == want, "roundup(%.9g) = 0x%02x, want 0x%02x",
             xs[i], op_e4m3_roundup(xs[i]), want);
    }
  }
  for (int i = 0; i < 20000; i++) {
    float x = fabsf(rng_float(-14, 9));
    EXPECT(op_e4m3_roundup(x) == ref_e4m3_up(x, 1.0), "roundup(%.9g)", x);
  }
  EXPECT(op_e4m3_roundup(0x1p-149f) == 0x01, "roundup(tiny) = 2^-9");
  EXPECT(op_e4m3_roundup(500.0f) == 0x7E, "roundup saturates at 448");
  EXPECT(op_e4m3_roundup(INFINITY) == 0x7E, "roundup(Inf) = 448");
  EXPECT(op_e4m3_roundup(0.0f) == 0x00 && op_e4m3_roundup(-3.0f) == 0x00,
         "roundup(x <= 0) = 0");
  EXPECT(op_e4m3_roundup(NAN) == 0x7F, "roundup(NaN) = NaN code");
}

static void test_e8m0(void) {
  EXPECT(op_e8m0_decode(0) == 0x1p-127f, "e8m0 0x00 = 2^-127");
  EXPECT(op_e8m0_decode(127) == 1.0f, "e8m0 0x7F = 1");
  EXPECT(op_e8m0_decode(254) == 0x1p127f, "e8m0 0xFE = 2^127");
  EXPECT(isnan(op_e8m0_decode(255)), "e8m0 0xFF = NaN");
  /* SPEC 4.3: the two rules differ at amax = 7: OCP gives 1, ceil gives 2. */
  EXPECT(op_e8m0_decode(op_e8m0_scale(7.0f, 6.0f, OP_MX_OCP)) == 1.0f, "ocp(7)");
  EXPECT(op_e8m0_decode(op_e8m0_scale(7.0f, 6.0f, OP_MX_CEIL)) == 2.0f, "ceil(7)");
  for (int i = 0; i < 20000; i++) {
    float a = fabsf(rng_float(-140, 127));
    EXPECT(op_e8m0_scale(a, 6.0f, OP_MX_CEIL) == ref_e8m0_ceil(a, 6.0),
           "ceil scale(%.9g)", a);
    EXPECT(op_e8m0_scale(a, 448.0f, OP_MX_CEIL) == ref_e8m0_ceil(a, 448.0),
           "ceil scale448(%.9g)", a);
    EXPECT(op_e8m0_scale(a, 6.0f, OP_MX_OCP) == ref_e8m0_ocp_e2m1(a),
           "ocp scale(%.9g)", a);
  }
  for (int k = -120; k <= 120; k++) { /* exact powers and 6 * 2^k boundaries */
    float a = ldexpf(6.0f, k);
    EXPECT(op_e8m0_scale(a, 6.0f, OP_MX_CEIL) == k + 127, "ceil(6*2^%d)", k);
    float up = nextafterf(a, INFINITY);
    EXPECT(op_e8m0_scale(up, 6.0f, OP_MX_CEIL) == k + 128, "ceil(6*2^%d+)", k);
  }
  EXPECT(op_e8m0_scale(0.0f, 6.0f, OP_MX_CEIL) == 0x00, "zero -> smallest");
  EXPECT(op_e8m0_scale(NAN, 6.0f, OP_MX_CEIL) == 0xFF, "NaN amax");
  EXPECT(op_e8m0_scale(INFINITY, 6.0f, OP_MX_OCP) == 0xFF, "Inf amax");
}

static void test_nan_inf_elements(void) {
  float nneg = copysignf(NAN, -1.0f);
  EXPECT(op_e2m1_encode(NAN) == 0x7 && op_e2m1_encode(nneg) == 0x7,
         "E2M1: NaN -> +6 whatever its sign");
  EXPECT(op_e2m1_encode(INFINITY) == 0x7 && op_e2m1_encode(-INFINITY) == 0xF,
         "E2M1: Inf saturates");
  EXPECT(op_e4m3_encode(NAN) == 0x7F && op_e4m3_encode(nneg) == 0x7F,
         "E4M3: NaN -> 0x7F whatever its sign");
  EXPECT(op_e4m3_encode(INFINITY) == 0x7E && op_e4m3_encode(-INFINITY) == 0xFE,
         "E4M3: Inf saturates to 448");
  EXPECT(op_e2m1_encode(-0.0f) == 0x8 && op_e4m3_encode(-0.0f) == 0x80, "-0");
  EXPECT(op_e2m1_encode(-0.1f) == 0x8 && op_e4m3_encode(-1e-5f) == 0x80,
         "negative values that round to zero keep their sign");
}

static void test_sizes(void) {
  EXPECT(op_fp4_bytes(512, 16) == 288, "main KV = %zu", op_fp4_bytes(512, 16));
  EXPECT(op_mxfp4_bytes(128, 32) == 68, "indexer K = %zu",
         op_mxfp4_bytes(128, 32));
  EXPECT(op_fp4_bytes(OP_MAIN_KV_W, OP_MAIN_KV_BLOCK) +
                 op_mxfp4_bytes(OP_INDEXER_K_W, OP_INDEXER_K_BLOCK) == 356,
         "one source entry = 356");
  EXPECT(OP_MAIN_KV_BYTES + OP_INDEXER_K_BYTES == 356, "macros");
  EXPECT(op_fp8_bytes(512, 32, OP_SCALE_E8M0) == 528, "SWA E8M0/32 = 528");
  EXPECT(op_fp8_bytes(512, 512, OP_SCALE_FP32) == 516, "SWA FP32/entry = 516");
  EXPECT(op_fp8_bytes(512, 128, OP_SCALE_FP32) == 528, "SWA FP32/128 = 528");
  EXPECT(op_fp4_bytes(48, 16) == 27, "odd block count");
  EXPECT(op_fp4_bytes(512, 15) == 0 && op_fp4_bytes(40, 16) == 0 &&
             op_fp4_bytes(0, 16) == 0 && op_fp4_bytes(16, 0) == 0,
         "invalid fp4 dims give 0");
  EXPECT(op_fp8_bytes(100, 32, OP_SCALE_E8M0) == 0 &&
             op_fp8_bytes(96, 32, (enum op_scale_kind)7) == 0,
         "invalid fp8 dims give 0");
}

/* ---- block formats: one table-driven harness --------------------------- */

enum fmt { F_MAIN, F_MX_CEIL, F_MX_OCP, F_FP8_F32, F_FP8_E8M0 };
static const char *const fmt_name[] = {"main-fp4", "mxfp4-ceil", "mxfp4-ocp",
                                       "swa-fp8-f32", "swa-fp8-e8m0"};

static int is_fp8(enum fmt f) { return f == F_FP8_F32 || f == F_FP8_E8M0; }
static enum op_scale_kind fp8_kind(enum fmt f) {
  return f == F_FP8_F32 ? OP_SCALE_FP32 : OP_SCALE_E8M0;
}
static enum op_mx_rule mx_rule(enum fmt f) {
  return f == F_MX_OCP ? OP_MX_OCP : OP_MX_CEIL;
}

static size_t fmt_bytes(enum fmt f, int W, int block) {
  if (f == F_MAIN)
    return op_fp4_bytes(W, block);
  return is_fp8(f) ? op_fp8_bytes(W, block, fp8_kind(f)) : op_mxfp4_bytes(W, block);
}

static void fmt_pack(enum fmt f, uint8_t *out, const float *x, int W, int block,
                     enum op_nibble_order o) {
  if (f == F_MAIN)
    op_fp4_pack(out, x, W, block, o);
  else if (is_fp8(f))
    op_fp8_pack(out, x, W, block, fp8_kind(f));
  else
    op_mxfp4_pack(out, x, W, block, mx_rule(f), o);
}

static void fmt_unpack(enum fmt f, float *y, const uint8_t *in, int W, int block,
                       enum op_nibble_order o) {
  if (f == F_MAIN)
    op_fp4_unpack(y, in, W, block, o);
  else if (is_fp8(f))
    op_fp8_unpack(y, in, W, block, fp8_kind(f));
  else
    op_mxfp4_unpack(y, in, W, block, o);
}

/* Block b's scale, read from the offset docs/formats.md gives, decoded by the
 * float64 reference. Payload first: W/2 bytes (E2M1) or W bytes (E4M3). */
static double fmt_scale(enum fmt f, const uint8_t *p, int W, int b) {
  if (f == F_MAIN)
    return ref_e4m3(p[W / 2 + b]);
  if (f == F_FP8_F32) {
    const uint8_t *q = p + W + 4 * b;
    uint32_t u = q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
    float s;
    memcpy(&s, &u, 4);
    return s;
  }
  int e = is_fp8(f) ? p[W + b] : p[W / 2 + b];
  return e == 255 ? NAN : ldexp(1.0, e - 127);
}

/* The scale each rule must choose, from its definition (SPEC 4.2-4.4). */
static double ref_scale(enum fmt f, double amax) {
  switch (f) {
  case F_MAIN: /* smallest E4M3 s with 6 s >= amax: E4M3_roundup(amax/6) */
    return amax == 0 ? 0 : ref_e4m3(ref_e4m3_up(amax, 6.0));
  case F_MX_CEIL:
    return ldexp(1.0, ref_e8m0_ceil(amax, 6.0) - 127);
  case F_MX_OCP:
    return ldexp(1.0, ref_e8m0_ocp_e2m1(amax) - 127);
  case F_FP8_E8M0:
    return ldexp(1.0, ref_e8m0_ceil(amax, 448.0) - 127);
  case F_FP8_F32:
    return amax == 0 ? 0 : fmax((float)amax / 448.0f, FLT_MIN);
  }
  return NAN;
}

/* Packs into two fenced buffers pre-filled differently (every documented
 * byte must be written, and nothing else), unpacks into a fenced float
 * buffer, and returns the bytes and the floats. */
static void roundtrip(enum fmt f, const float *x, int W, int block,
                      enum op_nibble_order o, uint8_t *bytes, float *y) {
  size_t n = fmt_bytes(f, W, block), ny = (size_t)W * sizeof(float);
  uint8_t *a = fenced(n, 0x00), *b = fenced(n, 0xFF), *yb = fenced(ny, 0xCC);
  fmt_pack(f, a, x, W, block, o);
  fmt_pack(f, b, x, W, block, o);
  EXPECT(fence_ok(a, n) && fence_ok(b, n), "%s W=%d block=%d: pack wrote "
         "outside its %zu bytes", fmt_name[f], W, block, n);
  EXPECT(memcmp(a, b, n) == 0, "%s W=%d block=%d: pack left bytes unwritten",
         fmt_name[f], W, block);
  fmt_unpack(f, (float *)(void *)yb, a, W, block, o);
  EXPECT(fence_ok(yb, ny), "%s W=%d block=%d: unpack wrote outside (W)",
         fmt_name[f], W, block);
  memcpy(bytes, a, n);
  memcpy(y, yb, ny);
  fenced_free(a);
  fenced_free(b);
  fenced_free(yb);
}

/* The decoded value the reference predicts: the nearest grid point to x/s
 * (ties to even, saturating) times s. x/s in double is within 2^-53 of the
 * exact quotient, too little to cross a tie point of these grids; the FP32
 * SWA scale is defined on float arithmetic, so its quotient and product are
 * rounded to float here as the format specifies. */
static float ref_value(enum fmt f, float x, double s) {
  if (!is_fp8(f))
    return (float)(ref_e2m1(ref_nearest(x / s, ref_e2m1, 7, 8)) * s);
  double v = f == F_FP8_F32 ? (double)(x / (float)s) : x / s;
  return (float)(ref_e4m3(ref_nearest(v, ref_e4m3, 0x7E, 0x80)) * s);
}

/* Per-element bound |x - y| <= half the element grid spacing at a = |x|/s,
 * times s (e2m1_bound / e4m3_bound give the spacing and say why). For E2M1
 * and E8M0-scaled E4M3, y = q s is exact and so is the RNE of fl(x/s) (see
 * docs/formats.md), so the bound has no slack. The FP32-scaled SWA entry
 * rounds twice more in float: fl(x/s) (relative 2^-24, adding <= 2^-24 |x|)
 * and fl(q s) (relative 2^-24 of |y|, and |y| <= |x| + bound); 2^-22 |x|
 * plus 2^-23 of the bound covers both. */
static void check_block_bounds(enum fmt f, const float *x, const float *y,
                               const uint8_t *p, int W, int block, int b) {
  const float *xb = x + b * block, *yb = y + b * block;
  double amax = 0, s = fmt_scale(f, p, W, b);
  for (int i = 0; i < block; i++)
    amax = fmax(amax, fabs(xb[i]));
  double s_want = ref_scale(f, amax);
  EXPECT(s == s_want, "%s W=%d block=%d b=%d amax=%.9g: scale %.9g, want %.9g",
         fmt_name[f], W, block, b, amax, s, s_want);
  double qmax = is_fp8(f) ? 448 : 6, slack = f == F_FP8_F32 ? 0x1p-23 : 0;
  for (int i = 0; i < block; i++) {
    double xi = xb[i], yi = yb[i], a = fabs(xi) / s;
    double bound = (is_fp8(f) ? e4m3_bound(a) : e2m1_bound(a)) * s;
    bound = bound * (1 + slack) + (slack > 0 ? 0x1p-22 * fabs(xi) : 0);
    EXPECT(fabs(xi - yi) <= bound, "%s W=%d block=%d [%d]: x=%.9g y=%.9g "
           "s=%.9g err %.3g > %.3g", fmt_name[f], W, block, b * block + i, xi,
           yi, s, fabs(xi - yi), bound);
    EXPECT(fabs(yi) <= qmax * s * (1 + slack), "%s [%d]: |y|=%.9g > qmax*s",
           fmt_name[f], b * block + i, yi);
    EXPECT(!!signbit(xb[i]) == !!signbit(yb[i]), "%s [%d]: sign lost (x=%g)",
           fmt_name[f], b * block + i, xi);
    if (s > 0) {
      float want = ref_value(f, xb[i], s);
      EXPECT(fbits(want) == fbits(yb[i]), "%s W=%d block=%d [%d]: x=%.9g "
             "y=%.9g, reference %.9g", fmt_name[f], W, block, b * block + i,
             xi, yi, want);
    }
  }
}

/* Random non-zero entry: each block gets its own magnitude, mostly within
 * [2^-16, 2^11) (below 6*448 = 2688, so the Main-KV scale never saturates),
 * sometimes tiny (2^-40) to reach the subnormal and clamped scales; values
 * spread over 8 binades under the block's top. */
static void random_entry(float *x /* (W) */, int W, int block) {
  for (int b = 0; b < W / block; b++) {
    double top = (rng_next() % 8 == 0) ? -40 + 10 * rng_unit() : -16 + 26 * rng_unit();
    for (int i = 0; i < block; i++)
      x[b * block + i] = rng_float(top - 8, top);
  }
}

static void test_random_roundtrips(void) {
  static const struct { enum fmt f; int W, block; } cases[] = {
      {F_MAIN, 512, 16},       {F_MAIN, 16, 16},       {F_MAIN, 48, 16},
      {F_MAIN, 80, 16},        {F_MAIN, 4096, 16},     {F_MAIN, 96, 32},
      {F_MAIN, 64, 8},         {F_MAIN, 6, 2},         {F_MX_CEIL, 128, 32},
      {F_MX_CEIL, 32, 32},     {F_MX_CEIL, 96, 32},    {F_MX_CEIL, 160, 32},
      {F_MX_CEIL, 48, 16},     {F_MX_OCP, 128, 32},    {F_MX_OCP, 96, 32},
      {F_FP8_E8M0, 512, 32},   {F_FP8_E8M0, 96, 32},   {F_FP8_E8M0, 40, 8},
      {F_FP8_F32, 512, 512},   {F_FP8_F32, 512, 128},  {F_FP8_F32, 96, 32},
      {F_FP8_F32, 21, 7},
  };
  float x[4096], y[4096];
  uint8_t p[8192];
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    int W = cases[c].W, block = cases[c].block;
    enum fmt f = cases[c].f;
    for (int t = 0; t < (W > 512 ? 20 : 200); t++) {
      random_entry(x, W, block);
      roundtrip(f, x, W, block, OP_NIBBLE_EVEN_LOW, p, y);
      for (int b = 0; b < W / block; b++)
        check_block_bounds(f, x, y, p, W, block, b);
    }
  }
}

/* Values q * s with one |q| at the element max are exactly representable
 * with scale s; they must round-trip bit for bit (-0 included) and the
 * scale byte must be s's code. */
static void exact_case(enum fmt f, int W, int block, int scode, double sval) {
  float x[64] = {0}, y[64];
  uint8_t p[128];
  int maxc = is_fp8(f) ? 0x7E : 0x7;
  for (int i = 0; i < W; i++) {
    int q = (int)(rng_next() % (unsigned)(maxc + 1)) | (rng_next() & 1 ? (is_fp8(f) ? 0x80 : 0x8) : 0);
    if (i % block == 0)
      q = maxc | (q & (is_fp8(f) ? 0x80 : 0x8));
    x[i] = (float)((is_fp8(f) ? ref_e4m3(q) : ref_e2m1(q)) * sval);
  }
  roundtrip(f, x, W, block, OP_NIBBLE_EVEN_LOW, p, y);
  int off = is_fp8(f) ? W : W / 2;
  for (int b = 0; b < W / block; b++)
    EXPECT(p[off + b] == scode, "%s exact: scale byte 0x%02x, want 0x%02x",
           fmt_name[f], p[off + b], scode);
  for (int i = 0; i < W; i++)
    EXPECT(fbits(x[i]) == fbits(y[i]), "%s exact scale 0x%02x [%d]: %.9g -> %.9g",
           fmt_name[f], scode, i, x[i], y[i]);
}

static void test_exact_representables(void) {
  for (int c = 1; c <= 0x7E; c++) /* every E4M3 scale, subnormal ones too */
    exact_case(F_MAIN, 48, 16, c, ref_e4m3(c));
  for (int k = -127; k <= 125; k++) /* 6 * 2^126 overflows float */
    exact_case(F_MX_CEIL, 64, 32, k + 127, ldexp(1.0, k));
  for (int k = -127; k <= 119; k++) /* 448 * 2^119 is near FLT_MAX */
    exact_case(F_FP8_E8M0, 64, 32, k + 127, ldexp(1.0, k));
}

/* Entries near the bottom of float: amax/6 underflows to 0 for amax = 2^-149
 * (the Main-KV scale must still be 0x01), amax/448 is a float subnormal
 * (the FP32 scale is raised to FLT_MIN), and the E8M0 exponent clamps at
 * -127. The bounds and scale definitions still hold exactly. */
static void test_tiny_entries(void) {
  static const enum fmt fs[] = {F_MAIN, F_MX_CEIL, F_MX_OCP, F_FP8_F32, F_FP8_E8M0};
  float x[64], y[64];
  uint8_t p[300];
  for (size_t k = 0; k < sizeof fs / sizeof fs[0]; k++) {
    for (int top = -149; top <= -110; top++) {
      for (int i = 0; i < 64; i++)
        x[i] = rng_float(top - 8, top);
      x[7] = (top & 1) ? -0x1p-149f : 0x1p-149f; /* block 0: one tiny value */
      for (int i = 0; i < 32; i++)
        if (i != 7 && top < -140)
          x[i] = 0.0f;
      roundtrip(fs[k], x, 64, 32, OP_NIBBLE_EVEN_LOW, p, y);
      check_block_bounds(fs[k], x, y, p, 64, 32, 0);
      check_block_bounds(fs[k], x, y, p, 64, 32, 1);
    }
  }
}

/* Block-level ties: elements at exactly (tie point) * s, and one float
 * either side, for every E4M3 scale (Main KV), many E8M0 scales and random
 * FP32 scales. This is what tells x / s from x * (1/s): the reciprocal is
 * inexact for most E4M3 scales and moves exact ties. Element 0 of each block
 * is qmax * s0 and sets the amax. */
static void tie_entry(enum fmt f, int block, double s0, int *cursor) {
  float x[64], y[64];
  uint8_t p[300];
  int fp8 = is_fp8(f), nties = fp8 ? 0x7E : 7;
  double (*tab)(int) = fp8 ? ref_e4m3 : ref_e2m1;
  double qmax = fp8 ? 448 : 6, amax = (float)(qmax * s0);
  double s = ref_scale(f, amax);
  for (int i = 0; i < 2 * block; i++) {
    if (i % block == 0) {
      x[i] = (float)((i & 1) ? -amax : amax);
      continue;
    }
    int c = (*cursor)++ % nties;
    float t = (float)((tab(c) + tab(c + 1)) / 2 * s);
    int side = (int)(rng_next() % 3);
    if (side)
      t = nextafterf(t, side == 1 ? INFINITY : 0.0f);
    x[i] = (rng_next() & 1) ? -t : t;
  }
  roundtrip(f, x, 2 * block, block, OP_NIBBLE_EVEN_LOW, p, y);
  check_block_bounds(f, x, y, p, 2 * block, block, 0);
  check_block_bounds(f, x, y, p, 2 * block, block, 1);
}

static void test_block_ties(void) {
  int cursor = 0;
  for (int rep = 0; rep < 6; rep++) {
    for (int c = 1; c <= 0x7E; c++)
      tie_entry(F_MAIN, 16, ref_e4m3(c), &cursor);
    for (int k = -120; k <= 120; k += 7) {
      tie_entry(F_MX_CEIL, 32, ldexp(1.0, k), &cursor);
      tie_entry(F_FP8_E8M0, 32, ldexp(1.0, k), &cursor);
    }
    for (int t = 0; t < 100; t++)
      tie_entry(F_FP8_F32, 32, fabs(rng_float(-20, 10)), &cursor);
  }
}

/* ---- documented layouts, special values -------------------------------- */

static void expect_bytes(const char *what, const uint8_t *got,
                         const uint8_t *want, int n) {
  for (int i = 0; i < n; i++)
    EXPECT(got[i] == want[i], "%s: byte %d = 0x%02x, want 0x%02x", what, i,
           got[i], want[i]);
}

/* Main KV, W = 32, block 16, hand-computed: block 0 = {6, -0.5, 0, -0, 0...}
 * has amax 6 -> scale 1.0 (0x38); block 1 = all 1.5 -> scale 0.25 (0x28),
 * codes 6 = 0x7. Payload bytes 0-15, scales at 16 and 17. */
static void test_main_layout_and_nibbles(void) {
  float x[32] = {6.0f, -0.5f, 0.0f, -0.0f}, y[32];
  for (int i = 16; i < 32; i++)
    x[i] = 1.5f;
  uint8_t lo[18], hi[18];
  uint8_t want[18] = {0x97, 0x80, 0, 0, 0, 0, 0, 0, 0x77, 0x77, 0x77, 0x77,
                      0x77, 0x77, 0x77, 0x77, 0x38, 0x28};
  roundtrip(F_MAIN, x, 32, 16, OP_NIBBLE_EVEN_LOW, lo, y);
  expect_bytes("main layout, even-low", lo, want, 18);
  EXPECT(y[0] == 6.0f && y[1] == -0.5f && signbit(y[3]) && y[3] == 0.0f,
         "main layout decode");
  want[0] = 0x79;
  want[1] = 0x08;
  roundtrip(F_MAIN, x, 32, 16, OP_NIBBLE_EVEN_HIGH, hi, y);
  expect_bytes("main layout, even-high", hi, want, 18);

  /* On random entries the option swaps the nibbles of every payload byte,
   * leaves the scales alone, and decodes to the same floats. */
  float r[512], y1[512], y2[512];
  uint8_t a[288], b[288], m1[68], m2[68];
  for (int t = 0; t < 50; t++) {
    random_entry(r, 512, 16);
    roundtrip(F_MAIN, r, 512, 16, OP_NIBBLE_EVEN_LOW, a, y1);
    roundtrip(F_MAIN, r, 512, 16, OP_NIBBLE_EVEN_HIGH, b, y2);
    for (int j = 0; j < 256; j++)
      EXPECT(b[j] == (uint8_t)(a[j] << 4 | a[j] >> 4), "nibble swap byte %d", j);
    EXPECT(memcmp(a + 256, b + 256, 32) == 0, "nibble order moved scales");
    EXPECT(memcmp(y1, y2, sizeof y1) == 0, "nibble order changed values");
    roundtrip(F_MX_CEIL, r, 128, 32, OP_NIBBLE_EVEN_LOW, m1, y1);
    roundtrip(F_MX_CEIL, r, 128, 32, OP_NIBBLE_EVEN_HIGH, m2, y2);
    for (int j = 0; j < 64; j++)
      EXPECT(m2[j] == (uint8_t)(m1[j] << 4 | m1[j] >> 4), "mx nibble swap %d", j);
    EXPECT(memcmp(m1 + 64, m2 + 64, 4) == 0, "mx nibble order moved scales");
  }
}

/* MXFP4 W = 64: block 0 = {7, 0...}: ceil scale 2 (0x80), 7/2 = 3.5 ties to
 * 4 (code 0x6); OCP scale 1 (0x7F), 7 saturates to 6 (0x7). Block 1 is all
 * zero: smallest scale 0x00. SWA W = 64: {1792, -1, 0...} then zeros. */
static void test_mx_and_fp8_layout(void) {
  float x[64] = {7.0f}, y[64];
  uint8_t p[80];
  roundtrip(F_MX_CEIL, x, 64, 32, OP_NIBBLE_EVEN_LOW, p, y);
  EXPECT(p[0] == 0x06 && p[32] == 0x80 && p[33] == 0x00 && y[0] == 8.0f,
         "mxfp4 ceil: 0x%02x 0x%02x 0x%02x y=%g", p[0], p[32], p[33], y[0]);
  roundtrip(F_MX_OCP, x, 64, 32, OP_NIBBLE_EVEN_LOW, p, y);
  EXPECT(p[0] == 0x07 && p[32] == 0x7F && p[33] == 0x00 && y[0] == 6.0f,
         "mxfp4 ocp: 0x%02x 0x%02x 0x%02x y=%g", p[0], p[32], p[33], y[0]);
  for (int i = 1; i < 64; i++)
    EXPECT(y[i] == 0.0f && !signbit(y[i]), "mxfp4 zeros [%d] = %g", i, y[i]);

  float z[64] = {1792.0f, -1.0f};
  roundtrip(F_FP8_E8M0, z, 64, 32, OP_NIBBLE_EVEN_LOW, p, y);
  EXPECT(p[0] == 0x7E && p[1] == 0xA8 && p[64] == 0x81 && p[65] == 0x00,
         "swa e8m0 layout: 0x%02x 0x%02x 0x%02x 0x%02x", p[0], p[1], p[64], p[65]);
  EXPECT(y[0] == 1792.0f && y[1] == -1.0f, "swa e8m0 decode");
  roundtrip(F_FP8_F32, z, 64, 64, OP_NIBBLE_EVEN_LOW, p, y);
  static const uint8_t four[4] = {0x00, 0x00, 0x80, 0x40}; /* 4.0f, LE */
  EXPECT(p[0] == 0x7E && p[1] == 0xA8, "swa f32 payload");
  expect_bytes("swa f32 scale bytes", p + 64, four, 4);
  EXPECT(y[0] == 1792.0f && y[1] == -1.0f, "swa f32 decode");
}

/* Zero blocks decode to exact, signed zeros in every format. */
static void test_zero_blocks(void) {
  static const enum fmt fs[] = {F_MAIN, F_MX_CEIL, F_MX_OCP, F_FP8_F32, F_FP8_E8M0};
  float x[64], y[64];
  uint8_t p[300];
  for (size_t k = 0; k < sizeof fs / sizeof fs[0]; k++) {
    for (int i = 0; i < 64; i++)
      x[i] = (i % 3 == 0) ? -0.0f : 0.0f;
    x[40] = 3.0f; /* the second block is not zero; the first one is */
    roundtrip(fs[k], x, 64, 32, OP_NIBBLE_EVEN_LOW, p, y);
    int off = is_fp8(fs[k]) ? 64 : 32;
    int zero_scale = fs[k] == F_FP8_F32 ? (p[off] | p[off + 1] | p[off + 2] | p[off + 3]) : p[off];
    EXPECT(zero_scale == 0, "%s: zero block scale byte(s) not 0", fmt_name[fs[k]]);
    for (int i = 0; i < 64; i++)
      if (i != 40)
        EXPECT(fbits(y[i]) == fbits(x[i]), "%s zero [%d]: %g (sign %d)",
               fmt_name[fs[k]], i, y[i], !!signbit(y[i]));
  }
}

/* Main KV: a single huge value. Above 6*448 = 2688 the scale saturates at
 * 448 and the value at +-2688; below, 2000 gets scale 352 (the smallest E4M3
 * >= 333.3) and 2000/352 = 5.68 rounds to 6: 2112. The small rest of the
 * block rounds to signed zero. A subnormal amax gets the smallest scale. */
static void test_main_extremes(void) {
  float x[16], y[16];
  uint8_t p[9];
  float tops[3] = {1e4f, -1e30f, 2000.0f};
  float want[3] = {2688.0f, -2688.0f, 2112.0f};
  uint8_t wsc[3] = {0x7E, 0x7E, 0x7B}; /* 352 = 1.375 * 2^8: e 15, m 3 */
  for (int t = 0; t < 3; t++) {
    for (int i = 0; i < 16; i++)
      x[i] = (i & 1) ? -1.0f : 1.0f;
    x[5] = tops[t];
    roundtrip(F_MAIN, x, 16, 16, OP_NIBBLE_EVEN_LOW, p, y);
    EXPECT(p[8] == wsc[t] && y[5] == want[t], "huge %g: scale 0x%02x y=%g",
           tops[t], p[8], y[5]);
    EXPECT(y[0] == 0.0f && !signbit(y[0]) && y[1] == 0.0f && signbit(y[1]),
           "huge %g: small values -> signed zero", tops[t]);
  }
  for (int i = 0; i < 16; i++)
    x[i] = (i & 1) ? -0x1p-140f : 0x1p-135f;
  roundtrip(F_MAIN, x, 16, 16, OP_NIBBLE_EVEN_LOW, p, y);
  EXPECT(p[8] == 0x01, "subnormal amax: scale 0x%02x, want 0x01", p[8]);
  EXPECT(y[0] == 0.0f && signbit(y[1]), "subnormal amax decodes to signed zeros");
}

/* A block holding NaN or +-Inf stores a NaN scale and a zero payload and
 * decodes to all NaN; its neighbours are packed as if it were not there. */
static void test_nonfinite_poison(void) {
  static const enum fmt fs[] = {F_MAIN, F_MX_CEIL, F_MX_OCP, F_FP8_F32, F_FP8_E8M0};
  static const uint8_t nan_scale[] = {0x7F, 0xFF, 0xFF, 0x00, 0xFF};
  float bad[3] = {NAN, INFINITY, -INFINITY};
  float x[96], y[96], y0[96];
  uint8_t p[420], p0[420];
  for (size_t k = 0; k < sizeof fs / sizeof fs[0]; k++) {
    enum fmt f = fs[k];
    random_entry(x, 96, 32);
    roundtrip(f, x, 96, 32, OP_NIBBLE_EVEN_LOW, p0, y0);
    for (int t = 0; t < 3; t++) {
      float keep = x[40];
      x[40] = bad[t];
      roundtrip(f, x, 96, 32, OP_NIBBLE_EVEN_LOW, p, y);
      x[40] = keep;
      int pw = is_fp8(f) ? 32 : 16, off = is_fp8(f) ? 96 : 48;
      for (int j = 0; j < pw; j++)
        EXPECT(p[pw + j] == 0, "%s %g: poisoned payload byte %d = 0x%02x",
               fmt_name[f], bad[t], j, p[pw + j]);
      if (f == F_FP8_F32) {
        static const uint8_t qnan[4] = {0x00, 0x00, 0xC0, 0x7F};
        expect_bytes("swa f32 NaN scale", p + off + 4, qnan, 4);
      } else {
        EXPECT(p[off + 1] == nan_scale[k], "%s %g: scale 0x%02x", fmt_name[f],
               bad[t], p[off + 1]);
      }
      for (int i = 0; i < 96; i++)
        EXPECT((i >= 32 && i < 64) ? isnan(y[i]) : fbits(y[i]) == fbits(y0[i]),
               "%s %g: [%d] = %g", fmt_name[f], bad[t], i, y[i]);
    }
  }
}

/* ---- the fast packers against per-element references -------------------- */
/* ops/formats.c packs with block paths written to vectorize, not with calls
 * to the element codecs per element. The ref_* packers below are the block
 * loops as they were before that, built only from the public element codecs
 * (op_e2m1_encode, op_e4m3_encode, op_e4m3_roundup, op_e8m0_scale and the
 * decoders); every packer must give exactly their bytes for every input. */

static int ref_block_amax(const float *x, int n, float *amax) {
  float m = 0.0f;
  for (int i = 0; i < n; i++) {
    if (!isfinite(x[i]))
      return 0;
    float a = fabsf(x[i]);
    if (a > m)
      m = a;
  }
  *amax = m;
  return 1;
}

static void ref_e2m1_block(uint8_t *p, const float *x, int n, float s,
                           enum op_nibble_order o) {
  for (int j = 0; j < n / 2; j++) {
    unsigned c[2];
    for (int k = 0; k < 2; k++) /* s == 0: an all-zero block, signed zeros */
      c[k] = s == 0.0f ? (signbit(x[2 * j + k]) ? 0x8u : 0u) : op_e2m1_encode(x[2 * j + k] / s);
    p[j] = (uint8_t)(o == OP_NIBBLE_EVEN_LOW ? (c[0] | c[1] << 4) : (c[1] | c[0] << 4));
  }
}

/* Main KV and MXFP4 (mx < 0: Main KV, else the MX rule). */
static void ref_e2m1_pack(uint8_t *out, const float *x, int W, int block, int mx,
                          enum op_nibble_order o) {
  for (int b = 0; b < W / block; b++) {
    const float *xb = x + b * block;
    uint8_t *pb = out + b * block / 2, *sc = out + W / 2 + b;
    float amax;
    if (!ref_block_amax(xb, block, &amax)) {
      memset(pb, 0, (size_t)block / 2);
      *sc = mx < 0 ? 0x7F : 0xFF;
      continue;
    }
    if (mx >= 0) {
      *sc = op_e8m0_scale(amax, 6.0f, (enum op_mx_rule)mx);
      ref_e2m1_block(pb, xb, block, op_e8m0_decode(*sc), o);
      continue;
    }
    *sc = amax == 0.0f ? 0x00 : op_e4m3_roundup(amax / 6.0f);
    if (amax != 0.0f && *sc == 0x00)
      *sc = 0x01; /* amax / 6 underflowed */
    ref_e2m1_block(pb, xb, block, op_e4m3_decode(*sc), o);
  }
}

static void ref_fp8_pack(uint8_t *out, const float *x, int W, int block,
                         enum op_scale_kind kind) {
  for (int b = 0; b < W / block; b++) {
    const float *xb = x + b * block;
    uint8_t *pb = out + b * block;
    float amax = 0.0f, s;
    int finite = ref_block_amax(xb, block, &amax);
    if (kind == OP_SCALE_E8M0) {
      out[W + b] = finite ? op_e8m0_scale(amax, 448.0f, OP_MX_CEIL) : 0xFF;
      s = op_e8m0_decode(out[W + b]);
    } else {
      s = amax / 448.0f;
      if (s < FLT_MIN && amax > 0.0f)
        s = FLT_MIN;
      uint32_t u = finite ? fbits(s) : 0x7FC00000u;
      for (int i = 0; i < 4; i++)
        out[W + 4 * b + i] = (uint8_t)(u >> (8 * i));
    }
    for (int i = 0; i < block; i++)
      pb[i] = !finite ? 0x00 : s == 0.0f ? (signbit(xb[i]) ? 0x80 : 0x00) : op_e4m3_encode(xb[i] / s);
  }
}

static void ref_pack(enum fmt f, uint8_t *out, const float *x, int W, int block,
                     enum op_nibble_order o) {
  if (is_fp8(f))
    ref_fp8_pack(out, x, W, block, fp8_kind(f));
  else
    ref_e2m1_pack(out, x, W, block, f == F_MAIN ? -1 : (int)mx_rule(f), o);
}

/* Packs x with the packer (into a fenced buffer) and the reference and
 * compares every byte; reports the first difference with its input. */
static void expect_ref_bytes(enum fmt f, const float *x, int W, int block,
                             enum op_nibble_order o) {
  size_t n = fmt_bytes(f, W, block);
  uint8_t *got = fenced(n, 0x5A), *want = malloc(n);
  if (!want) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  fmt_pack(f, got, x, W, block, o);
  ref_pack(f, want, x, W, block, o);
  size_t i = 0;
  while (i < n && got[i] == want[i])
    i++;
  size_t per = is_fp8(f) ? 1 : 2, payload = (size_t)W / per; /* values per byte */
  size_t e = i < payload ? i * per : (i - payload) / (f == F_FP8_F32 ? 4 : 1) * (size_t)block;
  EXPECT(i == n && fence_ok(got, n), "%s W=%d block=%d order %d: %s byte %zu = 0x%02x, "
         "reference 0x%02x (x[%zu] = %a, x[%zu] = %a)%s", fmt_name[f], W, block, (int)o,
         i < payload ? "payload" : "scale", i, i < n ? got[i] : 0, i < n ? want[i] : 0, e,
         e < (size_t)W ? x[e] : 0.0f, e + 1, e + 1 < (size_t)W ? x[e + 1] : 0.0f,
         fence_ok(got, n) ? "" : "; wrote outside its bytes");
  fenced_free(got);
  free(want);
}

static void expect_ref_all(enum fmt f, const float *x, int W, int block) {
  expect_ref_bytes(f, x, W, block, OP_NIBBLE_EVEN_LOW);
  if (!is_fp8(f))
    expect_ref_bytes(f, x, W, block, OP_NIBBLE_EVEN_HIGH);
}

/* Streams n values through format f in entries of SWEEP_W values, block
 * values per block, element 0 of each block set to lead, which fixes the
 * block's scale when no value is larger: lead 448 gives s = 1 for both SWA
 * scales, lead 6 gives s = 1 for Main KV and both MX rules, and so the
 * packers see the values themselves; lead qmax * s gives s for an E4M3 or
 * E8M0 s. The tail of the last entry is zeros. */
#define SWEEP_W 4096
static void sweep_values(enum fmt f, const float *v, size_t n, float lead, int block) {
  static float x[SWEEP_W];
  for (size_t k = 0; k < n;) {
    for (int i = 0; i < SWEEP_W; i++)
      x[i] = i % block == 0 ? lead : k < n ? v[k++] : 0.0f;
    expect_ref_all(f, x, SWEEP_W, block);
  }
}

/* Every exponent, with mantissas at and around each place a rounding can
 * happen (bit r, r = 19..23: 0, 1, 2, half-2 .. half+2, all ones below r,
 * for every value above r), plus a few random ones; both signs. Exponents
 * up to emax. Then every mantissa of the binades in `full` (random signs). */
static float *sweep_set(int emax, const int *full, int nfull, size_t *count) {
  size_t cap = (size_t)(emax + 1) * (620 + 64) + (size_t)nfull * 0x800000, n = 0;
  float *v = malloc(cap * sizeof *v);
  if (!v) {
    fprintf(stderr, "out of memory\n");
    exit(1);
  }
  for (uint32_t e = 0; e <= (uint32_t)emax; e++) {
    for (int r = 19; r <= 23; r++) {
      uint32_t half = 1u << (r - 1), low[10] = {0, 1, 2, half - 2, half - 1, half, half + 1, half + 2,
                                                (1u << r) - 2, (1u << r) - 1};
      for (uint32_t h = 0; h < 1u << (23 - r); h++)
        for (int k = 0; k < 10; k++)
          for (uint32_t sg = 0; sg < 2; sg++) {
            uint32_t u = sg << 31 | e << 23 | h << r | low[k];
            memcpy(&v[n++], &u, 4);
          }
    }
    for (int k = 0; k < 64; k++) {
      uint32_t u = (uint32_t)(rng_next() & 0x807FFFFFu) | e << 23;
      memcpy(&v[n++], &u, 4);
    }
  }
  for (int j = 0; j < nfull; j++)
    for (uint32_t m = 0; m < 0x800000u; m++) {
      uint32_t u = (uint32_t)(rng_next() & 0x80000000u) | (uint32_t)full[j] << 23 | m;
      memcpy(&v[n++], &u, 4);
    }
  *count = n;
  return v;
}

/* The element paths, with the scale fixed at 1 so the packers see the sweep
 * values themselves: E4M3 for every |v| <= 448 (exponents 0..135), whole
 * binades around the subnormal boundary and the top one; E2M1 for every
 * |v| <= 6 (exponents 0..129), whole binades 0.25 to 8. The OCP rule also
 * sees 6 < |v| < 8, which saturates. */
static void test_fast_paths_element_sweep(void) {
  static const int e4m3_full[] = {118, 120, 121, 135}, e2m1_full[] = {125, 126, 127, 128, 129};
  size_t n;
  float *v = sweep_set(135, e4m3_full, 4, &n);
  for (size_t i = 0; i < n; i++) /* keep |v| <= 448: only the lead sets the scale */
    if (fabsf(v[i]) > 448.0f)
      v[i] = copysignf(448.0f, v[i]);
  sweep_values(F_FP8_F32, v, n, 448.0f, 64);
  sweep_values(F_FP8_E8M0, v, n / 8, -448.0f, 32);
  free(v);
  v = sweep_set(129, e2m1_full, 5, &n);
  sweep_values(F_MX_OCP, v, n, 6.0f, 32); /* |v| < 8 here: OCP scale stays 1 */
  for (size_t i = 0; i < n; i++)
    if (fabsf(v[i]) > 6.0f)
      v[i] = copysignf(6.0f, v[i]);
  sweep_values(F_MAIN, v, n, 6.0f, 16);
  sweep_values(F_MX_CEIL, v, n / 8, -6.0f, 32);
  free(v);
}

/* The scale paths: block amax at every exponent, with mantissas around each
 * E8M0 decision (6 = 1.5 * 2^2 and 448 = 1.75 * 2^8 put them at 0x400000 and
 * 0x600000), around every E4M3 roundup boundary of amax / 6 (6 g and its
 * neighbours for every E4M3 value g) and random; the rest of the block
 * random fractions of amax, 2^-40 and up. */
static void test_fast_paths_scale_sweep(void) {
  static const enum fmt fs[] = {F_MAIN, F_MX_CEIL, F_MX_OCP, F_FP8_F32, F_FP8_E8M0};
  enum { W = 512, BLOCK = 16 };
  float amax[4096], x[W];
  int n = 0;
  for (uint32_t e = 0; e < 255; e++) {
    static const uint32_t mant[] = {0, 1, 0x3FFFFF, 0x400000, 0x400001, 0x5FFFFF, 0x600000,
                                    0x600001, 0x7FFFFF, 0x0FFFFF, 0x100000, 0x100001};
    for (size_t k = 0; k < sizeof mant / sizeof mant[0] + 2; k++) {
      uint32_t u = e << 23 | (k < sizeof mant / sizeof mant[0] ? mant[k] : (uint32_t)rng_next() & 0x7FFFFF);
      memcpy(&amax[n++], &u, 4);
    }
  }
  for (int c = 1; c <= 0x7E; c++) {
    float g6 = op_e4m3_decode((uint8_t)c) * 6.0f;
    amax[n++] = g6;
    amax[n++] = nextafterf(g6, 0.0f);
    amax[n++] = nextafterf(g6, INFINITY);
  }
  for (size_t k = 0; k < sizeof fs / sizeof fs[0]; k++)
    for (int a0 = 0; a0 < n; a0 += W / BLOCK) {
      for (int i = 0; i < W; i++) {
        int b = a0 + i / BLOCK;
        float top = b < n ? amax[b] : 0.0f;
        x[i] = i % BLOCK == (b & 15) ? top : (float)(top * exp2(-40 * rng_unit()) * (2 * rng_unit() - 1));
      }
      expect_ref_all(fs[k], x, W, BLOCK);
    }
}

/* Every tie of the element grid at every scale the format can choose (every
 * E4M3 scale for Main KV, every E8M0 exponent for MXFP4 and SWA E8M0, a few
 * hundred FP32 scales), with the float either side and both signs: the E2M1
 * paths compare |x| with (midpoint * s) instead of dividing, which is exact
 * only if nothing near those points rounds across them. */
static void tie_sweep(enum fmt f, double s) {
  float v[0x7E * 6];
  int fp8 = is_fp8(f), n = 0;
  for (int c = 0; c < (fp8 ? 0x7E : 7); c++) {
    double mid = fp8 ? (ref_e4m3(c) + ref_e4m3(c + 1)) / 2 : (ref_e2m1(c) + ref_e2m1(c + 1)) / 2;
    float t = (float)(mid * s), side[3] = {t, nextafterf(t, INFINITY), nextafterf(t, 0.0f)};
    for (int j = 0; j < 6; j++)
      v[n++] = j < 3 ? side[j] : -side[j - 3];
  }
  sweep_values(f, v, (size_t)n, (float)((fp8 ? 448 : 6) * s), fp8 ? 32 : 16);
}

static void test_fast_paths_ties(void) {
  for (int c = 1; c <= 0x7E; c++)
    tie_sweep(F_MAIN, ref_e4m3(c));
  for (int e = -127; e <= 125; e++) { /* 6 * 2^126 overflows */
    tie_sweep(F_MX_CEIL, ldexp(1.0, e));
    tie_sweep(F_MX_OCP, ldexp(1.0, e));
  }
  for (int e = -127; e <= 119; e++) /* 448 * 2^120 overflows */
    tie_sweep(F_FP8_E8M0, ldexp(1.0, e));
  for (int t = 0; t < 300; t++)
    tie_sweep(F_FP8_F32, fabs(rng_float(-126, 120)));
}

/* A scale of format f, random: any E4M3 value (Main KV), a power of two
 * 2^-127 .. 2^119 (E8M0), a float near 2^-30 .. 2^30 (FP32). Element 0 of
 * a block set to qmax * s makes the packer choose s itself (E4M3, E8M0). */
static double random_scale(enum fmt f) {
  if (f == F_MAIN)
    return ref_e4m3(1 + (int)(rng_next() % 0x7E));
  if (f == F_FP8_F32)
    return fabs(rng_float(-30, 30));
  return ldexp(1.0, (int)(rng_next() % 247) - 127);
}

/* Near-ties: a grid midpoint times s, or the float either side of it. */
static float near_tie(enum fmt f, double s, uint32_t u) {
  int fp8 = is_fp8(f), c = (int)(rng_next() % (fp8 ? 0x7E : 7));
  double mid = fp8 ? (ref_e4m3(c) + ref_e4m3(c + 1)) / 2 : (ref_e2m1(c) + ref_e2m1(c + 1)) / 2;
  float v = (float)(mid * s);
  v = (u & 6) == 2 ? nextafterf(v, INFINITY) : (u & 6) == 4 ? nextafterf(v, 0.0f) : v;
  return (u & 1) ? -v : v;
}

/* A random block of one of several kinds: mixed magnitudes over 2^(top-24)
 * to 2^top with zeros, -0 and float subnormals sprinkled in; all (signed)
 * zeros; float subnormals only; near-ties of the grid at one of the
 * format's scales; any finite bit pattern; and poisoned: NaN (any payload or
 * sign) or +-Inf among mixed values. */
static void random_block(float *x, int n, enum fmt f) {
  int kind = (int)(rng_next() % 8), top = (int)(rng_next() % 280) - 150;
  double s = random_scale(f);
  for (int i = 0; i < n; i++) {
    uint32_t u = (uint32_t)rng_next();
    float v;
    switch (kind) {
    case 0: v = (u & 1) ? -0.0f : 0.0f; break;
    case 1: u &= 0x807FFFFFu; memcpy(&v, &u, 4); break;
    case 2: v = i == 0 ? (float)((is_fp8(f) ? 448 : 6) * s) : near_tie(f, s, u); break;
    case 3: if ((u & 0x7F800000u) == 0x7F800000u) u ^= 0x40000000u; memcpy(&v, &u, 4); break;
    default:
      switch (u % 10) {
      case 0: v = 0.0f; break;
      case 1: v = -0.0f; break;
      case 2: u = (u >> 8 & 0x7FFFFF) | (u & 0x80000000u); memcpy(&v, &u, 4); break;
      default: v = rng_float(top - 24, top); if (!isfinite(v)) v = copysignf(FLT_MAX, v); break;
      }
    }
    x[i] = v;
  }
  if (kind >= 6) { /* poisoned: 1 to 3 non-finite values */
    for (int k = 0; k <= (int)(rng_next() % 3); k++) {
      uint32_t u = (uint32_t)rng_next(), j = (uint32_t)(rng_next() % (unsigned)n);
      u = (u % 3 == 0) ? ((u & 0x80000000u) | 0x7F800000u) : (u | 0x7F800000u | (u & 0x7FFFFF ? 0 : 1));
      memcpy(&x[j], &u, 4);
    }
  }
}

static void test_fast_paths_random_blocks(void) {
  static const struct { enum fmt f; int W, block, reps; } cases[] = {
      {F_MAIN, 512, 16, 300},   {F_MAIN, 128, 16, 300},    {F_MAIN, 6, 2, 2000},
      {F_MAIN, 48, 16, 1000},   {F_MAIN, 96, 32, 500},     {F_MAIN, 4096, 4096, 20},
      {F_MAIN, 200, 100, 500},  {F_MX_CEIL, 128, 32, 500}, {F_MX_OCP, 128, 32, 500},
      {F_MX_CEIL, 64, 32, 1000}, {F_MX_OCP, 64, 32, 1000},  {F_MX_CEIL, 48, 16, 1000},
      {F_MX_OCP, 130, 26, 1000}, {F_FP8_F32, 512, 512, 200}, {F_FP8_F32, 128, 128, 500},
      {F_FP8_F32, 21, 7, 2000}, {F_FP8_F32, 1, 1, 2000},   {F_FP8_F32, 200, 100, 500},
      {F_FP8_E8M0, 128, 32, 500}, {F_FP8_E8M0, 512, 32, 200}, {F_FP8_E8M0, 99, 33, 1000},
      {F_FP8_E8M0, 3, 3, 2000}, {F_FP8_E8M0, 4096, 4096, 20},
  };
  static float x[4096];
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++)
    for (int t = 0; t < cases[c].reps; t++) {
      for (int b = 0; b < cases[c].W / cases[c].block; b++)
        random_block(x + b * cases[c].block, cases[c].block, cases[c].f);
      expect_ref_all(cases[c].f, x, cases[c].W, cases[c].block);
    }
}

int main(void) {
  test_e2m1_exhaustive();
  test_e4m3_exhaustive();
  test_decode_tables_vs_arithmetic();
  test_rounding_vs_reference();
  test_e4m3_roundup();
  test_e8m0();
  test_nan_inf_elements();
  test_sizes();
  test_random_roundtrips();
  test_exact_representables();
  test_tiny_entries();
  test_block_ties();
  test_main_layout_and_nibbles();
  test_mx_and_fp8_layout();
  test_zero_blocks();
  test_main_extremes();
  test_nonfinite_poison();
  /* The packers are compiled for each vector ISA (ops/isa.h): check every
   * level this CPU has against the reference, not only the one it picks. */
  for (int isa = 0; isa < OP_ISA_COUNT; isa++) {
    if (!op_isa_force((enum op_isa)isa)) continue;
    test_fast_paths_element_sweep();
    test_fast_paths_scale_sweep();
    test_fast_paths_ties();
    test_fast_paths_random_blocks();
  }
  if (g_fails) {
    fprintf(stderr, "test_formats: %d of %d checks FAILED\n", g_fails, g_checks);
    return 1;
  }
  printf("test_formats: all %d checks passed\n", g_checks);
  return 0;
}

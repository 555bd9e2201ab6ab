/* test_formats_elements.c: bit-exact tests of the element codecs of the
 * KV-cache storage formats (ops/formats.h): E2M1, E4M3 and E8M0.
 *
 * What it is: exhaustive decode and encode checks of E2M1 and E4M3, the
 * decode tables against the ldexpf arithmetic they replaced, rounding
 * checked against a float64 reference that scans the value tables (it never
 * calls the code under test) at every tie, its neighbours, saturation and
 * random values, the E4M3 round-up and both E8M0 scale rules against their
 * definitions, the NaN/Inf policy of docs/formats.md, and the byte sizes of
 * every block format.
 *
 * What it is not: a test of whole blocks (test_formats_blocks.c), of the
 * fast packers (test_formats_fast.c), of performance, or of any cache built
 * on these.
 *
 * Run: ctest --test-dir build -R '^formats_elements$' --output-on-failure
 *      (or build/tests/test_formats_elements; exit 0 = pass, 1 = a check
 *      failed)
 */
#include "tests/formats_fixture.h"

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

int main(void) {
  test_e2m1_exhaustive();
  test_e4m3_exhaustive();
  test_decode_tables_vs_arithmetic();
  test_rounding_vs_reference();
  test_e4m3_roundup();
  test_e8m0();
  test_nan_inf_elements();
  test_sizes();
  return formats_report("test_formats_elements");
}

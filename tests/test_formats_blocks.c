/* test_formats_blocks.c: bit-exact tests of the block formats of the
 * KV-cache (ops/formats.h): Main KV FP4, MXFP4 under both scale rules, and
 * SWA FP8 with FP32 or E8M0 scales, through one table-driven harness.
 *
 * What it is: every pack writes exactly its documented bytes (two buffers
 * pre-filled differently, sentinel bytes around every output); scale rules
 * checked against their definitions; round-trip error bounds derived from
 * the element grids, and every decoded value against a float64 reference;
 * random entries, exactly representable ones at every scale, entries near
 * the bottom of float, and ties at every scale; the documented byte layout
 * and nibble orders on hand-computed entries; zero blocks, saturation and
 * NaN/Inf poisoning per docs/formats.md.
 *
 * What it is not: a test of the element codecs alone
 * (test_formats_elements.c), of the fast packers at every ISA level
 * (test_formats_fast.c), of performance, or of any cache built on these.
 *
 * Run: ctest --test-dir build -R '^formats_blocks$' --output-on-failure
 *      (or build/tests/test_formats_blocks; exit 0 = pass, 1 = a check
 *      failed)
 */
#include "tests/formats_fixture.h"

/* ---- the block harness --------------------------------------------------- */

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
  case F_MAIN_RNE: /* Appendix V #21: RNE_E4M3(clamp(amax/6, 2^-9, 448)) */
    return ref_e4m3(ref_nearest(fmin(fmax(amax / 6, 0x1p-9), 448), ref_e4m3, 0x7E, 0x80));
  case F_MX_FLOOR: /* 2^ceil(log2(max(amax, 6 2^-126) / 6)) */
    return ldexp(1.0, ref_e8m0_ceil(fmax(amax, 6 * 0x1p-126), 6.0) - 127);
  case F_FP8_VLLM: /* 2^ceil(log2(max(amax/448, 1e-4))) */
    return ldexp(1.0, ref_e8m0_ceil(fmax(amax / 448, (double)1e-4f) * 448, 448.0) - 127);
  case F_FP8_PYP:
    return ldexp(1.0, ref_e8m0_ceil(fmax(amax / 448, (double)FLOOR_PYP) * 448, 448.0) - 127);
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

int main(void) {
  test_random_roundtrips();
  test_exact_representables();
  test_tiny_entries();
  test_block_ties();
  test_main_layout_and_nibbles();
  test_mx_and_fp8_layout();
  test_zero_blocks();
  test_main_extremes();
  test_nonfinite_poison();
  return formats_report("test_formats_blocks");
}

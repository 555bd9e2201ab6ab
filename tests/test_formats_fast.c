/* test_formats_fast.c: the fast block packers of ops/formats.c byte for
 * byte against per-element reference packers, at every vector ISA level the
 * CPU has (ops/isa.h), for all five block formats.
 *
 * What it is: the reference packers (built only from the public element
 * codecs) against op_fp4_pack, op_mxfp4_pack and op_fp8_pack on sweeps of
 * every exponent with the mantissas where rounding happens and whole
 * binades, block maxima at every scale decision, every grid tie at every
 * scale each format can choose, and random blocks of many kinds (zeros,
 * subnormals, near-ties, any bit pattern, NaN and Inf poisoning); each in
 * both nibble orders where there are two, with sentinel bytes around every
 * output.
 *
 * What it is not: a check of the formats' definitions (test_formats_blocks.c
 * and test_formats_elements.c do that against float64 references), or a
 * performance test.
 *
 * Run: ctest --test-dir build -R '^formats_fast$' --output-on-failure
 *      (or build/tests/test_formats_fast; exit 0 = pass, 1 = a check failed)
 */
#include "tests/formats_fixture.h"

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

/* The E8M0 code of a floor: 127 + the smallest k >= -127 with 2^k >= floor
 * (0 without a floor), by scanning powers of two in float64. */
static int ref_floor_code(double floor) {
  int k = -127;
  while (floor > 0 && ldexp(1.0, k) < floor) k++;
  return k + 127;
}

/* Main KV and MXFP4 (mx < 0: Main KV, else the MX rule); vendor: Main KV
 * with RNE_E4M3(clamp(amax / 6, 2^-9, 448)), or MXFP4 ceil raised to the
 * floor 2^-126 (Appendix V #21). */
static void ref_e2m1_pack_v(uint8_t *out, const float *x, int W, int block, int mx,
                            enum op_nibble_order o, int vendor) {
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
      if (vendor && *sc < ref_floor_code(0x1p-126))
        *sc = (uint8_t)ref_floor_code(0x1p-126);
      ref_e2m1_block(pb, xb, block, op_e8m0_decode(*sc), o);
      continue;
    }
    if (vendor) {
      float v = amax / 6.0f;
      *sc = op_e4m3_encode(v < 0x1p-9f ? 0x1p-9f : v > 448.0f ? 448.0f : v);
      ref_e2m1_block(pb, xb, block, op_e4m3_decode(*sc), o);
      continue;
    }
    *sc = amax == 0.0f ? 0x00 : op_e4m3_roundup(amax / 6.0f);
    if (amax != 0.0f && *sc == 0x00)
      *sc = 0x01; /* amax / 6 underflowed */
    ref_e2m1_block(pb, xb, block, op_e4m3_decode(*sc), o);
  }
}

/* SWA; floor > 0 raises the E8M0 code to ref_floor_code(floor). */
static void ref_fp8_pack_v(uint8_t *out, const float *x, int W, int block,
                           enum op_scale_kind kind, double floor) {
  for (int b = 0; b < W / block; b++) {
    const float *xb = x + b * block;
    uint8_t *pb = out + b * block;
    float amax = 0.0f, s;
    int finite = ref_block_amax(xb, block, &amax);
    if (kind == OP_SCALE_E8M0) {
      out[W + b] = finite ? op_e8m0_scale(amax, 448.0f, OP_MX_CEIL) : 0xFF;
      if (finite && out[W + b] < ref_floor_code(floor))
        out[W + b] = (uint8_t)ref_floor_code(floor);
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
    ref_fp8_pack_v(out, x, W, block, fp8_kind(f), f == F_FP8_VLLM ? 1e-4f : f == F_FP8_PYP ? FLOOR_PYP : 0.0);
  else
    ref_e2m1_pack_v(out, x, W, block, f == F_MAIN || f == F_MAIN_RNE ? -1 : (int)mx_rule(f), o, is_vendor(f));
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
  sweep_values(F_MAIN_RNE, v, n / 4, -6.0f, 16); /* vendor rules: the same element paths */
  sweep_values(F_MX_FLOOR, v, n / 8, 6.0f, 32);
  free(v);
  v = sweep_set(135, e4m3_full, 1, &n);
  for (size_t i = 0; i < n; i++)
    if (fabsf(v[i]) > 448.0f)
      v[i] = copysignf(448.0f, v[i]);
  sweep_values(F_FP8_VLLM, v, n / 8, 448.0f, 32);
  free(v);
}

/* The scale paths: block amax at every exponent, with mantissas around each
 * E8M0 decision (6 = 1.5 * 2^2 and 448 = 1.75 * 2^8 put them at 0x400000 and
 * 0x600000), around every E4M3 roundup boundary of amax / 6 (6 g and its
 * neighbours for every E4M3 value g) and random; the rest of the block
 * random fractions of amax, 2^-40 and up. */
static void test_fast_paths_scale_sweep(void) {
  static const enum fmt fs[] = {F_MAIN,     F_MX_CEIL,  F_MX_OCP,   F_FP8_F32, F_FP8_E8M0,
                                F_MAIN_RNE, F_MX_FLOOR, F_FP8_VLLM, F_FP8_PYP};
  enum { W = 512, BLOCK = 16 };
  float amax[8192], x[W];
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
    /* RNE ties of amax / 6 (vendor Main KV): 6 times a midpoint of the grid */
    float m6 = (float)((ref_e4m3(c - 1) + ref_e4m3(c)) / 2 * 6);
    amax[n++] = m6;
    amax[n++] = nextafterf(m6, 0.0f);
    amax[n++] = nextafterf(m6, INFINITY);
  }
  /* around the floors: 6 2^-9, 448 1e-4, 1e-4 and 6 2^-126 */
  static const float floors[] = {6 * 0x1p-9f, 448 * 1e-4f, 1e-4f, 6 * 0x1p-126f, 0x1p-13f * 448, 0x1p-22f * 448};
  for (size_t k = 0; k < sizeof floors / sizeof floors[0]; k++) {
    amax[n++] = floors[k];
    amax[n++] = nextafterf(floors[k], 0.0f);
    amax[n++] = nextafterf(floors[k], INFINITY);
    amax[n++] = floors[k] / 3;
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
  for (int c = 1; c <= 0x7E; c++) /* vendor rules: every scale they can choose */
    tie_sweep(F_MAIN_RNE, ref_e4m3(c));
  for (int e = -126; e <= 125; e++)
    tie_sweep(F_MX_FLOOR, ldexp(1.0, e));
  for (int e = -22; e <= 119; e++) {
    tie_sweep(F_FP8_PYP, ldexp(1.0, e));
    if (e >= -13) tie_sweep(F_FP8_VLLM, ldexp(1.0, e));
  }
}

/* A scale of format f, random: any E4M3 value (Main KV), a power of two
 * 2^-127 .. 2^119 (E8M0), a float near 2^-30 .. 2^30 (FP32). Element 0 of
 * a block set to qmax * s makes the packer choose s itself (E4M3, E8M0). */
static double random_scale(enum fmt f) {
  if (f == F_MAIN || f == F_MAIN_RNE)
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
      {F_MAIN_RNE, 512, 16, 400}, {F_MAIN_RNE, 48, 16, 1000}, {F_MAIN_RNE, 6, 2, 2000},
      {F_MX_FLOOR, 128, 32, 500}, {F_MX_FLOOR, 48, 16, 1000}, {F_FP8_VLLM, 512, 32, 300},
      {F_FP8_VLLM, 99, 33, 1000}, {F_FP8_PYP, 512, 32, 300}, {F_FP8_PYP, 3, 3, 2000},
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
  /* The packers are compiled for each vector ISA (ops/isa.h): check every
   * level this CPU has against the reference, not only the one it picks. */
  for (int isa = 0; isa < OP_ISA_COUNT; isa++) {
    if (!op_isa_force((enum op_isa)isa)) continue;
    test_fast_paths_element_sweep();
    test_fast_paths_scale_sweep();
    test_fast_paths_ties();
    test_fast_paths_random_blocks();
  }
  return formats_report("test_formats_fast");
}

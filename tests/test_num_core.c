/* test_num_core.c: the numeric core shared by the CPU ops and the CUDA
 * kernels (ops/num.h, num_codec.h, num_engram.h, num_sinkhorn.h,
 * num_softmax.h), bit for bit.
 *
 * What it checks, over the same inputs for every rule:
 * 1. The C build of each header function against the public CPU op it
 *    serves (ops/formats.h codecs and the formats' block scale rules, the
 *    fast unpack tables, op_engram_floor_mod, op_mhc_sinkhorn) and against
 *    an independent reference (float64 decoders, __int128 hash arithmetic,
 *    float64 Sinkhorn and softmax under bounds derived beside them).
 * 2. With CUDA: the nvcc build of the same headers (tests/num_core_nvcc.cu,
 *    host code run on this CPU) against the C build, bitwise: every E4M3,
 *    E2M1, E8M0 code and bf16 pattern's decode, every float rule on the
 *    specials, every E4M3/E2M1 grid value, midpoint and neighbour, and
 *    NC_RANDOM random float bit patterns, the E2M1 division-free encode on
 *    every E4M3 and E8M0 scale, the E8M0 scale rules, the hash, Sinkhorn
 *    and the online softmax (same libm on the host, so expf agrees too).
 *    Without CUDA that half is reported as not built.
 *
 * Run: ctest --test-dir build -R num_core --output-on-failure
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/engram.h"
#include "ops/formats.h"
#include "ops/mhc.h"
#include "tests/harness.h"
#include "tests/num_core_twin.h"

#define NC_NAME(x) nc_c_##x
#include "tests/num_core_eval.h"

#ifdef CEDAR_NUM_CORE_NVCC
static const int have_nvcc = 1;
#else
static const int have_nvcc = 0;
/* Not built: never called (have_nvcc is 0), defined so the test links. */
void nc_nvcc_float_rules(uint32_t *o, const float *x, size_t n) { (void)o, (void)x, (void)n; }
void nc_nvcc_code_rules(uint32_t *o) { (void)o; }
void nc_nvcc_e2m1_scaled(uint32_t *o, const float *x, const float *s, size_t n) { (void)o, (void)x, (void)s, (void)n; }
void nc_nvcc_e8m0_scales(uint32_t *o, const uint32_t *a, const int32_t *k, size_t n) { (void)o, (void)a, (void)k, (void)n; }
void nc_nvcc_engram(int64_t *r, const uint64_t *g, const uint64_t *m, const int *o, const int64_t *p, const int64_t *f,
                    size_t n) {
  (void)r, (void)g, (void)m, (void)o, (void)p, (void)f, (void)n;
}
void nc_nvcc_sinkhorn(float *C, const float *l, int n, int hc, int it, float e) {
  (void)C, (void)l, (void)n, (void)hc, (void)it, (void)e;
}
void nc_nvcc_softmax(float *o, const float *z, const float *v, const float *s, int n, int k, int b, int sp) {
  (void)o, (void)z, (void)v, (void)s, (void)n, (void)k, (void)b, (void)sp;
}
#endif

enum { CHUNK = 1 << 16, NC_RANDOM = 1 << 21 };
static uint64_t seed = 0x5EEDC0DE;

static uint64_t rnd64(void) { /* splitmix64 */
  uint64_t z = (seed += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
static float bitsf(uint32_t u) { return op_hd_float(u); }
static uint32_t fbits(float x) { return op_hd_bits(x); }

/* Compares two rule arrays; names the first difference. */
static void same_words(const uint32_t *a, const uint32_t *b, size_t n, int per, const char *what) {
  for (size_t i = 0; i < n; i++)
    if (a[i] != b[i]) {
      EXPECT(0, "%s: element %zu rule %d: C build 0x%08x, nvcc build 0x%08x", what, i / (size_t)per,
             (int)(i % (size_t)per), a[i], b[i]);
      return;
    }
}

/* ---- 1: the float rules against the public codecs --------------------------- */

/* ceil(log2 f) + 127 clamped to [0, 254] the way ops/formats.c did it before
 * the core (frexpf), for finite f > 0; 0 otherwise. */
static int32_t floor_code_ref(float f) {
  if (!(f > 0.0f)) return 0;
  int e;
  float m = frexpf(f, &e);
  int k = m == 0.5f ? e - 1 : e;
  return k < -127 ? 0 : k > 127 ? 254 : k + 127;
}

static void check_float_rules(const float *x, const uint32_t *o, size_t n) {
  int bad = 0;
  for (size_t i = 0; i < n && bad < 5; i++) {
    const uint32_t *r = o + i * NC_FLOAT_RULES;
    const float a = fabsf(x[i]);
    const uint32_t ab = fbits(a);
    const int finite = ab < 0x7F800000u;
    uint32_t want[NC_FLOAT_RULES];
    want[0] = op_e2m1_encode(x[i]);
    want[1] = op_e4m3_encode(x[i]);
    want[2] = op_e4m3_roundup(x[i]);
    want[3] = a < 464.0f ? op_e4m3_encode(x[i]) : 0xFFFFu;
    /* SPEC 4.2: the smallest E4M3 >= amax / 6, 1 on underflow, 0 for zero. */
    uint8_t up = op_e4m3_roundup(a / 6.0f);
    want[4] = !finite ? 0x7Fu : a == 0.0f ? 0u : up == 0 ? 1u : up;
    float v = a / 6.0f;
    v = v < 0x1p-9f ? 0x1p-9f : v > 448.0f ? 448.0f : v;
    want[5] = !finite ? 0x7Fu : op_e4m3_encode(v);
    float s448 = a / 448.0f, s6 = a / 6.0f;
    want[6] = !finite ? 0x7FC00000u : fbits(a > 0.0f && s448 < FLT_MIN ? FLT_MIN : s448);
    want[7] = !finite ? 0x7FC00000u : fbits(a > 0.0f && s6 < FLT_MIN ? FLT_MIN : s6);
    want[8] = fbits(op_bf16_round(x[i]));
    want[9] = fbits(op_bf16_round(x[i])) >> 16;
    want[10] = (uint32_t)floor_code_ref(a < 0x1p127f ? a : 0x1p127f);
    want[11] = op_e2m1_encode(a < 6.0f ? a : 6.0f) & 7u; /* RNE magnitude = the midpoint count (a < 6) */
    for (int k = 0; k < NC_FLOAT_RULES; k++)
      if (r[k] != want[k] && !(k == 11 && op_hd_isnan_bits(ab))) {
        EXPECT(0, "float rule %d of x = %a (0x%08x): core 0x%x, public op 0x%x", k, (double)x[i], fbits(x[i]), r[k],
               want[k]);
        bad++;
      }
  }
}

/* Runs the float rules on x in both builds; checks and compares. */
static void float_rules_both(const float *x, size_t n, const char *what) {
  uint32_t *c = malloc(n * NC_FLOAT_RULES * sizeof *c), *g = malloc(n * NC_FLOAT_RULES * sizeof *g);
  nc_c_float_rules(c, x, n);
  check_float_rules(x, c, n);
  if (have_nvcc) {
    nc_nvcc_float_rules(g, x, n);
    same_words(c, g, n * NC_FLOAT_RULES, NC_FLOAT_RULES, what);
  }
  free(c), free(g);
}

/* Specials, every E4M3 and E2M1 value with its midpoints and neighbours
 * (both signs), every power of two. */
static size_t special_floats(float *x) {
  size_t n = 0;
  const uint32_t sp[] = {0, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x7FC00000u, 0xFFC00000u, 0x7F800001u, 0x00000001u,
                         0x007FFFFFu, 0x00800000u, 0x7F7FFFFFu, 0x43E00000u, 0x43E80000u, 0x43E7FFFFu, 0x40C00000u};
  for (size_t i = 0; i < sizeof sp / sizeof *sp; i++) x[n++] = bitsf(sp[i]);
  for (int c = 0; c < 256; c++) {
    float a = op_e4m3_decode((uint8_t)c), b = op_e4m3_decode((uint8_t)(c + 1 < 256 ? c + 1 : c));
    if (isnan(a) || isnan(b)) continue;
    const float pts[] = {a, (a + b) / 2, nextafterf((a + b) / 2, -INFINITY), nextafterf((a + b) / 2, INFINITY),
                         nextafterf(a, INFINITY), nextafterf(a, -INFINITY), a * 6.0f, nextafterf(a * 6.0f, INFINITY)};
    for (size_t k = 0; k < sizeof pts / sizeof *pts; k++) x[n++] = pts[k], x[n++] = -pts[k];
  }
  for (int c = 0; c < 16; c++) {
    float a = op_e2m1_decode((uint8_t)c), b = op_e2m1_decode((uint8_t)((c & 7) < 7 ? c + 1 : c));
    const float m = (a + b) / 2, pts[] = {a, m, nextafterf(m, -INFINITY), nextafterf(m, INFINITY)};
    for (size_t k = 0; k < sizeof pts / sizeof *pts; k++) x[n++] = pts[k];
  }
  for (int e = -149; e <= 127; e++) x[n++] = ldexpf(1.0f, e), x[n++] = nextafterf(ldexpf(1.0f, e), INFINITY);
  return n;
}

static void test_float_rules(void) {
  float *x = malloc(CHUNK * sizeof *x);
  size_t n = special_floats(x);
  float_rules_both(x, n, "float rules on the specials and grids");
  for (int chunk = 0; chunk < NC_RANDOM / CHUNK; chunk++) {
    for (size_t i = 0; i < CHUNK; i++) {
      uint64_t r = rnd64();
      /* half any bit pattern, half values near the formats' range */
      x[i] = (r & 1) ? bitsf((uint32_t)(r >> 32)) : ldexpf((float)((r >> 8) & 0xFFFFFF) / 16777216.0f,
                                                             (int)((r >> 40) % 40) - 20) * ((r & 2) ? -1.0f : 1.0f);
    }
    float_rules_both(x, CHUNK, "float rules on random floats");
  }
  free(x);
  printf("float rules: %d specials and grid points, %d random floats\n", (int)n, NC_RANDOM);
}

/* ---- the decoders over every code -------------------------------------------- */

static void test_codes(void) {
  uint32_t c[256 * NC_CODE_RULES], g[256 * NC_CODE_RULES];
  nc_c_code_rules(c);
  for (int k = 0; k < 256; k++) {
    const uint32_t *r = c + k * NC_CODE_RULES;
    /* E4M3 against float64 from the definition */
    const int e = (k >> 3) & 15, m = k & 7, s = k >> 7;
    if (e == 15 && m == 7) {
      EXPECT(r[0] == 0x7FC00000u, "e4m3 code 0x%02x decodes to 0x%08x, not the quiet NaN", k, r[0]);
    } else {
      const double v = (e ? ldexp(1.0 + m / 8.0, e - 7) : ldexp(m, -9)) * (s ? -1 : 1);
      EXPECT(bitsf(r[0]) == (float)v && !signbit(bitsf(r[0])) == !signbit(v), "e4m3 code 0x%02x: %a, want %a", k,
             (double)bitsf(r[0]), v);
    }
    /* the fast unpack tables of ops/formats.c (scale 1) */
    uint8_t e8[2] = {(uint8_t)k, 127}, e4[3] = {(uint8_t)((k & 0xF) | (k & 0xF) << 4), 0x38, 0};
    float f8[1], f4[2];
    op_fp8_unpack(f8, e8, 1, 1, OP_SCALE_E8M0);
    EXPECT(fbits(f8[0]) == r[0], "e4m3 code 0x%02x: core 0x%08x, unpack table 0x%08x", k, r[0], fbits(f8[0]));
    op_fp4_unpack(f4, e4, 2, 2, OP_NIBBLE_EVEN_LOW);
    EXPECT(fbits(f4[0]) == r[1], "e2m1 code 0x%x: core 0x%08x, unpack table 0x%08x", k & 15, r[1], fbits(f4[0]));
    /* E8M0: 2^(k - 127), NaN at 0xFF */
    EXPECT(k == 255 ? r[2] == 0x7FC00000u : bitsf(r[2]) == (float)ldexp(1.0, k - 127), "e8m0 code 0x%02x: 0x%08x", k,
           r[2]);
    EXPECT(r[3] == (uint32_t)(k << 8 | k) << 16, "bf16 0x%04x decodes to 0x%08x", k << 8 | k, r[3]);
  }
  if (have_nvcc) {
    nc_nvcc_code_rules(g);
    same_words(c, g, 256 * NC_CODE_RULES, NC_CODE_RULES, "decoders over every code");
  }
}

/* ---- E2M1 by thresholds, E8M0 scales ------------------------------------------- */

static void test_scaled_and_e8m0(void) {
  enum { N = CHUNK };
  float *x = malloc(N * sizeof *x), *s = malloc(N * sizeof *s);
  uint32_t *c = malloc(N * 4 * sizeof *c), *g = malloc(N * 4 * sizeof *g), *ab = malloc(N * sizeof *ab);
  int32_t *kmin = malloc(N * sizeof *kmin);
  for (int round = 0; round < 8; round++) {
    for (int i = 0; i < N; i++) {
      uint64_t r = rnd64();
      /* every positive E4M3 scale 0x01..0x7E and every E8M0 scale up to 2^120 in turn (above it T s and
       * x = t s overflow to Inf, which the packers never divide: such a block is poisoned first) */
      const int code = i % (0x7E + 248);
      s[i] = code < 0x7E ? op_e4m3_decode((uint8_t)(code + 1)) : op_e8m0_decode((uint8_t)(code - 0x7E));
      const float t = (float)((r >> 8) & 0xFFFFFF) / 16777216.0f * 7.0f * ((r & 1) ? -1.0f : 1.0f);
      x[i] = (r & 6) ? t * s[i] : op_e2m1_decode((uint8_t)(r >> 3)) * s[i] + (op_e2m1_decode(1) * s[i]) / 2;
      ab[i] = (r & 8) ? (uint32_t)(r >> 33) : (uint32_t)(r >> 33) % 0x7F800000u; /* NaN/Inf patterns too */
      kmin[i] = (r & 16) ? 0 : (int32_t)((r >> 20) % 255);
    }
    nc_c_e2m1_scaled(c, x, s, N);
    for (int i = 0; i < N; i++)
      if (c[i] != op_e2m1_encode(x[i] / s[i])) {
        EXPECT(0, "e2m1 of %a / %a by thresholds: 0x%x, by division 0x%x", (double)x[i], (double)s[i], c[i],
               op_e2m1_encode(x[i] / s[i]));
        break;
      }
    if (have_nvcc) nc_nvcc_e2m1_scaled(g, x, s, N), same_words(c, g, N, 1, "e2m1 by thresholds");
    nc_c_e8m0_scales(c, ab, kmin, N);
    for (int i = 0; i < N; i++) {
      const float a = bitsf(ab[i]);
      const int fin = ab[i] < 0x7F800000u;
      const uint32_t w[4] = {fin ? (uint32_t)(op_e8m0_scale(a, 6, OP_MX_CEIL) < kmin[i] ? kmin[i]
                                                                                        : op_e8m0_scale(a, 6, OP_MX_CEIL))
                                 : 0xFFu,
                             op_e8m0_scale(a, 6, OP_MX_OCP),
                             fin ? (uint32_t)(op_e8m0_scale(a, 448, OP_MX_CEIL) < kmin[i]
                                                  ? kmin[i]
                                                  : op_e8m0_scale(a, 448, OP_MX_CEIL))
                                 : 0xFFu,
                             op_e8m0_scale(a, 448, OP_MX_OCP)};
      if (memcmp(w, c + 4 * i, sizeof w)) {
        EXPECT(0, "e8m0 scales of amax 0x%08x kmin %d: %x %x %x %x, want %x %x %x %x", ab[i], kmin[i], c[4 * i],
               c[4 * i + 1], c[4 * i + 2], c[4 * i + 3], w[0], w[1], w[2], w[3]);
        break;
      }
    }
    if (have_nvcc) nc_nvcc_e8m0_scales(g, ab, kmin, N), same_words(c, g, 4 * (size_t)N, 4, "e8m0 scales");
  }
  free(x), free(s), free(c), free(g), free(ab), free(kmin);
}

/* ---- the Engram hash -------------------------------------------------------------- */

static void test_engram(void) {
  enum { N = CHUNK };
  uint64_t *g = malloc(4 * N * sizeof *g), *mult = malloc(4 * N * sizeof *mult);
  int *order = malloc(N * sizeof *order);
  int64_t *prime = malloc(N * sizeof *prime), *off = malloc(N * sizeof *off), *c = malloc(N * sizeof *c),
          *v = malloc(N * sizeof *v);
  for (int i = 0; i < N; i++) {
    for (int k = 0; k < 4; k++) {
      /* compressed ids (small, or any int64 for the wrap), odd multipliers */
      g[4 * i + k] = (i & 1) ? rnd64() : rnd64() % 129280;
      mult[4 * i + k] = (i & 2) ? rnd64() | 1 : (rnd64() % ((INT64_MAX / 99092) / 2)) * 2 + 1;
    }
    order[i] = 1 + (int)(rnd64() % 4);
    prime[i] = (int64_t)(rnd64() % ((uint64_t)1 << (i & 4 ? 62 : 24))) + 2;
    off[i] = (int64_t)(rnd64() % ((uint64_t)1 << 40));
  }
  nc_c_engram(c, g, mult, order, prime, off, N);
  for (int i = 0; i < N; i++) {
    /* reference: products mod 2^64 in 128-bit arithmetic, Python's modulo */
    unsigned __int128 mix = 0;
    for (int k = 0; k < order[i]; k++) mix ^= ((unsigned __int128)g[4 * i + k] * mult[4 * i + k]) & UINT64_MAX;
    const __int128 s = (int64_t)(uint64_t)mix, p = prime[i];
    const int64_t want = (int64_t)(((s % p) + p) % p) + off[i];
    if (c[i] != want || op_engram_floor_mod((int64_t)(uint64_t)mix, prime[i]) + off[i] != want) {
      EXPECT(0, "engram row %d: core %lld, reference %lld", i, (long long)c[i], (long long)want);
      break;
    }
  }
  if (have_nvcc) {
    nc_nvcc_engram(v, g, mult, order, prime, off, N);
    EXPECT(!memcmp(c, v, N * sizeof *c), "engram rows: the nvcc build differs from the C build");
  }
  free(g), free(mult), free(order), free(prime), free(off), free(c), free(v);
}

/* ---- Sinkhorn and the online softmax ------------------------------------------------ */

static void sinkhorn64(double *C, const float *lg, int hc, int iters, double eps) {
  for (int i = 0; i < hc; i++) {
    double m = lg[i * hc], s = 0;
    for (int j = 1; j < hc; j++) m = fmax(m, lg[i * hc + j]);
    for (int j = 0; j < hc; j++) s += C[i * hc + j] = exp(lg[i * hc + j] - m);
    for (int j = 0; j < hc; j++) C[i * hc + j] = C[i * hc + j] / s + eps;
  }
  for (int it = 0; it < iters; it++)
    for (int pass = it ? 0 : 1; pass < 2; pass++) /* columns first, then rows and columns */
      for (int a = 0; a < hc; a++) {
        double s = 0;
        for (int b = 0; b < hc; b++) s += pass ? C[b * hc + a] : C[a * hc + b];
        for (int b = 0; b < hc; b++) *(pass ? &C[b * hc + a] : &C[a * hc + b]) /= s + eps;
      }
}

static void test_sinkhorn(void) {
  enum { N = 512, HC = 4, IT = 20 };
  float *lg = malloc(N * HC * HC * sizeof *lg), *c = malloc(N * HC * HC * sizeof *c),
        *g = malloc(N * HC * HC * sizeof *g), one[HC * HC];
  h_fill(lg, N * HC * HC, &seed, -6, 6);
  nc_c_sinkhorn(c, lg, N, HC, IT, 1e-6f);
  /* Each of the 2 IT + 1 normalizations rounds an entry by a sum of hc terms
   * (gamma(hc)), the eps add and the division ((hc + 2) u together); the
   * softmax adds expf (1 ulp) and its own (hc + 3) u. The normalization is a
   * contraction (positive matrices), so the errors add: relative bound
   * (2 IT + 1)(hc + 2) u + (hc + 5) u per entry. */
  const double rel = ((2.0 * IT + 1) * (HC + 2) + HC + 5) * H_U32;
  for (int i = 0; i < N; i++) {
    double ref[HC * HC];
    sinkhorn64(ref, lg + i * HC * HC, HC, IT, 1e-6);
    op_mhc_sinkhorn(one, lg + i * HC * HC, HC, IT, 1e-6f);
    EXPECT(!memcmp(one, c + i * HC * HC, sizeof one), "sinkhorn %d: the core differs from op_mhc_sinkhorn", i);
    for (int q = 0; q < HC * HC; q++)
      if (fabs(c[i * HC * HC + q] - ref[q]) > rel * fabs(ref[q])) {
        EXPECT(0, "sinkhorn %d entry %d: %.9g, float64 %.9g (rel bound %.3g)", i, q, c[i * HC * HC + q], ref[q], rel);
        break;
      }
  }
  if (have_nvcc) {
    nc_nvcc_sinkhorn(g, lg, N, HC, IT, 1e-6f);
    EXPECT(!memcmp(c, g, N * HC * HC * sizeof *c), "sinkhorn: the nvcc build differs from the C build");
  }
  free(lg), free(c), free(g);
}

static void test_softmax(void) {
  enum { N = 256, K = 300, B = 32 };
  float *z = malloc(N * K * sizeof *z), *v = malloc(K * sizeof *v), *sink = malloc(N * sizeof *sink);
  float o[N], p[N], go[N], gp[N];
  h_fill(z, N * K, &seed, -8, 8), h_fill(v, K, &seed, -1, 1), h_fill(sink, N, &seed, -4, 4);
  nc_c_softmax(o, z, v, sink, N, K, B, 0);
  nc_c_softmax(p, z, v, sink, N, K, B, 1);
  /* o = sum w v / (sum w + e^sink): each w = e^(z - m) carries expf's 1 ulp
   * and the rounding of z - m (|z - m| <= 16: 16 u relative), each rescale
   * (at most K/B + 2, and the merge's) the same again; the sums gamma(K).
   * Against sum w |v| / sum w <= max |v| = 1. */
  const double bound = 2 * h_gamma(K) + 40.0 * (K / B + 3) * H_U32;
  for (int i = 0; i < N; i++) {
    double m = sink[i], l, a = 0;
    for (int k = 0; k < K; k++) m = fmax(m, z[i * K + k]);
    l = exp(sink[i] - m);
    for (int k = 0; k < K; k++) l += exp(z[i * K + k] - m), a += exp(z[i * K + k] - m) * v[k];
    EXPECT(fabs(o[i] - a / l) <= bound && fabs(p[i] - a / l) <= bound, "softmax row %d: %.9g / split %.9g, float64 %.9g",
           i, o[i], p[i], a / l);
  }
  if (have_nvcc) {
    nc_nvcc_softmax(go, z, v, sink, N, K, B, 0), nc_nvcc_softmax(gp, z, v, sink, N, K, B, 1);
    EXPECT(!memcmp(o, go, sizeof o) && !memcmp(p, gp, sizeof p), "softmax: the nvcc build differs from the C build");
  }
  /* no sink and no entry: 0; a sink alone: 0 (acc 0) */
  struct op_hd_online st = op_hd_online_start(0, 0.0f);
  EXPECT(op_hd_online_out(0.0f, st.l) == 0.0f && st.m == -INFINITY, "an empty softmax is not 0");
  free(z), free(v), free(sink);
}

int main(void) {
  printf("nvcc build of the core: %s\n", have_nvcc ? "compared" : "not built (CEDAR_CUDA=OFF): C checks only");
  test_codes();
  test_float_rules();
  test_scaled_and_e8m0();
  test_engram();
  test_sinkhorn();
  test_softmax();
  return h_report("num core");
}

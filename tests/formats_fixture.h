/* formats_fixture.h: what the tests/test_formats_*.c files share. Their
 * EXPECT (it counts every check, and prints the first 40 failures) and
 * formats_report (main's verdict); independent float64 references of the
 * element codecs (table scans, never the code under test); a seeded
 * splitmix64 stream; sentinel-fenced byte buffers; and the five block
 * formats of ops/formats.h behind one enum (fmt_bytes, fmt_pack,
 * fmt_unpack).
 *
 * What it is not: a test by itself (no main), nor tests/harness.h (whose
 * EXPECT it must not meet in one file). Everything here is static so that
 * each test executable has its own counters and random stream; functions
 * are static inline so a test compiles only what it uses.
 *
 * Tested through its users: ctest --test-dir build -R '^formats_'.
 */
#ifndef CEDAR_TESTS_FORMATS_FIXTURE_H
#define CEDAR_TESTS_FORMATS_FIXTURE_H

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

static inline double ref_e2m1(int code) { /* the SPEC 4.1 table, written out */
         static const double mag[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
         return (code & 8) ? -mag[code & 7] : mag[code & 7];
       }
       
       static inline double ref_e4m3(int code) { /* OCP E4M3FN; NaN codes return NAN */
         int e = (code >> 3) & 15, m = code & 7;
         if (e == 15 && m == 7)
           return NAN;
         double v = e == 0 ? ldexp(m / 8.0, -6) : ldexp(1.0 + m / 8.0, e - 7);
         return (code & 0x80) ? -v : v;
       }
       
       /* Nearest positive code (0..maxcode) to |v| by scanning the table; ties go to
        * the even code (mantissa LSB 0). Values beyond the max pick the max, which
        * is saturation. The sign bit is copied from v. */
       static inline int ref_nearest(double v, double (*tab)(int), int maxcode, int signbit_) {
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
static inline int ref_e4m3_up(double a, double mult) {
  for (int c = 0; c <= 0x7E; c++)
    if (ref_e4m3(c) * mult >= a)
      return c;
  return 0x7E;
}

/* Smallest k in [-127, 127] with qmax * 2^k >= amax. */
static inline int ref_e8m0_ceil(double amax, double qmax) {
  for (int k = -127; k <= 127; k++)
    if (qmax * ldexp(1.0, k) >= amax)
      return k + 127;
  return 254;
}

/* floor(log2 amax) - 2, clamped, by scanning powers of two. */
static inline int ref_e8m0_ocp_e2m1(double amax) {
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
static inline double e2m1_bound(double a) {
  if (a > 6)
    return a - 6;
  return a < 2 ? 0.25 : a < 4 ? 0.5 : 1.0;
}

/* E4M3 points in the binade [2^k, 2^(k+1)) are 2^(k-3) apart (8 per binade),
 * and the subnormals below 2^-6 are 2^-9 apart; half of that. */
static inline double e4m3_bound(double a) {
  if (a < ldexp(1.0, -6))
    return ldexp(1.0, -10);
  int e;
  frexp(a, &e); /* a = f 2^e, f in [0.5, 1): floor(log2 a) = e - 1 */
  return ldexp(1.0, e - 1 - 4);
}

/* ---- helpers ----------------------------------------------------------- */

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static inline uint64_t rng_next(void) { /* splitmix64 */
         uint64_t z = (g_rng += 0x9E3779B97F4A7C15ull);
         z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
         z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
         return z ^ (z >> 31);
       }
       static inline double rng_unit(void) { return (double)(rng_next() >> 11) * 0x1p-53; }
       
       /* sign * [1, 2) * 2^[lo, hi), rounded to float: non-zero unless lo < -150. */
       static inline float rng_float(double lo, double hi) {
  double v = (1.0 + rng_unit()) * exp2(lo + (hi - lo) * rng_unit());
  return (float)((rng_next() & 1) ? -v : v);
}

static inline uint32_t fbits(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  return u;
}

/* Sentinels: every output buffer lives between two GUARD-byte fences. */
#define GUARD 64
#define FENCE 0xA5

static inline uint8_t *fenced(size_t n, uint8_t fill) {
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

static inline int fence_ok(const uint8_t *p, size_t n) {
  for (size_t i = 1; i <= GUARD; i++)
    if (p[-(ptrdiff_t)i] != FENCE || p[n + i - 1] != FENCE)
      return 0;
  return 1;
}

static inline void fenced_free(uint8_t *p) { free(p - GUARD); }

/* ---- block formats: one table-driven harness --------------------------- */

/* The SPEC formats, then the vendor's V4.1 rules (Appendix V #21) through
 * op_kv_pack: Main KV with RNE scales (floor 2^-9), MXFP4 with the 2^-126
 * floor, SWA E8M0 with vLLM's 1e-4 floor and PyPTO's 1e-4/448. */
enum fmt { F_MAIN, F_MX_CEIL, F_MX_OCP, F_FP8_F32, F_FP8_E8M0, F_MAIN_RNE, F_MX_FLOOR, F_FP8_VLLM, F_FP8_PYP };
static const char *const fmt_name[] = {"main-fp4", "mxfp4-ceil", "mxfp4-ocp", "swa-fp8-f32", "swa-fp8-e8m0",
                                       "main-fp4-rne", "mxfp4-floor", "swa-fp8-vllm", "swa-fp8-pyp"};
#define FLOOR_PYP (1e-4f / 448.0f)

static inline int is_fp8(enum fmt f) { return f == F_FP8_F32 || f == F_FP8_E8M0 || f == F_FP8_VLLM || f == F_FP8_PYP; }
static inline int is_vendor(enum fmt f) { return f >= F_MAIN_RNE; }
static inline enum op_scale_kind fp8_kind(enum fmt f) {
  return f == F_FP8_F32 ? OP_SCALE_FP32 : OP_SCALE_E8M0;
}
/* The op_kv_format of a vendor-rule fmt. */
static inline struct op_kv_format vendor_format(enum fmt f, int block, enum op_nibble_order o) {
  struct op_kv_format k = {OP_KV_E2M1, OP_KV_SCALE_E4M3, block, OP_KV_RNE, 0x1p-9f, o, false};
  if (f == F_MX_FLOOR) k.scale = OP_KV_SCALE_E8M0, k.rule = OP_KV_CEIL, k.floor = 0x1p-126f;
  if (f == F_FP8_VLLM || f == F_FP8_PYP)
    k.elem = OP_KV_E4M3, k.scale = OP_KV_SCALE_E8M0, k.rule = OP_KV_CEIL, k.floor = f == F_FP8_VLLM ? 1e-4f : FLOOR_PYP;
  return k;
}
static inline enum op_mx_rule mx_rule(enum fmt f) {
  return f == F_MX_OCP ? OP_MX_OCP : OP_MX_CEIL;
}

static inline size_t fmt_bytes(enum fmt f, int W, int block) {
  if (is_vendor(f)) {
    struct op_kv_format k = vendor_format(f, block, OP_NIBBLE_EVEN_LOW);
    return op_kv_bytes(&k, W);
  }
  if (f == F_MAIN)
    return op_fp4_bytes(W, block);
  return is_fp8(f) ? op_fp8_bytes(W, block, fp8_kind(f)) : op_mxfp4_bytes(W, block);
}

static inline void fmt_pack(enum fmt f, uint8_t *out, const float *x, int W, int block,
                            enum op_nibble_order o) {
  struct op_kv_format k = vendor_format(f, block, o);
  if (is_vendor(f))
    op_kv_pack(&k, out, x, W);
  else if (f == F_MAIN)
    op_fp4_pack(out, x, W, block, o);
  else if (is_fp8(f))
    op_fp8_pack(out, x, W, block, fp8_kind(f));
  else
    op_mxfp4_pack(out, x, W, block, mx_rule(f), o);
}

static inline void fmt_unpack(enum fmt f, float *y, const uint8_t *in, int W, int block,
                              enum op_nibble_order o) {
  struct op_kv_format k = vendor_format(f, block, o);
  if (is_vendor(f))
    op_kv_unpack(&k, y, in, W);
  else if (f == F_MAIN)
    op_fp4_unpack(y, in, W, block, o);
  else if (is_fp8(f))
    op_fp8_unpack(y, in, W, block, fp8_kind(f));
  else
    op_mxfp4_unpack(y, in, W, block, o);
}

/* main's verdict: 0 when every check passed, 1 otherwise. */
static inline int formats_report(const char *name) {
  if (g_fails) {
    fprintf(stderr, "%s: %d of %d checks FAILED\n", name, g_fails, g_checks);
    return 1;
  }
  printf("%s: all %d checks passed\n", name, g_checks);
  return 0;
}

#endif

/* test_formats_kv.c: every cache format a plan can name (op_kv_format,
 * ops/formats.h), and the vendor's V4.1 rules on hand-computed blocks.
 *
 * What it checks:
 *  - the vendor rules of Appendix V #21 on blocks worked out by hand: Main
 *    KV's RNE scale rounding down (amax 2000: s = 320, 2000 -> 6 s = 1920,
 *    where SPEC's round-up gives 352 and 2112), its floor (a zero block
 *    stores 0x01 = 2^-9), MXFP4's floor (zero block 0x01 = 2^-126), SWA's
 *    vLLM floor (amax 1e-6 -> 2^-13) against PyPTO's (2^-22), bf16 rounding
 *    before quantizing (1 + 2^-9 -> 1);
 *  - every element x scale x rule op_kv_check accepts, on random blocks with
 *    zeros, -0 and a poisoned block: op_kv_bytes equals the plan's
 *    accounting (plan_format_bytes, what `plan cost` counts), pack writes
 *    exactly those bytes (two fills, fences), each value decodes to
 *    decode(encode(x / s)) * s with the scale of the rule's definition
 *    (float64, from the element codecs), bf16 and f32 entries give the values
 *    back (bf16-rounded);
 *  - op_kv_check refuses scaled bf16/f32, unscaled e2m1/e4m3, a rule of the
 *    wrong scale type, odd e2m1 blocks and floors out of range, and the
 *    fixed-format wrappers (op_kv_fp4_format, ...) give op_fp4_pack's bytes.
 *
 * Run: ctest --test-dir build -R formats_kv --output-on-failure
 */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/formats.h"
#include "scheduler/plan.h"
#include "tests/harness.h"

static uint64_t rng = 0x243F6A8885A308D3ull;
static double unit(void) {
  rng = rng * 6364136223846793005ull + 1442695040888963407ull;
  return (double)(rng >> 11) * 0x1p-53;
}

static const struct op_kv_format VMAIN = {OP_KV_E2M1, OP_KV_SCALE_E4M3, 16, OP_KV_RNE, 0x1p-9f, OP_NIBBLE_EVEN_LOW, true};
static const struct op_kv_format VIDX = {OP_KV_E2M1, OP_KV_SCALE_E8M0, 32, OP_KV_CEIL, 0x1p-126f, OP_NIBBLE_EVEN_LOW, true};
static const struct op_kv_format VSWA = {OP_KV_E4M3, OP_KV_SCALE_E8M0, 32, OP_KV_CEIL, 1e-4f, OP_NIBBLE_EVEN_LOW, true};

static void test_vendor_examples(void) {
  float x[32] = {0};
  uint8_t b[64];
  float y[32];
  x[0] = 2000.0f; /* block 0: amax 2000, amax/6 = 333.3 -> RNE 320 (0x7A); block 1 all zero */
  x[1] = -100.0f;
  op_kv_pack(&VMAIN, b, x, 32);
  EXPECT(b[16] == 0x7A && op_e4m3_decode(b[16]) == 320.0f, "Main KV RNE scale: got 0x%02x, want 0x7A (320)", b[16]);
  EXPECT(b[17] == 0x01, "Main KV zero block: scale 0x%02x, want the floor 2^-9 (0x01)", b[17]);
  op_kv_unpack(&VMAIN, y, b, 32);
  /* 2000 / 320 = 6.25 saturates to 6; -100 / 320 = -0.3125 rounds to -0.5 */
  EXPECT(y[0] == 1920.0f && y[1] == -160.0f, "Main KV: 2000 -> %g (want 6 s = 1920), -100 -> %g (want -160)", y[0],
         y[1]);
  for (int i = 16; i < 32; i++) EXPECT(y[i] == 0.0f, "zero block decodes to 0, element %d = %g", i, y[i]);
  struct op_kv_format spec = VMAIN;
  spec.rule = OP_KV_ROUNDUP, spec.bf16 = false;
  op_kv_pack(&spec, b, x, 32);
  EXPECT(op_e4m3_decode(b[16]) == 352.0f && b[17] == 0x00, "SPEC round-up scale 0x%02x, zero block 0x%02x", b[16], b[17]);

  float k[32] = {0};
  op_kv_pack(&VIDX, b, k, 32);
  EXPECT(b[16] == 0x01, "MXFP4 zero block: scale 0x%02x, want 2^-126 (0x01)", b[16]);
  k[3] = 6 * 0x1p-130f; /* below the floor: still 2^-126 */
  op_kv_pack(&VIDX, b, k, 32);
  EXPECT(b[16] == 0x01, "MXFP4 tiny block: scale 0x%02x, want 0x01", b[16]);
  k[3] = 7.0f; /* ceil(log2(7/6)) = 1 */
  op_kv_pack(&VIDX, b, k, 32);
  EXPECT(b[16] == 128, "MXFP4 amax 7: scale 0x%02x, want 2^1 (0x80)", b[16]);

  float s[32] = {0};
  s[5] = 1e-6f;
  op_kv_pack(&VSWA, b, s, 32);
  EXPECT(b[32] == 127 - 13, "SWA vLLM floor: scale byte %d, want 2^-13 (%d)", b[32], 127 - 13);
  struct op_kv_format pyp = VSWA;
  pyp.floor = 1e-4f / 448.0f;
  op_kv_pack(&pyp, b, s, 32);
  EXPECT(b[32] == 127 - 22, "SWA PyPTO floor: scale byte %d, want 2^-22 (%d)", b[32], 127 - 22);
  s[5] = 448.0f * 3; /* s = 2^ceil(log2 3) = 4; 1344 / 4 = 336, a tie of 320 and 352: even 320 (0x7A) */
  op_kv_pack(&VSWA, b, s, 32);
  EXPECT(b[32] == 129 && b[5] == 0x7A, "SWA amax 1344: scale %d (want 129), code 0x%02x (want 320 = 0x7A)", b[32], b[5]);

  /* bf16 before quantizing: 1 + 2^-9 rounds to 1, so the block is exactly
   * representable; without it the E4M3 code rounds too, but the stored
   * float entry keeps it */
  struct op_kv_format f32 = {OP_KV_F32, OP_KV_SCALE_NONE, 0, OP_KV_FLOAT, 0, OP_NIBBLE_EVEN_LOW, true};
  float v = 1.0f + 0x1p-9f, got;
  uint8_t fb[4];
  op_kv_pack(&f32, fb, &v, 1);
  op_kv_unpack(&f32, &got, fb, 1);
  EXPECT(got == 1.0f, "f32 entry with bf16_round: %a, want 1", got);
  f32.bf16 = false;
  op_kv_pack(&f32, fb, &v, 1);
  op_kv_unpack(&f32, &got, fb, 1);
  EXPECT(got == v && fb[0] == 0x00 && fb[1] == 0x40 && fb[2] == 0x80 && fb[3] == 0x3F, "f32 entry: %a, bytes LE", got);
  EXPECT(op_bf16_round(1.0f + 0x1p-8f) == 1.0f && op_bf16_round(1.0f + 0x1p-8f + 0x1p-20f) == 1.0f + 0x1p-7f &&
             op_bf16_round(1.0f + 3 * 0x1p-8f) == 1.0f + 0x1p-6f && isinf(op_bf16_round(FLT_MAX)) &&
             isnan(op_bf16_round(NAN)) && signbit(op_bf16_round(-0.0f)),
         "bf16 rounding: ties to even, overflow to Inf, NaN, -0");
}

/* The scale a block must get, from the rule's definition in float64. */
static double want_scale(const struct op_kv_format *f, double amax) {
  const double qmax = f->elem == OP_KV_E2M1 ? 6 : 448;
  if (f->scale == OP_KV_SCALE_F32) return amax == 0 ? 0 : fmax((float)amax / (float)qmax, FLT_MIN);
  if (f->scale == OP_KV_SCALE_E4M3) {
    if (f->rule == OP_KV_ROUNDUP) { /* smallest E4M3 >= amax/qmax; 0 for a zero block */
      if (amax == 0) return 0;
      for (int c = 1; c <= 0x7E; c++)
        if (op_e4m3_decode((uint8_t)c) * qmax >= amax) return op_e4m3_decode((uint8_t)c);
      return 448;
    }
    double t = fmin(fmax(amax / qmax, f->floor), 448), best = 0; /* nearest E4M3, ties to even code */
    int bc = 0;
    for (int c = 0; c <= 0x7E; c++) {
      double d = fabs(op_e4m3_decode((uint8_t)c) - t), db = fabs(best - t);
      if (d < db || (d == db && !(c & 1))) best = op_e4m3_decode((uint8_t)c), bc = c;
    }
    (void)bc;
    return best;
  }
  int k = -127; /* E8M0 */
  if (f->rule == OP_KV_OCP) {
    int e;
    frexp(amax, &e);
    k = amax == 0 ? -127 : (e - 1) - (f->elem == OP_KV_E2M1 ? 2 : 8);
    return ldexp(1.0, k < -127 ? -127 : k);
  }
  double t = fmax(amax / qmax, f->floor);
  while (k < 127 && ldexp(1.0, k) < t) k++;
  return ldexp(1.0, k);
}

static double e2m1_nearest(double a) { /* RNE onto the E2M1 grid, saturating */
  static const double g[8] = {0, 0.5, 1, 1.5, 2, 3, 4, 6};
  double m = fabs(a), best = 0;
  int bc = 0;
  for (int c = 0; c < 8; c++) {
    double d = fabs(g[c] - m), db = fabs(best - m);
    if (d < db || (d == db && !(c & 1) && (bc & 1))) best = g[c], bc = c;
  }
  return copysign(best, a);
}

static void check_combo(const struct op_kv_format *f, int W) {
  size_t n = op_kv_bytes(f, W);
  struct plan_format pf = {(enum plan_elem)f->elem, (enum plan_scale)f->scale, f->block, PLAN_RULE_AUTO, 0, f->bf16};
  EXPECT(n > 0 && (int64_t)n == plan_format_bytes(&pf, W), "elem %d scale %d block %d: %zu bytes, plan counts %lld",
         f->elem, f->scale, f->block, n, (long long)plan_format_bytes(&pf, W));
  float *x = malloc(sizeof(float) * (size_t)W), *y = malloc(sizeof(float) * (size_t)W);
  uint8_t *a = malloc(n + 16), *b = malloc(n + 16);
  for (int rep = 0; rep < 20; rep++) {
    double top = ldexp(1.0, (int)(unit() * 40) - 20);
    for (int i = 0; i < W; i++) x[i] = (float)((2 * unit() - 1) * top);
    if (f->block > 0 && W / f->block >= 2) {
      for (int i = 0; i < f->block; i++) x[i] = i % 2 ? -0.0f : 0.0f; /* a zero block */
      if (f->scale != OP_KV_SCALE_NONE && rep % 3 == 0) x[f->block + 1] = NAN; /* a poisoned block */
    }
    memset(a, 0x00, n + 16), memset(b, 0xFF, n + 16);
    op_kv_pack(f, a, x, W), op_kv_pack(f, b, x, W);
    EXPECT(!memcmp(a, b, n) && a[n] == 0x00 && b[n] == 0xFF, "elem %d scale %d: pack wrote other than its %zu bytes",
           f->elem, f->scale, n);
    op_kv_unpack(f, y, a, W);
    int bad = 0;
    const int B = f->scale == OP_KV_SCALE_NONE ? W : f->block;
    for (int b0 = 0; b0 < W; b0 += B) {
      double amax = 0;
      bool finite = true;
      for (int i = b0; i < b0 + B; i++) {
        double v = f->bf16 ? op_bf16_round(x[i]) : x[i];
        finite &= isfinite(v);
        amax = fmax(amax, fabs(v));
      }
      for (int i = b0; i < b0 + B; i++) {
        float v = f->bf16 || f->elem == OP_KV_BF16 ? op_bf16_round(x[i]) : x[i];
        double want;
        if (f->scale == OP_KV_SCALE_NONE) {
          want = v;
        } else if (!finite) {
          want = NAN;
        } else {
          double s = want_scale(f, amax);
          double t = s == 0 ? 0 * v : f->scale == OP_KV_SCALE_F32 ? (double)(v / (float)s) : v / s;
          double q = f->elem == OP_KV_E2M1 ? e2m1_nearest(t) : (double)op_e4m3_decode(op_e4m3_encode((float)t));
          want = f->scale == OP_KV_SCALE_F32 ? (double)((float)q * (float)s) : q * s;
          if (s == 0) want = v; /* signed zero */
        }
        if (!(isnan(want) ? isnan(y[i]) : (y[i] == want && !signbit(y[i]) == !signbit(want))) && bad++ < 3)
          EXPECT(0, "elem %d scale %d rule %d block %d: x[%d] = %a -> %a, want %a", f->elem, f->scale, f->rule,
                 f->block, i, x[i], y[i], want);
      }
    }
  }
  free(x), free(y), free(a), free(b);
}

static void test_every_combo(void) {
  const struct { enum op_kv_elem e; enum op_kv_scale s; enum op_kv_rule r; float floor; } c[] = {
      {OP_KV_E2M1, OP_KV_SCALE_E4M3, OP_KV_RNE, 0x1p-9f},   {OP_KV_E2M1, OP_KV_SCALE_E4M3, OP_KV_ROUNDUP, 0},
      {OP_KV_E2M1, OP_KV_SCALE_E8M0, OP_KV_CEIL, 0x1p-126f}, {OP_KV_E2M1, OP_KV_SCALE_E8M0, OP_KV_OCP, 0},
      {OP_KV_E2M1, OP_KV_SCALE_F32, OP_KV_FLOAT, 0},        {OP_KV_E4M3, OP_KV_SCALE_E4M3, OP_KV_RNE, 0x1p-9f},
      {OP_KV_E4M3, OP_KV_SCALE_E4M3, OP_KV_ROUNDUP, 0},     {OP_KV_E4M3, OP_KV_SCALE_E8M0, OP_KV_CEIL, 1e-4f},
      {OP_KV_E4M3, OP_KV_SCALE_E8M0, OP_KV_OCP, 0},         {OP_KV_E4M3, OP_KV_SCALE_F32, OP_KV_FLOAT, 0},
      {OP_KV_BF16, OP_KV_SCALE_NONE, OP_KV_FLOAT, 0},       {OP_KV_F32, OP_KV_SCALE_NONE, OP_KV_FLOAT, 0},
  };
  for (size_t i = 0; i < sizeof c / sizeof c[0]; i++)
    for (int bf = 0; bf < 2; bf++)
      for (int nib = 0; nib < 2; nib++) {
        struct op_kv_format f = {c[i].e, c[i].s, c[i].s == OP_KV_SCALE_NONE ? 0 : 16, c[i].r, c[i].floor,
                                 (enum op_nibble_order)nib, bf};
        EXPECT(op_kv_check(&f, 64) == NULL, "combo %zu refused: %s", i, op_kv_check(&f, 64));
        check_combo(&f, 64);
        f.block = f.block ? 32 : 0;
        check_combo(&f, 96);
      }
}

static void test_refusals(void) {
  const struct op_kv_format bad[] = {
      {OP_KV_BF16, OP_KV_SCALE_E8M0, 32, OP_KV_CEIL, 0, 0, false}, {OP_KV_F32, OP_KV_SCALE_F32, 32, OP_KV_FLOAT, 0, 0, false},
      {OP_KV_E2M1, OP_KV_SCALE_NONE, 32, OP_KV_FLOAT, 0, 0, false}, {OP_KV_E4M3, OP_KV_SCALE_NONE, 32, OP_KV_FLOAT, 0, 0, false},
      {OP_KV_E2M1, OP_KV_SCALE_E8M0, 32, OP_KV_RNE, 0, 0, false},   {OP_KV_E2M1, OP_KV_SCALE_E4M3, 16, OP_KV_CEIL, 0, 0, false},
      {OP_KV_E2M1, OP_KV_SCALE_E4M3, 16, OP_KV_RNE, 0x1p-10f, 0, false}, {OP_KV_E2M1, OP_KV_SCALE_E8M0, 7, OP_KV_CEIL, 0, 0, false},
      {OP_KV_E4M3, OP_KV_SCALE_E8M0, 48, OP_KV_CEIL, 0, 0, false},  {OP_KV_E4M3, OP_KV_SCALE_F32, 32, OP_KV_CEIL, 0, 0, false},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
    EXPECT(op_kv_check(&bad[i], 64) != NULL && op_kv_bytes(&bad[i], 64) == 0, "format %zu accepted", i);
}

/* The fixed-format wrappers give the fixed packers' bytes. */
static void test_wrappers(void) {
  float x[128];
  for (int i = 0; i < 128; i++) x[i] = (float)((2 * unit() - 1) * 50);
  uint8_t a[600], b[600];
  struct op_kv_format f = op_kv_fp4_format(16, OP_NIBBLE_EVEN_HIGH);
  op_kv_pack(&f, a, x, 128), op_fp4_pack(b, x, 128, 16, OP_NIBBLE_EVEN_HIGH);
  EXPECT(!memcmp(a, b, op_fp4_bytes(128, 16)), "op_kv_fp4_format bytes");
  f = op_kv_mxfp4_format(32, OP_MX_OCP, OP_NIBBLE_EVEN_LOW);
  op_kv_pack(&f, a, x, 128), op_mxfp4_pack(b, x, 128, 32, OP_MX_OCP, OP_NIBBLE_EVEN_LOW);
  EXPECT(!memcmp(a, b, op_mxfp4_bytes(128, 32)), "op_kv_mxfp4_format bytes");
  f = op_kv_fp8_format(128, OP_SCALE_FP32);
  op_kv_pack(&f, a, x, 128), op_fp8_pack(b, x, 128, 128, OP_SCALE_FP32);
  EXPECT(!memcmp(a, b, op_fp8_bytes(128, 128, OP_SCALE_FP32)), "op_kv_fp8_format bytes");
}

int main(void) {
  test_vendor_examples();
  test_every_combo();
  test_refusals();
  test_wrappers();
  return h_report("formats_kv");
}

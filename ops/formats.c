/* formats.c: CPU reference for cedar's KV-cache storage formats.
 *
 * What it is: the numerical spec of E2M1 / E4M3 / E8M0 and of the Main-KV,
 * Indexer-K and SWA entry layouts declared in ops/formats.h. Plain portable C:
 * rounding is done on the float's bits with integer arithmetic, so the result
 * does not depend on the FPU rounding mode for the element codecs; the only
 * float arithmetic (x / s, q * s, amax / 448) is single IEEE operations.
 * The packers run faster block paths that give the same bytes (see "fast
 * block paths"); one of their float operations rounds in the default mode,
 * as x / s does.
 *
 * Decoding is table lookups (E2M1, E4M3) and exponent bits (E8M0), exact;
 * encoding is the integer rounding below (E2M1: exact midpoint compares).
 *
 * What it is not: a hardware conversion. A CUDA twin may use hardware
 * conversions only where they give the same bytes (check NaN handling: see
 * docs/formats.md).
 *
 * Test: ctest --test-dir build -R formats --output-on-failure
 */
#include "ops/formats.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/isa.h"
#include "ops/num_codec.h"
#include "base/check.h"

#define E2M1_MAX_CODE OP_HD_E2M1_MAX_CODE
#define E4M3_MAX_CODE OP_HD_E4M3_MAX_CODE
#define E4M3_NAN_CODE OP_HD_E4M3_NAN_CODE
#define E8M0_NAN_CODE OP_HD_E8M0_NAN_CODE
#define FP32_QNAN_BITS OP_HD_F32_QNAN_BITS

/* The codecs' bit helpers are the numeric core's (ops/num_codec.h), which
 * the CUDA kernels compile too. */
static inline uint32_t float_bits(float x) { return op_hd_bits(x); }
static inline float bits_float(uint32_t u) { return op_hd_float(u); }

/* ---- element codecs --------------------------------------------------- */

/* Counting midpoints (ops/num_codec.h); gives the codes the RNE magnitude
 * rounding gives for a < 6 (tests check every tie). */
uint8_t op_e2m1_encode(float x) { return op_hd_e2m1_encode(x); }

/* Every E2M1 value, indexed by code: bit 3 the sign (0x8 is -0.0f). */
static const float e2m1_value[16] = {
    0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};

/* The table above is the unpack loops'; it equals op_hd_e2m1_decode for
 * every code (tests/test_num_core.c). */
float op_e2m1_decode(uint8_t code) { return op_hd_e2m1_decode(code); }

uint8_t op_e4m3_encode(float x) { return op_hd_e4m3_encode(x); }

/* Every E4M3 value, indexed by code, as constant expressions (all exact in
 * float). Code = s eeee mmm: e == 0 is subnormal, m * 2^-9; otherwise
 * (1 + m/8) 2^(e-7) = (8 + m) 2^(e-10). 0x7F and 0xFF are NaN (both the same
 * positive quiet NaN); 0x80 is -0.0f. */
#define E4M3_SUBNORMALS(sg)                                                        \
  sg * 0 * 0x1p-9f, sg * 1 * 0x1p-9f, sg * 2 * 0x1p-9f, sg * 3 * 0x1p-9f,          \
      sg * 4 * 0x1p-9f, sg * 5 * 0x1p-9f, sg * 6 * 0x1p-9f, sg * 7 * 0x1p-9f
#define E4M3_BINADE(sg, p)                                                         \
  sg * 8 * p, sg * 9 * p, sg * 10 * p, sg * 11 * p, sg * 12 * p, sg * 13 * p,      \
      sg * 14 * p, sg * 15 * p
#define E4M3_LAST_BINADE(sg) /* e = 15: m = 7 is NaN, not 480 */                   \
  sg * 8 * 0x1p5f, sg * 9 * 0x1p5f, sg * 10 * 0x1p5f, sg * 11 * 0x1p5f,            \
      sg * 12 * 0x1p5f, sg * 13 * 0x1p5f, sg * 14 * 0x1p5f, NAN
#define E4M3_HALF(sg)                                                              \
  E4M3_SUBNORMALS(sg), E4M3_BINADE(sg, 0x1p-9f), E4M3_BINADE(sg, 0x1p-8f),         \
      E4M3_BINADE(sg, 0x1p-7f), E4M3_BINADE(sg, 0x1p-6f), E4M3_BINADE(sg, 0x1p-5f),  \
      E4M3_BINADE(sg, 0x1p-4f), E4M3_BINADE(sg, 0x1p-3f), E4M3_BINADE(sg, 0x1p-2f),  \
      E4M3_BINADE(sg, 0x1p-1f), E4M3_BINADE(sg, 0x1p0f), E4M3_BINADE(sg, 0x1p1f),    \
      E4M3_BINADE(sg, 0x1p2f), E4M3_BINADE(sg, 0x1p3f), E4M3_BINADE(sg, 0x1p4f),     \
      E4M3_LAST_BINADE(sg)
static const float e4m3_value[256] = {E4M3_HALF(1.0f), E4M3_HALF(-1.0f)};

/* The table above is the unpack loops'; it equals op_hd_e4m3_decode for
 * every code (tests/test_num_core.c). */
float op_e4m3_decode(uint8_t code) { return op_hd_e4m3_decode(code); }

uint8_t op_e4m3_roundup(float x) { return op_hd_e4m3_roundup(x); }

float op_e8m0_decode(uint8_t code) { return op_hd_e8m0_decode(code); }

uint8_t op_e8m0_scale(float amax, float qmax, enum op_mx_rule rule) {
  if (isnan(amax) || isinf(amax))
    return E8M0_NAN_CODE;
  if (!(amax > 0.0f))
    return 0x00; /* all-zero block: the smallest scale */
  int ea, eq;
  float fa = frexpf(amax, &ea), fq = frexpf(qmax, &eq); /* both in [0.5, 1) */
  int k;
  if (rule == OP_MX_OCP) {
    k = (ea - 1) - (eq - 1); /* floor(log2 amax) - floor(log2 qmax) */
  } else {
    /* Smallest k with qmax * 2^k >= amax. amax/qmax = (fa/fq) 2^(ea-eq) with
     * fa/fq in (0.5, 2), so k is ea-eq or ea-eq+1; the test is exact. */
    k = ea - eq + (fa > fq ? 1 : 0);
  }
  if (k < -127)
    k = -127;
  if (k > 127)
    k = 127;
  return (uint8_t)(k + 127);
}

/* ---- fast block paths -------------------------------------------------- */
/* The packers do not call the element codecs per element: per block they
 * take amax, scale code and payload from the helpers below, loops of
 * branch-free integer and compare code that GCC -O3 vectorizes with baseline
 * SSE2 (no per-lane shifts, no calls in the element loops). They give the
 * bytes the element codecs give for every input: a block reaching an element
 * loop is finite with a scale s > 0, or all zero and coded with s = 1, which
 * gives its signed zeros; a poisoned block gets its NaN scale and a zeroed
 * payload. Each helper's comment says why its bytes are the same;
 * tests/test_formats_*.c checks it byte for byte against the block loops as
 * they were before, built from the public element codecs (test_fast_paths_*:
 * every exponent and rounding boundary of the element and scale paths, and
 * random blocks of every kind and shape, both nibble orders and MX rules). */

#define F32_ABS_MASK 0x7FFFFFFFu
#define F32_INF_BITS 0x7F800000u
#define FAST_CHUNK 64

/* The bits of a block's amax. Non-negative floats order like their bit
 * patterns, and every NaN or Inf pattern is >= 0x7F800000, so the block is
 * finite iff the result is below that, and then it is the bits of max |x|
 * (-0 counts as +0). Signed compares: the masked patterns are below 2^31.
 * On long blocks AMAX_LANES partial maxima break the dependency chain of one
 * running max; short ones (16, 32) are faster as one loop. */
#define AMAX_LANES 16
static inline OP_ISA_BODY uint32_t block_amax_bits(const float *x /* (n) */, int n) {
  int32_t r = 0;
  int i = 0;
  if (n >= 4 * AMAX_LANES) {
    int32_t m[AMAX_LANES] = {0};
    for (; i + AMAX_LANES <= n; i += AMAX_LANES)
      for (int j = 0; j < AMAX_LANES; j++) {
        int32_t a = (int32_t)(float_bits(x[i + j]) & F32_ABS_MASK);
        m[j] = a > m[j] ? a : m[j];
      }
    for (int j = 0; j < AMAX_LANES; j++)
      r = m[j] > r ? m[j] : r;
  }
  for (; i < n; i++) {
    int32_t a = (int32_t)(float_bits(x[i]) & F32_ABS_MASK);
    r = a > r ? a : r;
  }
  return (uint32_t)r;
}

/* op_e4m3_encode(y) for |y| < 464, which is every y the packers pass: their
 * scales keep |x / s| <= 448 (an E8M0 s >= amax / 448 exactly), or within
 * a rounding of it (FP32 s = fl(amax / 448): |x / s| < 448 (1 + 2^-23)).
 * a = |y|; p = 2^floor(log2 a), at least 2^-6 (below that the quantum is
 * that of [2^-6, 2^-5), the subnormal 2^-9). c = p 2^20 has ulp(c) = p/8, the
 * E4M3 quantum of a's binade, and a < 2p keeps a + c in c's binade, so the
 * one float rounding of a + c rounds a to the grid, to nearest even, and
 * t = bits(a + c) - bits(c) is a / quantum: 8 + m (16 on a carry) in a
 * normal binade, the subnormal code 0..8 below 2^-6. Adding (e - 1) << 3,
 * e = log2(p) + 7 the E4M3 exponent, gives the code; a carry lands on the
 * next exponent, and 448 <= a < 464 lands on 448 (0x7E), which is the
 * saturation op_e4m3_encode applies there. The float add assumes the
 * default rounding mode, as x / s does (formats.h). */
static inline OP_ISA_BODY uint32_t e4m3_code_fast(float y) { return op_hd_e4m3_code_fast(y); }

/* E2M1 codes of x[i] / s, i < n, two per byte (element 2j in the low nibble
 * when even_shift is 0, the high one when 4), for s > 0 an E4M3 or E8M0
 * value, without dividing. op_e2m1_encode counts the midpoints T (0.25 ..
 * 5) below |y|, y = fl(x / s), with > or >= by the tie rule; here fl(|x| /
 * s) > T iff |x| > T s, and >= iff >=. T s is exact (T has at most 3
 * significant bits, s at most 4, and 2^-129 <= T s <= 5 * 448). At |x| = T s
 * the quotient is exactly T; the float next to T s on either side is more
 * than half an ulp of T away once divided by s (the float spacing at T s
 * over s is at least ulp(T) / m, m < 2 the significand of s), so the
 * rounding cannot bring it to T, nor tie to it. A tiny x whose quotient
 * underflows is far below 0.25 s either way. n is even; the codes go
 * through a FAST_CHUNK buffer. */
static inline OP_ISA_BODY void e2m1_block_pack(uint8_t *restrict p /* (n/2) */, const float *restrict x /* (n) */,
                                   int n, float s, int even_shift) {
  const struct op_hd_e2m1_thr t = op_hd_e2m1_thresholds(s);
  const int odd_shift = 4 - even_shift;
  uint32_t code[FAST_CHUNK];
  for (int i0 = 0; i0 < n; i0 += FAST_CHUNK) { /* m is even: n is, and i0 */
    int m = n - i0 < FAST_CHUNK ? n - i0 : FAST_CHUNK;
    for (int i = 0; i < m; i++)
      code[i] = op_hd_e2m1_code_scaled(x[i0 + i], &t);
    for (int j = 0; j < m / 2; j++)
      p[i0 / 2 + j] = (uint8_t)(code[2 * j] << even_shift | code[2 * j + 1] << odd_shift);
  }
}

/* E4M3 codes of x[i] / s, i < n, or of x[i] * r when r != 0: the caller
 * passes r = 1 / s for a power-of-two s (E8M0; 1 / s is exact for every
 * E8M0 value), where x * r is the correctly rounded x / s too, so the same
 * bits, and a multiply is cheaper. Not for other s: x * (1/s) differs from
 * x / s there. */
static inline OP_ISA_BODY void e4m3_block_pack(uint8_t *restrict p /* (n) */, const float *restrict x /* (n) */,
                                   int n, float s, float r) {
  uint32_t code[FAST_CHUNK];
  for (int i0 = 0; i0 < n; i0 += FAST_CHUNK) {
    int m = n - i0 < FAST_CHUNK ? n - i0 : FAST_CHUNK;
    if (r != 0.0f)
      for (int i = 0; i < m; i++)
        code[i] = e4m3_code_fast(x[i0 + i] * r);
    else
      for (int i = 0; i < m; i++)
        code[i] = e4m3_code_fast(x[i0 + i] / s);
    for (int i = 0; i < m; i++)
      p[i0 + i] = (uint8_t)code[i];
  }
}

/* op_e8m0_scale(amax, qmax, rule), or 0xFF for a poisoned block (amax bits
 * >= F32_INF_BITS), qmax 6 or 448, ceil 1 for OP_MX_CEIL. With amax = fa
 * 2^ea and qmax = fq 2^eq (frexp), the code is k + 127 with k = ea - eq
 * (OCP) or ea - eq + (fa > fq) (ceil); for a normal amax ea - eq is the
 * difference of the biased exponents and fa > fq compares the mantissa
 * fields. Clamped below at 0: a subnormal amax (or 0) gives k < -127 for
 * both qmax, as the clamp in op_e8m0_scale does. Never above 254: qmax >= 4
 * keeps k <= 127. A floor raises k to kmin: max is monotone, so
 * max(ceil(log2 amax/qmax), ceil(log2 floor)) = ceil(log2 max(amax/qmax,
 * floor)), the vendor's formula, computed exactly. */
static inline OP_ISA_BODY uint32_t e8m0_scale_fast(uint32_t amax_bits, uint32_t qmax_bits, int32_t ceil,
                                                 int32_t kmin) {
  return op_hd_e8m0_scale_bits(amax_bits, qmax_bits, ceil, kmin);
}

/* The Main-KV scale code of a block, branch-free: 0x00 for an all-zero
 * block, 0x7F for a poisoned one, else op_e4m3_roundup(amax / 6) raised to
 * 0x01 where amax / 6 underflows to 0: s = E4M3_roundup(amax/6) is then
 * the smallest E4M3 s with 6s >= amax (rounding amax/6 to float cannot move
 * it across an E4M3 value, docs/formats.md). The roundup of v = amax / 6:
 * above 448 it saturates; from 2^-6 up it rounds the bits up at bit 20 (3
 * mantissa bits kept, a carry runs into the exponent) and rebiases, which is
 * op_e4m3_roundup's round-to-nearest plus one code when that fell below v;
 * below, the subnormal k 2^-9 with k = 1 + the number of j = 1..7 with
 * j 2^-9 < v is the smallest at or above v, and 0x01 for v == 0. The
 * compares are on the bits (v >= 0 orders like them). */
static inline OP_ISA_BODY uint32_t fp4_scale_fast(uint32_t amax_bits) { return op_hd_fp4_scale_roundup(amax_bits); }

/* The vendor's Main-KV scale code (OP_KV_RNE): RNE_E4M3(clamp(amax / 6,
 * floor, 448)), 0x7F for a poisoned block. v = fl(amax / 6) rounds to the
 * same E4M3 value as the exact quotient: 6 t is never a float within 4 ulp(t)
 * of amax unless it is amax, so fl(amax / 6) cannot reach or cross a tie t of
 * the E4M3 grid (docs/formats.md s4). floor >= 2^-9 keeps v in e4m3_code_fast's
 * range (0 < v <= 448) and the scale above 0; amax = 0 gives the floor's code.
 * The scale may round down, so |x / s| may pass 6: E2M1 saturates there. */
static inline OP_ISA_BODY uint32_t fp4_scale_rne_fast(uint32_t amax_bits, float floor) {
  return op_hd_fp4_scale_rne(amax_bits, floor);
}

/* out[i] = decode(q_i) * s; q * s is exact for E4M3 and E8M0 scales. A NaN
 * scale makes the whole block NaN, including its zero codes. */
static inline OP_ISA_BODY void e2m1_block_unpack(float *restrict out /* (n) */, const uint8_t *restrict p /* (n/2) */,
                              int n, float s, enum op_nibble_order order) {
  const int even_shift = order == OP_NIBBLE_EVEN_LOW ? 0 : 4, odd_shift = 4 - even_shift;
  for (int j = 0; j < n / 2; j++) {
    out[2 * j] = e2m1_value[(p[j] >> even_shift) & 0xFu] * s;
    out[2 * j + 1] = e2m1_value[(p[j] >> odd_shift) & 0xFu] * s;
  }
}

static void check_fp4_dims(int W, int block, enum op_nibble_order order) {
  CEDAR_ASSERT_MSG(op_fp4_bytes(W, block) > 0,
                   "fp4 entry: W=%d block=%d (need W, block > 0, block even, "
                   "W %% block == 0)", W, block);
  CEDAR_ASSERT(order == OP_NIBBLE_EVEN_LOW || order == OP_NIBBLE_EVEN_HIGH);
}

/* ---- Main KV ---------------------------------------------------------- */

size_t op_fp4_bytes(int W, int block) {
  if (W <= 0 || block <= 0 || block % 2 != 0 || W % block != 0)
    return 0;
  return (size_t)W / 2 + (size_t)(W / block);
}

/* One Main-KV block: scale byte, then payload (zero when poisoned). */
static inline OP_ISA_BODY void fp4_block_pack(uint8_t *restrict p /* (n/2) */, uint8_t *restrict scale,
                                  const float *restrict x /* (n) */, int n, int even_shift, int rne,
                                  float floor) {
  uint32_t amax = block_amax_bits(x, n);
  uint32_t code = rne ? fp4_scale_rne_fast(amax, floor) : fp4_scale_fast(amax);
  float s = op_e4m3_decode((uint8_t)code);
  *scale = (uint8_t)code;
  if (code == E4M3_NAN_CODE)
    memset(p, 0, (size_t)n / 2);
  else
    e2m1_block_pack(p, x, n, s == 0.0f ? 1.0f : s, even_shift);
}

static inline OP_ISA_BODY void fp4_pack_rows_body(uint8_t *out, const float *x, int W, int block, int even_shift,
                                                 int rne, float floor) {
  uint8_t *scales = out + W / 2;
  /* The same code twice: with the SPEC block size as a constant GCC unrolls
   * the element loops. */
  if (block == OP_MAIN_KV_BLOCK)
    for (int b = 0; b < W / block; b++)
      fp4_block_pack(out + b * OP_MAIN_KV_BLOCK / 2, scales + b, x + b * OP_MAIN_KV_BLOCK,
                     OP_MAIN_KV_BLOCK, even_shift, rne, floor);
  else
    for (int b = 0; b < W / block; b++)
      fp4_block_pack(out + (size_t)b * block / 2, scales + b, x + (size_t)b * block, block,
                     even_shift, rne, floor);
}
/* fp4_pack_rows: the body above at the vector ISA op_isa() chose (isa.h). */
OP_ISA_KERNEL(fp4_pack_rows, (uint8_t * out, const float *x, int W, int block, int even_shift, int rne, float floor),
              (out, x, W, block, even_shift, rne, floor))

void op_fp4_pack(uint8_t *out, const float *x, int W, int block, enum op_nibble_order order) {
  check_fp4_dims(W, block, order);
  fp4_pack_rows(out, x, W, block, order == OP_NIBBLE_EVEN_LOW ? 0 : 4, 0, 0.0f);
}

void op_fp4_unpack(float *out, const uint8_t *in, int W, int block,
                   enum op_nibble_order order) {
  check_fp4_dims(W, block, order);
  const uint8_t *scales = in + W / 2;
  for (int b = 0; b < W / block; b++)
    e2m1_block_unpack(out + (size_t)b * block, in + (size_t)b * block / 2,
                      block, op_e4m3_decode(scales[b]), order);
}

/* ---- Indexer K (MXFP4) ------------------------------------------------ */

size_t op_mxfp4_bytes(int W, int block) { return op_fp4_bytes(W, block); }

/* One Indexer-K block: scale byte, then payload (zero when poisoned). */
static inline OP_ISA_BODY void mxfp4_block_pack(uint8_t *restrict p /* (n/2) */, uint8_t *restrict scale,
                                    const float *restrict x /* (n) */, int n, int ceil,
                                    int even_shift, int32_t kmin) {
  uint32_t code = e8m0_scale_fast(block_amax_bits(x, n), float_bits(6.0f), ceil, kmin);
  *scale = (uint8_t)code;
  if (code == E8M0_NAN_CODE)
    memset(p, 0, (size_t)n / 2);
  else
    e2m1_block_pack(p, x, n, op_e8m0_decode((uint8_t)code), even_shift);
}

static inline OP_ISA_BODY void mxfp4_pack_rows_body(uint8_t *out, const float *x, int W, int block, int ceil,
                                               int even_shift, int32_t kmin) {
  uint8_t *scales = out + W / 2;
  if (block == OP_INDEXER_K_BLOCK) /* as in op_fp4_pack */
    for (int b = 0; b < W / block; b++)
      mxfp4_block_pack(out + b * OP_INDEXER_K_BLOCK / 2, scales + b, x + b * OP_INDEXER_K_BLOCK,
                       OP_INDEXER_K_BLOCK, ceil, even_shift, kmin);
  else
    for (int b = 0; b < W / block; b++)
      mxfp4_block_pack(out + (size_t)b * block / 2, scales + b, x + (size_t)b * block, block,
                       ceil, even_shift, kmin);
}
/* mxfp4_pack_rows: the body above at the vector ISA op_isa() chose (isa.h). */
OP_ISA_KERNEL(mxfp4_pack_rows,
              (uint8_t * out, const float *x, int W, int block, int ceil, int even_shift, int32_t kmin),
              (out, x, W, block, ceil, even_shift, kmin))

void op_mxfp4_pack(uint8_t *out, const float *x, int W, int block, enum op_mx_rule rule,
                   enum op_nibble_order order) {
  check_fp4_dims(W, block, order);
  CEDAR_ASSERT(rule == OP_MX_CEIL || rule == OP_MX_OCP);
  mxfp4_pack_rows(out, x, W, block, rule == OP_MX_CEIL, order == OP_NIBBLE_EVEN_LOW ? 0 : 4, 0);
}

void op_mxfp4_unpack(float *out, const uint8_t *in, int W, int block,
                     enum op_nibble_order order) {
  check_fp4_dims(W, block, order);
  const uint8_t *scales = in + W / 2;
  for (int b = 0; b < W / block; b++)
    e2m1_block_unpack(out + (size_t)b * block, in + (size_t)b * block / 2,
                      block, op_e8m0_decode(scales[b]), order);
}

/* ---- SWA KV (FP8 E4M3) ------------------------------------------------ */

static size_t scale_width(enum op_scale_kind kind) {
  return kind == OP_SCALE_FP32 ? 4 : 1;
}

size_t op_fp8_bytes(int W, int block, enum op_scale_kind kind) {
  if (W <= 0 || block <= 0 || W % block != 0)
    return 0;
  if (kind != OP_SCALE_FP32 && kind != OP_SCALE_E8M0)
    return 0;
  return (size_t)W + (size_t)(W / block) * scale_width(kind);
}

static void check_fp8_dims(int W, int block, enum op_scale_kind kind) {
  CEDAR_ASSERT_MSG(op_fp8_bytes(W, block, kind) > 0,
                   "fp8 entry: W=%d block=%d kind=%d (need W, block > 0, "
                   "W %% block == 0, a known scale kind)", W, block, (int)kind);
}

/* Writes one block's scale at p and returns its value, NaN when the block
 * is poisoned (amax_bits >= F32_INF_BITS, see block_amax_bits). */
static float fp8_put_scale(uint8_t *p, enum op_scale_kind kind, uint32_t amax_bits, int32_t kmin) {
  if (kind == OP_SCALE_E8M0) {
    p[0] = (uint8_t)e8m0_scale_fast(amax_bits, float_bits(448.0f), 1, kmin);
    return op_e8m0_decode(p[0]);
  }
  uint32_t u = op_hd_f32_scale_bits(amax_bits, 448.0f); /* max(amax/448, FLT_MIN): x/s <= 448 */
  for (int i = 0; i < 4; i++)
    p[i] = (uint8_t)(u >> (8 * i)); /* little-endian whatever the host */
  return bits_float(u);
}

static float fp8_get_scale(const uint8_t *p, enum op_scale_kind kind) {
  if (kind == OP_SCALE_E8M0)
    return op_e8m0_decode(p[0]);
  uint32_t u = 0;
  for (int i = 0; i < 4; i++)
    u |= (uint32_t)p[i] << (8 * i);
  return bits_float(u);
}

static inline OP_ISA_BODY void fp8_pack_rows_body(uint8_t *out, const float *x, int W, int block,
                                             enum op_scale_kind kind, int32_t kmin) {
  uint8_t *scales = out + W;
  for (int b = 0; b < W / block; b++) {
    const float *xb = x + (size_t)b * block;
    uint8_t *pb = out + (size_t)b * block;
    float s = fp8_put_scale(scales + (size_t)b * scale_width(kind), kind, block_amax_bits(xb, block), kmin);
    if (isnan(s))
      memset(pb, 0x00, (size_t)block);
    else if (s == 0.0f) /* all-zero block (FP32 scale): x * 1 keeps the signed zeros */
      e4m3_block_pack(pb, xb, block, 1.0f, 1.0f);
    else
      e4m3_block_pack(pb, xb, block, s, kind == OP_SCALE_E8M0 ? 1.0f / s : 0.0f);
  }
}
/* fp8_pack_rows: the body above at the vector ISA op_isa() chose (isa.h). */
OP_ISA_KERNEL(fp8_pack_rows, (uint8_t * out, const float *x, int W, int block, enum op_scale_kind kind, int32_t kmin),
              (out, x, W, block, kind, kmin))

void op_fp8_pack(uint8_t *out, const float *x, int W, int block, enum op_scale_kind kind) {
  check_fp8_dims(W, block, kind);
  fp8_pack_rows(out, x, W, block, kind, 0);
}

void op_fp8_unpack(float *out, const uint8_t *in, int W, int block,
                   enum op_scale_kind kind) {
  check_fp8_dims(W, block, kind);
  const uint8_t *scales = in + W;
  for (int b = 0; b < W / block; b++) {
    float s = fp8_get_scale(scales + (size_t)b * scale_width(kind), kind);
    const uint8_t *pb = in + (size_t)b * block;
    float *ob = out + (size_t)b * block;
    for (int i = 0; i < block; i++) ob[i] = e4m3_value[pb[i]] * s;
  }
}

/* ---- cache formats: any element x scale (op_kv_format) ------------------ */
/* The four shipped combinations run the fast row packers above; the others
 * (E2M1 with an FP32 scale, E4M3 with an E4M3 scale or the OCP rule, bf16 and
 * f32 elements) run kv_pack_slow, which divides and calls the element codecs
 * per value: they are for study and comparison, not for speed. */

/* Branch-free, so the row loop in op_kv_pack vectorizes: a NaN is made
 * quiet and truncated (never rounded into Inf), the rest rounds to nearest
 * even on bit 16 (a carry runs into the exponent, up to Inf). */
static inline uint32_t bf16_round_bits(uint32_t u) { return op_hd_bf16_round_bits(u); }

float op_bf16_round(float x) { return bits_float(bf16_round_bits(float_bits(x))); }

static float kv_qmax(enum op_kv_elem e) { return e == OP_KV_E2M1 ? 6.0f : 448.0f; }
static size_t kv_scale_width(enum op_kv_scale s) {
  return s == OP_KV_SCALE_NONE ? 0 : s == OP_KV_SCALE_F32 ? 4 : 1;
}
static size_t kv_payload(enum op_kv_elem e, int W) {
  return e == OP_KV_E2M1 ? (size_t)W / 2 : e == OP_KV_E4M3 ? (size_t)W : e == OP_KV_BF16 ? 2 * (size_t)W : 4 * (size_t)W;
}

const char *op_kv_check(const struct op_kv_format *f, int W) {
  if (W <= 0) return "the entry width must be positive";
  if ((unsigned)f->elem > OP_KV_F32 || (unsigned)f->scale > OP_KV_SCALE_F32 || (unsigned)f->rule > OP_KV_FLOAT)
    return "unknown element, scale or scale_rule";
  if (f->elem == OP_KV_BF16 || f->elem == OP_KV_F32)
    return f->scale == OP_KV_SCALE_NONE ? NULL : "bf16 and f32 elements are stored unscaled: set `scale: none`";
  if (f->scale == OP_KV_SCALE_NONE) return "e2m1 and e4m3 elements need a scale: set `scale: e4m3`, `e8m0` or `f32`";
  if (f->block <= 0 || W % f->block) return "`block` must divide the entry width";
  if (f->elem == OP_KV_E2M1 && f->block % 2) return "e2m1 blocks must be even (two values per byte): set an even `block`";
  if (f->nibble != OP_NIBBLE_EVEN_LOW && f->nibble != OP_NIBBLE_EVEN_HIGH) return "unknown nibble order";
  switch (f->scale) {
    case OP_KV_SCALE_E4M3:
      if (f->rule != OP_KV_RNE && f->rule != OP_KV_ROUNDUP) return "e4m3 scales take `scale_rule: rne` or `roundup`";
      if (f->rule == OP_KV_RNE && !(f->floor >= 0x1p-9f && f->floor <= 448.0f))
        return "`scale_floor` of an rne e4m3 scale must lie in [2^-9, 448] (below 2^-9 the scale rounds to 0)";
      break;
    case OP_KV_SCALE_E8M0:
      if (f->rule != OP_KV_CEIL && f->rule != OP_KV_OCP) return "e8m0 scales take `scale_rule: ceil` or `ocp`";
      if (f->rule == OP_KV_CEIL && !(f->floor >= 0.0f && f->floor <= 0x1p127f))
        return "`scale_floor` of a ceil e8m0 scale must lie in [0, 2^127]";
      break;
    default:
      if (f->rule != OP_KV_FLOAT) return "f32 scales are amax/qmax as a float: remove `scale_rule`";
  }
  return NULL;
}

size_t op_kv_bytes(const struct op_kv_format *f, int W) {
  if (op_kv_check(f, W)) return 0;
  size_t n_scales = f->scale == OP_KV_SCALE_NONE ? 0 : (size_t)(W / f->block);
  return kv_payload(f->elem, W) + n_scales * kv_scale_width(f->scale);
}

/* ceil(log2 floor) + 127 clamped to [0, 254]; 0 without a floor. Exact. */
static int32_t e8m0_floor_code(float floor) { return op_hd_e8m0_floor_code(floor); }

/* One block's scale for the slow path: writes it at p, returns its value
 * (NaN when the block is poisoned, 0 for an all-zero block of an F32 or
 * roundup scale). */
static float kv_slow_scale(const struct op_kv_format *f, uint8_t *p, uint32_t amax_bits) {
  const float qmax = kv_qmax(f->elem), amax = bits_float(amax_bits);
  const int finite = amax_bits < F32_INF_BITS;
  if (f->scale == OP_KV_SCALE_E4M3) {
    uint8_t c;
    if (f->rule == OP_KV_RNE) {
      float v = amax / qmax;
      c = op_e4m3_encode(v < f->floor ? f->floor : v > 448.0f ? 448.0f : v);
    } else {
      c = op_e4m3_roundup(amax / qmax);
      if (amax > 0.0f && c == 0x00) c = 0x01; /* amax / qmax underflowed */
    }
    p[0] = finite ? c : E4M3_NAN_CODE;
    return op_e4m3_decode(p[0]);
  }
  if (f->scale == OP_KV_SCALE_E8M0) {
    uint8_t c = op_e8m0_scale(amax, qmax, f->rule == OP_KV_OCP ? OP_MX_OCP : OP_MX_CEIL);
    int32_t kmin = f->rule == OP_KV_CEIL ? e8m0_floor_code(f->floor) : 0;
    p[0] = !finite ? E8M0_NAN_CODE : c < kmin ? (uint8_t)kmin : c;
    return op_e8m0_decode(p[0]);
  }
  uint32_t u = op_hd_f32_scale_bits(amax_bits, qmax);
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(u >> (8 * i));
  return bits_float(u);
}

static void kv_pack_slow(const struct op_kv_format *f, uint8_t *out, const float *x, int W) {
  if (f->scale == OP_KV_SCALE_NONE) { /* bf16 or f32, little-endian */
    for (int i = 0; i < W; i++) {
      uint32_t u = float_bits(f->elem == OP_KV_BF16 ? op_bf16_round(x[i]) : x[i]);
      if (f->elem == OP_KV_BF16)
        out[2 * i] = (uint8_t)(u >> 16), out[2 * i + 1] = (uint8_t)(u >> 24);
      else
        for (int k = 0; k < 4; k++) out[4 * i + k] = (uint8_t)(u >> (8 * k));
    }
    return;
  }
  const int B = f->block, e2m1 = f->elem == OP_KV_E2M1, shift = f->nibble == OP_NIBBLE_EVEN_LOW ? 0 : 4;
  uint8_t *scales = out + kv_payload(f->elem, W);
  for (int b = 0; b < W / B; b++) {
    const float *xb = x + (size_t)b * B;
    float s = kv_slow_scale(f, scales + (size_t)b * kv_scale_width(f->scale), block_amax_bits(xb, B));
    for (int i = 0; i < B; i++) {
      unsigned c = isnan(s) ? 0u
                   : s == 0.0f ? (signbit(xb[i]) ? (e2m1 ? 0x8u : 0x80u) : 0u) /* all-zero block: signed zeros */
                   : e2m1 ? op_e2m1_encode(xb[i] / s) : op_e4m3_encode(xb[i] / s);
      size_t at = (size_t)b * B + (size_t)i;
      if (!e2m1)
        out[at] = (uint8_t)c;
      else if (i % 2 == 0)
        out[at / 2] = (uint8_t)(c << shift);
      else
        out[at / 2] |= (uint8_t)(c << (4 - shift));
    }
  }
}

void op_kv_pack(const struct op_kv_format *f, uint8_t *out, const float *x, int W) {
  const char *why = op_kv_check(f, W);
  CEDAR_ASSERT_MSG(!why, "op_kv_pack: W=%d: %s", W, why ? why : "");
  float small[1024], *r = NULL;
  if (f->bf16 && f->elem != OP_KV_BF16) { /* bf16 elements round anyway */
    r = W <= 1024 ? small : cedar_xmalloc((size_t)W * sizeof *r);
    for (int i = 0; i < W; i++) r[i] = bits_float(bf16_round_bits(float_bits(x[i])));
    x = r;
  }
  const int shift = f->nibble == OP_NIBBLE_EVEN_LOW ? 0 : 4;
  if (f->elem == OP_KV_E2M1 && f->scale == OP_KV_SCALE_E4M3)
    fp4_pack_rows(out, x, W, f->block, shift, f->rule == OP_KV_RNE, f->floor);
  else if (f->elem == OP_KV_E2M1 && f->scale == OP_KV_SCALE_E8M0)
    mxfp4_pack_rows(out, x, W, f->block, f->rule == OP_KV_CEIL, shift,
                    f->rule == OP_KV_CEIL ? e8m0_floor_code(f->floor) : 0);
  else if (f->elem == OP_KV_E4M3 && f->scale == OP_KV_SCALE_E8M0 && f->rule == OP_KV_CEIL)
    fp8_pack_rows(out, x, W, f->block, OP_SCALE_E8M0, e8m0_floor_code(f->floor));
  else if (f->elem == OP_KV_E4M3 && f->scale == OP_KV_SCALE_F32)
    fp8_pack_rows(out, x, W, f->block, OP_SCALE_FP32, 0);
  else
    kv_pack_slow(f, out, x, W);
  if (r && r != small) free(r);
}

void op_kv_unpack(const struct op_kv_format *f, float *out, const uint8_t *in, int W) {
  const char *why = op_kv_check(f, W);
  CEDAR_ASSERT_MSG(!why, "op_kv_unpack: W=%d: %s", W, why ? why : "");
  const int B = f->block;
  switch (f->elem) {
    case OP_KV_BF16:
      for (int i = 0; i < W; i++) out[i] = bits_float((uint32_t)in[2 * i] << 16 | (uint32_t)in[2 * i + 1] << 24);
      return;
    case OP_KV_F32:
      for (int i = 0; i < W; i++) {
        uint32_t u = 0;
        for (int k = 0; k < 4; k++) u |= (uint32_t)in[4 * i + k] << (8 * k);
        out[i] = bits_float(u);
      }
      return;
    case OP_KV_E2M1: {
      const uint8_t *scales = in + W / 2;
      for (int b = 0; b < W / B; b++) {
        float s = f->scale == OP_KV_SCALE_E4M3   ? op_e4m3_decode(scales[b])
                  : f->scale == OP_KV_SCALE_E8M0 ? op_e8m0_decode(scales[b])
                                                 : fp8_get_scale(scales + 4 * (size_t)b, OP_SCALE_FP32);
        e2m1_block_unpack(out + (size_t)b * B, in + (size_t)b * B / 2, B, s, f->nibble);
      }
      return;
    }
    case OP_KV_E4M3:
      for (int b = 0; b < W / B; b++) {
        const uint8_t *sp = in + W + (size_t)b * kv_scale_width(f->scale);
        float s = f->scale == OP_KV_SCALE_E4M3   ? op_e4m3_decode(sp[0])
                  : f->scale == OP_KV_SCALE_E8M0 ? op_e8m0_decode(sp[0])
                                                 : fp8_get_scale(sp, OP_SCALE_FP32);
        for (int i = 0; i < B; i++) out[(size_t)b * B + i] = e4m3_value[in[(size_t)b * B + i]] * s;
      }
      return;
  }
}

/* num_codec.h: the element codecs and scale rules of cedar's storage formats,
 * one source for the CPU ops (ops/formats.c and everything that packs through
 * it) and the CUDA kernels (kernels/formats.cu): E2M1, E4M3 ("E4M3FN"), E8M0
 * (UE8M0), bf16, and the block scale rules of docs/formats.md and Appendix V
 * #21 (Main KV: E4M3 round-up or RNE(clamp(amax/6, floor, 448)); MXFP4 and
 * the SWA record: E8M0 ceil/OCP with a floor; FP32 amax/448).
 *
 * Every function here is integer work on a float's bits, exact compares, or
 * single IEEE operations through OP_HD_ADD/MUL/DIV (ops/num.h), so both
 * compilers give the same bits for every input: tests/test_num_core.c checks
 * each against the public op_* codecs of ops/formats.h on the CPU, and
 * tests/num_core_nvcc.cu compiles this header with nvcc and compares the two
 * builds exhaustively where the domain is small (every E4M3, E2M1 and E8M0
 * code, every threshold) and on a large random sample of floats.
 *
 * The rules (written out with their proofs in ops/formats.c and
 * docs/formats.md; a short reason beside each here):
 * - op_hd_e2m1_encode: round half to even, saturate to +-6, NaN -> 0x7;
 * - op_hd_e4m3_encode: RNE, saturate to +-448, NaN -> 0x7F;
 * - op_hd_e4m3_code_fast: the packers' E4M3 code of |y| < 464 by one float
 *   add on the grid; op_hd_e2m1_code_scaled: the E2M1 code of x / s by
 *   comparing |x| with the exact products T s (no division);
 * - op_hd_fp4_scale_roundup / _rne, op_hd_e8m0_scale_bits, op_hd_f32_scale:
 *   a block's scale code from the bits of its amax (max |x|, order-free).
 */
#ifndef CEDAR_OPS_NUM_CODEC_H
#define CEDAR_OPS_NUM_CODEC_H

#include <float.h>

#include "ops/num.h"

#define OP_HD_E2M1_MAX_CODE 0x7u  /* +6 */
#define OP_HD_E4M3_MAX_CODE 0x7Eu /* +448 */
#define OP_HD_E4M3_NAN_CODE 0x7Fu
#define OP_HD_E8M0_NAN_CODE 0xFFu
#define OP_HD_F32_QNAN_BITS 0x7FC00000u
#define OP_HD_F32_ABS_MASK 0x7FFFFFFFu
#define OP_HD_F32_INF_BITS 0x7F800000u
#define OP_HD_F32_MANT_MASK 0x7FFFFFu
#define OP_HD_E4M3_MAX_BITS 0x43E00000        /* 448.0f */
#define OP_HD_E4M3_MIN_NORMAL_BITS 0x3C800000 /* 0x1p-6f */

OP_HD_INLINE int op_hd_isnan_bits(uint32_t u) { return (u & OP_HD_F32_ABS_MASK) > OP_HD_F32_INF_BITS; }

/* ---- E2M1 ------------------------------------------------------------------ */

/* The nearest of 0, .5, 1, 1.5, 2, 3, 4, 6 is the number of midpoints (.25,
 * .75, 1.25, 1.75, 2.5, 3.5, 5) below |x|; a tie goes to the even code: up
 * (>=) where the code above is even, else down (>). Exact compares. */
OP_HD_INLINE uint8_t op_hd_e2m1_encode(float x) {
  const uint32_t u = op_hd_bits(x);
  if (op_hd_isnan_bits(u)) return OP_HD_E2M1_MAX_CODE; /* NaN -> +6 whatever its sign */
  const unsigned sign = (u >> 31) ? 0x8u : 0u;
  const float a = op_hd_float(u & OP_HD_F32_ABS_MASK);
  const unsigned q = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
  return (uint8_t)(sign | q);
}

/* The low nibble's value: (1 + m/2) 2^(e-1) for e = bits 2-1 > 0, m/2 for e
 * = 0, built from the bits (exact); 0x8 is -0.0f. */
OP_HD_INLINE float op_hd_e2m1_decode(uint8_t code) {
  const uint32_t c = code & 0xFu, e = (c >> 1) & 3u, m = c & 1u, sign = (c & 8u) << 28;
  const uint32_t mag = e ? ((e - 1u + 127u) << 23) | (m << 22) : (m ? 0x3F000000u /* 0.5 */ : 0u);
  return op_hd_float(sign | mag);
}

/* The E2M1 code of fl(x / s) for s > 0 (an E4M3 or E8M0 value, or 1 for an
 * all-zero block), without dividing: fl(|x| / s) > T iff |x| > T s (and >=
 * iff >=) because T s is exact and no float next to T s divides onto T
 * (ops/formats.c, e2m1_block_pack). t[k] = T_k s from op_hd_e2m1_thresholds. */
struct op_hd_e2m1_thr {
  float t[7];
};
OP_HD_INLINE struct op_hd_e2m1_thr op_hd_e2m1_thresholds(float s) {
  struct op_hd_e2m1_thr r;
  r.t[0] = OP_HD_MUL(0.25f, s), r.t[1] = OP_HD_MUL(0.75f, s), r.t[2] = OP_HD_MUL(1.25f, s);
  r.t[3] = OP_HD_MUL(1.75f, s), r.t[4] = OP_HD_MUL(2.5f, s), r.t[5] = OP_HD_MUL(3.5f, s);
  r.t[6] = OP_HD_MUL(5.0f, s);
  return r;
}
OP_HD_INLINE uint32_t op_hd_e2m1_code_scaled(float x, const struct op_hd_e2m1_thr *t) {
  const uint32_t u = op_hd_bits(x);
  const float a = op_hd_float(u & OP_HD_F32_ABS_MASK);
  return (u >> 28 & 0x8u) | (uint32_t)((a > t->t[0]) + (a >= t->t[1]) + (a > t->t[2]) + (a >= t->t[3]) +
                                       (a > t->t[4]) + (a >= t->t[5]) + (a > t->t[6]));
}

/* ---- E4M3 ------------------------------------------------------------------ */

/* m >> shift rounded to nearest, ties to even; 1 <= shift <= 31. */
OP_HD_INLINE uint32_t op_hd_rne_shift(uint32_t m, int shift) {
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1u), half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) q++;
  return q;
}

/* The magnitude code of the minifloat (mbits mantissa bits, bias `bias`,
 * subnormals, no Inf) nearest to finite a >= 0 not above the format's
 * largest value, ties to even; a mantissa carry runs into the exponent. */
OP_HD_INLINE unsigned op_hd_rne_magnitude(float a, int mbits, int bias) {
  const uint32_t u = op_hd_bits(a) & OP_HD_F32_ABS_MASK;
  int E = (int)(u >> 23);
  uint32_t M = u & OP_HD_F32_MANT_MASK;
  if (E == 0)
    E = 1; /* float subnormal: no hidden bit */
  else
    M |= 0x800000u;
  const int et = E - 127 + bias; /* biased exponent in the target */
  const int shift = 23 - mbits + (et < 1 ? 1 - et : 0);
  if (shift > 24) return 0; /* below half the smallest subnormal */
  const uint32_t q = op_hd_rne_shift(M, shift);
  return et >= 1 ? ((unsigned)(et - 1) << mbits) + q : q;
}

OP_HD_INLINE uint8_t op_hd_e4m3_encode(float x) {
  const uint32_t u = op_hd_bits(x);
  if (op_hd_isnan_bits(u)) return OP_HD_E4M3_NAN_CODE;
  const unsigned sign = (u >> 31) ? 0x80u : 0u;
  const float a = op_hd_float(u & OP_HD_F32_ABS_MASK);
  if (a >= 448.0f) return (uint8_t)(sign | OP_HD_E4M3_MAX_CODE);
  return (uint8_t)(sign | op_hd_rne_magnitude(a, 3, 7));
}

/* s eeee mmm: e == 0 is m 2^-9 (exact as float(m) * 2^-9), else (1 + m/8)
 * 2^(e-7) built from the bits; 0x7F and 0xFF are the same positive quiet NaN
 * (0x7FC00000); 0x80 is -0.0f. */
OP_HD_INLINE float op_hd_e4m3_decode(uint8_t code) {
  const uint32_t e = (code >> 3) & 0xFu, m = code & 7u, sign = (uint32_t)(code & 0x80u) << 24;
  if (e == 15u && m == 7u) return op_hd_float(OP_HD_F32_QNAN_BITS);
  if (e == 0u) return op_hd_float(sign | op_hd_bits(OP_HD_MUL((float)m, 0x1p-9f)));
  return op_hd_float(sign | ((e - 7u + 127u) << 23) | (m << 20));
}

/* The smallest E4M3 value >= x for x > 0 (saturating to 448), 0x00 for x <=
 * 0, 0x7F for NaN: positive codes order like their values, so one code up
 * from the nearest when that fell below x. */
OP_HD_INLINE uint8_t op_hd_e4m3_roundup(float x) {
  if (op_hd_isnan_bits(op_hd_bits(x))) return OP_HD_E4M3_NAN_CODE;
  if (!(x > 0.0f)) return 0x00;
  if (x > 448.0f) return OP_HD_E4M3_MAX_CODE;
  uint8_t c = op_hd_e4m3_encode(x);
  if (op_hd_e4m3_decode(c) < x) c++;
  return c;
}

/* op_hd_e4m3_encode(y) for |y| < 464 (every y the packers pass): p =
 * 2^floor(log2 |y|) at least 2^-6, c = p 2^20 has ulp(c) = the E4M3 quantum
 * of |y|'s binade, so the one rounding of |y| + c rounds |y| to the grid, to
 * nearest even; bits(|y| + c) - bits(c) is |y| / quantum, and the exponent
 * field is added back (a carry lands on the next binade; 448 <= |y| < 464
 * lands on 0x7E, the saturation). One OP_HD_ADD: the same bits on both sides. */
OP_HD_INLINE uint32_t op_hd_e4m3_code_fast(float y) {
  const uint32_t u = op_hd_bits(y), ua = u & OP_HD_F32_ABS_MASK;
  int32_t pb = (int32_t)(ua & OP_HD_F32_INF_BITS);
  pb = pb > OP_HD_E4M3_MIN_NORMAL_BITS ? pb : OP_HD_E4M3_MIN_NORMAL_BITS;
  const uint32_t cb = (uint32_t)pb + (20u << 23);
  const uint32_t t = op_hd_bits(OP_HD_ADD(op_hd_float(ua), op_hd_float(cb))) - cb;
  return (u >> 24 & 0x80u) | (t + ((uint32_t)pb >> 20) - (121u << 3));
}

/* ---- E8M0 ------------------------------------------------------------------ */

/* 2^(code - 127): codes 1..254 are exponent bits, 0 is the subnormal
 * 2^-127 (0x00400000), 0xFF is NaN. */
OP_HD_INLINE float op_hd_e8m0_decode(uint8_t code) {
  if (code == OP_HD_E8M0_NAN_CODE) return op_hd_float(OP_HD_F32_QNAN_BITS);
  return op_hd_float(code == 0 ? 0x00400000u : (uint32_t)code << 23);
}

/* The E8M0 scale code from the bits of a block's amax (>= 0, or a NaN/Inf
 * pattern for a poisoned block: 0xFF) and of qmax (6 or 448: normal, >= 4):
 * k = (biased exponent difference) + 1 when ceil and amax's mantissa field
 * exceeds qmax's, i.e. ceil(log2(amax/qmax)) exactly, or the OCP rule's
 * floor(log2 amax) - floor(log2 qmax) when ceil is 0; raised to kmin (the
 * floor's code, op_hd_e8m0_floor_code; 0: none) and never below 0 (a
 * subnormal or zero amax). */
OP_HD_INLINE uint32_t op_hd_e8m0_scale_bits(uint32_t amax_bits, uint32_t qmax_bits, int32_t ceil, int32_t kmin) {
  const int32_t up = (int32_t)(amax_bits & OP_HD_F32_MANT_MASK) > (int32_t)(qmax_bits & OP_HD_F32_MANT_MASK);
  int32_t k = (int32_t)(amax_bits >> 23) - (int32_t)(qmax_bits >> 23) + 127 + (up & ceil);
  k = k < kmin ? kmin : k;
  return amax_bits >= OP_HD_F32_INF_BITS ? OP_HD_E8M0_NAN_CODE : (uint32_t)k;
}

/* ceil(log2 floor) + 127 clamped to [0, 254]; 0 without a floor (floor <= 0
 * or NaN). From the bits: an exact power of two 2^e has no mantissa bits. */
OP_HD_INLINE int32_t op_hd_e8m0_floor_code(float floor) {
  if (!(floor > 0.0f)) return 0;
  const uint32_t u = op_hd_bits(floor);
  if (u >= OP_HD_F32_INF_BITS) return 254;
  int32_t k;
  if ((u >> 23) == 0) { /* subnormal M 2^-149: k = ceil(log2 M) - 149 */
    int32_t lg = 0;
    while ((1u << lg) < u) lg++;
    k = lg - 149;
  } else {
    k = (int32_t)(u >> 23) - 127 + ((u & OP_HD_F32_MANT_MASK) ? 1 : 0);
  }
  return k < -127 ? 0 : k > 127 ? 254 : k + 127;
}

/* ---- block scales (Appendix V #21) ----------------------------------------- */

/* Main KV, SPEC 4.2: E4M3_roundup(amax / 6) from amax's bits, branch-free;
 * 0x00 for an all-zero block, 0x7F for a poisoned one, 0x01 where amax / 6
 * underflows. (The proof: ops/formats.c, fp4_scale_fast.) */
OP_HD_INLINE uint32_t op_hd_fp4_scale_roundup(uint32_t amax_bits) {
  const float v = OP_HD_DIV(op_hd_float(amax_bits), 6.0f);
  const int32_t vb = (int32_t)op_hd_bits(v);
  const uint32_t normal = (((uint32_t)vb + 0xFFFFFu) >> 20) - (120u << 3);
  const uint32_t sub = 1u + (uint32_t)((vb > 0x3B000000) + (vb > 0x3B800000) + (vb > 0x3BC00000) +
                                       (vb > 0x3C000000) + (vb > 0x3C200000) + (vb > 0x3C400000) +
                                       (vb > 0x3C600000));
  uint32_t c = vb < OP_HD_E4M3_MIN_NORMAL_BITS ? sub : normal;
  c = vb > OP_HD_E4M3_MAX_BITS ? OP_HD_E4M3_MAX_CODE : c;
  c = amax_bits == 0 ? 0x00 : c;
  return amax_bits >= OP_HD_F32_INF_BITS ? OP_HD_E4M3_NAN_CODE : c;
}

/* Main KV, the vendor's (Appendix V #21): RNE_E4M3(clamp(amax / 6, floor,
 * 448)), floor >= 2^-9; fl(amax / 6) rounds to the same E4M3 value as the
 * exact quotient (docs/formats.md s4). 0x7F for a poisoned block. */
OP_HD_INLINE uint32_t op_hd_fp4_scale_rne(uint32_t amax_bits, float floor) {
  float v = OP_HD_DIV(op_hd_float(amax_bits & OP_HD_F32_ABS_MASK), 6.0f);
  v = v > floor ? v : floor; /* a NaN v takes the floor; replaced below */
  v = v < 448.0f ? v : 448.0f;
  const uint32_t c = op_hd_e4m3_code_fast(v);
  return amax_bits >= OP_HD_F32_INF_BITS ? OP_HD_E4M3_NAN_CODE : c;
}

/* An FP32 block scale's bits: max(fl(amax / qmax), FLT_MIN) for amax > 0 (a
 * normal s keeps x / s <= qmax), 0 for an all-zero block, the quiet NaN for
 * a poisoned one. */
OP_HD_INLINE uint32_t op_hd_f32_scale_bits(uint32_t amax_bits, float qmax) {
  const float amax = op_hd_float(amax_bits);
  float s = OP_HD_DIV(amax, qmax);
  if (s < FLT_MIN && amax > 0.0f) s = FLT_MIN;
  return amax_bits < OP_HD_F32_INF_BITS ? op_hd_bits(s) : OP_HD_F32_QNAN_BITS;
}

/* ---- bf16 ------------------------------------------------------------------ */

/* Round to nearest even on bit 16 (a carry runs into the exponent, up to
 * Inf); a NaN is made quiet and truncated, never rounded into Inf. */
OP_HD_INLINE uint32_t op_hd_bf16_round_bits(uint32_t u) {
  const uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
  return (u & OP_HD_F32_ABS_MASK) > OP_HD_F32_INF_BITS ? (u | 0x00400000u) & 0xFFFF0000u : r;
}
OP_HD_INLINE float op_hd_bf16_round(float x) { return op_hd_float(op_hd_bf16_round_bits(op_hd_bits(x))); }
/* The 16 stored bits of bf16(x), and a stored bf16 back to float (exact). */
OP_HD_INLINE uint16_t op_hd_bf16_encode(float x) { return (uint16_t)(op_hd_bf16_round_bits(op_hd_bits(x)) >> 16); }
OP_HD_INLINE float op_hd_bf16_decode(uint16_t b) { return op_hd_float((uint32_t)b << 16); }

#endif

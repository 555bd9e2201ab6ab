/* formats.h: the storage formats of cedar's KV caches (SPEC 4.1-4.4, R.2, R.9).
 *
 * What it is: the bit-exact CPU reference for the element codecs (E2M1, E4M3,
 * E8M0) and for packing one cache entry (a row of W floats) into bytes and
 * back: the Main-KV entry (E2M1 + one E4M3 scale per 16, 288 B at W = 512),
 * the Indexer-K entry (MXFP4: E2M1 + one E8M0 scale per 32, 68 B at W = 128)
 * and the SWA entry (E4M3 + an FP32 scale per block or an E8M0 scale per 32,
 * 528 B in the serving systems' layout). The byte layouts, rounding rules,
 * NaN/Inf policy and error bounds are written out in docs/formats.md; a CUDA
 * twin must reproduce these bytes exactly.
 *
 * What it is not: a cache. These functions take one entry's pointers and
 * dimensions and know nothing of pages, rings, plans or requests. They assume
 * the default IEEE rounding mode (round to nearest even) and no fast-math.
 *
 * Test: ctest --test-dir build -R formats --output-on-failure
 */
#ifndef CEDAR_OPS_FORMATS_H
#define CEDAR_OPS_FORMATS_H

#include <stddef.h>
#include <stdint.h>

/* Sizes of the SPEC entries, for static layouts and tests [A, SPEC 4.5]. */
#define OP_MAIN_KV_W 512
#define OP_MAIN_KV_BLOCK 16
#define OP_MAIN_KV_BYTES 288
#define OP_INDEXER_K_W 128
#define OP_INDEXER_K_BLOCK 32
#define OP_INDEXER_K_BYTES 68

/* Which element of a pair goes in a byte's low nibble (SPEC 4.1, [R]). */
enum op_nibble_order {
  OP_NIBBLE_EVEN_LOW = 0,  /* default: element 2j in bits 0-3, 2j+1 in bits 4-7 */
  OP_NIBBLE_EVEN_HIGH = 1, /* element 2j in bits 4-7, 2j+1 in bits 0-3 */
};

/* How an E8M0 (power-of-two) block scale is chosen from the block's amax. */
enum op_mx_rule {
  OP_MX_CEIL = 0, /* default [R-cfg, R.9]: 2^ceil(log2(amax/qmax)); nothing saturates */
  OP_MX_OCP = 1,  /* OCP MX: 2^(floor(log2(amax)) - floor(log2(qmax))); may saturate */
};

/* The kind of scale an SWA FP8 entry carries per block. */
enum op_scale_kind {
  OP_SCALE_FP32 = 0, /* s = max(amax/448, FLT_MIN), stored as 4 bytes little-endian */
  OP_SCALE_E8M0 = 1, /* s = 2^ceil(log2(amax/448)), stored as 1 byte (R.2, 528 B) */
};

/* ---- element codecs --------------------------------------------------- */

/* E2M1 (FP4): returns a 4-bit code (bit 3 sign, bits 2-1 exponent with bias
 * 1, bit 0 mantissa). Round half to even, saturate to +-6, -0 -> 0x8, NaN ->
 * 0x7 (+6) whatever its sign bit, +-Inf -> 0x7 / 0xF. */
uint8_t op_e2m1_encode(float x);
/* Decodes the low nibble of code; 0x8 decodes to -0.0f. */
float op_e2m1_decode(uint8_t code);

/* E4M3 ("E4M3FN": bias 7, no Inf, 0x7F/0xFF NaN, max 448, min 2^-9).
 * Round to nearest even, saturate to +-448 (+-Inf too), -0 -> 0x80, NaN ->
 * 0x7F whatever its sign bit. */
uint8_t op_e4m3_encode(float x);
float op_e4m3_decode(uint8_t code);
/* The smallest E4M3 value >= x, for x > 0; x > 448 and +Inf saturate to 448
 * (0x7E); x <= 0 gives 0x00; NaN gives 0x7F. Used for the Main-KV scale. */
uint8_t op_e4m3_roundup(float x);

/* E8M0: 2^(code - 127); 0xFF is NaN; 0x00 is 2^-127 (a float subnormal). */
float op_e8m0_decode(uint8_t code);
/* The E8M0 scale of a block whose largest magnitude is amax, for elements
 * whose largest finite value is qmax (6 for E2M1, 448 for E4M3). amax == 0
 * gives 0x00 (the smallest scale); NaN or Inf gives 0xFF; exponents outside
 * [-127, 127] are clamped. */
uint8_t op_e8m0_scale(float amax, float qmax, enum op_mx_rule rule);

/* ---- Main KV: E2M1 + one E4M3 scale per block (SPEC 4.2) --------------- */

/* Bytes of one entry: W/2 payload then W/block scales; 0 when the dims are
 * invalid (W and block positive, block even, W a multiple of block). */
size_t op_fp4_bytes(int W, int block);
/* Writes exactly op_fp4_bytes(W, block) bytes. Per block: s =
 * E4M3_roundup(amax/6), q = RNE_E2M1(x/s). An all-zero block stores scale
 * 0x00 and signed zero codes; a block holding NaN or Inf stores scale 0x7F
 * and zero payload bytes, so it decodes to NaN. */
void op_fp4_pack(uint8_t *out /* (op_fp4_bytes(W, block)) */,
                 const float *x /* (W) */, int W, int block,
                 enum op_nibble_order order);
void op_fp4_unpack(float *out /* (W) */,
                   const uint8_t *in /* (op_fp4_bytes(W, block)) */, int W,
                   int block, enum op_nibble_order order);

/* ---- Indexer K: MXFP4, E2M1 + one E8M0 scale per block (SPEC 4.3) ------- */

/* Same layout rules and size as op_fp4_bytes: W/2 payload then W/block scales. */
size_t op_mxfp4_bytes(int W, int block);
/* s = op_e8m0_scale(amax, 6, rule), q = RNE_E2M1(x/s) (saturating under
 * OP_MX_OCP); a block holding NaN or Inf stores scale 0xFF and zero payload. */
void op_mxfp4_pack(uint8_t *out /* (op_mxfp4_bytes(W, block)) */,
                   const float *x /* (W) */, int W, int block,
                   enum op_mx_rule rule, enum op_nibble_order order);
void op_mxfp4_unpack(float *out /* (W) */,
                     const uint8_t *in /* (op_mxfp4_bytes(W, block)) */, int W,
                     int block, enum op_nibble_order order);

/* ---- SWA KV: E4M3 + a scale per block (SPEC 4.4, R.2) ------------------ */

/* W payload bytes then W/block scales of 4 (FP32) or 1 (E8M0) bytes; 0 when
 * the dims are invalid (W and block positive, W a multiple of block). One
 * scale per entry is block == W. */
size_t op_fp8_bytes(int W, int block, enum op_scale_kind kind);
/* q = RNE_E4M3(x/s) saturating. FP32: an all-zero block stores s = 0 and
 * signed zero codes. A block holding NaN or Inf stores a NaN scale (FP32
 * 0x7FC00000 or E8M0 0xFF) and zero payload bytes. */
void op_fp8_pack(uint8_t *out /* (op_fp8_bytes(W, block, kind)) */,
                 const float *x /* (W) */, int W, int block,
                 enum op_scale_kind kind);
void op_fp8_unpack(float *out /* (W) */,
                   const uint8_t *in /* (op_fp8_bytes(W, block, kind)) */,
                   int W, int block, enum op_scale_kind kind);

#endif

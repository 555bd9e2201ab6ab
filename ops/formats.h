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

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus /* the CUDA twins in kernels/ include it */
extern "C" {
#endif

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

/* ---- the descriptors' checked calls ------------------------------------ */
/* What fp4/mxfp4/fp8 _pack and _unpack read from an op_io once the
 * parameters and input are checked and the output allocated
 * (ops/formats_desc.c), shared by the CPU runs and the CUDA twins
 * (kernels/formats.cu): rows of W floats <-> rows of `bytes` entry bytes. */
enum op_fmt_kind { OP_FMT_FP4 = 0, OP_FMT_MXFP4, OP_FMT_FP8 };
struct op_desc;
struct op_io;
struct op_fmt_call {
  enum op_fmt_kind kind;
  int block; /* values per scale (FP8's block 0 is W here) */
  enum op_nibble_order nibble;
  enum op_mx_rule rule;
  enum op_scale_kind scale;
  int64_t n;    /* rows */
  int W;        /* values per row */
  size_t bytes; /* bytes per packed row */
  const void *in; /* x (pack) or entries (unpack) */
  void *out;      /* entries (pack) or x (unpack) */
};
/* 0, or the status after op_io_fail. */
int op_fmt_prepare(const struct op_desc *self, struct op_io *io, enum op_fmt_kind kind, bool pack,
                   struct op_fmt_call *c);

/* ---- cache formats: every element x scale a plan can name ------------- */
/* One cache class's storage format, as a plan's `formats.<cache>` names it
 * (docs/formats.md s2.5, docs/plans.md): the element type, the scale type
 * and how it is chosen, values per scale, nibble order and whether values
 * are rounded to bf16 before they are quantized. An entry is the payload
 * (W elements) then W/block scales, in block order. op_kv_check says which
 * combinations are meaningful; the runtime stores every one it accepts. */
enum op_kv_elem { OP_KV_E2M1 = 0, OP_KV_E4M3, OP_KV_BF16, OP_KV_F32 };
enum op_kv_scale { OP_KV_SCALE_NONE = 0, OP_KV_SCALE_E4M3, OP_KV_SCALE_E8M0, OP_KV_SCALE_F32 };
enum op_kv_rule {
  OP_KV_RNE = 0, /* E4M3 scale: RNE_E4M3(clamp(amax/qmax, floor, 448)) (vendor V4.1 Main KV) */
  OP_KV_ROUNDUP, /* E4M3 scale: E4M3_roundup(amax/qmax), zero block 0x00 (SPEC 4.2) */
  OP_KV_CEIL,    /* E8M0 scale: 2^max(ceil(log2(amax/qmax)), ceil(log2 floor)) */
  OP_KV_OCP,     /* E8M0 scale: 2^(floor(log2 amax) - floor(log2 qmax)) (OCP MX) */
  OP_KV_FLOAT,   /* F32 scale: max(fl(amax/qmax), FLT_MIN), 0 for a zero block */
};

struct op_kv_format {
  enum op_kv_elem elem;
  enum op_kv_scale scale;
  int block;                  /* values per scale (ignored with OP_KV_SCALE_NONE) */
  enum op_kv_rule rule;       /* must suit `scale` (op_kv_check) */
  float floor;                /* OP_KV_RNE: >= 2^-9; OP_KV_CEIL: >= 0 (0: none, the 2^-127 clamp) */
  enum op_nibble_order nibble;
  bool bf16;                  /* round each value to bf16 (RNE) before quantizing */
};

/* NULL when f can store W-wide entries, else why not (a phrase naming the
 * field to change). */
const char *op_kv_check(const struct op_kv_format *f, int W);
/* Bytes of one entry; 0 when op_kv_check refuses. */
size_t op_kv_bytes(const struct op_kv_format *f, int W);
/* Writes exactly op_kv_bytes(f, W) bytes; asserts op_kv_check(f, W) == NULL.
 * A block holding NaN or Inf is poisoned as in the fixed formats (NaN scale,
 * zero payload); unscaled bf16/f32 elements keep NaN and Inf as they are. */
void op_kv_pack(const struct op_kv_format *f, uint8_t *out /* (op_kv_bytes) */, const float *x /* (W) */, int W);
void op_kv_unpack(const struct op_kv_format *f, float *out /* (W) */, const uint8_t *in /* (op_kv_bytes) */, int W);
/* The fixed formats above as op_kv_formats (the same bytes through op_kv_pack):
 * Main KV with round-up E4M3 scales (SPEC 4.2), MXFP4 without a floor, FP8. */
static inline struct op_kv_format op_kv_fp4_format(int block, enum op_nibble_order order) {
  return (struct op_kv_format){OP_KV_E2M1, OP_KV_SCALE_E4M3, block, OP_KV_ROUNDUP, 0.0f, order, false};
}
static inline struct op_kv_format op_kv_mxfp4_format(int block, enum op_mx_rule rule, enum op_nibble_order order) {
  return (struct op_kv_format){OP_KV_E2M1, OP_KV_SCALE_E8M0, block, rule == OP_MX_OCP ? OP_KV_OCP : OP_KV_CEIL, 0.0f,
                               order, false};
}
static inline struct op_kv_format op_kv_fp8_format(int block, enum op_scale_kind kind) {
  return (struct op_kv_format){OP_KV_E4M3, kind == OP_SCALE_E8M0 ? OP_KV_SCALE_E8M0 : OP_KV_SCALE_F32, block,
                               kind == OP_SCALE_E8M0 ? OP_KV_CEIL : OP_KV_FLOAT, 0.0f, OP_NIBBLE_EVEN_LOW, false};
}
/* bf16 rounding of a float, to nearest even, kept as a float; NaN stays a
 * quiet NaN, finite values past the bf16 range become +-Inf. */
float op_bf16_round(float x);

/* ---- activation rounding (ops/formats_act.c; docs/model.md s7, Appendix V #22) ---- */
/* Each of the n values of x rounded to bf16 (op_bf16_round), in place. */
void op_bf16_round_n(float *x, size_t n);
/* The floor of an MXFP8 block's amax (the vendor's act_quant: s from max(amax, 1e-4)). */
#define OP_MXFP8_AMAX_FLOOR 1e-4f
/* MXFP8 quantize-dequantize of rows (rows, cols) with leading dimension ld,
 * in place: per block of `block` consecutive columns s = 2^ceil(log2(max(amax,
 * OP_MXFP8_AMAX_FLOOR) / 448)) (amax / 448 a float division; an E8M0 value),
 * x = RNE_E4M3(x / s) * s (saturating at +-448). A block holding NaN or Inf
 * becomes NaN. When block does not divide cols, the last block is shorter. */
void op_mxfp8_qdq(float *x, int rows, int cols, int ld, int block);
/* A tap on op_mxfp8_qdq, for cedar's round trace (runtime/model/round_trace.h):
 * while fn is set on a thread, each op_mxfp8_qdq call of that thread hands
 * its output to fn(ctx, x, rows, cols, ld). */
struct op_qdq_tap {
  void (*fn)(void *ctx, const float *x, int rows, int cols, int ld);
  void *ctx;
};
#ifndef __cplusplus /* CUDA sources include this header; the tap is the CPU ops' */
extern _Thread_local struct op_qdq_tap op_qdq_tap;
#endif
#ifdef __cplusplus
}
#endif

#endif

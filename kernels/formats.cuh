/* formats.cuh: the CUDA twins of ops/formats.h's KV storage formats: pack
 * and unpack rows of entries in any op_kv_format the fast CPU paths store
 * (E2M1 + E4M3 scale by round-up or the vendor's RNE with a floor, E2M1 +
 * E8M0 ceil/OCP (MXFP4), E4M3 + E8M0 ceil (the V4.1 SWA record), E4M3 + FP32
 * scale; each with the bf16 pre-rounding), unpack of every element x scale,
 * and the slots of fp4/mxfp4/fp8 _pack and _unpack.
 *
 * Bits: every byte is the CPU's. Both sides compute a block's amax as the max
 * of |x|'s bits (order-free), its scale code and every element code through
 * the same core rules (ops/num_codec.h: op_hd_fp4_scale_roundup/_rne,
 * op_hd_e8m0_scale_bits, op_hd_f32_scale_bits, op_hd_e2m1_code_scaled,
 * op_hd_e4m3_code_fast, op_hd_bf16_round), with x / s and x * (1/s) as one
 * IEEE operation each (OP_HD_DIV/MUL). Unpacked floats are decode(code) * s,
 * exact, so the CPU's too, except that a NaN comes out as CUDA's canonical
 * NaN (0x7FFFFFFF) where the CPU keeps 0x7FC00000 (only poisoned blocks).
 *
 * Launch shapes: pack, one thread per (row, block) (128 per CTA); unpack,
 * one thread per (row, value). A kernel that produces KV (the compressor,
 * the SWA write) calls kern_kv_pack_block itself, so KV is written in its
 * storage format where it is made.
 */
#ifndef CEDAR_KERN_FORMATS_CUH
#define CEDAR_KERN_FORMATS_CUH

#include <cuda_runtime.h>
#include <stdint.h>

#include "ops/backend.h"
#include "ops/formats.h"
#include "ops/num_codec.h"

/* Whether the CUDA packer stores f (the fast CPU combinations); NULL when it
 * does, else why not. Unpack takes every format op_kv_check accepts. */
const char *kern_kv_pack_supported(const struct op_kv_format *f);

/* n entries of op_kv_bytes(f, W) bytes each (out) from n rows of W floats. */
cudaError_t kern_kv_pack_rows(const struct op_kv_format *f, uint8_t *out, const float *x, int64_t n, int W,
                              cudaStream_t st);
cudaError_t kern_kv_unpack_rows(const struct op_kv_format *f, float *out, const uint8_t *in, int64_t n, int W,
                                cudaStream_t st);

/* The activation roundings of ops/formats.h (formats_act.c), in place:
 * kern_bf16_round is op_bf16_round_n (one thread per value, the shared
 * op_hd_bf16_round: the CPU's bits); kern_mxfp8_qdq is op_mxfp8_qdq (one
 * thread per (row, block): amax, s = 2^ceil(log2(max(amax, 1e-4) / 448))
 * by frexpf/ldexpf as the CPU's pow2_ceil, x = decode(op_hd_e4m3_encode(x /
 * s)) * s with one IEEE rounding per division and product, a block with a
 * NaN or Inf all NaN: the CPU's bits). Used by the node-level CUDA op groups
 * (runtime/node_cuda_*.cu) for model.numerics. */
cudaError_t kern_bf16_round(float *x, int64_t n, cudaStream_t st);
cudaError_t kern_mxfp8_qdq(float *x, int rows, int cols, int ld, int block, cudaStream_t st);

/* A value as the packer sees it: bf16-rounded first when f.bf16. Then
 * block b of one entry (W values at x, entry bytes at e): the body of
 * kern_kv_pack_rows, for kernels that write KV where they make it; f must
 * be supported (kern_kv_pack_supported). */
__device__ __forceinline__ float kern_kv_load(const struct op_kv_format &f, const float *x, int i) {
  return f.bf16 ? op_hd_bf16_round(x[i]) : x[i];
}

__device__ __forceinline__ void kern_kv_pack_block(const struct op_kv_format &f, uint8_t *e, const float *x, int W, int b) {
  const int B = f.block;
  const float *xb = x + (size_t)b * B;
  uint32_t amax = 0; /* the max of |x|'s bits: NaN and Inf patterns are >= 0x7F800000 */
  for (int i = 0; i < B; i++) amax = max(amax, op_hd_bits(kern_kv_load(f, xb, i)) & OP_HD_F32_ABS_MASK);
  if (f.elem == OP_KV_E2M1) {
    uint8_t *p = e + (size_t)b * B / 2;
    uint32_t code;
    bool poisoned;
    float s;
    if (f.scale == OP_KV_SCALE_E4M3) {
      code = f.rule == OP_KV_RNE ? op_hd_fp4_scale_rne(amax, f.floor) : op_hd_fp4_scale_roundup(amax);
      poisoned = code == OP_HD_E4M3_NAN_CODE, s = op_hd_e4m3_decode((uint8_t)code);
    } else {
      const int32_t kmin = f.rule == OP_KV_CEIL ? op_hd_e8m0_floor_code(f.floor) : 0;
      code = op_hd_e8m0_scale_bits(amax, op_hd_bits(6.0f), f.rule == OP_KV_CEIL, kmin);
      poisoned = code == OP_HD_E8M0_NAN_CODE, s = op_hd_e8m0_decode((uint8_t)code);
    }
    e[W / 2 + b] = (uint8_t)code;
    const struct op_hd_e2m1_thr t = op_hd_e2m1_thresholds(s == 0.0f ? 1.0f : s);
    const int even = f.nibble == OP_NIBBLE_EVEN_LOW ? 0 : 4;
    for (int j = 0; j < B / 2; j++) {
      const uint32_t c0 = op_hd_e2m1_code_scaled(kern_kv_load(f, xb, 2 * j), &t);
      const uint32_t c1 = op_hd_e2m1_code_scaled(kern_kv_load(f, xb, 2 * j + 1), &t);
      p[j] = poisoned ? 0 : (uint8_t)(c0 << even | c1 << (4 - even));
    }
    return;
  }
  /* E4M3 elements */
  uint8_t *p = e + (size_t)b * B;
  float s, r = 0.0f;
  if (f.scale == OP_KV_SCALE_E8M0) {
    const uint32_t code = op_hd_e8m0_scale_bits(amax, op_hd_bits(448.0f), 1, op_hd_e8m0_floor_code(f.floor));
    e[W + b] = (uint8_t)code;
    s = op_hd_e8m0_decode((uint8_t)code);
    r = OP_HD_DIV(1.0f, s); /* exact: s is a power of two */
  } else {
    const uint32_t u = op_hd_f32_scale_bits(amax, 448.0f);
    uint8_t *sp = e + W + (size_t)b * 4;
    for (int k = 0; k < 4; k++) sp[k] = (uint8_t)(u >> (8 * k)); /* little-endian */
    s = op_hd_float(u);
    if (s == 0.0f) r = 1.0f; /* an all-zero block: x * 1 keeps the signed zeros */
  }
  const bool poisoned = op_hd_isnan_bits(op_hd_bits(s));
  for (int i = 0; i < B; i++) {
    const float v = kern_kv_load(f, xb, i);
    p[i] = poisoned ? 0 : (uint8_t)op_hd_e4m3_code_fast(r != 0.0f ? OP_HD_MUL(v, r) : OP_HD_DIV(v, s));
  }
}

/* Value i of an entry (bytes at e, W values) stored in f: decode(code) * s,
 * exact, as op_kv_unpack computes it. Every format op_kv_check accepts. */
__device__ __forceinline__ float kern_kv_scale_of(const struct op_kv_format &f, const uint8_t *sp) {
  if (f.scale == OP_KV_SCALE_E4M3) return op_hd_e4m3_decode(sp[0]);
  if (f.scale == OP_KV_SCALE_E8M0) return op_hd_e8m0_decode(sp[0]);
  return op_hd_float((uint32_t)sp[0] | (uint32_t)sp[1] << 8 | (uint32_t)sp[2] << 16 | (uint32_t)sp[3] << 24);
}

__device__ __forceinline__ float kern_kv_value(const struct op_kv_format &f, const uint8_t *e, int W, int i) {
  const int sw = f.scale == OP_KV_SCALE_F32 ? 4 : 1;
  switch (f.elem) {
    case OP_KV_BF16: return op_hd_float((uint32_t)e[2 * i] << 16 | (uint32_t)e[2 * i + 1] << 24);
    case OP_KV_F32:
      return op_hd_float((uint32_t)e[4 * i] | (uint32_t)e[4 * i + 1] << 8 | (uint32_t)e[4 * i + 2] << 16 |
                         (uint32_t)e[4 * i + 3] << 24);
    case OP_KV_E2M1: {
      const int shift = ((i & 1) ^ (f.nibble == OP_NIBBLE_EVEN_HIGH)) ? 4 : 0;
      const float s = kern_kv_scale_of(f, e + W / 2 + (size_t)(i / f.block) * sw);
      return OP_HD_MUL(op_hd_e2m1_decode((uint8_t)(e[i / 2] >> shift)), s);
    }
    default: /* E4M3 */
      return OP_HD_MUL(op_hd_e4m3_decode(e[i]), kern_kv_scale_of(f, e + W + (size_t)(i / f.block) * sw));
  }
}

extern "C" {
int kern_fp4_pack_run(const struct op_desc *self, struct op_io *io);
int kern_fp4_unpack_run(const struct op_desc *self, struct op_io *io);
int kern_mxfp4_pack_run(const struct op_desc *self, struct op_io *io);
int kern_mxfp4_unpack_run(const struct op_desc *self, struct op_io *io);
int kern_fp8_pack_run(const struct op_desc *self, struct op_io *io);
int kern_fp8_unpack_run(const struct op_desc *self, struct op_io *io);
}

#endif

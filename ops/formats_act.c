/* formats_act.c: rounding of activations (not of caches): bf16 rounding of a
 * buffer and the MXFP8 quantize-dequantize an FP8 linear applies to its input
 * (docs/model.md s7, Appendix V #22). The element codecs are formats.c's. */
#include <math.h>
#include <stdbool.h>

#include "base/check.h"
#include "ops/formats.h"

void op_bf16_round_n(float *x, size_t n) {
  for (size_t i = 0; i < n; i++) x[i] = op_bf16_round(x[i]);
}

/* 2^ceil(log2 v) for v > 0 finite, exactly: v = m 2^e with m in [0.5, 1);
 * log2 v is an integer (e - 1) only when m is 0.5. Clamped to E8M0's range. */
static float pow2_ceil(float v) {
  int e;
  float m = frexpf(v, &e);
  int k = m == 0.5f ? e - 1 : e;
  k = k < -127 ? -127 : k > 127 ? 127 : k;
  return ldexpf(1.0f, k);
}

_Thread_local struct op_qdq_tap op_qdq_tap;

void op_mxfp8_qdq(float *x, int rows, int cols, int ld, int block) {
  CEDAR_ASSERT(block > 0);
  for (int r = 0; r < rows; r++)
    for (int b = 0; b < cols; b += block) {
      int w = cols - b < block ? cols - b : block; /* a last, shorter block when block does not divide cols */
      float *v = x + (size_t)r * ld + b, amax = 0.0f;
      bool bad = false;
      for (int i = 0; i < w; i++) {
        bad |= !isfinite(v[i]);
        amax = fmaxf(amax, fabsf(v[i]));
      }
      if (bad) {
        for (int i = 0; i < w; i++) v[i] = NAN;
        continue;
      }
      float s = pow2_ceil(fmaxf(amax, OP_MXFP8_AMAX_FLOOR) / 448.0f);
      for (int i = 0; i < w; i++) v[i] = op_e4m3_decode(op_e4m3_encode(v[i] / s)) * s;
    }
  if (op_qdq_tap.fn) op_qdq_tap.fn(op_qdq_tap.ctx, x, rows, cols, ld);
}

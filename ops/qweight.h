/* qweight.h: a weight matrix in its stored format (struct op_qweight), the
 * description ops/qlinear.h's kernels and ops/lin_kernel.h's loaders share.
 *
 * What it is: the formats (F32, BF16, FP8 E4M3 with UE8M0 32 x 32 tile
 * scales, FP4 E2M1 with UE8M0 row-group scales; ops/qlinear.h says each
 * layout), their byte counts and checks. What it is not: code that decodes
 * (ops/lin_kernel.h) or multiplies (ops/qlinear.c, which also defines the
 * functions declared here).
 * Test: tests/test_ops_qlinear.c.
 */
#ifndef CEDAR_OPS_QWEIGHT_H
#define CEDAR_OPS_QWEIGHT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus /* the CUDA twins in kernels/ include it */
extern "C" {
#endif

enum op_wfmt { OP_W_F32 = 0, OP_W_BF16, OP_W_FP8, OP_W_FP4, OP_W_COUNT };

/* The tile of an FP8 scale (rows and columns) and the group of an FP4 one. */
#define OP_QW_BLOCK 32

/* A weight matrix (out, in) in its stored format; nothing is owned. */
struct op_qweight {
  enum op_wfmt fmt;
  int out, in;
  const void *data;     /* the elements, laid out as ops/qlinear.h says */
  const uint8_t *scale; /* FP8, FP4: the UE8M0 codes; else unused */
};

/* "f32", "bf16", "fp8", "fp4"; "?" past the list. */
const char *op_wfmt_name(enum op_wfmt fmt);
/* NULL when w can be used, else why not (a phrase naming the field). */
const char *op_qweight_check(const struct op_qweight *w);
/* Bytes of w's elements and of its scales, as stored (0 scales for F32 and
 * BF16). Their sum is what a GEMV over w must read. */
size_t op_qweight_data_bytes(const struct op_qweight *w);
size_t op_qweight_scale_bytes(const struct op_qweight *w);
/* The scale code of element (o, k): FP8 its tile's, FP4 its group's. */
static inline uint8_t op_qweight_scale_at(const struct op_qweight *w, int o, int k) {
  if (w->fmt == OP_W_FP8)
    return w->scale[(size_t)(o / OP_QW_BLOCK) * (size_t)((w->in + OP_QW_BLOCK - 1) / OP_QW_BLOCK) + k / OP_QW_BLOCK];
  return w->scale[(size_t)o * (size_t)(w->in / OP_QW_BLOCK) + k / OP_QW_BLOCK];
}

/* An F32 matrix (out, in) as a view: op_qlinear over it is op_linear. */
static inline struct op_qweight op_qw_f32(const float *W, int out, int in) {
  struct op_qweight q = {OP_W_F32, out, in, W, NULL};
  return q;
}
/* Rows [r0, r0 + rows) of w as a matrix of its own (a group of a grouped
 * projection, one expert of a stack). FP8 tiles cover 32 rows, so an FP8
 * r0 must be a multiple of OP_QW_BLOCK (its tile row starts there). */
static inline struct op_qweight op_qweight_rows(const struct op_qweight *w, int r0, int rows) {
  struct op_qweight q = *w;
  const size_t r = (size_t)r0, in = (size_t)w->in, B = OP_QW_BLOCK;
  q.out = rows;
  switch (w->fmt) {
    case OP_W_F32: q.data = (const float *)w->data + r * in; break;
    case OP_W_BF16: q.data = (const uint16_t *)w->data + r * in; break;
    case OP_W_FP8:
      q.data = (const uint8_t *)w->data + r * in;
      q.scale = w->scale + r / B * ((in + B - 1) / B);
      break;
    default: /* FP4 */
      q.data = (const uint8_t *)w->data + r * in / 2;
      q.scale = w->scale + r * (in / B);
      break;
  }
  return q;
}

#ifdef __cplusplus
}
#endif

#endif

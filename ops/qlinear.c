/* qlinear.c: linear layers from weights in their stored formats (see
 * qlinear.h); the kernel is ops/lin_kernel.h's, op_linear's own. */
#include "ops/qlinear.h"

#include <stdlib.h>
#include <string.h>

#include "ops/isa.h"
#include "ops/lin_kernel.h"
#include "ops/registry.h"
#include "base/check.h"

static const char *const wfmt_names[OP_W_COUNT] = {"f32", "bf16", "fp8", "fp4"};

const char *op_wfmt_name(enum op_wfmt fmt) { return fmt >= 0 && fmt < OP_W_COUNT ? wfmt_names[fmt] : "?"; }

const char *op_qweight_check(const struct op_qweight *w) {
  if (w->fmt < 0 || w->fmt >= OP_W_COUNT) return "fmt is not one of f32, bf16, fp8, fp4";
  if (w->out < 0 || w->in < 0) return "out and in must be >= 0";
  if (w->fmt == OP_W_FP4 && w->in % OP_QW_BLOCK)
    return "an fp4 row holds whole groups of 32: in must be a multiple of 32";
  if ((size_t)w->out * (size_t)w->in == 0) return NULL;
  if (!w->data) return "data is NULL";
  if ((w->fmt == OP_W_FP8 || w->fmt == OP_W_FP4) && !w->scale) return "scale is NULL (fp8 and fp4 carry UE8M0 scales)";
  return NULL;
}

size_t op_qweight_data_bytes(const struct op_qweight *w) {
  const size_t e = (size_t)w->out * (size_t)w->in;
  switch (w->fmt) {
    case OP_W_F32: return 4 * e;
    case OP_W_BF16: return 2 * e;
    case OP_W_FP8: return e;
    case OP_W_FP4: return e / 2;
    default: return 0;
  }
}

size_t op_qweight_scale_bytes(const struct op_qweight *w) {
  const size_t B = OP_QW_BLOCK;
  if (w->fmt == OP_W_FP8) return (((size_t)w->out + B - 1) / B) * (((size_t)w->in + B - 1) / B);
  if (w->fmt == OP_W_FP4) return (size_t)w->out * ((size_t)w->in / B);
  return 0;
}

/* ---- the kernels, cloned per ISA level (ops/isa.h) -------------------------- */

static inline OP_ISA_BODY void qdequant_body(float *W, const struct op_qweight *w) {
  switch (w->fmt) {
    case OP_W_BF16: lin_decode_rows(W, w, 0, w->out, OP_W_BF16); break;
    case OP_W_FP8: lin_decode_rows(W, w, 0, w->out, OP_W_FP8); break;
    case OP_W_FP4: lin_decode_rows(W, w, 0, w->out, OP_W_FP4); break;
    default: lin_decode_rows(W, w, 0, w->out, OP_W_F32); break;
  }
}

OP_ISA_KERNEL(qdequant, (float *W, const struct op_qweight *w), (W, w))

/* One copy of the kernel per format, so each keeps its loader inlined. */
static inline OP_ISA_BODY void qlin_kernel_body(float *y, const float *x, const struct op_qweight *w, int n, int ldx, int ldy,
                                         float *scratch) {
  switch (w->fmt) {
    case OP_W_BF16: lin_body(y, x, w, n, ldx, ldy, scratch, OP_W_BF16); break;
    case OP_W_FP8: lin_body(y, x, w, n, ldx, ldy, scratch, OP_W_FP8); break;
    case OP_W_FP4: lin_body(y, x, w, n, ldx, ldy, scratch, OP_W_FP4); break;
    default: lin_body(y, x, w, n, ldx, ldy, NULL, OP_W_F32); break;
  }
}

OP_ISA_KERNEL(qlin_kernel,
              (float *y, const float *x, const struct op_qweight *w, int n, int ldx, int ldy, float *scratch),
              (y, x, w, n, ldx, ldy, scratch))

void op_qweight_dequant(float *W, const struct op_qweight *w) {
  const char *why = op_qweight_check(w);
  CEDAR_ASSERT_MSG(!why, "op_qweight_dequant: %s", why);
  if (w->out > 0 && w->in > 0) qdequant(W, w);
}

void op_qlinear(float *y, const float *x, const struct op_qweight *w, int n, int ldx, int ldy) {
  const char *why = op_qweight_check(w);
  CEDAR_ASSERT_MSG(!why, "op_qlinear: %s", why);
  if (n <= 0 || w->out <= 0) return;
  if (w->in <= 0) {
    for (int i = 0; i < n; i++) memset(y + (size_t)i * ldy, 0, (size_t)w->out * sizeof *y);
    return;
  }
  /* Calls of many rows decode each panel once (lin_body): the scratch is one
   * panel of floats; without it the tiles decode as they go (same bits). */
  float *scratch = NULL;
  if (w->fmt != OP_W_F32 && n >= OP_QLINEAR_PANEL_ROWS) {
    size_t bytes = (size_t)lin_panel_rows(w->in) * (size_t)w->in * sizeof(float);
    scratch = aligned_alloc(64, (bytes + 63) & ~(size_t)63);
  }
  qlin_kernel(y, x, w, n, ldx, ldy, scratch);
  free(scratch);
}

/* ---- registry descriptor (ops/registry.h) ----------------------------------- */

/* Bytes per row of `in` elements, and `in` from a row of `bytes`. */
static int64_t row_bytes(enum op_wfmt f, int64_t in) {
  return f == OP_W_F32 ? 4 * in : f == OP_W_BF16 ? 2 * in : f == OP_W_FP8 ? in : in / 2;
}

int op_qlinear_prepare(const struct op_desc *self, struct op_io *io, struct op_qlinear_call *c) {
  int64_t fmt, xd[2], wd[2], sd[2];
  if (!op_io_param_int(self, io, "format", 0, OP_W_COUNT - 1, &fmt)) return CEDAR_EINVAL;
  const enum op_wfmt f = (enum op_wfmt)fmt;
  const struct op_tensor *x = op_io_in(self, io, "x", 2, xd);
  const struct op_tensor *w = x ? op_io_in(self, io, "w", 2, wd) : NULL;
  if (!w) return CEDAR_EINVAL;
  const int64_t in = xd[1];
  if (wd[1] != row_bytes(f, in) || (f == OP_W_FP4 && in % OP_QW_BLOCK))
    return op_io_fail(io,
                      "qlinear: w is (%lld, %lld) bytes but x rows have %lld values: a %s row of %lld values is %lld "
                      "bytes%s",
                      (long long)wd[0], (long long)wd[1], (long long)in, op_wfmt_name(f), (long long)in,
                      (long long)row_bytes(f, in), f == OP_W_FP4 ? " (and in must be a multiple of 32)" : "");
  c->w = (struct op_qweight){f, (int)wd[0], (int)in, w->data, NULL};
  bool ok = true;
  const struct op_tensor *s = op_io_in_opt(self, io, "scale", 2, sd, &ok);
  if (!ok) return CEDAR_EINVAL;
  if (f == OP_W_FP8 || f == OP_W_FP4) {
    int64_t want[2] = {f == OP_W_FP8 ? (wd[0] + OP_QW_BLOCK - 1) / OP_QW_BLOCK : wd[0],
                       f == OP_W_FP8 ? (in + OP_QW_BLOCK - 1) / OP_QW_BLOCK : in / OP_QW_BLOCK};
    if (!s) return op_io_fail(io, "qlinear: format %s needs the input 'scale' (UE8M0 codes)", op_wfmt_name(f));
    if (!op_io_dims_match(io, "qlinear", "scale", sd, want, 2, "w", wd, 2)) return CEDAR_EINVAL;
    c->w.scale = s->data;
  } else if (s) {
    return op_io_fail(io, "qlinear: format %s has no scales: drop the input 'scale'", op_wfmt_name(f));
  }
  float *y = op_io_out(self, io, "y", 2, (int64_t[]){xd[0], wd[0]});
  if (!y) return CEDAR_ENOMEM;
  c->x = x->data, c->y = y, c->n = (int)xd[0];
  return 0;
}

static int qlinear_run(const struct op_desc *self, struct op_io *io) {
  struct op_qlinear_call c = {0};
  int rc = op_qlinear_prepare(self, io, &c);
  if (!rc) op_qlinear(c.y, c.x, &c.w, c.n, c.w.in, c.w.out);
  return rc;
}

const struct op_desc op_desc_qlinear = {
    .name = "qlinear",
    .summary = "linear layer y = x W^T from W in its stored format (f32, bf16, fp8 32x32 UE8M0, fp4 1x32 UE8M0), "
               "bitwise linear over the dequantized W",
    .inputs = (const struct op_arg[]){{"x", OP_F32, "(n, in)", "rows"},
                                      {"w", OP_U8, "(out, row bytes)", "stored elements: 4 in, 2 in, in or in/2 bytes"},
                                      {"scale", OP_U8, "(sr, sc)", "UE8M0: fp8 (ceil(out/32), ceil(in/32)), fp4 (out, in/32)"},
                                      {0}},
    .outputs = (const struct op_arg[]){{"y", OP_F32, "(n, out)", "result"}, {0}},
    .params = (const struct op_param[]){{"format", OP_PARAM_INT, OP_W_FP8, "0 f32, 1 bf16, 2 fp8, 3 fp4"}, {0}},
    .run = qlinear_run,
};

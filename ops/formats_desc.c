/* formats_desc.c: the registry descriptors of the KV storage formats
 * (`cedar op fp4_pack`, `mxfp4_pack`, `fp8_pack` and their unpackers): rows of
 * W floats <-> rows of packed entry bytes, through ops/formats.h. Split from
 * formats.c, which holds the codecs and packers themselves.
 *
 * Test: tests/test_op_desc_attn.c (ctest -R op_desc_attn).
 */
#include <limits.h>
#include <stdbool.h>

#include "ops/formats.h"
#include "ops/registry.h"
#include "base/check.h"

/* ---- registry descriptors (ops/registry.h) ------------------------------ */
/* `cedar op fp4_pack` etc.: rows of W floats <-> rows of packed entry bytes.
 * The unpackers infer W from the row length and the block parameters.
 * Test: tests/test_op_desc_attn.c (ctest -R op_desc_attn). */


enum fmt_kind { FMT_FP4, FMT_MXFP4, FMT_FP8 };

/* The format parameters of one descriptor; fields it does not declare stay 0. */
struct fmt_args {
  enum fmt_kind kind;
  int block; /* values per scale; FP8: 0 = one scale per row */
  enum op_nibble_order nibble;
  enum op_mx_rule rule;
  enum op_scale_kind scale;
};

static bool fmt_read(const struct op_desc *self, struct op_io *io, enum fmt_kind kind, struct fmt_args *a) {
  double block, nibble = 0, rule = 0, scale = 0;
  *a = (struct fmt_args){.kind = kind};
  if (!op_io_param_in(self, io, "block", kind == FMT_FP8 ? 0 : 2, INT_MAX, &block)) return false;
  if (kind != FMT_FP8 && !op_io_param_in(self, io, "nibble", 0, 1, &nibble)) return false;
  if (kind == FMT_MXFP4 && !op_io_param_in(self, io, "scale_rule", 0, 1, &rule)) return false;
  if (kind == FMT_FP8 && !op_io_param_in(self, io, "scale", 0, 1, &scale)) return false;
  if (kind != FMT_FP8 && (int)block % 2 != 0)
    return op_io_fail(io, "%s: block %d must be even (two E2M1 values per byte)", self->name, (int)block), false;
  a->block = (int)block;
  a->nibble = (enum op_nibble_order)nibble;
  a->rule = (enum op_mx_rule)rule;
  a->scale = (enum op_scale_kind)scale;
  return true;
}

/* Bytes of one packed row of W values (0 when W does not fit the block). */
static size_t fmt_bytes(const struct fmt_args *a, int W) {
  if (a->kind == FMT_FP8) return op_fp8_bytes(W, a->block ? a->block : W, a->scale);
  return op_fp4_bytes(W, a->block);
}

/* The W whose packed row is `bytes` long, or -1 when there is none. A block
 * of `block` values takes block/2 + 1 bytes in the FP4 formats and block +
 * (1 or 4) in FP8; FP8 with block 0 is W + (1 or 4) bytes. */
static int64_t fmt_width(const struct fmt_args *a, int64_t bytes) {
  int64_t sw = a->scale == OP_SCALE_FP32 ? 4 : 1;
  if (a->kind == FMT_FP8 && a->block == 0) return bytes > sw ? bytes - sw : -1;
  int64_t unit = a->kind == FMT_FP8 ? a->block + sw : a->block / 2 + 1;
  int64_t W = bytes % unit == 0 ? bytes / unit * a->block : -1;
  return W > 0 && W <= INT_MAX ? W : -1;
}

static void fmt_pack_row(uint8_t *out, const float *x, int W, const struct fmt_args *a) {
  switch (a->kind) {
    case FMT_FP4: op_fp4_pack(out, x, W, a->block, a->nibble); break;
    case FMT_MXFP4: op_mxfp4_pack(out, x, W, a->block, a->rule, a->nibble); break;
    case FMT_FP8: op_fp8_pack(out, x, W, a->block ? a->block : W, a->scale); break;
  }
}

static void fmt_unpack_row(float *out, const uint8_t *in, int W, const struct fmt_args *a) {
  switch (a->kind) {
    case FMT_FP4: op_fp4_unpack(out, in, W, a->block, a->nibble); break;
    case FMT_MXFP4: op_mxfp4_unpack(out, in, W, a->block, a->nibble); break;
    case FMT_FP8: op_fp8_unpack(out, in, W, a->block ? a->block : W, a->scale); break;
  }
}

int op_fmt_prepare(const struct op_desc *self, struct op_io *io, enum op_fmt_kind kind, bool pack,
                   struct op_fmt_call *c) {
  struct fmt_args a;
  int64_t d[2];
  const struct op_tensor *t =
      fmt_read(self, io, (enum fmt_kind)kind, &a) ? op_io_in(self, io, pack ? "x" : "entries", 2, d) : NULL;
  if (!t) return CEDAR_EINVAL;
  int64_t W;
  size_t bytes;
  if (pack) {
    W = d[1], bytes = fmt_bytes(&a, (int)W);
    if (!bytes)
      return op_io_fail(io, "%s: rows of x have %lld values; need a positive multiple of block %d", self->name,
                        (long long)d[1], a.block);
  } else {
    W = fmt_width(&a, d[1]), bytes = (size_t)d[1];
    if (W < 0 || fmt_bytes(&a, (int)W) != (size_t)d[1])
      return op_io_fail(io, "%s: rows of entries have %lld bytes: no row width W packs to that with block %d",
                        self->name, (long long)d[1], a.block);
  }
  void *out = pack ? op_io_out(self, io, "entries", 2, (int64_t[]){d[0], (int64_t)bytes})
                   : op_io_out(self, io, "x", 2, (int64_t[]){d[0], W});
  if (!out) return CEDAR_ENOMEM;
  *c = (struct op_fmt_call){.kind = kind, .block = a.kind == FMT_FP8 && a.block == 0 ? (int)W : a.block,
                            .nibble = a.nibble, .rule = a.rule, .scale = a.scale, .n = d[0], .W = (int)W,
                            .bytes = bytes, .in = t->data, .out = out};
  return 0;
}

static int pack_run(const struct op_desc *self, struct op_io *io, enum fmt_kind kind) {
  struct op_fmt_call c = {0};
  struct fmt_args a;
  int rc = op_fmt_prepare(self, io, (enum op_fmt_kind)kind, true, &c);
  if (rc) return rc;
  a = (struct fmt_args){.kind = kind, .block = c.block, .nibble = c.nibble, .rule = c.rule, .scale = c.scale};
  for (int64_t i = 0; i < c.n; i++)
    fmt_pack_row((uint8_t *)c.out + (size_t)i * c.bytes, (const float *)c.in + (size_t)i * c.W, c.W, &a);
  return 0;
}

static int unpack_run(const struct op_desc *self, struct op_io *io, enum fmt_kind kind) {
  struct op_fmt_call c = {0};
  struct fmt_args a;
  int rc = op_fmt_prepare(self, io, (enum op_fmt_kind)kind, false, &c);
  if (rc) return rc;
  a = (struct fmt_args){.kind = kind, .block = c.block, .nibble = c.nibble, .rule = c.rule, .scale = c.scale};
  for (int64_t i = 0; i < c.n; i++)
    fmt_unpack_row((float *)c.out + (size_t)i * c.W, (const uint8_t *)c.in + (size_t)i * c.bytes, c.W, &a);
  return 0;
}

static int fp4_pack_run(const struct op_desc *self, struct op_io *io) { return pack_run(self, io, FMT_FP4); }
static int fp4_unpack_run(const struct op_desc *self, struct op_io *io) { return unpack_run(self, io, FMT_FP4); }
static int mxfp4_pack_run(const struct op_desc *self, struct op_io *io) { return pack_run(self, io, FMT_MXFP4); }
static int mxfp4_unpack_run(const struct op_desc *self, struct op_io *io) { return unpack_run(self, io, FMT_MXFP4); }
static int fp8_pack_run(const struct op_desc *self, struct op_io *io) { return pack_run(self, io, FMT_FP8); }
static int fp8_unpack_run(const struct op_desc *self, struct op_io *io) { return unpack_run(self, io, FMT_FP8); }

#define FMT_X_(what) {"x", OP_F32, "(n, W)", what}
#define FMT_NIBBLE_ {"nibble", OP_PARAM_INT, 0, "0: element 2j in the low nibble, 1: in the high one [R]"}

static const struct op_param fp4_params[] = {
    {"block", OP_PARAM_INT, 16, "values per E4M3 scale, even, divides W [A]"}, FMT_NIBBLE_, {0}};
static const struct op_param mxfp4_params[] = {
    {"block", OP_PARAM_INT, 32, "values per E8M0 scale, even, divides W [A]"},
    {"scale_rule", OP_PARAM_INT, 0, "E8M0 scale: 0 ceil 2^ceil(log2(amax/6)) [R-cfg, R.9], 1 OCP MX"},
    FMT_NIBBLE_,
    {0}};
static const struct op_param fp8_params[] = {
    {"block", OP_PARAM_INT, 0, "values per scale, divides W; 0 = one scale per row [R] (R.2 serving: 32)"},
    {"scale", OP_PARAM_INT, 0, "0: FP32 scale, 4 B little-endian [R]; 1: E8M0 scale, 1 B (R.2)"},
    {0}};

const struct op_desc op_desc_fp4_pack = {
    .name = "fp4_pack",
    .summary = "Main-KV entries: E2M1 + one E4M3 scale per block, row by row (SPEC 4.2)",
    .inputs = (const struct op_arg[]){FMT_X_("rows to pack (W = head_dim, 512 [A])"), {0}},
    .outputs = (const struct op_arg[]){{"entries", OP_U8, "(n, W/2 + W/block)", "packed rows (288 B at 512/16)"},
                                       {0}},
    .params = fp4_params,
    .run = fp4_pack_run,
};

const struct op_desc op_desc_fp4_unpack = {
    .name = "fp4_unpack",
    .summary = "dequantize Main-KV entries (E2M1 + E4M3 scales) to floats; W from the row length (SPEC 4.2)",
    .inputs = (const struct op_arg[]){{"entries", OP_U8, "(n, W/2 + W/block)", "packed rows, as fp4_pack writes"},
                                      {0}},
    .outputs = (const struct op_arg[]){FMT_X_("dequantized rows"), {0}},
    .params = fp4_params,
    .run = fp4_unpack_run,
};

const struct op_desc op_desc_mxfp4_pack = {
    .name = "mxfp4_pack",
    .summary = "Indexer-K entries: MXFP4, E2M1 + one E8M0 scale per block, row by row (SPEC 4.3)",
    .inputs = (const struct op_arg[]){FMT_X_("rows to pack (W = idx_dim, 128 [A])"), {0}},
    .outputs = (const struct op_arg[]){{"entries", OP_U8, "(n, W/2 + W/block)", "packed rows (68 B at 128/32)"},
                                       {0}},
    .params = mxfp4_params,
    .run = mxfp4_pack_run,
};

const struct op_desc op_desc_mxfp4_unpack = {
    .name = "mxfp4_unpack",
    .summary = "dequantize MXFP4 Indexer-K entries to floats; W from the row length (SPEC 4.3)",
    .inputs = (const struct op_arg[]){{"entries", OP_U8, "(n, W/2 + W/block)", "packed rows, as mxfp4_pack writes"},
                                      {0}},
    .outputs = (const struct op_arg[]){FMT_X_("dequantized rows"), {0}},
    .params = mxfp4_params,
    .run = mxfp4_unpack_run,
};

const struct op_desc op_desc_fp8_pack = {
    .name = "fp8_pack",
    .summary = "SWA entries: E4M3 + an FP32 or E8M0 scale per block, row by row (SPEC 4.4, R.2)",
    .inputs = (const struct op_arg[]){FMT_X_("rows to pack (W = head_dim, 512 [A])"), {0}},
    .outputs = (const struct op_arg[]){{"entries", OP_U8, "(n, W + W/block*(4|1))", "packed rows"}, {0}},
    .params = fp8_params,
    .run = fp8_pack_run,
};

const struct op_desc op_desc_fp8_unpack = {
    .name = "fp8_unpack",
    .summary = "dequantize FP8 SWA entries to floats; W from the row length (SPEC 4.4)",
    .inputs = (const struct op_arg[]){{"entries", OP_U8, "(n, W + W/block*(4|1))", "packed rows, as fp8_pack writes"},
                                      {0}},
    .outputs = (const struct op_arg[]){FMT_X_("dequantized rows"), {0}},
    .params = fp8_params,
    .run = fp8_unpack_run,
};

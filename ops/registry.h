/* registry.h: every op registered once (STYLE.md 2-3).
 *
 * CEDAR_OPS below is the one list of ops. It generates the op enum, the name
 * table that plans and traces use, and the table of descriptors that `cedar
 * op` runs (and, later, the StarPU codelet table). Adding an op edits this
 * list and its family's file pair, where the descriptor lives beside the op:
 *
 *   const struct op_desc op_desc_rmsnorm = {
 *       .name = "rmsnorm", .summary = "...",
 *       .inputs = (const struct op_arg[]){{"x", OP_F32, "(n, d)", "rows"}, ..., {0}},
 *       .outputs = ..., .params = ..., .run = rmsnorm_run};
 *
 * A descriptor's `run` reads named inputs and parameters through `struct
 * op_io` and allocates named outputs through it; it checks shapes and returns
 * a negative cedar_status through op_io_fail on bad input. ops/ still know
 * nothing of files: ops/op_io_mem.h backs op_io with memory, for the tests
 * and for `cedar op` (cli/cmd_op.c), which fills it from safetensors files.
 * Which code runs a descriptor (cpu, cuda) is ops/backend.h's table.
 */
#ifndef CEDAR_OPS_REGISTRY_H
#define CEDAR_OPS_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus /* the CUDA sources of kernels/ include it for the types */
extern "C" {
#endif

#define OP_MAX_DIMS 8

enum op_dtype { OP_F32 = 0, OP_I32, OP_I64, OP_U8 };

struct op_arg {
  const char *name;
  enum op_dtype dtype;
  const char *shape; /* documentation, e.g. "(n, d)" */
  const char *doc;
};

enum op_ptype { OP_PARAM_INT = 0, OP_PARAM_FLOAT, OP_PARAM_BOOL };

struct op_param {
  const char *name;
  enum op_ptype type;
  double def; /* SPEC's default */
  const char *doc;
};

/* A tensor handed to an op. */
struct op_tensor {
  enum op_dtype dtype;
  int ndim;
  int64_t shape[OP_MAX_DIMS];
  void *data;
};

/* The caller's side of a call: named inputs, outputs, parameters, errors. */
struct op_io {
  void *ctx;
  /* The input called `name`, or NULL when the caller has none. */
  const struct op_tensor *(*input)(struct op_io *io, const char *name);
  /* Allocate (zeroed) and register an output; NULL when out of memory.
   * `name` is the declared output name, a static string it may keep. */
  void *(*output)(struct op_io *io, const char *name, enum op_dtype dtype, int ndim, const int64_t *shape);
  /* Was parameter `name` given? If so its value in *out. */
  bool (*param)(struct op_io *io, const char *name, double *out);
  /* Record a user-facing error message. */
  void (*fail)(struct op_io *io, const char *msg);
};

struct op_desc {
  const char *name;
  const char *summary;
  const struct op_arg *inputs;    /* terminated by {0} */
  const struct op_arg *outputs;   /* terminated by {0} */
  const struct op_param *params;  /* terminated by {0}; may be NULL */
  int (*run)(const struct op_desc *self, struct op_io *io);
};

/* The one list of ops, grouped by family file. Keep each family's lines
 * together under its marker. */
#define CEDAR_OPS(X)                  \
  /* ops/basic.c */                   \
  X(embed)                            \
  X(rmsnorm)                          \
  X(linear)                           \
  /* ops/qlinear.c */                 \
  X(qlinear)                          \
  /* ops/rope.c */                    \
  X(rope)                             \
  /* ops/formats.c */                 \
  X(fp4_pack)                         \
  X(fp4_unpack)                       \
  X(mxfp4_pack)                       \
  X(mxfp4_unpack)                     \
  X(fp8_pack)                         \
  X(fp8_unpack)                       \
  /* ops/qkv.c */                     \
  X(q_latent)                         \
  X(q_main)                           \
  X(q_indexer)                        \
  X(index_weights)                    \
  X(swa_kv)                           \
  /* ops/compressor.c */              \
  X(compress)                         \
  /* ops/indexer.c */                 \
  X(indexer_topk)                     \
  X(reindex)                          \
  /* ops/attention.c */               \
  X(sparse_attn)                      \
  X(oproj)                            \
  /* ops/moe.c */                     \
  X(moe)                              \
  /* ops/mhc.c */                     \
  X(mhc_coeffs)                       \
  X(mhc_mix)                          \
  X(mhc_update)                       \
  X(mhc_merge)                        \
  /* ops/engram.c */                  \
  X(engram_hash)                      \
  X(engram_gather)                    \
  X(engram_inject)                    \
  /* ops/dspark.c */                  \
  X(dspark_draft)                     \
  X(dspark_confidence)                \
  X(dspark_verify_len)                \
  /* ops/sample.c */                  \
  X(sample)

enum op_id {
#define OP_ENUM_(name) OP_ID_##name,
  CEDAR_OPS(OP_ENUM_)
#undef OP_ENUM_
  OP_COUNT
};

#define OP_DECL_(name) extern const struct op_desc op_desc_##name;
CEDAR_OPS(OP_DECL_)
#undef OP_DECL_

extern const struct op_desc *const op_registry[OP_COUNT];
const char *op_name(enum op_id id);
const struct op_desc *op_find(const char *name);
const char *op_dtype_name(enum op_dtype t);
size_t op_dtype_size(enum op_dtype t);

/* ---- helpers for descriptors' run functions ---------------------------- */

/* Format an error into io->fail and return CEDAR_EINVAL. */
int op_io_fail(struct op_io *io, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* The input `name` of `self`, checked against its declared dtype and `ndim`;
 * its dims land in dims[0..ndim). NULL after op_io_fail when it is missing,
 * has the wrong dtype or rank, or a dim past INT_MAX (ops take int dims). */
const struct op_tensor *op_io_in(const struct op_desc *self, struct op_io *io, const char *name, int ndim,
                                 int64_t *dims);
/* The same for an input the op may go without: NULL when the caller has
 * none; when present it is checked as op_io_in does, and *ok becomes false
 * (after op_io_fail) when it is malformed. */
const struct op_tensor *op_io_in_opt(const struct op_desc *self, struct op_io *io, const char *name, int ndim,
                                     int64_t *dims, bool *ok);
/* Allocate output `name` of `self` with its declared dtype; NULL after
 * op_io_fail when out of memory. */
void *op_io_out(const struct op_desc *self, struct op_io *io, const char *name, int ndim, const int64_t *shape);
/* Parameter `name` of `self`: the caller's value or the declared default. */
double op_io_param(const struct op_desc *self, struct op_io *io, const char *name);
/* The same within [lo, hi], and integral when declared int or bool; false
 * after op_io_fail otherwise. */
bool op_io_param_in(const struct op_desc *self, struct op_io *io, const char *name, double lo, double hi,
                    double *out);
/* A float parameter that is finite and >= 0 (the epsilons); false after
 * op_io_fail otherwise. */
bool op_io_param_nonneg(const struct op_desc *self, struct op_io *io, const char *name, float *out);
/* "(a, b, c)" into buf; 192 bytes hold OP_MAX_DIMS dims of any value. */
const char *op_dims_str(char *buf, size_t size, const int64_t *d, int nd);
/* true when tensor `name` of op `op` has dims `want`; else op_io_fail naming
 * it, both shapes and `ref`, the tensor the expected shape comes from (with
 * its dims ref_dims, or NULL). */
bool op_io_dims_match(struct op_io *io, const char *op, const char *name, const int64_t *got, const int64_t *want,
                      int nd, const char *ref, const int64_t *ref_dims, int ref_nd);
/* false after op_io_fail when a derived dim of `name` exceeds INT_MAX. */
bool op_io_dims_fit_int(struct op_io *io, const char *op, const char *name, const int64_t *d, int nd);
/* An integer parameter in [lo, hi]; false after op_io_fail otherwise. */
bool op_io_param_int(const struct op_desc *self, struct op_io *io, const char *name, int64_t lo, int64_t hi,
                     int64_t *out);

#ifdef __cplusplus
}
#endif

#endif

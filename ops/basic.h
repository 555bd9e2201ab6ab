/* basic.h: the small ops everything else is built from (SPEC 3.1-3.2):
 * embedding lookup, RMSNorm, linear layers (a fixed-order kernel of cedar's own), and the scalar
 * activations. Row-major throughout; a weight W of a linear map from `in` to
 * `out` features is stored (out, in), as checkpoints store it.
 *
 * Not here: anything that knows a plan, a layer or a request.
 * Test: tests/test_ops_basic.c (ctest -R ops_basic).
 */
#ifndef CEDAR_OPS_BASIC_H
#define CEDAR_OPS_BASIC_H

#include <math.h>
#include <stdint.h>

#ifdef __cplusplus /* the CUDA twins in kernels/ include it */
extern "C" {
#endif

/* BLAS runs on one thread inside ops: parallelism comes from the task graph,
 * and the sgemm that some benchmarks and tests set beside op_linear must not
 * depend on the thread count (DESIGN.md facts).
 * Call once at start-up (the binary and every op test do). */
void op_blas_init(void);

/* OpenBLAS (0.3.x) maps one work buffer per thread that runs a level-3 call,
 * the first time it needs one, and retries a failed mmap forever: under an
 * address-space limit (ulimit -v) a run would hang instead of failing. Under
 * such a limit, op_blas_reserve checks that `callers` buffers (one per
 * thread that will call BLAS at once) plus OP_BLAS_HEADROOM fit and maps
 * them into OpenBLAS's pool now, while memory is free; later calls reuse
 * them. Returns 0 (also when no limit is set: nothing to do), or -1 with a
 * message in err. OP_BLAS_BUFFER_BYTES: OpenBLAS's BUFFER_SIZE on x86-64
 * (32 << 22, common_x86_64.h), the 128 MiB mmap a hung run shows. */
#define OP_BLAS_BUFFER_BYTES (128 << 20)
#define OP_BLAS_HEADROOM (64 << 20)
#include <stddef.h>
int op_blas_reserve(int callers, char *err, size_t err_len);

/* out[i] = table[tok[i]]; returns the index of the first out-of-range token,
 * or -1 when all are in [0, vocab). Rows of bad tokens are left untouched. */
int op_embed(float *out /* (n, d) */, const float *table /* (vocab, d) */, const int32_t *tok /* (n) */, int n,
             int d, int vocab);

/* out = x / sqrt(mean(x^2) + eps) * gamma, per row; accumulates in fp32
 * (SPEC 3.2). out may alias x. gamma may be NULL (no weight). */
void op_rmsnorm(float *out /* (n, d) */, const float *x /* (n, d) */, const float *gamma /* (d) or NULL */, int n,
                int d, float eps);

/* y = x W^T: y (n, out), x (n, in), W (out, in), fp32.
 * ldx/ldy are the row strides of x and y (>= in, >= out) so a caller can
 * read or write a column slice of a wider matrix. Row-invariant: every
 * element is summed in one fixed order (16 lanes over k, then a halving
 * tree; basic.c), so a row's bits do not depend on n or on the other rows,
 * and are the same at every ISA level. y must not overlap x or W. */
void op_linear(float *y /* (n, ldy) */, const float *x /* (n, ldx) */, const float *W /* (out, in) */, int n, int in,
               int out, int ldx, int ldy);
/* The same product through OpenBLAS cblas_sgemm (its order depends on the
 * shape): only for benchmarks that set it beside op_linear. */
void op_linear_sgemm(float *y, const float *x, const float *W, int n, int in, int out, int ldx, int ldy);

/* ---- the descriptors' checked calls -------------------------------------- */
/* What embed, rmsnorm and linear's descriptors read from an op_io once its
 * inputs are checked and its output allocated: one function per op, shared
 * by the CPU run (ops/basic.c) and the CUDA twin (kernels/basic.cu), so both
 * refuse the same inputs with the same messages. Each returns 0 or the
 * status after op_io_fail. */
struct op_desc;
struct op_io;
struct op_embed_call {
  const float *table;
  const int32_t *tok;
  float *out;
  int n, d, vocab;
};
int op_embed_prepare(const struct op_desc *self, struct op_io *io, struct op_embed_call *c);
/* The first token outside [0, vocab) as the embed op reports it (after
 * op_io_fail), or 0 when all are in range. */
int op_embed_check_tokens(struct op_io *io, const struct op_embed_call *c);
struct op_rmsnorm_call {
  const float *x, *gamma;
  float *out;
  int n, d;
  float eps;
};
int op_rmsnorm_prepare(const struct op_desc *self, struct op_io *io, struct op_rmsnorm_call *c);
struct op_linear_call {
  const float *x, *w;
  float *y;
  int n, in, out;
};
int op_linear_prepare(const struct op_desc *self, struct op_io *io, struct op_linear_call *c);

static inline float op_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float op_silu(float x) { return x / (1.0f + expf(-x)); }
/* softplus(x) = log(1 + e^x), computed without overflow for large x. */
static inline float op_softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

#ifdef __cplusplus
}
#endif

#endif

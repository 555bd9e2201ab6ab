/* basic.c: embedding, RMSNorm and linear layers (see basic.h). */
#define _DEFAULT_SOURCE /* MAP_ANONYMOUS, MAP_NORESERVE */
#include "ops/basic.h"

#include <cblas.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

#include "ops/isa.h"
#include "ops/lin_kernel.h"
#include "ops/registry.h"
#include "base/check.h"

void openblas_set_num_threads(int n);
int openblas_get_num_threads(void);

void op_blas_init(void) { openblas_set_num_threads(1); }

/* OpenBLAS's work-buffer pool (exported by libopenblas, used by every level-3
 * call): a buffer taken is mapped once and stays in the pool for any later
 * caller. */
void *blas_memory_alloc(int procpos);
void blas_memory_free(void *buffer);
int blas_thread_shutdown_(void); /* stops the pool's threads (OpenBLAS calls it before fork) */

int op_blas_reserve(int callers, char *err, size_t err_len) {
  struct rlimit rl;
  if (callers < 1 || getrlimit(RLIMIT_AS, &rl) || rl.rlim_cur == RLIM_INFINITY) return 0;
  /* the address space must hold the buffers plus OP_BLAS_HEADROOM for the
   * run's own first allocations; a PROT_NONE mapping counts against the
   * limit as the buffers will, and costs no memory */
  int pool = openblas_get_num_threads(); /* the caller plus pool - 1 threads started at load, a buffer each */
  size_t bufs = (size_t)callers + (size_t)(pool > 1 ? pool - 1 : 0);
  size_t need = bufs * OP_BLAS_BUFFER_BYTES + OP_BLAS_HEADROOM;
  void *probe = mmap(NULL, need, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (probe == MAP_FAILED) {
    snprintf(err, err_len,
             "the address-space limit (ulimit -v %llu KiB) leaves less than the %zu MiB OpenBLAS's work buffers "
             "need (%zu x %d MiB, %d MiB headroom); OpenBLAS retries a failed buffer forever, so cedar stops here: "
             "raise the limit (ulimit -v) or remove it",
             (unsigned long long)rl.rlim_cur / 1024, need >> 20, bufs, OP_BLAS_BUFFER_BYTES >> 20,
             OP_BLAS_HEADROOM >> 20);
    return -1;
  }
  munmap(probe, need);
  /* The pool's threads map their buffers as they start, maybe not yet: stop
   * them (the join waits until each has its buffer, which now fits, and
   * gives it back to the pool). cedar runs BLAS on one thread (op_blas_init),
   * so they would only have held memory; a later call does not restart them
   * at one thread. */
  openblas_set_num_threads(1);
  blas_thread_shutdown_();
  /* take `callers` buffers at once (each maps one), then give them back to
   * the pool: later calls find them mapped and never mmap again */
  void *held[64];
  int n = callers < 64 ? callers : 64;
  for (int i = 0; i < n; i++) held[i] = blas_memory_alloc(0);
  for (int i = 0; i < n; i++) blas_memory_free(held[i]);
  return 0;
}

int op_embed(float *out, const float *table, const int32_t *tok, int n, int d, int vocab) {
  int bad = -1;
  for (int i = 0; i < n; i++) {
    if (tok[i] < 0 || tok[i] >= vocab) {
      if (bad < 0) bad = i;
      continue;
    }
    memcpy(out + (size_t)i * d, table + (size_t)tok[i] * d, (size_t)d * sizeof *out);
  }
  return bad;
}

/* Each row's sum of squares runs j = 0..d-1 in order, one serial chain of
 * fp32 additions (SPEC 3.2). RMS_ROWS rows advance together, so the chains
 * are independent instructions the CPU overlaps instead of one add waiting
 * on the last; every row keeps its own order, so the bits are those of the
 * row-at-a-time loop for any n (test_ops_basic checks both). */
enum { RMS_ROWS = 8 };

static void rms_scale_row(float *o, const float *x, const float *gamma, int d, float r) {
  if (gamma)
    for (int j = 0; j < d; j++) o[j] = x[j] * r * gamma[j];
  else
    for (int j = 0; j < d; j++) o[j] = x[j] * r;
}

static float rms_inv(float ss, int d, float eps) { return 1.0f / sqrtf(ss / (float)d + eps); }

void op_rmsnorm(float *out, const float *x, const float *gamma, int n, int d, float eps) {
  int i = 0;
  for (; i + RMS_ROWS <= n; i += RMS_ROWS) {
    const float *xb = x + (size_t)i * d;
    float ss[RMS_ROWS] = {0};
    for (int j = 0; j < d; j++)
      for (int r = 0; r < RMS_ROWS; r++) ss[r] += xb[(size_t)r * d + j] * xb[(size_t)r * d + j];
    for (int r = 0; r < RMS_ROWS; r++)
      rms_scale_row(out + (size_t)(i + r) * d, xb + (size_t)r * d, gamma, d, rms_inv(ss[r], d, eps));
  }
  for (; i < n; i++) {
    const float *xi = x + (size_t)i * d;
    float ss = 0.0f;
    for (int j = 0; j < d; j++) ss += xi[j] * xi[j];
    rms_scale_row(out + (size_t)i * d, xi, gamma, d, rms_inv(ss, d, eps));
  }
}

/* ---- op_linear: one fixed summation order per output ---------------------
 *
 * The order and the tiles are ops/lin_kernel.h's, shared with op_qlinear
 * (ops/qlinear.c), which runs them over weights decoded from their stored
 * formats; here the weights are floats already. */
static inline OP_ISA_BODY void lin_kernel_body(float *y, const float *x, const float *W, int n, int in, int out, int ldx,
                                               int ldy) {
  const struct op_qweight w = {OP_W_F32, out, in, W, NULL};
  lin_body(y, x, &w, n, ldx, ldy, NULL, OP_W_F32);
}

OP_ISA_KERNEL(lin_kernel,
              (float *y, const float *x, const float *W, int n, int in, int out, int ldx, int ldy),
              (y, x, W, n, in, out, ldx, ldy))

void op_linear(float *y, const float *x, const float *W, int n, int in, int out, int ldx, int ldy) {
  if (n <= 0 || out <= 0) return;
  if (in <= 0) {
    for (int i = 0; i < n; i++) memset(y + (size_t)i * ldy, 0, (size_t)out * sizeof *y);
    return;
  }
  lin_kernel(y, x, W, n, in, out, ldx, ldy);
}

/* The sgemm op_linear was until it became row-invariant: benchmarks set it
 * beside op_linear (cedar bench ops), nothing computes with it. */
void op_linear_sgemm(float *y, const float *x, const float *W, int n, int in, int out, int ldx, int ldy) {
  if (n <= 0 || out <= 0) return;
  if (in <= 0) {
    for (int i = 0; i < n; i++) memset(y + (size_t)i * ldy, 0, (size_t)out * sizeof *y);
    return;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, x, ldx, W, in, 0.0f, y, ldy);
}

/* ---- registry descriptors (ops/registry.h) ------------------------------ */

int op_embed_prepare(const struct op_desc *self, struct op_io *io, struct op_embed_call *c) {
  int64_t td[2], nd[1];
  const struct op_tensor *table = op_io_in(self, io, "table", 2, td);
  const struct op_tensor *tok = table ? op_io_in(self, io, "tokens", 1, nd) : NULL;
  if (!tok) return CEDAR_EINVAL;
  float *out = op_io_out(self, io, "out", 2, (int64_t[]){nd[0], td[1]});
  if (!out) return CEDAR_ENOMEM;
  *c = (struct op_embed_call){.table = table->data, .tok = tok->data, .out = out, .n = (int)nd[0], .d = (int)td[1],
                              .vocab = (int)td[0]};
  return 0;
}

int op_embed_check_tokens(struct op_io *io, const struct op_embed_call *c) {
  for (int i = 0; i < c->n; i++)
    if (c->tok[i] < 0 || c->tok[i] >= c->vocab)
      return op_io_fail(io, "embed: token %d at position %d is outside the vocabulary [0, %lld)", c->tok[i], i,
                        (long long)c->vocab);
  return 0;
}

static int embed_run(const struct op_desc *self, struct op_io *io) {
  struct op_embed_call c = {0};
  int rc = op_embed_prepare(self, io, &c);
  if (rc) return rc;
  return op_embed(c.out, c.table, c.tok, c.n, c.d, c.vocab) >= 0 ? op_embed_check_tokens(io, &c) : 0;
}

const struct op_desc op_desc_embed = {
    .name = "embed",
    .summary = "embedding lookup: out[i] = table[tokens[i]] (SPEC 3.1)",
    .inputs = (const struct op_arg[]){{"table", OP_F32, "(vocab, d)", "embedding table"},
                                      {"tokens", OP_I32, "(n)", "token ids"},
                                      {0}},
    .outputs = (const struct op_arg[]){{"out", OP_F32, "(n, d)", "embedded rows"}, {0}},
    .run = embed_run,
};

int op_rmsnorm_prepare(const struct op_desc *self, struct op_io *io, struct op_rmsnorm_call *c) {
  int64_t xd[2], gd[1];
  const struct op_tensor *x = op_io_in(self, io, "x", 2, xd);
  const struct op_tensor *g = x ? op_io_in(self, io, "gamma", 1, gd) : NULL;
  if (!g) return CEDAR_EINVAL;
  if (gd[0] != xd[1]) return op_io_fail(io, "rmsnorm: gamma has %lld values for rows of %lld", (long long)gd[0], (long long)xd[1]);
  float *out = op_io_out(self, io, "out", 2, xd);
  if (!out) return CEDAR_ENOMEM;
  *c = (struct op_rmsnorm_call){.x = x->data, .gamma = g->data, .out = out, .n = (int)xd[0], .d = (int)xd[1],
                                .eps = (float)op_io_param(self, io, "eps")};
  return 0;
}

static int rmsnorm_run(const struct op_desc *self, struct op_io *io) {
  struct op_rmsnorm_call c = {0};
  int rc = op_rmsnorm_prepare(self, io, &c);
  if (!rc) op_rmsnorm(c.out, c.x, c.gamma, c.n, c.d, c.eps);
  return rc;
}

const struct op_desc op_desc_rmsnorm = {
    .name = "rmsnorm",
    .summary = "RMSNorm per row: x / sqrt(mean(x^2) + eps) * gamma (SPEC 3.2)",
    .inputs = (const struct op_arg[]){{"x", OP_F32, "(n, d)", "rows"}, {"gamma", OP_F32, "(d)", "weight"}, {0}},
    .outputs = (const struct op_arg[]){{"out", OP_F32, "(n, d)", "normalised rows"}, {0}},
    .params = (const struct op_param[]){{"eps", OP_PARAM_FLOAT, 1e-6, "epsilon [R]"}, {0}},
    .run = rmsnorm_run,
};

int op_linear_prepare(const struct op_desc *self, struct op_io *io, struct op_linear_call *c) {
  int64_t xd[2], wd[2];
  const struct op_tensor *x = op_io_in(self, io, "x", 2, xd);
  const struct op_tensor *w = x ? op_io_in(self, io, "w", 2, wd) : NULL;
  if (!w) return CEDAR_EINVAL;
  if (wd[1] != xd[1]) return op_io_fail(io, "linear: w is (%lld, %lld) but x rows have %lld values", (long long)wd[0], (long long)wd[1], (long long)xd[1]);
  float *y = op_io_out(self, io, "y", 2, (int64_t[]){xd[0], wd[0]});
  if (!y) return CEDAR_ENOMEM;
  *c = (struct op_linear_call){.x = x->data, .w = w->data, .y = y, .n = (int)xd[0], .in = (int)xd[1], .out = (int)wd[0]};
  return 0;
}

static int linear_run(const struct op_desc *self, struct op_io *io) {
  struct op_linear_call c = {0};
  int rc = op_linear_prepare(self, io, &c);
  if (!rc) op_linear(c.y, c.x, c.w, c.n, c.in, c.out, c.in, c.out);
  return rc;
}

const struct op_desc op_desc_linear = {
    .name = "linear",
    .summary = "linear layer y = x W^T, fp32, one fixed summation order per element (row-invariant)",
    .inputs = (const struct op_arg[]){{"x", OP_F32, "(n, in)", "rows"}, {"w", OP_F32, "(out, in)", "weight"}, {0}},
    .outputs = (const struct op_arg[]){{"y", OP_F32, "(n, out)", "result"}, {0}},
    .run = linear_run,
};

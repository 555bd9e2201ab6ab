/* basic.cu: embedding, RMSNorm and the linear layer on CUDA (see basic.cuh). */
#include "kernels/basic.cuh"

#include <stdio.h>

#include "base/check.h"
#include "kernels/kcall.cuh"
#include "kernels/reduce.cuh"
#include "ops/basic.h"

enum { EMBED_THREADS = 128, RMS_THREADS = 256 };

__global__ void embed_kernel(float *__restrict__ out, const float *__restrict__ table, const int32_t *__restrict__ tok,
                             int d, int vocab, int *bad) {
  const int i = blockIdx.x, t = tok[i];
  if (t < 0 || t >= vocab) {
    if (threadIdx.x == 0 && bad) atomicMin(bad, i);
    return;
  }
  const float *src = table + (size_t)t * d;
  float *dst = out + (size_t)i * d;
  for (int j = threadIdx.x; j < d; j += blockDim.x) dst[j] = src[j];
}

cudaError_t kern_embed(float *out, const float *table, const int32_t *tok, int n, int d, int vocab, int *bad,
                       cudaStream_t st) {
  if (n <= 0 || d <= 0) return cudaSuccess;
  embed_kernel<<<n, EMBED_THREADS, 0, st>>>(out, table, tok, d, vocab, bad);
  return cudaGetLastError();
}

__global__ void rmsnorm_kernel(float *__restrict__ out, const float *__restrict__ x, const float *__restrict__ gamma,
                               int d, float eps) {
  __shared__ float part[32];
  const float *xi = x + (size_t)blockIdx.x * d;
  float *oi = out + (size_t)blockIdx.x * d;
  float ss = 0.0f;
  for (int j = threadIdx.x; j < d; j += blockDim.x) ss = __fadd_rn(ss, __fmul_rn(xi[j], xi[j]));
  ss = kern_block_sum(ss, part);
  /* ops/basic.c: r = 1 / sqrtf(ss / d + eps), each one rounding */
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ss, (float)d), eps)));
  for (int j = threadIdx.x; j < d; j += blockDim.x)
    oi[j] = gamma ? __fmul_rn(__fmul_rn(xi[j], r), gamma[j]) : __fmul_rn(xi[j], r);
}

cudaError_t kern_rmsnorm(float *out, const float *x, const float *gamma, int n, int d, float eps, cudaStream_t st) {
  if (n <= 0 || d <= 0) return cudaSuccess;
  rmsnorm_kernel<<<n, RMS_THREADS, 0, st>>>(out, x, gamma, d, eps);
  return cudaGetLastError();
}

cublasStatus_t kern_linear(cublasHandle_t h, float *y, const float *x, const float *W, int n, int in, int out, int ldx,
                           int ldy, cudaStream_t st) {
  if (n <= 0 || out <= 0) return CUBLAS_STATUS_SUCCESS;
  cublasStatus_t s = cublasSetStream(h, st);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  if (in <= 0) { /* op_linear: y = 0 */
    cudaError_t e = cudaMemset2DAsync(y, (size_t)ldy * sizeof *y, 0, (size_t)out * sizeof *y, (size_t)n, st);
    return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
  }
  /* Row-major y (n, out) = x (n, in) W^T is column-major y^T (out, n) =
   * W (out, in as a column-major (in, out) transposed) x^T. */
  const float one = 1.0f, zero = 0.0f;
  return cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, W, in, x, ldx, &zero, y, ldy);
}

/* ---- op slots ------------------------------------------------------------------------- */

int kern_embed_run(const struct op_desc *self, struct op_io *io) {
  struct op_embed_call a;
  int rc = op_embed_prepare(self, io, &a);
  if (rc || (rc = op_embed_check_tokens(io, &a))) return rc; /* refused before any device work */
  struct kcall c;
  kcall_begin(&c, self, io);
  const size_t ob = (size_t)a.n * a.d * sizeof(float);
  const float *table = (const float *)kcall_upload(&c, a.table, (size_t)a.vocab * a.d * sizeof(float), "table");
  const int32_t *tok = (const int32_t *)kcall_upload(&c, a.tok, (size_t)a.n * sizeof(int32_t), "tokens");
  float *out = (float *)kcall_alloc(&c, ob, "out");
  if (kcall_ok(&c)) kcall_cuda(&c, kern_embed(out, table, tok, a.n, a.d, a.vocab, NULL, c.stream), "embed_kernel");
  kcall_download(&c, a.out, out, ob, "out");
  return kcall_end(&c);
}

int kern_rmsnorm_run(const struct op_desc *self, struct op_io *io) {
  struct op_rmsnorm_call a;
  int rc = op_rmsnorm_prepare(self, io, &a);
  if (rc) return rc;
  struct kcall c;
  kcall_begin(&c, self, io);
  const size_t xb = (size_t)a.n * a.d * sizeof(float);
  const float *x = (const float *)kcall_upload(&c, a.x, xb, "x");
  const float *g = (const float *)kcall_upload(&c, a.gamma, (size_t)a.d * sizeof(float), "gamma");
  float *out = (float *)kcall_alloc(&c, xb, "out");
  if (kcall_ok(&c)) kcall_cuda(&c, kern_rmsnorm(out, x, g, a.n, a.d, a.eps, c.stream), "rmsnorm_kernel");
  kcall_download(&c, a.out, out, xb, "out");
  return kcall_end(&c);
}

int kern_linear_run(const struct op_desc *self, struct op_io *io) {
  struct op_linear_call a;
  int rc = op_linear_prepare(self, io, &a);
  if (rc) return rc;
  struct kcall c;
  kcall_begin(&c, self, io);
  const size_t yb = (size_t)a.n * a.out * sizeof(float);
  const float *x = (const float *)kcall_upload(&c, a.x, (size_t)a.n * a.in * sizeof(float), "x");
  const float *w = (const float *)kcall_upload(&c, a.w, (size_t)a.out * a.in * sizeof(float), "w");
  float *y = (float *)kcall_alloc(&c, yb, "y");
  if (kcall_ok(&c)) {
    cublasHandle_t h = NULL;
    cublasStatus_t s = cublasCreate(&h);
    if (s == CUBLAS_STATUS_SUCCESS) s = kern_linear(h, y, x, w, a.n, a.in, a.out, a.in, a.out, c.stream);
    if (s != CUBLAS_STATUS_SUCCESS) kcall_fail(&c, CEDAR_EIO, "cublasSgemm", cublasGetStatusString(s));
    kcall_download(&c, a.y, y, yb, "y");
    kcall_end(&c); /* synchronize before the handle goes */
    if (h) cublasDestroy(h);
    return c.rc;
  }
  return kcall_end(&c);
}

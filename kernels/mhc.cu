/* mhc.cu: mHC coefficients, Sinkhorn, mix, update and merge on CUDA (see
 * mhc.cuh; Sinkhorn's order is ops/num_sinkhorn.h's). */
#include "kernels/mhc.cuh"

#include "base/check.h"
#include "kernels/kcall.cuh"
#include "kernels/reduce.cuh"
#include "ops/num_sinkhorn.h"

enum { MHC_THREADS = 128, MHC_RED = 256, MHC_MAX_HC = 8 };

__global__ void mhc_mix_kernel(float *u, const float *X, const float *pre, int64_t total, int hc, int d) {
  const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= total) return;
  const int64_t t = k / d, c = k % d;
  const float *x = X + (size_t)t * hc * d + c, *p = pre + (size_t)t * hc;
  float s = __fmul_rn(p[0], x[0]);
  for (int i = 1; i < hc; i++) s = __fadd_rn(s, __fmul_rn(p[i], x[(size_t)i * d]));
  u[k] = s;
}

cudaError_t kern_mhc_mix(float *u, const float *X, const float *pre, int n, int hc, int d, cudaStream_t st) {
  const int64_t total = (int64_t)n * d;
  if (total <= 0) return cudaSuccess;
  mhc_mix_kernel<<<kcall_blocks(total, MHC_THREADS), MHC_THREADS, 0, st>>>(u, X, pre, total, hc, d);
  return cudaGetLastError();
}

/* X'_j[k] = sum_i C[i][j] X_i[k] + post[j] F[k], one thread per (t, j, k). */
__global__ void mhc_update_kernel(float *Xn, const float *X, const float *C, const float *post, const float *F,
                                  int64_t total, int hc, int d) {
  const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= total) return;
  const int64_t t = k / ((int64_t)hc * d), j = k / d % hc, c = k % d;
  const float *x = X + (size_t)t * hc * d + c, *Ct = C + (size_t)t * hc * hc;
  float y = __fmul_rn(Ct[j], x[0]);
  for (int i = 1; i < hc; i++) y = __fadd_rn(y, __fmul_rn(Ct[i * hc + j], x[(size_t)i * d]));
  Xn[k] = __fadd_rn(y, __fmul_rn(post[(size_t)t * hc + j], F[(size_t)t * d + c]));
}

cudaError_t kern_mhc_update(float *Xn, const float *X, const float *C, const float *post, const float *F, int n, int hc,
                            int d, cudaStream_t st) {
  const int64_t total = (int64_t)n * hc * d;
  if (total <= 0) return cudaSuccess;
  mhc_update_kernel<<<kcall_blocks(total, MHC_THREADS), MHC_THREADS, 0, st>>>(Xn, X, C, post, F, total, hc, d);
  return cudaGetLastError();
}

__global__ void mhc_sumsq_kernel(float *sumsq, const float *X, size_t width) {
  __shared__ float part[32];
  const float *x = X + (size_t)blockIdx.x * width;
  float s = 0.0f;
  for (size_t k = threadIdx.x; k < width; k += blockDim.x) s = __fadd_rn(s, __fmul_rn(x[k], x[k]));
  s = kern_block_sum(s, part);
  if (threadIdx.x == 0) sumsq[blockIdx.x] = s;
}

__device__ __forceinline__ float sigmoid_rn(float x) { return __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x))); }

/* One position: ops/mhc.c coeff_row, then Sinkhorn on its C in place. */
__global__ void mhc_coeff_kernel(float *pre, float *post, float *C, const float *dots, const float *sumsq,
                                 const float *scale, const float *base, int n, const struct op_mhc_cfg c) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n) return;
  const int hc = c.hc, M = (2 + hc) * hc;
  const float *mx = dots + (size_t)t * M;
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sumsq[t], __fmul_rn((float)hc, (float)c.hidden)),
                                                      c.norm_eps)));
  for (int i = 0; i < hc; i++) {
    pre[(size_t)t * hc + i] =
        __fadd_rn(sigmoid_rn(__fadd_rn(__fmul_rn(__fmul_rn(mx[i], r), scale[0]), base[i])), c.hc_eps);
    post[(size_t)t * hc + i] =
        __fmul_rn(2.0f, sigmoid_rn(__fadd_rn(__fmul_rn(__fmul_rn(mx[hc + i], r), scale[1]), base[hc + i])));
  }
  float *Ct = C + (size_t)t * hc * hc;
  for (int q = 0; q < hc * hc; q++)
    Ct[q] = __fadd_rn(__fmul_rn(__fmul_rn(mx[2 * hc + q], r), scale[2]), base[2 * hc + q]);
  op_hd_sinkhorn(Ct, 1, Ct, 1, hc, c.sinkhorn_iters, c.hc_eps);
}

/* dots (n, m) = X (n, width) W^T, W (m, width): pedantic fp32 cuBLAS. */
static cublasStatus_t stats(cublasHandle_t h, float *dots, float *sumsq, const float *X, const float *W, int n, int m,
                            int width, cudaStream_t st) {
  cublasStatus_t s = cublasSetStream(h, st);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH);
  const float one = 1.0f, zero = 0.0f;
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, width, &one, W, width, X, width, &zero, dots, m);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  mhc_sumsq_kernel<<<n, MHC_RED, 0, st>>>(sumsq, X, (size_t)width);
  return cudaGetLastError() == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

cublasStatus_t kern_mhc_coeffs(cublasHandle_t h, float *pre, float *post, float *C, float *dots, float *sumsq,
                               const float *X, const float *W_fn, const float *scale, const float *base, int n,
                               const struct op_mhc_cfg *c, cudaStream_t st) {
  if (n <= 0) return CUBLAS_STATUS_SUCCESS;
  if (c->hc < 1 || c->hc > MHC_MAX_HC) return CUBLAS_STATUS_INVALID_VALUE;
  cublasStatus_t s = stats(h, dots, sumsq, X, W_fn, n, (2 + c->hc) * c->hc, c->hc * c->hidden, st);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  mhc_coeff_kernel<<<kcall_blocks(n, MHC_THREADS), MHC_THREADS, 0, st>>>(pre, post, C, dots, sumsq, scale, base, n, *c);
  return cudaGetLastError() == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

/* pre[t][i] = sigmoid(dot r scale + base[i]) + hc_eps, r = 1 / sqrt(ss / width + eps). */
__global__ void mhc_merge_pre_kernel(float *pre, const float *sumsq, const float *scale, const float *base, int n,
                                     const struct op_mhc_cfg c) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n) return;
  const float width = (float)((size_t)c.hc * c.hidden);
  const float r = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(sumsq[t], width), c.norm_eps)));
  float *p = pre + (size_t)t * c.hc;
  for (int i = 0; i < c.hc; i++)
    p[i] = __fadd_rn(sigmoid_rn(__fadd_rn(__fmul_rn(__fmul_rn(p[i], r), scale[0]), base[i])), c.hc_eps);
}

cublasStatus_t kern_mhc_merge(cublasHandle_t h, float *y, float *pre, float *sumsq, const float *X, const float *W_fn,
                              const float *scale, const float *base, int n, const struct op_mhc_cfg *c,
                              cudaStream_t st) {
  if (n <= 0) return CUBLAS_STATUS_SUCCESS;
  cublasStatus_t s = stats(h, pre, sumsq, X, W_fn, n, c->hc, c->hc * c->hidden, st); /* the dots land in pre */
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  mhc_merge_pre_kernel<<<kcall_blocks(n, MHC_THREADS), MHC_THREADS, 0, st>>>(pre, sumsq, scale, base, n, *c);
  if (cudaGetLastError() != cudaSuccess || kern_mhc_mix(y, X, pre, n, c->hc, c->hidden, st) != cudaSuccess)
    return CUBLAS_STATUS_EXECUTION_FAILED;
  return CUBLAS_STATUS_SUCCESS;
}

/* ---- op slots ------------------------------------------------------------------------- */

#define UP(c, host, floats, what) ((const float *)kcall_upload(c, host, (size_t)(floats) * sizeof(float), what))

static int mhc_run(const struct op_desc *self, struct op_io *io, enum op_mhc_kind kind) {
  struct op_mhc_call a;
  int rc = op_mhc_prepare(self, io, kind, &a);
  if (rc) return rc;
  const int n = a.n, hc = a.cfg.hc, d = a.cfg.hidden, M = (2 + hc) * hc;
  const size_t xf = (size_t)n * hc * d;
  struct kcall c;
  kcall_begin(&c, self, io);
  const float *X = UP(&c, a.X, xf, "X");
  cublasHandle_t h = NULL;
  cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
  if (kind == OP_MHC_MIX) {
    const float *pre = UP(&c, a.pre_in, (size_t)n * hc, "pre");
    float *u = (float *)kcall_alloc(&c, (size_t)n * d * sizeof(float), "u");
    if (kcall_ok(&c)) kcall_cuda(&c, kern_mhc_mix(u, X, pre, n, hc, d, c.stream), "mhc_mix_kernel");
    kcall_download(&c, a.u, u, (size_t)n * d * sizeof(float), "u");
  } else if (kind == OP_MHC_UPDATE) {
    const float *C = UP(&c, a.C_in, (size_t)n * hc * hc, "C"), *post = UP(&c, a.post_in, (size_t)n * hc, "post");
    const float *F = UP(&c, a.F, (size_t)n * d, "F");
    float *Xn = (float *)kcall_alloc(&c, xf * sizeof(float), "X_next");
    if (kcall_ok(&c)) kcall_cuda(&c, kern_mhc_update(Xn, X, C, post, F, n, hc, d, c.stream), "mhc_update_kernel");
    kcall_download(&c, a.X_next, Xn, xf * sizeof(float), "X_next");
  } else {
    const int rows = kind == OP_MHC_COEFFS ? M : hc, ns = kind == OP_MHC_COEFFS ? 3 : 1;
    const float *W = UP(&c, a.W_fn, (size_t)rows * hc * d, "W_fn"), *scale = UP(&c, a.scale, ns, "scale");
    const float *base = UP(&c, a.base, rows, "base");
    float *pre = (float *)kcall_alloc(&c, (size_t)n * (kind == OP_MHC_COEFFS ? hc : hc) * sizeof(float), "pre");
    float *sumsq = (float *)kcall_alloc(&c, (size_t)n * sizeof(float), "sumsq");
    float *post = NULL, *C = NULL, *dots = NULL, *y = NULL;
    if (kind == OP_MHC_COEFFS) {
      post = (float *)kcall_alloc(&c, (size_t)n * hc * sizeof(float), "post");
      C = (float *)kcall_alloc(&c, (size_t)n * hc * hc * sizeof(float), "C");
      dots = (float *)kcall_alloc(&c, (size_t)n * M * sizeof(float), "dots");
    } else {
      y = (float *)kcall_alloc(&c, (size_t)n * d * sizeof(float), "y");
    }
    if (kcall_ok(&c)) {
      s = cublasCreate(&h);
      if (s == CUBLAS_STATUS_SUCCESS)
        s = kind == OP_MHC_COEFFS ? kern_mhc_coeffs(h, pre, post, C, dots, sumsq, X, W, scale, base, n, &a.cfg, c.stream)
                                  : kern_mhc_merge(h, y, pre, sumsq, X, W, scale, base, n, &a.cfg, c.stream);
      if (s != CUBLAS_STATUS_SUCCESS) kcall_fail(&c, CEDAR_EIO, self->name, cublasGetStatusString(s));
    }
    kcall_download(&c, a.pre, pre, (size_t)n * hc * sizeof(float), "pre");
    if (kind == OP_MHC_COEFFS) {
      kcall_download(&c, a.post, post, (size_t)n * hc * sizeof(float), "post");
      kcall_download(&c, a.C, C, (size_t)n * hc * hc * sizeof(float), "C");
      kcall_download(&c, a.dots, dots, (size_t)n * M * sizeof(float), "dots");
      kcall_download(&c, a.sumsq, sumsq, (size_t)n * sizeof(float), "sumsq");
    } else {
      kcall_download(&c, a.y, y, (size_t)n * d * sizeof(float), "y");
    }
  }
  rc = kcall_end(&c);
  if (h) cublasDestroy(h);
  return rc;
}

int kern_mhc_coeffs_run(const struct op_desc *self, struct op_io *io) { return mhc_run(self, io, OP_MHC_COEFFS); }
int kern_mhc_mix_run(const struct op_desc *self, struct op_io *io) { return mhc_run(self, io, OP_MHC_MIX); }
int kern_mhc_update_run(const struct op_desc *self, struct op_io *io) { return mhc_run(self, io, OP_MHC_UPDATE); }
int kern_mhc_merge_run(const struct op_desc *self, struct op_io *io) { return mhc_run(self, io, OP_MHC_MERGE); }

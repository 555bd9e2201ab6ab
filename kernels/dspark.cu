/* dspark.cu: the DSpark Markov and confidence heads and the verify-length
 * choice on CUDA (see dspark.cuh; ops/dspark.c is the rule). */
#include "kernels/dspark.cuh"

#include <stdlib.h>

#include "base/check.h"
#include "kernels/basic.cuh"
#include "kernels/kcall.cuh"
#include "kernels/sample.cuh"
#include "ops/sample.h"

enum { DSPARK_THREADS = 128 };

static cublasStatus_t launched(cudaError_t e) {
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

/* arow = A[prev], prev = y0 at position 0, else the previous draft. */
__global__ void dspark_row_kernel(float *__restrict__ arow, const float *__restrict__ A, const int32_t *draft,
                                  int32_t y0, int i, int rank) {
  const int32_t prev = i == 0 ? y0 : draft[i - 1];
  for (int j = threadIdx.x; j < rank; j += blockDim.x) arow[j] = A[(size_t)prev * rank + j];
}

__global__ void dspark_add_kernel(float *__restrict__ li, const float *__restrict__ bi, int V) {
  const int y = blockIdx.x * blockDim.x + threadIdx.x;
  if (y < V) li[y] = __fadd_rn(li[y], bi[y]);
}

cublasStatus_t kern_dspark_draft_logits(cublasHandle_t h, float *logits_i, float *arow, const int32_t *draft,
                                        const float *base_i, const float *A, const float *U, int32_t y0, int i, int V,
                                        int rank, cudaStream_t st) {
  dspark_row_kernel<<<1, DSPARK_THREADS, 0, st>>>(arow, A, draft, y0, i, rank);
  cublasStatus_t s = launched(cudaGetLastError());
  if (s == CUBLAS_STATUS_SUCCESS) s = kern_linear(h, logits_i, arow, U, 1, rank, V, rank, V, st);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  dspark_add_kernel<<<kcall_blocks(V, DSPARK_THREADS), DSPARK_THREADS, 0, st>>>(logits_i, base_i, V);
  return launched(cudaGetLastError());
}

__global__ void dspark_sigmoid_kernel(float *a, float b_c, int L) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= L) return;
  const float x = __fadd_rn(a[i], b_c); /* op_sigmoid(a + b_c) = 1 / (1 + expf(-x)) */
  a[i] = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-x)));
}

cublasStatus_t kern_dspark_confidence(cublasHandle_t h, float *a, const float *hs, const float *w_c, float b_c, int L,
                                      int d, cudaStream_t st) {
  cublasStatus_t s = kern_linear(h, a, hs, w_c, L, d, 1, d, 1, st); /* a linear layer with one output */
  if (s != CUBLAS_STATUS_SUCCESS || L <= 0) return s;
  dspark_sigmoid_kernel<<<kcall_blocks(L, DSPARK_THREADS), DSPARK_THREADS, 0, st>>>(a, b_c, L);
  return launched(cudaGetLastError());
}

/* op_dspark_expected_accept then op_dspark_verify_len, step for step. */
__global__ void dspark_verify_kernel(float *expected, float *score, int32_t *L_star, const float *a,
                                     const float *t_round, int Lmax) {
  float p = 1.0f;
  expected[0] = 0.0f;
  for (int i = 1; i <= Lmax; i++) {
    p = __fmul_rn(p, a[i - 1]);
    expected[i] = __fadd_rn(expected[i - 1], p);
  }
  for (int L = 0; L <= Lmax; L++)
    if (!(t_round[L] > 0.0f) || !isfinite(t_round[L])) {
      L_star[0] = -1;
      return;
    }
  int best = 0;
  float best_s = 0.0f, e = 0.0f;
  p = 1.0f;
  for (int L = 0; L <= Lmax; L++) {
    if (L > 0) p = __fmul_rn(p, a[L - 1]), e = __fadd_rn(e, p);
    const float s = __fdiv_rn(__fadd_rn(1.0f, e), t_round[L]);
    score[L] = s;
    if (L == 0 || s > best_s) best_s = s, best = L; /* strict: ties keep the shorter L */
  }
  L_star[0] = best;
}

cudaError_t kern_dspark_verify_len(float *expected, float *score, int32_t *L_star, const float *a,
                                   const float *t_round, int Lmax, cudaStream_t st) {
  dspark_verify_kernel<<<1, 1, 0, st>>>(expected, score, L_star, a, t_round, Lmax);
  return cudaGetLastError();
}

/* ---- op slots ------------------------------------------------------------------------- */

int kern_dspark_draft_run(const struct op_desc *self, struct op_io *io) {
  struct op_dspark_draft_call a;
  int rc = op_dspark_draft_prepare(self, io, &a);
  if (rc) return rc;
  const size_t lb = (size_t)a.L * a.V * sizeof(float), vr = (size_t)a.V * a.rank * sizeof(float);
  float *row = (float *)malloc((size_t)a.V * sizeof(float) + 1); /* one position's logits, checked on the host */
  if (!row) return op_io_fail(io, "dspark_draft: cannot allocate %d floats of workspace", a.V), CEDAR_ENOMEM;
  struct kcall c;
  kcall_begin(&c, self, io);
  const float *base = (const float *)kcall_upload(&c, a.base, lb, "base");
  const float *A = (const float *)kcall_upload(&c, a.A, vr, "A");
  const float *U = (const float *)kcall_upload(&c, a.U, vr, "U");
  float *logits = (float *)kcall_alloc(&c, lb, "logits"), *prob = (float *)kcall_alloc(&c, lb, "prob");
  int32_t *draft = (int32_t *)kcall_alloc(&c, (size_t)a.L * sizeof(int32_t), "draft");
  int32_t *order = (int32_t *)kcall_alloc(&c, (size_t)a.V * sizeof(int32_t), "order");
  float *arow = (float *)kcall_alloc(&c, (size_t)a.rank * sizeof(float), "A row");
  cublasHandle_t h = NULL;
  if (kcall_ok(&c)) {
    cublasStatus_t s = cublasCreate(&h);
    if (s != CUBLAS_STATUS_SUCCESS) kcall_fail(&c, CEDAR_EIO, "cublasCreate", cublasGetStatusString(s));
  }
  for (int i = 0; i < a.L && kcall_ok(&c); i++) {
    const size_t off = (size_t)i * a.V;
    cublasStatus_t s =
        kern_dspark_draft_logits(h, logits + off, arow, draft, base + off, A, U, a.y0, i, a.V, a.rank, c.stream);
    if (s != CUBLAS_STATUS_SUCCESS) {
      kcall_fail(&c, CEDAR_EIO, "dspark draft kernels", cublasGetStatusString(s));
      break;
    }
    kcall_download(&c, row, logits + off, (size_t)a.V * sizeof(float), "logits row");
    if (!kcall_ok(&c) || !kcall_cuda(&c, cudaStreamSynchronize(c.stream), "cudaStreamSynchronize")) break;
    if (!op_sample_row_usable(row, a.V)) { /* the CPU's refusal, at the same position */
      rc = op_dspark_draft_bad_position(io, i);
      break;
    }
    /* position i's draw is the i-th of the generator (greedy positions take none, and then i draws are none) */
    const uint64_t seed = a.seed + (uint64_t)i * 0x9E3779B97F4A7C15ull;
    kcall_cuda(&c, kern_sample_rows(draft + i, prob + off, order, logits + off, 1, a.V, a.temperature, a.top_p, seed,
                                    c.stream),
               "sample_kernel");
  }
  if (!rc) {
    kcall_download(&c, a.draft, draft, (size_t)a.L * sizeof(int32_t), "draft");
    kcall_download(&c, a.logits, logits, lb, "logits");
    kcall_download(&c, a.prob, prob, lb, "prob");
  }
  const int krc = kcall_end(&c); /* synchronizes before the handle goes */
  if (h) cublasDestroy(h);
  free(row);
  return rc ? rc : krc;
}

int kern_dspark_confidence_run(const struct op_desc *self, struct op_io *io) {
  struct op_dspark_confidence_call a;
  int rc = op_dspark_confidence_prepare(self, io, &a);
  if (rc) return rc;
  struct kcall c;
  kcall_begin(&c, self, io);
  const float *hs = (const float *)kcall_upload(&c, a.h, (size_t)a.L * a.d * sizeof(float), "h");
  const float *w = (const float *)kcall_upload(&c, a.w_c, (size_t)a.d * sizeof(float), "w_c");
  float *out = (float *)kcall_alloc(&c, (size_t)a.L * sizeof(float), "a");
  cublasHandle_t h = NULL;
  if (kcall_ok(&c)) {
    cublasStatus_t s = cublasCreate(&h);
    if (s == CUBLAS_STATUS_SUCCESS) s = kern_dspark_confidence(h, out, hs, w, a.b_c, a.L, a.d, c.stream);
    if (s != CUBLAS_STATUS_SUCCESS) kcall_fail(&c, CEDAR_EIO, "dspark confidence kernels", cublasGetStatusString(s));
  }
  kcall_download(&c, a.a, out, (size_t)a.L * sizeof(float), "a");
  rc = kcall_end(&c);
  if (h) cublasDestroy(h);
  return rc;
}

int kern_dspark_verify_len_run(const struct op_desc *self, struct op_io *io) {
  struct op_dspark_verify_len_call a;
  int rc = op_dspark_verify_len_prepare(self, io, &a);
  if (rc || (rc = op_dspark_verify_len_check_t(io, &a))) return rc; /* refused before any device work */
  const size_t ab = (size_t)a.Lmax * sizeof(float), tb = (size_t)(a.Lmax + 1) * sizeof(float);
  struct kcall c;
  kcall_begin(&c, self, io);
  const float *av = (const float *)kcall_upload(&c, a.a, ab, "a");
  const float *t = (const float *)kcall_upload(&c, a.t_round, tb, "t_round");
  float *e = (float *)kcall_alloc(&c, tb, "expected"), *s = (float *)kcall_alloc(&c, tb, "score");
  int32_t *best = (int32_t *)kcall_alloc(&c, sizeof(int32_t), "L_star");
  if (kcall_ok(&c)) kcall_cuda(&c, kern_dspark_verify_len(e, s, best, av, t, a.Lmax, c.stream), "dspark_verify_kernel");
  kcall_download(&c, a.expected, e, tb, "expected");
  kcall_download(&c, a.score, s, tb, "score");
  kcall_download(&c, a.L_star, best, sizeof(int32_t), "L_star");
  return kcall_end(&c);
}

/* qkv.cu: the query path, indexer query/weights and the SWA KV projection on
 * CUDA (see qkv.cuh; ops/qkv.c is the rule). */
#include "kernels/qkv.cuh"

#include "base/check.h"
#include "kernels/basic.cuh"
#include "kernels/formats.cuh"
#include "kernels/kcall.cuh"
#include "kernels/rope.cuh"

enum { QKV_THREADS = 256 };

static cublasStatus_t launched(cudaError_t e) {
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

cublasStatus_t kern_q_latent(cublasHandle_t h, float *cq, float *tmp, const float *u, const float *W_qa,
                             const float *gamma_q, int n, int hidden, int q_rank, float eps, cudaStream_t st) {
  cublasStatus_t s = kern_linear(h, tmp, u, W_qa, n, hidden, q_rank, hidden, q_rank, st);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  return launched(kern_rmsnorm(cq, tmp, gamma_q, n, q_rank, eps, st));
}

cublasStatus_t kern_q_heads(cublasHandle_t h, float *q, float *tmp, const float *cq, const float *W,
                            const struct op_rope *rope, const int64_t *pos, int n, int q_rank, int heads, int head_dim,
                            bool head_norm, float eps, cudaStream_t st) {
  const int width = heads * head_dim;
  cublasStatus_t s = kern_linear(h, head_norm ? tmp : q, cq, W, n, q_rank, width, q_rank, width, st);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  /* (n, heads*head_dim) row-major is (n*heads, head_dim): the per-head norm
   * is a weightless RMSNorm of every head row (ops/qkv.c). */
  if (head_norm && (s = launched(kern_rmsnorm(q, tmp, NULL, n * heads, head_dim, eps, st))) != CUBLAS_STATUS_SUCCESS)
    return s;
  return launched(kern_rope_apply(q, rope, pos, n, heads, width, +1, st));
}

__global__ void qkv_scale_kernel(float *w, long long total, float scale) {
  const long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (k < total) w[k] = __fmul_rn(w[k], scale); /* ops/qkv.c: w[i] *= scale, one rounding */
}

cublasStatus_t kern_index_weights(cublasHandle_t h, float *w, const float *u, const float *W_w, int n, int hidden,
                                  int heads, float scale, cudaStream_t st) {
  cublasStatus_t s = kern_linear(h, w, u, W_w, n, hidden, heads, hidden, heads, st);
  if (s != CUBLAS_STATUS_SUCCESS || scale == 1.0f || n <= 0 || heads <= 0) return s;
  const long long total = (long long)n * heads;
  qkv_scale_kernel<<<kcall_blocks(total, QKV_THREADS), QKV_THREADS, 0, st>>>(w, total, scale);
  return launched(cudaGetLastError());
}

cublasStatus_t kern_swa_kv(cublasHandle_t h, float *kS, float *tmp, uint8_t *entries, const struct op_kv_format *fmt,
                           const float *u, const float *W_kv, const float *gamma, const struct op_rope *rope,
                           const int64_t *pos, int n, int hidden, int head_dim, float eps, cudaStream_t st) {
  cublasStatus_t s = kern_linear(h, tmp, u, W_kv, n, hidden, head_dim, hidden, head_dim, st);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  if ((s = launched(kern_rmsnorm(kS, tmp, gamma, n, head_dim, eps, st))) != CUBLAS_STATUS_SUCCESS ||
      (s = launched(kern_rope_apply(kS, rope, pos, n, 1, head_dim, +1, st))) != CUBLAS_STATUS_SUCCESS || !entries)
    return s;
  return launched(kern_kv_pack_rows(fmt, entries, kS, n, head_dim, st));
}

/* ---- op slots ------------------------------------------------------------------------- */

enum qkv_kind { QKV_LATENT, QKV_MAIN, QKV_INDEXER, QKV_WEIGHTS, QKV_SWA };

/* One slot for the five ops: the call checked by the CPU's own prepare, then
 * upload, one launcher, download. */
static int qkv_run(const struct op_desc *self, struct op_io *io, enum qkv_kind kind) {
  struct op_qkv_call a;
  int rc = kind == QKV_LATENT    ? op_q_latent_prepare(self, io, &a)
           : kind == QKV_WEIGHTS ? op_index_weights_prepare(self, io, &a)
           : kind == QKV_SWA     ? op_swa_kv_prepare(self, io, &a)
                                 : op_q_heads_prepare(self, io, kind == QKV_MAIN, &a);
  if (rc) return rc;
  if (a.entries && kern_kv_pack_supported(&a.fmt)) /* every FP8 format swa_kv takes is supported: a guard */
    return op_io_fail(io, "%s on cuda: %s", self->name, kern_kv_pack_supported(&a.fmt));
  const size_t ob = (size_t)a.n * a.rows * sizeof(float);
  struct kcall c;
  kcall_begin(&c, self, io);
  const float *x = (const float *)kcall_upload(&c, a.x, (size_t)a.n * a.in * sizeof(float), "input rows");
  const float *W = (const float *)kcall_upload(&c, a.W, (size_t)a.rows * a.in * sizeof(float), "weight");
  const float *g = a.gamma ? (const float *)kcall_upload(&c, a.gamma, (size_t)a.rows * sizeof(float), "gamma") : NULL;
  const int64_t *pos = a.pos ? (const int64_t *)kcall_upload(&c, a.pos, (size_t)a.n * sizeof(int64_t), "pos") : NULL;
  float *out = (float *)kcall_alloc(&c, ob, "output");
  float *tmp = kind == QKV_WEIGHTS ? NULL : (float *)kcall_alloc(&c, ob, "projection");
  uint8_t *ent = a.entries ? (uint8_t *)kcall_alloc(&c, (size_t)a.n * a.bytes, "entries") : NULL;
  cublasHandle_t h = NULL;
  if (kcall_ok(&c)) {
    cublasStatus_t s = cublasCreate(&h);
    if (s == CUBLAS_STATUS_SUCCESS) switch (kind) {
        case QKV_LATENT: s = kern_q_latent(h, out, tmp, x, W, g, a.n, a.in, a.rows, a.eps, c.stream); break;
        case QKV_MAIN:
        case QKV_INDEXER:
          s = kern_q_heads(h, out, tmp, x, W, &a.rope, pos, a.n, a.in, a.heads, a.head_dim, a.head_norm, a.eps,
                           c.stream);
          break;
        case QKV_WEIGHTS: s = kern_index_weights(h, out, x, W, a.n, a.in, a.rows, a.scale, c.stream); break;
        case QKV_SWA:
          s = kern_swa_kv(h, out, tmp, ent, &a.fmt, x, W, g, &a.rope, pos, a.n, a.in, a.head_dim, a.eps, c.stream);
          break;
      }
    if (s != CUBLAS_STATUS_SUCCESS) kcall_fail(&c, CEDAR_EIO, "qkv kernels", cublasGetStatusString(s));
  }
  kcall_download(&c, a.out, out, ob, "output");
  if (ent) kcall_download(&c, a.entries, ent, (size_t)a.n * a.bytes, "entries");
  rc = kcall_end(&c); /* synchronizes before the handle goes */
  if (h) cublasDestroy(h);
  return rc;
}

int kern_q_latent_run(const struct op_desc *self, struct op_io *io) { return qkv_run(self, io, QKV_LATENT); }
int kern_q_main_run(const struct op_desc *self, struct op_io *io) { return qkv_run(self, io, QKV_MAIN); }
int kern_q_indexer_run(const struct op_desc *self, struct op_io *io) { return qkv_run(self, io, QKV_INDEXER); }
int kern_index_weights_run(const struct op_desc *self, struct op_io *io) { return qkv_run(self, io, QKV_WEIGHTS); }
int kern_swa_kv_run(const struct op_desc *self, struct op_io *io) { return qkv_run(self, io, QKV_SWA); }

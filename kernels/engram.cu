/* engram.cu: the Engram hash, gather and gate on CUDA (see engram.cuh). */
#include "kernels/engram.cuh"

#include "base/check.h"
#include "kernels/formats.cuh"
#include "kernels/kcall.cuh"
#include "kernels/reduce.cuh"
#include "ops/num_engram.h"

enum { ENG_THREADS = 128, INJ_THREADS = 256 };

__global__ void engram_hash_kernel(int64_t *row, const int32_t *tok, const uint8_t *dead, const int32_t *cmap,
                                   const uint64_t *mult, const int *orders, const int64_t *prime,
                                   const int64_t *offset, int n_hist, int n, int vocab, int n_orders, int n_heads,
                                   int max_order, int32_t pad_id, int *bad) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int u = n_hist + i;
  uint64_t g[KERN_ENGRAM_MAX_ORDER];
  int cut = 0;
  for (int k = 0; k < max_order; k++) { /* ops/engram.c gram_ids */
    if (u - k < 0 || (dead && dead[u - k])) cut = 1;
    int32_t id = pad_id;
    if (!cut) {
      const int32_t t = tok[u - k];
      if (t < 0 || t >= vocab) {
        if (bad) atomicMin(bad, u - k);
        return;
      }
      id = cmap[t];
    }
    g[k] = (uint64_t)(int64_t)id;
  }
  int64_t *ri = row + (size_t)i * n_orders * n_heads;
  for (int o = 0; o < n_orders; o++) {
    const uint64_t mix = op_hd_engram_mix(g, mult, orders[o]);
    for (int h = 0; h < n_heads; h++) {
      const int j = o * n_heads + h;
      ri[j] = op_hd_engram_row(mix, prime[j], offset[j]);
    }
  }
}

cudaError_t kern_engram_hash(int64_t *row, const int32_t *tok, const uint8_t *dead, const int32_t *cmap,
                             const uint64_t *mult, const int *orders, const int64_t *prime, const int64_t *offset,
                             int n_hist, int n, int vocab, int n_orders, int n_heads, int max_order, int32_t pad_id,
                             int *bad, cudaStream_t st) {
  if (max_order < 1 || max_order > KERN_ENGRAM_MAX_ORDER) return cudaErrorInvalidValue;
  if (n <= 0) return cudaSuccess;
  engram_hash_kernel<<<kcall_blocks(n, ENG_THREADS), ENG_THREADS, 0, st>>>(
      row, tok, dead, cmap, mult, orders, prime, offset, n_hist, n, vocab, n_orders, n_heads, max_order, pad_id, bad);
  return cudaGetLastError();
}

__global__ void engram_gather_kernel(float *e, const uint8_t *table, const int64_t *row, int64_t total, int head_dim,
                                     const struct op_kv_format f, size_t rb, int64_t n_rows) {
  const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= total) return;
  const int64_t r = row[k / head_dim];
  if (r < 0 || r >= n_rows) return; /* the caller's check (op_engram_gather asserts) */
  e[k] = kern_kv_value(f, table + (size_t)r * rb, head_dim, (int)(k % head_dim));
}

cudaError_t kern_engram_gather(float *e, const uint8_t *table, const int64_t *row, int n, int n_tables, int head_dim,
                               int block, int64_t n_rows, cudaStream_t st) {
  const size_t rb = op_engram_row_bytes(head_dim, block);
  if (!rb) return cudaErrorInvalidValue;
  struct op_kv_format f = {};
  f.elem = OP_KV_E4M3, f.scale = OP_KV_SCALE_E8M0, f.block = block, f.rule = OP_KV_CEIL;
  const int64_t total = (int64_t)n * n_tables * head_dim;
  if (total <= 0) return cudaSuccess;
  engram_gather_kernel<<<kcall_blocks(total, ENG_THREADS), ENG_THREADS, 0, st>>>(e, table, row, total, head_dim, f, rb,
                                                                                n_rows);
  return cudaGetLastError();
}

/* One (position, stream): ops/engram.c stream_gate and the update. */
__global__ void __launch_bounds__(INJ_THREADS) engram_gate_kernel(float *x, float *gate, const float *kv,
                                                                  const float *q_w, const float *k_w, int hidden,
                                                                  int hc, float eps, float dot_floor) {
  __shared__ float part[32];
  const int i = blockIdx.x, s = blockIdx.y;
  float *xs = x + ((size_t)i * hc + s) * hidden;
  const float *kvi = kv + (size_t)i * (hc + 1) * hidden, *key = kvi + (size_t)s * hidden,
              *value = kvi + (size_t)hc * hidden, *qw = q_w + (size_t)s * hidden, *kw = k_w + (size_t)s * hidden;
  float ssx = 0.0f, ssk = 0.0f, d = 0.0f;
  for (int j = threadIdx.x; j < hidden; j += blockDim.x) {
    ssx = __fadd_rn(ssx, __fmul_rn(xs[j], xs[j]));
    ssk = __fadd_rn(ssk, __fmul_rn(key[j], key[j]));
    d = __fadd_rn(d, __fmul_rn(__fmul_rn(xs[j], qw[j]), __fmul_rn(key[j], kw[j])));
  }
  ssx = kern_block_sum(ssx, part);
  ssk = kern_block_sum(ssk, part);
  d = kern_block_sum(d, part);
  const float fh = (float)hidden;
  const float rx = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ssx, fh), eps)));
  const float rk = __fdiv_rn(1.0f, __fsqrt_rn(__fadd_rn(__fdiv_rn(ssk, fh), eps)));
  const float dot = __fdiv_rn(__fmul_rn(__fmul_rn(d, rx), rk), __fsqrt_rn(fh));
  const float z = dot == 0.0f ? 0.0f : isnan(dot) ? dot : copysignf(__fsqrt_rn(fmaxf(fabsf(dot), dot_floor)), dot);
  const float g = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-z))); /* op_sigmoid */
  if (threadIdx.x == 0 && gate) gate[(size_t)i * hc + s] = g;
  __syncthreads(); /* every thread has read xs for the sums */
  for (int j = threadIdx.x; j < hidden; j += blockDim.x) xs[j] = __fadd_rn(xs[j], __fmul_rn(g, value[j]));
}

cublasStatus_t kern_engram_inject(cublasHandle_t h, float *x, float *kv, float *gate, const float *e,
                                  const float *w_kv, const float *q_w, const float *k_w, int n, int d_e, int hidden,
                                  int hc, float norm_eps, float dot_floor, cudaStream_t st) {
  if (n <= 0) return CUBLAS_STATUS_SUCCESS;
  const int w = (hc + 1) * hidden;
  cublasStatus_t s = cublasSetStream(h, st);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH);
  const float one = 1.0f, zero = 0.0f;
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, w, n, d_e, &one, w_kv, d_e, e, d_e, &zero, kv, w);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  engram_gate_kernel<<<dim3((unsigned)n, (unsigned)hc), INJ_THREADS, 0, st>>>(x, gate, kv, q_w, k_w, hidden, hc,
                                                                              norm_eps, dot_floor);
  return cudaGetLastError() == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

/* ---- op slots ------------------------------------------------------------------------- */

int kern_engram_hash_run(const struct op_desc *self, struct op_io *io) {
  struct op_engram_hash_call a;
  int rc = op_engram_hash_prepare(self, io, &a);
  if (rc) return rc;
  for (int u = 0; u < a.n_hist + a.n; u++) /* op_engram_hash's check, before any device work */
    if (a.tok[u] < 0 || a.tok[u] >= a.vocab) {
      rc = op_engram_hash_bad_token(io, &a, u);
      op_engram_hash_release(&a);
      return rc;
    }
  if (a.max_order > KERN_ENGRAM_MAX_ORDER) {
    rc = op_io_fail(io, "engram_hash on cuda: orders up to %d are supported, not %d", KERN_ENGRAM_MAX_ORDER,
                    a.max_order);
    op_engram_hash_release(&a);
    return rc;
  }
  const int nt = a.n_hist + a.n, tabs = a.n_orders * a.heads;
  struct kcall c;
  kcall_begin(&c, self, io);
  const int32_t *tok = (const int32_t *)kcall_upload(&c, a.tok, (size_t)nt * sizeof(int32_t), "tokens");
  const uint8_t *dead = a.dead ? (const uint8_t *)kcall_upload(&c, a.dead, (size_t)nt, "dead") : NULL;
  const int32_t *cmap = (const int32_t *)kcall_upload(&c, a.cmap, (size_t)a.vocab * sizeof(int32_t), "cmap");
  const uint64_t *mult = (const uint64_t *)kcall_upload(&c, a.mult, (size_t)a.max_order * sizeof(uint64_t), "mult");
  const int *orders = (const int *)kcall_upload(&c, a.orders, (size_t)a.n_orders * sizeof(int), "orders");
  const int64_t *prime = (const int64_t *)kcall_upload(&c, a.prime, (size_t)tabs * sizeof(int64_t), "primes");
  const int64_t *offset = (const int64_t *)kcall_upload(&c, a.offset, (size_t)tabs * sizeof(int64_t), "offsets");
  int64_t *rows = (int64_t *)kcall_alloc(&c, (size_t)a.n * tabs * sizeof(int64_t), "rows");
  if (kcall_ok(&c))
    kcall_cuda(&c,
               kern_engram_hash(rows, tok, dead, cmap, mult, orders, prime, offset, a.n_hist, a.n, a.vocab,
                                a.n_orders, a.heads, a.max_order, a.pad, NULL, c.stream),
               "engram_hash_kernel");
  kcall_download(&c, a.rows, rows, (size_t)a.n * tabs * sizeof(int64_t), "rows");
  rc = kcall_end(&c);
  op_engram_hash_release(&a);
  return rc;
}

int kern_engram_gather_run(const struct op_desc *self, struct op_io *io) {
  struct op_engram_gather_call a;
  int rc = op_engram_gather_prepare(self, io, &a);
  if (rc) return rc;
  const size_t eb = (size_t)a.n * a.tables * a.head_dim * sizeof(float);
  struct kcall c;
  kcall_begin(&c, self, io);
  const uint8_t *table = (const uint8_t *)kcall_upload(&c, a.table, (size_t)a.n_rows * a.row_bytes, "table");
  const int64_t *rows = (const int64_t *)kcall_upload(&c, a.rows, (size_t)a.n * a.tables * sizeof(int64_t), "rows");
  float *e = (float *)kcall_alloc(&c, eb, "e");
  if (kcall_ok(&c))
    kcall_cuda(&c, kern_engram_gather(e, table, rows, a.n, a.tables, a.head_dim, a.block, a.n_rows, c.stream),
               "engram_gather_kernel");
  kcall_download(&c, a.e, e, eb, "e");
  return kcall_end(&c);
}

int kern_engram_inject_run(const struct op_desc *self, struct op_io *io) {
  struct op_engram_inject_call a;
  int rc = op_engram_inject_prepare(self, io, &a);
  if (rc) return rc;
  const int kvw = (a.hc + 1) * a.hidden;
  const size_t xb = (size_t)a.n * a.hc * a.hidden * sizeof(float), kb = (size_t)a.n * kvw * sizeof(float),
               gb = (size_t)a.n * a.hc * sizeof(float);
  struct kcall c;
  kcall_begin(&c, self, io);
  float *x = (float *)kcall_upload(&c, a.X, xb, "X"); /* updated in place into X_next */
  const float *e = (const float *)kcall_upload(&c, a.e, (size_t)a.n * a.d_e * sizeof(float), "e");
  const float *w = (const float *)kcall_upload(&c, a.w_kv, (size_t)kvw * a.d_e * sizeof(float), "w_kv");
  const float *q = (const float *)kcall_upload(&c, a.q_w, (size_t)a.hc * a.hidden * sizeof(float), "q_w");
  const float *k = (const float *)kcall_upload(&c, a.k_w, (size_t)a.hc * a.hidden * sizeof(float), "k_w");
  float *kv = (float *)kcall_alloc(&c, kb, "kv"), *gate = (float *)kcall_alloc(&c, gb, "gate");
  cublasHandle_t h = NULL;
  if (kcall_ok(&c)) {
    cublasStatus_t s = cublasCreate(&h);
    if (s == CUBLAS_STATUS_SUCCESS)
      s = kern_engram_inject(h, x, kv, gate, e, w, q, k, a.n, a.d_e, a.hidden, a.hc, a.norm_eps, a.dot_floor,
                             c.stream);
    if (s != CUBLAS_STATUS_SUCCESS) kcall_fail(&c, CEDAR_EIO, "engram inject", cublasGetStatusString(s));
  }
  kcall_download(&c, a.X_next, x, xb, "X_next");
  kcall_download(&c, a.kv, kv, kb, "kv");
  kcall_download(&c, a.gate, gate, gb, "gate");
  rc = kcall_end(&c);
  if (h) cublasDestroy(h);
  return rc;
}

/* compressor.cu: the KV-source compressor on CUDA (see compressor.cuh;
 * ops/compressor.c is the rule). */
#include "kernels/compressor.cuh"

#include "base/check.h"
#include "kernels/basic.cuh"
#include "kernels/formats.cuh"
#include "kernels/kcall.cuh"
#include "kernels/rope.cuh"

enum { COMP_THREADS = 128 };

size_t kern_compress_scratch_floats(int n, int ratio, int d, int idx_dim) {
  const size_t rows = (size_t)n * d, ne = (size_t)(n / ratio);
  /* v, g (ratio > 1), c_hat, c, kI before k_norm */
  return rows * (ratio > 1 ? 2 : 1) + 2 * ne * d + ne * idx_dim + 1;
}

/* c_hat of entry e, channel c: ops/compressor.c's pool_group (and pool_pair,
 * the same operations at ratio 2: the max's slot has z = +0, exp(+0) = 1). */
__global__ void comp_pool_kernel(float *__restrict__ c_hat, const float *__restrict__ v, const float *__restrict__ g,
                                 int n_emit, int r, int d) {
  const long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= (long long)n_emit * d) return;
  const int e = (int)(k / d), c = (int)(k % d);
  const size_t row0 = (size_t)e * r;
  if (r == 1) {
    c_hat[k] = v[row0 * d + c];
    return;
  }
  float m = g[row0 * d + c];
  for (int s = 1; s < r; s++) {
    const float gs = g[(row0 + s) * d + c];
    m = gs > m ? gs : m;
  }
  float sum = 0.0f, acc = 0.0f;
  for (int s = 0; s < r; s++) {
    const size_t i = (row0 + s) * d + c;
    const float w = expf(__fsub_rn(g[i], m));
    sum = __fadd_rn(sum, w);
    acc = __fadd_rn(acc, __fmul_rn(w, v[i]));
  }
  c_hat[k] = __fdiv_rn(acc, sum);
}

/* Block b of entry e: the Main-KV blocks first, then the Indexer-K ones. */
__global__ void comp_pack_kernel(const struct op_kv_format mf, const struct op_kv_format xf, uint8_t *entries,
                                 size_t entry_bytes, size_t main_off, size_t idx_off, const float *__restrict__ kM,
                                 const float *__restrict__ kI, int n_emit, int d, int di) {
  const int nbm = d / mf.block, nbi = di / xf.block;
  const long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= (long long)n_emit * (nbm + nbi)) return;
  const int e = (int)(k / (nbm + nbi)), b = (int)(k % (nbm + nbi));
  uint8_t *entry = entries + (size_t)e * entry_bytes;
  if (b < nbm)
    kern_kv_pack_block(mf, entry + main_off, kM + (size_t)e * d, d, b);
  else
    kern_kv_pack_block(xf, entry + idx_off, kI + (size_t)e * di, di, b - nbm);
}

static cublasStatus_t launched(cudaError_t e) {
  return e == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

/* n groups of r rows of v and g (pooled by position order) into entries:
 * pool, RMSNorm_C, kI (and its k_norm) from c before any RoPE, kM = c, the
 * two RoPEs at the entries' positions pos (device), both parts packed. The
 * one sequence kern_compress_tail and kern_compress_step share, so a
 * segment's step makes each float as the eager call does. */
static cublasStatus_t groups_to_entries(cublasHandle_t h, uint8_t *entries, size_t entry_bytes, size_t main_off,
                                        size_t idx_off, float *c_hat, float *c, float *kM, float *kI0, float *kI,
                                        const float *v, const float *g, const int64_t *pos, int n,
                                        const struct op_comp_layer *L, cudaStream_t st) {
  const int r = L->ratio, d = L->d, di = L->idx_dim;
  cublasStatus_t s;
  comp_pool_kernel<<<kcall_blocks((long long)n * d, COMP_THREADS), COMP_THREADS, 0, st>>>(c_hat, v, g, n, r, d);
  if ((s = launched(cudaGetLastError())) != CUBLAS_STATUS_SUCCESS ||
      (s = launched(kern_rmsnorm(c, c_hat, L->gamma, n, d, L->eps, st))) != CUBLAS_STATUS_SUCCESS)
    return s;
  /* kI from c before any RoPE or quantization (SPEC 3.8, 8.10) */
  if ((s = kern_linear(h, L->k_norm ? kI0 : kI, c, L->W_ik, n, d, di, d, di, st)) != CUBLAS_STATUS_SUCCESS ||
      (L->k_norm && (s = launched(kern_rmsnorm(kI, kI0, L->k_gamma, n, di, L->eps, st))) != CUBLAS_STATUS_SUCCESS))
    return s;
  if ((s = launched(cudaMemcpyAsync(kM, c, (size_t)n * d * sizeof(float), cudaMemcpyDeviceToDevice, st))) !=
          CUBLAS_STATUS_SUCCESS ||
      (s = launched(kern_rope_apply(kM, L->rope, pos, n, 1, d, +1, st))) != CUBLAS_STATUS_SUCCESS ||
      (s = launched(kern_rope_apply(kI, L->rope_i, pos, n, 1, di, +1, st))) != CUBLAS_STATUS_SUCCESS)
    return s;
  const long long blocks = (long long)n * (d / L->main_fmt.block + di / L->idx_fmt.block);
  comp_pack_kernel<<<kcall_blocks(blocks, COMP_THREADS), COMP_THREADS, 0, st>>>(
      L->main_fmt, L->idx_fmt, entries, entry_bytes, main_off, idx_off, kM, kI, n, d, di);
  return launched(cudaGetLastError());
}

cublasStatus_t kern_compress(cublasHandle_t h, uint8_t *entries, size_t entry_bytes, size_t main_off, size_t idx_off,
                             float *kM, float *kI, float *tail_v, float *tail_g, const float *u, const int64_t *pos,
                             int n, const struct op_comp_layer *L, float *scratch, cudaStream_t st) {
  return kern_compress_tail(h, entries, entry_bytes, main_off, idx_off, kM, kI, tail_v, tail_g, 0, u, pos, n, L,
                            scratch, st);
}

cublasStatus_t kern_compress_tail(cublasHandle_t h, uint8_t *entries, size_t entry_bytes, size_t main_off,
                                  size_t idx_off, float *kM, float *kI, float *tail_v, float *tail_g, int count,
                                  const float *u, const int64_t *pos, int n_new, const struct op_comp_layer *L,
                                  float *scratch, cudaStream_t st) {
  const int r = L->ratio, d = L->d, n = count + n_new, n_emit = n / r, left = n % r;
  if (n_new <= 0) return CUBLAS_STATUS_SUCCESS;
  if (count < 0 || count >= r) return CUBLAS_STATUS_INVALID_VALUE;
  if (kern_kv_pack_supported(&L->main_fmt) || kern_kv_pack_supported(&L->idx_fmt)) return CUBLAS_STATUS_NOT_SUPPORTED;
  const size_t rows = (size_t)n * d;
  float *v = scratch, *g = r > 1 ? v + rows : NULL;
  float *c_hat = v + rows * (r > 1 ? 2 : 1), *c = c_hat + (size_t)n_emit * d, *kI0 = c + (size_t)n_emit * d;
  cublasStatus_t s = CUBLAS_STATUS_SUCCESS;
  if (count) { /* the pending rows first, in position order, then the call's own (op_comp_push's group order) */
    const size_t bytes = (size_t)count * d * sizeof(float);
    if ((s = launched(cudaMemcpyAsync(v, tail_v, bytes, cudaMemcpyDeviceToDevice, st))) != CUBLAS_STATUS_SUCCESS ||
        (s = launched(cudaMemcpyAsync(g, tail_g, bytes, cudaMemcpyDeviceToDevice, st))) != CUBLAS_STATUS_SUCCESS)
      return s;
  }
  const size_t at = (size_t)count * d;
  s = kern_linear(h, v + at, u, L->W_kv, n_new, L->hidden, d, L->hidden, d, st);
  if (s == CUBLAS_STATUS_SUCCESS && r > 1) s = kern_linear(h, g + at, u, L->W_gate, n_new, L->hidden, d, L->hidden, d, st);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  if (left) { /* the tail: the projected rows after the last whole group */
    const size_t off = (size_t)n_emit * r * d, bytes = (size_t)left * d * sizeof(float);
    if ((s = launched(cudaMemcpyAsync(tail_v, v + off, bytes, cudaMemcpyDeviceToDevice, st))) != CUBLAS_STATUS_SUCCESS ||
        (r > 1 && (s = launched(cudaMemcpyAsync(tail_g, g + off, bytes, cudaMemcpyDeviceToDevice, st))) !=
                      CUBLAS_STATUS_SUCCESS))
      return s;
  }
  if (n_emit == 0) return CUBLAS_STATUS_SUCCESS;
  return groups_to_entries(h, entries, entry_bytes, main_off, idx_off, c_hat, c, kM, kI0, kI, v, g, pos, n_emit, L, st);
}

/* ---- the step inside a graph segment (device counts) ---------------------------- */

/* Rows [0, *cnt) from the tail, then the n_new projected rows, then zeros
 * up to rows (the groups that could close). */
__global__ void comp_step_gather_kernel(float *__restrict__ v, const float *__restrict__ tv,
                                        const float *__restrict__ vn, const int32_t *cnt, int n_new, int rows, int d) {
  const long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= (long long)rows * d) return;
  const int i = (int)(k / d), c = (int)(k % d), have = *cnt;
  v[k] = i < have ? tv[(size_t)i * d + c] : i < have + n_new ? vn[(size_t)(i - have) * d + c] : 0.0f;
}

__global__ void comp_step_pos_kernel(int64_t *epos, const int64_t *pos0, int groups, int r) {
  const int e = blockIdx.x * blockDim.x + threadIdx.x;
  if (e < groups) epos[e] = *pos0 + (int64_t)e * r;
}

/* Entry e of the closed groups into its page: *e0 + e. */
__global__ void comp_step_write_kernel(uint8_t *const *pages, int page_entries, size_t eb, const int64_t *e0,
                                       const int32_t *cnt, int n_new, int r, const uint8_t *__restrict__ entries) {
  const int e = blockIdx.x;
  if (e >= (*cnt + n_new) / r) return;
  const int64_t at = *e0 + e;
  uint8_t *dst = pages[at / page_entries] + (size_t)(at % page_entries) * eb;
  for (size_t b = threadIdx.x; b < eb; b += blockDim.x) dst[b] = entries[(size_t)e * eb + b];
}

/* The rows after the last closed group become the tail. */
__global__ void comp_step_tail_kernel(float *__restrict__ tv, const float *__restrict__ v, const int32_t *cnt,
                                      int n_new, int r, int d) {
  const long long k = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  const int total = *cnt + n_new, first = total / r * r;
  if (k >= (long long)(total - first) * d) return;
  tv[k] = v[(size_t)first * d + k];
}

static size_t step_align(size_t b) { return (b + 255) / 256 * 256; }

size_t kern_compress_step_scratch_bytes(int n_new, int ratio, int d, int idx_dim, size_t entry_bytes) {
  const size_t rows = (size_t)(ratio - 1 + n_new), groups = rows / (size_t)ratio, f = sizeof(float);
  return step_align(rows * d * f) * (ratio > 1 ? 2 : 1) + step_align((size_t)n_new * d * f) * (ratio > 1 ? 2 : 1) +
         step_align(groups * d * f) * 3 + step_align(groups * idx_dim * f) * 2 + step_align(groups * sizeof(int64_t)) +
         step_align(groups * entry_bytes) + 256;
}

cublasStatus_t kern_compress_step(cublasHandle_t h, uint8_t *const *pages, int page_entries, size_t entry_bytes,
                                  size_t main_off, size_t idx_off, float *tail_v, float *tail_g, const int32_t *cnt,
                                  const int64_t *pos0, const int64_t *e0, const float *u, int n_new,
                                  const struct op_comp_layer *L, void *scratch, cudaStream_t st) {
  const int r = L->ratio, d = L->d, di = L->idx_dim, rows = r - 1 + n_new, groups = rows / r;
  if (n_new <= 0) return CUBLAS_STATUS_SUCCESS;
  if (kern_kv_pack_supported(&L->main_fmt) || kern_kv_pack_supported(&L->idx_fmt)) return CUBLAS_STATUS_NOT_SUPPORTED;
  const size_t f = sizeof(float);
  char *at = (char *)scratch;
  float *v = (float *)at, *g = NULL;
  at += step_align((size_t)rows * d * f);
  if (r > 1) g = (float *)at, at += step_align((size_t)rows * d * f);
  float *vn = (float *)at, *gn = NULL;
  at += step_align((size_t)n_new * d * f);
  if (r > 1) gn = (float *)at, at += step_align((size_t)n_new * d * f);
  float *c_hat = (float *)at, *c = c_hat + 0, *kM, *kI0, *kI;
  at += step_align((size_t)groups * d * f);
  c = (float *)at, at += step_align((size_t)groups * d * f);
  kM = (float *)at, at += step_align((size_t)groups * d * f);
  kI0 = (float *)at, at += step_align((size_t)groups * di * f);
  kI = (float *)at, at += step_align((size_t)groups * di * f);
  int64_t *epos = (int64_t *)at;
  at += step_align((size_t)groups * sizeof(int64_t));
  uint8_t *entries = (uint8_t *)at;
  cublasStatus_t s = kern_linear(h, vn, u, L->W_kv, n_new, L->hidden, d, L->hidden, d, st);
  if (s == CUBLAS_STATUS_SUCCESS && r > 1) s = kern_linear(h, gn, u, L->W_gate, n_new, L->hidden, d, L->hidden, d, st);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  const long long cells = (long long)rows * d;
  comp_step_gather_kernel<<<kcall_blocks(cells, COMP_THREADS), COMP_THREADS, 0, st>>>(v, tail_v, vn, cnt, n_new, rows,
                                                                                     d);
  if (r > 1)
    comp_step_gather_kernel<<<kcall_blocks(cells, COMP_THREADS), COMP_THREADS, 0, st>>>(g, tail_g, gn, cnt, n_new,
                                                                                       rows, d);
  if ((s = launched(cudaGetLastError())) != CUBLAS_STATUS_SUCCESS) return s;
  if (r > 1) { /* the rows after the last closed group, before the pool reads v (tail_v is no input past here) */
    const long long tcells = (long long)(r - 1) * d;
    comp_step_tail_kernel<<<kcall_blocks(tcells, COMP_THREADS), COMP_THREADS, 0, st>>>(tail_v, v, cnt, n_new, r, d);
    comp_step_tail_kernel<<<kcall_blocks(tcells, COMP_THREADS), COMP_THREADS, 0, st>>>(tail_g, g, cnt, n_new, r, d);
    if ((s = launched(cudaGetLastError())) != CUBLAS_STATUS_SUCCESS) return s;
  }
  if (groups == 0) return CUBLAS_STATUS_SUCCESS;
  comp_step_pos_kernel<<<kcall_blocks(groups, COMP_THREADS), COMP_THREADS, 0, st>>>(epos, pos0, groups, r);
  if ((s = launched(cudaGetLastError())) != CUBLAS_STATUS_SUCCESS ||
      (s = groups_to_entries(h, entries, entry_bytes, main_off, idx_off, c_hat, c, kM, kI0, kI, v, g, epos, groups, L,
                             st)) != CUBLAS_STATUS_SUCCESS)
    return s;
  comp_step_write_kernel<<<groups, COMP_THREADS, 0, st>>>(pages, page_entries, entry_bytes, e0, cnt, n_new, r, entries);
  return launched(cudaGetLastError());
}

/* ---- op slot ---------------------------------------------------------------------- */

int kern_compress_run(const struct op_desc *self, struct op_io *io) {
  struct op_compress_call a;
  int rc = op_compress_prepare(self, io, &a);
  if (rc) return rc;
  const struct op_comp_layer *H = &a.L;
  const int r = H->ratio, d = H->d, di = H->idx_dim, ne = a.n_emit;
  const size_t wb = (size_t)d * H->hidden * sizeof(float), eb = (size_t)ne * a.out.entry_bytes;
  struct kcall c;
  kcall_begin(&c, self, io);
  struct op_comp_layer L = *H; /* the device copy: weights on the device, ropes still a's */
  L.rope = &a.rope, L.rope_i = &a.rope_i;
  const float *u = (const float *)kcall_upload(&c, a.u, (size_t)a.n * H->hidden * sizeof(float), "u");
  L.W_kv = (const float *)kcall_upload(&c, H->W_kv, wb, "W_kv");
  L.W_gate = r > 1 ? (const float *)kcall_upload(&c, H->W_gate, wb, "W_gate") : NULL;
  L.gamma = H->gamma ? (const float *)kcall_upload(&c, H->gamma, (size_t)d * sizeof(float), "gamma_c") : NULL;
  L.W_ik = (const float *)kcall_upload(&c, H->W_ik, (size_t)di * d * sizeof(float), "W_ik");
  L.k_gamma = H->k_gamma ? (const float *)kcall_upload(&c, H->k_gamma, (size_t)di * sizeof(float), "k_gamma") : NULL;
  const int64_t *pos = (const int64_t *)kcall_upload(&c, a.out.pos, (size_t)ne * sizeof(int64_t), "pos");
  uint8_t *entries = (uint8_t *)kcall_alloc(&c, eb, "entries");
  float *kM = (float *)kcall_alloc(&c, (size_t)ne * d * sizeof(float), "kM");
  float *kI = (float *)kcall_alloc(&c, (size_t)ne * di * sizeof(float), "kI");
  const size_t tb = (size_t)a.left * d * sizeof(float);
  float *tv = (float *)kcall_alloc(&c, tb, "tail_v"), *tg = (float *)kcall_alloc(&c, tb, "tail_g");
  float *scratch = (float *)kcall_alloc(&c, kern_compress_scratch_floats(a.n, r, d, di) * sizeof(float), "scratch");
  cublasHandle_t h = NULL;
  if (kcall_ok(&c)) {
    cublasStatus_t s = cublasCreate(&h);
    if (s == CUBLAS_STATUS_SUCCESS)
      s = kern_compress(h, entries, a.out.entry_bytes, a.out.main_off, a.out.idx_off, kM, kI, tv, tg, u, pos, a.n, &L,
                        scratch, c.stream);
    if (s != CUBLAS_STATUS_SUCCESS) kcall_fail(&c, CEDAR_EIO, "compressor kernels", cublasGetStatusString(s));
  }
  kcall_download(&c, a.out.entries, entries, eb, "entries");
  kcall_download(&c, a.tail_v, tv, tb, "tail_v");
  kcall_download(&c, a.tail_g, tg, tb, "tail_g");
  if (a.floats) {
    kcall_download(&c, a.out.kM, kM, (size_t)ne * d * sizeof(float), "kM");
    kcall_download(&c, a.out.kI, kI, (size_t)ne * di * sizeof(float), "kI");
  }
  rc = kcall_end(&c); /* synchronizes before the handle goes */
  if (h) cublasDestroy(h);
  return rc;
}

/* indexer.cu: indexer scores, Top-K and the candidate pool on CUDA (see
 * indexer.cuh). */
#include "kernels/indexer.cuh"

#include "base/check.h"
#include "kernels/formats.cuh"
#include "kernels/kcall.cuh"

enum { IDX_THREADS = 256, IDX_MAX_K = 4096 };

size_t kern_indexer_topk_scratch_bytes(const struct op_kv_view *kv, int S, int pool_block) {
  const size_t n = (size_t)(kv->n_entries > 0 ? kv->n_entries : 1);
  const size_t nb = pool_block > 0 ? (n + (size_t)pool_block - 1) / (size_t)pool_block : 0;
  return (size_t)(S > 0 ? S : 1) * (n + nb) * sizeof(float);
}

/* The entries query position pos may see: those committed by then, at most
 * the view's committed count (in device memory inside a graph segment:
 * op_kv_view.n_dev). */
__device__ __forceinline__ int64_t visible(int64_t pos, const struct op_kv_view &kv) {
  const int64_t n = (pos + 1) / kv.ratio, c = kv.n_dev ? *kv.n_dev : kv.n_entries;
  return n < c ? n : c;
}

__global__ void idx_score_kernel(float *scores, const float *q, const float *w, const int64_t *pos,
                                 const struct op_kv_view kv, int heads, int64_t ld) {
  const int i = blockIdx.y;
  const int64_t s = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (s >= visible(pos[i], kv)) return;
  const uint8_t *key = kv.pages[s / kv.page_entries] + (size_t)(s % kv.page_entries) * kv.entry_bytes + kv.idx_off;
  const int hd = kv.idx_w;
  const float *qi = q + (size_t)i * heads * hd, *wi = w + (size_t)i * heads;
  float out = 0.0f;
  for (int h = 0; h < heads; h++) { /* ops/indexer.c score_tile: heads in order, channels in order */
    float d = 0.0f;
    for (int c = 0; c < hd; c++) d = __fadd_rn(d, __fmul_rn(qi[(size_t)h * hd + c], kern_kv_value(kv.idx_fmt, key, hd, c)));
    out = __fadd_rn(out, __fmul_rn(wi[h], d < 0.0f ? 0.0f : d));
  }
  scores[(size_t)i * ld + s] = out;
}

/* The ranking as one unsigned key: larger ranks first. NaN above every
 * number, -0 as +0, then the lower index first. */
__device__ __forceinline__ unsigned long long rank_key(float v, int64_t idx) {
  uint32_t u = __float_as_uint(v);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) u = 0xFFFFFFFFu;
  else {
    if (u == 0x80000000u) u = 0;
    u = (u & 0x80000000u) ? ~u : u | 0x80000000u;
  }
  return (unsigned long long)u << 32 | (0xFFFFFFFFu - (uint32_t)idx);
}

/* out (k) = the min(k, candidates) best of v[s], s in [0, n) with mask[s]
 * (every s when mask is NULL), ascending, then -1; one CTA. Keys are never 0,
 * so a round whose best is 0 found no candidate left. */
__device__ void block_topk(int32_t *out, const float *v, int64_t n, int k, unsigned long long *red, int32_t *picks,
                           const uint8_t *mask) {
  int m = 0;
  unsigned long long prev = 0; /* the previous pick's key (round 0: none) */
  for (int j = 0; j < k && j < n; j++) {
    unsigned long long best = 0;
    bool have = false;
    for (int64_t s = threadIdx.x; s < n; s += blockDim.x) {
      if (mask && !mask[s]) continue;
      const unsigned long long key = rank_key(v[s], s);
      if ((j == 0 || key < prev) && (!have || key > best)) best = key, have = true;
    }
    red[threadIdx.x] = have ? best : 0;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
      if (threadIdx.x < o) red[threadIdx.x] = max(red[threadIdx.x], red[threadIdx.x + o]);
      __syncthreads();
    }
    prev = red[0];
    if (prev == 0) break; /* every thread reads the same red[0] */
    if (threadIdx.x == 0) picks[j] = (int32_t)(0xFFFFFFFFu - (uint32_t)(prev & 0xFFFFFFFFu));
    m = j + 1;
    __syncthreads();
  }
  __syncthreads();
  for (int j = threadIdx.x; j < k; j += blockDim.x) { /* ascending: a pick's place is how many picks are smaller */
    if (j >= m) {
      out[j] = -1;
      continue;
    }
    int at = 0;
    for (int q = 0; q < m; q++) at += picks[q] < picks[j];
    out[at] = picks[j];
  }
  __syncthreads();
}

__global__ void idx_select_kernel(int32_t *topk, int32_t *pool, float *scores, float *bscores, const int64_t *pos,
                                  const struct op_kv_view kv, int k, int pool_block, int top_blocks, int pin_newest,
                                  int64_t ld, int64_t ldb) {
  extern __shared__ int32_t picks[];
  __shared__ unsigned long long red[IDX_THREADS];
  const int i = blockIdx.x;
  const int64_t n = visible(pos[i], kv);
  const float *sc = scores + (size_t)i * ld;
  block_topk(topk + (size_t)i * k, sc, n, k, red, picks, NULL);
  if (!pool) return;
  const int64_t nb = (n + pool_block - 1) / pool_block;
  float *bs = bscores + (size_t)i * ldb;
  for (int64_t b = threadIdx.x; b < nb; b += blockDim.x) { /* ops/indexer.c op_pool_select */
    const int64_t s0 = b * pool_block, s1 = s0 + pool_block < n ? s0 + pool_block : n;
    float best = sc[s0];
    for (int64_t s = s0 + 1; s < s1; s++) {
      const float v = sc[s];
      const bool vn = isnan(v), bn = isnan(best);
      if (vn ? !bn : (!bn && v > best)) best = v;
    }
    bs[b] = pin_newest && b == nb - 1 ? INFINITY : best;
  }
  __syncthreads();
  block_topk(pool + (size_t)i * top_blocks, bs, nb, top_blocks, red, picks, NULL);
}

cudaError_t kern_indexer_topk(int32_t *topk, int32_t *pool, const float *q, const float *w, const int64_t *pos,
                              const struct op_kv_view *kv, int S, int heads, int k, int pool_block, int top_blocks,
                              bool pin_newest, void *scratch, cudaStream_t st) {
  if (S <= 0) return cudaSuccess;
  const int kk = pool && top_blocks > k ? top_blocks : k;
  if (kk > IDX_MAX_K || k < 1 || (pool && (pool_block < 1 || top_blocks < 1))) return cudaErrorInvalidValue;
  const int64_t ld = kv->n_entries > 0 ? kv->n_entries : 1, ldb = pool ? (ld + pool_block - 1) / pool_block : 0;
  float *scores = (float *)scratch, *bscores = scores + (size_t)S * ld;
  if (kv->n_entries > 0) {
    const dim3 grid(kcall_blocks(kv->n_entries, IDX_THREADS), (unsigned)S);
    idx_score_kernel<<<grid, IDX_THREADS, 0, st>>>(scores, q, w, pos, *kv, heads, ld);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  idx_select_kernel<<<S, IDX_THREADS, (size_t)kk * sizeof(int32_t), st>>>(topk, pool, scores, bscores, pos, *kv, k,
                                                                          pool_block, top_blocks, pin_newest, ld, ldb);
  return cudaGetLastError();
}

/* Reindex: the candidates of query i are the visible entries of its pool's
 * blocks (mask), then the same top-k over the full-scan scores restricted to
 * them (a candidate's score is the full scan's: one function, one order). */
__global__ void reindex_select_kernel(int32_t *topk, const float *scores, uint8_t *mask, const int32_t *pool,
                                      const int64_t *pos, const struct op_kv_view kv, int k, int pool_block,
                                      int pool_top, int64_t ld) {
  extern __shared__ int32_t picks[];
  __shared__ unsigned long long red[IDX_THREADS];
  const int i = blockIdx.x;
  const int64_t n = visible(pos[i], kv);
  uint8_t *mi = mask + (size_t)i * ld;
  for (int64_t s = threadIdx.x; s < n; s += blockDim.x) mi[s] = 0;
  __syncthreads();
  const int32_t *pi = pool + (size_t)i * pool_top;
  for (int64_t t = threadIdx.x; t < (int64_t)pool_top * pool_block; t += blockDim.x) {
    const int32_t b = pi[t / pool_block];
    const int64_t s = (int64_t)b * pool_block + t % pool_block;
    if (b >= 0 && s < n) mi[s] = 1;
  }
  __syncthreads();
  block_topk(topk + (size_t)i * k, scores + (size_t)i * ld, n, k, red, picks, mi);
}

cudaError_t kern_indexer_reindex(int32_t *topk, const int32_t *pool, const float *q, const float *w,
                                 const int64_t *pos, const struct op_kv_view *kv, int S, int heads, int k,
                                 int pool_block, int pool_top, void *scratch, cudaStream_t st) {
  if (S <= 0) return cudaSuccess;
  if (k < 1 || k > IDX_MAX_K || pool_block < 1 || pool_top < 1) return cudaErrorInvalidValue;
  const int64_t ld = kv->n_entries > 0 ? kv->n_entries : 1;
  float *scores = (float *)scratch;
  uint8_t *mask = (uint8_t *)(scores + (size_t)S * ld);
  if (kv->n_entries > 0) {
    const dim3 grid(kcall_blocks(kv->n_entries, IDX_THREADS), (unsigned)S);
    idx_score_kernel<<<grid, IDX_THREADS, 0, st>>>(scores, q, w, pos, *kv, heads, ld);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  reindex_select_kernel<<<S, IDX_THREADS, (size_t)k * sizeof(int32_t), st>>>(topk, scores, mask, pool, pos, *kv, k,
                                                                             pool_block, pool_top, ld);
  return cudaGetLastError();
}

int kern_reindex_run(const struct op_desc *self, struct op_io *io) {
  struct op_reindex_call a;
  int rc = op_reindex_prepare(self, io, &a);
  if (rc) return rc;
  if (a.k > IDX_MAX_K) return op_io_fail(io, "reindex on cuda: k up to %d, not %d", IDX_MAX_K, a.k);
  const int S = a.S, hd = a.kv.idx_w;
  const size_t ld = (size_t)(a.kv.n_entries > 0 ? a.kv.n_entries : 1);
  struct kcall c;
  kcall_begin(&c, self, io);
  const float *q = (const float *)kcall_upload(&c, a.q, (size_t)S * a.heads * hd * sizeof(float), "q");
  const float *w = (const float *)kcall_upload(&c, a.w, (size_t)S * a.heads * sizeof(float), "w");
  const int64_t *pos = (const int64_t *)kcall_upload(&c, a.pos, (size_t)S * sizeof(int64_t), "pos");
  const int32_t *pool = (const int32_t *)kcall_upload(&c, a.pool, (size_t)S * a.pool_top * sizeof(int32_t), "pool");
  const uint8_t *page = (const uint8_t *)kcall_upload(&c, a.page, (size_t)a.kv.n_entries * a.kv.entry_bytes, "keys");
  struct op_kv_view kv = a.kv;
  kv.pages = (const uint8_t *const *)kcall_upload(&c, &page, sizeof page, "page table");
  int32_t *topk = (int32_t *)kcall_alloc(&c, (size_t)S * a.k * sizeof(int32_t), "topk");
  void *scratch = kcall_alloc(&c, (size_t)S * ld * (sizeof(float) + 1), "scores and masks");
  if (kcall_ok(&c))
    kcall_cuda(&c,
               kern_indexer_reindex(topk, pool, q, w, pos, &kv, S, a.heads, a.k, a.pool_block, a.pool_top, scratch,
                                    c.stream),
               "reindex kernels");
  kcall_download(&c, a.topk, topk, (size_t)S * a.k * sizeof(int32_t), "topk");
  return kcall_end(&c);
}

int kern_indexer_topk_run(const struct op_desc *self, struct op_io *io) {
  struct op_indexer_topk_call a;
  int rc = op_indexer_topk_prepare(self, io, &a);
  if (rc) return rc;
  const int kk = a.pool && a.pool_top > a.k ? a.pool_top : a.k;
  if (kk > IDX_MAX_K) return op_io_fail(io, "indexer_topk on cuda: k and pool_top up to %d, not %d", IDX_MAX_K, kk);
  const int S = a.S, hd = a.kv.idx_w;
  struct kcall c;
  kcall_begin(&c, self, io);
  const float *q = (const float *)kcall_upload(&c, a.q, (size_t)S * a.heads * hd * sizeof(float), "q");
  const float *w = (const float *)kcall_upload(&c, a.w, (size_t)S * a.heads * sizeof(float), "w");
  const int64_t *pos = (const int64_t *)kcall_upload(&c, a.pos, (size_t)S * sizeof(int64_t), "pos");
  const uint8_t *page = (const uint8_t *)kcall_upload(&c, a.page, (size_t)a.kv.n_entries * a.kv.entry_bytes, "keys");
  struct op_kv_view kv = a.kv;
  kv.pages = (const uint8_t *const *)kcall_upload(&c, &page, sizeof page, "page table");
  int32_t *topk = (int32_t *)kcall_alloc(&c, (size_t)S * a.k * sizeof(int32_t), "topk");
  int32_t *pool = a.pool ? (int32_t *)kcall_alloc(&c, (size_t)S * a.pool_top * sizeof(int32_t), "pool") : NULL;
  void *scratch = kcall_alloc(&c, kern_indexer_topk_scratch_bytes(&a.kv, S, a.pool ? a.pool_block : 0), "scores");
  if (kcall_ok(&c))
    kcall_cuda(&c,
               kern_indexer_topk(topk, pool, q, w, pos, &kv, S, a.heads, a.k, a.pool_block, a.pool_top, a.pin_newest,
                                 scratch, c.stream),
               "indexer kernels");
  kcall_download(&c, a.topk, topk, (size_t)S * a.k * sizeof(int32_t), "topk");
  if (a.pool) kcall_download(&c, a.pool, pool, (size_t)S * a.pool_top * sizeof(int32_t), "pool");
  return kcall_end(&c);
}

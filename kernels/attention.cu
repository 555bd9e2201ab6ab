/* attention.cu: sparse attention with the joint softmax and sink on CUDA (see
 * attention.cuh; the softmax rules are ops/num_softmax.h's). */
#include "kernels/attention.cuh"

#include "base/check.h"
#include "kernels/formats.cuh"
#include "kernels/kcall.cuh"
#include "kernels/rope.cuh"
#include "ops/num_softmax.h"

enum { ATTN_EB = 32, ATTN_THREADS = 256, ATTN_ACC = 16, ATTN_MAX_D = 1024, ATTN_MAX_HG = 8 };

/* Heads per CTA: HG * head_dim accumulator channels fit ATTN_THREADS x ATTN_ACC registers. */
static int heads_per_cta(int d) {
  int hg = ATTN_THREADS * ATTN_ACC / d;
  return hg < 1 ? 1 : hg > ATTN_MAX_HG ? ATTN_MAX_HG : hg;
}

size_t kern_sparse_attn_scratch_bytes(int S, int slots, int topk) {
  return (size_t)(S > 0 ? S : 1) * (size_t)((slots > 0 ? slots : 0) + (topk > 0 ? topk : 0) + 1) * sizeof(int32_t);
}

/* The source of one kernel call: the two views, by value. */
struct attn_src {
  const uint8_t *const *pages; /* NULL: no global entries */
  int page_entries;
  size_t entry_bytes, main_off;
  int64_t n_entries;
  const int64_t *n_dev; /* the committed count in device memory (op_kv_view.n_dev), or NULL */
  struct op_kv_format main_fmt;
  const uint8_t *swa; /* NULL: no ring */
  const int64_t *spos;
  int slots;
  size_t swa_bytes;
  struct op_kv_format swa_fmt;
};

/* Entry codes: e >= 0 a global entry, -2 - s the ring's slot s. */
__global__ void attn_list_kernel(int32_t *list, int32_t *n_used, const int64_t *pos, const int32_t *topk_idx,
                                 const struct attn_src src, int S, int topk, int window, int64_t r0, int ld) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= S) return;
  const int64_t p = pos[i], lo = p - window + 1 > r0 ? p - window + 1 : r0;
  int32_t *li = list + (size_t)i * ld, u = 0;
  for (int s = 0; src.swa && window > 0 && s < src.slots; s++) {
    const int64_t ps = src.spos[s];
    if (ps < 0 || ps < lo || ps > p) continue; /* empty, too old, before r0, or future */
    li[u++] = -2 - s;
  }
  const int64_t committed = src.n_dev ? *src.n_dev : src.n_entries;
  for (int t = 0; src.pages && topk_idx && t < topk; t++) {
    const int32_t e = topk_idx[(size_t)i * topk + t];
    if (e < 0 || e >= committed) continue; /* -1 = none; uncommitted */
    li[u++] = e;
  }
  n_used[i] = u;
}

__global__ void __launch_bounds__(ATTN_THREADS) attn_main_kernel(float *o, const float *q, const int32_t *list,
                                                                 const int32_t *n_used, const struct attn_src src,
                                                                 const float *sink, int H, int d, int hg, int ld,
                                                                 float tau) {
  extern __shared__ float sm[];
  const int i = blockIdx.x, h0 = blockIdx.y * hg, nh = min(hg, H - h0), kld = d + 1;
  float *q_s = sm, *kb = q_s + (size_t)hg * d, *z = kb + (size_t)ATTN_EB * kld, *cf = z + hg * ATTN_EB;
  __shared__ struct op_hd_online st[ATTN_MAX_HG];
  const float *qi = q + ((size_t)i * H + h0) * d;
  for (int k = threadIdx.x; k < nh * d; k += blockDim.x) q_s[k] = qi[k];
  if (threadIdx.x < nh) st[threadIdx.x] = op_hd_online_start(sink != NULL, sink ? sink[h0 + threadIdx.x] : 0.0f);
  float acc[ATTN_ACC];
#pragma unroll
  for (int a = 0; a < ATTN_ACC; a++) acc[a] = 0.0f;
  const int32_t *li = list + (size_t)i * ld;
  const int u = n_used[i];
  for (int b0 = 0; b0 < u; b0 += ATTN_EB) {
    const int nb = min(ATTN_EB, u - b0);
    __syncthreads(); /* the previous block's kb and z are consumed */
    for (int k = threadIdx.x; k < nb * d; k += blockDim.x) {
      const int e = k / d, c = k % d, code = li[b0 + e];
      const uint8_t *entry = code >= 0 ? src.pages[code / src.page_entries] +
                                             (size_t)(code % src.page_entries) * src.entry_bytes + src.main_off
                                       : src.swa + (size_t)(-2 - code) * src.swa_bytes;
      kb[e * kld + c] = kern_kv_value(code >= 0 ? src.main_fmt : src.swa_fmt, entry, d, c);
    }
    __syncthreads();
    for (int k = threadIdx.x; k < nh * nb; k += blockDim.x) {
      const int h = k / nb, e = k % nb;
      const float *qh = q_s + (size_t)h * d, *ke = kb + (size_t)e * kld;
      float s = 0.0f;
      for (int c = 0; c < d; c++) s = __fadd_rn(s, __fmul_rn(qh[c], ke[c])); /* channels in order, as the CPU */
      z[h * ATTN_EB + e] = __fmul_rn(s, tau);
    }
    __syncthreads();
    if (threadIdx.x < nh) { /* the running max and sum of one head, in entry order */
      const int h = threadIdx.x;
      struct op_hd_online o_h = st[h];
      float mb = o_h.m;
      for (int e = 0; e < nb; e++) mb = z[h * ATTN_EB + e] > mb ? z[h * ATTN_EB + e] : mb;
      cf[h] = op_hd_online_raise(&o_h, mb);
      for (int e = 0; e < nb; e++) z[h * ATTN_EB + e] = op_hd_online_weight(&o_h, z[h * ATTN_EB + e]);
      st[h] = o_h;
    }
    __syncthreads();
#pragma unroll
    for (int a = 0; a < ATTN_ACC; a++) {
      const int f = threadIdx.x + a * ATTN_THREADS, h = f / d, c = f % d;
      if (f >= nh * d) break;
      float v = __fmul_rn(acc[a], cf[h]);
      for (int e = 0; e < nb; e++) v = __fadd_rn(v, __fmul_rn(z[h * ATTN_EB + e], kb[e * kld + c]));
      acc[a] = v;
    }
  }
  __syncthreads();
  float *oi = o + ((size_t)i * H + h0) * d;
#pragma unroll
  for (int a = 0; a < ATTN_ACC; a++) {
    const int f = threadIdx.x + a * ATTN_THREADS;
    if (f >= nh * d) break;
    oi[f] = op_hd_online_out(acc[a], st[f / d].l);
  }
}

cudaError_t kern_sparse_attn(float *o, int32_t *n_used, const float *q, const int64_t *pos, const int32_t *topk_idx,
                             const struct op_kv_view *kv, const struct op_swa_view *swa, int S,
                             const struct op_attn_params *pr, void *scratch, cudaStream_t st) {
  const int H = pr->heads, d = pr->head_dim;
  if (S <= 0) return cudaSuccess;
  if (H <= 0 || d <= 0 || d > ATTN_MAX_D) return cudaErrorInvalidValue;
  struct attn_src src = {};
  const int topk = topk_idx && kv ? pr->topk : 0;
  if (topk > 0) {
    src.pages = kv->pages, src.page_entries = kv->page_entries, src.entry_bytes = kv->entry_bytes;
    src.main_off = kv->main_off, src.n_entries = kv->n_entries, src.n_dev = kv->n_dev, src.main_fmt = kv->main_fmt;
  }
  if (swa) {
    src.swa = swa->slots, src.spos = swa->pos, src.slots = swa->n_slots, src.swa_bytes = swa->entry_bytes;
    src.swa_fmt = swa->fmt;
  }
  const int ld = src.slots + topk + 1;
  int32_t *list = (int32_t *)scratch;
  attn_list_kernel<<<kcall_blocks(S, 128), 128, 0, st>>>(list, n_used, pos, topk > 0 ? topk_idx : NULL, src, S, topk,
                                                         pr->window, pr->r0, ld);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  const int hg = heads_per_cta(d);
  const size_t smem = ((size_t)hg * d + (size_t)ATTN_EB * (d + 1) + (size_t)hg * ATTN_EB + ATTN_MAX_HG) * sizeof(float);
  if ((e = cudaFuncSetAttribute(attn_main_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem)) !=
      cudaSuccess)
    return e;
  const dim3 grid((unsigned)S, (unsigned)((H + hg - 1) / hg));
  attn_main_kernel<<<grid, ATTN_THREADS, smem, st>>>(o, q, list, n_used, src, pr->sink, H, d, hg, ld, pr->tau);
  if ((e = cudaGetLastError()) != cudaSuccess) return e;
  /* SPEC 3.12: o_h[rope dims] = RoPE(o_h, -p), all heads of row i at pos[i] */
  return pr->rope ? kern_rope_apply(o, pr->rope, pos, S, H, H * d, -1, st) : cudaSuccess;
}

int kern_sparse_attn_run(const struct op_desc *self, struct op_io *io) {
  struct op_attn_call a;
  int rc = op_sparse_attn_prepare(self, io, &a);
  if (rc) return rc;
  const int S = a.S, H = a.pr.heads, d = a.pr.head_dim, topk = a.topk ? a.pr.topk : 0;
  struct kcall c;
  kcall_begin(&c, self, io);
  const size_t ob = (size_t)S * H * d * sizeof(float);
  const float *q = (const float *)kcall_upload(&c, a.q, ob, "q");
  const int64_t *pos = (const int64_t *)kcall_upload(&c, a.pos, (size_t)S * sizeof(int64_t), "pos");
  struct op_attn_params pr = a.pr;
  struct op_kv_view kv = a.kv;
  struct op_swa_view swa = a.swa;
  const int32_t *idx = NULL;
  if (topk > 0) {
    idx = (const int32_t *)kcall_upload(&c, a.topk, (size_t)S * topk * sizeof(int32_t), "topk");
    const uint8_t *page = (const uint8_t *)kcall_upload(&c, a.page, (size_t)a.kv.n_entries * a.kv.entry_bytes,
                                                        "entries");
    kv.pages = (const uint8_t *const *)kcall_upload(&c, &page, sizeof page, "page table");
  }
  if (a.has_swa) {
    swa.slots = (const uint8_t *)kcall_upload(&c, a.swa.slots, (size_t)a.swa.n_slots * a.swa.entry_bytes, "swa");
    swa.pos = (const int64_t *)kcall_upload(&c, a.swa.pos, (size_t)a.swa.n_slots * sizeof(int64_t), "swa_pos");
  }
  if (a.pr.sink) pr.sink = (const float *)kcall_upload(&c, a.pr.sink, (size_t)H * sizeof(float), "sink");
  float *o = (float *)kcall_alloc(&c, ob, "o");
  int32_t *n_used = (int32_t *)kcall_alloc(&c, (size_t)S * sizeof(int32_t), "n_used");
  void *scratch = kcall_alloc(&c, kern_sparse_attn_scratch_bytes(S, a.has_swa ? a.swa.n_slots : 0, topk), "lists");
  if (kcall_ok(&c))
    kcall_cuda(&c,
               kern_sparse_attn(o, n_used, q, pos, idx, topk > 0 ? &kv : NULL, a.has_swa ? &swa : NULL, S, &pr,
                                scratch, c.stream),
               "attn kernels");
  kcall_download(&c, a.o, o, ob, "o");
  kcall_download(&c, a.n_used, n_used, (size_t)S * sizeof(int32_t), "n_used");
  return kcall_end(&c);
}

cublasStatus_t kern_grouped_oproj(cublasHandle_t h, float *a, float *z, const float *o, const float *w_oa,
                                  const float *w_ob, int S, int heads, int head_dim, int G, int o_rank, int hidden,
                                  cudaStream_t st) {
  if (G <= 0 || heads % G) return CUBLAS_STATUS_INVALID_VALUE;
  if (S <= 0 || o_rank <= 0) return CUBLAS_STATUS_SUCCESS;
  cublasStatus_t s = cublasSetStream(h, st);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  const int gw = heads / G * head_dim, ld_o = heads * head_dim, ld_z = G * o_rank;
  const float one = 1.0f, zero = 0.0f;
  /* column-major: z_g^T (o_rank, S) = W_oa[g] (stored (o_rank, gw) row-major, i.e. (gw, o_rank) col-major)^T
   * times o_g^T (gw, S), ld ld_o; the groups step by o_rank * gw, gw and o_rank */
  s = cublasSgemmStridedBatched(h, CUBLAS_OP_T, CUBLAS_OP_N, o_rank, S, gw, &one, w_oa, gw, (long long)o_rank * gw, o,
                                ld_o, gw, &zero, z, ld_z, o_rank, G);
  if (s != CUBLAS_STATUS_SUCCESS || hidden <= 0) return s;
  return cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, hidden, S, ld_z, &one, w_ob, ld_z, z, ld_z, &zero, a, hidden);
}

int kern_oproj_run(const struct op_desc *self, struct op_io *io) {
  struct op_oproj_call a;
  int rc = op_oproj_prepare(self, io, &a);
  if (rc) return rc;
  const int gw = a.heads / a.G * a.head_dim;
  const size_t ob = (size_t)a.S * a.heads * a.head_dim * sizeof(float), zb = (size_t)a.S * a.G * a.o_rank * sizeof(float),
               ab = (size_t)a.S * a.hidden * sizeof(float);
  struct kcall c;
  kcall_begin(&c, self, io);
  const float *o = (const float *)kcall_upload(&c, a.o, ob, "o");
  const float *wa = (const float *)kcall_upload(&c, a.w_oa, (size_t)a.G * a.o_rank * gw * sizeof(float), "W_oa");
  const float *wb =
      (const float *)kcall_upload(&c, a.w_ob, (size_t)a.hidden * a.G * a.o_rank * sizeof(float), "W_ob");
  float *z = (float *)kcall_alloc(&c, zb, "z"), *out = (float *)kcall_alloc(&c, ab, "a");
  cublasHandle_t h = NULL;
  if (kcall_ok(&c)) {
    cublasStatus_t s = cublasCreate(&h);
    if (s == CUBLAS_STATUS_SUCCESS)
      s = kern_grouped_oproj(h, out, z, o, wa, wb, a.S, a.heads, a.head_dim, a.G, a.o_rank, a.hidden, c.stream);
    if (s != CUBLAS_STATUS_SUCCESS) kcall_fail(&c, CEDAR_EIO, "grouped oproj", cublasGetStatusString(s));
  }
  kcall_download(&c, a.a, out, ab, "a");
  kcall_download(&c, a.z, z, zb, "z");
  rc = kcall_end(&c); /* synchronizes before the handle goes */
  if (h) cublasDestroy(h);
  return rc;
}

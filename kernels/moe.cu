/* moe.cu: the MoE sublayer on CUDA (see moe.cuh). */
#include "kernels/moe.cuh"

#include "base/check.h"
#include "kernels/formats.cuh"
#include "kernels/kcall.cuh"
#include "kernels/reduce.cuh"

enum { MOE_THREADS = 128, MOE_WARPS = 4, MOE_MAX_ACTIVE = 16 };

size_t kern_moe_scratch_bytes(int n, const struct op_moe_cfg *c) {
  const int S = c->n_shared * c->shared_inter;
  size_t f = (size_t)n * c->n_routed + (size_t)n * c->n_active * c->inter + (size_t)n * (S > 0 ? S : 0);
  if (S > 0 && c->shared_mxfp8 > 0) f += (size_t)n * c->hidden; /* the shared expert's MXFP8 copy of x */
  return (f > 0 ? f : 1) * sizeof(float);
}

__device__ __forceinline__ float softplus_d(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

__global__ void moe_score_kernel(float *s, int n, int r, int score) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n) return;
  float *st = s + (size_t)t * r;
  if (score == OP_MOE_SOFTMAX) { /* ops/moe.c softmax_row */
    float m = st[0], sum = 0.0f;
    for (int i = 1; i < r; i++) m = st[i] > m ? st[i] : m;
    for (int i = 0; i < r; i++) st[i] = expf(__fadd_rn(st[i], -m)), sum = __fadd_rn(sum, st[i]);
    for (int i = 0; i < r; i++) st[i] = __fdiv_rn(st[i], sum);
  } else if (score == OP_MOE_SIGMOID) {
    for (int i = 0; i < r; i++) st[i] = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-st[i])));
  } else {
    for (int i = 0; i < r; i++) st[i] = __fsqrt_rn(softplus_d(st[i]));
  }
}

__device__ __forceinline__ float sel_key(const float *s, const float *b, int i) {
  const float k = b ? __fadd_rn(s[i], b[i]) : s[i];
  return isnan(k) ? -INFINITY : k;
}

__global__ void moe_select_kernel(int32_t *sel, float *weight, const float *scores, const float *bias,
                                  const uint8_t *modality, int n, int r, int k, int norm_topk, float route_scale) {
  const int t = blockIdx.x * blockDim.x + threadIdx.x;
  if (t >= n) return;
  const float *s = scores + (size_t)t * r, *b = bias ? bias + (modality && modality[t] ? r : 0) : NULL;
  int32_t *st = sel + (size_t)t * k;
  float prev = 0.0f;
  int prev_id = -1;
  for (int j = 0; j < k; j++) { /* ops/moe.c topk_ids */
    int best = -1;
    float bk = 0.0f;
    for (int i = 0; i < r; i++) {
      const float v = sel_key(s, b, i);
      if (prev_id >= 0 && !(v < prev || (v == prev && i > prev_id))) continue;
      if (best < 0 || v > bk) best = i, bk = v;
    }
    st[j] = best;
    prev = bk, prev_id = best;
  }
  for (int j = 1; j < k; j++)
    for (int q = j; q > 0 && st[q - 1] > st[q]; q--) {
      const int32_t x = st[q];
      st[q] = st[q - 1], st[q - 1] = x;
    }
  float sum = 0.0f;
  for (int j = 0; j < k; j++) sum = __fadd_rn(sum, s[st[j]]);
  for (int j = 0; j < k; j++)
    weight[(size_t)t * k + j] = __fmul_rn(norm_topk ? __fdiv_rn(s[st[j]], sum) : s[st[j]], route_scale);
}

/* h[t][slot][j] for one FFN: slot < 0 is the shared expert (no routing weight). */
__global__ void moe_up_kernel(float *h, const float *x, const float *w_gate, const float *w_up, const int32_t *sel,
                              const float *weight, int n, int k, int hidden, int inter, size_t mat, float limit,
                              int shared) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  const int slots = shared ? 1 : k;
  if (warp >= n * slots * inter) return;
  const int j = warp % inter, ts = warp / inter, t = ts / slots, q = ts % slots;
  const size_t e = shared ? 0 : (size_t)sel[(size_t)t * k + q];
  const float *xt = x + (size_t)t * hidden, *gr = w_gate + e * mat + (size_t)j * hidden,
              *ur = w_up + e * mat + (size_t)j * hidden;
  float g = 0.0f, u = 0.0f;
  for (int c = lane; c < hidden; c += 32) g = __fadd_rn(g, __fmul_rn(gr[c], xt[c])), u = __fadd_rn(u, __fmul_rn(ur[c], xt[c]));
  g = kern_warp_sum(g), u = kern_warp_sum(u);
  if (lane) return;
  float a = g > limit ? limit : g;                         /* min(g, L); NaN stays NaN */
  const float b = u > limit ? limit : (u < -limit ? -limit : u); /* clamp(u, -L, L) */
  const float sl = __fdiv_rn(a, __fadd_rn(1.0f, expf(-a)));      /* op_silu */
  a = shared ? sl : __fmul_rn(weight[(size_t)t * k + q], sl);
  h[(size_t)ts * inter + j] = __fmul_rn(a, b);
}

/* y[t][c] = shared down dot (or 0), then + each selected expert's, ascending ids. */
__global__ void moe_down_kernel(float *y, const float *hs, const float *hr, const float *w_sdown, const float *w_down,
                                const int32_t *sel, int n, int k, int hidden, int inter, int S) {
  const int warp = (blockIdx.x * blockDim.x + threadIdx.x) >> 5, lane = threadIdx.x & 31;
  if (warp >= n * hidden) return;
  const int t = warp / hidden, c = warp % hidden;
  float acc = 0.0f;
  if (S > 0) {
    const float *row = w_sdown + (size_t)c * S, *ht = hs + (size_t)t * S;
    for (int j = lane; j < S; j += 32) acc = __fadd_rn(acc, __fmul_rn(row[j], ht[j]));
    acc = kern_warp_sum(acc);
  }
  for (int q = 0; q < k; q++) {
    const size_t e = (size_t)sel[(size_t)t * k + q];
    const float *row = w_down + (e * hidden + c) * inter, *ht = hr + ((size_t)t * k + q) * inter;
    float p = 0.0f;
    for (int j = lane; j < inter; j += 32) p = __fadd_rn(p, __fmul_rn(row[j], ht[j]));
    acc = __fadd_rn(acc, kern_warp_sum(p));
  }
  if (lane == 0) y[(size_t)t * hidden + c] = acc;
}

cublasStatus_t kern_moe_forward(cublasHandle_t h, float *y, int32_t *sel, float *weight, const float *x,
                                const struct op_moe_weights *w, const uint8_t *modality, int n,
                                const struct op_moe_cfg *c, void *scratch, cudaStream_t st) {
  if (n <= 0) return CUBLAS_STATUS_SUCCESS;
  if (c->n_active > MOE_MAX_ACTIVE) return CUBLAS_STATUS_INVALID_VALUE;
  const int r = c->n_routed, k = c->n_active, d = c->hidden, I = c->inter, S = c->n_shared * c->shared_inter;
  float *scores = (float *)scratch, *hr = scores + (size_t)n * r, *hs = hr + (size_t)n * k * I;
  cublasStatus_t s = cublasSetStream(h, st);
  if (s == CUBLAS_STATUS_SUCCESS) s = cublasSetMathMode(h, CUBLAS_PEDANTIC_MATH);
  const float one = 1.0f, zero = 0.0f;
  if (s == CUBLAS_STATUS_SUCCESS)
    s = cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, r, n, d, &one, w->router, d, x, d, &zero, scores, r);
  if (s != CUBLAS_STATUS_SUCCESS) return s;
  moe_score_kernel<<<kcall_blocks(n, MOE_THREADS), MOE_THREADS, 0, st>>>(scores, n, r, (int)c->score);
  moe_select_kernel<<<kcall_blocks(n, MOE_THREADS), MOE_THREADS, 0, st>>>(sel, weight, scores, w->bias, modality, n,
                                                                          r, k, c->norm_topk, c->route_scale);
  const int wpb = MOE_THREADS / 32;
  moe_up_kernel<<<kcall_blocks((long long)n * k * I, wpb), MOE_THREADS, 0, st>>>(
      hr, x, w->gate, w->up, sel, weight, n, k, d, I, (size_t)I * d, c->limit, 0);
  if (S > 0) {
    /* shared_mxfp8 (op_moe_shared): the shared expert reads x and its SwiGLU
     * hidden through MXFP8 quantize-dequantize, as the CPU does. */
    const float *xs = x;
    if (c->shared_mxfp8 > 0) {
      float *xq = hs + (size_t)n * S;
      if (cudaMemcpyAsync(xq, x, (size_t)n * d * sizeof(float), cudaMemcpyDeviceToDevice, st) != cudaSuccess ||
          kern_mxfp8_qdq(xq, n, d, d, c->shared_mxfp8, st) != cudaSuccess)
        return CUBLAS_STATUS_EXECUTION_FAILED;
      xs = xq;
    }
    moe_up_kernel<<<kcall_blocks((long long)n * S, wpb), MOE_THREADS, 0, st>>>(hs, xs, w->shared_gate, w->shared_up,
                                                                              sel, weight, n, k, d, S, 0, c->limit, 1);
    if (c->shared_mxfp8 > 0 && kern_mxfp8_qdq(hs, n, S, S, c->shared_mxfp8, st) != cudaSuccess)
      return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  moe_down_kernel<<<kcall_blocks((long long)n * d, wpb), MOE_THREADS, 0, st>>>(y, hs, hr, w->shared_down, w->down, sel,
                                                                               n, k, d, I, S);
  return cudaGetLastError() == cudaSuccess ? CUBLAS_STATUS_SUCCESS : CUBLAS_STATUS_EXECUTION_FAILED;
}

int kern_moe_run(const struct op_desc *self, struct op_io *io) {
  struct op_moe_call a;
  int rc = op_moe_prepare(self, io, &a);
  if (rc) return rc;
  if (a.cfg.n_active > MOE_MAX_ACTIVE)
    return op_io_fail(io, "moe on cuda: at most %d active experts, not %d", MOE_MAX_ACTIVE, a.cfg.n_active);
  const struct op_moe_cfg *c = &a.cfg;
  const int n = a.n, r = c->n_routed, k = c->n_active, d = c->hidden, I = c->inter, S = c->n_shared * c->shared_inter;
  const size_t mat = (size_t)r * I * d * sizeof(float);
  struct kcall kc;
  kcall_begin(&kc, self, io);
  struct op_moe_weights w = {};
  const float *x = (const float *)kcall_upload(&kc, a.x, (size_t)n * d * sizeof(float), "x");
  w.router = (const float *)kcall_upload(&kc, a.w.router, (size_t)r * d * sizeof(float), "router");
  if (a.w.bias) w.bias = (const float *)kcall_upload(&kc, a.w.bias, (size_t)2 * r * sizeof(float), "bias");
  w.gate = (const float *)kcall_upload(&kc, a.w.gate, mat, "w_gate");
  w.up = (const float *)kcall_upload(&kc, a.w.up, mat, "w_up");
  w.down = (const float *)kcall_upload(&kc, a.w.down, mat, "w_down");
  if (S > 0) {
    w.shared_gate = (const float *)kcall_upload(&kc, a.w.shared_gate, (size_t)S * d * sizeof(float), "shared_gate");
    w.shared_up = (const float *)kcall_upload(&kc, a.w.shared_up, (size_t)S * d * sizeof(float), "shared_up");
    w.shared_down = (const float *)kcall_upload(&kc, a.w.shared_down, (size_t)S * d * sizeof(float), "shared_down");
  }
  const uint8_t *mod = a.modality ? (const uint8_t *)kcall_upload(&kc, a.modality, (size_t)n, "modality") : NULL;
  float *y = (float *)kcall_alloc(&kc, (size_t)n * d * sizeof(float), "y");
  int32_t *sel = (int32_t *)kcall_alloc(&kc, (size_t)n * k * sizeof(int32_t), "selected");
  float *wt = (float *)kcall_alloc(&kc, (size_t)n * k * sizeof(float), "weights");
  void *scratch = kcall_alloc(&kc, kern_moe_scratch_bytes(n, c), "scratch");
  cublasHandle_t h = NULL;
  if (kcall_ok(&kc)) {
    cublasStatus_t s = cublasCreate(&h);
    if (s == CUBLAS_STATUS_SUCCESS) s = kern_moe_forward(h, y, sel, wt, x, &w, mod, n, c, scratch, kc.stream);
    if (s != CUBLAS_STATUS_SUCCESS) kcall_fail(&kc, CEDAR_EIO, "moe kernels", cublasGetStatusString(s));
  }
  kcall_download(&kc, a.y, y, (size_t)n * d * sizeof(float), "y");
  kcall_download(&kc, a.sel, sel, (size_t)n * k * sizeof(int32_t), "selected");
  kcall_download(&kc, a.weight, wt, (size_t)n * k * sizeof(float), "weights");
  rc = kcall_end(&kc);
  if (h) cublasDestroy(h);
  return rc;
}

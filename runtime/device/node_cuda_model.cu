/* node_cuda_model.cu: the model on a CUDA device for the CUDA op groups
 * (runtime/device/node_cuda.h): struct rt_model's weight pointers translated to
 * the device weights upload tensor by tensor, the Engram hash tables
 * uploaded once; a worker's device arena and cuBLAS handle; and the steps
 * model.c applies between ops (numerics roundings, mHC begin/end) on the
 * device (node_cuda_internal.cuh). Host code plus a few one-line kernels.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/check.h"
#include "kernels/formats.cuh"
#include "kernels/kcall.cuh"
#include "kernels/mhc.cuh"
extern "C" {
#include "runtime/device/devstate.h" /* a C header without its own extern "C" */
}
#include "runtime/device/node_cuda_internal.cuh"
extern "C" {
#include "runtime/model/round_trace.h" /* a C header without its own extern "C" */
}

static thread_local char cn_why[512];

extern "C" const char *rt_cuda_node_why(void) { return cn_why; }

int cn_fail(const struct cn *x, int rc, const char *fmt, ...) {
  int at = snprintf(cn_why, sizeof cn_why, "%s on cuda: ", x->c->nd->name);
  va_list ap;
  va_start(ap, fmt);
  if (at > 0 && (size_t)at < sizeof cn_why) vsnprintf(cn_why + at, sizeof cn_why - (size_t)at, fmt, ap);
  va_end(ap);
  return rc;
}

int cn_cuda(const struct cn *x, cudaError_t e, const char *what) {
  return e == cudaSuccess ? 0 : cn_fail(x, CEDAR_EIO, "%s: %s: %s", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

int cn_blas(const struct cn *x, cublasStatus_t s, const char *what) {
  return s == CUBLAS_STATUS_SUCCESS ? 0 : cn_fail(x, CEDAR_EIO, "%s: %s", what, cublasGetStatusString(s));
}

void *cn_alloc(const struct cn *x, size_t bytes) {
  struct rt_cuda_worker *w = x->w;
  size_t b = (bytes + 255) & ~(size_t)255;
  if (b == 0) b = 256;
  if (w->used + b > w->cap) {
    w->need = w->used + b;
    cn_fail(x, RT_ENOMEM_SCRATCH, "the worker's device scratch holds %zu bytes, this node needs at least %zu",
            w->cap, w->need);
    return NULL;
  }
  void *p = w->base + w->used;
  w->used += b;
  if (w->used > w->need) w->need = w->used;
  return p;
}

int cn_begin(struct cn *x, const struct rt_node_ctx *c, const char *group) {
  memset(x, 0, sizeof *x);
  x->c = c;
  x->M = c->M;
  x->m = &c->M->p->model;
  x->st = (cudaStream_t)c->stream;
  cn_why[0] = 0;
  if (!c->cuda || !c->cuda->cm || !c->cuda->cw)
    return cn_fail(x, CEDAR_EUNSUPPORTED, "op group %s needs the executor's device state (the model on the device, "
                   "a worker's scratch and the request's tokens: struct rt_cuda_env), which this executor does not "
                   "bind", group);
  x->cm = c->cuda->cm;
  x->w = c->cuda->cw;
  if (x->cm->M != c->M) return cn_fail(x, CEDAR_EUNSUPPORTED, "the device model was opened for another model");
  if (rt_rtrace_on())
    return cn_fail(x, CEDAR_EUNSUPPORTED, "the round trace (the oracle's flip accounting) records CPU runs only; "
                   "run it with --device cpu");
  x->w->used = 0;
  x->w->need = 0;
  return 0;
}

__global__ void cn_iota_kernel(int64_t *pos, int64_t a, int64_t step, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) pos[i] = a + (int64_t)i * step;
}

int cn_iota(const struct cn *x, int64_t *pos, int64_t a, int64_t step, int n) {
  if (n <= 0) return 0;
  cn_iota_kernel<<<kcall_blocks(n, 128), 128, 0, x->st>>>(pos, a, step, n);
  return cn_cuda(x, cudaGetLastError(), "positions");
}

int cn_copy(const struct cn *x, void *dst, const void *src, size_t bytes) {
  if (!bytes || dst == src) return 0;
  return cn_cuda(x, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, x->st), "copy");
}

int cn_round_x(const struct cn *x, float *X, int n) {
  if (!x->m->num_act_bf16) return 0;
  return cn_cuda(x, kern_bf16_round(X, (int64_t)n * x->m->hc_streams * x->m->hidden, x->st), "round_x (bf16)");
}

int cn_round_io(const struct cn *x, float *v, int n) {
  if (!x->m->num_io_bf16) return 0;
  return cn_cuda(x, kern_bf16_round(v, (int64_t)n * x->m->hidden, x->st), "round_io (bf16)");
}

int cn_lin_in(const struct cn *x, const float **out, const float *v, int rows, int cols) {
  *out = v;
  if (!x->m->num_lin_mxfp8) return 0;
  float *q;
  CN_ALLOC(x, q, float, (size_t)rows * cols);
  CN_TRY(cn_copy(x, q, v, sizeof(float) * (size_t)rows * cols));
  CN_TRY(cn_cuda(x, kern_mxfp8_qdq(q, rows, cols, cols, CN_MXFP8_BLOCK, x->st), "lin_in (mxfp8)"));
  *out = q;
  return 0;
}

int cn_mhc_begin(const struct cn *x, struct cn_mhc *s, const struct graph_node *nd, int k, const float *X, float *pre,
                 int n) {
  const struct rt_cuda_layer *L = &x->cm->L[nd->layer];
  const struct op_mhc_cfg *mc = &x->M->mhc;
  const int hc = mc->hc, d = mc->hidden, rows = op_mhc_rows(hc);
  float *own, *dots, *sumsq;
  CN_ALLOC(x, s->post, float, (size_t)n * hc);
  CN_ALLOC(x, s->C, float, (size_t)n * hc * hc);
  CN_ALLOC(x, s->u, float, (size_t)n * d);
  CN_ALLOC(x, own, float, (size_t)n * hc);
  CN_ALLOC(x, dots, float, (size_t)n * rows);
  CN_ALLOC(x, sumsq, float, n);
  CN_TRY(cn_blas(x, kern_mhc_coeffs(x->w->h, own, s->post, s->C, dots, sumsq, X, L->hc_fn[k], L->hc_scale[k],
                                    L->hc_base[k], n, mc, x->st), "mhc coefficients"));
  CN_TRY(cn_cuda(x, kern_mhc_mix(s->u, X, (nd->flags & GRAPH_F_RESTART) ? own : pre, n, hc, d, x->st), "mhc mix"));
  CN_TRY(cn_round_io(x, s->u, n));
  if (nd->flags & GRAPH_F_PRE_NEXT) CN_TRY(cn_copy(x, pre, own, sizeof(float) * (size_t)n * hc));
  return 0;
}

/* op_mhc_update_inplace: the kernel writes another buffer (each output reads
 * every stream of its column), then the result goes back into X. */
int cn_mhc_end(const struct cn *x, float *X, const struct cn_mhc *s, const float *y, int n) {
  const int hc = x->M->mhc.hc, d = x->M->mhc.hidden;
  float *Xn;
  CN_ALLOC(x, Xn, float, (size_t)n * hc * d);
  CN_TRY(cn_cuda(x, kern_mhc_update(Xn, X, s->C, s->post, y, n, hc, d, x->st), "mhc update"));
  CN_TRY(cn_copy(x, X, Xn, sizeof(float) * (size_t)n * hc * d));
  return cn_round_x(x, X, n);
}

/* ---- the model on the device --------------------------------------------- */

struct xlate {
  const struct weights *w;
  const struct rt_dev_weights *dw;
  const char *missing; /* the first tensor without a device copy */
};

/* The device copy of host tensor p (a pointer model.c bound), by its name. */
template <typename T> static const T *dev_of(struct xlate *t, const T *p) {
  if (!p) return NULL;
  for (size_t i = 0; i < t->w->list.n; i++)
    if (t->w->data[i] == (const void *)p) {
      const void *d = rt_dev_weights_get(t->dw, t->w->list.t[i].name);
      if (!d && !t->missing) t->missing = t->w->list.t[i].name;
      return (const T *)d;
    }
  if (!t->missing) t->missing = "(a bound pointer that is no tensor of the weights)";
  return NULL;
}

static void bind_layer(struct xlate *t, struct rt_cuda_layer *D, const struct rt_layer *L) {
  D->attn_norm = dev_of(t, L->attn_norm);
  D->ffn_norm = dev_of(t, L->ffn_norm);
  for (int k = 0; k < 2; k++) {
    D->hc_fn[k] = dev_of(t, L->hc_fn[k]);
    D->hc_scale[k] = dev_of(t, L->hc_scale[k]);
    D->hc_base[k] = dev_of(t, L->hc_base[k]);
  }
  D->wq_a = dev_of(t, (const float *)L->wq_a.data);
  D->q_norm = dev_of(t, L->q_norm);
  D->wq_b = dev_of(t, (const float *)L->wq_b.data);
  D->wkv = dev_of(t, (const float *)L->wkv.data);
  D->kv_norm = dev_of(t, L->kv_norm);
  D->sink = dev_of(t, L->sink);
  D->wo_a = dev_of(t, (const float *)L->wo_a.data);
  D->wo_b = dev_of(t, (const float *)L->wo_b.data);
  D->iq_b = dev_of(t, (const float *)L->iq_b.data);
  D->iw = dev_of(t, L->iw);
  D->comp = L->comp;
  D->comp.W_kv = dev_of(t, L->comp.W_kv);
  D->comp.W_gate = dev_of(t, L->comp.W_gate);
  D->comp.gamma = dev_of(t, L->comp.gamma);
  D->comp.W_ik = dev_of(t, L->comp.W_ik);
  D->comp.k_gamma = dev_of(t, L->comp.k_gamma);
  /* the host binds views (L->moe.q); the device copies are F32 (rt_dev_weights_upload) */
  const struct op_moe_qweights *q = &L->moe.q;
  D->moe = L->moe;
  D->moe.has_q = false;
  D->moe.router = dev_of(t, (const float *)q->router.data);
  D->moe.bias = dev_of(t, L->moe.bias);
  D->moe.gate = dev_of(t, (const float *)q->gate.data);
  D->moe.up = dev_of(t, (const float *)q->up.data);
  D->moe.down = dev_of(t, (const float *)q->down.data);
  D->moe.shared_gate = dev_of(t, (const float *)q->shared_gate.data);
  D->moe.shared_up = dev_of(t, (const float *)q->shared_up.data);
  D->moe.shared_down = dev_of(t, (const float *)q->shared_down.data);
  D->e_table = dev_of(t, L->e_table);
  D->e_wkv = dev_of(t, (const float *)L->e_wkv.data);
  D->e_qw = dev_of(t, L->e_qw);
  D->e_kw = dev_of(t, L->e_kw);
}

extern "C" int rt_cuda_model_open(struct rt_cuda_model **out, const struct rt_model *M,
                                  const struct rt_dev_weights *dw, int dev, char *err, size_t err_len) {
  *out = NULL;
  const struct plan_model *m = &M->p->model;
  const int nl = M->p->n_layers;
  struct rt_cuda_model *cm = (struct rt_cuda_model *)calloc(1, sizeof *cm);
  struct rt_cuda_layer *L = (struct rt_cuda_layer *)calloc((size_t)(nl ? nl : 1), sizeof *L);
  if (!cm || !L) {
    free(cm), free(L);
    snprintf(err, err_len, "out of host memory for the device model");
    return CEDAR_ENOMEM;
  }
  cm->M = M, cm->dev = dev, cm->L = L;
  struct xlate t = {M->w, dw, NULL};
  for (int l = 0; l < nl; l++) bind_layer(&t, &L[l], &M->L[l]);
  cm->embed = dev_of(&t, (const float *)M->embed.data);
  cm->norm = dev_of(&t, M->norm);
  cm->lm_head = dev_of(&t, (const float *)M->lm_head.data);
  cm->head_fn = dev_of(&t, M->head_fn);
  cm->head_scale = dev_of(&t, M->head_scale);
  cm->head_base = dev_of(&t, M->head_base);
  if (t.missing) {
    snprintf(err, err_len, "the device weights have no copy of %s (upload every tensor of the model's weights: "
             "rt_dev_weights_upload)", t.missing);
    rt_cuda_model_close(cm);
    return CEDAR_EINVAL;
  }
  /* The Engram tables that are not weights: token map, orders, and per
   * layer the multipliers, primes and offsets, in one slab. */
  if (M->cmap) {
    const int no = m->engram_n_orders, per = no * m->engram_heads;
    const size_t cmap_b = sizeof(int32_t) * (size_t)m->vocab, ord_b = sizeof(int) * (size_t)no;
    const size_t lay_b = sizeof(uint64_t) * 64 + 2 * sizeof(int64_t) * (size_t)per;
    const size_t a = 256, cmap_at = 0, ord_at = (cmap_b + a - 1) / a * a, lay_at = ord_at + (ord_b + a - 1) / a * a;
    const size_t lay_stride = (lay_b + a - 1) / a * a, total = lay_at + lay_stride * (size_t)nl;
    char *host = (char *)calloc(1, total);
    cudaError_t e = cudaSetDevice(dev);
    if (e == cudaSuccess && host) e = cudaMalloc(&cm->slab, total);
    if (!host || e != cudaSuccess) {
      free(host);
      snprintf(err, err_len, "the device model's Engram tables (%zu bytes) on cuda:%d: %s", total, dev,
               host ? cudaGetErrorString(e) : "out of host memory");
      rt_cuda_model_close(cm);
      return CEDAR_ENOMEM;
    }
    memcpy(host + cmap_at, M->cmap, cmap_b);
    memcpy(host + ord_at, m->engram_orders, ord_b);
    char *dslab = (char *)cm->slab;
    cm->cmap = (const int32_t *)(dslab + cmap_at);
    cm->e_orders = (const int *)(dslab + ord_at);
    for (int l = 0; l < nl; l++) {
      if (!M->p->layer[l].engram) continue;
      char *h = host + lay_at + lay_stride * (size_t)l, *d = dslab + lay_at + lay_stride * (size_t)l;
      const int mod = M->L[l].e_module;
      memcpy(h, M->L[l].e_mult, sizeof(uint64_t) * 64);
      memcpy(h + sizeof(uint64_t) * 64, op_engram_primes_of(&M->eng, mod), sizeof(int64_t) * (size_t)per);
      memcpy(h + sizeof(uint64_t) * 64 + sizeof(int64_t) * (size_t)per, op_engram_offsets_of(&M->eng, mod),
             sizeof(int64_t) * (size_t)per);
      L[l].e_mult = (const uint64_t *)d;
      L[l].e_prime = (const int64_t *)(d + sizeof(uint64_t) * 64);
      L[l].e_off = (const int64_t *)(d + sizeof(uint64_t) * 64 + sizeof(int64_t) * (size_t)per);
    }
    e = cudaMemcpy(cm->slab, host, total, cudaMemcpyHostToDevice);
    free(host);
    if (e != cudaSuccess) {
      snprintf(err, err_len, "uploading the Engram tables to cuda:%d: %s", dev, cudaGetErrorString(e));
      rt_cuda_model_close(cm);
      return CEDAR_EIO;
    }
  }
  *out = cm;
  return 0;
}

extern "C" void rt_cuda_model_close(struct rt_cuda_model *cm) {
  if (!cm) return;
  if (cm->slab) cudaFree(cm->slab);
  free(cm->L);
  free(cm);
}

extern "C" int rt_cuda_worker_open(struct rt_cuda_worker **out, int dev, size_t scratch_bytes, char *err,
                                   size_t err_len) {
  *out = NULL;
  struct rt_cuda_worker *w = (struct rt_cuda_worker *)calloc(1, sizeof *w);
  if (!w) {
    snprintf(err, err_len, "out of host memory for a CUDA worker");
    return CEDAR_ENOMEM;
  }
  w->dev = dev;
  w->cap = (scratch_bytes + 255) & ~(size_t)255;
  cudaError_t e = cudaSetDevice(dev);
  if (e == cudaSuccess) e = cudaMalloc(&w->base, w->cap ? w->cap : 256);
  if (e != cudaSuccess) {
    snprintf(err, err_len, "a CUDA worker's scratch (%zu bytes) on cuda:%d: %s: %s", w->cap, dev, cudaGetErrorName(e),
             cudaGetErrorString(e));
    free(w);
    return CEDAR_ENOMEM;
  }
  cublasStatus_t s = cublasCreate(&w->h);
  if (s != CUBLAS_STATUS_SUCCESS) {
    snprintf(err, err_len, "cublasCreate on cuda:%d: %s", dev, cublasGetStatusString(s));
    cudaFree(w->base);
    free(w);
    return CEDAR_EIO;
  }
  *out = w;
  return 0;
}

extern "C" void rt_cuda_worker_close(struct rt_cuda_worker *w) {
  if (!w) return;
  cublasDestroy(w->h);
  cudaFree(w->base);
  free(w);
}

extern "C" size_t rt_cuda_worker_need(const struct rt_cuda_worker *w) { return w ? w->need : 0; }

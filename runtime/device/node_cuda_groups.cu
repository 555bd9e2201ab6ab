/* node_cuda_groups.cu: the CUDA op groups other than attention (see
 * runtime/device/node_cuda.h): embed, engram_rows, engram, moe, keep_xe, replay_in
 * and head, each the CPU group's steps (exec_node.c over model.c) in its
 * order, on device-resident data, launched on the node's stream.
 */
#include <string.h>

#include "base/check.h"
#include "kernels/basic.cuh"
#include "kernels/engram.cuh"
#include "kernels/kcall.cuh"
#include "kernels/mhc.cuh"
#include "kernels/moe.cuh"
extern "C" {
#include "scheduler/plan_place.h" /* a C header without its own extern "C" */
}
#include "runtime/device/node_cuda_internal.cuh"
extern "C" {
#include "runtime/load/weights.h" /* a C header without its own extern "C" */
}

/* Gate floor of the Engram injection: model.c's RT_ENGRAM_DOT_FLOOR (docs/model.md s5, R.8). */
#define CN_ENGRAM_DOT_FLOOR 1e-6f

/* op_mhc_expand: every stream of position i is h[i]. */
__global__ void expand_kernel(float *X, const float *h, int64_t total, int hc, int d) {
  const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (k < total) X[k] = h[(k / ((int64_t)hc * d)) * d + k % d];
}

/* v[i] = (i % hc == 0) ? one : other, for i < n * hc (the one-hot start; all ones). */
__global__ void fill_pre_kernel(float *v, int64_t total, int hc, float first, float rest) {
  const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (k < total) v[k] = k % hc == 0 ? first : rest;
}

static int fill_pre(const struct cn *x, float *v, int n, float first, float rest) {
  const int hc = x->m->hc_streams;
  const int64_t total = (int64_t)n * hc;
  if (total <= 0) return 0;
  fill_pre_kernel<<<kcall_blocks(total, 128), 128, 0, x->st>>>(v, total, hc, first, rest);
  return cn_cuda(x, cudaGetLastError(), "pre");
}

static int need_tokens(const struct cn *x, const int32_t **tok) {
  *tok = x->c->cuda->tokens;
  if (!*tok) return cn_fail(x, CEDAR_EUNSUPPORTED, "the binder gave no device copy of the request's tokens");
  return 0;
}

/* rt_embed */
extern "C" int rt_cuda_embed(const struct rt_node_ctx *c) {
  struct cn x;
  CN_TRY(cn_begin(&x, c, "embed"));
  const struct graph_node *nd = c->nd;
  const struct plan_model *m = x.m;
  const int n = nd->n, hc = m->hc_streams, d = m->hidden;
  const int32_t *tok;
  CN_TRY(need_tokens(&x, &tok));
  if (nd->a + n > c->r->n_tokens) return cn_fail(&x, CEDAR_EINVAL, "positions past the request's tokens");
  float *X = (float *)cn_buf(&x, nd->x), *pre = (float *)cn_buf(&x, nd->aux), *h;
  CN_ALLOC(&x, h, float, (size_t)n * d);
  /* token ids were checked against the vocabulary before the run (model.c asserts it) */
  CN_TRY(cn_cuda(&x, kern_embed(h, x.cm->embed, tok + nd->a, n, d, m->vocab, NULL, x.st), "embed"));
  const int64_t total = (int64_t)n * hc * d;
  if (total > 0) {
    expand_kernel<<<kcall_blocks(total, 256), 256, 0, x.st>>>(X, h, total, hc, d);
    CN_TRY(cn_cuda(&x, cudaGetLastError(), "expand"));
  }
  CN_TRY(cn_round_x(&x, X, n)); /* embedding rows: exact */
  return fill_pre(&x, pre, n, 1.0f, 0.0f);
}

/* rt_engram_rows: the n-gram hash of positions [a, a + n) over the tokens
 * before them, then the rows' gather (the tables are device weights: the
 * mmap tier's prefetch is a host concern and does not apply). */
extern "C" int rt_cuda_engram_rows(const struct rt_node_ctx *c) {
  struct cn x;
  CN_TRY(cn_begin(&x, c, "engram_rows"));
  const struct graph_node *nd = c->nd;
  const struct plan_model *m = x.m;
  const struct rt_model *M = x.M;
  const int l = nd->layer, n = nd->n;
  const struct rt_cuda_layer *D = &x.cm->L[l];
  const int64_t a = nd->a;
  const int hist = (int)(a < M->e_max_order - 1 ? a : M->e_max_order - 1);
  const int32_t *tok;
  CN_TRY(need_tokens(&x, &tok));
  if (a + n > c->r->n_tokens) return cn_fail(&x, CEDAR_EINVAL, "positions past the request's tokens");
  if (M->e_max_order > KERN_ENGRAM_MAX_ORDER)
    return cn_fail(&x, CEDAR_EUNSUPPORTED, "n-grams of %d tokens: the CUDA hash takes at most %d", M->e_max_order,
                   KERN_ENGRAM_MAX_ORDER);
  int64_t *rows;
  CN_ALLOC(&x, rows, int64_t, (size_t)n * M->e_tables);
  CN_TRY(cn_cuda(&x, kern_engram_hash(rows, tok + a - hist, NULL, x.cm->cmap, D->e_mult, x.cm->e_orders, D->e_prime,
                                      D->e_off, hist, n, m->vocab, m->engram_n_orders, m->engram_heads,
                                      M->e_max_order, M->cmap[m->engram_pad_id], NULL, x.st), "engram hash"));
  return cn_cuda(&x, kern_engram_gather((float *)cn_buf(&x, nd->aux), D->e_table, rows, n, M->e_tables,
                                        m->engram_head_dim, WEIGHTS_ENGRAM_BLOCK, M->L[l].e_rows, x.st),
                 "engram gather");
}

/* rt_engram_inject */
extern "C" int rt_cuda_engram(const struct rt_node_ctx *c) {
  struct cn x;
  CN_TRY(cn_begin(&x, c, "engram"));
  const struct graph_node *nd = c->nd;
  const struct plan_model *m = x.m;
  const int l = nd->layer, n = nd->n, hc = m->hc_streams, d = m->hidden, de = x.M->e_tables * m->engram_head_dim;
  const struct rt_cuda_layer *D = &x.cm->L[l];
  float *X = (float *)cn_buf(&x, nd->x), *kv;
  const float *eq;
  CN_ALLOC(&x, kv, float, (size_t)n * (hc + 1) * d);
  CN_TRY(cn_lin_in(&x, &eq, (const float *)cn_buf(&x, nd->aux), n, de)); /* engram.wkv is FP8; its rows are exact */
  CN_TRY(cn_blas(&x, kern_engram_inject(x.w->h, X, kv, NULL, eq, D->e_wkv, D->e_qw, D->e_kw, n, de, d, hc, x.M->eps,
                                        CN_ENGRAM_DOT_FLOOR, x.st), "engram inject"));
  return cn_round_x(&x, X, n);
}

/* An expert-parallel layer's shard and sum (scheduler/graph_ep.c): those
 * layers run on CPU ranks (runtime/dist/expert_par.h), so a CUDA node of either
 * refuses, naming why, after the device-state check every entry makes. */
static int ep_refuse(const struct rt_node_ctx *c, const char *group) {
  struct cn x;
  CN_TRY(cn_begin(&x, c, group));
  return cn_fail(&x, CEDAR_EUNSUPPORTED, "expert-parallel layers run on CPU ranks (runtime/dist/expert_par.h)");
}
extern "C" int rt_cuda_moe_shard(const struct rt_node_ctx *c) { return ep_refuse(c, "moe_shard"); }
extern "C" int rt_cuda_moe_sum(const struct rt_node_ctx *c) { return ep_refuse(c, "moe_sum"); }

/* rt_moe (not an expert-parallel layer: those run on CPU ranks). The
 * `experts` statistic (distinct routed experts a call ran) needs the
 * selection on the host and is not counted for CUDA nodes. */
extern "C" int rt_cuda_moe(const struct rt_node_ctx *c) {
  struct cn x;
  CN_TRY(cn_begin(&x, c, "moe"));
  const struct graph_node *nd = c->nd;
  const struct plan_model *m = x.m;
  const int n = nd->n, d = m->hidden;
  if ((nd->flags & GRAPH_F_EP) || plan_ep_layer(x.M->p, nd->layer))
    return cn_fail(&x, CEDAR_EUNSUPPORTED, "expert-parallel layers run on CPU ranks (runtime/dist/expert_par.h)");
  const struct rt_cuda_layer *D = &x.cm->L[nd->layer];
  float *X = (float *)cn_buf(&x, nd->x), *pre = (float *)cn_buf(&x, nd->aux);
  struct cn_mhc s;
  CN_TRY(cn_mhc_begin(&x, &s, nd, 1, X, pre, n));
  float *xin, *y, *wt;
  int32_t *sel;
  void *ws;
  CN_ALLOC(&x, xin, float, (size_t)n * d);
  CN_TRY(cn_cuda(&x, kern_rmsnorm(xin, s.u, D->ffn_norm, n, d, x.M->eps, x.st), "ffn norm"));
  CN_TRY(cn_round_io(&x, xin, n));
  CN_ALLOC(&x, y, float, (size_t)n * d);
  CN_ALLOC(&x, sel, int32_t, (size_t)n * m->n_active);
  CN_ALLOC(&x, wt, float, (size_t)n * m->n_active);
  CN_ALLOC(&x, ws, uint8_t, kern_moe_scratch_bytes(n, &x.M->moe));
  CN_TRY(cn_blas(&x, kern_moe_forward(x.w->h, y, sel, wt, xin, &D->moe, NULL, n, &x.M->moe, ws, x.st), "moe"));
  CN_TRY(cn_round_io(&x, y, n));
  return cn_mhc_end(&x, X, &s, y, n);
}

/* keep_xe: the tile's encoder outputs and carried pre into the request's
 * host ring (r->xe; pinned memory keeps these copies asynchronous). The
 * positions are host bookkeeping, set now: a reader runs after this node's
 * stream work (the same stream, or StarPU's dependencies). */
extern "C" int rt_cuda_keep_xe(const struct rt_node_ctx *c) {
  struct cn x;
  CN_TRY(cn_begin(&x, c, "keep_xe"));
  const struct graph_node *nd = c->nd;
  struct rt_request *r = c->r;
  const struct plan_model *m = x.m;
  const size_t xr = (size_t)m->hc_streams * m->hidden, row = rt_xe_row_floats(m), hc = (size_t)m->hc_streams;
  const float *X = (const float *)cn_buf(&x, nd->x), *pre = (const float *)cn_buf(&x, nd->pre);
  if (!r || r->xe_cap <= 0 || !pre) return cn_fail(&x, CEDAR_EINVAL, "no encoder-output ring or pre to keep");
  for (int i = 0; i < nd->n; i++) {
    const int64_t p = nd->a + i;
    const int slot = (int)(p % r->xe_cap);
    CN_TRY(cn_cuda(&x, cudaMemcpyAsync(r->xe + (size_t)slot * row, X + (size_t)i * xr, sizeof(float) * xr,
                                       cudaMemcpyDeviceToHost, x.st), "keep_xe"));
    CN_TRY(cn_cuda(&x, cudaMemcpyAsync(r->xe + (size_t)slot * row + xr, pre + (size_t)i * hc, sizeof(float) * hc,
                                       cudaMemcpyDeviceToHost, x.st), "keep_xe"));
    r->xe_pos[slot] = p;
  }
  return 0;
}

/* replay_in: exec_node.c's replay_in with device tiles and the host ring. */
extern "C" int rt_cuda_replay_in(const struct rt_node_ctx *c) {
  struct cn x;
  CN_TRY(cn_begin(&x, c, "replay_in"));
  const struct graph *g = c->g;
  const struct graph_node *nd = c->nd;
  struct rt_request *r = c->r;
  const struct plan_model *m = x.m;
  const size_t xr = (size_t)m->hc_streams * m->hidden, hc = (size_t)m->hc_streams, row = rt_xe_row_floats(m);
  float *dst = (float *)cn_buf(&x, nd->x), *pre = (float *)cn_buf(&x, nd->aux);
  int64_t first_tile = nd->a + nd->n;
  bool from_ring = false;
  for (int u = 0; u < nd->n_use; u++) {
    const struct graph_data *gd = &g->data[nd->use[u].data];
    if (nd->use[u].mode != GRAPH_R) continue;
    if (gd->kind == GRAPH_STATE && gd->state == GRAPH_ST_XE) {
      from_ring = true;
      continue;
    }
    const size_t w = gd->pre ? hc : xr;
    const int64_t len = gd->bytes / (int64_t)(w * sizeof(float));
    const int64_t lo = gd->a0 > nd->a ? gd->a0 : nd->a;
    const int64_t hi = gd->a0 + len < nd->a + nd->n ? gd->a0 + len : nd->a + nd->n;
    if (gd->a0 < first_tile) first_tile = gd->a0 > nd->a ? gd->a0 : nd->a;
    const float *src = (const float *)cn_buf(&x, nd->use[u].data);
    if (hi > lo)
      CN_TRY(cn_copy(&x, (gd->pre ? pre : dst) + (size_t)(lo - nd->a) * w, src + (size_t)(lo - gd->a0) * w,
                     sizeof(float) * w * (size_t)(hi - lo)));
  }
  for (int64_t p = nd->a; from_ring && p < first_tile; p++) {
    const int slot = (int)(p % r->xe_cap);
    if (r->xe_pos[slot] != p)
      return cn_fail(&x, CEDAR_EINVAL, "the encoder output of position %lld is not kept", (long long)p);
    CN_TRY(cn_cuda(&x, cudaMemcpyAsync(dst + (size_t)(p - nd->a) * xr, r->xe + (size_t)slot * row, sizeof(float) * xr,
                                       cudaMemcpyHostToDevice, x.st), "replay_in"));
    CN_TRY(cn_cuda(&x, cudaMemcpyAsync(pre + (size_t)(p - nd->a) * hc, r->xe + (size_t)slot * row + xr,
                                       sizeof(float) * hc, cudaMemcpyHostToDevice, x.st), "replay_in"));
  }
  return 0;
}

/* rt_head, then the rows into the executor's output (host memory). */
extern "C" int rt_cuda_head(const struct rt_node_ctx *c) {
  struct cn x;
  CN_TRY(cn_begin(&x, c, "head"));
  const struct graph_node *nd = c->nd;
  const struct plan_model *m = x.m;
  const int n = nd->n, hc = m->hc_streams, d = m->hidden;
  const struct graph_data *xd = &c->g->data[nd->x];
  const float *X = (const float *)cn_buf(&x, nd->x) + (size_t)(nd->a - xd->a0) * hc * d;
  const float *carried = nd->pre < 0 ? NULL : (const float *)cn_buf(&x, nd->pre) + (size_t)(nd->a - xd->a0) * hc;
  float *lg = (float *)cn_buf(&x, nd->aux), *h, *pre, *hn;
  CN_ALLOC(&x, h, float, (size_t)n * d);
  CN_ALLOC(&x, pre, float, (size_t)n * hc);
  if (m->hc_merge == plan_model::PLAN_MERGE_CARRIED) { /* the last FFN's own pre (Appendix V #4) */
    if (!carried) return cn_fail(&x, CEDAR_EINVAL, "the carried merge needs the tile's pre");
    CN_TRY(cn_cuda(&x, kern_mhc_mix(h, X, carried, n, hc, d, x.st), "head mix"));
  } else if (x.cm->head_fn) {
    float *sumsq;
    CN_ALLOC(&x, sumsq, float, n);
    CN_TRY(cn_blas(&x, kern_mhc_merge(x.w->h, h, pre, sumsq, X, x.cm->head_fn, x.cm->head_scale, x.cm->head_base, n,
                                      &x.M->mhc, x.st), "head merge"));
  } else {
    CN_TRY(fill_pre(&x, pre, n, 1.0f, 1.0f));
    CN_TRY(cn_cuda(&x, kern_mhc_mix(h, X, pre, n, hc, d, x.st), "head mix"));
  }
  CN_TRY(cn_round_io(&x, h, n));
  CN_ALLOC(&x, hn, float, (size_t)n * d);
  CN_TRY(cn_cuda(&x, kern_rmsnorm(hn, h, x.cm->norm, n, d, x.M->eps, x.st), "final norm"));
  CN_TRY(cn_round_io(&x, hn, n));
  CN_TRY(cn_blas(&x, kern_linear(x.w->h, lg, hn, x.cm->lm_head, n, d, m->vocab, d, m->vocab, x.st), "logits"));
  if (c->out && c->out->logits)
    CN_TRY(cn_cuda(&x, cudaMemcpyAsync(c->out->logits + (size_t)c->out_row * m->vocab, lg,
                                       sizeof(float) * (size_t)n * m->vocab, cudaMemcpyDeviceToHost, x.st),
                   "logits out"));
  if (c->out && c->out->pos)
    for (int i = 0; i < n; i++) c->out->pos[c->out_row + i] = nd->a + i;
  return 0;
}

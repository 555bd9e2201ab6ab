/* node_cuda_attn.cu: the attention sublayer (GRAPH_ATTN) and the decoder's
 * global KV from the encoder output (GRAPH_DEC_KV) on CUDA, step for step
 * model.c's rt_attn and rt_dec_kv (docs/model.md s3, s3.1): mHC begin, the
 * attention norm, q (latent, heads), the SWA entry, the ring's view (slots
 * in position order, then the tile's own entries), the compressor with its
 * tail and the KV append, the Top-K (full, reindex, reuse), sparse
 * attention, the grouped output projection, the ring write, mHC end. The
 * state it works on is bound by the executor (runtime/device/node_cuda.h).
 */
#include <string.h>

#include "base/check.h"
#include "kernels/attention.cuh"
#include "kernels/basic.cuh"
#include "kernels/compressor.cuh"
#include "kernels/formats.cuh"
#include "kernels/indexer.cuh"
#include "kernels/kcall.cuh"
#include "kernels/mhc.cuh"
#include "kernels/qkv.cuh"
#include "runtime/device/cuda_graph.h"
#include "runtime/device/node_cuda_internal.cuh"
extern "C" {
#include "runtime/device/devbind.h" /* a C header without its own extern "C" */
}

enum { CN_COPY_THREADS = 128 };

/* ---- the SWA ring on the device ------------------------------------------ */

/* One CTA per ring slot: its place in the view (rt_cuda_swa_rank, the
 * order model.c's swa_view sorts into), then its bytes and position. */
__global__ void swa_gather_kernel(uint8_t *buf, int64_t *spos, const uint8_t *slot, const int64_t *pos, int window,
                                  size_t eb) {
  __shared__ int rank;
  const int s = blockIdx.x;
  if (threadIdx.x == 0) {
    rank = rt_cuda_swa_rank(pos, window, s);
    spos[rank] = pos[s];
  }
  __syncthreads();
  for (size_t b = threadIdx.x; b < eb; b += blockDim.x) buf[(size_t)rank * eb + b] = slot[(size_t)s * eb + b];
}

/* rt_ring_put of rows [first, n) in order: rows earlier than the last
 * window would be overwritten by later ones (positions are consecutive), so
 * only those land, one CTA each, each in its own slot. */
__global__ void ring_put_kernel(uint8_t *slot, int64_t *rpos, const uint8_t *fresh, const int64_t *pos, int first,
                                int window, size_t eb) {
  const int i = first + blockIdx.x;
  const int64_t p = pos[i];
  const int s = (int)(p % window);
  for (size_t b = threadIdx.x; b < eb; b += blockDim.x) slot[(size_t)s * eb + b] = fresh[(size_t)i * eb + b];
  if (threadIdx.x == 0) rpos[s] = p;
}

/* rt_kv_append's copy: entry e0 + i into its page (a device page table). */
__global__ void kv_write_kernel(uint8_t *const *pages, int page_entries, size_t eb, int64_t e0, const uint8_t *src) {
  const int64_t e = e0 + blockIdx.x;
  uint8_t *dst = pages[e / page_entries] + (size_t)(e % page_entries) * eb;
  for (size_t b = threadIdx.x; b < eb; b += blockDim.x) dst[b] = src[(size_t)blockIdx.x * eb + b];
}

/* model.c's swa_view: buf holds the ring's window slots in position order
 * (empty ones last), then the tile's n fresh entries packed from kS. */
static int swa_view(const struct cn *x, const struct rt_ring *g, const float *kS, const int64_t *pos, int n,
                    struct op_swa_view *sv, uint8_t **fresh) {
  const size_t eb = g->entry_bytes;
  const int slots = g->window + n, d = x->m->head_dim;
  if (op_kv_bytes(&x->M->swa_fmt, d) != eb)
    return cn_fail(x, CEDAR_EUNSUPPORTED, "the ring's entries (%zu B) are not the SWA format's %zu B", eb,
                   op_kv_bytes(&x->M->swa_fmt, d));
  uint8_t *buf;
  int64_t *spos;
  CN_ALLOC(x, buf, uint8_t, (size_t)slots * eb);
  CN_ALLOC(x, spos, int64_t, slots);
  if (g->window > 0) {
    swa_gather_kernel<<<g->window, CN_COPY_THREADS, 0, x->st>>>(buf, spos, g->slot, g->pos, g->window, eb);
    CN_TRY(cn_cuda(x, cudaGetLastError(), "SWA view"));
  }
  *fresh = buf + (size_t)g->window * eb;
  CN_TRY(cn_cuda(x, kern_kv_pack_rows(&x->M->swa_fmt, *fresh, kS, n, d, x->st), "SWA pack"));
  CN_TRY(cn_copy(x, spos + g->window, pos, sizeof(int64_t) * (size_t)n));
  *sv = (struct op_swa_view){buf, spos, slots, eb, d, x->M->swa_fmt};
  return 0;
}

static int ring_put(const struct cn *x, struct rt_ring *g, const int64_t *pos, const uint8_t *fresh, int n) {
  const int first = n > g->window ? n - g->window : 0;
  if (n - first <= 0) return 0;
  ring_put_kernel<<<n - first, CN_COPY_THREADS, 0, x->st>>>(g->slot, g->pos, fresh, pos, first, g->window,
                                                            g->entry_bytes);
  return cn_cuda(x, cudaGetLastError(), "ring write");
}

static int ring_reset(const struct cn *x, struct rt_ring *g, int64_t r0) {
  g->r0 = r0;
  return cn_cuda(x, cudaMemsetAsync(g->pos, 0xff, sizeof(int64_t) * (size_t)g->window, x->st), "ring reset");
}

/* ---- the compressor and the KV append (model.c: append_entries) ---------- */

/* Inside a graph segment (ctx->params, runtime/exec/devseg.h): the step's
 * values are device values in the parameter block, so the compressor
 * continues its tail by kern_compress_step (the count, first position and
 * committed entries read on the device) and a replay at a later step runs
 * that step. The host metadata is updated as below for the step being
 * captured or run; the executor applies it from the graph after a replay
 * (rt_dev_node_advance). */
static int append_step(const struct cn *x, const struct rt_bound *st, int l, const float *a_in, int n) {
  struct rt_kv_seq *seq = st->kv_w;
  struct op_comp_tail *tail = st->tail;
  const struct rt_dev_params *P = (const struct rt_dev_params *)x->c->params;
  const struct op_comp_layer *C = &x->cm->L[l].comp;
  const struct rt_kv_pool *pool = seq->pool;
  void *scratch;
  CN_ALLOC(x, scratch, uint8_t,
           kern_compress_step_scratch_bytes(n, C->ratio, C->d, C->idx_dim, pool->entry_bytes));
  CN_TRY(cn_blas(x, kern_compress_step(x->w->h, (uint8_t *const *)st->kv_w_pages, pool->page_entries,
                                       pool->entry_bytes, 0, pool->main_bytes, tail->v, tail->g, &P->tail_count,
                                       &P->tail_pos0, &P->w_entries, a_in, n, C, scratch, x->st),
                 "compressor (segment step)"));
  const int emit = op_comp_n_emit(tail, n), total = tail->count + n;
  tail->pos0 += (int64_t)emit * C->ratio;
  tail->count = total - emit * C->ratio;
  __atomic_store_n(&seq->n_entries, seq->n_entries + emit, __ATOMIC_RELEASE);
  return 0;
}

static int append_entries(const struct cn *x, const struct rt_bound *st, int l, const float *a_in, int64_t a, int n) {
  struct rt_kv_seq *seq = st->kv_w;
  struct op_comp_tail *tail = st->tail;
  if (!seq || !tail) return cn_fail(x, CEDAR_EINVAL, "layer %d appends KV without a bound sequence and tail", l);
  if (st->tail_log)
    return cn_fail(x, CEDAR_EUNSUPPORTED, "a speculative verify step's tail log is CPU-only (run --speculate on "
                   "--device cpu)");
  if (!st->kv_w_pages)
    return cn_fail(x, CEDAR_EUNSUPPORTED, "layer %d: the binder gave no device page table for the KV it appends to", l);
  if (tail->pos0 + tail->count != a)
    return cn_fail(x, CEDAR_EINVAL, "layer %d: the tail holds positions from %lld (%d rows), the tile starts at %lld",
                   l, (long long)tail->pos0, tail->count, (long long)a);
  const struct op_comp_layer *C = &x->cm->L[l].comp;
  const struct rt_kv_pool *pool = seq->pool;
  const int emit = op_comp_n_emit(tail, n), r = C->ratio;
  const size_t eb = pool->entry_bytes;
  if (seq->n_entries + emit != st->kv_w_end)
    return cn_fail(x, CEDAR_EINVAL, "layer %d: %lld entries after the tile at %lld, the graph declared %lld", l,
                   (long long)(seq->n_entries + emit), (long long)a, (long long)st->kv_w_end);
  if ((int64_t)seq->n_pages * pool->page_entries < st->kv_w_end)
    return cn_fail(x, CEDAR_EINVAL, "layer %d: %d pages reserved for %lld entries (the binder reserves them: "
                   "rt_kv_reserve)", l, seq->n_pages, (long long)st->kv_w_end);
  if (x->c->params) return append_step(x, st, l, a_in, n);
  uint8_t *entries;
  float *kM, *kI, *scratch;
  int64_t *epos;
  CN_ALLOC(x, entries, uint8_t, (size_t)(emit ? emit : 1) * eb);
  CN_ALLOC(x, kM, float, (size_t)(emit ? emit : 1) * C->d);
  CN_ALLOC(x, kI, float, (size_t)(emit ? emit : 1) * C->idx_dim);
  CN_ALLOC(x, epos, int64_t, emit ? emit : 1);
  CN_ALLOC(x, scratch, float, kern_compress_scratch_floats(tail->count + n, r, C->d, C->idx_dim));
  CN_TRY(cn_iota(x, epos, tail->pos0, r, emit));
  CN_TRY(cn_blas(x, kern_compress_tail(x->w->h, entries, eb, 0, pool->main_bytes, kM, kI, tail->v, tail->g,
                                       tail->count, a_in, epos, n, C, scratch, x->st), "compressor"));
  const int total = tail->count + n; /* op_comp_push's tail after the call */
  tail->pos0 += (int64_t)emit * r;
  tail->count = total - emit * r;
  if (!emit) return 0;
  kv_write_kernel<<<emit, CN_COPY_THREADS, 0, x->st>>>((uint8_t *const *)st->kv_w_pages, pool->page_entries, eb,
                                                       seq->n_entries, entries);
  CN_TRY(cn_cuda(x, cudaGetLastError(), "KV append"));
  __atomic_store_n(&seq->n_entries, seq->n_entries + emit, __ATOMIC_RELEASE);
  return 0;
}

/* ---- Top-K (model_topk.c: rt__select_topk, q_mxfp4_roundtrip) ------------ */

/* A verify tile's rows that read two key tensors are scored one by one; its
 * positions on the host, at most this many (graph_build_verify's window). */
#define RT_CUDA_KEY_ROWS 1024

static int q_mxfp4_roundtrip(const struct cn *x, float *qI, int rows) {
  const struct plan_model *m = x->m;
  const int w = m->idx_head_dim;
  const struct op_kv_format f =
      op_kv_mxfp4_format(m->indexer_k.block, m->indexer_k.rule == PLAN_RULE_OCP ? OP_MX_OCP : OP_MX_CEIL,
                         OP_NIBBLE_EVEN_LOW);
  if (m->indexer_k.bf16_round) CN_TRY(cn_cuda(x, kern_bf16_round(qI, (int64_t)rows * w, x->st), "qI bf16"));
  uint8_t *buf;
  CN_ALLOC(x, buf, uint8_t, (size_t)rows * op_kv_bytes(&f, w));
  CN_TRY(cn_cuda(x, kern_kv_pack_rows(&f, buf, qI, rows, w, x->st), "qI mxfp4 pack"));
  return cn_cuda(x, kern_kv_unpack_rows(&f, qI, buf, rows, w, x->st), "qI mxfp4 unpack");
}

/* The keys rows of class c score (model_topk.c: key_view; docs/model.md
 * s3.2): the slot's source's Indexer-K through the device page table the
 * binder gave, seen with the reader's ratio and count; else kv. */
static int key_view(const struct cn *x, const struct rt_bound *st, const struct op_kv_view *kv, int c,
                    struct op_kv_view *v) {
  *v = *kv;
  if (!st->key_r[c]) return 0;
  *v = rt_kv_view(st->key_r[c]);
  if (v->n_entries < st->key_r_end[c])
    return cn_fail(x, CEDAR_EINVAL, "key slot: %lld entries committed, the graph declared %lld",
                   (long long)v->n_entries, (long long)st->key_r_end[c]);
  if (!st->key_r_pages[c])
    return cn_fail(x, CEDAR_EUNSUPPORTED, "the binder gave no device page table for the key slot's source");
  v->pages = st->key_r_pages[c];
  v->n_entries = kv->n_entries < st->key_r_end[c] ? kv->n_entries : st->key_r_end[c];
  v->ratio = kv->ratio;
  v->n_dev = NULL; /* never in a segment (devseg.c) */
  return 0;
}

/* Rows [i0, i0 + n) score keys kv (model_topk.c: score_rows). */
static int score_rows(const struct cn *x, const struct graph_node *nd, const struct rt_buses *b, const float *qI,
                      const float *w, const int64_t *pos, const struct op_kv_view *kv, int i0, int n) {
  const struct plan_model *m = x->m;
  const int H = m->idx_heads, qw = H * m->idx_head_dim, K = m->topk, TB = m->cand_top_blocks;
  qI += (size_t)i0 * qw, w += (size_t)i0 * H, pos += i0;
  void *work;
  if (x->M->L[nd->layer].pl->mode == PLAN_REINDEX && b->pool_in) {
    CN_ALLOC(x, work, uint8_t, (size_t)n * (size_t)(kv->n_entries > 0 ? kv->n_entries : 1) * 5);
    return cn_cuda(x, kern_indexer_reindex(b->topk_out + (size_t)i0 * K, b->pool_in + (size_t)i0 * TB, qI, w, pos, kv,
                                           n, H, K, m->cand_block, TB, work, x->st), "reindex");
  }
  const bool pool = (nd->flags & GRAPH_F_BUILD_POOL) != 0;
  CN_ALLOC(x, work, uint8_t, kern_indexer_topk_scratch_bytes(kv, n, pool ? m->cand_block : 0));
  return cn_cuda(x, kern_indexer_topk(b->topk_out + (size_t)i0 * K, pool ? b->pool_out + (size_t)i0 * TB : NULL, qI, w,
                                      pos, kv, n, H, K, m->cand_block, TB, m->cand_pin_newest, work, x->st),
                 "indexer top-k");
}

static int select_topk(const struct cn *x, const struct graph_node *nd, const float *a_in, const float *cq,
                       const int64_t *pos, const int64_t *pos_host, const struct op_kv_view *kv,
                       const struct rt_bound *st, const struct rt_buses *b, const int32_t **out) {
  const struct plan_model *m = x->m;
  const struct rt_layer *L = &x->M->L[nd->layer];
  const struct rt_cuda_layer *D = &x->cm->L[nd->layer];
  const int n = nd->n, qw = m->idx_heads * m->idx_head_dim;
  if (L->pl->mode == PLAN_REUSE) {
    *out = b->topk_in;
    return 0;
  }
  float *qI, *w, *tmp;
  CN_ALLOC(x, qI, float, (size_t)n * qw);
  CN_ALLOC(x, tmp, float, (size_t)n * qw);
  CN_ALLOC(x, w, float, (size_t)n * m->idx_heads);
  CN_TRY(cn_blas(x, kern_q_heads(x->w->h, qI, tmp, cq, D->iq_b, &x->M->rope_idx, pos, n, m->q_rank, m->idx_heads,
                                 m->idx_head_dim, false, x->M->eps, x->st), "indexer q"));
  if (m->idx_q_mxfp4) CN_TRY(q_mxfp4_roundtrip(x, qI, n * m->idx_heads));
  CN_TRY(cn_blas(x, kern_index_weights(x->w->h, w, a_in, D->iw, n, m->hidden, m->idx_heads, x->M->idx_scale, x->st),
                 "index weights"));
  /* one key tensor for every row, or (a verify tile under key_slot: vendor)
   * each row its parity's; pos_host: the node's positions on the host */
  struct op_kv_view kc[2];
  CN_TRY(key_view(x, st, kv, 0, &kc[0]));
  CN_TRY(key_view(x, st, kv, 1, &kc[1]));
  if (st->key_r[0] == st->key_r[1])
    CN_TRY(score_rows(x, nd, b, qI, w, pos, &kc[0], 0, n));
  else
    for (int i = 0; i < n; i++) CN_TRY(score_rows(x, nd, b, qI, w, pos, &kc[(pos_host[i] + 1) % 2 == 0], i, 1));
  *out = b->topk_out;
  return 0;
}

/* ---- the grouped output projection (model.c: oproj) ---------------------- */

static int oproj(const struct cn *x, float *y, float *z, float *o, const struct rt_cuda_layer *D, int n) {
  const struct plan_model *m = x->m;
  const int d = m->hidden, G = m->o_groups, R = m->o_rank, hd = m->heads * m->head_dim, gw = hd / G;
  cublasHandle_t h = x->w->h;
  if (!m->num_lin_mxfp8)
    return cn_blas(x, kern_grouped_oproj(h, y, z, o, D->wo_a, D->wo_b, n, m->heads, m->head_dim, G, R, d, x->st),
                   "output projection");
  CN_TRY(cn_cuda(x, kern_mxfp8_qdq(o, n, hd, hd, CN_MXFP8_BLOCK, x->st), "o mxfp8"));
  for (int g = 0; g < G; g++)
    CN_TRY(cn_blas(x, kern_linear(h, z + (size_t)g * R, o + (size_t)g * gw, D->wo_a + (size_t)g * R * gw, n, gw, R, hd,
                                  G * R, x->st), "output projection (groups)"));
  CN_TRY(cn_cuda(x, kern_mxfp8_qdq(z, n, G * R, G * R, CN_MXFP8_BLOCK, x->st), "z mxfp8"));
  return cn_blas(x, kern_linear(h, y, z, D->wo_b, n, G * R, d, G * R, d, x->st), "output projection");
}

/* ---- the op groups -------------------------------------------------------- */

/* The entries a node reads: kv_r's view with the device page table. */
static int read_view(const struct cn *x, const struct graph_node *nd, const struct rt_bound *st,
                     struct op_kv_view *kv) {
  *kv = rt_kv_view(st->kv_r);
  if (kv->n_entries < st->kv_r_end)
    return cn_fail(x, CEDAR_EINVAL, "%lld entries committed, the graph declared %lld", (long long)kv->n_entries,
                   (long long)st->kv_r_end);
  if (!st->kv_r_pages)
    return cn_fail(x, CEDAR_EUNSUPPORTED, "layer %d: the binder gave no device page table for the KV it reads",
                   nd->layer);
  kv->n_entries = st->kv_r_end;
  kv->pages = st->kv_r_pages;
  if (x->c->params) { /* a graph segment: the grid covers the key's pages, the count is the block's */
    kv->n_entries = rt_dev_listed_pages(x->c->g, x->c->r, nd) * kv->page_entries;
    kv->n_dev = &((const struct rt_dev_params *)x->c->params)->r_entries;
  }
  return 0;
}

__global__ void cn_pos_kernel(int64_t *pos, const struct rt_dev_params *P, int n) {
  const int i = threadIdx.x;
  if (i < n) pos[i] = P->pos + i;
}

/* The tile's positions: the node's, or inside a segment the block's. */
static int positions(const struct cn *x, int64_t *pos, int64_t a, int n) {
  if (!x->c->params) return cn_iota(x, pos, a, 1, n);
  cn_pos_kernel<<<1, 32, 0, x->st>>>(pos, (const struct rt_dev_params *)x->c->params, n); /* n <= 8 in a segment */
  return cn_cuda(x, cudaGetLastError(), "positions (segment)");
}

static int attn(const struct cn *x) {
  const struct rt_node_ctx *c = x->c;
  const struct graph_node *nd = c->nd;
  const struct plan_model *m = x->m;
  const struct rt_model *M = x->M;
  const int l = nd->layer, n = nd->n, d = m->hidden, hd = m->heads * m->head_dim;
  const struct rt_layer *L = &M->L[l];
  const struct rt_cuda_layer *D = &x->cm->L[l];
  const struct rt_bound *st = c->st;
  struct rt_ring *ring = st->ring;
  float *X = (float *)cn_buf(x, nd->x), *pre = (float *)cn_buf(x, nd->aux);
  struct rt_buses bs = {(int32_t *)cn_buf(x, nd->bus[GRAPH_TOPK_OUT]), (int32_t *)cn_buf(x, nd->bus[GRAPH_POOL_OUT]),
                        (const int32_t *)cn_buf(x, nd->bus[GRAPH_TOPK_IN]),
                        (const int32_t *)cn_buf(x, nd->bus[GRAPH_POOL_IN])};
  if (!ring) return cn_fail(x, CEDAR_EINVAL, "no SWA ring bound");
  if (c->r && c->r->mtp_cap) return cn_fail(x, CEDAR_EUNSUPPORTED, "the DSpark drafter's capture is CPU-only");
  struct cn_mhc s;
  CN_TRY(cn_mhc_begin(x, &s, nd, 0, X, pre, n));
  float *a_in, *cq, *q, *kS, *tmp, *o, *y, *z;
  int64_t *pos;
  const float *a_q, *cq_q;
  CN_ALLOC(x, a_in, float, (size_t)n * d);
  CN_TRY(cn_cuda(x, kern_rmsnorm(a_in, s.u, D->attn_norm, n, d, M->eps, x->st), "attention norm"));
  CN_TRY(cn_round_io(x, a_in, n));
  CN_TRY(cn_lin_in(x, &a_q, a_in, n, d)); /* wq_a and wkv are FP8 */
  CN_ALLOC(x, pos, int64_t, n);
  CN_TRY(positions(x, pos, nd->a, n));
  const int tmp_w = hd > m->q_rank ? (hd > m->head_dim ? hd : m->head_dim) : (m->q_rank > m->head_dim ? m->q_rank
                                                                                                       : m->head_dim);
  CN_ALLOC(x, tmp, float, (size_t)n * tmp_w);
  CN_ALLOC(x, cq, float, (size_t)n * m->q_rank);
  CN_ALLOC(x, q, float, (size_t)n * hd);
  CN_TRY(cn_blas(x, kern_q_latent(x->w->h, cq, tmp, a_q, D->wq_a, D->q_norm, n, d, m->q_rank, M->eps, x->st),
                 "q latent"));
  CN_TRY(cn_lin_in(x, &cq_q, cq, n, m->q_rank)); /* wq_b and indexer.wq_b are FP8 */
  CN_TRY(cn_blas(x, kern_q_heads(x->w->h, q, tmp, cq_q, D->wq_b, L->rope, pos, n, m->q_rank, m->heads, m->head_dim,
                                 m->q_head_norm, M->eps, x->st), "q heads"));
  CN_ALLOC(x, kS, float, (size_t)n * m->head_dim);
  CN_TRY(cn_blas(x, kern_swa_kv(x->w->h, kS, tmp, NULL, &M->swa_fmt, a_q, D->wkv, D->kv_norm, L->rope, pos, n, d,
                                m->head_dim, M->eps, x->st), "SWA kv"));
  if (nd->flags & GRAPH_F_RING_RESET) CN_TRY(ring_reset(x, ring, nd->r0));
  if (nd->r0 > ring->r0) ring->r0 = nd->r0;
  struct op_swa_view sv = {};
  uint8_t *fresh = NULL;
  CN_TRY(swa_view(x, ring, kS, pos, n, &sv, &fresh));
  if (nd->flags & GRAPH_F_WRITE_KV) CN_TRY(append_entries(x, st, l, a_in, nd->a, n));
  struct op_kv_view kv = {};
  const int32_t *topk = NULL;
  if (st->kv_r) {
    CN_TRY(read_view(x, nd, st, &kv));
    int64_t pos_host[RT_CUDA_KEY_ROWS];
    if (st->key_r[0] != st->key_r[1] && n > RT_CUDA_KEY_ROWS)
      return cn_fail(x, CEDAR_EUNSUPPORTED, "a verify tile of %d rows reading two key tensors (at most %d)", n,
                     RT_CUDA_KEY_ROWS);
    for (int i = 0; i < n && i < RT_CUDA_KEY_ROWS; i++) pos_host[i] = nd->a + i; /* never in a segment: the node's */
    CN_TRY(select_topk(x, nd, a_in, cq_q, pos, pos_host, &kv, st, &bs, &topk));
  }
  struct op_attn_params pr = {};
  pr.heads = m->heads, pr.head_dim = m->head_dim, pr.topk = topk ? m->topk : 0, pr.window = m->window;
  pr.r0 = ring->r0, pr.tau = M->tau, pr.sink = D->sink, pr.rope = L->rope, pr.angles = NULL;
  int32_t *n_used;
  void *work;
  CN_ALLOC(x, o, float, (size_t)n * hd);
  CN_ALLOC(x, n_used, int32_t, n);
  CN_ALLOC(x, work, uint8_t, kern_sparse_attn_scratch_bytes(n, sv.n_slots, pr.topk));
  CN_TRY(cn_cuda(x, kern_sparse_attn(o, n_used, q, pos, topk, topk ? &kv : NULL, &sv, n, &pr, work, x->st),
                 "sparse attention"));
  CN_ALLOC(x, y, float, (size_t)n * d);
  CN_ALLOC(x, z, float, (size_t)n * m->o_groups * m->o_rank);
  CN_TRY(oproj(x, y, z, o, D, n));
  CN_TRY(cn_round_io(x, y, n));
  CN_TRY(ring_put(x, ring, pos, fresh, n));
  return cn_mhc_end(x, X, &s, y, n);
}

extern "C" int rt_cuda_attn(const struct rt_node_ctx *c) {
  struct cn x;
  CN_TRY(cn_begin(&x, c, "attn"));
  return attn(&x);
}

/* rt_dec_kv: the first decoder layer's own attention input from X^E and the
 * carried pre (or, pairing v4, its own), then the compressor's append. */
extern "C" int rt_cuda_dec_kv(const struct rt_node_ctx *c) {
  struct cn x;
  CN_TRY(cn_begin(&x, c, "dec_kv"));
  const struct graph_node *nd = c->nd;
  const struct plan_model *m = x.m;
  const int l = nd->layer, n = nd->n, hc = m->hc_streams, d = m->hidden;
  const struct rt_cuda_layer *D = &x.cm->L[l];
  const float *XE = (const float *)cn_buf(&x, nd->x), *pre = (const float *)cn_buf(&x, nd->pre);
  float *u, *a_enc;
  CN_ALLOC(&x, u, float, (size_t)n * d);
  if (m->hc_pairing == plan_model::PLAN_PAIRING_V4) {
    float *own, *post, *C, *dots, *sumsq;
    CN_ALLOC(&x, own, float, (size_t)n * hc);
    CN_ALLOC(&x, post, float, (size_t)n * hc);
    CN_ALLOC(&x, C, float, (size_t)n * hc * hc);
    CN_ALLOC(&x, dots, float, (size_t)n * op_mhc_rows(hc));
    CN_ALLOC(&x, sumsq, float, n);
    CN_TRY(cn_blas(&x, kern_mhc_coeffs(x.w->h, own, post, C, dots, sumsq, XE, D->hc_fn[0], D->hc_scale[0],
                                       D->hc_base[0], n, &x.M->mhc, x.st), "mhc coefficients"));
    pre = own;
  }
  CN_TRY(cn_cuda(&x, kern_mhc_mix(u, XE, pre, n, hc, d, x.st), "mhc mix"));
  CN_TRY(cn_round_io(&x, u, n));
  CN_ALLOC(&x, a_enc, float, (size_t)n * d);
  CN_TRY(cn_cuda(&x, kern_rmsnorm(a_enc, u, D->attn_norm, n, d, x.M->eps, x.st), "attention norm"));
  CN_TRY(cn_round_io(&x, a_enc, n));
  return append_entries(&x, c->st, l, a_enc, nd->a, n);
}
